#!/usr/bin/env bash
# H100: zigzag Q8_0, Q6_K and Q4_0 models (8 layers of Llama-2-7B shapes) against stock on the same type, end to end
set -u
export BUILD_TARGETS="llama ggml llama-bench" TYPES_LAYERS=${TYPES_LAYERS:-8}
LS_DEVICE_DIR=$PWD/.device bash tools/device/device.sh remote-bg build-base stock-bg build stock-wait types-e2e
LS_DEVICE_DIR=$PWD/.device bash tools/device/device.sh poll ${POLL:-570}
