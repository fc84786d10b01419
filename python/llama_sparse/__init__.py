"""llama-sparse: llama.cpp with TEAL activation sparsity on zigzag weights.

Importing this package points llama-cpp-python at the fork's libllama (LLAMA_CPP_LIB_PATH)
before llama_cpp loads, so `llama_cpp` and `llama_sparse` share one native library.
"""
from __future__ import annotations

import os
import sys

from ._lib import lib_dir, share_cxx_runtime

__version__ = "0.1.0"


def _point_llama_cpp_at_fork() -> None:
    ours = str(lib_dir())
    loaded = sys.modules.get("llama_cpp.llama_cpp")
    if loaded is not None:
        path = getattr(getattr(loaded, "_lib", None), "_name", "")
        if not os.path.realpath(path).startswith(os.path.realpath(ours)):
            raise ImportError(
                f"llama_cpp was imported before llama_sparse and loaded {path}; "
                "import llama_sparse first so llama-cpp-python runs on the fork's library")
        return
    os.environ["LLAMA_CPP_LIB_PATH"] = ours


_point_llama_cpp_at_fork()
share_cxx_runtime()  # before llama_cpp loads libllama

__all__ = ["Llama", "SparQ", "lib_dir", "__version__"]


def __getattr__(name: str):
    # heavy modules load on first use (llama_cpp loads libllama: a tool that only quantizes through libggml-base,
    # bench/make_random_gguf.py, runs where libllama is not built yet)
    if name in ("Llama", "SparQ"):
        from . import llama
        return getattr(llama, name)
    if name == "convert":
        from .convert import convert
        return convert
    if name == "calibrate":
        from .calibrate import calibrate
        return calibrate
    raise AttributeError(name)
