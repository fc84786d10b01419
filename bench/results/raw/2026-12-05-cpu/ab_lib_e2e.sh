#!/usr/bin/env bash
# stop 75: two builds of the fork's llama-bench (bin/ and lib/ of the installed package copied to /tmp/ls_A, /tmp/ls_B)
# alternating on the SmolLM2 files of bench/cpu_e2e.sh, 2 threads, tokens/s (llama-bench -r 5, mean)
# usage: ab_lib_e2e.sh A B [ROUNDS]
set -u
A=$1 B=$2 R=${3:-3}
q8=/tmp/cpu_e2e/smol.zz.q8_0.gguf q4=/tmp/cpu_e2e/smol.zz.q4_k.cal.gguf
run() { local v=$1 m=$2 lv=$3; shift 3; env LLAMA_SPARSE=$lv /tmp/ls_$v/bin/llama-bench -m $m -t 2 -r 5 "$@" -o csv 2>/dev/null | tail -1 | awk -F, '{print $(NF-1)}' | tr -d '"' | cut -c1-6; }
echo "| round | build | q8_0 dense tg64 | q8_0 dense p4 | q8_0 dense p8 | q4_k dense tg64 | q4_k 0.50 tg64 | q4_k 0.50 p8 |"
echo "|---|---|---|---|---|---|---|---|"
for r in $(seq 1 $R); do for v in $A $B; do
    echo "| $r | $v | $(run $v $q8 dense -p 0 -n 64) | $(run $v $q8 dense -p 4 -n 0) | $(run $v $q8 dense -p 8 -n 0) | $(run $v $q4 dense -p 0 -n 64) | $(run $v $q4 0.50 -p 0 -n 64) | $(run $v $q4 0.50 -p 8 -n 0) |"
done; done
