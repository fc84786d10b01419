#!/usr/bin/env bash
# llama-sparse: build cuda/tests/test_zz_cuda (standalone test + microbenchmark of the CUDA zigzag kernels).
#
#   cuda/tests/build.sh [OUT]            (default OUT: build-cuda-test/test_zz_cuda)
#
# Environment:
#   LLAMA_SPARSE_UPSTREAM  llama.cpp tree for the headers (default ~/.cache/llama-sparse/upstream)
#   GGML_INCLUDE           ggml/include to use (default: the tree's; the sparse ops are added to a copy if missing)
#   GGML_LIB_DIR           directory with libggml-base.so (default ~/.cache/llama-sparse/stock-build/bin;
#                          on the device: the fork build's bin/)
#   WITH_GGML_CUDA=1       also link libggml + libggml-cuda from GGML_LIB_DIR and time stock ggml_mul_mat
#   CUDA_ARCH              default 90
#   NVCC_FLAGS             extra nvcc flags, e.g. -DZZ_DIRECT_MIN_BLOCKS=1 for an A/B of a compile-time knob
#   CUBLAS_ROOT            dir with include/cublas_v2.h and lib*/libcublas.so* (default: the toolkit's, then
#                          the nvidia-cublas Python wheel); without cuBLAS the prefill falls back to the GEMV
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cuda_dir="$(cd "$here/.." && pwd)"
root="$(cd "$cuda_dir/.." && pwd)"
upstream="${LLAMA_SPARSE_UPSTREAM:-$HOME/.cache/llama-sparse/upstream}"
libdir="${GGML_LIB_DIR:-$HOME/.cache/llama-sparse/stock-build/bin}"
arch="${CUDA_ARCH:-90}"
nvcc="${NVCC:-nvcc}"
out="${1:-$root/build-cuda-test/test_zz_cuda}"
mkdir -p "$(dirname "$out")"

ggml_include="${GGML_INCLUDE:-$upstream/ggml/include}"
if ! grep -q GGML_OP_SPARQ_ATTN "$ggml_include/ggml.h"; then
    gen="$(dirname "$out")/ggml-include"
    mkdir -p "$gen"
    cp "$ggml_include"/*.h "$gen/"
    grep -q GGML_OP_SPARSE_IDX "$ggml_include/ggml.h" && ops='\1GGML_OP_SPARQ_ATTN,' ||
        ops='\1GGML_OP_SPARSE_IDX,\n\1GGML_OP_MUL_MAT_ZZ,\n\1GGML_OP_SPARQ_ATTN,'
    sed -i "s/^\(\s*\)GGML_OP_COUNT,/$ops\n\n\1GGML_OP_COUNT,/" "$gen/ggml.h"
    ggml_include="$gen"
fi

defs=(-DGGML_SPARSE_CUDA_STANDALONE -DGGML_SPARSE_CUDA_ABLATION)
inc=()
libs=()

# cuBLAS: toolkit, CUBLAS_ROOT, or the pip wheel (nvidia-cublas / nvidia-cublas-cu12)
cublas_lib=""
if echo '#include <cublas_v2.h>' | "$nvcc" -E -x cu - -o /dev/null >/dev/null 2>&1; then
    libs+=(-lcublas)
else
    roots=()
    [ -n "${CUBLAS_ROOT:-}" ] && roots+=("$CUBLAS_ROOT")
    while IFS= read -r d; do roots+=("$d"); done < <(python3 -c 'import nvidia, os; [print(p) for p in nvidia.__path__]' 2>/dev/null || true)
    for r in "${roots[@]}"; do
        h="$(find "$r" -name cublas_v2.h 2>/dev/null | head -n 1)"
        l="$(find "$r" -name 'libcublas.so*' ! -name '*Lt*' 2>/dev/null | sort | head -n 1)"
        if [ -n "$h" ] && [ -n "$l" ]; then
            inc+=(-I "$(dirname "$h")")
            cublas_lib="$l"
            lt="$(find "$(dirname "$l")" -name 'libcublasLt.so*' 2>/dev/null | sort | head -n 1)"
            libs+=("$l" ${lt:+"$lt"} -Xlinker -rpath -Xlinker "$(dirname "$l")")
            break
        fi
    done
    if [ -z "$cublas_lib" ]; then
        echo "build.sh: no cuBLAS found; prefill uses the GEMV fallback"
        defs+=(-DGGML_SPARSE_CUDA_NO_CUBLAS)
        inc+=(-I "$cuda_dir/compat")
    fi
fi

if [ "${WITH_GGML_CUDA:-0}" = "1" ]; then
    defs+=(-DZZ_TEST_WITH_GGML_CUDA)
    libs+=(-L "$libdir" -lggml -lggml-cuda)
fi

# device code optimized in parallel (nvcc 11.8+; NVCC_SPLIT=0: off)
split=()
if [ "${NVCC_SPLIT:-1}" != 0 ] && [[ "$("$nvcc" --help 2>/dev/null || true)" == *--split-compile* ]]; then
    split=(--split-compile=0)
fi

set -x
"$nvcc" -std=c++17 -O3 -arch=sm_"$arch" --use_fast_math -extended-lambda -lineinfo "${split[@]}" ${NVCC_FLAGS:-} \
    "${defs[@]}" \
    -I "$ggml_include" -I "$upstream/ggml/src" \
    -I "$root/ggml-sparse" -I "$cuda_dir" "${inc[@]}" \
    "$here/test_zz_cuda.cu" "$cuda_dir/mul-mat-zz.cu" "$cuda_dir/sparse-idx.cu" \
    -L "$libdir" -lggml-base "${libs[@]}" -Xlinker -rpath -Xlinker "$libdir" \
    -o "$out"
