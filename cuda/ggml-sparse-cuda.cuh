// llama-sparse: CUDA backend entry points for the sparse ops, included from the hook in ggml-cuda.cu.
//
// ggml-cuda.cu, ggml_cuda_compute_forward:
//     case GGML_OP_SPARSE_IDX: ggml_cuda_op_sparse_idx(ctx, dst);  break;
//     case GGML_OP_MUL_MAT_ZZ: ggml_cuda_op_mul_mat_zz(ctx, dst);  break;
//     case GGML_OP_SPARQ_ATTN: ggml_cuda_op_sparq_attn(ctx, dst);  break;
// ggml-cuda.cu, ggml_backend_cuda_device_supports_op:
//     case GGML_OP_SPARSE_IDX:
//     case GGML_OP_MUL_MAT_ZZ:
//     case GGML_OP_SPARQ_ATTN: return ggml_cuda_sparse_supports_op(op);
// ggml-cuda.cu, ggml_cuda_graph_evaluate_and_capture, before upstream's fusion:
//     if (int n = ggml_cuda_sparse_graph_node(*cuda_ctx, cgraph, i); n > 0) { i += n - 1; continue; }
// Sources: cuda/*.cu; include dirs: cuda/, ggml-sparse/.
#pragma once

#include "ggml-cuda/common.cuh"
#include "sparse-idx.cuh"
#include "mul-mat-zz.cuh"
#include "sparq-attn.cuh"
#include "sparq-kt.cuh"
#include "rope-store.cuh"
#include "attn-decode.cuh"

// whether the CUDA backend runs this GGML_OP_SPARSE_IDX / GGML_OP_MUL_MAT_ZZ node
bool ggml_cuda_sparse_supports_op(const ggml_tensor * op);

// runs op if it is one of the sparse ops; false otherwise (for a single `if` in ggml_cuda_compute_forward)
bool ggml_cuda_sparse_compute_forward(ggml_backend_cuda_context & ctx, ggml_tensor * dst);

// graph loop hook for node i: how many nodes from i on it has run, 0 = run node i as usual. 1 when node i has
// been run (or is run now) as part of a group of sibling MUL_MAT_ZZ nodes (q/k/v, gate/up: one GEMV launch at
// the first one's place; LLAMA_SPARSE_CUDA_GROUP=0 turns grouping off); more when a zigzag GEMV took in the
// SwiGLU before it or the residual add after it (ggml_cuda_op_mul_mat_zz_fuse), or when it ran the append of
// SparQ's Q8_0 transposed K (ggml_cuda_sparq_kt_append_fuse), or the RoPE of q and k with the K/V cache writes
// (ggml_cuda_rope_store_fuse); 1 for a one-token flash attention run by ggml_cuda_attn_decode_fuse.
int ggml_cuda_sparse_graph_node(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, int i);
