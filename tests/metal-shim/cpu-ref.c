// llama-sparse: the CPU ops (ggml-sparse/ggml-sparse-cpu.c) as plain functions for the Metal shim tests:
// the Metal kernels are compared with exactly what the CPU backend computes (scalar reference GEMV).
#include "ggml.h"
#include "ggml-cpu-impl.h"
#include "ggml-sparse.h"
#include "ggml-sparse-cpu.h"
#include "zz_test_threads.h"

#include <stdlib.h>
#include <string.h>

// LIST: dst int32 [n + 1]; MASK: dst float [nt][n] (row stride n)
void zzref_idx(const float * x, int64_t n, int nt, size_t nb1, float thr, int mode, void * dst) {
    struct ggml_tensor src = zz_test_tensor_2d(GGML_TYPE_F32, n, nt, nb1, (void *) x);
    struct ggml_tensor out = mode == GGML_SPARSE_IDX_LIST
        ? zz_test_tensor_2d(GGML_TYPE_I32, n + 1, 1, sizeof(int32_t)*(n + 1), dst)
        : zz_test_tensor_2d(GGML_TYPE_F32, n, nt, sizeof(float)*n, dst);
    out.src[0] = &src;
    memcpy(&out.op_params[0], &thr, sizeof(float));
    out.op_params[1] = mode;
    zz_test_run_op(ggml_sparse_cpu_forward_idx, &out, 1, false);
}

// y [nt][m] (row stride m) = W x over the listed columns (idx may be NULL); the scalar reference kernel
void zzref_mul_mat(enum ggml_type type, const void * w, int64_t n, int64_t m, const float * x, int nt,
                   const int32_t * idx, float * y) {
    const int64_t B = ggml_blck_size(type);
    struct ggml_tensor tw = zz_test_tensor_2d(type, B*n, m/B, ggml_type_size(type)*n, (void *) w);
    struct ggml_tensor tx = zz_test_tensor_2d(GGML_TYPE_F32, n, nt, sizeof(float)*n, (void *) x);
    struct ggml_tensor ti = zz_test_tensor_2d(GGML_TYPE_I32, n + 1, 1, sizeof(int32_t)*(n + 1), (void *) idx);
    struct ggml_tensor ty = zz_test_tensor_2d(GGML_TYPE_F32, m, nt, sizeof(float)*m, y);
    ty.src[0] = &tw;
    ty.src[1] = &tx;
    ty.src[2] = idx ? &ti : NULL;
    zz_test_run_op(ggml_sparse_cpu_forward_mul_mat_zz, &ty, 1, true);
}
