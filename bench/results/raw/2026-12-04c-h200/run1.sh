#!/usr/bin/env bash
# stats at batch 2-8 (stop 68): test of new / v1 / v2 (recount after the loop unrolled / after, token loop rolled /
# before the loop, rolled); chain A/B at batch 2, 5, 8 with the counters on; beside it the fork build, the batched
# arch test and the 7B zz-rounds (stock, 0.50, 0.50 with LLAMA_SPARSE_CUDA_STATS=0)
set -u
d=.device/zb
mkdir -p /tmp/zb/lib && cp $d/lib/* /tmp/zb/lib/
for b in base new v2; do xz -dc $d/$b.xz > /tmp/zb/$b & done; wait; chmod +x /tmp/zb/*
export ARCH_TEST_K="batched or q4_k" ZZ_ROUNDS="stock:stock 0.50:a 0.50:nostats:LLAMA_SPARSE_CUDA_STATS=0" ZZ_ROUNDS_N=3 ZZ_REPS=10
LS_DEVICE_DIR=$PWD/.device bash tools/device/device.sh remote-bg build-base model-bg stock-bg build model-wait modelzz-bg \
    arch-test stock-wait modelzz-wait zz-rounds
export LD_LIBRARY_PATH=/tmp/zb/lib
for v in new v2; do
    timeout 200 /tmp/zb/$v test > $OUT/test-$v.log 2>&1; echo "$v test rc $?"; grep -E "failures|FAIL" $OUT/test-$v.log | head -8
done
for i in 1 2; do
  for v in base new-stats v2-stats v2; do
    b=${v%-stats}; env=""; [ "$v" != "$b" ] && env="LLAMA_SPARSE_TEST_CHAIN_STATS=1"
    echo "-- round $i $v" >> $OUT/chain.log
    env $env timeout 100 /tmp/zb/$b chain --model 7b --batch 2,5,8 >> $OUT/chain.log 2>&1 || echo "chain $v failed"
  done
done
grep -E "^-- round|^ ?[258] +(0|50|80)%" $OUT/chain.log
LS_DEVICE_DIR=$PWD/.device bash tools/device/device.sh poll ${POLL:-200}
