"""Locate and load the native ggml/llama libraries that llama_sparse binds with ctypes.

The installed wheel bundles them in ``llama_sparse/lib``; developers point ``LLAMA_SPARSE_LIB_DIR``
at a build's ``bin`` (or ``lib``) directory instead.
"""
from __future__ import annotations

import ctypes
import functools
import os
import sys
from pathlib import Path

LIB_DIR_ENV = "LLAMA_SPARSE_LIB_DIR"


class LibraryNotFoundError(RuntimeError):
    """The native libraries could not be located."""


def _shared_lib_name(stem: str) -> str:
    if sys.platform == "win32":
        return f"{stem}.dll"
    if sys.platform == "darwin":
        return f"lib{stem}.dylib"
    return f"lib{stem}.so"


def lib_dir() -> Path:
    """Directory holding libggml-base / libggml / libllama: $LLAMA_SPARSE_LIB_DIR, else the bundled lib/."""
    env = os.environ.get(LIB_DIR_ENV)
    if env:
        path = Path(env).expanduser()
        if not (path / _shared_lib_name("ggml-base")).exists():
            raise LibraryNotFoundError(
                f"{LIB_DIR_ENV}={env} does not contain {_shared_lib_name('ggml-base')}; "
                f"point it at the bin/ directory of a llama.cpp build, or unset it to use the bundled libraries"
            )
        return path
    path = Path(__file__).resolve().parent / "lib"
    if not (path / _shared_lib_name("ggml-base")).exists():
        raise LibraryNotFoundError(
            f"the native libraries are not bundled in {path} (no {_shared_lib_name('ggml-base')}); "
            f"reinstall the llama-sparse wheel, or set {LIB_DIR_ENV} to the bin/ directory of a build"
        )
    return path


@functools.cache
def share_cxx_runtime() -> None:
    """Put libstdc++ in the global symbol scope before libllama loads (Linux).

    numpy 2.5 (seen in a torch venv, Python 3.12) loads libstdc++ privately; libllama loaded after it, ours or
    stock, then segfaulted in llama_model_load_from_file (print_info). Loading it again RTLD_GLOBAL fixed that,
    also after numpy (bench/results/cuda_h200_2026-11-28b.md).
    """
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libstdc++.so.6", mode=ctypes.RTLD_GLOBAL)
        except OSError:
            pass  # a static or absent runtime: nothing to share


def _load(stem: str) -> ctypes.CDLL:
    share_cxx_runtime()
    path = lib_dir() / _shared_lib_name(stem)
    try:
        return ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
    except OSError as exc:
        raise LibraryNotFoundError(f"could not load {path}: {exc}; rebuild the native libraries") from exc


@functools.cache
def load_ggml() -> ctypes.CDLL:
    """The ggml-base library (quantization, type traits), loaded once with RTLD_GLOBAL."""
    return _load("ggml-base")
