#!/usr/bin/env bash
# stop 70: attn-decode version 8 in decode: test-backend-ops FLASH_ATTN_EXT (one token, f16 K/V) with version 8 at
# every length against the CPU; 8B-shaped tg64 at 8k / 16k / 32k: stock, fork (version 8 from 8192), fork with it off
set -u
export BUILD_TARGETS="llama ggml llama-bench test-backend-ops" SPARQ_E2E_DEPTHS="8192 16384 32768" SPARQ_ROUNDS_N=${ROUNDS_N:-2}
export OPS_LIST="FLASH_ATTN_EXT@nb=1,.*type_KV=f16:attn-long"
export SPARQ_ROUNDS="stock long:LLAMA_SPARSE_CUDA_ATTN_LONG=8192 off:LLAMA_SPARSE_CUDA_ATTN_LONG=0"
LS_DEVICE_DIR=$PWD/.device bash tools/device/device.sh remote-bg build-base stock-bg build model8b-bg ops \
    model8b-wait stock-wait sparq-rounds
LS_DEVICE_DIR=$PWD/.device bash tools/device/device.sh poll ${POLL:-540}
