#!/usr/bin/env bash
# llama-sparse: builds and runs the standalone CPU SparQ attention test against the stock ggml-base.
# usage: tests/c/test_sparq.sh [--quick]   (environment: tests/c/cc_test.sh)
set -euo pipefail
. "$(dirname "$0")/cc_test.sh"

cc_test test_sparq_cpu "$root/tests/c/test_sparq_cpu.c" "$root/ggml-sparse/ggml-sparse-cpu-sparq.c"

"$out/test_sparq_cpu" "$@"
