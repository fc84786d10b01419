#!/usr/bin/env bash
# NOT RUN TO THE END: the device machine was taken back for other work before this call finished; nothing came back
# H100, on the machine call 1 left warm (its fork and stock builds): the same 32-layer Q4_0 model end to end, stock,
# the fork with every fusion (default) and with the norm fold and the SwiGLU / residual fusions off
set -u
export TYPES_E2E=q4_0 TYPES_LAYERS=32 TYPES_ROUNDS=2
export TYPES_ENVS="- LLAMA_SPARSE_CUDA_NORM_FUSE=0,LLAMA_SPARSE_CUDA_FUSE_OPS=0"
LS_DEVICE_DIR=$PWD/.device bash tools/device/device.sh remote types-e2e
