// llama-sparse: standalone correctness test and microbenchmark of the CUDA zigzag kernels
// (cuda/mul-mat-zz.cu, cuda/sparse-idx.cu), calling their launchers directly, not through ggml graphs.
//
//   test_zz_cuda test  [--seed S] [--cases N]            correctness, exit status 1 on any failure
//   test_zz_cuda bench [--type T|all] [--batch 1,4,8] [--pattern random|contiguous] [--l2-warm]
//                      [--shapes 4096x4096,...] [--csv FILE] [--reduction ticket|first|atomic|both (default)]
//   test_zz_cuda prefill [--type T|all] [--batch 16,64,512] [--shapes ...]
//   test_zz_cuda tune  [--max-batch 8] [--sparsity 0.5] [--out FILE]
//
// Weights are quantized with ggml_quantize_chunk (libggml-base) and the reference is computed in fp64 from
// ggml's to_float of the zigzag blocks. Built by cuda/tests/build.sh.
#include "mul-mat-zz.cuh"
#include "zz-g8.cuh"
#include "sparse-idx.cuh"
#include "launch.cuh"

#include "ggml.h"

#ifdef ZZ_TEST_WITH_GGML_CUDA
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cuda.h"
#endif // ZZ_TEST_WITH_GGML_CUDA

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#ifndef ZZ_TEST_WITH_GGML_CUDA
#include "ggml-cuda-stubs.h"
#endif // ZZ_TEST_WITH_GGML_CUDA
#include "graph-time.h"

// (ZZ_TYPE_Q4_0_G8, ZZ_TYPE_Q8_0_G8: Q4_0, Q8_0 regrouped on the device, cuda/zz-g8.cuh)
static const ggml_type test_types[] = { GGML_TYPE_Q4_K, GGML_TYPE_Q8_0, GGML_TYPE_Q4_0, GGML_TYPE_Q6_K, ZZ_TYPE_Q4_0_G8,
                                        ZZ_TYPE_Q8_0_G8 };

static bool is_g8(const ggml_type type) {
    return type == ZZ_TYPE_Q4_0_G8 || type == ZZ_TYPE_Q8_0_G8;
}
// the ggml type whose blocks a type's weights are made of (and stock runs)
static ggml_type base_type(const ggml_type type) {
    return type == ZZ_TYPE_Q4_0_G8 ? GGML_TYPE_Q4_0 : type == ZZ_TYPE_Q8_0_G8 ? GGML_TYPE_Q8_0 : type;
}
// the G8 type of test case c of the group, norm and glu tests: Q4_0 and Q8_0 by turns
static ggml_type g8_pick(const int c) {
    return c % 2 ? ZZ_TYPE_Q8_0_G8 : ZZ_TYPE_Q4_0_G8;
}

// shapes m x n (outputs x inputs): Llama-2-7B/13B/70B and Llama-3-8B q/k/v/o, gate/up, down
static const int64_t bench_shapes[][2] = {
    {  4096,  4096 }, { 11008,  4096 }, {  4096, 11008 },
    {  5120,  5120 }, { 13824,  5120 }, {  5120, 13824 },
    {  8192,  8192 }, { 28672,  8192 }, {  8192, 28672 },
    {  1024,  4096 }, { 14336,  4096 }, {  4096, 14336 },
};

// ---------------------------------------------------------------------------------------------------
// helpers

struct test_rng {
    std::mt19937_64 gen;
    explicit test_rng(uint64_t seed) : gen(seed) {}
    double uniform() { return std::uniform_real_distribution<double>(0.0, 1.0)(gen); }
    double normal()  { return std::normal_distribution<double>(0.0, 1.0)(gen); }
    int    randint(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(gen); } // [lo, hi]
};

template <typename T>
struct dev_buf {
    T *    ptr = nullptr;
    size_t n   = 0;
    explicit dev_buf(size_t count) : n(count) {
        CUDA_CHECK(cudaMalloc(&ptr, std::max<size_t>(count, 1)*sizeof(T)));
    }
    ~dev_buf() {
        cudaFree(ptr);
    }
    dev_buf(const dev_buf &) = delete;
    dev_buf & operator=(const dev_buf &) = delete;
    // synchronous for every stream: the tests also use non-blocking streams
    void upload(const T * src, size_t count) {
        CUDA_CHECK(cudaMemcpy(ptr, src, count*sizeof(T), cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaDeviceSynchronize());
    }
    void download(T * dst, size_t count) const {
        CUDA_CHECK(cudaMemcpy(dst, ptr, count*sizeof(T), cudaMemcpyDeviceToHost));
    }
    void poison() {
        CUDA_CHECK(cudaMemset(ptr, 0xFF, n*sizeof(T))); // all-ones: NaN for float, -1 for int
        CUDA_CHECK(cudaDeviceSynchronize());
    }
};

// zigzag weights: (m/B)*n blocks; block (r, j) holds W[r*B .. r*B+B-1, j]
struct zz_weights {
    ggml_type            type;
    int64_t              n;
    int64_t              m;
    int64_t              B;
    std::vector<uint8_t> q;      // quantized blocks
    std::vector<float>   deq;    // to_float of the blocks: W[r*B + i, j] = deq[(r*n + j)*B + i]
    std::vector<uint8_t> q_rows; // the G8 types: the blocks in the file's layout (q: regrouped on the host)
};

// the host's G8 regrouping of Q4_0 or Q8_0 blocks in the file's layout (cuda/zz-g8.cuh)
static std::vector<uint8_t> g8_pack_host(const ggml_type type, const std::vector<uint8_t> & rows, const int64_t n,
        const int64_t m) {
    std::vector<uint8_t> out(rows.size());
    for (int64_t r = 0; r < m/(ZZ_G8_ROWS*32); ++r) {
        for (int64_t j = 0; j < n; ++j) {
            if (type == ZZ_TYPE_Q4_0_G8) {
                zz_g8_pack(rows.data() + (r*ZZ_G8_ROWS*n + j)*ZZ_Q4_0_BYTES, n*ZZ_Q4_0_BYTES,
                           out.data() + (r*n + j)*ZZ_G8_BYTES);
            } else {
                zz_g8_pack_q8(rows.data() + (r*ZZ_G8_ROWS*n + j)*ZZ_Q8_0_BYTES, n*ZZ_Q8_0_BYTES,
                              out.data() + (r*n + j)*ZZ_G8Q8_BYTES);
            }
        }
    }
    return out;
}

static void make_weights(zz_weights & w, const ggml_type type_in, const int64_t n, const int64_t m, test_rng & rng) {
    const bool      g8   = is_g8(type_in);
    const ggml_type type = base_type(type_in); // what is quantized
    GGML_ASSERT(!g8 || m % (ZZ_G8_ROWS*32) == 0);
    w.type = type_in;
    w.n    = n;
    w.m    = m;
    w.B    = ggml_blck_size(type);
    const int64_t nblocks = (m/w.B)*n;

    // rows with different scales and a few outliers, like real weights
    std::vector<float> row_scale(m);
    for (int64_t i = 0; i < m; ++i) {
        row_scale[i] = (float) (0.01 + 0.04*rng.uniform());
    }
    std::vector<float> src(nblocks*w.B);
    for (int64_t r = 0; r < m/w.B; ++r) {
        for (int64_t j = 0; j < n; ++j) {
            for (int64_t i = 0; i < w.B; ++i) {
                double v = rng.normal();
                if (rng.uniform() < 0.002) {
                    v *= 8.0;
                }
                src[(r*n + j)*w.B + i] = (float) v*row_scale[r*w.B + i];
            }
        }
    }
    w.q.resize(nblocks*ggml_type_size(type));
    ggml_quantize_chunk(type, src.data(), w.q.data(), 0, nblocks, w.B, nullptr);
    w.deq.resize(nblocks*w.B);
    ggml_get_type_traits(type)->to_float(w.q.data(), w.deq.data(), nblocks*w.B);
    if (g8) {
        w.q_rows = w.q;
        w.q      = g8_pack_host(type_in, w.q_rows, n, m);
    }
}

// y_ref[t*m + i] = sum over cols of x[t*x_stride + j] * W[i, j]
static void ref_gemv(const zz_weights & w, const std::vector<float> & x, const int64_t x_stride, const int T,
        const std::vector<int32_t> & cols, std::vector<double> & y) {
    const int64_t rows = w.m/w.B;
    y.assign(T*w.m, 0.0);
    std::vector<double> xj(T);
    for (int32_t j : cols) {
        for (int t = 0; t < T; ++t) {
            xj[t] = x[t*x_stride + j];
        }
        for (int64_t r = 0; r < rows; ++r) {
            const float * blk = w.deq.data() + (r*w.n + j)*w.B;
            for (int t = 0; t < T; ++t) {
                double * yt = y.data() + t*w.m + r*w.B;
                for (int64_t i = 0; i < w.B; ++i) {
                    yt[i] += xj[t]*blk[i];
                }
            }
        }
    }
}

// norm-wise relative error; every element must be written (no NaN left from the poison), padding untouched,
// an all-zero reference must give exactly 0
static bool check_y(const char * what, const std::vector<float> & y, const int64_t y_stride, const std::vector<double> & ref,
        const int64_t m, const int T, const double tol, double * rel_out = nullptr) {
    double num = 0.0;
    double den = 0.0;
    for (int t = 0; t < T; ++t) {
        for (int64_t i = 0; i < m; ++i) {
            const float v = y[t*y_stride + i];
            if (!std::isfinite(v)) {
                printf("  FAIL %s: y[%d][%lld] = %f not written or not finite\n", what, t, (long long) i, v);
                return false;
            }
            const double d = v - ref[t*m + i];
            num += d*d;
            den += ref[t*m + i]*ref[t*m + i];
        }
        for (int64_t i = m; i < y_stride; ++i) {
            if (!std::isnan(y[t*y_stride + i])) {
                printf("  FAIL %s: padding y[%d][%lld] was written\n", what, t, (long long) i);
                return false;
            }
        }
    }
    if (den == 0.0) {
        for (int t = 0; t < T; ++t) {
            for (int64_t i = 0; i < m; ++i) {
                if (y[t*y_stride + i] != 0.0f) {
                    printf("  FAIL %s: all-zero reference but y[%d][%lld] = %g\n", what, t, (long long) i, y[t*y_stride + i]);
                    return false;
                }
            }
        }
        if (rel_out) {
            *rel_out = 0.0;
        }
        return true;
    }
    const double rel = sqrt(num/den);
    if (rel_out) {
        *rel_out = rel;
    }
    if (!(rel <= tol)) {
        printf("  FAIL %s: relative error %.3e > %.1e\n", what, rel, tol);
        return false;
    }
    return true;
}

// x [T][x_stride]; a column is active with probability 1 - sparsity. Active columns have |x| >= thr for at
// least one token; inactive ones have |x| < thr for all tokens (exactly 0 if zero_inactive).
static void make_x(std::vector<float> & x, std::vector<int32_t> & active, const int64_t n, const int T, const int64_t x_stride,
        const double sparsity, const float thr, const bool zero_inactive, test_rng & rng) {
    x.assign(T*x_stride, 12345.0f); // padding: must never be read into a result
    active.clear();
    for (int64_t j = 0; j < n; ++j) {
        const bool act = rng.uniform() >= sparsity;
        if (act) {
            const int tb = rng.randint(0, T - 1);
            for (int t = 0; t < T; ++t) {
                float v = (float) rng.normal();
                if (t == tb) {
                    v = (v < 0 ? -1.0f : 1.0f)*(thr + fabsf(v));
                }
                x[t*x_stride + j] = v;
            }
            active.push_back((int32_t) j);
        } else {
            for (int t = 0; t < T; ++t) {
                x[t*x_stride + j] = zero_inactive ? 0.0f : (float) ((2.0*rng.uniform() - 1.0)*0.999*thr);
            }
        }
    }
}

// the GEMV is fp32 except Q4_K and the G8 types on sm_80+, which run on tensor cores with f16 weights and x (fp32
// accumulation)
static double gemv_tol(const ggml_type type) {
    return type == GGML_TYPE_Q4_K || is_g8(type) ? 3e-3 : 1e-4;
}

static int64_t pick_n(test_rng & rng) {
    static const int64_t ns[] = { 1, 2, 31, 32, 33, 63, 100, 257, 640, 1000, 1500, 2049, 3000 };
    if (rng.uniform() < 0.7) {
        return ns[rng.randint(0, (int) (sizeof(ns)/sizeof(ns[0])) - 1)];
    }
    return rng.randint(1, 2500);
}

// ---------------------------------------------------------------------------------------------------
// ablation kernel: sparse GEMV in the standard Q4_K layout ([m rows][n/256 blocks], a block holds 256
// consecutive input columns of one output row), skipping a lane's 8 columns when their x is 0 for every
// token. Zeros inside a block save arithmetic but hardly any memory traffic.

static __device__ __forceinline__ float naive_byte_f(const uint32_t w, const int k) {
    return __int_as_float(__byte_perm(w, 0x4B000000u, 0x7440 | k)) - 8388608.0f;
}

template <int T>
static __global__ void naive_q4_K_skip(const char * w, const float * x, const int64_t x_stride, float * y,
        const int64_t y_stride, const int n, const int m) {
    const int lane = threadIdx.x % WARP_SIZE;
    const int row  = blockIdx.x*(blockDim.x/WARP_SIZE) + threadIdx.x/WARP_SIZE;
    if (row >= m) {
        return;
    }
    const int    nb   = n/QK_K;
    const char * wr   = w + (int64_t) row*nb*sizeof(block_q4_K);
    const int    qoff = 16 + 32*(lane/8) + 8*(lane%4);
    const int    nsh  = (lane & 4) ? 4 : 0;
    const int    sub  = lane/4;
    const int    sh   = 8*(sub & 3);

    float acc[T] = { 0.0f };
#pragma unroll 2
    for (int b = 0; b < nb; ++b) {
        const int64_t j0 = (int64_t) b*QK_K + 8*lane;
        float xv[T][8];
        bool  any = false;
#pragma unroll
        for (int t = 0; t < T; ++t) {
            const float4 a = *(const float4 *) (x + t*x_stride + j0);
            const float4 c = *(const float4 *) (x + t*x_stride + j0 + 4);
            xv[t][0] = a.x; xv[t][1] = a.y; xv[t][2] = a.z; xv[t][3] = a.w;
            xv[t][4] = c.x; xv[t][5] = c.y; xv[t][6] = c.z; xv[t][7] = c.w;
#pragma unroll
            for (int k = 0; k < 8; ++k) {
                any = any || xv[t][k] != 0.0f;
            }
        }
        if (!any) {
            continue;
        }
        const char * blk = wr + (int64_t) b*sizeof(block_q4_K);
        const uint4  h   = __ldg((const uint4 *) blk);
        const uint2  q   = __ldg((const uint2 *) (blk + qoff));
        const uint32_t yb = h.y >> sh;
        const uint32_t zb = h.z >> sh;
        const uint32_t wb = h.w >> sh;
        uint32_t sc, mn;
        if (sub < 4) {
            sc = yb & 63;
            mn = zb & 63;
        } else {
            sc = (wb & 0x0F) | (((yb >> 6) & 3) << 4);
            mn = ((wb >> 4) & 0x0F) | (((zb >> 6) & 3) << 4);
        }
        const float2   dm  = __half22float2(*(const half2 *) &h.x);
        const float    dsc = dm.x*(float) sc;
        const float    dmn = dm.y*(float) mn;
        const uint32_t qa  = (q.x >> nsh) & 0x0F0F0F0F;
        const uint32_t qb  = (q.y >> nsh) & 0x0F0F0F0F;
        float qf[8];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            qf[k]     = naive_byte_f(qa, k);
            qf[k + 4] = naive_byte_f(qb, k);
        }
#pragma unroll
        for (int t = 0; t < T; ++t) {
            float s  = 0.0f;
            float sx = 0.0f;
#pragma unroll
            for (int k = 0; k < 8; ++k) {
                s  += xv[t][k]*qf[k];
                sx += xv[t][k];
            }
            acc[t] += dsc*s - dmn*sx;
        }
    }
#pragma unroll
    for (int t = 0; t < T; ++t) {
        const float s = warp_reduce_sum(acc[t]);
        if (lane == 0) {
            y[t*y_stride + row] = s;
        }
    }
}

static void naive_launch(const void * w, const int64_t n, const int64_t m, const float * x, const int64_t x_stride,
        const int T, float * y, const int64_t y_stride, cudaStream_t stream) {
    GGML_ASSERT(n % QK_K == 0);
    const int  warps = 4;
    const dim3 grid((m + warps - 1)/warps, 1, 1);
    const dim3 block(warps*WARP_SIZE, 1, 1);
    switch (T) {
        case 1: naive_q4_K_skip<1><<<grid, block, 0, stream>>>((const char *) w, x, x_stride, y, y_stride, (int) n, (int) m); break;
        case 2: naive_q4_K_skip<2><<<grid, block, 0, stream>>>((const char *) w, x, x_stride, y, y_stride, (int) n, (int) m); break;
        case 4: naive_q4_K_skip<4><<<grid, block, 0, stream>>>((const char *) w, x, x_stride, y, y_stride, (int) n, (int) m); break;
        case 8: naive_q4_K_skip<8><<<grid, block, 0, stream>>>((const char *) w, x, x_stride, y, y_stride, (int) n, (int) m); break;
        default: GGML_ABORT("naive ablation: batch %d not instantiated", T);
    }
    CUDA_CHECK(cudaGetLastError());
}

// ---------------------------------------------------------------------------------------------------
// correctness

static int test_idx(test_rng & rng, const int cases) {
    int failures = 0;
    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreate(&stream));
    const double sparsities[] = { 0.0, 0.01, 0.5, 0.99, 1.0 };
    for (int c = 0; c < cases; ++c) {
        int64_t n;
        switch (c % 4) {
            case 0:  n = rng.randint(1, 64);         break;
            case 1:  n = rng.randint(1, 5000);       break;
            case 2:  n = rng.randint(5000, 40000);   break;
            default: n = rng.randint(40000, 200000); break;
        }
        const int     T        = 1 + c % SPARSE_IDX_MAX_TOKENS;
        const int64_t x_stride = n + rng.randint(0, 5);
        const double  sp       = sparsities[c % 5];
        const float   thr      = rng.uniform() < 0.5 ? 0.5f : 1e-3f;

        std::vector<float>   x;
        std::vector<int32_t> active;
        make_x(x, active, n, T, x_stride, sp, thr, false, rng);

        dev_buf<float>   x_d(T*x_stride);
        dev_buf<int32_t> idx_d(n + 1);
        dev_buf<int32_t> scratch_d(std::max<int64_t>(1, sparse_idx_list_scratch_size(n, T)));
        x_d.upload(x.data(), x.size());
        idx_d.poison();
        sparse_idx_list_launch(x_d.ptr, n, T, x_stride, thr, idx_d.ptr, scratch_d.ptr, stream);
        CUDA_CHECK(cudaStreamSynchronize(stream));
        std::vector<int32_t> idx(n + 1);
        idx_d.download(idx.data(), n + 1);

        bool ok = idx[n] == (int32_t) active.size();
        for (size_t k = 0; ok && k < active.size(); ++k) {
            ok = idx[k] == active[k];
        }
        if (!ok) {
            printf("  FAIL idx list n=%lld T=%d sparsity=%.2f: count %d (want %zu)\n", (long long) n, T, sp, idx[n], active.size());
            failures++;
        }

        // mask mode, into a padded destination
        const int64_t   d_stride = n + 3;
        dev_buf<float>  m_d(T*d_stride);
        m_d.poison();
        sparse_idx_mask_launch(x_d.ptr, n, T, x_stride, thr, m_d.ptr, d_stride, stream);
        CUDA_CHECK(cudaStreamSynchronize(stream));
        std::vector<float> mk(T*d_stride);
        m_d.download(mk.data(), mk.size());
        bool mok = true;
        for (int t = 0; t < T && mok; ++t) {
            for (int64_t j = 0; j < n && mok; ++j) {
                const float v    = x[t*x_stride + j];
                const float want = fabsf(v) < thr ? 0.0f : v;
                mok = mk[t*d_stride + j] == want;
            }
        }
        if (!mok) {
            printf("  FAIL idx mask n=%lld T=%d\n", (long long) n, T);
            failures++;
        }
    }
    CUDA_CHECK(cudaStreamDestroy(stream));
    printf("sparse_idx: %d cases, %d failures\n", cases, failures);
    return failures;
}

// a NaN in x stays active, as on the CPU: LIST lists it, and every GEMV mode's output is NaN. Q4_K at batch 1, with
// small configs too (DENSE with one block of one warp a row runs as FUSED at thr 0)
static int test_nan(test_rng & rng) {
    int failures = 0;
    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreate(&stream));
    const int device = 0;
    for (int c = 0; c < 8; ++c) {
        const int64_t n   = rng.randint(1, 40)*32 + rng.randint(0, 31);
        const int64_t m   = QK_K*rng.randint(1, 3);
        const float   thr = 0.5f;
        std::vector<float>   x;
        std::vector<int32_t> active;
        make_x(x, active, n, 1, n, 0.5, thr, false, rng);
        const int64_t j_nan = rng.randint(0, (int) n - 1);
        x[j_nan] = NAN;

        zz_weights w;
        make_weights(w, GGML_TYPE_Q4_K, n, m, rng);
        zz_gemv_config cfg = zz_gemv_get_config(device, GGML_TYPE_Q4_K, n, m, 1);
        if (c % 2 == 1) {
            cfg.n1 = 1;
            cfg.n2 = 1;
            cfg.cluster = 0;
        }
        dev_buf<uint8_t> w_d(w.q.size());
        dev_buf<float>   x_d(x.size());
        dev_buf<int32_t> idx_d(n + 1);
        dev_buf<int32_t> scratch_d(std::max<int64_t>(1, sparse_idx_list_scratch_size(n, 1)));
        dev_buf<float>   y_d(m);
        w_d.upload(w.q.data(), w.q.size());
        x_d.upload(x.data(), x.size());

        idx_d.poison();
        sparse_idx_list_launch(x_d.ptr, n, 1, n, thr, idx_d.ptr, scratch_d.ptr, stream);
        CUDA_CHECK(cudaStreamSynchronize(stream));
        std::vector<int32_t> idx(n + 1);
        idx_d.download(idx.data(), n + 1);
        if (idx[n] < 0 || idx[n] > n || std::find(idx.begin(), idx.begin() + idx[n], (int32_t) j_nan) == idx.begin() + idx[n]) {
            printf("  FAIL nan n=%lld: column %lld (NaN) not in the list\n", (long long) n, (long long) j_nan);
            failures++;
            continue;
        }
        std::vector<float> y(m);
        for (const int mode : { (int) ZZ_GEMV_DENSE, (int) ZZ_GEMV_IDX, (int) ZZ_GEMV_FUSED }) {
            CUDA_CHECK(cudaMemset(y_d.ptr, 0, m*sizeof(float))); // (not NaN: a dropped NaN must show)
            CUDA_CHECK(cudaDeviceSynchronize());
            if (mode == ZZ_GEMV_FUSED) {
                if (!zz_gemv_launch_fused(GGML_TYPE_Q4_K, w_d.ptr, n, m, x_d.ptr, n, 1, thr, y_d.ptr, m, cfg, true, stream)) {
                    continue;
                }
            } else {
                zz_gemv_launch_ex(GGML_TYPE_Q4_K, w_d.ptr, n, m, x_d.ptr, n, 1, idx_d.ptr, (zz_gemv_mode) mode, y_d.ptr, m,
                        cfg, stream);
            }
            CUDA_CHECK(cudaStreamSynchronize(stream));
            y_d.download(y.data(), m);
            int64_t finite = 0;
            for (int64_t i = 0; i < m; ++i) {
                finite += !std::isnan(y[i]);
            }
            if (finite != 0) {
                printf("  FAIL nan n=%lld m=%lld n1=%d n2=%d mode %d: %lld of %lld outputs not NaN\n", (long long) n,
                        (long long) m, cfg.n1, cfg.n2, mode, (long long) finite, (long long) m);
                failures++;
            }
        }
    }
    CUDA_CHECK(cudaStreamDestroy(stream));
    printf("nan: 8 cases, %d failures\n", failures);
    return failures;
}

// the cross-block reductions of zz_gemv_set_ticket, by its argument
static const char * red_name(const int red) {
    return red == 1 ? "ticket" : red == 2 ? "first" : red == 3 ? "early" : "atomic";
}

// the counters of llama_sparse_get_stats after one launch (stream synchronized): one set of n columns with `active`
// kept if the launch counted, untouched (zero) if not; 1 on a mismatch
static int check_stats(const dev_buf<unsigned long long> & stats_d, cudaStream_t stream, const bool counted,
        const int64_t n, const size_t active, const char * what) {
    unsigned long long st[3];
    CUDA_CHECK(cudaStreamSynchronize(stream));
    stats_d.download(st, 3);
    const unsigned long long e[3] = { counted ? 1ull : 0ull, counted ? (unsigned long long) n : 0ull,
                                      counted ? (unsigned long long) active : 0ull };
    if (st[0] != e[0] || st[1] != e[1] || st[2] != e[2]) {
        printf("  FAIL %s: stats %llu sets, %llu columns, %llu kept; expected %llu, %llu, %llu\n",
                what, st[0], st[1], st[2], e[0], e[1], e[2]);
        return 1;
    }
    return 0;
}

static int test_gemv(test_rng & rng, const int cases) {
    int failures = 0;
    int runs     = 0;
    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreate(&stream));
    const double sparsities[] = { 0.0, 0.01, 0.5, 0.99, 1.0 };
    const int    n1s[]        = { 1, 2, 3, 5, 8, 16, 32 }; // 32: many blocks without a column when n is small
    const int    n2s[]        = { 1, 2, 4, 8 };
    int device;
    CUDA_CHECK(cudaGetDevice(&device));

    for (ggml_type type : test_types) {
        double worst[4] = { 0.0, 0.0, 0.0, 0.0 }; // atomic, ticket, first, early
        for (int c = 0; c < cases; ++c) {
            const int64_t B    = zz_blck_size(type);
            const int64_t rows = B == QK_K ? rng.randint(1, 6) : rng.randint(1, 40);
            const int64_t m    = rows*B;
            const int64_t n    = pick_n(rng);
            const int     T    = 1 + c % ZZ_GEMV_MAX_BATCH;
            const double  sp   = sparsities[(c/ZZ_GEMV_MAX_BATCH + c) % 5];
            const float   thr  = 0.25f;
            const int64_t x_stride = n + (c % 3 == 0 ? rng.randint(1, 7) : 0);
            const int64_t y_stride = m + (c % 4 == 1 ? rng.randint(1, 9) : 0);

            zz_gemv_config cfg;
            cfg.n1      = n1s[rng.randint(0, 6)];
            cfg.n2      = n2s[rng.randint(0, 3)];
            cfg.cluster = rng.randint(0, 1);
            if (c % 7 == 0) {
                cfg = zz_gemv_get_config(device, type, n, m, T);
            }

            zz_weights w;
            make_weights(w, type, n, m, rng);
            std::vector<float>   x;
            std::vector<int32_t> active;
            make_x(x, active, n, T, x_stride, sp, thr, false, rng);
            std::vector<float> xz = x; // inactive columns exactly 0, for the in-place skip
            {
                std::vector<char> is_act(n, 0);
                for (int32_t j : active) {
                    is_act[j] = 1;
                }
                for (int t = 0; t < T; ++t) {
                    for (int64_t j = 0; j < n; ++j) {
                        if (!is_act[j]) {
                            xz[t*x_stride + j] = 0.0f;
                        }
                    }
                }
            }
            std::vector<int32_t> all(n);
            for (int64_t j = 0; j < n; ++j) {
                all[j] = (int32_t) j;
            }
            std::vector<double> ref_dense;
            std::vector<double> ref_sparse;
            ref_gemv(w, x, x_stride, T, all, ref_dense);
            ref_gemv(w, x, x_stride, T, active, ref_sparse);

            dev_buf<uint8_t> w_d(w.q.size());
            if (is_g8(type)) {
                // the device's regrouping in place against the host's
                w_d.upload(w.q_rows.data(), w.q_rows.size());
                runs++;
                std::vector<uint8_t> got(w.q.size());
                if (!zz_regroup(base_type(type), w_d.ptr, n, m, stream)) {
                    printf("  FAIL regroup m=%lld n=%lld: no device memory\n", (long long) m, (long long) n);
                    failures++;
                } else {
                    w_d.download(got.data(), got.size());
                    if (got != w.q) {
                        printf("  FAIL regroup m=%lld n=%lld: the device's bytes differ from the host's\n", (long long) m, (long long) n);
                        failures++;
                    }
                }
            }
            dev_buf<float>   x_d(x.size());
            dev_buf<float>   xz_d(xz.size());
            dev_buf<int32_t> idx_d(n + 1);
            dev_buf<int32_t> scratch_d(std::max<int64_t>(1, sparse_idx_list_scratch_size(n, T)));
            dev_buf<float>   y_d(T*y_stride);
            dev_buf<unsigned long long> stats_d(3);
            w_d.upload(w.q.data(), w.q.size());
            x_d.upload(x.data(), x.size());
            xz_d.upload(xz.data(), xz.size());
            std::vector<float> y(y_d.n);

            // the cross-block reductions (ticket, first block stores, early, memset + atomics) on the same stream, one
            // after the other: a counter left non-zero by any launch breaks a later one (NaN or summed early)
            for (const int ticket : { 1, 2, 3, 0 }) {
                zz_gemv_set_ticket(ticket);
                char what[256];
                snprintf(what, sizeof(what), "%s m=%lld n=%lld T=%d sp=%.2f n1=%d n2=%d cl=%d %s", zz_type_name(type),
                        (long long) m, (long long) n, T, sp, cfg.n1, cfg.n2, cfg.cluster, red_name(ticket));
                double rel;
                auto check = [&](const char * mode, const std::vector<double> & ref) {
                    CUDA_CHECK(cudaStreamSynchronize(stream));
                    y_d.download(y.data(), y.size());
                    const std::string s = std::string(what) + " " + mode;
                    runs++;
                    if (!check_y(s.c_str(), y, y_stride, ref, m, T, gemv_tol(type), &rel)) {
                        failures++;
                    }
                    worst[ticket] = std::max(worst[ticket], rel);
                };

                // the counters of llama_sparse_get_stats, whoever counts (the direct Q4_K kernel only at batch 1)
                auto check_stats_of = [&](const char * mode, const bool counted) {
                    runs++;
                    const std::string label = std::string(what) + " " + mode;
                    failures += check_stats(stats_d, stream, counted, n, active.size(), label.c_str());
                };

                // dense
                y_d.poison();
                zz_gemv_launch_ex(type, w_d.ptr, n, m, x_d.ptr, x_stride, T, nullptr, ZZ_GEMV_DENSE, y_d.ptr, y_stride, cfg, stream);
                check("dense", ref_dense);

                // sparse through the index list made on the device
                idx_d.poison();
                CUDA_CHECK(cudaMemset(stats_d.ptr, 0, 3*sizeof(unsigned long long)));
                sparse_idx_list_launch(x_d.ptr, n, T, x_stride, thr, idx_d.ptr, scratch_d.ptr, stream, stats_d.ptr);
                check_stats_of("list stats", true);
                y_d.poison();
                zz_gemv_launch_ex(type, w_d.ptr, n, m, x_d.ptr, x_stride, T, idx_d.ptr, ZZ_GEMV_IDX, y_d.ptr, y_stride, cfg, stream);
                check("idx", ref_sparse);
                if (ticket == 1) {
                    // again: the counters were reset, and the block order of the final sum is fixed (bitwise equal)
                    const std::vector<float> y_first = y;
                    y_d.poison();
                    zz_gemv_launch_ex(type, w_d.ptr, n, m, x_d.ptr, x_stride, T, idx_d.ptr, ZZ_GEMV_IDX, y_d.ptr, y_stride, cfg, stream);
                    check("idx again", ref_sparse);
                    for (int t = 0; t < T; ++t) {
                        if (memcmp(&y[t*y_stride], &y_first[t*y_stride], m*sizeof(float)) != 0) {
                            printf("  FAIL %s: second ticket run differs from the first (token %d)\n", what, t);
                            failures++;
                            break;
                        }
                    }
                }

                // sparse with the index collection inside the GEMV (no list)
                y_d.poison();
                CUDA_CHECK(cudaMemset(stats_d.ptr, 0, 3*sizeof(unsigned long long)));
                if (zz_gemv_launch_fused(type, w_d.ptr, n, m, x_d.ptr, x_stride, T, thr, y_d.ptr, y_stride, cfg, true, stream,
                            stats_d.ptr)) {
                    check("fused", ref_sparse);
                    check_stats_of("fused stats", zz_gemv_fused_counts(type, T));
                }

                // ablation: every column visited, zeros skipped in place (not in the G8 layout)
                if (is_g8(type)) {
                    continue;
                }
                y_d.poison();
                zz_gemv_launch_ex(type, w_d.ptr, n, m, xz_d.ptr, x_stride, T, nullptr, ZZ_GEMV_SKIP, y_d.ptr, y_stride, cfg, stream);
                check("skip", ref_sparse);
            }
            zz_gemv_set_ticket(-1);
        }
        printf("gemv %-5s: %d cases, worst relative error: ticket %.2e, first %.2e, early %.2e, atomic %.2e\n",
                zz_type_name(type), cases, worst[1], worst[2], worst[3], worst[0]);
    }
    // every ticket launch must leave its block-row counters at zero
    const int64_t nz = zz_gemv_ticket_nonzero(stream);
    if (nz != 0) {
        printf("  FAIL gemv: %lld ticket counters not zero after the runs (-1: the ticket reduction never ran)\n", (long long) nz);
        failures++;
    }
    CUDA_CHECK(cudaStreamDestroy(stream));
    printf("gemv: %d runs, %d failures\n", runs, failures);
    return failures;
}

// nseg Q4_K weights of width n (1..max_rb block-rows each) with padded output strides, their device copies and the
// launch config (random n1 / n2 / cluster on odd cases c)
struct test_group_bufs {
    std::vector<zz_weights>                        w;
    std::vector<int64_t>                           y_stride;
    std::vector<std::unique_ptr<dev_buf<uint8_t>>> w_d;
    std::vector<std::unique_ptr<dev_buf<float>>>   y_d;
    std::vector<zz_gemv_seg>                       seg;
    zz_gemv_config                                 cfg;

    ggml_type                                      type;

    test_group_bufs(const int nseg, const int64_t n, const int T, const int max_rb, const int c, const int device,
            test_rng & rng, const ggml_type type = GGML_TYPE_Q4_K) : w(nseg), y_stride(nseg), seg(nseg), type(type) {
        int64_t m_sum = 0;
        for (int s = 0; s < nseg; ++s) {
            make_weights(w[s], type, n, QK_K*rng.randint(1, max_rb), rng);
            y_stride[s] = w[s].m + (rng.randint(0, 3) == 0 ? rng.randint(1, 9) : 0);
            m_sum += w[s].m;
        }
        cfg = zz_gemv_get_config(device, type, n, m_sum, T);
        if (c % 2 == 1) {
            cfg.n1      = rng.randint(1, 12);
            cfg.n2      = rng.randint(1, 4);
            cfg.cluster = rng.randint(0, 1);
        }
        for (int s = 0; s < nseg; ++s) {
            w_d.emplace_back(new dev_buf<uint8_t>(w[s].q.size()));
            w_d[s]->upload(w[s].q.data(), w[s].q.size());
            y_d.emplace_back(new dev_buf<float>(T*y_stride[s]));
            seg[s] = { w_d[s]->ptr, w[s].m, y_d[s]->ptr, y_stride[s] };
        }
    }

    void poison() {
        for (auto & y : y_d) {
            y->poison();
        }
    }

    // every weight's output against its GEMV of x_ref over cols (what: the case, for a failure); the failures
    // (y0: each weight's start value of y, when the launch adds into it)
    int check(const std::string & what, const std::vector<float> & x_ref, const int64_t x_stride, const int T,
            const std::vector<int32_t> & cols, int & runs, double & worst,
            const std::vector<std::vector<float>> * y0 = nullptr) const {
        int failures = 0;
        for (size_t s = 0; s < w.size(); ++s) {
            std::vector<double> ref;
            ref_gemv(w[s], x_ref, x_stride, T, cols, ref);
            if (y0 != nullptr) {
                for (int t = 0; t < T; ++t) {
                    for (int64_t i = 0; i < w[s].m; ++i) {
                        ref[t*w[s].m + i] += (*y0)[s][t*y_stride[s] + i];
                    }
                }
            }
            std::vector<float> y(y_d[s]->n);
            y_d[s]->download(y.data(), y.size());
            const std::string ws = what + ", weight " + std::to_string(s) + "/" + std::to_string(w.size()) + " m=" +
                                   std::to_string(w[s].m);
            double rel = 0.0;
            runs++;
            failures += check_y(ws.c_str(), y, y_stride[s], ref, w[s].m, T, gemv_tol(type), &rel) ? 0 : 1;
            worst = std::max(worst, rel);
        }
        return failures;
    }
};

// grouped launches (zz_gemv_launch_group): 2-4 Q4_K weights (every fourth case Q4_0 or Q8_0 in the G8 layout) of one
// width reading one x, each against its own reference; every mode, the four cross-block reductions and clusters, padded
// output strides
static int test_group(test_rng & rng, const int cases) {
    int failures = 0;
    int runs     = 0;
    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreate(&stream));
    int device;
    CUDA_CHECK(cudaGetDevice(&device));
    const double sparsities[] = { 0.0, 0.01, 0.5, 0.99, 1.0 };
    double worst = 0.0;
    for (int c = 0; c < cases; ++c) {
        const ggml_type type = c % 4 == 3 ? g8_pick(c/8) : GGML_TYPE_Q4_K;
        const int     nseg = 2 + c % (ZZ_GROUP_MAX - 1);
        const int64_t n    = pick_n(rng);
        const int     T    = 1 + (c/3) % ZZ_GEMV_MAX_BATCH;
        const double  sp   = sparsities[c % 5];
        const float   thr  = 0.25f;
        const int64_t x_stride = n + (c % 3 == 0 ? rng.randint(1, 7) : 0);

        test_group_bufs gb(nseg, n, T, 5, c, device, rng, type);
        auto &                 seg = gb.seg;
        const zz_gemv_config & cfg = gb.cfg;
        std::vector<float>   x;
        std::vector<int32_t> active;
        make_x(x, active, n, T, x_stride, sp, thr, false, rng);
        std::vector<int32_t> all(n);
        for (int64_t j = 0; j < n; ++j) {
            all[j] = (int32_t) j;
        }

        dev_buf<float>   x_d(x.size());
        dev_buf<int32_t> idx_d(n + 1);
        dev_buf<int32_t> scratch_d(std::max<int64_t>(1, sparse_idx_list_scratch_size(n, T)));
        dev_buf<unsigned long long> stats_d(3);
        x_d.upload(x.data(), x.size());
        sparse_idx_list_launch(x_d.ptr, n, T, x_stride, thr, idx_d.ptr, scratch_d.ptr, stream);

        for (const int ticket : { 1, 2, 3, 0 }) {
            zz_gemv_set_ticket(ticket);
            for (const zz_gemv_mode mode : { ZZ_GEMV_DENSE, ZZ_GEMV_IDX, ZZ_GEMV_FUSED }) {
                gb.poison();
                CUDA_CHECK(cudaMemset(stats_d.ptr, 0, 3*sizeof(unsigned long long)));
                const bool ran = zz_gemv_launch_group(type, seg.data(), nseg, n, x_d.ptr, x_stride, T,
                        mode == ZZ_GEMV_IDX ? idx_d.ptr : nullptr, mode, thr, cfg, stream, nullptr, stats_d.ptr);
                {
                    // FUSED counts its set once over all the weights' block-rows; the others leave the counters
                    char label[96];
                    snprintf(label, sizeof(label), "group n=%lld T=%d nseg=%d mode %d", (long long) n, T, nseg, (int) mode);
                    runs++;
                    failures += check_stats(stats_d, stream, mode == ZZ_GEMV_FUSED && zz_gemv_fused_counts(type, T), n,
                            active.size(), label);
                }
                if (!ran) {
                    printf("  FAIL group: Q4_K launch declined (direct kernel off?)\n");
                    failures++;
                    continue;
                }
                char what[256];
                snprintf(what, sizeof(what), "group n=%lld T=%d sp=%.2f n1=%d n2=%d cl=%d %s mode %d", (long long) n, T,
                        sp, cfg.n1, cfg.n2, cfg.cluster, red_name(ticket), (int) mode);
                failures += gb.check(what, x, x_stride, T, mode == ZZ_GEMV_DENSE ? all : active, runs, worst);
            }
        }
        zz_gemv_set_ticket(-1);
    }
    // other types have no grouped kernel: declined, nothing launched
    zz_gemv_seg none = { nullptr, 32, nullptr, 32 };
    if (zz_gemv_launch_group(GGML_TYPE_Q8_0, &none, 1, 32, nullptr, 32, 1, nullptr, ZZ_GEMV_DENSE, 0.0f,
                zz_gemv_config{ 1, 1, 0 }, stream)) {
        printf("  FAIL group: Q8_0 was not declined\n");
        failures++;
    }
    const int64_t nz = zz_gemv_ticket_nonzero(stream);
    if (nz > 0) {
        printf("  FAIL group: %lld ticket counters not zero after the runs\n", (long long) nz);
        failures++;
    }
    CUDA_CHECK(cudaStreamDestroy(stream));
    printf("group: %d runs, %d failures, worst relative error %.2e\n", runs, failures, worst);
    return failures;
}

// the threshold that drops the share sp of the columns of xn [T][x_stride] by their largest |value| over the tokens,
// halfway between two magnitudes far enough apart that rounding cannot move a column across it; active: the columns
// kept (|xn| >= thr for some token)
static float pick_thr(const std::vector<float> & xn, const int64_t x_stride, const int64_t n, const int T,
        const double sp, std::vector<int32_t> & active) {
    std::vector<double> mags;
    for (int64_t j = 0; j < n; ++j) {
        double mx = 0.0;
        for (int t = 0; t < T; ++t) {
            mx = std::max(mx, (double) fabsf(xn[t*x_stride + j]));
        }
        mags.push_back(mx);
    }
    std::sort(mags.begin(), mags.end());
    float thr = 0.0f;
    if (sp >= 1.0) {
        thr = (float) (2.0*mags.back() + 1.0);
    } else if (sp > 0.0) {
        int64_t k = std::max<int64_t>(1, (int64_t) (sp*n));
        while (k < n && mags[k] - mags[k - 1] < 1e-4*mags[k]) {
            ++k;
        }
        thr = k < n ? (float) (0.5*(mags[k - 1] + mags[k])) : (float) (2.0*mags.back() + 1.0);
    }
    active.clear();
    for (int64_t j = 0; j < n; ++j) {
        bool act = false;
        for (int t = 0; t < T; ++t) {
            act = act || fabsf(xn[t*x_stride + j]) >= thr;
        }
        if (act) {
            active.push_back((int32_t) j);
        }
    }
    return thr;
}

// launches with an RMS norm folded into the read of x (zz_gemv_norm): 1-4 Q4_K weights (every third case Q4_0 or
// Q8_0 in the G8 layout, at batch 1), DENSE and FUSED, the four reductions, random configs, batch 1-8, x aligned or not, against
// the GEMV of the norm computed here (the threshold from pick_thr)
static int test_norm(test_rng & rng, const int cases) {
    int failures = 0;
    int runs     = 0;
    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreate(&stream));
    int device;
    CUDA_CHECK(cudaGetDevice(&device));
    const double sparsities[] = { 0.0, 0.3, 0.5, 0.9, 1.0 };
    double worst = 0.0;
    for (int c = 0; c < cases; ++c) {
        const ggml_type type   = c % 3 == 2 ? g8_pick(c/6) : GGML_TYPE_Q4_K;
        const int     nseg     = 1 + c % ZZ_GROUP_MAX;
        const int64_t n        = pick_n(rng);
        const int     T        = is_g8(type) ? 1 + (c/3) % ZZ_G8_IN_MAX_T : 1 + (c/2) % ZZ_GEMV_MAX_BATCH;
        const double  sp       = sparsities[c % 5];
        const float   eps      = c % 2 ? 1e-5f : 1e-6f;
        const int     x_off    = c % 4 == 3 ? 1 : 0; // x not 16-byte aligned: the kernel's scalar sum
        const int64_t x_stride = n + (c % 3 == 0 ? rng.randint(1, 7) : 0);

        // x, the norm weight (either sign), and the normed x as norm.cu + binbcast.cu compute it (float)
        std::vector<float> x(T*x_stride + x_off, 12345.0f), g(n), xn(T*x_stride, 0.0f);
        for (int64_t j = 0; j < n; ++j) {
            g[j] = (float) ((rng.uniform() < 0.5 ? -1.0 : 1.0)*(0.5 + 1.5*rng.uniform()));
        }
        for (int t = 0; t < T; ++t) {
            double ss = 0.0;
            for (int64_t j = 0; j < n; ++j) {
                const float v = (float) (rng.normal()*(1.0 + 3.0*t));
                x[x_off + t*x_stride + j] = v;
                ss += (double) v*v;
            }
            const float sc = (float) (1.0/sqrt(ss/n + eps));
            for (int64_t j = 0; j < n; ++j) {
                xn[t*x_stride + j] = (sc*x[x_off + t*x_stride + j])*g[j];
            }
        }
        std::vector<int32_t> active, all(n);
        const float thr = pick_thr(xn, x_stride, n, T, sp, active);
        for (int64_t j = 0; j < n; ++j) {
            all[j] = (int32_t) j;
        }

        test_group_bufs gb(nseg, n, T, 4, c, device, rng, type);
        auto &                 seg = gb.seg;
        const zz_gemv_config & cfg = gb.cfg;
        dev_buf<float> x_d(x.size());
        dev_buf<float> g_d(n);
        dev_buf<unsigned long long> stats_d(3);
        x_d.upload(x.data(), x.size());
        g_d.upload(g.data(), n);
        const zz_gemv_norm norm = { g_d.ptr, eps };

        for (const int ticket : { 1, 2, 3, 0 }) {
            zz_gemv_set_ticket(ticket);
            for (const zz_gemv_mode mode : { ZZ_GEMV_DENSE, ZZ_GEMV_FUSED }) {
                gb.poison();
                CUDA_CHECK(cudaMemset(stats_d.ptr, 0, 3*sizeof(unsigned long long)));
                const bool ran = zz_gemv_launch_group(type, seg.data(), nseg, n, x_d.ptr + x_off, x_stride, T,
                        nullptr, mode, thr, cfg, stream, &norm, stats_d.ptr);
                if (mode == ZZ_GEMV_FUSED && zz_gemv_fused_counts(type, T)) {
                    // counted on the normed x, as the LIST op over the norm's output counts on the CPU
                    char label[96];
                    snprintf(label, sizeof(label), "norm n=%lld T=%d nseg=%d", (long long) n, T, nseg);
                    runs++;
                    failures += check_stats(stats_d, stream, true, n, active.size(), label);
                } else {
                    CUDA_CHECK(cudaStreamSynchronize(stream));
                }
                if (!ran) {
                    printf("  FAIL norm: launch declined (direct kernel off?)\n");
                    failures++;
                    continue;
                }
                char what[256];
                snprintf(what, sizeof(what), "norm n=%lld T=%d sp=%.2f (%zu active) off=%d n1=%d n2=%d cl=%d %s mode %d",
                        (long long) n, T, sp, active.size(), x_off, cfg.n1, cfg.n2, cfg.cluster, red_name(ticket),
                        (int) mode);
                failures += gb.check(what, xn, x_stride, T, mode == ZZ_GEMV_DENSE ? all : active, runs, worst);
            }
        }
        zz_gemv_set_ticket(-1);
        // outputs that accumulate: y holds a start value (y_ready, atomics only), and the launch's upkeep copies x as
        // read to x_copy and zeroes a buffer (zz_gemv_norm)
        for (const zz_gemv_mode mode : { ZZ_GEMV_DENSE, ZZ_GEMV_FUSED }) {
            std::vector<std::vector<float>> y0(nseg);
            std::vector<zz_gemv_seg> seg_r = seg;
            for (int s = 0; s < nseg; ++s) {
                y0[s].assign(gb.y_d[s]->n, NAN); // (padding stays NaN: check_y sees it untouched)
                for (int t = 0; t < T; ++t) {
                    for (int64_t i = 0; i < gb.w[s].m; ++i) {
                        y0[s][t*gb.y_stride[s] + i] = (float) rng.normal();
                    }
                }
                gb.y_d[s]->upload(y0[s].data(), y0[s].size());
                seg_r[s].y_ready = 1;
            }
            const int64_t xc_stride = n + (c % 2 ? 3 : 0);
            const int64_t clear_n   = c % 3 == 0 ? 0 : rng.randint(1, 70000);
            const bool     two       = c % 2 == 0; // x also copied to a second buffer (x_copy2)
            dev_buf<float> xc_d(T*xc_stride), xc2_d(T*xc_stride), clr_d(std::max<int64_t>(clear_n, 1));
            xc_d.poison();
            xc2_d.poison();
            std::vector<float> junk(clr_d.n, 7.0f);
            clr_d.upload(junk.data(), junk.size());
            zz_gemv_norm norm_r = norm;
            norm_r.x_copy        = xc_d.ptr;
            norm_r.x_copy_stride = xc_stride;
            norm_r.x_copy2       = two ? xc2_d.ptr : nullptr;
            norm_r.clear         = clear_n > 0 ? clr_d.ptr : nullptr;
            norm_r.clear_n       = clear_n;
            const bool ran = zz_gemv_launch_group(type, seg_r.data(), nseg, n, x_d.ptr + x_off, x_stride, T, nullptr,
                    mode, thr, cfg, stream, &norm_r);
            CUDA_CHECK(cudaStreamSynchronize(stream));
            char what[256];
            snprintf(what, sizeof(what), "norm, y ready + upkeep n=%lld T=%d sp=%.2f n1=%d n2=%d cl=%d mode %d clear %lld%s",
                    (long long) n, T, sp, cfg.n1, cfg.n2, cfg.cluster, (int) mode, (long long) clear_n,
                    two ? " two copies" : "");
            if (!ran) {
                printf("  FAIL %s: launch declined\n", what);
                failures++;
                continue;
            }
            failures += gb.check(what, xn, x_stride, T, mode == ZZ_GEMV_DENSE ? all : active, runs, worst, &y0);
            std::vector<float> xc(xc_d.n), xc2(xc2_d.n), clr(clr_d.n);
            xc_d.download(xc.data(), xc.size());
            xc2_d.download(xc2.data(), xc2.size());
            clr_d.download(clr.data(), clr.size());
            int bad = 0;
            for (int t = 0; t < T; ++t) {
                for (int64_t j = 0; j < xc_stride; ++j) {
                    const float v  = xc[t*xc_stride + j];
                    const float v2 = xc2[t*xc_stride + j];
                    bad += j < n ? !(v == x[x_off + t*x_stride + j]) : !std::isnan(v); // (bit for bit; padding untouched)
                    bad += two && j < n ? !(v2 == v) : !std::isnan(v2);                // (untouched unless asked)
                }
            }
            for (int64_t e = 0; e < clear_n; ++e) {
                bad += clr[e] != 0.0f;
            }
            if (clear_n == 0) {
                bad += clr[0] != 7.0f; // (clear_n 0: nothing zeroed)
            }
            if (bad > 0) {
                printf("  FAIL %s: %d wrong elements of x_copy / clear\n", what, bad);
                failures++;
            }
        }
        // an index list was found from the normed x elsewhere: the norm cannot be taken in
        dev_buf<int32_t> idx_d(n + 1);
        if (zz_gemv_launch_group(type, seg.data(), nseg, n, x_d.ptr + x_off, x_stride, T, idx_d.ptr, ZZ_GEMV_IDX, thr,
                    cfg, stream, &norm)) {
            printf("  FAIL norm: IDX with a norm was not declined\n");
            failures++;
        }
        // G8 has no NORM instances past ZZ_G8_IN_MAX_T
        if (is_g8(type) && ZZ_G8_IN_MAX_T < ZZ_GEMV_MAX_BATCH &&
                zz_gemv_launch_group(type, seg.data(), nseg, n, x_d.ptr + x_off, x_stride, ZZ_G8_IN_MAX_T + 1, nullptr,
                    ZZ_GEMV_DENSE, thr, cfg, stream, &norm)) {
            printf("  FAIL norm: G8 at batch %d with a norm was not declined\n", ZZ_G8_IN_MAX_T + 1);
            failures++;
        }
    }
    CUDA_CHECK(cudaStreamDestroy(stream));
    printf("norm: %d runs, %d failures, worst relative error %.2e\n", runs, failures, worst);
    return failures;
}

// launches with a SwiGLU fused into the read of x (zz_gemv_launch_glu, as decode's down launch): one Q4_K weight (every
// third case Q4_0 or Q8_0 in the G8 layout, at batch 1), DENSE and FUSED, the four reductions, random configs, batch 1-8,
// gate and up split or halves of one row, with a residual (bias) or a start value (y_ready) on some cases, against
// the GEMV of silu(gate)*up computed here (the threshold from pick_thr)
static int test_glu(test_rng & rng, const int cases) {
    int failures = 0;
    int runs     = 0;
    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreate(&stream));
    int device;
    CUDA_CHECK(cudaGetDevice(&device));
    const double sparsities[] = { 0.0, 0.3, 0.5, 0.9, 1.0 };
    double worst = 0.0;
    for (int c = 0; c < cases; ++c) {
        const ggml_type type   = c % 3 == 2 ? g8_pick(c/6) : GGML_TYPE_Q4_K;
        const int64_t   n      = pick_n(rng);
        const int       T      = is_g8(type) ? 1 + (c/3) % ZZ_G8_IN_MAX_T : 1 + (c/2) % ZZ_GEMV_MAX_BATCH;
        const double    sp     = sparsities[c % 5];
        const bool      halves = c % 2 == 1;             // gate | up in one row of 2n (+ padding), as ggml_swiglu
        const int       extra  = (c/4) % 3;               // 0 none, 1 bias, 2 y_ready
        const int64_t   stride = (halves ? 2*n : n) + (c % 3 == 0 ? rng.randint(1, 7) : 0);

        std::vector<float> gu(T*stride, 12345.0f), up_split(T*stride, 12345.0f), xg(T*n, 0.0f);
        for (int t = 0; t < T; ++t) {
            for (int64_t j = 0; j < n; ++j) {
                const float g = (float) (rng.normal()*(1.0 + t));
                const float u = (float) rng.normal();
                gu[t*stride + j] = g;
                (halves ? gu[t*stride + n + j] : up_split[t*stride + j]) = u;
                xg[t*n + j] = g/(1.0f + expf(-g)) * u;
            }
        }
        std::vector<int32_t> active, all(n);
        const float thr = pick_thr(xg, n, n, T, sp, active);
        for (int64_t j = 0; j < n; ++j) {
            all[j] = (int32_t) j;
        }

        test_group_bufs gb(1, n, T, 4, c, device, rng, type);
        const int64_t y_stride = gb.y_stride[0];
        dev_buf<float> gu_d(gu.size()), up_d(up_split.size()), b_d(T*y_stride);
        gu_d.upload(gu.data(), gu.size());
        up_d.upload(up_split.data(), up_split.size());
        const float * up = halves ? gu_d.ptr + n : up_d.ptr;

        for (const int ticket : { 1, 2, 3, 0 }) {
            zz_gemv_set_ticket(ticket);
            for (const zz_gemv_mode mode : { ZZ_GEMV_DENSE, ZZ_GEMV_FUSED }) {
                // (y_ready: atomics; the start value sits in y)
                if (extra == 2 && ticket != 0) {
                    continue;
                }
                std::vector<std::vector<float>> y0(1, std::vector<float>(T*y_stride, NAN));
                zz_gemv_seg seg = gb.seg[0];
                gb.poison();
                if (extra > 0) {
                    for (int t = 0; t < T; ++t) {
                        for (int64_t i = 0; i < gb.w[0].m; ++i) {
                            y0[0][t*y_stride + i] = (float) rng.normal();
                        }
                    }
                    if (extra == 1) {
                        b_d.upload(y0[0].data(), y0[0].size());
                        seg.bias        = b_d.ptr;
                        seg.bias_stride = y_stride;
                    } else {
                        gb.y_d[0]->upload(y0[0].data(), y0[0].size()); // (padding stays NaN)
                        seg.y_ready = 1;
                    }
                }
                const bool ran = zz_gemv_launch_glu(type, seg, n, gu_d.ptr, stride, up, stride, T, mode, thr, gb.cfg,
                        stream);
                CUDA_CHECK(cudaStreamSynchronize(stream));
                char what[256];
                snprintf(what, sizeof(what), "glu %s n=%lld T=%d sp=%.2f (%zu active) %s n1=%d n2=%d cl=%d %s mode %d%s",
                        zz_type_name(type), (long long) n, T, sp, active.size(), halves ? "halves" : "split", gb.cfg.n1,
                        gb.cfg.n2, gb.cfg.cluster, red_name(ticket), (int) mode,
                        extra == 1 ? " bias" : extra == 2 ? " y ready" : "");
                if (!ran) {
                    printf("  FAIL %s: launch declined (direct kernel off?)\n", what);
                    failures++;
                    continue;
                }
                failures += gb.check(what, xg, n, T, mode == ZZ_GEMV_DENSE ? all : active, runs, worst,
                        extra > 0 ? &y0 : nullptr);
            }
        }
        zz_gemv_set_ticket(-1);
        // G8 has no GLU instances past ZZ_G8_IN_MAX_T; IDX takes no SwiGLU
        if ((is_g8(type) && ZZ_G8_IN_MAX_T < ZZ_GEMV_MAX_BATCH &&
                    zz_gemv_launch_glu(type, gb.seg[0], n, gu_d.ptr, stride, up, stride, ZZ_G8_IN_MAX_T + 1,
                        ZZ_GEMV_DENSE, thr, gb.cfg, stream)) ||
                zz_gemv_launch_glu(type, gb.seg[0], n, gu_d.ptr, stride, up, stride, T, ZZ_GEMV_IDX, thr, gb.cfg,
                    stream)) {
            printf("  FAIL glu: a launch the kernels have no instance for was not declined\n");
            failures++;
        }
    }
    CUDA_CHECK(cudaStreamDestroy(stream));
    printf("glu: %d runs, %d failures, worst relative error %.2e\n", runs, failures, worst);
    return failures;
}

// memset nodes of a captured graph (the atomic reduction's zeroing of y)
static int graph_memset_nodes(cudaGraph_t graph) {
    size_t n = 0;
    CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &n));
    std::vector<cudaGraphNode_t> nodes(n);
    CUDA_CHECK(cudaGraphGetNodes(graph, nodes.data(), &n));
    int count = 0;
    for (size_t i = 0; i < n; ++i) {
        cudaGraphNodeType t;
        CUDA_CHECK(cudaGraphNodeGetType(nodes[i], &t));
        count += t == cudaGraphNodeTypeMemset;
    }
    return count;
}

// the idx list and the GEMV (atomic, cluster, ticket and first reductions; IDX and FUSED) captured once and replayed on
// new inputs, as ggml-cuda does at batch 1: the ticket counters must be left at zero by every replay, and the
// graph must hold exactly one memset node (the atomic GEMV's). A capture on a stream that never ran a ticket
// GEMV eagerly cannot make its buffers and falls back to atomics (one memset node, same results).
static int test_graph(test_rng & rng) {
    int failures = 0;
    cudaStream_t stream;
    cudaStream_t fresh;
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    CUDA_CHECK(cudaStreamCreateWithFlags(&fresh, cudaStreamNonBlocking));
    zz_gemv_ticket_forget(fresh); // in case its handle is that of a destroyed stream that had buffers
    const ggml_type type = GGML_TYPE_Q4_K;
    const int64_t   n    = 5000;
    const int64_t   m    = 3*QK_K;
    const int       T    = 3;
    const float     thr  = 0.5f;

    zz_weights w;
    make_weights(w, type, n, m, rng);
    dev_buf<uint8_t> w_d(w.q.size());
    dev_buf<float>   x_d(T*n);
    dev_buf<int32_t> idx_d(n + 1);
    dev_buf<int32_t> scratch_d(std::max<int64_t>(1, sparse_idx_list_scratch_size(n, T)));
    dev_buf<float>   y_atomic(T*m);
    dev_buf<float>   y_cluster(T*m);
    dev_buf<float>   y_ticket(T*m);
    dev_buf<float>   y_ticket_fused(T*m);
    dev_buf<float>   y_first(T*m);
    dev_buf<float>   y_first_fused(T*m);
    dev_buf<float>   y_fallback(T*m);
    w_d.upload(w.q.data(), w.q.size());
    {
        std::vector<float> x0(T*n, 1.0f);
        x_d.upload(x0.data(), x0.size());
    }

    const zz_gemv_config cfg_atomic  = { 4, 2, 0 };
    const zz_gemv_config cfg_cluster = { 4, 2, 1 };
    const zz_gemv_config cfg_ticket  = { 16, 4, 0 };

    // eager run first (as ggml-cuda's graph warm-up): the ticket buffers of `stream` are made outside capture
    zz_gemv_set_ticket(1);
    zz_gemv_launch_ex(type, w_d.ptr, n, m, x_d.ptr, n, T, nullptr, ZZ_GEMV_DENSE, y_ticket.ptr, m, cfg_ticket, stream);
    CUDA_CHECK(cudaStreamSynchronize(stream));

    cudaGraph_t     graph;
    cudaGraphExec_t exec;
    CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
    sparse_idx_list_launch(x_d.ptr, n, T, n, thr, idx_d.ptr, scratch_d.ptr, stream);
    zz_gemv_set_ticket(0);
    zz_gemv_launch_ex(type, w_d.ptr, n, m, x_d.ptr, n, T, idx_d.ptr, ZZ_GEMV_IDX, y_atomic.ptr, m, cfg_atomic, stream);
    zz_gemv_set_ticket(1);
    zz_gemv_launch_ex(type, w_d.ptr, n, m, x_d.ptr, n, T, idx_d.ptr, ZZ_GEMV_IDX, y_cluster.ptr, m, cfg_cluster, stream);
    zz_gemv_launch_ex(type, w_d.ptr, n, m, x_d.ptr, n, T, idx_d.ptr, ZZ_GEMV_IDX, y_ticket.ptr, m, cfg_ticket, stream);
    const bool fused = zz_gemv_launch_fused(type, w_d.ptr, n, m, x_d.ptr, n, T, thr, y_ticket_fused.ptr, m, cfg_ticket, true, stream);
    zz_gemv_set_ticket(2);
    zz_gemv_launch_ex(type, w_d.ptr, n, m, x_d.ptr, n, T, idx_d.ptr, ZZ_GEMV_IDX, y_first.ptr, m, cfg_ticket, stream);
    zz_gemv_launch_fused(type, w_d.ptr, n, m, x_d.ptr, n, T, thr, y_first_fused.ptr, m, cfg_ticket, true, stream);
    CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    if (graph_memset_nodes(graph) != 1) {
        printf("  FAIL graph: %d memset nodes, expected 1 (the atomic GEMV's only)\n", graph_memset_nodes(graph));
        failures++;
    }

    // a ticket GEMV captured on a stream without ticket buffers: falls back to atomics
    cudaGraph_t     graph_fb;
    cudaGraphExec_t exec_fb;
    CUDA_CHECK(cudaStreamBeginCapture(fresh, cudaStreamCaptureModeRelaxed));
    zz_gemv_launch_ex(type, w_d.ptr, n, m, x_d.ptr, n, T, idx_d.ptr, ZZ_GEMV_IDX, y_fallback.ptr, m, cfg_ticket, fresh);
    CUDA_CHECK(cudaStreamEndCapture(fresh, &graph_fb));
    CUDA_CHECK(cudaGraphInstantiate(&exec_fb, graph_fb, 0));
    if (graph_memset_nodes(graph_fb) != 1) {
        printf("  FAIL graph: fallback capture has %d memset nodes, expected 1\n", graph_memset_nodes(graph_fb));
        failures++;
    }
    zz_gemv_set_ticket(-1);

    const double sps[] = { 0.5, 0.9, 0.0, 1.0, 0.3, 0.5 };
    for (double sp : sps) {
        std::vector<float>   x;
        std::vector<int32_t> active;
        make_x(x, active, n, T, n, sp, thr, false, rng);
        x_d.upload(x.data(), x.size());
        y_atomic.poison();
        y_cluster.poison();
        y_ticket.poison();
        y_ticket_fused.poison();
        y_first.poison();
        y_first_fused.poison();
        y_fallback.poison();
        CUDA_CHECK(cudaGraphLaunch(exec, stream));
        CUDA_CHECK(cudaStreamSynchronize(stream));
        CUDA_CHECK(cudaGraphLaunch(exec_fb, fresh)); // reads the list the main graph made
        CUDA_CHECK(cudaStreamSynchronize(fresh));
        std::vector<double> ref;
        ref_gemv(w, x, n, T, active, ref);
        std::vector<float> y(T*m);
        struct { const char * what; const dev_buf<float> * buf; } outs[] = {
            { "graph replay atomic",       &y_atomic },
            { "graph replay cluster",      &y_cluster },
            { "graph replay ticket",       &y_ticket },
            { "graph replay ticket fused", fused ? &y_ticket_fused : nullptr },
            { "graph replay first",        &y_first },
            { "graph replay first fused",  fused ? &y_first_fused : nullptr },
            { "graph replay fallback",     &y_fallback },
        };
        for (const auto & o : outs) {
            if (o.buf == nullptr) {
                continue;
            }
            o.buf->download(y.data(), y.size());
            if (!check_y(o.what, y, m, ref, m, T, gemv_tol(type))) {
                failures++;
            }
        }
        const int64_t nz = zz_gemv_ticket_nonzero(stream);
        if (nz != 0) {
            printf("  FAIL graph replay sp=%.2f: %lld ticket counters not zero\n", sp, (long long) nz);
            failures++;
        }
    }
    CUDA_CHECK(cudaGraphExecDestroy(exec));
    CUDA_CHECK(cudaGraphDestroy(graph));
    CUDA_CHECK(cudaGraphExecDestroy(exec_fb));
    CUDA_CHECK(cudaGraphDestroy(graph_fb));
    CUDA_CHECK(cudaStreamDestroy(stream));
    CUDA_CHECK(cudaStreamDestroy(fresh));
    printf("graph replay (atomic, cluster, ticket and first idx/fused, fallback): %d failures\n", failures);
    return failures;
}

// ticket GEMVs back to back on one stream with no synchronization in between (so with PDL each may start while
// the previous one runs), different n1, batch and types sharing the stream's counters and workspace, eagerly
// and as a replayed graph; every output checked, counters zero at the end
static int test_ticket_chain(test_rng & rng) {
    int failures = 0;
    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    const ggml_type types[] = { GGML_TYPE_Q4_K, GGML_TYPE_Q8_0, GGML_TYPE_Q6_K };
    const int       n1s[]   = { 2, 3, 16, 32 };
    const float     thr     = 0.25f;
    const int       n_ops   = 24;

    struct op {
        zz_weights           w;
        int                  T;
        int                  mode; // 0 dense, 1 fused
        zz_gemv_config       cfg;
        std::vector<float>   x;
        std::vector<int32_t> active;
        std::vector<double>  ref;
    };
    std::vector<op> ops(n_ops);
    std::vector<std::unique_ptr<dev_buf<uint8_t>>> w_d;
    std::vector<std::unique_ptr<dev_buf<float>>>   x_d;
    std::vector<std::unique_ptr<dev_buf<float>>>   y_d;
    for (int i = 0; i < n_ops; ++i) {
        op & o = ops[i];
        const ggml_type type = types[i % 3];
        const int64_t   B    = zz_blck_size(type);
        const int64_t   m    = B*(B == QK_K ? rng.randint(1, 4) : rng.randint(1, 24));
        const int64_t   n    = rng.randint(1, 3000);
        o.T    = rng.randint(1, ZZ_GEMV_MAX_BATCH);
        o.mode = type == GGML_TYPE_Q4_K ? i % 2 : 0;
        o.cfg  = { n1s[rng.randint(0, 3)], 1 << rng.randint(0, 2), 0 };
        make_weights(o.w, type, n, m, rng);
        const double sp = o.mode ? 0.5 : 0.0;
        make_x(o.x, o.active, n, o.T, n, sp, thr, false, rng);
        if (o.mode) {
            ref_gemv(o.w, o.x, n, o.T, o.active, o.ref);
        } else {
            std::vector<int32_t> all(n);
            for (int64_t j = 0; j < n; ++j) {
                all[j] = (int32_t) j;
            }
            ref_gemv(o.w, o.x, n, o.T, all, o.ref);
        }
        w_d.emplace_back(new dev_buf<uint8_t>(o.w.q.size()));
        x_d.emplace_back(new dev_buf<float>(o.x.size()));
        y_d.emplace_back(new dev_buf<float>(o.T*m));
        w_d.back()->upload(o.w.q.data(), o.w.q.size());
        x_d.back()->upload(o.x.data(), o.x.size());
    }
    auto launch_all = [&](cudaStream_t s) {
        for (int i = 0; i < n_ops; ++i) {
            const op & o = ops[i];
            if (o.mode) {
                zz_gemv_launch_fused(o.w.type, w_d[i]->ptr, o.w.n, o.w.m, x_d[i]->ptr, o.w.n, o.T, thr, y_d[i]->ptr, o.w.m,
                        o.cfg, true, s); // (n <= 3000: the staged kernel's share always fits, so always launched)
            } else {
                zz_gemv_launch_ex(o.w.type, w_d[i]->ptr, o.w.n, o.w.m, x_d[i]->ptr, o.w.n, o.T, nullptr, ZZ_GEMV_DENSE,
                        y_d[i]->ptr, o.w.m, o.cfg, s);
            }
        }
    };
    auto check_all = [&](const char * what) {
        CUDA_CHECK(cudaStreamSynchronize(stream));
        for (int i = 0; i < n_ops; ++i) {
            const op & o = ops[i];
            std::vector<float> y(o.T*o.w.m);
            y_d[i]->download(y.data(), y.size());
            char s[256];
            snprintf(s, sizeof(s), "%s op %d %s m=%lld n=%lld T=%d n1=%d n2=%d %s", what, i, zz_type_name(o.w.type),
                    (long long) o.w.m, (long long) o.w.n, o.T, o.cfg.n1, o.cfg.n2, o.mode ? "fused" : "dense");
            if (!check_y(s, y, o.w.m, o.ref, o.w.m, o.T, gemv_tol(o.w.type))) {
                failures++;
            }
        }
        const int64_t nz = zz_gemv_ticket_nonzero(stream);
        if (nz != 0) {
            printf("  FAIL %s: %lld ticket counters not zero\n", what, (long long) nz);
            failures++;
        }
    };

    for (const int red : { 1, 2, 3 }) {
        zz_gemv_set_ticket(red);
        char what[64];
        for (auto & y : y_d) {
            y->poison();
        }
        launch_all(stream); // eager: also makes the stream's buffers, sized for the largest op
        snprintf(what, sizeof(what), "%s chain eager", red_name(red));
        check_all(what);

        cudaGraph_t     graph;
        cudaGraphExec_t exec;
        CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
        launch_all(stream);
        CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
        CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
        if (graph_memset_nodes(graph) != 0) {
            printf("  FAIL %s chain: %d memset nodes in the graph, expected none\n", red_name(red), graph_memset_nodes(graph));
            failures++;
        }
        for (int rep = 0; rep < 3; ++rep) {
            for (auto & y : y_d) {
                y->poison();
            }
            CUDA_CHECK(cudaGraphLaunch(exec, stream));
            snprintf(what, sizeof(what), "%s chain graph", red_name(red));
            check_all(what);
        }
        CUDA_CHECK(cudaGraphExecDestroy(exec));
        CUDA_CHECK(cudaGraphDestroy(graph));
    }
    zz_gemv_set_ticket(-1);
    CUDA_CHECK(cudaStreamDestroy(stream));
    printf("ticket / first / early chain (%d GEMVs back to back, eager and 3 graph replays each): %d failures\n", n_ops, failures);
    return failures;
}

static int test_naive(test_rng & rng) {
    int failures = 0;
    const int64_t n = 768;
    const int64_t m = 40;
    for (int T : { 1, 2, 4, 8 }) {
        // standard layout: m rows of n/256 blocks
        std::vector<float> src(m*n);
        for (float & v : src) {
            v = (float) rng.normal()*0.02f;
        }
        std::vector<uint8_t> q(m*(n/QK_K)*sizeof(block_q4_K));
        ggml_quantize_chunk(GGML_TYPE_Q4_K, src.data(), q.data(), 0, m, n, nullptr);
        std::vector<float> deq(m*n);
        ggml_get_type_traits(GGML_TYPE_Q4_K)->to_float(q.data(), deq.data(), m*n);

        std::vector<float> x(T*n);
        for (int64_t j = 0; j < n; ++j) {
            const bool act = rng.uniform() < 0.5;
            for (int t = 0; t < T; ++t) {
                x[t*n + j] = act ? (float) rng.normal() : 0.0f;
            }
        }
        std::vector<double> ref(T*m, 0.0);
        for (int t = 0; t < T; ++t) {
            for (int64_t i = 0; i < m; ++i) {
                for (int64_t j = 0; j < n; ++j) {
                    ref[t*m + i] += (double) x[t*n + j]*deq[i*n + j];
                }
            }
        }
        dev_buf<uint8_t> q_d(q.size());
        dev_buf<float>   x_d(x.size());
        dev_buf<float>   y_d(T*m);
        q_d.upload(q.data(), q.size());
        x_d.upload(x.data(), x.size());
        y_d.poison();
        naive_launch(q_d.ptr, n, m, x_d.ptr, n, T, y_d.ptr, m, 0);
        CUDA_CHECK(cudaDeviceSynchronize());
        std::vector<float> y(T*m);
        y_d.download(y.data(), y.size());
        if (!check_y("naive standard-layout q4_K", y, m, ref, m, T, 1e-4)) {
            failures++;
        }
    }
    printf("naive standard layout: %d failures\n", failures);
    return failures;
}

static int test_prefill(test_rng & rng) {
    int failures = 0;
    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreate(&stream));
#ifndef GGML_SPARSE_CUDA_NO_CUBLAS
    cublasHandle_t handle;
    CUBLAS_CHECK(cublasCreate(&handle));
    CUBLAS_CHECK(cublasSetStream(handle, stream));
#else
    cublasHandle_t handle = nullptr;
#endif
    for (ggml_type type : test_types) {
        const int64_t B = zz_blck_size(type);
        const int64_t m = B == QK_K ? 3*B : 40*B;
        const int64_t n = 1000 + rng.randint(0, 100);
        zz_weights w;
        make_weights(w, type, n, m, rng);
        dev_buf<uint8_t> w_d(w.q.size());
        w_d.upload(w.q.data(), w.q.size());

        // dequantized tile against to_float (f16 rounding only)
        {
            dev_buf<half> d_d(m*n);
            zz_dequant_f16_launch(type, w_d.ptr, n, 0, m, d_d.ptr, stream);
            CUDA_CHECK(cudaStreamSynchronize(stream));
            std::vector<half> d(m*n);
            d_d.download(d.data(), d.size());
            int64_t bad = 0;
            for (int64_t i = 0; i < m && bad < 5; ++i) {
                for (int64_t j = 0; j < n; ++j) {
                    const float want = w.deq[((i/w.B)*n + j)*w.B + i%w.B];
                    const float got  = __half2float(d[i*n + j]);
                    if (!(fabsf(got - want) <= 1e-3f*fabsf(want) + 1e-6f)) {
                        if (bad++ < 5) {
                            printf("  FAIL dequant %s W[%lld][%lld] = %g, want %g\n", zz_type_name(type), (long long) i, (long long) j, got, want);
                        }
                    }
                }
            }
            failures += bad > 0;
        }

        for (int T : { 9, 16, 40 }) {
            std::vector<float>   x;
            std::vector<int32_t> active;
            make_x(x, active, n, T, n, 0.3, 0.1f, true, rng);
            std::vector<int32_t> all(n);
            for (int64_t j = 0; j < n; ++j) {
                all[j] = (int32_t) j;
            }
            std::vector<double> ref;
            ref_gemv(w, x, n, T, all, ref);

            dev_buf<float> x_d(x.size());
            dev_buf<float> y_d(T*m);
            dev_buf<half>  tw(zz_prefill_tmp_w_size(type, n, m));
            dev_buf<half>  tx(zz_prefill_tmp_x_size(n, T));
            x_d.upload(x.data(), x.size());
            y_d.poison();
            zz_prefill_launch(type, w_d.ptr, n, m, x_d.ptr, n, T, y_d.ptr, m, tw.ptr, tx.ptr, handle, stream);
            CUDA_CHECK(cudaStreamSynchronize(stream));
            std::vector<float> y(T*m);
            y_d.download(y.data(), y.size());
            char what[128];
            snprintf(what, sizeof(what), "prefill %s m=%lld n=%lld T=%d", zz_type_name(type), (long long) m, (long long) n, T);
            double rel;
            if (!check_y(what, y, m, ref, m, T, 5e-3, &rel)) {
                failures++;
            }
        }
    }
#ifndef GGML_SPARSE_CUDA_NO_CUBLAS
    CUBLAS_CHECK(cublasDestroy(handle));
#endif
    CUDA_CHECK(cudaStreamDestroy(stream));
    printf("prefill: %d failures\n", failures);
    return failures;
}

// ---------------------------------------------------------------------------------------------------
// benchmark

// random bytes, then nd sane f16 scales from byte d_off0 on
static __global__ void bench_fill_blocks(char * w, const int64_t nblocks, const int bs, const int d_off0, const int nd,
        const uint32_t seed) {
    const int64_t ib = (int64_t) blockIdx.x*blockDim.x + threadIdx.x;
    if (ib >= nblocks) {
        return;
    }
    char *   blk = w + ib*bs;
    uint32_t s   = seed ^ (uint32_t) (ib*2654435761u);
    for (int i = 0; i < bs; ++i) {
        s = s*1664525u + 1013904223u;
        blk[i] = (char) (s >> 24);
    }
    const half d = __float2half(0.0005f + 0.001f*(float) ((s >> 8) & 0xFF)/255.0f);
    for (int k = 0; k < nd; ++k) {
        memcpy(blk + d_off0 + k*sizeof(d), &d, sizeof(d));
    }
}

static void bench_random_weights(void * w, const ggml_type type, const int64_t nblocks, const uint32_t seed) {
    int d0 = 0;
    int nd = 1;
    if (type == GGML_TYPE_Q4_K) {
        nd = 2; // d, dmin
    } else if (type == GGML_TYPE_Q6_K) {
        d0 = offsetof(block_q6_K, d);
    } else if (is_g8(type)) {
        nd = ZZ_G8_ROWS;
    }
    bench_fill_blocks<<<(nblocks + 255)/256, 256>>>((char *) w, nblocks, (int) zz_block_bytes(type), d0, nd, seed);
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaDeviceSynchronize());
}


static __global__ void bench_copy_kernel(const uint4 * __restrict__ a, uint4 * __restrict__ b, const size_t n) {
    for (size_t i = (size_t) blockIdx.x*blockDim.x + threadIdx.x; i < n; i += (size_t) gridDim.x*blockDim.x) {
        b[i] = a[i];
    }
}

static __global__ void bench_read_kernel(const uint4 * __restrict__ a, const size_t n, unsigned * out) {
    unsigned acc = 0;
    for (size_t i = (size_t) blockIdx.x*blockDim.x + threadIdx.x; i < n; i += (size_t) gridDim.x*blockDim.x) {
        const uint4 v = a[i];
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x9e3779b9u) { // never, in practice: keeps the loads
        *out = acc;
    }
}

// device-to-device copy of 1 GiB, read + write counted, GB/s: the better of cudaMemcpyAsync (a copy engine in a
// graph) and a grid-stride uint4 kernel on every SM; *read_gbs: a read-only kernel over the same GiB
static double bench_copy_gbs(cudaStream_t stream, double * memcpy_gbs = nullptr, double * read_gbs = nullptr) {
    const size_t   bytes = (size_t) 1 << 30;
    dev_buf<char>  a(bytes);
    dev_buf<char>  b(bytes);
    dev_buf<unsigned> sink(1);
    CUDA_CHECK(cudaMemset(a.ptr, 1, bytes));
    const double us = time_graph_us([&](cudaStream_t s, int) {
        CUDA_CHECK(cudaMemcpyAsync(b.ptr, a.ptr, bytes, cudaMemcpyDeviceToDevice, s));
    }, 5, stream);
    int dev = 0;
    int nsm = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, dev));
    const size_t n = bytes/sizeof(uint4);
    const double us_k = time_graph_us([&](cudaStream_t s, int) {
        bench_copy_kernel<<<8*nsm, 512, 0, s>>>((const uint4 *) a.ptr, (uint4 *) b.ptr, n);
    }, 5, stream);
    const double us_r = time_graph_us([&](cudaStream_t s, int) {
        bench_read_kernel<<<8*nsm, 512, 0, s>>>((const uint4 *) a.ptr, n, sink.ptr);
    }, 5, stream);
    if (memcpy_gbs) {
        *memcpy_gbs = 2.0*bytes/(us*1e3);
    }
    if (read_gbs) {
        *read_gbs = bytes/(us_r*1e3);
    }
    return 2.0*bytes/(std::min(us, us_k)*1e3); // read + write, GB/s
}

#ifdef ZZ_TEST_WITH_GGML_CUDA
// the CUDA backend of stock's timings (device 0), made once
static ggml_backend_t stock_backend() {
    static ggml_backend_t backend = ggml_backend_cuda_init(0);
    return backend;
}

// wall time of one compute of gf, us: 3 computes to warm up (ggml-cuda captures its CUDA graph), then 10 timed
static double stock_graph_us(ggml_backend_t backend, ggml_cgraph * gf) {
    for (int i = 0; i < 3; ++i) {
        ggml_backend_graph_compute(backend, gf);
    }
    ggml_backend_synchronize(backend);
    const int  iters = 10;
    const auto t0    = std::chrono::high_resolution_clock::now();
    for (int i = 0; i < iters; ++i) {
        ggml_backend_graph_compute(backend, gf);
    }
    ggml_backend_synchronize(backend);
    const auto t1 = std::chrono::high_resolution_clock::now();
    return std::chrono::duration<double, std::micro>(t1 - t0).count()/iters;
}

// stock ggml_mul_mat on the CUDA backend (standard layout, mmvq for small batches), per-op wall time of a
// graph of nbuf*k independent nodes over nbuf weight copies
static double bench_stock_us(const ggml_type type_in, const int64_t m, const int64_t n, const int T, const std::vector<float> & x_h) {
    const ggml_type type = base_type(type_in); // (the same weights in stock's layout)
    ggml_backend_t backend = stock_backend();
    const size_t wbytes = (size_t) m*n/zz_blck_size(type)*zz_block_bytes(type);
    const int    nbuf   = (int) std::max<size_t>(1, ((size_t) 256 << 20)/wbytes + 1);
    const int    nodes  = std::max(32, nbuf);

    ggml_init_params ip = { ggml_tensor_overhead()*(nbuf + nodes + 8) + ggml_graph_overhead_custom(nodes + 8, false), nullptr, true };
    ggml_context * ctx = ggml_init(ip);
    std::vector<ggml_tensor *> ws(nbuf);
    for (int i = 0; i < nbuf; ++i) {
        ws[i] = ggml_new_tensor_2d(ctx, type, n, m);
    }
    ggml_tensor * xb = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n, T);
    ggml_cgraph * gf = ggml_new_graph_custom(ctx, nodes + 8, false);
    for (int i = 0; i < nodes; ++i) {
        ggml_build_forward_expand(gf, ggml_mul_mat(ctx, ws[i % nbuf], xb));
    }
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, backend);
    for (int i = 0; i < nbuf; ++i) {
        bench_random_weights(ws[i]->data, type, (int64_t) m*n/zz_blck_size(type), 99u + i);
    }
    CUDA_CHECK(cudaDeviceSynchronize());
    ggml_backend_tensor_set(xb, x_h.data(), 0, n*T*sizeof(float));

    const double us = stock_graph_us(backend, gf);
    ggml_backend_buffer_free(buf);
    ggml_free(ctx);
    return us/nodes;
}
#endif // ZZ_TEST_WITH_GGML_CUDA

struct bench_opts {
    std::vector<ggml_type>              types   = { GGML_TYPE_Q4_K };
    std::vector<int>                    batches = { 1 };
    std::vector<std::pair<int64_t, int64_t>> shapes;
    std::string                         pattern = "random";
    bool                                l2_warm = false;
    std::string                         csv;
    std::string                         reduction = "both"; // cross-block reduction: ticket, first, early (decode's), atomic, or both (ticket and atomic)
};

// a benchmark's non-blocking stream, and the current device and its properties
static void bench_begin(cudaStream_t & stream, int & device, cudaDeviceProp & prop) {
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
}

// the device's L2 fetch granularity limit, bytes (cudaLimitMaxL2FetchGranularity)
static size_t bench_l2_fetch_bytes() {
    size_t gran = 0;
    CUDA_CHECK(cudaDeviceGetLimit(&gran, cudaLimitMaxL2FetchGranularity));
    return gran;
}

// a bench input: T tokens of n columns, exact zeros in a share sp of the columns (random, or the last ones with
// pattern "contiguous"), the same draw for every call with the same arguments; returns the active columns
static int64_t bench_make_x(const std::string & pattern, const double sp, const int64_t n, const int T, std::vector<float> & x) {
    test_rng rng(42);
    x.assign(T*n, 0.0f);
    int64_t count = 0;
    for (int64_t j = 0; j < n; ++j) {
        const bool act = pattern == "contiguous" ? j < (int64_t) llround((1.0 - sp)*n) : rng.uniform() >= sp;
        count += act;
        for (int t = 0; t < T; ++t) {
            x[t*n + j] = act ? (float) rng.normal() : 0.0f;
        }
    }
    return count;
}

static int run_bench(const bench_opts & o) {
    cudaStream_t   stream;
    int            device;
    cudaDeviceProp prop;
    bench_begin(stream, device, prop);

    double memcpy_gbs = 0.0;
    double read_gbs   = 0.0;
    const double copy_gbs = bench_copy_gbs(stream, &memcpy_gbs, &read_gbs);
    printf("device %s, %d SMs, L2 %d MiB; device-to-device copy %.0f GB/s (read + write; cudaMemcpy %.0f, copy kernel "
            "the better), read-only kernel %.0f GB/s; L2 fetch granularity limit %zu bytes\n", prop.name,
            prop.multiProcessorCount, prop.l2CacheSize >> 20, copy_gbs, memcpy_gbs, read_gbs, bench_l2_fetch_bytes());
    printf("weights %s; columns %s; times are medians per op inside a CUDA graph\n",
            o.l2_warm ? "re-read from L2 (one copy)" : "rotated over copies totalling > 256 MiB (from DRAM)", o.pattern.c_str());
    const bool both = o.reduction == "both";
    const int red = o.reduction == "atomic" ? 0 : o.reduction == "first" ? 2 : o.reduction == "early" ? 3 : 1;
    zz_gemv_set_ticket(red);
    printf("cross-block reduction: %s%s\n", red == 0 ? "memset + atomics" : red_name(red),
            both ? "; the 'atomic' columns at the end: memset + atomics (LLAMA_SPARSE_CUDA_TICKET=0)" : "");
    printf("%-5s %5s %5s %2s %4s | %8s %8s %8s %8s %8s %8s %8s | %7s %6s | %s%s\n", "type", "m", "n", "T", "sp%",
            "dense", "idx", "idx+list", "fused", "skip", "naive", "list", "GB/s", "%copy", "n1 n2 cl",
            both ? " | atomic: dense idx fused" : "");

    FILE * csv = o.csv.empty() ? nullptr : fopen(o.csv.c_str(), "w");
    if (csv) {
        fprintf(csv, "type,m,n,batch,sparsity,dense_us,idx_us,idx_list_us,fused_us,skip_us,naive_us,list_us,stock_us,idx_gbs,copy_gbs,n1,n2,cluster,reduction,dense_atomic_us,idx_atomic_us,fused_atomic_us\n");
    }

    const double sparsities[] = { 0.0, 0.25, 0.40, 0.50, 0.65, 0.80 };
    for (ggml_type type : o.types) {
        for (const auto & shape : o.shapes) {
            const int64_t m = shape.first;
            const int64_t n = shape.second;
            const int64_t B = zz_blck_size(type);
            if (m % B != 0) {
                continue;
            }
            const int64_t nblocks = m/B*n;
            const size_t  wbytes  = nblocks*zz_block_bytes(type);
            const int     nbuf    = o.l2_warm ? 1 : (int) std::max<size_t>(2, ((size_t) 256 << 20)/wbytes + 1);
            std::vector<void *> ws(nbuf);
            for (int i = 0; i < nbuf; ++i) {
                CUDA_CHECK(cudaMalloc(&ws[i], wbytes));
                bench_random_weights(ws[i], type, nblocks, 1234u + i);
            }
            const bool naive_ok = type == GGML_TYPE_Q4_K && n % QK_K == 0;

            for (int T : o.batches) {
                const zz_gemv_config cfg = zz_gemv_get_config(device, type, n, m, T);
                dev_buf<float>   x_d(T*n);
                dev_buf<int32_t> idx_d(n + 1);
                dev_buf<int32_t> scratch_d(std::max<int64_t>(1, sparse_idx_list_scratch_size(n, T)));
                dev_buf<float>   y_d(T*m);
                const int reps = std::max(20, 2*nbuf);

                double dense_us    = -1.0;
                double dense_at_us = -1.0; // with memset + atomics
                for (double sp : sparsities) {
                    std::vector<float> x;
                    const int64_t count = bench_make_x(o.pattern, sp, n, T, x);
                    x_d.upload(x.data(), x.size());
                    const float thr = 1e-30f;
                    sparse_idx_list_launch(x_d.ptr, n, T, n, thr, idx_d.ptr, scratch_d.ptr, stream);

                    if (sp == 0.0) {
                        dense_us = time_graph_us([&](cudaStream_t s, int i) {
                            zz_gemv_launch_ex(type, ws[i % nbuf], n, m, x_d.ptr, n, T, nullptr, ZZ_GEMV_DENSE, y_d.ptr, m, cfg, s);
                        }, reps, stream);
                    }
                    const double idx_us = time_graph_us([&](cudaStream_t s, int i) {
                        zz_gemv_launch_ex(type, ws[i % nbuf], n, m, x_d.ptr, n, T, idx_d.ptr, ZZ_GEMV_IDX, y_d.ptr, m, cfg, s);
                    }, reps, stream);
                    const double list_us = time_graph_us([&](cudaStream_t s, int) {
                        sparse_idx_list_launch(x_d.ptr, n, T, n, thr, idx_d.ptr, scratch_d.ptr, s);
                    }, reps, stream);
                    const double idx_list_us = time_graph_us([&](cudaStream_t s, int i) {
                        sparse_idx_list_launch(x_d.ptr, n, T, n, thr, idx_d.ptr, scratch_d.ptr, s);
                        zz_gemv_launch_ex(type, ws[i % nbuf], n, m, x_d.ptr, n, T, idx_d.ptr, ZZ_GEMV_IDX, y_d.ptr, m, cfg, s);
                    }, reps, stream);
                    double fused_us = -1.0;
                    if (zz_gemv_launch_fused(type, ws[0], n, m, x_d.ptr, n, T, thr, y_d.ptr, m, cfg, true, stream)) {
                        fused_us = time_graph_us([&](cudaStream_t s, int i) {
                            zz_gemv_launch_fused(type, ws[i % nbuf], n, m, x_d.ptr, n, T, thr, y_d.ptr, m, cfg, true, s);
                        }, reps, stream);
                    }
                    const double skip_us = is_g8(type) ? -1.0 : time_graph_us([&](cudaStream_t s, int i) {
                        zz_gemv_launch_ex(type, ws[i % nbuf], n, m, x_d.ptr, n, T, nullptr, ZZ_GEMV_SKIP, y_d.ptr, m, cfg, s);
                    }, reps, stream);
                    double naive_us = -1.0;
                    if (naive_ok && (T == 1 || T == 2 || T == 4 || T == 8)) {
                        naive_us = time_graph_us([&](cudaStream_t s, int i) {
                            naive_launch(ws[i % nbuf], n, m, x_d.ptr, n, T, y_d.ptr, m, s);
                        }, reps, stream);
                    }
                    // the same with the other reduction (memset node + atomics), for a side-by-side comparison
                    double idx_at_us   = -1.0;
                    double fused_at_us = -1.0;
                    if (both) {
                        zz_gemv_set_ticket(0);
                        if (sp == 0.0) {
                            dense_at_us = time_graph_us([&](cudaStream_t s, int i) {
                                zz_gemv_launch_ex(type, ws[i % nbuf], n, m, x_d.ptr, n, T, nullptr, ZZ_GEMV_DENSE, y_d.ptr, m, cfg, s);
                            }, reps, stream);
                        }
                        idx_at_us = time_graph_us([&](cudaStream_t s, int i) {
                            zz_gemv_launch_ex(type, ws[i % nbuf], n, m, x_d.ptr, n, T, idx_d.ptr, ZZ_GEMV_IDX, y_d.ptr, m, cfg, s);
                        }, reps, stream);
                        if (fused_us > 0.0) {
                            fused_at_us = time_graph_us([&](cudaStream_t s, int i) {
                                zz_gemv_launch_fused(type, ws[i % nbuf], n, m, x_d.ptr, n, T, thr, y_d.ptr, m, cfg, true, s);
                            }, reps, stream);
                        }
                        zz_gemv_set_ticket(red);
                    }
                    double stock_us = -1.0;
#ifdef ZZ_TEST_WITH_GGML_CUDA
                    stock_us = bench_stock_us(type, m, n, T, x);
#endif
                    const double frac    = (double) count/n;
                    const double idx_gbs = (frac*wbytes + T*n*4.0)/(idx_us*1e3);
                    printf("%-5s %5lld %5lld %2d %4.0f | %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f | %7.0f %5.0f%% | %2d %2d %d",
                            zz_type_name(type), (long long) m, (long long) n, T, 100.0*sp, dense_us, idx_us, idx_list_us,
                            fused_us, skip_us, naive_us, list_us, idx_gbs, 100.0*idx_gbs/copy_gbs, cfg.n1, cfg.n2, cfg.cluster);
                    if (both) {
                        printf(" | atomic: %8.2f %8.2f %8.2f", dense_at_us, idx_at_us, fused_at_us);
                    }
                    if (stock_us > 0.0) {
                        printf(" | stock %.2f", stock_us);
                    }
                    printf("\n");
                    if (csv) {
                        fprintf(csv, "%s,%lld,%lld,%d,%.2f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.1f,%.1f,%d,%d,%d,%s,%.3f,%.3f,%.3f\n",
                                zz_type_name(type), (long long) m, (long long) n, T, sp, dense_us, idx_us, idx_list_us,
                                fused_us, skip_us, naive_us, list_us, stock_us, idx_gbs, copy_gbs, cfg.n1, cfg.n2, cfg.cluster,
                                red_name(red), dense_at_us, idx_at_us, fused_at_us);
                    }
                }
            }
            for (void * p : ws) {
                CUDA_CHECK(cudaFree(p));
            }
        }
    }
    if (csv) {
        fclose(csv);
    }
    CUDA_CHECK(cudaStreamDestroy(stream));
    zz_gemv_set_ticket(-1);
    return 0;
}

// one launch of each mode per sparsity, synchronized, for a profiler that counts DRAM bytes per kernel (ncu flushes
// the caches before each): prints "bytes: K MODE SP USEFUL" in launch order, K counting the GEMV launches only
static int run_bytes(const bench_opts & o) {
    cudaStream_t   stream;
    int            device;
    cudaDeviceProp prop;
    bench_begin(stream, device, prop);
    printf("device %s; L2 fetch granularity limit %zu bytes\n", prop.name, bench_l2_fetch_bytes());
    const double sparsities[] = { 0.0, 0.25, 0.50, 0.65, 0.80 };
    int k = 0;
    for (const auto & shape : o.shapes) {
        const int64_t m = shape.first;
        const int64_t n = shape.second;
        if (m % QK_K != 0) {
            continue;
        }
        const ggml_type type    = GGML_TYPE_Q4_K;
        const int64_t   nblocks = m/QK_K*n;
        const size_t    wbytes  = nblocks*zz_block_bytes(type);
        void * w = nullptr;
        CUDA_CHECK(cudaMalloc(&w, wbytes));
        bench_random_weights(w, type, nblocks, 99u);
        const zz_gemv_config cfg = zz_gemv_get_config(device, type, n, m, 1);
        dev_buf<float>   x_d(n);
        dev_buf<int32_t> idx_d(n + 1);
        dev_buf<int32_t> scratch_d(std::max<int64_t>(1, sparse_idx_list_scratch_size(n, 1)));
        dev_buf<float>   y_d(m);
        for (double sp : sparsities) {
            std::vector<float> x;
            const int64_t count = bench_make_x(o.pattern, sp, n, 1, x);
            x_d.upload(x.data(), x.size());
            const float thr = 1e-30f;
            sparse_idx_list_launch(x_d.ptr, n, 1, n, thr, idx_d.ptr, scratch_d.ptr, stream);
            CUDA_CHECK(cudaStreamSynchronize(stream));
            const double useful = (double) count*zz_block_bytes(type)*(m/QK_K);
            if (sp == 0.0) {
                zz_gemv_launch_ex(type, w, n, m, x_d.ptr, n, 1, nullptr, ZZ_GEMV_DENSE, y_d.ptr, m, cfg, stream);
                CUDA_CHECK(cudaStreamSynchronize(stream));
                printf("bytes: %d dense %lldx%lld %.2f %.0f\n", k++, (long long) m, (long long) n, sp, useful);
            }
            zz_gemv_launch_ex(type, w, n, m, x_d.ptr, n, 1, idx_d.ptr, ZZ_GEMV_IDX, y_d.ptr, m, cfg, stream);
            CUDA_CHECK(cudaStreamSynchronize(stream));
            printf("bytes: %d idx %lldx%lld %.2f %.0f\n", k++, (long long) m, (long long) n, sp, useful);
            if (zz_gemv_launch_fused(type, w, n, m, x_d.ptr, n, 1, thr, y_d.ptr, m, cfg, true, stream)) {
                CUDA_CHECK(cudaStreamSynchronize(stream));
                printf("bytes: %d fused %lldx%lld %.2f %.0f\n", k++, (long long) m, (long long) n, sp, useful);
            }
        }
        CUDA_CHECK(cudaFree(w));
    }
    CUDA_CHECK(cudaStreamDestroy(stream));
    return 0;
}

// decode's GEMV chain: per layer the q/k/v group, o (+ residual), the gate/up group and down (+ residual), each
// launched as ggml-cuda launches it (config of the summed rows, FUSED mode at a level, DENSE for dense), for
// `layers` layers with their own weights, back to back in one CUDA graph (PDL between neighbours). Nothing else of a
// layer runs, and the launches read fixed inputs, so the time is the chain's alone: an A/B proxy for end to end
// that needs no model and no full build.
struct chain_model {
    const char * name;
    int64_t      d, d_kv, d_ff;
};

static const chain_model chain_models[] = {
    { "7b", 4096, 4096, 11008 }, // Llama-2-7B
    { "8b", 4096, 1024, 14336 }, // Llama-3-8B
};

// one launch of a layer: the outputs of its weights, their width n (d_ff: down, reading the FFN activation), and
// whether the residual is added
struct chain_group {
    std::vector<int64_t> m;
    int64_t              n;
    bool                 res;
};

// [q k v] [o] [gate up] [down]
static std::vector<chain_group> chain_groups(const chain_model & cm) {
    return { { { cm.d, cm.d_kv, cm.d_kv }, cm.d, false }, { { cm.d }, cm.d, true },
             { { cm.d_ff, cm.d_ff }, cm.d, false }, { { cm.d }, cm.d_ff, true } };
}

#ifdef ZZ_TEST_WITH_GGML_CUDA
// the same chain on stock ggml-cuda (standard Q4_K, mmvq; q, k, v, gate and up as separate matmuls, o and down with
// an ADD, which ggml-cuda may fuse): us a token, wall time over graph computes
static double bench_stock_chain_us(const chain_model & cm, const int layers, const int T) {
    ggml_backend_t backend = stock_backend();
    const ggml_type type  = GGML_TYPE_Q4_K;
    const int       nodes = layers*9 + 8;
    ggml_init_params ip = { ggml_tensor_overhead()*(layers*7 + nodes + 8) + ggml_graph_overhead_custom(nodes, false),
                            nullptr, true };
    ggml_context * ctx = ggml_init(ip);
    ggml_tensor * xa  = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, cm.d, T);
    ggml_tensor * xf  = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, cm.d_ff, T);
    ggml_tensor * res = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, cm.d, T);
    ggml_cgraph * gf  = ggml_new_graph_custom(ctx, nodes, false);
    std::vector<ggml_tensor *> ws;
    for (int l = 0; l < layers; ++l) {
        for (const chain_group & g : chain_groups(cm)) {
            for (int64_t m : g.m) {
                ws.push_back(ggml_new_tensor_2d(ctx, type, g.n, m));
                ggml_tensor * y = ggml_mul_mat(ctx, ws.back(), g.n == cm.d ? xa : xf);
                if (g.res) {
                    y = ggml_add(ctx, y, res);
                }
                ggml_build_forward_expand(gf, y);
            }
        }
    }
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, backend);
    for (size_t i = 0; i < ws.size(); ++i) {
        bench_random_weights(ws[i]->data, type, ggml_nelements(ws[i])/zz_blck_size(type), 500u + (uint32_t) i);
    }
    CUDA_CHECK(cudaDeviceSynchronize());
    for (ggml_tensor * t : { xa, xf, res }) {
        std::vector<float> v(ggml_nelements(t));
        test_rng rng(7);
        for (float & e : v) {
            e = (float) rng.normal();
        }
        ggml_backend_tensor_set(t, v.data(), 0, ggml_nbytes(t));
    }
    const double us = stock_graph_us(backend, gf);
    ggml_backend_buffer_free(buf);
    ggml_free(ctx);
    return us;
}
#endif // ZZ_TEST_WITH_GGML_CUDA

// the chain's RMS norm before q/k/v and gate/up when it runs as its own kernel (as decode's rms_norm with the MUL
// fused): one block a token, x/rms(x)*w
static __global__ void chain_rms_norm(const float * x, const float * w, float * y, const int n, const float eps) {
    __shared__ float part[32];
    const float * xt  = x + (int64_t) blockIdx.x*n;
    float         sum = 0.0f;
    for (int c = threadIdx.x; c < n; c += blockDim.x) {
        sum += xt[c]*xt[c];
    }
    sum = warp_reduce_sum(sum);
    if (threadIdx.x % WARP_SIZE == 0) {
        part[threadIdx.x/WARP_SIZE] = sum;
    }
    __syncthreads();
    sum = threadIdx.x < blockDim.x/WARP_SIZE ? part[threadIdx.x] : 0.0f;
    sum = warp_reduce_sum(sum);
    const float sc = rsqrtf(sum/n + eps);
    for (int c = threadIdx.x; c < n; c += blockDim.x) {
        y[(int64_t) blockIdx.x*n + c] = sc*xt[c]*w[c];
    }
}

// the chain's floor: kernels on the GEMVs' grids that do no GEMV work. Each block lets the next kernel launch
// (PDL), waits for the one before, then by `work`: 0 nothing; 1 thread 0 makes one atomic round trip (as the
// EARLY ticket); 2 also every thread loads its share of the block's n/n1 columns of x (the input's round trip).
// The 100 % level minus these is what the GEMVs' own fixed work costs
static __global__ void chain_floor(const float * x, const int64_t n, int * ctr, float * sink, const int work) {
    ggml_cuda_pdl_lc();
    ggml_cuda_pdl_sync();
    float acc = 0.0f;
    if (work >= 2) {
        const int64_t c0 = n*blockIdx.x/gridDim.x, c1 = n*(blockIdx.x + 1)/gridDim.x;
        for (int64_t c = c0 + threadIdx.x; c < c1; c += blockDim.x) {
            acc += x[c];
        }
    }
    if (work >= 1 && threadIdx.x == 0) {
        acc += (float) atomicAdd(ctr + blockIdx.y, 1);
    }
    if (acc == -1.0f) { // never (x >= 0 here): keeps the loads
        sink[0] = acc;
    }
}

static int run_chain_bench(const bench_opts & o, const std::string & model, const int layers) {
    const chain_model * cm = nullptr;
    for (const auto & c : chain_models) {
        if (model == c.name) {
            cm = &c;
        }
    }
    if (cm == nullptr || layers < 1) {
        fprintf(stderr, "chain: unknown model %s (7b, 8b) or layers %d < 1\n", model.c_str(), layers);
        return 2;
    }
    const ggml_type type = GGML_TYPE_Q4_K;
    cudaStream_t   stream;
    int            device;
    cudaDeviceProp prop;
    bench_begin(stream, device, prop);

    const std::vector<chain_group> groups = chain_groups(*cm);
    const int     ng = (int) groups.size();
    const int64_t d = cm->d, dkv = cm->d_kv, dff = cm->d_ff;

    size_t wbytes = 0;
    std::vector<std::vector<void *>> w(layers*ng);
    for (int l = 0; l < layers; ++l) {
        for (int g = 0; g < ng; ++g) {
            for (int64_t m : groups[g].m) {
                const int64_t nblocks = m/QK_K*groups[g].n;
                void * p;
                CUDA_CHECK(cudaMalloc(&p, nblocks*zz_block_bytes(type)));
                bench_random_weights(p, type, nblocks, 77u + 4*l + g + (uint32_t) w[l*ng + g].size());
                w[l*ng + g].push_back(p);
                wbytes += nblocks*zz_block_bytes(type);
            }
        }
    }
    printf("device %s, %d SMs; %s-shaped chain: %d layers x 4 launches (q/k/v, o + residual, gate/up, down + residual), "
           "Q4_K weights %.0f MiB, from DRAM\n", prop.name, prop.multiProcessorCount, cm->name, layers, wbytes/1048576.0);

    const int Tmax = *std::max_element(o.batches.begin(), o.batches.end());
    dev_buf<float> xa(Tmax*d), xf(Tmax*dff), res(Tmax*d), xn(Tmax*d), nw(d);
    // LLAMA_SPARSE_TEST_CHAIN_NORM: 0 none, 1 an RMS norm kernel before q/k/v and gate/up, 2 (default, as decode
    // runs) the norm folded into their launches (zz_gemv_norm)
    const int norm_mode = getenv("LLAMA_SPARSE_TEST_CHAIN_NORM") ? atoi(getenv("LLAMA_SPARSE_TEST_CHAIN_NORM")) : 2;
    {
        std::vector<float> ones(d, 1.0f);
        nw.upload(ones.data(), d);
    }
    const zz_gemv_norm chain_norm = { nw.ptr, 1e-5f };
    // LLAMA_SPARSE_TEST_CHAIN_STATS=1: FUSED launches count into a set of stats counters, as decode's always do
    const bool chain_stats = getenv("LLAMA_SPARSE_TEST_CHAIN_STATS") && atoi(getenv("LLAMA_SPARSE_TEST_CHAIN_STATS"));
    dev_buf<unsigned long long> stats_d(3);
    if (norm_mode == 1 || norm_mode == 2) {
        printf("RMS norm before q/k/v and gate/up: %s\n", norm_mode == 1 ? "its own kernel" : "folded into the GEMVs");
    }
    // LLAMA_SPARSE_TEST_CHAIN_ACC=1: outputs that accumulate (cuda/README.md) where the graph hook would use them:
    // q/k/v and gate/up add into outputs kept at zero (y_ready; q/k/v zeroes the gate/up accumulator for the next
    // layer), gate/up copies its x into down's output, down adds into it (y_ready, no residual); o as before.
    // Needs the folded norm (the upkeep is a NORM launch's)
    const bool acc = getenv("LLAMA_SPARSE_TEST_CHAIN_ACC") && atoi(getenv("LLAMA_SPARSE_TEST_CHAIN_ACC")) != 0 &&
                     norm_mode == 2;
    dev_buf<float> acc_gu(Tmax*2*dff);
    if (acc) {
        printf("outputs that accumulate: q/k/v, gate/up and down (o as before)\n");
    }
    dev_buf<float> y(Tmax*(d + 2*dkv + 2*dff)); // outputs (shared by the layers: only the time matters)
    std::vector<float> r(Tmax*d);
    test_rng rr(3);
    for (float & v : r) {
        v = (float) rr.normal();
    }
    res.upload(r.data(), r.size());

    printf("%2s %5s | %10s %9s %9s | %s\n", "T", "level", "us/token", "us/layer", "tok/s", "vs dense, vs stock");
    const double levels[] = { 0.0, 0.25, 0.40, 0.50, 0.65, 0.80, 1.0 }; // 1.0: no active column, the launches' fixed cost
    for (int T : o.batches) {
        double dense_us = -1.0;
        double stock_us = -1.0;
#ifdef ZZ_TEST_WITH_GGML_CUDA
        stock_us = bench_stock_chain_us(*cm, layers, T);
        printf("%2d stock | %10.1f %9.2f %9.1f | (ggml-cuda mmvq on the standard layout)\n", T, stock_us,
                stock_us/layers, 1e6/stock_us);
#endif
        for (double sp : levels) {
            // inputs with exact zeros in the inactive columns (the same columns for every token, as decode's union)
            for (int which = 0; which < 2; ++which) {
                const int64_t n = which == 0 ? d : dff;
                test_rng rng(11 + which);
                std::vector<float> x(T*n);
                for (int64_t j = 0; j < n; ++j) {
                    const bool act = rng.uniform() >= sp;
                    for (int t = 0; t < T; ++t) {
                        x[t*n + j] = act ? (float) rng.normal() : 0.0f;
                    }
                }
                (which == 0 ? xa : xf).upload(x.data(), x.size());
            }
            const zz_gemv_mode mode = sp == 0.0 ? ZZ_GEMV_DENSE : ZZ_GEMV_FUSED;
            const float thr = 1e-30f;
            auto token = [&](cudaStream_t s, int) {
                for (int l = 0; l < layers; ++l) {
                    for (int g = 0; g < ng; ++g) {
                        const int64_t n = groups[g].n;
                        zz_gemv_seg seg[ZZ_GROUP_MAX];
                        int64_t m_sum = 0;
                        const int nseg = (int) groups[g].m.size();
                        for (int k = 0; k < nseg; ++k) {
                            const int64_t m = groups[g].m[k];
                            seg[k].w        = w[l*ng + g][k];
                            seg[k].m        = m;
                            seg[k].y        = y.ptr + T*m_sum;
                            seg[k].y_stride = m;
                            if (groups[g].res && !(acc && g == 3)) {
                                seg[k].bias        = res.ptr;
                                seg[k].bias_stride = d;
                            }
                            seg[k].y_ready = acc && g != 1;
                            m_sum += m;
                        }
                        const zz_gemv_config cfg = zz_gemv_get_config(device, type, n, m_sum, T);
                        const bool normed = !groups[g].res && n == d;
                        zz_gemv_norm nrm = chain_norm;
                        if (acc && g == 0) {
                            nrm.clear   = acc_gu.ptr;
                            nrm.clear_n = T*2*dff;
                        } else if (acc && g == 2) {
                            nrm.x_copy        = y.ptr; // (down's output: the shared output buffer's start)
                            nrm.x_copy_stride = d;
                        }
                        const float * xin = n == d ? xa.ptr : xf.ptr;
                        if (normed && norm_mode == 1) {
                            chain_rms_norm<<<T, 1024, 0, s>>>(xa.ptr, nw.ptr, xn.ptr, (int) d, chain_norm.eps);
                            xin = xn.ptr;
                        }
                        GGML_ASSERT(zz_gemv_launch_group(type, seg, nseg, n, xin, n, T, nullptr, mode, thr, cfg, s,
                                normed && norm_mode == 2 ? &nrm : nullptr, chain_stats ? stats_d.ptr : nullptr));
                    }
                }
            };
            const double us = time_graph_us(token, 3, stream);
            if (sp == 0.0) {
                dense_us = us;
            }
            printf("%2d %4.0f%% | %10.1f %9.2f %9.1f | %.3f", T, 100.0*sp, us, us/layers, 1e6/us, dense_us/us);
            if (stock_us > 0.0) {
                printf(" %.3f", stock_us/us);
            }
            printf("\n");
            fflush(stdout);
        }
        // the floor (see chain_floor): the same launches' grids and blocks, PDL as the GEMVs
        dev_buf<int>   ctr(65536);
        dev_buf<float> sink(1);
        {
            std::vector<float> ones(dff, 1.0f);
            xf.upload(ones.data(), dff);
        }
        CUDA_CHECK(cudaMemset(ctr.ptr, 0, 65536*sizeof(int)));
        // 50 KiB of shared memory a block: 4 blocks an SM, as the direct kernel's registers allow
        const int floor_smem = 50*1024;
        CUDA_CHECK(cudaFuncSetAttribute(chain_floor, cudaFuncAttributeMaxDynamicSharedMemorySize, floor_smem));
        const char * floor_name[] = { "empty", "+ atomic", "+ x read" };
        for (int work = 0; work < 3; ++work) {
            auto token = [&](cudaStream_t s, int) {
                for (int l = 0; l < layers; ++l) {
                    for (int g = 0; g < ng; ++g) {
                        int64_t m_sum = 0;
                        for (int64_t m : groups[g].m) {
                            m_sum += m;
                        }
                        const int64_t n = groups[g].n;
                        const zz_gemv_config cfg = zz_gemv_get_config(device, type, n, m_sum, T);
                        ggml_sparse_cuda_launch_cfg(chain_floor, dim3(cfg.n1, (unsigned) (m_sum/QK_K), 1),
                                dim3(cfg.n2*WARP_SIZE, 1, 1), floor_smem, 0, true, s, (const float *) xf.ptr, n,
                                ctr.ptr, sink.ptr, work);
                    }
                }
            };
            const double us = time_graph_us(token, 3, stream);
            printf("   floor %-8s | %10.1f %9.2f %9.1f | (no GEMV work: the launches' floor)\n", floor_name[work], us,
                    us/layers, 1e6/us);
            fflush(stdout);
        }
    }
    for (auto & v : w) {
        for (void * p : v) {
            CUDA_CHECK(cudaFree(p));
        }
    }
    CUDA_CHECK(cudaStreamDestroy(stream));
    return 0;
}

// prefill: zigzag dequantize + cuBLAS against the GEMV run once per 8 tokens
static int run_prefill_bench(const bench_opts & o) {
    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    int device;
    CUDA_CHECK(cudaGetDevice(&device));
#ifndef GGML_SPARSE_CUDA_NO_CUBLAS
    cublasHandle_t handle;
    CUBLAS_CHECK(cublasCreate(&handle));
    CUBLAS_CHECK(cublasSetStream(handle, stream));
    size_t ws_size = 32u << 20;
    dev_buf<char> ws_buf(ws_size);
    CUBLAS_CHECK(cublasSetWorkspace(handle, ws_buf.ptr, ws_size));
#else
    cublasHandle_t handle = nullptr;
#endif
    printf("%-5s %5s %5s %4s | %10s %10s %10s | %8s\n", "type", "m", "n", "T", "prefill_us", "dequant_us", "gemv8_us", "TFLOP/s");
    for (ggml_type type : o.types) {
        for (const auto & shape : o.shapes) {
            const int64_t m = shape.first;
            const int64_t n = shape.second;
            const int64_t B = zz_blck_size(type);
            if (m % B != 0) {
                continue;
            }
            const int64_t nblocks = m/B*n;
            void * w;
            CUDA_CHECK(cudaMalloc(&w, nblocks*zz_block_bytes(type)));
            bench_random_weights(w, type, nblocks, 5u);
            for (int T : o.batches) {
                dev_buf<float> x_d(T*n);
                dev_buf<float> y_d(T*m);
                dev_buf<half>  tw(zz_prefill_tmp_w_size(type, n, m));
                dev_buf<half>  tx(zz_prefill_tmp_x_size(n, T));
                std::vector<float> x(T*n);
                test_rng rng(7);
                for (float & v : x) {
                    v = (float) rng.normal();
                }
                x_d.upload(x.data(), x.size());
                const double pre_us = time_graph_us([&](cudaStream_t s, int) {
                    zz_prefill_launch(type, w, n, m, x_d.ptr, n, T, y_d.ptr, m, tw.ptr, tx.ptr, handle, s);
                }, 5, stream);
                const int64_t tile = zz_prefill_tile_rows(type, n, m);
                const double deq_us = time_graph_us([&](cudaStream_t s, int) {
                    for (int64_t r0 = 0; r0 < m; r0 += tile) {
                        zz_dequant_f16_launch(type, w, n, r0, std::min(tile, m - r0), tw.ptr, s);
                    }
                }, 5, stream);
                const double gemv_us = time_graph_us([&](cudaStream_t s, int) {
                    for (int t0 = 0; t0 < T; t0 += ZZ_GEMV_MAX_BATCH) {
                        const int nt = std::min(ZZ_GEMV_MAX_BATCH, T - t0);
                        const zz_gemv_config cfg = zz_gemv_get_config(device, type, n, m, nt);
                        zz_gemv_launch_ex(type, w, n, m, x_d.ptr + t0*n, n, nt, nullptr, ZZ_GEMV_DENSE, y_d.ptr + t0*m, m, cfg, s);
                    }
                }, 3, stream);
                printf("%-5s %5lld %5lld %4d | %10.2f %10.2f %10.2f | %8.1f", zz_type_name(type), (long long) m,
                        (long long) n, T, pre_us, deq_us, gemv_us, 2.0*m*n*T/(pre_us*1e6));
#ifdef ZZ_TEST_WITH_GGML_CUDA
                printf(" | stock %.2f", bench_stock_us(type, m, n, T, x));
#endif
                printf("\n");
            }
            CUDA_CHECK(cudaFree(w));
        }
    }
#ifndef GGML_SPARSE_CUDA_NO_CUBLAS
    CUBLAS_CHECK(cublasDestroy(handle));
#endif
    CUDA_CHECK(cudaStreamDestroy(stream));
    return 0;
}

// ---------------------------------------------------------------------------------------------------

static std::vector<int> parse_ints(const char * s) {
    std::vector<int> v;
    for (const char * p = s; *p; ) {
        v.push_back(atoi(p));
        p = strchr(p, ',');
        if (!p) {
            break;
        }
        p++;
    }
    return v;
}

// "all", or names separated by commas
static bool parse_type(const char * s, std::vector<ggml_type> & types) {
    if (strcmp(s, "all") == 0) {
        types.assign(std::begin(test_types), std::end(test_types));
        return true;
    }
    types.clear();
    std::string rest = s;
    while (!rest.empty()) {
        const size_t      comma = rest.find(',');
        const std::string name  = rest.substr(0, comma);
        rest = comma == std::string::npos ? "" : rest.substr(comma + 1);
        bool known = false;
        for (ggml_type t : test_types) {
            if (name == zz_type_name(t)) {
                types.push_back(t);
                known = true;
            }
        }
        if (!known) {
            return false;
        }
    }
    return !types.empty();
}

static void usage() {
    printf("usage: test_zz_cuda test    [--seed S] [--cases N]\n"
           "       test_zz_cuda bench   [--type q4_K|q8_0|q4_0|q6_K|q4_0_g8|q8_0_g8[,...]|all] [--batch 1,4,8] [--pattern random|contiguous]\n"
           "                            [--l2-warm] [--shapes 4096x4096,...] [--csv FILE] [--reduction ticket|first|early|atomic|both]\n"
           "       test_zz_cuda bytes   [--shapes ...] [--pattern ...]   (Q4_K, batch 1: one launch a mode and sparsity, for ncu)\n"
           "       test_zz_cuda prefill [--type ...] [--batch 16,64,512] [--shapes ...]\n"
           "       test_zz_cuda tune    [--max-batch 8] [--sparsity 0.5] [--out FILE] [--shapes ...]\n"
           "       test_zz_cuda chain   [--model 7b|8b] [--layers 32] [--batch 1,4]   (decode's GEMV chain, levels 0-100 %%)\n");
}

int main(int argc, char ** argv) {
    if (argc < 2) {
        usage();
        return 2;
    }
    const std::string cmd = argv[1];

    uint64_t   seed      = 1;
    int        cases     = 40;
    int        max_batch = ZZ_GEMV_MAX_BATCH;
    float      sparsity  = 0.5f;
    std::string out;
    std::string model  = "7b";
    int         layers = 32;
    bench_opts o;
    bool       batch_set = false;
    for (int i = 2; i < argc; ++i) {
        const std::string a   = argv[i];
        const char *      val = i + 1 < argc ? argv[i + 1] : nullptr;
        if (a == "--l2-warm") {
            o.l2_warm = true;
            continue;
        }
        if (val == nullptr) {
            usage();
            return 2;
        }
        ++i;
        if (a == "--seed") {
            seed = strtoull(val, nullptr, 10);
        } else if (a == "--cases") {
            cases = atoi(val);
        } else if (a == "--type") {
            if (!parse_type(val, o.types)) {
                fprintf(stderr, "unknown type %s\n", val);
                return 2;
            }
        } else if (a == "--batch") {
            o.batches = parse_ints(val);
            batch_set = true;
        } else if (a == "--reduction") {
            o.reduction = val;
            if (o.reduction != "ticket" && o.reduction != "atomic" && o.reduction != "first" && o.reduction != "early" &&
                    o.reduction != "both") {
                usage();
                return 2;
            }
        } else if (a == "--pattern") {
            o.pattern = val;
        } else if (a == "--csv") {
            o.csv = val;
        } else if (a == "--max-batch") {
            max_batch = atoi(val);
        } else if (a == "--sparsity") {
            sparsity = (float) atof(val);
        } else if (a == "--out") {
            out = val;
        } else if (a == "--model") {
            model = val;
        } else if (a == "--layers") {
            layers = atoi(val);
        } else if (a == "--shapes") {
            for (const char * p = val; p && *p; ) {
                long long m_, n_;
                if (sscanf(p, "%lldx%lld", &m_, &n_) == 2) {
                    o.shapes.push_back({ m_, n_ });
                }
                p = strchr(p, ',');
                p = p ? p + 1 : nullptr;
            }
        } else {
            usage();
            return 2;
        }
    }
    if (o.shapes.empty()) {
        for (const auto & s : bench_shapes) {
            o.shapes.push_back({ s[0], s[1] });
        }
    }

    if (cmd == "test") {
        test_rng rng(seed);
        int failures = 0;
        failures += test_idx(rng, cases);
        failures += test_gemv(rng, cases);
        failures += test_nan(rng);
        failures += test_group(rng, cases);
        failures += test_norm(rng, std::max(10, cases/2));
        failures += test_glu(rng, std::max(10, cases/2));
        failures += test_graph(rng);
        failures += test_ticket_chain(rng);
        failures += test_naive(rng);
        failures += test_prefill(rng);
        printf("%s: %d failures\n", failures ? "FAILED" : "PASSED", failures);
        return failures ? 1 : 0;
    }
    if (cmd == "bench") {
        return run_bench(o);
    }
    if (cmd == "bytes") {
        return run_bytes(o);
    }
    if (cmd == "chain") {
        return run_chain_bench(o, model, layers);
    }
    if (cmd == "prefill") {
        if (!batch_set) {
            o.batches = { 16, 64, 512 };
        }
        return run_prefill_bench(o);
    }
    if (cmd == "tune") {
        std::vector<int64_t> mn;
        for (const auto & s : o.shapes) {
            mn.push_back(s.first);
            mn.push_back(s.second);
        }
        int device;
        CUDA_CHECK(cudaGetDevice(&device));
        const int n = ggml_cuda_zz_autotune(device, mn.data(), (int) o.shapes.size(), max_batch, sparsity,
                out.empty() ? nullptr : out.c_str());
        printf("tune: %d entries\n", n);
        return n < 0 ? 1 : 0;
    }
    usage();
    return 2;
}
