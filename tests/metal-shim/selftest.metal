// Kernels that test the MSL-on-CPU shim itself (not shipped): exact simd sums, simd semantics, and two bugs
// the shim must catch (a missing barrier, a barrier that returned threads never reach).
#include <metal_stdlib>

using namespace metal;

kernel void kernel_selftest_row_sum(
        constant int32_t & ncols,
        device const float * a,
        device float * s,
        uint   tgpig[[threadgroup_position_in_grid]],
        ushort tiitg[[thread_index_in_threadgroup]],
        ushort   ntg[[threads_per_threadgroup]],
        ushort sgitg[[simdgroup_index_in_threadgroup]],
        ushort tiisg[[thread_index_in_simdgroup]],
        ushort   nsg[[simdgroups_per_threadgroup]]) {
    threadgroup float partial[32];
    float v = 0.0f;
    for (int c = tiitg; c < ncols; c += ntg) {
        v += a[tgpig*ncols + c];
    }
    v = simd_sum(v);
    if (tiisg == 0) {
        partial[sgitg] = v;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (sgitg == 0) {
        const float t = simd_sum(tiisg < nsg ? partial[tiisg] : 0.0f);
        if (tiisg == 0) {
            s[tgpig] = t;
        }
    }
}

kernel void kernel_selftest_simd(
        device int32_t * out,
        ushort tiitg[[thread_index_in_threadgroup]]) {
    const int v = tiitg + 1;
    out[4*tiitg + 0] = simd_prefix_exclusive_sum(v);
    out[4*tiitg + 1] = simd_shuffle_down(v, 3);
    out[4*tiitg + 2] = simd_shuffle_xor(v, 5);
    out[4*tiitg + 3] = simd_broadcast(v, 7);
}

// bug on purpose: reads the neighbour's slot with no barrier after the writes
kernel void kernel_selftest_racy(
        device int32_t * out,
        ushort tiitg[[thread_index_in_threadgroup]],
        ushort   ntg[[threads_per_threadgroup]]) {
    threadgroup int32_t slot[256];
    slot[tiitg] = tiitg;
    out[tiitg] = slot[(tiitg + 1) % ntg];
}

// bug on purpose: half the threads return before the barrier
kernel void kernel_selftest_divergent_barrier(
        device int32_t * out,
        ushort tiitg[[thread_index_in_threadgroup]]) {
    if (tiitg >= 32) {
        return;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    out[tiitg] = 1;
}
