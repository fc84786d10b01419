// llama-sparse: small helpers shared by the graph hook's fusions (cuda/*.cu).
#pragma once

#include "ggml-cuda/common.cuh"

#include <cstdlib>

// a fusion is on unless its variable env is set to 0, or upstream's GGML_CUDA_DISABLE_FUSION is set (read once by
// the caller's static)
static inline bool ggml_sparse_cuda_fusion_on(const char * env) {
    const char * e = getenv(env);
    const char * d = getenv("GGML_CUDA_DISABLE_FUSION");
    return (e == nullptr || atoi(e) != 0) && (d == nullptr || atoi(d) == 0);
}

// the next node after *j that the graph loop computes (views and no-ops skipped, as the loop skips them; its
// COMPUTE flag is the caller's to check), or nullptr
static inline ggml_tensor * ggml_sparse_cuda_next_node(ggml_cgraph * cgraph, int * j) {
    for (++*j; *j < ggml_graph_n_nodes(cgraph); ++*j) {
        ggml_tensor * t = ggml_graph_node(cgraph, *j);
        if (!ggml_is_empty(t) && !ggml_op_is_empty(t->op)) {
            return t;
        }
    }
    return nullptr;
}
