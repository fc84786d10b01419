// llama-sparse: self-contained check of the fast MUL_MAT_ZZ kernels of another architecture (NEON GEMV
// against the scalar reference, the prefill GEMM against a plain sum) on random valid blocks. Needs no
// ggml library: the few ggml symbols the op sources use are defined below, so it can be
// cross-compiled statically and run under qemu (tests/c/cross_check.sh). Last line: "N passed, N failed".
#define GGML_COMMON_DECL_C
#include "ggml-common.h"

#include "ggml.h"
#include "ggml-cpu-impl.h"
#include "ggml-sparse.h"
#include "ggml-sparse-cpu.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// minimal stand-ins for ggml-base
int64_t ggml_blck_size(enum ggml_type type) {
    return type == GGML_TYPE_Q4_K || type == GGML_TYPE_Q6_K ? QK_K : 32;
}

size_t ggml_type_size(enum ggml_type type) {
    switch (type) {
        case GGML_TYPE_Q4_0: return sizeof(block_q4_0);
        case GGML_TYPE_Q8_0: return sizeof(block_q8_0);
        case GGML_TYPE_Q4_K: return sizeof(block_q4_K);
        case GGML_TYPE_Q6_K: return sizeof(block_q6_K);
        case GGML_TYPE_F32:  return sizeof(float);
        case GGML_TYPE_I32:  return sizeof(int32_t);
        default:             return 0;
    }
}

const char * ggml_type_name(enum ggml_type type) {
    return type == GGML_TYPE_Q4_K ? "q4_K" : type == GGML_TYPE_Q6_K ? "q6_K" : type == GGML_TYPE_Q8_0 ? "q8_0" : "q4_0";
}

bool ggml_are_same_shape(const struct ggml_tensor * a, const struct ggml_tensor * b) {
    return a->ne[0] == b->ne[0] && a->ne[1] == b->ne[1] && a->ne[2] == b->ne[2] && a->ne[3] == b->ne[3];
}

void ggml_abort(const char * file, int line, const char * fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s:%d: ", file, line);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    abort();
}

struct ggml_sparse_stats * ggml_sparse_idx_get_stats(const struct ggml_tensor * idx) {
    struct ggml_sparse_stats * stats;
    memcpy(&stats, &idx->op_params[2], sizeof(stats));
    return stats;
}

void ggml_barrier(struct ggml_threadpool * tp) {
    (void) tp; // single-threaded here
}

static uint64_t rng = 0x9e3779b97f4a7c15ULL;

static uint32_t rnd(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (uint32_t) (rng >> 16);
}

// small positive fp16 value (exponent 2^-10 .. 2^-7), bit pattern written directly
static uint16_t rnd_fp16(void) {
    return (uint16_t) (((5 + rnd() % 4) << 10) | (rnd() & 0x3FF));
}

static void fill_blocks(enum ggml_type type, uint8_t * p, int64_t nb) {
    const size_t bs = ggml_type_size(type);
    for (size_t i = 0; i < bs*nb; ++i) {
        p[i] = (uint8_t) rnd();
    }
    for (int64_t b = 0; b < nb; ++b) {
        uint8_t * blk = p + b*bs;
        const uint16_t d = rnd_fp16(), dm = rnd_fp16();
        switch (type) {
            case GGML_TYPE_Q4_K: memcpy(blk, &d, 2); memcpy(blk + 2, &dm, 2); break;
            case GGML_TYPE_Q6_K: memcpy(blk + bs - 2, &d, 2); break;
            default:             memcpy(blk, &d, 2); break;
        }
    }
}

int main(void) {
    const enum ggml_type types[] = { GGML_TYPE_Q4_K, GGML_TYPE_Q6_K, GGML_TYPE_Q8_0, GGML_TYPE_Q4_0 };
    int n_pass = 0, n_fail = 0;

    printf("fast kernels: %s\n", ggml_sparse_zz_gemv_arm(GGML_TYPE_Q4_K) ? "arm" : ggml_sparse_zz_gemv_x86(GGML_TYPE_Q4_K) ? "x86" : "none");

    for (int ti = 0; ti < 4; ++ti) {
        for (int it = 0; it < 8; ++it) {
            const enum ggml_type type = types[ti];
            const int64_t bk = ggml_blck_size(type);
            const int64_t m  = bk*(1 + rnd() % 4);
            const int64_t n  = 1 + rnd() % 700;
            // it >= 6: prefill (T > GGML_SPARSE_MAX_BATCH, GEMM), checked against a plain sum instead
            const bool    gemm   = it >= 6;
            const int     nt     = gemm ? GGML_SPARSE_MAX_BATCH + 1 + rnd() % 20 : 1 + rnd() % GGML_SPARSE_MAX_BATCH;
            const bool    sparse = !gemm && it % 2 == 1;

            uint8_t * w   = malloc(ggml_type_size(type)*n*(m/bk));
            float   * x   = malloc(sizeof(float)*n*nt);
            int32_t * idx = malloc(sizeof(int32_t)*(n + 1));
            float   * y0  = malloc(sizeof(float)*m*nt);
            float   * y1  = malloc(sizeof(float)*m*nt);
            fill_blocks(type, w, n*(m/bk));
            for (int64_t i = 0; i < n*nt; ++i) {
                x[i] = ((int) (rnd() % 2001) - 1000)/500.0f;
            }
            int64_t cnt = 0;
            for (int64_t j = 0; j < n; ++j) {
                if (rnd() % 2) {
                    idx[cnt++] = (int32_t) j;
                }
            }
            idx[n] = (int32_t) cnt;

            struct ggml_tensor wt, xt, it_, dst;
            memset(&wt, 0, sizeof(wt)); memset(&xt, 0, sizeof(xt)); memset(&it_, 0, sizeof(it_)); memset(&dst, 0, sizeof(dst));
            wt.type = type; wt.ne[0] = bk*n; wt.ne[1] = m/bk; wt.ne[2] = wt.ne[3] = 1;
            wt.nb[0] = ggml_type_size(type); wt.nb[1] = wt.nb[0]*n; wt.data = w;
            xt.type = GGML_TYPE_F32; xt.ne[0] = n; xt.ne[1] = nt; xt.ne[2] = xt.ne[3] = 1;
            xt.nb[0] = sizeof(float); xt.nb[1] = sizeof(float)*n; xt.data = x;
            it_.type = GGML_TYPE_I32; it_.ne[0] = n + 1; it_.ne[1] = it_.ne[2] = it_.ne[3] = 1;
            it_.nb[0] = sizeof(int32_t); it_.nb[1] = sizeof(int32_t)*(n + 1); it_.data = idx;
            dst.type = GGML_TYPE_F32; dst.ne[0] = m; dst.ne[1] = nt; dst.ne[2] = dst.ne[3] = 1;
            dst.nb[0] = sizeof(float); dst.nb[1] = sizeof(float)*m;
            dst.src[0] = &wt; dst.src[1] = &xt; dst.src[2] = sparse ? &it_ : NULL;

            struct ggml_compute_params params = { 0, 1, 0, NULL, NULL, false };
            if (gemm) {
                float wb[QK_K];
                memset(y0, 0, sizeof(float)*m*nt);
                for (int64_t r = 0; r < m/bk; ++r) {
                    for (int64_t j = 0; j < n; ++j) {
                        ggml_sparse_zz_dequant_block(type, w + (r*n + j)*ggml_type_size(type), wb);
                        for (int t = 0; t < nt; ++t) {
                            for (int64_t i = 0; i < bk; ++i) {
                                y0[t*m + r*bk + i] += x[t*n + j]*wb[i];
                            }
                        }
                    }
                }
            } else {
                dst.data = y0; params.use_ref = true;
                ggml_sparse_cpu_forward_mul_mat_zz(&params, &dst);
            }
            dst.data = y1; params.use_ref = false;
            ggml_sparse_cpu_forward_mul_mat_zz(&params, &dst);

            double num = 0.0, den = 0.0;
            for (int64_t i = 0; i < m*nt; ++i) {
                num += ((double) y1[i] - y0[i])*((double) y1[i] - y0[i]);
                den += (double) y0[i]*y0[i];
            }
            const double err = den > 0.0 ? sqrt(num/den) : sqrt(num);
            // the fp32 GEMM matches the reference to rounding; the integer GEMV kernels to their coefficients'
            // precision: 8 bits for Q4_K, and for Q8_0 and Q4_0 with dot products (~1 %), else 16 bits
#if defined(__ARM_FEATURE_DOTPROD)
            const bool c8 = type != GGML_TYPE_Q6_K;
#else
            const bool c8 = type == GGML_TYPE_Q4_K;
#endif
            const double tol = gemm ? 1e-5 : c8 ? 2e-2 : 1e-3;
            if (err < tol) {
                n_pass++;
            } else {
                n_fail++;
                printf("FAIL %s m=%lld n=%lld nt=%d sparse=%d gemm=%d: rel err %.3g\n", ggml_type_name(type),
                       (long long) m, (long long) n, nt, sparse, gemm, err);
            }
            free(w); free(x); free(idx); free(y0); free(y1);
        }
    }
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail == 0 ? 0 : 1;
}
