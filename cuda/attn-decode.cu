// llama-sparse: FLASH_ATTN_EXT of one token as one kernel (see attn-decode.cuh).
//
// Grid (nb, KV heads, streams), clusters of nb blocks along x, 128 threads a block. Block b of a cluster takes
// positions [b*ppb, (b+1)*ppb) of its KV head for the G query heads that share it. Scores: D/8 lanes a K row (16
// bytes each), the lanes of a row add their products by shuffles; q is scaled first, the mask added after.
// Rounds of 32 positions, K and V rows of a round requested together, a running softmax kept alike by every warp, a
// warp adds the weighted V rows of 8 positions (D/32 components a lane). Then:
//  - version 2 (default): one cluster barrier; block r merges the blocks' (max, sum, output) of a share of the outputs
//    through distributed shared memory and writes them; a second barrier keeps its shared memory alive for the peers;
//  - version 3: plain blocks (no cluster, up to 64 a KV head) write their partials to a workspace; the last block of
//    a KV head to finish (a counter it resets) merges them;
//  - version 6: one block a KV head, no cluster and no workspace; its groups of 4 warps (4 groups, 2 at more than 2
//    q heads a KV head) split the positions and merge through shared memory;
//  - version 8 (long contexts, its own kernels below): a split over blocks streaming K / V with no barrier in the
//    loop, partials merged by a second kernel.
// (Slower and removed: a first version with all of a block's scores before P.V; K / V prefetched into L2 before the
// PDL wait (bench/results/cuda_h100_2026-11-27e.md); versions 4, 5 and 7, which were 2, 3 and 6 with the next
// round's rows requested before a round's math (cuda_h100_2026-11-27f.md).)
// fp32 throughout (upstream's vec kernel keeps K.q in f16 for f16 K at default precision).
#include "attn-decode.cuh"
#include "graph-hook.cuh"
#include "launch.cuh"
#include "rope-store.cuh"

#ifndef GGML_SPARSE_CUDA_STANDALONE
#include "ggml-sparse.h"
#endif // GGML_SPARSE_CUDA_STANDALONE

#include <cooperative_groups.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <map>
#include <mutex>
#include <utility>
#include <type_traits>

#ifdef GGML_SPARSE_CUDA_CLUSTERS
#define AD_CLUSTER_AVAILABLE // host side; device side also needs __CUDA_ARCH__ >= 900
#endif

#define AD_THREADS 128
#define AD_WARPS   (AD_THREADS/WARP_SIZE)
#define AD_MAX_NB  8    // portable cluster size
#define AD_MAX_NB3 128  // version 3: blocks a KV head
#define AD_MAX_G   8    // query heads a KV head

// how the position ranges of a KV head are merged: a cluster's blocks (version 2), blocks through a workspace
// (3: a.ws, a.cnt), or the NG groups of 4 warps of one block through its shared memory (6)
enum { AD_MERGE_CLUSTER = 0, AD_MERGE_LAST = 1, AD_MERGE_GROUPS = 2 };

// the lane's 8 components (from 8*piece) of the G q heads of KV head hkv, scaled; zeros for heads past G
template <int GM>
static __device__ __forceinline__ void ad_load_q(const attn_decode_args & a, const int G, const int hkv, const int i3,
                                                 const int piece, float (&qv)[GM][8]) {
#pragma unroll
    for (int g = 0; g < GM; ++g) {
        float4 f0 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        float4 f1 = f0;
        if (g < G) {
            const float4 * qp = (const float4 *) (a.q + i3*a.q_s3 + (int64_t) (hkv*G + g)*a.q_s2 + 8*piece);
            f0 = qp[0];
            f1 = qp[1];
        }
        qv[g][0] = f0.x*a.scale; qv[g][1] = f0.y*a.scale; qv[g][2] = f0.z*a.scale; qv[g][3] = f0.w*a.scale;
        qv[g][4] = f1.x*a.scale; qv[g][5] = f1.y*a.scale; qv[g][6] = f1.z*a.scale; qv[g][7] = f1.w*a.scale;
    }
}

// the round's scores go through shared memory (two buffers, one barrier a round); lane i of every warp holds position
// i of the round for the running softmax. A group of 4 warps takes one position range (NG groups: AD_MERGE_GROUPS,
// each with its own shared arrays and named barrier)
template <int D, int GM, int MG, int NG>
static __device__ __forceinline__ void ad_body(const attn_decode_args & a, const int ppb) {
#if defined(AD_CLUSTER_AVAILABLE) && __CUDA_ARCH__ >= GGML_CUDA_CC_HOPPER
    static_assert(D == 64 || D == 128, "attn_decode: D 64 or 128");
    constexpr int LPR = D/8;                // lanes a K row
    constexpr int RPW = WARP_SIZE/LPR;      // K rows a warp step
    constexpr int VPL = D/WARP_SIZE;        // V components a lane
    constexpr int R   = WARP_SIZE;          // positions a round
    constexpr int UK  = R/(AD_WARPS*RPW);   // K rows a lane, a round
    constexpr int RV  = R/AD_WARPS;         // V rows a warp, a round
    static_assert(UK*AD_WARPS*RPW == R && RV*AD_WARPS == R, "attn_decode: round layout");
    using vt = typename std::conditional<VPL == 4, uint2, uint32_t>::type;
    constexpr bool LAST = MG == AD_MERGE_LAST;
    static_assert(NG == 1 || MG == AD_MERGE_GROUPS, "attn_decode: groups only with their merge");

    __shared__ float s_sc_g[NG][2][GM][R];
    __shared__ float s_red_g[NG][AD_WARPS][GM][D];
    __shared__ float s_m_g[NG][GM];
    __shared__ float s_l_g[NG][GM];

    const int grp = NG > 1 ? (int) threadIdx.x / AD_THREADS : 0;
    float (&s_sc)[2][GM][R]        = s_sc_g[grp];
    float (&s_red)[AD_WARPS][GM][D] = s_red_g[grp];
    float (&s_m)[GM]               = s_m_g[grp];
    float (&s_l)[GM]               = s_l_g[grp];
    // the group's barrier (barrier 0 is __syncthreads)
    auto gsync = [&]() {
        if constexpr (NG == 1) {
            __syncthreads();
        } else {
            asm volatile("bar.sync %0, %1;" :: "r"(grp + 1), "r"(AD_THREADS) : "memory");
        }
    };

    const int nb    = MG == AD_MERGE_GROUPS ? NG  : LAST ? (int) gridDim.x : (int) cooperative_groups::this_cluster().num_blocks();
    const int rank  = MG == AD_MERGE_GROUPS ? grp : LAST ? (int) blockIdx.x : (int) cooperative_groups::this_cluster().block_rank();
    const int hkv   = blockIdx.y;
    const int i3    = blockIdx.z;
    const int G     = a.n_head/a.n_head_kv;
    const int tid   = threadIdx.x % AD_THREADS;
    const int lane  = tid % WARP_SIZE;
    const int warp  = tid / WARP_SIZE; // within the group
    const int piece = lane % LPR;
    const int sub   = lane / LPR;
    const int p0    = rank*ppb;
    const int np    = max(0, min(a.n_kv - p0, ppb));

    float qv[GM][8]; // the lane's 8 components of each head, scaled
    ad_load_q<GM>(a, G, hkv, i3, piece, qv);
    const half * mrow[GM]; // the heads' mask rows (planes broadcast as upstream's)
#pragma unroll
    for (int g = 0; g < GM; ++g) {
        mrow[g] = a.mask ? a.mask + (i3 % a.m_ne3)*a.m_s3 + ((hkv*G + g) % a.m_ne2)*a.m_s2 + p0 : nullptr;
    }
    const half * kb = a.k + i3*a.k_s3 + hkv*a.k_s2 + (int64_t) p0*a.k_s1 + 8*piece;
    const half * vb = a.v + i3*a.v_s3 + hkv*a.v_s2 + (int64_t) p0*a.v_s1 + VPL*lane;

    float m[GM], l[GM], acc[GM][VPL];
#pragma unroll
    for (int g = 0; g < GM; ++g) {
        m[g] = -INFINITY;
        l[g] = 0.0f;
#pragma unroll
        for (int c = 0; c < VPL; ++c) {
            acc[g][c] = 0.0f;
        }
    }

    // a round's K / V rows and mask entries into registers (zeros past np)
    auto fetch = [&](const int c0, uint4 (&kk)[UK], vt (&vv)[RV], float (&mv)[GM]) {
#pragma unroll
        for (int u = 0; u < UK; ++u) {
            const int r = c0 + warp*RPW + sub + u*AD_WARPS*RPW;
            kk[u] = r < np ? *(const uint4 *) (kb + (int64_t) r*a.k_s1) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int j = 0; j < RV; ++j) {
            const int r = c0 + warp*RV + j;
            vv[j] = r < np ? *(const vt *) (vb + (int64_t) r*a.v_s1) : vt{};
        }
#pragma unroll
        for (int g = 0; g < GM; ++g) {
            mv[g] = mrow[g] && c0 + lane < np ? __half2float(mrow[g][c0 + lane]) : 0.0f;
        }
    };

    int buf = 0;
    for (int c0 = 0; c0 < np; c0 += R, buf ^= 1) {
        uint4 kk[UK];
        vt    vv[RV];
        float mv[GM];
        fetch(c0, kk, vv, mv);
        // scores: the lanes of a row add their products
#pragma unroll
        for (int u = 0; u < UK; ++u) {
            const half2 * kh = (const half2 *) &kk[u];
            float sc[GM];
#pragma unroll
            for (int g = 0; g < GM; ++g) {
                sc[g] = 0.0f;
            }
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const float2 f = __half22float2(kh[j]);
#pragma unroll
                for (int g = 0; g < GM; ++g) {
                    sc[g] += qv[g][2*j]*f.x + qv[g][2*j + 1]*f.y;
                }
            }
#pragma unroll
            for (int g = 0; g < GM; ++g) {
#pragma unroll
                for (int off = LPR/2; off > 0; off >>= 1) {
                    sc[g] += __shfl_xor_sync(0xFFFFFFFF, sc[g], off);
                }
            }
            if (piece == 0) {
#pragma unroll
                for (int g = 0; g < GM; ++g) {
                    s_sc[buf][g][warp*RPW + sub + u*AD_WARPS*RPW] = sc[g];
                }
            }
        }
        gsync();
        // running softmax (the same in every warp), then this warp's V rows
        float w[GM];
#pragma unroll
        for (int g = 0; g < GM; ++g) {
            const float sg = c0 + lane < np ? s_sc[buf][g][lane] + mv[g] : -INFINITY;
            const float mn = fmaxf(m[g], warp_reduce_max<WARP_SIZE>(sg));
            const float rs = m[g] == -INFINITY ? 0.0f : expf(m[g] - mn);
            w[g] = mn == -INFINITY ? 0.0f : expf(sg - mn);
            l[g] = l[g]*rs + warp_reduce_sum<WARP_SIZE>(w[g]);
            m[g] = mn;
#pragma unroll
            for (int c = 0; c < VPL; ++c) {
                acc[g][c] *= rs;
            }
        }
#pragma unroll
        for (int j = 0; j < RV; ++j) {
            float vf[VPL];
            if constexpr (VPL == 4) {
                const float2 f0 = __half22float2(*(const half2 *) &vv[j].x);
                const float2 f1 = __half22float2(*(const half2 *) &vv[j].y);
                vf[0] = f0.x; vf[1] = f0.y; vf[2] = f1.x; vf[3] = f1.y;
            } else {
                const float2 f = __half22float2(*(const half2 *) &vv[j]);
                vf[0] = f.x; vf[1] = f.y;
            }
#pragma unroll
            for (int g = 0; g < GM; ++g) {
                const float wj = __shfl_sync(0xFFFFFFFF, w[g], warp*RV + j);
#pragma unroll
                for (int c = 0; c < VPL; ++c) {
                    acc[g][c] += wj*vf[c];
                }
            }
        }
    }

#pragma unroll
    for (int g = 0; g < GM; ++g) {
#pragma unroll
        for (int c = 0; c < VPL; ++c) {
            s_red[warp][g][VPL*lane + c] = acc[g][c];
        }
    }
    if (tid == 0) {
#pragma unroll
        for (int g = 0; g < GM; ++g) {
            s_m[g] = m[g];
            s_l[g] = l[g];
        }
    }
    gsync();
    float (*s_o)[D] = s_red[0]; // the block's output (unnormalized): each element summed by the thread that owns it
    constexpr int SLOT = GM*(D + 2); // LAST: a block's partials in a.ws: o [GM][D], m [GM], l [GM]
    float * slot = LAST ? a.ws + ((int64_t) (i3*a.n_head_kv + hkv)*nb + rank)*SLOT : nullptr;
    for (int e = tid; e < GM*D; e += AD_THREADS) {
        float o = 0.0f;
#pragma unroll
        for (int wi = 0; wi < AD_WARPS; ++wi) {
            o += s_red[wi][e / D][e % D];
        }
        if constexpr (LAST) {
            slot[e] = o;
        } else {
            s_o[e / D][e % D] = o;
        }
    }

    if constexpr (LAST) {
        // threadFenceReduction: the partials are visible device-wide before the block counts itself done
        if (tid < GM) {
            slot[GM*D + tid]      = s_m[tid];
            slot[GM*D + GM + tid] = s_l[tid];
        }
        __shared__ int s_last;
        __threadfence();
        __syncthreads();
        if (tid == 0) {
            int * cnt = a.cnt + i3*a.n_head_kv + hkv;
            s_last = atomicAdd(cnt, 1) == nb - 1;
            if (s_last) {
                *(volatile int *) cnt = 0; // every block has counted: ready for the next launch (after its PDL wait)
            }
        }
        __syncthreads();
        if (!s_last) {
            return;
        }
        __threadfence();
        const float * base = a.ws + (int64_t) (i3*a.n_head_kv + hkv)*nb*SLOT;
        for (int e = tid; e < G*D; e += AD_THREADS) {
            const int g = e / D;
            const int d = e % D;
            float M = -INFINITY;
            for (int b = 0; b < nb; ++b) {
                M = fmaxf(M, __ldcg(base + b*SLOT + GM*D + g));
            }
            float L = 0.0f;
            float O = 0.0f;
            if (M != -INFINITY) {
                for (int b = 0; b < nb; ++b) {
                    const float mb = __ldcg(base + b*SLOT + GM*D + g);
                    if (mb != -INFINITY) {
                        const float wb = expf(mb - M);
                        L += wb*__ldcg(base + b*SLOT + GM*D + GM + g);
                        O += wb*__ldcg(base + b*SLOT + e);
                    }
                }
            }
            a.dst[i3*a.d_s3 + (int64_t) (hkv*G + g)*a.d_s2 + d] = L > 0.0f ? O/L : 0.0f;
        }
        return;
    } else if constexpr (MG == AD_MERGE_GROUPS) {
        // merge the block's groups
        __syncthreads();
        for (int e = threadIdx.x; e < G*D; e += NG*AD_THREADS) {
            const int g = e / D;
            const int d = e % D;
            float M = -INFINITY;
#pragma unroll
            for (int b = 0; b < NG; ++b) {
                M = fmaxf(M, s_m_g[b][g]);
            }
            float L = 0.0f;
            float O = 0.0f;
#pragma unroll
            for (int b = 0; b < NG; ++b) {
                if (s_m_g[b][g] != -INFINITY) {
                    const float wb = expf(s_m_g[b][g] - M);
                    L += wb*s_l_g[b][g];
                    O += wb*s_red_g[b][0][g][d];
                }
            }
            a.dst[i3*a.d_s3 + (int64_t) (hkv*G + g)*a.d_s2 + d] = L > 0.0f ? O/L : 0.0f;
        }
    } else {
    // merge the cluster's blocks
    cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
    cluster.sync();
    for (int e = rank*AD_THREADS + tid; e < G*D; e += nb*AD_THREADS) {
        const int g = e / D;
        const int d = e % D;
        float mb[AD_MAX_NB];
        float M = -INFINITY;
#pragma unroll
        for (int b = 0; b < AD_MAX_NB; ++b) {
            mb[b] = b < nb ? *cluster.map_shared_rank(&s_m[g], b) : -INFINITY;
            M     = fmaxf(M, mb[b]);
        }
        float L = 0.0f;
        float O = 0.0f;
#pragma unroll
        for (int b = 0; b < AD_MAX_NB; ++b) {
            if (b < nb && mb[b] != -INFINITY) {
                const float wb = expf(mb[b] - M);
                L += wb * *cluster.map_shared_rank(&s_l[g], b);
                O += wb * *cluster.map_shared_rank(&s_o[g][d], b);
            }
        }
        a.dst[i3*a.d_s3 + (int64_t) (hkv*G + g)*a.d_s2 + d] = L > 0.0f ? O/L : 0.0f;
    }
    cluster.sync(); // the peers read this block's shared memory until here
    }
#else
    GGML_UNUSED_VARS(a, ppb);
#endif // defined(AD_CLUSTER_AVAILABLE) && __CUDA_ARCH__ >= GGML_CUDA_CC_HOPPER
}

template <int D, int GM, int MG, int NG>
static __global__ void __launch_bounds__(AD_THREADS*NG) attn_decode(const attn_decode_args a, const int ppb) {
#if defined(AD_CLUSTER_AVAILABLE) && __CUDA_ARCH__ >= GGML_CUDA_CC_HOPPER
    ggml_cuda_pdl_lc();
    ggml_cuda_pdl_sync(); // q and the cache rows of this token come from the kernels before
    ad_body<D, GM, MG, NG>(a, ppb);
#else
    GGML_UNUSED_VARS(a, ppb);
    NO_DEVICE_CODE;
#endif // defined(AD_CLUSTER_AVAILABLE) && __CUDA_ARCH__ >= GGML_CUDA_CC_HOPPER
}

// the RoPE / cache-write kernel's work (rope-store.cu) for one token, then the attention: the block that does it for
// KV head h (block 0 of the head's cluster, or the head's one block with groups) ropes q of the head's G query heads
// and k of head h into their outputs (k into its cache row) and copies v of head h into its cache row; one cluster
// (block) barrier makes those stores visible to the blocks (groups) of the head, the only ones to read them (a KV
// head's attention reads only its own q heads and cache pieces)
template <int D, int GM, int MG, int NG>
static __global__ void __launch_bounds__(AD_THREADS*NG) attn_rope_decode(const attn_decode_args a, const rs_args r, const int ppb) {
#if defined(AD_CLUSTER_AVAILABLE) && __CUDA_ARCH__ >= GGML_CUDA_CC_HOPPER
    static_assert(MG == AD_MERGE_CLUSTER || MG == AD_MERGE_GROUPS, "attn_rope_decode: a cluster or groups");
    ggml_cuda_pdl_lc();
    ggml_cuda_pdl_sync(); // q, k, v come from the kernel before
    if (MG == AD_MERGE_GROUPS || cooperative_groups::this_cluster().block_rank() == 0) {
        const int hkv = blockIdx.y;
        const int G   = a.n_head/a.n_head_kv;
        const int hq  = r.q.ne0/2;
        const int hk  = r.k.ne0/2;
        const int dv  = r.v.ne0/a.n_head_kv;
        for (int e = threadIdx.x; e < G*hq; e += blockDim.x) {
            rs_rope_pair(r.q, (int64_t) (hkv*G + e/hq)*hq + e % hq);
        }
        for (int e = threadIdx.x; e < hk; e += blockDim.x) {
            rs_rope_pair(r.k, (int64_t) hkv*hk + e);
        }
        for (int e = threadIdx.x; e < dv; e += blockDim.x) {
            const int c = hkv*dv + e;
            rs_store(r.v.dst, r.v.rows[0]*r.v.srow + c, r.v.x[c], r.v.f16);
        }
    }
    if constexpr (MG == AD_MERGE_GROUPS) {
        __syncthreads();
    } else {
        cooperative_groups::this_cluster().sync();
    }
    ad_body<D, GM, MG, NG>(a, ppb);
#else
    GGML_UNUSED_VARS(a, r, ppb);
    NO_DEVICE_CODE;
#endif // defined(AD_CLUSTER_AVAILABLE) && __CUDA_ARCH__ >= GGML_CUDA_CC_HOPPER
}

// ---- version 8: long KV, streamed. Grid (KV heads, nb, streams) of AD8_THREADS; block b takes positions
// [b*ppb, (b+1)*ppb) of its KV head. A lane holds 8 components of U K rows and of the same U V rows (the LPR lanes of
// a row hold all of it), adds its products over the row's lanes by shuffles and keeps its own running softmax over
// its rows: no shared memory and no barrier in the loop, only K / V loads in flight. At the end the lanes, then the
// warps, merge their (max, sum, output); the block writes its partial to a.ws and attn_decode_combine (one block a
// KV head and stream) merges the nb partials.
#define AD8_THREADS 256
#define AD8_MAX_NB  256 // blocks a KV head
#define AD8_WARPS   (AD8_THREADS/WARP_SIZE)
#ifndef AD8_U
#define AD8_U       4   // rows a lane a step
#endif
#ifndef AD8_MINB
#define AD8_MINB    1   // blocks an SM at G <= 4 (2: 128 registers a thread)
#endif

static __device__ __forceinline__ void ad8_cvt8(const uint4 & u, float (&f)[8]) {
    const half2 * h = (const half2 *) &u;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const float2 x = __half22float2(h[j]);
        f[2*j]     = x.x;
        f[2*j + 1] = x.y;
    }
}

// (m, l, o) of lane ^ off merged into this lane's
template <int GM>
static __device__ __forceinline__ void ad8_merge_xor(float (&m)[GM], float (&l)[GM], float (&o)[GM][8], const int off) {
#pragma unroll
    for (int g = 0; g < GM; ++g) {
        const float mo = __shfl_xor_sync(0xFFFFFFFF, m[g], off);
        const float lo = __shfl_xor_sync(0xFFFFFFFF, l[g], off);
        const float mn = fmaxf(m[g], mo);
        const float ws = mn == -INFINITY ? 0.0f : expf(m[g] - mn);
        const float wo = mn == -INFINITY ? 0.0f : expf(mo - mn);
        l[g] = l[g]*ws + lo*wo;
        m[g] = mn;
#pragma unroll
        for (int c = 0; c < 8; ++c) {
            o[g][c] = o[g][c]*ws + __shfl_xor_sync(0xFFFFFFFF, o[g][c], off)*wo;
        }
    }
}

template <int D, int GM>
static __global__ void __launch_bounds__(AD8_THREADS, GM <= 4 ? AD8_MINB : 1)
        attn_decode_split(const attn_decode_args a, const int ppb) {
#if defined(AD_CLUSTER_AVAILABLE) && __CUDA_ARCH__ >= GGML_CUDA_CC_HOPPER
    constexpr int LPR = D/8;          // lanes a row
    constexpr int RPW = WARP_SIZE/LPR; // rows a warp load
    constexpr int RPS = AD8_U*RPW;    // rows a warp step
    ggml_cuda_pdl_lc();
    ggml_cuda_pdl_sync(); // q and this token's cache rows come from the kernels before

    const int hkv   = blockIdx.x; // the KV heads of a position range run side by side: their rows share DRAM pages
    const int b     = blockIdx.y;
    const int nb    = gridDim.y;
    const int i3    = blockIdx.z;
    const int G     = a.n_head/a.n_head_kv;
    const int lane  = threadIdx.x % WARP_SIZE;
    const int warp  = threadIdx.x / WARP_SIZE;
    const int piece = lane % LPR;
    const int sub   = lane / LPR;
    const int p0    = b*ppb;
    const int np    = max(0, min(a.n_kv - p0, ppb));

    float qv[GM][8];
    ad_load_q<GM>(a, G, hkv, i3, piece, qv);
    const half * kb = a.k + i3*a.k_s3 + hkv*a.k_s2 + (int64_t) p0*a.k_s1 + 8*piece;
    const half * vb = a.v + i3*a.v_s3 + hkv*a.v_s2 + (int64_t) p0*a.v_s1 + 8*piece;

    float m[GM], l[GM], o[GM][8];
#pragma unroll
    for (int g = 0; g < GM; ++g) {
        m[g] = -INFINITY;
        l[g] = 0.0f;
#pragma unroll
        for (int c = 0; c < 8; ++c) {
            o[g][c] = 0.0f;
        }
    }

    // a step's K / V rows and mask entries (one mask plane: a.m_ne2 == 1) into registers; -inf past np
    const half * mr = a.mask ? a.mask + (i3 % a.m_ne3)*a.m_s3 + p0 : nullptr;
    auto fetch = [&](const int r0, uint4 (&kk)[AD8_U], uint4 (&vv)[AD8_U], half (&mk)[AD8_U]) {
#pragma unroll
        for (int u = 0; u < AD8_U; ++u) {
            const int r = r0 + u*RPW + sub;
            kk[u] = r < np ? *(const uint4 *) (kb + (int64_t) r*a.k_s1) : make_uint4(0, 0, 0, 0);
            vv[u] = r < np ? *(const uint4 *) (vb + (int64_t) r*a.v_s1) : make_uint4(0, 0, 0, 0);
            mk[u] = r >= np ? __float2half(-INFINITY) : mr ? mr[r] : __float2half(0.0f);
        }
    };
    uint4 kk[AD8_U], vv[AD8_U];
    half  mk[AD8_U];
    fetch(warp*RPS, kk, vv, mk);
    for (int r0 = warp*RPS; r0 < np; r0 += AD8_WARPS*RPS) {
        // the next step's rows requested before this step's math
        uint4 kn[AD8_U], vn[AD8_U];
        half  mkn[AD8_U];
        fetch(r0 + AD8_WARPS*RPS, kn, vn, mkn);
        float sc[AD8_U][GM];
#pragma unroll
        for (int u = 0; u < AD8_U; ++u) {
            float kf[8];
            ad8_cvt8(kk[u], kf);
            const float mv = __half2float(mk[u]);
#pragma unroll
            for (int g = 0; g < GM; ++g) {
                float s = 0.0f;
#pragma unroll
                for (int c = 0; c < 8; ++c) {
                    s += qv[g][c]*kf[c];
                }
#pragma unroll
                for (int off = LPR/2; off > 0; off >>= 1) {
                    s += __shfl_xor_sync(0xFFFFFFFF, s, off);
                }
                sc[u][g] = s + mv;
            }
        }
        // running softmax over this lane's rows, then their V
#pragma unroll
        for (int g = 0; g < GM; ++g) {
            float mx = sc[0][g];
#pragma unroll
            for (int u = 1; u < AD8_U; ++u) {
                mx = fmaxf(mx, sc[u][g]);
            }
            const float mn = fmaxf(m[g], mx);
            const float rs = mn == -INFINITY ? 1.0f : expf(m[g] - mn);
#pragma unroll
            for (int u = 0; u < AD8_U; ++u) {
                sc[u][g] = mn == -INFINITY ? 0.0f : expf(sc[u][g] - mn);
            }
            m[g] = mn;
            l[g] *= rs;
#pragma unroll
            for (int c = 0; c < 8; ++c) {
                o[g][c] *= rs;
            }
        }
#pragma unroll
        for (int u = 0; u < AD8_U; ++u) {
            float vf[8];
            ad8_cvt8(vv[u], vf);
#pragma unroll
            for (int g = 0; g < GM; ++g) {
                l[g] += sc[u][g];
#pragma unroll
                for (int c = 0; c < 8; ++c) {
                    o[g][c] += sc[u][g]*vf[c];
                }
            }
        }
#pragma unroll
        for (int u = 0; u < AD8_U; ++u) {
            kk[u] = kn[u];
            vv[u] = vn[u];
            mk[u] = mkn[u];
        }
    }

    // the lanes of a piece (sub 0 .. RPW-1), then the warps through shared memory
#pragma unroll
    for (int off = LPR; off < WARP_SIZE; off <<= 1) {
        ad8_merge_xor<GM>(m, l, o, off);
    }
    __shared__ float s_o[AD8_WARPS][GM][D];
    __shared__ float s_m[AD8_WARPS][GM], s_l[AD8_WARPS][GM];
    if (sub == 0) {
#pragma unroll
        for (int g = 0; g < GM; ++g) {
#pragma unroll
            for (int c = 0; c < 8; ++c) {
                s_o[warp][g][8*piece + c] = o[g][c];
            }
            if (piece == 0) {
                s_m[warp][g] = m[g];
                s_l[warp][g] = l[g];
            }
        }
    }
    __syncthreads();
    constexpr int SLOT = GM*(D + 2); // a block's partial in a.ws: o [GM][D], m [GM], l [GM]
    float * slot = a.ws + ((int64_t) (i3*a.n_head_kv + hkv)*nb + b)*SLOT;
    for (int e = threadIdx.x; e < G*D; e += AD8_THREADS) {
        const int g = e / D;
        const int d = e % D;
        float M = -INFINITY;
#pragma unroll
        for (int w = 0; w < AD8_WARPS; ++w) {
            M = fmaxf(M, s_m[w][g]);
        }
        float L = 0.0f;
        float O = 0.0f;
#pragma unroll
        for (int w = 0; w < AD8_WARPS; ++w) {
            const float ww = M == -INFINITY ? 0.0f : expf(s_m[w][g] - M);
            L += ww*s_l[w][g];
            O += ww*s_o[w][g][d];
        }
        slot[e] = O;
        if (d == 0) {
            slot[GM*D + g]      = M;
            slot[GM*D + GM + g] = L;
        }
    }
#else
    GGML_UNUSED_VARS(a, ppb);
    NO_DEVICE_CODE;
#endif // defined(AD_CLUSTER_AVAILABLE) && __CUDA_ARCH__ >= GGML_CUDA_CC_HOPPER
}

// version 8's merge: block (KV head, stream), thread (q head of the group, component). Warp g first finds head g's
// maximum and the blocks' weights (its lanes over the blocks), then every thread sums its component over the blocks
// with the loads of 8 blocks in flight
template <int D, int GM>
static __global__ void __launch_bounds__(GM*D) attn_decode_combine(const attn_decode_args a, const int nb) {
#if defined(AD_CLUSTER_AVAILABLE) && __CUDA_ARCH__ >= GGML_CUDA_CC_HOPPER
    static_assert(GM*D/WARP_SIZE >= GM, "attn_decode_combine: a warp a head");
    ggml_cuda_pdl_sync(); // the partials of the kernel before
    ggml_cuda_pdl_lc();
    constexpr int SLOT = GM*(D + 2);
    __shared__ float s_w[GM][AD8_MAX_NB];
    __shared__ float s_il[GM];
    const int hkv  = blockIdx.x;
    const int i3   = blockIdx.y;
    const int G    = a.n_head/a.n_head_kv;
    const int lane = threadIdx.x % WARP_SIZE;
    const int warp = threadIdx.x / WARP_SIZE;
    const float * base = a.ws + (int64_t) (i3*a.n_head_kv + hkv)*nb*SLOT;
    if (warp < G) {
        float mb[AD8_MAX_NB/WARP_SIZE], M = -INFINITY;
#pragma unroll
        for (int j = 0; j < AD8_MAX_NB/WARP_SIZE; ++j) {
            const int b = j*WARP_SIZE + lane;
            mb[j] = b < nb ? __ldcg(base + b*SLOT + GM*D + warp) : -INFINITY;
            M = fmaxf(M, mb[j]);
        }
        M = warp_reduce_max<WARP_SIZE>(M);
        float L = 0.0f;
#pragma unroll
        for (int j = 0; j < AD8_MAX_NB/WARP_SIZE; ++j) {
            const int b = j*WARP_SIZE + lane;
            if (b < nb) {
                const float w = mb[j] == -INFINITY ? 0.0f : expf(mb[j] - M);
                s_w[warp][b] = w;
                L += w*__ldcg(base + b*SLOT + GM*D + GM + warp);
            }
        }
        L = warp_reduce_sum<WARP_SIZE>(L);
        if (lane == 0) {
            s_il[warp] = L > 0.0f ? 1.0f/L : 0.0f;
        }
    }
    __syncthreads();
    const int g = threadIdx.x / D;
    const int d = threadIdx.x % D;
    if (g >= G) {
        return;
    }
    float O = 0.0f;
#pragma unroll 8
    for (int b = 0; b < nb; ++b) {
        O += s_w[g][b]*__ldcg(base + b*SLOT + g*D + d);
    }
    a.dst[i3*a.d_s3 + (int64_t) (hkv*G + g)*a.d_s2 + d] = O*s_il[g];
#else
    GGML_UNUSED_VARS(a, nb);
    NO_DEVICE_CODE;
#endif // defined(AD_CLUSTER_AVAILABLE) && __CUDA_ARCH__ >= GGML_CUDA_CC_HOPPER
}

static int ad_env(const char * name, const int def) {
    const char * e = getenv(name);
    return e ? atoi(e) : def;
}

// LLAMA_SPARSE_CUDA_ATTN_V: 3 or 6, else 2 (the default)
static int ad_version() {
    static const int v = [] {
        const int e = ad_env("LLAMA_SPARSE_CUDA_ATTN_V", 2);
        return e == 3 || e == 6 ? e : 2;
    }();
    return v;
}

// q heads a KV head as compiled (GM): 1, 2, 4 or 8
static constexpr int ad_gm(const int G) {
    return G <= 2 ? G : G <= 4 ? 4 : 8;
}

// groups of 4 warps a block (version 6): 4 while shared memory and registers allow, else 2
static constexpr int ad_ng(const int gm) {
    return gm <= 2 ? 4 : 2;
}

// longest KV this kernel takes (beyond it, upstream's split kernels are the better choice)
static int ad_max_kv() {
    static const int v = std::min(ad_env("LLAMA_SPARSE_CUDA_ATTN_MAX_KV", 2048), 65536);
    return v;
}

template <int D, int GM>
static void ad_launch(const attn_decode_args & a, const int nb, const int ppb, const int version, const rs_args * rope,
                      cudaStream_t stream) {
#ifdef AD_CLUSTER_AVAILABLE
    const dim3 grid(nb, a.n_head_kv, a.n_seq);
    if (version == 8) {
        ggml_sparse_cuda_launch_ex(attn_decode_split<D, GM>, dim3(a.n_head_kv, nb, a.n_seq), dim3(AD8_THREADS), 0, 0,
                                   stream, a, ppb);
        ggml_sparse_cuda_launch_ex(attn_decode_combine<D, GM>, dim3(a.n_head_kv, a.n_seq), dim3(GM*D), 0, 0, stream,
                                   a, nb);
        return;
    }
    if (version == 6) {
        constexpr int NG = ad_ng(GM);
        const dim3 block(NG*AD_THREADS);
        if (rope) {
            ggml_sparse_cuda_launch_ex(attn_rope_decode<D, GM, AD_MERGE_GROUPS, NG>, grid, block, 0, 0, stream, a, *rope,
                                       ppb);
        } else {
            ggml_sparse_cuda_launch_ex(attn_decode<D, GM, AD_MERGE_GROUPS, NG>, grid, block, 0, 0, stream, a, ppb);
        }
        return;
    }
    if (rope) {
        ggml_sparse_cuda_launch_ex(attn_rope_decode<D, GM, AD_MERGE_CLUSTER, 1>, grid, dim3(AD_THREADS), 0, nb, stream,
                                   a, *rope, ppb);
        return;
    }
    static const bool no_cluster = ad_env("LLAMA_SPARSE_CUDA_ATTN_NOCLUSTER", 0) > 0; // nb 1: a plain launch (A/B)
    const bool last = version == 3;
    ggml_sparse_cuda_launch_ex(last ? attn_decode<D, GM, AD_MERGE_LAST, 1> : attn_decode<D, GM, AD_MERGE_CLUSTER, 1>,
                               grid, dim3(AD_THREADS), 0, !last && (nb > 1 || !no_cluster) ? nb : 0, stream, a, ppb);
#else
    GGML_UNUSED_VARS(a, nb, ppb, version, rope, stream);
#endif // AD_CLUSTER_AVAILABLE
}

// version 3: partials and counters per (device, stream), made outside stream capture (ggml-cuda runs a graph eagerly
// before it captures it); counters start at 0 and every launch leaves them at 0
#define AD_WS_FLOATS (1 << 21)
#define AD_CNT_N     (1 << 14)
struct ad_buf {
    float * ws  = nullptr;
    int   * cnt = nullptr;
};
static std::mutex                                    ad_buf_mutex;
static std::map<std::pair<int, cudaStream_t>, ad_buf> ad_bufs;

static bool ad_buf_get(const int device, cudaStream_t stream, ad_buf & b) {
    std::lock_guard<std::mutex> lock(ad_buf_mutex);
    auto it = ad_bufs.find({ device, stream });
    if (it == ad_bufs.end()) {
        cudaStreamCaptureStatus st;
        CUDA_CHECK(cudaStreamIsCapturing(stream, &st));
        if (st != cudaStreamCaptureStatusNone) {
            return false;
        }
        ad_buf nb;
        CUDA_CHECK(cudaMalloc(&nb.ws, AD_WS_FLOATS*sizeof(float)));
        CUDA_CHECK(cudaMalloc(&nb.cnt, AD_CNT_N*sizeof(int)));
        CUDA_CHECK(cudaMemsetAsync(nb.cnt, 0, AD_CNT_N*sizeof(int), stream));
        it = ad_bufs.emplace(std::make_pair(device, stream), nb).first;
    }
    b = it->second;
    return true;
}

// version 8: blocks a KV head (LLAMA_SPARSE_CUDA_ATTN_NB8, else one block an SM in one wave, at least 128 positions a
// block; a second partial wave was slower: bench/results/attn_long_h200_2026-12-04b.md)
static int ad8_blocks(const int device, const attn_decode_args & a) {
    static const int env = ad_env("LLAMA_SPARSE_CUDA_ATTN_NB8", 0);
    static int sms[GGML_CUDA_MAX_DEVICES] = { 0 };
    if (env > 0) {
        return env;
    }
    if (sms[device] == 0) {
        CUDA_CHECK(cudaDeviceGetAttribute(&sms[device], cudaDevAttrMultiProcessorCount, device));
    }
    const int heads = a.n_head_kv*a.n_seq;
    return std::max(1, std::min(AD8_MINB*sms[device]/heads, (a.n_kv + 127)/128));
}

template <int D>
static void ad_launch_d(const attn_decode_args & a, const int gm, const int nb, const int ppb, const int version,
                        const rs_args * rope, cudaStream_t stream) {
    switch (gm) {
        case 1:  ad_launch<D, 1>(a, nb, ppb, version, rope, stream); break;
        case 2:  ad_launch<D, 2>(a, nb, ppb, version, rope, stream); break;
        case 4:  ad_launch<D, 4>(a, nb, ppb, version, rope, stream); break;
        default: ad_launch<D, 8>(a, nb, ppb, version, rope, stream); break;
    }
}

bool attn_decode_launch(const attn_decode_args & a, int nb, const int device, cudaStream_t stream, int version,
                        const rs_args * rope) {
#ifdef AD_CLUSTER_AVAILABLE
    static int cc_major[GGML_CUDA_MAX_DEVICES] = { 0 };
    if (device < 0 || device >= GGML_CUDA_MAX_DEVICES) {
        return false;
    }
    if (cc_major[device] == 0) {
        CUDA_CHECK(cudaDeviceGetAttribute(&cc_major[device], cudaDevAttrComputeCapabilityMajor, device));
    }
    if (version <= 0) {
        version = ad_version();
    }
    if (cc_major[device] < 9 || (a.D != 64 && a.D != 128) || a.n_head_kv < 1 || a.n_head % a.n_head_kv != 0 ||
            a.n_head/a.n_head_kv > AD_MAX_G || a.n_kv < 1 || (version != 8 && a.n_kv > ad_max_kv()) || a.n_seq < 1 ||
            a.n_head_kv > 65535 || a.n_seq > 65535) {
        return false;
    }
    // 16-byte K pieces, D/32-component V pieces, 8-float q pieces
    const int vb = (a.D/WARP_SIZE)*(int) sizeof(half);
    if ((uintptr_t) a.k % 16 != 0 || (a.k_s1 | a.k_s2 | a.k_s3) % 8 != 0 || (uintptr_t) a.v % vb != 0 ||
            ((a.v_s1 | a.v_s2 | a.v_s3)*(int64_t) sizeof(half)) % vb != 0 || (uintptr_t) a.q % 16 != 0 ||
            (a.q_s2 | a.q_s3) % 4 != 0) {
        return false;
    }
    if (version != 2 && version != 3 && version != 6 && version != 8) {
        return false;
    }
    if (version == 8 && (rope || (a.mask && a.m_ne2 != 1) || (a.v_s1 | a.v_s2 | a.v_s3) % 8 != 0 ||
            (uintptr_t) a.v % 16 != 0)) {
        return false; // (16-byte V pieces, one mask plane; no RoPE in it)
    }
    if (rope) {
        // one token, one stream; q's heads and k's / v's KV heads as the attention's
        const int dv = rope->v.ne0/std::max(1, a.n_head_kv);
        if (a.n_seq != 1 || rope->q.ne2 != 1 || rope->k.ne2 != 1 || rope->v.nrows != 1 || rope->q.ne1 != a.n_head ||
                rope->k.ne1 != a.n_head_kv || rope->q.ne0 != a.D || rope->k.ne0 != a.D ||
                rope->v.ne0 != a.n_head_kv*dv || dv != a.D) {
            return false;
        }
        version = version == 3 ? 2 : version; // (no workspace merge here)
    }
    attn_decode_args ap = a;
    const int gm = ad_gm(a.n_head/a.n_head_kv);
    int ppb;
    if (version == 6) {
        // one block a KV head, its groups split the positions
        nb  = 1;
        ppb = (a.n_kv + ad_ng(gm) - 1)/ad_ng(gm);
    } else if (version == 8) {
        if (nb <= 0) {
            nb = ad8_blocks(device, a);
        }
        const int64_t fit = AD_WS_FLOATS/((int64_t) a.n_head_kv*a.n_seq*gm*(a.D + 2)); // partials a.ws holds
        nb  = (int) std::max<int64_t>(1, std::min<int64_t>({ nb, AD8_MAX_NB, a.n_kv, fit }));
        ppb = (a.n_kv + nb - 1)/nb;
    } else {
        if (nb <= 0) {
            static const int env = ad_env("LLAMA_SPARSE_CUDA_ATTN_NB", 0);
            nb = env > 0 ? env : (a.n_kv + 31)/32; // ~32 positions a block
        }
        nb  = std::max(1, std::min({ nb, version == 3 ? AD_MAX_NB3 : AD_MAX_NB, a.n_kv }));
        ppb = (a.n_kv + nb - 1)/nb;
    }
    if (version == 3 || version == 8) { // partials in the workspace (version 3: and a counter a KV head)
        ad_buf b;
        if ((version == 3 && (int64_t) a.n_head_kv*a.n_seq > AD_CNT_N) ||
                (int64_t) nb*a.n_head_kv*a.n_seq*gm*(a.D + 2) > AD_WS_FLOATS || !ad_buf_get(device, stream, b)) {
            return false;
        }
        ap.ws  = b.ws;
        ap.cnt = b.cnt;
    }
    if (a.D == 64) {
        ad_launch_d<64>(ap, gm, nb, ppb, version, rope, stream);
    } else {
        ad_launch_d<128>(ap, gm, nb, ppb, version, rope, stream);
    }
    return true;
#else
    GGML_UNUSED_VARS(a, nb, device, stream, version, rope);
    return false;
#endif // AD_CLUSTER_AVAILABLE
}

#ifndef GGML_SPARSE_CUDA_STANDALONE
// LLAMA_SPARSE_CUDA_ATTN_FUSE: 0 (default) off, 1 this kernel at FLASH_ATTN_EXT nodes, 2 also with the RoPE / cache
// writes before it (rope-store.cu); off with GGML_CUDA_DISABLE_FUSION=1 (not yet measured faster end to end:
// bench/results/cuda_h100_2026-11-27e.md)
int ggml_cuda_attn_decode_mode() {
    static const int mode = [] {
        const int v = ad_env("LLAMA_SPARSE_CUDA_ATTN_FUSE", 0);
        return v > 0 && ggml_sparse_cuda_fusion_on("LLAMA_SPARSE_CUDA_ATTN_FUSE") ? std::min(v, 2) : 0;
    }();
    return mode;
}

bool ggml_cuda_attn_decode_args(const ggml_tensor * dst, attn_decode_args & a) {
    const ggml_tensor * q    = dst->src[0];
    const ggml_tensor * k    = dst->src[1];
    const ggml_tensor * v    = dst->src[2];
    const ggml_tensor * mask = dst->src[3];
    if (dst->op != GGML_OP_FLASH_ATTN_EXT) {
        return false;
    }
    float scale, max_bias, softcap;
    memcpy(&scale,    (const float *) dst->op_params + 0, sizeof(float));
    memcpy(&max_bias, (const float *) dst->op_params + 1, sizeof(float));
    memcpy(&softcap,  (const float *) dst->op_params + 2, sizeof(float));
    if (dst->src[4] != nullptr || max_bias != 0.0f || softcap != 0.0f || q->type != GGML_TYPE_F32 ||
            k->type != GGML_TYPE_F16 || v->type != GGML_TYPE_F16 || dst->type != GGML_TYPE_F32 || q->ne[1] != 1 ||
            k->ne[0] != q->ne[0] || v->ne[0] != q->ne[0] || k->ne[1] != v->ne[1] || k->ne[2] != v->ne[2] ||
            k->ne[3] != q->ne[3] || v->ne[3] != q->ne[3] || q->nb[0] != sizeof(float) || k->nb[0] != sizeof(half) ||
            v->nb[0] != sizeof(half) || !ggml_is_contiguous(dst) || q->nb[2] % sizeof(float) != 0 ||
            q->nb[3] % sizeof(float) != 0 || k->nb[1] % sizeof(half) != 0 || v->nb[1] % sizeof(half) != 0 ||
            k->ne[1] > INT32_MAX || q->ne[2] > INT32_MAX) {
        return false;
    }
    if (mask != nullptr && (mask->type != GGML_TYPE_F16 || mask->ne[0] < k->ne[1] || mask->nb[0] != sizeof(half) ||
            q->ne[2] % mask->ne[2] != 0 || q->ne[3] % mask->ne[3] != 0)) {
        return false;
    }
    if (ggml_sparse_mem_overlaps(dst, q) || ggml_sparse_mem_overlaps(dst, k) || ggml_sparse_mem_overlaps(dst, v) ||
            (mask && ggml_sparse_mem_overlaps(dst, mask))) {
        return false;
    }
    a = {};
    a.q     = (const float *) q->data;
    a.q_s2  = q->nb[2]/sizeof(float);
    a.q_s3  = q->nb[3]/sizeof(float);
    a.k     = (const half *) k->data;
    a.k_s1  = k->nb[1]/sizeof(half);
    a.k_s2  = k->nb[2]/sizeof(half);
    a.k_s3  = k->nb[3]/sizeof(half);
    a.v     = (const half *) v->data;
    a.v_s1  = v->nb[1]/sizeof(half);
    a.v_s2  = v->nb[2]/sizeof(half);
    a.v_s3  = v->nb[3]/sizeof(half);
    a.mask  = mask ? (const half *) mask->data : nullptr;
    a.m_s2  = mask ? mask->nb[2]/sizeof(half) : 0;
    a.m_s3  = mask ? mask->nb[3]/sizeof(half) : 0;
    a.m_ne2 = mask ? (int) mask->ne[2] : 1;
    a.m_ne3 = mask ? (int) mask->ne[3] : 1;
    a.dst   = (float *) dst->data;
    a.d_s2  = dst->nb[1]/sizeof(float);
    a.d_s3  = dst->nb[3]/sizeof(float);
    a.D         = (int) q->ne[0];
    a.n_head    = (int) q->ne[2];
    a.n_head_kv = (int) k->ne[2];
    a.n_kv      = (int) k->ne[1];
    a.n_seq     = (int) q->ne[3];
    a.scale     = scale;
    return true;
}

// LLAMA_SPARSE_CUDA_ATTN_LONG=N: one-token flash attention over N or more positions runs as version 8 (default
// 24576; 0: off; also off with GGML_CUDA_DISABLE_FUSION=1). 8B-shaped decode on the H200: 4-6 % faster at 24k / 32k,
// even at 16k, slower at 8k (bench/results/attn_long_h200_2026-12-05.md)
static int ad_long_kv() {
    static const int v = [] {
        const int e = ad_env("LLAMA_SPARSE_CUDA_ATTN_LONG", 24576);
        return e > 0 && ggml_sparse_cuda_fusion_on("LLAMA_SPARSE_CUDA_ATTN_LONG") ? e : 0;
    }();
    return v;
}

int ggml_cuda_attn_decode_fuse(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, int i) {
    ggml_tensor * dst = ggml_graph_node(cgraph, i);
    attn_decode_args a;
    // nodes neither version takes are left to upstream before their arguments are read
    if (dst->op != GGML_OP_FLASH_ATTN_EXT || (ggml_cuda_attn_decode_mode() == 0 &&
            (ad_long_kv() == 0 || dst->src[1]->ne[1] < ad_long_kv())) || !ggml_cuda_attn_decode_args(dst, a)) {
        return 0;
    }
    if (ad_long_kv() > 0 && a.n_kv >= ad_long_kv() && attn_decode_launch(a, 0, ctx.device, ctx.stream(), 8)) {
        static std::atomic<bool> logged_long{false};
        if (!logged_long.exchange(true)) {
            GGML_LOG_INFO("llama-sparse: CUDA runs one-token flash attention over %d+ positions as one streamed split "
                          "(first: %s, %d positions; LLAMA_SPARSE_CUDA_ATTN_LONG=0 turns it off)\n", ad_long_kv(),
                          dst->name, a.n_kv);
        }
        return 1;
    }
    if (ggml_cuda_attn_decode_mode() == 0 || !attn_decode_launch(a, 0, ctx.device, ctx.stream())) {
        return 0;
    }
    static std::atomic<bool> logged{false};
    if (!logged.exchange(true)) {
        GGML_LOG_INFO("llama-sparse: CUDA runs one-token flash attention as one kernel a layer (first: %s, %d positions; "
                      "version %d; on by LLAMA_SPARSE_CUDA_ATTN_FUSE)\n", dst->name, a.n_kv,
                      ad_version());
    }
    return 1;
}
#endif // GGML_SPARSE_CUDA_STANDALONE
