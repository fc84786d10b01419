#!/usr/bin/env bash
# stats counters, round 3 (counting moved out of the NORM/GLU loops): test; chain A/B base / new / new with counters
# on (batch 1 and 4); GEMV bench A/B at batch 1 and 8; the fork built meanwhile, then the Q4_K architecture case
set -u
d=.device/zb
mkdir -p /tmp/zb/lib && cp $d/lib/* /tmp/zb/lib/ && for b in base new; do xz -dc $d/$b.xz > /tmp/zb/$b; chmod +x /tmp/zb/$b; done
ARCH_TEST_K=q4_k LS_DEVICE_DIR=$PWD/.device bash tools/device/device.sh remote-bg build-base build arch-test
export LD_LIBRARY_PATH=/tmp/zb/lib
timeout 200 /tmp/zb/new test > $OUT/test-new.log 2>&1; echo "new test rc $?"; grep -E "failures|FAIL" $OUT/test-new.log | head -20
for i in 1 2 3; do
  for v in base new new-stats; do
    b=${v%-stats}; env=""; [ "$v" = new-stats ] && env="LLAMA_SPARSE_TEST_CHAIN_STATS=1"
    echo "-- round $i $v" >> $OUT/chain.log
    env $env timeout 120 /tmp/zb/$b chain --model 7b --batch 1,4 >> $OUT/chain.log 2>&1 || echo "chain $v failed"
  done
done
grep -E "^-- round|^ ?[14] +[0-9]+%" $OUT/chain.log
for i in 1 2; do for b in base new; do
    echo "-- round $i $b" >> $OUT/bench.log
    timeout 120 /tmp/zb/$b bench --type q4_K --batch 1,8 --reduction early \
        --shapes 4096x4096,11008x4096,4096x11008,14336x4096 >> $OUT/bench.log 2>&1 || echo "bench $b failed"
done; done
LS_DEVICE_DIR=$PWD/.device bash tools/device/device.sh poll ${POLL:-300}
