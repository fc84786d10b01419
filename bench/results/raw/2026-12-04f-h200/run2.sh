#!/usr/bin/env bash
# stop 70: attn-decode version 8 (long KV, streamed split + combine): test and bench-long of three builds
# m4: U 4, mask with the rows; p2: U 2 + next step's rows requested first; p4: U 4 + the same, 1 block an SM
set -u
B=${BUILDS:-m4 p2 p4}
mkdir -p /tmp/zb
for x in $B; do xz -dc .device/ta/$x.xz > /tmp/zb/$x && chmod +x /tmp/zb/$x; done
for x in $B; do timeout 120 /tmp/zb/$x test > $OUT/test-$x.log 2>&1; echo "test $x rc $?"; grep -E "FAIL|PASSED|FAILED" $OUT/test-$x.log | tail -4; done
for x in $B; do
  timeout 100 /tmp/zb/$x bench-long > $OUT/bench-long-$x.log 2>&1; echo "bench-long $x rc $?"
  grep -E "FAIL|bench-long v8" $OUT/bench-long-$x.log | sed "s/^/$x /; s/heads 32.8 //; s/ a launch//"
done
