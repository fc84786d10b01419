#!/usr/bin/env bash
# llama-sparse: llama-bench tg rounds of one zigzag model on the GPU under several environments, alternating within
# each round (paired comparisons of run-time knobs), through bench/r7b_ab.sh.
#   bench/cuda_env_ab.sh MODEL 'LEVEL ...' 'VAR=V ...' 'VAR=V ...' ...
#   e.g. bench/cuda_env_ab.sh r7b.zz.cal.gguf 'dense 0.50' LLAMA_SPARSE_CUDA_TICKET=0 LLAMA_SPARSE_CUDA_TICKET=2
#   env: R=3 rounds, N=128 tokens, REPS=5, LLAMA_BENCH (default /tmp/b-fork/bin/llama-bench, device.sh's build)
set -euo pipefail
[ $# -ge 3 ] || { sed -n 2,6p "$0"; exit 2; }
model=$1 levels=$2; shift 2
cfgs=()
for lv in $levels; do
    for e in "$@"; do
        cfgs+=("fork:LLAMA_SPARSE=$lv $e:-ngl 99")
    done
done
LLAMA_SPARSE_FORK_BIN=${LLAMA_BENCH:-/tmp/b-fork/bin/llama-bench} R=${R:-3} N=${N:-128} REPS=${REPS:-5} T= \
    exec "$(dirname "$0")/r7b_ab.sh" "$model" "$model" "${cfgs[@]}"
