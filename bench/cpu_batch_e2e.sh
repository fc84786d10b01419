#!/usr/bin/env bash
# llama-sparse: small-batch forward passes end to end on the CPU, stock llama.cpp against the fork in the same run.
# llama-bench -p B -n 0 times one batch of B tokens at an empty context: B = 1 is batch-1 decode, 2-8 the
# batch decode path (sparse on the union of the batch's active columns), as speculative decoding's checks or
# several sequences decoding together run it. Rows: stock, fork dense, fork at each LEVELS entry; ROUNDS rounds,
# the rows alternating inside each; the table gives the best round's tokens/s and its ratio to stock.
#
#   bench/cpu_batch_e2e.sh ZIGZAG_GGUF STOCK_GGUF
#
# env: BATCHES=1,2,3,4,6,8 LEVELS=0.50 (an entry LEVEL@VAR=VALUE[+VAR=VALUE...] runs that level, or dense, with those
#      variables in the environment, e.g. dense@LLAMA_SPARSE_CPU_SLICE_MAX=0) ROUNDS=2 REPS=3 THREADS=2
#      LLAMA_SPARSE_STOCK_BIN=<stock bin/>
#      RES=<results file> (default bench/results/cpu_batch_e2e_DATE.md; - to only print)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
[ $# -eq 2 ] || { sed -n '2,12p' "$0" >&2; exit 2; }
zz=$1; stock_model=$2
for f in "$zz" "$stock_model"; do
    [ -f "$f" ] || { echo "cpu_batch_e2e: no such model file: $f" >&2; exit 2; }
done
BATCHES=${BATCHES:-1,2,3,4,6,8}
LEVELS=${LEVELS:-0.50}
ROUNDS=${ROUNDS:-2}
REPS=${REPS:-3}
THREADS=${THREADS:-2}
stock_bin=${LLAMA_SPARSE_STOCK_BIN:-$HOME/.cache/llama-sparse/stock-build/bin}
PY=$root/.venv/bin/python
fork_bench=$("$PY" -c "from llama_sparse.tools import tool_path; print(tool_path('bench'))")
[ -x "$stock_bin/llama-bench" ] || { echo "cpu_batch_e2e: no stock llama-bench in $stock_bin (tools/build_stock.sh)" >&2; exit 2; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

rows=("stock" "dense")
IFS=, read -r -a lv <<< "$LEVELS"
rows+=("${lv[@]}")

start=$(date -u +%H:%MZ)
for ((r = 1; r <= ROUNDS; ++r)); do
    for row in "${rows[@]}"; do
        echo "round $r: $row" >&2
        args=(-p "$BATCHES" -n 0 -r "$REPS" -t "$THREADS" -o jsonl)
        level=${row%%@*}
        extra=()
        [ "$level" = "$row" ] || IFS=+ read -r -a extra <<< "${row#*@}"
        if [ "$row" = stock ]; then
            env -u LLAMA_SPARSE "$stock_bin/llama-bench" -m "$stock_model" "${args[@]}" > "$tmp/${row//\//_}.$r.jsonl"
        elif [ "$level" = dense ]; then
            env -u LLAMA_SPARSE "${extra[@]}" "$fork_bench" -m "$zz" "${args[@]}" > "$tmp/${row//\//_}.$r.jsonl"
        else
            env LLAMA_SPARSE="$level" "${extra[@]}" "$fork_bench" -m "$zz" "${args[@]}" > "$tmp/${row//\//_}.$r.jsonl"
        fi
    done
done

table=$("$PY" - "$tmp" "$ROUNDS" "${rows[@]}" <<'EOF'
import json, sys
tmp, rounds, rows = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
best = {}
for row in rows:
    for r in range(1, rounds + 1):
        for line in open(f"{tmp}/{row.replace('/', '_')}.{r}.jsonl"):
            if line.strip():
                d = json.loads(line)
                k = (row, d["n_prompt"])
                best[k] = max(best.get(k, 0.0), float(d["avg_ts"]))
bs = sorted({b for _, b in best})
print("| row | " + " | ".join(f"B={b} t/s | vs stock" for b in bs) + " |")
print("|---|" + "---|---|" * len(bs))
for row in rows:
    name = "stock" if row == "stock" else f"fork {row}"
    cells = []
    for b in bs:
        v, s = best.get((row, b), 0.0), best.get(("stock", b), 0.0)
        cells += [f"{v:.2f}", f"{v / s:.2f}x" if s > 0 and row != "stock" else "-"]
    print(f"| {name} | " + " | ".join(cells) + " |")
EOF
)
echo "$table"

if [ "${RES:-}" != "-" ]; then
    res=${RES:-$root/bench/results/cpu_batch_e2e_$(date +%Y-%m-%d).md}
    [ -f "$res" ] || printf '# CPU small-batch forward passes end to end: stock llama.cpp vs llama-sparse\n' > "$res"
    {
        echo
        echo "## $start: \`BATCHES=$BATCHES LEVELS=$LEVELS ROUNDS=$ROUNDS REPS=$REPS THREADS=$THREADS bench/cpu_batch_e2e.sh $zz $stock_model\`"
        echo
        echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores visible;" \
             "commit $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo none); stock: $stock_bin"
        echo "llama-bench -p B -n 0 -r $REPS (one batch of B tokens at an empty context), tokens/s, best of $ROUNDS rounds"
        echo
        echo "$table"
    } >> "$res"
    echo "wrote $res" >&2
fi
