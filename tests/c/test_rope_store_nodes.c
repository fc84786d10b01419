// llama-sparse: ggml_sparse_rope_store_nodes (which RoPE and cache-write nodes a backend may run as one kernel) on
// small graphs built as llama's build_attn builds them (nothing is allocated or computed).
#include "ggml.h"
#include "ggml-sparse.h"
#include "zz_test_check.h"

#include <stdbool.h>

enum { HD = 64, NH = 4, NKV = 2, NTOK = 3, NCELLS = 32 };

enum kt_mode { KT_NONE, KT_OK, KT_ROWS2, KT_LATE }; // KT_ROWS2: k_t written in rows of 2 elements

struct layer {
    struct ggml_context * ctx;
    struct ggml_cgraph  * graph;
    struct ggml_tensor  * rq, * rk, * sk, * sv, * skt;
};

// adjacent: q's rope right before k's (else a computed v between them, as with plain matmuls); kt_first: the k_t
// write before the V write; extra: k's rope output read once more
static void build(struct layer * L, bool adjacent, enum kt_mode kt, bool kt_first, bool extra) {
    struct ggml_init_params ip = { 16*1024*1024, NULL, true };
    L->ctx = ggml_init(ip);
    struct ggml_context * ctx = L->ctx;
    struct ggml_tensor * xq  = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, HD, NH, NTOK);
    struct ggml_tensor * xk  = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, HD, NKV, NTOK);
    struct ggml_tensor * xv  = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, HD, NKV, NTOK);
    struct ggml_tensor * pos = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, NTOK);
    struct ggml_tensor * kc  = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, HD*NKV, NCELLS);
    struct ggml_tensor * vc  = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, HD*NKV, NCELLS);
    struct ggml_tensor * ktc = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, NCELLS, HD*NKV);
    struct ggml_tensor * ki  = ggml_new_tensor_1d(ctx, GGML_TYPE_I64, NTOK);
    struct ggml_tensor * vi  = ggml_new_tensor_1d(ctx, GGML_TYPE_I64, NTOK);
    const int            krow = kt == KT_ROWS2 ? 2 : 1;
    struct ggml_tensor * kti = ggml_new_tensor_1d(ctx, GGML_TYPE_I64, HD*NKV*NTOK/krow);
    L->rq = ggml_rope_ext(ctx, xq, pos, NULL, HD, 0, 4096, 10000.0f, 1.0f, 0.0f, 1.0f, 32.0f, 1.0f);
    struct ggml_tensor * v = adjacent ? xv : ggml_scale(ctx, xv, 1.0f);
    L->rk = ggml_rope_ext(ctx, xk, pos, NULL, HD, 0, 4096, 10000.0f, 1.0f, 0.0f, 1.0f, 32.0f, 1.0f);
    L->graph = ggml_new_graph(ctx);
    // build_attn: q, v, k expanded in that order, then the K write, the V write, and SparQ's k_t append
    ggml_build_forward_expand(L->graph, L->rq);
    ggml_build_forward_expand(L->graph, v);
    ggml_build_forward_expand(L->graph, L->rk);
    L->sk = ggml_set_rows(ctx, kc, ggml_view_2d(ctx, L->rk, HD*NKV, NTOK, L->rk->nb[2], 0), ki);
    L->sv = ggml_set_rows(ctx, vc, ggml_view_2d(ctx, v, HD*NKV, NTOK, v->nb[2], 0), vi);
    L->skt = NULL;
    if (kt != KT_NONE) {
        L->skt = ggml_set_rows(ctx, ggml_reshape_2d(ctx, ktc, krow, ggml_nelements(ktc)/krow),
                               ggml_reshape_2d(ctx, L->rk, krow, ggml_nelements(L->rk)/krow), kti);
    }
    ggml_build_forward_expand(L->graph, L->sk);
    if (kt_first && L->skt) {
        ggml_build_forward_expand(L->graph, L->skt);
    }
    ggml_build_forward_expand(L->graph, L->sv);
    if (kt == KT_LATE) {
        ggml_build_forward_expand(L->graph, ggml_scale(ctx, xq, 2.0f)); // a computed node before the k_t write
    }
    if (!kt_first && L->skt) {
        ggml_build_forward_expand(L->graph, L->skt);
    }
    if (extra) {
        ggml_build_forward_expand(L->graph, ggml_scale(ctx, L->rk, 2.0f));
    }
}

static int node_index(const struct layer * L, const struct ggml_tensor * t) {
    for (int j = 0; j < ggml_graph_n_nodes(L->graph); ++j) {
        if (ggml_graph_node(L->graph, j) == t) {
            return j;
        }
    }
    return -1;
}

int main(void) {
    struct ggml_sparse_rs_nodes m;
    struct layer L;

    // plain matmuls: q's rope runs alone (v between), k's rope with the K, V and k_t writes
    build(&L, false, KT_OK, false, false);
    CHECK(!ggml_sparse_rope_store_nodes(L.graph, node_index(&L, L.rq), &m), "q's rope with v computed after it: no");
    CHECK(ggml_sparse_rope_store_nodes(L.graph, node_index(&L, L.rk), &m), "k's rope, K, V, k_t: yes");
    CHECK(m.rq == NULL && m.rk == L.rk && m.sk == L.sk && m.sv == L.sv && m.skt == L.skt, "k alone: the nodes");
    CHECK(m.last == node_index(&L, L.skt), "k alone: last %d, k_t write at %d", m.last, node_index(&L, L.skt));
    CHECK(!ggml_sparse_rope_store_nodes(L.graph, node_index(&L, L.sk), &m), "a SET_ROWS node: no");
    CHECK(!ggml_sparse_rope_store_nodes(L.graph, -1, &m) && !ggml_sparse_rope_store_nodes(L.graph, ggml_graph_n_nodes(L.graph), &m),
          "out-of-range index: no");
    ggml_free(L.ctx);

    // no SparQ: K and V only
    build(&L, false, KT_NONE, false, false);
    CHECK(ggml_sparse_rope_store_nodes(L.graph, node_index(&L, L.rk), &m) && m.skt == NULL && m.last == node_index(&L, L.sv),
          "K and V: yes, last the V write");
    ggml_free(L.ctx);

    // zigzag-style: the ropes adjacent, q's rope starts it
    build(&L, true, KT_OK, false, false);
    CHECK(ggml_sparse_rope_store_nodes(L.graph, node_index(&L, L.rq), &m) && m.rq == L.rq && m.rk == L.rk && m.skt == L.skt,
          "q and k ropes adjacent: yes, both");
    ggml_free(L.ctx);

    // the k_t write before the V write (test-backend-ops' order)
    build(&L, true, KT_OK, true, false);
    CHECK(ggml_sparse_rope_store_nodes(L.graph, node_index(&L, L.rq), &m) && m.skt == L.skt && m.last == node_index(&L, L.sv),
          "k_t before V: yes, last the V write");
    ggml_free(L.ctx);

    // refusals: k_t written 2 elements a row; a computed node before the k_t write; another reader of k's rope
    build(&L, false, KT_ROWS2, false, false);
    CHECK(!ggml_sparse_rope_store_nodes(L.graph, node_index(&L, L.rk), &m), "k_t in rows of 2: no");
    ggml_free(L.ctx);
    build(&L, false, KT_LATE, false, false);
    CHECK(!ggml_sparse_rope_store_nodes(L.graph, node_index(&L, L.rk), &m), "k_t write not next: no (two readers)");
    ggml_free(L.ctx);
    build(&L, false, KT_NONE, false, true);
    CHECK(!ggml_sparse_rope_store_nodes(L.graph, node_index(&L, L.rk), &m), "k's rope read elsewhere: no");
    ggml_free(L.ctx);

    printf("rope_store_nodes: %d passed, %d failed\n", n_pass, n_fail);
    return n_fail == 0 && n_pass > 0 ? 0 : 1;
}
