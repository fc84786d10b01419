#!/usr/bin/env bash
# H100, on the machine call 1 left warm (its fork and stock builds): 32 layers of Llama-2-7B shapes in Q4_0 and Q8_0
# end to end: stock, the fork (default: Q4_0 regrouped to G8) and the fork with LLAMA_SPARSE_CUDA_G8=0
set -u
export TYPES_E2E="q4_0 q8_0" TYPES_LAYERS=32 TYPES_ROUNDS=2 TYPES_ENVS="- LLAMA_SPARSE_CUDA_G8=0"
LS_DEVICE_DIR=$PWD/.device bash tools/device/device.sh remote-bg types-e2e
LS_DEVICE_DIR=$PWD/.device bash tools/device/device.sh poll ${POLL:-540}
