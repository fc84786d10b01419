// llama-sparse: CPU kernel of GGML_OP_SPARQ_ATTN (compiled into ggml-cpu), and its scalar reference.
// The op's semantics are in ggml-sparse.h; the algorithm in docs/sparq.md.
#pragma once

#include "ggml.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct ggml_compute_params;

// called by ggml-cpu's dispatch on every thread of the op (n_tasks = n_threads);
// params->wdata holds ggml_sparse_cpu_sparq_work_size() bytes. params->use_ref or LLAMA_SPARSE_CPU_REF=1
// runs the scalar reference instead.
void   ggml_sparse_cpu_forward_sparq   (const struct ggml_compute_params * params, struct ggml_tensor * dst);
size_t ggml_sparse_cpu_sparq_work_size (const struct ggml_tensor * node, int n_tasks);

// scalar reference of the whole op on one thread (double accumulators, full sorts, own heap scratch):
// dst (a GGML_OP_SPARQ_ATTN node whose sources hold data) is written in full
void   ggml_sparse_cpu_sparq_ref(struct ggml_tensor * dst);

#ifdef __cplusplus
}
#endif
