#!/usr/bin/env bash
# llama-sparse: compile the ggml-metal side of our Metal support with -fsyntax-only on Linux (no Apple SDK):
# metal/ggml-sparse-metal.cpp and the two patched C++ files of ggml-metal that call it (ggml-metal-ops.cpp,
# ggml-metal.cpp) against the patched tree's real headers (plain C/C++), and metal/ggml-sparse-metal.h as C
# and Objective-C. ggml-metal-device.m (the supports_op hook and the library list) needs Foundation and
# Metal, so it is not compiled here; see docs/metal.md.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
up="${LLAMA_SPARSE_UPSTREAM:-$(python3 "$root/tools/upstream.py" fork)}"
cxx="${CXX:-clang++}"
case "$cxx" in *clang*) ;; *) cxx=clang++;; esac
mdir="$up/ggml/src/ggml-metal"
inc=(-I"$root/metal" -I"$root/ggml-sparse" -I"$up/ggml/include" -I"$up/ggml/src" -I"$mdir")
flags=(-fsyntax-only -Wall -Wno-unused-function -Werror=implicit-function-declaration)

grep -q "ggml_metal_sparse_encode" "$mdir/ggml-metal-ops.cpp" && grep -q "case GGML_OP_SPARQ_ATTN:" "$mdir/ggml-metal-ops.cpp" || { echo "check_hooks: patches 0010/0011 are not in $up" >&2; exit 1; }

"$cxx" -std=c++17 "${flags[@]}" -Wextra "${inc[@]}" "$root/metal/ggml-sparse-metal.cpp"
# upstream relies on <memory> arriving through Apple's headers
"$cxx" -std=c++17 "${flags[@]}" -w -include memory "${inc[@]}" "$mdir/ggml-metal-ops.cpp"
"$cxx" -std=c++17 "${flags[@]}" -w -include memory "${inc[@]}" "$mdir/ggml-metal.cpp"
echo '#include "ggml-sparse-metal.h"' | "${cxx%++}" -x c -std=c11 "${flags[@]}" "${inc[@]}" -
echo '#import "ggml-sparse-metal.h"' | "${cxx%++}" -x objective-c "${flags[@]}" "${inc[@]}" -
echo "hooks: ggml-sparse-metal.cpp, ggml-metal-ops.cpp, ggml-metal.cpp, ggml-sparse-metal.h (C, Objective-C) ok"
