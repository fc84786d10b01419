#!/usr/bin/env bash
# stop 69: one-token attention (cuda/attn-decode.cu) at long contexts: test_attn_cuda (built on the developer machine)
# test, then bench-long (8B heads, 4k-32k, versions 2 / 3, blocks a KV head)
set -u
d=.device/zb
mkdir -p /tmp/zb/lib && cp $d/lib/* /tmp/zb/lib/
xz -dc $d/ta.xz > /tmp/zb/ta && chmod +x /tmp/zb/ta
export LD_LIBRARY_PATH=/tmp/zb/lib
timeout 120 /tmp/zb/ta test > $OUT/attn-test.log 2>&1; echo "test rc $?"; tail -2 $OUT/attn-test.log
timeout 300 /tmp/zb/ta bench-long 2>&1 | tee $OUT/attn-bench-long.log
