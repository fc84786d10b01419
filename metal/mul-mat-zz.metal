// llama-sparse: GGML_OP_MUL_MAT_ZZ on Apple GPUs: y = W x for a zigzag weight W (docs/format.md).
//
// Decode GEMV (nt <= 8 tokens, function constant FC_ZZ_NT), dense or over the active-column list of
// GGML_OP_SPARSE_IDX (LIST): the grid is (n1, block-rows). For block-row r the n1 threadgroups of nsg
// simdgroups split the active columns evenly (the list is the load balancing, whatever the pattern of
// zeros: paper default nsg = 2). A simdgroup walks its columns in steps: a block of B outputs is spread
// over ZZ_LPC lanes (32 for Q4_K/Q6_K, 8 for Q8_0, 4 for Q4_0, so one step covers 1, 4 or 8 columns and
// the lanes of a step read neighbouring bytes). Each lane accumulates its outputs for every token in
// registers; at the end the column groups of a simdgroup are summed with simd_shuffle_xor, the simdgroups
// through threadgroup memory, and the n1 threadgroups either write dst directly (n1 = 1) or write
// partials that kernel_mul_mv_zz_reduce adds up (one cross-threadgroup reduction, deterministic).
//
// Prefill (more than 8 tokens): kernel_zz_dequant_f16 expands block-rows of W into an f16 row-major tile
// that ggml-metal's own kernel_mul_mm_f16_f32 multiplies (metal/ggml-sparse-metal.cpp).
//
// Self-contained (only <metal_stdlib>): ggml-metal's embed step prepends kernels/common.h, so every name
// here carries a zz prefix.
#include <metal_stdlib>

using namespace metal;

#define FC_ZZ_NT 0

// tokens of the decode GEMV, 1..8; a function constant so the accumulator loops unroll into registers
constant short FC_zz_nt [[function_constant(FC_ZZ_NT)]];

// keep in sync with metal/ggml-sparse-metal.cpp
typedef struct {
    int32_t  n;       // input columns = blocks per block-row
    int32_t  nr;      // block-rows
    uint64_t nb01;    // bytes between block-rows of W
    uint64_t nb11;    // bytes between tokens of x
    uint64_t nb1;     // bytes between tokens of the output
    uint64_t nbp;     // bytes between the partial outputs of the n1 threadgroups (0: n1 == 1, dst itself)
    int32_t  has_idx; // 1: src2 is the active-column list (count at idx[n])
    int32_t  pad;
} ggml_sparse_metal_kargs_zz;

typedef struct {
    int32_t  m;       // outputs
    int32_t  nt;      // tokens
    int32_t  n1;      // partials per output
    int32_t  pad;
    uint64_t nb1;     // bytes between tokens of dst
    uint64_t nbp;     // bytes between partials
    uint64_t nbpt;    // bytes between tokens inside one partial
} ggml_sparse_metal_kargs_zz_reduce;

typedef struct {
    int32_t  n;       // input columns
    int32_t  r0;      // first block-row of the tile
    int32_t  nrows;   // block-rows in the tile
    int32_t  pad;
    uint64_t nb01;    // bytes between block-rows of W
} ggml_sparse_metal_kargs_zz_dequant;

// ggml's block layouts (ggml-common.h), under our own names
typedef struct { half d; half dmin; uchar scales[12]; uchar qs[128]; }  zz_block_q4_K;
typedef struct { uchar ql[128]; uchar qh[64]; char scales[16]; half d; } zz_block_q6_K;
typedef struct { half d; char qs[32]; }  zz_block_q8_0;
typedef struct { half d; uchar qs[16]; } zz_block_q4_0;

//
// per type: lanes per column (LPC) and, for lane `sub` of a column, its OPL weights and their output rows;
// every dequantization matches ggml's dequantize_row_* (and ggml-sparse-cpu.c's reference)
//

struct zz_q4_K {
    typedef zz_block_q4_K block;
    enum { B = 256, LPC = 32, OPL = 8 };

    // lane sub: quant bytes 32g + 4q .. +3 (g = sub/8, q = sub%8): low nibbles are rows 64g + 4q + i,
    // high nibbles rows 64g + 32 + 4q + i, with scale/min pairs 2g and 2g + 1
    static inline short row(short sub, short i) {
        return 64*(sub >> 3) + 4*(sub & 7) + (i & 3) + (i >= 4 ? 32 : 0);
    }

    static inline void dequant(device const block * b, short sub, thread float * w) {
        const short g = sub >> 3;
        const short q = sub & 7;
        device const uchar * s = b->scales;
        const short j0 = 2*g;
        const short j1 = 2*g + 1;
        uchar sc0, m0, sc1, m1;
        if (g < 2) {
            sc0 = s[j0] & 63; m0 = s[j0 + 4] & 63;
            sc1 = s[j1] & 63; m1 = s[j1 + 4] & 63;
        } else {
            sc0 = (s[j0 + 4] & 0xF) | ((s[j0 - 4] >> 6) << 4); m0 = (s[j0 + 4] >> 4) | ((s[j0] >> 6) << 4);
            sc1 = (s[j1 + 4] & 0xF) | ((s[j1 - 4] >> 6) << 4); m1 = (s[j1 + 4] >> 4) | ((s[j1] >> 6) << 4);
        }
        const float d    = (float) b->d;
        const float dmin = (float) b->dmin;
        const float d0 = d*sc0, mm0 = dmin*m0;
        const float d1 = d*sc1, mm1 = dmin*m1;
        const uint qv = *((device const uint *) (b->qs + 32*g + 4*q));
        for (short i = 0; i < 4; ++i) {
            const uint byte = (qv >> (8*i)) & 0xFF;
            w[i]     = d0*(byte & 0xF) - mm0;
            w[i + 4] = d1*(byte >>  4) - mm1;
        }
    }
};

struct zz_q6_K {
    typedef zz_block_q6_K block;
    enum { B = 256, LPC = 32, OPL = 8 };

    // lane sub: half h = sub/16 of the block, positions l = 2*(sub%16) + e (e = 0, 1); weight 4e + u is
    // row 128h + l + 32u
    static inline short row(short sub, short i) {
        return 128*(sub >> 4) + 2*(sub & 15) + (i >> 2) + 32*(i & 3);
    }

    static inline void dequant(device const block * b, short sub, thread float * w) {
        const short h  = sub >> 4;
        const short l0 = 2*(sub & 15);
        const short is = l0/16;
        device const uchar * ql = b->ql + 64*h;
        device const uchar * qh = b->qh + 32*h;
        device const char  * sc = b->scales + 8*h;
        const float d = (float) b->d;
        const float s0 = d*sc[is + 0], s1 = d*sc[is + 2], s2 = d*sc[is + 4], s3 = d*sc[is + 6];
        for (short e = 0; e < 2; ++e) {
            const short l = l0 + e;
            const int a  = ql[l];
            const int c  = ql[l + 32];
            const int hb = qh[l];
            w[4*e + 0] = s0*(((a & 0xF) | (((hb >> 0) & 3) << 4)) - 32);
            w[4*e + 1] = s1*(((c & 0xF) | (((hb >> 2) & 3) << 4)) - 32);
            w[4*e + 2] = s2*(((a >>  4) | (((hb >> 4) & 3) << 4)) - 32);
            w[4*e + 3] = s3*(((c >>  4) | (((hb >> 6) & 3) << 4)) - 32);
        }
    }
};

struct zz_q8_0 {
    typedef zz_block_q8_0 block;
    enum { B = 32, LPC = 8, OPL = 4 };

    static inline short row(short sub, short i) {
        return 4*sub + i;
    }

    static inline void dequant(device const block * b, short sub, thread float * w) {
        const float d = (float) b->d;
        for (short i = 0; i < 4; ++i) {
            w[i] = d*b->qs[4*sub + i];
        }
    }
};

struct zz_q4_0 {
    typedef zz_block_q4_0 block;
    enum { B = 32, LPC = 4, OPL = 8 };

    // lane sub: quant bytes 4sub .. +3: low nibbles rows 4sub + i, high nibbles rows 16 + 4sub + i
    static inline short row(short sub, short i) {
        return 4*sub + (i & 3) + (i >= 4 ? 16 : 0);
    }

    static inline void dequant(device const block * b, short sub, thread float * w) {
        const float d = (float) b->d;
        for (short i = 0; i < 4; ++i) {
            const int q = b->qs[4*sub + i];
            w[i]     = ((q & 0xF) - 8)*d;
            w[i + 4] = ((q >>  4) - 8)*d;
        }
    }
};

//
// decode GEMV
//

typedef void (kernel_mul_mv_zz_t)(
        constant ggml_sparse_metal_kargs_zz & args,
        device const char * w,
        device const char * x,
        device const int32_t * idx,
        device       char * dst,
        threadgroup  float * shmem [[threadgroup(0)]],
        uint3  tgpig[[threadgroup_position_in_grid]],
        uint3  ntgpg[[threadgroups_per_grid]],
        ushort tiitg[[thread_index_in_threadgroup]],
        ushort   ntg[[threads_per_threadgroup]],
        ushort sgitg[[simdgroup_index_in_threadgroup]],
        ushort tiisg[[thread_index_in_simdgroup]],
        ushort   nsg[[simdgroups_per_threadgroup]]);

// shmem: nsg*FC_zz_nt*B floats
template<typename zz_t>
kernel void kernel_mul_mv_zz(
        constant ggml_sparse_metal_kargs_zz & args,
        device const char * w,
        device const char * x,
        device const int32_t * idx,
        device       char * dst,
        threadgroup  float * shmem [[threadgroup(0)]],
        uint3  tgpig[[threadgroup_position_in_grid]],
        uint3  ntgpg[[threadgroups_per_grid]],
        ushort tiitg[[thread_index_in_threadgroup]],
        ushort   ntg[[threads_per_threadgroup]],
        ushort sgitg[[simdgroup_index_in_threadgroup]],
        ushort tiisg[[thread_index_in_simdgroup]],
        ushort   nsg[[simdgroups_per_threadgroup]]) {
    typedef typename zz_t::block block;
    constexpr short B   = zz_t::B;
    constexpr short LPC = zz_t::LPC;
    constexpr short OPL = zz_t::OPL;
    constexpr short CPS = 32/LPC; // columns per simdgroup step

    const int r  = tgpig.y;
    const int p  = tgpig.x;
    const int n1 = ntgpg.x;

    // this simdgroup's even share of the active columns
    const int count = args.has_idx ? idx[args.n] : args.n;
    const int nw = n1*nsg;
    const int wk = p*nsg + sgitg;
    const int k0 = (int) (((long) count*wk)/nw);
    const int k1 = (int) (((long) count*(wk + 1))/nw);

    const short cg  = tiisg / LPC;
    const short sub = tiisg % LPC;

    float acc[8][OPL];
    for (short t = 0; t < FC_zz_nt; ++t) {
        for (short i = 0; i < OPL; ++i) {
            acc[t][i] = 0.0f;
        }
    }

    device const block * wrow = (device const block *) (w + r*args.nb01);

    for (int k = k0 + cg; k < k1; k += CPS) {
        const int j = args.has_idx ? idx[k] : k;
        float wv[OPL];
        zz_t::dequant(wrow + j, sub, wv);
        for (short t = 0; t < FC_zz_nt; ++t) {
            const float xv = ((device const float *) (x + t*args.nb11))[j];
            for (short i = 0; i < OPL; ++i) {
                acc[t][i] += xv*wv[i];
            }
        }
    }

    // column groups of the simdgroup: lanes sub, sub + LPC, ... hold the same rows
    for (short mask = LPC; mask < 32; mask <<= 1) {
        for (short t = 0; t < FC_zz_nt; ++t) {
            for (short i = 0; i < OPL; ++i) {
                acc[t][i] += simd_shuffle_xor(acc[t][i], mask);
            }
        }
    }

    if (cg == 0) {
        for (short t = 0; t < FC_zz_nt; ++t) {
            for (short i = 0; i < OPL; ++i) {
                shmem[(sgitg*FC_zz_nt + t)*B + zz_t::row(sub, i)] = acc[t][i];
            }
        }
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);

    // simdgroups of the threadgroup; the n1 threadgroups write dst (n1 = 1) or their partial
    device char * out = dst + p*args.nbp;
    for (int o = tiitg; o < FC_zz_nt*B; o += ntg) {
        float s = 0.0f;
        for (short g = 0; g < nsg; ++g) {
            s += shmem[g*FC_zz_nt*B + o];
        }
        const int t = o / B;
        const int i = o % B;
        ((device float *) (out + t*args.nb1))[r*B + i] = s;
    }
}

template [[host_name("kernel_mul_mv_zz_q4_K_f32")]] kernel kernel_mul_mv_zz_t kernel_mul_mv_zz<zz_q4_K>;
template [[host_name("kernel_mul_mv_zz_q6_K_f32")]] kernel kernel_mul_mv_zz_t kernel_mul_mv_zz<zz_q6_K>;
template [[host_name("kernel_mul_mv_zz_q8_0_f32")]] kernel kernel_mul_mv_zz_t kernel_mul_mv_zz<zz_q8_0>;
template [[host_name("kernel_mul_mv_zz_q4_0_f32")]] kernel kernel_mul_mv_zz_t kernel_mul_mv_zz<zz_q4_0>;

// dst[t, i] = sum over the n1 partials; one thread per (i, t)
kernel void kernel_mul_mv_zz_reduce(
        constant ggml_sparse_metal_kargs_zz_reduce & args,
        device const char * part,
        device       char * dst,
        uint2 tpig[[thread_position_in_grid]]) {
    const int i = tpig.x;
    const int t = tpig.y;
    if (i >= args.m) {
        return;
    }
    float s = 0.0f;
    for (int p = 0; p < args.n1; ++p) {
        s += ((device const float *) (part + p*args.nbp + t*args.nbpt))[i];
    }
    ((device float *) (dst + t*args.nb1))[i] = s;
}

//
// prefill: block-rows r0 .. r0 + nrows - 1 of W into an f16 tile, row-major: tile[(rr*B + i)*n + j] = W[(r0 + rr)*B + i, j]
//

typedef void (kernel_zz_dequant_f16_t)(
        constant ggml_sparse_metal_kargs_zz_dequant & args,
        device const char * w,
        device       half * tile,
        uint2 tpig[[thread_position_in_grid]]);

// one thread per (column, lane of the column): its OPL weights
template<typename zz_t>
kernel void kernel_zz_dequant_f16(
        constant ggml_sparse_metal_kargs_zz_dequant & args,
        device const char * w,
        device       half * tile,
        uint2 tpig[[thread_position_in_grid]]) {
    const int j   = tpig.x / zz_t::LPC;
    const short sub = tpig.x % zz_t::LPC;
    const int rr  = tpig.y;
    if (j >= args.n || rr >= args.nrows) {
        return;
    }
    device const typename zz_t::block * wrow = (device const typename zz_t::block *) (w + (args.r0 + rr)*args.nb01);
    float wv[zz_t::OPL];
    zz_t::dequant(wrow + j, sub, wv);
    for (short i = 0; i < zz_t::OPL; ++i) {
        tile[(long) (rr*zz_t::B + zz_t::row(sub, i))*args.n + j] = (half) wv[i];
    }
}

template [[host_name("kernel_zz_dequant_q4_K_f16")]] kernel kernel_zz_dequant_f16_t kernel_zz_dequant_f16<zz_q4_K>;
template [[host_name("kernel_zz_dequant_q6_K_f16")]] kernel kernel_zz_dequant_f16_t kernel_zz_dequant_f16<zz_q6_K>;
template [[host_name("kernel_zz_dequant_q8_0_f16")]] kernel kernel_zz_dequant_f16_t kernel_zz_dequant_f16<zz_q8_0>;
template [[host_name("kernel_zz_dequant_q4_0_f16")]] kernel kernel_zz_dequant_f16_t kernel_zz_dequant_f16<zz_q4_0>;
