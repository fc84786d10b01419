// llama-sparse: ARM NEON GEMV kernels on one zigzag block-row (decode, T <= GGML_SPARSE_MAX_BATCH).
#include "ggml-sparse-cpu.h"

ggml_sparse_zz_gemv_t ggml_sparse_zz_gemv_arm(enum ggml_type type) {
    (void) type;
    return NULL;
}
