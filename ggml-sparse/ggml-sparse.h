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

// runtime layout of a zigzag weight's blocks (the file always holds ROWS; docs/format.md). The CPU repacks
// Q4_K weights to COLS at load where it has a kernel for it (src/llama-sparse.cpp): each column's blocks
// of all block-rows form one contiguous run, so a skipped column skips the run. Kept in op_params[3]
// of the weight; backends that read only ROWS must refuse the others in supports_op.
#define GGML_SPARSE_ZZ_PARAM_LAYOUT 3
#define GGML_SPARSE_ZZ_LAYOUT_ROWS  0 // block (r, j) at r*n + j (the file's)
#define GGML_SPARSE_ZZ_LAYOUT_COLS  1 // block (r, j) at j*nr + r, nr = m/B block-rows
#define GGML_SPARSE_ZZ_LAYOUT_G256  2 // CUDA, Q4_0 / Q8_0: the 8 blocks of a column in block-rows 8r..8r+7 as one
                                      // 144- / 272-byte super-block (r, j) at r*n + j (cuda/zz-g8.cuh)

static inline int32_t ggml_sparse_zz_layout(const struct ggml_tensor * w) {
    return w->op_params[GGML_SPARSE_ZZ_PARAM_LAYOUT];
}

static inline void ggml_sparse_zz_set_layout(struct ggml_tensor * w, int32_t layout) {
    w->op_params[GGML_SPARSE_ZZ_PARAM_LAYOUT] = layout;
}

// Backends whose memory holds zigzag weights may give them a layout of their own once they are loaded: fn changes
// w's data and layout and returns true, or leaves both and returns false. ggml_sparse_zz_relayout asks each
// registered fn in turn (llama-sparse calls it for every zigzag weight outside host memory when a model's first
// context is made).
typedef bool (*ggml_sparse_zz_relayout_fn)(struct ggml_tensor * w);
GGML_API void ggml_sparse_zz_add_relayout(ggml_sparse_zz_relayout_fn fn);
GGML_API bool ggml_sparse_zz_relayout(struct ggml_tensor * w);

// true if type can be stored zigzag (Q4_0, Q8_0, Q4_K, Q6_K)
GGML_API bool ggml_sparse_zz_type_ok(enum ggml_type type);

// counters an index-list op adds to (atomically) where its active set is found, if attached
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

// counters a backend keeps in device memory (CUDA counts inside its kernels). A collector adds what its devices
// counted for stats since its last call to *stats (release: then drops its device counters for stats).
typedef void (*ggml_sparse_stats_collector)(struct ggml_sparse_stats * stats, bool release);
GGML_API void ggml_sparse_stats_add_collector(ggml_sparse_stats_collector fn);
// fold the device counters of stats into it (synchronizes the devices that counted)
GGML_API void ggml_sparse_stats_collect(struct ggml_sparse_stats * stats);
// the same, then no backend counts for stats any more: call before stats is freed
GGML_API void ggml_sparse_stats_release(struct ggml_sparse_stats * stats);

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

// Siblings of the MUL_MAT_ZZ node i of graph: later MUL_MAT_ZZ nodes within `window` nodes that read the same
// x and index list (src1, src2) through a weight of the same type and width (q/k/v, gate/up), for a backend
// that runs them as one launch at node i. A sibling joins only if running it at i is safe: no node between
// i and it touches memory that overlaps its output (the graph allocator reuses freed memory). Writes node
// indices to nodes[0..count) (nodes[0] = i) and returns count (1: no sibling, 0: node i is no MUL_MAT_ZZ).
GGML_API int ggml_sparse_zz_siblings(struct ggml_cgraph * graph, int i, int window, int * nodes, int max_nodes);

// An attention layer's RoPE and cache writes that a backend may run as one kernel (CUDA: cuda/rope-store.cu),
// starting at the ROPE node i: q's rope then k's (only views between), or k's alone, followed by these SET_ROWS
// in any order: K (a VIEW of k's rope output), V (rows that are not k's rope output) and, optionally, SparQ's
// transposed K (k's rope output RESHAPEd to 1-element rows, one i64 row id per element). k's rope output, its VIEW
// and RESHAPE must have no other reader (ggml_can_fuse_subgraph_ext). Checks the graph's structure and shapes only;
// types, strides and memory overlaps are the backend's to check. rq and skt may be NULL; last: the last node covered.
struct ggml_sparse_rs_nodes {
    struct ggml_tensor * rq, * rk, * sk, * sv, * skt;
    int last;
};
GGML_API bool ggml_sparse_rope_store_nodes(struct ggml_cgraph * graph, int i, struct ggml_sparse_rs_nodes * m);

// whether the data of a and b share bytes (false when either is NULL or has no data)
GGML_API bool ggml_sparse_mem_overlaps(const struct ggml_tensor * a, const struct ggml_tensor * b);

//
// SparQ attention (Ribar et al. 2023, "SparQ Attention: Bandwidth-Efficient LLM Inference"), decode op.
// Algorithm and KV-cache integration: docs/sparq.md. Op id GGML_OP_SPARQ_ATTN (patch 0001).
//
// Shapes follow ggml_flash_attn_ext. D = head size of q/K, Dv = head size of V, n_tok = query tokens,
// n_kv = cached positions (cells), H = q heads, Hkv = KV heads, G = H/Hkv (GQA group), ns = streams.
//
//   q      src[0] F32      [D,   n_tok, H,   ns]  any strides, nb[0] = 4 (a permuted view is fine)
//   k      src[1] F16|F32  [D,   n_kv,  Hkv, ns]  K rows; any strides, nb[0] = type size
//   k_t    src[2] F16|F32|Q8_0 [n_kv, D, Hkv, ns]  the same K transposed: position-contiguous per component
//                                                  (nb[0] = type size), any nb[1..3]; must equal k elementwise,
//                                                  or for Q8_0 be k quantized in blocks of 32 positions of one
//                                                  component (n_kv % 32 == 0; step 1 only reads k_t). Q8_0:
//                                                  with f16 K/V only (CPU, CUDA, Metal)
//   v      src[3] F16|F32  [Dv,  n_kv,  Hkv, ns]  V, any strides: nb[0] = type size for the row cache (flash
//                                                  attention on), nb[1] = type size for upstream's transposed V cache
//   mask   src[4] F16|F32  [n_kv, n_pad, 1, ns|1] additive, n_pad >= n_tok, contiguous rows (nb[0] = type size);
//                                                  upstream's kq_mask: 0 = visible, -INF = not; required
//   v_mean src[5] F32      [Dv,  Hkv, n_tok|1, ns|1] mean of V over the positions the token sees (broadcast
//                                                  over dims 2/3 when 1); NULL allowed unless GGML_SPARQ_MEAN_V
//   dst           F32      [Dv,  H,   n_tok, ns]  contiguous (permuted like flash_attn_ext's result)
//
// q head h reads KV head h / G (ggml's broadcast rule). Query token t of stream s sees the positions j with
// mask[j, t, 0, s] > -INF; several sequences in one stream (unified KV cache) are separated by the mask alone.
//
// op_params (int32 slots): [0] scale (float bits; the model's kq_scale, 1/sqrt(D) for plain attention)
//                          [1] r  >= 1 (components of q kept in step 1; r >= D keeps all)
//                          [2] k  >= 1 (positions kept in step 2)
//                          [3] flags (enum ggml_sparq_flags)
//
// Per KV head kh, token t, stream s, with the G q heads h of the group and V the visible positions:
//   1. i1 = top-r components of sum_h |q_h| (ties: lower index first). For each h:
//        rho_h   = ||q_h[i1]||_1 / ||q_h||_1                  (1 when either norm is 0)
//        shat_h  = softmax_j(scale / sqrt(rho_h) * q_h[i1] . k_t[j, i1] + mask[j])   (j in V)
//      The temperature is the paper's sqrt(D * rho_h) when scale = 1/sqrt(D). Only the r rows of k_t are read.
//   2. i2 = top-k positions of sum_h shat_h[j] (ties: lower position first). For each h, exact attention
//        y_h = sum_{j in i2} softmax_j(scale * q_h . k[j] + mask[j]) v[j]
//   3. alpha_h = sum_{j in i2} shat_h[j]. With GGML_SPARQ_MEAN_V: out_h = alpha_h y_h + (1 - alpha_h) v_mean[kh],
//      otherwise out_h = y_h (the paper omits the blend for GQA models).
//   k >= |V| (per token): exact dense attention over V, no blend (equals flash_attn_ext up to rounding).
//   |V| = 0: out = 0.
// No ALiBi, softcap, sinks or KQ bias: graphs with those keep the dense path.
enum ggml_sparq_flags {
    GGML_SPARQ_MEAN_V = 1, // step 3: blend with v_mean by the approximate score mass alpha
};

GGML_API struct ggml_tensor * ggml_sparq_attn(
        struct ggml_context * ctx,
        struct ggml_tensor  * q,
        struct ggml_tensor  * k,
        struct ggml_tensor  * k_t,
        struct ggml_tensor  * v,
        struct ggml_tensor  * mask,
        struct ggml_tensor  * v_mean,
        float                 scale,
        int32_t               r,
        int32_t               k_top,
        int32_t               flags);

// the same computation composed of stock ggml ops (mul_mat, get_rows, soft_max, top_k, ...), so it runs on
// any backend; same arguments and result shape. Differences from the op: ties may resolve differently, and
// k >= |V| (but < n_kv) picks masked positions with zero weight instead of switching to dense (same value:
// alpha = 1); v must have nb[0] = type size. Used as a cross-check (tests) and as the design's proof on backends without the fused op.
GGML_API struct ggml_tensor * ggml_sparq_attn_ref(
        struct ggml_context * ctx,
        struct ggml_tensor  * q,
        struct ggml_tensor  * k,
        struct ggml_tensor  * k_t,
        struct ggml_tensor  * v,
        struct ggml_tensor  * mask,
        struct ggml_tensor  * v_mean,
        float                 scale,
        int32_t               r,
        int32_t               k_top,
        int32_t               flags);

#ifdef __cplusplus
}
#endif
