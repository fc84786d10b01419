// llama-sparse: ggml-level ops for TEAL activation sparsity on zigzag weights.
//
// Zigzag layout (format v1): a weight W with m output rows and n input columns
// (logical ggml ne = [n, m]) and block type T of block size B is stored as a
// tensor of type T with ne = [B*n, m/B]. Stored block j of stored row r holds
// W[r*B .. r*B+B-1, j], quantized as ggml quantizes one row of B values.
#pragma once

#include "ggml.h"

#ifdef __cplusplus
extern "C" {
#endif

// at most this many tokens use the sparse decode path (union of active columns)
#define GGML_SPARSE_MAX_BATCH 8

// GGML_OP_SPARSE_IDX modes (op_params[1])
enum ggml_sparse_idx_mode {
    GGML_SPARSE_IDX_LIST = 0, // dst: I32 [n + 1]: dst[0..count) ascending active columns, dst[n] = count
    GGML_SPARSE_IDX_MASK = 1, // dst: F32 like x, with |x| < threshold set to 0 per token (emulation path)
};

// zigzag weights are tagged through op_params of the (leaf) weight tensor
#define GGML_SPARSE_ZZ_MAGIC 0x5a5a0001

// tag / query a weight tensor as zigzag; layer and group (0 = qkv, 1 = o, 2 = gate/up, 3 = down) are kept
GGML_API void ggml_sparse_set_zigzag(struct ggml_tensor * w, int32_t layer, int32_t group);
GGML_API bool ggml_sparse_is_zigzag (const struct ggml_tensor * w);
GGML_API int32_t ggml_sparse_zigzag_layer(const struct ggml_tensor * w);
GGML_API int32_t ggml_sparse_zigzag_group(const struct ggml_tensor * w);

// logical shape of a zigzag weight: n input columns, m output rows
GGML_API int64_t ggml_sparse_zz_n(const struct ggml_tensor * w);
GGML_API int64_t ggml_sparse_zz_m(const struct ggml_tensor * w);

// true if type can be stored zigzag (Q4_0, Q8_0, Q4_K, Q6_K)
GGML_API bool ggml_sparse_zz_type_ok(enum ggml_type type);

// counters an index-list op adds to on the CPU (atomically), if attached
struct ggml_sparse_stats {
    uint64_t n_lists;
    uint64_t n_cols;
    uint64_t n_active;
};

// op_params[4] of a LIST-mode idx op: nonzero = every consumer is a MUL_MAT_ZZ whose weight sits in device
// memory, so a backend that finds the active columns inside its matmul (CUDA) may skip this op; such a
// backend's matmul must then rebuild the list itself whenever it does not fuse. CPU ignores it.
#define GGML_SPARSE_IDX_PARAM_LAZY 4

// attach counters to a LIST-mode idx op (op_params[2..3] hold the pointer)
GGML_API void                       ggml_sparse_idx_set_stats(struct ggml_tensor * idx, struct ggml_sparse_stats * stats);
GGML_API struct ggml_sparse_stats * ggml_sparse_idx_get_stats(const struct ggml_tensor * idx);

// active columns of x (F32 [n, n_tokens], n_tokens <= GGML_SPARSE_MAX_BATCH):
// those where |x[t, j]| >= threshold for any token t (LIST), or x masked per token (MASK)
GGML_API struct ggml_tensor * ggml_sparse_idx(
        struct ggml_context * ctx,
        struct ggml_tensor  * x,
        float                 threshold,
        enum ggml_sparse_idx_mode mode);

// y = W x for a zigzag W (src0), x F32 [n, n_tokens] (src1); idx (src2, optional) is the
// output of ggml_sparse_idx(LIST) for x: only the listed columns are read. dst: F32 [m, n_tokens]
GGML_API struct ggml_tensor * ggml_mul_mat_zz(
        struct ggml_context * ctx,
        struct ggml_tensor  * w,
        struct ggml_tensor  * x,
        struct ggml_tensor  * idx);

#ifdef __cplusplus
}
#endif
