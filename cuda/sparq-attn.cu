// llama-sparse: GGML_OP_SPARQ_ATTN on CUDA (SparQ attention at decode; contract in ggml-sparse/ggml-sparse.h,
// algorithm in docs/sparq.md).
//
// Where it applies (sm_90, f16 K/V, D = Dv = 64 or 128) one kernel per call, one thread block cluster per KV head:
// see "fused" below (the default; LLAMA_SPARSE_CUDA_SPARQ_FUSED=0 or sparq_args::step2 = 1 / 2 picks the others).
// Else two kernels per call (single step 2) or four (split step 2: see "split step 2" below;
// LLAMA_SPARSE_CUDA_SPARQ_SPLIT=1 or sparq_args::step2 = 2 picks it). No host synchronization (CUDA-graph safe):
//  1. sparq_scores, grid (blocks per head, KV heads, tokens x streams), 256 threads: every block finds i1 (top-r
//     components of the group's summed |q|, ties to the lower index) itself, then loops over chunks of 512
//     positions (1024 for G > 4): 4 (2) row groups of 64 (128) threads split the r rows of k_t, one 16-byte load
//     per row and thread, all rows of a group in flight at once; group 0 adds the others' partial products and
//     writes the approximate scores of the G heads plus, per chunk and head, the max and sum of exp (a split
//     softmax) and the count of visible positions. The grid is capped near one resident wave.
//  2. sparq_attend, one block of 512 threads per (KV head, token, stream), registers sized for 4 or 8 heads a
//     group like step 1: merges the chunk statistics and
//     turns the group-summed softmax of every position into a sort key in shared memory (bits of a
//     non-negative float + 1; 0 = masked). On sm_90 from 8k positions on, a thread block cluster of up to 8
//     blocks (S/2048) per (KV head, token, stream) splits this pass and writes the keys into block 0's shared memory
//     (distributed shared memory); block 0 alone goes on. Selection: every warp takes the kw-th largest of its lanes'
//     maximum keys (kw = ceil(k / warps)); the minimum over warps is a lower bound of the k-th largest key,
//     since at least k distinct positions reach it. The few keys above it are ranked exactly
//     (key desc, position asc); if there are too many (ties), an 8-bit radix select over all keys finds
//     the k-th key instead. Then exact attention of the G heads over the k rows, 128 rows at a time with the
//     whole block on each chunk: scores by groups of 8 lanes per row, softmax bookkeeping by one warp per head,
//     P.V by one thread per (pair of V components, subset of rows) with the V rows requested before the K rows;
//     alpha and the mean-V blend last.
// k >= the visible count: every visible position is taken, no blend (dense attention).
//
// Bytes: step 1 reads r/D of K (plus the mask); step 2 reads k full K and V rows; the scores (H*S floats)
// go through L2.
#include "sparq-attn.cuh"
#include "sparse-idx.cuh"
#include "launch.cuh"

#ifndef GGML_SPARSE_CUDA_STANDALONE
#include "ggml-sparse.h"
#endif // GGML_SPARSE_CUDA_STANDALONE

#include <cooperative_groups.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>

#ifdef GGML_SPARSE_CUDA_CLUSTERS
#define SPARQ_CLUSTER_AVAILABLE // host side; device side also needs __CUDA_ARCH__ >= 900
#endif

// step 1: blocks of 256 threads, RG row groups of PT threads with 8 positions each (one 16-byte load of f16 per
// row): every group takes a share of the r rows of the same POS positions, so a block has all r rows in flight at
// once with few registers (the earlier one-group kernel needed 255 registers and spilled), and there are 4x the
// blocks. G <= 4: 4 groups of 64 threads (512 positions a block); G <= 8: 2 groups of 128 (1024).
#define SPARQ_SC_THREADS  256
#define SPARQ_SC_PPT      8
#define SPARQ_SC_WARPS    (SPARQ_SC_THREADS/WARP_SIZE)
template <int GM> struct sparq_sc_cfg {
    static constexpr int RG  = GM <= 4 ? 4 : 2;
    static constexpr int PT  = SPARQ_SC_THREADS/RG;
    static constexpr int POS = PT*SPARQ_SC_PPT;
};
// positions per step-1 block for G heads per KV head (the launch picks GM = 4 or SPARQ_CUDA_MAX_G the same way)
static int sparq_sc_pos(const int G) {
    return G <= 4 ? sparq_sc_cfg<4>::POS : sparq_sc_cfg<SPARQ_CUDA_MAX_G>::POS;
}
#define SPARQ_AT_THREADS  512
#define SPARQ_AT_WARPS    (SPARQ_AT_THREADS/WARP_SIZE)
#ifndef SPARQ_AT_RA
#define SPARQ_AT_RA       2                                 // exact attention: K rows in flight per lane group
#endif
#define SPARQ_AT_CH       (SPARQ_AT_WARPS*4*SPARQ_AT_RA)    // rows per chunk (4 lane groups a warp)
#define SPARQ_CAND_MAX    1024                              // keys ranked exactly; more: radix select
static_assert(SPARQ_CUDA_MAX_G*SPARQ_AT_CH*sizeof(float) <= SPARQ_CAND_MAX*sizeof(uint64_t),
              "a chunk's probabilities live where the candidates were");
static_assert(SPARQ_CUDA_MAX_G*SPARQ_AT_THREADS*sizeof(float) <= // (NRS/2)*G*Dv floats, NRS = threads / ceil(Dv/2)
              SPARQ_CAND_MAX*(sizeof(uint64_t) + sizeof(int)) + 4*256*sizeof(int),
              "the row subsets' partial outputs live where the candidates, ranks and histogram were");

// -DSPARQ_PHASE_TIMING (diagnostics, standalone test builds): thread 0 of the first block of each kernel stamps
// %globaltimer (and clock64) at its phase boundaries; sparq_phase_read() returns the last call's stamps (ns, cycles)
// and clears them
#ifdef SPARQ_PHASE_TIMING
__device__ unsigned long long sparq_phase_ns[2][SPARQ_PHASES];
__device__ long long          sparq_phase_clk[2][SPARQ_PHASES]; // clock64 at the same stamps (the SM clock: cycles/ns)
// where cond holds: %globaltimer and clock64 into row `row`, stamp i
#define SPARQ_STAMP(cond, row, i)                                                                               \
    do {                                                                                                         \
        if (cond) {                                                                                              \
            unsigned long long t_;                                                                               \
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t_));                                               \
            sparq_phase_ns[row][i] = t_;                                                                         \
            sparq_phase_clk[row][i] = clock64();                                                                 \
        }                                                                                                        \
    } while (0)
#define SPARQ_MARK(kern, i) SPARQ_STAMP(blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 && threadIdx.x == 0, kern, i)
// the fused kernel: block 0 of KV head 0 into [0], the last block of its cluster into [1]
#define SPARQ_MARK_FU(i) \
    SPARQ_STAMP(blockIdx.y == 0 && threadIdx.x == 0 && (blockIdx.x == 0 || blockIdx.x == L.nb - 1), blockIdx.x == 0 ? 0 : 1, i)
// block 0 of the first cluster only (inside the fused kernel's helpers, which do not see the layout)
#define SPARQ_MARK_B0(i) SPARQ_STAMP(blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0, 0, i)
void sparq_phase_read(unsigned long long out[2][SPARQ_PHASES], long long clk[2][SPARQ_PHASES]) {
    CUDA_CHECK(cudaMemcpyFromSymbol(out, sparq_phase_ns, sizeof(sparq_phase_ns)));
    CUDA_CHECK(cudaMemcpyFromSymbol(clk, sparq_phase_clk, sizeof(sparq_phase_clk)));
    // cleared: a block that stamps nothing in the next call (one block a cluster) reads as zeros, not stale stamps
    static const unsigned long long zero[2][SPARQ_PHASES] = {};
    CUDA_CHECK(cudaMemcpyToSymbol(sparq_phase_ns, zero, sizeof(zero)));
    CUDA_CHECK(cudaMemcpyToSymbol(sparq_phase_clk, zero, sizeof(zero)));
}
#else
#define SPARQ_MARK(kern, i) do {} while (0)
#define SPARQ_MARK_FU(i) do {} while (0)
#define SPARQ_MARK_B0(i) do {} while (0)
#endif // SPARQ_PHASE_TIMING

template <typename T> static __device__ __forceinline__ float sparq_f(const T v);
template <> __device__ __forceinline__ float sparq_f<float>(const float v) { return v; }
template <> __device__ __forceinline__ float sparq_f<half>(const half v) { return __half2float(v); }

// 8 consecutive values of a k_t row as loaded (16-byte aligned), converted only when used, so that a batch
// of rows can be requested before the first is needed
template <typename T> struct sparq_raw8;
template <> struct sparq_raw8<half>  { uint4  u; };
template <> struct sparq_raw8<float> { float4 x, y; };

static __device__ __forceinline__ void sparq_ld8(sparq_raw8<half> & r, const half * p) {
    r.u = *(const uint4 *) p;
}

static __device__ __forceinline__ void sparq_ld8(sparq_raw8<float> & r, const float * p) {
    r.x = ((const float4 *) p)[0];
    r.y = ((const float4 *) p)[1];
}

static __device__ __forceinline__ void sparq_cvt8(const sparq_raw8<half> & r, float * out) {
    const half2 * h = (const half2 *) &r.u;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float2 f = __half22float2(h[i]);
        out[2*i + 0] = f.x;
        out[2*i + 1] = f.y;
    }
}

static __device__ __forceinline__ void sparq_cvt8(const sparq_raw8<float> & r, float * out) {
    out[0] = r.x.x; out[1] = r.x.y; out[2] = r.x.z; out[3] = r.x.w;
    out[4] = r.y.x; out[5] = r.y.y; out[6] = r.y.z; out[7] = r.y.w;
}

// 8 consecutive components from p, n >= 1 of them inside the row, one load each (zeros past n): rows that are not
// 16-byte aligned or whose length is not a multiple of 8 (sparq_attend<..., VEC = false>)
static __device__ __forceinline__ void sparq_ld8_row(sparq_raw8<half> & r, const half * p, const int n) {
    half2 h[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        h[i] = __halves2half2(2*i < n ? p[2*i] : __float2half(0.0f), 2*i + 1 < n ? p[2*i + 1] : __float2half(0.0f));
    }
    memcpy(&r.u, h, sizeof(r.u));
}

static __device__ __forceinline__ void sparq_ld8_row(sparq_raw8<float> & r, const float * p, const int n) {
    float f[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        f[i] = i < n ? p[i] : 0.0f;
    }
    r.x = make_float4(f[0], f[1], f[2], f[3]);
    r.y = make_float4(f[4], f[5], f[6], f[7]);
}

// 8 consecutive positions j0 .. j0 + 7 (j0 % 8 == 0) of a Q8_0 k_t row as loaded: the block's scale and the 8
// signed bytes (blocks are 34 bytes, so only 2-byte aligned: four 2-byte loads)
struct sparq_raw8q { half d; uint16_t b[4]; };
struct sparq_q8 {}; // k_t element type tag of the Q8_0 copy (template argument of the step-1 kernels)

static __device__ __forceinline__ void sparq_ld8q(sparq_raw8q & r, const char * row, const int j0) {
    const char * blk = row + (int64_t) (j0/32)*34;
    const uint16_t * p = (const uint16_t *) (blk + 2 + j0 % 32);
    r.d = *(const half *) blk;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        r.b[i] = p[i];
    }
}

static __device__ __forceinline__ void sparq_cvt8(const sparq_raw8q & r, float * out) {
    const float d = __half2float(r.d);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        out[2*i + 0] = d*(float) (int8_t) (r.b[i] & 0xff);
        out[2*i + 1] = d*(float) (int8_t) (r.b[i] >> 8);
    }
}

// 8 positions of a k_t row in the step-1 loops, one call for every storage: p is the row at position j0 for
// f16 / f32 (16-byte aligned), the row's start for Q8_0 (its blocks are found from j0)
static __device__ __forceinline__ void sparq_ld8_kt(sparq_raw8<half> & r, const char * p, const int j0) {
    GGML_UNUSED(j0);
    sparq_ld8(r, (const half *) p);
}

static __device__ __forceinline__ void sparq_ld8_kt(sparq_raw8<float> & r, const char * p, const int j0) {
    GGML_UNUSED(j0);
    sparq_ld8(r, (const float *) p);
}

static __device__ __forceinline__ void sparq_ld8_kt(sparq_raw8q & r, const char * p, const int j0) {
    sparq_ld8q(r, p, j0);
}

static __device__ __forceinline__ void sparq_zero8(sparq_raw8<half> & r)  { r.u = make_uint4(0, 0, 0, 0); }
static __device__ __forceinline__ void sparq_zero8(sparq_raw8<float> & r) { r.x = r.y = make_float4(0.0f, 0.0f, 0.0f, 0.0f); }

// V[j][d], V[j][d + 1] as loaded (d < Dv; zero past Dv): one 2-element load where vec (rows contiguous, aligned,
// Dv even); converted only when used, so that all of a thread's rows can be requested at once
template <typename T> struct sparq_raw2;
template <> struct sparq_raw2<half>  { half2  v; };
template <> struct sparq_raw2<float> { float2 v; };

// vbd: this thread's component d of row 0 (vb + d*nb0); second: d + 1 < Dv
template <typename KT, bool VEC>
static __device__ __forceinline__ sparq_raw2<KT> sparq_ld_v2(const char * vbd, const int64_t nb1, const int64_t nb0,
        const int j, const bool second) {
    const char *   p = vbd + (int64_t) j*nb1;
    sparq_raw2<KT> r;
    if constexpr (VEC) {
        if constexpr (sizeof(KT) == 2) {
            r.v = *(const half2 *) p;
        } else {
            r.v = *(const float2 *) p;
        }
    } else {
        const KT x = *(const KT *) p;
        const KT y = second ? *(const KT *) (p + nb0) : KT(0.0f);
        if constexpr (sizeof(KT) == 2) {
            r.v = __halves2half2(x, y);
        } else {
            r.v = make_float2(x, y);
        }
    }
    return r;
}

static __device__ __forceinline__ float2 sparq_cvt2(const sparq_raw2<half> & r)  { return __half22float2(r.v); }
static __device__ __forceinline__ float2 sparq_cvt2(const sparq_raw2<float> & r) { return r.v; }

// cacc[h] += p[i][h] * v for the heads of a group (p: [SPARQ_AT_CH][GM] in shared memory, 16-byte aligned): one
// 16-byte load per 4 heads; heads >= G take whatever is there and are never read
template <int GM>
static __device__ __forceinline__ void sparq_pv_row(float (&cacc)[GM][2], const float * s_p, const int i,
        const float2 v) {
    static_assert(GM % 4 == 0, "GM: a multiple of 4");
#pragma unroll
    for (int h4 = 0; h4 < GM; h4 += 4) {
        const float4 p = *(const float4 *) &s_p[i*GM + h4];
        cacc[h4 + 0][0] += p.x*v.x; cacc[h4 + 0][1] += p.x*v.y;
        cacc[h4 + 1][0] += p.y*v.x; cacc[h4 + 1][1] += p.y*v.y;
        cacc[h4 + 2][0] += p.z*v.x; cacc[h4 + 2][1] += p.z*v.y;
        cacc[h4 + 3][0] += p.w*v.x; cacc[h4 + 3][1] += p.w*v.y;
    }
}

static __device__ __forceinline__ uint32_t sparq_warp_max_u32(uint32_t v) {
#pragma unroll
    for (int off = WARP_SIZE/2; off > 0; off >>= 1) {
        v = max(v, __shfl_xor_sync(0xFFFFFFFF, v, off, WARP_SIZE));
    }
    return v;
}

// q of the G heads of KV head kh into s_q[h][d], zero past D (the head-element loops run to a multiple of 32)
// (U elements per thread loaded before any is stored: a small block does not wait for its loads one by one)
static __device__ __forceinline__ void sparq_load_q(const sparq_args & a, const int kh, const int t, const int s,
        const int G, float (*s_q)[SPARQ_CUDA_MAX_D]) {
    constexpr int U = 8;
    const int n = G*SPARQ_CUDA_MAX_D;
    for (int e0 = threadIdx.x; e0 < n; e0 += U*blockDim.x) {
        float v[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int e = e0 + u*blockDim.x;
            const int h = e / SPARQ_CUDA_MAX_D;
            const int d = e % SPARQ_CUDA_MAX_D;
            v[u] = e < n && d < a.D ?
                *(const float *) (a.q + (int64_t) d*sizeof(float) + t*a.q_nb1 + (int64_t) (kh*G + h)*a.q_nb2 + s*a.q_nb3) : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int e = e0 + u*blockDim.x;
            if (e < n) {
                s_q[e / SPARQ_CUDA_MAX_D][e % SPARQ_CUDA_MAX_D] = v[u];
            }
        }
    }
}

// acc[h][u] += coef[h] * kv[u] for the G heads (G <= GM)
template <int GM>
static __device__ __forceinline__ void sparq_fma_row(float (&acc)[GM][SPARQ_SC_PPT], const float * kv,
        const float * coef, const int G) {
#pragma unroll
    for (int h = 0; h < GM; ++h) {
        if (h < G) {
            const float cf = coef[h];
#pragma unroll
            for (int u = 0; u < SPARQ_SC_PPT; ++u) {
                acc[h][u] += cf*kv[u];
            }
        }
    }
}

// i1 (the r largest components of the group's summed |q|, ties to the lower index) into s_i1[0..rr) and the
// step-1 coefficients s_coef[c][h] = q_h[i1[c]] * scale / sqrt(rho_h), from q in s_q (NT threads, all calling;
// s_q must be complete; s_i1 and s_coef are complete when it returns; s_abs and s_rank: D rounded up to 32 words)
template <int NT, int GM>
static __device__ void sparq_i1_coef(const sparq_args & a, const int G, const float (*s_q)[SPARQ_CUDA_MAX_D],
        float * s_abs, int * s_rank, int * s_i1, float (*s_coef)[GM]) {
    constexpr int NW = NT/WARP_SIZE;
    constexpr int MG = SPARQ_CUDA_MAX_D/WARP_SIZE;
    const int D    = a.D;
    const int rr   = min(a.r, D);
    const int tid  = threadIdx.x;
    const int lane = tid % WARP_SIZE;
    const int warp = tid / WARP_SIZE;
    const int ng   = (D + WARP_SIZE - 1)/WARP_SIZE; // groups of 32 components
    // |q| summed over the group; -inf pads the last group (below every real component)
    for (int d = tid; d < ng*WARP_SIZE; d += NT) {
        float v = -INFINITY;
        if (d < D) {
            v = 0.0f;
            for (int h = 0; h < G; ++h) {
                v += fabsf(s_q[h][d]);
            }
        }
        s_abs[d]  = v;
        s_rank[d] = 0;
    }
    __syncthreads();
    // rank = the components above (larger, or equal at a lower index): warp (cg, p) counts, for the 32 of group cg
    // (a lane each), over part p of the groups. A group below cg counts >=, one above >; only cg compares indices.
    // Every lane reads the same float4 (a broadcast); the parts add up in s_rank. (Before: 4 lanes a component
    // over quarters of D: ~490 instructions a warp, 4-way bank conflicts, 2.8 us with the coefficients, H200.)
    {
        const int np = max(1, min(ng, NW/ng)); // parts
        const int gp = (ng + np - 1)/np;       // groups a part
        if (warp < ng*np) {
            const int   cg = warp % ng;
            const int   p  = warp / ng;
            const int   d  = cg*WARP_SIZE + lane;
            const float ad = s_abs[d];
            int cnt = 0;
            for (int g = p*gp; g < min(ng, (p + 1)*gp); ++g) {
                const float4 * v4 = (const float4 *) (s_abs + g*WARP_SIZE);
                if (g == cg) {
#pragma unroll
                    for (int i = 0; i < WARP_SIZE/4; ++i) {
                        const float4 w = v4[i];
                        cnt += w.x > ad || (w.x == ad && 4*i + 0 < lane);
                        cnt += w.y > ad || (w.y == ad && 4*i + 1 < lane);
                        cnt += w.z > ad || (w.z == ad && 4*i + 2 < lane);
                        cnt += w.w > ad || (w.w == ad && 4*i + 3 < lane);
                    }
                } else if (g < cg) {
#pragma unroll
                    for (int i = 0; i < WARP_SIZE/4; ++i) {
                        const float4 w = v4[i];
                        cnt += (w.x >= ad) + (w.y >= ad) + (w.z >= ad) + (w.w >= ad);
                    }
                } else {
#pragma unroll
                    for (int i = 0; i < WARP_SIZE/4; ++i) {
                        const float4 w = v4[i];
                        cnt += (w.x > ad) + (w.y > ad) + (w.z > ad) + (w.w > ad);
                    }
                }
            }
            if (np == 1) {
                s_rank[d] = cnt;
            } else {
                atomicAdd(&s_rank[d], cnt);
            }
        }
    }
    __syncthreads();
    // warp h: the temperature scale / sqrt(rho_h), rho_h = |q_h[i1]|_1 / |q_h|_1, and head h's coefficients at
    // the ranks; warp 0 writes i1
    for (int h = warp; h < G; h += NW) {
        int   rk[MG];
        float num = 0.0f;
        float den = 0.0f;
#pragma unroll
        for (int i = 0; i < MG; ++i) {
            const int d = i*WARP_SIZE + lane;
            rk[i] = rr;
            if (d < D) {
                const float v = fabsf(s_q[h][d]);
                rk[i] = s_rank[d];
                den += v;
                num += rk[i] < rr ? v : 0.0f;
            }
        }
        num = warp_reduce_sum<WARP_SIZE>(num);
        den = warp_reduce_sum<WARP_SIZE>(den);
        const float rho = num > 0.0f && den > 0.0f ? num/den : 1.0f;
        const float tf  = a.scale/sqrtf(rho);
#pragma unroll
        for (int i = 0; i < MG; ++i) {
            const int d = i*WARP_SIZE + lane;
            if (rk[i] < rr) {
                s_coef[rk[i]][h] = s_q[h][d]*tf;
                if (h == 0) {
                    s_i1[rk[i]] = d;
                }
            }
        }
    }
    __syncthreads();
}

// GM: most heads per group the registers are sized for (G <= GM). Thread (g, p) = (tid / PT, tid % PT) takes
// positions j0 .. j0+7 of the block's chunk and the rows g, g + RG, g + 2 RG, ... of the r; row group 0 adds
// the others' partial products (shared memory) and finishes: mask, scores, chunk statistics.
// KT: k_t's element type (half, float, or sparq_q8 for the Q8_0 copy)
template <typename KT, typename MT, int GM>
static __global__ void __launch_bounds__(SPARQ_SC_THREADS, 2) sparq_scores(const sparq_args a) {
    using cfg = sparq_sc_cfg<GM>;
    constexpr bool KQ8 = std::is_same_v<KT, sparq_q8>;
    constexpr int RG    = cfg::RG;
    constexpr int PT    = cfg::PT;
    constexpr int POS   = cfg::POS;
    constexpr int BATCH = (KQ8 || sizeof(KT) == 2) && GM <= 4 ? 8 : 4; // rows in flight per thread
    constexpr int NBUF  = (RG - 1)*GM*POS > SPARQ_CUDA_MAX_G*SPARQ_CUDA_MAX_D ? (RG - 1)*GM*POS : SPARQ_CUDA_MAX_G*SPARQ_CUDA_MAX_D;
    constexpr int W0    = PT/WARP_SIZE;                             // warps of row group 0
    // q (until the coefficients are made), then the partial products of row groups 1 .. RG-1
    __shared__ __align__(16) float s_buf[NBUF];
    __shared__ __align__(16) float s_abs[SPARQ_CUDA_MAX_D];
    __shared__ int   s_i1[SPARQ_CUDA_MAX_D];
    __shared__ float s_coef[SPARQ_CUDA_MAX_D][GM]; // [c][h] = q_h[i1[c]] * scale / sqrt(rho_h)
    __shared__ int   s_rank[SPARQ_CUDA_MAX_D];
    __shared__ float s_max[W0][GM];
    __shared__ float s_sum[W0][GM];
    __shared__ int   s_nv[W0];
    float (*s_q)[SPARQ_CUDA_MAX_D] = (float (*)[SPARQ_CUDA_MAX_D]) s_buf;

    const int kh   = blockIdx.y;
    const int unit = blockIdx.z;
    const int t    = unit % a.n_tok;
    const int s    = unit / a.n_tok;
    const int G    = a.H / a.Hkv;
    const int D    = a.D;
    const int tid  = threadIdx.x;
    const int lane = tid % WARP_SIZE;
    const int warp = tid / WARP_SIZE;
    const int g    = tid / PT;
    const int p    = tid % PT;
    const int rr   = min(a.r, D);

    SPARQ_MARK(0, 0);
    ggml_cuda_pdl_sync();
    ggml_cuda_pdl_lc(); // the select kernel may get its blocks resident; it waits for this grid's end itself
    SPARQ_MARK(0, 1);

    sparq_load_q(a, kh, t, s, G, s_q);
    __syncthreads();
    sparq_i1_coef<SPARQ_SC_THREADS, GM>(a, G, s_q, s_abs, s_rank, s_i1, s_coef); // s_q is dead from here: s_buf takes the partial products
    SPARQ_MARK(0, 2); // i1, temperature and coefficients ready

    const MT * mrow = (const MT *) (a.mask + t*a.m_nb1 + (int64_t) (s % a.m_ne3)*a.m_nb3);
    // chunks blockIdx.x, + gridDim.x, ...: the launch caps the grid near what is resident at once, so i1 and the
    // coefficients are made once per block, not once per chunk
    for (int blk = blockIdx.x; blk < a.nblk; blk += gridDim.x) {
        const int  j0   = blk*POS + p*SPARQ_SC_PPT;
        const bool full = j0 + SPARQ_SC_PPT <= a.n_kv;
        // row group 0 needs the mask at the end: request it with the rows
        float mv[SPARQ_SC_PPT];
#pragma unroll
        for (int u = 0; u < SPARQ_SC_PPT; ++u) {
            mv[u] = g == 0 && j0 + u < a.n_kv ? sparq_f<MT>(mrow[j0 + u]) : -INFINITY;
        }

        float acc[GM][SPARQ_SC_PPT];
#pragma unroll
        for (int h = 0; h < GM; ++h) {
#pragma unroll
            for (int u = 0; u < SPARQ_SC_PPT; ++u) {
                acc[h][u] = 0.0f;
            }
        }
        // Q8_0: n_kv % 32 == 0, so a chunk inside the positions is whole, and p of sparq_ld8_kt is the row start
        using RAW = std::conditional_t<KQ8, sparq_raw8q, sparq_raw8<KT>>;
        const char * ktb = a.kt + kh*a.kt_nb2 + s*a.kt_nb3 + (KQ8 ? 0 : (int64_t) j0*sizeof(KT));
        if (full && (KQ8 || a.kt_vec)) {
            // BATCH rows of this group in flight before the first FMA
            for (int c0 = g; c0 < rr; c0 += RG*BATCH) {
                RAW raw[BATCH];
#pragma unroll
                for (int u = 0; u < BATCH; ++u) {
                    if (c0 + RG*u < rr) {
                        sparq_ld8_kt(raw[u], ktb + (int64_t) s_i1[c0 + RG*u]*a.kt_nb1, j0);
                    }
                }
#pragma unroll
                for (int u = 0; u < BATCH; ++u) {
                    if (c0 + RG*u < rr) {
                        float kv[SPARQ_SC_PPT];
                        sparq_cvt8(raw[u], kv);
                        sparq_fma_row(acc, kv, s_coef[c0 + RG*u], G);
                    }
                }
            }
        } else if constexpr (!KQ8) {
            if (j0 < a.n_kv) {
#pragma unroll 2
                for (int c = g; c < rr; c += RG) {
                    const KT * row = (const KT *) (ktb + (int64_t) s_i1[c]*a.kt_nb1);
                    float kv[SPARQ_SC_PPT];
#pragma unroll
                    for (int u = 0; u < SPARQ_SC_PPT; ++u) {
                        kv[u] = j0 + u < a.n_kv ? sparq_f<KT>(row[u]) : 0.0f;
                    }
                    sparq_fma_row(acc, kv, s_coef[c], G);
                }
            }
        }
        SPARQ_MARK(0, 3); // products of the r rows done (this thread's)

        // partial products of groups 1 .. RG-1: [g-1][h][POS], 16-byte pieces
        if (g > 0) {
#pragma unroll
            for (int h = 0; h < GM; ++h) {
                if (h < G) {
                    float4 * o = (float4 *) &s_buf[((g - 1)*GM + h)*POS + p*SPARQ_SC_PPT];
                    o[0] = make_float4(acc[h][0], acc[h][1], acc[h][2], acc[h][3]);
                    o[1] = make_float4(acc[h][4], acc[h][5], acc[h][6], acc[h][7]);
                }
            }
        }
        __syncthreads();
#pragma unroll
        for (int gg = 1; gg < RG; ++gg) {
#pragma unroll
            for (int h = 0; h < GM; ++h) {
                if (g == 0 && h < G) {
                    const float4 * o = (const float4 *) &s_buf[((gg - 1)*GM + h)*POS + p*SPARQ_SC_PPT];
                    const float4 x0 = o[0];
                    const float4 x1 = o[1];
                    acc[h][0] += x0.x; acc[h][1] += x0.y; acc[h][2] += x0.z; acc[h][3] += x0.w;
                    acc[h][4] += x1.x; acc[h][5] += x1.y; acc[h][6] += x1.z; acc[h][7] += x1.w;
                }
            }
        }
        __syncthreads(); // s_buf read: the other groups may go on to the next chunk
        if (g > 0) {
            continue; // no barrier below involves the other groups
        }

        int nv = 0;
#pragma unroll
        for (int u = 0; u < SPARQ_SC_PPT; ++u) {
            nv += mv[u] != -INFINITY;
        }

        float * scb = a.sc + ((int64_t) unit*a.H + kh*G)*a.sc_ld + j0;
        float   mx[GM];
#pragma unroll
        for (int h = 0; h < GM; ++h) {
            mx[h] = -INFINITY;
            if (h >= G) {
                continue;
            }
#pragma unroll
            for (int u = 0; u < SPARQ_SC_PPT; ++u) {
                acc[h][u] = mv[u] != -INFINITY ? acc[h][u] + mv[u] : -INFINITY;
                mx[h]     = fmaxf(mx[h], acc[h][u]);
            }
            float * row = scb + h*a.sc_ld;
            if (full) { // sc_ld and j0 are multiples of 8: 32-byte aligned
                ((float4 *) row)[0] = make_float4(acc[h][0], acc[h][1], acc[h][2], acc[h][3]);
                ((float4 *) row)[1] = make_float4(acc[h][4], acc[h][5], acc[h][6], acc[h][7]);
            } else {
#pragma unroll
                for (int u = 0; u < SPARQ_SC_PPT; ++u) {
                    if (j0 + u < a.n_kv) {
                        row[u] = acc[h][u];
                    }
                }
            }
            mx[h] = warp_reduce_max<WARP_SIZE>(mx[h]);
            if (lane == 0) {
                s_max[warp][h] = mx[h];
            }
        }
        nv = warp_reduce_sum<WARP_SIZE>(nv);
        if (lane == 0) {
            s_nv[warp] = nv;
        }
        // row group 0 is warps 0 .. W0-1: a named barrier over them alone
        asm volatile("bar.sync 1, %0;" :: "r"(PT) : "memory");
#pragma unroll
        for (int h = 0; h < GM; ++h) {
            if (h >= G) {
                continue;
            }
            float m = -INFINITY;
#pragma unroll
            for (int w = 0; w < W0; ++w) {
                m = fmaxf(m, s_max[w][h]);
            }
            float sum = 0.0f;
            if (m != -INFINITY) {
#pragma unroll
                for (int u = 0; u < SPARQ_SC_PPT; ++u) {
                    sum += acc[h][u] != -INFINITY ? expf(acc[h][u] - m) : 0.0f;
                }
            }
            sum = warp_reduce_sum<WARP_SIZE>(sum);
            if (lane == 0) {
                s_sum[warp][h] = sum;
            }
        }
        asm volatile("bar.sync 1, %0;" :: "r"(PT) : "memory");
        if (tid < G) {
            float sum = 0.0f;
            float m   = -INFINITY;
#pragma unroll
            for (int w = 0; w < W0; ++w) {
                sum += s_sum[w][tid];
                m    = fmaxf(m, s_max[w][tid]);
            }
            a.part[((int64_t) unit*a.H + kh*G + tid)*a.nblk + blk] = make_float2(m, sum);
        }
        if (tid == 0 && kh == 0) {
            int c = 0;
#pragma unroll
            for (int w = 0; w < W0; ++w) {
                c += s_nv[w];
            }
            a.nvis[(int64_t) unit*a.nblk + blk] = c;
        }
    }
    SPARQ_MARK(0, 4);
}

// thr = the k-th largest of keys[0..n), kk = how many keys equal to thr belong to the k largest; 8 bits a pass
// from the top, histograms in shared memory (s_hist: 4 x 256, s_cnt: 256)
static __device__ void sparq_radix_kth(const uint32_t * keys, const int n, const int k, int * s_hist, int * s_cnt,
        uint32_t * s_prefix, int * s_kk, uint32_t & thr, int & kk) {
    const int tid = threadIdx.x, lane = tid % WARP_SIZE, warp = tid / WARP_SIZE;
    if (tid == 0) {
        *s_prefix = 0;
        *s_kk     = k;
    }
    uint32_t pmask = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int e = tid; e < 4*256; e += blockDim.x) {
            s_hist[e] = 0;
        }
        __syncthreads();
        const uint32_t prefix = *s_prefix;
        int * hist = s_hist + (warp & 3)*256;
        for (int j = tid; j < n; j += blockDim.x) {
            const uint32_t key = keys[j];
            if ((key & pmask) == prefix) {
                atomicAdd(hist + ((key >> shift) & 255), 1);
            }
        }
        __syncthreads();
        if (tid < 256) {
            s_cnt[tid] = s_hist[tid] + s_hist[256 + tid] + s_hist[512 + tid] + s_hist[768 + tid];
        }
        __syncthreads();
        if (warp == 0) {
            // lane takes bins 255 - 8*lane - i (i < 8): descending bins in lane order
            int c[8];
            int local = 0;
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                c[i]   = s_cnt[255 - 8*lane - i];
                local += c[i];
            }
            const int want = *s_kk; // read before any lane can write it (the shuffles below converge the warp)
            const int incl = warp_prefix_inclusive_sum<int>(local);
            const int excl = incl - local;
            if (excl < want && want <= incl) {
                int cum = excl;
#pragma unroll
                for (int i = 0; i < 8; ++i) {
                    if (cum + c[i] >= want) {
                        *s_prefix = prefix | ((uint32_t) (255 - 8*lane - i) << shift);
                        *s_kk     = want - cum;
                        break;
                    }
                    cum += c[i];
                }
            }
        }
        pmask |= 255u << shift;
        __syncthreads();
    }
    thr = *s_prefix;
    kk  = *s_kk;
}

// s_sel = every position with key > thr, then the first kk positions with key == thr, each part in position
// order (thread-contiguous ranges + scans: deterministic). Returns the count.
static __device__ int sparq_gather(const uint32_t * keys, const int n, const uint32_t thr, const int kk, int * s_sel,
        int * s_tmp) {
    const int per = (n + blockDim.x - 1)/blockDim.x;
    const int lo  = min(n, (int) threadIdx.x*per);
    const int hi  = min(n, lo + per);
    int ngt = 0;
    int neq = 0;
    for (int j = lo; j < hi; ++j) {
        const uint32_t key = keys[j];
        ngt += key > thr;
        neq += key == thr;
    }
    int n_gt, n_eq;
    int gt = sparse_block_excl_scan(ngt, s_tmp, &n_gt);
    int eq = sparse_block_excl_scan(neq, s_tmp, &n_eq);
    for (int j = lo; j < hi; ++j) {
        const uint32_t key = keys[j];
        if (key > thr) {
            s_sel[gt++] = j;
        } else if (key == thr) {
            if (eq < kk) {
                s_sel[n_gt + eq] = j;
            }
            ++eq;
        }
    }
    return n_gt + min(kk, n_eq);
}

// keys[j] for this thread's positions j = lo + threadIdx.x + i*SPARQ_AT_THREADS < hi; returns their largest.
// G fixed at compile time: the loads of several positions are in flight together (no branches between them).
template <int G>
static __device__ __forceinline__ uint32_t sparq_keys(const float * scb, const int64_t ld, const int lo, const int hi,
        const bool dense, const float * s_m, const float * s_rz, uint32_t * keys) {
    uint32_t tmax = 0;
#pragma unroll 4
    for (int j = lo + threadIdx.x; j < hi; j += SPARQ_AT_THREADS) {
        float p   = 0.0f;
        bool  vis = false;
#pragma unroll
        for (int h = 0; h < G; ++h) {
            const float sv = scb[h*ld + j];
            vis = vis || sv != -INFINITY;
            p  += sv != -INFINITY && !dense ? expf(sv - s_m[h])*s_rz[h] : 0.0f;
        }
        const uint32_t key = vis ? __float_as_uint(p) + 1u : 0u;
        keys[j] = key;
        tmax    = max(tmax, key);
    }
    return tmax;
}

template <int G>
static __device__ __forceinline__ uint32_t sparq_keys_g(const int g, const float * scb, const int64_t ld, const int lo,
        const int hi, const bool dense, const float * s_m, const float * s_rz, uint32_t * keys) {
    return g == G ? sparq_keys<G>(scb, ld, lo, hi, dense, s_m, s_rz, keys) :
                    sparq_keys_g<G - 1>(g, scb, ld, lo, hi, dense, s_m, s_rz, keys);
}

template <>
__device__ __forceinline__ uint32_t sparq_keys_g<1>(const int g, const float * scb, const int64_t ld, const int lo,
        const int hi, const bool dense, const float * s_m, const float * s_rz, uint32_t * keys) {
    (void) g;
    return sparq_keys<1>(scb, ld, lo, hi, dense, s_m, s_rz, keys);
}

static __host__ __device__ __forceinline__ int sparq_attend_sel_offset(const int n_kv, const int kcap) {
    return (n_kv + kcap + 3) & ~3; // 16-byte alignment for the candidates (and the probabilities there later)
}

// dynamic shared memory of sparq_attend
static size_t sparq_attend_smem(const int n_kv, const int G, const int k_top, const int Dv) {
    const int kcap = std::min(k_top, n_kv);
    return (size_t) sparq_attend_sel_offset(n_kv, kcap)*sizeof(int) + SPARQ_CAND_MAX*(sizeof(uint64_t) + sizeof(int)) +
           (size_t) (4*256 + G*Dv)*sizeof(int);
}

// online-softmax update of one K/V row (this lane's DE components of each) for the G heads of a group:
// score = scale*q.k + mv, then the running max m, sum l and output acc of every head
template <int DE>
static __device__ __forceinline__ void sparq_online_row(const float (*s_q)[SPARQ_CUDA_MAX_D], const float (&kv)[DE],
        const float (&vv)[DE], const float scale, const float mv, const int G, const int lane,
        float (&m)[SPARQ_CUDA_MAX_G], float (&l)[SPARQ_CUDA_MAX_G], float (&acc)[SPARQ_CUDA_MAX_G][DE]) {
#pragma unroll
    for (int h = 0; h < SPARQ_CUDA_MAX_G; ++h) {
        if (h >= G) {
            break;
        }
        float dot = 0.0f;
#pragma unroll
        for (int e = 0; e < DE; ++e) {
            dot += s_q[h][lane + WARP_SIZE*e]*kv[e];
        }
        dot = warp_reduce_sum<WARP_SIZE>(dot);
        const float sc   = scale*dot + mv;
        const float mn   = fmaxf(m[h], sc);
        const float corr = expf(m[h] - mn);
        const float p    = expf(sc - mn);
        l[h] = l[h]*corr + p;
#pragma unroll
        for (int e = 0; e < DE; ++e) {
            acc[h][e] = acc[h][e]*corr + p*vv[e];
        }
        m[h] = mn;
    }
}

// DE: D, Dv <= 32*DE (K rows are read in DE/2 slices of 64 components); GM: most heads per group the registers and
// unrolled head loops are sized for (G <= GM; 4 for G <= 4 took ~2.5 us off the op on the H100 against 8);
// VEC: K rows 16-byte aligned with D % 8 == 0 and V pairs aligned (sparq_args::k_vec, v_vec): vector loads only.
// The element-wise loads of !VEC are not compiled into the VEC kernels: their branches and addresses made up half
// of the exact attention's straight-line code, which a block runs once, waiting on instruction fetch (ncu).
template <typename KT, typename MT, int DE, int GM, bool VEC>
static __global__ void __launch_bounds__(SPARQ_AT_THREADS) sparq_attend(const sparq_args a) {
    extern __shared__ __align__(16) char sparq_smem[];
    __shared__ __align__(16) float s_q[GM][SPARQ_CUDA_MAX_D];
    __shared__ float    s_m[GM], s_rz[GM];         // step-1 softmax max, 1/sum
    __shared__ float    s_mrun[GM];                // step 2: running max, sum, rescale
    __shared__ float    s_l[GM];
    __shared__ float    s_corr[GM];
    __shared__ float    s_alpha[GM];
    __shared__ uint32_t s_wthr[SPARQ_AT_WARPS];
    __shared__ int      s_cnt[256];
    __shared__ int      s_tmp[WARP_SIZE];
    __shared__ int      s_nvis, s_ncand, s_kk;
    __shared__ uint32_t s_tmax[SPARQ_AT_THREADS];  // cluster: a thread's key maximum over the cluster's blocks
    __shared__ uint32_t s_prefix;

    const int nc   = gridDim.x / a.Hkv; // blocks per KV head: a thread block cluster (sm_90) when > 1
    const int kh   = blockIdx.x / nc;
    const int unit = blockIdx.y;
    const int t    = unit % a.n_tok;
    const int s    = unit / a.n_tok;
    const int G    = a.H / a.Hkv;
    const int tid  = threadIdx.x;
    const int lane = tid % WARP_SIZE;
    const int warp = tid / WARP_SIZE;
    const int n_kv = a.n_kv;
    const int kcap = min(a.k_top, n_kv);

    // shared: keys [n_kv], sel [kcap], candidates [SPARQ_CAND_MAX] (u64), their ranks, hist [4][256], y [G][Dv]
    uint32_t * s_key  = (uint32_t *) sparq_smem;
    int      * s_sel  = (int *) (s_key + n_kv);
    uint64_t * s_cand = (uint64_t *) ((int *) sparq_smem + sparq_attend_sel_offset(n_kv, kcap));
    int      * s_rank = (int *) (s_cand + SPARQ_CAND_MAX);
    int      * s_hist = s_rank + SPARQ_CAND_MAX;
    float    * s_y    = (float *) (s_hist + 4*256);

    // the accumulators do not depend on earlier kernels (s_y: written whole by the last reduction)
    for (int e = tid; e < SPARQ_CAND_MAX; e += SPARQ_AT_THREADS) {
        s_rank[e] = 0;
    }
    if (tid < G) {
        s_alpha[tid] = 0.0f;
    }
    if (tid == 0) {
        s_ncand = 0;
    }
    s_tmax[tid] = 0;
#if !defined(GGML_USE_HIP) && !defined(GGML_USE_MUSA) && __CUDA_ARCH__ >= GGML_CUDA_CC_HOPPER
    if (nc > 1) {
        // a block may write a peer's shared memory only once the peer runs: arrive now, wait before the keys.
        // Block 0 releases its s_tmax zeros to the peers' atomics; the others order nothing (relaxed: no membar)
        if (blockIdx.x % nc == 0) {
            asm volatile("barrier.cluster.arrive.aligned;" ::: "memory");
        } else {
            asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
        }
    }
#endif

    SPARQ_MARK(1, 0);
    ggml_cuda_pdl_sync();
    ggml_cuda_pdl_lc(); // the next kernel waits for this grid's end itself
    SPARQ_MARK(1, 1);

    sparq_load_q(a, kh, t, s, G, s_q);
    for (int h = warp; h < G; h += SPARQ_AT_WARPS) {
        const float2 * p = a.part + ((int64_t) unit*a.H + kh*G + h)*a.nblk;
        float mx = -INFINITY;
        for (int b = lane; b < a.nblk; b += WARP_SIZE) {
            mx = fmaxf(mx, p[b].x);
        }
        mx = warp_reduce_max<WARP_SIZE>(mx);
        float z = 0.0f;
        for (int b = lane; b < a.nblk; b += WARP_SIZE) {
            z += p[b].x != -INFINITY ? p[b].y*expf(p[b].x - mx) : 0.0f;
        }
        z = warp_reduce_sum<WARP_SIZE>(z);
        if (lane == 0) {
            s_m[h]  = mx;
            s_rz[h] = z > 0.0f ? 1.0f/z : 0.0f;
        }
    }
    if (warp == SPARQ_AT_WARPS - 1) {
        int c = 0;
        for (int b = lane; b < a.nblk; b += WARP_SIZE) {
            c += a.nvis[(int64_t) unit*a.nblk + b];
        }
        c = warp_reduce_sum<WARP_SIZE>(c);
        if (lane == 0) {
            s_nvis = c;
        }
    }
    __syncthreads();
    SPARQ_MARK(1, 2); // step-1 statistics merged

    const int nvis  = s_nvis;
    float   * dst_u = a.dst + ((int64_t) unit*a.H + kh*G)*a.Dv;
    if (nvis == 0) { // (the same for every block of a cluster)
        for (int e = tid; e < G*a.Dv && blockIdx.x % nc == 0; e += SPARQ_AT_THREADS) {
            dst_u[e] = 0.0f;
        }
#if !defined(GGML_USE_HIP) && !defined(GGML_USE_MUSA) && __CUDA_ARCH__ >= GGML_CUDA_CC_HOPPER
        if (nc > 1) {
            asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
        }
#endif
        return;
    }
    const bool dense = a.k_top >= nvis;

    // sort keys: group-summed softmax + 1 (visible), 0 (masked); non-negative floats order as their bits
    const float * scb = a.sc + ((int64_t) unit*a.H + kh*G)*a.sc_ld;
    // with a cluster (nc > 1) its blocks split the score reads (one SM's L2 bandwidth bounds this pass) and
    // store their keys into block 0's shared memory; block 0 alone goes on
    int        lo   = 0;
    int        hi   = n_kv;
    uint32_t * keys = s_key;
#if !defined(GGML_USE_HIP) && !defined(GGML_USE_MUSA) && __CUDA_ARCH__ >= GGML_CUDA_CC_HOPPER
    cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
    if (nc > 1) {
        asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
        const int per = (n_kv + nc - 1)/nc;
        lo   = min(n_kv, (int) cluster.block_rank()*per);
        hi   = min(n_kv, lo + per);
        keys = cluster.map_shared_rank(s_key, 0);
    }
#endif
    uint32_t tmax = sparq_keys_g<GM>(G, scb, a.sc_ld, lo, hi, dense, s_m, s_rz, keys);
#if !defined(GGML_USE_HIP) && !defined(GGML_USE_MUSA) && __CUDA_ARCH__ >= GGML_CUDA_CC_HOPPER
    if (nc > 1) {
        // thread tid of block 0 takes the maximum over the positions of thread tid in every block: the threads'
        // position sets stay disjoint, which is all the bound below needs
        atomicMax(cluster.map_shared_rank(&s_tmax[tid], 0), tmax);
        cluster.sync(); // block 0 only reads its own shared memory from here: the others may leave
        if (cluster.block_rank() != 0) {
            return;
        }
        tmax = s_tmax[tid];
    }
#endif
    SPARQ_MARK(1, 3); // keys in block 0's shared memory

    int nsel;
    if (dense) {
        __syncthreads();
        nsel = sparq_gather(s_key, n_kv, 0u, 0, s_sel, s_tmp);
    } else {
        // tau: a lower bound of the k-th largest key (see the file header); 1 = every visible key
        const int kw = (a.k_top + SPARQ_AT_WARPS - 1)/SPARQ_AT_WARPS;
        if (kw <= WARP_SIZE) {
            uint32_t v  = tmax;
            uint32_t wt = 0;
            for (int i = 0; i < kw; ++i) {
                wt = sparq_warp_max_u32(v);
                const uint32_t win = __ballot_sync(0xFFFFFFFF, v == wt);
                if (lane == __ffs(win) - 1) {
                    v = 0;
                }
            }
            if (lane == 0) {
                s_wthr[warp] = wt;
            }
        }
        __syncthreads(); // keys and s_wthr
        uint32_t tau = 1u;
        if (kw <= WARP_SIZE) {
            tau = s_wthr[0];
            for (int w = 1; w < SPARQ_AT_WARPS; ++w) {
                tau = min(tau, s_wthr[w]);
            }
            tau = max(tau, 1u);
        }
        // CU keys a lane per round, loaded together, and one shared atomic per warp and round (one per candidate
        // serialized on the counter; one key a lane and round took ~20 instructions a key); rounds are
        // warp-uniform for the ballots
        constexpr int CU = 4;
        const uint32_t lt = (1u << lane) - 1u;
        for (int j0 = warp*CU*WARP_SIZE; j0 < n_kv; j0 += CU*SPARQ_AT_THREADS) {
            uint32_t key[CU];
            uint32_t m[CU];
#pragma unroll
            for (int u = 0; u < CU; ++u) {
                const int j = j0 + u*WARP_SIZE + lane;
                key[u] = j < n_kv ? s_key[j] : 0u;
            }
            int tot = 0;
#pragma unroll
            for (int u = 0; u < CU; ++u) {
                m[u] = __ballot_sync(0xFFFFFFFF, key[u] >= tau); // tau >= 1: never a masked position
                tot += __popc(m[u]);
            }
            if (tot == 0) {
                continue;
            }
            int c0 = 0;
            if (lane == 0) {
                c0 = atomicAdd(&s_ncand, tot);
            }
            int c = __shfl_sync(0xFFFFFFFF, c0, 0);
#pragma unroll
            for (int u = 0; u < CU; ++u) {
                const int j  = j0 + u*WARP_SIZE + lane;
                const int cj = c + __popc(m[u] & lt);
                if (key[u] >= tau && cj < SPARQ_CAND_MAX) {
                    // larger = earlier: key desc, then position asc
                    s_cand[cj] = (uint64_t) key[u] << 32 | (uint32_t) (0xFFFFFFFFu - (uint32_t) j);
                }
                c += __popc(m[u]);
            }
        }
        __syncthreads();
        SPARQ_MARK(1, 4); // candidates above the bound collected
        const int nc = s_ncand; // >= k_top
        if (nc <= SPARQ_CAND_MAX) {
            // exact ranks (distinct): pairs (candidate, segment of the candidates) over the threads
            const int nseg = max(1, SPARQ_AT_THREADS/nc);
            for (int e = tid; e < nc*nseg; e += SPARQ_AT_THREADS) {
                const int      i  = e % nc;
                const int      g  = e / nc;
                const uint64_t ci = s_cand[i];
                const int      c1 = (int) ((int64_t) nc*(g + 1)/nseg);
                int rank = 0;
                for (int c = (int) ((int64_t) nc*g/nseg); c < c1; ++c) {
                    rank += s_cand[c] > ci;
                }
                atomicAdd(&s_rank[i], rank);
            }
            __syncthreads();
            for (int i = tid; i < nc; i += SPARQ_AT_THREADS) {
                const int rank = s_rank[i];
                if (rank < a.k_top) {
                    s_sel[rank] = (int) (0xFFFFFFFFu - (uint32_t) s_cand[i]);
                }
            }
            nsel = a.k_top;
        } else {
            uint32_t thr;
            int      kk;
            sparq_radix_kth(s_key, n_kv, a.k_top, s_hist, s_cnt, &s_prefix, &s_kk, thr, kk);
            nsel = sparq_gather(s_key, n_kv, thr, kk, s_sel, s_tmp);
        }
    }
    __syncthreads();
    SPARQ_MARK(1, 5); // the k positions chosen

    // exact attention over the rows s_sel[0..nsel), SPARQ_AT_CH rows at a time (all 16 warps busy on every row,
    // short dependency chains; one warp per row ran 8 rows back to back and took 17-19 us for 128 rows):
    //  A. scores: 8 lanes per row, 8 consecutive components per lane and load, K rows of SPARQ_AT_RA passes in flight;
    //  B. one warp per head: running max and sum over the chunks, the chunk's probabilities into s_p;
    //  C. P.V: one thread per (pair of V components, subset of the rows), the G heads in registers.
    const bool   blend = !dense && (a.flags & 1) != 0;
    const MT   * mrow  = (const MT *) (a.mask + t*a.m_nb1 + (int64_t) (s % a.m_ne3)*a.m_nb3);
    const char * kb    = a.k + kh*a.k_nb2 + s*a.k_nb3;
    const char * vb    = a.v + kh*a.v_nb2 + s*a.v_nb3;
    SPARQ_MARK(1, 7);
    constexpr int DC = DE/2;                   // 64-component slices of a K row (8 lanes x 8)
    float * s_p = (float *) s_cand;            // [SPARQ_AT_CH][GM] scores, then probabilities (candidates are done)
    const int grp = lane / 8;                  // phase A: row slot of this lane group
    const int sl  = lane % 8;
    const int DP  = (a.Dv + 1)/2;              // phase C: V component pairs
    const int NRS = SPARQ_AT_THREADS / DP;     // row subsets
    const int dp  = tid % DP;
    const int rs  = tid / DP;
    const char * vbd = vb + (int64_t) (2*dp)*a.v_nb0; // this thread's V components in row 0
    const bool   v_two = 2*dp + 1 < a.Dv;
    float al = 0.0f;                           // lane sl < G: alpha of head sl over this lane group's rows
    float cacc[GM][2];
#pragma unroll
    for (int h = 0; h < GM; ++h) {
        cacc[h][0] = cacc[h][1] = 0.0f;
    }
    if (tid < GM) {
        s_mrun[tid] = -INFINITY;
        s_l[tid]    = 0.0f;
    }
    for (int c0 = 0; c0 < nsel; c0 += SPARQ_AT_CH) {
        const int cn = min(SPARQ_AT_CH, nsel - c0);
        // the first VE V rows of this thread's subset are requested before the K rows: phase C then does not wait
        // for memory again (each round trip costs ~3 us in this kernel: phase stamps, H100)
        constexpr int VE = DE <= 4 ? 16 : 8;
        sparq_raw2<KT> ve[VE];
#pragma unroll
        for (int u = 0; u < VE; ++u) {
            const int i = rs + u*NRS;
            if (rs < NRS && i < cn) {
                ve[u] = sparq_ld_v2<KT, VEC>(vbd, a.v_nb1, a.v_nb0, s_sel[c0 + i], v_two);
            }
        }
        // A: scores of the chunk's rows
        sparq_raw8<KT> raw[SPARQ_AT_RA][DC];
        float          mvr[SPARQ_AT_RA];
        int            jr[SPARQ_AT_RA];
#pragma unroll
        for (int b = 0; b < SPARQ_AT_RA; ++b) {
            const int  i  = b*SPARQ_AT_WARPS*4 + warp*4 + grp;
            const bool ok = i < cn;
            const int  j  = s_sel[c0 + (ok ? i : 0)];
            const KT * kr = (const KT *) (kb + (int64_t) j*a.k_nb1);
            jr[b]  = ok ? j : -1;
            mvr[b] = ok ? sparq_f<MT>(mrow[j]) : 0.0f;
#pragma unroll
            for (int c = 0; c < DC; ++c) {
                const int d0 = 64*c + 8*sl;
                if (ok && d0 < a.D) {
                    if constexpr (VEC) {
                        sparq_ld8(raw[b][c], kr + d0);
                    } else {
                        sparq_ld8_row(raw[b][c], kr + d0, a.D - d0);
                    }
                } else {
                    sparq_zero8(raw[b][c]);
                }
            }
        }
#pragma unroll
        for (int b = 0; b < SPARQ_AT_RA; ++b) {
            float part[GM];
#pragma unroll
            for (int h = 0; h < GM; ++h) {
                part[h] = 0.0f;
            }
#pragma unroll
            for (int c = 0; c < DC; ++c) {
                if (64*c < a.D) {
                    float kf[8];
                    sparq_cvt8(raw[b][c], kf);
                    const int d0 = 64*c + 8*sl;
#pragma unroll
                    for (int h = 0; h < GM; ++h) {
                        if (h < G) {
                            const float4 q0 = *(const float4 *) &s_q[h][d0];
                            const float4 q1 = *(const float4 *) &s_q[h][d0 + 4];
                            part[h] += q0.x*kf[0] + q0.y*kf[1] + q0.z*kf[2] + q0.w*kf[3] +
                                       q1.x*kf[4] + q1.y*kf[5] + q1.z*kf[6] + q1.w*kf[7];
                        }
                    }
                }
            }
            float mine = 0.0f; // the dot product of head sl
#pragma unroll
            for (int h = 0; h < GM; ++h) {
                if (h < G) {
#pragma unroll
                    for (int off = 4; off > 0; off >>= 1) {
                        part[h] += __shfl_xor_sync(0xFFFFFFFF, part[h], off, WARP_SIZE);
                    }
                    mine = h == sl ? part[h] : mine;
                }
            }
            if (jr[b] >= 0 && sl < G) {
                s_p[(b*SPARQ_AT_WARPS*4 + warp*4 + grp)*GM + sl] = a.scale*mine + mvr[b];
                if (blend) {
                    al += expf(scb[sl*a.sc_ld + jr[b]] - s_m[sl])*s_rz[sl];
                }
            }
        }
        __syncthreads();
        SPARQ_MARK(1, 8);
        // B: running max and sum per head; s_p becomes exp(score - max)
        for (int h = warp; h < G; h += SPARQ_AT_WARPS) {
            float cm = -INFINITY;
            for (int i = lane; i < cn; i += WARP_SIZE) {
                cm = fmaxf(cm, s_p[i*GM + h]);
            }
            cm = warp_reduce_max<WARP_SIZE>(cm);
            const float mo = s_mrun[h];
            const float mn = fmaxf(mo, cm);
            float sum = 0.0f;
            for (int i = lane; i < cn; i += WARP_SIZE) {
                const float p = mn == -INFINITY ? 0.0f : expf(s_p[i*GM + h] - mn);
                s_p[i*GM + h] = p;
                sum += p;
            }
            sum = warp_reduce_sum<WARP_SIZE>(sum);
            __syncwarp();
            if (lane == 0) {
                const float corr = mn == -INFINITY ? 1.0f : expf(mo - mn);
                s_corr[h] = corr;
                s_l[h]    = s_l[h]*corr + sum;
                s_mrun[h] = mn;
            }
        }
        __syncthreads();
        SPARQ_MARK(1, 9);
        // C: P.V over the chunk
        if (rs < NRS) {
#pragma unroll
            for (int h = 0; h < GM; ++h) {
                if (h < G) {
                    cacc[h][0] *= s_corr[h];
                    cacc[h][1] *= s_corr[h];
                }
            }
#pragma unroll
            for (int u = 0; u < VE; ++u) {
                const int i = rs + u*NRS;
                if (i < cn) {
                    sparq_pv_row(cacc, s_p, i, sparq_cvt2(ve[u]));
                }
            }
            constexpr int VB = 8; // rows past the first VE (few row subsets: Dv > 128): V loads in flight
            for (int i0 = rs + VE*NRS; i0 < cn; i0 += VB*NRS) {
                sparq_raw2<KT> vv[VB];
#pragma unroll
                for (int u = 0; u < VB; ++u) {
                    const int i = i0 + u*NRS;
                    if (i < cn) {
                        vv[u] = sparq_ld_v2<KT, VEC>(vbd, a.v_nb1, a.v_nb0, s_sel[c0 + i], v_two);
                    }
                }
#pragma unroll
                for (int u = 0; u < VB; ++u) {
                    const int i = i0 + u*NRS;
                    if (i < cn) {
                        sparq_pv_row(cacc, s_p, i, sparq_cvt2(vv[u]));
                    }
                }
            }
        }
        __syncthreads(); // s_p is the next chunk's
        SPARQ_MARK(1, 10);
    }
    if (blend) { // the 4 lane groups of a warp first: one shared atomic per warp and head
        al += __shfl_xor_sync(0xFFFFFFFF, al, 8, WARP_SIZE);
        al += __shfl_xor_sync(0xFFFFFFFF, al, 16, WARP_SIZE);
        if (grp == 0 && sl < G) {
            atomicAdd(&s_alpha[sl], al);
        }
    }
    // the row subsets' outputs summed pairwise (float atomics on shared memory are CAS loops, 8-way contended):
    // partials in the candidates' region, free now (SPARQ_CAND_MAX*12 + 4 KiB, enough for G <= 8 at any Dv)
    {
        // f(h, e, o) for this thread's outputs: head h < G, component 2 dp + e < Dv at offset o of a [G][Dv] array
        auto each_out = [&](auto && f) {
#pragma unroll
            for (int h = 0; h < GM; ++h) {
                if (h < G) {
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        if (2*dp + e < a.Dv) {
                            f(h, e, h*a.Dv + 2*dp + e);
                        }
                    }
                }
            }
        };
        float * s_red = (float *) s_cand;
        int n = NRS;
        while (n > 1) {
            const int w = (n + 1)/2;
            if (rs >= w && rs < n) {
                each_out([&](int h, int e, int o) { s_red[(rs - w)*G*a.Dv + o] = cacc[h][e]; });
            }
            __syncthreads();
            if (rs + w < n) {
                each_out([&](int h, int e, int o) { cacc[h][e] += s_red[rs*G*a.Dv + o]; });
            }
            __syncthreads();
            n = w;
        }
        if (rs == 0) {
            each_out([&](int h, int e, int o) { s_y[o] = cacc[h][e]; });
        }
    }
    __syncthreads();

    for (int e = tid; e < G*a.Dv; e += SPARQ_AT_THREADS) {
        const int h = e / a.Dv;
        const int d = e % a.Dv;
        float y = s_y[e]/s_l[h];
        if (blend) {
            const int   tv = a.vm_ne2 == 1 ? 0 : t;
            const int   sv = a.vm_ne3 == 1 ? 0 : s;
            const float vm = *(const float *) (a.vm + (int64_t) d*sizeof(float) + kh*a.vm_nb1 + tv*a.vm_nb2 + sv*a.vm_nb3);
            y = s_alpha[h]*y + (1.0f - s_alpha[h])*vm;
        }
        dst_u[e] = y;
    }
    SPARQ_MARK(1, 6);
}

// ---- split step 2: many blocks per KV head (LLAMA_SPARSE_CUDA_SPARQ_SPLIT=1; measured no faster on the H100) ----
//  2a. sparq_seg_select, grid (segments, KV heads, units): the keys of one segment (as sparq_attend computes them),
//      its top min(k, visible) by (key desc, position asc) (radix select + gather), sorted by exact ranks,
//      written as a descending list. The global top k lies in the union of these lists.
//  2b. sparq_split_attend, same grid: every block loads all lists of its head, ranks its own segment's entries in
//      the union (binary search per other list; entries below the best segment's k-th cannot be chosen), so its
//      chosen rows are a prefix of its list, and runs the exact attention over them: partial (max, sum, output,
//      alpha) per head.
//  2c. sparq_split_combine, grid (q heads, units): merges the partials of the segments, divides, blends mean V.
// Each kernel waits for the one before (PDL sync at its start), so the counts never leave the device.

#define SPARQ_SPLIT_THREADS  256
#define SPARQ_SPLIT_WARPS    (SPARQ_SPLIT_THREADS/WARP_SIZE)
#define SPARQ_COMB_THREADS   128

static_assert(SPARQ_SPLIT_NSEG*SPARQ_SPLIT_SEG_MAX >= SPARQ_CUDA_MAX_NKV, "split segments must cover MAX_NKV");
static_assert(SPARQ_SPLIT_NSEG <= WARP_SIZE, "the combine kernel merges the segments in one warp");
static_assert(SPARQ_SPLIT_THREADS >= 256, "sparq_radix_kth needs 256 threads");

// step-1 softmax statistics of the G heads of (unit, kh): s_m = max, s_rz = 1/sum; *s_nvis = visible positions
static __device__ void sparq_head_stats(const sparq_args & a, const int unit, const int kh, const int G, float * s_m,
        float * s_rz, int * s_nvis) {
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE, nw = blockDim.x / WARP_SIZE;
    for (int h = warp; h < G; h += nw) {
        const float2 * p = a.part + ((int64_t) unit*a.H + kh*G + h)*a.nblk;
        float mx = -INFINITY;
        for (int b = lane; b < a.nblk; b += WARP_SIZE) {
            mx = fmaxf(mx, p[b].x);
        }
        mx = warp_reduce_max<WARP_SIZE>(mx);
        float z = 0.0f;
        for (int b = lane; b < a.nblk; b += WARP_SIZE) {
            z += p[b].x != -INFINITY ? p[b].y*expf(p[b].x - mx) : 0.0f;
        }
        z = warp_reduce_sum<WARP_SIZE>(z);
        if (lane == 0) {
            s_m[h]  = mx;
            s_rz[h] = z > 0.0f ? 1.0f/z : 0.0f;
        }
    }
    if (warp == nw - 1) {
        int c = 0;
        for (int b = lane; b < a.nblk; b += WARP_SIZE) {
            c += a.nvis[(int64_t) unit*a.nblk + b];
        }
        c = warp_reduce_sum<WARP_SIZE>(c);
        if (lane == 0) {
            *s_nvis = c;
        }
    }
}

// keys[j - lo] for j in [lo, hi), the same values as sparq_keys; returns how many of this thread's are visible
template <int G>
static __device__ __forceinline__ int sparq_seg_keys(const float * scb, const int64_t ld, const int lo, const int hi,
        const bool dense, const float * s_m, const float * s_rz, uint32_t * keys) {
    int nv = 0;
#pragma unroll 4
    for (int j = lo + threadIdx.x; j < hi; j += blockDim.x) {
        float p   = 0.0f;
        bool  vis = false;
#pragma unroll
        for (int h = 0; h < G; ++h) {
            const float sv = scb[h*ld + j];
            vis = vis || sv != -INFINITY;
            p  += sv != -INFINITY && !dense ? expf(sv - s_m[h])*s_rz[h] : 0.0f;
        }
        keys[j - lo] = vis ? __float_as_uint(p) + 1u : 0u;
        nv += vis;
    }
    return nv;
}

template <int G>
static __device__ __forceinline__ int sparq_seg_keys_g(const int g, const float * scb, const int64_t ld, const int lo,
        const int hi, const bool dense, const float * s_m, const float * s_rz, uint32_t * keys) {
    return g == G ? sparq_seg_keys<G>(scb, ld, lo, hi, dense, s_m, s_rz, keys) :
                    sparq_seg_keys_g<G - 1>(g, scb, ld, lo, hi, dense, s_m, s_rz, keys);
}

template <>
__device__ __forceinline__ int sparq_seg_keys_g<1>(const int g, const float * scb, const int64_t ld, const int lo,
        const int hi, const bool dense, const float * s_m, const float * s_rz, uint32_t * keys) {
    (void) g;
    return sparq_seg_keys<1>(scb, ld, lo, hi, dense, s_m, s_rz, keys);
}

static __global__ void __launch_bounds__(SPARQ_SPLIT_THREADS) sparq_seg_select(const sparq_args a) {
    __shared__ uint32_t s_key[SPARQ_SPLIT_SEG_MAX];
    __shared__ int      s_sel[SPARQ_CUDA_MAX_KTOP];
    __shared__ uint64_t s_cand[SPARQ_CUDA_MAX_KTOP];
    __shared__ int      s_rank[SPARQ_CUDA_MAX_KTOP];
    __shared__ int      s_hist[4*256];
    __shared__ int      s_cnt[256];
    __shared__ int      s_tmp[WARP_SIZE];
    __shared__ float    s_m[SPARQ_CUDA_MAX_G], s_rz[SPARQ_CUDA_MAX_G];
    __shared__ int      s_nvis, s_nv, s_kk;
    __shared__ uint32_t s_prefix;

    const int seg  = blockIdx.x;
    const int kh   = blockIdx.y;
    const int unit = blockIdx.z;
    const int G    = a.H / a.Hkv;
    const int tid  = threadIdx.x;
    const int lo   = seg*a.seg_len;
    const int hi   = min(a.n_kv, lo + a.seg_len);
    const int n    = hi - lo; // >= 1: nseg = ceil(n_kv / seg_len)

    for (int e = tid; e < a.kseg; e += SPARQ_SPLIT_THREADS) {
        s_rank[e] = 0;
    }
    if (tid == 0) {
        s_nv = 0;
    }
    ggml_cuda_pdl_sync();
    ggml_cuda_pdl_lc();

    sparq_head_stats(a, unit, kh, G, s_m, s_rz, &s_nvis);
    __syncthreads();
    const bool    dense = a.k_top >= s_nvis;
    const float * scb   = a.sc + ((int64_t) unit*a.H + kh*G)*a.sc_ld;
    int nv = sparq_seg_keys_g<SPARQ_CUDA_MAX_G>(G, scb, a.sc_ld, lo, hi, dense, s_m, s_rz, s_key);
    nv = warp_reduce_sum<WARP_SIZE>(nv);
    if (tid % WARP_SIZE == 0 && nv > 0) {
        atomicAdd(&s_nv, nv);
    }
    __syncthreads();

    // this segment's top min(k, visible) in position order (a dense unit has <= k visible: all of them)
    int nsel;
    if (s_nv <= a.k_top) {
        nsel = sparq_gather(s_key, n, 0u, 0, s_sel, s_tmp);
    } else {
        uint32_t thr;
        int      kk;
        sparq_radix_kth(s_key, n, a.k_top, s_hist, s_cnt, &s_prefix, &s_kk, thr, kk);
        nsel = sparq_gather(s_key, n, thr, kk, s_sel, s_tmp);
    }
    __syncthreads();
    for (int i = tid; i < nsel; i += SPARQ_SPLIT_THREADS) {
        const int j = s_sel[i];
        s_cand[i] = (uint64_t) s_key[j] << 32 | (uint32_t) (0xFFFFFFFFu - (uint32_t) (lo + j)); // larger = earlier
    }
    __syncthreads();
    // exact ranks (distinct): pairs (entry, part of the entries) over the threads
    const int nsplit = max(1, SPARQ_SPLIT_THREADS/max(nsel, 1));
    for (int e = tid; e < nsel*nsplit; e += SPARQ_SPLIT_THREADS) {
        const int      i  = e % nsel;
        const int      g  = e / nsel;
        const uint64_t ci = s_cand[i];
        const int      c1 = nsel*(g + 1)/nsplit;
        int rank = 0;
        for (int c = nsel*g/nsplit; c < c1; ++c) {
            rank += s_cand[c] > ci;
        }
        if (rank > 0) {
            atomicAdd(&s_rank[i], rank);
        }
    }
    __syncthreads();
    const int64_t ui  = ((int64_t) unit*a.Hkv + kh)*a.nseg + seg;
    uint64_t    * out = a.cand + ui*a.kseg;
    for (int i = tid; i < nsel; i += SPARQ_SPLIT_THREADS) {
        out[s_rank[i]] = s_cand[i];
    }
    if (tid == 0) {
        a.ccnt[ui] = nsel;
    }
}

// dynamic shared memory of sparq_split_attend: every list of the head
static size_t sparq_split_attend_smem(const sparq_args & a) {
    return (size_t) a.nseg*a.kseg*sizeof(uint64_t);
}

// DE: head elements per lane (D, Dv <= 32*DE); RB: rows a warp loads before using them
template <typename KT, typename MT, int DE>
static __global__ void __launch_bounds__(SPARQ_SPLIT_THREADS, 1) sparq_split_attend(const sparq_args a) {
    constexpr int RB = DE <= 4 ? 4 : 1;
    extern __shared__ __align__(16) char sparq_split_smem[];
    __shared__ float    s_q[SPARQ_CUDA_MAX_G][SPARQ_CUDA_MAX_D];
    __shared__ float    s_y[SPARQ_CUDA_MAX_G*SPARQ_CUDA_MAX_D];
    __shared__ int      s_rank[SPARQ_CUDA_MAX_KTOP];
    __shared__ float    s_m[SPARQ_CUDA_MAX_G], s_rz[SPARQ_CUDA_MAX_G];  // step-1 softmax max, 1/sum
    __shared__ float    s_wm[SPARQ_SPLIT_WARPS][SPARQ_CUDA_MAX_G];      // per warp: running max
    __shared__ float    s_wl[SPARQ_SPLIT_WARPS][SPARQ_CUDA_MAX_G];      // per warp: running sum
    __shared__ float    s_bm[SPARQ_CUDA_MAX_G], s_bl[SPARQ_CUDA_MAX_G]; // block max and sum
    __shared__ float    s_alpha[SPARQ_CUDA_MAX_G];
    __shared__ int      s_cnt[SPARQ_SPLIT_NSEG];
    __shared__ int      s_nvis, s_nrows;
    __shared__ uint64_t s_thr;

    uint64_t * s_list = (uint64_t *) sparq_split_smem; // the head's lists as in global memory: list j at j*kseg

    const int seg  = blockIdx.x;
    const int kh   = blockIdx.y;
    const int unit = blockIdx.z;
    const int t    = unit % a.n_tok;
    const int s    = unit / a.n_tok;
    const int G    = a.H / a.Hkv;
    const int nseg = a.nseg;
    const int tid  = threadIdx.x;
    const int lane = tid % WARP_SIZE;
    const int warp = tid / WARP_SIZE;

    for (int e = tid; e < G*a.Dv; e += SPARQ_SPLIT_THREADS) {
        s_y[e] = 0.0f;
    }
    if (tid < G) {
        s_alpha[tid] = 0.0f;
    }
    if (tid == 0) {
        s_nrows = 0;
    }
    ggml_cuda_pdl_sync();
    ggml_cuda_pdl_lc();

    sparq_load_q(a, kh, t, s, G, s_q);
    sparq_head_stats(a, unit, kh, G, s_m, s_rz, &s_nvis);
    const int64_t ui = ((int64_t) unit*a.Hkv + kh)*nseg;
    if (tid < nseg) {
        s_cnt[tid] = a.ccnt[ui + tid];
    }
    __syncthreads();
    {
        const uint64_t * cl = a.cand + ui*a.kseg;
#pragma unroll 4
        for (int e = tid; e < nseg*a.kseg; e += SPARQ_SPLIT_THREADS) {
            if (e % a.kseg < s_cnt[e / a.kseg]) {
                s_list[e] = cl[e];
            }
        }
    }
    __syncthreads();
    if (tid == 0) {
        // a full list's last entry: k entries are >= it, so anything below the largest such entry is out
        uint64_t thr = 0;
        for (int j = 0; j < nseg; ++j) {
            if (s_cnt[j] == a.k_top) {
                thr = max(thr, s_list[(int64_t) j*a.kseg + a.k_top - 1]);
            }
        }
        s_thr = thr;
    }
    const int        c_own = s_cnt[seg];
    const uint64_t * own   = s_list + (int64_t) seg*a.kseg;
    for (int i = tid; i < c_own; i += SPARQ_SPLIT_THREADS) {
        s_rank[i] = i;
    }
    __syncthreads();
    const uint64_t thr = s_thr;
    // rank in the union = index in the own list + entries above it in every other list
    for (int e = tid; e < c_own*nseg; e += SPARQ_SPLIT_THREADS) {
        const int i = e % c_own;
        const int j = e / c_own;
        const uint64_t ci = own[i];
        if (j == seg || ci < thr) {
            continue;
        }
        const uint64_t * lj = s_list + (int64_t) j*a.kseg;
        int l = 0;
        int h = s_cnt[j];
        while (l < h) { // first entry of the descending list j below ci
            const int mid = (l + h) >> 1;
            if (lj[mid] > ci) {
                l = mid + 1;
            } else {
                h = mid;
            }
        }
        if (l > 0) {
            atomicAdd(&s_rank[i], l);
        }
    }
    __syncthreads();
    // ranks grow along the own list, so the chosen entries (rank < k) are a prefix of it
    {
        int c = 0;
        for (int i = tid; i < c_own; i += SPARQ_SPLIT_THREADS) {
            c += own[i] >= thr && s_rank[i] < a.k_top;
        }
        c = warp_reduce_sum<WARP_SIZE>(c);
        if (lane == 0 && c > 0) {
            atomicAdd(&s_nrows, c);
        }
    }
    __syncthreads();
    const int nrows = s_nrows;

    // exact attention over own[0..nrows): online softmax per warp (K and V of RB rows in flight)
    const bool   blend = a.k_top < s_nvis && (a.flags & 1) != 0;
    const MT   * mrow  = (const MT *) (a.mask + t*a.m_nb1 + (int64_t) (s % a.m_ne3)*a.m_nb3);
    const char * kb    = a.k + kh*a.k_nb2 + s*a.k_nb3;
    const char * vb    = a.v + kh*a.v_nb2 + s*a.v_nb3;
    const float * scb  = a.sc + ((int64_t) unit*a.H + kh*G)*a.sc_ld;
    float m[SPARQ_CUDA_MAX_G], l[SPARQ_CUDA_MAX_G], acc[SPARQ_CUDA_MAX_G][DE];
#pragma unroll
    for (int h = 0; h < SPARQ_CUDA_MAX_G; ++h) {
        m[h] = -INFINITY;
        l[h] = 0.0f;
#pragma unroll
        for (int e = 0; e < DE; ++e) {
            acc[h][e] = 0.0f;
        }
    }
    float al = 0.0f; // lane h < G: alpha of head h over this warp's rows
    // row i0 + warp + b*warps: a block with few rows still gives every warp one
    for (int i0 = 0; i0 < nrows; i0 += SPARQ_SPLIT_WARPS*RB) {
        float kv[RB][DE], vv[RB][DE], mvj[RB], scj[RB];
#pragma unroll
        for (int b = 0; b < RB; ++b) {
            const int  i  = i0 + warp + b*SPARQ_SPLIT_WARPS;
            const bool ok = i < nrows;
            const int  j  = ok ? (int) (0xFFFFFFFFu - (uint32_t) own[i]) : 0;
            const KT * kr = (const KT *) (kb + (int64_t) j*a.k_nb1);
            mvj[b] = ok ? sparq_f<MT>(mrow[j]) : 0.0f;
            scj[b] = ok && blend && lane < G ? scb[lane*a.sc_ld + j] : -INFINITY; // step-1 score of head lane
#pragma unroll
            for (int e = 0; e < DE; ++e) {
                const int d = lane + WARP_SIZE*e;
                kv[b][e] = ok && d < a.D  ? sparq_f<KT>(kr[d]) : 0.0f;
                vv[b][e] = ok && d < a.Dv ? sparq_f<KT>(*(const KT *) (vb + (int64_t) d*a.v_nb0 + (int64_t) j*a.v_nb1)) : 0.0f;
            }
        }
#pragma unroll
        for (int b = 0; b < RB; ++b) {
            if (i0 + warp + b*SPARQ_SPLIT_WARPS >= nrows) {
                break;
            }
            sparq_online_row<DE>(s_q, kv[b], vv[b], a.scale, mvj[b], G, lane, m, l, acc);
            if (blend && lane < G) {
                al += expf(scj[b] - s_m[lane])*s_rz[lane];
            }
        }
    }
    if (lane == 0) {
#pragma unroll
        for (int h = 0; h < SPARQ_CUDA_MAX_G; ++h) {
            if (h < G) {
                s_wm[warp][h] = m[h];
                s_wl[warp][h] = l[h];
            }
        }
    }
    if (blend && lane < G && al != 0.0f) {
        atomicAdd(&s_alpha[lane], al);
    }
    __syncthreads();
#pragma unroll
    for (int h = 0; h < SPARQ_CUDA_MAX_G; ++h) {
        if (h >= G) {
            break;
        }
        float mb = -INFINITY;
        for (int w = 0; w < SPARQ_SPLIT_WARPS; ++w) {
            mb = fmaxf(mb, s_wm[w][h]);
        }
        if (m[h] != -INFINITY) { // a warp without rows adds nothing (and a block without rows has mb = -inf)
            const float f = expf(m[h] - mb);
#pragma unroll
            for (int e = 0; e < DE; ++e) {
                const int d = lane + WARP_SIZE*e;
                if (d < a.Dv) {
                    atomicAdd(&s_y[h*a.Dv + d], acc[h][e]*f);
                }
            }
        }
        if (tid == h) {
            float lb = 0.0f;
            for (int w = 0; w < SPARQ_SPLIT_WARPS; ++w) {
                lb += s_wm[w][h] != -INFINITY ? s_wl[w][h]*expf(s_wm[w][h] - mb) : 0.0f;
            }
            s_bm[h] = mb;
            s_bl[h] = lb;
        }
    }
    __syncthreads();

    // partials of this segment; every block writes all of its own (rows or not)
    if (tid < G) {
        a.pml[((int64_t) unit*a.H + kh*G + tid)*nseg + seg] = make_float4(s_bm[tid], s_bl[tid], s_alpha[tid], 0.0f);
    }
    for (int e = tid; e < G*a.Dv; e += SPARQ_SPLIT_THREADS) {
        const int h = e / a.Dv;
        const int d = e % a.Dv;
        a.pacc[(((int64_t) unit*a.H + kh*G + h)*nseg + seg)*a.Dv + d] = s_y[e];
    }
}

static __global__ void __launch_bounds__(SPARQ_COMB_THREADS) sparq_split_combine(const sparq_args a) {
    __shared__ float s_f[SPARQ_SPLIT_NSEG];
    __shared__ float s_inv, s_alpha;
    __shared__ int   s_nvis;

    const int h    = blockIdx.x;
    const int unit = blockIdx.y;
    const int t    = unit % a.n_tok;
    const int s    = unit / a.n_tok;
    const int G    = a.H / a.Hkv;
    const int kh   = h / G;
    const int tid  = threadIdx.x;
    const int lane = tid % WARP_SIZE;

    ggml_cuda_pdl_sync();
    ggml_cuda_pdl_lc();

    const int64_t uh = (int64_t) unit*a.H + h;
    if (tid < WARP_SIZE) {
        const float4 p = lane < a.nseg ? a.pml[uh*a.nseg + lane] : make_float4(-INFINITY, 0.0f, 0.0f, 0.0f);
        const float  mx = warp_reduce_max<WARP_SIZE>(p.x);
        const float  f  = p.x != -INFINITY ? expf(p.x - mx) : 0.0f;
        const float  lb = warp_reduce_sum<WARP_SIZE>(p.y*f);
        const float  al = warp_reduce_sum<WARP_SIZE>(p.z);
        int c = 0;
        for (int b = lane; b < a.nblk; b += WARP_SIZE) {
            c += a.nvis[(int64_t) unit*a.nblk + b];
        }
        c = warp_reduce_sum<WARP_SIZE>(c);
        if (lane < a.nseg) {
            s_f[lane] = f;
        }
        if (lane == 0) {
            s_inv   = lb > 0.0f ? 1.0f/lb : 0.0f; // no visible position: zeros
            s_alpha = al;
            s_nvis  = c;
        }
    }
    __syncthreads();
    const bool    blend = a.k_top < s_nvis && (a.flags & 1) != 0;
    const float * pa    = a.pacc + uh*a.nseg*a.Dv;
    for (int d = tid; d < a.Dv; d += SPARQ_COMB_THREADS) {
        // every segment's load in flight before the sum (a segment without rows wrote zeros, f = 0)
        float v[SPARQ_SPLIT_NSEG];
#pragma unroll
        for (int i = 0; i < SPARQ_SPLIT_NSEG; ++i) {
            v[i] = i < a.nseg ? pa[(int64_t) i*a.Dv + d] : 0.0f;
        }
        float y = 0.0f;
#pragma unroll
        for (int i = 0; i < SPARQ_SPLIT_NSEG; ++i) {
            y += i < a.nseg ? v[i]*s_f[i] : 0.0f;
        }
        y *= s_inv;
        if (blend) {
            const int   tv = a.vm_ne2 == 1 ? 0 : t;
            const int   sv = a.vm_ne3 == 1 ? 0 : s;
            const float vm = *(const float *) (a.vm + (int64_t) d*sizeof(float) + kh*a.vm_nb1 + tv*a.vm_nb2 + sv*a.vm_nb3);
            y = s_alpha*y + (1.0f - s_alpha)*vm;
        }
        a.dst[uh*a.Dv + d] = y;
    }
}

// the warp sums of GM values a lane (d[h]: this lane's part of head h's dot product), every lane getting all GM:
// reduce-scatter over lane bits 16, 8(, 4) (each step halves the values a lane holds: GM/2 + GM/4 (+ 1) shuffles),
// the plain butterfly on the lower bits, then one broadcast a head. GM 4: 10 shuffles, 7 deep, against 20 for
// four warp_reduce_sum (GM 8: 17 against 40)
template <int GM>
static __device__ __forceinline__ void sparq_warp_sum_heads(float (&d)[GM]) {
    static_assert(GM == 4 || GM == 8, "heads a group: 4 or 8");
    constexpr int LG = GM == 4 ? 2 : 3;
    const int lane = threadIdx.x % WARP_SIZE;
    float v[GM];
#pragma unroll
    for (int h = 0; h < GM; ++h) {
        v[h] = d[h];
    }
    // after the step on bit 16 >> i, v[j] holds head j + (lane & bit ? n : 0) of what was left, n halving each step;
    // so v[0] ends as the head numbered by lane bits 4, 3 (, 2) read in that order: lane / (32 / GM)
#pragma unroll
    for (int i = 0; i < LG; ++i) {
        const int  bit = 16 >> i;
        const int  n   = GM >> (i + 1);
        const bool hi  = (lane & bit) != 0;
#pragma unroll
        for (int j = 0; j < n; ++j) {
            const float send = hi ? v[j] : v[j + n];
            const float keep = hi ? v[j + n] : v[j];
            v[j] = keep + __shfl_xor_sync(0xFFFFFFFF, send, bit);
        }
    }
#pragma unroll
    for (int bit = 16 >> LG; bit > 0; bit >>= 1) {
        v[0] += __shfl_xor_sync(0xFFFFFFFF, v[0], bit);
    }
#pragma unroll
    for (int h = 0; h < GM; ++h) {
        d[h] = __shfl_sync(0xFFFFFFFF, v[0], h*(WARP_SIZE/GM));
    }
}

// ---- fused: the whole op in one thread block cluster per (KV head, unit) (sm_90; f16 K/V; D = Dv = 64 or 128) ----
// The single and split variants pay for their step-1 kernel, a round trip of the scores through L2 and a step 2
// that selects and attends in one block per KV head: ~24 us even at 256 positions (H100). Here the nb blocks of a
// cluster each own a range of P positions and keep everything about them in shared memory:
//  1. q, i1 and the coefficients (every block), the approximate scores of its positions (r rows of k_t) and their
//     softmax statistics; the blocks exchange the statistics (distributed shared memory, one cluster barrier);
//  2. sort keys as the other variants make them; the k-th largest key by a radix select over the whole cluster:
//     12-bit digits, each block adding its histogram into block 0's (two passes, a third on the low 8 bits only
//     when the bin that holds the k-th key holds others too), then ties by position across the blocks;
//     each block keeps its positions with larger keys;
//  3. exact attention of each block over its own chosen positions (a warp per row, online softmax), the blocks'
//     partial (max, sum, output, alpha) merged by block 0.
// k >= the visible count takes every visible position (dense, no blend), as the other variants. Shared memory
// bounds the positions a block holds (G = 4: all 45056 in 8 blocks; larger G fewer: the single variant runs then).
// Larger clusters (non-portable sizes 12 and 16, where all clusters of the launch fit at once) give each block fewer
// positions: the k_t pass, which only the clusters' SMs stream, then runs on more SMs.
// Measured on the H100 (test_sparq_cuda bench, Llama-3-8B shapes, r 32, k 128): 20.7 / 25.3 / 32.1 us at 4k / 16k /
// 32k against the single variant's 27.5 / 30.0 / 39.9 (bench/results/cuda_h100_2026-11-26a.md).
#define SPARQ_FU_THREADS 512
#define SPARQ_FU_WARPS   (SPARQ_FU_THREADS/WARP_SIZE)
#define SPARQ_FU_NB_MAX  16                          // blocks per cluster: the largest of 16, 12 and 8 (the portable size)
                                                    // at which every cluster of the launch is resident at once (16 with
                                                    // a second wave measured slower than 8 on the H100)
#define SPARQ_FU_BITS    12
#define SPARQ_FU_BINS    (1 << SPARQ_FU_BITS)
#define SPARQ_FU_HIST    (SPARQ_FU_BINS + SPARQ_FU_BINS/64)   // a pass's bins and coarse bins in block 0
#define SPARQ_FU_HIST_ALL (2*SPARQ_FU_HIST + 256 + 4)         // passes 1, 2 and 3
#ifndef SPARQ_FU_BATCH
#define SPARQ_FU_BATCH   8                         // k_t rows a thread holds in the score pass (two halves in turn;
                                                   // 12 and 16 ran slower on the H200: 128 registers and spills)
#endif

// dynamic shared memory of the fused kernel, in 4-byte words: [A: RG x G x P scores, later the warps' partial
// outputs] [keys P] [chosen positions P] [local histogram BINS] [block 0: the passes' histograms] [block 0: the
// blocks' partial outputs NB x G x Dv]
struct sparq_fu_layout {
    int nb, P, rg;
    int key, sel, lh, hist, red, total; // word offsets; total words
};

static sparq_fu_layout sparq_fu_plan_layout(const int n_kv, const int G, const int Dv, const int nb_max) {
    sparq_fu_layout l;
    l.nb = std::max(1, std::min(nb_max, (n_kv + 511)/512));
    l.P  = ((n_kv + l.nb - 1)/l.nb + 7) & ~7;
    const int pg = l.P/8;
    l.rg = 8;
    while (l.rg > 1 && pg*l.rg > SPARQ_FU_THREADS) {
        l.rg /= 2;
    }
    const int a = std::max(l.rg*G*l.P, SPARQ_FU_WARPS*G*Dv);
    l.key   = a;
    l.sel   = l.key + l.P;
    l.lh    = l.sel + l.P;
    l.hist  = l.lh + SPARQ_FU_BINS;
    l.red   = l.hist + SPARQ_FU_HIST_ALL;
    l.total = l.red + l.nb*G*Dv;
    return l;
}

// one radix pass over the cluster: the keys k != 0 of this block with (k & pmask) == prefix counted by bin
// (k >> shift) & (NBINS - 1) into block 0's histogram h0 (zero before): NBINS bins, then NBINS/64 coarse bins of 64.
// After the cluster barrier warp 0 of every block finds, counting from the top, the coarse bin and then the bin
// where the want-th key lies (two remote reads of at most 64 counts: each block reading all 4096 bins of block 0,
// even coalesced, held the pass at ~4 us on the H100). Returns the bin; want becomes the rank inside it, cnt its
// count. Every block computes the same from the same histogram.
// (stamp: the first of three phase stamps: histogram, push, barrier done)
template <int NBINS>
static __device__ __noinline__ int sparq_fu_pass(const uint32_t * s_key, const int P, const int shift, const uint32_t pmask,
        const uint32_t prefix, int * s_lh, int * h0, int & want, int & cnt, int * s_res, const int stamp) {
    GGML_UNUSED(stamp);
    constexpr int NC = NBINS/64;
    static_assert(NC >= 1 && NC <= 64, "coarse bins: two a lane");
    const int tid  = threadIdx.x;
    const int lane = tid % WARP_SIZE;
    const int warp = tid / WARP_SIZE;
    // s_lh[0, NBINS) is zero here: cleared before the first pass, then by the warp that pushes each bin
#pragma unroll 1
    for (int jl = tid; jl < P; jl += SPARQ_FU_THREADS) {
        const uint32_t key = s_key[jl];
        if (key != 0 && (key & pmask) == prefix) {
            atomicAdd(&s_lh[(key >> shift) & (NBINS - 1)], 1);
        }
    }
    __syncthreads();
    SPARQ_MARK_B0(stamp);
    // warp w pushes coarse bins w, w + WARPS, ...: its 64 bins (two a lane, cleared for the next pass) and their sum
#pragma unroll 1
    for (int cb = warp; cb < NC; cb += SPARQ_FU_WARPS) {
        const int c0 = s_lh[64*cb + lane];
        const int c1 = s_lh[64*cb + WARP_SIZE + lane];
        if (__ballot_sync(0xFFFFFFFF, (c0 | c1) != 0) == 0) {
            continue; // empty (most coarse bins of the first pass): no clears, no reduction
        }
        s_lh[64*cb + lane]             = 0;
        s_lh[64*cb + WARP_SIZE + lane] = 0;
        if (c0 != 0) {
            atomicAdd(h0 + 64*cb + lane, c0);
        }
        if (c1 != 0) {
            atomicAdd(h0 + 64*cb + WARP_SIZE + lane, c1);
        }
        const int sum = warp_reduce_sum<WARP_SIZE>(c0 + c1);
        if (lane == 0 && sum != 0) {
            atomicAdd(h0 + NBINS + cb, sum);
        }
    }
    SPARQ_MARK_B0(stamp + 1);
    cooperative_groups::this_cluster().sync();
    SPARQ_MARK_B0(stamp + 2);
    if (warp == 0) {
        // level 0: lane holds coarse bins NC-1 - 2 lane and the one below (descending); level 1: the 64 bins of the
        // coarse bin found, likewise. top: the level's top bin (the coarse bins sit past the NBINS fine ones in h0)
        int top = NC - 1;
        int w   = want;
#pragma unroll
        for (int level = 0; level < 2; ++level) {
            const int n  = level == 0 ? NC : 64;
            const int hb = level == 0 ? NBINS + top : top;
            const int i0 = 2*lane, i1 = 2*lane + 1;
            const int c0 = i0 < n ? h0[hb - i0] : 0;
            const int c1 = i1 < n ? h0[hb - i1] : 0;
            const int incl = warp_prefix_inclusive_sum<int>(c0 + c1);
            const int excl = incl - c0 - c1;
            const bool here = excl < w && w <= incl;
            const int src = __ffs(__ballot_sync(0xFFFFFFFF, here)) - 1;
            const bool lo = w <= excl + c0;
            const int  i  = __shfl_sync(0xFFFFFFFF, lo ? i0 : i1, src);
            const int  ab = __shfl_sync(0xFFFFFFFF, lo ? excl : excl + c0, src); // keys above the bin found
            const int  cc = __shfl_sync(0xFFFFFFFF, lo ? c0 : c1, src);
            w -= ab;
            if (level == 0) {
                top = 64*(top - i) + 63;
            } else if (lane == 0) {
                s_res[0] = top - i;
                s_res[1] = w;
                s_res[2] = cc;
            }
        }
    }
    __syncthreads();
    want = s_res[1];
    cnt  = s_res[2];
    return s_res[0]; // (s_res is rewritten only after the next cluster barrier, which every thread reaches after this)
}

// DE: D/32 components a lane in the exact attention (2 or 4); GM: heads per group the registers are sized for
// KQ8: k_t is the Q8_0 copy (else f16)
template <typename MT, int DE, int GM, bool KQ8>
static __global__ void __launch_bounds__(SPARQ_FU_THREADS, 1) sparq_fused(const sparq_args a, const sparq_fu_layout L) {
#if defined(SPARQ_CLUSTER_AVAILABLE) && __CUDA_ARCH__ >= GGML_CUDA_CC_HOPPER
    extern __shared__ __align__(16) char sparq_smem[];
    __shared__ __align__(16) float s_q[GM][SPARQ_CUDA_MAX_D];
    __shared__ __align__(16) float s_abs[SPARQ_CUDA_MAX_D];
    __shared__ int   s_i1[SPARQ_CUDA_MAX_D];
    __shared__ float s_coef[SPARQ_CUDA_MAX_D][GM];
    __shared__ float s_wm[SPARQ_FU_WARPS][GM], s_wz[SPARQ_FU_WARPS][GM], s_wa[SPARQ_FU_WARPS][GM];
    __shared__ int   s_wn[SPARQ_FU_WARPS];
    __shared__ float s_bm[GM], s_bz[GM];           // this block's statistics (read by the others)
    __shared__ int   s_bn, s_beq;                  // its visible count, its keys equal to the k-th (ties)
    __shared__ float s_M[GM], s_rz[GM];            // the cluster's: max, 1/sum
    __shared__ int   s_nvt;
    __shared__ float s_rm[SPARQ_FU_NB_MAX][GM], s_rl[SPARQ_FU_NB_MAX][GM], s_ra[SPARQ_FU_NB_MAX][GM]; // block 0
    __shared__ int   s_tmp[WARP_SIZE], s_res[3];
    __shared__ int   s_nsel, s_off[SPARQ_FU_NB_MAX + 1]; // balanced step 3: this block's chosen count (read by the
                                                         // others); the cluster's prefix

    cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
    const int nb   = L.nb;
    const int rank = (int) cluster.block_rank();
    const int kh   = blockIdx.x / nb;
    const int unit = blockIdx.y;
    const int t    = unit % a.n_tok;
    const int s    = unit / a.n_tok;
    const int G    = a.H / a.Hkv;
    const int D    = a.D;
    const int rr   = min(a.r, D);
    const int tid  = threadIdx.x;
    const int lane = tid % WARP_SIZE;
    const int warp = tid / WARP_SIZE;
    const int P    = L.P;
    const int lo   = rank*P;                       // this block's positions: lo + [0, P), those < n_kv
    const int n_kv = a.n_kv;

    float    * s_a    = (float *) sparq_smem;      // [RG][G][P] partial scores; [0][G][P] the scores
    uint32_t * s_key  = (uint32_t *) sparq_smem + L.key;
    int      * s_sel  = (int *) sparq_smem + L.sel;
    int      * s_lh   = (int *) sparq_smem + L.lh;
    int      * s_hist = (int *) sparq_smem + L.hist;
    float    * s_red  = (float *) sparq_smem + L.red;

    // block 0's histograms take the others' atomics after the first cluster barrier; the local one is clear
    // (s_lh, then s_hist: one range, 16 bytes a store)
    static_assert((SPARQ_FU_BINS + SPARQ_FU_HIST_ALL) % 4 == 0, "whole int4 stores");
    for (int e = tid; e < (SPARQ_FU_BINS + SPARQ_FU_HIST_ALL)/4; e += SPARQ_FU_THREADS) {
        ((int4 *) s_lh)[e] = make_int4(0, 0, 0, 0);
    }
    SPARQ_MARK_FU(0);
    ggml_cuda_pdl_sync();
    ggml_cuda_pdl_lc();
    SPARQ_MARK_FU(1);
    // balanced step 3: the hint of the last launch on these caches, read before any block of the cluster rewrites it
    // (after the cluster barriers of step 1)
    int * const hint      = a.balance && nb > 1 && a.bhint != nullptr ? a.bhint + (int64_t) unit*a.Hkv + kh : nullptr;
    const bool  hint_skip = hint != nullptr && __ldcg(hint) == 1;

    const MT * mrow = (const MT *) (a.mask + t*a.m_nb1 + (int64_t) (s % a.m_ne3)*a.m_nb3);
    sparq_load_q(a, kh, t, s, G, s_q);
    // block 0: the mean of V of this thread's output element, for the blend, requested now: a load still in flight
    // at a cluster barrier holds the barrier's release until it lands (before, issued ahead of the last barrier, it
    // added its whole latency there)
    const int tv = a.vm_ne2 == 1 ? 0 : t;
    const int sv = a.vm_ne3 == 1 ? 0 : s;
    const char * vmb = (a.flags & 1) != 0 ? a.vm + kh*a.vm_nb1 + tv*a.vm_nb2 + sv*a.vm_nb3 : nullptr;
    const float vm0 = vmb != nullptr && rank == 0 && tid < G*a.Dv ?
        *(const float *) (vmb + (int64_t) (tid % a.Dv)*sizeof(float)) : 0.0f;
    __syncthreads();
    SPARQ_MARK_FU(11);
    sparq_i1_coef<SPARQ_FU_THREADS, GM>(a, G, s_q, s_abs, (int *) sparq_smem, s_i1, s_coef); // ranks: in s_a (free until step 1)
    SPARQ_MARK_FU(2);

    // 1. approximate scores: item (g, pg) = positions lo + 8 pg .. +7 and the rows g, g + RG, ... of the r; the
    // items of row group 0 add the mask (-inf where not visible). Loops over run-time counts stay rolled: this code
    // runs once per block, and unrolled it waits on instruction fetch
    {
        // rows in flight per thread (fewer for the 8-bit copy's wider raw rows at GM 8: no spills)
        constexpr int BATCH = GM <= 4 ? SPARQ_FU_BATCH : KQ8 ? SPARQ_FU_BATCH/4 : SPARQ_FU_BATCH/2;
        const int RG = L.rg;
        const int PG = P/8;
        const char * ktb = a.kt + kh*a.kt_nb2 + s*a.kt_nb3;
#pragma unroll 1
        for (int it = tid; it < PG*RG; it += SPARQ_FU_THREADS) {
            const int pg = it % PG;
            const int g  = it / PG;
            const int j0 = lo + 8*pg;
            float mv[8];
#pragma unroll
            for (int u = 0; u < 8; ++u) {
                mv[u] = g == 0 && j0 + u < n_kv ? sparq_f<MT>(mrow[j0 + u]) : -INFINITY;
            }
            float acc[GM][8];
#pragma unroll
            for (int h = 0; h < GM; ++h) {
#pragma unroll
                for (int u = 0; u < 8; ++u) {
                    acc[h][u] = 0.0f;
                }
            }
            // Q8_0: n_kv % 32 == 0, so every run of 8 below n_kv is whole, and kp is the row start (sparq_ld8_kt)
            using RAW = std::conditional_t<KQ8, sparq_raw8q, sparq_raw8<half>>;
            const char * kp = ktb + (KQ8 ? 0 : (int64_t) j0*sizeof(half));
            if (j0 + 8 <= n_kv) {
                // two half batches in turn: the next one's rows are requested before this one's products (against
                // whole batches one after another: 25.3 / 32.1 against 26.2 / 34.2 us at 16k / 32k, H100)
                constexpr int HB = BATCH/2;
                RAW ra[HB], rb[HB];
                auto load = [&](RAW (&r)[HB], const int c0) {
#pragma unroll
                    for (int u = 0; u < HB; ++u) {
                        if (c0 + RG*u < rr) {
                            sparq_ld8_kt(r[u], kp + (int64_t) s_i1[c0 + RG*u]*a.kt_nb1, j0);
                        }
                    }
                };
                auto prod = [&](const RAW (&r)[HB], const int c0) {
#pragma unroll
                    for (int u = 0; u < HB; ++u) {
                        if (c0 + RG*u < rr) {
                            float kv[8];
                            sparq_cvt8(r[u], kv);
                            sparq_fma_row(acc, kv, s_coef[c0 + RG*u], G);
                        }
                    }
                };
                load(ra, g);
#pragma unroll 1
                for (int c0 = g; c0 < rr; c0 += 2*RG*HB) {
                    load(rb, c0 + RG*HB);
                    prod(ra, c0);
                    load(ra, c0 + 2*RG*HB);
                    prod(rb, c0 + RG*HB);
                }
            } else if (!KQ8 && j0 < n_kv) {
#pragma unroll 1
                for (int c = g; c < rr; c += RG) {
                    const half * row = (const half *) (kp + (int64_t) s_i1[c]*a.kt_nb1);
                    float kv[8];
#pragma unroll
                    for (int u = 0; u < 8; ++u) {
                        kv[u] = j0 + u < n_kv ? __half2float(row[u]) : 0.0f;
                    }
                    sparq_fma_row(acc, kv, s_coef[c], G);
                }
            }
#pragma unroll
            for (int h = 0; h < GM; ++h) {
                if (h < G) {
                    if (g == 0) {
#pragma unroll
                        for (int u = 0; u < 8; ++u) {
                            acc[h][u] = mv[u] != -INFINITY ? acc[h][u] + mv[u] : -INFINITY;
                        }
                    }
                    float4 * o = (float4 *) &s_a[(g*G + h)*P + 8*pg];
                    o[0] = make_float4(acc[h][0], acc[h][1], acc[h][2], acc[h][3]);
                    o[1] = make_float4(acc[h][4], acc[h][5], acc[h][6], acc[h][7]);
                }
            }
        }
        __syncthreads();
        SPARQ_MARK_FU(9);
        // the row groups summed into [0]; the block's (max, sum of exp) per head, online in one pass, four positions
        // at a time (one rescale per four), and the visible count (P % 8 == 0: whole float4)
        float m[GM], z[GM];
        int   nv = 0;
#pragma unroll
        for (int h = 0; h < GM; ++h) {
            m[h] = -INFINITY;
            z[h] = 0.0f;
        }
#pragma unroll 1
        for (int j4 = tid; j4 < P/4; j4 += SPARQ_FU_THREADS) {
#pragma unroll
            for (int h = 0; h < GM; ++h) {
                if (h < G) {
                    float4 v = ((const float4 *) (s_a + h*P))[j4];
#pragma unroll 1
                    for (int g = 1; g < RG; ++g) {
                        const float4 w = ((const float4 *) (s_a + (g*G + h)*P))[j4];
                        v.x += w.x;
                        v.y += w.y;
                        v.z += w.z;
                        v.w += w.w;
                    }
                    ((float4 *) (s_a + h*P))[j4] = v;
                    const float mx = fmaxf(fmaxf(v.x, v.y), fmaxf(v.z, v.w));
                    if (mx != -INFINITY) {
                        const float mn = fmaxf(m[h], mx); // m = -inf first: z is 0
                        z[h] = z[h]*expf(m[h] - mn) + ((expf(v.x - mn) + expf(v.y - mn)) + (expf(v.z - mn) + expf(v.w - mn)));
                        m[h] = mn;
                    }
                    if (h == 0) { // the mask hides a position from every head
                        nv += (v.x != -INFINITY) + (v.y != -INFINITY) + (v.z != -INFINITY) + (v.w != -INFINITY);
                    }
                }
            }
        }
        // (max, sum) merged over the warp, then over the warps by warp 0
        auto merge = [](float & mm, float & zz) {
            const float mx = warp_reduce_max<WARP_SIZE>(mm);
            zz = warp_reduce_sum<WARP_SIZE>(mm == -INFINITY ? 0.0f : zz*expf(mm - mx));
            mm = mx;
        };
#pragma unroll
        for (int h = 0; h < GM; ++h) {
            merge(m[h], z[h]);
            if (lane == 0 && h < G) {
                s_wm[warp][h] = m[h];
                s_wz[warp][h] = z[h];
            }
        }
        nv = warp_reduce_sum<WARP_SIZE>(nv);
        if (lane == 0) {
            s_wn[warp] = nv;
        }
        __syncthreads();
        if (warp == 0) {
#pragma unroll
            for (int h = 0; h < GM; ++h) {
                float mm = lane < SPARQ_FU_WARPS && h < G ? s_wm[lane][h] : -INFINITY;
                float zz = lane < SPARQ_FU_WARPS && h < G ? s_wz[lane][h] : 0.0f;
                merge(mm, zz);
                if (lane == 0 && h < G) {
                    s_bm[h] = mm;
                    s_bz[h] = zz;
                }
            }
            const int n = warp_reduce_sum<WARP_SIZE>(lane < SPARQ_FU_WARPS ? s_wn[lane] : 0);
            if (lane == 0) {
                s_bn = n;
            }
        }
    }
    SPARQ_MARK_FU(3);
    cluster.sync(); // every block's statistics (and block 0's zeroed histograms) visible in the cluster

    // the cluster's statistics: warp h merges the blocks' (max, sum) of head h in a fixed order (the same in
    // every block), the last warp the visible counts
    if (warp < G) {
        float mb = -INFINITY, zb = 0.0f;
        if (lane < nb) {
            mb = *cluster.map_shared_rank(&s_bm[warp], lane);
            zb = *cluster.map_shared_rank(&s_bz[warp], lane);
        }
        const float mm = warp_reduce_max<WARP_SIZE>(mb);
        const float zz = warp_reduce_sum<WARP_SIZE>(mb == -INFINITY ? 0.0f : zb*expf(mb - mm));
        if (lane == 0) {
            s_M[warp]  = mm;
            s_rz[warp] = zz > 0.0f ? 1.0f/zz : 0.0f;
        }
    } else if (warp == SPARQ_FU_WARPS - 1) {
        const int n = warp_reduce_sum<WARP_SIZE>(lane < nb ? *cluster.map_shared_rank(&s_bn, lane) : 0);
        if (lane == 0) {
            s_nvt = n;
        }
    }
    __syncthreads();
    const int nvt = s_nvt;
    float * dst_u = a.dst + ((int64_t) unit*a.H + kh*G)*a.Dv;
    if (nvt == 0) {
        for (int e = tid; e < G*a.Dv && rank == 0; e += SPARQ_FU_THREADS) {
            dst_u[e] = 0.0f;
        }
        cluster.sync(); // no block leaves while another may still read its statistics
        return;
    }
    const bool dense = a.k_top >= nvt;
    const bool blend = !dense && (a.flags & 1) != 0;

    // 2. sort keys (as sparq_keys: group-summed softmax, bits of a non-negative float + 1; 0 = masked)
    // (four positions a thread at a time)
#pragma unroll 1
    for (int j4 = tid; j4 < P/4; j4 += SPARQ_FU_THREADS) {
        float p[4]   = { 0.0f, 0.0f, 0.0f, 0.0f };
        bool  vis[4] = { false, false, false, false };
#pragma unroll
        for (int h = 0; h < GM; ++h) {
            if (h < G) {
                const float4 v4    = ((const float4 *) (s_a + h*P))[j4];
                const float  sv[4] = { v4.x, v4.y, v4.z, v4.w };
                const float  M     = s_M[h];
                const float  rz    = s_rz[h];
#pragma unroll
                for (int u = 0; u < 4; ++u) {
                    vis[u] = vis[u] || sv[u] != -INFINITY;
                    p[u]  += sv[u] != -INFINITY && !dense ? expf(sv[u] - M)*rz : 0.0f;
                }
            }
        }
        uint4 k4;
        k4.x = vis[0] ? __float_as_uint(p[0]) + 1u : 0u;
        k4.y = vis[1] ? __float_as_uint(p[1]) + 1u : 0u;
        k4.z = vis[2] ? __float_as_uint(p[2]) + 1u : 0u;
        k4.w = vis[3] ? __float_as_uint(p[3]) + 1u : 0u;
        ((uint4 *) s_key)[j4] = k4;
    }
    __syncthreads();
    SPARQ_MARK_FU(4);

    // the k-th largest key thr; ties: how many keys equal to thr are taken (in position order over the cluster)
    uint32_t thr  = 1u;    // dense: every visible position (key >= 1)
    bool     ties = false;
    int      want = a.k_top;
    if (!dense) {
        int * h0 = cluster.map_shared_rank(s_hist, 0);
        int cnt;
        // (phase stamps 12-14, 21 / 15-17, 22 / 18-20: the passes' histogram, push, barrier, find)
        const int d1 = sparq_fu_pass<SPARQ_FU_BINS>(s_key, P, 20, 0u, 0u, s_lh, h0, want, cnt, s_res, 12);
        SPARQ_MARK_FU(21);
        const uint32_t p1 = (uint32_t) d1 << 20;
        const int d2 = sparq_fu_pass<SPARQ_FU_BINS>(s_key, P, 8, 0xFFF00000u, p1, s_lh, h0 + SPARQ_FU_HIST, want, cnt,
                                                    s_res, 15);
        SPARQ_MARK_FU(22);
        thr = p1 | (uint32_t) d2 << 8;
        if (cnt != want) { // the bin holds keys past the k-th: their low 8 bits decide
            const int d3 = sparq_fu_pass<256>(s_key, P, 0, 0xFFFFFF00u, thr, s_lh, h0 + 2*SPARQ_FU_HIST, want, cnt,
                                              s_res, 18);
            thr |= (uint32_t) d3;
            ties = cnt != want; // equal keys: the first want of them by position
        }
    }
    SPARQ_MARK_FU(5);

    // this block's chosen positions into s_sel, ascending: thread-contiguous ranges, one block scan
    int n_sel;
    {
        const int per = (P + SPARQ_FU_THREADS - 1)/SPARQ_FU_THREADS;
        const int j0  = min(P, tid*per);
        const int j1  = min(P, j0 + per);
        int eq0 = 0; // ties: cluster-wide rank of the first key equal to thr in this thread's range
        if (ties) {
            int neq = 0;
            for (int jl = j0; jl < j1; ++jl) {
                neq += s_key[jl] == thr;
            }
            int tot;
            eq0 = sparse_block_excl_scan(neq, s_tmp, &tot);
            if (tid == 0) {
                s_beq = tot;
            }
            cluster.sync();
            if (tid == 0) {
                int base = 0;
                for (int b = 0; b < rank; ++b) {
                    base += *cluster.map_shared_rank(&s_beq, b);
                }
                s_res[0] = base;
            }
            __syncthreads();
            eq0 += s_res[0];
        }
        // key above thr, or (ties) equal with a cluster-wide rank below want; e: the running rank
        auto take = [&](const uint32_t key, int & e) {
            return ties ? key > thr || (key == thr && e++ < want) : key >= thr;
        };
        int n = 0;
        for (int jl = j0, e = eq0; jl < j1; ++jl) {
            n += take(s_key[jl], e);
        }
        int o = sparse_block_excl_scan(n, s_tmp, &n_sel);
        for (int jl = j0, e = eq0; jl < j1; ++jl) {
            if (take(s_key[jl], e)) {
                s_sel[o++] = jl;
            }
        }
        __syncthreads();
    }
    SPARQ_MARK_FU(6);

    // 3. exact attention over the chosen rows: warp w takes rows w, w + WARPS, ... two at a time in flight; lane
    // holds components DE*lane .. DE*lane + DE-1 of each row. Balanced (a.balance, the default): block b takes the
    // b-th nb-th of the cluster's chosen positions in (block, position) order, read from their blocks' s_sel (on a
    // real model most chosen positions lie in the most recent block: bench/sparq_chosen_spread.py); else its own.
    // The counts' exchange costs a cluster barrier (~1.5 us, H100), so it runs only where the hint says the last
    // launch on these caches found them uneven; consecutive tokens choose alike (bench/results/cuda_h100_2026-11-26h.md)
    float m[GM], l[GM], al[GM], acc[GM][DE];
#pragma unroll
    for (int h = 0; h < GM; ++h) {
        m[h]  = -INFINITY;
        l[h]  = 0.0f;
        al[h] = 0.0f;
#pragma unroll
        for (int e = 0; e < DE; ++e) {
            acc[h][e] = 0.0f;
        }
    }
    // alpha of this block's chosen positions, whoever attends them (the order of the unbalanced loop below)
    if (blend) {
#pragma unroll 1
        for (int i = warp; i < n_sel; i += SPARQ_FU_WARPS) {
            const int jl = s_sel[i];
#pragma unroll
            for (int h = 0; h < GM; ++h) {
                if (h < G) {
                    al[h] += expf(s_a[h*P + jl] - s_M[h])*s_rz[h];
                }
            }
        }
    }
    const int * rows   = s_sel; // rows[i] + base: position
    int         base   = lo;
    int         n_rows = n_sel;
    // whether a block with cnt of the cluster's n_all chosen rows needs more rounds (2 WARPS rows each) than an even share
    auto over_share = [nb](const int cnt, const int n_all) {
        constexpr int RW = 2*SPARQ_FU_WARPS;
        return (cnt + RW - 1)/RW > ((n_all + nb - 1)/nb + RW - 1)/RW;
    };
    if (hint_skip) {
        // the last launch found the chosen positions spread: each block keeps its own, and one over its share asks the
        // next launch to exchange the counts again
        if (tid == 0 && over_share(n_sel, dense ? nvt : a.k_top)) {
            *hint = 0;
        }
    } else if (a.balance && nb > 1) {
        if (tid == 0) {
            s_nsel = n_sel;
        }
        cluster.sync();
        if (warp == 0) { // the blocks' counts and their inclusive prefix
            const int c = lane < nb ? *cluster.map_shared_rank(&s_nsel, lane) : 0;
            int x = c;
#pragma unroll
            for (int o = 1; o < SPARQ_FU_NB_MAX; o *= 2) {
                const int y = __shfl_up_sync(0xFFFFFFFF, x, o);
                x += lane >= o ? y : 0;
            }
            if (lane < nb) {
                s_off[lane + 1] = x;
            }
            if (lane == 0) {
                s_off[0] = 0;
            }
        }
        __syncthreads();
        const int n_all = s_off[nb];
        int       cmax  = 0; // the busiest block's count
        for (int b = 0; b < nb; ++b) {
            cmax = max(cmax, s_off[b + 1] - s_off[b]);
        }
        const int e0    = (int) ((int64_t) rank*n_all/nb);
        const int e1    = (int) ((int64_t) (rank + 1)*n_all/nb);
        // rows move only when the busiest block is over its share
        const bool uneven = over_share(cmax, n_all);
        if (hint != nullptr && rank == 0 && tid == 0) {
            *hint = uneven ? 0 : 1; // for the next launch
        }
        if (uneven) {
            int * s_own = (int *) s_key; // the keys are dead; <= ceil(n_all/nb) <= P entries
#pragma unroll 1
            for (int i = e0 + tid; i < e1; i += SPARQ_FU_THREADS) {
                int o = 0;
                while (i >= s_off[o + 1]) {
                    ++o;
                }
                s_own[i - e0] = o*P + *cluster.map_shared_rank(&s_sel[i - s_off[o]], o);
            }
            __syncthreads();
            rows   = s_own;
            base   = 0;
            n_rows = e1 - e0;
        }
    }
    {
        const char * kb = a.k + kh*a.k_nb2 + s*a.k_nb3 + (int64_t) (DE*lane)*sizeof(half);
        const char * vb = a.v + kh*a.v_nb2 + s*a.v_nb3 + (int64_t) (DE*lane)*sizeof(half);
        float qv[GM][DE];
#pragma unroll
        for (int h = 0; h < GM; ++h) {
#pragma unroll
            for (int e = 0; e < DE; ++e) {
                qv[h][e] = h < G ? s_q[h][DE*lane + e] : 0.0f;
            }
        }
        using raw_t = typename std::conditional<DE == 4, uint2, uint32_t>::type;
        for (int i0 = warp; i0 < n_rows; i0 += 2*SPARQ_FU_WARPS) {
            raw_t kr[2] = {}, vr[2] = {};
            float mr[2] = { 0.0f, 0.0f };
            int   jr[2];
#pragma unroll
            for (int u = 0; u < 2; ++u) {
                const int i = i0 + u*SPARQ_FU_WARPS;
                jr[u] = i < n_rows ? rows[i] : -1;
                const int j = base + max(jr[u], 0);
                if (jr[u] >= 0) {
                    kr[u] = *(const raw_t *) (kb + (int64_t) j*a.k_nb1);
                    vr[u] = *(const raw_t *) (vb + (int64_t) j*a.v_nb1);
                    mr[u] = sparq_f<MT>(mrow[j]);
                }
            }
#pragma unroll
            for (int u = 0; u < 2; ++u) {
                if (jr[u] < 0) {
                    continue;
                }
                const half * kh2 = (const half *) &kr[u];
                const half * vh2 = (const half *) &vr[u];
                float kf[DE], vf[DE];
#pragma unroll
                for (int e = 0; e < DE; ++e) {
                    kf[e] = __half2float(kh2[e]);
                    vf[e] = __half2float(vh2[e]);
                }
                float dot[GM];
#pragma unroll
                for (int h = 0; h < GM; ++h) {
                    dot[h] = 0.0f;
#pragma unroll
                    for (int e = 0; e < DE; ++e) {
                        dot[h] += qv[h][e]*kf[e]; // (qv is 0 for h >= G)
                    }
                }
                sparq_warp_sum_heads<GM>(dot);
#pragma unroll
                for (int h = 0; h < GM; ++h) {
                    if (h >= G) {
                        break;
                    }
                    const float sc   = a.scale*dot[h] + mr[u];
                    const float mn   = fmaxf(m[h], sc);
                    const float corr = expf(m[h] - mn); // m = -inf first: 0
                    const float p    = expf(sc - mn);
                    l[h] = l[h]*corr + p;
#pragma unroll
                    for (int e = 0; e < DE; ++e) {
                        acc[h][e] = acc[h][e]*corr + p*vf[e];
                    }
                    m[h] = mn;
                }
            }
        }
    }
    __syncthreads(); // the scores (alpha) are read: region A takes the warps' partial outputs
    float * s_wacc = s_a; // [WARPS][G][Dv]
#pragma unroll
    for (int h = 0; h < GM; ++h) {
        if (h < G) {
#pragma unroll
            for (int e = 0; e < DE; ++e) {
                s_wacc[(warp*G + h)*a.Dv + DE*lane + e] = acc[h][e];
            }
            if (lane == 0) {
                s_wm[warp][h] = m[h];
                s_wz[warp][h] = l[h];
                s_wa[warp][h] = al[h];
            }
        }
    }
    __syncthreads();
    SPARQ_MARK_FU(7);
    // the block's partial into block 0's s_red / s_rm, s_rl, s_ra: warp h merges head h's (max, sum, alpha) over the
    // warps and leaves each warp's factor in s_wm; then every (head, component) sums the warps' outputs
    for (int h = warp; h < G; h += SPARQ_FU_WARPS) {
        const float wm = lane < SPARQ_FU_WARPS ? s_wm[lane][h] : -INFINITY;
        const float mb = warp_reduce_max<WARP_SIZE>(wm);
        const float f  = wm == -INFINITY ? 0.0f : expf(wm - mb);
        const float lb = warp_reduce_sum<WARP_SIZE>(lane < SPARQ_FU_WARPS ? f*s_wz[lane][h] : 0.0f);
        const float ab = warp_reduce_sum<WARP_SIZE>(lane < SPARQ_FU_WARPS ? s_wa[lane][h] : 0.0f);
        if (lane < SPARQ_FU_WARPS) {
            s_wm[lane][h] = f;
        }
        if (lane == 0) {
            *cluster.map_shared_rank(&s_rm[rank][h], 0) = mb;
            *cluster.map_shared_rank(&s_rl[rank][h], 0) = lb;
            *cluster.map_shared_rank(&s_ra[rank][h], 0) = ab;
        }
    }
    __syncthreads();
    SPARQ_MARK_FU(23);
    {
        float * red0 = cluster.map_shared_rank(s_red, 0);
#pragma unroll 1
        for (int e = tid; e < G*a.Dv; e += SPARQ_FU_THREADS) {
            const int h = e / a.Dv;
            float y = 0.0f;
#pragma unroll
            for (int w = 0; w < SPARQ_FU_WARPS; ++w) {
                y += s_wm[w][h]*s_wacc[(w*G + h)*a.Dv + e % a.Dv];
            }
            red0[(rank*G + h)*a.Dv + e % a.Dv] = y;
        }
    }
    cluster.sync();
    SPARQ_MARK_FU(10);
    if (rank != 0) {
        return;
    }
    // block 0: warp h merges head h over the blocks (factors into s_rm; the sum and alpha into s_rz and s_M, dead
    // since step 3), then every (head, component) sums the blocks' outputs
    for (int h = warp; h < G; h += SPARQ_FU_WARPS) {
        const float bm = lane < nb ? s_rm[lane][h] : -INFINITY;
        const float mm = warp_reduce_max<WARP_SIZE>(bm);
        const float f  = bm == -INFINITY ? 0.0f : expf(bm - mm);
        const float lt = warp_reduce_sum<WARP_SIZE>(lane < nb ? f*s_rl[lane][h] : 0.0f);
        const float at = warp_reduce_sum<WARP_SIZE>(lane < nb ? s_ra[lane][h] : 0.0f);
        if (lane < nb) {
            s_rm[lane][h] = f;
        }
        if (lane == 0) {
            s_rz[h] = lt;
            s_M[h]  = at;
        }
    }
    __syncthreads();
#pragma unroll 1
    for (int e = tid; e < G*a.Dv; e += SPARQ_FU_THREADS) {
        const int h = e / a.Dv;
        const int d = e % a.Dv;
        float y = 0.0f;
#pragma unroll
        for (int b = 0; b < SPARQ_FU_NB_MAX; ++b) {
            if (b >= nb) {
                break;
            }
            y += s_rm[b][h]*s_red[(b*G + h)*a.Dv + d];
        }
        y /= s_rz[h];
        if (blend) {
            const float vm = e == tid ? vm0 : *(const float *) (vmb + (int64_t) d*sizeof(float));
            y = s_M[h]*y + (1.0f - s_M[h])*vm;
        }
        dst_u[e] = y;
    }
    SPARQ_MARK_FU(8);
#else
    GGML_UNUSED_VARS(a, L);
    NO_DEVICE_CODE;
#endif
}

static size_t sparq_align256(const size_t n) {
    return (n + 255) & ~(size_t) 255;
}

// split step 2: segments of at least SPARQ_SPLIT_SEG_MIN positions (multiples of 256), at most SPARQ_SPLIT_NSEG
static void sparq_split_dims(const int n_kv, const int k_top, int & seg_len, int & nseg, int & kseg) {
    const int per = (n_kv + SPARQ_SPLIT_NSEG - 1)/SPARQ_SPLIT_NSEG;
    seg_len = std::max(SPARQ_SPLIT_SEG_MIN, (per + 255) & ~255);
    nseg    = std::max(1, (n_kv + seg_len - 1)/seg_len);
    kseg    = std::max(1, std::min(k_top, seg_len));
}

struct sparq_scratch_offsets {
    int64_t sc_ld;
    int     nblk, seg_len, nseg, kseg;
    size_t  part, nvis, cand, ccnt, pml, pacc, total;
};

static sparq_scratch_offsets sparq_scratch_layout(const sparq_args & a) {
    sparq_scratch_offsets o;
    const int64_t units = (int64_t) a.n_tok*a.ns;
    o.sc_ld = (a.n_kv + 7) & ~7; // rows of whole 32-byte pieces: vector stores
    const int pos = sparq_sc_pos(a.Hkv > 0 ? a.H/a.Hkv : 1);
    o.nblk  = (a.n_kv + pos - 1)/pos;
    sparq_split_dims(a.n_kv, a.k_top, o.seg_len, o.nseg, o.kseg);
    o.part  = sparq_align256((size_t) units*a.H*o.sc_ld*sizeof(float));
    o.nvis  = o.part + sparq_align256((size_t) units*a.H*o.nblk*sizeof(float2));
    o.cand  = o.nvis + sparq_align256((size_t) units*o.nblk*sizeof(int));
    o.ccnt  = o.cand + sparq_align256((size_t) units*a.Hkv*o.nseg*o.kseg*sizeof(uint64_t));
    o.pml   = o.ccnt + sparq_align256((size_t) units*a.Hkv*o.nseg*sizeof(int));
    o.pacc  = o.pml  + sparq_align256((size_t) units*a.H*o.nseg*sizeof(float4));
    o.total = o.pacc + sparq_align256((size_t) units*a.H*o.nseg*a.Dv*sizeof(float));
    return o;
}

size_t sparq_attn_scratch_size(const sparq_args & a) {
    return sparq_scratch_layout(a).total;
}

// blocks per KV head in the select kernel: a cluster of up to 8 on sm_90 from 8k positions on (one block per
// 2048 positions: 8 from 16k on measured 37.0 against 37.7 us at 16k, H100); LLAMA_SPARSE_CUDA_SPARQ_CLUSTER=0
// keeps one block, =n (2..8) takes n from 8k on
static int sparq_cluster_blocks(const int device, const int n_kv) {
#ifdef SPARQ_CLUSTER_AVAILABLE
    static const int env = [] { const char * e = getenv("LLAMA_SPARSE_CUDA_SPARQ_CLUSTER"); return e ? atoi(e) : -1; }();
    static int cc_major[GGML_CUDA_MAX_DEVICES] = { 0 };
    if (cc_major[device] == 0) {
        CUDA_CHECK(cudaDeviceGetAttribute(&cc_major[device], cudaDevAttrComputeCapabilityMajor, device));
    }
    if (env != 0 && cc_major[device] >= 9) {
        return n_kv < 8192 ? 1 : env > 1 ? std::min(8, env) : std::min(8, n_kv/2048);
    }
#else
    (void) device;
    (void) n_kv;
#endif // SPARQ_CLUSTER_AVAILABLE
    return 1;
}

// kern on grid with a thread block cluster of nc blocks along x (sm_90; always = true: also for nc = 1, for kernels that
// use the cluster API) and ggml's programmatic launch; without clusters (nc = 1) ggml's launcher
template <typename... P, typename... A>
static void sparq_launch_cluster(void (*kern)(P...), const dim3 grid, const dim3 block, const size_t smem, const int nc,
        const bool always, cudaStream_t stream, A... args) {
#ifdef SPARQ_CLUSTER_AVAILABLE
    if (nc > 1 || always) {
        ggml_sparse_cuda_launch_ex(kern, grid, block, smem, nc, stream, args...);
        return;
    }
#else
    GGML_UNUSED(always);
#endif // SPARQ_CLUSTER_AVAILABLE
    const ggml_cuda_kernel_launch_params p(grid, block, smem, stream);
    ggml_cuda_kernel_launch(kern, p, args...);
}

template <typename KT, typename MT, int DE, int GM, bool VEC>
static void sparq_launch_attend(const sparq_args & a, const int units, cudaStream_t stream) {
    const int    G    = a.H / a.Hkv;
    const size_t smem = sparq_attend_smem(a.n_kv, G, a.k_top, a.Dv);
    static int smem_set[GGML_CUDA_MAX_DEVICES] = { 0 };
    int device;
    CUDA_CHECK(cudaGetDevice(&device));
    if (smem_set[device] == 0) {
        int optin;
        CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
        CUDA_CHECK(cudaFuncSetAttribute(sparq_attend<KT, MT, DE, GM, VEC>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                optin - 16*1024)); // room for the static shared arrays
        smem_set[device] = optin - 16*1024;
    }
    GGML_ASSERT(smem <= (size_t) smem_set[device] && "SparQ: n_kv too large for shared memory");

    const int  nc = sparq_cluster_blocks(device, a.n_kv);
    const dim3 grid(a.Hkv*nc, units, 1);
    const dim3 block(SPARQ_AT_THREADS, 1, 1);
    sparq_launch_cluster(sparq_attend<KT, MT, DE, GM, VEC>, grid, block, smem, nc, false, stream, a);
}

// the fused variant for a call, launched, or false where it does not apply (the others then run): sm_90 clusters,
// f16 K, k_t and V with 16-byte aligned rows, D = Dv, shared memory for the block's positions
template <typename MT, int DE, int GM, bool KQ8>
static bool sparq_launch_fused(const sparq_args & a, const int units, cudaStream_t stream, const bool launch) {
#ifdef SPARQ_CLUSTER_AVAILABLE
    // cluster sizes tried, largest first, and how many clusters of each are resident at once (per device)
    constexpr int n_sizes = 3;
    static const int sizes[n_sizes] = { 16, 12, 8 };
    static int dyn_max[GGML_CUDA_MAX_DEVICES] = { 0 }; // -1: no clusters
    static int resident[GGML_CUDA_MAX_DEVICES][n_sizes];
    // LLAMA_SPARSE_CUDA_SPARQ_FU_NB: at most this many blocks a cluster (8: the portable size only); -n: n, resident or not
    static const int nb_env = [] { const char * e = getenv("LLAMA_SPARSE_CUDA_SPARQ_FU_NB"); return e ? atoi(e) : SPARQ_FU_NB_MAX; }();
    int device;
    CUDA_CHECK(cudaGetDevice(&device));
    if (dyn_max[device] == 0) {
        int cc_major, optin;
        CUDA_CHECK(cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, device));
        CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
        dyn_max[device] = -1;
        if (cc_major >= 9) {
            auto kern = sparq_fused<MT, DE, GM, KQ8>;
            cudaFuncAttributes fa;
            CUDA_CHECK(cudaFuncGetAttributes(&fa, kern));
            const int dyn = optin - (int) fa.sharedSizeBytes;
            CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, dyn));
            const bool np = cudaFuncSetAttribute(kern, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) == cudaSuccess;
            (void) cudaGetLastError();
            for (int i = 0; i < n_sizes; ++i) {
                cudaLaunchAttribute attr;
                attr.id               = cudaLaunchAttributeClusterDimension;
                attr.val.clusterDim.x = sizes[i];
                attr.val.clusterDim.y = 1;
                attr.val.clusterDim.z = 1;
                cudaLaunchConfig_t lc = {};
                lc.gridDim            = dim3(sizes[i], 1, 1);
                lc.blockDim           = dim3(SPARQ_FU_THREADS, 1, 1);
                lc.dynamicSmemBytes   = dyn;
                lc.attrs              = &attr;
                lc.numAttrs           = 1;
                int n = 0;
                if ((sizes[i] <= 8 || np) && cudaOccupancyMaxActiveClusters(&n, kern, &lc) != cudaSuccess) {
                    (void) cudaGetLastError();
                    n = 0;
                }
                resident[device][i] = n; // 0 where the size cannot be used
            }
            dyn_max[device] = dyn;
            for (int i = 0; i < n_sizes; ++i) {
                GGML_LOG_DEBUG("%s: device %d holds %d clusters of %d blocks at once\n", __func__, device,
                               resident[device][i], sizes[i]);
            }
        }
    }
    if (dyn_max[device] < 0) {
        return false;
    }
    // a cap below 8 applies too (the loop finds no size then)
    int nb_max = nb_env < 0 ? std::min(-nb_env, SPARQ_FU_NB_MAX) : nb_env > 0 ? std::min(nb_env, 8) : 8;
    for (int i = 0; i < n_sizes && nb_env > 0; ++i) {
        if (sizes[i] <= nb_env && resident[device][i] >= a.Hkv*units) {
            nb_max = sizes[i];
            break;
        }
    }
    const sparq_fu_layout L = sparq_fu_plan_layout(a.n_kv, a.H/a.Hkv, a.Dv, nb_max);
    const size_t smem = (size_t) L.total*sizeof(int);
    if (smem > (size_t) dyn_max[device]) {
        return false;
    }
    if (!launch) {
        return true;
    }
    sparq_launch_cluster(sparq_fused<MT, DE, GM, KQ8>, dim3(a.Hkv*L.nb, units, 1), dim3(SPARQ_FU_THREADS, 1, 1), smem, L.nb,
                         true, stream, a, L);
    return true;
#else
    GGML_UNUSED_VARS(a, units, stream, launch);
    return false;
#endif // SPARQ_CLUSTER_AVAILABLE
}

// the fused instance for D, G and the mask type
template <bool KQ8>
static bool sparq_try_fused_t(const sparq_args & a, const int units, cudaStream_t stream, const bool launch) {
    const int G = a.H/a.Hkv;
    if (a.mask_f16) {
        return a.D == 64 ? (G <= 4 ? sparq_launch_fused<half, 2, 4, KQ8>(a, units, stream, launch) : sparq_launch_fused<half, 2, 8, KQ8>(a, units, stream, launch)) :
                           (G <= 4 ? sparq_launch_fused<half, 4, 4, KQ8>(a, units, stream, launch) : sparq_launch_fused<half, 4, 8, KQ8>(a, units, stream, launch));
    }
    return a.D == 64 ? (G <= 4 ? sparq_launch_fused<float, 2, 4, KQ8>(a, units, stream, launch) : sparq_launch_fused<float, 2, 8, KQ8>(a, units, stream, launch)) :
                       (G <= 4 ? sparq_launch_fused<float, 4, 4, KQ8>(a, units, stream, launch) : sparq_launch_fused<float, 4, 8, KQ8>(a, units, stream, launch));
}

// step2 0 (unless LLAMA_SPARSE_CUDA_SPARQ_FUSED=0) or 4: the fused variant where it applies (launch false: only
// whether it would; sparq_attn_launch has set the alignment flags)
static bool sparq_try_fused(const sparq_args & a, const int units, cudaStream_t stream, const bool launch = true) {
    static const bool env_on = [] { const char * e = getenv("LLAMA_SPARSE_CUDA_SPARQ_FUSED"); return e == nullptr || atoi(e) != 0; }();
    if (!(a.step2 == 4 || (a.step2 == 0 && env_on))) {
        return false;
    }
    const int       G  = a.H/a.Hkv;
    const uintptr_t al = (uintptr_t) a.k | (uintptr_t) a.k_nb1 | (uintptr_t) a.k_nb2 | (uintptr_t) a.k_nb3 |
                         (uintptr_t) a.v | (uintptr_t) a.v_nb1 | (uintptr_t) a.v_nb2 | (uintptr_t) a.v_nb3;
    if (!a.kv_f16 || !(a.kt_vec || a.kt_q8) || (al & 15) != 0 || a.v_nb0 != (int64_t) sizeof(half) || a.D != a.Dv ||
        (a.D != 64 && a.D != 128) || G > SPARQ_CUDA_MAX_G) {
        return false;
    }
    if (a.kt_q8) {
        return sparq_try_fused_t<true>(a, units, stream, launch);
    }
    return sparq_try_fused_t<false>(a, units, stream, launch);
}

// most dynamic shared memory sparq_split_attend<KT, MT, DE> may use (opted in once per device)
template <typename KT, typename MT, int DE>
static int sparq_split_attend_smem_max() {
    static int smem_max[GGML_CUDA_MAX_DEVICES] = { 0 };
    int device;
    CUDA_CHECK(cudaGetDevice(&device));
    if (smem_max[device] == 0) {
        int optin;
        CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
        cudaFuncAttributes fa;
        CUDA_CHECK(cudaFuncGetAttributes(&fa, sparq_split_attend<KT, MT, DE>));
        const int dyn = optin - (int) fa.sharedSizeBytes;
        CUDA_CHECK(cudaFuncSetAttribute(sparq_split_attend<KT, MT, DE>, cudaFuncAttributeMaxDynamicSharedMemorySize, dyn));
        smem_max[device] = dyn;
    }
    return smem_max[device];
}

// false (nothing launched) where the head's lists do not fit into shared memory (large k on a GPU with less
// than Hopper's 227 KiB): the single variant takes the call
template <typename KT, typename MT, int DE>
static bool sparq_launch_split(const sparq_args & a, const int units, cudaStream_t stream) {
    // the lists of a head: up to SPARQ_SPLIT_NSEG*SPARQ_CUDA_MAX_KTOP entries (128 KiB), past the 48 KiB default
    const size_t smem = sparq_split_attend_smem(a);
    if (smem > (size_t) sparq_split_attend_smem_max<KT, MT, DE>()) {
        return false;
    }
    const dim3 grid(a.nseg, a.Hkv, units);
    ggml_cuda_kernel_launch(sparq_seg_select, ggml_cuda_kernel_launch_params(grid, dim3(SPARQ_SPLIT_THREADS, 1, 1), 0, stream), a);
    ggml_cuda_kernel_launch(sparq_split_attend<KT, MT, DE>, ggml_cuda_kernel_launch_params(grid, dim3(SPARQ_SPLIT_THREADS, 1, 1), smem, stream), a);
    ggml_cuda_kernel_launch(sparq_split_combine,
            ggml_cuda_kernel_launch_params(dim3(a.H, units, 1), dim3(SPARQ_COMB_THREADS, 1, 1), 0, stream), a);
    return true;
}

// step 2 on one block (cluster) per KV head (default) or split over segments (LLAMA_SPARSE_CUDA_SPARQ_SPLIT=1)
// unless the caller asks (sparq_args::step2); the split one measured 0.85-1.04x the single one's time in the
// standalone bench and slower through test-backend-ops (bench/results/cuda_sparq_h100_2026-11-23.md)
static bool sparq_use_split(const sparq_args & a) {
    if (a.step2 != 0) {
        return a.step2 == 2;
    }
    static const bool env_split = [] { const char * e = getenv("LLAMA_SPARSE_CUDA_SPARQ_SPLIT"); return e != nullptr && atoi(e) != 0; }();
    return env_split;
}

// step-1 blocks per (KV head, unit): all nblk chunks, or fewer (each looping over several) where that many would not
// be resident at once (LLAMA_SPARSE_CUDA_SPARQ_SC_WAVES=w allows w rounds; 0: one block per chunk)
static int sparq_sc_grid_x(const void * kern, const int nblk, const int heads_units) {
    static const int waves = [] { const char * e = getenv("LLAMA_SPARSE_CUDA_SPARQ_SC_WAVES"); return e ? atoi(e) : 1; }();
    if (waves <= 0) {
        return nblk;
    }
    int device;
    CUDA_CHECK(cudaGetDevice(&device));
    static int nsm[GGML_CUDA_MAX_DEVICES] = { 0 };
    if (nsm[device] == 0) {
        CUDA_CHECK(cudaDeviceGetAttribute(&nsm[device], cudaDevAttrMultiProcessorCount, device));
    }
    int per_sm = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kern, SPARQ_SC_THREADS, 0));
    const int resident = std::max(1, waves*nsm[device]*std::max(1, per_sm));
    return std::max(1, std::min(nblk, (resident + heads_units - 1)/heads_units));
}

// step 1 (sparq_scores) with k_t's element type KTT
template <typename KTT, typename MT>
static void sparq_launch_scores(const sparq_args & a, const int units, cudaStream_t stream) {
    const bool g4 = a.H/a.Hkv <= 4;
    const int  nb = sparq_sc_grid_x(g4 ? (const void *) sparq_scores<KTT, MT, 4> : (const void *) sparq_scores<KTT, MT, SPARQ_CUDA_MAX_G>,
                                    a.nblk, a.Hkv*units);
    const ggml_cuda_kernel_launch_params p(dim3(nb, a.Hkv, units), dim3(SPARQ_SC_THREADS, 1, 1), 0, stream);
    if (g4) {
        ggml_cuda_kernel_launch(sparq_scores<KTT, MT, 4>, p, a);
    } else {
        ggml_cuda_kernel_launch(sparq_scores<KTT, MT, SPARQ_CUDA_MAX_G>, p, a);
    }
}

template <typename KT, typename MT>
static void sparq_launch(const sparq_args & a, const int units, cudaStream_t stream) {
    if constexpr (std::is_same_v<KT, half>) {
        if (a.kt_q8) {
            sparq_launch_scores<sparq_q8, MT>(a, units, stream); // the 8-bit copy beside f16 K/V
        } else {
            sparq_launch_scores<KT, MT>(a, units, stream);
        }
    } else {
        GGML_ASSERT(!a.kt_q8);
        sparq_launch_scores<KT, MT>(a, units, stream);
    }
    if (a.step2 == 3) {
        return; // step 1 alone: a timing aid of the standalone bench (dst is not written)
    }
    if (sparq_use_split(a)) {
        const bool done = std::max(a.D, a.Dv) <= 4*WARP_SIZE ? sparq_launch_split<KT, MT, 4>(a, units, stream) :
                                                                 sparq_launch_split<KT, MT, 8>(a, units, stream);
        if (done) {
            return;
        }
    }
    const bool g4  = a.H/a.Hkv <= 4;
    const bool d4  = std::max(a.D, a.Dv) <= 4*WARP_SIZE;
    const bool vec = a.k_vec && a.v_vec && a.D % 8 == 0;
    if (!vec) { // unaligned K or V, D % 8 != 0: element-wise loads, one build sized for every G
        if (d4) {
            sparq_launch_attend<KT, MT, 4, SPARQ_CUDA_MAX_G, false>(a, units, stream);
        } else {
            sparq_launch_attend<KT, MT, 8, SPARQ_CUDA_MAX_G, false>(a, units, stream);
        }
    } else if (d4 && g4) {
        sparq_launch_attend<KT, MT, 4, 4, true>(a, units, stream);
    } else if (d4) {
        sparq_launch_attend<KT, MT, 4, SPARQ_CUDA_MAX_G, true>(a, units, stream);
    } else if (g4) {
        sparq_launch_attend<KT, MT, 8, 4, true>(a, units, stream);
    } else {
        sparq_launch_attend<KT, MT, 8, SPARQ_CUDA_MAX_G, true>(a, units, stream);
    }
}

// the vector-load flags of sparq_args from its pointers and strides
static void sparq_set_vec(sparq_args & a) {
    a.kt_vec = (((uintptr_t) a.kt | (uintptr_t) a.kt_nb1 | (uintptr_t) a.kt_nb2 | (uintptr_t) a.kt_nb3) & 15) == 0;
    a.k_vec  = (((uintptr_t) a.k | (uintptr_t) a.k_nb1 | (uintptr_t) a.k_nb2 | (uintptr_t) a.k_nb3) & 15) == 0;
    const uintptr_t v2 = a.kv_f16 ? 2*sizeof(half) : 2*sizeof(float); // one V component pair
    a.v_vec  = a.v_nb0 == (int64_t) (v2/2) && a.Dv % 2 == 0 &&
               (((uintptr_t) a.v | (uintptr_t) a.v_nb1 | (uintptr_t) a.v_nb2 | (uintptr_t) a.v_nb3) & (v2 - 1)) == 0;
}

// the fused kernel's balance hints of one (k_t, units) pair: n ints, zero at first (exchange), from one device pool
// allocated at first need; nullptr when the pool is full (then every launch exchanges)
static int * sparq_balance_hints(const void * kt, const int n) {
    constexpr int pool_size = 1 << 16;
    static std::mutex mutex;
    static std::map<std::tuple<int, const void *, int>, int *> slots;
    static int * pool[GGML_CUDA_MAX_DEVICES] = {};
    static int   used[GGML_CUDA_MAX_DEVICES] = {};
    int device;
    CUDA_CHECK(cudaGetDevice(&device));
    std::lock_guard<std::mutex> lock(mutex);
    const auto key = std::make_tuple(device, kt, n);
    const auto it  = slots.find(key);
    if (it != slots.end()) {
        return it->second;
    }
    if (pool[device] == nullptr) {
        // (a CUDA graph may be capturing on the op's stream: relaxed mode allows this on a stream of our own)
        cudaStream_t s;
        CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        CUDA_CHECK(cudaMalloc(&pool[device], pool_size*sizeof(int)));
        CUDA_CHECK(cudaMemsetAsync(pool[device], 0, pool_size*sizeof(int), s));
        CUDA_CHECK(cudaStreamSynchronize(s));
        CUDA_CHECK(cudaStreamDestroy(s));
    }
    if (used[device] + n > pool_size) {
        return nullptr;
    }
    int * p = pool[device] + used[device];
    used[device] += n;
    slots[key] = p;
    return p;
}

bool sparq_attn_fused_takes(sparq_args a) {
    sparq_set_vec(a);
    a.step2 = 4;
    return a.n_kv > 0 && a.n_tok*a.ns > 0 && sparq_try_fused(a, a.n_tok*a.ns, nullptr, false);
}

void sparq_attn_launch(sparq_args a, void * scratch, cudaStream_t stream) {
    const int units = a.n_tok*a.ns;
    if (a.n_kv == 0 || units == 0) {
        CUDA_CHECK(cudaMemsetAsync(a.dst, 0, (size_t) units*a.H*a.Dv*sizeof(float), stream));
        return;
    }
    GGML_ASSERT(a.Hkv > 0 && a.H % a.Hkv == 0 && a.H/a.Hkv <= SPARQ_CUDA_MAX_G);
    GGML_ASSERT(a.D <= SPARQ_CUDA_MAX_D && a.Dv <= SPARQ_CUDA_MAX_D && a.n_kv <= SPARQ_CUDA_MAX_NKV);
    GGML_ASSERT(a.r >= 1 && a.k_top >= 1 && std::min(a.k_top, a.n_kv) <= SPARQ_CUDA_MAX_KTOP);
    if (!a.vm) {
        a.flags &= ~1; // no mean of V: no blend
    }
    const sparq_scratch_offsets o = sparq_scratch_layout(a);
    a.sc_ld   = o.sc_ld;
    a.nblk    = o.nblk;
    a.seg_len = o.seg_len;
    a.nseg    = o.nseg;
    a.kseg    = o.kseg;
    GGML_ASSERT(a.kseg <= SPARQ_CUDA_MAX_KTOP && a.seg_len <= SPARQ_SPLIT_SEG_MAX && a.nseg <= SPARQ_SPLIT_NSEG);
    a.sc     = (float *) scratch;
    a.part   = (float2 *) ((char *) scratch + o.part);
    a.nvis   = (int *) ((char *) scratch + o.nvis);
    a.cand   = (uint64_t *) ((char *) scratch + o.cand);
    a.ccnt   = (int *) ((char *) scratch + o.ccnt);
    a.pml    = (float4 *) ((char *) scratch + o.pml);
    a.pacc   = (float *) ((char *) scratch + o.pacc);
    sparq_set_vec(a);
    GGML_ASSERT(((uintptr_t) scratch & 15) == 0);
    // LLAMA_SPARSE_CUDA_SPARQ_BALANCE: 0 off, 1 (default) as the last launch on these caches found, 2 always exchange
    static const int balance = [] { const char * e = getenv("LLAMA_SPARSE_CUDA_SPARQ_BALANCE"); return e == nullptr ? 1 : atoi(e); }();
    a.balance = balance != 0;
    if (balance == 1 && a.bhint == nullptr) {
        a.bhint = sparq_balance_hints(a.kt, units*a.Hkv);
    }

    if (sparq_try_fused(a, units, stream)) {
        return;
    }
    if (a.step2 == 4) {
        a.step2 = 1; // the fused variant does not apply: the single one
    }
    if (a.kv_f16 && a.mask_f16) {
        sparq_launch<half, half>(a, units, stream);
    } else if (a.kv_f16) {
        sparq_launch<half, float>(a, units, stream);
    } else if (a.mask_f16) {
        sparq_launch<float, half>(a, units, stream);
    } else {
        sparq_launch<float, float>(a, units, stream);
    }
}

#ifndef GGML_SPARSE_CUDA_STANDALONE
bool ggml_cuda_sparq_attn_supported(const ggml_tensor * op) {
    const ggml_tensor * q    = op->src[0];
    const ggml_tensor * k    = op->src[1];
    const ggml_tensor * k_t  = op->src[2];
    const ggml_tensor * v    = op->src[3];
    const ggml_tensor * mask = op->src[4];
    const ggml_tensor * vm   = op->src[5];
    if (!q || !k || !k_t || !v || !mask || op->type != GGML_TYPE_F32 || !ggml_is_contiguous(op)) {
        return false;
    }
    if (q->type != GGML_TYPE_F32 || q->nb[0] != sizeof(float)) {
        return false;
    }
    // k_t: K's type, or Q8_0 beside f16 K/V (the 8-bit copy; n_kv % 32 == 0 as the op requires)
    const bool kt_q8 = k_t->type == GGML_TYPE_Q8_0 && k->type == GGML_TYPE_F16 && k->ne[1] % 32 == 0;
    if ((k->type != GGML_TYPE_F16 && k->type != GGML_TYPE_F32) || (k_t->type != k->type && !kt_q8) || v->type != k->type) {
        return false;
    }
    if (k->nb[0] != ggml_type_size(k->type) || k_t->nb[0] != ggml_type_size(k_t->type)) {
        return false;
    }
    if ((mask->type != GGML_TYPE_F16 && mask->type != GGML_TYPE_F32) || mask->nb[0] != ggml_type_size(mask->type)) {
        return false;
    }
    const int64_t D = q->ne[0], Dv = v->ne[0], H = q->ne[2], Hkv = k->ne[2], n_kv = k->ne[1];
    if (Hkv <= 0 || H % Hkv != 0 || H/Hkv > SPARQ_CUDA_MAX_G || D > SPARQ_CUDA_MAX_D || Dv > SPARQ_CUDA_MAX_D) {
        return false;
    }
    const int32_t k_top = op->op_params[2];
    if (n_kv > SPARQ_CUDA_MAX_NKV || std::min<int64_t>(k_top, n_kv) > SPARQ_CUDA_MAX_KTOP) {
        return false;
    }
    if (vm && (vm->type != GGML_TYPE_F32 || vm->nb[0] != sizeof(float))) {
        return false;
    }
    return true;
}

void ggml_cuda_op_sparq_attn(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const ggml_tensor * q    = dst->src[0];
    const ggml_tensor * k    = dst->src[1];
    const ggml_tensor * k_t  = dst->src[2];
    const ggml_tensor * v    = dst->src[3];
    const ggml_tensor * mask = dst->src[4];
    const ggml_tensor * vm   = dst->src[5];
    GGML_ASSERT(ggml_cuda_sparq_attn_supported(dst));

    sparq_args a = {};
    a.q    = (const char *) q->data;    a.q_nb1  = q->nb[1];   a.q_nb2  = q->nb[2];   a.q_nb3  = q->nb[3];
    a.k    = (const char *) k->data;    a.k_nb1  = k->nb[1];   a.k_nb2  = k->nb[2];   a.k_nb3  = k->nb[3];
    a.kt   = (const char *) k_t->data;  a.kt_nb1 = k_t->nb[1]; a.kt_nb2 = k_t->nb[2]; a.kt_nb3 = k_t->nb[3];
    a.v    = (const char *) v->data;    a.v_nb0  = v->nb[0];   a.v_nb1  = v->nb[1];   a.v_nb2  = v->nb[2]; a.v_nb3 = v->nb[3];
    a.mask = (const char *) mask->data; a.m_nb1  = mask->nb[1]; a.m_nb3 = mask->nb[3]; a.m_ne3  = (int) mask->ne[3];
    if (vm) {
        a.vm = (const char *) vm->data; a.vm_nb1 = vm->nb[1]; a.vm_nb2 = vm->nb[2]; a.vm_nb3 = vm->nb[3];
        a.vm_ne2 = (int) vm->ne[2]; a.vm_ne3 = (int) vm->ne[3];
    }
    a.dst      = (float *) dst->data;
    a.D        = (int) q->ne[0];
    a.Dv       = (int) v->ne[0];
    a.n_kv     = (int) k->ne[1];
    a.H        = (int) q->ne[2];
    a.Hkv      = (int) k->ne[2];
    a.n_tok    = (int) q->ne[1];
    a.ns       = (int) q->ne[3];
    memcpy(&a.scale, &dst->op_params[0], sizeof(float));
    a.r        = dst->op_params[1];
    a.k_top    = dst->op_params[2];
    a.flags    = dst->op_params[3] & GGML_SPARQ_MEAN_V;
    a.kv_f16   = k->type == GGML_TYPE_F16;
    a.kt_q8    = k_t->type == GGML_TYPE_Q8_0;
    a.mask_f16 = mask->type == GGML_TYPE_F16;

    if (a.n_kv == 0 || a.n_tok*a.ns == 0) {
        sparq_attn_launch(a, nullptr, ctx.stream()); // zeros, no scratch
        return;
    }
    ggml_cuda_pool_alloc<char> scratch(ctx.pool(), sparq_attn_scratch_size(a));
    sparq_attn_launch(a, scratch.get(), ctx.stream());
}
#endif // GGML_SPARSE_CUDA_STANDALONE
