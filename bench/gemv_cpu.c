// llama-sparse: CPU decode GEMV microbenchmark. Stock ggml Q4_K mul_mat (CPU backend, ggml graph,
// x quantized to Q8_K inside) against zigzag MUL_MAT_ZZ dense and with an active-column index at
// several sparsities, batch 1. Prints a markdown table (ratio = stock time / zigzag time).
// usage: gemv_cpu [-t n_threads] [-r reps] [-s min|median] [-m hot|cold] [-q q4_k|q8_0] [-S 0|1|2] [-p s]
//                 [-L rows|cols|both] [-P procs] [-K repack|plain]
// -K: stock's weights in the CPU backend's repacking buffer type (CPU_REPACK: Q4_K as 8x8 interleaved rows with
// its own GEMV, as llama.cpp loads them by default; the default) or as plain rows (plain; before 2026-11-26 the only
// way: on an Intel Xeon the plain rows ran 4096x4096 at ~0.6x the repacked speed).
// -q: weight type of both sides (stock mul_mat of that type against zigzag of that type);
// -S 1: SmolLM2-135M shapes (576/1536) instead of Llama-2-7B's, -S 2: 4096x4096 only; -p s: only sparsity s;
// -L rows|cols|both: zigzag weights in the file's row layout (default), in the column-major runtime layout
// (ggml_sparse_zz_to_colmajor), or both side by side (the two layouts' calls alternate in every round);
// -P procs (default 6): each side runs in its own processes, procs of each, alternating (stock, zigzag,
// zigzag, stock, ...), each timing -r rounds (stock: each round as many calls as zigzag's, the first timed); the table takes the fastest/median over all of a side's
// rounds. Two threads on two cores leave no room for a foreign thread: stock's OpenMP workers keep
// spinning after a call (OMP_WAIT_POLICY=active) and the zigzag pool's workers spin between jobs, so
// in one process either side's spinners slow the other side's calls. A process that exits takes its
// threads with it. -P 0: the old way, both sides interleaved per round in one process.
// Correctness: weight copy 0 of each side is the same random fp32 matrix quantized (stock: rows; zigzag:
// block columns), every process's outputs on it are checked against fp64 products with its own
// dequantized weights and the fp32 weights, and stock against zigzag dense; failures exit 1.
#include "ggml.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml-cpu-impl.h"
#include "ggml-sparse.h"
#include "ggml-sparse-cpu.h"
#include "zz_test_threads.h"
#define ZZ_TEST_SEED 0x2545f4914f6cdd1dULL
#include "bench_util.h"
#include "bench_stock.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_REPS  1000
#define MAX_CONF  16
#define MAX_PROCS 16

static bool use_min = true;

// the machine is shared: the fastest run (default) estimates the unloaded time better than the median
static double median(double * v, int n) {
    qsort(v, n, sizeof(double), cmp_double);
    return use_min ? v[0] : v[n/2];
}

static enum ggml_type wtype = GGML_TYPE_Q4_K;

// cold: the weights are cycled through enough copies to exceed the last-level cache, so every call
// streams them from memory as decoding a real model does; hot: one copy, cache-resident if it fits
static int n_copies_for(size_t bytes, bool cold) {
    const size_t total = (size_t) 256*1024*1024;
    const int n = cold ? (int) ((total + bytes - 1)/bytes) : 1;
    return n < 64 ? n : 64; // small (SmolLM2) shapes: 64 copies, mostly beyond the caches

}

static bool stock_repack = true; // -K

struct stock_bench {
    struct ggml_context * ctx;
    struct ggml_context * ctx_r;  // the repacked copies (stock_repack), in buf_r
    ggml_backend_buffer_t buf_r;
    struct ggml_cgraph  * gf[64];
    struct ggml_tensor  * w[64];  // plain rows (filled by stock_init / check_ref_init)
    struct ggml_tensor  * x;
    struct ggml_cplan     plan;
    uint8_t             * work;
    int                   copies;
    int                   next;
};

// weight copies only: copy 0 is filled by the caller (the checked one), the rest random; stock_graphs then
// builds the graphs
static void stock_init(struct stock_bench * sb, int64_t m, int64_t n, int copies, const float * x) {
    const size_t wbytes = ggml_row_size(wtype, n)*m;
    struct ggml_init_params ip = { (wbytes + 1024)*copies + 64*n + 64*m + 16*1024*1024, NULL, false };
    sb->ctx   = ggml_init(ip);
    sb->ctx_r = NULL;
    sb->buf_r = NULL;
    sb->x     = ggml_new_tensor_2d(sb->ctx, GGML_TYPE_F32, n, 1);
    memcpy(sb->x->data, x, sizeof(float)*n);
    for (int c = 0; c < copies; ++c) {
        struct ggml_tensor * w = ggml_new_tensor_2d(sb->ctx, wtype, n, m);
        if (c > 0) {
            fill_random_blocks(wtype, w->data, m*n/ggml_blck_size(wtype));
        }
        sb->w[c] = w;
    }
    sb->copies = copies;
}

// the graphs, on the plain copies or (buft set: CPU_REPACK) on copies set into that buffer type; after copy 0 is
// filled
static void stock_graphs(struct stock_bench * sb, int n_threads, ggml_backend_buffer_type_t buft) {
    struct ggml_tensor * src[64];
    memcpy(src, sb->w, sizeof(src));
    if (buft != NULL) {
        struct ggml_init_params ip = { ggml_tensor_overhead()*sb->copies + 1024, NULL, true };
        sb->ctx_r = ggml_init(ip);
        for (int c = 0; c < sb->copies; ++c) {
            src[c] = ggml_new_tensor_2d(sb->ctx_r, sb->w[c]->type, sb->w[c]->ne[0], sb->w[c]->ne[1]);
        }
        sb->buf_r = ggml_backend_alloc_ctx_tensors_from_buft(sb->ctx_r, buft);
        GGML_ASSERT(sb->buf_r != NULL);
        for (int c = 0; c < sb->copies; ++c) {
            ggml_backend_tensor_set(src[c], sb->w[c]->data, 0, ggml_nbytes(sb->w[c]));
        }
    }
    size_t work_size = 0;
    for (int c = 0; c < sb->copies; ++c) {
        sb->gf[c] = ggml_new_graph(sb->ctx);
        ggml_build_forward_expand(sb->gf[c], ggml_mul_mat(sb->ctx, src[c], sb->x));
        const struct ggml_cplan p = ggml_graph_plan(sb->gf[c], n_threads, NULL);
        work_size = p.work_size > work_size ? p.work_size : work_size;
    }
    sb->plan = ggml_graph_plan(sb->gf[0], n_threads, NULL);
    sb->work = malloc(work_size + 1);
    sb->plan.work_data = sb->work;
    sb->plan.work_size = work_size;
    sb->next   = 0;
}

// one timed call; every call takes the next weight copy (cold: streamed from memory)
static double stock_run(struct stock_bench * sb) {
    const double t0 = now_us();
    ggml_graph_compute(sb->gf[sb->next++ % sb->copies], &sb->plan);
    return now_us() - t0;
}

static const float * stock_run_copy0(struct stock_bench * sb) {
    ggml_graph_compute(sb->gf[0], &sb->plan);
    return (const float *) ggml_graph_node(sb->gf[0], -1)->data;
}

static void stock_free(struct stock_bench * sb) {
    free(sb->work);
    if (sb->buf_r != NULL) {
        ggml_backend_buffer_free(sb->buf_r);
    }
    if (sb->ctx_r != NULL) {
        ggml_free(sb->ctx_r);
    }
    ggml_free(sb->ctx);
}

struct zz_bench {
    int64_t m, n;
    int     copies;
    void  * w;
    struct ggml_tensor wcopy[64];
    void  * w_cm;
    struct ggml_tensor wcopy_cm[64];
    float * x;
    float * y;
    struct ggml_tensor wt, xt;
    void  * wdata;
    size_t  wsize;
    int     next;
};

static struct ggml_tensor mk(enum ggml_type type, int64_t ne0, int64_t ne1, size_t nb1, void * data) {
    struct ggml_tensor t;
    memset(&t, 0, sizeof(t));
    t.type = type;
    t.ne[0] = ne0; t.ne[1] = ne1; t.ne[2] = 1; t.ne[3] = 1;
    t.nb[0] = ggml_type_size(type); t.nb[1] = nb1; t.nb[2] = nb1*ne1; t.nb[3] = t.nb[2];
    t.data = data;
    return t;
}

// threshold on |x| that leaves about (1 - sparsity) of the columns active
static float thr_for(const float * x, int64_t n, double sparsity) {
    float * a = malloc(sizeof(float)*n);
    for (int64_t j = 0; j < n; ++j) {
        a[j] = fabsf(x[j]);
    }
    // a few rounds of bisection on the value are enough for a benchmark
    float lo = 0.0f, hi = 100.0f;
    for (int it = 0; it < 60; ++it) {
        const float mid = 0.5f*(lo + hi);
        int64_t below = 0;
        for (int64_t j = 0; j < n; ++j) {
            below += a[j] < mid;
        }
        if ((double) below/n < sparsity) lo = mid; else hi = mid;
    }
    free(a);
    return hi;
}

// one zigzag configuration: dense (sparsity < 0) or an index list for a sparsity
struct zz_conf {
    bool      cm;
    int32_t * idx;
    struct ggml_tensor idxt, yt;
    int64_t active;
    double  t_idx;
};

// builds the index list (timing the index op, fastest/median of reps) and the MUL_MAT_ZZ node
static void zz_conf_init(struct zz_conf * c, struct zz_bench * b, struct zz_test_pool * pool, double sparsity, int reps) {
    const bool sparse = sparsity >= 0.0;
    c->idx = malloc(sizeof(int32_t)*(b->n + 1));
    c->t_idx  = 0.0;
    c->active = b->n;
    if (sparse) {
        const float thr = thr_for(b->x, b->n, sparsity);
        c->idxt = mk(GGML_TYPE_I32, b->n + 1, 1, sizeof(int32_t)*(b->n + 1), c->idx);
        c->idxt.src[0] = &b->xt;
        memcpy(&c->idxt.op_params[0], &thr, sizeof(float));
        c->idxt.op_params[1] = GGML_SPARSE_IDX_LIST;
        GGML_ASSERT(ggml_sparse_cpu_work_size(&c->idxt, pool->nth) <= b->wsize);
        double t[MAX_REPS];
        for (int i = 0; i < 20; ++i) {
            zz_test_pool_run(pool, ggml_sparse_cpu_forward_idx, &c->idxt, b->wdata, b->wsize, false);
        }
        for (int i = 0; i < reps; ++i) {
            const double t0 = now_us();
            zz_test_pool_run(pool, ggml_sparse_cpu_forward_idx, &c->idxt, b->wdata, b->wsize, false);
            t[i] = now_us() - t0;
        }
        c->t_idx  = median(t, reps);
        c->active = c->idx[b->n];
    }
    c->yt = mk(GGML_TYPE_F32, b->m, 1, sizeof(float)*b->m, b->y);
    c->yt.src[0] = &b->wt;
    c->yt.src[1] = &b->xt;
    c->yt.src[2] = sparse ? &c->idxt : NULL;
    GGML_ASSERT(ggml_sparse_cpu_work_size(&c->yt, pool->nth) <= b->wsize);
}

// one timed MUL_MAT_ZZ call on weight copy k (k < 0: the next copy)
static double zz_conf_run(struct zz_conf * c, struct zz_bench * b, struct zz_test_pool * pool, int k) {
    k = k < 0 ? b->next++ % b->copies : k;
    c->yt.src[0] = c->cm ? &b->wcopy_cm[k] : &b->wcopy[k];
    const double t0 = now_us();
    zz_test_pool_run(pool, ggml_sparse_cpu_forward_mul_mat_zz, &c->yt, b->wdata, b->wsize, false);
    return now_us() - t0;
}

// the configurations: 0 = stock, then per layout (rows, column-major) zigzag dense and each sparsity
static double sps[]   = { 0.25, 0.40, 0.50, 0.65, 0.80 };
static int    nsp     = 5;
static int    layouts = 1; // bit 0: row layout, bit 1: column-major

static int conf_count(void) {
    return 1 + ((layouts & 1) ? nsp + 1 : 0) + ((layouts & 2) ? nsp + 1 : 0);
}

// sparsity of configuration k >= 1 (-1: dense) and its layout
static double conf_sparsity(int k) {
    const int s = (k - 1) % (nsp + 1);
    return s == 0 ? -1.0 : sps[s - 1];
}

static bool conf_cm(int k) {
    return layouts == 2 || (layouts == 3 && k > nsp + 1);
}

// what one side's run hands back; in memory shared with the parent (MAP_SHARED, mapped before the fork)
struct side_out {
    double  t[MAX_CONF][MAX_REPS];
    double  t_idx;
    int64_t active[MAX_CONF];
    long    preempt; // involuntary context switches of its threads during the timed rounds
    int     ok;
    float   y[]; // [MAX_CONF][m]: outputs on weight copy 0, for the check
};

static struct side_out * side_out_new(int64_t m) {
    const size_t sz = sizeof(struct side_out) + sizeof(float)*MAX_CONF*m;
    void * p = mmap(NULL, sz, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    GGML_ASSERT(p != MAP_FAILED);
    return p;
}

static void side_out_free(struct side_out * o, int64_t m) {
    munmap(o, sizeof(struct side_out) + sizeof(float)*MAX_CONF*m);
}

// involuntary context switches of this process's threads: with 2 threads on 2 cores any foreign work
// during the timed rounds preempts ours (a spinning worker's sched_yield then switches too), so every
// process reports how often that happened (CPU-time shares are too coarse over a few ms of stock calls)
static long nivcsw_now(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_nivcsw;
}

// times reps rounds of the chosen side(s), each round one call of every configuration (a warm-up of 20
// rounds first), then computes every configuration's output on copy 0. The zigzag pool (spinning
// workers) exists only while this runs and only if zigzag is timed.
static void side_run(struct stock_bench * sb, struct zz_bench * b, bool do_stock, bool do_zz,
                     int n_threads, int reps, struct side_out * out) {
    const int nconf = conf_count();
    struct zz_test_pool pool;
    struct zz_conf conf[MAX_CONF];
    if (do_zz) {
        zz_test_pool_init(&pool, n_threads);
        for (int k = 1; k < nconf; ++k) {
            zz_conf_init(&conf[k], b, &pool, conf_sparsity(k), reps);
            conf[k].cm     = conf_cm(k);
            out->active[k] = conf[k].active;
        }
        out->t_idx = conf[nconf - 1].t_idx;
    }
    // stock alone: a round makes as many calls as a zigzag round (back to back, over as long a time) and
    // times the first, so both sides' samples are as many and spread over as much of the machine's swings
    const int stock_calls = do_zz ? 1 : nconf - 1;
    long nivcsw0 = 0;
    for (int i = -20; i < reps; ++i) {
        if (i == 0) {
            nivcsw0 = nivcsw_now();
        }
        for (int k = do_stock ? 0 : 1; k < (do_zz ? nconf : 1); ++k) {
            const double dt = k == 0 ? stock_run(sb) : zz_conf_run(&conf[k], b, &pool, -1);
            if (i >= 0) {
                out->t[k][i] = dt;
            }
        }
        for (int c = 1; do_stock && c < stock_calls; ++c) {
            stock_run(sb);
        }
    }
    out->preempt = nivcsw_now() - nivcsw0;
    if (do_stock) {
        memcpy(out->y, stock_run_copy0(sb), sizeof(float)*b->m);
    }
    if (do_zz) {
        for (int k = 1; k < nconf; ++k) {
            zz_conf_run(&conf[k], b, &pool, 0);
            memcpy(out->y + k*b->m, b->y, sizeof(float)*b->m);
            free(conf[k].idx);
        }
        zz_test_pool_free(&pool);
    }
    out->ok = 1;
}

// runs side_run in a child process; the parent sleeps in waitpid meanwhile (no thread of its own runs)
static void side_run_forked(struct stock_bench * sb, struct zz_bench * b, bool do_stock, bool do_zz,
                            int n_threads, int reps, struct side_out * out) {
    out->ok = 0;
    fflush(stdout);
    fflush(stderr);
    const pid_t pid = fork();
    GGML_ASSERT(pid >= 0);
    if (pid == 0) {
        side_run(sb, b, do_stock, do_zz, n_threads, reps, out);
        _exit(0); // no stdio flush: the parent owns what is buffered
    }
    bench_wait_side(pid, &out->ok, "gemv_cpu", do_stock ? "stock" : "zigzag");
}

static double rel_err_f(const float * y, const float * ref, int64_t m) {
    double num = 0.0, den = 0.0;
    for (int64_t i = 0; i < m; ++i) {
        num += ((double) y[i] - ref[i])*((double) y[i] - ref[i]);
        den += (double) ref[i]*ref[i];
    }
    return den > 0.0 ? sqrt(num/den) : (num > 0.0 ? INFINITY : 0.0);
}

// fp64 references on weight copy 0 of both sides, and the columns each sparsity keeps
struct check_ref {
    double  * fp32;    // [m]: the fp32 matrix before quantization, all columns
    double  * stock;   // [m]: stock's dequantized copy 0
    double  * zz;      // [nsp + 1][m]: zigzag's dequantized copy 0, dense then each sparsity's columns
    int64_t * active;  // [nsp + 1]
    double    max_stock, max_zz, max_fp32, max_cross, max_layout; // largest errors seen
    int       failures;
};

// copy 0 of both sides from one fp32 matrix (stock: rows of n; zigzag: block-row r holds W[rB:(r+1)B, :]^T
// quantized as n rows of B), and the fp64 products with x the outputs are checked against
static void check_ref_init(struct check_ref * cr, struct stock_bench * sb, struct zz_bench * b) {
    const int64_t m = b->m, n = b->n, bk = ggml_blck_size(wtype);
    const size_t  bs = ggml_type_size(wtype);
    const struct ggml_type_traits * tr = ggml_get_type_traits(wtype);
    float * wf = malloc(sizeof(float)*m*n);
    for (int64_t i = 0; i < m*n; ++i) {
        wf[i] = 0.02f*rng_normal();
    }
    ggml_quantize_chunk(wtype, wf, sb->w[0]->data, 0, m, n, NULL);
    zz_test_quantize_zigzag(wtype, m, n, wf, b->w);

    cr->fp32   = calloc(m, sizeof(double));
    cr->stock  = calloc(m, sizeof(double));
    cr->zz     = calloc((nsp + 1)*m, sizeof(double));
    cr->active = calloc(nsp + 1, sizeof(int64_t));
    cr->max_stock = cr->max_zz = cr->max_fp32 = cr->max_cross = cr->max_layout = 0.0;
    cr->failures  = 0;

    float * row = malloc(sizeof(float)*(n > bk ? n : bk));
    for (int64_t i = 0; i < m; ++i) {
        tr->to_float((const char *) sb->w[0]->data + i*sb->w[0]->nb[1], row, n);
        double s = 0.0, sf = 0.0;
        for (int64_t j = 0; j < n; ++j) {
            s  += (double) row[j]*b->x[j];
            sf += (double) wf[i*n + j]*b->x[j];
        }
        cr->stock[i] = s;
        cr->fp32[i]  = sf;
    }
    // a column is active where |x| >= the threshold, as the index op decides
    float thr[8];
    thr[0] = 0.0f;
    cr->active[0] = n;
    for (int s = 1; s <= nsp; ++s) {
        thr[s] = thr_for(b->x, n, sps[s - 1]);
        cr->active[s] = 0;
        for (int64_t j = 0; j < n; ++j) {
            cr->active[s] += fabsf(b->x[j]) >= thr[s];
        }
    }
    for (int64_t r = 0; r < m/bk; ++r) {
        for (int64_t j = 0; j < n; ++j) {
            tr->to_float((const char *) b->w + (r*n + j)*bs, row, bk);
            const double xv = b->x[j];
            for (int s = 0; s <= nsp; ++s) {
                if (s > 0 && fabsf(b->x[j]) < thr[s]) {
                    continue;
                }
                double * z = cr->zz + s*m + r*bk;
                for (int64_t i = 0; i < bk; ++i) {
                    z[i] += xv*row[i];
                }
            }
        }
    }
    free(row);
    free(wf);
}

static void check_ref_free(struct check_ref * cr) {
    free(cr->fp32); free(cr->stock); free(cr->zz); free(cr->active);
}

#define CHECK_FAIL(cr, ...) do { fprintf(stderr, "gemv_cpu: CHECK FAILED: " __VA_ARGS__); fputc('\n', stderr); (cr)->failures++; } while (0)

// one process's outputs (stock's, zigzag's or both): errors against the references. Tolerances: stock and
// the zigzag kernels quantize x / the per-column coefficients to 8 bits (~1 % here), so 3 % against
// their own dequantized weights; against the fp32 matrix the 4-bit weight error adds ~10 %, so 0.25
// (a wrong layout or index list gives ~1 or more). y_stock: a stock output to compare zigzag dense with.
static void check_side(struct check_ref * cr, const struct side_out * o, bool has_stock, bool has_zz,
                       const float * y_stock, int64_t m) {
    const double tol_own  = 3e-2;
    const double tol_fp32 = 0.25;
    if (has_stock) {
        const double e  = rel_err_d(o->y, cr->stock, m);
        const double ef = rel_err_d(o->y, cr->fp32, m);
        cr->max_stock = fmax(cr->max_stock, e);
        cr->max_fp32  = fmax(cr->max_fp32, ef);
        if (!(e < tol_own))   CHECK_FAIL(cr, "stock vs its dequantized weights: rel err %.3g", e);
        if (!(ef < tol_fp32)) CHECK_FAIL(cr, "stock vs the fp32 weights: rel err %.3g", ef);
    }
    if (!has_zz) {
        return;
    }
    for (int k = 1; k < conf_count(); ++k) {
        const int s = (k - 1) % (nsp + 1);
        const float * y = o->y + k*m;
        if (o->active[k] != cr->active[s]) {
            CHECK_FAIL(cr, "conf %d: %lld active columns, expected %lld", k, (long long) o->active[k], (long long) cr->active[s]);
        }
        const double e = rel_err_d(y, cr->zz + s*m, m);
        cr->max_zz = fmax(cr->max_zz, e);
        if (!(e < tol_own)) CHECK_FAIL(cr, "zigzag conf %d%s vs its dequantized weights: rel err %.3g", k, conf_cm(k) ? " (cols)" : "", e);
        if (layouts == 3 && !conf_cm(k)) {
            // the same chunks and coefficients in both layouts: the same sums up to the thread split's rounding
            const double el = rel_err_f(o->y + (k + nsp + 1)*m, y, m);
            cr->max_layout = fmax(cr->max_layout, el);
            if (!(el < 1e-5)) CHECK_FAIL(cr, "conf %d: column-major vs row layout rel diff %.3g", k, el);
        }
        if (s == 0) {
            const double ef = rel_err_d(y, cr->fp32, m);
            cr->max_fp32 = fmax(cr->max_fp32, ef);
            if (!(ef < tol_fp32)) CHECK_FAIL(cr, "zigzag dense%s vs the fp32 weights: rel err %.3g", conf_cm(k) ? " (cols)" : "", ef);
            if (y_stock) {
                const double ec = rel_err_f(y, y_stock, m);
                cr->max_cross = fmax(cr->max_cross, ec);
                if (!(ec < tol_fp32)) CHECK_FAIL(cr, "zigzag dense%s vs stock: rel diff %.3g", conf_cm(k) ? " (cols)" : "", ec);
            }
        }
    }
}

int main(int argc, char ** argv) {
    int n_threads = 2;
    int reps      = 200;
    bool cold     = false;
    int shape_set = 0; // 0: Llama-2-7B shapes, 1: SmolLM2-135M shapes
    double only_sp = -1.0;
    int n_procs   = 6;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "-t") == 0) n_threads = atoi(argv[i + 1]);
        if (strcmp(argv[i], "-r") == 0) reps      = atoi(argv[i + 1]);
        if (strcmp(argv[i], "-s") == 0) use_min   = strcmp(argv[i + 1], "median") != 0;
        if (strcmp(argv[i], "-m") == 0) cold      = strcmp(argv[i + 1], "cold") == 0;
        if (strcmp(argv[i], "-q") == 0) wtype     = strcmp(argv[i + 1], "q8_0") == 0 ? GGML_TYPE_Q8_0 : GGML_TYPE_Q4_K;
        if (strcmp(argv[i], "-S") == 0) shape_set = atoi(argv[i + 1]);
        if (strcmp(argv[i], "-p") == 0) only_sp   = atof(argv[i + 1]);
        if (strcmp(argv[i], "-L") == 0) layouts   = strcmp(argv[i + 1], "cols") == 0 ? 2 : strcmp(argv[i + 1], "both") == 0 ? 3 : 1;
        if (strcmp(argv[i], "-P") == 0) n_procs   = atoi(argv[i + 1]);
        if (strcmp(argv[i], "-K") == 0) stock_repack = strcmp(argv[i + 1], "plain") != 0;
    }
    reps    = reps > MAX_REPS ? MAX_REPS : reps;
    n_procs = n_procs > MAX_PROCS ? MAX_PROCS : n_procs < 0 ? 0 : n_procs;
    // the parent only prepares data: it must never enter an OpenMP region (ggml_graph_compute), as
    // libgomp's threads do not survive fork
    ggml_cpu_init();

    const int64_t shapes_7b[3][2]   = { { 4096, 4096 }, { 11008, 4096 }, { 4096, 11008 } };
    const int64_t shapes_smol[3][2] = { { 576, 576 }, { 1536, 576 }, { 576, 1536 } };
    const int64_t (*shapes)[2] = shape_set == 1 ? shapes_smol : shapes_7b;
    if (only_sp >= 0.0) { // -p: one sparsity only (profiling)
        sps[0] = only_sp;
        nsp    = 1;
    }
    const int nconf = conf_count();

    if (n_procs > 0) {
        printf("threads %d, batch 1, %s, %s of %d x %d rounds: each side in its own processes, %d of each, "
               "alternating (stock, zigzag, zigzag, stock, ...), %d rounds each (a zigzag round: every zigzag column once, "
               "interleaved; a stock round: as many stock calls, the first timed; stock on OpenMP threads, zigzag on the "
               "bench pool, never both at once), weights %s, "
               "times in us; ratio = stock time / zigzag time\n\n",
               n_threads, ggml_type_name(wtype), use_min ? "fastest" : "median", n_procs, reps, n_procs, reps,
               cold ? "cold (cycled through copies totalling 256 MiB: streamed from memory)" : "hot (one copy, cache-resident where it fits)");
    } else {
        printf("threads %d, batch 1, %s, %s of %d rounds, one process (-P 0: each round times stock and every zigzag column once, interleaved; "
               "both sides' spinning threads present throughout), weights %s, times in us; ratio = stock time / zigzag time\n\n",
               n_threads, ggml_type_name(wtype), use_min ? "fastest" : "median", reps,
               cold ? "cold (cycled through copies totalling 256 MiB: streamed from memory)" : "hot (one copy, cache-resident where it fits)");
    }
    const ggml_backend_buffer_type_t stock_buft = stock_repack ? stock_repack_buft(wtype, 4096) : NULL;
    printf("stock weights: %s\n", stock_buft != NULL ? "CPU_REPACK buffer type (as llama.cpp loads them)" :
           stock_repack ? "plain rows (this build's CPU_REPACK does not take this type, as llama.cpp finds)" : "plain rows (-K plain)");
    printf("layout: %s\n\n", layouts == 1 ? "rows (the file's)" : layouts == 2 ? "column-major" :
           "rows (the file's), then column-major (C)");
    char hdr[2048];
    int  hl = 0;
    for (int k = 1; k < nconf; ++k) {
        const double sp = conf_sparsity(k);
        const char * tag = layouts == 3 && conf_cm(k) ? " C" : "";
        if (sp < 0.0) {
            hl += snprintf(hdr + hl, sizeof(hdr) - hl, " zz%s dense |", tag);
        } else {
            hl += snprintf(hdr + hl, sizeof(hdr) - hl, " zz%s %d%% |", tag, (int) lround(100*sp));
        }
    }
    // the main table: each zigzag column followed by its ratio
    printf("| m x n | stock |");
    for (int k = 1; k < nconf; ++k) {
        const double sp = conf_sparsity(k);
        const char * tag = layouts == 3 && conf_cm(k) ? " C" : "";
        if (sp < 0.0) printf(" zz%s dense | ratio |", tag); else printf(" zz%s %d%% | ratio |", tag, (int) lround(100*sp));
    }
    printf(" idx op |\n|---|---|");
    for (int k = 1; k < nconf; ++k) {
        printf("---|---|");
    }
    printf("---|\n");
    fflush(stdout);

    const int n_shapes = shape_set == 2 ? 1 : 3; // -S 2: 4096x4096 only (profiling)
    const int n_runs   = n_procs > 0 ? n_procs : 1;
    static double t_all[MAX_CONF][MAX_PROCS*MAX_REPS];
    static double t_proc[3][MAX_PROCS][MAX_CONF]; // per process (or the one run): its fastest/median
    static long   preempt[3][MAX_PROCS][2];        // stock's process preemptions, zigzag's
    char checks[3][512];
    int  failures = 0;
    for (int si = 0; si < n_shapes; ++si) {
        const int64_t m = shapes[si][0];
        const int64_t n = shapes[si][1];

        const int64_t bk = ggml_blck_size(wtype);
        const size_t wbytes = ggml_row_size(wtype, bk*n)*(m/bk);
        const int    copies = n_copies_for(wbytes, cold);
        GGML_ASSERT(copies <= 64);

        struct zz_bench b;
        memset(&b, 0, sizeof(b));
        b.m      = m;
        b.n      = n;
        b.copies = copies;
        b.w      = malloc(wbytes*copies);
        b.x      = malloc(sizeof(float)*n);
        b.y      = malloc(sizeof(float)*m);
        for (int64_t j = 0; j < n; ++j) {
            b.x[j] = rng_normal();
        }
        struct stock_bench sb;
        stock_init(&sb, m, n, copies, b.x);
        fill_random_blocks(wtype, (char *) b.w + wbytes, m*n/bk*(copies - 1));
        struct check_ref cr;
        check_ref_init(&cr, &sb, &b); // fills copy 0 of both sides
        stock_graphs(&sb, n_threads, stock_buft);
        for (int c = 0; c < copies; ++c) {
            b.wcopy[c] = mk(wtype, bk*n, m/bk, ggml_row_size(wtype, bk*n), (char *) b.w + c*wbytes);
        }
        b.w_cm = NULL;
        if (layouts & 2) {
            b.w_cm = malloc(wbytes*copies);
            for (int c = 0; c < copies; ++c) {
                ggml_sparse_zz_to_colmajor(wtype, n, m/bk, (char *) b.w + c*wbytes, (char *) b.w_cm + c*wbytes);
                b.wcopy_cm[c] = mk(wtype, bk*n, m/bk, ggml_row_size(wtype, bk*n), (char *) b.w_cm + c*wbytes);
                ggml_sparse_zz_set_layout(&b.wcopy_cm[c], GGML_SPARSE_ZZ_LAYOUT_COLS);
            }
        }
        b.wt = b.wcopy[0];
        b.xt = mk(GGML_TYPE_F32, n, 1, sizeof(float)*n, b.x);
        b.wsize = 64*1024*1024;
        b.wdata = malloc(b.wsize);

        struct side_out * os = side_out_new(m); // stock's outputs (or both sides' with -P 0)
        struct side_out * oz = side_out_new(m);
        float * y_stock = malloc(sizeof(float)*m);
        double t_idx = 0.0;
        for (int p = 0; p < n_runs; ++p) {
            if (n_procs == 0) {
                side_run(&sb, &b, true, true, n_threads, reps, os);
                memcpy(oz, os, sizeof(struct side_out) + sizeof(float)*MAX_CONF*m);
            } else {
                // alternate which side goes first, so a drift in machine load hits both alike
                for (int h = 0; h < 2; ++h) {
                    const bool stock_now = (h == 0) == (p % 2 == 0);
                    side_run_forked(&sb, &b, stock_now, !stock_now, n_threads, reps, stock_now ? os : oz);
                }
            }
            memcpy(y_stock, os->y, sizeof(float)*m);
            check_side(&cr, os, true, false, NULL, m);
            check_side(&cr, oz, false, true, y_stock, m);
            for (int k = 0; k < nconf; ++k) {
                const double * tk = k == 0 ? os->t[0] : oz->t[k];
                memcpy(&t_all[k][p*reps], tk, sizeof(double)*reps);
                double tmp[MAX_REPS];
                memcpy(tmp, tk, sizeof(double)*reps);
                t_proc[si][p][k] = median(tmp, reps);
            }
            t_idx = oz->t_idx;
            preempt[si][p][0] = os->preempt;
            preempt[si][p][1] = oz->preempt;
        }
        double tm[MAX_CONF];
        for (int k = 0; k < nconf; ++k) {
            tm[k] = median(t_all[k], n_runs*reps);
        }
        printf("| %lldx%lld | %.1f |", (long long) m, (long long) n, tm[0]);
        for (int k = 1; k < nconf; ++k) {
            printf(" %.1f | %.2f |", tm[k], tm[0]/tm[k]);
        }
        printf(" %.1f |\n", t_idx);
        fflush(stdout);
        char lay[32];
        snprintf(lay, sizeof(lay), "%.2g", cr.max_layout);
        snprintf(checks[si], sizeof(checks[si]),
                 "%lldx%lld: %d process(es) of each side checked on copy 0: stock vs its dequantized weights rel err <= %.2g, "
                 "zigzag (every column) vs its own <= %.2g, stock vs zigzag dense <= %.2g, both vs the fp32 weights <= %.2g%s%s%s",
                 (long long) m, (long long) n, n_runs, cr.max_stock, cr.max_zz, cr.max_cross, cr.max_fp32,
                 layouts == 3 ? ", column-major vs row layout <= " : "", layouts == 3 ? lay : "",
                 cr.failures ? " (FAILED, see stderr)" : "");
        failures += cr.failures;

        free(y_stock);
        side_out_free(os, m);
        side_out_free(oz, m);
        check_ref_free(&cr);
        stock_free(&sb);
        free(b.w); free(b.w_cm); free(b.x); free(b.y); free(b.wdata);
    }

    if (n_procs > 0) {
        // each process's own figure: the spread across processes (machine-load swings) next to the pooled one
        printf("\nper process (%s of its %d rounds; row p: the p-th stock process and the p-th zigzag process; preempt: the "
               "process's involuntary context switches during its timed rounds, ~0 when nothing else ran on the cores):\n\n",
               use_min ? "fastest" : "median", reps);
        printf("| m x n | p | stock |%s preempt stock | preempt zz |\n|---|---|---|", hdr);
        for (int k = 1; k < nconf + 2; ++k) {
            printf("---|");
        }
        printf("\n");
        for (int si = 0; si < n_shapes; ++si) {
            for (int p = 0; p < n_runs; ++p) {
                printf("| %lldx%lld | %d |", (long long) shapes[si][0], (long long) shapes[si][1], p);
                for (int k = 0; k < nconf; ++k) {
                    printf(" %.1f |", t_proc[si][p][k]);
                }
                printf(" %ld | %ld |\n", preempt[si][p][0], preempt[si][p][1]);
            }
        }
    }
    printf("\noutputs:\n");
    for (int si = 0; si < n_shapes; ++si) {
        printf("- %s\n", checks[si]);
    }
    return failures ? 1 : 0;
}
