#!/usr/bin/env bash
# llama-sparse: llama-bench tg rounds of one zigzag model under several environments, alternating within each
# round (paired comparisons of run-time knobs on a GPU machine).
#   bench/cuda_env_ab.sh MODEL 'LEVEL ...' 'VAR=V ...' 'VAR=V ...' ...
#   e.g. bench/cuda_env_ab.sh r7b.zz.cal.gguf 'dense 0.50' LLAMA_SPARSE_CUDA_TICKET=0 LLAMA_SPARSE_CUDA_TICKET=2
#   env: R=3 rounds, N=128 tokens, REPS=5, LLAMA_BENCH (default /tmp/b-fork/bin/llama-bench, device.sh's build)
set -euo pipefail
[ $# -ge 3 ] || { sed -n 2,6p "$0"; exit 2; }
model=$1 levels=$2; shift 2
bin=${LLAMA_BENCH:-/tmp/b-fork/bin/llama-bench}
for r in $(seq "${R:-3}"); do
    for lv in $levels; do
        line="round $r $lv:"
        for e in "$@"; do
            # shellcheck disable=SC2086
            t=$(env $e LLAMA_SPARSE="$lv" "$bin" -m "$model" -ngl 99 -p 0 -n "${N:-128}" -r "${REPS:-5}" 2>/dev/null |
                awk -F'|' '/tg[0-9]/ {gsub(/^ +| +$/, "", $(NF-1)); print $(NF-1)}')
            line="$line [$e] ${t:-failed} |"
        done
        echo "$line"
    done
done
