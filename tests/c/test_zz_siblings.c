// llama-sparse: ggml_sparse_zz_siblings (which MUL_MAT_ZZ nodes a backend may run as one launch) on small graphs
// with made-up data addresses (nothing is computed or dereferenced).
#include "ggml.h"
#include "ggml-sparse.h"
#include "zz_test_check.h"

#include <stdbool.h>
#include <string.h>

#define N_COLS 576

struct layer {
    struct ggml_context * ctx;
    struct ggml_cgraph  * graph;
    struct ggml_tensor  * x, * x2, * idx, * y[4], * scaled, * out;
};

// x -> idx; y0 = W0 x, scaled = 0.5 y0 (the node between), y1 = W1 x, y2 = W2 x, y3 = W3 x2 (another input);
// every tensor gets its own made-up address range unless overlap_y1 puts y1 on top of `scaled`
static void build(struct layer * L, bool overlap_y1, int64_t y2_width) {
    struct ggml_init_params ip = { 16*1024*1024, NULL, true };
    L->ctx = ggml_init(ip);
    L->x   = ggml_new_tensor_2d(L->ctx, GGML_TYPE_F32, N_COLS, 1);
    L->x2  = ggml_new_tensor_2d(L->ctx, GGML_TYPE_F32, N_COLS, 1);
    L->idx = ggml_sparse_idx(L->ctx, L->x, 0.5f, GGML_SPARSE_IDX_LIST);
    const int64_t ms[4] = { 512, 256, 256, 256 };
    struct ggml_tensor * out = NULL;
    for (int s = 0; s < 4; ++s) {
        const int64_t n = s == 2 ? y2_width : N_COLS;
        struct ggml_tensor * w = ggml_new_tensor_2d(L->ctx, GGML_TYPE_Q4_K, 256*n, ms[s]/256);
        struct ggml_tensor * x = s == 3 ? L->x2 : L->x;
        if (n != N_COLS) {
            x = ggml_new_tensor_2d(L->ctx, GGML_TYPE_F32, n, 1);
        }
        L->y[s] = ggml_mul_mat_zz(L->ctx, w, x, s == 3 || n != N_COLS ? NULL : L->idx);
        struct ggml_tensor * y = L->y[s];
        if (s == 0) {
            L->scaled = ggml_scale(L->ctx, y, 0.5f);
            y = L->scaled;
        }
        out = out ? ggml_concat(L->ctx, out, y, 0) : y;
    }
    L->out   = out;
    L->graph = ggml_new_graph(L->ctx);
    ggml_build_forward_expand(L->graph, out);

    char * addr = (char *) (uintptr_t) 0x100000000ull; // never dereferenced
    for (struct ggml_tensor * t = ggml_get_first_tensor(L->ctx); t != NULL; t = ggml_get_next_tensor(L->ctx, t)) {
        t->data = addr;
        addr += (ggml_nbytes(t) + 4095) & ~(size_t) 4095;
    }
    if (overlap_y1) {
        L->y[1]->data = (char *) L->scaled->data + 256; // as if the allocator reused freed memory
    }
}

static int node_index(struct layer * L, const struct ggml_tensor * t) {
    for (int i = 0; i < ggml_graph_n_nodes(L->graph); ++i) {
        if (ggml_graph_node(L->graph, i) == t) {
            return i;
        }
    }
    return -1;
}

// the siblings found for y0, as y numbers (or -1 for another node)
static int siblings_of_y0(struct layer * L, int window, int max_nodes, int * ys) {
    int nodes[8];
    const int count = ggml_sparse_zz_siblings(L->graph, node_index(L, L->y[0]), window, nodes, max_nodes);
    for (int k = 0; k < count; ++k) {
        ys[k] = -1;
        for (int s = 0; s < 4; ++s) {
            if (ggml_graph_node(L->graph, nodes[k]) == L->y[s]) {
                ys[k] = s;
            }
        }
    }
    return count;
}

int main(void) {
    struct layer L;
    int ys[8];

    // y0, y1, y2 share x and idx; y3 reads another x; `scaled` lies between y0 and y1 in the graph
    build(&L, false, N_COLS);
    CHECK(node_index(&L, L.y[0]) < node_index(&L, L.scaled) && node_index(&L, L.scaled) < node_index(&L, L.y[1]),
          "graph order: y0, scaled, y1");
    int count = siblings_of_y0(&L, 32, 8, ys);
    CHECK(count == 3 && ys[0] == 0 && ys[1] == 1 && ys[2] == 2, "group y0 y1 y2 (count %d)", count);
    // the group is capped, and the window limits the scan
    count = siblings_of_y0(&L, 32, 2, ys);
    CHECK(count == 2 && ys[1] == 1, "max_nodes 2 (count %d)", count);
    count = siblings_of_y0(&L, 0, 8, ys);
    CHECK(count == 1 && ys[0] == 0, "window 0 (count %d)", count);
    // not a MUL_MAT_ZZ node, out of range
    int nodes[4];
    CHECK(ggml_sparse_zz_siblings(L.graph, node_index(&L, L.scaled), 32, nodes, 4) == 0, "scale node: 0");
    CHECK(ggml_sparse_zz_siblings(L.graph, -1, 32, nodes, 4) == 0, "index -1: 0");
    CHECK(ggml_sparse_zz_siblings(L.graph, ggml_graph_n_nodes(L.graph), 32, nodes, 4) == 0, "index n_nodes: 0");
    // a sibling without the compute flag stays out
    L.y[1]->flags &= ~GGML_TENSOR_FLAG_COMPUTE;
    count = siblings_of_y0(&L, 32, 8, ys);
    CHECK(count == 2 && ys[1] == 2, "y1 not computed: y0 y2 (count %d)", count);
    ggml_free(L.ctx);

    // y1's output overlaps memory a node between y0 and y1 writes: running y1 early would clobber it
    build(&L, true, N_COLS);
    count = siblings_of_y0(&L, 32, 8, ys);
    CHECK(count == 2 && ys[0] == 0 && ys[1] == 2, "overlap: y0 y2 (count %d)", count);
    ggml_free(L.ctx);

    // y2 of another width (and its own x) is no sibling
    build(&L, false, 1000);
    count = siblings_of_y0(&L, 32, 8, ys);
    CHECK(count == 2 && ys[1] == 1, "other width: y0 y1 (count %d)", count);
    ggml_free(L.ctx);

    printf("zz_siblings: %d passed, %d failed\n", n_pass, n_fail);
    return n_fail == 0 ? 0 : 1;
}
