// llama-sparse: SparQ attention glue: the transposed K copy and per-sequence V sums kept beside the KV cache,
// the graph nodes that maintain them, the decode attention through GGML_OP_SPARQ_ATTN, and the C API knobs.
//
// State (per llama_kv_cache, allocated when SparQ is first enabled, same buffer type as each layer's K):
//   k_t[il]   [kv_size, n_embd_k_gqa, n_stream], K's type or Q8_0 (kt=q8_0): cell-contiguous per K component
//   v_sum[il] [n_embd_v_gqa, n_seq_max] F32: sum of V over the cells of each sequence
// Every ubatch appends to both in the graph (set_rows into k_t; v_sum += V^T onehot(seq), only with mean-V
// on: the sums are not kept otherwise and count as stale). Below min_kv k_t is not kept either: the first graph
// whose view reaches it rebuilds the copy. Whatever else
// changes cells or K (removal, copies, overwrites, K-shift, stream copies, state load) marks them stale, and
// the next graph's input step rebuilds them from the K/V cache before the graph runs: k_t by a transposing
// copy on the cache's backend (host round trip as the fallback), the V sums on the host and only with mean-V on.
// A Q8_0 k_t holds blocks of 32 cells per component: every ubatch requantizes the whole blocks its tokens fall in,
// read back from the K cache (a prefill over more blocks than its graph has slots for leaves it stale instead).
#include "llama-sparq.h"
#include "llama-sparse.h"

#include "llama-context.h"
#include "llama-graph.h"
#include "llama-impl.h"
#include "llama-kv-cache.h"
#include "llama-model.h"

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpp.h"
#include "ggml-sparse.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

struct llama_sparq_kv {
    int32_t r      = 0; // 0: off
    int32_t k      = 0;
    bool    mean_v = false;
    ggml_type kt   = GGML_TYPE_COUNT; // storage of k_t asked for: COUNT = the K cache's type, or Q8_0
    int32_t min_kv = LLAMA_SPARSE_SPARQ_MIN_KV_AUTO; // decode attends densely while the cache view holds fewer
                                      // positions; AUTO: where the op pays on the device that holds the cache
    int32_t min_kv_logged = -1;       // the auto threshold last logged
    bool    from_env   = false;       // set by LLAMA_SPARQ (the C tools), not the API
    bool    told_dense = false;       // the note that a batch of several tokens a sequence attended densely

    bool allocated = false;
    bool stale_k   = true;
    bool stale_v   = true;

    std::vector<ggml_tensor *> k_t;   // per KV-cache layer
    std::vector<ggml_tensor *> v_sum;
    std::vector<std::pair<ggml_context_ptr, ggml_backend_buffer_ptr>> ctxs_bufs;

    bool on() const { return r > 0 && k > 0; }
};

struct llama_sparq_access {
    static llama_kv_cache * kv(const llama_kv_cache_context * mctx) { return mctx->kv; }
    static const llama_kv_cache::slot_info & sinfo(const llama_kv_cache_context * mctx) { return mctx->sinfos[mctx->i_cur]; }
    static std::shared_ptr<llama_sparq_kv> & state(llama_kv_cache & kv) { return kv.sparq; }
    static const llama_hparams & hparams(const llama_kv_cache & kv) { return kv.hparams; }
    static llama_split_mode split_mode(const llama_kv_cache & kv) { return kv.model.split_mode(); }
    static uint32_t n_stream (const llama_kv_cache & kv) { return kv.n_stream; }
    static uint32_t n_seq_max(const llama_kv_cache & kv) { return kv.n_seq_max; }
    static bool     v_trans  (const llama_kv_cache & kv) { return kv.v_trans; }
    static bool     shared   (const llama_kv_cache & kv) { return kv.other != nullptr; }
    static size_t   n_layers (const llama_kv_cache & kv) { return kv.layers.size(); }
    static int32_t  ikv(const llama_kv_cache & kv, int32_t il) {
        auto it = kv.map_layer_ids.find(il);
        return it == kv.map_layer_ids.end() ? -1 : it->second;
    }
    static uint32_t layer_il(const llama_kv_cache & kv, size_t i) { return kv.layers[i].il; }
    static ggml_tensor * layer_k(const llama_kv_cache & kv, size_t i) { return kv.layers[i].k; }
    static ggml_tensor * layer_v(const llama_kv_cache & kv, size_t i) { return kv.layers[i].v; }
    static const llama_kv_cells & cells(const llama_kv_cache & kv, uint32_t strm) { return kv.v_cells[strm]; }
    static uint32_t stream_of(const llama_kv_cache & kv, llama_seq_id s) { return kv.seq_to_stream[s]; }
};

using acc = llama_sparq_access;

namespace {

thread_local std::string g_sparq_error;

// bumped whenever SparQ is turned on/off or retuned anywhere: graphs built before must not be reused
std::atomic<uint64_t> g_sparq_generation{1};

int32_t sparq_error(const std::string & msg) {
    g_sparq_error = msg;
    return -1;
}

// why SparQ cannot run on this cache, or "" if it can
std::string sparq_unsupported(llama_kv_cache & kv, ggml_type kt) {
    if (acc::shared(kv)) {
        return "the KV cache shares its cells with another cache";
    }
    if (acc::split_mode(kv) == LLAMA_SPLIT_MODE_TENSOR) {
        // the meta device aborts on any op it cannot split
        return "the model is split by tensor across GPUs (-sm tensor), which has no SparQ op; use -sm layer";
    }
    const auto & hp = acc::hparams(kv);
    int64_t n_embd_k = -1;
    for (size_t i = 0; i < acc::n_layers(kv); ++i) {
        const ggml_tensor * k = acc::layer_k(kv, i);
        const ggml_tensor * v = acc::layer_v(kv, i);
        if (k == nullptr || v == nullptr) {
            return "a layer has no K or V cache";
        }
        if ((k->type != GGML_TYPE_F16 && k->type != GGML_TYPE_F32) || (v->type != GGML_TYPE_F16 && v->type != GGML_TYPE_F32)) {
            return std::string("the K/V cache type is ") + ggml_type_name(k->type) + "/" + ggml_type_name(v->type) +
                   "; SparQ needs f16 or f32 (leave the cache types at their default: --cache-type-k/-v in the C tools, "
                   "type_k/type_v in Python)";
        }
        const uint32_t il = acc::layer_il(kv, i);
        if (n_embd_k >= 0 && n_embd_k != (int64_t) hp.n_embd_k_gqa(il)) {
            return "layers differ in K width";
        }
        n_embd_k = hp.n_embd_k_gqa(il);
        if (kt == GGML_TYPE_Q8_0 && k->type != GGML_TYPE_F16) {
            return "kt=q8_0 needs an f16 K cache";
        }
    }
    if (kt == GGML_TYPE_Q8_0 && kv.get_size() % 32 != 0) {
        return "kt=q8_0 needs a KV cache size that is a multiple of 32, got " + std::to_string(kv.get_size());
    }
    return "";
}

void sparq_allocate(llama_kv_cache & kv, llama_sparq_kv & st) {
    const auto & hp = acc::hparams(kv);
    const int64_t kv_size = kv.get_size();
    const int64_t n_stream = acc::n_stream(kv);
    const size_t n_layers = acc::n_layers(kv);

    std::map<ggml_backend_buffer_type_t, ggml_context *> ctx_map;
    auto ctx_for = [&](ggml_backend_buffer_type_t buft) {
        auto it = ctx_map.find(buft);
        if (it != ctx_map.end()) {
            return it->second;
        }
        ggml_init_params params = { 2*n_layers*ggml_tensor_overhead(), nullptr, true };
        ggml_context * ctx = ggml_init(params);
        GGML_ASSERT(ctx);
        ctx_map[buft] = ctx;
        st.ctxs_bufs.emplace_back(ggml_context_ptr(ctx), nullptr);
        return ctx;
    };

    st.k_t.assign(n_layers, nullptr);
    st.v_sum.assign(n_layers, nullptr);
    for (size_t i = 0; i < n_layers; ++i) {
        ggml_tensor * k = acc::layer_k(kv, i);
        ggml_context * ctx = ctx_for(ggml_backend_buffer_get_type(k->buffer));
        const uint32_t il = acc::layer_il(kv, i);
        st.k_t[i]   = ggml_new_tensor_3d(ctx, st.kt == GGML_TYPE_Q8_0 ? GGML_TYPE_Q8_0 : k->type, kv_size, hp.n_embd_k_gqa(il), n_stream);
        st.v_sum[i] = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, hp.n_embd_v_gqa(il), acc::n_seq_max(kv));
        ggml_format_name(st.k_t[i],   "sparq_k_t_l%u", il);
        ggml_format_name(st.v_sum[i], "sparq_v_sum_l%u", il);
    }
    for (auto & [buft, ctx] : ctx_map) {
        ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors_from_buft(ctx, buft);
        if (buf == nullptr) {
            throw std::runtime_error("SparQ: failed to allocate the transposed K copy");
        }
        ggml_backend_buffer_clear(buf, 0);
        for (auto & cb : st.ctxs_bufs) {
            if (cb.first.get() == ctx) {
                cb.second.reset(buf);
            }
        }
        LLAMA_LOG_INFO("%s: SparQ K copy + V sums: %.2f MiB on %s\n", __func__,
                       ggml_backend_buffer_get_size(buf)/1024.0/1024.0, ggml_backend_buft_name(buft));
    }
    st.allocated = true;
    st.stale_k = st.stale_v = true;
}

// GPU backends load the op's code at its first launch: CUDA's lazy module loading put ~20 ms on the decode step where
// the view reached min_kv (H200, bench/results/sparq_first_step_h200_2026-12-03.md). So when the copy is allocated,
// run the op once on a small input on each device that holds a layer's cache, with the types, head counts and
// layout decode will give it (the kernel variant depends on those, not on S, r or k). Once per process and variant.
// LLAMA_SPARSE_SPARQ_PRELOAD=0: off; 2: CPU devices too (tests).
static void sparq_preload(llama_kv_cache & kv, const llama_sparq_kv & st) {
    static const int mode = [] { const char * e = getenv("LLAMA_SPARSE_SPARQ_PRELOAD"); return e ? atoi(e) : 1; }();
    if (mode == 0) {
        return;
    }
    static std::mutex mutex;
    static std::set<std::string> done;
    std::lock_guard<std::mutex> lock(mutex);

    const auto & hp = acc::hparams(kv);
    const bool v_trans = acc::v_trans(kv);
    for (size_t i = 0; i < acc::n_layers(kv); ++i) {
        const ggml_tensor * kc = acc::layer_k(kv, i);
        const ggml_tensor * vc = acc::layer_v(kv, i);
        ggml_backend_buffer_type_t buft = ggml_backend_buffer_get_type(kc->buffer);
        ggml_backend_dev_t dev = ggml_backend_buft_get_device(buft);
        if (dev == nullptr && mode >= 2 && ggml_backend_buft_is_host(buft)) {
            dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU); // the CPU buffer type names no device
        }
        if (dev == nullptr || (ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_CPU && mode < 2)) {
            continue;
        }
        const uint32_t il = acc::layer_il(kv, i);
        const int64_t D = hp.n_embd_head_k(il), Dv = hp.n_embd_head_v(il), H = hp.n_head(il), Hkv = hp.n_head_kv(il);
        const ggml_type kt = st.k_t[i]->type;
        char key[256];
        snprintf(key, sizeof(key), "%s %lld %lld %lld %lld %d %d %d %d", ggml_backend_dev_name(dev), (long long) D,
                 (long long) Dv, (long long) H, (long long) Hkv, (int) kc->type, (int) vc->type, (int) kt, (int) v_trans);
        if (D <= 0 || Dv <= 0 || Hkv <= 0 || H % Hkv != 0 || !done.insert(key).second) {
            continue;
        }
        const int64_t t0 = ggml_time_us();
        // 512 positions, k 64: the op's own path (not its k >= S shortcut); flash attention (V not transposed) casts
        // the mask to F16, the other path keeps F32
        const int64_t n_kv = 512;
        ggml_init_params params = { 16*ggml_tensor_overhead() + ggml_graph_overhead(), nullptr, true };
        ggml_context_ptr ctx(ggml_init(params));
        ggml_context * c = ctx.get();
        ggml_tensor * q   = ggml_new_tensor_4d(c, GGML_TYPE_F32, D, 1, H, 1);
        ggml_tensor * k   = ggml_new_tensor_4d(c, kc->type, D, n_kv, Hkv, 1);
        ggml_tensor * k_t = ggml_new_tensor_4d(c, kt, n_kv, D, Hkv, 1);
        ggml_tensor * v   = v_trans ? ggml_transpose(c, ggml_new_tensor_4d(c, vc->type, n_kv, Dv, Hkv, 1))
                                    : ggml_new_tensor_4d(c, vc->type, Dv, n_kv, Hkv, 1);
        ggml_tensor * m   = ggml_new_tensor_4d(c, v_trans ? GGML_TYPE_F32 : GGML_TYPE_F16, n_kv, 1, 1, 1);
        ggml_tensor * out = ggml_sparq_attn(c, q, k, k_t, v, m, nullptr, 1.0f/sqrtf((float) D),
                                            std::min<int32_t>(st.r, (int32_t) D), 64, 0);
        ggml_cgraph * gf = ggml_new_graph(c);
        ggml_build_forward_expand(gf, out);

        ggml_backend_ptr backend(ggml_backend_dev_init(dev, nullptr));
        if (!backend || !ggml_backend_supports_op(backend.get(), out)) {
            LLAMA_LOG_DEBUG("%s: %s does not run the SparQ op here; not preloaded\n", __func__, ggml_backend_dev_name(dev));
            continue;
        }
        ggml_backend_buffer_ptr buf(ggml_backend_alloc_ctx_tensors(c, backend.get()));
        if (!buf) {
            LLAMA_LOG_WARN("%s: no memory for the SparQ op's preload on %s; its first decode step loads it\n", __func__,
                           ggml_backend_dev_name(dev));
            continue;
        }
        ggml_backend_buffer_clear(buf.get(), 0);
        const std::vector<float> ones(ggml_nelements(q), 1.0f);
        ggml_backend_tensor_set(q, ones.data(), 0, ggml_nbytes(q));
        const ggml_status status = ggml_backend_graph_compute(backend.get(), gf);
        ggml_backend_synchronize(backend.get());
        if (status != GGML_STATUS_SUCCESS) {
            LLAMA_LOG_WARN("%s: the SparQ op's preload on %s failed (status %d)\n", __func__, ggml_backend_dev_name(dev), (int) status);
            continue;
        }
        LLAMA_LOG_INFO("%s: SparQ op loaded on %s (D %lld, %lld/%lld heads, k_t %s) in %.1f ms\n", __func__,
                       ggml_backend_dev_name(dev), (long long) D, (long long) H, (long long) Hkv, ggml_type_name(kt),
                       (ggml_time_us() - t0)/1000.0);
    }
}

// the first backend of the scheduler that takes buffer type buft (GPU before CPU), or nullptr
static ggml_backend_t sparq_backend_for(ggml_backend_sched_t sched, ggml_backend_buffer_type_t buft) {
    for (int b = 0; b < ggml_backend_sched_get_n_backends(sched); ++b) {
        ggml_backend_t cand = ggml_backend_sched_get_backend(sched, b);
        if (ggml_backend_supports_buft(cand, buft)) {
            return cand;
        }
    }
    return nullptr;
}

// point the views of ctx (of the cache and of k_t, which have buffers) at their sources' data
static bool sparq_init_views(ggml_context * ctx) {
    for (ggml_tensor * t = ggml_get_first_tensor(ctx); t != nullptr; t = ggml_get_next_tensor(ctx, t)) {
        if (t->view_src != nullptr && t->buffer == nullptr && t->view_src->buffer != nullptr &&
            ggml_backend_view_init(t) != GGML_STATUS_SUCCESS) {
            return false;
        }
    }
    return true;
}

// rebuild k_t from the K cache where both live: one ggml_cpy of K's transposed view per layer, computed by the
// first backend of the scheduler that takes the layer's buffer type (GPU before CPU). A whole 32k-cell cache
// of an 8B model is ~1 ms on a GPU this way, against seconds through the host. False: not possible here.
static bool sparq_rebuild_k_backend(llama_kv_cache & kv, llama_sparq_kv & st, ggml_backend_sched_t sched) {
    if (sched == nullptr) {
        return false;
    }
    const size_t n_layers = acc::n_layers(kv);
    const ggml_init_params params = {
        /*.mem_size   =*/ (4*n_layers + 16)*ggml_tensor_overhead() + 2*ggml_graph_overhead_custom(4*n_layers + 8, false),
        /*.mem_buffer =*/ nullptr,
        /*.no_alloc   =*/ true,
    };
    ggml_context_ptr ctx(ggml_init(params));
    if (!ctx) {
        return false;
    }
    std::map<ggml_backend_t, ggml_cgraph *> graphs;
    for (size_t i = 0; i < n_layers; ++i) {
        ggml_tensor * k  = acc::layer_k(kv, i);
        ggml_tensor * kt = st.k_t[i];
        ggml_backend_buffer_type_t buft = ggml_backend_buffer_get_type(k->buffer);
        if (ggml_backend_buffer_get_type(kt->buffer) != buft || kt->type != k->type) {
            return false; // a Q8_0 k_t goes through sparq_rebuild_k_q8
        }
        ggml_backend_t backend = sparq_backend_for(sched, buft);
        // K [n_embd, kv_size, n_stream] -> k_t [kv_size, n_embd, n_stream]
        ggml_tensor * cpy = ggml_cpy(ctx.get(), ggml_permute(ctx.get(), k, 1, 0, 2, 3), kt);
        if (backend == nullptr || !ggml_backend_supports_op(backend, cpy)) {
            return false;
        }
        ggml_cgraph *& gf = graphs[backend];
        if (gf == nullptr) {
            gf = ggml_new_graph_custom(ctx.get(), 4*n_layers + 8, false); // a permute and a copy node, two leafs a layer
        }
        ggml_build_forward_expand(gf, cpy);
    }
    // every tensor here is a view of the cache or of k_t
    if (!sparq_init_views(ctx.get())) {
        return false;
    }
    for (auto & [backend, gf] : graphs) {
        if (ggml_backend_graph_compute(backend, gf) != GGML_STATUS_SUCCESS) {
            return false;
        }
        LLAMA_LOG_DEBUG("%s: transposing copies on %s (%d layers)\n", __func__, ggml_backend_name(backend), ggml_graph_n_nodes(gf)/2);
    }
    return true;
}

// rebuild a Q8_0 k_t on the first backend of the scheduler that takes the cache's buffer type, through the same
// set_rows as the decode graphs' appends (so rebuilt and appended blocks are the same bytes): K of the cells up to
// the last used one (rounded up to a block) transposed to f32, empty cells zeroed, one block row per (stream,
// component, block). Blocks past the last used cell are not read (masked) until an append rewrites them. False:
// not possible here.
static bool sparq_rebuild_k_q8(llama_kv_cache & kv, llama_sparq_kv & st, ggml_backend_sched_t sched) {
    if (sched == nullptr || acc::n_layers(kv) == 0) {
        return false;
    }
    ggml_backend_buffer_type_t buft = ggml_backend_buffer_get_type(acc::layer_k(kv, 0)->buffer);
    ggml_backend_t backend = sparq_backend_for(sched, buft);
    if (backend == nullptr) {
        return false;
    }
    const int64_t kv_size = kv.get_size();
    const int64_t n_stream = acc::n_stream(kv);
    const size_t n_layers = acc::n_layers(kv);
    int64_t n_used = 0;
    for (int64_t s = 0; s < n_stream; ++s) {
        n_used = std::max<int64_t>(n_used, acc::cells(kv, (uint32_t) s).used_max_p1());
    }
    n_used = std::min<int64_t>(kv_size, (n_used + 31)/32*32);
    if (n_used == 0) {
        return true; // nothing cached: every block is written by an append before it is read
    }
    const int64_t n_embd = acc::layer_k(kv, 0)->ne[0], nb_used = n_used/32;
    const ggml_init_params params = {
        /*.mem_size   =*/ (10*n_layers + 16)*ggml_tensor_overhead() + ggml_graph_overhead_custom(10*n_layers + 8, false),
        /*.mem_buffer =*/ nullptr,
        /*.no_alloc   =*/ true,
    };
    ggml_context_ptr ctx(ggml_init(params));
    if (!ctx) {
        return false;
    }
    ggml_cgraph * gf = ggml_new_graph_custom(ctx.get(), 10*n_layers + 8, false);
    ggml_tensor * keep = ggml_new_tensor_3d(ctx.get(), GGML_TYPE_F32, n_used, 1, n_stream);
    ggml_tensor * idx  = ggml_new_tensor_1d(ctx.get(), GGML_TYPE_I64, nb_used*n_embd*n_stream);
    ggml_set_input(keep);
    ggml_set_input(idx);
    for (size_t i = 0; i < n_layers; ++i) {
        ggml_tensor * k  = acc::layer_k(kv, i);
        ggml_tensor * kt = st.k_t[i];
        if (ggml_backend_buffer_get_type(k->buffer) != buft || ggml_backend_buffer_get_type(kt->buffer) != buft || k->ne[0] != n_embd) {
            return false;
        }
        ggml_tensor * kv_used = ggml_view_3d(ctx.get(), k, n_embd, n_used, n_stream, k->nb[1], k->nb[2], 0);
        ggml_tensor * kf  = ggml_cast(ctx.get(), ggml_permute(ctx.get(), kv_used, 1, 0, 2, 3), GGML_TYPE_F32); // [n_used, n_embd, ns]
        ggml_tensor * kfm = ggml_mul(ctx.get(), kf, keep);
        ggml_tensor * put = ggml_set_rows(ctx.get(), ggml_reshape_2d(ctx.get(), kt, 32, ggml_nelements(kt)/32),
                                          ggml_reshape_2d(ctx.get(), kfm, 32, nb_used*n_embd*n_stream), idx);
        if (!ggml_backend_supports_op(backend, kf) || !ggml_backend_supports_op(backend, kfm) || !ggml_backend_supports_op(backend, put)) {
            return false;
        }
        ggml_build_forward_expand(gf, put);
    }
    if (!sparq_init_views(ctx.get())) { // the rest (casts, products, keep, idx) are the allocator's
        return false;
    }
    ggml_gallocr_t galloc = ggml_gallocr_new(ggml_backend_get_default_buffer_type(backend));
    bool ok = galloc != nullptr && ggml_gallocr_alloc_graph(galloc, gf);
    if (ok) {
        std::vector<float> h_keep(n_used*n_stream);
        std::vector<int64_t> h_idx(nb_used*n_embd*n_stream);
        for (int64_t s = 0; s < n_stream; ++s) {
            const auto & cells = acc::cells(kv, (uint32_t) s);
            for (int64_t j = 0; j < n_used; ++j) {
                h_keep[s*n_used + j] = cells.is_empty((uint32_t) j) ? 0.0f : 1.0f;
            }
            for (int64_t e = 0; e < n_embd; ++e) {
                for (int64_t b = 0; b < nb_used; ++b) {
                    h_idx[(s*n_embd + e)*nb_used + b] = (s*n_embd + e)*(kv_size/32) + b;
                }
            }
        }
        ggml_backend_tensor_set(keep, h_keep.data(), 0, ggml_nbytes(keep));
        ggml_backend_tensor_set(idx, h_idx.data(), 0, ggml_nbytes(idx));
        ok = ggml_backend_graph_compute(backend, gf) == GGML_STATUS_SUCCESS;
    }
    ggml_gallocr_free(galloc);
    return ok;
}

// rebuild k_t from the K cache through the host (the fallback of sparq_rebuild_k_backend)
static void sparq_rebuild_k_host(llama_kv_cache & kv, llama_sparq_kv & st) {
    const int64_t kv_size = kv.get_size();
    std::vector<uint8_t> src, dst;
    for (size_t i = 0; i < acc::n_layers(kv); ++i) {
        ggml_tensor * k  = acc::layer_k(kv, i);
        ggml_tensor * kt = st.k_t[i];
        const size_t ts = ggml_type_size(k->type);
        const int64_t n_embd = k->ne[0], n_stream = k->ne[2];
        src.resize(ggml_nbytes(k));
        dst.resize(ggml_nbytes(kt));
        ggml_backend_tensor_get(k, src.data(), 0, src.size());
        if (kt->type == GGML_TYPE_Q8_0) {
            // one row of kv_size cells per (stream, component), empty cells 0, quantized as ggml does a row
            std::vector<float> rowf(kv_size);
            const size_t row_size = ggml_row_size(GGML_TYPE_Q8_0, kv_size);
            for (int64_t s = 0; s < n_stream; ++s) {
                const auto & cells = acc::cells(kv, (uint32_t) s);
                for (int64_t e = 0; e < n_embd; ++e) {
                    for (int64_t j = 0; j < kv_size; ++j) {
                        const uint8_t * p = src.data() + ((s*kv_size + j)*n_embd + e)*ts;
                        rowf[j] = cells.is_empty((uint32_t) j) ? 0.0f :
                                  k->type == GGML_TYPE_F16 ? ggml_fp16_to_fp32(*(const ggml_fp16_t *) p) : *(const float *) p;
                    }
                    ggml_quantize_chunk(GGML_TYPE_Q8_0, rowf.data(), dst.data() + (s*n_embd + e)*row_size, 0, 1, kv_size, nullptr);
                }
            }
            ggml_backend_tensor_set(kt, dst.data(), 0, dst.size());
            continue;
        }
        for (int64_t s = 0; s < n_stream; ++s) {
            for (int64_t j = 0; j < kv_size; ++j) {
                const uint8_t * row = src.data() + (s*kv_size + j)*n_embd*ts;
                for (int64_t e = 0; e < n_embd; ++e) {
                    memcpy(dst.data() + ((s*n_embd + e)*kv_size + j)*ts, row + e*ts, ts);
                }
            }
        }
        ggml_backend_tensor_set(kt, dst.data(), 0, dst.size());
    }
}

// rebuild k_t from the K cache: on the cache's backend, else (or with LLAMA_SPARSE_SPARQ_HOST_REBUILD) the host
void sparq_rebuild_k(llama_kv_cache & kv, llama_sparq_kv & st, ggml_backend_sched_t sched) {
    static const bool host_only = getenv("LLAMA_SPARSE_SPARQ_HOST_REBUILD") != nullptr;
    const bool q8 = !st.k_t.empty() && st.k_t[0]->type == GGML_TYPE_Q8_0;
    const bool host = host_only || !(q8 ? sparq_rebuild_k_q8(kv, st, sched) : sparq_rebuild_k_backend(kv, st, sched));
    if (host) {
        sparq_rebuild_k_host(kv, st);
    }
    LLAMA_LOG_DEBUG("%s: SparQ K copy rebuilt (%s, %s)\n", __func__, ggml_type_name(st.k_t[0]->type), host ? "host" : "backend");
    st.stale_k = false;
}

// rebuild the V sums from the V cache, leaving out the cells the running ubatch is about to write
void sparq_rebuild_v(llama_kv_cache & kv, llama_sparq_kv & st, const std::vector<uint8_t> & skip) {
    const int64_t kv_size = kv.get_size();
    const int64_t n_seq = acc::n_seq_max(kv);
    const bool v_trans = acc::v_trans(kv);
    std::vector<uint8_t> raw;
    std::vector<float> row, sums;
    for (size_t i = 0; i < acc::n_layers(kv); ++i) {
        ggml_tensor * v = acc::layer_v(kv, i);
        const size_t ts = ggml_type_size(v->type);
        const int64_t stride = v->ne[0]; // row width, may exceed n_embd_v_gqa
        const int64_t n_embd = st.v_sum[i]->ne[0];
        raw.resize(ggml_nbytes(v));
        ggml_backend_tensor_get(v, raw.data(), 0, raw.size());
        sums.assign(n_embd*n_seq, 0.0f);
        row.resize(n_embd);
        for (uint32_t s = 0; s < acc::n_stream(kv); ++s) {
            const auto & cells = acc::cells(kv, s);
            for (uint32_t j = 0; j < cells.size(); ++j) {
                if (cells.is_empty(j) || skip[s*kv_size + j]) {
                    continue;
                }
                for (int64_t e = 0; e < n_embd; ++e) {
                    const int64_t off = v_trans ? (s*stride + e)*kv_size + j : (s*kv_size + j)*stride + e;
                    const uint8_t * p = raw.data() + off*ts;
                    row[e] = v->type == GGML_TYPE_F16 ? ggml_fp16_to_fp32(*(const ggml_fp16_t *) p) : *(const float *) p;
                }
                for (llama_seq_id q = 0; q < n_seq; ++q) {
                    if (cells.seq_has(j, q)) {
                        float * d = sums.data() + q*n_embd;
                        for (int64_t e = 0; e < n_embd; ++e) {
                            d[e] += row[e];
                        }
                    }
                }
            }
        }
        ggml_backend_tensor_set(st.v_sum[i], sums.data(), 0, sums.size()*sizeof(float));
    }
    st.stale_v = false;
}

// parse "r=32,k=128[,mean_v=1][,kt=q8_0][,min_kv=N|auto]" (also "off"); returns "" or an error
static std::string sparq_trim(const std::string & s) {
    const size_t b = s.find_first_not_of(" \t");
    return b == std::string::npos ? "" : s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

// the rules of Python's SparQ.parse: spaces around items allowed, each key at most once, r and k required
std::string sparq_parse(const std::string & spec_in, int32_t & r, int32_t & k, bool & mean_v, ggml_type & kt,
                        int32_t & min_kv) {
    r = 0; k = 0; mean_v = false; kt = GGML_TYPE_COUNT; min_kv = LLAMA_SPARSE_SPARQ_MIN_KV_AUTO;
    const std::string spec = sparq_trim(spec_in);
    std::string low = spec;
    std::transform(low.begin(), low.end(), low.begin(), [](unsigned char c) { return (char) std::tolower(c); });
    if (low.empty() || low == "0" || low == "off" || low == "none") { // as Python's SparQ.parse takes them
        return "";
    }
    std::set<std::string> seen;
    size_t pos = 0;
    while (pos <= spec.size()) {
        const size_t end = std::min(spec.find(',', pos), spec.size());
        const std::string item = spec.substr(pos, end - pos);
        pos = end + 1;
        const size_t eq = item.find('=');
        if (eq == std::string::npos) {
            return "expected key=value, got '" + item + "'";
        }
        const std::string key = sparq_trim(item.substr(0, eq)), val = sparq_trim(item.substr(eq + 1));
        if (key != "r" && key != "k" && key != "mean_v" && key != "kt" && key != "min_kv") {
            return "unknown key '" + key + "' (use r, k, mean_v, kt, min_kv)";
        }
        if (!seen.insert(key).second) {
            return key + " is given twice";
        }
        if (key == "kt") {
            if (val == "q8_0") {
                kt = GGML_TYPE_Q8_0;
            } else if (val == "k") {
                kt = GGML_TYPE_COUNT;
            } else {
                return "kt is k (the K cache's type) or q8_0, got '" + val + "'";
            }
            continue;
        }
        if (key == "min_kv" && val == "auto") {
            min_kv = LLAMA_SPARSE_SPARQ_MIN_KV_AUTO;
            continue;
        }
        char * stop = nullptr;
        errno = 0;
        const long long x = strtoll(val.c_str(), &stop, 10);
        if (val.empty() || *stop != '\0') {
            return "'" + key + "' needs an integer, got '" + val + "'";
        }
        if (errno == ERANGE || x < INT32_MIN || x > INT32_MAX) {
            return "'" + key + "' = " + val + " is out of range (32-bit)";
        }
        if (key == "r") {
            r = (int32_t) x;
        } else if (key == "k") {
            k = (int32_t) x;
        } else if (key == "mean_v") {
            if (x != 0 && x != 1) {
                return "mean_v is 0 or 1";
            }
            mean_v = x != 0;
        } else {
            if (x < 0) {
                return "min_kv is a count of positions >= 0, or auto";
            }
            min_kv = (int32_t) x;
        }
    }
    if (!seen.count("r") || !seen.count("k")) {
        return "both r and k are needed, e.g. r=32,k=128";
    }
    if (r < 1 || k < 1) {
        return "r and k must be >= 1";
    }
    return "";
}

// "" if kt is a storage of the transposed K (the K cache's type: GGML_TYPE_COUNT, or Q8_0), else why not
std::string sparq_kt_error(ggml_type kt) {
    if (kt == GGML_TYPE_COUNT || kt == GGML_TYPE_Q8_0) {
        return "";
    }
    return std::string("SparQ: the transposed K is stored as the K cache's type or q8_0, not ") +
           (kt >= 0 && kt < GGML_TYPE_COUNT ? ggml_type_name(kt) : "an unknown type");
}

// the state with kt as the copy's storage (made if missing); another storage than the allocated one drops both
// copies (graphs holding them are not reused: sparq_set and the kt setter bump the generation)
llama_sparq_kv & sparq_state_kt(std::shared_ptr<llama_sparq_kv> & sp, ggml_type kt) {
    if (!sp) {
        sp = std::make_shared<llama_sparq_kv>();
    }
    if (sp->allocated && sp->kt != kt) {
        sp->k_t.clear();
        sp->v_sum.clear();
        sp->ctxs_bufs.clear();
        sp->allocated = false;
    }
    sp->kt = kt;
    return *sp;
}

// set the knobs of a cache; allocates the state on first use, again when kt changes the copy's type
int32_t sparq_set(llama_kv_cache & kv, int32_t r, int32_t k, bool mean_v, ggml_type kt) {
    const std::string kt_err = sparq_kt_error(kt);
    if (!kt_err.empty()) {
        return sparq_error(kt_err);
    }
    if (r < 0 || k < 0 || (r == 0) != (k == 0)) {
        return sparq_error("SparQ: r and k must both be >= 1 (or both 0 to turn SparQ off); got r=" +
                           std::to_string(r) + ", k=" + std::to_string(k));
    }
    auto & sp = acc::state(kv);
    g_sparq_generation++;
    if (r == 0) {
        if (sp && sp->on()) {
            // appends stop while off: the copies are rebuilt when SparQ comes back
            sp->r = sp->k = 0;
            sp->stale_k = sp->stale_v = true;
        }
        return 0;
    }
    const std::string why = sparq_unsupported(kv, kt);
    if (!why.empty()) {
        return sparq_error("SparQ cannot run on this context: " + why);
    }
    sparq_state_kt(sp, kt);
    bool fresh = false;
    if (!sp->allocated) {
        try {
            sparq_allocate(kv, *sp);
        } catch (const std::exception & e) {
            sp.reset();
            return sparq_error(e.what());
        }
        fresh = true;
    }
    sp->r      = r;
    sp->k      = k;
    sp->mean_v = mean_v;
    if (!mean_v) {
        sp->stale_v = true; // graphs stop keeping the V sums up to date
    }
    if (fresh) {
        sparq_preload(kv, *sp);
    }
    return 0;
}

llama_kv_cache * context_kv(llama_context * ctx) {
    if (ctx == nullptr) {
        return nullptr;
    }
    return dynamic_cast<llama_kv_cache *>(llama_get_memory(ctx));
}

// -1 with the reason a setter (fn) found no plain KV cache in ctx
int32_t sparq_no_kv_error(const llama_context * ctx, const char * fn) {
    return sparq_error(ctx == nullptr ? std::string(fn) + ": no context" :
                       "SparQ needs a plain KV cache (not sliding-window, recurrent or hybrid memory)");
}

// decode: every token is the only one of its (single) sequence in the ubatch. The graphs reserved at
// context creation carry no sequence ids (n_seq_id 0): one token per sequence counts as decode there.
bool sparq_ubatch_is_decode(const llama_ubatch & ub, const uint32_t n_seq_max) {
    bool decode = ub.n_tokens > 0;
    std::vector<bool> seen(n_seq_max, false);
    for (uint32_t t = 0; t < ub.n_tokens && decode; ++t) {
        if (ub.n_seq_id[t] == 0) {
            decode = ub.n_seq_tokens == 1;
            continue;
        }
        const llama_seq_id q = ub.seq_id[t][0];
        decode = ub.n_seq_id[t] == 1 && q >= 0 && (size_t) q < seen.size() && !seen[q];
        if (decode) {
            seen[q] = true;
        }
    }
    return decode;
}

} // namespace

//
// per-graph input: element indices for the k_t append, one-hot sequences for the V sums, each token's
// sequence and 1/count for the V mean
//

class llm_graph_input_sparq : public llm_graph_input_i {
public:
    llm_graph_input_sparq(llama_kv_cache * kv, ggml_backend_sched_t sched, ggml_tensor * k_idxs)
        : kv(kv), sched(sched), k_idxs(k_idxs), generation(g_sparq_generation.load()) {}

    void set_input(const llama_ubatch * ubatch) override;

    // a graph stays reusable until a SparQ setting changes. With SparQ on it must also be for the same cache
    // and the same kind of ubatch (decode or not); upstream's KV input already pins n_kv, on which the
    // dense fallback (k >= n_kv) was decided. Stale copies are rebuilt by set_input, which reuse still calls.
    bool can_reuse(const llm_graph_params & params) override {
        if (generation != g_sparq_generation.load()) {
            return false;
        }
        if (kv == nullptr) {
            return true;
        }
        const auto * mctx = dynamic_cast<const llama_kv_cache_context *>(params.mctx);
        return mctx != nullptr && acc::kv(mctx) == kv && n_tok_built == (int64_t) params.ubatch.n_tokens &&
               decode == sparq_ubatch_is_decode(params.ubatch, acc::n_seq_max(*kv));
    }

    llama_kv_cache       * kv;
    ggml_backend_sched_t   sched;
    ggml_tensor          * k_idxs;            // upstream's rows of this ubatch (stream*kv_size + cell), host
    uint64_t               generation;

    ggml_tensor * kt_idxs   = nullptr;        // I64 [n_embd_k_gqa*n_tokens]: k_t elements, or [n_embd_k_gqa*n_slots]:
                                              // the Q8_0 block row of each (slot, component)
    ggml_tensor * blk_cells = nullptr;        // I32 [32*n_slots]: K cache rows of each slot's block (Q8_0 k_t)
    ggml_tensor * blk_keep  = nullptr;        // F32 [1, 32*n_slots]: 1 for a used cell, 0 for an empty one
    ggml_tensor * onehot    = nullptr;        // F32 [n_tokens, n_seq_max]
    ggml_tensor * tok_seq   = nullptr;        // I32 [n_tokens]
    ggml_tensor * inv_count = nullptr;        // F32 [1, n_tokens]
    int64_t       n_embd_k  = 0;
    int64_t       n_tok_built = 0;            // tokens of the ubatch the graph was built for
    int64_t       n_slots   = 0;              // Q8_0 k_t: 32-cell blocks requantized per graph; else n_tokens
    bool          decode    = false;          // one token per sequence: the op may run
    bool          kt_keep   = true;           // the graph appends to k_t (false below min_kv: the copy goes stale)

    std::map<int, ggml_tensor *> kt_cur;      // model layer -> k_t after this ubatch's append
    std::map<int, ggml_tensor *> vsum_cur;    // model layer -> v_sum after this ubatch's update
};

void llm_graph_input_sparq::set_input(const llama_ubatch * ubatch) {
    if (kv == nullptr) {
        return; // marker
    }
    auto & st = *acc::state(*kv);
    if (!decode && st.on() && st.from_env && !st.told_dense) {
        // as LLAMA_SPARSE's note: a tool such as llama-perplexity would otherwise report dense figures without a word
        st.told_dense = true;
        LLAMA_LOG_WARN("llama-sparse: LLAMA_SPARQ is set, but batches with several tokens of a sequence (prompts) "
                       "attend densely: SparQ acts at decode (llama-perplexity measures it with -ub 1)\n");
    }
    const int64_t kv_size = kv->get_size();
    const int64_t n_tokens = ubatch->n_tokens;
    const int64_t n_seq = acc::n_seq_max(*kv);
    GGML_ASSERT(ggml_backend_buffer_is_host(k_idxs->buffer) && k_idxs->ne[0] == n_tokens);
    const int64_t * rows = (const int64_t *) k_idxs->data;

    // the V sums are only read with mean-V on: until then they stay stale (graph appends to them are moot)
    if ((st.stale_k && kt_keep) || (st.stale_v && st.mean_v)) {
        ggml_backend_sched_synchronize(sched); // earlier graphs may still be writing the cache
        if (st.stale_k && kt_keep) {
            sparq_rebuild_k(*kv, st, sched);
        }
        if (st.stale_v && st.mean_v) {
            std::vector<uint8_t> skip(kv_size*acc::n_stream(*kv), 0);
            for (int64_t t = 0; t < n_tokens; ++t) {
                skip[rows[t]] = 1;
            }
            sparq_rebuild_v(*kv, st, skip);
        }
    }

    if (!kt_keep) {
        st.stale_k = true; // this ubatch's K is not appended
    } else if (st.k_t[0]->type == GGML_TYPE_Q8_0) {
        // one slot per distinct (stream, 32-cell block) of the ubatch, the spare slots repeating slot 0: every
        // slot requantizes its whole block from the K cache, so repeats write the same bytes. More blocks than
        // slots (a prefill over scattered cells): the copy is rebuilt before the next graph
        GGML_ASSERT(ggml_backend_buffer_is_host(kt_idxs->buffer) && ggml_backend_buffer_is_host(blk_cells->buffer) &&
                    ggml_backend_buffer_is_host(blk_keep->buffer));
        int64_t * idx  = (int64_t *) kt_idxs->data;
        int32_t * bc   = (int32_t *) blk_cells->data;
        float   * keep = (float *) blk_keep->data;
        std::vector<int64_t> blocks; // stream*kv_size + first cell
        for (int64_t t = 0; t < n_tokens; ++t) {
            const int64_t b = rows[t] - rows[t] % 32;
            if (std::find(blocks.begin(), blocks.end(), b) == blocks.end()) {
                blocks.push_back(b);
            }
        }
        if ((int64_t) blocks.size() > n_slots) {
            st.stale_k = true;
        }
        for (int64_t i = 0; i < n_slots; ++i) {
            const int64_t b = blocks[i < (int64_t) blocks.size() ? i : 0];
            const int64_t strm = b/kv_size, blk = (b % kv_size)/32;
            const auto & cells = acc::cells(*kv, (uint32_t) strm);
            for (int j = 0; j < 32; ++j) {
                bc[i*32 + j]   = (int32_t) (b + j);
                keep[i*32 + j] = cells.is_empty((uint32_t) (b % kv_size + j)) ? 0.0f : 1.0f;
            }
            for (int64_t e = 0; e < n_embd_k; ++e) {
                idx[i*n_embd_k + e] = (strm*n_embd_k + e)*(kv_size/32) + blk;
            }
        }
    } else {
        GGML_ASSERT(ggml_backend_buffer_is_host(kt_idxs->buffer));
        int64_t * idx = (int64_t *) kt_idxs->data;
        for (int64_t t = 0; t < n_tokens; ++t) {
            const int64_t strm = rows[t]/kv_size, cell = rows[t] % kv_size;
            for (int64_t e = 0; e < n_embd_k; ++e) {
                idx[t*n_embd_k + e] = (strm*n_embd_k + e)*kv_size + cell;
            }
        }
    }
    if (onehot->buffer == nullptr) {
        return; // mean-V off: no V-sum nodes in the graph
    }
    GGML_ASSERT(ggml_backend_buffer_is_host(onehot->buffer));
    float * oh = (float *) onehot->data;
    memset(oh, 0, ggml_nbytes(onehot));
    for (int64_t t = 0; t < n_tokens; ++t) {
        for (int32_t s = 0; s < ubatch->n_seq_id[t]; ++s) {
            const llama_seq_id q = ubatch->seq_id[t][s];
            GGML_ASSERT(q >= 0 && q < n_seq);
            oh[q*n_tokens + t] = 1.0f;
        }
    }
    // the V-mean inputs are in the graph only when the op blends with the mean
    if (tok_seq->buffer == nullptr || inv_count->buffer == nullptr) {
        return;
    }
    GGML_ASSERT(ggml_backend_buffer_is_host(tok_seq->buffer) && ggml_backend_buffer_is_host(inv_count->buffer));
    int32_t * ts = (int32_t *) tok_seq->data;
    float * ic = (float *) inv_count->data;
    for (int64_t t = 0; t < n_tokens; ++t) {
        const llama_seq_id q = ubatch->seq_id[t][0];
        ts[t] = q;
        // the cells of q, the ubatch's own included (they are already placed)
        const auto & cells = acc::cells(*kv, acc::stream_of(*kv, q));
        int64_t count = 0;
        for (uint32_t j = 0; j < cells.size(); ++j) {
            count += !cells.is_empty(j) && cells.seq_has(j, q);
        }
        ic[t] = count > 0 ? 1.0f/count : 0.0f;
    }
}

//
// KV cache hooks
//

void llama_sparq_kv_init(llama_kv_cache & kv) {
    const char * env = getenv("LLAMA_SPARQ");
    if (env == nullptr || *env == '\0') {
        return;
    }
    int32_t r, k, min_kv;
    bool mean_v;
    ggml_type kt;
    // also on stderr: tools such as llama-bench mute the log, and would only say the context failed
    auto fail = [env](const std::string & why) {
        fprintf(stderr, "llama-sparse: LLAMA_SPARQ='%s': %s\n", env, why.c_str());
        throw std::runtime_error(std::string("LLAMA_SPARQ='") + env + "': " + why);
    };
    const std::string err = sparq_parse(env, r, k, mean_v, kt, min_kv);
    if (!err.empty()) {
        fail(err);
    }
    if (r == 0) {
        return;
    }
    if (sparq_set(kv, r, k, mean_v, kt) != 0) {
        fail(g_sparq_error);
    }
    acc::state(kv)->min_kv   = min_kv;
    acc::state(kv)->from_env = true;
    LLAMA_LOG_INFO("%s: SparQ attention on: r = %d, k = %d, mean_v = %d, kt = %s, min_kv = %s (LLAMA_SPARQ)\n", __func__,
                   r, k, (int) mean_v, kt == GGML_TYPE_Q8_0 ? "q8_0" : "k",
                   min_kv == LLAMA_SPARSE_SPARQ_MIN_KV_AUTO ? "auto" : std::to_string(min_kv).c_str());
}

void llama_sparq_kv_on_seq_rm(llama_kv_cache & kv, llama_seq_id seq_id, llama_pos p0, llama_pos p1) {
    auto & sp = acc::state(kv);
    // a Q8_0 k_t also depends on which cells are used (their K sets the block scales)
    const bool kt_q8 = sp && sp->allocated && sp->kt == GGML_TYPE_Q8_0;
    if (!sp || !sp->on() || (sp->stale_v && (!kt_q8 || sp->stale_k))) {
        return;
    }
    if (p0 < 0) {
        p0 = 0;
    }
    if (p1 < 0) {
        p1 = std::numeric_limits<llama_pos>::max();
    }
    // llama-cpp-python trims past the end before every eval: only a call that removes a cell costs a rebuild
    for (uint32_t s = 0; s < acc::n_stream(kv); ++s) {
        if (seq_id >= 0 && acc::stream_of(kv, seq_id) != s) {
            continue;
        }
        const auto & cells = acc::cells(kv, s);
        for (uint32_t j = 0; j < cells.size(); ++j) {
            if (!cells.is_empty(j) && cells.pos_in(j, p0, p1) && (seq_id < 0 || cells.seq_has(j, seq_id))) {
                sp->stale_v = true;
                sp->stale_k |= kt_q8;
                return;
            }
        }
    }
}

void llama_sparq_kv_stale(llama_kv_cache & kv, bool k_changed, bool v_changed) {
    auto & sp = acc::state(kv);
    if (sp) {
        // cells emptied or reassigned: a Q8_0 k_t's block scales may change with them
        sp->stale_k |= k_changed || (v_changed && sp->kt == GGML_TYPE_Q8_0);
        sp->stale_v |= v_changed;
    }
}

void llama_sparq_kv_on_apply(llama_kv_cache & kv, const llama_kv_cache::slot_info & sinfo) {
    auto & sp = acc::state(kv);
    if (!sp || !sp->on() || sp->stale_v) {
        return;
    }
    for (size_t s = 0; s < sinfo.n_stream(); ++s) {
        const auto & cells = acc::cells(kv, sinfo.strm[s]);
        for (uint32_t j : sinfo.idxs[s]) {
            if (!cells.is_empty(j)) {
                sp->stale_v = true;
                return;
            }
        }
    }
}

//
// graph hooks
//

// min_kv AUTO: the cache view from which the op pays. On a GPU the op takes 20-45 us a layer at any context (H200,
// Llama-3-8B shapes), and flash attention reaches that reading ~80 MiB of K and V a layer: SparQ was even with it
// end to end at 16k positions (f16, 64 MiB) and 1.09-1.11x at 24k (bench/results/sparq_min_kv_h200_2026-12-02.md).
// On the CPU it was even at the smallest view (256) and 1.56x at 512 (SmolLM2, 2 cores): from the start there
static int64_t sparq_auto_min_kv(const ggml_tensor * k_cache, const size_t bytes_per_pos) {
    ggml_backend_buffer_t buf = k_cache ? k_cache->buffer : nullptr;
    ggml_backend_dev_t dev = buf ? ggml_backend_buft_get_device(ggml_backend_buffer_get_type(buf)) : nullptr;
    if (dev == nullptr || ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_CPU) {
        return 0;
    }
    const int64_t gpu_bytes = 80ll << 20;
    return (gpu_bytes + (int64_t) bytes_per_pos - 1)/(int64_t) bytes_per_pos;
}

// the view from which layer ikv's decode runs the op: min_kv, or AUTO's threshold for the device of its cache
static int64_t sparq_layer_min_kv(const llama_kv_cache & kv, const llama_sparq_kv & st, int32_t ikv) {
    if (st.min_kv != LLAMA_SPARSE_SPARQ_MIN_KV_AUTO) {
        return st.min_kv;
    }
    if (ikv < 0) {
        return 0;
    }
    const ggml_tensor * kc = acc::layer_k(kv, ikv);
    const ggml_tensor * vc = acc::layer_v(kv, ikv);
    const uint32_t il = acc::layer_il(kv, ikv);
    const auto & hp = acc::hparams(kv);
    return sparq_auto_min_kv(kc, ggml_row_size(kc->type, hp.n_embd_k_gqa(il)) + ggml_row_size(vc->type, hp.n_embd_v_gqa(il)));
}

// the smallest view at which some layer's decode runs the op
static int64_t sparq_min_kv_any(const llama_kv_cache & kv, const llama_sparq_kv & st) {
    int64_t mk = INT64_MAX;
    for (size_t i = 0; i < acc::n_layers(kv); ++i) {
        mk = std::min(mk, sparq_layer_min_kv(kv, st, (int32_t) i));
    }
    return mk;
}

void llama_sparq_build_store(const llm_graph_context & g, const llama_kv_cache_context * mctx,
                             ggml_tensor * k_cur, ggml_tensor * v_cur, ggml_tensor * k_idxs, int il) {
    llama_kv_cache * kv = acc::kv(mctx);
    auto & sp = acc::state(*kv);
    if (!sp || !sp->on()) {
        if (g.inp_sparq == nullptr) {
            auto marker = std::make_unique<llm_graph_input_sparq>(nullptr, nullptr, nullptr);
            g.inp_sparq = marker.get();
            g.res->add_input(std::move(marker));
        }
        return;
    }
    if (g.inp_sparq != nullptr && g.inp_sparq->kv == nullptr) {
        return; // SparQ came on in the middle of this graph's build: not possible, but stay consistent
    }
    const int32_t ikv = acc::ikv(*kv, il);
    if (ikv < 0) {
        return;
    }
    ggml_context * ctx0 = g.ctx0;
    const int64_t n_tokens = k_cur->ne[2];

    if (g.inp_sparq == nullptr) {
        auto inp = std::make_unique<llm_graph_input_sparq>(kv, g.sched, k_idxs);
        inp->decode    = sparq_ubatch_is_decode(g.ubatch, acc::n_seq_max(*kv));
        inp->n_embd_k  = sp->k_t[ikv]->ne[1];
        inp->n_tok_built = n_tokens;
        // Below min_kv no layer runs the op, so the copy is not kept (no append nodes: its upkeep cost 2-4 % of a
        // decode step at short contexts, bench/results/sparq_preload_h200_2026-12-03.md). It goes stale, and the first
        // graph at min_kv rebuilds it from the K cache (one transposing copy a layer on the cache's backend).
        // LLAMA_SPARSE_SPARQ_KEEP_COPY=1: append always.
        static const bool keep_env = [] { const char * e = getenv("LLAMA_SPARSE_SPARQ_KEEP_COPY"); return e && atoi(e) != 0; }();
        inp->kt_keep   = keep_env || (int64_t) mctx->get_n_kv() >= sparq_min_kv_any(*kv, *sp);
        // Q8_0 k_t: a decode token per slot; a prefill's contiguous cells span at most n/32 + 2 blocks. Else a
        // slot is a token (one element per component)
        const bool kt_q8 = sp->k_t[ikv]->type == GGML_TYPE_Q8_0;
        inp->n_slots   = kt_q8 && !inp->decode ? std::min<int64_t>(n_tokens, n_tokens/32 + 2) : n_tokens;
        inp->kt_idxs   = ggml_new_tensor_1d(ctx0, GGML_TYPE_I64, inp->n_embd_k*inp->n_slots);
        inp->onehot    = ggml_new_tensor_2d(ctx0, GGML_TYPE_F32, n_tokens, acc::n_seq_max(*kv));
        inp->tok_seq   = ggml_new_tensor_1d(ctx0, GGML_TYPE_I32, n_tokens);
        inp->inv_count = ggml_new_tensor_2d(ctx0, GGML_TYPE_F32, 1, n_tokens);
        ggml_set_input(inp->kt_idxs);
        ggml_set_input(inp->onehot);
        ggml_set_input(inp->tok_seq);
        ggml_set_input(inp->inv_count);
        ggml_set_name(inp->kt_idxs, "sparq_kt_idxs");

        g.inp_sparq = inp.get();
        g.res->add_input(std::move(inp));
    }
    llm_graph_input_sparq * inp = g.inp_sparq;

    ggml_tensor * k_t = sp->k_t[ikv];
    if (!inp->kt_keep) {
        // not kept below min_kv (set_input marks the copy stale)
    } else if (k_t->type == GGML_TYPE_Q8_0) {
        // whole 32-cell blocks read back from the K cache, which holds this ubatch by now (graph order, as for
        // upstream's own attention reads), empty cells zeroed, transposed and requantized: one Q8_0 block row per
        // (slot, component). k_t = Q8_0 of K over the used cells, as a rebuild makes it.
        const int64_t n_embd = inp->n_embd_k, n_slots = inp->n_slots;
        if (inp->blk_cells == nullptr) {
            inp->blk_cells = ggml_new_tensor_1d(ctx0, GGML_TYPE_I32, 32*n_slots);
            inp->blk_keep  = ggml_new_tensor_2d(ctx0, GGML_TYPE_F32, 1, 32*n_slots);
            ggml_set_input(inp->blk_cells);
            ggml_set_input(inp->blk_keep);
            ggml_set_name(inp->blk_cells, "sparq_blk_cells");
        }
        ggml_tensor * kc  = acc::layer_k(*kv, ikv);
        GGML_ASSERT(kc->ne[0] == n_embd);
        // (the names let CUDA run these four nodes as one kernel: cuda/sparq-kt.cu)
        ggml_tensor * blk = ggml_get_rows(ctx0, ggml_reshape_2d(ctx0, kc, n_embd, kc->ne[1]*kc->ne[2]), inp->blk_cells);
        ggml_set_name(blk, "sparq_kt_gather");
        blk = ggml_mul(ctx0, blk, inp->blk_keep); // empty cells count as 0, so stale K there cannot set a scale
        ggml_set_name(blk, "sparq_kt_keep");
        blk = ggml_cont(ctx0, ggml_transpose(ctx0, ggml_reshape_3d(ctx0, blk, n_embd, 32, n_slots))); // [32, n_embd, n]
        ggml_set_name(blk, "sparq_kt_tr");
        blk = ggml_reshape_2d(ctx0, blk, 32, n_embd*n_slots);
        ggml_tensor * kt_res = ggml_set_rows(ctx0, ggml_reshape_2d(ctx0, k_t, 32, ggml_nelements(k_t)/32), blk, inp->kt_idxs);
        ggml_set_name(kt_res, "sparq_kt_put");
        ggml_build_forward_expand(g.gf, kt_res);
        inp->kt_cur[il] = kt_res;
    } else {
        // one 1-element row per (token, component)
        ggml_tensor * k_flat = ggml_is_contiguous(k_cur) ? k_cur : ggml_cont(ctx0, k_cur);
        k_flat = ggml_reshape_2d(ctx0, k_flat, 1, ggml_nelements(k_flat));
        GGML_ASSERT(ggml_nelements(k_flat) == inp->n_embd_k*n_tokens);
        ggml_tensor * kt_res = ggml_set_rows(ctx0, ggml_reshape_2d(ctx0, k_t, 1, ggml_nelements(k_t)), k_flat, inp->kt_idxs);
        ggml_build_forward_expand(g.gf, kt_res);
        inp->kt_cur[il] = kt_res;
    }

    // V sums: v_sum += V_cur^T onehot. Only read with mean-V on; with it off they are not kept (stale_v, set by
    // sparq_set, has them rebuilt when mean-V comes on), which saves ~6 small kernels a layer at decode.
    if (!sp->mean_v) {
        return;
    }
    ggml_tensor * v_sum = sp->v_sum[ikv];
    ggml_tensor * v2 = ggml_is_contiguous(v_cur) ? v_cur : ggml_cont(ctx0, v_cur);
    v2 = ggml_reshape_2d(ctx0, v2, v_sum->ne[0], n_tokens);
    ggml_tensor * v_cache = acc::layer_v(*kv, ikv);
    if (v_cache->type != GGML_TYPE_F32) {
        // sum what the cache holds, so a host rebuild from the cache gives the same sums
        v2 = ggml_cast(ctx0, ggml_cast(ctx0, v2, v_cache->type), GGML_TYPE_F32);
    }
    ggml_tensor * delta = ggml_mul_mat(ctx0, ggml_cont(ctx0, ggml_transpose(ctx0, v2)), inp->onehot);
    ggml_tensor * vs_res = ggml_cpy(ctx0, ggml_add(ctx0, v_sum, delta), v_sum);
    ggml_build_forward_expand(g.gf, vs_res);
    inp->vsum_cur[il] = vs_res;
}

ggml_tensor * llama_sparq_build_attn(const llm_graph_context & g, const llama_kv_cache_context * mctx,
                                     ggml_tensor * q, ggml_tensor * k, ggml_tensor * v, ggml_tensor * kq_b,
                                     ggml_tensor * kq_mask, ggml_tensor * sinks, ggml_tensor * v_mla,
                                     float kq_scale, int il) {
    llm_graph_input_sparq * inp = g.inp_sparq;
    if (inp == nullptr || inp->kv == nullptr || !inp->decode || inp->kt_cur.count(il) == 0) {
        return nullptr;
    }
    llama_kv_cache * kv = acc::kv(mctx);
    const auto & st = *acc::state(*kv);
    const auto & hp = g.hparams;
    if (!st.on() || kq_b || sinks || v_mla || hp.attn_soft_cap || hp.f_max_alibi_bias > 0.0f || g.arch == LLM_ARCH_GROK) {
        return nullptr;
    }
    // k views from get_k/get_v: [D, Hkv, n_kv, ns] (V transposed: [n_kv, Hkv, Dv, ns])
    const int64_t n_kv = k->ne[2];
    if (st.k >= n_kv) {
        return nullptr; // every position would be read: dense attention is exact and faster
    }
    const int64_t D = k->ne[0], Hkv = k->ne[1], ns = k->ne[3];
    const bool v_trans = acc::v_trans(*kv);
    const int64_t Dv = v_trans ? v->ne[2] : v->ne[0];
    const int64_t min_kv = sparq_layer_min_kv(*kv, st, acc::ikv(*kv, il));
    if (st.min_kv == LLAMA_SPARSE_SPARQ_MIN_KV_AUTO) {
        auto & sp = acc::state(*kv);
        if (sp->min_kv_logged != (int32_t) min_kv) {
            sp->min_kv_logged = (int32_t) min_kv;
            if (min_kv > 0) {
                LLAMA_LOG_INFO("%s: SparQ (min_kv auto) runs from a cache view of %lld positions on; dense attention below\n",
                               __func__, (long long) min_kv);
            } else {
                LLAMA_LOG_INFO("%s: SparQ (min_kv auto) runs from the first decode step (the KV cache is not on a GPU)\n", __func__);
            }
        }
    }
    if (n_kv < min_kv) {
        return nullptr; // a context too short for SparQ to pay
    }
    ggml_context * ctx0 = g.ctx0;
    const int64_t n_tokens = q->ne[2], H = q->ne[1];
    const int64_t kv_size = kv->get_size();
    const int64_t n_embd_k = inp->n_embd_k;
    const size_t kt_row = ggml_row_size(inp->kt_cur[il]->type, kv_size); // bytes of one component's cells
    const int64_t s0 = (int64_t) (k->view_offs/ggml_row_size(k->type, k->ne[0]*Hkv*kv_size)); // first stream

    ggml_tensor * q4 = ggml_view_4d(ctx0, q, D, H, n_tokens/ns, ns, q->nb[1], q->nb[2], q->nb[2]*(n_tokens/ns), 0);
    q4 = ggml_permute(ctx0, q4, 0, 2, 1, 3);                     // [D, n_tok, H, ns]
    ggml_tensor * k4 = ggml_permute(ctx0, k, 0, 2, 1, 3);        // [D, n_kv, Hkv, ns]
    ggml_tensor * v4 = ggml_permute(ctx0, v, 0, 2, 1, 3);
    if (v_trans) {
        v4 = ggml_transpose(ctx0, v4);                            // [n_kv, Dv, Hkv, ns] -> [Dv, n_kv, Hkv, ns]
    }
    ggml_tensor * kt4 = ggml_view_4d(ctx0, inp->kt_cur[il], n_kv, D, Hkv, ns,
                                     kt_row, kt_row*D, kt_row*n_embd_k, kt_row*n_embd_k*s0);

    ggml_tensor * v_mean = nullptr;
    if (st.mean_v) {
        v_mean = ggml_get_rows(ctx0, inp->vsum_cur[il], inp->tok_seq);      // [n_embd_v, n_tokens]
        v_mean = ggml_mul(ctx0, v_mean, inp->inv_count);
        v_mean = ggml_reshape_4d(ctx0, v_mean, Dv, Hkv, n_tokens/ns, ns);
    }
    ggml_tensor * cur = ggml_sparq_attn(ctx0, q4, k4, kt4, v4, kq_mask, v_mean, kq_scale, st.r, st.k,
                                        st.mean_v ? GGML_SPARQ_MEAN_V : 0);
    g.cb(cur, "sparq_attn", il);
    return ggml_reshape_2d(ctx0, cur, Dv*H, n_tokens);
}

//
// C API
//

int32_t llama_sparse_set_sparq(llama_context * ctx, int32_t r, int32_t k, bool mean_v) {
    llama_kv_cache * kv = context_kv(ctx);
    if (kv == nullptr && ctx != nullptr && r == 0 && k == 0) {
        return 0;  // off is all such a context can be (llama_sparse.Llama turns SparQ off on every model it opens)
    }
    if (kv == nullptr) {
        return sparq_no_kv_error(ctx, "llama_sparse_set_sparq");
    }
    const auto & sp = acc::state(*kv);
    return sparq_set(*kv, r, k, mean_v, sp ? sp->kt : GGML_TYPE_COUNT);
}

int32_t llama_sparse_set_sparq_kt(llama_context * ctx, enum ggml_type kt) {
    llama_kv_cache * kv = context_kv(ctx);
    if (kv == nullptr) {
        return sparq_no_kv_error(ctx, "llama_sparse_set_sparq_kt");
    }
    auto & sp = acc::state(*kv);
    if (sp && sp->on()) {
        return sparq_set(*kv, sp->r, sp->k, sp->mean_v, kt);
    }
    const std::string kt_err = sparq_kt_error(kt);
    if (!kt_err.empty()) {
        return sparq_error(kt_err);
    }
    g_sparq_generation++;
    sparq_state_kt(sp, kt); // used when SparQ comes on
    return 0;
}

enum ggml_type llama_sparse_get_sparq_kt(const llama_context * ctx) {
    llama_kv_cache * kv = context_kv(const_cast<llama_context *>(ctx));
    const auto * st = kv ? acc::state(*kv).get() : nullptr;
    return st ? st->kt : GGML_TYPE_COUNT;
}

int32_t llama_sparse_set_sparq_min_kv(llama_context * ctx, int32_t min_kv) {
    llama_kv_cache * kv = context_kv(ctx);
    if (kv == nullptr) {
        return sparq_no_kv_error(ctx, "llama_sparse_set_sparq_min_kv");
    }
    if (min_kv < 0 && min_kv != LLAMA_SPARSE_SPARQ_MIN_KV_AUTO) {
        return sparq_error("SparQ: min_kv is a count of positions >= 0 or LLAMA_SPARSE_SPARQ_MIN_KV_AUTO (-1), got " +
                           std::to_string(min_kv));
    }
    auto & sp = acc::state(*kv);
    if (!sp) {
        sp = std::make_shared<llama_sparq_kv>(); // kept for when SparQ comes on
    }
    sp->min_kv = min_kv;
    g_sparq_generation++; // graphs built under the old threshold are not reused
    return 0;
}

int32_t llama_sparse_get_sparq_min_kv(const llama_context * ctx) {
    llama_kv_cache * kv = context_kv(const_cast<llama_context *>(ctx));
    const auto * st = kv ? acc::state(*kv).get() : nullptr;
    return st ? st->min_kv : LLAMA_SPARSE_SPARQ_MIN_KV_AUTO;
}

bool llama_sparse_get_sparq(const llama_context * ctx, int32_t * r, int32_t * k, bool * mean_v) {
    llama_kv_cache * kv = context_kv(const_cast<llama_context *>(ctx));
    const auto * st = kv ? acc::state(*kv).get() : nullptr;
    const bool on = st && st->on();
    if (r)      { *r      = on ? st->r : 0; }
    if (k)      { *k      = on ? st->k : 0; }
    if (mean_v) { *mean_v = on && st->mean_v; }
    return on;
}

int32_t llama_sparse_set_sparq_str(llama_context * ctx, const char * spec) {
    int32_t r, k, min_kv;
    bool mean_v;
    ggml_type kt;
    const std::string err = sparq_parse(spec ? spec : "", r, k, mean_v, kt, min_kv);
    if (!err.empty()) {
        return sparq_error(std::string("SparQ setting '") + (spec ? spec : "") + "': " + err);
    }
    if (r == 0) {
        return llama_sparse_set_sparq(ctx, 0, 0, false);
    }
    // the string names every knob: kt left out is the K cache's type, min_kv left out auto; on failure the
    // knobs already set go back, so a refused string changes nothing
    const ggml_type kt0 = llama_sparse_get_sparq_kt(ctx);
    const int32_t   mk0 = llama_sparse_get_sparq_min_kv(ctx);
    int32_t rc = llama_sparse_set_sparq_kt(ctx, kt);
    rc = rc != 0 ? rc : llama_sparse_set_sparq_min_kv(ctx, min_kv);
    rc = rc != 0 ? rc : llama_sparse_set_sparq(ctx, r, k, mean_v);
    if (rc != 0) {
        const std::string why = g_sparq_error;
        llama_sparse_set_sparq_kt(ctx, kt0);
        llama_sparse_set_sparq_min_kv(ctx, mk0);
        g_sparq_error = why;
    }
    return rc;
}

const char * llama_sparse_sparq_last_error(void) {
    return g_sparq_error.c_str();
}
