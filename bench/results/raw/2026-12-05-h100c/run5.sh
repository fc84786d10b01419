#!/usr/bin/env bash
# for the next H100 session: (1) issue 6's GEMV table on the H100 with stock mmvq in the same process (EARLY reduction,
# decode's); (2) SparQ's auto start on the H100: 16k and 12k with min_kv=0 against auto (auto keeps these dense)
set -u
export BUILD_TARGETS="llama ggml llama-bench" ZZTEST_RUNS=1 BENCH_REDUCTION=early
export SPARQ_E2E_DEPTHS="${DEPTHS:-16384 12288}" SPARQ_ROUNDS_N=${ROUNDS_N:-3} SPARQ_LB_ARGS="-v"
export SPARQ_ROUNDS="stock sparq0:LLAMA_SPARQ=r=32,k=128,min_kv=0 zzdense zzsparq0:LLAMA_SPARQ=r=32,k=128,min_kv=0"
LS_DEVICE_DIR=$PWD/.device bash tools/device/device.sh remote-bg build-base stock-bg build model8b-bg zztest bench \
    model8b-wait combo8b-prep stock-wait sparq-rounds
LS_DEVICE_DIR=$PWD/.device bash tools/device/device.sh poll ${POLL:-560}
