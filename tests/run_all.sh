#!/usr/bin/env bash
# Every test of llama-sparse, in order; run through `tools/setup.sh test` (which builds and installs first).
# Exits non-zero if any part fails or if pytest ran no test.
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
py=${PYTHON:-python}
fail=0
section() { printf '\n---- %s ----\n' "$*"; }
run() { "$@" || { echo "FAILED: $*"; fail=1; }; }

section "patch series applies to a fresh upstream copy"
run "$py" tools/upstream.py check

section "stock llama.cpp 0c1e570 (libraries), for the refusal test"
stock_bin=$(tools/build_stock.sh --libs) || { echo "FAILED: stock build"; fail=1; }
export LLAMA_SPARSE_STOCK_BIN=$stock_bin

# the C and CUDA checks compile against the patched tree
LLAMA_SPARSE_UPSTREAM=$("$py" tools/upstream.py fork) || { echo "FAILED: upstream fork tree"; exit 1; }
export LLAMA_SPARSE_UPSTREAM

section "CPU kernels against the scalar reference (tests/c)"
if [ -x tests/c/build_and_run.sh ]; then run tests/c/build_and_run.sh; else echo "FAILED: tests/c/build_and_run.sh missing"; fail=1; fi

section "GEMV bench smoke: stock and zigzag outputs agree, one process per side at a time (bench/gemv_cpu.sh)"
run env NO_SAVE=1 bench/gemv_cpu.sh -t 2 -r 3 -m hot -S 2 -L both -P 2

section "SparQ attention CPU kernel against its scalar reference (tests/c)"
if [ -x tests/c/test_sparq.sh ]; then run tests/c/test_sparq.sh; else echo "FAILED: tests/c/test_sparq.sh missing"; fail=1; fi

section "CPU kernels on aarch64 (NEON) under qemu (tests/c/cross_check.sh)"
if [ -x tests/c/cross_check.sh ]; then run env PYTHON="$py" tests/c/cross_check.sh; else echo "FAILED: tests/c/cross_check.sh missing"; fail=1; fi

section "CUDA sources compile (nvcc, sm_90)"
if command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; then
    if [ -x cuda/check_compile.sh ]; then run cuda/check_compile.sh; else echo "FAILED: cuda/check_compile.sh missing"; fail=1; fi
else
    echo "FAILED: nvcc not found; CI must compile cuda/*.cu"; fail=1
fi

section "Metal kernels and glue through the MSL-on-CPU shim, lint, hook compile check (tests/metal-shim)"
if [ -x tests/metal-shim/run.sh ]; then run tests/metal-shim/run.sh; else echo "FAILED: tests/metal-shim/run.sh missing"; fail=1; fi

section "test-backend-ops from the fork"
run "$py" -m llama_sparse.tools test-backend-ops -o MUL_MAT_ZZ
run "$py" -m llama_sparse.tools test-backend-ops perf -o MUL_MAT_ZZ -b CPU -p "m=4096,n=4096,n_tokens=1"

section "pytest"
"$py" -m pytest -ra tests/python
rc=$?
if [ $rc -eq 5 ]; then echo "FAILED: pytest collected no tests"; fail=1
elif [ $rc -ne 0 ]; then fail=1; fi

exit $fail
