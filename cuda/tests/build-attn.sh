#!/usr/bin/env bash
# llama-sparse: build cuda/tests/test_attn_cuda (standalone test + microbenchmark of cuda/attn-decode.cu).
#
#   cuda/tests/build-attn.sh [OUT]      (default OUT: build-cuda-test/test_attn_cuda)
#
# Environment: LLAMA_SPARSE_UPSTREAM (patched llama.cpp tree for the headers; default: tools/upstream.py fork),
# GGML_LIB_DIR (directory with libggml-base.so; default ~/.cache/llama-sparse/stock-build/bin), CUDA_ARCH (default 90)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cuda_dir="$(cd "$here/.." && pwd)"
root="$(cd "$cuda_dir/.." && pwd)"
upstream="${LLAMA_SPARSE_UPSTREAM:-$(python3 "$root/tools/upstream.py" fork)}"
libdir="${GGML_LIB_DIR:-$HOME/.cache/llama-sparse/stock-build/bin}"
arch="${CUDA_ARCH:-90}"
out="${1:-$root/build-cuda-test/test_attn_cuda}"
mkdir -p "$(dirname "$out")"

set -x
"${NVCC:-nvcc}" -std=c++17 -O3 -arch=sm_"$arch" --use_fast_math -lineinfo ${NVCC_FLAGS:-} -DGGML_SPARSE_CUDA_STANDALONE \
    -I "$upstream/ggml/include" -I "$upstream/ggml/src" -I "$root/ggml-sparse" -I "$cuda_dir" -I "$cuda_dir/compat" \
    "$here/test_attn_cuda.cu" "$cuda_dir/attn-decode.cu" \
    -L "$libdir" -lggml-base -Xlinker -rpath -Xlinker "$libdir" \
    -o "$out"
