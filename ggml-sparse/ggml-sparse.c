// llama-sparse: op constructors and zigzag tagging (compiled into ggml-base).
#include "ggml-sparse.h"
#include "ggml-impl.h"

#include <string.h>

void ggml_sparse_set_zigzag(struct ggml_tensor * w, int32_t layer, int32_t group) {
    GGML_ASSERT(w->op == GGML_OP_NONE);
    GGML_ASSERT(ggml_sparse_zz_type_ok(w->type));
    const int32_t params[3] = { GGML_SPARSE_ZZ_MAGIC, layer, group };
    memcpy(w->op_params, params, sizeof(params));
}

bool ggml_sparse_is_zigzag(const struct ggml_tensor * w) {
    return w != NULL && w->op == GGML_OP_NONE && w->op_params[0] == GGML_SPARSE_ZZ_MAGIC;
}

int32_t ggml_sparse_zigzag_layer(const struct ggml_tensor * w) {
    return ggml_sparse_is_zigzag(w) ? w->op_params[1] : -1;
}

int32_t ggml_sparse_zigzag_group(const struct ggml_tensor * w) {
    return ggml_sparse_is_zigzag(w) ? w->op_params[2] : -1;
}

int64_t ggml_sparse_zz_n(const struct ggml_tensor * w) {
    return w->ne[0] / ggml_blck_size(w->type);
}

int64_t ggml_sparse_zz_m(const struct ggml_tensor * w) {
    return w->ne[1] * ggml_blck_size(w->type);
}

bool ggml_sparse_zz_type_ok(enum ggml_type type) {
    switch (type) {
        case GGML_TYPE_Q4_0:
        case GGML_TYPE_Q8_0:
        case GGML_TYPE_Q4_K:
        case GGML_TYPE_Q6_K:
            return true;
        default:
            return false;
    }
}

struct ggml_tensor * ggml_sparse_idx(
        struct ggml_context * ctx,
        struct ggml_tensor  * x,
        float                 threshold,
        enum ggml_sparse_idx_mode mode) {
    GGML_ASSERT(x->type == GGML_TYPE_F32);
    GGML_ASSERT(ggml_is_contiguous(x));
    GGML_ASSERT(x->ne[2] == 1 && x->ne[3] == 1);

    struct ggml_tensor * result;
    if (mode == GGML_SPARSE_IDX_LIST) {
        GGML_ASSERT(x->ne[1] <= GGML_SPARSE_MAX_BATCH);
        result = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, x->ne[0] + 1);
    } else {
        result = ggml_new_tensor(ctx, GGML_TYPE_F32, GGML_MAX_DIMS, x->ne);
    }

    int32_t params[4] = { 0, (int32_t) mode, 0, 0 }; // [2..3]: stats pointer, see ggml_sparse_idx_set_stats
    memcpy(&params[0], &threshold, sizeof(float));
    memcpy(result->op_params, params, sizeof(params));

    result->op     = GGML_OP_SPARSE_IDX;
    result->src[0] = x;

    return result;
}

void ggml_sparse_idx_set_stats(struct ggml_tensor * idx, struct ggml_sparse_stats * stats) {
    GGML_ASSERT(idx->op == GGML_OP_SPARSE_IDX);
    memcpy(&idx->op_params[2], &stats, sizeof(stats));
}

struct ggml_sparse_stats * ggml_sparse_idx_get_stats(const struct ggml_tensor * idx) {
    struct ggml_sparse_stats * stats;
    memcpy(&stats, &idx->op_params[2], sizeof(stats));
    return stats;
}

struct ggml_tensor * ggml_mul_mat_zz(
        struct ggml_context * ctx,
        struct ggml_tensor  * w,
        struct ggml_tensor  * x,
        struct ggml_tensor  * idx) {
    GGML_ASSERT(ggml_sparse_zz_type_ok(w->type));
    GGML_ASSERT(ggml_is_contiguous(w));
    GGML_ASSERT(w->ne[2] == 1 && w->ne[3] == 1);
    GGML_ASSERT(x->type == GGML_TYPE_F32);
    GGML_ASSERT(x->ne[0] == ggml_sparse_zz_n(w));
    GGML_ASSERT(x->ne[2] == 1 && x->ne[3] == 1);
    GGML_ASSERT(x->nb[0] == sizeof(float));
    if (idx) {
        GGML_ASSERT(idx->type == GGML_TYPE_I32 && idx->ne[0] == x->ne[0] + 1);
        GGML_ASSERT(x->ne[1] <= GGML_SPARSE_MAX_BATCH);
    }

    const int64_t ne[4] = { ggml_sparse_zz_m(w), x->ne[1], 1, 1 };
    struct ggml_tensor * result = ggml_new_tensor(ctx, GGML_TYPE_F32, 4, ne);

    result->op     = GGML_OP_MUL_MAT_ZZ;
    result->src[0] = w;
    result->src[1] = x;
    result->src[2] = idx;

    return result;
}
