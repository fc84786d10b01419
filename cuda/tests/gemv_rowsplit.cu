// llama-sparse: a zigzag Q4_K GEMV with no cross-block reduction (issue 6's small shapes), measured on the GPU at hand.
//
//   nvcc -O3 -arch=sm_90 -std=c++17 cuda/tests/gemv_rowsplit.cu -o gemv_rowsplit && ./gemv_rowsplit [m n]
//
// Measurement only, no ggml. The direct kernel (cuda/mul-mat-zz.cu) splits a block-row's columns over n1 blocks, so
// the blocks of a row add into y through atomics after an init protocol: at 4096 rows that fixed cost is about half of
// a launch at 50 % sparsity. Here a block owns 64 output rows (one sub-block pair p of a 256-row block-row) over every
// active column, and stores them: no atomics, no init, no second pass.
//  - every block scans all of x (|x| >= thr, NaN kept) into an ascending list of (column, x) in shared memory;
//  - the block's warps split the list evenly in steps of 16 columns; lane (g, tq) loads word g of the pair's 32 quant
//    bytes of its 4 columns, so tile T's row g is byte T's low nibble (row 4g + T, sub-block 2p) and row g + 8 the
//    high nibble (row 32 + 4g + T, sub-block 2p + 1); A is the bare nibble in an f16 mantissa (q 2^-24, exact);
//  - B's column 0 is x d sc of sub-block 2p, column 1 that of 2p + 1 (lanes g = 0 and 1), so one m16n8k16 a tile
//    serves both sub-blocks; the min terms are fp32 sums of x dmin m, taken off at the end;
//  - the warps' 64 partial rows are summed in shared memory and stored.
// Prints us a launch inside a CUDA graph (weights rotated over copies totalling >= 256 MiB), dense and at 25-80 %
// sparsity, and the relative L2 error against an fp64 host reference.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "probe-check.h"

#define CUDA_CHECK(x) CK(x)
#include "graph-time.h"

#define BQ 144 // bytes of a Q4_K block

struct rs_args {
    const uint8_t * w;   // m/256 stored rows of n blocks
    const float   * x;   // n
    float         * y;   // m
    int             n;
    float           thr; // keep !(|x| < thr)
};

static __device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t b0,
                                                 const uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 6-bit scale and min of sub-block s from a Q4_K header (d, dmin, scales[12]) held as 4 words (no local array:
// s differs between lanes)
static __device__ __forceinline__ void scale_min(const uint4 h, const int s, float & sc, float & mn) {
    const int sh = 8*(s & 3);
    if (s < 4) {
        sc = (h.y >> sh) & 63;
        mn = (h.z >> sh) & 63;
    } else {
        sc = ((h.w >> sh) & 0xF) | (((h.y >> sh) >> 6 & 3) << 4);
        mn = ((h.w >> sh) >> 4 & 0xF) | (((h.z >> sh) >> 6 & 3) << 4);
    }
}

static __device__ __forceinline__ float h2f_lo(const uint32_t v) {
    return __half2float(__ushort_as_half((unsigned short) (v & 0xFFFF)));
}
static __device__ __forceinline__ float h2f_hi(const uint32_t v) {
    return __half2float(__ushort_as_half((unsigned short) (v >> 16)));
}

// inclusive prefix sum of v over the warp's lanes
static __device__ __forceinline__ int warp_incl_sum(int v, const int lane) {
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int t = __shfl_up_sync(0xFFFFFFFF, v, o);
        if (lane >= o) {
            v += t;
        }
    }
    return v;
}

// one step's loads: the quant word and (lanes g < 2) the header of each of the lane's 4 columns
struct rs_step {
    uint32_t q[4];
    uint4    h[4];
    float    x[4];
};

template <int W, int R, bool DENSE>
static __global__ void __launch_bounds__(W*32, 1) k_rowsplit(const rs_args a) {
    static_assert(R == 64 || R == 32, "R: a sub-block pair or one sub-block");
    extern __shared__ __align__(16) char smem[];
    uint16_t * s_col = (uint16_t *) smem;                       // [n + 16]
    float    * s_x   = (float *) (smem + ((2*(a.n + 16) + 15) & ~15)); // [n + 16]
    __shared__ int   s_woff[W + 1];
    __shared__ float s_part[W][64];
    __shared__ float s_k[W][2];

    const int tid  = threadIdx.x;
    const int lane = tid % 32, warp = tid / 32;
    const int g = lane / 4, tq = lane % 4;
    // R 64: rows 64p.. of block-row r (sub-blocks 2p, 2p + 1); R 32: sub-block sr = 2p + hi alone
    const int r = blockIdx.x / (256/R), u = blockIdx.x % (256/R);
    const int p = R == 64 ? u : u/2, hi = R == 64 ? 0 : u % 2;
    const int n = a.n;

    int nact = n;
    if constexpr (!DENSE) {
        // each thread a contiguous range of cpt columns (float4 loads): count, one block scan, then the writes
        const int cpt = ((n + W*32 - 1) / (W*32) + 3) & ~3;
        const int c0  = min(n, tid*cpt), c1 = min(n, c0 + cpt);
        int cnt = 0;
        for (int c = c0; c < c1; c += 4) {
            const float4 v = *(const float4 *) (a.x + c);
            cnt += !(fabsf(v.x) < a.thr) + !(fabsf(v.y) < a.thr) + !(fabsf(v.z) < a.thr) + !(fabsf(v.w) < a.thr);
        }
        const int incl = warp_incl_sum(cnt, lane);
        if (lane == 31) {
            s_woff[warp] = incl;
        }
        __syncthreads();
        if (warp == 0) {
            const int v = lane < W ? s_woff[lane] : 0;
            const int e = warp_incl_sum(v, lane);
            if (lane < W) {
                s_woff[lane] = e - v;
            }
            if (lane == W - 1) {
                s_woff[W] = e;
            }
        }
        __syncthreads();
        int pos = s_woff[warp] + incl - cnt;
        for (int c = c0; c < c1; ++c) {
            const float v = a.x[c];
            if (!(fabsf(v) < a.thr)) {
                s_col[pos] = (uint16_t) c;
                s_x[pos]   = v;
                ++pos;
            }
        }
        nact = s_woff[W];
        // pad to whole steps with column 0 at x = 0 (its loads are real, its products zero)
        if (tid < 16) {
            s_col[nact + tid] = 0;
            s_x[nact + tid]   = 0.0f;
        }
        __syncthreads();
    }

    const int nsteps = (nact + 15) / 16;
    const int s0 = (nsteps*warp) / W, s1 = (nsteps*(warp + 1)) / W;
    const uint8_t * wrow = a.w + (int64_t) r*n*BQ;
    const int sb = R == 64 ? 2*p + (g & 1) : 2*p + hi; // R 64: lanes g = 0 / 1 give B columns 0 / 1
    const bool bl = R == 64 ? g < 2 : g == 0;

    constexpr int NT = R/16; // tiles
    float acc[NT][4] = {};
    float kacc = 0.0f;

    auto load = [&](const int s, rs_step & st) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int k = 16*s + 2*tq + (i & 1) + 8*(i >> 1);
            int col;
            if constexpr (DENSE) {
                col     = k;
                st.x[i] = __ldg(a.x + k);
            } else {
                col     = s_col[k];
                st.x[i] = s_x[k];
            }
            const uint8_t * blk = wrow + (int64_t) col*BQ;
            st.q[i] = __ldg((const uint32_t *) (blk + 16 + 32*p + 4*g));
            if (bl) {
                st.h[i] = __ldg((const uint4 *) blk);
            } else {
                st.h[i] = make_uint4(0, 0, 0, 0);
            }
        }
    };
    auto compute = [&](const rs_step & st) {
        float bv[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            float sc, mn;
            scale_min(st.h[i], sb, sc, mn);
            const float d = h2f_lo(st.h[i].x), dm = h2f_hi(st.h[i].x);
            bv[i] = bl ? st.x[i]*d*sc : 0.0f;
            kacc += bl ? st.x[i]*dm*mn : 0.0f;
        }
        const __half2 b01 = __floats2half2_rn(bv[0], bv[1]);
        const __half2 b23 = __floats2half2_rn(bv[2], bv[3]);
        const uint32_t b0 = *(const uint32_t *) &b01, b1 = *(const uint32_t *) &b23;
#pragma unroll
        for (int T = 0; T < NT; ++T) {
            if constexpr (R == 64) {
                // tile row g: byte T's low nibble (sub-block 2p), row g + 8: its high nibble (2p + 1)
                const uint32_t sel = T | (T << 4) | ((4 + T) << 8) | ((4 + T) << 12);
                const uint32_t v01 = __byte_perm(st.q[0], st.q[1], sel);
                const uint32_t v23 = __byte_perm(st.q[2], st.q[3], sel);
                const uint32_t af[4] = { v01 & 0x000F000F, (v01 >> 4) & 0x000F000F, v23 & 0x000F000F,
                                         (v23 >> 4) & 0x000F000F };
                mma_16816(acc[T], af, b0, b1);
            } else {
                // tile row g: byte T, row g + 8: byte T + 2, the nibble of sub-block sb
                const uint32_t sel = T | ((T + 2) << 4) | ((4 + T) << 8) | ((6 + T) << 12);
                const int sh = 4*hi;
                const uint32_t v01 = __byte_perm(st.q[0], st.q[1], sel) >> sh;
                const uint32_t v23 = __byte_perm(st.q[2], st.q[3], sel) >> sh;
                const uint32_t af[4] = { v01 & 0x000F000F, (v01 >> 8) & 0x000F000F, v23 & 0x000F000F,
                                         (v23 >> 8) & 0x000F000F };
                mma_16816(acc[T], af, b0, b1);
            }
        }
    };

    int s = s0;
    for (; s + 1 < s1; s += 2) {
        rs_step st0, st1;
        load(s, st0);
        load(s + 1, st1);
        compute(st0);
        compute(st1);
    }
    if (s < s1) {
        rs_step st0;
        load(s, st0);
        compute(st0);
    }

    // the min terms: lanes g = 0 (sub-block 2p) and g = 1 (2p + 1), summed over tq
    kacc += __shfl_xor_sync(0xFFFFFFFF, kacc, 1);
    kacc += __shfl_xor_sync(0xFFFFFFFF, kacc, 2);
    if (lane == 0 || (R == 64 && lane == 4)) {
        s_k[warp][lane / 4] = kacc;
    }
    if (tq == 0) {
#pragma unroll
        for (int T = 0; T < NT; ++T) {
            if constexpr (R == 64) {
                s_part[warp][4*g + T]      = acc[T][0]; // D[g][0]: row 4g + T, sub-block 2p
                s_part[warp][32 + 4*g + T] = acc[T][3]; // D[g + 8][1]: row 32 + 4g + T, sub-block 2p + 1
            } else {
                s_part[warp][4*g + T]     = acc[T][0]; // D[g][0]: row 4g + T
                s_part[warp][4*g + T + 2] = acc[T][2]; // D[g + 8][0]: row 4g + T + 2
            }
        }
    }
    __syncthreads();
    if (tid < R) {
        float v = 0.0f, k = 0.0f;
#pragma unroll
        for (int w = 0; w < W; ++w) {
            v += s_part[w][tid];
            k += s_k[w][tid / 32];
        }
        a.y[(int64_t) r*256 + 64*p + 32*hi + tid] = v*16777216.0f - k;
    }
}

// ---- host ----

static uint64_t rng_state = 0x243F6A8885A308D3ull;
static uint32_t rnd32() {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t) (rng_state >> 16);
}
static float rndu() { return (rnd32() >> 8) * (1.0f/16777216.0f); }
static float rndn() {
    const float u1 = std::max(rndu(), 1e-7f), u2 = rndu();
    return sqrtf(-2.0f*logf(u1))*cosf(6.2831853f*u2);
}
static uint16_t f2h(const float f) {
    const __half h = __float2half(f);
    return *(const uint16_t *) &h;
}
static float h2f(const uint16_t u) {
    __half h;
    memcpy(&h, &u, 2);
    return __half2float(h);
}

// random but valid Q4_K blocks: d, dmin positive normal f16, random scales and nibbles
static void fill_q4k(std::vector<uint8_t> & w) {
    for (size_t b = 0; b < w.size()/BQ; ++b) {
        uint8_t * blk = w.data() + b*BQ;
        const uint16_t d = f2h(0.0005f + 0.001f*rndu()), dm = f2h(0.0002f + 0.0005f*rndu());
        memcpy(blk, &d, 2);
        memcpy(blk + 2, &dm, 2);
        for (int i = 4; i < BQ; ++i) {
            blk[i] = (uint8_t) rnd32();
        }
    }
}

// y = W x over the kept columns, W dequantized as ggml's dequantize_row_q4_K, in fp64
static void ref_gemv(const std::vector<uint8_t> & w, const std::vector<float> & x, const float thr, const int64_t m,
                     const int64_t n, std::vector<double> & y) {
    y.assign(m, 0.0);
    for (int64_t r = 0; r < m/256; ++r) {
        for (int64_t j = 0; j < n; ++j) {
            if (fabsf(x[j]) < thr) {
                continue;
            }
            const uint8_t * blk = w.data() + (r*n + j)*BQ;
            uint16_t du, dmu;
            memcpy(&du, blk, 2);
            memcpy(&dmu, blk + 2, 2);
            const double d = h2f(du), dm = h2f(dmu);
            const uint8_t * q = blk + 4;
            for (int s = 0; s < 8; ++s) {
                int sc, mn;
                if (s < 4) {
                    sc = q[s] & 63;
                    mn = q[s + 4] & 63;
                } else {
                    sc = (q[s + 4] & 0xF) | ((q[s - 4] >> 6) << 4);
                    mn = (q[s + 4] >> 4) | ((q[s] >> 6) << 4);
                }
                for (int l = 0; l < 32; ++l) {
                    const uint8_t byte = blk[16 + 32*(s/2) + l];
                    const int qv = (s & 1) ? byte >> 4 : byte & 0xF;
                    y[r*256 + 32*s + l] += (d*sc*qv - dm*mn)*x[j];
                }
            }
        }
    }
}

template <int W, int R, bool DENSE>
static void launch1(const rs_args & a, const int64_t m, cudaStream_t st) {
    static bool set = false;
    if (!set) {
        CK(cudaFuncSetAttribute(k_rowsplit<W, R, DENSE>, cudaFuncAttributeMaxDynamicSharedMemorySize, 200*1024));
        set = true;
    }
    const size_t smem = DENSE ? 0 : (size_t) (((2*(a.n + 16) + 15) & ~15) + 4*(a.n + 16));
    k_rowsplit<W, R, DENSE><<<(unsigned) (m/R), W*32, smem, st>>>(a);
}

// config c: bit 0 W 16 (else 8), bit 1 R 32 (else 64)
static void launch(const int c, const bool dense, const rs_args & a, const int64_t m, cudaStream_t st) {
    switch (c*2 + dense) {
        case 0: launch1<8, 64, false>(a, m, st); break;
        case 1: launch1<8, 64, true>(a, m, st); break;
        case 2: launch1<16, 64, false>(a, m, st); break;
        case 3: launch1<16, 64, true>(a, m, st); break;
        case 4: launch1<8, 32, false>(a, m, st); break;
        case 5: launch1<8, 32, true>(a, m, st); break;
        case 6: launch1<16, 32, false>(a, m, st); break;
        case 7: launch1<16, 32, true>(a, m, st); break;
    }
}
static const int cfg_w[4] = { 8, 16, 8, 16 }, cfg_r[4] = { 64, 64, 32, 32 };

int main(int argc, char ** argv) {
    std::vector<std::pair<int64_t, int64_t>> shapes = {
        { 4096, 4096 }, { 11008, 4096 }, { 4096, 11008 }, { 14336, 4096 }, { 4096, 14336 }, { 5120, 5120 },
        { 13824, 5120 }, { 5120, 13824 }, { 8192, 8192 }, { 28672, 8192 }, { 8192, 28672 },
    };
    if (argc > 2) {
        shapes = { { atoll(argv[1]), atoll(argv[2]) } };
    }
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("%s, %d SMs: row-split zigzag Q4_K GEMV (64 or 32 rows a block, no cross-block reduction), batch 1\n", prop.name,
           prop.multiProcessorCount);
    cudaStream_t stream;
    CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    const float sps[] = { 0.25f, 0.40f, 0.50f, 0.65f, 0.80f };
    printf("%6s %6s %5s | %8s %8s | %8s %8s %8s %8s %8s | max rel L2 err\n", "m", "n", "W/R", "dense", "list 0%", "25 %",
           "40 %", "50 %", "65 %", "80 %");
    int fails = 0;
    for (const auto & sh : shapes) {
        const int64_t m = sh.first, n = sh.second, bytes = (m/256)*n*BQ;
        if (m % 256 != 0 || n % 16 != 0 || n > 28672) {
            fprintf(stderr, "skip %lld x %lld: m %% 256, n %% 16, n <= 28672\n", (long long) m, (long long) n);
            continue;
        }
        const int ncopy = (int) std::max<int64_t>(3, (256ll << 20)/bytes + 1);
        std::vector<uint8_t> w0(bytes);
        fill_q4k(w0);
        std::vector<uint8_t *> wd(ncopy);
        for (int c = 0; c < ncopy; ++c) {
            CK(cudaMalloc(&wd[c], bytes));
            CK(cudaMemcpy(wd[c], w0.data(), bytes, cudaMemcpyHostToDevice));
        }
        std::vector<float> x(n);
        for (auto & v : x) {
            v = rndn();
        }
        std::vector<float> ax(n);
        for (int64_t j = 0; j < n; ++j) {
            ax[j] = fabsf(x[j]);
        }
        std::sort(ax.begin(), ax.end());
        float * xd;
        float * yd;
        CK(cudaMalloc(&xd, n*sizeof(float)));
        CK(cudaMalloc(&yd, m*sizeof(float)));
        CK(cudaMemcpy(xd, x.data(), n*sizeof(float), cudaMemcpyHostToDevice));

        // correctness: dense, 0 %, 50 %, 100 % (no column)
        double err_max = 0.0;
        for (const float thr : { -1.0f, 0.0f, ax[n/2], INFINITY }) {
            const bool dense = thr < 0;
            std::vector<double> yr;
            ref_gemv(w0, x, dense ? 0.0f : thr, m, n, yr);
            for (int cfg = 0; cfg < 4; ++cfg) {
                CK(cudaMemset(yd, 0xFF, m*sizeof(float))); // NaN poison
                const rs_args a = { wd[0], xd, yd, (int) n, dense ? 0.0f : thr };
                launch(cfg, dense, a, m, stream);
                CK(cudaStreamSynchronize(stream));
                CK(cudaGetLastError());
                std::vector<float> y(m);
                CK(cudaMemcpy(y.data(), yd, m*sizeof(float), cudaMemcpyDeviceToHost));
                double num = 0.0, den = 0.0;
                bool nan = false;
                for (int64_t i = 0; i < m; ++i) {
                    nan |= !std::isfinite(y[i]);
                    num += (y[i] - yr[i])*(y[i] - yr[i]);
                    den += yr[i]*yr[i];
                }
                const double err = den > 0 ? sqrt(num/den) : sqrt(num);
                err_max = std::max(err_max, err);
                if (nan || err > 5e-3) {
                    printf("FAIL %lld x %lld W %d R %d thr %g: err %.3g%s\n", (long long) m, (long long) n,
                           cfg_w[cfg], cfg_r[cfg], thr, err,
                           nan ? " (non-finite output)" : "");
                    ++fails;
                }
            }
        }

        for (int cfg = 0; cfg < 4; ++cfg) {
            double t[7];
            for (int k = 0; k < 7; ++k) {
                const bool dense = k == 0;
                const float thr  = k <= 1 ? 0.0f : ax[(int64_t) (sps[k - 2]*n)];
                t[k] = time_graph_us([&](cudaStream_t st, int i) {
                    const rs_args a = { wd[i % ncopy], xd, yd, (int) n, thr };
                    launch(cfg, dense, a, m, st);
                }, 2*ncopy > 24 ? 2*ncopy : 24, stream);
            }
            printf("%6lld %6lld %2d/%2d | %8.2f %8.2f | %8.2f %8.2f %8.2f %8.2f %8.2f | %.2e (dense %.0f GB/s)\n",
                   (long long) m, (long long) n, cfg_w[cfg], cfg_r[cfg], t[0], t[1], t[2], t[3], t[4], t[5], t[6], err_max,
                   bytes/(t[0]*1e3));
        }
        for (auto * p : wd) {
            CK(cudaFree(p));
        }
        CK(cudaFree(xd));
        CK(cudaFree(yd));
    }
    CK(cudaStreamDestroy(stream));
    printf("%s\n", fails ? "FAILED" : "PASSED");
    return fails ? 1 : 0;
}
