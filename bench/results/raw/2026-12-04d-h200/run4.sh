#!/usr/bin/env bash
# stop 69: test_zz_cuda test as of bddf39c (built on the developer machine); fork and stock builds; the GPU architecture
# test (batched, q4_k) with get/reset_stats synchronizing the context; 8B-shaped tg64 at 16k / 32k: stock, fork dense,
# fork + SparQ auto, zigzag dense, zigzag dense + SparQ auto
set -u
d=.device/zb
mkdir -p /tmp/zb/lib && cp $d/lib/* /tmp/zb/lib/
xz -dc $d/t.xz > /tmp/zb/t && chmod +x /tmp/zb/t
export ARCH_TEST_K="batched or q4_k" BUILD_TARGETS="llama ggml llama-bench" SPARQ_E2E_DEPTHS="16384 32768" SPARQ_ROUNDS_N=3
export SPARQ_ROUNDS="stock dense sparqauto:LLAMA_SPARQ=r=32,k=128 zzdense zzauto:LLAMA_SPARQ=r=32,k=128"
LS_DEVICE_DIR=$PWD/.device bash tools/device/device.sh remote-bg build-base stock-bg build model8b-bg arch-test \
    model8b-wait combo8b-prep stock-wait sparq-rounds
LD_LIBRARY_PATH=/tmp/zb/lib timeout 240 /tmp/zb/t test > $OUT/zztest.log 2>&1; echo "test_zz_cuda test rc $?"
grep -E "failures|FAIL" $OUT/zztest.log | tail -6
LS_DEVICE_DIR=$PWD/.device bash tools/device/device.sh poll ${POLL:-200}
