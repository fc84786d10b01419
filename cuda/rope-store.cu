// llama-sparse: RoPE of q and k, and the K / V cache writes, as one kernel (see rope-store.cuh).
#include "rope-store.cuh"
#include "graph-hook.cuh"
#include "attn-decode.cuh"

#include "ggml-sparse.h"

#include <atomic>
#include <cstdlib>

// No early trigger (ggml_cuda_pdl_lc) for the kernel after this one: with it, upstream's flash attention after this
// launch gave wrong decode logits (median 1.4 of the largest logit against 0.01 without it, argmax 0/16; fa-check,
// bench/results/cuda_h100_2026-11-27g.md). Without the trigger the logits matched upstream's RoPE + SET_ROWS to every
// printed digit, dense, at 0.50 and past 2048 positions, so the trigger alone broke it; the mechanism is not known.
static __global__ void __launch_bounds__(RS_THREADS) rope_store(const rs_args a) {
    ggml_cuda_pdl_sync(); // q, k, v come from the kernel before
    int b = blockIdx.x;
    if (b < a.q.nb) {
        rs_rope_pair(a.q, (int64_t) b*RS_THREADS + threadIdx.x);
        return;
    }
    b -= a.q.nb;
    if (b < a.k.nb) {
        rs_rope_pair(a.k, (int64_t) b*RS_THREADS + threadIdx.x);
        return;
    }
    b -= a.k.nb;
    const rs_copy & v = a.v;
    const int64_t   e = (int64_t) b*RS_THREADS + threadIdx.x;
    if (e >= (int64_t) v.ne0*v.nrows) {
        return;
    }
    const int64_t r = e / v.ne0;
    const int     c = (int) (e % v.ne0);
    rs_store(v.dst, v.rows[r]*v.srow + c, v.x[r*v.sx1 + c], v.f16);
}

static bool rs_enabled() {
    static const bool on = ggml_sparse_cuda_fusion_on("LLAMA_SPARSE_CUDA_ROPE_FUSE");
    return on;
}

// the next computed node, nullptr unless flagged to compute
static ggml_tensor * rs_next(ggml_cgraph * cgraph, int * j) {
    ggml_tensor * t = ggml_sparse_cuda_next_node(cgraph, j);
    return t != nullptr && (t->flags & GGML_TENSOR_FLAG_COMPUTE) ? t : nullptr;
}

static bool rs_idx_ok(const ggml_tensor * idx, const int64_t n) {
    return idx->type == GGML_TYPE_I64 && ggml_is_contiguous(idx) && idx->ne[0] == n && ggml_nelements(idx) == n;
}

static bool rs_cache_ok(const ggml_tensor * sr, const int64_t ne0) {
    return (sr->type == GGML_TYPE_F16 || sr->type == GGML_TYPE_F32) && sr->ne[0] == ne0 && sr->ne[2] == 1 &&
           sr->ne[3] == 1 && sr->nb[0] == (size_t) ggml_type_size(sr->type) && sr->nb[1] % ggml_type_size(sr->type) == 0;
}

// a ROPE this kernel computes: normal or NeoX, f32 in and out, 3-d
static bool rs_rope_fill(const ggml_tensor * rope, rs_rope & r) {
    const ggml_tensor * x = rope->src[0];
    const int32_t * op = (const int32_t *) rope->op_params;
    const int n_dims = op[1], mode = op[2], n_ctx_orig = op[4], n_offs = op[15];
    if (rope->op != GGML_OP_ROPE || (mode != GGML_ROPE_TYPE_NORMAL && mode != GGML_ROPE_TYPE_NEOX) ||
            x->type != GGML_TYPE_F32 || rope->type != GGML_TYPE_F32 || x->nb[0] != sizeof(float) || x->ne[3] != 1 ||
            x->ne[0] % 2 != 0 || n_dims % 2 != 0 || n_offs < 0 || n_offs % 2 != 0 || n_offs + n_dims > x->ne[0] ||
            rope->src[1]->type != GGML_TYPE_I32 || rope->src[1]->ne[0] < x->ne[2] ||
            (rope->src[2] != nullptr && rope->src[2]->type != GGML_TYPE_F32) ||
            x->ne[0]*x->ne[1]*x->ne[2] > INT32_MAX) {
        return false;
    }
    float freq_base, beta_fast, beta_slow;
    memcpy(&freq_base,     op +  5, sizeof(float));
    memcpy(&r.freq_scale,  op +  6, sizeof(float));
    memcpy(&r.ext_factor,  op +  7, sizeof(float));
    memcpy(&r.attn_factor, op +  8, sizeof(float));
    memcpy(&beta_fast,     op +  9, sizeof(float));
    memcpy(&beta_slow,     op + 10, sizeof(float));
    float corr[2];
    ggml_rope_yarn_corr_dims(n_dims, n_ctx_orig, freq_base, beta_fast, beta_slow, corr);
    r.x           = (const float *) x->data;
    r.ne0         = (int) x->ne[0];
    r.ne1         = (int) x->ne[1];
    r.ne2         = (int) x->ne[2];
    r.sx1         = x->nb[1]/sizeof(float);
    r.sx2         = x->nb[2]/sizeof(float);
    r.pos         = (const int32_t *) rope->src[1]->data;
    r.ff          = rope->src[2] ? (const float *) rope->src[2]->data : nullptr;
    r.n_dims      = n_dims;
    r.n_offs      = n_offs;
    r.neox        = mode == GGML_ROPE_TYPE_NEOX;
    r.theta_scale = powf(freq_base, -2.0f/n_dims);
    r.corr0       = corr[0];
    r.corr1       = corr[1];
    r.nb          = (int) ((x->ne[0]/2*x->ne[1]*x->ne[2] + RS_THREADS - 1)/RS_THREADS);
    return x->nb[1] % sizeof(float) == 0 && x->nb[2] % sizeof(float) == 0;
}

int ggml_cuda_rope_store_fuse(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, int i) {
    ggml_tensor * r0 = ggml_graph_node(cgraph, i);
    if (r0->op != GGML_OP_ROPE || !rs_enabled()) {
        return 0;
    }
    // the nodes (ggml-sparse.c): q's rope then k's (as graphs with zigzag matmuls have them), or k's alone (upstream's
    // build_attn expands q, then v, then k, so with plain matmuls the v and k matmuls lie between the ropes); the K, V
    // and, with SparQ's f16/f32 transposed K on, k_t writes after them
    ggml_sparse_rs_nodes m;
    if (!ggml_sparse_rope_store_nodes(cgraph, i, &m)) {
        return 0;
    }
    ggml_tensor * rq = m.rq, * rk = m.rk, * sk = m.sk, * sv = m.sv, * skt = m.skt;
    const int     j  = m.last;
    rs_args a = {};
    if ((rq != nullptr && !rs_rope_fill(rq, a.q)) || !rs_rope_fill(rk, a.k)) {
        return 0;
    }
    // q: its own output (a.q.nb = 0 without it: no blocks)
    if (rq != nullptr) {
        a.q.dst = rq->data;
        a.q.sd1 = rq->nb[1]/sizeof(float);
        a.q.sd2 = rq->nb[2]/sizeof(float);
        a.q.f16 = 0;
        if (!ggml_are_same_shape(rq, rq->src[0]) || rq->nb[0] != sizeof(float)) {
            return 0;
        }
    }
    // k: written straight into its cache rows (and k_t)
    const ggml_tensor * kv = sk->src[0];
    if (!rs_idx_ok(sk->src[1], kv->ne[1]) || !rs_cache_ok(sk, kv->ne[0]) || (skt != nullptr && !rs_cache_ok(skt, 1))) {
        return 0;
    }
    a.k.dst  = sk->data;
    a.k.rows = (const int64_t *) sk->src[1]->data;
    a.k.srow = sk->nb[1]/ggml_type_size(sk->type);
    a.k.f16  = sk->type == GGML_TYPE_F16;
    if (skt != nullptr) {
        a.k.kt      = skt->data;
        a.k.kt_idx  = (const int64_t *) skt->src[1]->data;
        a.k.kt_srow = skt->nb[1]/ggml_type_size(skt->type);
        a.k.kt_f16  = skt->type == GGML_TYPE_F16;
    }
    // v: SET_ROWS of f32 rows made before node i (only views lie between)
    const ggml_tensor * vx = sv->src[0];
    if (ggml_sparse_mem_overlaps(rk, vx) || vx->type != GGML_TYPE_F32 || vx->nb[0] != sizeof(float) || vx->nb[1] % sizeof(float) != 0 || vx->ne[2] != 1 ||
            vx->ne[3] != 1 || vx->ne[0]*vx->ne[1] > INT32_MAX || !rs_idx_ok(sv->src[1], vx->ne[1]) ||
            !rs_cache_ok(sv, vx->ne[0])) {
        return 0;
    }
    a.v = { (const float *) vx->data, sv->data, (int) vx->ne[0], (int) vx->ne[1], (int64_t) (vx->nb[1]/sizeof(float)),
            (const int64_t *) sv->src[1]->data, (int64_t) (sv->nb[1]/ggml_type_size(sv->type)),
            sv->type == GGML_TYPE_F16, (int) ((vx->ne[0]*vx->ne[1] + RS_THREADS - 1)/RS_THREADS) };

    // run in one launch, nothing written may overlap anything read or another write
    const ggml_tensor * writes[4] = { rq, sk, sv, skt };
    const ggml_tensor * reads[10] = { rq ? rq->src[0] : nullptr, rq ? rq->src[1] : nullptr, rq ? rq->src[2] : nullptr,
                                      rk->src[0], rk->src[1], rk->src[2],
                                      sk->src[1], vx, sv->src[1], skt ? skt->src[1] : nullptr };
    const int nw = skt ? 4 : 3;
    for (int w = 0; w < nw; ++w) {
        for (const ggml_tensor * t : reads) {
            if (writes[w] != nullptr && t != nullptr && ggml_sparse_mem_overlaps(writes[w], t) && !(w == 0 && t == rq->src[0] && t->data == rq->data &&
                    t->nb[1] == rq->nb[1] && t->nb[2] == rq->nb[2])) { // (q's rope in place is fine: one thread a pair)
                return 0;
            }
        }
        for (int w2 = w + 1; w2 < nw; ++w2) {
            if (writes[w] != nullptr && ggml_sparse_mem_overlaps(writes[w], writes[w2])) {
                return 0;
            }
        }
    }
    if (skt != nullptr) {
        static std::atomic<bool> logged_kt{false};
        if (!logged_kt.exchange(true)) {
            GGML_LOG_INFO("llama-sparse: CUDA writes SparQ's transposed K in the RoPE / cache-write kernel (first: %s)\n",
                          skt->name);
        }
    }
    // LLAMA_SPARSE_CUDA_ATTN_FUSE=2: with the flash attention right after them (only views between) as one launch,
    // when that attention reads q's rope output and the caches as they were written (attn-decode.cu)
    if (rq != nullptr && ggml_cuda_attn_decode_mode() == 2) {
        int jf = j;
        ggml_tensor * fa = rs_next(cgraph, &jf);
        attn_decode_args ad;
        if (fa != nullptr && fa->op == GGML_OP_FLASH_ATTN_EXT && ggml_cuda_attn_decode_args(fa, ad) &&
                // (each KV head's cluster reads only what its block 0 wrote: the same pointers and head strides)
                fa->src[0]->view_src == rq && fa->src[0]->data == rq->data && fa->src[0]->ne[2] == rq->ne[1] &&
                fa->src[0]->nb[2] == rq->nb[1] && fa->src[1]->view_src != nullptr && fa->src[1]->view_src == sk->view_src &&
                fa->src[1]->data == sk->data && fa->src[2]->view_src != nullptr && fa->src[2]->view_src == sv->view_src &&
                fa->src[2]->data == sv->data &&
                ad.k_s1 == a.k.srow && ad.k_s2 == a.k.ne0 && ad.v_s1 == a.v.srow && ad.v_s2 == a.v.ne0/ad.n_head_kv &&
                a.k.f16 && a.v.f16 && attn_decode_launch(ad, 0, ctx.device, ctx.stream(), 0, &a)) {
            static std::atomic<bool> logged_fa{false};
            if (!logged_fa.exchange(true)) {
                GGML_LOG_INFO("llama-sparse: CUDA runs the RoPE of q and k, the K/V cache writes and one-token flash "
                              "attention as one kernel (first: %s; LLAMA_SPARSE_CUDA_ATTN_FUSE=2)\n", rq->name);
            }
            return jf - i + 1;
        }
    }

    const int nb = a.q.nb + a.k.nb + a.v.nb;
    const ggml_cuda_kernel_launch_params p(dim3((unsigned) nb), dim3(RS_THREADS), 0, ctx.stream());
    ggml_cuda_kernel_launch(rope_store, p, a);

    static std::atomic<bool> logged{false};
    if (!logged.exchange(true)) {
        GGML_LOG_INFO("llama-sparse: CUDA runs the RoPE of %s and the K/V cache writes as one kernel (first: %s; "
                      "LLAMA_SPARSE_CUDA_ROPE_FUSE=0 turns it off)\n", rq ? "q and k" : "k", r0->name);
    }
    return j - i + 1;
}
