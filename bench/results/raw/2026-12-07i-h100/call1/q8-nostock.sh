#!/usr/bin/env bash
# q8.sh without stock's build (device time ran short after failed starts): test_zz_cuda's tests (lite build beside the
# fork build), 32 layers of Llama-2-7B shapes in Q8_0 end to end, the fork with Q8_0 regrouped (LLAMA_SPARSE_CUDA_G8=2)
# against the default (Q8_0 in the file's layout: the kernel before this change) in the same rounds, then
# test_zz_cuda bench of q8_0_g8 and q8_0 at batch 1 and 4 on two shapes (the ones with stock figures in
# cuda_types_h100_2026-12-07f.md)
set -u
export BUILD_TARGETS="llama ggml llama-bench"
export TYPES_E2E=q8_0 TYPES_LAYERS=${TYPES_LAYERS:-32} TYPES_ROUNDS=${TYPES_ROUNDS:-2} TYPES_STOCK=0
export TYPES_ENVS="${TYPES_ENVS:-LLAMA_SPARSE_CUDA_G8=2 -}"
export BENCH_TYPE=q8_0_g8,q8_0 BENCH_BATCH=1,4 BENCH_ENVS=LLAMA_SPARSE_DEFAULTS=1 BENCH_SHAPES=4096x4096,11008x4096
LS_DEVICE_DIR=$PWD/.device bash tools/device/device.sh remote-bg build-base zztest-bg build zztest-wait types-e2e ${EXTRA_STEPS-bench-cfg}
LS_DEVICE_DIR=$PWD/.device bash tools/device/device.sh poll ${POLL:-540}
