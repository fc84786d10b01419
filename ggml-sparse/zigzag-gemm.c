// llama-sparse: prefill GEMM on zigzag weights (T > GGML_SPARSE_MAX_BATCH, dense). Each weight block
// is dequantized once into an fp32 panel and reused by every token, in register tiles of tokens x outputs:
// AVX-512 6 x 64 (32-row blocks two block-rows at once; 12 x 32 for a lone one), AVX2 6 x 16, NEON 4 x 16.
// Q4_K and Q6_K on AVX2 and AVX-512 VNNI instead take 16-bit integer panels (zz_gemm_i16 below).
#define GGML_COMMON_DECL_C
#include "ggml-common.h"

#include "ggml-sparse-cpu.h"
#include "ggml-impl.h"

#include <stdbool.h>
#include <stdlib.h>
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

#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512VL__)
// the packs take vpermb with AVX512-VBMI, byte unpacks without (Cascade Lake): the same panels, vpermb 2-10 % faster at
// 16 tokens (bench/results/cpu_prefill_novbmi_i16_2026-12-06.md)
#define ZZ_GEMM_I16 512
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__) && (defined(__AVXVNNI__) || !defined(__AVX512F__))
// AVX-VNNI's vpdpwssd where there is one, else vpmaddwd + vpaddd (AVX-512 without VNNI keeps its fp32 tiles: at
// 128 tokens they ran 1.35-1.5x the speed of these, bench/results/cpu_prefill_avx2_i16_2026-12-06.md)
#define ZZ_GEMM_I16 256
#else
#define ZZ_GEMM_I16 0
#endif
// 1 where the int16 form has a dot instruction (vpdpwssd), 0 for plain AVX2
#if ZZ_GEMM_I16 == 512 || (ZZ_GEMM_I16 == 256 && defined(__AVXVNNI__))
#define ZZ_I16_VNNI 1
#else
#define ZZ_I16_VNNI 0
#endif

// token slices against the int16 GEMM: with VNNI none (7B-shaped end to end, 8 layers: the GEMM 68.9-89.9 t/s against
// the slices' 65.1-73.1 at 9-12 tokens, bench/results/cpu_prefill_i16_2026-12-06b.md); plain AVX2 up to 11 (slices
// 1.05-1.10x stock at 9 tokens, the GEMM 0.92-0.96x; even at 12, bench/results/cpu_prefill_avx2_i16_2026-12-06.md)
#ifndef ZZ_CM_SLICE_MAX_I16
#define ZZ_CM_SLICE_MAX_I16 (ZZ_I16_VNNI ? 8 : 11)
#endif

#if ZZ_GEMM_I16
// Q4_K on 16-bit integers (AVX512-VNNI; AVX-VNNI or plain AVX2 on 256-bit vectors):
// y_t[i] = sum_j x_tj d_j sc_js q_ij - sum_j x_tj dmin_j m_js, s = i/32. The weights of a column pair become int16 q*sc (<= 15*63 = 945), interleaved per
// output as dwords (q_a sc_a, q_b sc_b); x_tj d_j is rounded to int16 with one float scale per token and ZZ_I16_G
// columns, as large as the int32 sums of those G products allow (G*945*XMAX < 2^31: 8876 for G = 256). vpdpwssd
// (AVX2: vpmaddwd + vpaddd) then takes two columns per lane against the fp32 GEMM's one. The min term stays in fp32.
// Q6_K the same way with q*sc = (q6 - 32)*sc8, |q*sc| <= 4096, s = i/16, no min term, and x groups of
// ZZ_I16_G6 columns (XMAX 4096 for 128: 12 bits; 2048 for 256 would be 11).
#define ZZ_I16_JC 256 // columns per panel pass (the x rows of the AVX-512 tile's asm are 512 bytes apart)
#ifndef ZZ_I16_G
#define ZZ_I16_G ZZ_I16_JC // columns per x scale (divides JC)
#endif
#ifndef ZZ_I16_TS
#define ZZ_I16_TS 256 // tokens per x slab
#endif
#if ZZ_GEMM_I16 == 512
#define ZZ_I16_NT     6 // tokens per register tile: 24 sums, 4 weight vectors, 1 broadcast
#define ZZ_I16_GROUPS 4 // output groups (tiles of 64 outputs)
#else
#define ZZ_I16_NT     2 // 8 sums, 4 weight vectors, 2 broadcasts (16 registers)
#define ZZ_I16_GROUPS 8 // of 32 outputs
#endif
#define ZZ_I16_G6 (ZZ_I16_G < 128 ? ZZ_I16_G : 128) // Q6_K's x groups
#define ZZ_I16_XMAX(g, wmax) ((float) (INT32_MAX/((g)*(wmax)) < 32767 ? INT32_MAX/((g)*(wmax)) : 32767))
static_assert(ZZ_I16_JC % ZZ_I16_G == 0 && ZZ_I16_G % 16 == 0, "x scale groups");

// what a type's panels need from the x side: columns per x scale, the rounding's bound, whether there are mins
typedef struct {
    int64_t g;
    float   xmax;
    bool    mins;
} zz_i16_kind;

// work floats: panel (256 outputs x JC/2 pairs, a dword each), min table (8 x JC), d (JC), x ((TS + NT) x JC int16),
// x scales (TS x JC/G6, the smaller group), min terms (TS x 8)
#define ZZ_I16_WORK_FLOATS (256*(ZZ_I16_JC/2) + 9*ZZ_I16_JC + (ZZ_I16_TS + ZZ_I16_NT)*ZZ_I16_JC/2 + ZZ_I16_TS*(ZZ_I16_JC/ZZ_I16_G6 + 8))

// the 8 scales (bytes of *sc) and 8 mins (*m) of a Q4_K block, as zz_get_scale_min_k4 gives them
static inline void zz_i16_scales(const uint8_t * q, uint64_t * sc, uint64_t * m) {
    uint32_t u[3];
    memcpy(u, q, sizeof(u));
    const uint32_t k6 = 0x3f3f3f3f, k4 = 0x0f0f0f0f, k2 = 0x03030303;
    const uint32_t s03 = u[0] & k6;                                    // q[j] & 63
    const uint32_t s47 = (u[2] & k4) | (((u[0] >> 6) & k2) << 4);      // q[j+4] & 15 | q[j-4] >> 6 << 4
    const uint32_t m03 = u[1] & k6;                                    // q[j+4] & 63
    const uint32_t m47 = ((u[2] >> 4) & k4) | (((u[1] >> 6) & k2) << 4); // q[j+4] >> 4 | q[j] >> 6 << 4
    *sc = s03 | (uint64_t) s47 << 32;
    *m  = m03 | (uint64_t) m47 << 32;
}

// the scalar part of a column pair (b NULL: zeros for it): the scale words scw[s] = sc_a,s | sc_b,s << 16,
// d[2p + c] and the min table dm[s][2p + c] = dmin_c m_c,s
static inline void zz_i16_pair_head(const block_q4_K * a, const block_q4_K * b, int64_t p, float * dm, float * d,
                                    int32_t * scw) {
    uint64_t sa, ma, sb = 0, mb = 0;
    zz_i16_scales(a->scales, &sa, &ma);
    // d and dmin of both blocks (the first 4 bytes of each) in one conversion
    int32_t hb[2] = { 0, 0 };
    memcpy(&hb[0], a, sizeof(int32_t));
    if (b != NULL) {
        zz_i16_scales(b->scales, &sb, &mb);
        memcpy(&hb[1], b, sizeof(int32_t));
    }
    const __m128 h = _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *) hb)); // d_a, dmin_a, d_b, dmin_b
    _mm_storel_pi((__m64 *) (d + 2*p), _mm_shuffle_ps(h, h, _MM_SHUFFLE(2, 0, 2, 0)));
    const __m128i si = _mm_unpacklo_epi8(_mm_cvtsi64_si128((int64_t) sa), _mm_cvtsi64_si128((int64_t) sb));
    _mm256_storeu_si256((__m256i *) scw, _mm256_cvtepu8_epi16(si));
    const __m128i mi   = _mm_unpacklo_epi8(_mm_cvtsi64_si128((int64_t) ma), _mm_cvtsi64_si128((int64_t) mb));
    const __m128  dmn  = _mm_shuffle_ps(h, h, _MM_SHUFFLE(3, 1, 3, 1));
    const __m256  dmn8 = _mm256_insertf128_ps(_mm256_castps128_ps256(dmn), dmn, 1);
    const __m256  lo   = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(mi)), dmn8);                    // s 0-3
    const __m256  hi   = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(mi, 8))), dmn8); // s 4-7
    const __m128  v[4] = { _mm256_castps256_ps128(lo), _mm256_extractf128_ps(lo, 1),
                           _mm256_castps256_ps128(hi), _mm256_extractf128_ps(hi, 1) };
    for (int k = 0; k < 4; ++k) {
        _mm_storel_pi((__m64 *) (dm + (2*k)*ZZ_I16_JC + 2*p),     v[k]);
        _mm_storeh_pi((__m64 *) (dm + (2*k + 1)*ZZ_I16_JC + 2*p), v[k]);
    }
}

// weight blocks [c, c + k) of the row (3 lines cover a 144-byte block) into L1, or L2 with l2 (a constant where
// inlined)
static inline void zz_i16_pf(const char * wrow, size_t cs, int64_t c, int64_t k, const bool l2) {
    for (int64_t e = c; e < c + k; ++e) {
        const char * pb = wrow + e*cs;
        for (int l = 0; l < 3; ++l) {
            if (l2) {
                _mm_prefetch(pb + 64*l, _MM_HINT_T1);
            } else {
                _mm_prefetch(pb + 64*l, _MM_HINT_T0);
            }
        }
    }
}

// a Q6_K column pair's scalar part (b NULL: zeros for it): the scale words scw[v] = sc_a,v | sc_b,v << 16 of each 16
// outputs (the int8 scales sign-extended) and d[2p + c]
static inline void zz_i16_q6_head(const block_q6_K * a, const block_q6_K * b, int64_t p, float * d, int32_t * scw) {
    const __m128i sa = _mm_loadu_si128((const __m128i *) a->scales);
    const __m128i sb = b != NULL ? _mm_loadu_si128((const __m128i *) b->scales) : _mm_setzero_si128();
    _mm256_storeu_si256((__m256i *) scw,       _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(sa, sb)));
    _mm256_storeu_si256((__m256i *) (scw + 8), _mm256_cvtepi8_epi16(_mm_unpackhi_epi8(sa, sb)));
    d[2*p]     = GGML_FP16_TO_FP32(a->d);
    d[2*p + 1] = b != NULL ? GGML_FP16_TO_FP32(b->d) : 0.0f;
}

// blocks [p, p + k*cs) in steps of cs that a tile asks into L2 while it runs (k 0: none)
typedef struct {
    const char * p;
    size_t       cs;
    int64_t      k;
} zz_i16_pfq;
#endif

#if ZZ_GEMM_I16 == 512
#if !defined(__AVX512VBMI__)
// without vpermb: bytes a[0..16), b[0..16) -> w0 words (a0, b0, a1, b1, ..., a15, b15), the same of bytes 16..31 -> w1
static inline void zz_i16_bw_pairs(__m256i a, __m256i b, __m512i * w0, __m512i * w1) {
    const __m256i ul = _mm256_unpacklo_epi8(a, b); // lanes: a0 b0 .. a7 b7 | a16 b16 .. a23 b23
    const __m256i uh = _mm256_unpackhi_epi8(a, b); // a8 b8 .. a15 b15 | a24 b24 .. a31 b31
    *w0 = _mm512_cvtepu8_epi16(_mm256_permute2x128_si256(ul, uh, 0x20));
    *w1 = _mm512_cvtepu8_epi16(_mm256_permute2x128_si256(ul, uh, 0x31));
}
#endif

// column pair p of the pass: blocks a, b (b NULL past the last column) -> the 16 output vectors v of the pair at
// panel[(v/4)*4*np + 4p + v%4] (dword l of vector v: the int16 q sc of output 16v + l in a, then in b), the min table
// dm[s][2p + c] = dmin m_s and d[2p + c]
static inline void zz_i16_pack_pair(const block_q4_K * a, const block_q4_K * b, void * panel_v, int64_t np,
                                    int64_t p, float * dm, float * d) {
    __m512i * panel = (__m512i *) panel_v;
    int32_t scw[8];
    zz_i16_pair_head(a, b, p, dm, d, scw);
#if defined(__AVX512VBMI__)
    // output byte 4l = quant byte 16h + l of column a, 4l + 2 = the same of column b (32 bytes on); odd bytes zero
    static const int8_t idx_src[2][64] = {
#define ZZ_I16_IDX(h, l) (h)*16 + (l), 0, 32 + (h)*16 + (l), 0
#define ZZ_I16_IDX4(h, l) ZZ_I16_IDX(h, l), ZZ_I16_IDX(h, l + 1), ZZ_I16_IDX(h, l + 2), ZZ_I16_IDX(h, l + 3)
        { ZZ_I16_IDX4(0, 0), ZZ_I16_IDX4(0, 4), ZZ_I16_IDX4(0, 8), ZZ_I16_IDX4(0, 12) },
        { ZZ_I16_IDX4(1, 0), ZZ_I16_IDX4(1, 4), ZZ_I16_IDX4(1, 8), ZZ_I16_IDX4(1, 12) },
#undef ZZ_I16_IDX4
#undef ZZ_I16_IDX
    };
    const __m512i idx0 = _mm512_loadu_si512(idx_src[0]);
    const __m512i idx1 = _mm512_loadu_si512(idx_src[1]);
    const __mmask64 even = 0x5555555555555555ull;
    const __m512i   m4   = _mm512_set1_epi8(0x0F);
#else
    const __m256i m4 = _mm256_set1_epi8(0x0F);
#endif
    for (int r = 0; r < 4; ++r) { // 32-byte run r: outputs 64r .. 64r + 63, sub-blocks 2r (low), 2r + 1 (high)
        const __m256i qa = _mm256_loadu_si256((const __m256i *) (a->qs + 32*r));
        const __m256i qb = b != NULL ? _mm256_loadu_si256((const __m256i *) (b->qs + 32*r)) : _mm256_setzero_si256();
        const __m512i sl = _mm512_set1_epi32(scw[2*r]);
        const __m512i sh = _mm512_set1_epi32(scw[2*r + 1]);
        __m512i * pr = panel + r*4*np + 4*p; // vectors 4r .. 4r + 3 of pair p, side by side
#if defined(__AVX512VBMI__)
        const __m512i z  = _mm512_inserti64x4(_mm512_castsi256_si512(qa), qb, 1);
        const __m512i lo = _mm512_and_si512(z, m4);
        const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(z, 4), m4);
        pr[0] = _mm512_mullo_epi16(_mm512_maskz_permutexvar_epi8(even, idx0, lo), sl);
        pr[1] = _mm512_mullo_epi16(_mm512_maskz_permutexvar_epi8(even, idx1, lo), sl);
        pr[2] = _mm512_mullo_epi16(_mm512_maskz_permutexvar_epi8(even, idx0, hi), sh);
        pr[3] = _mm512_mullo_epi16(_mm512_maskz_permutexvar_epi8(even, idx1, hi), sh);
#else
        __m512i w[4];
        zz_i16_bw_pairs(_mm256_and_si256(qa, m4), _mm256_and_si256(qb, m4), &w[0], &w[1]);
        zz_i16_bw_pairs(_mm256_and_si256(_mm256_srli_epi16(qa, 4), m4), _mm256_and_si256(_mm256_srli_epi16(qb, 4), m4),
                        &w[2], &w[3]);
        pr[0] = _mm512_mullo_epi16(w[0], sl);
        pr[1] = _mm512_mullo_epi16(w[1], sl);
        pr[2] = _mm512_mullo_epi16(w[2], sh);
        pr[3] = _mm512_mullo_epi16(w[3], sh);
#endif
    }
}

// Q6_K column pair p (b NULL past the last column): the 16 output vectors of the pair at panel[(v/4)*4*np + 4p + v%4]
// as zz_i16_pack_pair's, dword l of vector v the int16 (q - 32) sc of output 16v + l in a, then in b; d[2p + c]
static inline void zz_i16_pack_pair_q6(const block_q6_K * a, const block_q6_K * b, void * panel_v, int64_t np,
                                       int64_t p, float * d) {
    __m512i * panel = (__m512i *) panel_v;
    int32_t scw[16];
    zz_i16_q6_head(a, b, p, d, scw);
#if defined(__AVX512VBMI__)
    // word 2l of vector k of a 64-output run: byte 16k + l of a's run, word 2l + 1 the same of b's (index 64 on)
    static const int8_t idx_src[4][64] = {
#define ZZ_I16_IDX(k, l) 16*(k) + (l), 0, 64 + 16*(k) + (l), 0
#define ZZ_I16_IDX4(k, l) ZZ_I16_IDX(k, l), ZZ_I16_IDX(k, l + 1), ZZ_I16_IDX(k, l + 2), ZZ_I16_IDX(k, l + 3)
#define ZZ_I16_IDX16(k) { ZZ_I16_IDX4(k, 0), ZZ_I16_IDX4(k, 4), ZZ_I16_IDX4(k, 8), ZZ_I16_IDX4(k, 12) }
        ZZ_I16_IDX16(0), ZZ_I16_IDX16(1), ZZ_I16_IDX16(2), ZZ_I16_IDX16(3),
#undef ZZ_I16_IDX16
#undef ZZ_I16_IDX4
#undef ZZ_I16_IDX
    };
    const __mmask64 even = 0x5555555555555555ull;
#endif
    const __m512i   m4   = _mm512_set1_epi8(0x0F);
    const __m512i   m2   = _mm512_set1_epi8(0x03);
    const __m512i   o32  = _mm512_set1_epi16(32);
    const block_q6_K * blk[2] = { a, b };
    __m512i q[2][4]; // the 6-bit values (0-63) of outputs 64r .. 64r + 63, run r, per column
    for (int c = 0; c < 2; ++c) {
        for (int h = 0; h < 2; ++h) {
            if (blk[c] == NULL) {
                q[c][2*h] = q[c][2*h + 1] = _mm512_setzero_si512();
                continue;
            }
            // half h: ql[64h + l] low nibbles are outputs 128h + l, high nibbles 128h + 64 + l; qh[32h + l] holds the
            // top bits of outputs 128h + l (bits 0-1), + 32 (2-3), + 64 (4-5), + 96 (6-7)
            const __m512i l  = _mm512_loadu_si512(blk[c]->ql + 64*h);
            const __m256i hb = _mm256_loadu_si256((const __m256i *) (blk[c]->qh + 32*h));
            const __m512i h0 = _mm512_inserti64x4(_mm512_castsi256_si512(hb), _mm256_srli_epi16(hb, 2), 1);
            const __m512i h1 = _mm512_srli_epi16(h0, 4);
            q[c][2*h]     = _mm512_or_si512(_mm512_and_si512(l, m4), _mm512_slli_epi16(_mm512_and_si512(h0, m2), 4));
            q[c][2*h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), m4),
                                            _mm512_slli_epi16(_mm512_and_si512(h1, m2), 4));
        }
    }
    for (int r = 0; r < 4; ++r) {
        __m512i * pr = panel + r*4*np + 4*p; // vectors 4r .. 4r + 3 of pair p, side by side
#if !defined(__AVX512VBMI__)
        __m512i wk[4];
        zz_i16_bw_pairs(_mm512_castsi512_si256(q[0][r]), _mm512_castsi512_si256(q[1][r]), &wk[0], &wk[1]);
        zz_i16_bw_pairs(_mm512_extracti64x4_epi64(q[0][r], 1), _mm512_extracti64x4_epi64(q[1][r], 1), &wk[2], &wk[3]);
#endif
        for (int k = 0; k < 4; ++k) {
#if defined(__AVX512VBMI__)
            const __m512i w = _mm512_maskz_permutex2var_epi8(even, q[0][r], _mm512_loadu_si512(idx_src[k]), q[1][r]);
#else
            const __m512i w = wk[k];
#endif
            pr[k] = _mm512_mullo_epi16(_mm512_sub_epi16(w, o32), _mm512_set1_epi32(scw[4*r + k]));
        }
    }
}

// the AVX-512 tile's asm: sums of token row t in zmm(8 + 4t) .. zmm(11 + 4t), x rows 512 bytes apart
#define ZZ_I16_Z1(a) "vpxord %%zmm" #a ", %%zmm" #a ", %%zmm" #a "\n\t"
#define ZZ_I16_Z4(a, b, c, d) ZZ_I16_Z1(a) ZZ_I16_Z1(b) ZZ_I16_Z1(c) ZZ_I16_Z1(d)
#define ZZ_I16_ROW(off, a, b, c, d) "vpbroadcastd " #off "(%[x]), %%zmm4\n\t" \
    "vpdpwssd %%zmm0, %%zmm4, %%zmm" #a "\n\tvpdpwssd %%zmm1, %%zmm4, %%zmm" #b "\n\t" \
    "vpdpwssd %%zmm2, %%zmm4, %%zmm" #c "\n\tvpdpwssd %%zmm3, %%zmm4, %%zmm" #d "\n\t"
#define ZZ_I16_ST1(off, a) "vmovdqa64 %%zmm" #a ", " #off "(%[o])\n\t"
#define ZZ_I16_ST4(off, a, b, c, d) ZZ_I16_ST1(off+0, a) ZZ_I16_ST1(off+64, b) ZZ_I16_ST1(off+128, c) ZZ_I16_ST1(off+192, d)
// one step a pair; every ev steps, while pk > 0, the 3 lines of the block at pf go to L2 (a burst of them before a
// tile stalled on fill buffers)
#define ZZ_I16_LOOP(rows) "1:\n\t" \
    "vmovdqa64 0(%[w]), %%zmm0\n\tvmovdqa64 64(%[w]), %%zmm1\n\t" \
    "vmovdqa64 128(%[w]), %%zmm2\n\tvmovdqa64 192(%[w]), %%zmm3\n\t" \
    rows "dec %[cd]\n\tjnz 2f\n\tmov %[ev], %[cd]\n\ttest %[pk], %[pk]\n\tjz 2f\n\t" \
    "prefetcht1 (%[pf])\n\tprefetcht1 64(%[pf])\n\tprefetcht1 128(%[pf])\n\tadd %[cs], %[pf]\n\tdec %[pk]\n\t" \
    "2:\n\tadd $256, %[w]\n\tadd $4, %[x]\n\tdec %[n]\n\tjnz 1b\n\t"
#define ZZ_I16_OPS [w] "+&r" (w), [x] "+&r" (x), [n] "+&r" (n), [cd] "+&r" (cd), [pk] "+&r" (pk), [pf] "+&r" (pf) \
    : [o] "r" (sums), [ev] "r" (ev), [cs] "r" (pq.cs)
#define ZZ_I16_R01 ZZ_I16_ROW(0, 8, 9, 10, 11) ZZ_I16_ROW(512, 12, 13, 14, 15)
#define ZZ_I16_R23 ZZ_I16_ROW(1024, 16, 17, 18, 19) ZZ_I16_ROW(1536, 20, 21, 22, 23)
#define ZZ_I16_R45 ZZ_I16_ROW(2048, 24, 25, 26, 27) ZZ_I16_ROW(2560, 28, 29, 30, 31)
#define ZZ_I16_Z01 ZZ_I16_Z4(8, 9, 10, 11) ZZ_I16_Z4(12, 13, 14, 15)
#define ZZ_I16_Z23 ZZ_I16_Z4(16, 17, 18, 19) ZZ_I16_Z4(20, 21, 22, 23)
#define ZZ_I16_Z45 ZZ_I16_Z4(24, 25, 26, 27) ZZ_I16_Z4(28, 29, 30, 31)
#define ZZ_I16_S01 ZZ_I16_ST4(0, 8, 9, 10, 11) ZZ_I16_ST4(256, 12, 13, 14, 15)
#define ZZ_I16_S23 ZZ_I16_ST4(512, 16, 17, 18, 19) ZZ_I16_ST4(768, 20, 21, 22, 23)
#define ZZ_I16_S45 ZZ_I16_ST4(1024, 24, 25, 26, 27) ZZ_I16_ST4(1280, 28, 29, 30, 31)
#define ZZ_I16_CLOBBER "zmm0", "zmm1", "zmm2", "zmm3", "zmm4", "zmm8", "zmm9", "zmm10", "zmm11", "zmm12", "zmm13", \
    "zmm14", "zmm15", "zmm16", "zmm17", "zmm18", "zmm19", "zmm20", "zmm21", "zmm22", "zmm23", "zmm24", "zmm25", \
    "zmm26", "zmm27", "zmm28", "zmm29", "zmm30", "zmm31", "cc", "memory"

// y[t*ldy + 16v + ...] (+)= S[t*sst] * sum over pairs [0, npair) of panel[4p + v] . xq[t*256 + 2p .. +1], for the
// 4 output vectors v of the tile and nt <= 6 tokens, in a tile of 2, 4 or 6 token rows (rows past nt read other rows
// of xq and are not stored); pq's blocks go to L2 meanwhile. mn (or NULL): the min terms to take off, mn[8t] from
// vectors 0-1 (one sub-block), mn[8t + 1] from 2-3. The sums live in zmm8-31 through asm: gcc keeps most of 24
// vpdpwssd sums on the stack, however the C is put
static void zz_i16_tile(const __m512i * panel, int npair, const int16_t * xq, const float * S, int64_t sst,
                        const float * mn, int nt, float * y, int64_t ldy, bool first, zz_i16_pfq pq) {
    static_assert(ZZ_I16_NT == 6 && ZZ_I16_JC == 256, "the asm's tile");
    __m512i      sums[ZZ_I16_NT*4];
    const char * w  = (const char *) panel;
    const char * x  = (const char *) xq;
    int64_t      n  = npair;
    const char * pf = pq.p;
    const int64_t nin = pq.k < npair ? pq.k : npair; // blocks asked inside the loop, the rest in a burst after it
    int64_t      pk = nin;
    int64_t      ev = pk > 0 ? npair/pk : npair;   // steps between blocks
    int64_t      cd = ev;
    GGML_ASSERT(n > 0 && nt > 0 && nt <= 6);
    if (!first) {
        // the tile's y lines (L2 from the last pass) arrive during the loop
        for (int t = 0; t < nt; ++t) {
            for (int v = 0; v < 4; ++v) {
                _mm_prefetch((const char *) (y + t*ldy + 16*v), _MM_HINT_T0);
            }
        }
    }
    if (nt > 4) {
        __asm__ volatile(ZZ_I16_Z01 ZZ_I16_Z23 ZZ_I16_Z45 ZZ_I16_LOOP(ZZ_I16_R01 ZZ_I16_R23 ZZ_I16_R45)
                         ZZ_I16_S01 ZZ_I16_S23 ZZ_I16_S45 : ZZ_I16_OPS : ZZ_I16_CLOBBER);
    } else if (nt > 2) {
        __asm__ volatile(ZZ_I16_Z01 ZZ_I16_Z23 ZZ_I16_LOOP(ZZ_I16_R01 ZZ_I16_R23) ZZ_I16_S01 ZZ_I16_S23
                         : ZZ_I16_OPS : ZZ_I16_CLOBBER);
    } else {
        __asm__ volatile(ZZ_I16_Z01 ZZ_I16_LOOP(ZZ_I16_R01) ZZ_I16_S01 : ZZ_I16_OPS : ZZ_I16_CLOBBER);
    }
    zz_i16_pf(pf, pq.cs, 0, pq.k - nin, true); // (pf is past the loop's blocks)
    for (int t = 0; t < nt; ++t) {
        const __m512 st = _mm512_set1_ps(S[t*sst]);
        for (int v = 0; v < 4; ++v) {
            const __m512 f  = _mm512_cvtepi32_ps(sums[4*t + v]);
            float      * yv = y + t*ldy + 16*v;
            if (mn != NULL) {
                const __m512 m = _mm512_set1_ps(mn[8*t + v/2]);
                _mm512_storeu_ps(yv, _mm512_fmadd_ps(f, st, first ? -m : _mm512_sub_ps(_mm512_loadu_ps(yv), m)));
            } else {
                _mm512_storeu_ps(yv, first ? _mm512_mul_ps(f, st) : _mm512_fmadd_ps(f, st, _mm512_loadu_ps(yv)));
            }
        }
    }
}

// token row xt of the pass (nj columns; nc: nj rounded up to 16): x d rounded to int16 into xq (nc entries), the
// group scales into xs, and (kd->mins) the 8 min sums sum_j x_j dm[s][j] into mn
static inline void zz_i16_quant_x(const float * xt, int64_t nj, int64_t nc, const float * dcol, const float * dm,
                                  int16_t * xq, float * xs, float * mn, const zz_i16_kind * kd) {
    __m512 ms[8];
    for (int s = 0; s < 8; ++s) {
        ms[s] = _mm512_setzero_ps();
    }
    for (int64_t g = 0; g*kd->g < nc; ++g) {
        const int64_t c0 = g*kd->g;
        const int64_t c1 = c0 + kd->g < nc ? c0 + kd->g : nc;
        __m512 amax = _mm512_setzero_ps();
        for (int64_t c = c0; c < c1; c += 16) {
            const __mmask16 k  = nj - c >= 16 ? 0xFFFF : nj > c ? (__mmask16) ((1u << (nj - c)) - 1) : 0;
            const __m512    xv = _mm512_maskz_loadu_ps(k, xt + c);
            amax = _mm512_max_ps(amax, _mm512_abs_ps(_mm512_mul_ps(xv, _mm512_loadu_ps(dcol + c))));
            if (kd->mins) {
                for (int s = 0; s < 8; ++s) {
                    ms[s] = _mm512_fmadd_ps(xv, _mm512_loadu_ps(dm + s*ZZ_I16_JC + c), ms[s]);
                }
            }
        }
        const float am = _mm512_reduce_max_ps(amax);
        xs[g] = am/kd->xmax;
        const __m512 iv = _mm512_set1_ps(am > 0.0f ? kd->xmax/am : 0.0f);
        for (int64_t c = c0; c < c1; c += 16) {
            const __mmask16 k  = nj - c >= 16 ? 0xFFFF : nj > c ? (__mmask16) ((1u << (nj - c)) - 1) : 0;
            const __m512    xv = _mm512_maskz_loadu_ps(k, xt + c);
            const __m512i   qi = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_mul_ps(xv, _mm512_loadu_ps(dcol + c)), iv));
            _mm256_storeu_si256((__m256i *) (xq + c), _mm512_cvtsepi32_epi16(qi));
        }
    }
    for (int s = 0; s < 8; ++s) {
        mn[s] = _mm512_reduce_add_ps(ms[s]);
    }
}

// the tile of output group gr (64 outputs) and tokens [t0, t0 + tt) over pairs [p0, p0 + pn) of x group g
static inline void zz_i16_tile_at(const void * panel, int64_t np, int gr, int64_t p0, int pn, const int16_t * xq,
                                  int64_t ldq, const float * xs, int64_t ngr, int64_t g, int64_t t0, int tt, float * y,
                                  int64_t ldy, bool first, const float * mns, zz_i16_pfq pq) {
    zz_i16_tile((const __m512i *) panel + 4*gr*np + 4*p0, pn, xq + t0*ldq + 2*p0, xs + t0*ngr + g, ngr,
                mns != NULL ? mns + 8*t0 + 2*gr : NULL, tt, y + t0*ldy + 64*gr, ldy, first, pq);
}
#endif

#if ZZ_GEMM_I16 == 256
// 256-bit (AVX-VNNI or AVX2): groups gr = 2r + h of 32 outputs (run r's low (h = 0) or high nibbles), 4 vectors of 8 a
// group per pair at panel[(gr*np + p)*4 + k]; unpacking in 128-bit lanes puts outputs 16L + 4k + e of the group in
// lane L, dword e of vector k (zz_i16_put_group undoes it)
static inline void zz_i16_pack_pair(const block_q4_K * a, const block_q4_K * b, void * panel_v, int64_t np,
                                    int64_t p, float * dm, float * d) {
    __m256i * panel = (__m256i *) panel_v;
    int32_t scw[8];
    zz_i16_pair_head(a, b, p, dm, d, scw);
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i z  = _mm256_setzero_si256();
    for (int r = 0; r < 4; ++r) {
        const __m256i qa = _mm256_loadu_si256((const __m256i *) (a->qs + 32*r));
        const __m256i qb = b != NULL ? _mm256_loadu_si256((const __m256i *) (b->qs + 32*r)) : z;
        for (int h = 0; h < 2; ++h) {
            const __m256i na = _mm256_and_si256(h ? _mm256_srli_epi16(qa, 4) : qa, m4);
            const __m256i nb = _mm256_and_si256(h ? _mm256_srli_epi16(qb, 4) : qb, m4);
            const __m256i al = _mm256_unpacklo_epi8(na, z), ah = _mm256_unpackhi_epi8(na, z);
            const __m256i bl = _mm256_unpacklo_epi8(nb, z), bh = _mm256_unpackhi_epi8(nb, z);
            const __m256i sc = _mm256_set1_epi32(scw[2*r + h]);
            __m256i * pr = panel + ((2*r + h)*np + p)*4;
            pr[0] = _mm256_mullo_epi16(_mm256_unpacklo_epi16(al, bl), sc);
            pr[1] = _mm256_mullo_epi16(_mm256_unpackhi_epi16(al, bl), sc);
            pr[2] = _mm256_mullo_epi16(_mm256_unpacklo_epi16(ah, bh), sc);
            pr[3] = _mm256_mullo_epi16(_mm256_unpackhi_epi16(ah, bh), sc);
        }
    }
}

// Q6_K column pair p in the order of the Q4_K pack above: group gr holds outputs 32gr .. 32gr + 31, so lane 0 of
// each of its vectors holds outputs of scale 2gr and lane 1 of scale 2gr + 1
static inline void zz_i16_pack_pair_q6(const block_q6_K * a, const block_q6_K * b, void * panel_v, int64_t np,
                                       int64_t p, float * d) {
    __m256i * panel = (__m256i *) panel_v;
    int32_t scw[16];
    zz_i16_q6_head(a, b, p, d, scw);
    const __m256i m4  = _mm256_set1_epi8(0x0F);
    const __m256i m2  = _mm256_set1_epi8(0x03);
    const __m256i z   = _mm256_setzero_si256();
    const __m256i o32 = _mm256_set1_epi16(32);
    const block_q6_K * blk[2] = { a, b };
    for (int h = 0; h < 2; ++h) {
        __m256i q[2][4]; // the 6-bit values (0-63) of group 4h + k, per column
        for (int c = 0; c < 2; ++c) {
            if (blk[c] == NULL) {
                q[c][0] = q[c][1] = q[c][2] = q[c][3] = z;
                continue;
            }
            // as the AVX-512 pack: ql[64h + l] and ql[64h + 32 + l] low then high nibbles, qh[32h + l] 2 bits each
            const __m256i l0 = _mm256_loadu_si256((const __m256i *) (blk[c]->ql + 64*h));
            const __m256i l1 = _mm256_loadu_si256((const __m256i *) (blk[c]->ql + 64*h + 32));
            const __m256i hb = _mm256_loadu_si256((const __m256i *) (blk[c]->qh + 32*h));
            for (int k = 0; k < 4; ++k) {
                const __m256i lk = k % 2 ? l1 : l0;
                const __m256i lo = _mm256_and_si256(k < 2 ? lk : _mm256_srli_epi16(lk, 4), m4);
                const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(hb, 2*k), m2);
                q[c][k] = _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
            }
        }
        for (int k = 0; k < 4; ++k) {
            const int     gr = 4*h + k;
            const __m256i al = _mm256_unpacklo_epi8(q[0][k], z), ah = _mm256_unpackhi_epi8(q[0][k], z);
            const __m256i bl = _mm256_unpacklo_epi8(q[1][k], z), bh = _mm256_unpackhi_epi8(q[1][k], z);
            const __m256i sc = _mm256_set_m128i(_mm_set1_epi32(scw[2*gr + 1]), _mm_set1_epi32(scw[2*gr]));
            __m256i * pr = panel + (gr*np + p)*4;
            pr[0] = _mm256_mullo_epi16(_mm256_sub_epi16(_mm256_unpacklo_epi16(al, bl), o32), sc);
            pr[1] = _mm256_mullo_epi16(_mm256_sub_epi16(_mm256_unpackhi_epi16(al, bl), o32), sc);
            pr[2] = _mm256_mullo_epi16(_mm256_sub_epi16(_mm256_unpacklo_epi16(ah, bh), o32), sc);
            pr[3] = _mm256_mullo_epi16(_mm256_sub_epi16(_mm256_unpackhi_epi16(ah, bh), o32), sc);
        }
    }
}

static inline float zz_i16_hmax8(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

static inline float zz_i16_hsum8(__m256 v) {
    __m128 m = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_add_ps(m, _mm_movehl_ps(m, m));
    m = _mm_add_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

// x[c .. c + 8) with zeros past nj
static inline __m256 zz_i16_load8(const float * xt, int64_t c, int64_t nj) {
    static const int32_t lanes[16] = { -1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0 };
    if (nj - c >= 8) {
        return _mm256_loadu_ps(xt + c);
    }
    const int64_t k = nj > c ? nj - c : 0;
    return _mm256_maskload_ps(xt + c, _mm256_loadu_si256((const __m256i *) (lanes + 8 - k)));
}

// as the AVX-512 zz_i16_quant_x
static inline void zz_i16_quant_x(const float * xt, int64_t nj, int64_t nc, const float * dcol, const float * dm,
                                  int16_t * xq, float * xs, float * mn, const zz_i16_kind * kd) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 ms[8];
    for (int s = 0; s < 8; ++s) {
        ms[s] = _mm256_setzero_ps();
    }
    for (int64_t g = 0; g*kd->g < nc; ++g) {
        const int64_t c0 = g*kd->g;
        const int64_t c1 = c0 + kd->g < nc ? c0 + kd->g : nc;
        __m256 amax = _mm256_setzero_ps();
        for (int64_t c = c0; c < c1; c += 8) {
            const __m256 xv = zz_i16_load8(xt, c, nj);
            amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, _mm256_mul_ps(xv, _mm256_loadu_ps(dcol + c))));
            if (kd->mins) {
                for (int s = 0; s < 8; ++s) {
                    ms[s] = _mm256_fmadd_ps(xv, _mm256_loadu_ps(dm + s*ZZ_I16_JC + c), ms[s]);
                }
            }
        }
        const float am = zz_i16_hmax8(amax);
        xs[g] = am/kd->xmax;
        const __m256 iv = _mm256_set1_ps(am > 0.0f ? kd->xmax/am : 0.0f);
        for (int64_t c = c0; c < c1; c += 16) {
            const __m256i q0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_mul_ps(zz_i16_load8(xt, c, nj),     _mm256_loadu_ps(dcol + c)),     iv));
            const __m256i q1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_mul_ps(zz_i16_load8(xt, c + 8, nj), _mm256_loadu_ps(dcol + c + 8)), iv));
            _mm256_storeu_si256((__m256i *) (xq + c), _mm256_permute4x64_epi64(_mm256_packs_epi32(q0, q1), 0xD8));
        }
    }
    for (int s = 0; s < 8; ++s) {
        mn[s] = zz_i16_hsum8(ms[s]);
    }
}

// y[0 .. 32) (+)= s * the group's 4 vectors of sums, in output order
static inline void zz_i16_put_group(float * y, __m256i a0, __m256i a1, __m256i a2, __m256i a3, __m256 s, float m,
                                    bool first) {
    const __m256 f0 = _mm256_mul_ps(_mm256_cvtepi32_ps(a0), s), f1 = _mm256_mul_ps(_mm256_cvtepi32_ps(a1), s);
    const __m256 f2 = _mm256_mul_ps(_mm256_cvtepi32_ps(a2), s), f3 = _mm256_mul_ps(_mm256_cvtepi32_ps(a3), s);
    const __m256 o[4] = {
        _mm256_permute2f128_ps(f0, f1, 0x20), _mm256_permute2f128_ps(f2, f3, 0x20),
        _mm256_permute2f128_ps(f0, f1, 0x31), _mm256_permute2f128_ps(f2, f3, 0x31),
    };
    for (int i = 0; i < 4; ++i) {
        const __m256 b = _mm256_set1_ps(m);
        _mm256_storeu_ps(y + 8*i, _mm256_sub_ps(first ? o[i] : _mm256_add_ps(o[i], _mm256_loadu_ps(y + 8*i)), b));
    }
}

// ymm acc += the dword sums of ymm w's and ymm x's int16 pairs (t: a free register where there is no vpdpwssd)
#if ZZ_I16_VNNI
#define ZZ_I16_MAC(w, x, acc, t) "%{vex%} vpdpwssd %%ymm" #w ", %%ymm" #x ", %%ymm" #acc "\n\t"
#else
// (the same sums: vpmaddwd wraps only for two products of -32768 x -32768, and the panels stay within +-4096)
#define ZZ_I16_MAC(w, x, acc, t) "vpmaddwd %%ymm" #w ", %%ymm" #x ", %%ymm" #t "\n\t" \
                                 "vpaddd %%ymm" #t ", %%ymm" #acc ", %%ymm" #acc "\n\t"
#endif

// one group of 32 outputs, ZZ_I16_NT (2) tokens: xq0, xq1 the tokens' x rows (the same row when nt = 1), m0, m1
// their min terms to take off. In asm as the AVX-512 tile: gcc moved the sums between registers every step and
// spilled one
static void zz_i16_tile(const __m256i * panel, int npair, const int16_t * xq0, const int16_t * xq1,
                        float s0, float s1, float m0, float m1, int nt, float * y, int64_t ldy, bool first) {
    static_assert(ZZ_I16_NT == 2, "the asm's tile");
    __m256i      sums[8];
    const char * w  = (const char *) panel;
    const char * x0 = (const char *) xq0;
    const char * x1 = (const char *) xq1;
    int64_t      n  = npair;
    GGML_ASSERT(n > 0);
    __asm__ volatile(
        "vpxor %%ymm8, %%ymm8, %%ymm8\n\t"
        "vpxor %%ymm9, %%ymm9, %%ymm9\n\t"
        "vpxor %%ymm10, %%ymm10, %%ymm10\n\t"
        "vpxor %%ymm11, %%ymm11, %%ymm11\n\t"
        "vpxor %%ymm12, %%ymm12, %%ymm12\n\t"
        "vpxor %%ymm13, %%ymm13, %%ymm13\n\t"
        "vpxor %%ymm14, %%ymm14, %%ymm14\n\t"
        "vpxor %%ymm15, %%ymm15, %%ymm15\n\t"
        "1:\n\t"
        "vmovdqa 0(%[w]), %%ymm0\n\t"
        "vmovdqa 32(%[w]), %%ymm1\n\t"
        "vmovdqa 64(%[w]), %%ymm2\n\t"
        "vmovdqa 96(%[w]), %%ymm3\n\t"
        "vpbroadcastd (%[x0]), %%ymm4\n\t"
        "vpbroadcastd (%[x1]), %%ymm5\n\t"
        ZZ_I16_MAC(0, 4, 8, 6) ZZ_I16_MAC(1, 4, 9, 7) ZZ_I16_MAC(2, 4, 10, 6) ZZ_I16_MAC(3, 4, 11, 7)
        ZZ_I16_MAC(0, 5, 12, 6) ZZ_I16_MAC(1, 5, 13, 7) ZZ_I16_MAC(2, 5, 14, 6) ZZ_I16_MAC(3, 5, 15, 7)
        "add $128, %[w]\n\t"
        "add $4, %[x0]\n\t"
        "add $4, %[x1]\n\t"
        "dec %[n]\n\t"
        "jnz 1b\n\t"
        "vmovdqu %%ymm8, 0(%[o])\n\t"
        "vmovdqu %%ymm9, 32(%[o])\n\t"
        "vmovdqu %%ymm10, 64(%[o])\n\t"
        "vmovdqu %%ymm11, 96(%[o])\n\t"
        "vmovdqu %%ymm12, 128(%[o])\n\t"
        "vmovdqu %%ymm13, 160(%[o])\n\t"
        "vmovdqu %%ymm14, 192(%[o])\n\t"
        "vmovdqu %%ymm15, 224(%[o])\n\t"
        : [w] "+r" (w), [x0] "+r" (x0), [x1] "+r" (x1), [n] "+r" (n)
        : [o] "r" (sums)
        : "ymm0", "ymm1", "ymm2", "ymm3", "ymm4", "ymm5", "ymm6", "ymm7", "ymm8", "ymm9", "ymm10", "ymm11", "ymm12",
          "ymm13", "ymm14", "ymm15", "cc", "memory");
    zz_i16_put_group(y, sums[0], sums[1], sums[2], sums[3], _mm256_set1_ps(s0), m0, first);
    if (nt > 1) {
        zz_i16_put_group(y + ldy, sums[4], sums[5], sums[6], sums[7], _mm256_set1_ps(s1), m1, first);
    }
}

// the tile of output group gr (32 outputs) and tokens [t0, t0 + tt) over pairs [p0, p0 + pn) of x group g
static inline void zz_i16_tile_at(const void * panel, int64_t np, int gr, int64_t p0, int pn, const int16_t * xq,
                                  int64_t ldq, const float * xs, int64_t ngr, int64_t g, int64_t t0, int tt, float * y,
                                  int64_t ldy, bool first, const float * mns, zz_i16_pfq pq) {
    const int64_t t1 = tt > 1 ? t0 + 1 : t0;
    zz_i16_pf(pq.p, pq.cs, 0, pq.k, true); // (short tiles: small bursts)
    zz_i16_tile((const __m256i *) panel + (gr*np + p0)*4, pn, xq + t0*ldq + 2*p0, xq + t1*ldq + 2*p0,
                xs[t0*ngr + g], xs[t1*ngr + g], mns != NULL ? mns[8*t0 + gr] : 0.0f,
                mns != NULL ? mns[8*t1 + gr] : 0.0f, tt, y + t0*ldy + 32*gr, ldy, first);
}
#endif

#if ZZ_GEMM_I16
// LLAMA_SPARSE_CPU_GEMM=f32 keeps Q4_K prefill on the fp32 GEMM (comparisons)
static bool zz_gemm_i16_on(void) {
    static int on = -1; // benign race: every thread computes the same value
    if (on < 0) {
        const char * e = getenv("LLAMA_SPARSE_CPU_GEMM");
        on = e == NULL || strcmp(e, "f32") != 0;
    }
    return on;
}

// every tile of a slab: the output groups (ZZ_I16_GROUPS of them), tokens ZZ_I16_NT at a time, x groups (gx columns) in order
// (the first pass's first group stores y; every pass's first group takes off its min terms mns[t][s]), the next pass's
// blocks [pf_c0, pf_c0 + pf_n) fetched meanwhile
static void zz_i16_tiles(const void * panel, int64_t np, int64_t npair, const int16_t * xq, int64_t ldq,
                         const float * xs, int64_t ngr, int64_t gx, const float * mns, int64_t tn, float * y,
                         int64_t ldy, bool first_pass, const char * wrow, size_t cs, int64_t pf_c0, int64_t pf_n) {
    const int64_t ntile  = ZZ_I16_GROUPS*((tn + ZZ_I16_NT - 1)/ZZ_I16_NT);
    const int64_t pf_per = (pf_n + ntile - 1)/ntile;
    int64_t       pf_c   = 0;
    for (int gr = 0; gr < ZZ_I16_GROUPS; ++gr) {
        for (int64_t t0 = 0; t0 < tn; t0 += ZZ_I16_NT) {
            const int     tt = tn - t0 < ZZ_I16_NT ? (int) (tn - t0) : ZZ_I16_NT;
            const int64_t k  = pf_n - pf_c < pf_per ? pf_n - pf_c : pf_per;
            for (int64_t g = 0; g*gx < 2*npair; ++g) {
                const int64_t    p0 = g*(gx/2);
                const int        pn = (int) (npair - p0 < gx/2 ? npair - p0 : gx/2);
                const zz_i16_pfq pq = { wrow + (pf_c0 + pf_c)*cs, cs, g == 0 ? k : 0 }; // the first group's tile
                zz_i16_tile_at(panel, np, gr, p0, pn, xq, ldq, xs, ngr, g, t0, tt, y, ldy, first_pass && g == 0,
                               g == 0 ? mns : NULL, pq);
            }
            pf_c += k;
        }
    }
}

static void zz_gemm_i16(enum ggml_type type, const char * wrow, size_t cs, int64_t n, const float * x, int64_t ldx,
                        int64_t nt, float * y, int64_t ldy, float * work) {
    const bool        q6  = type == GGML_TYPE_Q6_K;
    const zz_i16_kind kd  = q6 ? (zz_i16_kind) { ZZ_I16_G6, ZZ_I16_XMAX(ZZ_I16_G6, 4096), false } :
                                 (zz_i16_kind) { ZZ_I16_G, ZZ_I16_XMAX(ZZ_I16_G, 945), true };
    const int64_t     np  = ZZ_I16_JC/2;
    const int64_t     ldq = ZZ_I16_JC;
    const int64_t     ngr = ZZ_I16_JC/kd.g;
    void    * panel = work;                                  // 256 outputs x np pairs, a dword each (ISA's order)
    float   * dm    = work + 256*np;                         // [8][JC]
    float   * dcol  = dm + 8*ZZ_I16_JC;                      // [JC]
    int16_t * xq    = (int16_t *) (dcol + ZZ_I16_JC);        // [TS + NT][JC] (a last tile reads past the slab)
    float   * xs    = (float *) (xq + (ZZ_I16_TS + ZZ_I16_NT)*ZZ_I16_JC); // [TS][JC/G]
    float   * mns   = xs + ZZ_I16_TS*ngr;                    // [TS][8]

    for (int64_t j0 = 0; j0 < n; j0 += ZZ_I16_JC) {
        const int64_t nj    = n - j0 < ZZ_I16_JC ? n - j0 : ZZ_I16_JC;
        const int64_t npair = (nj + 1)/2;
        const int64_t nc    = (2*npair + 15) & ~(int64_t) 15; // columns the x loops touch
        for (int64_t p = 0; p < npair; ++p) {
            const char * a = wrow + (j0 + 2*p)*cs;
            // column-major blocks are nr blocks apart: fetch the pair 16 columns ahead of the hardware prefetcher
            zz_i16_pf(wrow, cs, j0 + 2*p + 16, j0 + 2*p + 16 < n ? 2 : 0, false);
            const char * b = 2*p + 1 < nj ? a + cs : NULL;
            if (q6) {
                zz_i16_pack_pair_q6((const block_q6_K *) a, (const block_q6_K *) b, panel, np, p, dcol);
                continue;
            }
            zz_i16_pack_pair((const block_q4_K *) a, (const block_q4_K *) b, panel, np, p, dm, dcol);
        }
        for (int64_t c = 2*npair; c < nc; ++c) {
            dcol[c] = 0.0f;
            for (int s = 0; s < 8; ++s) {
                dm[s*ZZ_I16_JC + c] = 0.0f;
            }
        }

        for (int64_t ts = 0; ts < nt; ts += ZZ_I16_TS) {
            const int64_t tn = nt - ts < ZZ_I16_TS ? nt - ts : ZZ_I16_TS;
            // x d to int16 with one scale per token and group, and the pass's min terms
            for (int64_t t = 0; t < tn; ++t) {
                const float * xt = x + (ts + t)*ldx + j0;
                if (t + 2 < tn) {
                    // the pass's x of a token two ahead (x rows are ldx apart: no stream for the prefetcher)
                    const char * pf = (const char *) (xt + 2*ldx);
                    for (int64_t c = 0; c < 4*nj; c += 64) {
                        __builtin_prefetch(pf + c);
                    }
                }
                zz_i16_quant_x(xt, nj, nc, dcol, dm, xq + t*ldq, xs + t*ngr, mns + 8*t, &kd);
            }
            // the products; the next pass's blocks go to L2 meanwhile (during the last slab)
            const int64_t pf_n = ts + ZZ_I16_TS >= nt && j0 + ZZ_I16_JC < n ?
                (n - j0 - ZZ_I16_JC < ZZ_I16_JC ? n - j0 - ZZ_I16_JC : ZZ_I16_JC) : 0;
            // (the min terms come off in each sub-block's tiles of the first x group)
            zz_i16_tiles(panel, np, npair, xq, ldq, xs, ngr, kd.g, kd.mins ? mns : NULL, tn, y + ts*ldy, ldy, j0 == 0,
                         wrow, cs, j0 + ZZ_I16_JC, pf_n);
        }
    }
}
#endif

void ggml_sparse_zz_gemm_block_rows(enum ggml_type type, const void * wrow, size_t cs, size_t rs, int nb, int64_t n,
                                    const float * x, int64_t ldx, int64_t nt, float * y, int64_t ldy,
                                    float * panel, int64_t panel_floats, bool int16) {
    const int64_t bk = ggml_blck_size(type);
    const int64_t no = nb*bk; // outputs
    const int64_t jp = panel_floats/no;
    const size_t  bs = ggml_type_size(type);
    GGML_ASSERT(bk % ZZ_GEMM_TI == 0 && bk <= 256 && (nb == 1 || nb == 2) && jp >= 8);

#if ZZ_GEMM_I16
    const int64_t need16 = int16 && nb == 1 && n > 0 ? ggml_sparse_zz_gemm_int16_floats(type) : 0;
    if (need16 > 0 && panel_floats >= need16) {
        zz_gemm_i16(type, (const char *) wrow, cs, n, x, ldx, nt, y, ldy, panel);
        return;
    }
#else
    GGML_UNUSED(int16);
#endif

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

int ggml_sparse_zz_gemm_int16_slice_max(void) {
    return ZZ_CM_SLICE_MAX_I16;
}

int64_t ggml_sparse_zz_gemm_int16_floats(enum ggml_type type) {
#if ZZ_GEMM_I16
    return (type == GGML_TYPE_Q4_K || type == GGML_TYPE_Q6_K) && zz_gemm_i16_on() ? ZZ_I16_WORK_FLOATS : 0;
#else
    GGML_UNUSED(type);
    return 0;
#endif
}
