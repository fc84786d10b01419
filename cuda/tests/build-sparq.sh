#!/usr/bin/env bash
# llama-sparse: build cuda/tests/test_sparq_cuda (standalone test + microbenchmark of the CUDA SparQ op).
#
#   cuda/tests/build-sparq.sh [OUT]      (default OUT: build-cuda-test/test_sparq_cuda)
#
# Environment:
#   LLAMA_SPARSE_UPSTREAM  patched llama.cpp tree for the headers (default: tools/upstream.py fork)
#   GGML_LIB_DIR           directory with libggml-base.so (default ~/.cache/llama-sparse/stock-build/bin;
#                          on the device: the fork build's bin/)
#   CUDA_ARCH              default 90;  CC  host C compiler for the CPU reference (default gcc)
#   NVCC_FLAGS             extra nvcc flags, e.g. -DSPARQ_PHASE_TIMING (per-phase stamps printed by `bench`)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cuda_dir="$(cd "$here/.." && pwd)"
root="$(cd "$cuda_dir/.." && pwd)"
upstream="${LLAMA_SPARSE_UPSTREAM:-$(python3 "$root/tools/upstream.py" fork)}"
libdir="${GGML_LIB_DIR:-$HOME/.cache/llama-sparse/stock-build/bin}"
arch="${CUDA_ARCH:-90}"
nvcc="${NVCC:-nvcc}"
out="${1:-$root/build-cuda-test/test_sparq_cuda}"
mkdir -p "$(dirname "$out")"

inc=(-I "$upstream/ggml/include" -I "$upstream/ggml/src" -I "$root/ggml-sparse" -I "$cuda_dir" -I "$root/tests/c")
# the reference (ggml-sparse-cpu-sparq.c) is C; its threaded path's ggml_barrier maps to the test's trap
ref_obj="$(dirname "$out")/ggml-sparse-cpu-sparq.o"
set -x
"${CC:-gcc}" -std=c11 -O2 -D_GNU_SOURCE -Dggml_barrier=sparq_test_barrier "${inc[@]}" -I "$upstream/ggml/src/ggml-cpu" \
    -c "$root/ggml-sparse/ggml-sparse-cpu-sparq.c" -o "$ref_obj"
"$nvcc" -std=c++17 -O3 -arch=sm_"$arch" --use_fast_math -lineinfo ${NVCC_FLAGS:-} -DGGML_SPARSE_CUDA_STANDALONE \
    "${inc[@]}" -I "$cuda_dir/compat" \
    "$here/test_sparq_cuda.cu" "$cuda_dir/sparq-attn.cu" "$ref_obj" \
    -L "$libdir" -lggml-base -Xlinker -rpath -Xlinker "$libdir" \
    -o "$out"
