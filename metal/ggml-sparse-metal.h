// llama-sparse: host side of the Metal kernels in metal/*.metal: kernel argument structs (the same layout
// as in the .metal files), launch shapes (shared with the shim tests in tests/metal-shim), and the
// entry points that patch 0010 calls from ggml-metal.
#pragma once

#include "ggml.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

//
// kernel arguments: keep in sync with metal/sparse-idx.metal and metal/mul-mat-zz.metal (the shim tests
// fill these and the kernels read their own copies, so a layout mismatch fails the tests)
//

typedef struct {
    int32_t  n;
    int32_t  nt;
    uint64_t nb1;
    float    thr;
    int32_t  seg;
    int32_t  nseg;
    int32_t  stats; // nonzero: count the set into the bound slot of GGML_SPARSE_METAL_STATS_WORDS words
} ggml_sparse_metal_kargs_idx;

typedef struct {
    int32_t  n;
    int32_t  pad;
    uint64_t nb1;
    uint64_t nb1d;
    float    thr;
    int32_t  pad1;
} ggml_sparse_metal_kargs_mask;

typedef struct {
    int32_t  n;
    int32_t  nr;
    uint64_t nb01;
    uint64_t nb11;
    uint64_t nb1;
    uint64_t nbp;
    int32_t  has_idx;
    int32_t  pad;
} ggml_sparse_metal_kargs_zz;

typedef struct {
    int32_t  m;
    int32_t  nt;
    int32_t  n1;
    int32_t  pad;
    uint64_t nb1;
    uint64_t nbp;
    uint64_t nbpt;
} ggml_sparse_metal_kargs_zz_reduce;

typedef struct {
    int32_t  n;
    int32_t  r0;
    int32_t  nrows;
    int32_t  pad;
    uint64_t nb01;
} ggml_sparse_metal_kargs_zz_dequant;

typedef struct {
    int32_t  D;
    int32_t  Dv;
    int32_t  n_kv;
    int32_t  n_tok;
    int32_t  H;
    int32_t  Hkv;
    int32_t  G;
    int32_t  ns;
    int32_t  r;
    int32_t  k_top;
    int32_t  mean_v;
    int32_t  mask_ne3;
    int32_t  vm_ne2;
    int32_t  vm_ne3;
    float    scale;
    int32_t  kt_q8;    // k_t is Q8_0 (blocks of 32 positions), K/V f16
    uint64_t nbq1, nbq2, nbq3;
    uint64_t nbk1, nbk2, nbk3;
    uint64_t nbt1, nbt2, nbt3;
    uint64_t nbv0, nbv1, nbv2, nbv3;
    uint64_t nbm1, nbm3;
    uint64_t nbvm1, nbvm2, nbvm3;
    uint64_t scratch_unit;
} ggml_sparse_metal_kargs_sparq;

// SparQ: at most this many q heads per KV head (registers), threads per threadgroup
#define GGML_SPARSE_METAL_SPARQ_MAX_G 16
#define GGML_SPARSE_METAL_SPARQ_NTG   256

// SparQ scratch per unit (KV head, token, stream): shat [G][n_kv], keys, p, list [n_kv]
static inline size_t ggml_sparse_metal_sparq_scratch_unit(int64_t G, int64_t n_kv) {
    return (size_t) ((G + 3)*n_kv*4 + 255) & ~(size_t) 255;
}

// threadgroup memory of kernel_sparq_attn: q of the group, component keys and list
static inline size_t ggml_sparse_metal_sparq_smem(int64_t G, int64_t D) {
    return (size_t) (((G*D + 2*D)*4 + 15) & ~15);
}

// a slot of counters of llama_sparse_get_stats: sets, columns, kept, each as (low, high) u32 words, padded
#define GGML_SPARSE_METAL_STATS_WORDS 8

// function constant of kernel_mul_mv_zz_*: tokens
#define GGML_SPARSE_METAL_FC_ZZ_NT 0

//
// launch shapes
//

// LIST: n*nt up to this many values go to one threadgroup (one launch); above, segments of IDX_SEG columns
#define GGML_SPARSE_METAL_IDX_ONE_TG (32*1024)
#define GGML_SPARSE_METAL_IDX_SEG    2048

static inline void ggml_sparse_metal_idx_shape(int64_t n, int nt, int max_threads, int * ntg, int * seg, int * nseg) {
    int t = 32;
    while (t < n && 2*t <= max_threads && t < 1024) {
        t *= 2;
    }
    *ntg  = t;
    *seg  = n*nt <= GGML_SPARSE_METAL_IDX_ONE_TG ? (int) (n > 0 ? n : 1) : GGML_SPARSE_METAL_IDX_SEG;
    *nseg = (int) ((n + *seg - 1) / *seg);
    if (*nseg < 1) {
        *nseg = 1;
    }
}

// lanes that share one column of a block in kernel_mul_mv_zz (the others take other columns)
static inline int ggml_sparse_metal_zz_lanes_per_col(enum ggml_type type) {
    return type == GGML_TYPE_Q8_0 ? 8 : type == GGML_TYPE_Q4_0 ? 4 : 32;
}

// GEMV: nsg simdgroups per threadgroup (paper default 2) and n1 threadgroups per block-row, from the number
// of columns n (the paper's "tg by k"): about ZZ_COLS_PER_SG columns per simdgroup, at most 16 threadgroups
// per block-row, and enough threadgroups in total to fill a large Apple GPU. Not tuned on hardware (see
// docs/metal.md); LLAMA_SPARSE_METAL_N1 / _NSG override in ggml-sparse-metal.cpp.
static inline void ggml_sparse_metal_zz_shape(enum ggml_type type, int64_t n, int64_t nr, int * n1, int * nsg) {
    const int64_t cols_per_sg = ggml_blck_size(type) == 256 ? 128 : 512;
    *nsg = 2;
    int64_t k = n/(cols_per_sg*(*nsg));
    while (k > 1 && nr*k > 4096) {
        k /= 2;
    }
    if (nr*k < 256) {
        // few block-rows: split the columns further so the grid still covers the GPU
        k = (256 + nr - 1)/nr;
        const int64_t kmax = n/(32*(*nsg)) > 1 ? n/(32*(*nsg)) : 1;
        k = k < kmax ? k : kmax;
    }
    *n1 = (int) (k < 1 ? 1 : k > 16 ? 16 : k);
}

// prefill (nt > GGML_SPARSE_MAX_BATCH): block-rows per f16 tile, at most 32 MiB of tile
static inline int64_t ggml_sparse_metal_zz_tile_rows(enum ggml_type type, int64_t n, int64_t nr) {
    const int64_t B = ggml_blck_size(type);
    int64_t rows = (32*1024*1024)/(2*B*(n > 0 ? n : 1));
    rows = rows < 1 ? 1 : rows;
    return rows < nr ? rows : nr;
}

//
// ggml-metal entry points (patch 0010); types from ggml-metal-device.h
//

struct ggml_metal_library;
struct ggml_metal_encoder;

// has_simd_reduction: simd_sum & co. (every kernel); has_simdgroup_mm: ggml's mul_mm (prefill, more than 8 tokens)
bool   ggml_metal_sparse_supports_op(const struct ggml_tensor * op, bool has_simd_reduction, bool has_simdgroup_mm);
// bytes ggml-metal allocates after the op's dst for its scratch (segment counts, partials, f16 tile)
size_t ggml_metal_sparse_extra_size (const struct ggml_tensor * op);
// encodes the op; returns the number of nodes consumed (1)
int    ggml_metal_sparse_encode     (struct ggml_metal_library * lib, struct ggml_metal_encoder * enc, struct ggml_tensor * op);

#ifdef __cplusplus
}
#endif
