// llama-sparse: what the shim's test programs share: pass/fail counting (CHECK), the seeded generator, the half
// conversions clang calls for __fp16 on x86 without F16C, host tensors, random zigzag weights, the relative error.
#pragma once

#include "ggml.h"
#include "ggml-backend.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

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

// a contiguous tensor over host data (buf: the buffer ggml-metal's glue looks the data up in, if any)
static ggml_tensor host_tensor(ggml_type type, int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3, void * data,
                               ggml_backend_buffer_t buf = nullptr) {
    ggml_tensor t = {};
    t.type = type;
    t.ne[0] = ne0; t.ne[1] = ne1; t.ne[2] = ne2; t.ne[3] = ne3;
    t.nb[0] = ggml_type_size(type);
    t.nb[1] = ggml_row_size(type, ne0); t.nb[2] = t.nb[1]*ne1; t.nb[3] = t.nb[2]*ne2;
    t.data   = data;
    t.buffer = buf;
    return t;
}

// a random zigzag weight of m rows and n columns: block (r, j) at r*n + j holds W[r*B .. r*B + B - 1, j]
struct zz_weights {
    ggml_type            type;
    int64_t              n, m, B;
    std::vector<uint8_t> q;
    std::vector<float>   deq; // W[r*B + i, j] = deq[(r*n + j)*B + i]
};

static void make_weights(zz_weights & w, ggml_type type, int64_t n, int64_t m) {
    w.type = type; w.n = n; w.m = m; w.B = ggml_blck_size(type);
    const int64_t nblocks = (m/w.B)*n;
    std::vector<float> src(nblocks*w.B);
    for (auto & v : src) v = rand_normal()*0.02f*(rand_int(0, 499) == 0 ? 8.0f : 1.0f);
    w.q.resize(nblocks*ggml_type_size(type));
    ggml_quantize_chunk(type, src.data(), w.q.data(), 0, nblocks, w.B, nullptr);
    w.deq.resize(nblocks*w.B);
    ggml_get_type_traits(type)->to_float(w.q.data(), w.deq.data(), nblocks*w.B);
}

// element i of an F16 or F32 array
static void sparq_fill(ggml_type type, void * p, int64_t i, float v) {
    if (type == GGML_TYPE_F16) ((ggml_fp16_t *) p)[i] = ggml_fp32_to_fp16(v); else ((float *) p)[i] = v;
}

// ||got - ref|| / ||ref|| (|got - ref| when ref is all zero); *finite: every element of got finite
static double rel_l2_err(const float * got, const float * ref, size_t n, bool * finite) {
    double num = 0.0, den = 0.0;
    *finite = true;
    for (size_t i = 0; i < n; ++i) {
        *finite = *finite && std::isfinite(got[i]);
        num += ((double) got[i] - ref[i])*((double) got[i] - ref[i]);
        den += (double) ref[i]*ref[i];
    }
    return den > 0 ? std::sqrt(num/den) : std::sqrt(num);
}
