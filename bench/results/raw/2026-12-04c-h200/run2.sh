#!/usr/bin/env bash
# stats at batch 2-8, round 2: w = warp 0 of the first 16 block-rows counts its share of the block's columns after the
# loop (at 2-8 tokens; batch 1 counts in the loop as before), w1 = the same at every batch; test; chain A/B at batch
# 1, 2, 5, 8, counters on; beside it the fork build (w), the batched arch test and the 7B zz-rounds
set -u
d=.device/zb
mkdir -p /tmp/zb/lib && cp $d/lib/* /tmp/zb/lib/
for b in base w w1; do xz -dc $d/$b.xz > /tmp/zb/$b & done; wait; chmod +x /tmp/zb/*
export ARCH_TEST_K="batched or q4_k" ZZ_ROUNDS="stock:stock 0.50:a 0.50:nostats:LLAMA_SPARSE_CUDA_STATS=0" ZZ_ROUNDS_N=3 ZZ_REPS=10
LS_DEVICE_DIR=$PWD/.device bash tools/device/device.sh remote-bg build-base model-bg stock-bg build model-wait modelzz-bg \
    arch-test stock-wait modelzz-wait zz-rounds
export LD_LIBRARY_PATH=/tmp/zb/lib
for v in w w1; do
    timeout 200 /tmp/zb/$v test > $OUT/test-$v.log 2>&1; echo "$v test rc $?"; grep -E "FAIL" $OUT/test-$v.log | head -8
done
for i in 1 2; do
  for v in base w-stats w1-stats w; do
    b=${v%-stats}; env=""; [ "$v" != "$b" ] && env="LLAMA_SPARSE_TEST_CHAIN_STATS=1"
    echo "-- round $i $v" >> $OUT/chain.log
    env $env timeout 100 /tmp/zb/$b chain --model 7b --batch 1,2,5,8 >> $OUT/chain.log 2>&1 || echo "chain $v failed"
  done
done
echo "chain done $(date)"
LS_DEVICE_DIR=$PWD/.device bash tools/device/device.sh poll ${POLL:-360}
