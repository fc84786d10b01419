// llama-sparse: stock-side helpers shared by the CPU bench programs that time stock ggml mul_mat
// (bench/gemv_cpu.c, bench/gemm_cpu.c)
#pragma once

#include "ggml.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"

#include <stdint.h>
#include <string.h>

#include "zz_rng.h"

// the CPU backend's CPU_REPACK buffer type where it takes a type-weight mul_mat of n columns, as llama.cpp loads
// weights by default (it asks the device the same way); NULL where it does not (e.g. Q8_0 on x86) or this build has none
static ggml_backend_buffer_type_t stock_repack_buft(enum ggml_type type, int64_t n) {
    ggml_backend_reg_t reg = ggml_backend_cpu_reg();
    ggml_backend_dev_t dev = ggml_backend_reg_dev_get(reg, 0);
    ggml_backend_dev_get_extra_bufts_t get = (ggml_backend_dev_get_extra_bufts_t)
        ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts");
    for (ggml_backend_buffer_type_t * b = get ? get(dev) : NULL; b != NULL && *b != NULL; ++b) {
        if (strcmp(ggml_backend_buft_name(*b), "CPU_REPACK") != 0) {
            continue;
        }
        struct ggml_init_params ip = { 3*ggml_tensor_overhead(), NULL, true };
        struct ggml_context * ctx = ggml_init(ip);
        struct ggml_tensor * w = ggml_new_tensor_2d(ctx, type, n, 256);
        struct ggml_tensor * y = ggml_mul_mat(ctx, w, ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n, 1));
        ggml_backend_buffer_t buf = ggml_backend_buft_alloc_buffer(*b, 0);
        w->buffer = buf;
        const bool ok = ggml_backend_dev_supports_op(dev, y);
        ggml_backend_buffer_free(buf);
        ggml_free(ctx);
        return ok ? *b : NULL;
    }
    return NULL;
}

// random blocks of type with sane fp16 scales (d first, then dmin for Q4_K; Q8_0/Q4_0 have d first)
static void fill_random_blocks(enum ggml_type type, void * data, int64_t n_blocks) {
    const size_t bs = ggml_type_size(type);
    uint8_t * p = data;
    for (int64_t b = 0; b < n_blocks; ++b) {
        for (size_t i = 0; i < bs; i += 8) {
            const uint64_t r = rng_u64();
            memcpy(p + b*bs + i, &r, bs - i < 8 ? bs - i : 8);
        }
        const ggml_fp16_t d    = ggml_fp32_to_fp16(0.001f + 0.001f*(float) (rng_u64() % 1000)/1000.0f);
        const ggml_fp16_t dmin = ggml_fp32_to_fp16(0.0005f);
        memcpy(p + b*bs + 0, &d, 2);
        if (type == GGML_TYPE_Q4_K) {
            memcpy(p + b*bs + 2, &dmin, 2);
        }
    }
}
