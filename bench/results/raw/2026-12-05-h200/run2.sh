#!/usr/bin/env bash
# stop 73: attn-decode version 8 in decode at 32k / 24k, fork only (no stock build: the budget left after a lost
# machine): version 8 from 16384 against it off, llama-bench -v so each log shows whether version 8 ran
set -u
export BUILD_TARGETS="llama ggml llama-bench" SPARQ_E2E_DEPTHS="${DEPTHS:-32768 24576}"
export SPARQ_ROUNDS_N=${ROUNDS_N:-3} SPARQ_LB_ARGS="-v"
export SPARQ_ROUNDS="long:LLAMA_SPARSE_CUDA_ATTN_LONG=16384 off:LLAMA_SPARSE_CUDA_ATTN_LONG=0"
LS_DEVICE_DIR=$PWD/.device bash tools/device/device.sh remote-bg build-base build model8b-bg model8b-wait sparq-rounds
LS_DEVICE_DIR=$PWD/.device bash tools/device/device.sh poll ${POLL:-570}
