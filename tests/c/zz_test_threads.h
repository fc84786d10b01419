// llama-sparse: test/bench-only stand-in for ggml-cpu's threadpool, to run the sparse CPU ops on nth
// real threads without a ggml graph. The op sources are compiled with -Dggml_barrier=zz_test_barrier,
// so the stock libggml-cpu (whose ggml_barrier only works inside its own threadpool) is left alone.
#pragma once

#include "ggml-cpu-impl.h"
#include "ggml-sparse.h"
#include "ggml-sparse-cpu.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define ZZ_TEST_MAX_THREADS 16

// defined in the fork's ggml-base (ggml-sparse.c), which the stock libraries linked here lack:
// the same accessor, reading the stats pointer the graph builder keeps in op_params[2..3]
struct ggml_sparse_stats * ggml_sparse_idx_get_stats(const struct ggml_tensor * idx) {
    struct ggml_sparse_stats * stats;
    memcpy(&stats, &idx->op_params[2], sizeof(stats));
    return stats;
}

typedef void (*zz_test_op_fn)(const struct ggml_compute_params * params, struct ggml_tensor * dst);

// stands in for struct ggml_threadpool: a sense-free spinning barrier plus a persistent worker set
struct zz_test_pool {
    int          nth;
    atomic_int   n_barrier;
    atomic_int   n_passed;

    // persistent workers (bench): a new generation starts a job, workers report done through n_done
    pthread_t     workers[ZZ_TEST_MAX_THREADS];
    atomic_int    generation;
    atomic_int    n_done;
    atomic_bool   stop;
    zz_test_op_fn fn;
    struct ggml_tensor * dst;
    void        * wdata;
    size_t        wsize;
    bool          use_ref;
};

void zz_test_barrier(struct ggml_threadpool * tp) {
    struct zz_test_pool * pool = (struct zz_test_pool *) tp;
    if (pool->nth == 1) {
        return;
    }
    const int passed = atomic_load(&pool->n_passed);
    if (atomic_fetch_add(&pool->n_barrier, 1) == pool->nth - 1) {
        atomic_store(&pool->n_barrier, 0);
        atomic_fetch_add(&pool->n_passed, 1);
        return;
    }
    int spins = 0;
    while (atomic_load(&pool->n_passed) == passed) {
        // yield now and then: tests run more threads than cores
        if (++spins > 1000) {
            sched_yield();
            spins = 0;
        }
    }
}

// zigzag weight from an m x n fp32 matrix wf (rows of n): block-row r holds W[rB:(r+1)B, :]^T quantized as n rows
// of B values, into out (m/B block-rows of n blocks)
static void zz_test_quantize_zigzag(enum ggml_type type, int64_t m, int64_t n, const float * wf, void * out) {
    const int64_t bk  = ggml_blck_size(type);
    const size_t  rsz = ggml_row_size(type, bk)*n;
    float * tmp = malloc(sizeof(float)*bk*n);
    for (int64_t r = 0; r < m/bk; ++r) {
        for (int64_t j = 0; j < n; ++j) {
            for (int64_t i = 0; i < bk; ++i) {
                tmp[j*bk + i] = wf[(r*bk + i)*n + j];
            }
        }
        ggml_quantize_chunk(type, tmp, (char *) out + r*rsz, 0, n, bk, NULL);
    }
    free(tmp);
}

// a 2-D tensor header over caller-owned data (rows nb1 bytes apart)
static struct ggml_tensor zz_test_tensor_2d(enum ggml_type type, int64_t ne0, int64_t ne1, size_t nb1, void * data) {
    struct ggml_tensor t;
    memset(&t, 0, sizeof(t));
    t.type  = type;
    t.ne[0] = ne0; t.ne[1] = ne1; t.ne[2] = 1; t.ne[3] = 1;
    t.nb[0] = ggml_type_size(type);
    t.nb[1] = nb1;
    t.nb[2] = nb1*ne1;
    t.nb[3] = t.nb[2];
    t.data  = data;
    return t;
}

static void zz_test_run_one(struct zz_test_pool * pool, int ith) {
    struct ggml_compute_params params = {
        /*.ith        =*/ ith,
        /*.nth        =*/ pool->nth,
        /*.wsize      =*/ pool->wsize,
        /*.wdata      =*/ pool->wdata,
        /*.threadpool =*/ (struct ggml_threadpool *) pool,
        /*.use_ref    =*/ pool->use_ref,
    };
    pool->fn(&params, pool->dst);
}

struct zz_test_worker_arg {
    struct zz_test_pool * pool;
    int ith;
};

static void * zz_test_worker(void * arg) {
    struct zz_test_worker_arg * wa = arg;
    struct zz_test_pool * pool = wa->pool;
    int seen = 0;
    for (;;) {
        int spins = 0;
        while (atomic_load(&pool->generation) == seen && !atomic_load(&pool->stop)) {
            if (++spins > 20000) {
                sched_yield();
                spins = 0;
            }
        }
        if (atomic_load(&pool->stop)) {
            break;
        }
        seen = atomic_load(&pool->generation);
        zz_test_run_one(pool, wa->ith);
        atomic_fetch_add(&pool->n_done, 1);
    }
    return NULL;
}

static struct zz_test_worker_arg zz_test_worker_args[ZZ_TEST_MAX_THREADS];

static void zz_test_pool_init(struct zz_test_pool * pool, int nth) {
    pool->nth = nth;
    atomic_init(&pool->n_barrier, 0);
    atomic_init(&pool->n_passed, 0);
    atomic_init(&pool->generation, 0);
    atomic_init(&pool->n_done, 0);
    atomic_init(&pool->stop, false);
    for (int i = 1; i < nth; ++i) {
        zz_test_worker_args[i].pool = pool;
        zz_test_worker_args[i].ith  = i;
        pthread_create(&pool->workers[i], NULL, zz_test_worker, &zz_test_worker_args[i]);
    }
}

static void zz_test_pool_free(struct zz_test_pool * pool) {
    atomic_store(&pool->stop, true);
    for (int i = 1; i < pool->nth; ++i) {
        pthread_join(pool->workers[i], NULL);
    }
}

// runs fn on every thread of the pool (the caller is thread 0) and waits for all of them
static void zz_test_pool_run(struct zz_test_pool * pool, zz_test_op_fn fn, struct ggml_tensor * dst,
                             void * wdata, size_t wsize, bool use_ref) {
    pool->fn      = fn;
    pool->dst     = dst;
    pool->wdata   = wdata;
    pool->wsize   = wsize;
    pool->use_ref = use_ref;
    atomic_store(&pool->n_done, 0);
    atomic_fetch_add(&pool->generation, 1);
    zz_test_run_one(pool, 0);
    int spins = 0;
    while (atomic_load(&pool->n_done) != pool->nth - 1) {
        if (++spins > 1000) {
            sched_yield();
            spins = 0;
        }
    }
}

// runs one op on nth threads with its work buffer filled with garbage: kernels must not read what they did not write
static void zz_test_run_op(zz_test_op_fn fn, struct ggml_tensor * dst, int nth, bool use_ref) {
    const size_t wsize = ggml_sparse_cpu_work_size(dst, nth);
    void * wdata = wsize ? malloc(wsize) : NULL;
    if (wdata) {
        memset(wdata, 0xA5, wsize);
    }
    struct zz_test_pool pool;
    zz_test_pool_init(&pool, nth);
    zz_test_pool_run(&pool, fn, dst, wdata, wsize, use_ref);
    zz_test_pool_free(&pool);
    free(wdata);
}
