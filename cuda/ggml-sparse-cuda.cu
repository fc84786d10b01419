// llama-sparse: which sparse ops the CUDA backend takes, and their dispatch.
#include "ggml-sparse-cuda.cuh"

#include "ggml-sparse.h"

bool ggml_cuda_sparse_supports_op(const ggml_tensor * op) {
    const ggml_tensor * src0 = op->src[0];
    switch (op->op) {
        case GGML_OP_SPARSE_IDX: {
            if (src0->type != GGML_TYPE_F32 || src0->nb[0] != sizeof(float) || src0->ne[2] != 1 || src0->ne[3] != 1) {
                return false;
            }
            if (op->op_params[1] == GGML_SPARSE_IDX_LIST) {
                return op->type == GGML_TYPE_I32 && src0->ne[1] <= GGML_SPARSE_MAX_BATCH && src0->ne[0] < INT32_MAX;
            }
            return op->op_params[1] == GGML_SPARSE_IDX_MASK && op->type == GGML_TYPE_F32;
        }
        case GGML_OP_MUL_MAT_ZZ: {
            const ggml_tensor * src1 = op->src[1];
            const ggml_tensor * src2 = op->src[2];
            if (!zz_type_supported(src0->type) || !ggml_is_contiguous(src0) || src0->ne[2] != 1 || src0->ne[3] != 1) {
                return false;
            }
            if (ggml_sparse_zz_layout(src0) != GGML_SPARSE_ZZ_LAYOUT_ROWS) { // a CPU-repacked weight
                return false;
            }
            if (src0->ne[1] > 65535) { // block-rows are grid.y
                return false;
            }
            if (src1->type != GGML_TYPE_F32 || src1->nb[0] != sizeof(float) || src1->ne[2] != 1 || src1->ne[3] != 1) {
                return false;
            }
            if (src2 != nullptr && (src2->type != GGML_TYPE_I32 || src1->ne[1] > GGML_SPARSE_MAX_BATCH)) {
                return false;
            }
            return op->type == GGML_TYPE_F32;
        }
        case GGML_OP_SPARQ_ATTN:
            return ggml_cuda_sparq_attn_supported(op);
        default:
            return false;
    }
}

bool ggml_cuda_sparse_compute_forward(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    switch (dst->op) {
        case GGML_OP_SPARSE_IDX:
            ggml_cuda_op_sparse_idx(ctx, dst);
            return true;
        case GGML_OP_MUL_MAT_ZZ:
            ggml_cuda_op_mul_mat_zz(ctx, dst);
            return true;
        case GGML_OP_SPARQ_ATTN:
            ggml_cuda_op_sparq_attn(ctx, dst);
            return true;
        default:
            return false;
    }
}
