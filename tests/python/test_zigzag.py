"""Zigzag layout: bit-exact against ggml_quantize_chunk, reference dequantizer, round-trip error."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from llama_sparse import _ggml, dequant_ref, zigzag
from llama_sparse._lib import load_ggml

BLOCK = {Q.Q4_0: 32, Q.Q8_0: 32, Q.Q4_K: 256, Q.Q6_K: 256}
TYPE_SIZE = {Q.Q4_0: 18, Q.Q8_0: 34, Q.Q4_K: 144, Q.Q6_K: 210}

SHAPES = {
    32:  [(64, 32), (96, 700), (576, 576), (1536, 200), (192, 1536)],
    256: [(256, 32), (512, 700), (1536, 576), (768, 96), (1280, 333)],
}
CASES = [(qt, shape) for qt in BLOCK for shape in SHAPES[BLOCK[qt]]]

# normal relative RMS error of each type on Gaussian data, with headroom
MAX_REL_ERROR = {Q.Q4_0: 0.12, Q.Q8_0: 0.01, Q.Q4_K: 0.10, Q.Q6_K: 0.03}


def _weights(m: int, n: int, seed: int) -> np.ndarray:
    """LLM-like weights: per-row and per-column scales plus a few outliers, never all-zero."""
    rng = np.random.default_rng(seed)
    W = rng.standard_normal((m, n)).astype(np.float32)
    W *= rng.uniform(0.2, 2.0, size=(m, 1)).astype(np.float32)
    W *= rng.uniform(0.5, 1.5, size=(1, n)).astype(np.float32)
    outliers = rng.random((m, n)) < 0.002
    W[outliers] *= 8.0
    assert np.abs(W).max() > 0
    return W * 0.02


def _ggml_quantize_chunk(qtype: Q, x: np.ndarray) -> bytes:
    """Independent binding: one ggml_quantize_chunk call over x (rows, n_per_row), no imatrix."""
    lib = load_ggml()
    fn = lib.ggml_quantize_chunk
    fn.restype = ctypes.c_size_t
    fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    x = np.ascontiguousarray(x, dtype=np.float32)
    rows, n_per_row = x.shape
    dst = np.zeros(rows * (n_per_row // BLOCK[qtype]) * TYPE_SIZE[qtype], dtype=np.uint8)
    written = fn(int(qtype), x.ctypes.data, dst.ctypes.data, 0, rows, n_per_row, None)
    assert written == dst.size
    return dst.tobytes()


def _expected_zigzag_bytes(qtype: Q, W: np.ndarray) -> bytes:
    """The format contract spelled out: stored row r = quantize((W[rB:(r+1)B, :])^T as n rows of B)."""
    B = BLOCK[qtype]
    m, _ = W.shape
    return b"".join(_ggml_quantize_chunk(qtype, W[r * B:(r + 1) * B, :].T.copy()) for r in range(m // B))


@pytest.mark.parametrize("qtype,shape", CASES, ids=[f"{q.name}-{m}x{n}" for q, (m, n) in CASES])
def test_zigzag_bytes_match_ggml_quantize_chunk(qtype: Q, shape: tuple[int, int]) -> None:
    m, n = shape
    W = _weights(m, n, seed=m * 7919 + n)
    got = zigzag.zigzag_quantize(W, qtype)
    assert got.dtype == np.uint8
    assert got.shape == (m // BLOCK[qtype], n * TYPE_SIZE[qtype])
    expected = _expected_zigzag_bytes(qtype, W)
    assert got.tobytes() == expected


@pytest.mark.parametrize("qtype,shape", CASES, ids=[f"{q.name}-{m}x{n}" for q, (m, n) in CASES])
def test_reference_dequantizer_matches_ggml_to_float(qtype: Q, shape: tuple[int, int]) -> None:
    m, n = shape
    B = BLOCK[qtype]
    W = _weights(m, n, seed=m + 31 * n)
    data = zigzag.zigzag_quantize(W, qtype)
    via_ggml = zigzag.zigzag_dequantize(data, qtype)
    # the reference walks the bytes block by block: block j of stored row r -> W[rB:(r+1)B, j]
    flat = dequant_ref.dequantize(data, qtype.name.lower())
    via_ref = flat.reshape(m // B, n, B).transpose(0, 2, 1).reshape(m, n)
    scale = float(np.abs(via_ggml).max())
    np.testing.assert_allclose(via_ref, via_ggml, rtol=1e-6, atol=1e-6 * scale)
    # and the layout puts each block where the contract says: compare against plain dequantization
    # of the independently quantized transposed block rows
    expected_blocks = np.frombuffer(_expected_zigzag_bytes(qtype, W), dtype=np.uint8)
    ref_expected = dequant_ref.dequantize(expected_blocks, qtype.name.lower())
    np.testing.assert_array_equal(flat, ref_expected)


@pytest.mark.parametrize("qtype", list(BLOCK), ids=lambda q: q.name)
def test_round_trip_error_matches_standard_layout(qtype: Q) -> None:
    # n multiple of 256 so the same matrix can also be quantized in standard (row) layout
    m, n = 1024, 768
    W = _weights(m, n, seed=int(qtype))
    zz = zigzag.zigzag_dequantize(zigzag.zigzag_quantize(W, qtype), qtype)
    std = _ggml.dequantize(qtype, _ggml.quantize(qtype, W), n)
    rel_zz = float(np.linalg.norm(zz - W) / np.linalg.norm(W))
    rel_std = float(np.linalg.norm(std - W) / np.linalg.norm(W))
    assert 0 < rel_zz < MAX_REL_ERROR[qtype], f"{qtype.name}: zigzag relative error {rel_zz:.4f}"
    assert 0.75 < rel_zz / rel_std < 1.33, f"{qtype.name}: zigzag {rel_zz:.4f} vs standard {rel_std:.4f}"


def test_zigzag_rejects_rows_not_multiple_of_block() -> None:
    W = _weights(576, 64, seed=1)
    with pytest.raises(ValueError, match="not a multiple"):
        zigzag.zigzag_quantize(W, "q4_k")
    assert zigzag.zigzag_quantize(W, "q8_0").shape == (18, 64 * 34)


def test_choose_zigzag_type() -> None:
    assert zigzag.choose_zigzag_type(1536, "q4_k").qtype == Q.Q4_K
    c = zigzag.choose_zigzag_type(576, "q4_k")
    assert c.qtype == Q.Q8_0 and c.fallback and "576" in c.reason
    assert zigzag.choose_zigzag_type(576, "q6_k").qtype == Q.Q8_0
    assert zigzag.choose_zigzag_type(576, "q4_k", fallback="q4_0").qtype == Q.Q4_0
    assert zigzag.choose_zigzag_type(576, "q4_0").qtype == Q.Q4_0
    assert zigzag.choose_zigzag_type(576, "q4_k", fallback=None).qtype is None
    none = zigzag.choose_zigzag_type(48, "q4_k")
    assert none.qtype is None and none.fallback


@pytest.mark.parametrize("bad", ["q5_k", "iq4_xs", "f16", "bogus"])
def test_unsupported_types_are_rejected(bad: str) -> None:
    with pytest.raises(ValueError, match="q4_k"):
        zigzag.check_zigzag_type(bad)


def test_projection_names() -> None:
    assert zigzag.projection_group("blk.3.attn_q.weight") == (3, zigzag.GROUP_QKV)
    assert zigzag.projection_group("blk.12.attn_qkv.weight") == (12, zigzag.GROUP_QKV)
    assert zigzag.projection_group("blk.0.attn_output.weight") == (0, zigzag.GROUP_O)
    assert zigzag.projection_group("blk.0.ffn_gate_up.weight") == (0, zigzag.GROUP_GATE_UP)
    assert zigzag.projection_group("blk.7.ffn_down.weight") == (7, zigzag.GROUP_DOWN)
    for name in ("token_embd.weight", "output.weight", "blk.0.attn_norm.weight", "blk.0.attn_q.bias",
                 "blk.0.ffn_gate_exps.weight", "blk.0.ffn_down_shexp.weight"):
        assert zigzag.projection_group(name) is None, name
    assert zigzag.is_zigzag_candidate("blk.0.ffn_up.weight", [576, 1536])
    assert not zigzag.is_zigzag_candidate("blk.0.ffn_up.weight", [576, 1536, 8])


def test_reference_dequantizer_detects_corruption() -> None:
    W = _weights(256, 64, seed=5)
    data = zigzag.zigzag_quantize(W, "q4_k")
    good = dequant_ref.dequantize(data, "q4_k")
    data[0, 0] ^= 0x40  # flip a bit in the first block's d
    assert not np.array_equal(dequant_ref.dequantize(data, "q4_k"), good)
