"""Run the fork's bundled llama.cpp tools: `python -m llama_sparse.tools NAME [ARGS...]`.

NAME is one of cli, completion, bench, perplexity, quantize, test-backend-ops
(or the full binary name, e.g. llama-bench).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

TOOLS = ("cli", "completion", "bench", "perplexity", "quantize")


def bin_dir() -> Path:
    from ._lib import lib_dir
    return lib_dir().parent / "bin"


def tool_path(name: str) -> Path:
    from ._lib import lib_dir
    exe = name if name.startswith(("llama-", "test-")) else f"llama-{name}"
    path = bin_dir() / exe
    if not path.exists() and (lib_dir() / exe).exists():  # a build tree keeps tools beside the libraries
        path = lib_dir() / exe
    if not path.exists():
        have = sorted(p.name for p in bin_dir().glob("*")) if bin_dir().exists() else []
        raise FileNotFoundError(
            f"{exe} is not in {bin_dir()} (have: {', '.join(have) or 'nothing'}); "
            "rebuild with `pip install .` and LLAMA_SPARSE_TOOLS=ON")
    return path


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        print(f"\ninstalled in {bin_dir()}")
        return 0
    path = tool_path(argv[0])
    os.execv(str(path), [str(path), *argv[1:]])
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main())
