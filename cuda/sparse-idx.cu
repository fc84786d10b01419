// llama-sparse: GGML_OP_SPARSE_IDX on CUDA.
//
// LIST mode is a stream compaction of the columns whose |x| reaches the threshold for any token.
// Each thread holds a bit per column of its segment (columns begin + k*blockDim + tid, k < rounds);
// per (round, warp) counts come from __ballot_sync, one block-wide exclusive scan over them in
// (round, warp) order gives every warp-round its output offset, and lanes place their columns with the
// popcount of the lower lanes' ballot bits, so the list comes out in ascending column order.
// Small inputs (n*n_tokens <= SPARSE_IDX_SINGLE_MAX) take one block and one launch. Larger ones take
// two launches over segments of SPARSE_IDX_SEG_THREADS*SPARSE_IDX_SEG_ROUNDS columns: the first writes
// each segment's count, the second adds up the counts of the earlier segments (a few dozen ints) and
// writes its columns there. That keeps the list ascending and deterministic and needs no counter to
// reset between launches (an atomicAdd-reserved offset would need a zeroed counter and give the
// segments in arbitrary order): nothing is read back by the host, so it works under CUDA graphs.
#include "sparse-idx.cuh"

#ifndef GGML_SPARSE_CUDA_STANDALONE
#include "ggml-sparse.h"

#include <mutex>
#include <unordered_map>
#include <vector>
#endif // GGML_SPARSE_CUDA_STANDALONE

#define SPARSE_IDX_SINGLE_THREADS 1024
#define SPARSE_IDX_SINGLE_MAX     32768 // elements of x up to which one block does it all (n <= 32*1024)
#define SPARSE_IDX_SEG_THREADS    256
#define SPARSE_IDX_SEG_ROUNDS     4
#define SPARSE_IDX_MASK_THREADS   256

// bit k: column begin + k*blockDim.x + threadIdx.x is active
static __device__ __forceinline__ uint32_t sparse_idx_flags(const float * x, const int64_t x_stride, const int n_tokens,
        const int begin, const int end, const int rounds, const float threshold) {
    uint32_t flags = 0;
#pragma unroll 4
    for (int k = 0; k < rounds; ++k) {
        const int j = begin + k*blockDim.x + threadIdx.x;
        bool act = false;
        if (j < end) {
#pragma unroll
            for (int t = 0; t < SPARSE_IDX_MAX_TOKENS; ++t) {
                if (t < n_tokens) {
                    act = act || sparse_active(x[t*x_stride + j], threshold);
                }
            }
        }
        flags |= (uint32_t) act << k;
    }
    return flags;
}

// pass 0: seg_counts[segment] = number of active columns of the segment.
// pass 1: the segment's active columns, ascending, at the sum of the earlier segments' counts; the last
//         segment writes dst[n]. One block (gridDim.x == 1) needs no seg_counts.
static __global__ void sparse_idx_list(const float * x, const int n, const int n_tokens,
        const int64_t x_stride, const float threshold, const int rounds, int32_t * dst,
        int32_t * seg_counts, const int pass, unsigned long long * stats) {
    __shared__ int s_cnt[WARP_SIZE*WARP_SIZE]; // (round, warp) counts, then their exclusive scan
    __shared__ int s_wsum[WARP_SIZE];
    __shared__ int s_base;

    ggml_cuda_pdl_lc();

    const int lane   = threadIdx.x % WARP_SIZE;
    const int warp   = threadIdx.x / WARP_SIZE;
    const int nwarps = blockDim.x / WARP_SIZE;
    const int begin  = blockIdx.x*rounds*blockDim.x;
    const int end    = min(n, begin + rounds*(int) blockDim.x);

    ggml_cuda_pdl_sync();

    const uint32_t flags = sparse_idx_flags(x, x_stride, n_tokens, begin, end, rounds, threshold);

    if (pass == 0) {
        const int c = warp_reduce_sum<WARP_SIZE>(__popc(flags));
        if (lane == 0) {
            s_wsum[warp] = c;
        }
        __syncthreads();
        if (warp == 0) {
            const int v = warp_reduce_sum<WARP_SIZE>(lane < nwarps ? s_wsum[lane] : 0);
            if (lane == 0) {
                seg_counts[blockIdx.x] = v;
            }
        }
        return;
    }

    if (warp == 0) {
        int v = 0;
        for (int s = lane; s < (int) blockIdx.x; s += WARP_SIZE) {
            v += seg_counts[s];
        }
        v = warp_reduce_sum<WARP_SIZE>(v);
        if (lane == 0) {
            s_base = v;
        }
    }

    // (round, warp) order is column order
    for (int k = 0; k < rounds; ++k) {
        const uint32_t bal = __ballot_sync(0xFFFFFFFF, (flags >> k) & 1);
        if (lane == 0) {
            s_cnt[k*nwarps + warp] = __popc(bal);
        }
    }
    __syncthreads();

    // exclusive scan of the rounds*nwarps <= blockDim.x counts, one per thread
    const int ne   = rounds*nwarps;
    const int v = (int) threadIdx.x < ne ? s_cnt[threadIdx.x] : 0;
    int total;
    const int excl = sparse_block_excl_scan(v, s_wsum, &total);
    if ((int) threadIdx.x < ne) {
        s_cnt[threadIdx.x] = excl;
    }
    __syncthreads();

    const int      base = s_base;
    const uint32_t lt   = (1u << lane) - 1;
    for (int k = 0; k < rounds; ++k) {
        const bool     act = (flags >> k) & 1;
        const uint32_t bal = __ballot_sync(0xFFFFFFFF, act);
        if (act) {
            dst[base + s_cnt[k*nwarps + warp] + __popc(bal & lt)] = begin + k*blockDim.x + threadIdx.x;
        }
    }
    if (blockIdx.x == gridDim.x - 1 && threadIdx.x == 0) {
        dst[n] = base + total;
        if (stats != nullptr) {
            sparse_stats_add(stats, n, base + total);
        }
    }
}

static bool sparse_idx_single_block(const int64_t n, const int n_tokens) {
    return n <= WARP_SIZE*SPARSE_IDX_SINGLE_THREADS && n*n_tokens <= SPARSE_IDX_SINGLE_MAX;
}

int64_t sparse_idx_list_scratch_size(const int64_t n, const int n_tokens) {
    if (sparse_idx_single_block(n, n_tokens)) {
        return 0;
    }
    const int64_t seg = SPARSE_IDX_SEG_THREADS*SPARSE_IDX_SEG_ROUNDS;
    return (n + seg - 1)/seg;
}

void sparse_idx_list_launch(const float * x, const int64_t n, const int n_tokens, const int64_t x_stride,
        const float threshold, int32_t * dst, int32_t * scratch, cudaStream_t stream, unsigned long long * stats) {
    GGML_ASSERT(n >= 0 && n < INT32_MAX);
    GGML_ASSERT(n_tokens >= 1 && n_tokens <= SPARSE_IDX_MAX_TOKENS);

    if (sparse_idx_single_block(n, n_tokens)) {
        const int rounds = std::max(1, (int) ((n + SPARSE_IDX_SINGLE_THREADS - 1)/SPARSE_IDX_SINGLE_THREADS));
        const ggml_cuda_kernel_launch_params params(dim3(1, 1, 1), dim3(SPARSE_IDX_SINGLE_THREADS, 1, 1), 0, stream);
        ggml_cuda_kernel_launch(sparse_idx_list, params, x, (int) n, n_tokens, x_stride, threshold, rounds, dst,
                (int32_t *) nullptr, 1, stats);
        return;
    }

    GGML_ASSERT(scratch != nullptr);
    const int nseg = (int) sparse_idx_list_scratch_size(n, n_tokens);
    const ggml_cuda_kernel_launch_params params(dim3(nseg, 1, 1), dim3(SPARSE_IDX_SEG_THREADS, 1, 1), 0, stream);
    ggml_cuda_kernel_launch(sparse_idx_list, params, x, (int) n, n_tokens, x_stride, threshold, SPARSE_IDX_SEG_ROUNDS,
            dst, scratch, 0, (unsigned long long *) nullptr);
    ggml_cuda_kernel_launch(sparse_idx_list, params, x, (int) n, n_tokens, x_stride, threshold, SPARSE_IDX_SEG_ROUNDS,
            dst, scratch, 1, stats);
}

static __global__ void sparse_idx_mask(const float * x, const int64_t n, const int64_t n_rows,
        const int64_t x_stride, const float threshold, float * dst, const int64_t dst_stride) {
    ggml_cuda_pdl_lc();
    const int64_t j = (int64_t) blockIdx.x*blockDim.x + threadIdx.x;
    ggml_cuda_pdl_sync();
    if (j >= n) {
        return;
    }
    for (int64_t r = blockIdx.y; r < n_rows; r += gridDim.y) {
        const float v = x[r*x_stride + j];
        dst[r*dst_stride + j] = sparse_active(v, threshold) ? v : 0.0f;
    }
}

void sparse_idx_mask_launch(const float * x, const int64_t n, const int64_t n_rows, const int64_t x_stride,
        const float threshold, float * dst, const int64_t dst_stride, cudaStream_t stream) {
    if (n == 0 || n_rows == 0) {
        return;
    }
    const dim3 grid((n + SPARSE_IDX_MASK_THREADS - 1)/SPARSE_IDX_MASK_THREADS, std::min<int64_t>(n_rows, 65535), 1);
    const ggml_cuda_kernel_launch_params params(grid, dim3(SPARSE_IDX_MASK_THREADS, 1, 1), 0, stream);
    ggml_cuda_kernel_launch(sparse_idx_mask, params, x, n, n_rows, x_stride, threshold, dst, dst_stride);
}

#ifndef GGML_SPARSE_CUDA_STANDALONE
// LLAMA_SPARSE_CUDA_FUSE: unset = auto (the LIST op of a group of GPU weights writes nothing; the direct Q4_K
// GEMV finds its columns itself, other GEMVs build the list they need), 0 = always the LIST op,
// 1 = forced (also the staged kernel's fused mode, where every block re-reads x: on the H100 that cost
// more than the LIST launch, 245.7 vs 251.9 t/s at 0.50, bench/results/cuda_e2e_h100_2026-11-22.md)
static int sparse_idx_cuda_fuse_env() {
    static const int v = [] {
        const char * e = getenv("LLAMA_SPARSE_CUDA_FUSE");
        return e == nullptr ? -1 : atoi(e) != 0;
    }();
    return v;
}

bool sparse_idx_cuda_fuse_enabled() {
    return sparse_idx_cuda_fuse_env() != 0;
}

bool sparse_idx_cuda_fuse_forced() {
    return sparse_idx_cuda_fuse_env() == 1;
}

bool sparse_idx_cuda_lazy(const ggml_tensor * idx) {
    return idx->op == GGML_OP_SPARSE_IDX && idx->op_params[1] == GGML_SPARSE_IDX_LIST &&
           idx->op_params[GGML_SPARSE_IDX_PARAM_LAZY] != 0 && sparse_idx_cuda_fuse_enabled();
}

// ---------------------------------------------------------------------------------------------------
// counters of llama_sparse_get_stats in device memory: a slot of 3 u64 per ggml_sparse_stats that counted here

#define SPARSE_STATS_SLOTS 1024

static __device__ unsigned long long sparse_stats_buf[SPARSE_STATS_SLOTS*3];

struct sparse_stats_rec {
    int                slot;
    uint32_t           devices = 0;                         // bit d: a kernel on device d may have counted
    unsigned long long seen[GGML_CUDA_MAX_DEVICES][3] = {}; // what was folded into the host struct so far
};

static std::mutex                                                      sparse_stats_mutex;
static std::unordered_map<const ggml_sparse_stats *, sparse_stats_rec> sparse_stats_recs;
static std::vector<int>                                                sparse_stats_free_slots;
static int                                                             sparse_stats_next_slot = 0;
static unsigned long long *                                            sparse_stats_base[GGML_CUDA_MAX_DEVICES];
// lazy LIST ops that ran and whose counters no matmul has taken yet
static std::unordered_map<const ggml_tensor *, unsigned long long *>   sparse_stats_armed;

static void sparse_stats_collect_cuda(ggml_sparse_stats * stats, bool release) {
    std::lock_guard<std::mutex> lock(sparse_stats_mutex);
    auto it = sparse_stats_recs.find(stats);
    if (it == sparse_stats_recs.end()) {
        return;
    }
    sparse_stats_rec & rec = it->second;
    const size_t off = (size_t) rec.slot*3*sizeof(unsigned long long);
    int prev = -1;
    (void) cudaGetDevice(&prev);
    for (int d = 0; d < GGML_CUDA_MAX_DEVICES; ++d) {
        if (!(rec.devices >> d & 1) || cudaSetDevice(d) != cudaSuccess) {
            continue;
        }
        unsigned long long v[3];
        if (cudaDeviceSynchronize() == cudaSuccess &&
                cudaMemcpyFromSymbol(v, sparse_stats_buf, sizeof(v), off, cudaMemcpyDeviceToHost) == cudaSuccess) {
            __atomic_fetch_add(&stats->n_lists,  (uint64_t) (v[0] - rec.seen[d][0]), __ATOMIC_RELAXED);
            __atomic_fetch_add(&stats->n_cols,   (uint64_t) (v[1] - rec.seen[d][1]), __ATOMIC_RELAXED);
            __atomic_fetch_add(&stats->n_active, (uint64_t) (v[2] - rec.seen[d][2]), __ATOMIC_RELAXED);
            memcpy(rec.seen[d], v, sizeof(v));
        }
        if (release) {
            const unsigned long long zero[3] = { 0, 0, 0 };
            (void) cudaMemcpyToSymbol(sparse_stats_buf, zero, sizeof(zero), off, cudaMemcpyHostToDevice);
            for (auto a = sparse_stats_armed.begin(); a != sparse_stats_armed.end();) {
                a = a->second == sparse_stats_base[d] + rec.slot*3 ? sparse_stats_armed.erase(a) : std::next(a);
            }
        }
    }
    if (prev >= 0) {
        (void) cudaSetDevice(prev);
    }
    (void) cudaGetLastError(); // (a failure here, e.g. at exit, must not surface in a later launch)
    if (release) {
        sparse_stats_free_slots.push_back(rec.slot);
        sparse_stats_recs.erase(it);
    }
}

unsigned long long * sparse_idx_stats_dev(const ggml_tensor * idx) {
    // LLAMA_SPARSE_CUDA_STATS=0: the kernels do not count (sparse_stats() then reads what the CPU counted)
    static const bool off = [] {
        const char * e = getenv("LLAMA_SPARSE_CUDA_STATS");
        return e != nullptr && atoi(e) == 0;
    }();
    const ggml_sparse_stats * stats = off ? nullptr : ggml_sparse_idx_get_stats(idx);
    if (stats == nullptr) {
        return nullptr;
    }
    const int device = ggml_cuda_get_device();
    std::lock_guard<std::mutex> lock(sparse_stats_mutex);
    auto it = sparse_stats_recs.find(stats);
    if (it == sparse_stats_recs.end()) {
        int slot = -1;
        if (!sparse_stats_free_slots.empty()) {
            slot = sparse_stats_free_slots.back();
            sparse_stats_free_slots.pop_back();
        } else if (sparse_stats_next_slot < SPARSE_STATS_SLOTS) {
            slot = sparse_stats_next_slot++;
        } else {
            static bool warned = false;
            if (!warned) {
                warned = true;
                GGML_LOG_WARN("llama-sparse: more than %d contexts count on this GPU: sparse stats of the newer "
                              "ones are not counted there\n", SPARSE_STATS_SLOTS);
            }
            return nullptr;
        }
        static bool registered = false;
        if (!registered) {
            registered = true;
            ggml_sparse_stats_add_collector(sparse_stats_collect_cuda);
        }
        it = sparse_stats_recs.emplace(stats, sparse_stats_rec{ slot }).first;
    }
    if (sparse_stats_base[device] == nullptr) {
        void * p = nullptr;
        CUDA_CHECK(cudaGetSymbolAddress(&p, sparse_stats_buf));
        sparse_stats_base[device] = (unsigned long long *) p;
    }
    it->second.devices |= 1u << device;
    return sparse_stats_base[device] + it->second.slot*3;
}

static void sparse_idx_stats_arm(const ggml_tensor * idx) {
    unsigned long long * p = sparse_idx_stats_dev(idx);
    std::lock_guard<std::mutex> lock(sparse_stats_mutex);
    if (p != nullptr) {
        sparse_stats_armed[idx] = p;
    } else {
        sparse_stats_armed.erase(idx);
    }
}

unsigned long long * sparse_idx_stats_take(const ggml_tensor * idx) {
    if (idx == nullptr) {
        return nullptr;
    }
    std::lock_guard<std::mutex> lock(sparse_stats_mutex);
    auto it = sparse_stats_armed.find(idx);
    if (it == sparse_stats_armed.end()) {
        return nullptr;
    }
    unsigned long long * p = it->second;
    sparse_stats_armed.erase(it);
    return p;
}

void sparse_idx_stats_give_back(const ggml_tensor * idx, unsigned long long * stats) {
    if (idx != nullptr && stats != nullptr) {
        std::lock_guard<std::mutex> lock(sparse_stats_mutex);
        sparse_stats_armed[idx] = stats;
    }
}

void ggml_cuda_op_sparse_idx(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const ggml_tensor * src0 = dst->src[0];

    GGML_ASSERT(src0->type == GGML_TYPE_F32);
    GGML_ASSERT(src0->nb[0] == sizeof(float) && src0->nb[1] % sizeof(float) == 0);
    GGML_ASSERT(src0->ne[2] == 1 && src0->ne[3] == 1);

    float threshold;
    memcpy(&threshold, &dst->op_params[0], sizeof(float));
    const int32_t mode = dst->op_params[1];

    const int64_t n        = src0->ne[0];
    const int64_t n_tokens = src0->ne[1];
    const int64_t x_stride = src0->nb[1]/sizeof(float);
    cudaStream_t  stream   = ctx.stream();

    if (mode == GGML_SPARSE_IDX_LIST) {
        GGML_ASSERT(dst->type == GGML_TYPE_I32 && dst->ne[0] == n + 1);
        GGML_ASSERT(n_tokens >= 1 && n_tokens <= GGML_SPARSE_MAX_BATCH);
        if (sparse_idx_cuda_lazy(dst)) {
            sparse_idx_stats_arm(dst);
            return; // the consuming MUL_MAT_ZZ ops find the columns themselves (or rebuild the list)
        }
        unsigned long long * stats = sparse_idx_stats_dev(dst);
        ggml_cuda_pool_alloc<int32_t> scratch(ctx.pool());
        const int64_t nscratch = sparse_idx_list_scratch_size(n, (int) n_tokens);
        if (nscratch > 0) {
            scratch.alloc(nscratch);
        }
        // LLAMA_SPARSE_CUDA_LIST_REPEAT=k runs the (idempotent) list k times: the decode time added per
        // extra run is what index collection costs end to end (a measurement aid, no effect by default)
        static const int repeat = [] {
            const char * e = getenv("LLAMA_SPARSE_CUDA_LIST_REPEAT");
            return e ? std::max(1, atoi(e)) : 1;
        }();
        for (int r = 0; r < repeat; ++r) {
            sparse_idx_list_launch((const float *) src0->data, n, (int) n_tokens, x_stride, threshold,
                    (int32_t *) dst->data, scratch.get(), stream, r == 0 ? stats : nullptr);
        }
    } else {
        GGML_ASSERT(mode == GGML_SPARSE_IDX_MASK);
        GGML_ASSERT(dst->type == GGML_TYPE_F32 && dst->ne[0] == n && dst->ne[1] == n_tokens);
        GGML_ASSERT(dst->nb[0] == sizeof(float) && dst->nb[1] % sizeof(float) == 0);
        sparse_idx_mask_launch((const float *) src0->data, n, n_tokens, x_stride, threshold,
                (float *) dst->data, dst->nb[1]/sizeof(float), stream);
    }
}
#endif // GGML_SPARSE_CUDA_STANDALONE
