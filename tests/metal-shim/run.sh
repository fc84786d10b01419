#!/usr/bin/env bash
# llama-sparse: checks of the Metal kernels on Linux (CI): lint metal/*.metal, translate them with the
# MSL-on-CPU shim, build and run the kernel tests against the CPU ops, run the glue (ggml-sparse-metal.cpp)
# on stand-ins of ggml-metal's device layer, compile the ggml-metal hook code with -fsyntax-only, and
# configure ggml-metal's library build (patch 0010) with stand-in frameworks.
# usage: tests/metal-shim/run.sh [--quick] [--seed S]
# env: LLAMA_SPARSE_UPSTREAM (patched tree, default: tools/upstream.py fork),
#      LLAMA_SPARSE_STOCK_BIN (dir of libggml-base.so, default ~/.cache/llama-sparse/stock-build/bin),
#      CXX/CC (default clang++/clang: the shim needs clang's ext_vector_type)
set -euo pipefail

root="$(cd "$(dirname "$0")/../.." && pwd)"
here="$root/tests/metal-shim"
up="${LLAMA_SPARSE_UPSTREAM:-$(python3 "$root/tools/upstream.py" fork)}"
bin="${LLAMA_SPARSE_STOCK_BIN:-$HOME/.cache/llama-sparse/stock-build/bin}"
cxx="${CXX:-clang++}"
cc="${CC:-clang}"
case "$cxx" in *clang*) ;; *) cxx=clang++;; esac
case "$cc"  in *clang*) ;; *) cc=clang;; esac
out="${TMPDIR:-/tmp}/llama-sparse-metal-shim"
mkdir -p "$out"

if ! command -v "$cxx" >/dev/null; then
    echo "metal-shim: $cxx not found (apt-get install -y clang)" >&2
    exit 1
fi

echo "== lint metal/*.metal"
LLAMA_SPARSE_UPSTREAM="$up" python3 "$here/lint_metal.py" "$root"/metal/*.metal

echo "== translate and build"
objs=()
for src in "$root"/metal/*.metal "$here/selftest.metal"; do
    stem=$(basename "$src" .metal)
    python3 "$here/msl2cpp.py" "$src" "$out/$stem.cpp"
    "$cxx" -std=c++20 -O2 -g -U_FORTIFY_SOURCE -fsigned-char -Wall -Wno-unused-function -Wno-unused-variable -I"$here" -c "$out/$stem.cpp" -o "$out/$stem.o"
    objs+=("$out/$stem.o")
done

inc=(-I"$root/ggml-sparse" -I"$root/metal" -I"$root/tests/c" -I"$here" -I"$up/ggml/include" -I"$up/ggml/src" -I"$up/ggml/src/ggml-cpu")
for src in "$here/cpu-ref.c" "$root"/ggml-sparse/ggml-sparse-cpu*.c "$root"/ggml-sparse/zigzag-*.c; do
    "$cc" -std=c11 -O2 -march=native -D_GNU_SOURCE -Dggml_barrier=zz_test_barrier -Wno-unused-function \
        "${inc[@]}" -c "$src" -o "$out/$(basename "$src" .c).o"
    objs+=("$out/$(basename "$src" .c).o")
done
"$cxx" -std=c++20 -O2 -g -U_FORTIFY_SOURCE -Wall "${inc[@]}" -c "$here/test-metal-kernels.cpp" -o "$out/test-metal-kernels.o"
"$cxx" -o "$out/test-metal-kernels" "$out/test-metal-kernels.o" "${objs[@]}" \
    -L"$bin" -Wl,-rpath,"$bin" -lggml-base -lpthread -lm

echo "== kernels through the shim"
"$out/test-metal-kernels" "$@"

echo "== the ggml-metal glue (metal/ggml-sparse-metal.cpp) through stand-ins of ggml-metal's device layer"
ginc=("${inc[@]}" -I"$up/ggml/src/ggml-metal")
"$cc" -std=c11 -O2 -D_GNU_SOURCE -Wall -Wno-unused-function "${ginc[@]}" -c "$root/ggml-sparse/ggml-sparse.c" -o "$out/glue-ggml-sparse.o"
"$cxx" -std=c++17 -O2 -g -Wall -Wno-unused-function "${ginc[@]}" -c "$root/metal/ggml-sparse-metal.cpp" -o "$out/glue-ggml-sparse-metal.o"
"$cxx" -std=c++20 -O2 -g -U_FORTIFY_SOURCE -Wall "${ginc[@]}" -c "$here/test-metal-glue.cpp" -o "$out/test-metal-glue.o"
"$cxx" -o "$out/test-metal-glue" "$out/test-metal-glue.o" "$out/glue-ggml-sparse-metal.o" "$out/glue-ggml-sparse.o" \
    "$out/ggml-sparse-cpu-sparq.o" "$out/sparse-idx.o" "$out/mul-mat-zz.o" "$out/sparq-attn.o" -L"$bin" -Wl,-rpath,"$bin" -lggml-base -lpthread -lm
seed=()
for ((i = 1; i <= $#; ++i)); do [ "${!i}" = "--seed" ] && j=$((i + 1)) && seed=(--seed "${!j}"); done
"$out/test-metal-glue" "${seed[@]}"

if [ -x "$here/check_hooks.sh" ]; then
    echo "== ggml-metal hook code, -fsyntax-only"
    "$here/check_hooks.sh"
fi

if [ -x "$here/check_cmake.sh" ]; then
    echo "== ggml-metal library build rules (patch 0010), configured with stand-in frameworks"
    "$here/check_cmake.sh"
fi
