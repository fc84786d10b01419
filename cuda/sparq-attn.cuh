// llama-sparse: GGML_OP_SPARQ_ATTN on CUDA (SparQ attention at decode; contract in ggml-sparse/ggml-sparse.h).
#pragma once

#include "ggml-cuda/common.cuh"

#define SPARQ_CUDA_MAX_G    8     // q heads per KV head
#define SPARQ_CUDA_MAX_D    256   // head sizes of q/K and V
#define SPARQ_CUDA_MAX_KTOP 1024  // positions kept in step 2
#define SPARQ_CUDA_MAX_NKV  45056 // positions (their sort keys live in shared memory)

#ifndef GGML_SPARSE_CUDA_STANDALONE
// whether the CUDA kernels take this GGML_OP_SPARQ_ATTN node (shapes, types and the limits above)
bool ggml_cuda_sparq_attn_supported(const ggml_tensor * op);

void ggml_cuda_op_sparq_attn(ggml_backend_cuda_context & ctx, ggml_tensor * dst);
#endif // GGML_SPARSE_CUDA_STANDALONE
