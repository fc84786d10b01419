#!/usr/bin/env bash
# stats counters, round 2: the new test binary's test; chain A/B base / new / new with counters on (batch 1 and 4);
# the fork built meanwhile, then the Q4_K architecture case on the GPU
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
grep -E "^-- round|^ ?[14] +[0-9]+%" $OUT/chain.log | head -80
LS_DEVICE_DIR=$PWD/.device bash tools/device/device.sh poll ${POLL:-300}
