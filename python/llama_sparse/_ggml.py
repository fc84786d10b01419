"""ctypes bindings to ggml's quantization entry points: type traits, quantize, dequantize.

Everything here calls libggml-base so that the bytes we write are exactly what ggml writes;
``dequant_ref`` holds an independent numpy reference used by the tests.
"""
from __future__ import annotations

import ctypes
import functools
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType

from ._lib import load_ggml

# typedef void (*ggml_to_float_t)(const void * x, float * y, int64_t k);
_TO_FLOAT_T = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)


class _TypeTraits(ctypes.Structure):
    # struct ggml_type_traits in ggml/include/ggml.h
    _fields_ = [
        ("type_name",            ctypes.c_char_p),
        ("blck_size",            ctypes.c_int64),
        ("blck_size_interleave", ctypes.c_int64),
        ("type_size",            ctypes.c_size_t),
        ("is_quantized",         ctypes.c_bool),
        ("to_float",             ctypes.c_void_p),
        ("from_float_ref",       ctypes.c_void_p),
    ]


class GgmlTensor(ctypes.Structure):
    """struct ggml_tensor of upstream 0c1e570 (ggml/include/ggml.h) as far as its name: what an eval callback
    (ggml_backend_sched_eval_callback) reads of a node."""


GgmlTensor._fields_ = [("type", ctypes.c_int), ("buffer", ctypes.c_void_p), ("ne", ctypes.c_int64 * 4),
                       ("nb", ctypes.c_size_t * 4), ("op", ctypes.c_int), ("op_params", ctypes.c_int32 * 16),
                       ("flags", ctypes.c_int32), ("src", ctypes.POINTER(GgmlTensor) * 10),
                       ("view_src", ctypes.c_void_p), ("view_offs", ctypes.c_size_t), ("data", ctypes.c_void_p),
                       ("name", ctypes.c_char * 64)]


@dataclass(frozen=True)
class TypeInfo:
    """Static facts about one ggml type, read from ggml_get_type_traits."""

    qtype:        GGMLQuantizationType
    name:         str   # ggml's spelling, e.g. "q4_K"
    block_size:   int   # values per block
    type_size:    int   # bytes per block
    is_quantized: bool
    has_to_float: bool


@functools.cache
def _lib() -> ctypes.CDLL:
    lib = load_ggml()
    lib.ggml_get_type_traits.restype  = ctypes.POINTER(_TypeTraits)
    lib.ggml_get_type_traits.argtypes = [ctypes.c_int]
    lib.ggml_quantize_chunk.restype   = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes  = [
        ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
        ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
    ]
    lib.ggml_quantize_requires_imatrix.restype  = ctypes.c_bool
    lib.ggml_quantize_requires_imatrix.argtypes = [ctypes.c_int]
    lib.ggml_row_size.restype  = ctypes.c_size_t
    lib.ggml_row_size.argtypes = [ctypes.c_int, ctypes.c_int64]
    # guard against a library whose struct layout differs from the one declared above
    q8 = lib.ggml_get_type_traits(int(GGMLQuantizationType.Q8_0)).contents
    if q8.blck_size != 32 or q8.type_size != 34 or q8.type_name != b"q8_0":
        raise RuntimeError(
            f"libggml-base reports q8_0 as block {q8.blck_size}, size {q8.type_size}, name {q8.type_name!r}; "
            f"struct ggml_type_traits changed upstream, update _TypeTraits in {__file__}"
        )
    return lib


def parse_type(qtype: str | int | GGMLQuantizationType) -> GGMLQuantizationType:
    """'q4_k' / 'Q4_K' / 12 / GGMLQuantizationType.Q4_K -> GGMLQuantizationType.Q4_K."""
    if isinstance(qtype, GGMLQuantizationType):
        return qtype
    if isinstance(qtype, int):
        return GGMLQuantizationType(qtype)
    try:
        return GGMLQuantizationType[qtype.strip().upper()]
    except KeyError:
        raise ValueError(f"unknown ggml type {qtype!r}") from None


@functools.cache
def type_info(qtype: str | int | GGMLQuantizationType) -> TypeInfo:
    qt = parse_type(qtype)
    traits = _lib().ggml_get_type_traits(int(qt)).contents
    return TypeInfo(
        qtype        = qt,
        name         = (traits.type_name or b"").decode(),
        block_size   = int(traits.blck_size),
        type_size    = int(traits.type_size),
        is_quantized = bool(traits.is_quantized),
        has_to_float = bool(traits.to_float),
    )


def row_size(qtype: str | int | GGMLQuantizationType, n: int) -> int:
    """Bytes of one row of n values of qtype (ggml_row_size)."""
    return int(_lib().ggml_row_size(int(parse_type(qtype)), n))


def requires_imatrix(qtype: str | int | GGMLQuantizationType) -> bool:
    return bool(_lib().ggml_quantize_requires_imatrix(int(parse_type(qtype))))


def _ptr(a: np.ndarray) -> ctypes.c_void_p:
    return ctypes.c_void_p(a.ctypes.data)


def _row_chunks(nrows: int, n_per_row: int, threads: int) -> list[tuple[int, int]]:
    # enough chunks to keep every thread busy, none so small that the call overhead shows
    min_rows = max(1, (1 << 16) // max(1, n_per_row))
    n_chunks = max(1, min(threads * 4, nrows // min_rows))
    bounds = np.linspace(0, nrows, n_chunks + 1).astype(np.int64)
    return [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]


MAX_THREADS = 512  # GGML_MAX_N_THREADS: ggml's thread pool crashes above it


def default_threads() -> int:
    return max(1, os.cpu_count() or 1)


def check_threads(threads, error: type[Exception]) -> None:
    """threads (-t): None (all cores) or an int in [1, MAX_THREADS]; else `error`."""
    if threads is not None and (not isinstance(threads, int) or isinstance(threads, bool) or threads < 1):
        raise error(f"threads (-t) must be an int >= 1 (or None: all cores), got {threads!r}")
    if threads is not None and threads > MAX_THREADS:
        raise error(f"-t {threads}: ggml runs at most {MAX_THREADS} threads (this machine has {os.cpu_count()} cores)")


def quantize(
    qtype: str | int | GGMLQuantizationType,
    x: np.ndarray,
    *,
    imatrix: np.ndarray | None = None,
    threads: int | None = None,
) -> np.ndarray:
    """Quantize x (rows, n_per_row) float32 row by row exactly like ggml_quantize_chunk.

    Returns uint8 of shape (rows, row_size(qtype, n_per_row)).
    """
    qt   = parse_type(qtype)
    info = type_info(qt)
    x    = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError(f"quantize expects a 2-D (rows, n_per_row) array, got shape {x.shape}")
    nrows, n_per_row = x.shape
    if n_per_row % info.block_size != 0:
        raise ValueError(f"{info.name}: row length {n_per_row} is not a multiple of the block size {info.block_size}")
    if imatrix is None and requires_imatrix(qt):
        raise ValueError(f"{info.name} cannot be quantized without an importance matrix")
    if imatrix is not None:
        imatrix = np.ascontiguousarray(imatrix, dtype=np.float32)
        if imatrix.shape != (n_per_row,):
            raise ValueError(f"imatrix must have shape ({n_per_row},), got {imatrix.shape}")
    rsize = row_size(qt, n_per_row)
    out   = np.empty((nrows, rsize), dtype=np.uint8)
    lib   = _lib()
    imat  = _ptr(imatrix) if imatrix is not None else None

    def run(bounds: tuple[int, int]) -> None:
        a, b = bounds
        # pass start=0 with offset pointers: ggml would otherwise index dst by start/n_per_row rows
        done = lib.ggml_quantize_chunk(
            int(qt),
            ctypes.c_void_p(x.ctypes.data + a * n_per_row * 4),
            ctypes.c_void_p(out.ctypes.data + a * rsize),
            0, b - a, n_per_row, imat,
        )
        if done != (b - a) * rsize:
            raise RuntimeError(f"ggml_quantize_chunk({info.name}) wrote {done} bytes, expected {(b - a) * rsize}")

    chunks = _row_chunks(nrows, n_per_row, threads or default_threads())
    if len(chunks) == 1 or (threads or default_threads()) == 1:
        for c in chunks:
            run(c)
    else:
        with ThreadPoolExecutor(max_workers=threads or default_threads()) as pool:
            list(pool.map(run, chunks))
    return out


def dequantize(
    qtype: str | int | GGMLQuantizationType,
    data: np.ndarray,
    n_per_row: int,
    *,
    threads: int | None = None,
) -> np.ndarray:
    """Dequantize rows of qtype (raw bytes, any shape, C-contiguous) to float32 (rows, n_per_row)."""
    qt   = parse_type(qtype)
    info = type_info(qt)
    raw  = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    rsize = row_size(qt, n_per_row)
    if raw.size % rsize != 0:
        raise ValueError(f"{info.name}: {raw.size} bytes is not a whole number of {n_per_row}-value rows")
    nrows = raw.size // rsize
    if qt == GGMLQuantizationType.F32:
        return raw.view(np.float32).reshape(nrows, n_per_row).copy()
    if qt == GGMLQuantizationType.F16:
        return raw.view(np.float16).reshape(nrows, n_per_row).astype(np.float32)
    if qt == GGMLQuantizationType.BF16:
        return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(nrows, n_per_row)
    if not info.has_to_float:
        from gguf.quants import dequantize as gguf_dequantize  # slow but covers types ggml can't convert
        return gguf_dequantize(raw.reshape(nrows, rsize), qt).astype(np.float32).reshape(nrows, n_per_row)
    to_float = _TO_FLOAT_T(_lib().ggml_get_type_traits(int(qt)).contents.to_float)
    out = np.empty((nrows, n_per_row), dtype=np.float32)

    def run(bounds: tuple[int, int]) -> None:
        a, b = bounds
        to_float(raw.ctypes.data + a * rsize, out.ctypes.data + a * n_per_row * 4, (b - a) * n_per_row)

    chunks = _row_chunks(nrows, n_per_row, threads or default_threads())
    if len(chunks) == 1:
        run(chunks[0])
    else:
        with ThreadPoolExecutor(max_workers=threads or default_threads()) as pool:
            list(pool.map(run, chunks))
    return out
