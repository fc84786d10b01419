#!/usr/bin/env bash
# Build an unpatched llama.cpp 0c1e570 beside the fork, for side-by-side benchmarks and checks.
#   tools/build_stock.sh [--libs] [cmake args...]
# --libs builds only libllama/libggml (enough for the stock-refuses-zigzag test);
# otherwise also llama-cli, llama-completion, llama-bench, llama-perplexity, llama-quantize.
# Prints the bin/ directory. Build dir: ${LLAMA_SPARSE_CACHE:-~/.cache/llama-sparse}/stock-build[-cuda].
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
targets="llama ggml llama-cli llama-completion llama-bench llama-perplexity llama-quantize"
if [ "${1:-}" = "--libs" ]; then targets="llama ggml"; shift; fi
src=$(python3 "$repo/tools/upstream.py" pristine)
cache=${LLAMA_SPARSE_CACHE:-$HOME/.cache/llama-sparse}
suffix=""; case " $* " in *GGML_CUDA=ON*) suffix="-cuda";; esac
build="$cache/stock-build$suffix"
gen=""; command -v ninja >/dev/null && gen="-G Ninja"
# Like the fork (CMakeLists.txt, LLAMA_SPARSE_CPU_AMX), native x86 builds leave out upstream's AMX path: on a KVM
# guest that reports AMX, stock's llama-bench died with SIGILL at the first prefill (it decoded ~9 % faster with AMX:
# bench/results/cpu_e2e-smollm2-2026-12-04-intel.md). LLAMA_SPARSE_STOCK_AMX=1 keeps it.
no_amx=""
if [ "${LLAMA_SPARSE_STOCK_AMX:-0}" != 1 ] && [[ "$(uname -m)" =~ ^(x86_64|amd64|i686)$ ]] &&
        echo 'int x;' | ${CC:-cc} -mno-amx-int8 -x c -c - -o /dev/null 2>/dev/null; then
    no_amx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
fi
# configured every time, the flags always passed (empty too), so an existing build folder follows LLAMA_SPARSE_STOCK_AMX
cmake -S "$src" -B "$build" $gen -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF -DGGML_CCACHE=ON -DCMAKE_C_FLAGS="$no_amx" -DCMAKE_CXX_FLAGS="$no_amx" "$@" >&2
cmake --build "$build" --config Release -j "$(nproc)" --target $targets >&2
echo "$build/bin"
