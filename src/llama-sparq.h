// llama-sparse: SparQ attention in the KV cache and the graph (hooks called from patches 0007-0008).
// Design: docs/sparq.md. Nothing here costs anything while SparQ was never enabled on a cache.
#pragma once

#include "llama.h"
#include "llama-kv-cache.h"

#include <cstdint>

struct ggml_tensor;
struct llm_graph_context;

// per-cache state (transposed K copy, per-sequence V sums, knobs); owned by the cache through a shared_ptr
struct llama_sparq_kv;

// the hooks' access to llama_kv_cache / llama_kv_cache_context internals (a friend of both)
struct llama_sparq_access;

//
// KV cache hooks (patch 0007)
//

// end of the constructor: honours LLAMA_SPARQ="r=32,k=128[,mean_v=1]" (throws on a bad value)
void llama_sparq_kv_init(llama_kv_cache & kv);

// top of seq_rm: the V sums go stale if the call removes any cell
void llama_sparq_kv_on_seq_rm(llama_kv_cache & kv, llama_seq_id seq_id, llama_pos p0, llama_pos p1);

// seq_cp, seq_keep, clear, state_read, update: what the call may change (K values, sequence membership)
void llama_sparq_kv_stale(llama_kv_cache & kv, bool k_changed, bool v_changed);

// top of apply_ubatch: overwriting occupied cells changes sequence membership
void llama_sparq_kv_on_apply(llama_kv_cache & kv, const llama_kv_cache::slot_info & sinfo);

//
// graph hooks (patch 0008, llm_graph_context::build_attn with a KV cache)
//

// after K and V are stored: keep the transposed K copy and the V sums up to date (no-op when off)
void llama_sparq_build_store(const llm_graph_context & g, const llama_kv_cache_context * mctx,
                             ggml_tensor * k_cur, ggml_tensor * v_cur, ggml_tensor * k_idxs, int il);

// the attention output [n_embd_head_v*n_head, n_tokens] through GGML_OP_SPARQ_ATTN, or nullptr where the dense
// path must run (off, prefill, k >= cached positions, unsupported attention variant)
ggml_tensor * llama_sparq_build_attn(const llm_graph_context & g, const llama_kv_cache_context * mctx,
                                     ggml_tensor * q, ggml_tensor * k, ggml_tensor * v, ggml_tensor * kq_b,
                                     ggml_tensor * kq_mask, ggml_tensor * sinks, ggml_tensor * v_mla,
                                     float kq_scale, int il);
