// llama-sparse: CPU kernels for GGML_OP_SPARSE_IDX and GGML_OP_MUL_MAT_ZZ (compiled into ggml-cpu).
//
// The four public functions are called from ggml-cpu's op dispatch on every thread of the op.
// The rest of this header is internal: the contract between ggml-sparse-cpu.c and the per-arch
// kernel files zigzag-gemv-x86.c / zigzag-gemv-arm.c.
#pragma once

#include "ggml.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct ggml_compute_params;

// dst->op is GGML_OP_SPARSE_IDX / GGML_OP_MUL_MAT_ZZ; params->wdata holds ggml_sparse_cpu_work_size() bytes
void   ggml_sparse_cpu_forward_idx       (const struct ggml_compute_params * params, struct ggml_tensor * dst);
void   ggml_sparse_cpu_forward_mul_mat_zz(const struct ggml_compute_params * params, struct ggml_tensor * dst);

// node is a SPARSE_IDX or a MUL_MAT_ZZ node; they are told apart by src[1] (only MUL_MAT_ZZ has one),
// so these two do not depend on the op enum values
int    ggml_sparse_cpu_n_tasks  (const struct ggml_tensor * node, int n_threads);
size_t ggml_sparse_cpu_work_size(const struct ggml_tensor * node, int n_tasks);

//
// internal
//

// active columns are processed in chunks of this many list entries; integer coefficient scales are
// per chunk, and chunks start at multiples of this in the list whatever the thread split, so the
// result does not depend on the number of threads beyond float rounding
#define GGML_SPARSE_ZZ_CHUNK 16

// GEMV over one block-row of a zigzag weight (B = block size outputs), T = nt <= GGML_SPARSE_MAX_BATCH:
//   y[t*ldy + i] = sum_{k0 <= k < k1} x[t*ldx + col(k)] * deq(wrow[col(k)])[i],  i < B, t < nt
// col(k) = cols ? cols[k] : k. k0 is a multiple of GGML_SPARSE_ZZ_CHUNK. y is overwritten (zeros if k0 >= k1).
typedef void (*ggml_sparse_zz_gemv_t)(const void * wrow, const int32_t * cols, int64_t k0, int64_t k1,
                                      const float * x, int64_t ldx, int nt, float * y, int64_t ldy);

// fast kernels of this build for a type, NULL where there are none (the scalar reference is used then)
ggml_sparse_zz_gemv_t ggml_sparse_zz_gemv_x86(enum ggml_type type);
ggml_sparse_zz_gemv_t ggml_sparse_zz_gemv_arm(enum ggml_type type);

// the same over block-rows r0 <= r < r1 of a whole weight, block (r, j) at w + r*wnb1 + j*cs (row layout:
// cs = block size; column-major: wnb1 = block size, cs = nr blocks), y + r*B for row r; for short block-rows
// (B = 32), where per-column setup shared by the rows pays. j*cs must fit an int32
typedef void (*ggml_sparse_zz_gemv_rows_t)(const void * w, size_t wnb1, size_t cs, int64_t r0, int64_t r1,
                                           const int32_t * cols, int64_t k0, int64_t k1,
                                           const float * x, int64_t ldx, int nt, float * y, int64_t ldy);

// multi-row kernels of this build for a type, NULL where there are none
ggml_sparse_zz_gemv_rows_t ggml_sparse_zz_gemv_rows_x86(enum ggml_type type);

// reorders the n*nr blocks of one weight from the row layout to column-major (GGML_SPARSE_ZZ_LAYOUT_COLS,
// src != dst); the caller then tags the weight with ggml_sparse_zz_set_layout
void ggml_sparse_zz_to_colmajor(enum ggml_type type, int64_t n, int64_t nr, const void * src, void * dst);

// GEMV over nr block-rows (of B outputs) of a column-major weight, block (r, j) at w + (j*ldc + r)*block size,
// list entries k0 <= k < k1:
//   y[t*ldy + i] = sum_{k0 <= k < k1} x[t*ldx + col(k)] * W[i, col(k)],  i < nr*B, t < nt
// y is overwritten; mins: nt*nr*8 floats of scratch; k0 is a multiple of GGML_SPARSE_ZZ_CHUNK.
// raw: y is left in the kernel's internal order and the min terms in mins, for ggml_sparse_zz_cm_reduce_t
typedef void (*ggml_sparse_zz_gemv_cm_t)(const void * w, int64_t ldc, int64_t nr, const int32_t * cols, int64_t k0, int64_t k1,
                                         const float * x, int64_t ldx, int nt, float * y, int64_t ldy, float * mins, bool raw);

// the sum of np raw partial results of ggml_sparse_zz_gemv_cm_t (partial p: y at part0 + p*pstride, token
// stride ldp; mins at mins0 + p*mstride), for block-rows r0 <= r < r1, written in order to y
typedef void (*ggml_sparse_zz_cm_reduce_t)(const float * part0, int np, int64_t pstride, int64_t ldp,
                                           const float * mins0, int64_t mstride, int64_t nr, int nt, int64_t r0, int64_t r1,
                                           float * y, int64_t ldy);

// column-major kernels of this build for a type, NULL where there are none; the reducer exists where the kernel does
ggml_sparse_zz_gemv_cm_t   ggml_sparse_zz_gemv_cm_x86(enum ggml_type type);
ggml_sparse_zz_cm_reduce_t ggml_sparse_zz_cm_reduce_x86(enum ggml_type type);

// the most tokens (> GGML_SPARSE_MAX_BATCH) for which prefill on a column-major weight of this type runs the batch
// kernel over token slices of at most GGML_SPARSE_MAX_BATCH instead of the fp32 GEMM; 0: never (nonzero only where
// ggml_sparse_zz_gemv_cm_x86 has a kernel)
int ggml_sparse_zz_cm_slice_max_x86(enum ggml_type type);

// whether this build decodes a type column-major with a fast kernel (the cm kernel, or the multi-row one)
bool ggml_sparse_zz_cpu_colmajor_fast(enum ggml_type type);

// prefill: y[t*ldy + i] = sum_{j < n} x[t*ldx + j] * W[i][j] for i < nb*B and any nt, dense, over nb (1 or 2)
// consecutive block-rows: W[b*B + i'][j] = deq(block at wrow + j*cs + b*rs)[i'] (cs: the block size in the row
// layout, nr blocks in the column-major one; rs: from one block-row to the next); each weight block is dequantized
// once into panel (panel_floats floats, >= 8*nb*B) for all nt tokens; int16: the 16-bit integer path where this build
// has one for the type (ggml_sparse_zz_gemm_int16_floats), else fp32
void ggml_sparse_zz_gemm_block_rows(enum ggml_type type, const void * wrow, size_t cs, size_t rs, int nb, int64_t n,
                                    const float * x, int64_t ldx, int64_t nt, float * y, int64_t ldy,
                                    float * panel, int64_t panel_floats, bool int16);

// prefill of a type on 16-bit integers (x d rounded to int16 per token and 256 columns, 128 for Q6_K; Q4_K and Q6_K
// with AVX512-VNNI, AVX-VNNI, or AVX2 without AVX-512) instead of fp32 panels: the panel floats that needs, 0 where
// this build (or LLAMA_SPARSE_CPU_GEMM=f32) has no such path
int64_t ggml_sparse_zz_gemm_int16_floats(enum ggml_type type);
// whether the prefill GEMM of this build runs a type on 16-bit integers (the above with this build's panel)
bool ggml_sparse_zz_cpu_gemm_int16(enum ggml_type type);
// the most tokens a column-major prefill runs as token slices rather than on the int16 GEMM of this build
int ggml_sparse_zz_gemm_int16_slice_max(void);
// the most tokens a column-major prefill runs as token slices of the batch kernel instead of the GEMM (0: never):
// ggml_sparse_zz_cm_slice_max_x86 against the fp32 GEMM, ggml_sparse_zz_gemm_int16_slice_max against the int16 one,
// LLAMA_SPARSE_CPU_SLICE_MAX=N overriding both
int ggml_sparse_zz_cpu_slice_max(enum ggml_type type);

// get_scale_min_k4 of ggml-quants.c: the 6-bit scale d and min m of Q4_K sub-block j from the 12 scale bytes q
static inline void zz_get_scale_min_k4(int j, const uint8_t * q, uint8_t * d, uint8_t * m) {
    if (j < 4) {
        *d = q[j] & 63; *m = q[j + 4] & 63;
    } else {
        *d = (q[j+4] & 0xF) | ((q[j-4] >> 6) << 4);
        *m = (q[j+4] >>  4) | ((q[j-0] >> 6) << 4);
    }
}

// dequantize one block (B values) exactly as ggml's dequantize_row_* does
void ggml_sparse_zz_dequant_block(enum ggml_type type, const void * blk, float * out);

// the same vectorized for this build, NULL where there is none; values 32g..32g+31 go to out + g*gs
typedef void (*ggml_sparse_zz_dequant_t)(const void * blk, float * out, int64_t gs);
ggml_sparse_zz_dequant_t ggml_sparse_zz_dequant_x86(enum ggml_type type);

#ifdef __cplusplus
}
#endif
