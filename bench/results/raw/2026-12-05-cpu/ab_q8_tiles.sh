#!/usr/bin/env bash
# stop 75 A/B: 13f24d1 (/tmp/wt_old) against the working tree at 85f2e1a+ (/work/main)
set -u
export OMP_WAIT_POLICY=active PYTHON=/work/main/.venv/bin/python
R=/work/main/bench/results
for v in old new old new; do
    d=/work/main; [ $v = old ] && d=/tmp/wt_old
    (cd $d && GEMV_RES=$R/gemv_cpu_q8_cm_tiles_2026-12-05.md bench/gemv_cpu.sh -t 2 -r 10 -m cold -q q8_0 -L cols) > /tmp/abrun/gemv-$v.log 2>&1
done
for T in 1 2 4 8; do for v in old new; do
    d=/work/main; [ $v = old ] && d=/tmp/wt_old
    (cd $d && GEMV_RES=$R/gemm_cpu_q8_cm_tiles_2026-12-05.md bench/gemm_cpu.sh -t 2 -r 10 -P 2 -T $T -q q8_0 -L cols) > /tmp/abrun/gemm-$T-$v.log 2>&1
done; done
cd /work/main
BATCHES=1,2,4,8 LEVELS="dense@LLAMA_SPARSE_CPU_LAYOUT=rows32" ROUNDS=3 REPS=5 RES=$R/cpu_layout_rows32_2026-12-05.md bench/cpu_batch_e2e.sh /tmp/cpu_e2e/smol.zz.q8_0.gguf /tmp/cpu_e2e/smol.stock.Q8_0.gguf > /tmp/abrun/rows32-q8.log 2>&1
BATCHES=1,2,4,8 LEVELS="dense@LLAMA_SPARSE_CPU_LAYOUT=rows32,0.50,0.50@LLAMA_SPARSE_CPU_LAYOUT=rows32" ROUNDS=3 REPS=5 RES=$R/cpu_layout_rows32_2026-12-05.md bench/cpu_batch_e2e.sh /tmp/cpu_e2e/smol.zz.q4_k.cal.gguf /tmp/cpu_e2e/smol.stock.Q4_K_M.gguf > /tmp/abrun/rows32-q4k.log 2>&1
echo ALLDONE > /tmp/abrun/done
