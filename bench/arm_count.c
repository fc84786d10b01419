// llama-sparse: a proxy for aarch64 decode GEMV cost where no ARM machine is at hand: CALLS calls of stock's
// vec_dot over an m x n weight (x quantized to the vec_dot type each call, as ggml's mul_mat does) or of the
// zigzag MUL_MAT_ZZ op (one thread) on random valid blocks. bench/arm_count.sh runs it under qemu -singlestep and
// counts the instructions executed: (count at 3 calls - count at 1)/2 is one call's.
// usage: arm_count stock|zz|ref q4_k|q6_k|q8_0|q4_0 M N CALLS SPARSITY [T]
#define GGML_COMMON_DECL_C
#include "ggml-common.h"
#include "ggml.h"
#include "ggml-cpu.h"
#include "ggml-cpu-impl.h"
#include "ggml-sparse.h"
#include "ggml-sparse-cpu.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct ggml_sparse_stats * ggml_sparse_idx_get_stats(const struct ggml_tensor * idx) { (void) idx; return NULL; }
void zz_test_barrier(struct ggml_threadpool * tp) { (void) tp; }

static uint64_t rng = 0x9e3779b97f4a7c15ULL;
static uint32_t rnd(void) { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; return (uint32_t) (rng >> 16); }
// random valid blocks: small positive fp16 scales, random quants
static void fill_blocks(enum ggml_type type, uint8_t * p, int64_t nb) {
    const size_t bs = ggml_type_size(type);
    for (size_t i = 0; i < bs*nb; ++i) p[i] = (uint8_t) rnd();
    for (int64_t b = 0; b < nb; ++b) {
        uint16_t d = (uint16_t) (((5 + rnd() % 4) << 10) | (rnd() & 0x3FF)), dm = (uint16_t) (((5 + rnd() % 4) << 10) | (rnd() & 0x3FF));
        memcpy(p + b*bs + (type == GGML_TYPE_Q6_K ? bs - 2 : 0), &d, 2); // Q6_K keeps d last
        if (type == GGML_TYPE_Q4_K) memcpy(p + b*bs + 2, &dm, 2);
    }
}
int main(int argc, char ** argv) {
    if (argc < 7) {
        fprintf(stderr, "usage: %s stock|zz|ref q4_k|q6_k|q8_0|q4_0 M N CALLS SPARSITY [T]\n", argv[0]);
        return 2;
    }
    const char * mode = argv[1];
    const enum ggml_type type = strcmp(argv[2], "q4_k") == 0 ? GGML_TYPE_Q4_K : strcmp(argv[2], "q6_k") == 0 ? GGML_TYPE_Q6_K :
                                strcmp(argv[2], "q8_0") == 0 ? GGML_TYPE_Q8_0 : GGML_TYPE_Q4_0;
    const int64_t m = atoi(argv[3]), n = atoi(argv[4]);
    const int calls = atoi(argv[5]);
    const double sp = atof(argv[6]);
    const int nt = argc > 7 ? atoi(argv[7]) : 1;
    const int64_t bk = ggml_blck_size(type);
    const size_t bs = ggml_type_size(type);
    srand(1);
    float * x = malloc(sizeof(float)*n*nt);
    for (int64_t i = 0; i < n*nt; ++i) x[i] = (rand()/(float) RAND_MAX - 0.5f);
    float * y = malloc(sizeof(float)*m*nt);
    ggml_cpu_init();
    if (strcmp(mode, "stock") == 0) {
        // standard layout: row i of W (n inputs), vec_dot against x quantized to vec_dot_type
        void * w = malloc(bs*(n/bk)*m);
        fill_blocks(type, w, (n/bk)*m);
        const struct ggml_type_traits_cpu * tr = ggml_get_type_traits_cpu(type);
        const size_t qbs = ggml_row_size(tr->vec_dot_type, n);
        void * xq = malloc(qbs*nt);
        for (int c = 0; c < calls; ++c) {
            for (int t = 0; t < nt; ++t) ggml_get_type_traits_cpu(tr->vec_dot_type)->from_float(x + t*n, (char *) xq + t*qbs, n);
            for (int64_t i = 0; i < m; ++i)
                for (int t = 0; t < nt; ++t)
                    tr->vec_dot(n, y + t*m + i, 0, (const char *) w + i*bs*(n/bk), 0, (const char *) xq + t*qbs, 0, 1);
        }
    } else {
        // zigzag: stored row r = blocks of columns 0..n-1 over output rows r*bk .. r*bk+bk-1
        const int64_t nr = m/bk;
        void * w = malloc(bs*n*nr);
        fill_blocks(type, w, n*nr);
        int32_t * idx = malloc(sizeof(int32_t)*(n + 1));
        int64_t cnt = 0;
        for (int64_t j = 0; j < n; ++j) if (rand()/(double) RAND_MAX >= sp) idx[cnt++] = j;
        idx[n] = cnt;
        struct ggml_tensor wt = {0}, xt = {0}, it = {0}, dst = {0};
        wt.type = type; wt.ne[0] = bk*n; wt.ne[1] = nr; wt.ne[2] = wt.ne[3] = 1; wt.nb[0] = bs; wt.nb[1] = bs*n; wt.nb[2] = wt.nb[3] = bs*n*nr; wt.data = w;
        xt.type = GGML_TYPE_F32; xt.ne[0] = n; xt.ne[1] = nt; xt.ne[2] = xt.ne[3] = 1; xt.nb[0] = 4; xt.nb[1] = 4*n; xt.nb[2] = xt.nb[3] = 4*n*nt; xt.data = x;
        it.type = GGML_TYPE_I32; it.ne[0] = n + 1; it.ne[1] = it.ne[2] = it.ne[3] = 1; it.nb[0] = 4; it.nb[1] = it.nb[2] = it.nb[3] = 4*(n + 1); it.data = idx;
        dst.type = GGML_TYPE_F32; dst.ne[0] = m; dst.ne[1] = nt; dst.ne[2] = dst.ne[3] = 1; dst.nb[0] = 4; dst.nb[1] = 4*m; dst.nb[2] = dst.nb[3] = 4*m*nt; dst.data = y;
        dst.op = GGML_OP_MUL_MAT_ZZ;
        dst.src[0] = &wt; dst.src[1] = &xt; dst.src[2] = sp > 0 ? &it : NULL;
        struct ggml_compute_params params = { 0, 1, 0, NULL, NULL, strcmp(mode, "ref") == 0 };
        for (int c = 0; c < calls; ++c) ggml_sparse_cpu_forward_mul_mat_zz(&params, &dst);
    }
    double s = 0, s2 = 0; for (int64_t i = 0; i < m*nt; ++i) { s += y[i]; s2 += y[i]*y[i]; }
    printf("checksum %g %g  y0 %g %g %g\n", s, s2, y[0], y[1], y[m*nt-1]);
    return 0;
}
