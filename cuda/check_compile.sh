#!/usr/bin/env bash
# llama-sparse: compile every cuda/*.cu (and the CUDA test) for sm_90 into a temp dir, and run the host-only test of
# cuda/q4k-pair.cuh; exit non-zero on error.
#
# Needs nvcc and the llama.cpp sources the fork builds against:
#   LLAMA_SPARSE_UPSTREAM  llama.cpp tree (default ~/.cache/llama-sparse/upstream)
#   GGML_INCLUDE           ggml/include to use (default: the tree's; if its ggml.h lacks the sparse ops,
#                          a copy with GGML_OP_SPARSE_IDX / GGML_OP_MUL_MAT_ZZ / GGML_OP_SPARQ_ATTN added before GGML_OP_COUNT)
#   CUDA_ARCH              default 90
# Without cuBLAS headers (CPU-only CI images) cuda/compat/cublas_v2.h stands in; nothing is linked.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
upstream="${LLAMA_SPARSE_UPSTREAM:-$HOME/.cache/llama-sparse/upstream}"
arch="${CUDA_ARCH:-90}"
nvcc="${NVCC:-nvcc}"

if ! command -v "$nvcc" >/dev/null 2>&1; then
    echo "check_compile: nvcc not found (set NVCC)" >&2
    exit 2
fi
if [ ! -f "$upstream/ggml/src/ggml-cuda/common.cuh" ]; then
    echo "check_compile: no llama.cpp tree at $upstream (set LLAMA_SPARSE_UPSTREAM)" >&2
    exit 2
fi

tmp="$(mktemp -d /tmp/llama-sparse-cuda-check.XXXXXX)"
trap 'rm -rf "$tmp"' EXIT

ggml_include="${GGML_INCLUDE:-$upstream/ggml/include}"
if ! grep -q GGML_OP_SPARQ_ATTN "$ggml_include/ggml.h"; then
    mkdir -p "$tmp/include"
    cp "$ggml_include"/*.h "$tmp/include/"
    grep -q GGML_OP_SPARSE_IDX "$ggml_include/ggml.h" && ops='\1GGML_OP_SPARQ_ATTN,' ||
        ops='\1GGML_OP_SPARSE_IDX,\n\1GGML_OP_MUL_MAT_ZZ,\n\1GGML_OP_SPARQ_ATTN,'
    sed -i "s/^\(\s*\)GGML_OP_COUNT,/$ops\n\n\1GGML_OP_COUNT,/" "$tmp/include/ggml.h"
    grep -q GGML_OP_SPARQ_ATTN "$tmp/include/ggml.h" || { echo "check_compile: could not add the sparse ops to ggml.h" >&2; exit 2; }
    ggml_include="$tmp/include"
    echo "check_compile: ggml.h without the sparse ops; using a copy with them added"
fi

extra_inc=()
if ! echo '#include <cublas_v2.h>' | "$nvcc" -E -x cu - -o /dev/null >/dev/null 2>&1; then
    extra_inc+=(-I "$here/compat")
    echo "check_compile: no cuBLAS headers; using cuda/compat/cublas_v2.h (compile check only)"
fi

# include dirs as the fork build gives ggml-cuda: ggml/include, ggml/src, cuda/, ggml-sparse/
flags=(-std=c++17 -O3 -arch=sm_"$arch" --use_fast_math -extended-lambda -Xptxas=-warn-spills
       -I "$ggml_include" -I "$upstream/ggml/src"
       -I "$root/ggml-sparse" -I "$here" "${extra_inc[@]}")
# device code optimized in parallel (nvcc 11.8+): mul-mat-zz.cu in 98 s instead of ~270 s on 2 cores
if [[ "$("$nvcc" --help 2>/dev/null || true)" == *--split-compile* ]]; then
    flags+=(--split-compile=0)
fi

status=0
compile() { # name, extra flags..., source
    local name="$1"; shift
    if "$nvcc" "${flags[@]}" "$@" -c -o "$tmp/$name.o" 2> "$tmp/$name.log"; then
        echo "ok    $name"
    else
        echo "FAIL  $name"
        status=1
    fi
    # show warnings and spills too
    grep -v '^$' "$tmp/$name.log" | head -n 40 | sed 's/^/      /' || true
}

for f in "$here"/*.cu; do
    compile "$(basename "$f" .cu)" "$f"
done
# the standalone variants the test program builds (ablation kernels included)
compile mul-mat-zz-standalone -DGGML_SPARSE_CUDA_STANDALONE -DGGML_SPARSE_CUDA_ABLATION "$here/mul-mat-zz.cu"
compile sparse-idx-standalone -DGGML_SPARSE_CUDA_STANDALONE "$here/sparse-idx.cu"
compile test_zz_cuda -DGGML_SPARSE_CUDA_STANDALONE -DGGML_SPARSE_CUDA_ABLATION "$here/tests/test_zz_cuda.cu"
compile test_zz_cuda-ggml -DGGML_SPARSE_CUDA_STANDALONE -DGGML_SPARSE_CUDA_ABLATION -DZZ_TEST_WITH_GGML_CUDA "$here/tests/test_zz_cuda.cu"
compile sparq-attn-standalone -DGGML_SPARSE_CUDA_STANDALONE "$here/sparq-attn.cu"
compile test_sparq_cuda -DGGML_SPARSE_CUDA_STANDALONE -I "$root/tests/c" "$here/tests/test_sparq_cuda.cu"
compile attn-decode-standalone -DGGML_SPARSE_CUDA_STANDALONE "$here/attn-decode.cu"
compile test_attn_cuda -DGGML_SPARSE_CUDA_STANDALONE "$here/tests/test_attn_cuda.cu"
compile sparq_probe "$here/tests/sparq_probe.cu"
compile gemv_probe "$here/tests/gemv_probe.cu"
compile gemv_rowsplit "$here/tests/gemv_rowsplit.cu"

# host-only, run here (no GPU needed): the pair-form Q4_K scale extraction and the G8 regrouping of Q4_0, each
# against its format
for t in test_q4k_pair test_zz_g8; do
    if "$nvcc" -std=c++17 -O2 -I "$here" "$here/tests/$t.cu" -o "$tmp/$t" > "$tmp/$t.log" 2>&1 &&
            "$tmp/$t" >> "$tmp/$t.log" 2>&1; then
        echo "ok    $t (ran): $(tail -n 1 "$tmp/$t.log")"
    else
        echo "FAIL  $t"
        sed 's/^/      /' "$tmp/$t.log" | head -n 20
        status=1
    fi
done

exit $status
