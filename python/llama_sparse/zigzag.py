"""Zigzag GGUF format v1: layout, quantization, and which tensors get it (see docs/format.md).

A 2-D weight W (m output rows, n input columns; ggml ne = [n, m]) zigzagged with block type T of
block size B is stored as a tensor of type T with ne = [B*n, m/B]. Stored row r holds, for every
input column j, one block quantizing the B values W[r*B:(r+1)*B, j]; i.e. stored row r is
ggml_quantize_chunk(T) of the n x B matrix W[r*B:(r+1)*B, :]^T. One column's block of B weights can
then be skipped or read as a unit, which is what activation-sparse matmuls need.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader

from . import _ggml

FORMAT_VERSION = 1

KEY_FORMAT_VERSION = "llama_sparse.format_version"          # u32 = FORMAT_VERSION
KEY_ZIGZAG_TENSORS = "llama_sparse.zigzag.tensors"          # [string] tensor names
KEY_ZIGZAG_BLOCKS  = "llama_sparse.zigzag.block_sizes"      # [u32] parallel to the names
# reserved for calibration (written by calibrate, documented in docs/format.md)
KEY_LEVELS         = "llama_sparse.levels"                  # [string] level names, "0.50", "greedy-0.50"
KEY_LEVEL_TARGETS  = "llama_sparse.level_targets"           # [f32] parallel to the level names
KEY_THRESHOLDS_FMT = "llama_sparse.thresholds.{level}"      # [f32] 4*n_layer, layer-major

Q = GGMLQuantizationType

# types the zigzag kernels implement, finest first within each block size
ZIGZAG_TYPES: tuple[GGMLQuantizationType, ...] = (Q.Q6_K, Q.Q4_K, Q.Q8_0, Q.Q4_0)
# fallbacks for when m is not a multiple of the target's block size (256 for K-quants)
FALLBACK_TYPES: tuple[GGMLQuantizationType, ...] = (Q.Q8_0, Q.Q4_0)
DEFAULT_FALLBACK = Q.Q8_0

# group index of each projection in the thresholds arrays: qkv, o, gate_up, down
GROUP_QKV, GROUP_O, GROUP_GATE_UP, GROUP_DOWN = 0, 1, 2, 3
N_GROUPS = 4
_PROJECTION_GROUPS: dict[str, int] = {
    "attn_q":      GROUP_QKV,
    "attn_k":      GROUP_QKV,
    "attn_v":      GROUP_QKV,
    "attn_qkv":    GROUP_QKV,
    "attn_output": GROUP_O,
    "ffn_gate":    GROUP_GATE_UP,
    "ffn_up":      GROUP_GATE_UP,
    "ffn_gate_up": GROUP_GATE_UP,
    "ffn_down":    GROUP_DOWN,
}
_PROJECTION_RE = re.compile(r"^blk\.(\d+)\.(" + "|".join(_PROJECTION_GROUPS) + r")\.weight$")


def block_size(qtype: str | int | GGMLQuantizationType) -> int:
    return _ggml.type_info(qtype).block_size


def check_zigzag_type(qtype: str | int | GGMLQuantizationType) -> GGMLQuantizationType:
    """Parse qtype and make sure the zigzag kernels implement it; ValueError naming the choices if not."""
    supported = ", ".join(t.name.lower() for t in ZIGZAG_TYPES)
    try:
        qt = _ggml.parse_type(qtype)
    except ValueError:
        raise ValueError(f"unknown quantization type {qtype!r}; zigzag supports {supported}") from None
    if qt not in ZIGZAG_TYPES:
        raise ValueError(f"type {qt.name.lower()} is not implemented for zigzag; use one of {supported}")
    return qt


def projection_group(name: str) -> tuple[int, int] | None:
    """(layer, group) of a repeating-block projection weight name, else None.

    Groups index the calibration thresholds: 0 qkv, 1 o, 2 gate_up, 3 down.
    """
    match = _PROJECTION_RE.match(name)
    if match is None:
        return None
    return int(match.group(1)), _PROJECTION_GROUPS[match.group(2)]


def is_zigzag_candidate(name: str, ne: tuple[int, ...] | list[int]) -> bool:
    """True for 2-D projection weights of the repeating blocks (ne = [n, m], ggml order)."""
    return len(ne) == 2 and projection_group(name) is not None


@dataclass(frozen=True)
class TypeChoice:
    """Outcome of choose_zigzag_type: qtype None means standard layout."""

    qtype:    GGMLQuantizationType | None
    fallback: bool
    reason:   str


def choose_zigzag_type(
    m: int,
    target: str | int | GGMLQuantizationType,
    fallback: str | int | GGMLQuantizationType | None = DEFAULT_FALLBACK,
) -> TypeChoice:
    """Zigzag type for a weight with m output rows.

    The target if m % B == 0; else the fallback (default q8_0, the finest 32-block type, so a
    fallback never loses precision against the target) if m % 32 == 0; else standard layout.
    """
    tq = check_zigzag_type(target)
    tb = block_size(tq)
    if m % tb == 0:
        return TypeChoice(tq, False, "")
    if fallback is not None:
        fq = check_zigzag_type(fallback)
        fb = block_size(fq)
        if fq not in FALLBACK_TYPES:
            raise ValueError(f"fallback {fq.name.lower()} must be one of {', '.join(t.name.lower() for t in FALLBACK_TYPES)}")
        if m % fb == 0:
            return TypeChoice(fq, True, f"{m} rows is not a multiple of {tq.name.lower()}'s block size {tb}")
    if fallback is None and m % 32 == 0:
        return TypeChoice(None, True, f"{m} rows is not a multiple of {tq.name.lower()}'s block size {tb}, "
                                      "and no fallback type was allowed (--fallback none)")
    return TypeChoice(None, True, f"{m} rows is not a multiple of any zigzag block size ({tb} or 32)")


def zigzag_nbytes(m: int, n: int, qtype: str | int | GGMLQuantizationType) -> int:
    info = _ggml.type_info(qtype)
    return (m // info.block_size) * n * info.type_size


def zigzag_byte_shape(m: int, n: int, qtype: str | int | GGMLQuantizationType) -> tuple[int, int]:
    """numpy shape (m/B, n*type_size) of the stored bytes; as elements (m/B, B*n), ne = [B*n, m/B]."""
    info = _ggml.type_info(qtype)
    if m % info.block_size != 0:
        raise ValueError(f"{info.name}: m={m} rows is not a multiple of the block size {info.block_size}")
    return m // info.block_size, n * info.type_size


def zigzag_quantize(
    W: np.ndarray,
    qtype: str | int | GGMLQuantizationType,
    *,
    threads: int | None = None,
) -> np.ndarray:
    """Zigzag-quantize W (m, n) float32 to uint8 of shape (m/B, n*type_size)."""
    qt = check_zigzag_type(qtype)
    if W.ndim != 2:
        raise ValueError(f"zigzag_quantize expects a 2-D (m, n) matrix, got shape {W.shape}")
    m, n = W.shape
    out = np.empty(zigzag_byte_shape(m, n, qt), dtype=np.uint8)
    zigzag_quantize_into(out, 0, W, qt, threads=threads)
    return out


def zigzag_quantize_into(
    out: np.ndarray,
    first_block_row: int,
    W_rows: np.ndarray,
    qtype: GGMLQuantizationType,
    *,
    threads: int | None = None,
) -> None:
    """Zigzag-quantize whole block rows W_rows (k*B, n) into out[first_block_row : first_block_row+k]."""
    B = block_size(qtype)
    rows, n = W_rows.shape
    k = rows // B
    # (k*B, n) -> (k, B, n) -> (k, n, B): every stored row is n consecutive B-value ggml rows
    columns = np.ascontiguousarray(W_rows.reshape(k, B, n).transpose(0, 2, 1), dtype=np.float32)
    q = _ggml.quantize(qtype, columns.reshape(k * n, B), threads=threads)
    out[first_block_row:first_block_row + k] = q.reshape(k, -1)


def zigzag_dequantize(
    data: np.ndarray,
    qtype: str | int | GGMLQuantizationType,
    *,
    threads: int | None = None,
) -> np.ndarray:
    """Inverse layout of zigzag_quantize: uint8 (m/B, n*type_size) -> float32 W (m, n), via ggml's to_float."""
    qt   = check_zigzag_type(qtype)
    info = _ggml.type_info(qt)
    data = np.ascontiguousarray(data).view(np.uint8)
    if data.ndim != 2 or data.shape[1] % info.type_size != 0:
        raise ValueError(f"zigzag {info.name} data must be (m/B, n*{info.type_size}) bytes, got shape {data.shape}")
    k, nbytes = data.shape
    n = nbytes // info.type_size
    B = info.block_size
    columns = _ggml.dequantize(qt, data, B, threads=threads)  # (k*n, B)
    return np.ascontiguousarray(columns.reshape(k, n, B).transpose(0, 2, 1)).reshape(k * B, n)


def zigzag_dequantize_ne(ne: tuple[int, int] | list[int], block: int) -> tuple[int, int]:
    """Logical (m, n) of a stored zigzag tensor with ne = [B*n, m/B] and block size B."""
    return int(ne[1]) * block, int(ne[0]) // block


def open_gguf(path, error: type[Exception] = ValueError, *, bad_magic_hint: str,
              parse_hint: str = "the file may be truncated") -> GGUFReader:
    """GGUFReader of path, or `error` saying why the file cannot be read as a GGUF (the hints end the messages)."""
    from gguf.constants import GGUF_MAGIC

    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as exc:
        raise error(f"cannot read {path}: {exc.strerror}") from exc
    if len(magic) < 4 or int.from_bytes(magic, "little") != GGUF_MAGIC:
        raise error(f"{path} is not a GGUF file (bad magic); {bad_magic_hint}")
    try:
        return GGUFReader(path, "r")
    except UnicodeDecodeError as exc:  # whole, but a key or string value is not UTF-8, as GGUF requires
        raise error(f"cannot parse {path} as GGUF: a metadata string is not UTF-8 ({exc})") from exc
    except Exception as exc:  # gguf-py raises ValueError/struct errors on truncated files
        raise error(f"cannot parse {path} as GGUF ({exc}); {parse_hint}") from exc


def string_list(reader: GGUFReader, key: str, path) -> list[str] | None:
    """The array of strings under key, None without the key; ValueError naming path and key for another type."""
    from gguf import GGUFValueType

    field = reader.get_field(key)
    if field is None:
        return None
    if field.types != [GGUFValueType.ARRAY, GGUFValueType.STRING]:
        raise ValueError(f"{path}: metadata key {key} must be an array of strings, not {type_words(field)}")
    return list(field.contents())


def type_words(field) -> str:
    """A GGUF field's type as a reader would say it: "uint32", "array of string"."""
    return " of ".join(t.name.lower() for t in field.types) or "empty"


def read_zigzag_info(reader: GGUFReader) -> dict[str, int]:
    """{tensor name: block size} from a GGUFReader's llama_sparse keys; {} for a standard file."""
    names  = reader.get_field(KEY_ZIGZAG_TENSORS)
    blocks = reader.get_field(KEY_ZIGZAG_BLOCKS)
    if names is None:
        return {}
    name_list  = names.contents()
    block_list = blocks.contents() if blocks is not None else []
    if len(name_list) != len(block_list):
        raise ValueError(f"{KEY_ZIGZAG_TENSORS} has {len(name_list)} names but {KEY_ZIGZAG_BLOCKS} {len(block_list)} sizes")
    return dict(zip(name_list, (int(b) for b in block_list)))

