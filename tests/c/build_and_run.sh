#!/usr/bin/env bash
# llama-sparse: builds and runs the standalone CPU sparse-op test against the stock ggml build.
# usage: tests/c/build_and_run.sh [--quick]   (environment: tests/c/cc_test.sh)
set -euo pipefail
. "$(dirname "$0")/cc_test.sh"

cc_test test_zigzag_cpu \
    "$root/tests/c/test_zigzag_cpu.c" \
    "$root/ggml-sparse/ggml-sparse-cpu.c" \
    "$root/ggml-sparse/zigzag-gemv-x86.c" \
    "$root/ggml-sparse/zigzag-gemv-arm.c" \
    "$root/ggml-sparse/zigzag-gemm.c"

"$out/test_zigzag_cpu" "$@"

cc_test test_zz_siblings "$root/tests/c/test_zz_siblings.c" "$root/ggml-sparse/ggml-sparse.c"
"$out/test_zz_siblings"

cc_test test_rope_store_nodes "$root/tests/c/test_rope_store_nodes.c" "$root/ggml-sparse/ggml-sparse.c"
"$out/test_rope_store_nodes"
