#!/usr/bin/env bash
# llama-sparse: builds and runs the standalone CPU SparQ attention test against the stock ggml-base.
# usage: tests/c/test_sparq.sh [--quick]
# env: LLAMA_SPARSE_UPSTREAM (patched tree, default: tools/upstream.py fork),
#      LLAMA_SPARSE_STOCK_BIN (default ~/.cache/llama-sparse/stock-build/bin), CC (default gcc)
set -euo pipefail

root="$(cd "$(dirname "$0")/../.." && pwd)"
up="${LLAMA_SPARSE_UPSTREAM:-$(python3 "$root/tools/upstream.py" fork)}"
bin="${LLAMA_SPARSE_STOCK_BIN:-$HOME/.cache/llama-sparse/stock-build/bin}"
out="${TMPDIR:-/tmp}/llama-sparse-test-c"
mkdir -p "$out"

# the patched tree for GGML_OP_SPARQ_ATTN; ggml_barrier is the test shim's (tests/c/zz_test_threads.h)
"${CC:-gcc}" -std=c11 -O2 -march=native -g -Wall -Wno-unused-function -D_GNU_SOURCE \
    -Dggml_barrier=zz_test_barrier \
    -I"$root/ggml-sparse" -I"$root/tests/c" \
    -I"$up/ggml/include" -I"$up/ggml/src" -I"$up/ggml/src/ggml-cpu" \
    "$root/tests/c/test_sparq_cpu.c" \
    "$root/ggml-sparse/ggml-sparse-cpu-sparq.c" \
    -L"$bin" -Wl,-rpath,"$bin" -lggml-base -lpthread -lm \
    -o "$out/test_sparq_cpu"

"$out/test_sparq_cpu" "$@"
