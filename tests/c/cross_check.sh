#!/usr/bin/env bash
# llama-sparse: builds the sparse CPU op sources for aarch64 (NEON) with a cross compiler and runs
# tests/c/test_zigzag_cross.c under qemu when it is installed (else: compile check only).
# needs: apt-get install gcc-aarch64-linux-gnu [qemu-user]; falls back to clang -fsyntax-only.
set -euo pipefail

root="$(cd "$(dirname "$0")/../.." && pwd)"
up="${LLAMA_SPARSE_UPSTREAM:-$HOME/.cache/llama-sparse/upstream}"
out="${TMPDIR:-/tmp}/llama-sparse-cross"
mkdir -p "$out"

inc=(-I"$root/ggml-sparse" -I"$up/ggml/include" -I"$up/ggml/src" -I"$up/ggml/src/ggml-cpu")
srcs=("$root/ggml-sparse/ggml-sparse-cpu.c" "$root/ggml-sparse/zigzag-gemv-x86.c"
      "$root/ggml-sparse/zigzag-gemv-arm.c" "$root/ggml-sparse/zigzag-gemm.c")

if command -v aarch64-linux-gnu-gcc > /dev/null; then
    aarch64-linux-gnu-gcc -std=c11 -O2 -march=armv8.2-a -static -Wall -Wextra -Werror \
        -Wno-unused-function -Wno-unused-parameter -D_GNU_SOURCE "${inc[@]}" \
        "$root/tests/c/test_zigzag_cross.c" "${srcs[@]}" -lm -o "$out/test_zigzag_cross"
    echo "aarch64 build: ok"
    if command -v qemu-aarch64 > /dev/null; then
        qemu-aarch64 "$out/test_zigzag_cross"
    else
        echo "qemu-aarch64 not found: compile check only"
    fi
else
    for f in "${srcs[@]}"; do
        clang --target=aarch64-linux-gnu -std=c11 -fsyntax-only -Wall "${inc[@]}" "$f"
    done
    echo "aarch64 syntax check (clang): ok"
fi
