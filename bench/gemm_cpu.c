// llama-sparse: CPU prefill GEMM microbenchmark. Stock ggml mul_mat (CPU backend, ggml graph, weights in
// CPU_REPACK as llama.cpp loads them, x quantized inside) against zigzag MUL_MAT_ZZ dense, T tokens at once
// (T > GGML_SPARSE_MAX_BATCH: the prefill path; smaller T times the decode GEMV dense). Prints a markdown table (ratio = stock time / zigzag time).
// usage: gemm_cpu [-t n_threads] [-r rounds] [-P procs] [-T tokens] [-q q4_k|q6_k|q8_0] [-S 0|1] [-L rows|cols]
// -L cols: zigzag weights column-major, the layout llama-sparse gives Q4_K/Q8_0/Q4_0 weights on x86 (decode and prefill).
// -S 1: SmolLM2-135M shapes instead of Llama-2-7B's. Each side runs in its own processes, procs of each,
// alternating (stock, zigzag, zigzag, stock, ...), so neither side's spinning threads slow the other's calls.
// Correctness: both sides quantize one random fp32 matrix (stock: rows; zigzag: block columns). Zigzag's
// output is checked against fp64 products with its own dequantized weights, and against stock's; failures exit 1.
#include "ggml.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml-cpu-impl.h"
#include "ggml-sparse.h"
#include "ggml-sparse-cpu.h"
#include "zz_test_threads.h"
#define ZZ_TEST_SEED 0x9e3779b97f4a7c15ULL
#include "bench_util.h"
#include "bench_stock.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_ROUNDS 100

struct side_out {
    double t[MAX_ROUNDS];
    int    ok;
    float  y[]; // [T][m]
};

struct setup {
    enum ggml_type type;
    int64_t m, n, nt;
    int     n_threads, rounds;
    float * x;    // [nt][n]
    void  * wzz;  // zigzag blocks, m/B block-rows of n blocks
    bool    cm;   // wzz column-major (GGML_SPARSE_ZZ_LAYOUT_COLS), as llama-sparse lays out CPU decode weights
    struct ggml_context * ctx; // stock: plain rows (w), x
    struct ggml_tensor  * w;
};

static void run_stock(const struct setup * s, struct side_out * o) {
    ggml_backend_buffer_type_t buft = stock_repack_buft(s->type, s->n);
    struct ggml_init_params ip = { ggml_tensor_overhead() + 1024, NULL, true };
    struct ggml_context * ctx_r = ggml_init(ip);
    struct ggml_tensor * w = s->w;
    ggml_backend_buffer_t buf = NULL;
    if (buft != NULL) {
        w   = ggml_new_tensor_2d(ctx_r, s->type, s->n, s->m);
        buf = ggml_backend_alloc_ctx_tensors_from_buft(ctx_r, buft);
        GGML_ASSERT(buf != NULL);
        ggml_backend_tensor_set(w, s->w->data, 0, ggml_nbytes(s->w));
    }
    struct ggml_tensor * x = ggml_new_tensor_2d(s->ctx, GGML_TYPE_F32, s->n, s->nt);
    memcpy(x->data, s->x, sizeof(float)*s->n*s->nt);
    struct ggml_cgraph * gf = ggml_new_graph(s->ctx);
    struct ggml_tensor * y  = ggml_mul_mat(s->ctx, w, x);
    ggml_build_forward_expand(gf, y);
    struct ggml_cplan plan = ggml_graph_plan(gf, s->n_threads, NULL);
    uint8_t * work = malloc(plan.work_size + 1);
    plan.work_data = work;
    for (int i = -2; i < s->rounds; ++i) {
        const double t0 = now_us();
        ggml_graph_compute(gf, &plan);
        if (i >= 0) {
            o->t[i] = now_us() - t0;
        }
    }
    memcpy(o->y, y->data, sizeof(float)*s->m*s->nt);
    free(work);
    if (buf != NULL) {
        ggml_backend_buffer_free(buf);
    }
    ggml_free(ctx_r);
}

static void run_zz(const struct setup * s, struct side_out * o) {
    const int64_t bk = ggml_blck_size(s->type);
    struct ggml_tensor wt = zz_test_tensor_2d(s->type, bk*s->n, s->m/bk, ggml_row_size(s->type, bk*s->n), s->wzz);
    if (s->cm) {
        ggml_sparse_zz_set_layout(&wt, GGML_SPARSE_ZZ_LAYOUT_COLS);
    }
    struct ggml_tensor xt = zz_test_tensor_2d(GGML_TYPE_F32, s->n, s->nt, sizeof(float)*s->n, s->x);
    struct ggml_tensor yt = zz_test_tensor_2d(GGML_TYPE_F32, s->m, s->nt, sizeof(float)*s->m, o->y);
    yt.src[0] = &wt;
    yt.src[1] = &xt;
    const size_t wsize = ggml_sparse_cpu_work_size(&yt, s->n_threads);
    void * wdata = malloc(wsize + 1);
    struct zz_test_pool pool;
    zz_test_pool_init(&pool, s->n_threads);
    for (int i = -2; i < s->rounds; ++i) {
        const double t0 = now_us();
        zz_test_pool_run(&pool, ggml_sparse_cpu_forward_mul_mat_zz, &yt, wdata, wsize, false);
        if (i >= 0) {
            o->t[i] = now_us() - t0;
        }
    }
    zz_test_pool_free(&pool);
    free(wdata);
}

// one side in a child process (its threads exit with it); outputs in shared memory
static void run_forked(const struct setup * s, bool stock, struct side_out * o) {
    o->ok = 0;
    fflush(stdout);
    const pid_t pid = fork();
    GGML_ASSERT(pid >= 0);
    if (pid == 0) {
        if (stock) run_stock(s, o); else run_zz(s, o);
        o->ok = 1;
        _exit(0);
    }
    bench_wait_side(pid, &o->ok, "gemm_cpu", stock ? "stock" : "zigzag");
}

int main(int argc, char ** argv) {
    int n_threads = 2, rounds = 5, n_procs = 2, shape_set = 0;
    bool cm = false;
    int64_t nt = 128;
    enum ggml_type type = GGML_TYPE_Q4_K;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "-t") == 0) n_threads = atoi(argv[i + 1]);
        if (strcmp(argv[i], "-r") == 0) rounds    = atoi(argv[i + 1]);
        if (strcmp(argv[i], "-P") == 0) n_procs   = atoi(argv[i + 1]);
        if (strcmp(argv[i], "-T") == 0) nt        = atoll(argv[i + 1]);
        if (strcmp(argv[i], "-q") == 0) type      = strcmp(argv[i + 1], "q8_0") == 0 ? GGML_TYPE_Q8_0 :
                                                    strcmp(argv[i + 1], "q6_k") == 0 ? GGML_TYPE_Q6_K : GGML_TYPE_Q4_K;
        if (strcmp(argv[i], "-S") == 0) shape_set = atoi(argv[i + 1]);
        if (strcmp(argv[i], "-L") == 0) cm        = strcmp(argv[i + 1], "cols") == 0;
    }
    rounds  = rounds < 1 ? 1 : rounds > MAX_ROUNDS ? MAX_ROUNDS : rounds;
    n_procs = n_procs < 1 ? 1 : n_procs;
    if (nt < 1) {
        fprintf(stderr, "gemm_cpu: -T must be at least 1\n");
        return 2;
    }
    // the parent never enters ggml_graph_compute: libgomp's threads do not survive fork
    ggml_cpu_init();

    const int64_t shapes_7b[3][2]   = { { 4096, 4096 }, { 11008, 4096 }, { 4096, 11008 } };
    const int64_t shapes_smol[3][2] = { { 576, 576 }, { 1536, 576 }, { 576, 1536 } };
    const int64_t (*shapes)[2] = shape_set == 1 ? shapes_smol : shapes_7b;
    const ggml_backend_buffer_type_t buft = stock_repack_buft(type, shapes[0][1]);

    // the path ggml-sparse-cpu.c takes (zz_slice_tokens: slices on column-major weights up to the bound)
    const bool sliced = cm && nt <= ggml_sparse_zz_cpu_slice_max(type);
    printf("zigzag path: %s%s\n", nt <= GGML_SPARSE_MAX_BATCH ? "decode GEMV, dense (T <= GGML_SPARSE_MAX_BATCH)" :
           sliced ? "decode kernel over token slices" :
           ggml_sparse_zz_cpu_gemm_int16(type) ? "prefill GEMM (int16 panels)" : "prefill GEMM (fp32 panels)",
           cm && ggml_sparse_zz_cpu_colmajor_fast(type) ? ", column-major weights (-L cols)" : "");
    printf("threads %d, T = %lld tokens, %s, fastest of %d processes x %d calls per side (alternating stock, zigzag, "
           "zigzag, stock, ...), times in ms; stock weights %s; ratio = stock time / zigzag time\n\n",
           n_threads, (long long) nt, ggml_type_name(type), n_procs, rounds,
           buft != NULL ? "in CPU_REPACK (as llama.cpp loads them)" : "in plain rows (CPU_REPACK does not take this type here, as llama.cpp finds)");
    printf("| m x n | stock | zigzag | ratio | stock GFLOP/s | zigzag GFLOP/s | zz err vs own fp64 | zz vs stock |\n");
    printf("|---|---|---|---|---|---|---|---|\n");
    fflush(stdout);

    int failures = 0;
    for (int si = 0; si < 3; ++si) {
        struct setup s;
        s.type = type; s.m = shapes[si][0]; s.n = shapes[si][1]; s.nt = nt;
        s.n_threads = n_threads; s.rounds = rounds;
        const int64_t m = s.m, n = s.n, bk = ggml_blck_size(type);
        const size_t  bs = ggml_type_size(type);

        float * wf = malloc(sizeof(float)*m*n);
        for (int64_t i = 0; i < m*n; ++i) {
            wf[i] = 0.02f*rng_normal();
        }
        s.x = malloc(sizeof(float)*n*nt);
        for (int64_t i = 0; i < n*nt; ++i) {
            s.x[i] = rng_normal();
        }
        struct ggml_init_params ip = { ggml_row_size(type, n)*m + sizeof(float)*(n + m)*nt + 3*ggml_tensor_overhead() + ggml_graph_overhead() + (1 << 20), NULL, false };
        s.ctx = ggml_init(ip);
        s.w   = ggml_new_tensor_2d(s.ctx, type, n, m);
        ggml_quantize_chunk(type, wf, s.w->data, 0, m, n, NULL);
        s.wzz = malloc(bs*n*(m/bk));
        zz_test_quantize_zigzag(type, m, n, wf, s.wzz);
        s.cm = cm && ggml_sparse_zz_cpu_colmajor_fast(type);
        if (s.cm) {
            void * rows = s.wzz;
            s.wzz = malloc(bs*n*(m/bk));
            ggml_sparse_zz_to_colmajor(type, n, m/bk, rows, s.wzz);
            free(rows);
        }

        const size_t osz = sizeof(struct side_out) + sizeof(float)*m*nt;
        struct side_out * os = mmap(NULL, osz, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        struct side_out * oz = mmap(NULL, osz, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        GGML_ASSERT(os != MAP_FAILED && oz != MAP_FAILED);
        double best_s = INFINITY, best_z = INFINITY;
        for (int p = 0; p < n_procs; ++p) {
            for (int h = 0; h < 2; ++h) {
                const bool stock = (h == 0) == (p % 2 == 0);
                run_forked(&s, stock, stock ? os : oz);
            }
            for (int i = 0; i < rounds; ++i) {
                best_s = fmin(best_s, os->t[i]);
                best_z = fmin(best_z, oz->t[i]);
            }
        }

        // fp64 reference on zigzag's dequantized weights, first 4 tokens
        const int64_t ntc = nt < 4 ? nt : 4;
        double * ref = calloc(m*ntc, sizeof(double));
        float  * wd  = malloc(sizeof(float)*bk);
        for (int64_t r = 0; r < m/bk; ++r) {
            for (int64_t j = 0; j < n; ++j) {
                ggml_get_type_traits(type)->to_float((const char *) s.wzz + (s.cm ? j*(m/bk) + r : r*n + j)*bs, wd, bk);
                for (int64_t t = 0; t < ntc; ++t) {
                    const double xv = s.x[t*n + j];
                    for (int64_t i = 0; i < bk; ++i) {
                        ref[t*m + r*bk + i] += xv*wd[i];
                    }
                }
            }
        }
        const double e_own = rel_err_d(oz->y, ref, m*ntc);
        double * ys = malloc(sizeof(double)*m*nt);
        for (int64_t i = 0; i < m*nt; ++i) {
            ys[i] = os->y[i];
        }
        const double e_stock = rel_err_d(oz->y, ys, m*nt);
        // 8-bit activations / coefficients on either side: ~1 %; the weights' different 4-bit blocks add ~10 %
        const bool ok = e_own < 3e-2 && e_stock < 0.25;
        failures += !ok;
        const double gflop = 2.0*m*n*nt*1e-9;
        printf("| %lldx%lld | %.2f | %.2f | %.2f | %.0f | %.0f | %.2g | %.2g%s |\n", (long long) m, (long long) n,
               best_s*1e-3, best_z*1e-3, best_s/best_z, gflop/(best_s*1e-6), gflop/(best_z*1e-6), e_own, e_stock,
               ok ? "" : " FAILED");
        fflush(stdout);
        free(ref); free(wd); free(ys); free(wf); free(s.x); free(s.wzz);
        munmap(os, osz); munmap(oz, osz);
        ggml_free(s.ctx);
    }
    return failures ? 1 : 0;
}
