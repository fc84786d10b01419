#!/usr/bin/env bash
# Build, test and bench the CUDA fork on a GPU machine with no network.
#
# Here:   tools/device/device.sh pack          packs .device/src.tar.xz (< 64 MiB): the patched upstream
#                                               tree, pruned, plus our sources; carry .device to the device
# There:  bash tools/device/device.sh remote STEP...   (from the repo root of the carried working tree)
#   build      CUDA fork (sm_90): libllama, libggml*, test-backend-ops, llama-bench
#   stock      unpatched build of the same commit (patches reversed), llama-bench + test-backend-ops
#   ops        test-backend-ops -o MUL_MAT_ZZ / SPARSE_IDX on CUDA against the CPU
#   perf       test-backend-ops perf for the zigzag and stock Q4_K matmuls
#   cmd:ARGS   any command after the builds (ARGS with ',' for spaces), e.g. cmd:cuda/tests/run.sh
# Logs and results go to $OUT (the device tool returns them).
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
mode=${1:-}; shift || true

pack() {
    local fork out=$repo/.device
    fork=$(python3 "$repo/tools/upstream.py" fork)
    mkdir -p "$out"
    grep -qx '/.device/' "$repo/.git/info/exclude" 2>/dev/null || echo '/.device/' >> "$repo/.git/info/exclude"
    # tests/ of upstream stays: test-backend-ops lives there; the rest is pruned by tools/upstream.py
    tar -C "$(dirname "$fork")" -cf - --exclude='*.gguf' --exclude='gguf-py' --exclude='conversion' \
        --exclude='*.py' --transform "s,^$(basename "$fork"),fork," "$(basename "$fork")" | xz -T2 -6 > "$out/src.tar.xz"
    ls -la "$out"
}

remote() {
    local out=${OUT:-/tmp/out} jobs fork=/tmp/ls-fork stock=/tmp/ls-stock
    mkdir -p "$out"
    jobs=$(nproc)
    exec > >(tee -a "$out/device.log") 2>&1
    echo "== $(date -u) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null)"
    if [ ! -d $fork ]; then
        mkdir -p /tmp/unpack && tar -C /tmp/unpack -xJf "$repo/.device/src.tar.xz" && mv /tmp/unpack/fork $fork
    fi
    for step in "$@"; do
        local t0=$(date +%s)
        echo "== step $step"
        case "$step" in
        build)
            cmake -S "$repo" -B /tmp/b-fork -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
                -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_SPARSE_UPSTREAM_DIR=$fork -DGGML_NATIVE=ON > "$out/cmake-fork.log"
            cmake --build /tmp/b-fork -j "$jobs" --target llama ggml test-backend-ops llama-bench > "$out/build-fork.log" 2>&1 ||
                { grep -E -B3 -A12 "error|Error" "$out/build-fork.log" | head -80; exit 1; }
            tail -2 "$out/build-fork.log"
            ;;
        stock)
            if [ ! -d $stock ]; then
                cp -a $fork $stock
                for p in $(ls -r "$repo"/patches/*.patch); do patch -p1 -R -s -d $stock -i "$p"; done
            fi
            cmake -S $stock -B /tmp/b-stock -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
                -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_SERVER=OFF \
                -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF -DGGML_NATIVE=ON > "$out/cmake-stock.log"
            cmake --build /tmp/b-stock -j "$jobs" --target llama ggml test-backend-ops llama-bench > "$out/build-stock.log" 2>&1 ||
                { grep -E -B3 -A12 "error|Error" "$out/build-stock.log" | head -80; exit 1; }
            tail -2 "$out/build-stock.log"
            ;;
        ops)
            /tmp/b-fork/bin/test-backend-ops -b CUDA0 -o MUL_MAT_ZZ 2>&1 | tee "$out/test-backend-ops-zz.log" | tail -15
            /tmp/b-fork/bin/test-backend-ops -b CUDA0 -o SPARSE_IDX 2>&1 | tail -5
            ;;
        perf)
            /tmp/b-fork/bin/test-backend-ops perf -b CUDA0 -o MUL_MAT_ZZ 2>&1 | tee "$out/perf-zz.log" | grep -E "MUL_MAT|us/run" | head -60
            /tmp/b-fork/bin/test-backend-ops perf -b CUDA0 -o MUL_MAT -p "type_a=q4_K,type_b=f32,m=4096,n=1" 2>&1 | tail -8
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

case "$mode" in
    pack) pack ;;
    remote) remote "$@" ;;
    *) sed -n '2,14p' "$0"; exit 2 ;;
esac
