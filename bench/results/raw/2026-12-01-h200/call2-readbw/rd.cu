// per-SM read throughput: plain 16-byte loads vs cp.async.bulk into shared memory (H200, call 2 of 2026-12-01)
// nvcc -O3 -arch=sm_90 -std=c++17 rd.cu -o rd && ./rd
#include <cstdio>
#include <cstdint>
#include <cuda_runtime.h>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)

template <int INFL>
__global__ void __launch_bounds__(512, 1) rd_ldg(const uint4 * __restrict__ src, size_t per_block, float * out) {
    extern __shared__ char sm[];
    const uint4 * p = src + (size_t) blockIdx.x * (per_block/16);
    const int n = per_block/16;
    uint32_t acc = 0;
    for (int i = threadIdx.x; i < n; i += 512*INFL) {
        uint4 v[INFL];
#pragma unroll
        for (int u = 0; u < INFL; ++u) v[u] = i + u*512 < n ? p[i + u*512] : make_uint4(0,0,0,0);
#pragma unroll
        for (int u = 0; u < INFL; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    if (acc == 0x12345678) out[0] = 1.0f;
    if (threadIdx.x == 0) sm[0] = 0;
}

__device__ __forceinline__ void mbar_init(uint64_t * b, int c) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"((uint32_t)__cvta_generic_to_shared(b)), "r"(c));
}
__device__ __forceinline__ void mbar_expect(uint64_t * b, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"((uint32_t)__cvta_generic_to_shared(b)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bulk(void * dst, const void * src, uint32_t bytes, uint64_t * b) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
        :: "r"((uint32_t)__cvta_generic_to_shared(dst)), "l"(src), "r"(bytes), "r"((uint32_t)__cvta_generic_to_shared(b)) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t * b, uint32_t ph) {
    asm volatile("{\n .reg .pred p;\n W: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n @!p bra W;\n}"
        :: "r"((uint32_t)__cvta_generic_to_shared(b)), "r"(ph) : "memory");
}

// ST stages of CH bytes each, issued as NR copies (rows) per stage
__global__ void __launch_bounds__(512, 1) rd_tma(const char * __restrict__ src, size_t per_block, int ST, int CH, int NR, float * out) {
    extern __shared__ __align__(128) char sm[];
    __shared__ uint64_t bar[8];
    const char * p = src + blockIdx.x * per_block;
    const int nch = per_block / CH;
    if (threadIdx.x < ST) mbar_init(&bar[threadIdx.x], 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    __syncthreads();
    auto issue = [&](int c) {
        const int s = c % ST;
        mbar_expect(&bar[s], CH);
        for (int r = 0; r < NR; ++r) bulk(sm + s*CH + r*(CH/NR), p + (size_t) c*CH + r*(CH/NR), CH/NR, &bar[s]);
    };
    if (threadIdx.x == 0) for (int c = 0; c < ST && c < nch; ++c) issue(c);
    uint32_t acc = 0;
    for (int c = 0; c < nch; ++c) {
        const int s = c % ST;
        mbar_wait(&bar[s], (c / ST) & 1);
        const uint4 * q = (const uint4 *) (sm + s*CH);
        for (int i = threadIdx.x; i < CH/16; i += 512) { uint4 v = q[i]; acc ^= v.x ^ v.w; }
        __syncthreads();
        if (threadIdx.x == 0 && c + ST < nch) { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); issue(c + ST); }
    }
    if (acc == 0x12345678) out[0] = 1.0f;
}

int main() {
    const size_t total = (size_t) 2 << 30;
    char * buf; float * out;
    CK(cudaMalloc(&buf, total)); CK(cudaMalloc(&out, 4));
    CK(cudaMemset(buf, 1, total));
    cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
    CK(cudaFuncSetAttribute(rd_ldg<4>, cudaFuncAttributeMaxDynamicSharedMemorySize, 200*1024));
    CK(cudaFuncSetAttribute(rd_ldg<8>, cudaFuncAttributeMaxDynamicSharedMemorySize, 200*1024));
    CK(cudaFuncSetAttribute(rd_ldg<16>, cudaFuncAttributeMaxDynamicSharedMemorySize, 200*1024));
    CK(cudaFuncSetAttribute(rd_tma, cudaFuncAttributeMaxDynamicSharedMemorySize, 200*1024));
    for (int nbk : {64, 128, 132}) {
        for (size_t pb : {(size_t) 128 << 10, (size_t) 256 << 10}) {
            const int nrot = total / (nbk * pb); // rotate over the 2 GiB so reads come from DRAM
            auto run = [&](const char * name, auto launch) {
                float best = 1e9f;
                for (int rep = 0; rep < 5; ++rep) {
                    cudaEventRecord(e0);
                    for (int it = 0; it < 50; ++it) launch(buf + (size_t) (it % nrot) * nbk * pb);
                    cudaEventRecord(e1); cudaEventSynchronize(e1);
                    float ms; cudaEventElapsedTime(&ms, e0, e1); best = fminf(best, ms*1000/50);
                }
                printf("blocks %3d, %3zu KB a block, %-22s %7.2f us  %6.1f GB/s a block  %7.1f GB/s total\n", nbk, pb >> 10, name,
                       best, pb / best / 1e3, nbk * pb / best / 1e3);
            };
            run("ldg x4", [&](const char * b) { rd_ldg<4><<<nbk, 512, 200*1024>>>((const uint4 *) b, pb, out); });
            run("ldg x8", [&](const char * b) { rd_ldg<8><<<nbk, 512, 200*1024>>>((const uint4 *) b, pb, out); });
            run("ldg x16", [&](const char * b) { rd_ldg<16><<<nbk, 512, 200*1024>>>((const uint4 *) b, pb, out); });
            for (int st : {2, 4}) for (int ch : {16384, 32768}) for (int nr : {1, 8}) {
                if (st*ch > 160*1024) continue;
                char nm[64]; snprintf(nm, sizeof nm, "tma %dx%dK/%d", st, ch >> 10, nr);
                run(nm, [&](const char * b) { rd_tma<<<nbk, 512, 200*1024>>>(b, pb, st, ch, nr, out); });
            }
        }
    }
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    return 0;
}
