// llama-sparse: C API for TEAL activation sparsity on zigzag GGUF models.
// llama.h stays upstream's; everything the fork adds to the public API is here.
#pragma once

#include "llama.h"

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// zigzag GGUF format version this library reads
#define LLAMA_SPARSE_FORMAT_VERSION 1

// threshold groups: each layer has one threshold per group of weights sharing an input
enum llama_sparse_group {
    LLAMA_SPARSE_GROUP_QKV     = 0, // attn_q, attn_k, attn_v (attn_qkv)
    LLAMA_SPARSE_GROUP_O       = 1, // attn_output
    LLAMA_SPARSE_GROUP_GATE_UP = 2, // ffn_gate, ffn_up
    LLAMA_SPARSE_GROUP_DOWN    = 3, // ffn_down
    LLAMA_SPARSE_GROUP_COUNT   = 4,
};

// what sparse decode skipped, counted where it ran: on the CPU, and on CUDA and Metal inside the kernels (not
// counted: CUDA batches of 2-8 tokens through Q4_K weights). Reading or resetting synchronizes the context.
struct llama_sparse_stats {
    uint64_t n_lists;  // active-column sets found (one per matmul input at a decode step)
    uint64_t n_cols;   // columns examined for them
    uint64_t n_active; // columns kept (the rest were skipped)
};

// number of zigzag weights in the model (0: not a zigzag model)
LLAMA_API int32_t llama_sparse_model_n_zigzag(const struct llama_model * model);

// calibrated sparsity levels stored in the model
LLAMA_API int32_t      llama_sparse_model_n_levels     (const struct llama_model * model);
LLAMA_API const char * llama_sparse_model_level_name   (const struct llama_model * model, int32_t i); // e.g. "0.50", "greedy-0.50"
LLAMA_API float        llama_sparse_model_level_target (const struct llama_model * model, int32_t i); // e.g. 0.5
LLAMA_API float        llama_sparse_model_threshold    (const struct llama_model * model, int32_t i, int32_t il, enum llama_sparse_group group);

// choose the sparsity level of a context by name ("0.5", "0.50", "unified-0.5", "greedy-0.5");
// NULL, "", "0", "off" or "dense" select dense decoding. Takes effect at the next decode.
// returns 0 on success, -1 if the model has no such level (see llama_sparse_last_error)
LLAMA_API int32_t      llama_sparse_set_level(struct llama_context * ctx, const char * level);
LLAMA_API const char * llama_sparse_get_level(const struct llama_context * ctx); // "dense" when off

// apply the thresholds to batches larger than the decode limit too, by masking |x| < t per token
// before a dense matmul (an exact emulation of batch-1 sparse decode, for perplexity runs)
LLAMA_API void llama_sparse_set_emulate(struct llama_context * ctx, bool emulate);

LLAMA_API struct llama_sparse_stats llama_sparse_get_stats  (const struct llama_context * ctx);
LLAMA_API void                      llama_sparse_reset_stats(struct llama_context * ctx);

// message of the last failed llama_sparse_* call on this thread
LLAMA_API const char * llama_sparse_last_error(void);

// llama_tokenize that reports a C++ exception instead of letting it abort the process (e.g. a vocabulary
// without byte tokens meeting a character it lacks throws std::out_of_range). Returns what llama_tokenize
// returns, or INT32_MIN on bad arguments or an exception (see llama_sparse_last_error).
LLAMA_API int32_t llama_sparse_tokenize(const struct llama_vocab * vocab, const char * text, int32_t text_len,
                                        llama_token * tokens, int32_t n_tokens_max, bool add_special,
                                        bool parse_special);

//
// SparQ attention (docs/sparq.md): at decode (one query token per sequence) each KV head reads r components
// of every cached key, then full K and V rows of the k best positions only. Prefill stays dense, and so
// does a step with k >= the cached positions. Needs an f16/f32 KV cache that is not sliding-window or
// recurrent. The first enable allocates a transposed copy of K and per-sequence V sums beside the cache
// (kept current from then on, and rebuilt after a pause); never enabling costs nothing.
// The fork's tools honour LLAMA_SPARQ="r=32,k=128[,mean_v=1][,kt=q8_0][,min_kv=N|auto]" at context creation.
//

// r, k >= 1 turn SparQ on (r > head size keeps every component); r = k = 0 turns it off; mean_v blends the
// output with the mean of V by the estimated attention mass (the paper does it for MHA models only).
// Takes effect at the next decode. Returns 0, or -1 (see llama_sparse_sparq_last_error).
LLAMA_API int32_t llama_sparse_set_sparq(struct llama_context * ctx, int32_t r, int32_t k, bool mean_v);

// the same from a string: "r=32,k=128[,mean_v=1][,kt=q8_0][,min_kv=N|auto]", or "off" / "0" / "". The string sets
// every knob: kt left out is the K cache's type, min_kv left out auto.
LLAMA_API int32_t llama_sparse_set_sparq_str(struct llama_context * ctx, const char * spec);

// decode steps whose KV cache view (the used cells, rounded up to 256) holds fewer than min_kv positions run
// dense attention, exactly as with SparQ off: SparQ only where the context is long enough for it to pay. 0: from
// the first position. LLAMA_SPARSE_SPARQ_MIN_KV_AUTO (the default): where the op pays on the device that holds
// the layer's KV cache: from the first position on the CPU; on a GPU from the view whose K and V take 80 MiB a
// layer (Llama-3-8B shapes, f16: 20480 positions; H200 figures). Below min_kv the transposed K copy is not
// kept; the first step at min_kv rebuilds it from the K cache. Kept while SparQ is off. Returns 0, or -1 (see
// llama_sparse_sparq_last_error).
#define LLAMA_SPARSE_SPARQ_MIN_KV_AUTO (-1)
LLAMA_API int32_t llama_sparse_set_sparq_min_kv(struct llama_context * ctx, int32_t min_kv);
LLAMA_API int32_t llama_sparse_get_sparq_min_kv(const struct llama_context * ctx);

// storage of the transposed K that step 1 reads: GGML_TYPE_COUNT (the default) = the K cache's type, or
// GGML_TYPE_Q8_0 = 8 bits a component in blocks of 32 positions, 34/64 of f16's bytes, so that more of a
// budget goes to r. Q8_0 needs an f16 K cache whose size is a multiple of 32 (CPU, CUDA, Metal); every graph at
// or past min_kv requantizes the blocks it writes into, and a stale copy is rebuilt from the K cache. Kept for llama_sparse_set_sparq
// when SparQ is off; changing it reallocates the copy. Returns 0, or -1 (see llama_sparse_sparq_last_error).
LLAMA_API int32_t        llama_sparse_set_sparq_kt(struct llama_context * ctx, enum ggml_type kt);
LLAMA_API enum ggml_type llama_sparse_get_sparq_kt(const struct llama_context * ctx);

// true if SparQ is on; the knobs are written where the pointers are not NULL (0 when off)
LLAMA_API bool    llama_sparse_get_sparq(const struct llama_context * ctx, int32_t * r, int32_t * k, bool * mean_v);

// message of the last failed SparQ call on this thread
LLAMA_API const char * llama_sparse_sparq_last_error(void);

#ifdef __cplusplus
}
#endif
