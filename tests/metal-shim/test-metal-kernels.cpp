// llama-sparse: the Metal kernels of metal/*.metal run through the MSL-on-CPU shim and compared with the
// CPU ops (ggml-sparse-cpu.c) and with an fp64 product on ggml's to_float of the zigzag blocks, like the
// CUDA test: random shapes (m = 192/576/1536 with 32-blocks, random n), sparsity 0/1/50/99/100 %, batch 1-8,
// outputs poisoned before every run. Race check: cases are re-run with random lane and threadgroup order
// and random preemption at atomics, and must give the same bits (the atomic LIST variant: the same set).
// Self-tests show the shim itself catches a missing barrier and a barrier that not every thread reaches.
//
//   test-metal-kernels [--quick] [--seed S]      last line "N passed, N failed"; exit status 1 on failure
#include "shim-runtime.h"
#include "shim-test.h"
#include "ggml-sparse-metal.h"
#include "ggml-sparse.h"
#include "ggml-sparse-cpu-sparq.h"
#include "ggml.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

extern "C" {
void zzref_idx(const float * x, int64_t n, int nt, size_t nb1, float thr, int mode, void * dst);
void zzref_mul_mat(enum ggml_type type, const void * w, int64_t n, int64_t m, const float * x, int nt,
                   const int32_t * idx, float * y);
}

static void launch(const char * name, uint32_t gx, uint32_t gy, uint32_t tx, std::vector<void *> bufs, std::vector<size_t> tgmem = {}) {
    const uint32_t grid[3] = { gx, gy, 1 };
    const uint32_t ntg[3]  = { tx, 1, 1 };
    shim::dispatch(name, grid, ntg, bufs, tgmem);
}

template <class T> static void poison(std::vector<T> & v) { std::memset(v.data(), 0xFF, v.size()*sizeof(T)); }

// threshold leaving about a fraction 1 - sparsity of the columns active (union over tokens)
static float threshold_for(const std::vector<float> & x, int64_t n, int nt, int64_t ldx, double sparsity) {
    if (sparsity <= 0.0) return 0.0f;
    std::vector<float> colmax(n, 0.0f);
    for (int t = 0; t < nt; ++t) for (int64_t j = 0; j < n; ++j) colmax[j] = std::max(colmax[j], std::fabs(x[t*ldx + j]));
    std::sort(colmax.begin(), colmax.end());
    if (sparsity >= 1.0) return colmax[n - 1]*2.0f + 1.0f;
    const int64_t k = std::min<int64_t>(n - 1, (int64_t) (sparsity*n));
    return colmax[k] > 0.0f ? colmax[k] : 1e-30f;
}

//
// GGML_OP_SPARSE_IDX
//

enum idx_variant { IDX_DEFAULT, IDX_SEGMENTS, IDX_ATOMIC };

// what ggml_metal_sparse_encode does for LIST (variant IDX_DEFAULT / atomic), or forced small segments; stats:
// the bound slot of counters (GGML_SPARSE_METAL_STATS_WORDS words), counted into when count_stats
static void gpu_idx_list(const std::vector<float> & x, int n, int nt, int64_t ldx, float thr, idx_variant var,
                         int ntg_force, std::vector<int32_t> & dst, uint32_t * stats = nullptr, bool count_stats = false) {
    int ntg, seg, nseg;
    ggml_sparse_metal_idx_shape(n, nt, 1024, &ntg, &seg, &nseg);
    if (ntg_force) ntg = ntg_force;
    if (var == IDX_SEGMENTS) { seg = ntg*rand_int(1, 3) + rand_int(0, 1)*rand_int(1, 31); nseg = (n + seg - 1)/seg; }
    if (var == IDX_ATOMIC)   { seg = std::min(seg, GGML_SPARSE_METAL_IDX_SEG); nseg = (n + seg - 1)/seg; }
    ggml_sparse_metal_kargs_idx args = { n, nt, (uint64_t) (ldx*sizeof(float)), thr, seg, nseg, count_stats };
    dst.assign(n + 1, 0); poison(dst);
    std::vector<int32_t> counts(nseg); poison(counts);
    void * st = stats != nullptr ? (void *) stats : (void *) dst.data(); // the glue binds dst when not counting
    if (var == IDX_ATOMIC) {
        launch("kernel_sparse_idx_clear", 1, 1, 32, { &args, dst.data() });
        launch("kernel_sparse_idx_list_atomic", nseg, 1, ntg, { &args, (void *) x.data(), dst.data(), st }, { seg*sizeof(int32_t) });
        return;
    }
    if (nseg > 1) {
        launch("kernel_sparse_idx_count", nseg, 1, ntg, { &args, (void *) x.data(), counts.data() });
    }
    launch("kernel_sparse_idx_list", nseg, 1, ntg, { &args, (void *) x.data(), dst.data(), nseg > 1 ? counts.data() : dst.data(), st });
}

static uint64_t stats_word(const uint32_t * w) {
    return (uint64_t) w[0] | (uint64_t) w[1] << 32;
}

static void test_idx_case(int n, int nt, double sparsity, idx_variant var, bool with_nan) {
    const int64_t ldx = n + rand_int(0, 3);
    std::vector<float> x(ldx*nt);
    for (auto & v : x) v = rand_normal();
    if (with_nan) x[rand_int(0, nt - 1)*ldx + rand_int(0, n - 1)] = NAN;
    const float thr = threshold_for(x, n, nt, ldx, sparsity);

    std::vector<int32_t> ref(n + 1);
    zzref_idx(x.data(), n, nt, ldx*sizeof(float), thr, GGML_SPARSE_IDX_LIST, ref.data());
    const int count = ref[n];

    // counters of llama_sparse_get_stats, low words often just below a carry; with counting off, left alone
    const bool count_stats = rand_int(0, 3) != 0;
    uint32_t stats[GGML_SPARSE_METAL_STATS_WORDS], stats0[GGML_SPARSE_METAL_STATS_WORDS];
    for (int i = 0; i < GGML_SPARSE_METAL_STATS_WORDS; ++i) {
        stats[i] = i % 2 == 0 && rand_int(0, 1) ? 0xffffffffu - (uint32_t) rand_int(0, n) : (uint32_t) rand_int(0, 5);
    }
    std::memcpy(stats0, stats, sizeof(stats));

    const int ntg_force = rand_int(0, 2) == 0 ? 32*rand_int(1, 32) : 0;
    std::vector<int32_t> got;
    gpu_idx_list(x, n, nt, ldx, thr, var, ntg_force, got, stats, count_stats);

    char what[160];
    std::snprintf(what, sizeof(what), "LIST n=%d nt=%d sparsity=%.2f variant=%d ntg=%d count=%d", n, nt, sparsity, (int) var, ntg_force, count);
    if (count_stats) {
        const uint64_t sets = stats_word(stats + 0) - stats_word(stats0 + 0);
        const uint64_t cols = stats_word(stats + 2) - stats_word(stats0 + 2);
        const uint64_t kept = stats_word(stats + 4) - stats_word(stats0 + 4);
        CHECK(sets == 1 && cols == (uint64_t) n && kept == (uint64_t) count && stats[6] == stats0[6] && stats[7] == stats0[7],
              "%s: counters (sets, columns, kept) grew by %llu, %llu, %llu", what,
              (unsigned long long) sets, (unsigned long long) cols, (unsigned long long) kept);
    } else {
        CHECK(std::memcmp(stats, stats0, sizeof(stats)) == 0, "%s: counters changed with counting off", what);
    }
    CHECK(got[n] == count, "%s: count %d", what, got[n]);
    if (got[n] != count) return;
    std::vector<int32_t> g(got.begin(), got.begin() + count);
    if (var == IDX_ATOMIC) std::sort(g.begin(), g.end()); // segments land in any order
    CHECK(std::equal(g.begin(), g.end(), ref.begin()), "%s: list differs from the CPU op", what);
    bool untouched = true;
    for (int k = count; k < n; ++k) untouched = untouched && got[k] == -1;
    CHECK(untouched, "%s: wrote past the count", what);
}

static void test_mask_case(int n, int nt, double sparsity) {
    std::vector<float> x(n*nt);
    for (auto & v : x) v = rand_normal();
    const float thr = threshold_for(x, n, nt, n, sparsity);
    std::vector<float> ref(n*nt), got(n*nt);
    zzref_idx(x.data(), n, nt, n*sizeof(float), thr, GGML_SPARSE_IDX_MASK, ref.data());
    poison(got);
    ggml_sparse_metal_kargs_mask args = { n, 0, (uint64_t) (n*sizeof(float)), (uint64_t) (n*sizeof(float)), thr, 0 };
    launch("kernel_sparse_idx_mask", (n + 255)/256, nt, 256, { &args, x.data(), got.data() });
    CHECK(std::memcmp(got.data(), ref.data(), got.size()*sizeof(float)) == 0, "MASK n=%d nt=%d sparsity=%.2f differs from the CPU op", n, nt, sparsity);
}

//
// GGML_OP_MUL_MAT_ZZ
//

static const char * type_tag(ggml_type t) {
    switch (t) {
        case GGML_TYPE_Q4_K: return "q4_K";
        case GGML_TYPE_Q6_K: return "q6_K";
        case GGML_TYPE_Q8_0: return "q8_0";
        case GGML_TYPE_Q4_0: return "q4_0";
        default: return "?";
    }
}

// what ggml_metal_sparse_encode does for the GEMV: the kernel over (n1, block-rows), then the reduction if n1 > 1
static void gpu_zz_gemv(const zz_weights & w, const std::vector<float> & x, int nt, int64_t ldx, const int32_t * idx,
                        std::vector<float> & y, int64_t ldy, int n1, int nsg) {
    const int64_t nr = w.m/w.B;
    std::vector<float> part(n1 > 1 ? (size_t) n1*nt*w.m : 1);
    poison(part);
    shim::set_fc<short>(GGML_SPARSE_METAL_FC_ZZ_NT, (short) nt);
    ggml_sparse_metal_kargs_zz args = {
        (int32_t) w.n, (int32_t) nr, (uint64_t) (w.n*ggml_type_size(w.type)), (uint64_t) (ldx*sizeof(float)),
        (uint64_t) (n1 > 1 ? w.m*sizeof(float) : ldy*sizeof(float)), (uint64_t) (n1 > 1 ? nt*w.m*sizeof(float) : 0),
        idx != nullptr, 0 };
    const std::string name = std::string("kernel_mul_mv_zz_") + type_tag(w.type) + "_f32";
    void * out = n1 > 1 ? (void *) part.data() : (void *) y.data();
    launch(name.c_str(), n1, nr, 32*nsg, { &args, (void *) w.q.data(), (void *) x.data(), idx ? (void *) idx : (void *) w.q.data(), out },
           { (size_t) nsg*nt*w.B*sizeof(float) });
    if (n1 > 1) {
        ggml_sparse_metal_kargs_zz_reduce ra = { (int32_t) w.m, nt, n1, 0, (uint64_t) (ldy*sizeof(float)),
            (uint64_t) (nt*w.m*sizeof(float)), (uint64_t) (w.m*sizeof(float)) };
        launch("kernel_mul_mv_zz_reduce", (w.m + 255)/256, nt, 256, { &ra, part.data(), y.data() });
    }
}

static double rel_err(const std::vector<float> & y, int64_t ldy, const std::vector<double> & ref, int64_t m, int nt, bool * all_written) {
    double num = 0.0, den = 0.0;
    *all_written = true;
    for (int t = 0; t < nt; ++t) {
        for (int64_t i = 0; i < m; ++i) {
            const float v = y[t*ldy + i];
            if (!std::isfinite(v)) { *all_written = false; return INFINITY; }
            num += (v - ref[t*m + i])*(v - ref[t*m + i]);
            den += ref[t*m + i]*ref[t*m + i];
        }
    }
    if (den == 0.0) return num == 0.0 ? 0.0 : INFINITY;
    return std::sqrt(num/den);
}

static bool padding_untouched(const std::vector<float> & y, int64_t ldy, int64_t m, int nt) {
    for (int t = 0; t < nt; ++t) for (int64_t i = m; i < ldy; ++i) if (!std::isnan(y[t*ldy + i])) return false;
    return true;
}

static void test_gemv_case(ggml_type type, int64_t m, int64_t n, int nt, double sparsity, bool sparse, int n1, int nsg) {
    zz_weights w;
    make_weights(w, type, n, m);
    const int64_t ldx = n + rand_int(0, 2);
    std::vector<float> x(ldx*nt);
    for (auto & v : x) v = rand_normal();
    const float thr = threshold_for(x, n, nt, ldx, sparsity);

    std::vector<int32_t> idx(n + 1);
    zzref_idx(x.data(), n, nt, ldx*sizeof(float), thr, GGML_SPARSE_IDX_LIST, idx.data());
    const int count = idx[n];

    // fp64 reference over the listed columns (all of them when dense)
    std::vector<double> ref(nt*m, 0.0);
    for (int k = 0; k < (sparse ? count : n); ++k) {
        const int j = sparse ? idx[k] : k;
        for (int64_t r = 0; r < m/w.B; ++r) {
            const float * blk = w.deq.data() + (r*n + j)*w.B;
            for (int t = 0; t < nt; ++t) for (int64_t i = 0; i < w.B; ++i) ref[t*m + r*w.B + i] += (double) x[t*ldx + j]*blk[i];
        }
    }
    // the CPU op (scalar reference kernel) on a compact copy of x
    std::vector<float> xc(n*nt), ycpu(m*nt);
    for (int t = 0; t < nt; ++t) std::memcpy(&xc[t*n], &x[t*ldx], n*sizeof(float));
    zzref_mul_mat(type, w.q.data(), n, m, xc.data(), nt, sparse ? idx.data() : nullptr, ycpu.data());
    std::vector<double> cpu(ycpu.begin(), ycpu.end());

    const int64_t ldy = m + rand_int(0, 3);
    std::vector<float> y(ldy*nt);
    poison(y);
    gpu_zz_gemv(w, x, nt, ldx, sparse ? idx.data() : nullptr, y, ldy, n1, nsg);

    char what[200];
    std::snprintf(what, sizeof(what), "GEMV %s m=%lld n=%lld nt=%d %s sparsity=%.2f (active %d) n1=%d nsg=%d", type_tag(type),
                  (long long) m, (long long) n, nt, sparse ? "idx" : "dense", sparsity, count, n1, nsg);
    bool written;
    const double e_ref = rel_err(y, ldy, ref, m, nt, &written);
    CHECK(written, "%s: output not written (poison left)", what);
    const double e_cpu = rel_err(y, ldy, cpu, m, nt, &written);
    CHECK(e_ref <= 1e-5, "%s: relative error vs fp64 %.3e", what, e_ref);
    CHECK(e_cpu <= 1e-5, "%s: relative error vs CPU op %.3e", what, e_cpu);
    CHECK(padding_untouched(y, ldy, m, nt), "%s: wrote into the row padding", what);
}

// prefill: the dequantized f16 tile equals to_float rounded to f16, at the right place
static void test_dequant_case(ggml_type type, int64_t m, int64_t n) {
    zz_weights w;
    make_weights(w, type, n, m);
    const int64_t nr = m/w.B;
    const int r0 = rand_int(0, (int) nr - 1);
    const int nrows = rand_int(1, (int) nr - r0);
    std::vector<ggml_fp16_t> tile(nrows*w.B*n + 7);
    poison(tile);
    ggml_sparse_metal_kargs_zz_dequant args = { (int32_t) n, r0, nrows, 0, (uint64_t) (n*ggml_type_size(type)) };
    const int lpc = ggml_sparse_metal_zz_lanes_per_col(type);
    const std::string name = std::string("kernel_zz_dequant_") + type_tag(type) + "_f16";
    launch(name.c_str(), (n*lpc + 255)/256, nrows, 256, { &args, (void *) w.q.data(), tile.data() });
    int64_t bad = 0;
    for (int rr = 0; rr < nrows; ++rr) {
        for (int64_t i = 0; i < w.B; ++i) {
            for (int64_t j = 0; j < n; ++j) {
                const ggml_fp16_t want = ggml_fp32_to_fp16(w.deq[((r0 + rr)*n + j)*w.B + i]);
                bad += tile[(rr*w.B + i)*n + j] != want;
            }
        }
    }
    bool tail = true;
    for (size_t k = nrows*w.B*n; k < tile.size(); ++k) tail = tail && tile[k] == 0xFFFF;
    CHECK(bad == 0 && tail, "DEQUANT %s m=%lld n=%lld rows %d+%d: %lld values differ from to_float in f16%s", type_tag(type),
          (long long) m, (long long) n, r0, nrows, (long long) bad, tail ? "" : ", wrote past the tile");
}

// prefill as ggml_metal_sparse_encode runs it: per tile of block-rows kernel_zz_dequant_*_f16, ggml's mul_mm (here a
// CPU stand-in with fp32 sums over the f16 tile) into a contiguous buffer, kernel_mul_mv_zz_reduce (n1 = 1) into dst
static void test_prefill_case(ggml_type type, int64_t m, int64_t n, int nt) {
    zz_weights w;
    make_weights(w, type, n, m);
    const int64_t nr = m/w.B;
    std::vector<float> x(n*nt);
    for (auto & v : x) v = rand_normal();
    const int64_t ldy = m + rand_int(0, 3);
    std::vector<float> y(ldy*nt);
    poison(y);

    const int64_t tile_rows = rand_int(1, (int) nr); // the encoder's tile is up to 32 MiB; any split must work
    std::vector<ggml_fp16_t> tile(tile_rows*w.B*n);
    std::vector<float> ytmp(tile_rows*w.B*nt);
    const int lpc = ggml_sparse_metal_zz_lanes_per_col(type);
    const std::string name = std::string("kernel_zz_dequant_") + type_tag(type) + "_f16";
    for (int64_t r0 = 0; r0 < nr; r0 += tile_rows) {
        const int64_t rows = std::min(tile_rows, nr - r0), mt = rows*w.B;
        poison(tile); poison(ytmp);
        ggml_sparse_metal_kargs_zz_dequant da = { (int32_t) n, (int32_t) r0, (int32_t) rows, 0, (uint64_t) (n*ggml_type_size(type)) };
        launch(name.c_str(), (n*lpc + 255)/256, rows, 256, { &da, (void *) w.q.data(), tile.data() });
        for (int t = 0; t < nt; ++t) {
            for (int64_t i = 0; i < mt; ++i) {
                float acc = 0.0f;
                for (int64_t j = 0; j < n; ++j) acc += ggml_fp16_to_fp32(tile[i*n + j])*x[t*n + j];
                ytmp[t*mt + i] = acc;
            }
        }
        ggml_sparse_metal_kargs_zz_reduce ra = { (int32_t) mt, nt, 1, 0, (uint64_t) (ldy*sizeof(float)), 0, (uint64_t) (mt*sizeof(float)) };
        launch("kernel_mul_mv_zz_reduce", (mt + 255)/256, nt, 256, { &ra, ytmp.data(), y.data() + r0*w.B });
    }
    std::vector<double> ref(nt*m, 0.0);
    for (int64_t j = 0; j < n; ++j)
        for (int64_t r = 0; r < nr; ++r)
            for (int t = 0; t < nt; ++t)
                for (int64_t i = 0; i < w.B; ++i) ref[t*m + r*w.B + i] += (double) x[t*n + j]*w.deq[(r*n + j)*w.B + i];
    bool written;
    const double e = rel_err(y, ldy, ref, m, nt, &written);
    CHECK(written && e <= 2e-3 && padding_untouched(y, ldy, m, nt), "PREFILL %s m=%lld n=%lld nt=%d tile=%lld: rel err %.3e%s",
          type_tag(type), (long long) m, (long long) n, nt, (long long) tile_rows, e, written ? "" : " (not written)");
}

//
// GGML_OP_SPARQ_ATTN against the CPU op's scalar reference (ggml_sparse_cpu_sparq_ref)
//

struct sparq_case {
    ggml_type kv, m;
    int D, Dv, n_kv, n_tok, Hkv, G, ns, r, k_top, flags, ntg;
    bool kt_q8 = false; // k_t as Q8_0 (kv F16, n_kv % 32 == 0)
};

// runs the Metal kernel as ggml_metal_sparse_encode does; returns dst
static std::vector<float> gpu_sparq(const sparq_case & c, ggml_tensor * srcs[6]) {
    const int H = c.Hkv*c.G;
    std::vector<float> dst((size_t) c.Dv*H*c.n_tok*c.ns);
    poison(dst);
    const size_t unit = ggml_sparse_metal_sparq_scratch_unit(c.G, c.n_kv);
    std::vector<uint8_t> scratch(unit*c.Hkv*c.n_tok*c.ns);
    poison(scratch);
    ggml_tensor * q = srcs[0], * k = srcs[1], * kt = srcs[2], * v = srcs[3], * m = srcs[4], * vm = srcs[5];
    ggml_sparse_metal_kargs_sparq a = {
        c.D, c.Dv, c.n_kv, c.n_tok, H, c.Hkv, c.G, c.ns, std::min(c.r, c.D), c.k_top, (c.flags & GGML_SPARQ_MEAN_V) != 0,
        (int32_t) m->ne[3], (int32_t) vm->ne[2], (int32_t) vm->ne[3], 1.0f/std::sqrt((float) c.D), kt->type == GGML_TYPE_Q8_0,
        q->nb[1], q->nb[2], q->nb[3], k->nb[1], k->nb[2], k->nb[3], kt->nb[1], kt->nb[2], kt->nb[3],
        v->nb[0], v->nb[1], v->nb[2], v->nb[3], m->nb[1], m->nb[3], vm->nb[1], vm->nb[2], vm->nb[3], unit };
    char name[64];
    std::snprintf(name, sizeof(name), "kernel_sparq_attn_%s_%s", ggml_type_name(c.kv), ggml_type_name(c.m));
    const uint32_t grid[3] = { (uint32_t) c.Hkv, (uint32_t) c.n_tok, (uint32_t) c.ns };
    const uint32_t ntg[3]  = { (uint32_t) c.ntg, 1, 1 };
    shim::dispatch(name, grid, ntg, { &a, q->data, k->data, kt->data, v->data, m->data, vm->data, dst.data(), scratch.data() },
                   { ggml_sparse_metal_sparq_smem(c.G, c.D) });
    return dst;
}

// small integers for q and K: many exactly equal component keys and scores, to exercise the tie rules
static bool g_sparq_ties = false;
static float sparq_rand() { return g_sparq_ties ? (float) rand_int(-2, 2) : rand_normal(); }

static bool test_sparq_case(const sparq_case & c, bool race = false) {
    const int H = c.Hkv*c.G, n_pad = c.n_tok + rand_int(0, 2);
    const size_t es = ggml_type_size(c.kv), ms = ggml_type_size(c.m);
    std::vector<float>   qd((size_t) c.D*c.n_tok*H*c.ns);
    std::vector<uint8_t> kd((size_t) c.D*c.n_kv*c.Hkv*c.ns*es), ktd(kd.size()), vd((size_t) c.Dv*c.n_kv*c.Hkv*c.ns*es);
    std::vector<uint8_t> md((size_t) c.n_kv*n_pad*c.ns*ms);
    std::vector<float>   vmd((size_t) c.Dv*c.Hkv);
    for (auto & x : qd) x = sparq_rand();
    for (int s = 0; s < c.ns; ++s) for (int kh = 0; kh < c.Hkv; ++kh) for (int j = 0; j < c.n_kv; ++j) for (int d = 0; d < c.D; ++d) {
        const float x = sparq_rand();
        sparq_fill(c.kv, kd.data(),  (((int64_t) s*c.Hkv + kh)*c.n_kv + j)*c.D + d, x);
        sparq_fill(c.kv, ktd.data(), (((int64_t) s*c.Hkv + kh)*c.D + d)*c.n_kv + j, x);
    }
    for (size_t i = 0; i < vd.size()/es; ++i) sparq_fill(c.kv, vd.data(), i, rand_normal());
    for (auto & x : vmd) x = rand_normal()*0.1f;
    // causal-like visibility with holes; some tokens see nothing, some fewer than k (dense)
    for (int s = 0; s < c.ns; ++s) for (int t = 0; t < n_pad; ++t) {
        const int len = rand_int(0, 9) == 0 ? rand_int(0, std::min(c.n_kv, c.k_top)) : rand_int(1, c.n_kv);
        for (int j = 0; j < c.n_kv; ++j) {
            const bool vis = j < len && rand_int(0, 15) != 0;
            sparq_fill(c.m, md.data(), ((int64_t) s*n_pad + t)*c.n_kv + j, vis ? 0.0f : -INFINITY);
        }
    }
    ggml_tensor q  = host_tensor(GGML_TYPE_F32, c.D, c.n_tok, H, c.ns, qd.data());
    ggml_tensor k  = host_tensor(c.kv, c.D, c.n_kv, c.Hkv, c.ns, kd.data());
    ggml_tensor kt = host_tensor(c.kv, c.n_kv, c.D, c.Hkv, c.ns, ktd.data());
    std::vector<uint8_t> ktq;
    if (c.kt_q8) {
        // the 8-bit copy: the same values quantized in blocks of 32 positions (step 1 reads these, step 2 K)
        std::vector<float> rows((size_t) c.n_kv*c.D*c.Hkv*c.ns);
        for (size_t i = 0; i < rows.size(); ++i) rows[i] = ggml_fp16_to_fp32(((const ggml_fp16_t *) ktd.data())[i]);
        ktq.resize(ggml_row_size(GGML_TYPE_Q8_0, c.n_kv)*c.D*c.Hkv*c.ns);
        ggml_quantize_chunk(GGML_TYPE_Q8_0, rows.data(), ktq.data(), 0, (int64_t) c.D*c.Hkv*c.ns, c.n_kv, nullptr);
        kt = host_tensor(GGML_TYPE_Q8_0, c.n_kv, c.D, c.Hkv, c.ns, ktq.data());
    }
    ggml_tensor v  = host_tensor(c.kv, c.Dv, c.n_kv, c.Hkv, c.ns, vd.data());
    if (rand_int(0, 2) == 0) {
        // upstream's transposed V cache: position-contiguous per component
        v.nb[0] = es*c.n_kv;
        v.nb[1] = es;
    }
    ggml_tensor m  = host_tensor(c.m, c.n_kv, n_pad, 1, c.ns, md.data());
    ggml_tensor vm = host_tensor(GGML_TYPE_F32, c.Dv, c.Hkv, 1, 1, vmd.data());
    std::vector<float> ref((size_t) c.Dv*H*c.n_tok*c.ns);
    ggml_tensor d = host_tensor(GGML_TYPE_F32, c.Dv, H, c.n_tok, c.ns, ref.data());
    const float scale = 1.0f/std::sqrt((float) c.D);
    d.op_params[1] = c.r; d.op_params[2] = c.k_top; d.op_params[3] = c.flags;
    std::memcpy(&d.op_params[0], &scale, sizeof(float));
    ggml_tensor * srcs[6] = { &q, &k, &kt, &v, &m, &vm };
    for (int i = 0; i < 6; ++i) d.src[i] = srcs[i];
    ggml_sparse_cpu_sparq_ref(&d);

    if (race) {
        bool same = true;
        shim::set_random(false, 0);
        const auto want = gpu_sparq(c, srcs);
        for (uint64_t seed = 1; seed <= 2; ++seed) {
            shim::set_random(true, seed);
            const auto got = gpu_sparq(c, srcs);
            same = same && std::memcmp(got.data(), want.data(), got.size()*sizeof(float)) == 0;
        }
        shim::set_random(false, 0);
        CHECK(same, "race check SPARQ: results depend on the scheduling");
        return same;
    }
    const auto got = gpu_sparq(c, srcs);
    bool finite;
    const double rel = rel_l2_err(got.data(), ref.data(), got.size(), &finite);
    CHECK(finite && rel <= 1e-4, "SPARQ kv=%s%s mask=%s D=%d Dv=%d n_kv=%d n_tok=%d Hkv=%d G=%d ns=%d r=%d k=%d flags=%d ntg=%d: rel err %.3e%s",
          ggml_type_name(c.kv), c.kt_q8 ? " kt=q8_0" : "", ggml_type_name(c.m), c.D, c.Dv, c.n_kv, c.n_tok, c.Hkv, c.G, c.ns, c.r, c.k_top, c.flags, c.ntg,
          rel, finite ? "" : " (not written)");
    return finite && rel <= 1e-4;
}

static void test_sparq(bool quick) {
    const int n_cases = quick ? 12 : 30;
    for (int i = 0; i < n_cases; ++i) {
        sparq_case c;
        c.kv    = rand_int(0, 1) ? GGML_TYPE_F16 : GGML_TYPE_F32;
        c.m     = rand_int(0, 1) ? GGML_TYPE_F16 : GGML_TYPE_F32;
        c.D     = (int[]){ 32, 64, 80, 128 }[rand_int(0, 3)];
        c.Dv    = rand_int(0, 3) ? c.D : 48;
        c.n_kv  = rand_int(1, 700);
        c.n_tok = rand_int(1, 3);
        c.Hkv   = rand_int(1, 2);
        c.G     = (int[]){ 1, 2, 4, 8 }[rand_int(0, 3)];
        c.ns    = rand_int(1, 2);
        c.r     = rand_int(0, 4) ? rand_int(1, c.D/2) : c.D + 5;
        c.k_top = rand_int(1, 5) == 1 ? c.n_kv + 3 : rand_int(1, std::max(1, c.n_kv/3));
        c.flags = rand_int(0, 1) ? GGML_SPARQ_MEAN_V : 0;
        c.ntg   = (int[]){ 64, 128, 256 }[rand_int(0, 2)];
        test_sparq_case(c);
    }
    g_sparq_ties = true;
    for (int i = 0; i < 4; ++i) {
        test_sparq_case({ GGML_TYPE_F16, GGML_TYPE_F32, 8*rand_int(1, 4), 32, rand_int(20, 300), 1, 1, rand_int(1, 3), 1,
                          rand_int(1, 8), rand_int(1, 15), 0, 64 });
    }
    g_sparq_ties = false;
    test_sparq_case({ GGML_TYPE_F16, GGML_TYPE_F16, 64, 64, 300, 2, 2, 4, 1, 16, 40, GGML_SPARQ_MEAN_V, 128 }, true);
    // the 8-bit transposed K (kt=q8_0): f16 K/V, whole blocks of 32 positions
    for (int i = 0; i < (quick ? 4 : 8); ++i) {
        sparq_case c = { GGML_TYPE_F16, rand_int(0, 1) ? GGML_TYPE_F16 : GGML_TYPE_F32, (int[]){ 64, 128 }[rand_int(0, 1)], 0,
                         32*rand_int(1, 20), rand_int(1, 3), rand_int(1, 2), (int[]){ 1, 3, 4 }[rand_int(0, 2)], rand_int(1, 2),
                         0, 0, rand_int(0, 1) ? GGML_SPARQ_MEAN_V : 0, (int[]){ 64, 256 }[rand_int(0, 1)], true };
        c.Dv    = c.D;
        c.r     = rand_int(1, c.D/2);
        c.k_top = rand_int(1, 5) == 1 ? c.n_kv + 3 : rand_int(1, std::max(1, c.n_kv/3));
        test_sparq_case(c);
    }
}

//
// race check: random lane/threadgroup order and preemption must not change the bits
//

template <class F> static void race_check(const char * what, F run) {
    shim::set_random(false, 0);
    const auto want = run();
    bool same = true;
    for (uint64_t seed = 1; seed <= 3; ++seed) {
        shim::set_random(true, seed);
        same = same && run() == want;
    }
    shim::set_random(false, 0);
    CHECK(same, "race check %s: results depend on the scheduling", what);
}

static void test_races() {
    std::vector<float> x(8*14336);
    for (auto & v : x) v = rand_normal();
    for (idx_variant var : { IDX_DEFAULT, IDX_SEGMENTS, IDX_ATOMIC }) {
        for (int n : { 1536, 14336 }) {
            const int nt = n > 4096 ? 8 : 3;
            const float thr = threshold_for(x, n, nt, n, 0.5);
            const uint64_t st = rng();
            race_check(("LIST variant " + std::to_string(var) + " n=" + std::to_string(n)).c_str(), [&]() {
                rng.seed(st); // same forced segmenting every run
                std::vector<int32_t> d;
                uint32_t stats[GGML_SPARSE_METAL_STATS_WORDS] = { 0xfffffff0u, 0, 0xffffff00u, 0, 0xfffff000u, 0, 0, 0 };
                gpu_idx_list(x, n, nt, n, thr, var, 256, d, stats, true);
                if (var == IDX_ATOMIC) std::sort(d.begin(), d.begin() + std::max(0, std::min(d[n], n)));
                d.insert(d.end(), stats, stats + GGML_SPARSE_METAL_STATS_WORDS); // the counters too
                return d;
            });
        }
    }
    for (ggml_type type : { GGML_TYPE_Q4_K, GGML_TYPE_Q8_0, GGML_TYPE_Q4_0, GGML_TYPE_Q6_K }) {
        zz_weights w;
        make_weights(w, type, 576, 1536 % ggml_blck_size(type) == 0 ? 512 : 576);
        std::vector<float> xx(4*576);
        for (auto & v : xx) v = rand_normal();
        std::vector<int32_t> idx(577);
        zzref_idx(xx.data(), 576, 4, 576*sizeof(float), threshold_for(xx, 576, 4, 576, 0.5), GGML_SPARSE_IDX_LIST, idx.data());
        race_check((std::string("GEMV ") + type_tag(type)).c_str(), [&]() {
            std::vector<float> y(4*w.m);
            poison(y);
            gpu_zz_gemv(w, xx, 4, 576, idx.data(), y, w.m, 3, 4);
            std::vector<uint32_t> bits(y.size());
            std::memcpy(bits.data(), y.data(), y.size()*sizeof(float));
            return bits;
        });
    }
}

//
// shim self-tests: the checks above can fail
//

static void test_shim_selftest() {
    // row sums with simd_sum and threadgroup memory are exact
    const int rows = 5, cols = 300;
    std::vector<float> a(rows*cols), s(rows);
    for (int i = 0; i < rows*cols; ++i) a[i] = (float) rand_int(-100, 100);
    poison(s);
    int32_t ncols = cols;
    launch("kernel_selftest_row_sum", rows, 1, 128, { &ncols, a.data(), s.data() });
    bool exact = true;
    for (int r = 0; r < rows; ++r) {
        float want = 0; for (int c = 0; c < cols; ++c) want += a[r*cols + c];
        exact = exact && s[r] == want;
    }
    CHECK(exact, "selftest: simd_sum row sums");

    // simd prefix sums, shuffles, broadcast
    std::vector<int32_t> out(4*64);
    poison(out);
    launch("kernel_selftest_simd", 1, 1, 64, { out.data() });
    bool ok = true;
    for (int l = 0; l < 64; ++l) {
        const int lane = l % 32, v = l + 1, base = (l/32)*32;
        int excl = 0; for (int k = base; k < l; ++k) excl += k + 1;
        ok = ok && out[4*l + 0] == excl;
        ok = ok && out[4*l + 1] == (lane + 3 < 32 ? v + 3 : v);
        ok = ok && out[4*l + 2] == base + (lane ^ 5) + 1;
        ok = ok && out[4*l + 3] == base + 7 + 1;
    }
    CHECK(ok, "selftest: simd_prefix_exclusive_sum / simd_shuffle_down / simd_shuffle_xor / simd_broadcast");

    // a kernel that reads its neighbour's threadgroup slot without a barrier: random order must expose it
    auto racy = [&]() { std::vector<int32_t> o(256); poison(o); launch("kernel_selftest_racy", 1, 1, 256, { o.data() }); return o; };
    shim::set_random(false, 0);
    const auto r0 = racy();
    bool differs = false;
    for (uint64_t seed = 1; seed <= 4 && !differs; ++seed) { shim::set_random(true, seed); differs = racy() != r0; }
    shim::set_random(false, 0);
    CHECK(differs, "selftest: the race check did not notice a missing barrier");

    // a barrier that returned threads never reach: the shim must stop with an error
    std::fflush(stdout);
    const pid_t pid = fork();
    if (pid == 0) {
        std::freopen("/dev/null", "w", stderr);
        std::vector<int32_t> o(64);
        launch("kernel_selftest_divergent_barrier", 1, 1, 64, { o.data() });
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT, "selftest: a divergent barrier was not reported");
}

int main(int argc, char ** argv) {
    bool quick = false;
    for (int i = 1; i < argc; ++i) {
        if (!std::strcmp(argv[i], "--quick")) quick = true;
        else if (!std::strcmp(argv[i], "--seed") && i + 1 < argc) rng.seed(std::strtoull(argv[++i], nullptr, 10));
    }
    const double sparsities[] = { 0.0, 0.01, 0.5, 0.99, 1.0 };

    test_shim_selftest();
    std::printf("shim self-tests: %d passed, %d failed\n", n_pass, n_fail);

    for (int n : { 192, 576, 1536, 14336, rand_int(1, 40000), rand_int(1, 100) }) {
        for (double sp : sparsities) {
            const int nt = rand_int(1, 8);
            test_idx_case(n, nt, sp, IDX_DEFAULT, rand_int(0, 4) == 0);
            test_idx_case(n, rand_int(1, 8), sp, IDX_SEGMENTS, false);
            test_idx_case(n, rand_int(1, 8), sp, IDX_ATOMIC, false);
        }
        test_mask_case(n, rand_int(1, 8), sparsities[rand_int(0, 4)]);
    }
    for (int nt = 1; nt <= 8; ++nt) test_idx_case(rand_int(1, 5000), nt, 0.5, (idx_variant) rand_int(0, 2), false);
    std::printf("index: %d passed, %d failed\n", n_pass, n_fail);

    const ggml_type types[] = { GGML_TYPE_Q4_K, GGML_TYPE_Q8_0, GGML_TYPE_Q4_0, GGML_TYPE_Q6_K };
    for (ggml_type type : types) {
        const int B = ggml_blck_size(type);
        std::vector<int64_t> ms;
        for (int64_t m : { 192, 576, 1536 }) if (m % B == 0) ms.push_back(m);
        ms.push_back(B*rand_int(1, 4));
        int case_no = 0;
        for (int64_t m : ms) {
            for (double sp : sparsities) {
                for (int sparse = 0; sparse <= 1; ++sparse) {
                    if (quick && case_no % 3 != 0) { case_no++; continue; }
                    const int64_t n = (int64_t[]){ 192, 576, 1536, (int64_t) rand_int(1, 2500) }[rand_int(0, 3)];
                    const int nt = 1 + (case_no++ % 8);
                    int n1, nsg;
                    ggml_sparse_metal_zz_shape(type, n, m/B, &n1, &nsg);
                    if (rand_int(0, 1)) { n1 = rand_int(1, 5); nsg = (int[]){ 1, 2, 4 }[rand_int(0, 2)]; }
                    test_gemv_case(type, m, n, nt, sp, sparse, n1, nsg);
                }
            }
        }
        test_dequant_case(type, ms.back(), rand_int(1, 700));
        test_prefill_case(type, ms[rand_int(0, (int) ms.size() - 1)], rand_int(1, 600), rand_int(9, 40));
        std::printf("%s: %d passed, %d failed\n", type_tag(type), n_pass, n_fail);
    }

    test_sparq(quick);
    std::printf("sparq: %d passed, %d failed\n", n_pass, n_fail);

    test_races();
    std::printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail == 0 ? 0 : 1;
}
