// llama-sparse: prefill GEMM on zigzag weights (T > GGML_SPARSE_MAX_BATCH, dense). Each weight block
// is dequantized once into an fp32 panel and reused by every token, in register tiles of tokens x outputs:
// AVX-512 6 x 64 (32-row blocks two block-rows at once; 12 x 32 for a lone one), AVX2 6 x 16, NEON 4 x 16.
#include "ggml-sparse-cpu.h"
#include "ggml-impl.h"

#include <stdbool.h>
#include <string.h>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#elif defined(__ARM_NEON)
#include <arm_neon.h>
#endif

#ifndef ZZ_GEMM_PF
#define ZZ_GEMM_PF 16 // blocks the panel fill prefetches ahead
#endif

#if defined(__AVX512F__)
#define ZZ_GEMM_NV 2  // output vectors per tile
#define ZZ_GEMM_TT (24/ZZ_GEMM_NV) // tokens per tile: 24 accumulators + NV weight rows of 32 registers
#define ZZ_GEMM_TI (16*ZZ_GEMM_NV) // outputs per tile
#elif defined(__AVX2__) && defined(__FMA__)
#define ZZ_GEMM_TT 6  // 12 accumulators + 2 weight rows + 1 broadcast fit 16 registers
#define ZZ_GEMM_TI 16
#else
#define ZZ_GEMM_TT 4
#define ZZ_GEMM_TI 16
#endif

#if defined(__AVX512F__)
// y[t*ldy + i] (+)= sum_{j < nj} x[t*ldx + j] * W[j][i], i < 16*nv, t < nt (nt, nv constants when inlined);
// W[j][i] = panel[(i/32)*ss + j*32 + i%32]: 32-output slices ss floats apart
static inline __attribute__((always_inline)) void zz_gemm_tile_avx512(
        const float * panel, int64_t ss, int64_t nj, const float * x, int64_t ldx, const int nt, const int nv,
        float * y, int64_t ldy, bool first) {
    __m512 acc[ZZ_GEMM_TT][4];
    for (int t = 0; t < nt; ++t) {
        for (int v = 0; v < nv; ++v) {
            acc[t][v] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(y + t*ldy + 16*v);
        }
    }
    for (int64_t j = 0; j < nj; ++j) {
        __m512 w[4];
        for (int v = 0; v < nv; ++v) {
            w[v] = _mm512_loadu_ps(panel + (v/2)*ss + j*32 + 16*(v%2));
        }
        for (int t = 0; t < nt; ++t) {
            const __m512 xv = _mm512_set1_ps(x[t*ldx + j]);
            for (int v = 0; v < nv; ++v) {
                acc[t][v] = _mm512_fmadd_ps(xv, w[v], acc[t][v]);
            }
        }
    }
    for (int t = 0; t < nt; ++t) {
        for (int v = 0; v < nv; ++v) {
            _mm512_storeu_ps(y + t*ldy + 16*v, acc[t][v]);
        }
    }
}

// one switch case per token count, so each tile is compiled with constant nt and nv
#define ZZ_GEMM_CASE(NT, SS, NV) case NT: zz_gemm_tile_avx512(panel, SS, nj, x, ldx, NT, NV, y, ldy, first); return;

#elif defined(__AVX2__) && defined(__FMA__)
// y[t*ldy + i] (+)= sum_{j < nj} x[t*ldx + j] * panel[j*bk + i], i < 16, t < nt (a constant when inlined)
static inline __attribute__((always_inline)) void zz_gemm_tile_avx2(
        const float * panel, int64_t bk, int64_t nj, const float * x, int64_t ldx, const int nt,
        float * y, int64_t ldy, bool first) {
    __m256 acc[ZZ_GEMM_TT][2];
    for (int t = 0; t < nt; ++t) {
        acc[t][0] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(y + t*ldy + 0);
        acc[t][1] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(y + t*ldy + 8);
    }
    for (int64_t j = 0; j < nj; ++j) {
        const __m256 w0 = _mm256_loadu_ps(panel + j*bk + 0);
        const __m256 w1 = _mm256_loadu_ps(panel + j*bk + 8);
        for (int t = 0; t < nt; ++t) {
            const __m256 xv = _mm256_broadcast_ss(x + t*ldx + j);
            acc[t][0] = _mm256_fmadd_ps(xv, w0, acc[t][0]);
            acc[t][1] = _mm256_fmadd_ps(xv, w1, acc[t][1]);
        }
    }
    for (int t = 0; t < nt; ++t) {
        _mm256_storeu_ps(y + t*ldy + 0, acc[t][0]);
        _mm256_storeu_ps(y + t*ldy + 8, acc[t][1]);
    }
}
#endif

// y[t*ldy + i] (+)= sum_{j < nj} x[t*ldx + j] * panel[j*bk + i], for i < ZZ_GEMM_TI and t < nt <= ZZ_GEMM_TT
static void zz_gemm_tile(const float * panel, int64_t bk, int64_t nj, const float * x, int64_t ldx, int nt,
                         float * y, int64_t ldy, bool first) {
#if defined(__AVX512F__)
    static_assert(ZZ_GEMM_TT == 12, "one case per token count");
    switch (nt) {
        ZZ_GEMM_CASE(12, 0, 2) ZZ_GEMM_CASE(11, 0, 2) ZZ_GEMM_CASE(10, 0, 2) ZZ_GEMM_CASE(9, 0, 2)
        ZZ_GEMM_CASE(8, 0, 2)  ZZ_GEMM_CASE(7, 0, 2)  ZZ_GEMM_CASE(6, 0, 2)  ZZ_GEMM_CASE(5, 0, 2)
        ZZ_GEMM_CASE(4, 0, 2)  ZZ_GEMM_CASE(3, 0, 2)  ZZ_GEMM_CASE(2, 0, 2)  ZZ_GEMM_CASE(1, 0, 2)
        default: break;
    }
    (void) bk;
#elif defined(__AVX2__) && defined(__FMA__)
    switch (nt) {
        case 6: zz_gemm_tile_avx2(panel, bk, nj, x, ldx, 6, y, ldy, first); return;
        case 5: zz_gemm_tile_avx2(panel, bk, nj, x, ldx, 5, y, ldy, first); return;
        case 4: zz_gemm_tile_avx2(panel, bk, nj, x, ldx, 4, y, ldy, first); return;
        case 3: zz_gemm_tile_avx2(panel, bk, nj, x, ldx, 3, y, ldy, first); return;
        case 2: zz_gemm_tile_avx2(panel, bk, nj, x, ldx, 2, y, ldy, first); return;
        case 1: zz_gemm_tile_avx2(panel, bk, nj, x, ldx, 1, y, ldy, first); return;
        default: break;
    }
#elif defined(__ARM_NEON)
    if (nt == ZZ_GEMM_TT) {
        float32x4_t acc[ZZ_GEMM_TT][4];
        for (int t = 0; t < ZZ_GEMM_TT; ++t) {
            for (int q = 0; q < 4; ++q) {
                acc[t][q] = first ? vdupq_n_f32(0.0f) : vld1q_f32(y + t*ldy + 4*q);
            }
        }
        for (int64_t j = 0; j < nj; ++j) {
            float32x4_t w[4];
            for (int q = 0; q < 4; ++q) {
                w[q] = vld1q_f32(panel + j*bk + 4*q);
            }
            for (int t = 0; t < ZZ_GEMM_TT; ++t) {
                const float xv = x[t*ldx + j];
                for (int q = 0; q < 4; ++q) {
                    acc[t][q] = vfmaq_n_f32(acc[t][q], w[q], xv);
                }
            }
        }
        for (int t = 0; t < ZZ_GEMM_TT; ++t) {
            for (int q = 0; q < 4; ++q) {
                vst1q_f32(y + t*ldy + 4*q, acc[t][q]);
            }
        }
        return;
    }
#endif
    for (int t = 0; t < nt; ++t) {
        float acc[ZZ_GEMM_TI];
        for (int i = 0; i < ZZ_GEMM_TI; ++i) {
            acc[i] = first ? 0.0f : y[t*ldy + i];
        }
        for (int64_t j = 0; j < nj; ++j) {
            const float xv = x[t*ldx + j];
            for (int i = 0; i < ZZ_GEMM_TI; ++i) {
                acc[i] += xv*panel[j*bk + i];
            }
        }
        memcpy(y + t*ldy, acc, sizeof(acc));
    }
}

#if defined(__AVX512F__)
#define ZZ_GEMM_TTW 6 // tokens per wide tile: 6 x 4 accumulators, 4 weight and 1 broadcast registers
// the wide tile: 64 outputs from two 32-output panel slices ss floats apart, nt <= ZZ_GEMM_TTW tokens
// (10 loads per 24 FMAs against the 12 x 32 tile's 14, and 6 row pointers, none spilled)
static void zz_gemm_tile_wide(const float * panel, int64_t ss, int64_t nj, const float * x, int64_t ldx, int nt,
                              float * y, int64_t ldy, bool first) {
    switch (nt) {
        ZZ_GEMM_CASE(6, ss, 4) ZZ_GEMM_CASE(5, ss, 4) ZZ_GEMM_CASE(4, ss, 4)
        ZZ_GEMM_CASE(3, ss, 4) ZZ_GEMM_CASE(2, ss, 4) ZZ_GEMM_CASE(1, ss, 4)
        default: GGML_ABORT("wide tile: %d tokens", nt);
    }
}
#endif

void ggml_sparse_zz_gemm_block_rows(enum ggml_type type, const void * wrow, size_t cs, size_t rs, int nb, int64_t n,
                                    const float * x, int64_t ldx, int64_t nt, float * y, int64_t ldy,
                                    float * panel, int64_t panel_floats) {
    const int64_t bk = ggml_blck_size(type);
    const int64_t no = nb*bk; // outputs
    const int64_t jp = panel_floats/no;
    const size_t  bs = ggml_type_size(type);
    GGML_ASSERT(bk % ZZ_GEMM_TI == 0 && bk <= 256 && (nb == 1 || nb == 2) && jp >= 8);

    const ggml_sparse_zz_dequant_t dequant = ggml_sparse_zz_dequant_x86(type);

    if (n == 0) {
        for (int64_t t = 0; t < nt; ++t) {
            memset(y + t*ldy, 0, no*sizeof(float));
        }
        return;
    }

    // panel layout [output slice of ZZ_GEMM_TI][column][ZZ_GEMM_TI]: a tile reads its slice contiguously
    // (row-major blocks 1 KiB apart would fall into a few L1 sets)
    float blk_f32[256]; // largest block (QK_K)
    for (int64_t j0 = 0; j0 < n; j0 += jp) {
        const int64_t nj = n - j0 < jp ? n - j0 : jp;
        for (int64_t j = 0; j < nj; ++j) {
            for (int b = 0; b < nb; ++b) {
                const char * blk = (const char *) wrow + (j0 + j)*cs + b*rs;
                if (j0 + j + ZZ_GEMM_PF < n) {
                    // column-major blocks are nr blocks apart, too far for the hardware prefetcher: fetch ahead
                    const char * pf = blk + ZZ_GEMM_PF*cs;
                    for (size_t l = 0; l < bs; l += 64) {
                        __builtin_prefetch(pf + l);
                    }
                }
                float * pb = panel + b*bk*nj; // block-row b's slices
                if (dequant && ZZ_GEMM_TI == 32) {
                    dequant(blk, pb + j*32, nj*32); // each 32-value group straight into its slice
                    continue;
                }
                if (dequant) {
                    dequant(blk, blk_f32, 32);
                } else {
                    ggml_sparse_zz_dequant_block(type, blk, blk_f32);
                }
                for (int64_t i0 = 0; i0 < bk; i0 += ZZ_GEMM_TI) {
                    memcpy(pb + (i0/ZZ_GEMM_TI)*nj*ZZ_GEMM_TI + j*ZZ_GEMM_TI, blk_f32 + i0, ZZ_GEMM_TI*sizeof(float));
                }
            }
        }
#if defined(__AVX512F__)
        if (no % 64 == 0) {
            for (int64_t t0 = 0; t0 < nt; t0 += ZZ_GEMM_TTW) {
                const int tn = nt - t0 < ZZ_GEMM_TTW ? (int) (nt - t0) : ZZ_GEMM_TTW;
                for (int64_t i0 = 0; i0 < no; i0 += 64) {
                    zz_gemm_tile_wide(panel + (i0/32)*nj*32, nj*32, nj, x + t0*ldx + j0, ldx, tn,
                                      y + t0*ldy + i0, ldy, j0 == 0);
                }
            }
            continue;
        }
#endif
        for (int64_t t0 = 0; t0 < nt; t0 += ZZ_GEMM_TT) {
            const int tn = nt - t0 < ZZ_GEMM_TT ? (int) (nt - t0) : ZZ_GEMM_TT;
            for (int64_t i0 = 0; i0 < no; i0 += ZZ_GEMM_TI) {
                zz_gemm_tile(panel + (i0/ZZ_GEMM_TI)*nj*ZZ_GEMM_TI, ZZ_GEMM_TI, nj, x + t0*ldx + j0, ldx, tn,
                             y + t0*ldy + i0, ldy, j0 == 0);
            }
        }
    }
}
