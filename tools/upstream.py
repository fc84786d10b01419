#!/usr/bin/env python3
"""Fetch, verify and patch pinned upstream llama.cpp; see python/llama_sparse/_upstream.py."""
import importlib.util
import sys
from pathlib import Path

_path = Path(__file__).resolve().parents[1] / "python" / "llama_sparse" / "_upstream.py"
_spec = importlib.util.spec_from_file_location("llama_sparse_upstream", _path)
_mod = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_mod)

if __name__ == "__main__":
    sys.exit(_mod.main())
