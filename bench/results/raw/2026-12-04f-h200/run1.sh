#!/usr/bin/env bash
# stop 70: the fused SparQ op asks the next matmul's weight (wo) into L2 (LLAMA_SPARSE_CUDA_SPARQ_L2_NEXT 0 / 1 / 2);
# test-backend-ops SPARQ_ATTN; 8B-shaped tg64 at 32k: stock, zigzag dense + SparQ, SparQ alone, prefetch off / at start / after k_t
set -u
P="LLAMA_SPARQ=r=32,k=128"
export BUILD_TARGETS="llama ggml llama-bench test-backend-ops" SPARQ_E2E_DEPTHS="32768" SPARQ_ROUNDS_N=${ROUNDS_N:-3} OPS_LIST="SPARQ_ATTN"
export SPARQ_ROUNDS="stock zzpf2:$P zzpf0:$P+LLAMA_SPARSE_CUDA_SPARQ_L2_NEXT=0 zzpf1:$P+LLAMA_SPARSE_CUDA_SPARQ_L2_NEXT=1 pf2:$P pf0:$P+LLAMA_SPARSE_CUDA_SPARQ_L2_NEXT=0"
LS_DEVICE_DIR=$PWD/.device bash tools/device/device.sh remote-bg build-base stock-bg build model8b-bg ops \
    model8b-wait combo8b-prep stock-wait sparq-rounds
LS_DEVICE_DIR=$PWD/.device bash tools/device/device.sh poll ${POLL:-540}
