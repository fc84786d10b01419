// llama-sparse: GGML_OP_MUL_MAT_ZZ on CUDA (zigzag GEMV for decode, dequantize + cuBLAS for prefill).
//
// GEMV design. Grid = (n1, m/B): the n1 thread blocks of one block-row (B outputs) each hold n2 warps,
// and the n1*n2 warps ("workers") split the row's active columns evenly (the idx list is the load
// balancing: every worker gets the same number of columns whatever the sparsity pattern). A worker
// stages 32 (column, x) pairs in shared memory, prefetching the next 32 into registers, then walks them
// with U blocks of weights in flight. Blocks are read whole by a warp: for B = 256 each lane owns 8 of
// the 256 outputs (Q4_K: 16 B header broadcast + 8 B of quants per lane, one 144 B block per warp load);
// for B = 32 a warp works on 8 (Q4_0) or 4 (Q8_0) columns at once, 4 or 8 lanes per column, so one warp
// load covers 144 or 136 consecutive bytes when the columns are consecutive. Partial sums stay in
// registers until the end, are reduced once across the warps of a block through shared memory and
// across the n1 blocks by (a) a plain store when n1 == 1, (b) a ticket: each block stores its partial
// sums to a workspace slot and takes a ticket from its block-row's counter, the last to arrive sums the
// slots in block order and writes y (no memset, no float atomics, deterministic; the counter is reset by
// that block), (c) atomicAdd into dst zeroed by a cudaMemsetAsync in the same stream, or (d) a thread block
// cluster (sm_90) reading its peers' shared memory. All are CUDA-graph safe: no host reads, no host sync.
#include "mul-mat-zz.cuh"
#include "sparse-idx.cuh"
#include "graph-hook.cuh"
#include "launch.cuh"
#include "q4k-pair.cuh"
#include "zz-g8.cuh"
#include "ggml-sparse.h"

#include <cooperative_groups.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#ifdef GGML_SPARSE_CUDA_CLUSTERS
#define ZZ_CLUSTER_AVAILABLE // host side; device side also needs __CUDA_ARCH__ >= 900
#endif

#define ZZ_RED_FLOATS         4096         // shared memory of one cross-warp reduction pass, in floats
#define ZZ_PREFILL_TILE_BYTES (64u << 20)  // f16 weight tile of the prefill path
#define ZZ_FULL_MASK          0xFFFFFFFFu

enum zz_red_mode {
    ZZ_RED_STORE   = 0, // n1 == 1: the block owns its outputs
    ZZ_RED_ATOMIC  = 1, // atomicAdd into zeroed dst
    ZZ_RED_CLUSTER = 2, // distributed shared memory of a thread block cluster
    ZZ_RED_TICKET  = 3, // partials to a workspace, the last block of the block-row (ticket counter) sums them
    ZZ_RED_FIRST   = 4, // the first block of the block-row to arrive (ticket counter) stores, the others add atomically
    ZZ_RED_EARLY   = 5, // direct kernel: the first block of the block-row to start sets y (bias or 0), all add atomically
};

#define ZZ_TICKET_ROWS 65536     // counters: one per block-row (grid.y <= 65535); FIRST uses a second set after them
#define ZZ_FIRST_FLAG  (1 << 24) // FIRST: added to a block-row's counter once its first block's stores are visible

// ---------------------------------------------------------------------------------------------------
// per-type decoding. Each type has: a lane struct (per-lane constants), a data struct (what one lane
// reads of one block), zz_lane_init, zz_load (from the block's copy in shared memory), zz_accum
// (acc[t][k] += x_t * W[out(k), col]) and zz_out (output index of acc[.][k] within the block).
// Blocks reach shared memory through cp.async: Q4_K blocks (144 B) are 16-byte aligned and copied in
// 16-byte pieces; the 2-byte aligned types are copied as the 4-byte words covering them (sb = bs + 2
// bytes), so a block's copy starts at byte (its global address & 3) of its slot.

template <ggml_type type> struct zz_type;

// small unsigned byte k of w -> float, exact: the byte goes into the mantissa of 2^23, then bias is
// subtracted (bias = 2^23 + offset folds the offset of the quant format into the same FADD)
static __device__ __forceinline__ float zz_byte_f(const uint32_t w, const int k, const float bias) {
    return __int_as_float(__byte_perm(w, 0x4B000000u, 0x7440 | k)) - bias;
}

// 8 bytes at a 2-byte aligned shared address; the branch is uniform when the warp reads one block
static __device__ __forceinline__ uint2 zz_lds8_a2(const char * p) {
    uint2 v;
    if (((uintptr_t) p & 3) == 0) {
        v.x = *((const uint32_t *) p + 0);
        v.y = *((const uint32_t *) p + 1);
    } else {
        const uint32_t lo  = *((const uint16_t *) p + 0);
        const uint32_t mid = *((const uint32_t *) (p + 2));
        const uint32_t hi  = *((const uint16_t *) p + 3);
        v.x = lo | (mid << 16);
        v.y = (mid >> 16) | (hi << 16);
    }
    return v;
}

// 4 bytes at a 2-byte aligned address
static __device__ __forceinline__ uint32_t zz_lds4_a2(const char * p) {
    return (uint32_t) *((const uint16_t *) p) | ((uint32_t) *((const uint16_t *) p + 1) << 16);
}

static __device__ __forceinline__ float zz_half_f(const char * p) {
    return __half2float(__ushort_as_half(*(const uint16_t *) p));
}

static __device__ __forceinline__ float zz_ldg_half_f(const char * p) {
    return __half2float(__ushort_as_half(__ldg((const uint16_t *) p)));
}

// get_scale_min_k4 of ggml-quants.c on the scale words h.y, h.z, h.w of a Q4_K block
static __device__ __forceinline__ void zz_q4_K_scale_min(const uint4 h, const int s, uint32_t & sc, uint32_t & mn) {
    const int      sh = 8*(s & 3);
    const uint32_t yb = h.y >> sh; // scales[s & 3]
    const uint32_t zb = h.z >> sh; // scales[4 + (s & 3)]
    const uint32_t wb = h.w >> sh; // scales[8 + (s & 3)]
    if (s < 4) {
        sc = yb & 63;
        mn = zb & 63;
    } else {
        sc = (wb & 0x0F) | (((yb >> 6) & 3) << 4);
        mn = ((wb >> 4) & 0x0F) | (((zb >> 6) & 3) << 4);
    }
}

// --- Q4_K: 144 B, d/dmin, 12 B of 6-bit scales/mins, 128 B of nibbles; output i of the block is nibble
// (i/32)%2 of byte 32*(i/64) + i%32. Lane L owns outputs 8L..8L+7: bytes 32*(L/8) + 8*(L%4) .. +7,
// high nibbles if L%8 >= 4, sub-block s = L/4 (get_scale_min_k4 branch-free with per-lane selectors).
struct zz_lane_q4_K {
    int      qoff; // byte offset of the lane's 8 quant bytes in the block
    int      nsh;  // 0: low nibbles, 4: high nibbles
    int      sh;   // 8*(s & 3)
    bool     hi;   // s >= 4
    uint32_t m6;   // s < 4: 63, else 0x0F (low bits of the scale/min)
    uint32_t m2;   // s < 4: 0, else 0x30 (high bits, from the top of scales[s - 4] / scales[s])
    int      msh;  // shift of the min's low bits: sh, or sh + 4
    zz_pair_consts pc; // pair form (q4k-pair.cuh)
};
struct zz_data_q4_K {
    uint4 h;
    uint2 q;
};
template <> struct zz_type<GGML_TYPE_Q4_K> {
    typedef zz_lane_q4_K lane_t;
    typedef zz_data_q4_K data_t;
    static constexpr int B       = QK_K;
    static constexpr int bs      = sizeof(block_q4_K);
    static constexpr int lpc     = 32;  // lanes per column
    static constexpr int opl     = 8;   // outputs per lane
    static constexpr int ch      = 32;  // columns per warp chunk
    static constexpr int cp_unit = 16;  // cp.async piece
    static constexpr int sb      = bs;  // shared bytes per block
};
static __device__ __forceinline__ void zz_lane_init(zz_lane_q4_K & l, const int lane) {
    const int s = lane/4;
    l.qoff = 16 + 32*(lane/8) + 8*(lane%4);
    l.nsh  = (lane & 4) ? 4 : 0;
    l.sh   = 8*(s & 3);
    l.hi   = s >= 4;
    l.m6   = s < 4 ? 63 : 0x0F;
    l.m2   = s < 4 ? 0 : 0x30;
    l.msh  = s < 4 ? l.sh : l.sh + 4;
    l.pc   = zz_pair_consts_make(s);
}
static __device__ __forceinline__ void zz_load(zz_data_q4_K & d, const char * blk, const zz_lane_q4_K & l) {
    d.h = *(const uint4 *) blk;
    d.q = *(const uint2 *) (blk + l.qoff);
}
// scale and min of the lane's sub-block s = lane/4 from a block header h, branch-free:
// s < 4: sc = scales[s] & 63,  mn = scales[s + 4] & 63
// s > 3: sc = (scales[s + 4] & 15) | (scales[s - 4] >> 6) << 4,  mn = (scales[s + 4] >> 4) | (scales[s] >> 6) << 4
static __device__ __forceinline__ void zz_lane_sc_mn(const uint4 h, const zz_lane_q4_K & l, uint32_t & sc, uint32_t & mn) {
    const uint32_t wa = l.hi ? h.w : h.y;
    const uint32_t wm = l.hi ? h.w : h.z;
    sc = ((wa >> l.sh)  & l.m6) | ((h.y >> (l.sh + 2)) & l.m2);
    mn = ((wm >> l.msh) & l.m6) | ((h.z >> (l.sh + 2)) & l.m2);
}

template <int T>
static __device__ __forceinline__ void zz_accum(const zz_data_q4_K & d, const zz_lane_q4_K & l, const float * xt,
        float (&acc)[T][8], float (&accm)[T]) {
    uint32_t sc, mn;
    zz_lane_sc_mn(d.h, l, sc, mn);
    const float2   dm  = __half22float2(*(const half2 *) &d.h.x);
    const float    dsc = dm.x * zz_byte_f(sc, 0, 8388608.0f);
    const float    dmn = dm.y * zz_byte_f(mn, 0, 8388608.0f);
    const uint32_t qa  = (d.q.x >> l.nsh) & 0x0F0F0F0F;
    const uint32_t qb  = (d.q.y >> l.nsh) & 0x0F0F0F0F;
    float q[8];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        q[k]     = zz_byte_f(qa, k, 8388608.0f);
        q[k + 4] = zz_byte_f(qb, k, 8388608.0f);
    }
#pragma unroll
    for (int t = 0; t < T; ++t) {
        const float a = xt[t]*dsc;
        accm[t] += xt[t]*dmn;
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            acc[t][k] += a*q[k];
        }
    }
}
static __device__ __forceinline__ int zz_out(const zz_lane_q4_K & l, const int lane, const int k) {
    GGML_UNUSED(l);
    return 8*lane + k;
}

// --- Q6_K: 210 B (2-byte aligned), ql[128], qh[64], int8 scales[16], d. Output i: half h = i/128,
// quarter g = (i%128)/32, l = i%32: ql[64h + 32(g&1) + l] nibble g>>1, qh[32h + l] bits 2g..2g+1,
// scale[8h + l/16 + 2g]. Lane L owns outputs 8L..8L+7: h = L/16, g = (L%16)/4, l = 8(L%4) + k.
struct zz_lane_q6_K {
    int qloff;
    int qhoff;
    int scoff;
    int nsh;
    int hsh;
};
struct zz_data_q6_K {
    uint2 ql;
    uint2 qh;
    int   sc;
    float d;
};
template <> struct zz_type<GGML_TYPE_Q6_K> {
    typedef zz_lane_q6_K lane_t;
    typedef zz_data_q6_K data_t;
    static constexpr int B       = QK_K;
    static constexpr int bs      = sizeof(block_q6_K);
    static constexpr int lpc     = 32;
    static constexpr int opl     = 8;
    static constexpr int ch      = 32;
    static constexpr int cp_unit = 4;
    static constexpr int sb      = bs + 2;
};
static __device__ __forceinline__ void zz_lane_init(zz_lane_q6_K & l, const int lane) {
    const int h = lane/16;
    const int g = (lane%16)/4;
    l.qloff = 64*h + 32*(g & 1) + 8*(lane%4);
    l.qhoff = QK_K/2 + 32*h + 8*(lane%4);
    l.scoff = QK_K/2 + QK_K/4 + 8*h + (lane%4)/2 + 2*g;
    l.nsh   = 4*(g >> 1);
    l.hsh   = 2*g;
}
static __device__ __forceinline__ void zz_load(zz_data_q6_K & d, const char * blk, const zz_lane_q6_K & l) {
    d.ql = zz_lds8_a2(blk + l.qloff);
    d.qh = zz_lds8_a2(blk + l.qhoff);
    d.sc = (int) *(const int8_t *) (blk + l.scoff);
    d.d  = zz_half_f(blk + offsetof(block_q6_K, d));
}
template <int T>
static __device__ __forceinline__ void zz_accum(const zz_data_q6_K & d, const zz_lane_q6_K & l, const float * xt,
        float (&acc)[T][8], float (&accm)[T]) {
    GGML_UNUSED(accm);
    const uint32_t c0  = ((d.ql.x >> l.nsh) & 0x0F0F0F0F) | (((d.qh.x >> l.hsh) & 0x03030303) << 4);
    const uint32_t c1  = ((d.ql.y >> l.nsh) & 0x0F0F0F0F) | (((d.qh.y >> l.hsh) & 0x03030303) << 4);
    const float    dsc = d.d * (float) d.sc;
    float q[8];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        q[k]     = zz_byte_f(c0, k, 8388640.0f); // q - 32
        q[k + 4] = zz_byte_f(c1, k, 8388640.0f);
    }
#pragma unroll
    for (int t = 0; t < T; ++t) {
        const float a = xt[t]*dsc;
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            acc[t][k] += a*q[k];
        }
    }
}
static __device__ __forceinline__ int zz_out(const zz_lane_q6_K & l, const int lane, const int k) {
    GGML_UNUSED(l);
    return 8*lane + k;
}

// --- Q4_0: 18 B, d, 16 B of nibbles: output i < 16 is the low nibble of byte i, i >= 16 the high nibble
// of byte i - 16. 4 lanes per column, 8 columns per warp step; lane p = L%4 owns bytes 4p..4p+3:
// outputs 4p..4p+3 and 16+4p..16+4p+3.
struct zz_lane_q4_0 {
    int qoff;
};
struct zz_data_q4_0 {
    uint32_t q;
    float    d;
};
template <> struct zz_type<GGML_TYPE_Q4_0> {
    typedef zz_lane_q4_0 lane_t;
    typedef zz_data_q4_0 data_t;
    static constexpr int B       = QK4_0;
    static constexpr int bs      = sizeof(block_q4_0);
    static constexpr int lpc     = 4;
    static constexpr int opl     = 8;
    static constexpr int ch      = 128;
    static constexpr int cp_unit = 4;
    static constexpr int sb      = bs + 2;
};
static __device__ __forceinline__ void zz_lane_init(zz_lane_q4_0 & l, const int lane) {
    l.qoff = sizeof(ggml_half) + 4*(lane%4);
}
static __device__ __forceinline__ void zz_load(zz_data_q4_0 & d, const char * blk, const zz_lane_q4_0 & l) {
    d.q = zz_lds4_a2(blk + l.qoff);
    d.d = zz_half_f(blk);
}
template <int T>
static __device__ __forceinline__ void zz_accum(const zz_data_q4_0 & d, const zz_lane_q4_0 & l, const float * xt,
        float (&acc)[T][8], float (&accm)[T]) {
    GGML_UNUSED(l);
    GGML_UNUSED(accm);
    const uint32_t lo = d.q & 0x0F0F0F0F;
    const uint32_t hi = (d.q >> 4) & 0x0F0F0F0F;
    float q[8];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        q[k]     = zz_byte_f(lo, k, 8388616.0f); // q - 8
        q[k + 4] = zz_byte_f(hi, k, 8388616.0f);
    }
#pragma unroll
    for (int t = 0; t < T; ++t) {
        const float a = xt[t]*d.d;
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            acc[t][k] += a*q[k];
        }
    }
}
static __device__ __forceinline__ int zz_out(const zz_lane_q4_0 & l, const int lane, const int k) {
    GGML_UNUSED(l);
    return (k < 4 ? 0 : QK4_0/2 - 4) + 4*(lane%4) + k;
}

// --- Q8_0: 34 B, d, 32 int8. 8 lanes per column, 4 columns per warp step; lane p = L%8 owns outputs 4p..4p+3.
struct zz_lane_q8_0 {
    int qoff;
};
struct zz_data_q8_0 {
    uint32_t q;
    float    d;
};
template <> struct zz_type<GGML_TYPE_Q8_0> {
    typedef zz_lane_q8_0 lane_t;
    typedef zz_data_q8_0 data_t;
    static constexpr int B       = QK8_0;
    static constexpr int bs      = sizeof(block_q8_0);
    static constexpr int lpc     = 8;
    static constexpr int opl     = 4;
    static constexpr int ch      = 128;
    static constexpr int cp_unit = 4;
    static constexpr int sb      = bs + 2;
};
static __device__ __forceinline__ void zz_lane_init(zz_lane_q8_0 & l, const int lane) {
    l.qoff = sizeof(ggml_half) + 4*(lane%8);
}
static __device__ __forceinline__ void zz_load(zz_data_q8_0 & d, const char * blk, const zz_lane_q8_0 & l) {
    d.q = zz_lds4_a2(blk + l.qoff);
    d.d = zz_half_f(blk);
}
template <int T>
static __device__ __forceinline__ void zz_accum(const zz_data_q8_0 & d, const zz_lane_q8_0 & l, const float * xt,
        float (&acc)[T][4], float (&accm)[T]) {
    GGML_UNUSED(l);
    GGML_UNUSED(accm);
    const uint32_t v = d.q ^ 0x80808080; // int8 q -> q + 128
    float q[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        q[k] = zz_byte_f(v, k, 8388736.0f);
    }
#pragma unroll
    for (int t = 0; t < T; ++t) {
        const float a = xt[t]*d.d;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            acc[t][k] += a*q[k];
        }
    }
}
static __device__ __forceinline__ int zz_out(const zz_lane_q8_0 & l, const int lane, const int k) {
    GGML_UNUSED(l);
    return 4*(lane%8) + k;
}

// --- Q4_0 in the G8 layout (cuda/zz-g8.cuh): only the direct kernel and the prefill read it
template <> struct zz_type<ZZ_TYPE_Q4_0_G8> {
    static constexpr int B  = ZZ_G8_ROWS*QK4_0;
    static constexpr int bs = ZZ_G8_BYTES;
};
static_assert(ZZ_G8_BYTES == sizeof(block_q4_K) && ZZ_G8_ROWS*sizeof(block_q4_0) == ZZ_G8_BYTES, "G8 super-block");

// --- Q8_0 in the G8 layout (cuda/zz-g8.cuh): the same, 272-byte super-blocks
template <> struct zz_type<ZZ_TYPE_Q8_0_G8> {
    static constexpr int B  = ZZ_G8_ROWS*QK8_0;
    static constexpr int bs = ZZ_G8Q8_BYTES;
};
static_assert(ZZ_G8_ROWS*sizeof(block_q8_0) == ZZ_G8Q8_BYTES, "G8 Q8_0 super-block");

// what the direct kernel reads (its template parameter G8): Q4_K, or the G8 layout of Q4_0 or Q8_0
#define ZZ_FMT_Q4_K  0
#define ZZ_FMT_G8_Q4 1
#define ZZ_FMT_G8_Q8 2

// a lane's quant words of one Q8_0 G8 super-block: those at 16 + 32 s + 4g, s = 0..3 (a) and 4..7 (b)
struct zz_q8w {
    uint4 a, b;
};
// per format: the lane's quant words of a column
template <int G8> struct zz_dfmt {
    typedef uint4 q_t;
};
template <> struct zz_dfmt<ZZ_FMT_G8_Q8> {
    typedef zz_q8w q_t;
};
// the block bytes of the format whose lane words are Q
template <typename Q> struct zz_qbs {
    static constexpr int v = sizeof(block_q4_K);
};
template <> struct zz_qbs<zz_q8w> {
    static constexpr int v = ZZ_G8Q8_BYTES;
};

// --- Q4_K on tensor cores (sm_80+): a warp takes the chunk's columns 16 at a time (K = 16) and all 256
// outputs as 16 tiles of m16n8k16 (M = 16 outputs, N = 8 tokens). Lane (g = lane/4, tq = lane%4) dequantizes
// to f16 the A fragments of columns 2tq, 2tq+1, 2tq+8, 2tq+9 from the 16 quant bytes 16g..16g+15 of each
// block: byte u gives tile u, row g (low nibble, output o(g, u) = 64(g/2) + 16(g%2) + u, sub-block
// 2(g/2)) and row g+8 (high nibble, output o(g, u) + 32, sub-block 2(g/2) + 1). Nibbles become f16 through
// the 0x6400 (1024) exponent trick, w = q*(d*sc) - dmin*m in one HFMA2; x goes to f16 as the B fragment,
// accumulation is fp32. Cost per element ~1.75 instructions whatever the batch (<= 8).
#ifdef AMPERE_MMA_AVAILABLE
static __device__ __forceinline__ void zz_mma_16816(float (&c)[4], const uint32_t a0, const uint32_t a1, const uint32_t a2,
        const uint32_t a3, const uint32_t b0, const uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

static __device__ __forceinline__ uint32_t zz_h2_bits(const half2 h) {
    return *(const uint32_t *) &h;
}

static __device__ __forceinline__ half2 zz_bits_h2(const uint32_t u) {
    return *(const half2 *) &u;
}

static __device__ __forceinline__ uint32_t zz_u4_word(const uint4 v, const int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// G8 (regrouped Q4_0): the f16 pair (d_s of header a, d_s of header b) of sub-block s
static __device__ __forceinline__ half2 zz_g8_d2(const uint4 ha, const uint4 hb, const int s) {
    return zz_bits_h2(__byte_perm(zz_u4_word(ha, s >> 1), zz_u4_word(hb, s >> 1), s & 1 ? 0x7632 : 0x5410));
}

// 16 columns on tensor cores: h[i], q[i] = header and quant bytes 16g..16g+15 of the block of column
// 2tq + (i & 1) + 8(i >> 1) (zeros where there is none), xb[i] = x of that column for token g (0 if g >= T)
static __device__ __forceinline__ void zz_mma_q4_K_step(const uint4 (&h)[4], const uint4 (&q)[4], const float (&xb)[4],
        const int lane, float (&cm)[16][4]) {
    const int g = lane/4;
    // branch-free get_scale_min_k4 for the sub-blocks s0 = 2(g/2) and s0 + 1 (both < 4 or both >= 4)
    const int      s0  = 2*(g/2);
    const bool     hi  = s0 >= 4;
    const int      sh0 = 8*(s0 & 3);
    const uint32_t m6  = hi ? 0x0F : 63;
    const uint32_t m2  = hi ? 0x30 : 0;
    const half2    k1024 = __floats2half2_rn(1024.0f, 1024.0f);

    float dl[4], ml[4], dh[4], mh[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const uint32_t wa  = hi ? h[i].w : h[i].y;
        const uint32_t wm  = hi ? h[i].w : h[i].z;
        const uint32_t sc0 = ((wa >> sh0)              & m6) | ((h[i].y >> (sh0 + 2))  & m2);
        const uint32_t mn0 = ((wm >> (sh0 + 4*hi))     & m6) | ((h[i].z >> (sh0 + 2))  & m2);
        const uint32_t sc1 = ((wa >> (sh0 + 8))        & m6) | ((h[i].y >> (sh0 + 10)) & m2);
        const uint32_t mn1 = ((wm >> (sh0 + 8 + 4*hi)) & m6) | ((h[i].z >> (sh0 + 10)) & m2);
        const float2   dm  = __half22float2(*(const half2 *) &h[i].x);
        dl[i] = dm.x*(float) sc0;
        ml[i] = dm.y*(float) mn0;
        dh[i] = dm.x*(float) sc1*(1.0f/16.0f); // high nibbles arrive as 16*q
        mh[i] = dm.y*(float) mn1;
    }
    // A scales of the column pairs (2tq, 2tq+1) and (2tq+8, 2tq+9)
    const half2 sl01 = __floats2half2_rn(dl[0], dl[1]);
    const half2 ml01 = __floats2half2_rn(-ml[0], -ml[1]);
    const half2 sh01 = __floats2half2_rn(dh[0], dh[1]);
    const half2 mh01 = __floats2half2_rn(-mh[0], -mh[1]);
    const half2 sl23 = __floats2half2_rn(dl[2], dl[3]);
    const half2 ml23 = __floats2half2_rn(-ml[2], -ml[3]);
    const half2 sh23 = __floats2half2_rn(dh[2], dh[3]);
    const half2 mh23 = __floats2half2_rn(-mh[2], -mh[3]);

    // B: token g at the lane's 4 columns
    const uint32_t b0 = zz_h2_bits(__floats2half2_rn(xb[0], xb[1]));
    const uint32_t b1 = zz_h2_bits(__floats2half2_rn(xb[2], xb[3]));

#pragma unroll
    for (int mt = 0; mt < 16; ++mt) {
        const int      wi  = mt/4;
        const int      bi  = mt%4;
        const uint32_t x01 = __byte_perm(zz_u4_word(q[0], wi), zz_u4_word(q[1], wi), bi | ((4 + bi) << 8));
        const uint32_t x23 = __byte_perm(zz_u4_word(q[2], wi), zz_u4_word(q[3], wi), bi | ((4 + bi) << 8));
        const half2 lo01 = __hsub2(zz_bits_h2((x01 & 0x000F000F) | 0x64006400), k1024); // q
        const half2 hi01 = __hsub2(zz_bits_h2((x01 & 0x00F000F0) | 0x64006400), k1024); // 16 q
        const half2 lo23 = __hsub2(zz_bits_h2((x23 & 0x000F000F) | 0x64006400), k1024);
        const half2 hi23 = __hsub2(zz_bits_h2((x23 & 0x00F000F0) | 0x64006400), k1024);
        const uint32_t a0 = zz_h2_bits(__hfma2(lo01, sl01, ml01)); // row g,   columns 2tq, 2tq+1
        const uint32_t a1 = zz_h2_bits(__hfma2(hi01, sh01, mh01)); // row g+8, columns 2tq, 2tq+1
        const uint32_t a2 = zz_h2_bits(__hfma2(lo23, sl23, ml23)); // row g,   columns 2tq+8, 2tq+9
        const uint32_t a3 = zz_h2_bits(__hfma2(hi23, sh23, mh23)); // row g+8, columns 2tq+8, 2tq+9
        zz_mma_16816(cm[mt], a0, a1, a2, a3, b0, b1);
    }
}

// versions 2 and 3: d sc and dmin m of the lane's sub-block for its 4 columns (k: 1, or 1/16 for odd sub-blocks), x of
// those columns as f16 pairs, and the min terms' MMA (rows = sub-blocks, A = dmin m, B = x) into cmin.
// G8: d_s and 8 d_s (w = d_s q - 8 d_s); Q8_0: d_s and 128 d_s (u = q + 128 read as unsigned)
template <int G8 = ZZ_FMT_Q4_K>
static __device__ __forceinline__ void zz_q4_K_v2_scales(const uint4 (&h)[4], const float (&xb)[4], const zz_lane_q4_K & L,
        const float k, float (&dsc)[4], uint32_t & x01, uint32_t & x23, float (&cmin)[4]) {
    float dmn[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        if constexpr (G8) {
            const float d = __low2float(zz_g8_d2(h[i], h[i], (threadIdx.x % WARP_SIZE)/4));
            dsc[i] = d*k;
            dmn[i] = (G8 == ZZ_FMT_G8_Q8 ? 128.0f : 8.0f)*d;
        } else {
            uint32_t sc, mn;
            zz_lane_sc_mn(h[i], L, sc, mn);
            const float2 dm = __half22float2(*(const half2 *) &h[i].x);
            dsc[i] = (dm.x*k)*zz_byte_f(sc, 0, 8388608.0f);
            dmn[i] = dm.y*zz_byte_f(mn, 0, 8388608.0f);
        }
    }
    x01 = zz_h2_bits(__floats2half2_rn(xb[0], xb[1]));
    x23 = zz_h2_bits(__floats2half2_rn(xb[2], xb[3]));
    // mins: row s = g of A (rows 8..15 unused)
    zz_mma_16816(cmin, zz_h2_bits(__floats2half2_rn(dmn[0], dmn[1])), 0u, zz_h2_bits(__floats2half2_rn(dmn[2], dmn[3])), 0u,
                 x01, x23);
}

// Pair form of the scales (version 3; GGML_SPARSE_CUDA_Q4K_PAIR_SC, default on): sub-block s = g of two columns
// a, b at once. PRMT puts the scale bytes of both headers into one word, so the 6-bit extraction runs once per pair
// and its result is an f16 pair (the 0x6400 trick); d sc and dmin m are then f16 products. ~24 instructions a pair
// against ~50 for two columns in fp32; d sc is rounded to f16 once more than there.
#ifndef GGML_SPARSE_CUDA_Q4K_PAIR_SC
#define GGML_SPARSE_CUDA_Q4K_PAIR_SC 1
#endif
static __device__ __forceinline__ void zz_q4_K_pair_scales(const uint4 ha, const uint4 hb, const zz_lane_q4_K & L,
        half2 & dsc, half2 & dmn) {
    uint32_t sc, mn;
    zz_q4_K_pair_bits(ha.y, ha.z, ha.w, hb.y, hb.z, hb.w, L.hi, L.pc, sc, mn);
    const half2 k1024 = zz_bits_h2(0x64006400u);
    dsc = __hmul2(zz_bits_h2(__byte_perm(ha.x, hb.x, 0x5410)), __hsub2(zz_bits_h2(sc), k1024));
    dmn = __hmul2(zz_bits_h2(__byte_perm(ha.x, hb.x, 0x7632)), __hsub2(zz_bits_h2(mn), k1024));
}

// bytes e = 2ep (r) and 2ep + 1 (s) of the lane's words of its columns 0, 1 (w0, w1) and 2, 3 (w2, w3), the two columns
// of a pair at bytes 0 and 2
static __device__ __forceinline__ void zz_pair_bytes(const uint32_t w0, const uint32_t w1, const uint32_t w2,
        const uint32_t w3, const int ep, uint32_t & r01, uint32_t & s01, uint32_t & r23, uint32_t & s23) {
    const int e0 = 2*ep;
    const int e1 = 2*ep + 1;
    r01 = __byte_perm(w0, w1, e0 | ((4 + e0) << 8));
    s01 = __byte_perm(w0, w1, e1 | ((4 + e1) << 8));
    r23 = __byte_perm(w2, w3, e0 | ((4 + e0) << 8));
    s23 = __byte_perm(w2, w3, e1 | ((4 + e1) << 8));
}

// versions 2 and 3: the A fragments of the 16 tiles from the lane's quant words q, tile (s, ep) of sub-block s
// handed to mma(s, ep, a0, a1, a2, a3)
template <typename F>
static __device__ __forceinline__ void zz_q4_K_v2_tiles(const uint4 (&q)[4], F mma) {
#pragma unroll
    for (int p = 0; p < 4; ++p) {
        const uint32_t w0 = zz_u4_word(q[0], p);
        const uint32_t w1 = zz_u4_word(q[1], p);
        const uint32_t w2 = zz_u4_word(q[2], p);
        const uint32_t w3 = zz_u4_word(q[3], p);
#pragma unroll
        for (int ep = 0; ep < 2; ++ep) {
            // (each nibble then sits in an f16 mantissa)
            uint32_t r01, s01, r23, s23;
            zz_pair_bytes(w0, w1, w2, w3, ep, r01, s01, r23, s23);
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
                const uint32_t msk = hh ? 0x00F000F0u : 0x000F000Fu;
                mma(2*p + hh, ep, r01 & msk, s01 & msk, r23 & msk, s23 & msk);
            }
        }
    }
}

// Q8_0 in the G8 layout: word s of the lane holds outputs 4g + e (e = 0..3) of sub-block s; tile (s, ep) takes
// bytes 2ep (row g) and 2ep + 1 (row g + 8). A = the byte u = q + 128 in an f16 mantissa (exact subnormal u 2^-24,
// the sign flip folded into the mask's LOP3), 128 d comes off as the min term
template <typename F>
static __device__ __forceinline__ void zz_q4_K_v2_tiles(const zz_q8w (&q)[4], F mma) {
#pragma unroll
    for (int s = 0; s < 8; ++s) {
        const uint32_t w0 = zz_u4_word(s < 4 ? q[0].a : q[0].b, s & 3);
        const uint32_t w1 = zz_u4_word(s < 4 ? q[1].a : q[1].b, s & 3);
        const uint32_t w2 = zz_u4_word(s < 4 ? q[2].a : q[2].b, s & 3);
        const uint32_t w3 = zz_u4_word(s < 4 ? q[3].a : q[3].b, s & 3);
#pragma unroll
        for (int ep = 0; ep < 2; ++ep) {
            uint32_t r01, s01, r23, s23;
            zz_pair_bytes(w0, w1, w2, w3, ep, r01, s01, r23, s23);
            mma(s, ep, (r01 & 0x00FF00FFu) ^ 0x00800080u, (s01 & 0x00FF00FFu) ^ 0x00800080u,
                       (r23 & 0x00FF00FFu) ^ 0x00800080u, (s23 & 0x00FF00FFu) ^ 0x00800080u);
        }
    }
}

// Direct kernel, version 2 (default at batch 2-8; LLAMA_SPARSE_CUDA_Q4K_V=1 selects the step above): every
// tile's 16 rows lie in one sub-block, so the sub-block's scale goes into B and A is the bare nibbles. Lane (g, tq)
// holds of each of its 4 columns the header and the words at quant bytes 32p + 4g (p = 0..3): byte e of word p holds
// output l = 4g + e of sub-blocks 2p (low nibble) and 2p + 1 (high nibble). Tile mt = 4p + 2h + ep: sub-block
// s = 2p + h, rows g -> l = 4g + 2ep, g + 8 -> l = 4g + 2ep + 1. A = the nibble masked into an f16 mantissa with
// a zero exponent, the exact subnormal q 2^-24 (16 q 2^-24 for high nibbles): one PRMT per two registers and
// one AND per register, no conversion arithmetic. B of sub-block s = x d sc (/16 for high nibbles) in f16;
// lane (s, tq) computes d sc and dmin m of sub-block s = g for its columns (zz_lane_q4_K's sub-block) and the
// others fetch them by shuffle.
// The mins go through one more MMA per step, rows = sub-blocks (A = dmin m, B = x): cmin[s][t] = sum dmin m x,
// subtracted once at the end (zz_mma_put_v2). Instructions per 16 columns ~250 against ~380 above.
// xb[i]: x of column i for token g (T > 1) or token 0 in every lane (T == 1); k: 1, or 1/16 for odd g (the
// high nibbles of odd sub-blocks arrive as 16 q)
template <int T, int G8 = ZZ_FMT_Q4_K>
static __device__ __forceinline__ void zz_mma_q4_K_step_v2(const uint4 (&h)[4], const typename zz_dfmt<G8>::q_t (&q)[4],
        const float (&xb)[4],
        const int lane, const zz_lane_q4_K & L, const float k, float (&cm)[16][4], float (&cmin)[4]) {
    const int tq = lane%4;
    float    dsc[4];
    uint32_t x01, x23;
    zz_q4_K_v2_scales<G8>(h, xb, L, k, dsc, x01, x23, cmin);

    uint32_t bs0[8], bs1[8];
    if constexpr (T == 1) {
        // every lane holds token 0: lane (s, tq) makes the B of sub-block s in one rounding
        const uint32_t my0 = zz_h2_bits(__floats2half2_rn(xb[0]*dsc[0], xb[1]*dsc[1]));
        const uint32_t my1 = zz_h2_bits(__floats2half2_rn(xb[2]*dsc[2], xb[3]*dsc[3]));
#pragma unroll
        for (int s = 0; s < 8; ++s) {
            bs0[s] = __shfl_sync(ZZ_FULL_MASK, my0, 4*s + tq);
            bs1[s] = __shfl_sync(ZZ_FULL_MASK, my1, 4*s + tq);
        }
    } else {
        const uint32_t d01 = zz_h2_bits(__floats2half2_rn(dsc[0], dsc[1]));
        const uint32_t d23 = zz_h2_bits(__floats2half2_rn(dsc[2], dsc[3]));
#pragma unroll
        for (int s = 0; s < 8; ++s) {
            bs0[s] = zz_h2_bits(__hmul2(zz_bits_h2(x01), zz_bits_h2(__shfl_sync(ZZ_FULL_MASK, d01, 4*s + tq))));
            bs1[s] = zz_h2_bits(__hmul2(zz_bits_h2(x23), zz_bits_h2(__shfl_sync(ZZ_FULL_MASK, d23, 4*s + tq))));
        }
    }
    zz_q4_K_v2_tiles(q, [&](const int s, const int ep, const uint32_t a0, const uint32_t a1, const uint32_t a2,
            const uint32_t a3) {
        zz_mma_16816(cm[2*s + ep], a0, a1, a2, a3, bs0[s], bs1[s]);
    });
}

// Version 3 (batch 1 only; the default there): the tiles of version 2, but B's 8 columns are the 8 sub-blocks
// instead of 8 copies of token 0. Lane (g, tq) puts x d sc of its own sub-block g in column g of the B of tile s
// and zero in every other tile, so tile s adds only to column s of its accumulator, and the 8 tiles of one ep
// (and p parity) share one: 16 accumulators a lane instead of 64, every element of them an output, and no
// shuffles for B. cm[2 ep + (s/2) % 2]: rows g | g+8, columns s = 2tq | 2tq+1 (only the chain tq % 2 adds to them).
template <int G8 = ZZ_FMT_Q4_K>
static __device__ __forceinline__ void zz_mma_q4_K_step_v3(const uint4 (&h)[4], const typename zz_dfmt<G8>::q_t (&q)[4],
        const float (&xb)[4],
        const int lane, const zz_lane_q4_K & L, const float k, float (&cm)[4][4], float (&cmin)[4]) {
    const int g = lane/4;
#if GGML_SPARSE_CUDA_Q4K_PAIR_SC
    half2 dsc01, dmn01, dsc23, dmn23;
    if constexpr (G8) {
        const half2 k8 = G8 == ZZ_FMT_G8_Q8 ? __floats2half2_rn(128.0f, 128.0f) : __floats2half2_rn(8.0f, 8.0f);
        dsc01 = zz_g8_d2(h[0], h[1], g);
        dsc23 = zz_g8_d2(h[2], h[3], g);
        dmn01 = __hmul2(dsc01, k8);
        dmn23 = __hmul2(dsc23, k8);
    } else {
        zz_q4_K_pair_scales(h[0], h[1], L, dsc01, dmn01);
        zz_q4_K_pair_scales(h[2], h[3], L, dsc23, dmn23);
    }
    const half2 x01 = __floats2half2_rn(xb[0], xb[1]);
    const half2 x23 = __floats2half2_rn(xb[2], xb[3]);
    zz_mma_16816(cmin, zz_h2_bits(dmn01), 0u, zz_h2_bits(dmn23), 0u, zz_h2_bits(x01), zz_h2_bits(x23));
    // x k (d sc): d sc >= d stays a normal f16 where d is one
    const half2    k2  = __float2half2_rn(k);
    const uint32_t my0 = zz_h2_bits(__hmul2(__hmul2(x01, k2), dsc01));
    const uint32_t my1 = zz_h2_bits(__hmul2(__hmul2(x23, k2), dsc23));
#else
    float    dsc[4];
    uint32_t x01, x23;
    zz_q4_K_v2_scales<G8>(h, xb, L, k, dsc, x01, x23, cmin);
    const uint32_t my0 = zz_h2_bits(__floats2half2_rn(xb[0]*dsc[0], xb[1]*dsc[1]));
    const uint32_t my1 = zz_h2_bits(__floats2half2_rn(xb[2]*dsc[2], xb[3]*dsc[3]));
#endif
    zz_q4_K_v2_tiles(q, [&](const int s, const int ep, const uint32_t a0, const uint32_t a1, const uint32_t a2,
            const uint32_t a3) {
        const bool own = g == s;
        zz_mma_16816(cm[2*ep + (s/2)%2], a0, a1, a2, a3, own ? my0 : 0u, own ? my1 : 0u);
    });
}

// one chunk of nv staged columns: cw = blocks (144 B slots), cx = x (XS floats per column)
template <int T, int XS>
static __device__ __forceinline__ void zz_mma_q4_K_chunk(const char * cw, const float * cx, const int nv, const int lane,
        float (&cm)[16][4]) {
    const int g    = lane/4;
    const int tq   = lane%4;
    const int qoff = 16 + 16*g;
    for (int k0 = 0; k0 < nv; k0 += 16) {
        uint4 h[4], q[4];
        float xb[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int col = k0 + 2*tq + (i & 1) + 8*(i >> 1);
            if (col < nv) {
                const char * blk = cw + col*(int) sizeof(block_q4_K);
                h[i]  = *(const uint4 *) blk;
                q[i]  = *(const uint4 *) (blk + qoff);
                xb[i] = g < T ? cx[col*XS + g] : 0.0f;
            } else {
                h[i]  = make_uint4(0, 0, 0, 0);
                q[i]  = make_uint4(0, 0, 0, 0);
                xb[i] = 0.0f;
            }
        }
        zz_mma_q4_K_step(h, q, xb, lane, cm);
    }
}
#endif // AMPERE_MMA_AVAILABLE

// ---------------------------------------------------------------------------------------------------
// GEMV kernel

template <int T>
static constexpr __host__ __device__ int zz_x_stage_stride() {
    return T <= 1 ? 1 : T <= 2 ? 2 : T <= 4 ? 4 : 8;
}

// shared bytes of one warp: two chunk buffers of weights, columns and x
template <ggml_type type, int T>
static constexpr __host__ __device__ int zz_warp_smem() {
    return 2*(zz_type<type>::ch*zz_type<type>::sb + zz_type<type>::ch*(int) sizeof(int) +
              zz_type<type>::ch*zz_x_stage_stride<T>()*(int) sizeof(float));
}

template <int nbytes>
static __device__ __forceinline__ void zz_cp_async(void * dst, const void * src) {
#ifdef CP_ASYNC_AVAILABLE
    const unsigned int d = (unsigned int) __cvta_generic_to_shared(dst);
    if constexpr (nbytes == 16) {
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" : : "r"(d), "l"(src) : "memory");
    } else {
        static_assert(nbytes == 4, "bad cp.async size");
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" : : "r"(d), "l"(src) : "memory");
    }
#else
    if constexpr (nbytes == 16) {
        *(int4 *) dst = *(const int4 *) src;
    } else {
        *(int *) dst = *(const int *) src;
    }
#endif // CP_ASYNC_AVAILABLE
}

static __device__ __forceinline__ void zz_cp_async_commit() {
#ifdef CP_ASYNC_AVAILABLE
    asm volatile("cp.async.commit_group;" : : : "memory");
#endif // CP_ASYNC_AVAILABLE
}

template <int n>
static __device__ __forceinline__ void zz_cp_async_wait() {
#ifdef CP_ASYNC_AVAILABLE
    asm volatile("cp.async.wait_group %0;" : : "n"(n) : "memory");
#endif // CP_ASYNC_AVAILABLE
}

// columns of list positions p + 32*i, i < NPL (-1 past the worker's range)
template <int mode, int NPL>
static __device__ __forceinline__ void zz_fetch_cols(const int32_t * idx, const int p, const int p_end, int (&col)[NPL]) {
#pragma unroll
    for (int i = 0; i < NPL; ++i) {
        const int pi = p + WARP_SIZE*i;
        col[i] = pi < p_end ? (mode == ZZ_GEMV_IDX || mode == ZZ_GEMV_FUSED ? idx[pi] : pi) : -1;
    }
}

// x[0..T) of those columns (0 for -1)
template <int T, int NPL>
static __device__ __forceinline__ void zz_fetch_x(const float * x, const int64_t x_stride, const int (&col)[NPL],
        float (&xv)[NPL][T]) {
#pragma unroll
    for (int i = 0; i < NPL; ++i) {
#pragma unroll
        for (int t = 0; t < T; ++t) {
            xv[i][t] = col[i] >= 0 ? x[t*x_stride + col[i]] : 0.0f;
        }
    }
}

// SKIP (ablation): keep the columns with a nonzero x, in order; returns their number
template <int T, int NPL, int XS>
static __device__ __forceinline__ int zz_stage_skip(const int (&col)[NPL], const float (&xv)[NPL][T], int * s_col, float * s_x,
        const int lane) {
    const uint32_t lt   = (1u << lane) - 1;
    int            base = 0;
#pragma unroll
    for (int i = 0; i < NPL; ++i) {
        bool act = false;
#pragma unroll
        for (int t = 0; t < T; ++t) {
            act = act || xv[i][t] != 0.0f;
        }
        const uint32_t bal = __ballot_sync(ZZ_FULL_MASK, act);
        if (act) {
            const int pos = base + __popc(bal & lt);
            s_col[pos] = col[i];
#pragma unroll
            for (int t = 0; t < T; ++t) {
                s_x[pos*XS + t] = xv[i][t];
            }
        }
        base += __popc(bal);
    }
    return base;
}

template <int NPL>
static __device__ __forceinline__ void zz_stage_cols(const int (&col)[NPL], int * s_col, const int lane) {
#pragma unroll
    for (int i = 0; i < NPL; ++i) {
        s_col[lane + WARP_SIZE*i] = col[i];
    }
}

template <int T, int NPL, int XS>
static __device__ __forceinline__ void zz_stage_x(const float (&xv)[NPL][T], float * s_x, const int lane) {
#pragma unroll
    for (int i = 0; i < NPL; ++i) {
#pragma unroll
        for (int t = 0; t < T; ++t) {
            s_x[(lane + WARP_SIZE*i)*XS + t] = xv[i][t];
        }
    }
}

// cp.async the blocks of the staged columns into s_w (one commit group per chunk)
template <ggml_type type>
static __device__ __forceinline__ void zz_issue(char * s_w, const int * s_col, const int nv, const char * w_row,
        const int last_col, const int lane) {
    typedef zz_type<type> zt;
    constexpr int unit  = zt::cp_unit;
    constexpr int units = zt::sb/unit;
    for (int e = lane; e < nv*units; e += WARP_SIZE) {
        const int    b    = e/units;
        const int    part = e - b*units;
        const int    col  = s_col[b];
        const char * g    = w_row + (int64_t) col*zt::bs;
        const char * g0   = (const char *) ((uintptr_t) g & ~(uintptr_t) (unit - 1));
        char       * d    = s_w + b*zt::sb + part*unit;
        if (unit == 4 && part == units - 1 && g0 == g && col == last_col) {
            // the tensor's last block, 4-byte aligned: its last word would reach 2 bytes past the tensor
            *(uint16_t *) d = *(const uint16_t *) (g0 + part*unit);
        } else {
            zz_cp_async<unit>(d, g0 + part*unit);
        }
    }
    zz_cp_async_commit();
}

// FUSED: the block's own share of the active-column list. A ballot word per 32 columns (|x| >= thr for any
// token, as the LIST op), their exclusive popcount scan, then the columns of rank [r0, r1) (block bx's even
// share of the count) into s_seg, ascending. Every block reads all of x (from L2); returns r1 - r0.
template <int T>
static __device__ int zz_fused_segment(const float * x, const int64_t x_stride, const int n, const float thr,
        uint32_t * s_words, int * s_offs, int * s_seg, const int n1, const int bx) {
    __shared__ int s_part[WARP_SIZE];
    constexpr int U = T == 1 ? 16 : T == 2 ? 8 : 4; // words in flight per warp: one round of L2 latency at batch 1
    const int lane   = threadIdx.x % WARP_SIZE;
    const int warp   = threadIdx.x / WARP_SIZE;
    const int nwarps = blockDim.x / WARP_SIZE;
    const int nwords = (n + WARP_SIZE - 1)/WARP_SIZE;

    for (int w0 = warp; w0 < nwords; w0 += U*nwarps) {
        float v[U][T];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int j = (w0 + u*nwarps)*WARP_SIZE + lane;
#pragma unroll
            for (int t = 0; t < T; ++t) {
                v[u][t] = j < n ? x[t*x_stride + j] : 0.0f;
            }
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int w = w0 + u*nwarps;
            const int j = w*WARP_SIZE + lane;
            bool act = false;
#pragma unroll
            for (int t = 0; t < T; ++t) {
                act = act || sparse_active(v[u][t], thr);
            }
            const uint32_t b = __ballot_sync(ZZ_FULL_MASK, act && j < n);
            if (lane == 0 && w < nwords) {
                s_words[w] = b;
            }
        }
    }
    __syncthreads();

    // exclusive scan of the word popcounts: thread i owns words [i*per, (i+1)*per)
    const int per = (nwords + blockDim.x - 1)/blockDim.x;
    int local = 0;
    for (int k = 0; k < per; ++k) {
        const int w = threadIdx.x*per + k;
        local += w < nwords ? __popc(s_words[w]) : 0;
    }
    int count;
    int run = sparse_block_excl_scan(local, s_part, &count);
    for (int k = 0; k < per; ++k) {
        const int w = threadIdx.x*per + k;
        if (w < nwords) {
            s_offs[w] = run;
            run += __popc(s_words[w]);
        }
    }
    const int r0    = (int) (((int64_t) count*bx)/n1);
    const int r1    = (int) (((int64_t) count*(bx + 1))/n1);
    __syncthreads();

    const uint32_t lt = (1u << lane) - 1;
    for (int w = warp; w < nwords; w += nwarps) {
        const int      off = s_offs[w];
        const uint32_t b   = s_words[w];
        if (off >= r1 || off + __popc(b) <= r0) {
            continue;
        }
        const int r = off + __popc(b & lt);
        if (((b >> lane) & 1) && r >= r0 && r < r1) {
            s_seg[r - r0] = w*WARP_SIZE + lane;
        }
    }
    __syncthreads();
    return r1 - r0;
}

#ifdef AMPERE_MMA_AVAILABLE
// the tensor-core accumulators of tokens [t0, t0 + tp): tile mt, rows g | g+8, tokens 2tq | 2tq+1
template <int T, int B>
static __device__ __forceinline__ void zz_mma_put(const float (&cm)[16][4], const int lane, const int t0, const int tp,
        float * red_w) {
    const int g  = lane/4;
    const int tq = lane%4;
#pragma unroll
    for (int mt = 0; mt < 16; ++mt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int t = 2*tq + (e & 1);
            const int o = 64*(g/2) + 16*(g%2) + mt + 32*(e >> 1);
            if (t < T && t >= t0 && t < t0 + tp) {
                red_w[(t - t0)*B + o] = cm[mt][e];
            }
        }
    }
}

// version 2: tile mt = 4p + 2h + ep, rows g | g+8 -> output 32(2p + h) + 4g + 2ep + (0 | 1), tokens 2tq | 2tq+1;
// the accumulators are in units of 2^-24 and the sub-block's min term (cmin of lane 4s + tq) comes off
template <int T, int B>
static __device__ __forceinline__ void zz_mma_put_v2(const float (&cm)[16][4], const float (&cmin)[4], const int lane,
        const int t0, const int tp, float * red_w) {
    const int g  = lane/4;
    const int tq = lane%4;
    float mn[8][2];
#pragma unroll
    for (int s = 0; s < 8; ++s) {
        mn[s][0] = __shfl_sync(ZZ_FULL_MASK, cmin[0], 4*s + tq);
        mn[s][1] = __shfl_sync(ZZ_FULL_MASK, cmin[1], 4*s + tq);
    }
#pragma unroll
    for (int mt = 0; mt < 16; ++mt) {
        const int s = 2*(mt/4) + (mt/2)%2;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int t = 2*tq + (e & 1);
            const int o = 32*s + 4*g + 2*(mt%2) + (e >> 1);
            if (t < T && t >= t0 && t < t0 + tp) {
                red_w[(t - t0)*B + o] = cm[mt][e]*16777216.0f - mn[s][e & 1];
            }
        }
    }
}

// version 3 (T = 1): cm[2 ep + c] summed over c, rows g | g+8 -> output 32 s + 4g + 2ep + (0 | 1), s = 2tq | 2tq+1;
// units of 2^-24, and the min term of sub-block s (cmin of lane 4s) comes off
static __device__ __forceinline__ void zz_mma_put_v3(const float (&cm)[4][4], const float (&cmin)[4], const int lane,
        float * red_w) {
    const int g  = lane/4;
    const int tq = lane%4;
    const float mn0 = __shfl_sync(ZZ_FULL_MASK, cmin[0], 4*(2*tq));
    const float mn1 = __shfl_sync(ZZ_FULL_MASK, cmin[0], 4*(2*tq + 1));
#pragma unroll
    for (int ep = 0; ep < 2; ++ep) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int s = 2*tq + (e & 1);
            const int o = 32*s + 4*g + 2*ep + (e >> 1);
            red_w[o] = (cm[2*ep][e] + cm[2*ep + 1][e])*16777216.0f - (e & 1 ? mn1 : mn0);
        }
    }
}
#endif // AMPERE_MMA_AVAILABLE

// the EARLY flag as thread 0 reads it: an acquire, no fence after it (H100 decode GEMV chain 1.5-2.3 % faster than
// the relaxed read + __threadfence, 7 % with no active column: bench/results/cuda_h100_2026-11-27i.md), or with
// -DGGML_SPARSE_CUDA_FLAG_FENCE relaxed (volatile) with the fence after it. Compile time: any branch on it in the
// direct kernel's loop changes that kernel's registers. No "memory" clobber: what it orders, the reduction's
// atomics, comes after a __syncthreads
static __device__ __forceinline__ int zz_flag_read(const int * p) {
#ifndef GGML_SPARSE_CUDA_FLAG_FENCE
    int v;
    asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p));
    return v;
#else
    return *(const volatile int *) p;
#endif
}

// partial sums of the block's warps -> y: put(t0, tp, red_w) writes the calling warp's partials of tokens
// [t0, t0 + tp) to red_w[(t - t0)*B + output]; red_mode says how the n1 blocks of a block-row combine.
// Shared memory: n2*tokens_per_pass*B floats at smem (may alias buffers the caller is done with), and for
// the cluster mode T*B floats at smem + red_bytes.
// Ticket mode: ws holds a [T][B] slot per block ((row*n1 + bx)*T*B), tickets one int per block-row, zero
// on entry and left at zero (the last block resets it; the next launch sees that after its PDL wait, as
// every GEMV kernel touches ws and tickets only after ggml_cuda_pdl_sync()).
// First mode (no memset, no copy of the bias into y): the block that draws ticket 0 of its block-row writes
// y = sum + bias, makes the stores visible and raises ZZ_FIRST_FLAG; the others wait for the flag, then
// atomicAdd. Only blocks that already run can hold ticket 0, so the wait ends. A second counter,
// tickets[ZZ_TICKET_ROWS + row], counts the blocks done with the first; the last one resets both.
// Early mode: as first, but the ticket is drawn right after the PDL wait (zz_red_early) and that block only sets
// y to the bias (or 0) before its own work; every block waits for the flag at its reduction, then atomicAdds.
// Its tail has no round trip to wait for: flag_hint (the flag as thread 0 read it during the last steps, else 0)
// spares the poll when the flag was up by then, and the done counter is drawn as soon as the flag is seen, its
// value needed only at the end (flag_hint -1: as FIRST, the poll and then the done counter at the end).
// row numbers the block-row in the grid (ticket slots and counters), row_y its outputs in y.
// bias (nullptr: none, else laid out like y with its own row stride) is added where y is written; with atomics
// the launcher has copied it into y first.
template <int T, int B, typename F>
static __device__ __forceinline__ void zz_gemv_reduce(F put, float * y, const int64_t y_stride, const int row, const int row_y,
        const int tokens_per_pass, const int red_mode, char * smem, const int red_bytes, float * ws, int * tickets,
        const float * bias = nullptr, const int64_t bias_stride = 0, const int flag_hint = 0, const bool v4 = false) {
    const int warp = threadIdx.x / WARP_SIZE;
    const int n2   = blockDim.x / WARP_SIZE;
    float * red = (float *) smem;
    float * tot = (float *) (smem + red_bytes); // cluster: [T][B]
    float * slot = red_mode == ZZ_RED_TICKET ? ws + ((int64_t) row*gridDim.x + blockIdx.x)*(T*B) : nullptr;
    bool first = false; // FIRST: this block stores
    int  done  = -1;    // EARLY: thread 0's draw of the done counter
    if (red_mode == ZZ_RED_FIRST || red_mode == ZZ_RED_EARLY) {
        __shared__ int s_first;
        if (threadIdx.x == 0) {
            const int ticket = red_mode == ZZ_RED_FIRST ? atomicAdd(tickets + row, 1) : 1;
            if (ticket != 0) {
                if (flag_hint < ZZ_FIRST_FLAG) {
                    while (zz_flag_read(tickets + row) < ZZ_FIRST_FLAG) {
#if __CUDA_ARCH__ >= GGML_CUDA_CC_VOLTA
                        __nanosleep(32);
#endif
                    }
                }
                // acquire: the first block's stores before this block's atomics (by default the flag read was one)
#ifdef GGML_SPARSE_CUDA_FLAG_FENCE
                __threadfence();
#endif
            }
            s_first = ticket == 0;
            if (red_mode == ZZ_RED_EARLY && flag_hint >= 0) {
                done = atomicAdd(tickets + ZZ_TICKET_ROWS + row, 1); // (read at the end)
            }
        }
        __syncthreads();
        first = s_first;
    }
    __syncthreads();
    for (int t0 = 0; t0 < T; t0 += tokens_per_pass) {
        const int tp = min(tokens_per_pass, T - t0);
        put(t0, tp, red + warp*tokens_per_pass*B);
        __syncthreads();
#if __CUDA_ARCH__ >= GGML_CUDA_CC_HOPPER
        if (v4 && !first && (red_mode == ZZ_RED_ATOMIC || red_mode == ZZ_RED_FIRST || red_mode == ZZ_RED_EARLY)) {
            // a quarter of the atomics: 4 outputs each (B % 4 == 0; the launcher checked y's alignment)
            for (int e = 4*threadIdx.x; e < tp*B; e += 4*blockDim.x) {
                float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                for (int wi = 0; wi < n2; ++wi) {
                    const float4 r = *(const float4 *) (red + wi*tokens_per_pass*B + e);
                    sum.x += r.x;
                    sum.y += r.y;
                    sum.z += r.z;
                    sum.w += r.w;
                }
                atomicAdd((float4 *) (y + (t0 + e/B)*y_stride + (int64_t) row_y*B + e%B), sum);
            }
            __syncthreads();
            continue;
        }
#endif // __CUDA_ARCH__ >= GGML_CUDA_CC_HOPPER
        for (int e = threadIdx.x; e < tp*B; e += blockDim.x) {
            float sum = 0.0f;
            for (int wi = 0; wi < n2; ++wi) {
                sum += red[wi*tokens_per_pass*B + e];
            }
            const int     t  = t0 + e/B;
            const int64_t iy = t*y_stride + (int64_t) row_y*B + e%B;
            if (red_mode == ZZ_RED_STORE || first) {
                y[iy] = bias ? sum + bias[t*bias_stride + (int64_t) row_y*B + e%B] : sum;
            } else if (red_mode == ZZ_RED_TICKET) {
                __stcg(slot + t*B + e%B, sum);
            } else if (red_mode == ZZ_RED_ATOMIC || red_mode == ZZ_RED_FIRST || red_mode == ZZ_RED_EARLY) {
                atomicAdd(y + iy, sum);
            } else {
                tot[t*B + e%B] = sum;
            }
        }
        __syncthreads();
    }

    if (red_mode == ZZ_RED_FIRST || red_mode == ZZ_RED_EARLY) {
        if (first) {
            __threadfence(); // every thread's stores, before thread 0 raises the flag
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            if (first) {
                atomicAdd(tickets + row, ZZ_FIRST_FLAG);
            }
            // every block has drawn its ticket and seen the flag: the last one resets the counters
            if (red_mode == ZZ_RED_FIRST || flag_hint < 0) {
                done = atomicAdd(tickets + ZZ_TICKET_ROWS + row, 1);
            }
            if (done == (int) gridDim.x - 1) {
                *(volatile int *) (tickets + row)                  = 0;
                *(volatile int *) (tickets + ZZ_TICKET_ROWS + row) = 0;
            }
        }
    }

    if (red_mode == ZZ_RED_TICKET) {
        // threadFenceReduction pattern: every thread's slot stores are visible device-wide before the block
        // takes its ticket; the block that draws n1 - 1 knows every slot of its block-row is complete
        int * s_last = (int *) smem; // red is free again (the loop above ended with a barrier)
        __threadfence();
        __syncthreads();
        if (threadIdx.x == 0) {
            const int  ticket = atomicAdd(tickets + row, 1);
            const bool last   = ticket == (int) gridDim.x - 1;
            if (last) {
                *(volatile int *) (tickets + row) = 0; // every block of this row has drawn: ready for the next launch
            }
            *s_last = last;
        }
        __syncthreads();
        if (*s_last) {
            __threadfence(); // acquire side of the ticket
            const float * ws_row = ws + (int64_t) row*gridDim.x*(T*B);
            const int     nb     = gridDim.x;
            for (int e = threadIdx.x; e < T*B; e += blockDim.x) {
                float sum = 0.0f;
                // fixed block order: the result does not depend on which block came last; L2 loads (.cg),
                // never a stale L1 line
#pragma unroll 8
                for (int b = 0; b < nb; ++b) {
                    sum += __ldcg(ws_row + (int64_t) b*(T*B) + e);
                }
                if (bias) {
                    sum += bias[(e/B)*bias_stride + (int64_t) row_y*B + e%B];
                }
                y[(e/B)*y_stride + (int64_t) row_y*B + e%B] = sum;
            }
        }
    }

#if !defined(GGML_USE_HIP) && !defined(GGML_USE_MUSA) && __CUDA_ARCH__ >= GGML_CUDA_CC_HOPPER
    if (red_mode == ZZ_RED_CLUSTER) {
        // the cluster is the n1 blocks of this block-row; block r sums slice r of every block's totals
        cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
        cluster.sync();
        const int nb   = (int) cluster.num_blocks();
        const int rank = (int) cluster.block_rank();
        for (int e = rank*blockDim.x + threadIdx.x; e < T*B; e += nb*blockDim.x) {
            float sum = 0.0f;
            for (int r = 0; r < nb; ++r) {
                sum += cluster.map_shared_rank(tot, r)[e];
            }
            if (bias) {
                sum += bias[(e/B)*bias_stride + (int64_t) row_y*B + e%B];
            }
            y[(e/B)*y_stride + (int64_t) row_y*B + e%B] = sum;
        }
        cluster.sync(); // peers' shared memory must outlive the reads
    }
#endif
}

// B = 32 types: the column slots of a warp hold partial sums of the same outputs; after this every slot holds the sum
template <ggml_type type, int T>
static __device__ __forceinline__ void zz_slot_sum(float (&acc)[T][zz_type<type>::opl]) {
#pragma unroll
    for (int off = zz_type<type>::lpc; off < WARP_SIZE; off <<= 1) {
#pragma unroll
        for (int t = 0; t < T; ++t) {
#pragma unroll
            for (int k = 0; k < zz_type<type>::opl; ++k) {
                acc[t][k] += __shfl_xor_sync(ZZ_FULL_MASK, acc[t][k], off);
            }
        }
    }
}

// the warp's sums (lanes < lpc after zz_slot_sum) of tokens [t0, t0 + tp) to red_w[(t - t0)*B + output]
template <ggml_type type, int T>
static __device__ __forceinline__ void zz_lane_put(const float (&acc)[T][zz_type<type>::opl], const float (&accm)[T],
        const typename zz_type<type>::lane_t & ls, const int lane, const int t0, const int tp, float * red_w) {
    if (lane >= zz_type<type>::lpc) {
        return;
    }
#pragma unroll
    for (int t = 0; t < T; ++t) {
        if (t >= t0 && t < t0 + tp) {
#pragma unroll
            for (int k = 0; k < zz_type<type>::opl; ++k) {
                red_w[(t - t0)*zz_type<type>::B + zz_out(ls, lane, k)] = acc[t][k] - accm[t];
            }
        }
    }
}

// the (active) columns of the calling warp: [p_begin, p_end) of the list idx points to on return. DENSE: every
// column (idx unused); IDX: idx itself (read after the PDL wait), split evenly over the row's warps in the grid;
// FUSED: the block's even share of the columns with |x| >= thr, found after the PDL wait into shared memory at
// fused (zz_fused_smem bytes; stats counts them), split evenly over the block's warps
template <int T, int mode>
static __device__ __forceinline__ void zz_warp_share(const float * x, const int64_t x_stride, const int32_t *& idx,
        const int n, const float thr, char * fused, unsigned long long * stats, int & p_begin, int & p_end) {
    const int warp = threadIdx.x / WARP_SIZE;
    const int n2   = blockDim.x / WARP_SIZE;
    int count;
    int nw;
    int wid;
    if (mode == ZZ_GEMV_FUSED) {
        ggml_cuda_pdl_sync(); // x comes from an earlier kernel
        const int  nwords  = (n + WARP_SIZE - 1)/WARP_SIZE;
        uint32_t * s_words = (uint32_t *) fused;
        int      * s_offs  = (int *) (s_words + nwords);
        int      * s_seg   = s_offs + nwords;
        count = zz_fused_segment<T>(x, x_stride, n, thr, s_words, s_offs, s_seg, gridDim.x, blockIdx.x);
        idx   = s_seg; // the block's share; its warps split it
        if (stats != nullptr && blockIdx.y == 0 && threadIdx.x == 0) {
            if (blockIdx.x == 0) {
                sparse_stats_add(stats, n, count);
            } else if (count != 0) {
                atomicAdd(stats + 2, (unsigned long long) count);
            }
        }
        nw    = n2;
        wid   = warp;
    } else {
        if (mode == ZZ_GEMV_IDX) {
            ggml_cuda_pdl_sync(); // idx comes from an earlier kernel
        }
        count = mode == ZZ_GEMV_IDX ? idx[n] : n;
        nw    = gridDim.x*n2;
        wid   = blockIdx.x*n2 + warp;
    }
    p_begin = (int) (((int64_t) count*wid)/nw);
    p_end   = (int) (((int64_t) count*(wid + 1))/nw);
}

template <ggml_type type, int T, int mode>
static __global__ void __launch_bounds__(ZZ_GEMV_MAX_WARPS*WARP_SIZE) mul_mat_zz_gemv(
        const char * w, const float * x, const int32_t * idx, float * y, const int n, const int64_t x_stride,
        const int64_t y_stride, const int tokens_per_pass, const int red_mode, const float thr, const int fused_off,
        float * ws, int * tickets, unsigned long long * stats) {
    typedef zz_type<type> zt;
    constexpr int B     = zt::B;
    constexpr int bs    = zt::bs;
    constexpr int sb    = zt::sb;
    constexpr int lpc   = zt::lpc;
    constexpr int opl   = zt::opl;
    constexpr int CH    = zt::ch;
    constexpr int NPL   = CH/WARP_SIZE;     // columns fetched per lane and chunk
    constexpr int cpw   = WARP_SIZE/lpc;    // columns per warp step
    constexpr int U     = 2;                // warp steps in flight (from shared memory)
    constexpr int XS    = zz_x_stage_stride<T>();
    constexpr int wsm   = zz_warp_smem<type, T>();

    extern __shared__ __align__(16) char zz_smem[];

    ggml_cuda_pdl_lc();

    const int lane = threadIdx.x % WARP_SIZE;
    const int warp = threadIdx.x / WARP_SIZE;
    const int n2   = blockDim.x / WARP_SIZE;
    const int row  = blockIdx.y;
    const int slot = lane / lpc;

    typename zt::lane_t ls;
    zz_lane_init(ls, lane);

    // per warp: s_w[2][CH*sb], s_col[2][CH], s_x[2][CH*XS]
    char  * s_w   = zz_smem + warp*wsm;
    int   * s_col = (int *) (s_w + 2*CH*sb);
    float * s_x   = (float *) (s_col + 2*CH);

    const char * w_row    = w + (int64_t) row*n*bs;
    const int    last_col = row == (int) gridDim.y - 1 ? n - 1 : -1;

    int p_begin;
    int p_end;
    zz_warp_share<T, mode>(x, x_stride, idx, n, thr, zz_smem + fused_off, stats, p_begin, p_end);

    float acc[T][opl];
    float accm[T];
#pragma unroll
    for (int t = 0; t < T; ++t) {
        accm[t] = 0.0f;
#pragma unroll
        for (int k = 0; k < opl; ++k) {
            acc[t][k] = 0.0f;
        }
    }
#ifdef AMPERE_MMA_AVAILABLE
    constexpr bool use_mma = type == GGML_TYPE_Q4_K;
    float cm[16][4]; // tensor-core path: tile mt, (row g | g+8) x (token 2tq | 2tq+1)
#pragma unroll
    for (int mt = 0; mt < 16; ++mt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            cm[mt][e] = 0.0f;
        }
    }
#else
    constexpr bool use_mma = false;
#endif // AMPERE_MMA_AVAILABLE

    // pipeline: chunk k+1 is staged and its blocks are in flight (cp.async) while chunk k is computed,
    // and the (column, x) of chunk k+2 are being fetched into registers. The blocks of a chunk are
    // requested as soon as its columns are known; its x is loaded meanwhile.
    int   pcol[NPL];
    float px[NPL][T];
    int   nv_cur = 0;
    if (mode == ZZ_GEMV_DENSE && p_begin < p_end) {
        // the weights do not depend on earlier kernels: request them before waiting for those (PDL)
        zz_fetch_cols<mode, NPL>(idx, p_begin + lane, p_end, pcol);
        zz_stage_cols<NPL>(pcol, s_col, lane);
        nv_cur = min(CH, p_end - p_begin);
        __syncwarp();
        zz_issue<type>(s_w, s_col, nv_cur, w_row, last_col, lane);
    }

    ggml_cuda_pdl_sync();

    if ((mode == ZZ_GEMV_IDX || mode == ZZ_GEMV_FUSED) && p_begin < p_end) {
        zz_fetch_cols<mode, NPL>(idx, p_begin + lane, p_end, pcol);
        zz_stage_cols<NPL>(pcol, s_col, lane);
        nv_cur = min(CH, p_end - p_begin);
        __syncwarp();
        zz_issue<type>(s_w, s_col, nv_cur, w_row, last_col, lane);
    }
    if (p_begin < p_end) {
        if (mode == ZZ_GEMV_SKIP) {
            zz_fetch_cols<mode, NPL>(idx, p_begin + lane, p_end, pcol);
        }
        zz_fetch_x<T, NPL>(x, x_stride, pcol, px);
        if (mode == ZZ_GEMV_SKIP) {
            nv_cur = zz_stage_skip<T, NPL, XS>(pcol, px, s_col, s_x, lane);
            __syncwarp();
            zz_issue<type>(s_w, s_col, nv_cur, w_row, last_col, lane);
        } else {
            zz_stage_x<T, NPL, XS>(px, s_x, lane);
        }
    }
    zz_fetch_cols<mode, NPL>(idx, p_begin + CH + lane, p_end, pcol);
    zz_fetch_x<T, NPL>(x, x_stride, pcol, px);

    int buf = 0;
    for (int p0 = p_begin; p0 < p_end; p0 += CH) {
        int nv_next = 0;
        if (p0 + CH < p_end) {
            char  * nw_  = s_w   + (buf ^ 1)*CH*sb;
            int   * ncol = s_col + (buf ^ 1)*CH;
            float * nx   = s_x   + (buf ^ 1)*CH*XS;
            if (mode == ZZ_GEMV_SKIP) {
                nv_next = zz_stage_skip<T, NPL, XS>(pcol, px, ncol, nx, lane);
                __syncwarp();
                zz_issue<type>(nw_, ncol, nv_next, w_row, last_col, lane);
            } else {
                zz_stage_cols<NPL>(pcol, ncol, lane);
                nv_next = min(CH, p_end - (p0 + CH));
                __syncwarp();
                zz_issue<type>(nw_, ncol, nv_next, w_row, last_col, lane);
                zz_stage_x<T, NPL, XS>(px, nx, lane);
            }
            zz_fetch_cols<mode, NPL>(idx, p0 + 2*CH + lane, p_end, pcol);
            zz_fetch_x<T, NPL>(x, x_stride, pcol, px);
            zz_cp_async_wait<1>();
        } else {
            zz_cp_async_wait<0>();
        }
        __syncwarp();

        const char  * cw   = s_w   + buf*CH*sb;
        const int   * ccol = s_col + buf*CH;
        const float * cx   = s_x   + buf*CH*XS;
#ifdef AMPERE_MMA_AVAILABLE
        if constexpr (use_mma) {
            zz_mma_q4_K_chunk<T, XS>(cw, cx, nv_cur, lane, cm);
        }
#endif // AMPERE_MMA_AVAILABLE
        for (int c0 = 0; c0 < nv_cur && !use_mma; c0 += U*cpw) {
            typename zt::data_t dat[U];
#pragma unroll
            for (int uu = 0; uu < U; ++uu) {
                const int c = c0 + uu*cpw + slot;
                if (c < nv_cur) {
                    // the block's copy starts at (its global address & 3) in its slot
                    const int off = bs % 4 == 0 ? 0 : (int) (((uintptr_t) w_row + (uintptr_t) ccol[c]*bs) & 3);
                    zz_load(dat[uu], cw + c*sb + off, ls);
                }
            }
#pragma unroll
            for (int uu = 0; uu < U; ++uu) {
                const int c = c0 + uu*cpw + slot;
                if (c < nv_cur) {
                    float xt[T];
#pragma unroll
                    for (int t = 0; t < T; ++t) {
                        xt[t] = cx[c*XS + t];
                    }
                    zz_accum<T>(dat[uu], ls, xt, acc, accm);
                }
            }
        }
        __syncwarp();
        nv_cur = nv_next;
        buf ^= 1;
    }

    zz_slot_sum<type, T>(acc);

    // cross-warp reduction; red aliases the pipeline buffers
    const int red_bytes = max(n2*wsm, n2*tokens_per_pass*B*(int) sizeof(float));
    zz_gemv_reduce<T, B>([&](const int t0, const int tp, float * red_w) {
#ifdef AMPERE_MMA_AVAILABLE
        if constexpr (use_mma) {
            zz_mma_put<T, B>(cm, lane, t0, tp, red_w);
        }
#endif // AMPERE_MMA_AVAILABLE
        if (!use_mma) {
            zz_lane_put<type, T>(acc, accm, ls, lane, t0, tp, red_w);
        }
    }, y, y_stride, row, row, tokens_per_pass, red_mode, zz_smem, red_bytes, ws, tickets);
}

// y[t][off + i] = bias[t][off + i] (or 0) for the flat indices e = t*m + i from e0 below m*T, step de
static __device__ __forceinline__ void zz_y_set(float * y, const int64_t y_stride, const float * bias,
        const int64_t bias_stride, const int64_t off, const int64_t m, const int T, const int64_t e0, const int64_t de) {
    for (int64_t e = e0; e < m*T; e += de) {
        y[(e/m)*y_stride + off + e % m] = bias ? bias[(e/m)*bias_stride + off + e % m] : 0.0f;
    }
}

// EARLY reduction, right after the PDL wait: warp 0 draws the block-row's ticket; the block that draws 0 sets the
// row's outputs to the bias (or 0), then raises the flag the other blocks' reductions wait for. The other warps
// start at once.
template <int T, int B>
static __device__ __forceinline__ void zz_red_early(float * y, const int64_t y_stride, const int row, const int row_y,
        const float * bias, const int64_t bias_stride, int * tickets) {
    if (threadIdx.x >= WARP_SIZE) {
        return;
    }
    int ticket = 0;
    if (threadIdx.x == 0) {
        ticket = atomicAdd(tickets + row, 1);
    }
    if (__shfl_sync(ZZ_FULL_MASK, ticket, 0) != 0) {
        return;
    }
    zz_y_set(y, y_stride, bias, bias_stride, (int64_t) row_y*B, B, T, threadIdx.x, WARP_SIZE);
    __threadfence();
    __syncwarp();
    if (threadIdx.x == 0) {
        atomicAdd(tickets + row, ZZ_FIRST_FLAG);
    }
}

// Q8_0, Q4_0 and Q6_K, batch 1-8, blocks straight from global memory into registers (the staged kernel above
// reads ~0.9 TB/s on the H100 with these types, stock mmvq ~1.6: bench/results/cuda_types_h100_2026-12-07d.md).
// H100 against the staged kernel at batch 1: Q8_0 and Q4_0 1.24-1.55x as fast, Q6_K 0.92-1.07x (dense slower, 50 %
// faster); dense still 0.65-0.78x as fast as stock mmvq on Q8_0 / Q4_0 (bench/results/cuda_types_h100_2026-12-07f.md).
// The lanes keep zz_type's layout (lpc lanes a column, 32/lpc columns a warp step); the warp takes U steps a
// round and loads the next round's blocks while it computes this one. Blocks are 2-byte aligned:
//   Q8_0, Q4_0: bs = 2 + 4*lpc; lane k loads the two aligned words around its quant bytes 4k..4k+3 and shifts them
//   into place, the scale is in the word the column's first lane loaded (a shuffle);
//   Q6_K: one column a step, each lane loading its bytes as zz_load does from shared memory.
template <ggml_type type>
struct zz_ldg_raw {
    uint32_t w0;
    uint32_t w1;
};
template <>
struct zz_ldg_raw<GGML_TYPE_Q6_K> {
    zz_data_q6_K d;
};

// lane's share of the block at byte offset off of w (last: the tensor's last block, not to be read past)
template <ggml_type type>
static __device__ __forceinline__ void zz_ldg_load(const char * w, const int64_t off, const bool last, const int lane,
        const typename zz_type<type>::lane_t & ls, zz_ldg_raw<type> & r) {
    if constexpr (type == GGML_TYPE_Q6_K) {
        GGML_UNUSED(last);
        GGML_UNUSED(lane);
        zz_load(r.d, w + off, ls);
    } else {
        GGML_UNUSED(ls);
        constexpr int lpc = zz_type<type>::lpc;
        static_assert(zz_type<type>::bs == 2 + 4*lpc, "a B = 32 block: the scale, then 4 quant bytes a lane");
        const int        k = lane % lpc;
        const uint32_t * p = (const uint32_t *) (w + (off & ~(int64_t) 3)) + k;
        r.w0 = __ldg(p);
        if (last && (off & 2) == 0 && k == lpc - 1) {
            r.w1 = __ldg((const uint16_t *) (p + 1)); // bytes 2-3 of that word lie past the block
        } else {
            r.w1 = __ldg(p + 1);
        }
    }
}

// the loaded share as zz_accum takes it (every lane of the warp calls it: B = 32 types shuffle)
template <ggml_type type>
static __device__ __forceinline__ void zz_ldg_data(const zz_ldg_raw<type> & r, const int64_t off, const int lane,
        typename zz_type<type>::data_t & d) {
    if constexpr (type == GGML_TYPE_Q6_K) {
        GGML_UNUSED(off);
        GGML_UNUSED(lane);
        d = r.d;
    } else {
        constexpr int  lpc = zz_type<type>::lpc;
        const bool     odd = (off & 2) != 0; // block at 4i + 2: scale in the high half of word 0, quants from word 1
        const uint32_t hw  = __shfl_sync(ZZ_FULL_MASK, r.w0, lane - lane % lpc);
        d.q = odd ? r.w1 : __funnelshift_r(r.w0, r.w1, 16);
        d.d = __half2float(__ushort_as_half((uint16_t) (odd ? hw >> 16 : hw & 0xFFFF)));
    }
}

template <ggml_type type, int T, int mode, int U>
static __global__ void __launch_bounds__(ZZ_GEMV_MAX_WARPS*WARP_SIZE) mul_mat_zz_gemv_ldg(
        const char * w, const float * x, const int32_t * idx, float * y, const int n, const int64_t x_stride,
        const int64_t y_stride, const int tokens_per_pass, const int red_mode, const float thr, const int fused_off,
        float * ws, int * tickets, unsigned long long * stats) {
    typedef zz_type<type> zt;
    constexpr int B   = zt::B;
    constexpr int bs  = zt::bs;
    constexpr int lpc = zt::lpc;
    constexpr int opl = zt::opl;
    constexpr int cpw = WARP_SIZE/lpc;      // columns a warp step

    extern __shared__ __align__(16) char zz_smem[];

    ggml_cuda_pdl_lc();

    const int lane = threadIdx.x % WARP_SIZE;
    const int slot = lane / lpc;
    const int row  = blockIdx.y;

    typename zt::lane_t ls;
    zz_lane_init(ls, lane);

    int p_begin;
    int p_end;
    zz_warp_share<T, mode>(x, x_stride, idx, n, thr, zz_smem + fused_off, stats, p_begin, p_end);

    const int64_t row_off = (int64_t) row*n*bs;
    const int64_t last    = row == (int) gridDim.y - 1 ? row_off + (int64_t) (n - 1)*bs : -1;

    // A round is U steps of columns (-1 past the share: they load column 0's block and add nothing). While round r
    // is computed, its successor's blocks and x are in flight and the columns of round r + 2 are being read.
    constexpr int R = U*cpw; // columns a round
    auto cols = [&](const int p0, int (&c)[U]) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int p = p0 + u*cpw + slot;
            c[u] = p < p_end ? (mode == ZZ_GEMV_DENSE ? p : idx[p]) : -1;
        }
    };
    auto load_w = [&](const int (&c)[U], zz_ldg_raw<type> (&r)[U]) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int64_t off = row_off + (int64_t) max(c[u], 0)*bs;
            zz_ldg_load<type>(w, off, off == last, lane, ls, r[u]);
        }
    };
    auto load_x = [&](const int (&c)[U], float (&xv)[U][T]) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
#pragma unroll
            for (int t = 0; t < T; ++t) {
                xv[u][t] = c[u] >= 0 ? x[t*x_stride + c[u]] : 0.0f;
            }
        }
    };

    int              col[U];  // the round in flight
    zz_ldg_raw<type> raw[U];
    float            xin[U][T];
    int              ncol[U]; // the round after it
    cols(p_begin, col);
    if (mode == ZZ_GEMV_DENSE) {
        load_w(col, raw); // the weights do not depend on earlier kernels: request them before waiting for those (PDL)
    }
    ggml_cuda_pdl_sync();
    if (red_mode == ZZ_RED_EARLY) {
        zz_red_early<T, B>(y, y_stride, row, row, nullptr, 0, tickets);
    }
    if (mode != ZZ_GEMV_DENSE) {
        load_w(col, raw);
    }
    load_x(col, xin);
    cols(p_begin + R, ncol);

    float acc[T][opl];
    float accm[T];
#pragma unroll
    for (int t = 0; t < T; ++t) {
        accm[t] = 0.0f;
#pragma unroll
        for (int i = 0; i < opl; ++i) {
            acc[t][i] = 0.0f;
        }
    }

    for (int p0 = p_begin; p0 < p_end; p0 += R) {
        int              ccol[U];
        zz_ldg_raw<type> craw[U];
        float            cx[U][T];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            ccol[u] = col[u];
            craw[u] = raw[u];
#pragma unroll
            for (int t = 0; t < T; ++t) {
                cx[u][t] = xin[u][t];
            }
        }
        if (p0 + R < p_end) {
#pragma unroll
            for (int u = 0; u < U; ++u) {
                col[u] = ncol[u];
            }
            load_w(col, raw);
            load_x(col, xin);
            cols(p0 + 2*R, ncol);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            typename zt::data_t d;
            zz_ldg_data<type>(craw[u], row_off + (int64_t) max(ccol[u], 0)*bs, lane, d);
            if (ccol[u] >= 0) {
                zz_accum<T>(d, ls, cx[u], acc, accm);
            }
        }
    }

    zz_slot_sum<type, T>(acc);

    const int n2        = blockDim.x / WARP_SIZE;
    const int red_bytes = n2*tokens_per_pass*B*(int) sizeof(float);
    zz_gemv_reduce<T, B>([&](const int t0, const int tp, float * red_w) {
        zz_lane_put<type, T>(acc, accm, ls, lane, t0, tp, red_w);
    }, y, y_stride, row, row, tokens_per_pass, red_mode, zz_smem, red_bytes, ws, tickets);
}

// Q4_K, batch 1-8, weights straight from global memory into registers (no shared-memory staging): a warp
// walks its columns 16 at a time (one m16n8k16 K-step), lane (g, tq) loading the header and quant bytes
// 16g..16g+15 of its 4 columns' blocks, ZZ_DIRECT_STEPS steps in flight. The staged kernel above pays a
// chain of dependent latencies per chunk (index, cp.async, shared loads); here the only chain is
// index -> block, and the next steps' indices are fetched while a step computes.
//   DENSE, IDX: the warps of a block-row split its (active) columns evenly.
//   FUSED: no list. The warps split the row's n columns evenly and each finds its active ones itself
//   (|x| >= thr for any token: a ballot per 32 columns, compacted into a small per-warp queue in shared
//   memory), so no LIST launch and no list round trip; the price is the lost load balancing.
#define ZZ_DIRECT_STEPS 2
// The direct kernel runs n2 <= 4 warps a block. At ~170 registers a thread (its 64 accumulators + two steps
// of blocks) an SM holds only 2 such blocks; bounding it to 168 lets 3 fit (12 warps, +50 % loads in flight).
// Version 3 (batch 1) keeps 16 accumulators and fits 4 blocks (16 warps) in 128 registers without spills: on the
// H100 +0.3-4.7 % end to end dense and at 0.25-0.65 against version 2 (bench/results/cuda_h100_2026-11-26i.md), all
// of it from the fourth block: on version 2's grid (3 blocks an SM) it is 1-9 % slower.
#define ZZ_DIRECT_MAX_WARPS 4
#ifndef ZZ_DIRECT_MIN_BLOCKS
#define ZZ_DIRECT_MIN_BLOCKS 3
#endif
#ifndef ZZ_DIRECT_MIN_BLOCKS_V3
#define ZZ_DIRECT_MIN_BLOCKS_V3 4 // version 3 (16 accumulators a lane instead of 64) fits 4 blocks in 128 registers
#endif
#define ZZ_DIRECT_QUEUE 64 // queued active columns per warp (< 16*ZZ_DIRECT_STEPS left + 32 new)

// The weights of one direct launch: up to ZZ_GROUP_MAX weights of the same width that read the same x (q/k/v,
// gate/up), their block-rows one after another in grid.y. Segment s holds grid rows [row_end[s-1], row_end[s]).
// Fused neighbours (ggml_cuda_op_mul_mat_zz_fuse): bias[s] is added to y[s] (a residual add), and with up set
// the input is silu(x)*up (SwiGLU), computed where x is read. With norm_w set the input is RMS-normed:
// x_t/rms(x_t)*norm_w (a fused RMS_NORM + MUL; every block finds the scales itself).
struct zz_segs {
    int           nseg;
    int           row_end[ZZ_GROUP_MAX];
    const char  * w[ZZ_GROUP_MAX];
    float       * y[ZZ_GROUP_MAX];
    int64_t       y_stride[ZZ_GROUP_MAX];
    const float * bias[ZZ_GROUP_MAX];
    int64_t       bias_stride[ZZ_GROUP_MAX];
    const float * up;
    int64_t       up_stride;
    const float * norm_w;
    float         norm_eps;
    int           early_wait; // EARLY reduction with the old tail (LLAMA_SPARSE_CUDA_EARLY_TAIL=0, an A/B)
    int           red_v4;     // FUSED launches' atomics as float4 (sm_90, y 16-byte aligned; on unless
                              // LLAMA_SPARSE_CUDA_RED_V4=0)
    int           y_ready;    // y holds its start value: atomics only (zz_gemv_seg::y_ready)
    float       * x_copy;     // NORM launches: zz_gemv_norm's upkeep (zz_norm_upkeep)
    int64_t       x_copy_stride;
    float       * x_copy2;
    float       * clear;
    int64_t       clear_n;
    unsigned long long * stats; // FUSED: the idx op's counters (sparse_stats_add), added to by block-row 0
};

// what a direct launch reads as its input: x, silu(x)*up, or the RMS-normed x
enum { ZZ_IN_X = 0, ZZ_IN_GLU = 1, ZZ_IN_NORM = 2 };

// EARLY reduction: the row's flag as thread 0 read it during its last FUSED steps (0: not read), thread 0 only
static __shared__ int zz_flag_hint;

// ZZ_IN_NORM: 1/rms of each token's x, found at the start of the kernel (zz_norm_scales)
static __shared__ float zz_norm_s[ZZ_GEMV_MAX_BATCH];
static __shared__ float zz_norm_part[ZZ_GEMV_MAX_BATCH][ZZ_DIRECT_MAX_WARPS];

// zz_norm_s[t] = 1/sqrt(mean(x_t^2) + eps), as ggml-cuda's rms_norm_f32 computes it; ends with a barrier
template <int T>
static __device__ __forceinline__ void zz_norm_scales(const float * x, const int64_t x_stride, const int n,
        const float eps) {
    const int lane = threadIdx.x % WARP_SIZE;
    const int warp = threadIdx.x / WARP_SIZE;
#pragma unroll
    for (int t = 0; t < T; ++t) {
        const float * xt  = x + t*x_stride;
        float         sum = 0.0f;
        if ((n & 3) == 0 && ((uintptr_t) xt & 15) == 0) {
            // 8 loads in flight a thread (a 4096-wide x at 128 threads: one round trip, not 8)
            for (int c0 = 4*threadIdx.x; c0 < n; c0 += 32*blockDim.x) {
                float4 v[8];
#pragma unroll
                for (int u = 0; u < 8; ++u) {
                    const int c = c0 + 4*u*blockDim.x;
                    v[u] = c < n ? __ldg((const float4 *) (xt + c)) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                }
#pragma unroll
                for (int u = 0; u < 8; ++u) {
                    sum += v[u].x*v[u].x + v[u].y*v[u].y + v[u].z*v[u].z + v[u].w*v[u].w;
                }
            }
        } else {
            for (int c = threadIdx.x; c < n; c += blockDim.x) {
                const float v = __ldg(xt + c);
                sum += v*v;
            }
        }
        sum = warp_reduce_sum(sum);
        if (lane == 0) {
            zz_norm_part[t][warp] = sum;
        }
    }
    __syncthreads();
    if (threadIdx.x < T) {
        float sum = 0.0f;
        for (int w = 0; w < (int) (blockDim.x/WARP_SIZE); ++w) {
            sum += zz_norm_part[threadIdx.x][w];
        }
        zz_norm_s[threadIdx.x] = rsqrtf(sum/n + eps);
    }
    __syncthreads();
}

// a[s] by compares (no dynamic indexing into the parameter space)
template <typename V>
static __device__ __forceinline__ V zz_seg_sel(const V (&a)[ZZ_GROUP_MAX], const int s) {
    V v = a[0];
#pragma unroll
    for (int k = 1; k < ZZ_GROUP_MAX; ++k) {
        if (k == s) {
            v = a[k];
        }
    }
    return v;
}

// segment s of segs: its weight, output and first grid row (selects: no dynamic indexing into the parameter space)
static __device__ __forceinline__ void zz_seg_pick(const zz_segs & segs, const int s, const char *& w, float *& y,
        int64_t & y_stride, int & row0) {
    w        = segs.w[0];
    y        = segs.y[0];
    y_stride = segs.y_stride[0];
    row0     = 0;
#pragma unroll
    for (int k = 1; k < ZZ_GROUP_MAX; ++k) {
        if (k == s) {
            w        = segs.w[k];
            y        = segs.y[k];
            y_stride = segs.y_stride[k];
            row0     = segs.row_end[k - 1];
        }
    }
}

// a block's GLU / NORM inputs, computed once into shared memory (zz_x_stash): columns [c0, c0 + nc) of each
// token, token-major; s == nullptr: none, every read computes its input
struct zz_xs {
    const float * s;
    int           c0;
    int           nc;
};

// input t, column c of a direct launch: x, with GLU silu(x)*up (a fused SwiGLU; unary.cuh's expression), with
// NORM x/rms(x)*norm_w (norm.cu's then binbcast's expression); from the stash when the block has one
template <int IN>
static __device__ __forceinline__ float zz_x_in(const zz_segs & segs, const float * x, const int64_t x_stride,
        const int t, const int c, const zz_xs & xs) {
    if constexpr (IN != ZZ_IN_X) {
        if (xs.s != nullptr) {
            return xs.s[t*xs.nc + c - xs.c0];
        }
    }
    const float v = x[t*x_stride + c];
    if constexpr (IN == ZZ_IN_GLU) {
        return v/(1.0f + expf(-v)) * segs.up[t*segs.up_stride + c];
    } else if constexpr (IN == ZZ_IN_NORM) {
        return zz_norm_s[t]*v * __ldg(segs.norm_w + c);
    }
    return v;
}

// LLAMA_SPARSE_CUDA_STASH: which launches stash their inputs (zz_x_stash), a mask (default 15: all):
// 1 NORM FUSED, 2 NORM DENSE, 4 GLU FUSED, 8 GLU DENSE
enum { ZZ_STASH_NORM_FUSED = 1, ZZ_STASH_NORM_DENSE = 2, ZZ_STASH_GLU_FUSED = 4, ZZ_STASH_GLU_DENSE = 8 };

// the block's columns: every mode splits n evenly over the n1*n2 warps, so a block holds n*b/n1 .. n*(b+1)/n1
static __device__ __forceinline__ zz_xs zz_xs_range(const int n) {
    zz_xs xs;
    xs.s  = nullptr;
    xs.c0 = (int) (((int64_t) n*blockIdx.x)/gridDim.x);
    xs.nc = (int) (((int64_t) n*(blockIdx.x + 1))/gridDim.x) - xs.c0;
    return xs;
}

// NORM, before the PDL wait (no earlier kernel writes it): the norm weight of the block's columns to sw, each
// thread the entries zz_x_stash reads back
static __device__ __forceinline__ void zz_x_stash_w(const float * norm_w, const int n, float * sw) {
    const zz_xs xs = zz_xs_range(n);
    for (int i = threadIdx.x; i < xs.nc; i += blockDim.x) {
        sw[i] = __ldg(norm_w + xs.c0 + i);
    }
}

// the block's columns of every token's input into shared memory at s (NORM: the weight already at s + T*nc,
// zz_x_stash_w; x again, from L1 after zz_norm_scales), 8 reads in flight a thread; ends with a barrier
template <int T, int IN>
static __device__ __forceinline__ zz_xs zz_x_stash(const zz_segs & segs, const float * x, const int64_t x_stride,
        const int n, float * s) {
    zz_xs xs = zz_xs_range(n);
    const float * sw = s + T*xs.nc;
#pragma unroll
    for (int t = 0; t < T; ++t) {
        for (int i0 = threadIdx.x; i0 < xs.nc; i0 += 8*blockDim.x) {
            float v[8];
#pragma unroll
            for (int u = 0; u < 8; ++u) {
                const int i = i0 + u*blockDim.x;
                if constexpr (IN == ZZ_IN_NORM) {
                    v[u] = i < xs.nc ? zz_norm_s[t]*x[t*x_stride + xs.c0 + i] * sw[i] : 0.0f;
                } else {
                    v[u] = i < xs.nc ? zz_x_in<IN>(segs, x, x_stride, t, xs.c0 + i, xs) : 0.0f;
                }
            }
#pragma unroll
            for (int u = 0; u < 8; ++u) {
                const int i = i0 + u*blockDim.x;
                if (i < xs.nc) {
                    s[t*xs.nc + i] = v[u];
                }
            }
        }
    }
    __syncthreads();
    xs.s = s;
    return xs;
}

// shared bytes of one warp's FUSED queue: columns and their x
template <int T>
static constexpr __host__ __device__ int zz_direct_queue_bytes() {
    return ZZ_DIRECT_QUEUE*(int) sizeof(int) + ZZ_DIRECT_QUEUE*T*(int) sizeof(float);
}

// DENSE launches of the direct kernel (without the opaque column): whole rounds addressed from one base
// (GGML_SPARSE_CUDA_ZZ_DENSE_IMM, default on)
#ifndef GGML_SPARSE_CUDA_ZZ_DENSE_IMM
#define GGML_SPARSE_CUDA_ZZ_DENSE_IMM 1
#endif

// FUSED: every queue flush is full (the last one padded), so its loads need no per-column bounds checks; version 3,
// and version 2 up to the batch below (GGML_SPARSE_CUDA_ZZ_FUSED_FULL, default on)
#ifndef GGML_SPARSE_CUDA_ZZ_FUSED_FULL
#define GGML_SPARSE_CUDA_ZZ_FUSED_FULL 1
#endif
#define ZZ_FUSED_FULL GGML_SPARSE_CUDA_ZZ_FUSED_FULL

// FUSED, version 3, with full flushes: a last flush of at most 16 columns takes one step, not two, after the scan's
// loop (inside it, the branch slowed every flush; GGML_SPARSE_CUDA_ZZ_FUSED_HALF, default on)
#ifndef GGML_SPARSE_CUDA_ZZ_FUSED_HALF
#define GGML_SPARSE_CUDA_ZZ_FUSED_HALF 1
#endif
#define ZZ_FUSED_HALF GGML_SPARSE_CUDA_ZZ_FUSED_HALF

// FUSED, version 2 (batch 2-8): full flushes up to batch GGML_SPARSE_CUDA_ZZ_FUSED_FULL_V2 (default 6: at 7-8 ptxas
// spills more with them; 0: none)
#ifndef GGML_SPARSE_CUDA_ZZ_FUSED_FULL_V2
#define GGML_SPARSE_CUDA_ZZ_FUSED_FULL_V2 6
#endif

// a FUSED queue of queued < 32 entries filled up to 32 with its first column at x = 0 (every token)
template <int T>
static __device__ __forceinline__ void zz_queue_pad(int * q_col, float * q_x, const int queued, const int lane) {
    const int c0 = q_col[0];
    __syncwarp();
    if (lane >= queued) {
        q_col[lane] = c0;
#pragma unroll
        for (int t = 0; t < T; ++t) {
            q_x[lane*T + t] = 0.0f;
        }
    }
    __syncwarp();
}

// opaque (DENSE): the column passes through a shuffle, so ptxas cannot recompute it late. Without it ptxas issues
// 8 of a T = 1 round's 48 weight loads after the first MMA of the previous step, one DRAM latency late; on long
// rows (~20 rounds a warp) that is 7-8 % (H100, two rounds: 28672x8192 59.0 / 59.2 against 64.3 / 64.5 us,
// 8192x28672 54.7 / 54.9 against 59.0; bench/results/cuda_h100_2026-11-24.md); on short rows and T > 1 the
// shuffle cost 2-10 %, so the launcher asks for it only at T = 1 with >= 256 columns a warp
template <int mode, bool opaque = false>
static __device__ __forceinline__ void zz_direct_cols(const int32_t * idx, const int p, const int p_end, const int tq,
        int (&col)[4]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int pi = p + 2*tq + (i & 1) + 8*(i >> 1);
        col[i] = pi < p_end ? (mode == ZZ_GEMV_IDX ? __ldg(idx + pi) : pi) : -1;
        if constexpr (opaque) {
            col[i] = __shfl_sync(0xFFFFFFFFu, col[i], threadIdx.x % WARP_SIZE);
        }
    }
}

// byte offset of lane group g's quant bytes in a block: V 1 bytes 16g..16g+15, V 2 and 3 the words at 32p + 4g
template <int V>
static __device__ __forceinline__ int zz_direct_qoff(const int g) {
    return V == 1 ? 16 + 16*g : 16 + 4*g;
}
// the loads of zz_direct_load, of DENSE's whole rounds and of FUSED's full flushes: a block's header (blk) and the
// lane's quant bytes (bq)
template <int V>
static __device__ __forceinline__ void zz_direct_load_at(const char * blk, const char * bq, uint4 & h, uint4 & q) {
    h = __ldg((const uint4 *) blk);
    if constexpr (V == 1) {
        q = __ldg((const uint4 *) bq);
    } else {
        const uint32_t * qw = (const uint32_t *) bq;
        q = make_uint4(__ldg(qw), __ldg(qw + 8), __ldg(qw + 16), __ldg(qw + 24));
    }
}
// Q8_0 G8 (versions 2 and 3): the words at 32 s + 4g, s = 0..7
template <int V>
static __device__ __forceinline__ void zz_direct_load_at(const char * blk, const char * bq, uint4 & h, zz_q8w & q) {
    static_assert(V >= 2, "Q8_0 G8: versions 2 and 3");
    h = __ldg((const uint4 *) blk);
    const uint32_t * qw = (const uint32_t *) bq;
    q.a = make_uint4(__ldg(qw),      __ldg(qw +  8), __ldg(qw + 16), __ldg(qw + 24));
    q.b = make_uint4(__ldg(qw + 32), __ldg(qw + 40), __ldg(qw + 48), __ldg(qw + 56));
}
static __device__ __forceinline__ void zz_q_zero(uint4 & q) {
    q = make_uint4(0, 0, 0, 0);
}
static __device__ __forceinline__ void zz_q_zero(zz_q8w & q) {
    q.a = make_uint4(0, 0, 0, 0);
    q.b = make_uint4(0, 0, 0, 0);
}
// header and the lane's quant bytes of a column's block (zeros for col < 0: contributes nothing);
// V 1: bytes 16g..16g+15, V 2: the words at bytes 32p + 4g, p = 0..3
template <int V, typename Q>
static __device__ __forceinline__ void zz_direct_load(const char * w_row, const int col, const int g, uint4 & h, Q & q) {
    if (col >= 0) {
        const char * blk = w_row + (int64_t) col*zz_qbs<Q>::v;
        // (the same bytes as blk + zz_direct_qoff<V>(g); that form changed the SASS of 63 untimed kernels)
        zz_direct_load_at<V>(blk, V == 1 ? blk + 16 + 16*g : (const char *) ((const uint32_t *) (blk + 16) + g), h, q);
    } else {
        h = make_uint4(0, 0, 0, 0);
        zz_q_zero(q);
    }
}

// a full flush's step st (columns 16 st .. 16 st + 15 of the queue): the lane's blocks and x, no bounds checks; w_blk /
// w_lane: the row's base and the lane's quant bytes in its first block
template <int V, int T, typename Q>
static __device__ __forceinline__ void zz_queue_load_step(const int * q_col, const float * q_x, const int st,
        const int tq, const int tg, const char * w_blk, const char * w_lane, uint4 (&h)[4], Q (&q)[4],
        float (&xb)[4]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int e   = 16*st + 2*tq + (i & 1) + 8*(i >> 1);
        const int col = q_col[e];
        zz_direct_load_at<V>(w_blk + (int64_t) col*zz_qbs<Q>::v, w_lane + (int64_t) col*zz_qbs<Q>::v, h[i], q[i]);
        xb[i] = tg < T ? q_x[e*T + tg] : 0.0f;
    }
}

#ifdef AMPERE_MMA_AVAILABLE
// one 16-column step of the direct kernel's version V (G8: regrouped Q4_0 or Q8_0 blocks, versions 2 and 3)
template <int T, int V, int G8, int NACC>
static __device__ __forceinline__ void zz_direct_step(const uint4 (&h)[4], const typename zz_dfmt<G8>::q_t (&q)[4],
        const float (&xb)[4],
        const int lane, const zz_lane_q4_K & L, const float k16, float (&cm)[NACC][4], float (&cmin)[4]) {
    if constexpr (V == 1) {
        static_assert(!G8, "G8: versions 2 and 3");
        zz_mma_q4_K_step(h, q, xb, lane, cm);
    } else if constexpr (V == 2) {
        zz_mma_q4_K_step_v2<T, G8>(h, q, xb, lane, L, k16, cm, cmin);
    } else {
        zz_mma_q4_K_step_v3<G8>(h, q, xb, lane, L, k16, cm, cmin);
    }
}
#endif // AMPERE_MMA_AVAILABLE

// B1 variant, DENSE at batch 1, version 3 (LLAMA_SPARSE_CUDA_B1V): a step's columns are its positions, x read with
// its blocks (no column list carried between steps)

// the blocks and x of one DENSE step: columns pb + 2tq + (i & 1) + 8(i >> 1) below p1
template <int IN>
static __device__ __forceinline__ void zz_b1_fetch(const int pb, const int p1, const int tq, const int g,
        const char * w_row, const zz_segs & segs, const float * x, const int64_t x_stride, const zz_xs & xs,
        uint4 (&h)[4], uint4 (&q)[4], float (&xb)[4]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int p   = pb + 2*tq + (i & 1) + 8*(i >> 1);
        const int col = p < p1 ? p : -1;
        zz_direct_load<3>(w_row, col, g, h[i], q[i]);
        xb[i] = col >= 0 ? zz_x_in<IN>(segs, x, x_stride, 0, col, xs) : 0.0f;
    }
}

// NORM launches, after the PDL wait: x as read copied to x_copy and clear_n floats of clear zeroed, spread over
// the grid's threads (outputs that accumulate: cuda/README.md)
template <int T>
static __device__ __forceinline__ void zz_norm_upkeep(const zz_segs & segs, const float * x, const int64_t x_stride,
        const int n) {
    const int64_t nt  = (int64_t) gridDim.x*gridDim.y*blockDim.x;
    const int64_t tid = ((int64_t) blockIdx.y*gridDim.x + blockIdx.x)*blockDim.x + threadIdx.x;
    if (segs.x_copy != nullptr) {
        for (int64_t e = tid; e < (int64_t) n*T; e += nt) {
            const int64_t t = e / n;
            const int64_t j = e - t*n;
            const float   v = x[t*x_stride + j];
            segs.x_copy[t*segs.x_copy_stride + j] = v;
            if (segs.x_copy2 != nullptr) {
                segs.x_copy2[t*segs.x_copy_stride + j] = v;
            }
        }
    }
    for (int64_t e = tid; e < segs.clear_n; e += nt) {
        segs.clear[e] = 0.0f;
    }
}

// IN: what the launch reads as x (zz_x_in)
template <int T, int mode, int V, bool OPQ = false, int IN = ZZ_IN_X, bool B1 = false, int G8 = ZZ_FMT_Q4_K>
static __global__ void __launch_bounds__(ZZ_DIRECT_MAX_WARPS*WARP_SIZE, V == 3 ? ZZ_DIRECT_MIN_BLOCKS_V3 : ZZ_DIRECT_MIN_BLOCKS) mul_mat_zz_gemv_q4_K_direct(
        const zz_segs segs, const float * x, const int32_t * idx, const int n, const int64_t x_stride,
        const int tokens_per_pass, const int red_mode, const float thr, const int red_bytes,
        float * ws, int * tickets, const int prefetch_cols, const int stash_off) {
#ifdef AMPERE_MMA_AVAILABLE
    constexpr int B  = QK_K;
    typedef typename zz_dfmt<G8>::q_t Q;
    constexpr int BS = zz_qbs<Q>::v; // bytes a block
    // steps in flight: Q8_0's blocks are twice Q4_K's, one step of them moves as many bytes as Q4_K's two
    constexpr int S  = G8 == ZZ_FMT_G8_Q8 ? (ZZ_DIRECT_STEPS + 1)/2 : ZZ_DIRECT_STEPS;
    static_assert(mode == ZZ_GEMV_DENSE || mode == ZZ_GEMV_IDX || mode == ZZ_GEMV_FUSED, "direct kernel: no SKIP");
    static_assert(V == 1 || V == 2 || (V == 3 && T == 1), "direct kernel: version 1 or 2, or 3 at batch 1");
    static_assert(!G8 || (V >= 2 && !OPQ && !B1 && (IN == ZZ_IN_X || T <= ZZ_G8_IN_MAX_T)),
                  "G8: versions 2 and 3; GLU / NORM up to ZZ_G8_IN_MAX_T");
    constexpr int NACC = V == 3 ? 4 : 16; // accumulator tiles

    extern __shared__ __align__(16) char zz_smem[];

    ggml_cuda_pdl_lc();

    const int lane = threadIdx.x % WARP_SIZE;
    const int warp = threadIdx.x / WARP_SIZE;
    const int n2   = blockDim.x / WARP_SIZE;
    const int row  = blockIdx.y;
    const int g    = lane/4;
    const int tq   = lane%4;
    const int nw   = gridDim.x*n2;
    const int wid  = blockIdx.x*n2 + warp;

    // this block-row's weight
    int seg = 0;
#pragma unroll
    for (int k = 1; k < ZZ_GROUP_MAX; ++k) {
        seg += k < segs.nseg && row >= segs.row_end[k - 1];
    }
    const char * w;
    float      * y;
    int64_t      y_stride;
    int          row0;
    zz_seg_pick(segs, seg, w, y, y_stride, row0);
    const int row_y = row - row0;

    const char * w_row = w + (int64_t) row_y*n*BS;

    if (mode != ZZ_GEMV_IDX && prefetch_cols > 0) {
        // the weights do not depend on earlier kernels: while those finish (PDL), pull the first blocks of this
        // warp's columns into L2 (DENSE and FUSED split the n columns evenly; FUSED may skip some of them)
        const int    c0 = (int) (((int64_t) n*wid)/nw);
        const int    c1 = min((int) (((int64_t) n*(wid + 1))/nw), c0 + prefetch_cols);
        const char * p0 = (const char *) ((uintptr_t) (w_row + (int64_t) c0*BS) & ~(uintptr_t) 127);
        const char * p1 = w_row + (int64_t) c1*BS;
        for (const char * p = p0 + 128*lane; p < p1; p += 128*WARP_SIZE) {
            asm volatile("prefetch.global.L2 [%0];" :: "l"(p));
        }
    }

    if constexpr (IN == ZZ_IN_NORM) {
        if (stash_off >= 0) {
            zz_x_stash_w(segs.norm_w, n, (float *) (zz_smem + stash_off) + T*zz_xs_range(n).nc);
        }
    }

    ggml_cuda_pdl_sync(); // x and idx come from earlier kernels; ws and tickets are free once they are done

    if constexpr (IN == ZZ_IN_NORM) {
        zz_norm_scales<T>(x, x_stride, n, segs.norm_eps);
        if (segs.x_copy != nullptr || segs.clear_n > 0) {
            zz_norm_upkeep<T>(segs, x, x_stride, n);
        }
    }
    // stash_off >= 0: this block's inputs go to shared memory there first
    zz_xs xs = { nullptr, 0, 0 };
    if constexpr (IN != ZZ_IN_X) {
        if (stash_off >= 0) {
            xs = zz_x_stash<T, IN>(segs, x, x_stride, n, (float *) (zz_smem + stash_off));
        }
    }

    const float * bias        = zz_seg_sel(segs.bias, seg);
    const int64_t bias_stride = zz_seg_sel(segs.bias_stride, seg);
    if (red_mode == ZZ_RED_EARLY) {
        if (threadIdx.x == 0) {
            zz_flag_hint = 0;
        }
        zz_red_early<T, QK_K>(y, y_stride, row, row_y, bias, bias_stride, tickets);
    }

    float cm[NACC][4];
#pragma unroll
    for (int mt = 0; mt < NACC; ++mt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            cm[mt][e] = 0.0f;
        }
    }
    float cmin[4] = { 0.0f, 0.0f, 0.0f, 0.0f }; // V 2, 3: min terms
    zz_lane_q4_K L; // V 2: the lane's sub-block g
    zz_lane_init(L, lane);
    const float k16 = G8 != ZZ_FMT_G8_Q8 && (g & 1) ? 1.0f/16.0f : 1.0f;
    // token of the lane's x: g (B fragment column), or token 0 everywhere for V 2 at T = 1 (see the step)
    const int tg = V >= 2 && T == 1 ? 0 : g;

    if constexpr (B1) {
        static_assert(T == 1 && V == 3 && !OPQ && mode == ZZ_GEMV_DENSE, "B1: DENSE at batch 1, version 3");
        const int p0 = (int) (((int64_t) n*wid)/nw);
        const int p1 = (int) (((int64_t) n*(wid + 1))/nw);
        for (int pb = p0; pb < p1; pb += 32) {
            uint4 h0[4], q0[4], h1[4], q1[4];
            float x0[4], x1[4];
            zz_b1_fetch<IN>(pb,      p1, tq, g, w_row, segs, x, x_stride, xs, h0, q0, x0);
            zz_b1_fetch<IN>(pb + 16, p1, tq, g, w_row, segs, x, x_stride, xs, h1, q1, x1);
            zz_direct_step<T, V, G8>(h0, q0, x0, lane, L, k16, cm, cmin);
            if (pb + 16 < p1) {
                zz_direct_step<T, V, G8>(h1, q1, x1, lane, L, k16, cm, cmin);
            }
        }
    } else if constexpr (mode == ZZ_GEMV_FUSED) {
        int   * q_col = (int *) (zz_smem + warp*zz_direct_queue_bytes<T>());
        float * q_x   = (float *) (q_col + ZZ_DIRECT_QUEUE);
        const int c_begin = (int) (((int64_t) n*wid)/nw);
        const int c_end   = (int) (((int64_t) n*(wid + 1))/nw);
        // full flushes address a column's block and the lane's quant bytes from these (opaque: left to itself,
        // ptxas keeps the row's uniform part apart and adds it to every address)
        const char * w_blk  = w_row;
        const char * w_lane = w_row + zz_direct_qoff<V>(g);
        asm("" : "+l"(w_blk));
        asm("" : "+l"(w_lane));
        constexpr bool full = ZZ_FUSED_FULL && (V == 3 || (V == 2 && T <= GGML_SPARSE_CUDA_ZZ_FUSED_FULL_V2));
        constexpr bool half = ZZ_FUSED_HALF && full && V == 3; // the last <= 16 columns after the loop

        float xn[T]; // x of the next 32 columns, loaded a round ahead
#pragma unroll
        for (int t = 0; t < T; ++t) {
            xn[t] = c_begin + lane < c_end ? zz_x_in<IN>(segs, x, x_stride, t, c_begin + lane, xs) : 0.0f;
        }
        int queued = 0;
        for (int base = c_begin; base < c_end; base += WARP_SIZE) {
            const int c = base + lane;
            float xv[T];
            bool  act = false;
#pragma unroll
            for (int t = 0; t < T; ++t) {
                xv[t] = xn[t];
                act   = act || sparse_active(xv[t], thr);
            }
            act = act && c < c_end;
#pragma unroll
            for (int t = 0; t < T; ++t) {
                xn[t] = c + WARP_SIZE < c_end ? zz_x_in<IN>(segs, x, x_stride, t, c + WARP_SIZE, xs) : 0.0f;
            }
            const uint32_t mask = __ballot_sync(ZZ_FULL_MASK, act);
            if (act) {
                const int pos = queued + __popc(mask & ((1u << lane) - 1));
                q_col[pos] = c;
#pragma unroll
                for (int t = 0; t < T; ++t) {
                    q_x[pos*T + t] = xv[t];
                }
            }
            queued += __popc(mask);
            if constexpr (T == 1) {
                if (segs.stats != nullptr && row == 0 && lane == 0 && mask != 0) {
                    // block-row 0's warps split the n columns: their counts add up to the active set's size (a
                    // count kept in a register to the end made ptxas spill; at batch 2-8 this cost 3-6 %: those
                    // launches do not count, cuda/README.md)
                    atomicAdd(segs.stats + 2, (unsigned long long) __popc(mask));
                }
            }
            __syncwarp();

            const bool last = base + WARP_SIZE >= c_end;
            while (queued >= 16*S || (last && queued > (half ? 16 : 0))) {
                if (full && queued < 16*S) {
                    // the last flush is filled up with the queue's first column at x = 0 (its block is in L1 by
                    // then), so every flush takes the path without bounds checks
                    zz_queue_pad<T>(q_col, q_x, queued, lane);
                    queued = 16*S;
                }
                const int nb = min(queued, 16*S);
                uint4 h[S][4];
                Q     q[S][4];
                float xb[S][4];
                if (full) {
                    // a full flush: every entry is a column, so no bounds checks and no zero defaults
#pragma unroll
                    for (int st = 0; st < S; ++st) {
                        zz_queue_load_step<V, T>(q_col, q_x, st, tq, tg, w_blk, w_lane, h[st], q[st], xb[st]);
                    }
                } else {
#pragma unroll
                    for (int st = 0; st < S; ++st) {
#pragma unroll
                        for (int i = 0; i < 4; ++i) {
                            const int e   = 16*st + 2*tq + (i & 1) + 8*(i >> 1);
                            const int col = e < nb ? q_col[e] : -1;
                            zz_direct_load<V>(w_row, col, g, h[st][i], q[st][i]);
                            xb[st][i] = col >= 0 && tg < T ? q_x[e*T + tg] : 0.0f;
                        }
                    }
                }
                // the rest (< 32 entries) moves to the front of the queue
                const int rest = queued - nb;
                int   rc = 0;
                float rx[T];
#pragma unroll
                for (int t = 0; t < T; ++t) {
                    rx[t] = 0.0f;
                }
                if (lane < rest) {
                    rc = q_col[nb + lane];
#pragma unroll
                    for (int t = 0; t < T; ++t) {
                        rx[t] = q_x[(nb + lane)*T + t];
                    }
                }
                __syncwarp();
                if (lane < rest) {
                    q_col[lane] = rc;
#pragma unroll
                    for (int t = 0; t < T; ++t) {
                        q_x[lane*T + t] = rx[t];
                    }
                }
                __syncwarp();
                queued = rest;
                // the last steps' weight loads are out: the flag's L2 round trip hides behind them (not for NORM:
                // ptxas then spills at batch 1)
                if (IN != ZZ_IN_NORM && red_mode == ZZ_RED_EARLY && !segs.early_wait && last && rest == 0 &&
                        threadIdx.x == 0) {
                    zz_flag_hint = zz_flag_read(tickets + row);
                }
#pragma unroll
                for (int st = 0; st < S; ++st) {
                    zz_direct_step<T, V, G8>(h[st], q[st], xb[st], lane, L, k16, cm, cmin);
                }
            }
        }
        if (half && queued > 0) {
            // 1-16 columns left: one step, padded as above
            zz_queue_pad<T>(q_col, q_x, queued, lane);
            uint4 h[4];
            Q     q[4];
            float xb[4];
            zz_queue_load_step<V, T>(q_col, q_x, 0, tq, tg, w_blk, w_lane, h, q, xb);
            if (IN != ZZ_IN_NORM && red_mode == ZZ_RED_EARLY && !segs.early_wait && threadIdx.x == 0) {
                zz_flag_hint = zz_flag_read(tickets + row);
            }
            zz_direct_step<T, V, G8>(h, q, xb, lane, L, k16, cm, cmin);
        }
        if (T == 1 && segs.stats != nullptr && row == 0 && blockIdx.x == 0 && threadIdx.x == 0) {
            sparse_stats_add(segs.stats, n, 0);
        }
    } else {
        const int count   = mode == ZZ_GEMV_IDX ? __ldg(idx + n) : n;
        const int p_begin = (int) (((int64_t) count*wid)/nw);
        const int p_end   = (int) (((int64_t) count*(wid + 1))/nw);

        int p_rest = p_begin; // first column of the rounds below
#if GGML_SPARSE_CUDA_ZZ_DENSE_IMM
        if constexpr (mode == ZZ_GEMV_DENSE && !OPQ) {
            // whole rounds: a round's columns are pb + constants, so its blocks and x are one base each with
            // immediate offsets (no per-column address or predicate); the last partial round goes below. Not with
            // the opaque column (measured 4.6 % slower on 28672 x 8192, 3.3 % faster on 8192 x 28672)
            for (; p_rest + 16*S <= p_end; p_rest += 16*S) {
                const int pb = p_rest + 2*tq;
                const char * wh = w_row + (int64_t) pb*BS;
                const char * wq = wh + zz_direct_qoff<V>(g);
                uint4 h[S][4];
                Q     q[S][4];
                float xb[S][4];
#pragma unroll
                for (int st = 0; st < S; ++st) {
#pragma unroll
                    for (int i = 0; i < 4; ++i) {
                        const int off = 16*st + (i & 1) + 8*(i >> 1);
                        zz_direct_load_at<V>(wh + off*BS, wq + off*BS, h[st][i], q[st][i]);
                        xb[st][i] = tg < T ? zz_x_in<IN>(segs, x, x_stride, tg, pb + off, xs) : 0.0f;
                    }
                }
#pragma unroll
                for (int st = 0; st < S; ++st) {
                    zz_direct_step<T, V, G8>(h[st], q[st], xb[st], lane, L, k16, cm, cmin);
                }
            }
        }
#endif
        int col[S][4];
#pragma unroll
        for (int st = 0; st < S; ++st) {
            zz_direct_cols<mode, OPQ>(idx, p_rest + 16*st, p_end, tq, col[st]);
        }
        for (int p0 = p_rest; p0 < p_end; p0 += 16*S) {
            uint4 h[S][4];
            Q     q[S][4];
            float xb[S][4];
#pragma unroll
            for (int st = 0; st < S; ++st) {
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    zz_direct_load<V>(w_row, col[st][i], g, h[st][i], q[st][i]);
                    xb[st][i] = col[st][i] >= 0 && tg < T ? zz_x_in<IN>(segs, x, x_stride, tg, col[st][i], xs) : 0.0f;
                }
            }
#pragma unroll
            for (int st = 0; st < S; ++st) {
                zz_direct_cols<mode, OPQ>(idx, p0 + 16*(S + st), p_end, tq, col[st]);
            }
#pragma unroll
            for (int st = 0; st < S; ++st) {
                zz_direct_step<T, V, G8>(h[st], q[st], xb[st], lane, L, k16, cm, cmin);
            }
        }
    }

    // (the reduction area aliases the FUSED queues; zz_gemv_reduce starts with a barrier; EARLY: y has the bias)
    zz_gemv_reduce<T, B>([&](const int t0, const int tp, float * red_w) {
        if constexpr (V == 1) {
            zz_mma_put<T, B>(cm, lane, t0, tp, red_w);
        } else if constexpr (V == 2) {
            zz_mma_put_v2<T, B>(cm, cmin, lane, t0, tp, red_w);
        } else {
            GGML_UNUSED_VARS(t0, tp);
            zz_mma_put_v3(cm, cmin, lane, red_w);
        }
    }, y, y_stride, row, row_y, tokens_per_pass, red_mode, zz_smem, red_bytes, ws, tickets,
       red_mode == ZZ_RED_EARLY ? nullptr : bias, bias_stride,
       red_mode != ZZ_RED_EARLY ? 0 : segs.early_wait ? -1 : zz_flag_hint, mode == ZZ_GEMV_FUSED && segs.red_v4 != 0);
#else
    GGML_UNUSED_VARS(segs, x, idx, n, x_stride, tokens_per_pass, red_mode, thr, red_bytes, ws, tickets,
                     prefetch_cols, stash_off);
    NO_DEVICE_CODE;
#endif // AMPERE_MMA_AVAILABLE
}

// ---------------------------------------------------------------------------------------------------
// GEMV host side

bool zz_type_supported(const ggml_type type) {
    if (type == ZZ_TYPE_Q4_0_G8 || type == ZZ_TYPE_Q8_0_G8) {
        return true;
    }
    switch (type) {
        case GGML_TYPE_Q4_0:
        case GGML_TYPE_Q8_0:
        case GGML_TYPE_Q4_K:
        case GGML_TYPE_Q6_K:
            return true;
        default:
            return false;
    }
}

// the types the direct Q4_K kernel runs: Q4_K, and Q4_0 and Q8_0 in the G8 layout
static bool zz_direct_type(const ggml_type type) {
    return type == GGML_TYPE_Q4_K || type == ZZ_TYPE_Q4_0_G8 || type == ZZ_TYPE_Q8_0_G8;
}

static bool zz_g8_type(const ggml_type type) {
    return type == ZZ_TYPE_Q4_0_G8 || type == ZZ_TYPE_Q8_0_G8;
}

ggml_type zz_kernel_type(const ggml_tensor * w) {
    if (ggml_sparse_zz_layout(w) == GGML_SPARSE_ZZ_LAYOUT_G256) {
        if (w->type == GGML_TYPE_Q4_0) {
            return ZZ_TYPE_Q4_0_G8;
        }
        if (w->type == GGML_TYPE_Q8_0) {
            return ZZ_TYPE_Q8_0_G8;
        }
    }
    return w->type;
}

int64_t zz_blck_size(const ggml_type type) {
    return type == ZZ_TYPE_Q4_0_G8 ? zz_type<ZZ_TYPE_Q4_0_G8>::B :
           type == ZZ_TYPE_Q8_0_G8 ? zz_type<ZZ_TYPE_Q8_0_G8>::B : ggml_blck_size(type);
}

size_t zz_block_bytes(const ggml_type type) {
    return type == ZZ_TYPE_Q4_0_G8 ? zz_type<ZZ_TYPE_Q4_0_G8>::bs :
           type == ZZ_TYPE_Q8_0_G8 ? zz_type<ZZ_TYPE_Q8_0_G8>::bs : ggml_type_size(type);
}

const char * zz_type_name(const ggml_type type) {
    return type == ZZ_TYPE_Q4_0_G8 ? "q4_0_g8" : type == ZZ_TYPE_Q8_0_G8 ? "q8_0_g8" : ggml_type_name(type);
}

struct zz_device_props {
    bool        init;
    int         nsm;
    int         cc_major;
    std::string key; // device name and arch, the tune file's first column
};

static zz_device_props & zz_get_device_props(const int device) {
    static std::mutex      mutex;
    static zz_device_props props[GGML_CUDA_MAX_DEVICES];
    GGML_ASSERT(device >= 0 && device < GGML_CUDA_MAX_DEVICES);
    std::lock_guard<std::mutex> lock(mutex);
    zz_device_props & p = props[device];
    if (!p.init) {
        cudaDeviceProp prop;
        CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
        p.nsm      = prop.multiProcessorCount;
        p.cc_major = prop.major;
        p.key      = prop.name;
        for (char & c : p.key) {
            if (c == ' ' || c == '\t') {
                c = '_';
            }
        }
        p.key += "-sm" + std::to_string(prop.major*10 + prop.minor);
        p.init = true;
    }
    return p;
}

// bytes of shared memory the FUSED mode adds: ballot words, their offsets, the block's share of the list
static size_t zz_fused_smem(const int64_t n, const int n1) {
    const int64_t nwords = (n + WARP_SIZE - 1)/WARP_SIZE;
    return (size_t) (2*nwords + n/n1 + 2)*sizeof(int);
}

// LLAMA_SPARSE_CUDA_DIRECT=0 keeps every type on the staged kernel (for comparisons): Q4_K off the direct kernel, the
// other types off the ldg one
static bool zz_direct_enabled(const int cc_major) {
    static const char * env = getenv("LLAMA_SPARSE_CUDA_DIRECT");
    return cc_major >= 8 && (env == nullptr || atoi(env) != 0);
}

// a GEMV kernel launch, as a thread block cluster of the n1 blocks of a block-row when red_mode says so
template <typename Kernel, typename... Args>
static void zz_launch(Kernel kernel, const dim3 grid, const dim3 block, const size_t smem, const int red_mode,
        cudaStream_t stream, Args... args) {
#ifdef ZZ_CLUSTER_AVAILABLE
    if (red_mode == ZZ_RED_CLUSTER) {
        ggml_sparse_cuda_launch_cfg(kernel, grid, block, smem, (int) grid.x, false, stream, args...); // (no PDL)
        return;
    }
#endif // ZZ_CLUSTER_AVAILABLE
    GGML_ASSERT(red_mode != ZZ_RED_CLUSTER);
    const ggml_cuda_kernel_launch_params params(grid, block, smem, stream);
    ggml_cuda_kernel_launch(kernel, params, args...);
}

// the outputs of every segment = 0, or = its bias (grid.y = segment) as a kernel launched like its neighbours
// (PDL): a memset node between two kernels breaks their programmatic overlap. It waits for the earlier kernels
// first: y may reuse memory one of them still reads.
static __global__ void zz_zero_kernel(const zz_segs segs, const int T, const int B) {
    ggml_cuda_pdl_sync();
    ggml_cuda_pdl_lc();
    const char * w;
    float      * y;
    int64_t      y_stride;
    int          r0;
    zz_seg_pick(segs, (int) blockIdx.y, w, y, y_stride, r0);
    const float * bias        = zz_seg_sel(segs.bias, (int) blockIdx.y);
    const int64_t bias_stride = zz_seg_sel(segs.bias_stride, (int) blockIdx.y);
    zz_y_set(y, y_stride, bias, bias_stride, 0, (int64_t) (segs.row_end[blockIdx.y] - r0)*B, T,
             (int64_t) blockIdx.x*blockDim.x + threadIdx.x, (int64_t) gridDim.x*blockDim.x);
}

static int zz_env_int(const char * name);

// LLAMA_SPARSE_CUDA_ZERO_KERNEL=1: zero y with zz_zero_kernel instead of a memset node (an experiment)
static bool zz_zero_by_kernel() {
    static const bool on = zz_env_int("LLAMA_SPARSE_CUDA_ZERO_KERNEL") > 0;
    return on;
}

// graph safe, in the same stream: one zz_zero_kernel for a group (or with LLAMA_SPARSE_CUDA_ZERO_KERNEL=1), else
// a memset node, or a copy node from a fused bias (none when the add is in place: bias is y)
static void zz_zero_dst(const zz_segs & segs, const int T, const int B, cudaStream_t stream) {
    if (segs.nseg > 1 || zz_zero_by_kernel()) {
        const int64_t n = (int64_t) segs.row_end[segs.nseg - 1]*B*T;
        const ggml_cuda_kernel_launch_params params(dim3((unsigned) std::min<int64_t>(64, (n + 255)/256), segs.nseg, 1),
                                                    dim3(256, 1, 1), 0, stream);
        ggml_cuda_kernel_launch(zz_zero_kernel, params, segs, T, B);
        return;
    }
    float * y = segs.y[0];
    const int64_t m = (int64_t) segs.row_end[0]*B, y_stride = segs.y_stride[0];
    if (segs.bias[0] != nullptr) {
        if (segs.bias[0] != y || segs.bias_stride[0] != y_stride) {
            CUDA_CHECK(cudaMemcpy2DAsync(y, y_stride*sizeof(float), segs.bias[0], segs.bias_stride[0]*sizeof(float),
                                         m*sizeof(float), T, cudaMemcpyDeviceToDevice, stream));
        }
        return;
    }
    if (y_stride == m || T == 1) {
        CUDA_CHECK(cudaMemsetAsync(y, 0, (size_t) ((T - 1)*y_stride + m)*sizeof(float), stream));
    } else {
        CUDA_CHECK(cudaMemset2DAsync(y, y_stride*sizeof(float), 0, m*sizeof(float), T, stream));
    }
}

// LLAMA_SPARSE_CUDA_TICKET, the cross-block reduction where n1 > 1 (no cluster): 0 = atomicAdd into y zeroed (or
// given the bias) by a memset / copy node or a zeroing kernel, 1 = ticket (partials to a workspace, the last block
// sums them: deterministic), 2 = first (the first block to arrive stores, the others atomicAdd), 3 = early (direct
// Q4_K kernel, else 2: the first block of a block-row to start sets y to the bias or 0, all blocks atomicAdd),
// 4 (default) = early for the direct kernel, else 0. zz_gemv_set_ticket overrides it.
// H100, 7B tg128 (bench/results/cuda_h100_2026-11-25a.md): at 0.50 early > first > memset + atomics (+4 %: no
// memset / copy node or zeroing kernel before the GEMV), dense memset + atomics > early ~ first (2 %: all blocks
// of a row finish together, so waiting for the flag costs more than the node). Since the early tail without
// round trips, early is also the faster dense: tg128 +2.0 / +4.5 % (bench/results/cuda_h100_2026-11-27e.md), so
// dense takes it too. Ticket was slower than memset + atomics (245 against 261 t/s at 0.50;
// bench/results/cuda_e2e_h100_2026-11-23.md).
static std::atomic<int> zz_ticket_override{-1};

int zz_gemv_set_ticket(const int on) {
    return zz_ticket_override.exchange(on);
}

static int zz_ticket_choice() {
    static const int env = [] {
        const char * e = getenv("LLAMA_SPARSE_CUDA_TICKET");
        return e != nullptr ? std::min(std::max(atoi(e), 0), 4) : 4;
    }();
    const int o = zz_ticket_override.load(std::memory_order_relaxed);
    return o >= 0 ? std::min(o, 4) : env;
}

// LLAMA_SPARSE_CUDA_PREFETCH (DENSE) and LLAMA_SPARSE_CUDA_PREFETCH_FUSED (FUSED), both default 0: columns per warp
// of the direct Q4_K kernel whose weight blocks are prefetched into L2 before the PDL wait. DENSE at 64: 6-8 %
// slower on the H100 with the one-wave launch config (bench/results/cuda_h100_2026-11-23f.md). FUSED skips some
// of them, and a load step waits for its slowest block, so it only pays when it covers the warp's whole first
// queue flush (~32/(1 - s) columns).
static int zz_prefetch_cols(const int mode) {
    static const int env_dense = [] {
        const char * e = getenv("LLAMA_SPARSE_CUDA_PREFETCH");
        return e == nullptr ? 0 : std::max(0, atoi(e));
    }();
    static const int env_fused = [] {
        const char * e = getenv("LLAMA_SPARSE_CUDA_PREFETCH_FUSED");
        return e == nullptr ? 0 : std::max(0, atoi(e));
    }();
    return mode == ZZ_GEMV_DENSE ? env_dense : mode == ZZ_GEMV_FUSED ? env_fused : 0; // IDX: columns from an earlier kernel
}

// LLAMA_SPARSE_CUDA_Q4K_V: the direct kernel's step, 3 (default: version 2, with the sub-blocks as B's columns at
// batch 1), 2 (scales in B, bare nibbles in A) or 1 (the first one: weights dequantized into A)
static int zz_direct_version() {
    static const int v = [] {
        const char * e = getenv("LLAMA_SPARSE_CUDA_Q4K_V");
        const int    i = e != nullptr ? atoi(e) : 3;
        return i == 1 || i == 2 ? i : 3;
    }();
    return v;
}

// the step version a launch of n_tokens runs: version 3 exists at batch 1 only, version 2 stands in above it
static int zz_direct_version_at(const int n_tokens) {
    const int v = zz_direct_version();
    return v == 3 && n_tokens != 1 ? 2 : v;
}

// whether a direct launch of this type and batch can read a fused SwiGLU or a folded norm: the GLU / NORM instances
// of zz_direct_kernel (versions 2 and 3; the G8 layouts up to ZZ_G8_IN_MAX_T)
static bool zz_in_ok(const ggml_type type, const int64_t n_tokens) {
    return (type == GGML_TYPE_Q4_K || (zz_g8_type(type) && n_tokens <= ZZ_G8_IN_MAX_T)) &&
           zz_direct_version_at((int) n_tokens) >= 2;
}

// LLAMA_SPARSE_CUDA_B1V=1 turns the B1 variant of batch-1 DENSE launches on (zz_b1_fetch; off by default). H100:
// decode GEMV chains -0.7 % (7B shapes), -1.3 % (8B) (cuda_h100_2026-11-27b.md), but end to end dense 7B decode
// 3 % slower than without it (cuda_h100_2026-11-27c.md)
static bool zz_b1_on() {
    static const bool on = zz_env_int("LLAMA_SPARSE_CUDA_B1V") > 0;
    return on;
}

// LLAMA_SPARSE_CUDA_STASH (ZZ_STASH_*; unset: all)
static int zz_stash_mask() {
    static const int mask = [] {
        const int v = zz_env_int("LLAMA_SPARSE_CUDA_STASH");
        return v < 0 ? 15 : v;
    }();
    return mask;
}

// the direct kernel instance of step version v (from zz_direct_version_at; version 1 has no OPQ / GLU / NORM
// instances; G8 only version 2, and 3 at batch 1, without OPQ or B1, GLU / NORM up to ZZ_G8_IN_MAX_T)
template <int T, int mode, bool OPQ, int IN, int G8 = ZZ_FMT_Q4_K>
static auto zz_direct_kernel(const int v, const bool b1 = false) {
    if constexpr (G8) {
        static_assert(!OPQ && (IN == ZZ_IN_X || T <= ZZ_G8_IN_MAX_T), "G8: no OPQ; GLU / NORM up to ZZ_G8_IN_MAX_T");
        if constexpr (T == 1) {
            if (v == 3) {
                return mul_mat_zz_gemv_q4_K_direct<T, mode, 3, false, IN, false, G8>;
            }
        }
        return mul_mat_zz_gemv_q4_K_direct<T, mode, 2, false, IN, false, G8>;
    }
    if constexpr (T == 1) {
        if constexpr (!OPQ && mode == ZZ_GEMV_DENSE) {
            if (v == 3 && b1) {
                return mul_mat_zz_gemv_q4_K_direct<T, mode, 3, false, IN, true>;
            }
        }
        if (v == 3) {
            return mul_mat_zz_gemv_q4_K_direct<T, mode, 3, OPQ, IN>;
        }
    }
    if constexpr (!OPQ && IN == ZZ_IN_X) {
        if (v == 1) {
            return mul_mat_zz_gemv_q4_K_direct<T, mode, 1>;
        }
    }
    return mul_mat_zz_gemv_q4_K_direct<T, mode, 2, OPQ, IN>;
}

// blocks of the direct Q4_K kernel an SM holds, for the launch's one wave: version 3 at batch 1 fits 4 in 128
// registers, the others 3 (LLAMA_SPARSE_CUDA_DIRECT_WAVE=b overrides: A/B)
static int zz_direct_blocks_per_sm(const int n_tokens) {
    static const int env = zz_env_int("LLAMA_SPARSE_CUDA_DIRECT_WAVE");
    if (env > 0) {
        return env;
    }
    return zz_direct_version_at(n_tokens) == 3 ? ZZ_DIRECT_MIN_BLOCKS_V3 : ZZ_DIRECT_MIN_BLOCKS;
}

// blocks of the direct kernel resident at once on nsm SMs: one wave
static int64_t zz_direct_wave_blocks(const int nsm, const int n_tokens) {
    return (int64_t) nsm*zz_direct_blocks_per_sm(n_tokens);
}

// what the current device allows, looked up once per launch
struct zz_caps {
    int  device;
    int  nsm;     // SMs
    bool cluster; // thread block clusters (sm_90)
    bool direct;  // the direct Q4_K kernel (sm_80, not disabled)
    int  red;     // reduction across the n1 blocks: 0 memset + atomics, 1 ticket, 2 first, 3 early, 4 auto
};

static zz_caps zz_get_caps() {
    int device;
    CUDA_CHECK(cudaGetDevice(&device));
    const zz_device_props & props = zz_get_device_props(device);
    return { device, props.nsm, props.cc_major >= 9, zz_direct_enabled(props.cc_major), zz_ticket_choice() };
}

static int zz_red_mode(const zz_gemv_config & cfg, const zz_caps caps, const bool direct) {
    if (cfg.n1 == 1) {
        return ZZ_RED_STORE;
    }
    if (cfg.cluster && caps.cluster && cfg.n1 <= 8) {
        return ZZ_RED_CLUSTER;
    }
    switch (caps.red) {
        case 1:  return ZZ_RED_TICKET;
        case 2:  return ZZ_RED_FIRST;
        case 3:  return direct ? ZZ_RED_EARLY : ZZ_RED_FIRST; // (the staged kernel has no early step)
        case 4:  return direct ? ZZ_RED_EARLY : ZZ_RED_ATOMIC;
        default: return ZZ_RED_ATOMIC;
    }
}

// Ticket reduction buffers, one set per (device, stream): GEMVs on one stream are ordered (each waits for
// the previous kernel before it touches them), GEMVs on different streams may overlap and must not share
// counters. The counters (2*ZZ_TICKET_ROWS) are zeroed once here and left at zero by every launch; the workspace
// needs no clearing (every slot is written before it is read). Outgrown workspaces are kept, not freed: a CUDA
// graph captured earlier may still write them.
#define ZZ_TICKET_WS_MIN (1 << 20) // first workspace, in floats (4 MiB: 28672x8192 at batch 2 with n1 = 16)

struct zz_ticket_buf {
    int          device;
    cudaStream_t stream;
    int        * tickets;
    float      * ws;
    size_t       ws_floats;
    float      * res;        // the residual carried to o (zz_res_get)
    size_t       res_floats;
};

static std::mutex                 zz_ticket_mutex;
static std::vector<zz_ticket_buf> zz_ticket_bufs;
static std::vector<float *>       zz_ticket_retired;

// the stream's entry, with its float buffer buf (of size `floats`) grown to need (at least min_cap, doubling);
// nullptr while the stream is being captured and either would have to be made or grown (caller holds
// zz_ticket_mutex)
static zz_ticket_buf * zz_stream_buf(const int device, cudaStream_t stream, float * zz_ticket_buf::* buf,
        size_t zz_ticket_buf::* floats, const size_t need, const size_t min_cap) {
    zz_ticket_buf * b = nullptr;
    for (zz_ticket_buf & e : zz_ticket_bufs) {
        if (e.device == device && e.stream == stream) {
            b = &e;
            break;
        }
    }
    if (b != nullptr && b->*floats >= need) {
        return b;
    }
    cudaStreamCaptureStatus status;
    CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
    if (status != cudaStreamCaptureStatusNone) {
        return nullptr;
    }
    if (b == nullptr) {
        zz_ticket_buf nb = { device, stream, nullptr, nullptr, 0 };
        CUDA_CHECK(cudaMalloc(&nb.tickets, 2*ZZ_TICKET_ROWS*sizeof(int)));
        CUDA_CHECK(cudaMemsetAsync(nb.tickets, 0, 2*ZZ_TICKET_ROWS*sizeof(int), stream));
        zz_ticket_bufs.push_back(nb);
        b = &zz_ticket_bufs.back();
    }
    if (b->*floats < need) {
        const size_t cap = std::max<size_t>(need, std::max<size_t>(2*(b->*floats), min_cap));
        float * p = nullptr;
        CUDA_CHECK(cudaMalloc(&p, cap*sizeof(float)));
        if (b->*buf != nullptr) {
            zz_ticket_retired.push_back(b->*buf);
        }
        b->*buf    = p;
        b->*floats = cap;
    }
    return b;
}

// false while the stream is being captured and the buffers would have to be made or grown (the caller
// then falls back to atomics); ggml-cuda runs a graph eagerly before it captures it, so that is rare
static bool zz_ticket_get(const int device, cudaStream_t stream, const size_t need, float ** ws, int ** tickets) {
    std::lock_guard<std::mutex> lock(zz_ticket_mutex);
    const zz_ticket_buf * b = zz_stream_buf(device, stream, &zz_ticket_buf::ws, &zz_ticket_buf::ws_floats, need,
                                            ZZ_TICKET_WS_MIN);
    if (b == nullptr) {
        return false;
    }
    *ws      = b->ws;
    *tickets = b->tickets;
    return true;
}

void zz_gemv_ticket_forget(cudaStream_t stream) {
    int device;
    CUDA_CHECK(cudaGetDevice(&device));
    std::lock_guard<std::mutex> lock(zz_ticket_mutex);
    for (size_t i = 0; i < zz_ticket_bufs.size(); ++i) {
        if (zz_ticket_bufs[i].device == device && zz_ticket_bufs[i].stream == stream) {
            for (float * p : { zz_ticket_bufs[i].ws, zz_ticket_bufs[i].res }) {
                if (p != nullptr) {
                    zz_ticket_retired.push_back(p); // (graphs captured on the stream may still use them)
                }
            }
            zz_ticket_bufs.erase(zz_ticket_bufs.begin() + i);
            return;
        }
    }
}

int64_t zz_gemv_ticket_nonzero(cudaStream_t stream) {
    int device;
    CUDA_CHECK(cudaGetDevice(&device));
    int * tickets = nullptr;
    {
        std::lock_guard<std::mutex> lock(zz_ticket_mutex);
        for (const zz_ticket_buf & e : zz_ticket_bufs) {
            if (e.device == device && e.stream == stream) {
                tickets = e.tickets;
            }
        }
    }
    if (tickets == nullptr) {
        return -1;
    }
    std::vector<int> h(2*ZZ_TICKET_ROWS);
    CUDA_CHECK(cudaStreamSynchronize(stream));
    CUDA_CHECK(cudaMemcpy(h.data(), tickets, h.size()*sizeof(int), cudaMemcpyDeviceToHost));
    int64_t nz = 0;
    for (int v : h) {
        nz += v != 0;
    }
    return nz;
}

// the reduction this launch uses, with its buffers: ticket falls back to atomics when the buffers cannot be
// had (capture) and atomics zero y first (zz_zero_dst)
// LLAMA_SPARSE_CUDA_WHATIF_NOINIT, measurement only (y comes out wrong): where blocks of a row would share y, they
// add into it as it is, with no memset / copy node before the launch and no protocol in it. Bounds what initializing
// each GEMV's output in an earlier launch could gain. 1: every launch; else a mask of decode's launches as told
// apart here: 2 q/k/v (a norm read, 1 or 3+ weights), 4 o (a residual, n = rows), 8 gate/up (a norm read, 2
// weights), 16 down (a residual, n > rows)
static bool zz_whatif_noinit(const zz_segs & segs, const int64_t n, const int B) {
    static const int mask = zz_env_int("LLAMA_SPARSE_CUDA_WHATIF_NOINIT");
    if (mask <= 0) {
        return false;
    }
    if (mask == 1) {
        return true;
    }
    const int64_t rows = (int64_t) segs.row_end[segs.nseg - 1]*B;
    const int kind = segs.norm_w != nullptr ? (segs.nseg == 2 ? 8 : 2) :
                     segs.bias[0] != nullptr ? (n > rows ? 16 : 4) : 0;
    return (mask & kind) != 0;
}

static int zz_red_prepare(const zz_gemv_config & cfg, const zz_caps caps, const int T, const int B,
        const zz_segs & segs, const int64_t n, float ** ws, int ** tickets, cudaStream_t stream, const bool direct) {
    const int64_t rows = segs.row_end[segs.nseg - 1];
    *ws      = nullptr;
    *tickets = nullptr;
    int red_mode = zz_red_mode(cfg, caps, direct);
    if (segs.y_ready) {
        return ZZ_RED_ATOMIC; // (also for one block a row: a store would drop y's start value)
    }
    if (zz_whatif_noinit(segs, n, B) && red_mode != ZZ_RED_STORE && red_mode != ZZ_RED_CLUSTER) {
        return ZZ_RED_ATOMIC;
    }
    if ((red_mode == ZZ_RED_TICKET || red_mode == ZZ_RED_FIRST || red_mode == ZZ_RED_EARLY) &&
            !zz_ticket_get(caps.device, stream, red_mode == ZZ_RED_TICKET ? (size_t) rows*cfg.n1*T*B : 0, ws, tickets)) {
        red_mode = ZZ_RED_ATOMIC;
    }
    if (red_mode == ZZ_RED_ATOMIC) {
        zz_zero_dst(segs, T, B, stream);
    }
    return red_mode;
}

// FUSED: the grid's last wave filled. The launch configs give DENSE whole rounds of 32 columns a warp, which leaves
// part of a wave empty on many shapes (e.g. 14336 x 4096: 8 blocks a row, 448 of 528 slots); FUSED splits the columns
// without rounds, so it takes the most blocks a row that fit in the same number of waves, keeping >= 32 columns a warp
// (H200 sweeps: bench/results/cuda_h200_2026-12-02f.md). LLAMA_SPARSE_CUDA_FUSED_FILL=b: launches of up to b tokens
// (default: every batch; 0: off); an explicit LLAMA_SPARSE_CUDA_N1 is kept as it is
static int zz_fused_fill_n1(const int nsm, const int n_tokens, const int64_t rows, const int64_t n, const int n1,
        const int n2) {
    static const int env   = zz_env_int("LLAMA_SPARSE_CUDA_FUSED_FILL");
    static const int max_t = zz_env_int("LLAMA_SPARSE_CUDA_N1") > 0 ? 0 : env >= 0 ? env : ZZ_GEMV_MAX_BATCH;
    if (n_tokens > max_t) {
        return n1;
    }
    const int64_t slots = zz_direct_wave_blocks(nsm, n_tokens);
    const int64_t waves = (rows*n1 + slots - 1)/slots;
    const int64_t fill  = std::min<int64_t>(waves*slots/rows, n/(32*n2));
    return (int) std::max<int64_t>(n1, std::min<int64_t>(fill, 64));
}

// tokens a pass of the cross-warp reduction: as many of T as n2 warps' B outputs fit in ZZ_RED_FLOATS, at least one
static int zz_red_tokens(const int n2, const int T, const int B) {
    return std::max(1, std::min(T, ZZ_RED_FLOATS/(n2*B)));
}

// fill: FUSED launches may take zz_fused_fill_n1 (not DENSE launches passed on to the FUSED kernel); G8: what the
// kernel reads (ZZ_FMT_*)
template <int T, int mode, int G8 = ZZ_FMT_Q4_K>
static void zz_gemv_launch_direct(const zz_segs & segs, const int64_t n, const float * x, const int64_t x_stride,
        const int32_t * idx, zz_gemv_config cfg, const zz_caps caps, const float thr, cudaStream_t stream,
        const bool fill = true) {
    constexpr int B = QK_K;
    const int64_t rows = segs.row_end[segs.nseg - 1];
    GGML_ASSERT(rows <= 65535);
    if (cfg.n2 > ZZ_DIRECT_MAX_WARPS) {
        // a tune entry or LLAMA_SPARSE_CUDA_N2 asked for bigger blocks: as many warps in blocks of 4
        cfg.n1 *= (cfg.n2 + ZZ_DIRECT_MAX_WARPS - 1)/ZZ_DIRECT_MAX_WARPS;
        cfg.n2  = ZZ_DIRECT_MAX_WARPS; // (zz_red_mode drops a cluster when n1 > 8)
    }
    if constexpr (mode == ZZ_GEMV_FUSED) {
        if (fill) {
            cfg.n1 = zz_fused_fill_n1(caps.nsm, T, rows, n, cfg.n1, cfg.n2);
        }
    }
    const int v         = G8 ? std::max(2, zz_direct_version_at(T)) : zz_direct_version_at(T); // (G8: no version 1)
    static const bool opaque_on = zz_env_int("LLAMA_SPARSE_CUDA_OPAQUE") != 0; // =0: off (A/B)
    // the opaque column (zz_direct_cols) on long DENSE rows at batch 1; it was measured there, the B1 variant was not
    const bool opq      = T == 1 && mode == ZZ_GEMV_DENSE && opaque_on && segs.up == nullptr && segs.norm_w == nullptr &&
                          v >= 2 &&
                          n >= 256*(int64_t) cfg.n1*cfg.n2;
    if constexpr (mode == ZZ_GEMV_DENSE) {
        // those rows run faster as FUSED with every column kept (thr 0; NaN too), whose loop has no per-column
        // checks at version 3 (LLAMA_SPARSE_CUDA_DENSE_FUSED=0: the DENSE kernel, an A/B)
        static const bool dense_fused = zz_env_int("LLAMA_SPARSE_CUDA_DENSE_FUSED") != 0;
        if (opq && v == 3 && dense_fused && ZZ_FUSED_FULL) {
            zz_gemv_launch_direct<T, ZZ_GEMV_FUSED, G8>(segs, n, x, x_stride, nullptr, cfg, caps, 0.0f, stream, false);
            return;
        }
    }
    float * ws;
    int   * tickets;
    const int red_mode  = zz_red_prepare(cfg, caps, T, B, segs, n, &ws, &tickets, stream, true);
    const int tp        = zz_red_tokens(cfg.n2, T, B);
    const bool b1       = T == 1 && v == 3 && mode == ZZ_GEMV_DENSE && !opq && !G8 && zz_b1_on();
    const int red_bytes = std::max(cfg.n2*tp*B*(int) sizeof(float), mode == ZZ_GEMV_FUSED ? cfg.n2*zz_direct_queue_bytes<T>() : 0);
    size_t smem         = red_bytes + (red_mode == ZZ_RED_CLUSTER ? T*B*sizeof(float) : 0);
    // the GLU / NORM inputs stashed in shared memory (zz_x_stash), where asked for and without opting in to more
    // than 48 KiB
    int stash_off = -1;
    if (mode != ZZ_GEMV_IDX && (segs.up != nullptr || segs.norm_w != nullptr)) {
        const int    bit   = segs.up != nullptr ? (mode == ZZ_GEMV_FUSED ? ZZ_STASH_GLU_FUSED : ZZ_STASH_GLU_DENSE)
                                                : (mode == ZZ_GEMV_FUSED ? ZZ_STASH_NORM_FUSED : ZZ_STASH_NORM_DENSE);
        const size_t off   = GGML_PAD(smem, 16);
        // (NORM: and the norm weight of the block's columns)
        const size_t bytes = (size_t) (T + (segs.norm_w != nullptr))*((n + cfg.n1 - 1)/cfg.n1 + 1)*sizeof(float);
        if ((zz_stash_mask() & bit) && off + bytes <= 48*1024) {
            stash_off = (int) off;
            smem      = off + bytes;
        }
    }
    GGML_ASSERT(cfg.n2 >= 1 && cfg.n2 <= ZZ_DIRECT_MAX_WARPS && cfg.n1 >= 1);
    const dim3 grid(cfg.n1, rows, 1);
    const dim3 block(cfg.n2*WARP_SIZE, 1, 1);
    auto kernel = zz_direct_kernel<T, mode, false, ZZ_IN_X, G8>(v, b1);
    GGML_ASSERT(segs.up == nullptr || segs.norm_w == nullptr);
    constexpr bool in_inst = !G8 || T <= ZZ_G8_IN_MAX_T; // (GLU / NORM instances of this type and batch)
    GGML_ASSERT(in_inst || (segs.up == nullptr && segs.norm_w == nullptr));
    if constexpr (mode != ZZ_GEMV_IDX && in_inst) {
        // a fused SwiGLU or RMS norm: version 2 or 3 only (the fusions check)
        if (segs.up != nullptr) {
            GGML_ASSERT(v >= 2);
            kernel = zz_direct_kernel<T, mode, false, ZZ_IN_GLU, G8>(v, b1);
        } else if (segs.norm_w != nullptr) {
            GGML_ASSERT(v >= 2);
            kernel = zz_direct_kernel<T, mode, false, ZZ_IN_NORM, G8>(v, b1);
        }
    }
    GGML_ASSERT((segs.up == nullptr && segs.norm_w == nullptr) || mode != ZZ_GEMV_IDX);
    if constexpr (T == 1 && mode == ZZ_GEMV_DENSE && !G8) {
        if (opq) {
            kernel = zz_direct_kernel<T, mode, true, ZZ_IN_X>(v);
        }
    }
    zz_launch(kernel, grid, block, smem, red_mode, stream,
              segs, x, idx, (int) n, x_stride, tp, red_mode, thr, red_bytes, ws, tickets, zz_prefetch_cols(mode),
              stash_off);
}

// the ldg kernel's steps a round (U) by type and batch. H100, batch 1: U = 4 against 8 on Q8_0 11008x4096 30.8 against
// 36 us, Q4_0 21.7 against 25.7, 4096x4096 within 3 %; U = 16 (~190 registers) slower everywhere
// (bench/results/cuda_types_h100_2026-12-07f.md). LLAMA_SPARSE_CUDA_LDG_U=8 takes U = 8 at batch 1 (A/B)
template <ggml_type type, int T>
static constexpr int zz_ldg_u() {
    if (type == GGML_TYPE_Q6_K) {
        return T == 1 ? 4 : 2;
    }
    return T <= 4 ? 4 : 2;
}

template <ggml_type type, int T, int mode>
static auto zz_ldg_kernel() {
    auto kernel = mul_mat_zz_gemv_ldg<type, T, mode, zz_ldg_u<type, T>()>;
    if constexpr (T == 1 && mode != ZZ_GEMV_FUSED) {
        static const bool u8 = zz_env_int("LLAMA_SPARSE_CUDA_LDG_U") == 8;
        if (u8) {
            kernel = mul_mat_zz_gemv_ldg<type, T, mode, 8>;
        }
    }
    return kernel;
}

// shared memory of an ldg launch without FUSED's list: the cross-warp reduction (and a cluster's total)
static size_t zz_ldg_smem(const int n2, const int T, const int B, const bool cluster) {
    return n2*zz_red_tokens(n2, T, B)*B*sizeof(float) + (cluster ? T*B*sizeof(float) : 0);
}

// resident blocks an SM of the ldg kernel (IDX) with n2 warps, for the launch config
template <ggml_type type, int T>
static int zz_ldg_blocks_per_sm_t(const int n2) {
    static std::atomic<int> known[ZZ_GEMV_MAX_WARPS + 1]; // (0: not yet asked)
    GGML_ASSERT(n2 >= 1 && n2 <= ZZ_GEMV_MAX_WARPS);
    int bps = known[n2].load();
    if (bps == 0) {
        CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&bps, zz_ldg_kernel<type, T, ZZ_GEMV_IDX>(),
                n2*WARP_SIZE, zz_ldg_smem(n2, T, zz_type<type>::B, false)));
        bps = std::max(1, bps);
        known[n2].store(bps);
    }
    return bps;
}

template <ggml_type type>
static int zz_ldg_blocks_per_sm_type(const int T, const int n2) {
    switch (T) {
        case 1:  return zz_ldg_blocks_per_sm_t<type, 1>(n2);
        case 2:  return zz_ldg_blocks_per_sm_t<type, 2>(n2);
        case 3:  return zz_ldg_blocks_per_sm_t<type, 3>(n2);
        case 4:  return zz_ldg_blocks_per_sm_t<type, 4>(n2);
        case 5:  return zz_ldg_blocks_per_sm_t<type, 5>(n2);
        case 6:  return zz_ldg_blocks_per_sm_t<type, 6>(n2);
        case 7:  return zz_ldg_blocks_per_sm_t<type, 7>(n2);
        default: return zz_ldg_blocks_per_sm_t<type, 8>(n2);
    }
}

static int zz_ldg_blocks_per_sm(const ggml_type type, const int T, const int n2) {
    switch (type) {
        case GGML_TYPE_Q8_0: return zz_ldg_blocks_per_sm_type<GGML_TYPE_Q8_0>(T, n2);
        case GGML_TYPE_Q4_0: return zz_ldg_blocks_per_sm_type<GGML_TYPE_Q4_0>(T, n2);
        case GGML_TYPE_Q6_K: return zz_ldg_blocks_per_sm_type<GGML_TYPE_Q6_K>(T, n2);
        default: GGML_ABORT("zigzag GEMV: no ldg kernel for %s", ggml_type_name(type));
    }
}

// the Q8_0 / Q4_0 / Q6_K kernel with blocks straight into registers (mul_mat_zz_gemv_ldg): one weight; EARLY
// reduction by default
template <ggml_type type, int T, int mode>
static void zz_gemv_launch_ldg(const zz_segs & segs, const int64_t n, const float * x, const int64_t x_stride,
        const int32_t * idx, const zz_gemv_config cfg, const zz_caps caps, const float thr, cudaStream_t stream) {
    constexpr int B = zz_type<type>::B;
    GGML_ASSERT(segs.nseg == 1 && segs.bias[0] == nullptr && segs.up == nullptr && segs.norm_w == nullptr);
    float * ws;
    int   * tickets;
    const int    red_mode = zz_red_prepare(cfg, caps, T, B, segs, n, &ws, &tickets, stream, true);
    const int    tp       = zz_red_tokens(cfg.n2, T, B);
    const size_t red      = zz_ldg_smem(cfg.n2, T, B, red_mode == ZZ_RED_CLUSTER);
    const size_t smem     = red + (mode == ZZ_GEMV_FUSED ? zz_fused_smem(n, cfg.n1) : 0);
    const dim3   grid(cfg.n1, segs.row_end[0], 1);
    const dim3   block(cfg.n2*WARP_SIZE, 1, 1);
    auto kernel = zz_ldg_kernel<type, T, mode>();
    if constexpr (mode == ZZ_GEMV_FUSED) {
        // the block's share of the list (zz_gemv_launch_fused keeps it under 64 KiB) may pass the default 48 KiB
        static int smem_max[GGML_CUDA_MAX_DEVICES] = { 0 };
        if (smem_max[caps.device] == 0) {
            int optin;
            CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, caps.device));
            smem_max[caps.device] = optin - 1024; // (room for the kernel's static shared memory)
            CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_max[caps.device]));
        }
        GGML_ASSERT(smem <= (size_t) smem_max[caps.device]);
    }
    zz_launch(kernel, grid, block, smem, red_mode, stream, segs.w[0], x, idx, segs.y[0], (int) n, x_stride,
              segs.y_stride[0], tp, red_mode, thr, (int) red, ws, tickets, mode == ZZ_GEMV_FUSED ? segs.stats : nullptr);
}

// the file's layout: the direct Q4_K kernel, the ldg kernel (other types), or the staged kernel
template <ggml_type type, int T, int mode>
static void zz_gemv_launch_rows(const zz_segs & segs, const int64_t n, const float * x, const int64_t x_stride,
        const int32_t * idx, const zz_gemv_config cfg, const zz_caps caps, const float thr, cudaStream_t stream) {
    typedef zz_type<type> zt;
    constexpr int wsm = zz_warp_smem<type, T>();

    const int64_t rows = segs.row_end[segs.nseg - 1];
    GGML_ASSERT(rows <= 65535);
    GGML_ASSERT(cfg.n2 >= 1 && cfg.n2 <= ZZ_GEMV_MAX_WARPS && cfg.n1 >= 1);

    if constexpr (type == GGML_TYPE_Q4_K && mode != ZZ_GEMV_SKIP) {
        if (caps.direct) {
            zz_gemv_launch_direct<T, mode>(segs, n, x, x_stride, idx, cfg, caps, thr, stream);
            return;
        }
    }
    if constexpr (type != GGML_TYPE_Q4_K && mode != ZZ_GEMV_SKIP) {
        if (caps.direct) {
            zz_gemv_launch_ldg<type, T, mode>(segs, n, x, x_stride, idx, cfg, caps, thr, stream);
            return;
        }
    }
    GGML_ASSERT(segs.nseg == 1 && segs.bias[0] == nullptr && segs.up == nullptr && segs.norm_w == nullptr);
    const char *  w        = segs.w[0];
    float *       y        = segs.y[0];
    const int64_t y_stride = segs.y_stride[0];

    float * ws;
    int   * tickets;
    const int    red_mode  = zz_red_prepare(cfg, caps, T, zt::B, segs, n, &ws, &tickets, stream, false);
    const int    tp        = zz_red_tokens(cfg.n2, T, zt::B);
    const size_t smem_base = std::max<size_t>(cfg.n2*wsm, cfg.n2*tp*zt::B*sizeof(float)) +
                             (red_mode == ZZ_RED_CLUSTER ? T*zt::B*sizeof(float) : 0);
    const size_t smem      = smem_base + (mode == ZZ_GEMV_FUSED ? zz_fused_smem(n, cfg.n1) : 0);

    const dim3 grid(cfg.n1, rows, 1);
    const dim3 block(cfg.n2*WARP_SIZE, 1, 1);
    auto kernel = mul_mat_zz_gemv<type, T, mode>;

    // up to 8 warps of pipeline buffers exceed the default 48 KiB: opt in once per device
    {
        static int smem_max[GGML_CUDA_MAX_DEVICES] = { 0 };
        int device;
        CUDA_CHECK(cudaGetDevice(&device));
        if (smem_max[device] == 0) {
            int optin;
            CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
            // (FUSED: leave room for the kernel's static shared memory)
            smem_max[device] = mode == ZZ_GEMV_FUSED ? optin - 1024 : std::min(optin, ZZ_GEMV_MAX_WARPS*wsm + T*zt::B*(int) sizeof(float));
            CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_max[device]));
        }
        GGML_ASSERT(smem <= (size_t) smem_max[device] && "zigzag GEMV: n2 too large for this device's shared memory");
    }

    zz_launch(kernel, grid, block, smem, red_mode, stream, w, x, idx, y, (int) n, x_stride, y_stride, tp, red_mode, thr,
              (int) smem_base, ws, tickets, mode == ZZ_GEMV_FUSED ? segs.stats : nullptr);
}

// segs: one weight, or (direct kernel only) a group
template <ggml_type type, int T, int mode>
static void zz_gemv_launch_t(const zz_segs & segs, const int64_t n, const float * x, const int64_t x_stride,
        const int32_t * idx, const zz_gemv_config cfg, const zz_caps caps, const float thr, cudaStream_t stream) {
    if constexpr (type == ZZ_TYPE_Q4_0_G8 || type == ZZ_TYPE_Q8_0_G8) {
        // only the direct kernel reads these layouts (zz_cuda_relayout leaves them to sm_80+)
        GGML_ASSERT(caps.direct && mode != ZZ_GEMV_SKIP && "zigzag GEMV: the G8 layout needs the direct kernel, no SKIP");
        if constexpr (mode != ZZ_GEMV_SKIP) {
            zz_gemv_launch_direct<T, mode, type == ZZ_TYPE_Q8_0_G8 ? ZZ_FMT_G8_Q8 : ZZ_FMT_G8_Q4>(segs, n, x, x_stride, idx,
                    cfg, caps, thr, stream);
        }
    } else {
        zz_gemv_launch_rows<type, T, mode>(segs, n, x, x_stride, idx, cfg, caps, thr, stream);
    }
}

template <ggml_type type, int T>
static void zz_gemv_launch_mode(const zz_gemv_mode mode, const zz_segs & segs, const int64_t n,
        const float * x, const int64_t x_stride, const int32_t * idx, const zz_gemv_config cfg, const zz_caps caps, const float thr, cudaStream_t stream) {
    switch (mode) {
        case ZZ_GEMV_DENSE:
            zz_gemv_launch_t<type, T, ZZ_GEMV_DENSE>(segs, n, x, x_stride, idx, cfg, caps, thr, stream);
            break;
        case ZZ_GEMV_IDX:
            zz_gemv_launch_t<type, T, ZZ_GEMV_IDX>(segs, n, x, x_stride, idx, cfg, caps, thr, stream);
            break;
        case ZZ_GEMV_FUSED:
            zz_gemv_launch_t<type, T, ZZ_GEMV_FUSED>(segs, n, x, x_stride, idx, cfg, caps, thr, stream);
            break;
        case ZZ_GEMV_SKIP:
#ifdef GGML_SPARSE_CUDA_ABLATION
            zz_gemv_launch_t<type, T, ZZ_GEMV_SKIP>(segs, n, x, x_stride, idx, cfg, caps, thr, stream);
            break;
#else
            GGML_ABORT("ZZ_GEMV_SKIP needs GGML_SPARSE_CUDA_ABLATION");
#endif // GGML_SPARSE_CUDA_ABLATION
    }
}

template <ggml_type type>
static void zz_gemv_launch_type(const int T, const zz_gemv_mode mode, const zz_segs & segs, const int64_t n,
        const float * x, const int64_t x_stride, const int32_t * idx, const zz_gemv_config cfg, const zz_caps caps, const float thr, cudaStream_t stream) {
    switch (T) {
        case 1: zz_gemv_launch_mode<type, 1>(mode, segs, n, x, x_stride, idx, cfg, caps, thr, stream); break;
        case 2: zz_gemv_launch_mode<type, 2>(mode, segs, n, x, x_stride, idx, cfg, caps, thr, stream); break;
        case 3: zz_gemv_launch_mode<type, 3>(mode, segs, n, x, x_stride, idx, cfg, caps, thr, stream); break;
        case 4: zz_gemv_launch_mode<type, 4>(mode, segs, n, x, x_stride, idx, cfg, caps, thr, stream); break;
        case 5: zz_gemv_launch_mode<type, 5>(mode, segs, n, x, x_stride, idx, cfg, caps, thr, stream); break;
        case 6: zz_gemv_launch_mode<type, 6>(mode, segs, n, x, x_stride, idx, cfg, caps, thr, stream); break;
        case 7: zz_gemv_launch_mode<type, 7>(mode, segs, n, x, x_stride, idx, cfg, caps, thr, stream); break;
        case 8: zz_gemv_launch_mode<type, 8>(mode, segs, n, x, x_stride, idx, cfg, caps, thr, stream); break;
        default: GGML_ABORT("zigzag GEMV: batch %d out of range", T);
    }
}

// seg[0..nseg): the weights of one launch (nseg > 1: direct Q4_K kernel only)
// seg[s].bias and up: the direct Q4_K kernel only
static void zz_gemv_launch_thr(const ggml_type type, const zz_gemv_seg * seg, const int nseg, const int64_t n,
        const float * x, const int64_t x_stride, const int n_tokens, const int32_t * idx, const zz_gemv_mode mode,
        const zz_gemv_config cfg, const zz_caps caps, const float thr, cudaStream_t stream,
        const float * up = nullptr, const int64_t up_stride = 0, const zz_gemv_norm * norm = nullptr,
        unsigned long long * stats = nullptr) {
    GGML_ASSERT(zz_type_supported(type));
    GGML_ASSERT(nseg >= 1 && nseg <= ZZ_GROUP_MAX);
    const bool direct = zz_direct_type(type) && caps.direct;
    GGML_ASSERT(n_tokens >= 1 && n_tokens <= ZZ_GEMV_MAX_BATCH);
    GGML_ASSERT(n > 0 && n < INT32_MAX);
    GGML_ASSERT(mode != ZZ_GEMV_IDX || idx != nullptr);

    const int64_t B = zz_blck_size(type);
    zz_segs segs = {};
    segs.nseg = nseg;
    int64_t rows = 0;
    for (int s = 0; s < nseg; ++s) {
        GGML_ASSERT(seg[s].m > 0 && seg[s].m % B == 0 && (uintptr_t) seg[s].w % 16 == 0);
        rows += seg[s].m/B;
        GGML_ASSERT(rows <= 65535);
        segs.row_end[s]  = (int) rows;
        segs.w[s]        = (const char *) seg[s].w;
        segs.y[s]        = seg[s].y;
        segs.y_stride[s] = seg[s].y_stride;
        segs.bias[s]        = seg[s].bias;
        segs.bias_stride[s] = seg[s].bias_stride;
        GGML_ASSERT(seg[s].y_ready == seg[0].y_ready && (!seg[s].y_ready || seg[s].bias == nullptr));
    }
    segs.y_ready = seg[0].y_ready;
    GGML_ASSERT(!segs.y_ready || (direct && mode != ZZ_GEMV_IDX));
    if (norm != nullptr) {
        GGML_ASSERT(norm->x_copy == nullptr || norm->x_copy_stride >= n);
        GGML_ASSERT(norm->x_copy2 == nullptr || norm->x_copy != nullptr);
        GGML_ASSERT(norm->clear_n == 0 || norm->clear != nullptr);
        segs.x_copy        = norm->x_copy;
        segs.x_copy_stride = norm->x_copy_stride;
        segs.x_copy2       = norm->x_copy2;
        segs.clear         = norm->clear;
        segs.clear_n       = norm->clear_n;
    }
    segs.stats     = mode == ZZ_GEMV_FUSED ? stats : nullptr;
    segs.up        = up;
    segs.up_stride = up_stride;
    segs.norm_w    = norm ? norm->w : nullptr;
    segs.norm_eps  = norm ? norm->eps : 0.0f;
    static const bool early_wait = zz_env_int("LLAMA_SPARSE_CUDA_EARLY_TAIL") == 0;
    segs.early_wait = early_wait;
    // FUSED launches add their partials with float4 atomics, a quarter of the atomics (7B chain: 0.50 -2.3 to -3.4 %,
    // no active column -5.3 to -5.7 %; bench/results/cuda_h100_2026-11-27f.md); LLAMA_SPARSE_CUDA_RED_V4=0 turns it
    // off. DENSE kernels keep scalar atomics: the branch would change their code, measured without it
    static const bool red_v4 = zz_env_int("LLAMA_SPARSE_CUDA_RED_V4") != 0;
    segs.red_v4 = red_v4 && B % 4 == 0;
    for (int s = 0; s < nseg; ++s) {
        if ((uintptr_t) seg[s].y % 16 != 0 || seg[s].y_stride % 4 != 0) {
            segs.red_v4 = 0;
        }
    }
    if (type == ZZ_TYPE_Q4_0_G8) {
        zz_gemv_launch_type<ZZ_TYPE_Q4_0_G8>(n_tokens, mode, segs, n, x, x_stride, idx, cfg, caps, thr, stream);
        return;
    }
    if (type == ZZ_TYPE_Q8_0_G8) {
        zz_gemv_launch_type<ZZ_TYPE_Q8_0_G8>(n_tokens, mode, segs, n, x, x_stride, idx, cfg, caps, thr, stream);
        return;
    }
    switch (type) {
        case GGML_TYPE_Q4_K: zz_gemv_launch_type<GGML_TYPE_Q4_K>(n_tokens, mode, segs, n, x, x_stride, idx, cfg, caps, thr, stream); break;
        case GGML_TYPE_Q6_K: zz_gemv_launch_type<GGML_TYPE_Q6_K>(n_tokens, mode, segs, n, x, x_stride, idx, cfg, caps, thr, stream); break;
        case GGML_TYPE_Q4_0: zz_gemv_launch_type<GGML_TYPE_Q4_0>(n_tokens, mode, segs, n, x, x_stride, idx, cfg, caps, thr, stream); break;
        case GGML_TYPE_Q8_0: zz_gemv_launch_type<GGML_TYPE_Q8_0>(n_tokens, mode, segs, n, x, x_stride, idx, cfg, caps, thr, stream); break;
        default: GGML_ABORT("zigzag GEMV: unsupported type %s", ggml_type_name(type));
    }
}

void zz_gemv_launch_ex(const ggml_type type, const void * w, const int64_t n, const int64_t m,
        const float * x, const int64_t x_stride, const int n_tokens, const int32_t * idx, const zz_gemv_mode mode,
        float * y, const int64_t y_stride, const zz_gemv_config cfg, cudaStream_t stream) {
    GGML_ASSERT(mode != ZZ_GEMV_FUSED && "zigzag GEMV: FUSED goes through zz_gemv_launch_fused");
    const zz_gemv_seg seg = { w, m, y, y_stride };
    zz_gemv_launch_thr(type, &seg, 1, n, x, x_stride, n_tokens, idx, mode, cfg, zz_get_caps(), 0.0f, stream);
}

bool zz_gemv_launch_fused(const ggml_type type, const void * w, const int64_t n, const int64_t m,
        const float * x, const int64_t x_stride, const int n_tokens, const float thr,
        float * y, const int64_t y_stride, const zz_gemv_config cfg, const bool allow_staged, cudaStream_t stream,
        unsigned long long * stats) {
    const zz_caps caps = zz_get_caps();
    if (!(zz_direct_type(type) && caps.direct)) {
        // the staged kernel's fused area next to its largest pipeline + reduction buffers (8 warps, batch 8)
        // stays < 227 KiB (the ldg kernel has no pipeline buffers); the direct Q4_K kernel keeps only a small queue
        // per warp
        if (!allow_staged || zz_fused_smem(n, cfg.n1) > 64*1024) {
            return false;
        }
    }
    const zz_gemv_seg seg = { w, m, y, y_stride };
    zz_gemv_launch_thr(type, &seg, 1, n, x, x_stride, n_tokens, nullptr, ZZ_GEMV_FUSED, cfg, caps, thr, stream,
            nullptr, 0, nullptr, stats);
    return true;
}

bool zz_gemv_fused_counts(const ggml_type type, const int n_tokens) {
    return n_tokens == 1 || !zz_direct_type(type) || !zz_get_caps().direct;
}

bool zz_gemv_launch_group(const ggml_type type, const zz_gemv_seg * seg, const int nseg, const int64_t n,
        const float * x, const int64_t x_stride, const int n_tokens, const int32_t * idx, const zz_gemv_mode mode,
        const float thr, const zz_gemv_config cfg, cudaStream_t stream, const zz_gemv_norm * norm,
        unsigned long long * stats) {
    const zz_caps caps = zz_get_caps();
    if (!zz_direct_type(type) || !caps.direct || mode == ZZ_GEMV_SKIP ||
            (norm != nullptr && (!zz_in_ok(type, n_tokens) || mode == ZZ_GEMV_IDX))) {
        return false;
    }
    zz_gemv_launch_thr(type, seg, nseg, n, x, x_stride, n_tokens, idx, mode, cfg, caps, thr, stream, nullptr, 0, norm,
            stats);
    return true;
}

bool zz_gemv_launch_glu(const ggml_type type, const zz_gemv_seg & seg, const int64_t n, const float * gate,
        const int64_t g_stride, const float * up, const int64_t up_stride, const int n_tokens, const zz_gemv_mode mode,
        const float thr, const zz_gemv_config cfg, cudaStream_t stream) {
    const zz_caps caps = zz_get_caps();
    if (!zz_in_ok(type, n_tokens) || !caps.direct || (mode != ZZ_GEMV_DENSE && mode != ZZ_GEMV_FUSED) ||
            up == nullptr) {
        return false;
    }
    zz_gemv_launch_thr(type, &seg, 1, n, gate, g_stride, n_tokens, nullptr, mode, cfg, caps, thr, stream, up, up_stride);
    return true;
}

void zz_gemv_launch(const ggml_type type, const void * w, const int64_t n, const int64_t m,
        const float * x, const int64_t x_stride, const int n_tokens, const int32_t * idx, float * y, cudaStream_t stream) {
    int device;
    CUDA_CHECK(cudaGetDevice(&device));
    const zz_gemv_config cfg = zz_gemv_get_config(device, type, n, m, n_tokens);
    zz_gemv_launch_ex(type, w, n, m, x, x_stride, n_tokens, idx, idx ? ZZ_GEMV_IDX : ZZ_GEMV_DENSE, y, m, cfg, stream);
}

// ---------------------------------------------------------------------------------------------------
// launch configs: tune file, heuristic, environment

struct zz_tune_entry {
    std::string    device;
    ggml_type      type;
    int            log2_rows;
    int            log2_n;
    int            n_tokens;
    zz_gemv_config cfg;
    bool           direct = false; // built-in table: a Q4_K entry timed on the direct kernel (after "# direct")
};

// measured with ggml_cuda_zz_autotune on the devices named in the first column (50% sparsity, weights from
// DRAM); used for shape classes the tune file does not have
static const char * zz_tune_builtin =
#include "mul-mat-zz-tune.inc"
    ;

static std::mutex                 zz_tune_mutex;
static bool                       zz_tune_loaded = false;
static std::vector<zz_tune_entry> zz_tune_table;

static int zz_log2_ceil(const int64_t v) {
    int l = 0;
    while ((int64_t(1) << l) < v) {
        ++l;
    }
    return l;
}

static std::string zz_tune_path(const char * path) {
    if (path != nullptr) {
        return path;
    }
    const char * env = getenv("LLAMA_SPARSE_CUDA_TUNE_FILE");
    if (env != nullptr) {
        return env;
    }
    const char * home = getenv("HOME");
    return std::string(home ? home : ".") + "/.cache/llama-sparse/cuda-tune.txt";
}

static bool zz_type_from_name(const char * name, ggml_type & type) {
    const ggml_type types[] = { GGML_TYPE_Q4_K, GGML_TYPE_Q6_K, GGML_TYPE_Q4_0, GGML_TYPE_Q8_0 };
    for (ggml_type t : types) {
        if (strcmp(name, ggml_type_name(t)) == 0) {
            type = t;
            return true;
        }
    }
    return false;
}

// one entry a line: device type log2_rows log2_n n_tokens n1 n2 cluster ('#' starts a comment); n1 n2 cluster = 0 0 0:
// the heuristic (measured best for this batch, so that a smaller batch's entry does not stand in for it)
static bool zz_tune_parse_line(const char * line, zz_tune_entry & e) {
    if (line[0] == '#') {
        return false;
    }
    char dev[256];
    char tname[32];
    if (sscanf(line, "%255s %31s %d %d %d %d %d %d", dev, tname, &e.log2_rows, &e.log2_n, &e.n_tokens,
                &e.cfg.n1, &e.cfg.n2, &e.cfg.cluster) != 8 || !zz_type_from_name(tname, e.type)) {
        return false;
    }
    const bool heuristic = e.cfg.n1 == 0 && e.cfg.n2 == 0 && e.cfg.cluster == 0;
    if (!heuristic && (e.cfg.n1 < 1 || e.cfg.n2 < 1 || e.cfg.n2 > ZZ_GEMV_MAX_WARPS)) {
        return false;
    }
    e.device = dev;
    return true;
}

static std::vector<zz_tune_entry> zz_tune_read_builtin() {
    std::vector<zz_tune_entry> entries;
    bool direct = false;
    for (const char * p = zz_tune_builtin; *p; ) {
        const char * nl = strchr(p, '\n');
        const std::string line(p, nl ? nl - p : strlen(p));
        zz_tune_entry e;
        direct = direct || line.rfind("# direct", 0) == 0;
        if (zz_tune_parse_line(line.c_str(), e)) {
            e.direct = direct;
            entries.push_back(e);
        }
        p = nl ? nl + 1 : p + line.size();
    }
    return entries;
}

// the built-in entries after the tune file's, only for the kernel they were timed on
// (LLAMA_SPARSE_CUDA_TUNE_BUILTIN=0: none, for A/B)
static void zz_tune_add_builtin(std::vector<zz_tune_entry> & table, const zz_device_props & props) {
    static const int env = zz_env_int("LLAMA_SPARSE_CUDA_TUNE_BUILTIN");
    for (const zz_tune_entry & e : zz_tune_read_builtin()) {
        // (the other types' entries were timed on the staged kernel: used only when it runs them)
        if (env != 0 && e.direct == zz_direct_enabled(props.cc_major)) {
            table.push_back(e);
        }
    }
}

static std::vector<zz_tune_entry> zz_tune_read(const std::string & path) {
    std::vector<zz_tune_entry> entries;
    FILE * f = fopen(path.c_str(), "r");
    if (f == nullptr) {
        return entries;
    }
    char line[512];
    while (fgets(line, sizeof(line), f)) {
        zz_tune_entry e;
        if (zz_tune_parse_line(line, e)) {
            entries.push_back(e);
        }
    }
    fclose(f);
    return entries;
}

static zz_gemv_config zz_gemv_default_config(const zz_device_props & props, const ggml_type type, const int64_t n,
        const int64_t m, const int n_tokens) {
    const int64_t rows = m/ggml_blck_size(type);

    zz_gemv_config cfg;
    cfg.n2      = 8;
    cfg.cluster = 0;

    if (type == GGML_TYPE_Q4_K && zz_direct_enabled(props.cc_major)) {
        // 4 warps a block; n1 such that the grid is one wave of resident blocks (zz_direct_blocks_per_sm) and
        // each warp gets whole rounds of 32 columns, the fewest per warp that allow it. H100 against the former
        // fixed n1 = 16: batch 1 dense 0.98-1.22x as fast, fused 50 % 1.00-1.32x, batch 4 up to 1.65x (e.g.
        // 11008x4096 16.3 against 18.9 us: n1 = 8, one wave instead of 1.7; bench/results/cuda_h100_2026-11-23f.md).
        // Atomics: clusters of 8 measured ~1.8x slower
        cfg.n2 = 4;
        const int64_t wave = std::max<int64_t>(1, zz_direct_wave_blocks(props.nsm, n_tokens)/rows)*cfg.n2; // warps a block-row
        const int64_t cols = 32*((n + 32*wave - 1)/(32*wave));                                     // columns a warp
        cfg.n1 = (int) std::max<int64_t>(1, std::min<int64_t>(64, (n + cfg.n2*cols - 1)/(cfg.n2*cols)));
        return cfg;
    }

    if (zz_direct_enabled(props.cc_major)) {
        // the other types' kernel with blocks straight into registers (mul_mat_zz_gemv_ldg), 8 warps a block: the
        // fewest blocks a block-row (>= 1, <= 64, >= 64 columns a warp; 16 for Q6_K) that fill at least 90 % of
        // their last wave of resident blocks, else the best filling one (blocks take equal shares: a part-filled last
        // wave costs as much as a full one)
        const int64_t slots  = (int64_t) props.nsm*zz_ldg_blocks_per_sm(type, n_tokens, cfg.n2);
        const int64_t n1_max = std::max<int64_t>(1, std::min<int64_t>(64, n/(cfg.n2*(type == GGML_TYPE_Q6_K ? 16 : 64))));
        double best = -1.0;
        for (int64_t n1 = 1; n1 <= n1_max; ++n1) {
            const int64_t blocks = rows*n1;
            const double  fill   = (double) blocks/(((blocks + slots - 1)/slots)*slots);
            if (fill > best + 1e-9) {
                best   = fill;
                cfg.n1 = (int) n1;
            }
            if (fill >= 0.9) {
                break;
            }
        }
        return cfg;
    }

    // about 12 warps per SM, at least one chunk of columns per warp, at most 64 blocks per block-row
    const int64_t chunk  = ggml_blck_size(type) == QK_K ? 32 : 128;
    const int64_t target = (int64_t) props.nsm*12;
    const int64_t n1_max = std::max<int64_t>(1, std::min<int64_t>(64, n/(cfg.n2*chunk)));
    const int64_t n1     = (target + rows*cfg.n2 - 1)/(rows*cfg.n2);
    cfg.n1 = (int) std::max<int64_t>(1, std::min(n1, n1_max));
    return cfg;
}

static int zz_env_int(const char * name) {
    const char * v = getenv(name);
    return v ? atoi(v) : -1;
}

zz_gemv_config zz_gemv_get_config(const int device, ggml_type type, const int64_t n, const int64_t m, const int n_tokens) {
    const zz_device_props & props = zz_get_device_props(device);
    if (type == ZZ_TYPE_Q4_0_G8 || type == ZZ_TYPE_Q8_0_G8) {
        // the same kernel (over the same bytes for Q4_0, twice them for Q8_0): Q4_K's heuristic and tune entries
        type = GGML_TYPE_Q4_K;
    }

    zz_gemv_config cfg = zz_gemv_default_config(props, type, n, m, n_tokens);
    {
        std::lock_guard<std::mutex> lock(zz_tune_mutex);
        if (!zz_tune_loaded) {
            zz_tune_table = zz_tune_read(zz_tune_path(nullptr));
            zz_tune_add_builtin(zz_tune_table, props);
            zz_tune_loaded = true;
        }
        // the entry of this shape class with the largest batch <= n_tokens; the tune file before the built-in table
        const int lr   = zz_log2_ceil(m/ggml_blck_size(type));
        const int ln   = zz_log2_ceil(n);
        int       best = 0;
        for (const zz_tune_entry & e : zz_tune_table) {
            if (e.type == type && e.log2_rows == lr && e.log2_n == ln && e.n_tokens <= n_tokens && e.n_tokens > best &&
                    e.device == props.key) {
                cfg  = e.cfg.n1 > 0 ? e.cfg : zz_gemv_default_config(props, type, n, m, n_tokens);
                best = e.n_tokens;
            }
        }
    }

    static const int env_n1      = zz_env_int("LLAMA_SPARSE_CUDA_N1");
    static const int env_n2      = zz_env_int("LLAMA_SPARSE_CUDA_N2");
    static const int env_cluster = zz_env_int("LLAMA_SPARSE_CUDA_CLUSTER");
    if (env_n1 > 0) {
        cfg.n1 = env_n1;
    }
    if (env_n2 > 0) {
        cfg.n2 = std::min(env_n2, ZZ_GEMV_MAX_WARPS);
    }
    if (env_cluster >= 0) {
        cfg.cluster = env_cluster;
    }
    if (props.cc_major < 9 || cfg.n1 > 8) {
        cfg.cluster = 0;
    }
    return cfg;
}

// ---------------------------------------------------------------------------------------------------
// prefill: zigzag -> f16 row-major tiles, then cuBLAS

// one thread writes one input column j of a block-row: out[i*n] = W[row0 + i, j] for the block's B outputs
template <ggml_type type>
static __device__ __forceinline__ void zz_dequant_col(const char * blk, half * out, const int64_t n);

// outputs 64c .. 64c + 63 of a block with Q4_K's nibble order (q32: its 128 quant bytes): w = d q - m, sub-block 2c
// in the low nibbles (d0, m0), 2c + 1 in the high ones (d1, m1)
static __device__ __forceinline__ void zz_dequant_nibbles(const uint32_t * q32, const int c, const float d0, const float m0,
        const float d1, const float m1, half * out, const int64_t n) {
#pragma unroll
    for (int wi = 0; wi < 8; ++wi) {
        const uint32_t v = __ldg(q32 + 8*c + wi);
#pragma unroll
        for (int b = 0; b < 4; ++b) {
            const int i = 64*c + 4*wi + b;
            out[(int64_t) (i +  0)*n] = __float2half(d0*((v >> (8*b + 0)) & 0xF) - m0);
            out[(int64_t) (i + 32)*n] = __float2half(d1*((v >> (8*b + 4)) & 0xF) - m1);
        }
    }
}

template <>
__device__ __forceinline__ void zz_dequant_col<GGML_TYPE_Q4_K>(const char * blk, half * out, const int64_t n) {
    const uint4      h   = __ldg((const uint4 *) blk);
    const float2     dm  = __half22float2(*(const half2 *) &h.x);
    const uint32_t * q32 = (const uint32_t *) (blk + 16);
#pragma unroll
    for (int c = 0; c < 4; ++c) {
        uint32_t sc0, mn0, sc1, mn1;
        zz_q4_K_scale_min(h, 2*c + 0, sc0, mn0);
        zz_q4_K_scale_min(h, 2*c + 1, sc1, mn1);
        zz_dequant_nibbles(q32, c, dm.x*sc0, dm.y*mn0, dm.x*sc1, dm.y*mn1, out, n);
    }
}

template <>
__device__ __forceinline__ void zz_dequant_col<GGML_TYPE_Q6_K>(const char * blk, half * out, const int64_t n) {
    const uint16_t * b16 = (const uint16_t *) blk; // 2-byte aligned
    const float      d   = zz_ldg_half_f(blk + offsetof(block_q6_K, d));
    uint32_t sc16[QK_K/32];
#pragma unroll
    for (int k = 0; k < QK_K/32; ++k) {
        sc16[k] = __ldg(b16 + (QK_K/2 + QK_K/4)/2 + k);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int l = 0; l < 32; l += 2) {
            const uint32_t qa = __ldg(b16 + (64*h +  0 + l)/2);
            const uint32_t qb = __ldg(b16 + (64*h + 32 + l)/2);
            const uint32_t qh = __ldg(b16 + (QK_K/2 + 32*h + l)/2);
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int      ll = l + e;
                const uint32_t la = (qa >> 8*e) & 0xFF;
                const uint32_t lb = (qb >> 8*e) & 0xFF;
                const uint32_t hh = (qh >> 8*e) & 0xFF;
                const int      q1 = (int) ((la & 0xF) | (((hh >> 0) & 3) << 4)) - 32;
                const int      q2 = (int) ((lb & 0xF) | (((hh >> 2) & 3) << 4)) - 32;
                const int      q3 = (int) ((la >>  4) | (((hh >> 4) & 3) << 4)) - 32;
                const int      q4 = (int) ((lb >>  4) | (((hh >> 6) & 3) << 4)) - 32;
                const int      is = 8*h + ll/16;
                const float    s1 = d*(int8_t) ((sc16[(is + 0)/2] >> 8*((is + 0) & 1)) & 0xFF);
                const float    s2 = d*(int8_t) ((sc16[(is + 2)/2] >> 8*((is + 2) & 1)) & 0xFF);
                const float    s3 = d*(int8_t) ((sc16[(is + 4)/2] >> 8*((is + 4) & 1)) & 0xFF);
                const float    s4 = d*(int8_t) ((sc16[(is + 6)/2] >> 8*((is + 6) & 1)) & 0xFF);
                out[(int64_t) (128*h + ll +  0)*n] = __float2half(s1*q1);
                out[(int64_t) (128*h + ll + 32)*n] = __float2half(s2*q2);
                out[(int64_t) (128*h + ll + 64)*n] = __float2half(s3*q3);
                out[(int64_t) (128*h + ll + 96)*n] = __float2half(s4*q4);
            }
        }
    }
}

template <>
__device__ __forceinline__ void zz_dequant_col<GGML_TYPE_Q4_0>(const char * blk, half * out, const int64_t n) {
    const uint16_t * b16 = (const uint16_t *) blk;
    const float      d   = zz_ldg_half_f(blk);
#pragma unroll
    for (int k = 0; k < QK4_0/4; ++k) {
        const uint32_t v = __ldg(b16 + 1 + k);
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const uint32_t q = (v >> 8*e) & 0xFF;
            out[(int64_t) (2*k + e          )*n] = __float2half(d*((int) (q & 0xF) - 8));
            out[(int64_t) (2*k + e + QK4_0/2)*n] = __float2half(d*((int) (q >>  4) - 8));
        }
    }
}

// 32 Q8_0 outputs of scale d_at (f16) and int8 quants q_at (2-byte aligned) into out[i*n]
static __device__ __forceinline__ void zz_dequant_q8_0(const char * d_at, const char * q_at, half * out, const int64_t n) {
    const uint16_t * q16 = (const uint16_t *) q_at;
    const float      d   = zz_ldg_half_f(d_at);
#pragma unroll
    for (int k = 0; k < QK8_0/2; ++k) {
        const uint32_t v = __ldg(q16 + k);
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            out[(int64_t) (2*k + e)*n] = __float2half(d*(int8_t) ((v >> 8*e) & 0xFF));
        }
    }
}

template <>
__device__ __forceinline__ void zz_dequant_col<GGML_TYPE_Q8_0>(const char * blk, half * out, const int64_t n) {
    zz_dequant_q8_0(blk, blk + 2, out, n);
}

template <>
__device__ __forceinline__ void zz_dequant_col<ZZ_TYPE_Q4_0_G8>(const char * blk, half * out, const int64_t n) {
    const uint4      h   = __ldg((const uint4 *) blk);
    const uint32_t * q32 = (const uint32_t *) (blk + 16);
#pragma unroll
    for (int c = 0; c < 4; ++c) {
        // header word c: d of sub-blocks 2c (low half) and 2c + 1 (high half)
        const uint32_t hw = c == 0 ? h.x : c == 1 ? h.y : c == 2 ? h.z : h.w;
        const float2   d  = __half22float2(*(const half2 *) &hw);
        zz_dequant_nibbles(q32, c, d.x, 8.0f*d.x, d.y, 8.0f*d.y, out, n); // w = d (q - 8)
    }
}

template <>
__device__ __forceinline__ void zz_dequant_col<ZZ_TYPE_Q8_0_G8>(const char * blk, half * out, const int64_t n) {
    for (int s = 0; s < ZZ_G8_ROWS; ++s) {
        zz_dequant_q8_0(blk + 2*s, blk + 16 + QK8_0*s, out + (int64_t) QK8_0*s*n, n); // sub-block s
    }
}

// grid (ceil(n/blockDim), block-rows of the tile); w points at the tile's first block-row
template <ggml_type type>
static __global__ void zz_dequant_f16(const char * w, half * dst, const int n) {
    typedef zz_type<type> zt;
    ggml_cuda_pdl_lc();
    const int j = blockIdx.x*blockDim.x + threadIdx.x;
    ggml_cuda_pdl_sync();
    if (j >= n) {
        return;
    }
    const char * blk = w + ((int64_t) blockIdx.y*n + j)*zt::bs;
    zz_dequant_col<type>(blk, dst + (int64_t) blockIdx.y*zt::B*n + j, n);
}

#ifndef GGML_SPARSE_CUDA_NO_CUBLAS
static __global__ void zz_x_to_f16(const float * x, const int64_t x_stride, const int n,
        half * dst) {
    ggml_cuda_pdl_lc();
    const int j = blockIdx.x*blockDim.x + threadIdx.x;
    const int t = blockIdx.y;
    ggml_cuda_pdl_sync();
    if (j < n) {
        dst[(int64_t) t*n + j] = __float2half(x[t*x_stride + j]);
    }
}
#endif // GGML_SPARSE_CUDA_NO_CUBLAS

void zz_dequant_f16_launch(const ggml_type type, const void * w, const int64_t n, const int64_t row0, const int64_t nrows,
        half * dst, cudaStream_t stream) {
    const int64_t B = zz_blck_size(type);
    GGML_ASSERT(row0 % B == 0 && nrows % B == 0 && nrows/B <= 65535);
    const char * wt = (const char *) w + (row0/B)*n*zz_block_bytes(type);

    const int  block_size = 128;
    const dim3 grid((n + block_size - 1)/block_size, nrows/B, 1);
    const ggml_cuda_kernel_launch_params params(grid, dim3(block_size, 1, 1), 0, stream);
    if (type == ZZ_TYPE_Q4_0_G8) {
        ggml_cuda_kernel_launch(zz_dequant_f16<ZZ_TYPE_Q4_0_G8>, params, wt, dst, (int) n);
        return;
    }
    if (type == ZZ_TYPE_Q8_0_G8) {
        ggml_cuda_kernel_launch(zz_dequant_f16<ZZ_TYPE_Q8_0_G8>, params, wt, dst, (int) n);
        return;
    }
    switch (type) {
        case GGML_TYPE_Q4_K: ggml_cuda_kernel_launch(zz_dequant_f16<GGML_TYPE_Q4_K>, params, wt, dst, (int) n); break;
        case GGML_TYPE_Q6_K: ggml_cuda_kernel_launch(zz_dequant_f16<GGML_TYPE_Q6_K>, params, wt, dst, (int) n); break;
        case GGML_TYPE_Q4_0: ggml_cuda_kernel_launch(zz_dequant_f16<GGML_TYPE_Q4_0>, params, wt, dst, (int) n); break;
        case GGML_TYPE_Q8_0: ggml_cuda_kernel_launch(zz_dequant_f16<GGML_TYPE_Q8_0>, params, wt, dst, (int) n); break;
        default: GGML_ABORT("zigzag dequantize: unsupported type %s", ggml_type_name(type));
    }
}

int64_t zz_prefill_tile_rows(const ggml_type type, const int64_t n, const int64_t m) {
    const int64_t B    = zz_blck_size(type);
    int64_t       rows = ((int64_t) ZZ_PREFILL_TILE_BYTES/(n*(int64_t) sizeof(half)))/B*B;
    rows = std::max(rows, B);
    rows = std::min(rows, std::min(m, (int64_t) 65535*B));
    return rows;
}

int64_t zz_prefill_tmp_w_size(const ggml_type type, const int64_t n, const int64_t m) {
    return zz_prefill_tile_rows(type, n, m)*n;
}

int64_t zz_prefill_tmp_x_size(const int64_t n, const int n_tokens) {
    return n*n_tokens;
}

void zz_prefill_launch(const ggml_type type, const void * w, const int64_t n, const int64_t m,
        const float * x, const int64_t x_stride, const int n_tokens, float * y, const int64_t y_stride,
        half * tmp_w, half * tmp_x, cublasHandle_t handle, cudaStream_t stream) {
#ifdef GGML_SPARSE_CUDA_NO_CUBLAS
    GGML_UNUSED(tmp_w);
    GGML_UNUSED(tmp_x);
    GGML_UNUSED(handle);
    int device;
    CUDA_CHECK(cudaGetDevice(&device));
    for (int t0 = 0; t0 < n_tokens; t0 += ZZ_GEMV_MAX_BATCH) {
        const int nt = std::min(ZZ_GEMV_MAX_BATCH, n_tokens - t0);
        const zz_gemv_config cfg = zz_gemv_get_config(device, type, n, m, nt);
        zz_gemv_launch_ex(type, w, n, m, x + t0*x_stride, x_stride, nt, nullptr, ZZ_GEMV_DENSE, y + t0*y_stride, y_stride, cfg, stream);
    }
#else
    GGML_ASSERT(n < INT32_MAX && m < INT32_MAX && y_stride < INT32_MAX);
    {
        const int  block_size = 256;
        const dim3 grid((n + block_size - 1)/block_size, n_tokens, 1);
        const ggml_cuda_kernel_launch_params params(grid, dim3(block_size, 1, 1), 0, stream);
        ggml_cuda_kernel_launch(zz_x_to_f16, params, x, x_stride, (int) n, tmp_x);
    }
    const int64_t tile  = zz_prefill_tile_rows(type, n, m);
    const float   alpha = 1.0f;
    const float   beta  = 0.0f;
    for (int64_t r0 = 0; r0 < m; r0 += tile) {
        const int64_t rows = std::min(tile, m - r0);
        zz_dequant_f16_launch(type, w, n, r0, rows, tmp_w, stream);
        // dst[r0 .. r0+rows, t] = W_tile (row-major [rows, n], i.e. column-major n x rows, transposed) * x_f16
        CUBLAS_CHECK(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N,
                (int) rows, n_tokens, (int) n,
                &alpha, tmp_w, CUDA_R_16F, (int) n,
                        tmp_x, CUDA_R_16F, (int) n,
                &beta,  y + r0, CUDA_R_32F, (int) y_stride,
                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT_TENSOR_OP));
    }
#endif // GGML_SPARSE_CUDA_NO_CUBLAS
}

// ---------------------------------------------------------------------------------------------------
// autotune

static __global__ void zz_fill_random_blocks(char * w, const int64_t nblocks, const int bs, const int d_off0,
        const int d_off1, const uint32_t seed) {
    const int64_t ib = (int64_t) blockIdx.x*blockDim.x + threadIdx.x;
    if (ib >= nblocks) {
        return;
    }
    char * blk = w + ib*bs;
    uint32_t s = seed ^ (uint32_t) (ib*2654435761u);
    for (int i = 0; i < bs; ++i) {
        s = s*1664525u + 1013904223u;
        blk[i] = (char) (s >> 24);
    }
    // valid small scales so that the arithmetic stays finite
    const half d = __float2half(0.001f + 0.001f*(float) ((s >> 8) & 0xFF)/255.0f);
    memcpy(blk + d_off0, &d, sizeof(d));
    if (d_off1 >= 0) {
        memcpy(blk + d_off1, &d, sizeof(d));
    }
}

// mean time of one GEMV a launch in a CUDA graph, us, the weights rotating over ws (copies larger than L2 together,
// as in a model where each matrix is read once per token): mode DENSE, IDX (over idx) or FUSED (threshold thr on x;
// the direct Q4_K kernel only, as decode runs it: -1 for the other types)
static float zz_time_gemv_us(const ggml_type type, const std::vector<void *> & ws, const int64_t n, const int64_t m,
        const float * x, const int n_tokens, const int32_t * idx, float * y, const zz_gemv_config cfg, cudaStream_t stream,
        const zz_gemv_mode mode, const float thr) {
    const int reps = std::max(20, 2*(int) ws.size());
    auto launch = [&](const void * w) {
        if (mode == ZZ_GEMV_FUSED) {
            return zz_gemv_launch_fused(type, w, n, m, x, n, n_tokens, thr, y, m, cfg, false, stream);
        }
        zz_gemv_launch_ex(type, w, n, m, x, n, n_tokens, mode == ZZ_GEMV_IDX ? idx : nullptr, mode, y, m, cfg, stream);
        return true;
    };

    // warm up (and catch invalid configs before capture)
    if (!launch(ws[0])) {
        return -1.0f;
    }
    CUDA_CHECK(cudaStreamSynchronize(stream));

    cudaGraph_t     graph;
    cudaGraphExec_t exec;
    CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
    for (int i = 0; i < reps; ++i) {
        launch(ws[i % ws.size()]);
    }
    CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));

    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    CUDA_CHECK(cudaGraphLaunch(exec, stream));
    CUDA_CHECK(cudaEventRecord(e0, stream));
    for (int i = 0; i < 3; ++i) {
        CUDA_CHECK(cudaGraphLaunch(exec, stream));
    }
    CUDA_CHECK(cudaEventRecord(e1, stream));
    CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));

    CUDA_CHECK(cudaEventDestroy(e0));
    CUDA_CHECK(cudaEventDestroy(e1));
    CUDA_CHECK(cudaGraphExecDestroy(exec));
    CUDA_CHECK(cudaGraphDestroy(graph));
    return 1000.0f*ms/(3*reps);
}

// what decode runs with a config, us: the sparse GEMV at the tuning sparsity (fused for Q4_K's direct kernel, else
// over a list made beforehand) plus the dense one (sparsity off)
static float zz_time_decode_us(const ggml_type type, const std::vector<void *> & ws, const int64_t n, const int64_t m,
        const float * x, const int n_tokens, const int32_t * idx, float * y, const zz_gemv_config cfg, cudaStream_t stream) {
    float sparse = zz_time_gemv_us(type, ws, n, m, x, n_tokens, idx, y, cfg, stream, ZZ_GEMV_FUSED, 1e-30f);
    if (sparse < 0.0f) {
        sparse = zz_time_gemv_us(type, ws, n, m, x, n_tokens, idx, y, cfg, stream, ZZ_GEMV_IDX, 0.0f);
    }
    return sparse + zz_time_gemv_us(type, ws, n, m, x, n_tokens, idx, y, cfg, stream, ZZ_GEMV_DENSE, 0.0f);
}

// a tune entry must beat the heuristic by this much (mean time relative to it), so that noise does not override it
#define ZZ_TUNE_MARGIN 0.98f

// one measured (shape, type, batch): its class in key (cfg: the heuristic's), every candidate's time relative to the
// heuristic's
struct zz_tune_meas {
    zz_tune_entry key;
    std::vector<std::pair<zz_gemv_config, float>> rel;
};

static bool zz_tune_same_class(const zz_tune_entry & a, const zz_tune_entry & b) {
    return a.device == b.device && a.type == b.type && a.log2_rows == b.log2_rows && a.log2_n == b.log2_n &&
           a.n_tokens == b.n_tokens;
}

static bool zz_cfg_equal(const zz_gemv_config & a, const zz_gemv_config & b) {
    return a.n1 == b.n1 && a.n2 == b.n2 && a.cluster == b.cluster;
}

// LLAMA_SPARSE_CUDA_TUNE_TYPES=q4_K,q6_K: the types the autotune times (default all four)
static bool zz_tune_type_wanted(const ggml_type type) {
    const char * env = getenv("LLAMA_SPARSE_CUDA_TUNE_TYPES");
    if (env == nullptr || *env == '\0') {
        return true;
    }
    const std::string list = std::string(",") + env + ",";
    return list.find(std::string(",") + ggml_type_name(type) + ",") != std::string::npos;
}

int ggml_cuda_zz_autotune(const int device, const int64_t * shapes_mn, const int n_shapes, const int max_tokens,
        const float sparsity, const char * path, const ggml_type * shape_types) {
    CUDA_CHECK(cudaSetDevice(device));
    const zz_device_props & props = zz_get_device_props(device);
    const std::string       fpath = zz_tune_path(path);

    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

    const ggml_type types[] = { GGML_TYPE_Q4_K, GGML_TYPE_Q6_K, GGML_TYPE_Q4_0, GGML_TYPE_Q8_0 };
    const int       max_t   = std::max(1, std::min(max_tokens, ZZ_GEMV_MAX_BATCH));

    std::vector<zz_tune_meas> measured;
    for (int is = 0; is < n_shapes; ++is) {
        const int64_t m = shapes_mn[2*is + 0];
        const int64_t n = shapes_mn[2*is + 1];

        // x with the requested fraction of zero columns, and its index list
        std::vector<float>   x_h(n*max_t);
        std::vector<int32_t> idx_h(n + 1);
        uint32_t s = 12345u + (uint32_t) is;
        int count = 0;
        for (int64_t j = 0; j < n; ++j) {
            s = s*1664525u + 1013904223u;
            const bool active = (float) (s >> 8)/16777216.0f >= sparsity;
            for (int t = 0; t < max_t; ++t) {
                s = s*1664525u + 1013904223u;
                x_h[t*n + j] = active ? (float) (s >> 8)/16777216.0f - 0.5f : 0.0f;
            }
            if (active) {
                idx_h[count++] = (int32_t) j;
            }
        }
        idx_h[n] = count;

        float   * x_d;
        int32_t * idx_d;
        float   * y_d;
        CUDA_CHECK(cudaMalloc(&x_d, n*max_t*sizeof(float)));
        CUDA_CHECK(cudaMalloc(&idx_d, (n + 1)*sizeof(int32_t)));
        CUDA_CHECK(cudaMalloc(&y_d, m*max_t*sizeof(float)));
        CUDA_CHECK(cudaMemcpy(x_d, x_h.data(), n*max_t*sizeof(float), cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemcpy(idx_d, idx_h.data(), (n + 1)*sizeof(int32_t), cudaMemcpyHostToDevice));

        for (ggml_type type : types) {
            const int64_t B = ggml_blck_size(type);
            if (m % B != 0 || (shape_types ? shape_types[is] != type : !zz_tune_type_wanted(type))) {
                continue;
            }
            const int64_t rows    = m/B;
            const int64_t nblocks = rows*n;
            const int     bs      = (int) ggml_type_size(type);
            const size_t  wbytes  = (size_t) nblocks*bs;
            int d0 = 0;
            int d1 = -1;
            if (type == GGML_TYPE_Q4_K) {
                d1 = sizeof(ggml_half);
            } else if (type == GGML_TYPE_Q6_K) {
                d0 = offsetof(block_q6_K, d);
            }
            std::vector<void *> w_d(std::max<size_t>(2, ((size_t) 256 << 20)/wbytes + 1));
            for (size_t i = 0; i < w_d.size(); ++i) {
                CUDA_CHECK(cudaMalloc(&w_d[i], wbytes));
                zz_fill_random_blocks<<<(nblocks + 255)/256, 256, 0, stream>>>((char *) w_d[i], nblocks, bs, d0, d1, 777u + (uint32_t) i);
                CUDA_CHECK(cudaGetLastError());
            }

            for (int T = 1; T <= max_t; T *= 2) { // batches 1, 2, 4, 8; lookups take the nearest smaller one
                const zz_gemv_config def    = zz_gemv_default_config(props, type, n, m, T);
                const float          def_us = zz_time_decode_us(type, w_d, n, m, x_d, T, idx_d, y_d, def, stream);
                zz_tune_meas meas;
                meas.key = { props.key, type, zz_log2_ceil(rows), zz_log2_ceil(n), T, def };
                const int n2s[] = { 2, 4, 8 };
                const int n1s[] = { 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128 };
                for (int n2 : n2s) {
                    for (int n1 : n1s) {
                        if (n1 > 1 && n/(n1*n2) < 32) {
                            break;
                        }
                        const int max_cl = props.cc_major >= 9 && n1 > 1 && n1 <= 8 ? 1 : 0;
                        for (int cl = 0; cl <= max_cl; ++cl) {
                            const zz_gemv_config cfg = { n1, n2, cl };
                            const float us = zz_time_decode_us(type, w_d, n, m, x_d, T, idx_d, y_d, cfg, stream);
                            meas.rel.push_back({ cfg, us/def_us });
                        }
                    }
                }
                std::pair<zz_gemv_config, float> best = { def, 1.0f };
                for (const auto & r : meas.rel) {
                    best = r.second < best.second ? r : best;
                }
                GGML_LOG_INFO("%s: %s %5lld x %5lld batch %d: sparse + dense %8.2f us with the default (n1 %d n2 %d), "
                        "best n1 %3d n2 %d cluster %d %8.2f us\n", __func__, ggml_type_name(type), (long long) m,
                        (long long) n, T, def_us, def.n1, def.n2, best.first.n1, best.first.n2, best.first.cluster,
                        best.second*def_us);
                measured.push_back(meas);
            }
            for (void * p : w_d) {
                CUDA_CHECK(cudaFree(p));
            }
        }
        CUDA_CHECK(cudaFree(x_d));
        CUDA_CHECK(cudaFree(idx_d));
        CUDA_CHECK(cudaFree(y_d));
    }
    CUDA_CHECK(cudaStreamDestroy(stream));

    // a class (device, type, log2 rows, log2 n, batch) may hold several measured shapes, and an entry overrides the
    // heuristic for all of them: it gets the config with the lowest mean time relative to each shape's heuristic
    // where that mean is under ZZ_TUNE_MARGIN, else 0 0 0 (the heuristic; lookups would otherwise take a smaller
    // batch's entry)
    std::vector<zz_tune_entry> found;
    std::vector<bool>          done(measured.size(), false);
    for (size_t i = 0; i < measured.size(); ++i) {
        if (done[i]) {
            continue;
        }
        std::vector<const zz_tune_meas *> cls;
        for (size_t j = i; j < measured.size(); ++j) {
            if (zz_tune_same_class(measured[i].key, measured[j].key)) {
                cls.push_back(&measured[j]);
                done[j] = true;
            }
        }
        zz_gemv_config best     = {};
        float          best_rel = ZZ_TUNE_MARGIN;
        for (const auto & cand : cls[0]->rel) {
            float sum = 0.0f;
            int   k   = 0;
            for (const zz_tune_meas * mm : cls) {
                for (const auto & r : mm->rel) {
                    if (zz_cfg_equal(r.first, cand.first)) {
                        sum += r.second;
                        ++k;
                        break;
                    }
                }
            }
            if (k == (int) cls.size() && sum/k < best_rel) {
                best_rel = sum/k;
                best     = cand.first;
            }
        }
        const zz_tune_entry & key = cls[0]->key;
        zz_tune_entry e = key;
        e.cfg = best_rel < ZZ_TUNE_MARGIN ? best : zz_gemv_config { 0, 0, 0 }; // 0 0 0: the heuristic
        found.push_back(e);
        if (best_rel < ZZ_TUNE_MARGIN) {
            GGML_LOG_INFO("%s: %s class (2^%d rows, 2^%d columns, batch %d, %zu shape(s)): n1 %d n2 %d cluster %d, %.3fx "
                    "the default's time\n", __func__, ggml_type_name(key.type), key.log2_rows, key.log2_n, key.n_tokens,
                    cls.size(), best.n1, best.n2, best.cluster, best_rel);
        } else {
            GGML_LOG_INFO("%s: %s class (2^%d rows, 2^%d columns, batch %d, %zu shape(s)): the default stays\n", __func__,
                    ggml_type_name(key.type), key.log2_rows, key.log2_n, key.n_tokens, cls.size());
        }
    }

    // batches above max_tokens were not measured: 0 0 0 for them too, so that the largest measured batch's entry
    // does not stand in
    for (size_t i = 0, n0 = found.size(); i < n0; ++i) {
        if (2*found[i].n_tokens > max_t) {
            for (int T = 2*found[i].n_tokens; T <= ZZ_GEMV_MAX_BATCH; T *= 2) {
                zz_tune_entry e = found[i];
                e.n_tokens = T;
                e.cfg      = { 0, 0, 0 };
                found.push_back(e);
            }
        }
    }

    // merge: keep entries of other devices and of shape classes not written now
    std::vector<zz_tune_entry> merged;
    for (const zz_tune_entry & old : zz_tune_read(fpath)) {
        bool replaced = false;
        for (const zz_tune_entry & e : found) {
            if (zz_tune_same_class(e, old)) {
                replaced = true;
                break;
            }
        }
        if (!replaced) {
            merged.push_back(old);
        }
    }
    merged.insert(merged.end(), found.begin(), found.end());

    FILE * f = fopen(fpath.c_str(), "w");
    if (f == nullptr) {
        GGML_LOG_ERROR("%s: cannot write %s (does its directory exist?)\n", __func__, fpath.c_str());
        return -1;
    }
    fprintf(f, "# llama-sparse zigzag GEMV launch configs, written by ggml_cuda_zz_autotune\n");
    fprintf(f, "# device type log2_rows log2_n n_tokens n1 n2 cluster\n");
    for (const zz_tune_entry & e : merged) {
        fprintf(f, "%s %s %d %d %d %d %d %d\n", e.device.c_str(), ggml_type_name(e.type), e.log2_rows, e.log2_n,
                e.n_tokens, e.cfg.n1, e.cfg.n2, e.cfg.cluster);
    }
    fclose(f);

    std::lock_guard<std::mutex> lock(zz_tune_mutex);
    zz_tune_table = merged;
    zz_tune_add_builtin(zz_tune_table, props);
    zz_tune_loaded = true;
    return (int) found.size();
}

int llama_sparse_cuda_autotune(const int device, const int64_t * shapes_mn, const int32_t * types, const int n_shapes,
        const int max_tokens, const float sparsity, const char * path) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || device < 0 || device >= count) {
        (void) cudaGetLastError();
        GGML_LOG_ERROR("%s: no CUDA device %d (%d found)\n", __func__, device, count);
        return -1;
    }
    if (shapes_mn == nullptr || n_shapes < 1 || max_tokens < 1 || !(sparsity > 0.0f && sparsity < 1.0f)) {
        GGML_LOG_ERROR("%s: want shapes, max_tokens >= 1 and 0 < sparsity < 1 (got %d shapes, %d, %g)\n", __func__,
                n_shapes, max_tokens, (double) sparsity);
        return -1;
    }
    std::vector<ggml_type> tv;
    for (int i = 0; types != nullptr && i < n_shapes; ++i) {
        const ggml_type t = (ggml_type) types[i];
        const int64_t   m = shapes_mn[2*i + 0];
        const int64_t   n = shapes_mn[2*i + 1];
        // (ggml types only: the G8 layouts are tuned as Q4_K)
        if (types[i] < 0 || types[i] >= GGML_TYPE_COUNT || !zz_type_supported(t) || m <= 0 || n <= 0 ||
                m % ggml_blck_size(t) != 0) {
            GGML_LOG_ERROR("%s: shape %d: %lld x %lld of type %d is not a zigzag GEMV this backend runs\n", __func__, i,
                    (long long) m, (long long) n, (int) types[i]);
            return -1;
        }
        tv.push_back(t);
    }
    return ggml_cuda_zz_autotune(device, shapes_mn, n_shapes, max_tokens, sparsity, path, types ? tv.data() : nullptr);
}

// ---------------------------------------------------------------------------------------------------
// Q4_0 and Q8_0 to the G8 layout (cuda/zz-g8.cuh)

// one thread a (group, column): the column's 8 blocks in src (the groups' bytes in the file's layout) to its
// super-block in dst; Q8: Q8_0, else Q4_0
template <bool Q8>
static __global__ void zz_regroup_kernel(const uint8_t * src, uint8_t * dst, const int64_t n, const int64_t groups) {
    const int64_t e = (int64_t) blockIdx.x*blockDim.x + threadIdx.x;
    if (e >= groups*n) {
        return;
    }
    const int64_t r = e/n;
    const int64_t j = e - r*n;
    if constexpr (Q8) {
        zz_g8_pack_q8(src + (r*ZZ_G8_ROWS*n + j)*ZZ_Q8_0_BYTES, n*ZZ_Q8_0_BYTES, dst + e*ZZ_G8Q8_BYTES);
    } else {
        zz_g8_pack(src + (r*ZZ_G8_ROWS*n + j)*ZZ_Q4_0_BYTES, n*ZZ_Q4_0_BYTES, dst + e*ZZ_G8_BYTES);
    }
}

bool zz_regroup(const ggml_type type, void * w, const int64_t n, const int64_t m, cudaStream_t stream) {
    GGML_ASSERT(type == GGML_TYPE_Q4_0 || type == GGML_TYPE_Q8_0);
    GGML_ASSERT(n > 0 && m > 0 && m % (ZZ_G8_ROWS*32) == 0);
    const int64_t groups      = m/(ZZ_G8_ROWS*32);
    const size_t  group_bytes = (size_t) n*(type == GGML_TYPE_Q4_0 ? ZZ_G8_BYTES : ZZ_G8Q8_BYTES);
    // groups at a time: the bytes of each are read from a copy before they are overwritten
    const int64_t chunk = std::max<int64_t>(1, std::min<int64_t>(groups, (int64_t) ((64u << 20)/group_bytes)));
    void * tmp = nullptr;
    if (cudaMalloc(&tmp, chunk*group_bytes) != cudaSuccess) {
        (void) cudaGetLastError(); // (not sticky: clear it)
        return false;
    }
    uint8_t * base = (uint8_t *) w;
    for (int64_t g0 = 0; g0 < groups; g0 += chunk) {
        const int64_t cg = std::min(chunk, groups - g0);
        CUDA_CHECK(cudaMemcpyAsync(tmp, base + g0*group_bytes, cg*group_bytes, cudaMemcpyDeviceToDevice, stream));
        const int64_t threads = cg*n;
        const dim3 grid((unsigned) ((threads + 255)/256));
        if (type == GGML_TYPE_Q4_0) {
            zz_regroup_kernel<false><<<grid, 256, 0, stream>>>((const uint8_t *) tmp, base + g0*group_bytes, n, cg);
        } else {
            zz_regroup_kernel<true><<<grid, 256, 0, stream>>>((const uint8_t *) tmp, base + g0*group_bytes, n, cg);
        }
        CUDA_CHECK(cudaGetLastError());
    }
    CUDA_CHECK(cudaStreamSynchronize(stream));
    CUDA_CHECK(cudaFree(tmp));
    return true;
}

// ---------------------------------------------------------------------------------------------------
// ggml op

#ifndef GGML_SPARSE_CUDA_STANDALONE
#include "ggml-cuda/norm.cuh"

// the device whose (non-split) buffer type buf has, else -1 (host, split or other backends' buffers)
static int zz_buffer_device(const ggml_backend_buffer_t buf) {
    if (buf == nullptr) {
        return -1;
    }
    const ggml_backend_buffer_type_t buft = ggml_backend_buffer_get_type(buf);
    for (int dev = 0; dev < ggml_backend_cuda_get_device_count(); ++dev) {
        if (buft == ggml_backend_cuda_buffer_type(dev)) {
            return dev;
        }
    }
    return -1;
}

// which zigzag types CUDA regroups when LLAMA_SPARSE_CUDA_G8 is unset: 1 = Q4_0, 2 = Q4_0 and Q8_0
#ifndef ZZ_G8_DEFAULT
#define ZZ_G8_DEFAULT 1
#endif

// ggml_sparse_zz_relayout for CUDA: Q4_0 (and Q8_0) zigzag weights in device memory whose block-rows come in whole
// groups of 8 to the G8 layout, where the direct kernel runs (sm_80+). LLAMA_SPARSE_CUDA_G8: 0 keeps the file's
// layout, 1 regroups Q4_0, 2 Q4_0 and Q8_0 (unset: ZZ_G8_DEFAULT)
static bool zz_cuda_relayout(ggml_tensor * w) {
    static const int env  = zz_env_int("LLAMA_SPARSE_CUDA_G8");
    static const int mode = env < 0 ? ZZ_G8_DEFAULT : env;
    const bool type_ok = (w->type == GGML_TYPE_Q4_0 && mode >= 1) || (w->type == GGML_TYPE_Q8_0 && mode >= 2);
    if (!type_ok || ggml_sparse_zz_layout(w) != GGML_SPARSE_ZZ_LAYOUT_ROWS ||
            w->data == nullptr || !ggml_is_contiguous(w) || w->ne[2] != 1 || w->ne[3] != 1 || w->view_src != nullptr) {
        return false;
    }
    const int dev = zz_buffer_device(w->buffer);
    const int64_t B = ggml_blck_size(w->type);
    const int64_t n = w->ne[0]/B;
    const int64_t m = w->ne[1]*B;
    if (dev < 0 || m % (ZZ_G8_ROWS*B) != 0 || m/(ZZ_G8_ROWS*B) > 65535 || n >= INT32_MAX ||
            !zz_direct_enabled(zz_get_device_props(dev).cc_major)) {
        return false;
    }
    int prev;
    CUDA_CHECK(cudaGetDevice(&prev));
    CUDA_CHECK(cudaSetDevice(dev));
    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    const bool ok = zz_regroup(w->type, w->data, n, m, stream);
    CUDA_CHECK(cudaStreamDestroy(stream));
    CUDA_CHECK(cudaSetDevice(prev));
    if (ok) {
        ggml_sparse_zz_set_layout(w, GGML_SPARSE_ZZ_LAYOUT_G256);
    } else {
        GGML_LOG_WARN("%s: no device memory to regroup %s, keeping the file's layout (slower)\n", __func__, w->name);
    }
    return ok;
}

[[maybe_unused]] static const bool zz_relayout_registered = [] {
    ggml_sparse_zz_add_relayout(zz_cuda_relayout);
    return true;
}();

// the counters a FUSED launch on a lazy list adds to: taken from the list only if this launch counts, so a launch
// that does not leaves them to another matmul of the list
static unsigned long long * zz_stats_take(const ggml_tensor * list, const ggml_type type, const int64_t n_tokens) {
    return zz_gemv_fused_counts(type, (int) n_tokens) ? sparse_idx_stats_take(list) : nullptr;
}

void ggml_cuda_op_mul_mat_zz(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const ggml_tensor * src0 = dst->src[0]; // zigzag W
    const ggml_tensor * src1 = dst->src[1]; // x
    const ggml_tensor * src2 = dst->src[2]; // active column list or NULL

    GGML_ASSERT(zz_type_supported(src0->type));
    GGML_ASSERT(ggml_is_contiguous(src0));
    GGML_ASSERT(src1->type == GGML_TYPE_F32 && dst->type == GGML_TYPE_F32);
    GGML_ASSERT(src1->nb[0] == sizeof(float) && dst->nb[0] == sizeof(float));
    GGML_ASSERT(src1->nb[1] % sizeof(float) == 0 && dst->nb[1] % sizeof(float) == 0);

    const int64_t B        = ggml_blck_size(src0->type);
    const ggml_type kt     = zz_kernel_type(src0); // (the kernels' type: Q4_0 in the G8 layout apart)
    const int64_t n        = src0->ne[0]/B;
    const int64_t m        = src0->ne[1]*B;
    const int64_t n_tokens = src1->ne[1];
    GGML_ASSERT(src1->ne[0] == n && dst->ne[0] == m && dst->ne[1] == n_tokens);
    GGML_ASSERT(src1->ne[2] == 1 && src1->ne[3] == 1);

    const float * x        = (const float *) src1->data;
    float       * y        = (float *) dst->data;
    const int64_t x_stride = src1->nb[1]/sizeof(float);
    const int64_t y_stride = dst->nb[1]/sizeof(float);
    cudaStream_t  stream   = ctx.stream();

    if (src2 != nullptr) {
        GGML_ASSERT(src2->type == GGML_TYPE_I32 && src2->ne[0] == n + 1);
        GGML_ASSERT(n_tokens <= ZZ_GEMV_MAX_BATCH);
        const zz_gemv_config cfg = zz_gemv_get_config(ctx.device, kt, n, m, (int) n_tokens);
        if (sparse_idx_cuda_lazy(src2)) {
            // the LIST op wrote nothing: the direct Q4_K kernel finds the columns itself; the other types' fused
            // mode (ldg or staged kernel: every block re-reads x from L2) only when forced and the re-reading stays under
            // LLAMA_SPARSE_CUDA_FUSE_L2_KB (default 8 MiB over the grid); otherwise build the list here
            static const int64_t l2_budget = [] {
                const char * e = getenv("LLAMA_SPARSE_CUDA_FUSE_L2_KB");
                return (int64_t) (e ? atoll(e) : 8192)*1024;
            }();
            float thr;
            memcpy(&thr, &src2->op_params[0], sizeof(float));
            const int64_t reread       = (m/B)*cfg.n1*n*n_tokens*(int64_t) sizeof(float);
            const bool    allow_staged = sparse_idx_cuda_fuse_forced() && reread <= l2_budget;
            // (the direct kernel at 2-8 tokens does not count but never declines, so the list built below counts
            // with what was taken here)
            unsigned long long * stats = zz_stats_take(src2, kt, n_tokens);
            if (zz_gemv_launch_fused(kt, src0->data, n, m, x, x_stride, (int) n_tokens, thr, y, y_stride, cfg,
                        allow_staged, stream, stats)) {
                return;
            }
            ggml_cuda_pool_alloc<int32_t> scratch(ctx.pool());
            const int64_t nscratch = sparse_idx_list_scratch_size(n, (int) n_tokens);
            if (nscratch > 0) {
                scratch.alloc(nscratch);
            }
            sparse_idx_list_launch(x, n, (int) n_tokens, x_stride, thr, (int32_t *) src2->data, scratch.get(), stream,
                    stats);
        }
        zz_gemv_launch_ex(kt, src0->data, n, m, x, x_stride, (int) n_tokens, (const int32_t *) src2->data,
                ZZ_GEMV_IDX, y, y_stride, cfg, stream);
        return;
    }

#ifndef GGML_SPARSE_CUDA_NO_CUBLAS
    if (n_tokens >= ZZ_PREFILL_MIN_BATCH) {
        ggml_cuda_pool_alloc<half> tmp_w(ctx.pool(), zz_prefill_tmp_w_size(kt, n, m));
        ggml_cuda_pool_alloc<half> tmp_x(ctx.pool(), zz_prefill_tmp_x_size(n, (int) n_tokens));
        zz_prefill_launch(kt, src0->data, n, m, x, x_stride, (int) n_tokens, y, y_stride,
                tmp_w.get(), tmp_x.get(), ctx.cublas_handle(), stream);
        return;
    }
#endif // GGML_SPARSE_CUDA_NO_CUBLAS

    for (int64_t t0 = 0; t0 < n_tokens; t0 += ZZ_GEMV_MAX_BATCH) {
        const int            nt  = (int) std::min<int64_t>(ZZ_GEMV_MAX_BATCH, n_tokens - t0);
        const zz_gemv_config cfg = zz_gemv_get_config(ctx.device, kt, n, m, nt);
        zz_gemv_launch_ex(kt, src0->data, n, m, x + t0*x_stride, x_stride, nt, nullptr, ZZ_GEMV_DENSE,
                y + t0*y_stride, y_stride, cfg, stream);
    }
}

// the GEMV mode of a matmul's column list (src2) and its threshold: none DENSE, lazy FUSED, else IDX
static zz_gemv_mode zz_list_mode(const ggml_tensor * list, float & thr) {
    thr = 0.0f;
    if (list == nullptr) {
        return ZZ_GEMV_DENSE;
    }
    memcpy(&thr, &list->op_params[0], sizeof(float));
    return sparse_idx_cuda_lazy(list) ? ZZ_GEMV_FUSED : ZZ_GEMV_IDX;
}

// ---------------------------------------------------------------------------------------------------
// Outputs that accumulate (LLAMA_SPARSE_CUDA_ACC, on by default; cuda/README.md). A launch whose output already
// holds its start value only adds into it (zz_gemv_seg::y_ready): no protocol between the blocks of a row. Two
// cases: down + residual (the gate/up launch before it reads the residual, the FFN input, as its norm's x anyway; it
// copies it into down's output, zz_gemv_norm::x_copy, and down adds W x to it) and o + residual (below).

static bool zz_fuse_rows_f32(const ggml_tensor * t, int64_t ne0, int64_t n_rows);

// LLAMA_SPARSE_CUDA_ACC, a mask: 1 down (below), 2 o (the residual carried in a private buffer, further down);
// default 3 (H100, 8-layer 7B-shaped model, tg128 at 0.50: +2.7 %, bench/results/cuda_h100_2026-11-28b.md); 0 or
// GGML_CUDA_DISABLE_FUSION turns it off
static int zz_acc_mask() {
    static const int mask = [] {
        const char * e = getenv("LLAMA_SPARSE_CUDA_ACC");
        if (!ggml_sparse_cuda_fusion_on("LLAMA_SPARSE_CUDA_ACC")) {
            return 0;
        }
        return e != nullptr ? std::max(0, atoi(e)) : 3;
    }();
    return mask;
}

static bool zz_acc_enabled() {
    return (zz_acc_mask() & 1) != 0;
}

// a gate/up launch's copy, for the down launch to take: (context, graph, the ADD whose output holds the residual)
struct zz_acc_pre {
    const ggml_backend_cuda_context * ctx;
    const ggml_cgraph               * graph;
    const ggml_tensor               * add;
};
static std::mutex              zz_acc_mutex;
static std::vector<zz_acc_pre> zz_acc_pending;

// any entry of ctx goes; with add, the new one is recorded
static void zz_acc_set(const ggml_backend_cuda_context * ctx, const ggml_cgraph * graph, const ggml_tensor * add) {
    std::lock_guard<std::mutex> lock(zz_acc_mutex);
    zz_acc_pending.erase(std::remove_if(zz_acc_pending.begin(), zz_acc_pending.end(),
                         [ctx](const zz_acc_pre & p) { return p.ctx == ctx; }), zz_acc_pending.end());
    if (add != nullptr) {
        zz_acc_pending.push_back({ ctx, graph, add });
    }
}

// whether a gate/up launch copied the residual into add's output (the entry goes either way)
static bool zz_acc_take(const ggml_backend_cuda_context * ctx, const ggml_cgraph * graph, const ggml_tensor * add) {
    bool found;
    {
        std::lock_guard<std::mutex> lock(zz_acc_mutex);
        found = std::any_of(zz_acc_pending.begin(), zz_acc_pending.end(), [&](const zz_acc_pre & p) {
            return p.ctx == ctx && p.graph == graph && p.add == add;
        });
    }
    zz_acc_set(ctx, nullptr, nullptr);
    return found;
}

// after the gate/up group dst[0..count) (last node i_last, reading the norm of x): SwiGLU of the two outputs,
// [SPARSE_IDX of it], MUL_MAT_ZZ of it, ADD of that and x, nothing else run between (views aside); the ADD or nullptr
static const ggml_tensor * zz_acc_down_add(ggml_cgraph * cgraph, const int i_last, ggml_tensor * const * dst,
        const int count, const ggml_tensor * x) {
    if (count != 2) {
        return nullptr;
    }
    // the nodes between the group's own run after its launch: views only
    auto in_group = [&](const ggml_tensor * t) { return t == dst[0] || t == dst[1]; };
    int j0 = i_last;
    for (int j = i_last; j >= 0 && j >= i_last - 64; --j) {
        j0 = in_group(cgraph->nodes[j]) ? j : j0;
    }
    for (int j = j0 + 1; j < i_last; ++j) {
        const ggml_tensor * t = cgraph->nodes[j];
        if (!in_group(t) && !ggml_is_empty(t) && !ggml_op_is_empty(t->op)) { // (as ggml_sparse_cuda_next_node skips)
            return nullptr;
        }
    }
    auto computed = [](const ggml_tensor * t) { return t != nullptr && (t->flags & GGML_TENSOR_FLAG_COMPUTE); };
    int j = i_last;
    const ggml_tensor * glu = ggml_sparse_cuda_next_node(cgraph, &j);
    if (!computed(glu) || glu->op != GGML_OP_GLU || ggml_get_glu_op(glu) != GGML_GLU_OP_SWIGLU ||
            !((glu->src[0] == dst[0] && glu->src[1] == dst[1]) || (glu->src[0] == dst[1] && glu->src[1] == dst[0]))) {
        return nullptr;
    }
    const ggml_tensor * mm = ggml_sparse_cuda_next_node(cgraph, &j);
    if (computed(mm) && mm->op == GGML_OP_SPARSE_IDX && mm->src[0] == glu) {
        mm = ggml_sparse_cuda_next_node(cgraph, &j);
    }
    if (!computed(mm) || mm->op != GGML_OP_MUL_MAT_ZZ || mm->src[1] != glu) {
        return nullptr;
    }
    const int j_mm = j;
    const ggml_tensor * add = ggml_sparse_cuda_next_node(cgraph, &j);
    // (the fused launch takes only an ADD right after the matmul)
    return computed(add) && j == j_mm + 1 && add->op == GGML_OP_ADD &&
           ((add->src[0] == mm && add->src[1] == x) || (add->src[1] == mm && add->src[0] == x)) ? add : nullptr;
}

// The residual carried to o (LLAMA_SPARSE_CUDA_ACC & 2). o's output, x + W_o a, takes memory that the q RoPE's
// output held until attention read it, so no launch before o can set it. Instead the q/k/v launch, which reads x
// for its norm, copies x into a private buffer P (per device and stream); o adds W_o a into P (y_ready) and leaves
// its ADD's output unwritten; the gate/up launch after it reads its norm's x from P and writes it out (x_copy2),
// so that every later reader finds it where the graph put it. Between o and that launch only the deferred RMS
// norm runs; anything else first gets P copied out (zz_res_drop).
static bool zz_res_enabled() {
    return (zz_acc_mask() & 2) != 0;
}

struct zz_res_pre {
    const ggml_backend_cuda_context * ctx;
    const ggml_cgraph               * graph;
    const ggml_tensor               * add;   // o's residual ADD
    float                           * p;
    int                               stage; // 0: P holds the residual x (q/k/v ran), 1: P holds add (o ran)
};
static std::vector<zz_res_pre> zz_res_pending; // at most one a context (zz_acc_mutex)

// P of the stream with room for floats (kept beside its ticket buffers), or nullptr (not made during a capture)
static float * zz_res_get(cudaStream_t stream, const size_t floats) {
    int device;
    CUDA_CHECK(cudaGetDevice(&device));
    std::lock_guard<std::mutex> lock(zz_ticket_mutex);
    const zz_ticket_buf * b = zz_stream_buf(device, stream, &zz_ticket_buf::res, &zz_ticket_buf::res_floats, floats,
                                            8*8192);
    return b ? b->res : nullptr;
}

// ctx's record, taken out (stage -1: none)
static zz_res_pre zz_res_pop(const ggml_backend_cuda_context * ctx) {
    std::lock_guard<std::mutex> lock(zz_acc_mutex);
    zz_res_pre r = { ctx, nullptr, nullptr, nullptr, -1 };
    for (size_t e = 0; e < zz_res_pending.size(); ++e) {
        if (zz_res_pending[e].ctx == ctx) {
            r = zz_res_pending[e];
            zz_res_pending.erase(zz_res_pending.begin() + e);
            break;
        }
    }
    return r;
}

static void zz_res_push(const zz_res_pre & r) {
    std::lock_guard<std::mutex> lock(zz_acc_mutex);
    zz_res_pending.push_back(r);
}

// P -> the ADD's output (T rows of ne0 floats)
static void zz_res_copy_out(const ggml_tensor * add, const float * p, cudaStream_t stream) {
    CUDA_CHECK(cudaMemcpy2DAsync(add->data, add->nb[1], p, add->ne[0]*sizeof(float), add->ne[0]*sizeof(float),
                                 add->ne[1], cudaMemcpyDeviceToDevice, stream));
}

// a record taken out for good: what o left in P (stage 1, this graph) is written out to its ADD's output
static void zz_res_drop(ggml_backend_cuda_context & ctx, const ggml_cgraph * cgraph, const zz_res_pre & r) {
    if (r.stage == 1 && r.graph == cgraph) {
        zz_res_copy_out(r.add, r.p, ctx.stream());
    }
}

// o's output still in P, read by this RMS norm
static bool zz_res_for_norm(const zz_res_pre & r, const ggml_cgraph * cgraph, const ggml_tensor * rms) {
    return r.stage == 1 && r.graph == cgraph && rms->op == GGML_OP_RMS_NORM && rms->src[0] == r.add;
}

void ggml_cuda_zz_res_node(ggml_backend_cuda_context & ctx, const ggml_cgraph * cgraph, const ggml_tensor * node) {
    if (!zz_res_enabled()) {
        return;
    }
    // a stage 0 record waits for o's MUL_MAT_ZZ, and goes at any RMS norm (a later layer's q/k/v may not run as a
    // group, and its o must not take an earlier token's or layer's x); a stage 1 record waits for the RMS norm of
    // o's output, which takes it (ggml_cuda_zz_norm_defer)
    const zz_res_pre r = zz_res_pop(&ctx);
    if ((r.stage == 0 && r.graph == cgraph && node->op != GGML_OP_RMS_NORM) || zz_res_for_norm(r, cgraph, node)) {
        zz_res_push(r);
    } else {
        zz_res_drop(ctx, cgraph, r);
    }
}

// after q/k/v's group (last node i_last, reading the norm of x): o's residual ADD, with the matmul right before it,
// the RMS norm of it the next node run, and nothing between that writes x; or nullptr
static const ggml_tensor * zz_res_o_add(ggml_cgraph * cgraph, const int i_last, const ggml_tensor * x) {
    const int n_nodes = ggml_graph_n_nodes(cgraph);
    for (int j = i_last + 1; j < n_nodes && j <= i_last + 128; ++j) {
        const ggml_tensor * t = ggml_graph_node(cgraph, j);
        if (t->op == GGML_OP_ADD && (t->src[0] == x || t->src[1] == x)) {
            const ggml_tensor * mm = t->src[0] == x ? t->src[1] : t->src[0];
            if (mm == ggml_graph_node(cgraph, j - 1) && mm->op == GGML_OP_MUL_MAT_ZZ &&
                    (t->flags & GGML_TENSOR_FLAG_COMPUTE) && zz_fuse_rows_f32(t, x->ne[0], x->ne[1]) &&
                    zz_fuse_rows_f32(x, x->ne[0], x->ne[1])) {
                int k = j;
                const ggml_tensor * rms = ggml_sparse_cuda_next_node(cgraph, &k);
                return rms != nullptr && rms->op == GGML_OP_RMS_NORM && rms->src[0] == t ? t : nullptr;
            }
            return nullptr;
        }
        if (!ggml_op_is_empty(t->op) && ggml_sparse_mem_overlaps(t, x)) {
            return nullptr; // (x written on the way)
        }
    }
    return nullptr;
}

bool ggml_cuda_op_mul_mat_zz_group(ggml_backend_cuda_context & ctx, ggml_tensor * const * dst, const int count,
        const zz_norm_defer * norm, ggml_cgraph * cgraph, const int i_last) {
    zz_acc_set(&ctx, nullptr, nullptr); // (an earlier launch's copy that no down launch took is stale)
    zz_res_drop(ctx, cgraph, zz_res_pop(&ctx)); // (so is a residual no o launch took)
    if (count < 2 || count > ZZ_GROUP_MAX) {
        return false;
    }
    const ggml_tensor * a    = dst[0];
    const ggml_tensor * src1 = a->src[1];
    const ggml_tensor * src2 = a->src[2];
    const ggml_type     type = zz_kernel_type(a->src[0]); // (the kernels' type)
    const int64_t       B        = ggml_blck_size(a->src[0]->type);
    const int64_t       n        = a->src[0]->ne[0]/B;
    const int64_t       n_tokens = src1->ne[1];
    // (Q4_0 in the G8 layout: the norm folded in up to ZZ_G8_IN_MAX_T)
    if (!zz_direct_type(type) || (norm != nullptr && !zz_in_ok(type, n_tokens)) || n_tokens > ZZ_GEMV_MAX_BATCH) {
        return false;
    }
    zz_gemv_seg seg[ZZ_GROUP_MAX];
    int64_t     m_sum = 0;
    for (int s = 0; s < count; ++s) {
        const ggml_tensor * d = dst[s];
        // (same op, x, idx, weight type and width: ggml_sparse_zz_siblings)
        GGML_ASSERT(d->op == GGML_OP_MUL_MAT_ZZ && d->src[1] == src1 && d->src[2] == src2 && d->src[0]->type == a->src[0]->type &&
                    d->src[0]->ne[0] == a->src[0]->ne[0]);
        if (ggml_is_empty(d) || !ggml_is_contiguous(d->src[0]) || zz_kernel_type(d->src[0]) != type || d->type != GGML_TYPE_F32 ||
                d->nb[0] != sizeof(float) || d->nb[1] % sizeof(float) != 0) {
            return false;
        }
        if (norm != nullptr && (ggml_sparse_mem_overlaps(d, norm->x()) || ggml_sparse_mem_overlaps(d, norm->w()))) {
            return false;
        }
        seg[s] = { d->src[0]->data, d->src[0]->ne[1]*B, (float *) d->data, (int64_t) (d->nb[1]/sizeof(float)) };
        m_sum += seg[s].m;
    }
    GGML_ASSERT(norm == nullptr || norm->mul == src1);
    const ggml_tensor *  xt       = norm ? norm->x() : src1;
    // (x_alt: o left x in P, this launch writes it out)
    const float *        x        = norm && norm->x_alt ? norm->x_alt : (const float *) xt->data;
    const int64_t        x_stride = norm && norm->x_alt ? xt->ne[0] : (int64_t) (xt->nb[1]/sizeof(float));
    zz_gemv_norm         nrm      = norm ? norm->params() : zz_gemv_norm{};
    const zz_gemv_config cfg      = zz_gemv_get_config(ctx.device, type, n, m_sum, (int) n_tokens);
    float              thr;
    const zz_gemv_mode mode = zz_list_mode(src2, thr);
    // outputs that accumulate: the residual x copied into the output of the down + residual launch after this one,
    // where that output overlaps nothing this launch reads or writes
    const ggml_tensor * acc_add = nullptr;
    if (zz_acc_enabled() && norm != nullptr && cgraph != nullptr && mode != ZZ_GEMV_IDX) {
        acc_add = zz_acc_down_add(cgraph, i_last, dst, count, xt);
        if (acc_add != nullptr && (!zz_fuse_rows_f32(acc_add, n, n_tokens) || !zz_fuse_rows_f32(xt, n, n_tokens) ||
                    ggml_sparse_mem_overlaps(acc_add, xt) || ggml_sparse_mem_overlaps(acc_add, norm->w()) ||
                    ggml_sparse_mem_overlaps(acc_add, dst[0]) || ggml_sparse_mem_overlaps(acc_add, dst[1]))) {
            acc_add = nullptr;
        }
        if (acc_add != nullptr && norm->x_alt != nullptr && acc_add->nb[1] != xt->nb[1]) {
            acc_add = nullptr; // (x_copy and x_copy2 share a stride)
        }
        if (acc_add != nullptr) {
            nrm.x_copy        = (float *) acc_add->data;
            nrm.x_copy_stride = (int64_t) (acc_add->nb[1]/sizeof(float));
        }
    }
    if (norm != nullptr && norm->x_alt != nullptr) {
        if (nrm.x_copy == nullptr) {
            nrm.x_copy        = (float *) xt->data;
            nrm.x_copy_stride = (int64_t) (xt->nb[1]/sizeof(float));
        } else {
            nrm.x_copy2 = (float *) xt->data;
        }
    }
    // the residual carried to o: x copied into P for o's launch to add into
    const ggml_tensor * res_add = nullptr;
    float *             res_p   = nullptr;
    if (zz_res_enabled() && norm != nullptr && norm->x_alt == nullptr && nrm.x_copy == nullptr && cgraph != nullptr &&
            mode != ZZ_GEMV_IDX) {
        res_add = zz_res_o_add(cgraph, i_last, xt);
        res_p   = res_add ? zz_res_get(ctx.stream(), (size_t) (xt->ne[0]*n_tokens)) : nullptr;
        if (res_p != nullptr) {
            nrm.x_copy        = res_p;
            nrm.x_copy_stride = xt->ne[0];
        }
    }
    unsigned long long * stats = mode == ZZ_GEMV_FUSED ? zz_stats_take(src2, type, n_tokens) : nullptr;
    const bool ran = zz_gemv_launch_group(type, seg, count, n, x, x_stride, (int) n_tokens,
            mode == ZZ_GEMV_IDX ? (const int32_t *) src2->data : nullptr, mode, thr, cfg, ctx.stream(),
            norm ? &nrm : nullptr, stats);
    if (!ran) {
        sparse_idx_stats_give_back(src2, stats);
    }
    zz_acc_set(&ctx, cgraph, ran ? acc_add : nullptr);
    if (ran && res_p != nullptr) {
        zz_res_push({ &ctx, cgraph, res_add, res_p, 0 });
        static std::atomic<bool> logged{false};
        if (!logged.exchange(true)) {
            GGML_LOG_INFO("llama-sparse: CUDA outputs that accumulate: the q/k/v launch carries the residual to o's "
                          "launch in a private buffer (first: %s; LLAMA_SPARSE_CUDA_ACC=0 turns it off)\n", res_add->name);
        }
    }
    if (ran && acc_add != nullptr) {
        static std::atomic<bool> logged{false};
        if (!logged.exchange(true)) {
            GGML_LOG_INFO("llama-sparse: CUDA outputs that accumulate: the gate/up launch copies the residual into "
                          "down's output (first: %s; LLAMA_SPARSE_CUDA_ACC=0 turns it off)\n", acc_add->name);
        }
    }
    return ran;
}

static bool zz_fuse_enabled() {
    static const bool on = ggml_sparse_cuda_fusion_on("LLAMA_SPARSE_CUDA_FUSE_OPS");
    return on;
}

// an f32 matrix of rows of ne0 contiguous floats, n_rows rows
static bool zz_fuse_rows_f32(const ggml_tensor * t, const int64_t ne0, const int64_t n_rows) {
    return t->type == GGML_TYPE_F32 && t->ne[0] == ne0 && t->ne[1] == n_rows && t->ne[2] == 1 && t->ne[3] == 1 &&
           t->nb[0] == sizeof(float) && t->nb[1] % sizeof(float) == 0;
}

static bool zz_fuse_node_ok(const ggml_cgraph * cgraph, const int j, const int n_uses) {
    return (cgraph->nodes[j]->flags & GGML_TENSOR_FLAG_COMPUTE) && ggml_node_has_n_uses(cgraph, j, n_uses);
}

int ggml_cuda_op_mul_mat_zz_fuse(ggml_backend_cuda_context & ctx, const ggml_cgraph * cgraph, const int i,
        const zz_norm_defer * norm) {
    if (!zz_fuse_enabled() && norm == nullptr) {
        return 0;
    }
    const int n_nodes = cgraph->n_nodes;
    int k = i;
    const ggml_tensor * glu = nullptr;
    const ggml_tensor * idx = nullptr;
    if (cgraph->nodes[k]->op == GGML_OP_GLU) {
        glu = cgraph->nodes[k++];
        if (k < n_nodes && cgraph->nodes[k]->op == GGML_OP_SPARSE_IDX && cgraph->nodes[k]->src[0] == glu) {
            idx = cgraph->nodes[k++];
        }
    }
    if (k >= n_nodes || cgraph->nodes[k]->op != GGML_OP_MUL_MAT_ZZ) {
        return 0;
    }
    const int           i_mm = k;
    const ggml_tensor * mm   = cgraph->nodes[i_mm];
    const ggml_tensor * w    = mm->src[0];
    const ggml_tensor * x    = mm->src[1];
    const ggml_tensor * list = mm->src[2];
    const ggml_type     kt       = zz_kernel_type(w); // (Q4_0 in the G8 layout apart)
    const int64_t       B        = ggml_blck_size(w->type);
    const int64_t       n        = w->ne[0]/B;
    const int64_t       m        = w->ne[1]*B;
    const int64_t       n_tokens = x->ne[1];

    // the matmul: what the direct Q4_K kernel runs (decode batches; G8 reads a SwiGLU or a norm up to ZZ_G8_IN_MAX_T)
    if (!(mm->flags & GGML_TENSOR_FLAG_COMPUTE) || !zz_direct_type(kt) || !zz_get_caps().direct ||
            ((glu != nullptr || norm != nullptr) && !zz_in_ok(kt, n_tokens)) ||
            !ggml_is_contiguous(w) || w->ne[2] != 1 || w->ne[3] != 1 || w->ne[1] > 65535 || n_tokens < 1 ||
            n_tokens > ZZ_GEMV_MAX_BATCH ||
            !zz_fuse_rows_f32(x, n, n_tokens) || !zz_fuse_rows_f32(mm, m, n_tokens)) {
        return 0;
    }
    if (list != nullptr && (list->type != GGML_TYPE_I32 || list->ne[0] != n + 1)) {
        return 0;
    }
    float              thr;
    const zz_gemv_mode mode = zz_list_mode(list, thr);

    // the SwiGLU that makes x: split (gate, up) or one tensor of both halves
    const float * gate      = nullptr;
    const float * up        = nullptr;
    int64_t       g_stride  = 0;
    int64_t       up_stride = 0;
    if (glu != nullptr) {
        const ggml_tensor * a = glu->src[0];
        const ggml_tensor * b = glu->src[1];
        const bool fits = x == glu && ggml_get_glu_op(glu) == GGML_GLU_OP_SWIGLU &&
                          zz_fuse_rows_f32(glu, n, n_tokens) &&
                          (idx == nullptr ? list == nullptr : list == idx && mode == ZZ_GEMV_FUSED) &&
                          zz_fuse_node_ok(cgraph, i, idx ? 2 : 1) && (idx == nullptr || zz_fuse_node_ok(cgraph, i + 1, 1));
        if (!fits) {
            return 0;
        }
        if (b != nullptr) {
            if (!zz_fuse_rows_f32(a, n, n_tokens) || !zz_fuse_rows_f32(b, n, n_tokens)) {
                return 0;
            }
            gate = (const float *) a->data; g_stride  = a->nb[1]/sizeof(float); // (split: no swap, as ggml-cuda)
            up   = (const float *) b->data; up_stride = b->nb[1]/sizeof(float);
        } else {
            if (!zz_fuse_rows_f32(a, 2*n, n_tokens)) {
                return 0;
            }
            const bool swapped = ggml_get_op_params_i32(glu, 1) != 0;
            gate = (const float *) a->data + (swapped ? n : 0); g_stride  = a->nb[1]/sizeof(float);
            up   = (const float *) a->data + (swapped ? 0 : n); up_stride = g_stride;
        }
    }

    // a deferred RMS norm: x is its MUL, read as the norm's input (ggml_cuda_zz_norm_defer; node i is the matmul)
    if (norm != nullptr && (norm->mul != x || mode == ZZ_GEMV_IDX)) {
        return 0;
    }
    if (norm != nullptr && norm->x_alt != nullptr) {
        zz_res_copy_out(norm->x(), norm->x_alt, ctx.stream()); // (one launch reads x where the graph has it)
    }

    // the residual add after it
    const ggml_tensor * add  = nullptr;
    const ggml_tensor * bias = nullptr;
    if (zz_fuse_enabled() && i_mm + 1 < n_nodes && cgraph->nodes[i_mm + 1]->op == GGML_OP_ADD) {
        const ggml_tensor * a = cgraph->nodes[i_mm + 1];
        const ggml_tensor * r = a->src[0] == mm ? a->src[1] : a->src[1] == mm ? a->src[0] : nullptr;
        if (r != nullptr && r != mm && zz_fuse_rows_f32(a, m, n_tokens) && zz_fuse_rows_f32(r, m, n_tokens) &&
                zz_fuse_node_ok(cgraph, i_mm, 1) && (a->flags & GGML_TENSOR_FLAG_COMPUTE)) {
            add  = a;
            bias = r;
        }
    }
    if (glu == nullptr && add == nullptr && norm == nullptr) {
        return 0;
    }

    // the output may not overlap what the launch reads, except a bias that is the output itself (in place)
    const ggml_tensor * out = add ? add : mm;
    const ggml_tensor * reads[5] = { w, glu ? glu->src[0] : norm ? norm->x() : x, glu ? glu->src[1] : nullptr,
                                     mode == ZZ_GEMV_IDX ? list : nullptr, norm ? norm->w() : nullptr };
    for (const ggml_tensor * t : reads) {
        if (ggml_sparse_mem_overlaps(out, t)) {
            return 0;
        }
    }
    if (ggml_sparse_mem_overlaps(out, bias) && (bias->data != out->data || bias->nb[1] != out->nb[1])) {
        return 0;
    }

    // (idx: the LIST op between the GLU and the matmul, which this launch runs in its place, so it counts for it)
    zz_gemv_seg seg = { w->data, m, (float *) out->data, (int64_t) (out->nb[1]/sizeof(float)) };
    // o's launch with the residual carried in P: the record q/k/v left for this ADD (zz_res_o_add checked the graph)
    zz_res_pre res = { &ctx, nullptr, nullptr, nullptr, -1 };
    if (zz_res_enabled() && add != nullptr && glu == nullptr && norm == nullptr && mode != ZZ_GEMV_IDX) {
        res = zz_res_pop(&ctx);
        if (res.stage != 0 || res.graph != cgraph || res.add != add) {
            if (res.stage >= 0) {
                zz_res_push(res); // (not this launch's)
            }
            res.stage = -1;
        }
    }
    // (taken only with the ADD the gate/up launch checked; without a SwiGLU this is not its down launch)
    if (zz_acc_take(&ctx, cgraph, add) && glu != nullptr) {
        seg.y_ready = 1; // the gate/up launch put the residual there: add W x to it
    } else if (res.stage == 0) {
        seg.y        = res.p; // (P holds the residual: add W x to it, the ADD's output stays unwritten)
        seg.y_stride = m;
        seg.y_ready  = 1;
    } else if (bias != nullptr) {
        seg.bias        = (const float *) bias->data;
        seg.bias_stride = (int64_t) (bias->nb[1]/sizeof(float));
    }
    const ggml_tensor * xt = norm ? norm->x() : x;
    const float * xin      = glu ? gate : (const float *) xt->data;
    const int64_t x_stride = glu ? g_stride : (int64_t) (xt->nb[1]/sizeof(float));
    const zz_gemv_norm   nrm = norm ? norm->params() : zz_gemv_norm{};
    const zz_gemv_config cfg = zz_gemv_get_config(ctx.device, kt, n, m, (int) n_tokens);
    zz_gemv_launch_thr(kt, &seg, 1, n, xin, x_stride, (int) n_tokens,
            mode == ZZ_GEMV_IDX ? (const int32_t *) list->data : nullptr, mode, cfg, zz_get_caps(), thr, ctx.stream(),
            up, up_stride, norm ? &nrm : nullptr,
            mode != ZZ_GEMV_FUSED || !zz_gemv_fused_counts(kt, (int) n_tokens) ? nullptr :
            idx != nullptr ? sparse_idx_stats_dev(idx) : sparse_idx_stats_take(list));
    if (res.stage == 0) {
        res.stage = 1;
        zz_res_push(res);
    }

    static std::atomic<bool> logged{false};
    if ((glu || add) && !logged.exchange(true)) {
        GGML_LOG_INFO("llama-sparse: CUDA fuses SwiGLU inputs and residual adds into zigzag GEMVs (first: %s; "
                      "LLAMA_SPARSE_CUDA_FUSE_OPS=0 turns it off)\n", mm->name);
    }
    return (add ? i_mm + 2 : i_mm + 1) - i;
}

// ---------------------------------------------------------------------------------------------------
// RMS norm folded into the GEMVs that read it

// on by default (H100 tg128, 7B shapes at 0.50: 1.47-1.49x stock against 1.41-1.42x without it,
// cuda_h100_2026-11-27d.md); LLAMA_SPARSE_CUDA_NORM_FUSE=0 or GGML_CUDA_DISABLE_FUSION turns it off
static bool zz_norm_fuse_enabled() {
    static const bool on = [] {
        const char * e = getenv("LLAMA_SPARSE_CUDA_NORM_FUSE");
        return (e == nullptr || atoi(e) != 0) && ggml_sparse_cuda_fusion_on("LLAMA_SPARSE_CUDA_NORM_FUSE");
    }();
    return on;
}

static std::mutex                 zz_norm_mutex;
static std::vector<zz_norm_defer> zz_norm_pending; // at most one a context: recorded at the norm, taken a few nodes on

// the entry of ctx, if any (caller holds zz_norm_mutex)
static std::vector<zz_norm_defer>::iterator zz_norm_find(const ggml_backend_cuda_context * ctx) {
    return std::find_if(zz_norm_pending.begin(), zz_norm_pending.end(),
                        [ctx](const zz_norm_defer & d) { return d.ctx == ctx; });
}

static int zz_norm_defer_impl(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, const int i);

int ggml_cuda_zz_norm_defer(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, const int i) {
    const int n_left = zz_norm_defer_impl(ctx, cgraph, i);
    if (!zz_res_enabled()) {
        return n_left;
    }
    // o's output still in P: the launch that takes this norm reads it there, else it is written out now
    const zz_res_pre r = zz_res_pop(&ctx);
    if (n_left > 0 && zz_res_for_norm(r, cgraph, ggml_graph_node(cgraph, i))) {
        std::lock_guard<std::mutex> lock(zz_norm_mutex);
        auto it = zz_norm_find(&ctx);
        GGML_ASSERT(it != zz_norm_pending.end() && it->rms == ggml_graph_node(cgraph, i));
        it->x_alt = r.p;
    } else {
        zz_res_drop(ctx, cgraph, r);
    }
    return n_left;
}

static int zz_norm_defer_impl(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, const int i) {
    if (!zz_norm_fuse_enabled()) {
        return 0; // (then nothing is ever recorded)
    }
    {
        std::lock_guard<std::mutex> lock(zz_norm_mutex);
        auto it = zz_norm_find(&ctx);
        if (it != zz_norm_pending.end()) { // left by a run that stopped before its matmul: stale
            zz_norm_pending.erase(it);
        }
    }
    if (!zz_get_caps().direct) {
        return 0;
    }
    ggml_tensor * rms = ggml_graph_node(cgraph, i);
    const ggml_tensor * x = rms->src[0];
    if (rms->op != GGML_OP_RMS_NORM || rms->type != GGML_TYPE_F32 || !zz_fuse_node_ok(cgraph, i, 1) ||
            x->ne[1] < 1 || x->ne[1] > ZZ_GEMV_MAX_BATCH || !zz_fuse_rows_f32(x, x->ne[0], x->ne[1]) ||
            !zz_fuse_rows_f32(rms, x->ne[0], x->ne[1]) || x->ne[0] >= INT32_MAX) {
        return 0;
    }
    const int64_t n        = x->ne[0];
    const int64_t n_tokens = x->ne[1];

    // MUL by the norm weight, a vector of n
    int j = i;
    ggml_tensor * mul = ggml_sparse_cuda_next_node(cgraph, &j);
    if (mul == nullptr || mul->op != GGML_OP_MUL || !(mul->flags & GGML_TENSOR_FLAG_COMPUTE) ||
            (mul->src[0] != rms && mul->src[1] != rms) || !zz_fuse_rows_f32(mul, n, n_tokens)) {
        return 0;
    }
    const ggml_tensor * w = mul->src[0] == rms ? mul->src[1] : mul->src[0];
    if (w == rms || w->type != GGML_TYPE_F32 || w->ne[0] != n || ggml_nelements(w) != n || !ggml_is_contiguous(w)) {
        return 0;
    }

    // then nothing but lazy column lists of it before the first matmul reading it
    int k = j, n_idx = 0;
    ggml_tensor * mm = ggml_sparse_cuda_next_node(cgraph, &k);
    while (mm != nullptr && mm->op == GGML_OP_SPARSE_IDX && mm->src[0] == mul && sparse_idx_cuda_lazy(mm)) {
        n_idx++;
        mm = ggml_sparse_cuda_next_node(cgraph, &k);
    }
    if (mm == nullptr || mm->op != GGML_OP_MUL_MAT_ZZ || mm->src[1] != mul || !(mm->flags & GGML_TENSOR_FLAG_COMPUTE) ||
            !zz_in_ok(zz_kernel_type(mm->src[0]), n_tokens)) {
        return 0;
    }
    float thr;
    if (mm->src[2] != nullptr && (mm->src[2]->src[0] != mul || zz_list_mode(mm->src[2], thr) != ZZ_GEMV_FUSED)) {
        return 0;
    }
    // every other reader of it is a sibling of that matmul: run in its launch (one matmul without grouping)
    int nodes[ZZ_GROUP_MAX];
    const int count = ggml_cuda_zz_group_enabled() ? ggml_sparse_zz_siblings(cgraph, k, 32, nodes, ZZ_GROUP_MAX) : 1;
    if (count < 1 || !ggml_node_has_n_uses(cgraph, j, n_idx + count)) {
        return 0;
    }

    std::lock_guard<std::mutex> lock(zz_norm_mutex);
    zz_norm_pending.push_back({ &ctx, cgraph, k, rms, mul });
    static bool logged = false;
    if (!logged) {
        logged = true;
        GGML_LOG_INFO("llama-sparse: CUDA folds RMS norms into the zigzag GEMVs that read them (first: %s; "
                      "LLAMA_SPARSE_CUDA_NORM_FUSE=0 turns it off)\n", rms->name);
    }
    return j - i + 1;
}

bool ggml_cuda_zz_norm_take(ggml_backend_cuda_context & ctx, const ggml_cgraph * cgraph, const int i,
        zz_norm_defer & out) {
    if (!zz_norm_fuse_enabled()) {
        return false;
    }
    std::lock_guard<std::mutex> lock(zz_norm_mutex);
    auto it = zz_norm_find(&ctx);
    if (it == zz_norm_pending.end() || it->graph != cgraph || it->i_mm != i) {
        return false;
    }
    out = *it;
    zz_norm_pending.erase(it);
    return true;
}

void ggml_cuda_zz_norm_run(ggml_backend_cuda_context & ctx, const zz_norm_defer & nd) {
    if (nd.x_alt != nullptr) {
        zz_res_copy_out(nd.x(), nd.x_alt, ctx.stream()); // (o's output, still in P)
    }
    ggml_cuda_op_rms_norm_fused(ctx, nd.rms, nd.mul); // upstream's kernel: writes the MUL's output
}
#endif // GGML_SPARSE_CUDA_STANDALONE
