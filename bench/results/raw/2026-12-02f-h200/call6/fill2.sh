#!/usr/bin/env bash
# 1) FUSED fill at batch 2-8 (LLAMA_SPARSE_CUDA_FUSED_FILL=8) against batch 1 only (=1): test, bench at batch 2,4,8
# 2) the fixed cost of a launch: the 7B chain under what-if settings (no init protocol, no norm fold, both, ACC)
set -u
cd .device && tar xJf zzfill/zz.tar.xz && cd ..
D=.device/zz; export LD_LIBRARY_PATH=$D/lib
O=$OUT/fill2; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $O/dev.txt
rc=0; LLAMA_SPARSE_CUDA_FUSED_FILL=8 timeout 200 $D/fill2 test > $O/test-fill8.log 2>&1 || rc=$?; echo "test FILL=8 rc $rc: $(tail -1 $O/test-fill8.log)"
S=4096x4096,11008x4096,4096x11008,14336x4096,4096x14336,5120x5120,13824x5120,5120x13824,8192x8192,28672x8192,8192x28672
for r in 1 2; do
  for f in 1 8; do
    LLAMA_SPARSE_CUDA_FUSED_FILL=$f timeout 150 $D/fill2 bench --type q4_K --batch 2,4,8 --reduction early --shapes $S 2>&1 | grep -E "^q4_K" | sed "s/^/r$r fill=$f /" >> $O/bench.log
  done
  for e in LLAMA_SPARSE_DEFAULTS=1 LLAMA_SPARSE_CUDA_WHATIF_NOINIT=1 LLAMA_SPARSE_TEST_CHAIN_NORM=0 LLAMA_SPARSE_TEST_CHAIN_NORM=0,LLAMA_SPARSE_CUDA_WHATIF_NOINIT=1 LLAMA_SPARSE_TEST_CHAIN_ACC=1; do
    env ${e//,/ } timeout 100 $D/fill2 chain --model 7b --batch 1 2>&1 | grep -E "^ ?[0-9]|floor" | sed "s/^/r$r $e /" >> $O/chain.log
  done
done
grep -c . $O/bench.log $O/chain.log
