// llama-sparse: which sparse ops the CUDA backend takes, and their dispatch.
#include "ggml-sparse-cuda.cuh"

#include "ggml-sparse.h"

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

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
            // the file's layout, or Q4_0 / Q8_0 regrouped here (zz_cuda_relayout); not a CPU-repacked weight
            if (ggml_sparse_zz_layout(src0) != GGML_SPARSE_ZZ_LAYOUT_ROWS && zz_kernel_type(src0) == src0->type) {
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

// siblings run early by a group, to be skipped when the loop reaches them: (context, graph, node index, node)
struct zz_group_done {
    const ggml_backend_cuda_context * ctx;
    const ggml_cgraph               * graph;
    int                               i;
    const ggml_tensor               * node;
};

static std::mutex                 zz_group_mutex;
static std::vector<zz_group_done> zz_group_pending;

bool ggml_cuda_zz_group_enabled() {
    static const bool on = [] {
        const char * e = getenv("LLAMA_SPARSE_CUDA_GROUP");
        return e == nullptr || atoi(e) != 0;
    }();
    return on;
}

// (not across the streams of upstream's concurrent regions)
static bool zz_single_stream(ggml_backend_cuda_context & ctx) {
    return ctx.curr_stream_no == 0 && ctx.stream_context().concurrent_events.empty();
}

// measurement only: LLAMA_SPARSE_CUDA_WHATIF_SKIP=ROPE,SET_ROWS,... (ggml op names) leaves those nodes out of
// the graph, their outputs stale, so that decode time without them bounds what fusing them away could gain.
// The results are wrong while it is set; it is never meant for use.
static bool zz_whatif_skip(const ggml_tensor * node) {
    static const std::vector<bool> skip = [] {
        std::vector<bool> v(GGML_OP_COUNT, false);
        const char * e = getenv("LLAMA_SPARSE_CUDA_WHATIF_SKIP");
        if (e == nullptr || *e == '\0') {
            return v;
        }
        std::string list = std::string(",") + e + ",";
        std::string names;
        for (int op = 0; op < GGML_OP_COUNT; ++op) {
            const std::string name = ggml_op_name((ggml_op) op);
            if (list.find("," + name + ",") != std::string::npos) {
                v[op] = true;
                names += " " + name;
            }
        }
        GGML_LOG_WARN("llama-sparse: LLAMA_SPARSE_CUDA_WHATIF_SKIP: the CUDA graph skips%s (timing only: results are wrong)\n",
                      names.empty() ? " nothing (no op name matched)" : names.c_str());
        return v;
    }();
    return skip[node->op];
}

// a MUL_MAT_ZZ node i not yet run by a group: its group, or it fused with its neighbours, or 0 (norm: a deferred
// RMS norm it reads)
static int zz_mm_node(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, const int i, const zz_norm_defer * norm) {
    ggml_tensor * node = ggml_graph_node(cgraph, i);
    if (!zz_single_stream(ctx)) {
        return 0;
    }
    if (!ggml_cuda_zz_group_enabled()) {
        return ggml_cuda_op_mul_mat_zz_fuse(ctx, cgraph, i, norm);
    }
    int nodes[ZZ_GROUP_MAX];
    int count = ggml_sparse_zz_siblings(cgraph, i, 32, nodes, ZZ_GROUP_MAX);
    {
        // siblings an earlier group already ran stay out (they would be computed twice)
        std::lock_guard<std::mutex> lock(zz_group_mutex);
        int kept = 1;
        for (int s = 1; s < count; ++s) {
            bool ran = false;
            for (const zz_group_done & d : zz_group_pending) {
                ran = ran || (d.ctx == &ctx && d.graph == cgraph && d.i == nodes[s]);
            }
            if (!ran) {
                nodes[kept++] = nodes[s];
            }
        }
        count = kept;
    }
    if (count < 2) {
        return ggml_cuda_op_mul_mat_zz_fuse(ctx, cgraph, i, norm); // a single matmul: with its residual add, if any
    }
    ggml_tensor * dst[ZZ_GROUP_MAX];
    int           i_last = i;
    for (int s = 0; s < count; ++s) {
        dst[s] = ggml_graph_node(cgraph, nodes[s]);
        i_last = std::max(i_last, nodes[s]);
    }
    if (!ggml_cuda_op_mul_mat_zz_group(ctx, dst, count, norm, cgraph, i_last)) {
        return 0;
    }
    static bool logged = false;
    std::lock_guard<std::mutex> lock(zz_group_mutex);
    if (!logged) {
        logged = true;
        GGML_LOG_INFO("llama-sparse: CUDA runs sibling zigzag matmuls as one launch (first: %d nodes from %s; "
                      "LLAMA_SPARSE_CUDA_GROUP=0 turns it off)\n", count, node->name);
    }
    for (int s = 1; s < count; ++s) {
        zz_group_pending.push_back({ &ctx, cgraph, nodes[s], dst[s] });
    }
    return 1;
}

int ggml_cuda_sparse_graph_node(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, int i) {
    ggml_tensor * node = ggml_graph_node(cgraph, i);
    if (zz_whatif_skip(node)) {
        return 1;
    }
    ggml_cuda_zz_res_node(ctx, cgraph, node);
    if (node->op == GGML_OP_RMS_NORM) {
        return zz_single_stream(ctx) ? ggml_cuda_zz_norm_defer(ctx, cgraph, i) : 0;
    }
    if (node->op == GGML_OP_GLU) {
        return zz_single_stream(ctx) ? ggml_cuda_op_mul_mat_zz_fuse(ctx, cgraph, i) : 0;
    }
    if (node->op == GGML_OP_ROPE) {
        return zz_single_stream(ctx) ? ggml_cuda_rope_store_fuse(ctx, cgraph, i) : 0;
    }
    if (node->op == GGML_OP_FLASH_ATTN_EXT) {
        return zz_single_stream(ctx) ? ggml_cuda_attn_decode_fuse(ctx, cgraph, i) : 0;
    }
    if (node->op == GGML_OP_GET_ROWS) {
        return zz_single_stream(ctx) ? ggml_cuda_sparq_kt_append_fuse(ctx, cgraph, i) : 0;
    }
    if (node->op != GGML_OP_MUL_MAT_ZZ) {
        return 0;
    }
    {
        std::lock_guard<std::mutex> lock(zz_group_mutex);
        bool done = false;
        // this context's entries up to node i go: the one for node i, and any a stopped run left behind
        for (size_t e = 0; e < zz_group_pending.size();) {
            const zz_group_done & d = zz_group_pending[e];
            if (d.ctx == &ctx && (d.graph != cgraph || d.i <= i)) {
                done = done || (d.graph == cgraph && d.i == i && d.node == node);
                zz_group_pending[e] = zz_group_pending.back();
                zz_group_pending.pop_back();
            } else {
                ++e;
            }
        }
        if (done) {
            return 1;
        }
    }
    // the first matmul after a deferred RMS norm takes it in; if its launch declines, the norm runs first
    zz_norm_defer nd;
    const bool has_norm = ggml_cuda_zz_norm_take(ctx, cgraph, i, nd);
    int n_ran = zz_mm_node(ctx, cgraph, i, has_norm ? &nd : nullptr);
    if (n_ran == 0 && has_norm) {
        ggml_cuda_zz_norm_run(ctx, nd);
        n_ran = zz_mm_node(ctx, cgraph, i, nullptr);
    }
    return n_ran;
}
