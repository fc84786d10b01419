#!/usr/bin/env bash
# llama-sparse: bench/gemm_cpu.sh (prefill GEMM against stock's repacked Q4_K) on the device machine's CPU, for this
# checkout's kernels and, optionally, an older copy of ggml-sparse/, alternating within each round (one call).
# Stock ggml-cpu is built there from the pack's patched tree with the patches reversed (CPU only, native).
#
#   tools/device/cpu-gemm-ab.sh PACK_DIR OUT_DIR [OLD_GGML_SPARSE_DIR]
#   env: THREADS=16 TOKENS="16 32 128" ROUNDS=2 REPS=3 QTYPE=q4_k
#        STOCK_CMAKE="-DGGML_NATIVE=ON" (stock's ISA flags; a change needs a fresh /tmp/ls-bc)
#        ZZ_CFLAGS (the fork's kernels' extra flags, both sides), SIDE_ENVS="name:VAR=VALUE[+VAR=VALUE] ..." (more
#        sides: this checkout's kernels with those variables set)
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
[ $# -ge 2 ] || { sed -n '2,7p' "$0" >&2; exit 2; }
dev=$(cd "$1" && pwd); out=$2; old=${3:-}
mkdir -p "$out" /tmp/ls-u
[ -d /tmp/ls-u/fork ] || tar -C /tmp/ls-u -xJf "$dev/src.tar.xz"
if [ ! -d /tmp/ls-u/stock ]; then
    cp -r /tmp/ls-u/fork /tmp/ls-u/stock
    # the pack is pruned: hunks on files it left out fail, ggml/ must come back whole
    for p in $(ls -r "$repo"/patches/*.patch); do
        patch -d /tmp/ls-u/stock -R -p1 --batch -s -f --no-backup-if-mismatch < "$p" > /dev/null 2>&1 || true
    done
    if grep -rqs "sparse" /tmp/ls-u/stock/ggml/src/ggml-cpu/ggml-cpu.c; then
        echo "cpu-gemm-ab: stock ggml-cpu still holds the patches" >&2; exit 1
    fi
fi
t0=$(date +%s)
cmake -S /tmp/ls-u/stock -B /tmp/ls-bc -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=OFF \
    ${STOCK_CMAKE:--DGGML_NATIVE=ON} -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    > "$out/cmake-stock.log" 2>&1
cmake --build /tmp/ls-bc -j "$(nproc)" --target ggml-cpu ggml-base > "$out/build-stock.log" 2>&1 ||
    { tail -30 "$out/build-stock.log"; exit 1; }
echo "stock ggml-cpu built in $(( $(date +%s) - t0 )) s"
lscpu > "$out/lscpu.txt" 2>&1 || true

sides=(new)
if [ -n "$old" ]; then
    # what bench/gemm_cpu.sh compiles, with the old kernels
    rm -rf /tmp/ls-old && mkdir -p /tmp/ls-old/tests && cp -r "$repo/bench" "$repo/ggml-sparse" /tmp/ls-old/ &&
        cp -r "$repo/tests/c" /tmp/ls-old/tests/ && cp "$old"/* /tmp/ls-old/ggml-sparse/
    sides+=(old)
fi
declare -A side_env=()
for se in ${SIDE_ENVS:-}; do
    sides+=("${se%%:*}")
    side_env[${se%%:*}]=${se#*:}
done
for ((r = 1; r <= ${ROUNDS:-2}; ++r)); do
    for T in ${TOKENS:-16 32 128}; do
        for side in "${sides[@]}"; do
            root=$repo; [ "$side" = old ] && root=/tmp/ls-old
            echo "round $r, T=$T, $side"
            extra=()
            [ -z "${side_env[$side]:-}" ] || IFS=+ read -r -a extra <<< "${side_env[$side]}"
            env "${extra[@]}" LLAMA_SPARSE_UPSTREAM=/tmp/ls-u/stock LLAMA_SPARSE_STOCK_BIN=/tmp/ls-bc/bin \
                GEMV_RES="$out/$side.md" TMPDIR=/tmp/ls-t-$side OMP_WAIT_POLICY=active \
                bash "$root/bench/gemm_cpu.sh" -t "${THREADS:-16}" -r "${REPS:-3}" -P 2 -T "$T" -L cols \
                -q "${QTYPE:-q4_k}" 2>&1 |
                grep -E "^\| [0-9]" | sed "s/^/$side T=$T: /"
        done
    done
done
