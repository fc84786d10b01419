#!/usr/bin/env bash
# H100: zigzag Q4_0 regrouped to G8 with the folded RMS norm and the SwiGLU fused into its launches at batch 1 (as
# Q4_K). test_zz_cuda's tests (lite build, beside the fork and stock builds: the new glu test, G8 norm cases), then 32 layers of Llama-2-7B shapes in Q4_0 end to
# end: stock and the fork (default: every fusion); TYPES_ENVS adds launch settings, e.g.
# TYPES_ENVS="- LLAMA_SPARSE_CUDA_NORM_FUSE=0,LLAMA_SPARSE_CUDA_FUSE_OPS=0" for the fusions off
set -u
export BUILD_TARGETS="llama ggml llama-bench"
export TYPES_E2E=q4_0 TYPES_LAYERS=32 TYPES_ROUNDS=2
export TYPES_ENVS="${TYPES_ENVS:--}"
LS_DEVICE_DIR=$PWD/.device bash tools/device/device.sh remote-bg build-base zztest-bg stock-bg build stock-wait zztest-wait types-e2e
LS_DEVICE_DIR=$PWD/.device bash tools/device/device.sh poll ${POLL:-540}
