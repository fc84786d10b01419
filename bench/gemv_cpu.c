// llama-sparse: CPU decode GEMV microbenchmark. Stock ggml Q4_K mul_mat (CPU backend, ggml graph,
// x quantized to Q8_K inside) against zigzag MUL_MAT_ZZ dense and with an active-column index at
// several sparsities, batch 1. Weight bytes are random valid Q4_K blocks (content does not change
// the timing). Prints a markdown table.
// usage: gemv_cpu [-t n_threads] [-r reps] [-s min|median] [-m hot|cold] [-q q4_k|q8_0] [-S 0|1]
// -q: weight type of both sides (stock mul_mat of that type against zigzag of that type);
// -S 1: SmolLM2-135M shapes (576/1536) instead of Llama-2-7B's, -S 2: 4096x4096 only; -p s: only sparsity s;
// -L rows|cols|both: zigzag weights in the file's row layout (default), in the column-major runtime layout
// (ggml_sparse_zz_to_colmajor), or both side by side (the two layouts' calls alternate in every round)
#include "ggml.h"
#include "ggml-cpu.h"
#include "ggml-cpu-impl.h"
#include "ggml-sparse.h"
#include "ggml-sparse-cpu.h"
#include "zz_test_threads.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_REPS 1000

static uint64_t rng_state = 0x2545f4914f6cdd1dULL;

static uint64_t rng_u64(void) {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30))*0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27))*0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static float rng_normal(void) {
    const double u1 = ((rng_u64() >> 11) + 1.0)*(1.0/9007199254740992.0);
    const double u2 = (rng_u64() >> 11)*(1.0/9007199254740992.0);
    return (float) (sqrt(-2.0*log(u1))*cos(6.283185307179586*u2));
}

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec*1e6 + ts.tv_nsec*1e-3;
}

static int cmp_double(const void * a, const void * b) {
    const double x = *(const double *) a, y = *(const double *) b;
    return (x > y) - (x < y);
}

static bool use_min = true;

// the machine is shared: the fastest run (default) estimates the unloaded time better than the median
static double median(double * v, int n) {
    qsort(v, n, sizeof(double), cmp_double);
    return use_min ? v[0] : v[n/2];
}

static enum ggml_type wtype = GGML_TYPE_Q4_K;

// random blocks of wtype with sane fp16 scales (d first, then dmin for Q4_K; Q8_0/Q4_0 have d first)
static void fill_q4_K(void * data, int64_t n_blocks) {
    const size_t bs = ggml_type_size(wtype);
    uint8_t * p = data;
    for (int64_t b = 0; b < n_blocks; ++b) {
        for (size_t i = 0; i < bs; i += 8) {
            const uint64_t r = rng_u64();
            memcpy(p + b*bs + i, &r, bs - i < 8 ? bs - i : 8);
        }
        const ggml_fp16_t d    = ggml_fp32_to_fp16(0.001f + 0.001f*(float) (rng_u64() % 1000)/1000.0f);
        const ggml_fp16_t dmin = ggml_fp32_to_fp16(0.0005f);
        memcpy(p + b*bs + 0, &d,    2);
        if (wtype == GGML_TYPE_Q4_K) {
            memcpy(p + b*bs + 2, &dmin, 2);
        }
    }
}

// cold: the weights are cycled through enough copies to exceed the last-level cache, so every call
// streams them from memory as decoding a real model does; hot: one copy, cache-resident if it fits
static int n_copies_for(size_t bytes, bool cold) {
    const size_t total = (size_t) 256*1024*1024;
    const int n = cold ? (int) ((total + bytes - 1)/bytes) : 1;
    return n < 64 ? n : 64; // small (SmolLM2) shapes: 64 copies, mostly beyond the caches

}

struct stock_bench {
    struct ggml_context * ctx;
    struct ggml_cgraph  * gf[64];
    struct ggml_cplan     plan;
    uint8_t             * work;
    int                   copies;
    int                   next;
};

static void stock_init(struct stock_bench * sb, int64_t m, int64_t n, int n_threads, int copies) {
    const size_t wbytes = ggml_row_size(wtype, n)*m;
    struct ggml_init_params ip = { (wbytes + 1024)*copies + 64*n + 64*m + 16*1024*1024, NULL, false };
    sb->ctx = ggml_init(ip);
    struct ggml_tensor * x = ggml_new_tensor_2d(sb->ctx, GGML_TYPE_F32, n, 1);
    for (int64_t j = 0; j < n; ++j) {
        ((float *) x->data)[j] = rng_normal();
    }
    size_t work_size = 0;
    for (int c = 0; c < copies; ++c) {
        struct ggml_tensor * w = ggml_new_tensor_2d(sb->ctx, wtype, n, m);
        fill_q4_K(w->data, m*n/ggml_blck_size(wtype));
        sb->gf[c] = ggml_new_graph(sb->ctx);
        ggml_build_forward_expand(sb->gf[c], ggml_mul_mat(sb->ctx, w, x));
        const struct ggml_cplan p = ggml_graph_plan(sb->gf[c], n_threads, NULL);
        work_size = p.work_size > work_size ? p.work_size : work_size;
    }
    sb->plan = ggml_graph_plan(sb->gf[0], n_threads, NULL);
    sb->work = malloc(work_size + 1);
    sb->plan.work_data = sb->work;
    sb->plan.work_size = work_size;
    sb->copies = copies;
    sb->next   = 0;
}

// one timed call; every call takes the next weight copy (cold: streamed from memory)
static double stock_run(struct stock_bench * sb) {
    const double t0 = now_us();
    ggml_graph_compute(sb->gf[sb->next++ % sb->copies], &sb->plan);
    return now_us() - t0;
}

static void stock_free(struct stock_bench * sb) {
    free(sb->work);
    ggml_free(sb->ctx);
}

struct zz_bench {
    int64_t m, n;
    int     copies;
    void  * w;
    struct ggml_tensor wcopy[64];
    void  * w_cm;
    struct ggml_tensor wcopy_cm[64];
    float * x;
    float * y;
    int32_t * idx;
    struct ggml_tensor wt, xt, it, yt, idxt;
    void  * wdata;
    size_t  wsize;
    int     next;
};

static struct ggml_tensor mk(enum ggml_type type, int64_t ne0, int64_t ne1, size_t nb1, void * data) {
    struct ggml_tensor t;
    memset(&t, 0, sizeof(t));
    t.type = type;
    t.ne[0] = ne0; t.ne[1] = ne1; t.ne[2] = 1; t.ne[3] = 1;
    t.nb[0] = ggml_type_size(type); t.nb[1] = nb1; t.nb[2] = nb1*ne1; t.nb[3] = t.nb[2];
    t.data = data;
    return t;
}

// threshold on |x| that leaves about (1 - sparsity) of the columns active
static float thr_for(const float * x, int64_t n, double sparsity) {
    float * a = malloc(sizeof(float)*n);
    for (int64_t j = 0; j < n; ++j) {
        a[j] = fabsf(x[j]);
    }
    // a few rounds of bisection on the value are enough for a benchmark
    float lo = 0.0f, hi = 100.0f;
    for (int it = 0; it < 60; ++it) {
        const float mid = 0.5f*(lo + hi);
        int64_t below = 0;
        for (int64_t j = 0; j < n; ++j) {
            below += a[j] < mid;
        }
        if ((double) below/n < sparsity) lo = mid; else hi = mid;
    }
    free(a);
    return hi;
}

// one zigzag configuration: dense (sparsity < 0) or an index list for a sparsity
struct zz_conf {
    bool      cm;
    int32_t * idx;
    struct ggml_tensor idxt, yt;
    int64_t active;
    double  t_idx;
};

// builds the index list (timing the index op, fastest/median of reps) and the MUL_MAT_ZZ node
static void zz_conf_init(struct zz_conf * c, struct zz_bench * b, struct zz_test_pool * pool, double sparsity, int reps) {
    const bool sparse = sparsity >= 0.0;
    c->idx = malloc(sizeof(int32_t)*(b->n + 1));
    c->t_idx  = 0.0;
    c->active = b->n;
    if (sparse) {
        const float thr = thr_for(b->x, b->n, sparsity);
        c->idxt = mk(GGML_TYPE_I32, b->n + 1, 1, sizeof(int32_t)*(b->n + 1), c->idx);
        c->idxt.src[0] = &b->xt;
        memcpy(&c->idxt.op_params[0], &thr, sizeof(float));
        c->idxt.op_params[1] = GGML_SPARSE_IDX_LIST;
        GGML_ASSERT(ggml_sparse_cpu_work_size(&c->idxt, pool->nth) <= b->wsize);
        double t[MAX_REPS];
        for (int i = 0; i < 20; ++i) {
            zz_test_pool_run(pool, ggml_sparse_cpu_forward_idx, &c->idxt, b->wdata, b->wsize, false);
        }
        for (int i = 0; i < reps; ++i) {
            const double t0 = now_us();
            zz_test_pool_run(pool, ggml_sparse_cpu_forward_idx, &c->idxt, b->wdata, b->wsize, false);
            t[i] = now_us() - t0;
        }
        c->t_idx  = median(t, reps);
        c->active = c->idx[b->n];
    }
    c->yt = mk(GGML_TYPE_F32, b->m, 1, sizeof(float)*b->m, b->y);
    c->yt.src[0] = &b->wt;
    c->yt.src[1] = &b->xt;
    c->yt.src[2] = sparse ? &c->idxt : NULL;
    GGML_ASSERT(ggml_sparse_cpu_work_size(&c->yt, pool->nth) <= b->wsize);
}

// one timed MUL_MAT_ZZ call on the next weight copy
static double zz_conf_run(struct zz_conf * c, struct zz_bench * b, struct zz_test_pool * pool) {
    const int k = b->next++ % b->copies;
    c->yt.src[0] = c->cm ? &b->wcopy_cm[k] : &b->wcopy[k];
    const double t0 = now_us();
    zz_test_pool_run(pool, ggml_sparse_cpu_forward_mul_mat_zz, &c->yt, b->wdata, b->wsize, false);
    return now_us() - t0;
}

int main(int argc, char ** argv) {
    int n_threads = 2;
    int reps      = 200;
    bool cold     = false;
    int shape_set = 0; // 0: Llama-2-7B shapes, 1: SmolLM2-135M shapes
    double only_sp = -1.0;
    int layouts = 1; // bit 0: row layout, bit 1: column-major
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "-t") == 0) n_threads = atoi(argv[i + 1]);
        if (strcmp(argv[i], "-r") == 0) reps      = atoi(argv[i + 1]);
        if (strcmp(argv[i], "-s") == 0) use_min   = strcmp(argv[i + 1], "median") != 0;
        if (strcmp(argv[i], "-m") == 0) cold      = strcmp(argv[i + 1], "cold") == 0;
        if (strcmp(argv[i], "-q") == 0) wtype     = strcmp(argv[i + 1], "q8_0") == 0 ? GGML_TYPE_Q8_0 : GGML_TYPE_Q4_K;
        if (strcmp(argv[i], "-S") == 0) shape_set = atoi(argv[i + 1]);
        if (strcmp(argv[i], "-p") == 0) only_sp   = atof(argv[i + 1]);
        if (strcmp(argv[i], "-L") == 0) layouts   = strcmp(argv[i + 1], "cols") == 0 ? 2 : strcmp(argv[i + 1], "both") == 0 ? 3 : 1;
    }
    reps = reps > MAX_REPS ? MAX_REPS : reps;
    ggml_cpu_init();

    const int64_t shapes_7b[3][2]   = { { 4096, 4096 }, { 11008, 4096 }, { 4096, 11008 } };
    const int64_t shapes_smol[3][2] = { { 576, 576 }, { 1536, 576 }, { 576, 1536 } };
    const int64_t (*shapes)[2] = shape_set == 1 ? shapes_smol : shapes_7b;
    double        sps[]        = { 0.25, 0.40, 0.50, 0.65, 0.80 };
    int           nsp          = sizeof(sps)/sizeof(sps[0]);
    if (only_sp >= 0.0) { // -p: one sparsity only (profiling)
        sps[0] = only_sp;
        nsp    = 1;
    }

    struct zz_test_pool pool;
    zz_test_pool_init(&pool, n_threads);

    printf("threads %d, batch 1, %s, %s of %d rounds (each round times stock and every zigzag column once, interleaved), weights %s, times in us; ratio = stock time / zigzag time\n\n",
           n_threads, ggml_type_name(wtype), use_min ? "fastest" : "median", reps,
           cold ? "cold (cycled through copies totalling 256 MiB: streamed from memory)" : "hot (one copy, cache-resident where it fits)");
    printf("layout: %s\n\n", layouts == 1 ? "rows (the file's)" : layouts == 2 ? "column-major" :
           "rows (the file's), then column-major (C)");
    printf("| m x n | stock |");
    for (int l = 0; l < 2; ++l) {
        if (!(layouts & (1 << l))) {
            continue;
        }
        const char * tag = l == 1 && layouts == 3 ? " C" : "";
        printf(" zz%s dense | ratio |", tag);
        for (int s = 0; s < nsp; ++s) {
            printf(" zz%s %d%% | ratio |", tag, (int) lround(100*sps[s]));
        }
    }
    printf(" idx op |\n|---|---|");
    for (int l = 0; l < 2; ++l) {
        for (int s = 0; (layouts & (1 << l)) && s <= nsp; ++s) {
            printf("---|---|");
        }
    }
    printf("---|\n");

    const int n_shapes = shape_set == 2 ? 1 : 3; // -S 2: 4096x4096 only (profiling)
    for (int si = 0; si < n_shapes; ++si) {
        const int64_t m = shapes[si][0];
        const int64_t n = shapes[si][1];

        const int64_t bk = ggml_blck_size(wtype);
        const size_t wbytes = ggml_row_size(wtype, bk*n)*(m/bk);
        const int    copies = n_copies_for(wbytes, cold);
        GGML_ASSERT(copies <= 64);

        struct stock_bench sb;
        stock_init(&sb, m, n, n_threads, copies);

        struct zz_bench b;
        memset(&b, 0, sizeof(b));
        b.m      = m;
        b.n      = n;
        b.copies = copies;
        b.w      = malloc(wbytes*copies);
        b.x      = malloc(sizeof(float)*n);
        b.y      = malloc(sizeof(float)*m);
        b.idx    = NULL;
        fill_q4_K(b.w, m*n/bk*copies);
        for (int64_t j = 0; j < n; ++j) {
            b.x[j] = rng_normal();
        }
        for (int c = 0; c < copies; ++c) {
            b.wcopy[c] = mk(wtype, bk*n, m/bk, ggml_row_size(wtype, bk*n), (char *) b.w + c*wbytes);
        }
        b.w_cm = NULL;
        if (layouts & 2) {
            b.w_cm = malloc(wbytes*copies);
            for (int c = 0; c < copies; ++c) {
                ggml_sparse_zz_to_colmajor(wtype, n, m/bk, (char *) b.w + c*wbytes, (char *) b.w_cm + c*wbytes);
                b.wcopy_cm[c] = mk(wtype, bk*n, m/bk, ggml_row_size(wtype, bk*n), (char *) b.w_cm + c*wbytes);
                ggml_sparse_zz_set_layout(&b.wcopy_cm[c], GGML_SPARSE_ZZ_LAYOUT_COLS);
            }
        }
        b.wt = b.wcopy[0];
        b.xt = mk(GGML_TYPE_F32, n, 1, sizeof(float)*n, b.x);
        b.wsize = 64*1024*1024;
        b.wdata = malloc(b.wsize);

        // configurations: 0 = stock, then per layout zigzag dense and zigzag at each sparsity; measured in
        // rounds, one call of each per round, so every configuration sees the same machine load
        struct zz_conf conf[16];
        int nconf = 1;
        for (int l = 0; l < 2; ++l) {
            for (int s = 0; (layouts & (1 << l)) && s <= nsp; ++s) {
                zz_conf_init(&conf[nconf], &b, &pool, s == 0 ? -1.0 : sps[s - 1], reps);
                conf[nconf++].cm = l == 1;
            }
        }
        static double t[16][MAX_REPS];
        for (int i = -20; i < reps; ++i) {
            for (int k = 0; k < nconf; ++k) {
                const double dt = k == 0 ? stock_run(&sb) : zz_conf_run(&conf[k], &b, &pool);
                if (i >= 0) {
                    t[k][i] = dt;
                }
            }
        }
        if (layouts == 3) {
            // the two layouts must agree (same chunks, so same coefficient rounding): relative error to stderr
            float * y0 = malloc(sizeof(float)*m);
            for (int s = 0; s <= nsp; ++s) {
                struct zz_conf * cr = &conf[1 + s], * cc = &conf[2 + nsp + s];
                cr->yt.src[0] = &b.wcopy[0];
                zz_test_pool_run(&pool, ggml_sparse_cpu_forward_mul_mat_zz, &cr->yt, b.wdata, b.wsize, false);
                memcpy(y0, b.y, sizeof(float)*m);
                cc->yt.src[0] = &b.wcopy_cm[0];
                zz_test_pool_run(&pool, ggml_sparse_cpu_forward_mul_mat_zz, &cc->yt, b.wdata, b.wsize, false);
                double num = 0.0, den = 0.0;
                for (int64_t i = 0; i < m; ++i) {
                    num += (double) (b.y[i] - y0[i])*(b.y[i] - y0[i]);
                    den += (double) y0[i]*y0[i];
                }
                fprintf(stderr, "%lldx%lld conf %d: rows vs cols rel err %.3g\n", (long long) m, (long long) n, s, sqrt(num/den));
            }
            free(y0);
        }
        double tm[16];
        for (int k = 0; k < nconf; ++k) {
            tm[k] = median(t[k], reps);
        }
        printf("| %lldx%lld | %.1f |", (long long) m, (long long) n, tm[0]);
        for (int k = 1; k < nconf; ++k) {
            printf(" %.1f | %.2f |", tm[k], tm[0]/tm[k]);
        }
        printf(" %.1f |\n", conf[nconf - 1].t_idx);
        fflush(stdout);

        for (int k = 1; k < nconf; ++k) {
            free(conf[k].idx);
        }
        stock_free(&sb);
        free(b.w); free(b.w_cm); free(b.x); free(b.y); free(b.idx); free(b.wdata);
    }
    zz_test_pool_free(&pool);
    return 0;
}
