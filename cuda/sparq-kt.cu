// llama-sparse: the append of SparQ's 8-bit transposed K as one kernel (see sparq-kt.cuh).
#include "sparq-kt.cuh"
#include "graph-hook.cuh"

#include <cstdlib>
#include <cstring>

// one warp per (slot, component), lane j = cell j of the slot's block: the cell's value gathered and masked as
// GET_ROWS and MUL compute it, then quantized with the arithmetic of set_rows' Q8_0 block function (the maximum by
// shuffles is the same value in any order), each block written by one 32-byte store of its warp
static __global__ void sparq_kt_q8_append(const char * k, const int64_t k_nb1, const int32_t * cells,
                                          const float * keep, const int64_t * rows, char * dst, const int64_t dst_nb1,
                                          const int n_embd, const int n_slots) {
    const int64_t w = (int64_t) blockIdx.x*(blockDim.x/WARP_SIZE) + threadIdx.x/WARP_SIZE;
    const int     j = threadIdx.x % WARP_SIZE;
    ggml_cuda_pdl_sync(); // the cache rows come from the K write before
    if (w >= (int64_t) n_embd*n_slots) {
        return;
    }
    const int   slot = (int) (w / n_embd), e = (int) (w % n_embd);
    const half  h    = ((const half *) (k + (int64_t) cells[slot*QK8_0 + j]*k_nb1))[e];
    const float v    = __half2float(h)*keep[slot*QK8_0 + j];
    const float amax = warp_reduce_max(fabsf(v));
    const float d    = amax / ((1 << 7) - 1);
    const float id   = d ? 1.0f/d : 0.0f;
    block_q8_0 * y = (block_q8_0 *) (dst + rows[w]*dst_nb1);
    y->qs[j] = roundf(v*id);
    if (j == 0) {
        y->d = d;
    }
}

void sparq_kt_q8_append_launch(const char * k, int64_t k_nb1, const int32_t * cells, const float * keep,
                               const int64_t * rows, char * dst, int64_t dst_nb1, int n_embd, int n_slots,
                               cudaStream_t stream) {
    const int     warps = 8;
    const int64_t n     = (int64_t) n_embd*n_slots;
    const ggml_cuda_kernel_launch_params p(dim3((unsigned) ((n + warps - 1)/warps)), dim3(warps*WARP_SIZE), 0, stream);
    ggml_cuda_kernel_launch(sparq_kt_q8_append, p, k, k_nb1, cells, keep, rows, dst, dst_nb1, n_embd, n_slots);
}

static bool sparq_kt_fuse_enabled() {
    static const bool on = ggml_sparse_cuda_fusion_on("LLAMA_SPARSE_CUDA_KT_FUSE");
    return on;
}

static bool sparq_kt_named(const ggml_tensor * t, const char * name) {
    return t != nullptr && strcmp(t->name, name) == 0 && (t->flags & GGML_TENSOR_FLAG_COMPUTE);
}

int ggml_cuda_sparq_kt_append_fuse(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, int i) {
    ggml_tensor * gr = ggml_graph_node(cgraph, i);
    if (!sparq_kt_fuse_enabled() || !sparq_kt_named(gr, "sparq_kt_gather")) {
        return 0;
    }
    int j = i;
    ggml_tensor * mul = ggml_sparse_cuda_next_node(cgraph, &j);
    ggml_tensor * tr  = ggml_sparse_cuda_next_node(cgraph, &j);
    ggml_tensor * put = ggml_sparse_cuda_next_node(cgraph, &j);
    if (!sparq_kt_named(mul, "sparq_kt_keep") || !sparq_kt_named(tr, "sparq_kt_tr") || !sparq_kt_named(put, "sparq_kt_put")) {
        return 0;
    }
    const ggml_tensor * kc = gr->src[0], * cells = gr->src[1], * keep = mul->src[1], * rows = put->src[1];
    const int64_t n_embd = gr->ne[0], n_cells = gr->ne[1];
    const bool ok = gr->op == GGML_OP_GET_ROWS && kc->type == GGML_TYPE_F16 && kc->nb[0] == sizeof(half) &&
        cells->type == GGML_TYPE_I32 && ggml_is_contiguous(cells) && ggml_nelements(cells) == n_cells && n_cells % QK8_0 == 0 &&
        gr->type == GGML_TYPE_F32 && ggml_nrows(gr) == n_cells &&
        mul->op == GGML_OP_MUL && mul->src[0] == gr && keep->type == GGML_TYPE_F32 && ggml_is_contiguous(keep) &&
        ggml_nelements(keep) == n_cells && keep->ne[0] == 1 &&
        tr->op == GGML_OP_CONT && tr->src[0]->view_src == mul && tr->ne[0] == QK8_0 && tr->ne[1] == n_embd &&
        put->op == GGML_OP_SET_ROWS && put->type == GGML_TYPE_Q8_0 && put->src[0]->view_src == tr &&
        put->ne[0] == QK8_0 && put->nb[1] == (int64_t) sizeof(block_q8_0) &&
        rows->type == GGML_TYPE_I64 && ggml_is_contiguous(rows) && ggml_nelements(rows) == n_embd*(n_cells/QK8_0) &&
        n_embd*(n_cells/QK8_0) < INT32_MAX;
    if (!ok) {
        return 0;
    }
    sparq_kt_q8_append_launch((const char *) kc->data, kc->nb[1], (const int32_t *) cells->data, (const float *) keep->data,
                              (const int64_t *) rows->data, (char *) put->data, put->nb[1], (int) n_embd,
                              (int) (n_cells/QK8_0), ctx.stream());
    static bool logged = false;
    if (!logged) {
        logged = true;
        GGML_LOG_INFO("llama-sparse: CUDA appends SparQ's Q8_0 transposed K in one kernel (LLAMA_SPARSE_CUDA_KT_FUSE=0 "
                      "turns it off)\n");
    }
    return j - i + 1;
}
