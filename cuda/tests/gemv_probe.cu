// llama-sparse: what caps the direct Q4_K GEMV's DRAM rate (issue 6), on the GPU at hand (sm_90).
//
//   nvcc -O3 -arch=sm_90 -std=c++17 cuda/tests/gemv_probe.cu -o gemv_probe && ./gemv_probe [m n]
//   ./gemv_probe floor     the sparse-read floor on the benchmark's shapes (below)
//
// Measurement only, no ggml. Reads a zigzag Q4_K weight (m/256 block-rows of n 144-byte blocks, default 28672 x 8192,
// 132 MB, rotated over 3 copies so that L2 holds none of it) on the direct kernel's grid: n1 blocks of 4 warps a
// block-row (one wave at 4 blocks an SM, the direct kernel's register limit, unless a row says otherwise), each warp a
// contiguous share of the row's columns, rounds of S steps of 16 columns. A block's shared memory sets the carve-out
// left to L1. Each step does `delay` x 8 FMAs of synthetic work after its loads arrive (the real step is ~300
// instructions). Patterns:
//   words  the direct kernel's version 2/3 loads: a lane's 4 columns, each the 16-byte header + 4 words 32p + 4g
//   v1     header + the 16 quant bytes 16g (version 1)
//   pipe   words, with the next round's loads issued before this round's work (twice the registers)
//   ring   cp.async of each step's 16 contiguous blocks into a ring of `stages` steps a warp in shared memory,
//          the step read back from there (no registers held by loads in flight)
//   flat   each lane streams 16-byte loads over the warp's bytes, U in flight (no block structure: the ceiling)
// Prints us a launch and GB/s against a read-only kernel over the same bytes on every SM.
// Results: bench/results/cuda_h200_2026-12-02c.md.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "probe-check.h"

#define CUDA_CHECK(x) CK(x)
#include "graph-time.h"

#define BQ    144 // bytes of a Q4_K block
#define WARPS 4

struct prm {
    const char * w;     // this copy's weight
    int          n;     // columns
    int          nw;    // warps a block-row
    int          delay; // synthetic work a step: delay x 8 FMAs
    unsigned   * sink;
};

static __device__ __forceinline__ void col_range(const prm & p, int & c0, int & c1) {
    const int wid = blockIdx.x*WARPS + threadIdx.x/32;
    c0 = (int) (((int64_t) p.n*wid)/p.nw);
    c1 = (int) (((int64_t) p.n*(wid + 1))/p.nw);
}

// the lane's column i of a step (as zz_direct_cols)
static __device__ __forceinline__ int step_col(const int p0, const int tq, const int i) {
    return p0 + 2*tq + (i & 1) + 8*(i >> 1);
}

template <int PAT>
static __device__ __forceinline__ void load_blk(const char * w_row, const int col, const int c1, const int g, uint4 & h,
                                                uint4 & q) {
    if (col < c1) {
        const char * blk = w_row + (int64_t) col*BQ;
        h = __ldg((const uint4 *) blk);
        if constexpr (PAT == 1) {
            q = __ldg((const uint4 *) (blk + 16 + 16*g));
        } else {
            const uint32_t * qw = (const uint32_t *) (blk + 16) + g;
            q = make_uint4(__ldg(qw), __ldg(qw + 8), __ldg(qw + 16), __ldg(qw + 24));
        }
    } else {
        h = make_uint4(0, 0, 0, 0);
        q = make_uint4(0, 0, 0, 0);
    }
}

static __device__ __forceinline__ void work_init(float (&f)[8]) {
#pragma unroll
    for (int c = 0; c < 8; ++c) {
        f[c] = 0.5f;
    }
}

// the step's data enter 8 chains, then delay x 8 independent FMAs
static __device__ __forceinline__ void work(const uint4 (&h)[4], const uint4 (&q)[4], float (&f)[8], const int delay) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const uint32_t u = h[i].x ^ h[i].y ^ h[i].z ^ h[i].w ^ q[i].x ^ q[i].y ^ q[i].z ^ q[i].w;
        f[2*i]     = fmaf(f[2*i], 1.0001f, __uint_as_float(u & 0x3f7fffffu));
        f[2*i + 1] = fmaf(f[2*i + 1], 0.9999f, __uint_as_float((u >> 1) & 0x3f7fffffu));
    }
#pragma unroll 4
    for (int d = 0; d < delay; ++d) {
#pragma unroll
        for (int c = 0; c < 8; ++c) {
            f[c] = fmaf(f[c], 0.999f, 0.001f);
        }
    }
}

static __device__ __forceinline__ void sink_out(const prm & p, const float (&f)[8]) {
    float s = 0.0f;
#pragma unroll
    for (int c = 0; c < 8; ++c) {
        s += f[c];
    }
    if (s == 1234.5f) {
        *p.sink = 1;
    }
}

template <int PAT, int S>
static __device__ __forceinline__ void load_round(const char * w_row, const int p0, const int c1, const int g,
                                                  const int tq, uint4 (&h)[S][4], uint4 (&q)[S][4]) {
#pragma unroll
    for (int st = 0; st < S; ++st) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            load_blk<PAT>(w_row, step_col(p0 + 16*st, tq, i), c1, g, h[st][i], q[st][i]);
        }
    }
}

// PAT 0 words, 1 v1; PIPE: next round's loads before this round's work
template <int PAT, int S, bool PIPE>
static __global__ void __launch_bounds__(WARPS*32) k_direct(const prm p) {
    const int lane = threadIdx.x % 32, g = lane/4, tq = lane%4;
    int c0, c1;
    col_range(p, c0, c1);
    const char * w_row = p.w + (int64_t) blockIdx.y*p.n*BQ;
    float f[8];
    work_init(f);
    if constexpr (!PIPE) {
        for (int p0 = c0; p0 < c1; p0 += 16*S) {
            uint4 h[S][4], q[S][4];
            load_round<PAT, S>(w_row, p0, c1, g, tq, h, q);
#pragma unroll
            for (int st = 0; st < S; ++st) {
                work(h[st], q[st], f, p.delay);
            }
        }
    } else {
        uint4 ha[S][4], qa[S][4], hb[S][4], qb[S][4];
        load_round<PAT, S>(w_row, c0, c1, g, tq, ha, qa);
        for (int p0 = c0; p0 < c1; p0 += 32*S) {
            load_round<PAT, S>(w_row, p0 + 16*S, c1, g, tq, hb, qb);
#pragma unroll
            for (int st = 0; st < S; ++st) {
                work(ha[st], qa[st], f, p.delay);
            }
            if (p0 + 16*S >= c1) {
                break;
            }
            load_round<PAT, S>(w_row, p0 + 32*S, c1, g, tq, ha, qa);
#pragma unroll
            for (int st = 0; st < S; ++st) {
                work(hb[st], qb[st], f, p.delay);
            }
        }
    }
    sink_out(p, f);
}

static __device__ __forceinline__ void cp16(void * dst, const void * src) {
    const unsigned d = (unsigned) __cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(d), "l"(src) : "memory");
}

// a step: 16 contiguous blocks (2304 bytes, 144 pieces of 16) into the slot; pieces past c1 are left out
static __device__ __forceinline__ void ring_issue(char * slot, const char * w_row, const int p0, const int c1,
                                                  const int lane) {
    const char * src = w_row + (int64_t) p0*BQ;
    const int    np  = (min(16, c1 - p0)*BQ)/16;
#pragma unroll
    for (int k = 0; k < 5; ++k) {
        const int piece = lane + 32*k;
        if (piece < np) {
            cp16(slot + 16*piece, src + 16*piece);
        }
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
}

template <int STG, int MINB = 1>
static __global__ void __launch_bounds__(WARPS*32, MINB) k_ring(const prm p) {
    extern __shared__ __align__(16) char smem[];
    const int lane = threadIdx.x % 32, g = lane/4, tq = lane%4;
    char * ring = smem + (threadIdx.x/32)*STG*16*BQ;
    int c0, c1;
    col_range(p, c0, c1);
    const char * w_row = p.w + (int64_t) blockIdx.y*p.n*BQ;
    float f[8];
    work_init(f);
    const int nsteps = (c1 - c0 + 15)/16;
#pragma unroll
    for (int s = 0; s < STG - 1; ++s) {
        if (s < nsteps) {
            ring_issue(ring + s*16*BQ, w_row, c0 + 16*s, c1, lane);
        } else {
            asm volatile("cp.async.commit_group;" ::: "memory");
        }
    }
    for (int s = 0; s < nsteps; ++s) {
        asm volatile("cp.async.wait_group %0;" :: "n"(STG - 2) : "memory");
        __syncwarp();
        const char * slot = ring + (s % STG)*16*BQ;
        uint4 h[4], q[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int e = 2*tq + (i & 1) + 8*(i >> 1);
            if (c0 + 16*s + e < c1) {
                const char * blk = slot + e*BQ;
                h[i] = *(const uint4 *) blk;
                const uint32_t * qw = (const uint32_t *) (blk + 16) + g;
                q[i] = make_uint4(qw[0], qw[8], qw[16], qw[24]);
            } else {
                h[i] = make_uint4(0, 0, 0, 0);
                q[i] = make_uint4(0, 0, 0, 0);
            }
        }
        __syncwarp();
        const int sn = s + STG - 1;
        if (sn < nsteps) {
            ring_issue(ring + (sn % STG)*16*BQ, w_row, c0 + 16*sn, c1, lane);
        } else {
            asm volatile("cp.async.commit_group;" ::: "memory");
        }
        work(h, q, f, p.delay);
    }
    sink_out(p, f);
}

// the read kernels' use of their loads: fold them into one word, stored only if it hits a constant (never)
template <int U>
static __device__ __forceinline__ uint32_t xor_fold(uint32_t acc, const uint4 (&v)[U]) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
        acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    return acc;
}

static __device__ __forceinline__ void sink_word(const uint32_t acc, unsigned * sink) {
    if (acc == 0x9e3779b9u) {
        *sink = acc;
    }
}

// the warp's bytes as 16-byte pieces, U loads in flight a lane
template <int U>
static __global__ void __launch_bounds__(WARPS*32) k_flat(const prm p) {
    const int lane = threadIdx.x % 32;
    int c0, c1;
    col_range(p, c0, c1);
    const uint4 * src = (const uint4 *) (p.w + ((int64_t) blockIdx.y*p.n + c0)*BQ);
    const int     np  = (c1 - c0)*BQ/16;
    uint32_t acc = 0;
    for (int k0 = 0; k0 < np; k0 += 32*U) {
        uint4 v[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int k = k0 + 32*u + lane;
            v[u] = k < np ? __ldg(src + k) : make_uint4(0, 0, 0, 0);
        }
        acc = xor_fold<U>(acc, v);
    }
    sink_word(acc, p.sink);
}

// every SM, grid-stride, 4 x 16 bytes in flight a thread: the read ceiling
static __global__ void k_read_all(const uint4 * src, const int64_t np, unsigned * sink) {
    uint32_t acc = 0;
    const int64_t stride = (int64_t) gridDim.x*blockDim.x;
    for (int64_t k = (int64_t) blockIdx.x*blockDim.x + threadIdx.x; k < np; k += 4*stride) {
        uint4 v[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            v[u] = k + u*stride < np ? __ldg(src + k + u*stride) : make_uint4(0, 0, 0, 0);
        }
        acc = xor_fold<4>(acc, v);
    }
    sink_word(acc, sink);
}

// the floor of any sparse GEMV on this layout: only the active columns' blocks of each block-row are read, as
// 16-byte pieces, U loads in flight a lane, the row's list split evenly over its warps, no arithmetic
struct sprm {
    const char * w;
    const int  * list;  // ascending active columns, the same for every block-row (they follow from x)
    int          count;
    int          n;
    int          nw;    // warps a block-row
    unsigned   * sink;
};

template <int U>
static __global__ void __launch_bounds__(WARPS*32) k_sparse_read(const sprm p) {
    const int lane = threadIdx.x % 32;
    const int wid  = blockIdx.x*WARPS + threadIdx.x/32;
    const int a0   = (int) (((int64_t) p.count*wid)/p.nw);
    const int a1   = (int) (((int64_t) p.count*(wid + 1))/p.nw);
    const char * w_row = p.w + (int64_t) blockIdx.y*p.n*BQ;
    const int np = (a1 - a0)*(BQ/16);
    uint32_t acc = 0;
    for (int k0 = 0; k0 < np; k0 += 32*U) {
        uint4 v[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int k = k0 + 32*u + lane;
            if (k < np) {
                const int col = __ldg(p.list + a0 + k/(BQ/16));
                v[u] = __ldg((const uint4 *) (w_row + (int64_t) col*BQ + 16*(k % (BQ/16))));
            } else {
                v[u] = make_uint4(0, 0, 0, 0);
            }
        }
        acc = xor_fold<U>(acc, v);
    }
    sink_word(acc, p.sink);
}

#define NCOPY 3
#define REPS  24

// `floor`: k_sparse_read on the benchmark's 11 shapes at its sparsities (random columns, seed fixed); the best of
// U 4 / 8 and 8 / 16 blocks an SM. Prints us and GB/s of the bytes read, against the read-only kernel
static int run_floor() {
    static const int64_t shapes[][2] = {
        { 4096, 4096 }, { 11008, 4096 }, { 4096, 11008 }, { 14336, 4096 }, { 4096, 14336 }, { 5120, 5120 },
        { 13824, 5120 }, { 5120, 13824 }, { 8192, 8192 }, { 28672, 8192 }, { 8192, 28672 },
    };
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    unsigned * sink;
    CK(cudaMalloc(&sink, sizeof(unsigned)));
    cudaStream_t stream;
    CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    // per launch in a CUDA graph of REPS launches, copies rotated, the least of 7 runs (call 6 of
    // cuda_h200_2026-12-02e.md ran a first form: the least of 5)
    auto graph_us = [&](const std::function<void(int, cudaStream_t)> & launch) {
        return time_graph_us([&](cudaStream_t st, int i) { launch(i % NCOPY, st); }, REPS, stream, true);
    };
    printf("%s, %d SMs: sparse-read floor (only the active blocks, no arithmetic), us a launch in a CUDA graph\n",
           prop.name, prop.multiProcessorCount);
    printf("%6s %6s | %6s | %8s %8s %8s %8s %8s %8s | read-all GB/s\n", "m", "n", "", "0 %", "25 %", "40 %", "50 %",
           "65 %", "80 %");
    uint64_t seed = 0x9e3779b97f4a7c15ull;
    for (const auto & sh : shapes) {
        const int64_t m = sh[0], n = sh[1], rows = m/256, bytes = rows*n*BQ;
        std::vector<char *> w(NCOPY);
        for (int c = 0; c < NCOPY; ++c) {
            CK(cudaMalloc(&w[c], bytes));
            CK(cudaMemset(w[c], 0x11*(c + 1), bytes));
        }
        int * list_d;
        CK(cudaMalloc(&list_d, n*sizeof(int)));
        const double all_us = graph_us([&](int c, cudaStream_t st) {
            k_read_all<<<prop.multiProcessorCount*8, 256, 0, st>>>((const uint4 *) w[c], bytes/16, sink);
        });
        double us[6], gbs[6];
        const double sps[6] = { 0.0, 0.25, 0.40, 0.50, 0.65, 0.80 };
        for (int k = 0; k < 6; ++k) {
            std::vector<int> list;
            for (int64_t j = 0; j < n; ++j) {
                seed ^= seed << 13; seed ^= seed >> 7; seed ^= seed << 17;
                if ((double) (seed >> 11)*(1.0/9007199254740992.0) >= sps[k]) {
                    list.push_back((int) j);
                }
            }
            CK(cudaMemcpy(list_d, list.data(), list.size()*sizeof(int), cudaMemcpyHostToDevice));
            us[k] = 1e30;
            for (const int nb : { 8, 16 }) {
                const int  n1 = std::max<int>(1, (prop.multiProcessorCount*nb)/(int) rows);
                const dim3 grid(n1, (unsigned) rows);
                for (const int u : { 4, 8 }) {
                    const double t = graph_us([&](int c, cudaStream_t st) {
                        const sprm p = { w[c], list_d, (int) list.size(), (int) n, n1*WARPS, sink };
                        if (u == 4) {
                            k_sparse_read<4><<<grid, WARPS*32, 0, st>>>(p);
                        } else {
                            k_sparse_read<8><<<grid, WARPS*32, 0, st>>>(p);
                        }
                    });
                    us[k] = std::min(us[k], t);
                }
            }
            gbs[k] = (double) rows*list.size()*BQ/(us[k]*1e3);
        }
        printf("%6lld %6lld | us     | %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f | %.0f\n", (long long) m, (long long) n,
               us[0], us[1], us[2], us[3], us[4], us[5], bytes/(all_us*1e3));
        printf("%6s %6s | GB/s   | %8.0f %8.0f %8.0f %8.0f %8.0f %8.0f |\n", "", "", gbs[0], gbs[1], gbs[2], gbs[3], gbs[4],
               gbs[5]);
        CK(cudaFree(list_d));
        for (char * p : w) {
            CK(cudaFree(p));
        }
    }
    CK(cudaStreamDestroy(stream));
    CK(cudaFree(sink));
    return 0;
}

struct bench {
    std::vector<char *> w;
    int64_t             m, n, bytes;
    unsigned          * sink;
    int                 sms, smem_sm;
};

// best of 5 of the mean over REPS launches, copies rotated
template <typename L>
static double time_us(L launch) {
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    launch(0);
    CK(cudaDeviceSynchronize());
    double best = 1e30;
    for (int k = 0; k < 5; ++k) {
        CK(cudaEventRecord(e0));
        for (int r = 0; r < REPS; ++r) {
            launch(r % NCOPY);
        }
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        best = std::min(best, 1000.0*ms/REPS);
    }
    CK(cudaGetLastError());
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    return best;
}

// n1 blocks a block-row such that the grid is one wave at 4 blocks an SM (the direct kernel's); smem bytes of
// shared memory a block (the carve-out left to L1 follows from it)
template <typename K>
static void run(const bench & b, const char * name, K kernel, const int smem, const int S, const int delay,
                const double ref_gbs, const int nb = 4) {
    CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    int occ = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kernel, WARPS*32, smem));
    const int rows = (int) (b.m/256);
    const int n1   = std::max(1, (b.sms*std::min(occ, nb))/rows);
    const dim3 grid(n1, rows);
    const double us = time_us([&](int c) {
        prm p = { b.w[c], (int) b.n, n1*WARPS, delay, b.sink };
        kernel<<<grid, WARPS*32, smem>>>(p);
    });
    cudaFuncAttributes fa;
    CK(cudaFuncGetAttributes(&fa, kernel));
    const double gbs = b.bytes/(us*1e3);
    printf("%-6s S %d delay %3d | smem %5.1f KB, fits %d an SM, n1 %2d, regs %3d | %8.2f us %7.0f GB/s %5.1f %%\n", name,
           S, delay, smem/1024.0, occ, n1, fa.numRegs, us, gbs, 100.0*gbs/ref_gbs);
}

int main(int argc, char ** argv) {
    if (argc > 1 && std::string(argv[1]) == "floor") {
        return run_floor();
    }
    bench b;
    b.m = argc > 2 ? atoll(argv[1]) : 28672;
    b.n = argc > 2 ? atoll(argv[2]) : 8192;
    if (b.m % 256 != 0 || b.n % 16 != 0) {
        fprintf(stderr, "m must be a multiple of 256 and n of 16\n");
        return 1;
    }
    b.bytes = (b.m/256)*b.n*BQ;
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    b.sms     = prop.multiProcessorCount;
    b.smem_sm = (int) prop.sharedMemPerMultiprocessor;
    printf("%s, %d SMs, %d KiB shared an SM; weight %lld x %lld Q4_K zigzag, %.1f MB x %d copies\n", prop.name, b.sms,
           b.smem_sm/1024, (long long) b.m, (long long) b.n, b.bytes/1e6, NCOPY);
    for (int c = 0; c < NCOPY; ++c) {
        char * w;
        CK(cudaMalloc(&w, b.bytes));
        CK(cudaMemset(w, 0x11*(c + 1), b.bytes));
        b.w.push_back(w);
    }
    CK(cudaMalloc(&b.sink, sizeof(unsigned)));

    const double all_us = time_us([&](int c) {
        k_read_all<<<b.sms*8, 256>>>((const uint4 *) b.w[c], b.bytes/16, b.sink);
    });
    const double ref = b.bytes/(all_us*1e3);
    printf("read-only kernel, every SM: %.2f us, %.0f GB/s (the %% column's 100)\n", all_us, ref);

    // 1. the carve-out: 4 KB a block (about the direct kernel's; L1 keeps most of the SM's 256 KB) against 56 KB (L1
    //    left ~28 KB), one wave at 4 blocks an SM
    for (const int sm : { 4096, 56*1024 }) {
        run(b, "flat", k_flat<4>, sm, 4, 0, ref);
    }
    for (const int delay : { 0, 16, 24, 32 }) {
        for (const int sm : { 4096, 56*1024 }) {
            run(b, "words", k_direct<0, 1, false>, sm, 1, delay, ref);
            run(b, "words", k_direct<0, 2, false>, sm, 2, delay, ref);
            run(b, "words", k_direct<0, 4, false>, sm, 4, delay, ref);
            run(b, "v1", k_direct<1, 2, false>, sm, 2, delay, ref);
            run(b, "pipe", k_direct<0, 1, true>, sm, 1, delay, ref);
            run(b, "pipe", k_direct<0, 2, true>, sm, 2, delay, ref);
        }
        run(b, "ring", k_ring<3>, WARPS*3*16*BQ, 3, delay, ref);
        run(b, "ring", k_ring<4>, WARPS*4*16*BQ, 4, delay, ref);
        run(b, "ring", k_ring<6>, WARPS*6*16*BQ, 6, delay, ref);
    }
    // 2. more blocks an SM (the grid one wave at 4, 6 or 8): what freeing the registers that hold loads in flight
    //    could buy
    printf("-- blocks an SM\n");
    for (const int delay : { 0, 32, 48 }) {
        for (const int nb : { 4, 6, 8 }) {
            run(b, "words", k_direct<0, 2, false>, 4096, 2, delay, ref, nb);
            run(b, "ring", k_ring<3>, WARPS*3*16*BQ, 3, delay, ref, nb);
            if (nb == 8) {
                run(b, "ring64", k_ring<3, 8>, WARPS*3*16*BQ, 3, delay, ref, nb);
            }
            if (nb <= 6) {
                run(b, "ring", k_ring<4>, WARPS*4*16*BQ, 4, delay, ref, nb);
            }
        }
    }
    for (char * w : b.w) {
        CK(cudaFree(w));
    }
    CK(cudaFree(b.sink));
    return 0;
}
