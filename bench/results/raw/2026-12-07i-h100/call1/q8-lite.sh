#!/usr/bin/env bash
# The least device time for Q8_0 G8 (after failed starts): test_zz_cuda built without ggml-cuda, its tests once, then
# its bench of q8_0_g8 against q8_0 (the kernel before this change) at batch 1 and 4 on the two shapes with stock
# figures in cuda_types_h100_2026-12-07f.md, two rounds. No fork or stock build, no model.
set -u
export BENCH_TYPE=q8_0_g8,q8_0 BENCH_BATCH=1,4 BENCH_ENVS=LLAMA_SPARSE_DEFAULTS=1 BENCH_SHAPES=4096x4096,11008x4096
LS_DEVICE_DIR=$PWD/.device bash tools/device/device.sh remote-bg build-base zztest-lite bench-cfg
LS_DEVICE_DIR=$PWD/.device bash tools/device/device.sh poll ${POLL:-540}
