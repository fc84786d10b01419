// llama-sparse: AVX2 GEMV kernels on one zigzag block-row (decode, T <= GGML_SPARSE_MAX_BATCH).
//
// y[i] += sum_j x_j * w_j[i] is an axpy per active column j. Per chunk of GGML_SPARSE_ZZ_CHUNK columns
// and token, the per-(column, sub-block) coefficients x_j*d_j*sc_j are quantized to integers with one
// float scale S, so the inner loop is integer SIMD over interleaved column pairs:
//   Q4_K:             u4 weights x s8 coefficients (maddubs), int16 sums, |c| <= 126 keeps 8 pairs exact;
//                     one token on AVX512-VNNI: column quads on vpdpbusd, int32 sums (the same integers)
//   Q4_0, Q8_0, Q6_K: s8 weights x s16 coefficients (madd), int32 sums
// and each chunk is flushed as y += S * float(sum). Q4_K's min term is kept in fp32.
#define GGML_COMMON_DECL_C
#include "ggml-common.h"

#include "ggml-sparse-cpu.h"
#include "ggml-sparse.h"
#include "ggml-impl.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>

#define ZZ_MAX_T GGML_SPARSE_MAX_BATCH
#define ZZ_CHUNK GGML_SPARSE_ZZ_CHUNK
#define ZZ_INLINE static inline __attribute__((always_inline))
#define ZZ_STR(x) #x
#define ZZ_UNROLL(n) _Pragma(ZZ_STR(GCC unroll n))

static_assert(ZZ_CHUNK % 2 == 0 && ZZ_CHUNK <= 16, "Q4_K int16 sums are exact for at most 8 column pairs");

// d and (for Q4_K) dmin of a block: both fp16 at the start of block_q4_K, d at the start of q4_0/q8_0
ZZ_INLINE __m128 zz_fp16x2(const void * p) {
    int32_t v;
    memcpy(&v, p, sizeof(v));
    return _mm_cvtph_ps(_mm_cvtsi32_si128(v));
}

ZZ_INLINE float zz_fp16(const ggml_half * p) {
    return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(*p)));
}

// max |v[i]| over 16 floats
ZZ_INLINE float zz_amax16(const float * v) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256 a = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(v)), _mm256_andnot_ps(sign, _mm256_loadu_ps(v + 8)));
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

// out[i] = round(v[i]*s) for 16 floats, saturated to int16 (round to nearest even, MXCSR default)
ZZ_INLINE void zz_round16_i16(const float * v, float s, int16_t * out) {
    const __m256  vs = _mm256_set1_ps(s);
    const __m256i a  = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v + 0), vs));
    const __m256i b  = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v + 8), vs));
    // packs saturates; lanes interleave as a0-3 b0-3 a4-7 b4-7, undone by the permute
    const __m256i p  = _mm256_permute4x64_epi64(_mm256_packs_epi32(a, b), 0xD8);
    _mm256_storeu_si256((__m256i *) out, p);
}

// y[0..7] += s * lo128(v), y[off..off+7] += s * hi128(v), v holding 16 int16 sums
ZZ_INLINE void zz_flush_i16(float * y_lo, float * y_hi, __m256i v, __m256 s) {
    const __m256 f_lo = _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm256_castsi256_si128(v)));
    const __m256 f_hi = _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm256_extracti128_si256(v, 1)));
    _mm256_store_ps(y_lo, _mm256_fmadd_ps(s, f_lo, _mm256_load_ps(y_lo)));
    _mm256_store_ps(y_hi, _mm256_fmadd_ps(s, f_hi, _mm256_load_ps(y_hi)));
}

ZZ_INLINE void zz_flush_i32(float * y, __m256i v, __m256 s) {
    _mm256_store_ps(y, _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(v), _mm256_load_ps(y)));
}

//
// Q4_K
//

// the 6-bit scales and mins of two blocks: [sc_a[8] m_a[8] | sc_b[8] m_b[8]] (get_scale_min_k4 on bytes)
// the 6-bit scales and mins of two blocks from v: lane 0 block a, lane 1 block b, each lane 16 bytes of the block
// from byte off (4: scales[0..11] then 4 bytes of qs; 0: d, dmin, scales[0..11]); bytes: lane sc[0..7] m[0..7]
ZZ_INLINE __m256i zz_q4_K_sm_decode(__m256i v, const int off) {
    const __m256i ofs    = _mm256_set1_epi8((char) (off == 4 ? 0 : 4));
    const __m256i idx_lo = _mm256_add_epi8(ofs, _mm256_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11,
                                                                 0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11));
    // -1 entries stay negative (zero) after the offset: 0x80 + 4 keeps the top bit
    const __m256i idx_hi = _mm256_add_epi8(ofs, _mm256_setr_epi8(-128, -128, -128, -128, 0, 1, 2, 3, -128, -128, -128, -128, 4, 5, 6, 7,
                                                                 -128, -128, -128, -128, 0, 1, 2, 3, -128, -128, -128, -128, 4, 5, 6, 7));
    const __m256i mask_lo = _mm256_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 15, 15, 15, 15,
                                             63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 15, 15, 15, 15);
    const __m256i lo_b = _mm256_shuffle_epi8(v, idx_lo);
    const __m256i hi_n = _mm256_shuffle_epi8(_mm256_srli_epi16(v, 4), idx_lo); // high nibbles in the low bits
    // m[4..7] take the high nibble of scales[8..11], the rest low bits as they are
    const __m256i lo = _mm256_and_si256(_mm256_blend_epi32(lo_b, hi_n, 0x88), mask_lo);
    // bits 4,5 of sc/m[4..7] are bits 6,7 of scales[0..3] / scales[4..7]
    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(_mm256_shuffle_epi8(v, idx_hi), 2), _mm256_set1_epi8(0x30));
    return _mm256_or_si256(lo, hi);
}

ZZ_INLINE __m256i zz_q4_K_scales_mins_x2(const block_q4_K * a, const block_q4_K * b) {
    // 16-byte loads from scales[] read 4 bytes of qs: still inside the block
    const __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *) a->scales)),
                                              _mm_loadu_si128((const __m128i *) b->scales), 1);
    return zz_q4_K_sm_decode(v, 4);
}

// the first 16 bytes of blocks a (lane 0) and b (lane 1): d, dmin, scales
ZZ_INLINE __m256i zz_q4_K_heads_x2(const block_q4_K * a, const block_q4_K * b) {
    return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *) a)),
                                   _mm_loadu_si128((const __m128i *) b), 1);
}

// the (d, dmin) dwords of columns 8h .. 8h+7 in order, from the heads of pairs 4h .. 4h+3 (columns 2p, 2p+1)
ZZ_INLINE __m256i zz_q4_K_dm_from_heads(const __m256i * hd) {
    const __m256i u01 = _mm256_unpacklo_epi32(hd[0], hd[1]); // lane 0: c0 c2 ..; lane 1: c1 c3 ..
    const __m256i u23 = _mm256_unpacklo_epi32(hd[2], hd[3]);
    const __m256i v   = _mm256_unpacklo_epi64(u01, u23);     // lane 0: c0 c2 c4 c6; lane 1: c1 c3 c5 c7
    return _mm256_permutevar8x32_epi32(v, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// chunks whose coefficients are prepared together. Several give out-of-order execution independent
// latency chains (fp16 -> amax -> rounding -> table) and win when the weights are in cache (4: ~5 %
// faster hot); one keeps a group's blocks (2.3 KB) in L1 from their scale gathers to their products and
// wins when they stream from memory, as in decode (4096x4096, 1 thread, cold: dense 1.11-1.24x stock
// against 0.80-0.92x with 4; bench/results/gemv_cpu_2026-11-23.md)
#ifndef ZZ_GROUP
#define ZZ_GROUP 1
#endif

#ifndef ZZ_PF_DIST
#define ZZ_PF_DIST (2*ZZ_GROUP*ZZ_CHUNK)
#endif

#ifndef ZZ_PF_HINT
#define ZZ_PF_HINT _MM_HINT_T0
#endif

// sparse: prefetches spread over the product loop (nt = 1) instead of issued per group
#ifndef ZZ_PF_SPREAD
#define ZZ_PF_SPREAD 1
#endif

// sparse: when the next list entries span at most this many columns per entry, prefetch their whole
// span as one stream instead of block by block (0: never)
#ifndef ZZ_PF_RANGE
#define ZZ_PF_RANGE 4
#endif

// software prefetch of dense (contiguous) columns as well: 1 = per group, 2 = spread over the products
#ifndef ZZ_PF_DENSE
#define ZZ_PF_DENSE 2
#endif

// 1/a to ~23 bits (rcp + one Newton step; a divide is much slower), a > 0
ZZ_INLINE __m256 zz_rcp(__m256 a) {
    const __m256 r = _mm256_rcp_ps(a);
    return _mm256_mul_ps(r, _mm256_fnmadd_ps(a, r, _mm256_set1_ps(2.0f)));
}

// y[e] += s*even words of v, y[8 + e] += s*odd words: no lane crossing; zz_q4_K_out undoes the order.
// madd with (1, 0) / (0, 1) word pairs sign-extends the even / odd words in one instruction each
ZZ_INLINE void zz_flush_i16_eo(float * yv, __m256i v, __m256 s) {
    const __m256 fe = _mm256_cvtepi32_ps(_mm256_madd_epi16(v, _mm256_set1_epi32(0x00000001)));
    const __m256 fo = _mm256_cvtepi32_ps(_mm256_madd_epi16(v, _mm256_set1_epi32(0x00010000)));
    _mm256_store_ps(yv + 0, _mm256_fmadd_ps(s, fe, _mm256_load_ps(yv + 0)));
    _mm256_store_ps(yv + 8, _mm256_fmadd_ps(s, fo, _mm256_load_ps(yv + 8)));
}

// the same into memory of any alignment (the column-major kernel accumulates in the caller's y)
ZZ_INLINE void zz_flush_i16_eo_u(float * yv, __m256i v, __m256 s) {
    const __m256 fe = _mm256_cvtepi32_ps(_mm256_madd_epi16(v, _mm256_set1_epi32(0x00000001)));
    const __m256 fo = _mm256_cvtepi32_ps(_mm256_madd_epi16(v, _mm256_set1_epi32(0x00010000)));
    _mm256_storeu_ps(yv + 0, _mm256_fmadd_ps(s, fe, _mm256_loadu_ps(yv + 0)));
    _mm256_storeu_ps(yv + 8, _mm256_fmadd_ps(s, fo, _mm256_loadu_ps(yv + 8)));
}

// output (within a 64-output group) of accumulator slot i = 32h + 16q + 8odd + 4L + e, which holds
// word 2e + odd of lane L of int16 sum 2h + q, i.e. output 32h + 16L + 8q + 2e + odd
static const uint8_t zz_q4_K_slot_out[64] = {
     0,  2,  4,  6, 16, 18, 20, 22,  1,  3,  5,  7, 17, 19, 21, 23,
     8, 10, 12, 14, 24, 26, 28, 30,  9, 11, 13, 15, 25, 27, 29, 31,
    32, 34, 36, 38, 48, 50, 52, 54, 33, 35, 37, 39, 49, 51, 53, 55,
    40, 42, 44, 46, 56, 58, 60, 62, 41, 43, 45, 47, 57, 59, 61, 63,
};

// VNNI (AVX512-VNNI with VL): four columns per dword. Weight bytes of a column quad interleave to dwords
// (a_l, b_l, c_l, d_l) and vpdpbusd adds their products with the quad's coefficients (c_a, c_b, c_c, c_d) into
// int32 sums: no separate add, no int16 limit. High nibbles are masked in place (0xF0, 16x the value) and the
// flush scale divided by 16 (exact), so no shift. Per quad and 32-byte run: 8 shuffles, 8 ands, 8 dot products
// against 2x20 for two maddubs pairs. Sums are the same integers, so results match the maddubs path bit for bit.
// Column-major, scattered columns, one token: paired against maddubs (2 threads, cold, 4096x4096 / 11008x4096 /
// 4096x11008 at 50 %) 0.96 / 0.88 / 0.95x the time (bench/results/gemv_cpu_vnni_2026-11-24.md); its contiguous
// (dense) chunks kept maddubs (VNNI there, strided: 1.01-1.05x the time), except on AMD since 2026-12-06
// (zz_cm_strided). The row layout's one-token kernel: ZZ_ROW_VNNI.
// Accumulator slot i = 32h + 8k + 4L + e holds output 32h + 16L + 4k + e (e < 4 of lane L of sum k)
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#ifndef ZZ_CM_VNNI
#define ZZ_CM_VNNI 1
#endif
#ifndef ZZ_ROW_VNNI
#define ZZ_ROW_VNNI 1
#endif
#else
#undef  ZZ_CM_VNNI
#define ZZ_CM_VNNI 0
#undef  ZZ_ROW_VNNI
#define ZZ_ROW_VNNI 0
#endif

#if ZZ_CM_VNNI || ZZ_ROW_VNNI
static const uint8_t zz_q4_K_quad_slot_out[64] = {
     0,  1,  2,  3, 16, 17, 18, 19,  4,  5,  6,  7, 20, 21, 22, 23,
     8,  9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31,
    32, 33, 34, 35, 48, 49, 50, 51, 36, 37, 38, 39, 52, 53, 54, 55,
    40, 41, 42, 43, 56, 57, 58, 59, 44, 45, 46, 47, 60, 61, 62, 63,
};

// one token, one 32-byte run sp of nq column quads: yo (slot order) += sf * the sums of the runs times the quads'
// coefficients cq (8 dwords a quad: 2sp low nibbles, 2sp + 1 high). Quad q's blocks are wb + 4q + i when wb is
// set (contiguous columns, no pointer loads), else cb[4q + i]; off: bytes from there to the block-row's block (column-major; 0 in the row layout)
ZZ_INLINE void zz_q4_K_quad_run(const block_q4_K * const * cb, const block_q4_K * wb, size_t off, int nq,
                                const int32_t (* cq)[8], int sp, __m256 vl, __m256 vu, float * yo) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256i p0 = _mm256_setzero_si256(), p1 = p0, p2 = p0, p3 = p0, p4 = p0, p5 = p0, p6 = p0, p7 = p0;
    off += offsetof(block_q4_K, qs) + 32*sp;
    // p0..p3 (low nibbles) and p4..p7 (high nibbles, x16) += a quad's runs times its coefficients cl, cu
    ZZ_UNROLL(4)
    for (int q = 0; q < nq; ++q) {
        #define ZZ_QUAD_LD(i) _mm256_loadu_si256((const __m256i *) ((const char *) (wb ? wb + 4*q + (i) : cb[4*q + (i)]) + off))
        const __m256i A   = ZZ_QUAD_LD(0);
        const __m256i B   = ZZ_QUAD_LD(1);
        const __m256i C   = ZZ_QUAD_LD(2);
        const __m256i D   = ZZ_QUAD_LD(3);
        #undef ZZ_QUAD_LD
        const __m256i cl  = _mm256_set1_epi32(cq[q][2*sp]);
        const __m256i cu  = _mm256_set1_epi32(cq[q][2*sp + 1]);
        const __m256i ab0 = _mm256_unpacklo_epi8(A, B), ab1 = _mm256_unpackhi_epi8(A, B);
        const __m256i cd0 = _mm256_unpacklo_epi8(C, D), cd1 = _mm256_unpackhi_epi8(C, D);
        const __m256i w0  = _mm256_unpacklo_epi16(ab0, cd0), w1 = _mm256_unpackhi_epi16(ab0, cd0);
        const __m256i w2  = _mm256_unpacklo_epi16(ab1, cd1), w3 = _mm256_unpackhi_epi16(ab1, cd1);
        p0 = _mm256_dpbusd_epi32(p0, _mm256_and_si256(w0, m4), cl);
        p1 = _mm256_dpbusd_epi32(p1, _mm256_and_si256(w1, m4), cl);
        p2 = _mm256_dpbusd_epi32(p2, _mm256_and_si256(w2, m4), cl);
        p3 = _mm256_dpbusd_epi32(p3, _mm256_and_si256(w3, m4), cl);
        p4 = _mm256_dpbusd_epi32(p4, _mm256_andnot_si256(m4, w0), cu);
        p5 = _mm256_dpbusd_epi32(p5, _mm256_andnot_si256(m4, w1), cu);
        p6 = _mm256_dpbusd_epi32(p6, _mm256_andnot_si256(m4, w2), cu);
        p7 = _mm256_dpbusd_epi32(p7, _mm256_andnot_si256(m4, w3), cu);
    }
    vu = _mm256_mul_ps(vu, _mm256_set1_ps(1.0f/16.0f));
    #define ZZ_QUAD_FLUSH(o, v, s) _mm256_storeu_ps(yo + (o), _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(v), _mm256_loadu_ps(yo + (o))))
    ZZ_QUAD_FLUSH( 0, p0, vl); ZZ_QUAD_FLUSH( 8, p1, vl); ZZ_QUAD_FLUSH(16, p2, vl); ZZ_QUAD_FLUSH(24, p3, vl);
    ZZ_QUAD_FLUSH(32, p4, vu); ZZ_QUAD_FLUSH(40, p5, vu); ZZ_QUAD_FLUSH(48, p6, vu); ZZ_QUAD_FLUSH(56, p7, vu);
    #undef ZZ_QUAD_FLUSH
}

// the s8 quad coefficients straight from the s16 pair words (a_s, b_s) of pw[2q] and (c_s, d_s) of pw[2q + 1]: both
// rescaled by rw (mulhrs) and packed, dword s = bytes (a_s, b_s, c_s, d_s); instead of the pairs' (a, b, a, b)
// dwords blended afterwards
ZZ_INLINE void zz_q4_K_quad_coefs(const int32_t (* pw)[8], int nq, __m256i rw, int32_t (* cq)[8]) {
    const __m256i idx = _mm256_setr_epi8(0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15,
                                         0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15);
    for (int q = 0; q < nq; ++q) {
        const __m256i ab = _mm256_mulhrs_epi16(_mm256_load_si256((const __m256i *) pw[2*q + 0]), rw);
        const __m256i cd = _mm256_mulhrs_epi16(_mm256_load_si256((const __m256i *) pw[2*q + 1]), rw);
        _mm256_store_si256((__m256i *) cq[q], _mm256_shuffle_epi8(_mm256_packs_epi16(ab, cd), idx));
    }
}
#endif

// one token, one 64-output group sp: int16 sums over np column pairs, blocks from bp (pairs of pointers)
// or, when bp is NULL, from wb on, ws blocks apart; cf walks the coefficient table (8 dwords per pair)
ZZ_INLINE void zz_q4_K_sums_t1(const block_q4_K * const * bp, const block_q4_K * wb, int64_t ws, int np, const int32_t * cf, int sp,
                               __m256i * s0, __m256i * s1, __m256i * s2, __m256i * s3) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256i a0 = *s0, a1 = *s1, a2 = *s2, a3 = *s3;
    // full chunks unroll completely: no loop-carried register copies
    #pragma GCC unroll 8
    for (int p = 0; p < np; ++p) {
        const block_q4_K * ba = bp ? bp[2*p + 0] : wb + (2*p + 0)*ws;
        const block_q4_K * bb = bp ? bp[2*p + 1] : wb + (2*p + 1)*ws;
        const __m256i qa = _mm256_loadu_si256((const __m256i *) (ba->qs + 32*sp));
        const __m256i qb = _mm256_loadu_si256((const __m256i *) (bb->qs + 32*sp));
        const __m256i u0 = _mm256_unpacklo_epi8(qa, qb);
        const __m256i u1 = _mm256_unpackhi_epi8(qa, qb);
        const __m256i cl = _mm256_set1_epi32(cf[8*p + 0]);
        const __m256i cu = _mm256_set1_epi32(cf[8*p + 1]);
        a0 = _mm256_add_epi16(_mm256_maddubs_epi16(_mm256_and_si256(u0, m4), cl), a0);
        a1 = _mm256_add_epi16(_mm256_maddubs_epi16(_mm256_and_si256(u1, m4), cl), a1);
        a2 = _mm256_add_epi16(_mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(u0, 4), m4), cu), a2);
        a3 = _mm256_add_epi16(_mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(u1, 4), m4), cu), a3);
    }
    *s0 = a0; *s1 = a1; *s2 = a2; *s3 = a3;
}

// a16[t][0..3] += the nibbles of the 32-byte run sp of two blocks (a column pair) times the pair's
// coefficients c[t*cstride + 2*sp] (low nibbles) and c[t*cstride + 2*sp + 1] (high), t < nt: the inner step
// of the batch (T > 1) paths of both Q4_K kernels
ZZ_INLINE void zz_q4_K_pair_step(const uint8_t * qs_a, const uint8_t * qs_b, const int32_t * c, int cstride, int sp,
                                 int nt, __m256i a16[ZZ_MAX_T][4]) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i qa = _mm256_loadu_si256((const __m256i *) (qs_a + 32*sp));
    const __m256i qb = _mm256_loadu_si256((const __m256i *) (qs_b + 32*sp));
    // byte pairs (a_l, b_l): u0 holds l = 0..7 | 16..23, u1 holds l = 8..15 | 24..31
    const __m256i u0 = _mm256_unpacklo_epi8(qa, qb);
    const __m256i u1 = _mm256_unpackhi_epi8(qa, qb);
    const __m256i l0 = _mm256_and_si256(u0, m4);
    const __m256i l1 = _mm256_and_si256(u1, m4);
    const __m256i h0 = _mm256_and_si256(_mm256_srli_epi16(u0, 4), m4);
    const __m256i h1 = _mm256_and_si256(_mm256_srli_epi16(u1, 4), m4);
    for (int t = 0; t < nt; ++t) {
        const __m256i cl = _mm256_set1_epi32(c[t*cstride + 2*sp + 0]);
        const __m256i cu = _mm256_set1_epi32(c[t*cstride + 2*sp + 1]);
        a16[t][0] = _mm256_add_epi16(a16[t][0], _mm256_maddubs_epi16(l0, cl));
        a16[t][1] = _mm256_add_epi16(a16[t][1], _mm256_maddubs_epi16(l1, cl));
        a16[t][2] = _mm256_add_epi16(a16[t][2], _mm256_maddubs_epi16(h0, cu));
        a16[t][3] = _mm256_add_epi16(a16[t][3], _mm256_maddubs_epi16(h1, cu));
    }
}

// dense row layout: quarter sp of the contiguous chunk at next (ZZ_PF_DIST columns ahead), prefetched between
// batches of products
ZZ_INLINE void zz_q4_K_pf_dense(const block_q4_K * next, int sp) {
    enum { PF_RUN = ZZ_CHUNK*sizeof(block_q4_K)/4 };
    const char * pa = (const char *) next + sp*PF_RUN;
    for (int l = 0; l < PF_RUN; l += 64) {
        _mm_prefetch(pa + l, ZZ_PF_HINT);
    }
}

#if ZZ_ROW_VNNI
// one token, one chunk of the row layout's dense columns (blocks wb + c; cb[c] when wb is NULL): each run sp's
// quad products (zz_q4_K_quad_run) into acc (slot order), with a quarter of the chunk at pf prefetched per run
// (zz_q4_K_pf_dense; NULL: none). Not inlined, as zz_q4_K_cm_row_vnni
static __attribute__((noinline)) void zz_q4_K_row_vnni(const block_q4_K * const * cb, const block_q4_K * wb, int nq,
        const int32_t (* cq)[8], const float * sf, const block_q4_K * pf, float * acc) {
    ZZ_UNROLL(1)
    for (int sp = 0; sp < QK_K/64; ++sp) {
        if (pf) {
            zz_q4_K_pf_dense(pf, sp);
        }
        const __m256 vl = _mm256_set1_ps(sf[2*sp + 0]);
        const __m256 vu = _mm256_set1_ps(sf[2*sp + 1]);
        if (wb) {
            zz_q4_K_quad_run(NULL, wb, 0, nq, cq, sp, vl, vu, acc + 64*sp);
        } else {
            zz_q4_K_quad_run(cb, NULL, 0, nq, cq, sp, vl, vu, acc + 64*sp);
        }
    }
}
#endif

ZZ_INLINE void zz_q4_K_impl(const block_q4_K * w, const int32_t * cols, int64_t k0, int64_t k1,
                            const float * x, int64_t ldx, const int nt, const bool dense, const bool quad_on, float * y, int64_t ldy) {
    enum { NG = ZZ_GROUP*ZZ_CHUNK }; // columns per group
    // one token, dense: VNNI quads (a padded tail's extra columns have x = 0, so coefficients 0)
    const bool quad = ZZ_ROW_VNNI && quad_on && nt == 1 && dense;

    float  acc[ZZ_MAX_T][QK_K] __attribute__((aligned(32)));
    __m256 vmin[ZZ_MAX_T]; // sum_j x_j*dmin_j*m_j[s], subtracted at the end

    for (int t = 0; t < nt; ++t) {
        for (int i = 0; i < QK_K; i += 8) {
            _mm256_store_ps(acc[t] + i, _mm256_setzero_ps());
        }
        vmin[t] = _mm256_setzero_ps();
    }

    const __m256i lane_id  = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    // fp16 (d, dmin) dwords -> d halves in qword 0, dmin halves in qword 1 of each lane
    const __m256i dm_idx   = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15,
                                              0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
    // [sc_a sc_b | m_a m_b] -> byte pairs (a_s, b_s)
    const __m256i pair_idx = _mm256_setr_epi8(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15,
                                              0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);

    float    xd[ZZ_MAX_T][NG]           __attribute__((aligned(32)));
    float    xm[ZZ_MAX_T][NG]           __attribute__((aligned(32)));
    int32_t  fq[ZZ_MAX_T][NG/2]         __attribute__((aligned(32))); // s16 pairs (col 2p, col 2p+1)
    int32_t  mq[ZZ_MAX_T][NG/2]         __attribute__((aligned(32)));
    int32_t  coef[ZZ_MAX_T][NG/2][8]    __attribute__((aligned(32))); // maddubs pair per sub-block, twice
#if ZZ_ROW_VNNI
    int32_t  cqa[NG/4][8]               __attribute__((aligned(32))); // quad mode: s8 quad per sub-block
#endif
    float    sf[ZZ_MAX_T][ZZ_GROUP][8]  __attribute__((aligned(32))); // flush scale per sub-block
    float    sa[ZZ_MAX_T][ZZ_GROUP];
    float    sm[ZZ_MAX_T][ZZ_GROUP];

    for (int64_t kg = k0; kg < k1; kg += NG) {
        const int ncol = k1 - kg < NG ? (int) (k1 - kg) : NG;
        const int nch  = (ncol + ZZ_CHUNK - 1)/ZZ_CHUNK;
        const int32_t * gcols = dense ? NULL : cols + kg;

        // block of column c of the group; an odd tail pairs the last column with itself (at x = 0)
        #define ZZ_BLK(c) (blk[c])

        // block pointers once per group (padding repeats the last column)
        const block_q4_K * blk[NG];
        for (int c = 0; c < nch*ZZ_CHUNK; ++c) {
            const int cc = c < ncol ? c : ncol - 1;
            blk[c] = dense ? w + kg + cc : w + gcols[cc];
        }

        // xd = x*d, xm = x*dmin, 8 columns at a time by gathers; columns past ncol get 0
        for (int c = 0; c < nch*ZZ_CHUNK; c += 8) {
            const __m256i valid = _mm256_cmpgt_epi32(_mm256_set1_epi32(ncol - c), lane_id);
            const __m256i vc    = dense ? _mm256_add_epi32(_mm256_set1_epi32((int32_t) (kg + c)), lane_id)
                                        : _mm256_maskload_epi32(gcols + c, valid);
            // block stride 144 bytes = 36 dwords
            const __m256i voff  = _mm256_add_epi32(_mm256_slli_epi32(vc, 5), _mm256_slli_epi32(vc, 2));
            const __m256i dm    = _mm256_mask_i32gather_epi32(_mm256_setzero_si256(), (const int *) w, voff, valid, 4);
            const __m256i v     = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(dm, dm_idx), 0xD8);
            const __m256  d     = _mm256_cvtph_ps(_mm256_castsi256_si128(v));
            const __m256  dn    = _mm256_cvtph_ps(_mm256_extracti128_si256(v, 1));
            for (int t = 0; t < nt; ++t) {
                const __m256 xx = dense ? _mm256_maskload_ps(x + t*ldx + kg + c, valid)
                                        : _mm256_mask_i32gather_ps(_mm256_setzero_ps(), x + t*ldx, vc, _mm256_castsi256_ps(valid), 4);
                _mm256_store_ps(xd[t] + c, _mm256_mul_ps(xx, d));
                _mm256_store_ps(xm[t] + c, _mm256_mul_ps(xx, dn));
            }
        }

        // coefficients per chunk, token and sub-block s: c = round(xd*sc / S_s) with S_s from the largest
        // |xd*sc| of the chunk, so every sub-block uses the full s8 range whatever its 6-bit scales:
        //   xq = round(xd * 32767/amax) (s16), pw = round(xq*sc/64) (s16, mulhrs), c = round(pw * R_s / 2^15)
        // with R_s = floor(127 * 2^15 / max |pw|). The mins use s16 xm with their own scale.
        for (int ch = 0; ch < nch; ++ch) {
            for (int t = 0; t < nt; ++t) {
                const float amax = zz_amax16(xd[t] + ch*ZZ_CHUNK);
                const float mmax = zz_amax16(xm[t] + ch*ZZ_CHUNK);
                sa[t][ch] = amax;
                sm[t][ch] = mmax/32767.0f;
                zz_round16_i16(xd[t] + ch*ZZ_CHUNK, amax > 0.0f ? 32767.0f/amax : 0.0f, (int16_t *) (fq[t] + ch*ZZ_CHUNK/2));
                zz_round16_i16(xm[t] + ch*ZZ_CHUNK, mmax > 0.0f ? 32767.0f/mmax : 0.0f, (int16_t *) (mq[t] + ch*ZZ_CHUNK/2));
            }
        }

        for (int ch = 0; ch < nch; ++ch) {
            __m256i macc[ZZ_MAX_T];
            __m256i pmax[ZZ_MAX_T];
            for (int t = 0; t < nt; ++t) {
                macc[t] = _mm256_setzero_si256();
                pmax[t] = _mm256_setzero_si256();
            }
            const int p0 = ch*ZZ_CHUNK/2;
            const int pn = quad ? 2*((ncol + 3)/4) : (ncol + 1)/2;
            const int p1 = pn < p0 + ZZ_CHUNK/2 ? pn : p0 + ZZ_CHUNK/2;
            for (int p = p0; p < p1; ++p) {
                // blocks ZZ_PF_DIST columns ahead are fetched here, spread over the pair loop: the
                // hardware prefetchers do not keep up with scattered (sparse) or gather-led (dense) access
                if (dense) {
                    if (ZZ_PF_DENSE != 1) {
                        // contiguous: the hardware prefetchers follow
                    } else {
                    const char * pa = (const char *) (w + kg + ZZ_PF_DIST + 2*p);
                    _mm_prefetch(pa,       _MM_HINT_T0);
                    _mm_prefetch(pa +  64, _MM_HINT_T0);
                    _mm_prefetch(pa + 128, _MM_HINT_T0);
                    _mm_prefetch(pa + 192, _MM_HINT_T0);
                    _mm_prefetch(pa + 256, _MM_HINT_T0);
                    }
                } else if (!ZZ_PF_SPREAD && kg + ZZ_PF_DIST + 2*p + 1 < k1) {
                    const char * pa = (const char *) (w + cols[kg + ZZ_PF_DIST + 2*p + 0]);
                    const char * pb = (const char *) (w + cols[kg + ZZ_PF_DIST + 2*p + 1]);
                    _mm_prefetch(pa, ZZ_PF_HINT); _mm_prefetch(pa + 64, ZZ_PF_HINT); _mm_prefetch(pa + 128, ZZ_PF_HINT);
                    _mm_prefetch(pb, ZZ_PF_HINT); _mm_prefetch(pb + 64, ZZ_PF_HINT); _mm_prefetch(pb + 128, ZZ_PF_HINT);
                }
                const __m256i smv = zz_q4_K_scales_mins_x2(ZZ_BLK(2*p), ZZ_BLK(2*p + 1));
                // words (a_s, b_s): lane 0 holds s = 0..3, lane 1 s = 4..7
                const __m256i pr  = _mm256_shuffle_epi8(_mm256_permute4x64_epi64(smv, 0xD8), pair_idx);
                const __m256i sc9 = _mm256_slli_epi16(_mm256_cvtepu8_epi16(_mm256_castsi256_si128(pr)), 9);
                const __m256i mw  = _mm256_cvtepu8_epi16(_mm256_extracti128_si256(pr, 1));
                for (int t = 0; t < nt; ++t) {
                    const __m256i pw = _mm256_mulhrs_epi16(sc9, _mm256_set1_epi32(fq[t][p]));
                    _mm256_store_si256((__m256i *) coef[t][p], pw);
                    pmax[t] = _mm256_max_epi16(pmax[t], _mm256_abs_epi16(pw));
                    macc[t] = _mm256_add_epi32(macc[t], _mm256_madd_epi16(mw, _mm256_set1_epi32(mq[t][p])));
                }
            }
            for (int t = 0; t < nt; ++t) {
                vmin[t] = _mm256_fmadd_ps(_mm256_set1_ps(sm[t][ch]), _mm256_cvtepi32_ps(macc[t]), vmin[t]);

                // per sub-block max of the pair words, R_s, and the flush scale S_s = 2^15*64*amax/(R_s*32767)
                const __m256i mx = _mm256_and_si256(_mm256_max_epi16(pmax[t], _mm256_srli_epi32(pmax[t], 16)), _mm256_set1_epi32(0xFFFF));
                const __m256  mf = _mm256_cvtepi32_ps(mx);
                const __m256  rf = _mm256_floor_ps(_mm256_mul_ps(_mm256_set1_ps(127.0f*32768.0f), zz_rcp(_mm256_max_ps(mf, _mm256_set1_ps(127.0f)))));
                const __m256i ri = _mm256_cvtps_epi32(rf);
                _mm256_store_ps(sf[t][ch], _mm256_mul_ps(_mm256_set1_ps(32768.0f*64.0f*sa[t][ch]/32767.0f), zz_rcp(rf)));
                const __m256i rw = _mm256_or_si256(ri, _mm256_slli_epi32(ri, 16));
#if ZZ_ROW_VNNI
                if (quad) {
                    zz_q4_K_quad_coefs((const int32_t (*)[8]) coef[0][p0], (p1 - p0)/2, rw, cqa + ch*ZZ_CHUNK/4);
                    continue;
                }
#endif
                for (int p = p0; p < p1; ++p) {
                    const __m256i cw = _mm256_mulhrs_epi16(_mm256_load_si256((const __m256i *) coef[t][p]), rw);
                    const __m256i cb = _mm256_packs_epi16(cw, cw);
                    _mm256_store_si256((__m256i *) coef[t][p], _mm256_unpacklo_epi16(cb, cb));
                }
            }
        }

#if ZZ_ROW_VNNI
        for (int ch = 0; quad && ch < nch; ++ch) {
            const int nq = (ncol - ch*ZZ_CHUNK + 3)/4 < ZZ_CHUNK/4 ? (ncol - ch*ZZ_CHUNK + 3)/4 : ZZ_CHUNK/4;
            const block_q4_K * pf = ZZ_PF_SPREAD && ZZ_PF_DENSE == 2 ? w + kg + ch*ZZ_CHUNK + ZZ_PF_DIST : NULL;
            const bool full = ncol >= (ch + 1)*ZZ_CHUNK;
            zz_q4_K_row_vnni(blk + ch*ZZ_CHUNK, full ? w + kg + ch*ZZ_CHUNK : NULL, nq, (const int32_t (*)[8]) cqa[ch*ZZ_CHUNK/4], sf[0][ch], pf, acc[0]);
        }
#endif
        // int16 sums over a chunk's pairs; sub-blocks 2sp (low nibbles) and 2sp+1 (high) share qs[32sp ..]
        for (int ch = 0; !quad && nt == 1 && ch < nch; ++ch) {
            // one token: the same with the sums in registers
            const int p0 = ch*ZZ_CHUNK/2;
            const int p1 = (ncol + 1)/2 < p0 + ZZ_CHUNK/2 ? (ncol + 1)/2 : p0 + ZZ_CHUNK/2;
            for (int sp = 0; sp < QK_K/64; ++sp) {
                if (ZZ_PF_SPREAD && dense && ZZ_PF_DENSE == 2) {
                    zz_q4_K_pf_dense(w + kg + ch*ZZ_CHUNK + ZZ_PF_DIST, sp);
                }
                if (ZZ_PF_SPREAD && !dense) {
                    // scattered blocks ZZ_PF_DIST list entries ahead, a few between each batch of products:
                    // a burst of prefetches at the start of a group overflows the miss buffers and is lost
                    const int64_t ka = kg + ch*ZZ_CHUNK + sp*(ZZ_CHUNK/4) + ZZ_PF_DIST;
                    if (ZZ_PF_RANGE > 0 && ka + ZZ_CHUNK/4 < k1 &&
                        cols[ka + ZZ_CHUNK/4] - cols[ka] <= ZZ_PF_RANGE*(ZZ_CHUNK/4)) {
                        // dense enough: the whole span, as one stream
                        const char * pa = (const char *) (w + cols[ka]);
                        const char * pb = (const char *) (w + cols[ka + ZZ_CHUNK/4]);
                        for (; pa < pb; pa += 64) {
                            _mm_prefetch(pa, ZZ_PF_HINT);
                        }
                    } else {
                        for (int q = 0; q < ZZ_CHUNK/4; ++q) {
                            const int64_t kk = ka + q;
                            if (kk < k1) {
                                const char * pa = (const char *) (w + cols[kk]);
                                _mm_prefetch(pa, ZZ_PF_HINT); _mm_prefetch(pa + 64, ZZ_PF_HINT); _mm_prefetch(pa + 128, ZZ_PF_HINT);
                            }
                        }
                    }
                }
                __m256i s0 = _mm256_setzero_si256();
                __m256i s1 = _mm256_setzero_si256();
                __m256i s2 = _mm256_setzero_si256();
                __m256i s3 = _mm256_setzero_si256();
                if (dense && ncol >= (ch + 1)*ZZ_CHUNK) {
                    // contiguous full chunk (no padding column): blocks at fixed offsets, no pointer loads
                    zz_q4_K_sums_t1(NULL, w + kg + 2*p0, 1, ZZ_CHUNK/2, coef[0][p0] + 2*sp, sp, &s0, &s1, &s2, &s3);
                } else {
                    zz_q4_K_sums_t1(blk + 2*p0, NULL, 1, p1 - p0, coef[0][p0] + 2*sp, sp, &s0, &s1, &s2, &s3);
                }
                const __m256 sl = _mm256_set1_ps(sf[0][ch][2*sp + 0]);
                const __m256 su = _mm256_set1_ps(sf[0][ch][2*sp + 1]);
                float * yo = acc[0] + 64*sp;
                zz_flush_i16_eo(yo +  0, s0, sl);
                zz_flush_i16_eo(yo + 16, s1, sl);
                zz_flush_i16_eo(yo + 32, s2, su);
                zz_flush_i16_eo(yo + 48, s3, su);
            }
        }
        for (int ch = 0; nt > 1 && ch < nch; ++ch) {
            const int p0 = ch*ZZ_CHUNK/2;
            const int p1 = (ncol + 1)/2 < p0 + ZZ_CHUNK/2 ? (ncol + 1)/2 : p0 + ZZ_CHUNK/2;
            for (int sp = 0; sp < QK_K/64; ++sp) {
                __m256i a16[ZZ_MAX_T][4];
                for (int t = 0; t < nt; ++t) {
                    for (int q = 0; q < 4; ++q) {
                        a16[t][q] = _mm256_setzero_si256();
                    }
                }
                for (int p = p0; p < p1; ++p) {
                    zz_q4_K_pair_step(ZZ_BLK(2*p + 0)->qs, ZZ_BLK(2*p + 1)->qs, &coef[0][p][0], (NG/2)*8, sp, nt, a16);
                }
                for (int t = 0; t < nt; ++t) {
                    const __m256 sl = _mm256_set1_ps(sf[t][ch][2*sp + 0]);
                    const __m256 su = _mm256_set1_ps(sf[t][ch][2*sp + 1]);
                    float * yo = acc[t] + 64*sp;
                    zz_flush_i16_eo(yo +  0, a16[t][0], sl);
                    zz_flush_i16_eo(yo + 16, a16[t][1], sl);
                    zz_flush_i16_eo(yo + 32, a16[t][2], su);
                    zz_flush_i16_eo(yo + 48, a16[t][3], su);
                }
            }
        }
        #undef ZZ_BLK
    }

    for (int t = 0; t < nt; ++t) {
        float mins[8];
        _mm256_storeu_ps(mins, vmin[t]);
        float * yt = y + t*ldy;
        for (int i = 0; i < QK_K; ++i) {
#if ZZ_ROW_VNNI
            const int o = (i & ~63) + (quad ? zz_q4_K_quad_slot_out : zz_q4_K_slot_out)[i & 63];
#else
            const int o = (i & ~63) + zz_q4_K_slot_out[i & 63];
#endif
            yt[o] = acc[t][i] - mins[o >> 5];
        }
    }
}

// the row layout's one-token dense columns on VNNI quads (ZZ_ROW_VNNI builds); LLAMA_SPARSE_CPU_ROW_VNNI=0 keeps
// maddubs pairs (benchmarks)
static bool zz_row_vnni(void) {
    static int env = -1; // benign race: every thread computes the same value
    if (env < 0) {
        const char * e = getenv("LLAMA_SPARSE_CPU_ROW_VNNI");
        env = ZZ_ROW_VNNI && (e == NULL || strcmp(e, "0") != 0);
    }
    return env;
}

static void zz_gemv_q4_K(const void * wrow, const int32_t * cols, int64_t k0, int64_t k1,
                         const float * x, int64_t ldx, int nt, float * y, int64_t ldy) {
    // constant nt = 1 keeps the accumulators in registers; dense columns need no index loads
    if (nt == 1) {
        if (cols == NULL && zz_row_vnni()) {
            zz_q4_K_impl(wrow, NULL, k0, k1, x, ldx, 1, true,  true,  y, ldy);
        } else if (cols == NULL) {
            zz_q4_K_impl(wrow, NULL, k0, k1, x, ldx, 1, true,  false, y, ldy);
        } else {
            zz_q4_K_impl(wrow, cols, k0, k1, x, ldx, 1, false, false, y, ldy);
        }
    } else {
        zz_q4_K_impl(wrow, cols, k0, k1, x, ldx, nt, cols == NULL, false, y, ldy);
    }
}

//
// Q4_K, column-major layout: block (r, j) at w[j*nr + r], so each column's blocks of all block-rows form
// one contiguous run (nr*144 bytes) and a skipped column skips the whole run. One chunk of 16 list
// entries is walked block-row by block-row (16 concurrent runs), accumulating into every block-row's
// outputs, kept in slot order in y until the end: one thread puts them in order itself, with several threads
// each leaves its partial y raw and zz_q4_K_cm_reduce sums the partials and orders them, each thread for its
// own block-rows.
//

// software prefetch. Mode 1: the chunk ZZ_CM_PFC chunks ahead, spread over this chunk's block-rows: contiguous
// columns (dense) as one linear sweep, scattered runs block-row by block-row. Mode 2 (default): block-rows
// ZZ_CM_PFD ahead in the chunk's own columns; paired against mode 1 (2 threads, cold) 0.99-1.13x as fast dense,
// 1.1-1.4x (fastest) at 50 % on 11008x4096, 1.01-1.03x on 4096x11008 (bench/results/gemv_cpu_pf2_2026-11-23.md). Needed for dense too:
// with the hardware prefetchers alone it ran at 0.6-0.8x the row layout (0: none;
// bench/results/gemv_cpu_colmajor_2026-11-23.md)
#ifndef ZZ_CM_PF
#define ZZ_CM_PF 2
#endif

#ifndef ZZ_CM_PFC
#define ZZ_CM_PFC 1
#endif

// mode 2: block-rows ZZ_CM_PFD ahead of the current one in the chunk's own columns (then the next chunk's).
// With T1 prefetches, 8 against 4 (paired, 2 threads, cold, 3 shapes): 0.90-0.97x the time dense, 0.91-0.96x at
// 50 %; 12 alike, 16 no better (with T0, 4 and 8 had measured alike)
#ifndef ZZ_CM_PFD
#define ZZ_CM_PFD 8
#endif

// into L2 only (T1): paired against T0 (2 threads, cold, 2 runs of 3 shapes) 1.12-1.33x as fast dense and
// 1.14-1.26x at 50 % on a Zen 4 EPYC (L2 1 MiB), T2 alike (bench/results/gemv_cpu_pfhint_2026-11-23.md): the
// prefetches presumably stop competing with the 16 streams' demand loads for L1 miss buffers
#ifndef ZZ_CM_PF_HINT
#define ZZ_CM_PF_HINT _MM_HINT_T1
#endif

// dense one-token chunks: the strided pair products (maddubs), or the scattered-column path, which runs VNNI quads.
// Quads take 8 shuffles per 4 columns where pairs take 4 unpacks: Zen 4 has two shuffle pipes, Intel's cores one.
// On a 2-core Zen 4 guest the quads decoded a 4-layer 7B-shaped model 1.08-1.25x as fast dense (best of the rounds
// of three runs, bench/results/cpu_zen4_2026-12-06.md), so AMD CPUs take them; others keep the pairs (not measured
// against quads on Intel).
// LLAMA_SPARSE_CPU_CM_STRIDED=0/1 or -DZZ_CM_STRIDED=0/1 overrides
static bool zz_cm_strided(void) {
    static int v = -1; // benign race: every thread computes the same value
    if (v < 0) {
        const char * e = getenv("LLAMA_SPARSE_CPU_CM_STRIDED");
#if defined(ZZ_CM_STRIDED)
        const int def = ZZ_CM_STRIDED;
#elif ZZ_CM_VNNI && defined(__GNUC__)
        __builtin_cpu_init();
        const int def = !__builtin_cpu_is("amd");
#else
        const int def = 1;
#endif
        v = e != NULL ? atoi(e) != 0 : def;
    }
    return v != 0;
}

// unroll factors of the column-major loops over a chunk's 8 column pairs: contiguous (strided) products,
// scattered (pointer) products and the coefficients. Rolled (1) costs loop overhead, fully unrolled (8) the
// strided addresses are hoisted and spilled (1.2x the time of 2 or 4 in L2, 1 thread)
#ifndef ZZ_CM_UNROLL_S
#define ZZ_CM_UNROLL_S 2
#endif
#ifndef ZZ_CM_UNROLL
#define ZZ_CM_UNROLL 4
#endif

// zz_q4_K_sums_t1 over 8 pairs of blocks ws bytes apart from wb
ZZ_INLINE void zz_q4_K_sums_t1_strided(const char * wb, size_t ws, const int32_t * cf, int sp,
                                       __m256i * s0, __m256i * s1, __m256i * s2, __m256i * s3) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256i a0 = *s0, a1 = *s1, a2 = *s2, a3 = *s3;
    const char * pa = wb + offsetof(block_q4_K, qs) + 32*sp;
    ZZ_UNROLL(ZZ_CM_UNROLL_S)
    for (int p = 0; p < ZZ_CHUNK/2; ++p, pa += 2*ws) {
        const __m256i qa = _mm256_loadu_si256((const __m256i *) pa);
        const __m256i qb = _mm256_loadu_si256((const __m256i *) (pa + ws));
        const __m256i u0 = _mm256_unpacklo_epi8(qa, qb);
        const __m256i u1 = _mm256_unpackhi_epi8(qa, qb);
        const __m256i cl = _mm256_set1_epi32(cf[8*p + 0]);
        const __m256i cu = _mm256_set1_epi32(cf[8*p + 1]);
        a0 = _mm256_add_epi16(_mm256_maddubs_epi16(_mm256_and_si256(u0, m4), cl), a0);
        a1 = _mm256_add_epi16(_mm256_maddubs_epi16(_mm256_and_si256(u1, m4), cl), a1);
        a2 = _mm256_add_epi16(_mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(u0, 4), m4), cu), a2);
        a3 = _mm256_add_epi16(_mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(u1, 4), m4), cu), a3);
    }
    *s0 = a0; *s1 = a1; *s2 = a2; *s3 = a3;
}

// the same over np pairs of blocks at bp[c] + roff bytes (each column's block of the current block-row)
ZZ_INLINE void zz_q4_K_sums_t1_ptr(const block_q4_K * const * bp, size_t roff, const int np, const int32_t * cf, int sp,
                                   __m256i * s0, __m256i * s1, __m256i * s2, __m256i * s3) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256i a0 = *s0, a1 = *s1, a2 = *s2, a3 = *s3;
    const size_t off = roff + offsetof(block_q4_K, qs) + 32*sp;
    ZZ_UNROLL(ZZ_CM_UNROLL)
    for (int p = 0; p < np; ++p) {
        const __m256i qa = _mm256_loadu_si256((const __m256i *) ((const char *) bp[2*p + 0] + off));
        const __m256i qb = _mm256_loadu_si256((const __m256i *) ((const char *) bp[2*p + 1] + off));
        const __m256i u0 = _mm256_unpacklo_epi8(qa, qb);
        const __m256i u1 = _mm256_unpackhi_epi8(qa, qb);
        const __m256i cl = _mm256_set1_epi32(cf[8*p + 0]);
        const __m256i cu = _mm256_set1_epi32(cf[8*p + 1]);
        a0 = _mm256_add_epi16(_mm256_maddubs_epi16(_mm256_and_si256(u0, m4), cl), a0);
        a1 = _mm256_add_epi16(_mm256_maddubs_epi16(_mm256_and_si256(u1, m4), cl), a1);
        a2 = _mm256_add_epi16(_mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(u0, 4), m4), cu), a2);
        a3 = _mm256_add_epi16(_mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(u1, 4), m4), cu), a3);
    }
    *s0 = a0; *s1 = a1; *s2 = a2; *s3 = a3;
}

// the batch path's int16 sums into the quad slot order: y[0..7] += s*words 0..3 of each lane, y[8..15] += s*words 4..7
#if ZZ_CM_VNNI
ZZ_INLINE void zz_flush_i16_cm(float * yv, __m256i v, __m256 s) {
    const __m256 f0 = _mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_unpacklo_epi16(v, v), 16));
    const __m256 f1 = _mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_unpackhi_epi16(v, v), 16));
    _mm256_storeu_ps(yv + 0, _mm256_fmadd_ps(s, f0, _mm256_loadu_ps(yv + 0)));
    _mm256_storeu_ps(yv + 8, _mm256_fmadd_ps(s, f1, _mm256_loadu_ps(yv + 8)));
}
#define zz_q4_K_cm_slot_out zz_q4_K_quad_slot_out
#else
#define zz_q4_K_cm_slot_out zz_q4_K_slot_out
#define zz_flush_i16_cm     zz_flush_i16_eo_u
#endif

// lines of a full contiguous chunk prefetched per batch of products (a chunk over nr block-rows, 4 batches each)
#define ZZ_CM_PF_LINES ((int) (ZZ_CHUNK*sizeof(block_q4_K)/4/64))
static_assert(ZZ_CHUNK*sizeof(block_q4_K) % (4*64) == 0, "a chunk's block-row is a whole number of lines per batch");

// the next chunk's prefetch, issued a quarter per batch of products: dense (lin != NULL) as one linear sweep of
// ZZ_CM_PF_LINES lines per batch over the contiguous next chunk (for a shorter last chunk it runs past the
// list's end: prefetches never fault); scattered (cols: the next chunk's columns) either (ZZ_CM_PF 1) as
// block r of 4 columns, the lines at +0, +64, +128 (a 144-byte block's last line is the next block's first),
// or (ZZ_CM_PF 3) in run order, column after column, an even share of their lines per batch
struct zz_cm_pf {
    const char * lin;
    const block_q4_K * const * cols;
    int      c, nc;       // run order: current column, columns
    int64_t  k, nl;       // line within the current column's run, its lines
    const char * base;    // the run's first line
    size_t   runb;        // bytes of a run (nr blocks)
    int64_t  q, rem, acc, S; // lines per batch: q, plus one more for rem of every S batches
};

ZZ_INLINE void zz_cm_pf_col(struct zz_cm_pf * pf) {
    const uintptr_t st = (uintptr_t) pf->cols[pf->c];
    pf->base = (const char *) (st & ~(uintptr_t) 63);
    pf->nl   = (int64_t) (((st + pf->runb - 1) >> 6) - (st >> 6) + 1);
    pf->k    = 0;
}

ZZ_INLINE void zz_cm_pf_init(struct zz_cm_pf * pf, const char * lin, const block_q4_K * const * cols, int nc, int64_t nr) {
    pf->lin  = lin;
    pf->cols = cols;
    pf->nc   = cols ? nc : 0;
    pf->c    = 0;
    pf->runb = nr*sizeof(block_q4_K);
    pf->k = pf->nl = pf->q = pf->rem = pf->acc = 0;
    pf->S = 1;
    pf->base = NULL;
    if (ZZ_CM_PF == 3 && pf->nc > 0) {
        zz_cm_pf_col(pf);
        const int64_t total = nc*(int64_t) ((pf->runb + 63)/64 + 1); // an upper bound on the lines
        pf->S   = 4*nr;
        pf->q   = total/pf->S;
        pf->rem = total%pf->S;
        pf->acc = 0;
    }
}

ZZ_INLINE void zz_q4_K_cm_prefetch(struct zz_cm_pf * pf, int64_t r, int sp, const block_q4_K * const * cb, int64_t nr) {
    if (!ZZ_CM_PF) {
        return;
    }
    if (pf->lin) {
        const char * p = pf->lin;
        ZZ_UNROLL(16)
        for (int l = 0; l < ZZ_CM_PF_LINES; ++l) {
            _mm_prefetch(p + 64*l, ZZ_CM_PF_HINT);
        }
        pf->lin = p + 64*ZZ_CM_PF_LINES;
        return;
    }
    if (ZZ_CM_PF == 2) {
        const int64_t rr = r + ZZ_CM_PFD;
        const block_q4_K * const * pc = rr < nr ? cb : pf->cols;
        const int64_t rb = rr < nr ? rr : rr - nr;
        if (pc && rb < nr) {
            ZZ_UNROLL(4)
            for (int c = 4*sp; c < 4*sp + 4; ++c) {
                const char * pb = (const char *) (pc[c] + rb);
                _mm_prefetch(pb, ZZ_CM_PF_HINT); _mm_prefetch(pb + 64, ZZ_CM_PF_HINT); _mm_prefetch(pb + 128, ZZ_CM_PF_HINT);
            }
        }
        return;
    }
    if (ZZ_CM_PF == 3) {
        int64_t n = pf->q;
        pf->acc += pf->rem;
        if (pf->acc >= pf->S) {
            pf->acc -= pf->S;
            ++n;
        }
        while (n > 0 && pf->c < pf->nc) {
            const int64_t take = n < pf->nl - pf->k ? n : pf->nl - pf->k;
            const char * p = pf->base + 64*pf->k;
            for (int64_t l = 0; l < take; ++l) {
                _mm_prefetch(p + 64*l, ZZ_CM_PF_HINT);
            }
            pf->k += take;
            n     -= take;
            if (pf->k == pf->nl && ++pf->c < pf->nc) {
                zz_cm_pf_col(pf);
            }
        }
        return;
    }
    if (pf->cols) {
        ZZ_UNROLL(4)
        for (int c = 4*sp; c < 4*sp + 4; ++c) {
            const char * pb = (const char *) (pf->cols[c] + r);
            _mm_prefetch(pb, ZZ_CM_PF_HINT); _mm_prefetch(pb + 64, ZZ_CM_PF_HINT); _mm_prefetch(pb + 128, ZZ_CM_PF_HINT);
        }
    }
}

#if ZZ_CM_VNNI
// one token, one block-row r of a chunk of scattered columns (cb[c] + roff): for each 32-byte run sp, the
// products of the nq column quads with their coefficients cq (8 dwords a quad: 2sp low, 2sp + 1 high), flushed as
// y (slot order) += sf * sums; the prefetches go along. Not inlined: in the chunk loop GCC kept the eight sums in
// stack slots (a store-forward per product, 1.25x the time)
static __attribute__((noinline)) void zz_q4_K_cm_row_vnni(const block_q4_K * const * cb, size_t roff, int nq,
        const int32_t (* cq)[8], const float * sf, struct zz_cm_pf * pf, int64_t r, int64_t nr, float * yr) {
    ZZ_UNROLL(1)
    for (int sp = 0; sp < QK_K/64; ++sp) {
        zz_q4_K_cm_prefetch(pf, r, sp, cb, nr);
        zz_q4_K_quad_run(cb, NULL, roff, nq, cq, sp, _mm256_set1_ps(sf[2*sp + 0]), _mm256_set1_ps(sf[2*sp + 1]), yr + 64*sp);
    }
}
#endif

// batch (T > 1) VNNI on zmm: a column quad's 32-byte run widens to four zmm of (a_l, b_l, c_l, d_l) dwords, low
// nibbles in the lower half and high ones (x16, masked in place) in the upper, so one vpdpbusd takes a quad's low
// and high coefficients at once; the sums of up to four tokens stay in registers (the maddubs batch path kept them
// in stack slots: a load and a store per product). Accumulator slot i = 16k + 8h + 4L + e holds output
// 32h + 16L + 4k + e (dword e < 4 of lane L of w_k, h = 1: high nibbles). The integer sums are those of the
// maddubs path, so results match it bit for bit
#if !defined(ZZ_BATCH_VNNI) && ZZ_CM_VNNI && defined(__AVX512F__) && defined(__AVX512BW__)
#define ZZ_BATCH_VNNI 1
#endif
#if ZZ_BATCH_VNNI
static const uint8_t zz_q4_K_bq_slot_out[64] = {
     0,  1,  2,  3, 16, 17, 18, 19, 32, 33, 34, 35, 48, 49, 50, 51,
     4,  5,  6,  7, 20, 21, 22, 23, 36, 37, 38, 39, 52, 53, 54, 55,
     8,  9, 10, 11, 24, 25, 26, 27, 40, 41, 42, 43, 56, 57, 58, 59,
    12, 13, 14, 15, 28, 29, 30, 31, 44, 45, 46, 47, 60, 61, 62, 63,
};

// tokens t < G (G constant: 2..4), run sp of the nq quads of block-row roff (cb[c] + roff): y + t*ldy + 64*sp
// (batch slot order) += the products with the quads' coefficients cq[t][q] (8 dwords: 2sp low, 2sp + 1 high)
// times sf[t][2sp] (low) and sf[t][2sp + 1]/16 (high)
ZZ_INLINE void zz_q4_K_bq_run(const block_q4_K * const * cb, size_t roff, int nq, const int32_t (* cq)[ZZ_CHUNK/4][8],
                              const float (* sf)[8], int sp, const int G, float * y, int64_t ldy) {
    const __m512i mk   = _mm512_inserti64x4(_mm512_set1_epi8(0x0F), _mm256_set1_epi8((char) 0xF0), 1);
    const __m512i cidx = _mm512_inserti64x4(_mm512_set1_epi32(2*sp), _mm256_set1_epi32(2*sp + 1), 1);
    __m512i acc[4][4];
    for (int t = 0; t < G; ++t) {
        for (int k = 0; k < 4; ++k) {
            acc[t][k] = _mm512_setzero_si512();
        }
    }
    const size_t off = roff + offsetof(block_q4_K, qs) + 32*sp;
    ZZ_UNROLL(1)
    for (int q = 0; q < nq; ++q) {
        #define ZZ_BQ_LD(i) _mm256_loadu_si256((const __m256i *) ((const char *) cb[4*q + (i)] + off))
        const __m256i A = ZZ_BQ_LD(0), B = ZZ_BQ_LD(1), C = ZZ_BQ_LD(2), D = ZZ_BQ_LD(3);
        #undef ZZ_BQ_LD
        const __m256i ab0 = _mm256_unpacklo_epi8(A, B), ab1 = _mm256_unpackhi_epi8(A, B);
        const __m256i cd0 = _mm256_unpacklo_epi8(C, D), cd1 = _mm256_unpackhi_epi8(C, D);
        __m512i z[4];
        #define ZZ_BQ_W(k, v) z[k] = _mm512_and_si512(_mm512_inserti64x4(_mm512_castsi256_si512(v), v, 1), mk)
        ZZ_BQ_W(0, _mm256_unpacklo_epi16(ab0, cd0)); ZZ_BQ_W(1, _mm256_unpackhi_epi16(ab0, cd0));
        ZZ_BQ_W(2, _mm256_unpacklo_epi16(ab1, cd1)); ZZ_BQ_W(3, _mm256_unpackhi_epi16(ab1, cd1));
        #undef ZZ_BQ_W
        for (int t = 0; t < G; ++t) {
            // the upper half of the cast is undefined, and never read: the indices are below 8
            const __m512i c = _mm512_permutexvar_epi32(cidx, _mm512_castsi256_si512(_mm256_load_si256((const __m256i *) cq[t][q])));
            for (int k = 0; k < 4; ++k) {
                acc[t][k] = _mm512_dpbusd_epi32(acc[t][k], z[k], c);
            }
        }
    }
    for (int t = 0; t < G; ++t) {
        const __m512 sc = _mm512_insertf32x8(_mm512_set1_ps(sf[t][2*sp]), _mm256_set1_ps(sf[t][2*sp + 1]*(1.0f/16.0f)), 1);
        float * yo = y + t*ldy + 64*sp;
        for (int k = 0; k < 4; ++k) {
            _mm512_storeu_ps(yo + 16*k, _mm512_fmadd_ps(sc, _mm512_cvtepi32_ps(acc[t][k]), _mm512_loadu_ps(yo + 16*k)));
        }
    }
}

// nt > 1 tokens, one block-row r: every run sp (with its prefetches) for balanced groups of two to four tokens
static __attribute__((noinline)) void zz_q4_K_cm_row_bq(const block_q4_K * const * cb, size_t roff, int nq,
        const int32_t (* cq)[ZZ_CHUNK/4][8], const float (* sf)[8], int nt, struct zz_cm_pf * pf, int64_t r, int64_t nr,
        float * yr, int64_t ldy) {
    const int ng = (nt + 3)/4;
    ZZ_UNROLL(1)
    for (int sp = 0; sp < QK_K/64; ++sp) {
        zz_q4_K_cm_prefetch(pf, r, sp, cb, nr);
        for (int g = 0, t0 = 0; g < ng; ++g) {
            const int t1 = nt*(g + 1)/ng;
            switch (t1 - t0) {
                case 2: zz_q4_K_bq_run(cb, roff, nq, cq + t0, sf + t0, sp, 2, yr + t0*ldy, ldy); break;
                case 3: zz_q4_K_bq_run(cb, roff, nq, cq + t0, sf + t0, sp, 3, yr + t0*ldy, ldy); break;
                default: zz_q4_K_bq_run(cb, roff, nq, cq + t0, sf + t0, sp, 4, yr + t0*ldy, ldy); break;
            }
            t0 = t1;
        }
    }
}
#else
#undef  ZZ_BATCH_VNNI
#define ZZ_BATCH_VNNI 0
#define zz_q4_K_bq_slot_out zz_q4_K_cm_slot_out
#endif

// batch without VNNI (maddubs): tokens t < G (constant), run sp of np column pairs of block-row roff:
// y + t*ldy + 64*sp (slot order) += the int16 sums with the pairs' coefficients coef[t][p] times sf[t]
ZZ_INLINE void zz_q4_K_cm_pairs_run(const block_q4_K * const * cb, size_t roff, int np, const int32_t (* coef)[ZZ_CHUNK/2][8],
                                    const float (* sf)[8], int sp, const int G, float * y, int64_t ldy) {
    __m256i a16[ZZ_MAX_T][4];
    for (int t = 0; t < G; ++t) {
        for (int q = 0; q < 4; ++q) {
            a16[t][q] = _mm256_setzero_si256();
        }
    }
    for (int p = 0; p < np; ++p) {
        zz_q4_K_pair_step((const uint8_t *) cb[2*p + 0] + roff + offsetof(block_q4_K, qs),
                          (const uint8_t *) cb[2*p + 1] + roff + offsetof(block_q4_K, qs),
                          &coef[0][p][0], (ZZ_CHUNK/2)*8, sp, G, a16);
    }
    for (int t = 0; t < G; ++t) {
        const __m256 sl = _mm256_set1_ps(sf[t][2*sp + 0]);
        const __m256 su = _mm256_set1_ps(sf[t][2*sp + 1]);
        float * yo = y + t*ldy + 64*sp;
        zz_flush_i16_cm(yo +  0, a16[t][0], sl);
        zz_flush_i16_cm(yo + 16, a16[t][1], sl);
        zz_flush_i16_cm(yo + 32, a16[t][2], su);
        zz_flush_i16_cm(yo + 48, a16[t][3], su);
    }
}

// nt > 1 tokens, one block-row r, in pairs of tokens (a lone last one alone): a pair's eight int16 sums and the
// four nibble vectors fit the 16 ymm registers; all nt tokens at once kept the sums in stack slots (a load and a
// store per product)
static __attribute__((noinline)) void zz_q4_K_cm_row_pairs(const block_q4_K * const * cb, size_t roff, int np,
        const int32_t (* coef)[ZZ_CHUNK/2][8], const float (* sf)[8], int nt, struct zz_cm_pf * pf, int64_t r, int64_t nr,
        float * yr, int64_t ldy) {
    ZZ_UNROLL(1)
    for (int sp = 0; sp < QK_K/64; ++sp) {
        zz_q4_K_cm_prefetch(pf, r, sp, cb, nr);
        for (int t0 = 0; t0 < nt; t0 += 2) {
            if (nt - t0 >= 2) {
                zz_q4_K_cm_pairs_run(cb, roff, np, coef + t0, sf + t0, sp, 2, yr + t0*ldy, ldy);
            } else {
                zz_q4_K_cm_pairs_run(cb, roff, np, coef + t0, sf + t0, sp, 1, yr + t0*ldy, ldy);
            }
        }
    }
}

// one chunk of ncol list entries through the nr block-rows: cb: each column's first block (padded to ZZ_CHUNK by
// repeating the last), xs: x per column and token (0 past ncol); contiguous
// columns (strided: dense, one token, ncol = ZZ_CHUNK) are addressed from cb[0] by stride. Accumulates into y
// (slot order) and the min terms into mins; prefetches the next chunk meanwhile (zz_q4_K_cm_prefetch)
ZZ_INLINE void zz_q4_K_cm_chunk(int64_t ldc, int64_t nr, const block_q4_K * const * cb,
                                const float (* xs)[ZZ_CHUNK], const int ncol, const int nt,
                                const bool strided, struct zz_cm_pf * pf,
                                float * y, int64_t ldy, float * mins) {
    enum { NG = ZZ_CHUNK };
    // column pairs; VNNI (one token) works in quads, the padding pair's coefficients are 0 (x = 0)
    const int nq = (ncol + 3)/4;
    // quads: VNNI's one-token path on scattered columns, and its batch path (ZZ_BATCH_VNNI)
    const bool quad = ZZ_CM_VNNI && ((nt == 1 && !strided) || (nt > 1 && ZZ_BATCH_VNNI));
    const int np = quad ? 2*nq : (ncol + 1)/2;

    const __m256i dm_idx   = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15,
                                              0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
    const __m256i pair_idx = _mm256_setr_epi8(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15,
                                              0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);

    float    xd[ZZ_MAX_T][NG]        __attribute__((aligned(32)));
    float    xm[ZZ_MAX_T][NG]        __attribute__((aligned(32)));
    int32_t  fq[ZZ_MAX_T][NG/2]      __attribute__((aligned(32)));
    int32_t  mq[ZZ_MAX_T][NG/2]      __attribute__((aligned(32)));
    int32_t  coef[ZZ_MAX_T][NG/2][8] __attribute__((aligned(32)));
    float    sf[ZZ_MAX_T][8]         __attribute__((aligned(32)));
#if ZZ_CM_VNNI
    int32_t  cq[ZZ_MAX_T][NG/4][8]   __attribute__((aligned(32))); // (c_a, c_b, c_c, c_d) per sub-block
#endif

    const size_t cstride = ldc*sizeof(block_q4_K);

    for (int64_t r = 0; r < nr; ++r) {
        const size_t roff = r*sizeof(block_q4_K);

        // the first 16 bytes of every block of the row (the chunk is padded to NG columns): d/dmin from them here
        // (two 8-lane gathers took ~10 % longer), the scales in the pair loop
        __m256i head[NG/2];
        for (int p = 0; p < NG/2; ++p) {
            const block_q4_K * ba = strided ? (const block_q4_K *) ((const char *) cb[0] + roff + 2*p*cstride)
                                            : (const block_q4_K *) ((const char *) cb[2*p] + roff);
            const block_q4_K * bb = strided ? (const block_q4_K *) ((const char *) ba + cstride)
                                            : (const block_q4_K *) ((const char *) cb[2*p + 1] + roff);
            head[p] = zz_q4_K_heads_x2(ba, bb);
        }
        // xd = x*d, xm = x*dmin
        for (int h = 0; h < 2; ++h) {
            const __m256i dm = zz_q4_K_dm_from_heads(head + 4*h);
            const __m256i v  = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(dm, dm_idx), 0xD8);
            const __m256  d  = _mm256_cvtph_ps(_mm256_castsi256_si128(v));
            const __m256  dn = _mm256_cvtph_ps(_mm256_extracti128_si256(v, 1));
            for (int t = 0; t < nt; ++t) {
                const __m256 xv = _mm256_load_ps(xs[t] + 8*h);
                _mm256_store_ps(xd[t] + 8*h, _mm256_mul_ps(xv, d));
                _mm256_store_ps(xm[t] + 8*h, _mm256_mul_ps(xv, dn));
            }
        }

        // coefficients as in zz_q4_K_impl (one chunk)
        float sa[ZZ_MAX_T], sm[ZZ_MAX_T];
        for (int t = 0; t < nt; ++t) {
            const float amax = zz_amax16(xd[t]);
            const float mmax = zz_amax16(xm[t]);
            sa[t] = amax;
            sm[t] = mmax/32767.0f;
            zz_round16_i16(xd[t], amax > 0.0f ? 32767.0f/amax : 0.0f, (int16_t *) fq[t]);
            zz_round16_i16(xm[t], mmax > 0.0f ? 32767.0f/mmax : 0.0f, (int16_t *) mq[t]);
        }
        __m256i macc[ZZ_MAX_T], pmax[ZZ_MAX_T];
        for (int t = 0; t < nt; ++t) {
            macc[t] = _mm256_setzero_si256();
            pmax[t] = _mm256_setzero_si256();
        }
        ZZ_UNROLL(ZZ_CM_UNROLL)
        for (int p = 0; p < np; ++p) {
            const __m256i smv = zz_q4_K_sm_decode(head[p], 0);
            const __m256i pr  = _mm256_shuffle_epi8(_mm256_permute4x64_epi64(smv, 0xD8), pair_idx);
            const __m256i sc9 = _mm256_slli_epi16(_mm256_cvtepu8_epi16(_mm256_castsi256_si128(pr)), 9);
            const __m256i mw  = _mm256_cvtepu8_epi16(_mm256_extracti128_si256(pr, 1));
            for (int t = 0; t < nt; ++t) {
                const __m256i pw = _mm256_mulhrs_epi16(sc9, _mm256_set1_epi32(fq[t][p]));
                _mm256_store_si256((__m256i *) coef[t][p], pw);
                pmax[t] = _mm256_max_epi16(pmax[t], _mm256_abs_epi16(pw));
                macc[t] = _mm256_add_epi32(macc[t], _mm256_madd_epi16(mw, _mm256_set1_epi32(mq[t][p])));
            }
        }
        for (int t = 0; t < nt; ++t) {
            float * mr = mins + (t*nr + r)*8;
            _mm256_storeu_ps(mr, _mm256_fmadd_ps(_mm256_set1_ps(sm[t]), _mm256_cvtepi32_ps(macc[t]), _mm256_loadu_ps(mr)));
            const __m256i mx = _mm256_and_si256(_mm256_max_epi16(pmax[t], _mm256_srli_epi32(pmax[t], 16)), _mm256_set1_epi32(0xFFFF));
            const __m256  mf = _mm256_cvtepi32_ps(mx);
            const __m256  rf = _mm256_floor_ps(_mm256_mul_ps(_mm256_set1_ps(127.0f*32768.0f), zz_rcp(_mm256_max_ps(mf, _mm256_set1_ps(127.0f)))));
            const __m256i ri = _mm256_cvtps_epi32(rf);
            _mm256_store_ps(sf[t], _mm256_mul_ps(_mm256_set1_ps(32768.0f*64.0f*sa[t]/32767.0f), zz_rcp(rf)));
            const __m256i rw = _mm256_or_si256(ri, _mm256_slli_epi32(ri, 16));
#if ZZ_CM_VNNI
            if (quad) {
                zz_q4_K_quad_coefs((const int32_t (*)[8]) coef[t], nq, rw, cq[t]);
                continue;
            }
#endif
            ZZ_UNROLL(ZZ_CM_UNROLL)
            for (int p = 0; p < np; ++p) {
                const __m256i cw = _mm256_mulhrs_epi16(_mm256_load_si256((const __m256i *) coef[t][p]), rw);
                const __m256i cbb = _mm256_packs_epi16(cw, cw);
                _mm256_store_si256((__m256i *) coef[t][p], _mm256_unpacklo_epi16(cbb, cbb));
            }
        }

#if ZZ_CM_VNNI
        if (nt == 1 && !strided) {
            zz_q4_K_cm_row_vnni(cb, roff, nq, (const int32_t (*)[8]) cq[0], sf[0], pf, r, nr, y + r*QK_K);
        } else
#endif
#if ZZ_BATCH_VNNI
        if (nt > 1) {
            zz_q4_K_cm_row_bq(cb, roff, nq, (const int32_t (*)[NG/4][8]) cq, (const float (*)[8]) sf, nt, pf, r, nr, y + r*QK_K, ldy);
        } else
#endif
        if (nt == 1) {
            float * yr = y + r*QK_K;
            for (int sp = 0; sp < QK_K/64; ++sp) {
                zz_q4_K_cm_prefetch(pf, r, sp, cb, nr);
                __m256i s0 = _mm256_setzero_si256();
                __m256i s1 = _mm256_setzero_si256();
                __m256i s2 = _mm256_setzero_si256();
                __m256i s3 = _mm256_setzero_si256();
                if (strided) {
                    // contiguous columns: blocks ldc apart, addresses without pointer loads
                    zz_q4_K_sums_t1_strided((const char *) cb[0] + roff, cstride, coef[0][0] + 2*sp, sp, &s0, &s1, &s2, &s3);
                } else {
                    zz_q4_K_sums_t1_ptr(cb, roff, np, coef[0][0] + 2*sp, sp, &s0, &s1, &s2, &s3);
                }
                const __m256 sl = _mm256_set1_ps(sf[0][2*sp + 0]);
                const __m256 su = _mm256_set1_ps(sf[0][2*sp + 1]);
                float * yo = yr + 64*sp;
                zz_flush_i16_cm(yo +  0, s0, sl);
                zz_flush_i16_cm(yo + 16, s1, sl);
                zz_flush_i16_cm(yo + 32, s2, su);
                zz_flush_i16_cm(yo + 48, s3, su);
            }
        } else {
            zz_q4_K_cm_row_pairs(cb, roff, np, (const int32_t (*)[NG/2][8]) coef, (const float (*)[8]) sf, nt, pf, r, nr, y + r*QK_K, ldy);
        }
    }
}

// the np raw partials summed, slot order -> output order, minus the summed min terms, block-rows r0 .. r1-1
// (y may be partial 0 itself: each block-row is read whole before it is written)
static void zz_q4_K_cm_reduce(const float * part0, int np, int64_t pstride, int64_t ldp, const float * mins0, int64_t mstride,
                              int64_t nr, int nt, int64_t r0, int64_t r1, float * y, int64_t ldy) {
    const uint8_t * so = ZZ_BATCH_VNNI && nt > 1 ? zz_q4_K_bq_slot_out : zz_q4_K_cm_slot_out;
    for (int t = 0; t < nt; ++t) {
        for (int64_t r = r0; r < r1; ++r) {
            float sum[QK_K] __attribute__((aligned(32)));
            float mr[8]     __attribute__((aligned(32)));
            const float * p0 = part0 + t*ldp + r*QK_K;
            const float * m0 = mins0 + (t*nr + r)*8;
            for (int i = 0; i < QK_K; i += 8) {
                __m256 v = _mm256_loadu_ps(p0 + i);
                for (int p = 1; p < np; ++p) {
                    v = _mm256_add_ps(v, _mm256_loadu_ps(p0 + p*pstride + i));
                }
                _mm256_store_ps(sum + i, v);
            }
            __m256 mv = _mm256_loadu_ps(m0);
            for (int p = 1; p < np; ++p) {
                mv = _mm256_add_ps(mv, _mm256_loadu_ps(m0 + p*mstride));
            }
            _mm256_store_ps(mr, mv);
            float * yr = y + t*ldy + r*QK_K;
            for (int i = 0; i < QK_K; ++i) {
                const int o = (i & ~63) + so[i & 63];
                yr[o] = sum[i] - mr[o >> 5];
            }
        }
    }
}

// y[t*ldy + ...] (nr*256 floats per token) is overwritten; mins: nt*nr*8 floats of scratch; raw: see
// ggml_sparse_zz_gemv_cm_t
ZZ_INLINE void zz_q4_K_cm_impl(const block_q4_K * w, int64_t ldc, int64_t nr, const int32_t * cols, int64_t k0, int64_t k1,
                               const float * x, int64_t ldx, const int nt, const bool dense, float * y, int64_t ldy,
                               float * mins, bool raw) {
    enum { NG = ZZ_CHUNK };

    for (int t = 0; t < nt; ++t) {
        memset(y + t*ldy, 0, (size_t) nr*QK_K*sizeof(float));
    }
    memset(mins, 0, (size_t) nt*nr*8*sizeof(float));

    // per chunk: first block of each column (padding repeats the last), x per column; the next chunk's first
    // blocks for the prefetches
    const block_q4_K * cb[NG], * cb_next[NG];
    const bool strided = dense && nt == 1 && zz_cm_strided(); // full chunks' products

    for (int64_t kg = k0; kg < k1; kg += NG) {
        const int ncol = k1 - kg < NG ? (int) (k1 - kg) : NG;

        float xs[ZZ_MAX_T][NG] __attribute__((aligned(32)));
        for (int c = 0; c < NG; ++c) {
            const int     cc = c < ncol ? c : ncol - 1;
            const int64_t j  = dense ? kg + cc : cols[kg + cc];
            cb[c] = w + j*ldc;
            for (int t = 0; t < nt; ++t) {
                xs[t][c] = c < ncol ? x[t*ldx + j] : 0.0f;
            }
        }
        // the chunk ZZ_CM_PFC chunks ahead: one linear range when contiguous, else its columns' runs
        const int64_t kn = kg + ZZ_CM_PFC*NG;
        const int ncol_next = k1 - kn < NG ? (int) (k1 - kn) : NG;
        const char * pf_lin = NULL;
        const block_q4_K * const * pf_cols = NULL;
        if (ncol_next > 0) {
            if (dense && ldc == nr && ZZ_CM_PF != 2) {
                pf_lin = (const char *) (w + kn*ldc);
            } else {
                for (int c = 0; c < NG; ++c) {
                    cb_next[c] = w + (dense ? kn + c : cols[kn + (c < ncol_next ? c : ncol_next - 1)])*ldc;
                }
                pf_cols = cb_next;
            }
        }

        struct zz_cm_pf pf;
        zz_cm_pf_init(&pf, pf_lin, pf_cols, ncol_next, nr);
        if (ncol == NG) {
            zz_q4_K_cm_chunk(ldc, nr, cb, (const float (*)[NG]) xs, NG, nt, strided, &pf, y, ldy, mins);
        } else {
            zz_q4_K_cm_chunk(ldc, nr, cb, (const float (*)[NG]) xs, ncol, nt, false, &pf, y, ldy, mins);
        }
    }

    if (!raw) {
        zz_q4_K_cm_reduce(y, 1, 0, ldy, mins, 0, nr, nt, 0, nr, y, ldy);
    }
}

static void zz_gemv_cm_q4_K(const void * w, int64_t ldc, int64_t nr, const int32_t * cols, int64_t k0, int64_t k1,
                            const float * x, int64_t ldx, int nt, float * y, int64_t ldy, float * mins, bool raw) {
    if (nt == 1) {
        if (cols == NULL) {
            zz_q4_K_cm_impl(w, ldc, nr, NULL, k0, k1, x, ldx, 1, true,  y, ldy, mins, raw);
        } else {
            zz_q4_K_cm_impl(w, ldc, nr, cols, k0, k1, x, ldx, 1, false, y, ldy, mins, raw);
        }
    } else {
        zz_q4_K_cm_impl(w, ldc, nr, cols, k0, k1, x, ldx, nt, cols == NULL, y, ldy, mins, raw);
    }
}

ggml_sparse_zz_gemv_cm_t ggml_sparse_zz_gemv_cm_x86(enum ggml_type type) {
    return type == GGML_TYPE_Q4_K ? zz_gemv_cm_q4_K : NULL;
}

ggml_sparse_zz_cm_reduce_t ggml_sparse_zz_cm_reduce_x86(enum ggml_type type) {
    return type == GGML_TYPE_Q4_K ? zz_q4_K_cm_reduce : NULL;
}

// the batch kernel's time grows linearly in tokens (the same coefficient and flush work per token); the fp32 GEMM
// dequantizes once for all tokens, so it wins above a crossover. gemm_cpu -L cols (Q4_K, 7B shapes, 2 threads,
// LLAMA_SPARSE_CPU_SLICE_MAX=0 against slices): VNNI 1.13-1.33x the GEMM's speed at 12 tokens, 1.15-1.2x at 16,
// 1.1x at 20, 1.0-1.05x at 24; AVX2 1.5x at 16, 1.3x at 24, 1.05-1.1x at 48, 1.0-1.05x at 64; AVX-512 without
// VNNI (-march=skylake-avx512: the AVX2 batch kernel against the AVX-512 GEMM) 1.2-1.3x at 9, 1.1x at 12, even at 16,
// 0.65-0.8x at 24 (bench/results/gemm_cpu_batch_2026-12-05.md)
#ifndef ZZ_CM_SLICE_MAX
#if ZZ_BATCH_VNNI
#define ZZ_CM_SLICE_MAX 20
#elif defined(__AVX512F__)
#define ZZ_CM_SLICE_MAX 16
#else
#define ZZ_CM_SLICE_MAX 48
#endif
#endif

int ggml_sparse_zz_cm_slice_max_x86(enum ggml_type type) {
    return type == GGML_TYPE_Q4_K ? ZZ_CM_SLICE_MAX : 0;
}

//
// Q4_0, Q8_0, Q6_K: s8 weights, s16 coefficients
//

// signed weights of outputs 32g .. 32g+31 of a block, offsets (-8, -32) applied
ZZ_INLINE __m256i zz_unpack_s8(enum ggml_type type, const void * blk, int g) {
    switch (type) {
        case GGML_TYPE_Q4_0: {
            const __m128i q = _mm_loadu_si128((const __m128i *) ((const block_q4_0 *) blk)->qs);
            const __m256i v = _mm256_and_si256(_mm256_setr_m128i(q, _mm_srli_epi16(q, 4)), _mm256_set1_epi8(0x0F));
            return _mm256_sub_epi8(v, _mm256_set1_epi8(8));
        }
        case GGML_TYPE_Q8_0:
            return _mm256_loadu_si256((const __m256i *) ((const block_q8_0 *) blk)->qs);
        case GGML_TYPE_Q6_K: {
            // group g = (half n, quarter k): low 4 bits from ql (nibble k/2), high 2 bits from qh bits 2k, 2k+1
            const block_q6_K * b = blk;
            const int n = g >> 2;
            const int k = g & 3;
            const __m256i ql = _mm256_loadu_si256((const __m256i *) (b->ql + 64*n + 32*(k & 1)));
            const __m256i qh = _mm256_loadu_si256((const __m256i *) (b->qh + 32*n));
            const __m256i lo = _mm256_and_si256(_mm256_srl_epi16(ql, _mm_cvtsi32_si128(4*(k >> 1))), _mm256_set1_epi8(0x0F));
            const __m256i hi = _mm256_and_si256(_mm256_slli_epi16(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2*k)), 4), _mm256_set1_epi8(0x30));
            return _mm256_sub_epi8(_mm256_or_si256(lo, hi), _mm256_set1_epi8(32));
        }
        default:
            GGML_ABORT("zigzag: unsupported type");
    }
}

ZZ_INLINE void zz_madd_impl(enum ggml_type type, const void * wrow, const int32_t * cols, int64_t k0, int64_t k1,
                            const float * x, int64_t ldx, const int nt, float * y, int64_t ldy) {
    const int    bk = type == GGML_TYPE_Q6_K ? QK_K : 32;
    const size_t bs = type == GGML_TYPE_Q6_K ? sizeof(block_q6_K) : type == GGML_TYPE_Q8_0 ? sizeof(block_q8_0) : sizeof(block_q4_0);

    float acc[ZZ_MAX_T][QK_K] __attribute__((aligned(32)));
    for (int t = 0; t < nt; ++t) {
        memset(acc[t], 0, bk*sizeof(float));
    }

    for (int64_t kc = k0; kc < k1; kc += ZZ_CHUNK) {
        const int nc = k1 - kc < ZZ_CHUNK ? (int) (k1 - kc) : ZZ_CHUNK;
        const int np = (nc + 1)/2;

        const char * blk[ZZ_CHUNK] = { 0 };
        float xd[ZZ_MAX_T][ZZ_CHUNK];
        for (int c = 0; c < nc; ++c) {
            const int64_t j = cols ? cols[kc + c] : kc + c;
            blk[c] = (const char *) wrow + j*bs;
            // Q6_K keeps d at the end of the block: read exactly 2 bytes
            const float d = zz_fp16(type == GGML_TYPE_Q6_K ? &((const block_q6_K *) blk[c])->d : &((const block_q8_0 *) blk[c])->d);
            for (int t = 0; t < nt; ++t) {
                xd[t][c] = x[t*ldx + j]*d;
            }
        }
        if (nc & 1) {
            blk[nc] = blk[nc - 1];
            for (int t = 0; t < nt; ++t) {
                xd[t][nc] = 0.0f;
            }
        }

        // coefficient = round(xd*sc/S) with |sc| <= 128 (1 for Q4_0/Q8_0), S = amax*scmax/32767;
        // cw[t][p][s] packs the s16 coefficients of columns 2p, 2p+1 as one madd pair
        const float scmax = type == GGML_TYPE_Q6_K ? 128.0f : 1.0f;
        float   sf[ZZ_MAX_T];
        int32_t cw[ZZ_MAX_T][ZZ_CHUNK/2][QK_K/16] __attribute__((aligned(32)));
        for (int t = 0; t < nt; ++t) {
            for (int c = 2*np; c < ZZ_CHUNK; ++c) {
                xd[t][c] = 0.0f;
            }
            const float amax = zz_amax16(xd[t]);
            const float inv  = amax > 0.0f ? 32767.0f/(amax*scmax) : 0.0f;
            sf[t] = amax*scmax/32767.0f;
            if (type == GGML_TYPE_Q6_K) {
                for (int p = 0; p < np; ++p) {
                    const block_q6_K * ba = (const block_q6_K *) blk[2*p + 0];
                    const block_q6_K * bb = (const block_q6_K *) blk[2*p + 1];
                    const __m256 fa = _mm256_set1_ps(xd[t][2*p + 0]*inv);
                    const __m256 fb = _mm256_set1_ps(xd[t][2*p + 1]*inv);
                    for (int h = 0; h < 2; ++h) {
                        const __m256i sa = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *) (ba->scales + 8*h)));
                        const __m256i sb = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *) (bb->scales + 8*h)));
                        const __m256i ia = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_cvtepi32_ps(sa), fa));
                        const __m256i ib = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_cvtepi32_ps(sb), fb));
                        const __m256i pw = _mm256_or_si256(_mm256_and_si256(ia, _mm256_set1_epi32(0xFFFF)), _mm256_slli_epi32(ib, 16));
                        _mm256_store_si256((__m256i *) (cw[t][p] + 8*h), pw);
                    }
                }
            } else {
                int16_t cq[ZZ_CHUNK];
                zz_round16_i16(xd[t], inv, cq);
                for (int p = 0; p < np; ++p) {
                    cw[t][p][0] = (int32_t) ((uint32_t) (uint16_t) cq[2*p] | ((uint32_t) (uint16_t) cq[2*p + 1] << 16));
                }
            }
        }

        for (int g = 0; g < bk/32; ++g) {
            const int s0 = type == GGML_TYPE_Q6_K ? 2*g + 0 : 0; // outputs 32g + 0..15
            const int s1 = type == GGML_TYPE_Q6_K ? 2*g + 1 : 0; // outputs 32g + 16..31
            __m256i a32[ZZ_MAX_T][4];
            for (int t = 0; t < nt; ++t) {
                for (int q = 0; q < 4; ++q) {
                    a32[t][q] = _mm256_setzero_si256();
                }
            }
            for (int p = 0; p < np; ++p) {
                const __m256i qa = zz_unpack_s8(type, blk[2*p + 0], g);
                const __m256i qb = zz_unpack_s8(type, blk[2*p + 1], g);
                const __m256i u0 = _mm256_unpacklo_epi8(qa, qb); // pairs of l = 0..7 | 16..23
                const __m256i u1 = _mm256_unpackhi_epi8(qa, qb); // pairs of l = 8..15 | 24..31
                const __m256i w0 = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(u0));
                const __m256i w1 = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(u1));
                const __m256i w2 = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(u0, 1));
                const __m256i w3 = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(u1, 1));
                for (int t = 0; t < nt; ++t) {
                    const __m256i e0 = _mm256_set1_epi32(cw[t][p][s0]);
                    const __m256i e1 = _mm256_set1_epi32(cw[t][p][s1]);
                    a32[t][0] = _mm256_add_epi32(a32[t][0], _mm256_madd_epi16(w0, e0));
                    a32[t][1] = _mm256_add_epi32(a32[t][1], _mm256_madd_epi16(w1, e0));
                    a32[t][2] = _mm256_add_epi32(a32[t][2], _mm256_madd_epi16(w2, e1));
                    a32[t][3] = _mm256_add_epi32(a32[t][3], _mm256_madd_epi16(w3, e1));
                }
            }
            for (int t = 0; t < nt; ++t) {
                const __m256 sv = _mm256_set1_ps(sf[t]);
                for (int q = 0; q < 4; ++q) {
                    zz_flush_i32(acc[t] + 32*g + 8*q, a32[t][q], sv);
                }
            }
        }
    }

    for (int t = 0; t < nt; ++t) {
        memcpy(y + t*ldy, acc[t], bk*sizeof(float));
    }
}

#define ZZ_MADD_KERNEL(name, type)                                                                        \
static void name(const void * wrow, const int32_t * cols, int64_t k0, int64_t k1,                         \
                 const float * x, int64_t ldx, int nt, float * y, int64_t ldy) {                          \
    if (nt == 1) {                                                                                         \
        zz_madd_impl(type, wrow, cols, k0, k1, x, ldx, 1, y, ldy);                                         \
    } else {                                                                                               \
        zz_madd_impl(type, wrow, cols, k0, k1, x, ldx, nt, y, ldy);                                        \
    }                                                                                                      \
}

ZZ_MADD_KERNEL(zz_gemv_q4_0, GGML_TYPE_Q4_0)
ZZ_MADD_KERNEL(zz_gemv_q8_0, GGML_TYPE_Q8_0)
ZZ_MADD_KERNEL(zz_gemv_q6_K, GGML_TYPE_Q6_K)

//
// Q8_0 and Q4_0 over several block-rows at once. A 32-output block-row is too short to amortize the
// per-column work (index, x, coefficient packing) of zz_madd_impl, so the chunk's columns are set up
// once and shared by every row; per row only the 16 scales d are gathered and turned into s16
// coefficients, vectorized.
//

// the 16 fp16 d of a chunk's blocks (byte offsets off_lo/off_hi from the row) as floats
ZZ_INLINE void zz_d16(const char * wr, __m256i off_lo, __m256i off_hi, __m256 * d_lo, __m256 * d_hi) {
    // d is the first field of block_q8_0/block_q4_0: a 4-byte gather stays inside the block
    const __m256i halves = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1,
                                            0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m256i ga = _mm256_shuffle_epi8(_mm256_i32gather_epi32((const int *) wr, off_lo, 1), halves);
    const __m256i gb = _mm256_shuffle_epi8(_mm256_i32gather_epi32((const int *) wr, off_hi, 1), halves);
    // qwords [a0-3 | a4-7] and [b0-3 | b4-7] -> [a0-3 a4-7 | b0-3 b4-7]
    const __m256i v  = _mm256_permute4x64_epi64(_mm256_unpacklo_epi64(ga, gb), 0xD8);
    *d_lo = _mm256_cvtph_ps(_mm256_castsi256_si128(v));
    *d_hi = _mm256_cvtph_ps(_mm256_extracti128_si256(v, 1));
}

// chunks of the list per span (stack: about (3*ZZ_MAX_T + 4)*ZZ_ROWS_SPAN*32 bytes)
#ifndef ZZ_Q8_SX
#define ZZ_Q8_SX 1
#endif

#ifndef ZZ_ROWS_SPAN
#define ZZ_ROWS_SPAN 16
#endif

#ifndef ZZ_ROWS_PF
#define ZZ_ROWS_PF 1
#endif

// VNNI (AVX512-VNNI): a column pair's 32 s16 weight pairs in two zmm (outputs [0-3 8-11 16-19 24-27] and
// [4-7 12-15 20-23 28-31]) and vpdpwssd against the pair's s16 coefficients, two instructions a token
// instead of eight (madd and add on four ymm); up to eight tokens' sums (16 zmm) stay in registers. The
// integer sums are the same, so results match the ymm path bit for bit
#if !defined(ZZ_ROWS32_VNNI) && defined(__AVX512VNNI__) && defined(__AVX512F__) && defined(__AVX512BW__)
#define ZZ_ROWS32_VNNI 1
#endif
#if ZZ_ROWS32_VNNI
// one block-row's chunk: y + t*ldy (32 outputs) += sf[t][ch] * sums over the np pairs at wr + off[2p], wr + off[2p + 1]
// of the weights times the s16 coefficient pairs cw[t][ch][p]; nt constant (zz_rows32_chunk_vnni)
ZZ_INLINE void zz_rows32_chunk_vnni_n(enum ggml_type type, const char * wr, const int32_t * off, int np,
                                      const int32_t * cw, int cw_ts, int cw_ps, const float * sf, int sf_ts,
                                      const int nt, float * y, int64_t ldy) {
    __m512i lo[ZZ_MAX_T], hi[ZZ_MAX_T];
    for (int t = 0; t < nt; ++t) {
        lo[t] = hi[t] = _mm512_setzero_si512();
    }
    for (int p = 0; p < np; ++p) {
        const char * ba = wr + off[2*p + 0];
        const char * bb = wr + off[2*p + 1];
        const __m512i wa = _mm512_cvtepi8_epi16(zz_unpack_s8(type, ba, 0));
        const __m512i wb = _mm512_cvtepi8_epi16(zz_unpack_s8(type, bb, 0));
        const __m512i w0 = _mm512_unpacklo_epi16(wa, wb);
        const __m512i w1 = _mm512_unpackhi_epi16(wa, wb);
        for (int t = 0; t < nt; ++t) {
            const __m512i e = _mm512_set1_epi32(cw[t*cw_ts + p*cw_ps]);
            lo[t] = _mm512_dpwssd_epi32(lo[t], w0, e);
            hi[t] = _mm512_dpwssd_epi32(hi[t], w1, e);
        }
    }
    // y in slot order (lo's outputs, then hi's) until zz_rows32_unslot
    for (int t = 0; t < nt; ++t) {
        const __m512 sv = _mm512_set1_ps(sf[t*sf_ts]);
        float * yr = y + t*ldy;
        _mm512_storeu_ps(yr +  0, _mm512_fmadd_ps(sv, _mm512_cvtepi32_ps(lo[t]), _mm512_loadu_ps(yr +  0)));
        _mm512_storeu_ps(yr + 16, _mm512_fmadd_ps(sv, _mm512_cvtepi32_ps(hi[t]), _mm512_loadu_ps(yr + 16)));
    }
}

// the same for any nt, in balanced groups of at most four tokens (as zz_q4_K_cm_row_bq): a group's count is a
// constant, so its sums stay in zmm registers. With a run-time count they lived in stack slots (a load and a store
// per pair and token), and with all eight tokens at once GCC still spilled a third of them
ZZ_INLINE void zz_rows32_chunk_vnni(enum ggml_type type, const char * wr, const int32_t * off, int np,
                                    const int32_t * cw, int cw_ts, int cw_ps, const float * sf, int sf_ts,
                                    const int nt, float * y, int64_t ldy) {
    const int ng = (nt + 3)/4;
    for (int g = 0, t0 = 0; g < ng; ++g) {
        const int t1 = nt*(g + 1)/ng;
#define ZZ_R32_G(n) zz_rows32_chunk_vnni_n(type, wr, off, np, cw + t0*cw_ts, cw_ts, cw_ps, sf + t0*sf_ts, sf_ts, n, y + t0*ldy, ldy)
        switch (t1 - t0) {
            case 1:  ZZ_R32_G(1); break;
            case 2:  ZZ_R32_G(2); break;
            case 3:  ZZ_R32_G(3); break;
            default: ZZ_R32_G(4); break;
        }
#undef ZZ_R32_G
        t0 = t1;
    }
}

// block-rows r0..r1 of every token from slot order to output order, once the last chunk is in
static void zz_rows32_unslot(float * y, int64_t ldy, int nt, int64_t r0, int64_t r1) {
    const __m512i i0 = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19,  4,  5,  6,  7, 20, 21, 22, 23);
    const __m512i i1 = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
    for (int t = 0; t < nt; ++t) {
        for (int64_t r = r0; r < r1; ++r) {
            float * yr = y + t*ldy + r*32;
            const __m512 lo = _mm512_loadu_ps(yr);
            const __m512 hi = _mm512_loadu_ps(yr + 16);
            _mm512_storeu_ps(yr +  0, _mm512_permutex2var_ps(lo, i0, hi));
            _mm512_storeu_ps(yr + 16, _mm512_permutex2var_ps(lo, i1, hi));
        }
    }
}

// one block-row's s16 coefficients of chunk ch for every token, as the ymm path makes them (same products,
// maxima, divisions and rounding, so the same values): the 16 d in one gather, and four tokens' maxima
// reduced together
ZZ_INLINE void zz_rows32_coef_vnni(const char * wr, __m512i off, const __m512 * xz, int nt, int ch,
                                   int32_t (* cw)[ZZ_ROWS_SPAN][ZZ_CHUNK/2], float (* sf)[ZZ_ROWS_SPAN]) {
    // d is the first field of block_q8_0/block_q4_0: a 4-byte gather stays inside the block
    const __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_i32gather_epi32(off, wr, 1)));
    const __m512 sign = _mm512_set1_ps(-0.0f);
    for (int t0 = 0; t0 < nt; t0 += 4) {
        __m512 xd[4], am[4];
        for (int u = 0; u < 4; ++u) {
            xd[u] = t0 + u < nt ? _mm512_mul_ps(xz[t0 + u], d) : _mm512_setzero_ps();
            am[u] = _mm512_andnot_ps(sign, xd[u]);
        }
        // lanes [A0 A1 B0 B1], [C0 C1 D0 D1], then [A B C D] (128 bits each), then token u's max in float u
        const __m512 m01 = _mm512_max_ps(_mm512_shuffle_f32x4(am[0], am[1], 0x44), _mm512_shuffle_f32x4(am[0], am[1], 0xEE));
        const __m512 m23 = _mm512_max_ps(_mm512_shuffle_f32x4(am[2], am[3], 0x44), _mm512_shuffle_f32x4(am[2], am[3], 0xEE));
        const __m512 m   = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15),
                                                 _mm512_max_ps(_mm512_shuffle_f32x4(m01, m23, 0x88), _mm512_shuffle_f32x4(m01, m23, 0xDD)));
        const __m256 m8  = _mm256_max_ps(_mm512_castps512_ps256(m), _mm512_extractf32x8_ps(m, 1));
        const __m128 mx  = _mm_max_ps(_mm256_castps256_ps128(m8), _mm256_extractf128_ps(m8, 1));
        // xmm divisions: a zmm one costs several times as much
        const __m512 inv = _mm512_castps128_ps512(_mm_maskz_div_ps(_mm_cmp_ps_mask(mx, _mm_setzero_ps(), _CMP_GT_OQ), _mm_set1_ps(32767.0f), mx));
        float s[4] __attribute__((aligned(16)));
        _mm_store_ps(s, _mm_div_ps(mx, _mm_set1_ps(32767.0f)));
        for (int u = 0; u < 4 && t0 + u < nt; ++u) {
            sf[t0 + u][ch] = s[u];
            const __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(xd[u], _mm512_permutexvar_ps(_mm512_set1_epi32(u), inv)));
            _mm256_store_si256((__m256i *) cw[t0 + u][ch], _mm512_cvtsepi32_epi16(q));
        }
    }
}

#else
#undef  ZZ_ROWS32_VNNI
#define ZZ_ROWS32_VNNI 0
#endif

#if !ZZ_ROWS32_VNNI
// one block-row's chunk, AVX2: y + t*ldy (32 outputs) += sf[t*sf_ts] * sums over the np pairs at wr + off[2p],
// wr + off[2p + 1] of the weights times the s16 coefficient pairs cw[t*cw_ts + p*cw_ps]; nt constant
// (zz_rows32_chunk_avx2)
ZZ_INLINE void zz_rows32_chunk_avx2_n(enum ggml_type type, const char * wr, const int32_t * off, int np,
                                      const int32_t * cw, int cw_ts, int cw_ps, const float * sf, int sf_ts,
                                      const int nt, float * y, int64_t ldy) {
    __m256i a32[ZZ_MAX_T][4];
    for (int t = 0; t < nt; ++t) {
        for (int q = 0; q < 4; ++q) {
            a32[t][q] = _mm256_setzero_si256();
        }
    }
    for (int p = 0; p < np; ++p) {
        __m256i w0, w1, w2, w3;
        if (type == GGML_TYPE_Q8_0 && ZZ_Q8_SX) {
            // s8 -> s16 straight from memory, word pairs in-lane: the sums come out as outputs
            // [0-3 8-11], [4-7 12-15], [16-19 24-27], [20-23 28-31], put back at the flush
            const int8_t * qa = ((const block_q8_0 *) (wr + off[2*p + 0]))->qs;
            const int8_t * qb = ((const block_q8_0 *) (wr + off[2*p + 1]))->qs;
            const __m256i al = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *) qa));
            const __m256i bl = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *) qb));
            const __m256i ah = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *) (qa + 16)));
            const __m256i bh = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *) (qb + 16)));
            w0 = _mm256_unpacklo_epi16(al, bl);
            w1 = _mm256_unpackhi_epi16(al, bl);
            w2 = _mm256_unpacklo_epi16(ah, bh);
            w3 = _mm256_unpackhi_epi16(ah, bh);
        } else {
            const __m256i qa = zz_unpack_s8(type, wr + off[2*p + 0], 0);
            const __m256i qb = zz_unpack_s8(type, wr + off[2*p + 1], 0);
            const __m256i u0 = _mm256_unpacklo_epi8(qa, qb); // pairs of l = 0..7 | 16..23
            const __m256i u1 = _mm256_unpackhi_epi8(qa, qb); // pairs of l = 8..15 | 24..31
            w0 = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(u0));
            w1 = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(u1));
            w2 = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(u0, 1));
            w3 = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(u1, 1));
        }
        for (int t = 0; t < nt; ++t) {
            const __m256i e = _mm256_set1_epi32(cw[t*cw_ts + p*cw_ps]);
            a32[t][0] = _mm256_add_epi32(a32[t][0], _mm256_madd_epi16(w0, e));
            a32[t][1] = _mm256_add_epi32(a32[t][1], _mm256_madd_epi16(w1, e));
            a32[t][2] = _mm256_add_epi32(a32[t][2], _mm256_madd_epi16(w2, e));
            a32[t][3] = _mm256_add_epi32(a32[t][3], _mm256_madd_epi16(w3, e));
        }
    }
    for (int t = 0; t < nt; ++t) {
        const __m256 sv = _mm256_set1_ps(sf[t*sf_ts]);
        float * yr = y + t*ldy;
        if (type == GGML_TYPE_Q8_0 && ZZ_Q8_SX) {
            const __m256i o0 = _mm256_permute2x128_si256(a32[t][0], a32[t][1], 0x20);
            const __m256i o1 = _mm256_permute2x128_si256(a32[t][0], a32[t][1], 0x31);
            const __m256i o2 = _mm256_permute2x128_si256(a32[t][2], a32[t][3], 0x20);
            const __m256i o3 = _mm256_permute2x128_si256(a32[t][2], a32[t][3], 0x31);
            a32[t][0] = o0; a32[t][1] = o1; a32[t][2] = o2; a32[t][3] = o3;
        }
        for (int q = 0; q < 4; ++q) {
            _mm256_storeu_ps(yr + 8*q, _mm256_fmadd_ps(sv, _mm256_cvtepi32_ps(a32[t][q]), _mm256_loadu_ps(yr + 8*q)));
        }
    }
}

// the same for any nt, in pairs of tokens (a lone last one alone): a pair's eight sums, the four weight vectors and
// the coefficient fit the 16 ymm registers; with a run-time count the sums lived in stack slots
ZZ_INLINE void zz_rows32_chunk_avx2(enum ggml_type type, const char * wr, const int32_t * off, int np,
                                    const int32_t * cw, int cw_ts, int cw_ps, const float * sf, int sf_ts,
                                    const int nt, float * y, int64_t ldy) {
    for (int t0 = 0; t0 < nt; t0 += 2) {
        if (nt - t0 >= 2) {
            zz_rows32_chunk_avx2_n(type, wr, off, np, cw + t0*cw_ts, cw_ts, cw_ps, sf + t0*sf_ts, sf_ts, 2, y + t0*ldy, ldy);
        } else {
            zz_rows32_chunk_avx2_n(type, wr, off, np, cw + t0*cw_ts, cw_ts, cw_ps, sf + t0*sf_ts, sf_ts, 1, y + t0*ldy, ldy);
        }
    }
}
#define zz_rows32_chunk zz_rows32_chunk_avx2
#else
#define zz_rows32_chunk zz_rows32_chunk_vnni
#endif

#if ZZ_ROWS32_VNNI
#define ZZ_ROWS_TILE 16 // block-rows a tile: one a zmm lane

// column-major: block-rows rt .. rt+15 of one chunk whose column runs start at w + off[c]. A column's 16 d lie
// within its run (gathers over ~9 lines, where a row's 16 d are 16 runs apart), and with rows in the lanes a row's
// max over the columns is a vertical max. The coefficients are the row loop's (same products, maxima, divisions
// and rounding), then each row's products (off_next: the next chunk's columns, whose blocks of these rows are
// prefetched)
static void zz_rows32_cm_tile(enum ggml_type type, const char * w, int bs, const int32_t * off, int np,
                              const float (* xs)[ZZ_CHUNK], int nt, int64_t rt,
                              const int32_t * off_next, int n_next, float * y, int64_t ldy) {
    int32_t cw[ZZ_MAX_T][ZZ_CHUNK/2][ZZ_ROWS_TILE] __attribute__((aligned(64))); // [token][pair][row]
    float   sf[ZZ_MAX_T][ZZ_ROWS_TILE]             __attribute__((aligned(64)));
    const char * wt = w + rt*bs;
    const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                           _mm512_set1_epi32(bs));
    __m512 d[ZZ_CHUNK];
    for (int c = 0; c < 2*np; ++c) {
        d[c] = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_i32gather_epi32(idx, wt + off[c], 1)));
    }
    const __m512 sign = _mm512_set1_ps(-0.0f);
    for (int t = 0; t < nt; ++t) {
        __m512 xd[ZZ_CHUNK];
        __m512 am = _mm512_setzero_ps();
        for (int c = 0; c < 2*np; ++c) {
            xd[c] = _mm512_mul_ps(_mm512_set1_ps(xs[t][c]), d[c]);
            am    = _mm512_max_ps(am, _mm512_andnot_ps(sign, xd[c]));
        }
        const __m512 inv = _mm512_maskz_div_ps(_mm512_cmp_ps_mask(am, _mm512_setzero_ps(), _CMP_GT_OQ), _mm512_set1_ps(32767.0f), am);
        _mm512_store_ps(sf[t], _mm512_div_ps(am, _mm512_set1_ps(32767.0f)));
        for (int p = 0; p < np; ++p) {
            // dword = (s16 of column 2p, s16 of column 2p+1); |values| <= 32767, so truncation is the pack's saturation
            const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(xd[2*p + 0], inv));
            const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(xd[2*p + 1], inv));
            _mm512_store_si512(cw[t][p], _mm512_mask_blend_epi16(0xAAAAAAAA, q0, _mm512_slli_epi32(q1, 16)));
        }
    }
    for (int i = 0; i < ZZ_ROWS_TILE; ++i) {
        const char * wr = wt + i*bs;
        for (int c = 0; c < n_next; ++c) {
            _mm_prefetch(wr + off_next[c], _MM_HINT_T0);
        }
        zz_rows32_chunk(type, wr, off, np, &cw[0][0][i], ZZ_CHUNK/2*ZZ_ROWS_TILE, ZZ_ROWS_TILE, &sf[0][i], ZZ_ROWS_TILE,
                        nt, y + (rt + i)*32, ldy);
    }
}
#endif


ZZ_INLINE void zz_rows32_impl(enum ggml_type type, const char * w, size_t wnb1, size_t cs, int64_t r0, int64_t r1,
                              const int32_t * cols, int64_t k0, int64_t k1,
                              const float * x, int64_t ldx, const int nt, float * y, int64_t ldy) {
    const int bs = type == GGML_TYPE_Q8_0 ? (int) sizeof(block_q8_0) : (int) sizeof(block_q4_0);
    // column-major (a column's blocks one run): one chunk per span, so a span's 16 runs are read front to back,
    // and the next chunk's blocks of each row are prefetched (ZZ_ROWS_PF) instead of the next row's
    const bool cm   = cs != (size_t) bs;
    const int  span = cm ? 1 : ZZ_ROWS_SPAN;

    for (int t = 0; t < nt; ++t) {
        memset(y + t*ldy + r0*32, 0, (size_t) (r1 - r0)*32*sizeof(float));
    }

    const __m256i lane_id = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);

    // the list in spans of ZZ_ROWS_SPAN chunks: the columns of a span are set up once, then every row
    // reads its blocks of the span (one contiguous run when dense), so the rows stream like stock's
    for (int64_t ks = k0; ks < k1; ks += span*ZZ_CHUNK) {
        const int64_t ke   = k1 - ks < span*ZZ_CHUNK ? k1 : ks + span*ZZ_CHUNK;
        const int     nchk = (int) ((ke - ks + ZZ_CHUNK - 1)/ZZ_CHUNK);

        // per chunk: block byte offsets in a row and x; padding lanes point at the chunk's first column
        // with x = 0 (an odd tail pairs with a zero coefficient)
        __m256i off_v[ZZ_ROWS_SPAN][2];
        int32_t off[ZZ_ROWS_SPAN][ZZ_CHUNK] __attribute__((aligned(32)));
        __m256  xv[ZZ_MAX_T][ZZ_ROWS_SPAN][2];
        int     npc[ZZ_ROWS_SPAN];
        for (int ch = 0; ch < nchk; ++ch) {
            const int64_t kc = ks + ch*ZZ_CHUNK;
            const int nc = ke - kc < ZZ_CHUNK ? (int) (ke - kc) : ZZ_CHUNK;
            npc[ch] = (nc + 1)/2;
            const __m256i v_lo = _mm256_cmpgt_epi32(_mm256_set1_epi32(nc),     lane_id);
            const __m256i v_hi = _mm256_cmpgt_epi32(_mm256_set1_epi32(nc - 8), lane_id);
            __m256i j_lo, j_hi;
            if (cols) {
                const __m256i j0 = _mm256_set1_epi32(cols[kc]);
                j_lo = _mm256_blendv_epi8(j0, _mm256_maskload_epi32(cols + kc,     v_lo), v_lo);
                j_hi = _mm256_blendv_epi8(j0, _mm256_maskload_epi32(cols + kc + 8, v_hi), v_hi);
            } else {
                const __m256i j0 = _mm256_set1_epi32((int32_t) kc);
                j_lo = _mm256_blendv_epi8(j0, _mm256_add_epi32(j0, lane_id), v_lo);
                j_hi = _mm256_blendv_epi8(j0, _mm256_add_epi32(j0, _mm256_add_epi32(lane_id, _mm256_set1_epi32(8))), v_hi);
            }
            const __m256i bsv = _mm256_set1_epi32((int32_t) cs);
            off_v[ch][0] = _mm256_mullo_epi32(j_lo, bsv);
            off_v[ch][1] = _mm256_mullo_epi32(j_hi, bsv);
            _mm256_store_si256((__m256i *) off[ch],       off_v[ch][0]);
            _mm256_store_si256((__m256i *) (off[ch] + 8), off_v[ch][1]);
            for (int t = 0; t < nt; ++t) {
                const float * xt = x + t*ldx;
                xv[t][ch][0] = _mm256_and_ps(_mm256_i32gather_ps(xt, j_lo, 4), _mm256_castsi256_ps(v_lo));
                xv[t][ch][1] = _mm256_and_ps(_mm256_i32gather_ps(xt, j_hi, 4), _mm256_castsi256_ps(v_hi));
            }
        }

#if ZZ_ROWS32_VNNI
        __m512i off_z[ZZ_ROWS_SPAN];
        __m512  xz[ZZ_ROWS_SPAN][ZZ_MAX_T];
        for (int ch = 0; ch < nchk; ++ch) {
            off_z[ch] = _mm512_inserti64x4(_mm512_castsi256_si512(off_v[ch][0]), off_v[ch][1], 1);
            for (int t = 0; t < nt; ++t) {
                xz[ch][t] = _mm512_insertf32x8(_mm512_castps256_ps512(xv[t][ch][0]), xv[t][ch][1], 1);
            }
        }
#endif

        // column-major: the next chunk's columns (byte offsets), prefetched row by row
        int32_t off_next[ZZ_CHUNK];
        int     n_next = 0;
        if (cm && ZZ_ROWS_PF) {
            n_next = k1 - ke < ZZ_CHUNK ? (int) (k1 - ke) : ZZ_CHUNK;
            for (int c = 0; c < n_next; ++c) {
                off_next[c] = (int32_t) ((cols ? cols[ke + c] : ke + c)*(int64_t) cs);
            }
        }

        int64_t r_first = r0; // the first block-row of the row loop
#if ZZ_ROWS32_VNNI
        if (cm) {
            // the chunk in tiles of 16 block-rows. Whole tiles only: a tile gathers each column's d once, so with
            // fewer rows it gathers more often than the row loop below, whose gather a row is cheap where the
            // column runs are short (SmolLM2's 576-row weights, 9 block-rows a thread, decoded at 0.86-0.99x in
            // tiles of 9). Not on AVX2: ymm tiles ran 0.75-0.85x the row loop there (-mno-avx512f, this Xeon)
            float xs[ZZ_MAX_T][ZZ_CHUNK] __attribute__((aligned(64)));
            for (int t = 0; t < nt; ++t) {
                _mm512_store_ps(xs[t], xz[0][t]);
            }
            const int64_t rte = r0 + (r1 - r0)/ZZ_ROWS_TILE*ZZ_ROWS_TILE;
            for (int64_t rt = r0; rt < rte; rt += ZZ_ROWS_TILE) {
                zz_rows32_cm_tile(type, w, bs, off[0], npc[0], (const float (*)[ZZ_CHUNK]) xs, nt, rt, off_next, n_next, y, ldy);
            }
            r_first = rte;
        }
#endif
        for (int64_t r = r_first; r < r1; ++r) {
            const char * wr = w + r*wnb1;
            for (int c = 0; c < n_next; ++c) {
                _mm_prefetch(wr + off_next[c], _MM_HINT_T0);
            }

            // s16 coefficients round(x*d/S) with S = amax/32767 per token and chunk; dword p = pair (2p, 2p+1).
            // All chunks of the span first: independent latency chains (gather, max, divide, rounding)
            int32_t cw[ZZ_MAX_T][ZZ_ROWS_SPAN][ZZ_CHUNK/2] __attribute__((aligned(32)));
            float   sf[ZZ_MAX_T][ZZ_ROWS_SPAN];
#if ZZ_ROWS32_VNNI
            for (int ch = 0; ch < nchk; ++ch) {
                zz_rows32_coef_vnni(wr, off_z[ch], xz[ch], nt, ch, cw, sf);
            }
#else
            const __m256 sign = _mm256_set1_ps(-0.0f);
            for (int ch = 0; ch < nchk; ++ch) {
                __m256 d_lo, d_hi;
                zz_d16(wr, off_v[ch][0], off_v[ch][1], &d_lo, &d_hi);
                for (int t = 0; t < nt; ++t) {
                    const __m256 xa = _mm256_mul_ps(xv[t][ch][0], d_lo);
                    const __m256 xb = _mm256_mul_ps(xv[t][ch][1], d_hi);
                    __m256 mx = _mm256_max_ps(_mm256_andnot_ps(sign, xa), _mm256_andnot_ps(sign, xb));
                    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
                    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
                    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
                    const float amax = _mm_cvtss_f32(m4);
                    const __m256 inv = _mm256_set1_ps(amax > 0.0f ? 32767.0f/amax : 0.0f);
                    sf[t][ch] = amax/32767.0f;
                    const __m256i ia = _mm256_cvtps_epi32(_mm256_mul_ps(xa, inv));
                    const __m256i ib = _mm256_cvtps_epi32(_mm256_mul_ps(xb, inv));
                    _mm256_store_si256((__m256i *) cw[t][ch], _mm256_permute4x64_epi64(_mm256_packs_epi32(ia, ib), 0xD8));
                }
            }
#endif

            for (int ch = 0; ch < nchk; ++ch) {
                if (ZZ_ROWS_PF && !cm && r + 1 < r1) {
                    // the next row's blocks of this chunk: the prefetchers lose the thread's row streams
                    const char * wn = wr + wnb1;
                    for (int c = 0; c < 2*npc[ch]; c += 2) {
                        _mm_prefetch(wn + off[ch][c], _MM_HINT_T0);
                        _mm_prefetch(wn + off[ch][c + 1] + bs - 1, _MM_HINT_T0);
                    }
                }
                zz_rows32_chunk(type, wr, off[ch], npc[ch], &cw[0][ch][0], ZZ_ROWS_SPAN*ZZ_CHUNK/2, 1, &sf[0][ch], ZZ_ROWS_SPAN,
                                nt, y + r*32, ldy);
            }
        }
    }
#if ZZ_ROWS32_VNNI
    zz_rows32_unslot(y, ldy, nt, r0, r1);
#endif
}

#define ZZ_ROWS32_KERNEL(name, type)                                                                       \
static void name(const void * w, size_t wnb1, size_t cs, int64_t r0, int64_t r1, const int32_t * cols,      \
                 int64_t k0, int64_t k1, const float * x, int64_t ldx, int nt, float * y, int64_t ldy) {   \
    if (nt == 1) {                                                                                         \
        zz_rows32_impl(type, w, wnb1, cs, r0, r1, cols, k0, k1, x, ldx, 1, y, ldy);                       \
    } else {                                                                                               \
        zz_rows32_impl(type, w, wnb1, cs, r0, r1, cols, k0, k1, x, ldx, nt, y, ldy);                      \
    }                                                                                                      \
}

ZZ_ROWS32_KERNEL(zz_rows_q8_0, GGML_TYPE_Q8_0)
ZZ_ROWS32_KERNEL(zz_rows_q4_0, GGML_TYPE_Q4_0)

ggml_sparse_zz_gemv_rows_t ggml_sparse_zz_gemv_rows_x86(enum ggml_type type) {
    switch (type) {
        case GGML_TYPE_Q8_0: return zz_rows_q8_0;
        case GGML_TYPE_Q4_0: return zz_rows_q4_0;
        default:             return NULL;
    }
}

//
// fp32 dequantization for the prefill GEMM panels: the values of ggml's dequantize_row_*
//

// out[0..15] = float(q[0..15])*s0, out[16..31] = float(q[16..31])*s1 for 32 s8 values
ZZ_INLINE void zz_q32_to_f32(__m256i q, __m256 s0, __m256 s1, float * out) {
    const __m128i lo = _mm256_castsi256_si128(q);
    const __m128i hi = _mm256_extracti128_si256(q, 1);
    const __m128i part[4] = { lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8) };
    for (int k = 0; k < 4; ++k) {
        const __m256i v = _mm256_cvtepi8_epi32(part[k]);
        _mm256_storeu_ps(out + 8*k, _mm256_mul_ps(_mm256_cvtepi32_ps(v), k < 2 ? s0 : s1));
    }
}

static void zz_dequant_q4_0(const void * blk, float * out, int64_t gs) {
    (void) gs; // one group
    const __m256 d = _mm256_set1_ps(zz_fp16(&((const block_q4_0 *) blk)->d));
    zz_q32_to_f32(zz_unpack_s8(GGML_TYPE_Q4_0, blk, 0), d, d, out);
}

static void zz_dequant_q8_0(const void * blk, float * out, int64_t gs) {
    (void) gs;
    const __m256 d = _mm256_set1_ps(zz_fp16(&((const block_q8_0 *) blk)->d));
    zz_q32_to_f32(zz_unpack_s8(GGML_TYPE_Q8_0, blk, 0), d, d, out);
}

static void zz_dequant_q6_K(const void * blk, float * out, int64_t gs) {
    const block_q6_K * b = blk;
    const float d = zz_fp16(&b->d);
    for (int g = 0; g < QK_K/32; ++g) {
        // group g = outputs 32g..32g+31 with sub-block scales 2g, 2g+1 (see zz_unpack_s8)
        zz_q32_to_f32(zz_unpack_s8(GGML_TYPE_Q6_K, blk, g),
                      _mm256_set1_ps(d*b->scales[2*g + 0]), _mm256_set1_ps(d*b->scales[2*g + 1]), out + g*gs);
    }
}

static void zz_dequant_q4_K(const void * blk, float * out, int64_t gs) {
    const block_q4_K * b = blk;
    const __m128  dm   = zz_fp16x2(&b->d);
    const float   d    = _mm_cvtss_f32(dm);
    const float   dmin = _mm_cvtss_f32(_mm_movehdup_ps(dm));
    const __m256i m4   = _mm256_set1_epi8(0x0F);
    for (int j = 0; j < QK_K/64; ++j) {
        uint8_t sc[2], mn[2];
        for (int h = 0; h < 2; ++h) {
            const int is = 2*j + h;
            if (is < 4) {
                sc[h] = b->scales[is] & 63; mn[h] = b->scales[is + 4] & 63;
            } else {
                sc[h] = (b->scales[is + 4] & 0xF) | ((b->scales[is - 4] >> 6) << 4);
                mn[h] = (b->scales[is + 4] >>  4) | ((b->scales[is - 0] >> 6) << 4);
            }
        }
        const __m256i q = _mm256_loadu_si256((const __m256i *) (b->qs + 32*j));
        for (int h = 0; h < 2; ++h) {
            // d*sc*q - dmin*m as ggml computes it: (d*sc)*q, then minus (dmin*m)
            const float   d1 = d*sc[h];
            const float   m1 = dmin*mn[h];
            const __m256i qh = h == 0 ? _mm256_and_si256(q, m4) : _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            const __m128i part[2] = { _mm256_castsi256_si128(qh), _mm256_extracti128_si256(qh, 1) };
            float * o = out + (2*j + h)*gs;
#if defined(__AVX512F__)
            for (int k = 0; k < 2; ++k) {
                const __m512 v = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(part[k]));
                _mm512_storeu_ps(o + 16*k, _mm512_sub_ps(_mm512_mul_ps(v, _mm512_set1_ps(d1)), _mm512_set1_ps(m1)));
            }
#else
            for (int k = 0; k < 4; ++k) {
                const __m256i v = _mm256_cvtepu8_epi32(k % 2 == 0 ? part[k/2] : _mm_srli_si128(part[k/2], 8));
                _mm256_storeu_ps(o + 8*k, _mm256_sub_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(v), _mm256_set1_ps(d1)), _mm256_set1_ps(m1)));
            }
#endif
        }
    }
}

ggml_sparse_zz_dequant_t ggml_sparse_zz_dequant_x86(enum ggml_type type) {
    switch (type) {
        case GGML_TYPE_Q4_K: return zz_dequant_q4_K;
        case GGML_TYPE_Q4_0: return zz_dequant_q4_0;
        case GGML_TYPE_Q8_0: return zz_dequant_q8_0;
        case GGML_TYPE_Q6_K: return zz_dequant_q6_K;
        default:             return NULL;
    }
}

ggml_sparse_zz_gemv_t ggml_sparse_zz_gemv_x86(enum ggml_type type) {
    switch (type) {
        case GGML_TYPE_Q4_K: return zz_gemv_q4_K;
        case GGML_TYPE_Q4_0: return zz_gemv_q4_0;
        case GGML_TYPE_Q8_0: return zz_gemv_q8_0;
        case GGML_TYPE_Q6_K: return zz_gemv_q6_K;
        default:             return NULL;
    }
}

#else

ggml_sparse_zz_gemv_t ggml_sparse_zz_gemv_x86(enum ggml_type type) {
    GGML_UNUSED(type);
    return NULL;
}

ggml_sparse_zz_gemv_rows_t ggml_sparse_zz_gemv_rows_x86(enum ggml_type type) {
    GGML_UNUSED(type);
    return NULL;
}

ggml_sparse_zz_gemv_cm_t ggml_sparse_zz_gemv_cm_x86(enum ggml_type type) {
    GGML_UNUSED(type);
    return NULL;
}

ggml_sparse_zz_cm_reduce_t ggml_sparse_zz_cm_reduce_x86(enum ggml_type type) {
    GGML_UNUSED(type);
    return NULL;
}

int ggml_sparse_zz_cm_slice_max_x86(enum ggml_type type) {
    GGML_UNUSED(type);
    return 0;
}

ggml_sparse_zz_dequant_t ggml_sparse_zz_dequant_x86(enum ggml_type type) {
    GGML_UNUSED(type);
    return NULL;
}

#endif
