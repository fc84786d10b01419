#!/usr/bin/env bash
# Build, test and bench the CUDA fork on a GPU machine with no network.
#
# Here:   tools/device/device.sh pack [DIR]    packs DIR (default .device) (< 64 MiB): src.tar.xz (the patched
#                                               upstream tree, pruned), repo.tar.gz (this checkout's tracked
#                                               files as they are now), py.tar.gz (pure-Python gguf, llama_cpp,
#                                               diskcache from PY_SITE, default .venv's site-packages), an
#                                               Austen slice and, with LEVELS_JSON, levels for modelzz
#                                               (bench/r7b_thresholds.py --save-levels); carry DIR to the device
# There:  tar -C /tmp/ls-repo -xzf DIR/repo.tar.gz; LS_DEVICE_DIR=DIR bash /tmp/ls-repo/tools/device/device.sh remote STEP...
#         (or from the repo root of a carried checkout of this branch, LS_DEVICE_DIR defaulting to .device)
#         remote-bg STEP... starts the same in its own session (logs in /tmp/ls-out), poll [S] waits up to S
#         seconds for it and copies the logs to $OUT: for chains longer than one device command (polls of at most
#         ~240 s, each called at once: machines went back after longer ones, bench/results/cuda_h100_2026-11-27h.md)
#   build      CUDA fork (sm_90): libllama, libggml*, test-backend-ops, llama-bench
#   stock      unpatched build of the same commit (patches reversed), llama-bench + test-backend-ops
#   ops        test-backend-ops -o MUL_MAT_ZZ / SPARSE_IDX / SPARQ_ATTN on CUDA against the CPU (OPS_LIST: OP or OP:variant,
#              variants zero-kernel, group-off, fuse-off, norm-off (LLAMA_SPARSE_CUDA_NORM_FUSE=0) / norm-group-off
#              (the fold on, without groups), ticket, atomic / first / early (TICKET=0 / 2 / 3), cluster,
#              kt-fuse-off (LLAMA_SPARSE_CUDA_KT_FUSE=0), rope-fuse-off (LLAMA_SPARSE_CUDA_ROPE_FUSE=0), attn-long
#              (LLAMA_SPARSE_CUDA_ATTN_LONG=1: one-token flash attention as attn-decode.cu's version 8 at any length),
#              bal-always / bal-off (LLAMA_SPARSE_CUDA_SPARQ_BALANCE=2 / 0))
#   arch-test  tests/python/test_architectures.py (tiny Qwen2/3, Phi-3, Gemma/2, Granite, Mixtral) on the GPU, after build
#              (ARCH_TEST_K: pytest -k; LS_DEVICE_DIR must be absolute here)
#   perf       test-backend-ops perf for the zigzag (ticket | atomic reduction side by side) and stock Q4_K matmuls
#   build-base configure + libggml-base only (then model-bg can run beside the rest of the build)
#   model-bg, model-wait   the model step in the background / join it
#   zztest     cuda/tests: build test_zz_cuda against the fork build (stock ggml-cuda linked), run `test` twice
#              and on step versions 1 and 2 (ZZTEST_RUNS=1: once)
#   zztest-lite  test_zz_cuda built without ggml-cuda (after build-base), `test` under each of ZZTEST_ENVS
#              (zztest-bg: in the background beside the builds; zztest-wait joins it)
#   bench      test_zz_cuda bench, batch 1, Llama-2-7B/13B/70B and Llama-3-8B shapes (incl. stock mmvq);
#              bench-staged: the same with Q4_K on the staged kernel (LLAMA_SPARSE_CUDA_DIRECT=0)
#   zz-chain   test_zz_cuda chain: decode's GEMV chain of a 7B / 8B shape, no model (CHAIN_ENVS A/B, after build-base;
#              LLAMA_SPARSE_TEST_CHAIN_NORM=0 / 1 / 2 in a setting: no norm / a norm kernel before q/k/v and gate/up / folded in, the default;
#              LLAMA_SPARSE_TEST_CHAIN_ACC=1: outputs that accumulate; the floor rows: the launches with no GEMV work)
#   chain-ab   zz-chain of two test_zz_cuda builds, A the defaults, B with NVCC flags CHAIN_AB_FLAGS (after build-base)
#   ab         test_zz_cuda built several ways (after build-base): A the defaults, then one build per AB_FLAGS entry
#              ('|' between them); each `test`, then AB_ROUNDS (2) rounds alternating the builds (and A under each of
#              AB_ENVS) of the bench (batch AB_BATCH, default 1; decode's EARLY reduction; 7 shapes) and the 7B chain
#   tune       test_zz_cuda tune on the bench's 7 shapes (TUNE_TYPES, default q4_K; TUNE_BATCH, default 1) into
#              $out/tune.txt (then e.g. ab with AB_ENVS=LLAMA_SPARSE_CUDA_TUNE_FILE=/tmp/ls-out/tune.txt)
#   bench-red  test_zz_cuda bench on the 7B shapes: ticket vs atomic reduction side by side, prefetch off, n1 8 / 32
#   mm-perf    test-backend-ops perf MUL_MAT_ZZ (LIST op + GEMV) and stock MUL_MAT Q4_K at batch 1
#   sparq-test cuda/tests: build test_sparq_cuda (after build-base), run `test` (vs the CPU reference) and `bench`,
#              every variant (single / split / fused)
#   sparq-bal  test_sparq_cuda test and bench of the fused kernel under LLAMA_SPARSE_CUDA_SPARQ_BALANCE 1 / 2 / 0, spread and
#              crowded (SPARQ_TEST_RECENT=4) chosen positions
#   sparq-q8   test_sparq_cuda bench of the fused op with the f16 and the 8-bit (q8_0) transposed K, alternating
#   sparq-q8-state  bench/sparq_state_check.py with kt=q8_0 on the 8B-shaped model at 16k (appended = rebuilt)
#   sparq-q8-e2e  tg64 at 16k/32k on the 8B-shaped model: stock, fork dense, SparQ r 32 k 128 with f16 and q8_0 k_t
#   kt-check   compute-sanitizer memcheck of the kt=q8_0 append kernel (test-backend-ops SPARQ_KT_APPEND), then a mutant
#              kernel the test must fail (source restored, test-backend-ops rebuilt)
#   sparq-q8-diag  tg64 at 32k: f16 k_t, q8_0 k_t with its append as one kernel and as four nodes, CUDA graphs on / off;
#              ncu device time per kernel of decode on a 4-layer 8B-shaped model, the same three copies
#   sparq-perf test-backend-ops perf SPARQ_ATTN (LLAMA_SPARSE_CUDA_SPARQ_SPLIT=0 and 1) and stock FLASH_ATTN_EXT,
#              Llama-3-8B shapes, S 4k/16k/32k
#   sparq-e2e  llama-bench tg32 at depth 16k/32k, dense vs LLAMA_SPARQ=r=32,k=128
#   model8b-bg, model8b-wait, sparq-e2e8b   random Llama-3-8B-shaped Q4_K; tg32 at depth 16k/32k, stock vs fork
#              dense vs fork SparQ r 32 k 128 (graph reuse on, and off through LLAMA_GRAPH_REUSE_DISABLE=1)
#   sparq-state  bench/sparq_state_check.py on a 4-layer 8B-shaped model at depth 16k: K copy rebuilt on the GPU
#              after a state load, against the host round trip
#   sparq-stalls  ncu warp stall reasons of sparq_attend / sparq_scores (SPARQ_STALL_KERNELS, SPARQ_STALL_VARIANT), per
#              reason and per SASS instruction
#   sparq-src  ncu details (registers, spills, stalls) of sparq_attend / sparq_scores
#   sparq-decomp  tg64 at 16k/32k on the 8B-shaped model: dense, SparQ with k above the context (upkeep only), SparQ k 128
#   sparq-fused-e2e  tg64 at 16k/32k on the 8B-shaped model: stock, fork dense, SparQ k 128 fused (default) and single
#   sparq-rounds  tg64 rounds of the configurations in SPARQ_ROUNDS on the 8B-shaped model (sparq8b_rounds)
#   combo8b-prep, combo8b  the 8B-shaped model as zigzag with level 0.50 (random-token calibration), then tg64 at
#              16k/32k: stock, fork dense, SparQ alone, TEAL 0.50 alone, both (after model8b-wait, stock-wait)
#   sparq-graphs tg32 at 16k, dense and SparQ, CUDA graphs on and off (4-layer 8B-shaped model unless model8b ran)
#   sparq-ncu-e2e  ncu device time of the attention kernels inside llama-bench decode at 16k (after sparq-graphs)
#   sparq-flush the fused op's bench plain, --flush, --evict and both, three rounds (after build-base)
#   sparq-probe  cuda/tests/sparq_probe.cu: latencies of the steps a SparQ op is built from (launch floors, barriers,
#              DSMEM, L2 / DRAM, global-counter barriers), skeletons of the op in four structures, streaming reads by
#              grid size and by bytes in flight a block
#   sparq-knobs  test_sparq_cuda bench under the step-1 grid and cluster-size knobs, against the default
#   sparq-phases  test_sparq_cuda bench (single variant) built with -DSPARQ_PHASE_TIMING: time per phase of both kernels
#   sparq-fused-phases  the same for the fused variant (block 0 and its cluster's last block)
#   sparq-ab   the SparQ bench built two ways (NVCC flags SPARQ_AB_A / SPARQ_AB_B, a sed SPARQ_AB_SED on B's source, or
#              A's cuda/sparq-attn.cu replaced by $LS_DEVICE_DIR/$SPARQ_AB_A_SRC),
#              rounds alternating; sparq-env-ab: one phase-timing build, default against SPARQ_ENV_B=VAR=VALUE
#   sanitize   compute-sanitizer memcheck + racecheck on test_zz_cuda (1 case each), memcheck on test_sparq_cuda
#   bench-q4kv direct Q4_K GEMV: step versions Q4KV_VERSIONS (default '1 2'; 2 is the default), same run;
#              bench-n1: LLAMA_SPARSE_CUDA_N1 8/16/24/32 (versions Q4KV_VERSIONS, default 2), batch 1
#   bench-cfg  test_zz_cuda bench under each of BENCH_ENVS (default: launch config against n1 = 16; built standalone
#              after build-base if needed), BENCH_TYPE (default q4_K; all: every type), BENCH_SHAPES, BENCH_BATCH
#   ncu-bytes  DRAM bytes per direct Q4_K GEMV launch against the active columns' weight bytes (test_zz_cuda bytes under
#              ncu, once under each of NCU_BYTES_ENVS, NCU_BYTES_SHAPES)
#   ncu-issue  ncu sections (speed of light, scheduler, warp states) of direct GEMV launches, dense and sparse, on a
#              large shape (NCU_ISSUE_SHAPE, default 28672x8192)
#   ncu-gemv, ncu-sparq   ncu sections (speed of light, occupancy, warp stalls) of the direct GEMV / SparQ kernels
#   sparq-ncu  ncu device time of the SparQ kernels, both variants; sparq-diag: one SparQ llama-bench run with its exit code
#   model      random-weight Llama-2-7B-shaped Q4_K GGUF (bench/make_random_gguf.py) in $LS_WORK
#   convert    llama-sparse convert -> zigzag q4_k
#   calib      llama-sparse calibrate, levels 0.25,0.4,0.5,0.65 unified, on the GPU, over 1024 seeded-random
#              token ids (the random model's dummy vocab cannot tokenize text)
#   thr        levels 0.25/0.40/0.50/0.65 written without calibration (r7b_thresholds.py --thresholds: one threshold
#              for every group, so not the level's share of weight bytes; calib is the measured one)
#   model-bg, model-wait   the model step in the background; it needs only libggml-base, so it can start after
#              build-base, beside the builds (the random 7B: 457 s in one process, 48 s in 32)
#   modelzz-bg, modelzz-wait   model + convert + calib as one background job (after build: convert and calibrate
#              load libllama; the model part is skipped after model-wait; the levels: those pack took from
#              LEVELS_JSON if it did, else calib; MODELZZ_LEVELS=calib|json|thr picks, thr being the single
#              threshold of many earlier runs, as each results file says): build-base model-bg stock-bg build
#              model-wait modelzz-bg stock-wait modelzz-wait zz-rounds
#   e2e        llama-bench stock Q4_K vs fork dense and every level (E2E_LEVELS to pick); with E2E_AB_ENV=VAR=V also
#              tg128 of the levels E2E_AB_LEVELS (default 0.50 0.65) side by side, default | with the variable; then
#              tg128 at depth E2E_DEPTH (default 512, 0: none) for stock and E2E_DEPTH_LEVELS (default dense 0.50)
#   cpu-rounds the host CPU, no GPU layer: llama-bench pp CPU_PP (128) + tg32 of stock Q4_K against the fork's
#              CPU_LEVELS (LEVEL or LEVEL:NAME:VAR=V+VAR2=V2; default dense 0.50) at CPU_THREADS (8 16), CPU_ROUNDS_N
#              rounds; with LS_DEVICE_CUDA=OFF every build is CPU-only (~2 min): LS_DEVICE_CUDA=OFF MODELZZ_LAYERS=8
#              device.sh remote build-base model-bg stock-bg build model-wait modelzz-bg stock-wait modelzz-wait cpu-rounds
#   fuse-check decode logits, fused SwiGLU / residual adds against LLAMA_SPARSE_CUDA_FUSE_OPS=0 (bench/decode_logits.py)
#   fa-check   decode logits with each attention path (flash attention on) against llama's attention without it
#              (FA_CHECK_ENVS paths, FA_CHECK_RUNS level:prompt pairs)
#   attn-test  cuda/tests/test_attn_cuda test + bench (after build-base only)
#   attn-perf  one-token flash attention (cuda/attn-decode.cu) against upstream's kernels, test-backend-ops perf
#   e2e-prof   ncu device time per decode token by kernel: stock against fork at E2E_PROF_LEVELS (dense 0.50)
#   e2e-variants  LIST-op (FUSE=0) and staged-kernel (DIRECT=0) tg128 rows
#   whatif     upper bounds: tg with ops left out of the decode graph (LLAMA_SPARSE_CUDA_WHATIF_SKIP; output wrong):
#              7B zigzag (after modelzz) without rope + set_rows / rms_norm + mul / flash attention; 8B at 32k
#              (after model8b) without flash attention, without the SparQ op, SparQ upkeep only
#   sparq-ingraph  4-layer 8B at 32k: tg64 of SparQ with and without its op, ncu time of decode's attention kernels,
#              and the op alone (test_sparq_cuda bench); sparq-ingraph-ncu: ncu metrics (time, clock, instructions,
#              DRAM / L2 bytes, barrier stalls) of sparq_fused in decode against the bench, and the bench under
#              SPARQ_TEST_QSCALE (score spread)
#   cuda-tune  `llama-sparse cuda-tune` on the 7B zigzag model (after modelzz), then tg128 with its file against the
#              built-in table and the heuristic
#   cmd:ARGS   any command after the builds (ARGS with ',' for spaces), e.g. cmd:cuda/tests/run.sh
# Logs and results go to $OUT (the device tool returns them). The machine goes back 30 s after a call ends, and a
# remote-bg chain with it: keep each chain within one call (remote-bg, then poll in the same command) or re-poll at once.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
mode=${1:-}; shift || true

pack() {
    local fork out=${1:-$repo/.device} site
    fork=$(python3 "$repo/tools/upstream.py" fork)
    mkdir -p "$out"
    if [ "$out" = "$repo/.device" ]; then
        git -C "$repo" check-ignore -q .device || echo '/.device/' >> "$(git -C "$repo" rev-parse --git-path info/exclude)"
    fi
    # tests/ of upstream stays: test-backend-ops lives there; the rest is pruned by tools/upstream.py
    tar -C "$(dirname "$fork")" -cf - --exclude='*.gguf' --exclude='gguf-py' --exclude='conversion' \
        --exclude='*.py' --transform "s,^$(basename "$fork"),fork," "$(basename "$fork")" | xz -T2 -6 > "$out/src.tar.xz"
    # this checkout as it is now (tracked files; uncommitted edits included)
    git -C "$repo" ls-files -z | tar -C "$repo" --null -T - -czf "$out/repo.tar.gz"
    site=${PY_SITE:-$(ls -d "$repo"/.venv/lib/python3*/site-packages 2>/dev/null | head -1)}
    if [ -n "$site" ] && [ -d "$site/gguf" ]; then
        tar -C "$site" --exclude='__pycache__' --exclude='llama_cpp/lib' --exclude='*.so' -czf "$out/py.tar.gz" gguf llama_cpp diskcache
    else
        echo "pack: no site-packages with gguf (set PY_SITE); the model steps will need them" >&2
    fi
    head -c 400000 /work/shared/data/austen/persuasion.txt > "$out/austen.txt" 2>/dev/null || true
    # arch-test: the Austen files tests/python/test_architectures.py reads, and upstream's HF converter
    mkdir -p "$out/austen"
    head -c 300000 /work/shared/data/austen/emma.txt > "$out/austen/emma.txt" 2>/dev/null || true
    head -c 20000 /work/shared/data/austen/persuasion.txt > "$out/austen/persuasion.txt" 2>/dev/null || true
    tar -C "$(python3 "$repo/tools/upstream.py" pristine)" -cf - conversion convert_hf_to_gguf.py | xz -T2 -6 > "$out/hfconv.tar.xz"
    # levels calibrated here on the same seeded 7B (bench/r7b_thresholds.py --save-levels), for modelzz
    rm -f "$out/r7b-levels.json"
    [ -z "${LEVELS_JSON:-}" ] || cp "$LEVELS_JSON" "$out/r7b-levels.json"
    ls -la "$out"
}

# LS_DEVICE_CUDA=OFF: CPU-only builds of the fork and stock (the cpu-rounds step: minutes less to build)
cuda_flags() {
    if [ "${LS_DEVICE_CUDA:-ON}" = OFF ]; then echo "-DGGML_CUDA=OFF"; else echo "-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90"; fi
}

build_stock() {
    if [ ! -d $stock ]; then
        cp -a $fork $stock
        for p in $(ls -r "$repo"/patches/*.patch); do patch -p1 -R -s -d $stock -i "$p"; done
    fi
    cmake -S $stock -B /tmp/b-stock -G Ninja -DCMAKE_BUILD_TYPE=Release $(cuda_flags) -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_SERVER=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF -DGGML_NATIVE=ON > "$out/cmake-stock.log"
    # (STOCK_TARGETS: fewer targets where no step runs stock's test-backend-ops)
    cmake --build /tmp/b-stock -j "$jobs" --target ${STOCK_TARGETS:-llama ggml test-backend-ops llama-bench} > "$out/build-stock.log" 2>&1 ||
        { grep -E -B3 -A12 "error|Error" "$out/build-stock.log" | head -80; exit 1; }
    tail -2 "$out/build-stock.log"
}

remote() {
    # test_zz_cuda ARGS... in two alternating rounds over the settings ENVS (',' for spaces inside one), into
    # $out/LOG, printing the lines that match SHOW: zz_env_rounds LOG SHOW "ENVS" ARGS...
    zz_env_rounds() {
        local log=$1 show=$2 envs=$3 i v
        shift 3
        for i in 1 2; do
            for v in $envs; do
                echo "-- round $i: $v" | tee -a "$out/$log"
                env ${v//,/ } timeout 150 /tmp/zz-test/t "$@" 2>&1 | tee -a "$out/$log" | grep -E "$show"
            done
        done
    }
    # test_zz_cuda bench on the 7B/8B/70B shapes, two rounds, each round once under every ENV (',' for spaces
    # inside one), memset + atomics (BENCH_REDUCTION: another), Q4_K (BENCH_TYPE: another, or all), the 7 shapes below
    # (BENCH_SHAPES: others): zz_bench_envs LOG BATCHES ENV...
    # the 7 shapes of Llama-2-7B (q/k/v/o, gate/up, down), Llama-3-8B (gate/up, down) and 70B (gate/up, down)
    local zz_shapes7=4096x4096,11008x4096,4096x11008,14336x4096,4096x14336,28672x8192,8192x28672
    local zz_shapes11=4096x4096,11008x4096,4096x11008,14336x4096,4096x14336,5120x5120,13824x5120,5120x13824,8192x8192,28672x8192,8192x28672
    zz_bench_envs() {
        local log=$1 batch=$2
        shift 2
        zz_env_rounds "$log" "^(type|q4_K|q6_K|q8_0|q4_0)" "$*" bench --type "${BENCH_TYPE:-q4_K}" --batch "$batch" \
            --reduction "${BENCH_REDUCTION:-atomic}" --shapes "${BENCH_SHAPES:-$zz_shapes7}"
    }
    local out=${OUT:-/tmp/out} jobs fork=/tmp/ls-fork stock=/tmp/ls-stock dev=${LS_DEVICE_DIR:-$repo/.device}
    local work=${LS_WORK:-/tmp/ls-work} py=/tmp/ls-py
    mkdir -p "$out" "$work"
    jobs=$(nproc)
    exec > >(tee -a "$out/device.log") 2>&1
    echo "== $(date -u) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null)"
    if [ ! -d $fork ]; then
        mkdir -p /tmp/unpack && tar -C /tmp/unpack -xJf "$dev/src.tar.xz" && mv /tmp/unpack/fork $fork
    fi
    if [ ! -d $py ] && [ -f "$dev/py.tar.gz" ]; then
        mkdir -p $py && tar -C $py -xzf "$dev/py.tar.gz"
    fi
    # the package from this checkout, the libraries from the fork build
    export PYTHONPATH=$repo/python:$py${PYTHONPATH:+:$PYTHONPATH} LLAMA_SPARSE_LIB_DIR=/tmp/b-fork/bin \
           LLAMA_CPP_LIB_PATH=/tmp/b-fork/bin PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1
    local r7b=$work/r7b.q4_k.gguf z7b=$work/r7b.zz.q4_k.gguf zc7b=$work/r7b.zz.q4_k.cal.gguf r8b=$work/r8b.q4_k.gguf
    local z8b=$work/r8b.zz.q4_k.gguf zc8b=$work/r8b.zz.q4_k.cal.gguf
    # the random 7B-shaped model, its zigzag conversion and its levels (thr: the thresholds bench/r7b_thresholds.py
    # measured on a 4-layer file of the same shapes, bench/results/cpu_e2e-r7b-*.md)
    # test_sparq_cuda (needs build-base) into OUT, its log $out/LOG, with NVCC flags FLAGS, from the checkout ROOT
    # (default this one): build_sparq OUT LOG [FLAGS] [ROOT]; prints the log's tail and fails on an error
    build_sparq() {
        GGML_LIB_DIR=/tmp/b-fork/bin LLAMA_SPARSE_UPSTREAM=$fork NVCC_FLAGS="${3:-}" \
            bash "${4:-$repo}/cuda/tests/build-sparq.sh" "$1" > "$out/$2" 2>&1 || { tail -40 "$out/$2"; return 1; }
    }
    # test_sparq_cuda at /tmp/sparq-test/t unless an earlier step built it
    sparq_bin() { [ -x /tmp/sparq-test/t ] || build_sparq /tmp/sparq-test/t build-sparq-test.log; }
    # the 4-layer Llama-3-8B-shaped model at $m4, made unless there (a minute)
    local m4=$work/r8b-4l.q4_k.gguf
    make_m4() {
        [ -f "$m4" ] || python3 "$repo/bench/make_random_gguf.py" --shape llama3-8b --layers 4 --type q4_k -o "$m4" \
            > "$out/model8b-4l.log" 2>&1 || { tail -5 "$out/model8b-4l.log"; return 1; }
    }
    # one single-variant bench of a test_sparq_cuda binary at S SPARQ_AB_S, appended to $out/LOG, under ENV...
    # (none: the defaults): sparq_bench_single BIN LOG [ENV...]
    sparq_bench_single() {
        local bin=$1 log=$2
        shift 2
        env "$@" timeout 90 "$bin" bench --variant single --S "${SPARQ_AB_S:-256,4096,16384,32768}" 2>&1 |
            tee -a "$out/$log" | grep -v "^device" || echo "bench failed"
    }
    # stock flash-attention decode at the Llama-3-8B attention shapes, S 4k/16k/32k (test-backend-ops perf)
    perf_fa() {
        timeout 150 /tmp/b-fork/bin/test-backend-ops perf -b CUDA0 -o FLASH_ATTN_EXT -p "hsk=128,hsv=128,nh=8,.*kv=(4096|16384|32768),nb=1," 2>&1 |
            tee "$out/perf-fa.log" | grep -E "us/run" | head -12
    }
    # lines of a test-backend-ops log matching PATTERN once its colour codes are gone: tbo_count PATTERN LOG
    tbo_count() { sed 's/\x1b\[[0-9;]*m//g' "$2" | grep -c "$1" || true; }
    # the t/s column of llama-bench's markdown row TEST (tg128, pp512) on stdin; tg_col: tg128's
    lb_col() { grep "$1" | awk -F'|' '{gsub(/^ +| +$/, "", $(NF-1)); print $(NF-1)}'; }
    tg_col() { lb_col tg128; }
    # test_zz_cuda without ggml-cuda (no stock column), unless a zztest step built it
    # the sources /tmp/zz-test/t is built from (a warm machine keeps /tmp between calls, the checkout is new)
    zz_src_stamp() {
        cat "$repo"/cuda/*.cu "$repo"/cuda/*.cuh "$repo"/cuda/*.inc "$repo"/cuda/tests/* "$repo"/ggml-sparse/*.h | md5sum | cut -c1-32
    }
    # test_zz_cuda without ggml-cuda into OUT, its log $out/LOG, with NVCC flags FLAGS: build_zz OUT LOG [FLAGS]
    build_zz() {
        GGML_LIB_DIR=/tmp/b-fork/bin LLAMA_SPARSE_UPSTREAM=$fork GGML_INCLUDE=$fork/ggml/include NVCC_FLAGS="${3:-}" \
            bash "$repo/cuda/tests/build.sh" "$1" > "$out/$2" 2>&1 || { tail -40 "$out/$2"; return 1; }
    }
    zz_build_lite() {   # (a binary of the same sources, also one with ggml-cuda from zztest, is kept)
        [ -x /tmp/zz-test/t ] && [ "$(cat /tmp/zz-test/stamp 2>/dev/null)" = "$(zz_src_stamp)" ] && return 0
        build_zz /tmp/zz-test/t build-zztest.log || exit 1
        zz_src_stamp > /tmp/zz-test/stamp
    }
    # DRAM bytes per direct GEMV launch (test_zz_cuda bytes under ncu, bench/ncu_bytes.py): ncu_bytes BIN ENV (',' for
    # spaces inside ENV; shapes $NCU_BYTES_SHAPES)
    ncu_bytes() {
        echo "-- $1: $2" | tee -a "$out/ncu-bytes.log"
        env ${2//,/ } timeout 240 ncu --kernel-name regex:direct --csv --log-file /tmp/ncu-bytes.csv \
            --metrics gpu__time_duration.sum,dram__bytes_read.sum,lts__t_sectors_srcunit_tex_op_read.sum \
            "$1" bytes --shapes "${NCU_BYTES_SHAPES:-14336x4096,28672x8192,4096x4096}" > /tmp/ncu-bytes.out 2>&1 || true
        cat /tmp/ncu-bytes.out /tmp/ncu-bytes.csv >> "$out/ncu-bytes.log"
        python3 "$repo/bench/ncu_bytes.py" /tmp/ncu-bytes.out /tmp/ncu-bytes.csv | tee -a "$out/ncu-bytes.log"
    }
    # tg64 at the depths SPARQ_E2E_DEPTHS (default 16k 32k) on the 8B-shaped model, flash attention on, one
    # llama-bench process per run, two rounds of the configurations alternating; a configuration is NAME or
    # NAME:VAR=V VAR2=V2 (NAME stock: the stock build; NAME zz...: the calibrated zigzag 8B of combo8b-prep);
    # logs $out/TAG-NAME-DEPTH.log: sparq8b_rounds TAG CONFIG...
    sparq8b_rounds() {
        local tag=$1 d i c more=() lb8=(-ngl 99 -fa 1 -p 0 -n 64 -r 1 -o md)
        shift
        # SPARQ_LB_ARGS: more llama-bench arguments (-v: the fork's one-time log lines, counted after the rounds)
        [ -z "${SPARQ_LB_ARGS:-}" ] || read -r -a more <<< "$SPARQ_LB_ARGS"
        lb8+=("${more[@]}")
        for d in ${SPARQ_E2E_DEPTHS:-16384 32768}; do
            for i in $(seq 1 "${SPARQ_ROUNDS_N:-2}"); do
                for c in "$@"; do
                    local name=${c%%:*} envs=() bin=/tmp/b-fork/bin/llama-bench m=$r8b
                    [ "$c" = "$name" ] || read -r -a envs <<< "${c#*:}"
                    [ "$name" = stock ] && bin=/tmp/b-stock/bin/llama-bench
                    [ "${name#zz}" = "$name" ] || m=$zc8b
                    echo "$d $name: $(env "${envs[@]}" $bin -m "$m" "${lb8[@]}" -d $d 2>&1 |
                        tee -a "$out/$tag-$name-$d.log" | grep -E "tg64|error" | awk -F'|' '{print $(NF-1)}')"
                done
            done
        done
        [ -z "${SPARQ_LB_ARGS:-}" ] || for c in "$out/$tag"-*.log; do
            echo "$(basename "$c"): $(grep -c "llama-sparse: CUDA" "$c") fork log lines: $(grep -o "llama-sparse: CUDA runs [a-z-]* [a-z ]*" "$c" | sort | uniq -c | tr -s ' ' | tr '\n' ';')"
        done
    }
    # MODELZZ_LAYERS: fewer blocks (same shapes; quicker to make, for correctness checks, not for speed)
    make_r7b()    { python3 "$repo/bench/make_random_gguf.py" --shape llama2-7b --type q4_k -o "$r7b" --layers "${MODELZZ_LAYERS:-0}"; }
    # a model as zigzag Q4_K: convert_q4k IN OUT; its levels from random token ids: calib_random IN OUT LEVELS
    convert_q4k() { python3 -m llama_sparse convert "$1" -o "$2" --type q4_k -t "$jobs"; }
    local calib_wrap=()
    calib_random() {
        "${calib_wrap[@]}" python3 -m llama_sparse calibrate "$1" -o "$2" --random-tokens 0 --levels "$3" --mode unified \
            -n 1024 -c 512 -t "$jobs" -ngl "${LS_CALIB_NGL:-99}"
    }
    # after a failed calibration: the C++ runtimes a Python process with libllama maps, and a backtrace under gdb
    calib_diag() {
        python3 -c "import llama_sparse, numpy, llama_cpp, llama_sparse.calibrate; print(open('/proc/self/maps').read())" 2>&1 |
            grep -oE "/[^ ]*(libstdc\+\+|libgcc_s|libgomp|libomp)[^ ]*" | sort -u
        command -v gdb > /dev/null || return 0
        echo "-- calibration again under gdb"
        local calib_wrap=(timeout 300 gdb -q -batch -ex run -ex bt -ex "thread apply all bt 8" --args) # seen by calib_random
        calib_random "$z7b" "$work/diag.gguf" 0.5 2>&1 | grep -vE "^\[New Thread|^\[Thread .* exited|^print_info|^llama_model_loader|^load" | tail -80
    }
    convert_r7b() { convert_q4k "$r7b" "$z7b"; }
    thr_r7b()     { python3 "$repo/bench/r7b_thresholds.py" "$z7b" -o "$zc7b" --thresholds "${LS_THRESHOLDS:-0.1540,0.2967,0.4196,0.6640}"; }
    calib_r7b()   { calib_random "$z7b" "$zc7b" 0.25,0.4,0.5,0.65; }
    json_r7b()    { python3 "$repo/bench/r7b_thresholds.py" "$z7b" -o "$zc7b" --levels-from "$dev/r7b-levels.json"; }
    # a rounds row LEVEL[:NAME[:VAR=V+VAR2=V2]] into the caller's lv, name (default LEVEL) and envs (an array)
    split_row() {
        local rest=${1#*:} ev=
        lv=${1%%:*} name=$lv envs=()
        if [ "$1" != "$lv" ]; then
            name=${rest%%:*}
            [ "$rest" = "$name" ] || ev=${rest#*:}
        fi
        read -r -a envs <<< "${ev//+/ }"
    }
    for step in "$@"; do
        local t0=$(date +%s)
        echo "== step $step"
        case "$step" in
        build-base)
            # configure, and libggml-base first: the model step needs only it and can run beside the rest
            cmake -S "$repo" -B /tmp/b-fork -G Ninja -DCMAKE_BUILD_TYPE=Release $(cuda_flags) \
                -DLLAMA_SPARSE_UPSTREAM_DIR=$fork -DGGML_NATIVE=ON > "$out/cmake-fork.log"
            cmake --build /tmp/b-fork -j "$jobs" --target ggml-base > "$out/build-base.log" 2>&1 ||
                { tail -40 "$out/build-base.log"; exit 1; }
            ;;
        build)
            cmake -S "$repo" -B /tmp/b-fork -G Ninja -DCMAKE_BUILD_TYPE=Release $(cuda_flags) \
                -DLLAMA_SPARSE_UPSTREAM_DIR=$fork -DGGML_NATIVE=ON > "$out/cmake-fork.log"
            cmake --build /tmp/b-fork -j "$jobs" --target ${BUILD_TARGETS:-llama ggml test-backend-ops llama-bench} > "$out/build-fork.log" 2>&1 ||
                { grep -E -B3 -A12 "error|Error" "$out/build-fork.log" | head -80; exit 1; }
            tail -2 "$out/build-fork.log"
            # the slowest objects (ninja's log: start ms, end ms, mtime, output); sed reads to the end, where head
            # could leave sort a SIGPIPE, and pipefail ended a chain with rc 141 here
            awk '!/^#/ {printf "%6.1f s  %5.1f-%5.1f  %s\n", ($2-$1)/1000, $1/1000, $2/1000, $4}' /tmp/b-fork/.ninja_log |
                sort -rn | sed -n 1,6p
            ;;
        model-bg)
            make_r7b > "$out/model.log" 2>&1 & model_pid=$!
            ;;
        arch-test)
            # tests/python/test_architectures.py with the decodes on the GPU (after build): python3 there has torch,
            # transformers and pytest; upstream's HF converter comes in the pack
            [ -d /tmp/ls-hfconv ] || { mkdir -p /tmp/ls-hfconv && tar -C /tmp/ls-hfconv -xJf "$dev/hfconv.tar.xz"; }
            ( cd "$repo/tests/python" && LLAMA_SPARSE_TEST_NGL=99 LLAMA_SPARSE_AUSTEN="$dev/austen" \
                LLAMA_SPARSE_UPSTREAM_DIR=/tmp/ls-hfconv timeout 900 python3 -m pytest -q -p no:cacheprovider -rA \
                ${ARCH_TEST_K:+-k "$ARCH_TEST_K"} test_architectures.py ) > "$out/arch-test.log" 2>&1 || { tail -80 "$out/arch-test.log"; exit 1; }
            tail -3 "$out/arch-test.log"
            ;;
        model-wait)
            wait "${model_pid:?no model-bg step before}" || { tail -20 "$out/model.log"; exit 1; }
            model_done=1
            tr '\r' '\n' < "$out/model.log" | tail -2
            ;;
        modelzz-bg)
            # model, convert and levels in one background job, after build (the package loads libllama), beside
            # stock-bg; modelzz-wait joins it. Levels calibrated per group (a level skips its share of every group's
            # weight bytes, as the GEMV chain's do), or with MODELZZ_LEVELS=thr one threshold for all (42-47 % of the
            # bytes at "0.50")
            # (default: the levels pack took from LEVELS_JSON when it did, calibrated on the CPU there from the same
            # seeded model; else calibrate here: its segfault was numpy's private libstdc++, fixed in the package,
            # bench/results/cuda_h200_2026-11-28b.md)
            local levels=calib_r7b lvdef=calib
            [ -f "$dev/r7b-levels.json" ] && lvdef=json
            case "${MODELZZ_LEVELS:-$lvdef}" in thr) levels=thr_r7b ;; json) levels=json_r7b ;; esac
            # (a model-bg step after build-base, joined by model-wait before this one, made the model already)
            # (calibration segfaulted once on an H200 x2 machine, bench/results/cuda_h200_2026-11-28.md: fixed
            # thresholds then, so the rounds still run; the log says which)
            { { [ -n "${model_done:-}" ] || make_r7b; } && convert_r7b &&
                { $levels || { [ $levels != calib_r7b ] || { echo "LEVELS: calibration failed, fixed thresholds instead"; calib_diag; thr_r7b; }; }; }
            } > "$out/modelzz.log" 2>&1 & modelzz_pid=$!
            ;;
        modelzz-wait)
            wait "${modelzz_pid:?no modelzz-bg step before}" || { tr '\r' '\n' < "$out/modelzz.log" | tail -20; exit 1; }
            { grep -A12 -E "^LEVELS:|Fatal Python error" "$out/modelzz.log" || true; } | head -40
            tr '\r' '\n' < "$out/modelzz.log" | tail -4
            ;;
        model8b-bg)
            # random Llama-3-8B-shaped Q4_K (GQA 32/8, d_h 128) for SparQ end to end; model8b-wait joins it. After build:
            # bench/make_random_gguf.py imports llama_sparse, which loads libllama
            python3 "$repo/bench/make_random_gguf.py" --shape llama3-8b --type q4_k -o "$r8b" > "$out/model8b.log" 2>&1 & model8b_pid=$!
            ;;
        model8b-wait)
            wait "${model8b_pid:?no model8b-bg step before}" || { tail -20 "$out/model8b.log"; exit 1; }
            tr '\r' '\n' < "$out/model8b.log" | tail -2
            ;;
        sparq-e2e8b)
            # decode at depth 16k / 32k on the 8B-shaped model, flash attention on: stock build, fork dense, fork
            # SparQ r 32 k 128 (mean-V off: GQA, as the paper does for GQA models), and SparQ with every decode graph
            # rebuilt (LLAMA_GRAPH_REUSE_DISABLE=1, as before graphs with SparQ on were reused). One llama-bench process per
            # repetition (-r 1): llama-bench restores the depth from a saved state on later repetitions, and a
            # state load makes SparQ rebuild its K copy on the host inside the timed decode (SPARQ_E2E_NOREUSE=0: no
            # reuse-off rows)
            local d i lb8=(-ngl 99 -fa 1 -p 0 -n 32 -r 1 -o md)
            for d in ${SPARQ_E2E_DEPTHS:-16384 32768}; do
                for i in 1 2 3; do
                    /tmp/b-stock/bin/llama-bench -m "$r8b" "${lb8[@]}" -d $d 2>&1 | tee -a "$out/sparq8b-stock-$d.log" | grep -E "tg32" | sed "s/^/stock /"
                    /tmp/b-fork/bin/llama-bench -m "$r8b" "${lb8[@]}" -d $d 2>&1 | tee -a "$out/sparq8b-dense-$d.log" | grep -E "tg32" | sed "s/^/dense /"
                    LLAMA_SPARQ=r=32,k=128,min_kv=0 /tmp/b-fork/bin/llama-bench -m "$r8b" "${lb8[@]}" -d $d 2>&1 |
                        tee -a "$out/sparq8b-sparq-$d.log" | grep -E "tg32|error" | sed "s/^/sparq single /"
                    [ "${SPARQ_E2E_NOREUSE:-1}" = 1 ] || continue
                    LLAMA_GRAPH_REUSE_DISABLE=1 LLAMA_SPARQ=r=32,k=128,min_kv=0 /tmp/b-fork/bin/llama-bench -m "$r8b" "${lb8[@]}" -d $d 2>&1 |
                        tee -a "$out/sparq8b-sparq-noreuse-$d.log" | grep -E "tg32|error" | sed "s/^/sparq single, graph reuse off /"
                done
            done
            echo "-- with llama-bench's saved-state repetitions (-r 3): SparQ rebuilds its K copy after each state load"
            LLAMA_SPARQ=r=32,k=128,min_kv=0 /tmp/b-fork/bin/llama-bench -m "$r8b" -ngl 99 -fa 1 -p 0 -n 32 -r 3 -o md -d 16384 2>&1 | grep -E "tg32"
            ;;
        sparq-fused-e2e)
            # stock, fork dense, fork SparQ r 32 k 128 with the default (fused) kernel and with the single one
            sparq8b_rounds sparq-fused-e2e stock dense "fused:LLAMA_SPARQ=r=32,k=128,min_kv=0" \
                "single:LLAMA_SPARQ=r=32,k=128,min_kv=0 LLAMA_SPARSE_CUDA_SPARQ_FUSED=0"
            ;;
        sparq-rounds)
            # sparq8b_rounds over $SPARQ_ROUNDS: configurations NAME or NAME:VAR=V+VAR2=V2 ('+' for spaces inside one)
            local cs=() c
            for c in ${SPARQ_ROUNDS:?set SPARQ_ROUNDS}; do cs+=("${c//+/ }"); done
            sparq8b_rounds sparq-rounds "${cs[@]}"
            ;;
        cpu-rounds)
            # prefill (pp CPU_PP, default 128) and decode (tg32) on the host CPU, no layer on a GPU, of the 7B-shaped
            # zigzag model (modelzz) against stock on the standard Q4_K, at each of CPU_THREADS (default "8 16")
            # threads, in CPU_ROUNDS_N rounds (default 2) alternating stock and CPU_LEVELS (default "dense 0.50"):
            # LEVEL or LEVEL:NAME:VAR=V+VAR2=V2 (a fork configuration with its environment)
            [ -f "$zc7b" ] || { echo "no model with levels (modelzz-bg / modelzz-wait)"; exit 1; }
            lscpu | grep -E "^Model name|^CPU\(s\)|^Thread|^Socket|^NUMA node\(s\)|^L3" | tr -s ' '
            local i t c pp=${CPU_PP:-128}
            for i in $(seq 1 "${CPU_ROUNDS_N:-2}"); do
                for t in ${CPU_THREADS:-8 16}; do
                    for c in stock ${CPU_LEVELS:-dense 0.50}; do
                        local bin=/tmp/b-fork/bin/llama-bench m=$zc7b lv name envs
                        split_row "$c"
                        [ "$c" = stock ] && { bin=/tmp/b-stock/bin/llama-bench; m=$r7b; }
                        echo "round $i t $t $name: $(env LLAMA_SPARSE=$lv "${envs[@]}" $bin -m "$m" -ngl 0 -t "$t" -p "$pp" -n 32 -r "${CPU_REPS:-3}" -o md 2>&1 |
                            tee -a "$out/cpu-rounds-$name-t$t.log" | grep -E "pp$pp|tg32|error" | awk -F'|' '{printf "%s ", $(NF-1)}')"
                    done
                done
            done
            # the fork's prefill GEMM time against the whole prefill (LLAMA_SPARSE_CPU_PROF), and stock's weight buffers
            echo "cpu flags: $(grep -m1 flags /proc/cpuinfo | tr ' ' '\n' | grep -E 'amx|vnni|avx512f' | tr '\n' ' ')"
            /tmp/b-stock/bin/llama-bench -m "$r7b" -ngl 0 -t 16 -p 16 -n 0 -r 1 -v 2>&1 | grep -iE "buffer size|AMX|REPACK" | sort | uniq -c | head
            for t in ${CPU_THREADS:-8 16}; do
                for c in ${CPU_LEVELS:-dense 0.50}; do
                    local lv name envs
                    split_row "$c"
                    echo "prof t $t $name: $(env LLAMA_SPARSE=$lv LLAMA_SPARSE_CPU_PROF=1 "${envs[@]}" /tmp/b-fork/bin/llama-bench -m "$zc7b" -ngl 0 \
                        -t "$t" -p "$pp" -n 0 -r 3 -o md 2>&1 | grep -E "pp$pp|prof: MUL_MAT_ZZ prefill" | awk -F'|' '{printf "%s ", (NF > 2 ? $(NF-1) : $0)}')"
                done
            done
            ;;
        zz-rounds)
            # tg128 of the 7B-shaped zigzag model (modelzz) in alternating rounds over $ZZ_ROUNDS: configurations
            # LEVEL:NAME or LEVEL:NAME:VAR=V+VAR2=V2 ('+' for spaces inside one; LEVEL stock: the stock build on the
            # standard Q4_K), $ZZ_ROUNDS_N rounds (default 2) of llama-bench -r $ZZ_REPS (default 5; a run's spread is
            # +-5-11 tok/s at ~450, so a 2-3 % change needs more)
            [ -f "$zc7b" ] || { echo "no model with levels (modelzz-bg / modelzz-wait)"; exit 1; }
            local i c
            for i in $(seq 1 "${ZZ_ROUNDS_N:-2}"); do
                for c in ${ZZ_ROUNDS:?set ZZ_ROUNDS}; do
                    local lv name envs bin=/tmp/b-fork/bin/llama-bench m=$zc7b
                    split_row "$c"
                    [ "$lv" = stock ] && { bin=/tmp/b-stock/bin/llama-bench; m=$r7b; }
                    echo "round $i $lv $name: $(env LLAMA_SPARSE=$lv "${envs[@]}" $bin -m "$m" -ngl 99 -p 0 -n 128 -r "${ZZ_REPS:-5}" -o md 2>&1 |
                        tee -a "$out/zz-rounds-$lv-$name.log" | grep -E "tg128|error" | awk -F'|' '{print $(NF-1)}')"
                done
            done
            ;;
        combo8b-prep)
            # the 8B-shaped model as zigzag Q4_K with level 0.50 calibrated on random tokens (needs model8b, build)
            convert_q4k "$r8b" "$z8b" > "$out/convert8b.log" 2>&1 || { tr '\r' '\n' < "$out/convert8b.log" | tail -20; exit 1; }
            calib_random "$z8b" "$zc8b" 0.5 > "$out/calib8b.log" 2>&1 || { tail -30 "$out/calib8b.log"; exit 1; }
            tail -6 "$out/calib8b.log"
            ;;
        combo8b)
            # both techniques at long context: stock, fork dense, SparQ alone, TEAL 0.50 alone (zigzag), both;
            # COMBO8B_EXTRA: one more configuration, e.g. "zz50min:LLAMA_SPARSE=0.50 LLAMA_SPARQ=r=32,k=128,min_kv=20000"
            sparq8b_rounds combo8b stock dense "sparq:LLAMA_SPARQ=r=32,k=128,min_kv=0" "zz50:LLAMA_SPARSE=0.50" \
                "zz50sparq:LLAMA_SPARSE=0.50 LLAMA_SPARQ=r=32,k=128,min_kv=0" ${COMBO8B_EXTRA:+"$COMBO8B_EXTRA"}
            ;;
        sparq-auto|sparq-auto-zz)
            # min_kv auto (the default: dense attention below 80 MiB of K and V a layer on a GPU) against the op forced
            # on (min_kv=0); sparq-auto: alone, after the threshold auto logs at depth 0; sparq-auto-zz: with TEAL 0.50
            # (needs combo8b-prep)
            local base=dense pre= lv=
            if [ $step = sparq-auto ]; then
                LLAMA_SPARQ=r=32,k=128 /tmp/b-fork/bin/llama-bench -m "$r8b" -ngl 99 -fa 1 -p 0 -n 4 -r 1 -v 2>&1 |
                    grep -E "SparQ" | head -4
            else
                base="zz50:LLAMA_SPARSE=0.50" pre=zz50 lv="LLAMA_SPARSE=0.50 "
            fi
            SPARQ_E2E_DEPTHS=${SPARQ_E2E_DEPTHS:-0 24576 16384 32768} sparq8b_rounds $step "$base" \
                "${pre}sparq0:${lv}LLAMA_SPARQ=r=32,k=128,min_kv=0" "${pre}sparqauto:${lv}LLAMA_SPARQ=r=32,k=128"
            ;;
        sparq-first)
            # the op's one-time cost in a process: per-token decode times around the step where SparQ comes on
            # (bench/sparq_first_step.py), on the 8B-shaped model, under SPARQ_FIRST_ENVS (',' for spaces inside one;
            # '-': none), then at auto's threshold (20480 here), with and without the preload (sparq_preload).
            # bench/results/sparq_first_step_h200_2026-12-03.md
            local e
            sq_first() { # ENV ARGS...
                local ev=${1/#-/}
                shift
                env ${ev//,/ } python3 "$repo/bench/sparq_first_step.py" "$r8b" "$@" --label "$* $ev" 2>&1 | grep -E "prefill|rror"
            }
            sq_first - --depth 3800 --n 160 --sparq off
            for e in ${SPARQ_FIRST_ENVS:-- LLAMA_SPARSE_SPARQ_PRELOAD=0 CUDA_MODULE_LOADING=EAGER}; do
                sq_first "$e" --depth 3800 --n 160 --sparq r=32,k=128,min_kv=4096
            done
            sq_first - --depth 3800 --n 160 --sparq r=32,k=128,min_kv=0
            for e in - LLAMA_SPARSE_SPARQ_PRELOAD=0; do
                sq_first "$e" --depth 20200 --n 80 --sparq r=32,k=128,min_kv=20480
            done
            ;;
        sparq-rope)
            # SparQ's f16 k_t written by the RoPE / cache-write kernel (default) against the graph's own kernels
            # (LLAMA_SPARSE_CUDA_ROPE_FUSE=0: rope q, rope k + K write, V write, k_t write), with stock and dense
            # beside them; min_kv=40000: the dense path with k_t still kept (every depth here is below it).
            # SPARQ_ROPE_CONFIGS: other configurations (NAME:ENV ENV, ';' between them)
            local rcfg=()
            IFS=';' read -r -a rcfg <<< "${SPARQ_ROPE_CONFIGS:-stock;dense;sparq:LLAMA_SPARQ=r=32,k=128,min_kv=0;sparqnf:LLAMA_SPARQ=r=32,k=128,min_kv=0 LLAMA_SPARSE_CUDA_ROPE_FUSE=0;minkv:LLAMA_SPARQ=r=32,k=128,min_kv=40000}"
            # which fusions llama-bench's SparQ decode takes (its log, -v; tg4 at depth 1024)
            LLAMA_SPARQ=r=32,k=128,min_kv=0 /tmp/b-fork/bin/llama-bench -m "$r8b" -ngl 99 -fa 1 -p 0 -n 4 -r 1 -d 1024 -v \
                > "$out/sparq-rope-verbose.log" 2>&1 || true
            echo "fusions with SparQ on: $(grep -h -o -E "llama-sparse: CUDA (runs the RoPE|writes SparQ)[^(]*" "$out/sparq-rope-verbose.log" |
                sort -u | tr '\n' ';')"
            sparq8b_rounds sparq-rope "${rcfg[@]}"
            ;;
        sparq-logits)
            # decode logits of the 8B-shaped model with SparQ on (512 prompt tokens, so k 128 < the view): k_t written
            # by the RoPE kernel against the graph's own kernels (LLAMA_SPARSE_CUDA_ROPE_FUSE=0); equal k_t gives equal logits
            [ -f "$r8b" ] || { echo "no 8B model"; exit 1; }
            local la=(--prompt 512 --flash-attn --verbose)
            LLAMA_SPARQ=r=32,k=128,min_kv=0 python3 "$repo/bench/decode_logits.py" save "$r8b" "$work/logits-sq-on.npy" "${la[@]}" \
                > "$out/sparq-logits-on.log" 2>&1 &&
            LLAMA_SPARQ=r=32,k=128,min_kv=0 LLAMA_SPARSE_CUDA_ROPE_FUSE=0 python3 "$repo/bench/decode_logits.py" save "$r8b" \
                "$work/logits-sq-off.npy" "${la[@]}" > "$out/sparq-logits-off.log" 2>&1 ||
                { tail -5 "$out"/sparq-logits-*.log; exit 1; }
            echo "SparQ, k_t in the RoPE kernel against not: $(python3 "$repo/bench/decode_logits.py" compare "$work/logits-sq-off.npy" "$work/logits-sq-on.npy" || true)"
            grep -h -o -E "llama-sparse: CUDA (runs the RoPE|writes SparQ)[^(]*" "$out"/sparq-logits-*.log | sort | uniq -c || true
            ;;
        sparq-decomp)
            # where SparQ's end-to-end time goes: fork dense; SparQ with k above the context (the transposed-K upkeep
            # runs, attention falls back to flash attention); SparQ r 32 k 128. upkeep = (k big) - dense, op vs FA =
            # (k 128) - (k big). SPARQ_DECOMP_ENV adds a fourth row: SparQ r 32 k 128 under that variable
            sparq8b_rounds sparq-decomp dense "big:LLAMA_SPARQ=r=32,k=1000000" "k128:LLAMA_SPARQ=r=32,k=128,min_kv=0" \
                ${SPARQ_DECOMP_ENV:+"env:LLAMA_SPARQ=r=32,k=128,min_kv=0 $SPARQ_DECOMP_ENV"}
            ;;
        sparq-graphs)
            # whether decode runs as CUDA graphs with SparQ on: tg32 at depth 16k, dense and SparQ, each with CUDA
            # graphs on and off (GGML_CUDA_DISABLE_GRAPHS=1); plus what ggml-cuda logs about its graphs
            # (the 4-layer Llama-3-8B-shaped model, made here if missing; the full one where model8b made it)
            local g cfg mg=$r8b
            if [ ! -f "$r8b" ]; then
                mg=$m4
                make_m4 || exit 1
            fi
            for g in 0 1; do
                for cfg in dense sparq; do
                    local envs=(GGML_CUDA_DISABLE_GRAPHS=$g); [ $g = 0 ] && envs=(); [ $cfg = sparq ] && envs+=(LLAMA_SPARQ=r=32,k=128,min_kv=0)
                    env "${envs[@]}" /tmp/b-fork/bin/llama-bench -m "$mg" -ngl 99 -fa 1 -p 0 -n 32 -r 1 -o md -d 16384 -v \
                        > "$out/graphs-$g-$cfg.log" 2>&1
                    grep -E "tg32" "$out/graphs-$g-$cfg.log" | sed "s/^/graphs-off=$g $cfg /"
                    grep -i -E "cuda graph|graphs" "$out/graphs-$g-$cfg.log" | grep -v "^|" | sed 's/[0-9]\+/N/g' | sort | uniq -c | head -8
                done
            done
            ls /usr/local/cuda*/bin 2>/dev/null | grep -i -E "nsys|ncu" | head -3; which nsys ncu 2>/dev/null || true
            ;;
        sparq-ingraph)
            # the SparQ op inside decode against the op alone, at SPARQ_NCU_DEPTH (default 32k) on the 4-layer
            # 8B-shaped model (made here if missing): tg32 of SparQ r 32 k 128 with and without its op
            # (LLAMA_SPARSE_CUDA_WHATIF_SKIP), three rounds; then ncu's device time of each attention kernel of the
            # decode (serialized, clocks and caches left alone) for SparQ and for flash attention
            local d=${SPARQ_NCU_DEPTH:-32768} i lb4=(-ngl 99 -fa 1 -p 0 -r 1 -o md)
            make_m4 || exit 1
            for i in 1 2 3; do
                for c in "dense:" "nofa:LLAMA_SPARSE_CUDA_WHATIF_SKIP=FLASH_ATTN_EXT" "sparq:LLAMA_SPARQ=r=32,k=128,min_kv=0" \
                         "noop:LLAMA_SPARQ=r=32,k=128,min_kv=0 LLAMA_SPARSE_CUDA_WHATIF_SKIP=SPARQ_ATTN"; do
                    local envs=(); read -r -a envs <<< "${c#*:}"
                    echo "$d ${c%%:*}: $(env "${envs[@]}" /tmp/b-fork/bin/llama-bench -m "$m4" "${lb4[@]}" -n 64 -d $d 2>&1 |
                        tee -a "$out/ingraph-${c%%:*}.log" | grep -E "tg64|error" | awk -F'|' '{print $(NF-1)}')"
                done
            done
            # (prefill's attention kernels are other ones: flash_attn_ext_f16; the first decode token is at depth 0)
            for c in dense sparq; do
                local envs=() rx="flash_attn_ext_vec|flash_attn_combine"
                [ $c = sparq ] && { envs=(LLAMA_SPARQ=r=32,k=128,min_kv=0); rx="sparq"; }
                env "${envs[@]}" timeout 300 ncu --clock-control none --cache-control none --kernel-name regex:"$rx" \
                    --launch-count 80 --metrics gpu__time_duration.sum \
                    /tmp/b-fork/bin/llama-bench -m "$m4" -ngl 99 -fa 1 -p 0 -n 4 -r 1 -d $d > "$out/ncu-ingraph-$c.log" 2>&1 || true
                echo "-- ncu $c: kernel, us (in launch order; the last ones are the decode at depth)"
                grep -E "^  [a-z_].*\(|gpu__time_duration" "$out/ncu-ingraph-$c.log" |
                    sed -E 's/^ +void +//; s/^ +//; s/[<(].*//; s/gpu__time_duration.sum +[a-z]+ +//' | paste - - | tail -16 | tr '\n' ';'; echo
            done
            # the op alone on this GPU (test_sparq_cuda bench, K/V rotated past L2)
            sparq_bin || exit 1
            timeout 60 /tmp/sparq-test/t bench --variant fused --S 16384,$d 2>&1 | tee "$out/ingraph-opbench.log" | grep -v "^device"
            ;;
        sparq-ingraph-ncu)
            # sparq_fused inside decode (4-layer 8B-shaped model at SPARQ_NCU_DEPTH, default 32k) against the op alone
            # (test_sparq_cuda bench, the same shapes): ncu time, clocks, instructions, DRAM and L2 bytes, per launch
            local d=${SPARQ_NCU_DEPTH:-32768}
            local met=gpu__time_duration.sum,smsp__inst_executed.sum,dram__bytes_read.sum,lts__t_bytes.sum,sm__cycles_elapsed.avg.per_second,launch__grid_size,launch__block_size,smsp__warp_issue_stalled_barrier_per_warp_active.pct,smsp__warp_issue_stalled_membar_per_warp_active.pct
            make_m4 || exit 1
            sparq_bin || exit 1
            LLAMA_SPARQ=r=32,k=128,min_kv=0 timeout 300 ncu --clock-control none --cache-control none --kernel-name regex:sparq_fused \
                --launch-count 12 --metrics $met /tmp/b-fork/bin/llama-bench -m "$m4" -ngl 99 -fa 1 -p 0 -n 2 -r 1 -d $d \
                > "$out/ncu-met-ingraph.log" 2>&1 || true
            timeout 300 ncu --clock-control none --cache-control none --kernel-name regex:sparq_fused --launch-skip 2 --launch-count 4 \
                --metrics $met /tmp/sparq-test/t bench --variant fused --S $d --iters 8 > "$out/ncu-met-bench.log" 2>&1 || true
            local qs
            for qs in 0.01 0.1 1 3 10; do
                echo "-- bench, q x $qs: $(SPARQ_TEST_QSCALE=$qs timeout 60 /tmp/sparq-test/t bench --variant fused --S 16384,$d 2>&1 |
                    grep -E "^ +[0-9]+ +fused" | awk '{print $1": "$3" us"}' | tr '\n' ' ')"
            done
            for f in ingraph bench; do
                echo "-- $f (last launch)"
                grep -E "^ +(gpu__|smsp__|dram__|lts__|sm__|launch__)" "$out/ncu-met-$f.log" | tail -9
            done
            ;;
        sparq-ncu-e2e)
            # device time of the attention kernels inside llama-bench decode (tg8 at depth 16k, 4-layer 8B-shaped model):
            # FA's vec kernel (dense) against the two SparQ kernels, as ncu times them one by one
            [ -f "$m4" ] || { echo "no 4-layer model (sparq-graphs or sparq-state makes it)"; exit 1; }
            # (dense: the vec and combine kernels only appear in decode; the first 8 are llama-bench's warm-up token at
            # depth 0 -- not checked yet: the 2026-11-23 run matched prefill kernels with a broader pattern)
            timeout 200 ncu --kernel-name regex:"flash_attn_ext_vec|flash_attn_combine" --launch-skip 8 --launch-count 16 --metrics gpu__time_duration.sum \
                /tmp/b-fork/bin/llama-bench -m "$m4" -ngl 99 -fa 1 -p 0 -n 8 -r 1 -d 16384 > "$out/ncu-e2e-dense.log" 2>&1 || true
            LLAMA_SPARQ=r=32,k=128,min_kv=0 timeout 200 ncu --kernel-name regex:sparq --launch-skip 8 --launch-count 16 \
                --metrics gpu__time_duration.sum /tmp/b-fork/bin/llama-bench -m "$m4" -ngl 99 -fa 1 -p 0 -n 8 -r 1 -d 16384 \
                > "$out/ncu-e2e-sparq.log" 2>&1 || true
            for f in dense sparq; do
                echo "-- $f"; grep -E "^  [a-z_].*\(|gpu__time_duration" "$out/ncu-e2e-$f.log" | sed -E 's/\(sparq_args\)|Context.*//' | paste - - | awk '{print $1, $(NF)}' | sort | uniq -c | head -20
            done
            ;;
        stock|stock-bg)
            # stock-bg: the same build in the background (CPU steps may run meanwhile); stock-wait joins it.
            # Beside the fork's build (niced) it ends ~650 s after it starts (H200, 16 cores, 2026-12-02): ~300 s
            # after the fork's, so queue GPU steps (ops, test_sparq_cuda benches) before stock-wait
            if [ "$step" = stock-bg ]; then
                # niced: the fork build, then convert and calibrate, are the critical path; stock is needed at the rounds
                build_stock > "$out/stock-bg.log" 2>&1 & stock_pid=$!
                renice -n 10 -p "$stock_pid" > /dev/null || true
            else
                build_stock
            fi
            ;;
        stock-wait)
            if [ -n "${stock_pid:-}" ]; then
                wait "$stock_pid" || { tail -40 "$out/stock-bg.log"; exit 1; }
            else   # started by an earlier remote run: wait for its build to end, then make sure it is complete
                while pgrep -f "cmake --build /tmp/b-stock" > /dev/null; do sleep 5; done
                build_stock
            fi
            tail -3 "$out/stock-bg.log" 2>/dev/null || true
            ;;
        ops)
            for o in ${OPS_LIST:-MUL_MAT_ZZ MUL_MAT_ZZ_GROUP MUL_MAT_ZZ_NORM SPARSE_IDX SPARQ_ATTN MUL_MAT_ZZ:zero-kernel MUL_MAT_ZZ_GROUP:group-off MUL_MAT_ZZ_NORM:norm-group-off MUL_MAT_ZZ_NORM:norm-off}; do
                echo "-- test-backend-ops -b CUDA0 -o $o"
                local env=()
                [ "${o#*:}" = zero-kernel ] && env=(LLAMA_SPARSE_CUDA_ZERO_KERNEL=1)
                [ "${o#*:}" = group-off ] && env=(LLAMA_SPARSE_CUDA_GROUP=0)
                [ "${o#*:}" = fuse-off ] && env=(LLAMA_SPARSE_CUDA_FUSE_OPS=0)
                [ "${o#*:}" = norm-off ] && env=(LLAMA_SPARSE_CUDA_NORM_FUSE=0)
                [ "${o#*:}" = norm-group-off ] && env=(LLAMA_SPARSE_CUDA_NORM_FUSE=1 LLAMA_SPARSE_CUDA_GROUP=0)
                [ "${o#*:}" = ticket ] && env=(LLAMA_SPARSE_CUDA_TICKET=1)
                [ "${o#*:}" = atomic ] && env=(LLAMA_SPARSE_CUDA_TICKET=0)
                [ "${o#*:}" = first ] && env=(LLAMA_SPARSE_CUDA_TICKET=2)
                [ "${o#*:}" = early ] && env=(LLAMA_SPARSE_CUDA_TICKET=3)
                [ "${o#*:}" = cluster ] && env=(LLAMA_SPARSE_CUDA_CLUSTER=1)
                [ "${o#*:}" = kt-fuse-off ] && env=(LLAMA_SPARSE_CUDA_KT_FUSE=0)
                [ "${o#*:}" = rope-fuse-off ] && env=(LLAMA_SPARSE_CUDA_ROPE_FUSE=0)
                [ "${o#*:}" = bal-always ] && env=(LLAMA_SPARSE_CUDA_SPARQ_BALANCE=2)
                [ "${o#*:}" = bal-off ] && env=(LLAMA_SPARSE_CUDA_SPARQ_BALANCE=0)
                [ "${o#*:}" = attn-fuse ] && env=(LLAMA_SPARSE_CUDA_ATTN_FUSE=1)
                [ "${o#*:}" = attn-fuse2 ] && env=(LLAMA_SPARSE_CUDA_ATTN_FUSE=2)
                [ "${o#*:}" = attn-long ] && env=(LLAMA_SPARSE_CUDA_ATTN_LONG=1) # version 8 at every length
                # attn-fuse-vN / attn-fuse2-vN: the attention kernel's version N (attn-decode.cu)
                [[ "${o#*:}" =~ ^attn-fuse(2?)-v([0-9])$ ]] &&
                    env=(LLAMA_SPARSE_CUDA_ATTN_FUSE=$((${BASH_REMATCH[1]:-1})) LLAMA_SPARSE_CUDA_ATTN_V=${BASH_REMATCH[2]})
                local orc=0 op=${o%%:*} pf=()
                # OP@REGEX: only the cases whose parameters match REGEX (test-backend-ops -p)
                [ "${op#*@}" = "$op" ] || { pf=(-p "${op#*@}"); op=${op%%@*}; }
                env "${env[@]}" timeout 300 /tmp/b-fork/bin/test-backend-ops -b CUDA0 -o "$op" "${pf[@]}" > "$out/test-backend-ops-${o//[^A-Za-z0-9_:-]/_}.log" 2>&1 || orc=$?
                o=${o//[^A-Za-z0-9_:-]/_}
                echo "rc $orc $(tbo_count 'OK$' "$out/test-backend-ops-$o.log") OK lines, $(tbo_count FAIL "$out/test-backend-ops-$o.log") FAIL lines"
                grep -E "FAIL|passed|backends|error" "$out/test-backend-ops-$o.log" | tail -4 || true
                grep -E "llama-sparse: CUDA (fuses|appends|runs the RoPE|runs one-token|folds|writes)" "$out/test-backend-ops-$o.log" | sort -u || true
            done
            ;;
        attn-test)
            # cuda/tests/test_attn_cuda (after build-base): cuda/attn-decode.cu, every version, against a float64
            # reference (fixed and random cases, outputs poisoned), then its bench (a CUDA graph over 32 layers' K/V)
            GGML_LIB_DIR=/tmp/b-fork/bin LLAMA_SPARSE_UPSTREAM=$fork bash "$repo/cuda/tests/build-attn.sh" /tmp/attn-test/t \
                > "$out/build-attn-test.log" 2>&1 || { tail -40 "$out/build-attn-test.log"; exit 1; }
            local arc=0
            timeout 300 /tmp/attn-test/t test > "$out/attn-test.log" 2>&1 || arc=$?
            echo "test_attn_cuda test: rc $arc"
            grep -E "^FAIL|cases" "$out/attn-test.log" | tail -20 || true
            timeout 120 /tmp/attn-test/t bench 2>&1 | tee "$out/attn-bench.log" || echo "bench failed"
            ;;
        attn-perf)
            # one-token flash attention at short KV: test-backend-ops perf of the test_attn_decode cases (7B 32 heads,
            # 8B 32/8, 256-2048 positions), cuda/attn-decode.cu against upstream's kernels (LLAMA_SPARSE_CUDA_ATTN_FUSE=0)
            local ae
            for ae in 1 0 1 0; do   # (ATTN_PERF_ENV: more settings for every run, e.g. LLAMA_SPARSE_CUDA_ATTN_V=3)
                env ${ATTN_PERF_ENV:-} LLAMA_SPARSE_CUDA_ATTN_FUSE=$ae timeout 120 /tmp/b-fork/bin/test-backend-ops perf -b CUDA0 -o FLASH_ATTN_EXT -p "vis=" 2>&1 |
                    tee -a "$out/attn-perf.log" | grep -E "us/run" | sed -E "s/^ *FLASH_ATTN_EXT\(hsk=([0-9]+),.*nh=([0-9]+),nr23=\[([0-9]+),.*kv=([0-9]+),.*: +/attn_fuse=$ae D \1 kv heads \2 G \3 n_kv \4: /"
            done
            ;;
        sparq-test)
            # cuda/tests/test_sparq_cuda: the CUDA SparQ op against the CPU fp64 reference, every case with every
            # variant (single: one block/cluster per KV head after step 1; split: segments over many blocks; fused: one
            # cluster per KV head for the whole op), then its bench of each (Llama-3-8B shapes, S 4k/16k/32k, K/V
            # rotated past L2 and L2-warm); needs build-base
            build_sparq /tmp/sparq-test/t build-sparq-test.log || exit 1
            local rc=0
            timeout 200 /tmp/sparq-test/t test > "$out/sparq-test.log" 2>&1 || rc=$?
            echo "test_sparq_cuda test (every variant): rc $rc; ok lines: single $(grep -c '^ok *\[single\]' "$out/sparq-test.log"), split $(grep -c '^ok *\[split\]' "$out/sparq-test.log"), fused $(grep -c '^ok *\[fused\]' "$out/sparq-test.log") ($(grep -c '^ok *\[fused\].*(fallback)' "$out/sparq-test.log") of them fallback)"
            grep -E "^FAIL|unit |error|passed" "$out/sparq-test.log" | tail -40 || true
            rc=0   # the single variant with one select block per KV head (no thread block cluster)
            LLAMA_SPARSE_CUDA_SPARQ_CLUSTER=0 timeout 120 /tmp/sparq-test/t test --variant single > "$out/sparq-test-nocluster.log" 2>&1 || rc=$?
            echo "test_sparq_cuda test --variant single, LLAMA_SPARSE_CUDA_SPARQ_CLUSTER=0: rc $rc"; tail -1 "$out/sparq-test-nocluster.log"
            rc=0   # the fused kernel in clusters of 16 blocks, resident at once or not (the size taken for few KV heads)
            LLAMA_SPARSE_CUDA_SPARQ_FU_NB=-16 timeout 120 /tmp/sparq-test/t test --variant fused > "$out/sparq-test-fu16.log" 2>&1 || rc=$?
            echo "test_sparq_cuda test --variant fused, LLAMA_SPARSE_CUDA_SPARQ_FU_NB=-16: rc $rc"; tail -1 "$out/sparq-test-fu16.log"
            timeout 75 /tmp/sparq-test/t bench 2>&1 | tee "$out/sparq-bench.log" || echo "bench failed"
            timeout 75 /tmp/sparq-test/t bench --warm 2>&1 | tee -a "$out/sparq-bench.log" || echo "bench --warm failed"
            LLAMA_SPARSE_CUDA_SPARQ_CLUSTER=0 timeout 45 /tmp/sparq-test/t bench --variant single 2>&1 | sed 's/^/no-cluster /' |
                tee -a "$out/sparq-bench.log" || echo "bench (no cluster) failed"
            ;;
        sparq-bal)
            # the fused kernel's step 3 balancing (LLAMA_SPARSE_CUDA_SPARQ_BALANCE 1: as the last launch on the same
            # caches found, 2: always exchange the counts, 0: never): test --variant fused under each, spread and crowded
            # (SPARQ_TEST_RECENT=4); then bench rounds of the three on both kinds of data; needs build-base
            sparq_bin || exit 1
            local b r i rc
            for b in 1 2 0; do
                for r in 0 4; do
                    rc=0
                    LLAMA_SPARSE_CUDA_SPARQ_BALANCE=$b SPARQ_TEST_RECENT=$r timeout 200 /tmp/sparq-test/t test --variant fused \
                        > "$out/sparq-bal-test-$b-$r.log" 2>&1 || rc=$?
                    echo "test --variant fused, balance $b, recent $r: rc $rc, $(grep -E "passed" "$out/sparq-bal-test-$b-$r.log" | tail -1)"
                done
            done
            for i in 1 2; do
                for r in 0 4; do
                    for b in 1 2 0; do
                        echo "-- round $i recent=$r balance=$b" | tee -a "$out/sparq-bal-bench.log"
                        LLAMA_SPARSE_CUDA_SPARQ_BALANCE=$b SPARQ_TEST_RECENT=$r timeout 60 /tmp/sparq-test/t bench --variant fused \
                            --S 4096,16384,32768 2>&1 | tee -a "$out/sparq-bal-bench.log" | grep -E "^ +[0-9]+ +fused" || echo "bench failed"
                    done
                done
            done
            ;;
        sparq-q8)
            # the 8-bit transposed K (kt=q8_0) against the f16 one: test_sparq_cuda bench of the fused op, K/V rotated
            # past L2, 3 rounds alternating (needs sparq-test's build)
            local i kt
            for i in 1 2 3; do
                for kt in f16 q8_0; do
                    timeout 60 /tmp/sparq-test/t bench --variant fused --kt $kt 2>&1 | grep -E "^ +[0-9]+ +fused" |
                        sed "s/^/round $i kt $kt /" | tee -a "$out/sparq-q8-bench.log" || echo "bench $kt failed"
                done
            done
            ;;
        sparq-q8-state)
            # the 8-bit copy on the GPU: appended in the prefill graph (context A) against rebuilt after a state load
            # (context B), bit for bit, on the 8B-shaped model at depth 16k (needs model8b, build)
            local rc=0
            python3 "$repo/bench/sparq_state_check.py" "$r8b" --ngl 99 --depth 16384 --sparq r=32,k=128,min_kv=0,kt=q8_0 \
                > "$out/sparq-q8-state.log" 2>&1 || rc=$?
            echo "kt=q8_0 state check: rc $rc"; grep -E "^depth|^decode|Error|error" "$out/sparq-q8-state.log" | tail -6
            ;;
        sparq-q8-e2e)
            # decode at 16k / 32k on the 8B-shaped model: stock, fork dense, SparQ r 32 k 128 with the f16 and the
            # 8-bit transposed K (needs model8b, build)
            sparq8b_rounds sparq-q8-e2e stock dense "sparq:LLAMA_SPARQ=r=32,k=128,min_kv=0" "sparq8:LLAMA_SPARQ=r=32,k=128,min_kv=0,kt=q8_0"
            ;;
        sparq-q8-diag)
            # where the 8-bit copy's end-to-end time goes: tg64 at depth 32k (SPARQ_E2E_DEPTHS), f16 copy, q8 copy with
            # its append as one kernel (default), q8 copy with the four append nodes (LLAMA_SPARSE_CUDA_KT_FUSE=0), each
            # also without CUDA graphs; then ncu device time per kernel of 8 decode tokens on a 4-layer 8B-shaped
            # model (needs model8b, build)
            SPARQ_E2E_DEPTHS=${SPARQ_E2E_DEPTHS:-32768} sparq8b_rounds sparq-q8-diag dense "sparq:LLAMA_SPARQ=r=32,k=128,min_kv=0" \
                "sparq8:LLAMA_SPARQ=r=32,k=128,min_kv=0,kt=q8_0" "sparq8-nofuse:LLAMA_SPARQ=r=32,k=128,min_kv=0,kt=q8_0 LLAMA_SPARSE_CUDA_KT_FUSE=0" \
                "sparq-nograph:LLAMA_SPARQ=r=32,k=128,min_kv=0 GGML_CUDA_DISABLE_GRAPHS=1" \
                "sparq8-nograph:LLAMA_SPARQ=r=32,k=128,min_kv=0,kt=q8_0 GGML_CUDA_DISABLE_GRAPHS=1"
            local c
            make_m4 || exit 1
            for c in "f16:r=32,k=128,min_kv=0" "q8:r=32,k=128,min_kv=0,kt=q8_0" "q8-nofuse:r=32,k=128,min_kv=0,kt=q8_0"; do
                local envs=(LLAMA_SPARQ=${c#*:}); [ "${c%%:*}" = q8-nofuse ] && envs+=(LLAMA_SPARSE_CUDA_KT_FUSE=0)
                env "${envs[@]}" timeout 200 ncu --csv --print-units base --metrics gpu__time_duration.sum \
                    --log-file "$out/prof-kt-${c%%:*}.csv" /tmp/b-fork/bin/llama-bench -m "$m4" -ngl 99 -fa 1 -p 0 -n 8 -r 1 \
                    > "$out/prof-kt-${c%%:*}.log" 2>&1 || echo "${c%%:*} ncu rc $?"
                python3 "$repo/bench/ncu_decode_split.py" "$out/prof-kt-${c%%:*}.csv" --tokens 9 --label "${c%%:*}" --top 24 || true
            done
            ;;
        kt-check)
            # the kt=q8_0 append kernel (cuda/sparq-kt.cu): compute-sanitizer memcheck of test-backend-ops SPARQ_KT_APPEND,
            # then a mutant (one quant of every block off by one) that the test must fail; the source is restored after
            # (needs build; the last step of a chain: test-backend-ops is rebuilt with the restored kernel)
            local kt_src=$repo/cuda/sparq-kt.cu rc=0
            timeout 300 compute-sanitizer --tool memcheck /tmp/b-fork/bin/test-backend-ops -b CUDA0 -o SPARQ_KT_APPEND \
                > "$out/kt-memcheck.log" 2>&1 || rc=$?
            echo "memcheck rc $rc"; grep -E "ERROR SUMMARY|tests passed" "$out/kt-memcheck.log" || true
            cp "$kt_src" "$work/sparq-kt.cu.orig"
            sed -i 's/y->qs\[j\] = roundf(v\*id);/y->qs[j] = roundf(v*id) + (j == 5);/' "$kt_src"
            grep -q "j == 5" "$kt_src" || { echo "mutation not applied"; cp "$work/sparq-kt.cu.orig" "$kt_src"; exit 1; }
            cmake --build /tmp/b-fork -j "$jobs" --target test-backend-ops > "$out/kt-mutant-build.log" 2>&1 ||
                { tail -20 "$out/kt-mutant-build.log"; cp "$work/sparq-kt.cu.orig" "$kt_src"; exit 1; }
            rc=0
            timeout 120 /tmp/b-fork/bin/test-backend-ops -b CUDA0 -o SPARQ_KT_APPEND > "$out/kt-mutant.log" 2>&1 || rc=$?
            echo "mutant: rc $rc (must fail), $(grep -c FAIL "$out/kt-mutant.log") FAIL lines"; grep -E "passed" "$out/kt-mutant.log" | tail -2
            cp "$work/sparq-kt.cu.orig" "$kt_src"
            cmake --build /tmp/b-fork -j "$jobs" --target test-backend-ops > "$out/kt-restore-build.log" 2>&1 || tail -20 "$out/kt-restore-build.log"
            ;;
        sparq-perf)
            # SparQ (r 32, k 128) with both step-2 variants against stock flash-attention decode, Llama-3-8B
            # attention shapes, S 4k/16k/32k
            for v in 0 1; do
                echo "-- SPARQ_ATTN, LLAMA_SPARSE_CUDA_SPARQ_SPLIT=$v ($([ $v = 1 ] && echo split || echo single))"
                local rc=0
                LLAMA_SPARSE_CUDA_SPARQ_SPLIT=$v timeout 150 /tmp/b-fork/bin/test-backend-ops -b CUDA0 -o SPARQ_ATTN \
                    > "$out/test-backend-ops-SPARQ_ATTN-split$v.log" 2>&1 || rc=$?
                echo "vs CPU: rc $rc, $(tbo_count 'OK$' "$out/test-backend-ops-SPARQ_ATTN-split$v.log") OK, $(tbo_count FAIL "$out/test-backend-ops-SPARQ_ATTN-split$v.log") FAIL"
                LLAMA_SPARSE_CUDA_SPARQ_SPLIT=$v timeout 150 /tmp/b-fork/bin/test-backend-ops perf -b CUDA0 -o SPARQ_ATTN 2>&1 |
                    tee "$out/perf-sparq-split$v.log" | grep -E "us/run" || echo "perf SPARQ_ATTN failed"
            done
            echo "-- FLASH_ATTN_EXT (stock kernels)"
            perf_fa
            ;;
        sparq-opfa)
            # issue 7's op figure: test_sparq_cuda bench (K/V rotated past L2, then warm) and test-backend-ops perf of
            # SPARQ_ATTN against FLASH_ATTN_EXT at the Llama-3-8B shapes, S 4k/16k/32k (needs build with test-backend-ops)
            sparq_bin || exit 1
            timeout 90 /tmp/sparq-test/t bench 2>&1 | tee "$out/sparq-bench.log" | grep -v "^device" || echo "bench failed"
            timeout 90 /tmp/sparq-test/t bench --warm 2>&1 | tee -a "$out/sparq-bench.log" | grep -v "^device" || echo "bench --warm failed"
            local rc=0
            timeout 150 /tmp/b-fork/bin/test-backend-ops -b CUDA0 -o SPARQ_ATTN > "$out/test-backend-ops-SPARQ_ATTN.log" 2>&1 || rc=$?
            echo "SPARQ_ATTN vs CPU: rc $rc, $(tbo_count 'OK$' "$out/test-backend-ops-SPARQ_ATTN.log") OK, $(tbo_count FAIL "$out/test-backend-ops-SPARQ_ATTN.log") FAIL"
            timeout 150 /tmp/b-fork/bin/test-backend-ops perf -b CUDA0 -o SPARQ_ATTN 2>&1 | tee "$out/perf-sparq.log" | grep -E "us/run" || echo "perf SPARQ_ATTN failed"
            perf_fa
            ;;
        mm-perf)
            /tmp/b-fork/bin/test-backend-ops perf -b CUDA0 -o MUL_MAT_ZZ 2>&1 | tee "$out/perf-zz.log" | grep -E "us/run" | sed 's/  */ /g' | cut -c1-120
            /tmp/b-fork/bin/test-backend-ops perf -b CUDA0 -o MUL_MAT -p "type_a=q4_K,type_b=f32" 2>&1 | tee "$out/perf-mm.log" | grep -E "n=1,.*us/run" | sed 's/  */ /g' | cut -c1-120
            ;;
        bench|bench-staged)
            # bench-staged: the same with Q4_K on the staged (cp.async) kernel instead of the direct one
            [ -x /tmp/zz-test/t ] || { echo "no test binary (zztest step)"; exit 1; }
            local direct=1; [ "$step" = bench ] || direct=0
            # --reduction both (default): the ticket reduction's times, then 'atomic: dense idx fused' (memset + atomics);
            # BENCH_REDUCTION=early times decode's reduction instead
            LLAMA_SPARSE_CUDA_DIRECT=$direct timeout 480 /tmp/zz-test/t bench --batch 1 --reduction "${BENCH_REDUCTION:-both}" \
                --shapes 4096x4096,11008x4096,4096x11008,14336x4096,4096x14336,5120x5120,13824x5120,5120x13824,8192x8192,28672x8192,8192x28672 \
                --csv "$out/$step.csv" 2>&1 | tee "$out/$step.log" | tail -80
            ;;
        bench-red)
            # fixed costs of the direct Q4_K GEMV on the Llama-2-7B shapes, batch 1: every row has the ticket reduction's
            # times and, at the end, 'atomic: dense idx fused' (memset + atomics); then dense without the L2 prefetch,
            # fused with it (64 columns), n1 8 / 32
            [ -x /tmp/zz-test/t ] || { echo "no test binary (zztest step)"; exit 1; }
            local v
            for v in "" LLAMA_SPARSE_CUDA_PREFETCH=0 LLAMA_SPARSE_CUDA_PREFETCH_FUSED=64 LLAMA_SPARSE_CUDA_N1=8 LLAMA_SPARSE_CUDA_N1=32; do
                echo "-- ${v:-default (n1 16 x n2 4, dense prefetch 64 columns, fused none)}"
                env $v timeout 140 /tmp/zz-test/t bench --batch 1 --reduction both --shapes 4096x4096,11008x4096,4096x11008 2>&1 |
                    tee -a "$out/bench-red.log" | grep -E "^(type|q4_K)"
            done
            ;;
        sparq-state)
            # after a state load the transposed K copy is rebuilt on the GPU: same logits as the graph-kept copy, and
            # the first decode's time against the host round trip (LLAMA_SPARSE_SPARQ_HOST_REBUILD=1); on a 4-layer
            # Llama-3-8B-shaped model (made here if missing: a minute)
            local rc=0
            make_m4 || exit 1
            python3 "$repo/bench/sparq_state_check.py" "$m4" --ngl 99 --depth 16384 > "$out/sparq-state.log" 2>&1 || rc=$?
            echo "device rebuild: rc $rc"; grep -E "^depth|^decode|Error|error" "$out/sparq-state.log" | tail -6
            rc=0
            LLAMA_SPARSE_SPARQ_HOST_REBUILD=1 python3 "$repo/bench/sparq_state_check.py" "$m4" --ngl 99 --depth 16384 \
                > "$out/sparq-state-host.log" 2>&1 || rc=$?
            echo "host round trip: rc $rc"; grep -E "^depth|^decode|Error|error" "$out/sparq-state-host.log" | tail -6
            ;;
        sparq-flush)
            # the fused op's bench with its inputs and code cold as in decode: plain, --flush (2x L2 of other data read
            # before every call), --evict (256 KB of other code on every SM), both; three rounds alternating; needs
            # build-base
            sparq_bin || exit 1
            local i f
            for i in 1 2 3; do
                for f in "" "--flush" "--evict" "--flush --evict"; do
                    echo "-- round $i: ${f:-plain}"
                    timeout 90 /tmp/sparq-test/t bench --variant fused --S 256,4096,16384,32768 $f 2>&1 |
                        tee -a "$out/sparq-flush.log" | grep -v "^device" || echo "bench failed"
                done
            done
            ;;
        sparq-probe)
            # cuda/tests/sparq_probe.cu: launch floors, barrier / shuffle / shared / L2 / DRAM / DSMEM latencies,
            # cluster and global-counter barriers, streaming reads by grid size (no ggml; ~10 s)
            nvcc -O3 -arch=sm_90 -std=c++17 "$repo/cuda/tests/sparq_probe.cu" -o /tmp/sparq_probe > "$out/build-probe.log" 2>&1 ||
                { tail -20 "$out/build-probe.log"; exit 1; }
            timeout 120 /tmp/sparq_probe 2>&1 | tee "$out/sparq-probe.log" || echo "probe failed"
            ;;
        sparq-knobs)
            # test_sparq_cuda bench (single variant) under run-time knobs, each against the default in the same step:
            # step-1 grid (LLAMA_SPARSE_CUDA_SPARQ_SC_WAVES 0 = a block per chunk) and cluster size (4, 2); needs sparq-test
            local kv
            for kv in "" LLAMA_SPARSE_CUDA_SPARQ_SC_WAVES=0 LLAMA_SPARSE_CUDA_SPARQ_CLUSTER=4 LLAMA_SPARSE_CUDA_SPARQ_CLUSTER=2 "" ; do
                echo "-- ${kv:-default}"
                env $kv timeout 60 /tmp/sparq-test/t bench --variant single 2>&1 | grep -v "^device\|step2" || echo "bench failed"
                env $kv timeout 60 /tmp/sparq-test/t bench --variant step1 2>&1 | grep "step1" || true
            done
            ;;
        sparq-ab)
            # test_sparq_cuda bench (single variant) built two ways, rounds alternating: NVCC flags SPARQ_AB_A
            # (default -DSPARQ_PHASE_TIMING) against SPARQ_AB_B (default the same plus -DSPARQ_CUDA_MAX_G=4), at
            # S SPARQ_AB_S (default 256,4096,16384,32768); B is checked against the CPU reference first (needs build-base)
            local fa=${SPARQ_AB_A:--DSPARQ_PHASE_TIMING} fb=${SPARQ_AB_B:--DSPARQ_PHASE_TIMING -DSPARQ_CUDA_MAX_G=4} b rc=0
            # a copy of the sources the test builds from, for a build whose cuda/sparq-attn.cu differs
            sparq_tree() { rm -rf "$1"; mkdir -p "$1" && cp -r "$repo/cuda" "$repo/ggml-sparse" "$repo/tests" "$repo/tools" "$1"/; }
            # SPARQ_AB_A_SRC: a file (relative to LS_DEVICE_DIR) A's copy of cuda/sparq-attn.cu is replaced with
            local ra=$repo
            if [ -n "${SPARQ_AB_A_SRC:-}" ]; then
                ra=/tmp/sparq-ab/repo-a; sparq_tree $ra && cp "$dev/$SPARQ_AB_A_SRC" $ra/cuda/sparq-attn.cu || exit 1
            fi
            build_sparq /tmp/sparq-ab/a/t build-sparq-ab-a.log "$fa" "$ra" & local p1=$!
            # SPARQ_AB_SED: a sed script B's copy of cuda/sparq-attn.cu is built with
            local rb=$repo
            if [ -n "${SPARQ_AB_SED:-}" ]; then
                rb=/tmp/sparq-ab/repo-b; sparq_tree $rb && sed -i -E "$SPARQ_AB_SED" $rb/cuda/sparq-attn.cu || exit 1
            fi
            build_sparq /tmp/sparq-ab/b/t build-sparq-ab-b.log "$fb" "$rb" || exit 1
            wait $p1 || exit 1
            timeout 200 /tmp/sparq-ab/b/t test --variant single > "$out/sparq-ab-test-b.log" 2>&1 || rc=$?
            echo "B ($fb ${SPARQ_AB_SED:-}): test_sparq_cuda test --variant single: rc $rc"; grep -E "^FAIL" "$out/sparq-ab-test-b.log" | head -5 || true
            tail -1 "$out/sparq-ab-test-b.log"
            for b in a b a b; do
                echo "-- $b ($([ $b = a ] && echo "$fa" || echo "$fb"))"
                sparq_bench_single /tmp/sparq-ab/$b/t sparq-ab-$b.log
            done
            ;;
        sparq-env-ab)
            # test_sparq_cuda (phase-timing build, needs build-base): `test` with the defaults and with SPARQ_ENV_B set,
            # then bench (single variant) rounds alternating default | SPARQ_ENV_B at S SPARQ_AB_S
            local eb=${SPARQ_ENV_B:?set SPARQ_ENV_B=VAR=VALUE} rc=0 i
            [ -x /tmp/sparq-test/t-phases ] || build_sparq /tmp/sparq-test/t-phases build-sparq-phases.log -DSPARQ_PHASE_TIMING || exit 1
            timeout 200 /tmp/sparq-test/t-phases test > "$out/sparq-env-test-a.log" 2>&1 || rc=$?
            echo "default: test_sparq_cuda test: rc $rc; $(tail -1 "$out/sparq-env-test-a.log")"; rc=0
            env "$eb" timeout 200 /tmp/sparq-test/t-phases test --variant single > "$out/sparq-env-test-b.log" 2>&1 || rc=$?
            echo "$eb: test_sparq_cuda test --variant single: rc $rc; $(tail -1 "$out/sparq-env-test-b.log")"
            for i in 1 2; do
                echo "-- default"
                sparq_bench_single /tmp/sparq-test/t-phases sparq-env-a.log
                echo "-- $eb"
                sparq_bench_single /tmp/sparq-test/t-phases sparq-env-b.log "$eb"
            done
            ;;
        sparq-phases)
            # where the single SparQ variant spends its time: per-phase %globaltimer stamps of the first block of
            # each kernel (-DSPARQ_PHASE_TIMING build of test_sparq_cuda; needs build-base), S 4k/16k/32k
            # and the same built with $PHASES_VARIANT (default -DSPARQ_SC_THREADS=256; b256 is that build's name),
            # checked against the CPU reference first
            build_sparq /tmp/sparq-test/t-phases build-sparq-phases.log -DSPARQ_PHASE_TIMING & local p1=$!
            build_sparq /tmp/sparq-test/b256/t build-sparq-phases256.log "-DSPARQ_PHASE_TIMING ${PHASES_VARIANT:--DSPARQ_SC_THREADS=256}" || exit 1
            wait $p1 || exit 1
            local rc=0
            timeout 200 /tmp/sparq-test/b256/t test > "$out/sparq-test-256.log" 2>&1 || rc=$?
            echo "SPARQ_SC_THREADS=256: test_sparq_cuda test (both variants): rc $rc"; tail -1 "$out/sparq-test-256.log"
            for b in t-phases b256/t t-phases b256/t; do
                echo "-- $b"
                timeout 60 /tmp/sparq-test/$b bench --variant single 2>&1 | tee -a "$out/sparq-phases.log" | grep -v "^device\|step2" || echo "bench failed"
            done
            ;;
        sparq-fused-phases)
            # where the fused SparQ kernel spends its time: %globaltimer stamps of block 0 and of its cluster's last
            # block (-DSPARQ_PHASE_TIMING build of test_sparq_cuda; needs build-base), S 4k/16k/32k, two rounds
            [ -x /tmp/sparq-test/t-phases ] || build_sparq /tmp/sparq-test/t-phases build-sparq-phases.log -DSPARQ_PHASE_TIMING || exit 1
            local i
            for i in 1 2; do
                timeout 60 /tmp/sparq-test/t-phases bench --variant fused 2>&1 | tee -a "$out/sparq-fused-phases.log" |
                    grep -v "^device\|step2" || echo "bench failed"
            done
            ;;
        sparq-src)
            # ncu details of sparq_attend and sparq_scores (single variant, S 32k, K/V rotated): registers, spills, warp
            # stalls (builds test_sparq_cuda if sparq-test did not; needs build-base)
            sparq_bin || exit 1
            local kn
            for kn in sparq_attend sparq_scores; do
                timeout 240 ncu --kernel-name regex:$kn --launch-skip 3 --launch-count 1 --set full \
                    -f -o "$out/ncu-$kn" /tmp/sparq-test/t bench --S 32768 --variant single --iters 4 \
                    > "$out/ncu-$kn-run.log" 2>&1 || { echo "ncu $kn failed"; tail -5 "$out/ncu-$kn-run.log"; continue; }
                ncu -i "$out/ncu-$kn.ncu-rep" --page details > "$out/ncu-$kn-details.txt" 2>&1 || true
                grep -E "Duration|Warp Cycles Per Issued|Registers Per|Achieved Occupancy|Local Memory|Stall|spill" \
                    "$out/ncu-$kn-details.txt" | head -20
            done
            ;;
        sparq-stalls)
            # warp stall reasons of the kernels SPARQ_STALL_KERNELS (default sparq_attend sparq_scores) at S
            # SPARQ_STALL_S (default 16384), variant SPARQ_STALL_VARIANT (default single; fused for sparq_fused),
            # K/V rotated: per-reason cycles per issued instruction (raw page) and per SASS instruction (source page,
            # summarized by tools/device/ncu_sass.py: regions, barrier stretches, top instructions); needs build-base
            build_sparq /tmp/sparq-test/t-li build-sparq-li.log -lineinfo || exit 1
            local kn
            for kn in ${SPARQ_STALL_KERNELS:-sparq_attend sparq_scores}; do
                timeout 200 ncu --clock-control none --kernel-name regex:$kn --launch-skip 3 --launch-count 1 \
                    --section WarpStateStats --section SourceCounters --section InstructionStats --section LaunchStats \
                    --import-source yes -f -o "$out/stall-$kn" /tmp/sparq-test/t-li bench --S "${SPARQ_STALL_S:-16384}" \
                    --variant "${SPARQ_STALL_VARIANT:-single}" --iters 4 > "$out/stall-$kn-run.log" 2>&1 || { echo "ncu $kn failed"; tail -5 "$out/stall-$kn-run.log"; continue; }
                ncu -i "$out/stall-$kn.ncu-rep" --page raw --csv > "$out/stall-$kn-raw.csv" 2>&1 || true
                python3 "$repo/tools/device/ncu_sass.py" --raw "$out/stall-$kn-raw.csv" || true
                # (--print-source cuda gave the source text without metrics; sass has them per instruction)
                ncu -i "$out/stall-$kn.ncu-rep" --page source --csv --print-source sass > "$out/stall-$kn-src-sass.csv" 2>&1 ||
                    echo "source page failed: $(head -c 300 "$out/stall-$kn-src-sass.csv")"
                python3 "$repo/tools/device/ncu_sass.py" "$out/stall-$kn-src-sass.csv" > "$out/stall-$kn-summary.txt" 2>&1 || true
                ls -la "$out"/stall-$kn* | awk '{print "  " $5, $9}'
            done
            ;;
        test-bins)
            # both standalone CUDA test programs, built only (for sanitize without the full test runs)
            WITH_GGML_CUDA=1 GGML_LIB_DIR=/tmp/b-fork/bin LLAMA_SPARSE_UPSTREAM=$fork GGML_INCLUDE=$fork/ggml/include \
                bash "$repo/cuda/tests/build.sh" /tmp/zz-test/t > "$out/build-zztest.log" 2>&1 & local p1=$!
            build_sparq /tmp/sparq-test/t build-sparq-test.log || exit 1
            wait $p1 || { tail -40 "$out/build-zztest.log"; exit 1; }
            zz_src_stamp > /tmp/zz-test/stamp
            ;;
        sanitize)
            # compute-sanitizer over a few cases of both standalone CUDA tests (after zztest / sparq-test built them):
            # memcheck (out-of-bounds, misaligned, uninitialised global reads) and racecheck (shared memory hazards)
            local cs tool
            cs=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
            [ -n "$cs" ] || { echo "no compute-sanitizer"; exit 1; }
            # (rc 1 with "ticket counters ... never ran" is the test's own check: one case may not reach the ticket
            # reduction; the sanitizer's verdict is its SUMMARY line, and rc 9)
            local rc
            for tool in memcheck racecheck; do
                rc=0
                timeout 280 "$cs" --tool $tool --error-exitcode 9 /tmp/zz-test/t test --cases 1 > "$out/sanitize-zz-$tool.log" 2>&1 || rc=$?
                echo "test_zz_cuda test --cases 1 under $tool: rc $rc"; grep -E "SUMMARY|PASSED|FAIL" "$out/sanitize-zz-$tool.log" | tail -3
            done
            rc=0
            timeout 280 "$cs" --tool memcheck --error-exitcode 9 /tmp/sparq-test/t test --variant single > "$out/sanitize-sparq-memcheck.log" 2>&1 || rc=$?
            echo "test_sparq_cuda test --variant single under memcheck: rc $rc"; grep -E "SUMMARY|passed" "$out/sanitize-sparq-memcheck.log" | tail -3
            ;;
        bench-q4kv)
            # direct Q4_K GEMV: step versions $Q4KV_VERSIONS (default 2 3; 3 is the default at batch 1, 2 above), batch 1
            # and 4
            [ -x /tmp/zz-test/t ] || { echo "no test binary (zztest step)"; exit 1; }
            local v envs=()
            for v in ${Q4KV_VERSIONS:-2 3}; do envs+=(LLAMA_SPARSE_CUDA_Q4K_V=$v); done
            zz_bench_envs bench-q4kv.log 1,4 "${envs[@]}"
            ;;
        bench-cfg)
            # test_zz_cuda bench under each of $BENCH_ENVS (default: the launch config against the former fixed
            # n1 = 16; ',' for spaces inside one), batch $BENCH_BATCH (default 1,4); builds test_zz_cuda without
            # ggml-cuda (no stock column) after build-base when the zztest step did not run
            zz_build_lite
            zz_bench_envs bench-cfg.log "${BENCH_BATCH:-1,4}" ${BENCH_ENVS:-LLAMA_SPARSE_CUDA_N1=-1 LLAMA_SPARSE_CUDA_N1=16}
            ;;
        zztest-lite|zztest-bg)
            # test_zz_cuda without ggml-cuda (after build-base), `test` once under each of $ZZTEST_ENVS (',' for
            # spaces inside one; default: the defaults), seeds 1, 2, ...; zztest-bg: in the background (beside the
            # builds), zztest-wait joins it and prints the summaries
            zz_tests() {
                zz_build_lite
                local v i=1
                for v in ${ZZTEST_ENVS:-LLAMA_SPARSE_DEFAULTS=1}; do
                    echo "-- test: $v" | tee -a "$out/zztest-lite.log"
                    env ${v//,/ } /tmp/zz-test/t test --seed $i 2>&1 | tee -a "$out/zztest-lite.log" | tail -6
                    i=$((i + 1))
                done
            }
            if [ "$step" = zztest-bg ]; then
                zz_tests > "$out/zztest-bg.log" 2>&1 & zztest_pid=$!
            else
                zz_tests
            fi
            ;;
        zztest-wait)
            wait "${zztest_pid:?no zztest-bg step before}" || echo "zztest-bg rc $?"
            cat "$out/zztest-bg.log"
            ;;
        zz-chain)
            # decode's GEMV chain without a model (test_zz_cuda chain: 32 layers of q/k/v, o, gate/up, down, levels
            # dense-100 %; 100 %: no active column, the launches' fixed cost), two alternating rounds over $CHAIN_ENVS
            # (',' for spaces inside one), $CHAIN_MODEL (7b | 8b), $CHAIN_BATCH (default 1); after build-base (builds
            # test_zz_cuda like zztest-lite), or after build zztest: then the binary has ggml-cuda and also times stock's
            # chain
            zz_build_lite
            zz_env_rounds zz-chain.log "^ ?[0-9]|^ T |floor" "${CHAIN_ENVS:-LLAMA_SPARSE_DEFAULTS=1}" \
                chain --model "${CHAIN_MODEL:-7b}" --batch "${CHAIN_BATCH:-1}"
            ;;
        chain-ab)
            # test_zz_cuda built two ways (after build-base; A: the defaults, zz_build_lite's binary, B: NVCC flags
            # $CHAIN_AB_FLAGS, default -DGGML_SPARSE_CUDA_FLAG_FENCE), B's `test` first, then the chain (as zz-chain:
            # $CHAIN_MODEL, $CHAIN_BATCH) in $CHAIN_AB_ROUNDS rounds (default 3) alternating A | B
            local fb=${CHAIN_AB_FLAGS:--DGGML_SPARSE_CUDA_FLAG_FENCE} b i rc=0 bin
            zz_build_lite & local p1=$!
            build_zz /tmp/chain-ab/b/t build-chain-ab-b.log "$fb" || exit 1
            wait $p1 || exit 1
            timeout 300 /tmp/chain-ab/b/t test --seed 7 > "$out/chain-ab-test-b.log" 2>&1 || rc=$?
            echo "B ($fb): test_zz_cuda test: rc $rc"; tail -4 "$out/chain-ab-test-b.log"
            for i in $(seq 1 "${CHAIN_AB_ROUNDS:-3}"); do
                for b in a b; do
                    bin=/tmp/zz-test/t; [ $b = a ] || bin=/tmp/chain-ab/b/t
                    echo "-- round $i, $b" | tee -a "$out/chain-ab.log"
                    timeout 150 $bin chain --model "${CHAIN_MODEL:-7b}" --batch "${CHAIN_BATCH:-1}" 2>&1 |
                        tee -a "$out/chain-ab.log" | grep -E "^ ?[0-9]|^ T |floor"
                done
            done
            ;;
        cuda-tune)
            # `llama-sparse cuda-tune` on the 7B zigzag model (after modelzz) into $out/cuda-tune.txt, then tg128 at
            # the levels CUDA_TUNE_LEVELS (dense 0.50) with that file | the built-in table alone | neither (the
            # heuristic), two rounds
            local tf=$out/cuda-tune.txt m=$zc7b lv i c row
            [ -f "$m" ] || m=$z7b
            timeout 560 python3 -m llama_sparse cuda-tune "$m" -o "$tf" --max-batch "${TUNE_BATCH:-8}" \
                > "$out/cuda-tune.log" 2>&1 || { tail -20 "$out/cuda-tune.log"; exit 1; }
            grep -E "^(tuning|wrote|autotune)" "$out/cuda-tune.log" | tail -30
            cat "$tf"
            local lbt=(-ngl 99 -p 0 -n 128 -r 3 -o md)
            echo "-- tg128 t/s: tuned file | built-in table | heuristic"
            for i in 1 2; do
                for lv in ${CUDA_TUNE_LEVELS:-dense 0.50}; do
                    row="$lv:"
                    for c in "LLAMA_SPARSE_CUDA_TUNE_FILE=$tf" "LLAMA_SPARSE_CUDA_TUNE_FILE=/nonexistent" \
                             "LLAMA_SPARSE_CUDA_TUNE_FILE=/nonexistent LLAMA_SPARSE_CUDA_TUNE_BUILTIN=0"; do
                        row+=" $(env $c LLAMA_SPARSE=$lv /tmp/b-fork/bin/llama-bench -m "$m" "${lbt[@]}" 2>&1 |
                            tee -a "$out/cuda-tune-tg.log" | tg_col) |"
                    done
                    echo "$row"
                done
            done
            ;;
        tune)
            zz_build_lite
            LLAMA_SPARSE_CUDA_TUNE_TYPES=${TUNE_TYPES:-q4_K} timeout 500 /tmp/zz-test/t tune --max-batch "${TUNE_BATCH:-1}" \
                --sparsity 0.5 --out "$out/tune.txt" --shapes ${TUNE_SHAPES:-$zz_shapes7} 2>&1 |
                tee "$out/tune.log" | grep -E "autotune|tune:"
            cat "$out/tune.txt"
            ;;
        bench-tuned)
            # issue 6's GEMV table (11 shapes, stock mmvq in the same process: after zztest) with the heuristic and with
            # the tune step's file, alternating, $TUNED_ROUNDS rounds, batches $TUNED_BATCH (default 1)
            [ -x /tmp/zz-test/t ] && [ -f "$out/tune.txt" ] || { echo "no test binary or tune file (zztest, tune)"; exit 1; }
            local i v
            for i in $(seq 1 "${TUNED_ROUNDS:-2}"); do
                for v in LLAMA_SPARSE_CUDA_TUNE_FILE=/nonexistent LLAMA_SPARSE_CUDA_TUNE_FILE=$out/tune.txt; do
                    echo "-- round $i: $v" | tee -a "$out/bench-tuned.log"
                    env $v timeout 200 /tmp/zz-test/t bench --batch "${TUNED_BATCH:-1}" --reduction early \
                        --shapes $zz_shapes11 2>&1 | tee -a "$out/bench-tuned.log" | grep -E "^(device|type|q4_K|copy)"
                done
            done
            ;;
        ab)
            local flags=() names=(a) bins=(/tmp/zz-test/t) envs=("") f i j rc pids=()
            [ -z "${AB_FLAGS:-}" ] || IFS='|' read -r -a flags <<< "$AB_FLAGS"
            zz_build_lite & pids+=($!)
            for i in "${!flags[@]}"; do
                build_zz /tmp/ab/$i/t build-ab-$i.log "${flags[$i]}" & pids+=($!)
                names+=("b$i:${flags[$i]// /,}") bins+=(/tmp/ab/$i/t) envs+=("")
            done
            for f in "${pids[@]}"; do wait "$f" || exit 1; done
            for f in ${AB_ENVS:-}; do names+=("a:$f") bins+=(/tmp/zz-test/t) envs+=("$f"); done
            for i in "${!flags[@]}"; do
                rc=0; timeout 300 /tmp/ab/$i/t test --seed $((i + 7)) > "$out/ab-test-$i.log" 2>&1 || rc=$?
                echo "b$i (${flags[$i]}): test_zz_cuda test: rc $rc"; tail -3 "$out/ab-test-$i.log"
            done
            for i in $(seq 1 "${AB_ROUNDS:-2}"); do
                for j in "${!names[@]}"; do
                    echo "-- round $i, ${names[$j]}" | tee -a "$out/ab-bench.log" "$out/ab-chain.log"
                    env ${envs[$j]//,/ } timeout 150 ${bins[$j]} bench --type q4_K --batch "${AB_BATCH:-1}" --reduction early \
                        --shapes $zz_shapes7 2>&1 |
                        tee -a "$out/ab-bench.log" | grep -E "^(device|q4_K)"
                    env ${envs[$j]//,/ } timeout 150 ${bins[$j]} chain --model 7b --batch 1 2>&1 |
                        tee -a "$out/ab-chain.log" | grep -E "^ ?[0-9]|^ T |floor"
                done
            done
            ;;
        bench-n1)
            # blocks per block-row (LLAMA_SPARSE_CUDA_N1) for the step versions $Q4KV_VERSIONS (default 2), batch 1,
            # the Llama-2-7B shapes
            [ -x /tmp/zz-test/t ] || { echo "no test binary (zztest step)"; exit 1; }
            local v n1
            for v in ${Q4KV_VERSIONS:-2}; do
                for n1 in 8 16 24 32; do
                    echo "-- version $v, N1 $n1"
                    env LLAMA_SPARSE_CUDA_Q4K_V=$v LLAMA_SPARSE_CUDA_N1=$n1 timeout 120 /tmp/zz-test/t bench --type q4_K --batch 1 \
                        --reduction atomic --shapes 4096x4096,11008x4096,4096x11008 2>&1 | tee -a "$out/bench-n1.log" | grep -E "^q4_K"
                done
            done
            ;;
        ncu-gemv)
            # where the direct Q4_K GEMV waits: speed of light, occupancy, warp states, stall sources, 11008x4096 batch 1
            zz_build_lite
            # (NCU_GEMV_SKIP: direct launches to pass first; the bench's order per sparsity 0, 25, 40, 50 ...: dense
            # (sparsity 0 only), idx, idx + list, one fused check, fused, each timed as 1 + 8 reps launches)
            timeout 280 ncu --kernel-name regex:direct --launch-skip ${NCU_GEMV_SKIP:-0} --launch-count ${NCU_GEMV_COUNT:-4} \
                --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
                --section MemoryWorkloadAnalysis --section SchedulerStats --section SourceCounters \
                /tmp/zz-test/t bench --type q4_K --batch 1 --reduction atomic --shapes ${NCU_GEMV_SHAPE:-11008x4096} \
                > "$out/ncu-gemv.log" 2>&1 || true
            grep -E "mul_mat_zz_gemv_q4_K_direct|Duration|Memory Throughput|DRAM Throughput|Achieved Occupancy|Registers Per|Theoretical Occ|Stall|Warp Cycles Per Issued|Waves Per SM|Block Limit" "$out/ncu-gemv.log" | head -80
            ;;
        ncu-bytes)
            # DRAM bytes per launch of the direct Q4_K GEMV (dense, idx, fused; sparsity 0-80 %, random columns) against
            # the weight bytes of the active columns: does a sparse GEMV pay for the DRAM fetches around its 144-byte
            # blocks? ncu flushes the caches before each launch; once per env of $NCU_BYTES_ENVS
            zz_build_lite
            local v
            for v in ${NCU_BYTES_ENVS:-LLAMA_SPARSE_DEFAULTS=1}; do
                ncu_bytes /tmp/zz-test/t "$v"
            done
            ;;
        ncu-issue)
            # what bounds the direct Q4_K GEMV (not its DRAM bytes: a column-tile layout without over-fetch was no faster,
            # bench/results/cuda_h200_2026-11-29.md): ncu sections of the first $NCU_ISSUE_COUNT launches of
            # test_zz_cuda bytes on $NCU_ISSUE_SHAPE (dense, then idx and fused at 0, 25, 50 %)
            zz_build_lite
            timeout 240 ncu --kernel-name regex:direct --launch-count ${NCU_ISSUE_COUNT:-7} --section SpeedOfLight \
                --section WarpStateStats --section SchedulerStats --section Occupancy --section MemoryWorkloadAnalysis \
                /tmp/zz-test/t bytes --shapes "${NCU_ISSUE_SHAPE:-28672x8192}" > "$out/ncu-issue.log" 2>&1 || true
            grep -E "^bytes:|mul_mat_zz_gemv_q4_K_direct|Duration|DRAM Throughput|Memory Throughput|L2 Cache Throughput|Issued Warp Per Scheduler|No Eligible|Active Warps Per Scheduler|Eligible Warps Per Scheduler|Warp Cycles Per Issued|Achieved Occupancy|Compute \(SM\) Throughput" \
                "$out/ncu-issue.log" | head -120
            ;;
        ncu-sparq)
            # the same view of the two SparQ kernels (single variant), S = 32k, Llama-3-8B shapes
            [ -x /tmp/sparq-test/t ] || { echo "no test binary (sparq-test step)"; exit 1; }
            timeout 240 ncu --kernel-name regex:sparq --launch-count 4 --section SpeedOfLight --section Occupancy \
                --section LaunchStats --section WarpStateStats --section SchedulerStats \
                /tmp/sparq-test/t bench --S 32768 --variant single --iters 2 > "$out/ncu-sparq.log" 2>&1 || true
            grep -E "sparq_|Duration|Memory Throughput|Achieved Occupancy|Registers Per|Stall|Warp Cycles Per Issued|Waves Per SM|Issued Warp|No Eligible" "$out/ncu-sparq.log" | head -80
            ;;
        sparq-ncu)
            # per-kernel device time of the SparQ op (step 1 scores, step 2 select + attend) at S 4k/16k/32k
            # (split variant: scores, seg_select, split_attend, split_combine; single: scores, attend)
            for v in 1 0; do
                echo "-- LLAMA_SPARSE_CUDA_SPARQ_SPLIT=$v"
                LLAMA_SPARSE_CUDA_SPARQ_SPLIT=$v ncu --kernel-name regex:sparq --launch-count 8 --metrics gpu__time_duration.sum \
                    /tmp/b-fork/bin/test-backend-ops perf -b CUDA0 -o SPARQ_ATTN > "$out/ncu-sparq-split$v.log" 2>&1 || true
                grep -E "sparq_|gpu__time_duration" "$out/ncu-sparq-split$v.log" | head -16
            done
            ;;
        sparq-diag)
            ( LLAMA_SPARQ=r=32,k=128,min_kv=0 /tmp/b-fork/bin/llama-bench -m "$r7b" -ngl 99 -fa 1 -p 0 -n 8 -d 4096 -r 1 -o md ) \
                > "$out/sparq-diag.log" 2>&1; echo "llama-bench with LLAMA_SPARQ at depth 4096: rc $?"
            grep -v "^ggml_backend_cuda_graph" "$out/sparq-diag.log" | tail -8
            ;;
        sparq-e2e)
            # decode at depth 16k / 32k, flash attention on, dense vs SparQ r 32 k 128 (the 7B-shaped model: MHA)
            for d in 16384 32768; do
                /tmp/b-fork/bin/llama-bench -m "$r7b" -ngl 99 -fa 1 -p 0 -n 32 -d $d -r 2 -o md 2>&1 | tee "$out/sparq-e2e-dense-$d.log" | grep -E "tg32"
                LLAMA_SPARQ=r=32,k=128,min_kv=0 /tmp/b-fork/bin/llama-bench -m "$r7b" -ngl 99 -fa 1 -p 0 -n 32 -d $d -r 2 -o md 2>&1 |
                    tee "$out/sparq-e2e-sparq-$d.log" | grep -E "tg32|error"
            done
            ;;
        perf)
            # MUL_MAT_ZZ with the ticket reduction and with memset + atomics, one line per case
            local tk
            for tk in 1 0; do
                LLAMA_SPARSE_CUDA_TICKET=$tk /tmp/b-fork/bin/test-backend-ops perf -b CUDA0 -o MUL_MAT_ZZ > "$out/perf-zz-ticket$tk.log" 2>&1 ||
                    { tail -20 "$out/perf-zz-ticket$tk.log"; exit 1; }
            done
            echo "MUL_MAT_ZZ us/run: ticket (LLAMA_SPARSE_CUDA_TICKET=1) | memset + atomics (=0)"
            paste -d'|' <(grep "us/run" "$out/perf-zz-ticket1.log" | sed -E 's/^ *([^:]*):.* ([0-9.]+) us\/run.*/\1 \2 /') \
                        <(grep "us/run" "$out/perf-zz-ticket0.log" | sed -E 's/.* ([0-9.]+) us\/run.*/ \1/') | head -60
            /tmp/b-fork/bin/test-backend-ops perf -b CUDA0 -o MUL_MAT -p "type_a=q4_K,type_b=f32,m=4096,n=1" 2>&1 | tail -8
            ;;
        zztest)
            WITH_GGML_CUDA=1 GGML_LIB_DIR=/tmp/b-fork/bin LLAMA_SPARSE_UPSTREAM=$fork GGML_INCLUDE=$fork/ggml/include \
                bash "$repo/cuda/tests/build.sh" /tmp/zz-test/t > "$out/build-zztest.log" 2>&1 ||
                { tail -40 "$out/build-zztest.log"; exit 1; }
            zz_src_stamp > /tmp/zz-test/stamp
            # twice in a row (fresh process, other seed): every case runs the four cross-block reductions, the ticket one
            # twice (bitwise equal), graph replays check that the ticket counters stay at zero
            /tmp/zz-test/t test 2>&1 | tee "$out/zztest.log" | tail -12
            if [ "${ZZTEST_RUNS:-4}" -gt 1 ]; then # (ZZTEST_RUNS=1: the first run only)
                /tmp/zz-test/t test --seed 2 2>&1 | tee "$out/zztest-seed2.log" | tail -12
                # the direct kernel's earlier step versions (kept for comparisons; version 2 is still the default at batch 2-8)
                LLAMA_SPARSE_CUDA_Q4K_V=1 /tmp/zz-test/t test --seed 3 2>&1 | tee "$out/zztest-v1.log" | tail -4
                LLAMA_SPARSE_CUDA_Q4K_V=2 /tmp/zz-test/t test --seed 4 2>&1 | tee "$out/zztest-v2.log" | tail -4
            fi
            ;;
        model)
            make_r7b 2>&1 | tr '\r' '\n' | tail -3
            ;;
        convert)
            convert_r7b 2>&1 | tr '\r' '\n' | tail -12
            ;;
        calib)
            # the random model's vocab is a dummy (<tN>, no byte tokens: llama.cpp's tokenizer throws on text),
            # so the calibration windows are seeded-random token ids (--random-tokens) instead of Austen text
            calib_r7b > "$out/calib.log" 2>&1 ||
                { tail -30 "$out/calib.log"; echo "calib failed"; }
            tail -14 "$out/calib.log"
            ;;
        thr)
            # levels without calibration (the Python model load segfaults in the background chain)
            thr_r7b
            ;;
        e2e)
            local lb=(-ngl 99 -p 512 -n 128 -r 5 -o md) lv
            echo "-- stock build, standard Q4_K"
            /tmp/b-stock/bin/llama-bench -m "$r7b" "${lb[@]}" 2>&1 | tee "$out/e2e-stock.log" | grep -E "^\|"
            [ -f "$zc7b" ] || { echo "no model with levels: fork dense only"; zc7b=$z7b; }
            for lv in ${E2E_LEVELS:-dense 0.25 0.40 0.50 0.65}; do
                [ $lv = dense ] || [ "$zc7b" != "$z7b" ] || continue
                echo "-- fork build, zigzag q4_k, level $lv (default: direct Q4_K kernel, fused index collection)"
                LLAMA_SPARSE=$lv /tmp/b-fork/bin/llama-bench -m "$zc7b" "${lb[@]}" 2>&1 | tee "$out/e2e-fork-$lv.log" | grep -E "^\||error|warn"
            done
            lb=(-ngl 99 -p 0 -n 128 -r 5 -o md)
            # tg128 t/s of one fork configuration: tg_of LEVEL [ENV=VALUE...]
            tg_of() {
                env LLAMA_SPARSE="$1" "${@:2}" /tmp/b-fork/bin/llama-bench -m "$zc7b" "${lb[@]}" 2>&1 | tg_col
            }
            local ab=${E2E_AB_ENV:-}
            if [ -n "$ab" ]; then
                echo "-- tg128 t/s, two rounds: default | $ab"
                for i in 1 2; do
                    for lv in ${E2E_AB_LEVELS:-0.50 0.65}; do
                        [ $lv = dense ] || [ "$zc7b" != "$z7b" ] || continue
                        echo "$lv: $(tg_of $lv) | $(tg_of $lv $ab)"
                    done
                done
            fi
            # the issue's context of 512: tg128 after 512 tokens already in the cache (llama-bench -d), stock first
            local d=${E2E_DEPTH:-512}
            if [ "$d" != 0 ]; then
                echo "-- tg128 at depth $d: stock$(for lv in ${E2E_DEPTH_LEVELS:-dense 0.50}; do echo -n " | $lv"; done)"
                local lb0=("${lb[@]}") row
                lb+=(-d "$d")
                row="$(/tmp/b-stock/bin/llama-bench -m "$r7b" "${lb[@]}" 2>&1 | tee "$out/e2e-d$d-stock.log" | tg_col)"
                for lv in ${E2E_DEPTH_LEVELS:-dense 0.50}; do
                    [ $lv = dense ] || [ "$zc7b" != "$z7b" ] || continue
                    row+=" | $(tg_of $lv)"
                done
                echo "$row"
                lb=("${lb0[@]}")
            fi
            echo "-- stock again (drift)"
            /tmp/b-stock/bin/llama-bench -m "$r7b" "${lb[@]}" 2>&1 | grep tg128
            ;;
        types-e2e)
            # zigzag Q8_0 / Q6_K / Q4_0 decode against stock on the same standard type (after build and stock-wait):
            # random Llama-2-7B shapes, $TYPES_LAYERS layers (default 8), all on the GPU; one level (0.50) calibrated
            # on random token ids; rounds alternating stock, fork dense, fork 0.50 (pp512 + tg128, llama-bench -r 3)
            local t std zz cal i lbt=(-ngl 99 -p 512 -n 128 -r 3 -o md) row ev evs lv
            # one llama-bench run (BIN, MODEL, ENV...) into the log; "pp512 t/s / tg128 t/s"
            types_lb() {
                local tmp=/tmp/types-lb.$$.txt # (per process: two chains on one machine clobbered a shared file)
                env "${@:3}" "$1" -m "$2" "${lbt[@]}" > "$tmp" 2>&1
                cat "$tmp" >> "$out/types-$t-lb.log"
                echo "$(lb_col pp512 < "$tmp") / $(tg_col < "$tmp")"
            }
            for t in ${TYPES_E2E:-q8_0 q6_k q4_0}; do
                std=$work/t7b.$t.gguf zz=$work/t7b.zz.$t.gguf cal=$work/t7b.zz.$t.cal.gguf
                echo "-- $t: model, convert, calibrate"
                { python3 "$repo/bench/make_random_gguf.py" --shape llama2-7b --type $t -o "$std" --layers "${TYPES_LAYERS:-8}" &&
                    python3 -m llama_sparse convert "$std" -o "$zz" --type $t -t "$jobs" &&
                    calib_random "$zz" "$cal" 0.5; } > "$out/types-$t.log" 2>&1 ||
                    { tr '\r' '\n' < "$out/types-$t.log" | tail -20; continue; }
                grep -E "zigzag:|standard:|achieved" "$out/types-$t.log"
                for i in $(seq 1 "${TYPES_ROUNDS:-2}"); do
                    row="$t round $i (pp512 / tg128 t/s):"
                    if [ "${TYPES_STOCK:-1}" != 0 ]; then # (TYPES_STOCK=0: no stock build in the chain)
                        row+=" stock $(types_lb /tmp/b-stock/bin/llama-bench "$std")"
                    fi
                    echo "$row"
                    # the fork under each launch setting of $TYPES_ENVS (',' between variables; "-": none)
                    for ev in ${TYPES_ENVS:--}; do
                        row="  fork ${ev}:" evs=${ev//,/ }
                        [ "$ev" != - ] || evs=
                        for lv in 0 0.50; do
                            row+=" | $lv $(types_lb /tmp/b-fork/bin/llama-bench "$cal" $evs LLAMA_SPARSE=$lv)"
                        done
                        echo "$row"
                    done
                done
                rm -f "$std" "$zz" "$cal"
            done
            ;;
        whatif)
            # upper bounds by leaving ops out of the decode graph (LLAMA_SPARSE_CUDA_WHATIF_SKIP, timing only: the
            # output is wrong). 7B-shaped zigzag (modelzz: thresholds, not calibrated), tg128, stock and the fork
            # dense / 0.50 with and without rope + set_rows, rms_norm + mul, flash attention; then the 8B-shaped
            # model at WHATIF_DEPTHS (default 32k): stock, dense, dense without flash attention, SparQ r 32 k 128,
            # SparQ without its op, SparQ with k above the context (upkeep only). Two rounds, alternating
            local lb=(-ngl 99 -p 0 -n 128 -r 3 -o md) i c
            local sk_rope=ROPE,SET_ROWS sk_norm=RMS_NORM,MUL sk_fa=FLASH_ATTN_EXT
            if [ -f "$zc7b" ]; then
                for i in 1 2; do
                    for c in "stock" "dense" "dense:$sk_rope,$sk_norm,$sk_fa" "0.50" "0.50:$sk_rope" "0.50:$sk_norm" \
                             "0.50:$sk_fa" "0.50:$sk_rope,$sk_norm,$sk_fa"; do
                        local lv=${c%%:*} sk= bin=/tmp/b-fork/bin/llama-bench m=$zc7b
                        [ "$c" = "$lv" ] || sk=${c#*:}
                        [ "$lv" = stock ] && { bin=/tmp/b-stock/bin/llama-bench; m=$r7b; }
                        echo "7b round $i $c: $(LLAMA_SPARSE=$lv LLAMA_SPARSE_CUDA_WHATIF_SKIP=$sk $bin -m "$m" "${lb[@]}" 2>&1 |
                            tee -a "$out/whatif7b.log" | grep -E "tg128|error" | awk -F'|' '{print $(NF-1)}')"
                    done
                done
            else
                echo "no 7B model with levels (modelzz-bg / modelzz-wait): 7B part left out"
            fi
            if [ -f "$r8b" ]; then
                SPARQ_E2E_DEPTHS=${WHATIF_DEPTHS:-32768} sparq8b_rounds whatif8b stock dense \
                    "dense-nofa:LLAMA_SPARSE_CUDA_WHATIF_SKIP=$sk_fa" "sparq:LLAMA_SPARQ=r=32,k=128,min_kv=0" \
                    "sparq-noop:LLAMA_SPARQ=r=32,k=128,min_kv=0 LLAMA_SPARSE_CUDA_WHATIF_SKIP=SPARQ_ATTN" \
                    "upkeep:LLAMA_SPARQ=r=32,k=1000000"
                grep -h -m1 "WHATIF" "$out"/whatif8b-*.log | head -2 || true
            fi
            ;;
        fuse-check)
            # decode logits with the fused SwiGLU / residual adds (default) against LLAMA_SPARSE_CUDA_FUSE_OPS=0, dense
            # and at 0.50, on the calibrated 7B-shaped model; at 0.50 also off against off (the reductions' own spread).
            # FUSE_CHECK_ENV (e.g. LLAMA_SPARSE_CUDA_TICKET=1: deterministic reductions) applies to every run;
            # FUSE_CHECK_OFF picks what "not fused" means (default LLAMA_SPARSE_CUDA_FUSE_OPS=0)
            local off=${FUSE_CHECK_OFF:-LLAMA_SPARSE_CUDA_FUSE_OPS=0}
            echo "not fused: $off"
            [ -f "$zc7b" ] || { echo "no model with levels"; exit 1; }
            local lv rc=0 fenv=(${FUSE_CHECK_ENV:-})
            # (FUSE_CHECK_ENV applies to this step's runs only: exported, it used to reach the steps after it)
            [ ${#fenv[@]} = 0 ] || echo "with ${fenv[*]}"
            # FUSE_CHECK_FA=1: flash attention on in every run (e.g. for LLAMA_SPARSE_CUDA_ATTN_FUSE; fa-check compares
            # the attention paths against llama's attention without it)
            local fa=()
            [ "${FUSE_CHECK_FA:-0}" = 1 ] && fa=(--flash-attn)
            for lv in dense 0.50; do
                local lvl=(); [ $lv = dense ] || lvl=(--level $lv)
                env "${fenv[@]}" python3 "$repo/bench/decode_logits.py" save "$zc7b" "$work/logits-$lv-on.npy" "${lvl[@]}" "${fa[@]}" --verbose > "$out/fuse-check-$lv.log" 2>&1 &&
                env "${fenv[@]}" $off python3 "$repo/bench/decode_logits.py" save "$zc7b" "$work/logits-$lv-off.npy" "${lvl[@]}" "${fa[@]}" \
                    >> "$out/fuse-check-$lv.log" 2>&1 || { rc=1; tail -5 "$out/fuse-check-$lv.log"; continue; }
                echo "$lv, fused against not: $(python3 "$repo/bench/decode_logits.py" compare "$work/logits-$lv-off.npy" "$work/logits-$lv-on.npy" || true)"
            done
            if env "${fenv[@]}" $off python3 "$repo/bench/decode_logits.py" save "$zc7b" "$work/logits-0.50-off2.npy" --level 0.50 "${fa[@]}" \
                    >> "$out/fuse-check-0.50.log" 2>&1; then
                echo "0.50, not fused twice: $(python3 "$repo/bench/decode_logits.py" compare "$work/logits-0.50-off.npy" "$work/logits-0.50-off2.npy" || true)"
            fi
            echo "fusions in the fused runs: $(grep -h -o -E "llama-sparse: CUDA (fuses|runs the RoPE|runs one-token|folds)" "$out"/fuse-check-*.log | sort -u | tr '\n' ';')"
            [ $rc = 0 ]
            ;;
        offload-check)
            # partial offload: OFFLOAD_NGL (default 16) of the 32 layers on the GPU, the rest on the host CPU. Decode
            # logits (bench/decode_logits.py: 64 prompt tokens, 16 decode steps) at -ngl 99, N and 0 of the standard
            # file (stock's kernels inside the fork: how far CPU and GPU arithmetic alone move this random model's
            # logits) and of the zigzag one, dense and at 0.50, each against -ngl 99 of the same file and level; then
            # tg32 at -ngl N (or each of OFFLOAD_BENCH_NGL) of stock and the fork (dense, 0.50) in OFFLOAD_ROUNDS (2)
            # alternating rounds. OFFLOAD_CPU= (empty) skips the -ngl 0 runs, OFFLOAD_LOGITS=0 every logits run
            [ -f "$zc7b" ] || { echo "no model with levels (modelzz-bg / modelzz-wait)"; exit 1; }
            local ngl=${OFFLOAD_NGL:-16} spec tag m lv g i la sq
            # TAG:MODEL:LEVEL -> tag, m, lv, la (decode_logits' level flags), sq (the run's environment: zzsq SparQ
            # with k below the 80 positions, so that it selects, on CPU and GPU layers alike; sparq k 128)
            offload_spec() {
                tag=${1%%:*}; lv=${1##*:}; m=${1#*:}; m=${m%:*}
                la=(); [ "$lv" = dense ] || la=(--level "$lv")
                case $tag in zzsq) sq=(LLAMA_SPARQ=r=16,k=16,min_kv=0) ;; sparq) sq=(LLAMA_SPARQ=r=32,k=128,min_kv=0) ;; *) sq=() ;; esac
            }
            local specs=("std:$r7b:dense" "zz:$zc7b:dense" "zz:$zc7b:0.50" "zzsq:$zc7b:0.50")
            [ "${OFFLOAD_LOGITS:-1}" = 1 ] || specs=()
            for spec in "${specs[@]}"; do
                offload_spec "$spec"
                for g in 99 "$ngl" ${OFFLOAD_CPU-0}; do
                    env "${sq[@]}" python3 "$repo/bench/decode_logits.py" save "$m" "$work/logits-off-$tag-$lv-$g.npy" --ngl "$g" "${la[@]}" \
                        >> "$out/offload-check.log" 2>&1 || { echo "$tag $lv ngl $g: failed"; tail -5 "$out/offload-check.log"; continue; }
                    echo "$tag $lv ngl $g: $(grep "saved" "$out/offload-check.log" | tail -1 | sed 's/.*logits, //')"
                done
                for g in "$ngl" ${OFFLOAD_CPU-0}; do
                    [ -f "$work/logits-off-$tag-$lv-$g.npy" ] || continue
                    echo "$tag $lv, ngl $g against 99: $(python3 "$repo/bench/decode_logits.py" compare \
                        "$work/logits-off-$tag-$lv-99.npy" "$work/logits-off-$tag-$lv-$g.npy" || true)"
                done
            done
            # tensor parallelism (-sm tensor: upstream's meta device, here over the one GPU; it needs flash attention,
            # which llama_cpp.Llama turns off unless asked, so the comparison with -sm layer includes that change):
            # the standard file (works), the zigzag one and SparQ on the standard one (both refused with a message)
            specs=("std:$r7b:dense" "zz:$zc7b:0.50" "sparq:$r7b:dense")
            [ "${OFFLOAD_LOGITS:-1}" = 1 ] || specs=()
            for spec in "${specs[@]}"; do
                offload_spec "$spec"
                echo "== $tag $lv" >> "$out/offload-check-smt.log"
                if env "${sq[@]}" python3 "$repo/bench/decode_logits.py" save "$m" "$work/logits-off-$tag-$lv-smt.npy" --split-mode 3 \
                        --flash-attn "${la[@]}" >> "$out/offload-check-smt.log" 2>&1; then
                    echo "$tag $lv -sm tensor against -sm layer: $(python3 "$repo/bench/decode_logits.py" compare \
                        "$work/logits-off-$tag-$lv-99.npy" "$work/logits-off-$tag-$lv-smt.npy" || true)"
                else
                    echo "$tag $lv -sm tensor: failed"; sed -n "/^== $tag $lv/,\$p" "$out/offload-check-smt.log" |
                        grep -iE "error|abort|llama-sparse" | tail -4
                fi
            done
            for i in $(seq 1 "${OFFLOAD_ROUNDS:-2}"); do
                for g in ${OFFLOAD_BENCH_NGL:-$ngl}; do
                    for c in stock dense 0.50; do
                        local bin=/tmp/b-fork/bin/llama-bench m=$zc7b
                        [ "$c" = stock ] && { bin=/tmp/b-stock/bin/llama-bench; m=$r7b; }
                        echo "round $i ngl $g $c: $(env LLAMA_SPARSE=$c $bin -m "$m" -ngl "$g" -p 0 -n 32 -r 3 -o md 2>&1 |
                            tee -a "$out/offload-bench-$c.log" | grep -E "tg32|error" | awk -F'|' '{printf "%s ", $(NF-1)}')"
                    done
                done
            done
            ;;
        fa-check)
            # decode logits of the 7B-shaped model, deterministic reductions: every attention path with flash attention
            # on against llama's attention without it (the reference). Rounding and f16 scores alone move this model's
            # logits ~0.1-0.2 of the largest (bench/results/cuda_h100_2026-11-27f.md); a wrong path ~1.
            # FA_CHECK_ENVS: the paths, ',' for spaces inside one; FA_CHECK_RUNS: LEVEL:PROMPT pairs (prompt tokens
            # before the 16 decode steps; above 2048 positions attn-decode.cu declines)
            [ -f "$zc7b" ] || { echo "no model with levels"; exit 1; }
            local ref=$work/logits-fa-ref.npy v run lv np
            for run in ${FA_CHECK_RUNS:-dense:64}; do
                lv=${run%%:*}; np=${run#*:}
                local la=(--prompt "$np")
                [ "$lv" = dense ] || la+=(--level "$lv")
                echo "-- level $lv, $np prompt tokens"
                LLAMA_SPARSE_CUDA_TICKET=1 python3 "$repo/bench/decode_logits.py" save "$zc7b" "$ref" "${la[@]}" \
                    > "$out/fa-check-ref-$lv-$np.log" 2>&1 || { tail -5 "$out/fa-check-ref-$lv-$np.log"; exit 1; }
                for v in ${FA_CHECK_ENVS:-LLAMA_SPARSE_CUDA_ROPE_FUSE=0 LLAMA_SPARSE_CUDA_ATTN_FUSE=0 LLAMA_SPARSE_CUDA_ATTN_FUSE=1 \
                        LLAMA_SPARSE_CUDA_ATTN_FUSE=2 LLAMA_SPARSE_CUDA_ATTN_FUSE=2,LLAMA_SPARSE_CUDA_ATTN_V=6}; do
                    local lg="$out/fa-check-$lv-$np-${v//[^A-Za-z0-9_-]/_}.log"
                    env LLAMA_SPARSE_CUDA_TICKET=1 ${v//,/ } python3 "$repo/bench/decode_logits.py" save "$zc7b" \
                        "$work/logits-fa.npy" "${la[@]}" --flash-attn --verbose > "$lg" 2>&1 ||
                        { echo "$v: run failed"; tail -3 "$lg"; continue; }
                    echo "$v, flash attention against none: $(python3 "$repo/bench/decode_logits.py" compare "$ref" "$work/logits-fa.npy" || true)"
                    grep -h -o -E "llama-sparse: CUDA (runs the RoPE|runs one-token)[^(]*" "$lg" | sort -u || true
                done
            done
            ;;
        e2e-prof)
            # device time per decode token by kernel (ncu, one metric; kernels serialized, so no overlap or gaps):
            # stock Q4_K against the fork dense and at E2E_PROF_LEVELS; 1 warm-up + 4 timed tokens each
            local lb=(-ngl 99 -p 0 -n 4 -r 1) lv
            [ -f "$zc7b" ] || { echo "no model with levels"; exit 1; }
            timeout 400 ncu --csv --print-units base --metrics gpu__time_duration.sum --log-file "$out/prof-stock.csv" \
                /tmp/b-stock/bin/llama-bench -m "$r7b" "${lb[@]}" > "$out/prof-stock.log" 2>&1 || echo "stock ncu rc $?"
            for lv in ${E2E_PROF_LEVELS:-dense 0.50}; do
                LLAMA_SPARSE=$lv timeout 400 ncu --csv --print-units base --metrics gpu__time_duration.sum --log-file "$out/prof-$lv.csv" \
                    /tmp/b-fork/bin/llama-bench -m "$zc7b" "${lb[@]}" > "$out/prof-$lv.log" 2>&1 || echo "$lv ncu rc $?"
            done
            for f in stock ${E2E_PROF_LEVELS:-dense 0.50}; do
                python3 "$repo/bench/ncu_decode_split.py" "$out/prof-$f.csv" --tokens 5 --label "$f" || true
            done
            ;;
        e2e-variants)
            # older paths, for comparison: LIST op + direct IDX GEMV (FUSE=0); staged kernel (DIRECT=0, FUSE=0)
            local lb=(-ngl 99 -p 0 -n 128 -r 5 -o md) lv
            [ -f "$zc7b" ] || { echo "no model with levels"; exit 1; }
            LLAMA_SPARSE=0.50 LLAMA_SPARSE_CUDA_FUSE=0 /tmp/b-fork/bin/llama-bench -m "$zc7b" "${lb[@]}" 2>&1 | grep tg128 | sed "s/^/list+idx 0.50 /"
            for lv in dense 0.50; do
                LLAMA_SPARSE=$lv LLAMA_SPARSE_CUDA_DIRECT=0 LLAMA_SPARSE_CUDA_FUSE=0 /tmp/b-fork/bin/llama-bench -m "$zc7b" "${lb[@]}" 2>&1 |
                    grep tg128 | sed "s/^/staged $lv /"
            done
            ;;
        cmd:*)
            local c=${step#cmd:}
            ( cd "$repo" && bash -c "${c//,/ }" )
            ;;
        *)
            echo "unknown step $step"; exit 2;;
        esac
        echo "== step $step took $(( $(date +%s) - t0 )) s"
    done
}

remote_bg() {
    mkdir -p /tmp/ls-out
    rm -f /tmp/ls-out/done
    setsid nohup bash -c "OUT=/tmp/ls-out bash '$repo/tools/device/device.sh' remote $*; echo \$? > /tmp/ls-out/done" \
        > /tmp/ls-out/bg.log 2>&1 < /dev/null &
    echo "started in the background: $*"
}

poll() {   # wait up to $1 s for remote-bg, then copy its logs to $OUT
    local t=${1:-230} s=$SECONDS
    if [ ! -d /tmp/ls-out ]; then   # a bare machine (the one that ran remote-bg went back): nothing to wait for
        echo "== no background run on this machine (it is a fresh one: the earlier one went back)"
        return 3
    fi
    while [ ! -f /tmp/ls-out/done ] && [ $(( SECONDS - s )) -lt "$t" ]; do sleep 5; done
    if [ -n "${OUT:-}" ]; then
        tar -C /tmp/ls-out -czf "$OUT/logs.tar.gz" . 2>/dev/null || true
        cp /tmp/ls-out/device.log "$OUT/" 2>/dev/null || true
    fi
    tail -c 9000 /tmp/ls-out/device.log 2>/dev/null
    if [ -f /tmp/ls-out/done ]; then echo "== background finished, rc $(cat /tmp/ls-out/done)"; else echo "== still running"; fi
}

case "$mode" in
    pack) pack "$@" ;;
    remote) remote "$@" ;;
    remote-bg) remote_bg "$@" ;;
    poll) poll "$@" ;;
    *) sed -n '2,14p' "$0"; exit 2 ;;
esac
