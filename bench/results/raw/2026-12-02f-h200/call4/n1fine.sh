#!/usr/bin/env bash
# fine n1 sweep (n2 = 4) of DENSE and FUSED at batch 1 around the launch grid's wave boundaries (v2f = current kernels)
set -u
cd .device && tar xJf zzpack/zz.tar.xz && cd ..
D=.device/zz; export LD_LIBRARY_PATH=$D/lib
O=$OUT/n1fine; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $O/dev.txt
declare -A L=(
 [28672x8192]="0 7 8 9 10 11 13 14 15 16 18 20 24 28"
 [8192x28672]="0 12 14 15 16 17 18 20 22 24 28 32"
 [13824x5120]="0 7 8 9 12 14 15 19"
 [8192x8192]="0 14 15 16 17 20 24 32 33"
 [14336x4096]="0 7 8 9 10"
 [11008x4096]="0 10 11 12 13")
for r in 1 2; do
for s in 28672x8192 8192x28672 13824x5120 8192x8192 14336x4096 11008x4096; do
  for n1 in ${L[$s]}; do
    if [ $n1 = 0 ]; then unset LLAMA_SPARSE_CUDA_N1 LLAMA_SPARSE_CUDA_N2; else export LLAMA_SPARSE_CUDA_N1=$n1 LLAMA_SPARSE_CUDA_N2=4; fi
    timeout 60 $D/v2f bench --type q4_K --batch 1 --reduction early --shapes $s 2>&1 | grep -E "^q4_K" | sed "s/^/r$r n1=$n1 /" >> $O/sweep.log
  done
done
done
wc -l $O/sweep.log
