#!/usr/bin/env bash
# llama-sparse: the sparse CPU ops on aarch64 (NEON) under qemu: builds stock ggml-base for aarch64 with a cross
# compiler (once, cached), then the CPU kernel tests (tests/c/test_zigzag_cpu.c, --quick; the SparQ kernel's
# tests/c/test_sparq_cpu.c) and the self-contained tests/c/test_zigzag_cross.c, statically, and runs them.
# stock ggml-base for aarch64: tests/c/stock_aarch64.sh
# needs: apt-get install gcc-aarch64-linux-gnu g++-aarch64-linux-gnu qemu-user (tools/setup.sh test installs them)
# env: LLAMA_SPARSE_UPSTREAM (patched tree), LLAMA_SPARSE_CACHE (as tests/c/stock_aarch64.sh)
set -euo pipefail

root="$(cd "$(dirname "$0")/../.." && pwd)"
py="${PYTHON:-python3}"
up="${LLAMA_SPARSE_UPSTREAM:-$("$py" "$root/tools/upstream.py" fork)}"
out="${TMPDIR:-/tmp}/llama-sparse-cross"
mkdir -p "$out"

missing=""
for t in aarch64-linux-gnu-gcc aarch64-linux-gnu-g++ qemu-aarch64; do
    command -v "$t" > /dev/null || missing="$missing $t"
done
if [ -n "$missing" ]; then
    echo "cross check: missing$missing (apt-get install gcc-aarch64-linux-gnu g++-aarch64-linux-gnu qemu-user)" >&2
    exit 1
fi

march=armv8.2-a+dotprod # as tests/c/stock_aarch64.sh's build
build=$(PYTHON="$py" "$root/tests/c/stock_aarch64.sh" ggml-base)

inc=(-I"$root/ggml-sparse" -I"$root/tests/c" -I"$up/ggml/include" -I"$up/ggml/src" -I"$up/ggml/src/ggml-cpu")
ops=("$root/ggml-sparse/ggml-sparse-cpu.c" "$root/ggml-sparse/zigzag-gemv-x86.c"
     "$root/ggml-sparse/zigzag-gemv-arm.c" "$root/ggml-sparse/zigzag-gemm.c")
cross_cc() {
    local name=$1; shift
    aarch64-linux-gnu-gcc -std=c11 -O2 -march=${cc_march:-$march} -static -Wall -Werror \
        -Wno-unused-function -D_GNU_SOURCE "${inc[@]}" "$@" \
        -L"$build/ggml/src" -lggml-base -lpthread -lm -lstdc++ -o "$out/$name"
}

# clang too (Apple's compiler): it rejects some things GCC takes, e.g. a NEON lane index that is only constant after
# unrolling
if command -v clang > /dev/null; then
    for f in "${ops[@]}" "$root/ggml-sparse/ggml-sparse-cpu-sparq.c"; do
        clang --target=aarch64-linux-gnu --sysroot=/usr/aarch64-linux-gnu -isystem /usr/aarch64-linux-gnu/include \
            -march=$march -std=c11 -O2 -Wall -Werror -Wno-unused-function -D_GNU_SOURCE "${inc[@]}" \
            -c "$f" -o "$out/clang-$(basename "$f" .c).o"
    done
    echo "aarch64 clang compile: ok"
else
    echo "clang not found: aarch64 clang compile skipped"
fi

cross_cc test_zigzag_cross "$root/tests/c/test_zigzag_cross.c" "${ops[@]}"
# the kernels without dot products (armv8.0: Q8_0 and Q4_0 take 16-bit coefficients there)
cc_march=armv8-a cross_cc test_zigzag_cross_v80 "$root/tests/c/test_zigzag_cross.c" "${ops[@]}"
cross_cc test_zigzag_cpu -Dggml_barrier=zz_test_barrier "$root/tests/c/test_zigzag_cpu.c" "${ops[@]}"
cross_cc test_sparq_cpu -Dggml_barrier=zz_test_barrier "$root/tests/c/test_sparq_cpu.c" "$root/ggml-sparse/ggml-sparse-cpu-sparq.c"
echo "aarch64 builds ($march): ok"

qemu-aarch64 "$out/test_zigzag_cross"
echo "without dot products (armv8-a):"
qemu-aarch64 "$out/test_zigzag_cross_v80"
qemu-aarch64 "$out/test_zigzag_cpu" --quick
qemu-aarch64 "$out/test_sparq_cpu" --quick
