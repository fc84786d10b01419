// llama-sparse: GGML_OP_SPARSE_IDX on CUDA (active-column list or per-token mask of activations).
#pragma once

#include "ggml-cuda/common.cuh"

#define SPARSE_IDX_MAX_TOKENS 8 // == GGML_SPARSE_MAX_BATCH

// the keep test of every CUDA kernel, as on the CPU and Metal: !(|v| < thr), so a NaN stays active as in the dense
// product, and thr 0 keeps every column
static __device__ __forceinline__ bool sparse_active(const float v, const float thr) {
    return !(fabsf(v) < thr);
}

// exclusive scan of one int per thread over the block; every thread of the block calls it. s_tmp: one int
// per warp of shared memory (free to reuse after the call returns); *total = the block's sum
static __device__ __forceinline__ int sparse_block_excl_scan(const int v, int * s_tmp, int * total) {
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE, nw = blockDim.x / WARP_SIZE;
    const int incl = warp_prefix_inclusive_sum<int>(v);
    __syncthreads(); // earlier readers of s_tmp are done
    if (lane == WARP_SIZE - 1) {
        s_tmp[warp] = incl;
    }
    __syncthreads();
    if (warp == 0) {
        const int w = lane < nw ? s_tmp[lane] : 0;
        s_tmp[lane] = warp_prefix_inclusive_sum<int>(w);
    }
    __syncthreads();
    const int excl = incl - v + (warp > 0 ? s_tmp[warp - 1] : 0);
    *total = s_tmp[nw - 1];
    __syncthreads(); // s_tmp may be rewritten by the caller
    return excl;
}

// llama_sparse_get_stats on the GPU: each idx op's counters are 3 u64 in device memory ([0] sets found, [1] columns
// examined, [2] columns kept), added to by the one launch that finds its active columns: the LIST kernel, or the
// first FUSED matmul of a lazy list. Thread 0 of the block that knows the count does it (kernels that split the count
// over their blocks add the rest to [2] themselves).
static __device__ __forceinline__ void sparse_stats_add(unsigned long long * stats, const int n, const int active) {
    atomicAdd(stats + 0, 1ull);
    atomicAdd(stats + 1, (unsigned long long) n);
    if (active != 0) {
        atomicAdd(stats + 2, (unsigned long long) active);
    }
}

// LIST: dst[0..count) = ascending columns j with |x[t*x_stride + j]| >= threshold for some t < n_tokens,
// dst[n] = count. Graph safe (no host reads, no memset). scratch: sparse_idx_list_scratch_size(n, n_tokens)
// int32 of device memory (0 = none needed, scratch may be NULL).
int64_t sparse_idx_list_scratch_size(int64_t n, int n_tokens);
// stats: the idx op's device counters (sparse_stats_add), or nullptr
void    sparse_idx_list_launch(const float * x, int64_t n, int n_tokens, int64_t x_stride, float threshold,
        int32_t * dst, int32_t * scratch, cudaStream_t stream, unsigned long long * stats = nullptr);

// MASK: dst[r*dst_stride + j] = |x| < threshold ? 0 : x for n columns and n_rows rows
void    sparse_idx_mask_launch(const float * x, int64_t n, int64_t n_rows, int64_t x_stride, float threshold,
        float * dst, int64_t dst_stride, cudaStream_t stream);

#ifndef GGML_SPARSE_CUDA_STANDALONE
// GGML_OP_SPARSE_IDX: src0 x F32 [n, n_tokens]; op_params[0] threshold (float), op_params[1] mode
void ggml_cuda_op_sparse_idx(ggml_backend_cuda_context & ctx, ggml_tensor * dst);

// LLAMA_SPARSE_CUDA_FUSE unset (auto) or 1: index collection inside the GEMV for lists the graph marked lazy
bool sparse_idx_cuda_fuse_enabled();
// LLAMA_SPARSE_CUDA_FUSE=1: also the staged kernel's fused mode (auto: only the direct Q4_K kernel fuses)
bool sparse_idx_cuda_fuse_forced();
// idx is a LIST op marked lazy (GGML_SPARSE_IDX_PARAM_LAZY) and fusion is on: the op itself writes nothing,
// its MUL_MAT_ZZ consumers fuse or rebuild the list
bool sparse_idx_cuda_lazy(const ggml_tensor * idx);

// the device counters of a LIST op's ggml_sparse_stats on the current device (nullptr: none attached, or no slot
// left). They are folded into the host struct by ggml_sparse_stats_collect.
unsigned long long * sparse_idx_stats_dev(const ggml_tensor * idx);
// a lazy LIST op leaves its counters to the first of its matmuls that finds the columns itself: take them (nullptr
// if the op did not run here or another matmul took them), and give them back if that launch then declines
unsigned long long * sparse_idx_stats_take(const ggml_tensor * idx);
void                 sparse_idx_stats_give_back(const ggml_tensor * idx, unsigned long long * stats);
#endif // GGML_SPARSE_CUDA_STANDALONE
