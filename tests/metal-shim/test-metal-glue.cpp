// llama-sparse: metal/ggml-sparse-metal.cpp, the real glue, run on Linux. Stand-ins for the parts of ggml-metal's
// device layer it calls (pipelines, encoder, buffer ids, mapping host memory) run every dispatch through the shim,
// so this checks what the unit tests of test-metal-kernels.cpp cannot: the buffer indices, arguments and scratch
// the glue encodes, and the counters of llama_sparse_get_stats from the LIST kernels through the collector the glue
// registers (ggml_sparse_stats_collect / _release from ggml-sparse.c), per context and per device; decode GEMVs over
// the LIST op's output, dense and sparse, n1 = 1 and n1 > 1 (the reduction's scratch), against an fp64 product;
// SparQ attention (its arguments, bindings and scratch) against the CPU op's scalar reference.
//
//   test-metal-glue [--seed S]      last line "N passed, N failed"; exit status 1 on failure
#include "shim-runtime.h"
#include "shim-test.h"
#include "ggml-sparse-metal.h"
#include "ggml-sparse.h"
#include "ggml-sparse-cpu-sparq.h"
#include "ggml.h"
#include "ggml-backend-impl.h"
#include "ggml-metal-device.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

//
// stand-ins for ggml-metal-device.m: a pipeline is a kernel name (+ the token count constant), a buffer id is a
// host address, and the encoder dispatches at once (so its memory barriers have nothing to do)
//

struct ggml_metal_device   { int id; };
struct ggml_metal_library  { ggml_metal_device * dev; };
struct ggml_metal_buffer   { void * base; size_t size; };
struct ggml_metal_cv       { int nt = -1; };
struct ggml_metal_pipeline { std::string fn; int nt; };

struct ggml_metal_encoder {
    ggml_metal_pipeline *           p = nullptr;
    void *                          bufs[16] = {};
    std::vector<std::vector<char>>  bytes = std::vector<std::vector<char>>(16);
    size_t                          tgmem[4] = {};
};

static std::map<std::string, ggml_metal_pipeline *> g_pipelines;
static std::vector<ggml_metal_buffer *>             g_mapped;

extern "C" {

ggml_metal_cv_t ggml_metal_cv_init(void) { return new ggml_metal_cv; }
void ggml_metal_cv_free(ggml_metal_cv_t cv) { delete cv; }
void ggml_metal_cv_set_int16(ggml_metal_cv_t cv, int16_t value, int32_t idx) {
    if (idx != GGML_SPARSE_METAL_FC_ZZ_NT) { std::fprintf(stderr, "glue test: function constant %d\n", idx); std::abort(); }
    cv->nt = value;
}

ggml_metal_pipeline_with_params ggml_metal_library_get_pipeline(ggml_metal_library_t, const char * name) {
    auto it = g_pipelines.find(name);
    ggml_metal_pipeline_with_params res = {};
    res.pipeline = it == g_pipelines.end() ? nullptr : it->second;
    return res;
}

ggml_metal_pipeline_with_params ggml_metal_library_compile_pipeline(ggml_metal_library_t, const char * base, const char * name, ggml_metal_cv_t cv) {
    auto * p = new ggml_metal_pipeline{ base, cv ? cv->nt : -1 };
    g_pipelines[name] = p;
    ggml_metal_pipeline_with_params res = {};
    res.pipeline = p;
    return res;
}

ggml_metal_pipeline_with_params ggml_metal_library_get_pipeline_mul_mm(ggml_metal_library_t, const ggml_tensor *) {
    std::fprintf(stderr, "glue test: prefill is not run here\n");
    std::abort();
}

int ggml_metal_pipeline_max_theads_per_threadgroup(ggml_metal_pipeline_with_params) { return 1024; }

ggml_metal_device_t ggml_metal_library_get_device(ggml_metal_library_t lib) { return lib->dev; }

ggml_metal_buffer_t ggml_metal_buffer_map(ggml_metal_device_t, void * ptr, size_t size, size_t) {
    auto * b = new ggml_metal_buffer{ ptr, size };
    g_mapped.push_back(b);
    return b;
}

ggml_metal_buffer_id ggml_metal_buffer_get_id(ggml_metal_buffer_t, const ggml_tensor * t) {
    return { t->data, 0 };
}

void ggml_metal_encoder_set_pipeline(ggml_metal_encoder_t enc, ggml_metal_pipeline_with_params p) { enc->p = p.pipeline; }

void ggml_metal_encoder_set_bytes(ggml_metal_encoder_t enc, void * data, size_t size, int idx) {
    enc->bytes[idx].assign((char *) data, (char *) data + size); // Metal copies the bytes at once
    enc->bufs[idx] = enc->bytes[idx].data();
}

void ggml_metal_encoder_set_buffer(ggml_metal_encoder_t enc, ggml_metal_buffer_id id, int idx) {
    enc->bufs[idx] = (char *) id.metal + id.offs;
}

void ggml_metal_encoder_set_threadgroup_memory_size(ggml_metal_encoder_t enc, size_t size, int idx) { enc->tgmem[idx] = size; }

void ggml_metal_encoder_dispatch_threadgroups(ggml_metal_encoder_t enc, int tg0, int tg1, int tg2, int tptg0, int tptg1, int tptg2) {
    if (enc->p->nt >= 0) {
        shim::set_fc<short>(GGML_SPARSE_METAL_FC_ZZ_NT, (short) enc->p->nt);
    }
    const uint32_t grid[3] = { (uint32_t) tg0, (uint32_t) tg1, (uint32_t) tg2 };
    const uint32_t ntg[3]  = { (uint32_t) tptg0, (uint32_t) tptg1, (uint32_t) tptg2 };
    shim::dispatch(enc->p->fn.c_str(), grid, ntg, std::vector<void *>(enc->bufs, enc->bufs + 16),
                   std::vector<size_t>(enc->tgmem, enc->tgmem + 4));
    std::fill(enc->bufs, enc->bufs + 16, nullptr); // a later dispatch must set what it reads
    std::fill(enc->tgmem, enc->tgmem + 4, 0);
}

void ggml_metal_encoder_memory_barrier(ggml_metal_encoder_t) {}

} // extern "C"

// ggml-sparse-cpu-sparq.o is built for the kernel test's thread pool (-Dggml_barrier=zz_test_barrier); only its
// single-threaded reference runs here
extern "C" void zz_test_barrier(struct ggml_threadpool *) { std::abort(); }


// a LIST op over x [n, nt] as the graph builder makes it, in memory laid out as ggml-metal allocates it (dst, then
// ggml_metal_sparse_extra_size bytes of scratch)
struct idx_op {
    std::vector<float>   x;
    std::vector<int32_t> mem;
    ggml_tensor          tx = {}, op = {};
    ggml_backend_buffer  buffer = {};
    ggml_metal_buffer    mbuf = {};
};

static void make_idx_op(idx_op & o, int n, int nt, float thr, ggml_sparse_stats * stats) {
    o.x.resize((size_t) n*nt);
    for (auto & v : o.x) v = rand_normal();
    o.buffer.context = &o.mbuf;
    o.tx = host_tensor(GGML_TYPE_F32, n, nt, 1, 1, o.x.data(), &o.buffer);

    o.op = host_tensor(GGML_TYPE_I32, n + 1, 1, 1, 1, nullptr, &o.buffer);
    o.op.op     = GGML_OP_SPARSE_IDX;
    o.op.src[0] = &o.tx;
    std::memcpy(&o.op.op_params[0], &thr, sizeof(float));
    o.op.op_params[1] = GGML_SPARSE_IDX_LIST;
    if (stats) {
        ggml_sparse_idx_set_stats(&o.op, stats);
    }
    const size_t bytes = ggml_nbytes(&o.op) + ggml_metal_sparse_extra_size(&o.op);
    o.mem.assign((bytes + 3)/4, -1);
    o.op.data = o.mem.data();
}

// runs the op through the glue on lib's device; true if the list and count match a plain loop over x
static bool run_idx_op(idx_op & o, ggml_metal_library * lib, int * kept) {
    ggml_metal_encoder enc;
    CHECK(ggml_metal_sparse_supports_op(&o.op, true, true), "LIST op not supported");
    ggml_metal_sparse_encode(lib, &enc, &o.op);

    const int n = (int) o.tx.ne[0], nt = (int) o.tx.ne[1];
    float thr;
    std::memcpy(&thr, &o.op.op_params[0], sizeof(float));
    std::vector<int32_t> want;
    for (int j = 0; j < n; ++j) {
        bool on = false;
        for (int t = 0; t < nt; ++t) on = on || !(std::fabs(o.x[(size_t) t*n + j]) < thr);
        if (on) want.push_back(j);
    }
    *kept = (int) want.size();
    const int32_t * got = o.mem.data();
    if (got[n] != (int32_t) want.size()) return false;
    std::vector<int32_t> g(got, got + got[n]);
    std::sort(g.begin(), g.end()); // (the atomic variant lands segments in any order)
    return g == want;
}

struct expect { uint64_t lists = 0, cols = 0, kept = 0; };

static bool stats_equal(const ggml_sparse_stats & s, const expect & e) {
    return s.n_lists == e.lists && s.n_cols == e.cols && s.n_active == e.kept;
}

static void test_stats() {
    ggml_metal_device  dev0 = { 0 }, dev1 = { 1 };
    ggml_metal_library lib0 = { &dev0 }, lib1 = { &dev1 };

    // two contexts, decode steps of 1-8 tokens, sizes of one threadgroup and of several segments (n*nt > 32768),
    // both LIST variants, ops run on two devices
    ggml_sparse_stats s[2] = {};
    expect e[2];
    for (int step = 0; step < 40; ++step) {
        const int c  = rand_int(0, 1);
        const int n  = (int[]){ 576, 1536, 4096, 14336, rand_int(1, 40000) }[rand_int(0, 4)];
        const int nt = rand_int(1, 8);
        const bool atomic = rand_int(0, 2) == 0;
        setenv("LLAMA_SPARSE_METAL_IDX", atomic ? "atomic" : "ordered", 1);
        const float thr = (float[]){ 0.0f, 0.3f, 1.0f, 3.0f, 100.0f }[rand_int(0, 4)];
        idx_op o;
        make_idx_op(o, n, nt, thr, &s[c]);
        int kept = 0;
        const bool ok = run_idx_op(o, rand_int(0, 1) ? &lib1 : &lib0, &kept);
        CHECK(ok, "LIST n=%d nt=%d thr=%g %s: list differs", n, nt, thr, atomic ? "atomic" : "ordered");
        e[c].lists += 1; e[c].cols += n; e[c].kept += kept;
        if (rand_int(0, 3) == 0) {
            ggml_sparse_stats_collect(&s[c]);
            CHECK(stats_equal(s[c], e[c]), "context %d after %d steps: stats %llu %llu %llu, want %llu %llu %llu", c, step,
                  (unsigned long long) s[c].n_lists, (unsigned long long) s[c].n_cols, (unsigned long long) s[c].n_active,
                  (unsigned long long) e[c].lists, (unsigned long long) e[c].cols, (unsigned long long) e[c].kept);
        }
    }
    unsetenv("LLAMA_SPARSE_METAL_IDX");
    for (int c = 0; c < 2; ++c) {
        ggml_sparse_stats_collect(&s[c]);
        ggml_sparse_stats_collect(&s[c]); // collecting twice adds nothing
        CHECK(stats_equal(s[c], e[c]), "context %d: stats %llu %llu %llu, want %llu %llu %llu", c,
              (unsigned long long) s[c].n_lists, (unsigned long long) s[c].n_cols, (unsigned long long) s[c].n_active,
              (unsigned long long) e[c].lists, (unsigned long long) e[c].cols, (unsigned long long) e[c].kept);
    }
    CHECK(g_mapped.size() == 2, "counters mapped into %zu devices, want 2", g_mapped.size());

    // reset as llama_sparse_reset_stats does it: collect, then zero the host struct
    ggml_sparse_stats_collect(&s[0]);
    s[0] = {};
    e[0] = {};
    {
        idx_op o;
        make_idx_op(o, 2048, 3, 0.5f, &s[0]);
        int kept = 0;
        run_idx_op(o, &lib0, &kept);
        e[0] = { 1, 2048, (uint64_t) kept };
        ggml_sparse_stats_collect(&s[0]);
        CHECK(stats_equal(s[0], e[0]), "after a reset: stats %llu %llu %llu, want 1 2048 %d",
              (unsigned long long) s[0].n_lists, (unsigned long long) s[0].n_cols, (unsigned long long) s[0].n_active, kept);
    }

    // an op with no stats attached counts nowhere
    {
        const ggml_sparse_stats before = s[1];
        idx_op o;
        make_idx_op(o, 1000, 2, 0.5f, nullptr);
        int kept = 0;
        CHECK(run_idx_op(o, &lib1, &kept), "LIST without stats: list differs");
        ggml_sparse_stats_collect(&s[1]);
        CHECK(std::memcmp(&before, &s[1], sizeof(before)) == 0, "an op without stats changed a context's counters");
    }

    // a released context's slot goes to the next context, which starts at zero
    ggml_sparse_stats_release(&s[0]);
    ggml_sparse_stats s2 = {};
    {
        idx_op o;
        make_idx_op(o, 300, 1, 0.0f, &s2);
        int kept = 0;
        run_idx_op(o, &lib0, &kept);
        ggml_sparse_stats_collect(&s2);
        CHECK(s2.n_lists == 1 && s2.n_cols == 300 && s2.n_active == 300, "a new context after a release: stats %llu %llu %llu, want 1 300 300",
              (unsigned long long) s2.n_lists, (unsigned long long) s2.n_cols, (unsigned long long) s2.n_active);
    }
    ggml_sparse_stats_release(&s[1]);
    ggml_sparse_stats_release(&s2);
}

// a MUL_MAT_ZZ op as the graph builder makes it: zigzag weight w (block (r, j) at r*n + j holds W[r*B .. r*B + B - 1, j]),
// input x of the LIST op o, o's list if sparse
struct zz_op {
    zz_weights         w;
    std::vector<float> mem;
    ggml_tensor        tw = {}, op = {};
};

static void make_zz_op(zz_op & z, ggml_type type, int64_t m, idx_op & o, bool sparse) {
    make_weights(z.w, type, o.tx.ne[0], m);
    z.tw = host_tensor(type, z.w.B*z.w.n, m/z.w.B, 1, 1, z.w.q.data(), &o.buffer);

    z.op = host_tensor(GGML_TYPE_F32, m, o.tx.ne[1], 1, 1, nullptr, &o.buffer);
    z.op.op     = GGML_OP_MUL_MAT_ZZ;
    z.op.src[0] = &z.tw;
    z.op.src[1] = &o.tx;
    z.op.src[2] = sparse ? &o.op : nullptr;
    const size_t bytes = ggml_nbytes(&z.op) + ggml_metal_sparse_extra_size(&z.op);
    z.mem.assign((bytes + 3)/4, NAN);
    z.op.data = z.mem.data();
}

// y through the glue against an fp64 product over the listed columns (all, when dense): max relative error
static double run_zz_op(zz_op & z, ggml_metal_library * lib, const idx_op & o, bool * all_written) {
    ggml_metal_encoder enc;
    CHECK(ggml_metal_sparse_supports_op(&z.op, true, true), "MUL_MAT_ZZ op not supported");
    // weights in another backend's layout (the CPU's column-major, CUDA's G8) are refused
    for (const int32_t layout : { GGML_SPARSE_ZZ_LAYOUT_COLS, GGML_SPARSE_ZZ_LAYOUT_G256 }) {
        ggml_sparse_zz_set_layout(&z.tw, layout);
        CHECK(!ggml_metal_sparse_supports_op(&z.op, true, true), "MUL_MAT_ZZ op on a weight in layout %d supported", layout);
    }
    ggml_sparse_zz_set_layout(&z.tw, GGML_SPARSE_ZZ_LAYOUT_ROWS);
    ggml_metal_sparse_encode(lib, &enc, &z.op);
    const int64_t nt = o.tx.ne[1];
    std::vector<int32_t> cols;
    if (z.op.src[2] != nullptr) {
        cols.assign(o.mem.begin(), o.mem.begin() + o.mem[z.w.n]);
    } else {
        for (int32_t j = 0; j < (int32_t) z.w.n; ++j) cols.push_back(j);
    }
    double err = 0.0, scale = 0.0;
    std::vector<double> ref((size_t) nt*z.w.m, 0.0);
    for (int64_t t = 0; t < nt; ++t) {
        for (int64_t row = 0; row < z.w.m; ++row) {
            const int64_t r = row/z.w.B, i = row % z.w.B;
            double acc = 0.0;
            for (int32_t j : cols) acc += (double) z.w.deq[(r*z.w.n + j)*z.w.B + i]*o.x[t*z.w.n + j];
            ref[t*z.w.m + row] = acc;
            scale = std::max(scale, std::fabs(acc));
        }
    }
    *all_written = true;
    for (size_t k = 0; k < ref.size(); ++k) {
        *all_written = *all_written && !std::isnan(z.mem[k]);
        err = std::max(err, std::fabs(z.mem[k] - ref[k]));
    }
    return err/std::max(scale, 1e-30);
}

// decode steps through the glue: the LIST op, then the GEMV over its list (or dense), at random launch shapes
static void test_gemv() {
    ggml_metal_device  dev = { 0 };
    ggml_metal_library lib = { &dev };
    ggml_sparse_stats  st  = {};
    for (ggml_type type : { GGML_TYPE_Q4_K, GGML_TYPE_Q8_0, GGML_TYPE_Q4_0, GGML_TYPE_Q6_K }) {
        for (int c = 0; c < 6; ++c) {
            const int64_t B  = ggml_blck_size(type);
            const int64_t m  = B*rand_int(1, 3)*(B == 32 ? 6 : 1);
            const int     n  = (int[]){ 576, 1536, rand_int(1, 2000) }[rand_int(0, 2)];
            const int     nt = rand_int(1, 8);
            const bool sparse = c % 2 == 1;
            if (rand_int(0, 1)) {
                setenv("LLAMA_SPARSE_METAL_N1",  std::to_string(rand_int(1, 5)).c_str(), 1);
                setenv("LLAMA_SPARSE_METAL_NSG", std::to_string((int[]){ 1, 2, 4 }[rand_int(0, 2)]).c_str(), 1);
            }
            idx_op o;
            make_idx_op(o, n, nt, (float[]){ 0.0f, 0.5f, 1.5f, 100.0f }[rand_int(0, 3)], &st);
            int kept = 0;
            CHECK(run_idx_op(o, &lib, &kept), "LIST before the GEMV: list differs");
            zz_op z;
            make_zz_op(z, type, m, o, sparse);
            bool written = false;
            const double err = run_zz_op(z, &lib, o, &written);
            CHECK(written && err < 2e-5, "GEMV %s m=%lld n=%d nt=%d %s (%d kept) N1=%s NSG=%s: %s, relative error %.3g",
                  ggml_type_name(type), (long long) m, n, nt, sparse ? "sparse" : "dense", kept,
                  getenv("LLAMA_SPARSE_METAL_N1") ? getenv("LLAMA_SPARSE_METAL_N1") : "-",
                  getenv("LLAMA_SPARSE_METAL_NSG") ? getenv("LLAMA_SPARSE_METAL_NSG") : "-",
                  written ? "all written" : "outputs left unwritten", err);
            unsetenv("LLAMA_SPARSE_METAL_N1");
            unsetenv("LLAMA_SPARSE_METAL_NSG");
        }
    }
    ggml_sparse_stats_release(&st);
}

//
// SparQ decode attention through the glue against the CPU op's scalar reference
//

static void test_sparq() {
    ggml_metal_device   dev = { 0 };
    ggml_metal_library  lib = { &dev };
    ggml_metal_buffer   mbuf = {};
    ggml_backend_buffer buf  = {};
    buf.context = &mbuf;
    for (int i = 0; i < 10; ++i) {
        const ggml_type kv = rand_int(0, 1) ? GGML_TYPE_F16 : GGML_TYPE_F32;
        const ggml_type mt = rand_int(0, 1) ? GGML_TYPE_F16 : GGML_TYPE_F32;
        const int D = (int[]){ 64, 128 }[rand_int(0, 1)], n_kv = rand_int(1, 600), n_tok = rand_int(1, 2);
        const int Hkv = rand_int(1, 2), G = (int[]){ 1, 3, 4 }[rand_int(0, 2)], ns = rand_int(1, 2), H = Hkv*G;
        const int r = rand_int(1, D/2), k_top = rand_int(0, 4) == 0 ? n_kv + 2 : rand_int(1, std::max(1, n_kv/3));
        const int flags = rand_int(0, 1) ? GGML_SPARQ_MEAN_V : 0;
        const size_t es = ggml_type_size(kv);

        std::vector<float>   qd((size_t) D*n_tok*H*ns), vmd((size_t) D*Hkv);
        std::vector<uint8_t> kd((size_t) D*n_kv*Hkv*ns*es), ktd(kd.size()), vd(kd.size()), md((size_t) n_kv*n_tok*ns*ggml_type_size(mt));
        for (auto & x : qd)  x = rand_normal();
        for (auto & x : vmd) x = rand_normal()*0.1f;
        for (int s2 = 0; s2 < ns; ++s2) for (int h = 0; h < Hkv; ++h) for (int j = 0; j < n_kv; ++j) for (int d = 0; d < D; ++d) {
            const float x = rand_normal();
            sparq_fill(kv, kd.data(),  (((size_t) s2*Hkv + h)*n_kv + j)*D + d, x);
            sparq_fill(kv, ktd.data(), (((size_t) s2*Hkv + h)*D + d)*n_kv + j, x);
            sparq_fill(kv, vd.data(),  (((size_t) s2*Hkv + h)*n_kv + j)*D + d, rand_normal());
        }
        for (int s2 = 0; s2 < ns; ++s2) for (int t = 0; t < n_tok; ++t) {
            const int len = rand_int(1, n_kv);
            for (int j = 0; j < n_kv; ++j) sparq_fill(mt, md.data(), ((size_t) s2*n_tok + t)*n_kv + j, j < len ? 0.0f : -INFINITY);
        }
        ggml_tensor q  = host_tensor(GGML_TYPE_F32, D, n_tok, H, ns, qd.data(), &buf);
        ggml_tensor k  = host_tensor(kv, D, n_kv, Hkv, ns, kd.data(), &buf);
        ggml_tensor kt = host_tensor(kv, n_kv, D, Hkv, ns, ktd.data(), &buf);
        ggml_tensor v  = host_tensor(kv, D, n_kv, Hkv, ns, vd.data(), &buf);
        ggml_tensor m  = host_tensor(mt, n_kv, n_tok, 1, ns, md.data(), &buf);
        ggml_tensor vm = host_tensor(GGML_TYPE_F32, D, Hkv, 1, 1, vmd.data(), &buf);

        std::vector<float> ref((size_t) D*H*n_tok*ns);
        ggml_tensor op = host_tensor(GGML_TYPE_F32, D, H, n_tok, ns, ref.data(), &buf);
        op.op = GGML_OP_SPARQ_ATTN;
        const float scale = 1.0f/std::sqrt((float) D);
        std::memcpy(&op.op_params[0], &scale, sizeof(float));
        op.op_params[1] = r; op.op_params[2] = k_top; op.op_params[3] = flags;
        ggml_tensor * srcs[6] = { &q, &k, &kt, &v, &m, &vm };
        for (int j = 0; j < 6; ++j) op.src[j] = srcs[j];
        ggml_sparse_cpu_sparq_ref(&op);

        std::vector<float> mem((ggml_nbytes(&op) + ggml_metal_sparse_extra_size(&op) + 3)/4, NAN);
        op.data = mem.data();
        CHECK(ggml_metal_sparse_supports_op(&op, true, true), "SPARQ op not supported");
        ggml_metal_encoder enc;
        ggml_metal_sparse_encode(&lib, &enc, &op);
        bool finite;
        const double rel = rel_l2_err(mem.data(), ref.data(), ref.size(), &finite);
        CHECK(finite && rel <= 1e-4, "SPARQ kv=%s mask=%s D=%d n_kv=%d n_tok=%d Hkv=%d G=%d ns=%d r=%d k=%d flags=%d: rel err %.3e%s",
              ggml_type_name(kv), ggml_type_name(mt), D, n_kv, n_tok, Hkv, G, ns, r, k_top, flags, rel, finite ? "" : " (not written)");
    }
}

// ggml_sparse_zz_relayout asks the registered backends in turn until one takes the weight; a backend registered twice
// is asked once
static int relayout_calls[2];
static bool relayout_no(ggml_tensor *)  { relayout_calls[0]++; return false; }
static bool relayout_yes(ggml_tensor * w) {
    relayout_calls[1]++;
    ggml_sparse_zz_set_layout(w, GGML_SPARSE_ZZ_LAYOUT_G256);
    return true;
}

static void test_relayout() {
    ggml_tensor w = {};
    CHECK(!ggml_sparse_zz_relayout(&w), "relayout with no backend registered took the weight");
    ggml_sparse_zz_add_relayout(relayout_no);
    ggml_sparse_zz_add_relayout(relayout_no);
    CHECK(!ggml_sparse_zz_relayout(&w) && relayout_calls[0] == 1, "a declining backend: taken, or asked %d times",
          relayout_calls[0]);
    ggml_sparse_zz_add_relayout(relayout_yes);
    CHECK(ggml_sparse_zz_relayout(&w) && relayout_calls[0] == 2 && relayout_calls[1] == 1 &&
          ggml_sparse_zz_layout(&w) == GGML_SPARSE_ZZ_LAYOUT_G256, "the second backend did not take the weight");
}

int main(int argc, char ** argv) {
    for (int i = 1; i < argc; ++i) {
        if (!std::strcmp(argv[i], "--seed") && i + 1 < argc) rng.seed(std::strtoull(argv[++i], nullptr, 10));
    }
    test_stats();
    std::printf("glue, sparse stats: %d passed, %d failed\n", n_pass, n_fail);
    test_relayout();
    std::printf("glue, relayout registry: %d passed, %d failed\n", n_pass, n_fail);
    test_gemv();
    std::printf("glue, GEMV: %d passed, %d failed\n", n_pass, n_fail);
    test_sparq();
    std::printf("glue, SparQ: %d passed, %d failed\n", n_pass, n_fail);
    std::printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail == 0 ? 0 : 1;
}
