# llama-sparse: sourced by the tests/c scripts: compiles one standalone C test against the stock ggml-base.
# env: CC_TEST_FLAGS (extra compiler flags), LLAMA_SPARSE_UPSTREAM (patched tree, default: tools/upstream.py fork),
#      LLAMA_SPARSE_STOCK_BIN (default ~/.cache/llama-sparse/stock-build/bin), CC (default gcc)
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
up="${LLAMA_SPARSE_UPSTREAM:-$(python3 "$root/tools/upstream.py" fork)}"
bin="${LLAMA_SPARSE_STOCK_BIN:-$HOME/.cache/llama-sparse/stock-build/bin}"
out="${TMPDIR:-/tmp}/llama-sparse-test-c"
mkdir -p "$out"

# cc_test NAME SOURCE...: builds $out/NAME; ggml_barrier is the test shim's (tests/c/zz_test_threads.h)
cc_test() {
    local name=$1; shift
    "${CC:-gcc}" -std=c11 -O2 -march=native -g -Wall -Wno-unused-function -D_GNU_SOURCE \
        -Dggml_barrier=zz_test_barrier ${CC_TEST_FLAGS:-} \
        -I"$root/ggml-sparse" -I"$root/tests/c" \
        -I"$up/ggml/include" -I"$up/ggml/src" -I"$up/ggml/src/ggml-cpu" \
        "$@" \
        -L"$bin" -Wl,-rpath,"$bin" -lggml-base -lpthread -lm \
        -o "$out/$name"
}
