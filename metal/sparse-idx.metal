// llama-sparse: GGML_OP_SPARSE_IDX on Apple GPUs (LIST and MASK modes), see ggml-sparse/ggml-sparse.h.
//
// LIST: column j of x (F32 [n, nt], nt <= 8 tokens) is active if |x[t, j]| >= thr for any token t (the
// batch union). dst (I32 [n + 1]) gets the active columns ascending in dst[0..count) and count in dst[n].
// A threadgroup of up to 1024 threads takes a segment of columns in rounds of one column per thread; a
// threadgroup prefix sum (simd_prefix_exclusive_sum inside each simdgroup, then a scan over the simdgroup
// totals) gives every active column its place. Two ways to place the segments:
//   ordered (default): kernel_sparse_idx_count writes each segment's count, kernel_sparse_idx_list adds up
//       the counts of the segments before its own: ascending, deterministic, no counter to reset. One
//       segment (small n) needs only the second launch.
//   atomic: kernel_sparse_idx_clear zeroes dst[n], then kernel_sparse_idx_list_atomic stages its segment's
//       list in threadgroup memory and reserves its output range with one atomic add on dst[n]. One pass
//       over x, but the segments land in completion order (ascending inside a segment only).
// MASK: dst = x with |x| < thr set to 0, element-wise.
// With args.stats set, the LIST kernels also count the set for llama_sparse_get_stats (one slot of counters,
// bound by the host; see sparse_idx_stats_add).
//
// Self-contained (only <metal_stdlib>): ggml-metal's embed step prepends kernels/common.h to every library
// source, so every name here carries a sparse_idx prefix.
#include <metal_stdlib>

using namespace metal;

// keep in sync with metal/ggml-sparse-metal.cpp
typedef struct {
    int32_t  n;     // columns
    int32_t  nt;    // tokens (rows of x), 1..8
    uint64_t nb1;   // bytes between rows of x
    float    thr;   // threshold; <= 0: every column is active
    int32_t  seg;   // columns per segment (threadgroup)
    int32_t  nseg;  // segments
    int32_t  stats; // nonzero: LIST kernels add to the counters of llama_sparse_get_stats (sparse_idx_stats_add)
} ggml_sparse_metal_kargs_idx;

typedef struct {
    int32_t  n;     // columns
    int32_t  pad;
    uint64_t nb1;   // bytes between rows of src
    uint64_t nb1d;  // bytes between rows of dst
    float    thr;
    int32_t  pad1;
} ggml_sparse_metal_kargs_mask;

// same test as the CPU op: !(|v| < thr), so a NaN stays active as it would in the dense product
static inline bool sparse_idx_active(float v, float thr) {
    return !(fabs(v) < thr);
}

static inline int sparse_idx_col(device const char * x, constant ggml_sparse_metal_kargs_idx & args, int j) {
    bool on = false;
    for (int t = 0; t < args.nt; ++t) {
        on = on || sparse_idx_active(((device const float *) (x + t*args.nb1))[j], args.thr);
    }
    return on ? 1 : 0;
}

// active columns of [j0, j1): returns their number; if dst != nullptr, writes them ascending to dst[0..).
// Every thread of the threadgroup must call it (it contains barriers); sg_sums holds 32 ints.
static int sparse_idx_segment(
        device const char * x,
        constant ggml_sparse_metal_kargs_idx & args,
        int j0,
        int j1,
        device int32_t * dst,
        threadgroup int32_t * stage,
        threadgroup int32_t * sg_sums,
        ushort tid,
        ushort ntg,
        ushort sgitg,
        ushort tiisg,
        ushort nsg) {
    int total = 0;
    for (int base = j0; base < j1; base += ntg) {
        const int j = base + tid;
        const int a = j < j1 ? sparse_idx_col(x, args, j) : 0;

        const int pos = simd_prefix_exclusive_sum(a);
        const int cnt = simd_sum(a);
        if (tiisg == 0) {
            sg_sums[sgitg] = cnt;
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);

        // each simdgroup scans the (<= 32) simdgroup counts itself: no second barrier before writing
        const int s      = tiisg < nsg ? sg_sums[tiisg] : 0;
        const int s_excl = simd_prefix_exclusive_sum(s);
        const int s_all  = simd_sum(s);
        const int sg_off = simd_shuffle(s_excl, sgitg);

        if (a) {
            if (dst) {
                dst[total + sg_off + pos] = j;
            } else if (stage) {
                stage[total + sg_off + pos] = j;
            }
        }
        total += s_all;

        // sg_sums is rewritten in the next round
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    return total;
}

// Counters of llama_sparse_get_stats: sets, columns and kept columns, each a u64 as two u32 words (low, high),
// since Metal has no 64-bit atomic add. A carry out of the low word goes to the high one; the host reads both
// once the command buffer has completed.
static inline void sparse_idx_stats_add_u64(device atomic_uint * c, uint v) {
    const uint old = atomic_fetch_add_explicit(c, v, memory_order_relaxed);
    if (old > 0xffffffffu - v) {
        atomic_fetch_add_explicit(c + 1, 1u, memory_order_relaxed);
    }
}

// thread 0 of each segment adds the segment's kept columns; segment 0 also the set and its n columns
static inline void sparse_idx_stats_add(device atomic_uint * stats, constant ggml_sparse_metal_kargs_idx & args,
                                        uint seg, int total) {
    if (args.stats == 0) {
        return;
    }
    if (seg == 0) {
        sparse_idx_stats_add_u64(stats + 0, 1u);
        sparse_idx_stats_add_u64(stats + 2, (uint) args.n);
    }
    if (total > 0) {
        sparse_idx_stats_add_u64(stats + 4, (uint) total);
    }
}

// sum over the threadgroup of one int per thread (all threads call it)
static int sparse_idx_tg_sum(int v, threadgroup int32_t * sg_sums, ushort sgitg, ushort tiisg, ushort nsg) {
    const int s = simd_sum(v);
    if (tiisg == 0) {
        sg_sums[sgitg] = s;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    const int r = simd_sum(tiisg < nsg ? sg_sums[tiisg] : 0);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    return r;
}

// ordered, pass 1: counts[g] = active columns of segment g
kernel void kernel_sparse_idx_count(
        constant ggml_sparse_metal_kargs_idx & args,
        device const char * x,
        device    int32_t * counts,
        uint   tgpig[[threadgroup_position_in_grid]],
        ushort tiitg[[thread_index_in_threadgroup]],
        ushort   ntg[[threads_per_threadgroup]],
        ushort sgitg[[simdgroup_index_in_threadgroup]],
        ushort tiisg[[thread_index_in_simdgroup]],
        ushort   nsg[[simdgroups_per_threadgroup]]) {
    threadgroup int32_t sg_sums[32];

    const int j0 = tgpig*args.seg;
    const int j1 = min(args.n, j0 + args.seg);

    const int total = sparse_idx_segment(x, args, j0, j1, nullptr, nullptr, sg_sums, tiitg, ntg, sgitg, tiisg, nsg);
    if (tiitg == 0) {
        counts[tgpig] = total;
    }
}

// ordered, pass 2 (or the only pass when nseg == 1): segment g starts after the counts of segments < g
kernel void kernel_sparse_idx_list(
        constant ggml_sparse_metal_kargs_idx & args,
        device const char * x,
        device    int32_t * dst,
        device const int32_t * counts,
        device  atomic_uint * stats,
        uint   tgpig[[threadgroup_position_in_grid]],
        ushort tiitg[[thread_index_in_threadgroup]],
        ushort   ntg[[threads_per_threadgroup]],
        ushort sgitg[[simdgroup_index_in_threadgroup]],
        ushort tiisg[[thread_index_in_simdgroup]],
        ushort   nsg[[simdgroups_per_threadgroup]]) {
    threadgroup int32_t sg_sums[32];

    int before = 0;
    for (int g = tiitg; g < (int) tgpig; g += ntg) {
        before += counts[g];
    }
    const int off = sparse_idx_tg_sum(before, sg_sums, sgitg, tiisg, nsg);

    const int j0 = tgpig*args.seg;
    const int j1 = min(args.n, j0 + args.seg);

    const int total = sparse_idx_segment(x, args, j0, j1, dst + off, nullptr, sg_sums, tiitg, ntg, sgitg, tiisg, nsg);
    if (tiitg == 0) {
        if ((int) tgpig == args.nseg - 1) {
            dst[args.n] = off + total;
        }
        sparse_idx_stats_add(stats, args, tgpig, total);
    }
}

// atomic variant, step 1: the counter dst[n] starts at 0
kernel void kernel_sparse_idx_clear(
        constant ggml_sparse_metal_kargs_idx & args,
        device int32_t * dst,
        uint tpig[[thread_position_in_grid]]) {
    if (tpig == 0) {
        dst[args.n] = 0;
    }
}

// atomic variant, step 2: list the segment into threadgroup memory (args.seg ints), reserve its range, copy out
kernel void kernel_sparse_idx_list_atomic(
        constant ggml_sparse_metal_kargs_idx & args,
        device const char * x,
        device    int32_t * dst,
        device  atomic_uint * stats,
        threadgroup int32_t * stage [[threadgroup(0)]],
        uint   tgpig[[threadgroup_position_in_grid]],
        ushort tiitg[[thread_index_in_threadgroup]],
        ushort   ntg[[threads_per_threadgroup]],
        ushort sgitg[[simdgroup_index_in_threadgroup]],
        ushort tiisg[[thread_index_in_simdgroup]],
        ushort   nsg[[simdgroups_per_threadgroup]]) {
    threadgroup int32_t sg_sums[32];
    threadgroup int32_t seg_off[1];

    const int j0 = tgpig*args.seg;
    const int j1 = min(args.n, j0 + args.seg);

    const int total = sparse_idx_segment(x, args, j0, j1, nullptr, stage, sg_sums, tiitg, ntg, sgitg, tiisg, nsg);

    if (tiitg == 0) {
        seg_off[0] = atomic_fetch_add_explicit((device atomic_int *) (dst + args.n), total, memory_order_relaxed);
        sparse_idx_stats_add(stats, args, tgpig, total);
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);

    const int off = seg_off[0];
    for (int k = tiitg; k < total; k += ntg) {
        dst[off + k] = stage[k];
    }
}

kernel void kernel_sparse_idx_mask(
        constant ggml_sparse_metal_kargs_mask & args,
        device const char * src,
        device       char * dst,
        uint3 tpig[[thread_position_in_grid]]) {
    const int j = tpig.x;
    if (j >= args.n) {
        return;
    }
    const float v = ((device const float *) (src + tpig.y*args.nb1))[j];
    ((device float *) (dst + tpig.y*args.nb1d))[j] = sparse_idx_active(v, args.thr) ? v : 0.0f;
}
