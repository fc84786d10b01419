#!/usr/bin/env bash
# llama-sparse: check and time test_sparq_cuda binaries built on the developer machine (cuda/tests/build-sparq.sh
# needs no GPU), so a device call spends no time building. DIR holds NAME/t for each build and lib/ with the
# libggml-base the binaries link; NEW and BASE name the two builds timed against each other, NEWP and BASEP their
# -DSPARQ_PHASE_TIMING builds (optional).
#
#   sparq-bin-ab.sh DIR OUT [NEW] [BASE] [NEWP] [BASEP]
#
# OUT gets the logs: every variant's tests of NEW, its fused variant's tests (spread and crowded chosen positions,
# SPARQ_TEST_RECENT=4; clusters of 16), alternating bench rounds of the two builds, and the phase stamps.
# SPARQ_AB_S: the bench's positions (default 256,4096,16384,32768); SPARQ_AB_FLAGS: more bench flags (e.g. --evict).
set -u
dir=$1 out=$2 new=${3:-new} base=${4:-base} newp=${5:-newp} basep=${6:-basep}
export LD_LIBRARY_PATH=$dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
mkdir -p "$out"
exec > >(tee -a "$out/sparq-bin-ab.log") 2>&1
echo "== $(date -u) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
rc=0
timeout 240 "$dir/$new/t" test > "$out/test-$new.log" 2>&1 || rc=$?
echo "$new test (every variant): rc $rc; $(tail -1 "$out/test-$new.log")"
grep -E "^FAIL" "$out/test-$new.log" | head -20
for r in 0 4; do
    rc=0
    SPARQ_TEST_RECENT=$r timeout 120 "$dir/$new/t" test --variant fused > "$out/test-$new-fused-recent$r.log" 2>&1 || rc=$?
    echo "$new test --variant fused, SPARQ_TEST_RECENT=$r: rc $rc; $(tail -1 "$out/test-$new-fused-recent$r.log")"
    grep -E "^FAIL" "$out/test-$new-fused-recent$r.log" | head -10
done
rc=0   # clusters of 16 blocks, resident at once or not (the size taken for few KV heads)
LLAMA_SPARSE_CUDA_SPARQ_FU_NB=-16 timeout 120 "$dir/$new/t" test --variant fused > "$out/test-$new-fused-fu16.log" 2>&1 || rc=$?
echo "$new test --variant fused, LLAMA_SPARSE_CUDA_SPARQ_FU_NB=-16: rc $rc; $(tail -1 "$out/test-$new-fused-fu16.log")"
S=${SPARQ_AB_S:-256,4096,16384,32768}
for i in 1 2 3; do
    for r in 0 4; do
        for b in "$base" "$new"; do
            echo "-- round $i recent=$r $b" >> "$out/bench.log"
            SPARQ_TEST_RECENT=$r timeout 60 "$dir/$b/t" bench --variant fused --S "$S" ${SPARQ_AB_FLAGS:-} 2>&1 | tee -a "$out/bench.log" |
                grep -E "^ +[0-9]+ +fused" | sed "s/^/round $i recent=$r $b /" || echo "bench $b failed"
        done
    done
done
for b in "$basep" "$newp"; do
    [ -x "$dir/$b/t" ] || continue
    echo "-- phases $b" | tee -a "$out/phases.log"
    timeout 60 "$dir/$b/t" bench --variant fused --S "$S" ${SPARQ_AB_FLAGS:-} 2>&1 | tee -a "$out/phases.log" | grep -E "fused" || echo "bench $b failed"
done
