// llama-sparse: the two ggml-cuda.cu functions common.cuh declares, for the standalone CUDA tests that do not
// link ggml-cuda (include once, after ggml-cuda/common.cuh).
#pragma once

#include <cstdio>
#include <cstdlib>

[[noreturn]] void ggml_cuda_error(const char * stmt, const char * func, const char * file, int line, const char * msg) {
    fprintf(stderr, "CUDA error: %s\n  %s in %s at %s:%d\n", msg, stmt, func, file, line);
    abort();
}

int ggml_cuda_get_device() {
    int device;
    CUDA_CHECK(cudaGetDevice(&device));
    return device;
}
