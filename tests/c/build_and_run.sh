#!/usr/bin/env bash
# llama-sparse: builds and runs the standalone CPU sparse-op test against the stock ggml build.
# usage: tests/c/build_and_run.sh [--quick]   (environment: tests/c/cc_test.sh)
set -euo pipefail
. "$(dirname "$0")/cc_test.sh"

srcs=("$root/tests/c/test_zigzag_cpu.c" "$root/ggml-sparse/ggml-sparse-cpu.c" "$root/ggml-sparse/zigzag-gemv-x86.c"
      "$root/ggml-sparse/zigzag-gemv-arm.c" "$root/ggml-sparse/zigzag-gemm.c")
cc_test test_zigzag_cpu "${srcs[@]}"

"$out/test_zigzag_cpu" "$@"
# decode on column-major Q8_0/Q4_0 splits the active list over threads by default; the block-row split again here
LLAMA_SPARSE_CPU_SPLIT=rows "$out/test_zigzag_cpu" --quick
# the prefill GEMM with one static unit a thread (by default units are taken as threads finish)
LLAMA_SPARSE_CPU_GEMM_DYN=0 "$out/test_zigzag_cpu" --quick

# the prefill GEMM again with small panels (many passes over n, every type), and where the compiler can
# target both, with its AVX2 tiles on an AVX-512 machine
CC_TEST_FLAGS="-DZZ_GEMM_PANEL_FLOATS=2048" cc_test test_zigzag_cpu_panel "${srcs[@]}"
"$out/test_zigzag_cpu_panel" --quick
# the int16 Q4_K GEMM (AVX512-VNNI builds) with small token slabs and x scale groups: many slabs, several groups a pass
CC_TEST_FLAGS="-DZZ_I16_TS=8 -DZZ_I16_G=64" cc_test test_zigzag_cpu_i16 "${srcs[@]}"
"$out/test_zigzag_cpu_i16" --quick
if grep -q avx512f /proc/cpuinfo 2>/dev/null; then
    # (small panels leave Q4_K on the fp32 tiles)
    CC_TEST_FLAGS="-DZZ_GEMM_PANEL_FLOATS=2048 -mno-avx512f" cc_test test_zigzag_cpu_avx2 "${srcs[@]}"
    "$out/test_zigzag_cpu_avx2" --quick
fi
# int16_variant NAME FLAGS: the test built with FLAGS (small token slabs and x groups), which must take the int16 GEMM
int16_variant() {
    CC_TEST_FLAGS="$2 -DZZ_I16_TS=8 -DZZ_I16_G=64" cc_test "$1" "${srcs[@]}"
    local log
    log=$("$out/$1" --quick)
    echo "$log"
    grep -q "int16 GEMM q4_K" <<< "$log" && grep -q "int16 GEMM q6_K" <<< "$log" ||
        { echo "build_and_run: $1 ($2) did not take the int16 GEMM" >&2; exit 1; }
}
if grep -q avx2 /proc/cpuinfo 2>/dev/null && grep -q fma /proc/cpuinfo 2>/dev/null &&
        echo 'int x;' | "${CC:-gcc}" -mno-avxvnni -x c -c - -o /dev/null 2>/dev/null; then
    # the int16 GEMM's 256-bit form on plain AVX2 (vpmaddwd + vpaddd), as on CPUs without VNNI or AVX-512
    int16_variant test_zigzag_cpu_avx2i16 "-mno-avx512f -mno-avxvnni"
fi
if grep -q avx512_vnni /proc/cpuinfo 2>/dev/null && grep -q avx512bw /proc/cpuinfo 2>/dev/null; then
    # the AVX-512 int16 GEMM without AVX512-VBMI (Cascade Lake): its packs on byte unpacks instead of vpermb
    int16_variant test_zigzag_cpu_novbmi "-mno-avx512vbmi -mno-avx512vbmi2"
fi
if grep -q avx_vnni /proc/cpuinfo 2>/dev/null; then
    # the int16 GEMM's 256-bit AVX-VNNI form, as on CPUs with AVX-VNNI and no AVX-512
    int16_variant test_zigzag_cpu_avxvnni "-mno-avx512f -mavxvnni"
fi

cc_test test_zz_siblings "$root/tests/c/test_zz_siblings.c" "$root/ggml-sparse/ggml-sparse.c"
"$out/test_zz_siblings"

cc_test test_rope_store_nodes "$root/tests/c/test_rope_store_nodes.c" "$root/ggml-sparse/ggml-sparse.c"
"$out/test_rope_store_nodes"
