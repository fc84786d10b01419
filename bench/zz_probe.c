// llama-sparse: zigzag-only GEMV probe for kernel tuning (no stock side, no ggml graph): times
// MUL_MAT_ZZ on the bench pool for the row layout dense and the column-major layout dense and at a
// few sparsities, one call of each per round, interleaved, and prints fastest and median per column.
// Built by bench/zz_probe.sh; variants of the kernels are compared by building with other ZZ_CFLAGS
// and alternating runs. Under valgrind --tool=callgrind with -m hot and few rounds it gives
// load-independent instruction counts per configuration (-only k: just column k).
// With ZZ_PROBE_B=dir, bench/zz_probe.sh also builds the op and kernels from dir (another version of
// ggml-sparse/, e.g. a checkout of the last commit) under renamed symbols, and the probe adds its cm dense
// and 50 % columns: both versions' calls alternate in every round, a paired comparison that the machine's
// swings in speed (+-25 % between runs on the shared VM) hit alike.
// usage: zz_probe [-t threads] [-r rounds] [-m hot|cold] [-M m] [-N n] [-only k]
#include "ggml.h"
#include "ggml-cpu.h"
#include "ggml-cpu-impl.h"
#include "ggml-sparse.h"
#include "ggml-sparse-cpu.h"
#include "zz_test_threads.h"
#define ZZ_TEST_SEED 0x9e3779b97f4a7c15ULL
#include "bench_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_ROUNDS 2000
#define MAX_COPIES 64

#ifdef ZZ_PROBE_AB
void ggml_sparse_cpu_forward_mul_mat_zz_B(const struct ggml_compute_params * params, struct ggml_tensor * dst);
void ggml_sparse_zz_to_colmajor_B(enum ggml_type type, int64_t n, int64_t nr, const void * src, void * dst);
#define NB 2
#else
#define NB 0
#endif

// the op of column k: B's for the B columns
static zz_test_op_fn op_of(int k) {
#ifdef ZZ_PROBE_AB
    if (k >= 5) {
        return ggml_sparse_cpu_forward_mul_mat_zz_B;
    }
#endif
    (void) k;
    return ggml_sparse_cpu_forward_mul_mat_zz;
}

static struct ggml_tensor mk(enum ggml_type type, int64_t ne0, int64_t ne1, size_t nb1, void * data) {
    struct ggml_tensor t;
    memset(&t, 0, sizeof(t));
    t.type = type;
    t.ne[0] = ne0; t.ne[1] = ne1; t.ne[2] = 1; t.ne[3] = 1;
    t.nb[0] = ggml_type_size(type); t.nb[1] = nb1; t.nb[2] = nb1*ne1; t.nb[3] = t.nb[2];
    t.data = data;
    return t;
}

int main(int argc, char ** argv) {
    int nth = 2, rounds = 200, only = -1;
    bool cold = true;
    int64_t m = 4096, n = 4096;
    for (int i = 1; i + 1 < argc; i += 2) {
        if      (!strcmp(argv[i], "-t"))    nth    = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-r"))    rounds = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-m"))    cold   = strcmp(argv[i + 1], "hot") != 0;
        else if (!strcmp(argv[i], "-M"))    m      = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "-N"))    n      = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "-only")) only   = atoi(argv[i + 1]);
        else { fprintf(stderr, "unknown option %s\n", argv[i]); return 1; }
    }
    rounds = rounds < MAX_ROUNDS ? rounds : MAX_ROUNDS;

    const enum ggml_type type = GGML_TYPE_Q4_K;
    const int64_t nr = m/256; // Q4_K super-blocks of 256
    const size_t  bs = ggml_type_size(type);
    const size_t  wbytes = (size_t) n*nr*bs;
    int copies = cold ? (int) ((256u << 20)/wbytes + 1) : 1;
    copies = copies < MAX_COPIES ? copies : MAX_COPIES;

    uint8_t * w    = malloc(wbytes*copies);
    uint8_t * w_cm = malloc(wbytes*copies);
    for (size_t b = 0; b < (size_t) n*nr*copies; ++b) {
        for (size_t i = 0; i < bs; i += 8) {
            const uint64_t r = rng_u64();
            memcpy(w + b*bs + i, &r, bs - i < 8 ? bs - i : 8);
        }
        const ggml_fp16_t d    = ggml_fp32_to_fp16(0.001f + 0.001f*(float) (rng_u64() % 1000)/1000.0f);
        const ggml_fp16_t dmin = ggml_fp32_to_fp16(0.0005f);
        memcpy(w + b*bs, &d, 2);
        memcpy(w + b*bs + 2, &dmin, 2);
    }
    // (B: its own column-major copies, made by its repack: the versions may lay the blocks out differently)
    struct ggml_tensor wr[MAX_COPIES], wc[MAX_COPIES], wcb[MAX_COPIES];
#ifdef ZZ_PROBE_AB
    uint8_t * w_cmb = malloc(wbytes*copies);
#endif
    for (int c = 0; c < copies; ++c) {
        ggml_sparse_zz_to_colmajor(type, n, nr, w + c*wbytes, w_cm + c*wbytes);
        wr[c] = mk(type, 256*n, nr, n*bs, w + c*wbytes);
        wc[c] = mk(type, 256*n, nr, n*bs, w_cm + c*wbytes);
        ggml_sparse_zz_set_layout(&wc[c], GGML_SPARSE_ZZ_LAYOUT_COLS);
        wcb[c] = wc[c];
#ifdef ZZ_PROBE_AB
        ggml_sparse_zz_to_colmajor_B(type, n, nr, w + c*wbytes, w_cmb + c*wbytes);
        wcb[c].data = w_cmb + c*wbytes;
#endif
    }

    float * x = malloc(sizeof(float)*n);
    for (int64_t j = 0; j < n; ++j) {
        x[j] = (float) ((double) (rng_u64() >> 11)/9007199254740992.0*2.0 - 1.0);
    }
    struct ggml_tensor xt = mk(GGML_TYPE_F32, n, 1, sizeof(float)*n, x);

    // columns: rows dense, cm dense, cm 50 %, cm 80 %, cm with an empty list (the fixed per-call cost);
    // the lists keep each column with that probability (a uniform |x| makes a threshold list the same)
    // (B: the other version's cm dense and 50 %)
    enum { NCONF = 5 + NB };
    const char  * names[] = { "rows dense", "cm dense", "cm 50%", "cm 80%", "cm empty", "B cm dense", "B cm 50%" };
    const double  keep[]  = { 1.0, 1.0, 0.5, 0.2, 0.0, 1.0, 0.5 };
    int32_t * idx[NCONF];
    struct ggml_tensor idxt[NCONF], yt[NCONF];
    float * y[NCONF];
    const size_t wsize = 64u << 20;
    void * wdata = malloc(wsize);
    for (int k = 0; k < NCONF; ++k) {
        y[k] = malloc(sizeof(float)*m);
        yt[k] = mk(GGML_TYPE_F32, m, 1, sizeof(float)*m, y[k]);
        yt[k].src[1] = &xt;
        yt[k].src[2] = NULL;
        idx[k] = NULL;
        if (k == 6) {
            // B at 50 %: A's list
            idxt[k] = idxt[2];
            yt[k].src[2] = &idxt[k];
        } else if (keep[k] < 1.0) {
            idx[k] = malloc(sizeof(int32_t)*(n + 1));
            int32_t cnt = 0;
            for (int64_t j = 0; j < n; ++j) {
                if ((double) (rng_u64() >> 11)/9007199254740992.0 < keep[k]) {
                    idx[k][cnt++] = (int32_t) j;
                }
            }
            idx[k][n] = cnt;
            idxt[k] = mk(GGML_TYPE_I32, n + 1, 1, sizeof(int32_t)*(n + 1), idx[k]);
            yt[k].src[2] = &idxt[k];
        }
    }

    static double t[NCONF][MAX_ROUNDS];
    struct zz_test_pool pool;
    zz_test_pool_init(&pool, nth);
    int next = 0;
    const int warm = cold ? 20 : 2;
    for (int i = -warm; i < rounds; ++i) {
        for (int k = 0; k < NCONF; ++k) {
            if (only >= 0 && k != only) {
                continue;
            }
            const int c = next++ % copies;
            yt[k].src[0] = k == 0 ? &wr[c] : k >= 5 ? &wcb[c] : &wc[c];
            const double t0 = now_us();
            zz_test_pool_run(&pool, op_of(k), &yt[k], wdata, wsize, false);
            if (i >= 0) {
                t[k][i] = now_us() - t0;
            }
        }
    }

    // check: every column against the scalar reference on copy 0 (relative error of the whole vector)
    int fail = 0;
    for (int k = 0; k < NCONF; ++k) {
        if (only >= 0 && k != only) {
            continue;
        }
        yt[k].src[0] = k == 0 ? &wr[0] : k >= 5 ? &wcb[0] : &wc[0];
        zz_test_pool_run(&pool, op_of(k), &yt[k], wdata, wsize, false);
        float * yf = malloc(sizeof(float)*m);
        memcpy(yf, y[k], sizeof(float)*m);
        zz_test_pool_run(&pool, op_of(k), &yt[k], wdata, wsize, true);
        double num = 0.0, den = 0.0;
        for (int64_t i = 0; i < m; ++i) {
            num += ((double) yf[i] - y[k][i])*((double) yf[i] - y[k][i]);
            den += (double) y[k][i]*y[k][i];
        }
        const double rel = den > 0.0 ? sqrt(num/den) : sqrt(num);
        if (!(rel < 0.03)) {
            fprintf(stderr, "%s: rel err %.3g against the reference\n", names[k], rel);
            fail = 1;
        }
        free(yf);
        qsort(t[k], rounds, sizeof(double), cmp_double);
        printf("%lldx%lld t%d %s %-10s fastest %7.1f us  median %7.1f us  rel err %.2g\n", (long long) m, (long long) n,
               nth, cold ? "cold" : "hot", names[k], t[k][0], t[k][rounds/2], rel);
    }
    zz_test_pool_free(&pool);
    return fail;
}
