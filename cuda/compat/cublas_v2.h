// llama-sparse: compile-check stand-in for cuBLAS, used ONLY by cuda/check_compile.sh on machines whose
// CUDA toolkit has no cuBLAS (ggml-cuda's vendors/cuda.h includes <cublas_v2.h> unconditionally).
// It declares just what ggml-cuda/common.cuh and cuda/*.cu use; nothing links against it.
#pragma once

#include <cuda_runtime.h>
#include <library_types.h>

#define CUBLAS_VER_MAJOR 13
#define CUBLAS_VER_MINOR 0

typedef struct cublasContext * cublasHandle_t;

typedef enum {
    CUBLAS_STATUS_SUCCESS          = 0,
    CUBLAS_STATUS_NOT_INITIALIZED  = 1,
    CUBLAS_STATUS_ALLOC_FAILED     = 3,
    CUBLAS_STATUS_INVALID_VALUE    = 7,
    CUBLAS_STATUS_ARCH_MISMATCH    = 8,
    CUBLAS_STATUS_MAPPING_ERROR    = 11,
    CUBLAS_STATUS_EXECUTION_FAILED = 13,
    CUBLAS_STATUS_INTERNAL_ERROR   = 14,
    CUBLAS_STATUS_NOT_SUPPORTED    = 15,
} cublasStatus_t;

typedef enum {
    CUBLAS_OP_N = 0,
    CUBLAS_OP_T = 1,
    CUBLAS_OP_C = 2,
} cublasOperation_t;

typedef enum {
    CUBLAS_DEFAULT_MATH        = 0,
    CUBLAS_TENSOR_OP_MATH      = 1,
    CUBLAS_TF32_TENSOR_OP_MATH = 3,
} cublasMath_t;

typedef enum {
    CUBLAS_COMPUTE_16F = 64,
    CUBLAS_COMPUTE_32F = 68,
} cublasComputeType_t;

typedef enum {
    CUBLAS_GEMM_DEFAULT           = -1,
    CUBLAS_GEMM_DEFAULT_TENSOR_OP = 99,
} cublasGemmAlgo_t;

#ifdef __cplusplus
extern "C" {
#endif

const char *   cublasGetStatusString(cublasStatus_t status);
cublasStatus_t cublasCreate(cublasHandle_t * handle);
cublasStatus_t cublasDestroy(cublasHandle_t handle);
cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream);
cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode);
cublasStatus_t cublasSetWorkspace(cublasHandle_t handle, void * workspace, size_t size);
cublasStatus_t cublasSgemm(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
        int m, int n, int k, const float * alpha, const float * A, int lda, const float * B, int ldb,
        const float * beta, float * C, int ldc);
cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
        int m, int n, int k, const void * alpha,
        const void * A, cudaDataType Atype, int lda,
        const void * B, cudaDataType Btype, int ldb, const void * beta,
        void * C, cudaDataType Ctype, int ldc,
        cublasComputeType_t computeType, cublasGemmAlgo_t algo);

#ifdef __cplusplus
}
#endif
