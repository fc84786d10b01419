#!/usr/bin/env bash
# llama-sparse: check and time test_zz_cuda binaries built on the developer machine (cuda/tests/build.sh needs no
# GPU), so a device call spends no time building. DIR holds the binaries (DIR/NAME) and lib/ with the libggml-base
# they link; BASE and the NEW builds are timed against each other.
#
#   zz-bin-ab.sh DIR OUT BASE NEW [NEW2 ...]
#
# OUT gets the logs: every NEW's `test`, then ZZ_AB_ROUNDS (default 3) rounds alternating the builds of the GEMV bench
# (Q4_K, batch ZZ_AB_BATCH (default 1), decode's EARLY reduction, the 7 Llama shapes) and the 32-layer 7B decode
# GEMV chain (chain --model ZZ_AB_MODEL, default 7b).
set -u
dir=$1 out=$2 base=$3
shift 3
news=("$@")
export LD_LIBRARY_PATH=$dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
mkdir -p "$out"
exec > >(tee -a "$out/zz-bin-ab.log") 2>&1
echo "== $(date -u) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
shapes=4096x4096,11008x4096,4096x11008,14336x4096,4096x14336,28672x8192,8192x28672
for new in "${news[@]}"; do
    rc=0
    timeout 300 "$dir/$new" test > "$out/test-$new.log" 2>&1 || rc=$?
    echo "$new test: rc $rc; $(tail -2 "$out/test-$new.log" | tr '\n' ' ')"
    grep -E "FAIL" "$out/test-$new.log" | head -20
done
for i in $(seq 1 "${ZZ_AB_ROUNDS:-3}"); do
    for b in "$base" "${news[@]}"; do
        echo "-- round $i $b" | tee -a "$out/bench.log" "$out/chain.log" > /dev/null
        timeout 150 "$dir/$b" bench --type q4_K --batch "${ZZ_AB_BATCH:-1}" --reduction early --shapes "$shapes" 2>&1 |
            tee -a "$out/bench.log" | grep -E "^q4_K" | sed "s/^/round $i $b /" || echo "bench $b failed"
        timeout 150 "$dir/$b" chain --model "${ZZ_AB_MODEL:-7b}" --batch 1 2>&1 |
            tee -a "$out/chain.log" | grep -E "^ ?[0-9]|^ T |floor" | sed "s/^/round $i $b /" || echo "chain $b failed"
    done
done
