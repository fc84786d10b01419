#!/usr/bin/env bash
# stop 75: issue 7 on an H100 (the device it names): the op against flash attention, then decode at 32k / 16k:
# stock, SparQ alone (auto), the zigzag model at dense, and it with SparQ
set -u
export BUILD_TARGETS="llama ggml llama-bench test-backend-ops" SPARQ_E2E_DEPTHS="${DEPTHS:-32768 16384}"
export SPARQ_ROUNDS_N=${ROUNDS_N:-3} SPARQ_LB_ARGS="-v"
export SPARQ_ROUNDS="stock sparq:LLAMA_SPARQ=r=32,k=128 zzdense zzsparq:LLAMA_SPARQ=r=32,k=128"
LS_DEVICE_DIR=$PWD/.device bash tools/device/device.sh remote-bg build-base stock-bg build model8b-bg sparq-opfa \
    model8b-wait combo8b-prep stock-wait sparq-rounds
LS_DEVICE_DIR=$PWD/.device bash tools/device/device.sh poll ${POLL:-560}
