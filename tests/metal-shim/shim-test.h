// llama-sparse: what the shim's test programs share: pass/fail counting (CHECK), the seeded generator, and the half
// conversions clang calls for __fp16 on x86 without F16C.
#pragma once

#include "ggml.h"

#include <cstdint>
#include <cstdio>
#include <random>

extern "C" __attribute__((weak)) uint16_t __gnu_f2h_ieee(float f)  { return ggml_fp32_to_fp16(f); }
extern "C" __attribute__((weak)) float    __gnu_h2f_ieee(uint16_t h) { return ggml_fp16_to_fp32(h); }

static int n_pass = 0;
static int n_fail = 0;

#define CHECK(cond, ...) do {                                        \
    if (cond) { n_pass++; } else {                                   \
        n_fail++; std::printf("FAIL %s:%d: ", __FILE__, __LINE__);   \
        std::printf(__VA_ARGS__); std::printf("\n");                 \
    }                                                                \
} while (0)

static std::mt19937_64 rng(42);

static int   rand_int(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); }
static float rand_normal()            { return std::normal_distribution<float>(0.0f, 1.0f)(rng); }
