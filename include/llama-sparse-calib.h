// llama-sparse: activation statistics for TEAL threshold calibration (`llama-sparse calibrate`).
//
// Run a dense context with cb_eval = llama_sparse_calib_eval_cb and cb_eval_user_data = the calib
// object; every zigzag matmul input x is then folded into per-(layer, group) histograms of |x| and of
// the error mass x_j^2 * ||W[:, j]||^2 (summed over the group's weights). Memory is bounded: the
// histograms do not grow with the number of tokens.
#pragma once

#include "llama.h"

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct ggml_tensor;
struct llama_sparse_calib;

// what llama_sparse_calib_sample_* can keep per layer: the four matmul inputs (numbered like
// enum llama_sparse_group) and the residual stream entering each of the block's two RMS norms
enum llama_sparse_calib_point {
    LLAMA_SPARSE_CALIB_QKV_INPUT        = 0, // = LLAMA_SPARSE_GROUP_QKV
    LLAMA_SPARSE_CALIB_O_INPUT          = 1,
    LLAMA_SPARSE_CALIB_GATE_UP_INPUT    = 2,
    LLAMA_SPARSE_CALIB_DOWN_INPUT       = 3,
    LLAMA_SPARSE_CALIB_ATTN_RESIDUAL    = 4, // block input h: qkv input = rms_norm(h) * attn_norm
    LLAMA_SPARSE_CALIB_FFN_RESIDUAL     = 5, // h + attention output: gate/up input = rms_norm(.) * ffn_norm
    LLAMA_SPARSE_CALIB_POINT_COUNT      = 6,
};

// statistics for every zigzag weight of model (which must outlive the object); the squared column
// norms of the weights are computed here, once. bins_per_octave: resolution of the log-spaced |x|
// histogram, rounded down to a power of two in [1, 1024] (0 = default 64, about 1.1% per bin).
// NULL on error (a model without zigzag weights), see llama_sparse_calib_last_error.
LLAMA_API struct llama_sparse_calib * llama_sparse_calib_new (const struct llama_model * model, int32_t bins_per_octave);
LLAMA_API void                        llama_sparse_calib_free(struct llama_sparse_calib * calib);

// a ggml_backend_sched_eval_callback: asks for each zigzag matmul (once per shared input) and folds
// its input into the histograms. Never stops the graph; failures are kept for llama_sparse_calib_error.
LLAMA_API bool llama_sparse_calib_eval_cb(struct ggml_tensor * t, bool ask, void * user_data);

// "" while everything is fine, else the first failure seen by the callback
LLAMA_API const char * llama_sparse_calib_error(const struct llama_sparse_calib * calib);

// message of the last failed llama_sparse_calib_* call on this thread
LLAMA_API const char * llama_sparse_calib_last_error(void);

LLAMA_API void     llama_sparse_calib_reset   (struct llama_sparse_calib * calib); // forget the statistics
LLAMA_API int32_t  llama_sparse_calib_n_layer (const struct llama_sparse_calib * calib);
LLAMA_API uint64_t llama_sparse_calib_n_tokens(const struct llama_sparse_calib * calib); // tokens seen (first group)

// per (layer, group): input width (0: the group has no zigzag weight), bytes of its zigzag weights,
// and the number of |x| values counted
LLAMA_API int64_t  llama_sparse_calib_n_cols      (const struct llama_sparse_calib * calib, int32_t layer, int32_t group);
LLAMA_API uint64_t llama_sparse_calib_weight_bytes(const struct llama_sparse_calib * calib, int32_t layer, int32_t group);
LLAMA_API uint64_t llama_sparse_calib_n_values    (const struct llama_sparse_calib * calib, int32_t layer, int32_t group);

// threshold t whose share of |x| < t is `sparsity` (the s-quantile of |x|, interpolated in its bin;
// 0 for sparsity <= 0), and rel_error = share of the error mass sum x_j^2 ||W[:, j]||^2 that skipping
// those columns drops. Returns 0, or -1 for bad arguments or a group without data.
LLAMA_API int32_t llama_sparse_calib_threshold(const struct llama_sparse_calib * calib, int32_t layer, int32_t group,
                                               float sparsity, float * threshold, float * rel_error);

// the inverse: share of |x| below threshold and the error mass share it drops. 0 or -1 as above.
LLAMA_API int32_t llama_sparse_calib_sparsity_at(const struct llama_sparse_calib * calib, int32_t layer, int32_t group,
                                                 float threshold, float * sparsity, float * rel_error);

// copy the raw histogram of (layer, group): counts, error mass and lower bin edges (upper edge of bin
// i = lower edge of bin i + 1; bin 0 starts at 0, the last bin collects everything larger).
// Any pointer may be NULL. Returns the number of bins (copies at most n of each), -1 on bad arguments.
LLAMA_API int32_t llama_sparse_calib_histogram(const struct llama_sparse_calib * calib, int32_t layer, int32_t group,
                                               double * counts, double * mass, float * lower_edges, int32_t n);

// Row sampling, for greedy allocation (memory: n_slots * n_rows * width floats per sampled (layer, point)).
// init: keep up to n_slots batches of their first n_rows rows, of the points in the bit mask `points`
// (bit p = point p); it drops any earlier sample. Residuals are found as the source of the RMS norm that
// feeds the qkv / gate-up matmul; a block of another shape leaves them empty (width 0). 0 or -1.
LLAMA_API int32_t llama_sparse_calib_sample_init(struct llama_sparse_calib * calib, int32_t n_slots, int64_t n_rows,
                                                 uint32_t points);
// the batches decoded from now on are stored in `slot` (replacing what it held), or nowhere with -1. 0 or -1.
LLAMA_API int32_t llama_sparse_calib_sample_slot(struct llama_sparse_calib * calib, int32_t slot);
// floats per row of (layer, point), 0 if nothing was sampled there; rows held by a slot
LLAMA_API int64_t llama_sparse_calib_sample_width(const struct llama_sparse_calib * calib, int32_t layer, int32_t point);
LLAMA_API int64_t llama_sparse_calib_sample_rows (const struct llama_sparse_calib * calib, int32_t layer, int32_t point,
                                                  int32_t slot);
// copy at most max_rows rows (row-major, width floats each) of a slot to dst; returns the rows copied or -1
LLAMA_API int64_t llama_sparse_calib_sample_get  (const struct llama_sparse_calib * calib, int32_t layer, int32_t point,
                                                  int32_t slot, float * dst, int64_t max_rows);

#ifdef __cplusplus
}
#endif
