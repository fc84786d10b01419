// llama-sparse: q's RoPE, k's RoPE + K cache write and the V cache write of an attention layer as one kernel.
//
// At decode the nodes after the q/k/v matmuls are ROPE(q), ROPE(k) -> VIEW -> SET_ROWS(K cache) and VIEW ->
// SET_ROWS(V cache), with only views between them. Stock ggml-cuda runs them as three tiny dependent kernels (it
// fuses k's rope with its cache write); each costs ~2.5 us of a 7B decode layer on the H100 whatever its size. The
// graph hook runs them as one launch with the arithmetic of upstream's rope kernels (normal and NeoX modes).
#pragma once

#include "ggml-cuda/common.cuh"

#ifndef GGML_SPARSE_CUDA_STANDALONE
// graph hook: node i is a ROPE; when it starts the pattern above, runs it and returns how many nodes from i it
// covered (0: not the pattern, or LLAMA_SPARSE_CUDA_ROPE_FUSE=0 / GGML_CUDA_DISABLE_FUSION=1)
int ggml_cuda_rope_store_fuse(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, int i);
#endif
