#!/usr/bin/env bash
# H100: a built-in table for the direct Q4_K kernel (none exists for the H100), then issue 6's GEMV table with the
# heuristic against the tuned file, stock mmvq in the same process
set -u
export BUILD_TARGETS="ggml" ZZTEST_RUNS=1 TUNE_BATCH=8 TUNED_ROUNDS=2 TUNED_BATCH=1
export TUNE_SHAPES=4096x4096,11008x4096,4096x11008,14336x4096,4096x14336,5120x5120,13824x5120,5120x13824,8192x8192,28672x8192,8192x28672
LS_DEVICE_DIR=$PWD/.device bash tools/device/device.sh remote-bg build-base build zztest tune bench-tuned
LS_DEVICE_DIR=$PWD/.device bash tools/device/device.sh poll ${POLL:-560}
