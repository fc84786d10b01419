// llama-sparse: latencies of the steps a SparQ decode op is built from, on the GPU at hand (sm_90).
//
//   nvcc -O3 -arch=sm_90 -std=c++17 cuda/tests/sparq_probe.cu -o sparq_probe && ./sparq_probe
//
// Measurement only, no ggml. Launch floors are us a launch (a CUDA graph of back-to-back launches, best of 7 runs);
// steps inside a kernel are cycles an iteration of a dependent chain (clock64 of thread 0 of block 0), with the SM
// clock from %globaltimer to turn cycles into us. What it answers: how far below the fused op's ~20 us fixed cost
// (bench/results/cuda_h200_2026-11-29e.md) a chain of q -> i1 -> products -> statistics -> selection -> attention ->
// merge can go, step by step. Then skeletons of the whole op (the same chain, little work a step) in four
// structures: clusters of 8 (as the op), a scores kernel on all SMs before the clusters, clusters with the
// translations of what they read warmed first, and 8 or 16 blocks a head with no clusters (global barriers); and how
// fast one block an SM streams its share with loads or bulk copies. Results: bench/results/cuda_h200_2026-12-02b.md.
#include <cooperative_groups.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

namespace cg = cooperative_groups;

#include "probe-check.h"

#define CUDA_CHECK CK
#include "graph-time.h"

#define ITERS 256

static __device__ __forceinline__ uint64_t gtimer() {
    uint64_t t;
    asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
    return t;
}

// cycles[0] = cycles of ITERS iterations, cycles[1] = ns over the same span (globaltimer), cycles[2] = a sink
struct probe_out {
    unsigned long long cyc, ns, sink;
};

// ---- launch floors ----
static __global__ void k_empty(int * p) {
    if (p && threadIdx.x == 1023) {
        *p = 0;
    }
}

static __global__ void k_empty_pdl(int * p) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    if (p && threadIdx.x == 1023) {
        *p = 0;
    }
    asm volatile("griddepcontrol.launch_dependents;");
}

// a launch on grid x block (smem bytes of dynamic shared memory) in st: clusters of `cluster` blocks along x (none
// for 1), programmatic serialization with pdl; at holds the attributes
static cudaLaunchConfig_t make_cfg(dim3 grid, dim3 block, size_t smem, cudaStream_t st, cudaLaunchAttribute (&at)[2],
                                   int cluster, bool pdl) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim          = grid;
    cfg.blockDim         = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream           = st;
    int n = 0;
    if (cluster > 1) {
        at[n].id               = cudaLaunchAttributeClusterDimension;
        at[n].val.clusterDim.x = cluster;
        at[n].val.clusterDim.y = 1;
        at[n].val.clusterDim.z = 1;
        ++n;
    }
    if (pdl) {
        at[n].id                                         = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[n].val.programmaticStreamSerializationAllowed = 1;
        ++n;
    }
    cfg.attrs    = at;
    cfg.numAttrs = n;
    return cfg;
}

static cudaError_t launch(void (*k)(int *), dim3 grid, dim3 block, int cluster, bool pdl, cudaStream_t st, int * p) {
    cudaLaunchAttribute at[2];
    cudaLaunchConfig_t  cfg = make_cfg(grid, block, 0, st, at, cluster, pdl);
    return cudaLaunchKernelEx(&cfg, k, p);
}

// us a launch of one(stream): reps launches in a CUDA graph, the best of 7 runs (graph-time.h)
static double time_graph(const std::function<void(cudaStream_t)> & one, int reps, cudaStream_t st) {
    return time_graph_us([&](cudaStream_t s, int) { one(s); }, reps, st, true);
}

// ---- steps inside a kernel ----
template <int WHAT>
static __global__ void k_block_step(probe_out * o, const int * chase, const int start) {
    __shared__ int s[1024];
    s[threadIdx.x] = (threadIdx.x + 1) % blockDim.x;
    __syncthreads();
    int v = start + threadIdx.x; // (start: another part of the ring on every repetition, so no run finds it in L2)
    float f = threadIdx.x;
    const uint64_t t0 = gtimer();
    const long long c0 = clock64();
    for (int i = 0; i < ITERS; ++i) {
        if (WHAT == 0) {        // __syncthreads
            __syncthreads();
        } else if (WHAT == 1) { // warp sum (5 dependent shuffles)
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) {
                f += __shfl_xor_sync(0xFFFFFFFF, f, off);
            }
        } else if (WHAT == 2) { // dependent shared load
            v = s[v];
        } else if (WHAT == 3) { // block sum: warp sums, shared, barrier, warp sum, barrier
            float w = f;
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) {
                w += __shfl_xor_sync(0xFFFFFFFF, w, off);
            }
            __shared__ float sw[32];
            if (threadIdx.x % 32 == 0) {
                sw[threadIdx.x/32] = w;
            }
            __syncthreads();
            w = threadIdx.x < blockDim.x/32 ? sw[threadIdx.x] : 0.0f;
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) {
                w += __shfl_xor_sync(0xFFFFFFFF, w, off);
            }
            f = w*1e-9f + 1.0f;
            __syncthreads();
        } else if (WHAT == 4) { // dependent global load (chase: an L2-resident or a DRAM-sized ring)
            v = __ldcg(chase + v);
        } else if (WHAT == 5) { // dependent global atomic
            v = atomicAdd((int *) chase + (v & 1023), 0) & 1023;
        }
    }
    const long long c1 = clock64();
    const uint64_t t1 = gtimer();
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        o->cyc  = c1 - c0;
        o->ns   = t1 - t0;
        o->sink = v + (int) f;
    }
}

// cluster barrier alone (WHAT 0), or barrier + a read of one word from every block of the cluster (WHAT 1),
// or a dependent chain of remote shared loads from the next block (WHAT 2)
template <int WHAT>
static __global__ void k_cluster_step(probe_out * o) {
    __shared__ int s[1024];
    cg::cluster_group cl = cg::this_cluster();
    const int rank = cl.block_rank();
    const int nb   = cl.num_blocks();
    s[threadIdx.x] = (threadIdx.x + 1) % blockDim.x;
    cl.sync();
    int * rem = cl.map_shared_rank(s, (rank + 1) % nb);
    int v = threadIdx.x;
    const uint64_t t0 = gtimer();
    const long long c0 = clock64();
    for (int i = 0; i < ITERS; ++i) {
        if (WHAT == 0) {
            cl.sync();
        } else if (WHAT == 1) {
            cl.sync();
            if (threadIdx.x < nb) {
                v += *cl.map_shared_rank(s + (v & 511), threadIdx.x);
            }
            v &= 511;
            __syncthreads();
        } else {
            v = rem[v];
        }
    }
    const long long c1 = clock64();
    const uint64_t t1 = gtimer();
    cl.sync();
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        o->cyc  = c1 - c0;
        o->ns   = t1 - t0;
        o->sink = v;
    }
}

// a barrier of the nb blocks of one KV head through a global counter (blockIdx.y = head): each block adds 1 and
// spins until the count reaches nb*(i+1). Needs every block resident (grid <= SMs, one block an SM).
static __global__ void k_head_barrier(probe_out * o, int * cnt) {
    const int nb = gridDim.x;
    int * c = cnt + 32*blockIdx.y;
    const uint64_t t0 = gtimer();
    const long long c0 = clock64();
    for (int i = 0; i < ITERS; ++i) {
        __syncthreads();
        if (threadIdx.x == 0) {
            __threadfence();
            atomicAdd(c, 1);
            int seen;
            do {
                asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(seen) : "l"(c) : "memory");
            } while (seen < nb*(i + 1));
        }
        __syncthreads();
    }
    const long long c1 = clock64();
    const uint64_t t1 = gtimer();
    if (threadIdx.x == 0 && blockIdx.x == 0 && blockIdx.y == 0) {
        o->cyc  = c1 - c0;
        o->ns   = t1 - t0;
        o->sink = 0;
    }
}

// streaming read of n 16-byte words, grid-stride (the k_t rows' bytes)
static __global__ void k_read(const uint4 * p, size_t n, int * sink) {
    uint32_t acc = 0;
    for (size_t i = blockIdx.x*(size_t) blockDim.x + threadIdx.x; i < n; i += (size_t) gridDim.x*blockDim.x) {
        const uint4 w = __ldcs(p + i);
        acc ^= w.x ^ w.y ^ w.z ^ w.w;
    }
    if (acc == 0x12345678u) {
        *sink = acc;
    }
}


// block b reads its share [b per, (b+1) per) of 16-byte words, U loads in flight a thread (all requested, then used)
template <int U>
static __global__ void __launch_bounds__(512) k_read_deep(const uint4 * p, size_t per, int * sink) {
    const uint4 * q = p + blockIdx.x*per;
    uint32_t acc = 0;
    for (size_t i0 = threadIdx.x; i0 < per; i0 += (size_t) U*blockDim.x) {
        uint4 w[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const size_t i = i0 + (size_t) u*blockDim.x;
            w[u] = i < per ? __ldcs(q + i) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            acc ^= w[u].x ^ w[u].y ^ w[u].z ^ w[u].w;
        }
    }
    if (acc == 0x12345678u) {
        *sink = acc;
    }
}

// ---- bulk copies (TMA, 1D): global -> shared, completion counted in bytes on an mbarrier ----
static __device__ __forceinline__ uint32_t smem_addr(const void * p) {
    return (uint32_t) __cvta_generic_to_shared(p);
}
static __device__ __forceinline__ void mbar_init(uint64_t * b, const uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(smem_addr(b)), "r"(count) : "memory");
}
static __device__ __forceinline__ void mbar_fence_init() {
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
// one arrival that also expects `bytes`, then the copy of `bytes` from src to dst completing on b
static __device__ __forceinline__ void bulk_load(void * dst, const void * src, const uint32_t bytes, uint64_t * b) {
    asm volatile("{ .reg .b64 st; mbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1; }"
                 :: "r"(smem_addr(b)), "r"(bytes) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 :: "r"(smem_addr(dst)), "l"(src), "r"(bytes), "r"(smem_addr(b)) : "memory");
}
static __device__ __forceinline__ void mbar_wait(uint64_t * b, const uint32_t parity) {
    uint32_t done;
    do {
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                     : "=r"(done) : "r"(smem_addr(b)), "r"(parity) : "memory");
    } while (!done);
}

// block b reads its share of per bytes in pieces of `piece` bytes through ns stages of shared memory (thread 0
// requests; every thread reads each piece from shared memory once it lands, then the stage is requested again)
static __global__ void __launch_bounds__(512) k_read_bulk(const char * p, size_t per, int piece, int ns, int * sink) {
    extern __shared__ __align__(128) char bk_buf[];
    __shared__ __align__(8) uint64_t bar[32];
    const char * src = p + blockIdx.x*per;
    const int npc = (int) (per/piece);
    if (threadIdx.x == 0) {
        for (int s = 0; s < ns; ++s) {
            mbar_init(&bar[s], 1);
        }
        mbar_fence_init();
        for (int s = 0; s < min(ns, npc); ++s) {
            bulk_load(bk_buf + (size_t) s*piece, src + (size_t) s*piece, piece, &bar[s]);
        }
    }
    __syncthreads();
    uint32_t acc = 0;
    for (int i = 0; i < npc; ++i) {
        const int s = i % ns;
        mbar_wait(&bar[s], (uint32_t) (i/ns) & 1);
        const uint4 * b4 = (const uint4 *) (bk_buf + (size_t) s*piece);
        for (int e = threadIdx.x; e < piece/16; e += blockDim.x) {
            const uint4 w = b4[e];
            acc ^= w.x ^ w.y ^ w.z ^ w.w;
        }
        __syncthreads();
        if (threadIdx.x == 0 && i + ns < npc) {
            bulk_load(bk_buf + (size_t) s*piece, src + (size_t) (i + ns)*piece, piece, &bar[s]);
        }
    }
    if (acc == 0x12345678u) {
        *sink = acc;
    }
}

// ---- the op's structure with little work in each step (Llama-3-8B shapes: 8 KV heads, G 4, D 128, r 32) ----
// fused: a cluster of 8 blocks of 512 threads per KV head, block b owning positions [b P, (b+1) P): q, i1 by ranks,
// the r rows of k_t over its positions (16-byte loads), scores and the block's maximum, then nsync cluster barriers
// each with a read of one word from every block (the statistics exchange, radix passes, ties), 16 rows of K and V a
// block (exact attention over 128 chosen positions), the partial outputs merged by block 0 after one more barrier.
// split: the same q, i1 and k_t rows in a first kernel of 16 blocks per KV head on all SMs (scores to global), then
// the clusters (programmatic launch) read their scores back and go on as fused. Their times against the real op's
// say how much of the op is its structure and how much the work in the steps.
#define SK_H 8
#define SK_G 4
#define SK_D 128
#define SK_R 32
#define SK_NB 8
#define SK_T 512
#define SK_NC 16 // first-kernel blocks per KV head (split)

// phase stamps (SM cycles) of block 0 of the last launch: [0] the fused skeleton or the split's first kernel, [1] the
// split's second kernel
__device__ long long sk_clk[2][10];
static __device__ __forceinline__ void sk_mark(const int kid, const int i) {
    if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) {
        sk_clk[kid][i] = clock64();
    }
}

struct sk_smem {
    float q[SK_G][SK_D];
    float abs[SK_D];
    int   i1[SK_R];
    float cf[SK_R][SK_G];
    float red[SK_T/32];
    float w[SK_T/32][SK_G][SK_D];
    float out[SK_G][SK_D];
    int   x[32];
};

// q, i1 and the scores of positions [p0, p0 + P) of head h into part[0 .. G*P) (part: rg*G*P floats); returns the
// largest of the thread's scores
static __device__ float sk_scores(sk_smem & sm, float * part, const float * q, const half * kt, const int S, const int h,
                                 const int p0, const int P) {
    const int tid = threadIdx.x;
    sk_mark(0, 0);
    sm.q[tid / SK_D][tid % SK_D] = q[(size_t) h*SK_G*SK_D + tid];
    __syncthreads();
    sk_mark(0, 1);
    if (tid < SK_D) {
        sm.abs[tid] = fabsf(sm.q[0][tid]) + fabsf(sm.q[1][tid]) + fabsf(sm.q[2][tid]) + fabsf(sm.q[3][tid]);
    }
    __syncthreads();
    if (tid < SK_D) {
        const float a = sm.abs[tid];
        int rk = 0;
        for (int e = 0; e < SK_D; e += 4) {
            const float4 w = *(const float4 *) (sm.abs + e);
            rk += (w.x > a || (w.x == a && e + 0 < tid)) + (w.y > a || (w.y == a && e + 1 < tid)) +
                  (w.z > a || (w.z == a && e + 2 < tid)) + (w.w > a || (w.w == a && e + 3 < tid));
        }
        if (rk < SK_R) {
            sm.i1[rk] = tid;
#pragma unroll
            for (int g = 0; g < SK_G; ++g) {
                sm.cf[rk][g] = sm.q[g][tid]*0.0884f;
            }
        }
    }
    __syncthreads();
    sk_mark(0, 2);
    const int pg = P / 8;
    const int rg = max(1, min(8, SK_T / max(pg, 1)));
    const int j  = tid % max(pg, 1);
    const int ri = tid / max(pg, 1);
    if (ri < rg && j < pg) {
        float acc[SK_G][8] = {};
        const half * base = kt + (size_t) h*SK_D*S + p0 + 8*j;
        for (int c0 = ri; c0 < SK_R; c0 += 8*rg) {
            uint4 raw[8];
#pragma unroll
            for (int u = 0; u < 8; ++u) {
                const int c = c0 + u*rg;
                raw[u] = c < SK_R ? __ldcs((const uint4 *) (base + (size_t) sm.i1[c]*S)) : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (int u = 0; u < 8; ++u) {
                const int c = c0 + u*rg;
                if (c < SK_R) {
                    const half2 * hv = (const half2 *) &raw[u];
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const float2 f = __half22float2(hv[e]);
#pragma unroll
                        for (int g = 0; g < SK_G; ++g) {
                            acc[g][2*e]     += sm.cf[c][g]*f.x;
                            acc[g][2*e + 1] += sm.cf[c][g]*f.y;
                        }
                    }
                }
            }
        }
#pragma unroll
        for (int g = 0; g < SK_G; ++g) {
#pragma unroll
            for (int u = 0; u < 8; ++u) {
                part[((size_t) ri*SK_G + g)*P + 8*j + u] = acc[g][u];
            }
        }
    }
    __syncthreads();
    sk_mark(0, 3);
    float m = -INFINITY;
    for (int e = tid; e < SK_G*P; e += SK_T) {
        float v = 0.0f;
        for (int i = 0; i < rg; ++i) {
            v += part[(size_t) i*SK_G*P + e];
        }
        part[e] = v;
        m = fmaxf(m, v);
    }
    __syncthreads();
    sk_mark(0, 4);
    return m;
}

// the block's maximum of v over its threads into sm.red[0] (one statistic stands for the block statistics)
static __device__ void sk_block_max(sk_smem & sm, float m) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFF, m, off));
    }
    if (threadIdx.x % 32 == 0) {
        sm.red[threadIdx.x / 32] = m;
    }
    __syncthreads();
    if (threadIdx.x < 32) {
        m = threadIdx.x < SK_T/32 ? sm.red[threadIdx.x] : -INFINITY;
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
            m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFF, m, off));
        }
        if (threadIdx.x == 0) {
            sm.red[0] = m;
        }
    }
    __syncthreads();
}

// exact attention over one K/V row a warp (warps below nw; the others add nothing), the block's partial output into
// sm.out (x: a value from the exchanges, so the rows depend on them)
static __device__ void sk_attend(sk_smem & sm, const half * kc, const half * vc, const int h, const int p0, const int P,
                                 const int x, const int nw) {
    const int tid  = threadIdx.x;
    const int lane = tid % 32;
    const int warp = tid / 32;
    if (warp >= nw) {
#pragma unroll
        for (int g = 0; g < SK_G; ++g) {
            *(float4 *) &sm.w[warp][g][4*lane] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
    } else {
        const int pos = p0 + (int) ((unsigned) (warp*2654435761u + h*97 + x) % (unsigned) P);
        const uint2 kr = __ldcs((const uint2 *) (kc + ((size_t) pos*SK_H + h)*SK_D + 4*lane));
        const uint2 vr = __ldcs((const uint2 *) (vc + ((size_t) pos*SK_H + h)*SK_D + 4*lane));
        const half2 * kh = (const half2 *) &kr;
        const half2 * vh = (const half2 *) &vr;
        const float2 k0 = __half22float2(kh[0]), k1 = __half22float2(kh[1]);
        const float2 v0 = __half22float2(vh[0]), v1 = __half22float2(vh[1]);
#pragma unroll
        for (int g = 0; g < SK_G; ++g) {
            float d = sm.q[g][4*lane]*k0.x + sm.q[g][4*lane + 1]*k0.y + sm.q[g][4*lane + 2]*k1.x + sm.q[g][4*lane + 3]*k1.y;
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) {
                d += __shfl_xor_sync(0xFFFFFFFF, d, off);
            }
            const float p = __expf(d*0.0884f - sm.red[0]*1e-3f);
            sm.w[warp][g][4*lane]     = p*v0.x;
            sm.w[warp][g][4*lane + 1] = p*v0.y;
            sm.w[warp][g][4*lane + 2] = p*v1.x;
            sm.w[warp][g][4*lane + 3] = p*v1.y;
        }
    }
    __syncthreads();
    {
        float v = 0.0f;
        for (int w = 0; w < SK_T/32; ++w) {
            v += sm.w[w][tid / SK_D][tid % SK_D];
        }
        sm.out[tid / SK_D][tid % SK_D] = v;
    }
}

// nsync exchanges, exact attention over 16 rows of K and V a block, the merge in block 0 (out: G*D floats of head h)
static __device__ void sk_exchange_attend(sk_smem & sm, cg::cluster_group & cl, const half * kc, const half * vc,
                                          float * out, const int h, const int p0, const int P, const int nsync,
                                          const int kid) {
    sk_mark(kid, 5);
    const int tid  = threadIdx.x;
    const int b    = cl.block_rank();
    if (tid < 32) {
        sm.x[tid] = tid*b;
    }
    int x = 0;
    for (int i = 0; i < nsync; ++i) {
        cl.sync();
        if (tid < SK_NB) {
            x += *cl.map_shared_rank(&sm.x[(x + i) & 31], tid);
        }
        __syncthreads();
    }
    sk_mark(kid, 6);
    sk_attend(sm, kc, vc, h, p0, P, x, SK_T/32);
    sk_mark(kid, 7);
    cl.sync();
    sk_mark(kid, 8);
    if (b == 0) {
        float v = 0.0f;
        for (int o = 0; o < SK_NB; ++o) {
            v += cl.map_shared_rank(&sm.out[0][0], o)[tid];
        }
        out[(size_t) h*SK_G*SK_D + tid] = v;
    }
    cl.sync();
    sk_mark(kid, 9);
}

// touch: first one 4-byte load every 64 KB of what the block reads later (its positions of all D rows of the head's
// k_t, as i1 is not known yet, and of K and V), used only at the end: address translations (TLB) warmed while q
// and i1 are computed
static __global__ void __launch_bounds__(SK_T, 1) k_skeleton(const float * q, const half * kt, const half * kc,
        const half * vc, float * out, const int S, const int nsync, const int touch) {
    extern __shared__ float sk_part[]; // [rg][G][P]
    __shared__ sk_smem sm;
    cg::cluster_group cl = cg::this_cluster();
    const int h = blockIdx.x / SK_NB;
    const int P = S / SK_NB;
    const int p0 = cl.block_rank()*P;
    uint32_t tw = 0;
    if (touch) {
        const int rstep = max(1, 32768/S);      // k_t rows a 64 KB window (S halves a row)
        const int nkt   = SK_D/rstep;
        const int nkv   = (P + 31)/32;          // K (V) rows of 2 KB: 32 a window
        for (int i = threadIdx.x; i < nkt + 2*nkv; i += SK_T) {
            const half * a = i < nkt ? kt + ((size_t) h*SK_D + (size_t) i*rstep)*S + p0 :
                             i < nkt + nkv ? kc + ((size_t) (p0 + 32*(i - nkt))*SK_H + h)*SK_D :
                                             vc + ((size_t) (p0 + 32*(i - nkt - nkv))*SK_H + h)*SK_D;
            tw ^= __ldcg((const unsigned *) a);
        }
    }
    sk_block_max(sm, sk_scores(sm, sk_part, q, kt, S, h, p0, P));
    sk_exchange_attend(sm, cl, kc, vc, out, h, p0, P, nsync, 0);
    if (tw == 0x9e3779b9u) {
        out[0] += 1.0f;
    }
}

// a barrier of the nb blocks of a head through global memory: one release-add to a counter that only grows (the
// ticket t says which barrier: the count reaches (t/nb + 1) nb when every block has arrived; nb a power of 2, so
// the targets wrap with the counter), then acquire-loads until it does. No reset between barriers or launches.
static __device__ void sk_gbar(unsigned * cnt, const unsigned nb) {
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned t;
        asm volatile("atom.add.release.gpu.global.u32 %0, [%1], 1;" : "=r"(t) : "l"(cnt) : "memory");
        const unsigned target = (t/nb + 1)*nb;
        unsigned seen;
        do {
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(cnt) : "memory");
        } while ((int) (seen - target) < 0);
    }
    __syncthreads();
}

// the fused skeleton without clusters: grid (nb, H), one block an SM, all resident at once (nb 16: 128 of the SMs
// stream k_t, where clusters of 16 do not all fit); exchanges and the merge through global memory and sk_gbar.
// gx: [H][nb][8] words; gp: [H][nb][G*D] partial outputs; bar: a counter every 64 ints (one a head)
static __global__ void __launch_bounds__(SK_T, 1) k_gskel(const float * q, const half * kt, const half * kc,
        const half * vc, float * out, float * gx, float * gp, int * bar, const int S, const int nsync) {
    extern __shared__ float sk_part[];
    __shared__ sk_smem sm;
    const int h   = blockIdx.y;
    const int b   = blockIdx.x;
    const int nb  = gridDim.x;
    const int P   = S / nb;
    const int p0  = b*P;
    const int tid = threadIdx.x;
    unsigned * cnt = (unsigned *) bar + 64*h;
    sk_block_max(sm, sk_scores(sm, sk_part, q, kt, S, h, p0, P));
    sk_mark(0, 5);
    int x = 0;
    for (int i = 0; i < nsync; ++i) {
        if (tid == 0) {
            __stcg(gx + ((size_t) h*nb + b)*8 + (i & 7), sm.red[0] + (float) x);
        }
        sk_gbar(cnt, nb);
        if (tid < 32) {
            float v = tid < nb ? __ldcg(gx + ((size_t) h*nb + tid)*8 + (i & 7)) : 0.0f;
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) {
                v += __shfl_xor_sync(0xFFFFFFFF, v, off);
            }
            if (tid == 0) {
                sm.x[0] = (int) v & 0xFF;
            }
        }
        __syncthreads();
        x += sm.x[0];
    }
    sk_mark(0, 6);
    sk_attend(sm, kc, vc, h, p0, P, x, 128/nb); // 128 rows over the head's blocks
    __stcg(gp + ((size_t) h*nb + b)*SK_G*SK_D + tid, sm.out[tid / SK_D][tid % SK_D]);
    sk_mark(0, 7);
    sk_gbar(cnt, nb);
    sk_mark(0, 8);
    if (b == 0) {
        float v = 0.0f;
        for (int o = 0; o < nb; ++o) {
            v += __ldcg(gp + ((size_t) h*nb + o)*SK_G*SK_D + tid);
        }
        out[(size_t) h*SK_G*SK_D + tid] = v;
    }
    sk_mark(0, 9);
}

// split, first kernel: grid (SK_NC, H); scores to sc [H][G][S], the block's maximum to st [H][SK_NC]
static __global__ void __launch_bounds__(SK_T, 1) k_split_scores(const float * q, const half * kt, float * sc, float * st,
                                                                const int S) {
    extern __shared__ float sk_part[];
    __shared__ sk_smem sm;
    const int h  = blockIdx.y;
    const int P  = S / SK_NC;
    const int p0 = blockIdx.x*P;
    asm volatile("griddepcontrol.launch_dependents;");
    const float m = sk_scores(sm, sk_part, q, kt, S, h, p0, P);
    for (int e = threadIdx.x; e < SK_G*P; e += SK_T) {
        sc[((size_t) h*SK_G + e / P)*S + p0 + e % P] = sk_part[e];
    }
    sk_block_max(sm, m);
    if (threadIdx.x == 0) {
        st[h*SK_NC + blockIdx.x] = sm.red[0];
    }
}

// split, second kernel: the clusters; keys of the block's positions from the scores and the chunks' maxima
static __global__ void __launch_bounds__(SK_T, 1) k_split_select(const float * q, const float * sc, const float * st,
        const half * kc, const half * vc, float * out, const int S, const int nsync) {
    __shared__ sk_smem sm;
    cg::cluster_group cl = cg::this_cluster();
    const int h  = blockIdx.x / SK_NB;
    const int P  = S / SK_NB;
    const int p0 = cl.block_rank()*P;
    asm volatile("griddepcontrol.wait;" ::: "memory");
    sk_mark(1, 0);
    sm.q[threadIdx.x / SK_D][threadIdx.x % SK_D] = q[(size_t) h*SK_G*SK_D + threadIdx.x];
    float M = -INFINITY;
    for (int c = 0; c < SK_NC; ++c) {
        M = fmaxf(M, st[h*SK_NC + c]);
    }
    float m = -INFINITY;
    for (int e = threadIdx.x; e < P; e += SK_T) {
        float key = 0.0f;
#pragma unroll
        for (int g = 0; g < SK_G; ++g) {
            key += __expf(sc[((size_t) h*SK_G + g)*S + p0 + e] - M);
        }
        m = fmaxf(m, key);
    }
    sk_block_max(sm, m);
    sk_exchange_attend(sm, cl, kc, vc, out, h, p0, P, nsync, 1);
}

template <typename K>
static void report(const char * name, K kern, dim3 grid, dim3 block, int cluster, probe_out * d_o, cudaStream_t st,
                   size_t smem = 0) {
    cudaLaunchAttribute at[2];
    cudaLaunchConfig_t  cfg = make_cfg(grid, block, smem, st, at, cluster, false);
    double best = 1e30, ghz = 0;
    for (int rep = 0; rep < 5; ++rep) {
        const cudaError_t e = kern(cfg, rep);
        if (e != cudaSuccess) {
            printf("%-58s  not launched: %s\n", name, cudaGetErrorString(e));
            cudaGetLastError();
            return;
        }
        CK(cudaStreamSynchronize(st));
        probe_out o;
        CK(cudaMemcpy(&o, d_o, sizeof(o), cudaMemcpyDeviceToHost));
        if ((double) o.cyc/ITERS < best) {
            best = (double) o.cyc/ITERS;
            ghz  = o.ns ? (double) o.cyc/o.ns : 0;
        }
    }
    printf("%-58s  %8.1f cycles  %7.3f us  (SM %.2f GHz)\n", name, best, ghz > 0 ? best/ghz/1000.0 : 0.0, ghz);
}

int main() {
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
    cudaStream_t st;
    CK(cudaStreamCreate(&st));
    probe_out * d_o;
    CK(cudaMalloc(&d_o, sizeof(probe_out)));
    int * d_cnt;
    CK(cudaMalloc(&d_cnt, 32*16*sizeof(int)));

    // rings for the dependent global loads: 64 KB (L2) and 1 GiB (DRAM), a step of 4 KB + 128 B between loads
    const size_t n_big = (size_t) 1 << 28;
    int * d_ring;
    CK(cudaMalloc(&d_ring, n_big*sizeof(int)));
    auto make_ring = [&](size_t n) {
        std::vector<int> h(n);
        const size_t step = 1056; // ints
        for (size_t i = 0; i < n; ++i) {
            h[i] = (int) ((i + step) % n);
        }
        CK(cudaMemcpy(d_ring, h.data(), n*sizeof(int), cudaMemcpyHostToDevice));
    };

    printf("\n-- launch floors (us a launch, graph of 200 back-to-back launches, best of 7)\n");
    const int SM = prop.multiProcessorCount;
    struct lf { const char * name; dim3 grid; int block, cluster; bool pdl; };
    const lf lfs[] = {
        {"empty, 1 block of 32",                      dim3(1), 32, 1, false},
        {"empty, 1 block of 32, PDL",                 dim3(1), 32, 1, true},
        {"empty, 128 blocks of 256",                  dim3(128), 256, 1, false},
        {"empty, 128 blocks of 256, PDL",             dim3(128), 256, 1, true},
        {"empty, 8 clusters of 8 x 512",              dim3(64), 512, 8, false},
        {"empty, 8 clusters of 8 x 512, PDL",         dim3(64), 512, 8, true},
        {"empty, 8 clusters of 16 x 256, PDL",        dim3(128), 256, 16, true},
    };
    for (const lf & l : lfs) {
        if (l.cluster == 16) {
            cudaFuncSetAttribute(k_empty_pdl, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
        }
        void (*k)(int *) = l.pdl ? k_empty_pdl : k_empty;
        const cudaError_t e = launch(k, l.grid, dim3(l.block), l.cluster, l.pdl, st, nullptr); // a trial, outside a graph
        if (e != cudaSuccess || cudaStreamSynchronize(st) != cudaSuccess) {
            printf("%-58s  not launched: %s\n", l.name, cudaGetErrorString(e));
            cudaGetLastError();
            continue;
        }
        const double us = time_graph([&](cudaStream_t s) { CK(launch(k, l.grid, dim3(l.block), l.cluster, l.pdl, s, nullptr)); }, 200, st);
        printf("%-58s  %7.2f us\n", l.name, us);
    }

    printf("\n-- steps inside a kernel (a dependent chain; cycles an iteration)\n");
    int ring_rot = 0; // ints between the repetitions' starts: 0 but in the DRAM ring (128 MB there)
    report("__syncthreads, 512 threads", [&](cudaLaunchConfig_t c, int rep) { return cudaLaunchKernelEx(&c, k_block_step<0>, d_o, (const int *) d_ring, rep*ring_rot); }, dim3(1), dim3(512), 1, d_o, st);
    report("__syncthreads, 1024 threads", [&](cudaLaunchConfig_t c, int rep) { return cudaLaunchKernelEx(&c, k_block_step<0>, d_o, (const int *) d_ring, rep*ring_rot); }, dim3(1), dim3(1024), 1, d_o, st);
    report("warp sum, 5 shuffles", [&](cudaLaunchConfig_t c, int rep) { return cudaLaunchKernelEx(&c, k_block_step<1>, d_o, (const int *) d_ring, rep*ring_rot); }, dim3(1), dim3(32), 1, d_o, st);
    report("shared load", [&](cudaLaunchConfig_t c, int rep) { return cudaLaunchKernelEx(&c, k_block_step<2>, d_o, (const int *) d_ring, rep*ring_rot); }, dim3(1), dim3(32), 1, d_o, st);
    report("block sum, 512 threads (2 warp sums, 2 barriers)", [&](cudaLaunchConfig_t c, int rep) { return cudaLaunchKernelEx(&c, k_block_step<3>, d_o, (const int *) d_ring, rep*ring_rot); }, dim3(1), dim3(512), 1, d_o, st);
    make_ring(16384);
    report("global load, 64 KB ring (L2)", [&](cudaLaunchConfig_t c, int rep) { return cudaLaunchKernelEx(&c, k_block_step<4>, d_o, (const int *) d_ring, rep*ring_rot); }, dim3(1), dim3(32), 1, d_o, st);
    report("global atomicAdd (returning, L2)", [&](cudaLaunchConfig_t c, int rep) { return cudaLaunchKernelEx(&c, k_block_step<5>, d_o, (const int *) d_ring, rep*ring_rot); }, dim3(1), dim3(32), 1, d_o, st);
    make_ring(n_big);
    ring_rot = 1 << 25;
    report("global load, 1 GiB ring (DRAM)", [&](cudaLaunchConfig_t c, int rep) { return cudaLaunchKernelEx(&c, k_block_step<4>, d_o, (const int *) d_ring, rep*ring_rot); }, dim3(1), dim3(32), 1, d_o, st);

    // 120 KB of (unused) dynamic shared memory a block: one block an SM, as the op's
    const size_t one_an_sm = 120*1024;
    CK(cudaFuncSetAttribute(k_cluster_step<0>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    CK(cudaFuncSetAttribute(k_cluster_step<1>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    for (const void * f : {(const void *) k_cluster_step<0>, (const void *) k_cluster_step<1>, (const void *) k_cluster_step<2>}) {
        CK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, (int) one_an_sm));
    }
    for (int nb : {2, 8, 16}) {
        for (int th : {256, 512}) {
            char name[96];
            snprintf(name, sizeof(name), "cluster barrier, %d blocks x %d", nb, th);
            report(name, [&](cudaLaunchConfig_t c, int rep) { return cudaLaunchKernelEx(&c, k_cluster_step<0>, d_o); }, dim3(nb*8), dim3(th), nb, d_o, st, one_an_sm);
            snprintf(name, sizeof(name), "cluster barrier + a word from each block, %d x %d", nb, th);
            report(name, [&](cudaLaunchConfig_t c, int rep) { return cudaLaunchKernelEx(&c, k_cluster_step<1>, d_o); }, dim3(nb*8), dim3(th), nb, d_o, st, one_an_sm);
        }
    }
    report("remote shared load (DSMEM), cluster of 8", [&](cudaLaunchConfig_t c, int rep) { return cudaLaunchKernelEx(&c, k_cluster_step<2>, d_o); }, dim3(64), dim3(32), 8, d_o, st, one_an_sm);
    for (int nb : {8, 16}) {
        char name[96];
        snprintf(name, sizeof(name), "global-counter barrier, 8 heads x %d blocks of 256", nb);
        report(name, [&](cudaLaunchConfig_t c, int rep) { // the counts start at 0 on every repetition
            CK(cudaMemsetAsync(d_cnt, 0, 32*16*sizeof(int), c.stream));
            return cudaLaunchKernelEx(&c, k_head_barrier, d_o, d_cnt);
        }, dim3(nb, 8), dim3(256), 1, d_o, st);
    }


    printf("\n-- the op's structure, little work a step (us a call, graph of 50, best of 7; k_t, K and V rotated over\n"
           "   ~1 GiB). fused: 8 clusters of 8 x 512; split: 16 x 8 blocks for the scores, then the clusters (PDL);\n"
           "   touch: fused, one load every 64 KB of the block's k_t / K / V first (TLB warmed during q and i1);\n"
           "   glob8 / glob16: no clusters, 8 / 16 blocks a head, exchanges and merge through global memory.\n"
           "   The op's own times: test_sparq_cuda bench --variant fused (bench/results/cuda_h200_2026-12-02b.md).\n");
    {
        CK(cudaMemset(d_ring, 0, n_big*sizeof(int)));
        float * d_q;
        float * d_out;
        float * d_sc;
        float * d_st;
        CK(cudaMalloc(&d_q, SK_H*SK_G*SK_D*sizeof(float)));
        CK(cudaMalloc(&d_out, SK_H*SK_G*SK_D*sizeof(float)));
        CK(cudaMalloc(&d_sc, (size_t) SK_H*SK_G*32768*sizeof(float)));
        CK(cudaMalloc(&d_st, SK_H*SK_NC*sizeof(float)));
        std::vector<float> hq(SK_H*SK_G*SK_D);
        for (size_t i = 0; i < hq.size(); ++i) {
            hq[i] = (float) ((i*2654435761u) % 1000) / 500.0f - 1.0f;
        }
        CK(cudaMemcpy(d_q, hq.data(), hq.size()*sizeof(float), cudaMemcpyHostToDevice));
        CK(cudaFuncSetAttribute(k_skeleton, cudaFuncAttributeMaxDynamicSharedMemorySize, 96*1024));
        CK(cudaFuncSetAttribute(k_split_scores, cudaFuncAttributeMaxDynamicSharedMemorySize, 96*1024));
        // (96 KB with the static arrays: one block an SM)
        CK(cudaFuncSetAttribute(k_gskel, cudaFuncAttributeMaxDynamicSharedMemorySize, 96*1024));
        float * d_gx;
        float * d_gp;
        int   * d_bar;
        CK(cudaMalloc(&d_gx, SK_H*16*8*sizeof(float)));
        CK(cudaMalloc(&d_gp, SK_H*16*SK_G*SK_D*sizeof(float)));
        CK(cudaMalloc(&d_bar, SK_H*64*sizeof(int)));
        CK(cudaMemset(d_bar, 0, SK_H*64*sizeof(int)));
        auto part_bytes = [](int P) {
            const int pg = P/8;
            const int rg = std::max(1, std::min(8, SK_T/std::max(pg, 1)));
            return (size_t) rg*SK_G*P*sizeof(float);
        };
        for (int S : {256, 4096, 16384, 32768}) {
            const size_t kt_n   = (size_t) SK_H*SK_D*S;          // halves
            const size_t kv_n   = (size_t) S*SK_H*SK_D;
            const size_t copy_n = kt_n + 2*kv_n;
            const int    ncopy  = (int) std::max<size_t>(1, std::min<size_t>(50, n_big*2/copy_n));
            // the structures: fused; split; fused with touch; no clusters, 8 / 16 blocks a head (k_gskel)
            static const char * const names[] = { "fused", "split", "touch", "glob8", "glob16" };
            for (int split : {0, 1, 2, 3, 4}) {
                for (int nsync : {1, 3, 5}) {
                    if ((split == 2 && nsync != 3) || (split >= 3 && nsync == 5)) {
                        continue;
                    }
                    int rot = 0;
                    const double us = time_graph([&](cudaStream_t s) {
                        const half * c = (const half *) d_ring + (size_t) (rot++ % ncopy)*copy_n;
                        cudaLaunchAttribute at[2];
                        if (split >= 3) {
                            const int nb = split == 3 ? 8 : 16;
                            k_gskel<<<dim3(nb, SK_H), SK_T, 96*1024, s>>>(d_q, c, c + kt_n, c + kt_n + kv_n, d_out,
                                                                         d_gx, d_gp, d_bar, S, nsync);
                        } else if (split != 1) {
                            cudaLaunchConfig_t cfg = make_cfg(dim3(SK_H*SK_NB), dim3(SK_T), part_bytes(S/SK_NB), s, at,
                                                              SK_NB, false);
                            CK(cudaLaunchKernelEx(&cfg, k_skeleton, (const float *) d_q, c, c + kt_n, c + kt_n + kv_n,
                                                  d_out, S, nsync, split == 2 ? 1 : 0));
                        } else {
                            k_split_scores<<<dim3(SK_NC, SK_H), SK_T, part_bytes(S/SK_NC), s>>>(d_q, c, d_sc, d_st, S);
                            cudaLaunchConfig_t cfg = make_cfg(dim3(SK_H*SK_NB), dim3(SK_T), 0, s, at, SK_NB, true);
                            CK(cudaLaunchKernelEx(&cfg, k_split_select, (const float *) d_q, (const float *) d_sc,
                                                  (const float *) d_st, c + kt_n, c + kt_n + kv_n, d_out, S, nsync));
                        }
                    }, 50, st);
                    long long clk[2][10];
                    CK(cudaMemcpyFromSymbol(clk, sk_clk, sizeof(clk)));
                    printf("%-6s S %6d, %d exchanges + the merge's barrier     %7.2f us", names[split], S, nsync, us);
                    // cycles: q, i1, k_t rows, their sum, the block maximum | exchanges, attention, merge barrier, output
                    printf("   cycles q %lld i1 %lld rows %lld sum %lld", clk[0][1] - clk[0][0], clk[0][2] - clk[0][1],
                           clk[0][3] - clk[0][2], clk[0][4] - clk[0][3]);
                    const int k2 = split == 1 ? 1 : 0;
                    if (split == 1) {
                        printf(" | (2nd kernel) keys %lld", clk[1][5] - clk[1][0]);
                    } else {
                        printf(" max %lld", clk[0][5] - clk[0][4]);
                    }
                    printf(" xchg %lld attend %lld merge %lld out %lld\n", clk[k2][6] - clk[k2][5], clk[k2][7] - clk[k2][6],
                           clk[k2][8] - clk[k2][7], clk[k2][9] - clk[k2][8]);
                }
            }
        }
        CK(cudaFree(d_q));
        CK(cudaFree(d_out));
        CK(cudaFree(d_sc));
        CK(cudaFree(d_st));
        CK(cudaFree(d_gx));
        CK(cudaFree(d_gp));
        CK(cudaFree(d_bar));
    }

    printf("\n-- streaming reads (us a launch, graph of 50, best of 7; data rotated over 1 GiB so it comes from DRAM)\n");
    const uint4 * base = (const uint4 *) d_ring;
    int * sink = d_cnt;
    for (double mb : {8.4, 16.8}) {
        const size_t n = (size_t) (mb*1e6/16);
        for (int bl : {64, 128, SM, 2*SM, 4*SM}) {
            int rot = 0;
            const double us = time_graph([&](cudaStream_t s) {
                k_read<<<bl, 512, 0, s>>>(base + (size_t) (rot++ % 60)*n, n, sink);
            }, 50, st);
            printf("read %.1f MB, %4d blocks of 512          %7.2f us  %6.0f GB/s\n", mb, bl, us, mb*1e3/us);
        }
    }

    // the k_t pass of a cluster kernel: one block an SM, each streaming its own share; how many bytes a block must
    // keep in flight (loads in registers, or bulk copies into shared memory) for 64 or 128 SMs to reach DRAM speed
    printf("\n-- a share a block, one block (512 threads) an SM: loads in flight (us a launch, as above)\n");
    for (const void * f : {(const void *) k_read_deep<1>, (const void *) k_read_deep<4>, (const void *) k_read_deep<8>,
                           (const void *) k_read_deep<16>, (const void *) k_read_bulk}) {
        CK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, 200*1024));
    }
    for (double mb : {8.4, 16.8}) {
        for (int bl : {64, 128}) {
            const size_t per = (size_t) (mb*1e6/bl/8192)*8192; // bytes a block (whole pieces)
            const double gb  = (double) per*bl/1e9;
            auto row = [&](const char * what, const std::function<void(cudaStream_t, const char *)> & k) {
                int rot = 0;
                const double us = time_graph([&](cudaStream_t s) { k(s, (const char *) base + (size_t) (rot++ % 60)*per*bl); }, 50, st);
                printf("%5.1f MB, %3d blocks, %-36s %7.2f us  %6.0f GB/s\n", gb*1e3, bl, what, us, gb*1e6/us);
            };
            const size_t pw = per/16;
            row("loads, 1 x 16 B a thread", [&](cudaStream_t s, const char * p) { k_read_deep<1><<<bl, 512, 0, s>>>((const uint4 *) p, pw, sink); });
            row("loads, 4 x 16 B a thread (32 KB)", [&](cudaStream_t s, const char * p) { k_read_deep<4><<<bl, 512, 0, s>>>((const uint4 *) p, pw, sink); });
            row("loads, 8 x 16 B a thread (64 KB)", [&](cudaStream_t s, const char * p) { k_read_deep<8><<<bl, 512, 0, s>>>((const uint4 *) p, pw, sink); });
            row("loads, 16 x 16 B a thread (128 KB)", [&](cudaStream_t s, const char * p) { k_read_deep<16><<<bl, 512, 0, s>>>((const uint4 *) p, pw, sink); });
            for (int piece : {4096, 8192}) {
                for (int kb : {32, 64, 128, 192}) {
                    const int ns = kb*1024/piece;
                    if (ns > 32) {
                        continue;
                    }
                    char what[64];
                    snprintf(what, sizeof(what), "bulk, %d x %d KB stages (%d KB)", ns, piece/1024, kb);
                    row(what, [&](cudaStream_t s, const char * p) { k_read_bulk<<<bl, 512, (size_t) ns*piece, s>>>(p, per, piece, ns, sink); });
                }
            }
        }
    }
    CK(cudaGetLastError());
    return 0;
}
