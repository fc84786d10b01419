#!/usr/bin/env bash
# H100: the staged zigzag GEMV's launch config (blocks a block-row N1, warps a block N2) for Q8_0 end to end
set -u
export BUILD_TARGETS="llama ggml llama-bench" TYPES_LAYERS=8 TYPES_ROUNDS=1 TYPES_E2E="q8_0" TYPES_STOCK=0
export TYPES_ENVS="- LLAMA_SPARSE_CUDA_N1=4 LLAMA_SPARSE_CUDA_N1=8 LLAMA_SPARSE_CUDA_N1=16 LLAMA_SPARSE_CUDA_N1=32 LLAMA_SPARSE_CUDA_N2=4,LLAMA_SPARSE_CUDA_N1=16 LLAMA_SPARSE_CUDA_N2=4,LLAMA_SPARSE_CUDA_N1=32 LLAMA_SPARSE_CUDA_N2=2,LLAMA_SPARSE_CUDA_N1=64 -"
LS_DEVICE_DIR=$PWD/.device bash tools/device/device.sh remote-bg build-base build types-e2e
LS_DEVICE_DIR=$PWD/.device bash tools/device/device.sh poll ${POLL:-500}
