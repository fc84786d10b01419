#!/usr/bin/env bash
# llama-sparse: instructions per decode GEMV on aarch64, counted under qemu (no ARM machine needed): stock's
# vec_dot (ggml-cpu built for armv8.2-a+dotprod) against the zigzag kernels, integer (default) and fp32
# (LLAMA_SPARSE_CPU_ARM_INT=0), dense and at 50 % of columns skipped. A count, not a time: it says nothing of
# memory stalls or of how many instructions a core retires per cycle.
# usage: bench/arm_count.sh [M N]   (default 256 1024; every type at T = 1, all but Q4_0 at T = 4;
#        ARM_COUNT_TYPES, default "q4_k q6_k q8_0 q4_0": the types to count)
# needs: gcc/g++-aarch64-linux-gnu, qemu-user (as tests/c/cross_check.sh)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
py="${PYTHON:-python3}"
up="${LLAMA_SPARSE_UPSTREAM:-$("$py" "$root/tools/upstream.py" fork)}"
m=${1:-256} n=${2:-1024}
out="${TMPDIR:-/tmp}/llama-sparse-arm-count"
mkdir -p "$out"

march=armv8.2-a+dotprod # as tests/c/stock_aarch64.sh's build
build=$(PYTHON="$py" "$root/tests/c/stock_aarch64.sh" ggml-base ggml-cpu)
aarch64-linux-gnu-gcc -std=c11 -O3 -march=$march -static -Wall -Wno-unused-function -D_GNU_SOURCE \
    -Dggml_barrier=zz_test_barrier \
    -I"$root/ggml-sparse" -I"$up/ggml/include" -I"$up/ggml/src" -I"$up/ggml/src/ggml-cpu" \
    "$root/bench/arm_count.c" "$root/ggml-sparse/ggml-sparse-cpu.c" "$root/ggml-sparse/zigzag-gemv-x86.c" \
    "$root/ggml-sparse/zigzag-gemv-arm.c" "$root/ggml-sparse/zigzag-gemm.c" \
    -L"$build/ggml/src" -lggml-cpu -lggml-base -lpthread -lm -lstdc++ -o "$out/arm_count"

# one call's instructions: count ARGS... (mode type m n calls sparsity T, calls replaced)
count() {
    local a b
    qemu-aarch64 -singlestep -d exec,nochain -D "$out/trace.log" "$out/arm_count" "$1" "$2" "$3" "$4" 1 "$5" "$6" > /dev/null
    a=$(grep -c '^Trace' "$out/trace.log")
    qemu-aarch64 -singlestep -d exec,nochain -D "$out/trace.log" "$out/arm_count" "$1" "$2" "$3" "$4" 3 "$5" "$6" > /dev/null
    b=$(grep -c '^Trace' "$out/trace.log")
    rm -f "$out/trace.log"
    echo $(( (b - a)/2 ))
}

echo "instructions per call, ${m} x ${n} weight (aarch64 $march under qemu $(qemu-aarch64 --version | head -1 | awk '{print $3}'))"
echo
echo "| type | T | stock | zigzag int dense | int 0.50 | fp32 dense | fp32 0.50 | int dense / stock | int 0.50 / stock |"
echo "|---|---|---|---|---|---|---|---|---|"
for nt in 1 4; do
    for ty in ${ARM_COUNT_TYPES:-q4_k q6_k q8_0 q4_0}; do
        [ $nt = 4 ] && [ $ty = q4_0 ] && continue
        st=$(count stock $ty $m $n 0 $nt)
        zi=$(count zz $ty $m $n 0 $nt); zi5=$(count zz $ty $m $n 0.5 $nt)
        zf=$(LLAMA_SPARSE_CPU_ARM_INT=0 count zz $ty $m $n 0 $nt); zf5=$(LLAMA_SPARSE_CPU_ARM_INT=0 count zz $ty $m $n 0.5 $nt)
        echo "| $ty | $nt | $st | $zi | $zi5 | $zf | $zf5 | $(awk "BEGIN{printf \"%.2f\", $zi/$st}") | $(awk "BEGIN{printf \"%.2f\", $zi5/$st}") |"
    done
done
