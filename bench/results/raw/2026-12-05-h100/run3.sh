#!/usr/bin/env bash
# stop 74: fork with the version 8 default (on from 24576) against stock and against it off, decode at 32k / 24k
set -u
export BUILD_TARGETS="llama ggml llama-bench" SPARQ_E2E_DEPTHS="${DEPTHS:-32768 24576}"
export SPARQ_ROUNDS_N=${ROUNDS_N:-3} SPARQ_LB_ARGS="-v"
export SPARQ_ROUNDS="stock fork off:LLAMA_SPARSE_CUDA_ATTN_LONG=0"
LS_DEVICE_DIR=$PWD/.device bash tools/device/device.sh remote-bg build-base stock-bg build model8b-bg \
    model8b-wait stock-wait sparq-rounds
LS_DEVICE_DIR=$PWD/.device bash tools/device/device.sh poll ${POLL:-560}
