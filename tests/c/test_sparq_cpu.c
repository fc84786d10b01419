// llama-sparse: standalone test of the CPU SparQ attention kernel (ggml-sparse/ggml-sparse-cpu-sparq.c).
// Tensors are laid out like the KV cache (heads inside a row, padded cell count, permuted q), filled at
// random, and the fast kernel is run on 1..3 real threads. Checks:
//   - fast kernel == scalar reference (relative error), bitwise the same for every thread count
//   - k >= visible positions: equals an independent fp64 dense attention
//   - k < visible: differs from dense (the selection matters), and never reads what it must not:
//     K/V rows of masked positions, padding cells and the k_t rows outside the top-r components are NaN
// Links the stock libggml-base only. Last line: "N passed, N failed".
#include "ggml.h"
#include "ggml-cpu-impl.h"
#include "ggml-sparse.h"
#include "ggml-sparse-cpu-sparq.h"
#include "zz_test_threads.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ZZ_TEST_SEED 0x2545f4914f6cdd1dULL
#include "zz_test_check.h"

struct sparq_case {
    int64_t D, Dv, H, Hkv, n_kv, n_tok, ns, n_seq;
    enum ggml_type kv_type, mask_type;
    int32_t r, k_top, flags;
    bool v_trans; // V laid out like upstream's transposed V cache (no flash attention)
};

static void set_val(enum ggml_type type, void * base, size_t off, float x) {
    if (type == GGML_TYPE_F16) {
        *(ggml_fp16_t *) ((char *) base + off) = ggml_fp32_to_fp16(x);
    } else {
        *(float *) ((char *) base + off) = x;
    }
}

static float get_val(enum ggml_type type, const void * base, size_t off) {
    if (type == GGML_TYPE_F16) {
        return ggml_fp16_to_fp32(*(const ggml_fp16_t *) ((const char *) base + off));
    }
    return *(const float *) ((const char *) base + off);
}

static void init_tensor(struct ggml_tensor * t, enum ggml_type type, const int64_t ne[4], const size_t nb[4], void * data) {
    memset(t, 0, sizeof(*t));
    t->type = type;
    for (int i = 0; i < 4; ++i) {
        t->ne[i] = ne[i];
        t->nb[i] = nb[i];
    }
    t->data = data;
}

// element offset of V value e (of Dv*Hkv) at cell j of stream s
static int64_t v_off(const struct sparq_case * c, int64_t kv_size, int64_t n_embd, int64_t s, int64_t j, int64_t e) {
    return c->v_trans ? (s*n_embd + e)*kv_size + j : (s*kv_size + j)*n_embd + e;
}

static bool all_finite(const float * a, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
        if (!isfinite(a[i])) {
            return false;
        }
    }
    return true;
}

static void run_case(const struct sparq_case * c) {
    const int64_t D = c->D, Dv = c->Dv, H = c->H, Hkv = c->Hkv, n_kv = c->n_kv, n_tok = c->n_tok, ns = c->ns;
    const int64_t G = H/Hkv;
    const int64_t kv_size = n_kv + rng_int(0, 5); // the cache holds more cells than the view
    const size_t  ts = ggml_type_size(c->kv_type), ms = ggml_type_size(c->mask_type);
    const int64_t n_pad = n_tok + rng_int(0, 3);

    // q stored [D, H, n_tok, ns], viewed [D, n_tok, H, ns] (the permuted view build_attn_mha passes)
    float * qd = malloc(D*H*n_tok*ns*sizeof(float));
    for (int64_t i = 0; i < D*H*n_tok*ns; ++i) {
        qd[i] = rng_normal()*(1.0f + 2.0f*(i % 7 == 0)); // a few heavier components, like real queries
    }
    // K, V as cache rows [D*Hkv, kv_size, ns]; k_t [kv_size, D*Hkv, ns]
    char * kd  = malloc(D*Hkv*kv_size*ns*ts);
    char * ktd = malloc(D*Hkv*kv_size*ns*ts);
    char * vd  = malloc(Dv*Hkv*kv_size*ns*ts);
    char * md  = malloc(n_kv*n_pad*ns*ms);
    float * vm = malloc(Dv*Hkv*n_tok*ns*sizeof(float));

    // positions: each cell belongs to a sequence and has a position in it; token t of stream s is at the
    // end of its sequence. Visible = same sequence, pos <= token pos, and a few random holes.
    int32_t * cell_seq = malloc(n_kv*ns*sizeof(int32_t));
    int32_t * cell_pos = malloc(n_kv*ns*sizeof(int32_t));
    for (int64_t s = 0; s < ns; ++s) {
        int32_t next_pos[8] = {0};
        for (int64_t j = 0; j < n_kv; ++j) {
            const int32_t sq = (int32_t) rng_int(0, (int) c->n_seq - 1);
            cell_seq[s*n_kv + j] = sq;
            cell_pos[s*n_kv + j] = next_pos[sq]++;
        }
    }
    for (int64_t s = 0; s < ns; ++s)
    for (int64_t t = 0; t < n_pad; ++t) {
        const int32_t sq  = (int32_t) (t % c->n_seq);
        const int32_t pos = t < n_tok ? 1 << 30 : -1; // padding rows see nothing
        for (int64_t j = 0; j < n_kv; ++j) {
            const bool vis = cell_seq[s*n_kv + j] == sq && cell_pos[s*n_kv + j] <= pos && rng_int(0, 50) != 0;
            set_val(c->mask_type, md, ((s*n_pad + t)*n_kv + j)*ms, vis ? 0.0f : -INFINITY);
        }
    }
    for (int64_t s = 0; s < ns; ++s)
    for (int64_t j = 0; j < kv_size; ++j)
    for (int64_t e = 0; e < D*Hkv; ++e) {
        const float x = j < n_kv ? rng_normal() : NAN; // padding cells must never be read
        set_val(c->kv_type, kd,  ((s*kv_size + j)*D*Hkv + e)*ts, x);
        set_val(c->kv_type, ktd, ((s*D*Hkv + e)*kv_size + j)*ts, x);
    }
    for (int64_t s = 0; s < ns; ++s)
    for (int64_t j = 0; j < kv_size; ++j)
    for (int64_t e = 0; e < Dv*Hkv; ++e) {
        set_val(c->kv_type, vd, v_off(c, kv_size, Dv*Hkv, s, j, e)*ts, j < n_kv ? rng_normal() : NAN);
    }
    for (int64_t i = 0; i < Dv*Hkv*n_tok*ns; ++i) {
        vm[i] = 0.3f*rng_normal();
    }

    struct ggml_tensor q, k, kt, v, mask, vmean, dst;
    {
        const int64_t ne[4] = { D, n_tok, H, ns };
        const size_t  nb[4] = { 4, 4*D*H, 4*D, 4*D*H*n_tok };
        init_tensor(&q, GGML_TYPE_F32, ne, nb, qd);
    }
    {
        const int64_t ne[4] = { D, n_kv, Hkv, ns };
        const size_t  nb[4] = { ts, ts*D*Hkv, ts*D, ts*D*Hkv*kv_size };
        init_tensor(&k, c->kv_type, ne, nb, kd);
    }
    {
        const int64_t ne[4] = { n_kv, D, Hkv, ns };
        const size_t  nb[4] = { ts, ts*kv_size, ts*kv_size*D, ts*kv_size*D*Hkv };
        init_tensor(&kt, c->kv_type, ne, nb, ktd);
    }
    {
        const int64_t ne[4] = { Dv, n_kv, Hkv, ns };
        const size_t  nb_rows[4] = { ts, ts*Dv*Hkv, ts*Dv, ts*Dv*Hkv*kv_size };
        const size_t  nb_trans[4] = { ts*kv_size, ts, ts*kv_size*Dv, ts*kv_size*Dv*Hkv };
        init_tensor(&v, c->kv_type, ne, c->v_trans ? nb_trans : nb_rows, vd);
    }
    {
        const int64_t ne[4] = { n_kv, n_pad, 1, ns };
        const size_t  nb[4] = { ms, ms*n_kv, ms*n_kv*n_pad, ms*n_kv*n_pad };
        init_tensor(&mask, c->mask_type, ne, nb, md);
    }
    {
        const int64_t ne[4] = { Dv, Hkv, n_tok, ns };
        const size_t  nb[4] = { 4, 4*Dv, 4*Dv*Hkv, 4*Dv*Hkv*n_tok };
        init_tensor(&vmean, GGML_TYPE_F32, ne, nb, vm);
    }
    const int64_t n_out = Dv*H*n_tok*ns;
    float * out_ref  = malloc(n_out*sizeof(float));
    float * out_fast = malloc(n_out*sizeof(float));
    float * out_nth  = malloc(n_out*sizeof(float));
    float * out_dense = malloc(n_out*sizeof(float));
    {
        const int64_t ne[4] = { Dv, H, n_tok, ns };
        const size_t  nb[4] = { 4, 4*Dv, 4*Dv*H, 4*Dv*H*n_tok };
        init_tensor(&dst, GGML_TYPE_F32, ne, nb, out_ref);
    }
    dst.op     = GGML_OP_COUNT; // not read by the kernel
    dst.src[0] = &q; dst.src[1] = &k; dst.src[2] = &kt; dst.src[3] = &v; dst.src[4] = &mask;
    dst.src[5] = (c->flags & GGML_SPARQ_MEAN_V) ? &vmean : NULL;
    float scale = 1.0f/sqrtf((float) D);
    const int32_t params[4] = { 0, c->r, c->k_top, c->flags };
    memcpy(dst.op_params, params, sizeof(params));
    memcpy(dst.op_params, &scale, sizeof(float));

    // NaN in the k_t rows outside each unit's top-r components: the kernel must read only the r it picked.
    // Poisoned after the K rows are final, only where every token of the (head, stream) agrees on i1.
    // (With n_tok > 1 the units of a head differ in i1, so this check runs for n_tok == 1 only.)
    int64_t min_vis = INT64_MAX;
    for (int64_t s = 0; s < ns; ++s)
    for (int64_t t = 0; t < n_tok; ++t) {
        int64_t nv = 0;
        for (int64_t j = 0; j < n_kv; ++j) {
            nv += get_val(c->mask_type, md, ((s*n_pad + t)*n_kv + j)*ms) == 0.0f;
        }
        min_vis = nv < min_vis ? nv : min_vis;
    }
    const bool sparse_all = c->k_top < min_vis;
    if (n_tok == 1 && sparse_all && c->r < D) {
        for (int64_t s = 0; s < ns; ++s)
        for (int64_t kh = 0; kh < Hkv; ++kh) {
            float absq[1024];
            for (int64_t e = 0; e < D; ++e) {
                absq[e] = 0.0f;
                for (int64_t g = 0; g < G; ++g) {
                    absq[e] += fabsf(qd[((s*n_tok + 0)*H + kh*G + g)*D + e]);
                }
            }
            for (int64_t e = 0; e < D; ++e) {
                int64_t rank = 0;
                for (int64_t f = 0; f < D; ++f) {
                    rank += absq[f] > absq[e] || (absq[f] == absq[e] && f < e);
                }
                if (rank >= c->r) {
                    for (int64_t j = 0; j < kv_size; ++j) {
                        set_val(c->kv_type, ktd, ((s*D*Hkv + kh*D + e)*kv_size + j)*ts, NAN);
                    }
                }
            }
        }
    }
    // NaN in the K/V rows no query token sees (masked for every token of the stream)
    for (int64_t s = 0; s < ns; ++s)
    for (int64_t j = 0; j < n_kv; ++j) {
        bool seen = false;
        for (int64_t t = 0; t < n_tok; ++t) {
            seen |= get_val(c->mask_type, md, ((s*n_pad + t)*n_kv + j)*ms) == 0.0f;
        }
        if (!seen) {
            for (int64_t e = 0; e < D*Hkv; ++e) {
                set_val(c->kv_type, kd, ((s*kv_size + j)*D*Hkv + e)*ts, NAN);
            }
            for (int64_t e = 0; e < Dv*Hkv; ++e) {
                set_val(c->kv_type, vd, v_off(c, kv_size, Dv*Hkv, s, j, e)*ts, NAN);
            }
        }
    }

    char name[256];
    snprintf(name, sizeof(name), "D=%lld Dv=%lld H=%lld Hkv=%lld n_kv=%lld n_tok=%lld ns=%lld seq=%lld %s/%s r=%d k=%d flags=%d",
             (long long) D, (long long) Dv, (long long) H, (long long) Hkv, (long long) n_kv, (long long) n_tok,
             (long long) ns, (long long) c->n_seq, ggml_type_name(c->kv_type), ggml_type_name(c->mask_type),
             c->r, c->k_top, c->flags);

    ggml_sparse_cpu_sparq_ref(&dst);

    const size_t wsize = ggml_sparse_cpu_sparq_work_size(&dst, 3);
    void * wdata = malloc(wsize);
    for (int it = 0; it < 3; ++it) {
        dst.data = it == 0 ? out_fast : out_nth;
        memset(dst.data, 0xff, n_out*sizeof(float));
        // one pool at a time: the shim's worker arguments are shared by all pools
        struct zz_test_pool pool;
        zz_test_pool_init(&pool, it + 1);
        zz_test_pool_run(&pool, ggml_sparse_cpu_forward_sparq, &dst, wdata, wsize, false);
        zz_test_pool_free(&pool);
        if (it == 0) {
            const double e = zz_rel_l2(out_fast, out_ref, n_out);
            CHECK(all_finite(out_fast, n_out) && e < 2e-4, "fast vs ref: rel err %.3g (%s)", e, name);
        } else {
            CHECK(memcmp(out_fast, out_nth, n_out*sizeof(float)) == 0, "nth=%d differs from nth=1 (%s)", it + 1, name);
        }
    }
    dst.data = out_ref;

    // fp64 dense attention over the visible positions
    for (int64_t s = 0; s < ns; ++s)
    for (int64_t t = 0; t < n_tok; ++t)
    for (int64_t h = 0; h < H; ++h) {
        const int64_t kh = h/G;
        const float * qh = qd + ((s*n_tok + t)*H + h)*D;
        double * w = malloc(n_kv*sizeof(double));
        double mx = -INFINITY, sum = 0.0;
        for (int64_t j = 0; j < n_kv; ++j) {
            const float mk = get_val(c->mask_type, md, ((s*n_pad + t)*n_kv + j)*ms);
            if (mk == -INFINITY) {
                w[j] = -INFINITY;
                continue;
            }
            double dot = 0.0;
            for (int64_t e = 0; e < D; ++e) {
                dot += (double) qh[e]*get_val(c->kv_type, kd, ((s*kv_size + j)*D*Hkv + kh*D + e)*ts);
            }
            w[j] = scale*dot + mk;
            mx = w[j] > mx ? w[j] : mx;
        }
        for (int64_t j = 0; j < n_kv; ++j) {
            w[j] = w[j] == -INFINITY ? 0.0 : exp(w[j] - mx);
            sum += w[j];
        }
        float * o = out_dense + ((s*n_tok + t)*H + h)*Dv;
        for (int64_t e = 0; e < Dv; ++e) {
            double acc = 0.0;
            for (int64_t j = 0; j < n_kv; ++j) {
                if (w[j] != 0.0) {
                    acc += w[j]*get_val(c->kv_type, vd, v_off(c, kv_size, Dv*Hkv, s, j, kh*Dv + e)*ts);
                }
            }
            o[e] = sum > 0.0 ? (float) (acc/sum) : 0.0f;
        }
        free(w);
    }
    const double e_dense = zz_rel_l2(out_fast, out_dense, n_out);
    if (c->k_top >= n_kv) {
        CHECK(e_dense < 1e-5, "k >= S must be dense: rel err %.3g (%s)", e_dense, name);
    } else if (sparse_all && c->k_top*4 < min_vis && c->r < D) {
        CHECK(e_dense > 1e-3, "k << S looks dense: rel err vs dense %.3g (%s)", e_dense, name);
    }

    free(wdata);
    free(qd); free(kd); free(ktd); free(vd); free(md); free(vm); free(cell_seq); free(cell_pos);
    free(out_ref); free(out_fast); free(out_nth); free(out_dense);
}

int main(int argc, char ** argv) {
    const bool quick = argc > 1 && strcmp(argv[1], "--quick") == 0;

    // fixed cases: SmolLM2 (D 64, 9/3), Llama-3-8B (D 128, 32/8), MHA; S from 1 to 8k; k >= S; r >= D
    const struct sparq_case fixed[] = {
        { 64,  64,  9, 3,    1, 1, 1, 1, GGML_TYPE_F16, GGML_TYPE_F16, 16,  64, 0 },
        { 64,  64,  9, 3,   17, 1, 1, 1, GGML_TYPE_F16, GGML_TYPE_F16, 16,   4, 0 },
        { 64,  64,  9, 3, 2048, 1, 1, 1, GGML_TYPE_F16, GGML_TYPE_F16, 16, 256, 0 },
        { 64,  64,  9, 3, 2048, 1, 1, 1, GGML_TYPE_F16, GGML_TYPE_F16, 16, 256, GGML_SPARQ_MEAN_V },
        { 64,  64,  9, 3, 8192, 1, 1, 1, GGML_TYPE_F16, GGML_TYPE_F16,  8, 1024, 0 },
        { 64,  64,  9, 3, 8192, 1, 1, 1, GGML_TYPE_F16, GGML_TYPE_F16, 32, 8192, 0 },
        { 128, 128, 32, 8, 4096, 1, 1, 1, GGML_TYPE_F16, GGML_TYPE_F16, 32, 128, 0 },
        { 128, 128, 8, 8, 1000, 1, 1, 1, GGML_TYPE_F32, GGML_TYPE_F32, 16, 100, GGML_SPARQ_MEAN_V },
        { 64,  64,  4, 4,  600, 1, 1, 1, GGML_TYPE_F32, GGML_TYPE_F16, 64,  50, 0 },   // r = D
        { 64,  64,  4, 4,  600, 1, 1, 1, GGML_TYPE_F32, GGML_TYPE_F16, 99,  50, 0 },   // r > D
        { 64,  64,  9, 3,  700, 4, 1, 4, GGML_TYPE_F16, GGML_TYPE_F32, 16,  40, GGML_SPARQ_MEAN_V }, // 4 seqs, one stream
        { 64,  64,  9, 3,  500, 2, 3, 2, GGML_TYPE_F16, GGML_TYPE_F16, 16,  30, 0 },   // 3 streams
        { 80,  48,  6, 2,  300, 1, 1, 1, GGML_TYPE_F16, GGML_TYPE_F16, 10,  20, GGML_SPARQ_MEAN_V }, // D != Dv
        { 64,  64,  9, 3,  300, 8, 1, 1, GGML_TYPE_F16, GGML_TYPE_F16, 16, 400, 0 },   // k >= S, batch 8
        { 64,  64,  9, 3, 1500, 1, 1, 1, GGML_TYPE_F16, GGML_TYPE_F32, 16, 100, GGML_SPARQ_MEAN_V, true }, // V transposed
        { 64,  64,  9, 3,  300, 2, 1, 2, GGML_TYPE_F16, GGML_TYPE_F32, 16, 400, 0, true },
    };
    for (size_t i = 0; i < sizeof(fixed)/sizeof(fixed[0]); ++i) {
        run_case(&fixed[i]);
    }
    // random shapes
    const int n_rand = quick ? 10 : 40;
    for (int i = 0; i < n_rand; ++i) {
        struct sparq_case c;
        const int64_t Ds[] = { 32, 64, 80, 128 };
        c.D     = Ds[rng_int(0, 3)];
        c.Dv    = rng_int(0, 3) == 0 ? Ds[rng_int(0, 3)] : c.D;
        c.Hkv   = rng_int(1, 4);
        c.H     = c.Hkv*rng_int(1, 4);
        c.n_kv  = rng_int(1, rng_int(0, 1) ? 300 : 3000);
        c.n_tok = rng_int(1, 3);
        c.ns    = rng_int(1, 2);
        c.n_seq = rng_int(1, 3);
        c.kv_type   = rng_int(0, 1) ? GGML_TYPE_F16 : GGML_TYPE_F32;
        c.mask_type = rng_int(0, 1) ? GGML_TYPE_F16 : GGML_TYPE_F32;
        c.r     = rng_int(1, (int) c.D);
        c.k_top = rng_int(1, (int) c.n_kv + 2);
        c.flags = rng_int(0, 1) ? GGML_SPARQ_MEAN_V : 0;
        c.v_trans = rng_int(0, 3) == 0;
        run_case(&c);
    }

    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail == 0 ? 0 : 1;
}
