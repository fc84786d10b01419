#!/usr/bin/env bash
# llama-sparse: builds bench/zz_probe.c (zigzag-only GEMV timings, no stock side) and runs it; prints only.
# usage: bench/zz_probe.sh [zz_probe options]
#   env: ZZ_CFLAGS="-DZZ_CM_PF=0" builds the kernels with other tuning macros; ZZ_PROBE_B=dir (a copy of another
#   version's ggml-sparse/) adds that version's cm columns, alternating with this one's in every round (B's
#   tuning macros: ZZ_CFLAGS_B); ZZ_PROBE_BIN=path keeps the binary there; ZZ_PROBE_BUILD_ONLY=1
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
up="${LLAMA_SPARSE_UPSTREAM:-$("${PYTHON:-$root/.venv/bin/python}" "$root/tools/upstream.py" pristine)}"
bin="${LLAMA_SPARSE_STOCK_BIN:-$HOME/.cache/llama-sparse/stock-build/bin}"
exe="${ZZ_PROBE_BIN:-${TMPDIR:-/tmp}/llama-sparse-bench/zz_probe}"
mkdir -p "$(dirname "$exe")"

cflags=(-std=c11 -O3 -march=native -g -Wall -Wno-unused-function -D_GNU_SOURCE -Dggml_barrier=zz_test_barrier
        -I"$root/tests/c" -I"$up/ggml/include" -I"$up/ggml/src" -I"$up/ggml/src/ggml-cpu")
extra=()
if [ -n "${ZZ_PROBE_B:-}" ]; then
    # B's exported symbols renamed, so both versions link into one binary (B keeps A's row-layout repack)
    ren=()
    for f in ggml_sparse_cpu_forward_idx ggml_sparse_cpu_forward_mul_mat_zz ggml_sparse_cpu_n_tasks ggml_sparse_cpu_work_size \
             ggml_sparse_zz_dequant_block ggml_sparse_zz_dequant_x86 ggml_sparse_zz_gemv_cm_x86 ggml_sparse_zz_gemv_rows_x86 \
             ggml_sparse_zz_gemv_x86 ggml_sparse_zz_to_colmajor ggml_sparse_zz_cm_reduce_x86; do
        ren+=(-D$f=${f}_B)
    done
    objdir="$(dirname "$exe")/b-objs"
    mkdir -p "$objdir"
    for f in ggml-sparse-cpu zigzag-gemv-x86; do
        "${CC:-gcc}" "${cflags[@]}" ${ZZ_CFLAGS_B:-} "${ren[@]}" -I"$ZZ_PROBE_B" -c "$ZZ_PROBE_B/$f.c" -o "$objdir/$f.o"
        extra+=("$objdir/$f.o")
    done
    extra+=(-DZZ_PROBE_AB)
fi

"${CC:-gcc}" "${cflags[@]}" ${ZZ_CFLAGS:-} -I"$root/ggml-sparse" \
    "$root/bench/zz_probe.c" \
    "$root/ggml-sparse/ggml-sparse-cpu.c" \
    "$root/ggml-sparse/zigzag-gemv-x86.c" \
    "$root/ggml-sparse/zigzag-gemv-arm.c" \
    "$root/ggml-sparse/zigzag-gemm.c" \
    "${extra[@]}" \
    -L"$bin" -Wl,-rpath,"$bin" -lggml-cpu -lggml-base -lpthread -lm \
    -o "$exe"
[ "${ZZ_PROBE_BUILD_ONLY:-0}" = "1" ] && exit 0
exec "$exe" "$@"
