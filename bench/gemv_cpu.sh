#!/usr/bin/env bash
# llama-sparse: builds bench/gemv_cpu.c (decode GEMV) or, run as bench/gemm_cpu.sh (a link to this file),
# bench/gemm_cpu.c (prefill GEMM) against the stock ggml build and runs it; the table, the command and the
# CPU model go to bench/results/<program>_<date>.md.
# usage: bench/gemm_cpu.sh [-t n_threads] [-r rounds] [-P procs] [-T tokens] [-q q4_k|q6_k|q8_0] [-S 0|1] [-L rows|cols] (gemm_cpu.c's header)
#        bench/gemv_cpu.sh [-t n_threads] [-r reps] [-s min|median] [-m hot|cold] [-q q4_k|q8_0] [-S 0|1 (1: SmolLM2 shapes)]
#                          [-L rows|cols|both] [-P procs (default 6; 0: both sides in one process, the old way)]
#   env: NO_SAVE=1 to only print; GEMV_RES=file to append to another results file; ZZ_CFLAGS="-DZZ_GROUP=4" to build the kernels with other tuning macros
set -euo pipefail

prog="$(basename "$0" .sh)"
case "$prog" in
    gemv_cpu) title="CPU decode GEMV: stock Q4_K mul_mat vs zigzag MUL_MAT_ZZ" ;;
    gemm_cpu) title="CPU prefill GEMM: stock mul_mat vs zigzag MUL_MAT_ZZ" ;;
    *) echo "run as bench/gemv_cpu.sh or bench/gemm_cpu.sh" >&2; exit 2 ;;
esac

root="$(cd "$(dirname "$0")/.." && pwd)"
up="${LLAMA_SPARSE_UPSTREAM:-$("${PYTHON:-$root/.venv/bin/python}" "$root/tools/upstream.py" pristine)}"
bin="${LLAMA_SPARSE_STOCK_BIN:-$HOME/.cache/llama-sparse/stock-build/bin}"
out="${TMPDIR:-/tmp}/llama-sparse-bench"
mkdir -p "$out"

# -O3 like ggml-cpu's Release build; ggml_barrier renamed to the shim's barrier (tests/c/zz_test_threads.h)
"${CC:-gcc}" -std=c11 -O3 -march=native -Wall -Wno-unused-function -D_GNU_SOURCE ${ZZ_CFLAGS:-} \
    -Dggml_barrier=zz_test_barrier \
    -I"$root/ggml-sparse" -I"$root/tests/c" \
    -I"$up/ggml/include" -I"$up/ggml/src" -I"$up/ggml/src/ggml-cpu" \
    "$root/bench/$prog.c" \
    "$root/ggml-sparse/ggml-sparse-cpu.c" \
    "$root/ggml-sparse/zigzag-gemv-x86.c" \
    "$root/ggml-sparse/zigzag-gemv-arm.c" \
    "$root/ggml-sparse/zigzag-gemm.c" \
    -L"$bin" -Wl,-rpath,"$bin" -lggml-cpu -lggml-base -lpthread -lm \
    -o "$out/$prog"

# stock runs on OpenMP threads: keep them spinning between calls like the zigzag pool does (the bench runs
# each side in its own processes, so neither side's spinners compete with the other's calls; -P in the programs)
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-active}"
up_start="$(uptime)"
table="$("$out/$prog" "$@")"
echo "$table"

if [ "${NO_SAVE:-0}" != "1" ]; then
    # one section per run, appended: a day's runs (hot/cold, thread counts) share a file
    res="${GEMV_RES:-$root/bench/results/${prog}_$(date +%Y-%m-%d).md}"
    [ -f "$res" ] || printf '# %s\n' "$title" > "$res"
    {
        echo
        echo "## $(date -u +%H:%MZ): \`${LLAMA_SPARSE_CPU_SLICE_MAX:+LLAMA_SPARSE_CPU_SLICE_MAX=$LLAMA_SPARSE_CPU_SLICE_MAX }${LLAMA_SPARSE_CPU_GEMM:+LLAMA_SPARSE_CPU_GEMM=$LLAMA_SPARSE_CPU_GEMM }${LLAMA_SPARSE_STOCK_BIN:+LLAMA_SPARSE_STOCK_BIN=$LLAMA_SPARSE_STOCK_BIN }${ZZ_CFLAGS:+ZZ_CFLAGS=\"$ZZ_CFLAGS\" }OMP_WAIT_POLICY=$OMP_WAIT_POLICY bench/$prog.sh $*\`"
        echo
        echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores visible," \
             "flags: $(grep -o 'avx[^ ]*\|f16c\|fma' /proc/cpuinfo | sort -u | tr '\n' ' ')"
        # the stock build's x86 options (a build with GGML_NATIVE=OFF compares other instruction sets)
        echo "stock: $bin ($(grep -hoE '^GGML_(NATIVE|AVX[0-9A-Z_]*|FMA|F16C):BOOL=[A-Z]+' "$bin/../CMakeCache.txt" 2>/dev/null |
             sed 's/:BOOL//' | tr '\n' ' ' | sed 's/ $//'))"
        echo "commit: $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo none)," \
             "load average at start: $(echo "$up_start" | sed 's/.*load average: //'), at end: $(cut -d' ' -f1-3 /proc/loadavg)"
        echo
        echo "$table"
    } >> "$res"
    echo "written: $res"
fi
