#!/usr/bin/env bash
# H100: the direct Q8_0 / Q4_0 GEMV (mul_mat_zz_gemv_b32) against the staged kernel (LLAMA_SPARSE_CUDA_DIRECT=0) and
# stock mmvq in the same process, after test_zz_cuda's tests of every type
set -u
export BUILD_TARGETS="ggml" ZZTEST_RUNS=1
export BENCH_TYPE=all BENCH_REDUCTION=early BENCH_BATCH=1,4 BENCH_SHAPES=4096x4096,11008x4096,4096x11008
export BENCH_ENVS="LLAMA_SPARSE_CUDA_DIRECT=0 LLAMA_SPARSE_DEFAULTS=1"
LS_DEVICE_DIR=$PWD/.device bash tools/device/device.sh remote-bg build-base build zztest bench-cfg
LS_DEVICE_DIR=$PWD/.device bash tools/device/device.sh poll ${POLL:-560}
