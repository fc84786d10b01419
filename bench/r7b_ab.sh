#!/usr/bin/env bash
# llama-sparse: alternating llama-bench decode runs, stock and fork configurations in every round, for paired
# end-to-end comparisons on one file pair (bench/cpu_e2e.sh makes the files and writes reports; this only prints).
#   bench/r7b_ab.sh STOCK.gguf ZIGZAG.gguf 'NAME:ENV=V ENV2=V:ARGS' ...
#   NAME stock runs the stock build on STOCK.gguf, anything else the fork on ZIGZAG.gguf (NAME@FILE: on FILE);
#   ENV and ARGS may be empty
#   e.g. bench/r7b_ab.sh r7b.q4_k.gguf r7b.zz.cal.gguf 'stock::' 'fork:LLAMA_SPARSE=0.50:' 'fork:LLAMA_SPARSE=dense:-lm none'
#   env: R=3 rounds, N=32 tokens, T=2 threads (empty: llama-bench's default), REPS=2 repetitions a run,
#        LLAMA_SPARSE_STOCK_BIN (default: tools/build_stock.sh's), LLAMA_SPARSE_FORK_BIN (default: .venv's llama-bench)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
FB=${LLAMA_SPARSE_FORK_BIN:-$root/.venv/lib/python3.11/site-packages/llama_sparse/bin/llama-bench}
SB=${LLAMA_SPARSE_STOCK_BIN:-$HOME/.cache/llama-sparse/stock-build/bin}/llama-bench
[ $# -ge 3 ] || { sed -n 2,9p "$0"; exit 2; }
S=$1 M=$2; shift 2
R=${R:-3} N=${N:-32} T=${T-2} REPS=${REPS:-2}
for i in $(seq "$R"); do
    for v in "$@"; do
        name=${v%%:*} rest=${v#*:}
        envs=${rest%%:*} args=${rest#*:}
        if [ "$name" = stock ]; then bin=$SB model=$S; else bin=$FB model=$M; fi
        case $name in *@*) model=${name#*@} name=${name%%@*} ;; esac
        # shellcheck disable=SC2086
        r=$(env $envs "$bin" -m "$model" -p 0 -n "$N" ${T:+-t "$T"} -r "$REPS" $args 2>/dev/null |
            awk -F'|' -v t="tg$N" '$0 ~ t {gsub(/^ +| +$/, "", $(NF-1)); print $(NF-1)}')
        echo "round $i $name [$envs] [$args]: ${r:-failed}"
    done
done
