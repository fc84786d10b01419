// llama-sparse: q's RoPE, k's RoPE + K cache write and the V cache write of an attention layer as one kernel.
//
// At decode the nodes after the q/k/v matmuls are ROPE(q), ROPE(k) -> VIEW -> SET_ROWS(K cache) and VIEW ->
// SET_ROWS(V cache), with only views between them. Stock ggml-cuda runs them as three tiny dependent kernels (it
// fuses k's rope with its cache write); each costs ~2.5 us of a 7B decode layer on the H100 whatever its size. The
// graph hook runs them as one launch with the arithmetic of upstream's rope kernels (normal and NeoX modes).
#pragma once

#include "ggml-cuda/common.cuh"

// the kernel's arguments and device helpers (also used by attn-decode.cu's RoPE + attention kernel)
// one RoPE: src rows (ne0 floats, i1 = head, i2 = token) into dst, either at its own strides or, fused with a
// SET_ROWS, as row rows[i2] of a cache (the heads of a token side by side, as upstream's ROPE -> VIEW -> SET_ROWS)
struct rs_rope {
    const float   * x;
    void          * dst;
    int             ne0, ne1, ne2;
    int64_t         sx1, sx2;       // floats
    int64_t         sd1, sd2;       // dst elements (rows == nullptr)
    const int64_t * rows;           // SET_ROWS: the cache row of token i2
    int64_t         srow;           // its row stride, dst elements
    const int32_t * pos;
    const float   * ff;             // frequency factors, or nullptr
    int             n_dims, n_offs;
    int             neox, f16;
    float           theta_scale, freq_scale, ext_factor, attn_factor;
    float           corr0, corr1;
    int             nb;             // blocks
    // k only, with SparQ's f16/f32 transposed K (src/llama-sparq.cpp): element e of the contiguous rope output also
    // goes to kt[kt_idx[e]*kt_srow] (the 1-element-row SET_ROWS after the cache writes), or kt == nullptr
    void          * kt;
    const int64_t * kt_idx;
    int64_t         kt_srow;
    int             kt_f16;
};

// one SET_ROWS of f32 rows: row r of x (ne0 floats, sx1 apart) to row rows[r] of dst
struct rs_copy {
    const float   * x;
    void          * dst;
    int             ne0, nrows;
    int64_t         sx1;
    const int64_t * rows;
    int64_t         srow;
    int             f16;
    int             nb;
};

struct rs_args {
    rs_rope q;
    rs_rope k;
    rs_copy v;
};

static constexpr int RS_THREADS = 256;

static __device__ __forceinline__ void rs_store(void * dst, const int64_t o, const float v, const int f16) {
    if (f16) {
        ((half *) dst)[o] = __float2half(v);
    } else {
        ((float *) dst)[o] = v;
    }
}

// upstream's rope_yarn (forward) and rope_yarn_ramp, the same operations in the same order
static __device__ __forceinline__ void rs_yarn(const rs_rope & r, const float theta_extrap, const int iw,
                                               float & c, float & s) {
    const float theta_interp = r.freq_scale*theta_extrap;
    float theta  = theta_interp;
    float mscale = r.attn_factor;
    if (r.ext_factor != 0.0f) {
        const float y        = (iw / 2 - r.corr0) / max(0.001f, r.corr1 - r.corr0);
        const float ramp_mix = (1.0f - min(1.0f, max(0.0f, y)))*r.ext_factor;
        theta   = theta_interp*(1 - ramp_mix) + theta_extrap*ramp_mix;
        mscale *= 1.0f + 0.1f*logf(1.0f/r.freq_scale);
    }
    c = cosf(theta)*mscale;
    s = sinf(theta)*mscale;
}

// channel c of row (i1, i2) of a rope output: to its destination d + c, and to the transposed K where there is one
static __device__ __forceinline__ void rs_put(const rs_rope & r, const int64_t d, const int64_t e0, const int c, const float v) {
    rs_store(r.dst, d + c, v, r.f16);
    if (r.kt != nullptr) {
        rs_store(r.kt, r.kt_idx[e0 + c]*r.kt_srow, v, r.kt_f16);
    }
}

static __device__ void rs_rope_pair(const rs_rope & r, const int64_t p) {
    const int     half_ne0 = r.ne0/2;
    if (p >= (int64_t) half_ne0*r.ne1*r.ne2) {
        return;
    }
    const int     i0  = 2*(int) (p % half_ne0);
    const int64_t row = p / half_ne0;
    const int     i1  = (int) (row % r.ne1);
    const int     i2  = (int) (row / r.ne1);
    const float * x   = r.x + i1*r.sx1 + i2*r.sx2;
    const int64_t d   = r.rows ? r.rows[i2]*r.srow + (int64_t) i1*r.ne0 : i1*r.sd1 + i2*r.sd2;
    const int64_t e0  = ((int64_t) i2*r.ne1 + i1)*r.ne0; // element (0, i1, i2) of the contiguous output
    if (i0 < r.n_offs || i0 >= r.n_offs + r.n_dims) {
        rs_put(r, d, e0, i0,     x[i0]);
        rs_put(r, d, e0, i0 + 1, x[i0 + 1]);
        return;
    }
    const int   iw         = i0 - r.n_offs;
    const float theta_base = r.pos[i2]*powf(r.theta_scale, iw/2.0f);
    const float ff         = r.ff ? r.ff[iw/2] : 1.0f;
    float c, s;
    rs_yarn(r, theta_base/ff, iw, c, s);
    // normal: channels i0, i0 + 1; NeoX: n_offs + iw/2 and n_dims/2 further
    const int   c0 = r.neox ? r.n_offs + iw/2 : i0;
    const int   c1 = r.neox ? c0 + r.n_dims/2 : i0 + 1;
    const float x0 = x[c0];
    const float x1 = x[c1];
    rs_put(r, d, e0, c0, x0*c - x1*s);
    rs_put(r, d, e0, c1, x0*s + x1*c);
}

#ifndef GGML_SPARSE_CUDA_STANDALONE
// graph hook: node i is a ROPE; when it starts the pattern above, runs it and returns how many nodes from i it
// covered (0: not the pattern, or LLAMA_SPARSE_CUDA_ROPE_FUSE=0 / GGML_CUDA_DISABLE_FUSION=1)
int ggml_cuda_rope_store_fuse(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, int i);
#endif
