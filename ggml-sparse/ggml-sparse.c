// llama-sparse: op constructors and zigzag tagging (compiled into ggml-base).
#include "ggml-sparse.h"
#include "ggml-impl.h"
#include "ggml-threading.h"

#include <string.h>

void ggml_sparse_set_zigzag(struct ggml_tensor * w, int32_t layer, int32_t group) {
    GGML_ASSERT(w->op == GGML_OP_NONE);
    GGML_ASSERT(ggml_sparse_zz_type_ok(w->type));
    const int32_t params[3] = { GGML_SPARSE_ZZ_MAGIC, layer, group };
    memcpy(w->op_params, params, sizeof(params));
}

bool ggml_sparse_is_zigzag(const struct ggml_tensor * w) {
    return w != NULL && w->op == GGML_OP_NONE && w->op_params[0] == GGML_SPARSE_ZZ_MAGIC;
}

int32_t ggml_sparse_zigzag_layer(const struct ggml_tensor * w) {
    return ggml_sparse_is_zigzag(w) ? w->op_params[1] : -1;
}

int32_t ggml_sparse_zigzag_group(const struct ggml_tensor * w) {
    return ggml_sparse_is_zigzag(w) ? w->op_params[2] : -1;
}

int64_t ggml_sparse_zz_n(const struct ggml_tensor * w) {
    return w->ne[0] / ggml_blck_size(w->type);
}

int64_t ggml_sparse_zz_m(const struct ggml_tensor * w) {
    return w->ne[1] * ggml_blck_size(w->type);
}

bool ggml_sparse_zz_type_ok(enum ggml_type type) {
    switch (type) {
        case GGML_TYPE_Q4_0:
        case GGML_TYPE_Q8_0:
        case GGML_TYPE_Q4_K:
        case GGML_TYPE_Q6_K:
            return true;
        default:
            return false;
    }
}

struct ggml_tensor * ggml_sparse_idx(
        struct ggml_context * ctx,
        struct ggml_tensor  * x,
        float                 threshold,
        enum ggml_sparse_idx_mode mode) {
    GGML_ASSERT(x->type == GGML_TYPE_F32);
    GGML_ASSERT(ggml_is_contiguous(x));
    GGML_ASSERT(x->ne[2] == 1 && x->ne[3] == 1);

    struct ggml_tensor * result;
    if (mode == GGML_SPARSE_IDX_LIST) {
        GGML_ASSERT(x->ne[1] <= GGML_SPARSE_MAX_BATCH);
        result = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, x->ne[0] + 1);
    } else {
        result = ggml_new_tensor(ctx, GGML_TYPE_F32, GGML_MAX_DIMS, x->ne);
    }

    int32_t params[4] = { 0, (int32_t) mode, 0, 0 }; // [2..3]: stats pointer, see ggml_sparse_idx_set_stats
    memcpy(&params[0], &threshold, sizeof(float));
    memcpy(result->op_params, params, sizeof(params));

    result->op     = GGML_OP_SPARSE_IDX;
    result->src[0] = x;

    return result;
}

void ggml_sparse_idx_set_stats(struct ggml_tensor * idx, struct ggml_sparse_stats * stats) {
    GGML_ASSERT(idx->op == GGML_OP_SPARSE_IDX);
    memcpy(&idx->op_params[2], &stats, sizeof(stats));
}

struct ggml_sparse_stats * ggml_sparse_idx_get_stats(const struct ggml_tensor * idx) {
    struct ggml_sparse_stats * stats;
    memcpy(&stats, &idx->op_params[2], sizeof(stats));
    return stats;
}

// registries of backend callbacks (stats collectors, relayouts): each fn added once, called outside the lock
#define GGML_SPARSE_MAX_FNS 8

typedef void (*sparse_fn)(void);

struct sparse_fns {
    sparse_fn fn[GGML_SPARSE_MAX_FNS];
    int       n;
};

static struct sparse_fns sparse_collectors;
static struct sparse_fns sparse_relayouts;

static void sparse_fns_add(struct sparse_fns * r, sparse_fn fn) {
    ggml_critical_section_start();
    bool known = false;
    for (int i = 0; i < r->n; ++i) {
        known = known || r->fn[i] == fn;
    }
    if (!known) {
        GGML_ASSERT(r->n < GGML_SPARSE_MAX_FNS);
        r->fn[r->n++] = fn;
    }
    ggml_critical_section_end();
}

static struct sparse_fns sparse_fns_get(const struct sparse_fns * r) {
    ggml_critical_section_start();
    const struct sparse_fns copy = *r;
    ggml_critical_section_end();
    return copy;
}

void ggml_sparse_stats_add_collector(ggml_sparse_stats_collector fn) {
    sparse_fns_add(&sparse_collectors, (sparse_fn) fn);
}

static void sparse_stats_collect(struct ggml_sparse_stats * stats, bool release) {
    const struct sparse_fns fns = sparse_fns_get(&sparse_collectors);
    for (int i = 0; i < fns.n; ++i) {
        ((ggml_sparse_stats_collector) fns.fn[i])(stats, release);
    }
}

void ggml_sparse_stats_collect(struct ggml_sparse_stats * stats) {
    sparse_stats_collect(stats, false);
}

void ggml_sparse_stats_release(struct ggml_sparse_stats * stats) {
    sparse_stats_collect(stats, true);
}

void ggml_sparse_zz_add_relayout(ggml_sparse_zz_relayout_fn fn) {
    sparse_fns_add(&sparse_relayouts, (sparse_fn) fn);
}

bool ggml_sparse_zz_relayout(struct ggml_tensor * w) {
    const struct sparse_fns fns = sparse_fns_get(&sparse_relayouts);
    for (int i = 0; i < fns.n; ++i) {
        if (((ggml_sparse_zz_relayout_fn) fns.fn[i])(w)) {
            return true;
        }
    }
    return false;
}

bool ggml_sparse_mem_overlaps(const struct ggml_tensor * a, const struct ggml_tensor * b) {
    if (a == NULL || b == NULL || a->data == NULL || b->data == NULL) {
        return false;
    }
    const char * a0 = (const char *) a->data;
    const char * b0 = (const char *) b->data;
    return a0 < b0 + ggml_nbytes(b) && b0 < a0 + ggml_nbytes(a);
}

// does node k read or write memory that overlaps t?
static bool zz_node_touches(const struct ggml_tensor * k, const struct ggml_tensor * t) {
    if (ggml_sparse_mem_overlaps(k, t)) {
        return true;
    }
    for (int s = 0; s < GGML_MAX_SRC; ++s) {
        if (ggml_sparse_mem_overlaps(k->src[s], t)) {
            return true;
        }
    }
    return false;
}

// the next node after *j that a backend computes (views and no-ops skipped), NULL past the end or where that node
// is not flagged to compute
static struct ggml_tensor * rs_next(struct ggml_cgraph * graph, int * j) {
    for (++*j; *j < ggml_graph_n_nodes(graph); ++*j) {
        struct ggml_tensor * t = ggml_graph_node(graph, *j);
        if (!ggml_is_empty(t) && !ggml_op_is_empty(t->op)) {
            return (t->flags & GGML_TENSOR_FLAG_COMPUTE) ? t : NULL;
        }
    }
    return NULL;
}

static int rs_index(const struct ggml_cgraph * graph, const struct ggml_tensor * t, int lo, int hi) {
    for (int j = lo; j < hi; ++j) {
        if (graph->nodes[j] == t) {
            return j;
        }
    }
    return -1;
}

bool ggml_sparse_rope_store_nodes(struct ggml_cgraph * graph, int i, struct ggml_sparse_rs_nodes * m) {
    memset(m, 0, sizeof(*m));
    if (i < 0 || i >= ggml_graph_n_nodes(graph)) {
        return false;
    }
    struct ggml_tensor * r0 = ggml_graph_node(graph, i);
    if (r0->op != GGML_OP_ROPE) {
        return false;
    }
    int j = i;
    struct ggml_tensor * rq = r0;
    struct ggml_tensor * rk = rs_next(graph, &j);
    if (rk == NULL || (rk->op != GGML_OP_ROPE && rk->op != GGML_OP_SET_ROWS)) {
        return false;
    }
    if (rk->op == GGML_OP_SET_ROWS) { // k's rope alone
        rq = NULL;
        rk = r0;
        j  = i;
    }
    const int jk = j;
    const int64_t n = ggml_nelements(rk);
    struct ggml_tensor * sk = NULL, * sv = NULL, * skt = NULL;
    int js = -1, jt = -1;
    for (int w = 0; w < 3; ++w) {
        int jn = j;
        struct ggml_tensor * t = rs_next(graph, &jn);
        if (t == NULL || t->op != GGML_OP_SET_ROWS) {
            break;
        }
        const struct ggml_tensor * x = t->src[0];
        if (sk == NULL && x->op == GGML_OP_VIEW && x->view_src == rk) {
            sk = t;
            js = jn;
        } else if (skt == NULL && x->op == GGML_OP_RESHAPE && x->view_src == rk) {
            const struct ggml_tensor * idx = t->src[1];
            if (x->ne[0] != 1 || x->ne[1] != n || !ggml_is_contiguous(x) || t->ne[0] != 1 || idx->type != GGML_TYPE_I64 ||
                    !ggml_is_contiguous(idx) || idx->ne[0] != n || ggml_nelements(idx) != n) {
                return false; // k's rope output has a reader the kernel does not serve
            }
            skt = t;
            jt  = jn;
        } else if (sv == NULL && x->view_src != rk && x != rk) {
            sv = t;
        } else {
            break;
        }
        j = jn;
    }
    if (sk == NULL || sv == NULL) {
        return false;
    }
    const struct ggml_tensor * kv = sk->src[0];
    const int jkv = rs_index(graph, kv, jk + 1, js);
    const int jkr = skt ? rs_index(graph, skt->src[0], jk + 1, jt) : 0;
    if (jkv < 0 || jkr < 0) {
        return false;
    }
    const int           k_idx[5] = { jk, jkv, js, jkr, jt };
    const enum ggml_op  k_ops[5] = { GGML_OP_ROPE, GGML_OP_VIEW, GGML_OP_SET_ROWS, GGML_OP_RESHAPE, GGML_OP_SET_ROWS };
    const int           k_out[2] = { js, jt };
    if (!ggml_can_fuse_subgraph_ext(graph, k_idx, skt ? 5 : 3, k_ops, k_out, skt ? 2 : 1) || kv->view_offs != 0 ||
            !ggml_is_contiguous(kv) || !ggml_is_contiguous(rk) || kv->ne[0] != rk->ne[0]*rk->ne[1] || kv->ne[1] != rk->ne[2] ||
            kv->ne[2] != 1 || kv->ne[3] != 1) {
        return false;
    }
    m->rq   = rq;
    m->rk   = rk;
    m->sk   = sk;
    m->sv   = sv;
    m->skt  = skt;
    m->last = j;
    return true;
}

int ggml_sparse_zz_siblings(struct ggml_cgraph * graph, int i, int window, int * nodes, int max_nodes) {
    const int n_nodes = ggml_graph_n_nodes(graph);
    if (i < 0 || i >= n_nodes || max_nodes < 1) {
        return 0;
    }
    const struct ggml_tensor * a = ggml_graph_node(graph, i);
    if (a->op != GGML_OP_MUL_MAT_ZZ) {
        return 0;
    }
    int count = 0;
    nodes[count++] = i;
    for (int j = i + 1; j < n_nodes && j <= i + window && count < max_nodes; ++j) {
        const struct ggml_tensor * b = ggml_graph_node(graph, j);
        if (b->op != GGML_OP_MUL_MAT_ZZ || (b->flags & GGML_TENSOR_FLAG_COMPUTE) == 0 ||
                b->src[1] != a->src[1] || b->src[2] != a->src[2] ||
                b->src[0]->type != a->src[0]->type || b->src[0]->ne[0] != a->src[0]->ne[0] || b->data == NULL) {
            continue;
        }
        bool safe = true;
        for (int k = i; k < j && safe; ++k) {
            safe = !zz_node_touches(ggml_graph_node(graph, k), b);
        }
        if (safe) {
            nodes[count++] = j;
        }
    }
    return count;
}

struct ggml_tensor * ggml_mul_mat_zz(
        struct ggml_context * ctx,
        struct ggml_tensor  * w,
        struct ggml_tensor  * x,
        struct ggml_tensor  * idx) {
    GGML_ASSERT(ggml_sparse_zz_type_ok(w->type));
    GGML_ASSERT(ggml_is_contiguous(w));
    GGML_ASSERT(w->ne[2] == 1 && w->ne[3] == 1);
    GGML_ASSERT(x->type == GGML_TYPE_F32);
    GGML_ASSERT(x->ne[0] == ggml_sparse_zz_n(w));
    GGML_ASSERT(x->ne[2] == 1 && x->ne[3] == 1);
    GGML_ASSERT(x->nb[0] == sizeof(float));
    if (idx) {
        GGML_ASSERT(idx->type == GGML_TYPE_I32 && idx->ne[0] == x->ne[0] + 1);
        GGML_ASSERT(x->ne[1] <= GGML_SPARSE_MAX_BATCH);
    }

    const int64_t ne[4] = { ggml_sparse_zz_m(w), x->ne[1], 1, 1 };
    struct ggml_tensor * result = ggml_new_tensor(ctx, GGML_TYPE_F32, 4, ne);

    result->op     = GGML_OP_MUL_MAT_ZZ;
    result->src[0] = w;
    result->src[1] = x;
    result->src[2] = idx;

    return result;
}

//
// SparQ attention (decode)
//

static void sparq_check_args(
        const struct ggml_tensor * q,
        const struct ggml_tensor * k,
        const struct ggml_tensor * k_t,
        const struct ggml_tensor * v,
        const struct ggml_tensor * mask,
        const struct ggml_tensor * v_mean,
        int32_t r, int32_t k_top, int32_t flags) {
    GGML_ASSERT(q->type == GGML_TYPE_F32 && q->nb[0] == sizeof(float));
    GGML_ASSERT(k->type   == GGML_TYPE_F16 || k->type   == GGML_TYPE_F32);
    GGML_ASSERT(k_t->type == GGML_TYPE_F16 || k_t->type == GGML_TYPE_F32 || k_t->type == GGML_TYPE_Q8_0);
    GGML_ASSERT(v->type   == GGML_TYPE_F16 || v->type   == GGML_TYPE_F32);
    GGML_ASSERT(k->nb[0] == ggml_type_size(k->type) && k_t->nb[0] == ggml_type_size(k_t->type));

    const int64_t D    = q->ne[0];
    const int64_t n_kv = k->ne[1];
    const int64_t Hkv  = k->ne[2];
    const int64_t ns   = q->ne[3];

    GGML_ASSERT(k->ne[0] == D && k->ne[3] == ns);
    GGML_ASSERT(k_t->ne[0] == n_kv && k_t->ne[1] == D && k_t->ne[2] == Hkv && k_t->ne[3] == ns);
    GGML_ASSERT(v->ne[1] == n_kv && v->ne[2] == Hkv && v->ne[3] == ns);
    // Q8_0 k_t: blocks of 32 positions, whole blocks readable
    GGML_ASSERT(k_t->type != GGML_TYPE_Q8_0 || (n_kv % 32 == 0 && k_t->nb[1] >= ggml_row_size(GGML_TYPE_Q8_0, n_kv)));
    GGML_ASSERT(Hkv > 0 && q->ne[2] % Hkv == 0);

    GGML_ASSERT(mask != NULL);
    GGML_ASSERT(mask->type == GGML_TYPE_F16 || mask->type == GGML_TYPE_F32);
    GGML_ASSERT(mask->nb[0] == ggml_type_size(mask->type));
    GGML_ASSERT(mask->ne[0] == n_kv && mask->ne[1] >= q->ne[1] && mask->ne[2] == 1);
    GGML_ASSERT(mask->ne[3] == 1 || mask->ne[3] == ns);

    if (flags & GGML_SPARQ_MEAN_V) {
        GGML_ASSERT(v_mean != NULL);
    }
    if (v_mean) {
        GGML_ASSERT(v_mean->type == GGML_TYPE_F32 && v_mean->nb[0] == sizeof(float));
        GGML_ASSERT(v_mean->ne[0] == v->ne[0] && v_mean->ne[1] == Hkv);
        GGML_ASSERT(v_mean->ne[2] == 1 || v_mean->ne[2] == q->ne[1]);
        GGML_ASSERT(v_mean->ne[3] == 1 || v_mean->ne[3] == ns);
    }
    GGML_ASSERT(r >= 1 && k_top >= 1);
    GGML_ASSERT((flags & ~GGML_SPARQ_MEAN_V) == 0);
}

struct ggml_tensor * ggml_sparq_attn(
        struct ggml_context * ctx,
        struct ggml_tensor  * q,
        struct ggml_tensor  * k,
        struct ggml_tensor  * k_t,
        struct ggml_tensor  * v,
        struct ggml_tensor  * mask,
        struct ggml_tensor  * v_mean,
        float                 scale,
        int32_t               r,
        int32_t               k_top,
        int32_t               flags) {
    sparq_check_args(q, k, k_t, v, mask, v_mean, r, k_top, flags);

    // permuted like flash_attn_ext: [Dv, H, n_tok, ns]
    const int64_t ne[4] = { v->ne[0], q->ne[2], q->ne[1], q->ne[3] };
    struct ggml_tensor * result = ggml_new_tensor(ctx, GGML_TYPE_F32, 4, ne);

    int32_t params[4] = { 0, r, k_top, flags };
    memcpy(&params[0], &scale, sizeof(float));
    memcpy(result->op_params, params, sizeof(params));

    result->op     = GGML_OP_SPARQ_ATTN;
    result->src[0] = q;
    result->src[1] = k;
    result->src[2] = k_t;
    result->src[3] = v;
    result->src[4] = mask;
    result->src[5] = v_mean;

    return result;
}

// one query token of the composite: q_t [D, G, Hkv, ns] contiguous, mask_t F32 [S, 1, 1, ns|1],
// v_mean_t [Dv, 1, Hkv, ns|1] or NULL; returns [Dv, G, Hkv, ns]
static struct ggml_tensor * sparq_ref_token(
        struct ggml_context * ctx,
        struct ggml_tensor  * q_t,
        struct ggml_tensor  * k,
        struct ggml_tensor  * k_t,
        struct ggml_tensor  * v,
        struct ggml_tensor  * mask_t,
        struct ggml_tensor  * v_mean_t,
        float scale, int32_t r, int32_t k_top, int32_t flags) {
    const int64_t D = q_t->ne[0], G = q_t->ne[1], Hkv = q_t->ne[2], ns = q_t->ne[3], S = k->ne[1];

    // step 1: components i1 [r, Hkv, ns] by |q| summed over the group
    struct ggml_tensor * q_g  = ggml_cont(ctx, ggml_transpose(ctx, q_t));                         // [G, D, Hkv, ns]
    struct ggml_tensor * absq = ggml_sum_rows(ctx, ggml_abs(ctx, q_g));                            // [1, D, Hkv, ns]
    struct ggml_tensor * i1   = ggml_top_k(ctx, ggml_reshape_3d(ctx, absq, D, Hkv, ns), r);        // [r, Hkv, ns]

    struct ggml_tensor * q_hat = ggml_get_rows(ctx, q_g, i1);                                      // [G, r, Hkv, ns]
    q_hat = ggml_cont(ctx, ggml_transpose(ctx, q_hat));                                            // [r, G, Hkv, ns]
    struct ggml_tensor * k_hat = ggml_get_rows(ctx, k_t, i1);                                      // [S, r, Hkv, ns]
    k_hat = ggml_cont(ctx, ggml_transpose(ctx, k_hat));                                            // [r, S, Hkv, ns]

    // inverse temperature relative to scale: 1/sqrt(rho) = sqrt(||q||_1 / ||q[i1]||_1)
    struct ggml_tensor * l1   = ggml_sum_rows(ctx, ggml_abs(ctx, q_t));                            // [1, G, Hkv, ns]
    struct ggml_tensor * l1r  = ggml_sum_rows(ctx, ggml_abs(ctx, q_hat));
    struct ggml_tensor * itmp = ggml_sqrt(ctx, ggml_div(ctx, l1, l1r));

    struct ggml_tensor * s_hat = ggml_mul_mat(ctx, k_hat, q_hat);                                  // [S, G, Hkv, ns]
    s_hat = ggml_scale(ctx, ggml_mul(ctx, s_hat, itmp), scale);
    s_hat = ggml_soft_max(ctx, ggml_add(ctx, s_hat, mask_t));

    // step 2: positions i2 [k, Hkv, ns] by the group-summed approximate scores
    struct ggml_tensor * s_hat_g = ggml_cont(ctx, ggml_transpose(ctx, s_hat));                     // [G, S, Hkv, ns]
    struct ggml_tensor * s_sum   = ggml_sum_rows(ctx, s_hat_g);                                    // [1, S, Hkv, ns]
    const int32_t k_eff = k_top < S ? k_top : (int32_t) S;
    struct ggml_tensor * i2 = ggml_top_k(ctx, ggml_reshape_3d(ctx, s_sum, S, Hkv, ns), k_eff);    // [k, Hkv, ns]

    struct ggml_tensor * k_sel = ggml_get_rows(ctx, k, i2);                                        // [D,  k, Hkv, ns]
    struct ggml_tensor * v_sel = ggml_get_rows(ctx, v, i2);                                        // [Dv, k, Hkv, ns]
    struct ggml_tensor * m_rep = ggml_repeat_4d(ctx, ggml_reshape_4d(ctx, mask_t, 1, S, 1, mask_t->ne[3]), 1, S, Hkv, ns);
    struct ggml_tensor * m_sel = ggml_get_rows(ctx, m_rep, i2);                                    // [1, k, Hkv, ns]

    struct ggml_tensor * kq = ggml_mul_mat(ctx, k_sel, q_t);                                       // [k, G, Hkv, ns]
    kq = ggml_add(ctx, ggml_scale(ctx, kq, scale), ggml_reshape_4d(ctx, m_sel, k_eff, 1, Hkv, ns));
    kq = ggml_soft_max(ctx, kq);
    struct ggml_tensor * y = ggml_mul_mat(ctx, ggml_cont(ctx, ggml_transpose(ctx, v_sel)), kq);    // [Dv, G, Hkv, ns]

    if (!(flags & GGML_SPARQ_MEAN_V) || k_top >= S) {
        return y;
    }
    // step 3: alpha [1, G, Hkv, ns], the approximate score mass of the chosen positions
    struct ggml_tensor * a_sel = ggml_get_rows(ctx, s_hat_g, i2);                                  // [G, k, Hkv, ns]
    struct ggml_tensor * alpha = ggml_sum_rows(ctx, ggml_cont(ctx, ggml_transpose(ctx, a_sel)));   // [1, G, Hkv, ns]
    struct ggml_tensor * vm    = ggml_repeat_4d(ctx, v_mean_t, y->ne[0], G, Hkv, ns);
    return ggml_add(ctx, ggml_mul(ctx, y, alpha), ggml_mul(ctx, vm, ggml_scale_bias(ctx, alpha, -1.0f, 1.0f)));
}

struct ggml_tensor * ggml_sparq_attn_ref(
        struct ggml_context * ctx,
        struct ggml_tensor  * q,
        struct ggml_tensor  * k,
        struct ggml_tensor  * k_t,
        struct ggml_tensor  * v,
        struct ggml_tensor  * mask,
        struct ggml_tensor  * v_mean,
        float                 scale,
        int32_t               r,
        int32_t               k_top,
        int32_t               flags) {
    sparq_check_args(q, k, k_t, v, mask, v_mean, r, k_top, flags);
    GGML_ASSERT(v->nb[0] == ggml_type_size(v->type)); // get_rows gathers V rows

    const int64_t D = q->ne[0], T = q->ne[1], H = q->ne[2], ns = q->ne[3];
    const int64_t Hkv = k->ne[2], G = H/Hkv, Dv = v->ne[0], S = k->ne[1];
    if (r > D) {
        r = (int32_t) D;
    }

    struct ggml_tensor * out = NULL;
    for (int64_t t = 0; t < T; ++t) {
        struct ggml_tensor * q_t = ggml_view_4d(ctx, q, D, 1, H, ns, q->nb[1], q->nb[2], q->nb[3], t*q->nb[1]);
        q_t = ggml_reshape_4d(ctx, ggml_cont(ctx, q_t), D, G, Hkv, ns);

        struct ggml_tensor * mask_t = ggml_view_4d(ctx, mask, S, 1, 1, mask->ne[3], mask->nb[1], mask->nb[2], mask->nb[3], t*mask->nb[1]);
        mask_t = ggml_cast(ctx, mask_t, GGML_TYPE_F32);

        struct ggml_tensor * vm_t = NULL;
        if (flags & GGML_SPARQ_MEAN_V) {
            const int64_t tt = v_mean->ne[2] == 1 ? 0 : t;
            // [Dv, 1, Hkv, ns|1]: heads step by nb[1]
            vm_t = ggml_view_4d(ctx, v_mean, Dv, 1, Hkv, v_mean->ne[3], v_mean->nb[1]*Hkv, v_mean->nb[1], v_mean->nb[3], tt*v_mean->nb[2]);
            vm_t = ggml_cont(ctx, vm_t);
        }
        struct ggml_tensor * o = sparq_ref_token(ctx, q_t, k, k_t, v, mask_t, vm_t, scale, r, k_top, flags);
        o = ggml_reshape_4d(ctx, o, Dv, H, 1, ns);
        out = out == NULL ? o : ggml_concat(ctx, out, o, 2);
    }
    return out;
}
