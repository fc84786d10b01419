// llama-sparse: CPU forward of GGML_OP_SPARQ_ATTN (SparQ attention, decode) and its scalar reference.
//
// A unit is one (KV head, query token, stream) with its G query heads. The fast kernel runs in three
// phases separated by barriers:
//   0. per unit (threads over units): visible positions, top-r components i1, per-head temperatures
//   A. approximate logits (threads over positions, every unit): only the r rows i1 of the transposed K
//      are read, each a contiguous run of positions
//   B. per unit (threads over units): softmax of the approximate logits, top-k positions of the group
//      sum, exact attention over them, mean-V blend
// The reference does the same per unit in plain loops with double accumulators and a full sort.
#define GGML_COMMON_DECL_C
#include "ggml-common.h" // block_q8_0: the 8-bit transposed K (blocks of 32 positions of one component)

#include "ggml-sparse-cpu-sparq.h"
#include "ggml-sparse.h"
#include "ggml-cpu-impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#if (defined(__F16C__) && defined(__AVX__)) || defined(__AVX2__)
#include <immintrin.h>
#endif

// positions per chunk of phase A: r rows of this many floats stay in L1
#define SPARQ_CHUNK 256

struct sparq_shape {
    const struct ggml_tensor * q, * k, * kt, * v, * mask, * v_mean;
    int64_t D, Dv, n_kv, n_tok, H, Hkv, G, ns, units;
    float   scale;
    int32_t r, k_top, flags;
};

static struct sparq_shape sparq_shape_of(const struct ggml_tensor * dst) {
    struct sparq_shape sh;
    sh.q      = dst->src[0];
    sh.k      = dst->src[1];
    sh.kt     = dst->src[2];
    sh.v      = dst->src[3];
    sh.mask   = dst->src[4];
    sh.v_mean = dst->src[5];
    sh.D      = sh.q->ne[0];
    sh.Dv     = sh.v->ne[0];
    sh.n_kv   = sh.k->ne[1];
    sh.n_tok  = sh.q->ne[1];
    sh.H      = sh.q->ne[2];
    sh.Hkv    = sh.k->ne[2];
    sh.G      = sh.H / sh.Hkv;
    sh.ns     = sh.q->ne[3];
    sh.units  = sh.Hkv*sh.n_tok*sh.ns;
    memcpy(&sh.scale, &dst->op_params[0], sizeof(float));
    sh.r      = dst->op_params[1];
    sh.k_top  = dst->op_params[2];
    sh.flags  = dst->op_params[3];
    if (sh.r > sh.D) {
        sh.r = (int32_t) sh.D;
    }
    return sh;
}

static inline float sparq_get(enum ggml_type type, const char * row, int64_t i) {
    if (type == GGML_TYPE_Q8_0) {
        const block_q8_0 * b = (const block_q8_0 *) row + i/QK8_0;
        return GGML_FP16_TO_FP32(b->d)*b->qs[i % QK8_0];
    }
    return type == GGML_TYPE_F16 ? GGML_FP16_TO_FP32(((const ggml_fp16_t *) row)[i]) : ((const float *) row)[i];
}

// own conversion loop (not ggml_cpu_fp16_to_fp32): the standalone test links ggml-base only
// Q8_0: row starts at a block and whole blocks are written (out needs n rounded up to 32)
static inline void sparq_row_f32(enum ggml_type type, const char * row, float * out, int64_t n) {
    if (type == GGML_TYPE_Q8_0) {
        const block_q8_0 * b = (const block_q8_0 *) row;
        for (int64_t ib = 0; ib*QK8_0 < n; ++ib) {
            const float d = GGML_FP16_TO_FP32(b[ib].d);
            float * o = out + ib*QK8_0;
#if defined(__AVX2__)
            const __m256 vd = _mm256_set1_ps(d);
            for (int j = 0; j < QK8_0; j += 8) {
                const __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *) (b[ib].qs + j)));
                _mm256_storeu_ps(o + j, _mm256_mul_ps(vd, _mm256_cvtepi32_ps(q)));
            }
#else
            for (int j = 0; j < QK8_0; ++j) {
                o[j] = d*b[ib].qs[j];
            }
#endif
        }
        return;
    }
    if (type != GGML_TYPE_F16) {
        memcpy(out, row, n*sizeof(float));
        return;
    }
    const ggml_fp16_t * h = (const ggml_fp16_t *) row;
    int64_t i = 0;
#if defined(__F16C__) && defined(__AVX__)
    for (; i + 8 <= n; i += 8) {
        _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) (h + i))));
    }
#endif
    for (; i < n; ++i) {
        out[i] = GGML_FP16_TO_FP32(h[i]);
    }
}

// n values of a row whose elements are stride bytes apart (the transposed V cache)
static inline void sparq_row_f32_strided(enum ggml_type type, const char * row, size_t stride, float * out, int64_t n) {
    if (stride == ggml_type_size(type)) {
        sparq_row_f32(type, row, out, n);
        return;
    }
    for (int64_t i = 0; i < n; ++i) {
        out[i] = type == GGML_TYPE_F16 ? GGML_FP16_TO_FP32(*(const ggml_fp16_t *) (row + i*stride)) : *(const float *) (row + i*stride);
    }
}

static inline const float * sparq_q(const struct sparq_shape * sh, int64_t h, int64_t t, int64_t s) {
    return (const float *) ((const char *) sh->q->data + t*sh->q->nb[1] + h*sh->q->nb[2] + s*sh->q->nb[3]);
}

static inline const char * sparq_mask_row(const struct sparq_shape * sh, int64_t t, int64_t s) {
    const struct ggml_tensor * m = sh->mask;
    return (const char *) m->data + t*m->nb[1] + (s % m->ne[3])*m->nb[3];
}

static inline const char * sparq_kt_row(const struct sparq_shape * sh, int64_t c, int64_t kh, int64_t s) {
    return (const char *) sh->kt->data + c*sh->kt->nb[1] + kh*sh->kt->nb[2] + s*sh->kt->nb[3];
}

static inline const char * sparq_k_row(const struct sparq_shape * sh, int64_t j, int64_t kh, int64_t s) {
    return (const char *) sh->k->data + j*sh->k->nb[1] + kh*sh->k->nb[2] + s*sh->k->nb[3];
}

static inline const char * sparq_v_row(const struct sparq_shape * sh, int64_t j, int64_t kh, int64_t s) {
    return (const char *) sh->v->data + j*sh->v->nb[1] + kh*sh->v->nb[2] + s*sh->v->nb[3];
}

static inline const float * sparq_vmean(const struct sparq_shape * sh, int64_t kh, int64_t t, int64_t s) {
    const struct ggml_tensor * m = sh->v_mean;
    return (const float *) ((const char *) m->data + kh*m->nb[1] + (t % m->ne[2])*m->nb[2] + (s % m->ne[3])*m->nb[3]);
}

static inline float * sparq_dst(const struct sparq_shape * sh, struct ggml_tensor * dst, int64_t h, int64_t t, int64_t s) {
    return (float *) dst->data + ((s*sh->n_tok + t)*sh->H + h)*sh->Dv;
}

#if defined(__AVX2__) && defined(__FMA__)
// expf of 8 lanes (Cephes polynomial, ~1e-7 relative); -INF and anything below -87.3 give 0
static inline __m256 sparq_exp8(__m256 x) {
    const __m256 lo    = _mm256_set1_ps(-87.3365447504f);
    const __m256 below = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_min_ps(_mm256_max_ps(x, lo), _mm256_set1_ps(88.3762626647949f));
    const __m256 fx = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(below, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}
#endif

// a[j] = exp(a[j] - max) / sum over j < n (masked entries are -INF and end at 0); adds the result to acc
static void sparq_softmax_acc(float * a, float * acc, int64_t n) {
    float mx = -INFINITY;
    for (int64_t j = 0; j < n; ++j) {
        mx = a[j] > mx ? a[j] : mx;
    }
    if (mx == -INFINITY) {
        return; // nothing visible
    }
    float sum = 0.0f;
    int64_t j = 0;
#if defined(__AVX2__) && defined(__FMA__)
    __m256 vs = _mm256_setzero_ps();
    const __m256 vmx = _mm256_set1_ps(mx);
    for (; j + 8 <= n; j += 8) {
        const __m256 e = sparq_exp8(_mm256_sub_ps(_mm256_loadu_ps(a + j), vmx));
        _mm256_storeu_ps(a + j, e);
        vs = _mm256_add_ps(vs, e);
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, vs);
    for (int i = 0; i < 8; ++i) {
        sum += lanes[i];
    }
#endif
    for (; j < n; ++j) {
        a[j] = expf(a[j] - mx);
        sum += a[j];
    }
    const float inv = 1.0f/sum;
    for (j = 0; j < n; ++j) {
        a[j] *= inv;
        acc[j] += a[j];
    }
}

// top-r components of sum_h |q_h| over the group, ties to the lower index; returns the count (<= r)
// i1 ends sorted ascending (memory order of the k_t rows). absq: D floats of scratch.
static int64_t sparq_top_components(const struct sparq_shape * sh, int64_t kh, int64_t t, int64_t s,
                                    float * absq, int32_t * i1) {
    const int64_t D = sh->D;
    for (int64_t c = 0; c < D; ++c) {
        absq[c] = 0.0f;
    }
    for (int64_t g = 0; g < sh->G; ++g) {
        const float * q = sparq_q(sh, kh*sh->G + g, t, s);
        for (int64_t c = 0; c < D; ++c) {
            absq[c] += fabsf(q[c]);
        }
    }
    // r passes of arg-max would be O(rD); a rank count is O(D^2) but D <= 256 and it is branch-light
    int64_t n = 0;
    for (int64_t c = 0; c < D; ++c) {
        int64_t rank = 0;
        for (int64_t e = 0; e < D; ++e) {
            rank += absq[e] > absq[c] || (absq[e] == absq[c] && e < c);
        }
        if (rank < sh->r) {
            i1[n++] = (int32_t) c;
        }
    }
    return n;
}

// scale / sqrt(rho_h), rho_h = ||q_h[i1]||_1 / ||q_h||_1 (rho = 1 when either norm is 0)
static float sparq_temp_scale(const struct sparq_shape * sh, const float * q, const int32_t * i1, int64_t n1) {
    double l1 = 0.0, l1r = 0.0;
    for (int64_t c = 0; c < sh->D; ++c) {
        l1 += fabsf(q[c]);
    }
    for (int64_t i = 0; i < n1; ++i) {
        l1r += fabsf(q[i1[i]]);
    }
    const double rho = (l1 > 0.0 && l1r > 0.0) ? l1r/l1 : 1.0;
    return (float) (sh->scale/sqrt(rho));
}

// k-th largest of vals[0..n) (1 <= k <= n); vals is reordered
static float sparq_kth_largest(float * vals, int64_t n, int64_t k) {
    int64_t lo = 0, hi = n - 1;
    const int64_t want = k - 1;
    while (lo < hi) {
        const float pivot = vals[lo + (hi - lo)/2];
        int64_t i = lo, j = hi;
        while (i <= j) {
            while (vals[i] > pivot) i++;
            while (vals[j] < pivot) j--;
            if (i <= j) {
                const float tmp = vals[i]; vals[i] = vals[j]; vals[j] = tmp;
                i++; j--;
            }
        }
        if (want <= j) {
            hi = j;
        } else if (want >= i) {
            lo = i;
        } else {
            break;
        }
    }
    return vals[want];
}

// the k highest of score over the positions in vis[0..nv), ties to the lower position; out ascending
static int64_t sparq_select(const float * score, const int32_t * vis, int64_t nv, int64_t k, float * vals, int32_t * out) {
    for (int64_t i = 0; i < nv; ++i) {
        vals[i] = score[vis[i]];
    }
    const float tau = sparq_kth_largest(vals, nv, k);
    int64_t n_gt = 0;
    for (int64_t i = 0; i < nv; ++i) {
        n_gt += score[vis[i]] > tau;
    }
    int64_t n_eq = k - n_gt, n = 0;
    for (int64_t i = 0; i < nv; ++i) {
        const float x = score[vis[i]];
        if (x > tau || (x == tau && n_eq-- > 0)) {
            out[n++] = vis[i];
        }
    }
    return n;
}

//
// fast kernel
//

// per-thread scratch in floats
static size_t sparq_thread_floats(const struct sparq_shape * sh) {
    const int64_t D = sh->D, G = sh->G, n_kv = sh->n_kv;
    const int64_t dmax = D > sh->Dv ? D : sh->Dv;
    return 16 + 2*D + dmax + G*D + G*sh->Dv + G*n_kv + 4*n_kv + (int64_t) (sh->r + 1)*SPARQ_CHUNK;
}

// shared: approximate logits [units][G][n_kv], i1 [units][D], temperatures [units][G], visible counts [units]
static size_t sparq_shared_floats(const struct sparq_shape * sh) {
    return 16 + sh->units*(sh->G*sh->n_kv + sh->D + sh->G + 1);
}

size_t ggml_sparse_cpu_sparq_work_size(const struct ggml_tensor * node, int n_tasks) {
    const struct sparq_shape sh = sparq_shape_of(node);
    return sizeof(float)*(sparq_shared_floats(&sh) + (size_t) n_tasks*sparq_thread_floats(&sh)) + 64*(size_t) (n_tasks + 2);
}

static void * sparq_align64(void * p) {
    return (void *) (((uintptr_t) p + 63) & ~(uintptr_t) 63);
}

// exact attention of the group over the positions sel[0..n) and the output (with the blend when asked);
// shat: the group's normalized approximate scores [G][n_kv] or NULL (dense: no blend)
static void sparq_exact(const struct sparq_shape * sh, struct ggml_tensor * dst, int64_t kh, int64_t t, int64_t s,
                        const int32_t * sel, int64_t n, const float * shat, float * qf, float * row, float * logit, float * acc) {
    const int64_t D = sh->D, Dv = sh->Dv, G = sh->G, n_kv = sh->n_kv;
    const char * mrow = sparq_mask_row(sh, t, s);
    const enum ggml_type mt = sh->mask->type;

    for (int64_t g = 0; g < G; ++g) {
        memcpy(qf + g*D, sparq_q(sh, kh*G + g, t, s), D*sizeof(float));
    }
    for (int64_t m = 0; m < n; ++m) {
        sparq_row_f32(sh->k->type, sparq_k_row(sh, sel[m], kh, s), row, D);
        const float mk = sparq_get(mt, mrow, sel[m]);
        for (int64_t g = 0; g < G; ++g) {
            const float * q = qf + g*D;
            float dot = 0.0f;
            for (int64_t c = 0; c < D; ++c) {
                dot += q[c]*row[c];
            }
            logit[g*n_kv + m] = sh->scale*dot + mk;
        }
    }
    for (int64_t g = 0; g < G; ++g) {
        float * l = logit + g*n_kv;
        float mx = -INFINITY;
        for (int64_t m = 0; m < n; ++m) {
            mx = l[m] > mx ? l[m] : mx;
        }
        float sum = 0.0f;
        for (int64_t m = 0; m < n; ++m) {
            l[m] = expf(l[m] - mx);
            sum += l[m];
        }
        const float inv = sum > 0.0f ? 1.0f/sum : 0.0f;
        for (int64_t m = 0; m < n; ++m) {
            l[m] *= inv;
        }
    }
    memset(acc, 0, G*Dv*sizeof(float));
    for (int64_t m = 0; m < n; ++m) {
        sparq_row_f32_strided(sh->v->type, sparq_v_row(sh, sel[m], kh, s), sh->v->nb[0], row, Dv);
        for (int64_t g = 0; g < G; ++g) {
            const float p = logit[g*n_kv + m];
            float * a = acc + g*Dv;
            for (int64_t c = 0; c < Dv; ++c) {
                a[c] += p*row[c];
            }
        }
    }
    for (int64_t g = 0; g < G; ++g) {
        float * out = sparq_dst(sh, dst, kh*G + g, t, s);
        const float * a = acc + g*Dv;
        if (shat != NULL && (sh->flags & GGML_SPARQ_MEAN_V)) {
            float alpha = 0.0f;
            for (int64_t m = 0; m < n; ++m) {
                alpha += shat[g*n_kv + sel[m]];
            }
            const float * vm = sparq_vmean(sh, kh, t, s);
            for (int64_t c = 0; c < Dv; ++c) {
                out[c] = alpha*a[c] + (1.0f - alpha)*vm[c];
            }
        } else {
            memcpy(out, a, Dv*sizeof(float));
        }
    }
}

void ggml_sparse_cpu_forward_sparq(const struct ggml_compute_params * params, struct ggml_tensor * dst) {
    static int env_ref = -1;
    if (env_ref < 0) {
        const char * e = getenv("LLAMA_SPARSE_CPU_REF");
        env_ref = (e != NULL && atoi(e) != 0) ? 1 : 0;
    }
    if (params->use_ref || env_ref == 1) {
        if (params->ith == 0) {
            ggml_sparse_cpu_sparq_ref(dst);
        }
        return;
    }

    const struct sparq_shape sh = sparq_shape_of(dst);
    const int ith = params->ith, nth = params->nth;
    const int64_t D = sh.D, G = sh.G, n_kv = sh.n_kv, units = sh.units;

    float   * shared = sparq_align64(params->wdata);
    float   * approx = shared;                                      // [units][G][n_kv]
    int32_t * i1_all = (int32_t *) (approx + units*G*n_kv);         // [units][D]
    float   * sc_all = (float *) (i1_all + units*D);                // [units][G]
    int32_t * nv_all = (int32_t *) (sc_all + units*G);              // [units]: visible count, or -1 dense

    float * mine = sparq_align64((char *) params->wdata + 64 + sizeof(float)*sparq_shared_floats(&sh)
                                 + (size_t) ith*(sizeof(float)*sparq_thread_floats(&sh) + 64));
    float   * absq  = mine;
    float   * qf    = absq + D;
    float   * row   = qf + G*D;
    float   * acc   = row + (D > sh.Dv ? D : sh.Dv);
    float   * logit = acc + G*sh.Dv;
    float   * ssum  = logit + G*n_kv;
    float   * vals  = ssum + n_kv;
    int32_t * vis   = (int32_t *) (vals + n_kv);
    int32_t * sel   = vis + n_kv;
    float   * kbuf  = (float *) (sel + n_kv);

    // phase 0
    for (int64_t u = ith; u < units; u += nth) {
        const int64_t kh = u % sh.Hkv, t = (u/sh.Hkv) % sh.n_tok, s = u/(sh.Hkv*sh.n_tok);
        const char * mrow = sparq_mask_row(&sh, t, s);
        int64_t nv = 0;
        for (int64_t j = 0; j < n_kv; ++j) {
            nv += sparq_get(sh.mask->type, mrow, j) != -INFINITY;
        }
        if (sh.k_top >= nv) {
            nv_all[u] = -1;
            continue;
        }
        nv_all[u] = (int32_t) nv;
        int32_t * i1 = i1_all + u*D;
        const int64_t n1 = sparq_top_components(&sh, kh, t, s, absq, i1);
        GGML_ASSERT(n1 == sh.r);
        for (int64_t g = 0; g < G; ++g) {
            sc_all[u*G + g] = sparq_temp_scale(&sh, sparq_q(&sh, kh*G + g, t, s), i1, n1);
        }
    }
    ggml_barrier(params->threadpool);

    // phase A: positions [j0, j1) of every unit
    const int64_t per = ((n_kv + nth - 1)/nth + 31) & ~(int64_t) 31; // whole Q8_0 blocks
    const int64_t j0  = ith*per < n_kv ? ith*per : n_kv;
    const int64_t j1  = j0 + per < n_kv ? j0 + per : n_kv;
    for (int64_t u = 0; u < units; ++u) {
        if (nv_all[u] < 0) {
            continue;
        }
        const int64_t kh = u % sh.Hkv, t = (u/sh.Hkv) % sh.n_tok, s = u/(sh.Hkv*sh.n_tok);
        const int32_t * i1 = i1_all + u*D;
        const char * mrow = sparq_mask_row(&sh, t, s);
        for (int64_t c0 = j0; c0 < j1; c0 += SPARQ_CHUNK) {
            const int64_t nc = c0 + SPARQ_CHUNK < j1 ? SPARQ_CHUNK : j1 - c0;
            for (int64_t i = 0; i < sh.r; ++i) {
                const char * ktr = sparq_kt_row(&sh, i1[i], kh, s) + ggml_row_size(sh.kt->type, c0);
                sparq_row_f32(sh.kt->type, ktr, kbuf + i*SPARQ_CHUNK, nc);
            }
            float * mbuf = kbuf + sh.r*SPARQ_CHUNK;
            sparq_row_f32(sh.mask->type, mrow + c0*sh.mask->nb[0], mbuf, nc);
            for (int64_t g = 0; g < G; ++g) {
                const float * q = sparq_q(&sh, kh*G + g, t, s);
                float * out = approx + (u*G + g)*n_kv + c0;
                for (int64_t j = 0; j < nc; ++j) {
                    out[j] = 0.0f;
                }
                for (int64_t i = 0; i < sh.r; ++i) {
                    const float qc = q[i1[i]];
                    const float * kr = kbuf + i*SPARQ_CHUNK;
                    for (int64_t j = 0; j < nc; ++j) {
                        out[j] += qc*kr[j];
                    }
                }
                const float sc = sc_all[u*G + g];
                for (int64_t j = 0; j < nc; ++j) {
                    out[j] = mbuf[j] == -INFINITY ? -INFINITY : sc*out[j] + mbuf[j];
                }
            }
        }
    }
    ggml_barrier(params->threadpool);

    // phase B
    for (int64_t u = ith; u < units; u += nth) {
        const int64_t kh = u % sh.Hkv, t = (u/sh.Hkv) % sh.n_tok, s = u/(sh.Hkv*sh.n_tok);
        const char * mrow = sparq_mask_row(&sh, t, s);
        int64_t nv = 0;
        for (int64_t j = 0; j < n_kv; ++j) {
            if (sparq_get(sh.mask->type, mrow, j) != -INFINITY) {
                vis[nv++] = (int32_t) j;
            }
        }
        if (nv_all[u] < 0) {
            sparq_exact(&sh, dst, kh, t, s, vis, nv, NULL, qf, row, logit, acc);
            continue;
        }
        // softmax over every position: masked ones hold -INF and get 0, and the loops stay contiguous
        float * shat = approx + u*G*n_kv;
        memset(ssum, 0, n_kv*sizeof(float));
        for (int64_t g = 0; g < G; ++g) {
            sparq_softmax_acc(shat + g*n_kv, ssum, n_kv);
        }
        const int64_t n = sparq_select(ssum, vis, nv, sh.k_top, vals, sel);
        sparq_exact(&sh, dst, kh, t, s, sel, n, shat, qf, row, logit, acc);
    }
}

//
// scalar reference
//

struct sparq_ranked {
    double  key;
    int32_t idx;
};

// descending key, ties to the lower index
static int sparq_ranked_cmp(const void * a, const void * b) {
    const struct sparq_ranked * x = a, * y = b;
    if (x->key != y->key) {
        return x->key > y->key ? -1 : 1;
    }
    return x->idx < y->idx ? -1 : (x->idx > y->idx);
}

static int sparq_int_cmp(const void * a, const void * b) {
    const int32_t x = *(const int32_t *) a, y = *(const int32_t *) b;
    return x < y ? -1 : (x > y);
}

void ggml_sparse_cpu_sparq_ref(struct ggml_tensor * dst) {
    const struct sparq_shape sh = sparq_shape_of(dst);
    const int64_t D = sh.D, Dv = sh.Dv, G = sh.G, n_kv = sh.n_kv;
    const enum ggml_type mt = sh.mask->type;

    const int64_t nr = n_kv > D ? n_kv : D;
    struct sparq_ranked * rank = malloc(nr*sizeof(*rank));
    int32_t * i1   = malloc(D*sizeof(int32_t));
    int32_t * vis  = malloc(n_kv*sizeof(int32_t));
    int32_t * sel  = malloc(n_kv*sizeof(int32_t));
    double  * shat = malloc(G*n_kv*sizeof(double));
    double  * p    = malloc(n_kv*sizeof(double));
    double  * y    = malloc(Dv*sizeof(double));
    GGML_ASSERT(rank && i1 && vis && sel && shat && p && y);

    for (int64_t s = 0; s < sh.ns; ++s)
    for (int64_t t = 0; t < sh.n_tok; ++t)
    for (int64_t kh = 0; kh < sh.Hkv; ++kh) {
        const char * mrow = sparq_mask_row(&sh, t, s);
        int64_t nv = 0;
        for (int64_t j = 0; j < n_kv; ++j) {
            if (sparq_get(mt, mrow, j) != -INFINITY) {
                vis[nv++] = (int32_t) j;
            }
        }
        const bool dense = sh.k_top >= nv;
        int64_t n_sel = nv;
        memcpy(sel, vis, nv*sizeof(int32_t));

        if (!dense) {
            // step 1: components by group-summed |q|
            for (int64_t c = 0; c < D; ++c) {
                double a = 0.0;
                for (int64_t g = 0; g < G; ++g) {
                    a += fabs(sparq_q(&sh, kh*G + g, t, s)[c]);
                }
                rank[c].key = (float) a; // the kernel ranks float sums
                rank[c].idx = (int32_t) c;
            }
            qsort(rank, D, sizeof(*rank), sparq_ranked_cmp);
            for (int64_t i = 0; i < sh.r; ++i) {
                i1[i] = rank[i].idx;
            }
            for (int64_t g = 0; g < G; ++g) {
                const float * q = sparq_q(&sh, kh*G + g, t, s);
                double l1 = 0.0, l1r = 0.0;
                for (int64_t c = 0; c < D; ++c) {
                    l1 += fabs(q[c]);
                }
                for (int64_t i = 0; i < sh.r; ++i) {
                    l1r += fabs(q[i1[i]]);
                }
                const double rho = (l1 > 0.0 && l1r > 0.0) ? l1r/l1 : 1.0;
                const double sc  = sh.scale/sqrt(rho);
                double * a = shat + g*n_kv;
                double mx = -INFINITY;
                for (int64_t m = 0; m < nv; ++m) {
                    double dot = 0.0;
                    for (int64_t i = 0; i < sh.r; ++i) {
                        dot += (double) q[i1[i]]*sparq_get(sh.kt->type, sparq_kt_row(&sh, i1[i], kh, s), vis[m]);
                    }
                    a[m] = sc*dot + sparq_get(mt, mrow, vis[m]);
                    mx = a[m] > mx ? a[m] : mx;
                }
                double sum = 0.0;
                for (int64_t m = 0; m < nv; ++m) {
                    a[m] = exp(a[m] - mx);
                    sum += a[m];
                }
                for (int64_t m = 0; m < nv; ++m) {
                    a[m] /= sum;
                }
            }
            // step 2: positions by group-summed approximate score
            for (int64_t m = 0; m < nv; ++m) {
                double sum = 0.0;
                for (int64_t g = 0; g < G; ++g) {
                    sum += shat[g*n_kv + m];
                }
                rank[m].key = sum;
                rank[m].idx = (int32_t) m; // index into vis: same order as positions
            }
            qsort(rank, nv, sizeof(*rank), sparq_ranked_cmp);
            n_sel = sh.k_top;
            for (int64_t i = 0; i < n_sel; ++i) {
                sel[i] = rank[i].idx;
            }
            qsort(sel, n_sel, sizeof(int32_t), sparq_int_cmp);
        } else {
            for (int64_t m = 0; m < nv; ++m) {
                sel[m] = (int32_t) m;
            }
        }

        // exact attention over vis[sel[.]]
        for (int64_t g = 0; g < G; ++g) {
            const float * q = sparq_q(&sh, kh*G + g, t, s);
            double mx = -INFINITY;
            for (int64_t i = 0; i < n_sel; ++i) {
                const int32_t j = vis[sel[i]];
                const char * kr = sparq_k_row(&sh, j, kh, s);
                double dot = 0.0;
                for (int64_t c = 0; c < D; ++c) {
                    dot += (double) q[c]*sparq_get(sh.k->type, kr, c);
                }
                p[i] = sh.scale*dot + sparq_get(mt, mrow, j);
                mx = p[i] > mx ? p[i] : mx;
            }
            double sum = 0.0;
            for (int64_t i = 0; i < n_sel; ++i) {
                p[i] = exp(p[i] - mx);
                sum += p[i];
            }
            for (int64_t c = 0; c < Dv; ++c) {
                y[c] = 0.0;
            }
            for (int64_t i = 0; i < n_sel; ++i) {
                const char * vr = sparq_v_row(&sh, vis[sel[i]], kh, s);
                for (int64_t c = 0; c < Dv; ++c) {
                    y[c] += p[i]/sum*sparq_get(sh.v->type, vr + c*sh.v->nb[0], 0);
                }
            }
            float * out = sparq_dst(&sh, dst, kh*G + g, t, s);
            if (!dense && (sh.flags & GGML_SPARQ_MEAN_V)) {
                double alpha = 0.0;
                for (int64_t i = 0; i < n_sel; ++i) {
                    alpha += shat[g*n_kv + sel[i]];
                }
                const float * vm = sparq_vmean(&sh, kh, t, s);
                for (int64_t c = 0; c < Dv; ++c) {
                    out[c] = (float) (alpha*y[c] + (1.0 - alpha)*vm[c]);
                }
            } else {
                for (int64_t c = 0; c < Dv; ++c) {
                    out[c] = nv > 0 ? (float) y[c] : 0.0f;
                }
            }
        }
    }

    free(rank); free(i1); free(vis); free(sel); free(shat); free(p); free(y);
}
