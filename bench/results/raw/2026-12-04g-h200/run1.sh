#!/usr/bin/env bash
# stop 71: attn-decode version 8 in decode at 16k / 24k / 32k: stock, fork with version 8 from 16384, fork with it off
# (llama-bench -v, so each log shows whether version 8 ran); test-backend-ops FLASH_ATTN_EXT (one token, f16 K/V)
# with version 8 at every length against the CPU
set -u
export BUILD_TARGETS="llama ggml llama-bench test-backend-ops" SPARQ_E2E_DEPTHS="${DEPTHS:-16384 24576 32768}"
export SPARQ_ROUNDS_N=${ROUNDS_N:-3} SPARQ_LB_ARGS="-v"
export OPS_LIST="FLASH_ATTN_EXT@nb=1,.*type_K=f16,type_V=f16:attn-long"
export SPARQ_ROUNDS="stock long:LLAMA_SPARSE_CUDA_ATTN_LONG=16384 off:LLAMA_SPARSE_CUDA_ATTN_LONG=0"
LS_DEVICE_DIR=$PWD/.device bash tools/device/device.sh remote-bg build-base stock-bg build model8b-bg ops \
    model8b-wait stock-wait sparq-rounds
LS_DEVICE_DIR=$PWD/.device bash tools/device/device.sh poll ${POLL:-560}
