"""Tune the CUDA zigzag GEMV's launch configs for one model's weights on this machine's GPU.

The library reads the result at its first zigzag matmul: $LLAMA_SPARSE_CUDA_TUNE_FILE, else
~/.cache/llama-sparse/cuda-tune.txt. Entries are per device and shape class, so one file serves several models
and GPUs; a class the tune did not measure keeps the built-in table or the heuristic (cuda/README.md).
"""
from __future__ import annotations

import argparse
import ctypes
import os
import sys
from pathlib import Path

from . import _lib, zigzag

TUNE_FILE_ENV = "LLAMA_SPARSE_CUDA_TUNE_FILE"


def default_tune_path() -> Path:
    """Where the CUDA backend looks for tuned configs (the same rule as cuda/mul-mat-zz.cu's zz_tune_path)."""
    env = os.environ.get(TUNE_FILE_ENV)
    if env:
        return Path(env).expanduser()
    return Path(os.environ.get("HOME", ".")) / ".cache" / "llama-sparse" / "cuda-tune.txt"


def model_gemv_shapes(path: Path) -> list[tuple[int, int, int]]:
    """The distinct (m, n, ggml type) of the GEMVs decode runs on a zigzag GGUF: each zigzag weight, and the
    sibling groups the CUDA backend runs as one launch with the rows summed (q/k/v, gate/up of a layer: Q4_K
    weights of the same width reading the same input; cuda/README.md, "Sibling groups")."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"model file not found: {path}")
    reader = zigzag.open_gguf(path, bad_magic_hint="pass a zigzag .gguf made by `llama-sparse convert`")
    blocks = zigzag.read_zigzag_info(reader)
    if not blocks:
        raise ValueError(f"{path} is not a zigzag GGUF (no {zigzag.KEY_ZIGZAG_TENSORS}): convert it first")
    shapes = set()
    siblings: dict[tuple[int, int, int, int], list[int]] = {}  # (layer, group, n, type) -> rows of each weight
    for t in reader.tensors:
        if t.name in blocks:
            m, n = zigzag.zigzag_dequantize_ne([int(x) for x in t.shape[:2]], blocks[t.name])
            shapes.add((m, n, int(t.tensor_type)))
            lg = zigzag.projection_group(t.name)
            if lg is not None and lg[1] in (zigzag.GROUP_QKV, zigzag.GROUP_GATE_UP) and t.tensor_type == zigzag.Q.Q4_K:
                siblings.setdefault((*lg, n, int(t.tensor_type)), []).append(m)
    if not shapes:
        raise ValueError(f"{path} lists zigzag tensors that it does not hold")
    for (_, _, n, typ), rows in siblings.items():
        if len(rows) > 1:
            shapes.add((sum(rows), n, typ))
    return sorted(shapes)


def load_cuda_backend() -> ctypes.CDLL:
    """libggml-cuda of the build the package runs on, with llama_sparse_cuda_autotune."""
    lib_dir = _lib.lib_dir()
    path = lib_dir / _lib._shared_lib_name("ggml-cuda")
    if not path.exists():
        raise RuntimeError(f"this build has no CUDA backend ({path.name} is not in {lib_dir}): "
                           "rebuild with CMAKE_ARGS=-DGGML_CUDA=ON (tools/setup.sh)")
    _lib.load_ggml()
    lib = _lib._load("ggml-cuda")
    try:
        fn = lib.llama_sparse_cuda_autotune
    except AttributeError as exc:
        raise RuntimeError(f"{path} has no llama_sparse_cuda_autotune: it is not a llama-sparse build") from exc
    fn.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_int32), ctypes.c_int,
                   ctypes.c_int, ctypes.c_float, ctypes.c_char_p]
    fn.restype = ctypes.c_int
    return lib


def tune(model: Path, out: Path | None = None, device: int = 0, max_batch: int = 8, sparsity: float = 0.5) -> int:
    """Time launch configs for the model's GEMVs on CUDA device `device`; returns the entries written."""
    if not 1 <= max_batch <= 8:
        raise ValueError(f"max batch {max_batch}: want 1 to 8 (the sparse decode's batches)")
    if not 0.0 < sparsity < 1.0:
        raise ValueError(f"sparsity {sparsity}: want 0 < s < 1")
    shapes = model_gemv_shapes(model)
    lib = load_cuda_backend()
    out = Path(out) if out is not None else default_tune_path()
    out.parent.mkdir(parents=True, exist_ok=True)
    mn = (ctypes.c_int64 * (2 * len(shapes)))(*[v for m, n, _ in shapes for v in (m, n)])
    types = (ctypes.c_int32 * len(shapes))(*[t for _, _, t in shapes])
    print(f"tuning {len(shapes)} GEMV shape(s) of {Path(model).name} on CUDA device {device}, batches 1-{max_batch}, "
          f"sparsity {sparsity:g} (progress from the backend below) ...", file=sys.stderr, flush=True)
    n = lib.llama_sparse_cuda_autotune(device, mn, types, len(shapes), max_batch, sparsity, str(out).encode())
    if n < 0:
        raise RuntimeError("the CUDA autotune failed (its message is above)")
    print(f"wrote {n} entr{'y' if n == 1 else 'ies'} for this device to {out}", flush=True)
    return n


def add_cuda_tune_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", type=Path, help="zigzag GGUF whose GEMV shapes are timed")
    p.add_argument("-o", "--out", type=Path, default=None,
                   help=f"tune file (default ${TUNE_FILE_ENV} or ~/.cache/llama-sparse/cuda-tune.txt, which the "
                        "library reads)")
    p.add_argument("--device", type=int, default=0, help="CUDA device index (default 0)")
    p.add_argument("--max-batch", type=int, default=8, help="times batches 1, 2, 4, 8 up to this (default 8); larger ones keep the heuristic")
    p.add_argument("--sparsity", type=float, default=0.5, help="sparsity the sparse GEMV is timed at (default 0.5)")


def run_cuda_tune(args: argparse.Namespace) -> int:
    tune(args.model, out=args.out, device=args.device, max_batch=args.max_batch, sparsity=args.sparsity)
    return 0
