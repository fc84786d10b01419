#!/usr/bin/env bash
# N1 sweep of the FUSED GEMV at batch 1 (v2f = current kernels)
set -u
cd .device && tar xJf zzpack/zz.tar.xz && cd ..
D=.device/zz; export LD_LIBRARY_PATH=$D/lib
O=$OUT/n1; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $O/dev.txt
for r in 1 2; do
for s in 4096x4096 11008x4096 4096x11008 14336x4096 4096x14336 5120x5120 13824x5120 8192x8192; do
  for n1 in 0 4 6 8 12 16 24 32; do
    if [ $n1 = 0 ]; then unset LLAMA_SPARSE_CUDA_N1; else export LLAMA_SPARSE_CUDA_N1=$n1; fi
    timeout 60 $D/v2f bench --type q4_K --batch 1 --reduction early --shapes $s 2>&1 | grep -E "^q4_K" | sed "s/^/r$r n1=$n1 /" >> $O/sweep.log
  done
done
done
unset LLAMA_SPARSE_CUDA_N1
wc -l $O/sweep.log
