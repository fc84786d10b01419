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
        print(__doc__.strip(), file=sys.stdout if argv else sys.stderr)
        print(f"\ninstalled in {bin_dir()}", file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    try:
        path = tool_path(argv[0])
    except FileNotFoundError as e:
        known = argv[0].removeprefix("llama-") in TOOLS + ("test-backend-ops",)
        print(f"error: {e}" if known else f"error: no tool {argv[0]!r}; the tools are {', '.join(TOOLS)} and "
              "test-backend-ops (python -m llama_sparse.tools --help)", file=sys.stderr)
        return 2
    os.execv(str(path), [str(path), *argv[1:]])
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main())
