// llama-sparse: ARM NEON GEMV kernels on one zigzag block-row (decode, T <= GGML_SPARSE_MAX_BATCH).
//
// Each active column's block is dequantized to fp32 with NEON and added to the block-row's outputs
// with vector FMAs (an axpy per column). Plain fp32 keeps the result independent of the thread split.
#define GGML_COMMON_DECL_C
#include "ggml-common.h"

#include "ggml-sparse-cpu.h"
#include "ggml-sparse.h"
#include "ggml-impl.h"

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

static inline void zz_get_scale_min_k4(int j, const uint8_t * q, uint8_t * d, uint8_t * m) {
    if (j < 4) {
        *d = q[j] & 63; *m = q[j + 4] & 63;
    } else {
        *d = (q[j+4] & 0xF) | ((q[j-4] >> 6) << 4);
        *m = (q[j+4] >>  4) | ((q[j-0] >> 6) << 4);
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

ggml_sparse_zz_gemv_t ggml_sparse_zz_gemv_arm(enum ggml_type type) {
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
