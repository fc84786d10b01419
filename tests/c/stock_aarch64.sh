#!/usr/bin/env bash
# llama-sparse: stock ggml 0c1e570 cross-built for aarch64 (armv8.2-a with dot products: Apple M1 and later, Graviton 2
# and later, Cortex-A76), static, configured once and cached; builds the given targets (default ggml-base) and prints
# the build folder (libraries in ggml/src). Used by tests/c/cross_check.sh and bench/arm_count.sh.
# needs: gcc-aarch64-linux-gnu g++-aarch64-linux-gnu; env: LLAMA_SPARSE_CACHE (default ~/.cache/llama-sparse)
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
build="${LLAMA_SPARSE_CACHE:-$HOME/.cache/llama-sparse}/stock-build-aarch64"
log="${TMPDIR:-/tmp}/llama-sparse-stock-aarch64.log"
if [ ! -f "$build/CMakeCache.txt" ]; then
    src=$("${PYTHON:-python3}" "$root/tools/upstream.py" pristine)
    gen=""; command -v ninja > /dev/null && gen="-G Ninja"
    cmake -S "$src" -B "$build" $gen -DCMAKE_SYSTEM_NAME=Linux -DCMAKE_SYSTEM_PROCESSOR=aarch64 \
        -DCMAKE_C_COMPILER=aarch64-linux-gnu-gcc -DCMAKE_CXX_COMPILER=aarch64-linux-gnu-g++ \
        -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF -DGGML_OPENMP=OFF \
        -DGGML_CPU_ARM_ARCH=armv8.2-a+dotprod -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF > "$log" 2>&1 || { tail -20 "$log" >&2; exit 1; }
fi
cmake --build "$build" --target "${@:-ggml-base}" -j "$(nproc)" > "$log" 2>&1 || { tail -20 "$log" >&2; exit 1; }
echo "$build"
