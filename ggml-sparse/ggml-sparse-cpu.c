// llama-sparse: CPU forward of GGML_OP_SPARSE_IDX and GGML_OP_MUL_MAT_ZZ: op entry points, threading,
// the active-column index, and the scalar reference GEMV (plain C, used by tests and by
// params->use_ref / LLAMA_SPARSE_CPU_REF=1). Fast GEMV kernels live in zigzag-gemv-*.c, the
// prefill GEMM in zigzag-gemm.c.
#define GGML_COMMON_DECL_C
#include "ggml-common.h"

#include "ggml-sparse-cpu.h"
#include "ggml-sparse.h"
#include "ggml-cpu-impl.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

// below this many x values the index is built by thread 0 alone: a barrier costs more than the scan
#define ZZ_IDX_PAR_MIN (16*1024)

// floats of prefill GEMM panel per thread (dequantized weight columns reused by every token): 512 KiB, 512
// Q4_K columns; 32 KiB made per-tile overheads (y round trips, calls) cost 40 % on AVX-512 (bench/gemm_cpu.sh)
#ifndef ZZ_GEMM_PANEL_FLOATS
#define ZZ_GEMM_PANEL_FLOATS (128*1024)
#endif

static void * zz_align64(void * p) {
    return (void *) (((uintptr_t) p + 63) & ~(uintptr_t) 63);
}

static int64_t zz_round16(int64_t v) {
    return (v + 15) & ~(int64_t) 15;
}

//
// reference: dequantization (mirrors ggml-quants.c dequantize_row_*) and GEMV
//

void ggml_sparse_zz_dequant_block(enum ggml_type type, const void * blk, float * out) {
    switch (type) {
        case GGML_TYPE_Q4_0: {
            const block_q4_0 * b = blk;
            const float d = GGML_FP16_TO_FP32(b->d);
            for (int j = 0; j < QK4_0/2; ++j) {
                out[j          ] = ((b->qs[j] & 0x0F) - 8)*d;
                out[j + QK4_0/2] = ((b->qs[j] >>   4) - 8)*d;
            }
        } break;
        case GGML_TYPE_Q8_0: {
            const block_q8_0 * b = blk;
            const float d = GGML_FP16_TO_FP32(b->d);
            for (int j = 0; j < QK8_0; ++j) {
                out[j] = b->qs[j]*d;
            }
        } break;
        case GGML_TYPE_Q4_K: {
            const block_q4_K * b = blk;
            const uint8_t * q = b->qs;
            const float d   = GGML_FP16_TO_FP32(b->d);
            const float min = GGML_FP16_TO_FP32(b->dmin);
            uint8_t sc, m;
            for (int j = 0, is = 0; j < QK_K; j += 64, is += 2) {
                zz_get_scale_min_k4(is + 0, b->scales, &sc, &m);
                const float d1 = d * sc; const float m1 = min * m;
                zz_get_scale_min_k4(is + 1, b->scales, &sc, &m);
                const float d2 = d * sc; const float m2 = min * m;
                for (int l = 0; l < 32; ++l) *out++ = d1 * (q[l] & 0xF) - m1;
                for (int l = 0; l < 32; ++l) *out++ = d2 * (q[l]  >> 4) - m2;
                q += 32;
            }
        } break;
        case GGML_TYPE_Q6_K: {
            const block_q6_K * b = blk;
            const float d = GGML_FP16_TO_FP32(b->d);
            const uint8_t * ql = b->ql;
            const uint8_t * qh = b->qh;
            const int8_t  * sc = b->scales;
            for (int n = 0; n < QK_K; n += 128) {
                for (int l = 0; l < 32; ++l) {
                    const int is = l/16;
                    const int8_t q1 = (int8_t)((ql[l +  0] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                    const int8_t q2 = (int8_t)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                    const int8_t q3 = (int8_t)((ql[l +  0]  >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                    const int8_t q4 = (int8_t)((ql[l + 32]  >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                    out[l +  0] = d * sc[is + 0] * q1;
                    out[l + 32] = d * sc[is + 2] * q2;
                    out[l + 64] = d * sc[is + 4] * q3;
                    out[l + 96] = d * sc[is + 6] * q4;
                }
                out += 128;
                ql  += 64;
                qh  += 32;
                sc  += 8;
            }
        } break;
        default:
            GGML_ABORT("zigzag: unsupported type %s", ggml_type_name(type));
    }
}

// plain axpy per active column on dequantized blocks (block j at wrow + j*cs); the specification the fast
// kernels are tested against
static void zz_gemv_ref(enum ggml_type type, const void * wrow, size_t cs, const int32_t * cols, int64_t k0, int64_t k1,
                        const float * x, int64_t ldx, int nt, float * y, int64_t ldy) {
    const int bk = (int) ggml_blck_size(type);
    float w[QK_K];

    for (int t = 0; t < nt; ++t) {
        for (int i = 0; i < bk; ++i) {
            y[t*ldy + i] = 0.0f;
        }
    }
    for (int64_t k = k0; k < k1; ++k) {
        const int64_t j = cols ? cols[k] : k;
        ggml_sparse_zz_dequant_block(type, (const char *) wrow + j*cs, w);
        for (int t = 0; t < nt; ++t) {
            const float xv = x[t*ldx + j];
            for (int i = 0; i < bk; ++i) {
                y[t*ldy + i] += xv*w[i];
            }
        }
    }
}

static bool zz_use_ref(const struct ggml_compute_params * params) {
    // benign race: every thread computes the same value
    static int env_ref = -1;
    if (env_ref < 0) {
        const char * s = getenv("LLAMA_SPARSE_CPU_REF");
        env_ref = (s != NULL && atoi(s) != 0) ? 1 : 0;
    }
    return params->use_ref || env_ref == 1;
}

static ggml_sparse_zz_gemv_t zz_gemv_fast(enum ggml_type type) {
    ggml_sparse_zz_gemv_t fn = ggml_sparse_zz_gemv_x86(type);
    if (fn == NULL) {
        fn = ggml_sparse_zz_gemv_arm(type);
    }
    return fn;
}

//
// GGML_OP_SPARSE_IDX
//

// keep test shared by LIST and MASK: !(|v| < thr), so a NaN stays active like in the dense product
static inline bool zz_active(float v, float thr) {
    return !(fabsf(v) < thr);
}

// ascending active columns in [j0, j1) of the nt rows of x (row stride ldx floats) into out; returns count
static int64_t zz_idx_scan(const float * x, int64_t ldx, int nt, int64_t j0, int64_t j1, float thr, int32_t * out) {
    int64_t cnt = 0;
    if (thr <= 0.0f) {
        for (int64_t j = j0; j < j1; ++j) {
            out[cnt++] = (int32_t) j;
        }
        return cnt;
    }
    int64_t j = j0;
#if defined(__AVX2__)
    const __m256 vthr = _mm256_set1_ps(thr);
    const __m256 vabs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (; j + 8 <= j1; j += 8) {
        __m256 any = _mm256_setzero_ps();
        for (int t = 0; t < nt; ++t) {
            const __m256 v = _mm256_and_ps(_mm256_loadu_ps(x + t*ldx + j), vabs);
            any = _mm256_or_ps(any, _mm256_cmp_ps(v, vthr, _CMP_NLT_UQ));
        }
        unsigned bits = (unsigned) _mm256_movemask_ps(any);
        while (bits) {
            out[cnt++] = (int32_t) (j + __builtin_ctz(bits));
            bits &= bits - 1;
        }
    }
#endif
    for (; j < j1; ++j) {
        bool on = false;
        for (int t = 0; t < nt; ++t) {
            on = on || zz_active(x[t*ldx + j], thr);
        }
        if (on) {
            out[cnt++] = (int32_t) j;
        }
    }
    return cnt;
}

static void zz_idx_mask_row(const float * x, float * y, int64_t j0, int64_t j1, float thr) {
    int64_t j = j0;
#if defined(__AVX2__)
    const __m256 vthr = _mm256_set1_ps(thr);
    const __m256 vabs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (; j + 8 <= j1; j += 8) {
        const __m256 v = _mm256_loadu_ps(x + j);
        const __m256 keep = _mm256_cmp_ps(_mm256_and_ps(v, vabs), vthr, _CMP_NLT_UQ);
        _mm256_storeu_ps(y + j, _mm256_and_ps(v, keep));
    }
#endif
    for (; j < j1; ++j) {
        y[j] = zz_active(x[j], thr) ? x[j] : 0.0f;
    }
}

static size_t zz_idx_work_size(int64_t n, int n_tasks) {
    // staging copy of the list + one cache line per thread for its count
    return n*sizeof(int32_t) + (size_t) (n_tasks + 2)*64;
}

// performance counters attached by the graph builder (llama_sparse_get_stats)
static void zz_idx_count(const struct ggml_tensor * dst, int64_t n, int64_t active) {
    struct ggml_sparse_stats * stats = ggml_sparse_idx_get_stats(dst);
    if (stats != NULL) {
        __atomic_fetch_add(&stats->n_lists,  1,                  __ATOMIC_RELAXED);
        __atomic_fetch_add(&stats->n_cols,   (uint64_t) n,       __ATOMIC_RELAXED);
        __atomic_fetch_add(&stats->n_active, (uint64_t) active,  __ATOMIC_RELAXED);
    }
}

void ggml_sparse_cpu_forward_idx(const struct ggml_compute_params * params, struct ggml_tensor * dst) {
    const struct ggml_tensor * src = dst->src[0];
    GGML_ASSERT(src->type == GGML_TYPE_F32 && src->nb[0] == sizeof(float));
    GGML_ASSERT(src->nb[1] % sizeof(float) == 0);

    float thr;
    memcpy(&thr, &dst->op_params[0], sizeof(float));
    const int32_t mode = dst->op_params[1];

    const int     ith = params->ith;
    const int     nth = params->nth;
    const int64_t n   = src->ne[0];

    if (mode == GGML_SPARSE_IDX_MASK) {
        GGML_ASSERT(dst->type == GGML_TYPE_F32 && dst->nb[0] == sizeof(float));
        GGML_ASSERT(ggml_are_same_shape(src, dst));
        const int64_t j0 = n*ith/nth;
        const int64_t j1 = n*(ith + 1)/nth;
        for (int64_t i3 = 0; i3 < src->ne[3]; ++i3) {
            for (int64_t i2 = 0; i2 < src->ne[2]; ++i2) {
                for (int64_t i1 = 0; i1 < src->ne[1]; ++i1) {
                    const float * xr = (const float *) ((const char *) src->data + i1*src->nb[1] + i2*src->nb[2] + i3*src->nb[3]);
                    float       * yr = (float       *) ((char       *) dst->data + i1*dst->nb[1] + i2*dst->nb[2] + i3*dst->nb[3]);
                    zz_idx_mask_row(xr, yr, j0, j1, thr);
                }
            }
        }
        return;
    }

    GGML_ASSERT(mode == GGML_SPARSE_IDX_LIST);
    GGML_ASSERT(dst->type == GGML_TYPE_I32 && dst->ne[0] == n + 1);
    GGML_ASSERT(src->ne[1] <= GGML_SPARSE_MAX_BATCH && src->ne[2] == 1 && src->ne[3] == 1);
    GGML_ASSERT(n <= INT32_MAX);

    const int       nt  = (int) src->ne[1];
    const int64_t   ldx = src->nb[1]/sizeof(float);
    const float   * x   = (const float *) src->data;
    int32_t       * out = (int32_t *) dst->data;

    const bool par = nth > 1 && n*nt >= ZZ_IDX_PAR_MIN && params->wdata != NULL &&
                     params->wsize >= zz_idx_work_size(n, nth);
    if (!par) {
        if (ith == 0) {
            out[n] = (int32_t) zz_idx_scan(x, ldx, nt, 0, n, thr, out);
            zz_idx_count(dst, n, out[n]);
        }
        return;
    }

    // per-thread scan of a column range into a staging list, prefix sum of the counts, compaction
    int32_t * counts = (int32_t *) zz_align64(params->wdata);
    int32_t * stage  = counts + (nth + 1)*16;
    const int64_t j0 = n*ith/nth;
    const int64_t j1 = n*(ith + 1)/nth;

    const int64_t cnt = zz_idx_scan(x, ldx, nt, j0, j1, thr, stage + j0);
    counts[ith*16] = (int32_t) cnt;

    ggml_barrier(params->threadpool);

    int64_t off = 0;
    for (int i = 0; i < ith; ++i) {
        off += counts[i*16];
    }
    memcpy(out + off, stage + j0, cnt*sizeof(int32_t));
    if (ith == nth - 1) {
        out[n] = (int32_t) (off + cnt);
        zz_idx_count(dst, n, off + cnt);
    }
}

//
// GGML_OP_MUL_MAT_ZZ
//

struct zz_shape {
    enum ggml_type type;
    int      bk;   // block size = outputs per block-row
    size_t   bs;   // bytes per block
    int64_t  n;    // input columns
    int64_t  m;    // outputs
    int64_t  nr;   // block-rows
    int64_t  nt;   // tokens
    int      layout; // GGML_SPARSE_ZZ_LAYOUT_*
};

static struct zz_shape zz_shape_of(const struct ggml_tensor * node) {
    const struct ggml_tensor * w = node->src[0];
    struct zz_shape s;
    s.type = w->type;
    s.bk   = (int) ggml_blck_size(w->type);
    s.bs   = ggml_type_size(w->type);
    s.n    = w->ne[0]/s.bk;
    s.nr   = w->ne[1];
    s.m    = s.nr*s.bk;
    s.nt   = node->src[1]->ne[1];
    s.layout = ggml_sparse_zz_layout(w);
    return s;
}

// first block of block-row r and the byte step between its columns, in either layout
static const char * zz_block_row(const struct zz_shape * s, const char * w, size_t wnb1, int64_t r, size_t * cs) {
    if (s->layout == GGML_SPARSE_ZZ_LAYOUT_COLS) {
        *cs = s->nr*s->bs;
        return w + r*s->bs;
    }
    *cs = s->bs;
    return w + r*wnb1;
}

bool ggml_sparse_zz_cpu_colmajor_fast(enum ggml_type type) {
    return ggml_sparse_zz_gemv_cm_x86(type) != NULL || ggml_sparse_zz_gemv_rows_x86(type) != NULL;
}

void ggml_sparse_zz_to_colmajor(enum ggml_type type, int64_t n, int64_t nr, const void * src, void * dst) {
    const size_t bs = ggml_type_size(type);
    // block-rows in tiles of a few, so both sides are read and written in runs of at least a few lines
    for (int64_t r0 = 0; r0 < nr; r0 += 8) {
        const int64_t r1 = r0 + 8 < nr ? r0 + 8 : nr;
        for (int64_t j = 0; j < n; ++j) {
            for (int64_t r = r0; r < r1; ++r) {
                memcpy((char *) dst + (j*nr + r)*bs, (const char *) src + (r*n + j)*bs, bs);
            }
        }
    }
}

// column-major: per thread a partial y (none with one thread) and the kernel's min-term scratch
static size_t zz_gemv_work_size(const struct zz_shape * s, int n_tasks) {
    if (s->layout == GGML_SPARSE_ZZ_LAYOUT_COLS) {
        return (size_t) n_tasks*(zz_round16(s->m*s->nt) + zz_round16(s->nt*s->nr*8))*sizeof(float) + 64;
    }
    return n_tasks > 1 ? (size_t) n_tasks*zz_round16(s->m*s->nt)*sizeof(float) + 64 : 0;
}

bool ggml_sparse_zz_cpu_gemm_int16(enum ggml_type type) {
    const int64_t need = ggml_sparse_zz_gemm_int16_floats(type);
    return need > 0 && need <= ZZ_GEMM_PANEL_FLOATS;
}

static size_t zz_gemm_work_size(int n_tasks) {
    return (size_t) n_tasks*ZZ_GEMM_PANEL_FLOATS*sizeof(float) + 64 + 64; // panels, alignment, the units' counter
}

int ggml_sparse_zz_cpu_slice_max(enum ggml_type type) {
    static int env_max = -2; // benign race: every thread computes the same value
    if (env_max == -2) {
        const char * e = getenv("LLAMA_SPARSE_CPU_SLICE_MAX");
        env_max = e == NULL ? -1 : atoi(e);
    }
    const int smax = ggml_sparse_zz_cm_slice_max_x86(type); // 0 where the type has no batch kernel
    if (smax == 0 || env_max >= 0) {
        return smax == 0 ? 0 : env_max;
    }
    const int imax = ggml_sparse_zz_gemm_int16_slice_max();
    return ggml_sparse_zz_cpu_gemm_int16(type) && imax < smax ? imax : smax;
}

// prefill with few tokens on a column-major weight: the batch (decode) kernel over token slices where that beats
// the GEMM (ggml_sparse_zz_cpu_slice_max)
static bool zz_slice_tokens(const struct zz_shape * s) {
    return s->nt > GGML_SPARSE_MAX_BATCH && s->layout == GGML_SPARSE_ZZ_LAYOUT_COLS &&
           s->nt <= ggml_sparse_zz_cpu_slice_max(s->type);
}

// balanced token slices of at most GGML_SPARSE_MAX_BATCH tokens
static int64_t zz_n_slices(int64_t nt) {
    return (nt + GGML_SPARSE_MAX_BATCH - 1)/GGML_SPARSE_MAX_BATCH;
}

// the work buffer of the largest slice
static size_t zz_slice_work_size(const struct zz_shape * s, int n_tasks) {
    struct zz_shape ss = *s;
    ss.nt = (s->nt + zz_n_slices(s->nt) - 1)/zz_n_slices(s->nt);
    return zz_gemv_work_size(&ss, n_tasks);
}

// the active list split over threads in whole chunks: this thread's [k0, k1)
static void zz_chunk_range(int64_t count, int ith, int nth, int64_t * k0, int64_t * k1) {
    const int64_t nchunk = (count + GGML_SPARSE_ZZ_CHUNK - 1)/GGML_SPARSE_ZZ_CHUNK;
    *k0 = (nchunk*ith/nth)*GGML_SPARSE_ZZ_CHUNK;
    *k1 = ith == nth - 1 ? count : (nchunk*(ith + 1)/nth)*GGML_SPARSE_ZZ_CHUNK;
}

// LLAMA_SPARSE_CPU_SPLIT: 1 rows, 2 cols, 0 unset (benchmarks)
static int zz_split_env(void) {
    static int env_split = -1; // benign race: every thread computes the same value
    if (env_split < 0) {
        const char * e = getenv("LLAMA_SPARSE_CPU_SPLIT");
        env_split = e == NULL ? 0 : strcmp(e, "rows") == 0 ? 1 : strcmp(e, "cols") == 0 ? 2 : 0;
        if (e != NULL && *e != '\0' && env_split == 0) {
            fprintf(stderr, "llama-sparse: LLAMA_SPARSE_CPU_SPLIT='%s' is not rows or cols; ignored\n", e);
        }
    }
    return env_split;
}

// decode: split block-rows over threads (true) or the active list (false, partial sums + reduction);
// LLAMA_SPARSE_CPU_SPLIT=rows|cols forces one (benchmarks)
static bool zz_split_rows(const struct zz_shape * s, int nth) {
    const int env = zz_split_env();
    if (env != 0) {
        return env == 1;
    }
    return s->nr % nth == 0;
}

// work units that threads take as they finish: thread i starts on unit i, then draws the next from a counter that
// thread 0 sets to nth before a barrier (every thread must call zz_units_start)
static void zz_units_start(const struct ggml_compute_params * params, atomic_int * next) {
    if (params->ith == 0) {
        atomic_store_explicit(next, params->nth, memory_order_relaxed);
    }
    ggml_barrier(params->threadpool);
}

static int64_t zz_units_next(atomic_int * next) {
    return atomic_fetch_add_explicit(next, 1, memory_order_relaxed);
}

// decode on the row layout: block-rows in chunks that threads take as they finish (LLAMA_SPARSE_CPU_ROW_CHUNKS
// chunks per thread, default 4, as ggml's mul_mat; 0: an even static split). A thread slowed down (a busy core of a
// VM) then hands part of its share to the others instead of holding the op up
static int zz_row_chunks(void) {
    static int chunks = -1; // benign race: every thread computes the same value
    if (chunks < 0) {
        const char * e = getenv("LLAMA_SPARSE_CPU_ROW_CHUNKS");
        chunks = e == NULL ? 4 : atoi(e) > 0 ? atoi(e) : 0;
    }
    return chunks;
}

// T > GGML_SPARSE_MAX_BATCH: dense, work units are (block-row, token group) pairs
static void zz_mul_mat_gemm(const struct ggml_compute_params * params, const struct zz_shape * s,
                            const char * wdata0, size_t wnb1, const float * x, int64_t ldx, float * y, int64_t ldy) {
    const int ith = params->ith;
    const int nth = params->nth;

    float * panel;
    float * panel_own = NULL;
    if (params->wdata != NULL && params->wsize >= zz_gemm_work_size(nth)) {
        panel = (float *) zz_align64(params->wdata) + (size_t) ith*ZZ_GEMM_PANEL_FLOATS;
    } else {
        panel = panel_own = malloc(ZZ_GEMM_PANEL_FLOATS*sizeof(float));
        GGML_ASSERT(panel != NULL);
    }

    // 32-row blocks go in pairs of block-rows: 64 outputs, the AVX-512 wide tile's width
    const int64_t rpu = s->bk == 32 && s->nr > 1 ? 2 : 1;
    const int64_t nu  = (s->nr + rpu - 1)/rpu;
    size_t cs;
    const size_t rs = rpu > 1 ? (size_t) (zz_block_row(s, wdata0, wnb1, 1, &cs) - wdata0) : 0; // block-row stride

    // split tokens too when there are few units, so every thread gets work; each split re-dequantizes. The int16
    // GEMM aims at one unit a thread, the fp32 one at 4 (LLAMA_SPARSE_CPU_GEMM_UNITS=N overrides): 16 threads of a
    // 16-core Xeon, int16, 7B shapes, 4 against 1 a thread: 0.25-0.57x stock against 0.45-0.89x at 16 tokens,
    // 0.43-0.86x against 0.60-1.07x at 32, 0.88-1.30x against 0.91-1.29x at 128 (bench/results/cpu_prefill_i16_2026-12-06.md)
    static int env_upt = -2; // benign race: every thread computes the same value
    if (env_upt == -2) {
        const char * e = getenv("LLAMA_SPARSE_CPU_GEMM_UNITS");
        env_upt = e != NULL && atoi(e) > 0 ? atoi(e) : -1;
    }
    // units taken as threads finish, about LLAMA_SPARSE_CPU_GEMM_DYN (default 6; 0: one static unit a thread) a
    // thread where token groups of at least 32 allow it, so a slow core hands work to the others. 16 threads of a
    // 16-core Xeon VM, pp512 of an 8-layer 7B-shaped model: the static split kept the threads busy 70-72 % of the
    // op, 6 a thread 94-95 % (1.27-1.63x the prefill; 2 and 3 less, 8 and 12 no better in both rounds;
    // bench/results/cpu_gemm_dyn_host_2026-12-06.md)
    static int env_dyn = -2; // benign race
    if (env_dyn == -2) {
        const char * e = getenv("LLAMA_SPARSE_CPU_GEMM_DYN");
        env_dyn = e == NULL ? 6 : atoi(e) > 0 ? atoi(e) : 0;
    }
    const int upt = env_upt > 0 ? env_upt : !zz_use_ref(params) && ggml_sparse_zz_cpu_gemm_int16(s->type) ? 1 : 4;
    int64_t ng = 1;
    while (nu*ng < upt*nth && ng*8 < s->nt) {
        ng++;
    }
    if (env_dyn > 0 && nth > 1) {
        // at least env_dyn units a thread where groups of >= 32 tokens allow it, then of the next few counts the
        // one whose last round leaves the fewest threads idle
        int64_t g0 = ng;
        while (nu*g0 < env_dyn*nth && (s->nt + g0)/(g0 + 1) >= 32) {
            g0++;
        }
        double best = -1.0;
        for (int64_t g = g0; g <= g0 + 4 && (g == g0 || (s->nt + g - 1)/g >= 32); ++g) {
            const double eff = (double) (nu*g)/(double) (((nu*g + nth - 1)/nth)*nth);
            if (eff > best + 1e-9) {
                best = eff;
                ng   = g;
            }
        }
    }
    const int64_t tpg = (s->nt + ng - 1)/ng;
    const bool dyn = env_dyn > 0 && nth > 1 && nu*ng > nth && panel_own == NULL;
    atomic_int * next = dyn ? (atomic_int *) (panel + (size_t) (nth - ith)*ZZ_GEMM_PANEL_FLOATS) : NULL; // past the panels
    if (dyn) {
        zz_units_start(params, next);
    }

    for (int64_t u = ith; u < nu*ng; u = dyn ? zz_units_next(next) : u + nth) {
        const int64_t r  = (u/ng)*rpu;
        const int     nb = r + rpu <= s->nr ? (int) rpu : 1;
        const int64_t t0 = (u%ng)*tpg;
        const int64_t t1 = t0 + tpg < s->nt ? t0 + tpg : s->nt;
        if (t0 >= t1) {
            continue;
        }
        const char * wr = zz_block_row(s, wdata0, wnb1, r, &cs);
        ggml_sparse_zz_gemm_block_rows(s->type, wr, cs, rs, nb, s->n, x + t0*ldx, ldx, t1 - t0,
                                       y + t0*ldy + r*s->bk, ldy, panel, ZZ_GEMM_PANEL_FLOATS, !zz_use_ref(params));
    }
    free(panel_own);
}

// sum of the threads' partial outputs (nth of them, pstride floats apart), each thread a disjoint range
static void zz_reduce_partials(const struct ggml_compute_params * params, const struct zz_shape * s,
                               const float * partial0, int64_t pstride, float * y, int64_t ldy) {
    const int ith = params->ith;
    const int nth = params->nth;
    const int64_t n16 = (s->m + 15)/16;
    const int64_t i0  = 16*(n16*ith/nth)       < s->m ? 16*(n16*ith/nth)       : s->m;
    const int64_t i1  = 16*(n16*(ith + 1)/nth) < s->m ? 16*(n16*(ith + 1)/nth) : s->m;
    for (int t = 0; t < (int) s->nt; ++t) {
        float * yt = y + t*ldy;
        for (int64_t i = i0; i < i1; ++i) {
            float sum = 0.0f;
            for (int p = 0; p < nth; ++p) {
                sum += partial0[p*pstride + t*s->m + i];
            }
            yt[i] = sum;
        }
    }
}

// a multi-row kernel over the active list split over threads (whole chunks): each thread covers every block-row
// into its own partial sums (the work buffer), then threads reduce disjoint output ranges. cs: bytes between the
// blocks of a block-row (the row layout: the block size; column-major: a column's run)
static void zz_rows_list_split(const struct ggml_compute_params * params, const struct zz_shape * s,
                               ggml_sparse_zz_gemv_rows_t rows, const char * w, size_t wnb1, size_t cs,
                               const int32_t * cols, int64_t count, const float * x, int64_t ldx, float * y, int64_t ldy) {
    int64_t k0, k1;
    zz_chunk_range(count, params->ith, params->nth, &k0, &k1);
    const int64_t pstride = zz_round16(s->m*s->nt);
    float * partial0 = (float *) zz_align64(params->wdata);
    rows(w, wnb1, cs, 0, s->nr, cols, k0, k1, x, ldx, (int) s->nt, partial0 + params->ith*pstride, s->m);
    ggml_barrier(params->threadpool);
    zz_reduce_partials(params, s, partial0, pstride, y, ldy);
}

// decode on a column-major weight: the active list split evenly over threads in whole chunks, each thread
// streams its columns' runs through all block-rows into its own partial sums, then one reduction
static void zz_mul_mat_gemv_cm(const struct ggml_compute_params * params, const struct zz_shape * s,
                               const char * w, const int32_t * cols, int64_t count,
                               const float * x, int64_t ldx, float * y, int64_t ldy, bool use_ref) {
    const int ith = params->ith;
    const int nth = params->nth;
    const int nt  = (int) s->nt;

    const ggml_sparse_zz_gemv_cm_t fast = use_ref ? NULL : ggml_sparse_zz_gemv_cm_x86(s->type);
    const bool has_ws = params->wdata != NULL && params->wsize >= zz_gemv_work_size(s, nth);

    // 32-blocks: the multi-row kernel reads the column runs, block-rows split over threads (no partial sums);
    // its int32 block offsets reach across the whole weight
    const ggml_sparse_zz_gemv_rows_t rows = use_ref || fast != NULL || (size_t) s->n*s->nr*s->bs > INT32_MAX ? NULL :
                                            ggml_sparse_zz_gemv_rows_x86(s->type);
    if (rows != NULL) {
        // the active list split over threads (whole chunks): each thread reads whole column runs and covers every
        // block-row into its own partial sums, then one reduction. Against block-rows split over threads (2 threads,
        // 7B shapes): even for single tokens streaming from memory, 1.1-1.6x as fast for batches of 2-8 with weights
        // in cache (AVX2 alike), and whole tiles where a thread's share of rows is under one (SmolLM2's 18
        // block-rows); bench/results/cpu_q8_colsplit_2026-12-05.md. LLAMA_SPARSE_CPU_SPLIT=rows|cols forces either
        if (nth > 1 && has_ws && zz_split_env() != 1) {
            zz_rows_list_split(params, s, rows, w, s->bs, s->nr*s->bs, cols, count, x, ldx, y, ldy);
            return;
        }
        const int64_t r0 = s->nr*ith/nth;
        const int64_t r1 = s->nr*(ith + 1)/nth;
        if (r0 < r1) {
            rows(w, s->bs, s->nr*s->bs, r0, r1, cols, 0, count, x, ldx, nt, y, ldy);
        }
        return;
    }

    if (fast == NULL || !has_ws) {
        // reference: block-rows split over threads, columns nr blocks apart
        const int64_t r0 = s->nr*ith/nth;
        const int64_t r1 = s->nr*(ith + 1)/nth;
        for (int64_t r = r0; r < r1; ++r) {
            size_t cs;
            const char * wr = zz_block_row(s, w, 0, r, &cs);
            zz_gemv_ref(s->type, wr, cs, cols, 0, count, x, ldx, nt, y + r*s->bk, ldy);
        }
        return;
    }

    const int64_t pstride = zz_round16(s->m*s->nt);
    const int64_t mstride = zz_round16(s->nt*s->nr*8);
    float * partial0 = (float *) zz_align64(params->wdata);
    float * mins0    = partial0 + nth*pstride;
    float * mins     = mins0 + ith*mstride;

    if (nth == 1 || zz_split_env() == 1) {
        // block-rows split over threads (LLAMA_SPARSE_CPU_SPLIT=rows): every output from one thread, in the list's
        // order, so the same sums at any thread count
        const int64_t r0 = s->nr*ith/nth;
        const int64_t r1 = s->nr*(ith + 1)/nth;
        if (r0 < r1) {
            fast(w + r0*s->bs, s->nr, r1 - r0, cols, 0, count, x, ldx, nt, y + r0*s->bk, ldy, mins, false);
        }
        return;
    }

    int64_t k0, k1;
    zz_chunk_range(count, ith, nth, &k0, &k1);
    // partial sums left in the kernel's raw form, put in order once while reducing, by every thread for its
    // own block-rows (the kernel's final pass over all nr block-rows would run on every thread)
    fast(w, s->nr, s->nr, cols, k0, k1, x, ldx, nt, partial0 + ith*pstride, s->m, mins, true);

    ggml_barrier(params->threadpool);

    const int64_t r0 = s->nr*ith/nth;
    const int64_t r1 = s->nr*(ith + 1)/nth;
    ggml_sparse_zz_cm_reduce_x86(s->type)(partial0, nth, pstride, s->m, mins0, mstride, s->nr, nt, r0, r1, y, ldy);
}

static void zz_forward_mul_mat_zz(const struct ggml_compute_params * params, struct ggml_tensor * dst) {
    const struct ggml_tensor * w   = dst->src[0];
    const struct ggml_tensor * xt  = dst->src[1];
    const struct ggml_tensor * idx = dst->src[2];

    const struct zz_shape s = zz_shape_of(dst);

    GGML_ASSERT(s.type == GGML_TYPE_Q4_0 || s.type == GGML_TYPE_Q8_0 || s.type == GGML_TYPE_Q4_K || s.type == GGML_TYPE_Q6_K);
    GGML_ASSERT(w->nb[0] == s.bs && w->nb[1] >= (size_t) s.n*s.bs);
    GGML_ASSERT(s.layout == GGML_SPARSE_ZZ_LAYOUT_ROWS || (s.layout == GGML_SPARSE_ZZ_LAYOUT_COLS && w->nb[1] == (size_t) s.n*s.bs));
    GGML_ASSERT(xt->type == GGML_TYPE_F32 && xt->nb[0] == sizeof(float) && xt->nb[1] % sizeof(float) == 0);
    GGML_ASSERT(xt->ne[0] == s.n && xt->ne[2] == 1 && xt->ne[3] == 1);
    GGML_ASSERT(dst->type == GGML_TYPE_F32 && dst->nb[0] == sizeof(float) && dst->nb[1] % sizeof(float) == 0);
    GGML_ASSERT(dst->ne[0] == s.m && dst->ne[1] == s.nt);

    const int ith = params->ith;
    const int nth = params->nth;

    const char  * wdata0 = (const char *) w->data;
    const size_t  wnb1   = w->nb[1];
    const float * x      = (const float *) xt->data;
    const int64_t ldx    = xt->nb[1]/sizeof(float);
    float       * y      = (float *) dst->data;
    const int64_t ldy    = dst->nb[1]/sizeof(float);

    if (s.nt > GGML_SPARSE_MAX_BATCH) {
        GGML_ASSERT(idx == NULL && "sparse index is only defined for T <= GGML_SPARSE_MAX_BATCH");
        if (zz_slice_tokens(&s) && !zz_use_ref(params) && params->wdata != NULL &&
            params->wsize >= zz_slice_work_size(&s, params->nth)) {
            // dense; a barrier before each next slice, as every slice's kernel writes the shared partial sums the
            // previous one's reduction reads
            const int64_t ns = zz_n_slices(s.nt);
            for (int64_t i = 0, t0 = 0; i < ns; ++i) {
                const int64_t t1 = s.nt*(i + 1)/ns;
                struct zz_shape ss = s;
                ss.nt = t1 - t0;
                if (i > 0) {
                    ggml_barrier(params->threadpool);
                }
                zz_mul_mat_gemv_cm(params, &ss, wdata0, NULL, s.n, x + t0*ldx, ldx, y + t0*ldy, ldy, false);
                t0 = t1;
            }
            return;
        }
        zz_mul_mat_gemm(params, &s, wdata0, wnb1, x, ldx, y, ldy);
        return;
    }

    const int       nt    = (int) s.nt;
    const int32_t * cols  = NULL;
    int64_t         count = s.n;
    if (idx != NULL) {
        GGML_ASSERT(idx->type == GGML_TYPE_I32 && idx->ne[0] == s.n + 1);
        cols  = (const int32_t *) idx->data;
        count = cols[s.n];
        GGML_ASSERT(count >= 0 && count <= s.n);
    }

    const bool use_ref = zz_use_ref(params);

    if (s.layout == GGML_SPARSE_ZZ_LAYOUT_COLS) {
        zz_mul_mat_gemv_cm(params, &s, wdata0, cols, count, x, ldx, y, ldy, use_ref);
        return;
    }

    const ggml_sparse_zz_gemv_t      fast = use_ref ? NULL : zz_gemv_fast(s.type);
    const ggml_sparse_zz_gemv_rows_t rows = use_ref ? NULL : ggml_sparse_zz_gemv_rows_x86(s.type);

    if (fast == NULL || nth == 1 || params->wdata == NULL || params->wsize < zz_gemv_work_size(&s, nth) ||
        zz_split_rows(&s, nth)) {
        // block-rows split over threads, written straight into dst: every block-row has the same work
        // (all active columns), so no partial sums are needed. With the one-row fast kernel the rows go in chunks
        // that threads take as they finish (zz_row_chunks; the counter lives in the work buffer, which this path
        // does not otherwise use), else in one even share a thread
        const int  chunks = zz_row_chunks();
        const bool dyn    = fast != NULL && rows == NULL && nth > 1 && chunks > 0 && s.nr >= 2*nth &&
                            params->wdata != NULL && params->wsize >= sizeof(atomic_int) + 64;
        const int64_t npiece = dyn ? (s.nr < (int64_t) chunks*nth ? s.nr : (int64_t) chunks*nth) : nth;
        atomic_int  * next   = dyn ? (atomic_int *) zz_align64(params->wdata) : NULL;
        if (dyn) {
            zz_units_start(params, next);
        }
        for (int64_t c = ith; c < npiece; c = dyn ? zz_units_next(next) : npiece) {
            const int64_t r0 = s.nr*c/npiece;
            const int64_t r1 = s.nr*(c + 1)/npiece;
            if (rows) {
                if (r0 < r1) {
                    rows(wdata0, wnb1, s.bs, r0, r1, cols, 0, count, x, ldx, nt, y, ldy);
                }
                continue;
            }
            for (int64_t r = r0; r < r1; ++r) {
                if (fast) {
                    fast(wdata0 + r*wnb1, cols, 0, count, x, ldx, nt, y + r*s.bk, ldy);
                } else {
                    zz_gemv_ref(s.type, wdata0 + r*wnb1, s.bs, cols, 0, count, x, ldx, nt, y + r*s.bk, ldy);
                }
            }
        }
        return;
    }

    // the active list split evenly over threads in whole chunks, every thread covers all block-rows
    // into its own partial sums, then threads reduce disjoint output ranges
    if (rows) {
        zz_rows_list_split(params, &s, rows, wdata0, wnb1, s.bs, cols, count, x, ldx, y, ldy);
        return;
    }
    int64_t k0, k1;
    zz_chunk_range(count, ith, nth, &k0, &k1);

    const int64_t pstride = zz_round16(s.m*s.nt);
    float * partial0 = (float *) zz_align64(params->wdata);
    float * partial  = partial0 + ith*pstride;
    for (int64_t r = 0; r < s.nr; ++r) {
        fast(wdata0 + r*wnb1, cols, k0, k1, x, ldx, nt, partial + r*s.bk, s.m);
    }

    ggml_barrier(params->threadpool);

    zz_reduce_partials(params, &s, partial0, pstride, y, ldy);
}

// LLAMA_SPARSE_CPU_PROF=1 (measurement only): per batch class (decode <= 8 tokens, prefill), the op's wall time (first
// thread in to last thread out), its threads' mean busy time and the number of calls, printed at exit. The last
// thread out of a call adds it up; ggml's barrier between nodes keeps the next call's threads out until then
#define ZZ_PROF_MAX_THREADS 256
static struct {
    double     start[ZZ_PROF_MAX_THREADS], end[ZZ_PROF_MAX_THREADS];
    atomic_int done; // threads out of the current call
    int64_t    calls[2];
    double     wall[2], busy[2];
} zz_prof;

// C11's clock (also MSVC's): ggml_time_us would pull ggml.c into the kernel tests' static links
static double zz_prof_now(void) {
    struct timespec ts;
    timespec_get(&ts, TIME_UTC);
    return (double) ts.tv_sec + 1e-9*(double) ts.tv_nsec;
}

static void zz_prof_report(void) {
    static const char * names[2] = { "decode", "prefill" };
    for (int c = 0; c < 2; ++c) {
        if (zz_prof.calls[c] > 0) {
            fprintf(stderr, "llama-sparse prof: MUL_MAT_ZZ %s: %lld calls, wall %.3f s, mean thread busy %.3f s (%.1f %%)\n",
                    names[c], (long long) zz_prof.calls[c], zz_prof.wall[c], zz_prof.busy[c],
                    100.0*zz_prof.busy[c]/zz_prof.wall[c]);
        }
    }
}

void ggml_sparse_cpu_forward_mul_mat_zz(const struct ggml_compute_params * params, struct ggml_tensor * dst) {
    static int on = -1; // benign race: every thread computes the same value
    if (on < 0) {
        const char * e = getenv("LLAMA_SPARSE_CPU_PROF");
        on = e != NULL && atoi(e) > 0;
    }
    const int ith = params->ith;
    const int nth = params->nth;
    if (!on || nth > ZZ_PROF_MAX_THREADS) {
        zz_forward_mul_mat_zz(params, dst);
        return;
    }
    zz_prof.start[ith] = zz_prof_now();
    zz_forward_mul_mat_zz(params, dst);
    zz_prof.end[ith] = zz_prof_now();
    if (atomic_fetch_add_explicit(&zz_prof.done, 1, memory_order_acq_rel) + 1 < nth) {
        return;
    }
    // the last thread out: every thread's times are written
    static bool registered = false;
    if (!registered) {
        registered = true;
        atexit(zz_prof_report);
    }
    double t0 = zz_prof.start[0], t1 = zz_prof.end[0], busy = 0.0;
    for (int i = 0; i < nth; ++i) {
        t0 = zz_prof.start[i] < t0 ? zz_prof.start[i] : t0;
        t1 = zz_prof.end[i]   > t1 ? zz_prof.end[i]   : t1;
        busy += zz_prof.end[i] - zz_prof.start[i];
    }
    const int cls = dst->src[1]->ne[1] > GGML_SPARSE_MAX_BATCH;
    zz_prof.calls[cls]++;
    zz_prof.wall[cls] += t1 - t0;
    zz_prof.busy[cls] += busy/nth;
    atomic_store_explicit(&zz_prof.done, 0, memory_order_relaxed);
}

int ggml_sparse_cpu_n_tasks(const struct ggml_tensor * node, int n_threads) {
    GGML_UNUSED(node);
    // every thread runs the op anyway; small index scans are done by thread 0 alone (see ZZ_IDX_PAR_MIN)
    return n_threads;
}

size_t ggml_sparse_cpu_work_size(const struct ggml_tensor * node, int n_tasks) {
    if (node->src[1] == NULL) {
        // SPARSE_IDX: only LIST mode uses the work buffer
        return node->op_params[1] == GGML_SPARSE_IDX_LIST ? zz_idx_work_size(node->src[0]->ne[0], n_tasks) : 0;
    }
    const struct zz_shape s = zz_shape_of(node);
    if (s.nt > GGML_SPARSE_MAX_BATCH) {
        const size_t ws_gemm = zz_gemm_work_size(n_tasks);
        if (zz_slice_tokens(&s)) {
            const size_t ws_slice = zz_slice_work_size(&s, n_tasks);
            return ws_slice > ws_gemm ? ws_slice : ws_gemm;
        }
        return ws_gemm;
    }
    return zz_gemv_work_size(&s, n_tasks);
}
