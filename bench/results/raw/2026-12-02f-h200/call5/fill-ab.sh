#!/usr/bin/env bash
# FUSED wave fill (LLAMA_SPARSE_CUDA_FUSED_FILL) on / off in one test_zz_cuda build: test, then rounds of the GEMV bench
# (11 shapes, batch 1, EARLY) and the 7B and 8B decode GEMV chains
set -u
cd .device && tar xJf zzfill/zz.tar.xz && cd ..
D=.device/zz; export LD_LIBRARY_PATH=$D/lib
O=$OUT/fill; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $O/dev.txt
rc=0; timeout 200 $D/fill test > $O/test-fill.log 2>&1 || rc=$?; echo "test rc $rc: $(tail -1 $O/test-fill.log)"
S=4096x4096,11008x4096,4096x11008,14336x4096,4096x14336,5120x5120,13824x5120,5120x13824,8192x8192,28672x8192,8192x28672
for r in 1 2; do
  for f in 0 1; do
    export LLAMA_SPARSE_CUDA_FUSED_FILL=$f
    timeout 100 $D/fill bench --type q4_K --batch 1 --reduction early --shapes $S 2>&1 | grep -E "^q4_K" | sed "s/^/r$r fill=$f /" >> $O/bench.log
    for mdl in 7b 8b; do
      timeout 100 $D/fill chain --model $mdl --batch 1 2>&1 | grep -E "^ ?[0-9]" | sed "s/^/r$r fill=$f $mdl /" >> $O/chain.log
    done
  done
done
grep -c . $O/bench.log $O/chain.log
