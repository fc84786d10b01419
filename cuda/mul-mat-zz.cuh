// llama-sparse: y = W x for zigzag-stored weights (GGML_OP_MUL_MAT_ZZ), CUDA backend.
//
// Zigzag layout (ggml-sparse/ggml-sparse.h): W with m output rows and n input columns, block type with
// block size B, is stored with ne = [B*n, m/B]; block j of block-row r holds W[r*B .. r*B+B-1, j].
// Decode (n_tokens <= ZZ_GEMV_MAX_BATCH) runs the GEMV kernel below, dense or over an index list of
// active columns; prefill dequantizes tiles to f16 and calls cuBLAS.
#pragma once

#include "ggml-cuda/common.cuh"

#define ZZ_GEMV_MAX_BATCH 8   // == GGML_SPARSE_MAX_BATCH
#define ZZ_GEMV_MAX_WARPS 8   // n2 <= this (256 threads): keeps 255 registers per thread for batch 8
#define ZZ_PREFILL_MIN_BATCH 16 // from this batch on (no idx) dequantize + cuBLAS, below it GEMV per 8 tokens
#define ZZ_GROUP_MAX 4          // weights in one grouped GEMV launch

enum zz_gemv_mode {
    ZZ_GEMV_DENSE = 0, // every column
    ZZ_GEMV_IDX   = 1, // the columns listed in idx (I32 [n + 1], count in idx[n]), split evenly over the workers
    ZZ_GEMV_SKIP  = 2, // ablation: every column visited, columns with x == 0 for all tokens skipped in place
    ZZ_GEMV_FUSED = 3, // no list: each block finds the columns with |x| >= thr for any token itself (a ballot
                       // word per 32 columns, a popcount scan) and keeps its even share of them in shared memory
};

// how one block-row of B outputs is spread over the GPU
struct zz_gemv_config {
    int n1;      // thread blocks per block-row; they split the row's (active) columns evenly
    int n2;      // warps per thread block
    int cluster; // n1 > 1 only: 1 = the n1 blocks reduce through a thread block cluster (sm_90, n1 <= 8),
                 //               0 = as LLAMA_SPARSE_CUDA_TICKET says (mul-mat-zz.cu): dst zeroed first and
                 //                   atomicAdd (0), partials summed by the last block (1), the first block to
                 //                   arrive stores (2) or the first to start zeroes (3) and the rest atomicAdd,
                 //                   4 (default) = 3 for the direct kernel, else 0
};

// process-wide choice of the cross-block reduction when not a cluster (0-4 as LLAMA_SPARSE_CUDA_TICKET),
// -1 = back to LLAMA_SPARSE_CUDA_TICKET (default 4). Returns the previous override (tests, benchmarks).
int zz_gemv_set_ticket(int on);

// ticket counters of this stream (current device) that are not zero after the stream's work so far (synchronizes
// the stream); every launch must leave them at zero. -1: no ticket buffers on this stream yet.
int64_t zz_gemv_ticket_nonzero(cudaStream_t stream);

// drop this stream's ticket buffers from the lookup (not freed): its next ticket GEMV makes new ones. For tests
// that need a stream without buffers, as a new stream may reuse a destroyed stream's handle.
void zz_gemv_ticket_forget(cudaStream_t stream);

bool zz_type_supported(ggml_type type);

// Zigzag Q4_0 and Q8_0 regrouped in device memory (GGML_SPARSE_ZZ_LAYOUT_G256, cuda/zz-g8.cuh): 256-row super-blocks
// that the direct Q4_K kernel runs. Not ggml types: only the GEMV, prefill and tune entry points here take them, in
// place of the weight's type (zz_kernel_type), with the weight's logical n and m; ggml_* type functions must not
// see them.
#define ZZ_TYPE_Q4_0_G8 ((ggml_type) (GGML_TYPE_COUNT + 1))
#define ZZ_TYPE_Q8_0_G8 ((ggml_type) (GGML_TYPE_COUNT + 2))

// the type the GEMV entry points take for weight w: its own, or ZZ_TYPE_Q4_0_G8 / ZZ_TYPE_Q8_0_G8
ggml_type zz_kernel_type(const ggml_tensor * w);
// outputs a block (B), bytes a block, and a name, of a type the entry points take
int64_t      zz_blck_size(ggml_type type);
size_t       zz_block_bytes(ggml_type type);
const char * zz_type_name(ggml_type type);

// Q4_0 or Q8_0 (type) zigzag weight [n columns, m rows] (m % 256 == 0) at w, in the file's layout, rewritten to G8 in
// place on stream, which is synchronized. Uses a temporary device buffer of at most 64 MiB. False (w unchanged) on an
// error.
bool zz_regroup(ggml_type type, void * w, int64_t n, int64_t m, cudaStream_t stream);

// tuned config for this shape class (cuda-tune.txt), else a heuristic; env LLAMA_SPARSE_CUDA_N1/N2/CLUSTER override
zz_gemv_config zz_gemv_get_config(int device, ggml_type type, int64_t n, int64_t m, int n_tokens);

// the GEMV: y[t*y_stride + i] = sum_j W[i, j] * x[t*x_stride + j], 1 <= n_tokens <= ZZ_GEMV_MAX_BATCH.
// Strides in elements. idx is required for ZZ_GEMV_IDX and ignored otherwise. No host synchronization.
void zz_gemv_launch_ex(ggml_type type, const void * w, int64_t n, int64_t m,
        const float * x, int64_t x_stride, int n_tokens, const int32_t * idx, zz_gemv_mode mode,
        float * y, int64_t y_stride, zz_gemv_config cfg, cudaStream_t stream);

// FUSED mode (index collection inside the GEMV): active columns are those with |x| >= thr for any token, as
// in the LIST op. The direct Q4_K kernel always fuses; other types (the ldg kernel, or the staged one) run their
// fused mode, where every block finds its share of the list, only with allow_staged and when that share fits in
// shared memory (n/n1 up to ~16k columns).
// Returns false when nothing was launched; the caller then runs the LIST op and ZZ_GEMV_IDX.
bool zz_gemv_launch_fused(ggml_type type, const void * w, int64_t n, int64_t m,
        const float * x, int64_t x_stride, int n_tokens, float thr,
        float * y, int64_t y_stride, zz_gemv_config cfg, bool allow_staged, cudaStream_t stream,
        unsigned long long * stats = nullptr); // stats: the idx op's device counters (sparse_stats_add)

// whether a FUSED launch of this type and batch adds to its stats counters: not the direct Q4_K kernel at 2-8
// tokens (cuda/README.md, Counters)
bool zz_gemv_fused_counts(ggml_type type, int n_tokens);

// one weight of a grouped launch: W [m outputs], y[t*y_stride + i]
struct zz_gemv_seg {
    const void  * w;
    int64_t       m;
    float       * y;
    int64_t       y_stride;
    const float * bias        = nullptr; // y = W x + bias (a fused residual add; direct Q4_K kernel only)
    int64_t       bias_stride = 0;
    int           y_ready     = 0;       // 1: y holds its start value already (0, or the residual an earlier launch
                                         // copied there): the launch only adds W x (atomics, no bias, no zeroing,
                                         // no protocol between blocks). Every segment of a launch alike; direct only
};

// an RMS norm folded into a launch's read of x (direct Q4_K kernel, DENSE and FUSED): it reads x_t/rms(x_t)*w, rms
// as ggml_rms_norm with eps (the fused RMS_NORM + MUL before q/k/v or gate/up)
struct zz_gemv_norm {
    const float * w;
    float         eps;
    // upkeep for outputs that accumulate (y_ready), done by the launch's blocks after its PDL wait: x as read (not
    // normed) copied to x_copy and, if set, to x_copy2 (both of row stride x_copy_stride), and clear_n floats at
    // clear set to 0
    float       * x_copy        = nullptr;
    int64_t       x_copy_stride = 0;
    float       * x_copy2       = nullptr;
    float       * clear         = nullptr;
    int64_t       clear_n       = 0;
};

// the G8 layouts (Q4_0, Q8_0) read a folded norm or a fused SwiGLU up to this batch (decode's; the kernel instances
// for larger batches would add to the build and are not made)
#define ZZ_G8_IN_MAX_T 1

// y_s = W_s x for up to ZZ_GROUP_MAX weights of the same type and width n that read the same x (and idx, or thr for
// FUSED) in one launch: their block-rows one after another in the grid, cfg for the summed rows, one zero kernel
// for all outputs under memset + atomics. On the direct kernel only: Q4_K, or Q4_0 / Q8_0 in the G8 layout (with a
// norm up to batch ZZ_G8_IN_MAX_T); false (nothing launched) otherwise.
bool zz_gemv_launch_group(ggml_type type, const zz_gemv_seg * seg, int nseg, int64_t n,
        const float * x, int64_t x_stride, int n_tokens, const int32_t * idx, zz_gemv_mode mode, float thr,
        zz_gemv_config cfg, cudaStream_t stream, const zz_gemv_norm * norm = nullptr,
        unsigned long long * stats = nullptr); // stats: FUSED, as in zz_gemv_launch_fused

// y = W silu(gate)*up (a SwiGLU fused into the read of x, as decode's down launch; unary.cuh's expression), one weight,
// DENSE or FUSED (|silu(gate)*up| >= thr); seg.bias / y_ready as in zz_gemv_seg. Direct kernel only: Q4_K, or Q4_0 /
// Q8_0 in the G8 layout up to batch ZZ_G8_IN_MAX_T; false (nothing launched) otherwise.
bool zz_gemv_launch_glu(ggml_type type, const zz_gemv_seg & seg, int64_t n, const float * gate, int64_t g_stride,
        const float * up, int64_t up_stride, int n_tokens, zz_gemv_mode mode, float thr, zz_gemv_config cfg,
        cudaStream_t stream);

// the same with the config of zz_gemv_get_config and mode DENSE (idx == NULL) or IDX; contiguous x and y
void zz_gemv_launch(ggml_type type, const void * w, int64_t n, int64_t m,
        const float * x, int64_t x_stride, int n_tokens, const int32_t * idx, float * y, cudaStream_t stream);

// prefill: dequantize block-rows [row0, row0 + nrows) (in outputs; multiples of B) to f16, row-major [nrows, n]
void zz_dequant_f16_launch(ggml_type type, const void * w, int64_t n, int64_t row0, int64_t nrows,
        half * dst, cudaStream_t stream);

// prefill scratch: f16 elements needed for the weight tile and for x
int64_t zz_prefill_tile_rows(ggml_type type, int64_t n, int64_t m);
int64_t zz_prefill_tmp_w_size(ggml_type type, int64_t n, int64_t m);
int64_t zz_prefill_tmp_x_size(int64_t n, int n_tokens);

// prefill: y = W x for any n_tokens through f16 tiles and cublasGemmEx (fp32 accumulation);
// tmp_w, tmp_x sized by the functions above. handle must be bound to stream.
void zz_prefill_launch(ggml_type type, const void * w, int64_t n, int64_t m,
        const float * x, int64_t x_stride, int n_tokens, float * y, int64_t y_stride,
        half * tmp_w, half * tmp_x, cublasHandle_t handle, cudaStream_t stream);

// times GEMV candidates (n1, n2, cluster) on the device for the given shapes (pairs m, n), each in its type
// (shape_types[i]; NULL: every supported type, $LLAMA_SPARSE_CUDA_TUNE_TYPES limiting them) and batch 1, 2, 4, 8
// up to max_tokens, as decode runs them (the fused or listed GEMV at the given sparsity plus the dense one,
// weights rotated through more than L2 holds), and writes the best per shape class (type, log2 block-rows,
// log2 n, batch) to path (NULL: $LLAMA_SPARSE_CUDA_TUNE_FILE or ~/.cache/llama-sparse/cuda-tune.txt), keeping
// other devices' entries. Returns the number of entries written for this device, or -1 on error.
int ggml_cuda_zz_autotune(int device, const int64_t * shapes_mn, int n_shapes, int max_tokens, float sparsity,
        const char * path, const ggml_type * shape_types = nullptr);

// the same for the Python tools (ctypes on libggml-cuda; types as ggml_type values, NULL as above), checking its
// arguments (-1 and a logged error, not an abort)
extern "C" GGML_BACKEND_API int llama_sparse_cuda_autotune(int device, const int64_t * shapes_mn, const int32_t * types,
        int n_shapes, int max_tokens, float sparsity, const char * path);

#ifndef GGML_SPARSE_CUDA_STANDALONE
// GGML_OP_MUL_MAT_ZZ: src0 zigzag W, src1 x F32 [n, n_tokens], src2 idx I32 [n + 1] or NULL, dst F32 [m, n_tokens]
void ggml_cuda_op_mul_mat_zz(ggml_backend_cuda_context & ctx, ggml_tensor * dst);

// the MUL_MAT_ZZ nodes dst[0..count) (same x, idx, weight type and width; ggml_sparse_zz_siblings) as one GEMV
// launch at decode; false (nothing launched) when the group has no grouped kernel (then run them one by one)
// (norm: a deferred RMS norm their x is, ggml_cuda_zz_norm_defer; they then read its input; cgraph, i_last: the
// graph and the group's last node, for LLAMA_SPARSE_CUDA_ACC's look at the nodes after it)
bool ggml_cuda_op_mul_mat_zz_group(ggml_backend_cuda_context & ctx, ggml_tensor * const * dst, int count,
        const struct zz_norm_defer * norm = nullptr, ggml_cgraph * cgraph = nullptr, int i_last = -1);

// node i and its neighbours as one GEMV launch of the direct Q4_K kernel, where the graph allows it:
//   [GLU (SwiGLU) [, SPARSE_IDX (lazy)]], MUL_MAT_ZZ [, ADD]
// the SwiGLU is computed where the GEMV reads x, the ADD (a residual) is added where it writes y; the nodes
// left out must have no other users. Returns the number of nodes run from i on, 0 when it ran nothing.
// LLAMA_SPARSE_CUDA_FUSE_OPS=0 (or GGML_CUDA_DISABLE_FUSION) turns it off.
int ggml_cuda_op_mul_mat_zz_fuse(ggml_backend_cuda_context & ctx, const ggml_cgraph * cgraph, int i,
        const struct zz_norm_defer * norm = nullptr);

// An RMS norm folded into the zigzag GEMVs that read it: RMS_NORM, MUL (by the norm weight) [, SPARSE_IDX
// (lazy)], MUL_MAT_ZZ (q/k/v or gate/up, one launch), the norm and the MUL left out and every launch block finding
// the token's 1/rms itself. At an RMS_NORM (node i): returns how many nodes it leaves out (0: none) and records
// them for the matmul node that reads them; that node takes them with ggml_cuda_zz_norm_take and passes them to
// the group / fuse launch, or runs them with ggml_cuda_zz_norm_run when its launch declines.
// On by default: LLAMA_SPARSE_CUDA_NORM_FUSE=0 (or GGML_CUDA_DISABLE_FUSION) turns it off.
struct zz_norm_defer {
    const ggml_backend_cuda_context * ctx;
    const ggml_cgraph               * graph;
    int                               i_mm;  // the first matmul reading it (the launch's place)
    ggml_tensor                     * rms;   // RMS_NORM, not run
    ggml_tensor                     * mul;   // MUL by the norm weight, not run: what the matmuls read
    const float                     * x_alt = nullptr; // x not yet written: read it here (LLAMA_SPARSE_CUDA_ACC & 2)

    const ggml_tensor * x() const { return rms->src[0]; }                                      // the norm's input
    const ggml_tensor * w() const { return mul->src[0] == rms ? mul->src[1] : mul->src[0]; } // the norm weight [n]
    zz_gemv_norm params() const {
        float eps;
        memcpy(&eps, rms->op_params, sizeof(float));
        return { (const float *) w()->data, eps };
    }
};
// whether the graph hook runs sibling matmuls as one launch (LLAMA_SPARSE_CUDA_GROUP, read once)
bool ggml_cuda_zz_group_enabled();

int  ggml_cuda_zz_norm_defer(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, int i);
// at every node the graph hook sees: o's output carried in a private buffer is written out unless this node is the
// RMS norm that takes it (LLAMA_SPARSE_CUDA_ACC & 2)
void ggml_cuda_zz_res_node(ggml_backend_cuda_context & ctx, const ggml_cgraph * cgraph, const ggml_tensor * node);
bool ggml_cuda_zz_norm_take(ggml_backend_cuda_context & ctx, const ggml_cgraph * cgraph, int i, zz_norm_defer & out);
void ggml_cuda_zz_norm_run(ggml_backend_cuda_context & ctx, const zz_norm_defer & nd);
#endif // GGML_SPARSE_CUDA_STANDALONE
