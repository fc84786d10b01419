#!/usr/bin/env bash
# H100: the ldg GEMV (Q8_0 / Q4_0 / Q6_K blocks straight into registers; steps a round LLAMA_SPARSE_CUDA_LDG_U) against
# the staged kernel (LLAMA_SPARSE_CUDA_DIRECT=0) and stock mmvq in the same process, after test_zz_cuda's tests; then
# 8 layers of Llama-2-7B shapes per type end to end against stock built in the same call
set -u
export BUILD_TARGETS="llama ggml llama-bench" ZZTEST_RUNS=1
export BENCH_TYPE=all BENCH_REDUCTION=early BENCH_BATCH=1,4 BENCH_SHAPES=4096x4096,11008x4096
export BENCH_ENVS="LLAMA_SPARSE_CUDA_DIRECT=0 LLAMA_SPARSE_DEFAULTS=1 LLAMA_SPARSE_CUDA_LDG_U=4 LLAMA_SPARSE_CUDA_LDG_U=16"
export TYPES_LAYERS=8 TYPES_ROUNDS=2 TYPES_ENVS="- LLAMA_SPARSE_CUDA_LDG_U=4"
LS_DEVICE_DIR=$PWD/.device bash tools/device/device.sh remote-bg build-base stock-bg build zztest bench-cfg stock-wait types-e2e
LS_DEVICE_DIR=$PWD/.device bash tools/device/device.sh poll ${POLL:-560}
