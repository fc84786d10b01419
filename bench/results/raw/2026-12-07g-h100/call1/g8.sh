#!/usr/bin/env bash
# H100: zigzag Q4_0 regrouped on the device (G8 layout, the direct kernel) against the file's layout (ldg kernel) and
# stock mmvq Q4_0 in the same process, after test_zz_cuda's tests (G8 included); then 8 layers of Llama-2-7B shapes
# in Q4_0 end to end: stock, the fork (G8, the default) and the fork with LLAMA_SPARSE_CUDA_G8=0
set -u
export BUILD_TARGETS="llama ggml llama-bench" ZZTEST_RUNS=1
export BENCH_TYPE=q4_0,q4_0_g8 BENCH_REDUCTION=early BENCH_BATCH=1,4
export BENCH_SHAPES=4096x4096,11008x4096,4096x11008,14336x4096,28672x8192
export BENCH_ENVS="LLAMA_SPARSE_DEFAULTS=1"
export TYPES_E2E=q4_0 TYPES_LAYERS=8 TYPES_ROUNDS=2 TYPES_ENVS="- LLAMA_SPARSE_CUDA_G8=0"
LS_DEVICE_DIR=$PWD/.device bash tools/device/device.sh remote-bg build-base stock-bg build zztest bench-cfg stock-wait types-e2e
LS_DEVICE_DIR=$PWD/.device bash tools/device/device.sh poll ${POLL:-560}
