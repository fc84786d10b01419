#!/usr/bin/env bash
# H100: zigzag Q8_0 regrouped to the G8 layout (272-byte super-blocks) on the direct kernel. test_zz_cuda's tests (lite
# build beside the fork and stock builds: q8_0_g8 in the gemv, group, norm and glu tests), then 32 layers of
# Llama-2-7B shapes in Q8_0 end to end: stock, the fork with LLAMA_SPARSE_CUDA_G8=2 (Q8_0 regrouped) and
# with the default (Q4_0 only: Q8_0 in the file's layout, the kernel before this change) in the same rounds; EXTRA_STEPS=bench-cfg: then
# test_zz_cuda bench (lite: no stock column) of q8_0_g8 and q8_0 at batch 1 on the 7B/8B/70B shapes
set -u
export BENCH_TYPE=q8_0_g8,q8_0 BENCH_BATCH=1 BENCH_ENVS=LLAMA_SPARSE_DEFAULTS=1
export BUILD_TARGETS="llama ggml llama-bench" STOCK_TARGETS="llama ggml llama-bench"
export TYPES_E2E=q8_0 TYPES_LAYERS=32 TYPES_ROUNDS=2
export TYPES_ENVS="${TYPES_ENVS:-LLAMA_SPARSE_CUDA_G8=2 -}"
LS_DEVICE_DIR=$PWD/.device bash tools/device/device.sh remote-bg build-base zztest-bg stock-bg build stock-wait zztest-wait types-e2e ${EXTRA_STEPS:-}
LS_DEVICE_DIR=$PWD/.device bash tools/device/device.sh poll ${POLL:-540}
