// llama-sparse: ARM NEON GEMV kernels on one zigzag block-row (decode, T <= GGML_SPARSE_MAX_BATCH).
//
// Q4_K, Q4_0, Q8_0: as on x86, each chunk of GGML_SPARSE_ZZ_CHUNK columns quantizes its per-(column, sub-block)
// coefficients x_j*d_j*sc_j to integers with one float scale per token and sub-block, so the products are
// widening integer multiply-adds of the block's quants against a broadcast coefficient (SMLAL), no dot-product
// extension needed:
//   Q4_K:       quants less 8 (s8) x s8 coefficients, int16 sums (16 columns x 127 x 8 < 2^15); the min term and
//               the offset of 8 in fp32
//   Q4_0, Q8_0: quants widened to s16 x s16 coefficients, int32 sums
//   Q6_K:       quants (0..63) widened to s16 x s16 coefficients (16 a column), int32 sums, the offset of 32 per flush
// and each chunk is flushed as y += S * float(sum). With LLAMA_SPARSE_CPU_ARM_INT=0, every type runs in fp32: each
// active column's block dequantized and added with vector FMAs (an axpy per column).
#define GGML_COMMON_DECL_C
#include "ggml-common.h"

#include "ggml-sparse-cpu.h"
#include "ggml-sparse.h"
#include "ggml-impl.h"

#include <stdlib.h>
#include <string.h>

#if defined(__ARM_NEON) && defined(__aarch64__)
#include <arm_neon.h>

#define ZZ_MAX_T GGML_SPARSE_MAX_BATCH

static inline void zz_u8x16_to_f32(uint8x16_t v, float * out) {
    const uint16x8_t lo = vmovl_u8(vget_low_u8(v));
    const uint16x8_t hi = vmovl_u8(vget_high_u8(v));
    vst1q_f32(out +  0, vcvtq_f32_u32(vmovl_u16(vget_low_u16(lo))));
    vst1q_f32(out +  4, vcvtq_f32_u32(vmovl_u16(vget_high_u16(lo))));
    vst1q_f32(out +  8, vcvtq_f32_u32(vmovl_u16(vget_low_u16(hi))));
    vst1q_f32(out + 12, vcvtq_f32_u32(vmovl_u16(vget_high_u16(hi))));
}

static inline void zz_s8x16_to_f32(int8x16_t v, float * out) {
    const int16x8_t lo = vmovl_s8(vget_low_s8(v));
    const int16x8_t hi = vmovl_s8(vget_high_s8(v));
    vst1q_f32(out +  0, vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo))));
    vst1q_f32(out +  4, vcvtq_f32_s32(vmovl_s16(vget_high_s16(lo))));
    vst1q_f32(out +  8, vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi))));
    vst1q_f32(out + 12, vcvtq_f32_s32(vmovl_s16(vget_high_s16(hi))));
}

// out[i] = d*q[i] - m for n floats (n % 4 == 0)
static inline void zz_scale_f32(float * out, int n, float d, float m) {
    const float32x4_t vm = vdupq_n_f32(m);
    for (int i = 0; i < n; i += 4) {
        vst1q_f32(out + i, vsubq_f32(vmulq_n_f32(vld1q_f32(out + i), d), vm));
    }
}

static inline void zz_dequant_neon(enum ggml_type type, const void * blk, float * w) {
    switch (type) {
        case GGML_TYPE_Q4_0: {
            const block_q4_0 * b = blk;
            const uint8x16_t v = vld1q_u8(b->qs);
            const int8x16_t  m8 = vdupq_n_s8(8);
            zz_s8x16_to_f32(vsubq_s8(vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(0x0F))), m8), w);
            zz_s8x16_to_f32(vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(v, 4)), m8), w + 16);
            zz_scale_f32(w, 32, GGML_FP16_TO_FP32(b->d), 0.0f);
        } break;
        case GGML_TYPE_Q8_0: {
            const block_q8_0 * b = blk;
            zz_s8x16_to_f32(vld1q_s8(b->qs +  0), w);
            zz_s8x16_to_f32(vld1q_s8(b->qs + 16), w + 16);
            zz_scale_f32(w, 32, GGML_FP16_TO_FP32(b->d), 0.0f);
        } break;
        case GGML_TYPE_Q4_K: {
            const block_q4_K * b = blk;
            const float d   = GGML_FP16_TO_FP32(b->d);
            const float min = GGML_FP16_TO_FP32(b->dmin);
            for (int j = 0; j < QK_K/64; ++j) {
                uint8_t sc1, m1, sc2, m2;
                zz_get_scale_min_k4(2*j + 0, b->scales, &sc1, &m1);
                zz_get_scale_min_k4(2*j + 1, b->scales, &sc2, &m2);
                for (int h = 0; h < 2; ++h) {
                    const uint8x16_t q = vld1q_u8(b->qs + 32*j + 16*h);
                    zz_u8x16_to_f32(vandq_u8(q, vdupq_n_u8(0x0F)), w + 64*j + 16*h);
                    zz_u8x16_to_f32(vshrq_n_u8(q, 4),              w + 64*j + 32 + 16*h);
                }
                zz_scale_f32(w + 64*j,      32, d*sc1, min*m1);
                zz_scale_f32(w + 64*j + 32, 32, d*sc2, min*m2);
            }
        } break;
        default:
            ggml_sparse_zz_dequant_block(type, blk, w);
            break;
    }
}

static inline void zz_gemv_neon(enum ggml_type type, const void * wrow, const int32_t * cols, int64_t k0, int64_t k1,
                                const float * x, int64_t ldx, int nt, float * y, int64_t ldy) {
    const int    bk = type == GGML_TYPE_Q4_K || type == GGML_TYPE_Q6_K ? QK_K : 32;
    const size_t bs = ggml_type_size(type);

    float acc[ZZ_MAX_T][QK_K];
    float w[QK_K];
    for (int t = 0; t < nt; ++t) {
        for (int i = 0; i < bk; i += 4) {
            vst1q_f32(acc[t] + i, vdupq_n_f32(0.0f));
        }
    }

    for (int64_t k = k0; k < k1; ++k) {
        const int64_t j = cols ? cols[k] : k;
        zz_dequant_neon(type, (const char *) wrow + j*bs, w);
        for (int t = 0; t < nt; ++t) {
            const float xv = x[t*ldx + j];
            for (int i = 0; i < bk; i += 8) {
                vst1q_f32(acc[t] + i + 0, vfmaq_n_f32(vld1q_f32(acc[t] + i + 0), vld1q_f32(w + i + 0), xv));
                vst1q_f32(acc[t] + i + 4, vfmaq_n_f32(vld1q_f32(acc[t] + i + 4), vld1q_f32(w + i + 4), xv));
            }
        }
    }

    for (int t = 0; t < nt; ++t) {
        for (int i = 0; i < bk; i += 4) {
            vst1q_f32(y + t*ldy + i, vld1q_f32(acc[t] + i));
        }
    }
}

#define ZZ_NEON_KERNEL(name, type)                                                                 \
static void name(const void * wrow, const int32_t * cols, int64_t k0, int64_t k1,                  \
                 const float * x, int64_t ldx, int nt, float * y, int64_t ldy) {                   \
    zz_gemv_neon(type, wrow, cols, k0, k1, x, ldx, nt, y, ldy);                                     \
}

ZZ_NEON_KERNEL(zz_gemv_q4_0_neon, GGML_TYPE_Q4_0)
ZZ_NEON_KERNEL(zz_gemv_q8_0_neon, GGML_TYPE_Q8_0)
ZZ_NEON_KERNEL(zz_gemv_q4_K_neon, GGML_TYPE_Q4_K)
ZZ_NEON_KERNEL(zz_gemv_q6_K_neon, GGML_TYPE_Q6_K)

//
// integer kernels (Q4_K, Q4_0, Q8_0)
//

#define ZZ_CHUNK GGML_SPARSE_ZZ_CHUNK
#define ZZ_INLINE static inline __attribute__((always_inline))
#define ZZ_STR(x) #x
#define ZZ_UNROLL(n) _Pragma(ZZ_STR(GCC unroll n))

// name() calls name_impl() with the token count a constant where it is one: one token's per-column loop without
// token loops
#define ZZ_ONE_TOKEN_CONST(name)                                                                          \
static void name(const void * wrow, const int32_t * cols, int64_t k0, int64_t k1,                        \
                 const float * x, int64_t ldx, int nt, float * y, int64_t ldy) {                         \
    if (nt == 1) {                                                                                        \
        name##_impl(wrow, cols, k0, k1, x, ldx, 1, y, ldy);                                               \
    } else {                                                                                              \
        name##_impl(wrow, cols, k0, k1, x, ldx, nt, y, ldy);                                              \
    }                                                                                                     \
}

static_assert(ZZ_CHUNK <= 16, "int16 sums of 4-bit quants with s8 coefficients are exact for at most 16 columns");

// fp16 -> fp32 in one instruction (ggml's portable macro takes ~15)
ZZ_INLINE float zz_fp16(const ggml_half * p) {
    __fp16 h;
    memcpy(&h, p, sizeof(h));
    return (float) h;
}

// 8 u8 -> two float32x4
ZZ_INLINE void zz_u8x8_to_f32(uint8x8_t v, float32x4_t * lo, float32x4_t * hi) {
    const uint16x8_t w = vmovl_u8(v);
    *lo = vcvtq_f32_u32(vmovl_u16(vget_low_u16(w)));
    *hi = vcvtq_f32_u32(vmovl_high_u16(w));
}

// y[0..3] += s*float(lo4(a)), y[4..7] += s*float(hi4(a)) for int16 sums a
ZZ_INLINE void zz_flush_s16(float * y, int16x8_t a, float s) {
    vst1q_f32(y + 0, vfmaq_n_f32(vld1q_f32(y + 0), vcvtq_f32_s32(vmovl_s16(vget_low_s16(a))), s));
    vst1q_f32(y + 4, vfmaq_n_f32(vld1q_f32(y + 4), vcvtq_f32_s32(vmovl_high_s16(a)), s));
}

ZZ_INLINE void zz_flush_s32(float * y, int32x4_t a, float s) {
    vst1q_f32(y, vfmaq_n_f32(vld1q_f32(y), vcvtq_f32_s32(a), s));
}

// q[i] = round(v[i]*inv) for n <= 16 floats (|v*inv| <= lim), narrowed to int16
ZZ_INLINE void zz_round_s16(const float * v, int n, float inv, int16_t * q) {
    for (int i = 0; i < n; i += 4) {
        const int32x4_t r = vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(v + i), inv));
        vst1_s16(q + i, vmovn_s32(r));
    }
}

// largest |v[i]| over n floats (n % 4 == 0)
ZZ_INLINE float zz_amax(const float * v, int n) {
    float32x4_t m = vdupq_n_f32(0.0f);
    for (int i = 0; i < n; i += 4) {
        m = vmaxq_f32(m, vabsq_f32(vld1q_f32(v + i)));
    }
    return vmaxvq_f32(m);
}

// the 6-bit scales (bytes 0..7) and mins (bytes 8..15) of a Q4_K block: get_scale_min_k4 as table lookups. tab:
// the lookups of zz_q4_K_sm_tables, loaded once by the caller
struct zz_q4_K_sm { uint8x16_t lo_idx, hi_idx, lo_mask; };

ZZ_INLINE struct zz_q4_K_sm zz_q4_K_sm_tables(void) {
    // sc[0..3] = s[0..3], sc[4..7] = s[8..11] low nibbles, m[0..3] = s[4..7], m[4..7] = s[8..11] high nibbles
    static const uint8_t lo_idx[16]  = { 0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 24, 25, 26, 27 };
    // bits 4, 5 of sc[4..7] and m[4..7]: bits 6, 7 of s[0..3] and s[4..7] (out-of-range indices give 0)
    static const uint8_t hi_idx[16]  = { 255, 255, 255, 255, 0, 1, 2, 3, 255, 255, 255, 255, 4, 5, 6, 7 };
    static const uint8_t lo_mask[16] = { 63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 15, 15, 15, 15 };
    const struct zz_q4_K_sm tab = { vld1q_u8(lo_idx), vld1q_u8(hi_idx), vld1q_u8(lo_mask) };
    return tab;
}

ZZ_INLINE uint8x16_t zz_q4_K_scales_mins(const block_q4_K * b, const struct zz_q4_K_sm * tab) {
    const uint8x16_t   v  = vld1q_u8(b->scales); // the 12 scale bytes and 4 of qs
    const uint8x16x2_t vv = { { v, vshrq_n_u8(v, 4) } };
    const uint8x16_t lo = vandq_u8(vqtbl2q_u8(vv, tab->lo_idx), tab->lo_mask);
    const uint8x16_t hi = vshlq_n_u8(vshrq_n_u8(vqtbl1q_u8(v, tab->hi_idx), 6), 4);
    return vorrq_u8(lo, hi);
}

// G (constant) tokens, 64-row run sp of a chunk's nc blocks: int16 sums of the nibbles less 8 times the s8 coefficients
// cq[g][c][2sp] (low nibbles) and [2sp + 1] (high), flushed into acc[g] + 64sp with the scales sf[g][2sp], [2sp + 1].
// Less 8, the rounding errors of the coefficients meet quants of mean ~0, not ~7.5 (half the error); c8[g][s]: 8 times
// the chunk's sum of cq[g][.][s], taken off the sums once instead of 8 off every quant
ZZ_INLINE void zz_q4_K_run(const block_q4_K * const * blk, int nc, int sp, const int G,
                           const int8_t (* cq)[ZZ_CHUNK][8], const int16_t (* c8)[8], const float (* sf)[8],
                           float (* acc)[QK_K]) {
    const uint8x16_t m4 = vdupq_n_u8(0x0F);
    int16x8_t a[2][8];
    for (int g = 0; g < G; ++g) {
        for (int i = 0; i < 8; ++i) {
            a[g][i] = vdupq_n_s16(0);
        }
    }
    ZZ_UNROLL(2)
    for (int c = 0; c < nc; ++c) {
        const uint8x16_t v0 = vld1q_u8(blk[c]->qs + 32*sp);
        const uint8x16_t v1 = vld1q_u8(blk[c]->qs + 32*sp + 16);
        const int8x16_t  l0 = vreinterpretq_s8_u8(vandq_u8(v0, m4));
        const int8x16_t  l1 = vreinterpretq_s8_u8(vandq_u8(v1, m4));
        const int8x16_t  h0 = vreinterpretq_s8_u8(vshrq_n_u8(v0, 4));
        const int8x16_t  h1 = vreinterpretq_s8_u8(vshrq_n_u8(v1, 4));
        for (int g = 0; g < G; ++g) {
            const int8x16_t cl = vld1q_dup_s8(&cq[g][c][2*sp + 0]); // LD1R: load and broadcast in one
            const int8x16_t ch = vld1q_dup_s8(&cq[g][c][2*sp + 1]);
            a[g][0] = vmlal_s8(a[g][0], vget_low_s8(l0), vget_low_s8(cl));
            a[g][1] = vmlal_high_s8(a[g][1], l0, cl);
            a[g][2] = vmlal_s8(a[g][2], vget_low_s8(l1), vget_low_s8(cl));
            a[g][3] = vmlal_high_s8(a[g][3], l1, cl);
            a[g][4] = vmlal_s8(a[g][4], vget_low_s8(h0), vget_low_s8(ch));
            a[g][5] = vmlal_high_s8(a[g][5], h0, ch);
            a[g][6] = vmlal_s8(a[g][6], vget_low_s8(h1), vget_low_s8(ch));
            a[g][7] = vmlal_high_s8(a[g][7], h1, ch);
        }
    }
    // the quants less 8: sum c*(q - 8) = sum c*q - 8*sum c, exact in int16 (|sum c*q| <= 16*127*15)
    for (int g = 0; g < G; ++g) {
        float * yo = acc[g] + 64*sp;
        for (int i = 0; i < 8; ++i) {
            zz_flush_s16(yo + 8*i, vsubq_s16(a[g][i], vdupq_n_s16(c8[g][2*sp + i/4])), sf[g][2*sp + i/4]);
        }
    }
}

ZZ_INLINE void zz_gemv_q4_K_int_impl(const void * wrow, const int32_t * cols, int64_t k0, int64_t k1,
                                     const float * x, int64_t ldx, const int nt, float * y, int64_t ldy) {
    const block_q4_K * w = wrow;

    float       acc[ZZ_MAX_T][QK_K];
    float32x4_t vmin[ZZ_MAX_T][2];        // sum_j x_j*(dmin_j*m_j[s] - 8*d_j*sc_j[s]), subtracted at the end
    float       cf[ZZ_MAX_T][ZZ_CHUNK][8]; // a chunk's coefficients x_j*d_j*sc_j[s]
    int8_t      cq[ZZ_MAX_T][ZZ_CHUNK][8]; // ... as s8
    int16_t     c8[ZZ_MAX_T][8];           // ... 8 times their sums over the chunk
    float       sf[ZZ_MAX_T][8];           // ... and their scales per sub-block
    const block_q4_K * blk[ZZ_CHUNK];
    const struct zz_q4_K_sm tab = zz_q4_K_sm_tables();

    for (int t = 0; t < nt; ++t) {
        memset(acc[t], 0, sizeof(acc[t]));
        vmin[t][0] = vmin[t][1] = vdupq_n_f32(0.0f);
    }

    for (int64_t kc = k0; kc < k1; kc += ZZ_CHUNK) {
        const int nc = k1 - kc < ZZ_CHUNK ? (int) (k1 - kc) : ZZ_CHUNK;

        float32x4_t amax[ZZ_MAX_T][2];
        for (int t = 0; t < nt; ++t) {
            amax[t][0] = amax[t][1] = vdupq_n_f32(0.0f);
        }
        for (int c = 0; c < nc; ++c) {
            const int64_t j = cols ? cols[kc + c] : kc + c;
            const block_q4_K * b = w + j;
            blk[c] = b;
            const uint8x16_t sm = zz_q4_K_scales_mins(b, &tab);
            float32x4_t sc0, sc1, m0, m1;
            zz_u8x8_to_f32(vget_low_u8(sm),  &sc0, &sc1);
            zz_u8x8_to_f32(vget_high_u8(sm), &m0,  &m1);
            const float d    = zz_fp16(&b->d);
            const float dmin = zz_fp16(&b->dmin);
            for (int t = 0; t < nt; ++t) {
                const float xv = x[t*ldx + j];
                const float32x4_t c0 = vmulq_n_f32(sc0, xv*d);
                const float32x4_t c1 = vmulq_n_f32(sc1, xv*d);
                vst1q_f32(cf[t][c] + 0, c0);
                vst1q_f32(cf[t][c] + 4, c1);
                amax[t][0] = vmaxq_f32(amax[t][0], vabsq_f32(c0));
                amax[t][1] = vmaxq_f32(amax[t][1], vabsq_f32(c1));
                // the offset: x*(dmin*m - 8*d*sc), subtracted at the end
                vmin[t][0] = vaddq_f32(vmin[t][0], vfmaq_n_f32(vmulq_n_f32(c0, -8.0f), m0, xv*dmin));
                vmin[t][1] = vaddq_f32(vmin[t][1], vfmaq_n_f32(vmulq_n_f32(c1, -8.0f), m1, xv*dmin));
            }
        }
        // s8 coefficients per sub-block: c = round(cf*127/amax_s), flushed with amax_s/127
        for (int t = 0; t < nt; ++t) {
            float32x4_t inv[2];
            for (int h = 0; h < 2; ++h) {
                const uint32x4_t on = vcgtq_f32(amax[t][h], vdupq_n_f32(0.0f));
                inv[h] = vreinterpretq_f32_u32(vandq_u32(on, vreinterpretq_u32_f32(vdivq_f32(vdupq_n_f32(127.0f), amax[t][h]))));
                vst1q_f32(sf[t] + 4*h, vmulq_n_f32(amax[t][h], 1.0f/127.0f));
            }
            int16x8_t csum = vdupq_n_s16(0);
            for (int c = 0; c < nc; ++c) {
                const int32x4_t q0 = vcvtnq_s32_f32(vmulq_f32(vld1q_f32(cf[t][c] + 0), inv[0]));
                const int32x4_t q1 = vcvtnq_s32_f32(vmulq_f32(vld1q_f32(cf[t][c] + 4), inv[1]));
                const int8x8_t  q  = vmovn_s16(vcombine_s16(vmovn_s32(q0), vmovn_s32(q1)));
                vst1_s8(cq[t][c], q);
                csum = vaddw_s8(csum, q);
            }
            vst1q_s16(c8[t], vshlq_n_s16(csum, 3));
        }
        for (int sp = 0; sp < QK_K/64; ++sp) {
            int t = 0;
            for (; t + 2 <= nt; t += 2) {
                zz_q4_K_run(blk, nc, sp, 2, cq + t, c8 + t, sf + t, acc + t);
            }
            if (t < nt) {
                zz_q4_K_run(blk, nc, sp, 1, cq + t, c8 + t, sf + t, acc + t);
            }
        }
    }

    for (int t = 0; t < nt; ++t) {
        float mins[8];
        vst1q_f32(mins + 0, vmin[t][0]);
        vst1q_f32(mins + 4, vmin[t][1]);
        for (int i = 0; i < QK_K; i += 4) {
            vst1q_f32(y + t*ldy + i, vsubq_f32(vld1q_f32(acc[t] + i), vdupq_n_f32(mins[i/32])));
        }
    }
}

ZZ_ONE_TOKEN_CONST(zz_gemv_q4_K_int)

// Q4_0 / Q8_0: one coefficient x_j*d_j per block; a chunk's 16 coefficients of one token (zeros past the chunk's
// columns) rounded to s16 with one scale, which it returns
ZZ_INLINE float zz_b32_coefs(const float * cf, int16_t * cq) {
    const float amax = zz_amax(cf, ZZ_CHUNK);
    zz_round_s16(cf, ZZ_CHUNK, amax > 0.0f ? 32767.0f/amax : 0.0f, cq);
    return amax/32767.0f;
}

// a block's 32 quants as s16, rows 8i .. 8i + 7 in w[i]
ZZ_INLINE void zz_q8_0_widen(const block_q8_0 * b, int16x8_t * w) {
    const int8x16_t q0 = vld1q_s8(b->qs);
    const int8x16_t q1 = vld1q_s8(b->qs + 16);
    w[0] = vmovl_s8(vget_low_s8(q0));
    w[1] = vmovl_high_s8(q0);
    w[2] = vmovl_s8(vget_low_s8(q1));
    w[3] = vmovl_high_s8(q1);
}

ZZ_INLINE void zz_q4_0_widen(const block_q4_0 * b, int16x8_t * w) {
    const uint8x16_t v = vld1q_u8(b->qs);
    const int8x16_t  l = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(0x0F))), vdupq_n_s8(8)); // rows 0..15
    const int8x16_t  h = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(v, 4)), vdupq_n_s8(8));              // rows 16..31
    w[0] = vmovl_s8(vget_low_s8(l));
    w[1] = vmovl_high_s8(l);
    w[2] = vmovl_s8(vget_low_s8(h));
    w[3] = vmovl_high_s8(h);
}

// column c0 + c of a step of eight (ZZ_B32_RUN's locals): the lane must be a literal for clang, unrolled or not
#define ZZ_B32_COL(widen, c)                                                                              \
    do {                                                                                                  \
        int16x8_t wq_[4];                                                                                 \
        widen(blk[c0 + (c)], wq_);                                                                        \
        for (int g = 0; g < G; ++g) {                                                                     \
            for (int i = 0; i < 4; ++i) {                                                                 \
                a[g][2*i + 0] = vmlal_laneq_s16(a[g][2*i + 0], vget_low_s16(wq_[i]), cv[g], (c));         \
                a[g][2*i + 1] = vmlal_high_laneq_s16(a[g][2*i + 1], wq_[i], cv[g], (c));                  \
            }                                                                                             \
        }                                                                                                 \
    } while (0)

// G (constant) tokens, a chunk of nc 32-row blocks: int32 sums of the quants (widened to s16) times the s16
// coefficients cq[g][c], flushed into acc[g] with sf[g]
#define ZZ_B32_RUN(name, btype, widen)                                                                    \
ZZ_INLINE void name(const btype * const * blk, int nc, const int G, const int16_t (* cq)[ZZ_CHUNK],      \
                    const float * sf, float (* acc)[32]) {                                                \
    int32x4_t a[2][8];                                                                                    \
    for (int g = 0; g < G; ++g) {                                                                         \
        for (int i = 0; i < 8; ++i) {                                                                     \
            a[g][i] = vdupq_n_s32(0);                                                                     \
        }                                                                                                 \
    }                                                                                                     \
    /* eight columns a step, their coefficients one vector, by lane; past nc, blocks repeat with c = 0 */ \
    for (int c0 = 0; c0 < nc; c0 += 8) {                                                                  \
        int16x8_t cv[2];                                                                                  \
        for (int g = 0; g < G; ++g) {                                                                     \
            cv[g] = vld1q_s16(cq[g] + c0);                                                                \
        }                                                                                                 \
        ZZ_B32_COL(widen, 0); ZZ_B32_COL(widen, 1); ZZ_B32_COL(widen, 2); ZZ_B32_COL(widen, 3);          \
        ZZ_B32_COL(widen, 4); ZZ_B32_COL(widen, 5); ZZ_B32_COL(widen, 6); ZZ_B32_COL(widen, 7);          \
    }                                                                                                     \
    for (int g = 0; g < G; ++g) {                                                                         \
        for (int i = 0; i < 8; ++i) {                                                                     \
            zz_flush_s32(acc[g] + 4*i, a[g][i], sf[g]);                                                   \
        }                                                                                                 \
    }                                                                                                     \
}

ZZ_B32_RUN(zz_q4_0_run, block_q4_0, zz_q4_0_widen)
ZZ_B32_RUN(zz_q8_0_run, block_q8_0, zz_q8_0_widen)

// Q4_0 and Q8_0: per chunk the coefficients of every token (ctype, rounded by coefs), then the products in pairs of
// tokens
#define ZZ_B32_KERNEL(name, btype, run, ctype, coefs)                                                     \
ZZ_INLINE void name##_impl(const void * wrow, const int32_t * cols, int64_t k0, int64_t k1,               \
                           const float * x, int64_t ldx, const int nt, float * y, int64_t ldy) {         \
    const btype * w = wrow;                                                                               \
    float   acc[ZZ_MAX_T][32];                                                                            \
    float   cf[ZZ_MAX_T][ZZ_CHUNK];                                                                       \
    ctype   cq[ZZ_MAX_T][ZZ_CHUNK];                                                                       \
    float   sf[ZZ_MAX_T];                                                                                 \
    const btype * blk[ZZ_CHUNK];                                                                          \
    memset(acc, 0, sizeof(acc[0])*nt);                                                                    \
    for (int64_t kc = k0; kc < k1; kc += ZZ_CHUNK) {                                                     \
        const int nc = k1 - kc < ZZ_CHUNK ? (int) (k1 - kc) : ZZ_CHUNK;                                  \
        for (int c = 0; c < nc; ++c) {                                                                    \
            const int64_t j = cols ? cols[kc + c] : kc + c;                                              \
            blk[c] = w + j;                                                                               \
            const float d = zz_fp16(&w[j].d);                                                             \
            for (int t = 0; t < nt; ++t) {                                                                \
                cf[t][c] = x[t*ldx + j]*d;                                                                \
            }                                                                                             \
        }                                                                                                 \
        for (int c = nc; c < ((nc + 7) & ~7); ++c) {                                                      \
            blk[c] = blk[0];                                                                              \
        }                                                                                                 \
        for (int t = 0; t < nt; ++t) {                                                                    \
            for (int c = nc; c < ZZ_CHUNK; ++c) {                                                         \
                cf[t][c] = 0.0f;                                                                          \
            }                                                                                             \
            sf[t] = coefs(cf[t], cq[t]);                                                                  \
        }                                                                                                 \
        int t = 0;                                                                                        \
        for (; t + 2 <= nt; t += 2) {                                                                     \
            run(blk, nc, 2, cq + t, sf + t, acc + t);                                                     \
        }                                                                                                 \
        if (t < nt) {                                                                                     \
            run(blk, nc, 1, cq + t, sf + t, acc + t);                                                     \
        }                                                                                                 \
    }                                                                                                     \
    for (int t = 0; t < nt; ++t) {                                                                        \
        memcpy(y + t*ldy, acc[t], sizeof(acc[t]));                                                        \
    }                                                                                                     \
}                                                                                                         \
ZZ_ONE_TOKEN_CONST(name)

#if defined(__ARM_FEATURE_DOTPROD)
// With dot products (Apple M1 and later, Graviton 2 and later): s8 coefficients, the blocks of four columns
// interleaved by byte (two levels of ZIP) so that one SDOT by lane sums four columns into four rows' int32 sums

// a chunk's 16 coefficients rounded to s8 with one scale, which it returns
ZZ_INLINE float zz_b32_coefs8(const float * cf, int8_t * cq) {
    const float amax = zz_amax(cf, ZZ_CHUNK);
    const float inv  = amax > 0.0f ? 127.0f/amax : 0.0f;
    int32x4_t r[4];
    for (int i = 0; i < 4; ++i) {
        r[i] = vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(cf + 4*i), inv));
    }
    const int16x8_t lo = vcombine_s16(vmovn_s32(r[0]), vmovn_s32(r[1]));
    const int16x8_t hi = vcombine_s16(vmovn_s32(r[2]), vmovn_s32(r[3]));
    vst1q_s8(cq, vcombine_s8(vmovn_s16(lo), vmovn_s16(hi)));
    return amax/127.0f;
}

// rows 16h .. 16h+15 of a block as bytes: Q8_0 its quants, Q4_0 its nibbles (0..15; the offset of 8 per flush)
ZZ_INLINE int8x16_t zz_q8_0_half(const block_q8_0 * b, const int h) {
    return vld1q_s8(b->qs + 16*h);
}

ZZ_INLINE int8x16_t zz_q4_0_half(const block_q4_0 * b, const int h) {
    const uint8x16_t v = vld1q_u8(b->qs);
    return vreinterpretq_s8_u8(h ? vshrq_n_u8(v, 4) : vandq_u8(v, vdupq_n_u8(0x0F)));
}

// columns 4q .. 4q+3 of the chunk (ZZ_B32_DOT_RUN's locals), rows 16h ..: bytes 4i .. 4i+3 of tq[r] are the four
// columns of row 4r + i; lane q of the coefficients (a literal for clang)
#define ZZ_B32_DOT4(half, q, h)                                                                           \
    do {                                                                                                  \
        const int8x16_t v0_ = half(blk[4*(q) + 0], h), v1_ = half(blk[4*(q) + 1], h);                    \
        const int8x16_t v2_ = half(blk[4*(q) + 2], h), v3_ = half(blk[4*(q) + 3], h);                    \
        const int16x8_t z0_ = vreinterpretq_s16_s8(vzip1q_s8(v0_, v1_));                                 \
        const int16x8_t z1_ = vreinterpretq_s16_s8(vzip2q_s8(v0_, v1_));                                 \
        const int16x8_t z2_ = vreinterpretq_s16_s8(vzip1q_s8(v2_, v3_));                                 \
        const int16x8_t z3_ = vreinterpretq_s16_s8(vzip2q_s8(v2_, v3_));                                 \
        const int8x16_t tq_[4] = {                                                                        \
            vreinterpretq_s8_s16(vzip1q_s16(z0_, z2_)), vreinterpretq_s8_s16(vzip2q_s16(z0_, z2_)),       \
            vreinterpretq_s8_s16(vzip1q_s16(z1_, z3_)), vreinterpretq_s8_s16(vzip2q_s16(z1_, z3_)) };     \
        for (int g = 0; g < G; ++g) {                                                                     \
            for (int i = 0; i < 4; ++i) {                                                                 \
                a[g][4*(h) + i] = vdotq_laneq_s32(a[g][4*(h) + i], tq_[i], cv[g], (q));                   \
            }                                                                                             \
        }                                                                                                 \
    } while (0)

// G (constant) tokens, a chunk of nc 32-row blocks (padded to a multiple of 8 with coefficients 0): int32 sums of
// the bytes times the s8 coefficients cq[g], less bias times the coefficients' sum, flushed into acc[g] with sf[g]
#define ZZ_B32_DOT_RUN(name, btype, half, bias)                                                           \
ZZ_INLINE void name(const btype * const * blk, int nc, const int G, const int8_t (* cq)[ZZ_CHUNK],       \
                    const float * sf, float (* acc)[32]) {                                                \
    int32x4_t a[2][8];                                                                                    \
    int8x16_t cv[2];                                                                                      \
    for (int g = 0; g < G; ++g) {                                                                         \
        cv[g] = vld1q_s8(cq[g]);                                                                          \
        for (int i = 0; i < 8; ++i) {                                                                     \
            a[g][i] = vdupq_n_s32(0);                                                                     \
        }                                                                                                 \
    }                                                                                                     \
    for (int h = 0; h < 2; ++h) {                                                                         \
        ZZ_B32_DOT4(half, 0, h);                                                                          \
        ZZ_B32_DOT4(half, 1, h);                                                                          \
        if (nc > 8) {                                                                                     \
            ZZ_B32_DOT4(half, 2, h);                                                                      \
            ZZ_B32_DOT4(half, 3, h);                                                                      \
        }                                                                                                 \
    }                                                                                                     \
    for (int g = 0; g < G; ++g) {                                                                         \
        const int32x4_t off = vdupq_n_s32((bias)*vaddlvq_s8(cv[g]));                                     \
        for (int i = 0; i < 8; ++i) {                                                                     \
            zz_flush_s32(acc[g] + 4*i, vsubq_s32(a[g][i], off), sf[g]);                                   \
        }                                                                                                 \
    }                                                                                                     \
}

ZZ_B32_DOT_RUN(zz_q4_0_dot_run, block_q4_0, zz_q4_0_half, 8)
ZZ_B32_DOT_RUN(zz_q8_0_dot_run, block_q8_0, zz_q8_0_half, 0)

ZZ_B32_KERNEL(zz_gemv_q4_0_int, block_q4_0, zz_q4_0_dot_run, int8_t, zz_b32_coefs8)
ZZ_B32_KERNEL(zz_gemv_q8_0_int, block_q8_0, zz_q8_0_dot_run, int8_t, zz_b32_coefs8)
#else
// s16 coefficients: within ~1e-5 of fp32
ZZ_B32_KERNEL(zz_gemv_q4_0_int, block_q4_0, zz_q4_0_run, int16_t, zz_b32_coefs)
ZZ_B32_KERNEL(zz_gemv_q8_0_int, block_q8_0, zz_q8_0_run, int16_t, zz_b32_coefs)
#endif

// Q6_K: the 6-bit quants (0..63; their offset of 32 is taken off at the flush) of rows 32g .. 32g+31 of a block,
// widened to s16: w[0], w[1] rows 0..15 (sub-block 2g), w[2], w[3] rows 16..31 (2g + 1). Rows 32g + l: low 4 bits
// from ql[64n + 32(k & 1) + l] (nibble k >> 1), high 2 from qh[32n + l] (bits 2k, 2k + 1), g = 4n + k. g constant
ZZ_INLINE void zz_q6_K_unpack(uint8x16_t l0, uint8x16_t l1, uint8x16_t h0, uint8x16_t h1, const int k, int16x8_t * w) {
    const uint8x16_t m6 = vdupq_n_u8(0x3F);
    const uint8x16_t m2 = vdupq_n_u8(0x30);
    uint8x16_t q0, q1;
    switch (k) { // shift counts must be literals. SLI/SRI insert the shifted bits and keep the rest of the first operand
        case 0: // (qh << 4 | ql & 15) & 63
            q0 = vandq_u8(vsliq_n_u8(l0, h0, 4), m6);
            q1 = vandq_u8(vsliq_n_u8(l1, h1, 4), m6);
            break;
        case 1: // bits 4, 5 from qh << 2, the rest from ql, & 63
            q0 = vandq_u8(vbslq_u8(m2, vshlq_n_u8(h0, 2), l0), m6);
            q1 = vandq_u8(vbslq_u8(m2, vshlq_n_u8(h1, 2), l1), m6);
            break;
        case 2: // qh & 48 | ql >> 4
            q0 = vsriq_n_u8(vandq_u8(h0, m2), l0, 4);
            q1 = vsriq_n_u8(vandq_u8(h1, m2), l1, 4);
            break;
        default: // (qh >> 2) & 48 | ql >> 4
            q0 = vsriq_n_u8(vandq_u8(vshrq_n_u8(h0, 2), m2), l0, 4);
            q1 = vsriq_n_u8(vandq_u8(vshrq_n_u8(h1, 2), m2), l1, 4);
            break;
    }
    w[0] = vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(q0)));
    w[1] = vreinterpretq_s16_u16(vmovl_high_u8(q0));
    w[2] = vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(q1)));
    w[3] = vreinterpretq_s16_u16(vmovl_high_u8(q1));
}

// rows 32g .. 32g+31 (w[0..3]) and, with two, 32(g + 2) .. (w[4..7]): the same ql and qh bytes
ZZ_INLINE void zz_q6_K_widen(const block_q6_K * b, const int g, const bool two, int16x8_t * w) {
    const int n = g >> 2, k = g & 3;
    const uint8x16_t l0 = vld1q_u8(b->ql + 64*n + 32*(k & 1));
    const uint8x16_t l1 = vld1q_u8(b->ql + 64*n + 32*(k & 1) + 16);
    const uint8x16_t h0 = vld1q_u8(b->qh + 32*n);
    const uint8x16_t h1 = vld1q_u8(b->qh + 32*n + 16);
    zz_q6_K_unpack(l0, l1, h0, h1, k, w);
    if (two) {
        zz_q6_K_unpack(l0, l1, h0, h1, k + 2, w + 4);
    }
}

// ZZ_Q6_K_MLA(a, wq, cv, s): rows 16 (s & 1) .. + 15 of the run, four int32x4 of a, lane s of cv (a literal for clang)
#define ZZ_Q6_K_MLA(a, wq, cv, s)                                                                         \
    do {                                                                                                  \
        (a)[0] = vmlal_laneq_s16((a)[0], vget_low_s16((wq)[0]), cv, (s));                                \
        (a)[1] = vmlal_high_laneq_s16((a)[1], (wq)[0], cv, (s));                                         \
        (a)[2] = vmlal_laneq_s16((a)[2], vget_low_s16((wq)[1]), cv, (s));                                \
        (a)[3] = vmlal_high_laneq_s16((a)[3], (wq)[1], cv, (s));                                         \
    } while (0)

// G (constant) tokens, rows 32g .. 32g+31 of a chunk's nc blocks: int32 sums of the quants times the s16 coefficients
// cq[t][c][2g], [2g + 1] (lanes of the column's coefficient vector), flushed into acc[t] less c32[t][s] (32 times the
// chunk's sum of the coefficients of sub-block s) with sf[t]. One token and g & 2 == 0: rows 32(g + 2) .. too, from the
// same loads, in a[1]
#define ZZ_Q6_K_RUN(g)                                                                                    \
ZZ_INLINE void zz_q6_K_run##g(const block_q6_K * const * blk, int nc, const int G,                       \
                              const int16_t (* cq)[ZZ_CHUNK][QK_K/16], const int32_t (* c32)[QK_K/16],   \
                              const float * sf, float (* acc)[QK_K]) {                                  \
    const bool two = G == 1 && ((g) & 2) == 0;                                                            \
    int32x4_t a[2][8];                                                                                    \
    for (int t = 0; t < 2; ++t) {                                                                         \
        for (int i = 0; i < 8; ++i) {                                                                     \
            a[t][i] = vdupq_n_s32(0);                                                                     \
        }                                                                                                 \
    }                                                                                                     \
    ZZ_UNROLL(2)                                                                                          \
    for (int c = 0; c < nc; ++c) {                                                                        \
        int16x8_t wq[8];                                                                                  \
        zz_q6_K_widen(blk[c], g, two, wq);                                                                \
        for (int t = 0; t < G; ++t) {                                                                     \
            const int16x8_t cv = vld1q_s16(cq[t][c] + 8*((g) >> 2));                                     \
            ZZ_Q6_K_MLA(a[t] + 0, wq + 0, cv, (2*(g) + 0) & 7);                                          \
            ZZ_Q6_K_MLA(a[t] + 4, wq + 2, cv, (2*(g) + 1) & 7);                                          \
            if (two) {                                                                                    \
                ZZ_Q6_K_MLA(a[1] + 0, wq + 4, cv, (2*(g) + 4) & 7);                                      \
                ZZ_Q6_K_MLA(a[1] + 4, wq + 6, cv, (2*(g) + 5) & 7);                                      \
            }                                                                                             \
        }                                                                                                 \
    }                                                                                                     \
    for (int t = 0; t < (two ? 2 : G); ++t) {                                                             \
        const int gt = two ? (g) + 2*t : (g), tt = two ? 0 : t;                                           \
        for (int i = 0; i < 8; ++i) {                                                                     \
            zz_flush_s32(acc[tt] + 32*gt + 4*i, vsubq_s32(a[t][i], vdupq_n_s32(c32[tt][2*gt + i/4])), sf[tt]); \
        }                                                                                                 \
    }                                                                                                     \
}

ZZ_Q6_K_RUN(0) ZZ_Q6_K_RUN(1) ZZ_Q6_K_RUN(2) ZZ_Q6_K_RUN(3)
ZZ_Q6_K_RUN(4) ZZ_Q6_K_RUN(5) ZZ_Q6_K_RUN(6) ZZ_Q6_K_RUN(7)

// Q6_K: per chunk and token, the coefficients x_j*d_j*sc_j[s] of the 16 sub-blocks as s16 with one scale (as on x86:
// |sc| <= 128), then the products in pairs of tokens, 32 rows at a time
ZZ_INLINE void zz_gemv_q6_K_int_impl(const void * wrow, const int32_t * cols, int64_t k0, int64_t k1,
                                     const float * x, int64_t ldx, const int nt, float * y, int64_t ldy) {
    const block_q6_K * w = wrow;
    float   acc[ZZ_MAX_T][QK_K];
    float   xd[ZZ_MAX_T][ZZ_CHUNK];
    int16_t cq[ZZ_MAX_T][ZZ_CHUNK][QK_K/16];
    int32_t c32[ZZ_MAX_T][QK_K/16];
    float   sf[ZZ_MAX_T];
    const block_q6_K * blk[ZZ_CHUNK];
    memset(acc, 0, sizeof(acc[0])*nt);
    for (int64_t kc = k0; kc < k1; kc += ZZ_CHUNK) {
        const int nc = k1 - kc < ZZ_CHUNK ? (int) (k1 - kc) : ZZ_CHUNK;
        for (int c = 0; c < nc; ++c) {
            const int64_t j = cols ? cols[kc + c] : kc + c;
            blk[c] = w + j;
            const float d = zz_fp16(&w[j].d);
            for (int t = 0; t < nt; ++t) {
                xd[t][c] = x[t*ldx + j]*d;
            }
        }
        for (int t = 0; t < nt; ++t) {
            for (int c = nc; c < ZZ_CHUNK; ++c) {
                xd[t][c] = 0.0f;
            }
            const float amax = zz_amax(xd[t], ZZ_CHUNK);
            const float inv  = amax > 0.0f ? 32767.0f/(amax*128.0f) : 0.0f;
            sf[t] = amax*128.0f/32767.0f;
            int32x4_t cs[4] = { vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0) };
            for (int c = 0; c < nc; ++c) {
                const float     f  = xd[t][c]*inv;
                const int8x16_t sc = vld1q_s8(blk[c]->scales);
                const int16x8_t s0 = vmovl_s8(vget_low_s8(sc));
                const int16x8_t s1 = vmovl_high_s8(sc);
                const int32x4_t r0 = vcvtnq_s32_f32(vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(s0))), f));
                const int32x4_t r1 = vcvtnq_s32_f32(vmulq_n_f32(vcvtq_f32_s32(vmovl_high_s16(s0)), f));
                const int32x4_t r2 = vcvtnq_s32_f32(vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(s1))), f));
                const int32x4_t r3 = vcvtnq_s32_f32(vmulq_n_f32(vcvtq_f32_s32(vmovl_high_s16(s1)), f));
                vst1q_s16(cq[t][c] + 0, vcombine_s16(vmovn_s32(r0), vmovn_s32(r1)));
                vst1q_s16(cq[t][c] + 8, vcombine_s16(vmovn_s32(r2), vmovn_s32(r3)));
                cs[0] = vaddq_s32(cs[0], r0); cs[1] = vaddq_s32(cs[1], r1);
                cs[2] = vaddq_s32(cs[2], r2); cs[3] = vaddq_s32(cs[3], r3);
            }
            for (int i = 0; i < 4; ++i) {
                vst1q_s32(c32[t] + 4*i, vshlq_n_s32(cs[i], 5));
            }
        }
        int t = 0;
        for (; t + 2 <= nt; t += 2) {
            zz_q6_K_run0(blk, nc, 2, cq + t, c32 + t, sf + t, acc + t);
            zz_q6_K_run1(blk, nc, 2, cq + t, c32 + t, sf + t, acc + t);
            zz_q6_K_run2(blk, nc, 2, cq + t, c32 + t, sf + t, acc + t);
            zz_q6_K_run3(blk, nc, 2, cq + t, c32 + t, sf + t, acc + t);
            zz_q6_K_run4(blk, nc, 2, cq + t, c32 + t, sf + t, acc + t);
            zz_q6_K_run5(blk, nc, 2, cq + t, c32 + t, sf + t, acc + t);
            zz_q6_K_run6(blk, nc, 2, cq + t, c32 + t, sf + t, acc + t);
            zz_q6_K_run7(blk, nc, 2, cq + t, c32 + t, sf + t, acc + t);
        }
        if (t < nt) { // one token: runs g and g + 2 in one pass
            zz_q6_K_run0(blk, nc, 1, cq + t, c32 + t, sf + t, acc + t);
            zz_q6_K_run1(blk, nc, 1, cq + t, c32 + t, sf + t, acc + t);
            zz_q6_K_run4(blk, nc, 1, cq + t, c32 + t, sf + t, acc + t);
            zz_q6_K_run5(blk, nc, 1, cq + t, c32 + t, sf + t, acc + t);
        }
    }
    for (int t = 0; t < nt; ++t) {
        memcpy(y + t*ldy, acc[t], sizeof(acc[t]));
    }
}

ZZ_ONE_TOKEN_CONST(zz_gemv_q6_K_int)

// LLAMA_SPARSE_CPU_ARM_INT=0: the fp32 kernels for every type (comparisons)
static bool zz_arm_int(void) {
    static int env = -1; // benign race: every thread computes the same value
    if (env < 0) {
        const char * e = getenv("LLAMA_SPARSE_CPU_ARM_INT");
        env = e == NULL || strcmp(e, "0") != 0;
    }
    return env;
}

ggml_sparse_zz_gemv_t ggml_sparse_zz_gemv_arm(enum ggml_type type) {
    if (zz_arm_int()) {
        switch (type) {
            case GGML_TYPE_Q4_0: return zz_gemv_q4_0_int;
            case GGML_TYPE_Q8_0: return zz_gemv_q8_0_int;
            case GGML_TYPE_Q4_K: return zz_gemv_q4_K_int;
            case GGML_TYPE_Q6_K: return zz_gemv_q6_K_int;
            default:             break;
        }
    }
    switch (type) {
        case GGML_TYPE_Q4_0: return zz_gemv_q4_0_neon;
        case GGML_TYPE_Q8_0: return zz_gemv_q8_0_neon;
        case GGML_TYPE_Q4_K: return zz_gemv_q4_K_neon;
        case GGML_TYPE_Q6_K: return zz_gemv_q6_K_neon;
        default:             return NULL;
    }
}

#else

ggml_sparse_zz_gemv_t ggml_sparse_zz_gemv_arm(enum ggml_type type) {
    GGML_UNUSED(type);
    return NULL;
}

#endif
