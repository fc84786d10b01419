// llama-sparse: hooks called from upstream llama.cpp (see patches/README.md).
#pragma once

#include "llama-sparse.h"
#include "ggml-sparse.h"

#include <cstdint>
#include <vector>

struct ggml_context;
struct ggml_tensor;
struct llama_context;
struct llama_model;
struct llama_model_loader;
struct llama_sparse_context;
struct llm_graph_context;

// model load: parse llama_sparse.* metadata, validate it and tag the zigzag weights (throws on bad metadata)
void llama_sparse_model_init(const llama_model & model, llama_model_loader & ml);
void llama_sparse_model_free(const llama_model * model);

// quantize: throws when the input is a zigzag file (its stored rows are not weight rows)
void llama_sparse_quantize_check(const llama_model_loader & ml);

// true if cur is zigzag and its logical shape matches ne; throws if zigzag and it does not
bool llama_sparse_check_dims(const ggml_tensor * cur, const std::vector<int64_t> & ne);

// op used to pick the buffer type of a zigzag weight (nullptr if w is not zigzag)
ggml_tensor * llama_sparse_weight_test_op(ggml_context * ctx, ggml_tensor * w);

// keep the zigzag tag when the loader duplicates a tensor
void llama_sparse_copy_tag(ggml_tensor * dst, const ggml_tensor * src);

// per-context state: created with the context (honours LLAMA_SPARSE and LLAMA_SPARSE_EMULATE)
llama_sparse_context * llama_sparse_context_attach(llama_context * lctx, const llama_model & model);
void                   llama_sparse_context_detach(llama_context * lctx);

// graph build: y = w cur for a zigzag w, sparse for decode batches when a level is set
ggml_tensor * llama_sparse_build_mm(const llm_graph_context & g, ggml_tensor * w, ggml_tensor * cur);
