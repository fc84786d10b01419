#!/usr/bin/env bash
# llama-sparse: builds and runs the standalone CPU sparse-op test against the stock ggml build.
# usage: tests/c/build_and_run.sh [--quick]
# env: LLAMA_SPARSE_UPSTREAM (default ~/.cache/llama-sparse/upstream),
#      LLAMA_SPARSE_STOCK_BIN (default ~/.cache/llama-sparse/stock-build/bin), CC (default gcc)
set -euo pipefail

root="$(cd "$(dirname "$0")/../.." && pwd)"
up="${LLAMA_SPARSE_UPSTREAM:-$HOME/.cache/llama-sparse/upstream}"
bin="${LLAMA_SPARSE_STOCK_BIN:-$HOME/.cache/llama-sparse/stock-build/bin}"
out="${TMPDIR:-/tmp}/llama-sparse-test-c"
mkdir -p "$out"

# ggml_barrier is renamed to the test shim's barrier (tests/c/zz_test_threads.h)
"${CC:-gcc}" -std=c11 -O2 -march=native -g -Wall -Wno-unused-function -D_GNU_SOURCE \
    -Dggml_barrier=zz_test_barrier \
    -I"$root/ggml-sparse" -I"$root/tests/c" \
    -I"$up/ggml/include" -I"$up/ggml/src" -I"$up/ggml/src/ggml-cpu" \
    "$root/tests/c/test_zigzag_cpu.c" \
    "$root/ggml-sparse/ggml-sparse-cpu.c" \
    "$root/ggml-sparse/zigzag-gemv-x86.c" \
    "$root/ggml-sparse/zigzag-gemv-arm.c" \
    "$root/ggml-sparse/zigzag-gemm.c" \
    -L"$bin" -Wl,-rpath,"$bin" -lggml-base -lpthread -lm \
    -o "$out/test_zigzag_cpu"

"$out/test_zigzag_cpu" "$@"
