#!/usr/bin/env bash
# stats counters: test + A/B of the test binaries (batch 1, then FUSED at batch 5-8) while the fork builds, then
# arch-test on the GPU
set -u
d=.device/zb
mkdir -p /tmp/zb/lib && cp $d/lib/* /tmp/zb/lib/ && for b in base new; do xz -dc $d/$b.xz > /tmp/zb/$b; chmod +x /tmp/zb/$b; done
LS_DEVICE_DIR=.device bash tools/device/device.sh remote-bg build-base build arch-test
ZZ_AB_ROUNDS=2 ZZ_AB_BATCH=1 bash tools/device/zz-bin-ab.sh /tmp/zb $OUT/ab1 base new
export LD_LIBRARY_PATH=/tmp/zb/lib
for i in 1 2; do for b in base new; do
    echo "-- round $i $b" >> $OUT/ab8.log
    timeout 120 /tmp/zb/$b bench --type q4_K --batch 5,8 --reduction early \
        --shapes 4096x4096,11008x4096,4096x11008,14336x4096 >> $OUT/ab8.log 2>&1 || echo "bench8 $b failed"
done; done
grep -E "^q4_K|^-- round" $OUT/ab8.log | head -60
LS_DEVICE_DIR=.device bash tools/device/device.sh poll ${POLL:-280}
