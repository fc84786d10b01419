"""Pure-numpy reference dequantizers for Q4_0, Q8_0, Q4_K and Q6_K blocks.

Written from ggml's dequantize_row_* (ggml/src/ggml-quants.c) independently of the C library, so
tests can check our bytes without trusting the code that produced them. Arithmetic is float32 in
the same order as the C code; results match ggml to float rounding (FMA contraction aside).
"""
from __future__ import annotations

import numpy as np

QK4_0 = 32
QK8_0 = 32
QK_K  = 256

BLOCK_BYTES = {"q4_0": 2 + QK4_0 // 2, "q8_0": 2 + QK8_0, "q4_K": 2 + 2 + 12 + QK_K // 2, "q6_K": QK_K // 2 + QK_K // 4 + QK_K // 16 + 2}
BLOCK_SIZES = {"q4_0": QK4_0, "q8_0": QK8_0, "q4_K": QK_K, "q6_K": QK_K}


def _blocks(data: np.ndarray | bytes, nbytes: int) -> np.ndarray:
    raw = np.frombuffer(data, dtype=np.uint8) if isinstance(data, (bytes, bytearray)) else np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    if raw.size % nbytes != 0:
        raise ValueError(f"{raw.size} bytes is not a whole number of {nbytes}-byte blocks")
    return raw.reshape(-1, nbytes)


def _f16(b: np.ndarray) -> np.ndarray:
    # two little-endian bytes per row -> float32, shape (nblocks, 1)
    return np.ascontiguousarray(b).view("<f2").astype(np.float32)


def dequantize_q4_0(data: np.ndarray | bytes) -> np.ndarray:
    """block_q4_0 {f16 d; u8 qs[16]}: y[j] = (lo(qs[j]) - 8) d, y[j+16] = (hi(qs[j]) - 8) d."""
    b  = _blocks(data, BLOCK_BYTES["q4_0"])
    d  = _f16(b[:, 0:2])
    qs = b[:, 2:]
    lo = (qs & 0x0F).astype(np.int32) - 8
    hi = (qs >> 4).astype(np.int32) - 8
    return (np.concatenate([lo, hi], axis=1).astype(np.float32) * d).reshape(-1)


def dequantize_q8_0(data: np.ndarray | bytes) -> np.ndarray:
    """block_q8_0 {f16 d; i8 qs[32]}: y[j] = qs[j] d."""
    b  = _blocks(data, BLOCK_BYTES["q8_0"])
    d  = _f16(b[:, 0:2])
    qs = np.ascontiguousarray(b[:, 2:]).view(np.int8)
    return (qs.astype(np.float32) * d).reshape(-1)


def _scale_min_k4(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """get_scale_min_k4 for j = 0..7 at once: 6-bit scales and mins packed in 12 bytes."""
    q  = scales.astype(np.uint8)
    sc = np.empty((q.shape[0], 8), dtype=np.uint8)
    mn = np.empty((q.shape[0], 8), dtype=np.uint8)
    for j in range(8):
        if j < 4:
            sc[:, j] = q[:, j] & 63
            mn[:, j] = q[:, j + 4] & 63
        else:
            sc[:, j] = (q[:, j + 4] & 0xF) | ((q[:, j - 4] >> 6) << 4)
            mn[:, j] = (q[:, j + 4] >> 4) | ((q[:, j] >> 6) << 4)
    return sc, mn


def dequantize_q4_K(data: np.ndarray | bytes) -> np.ndarray:
    """block_q4_K {f16 d, dmin; u8 scales[12]; u8 qs[128]}: 8 sub-blocks of 32, y = d*sc*q - dmin*m."""
    b    = _blocks(data, BLOCK_BYTES["q4_K"])
    d    = _f16(b[:, 0:2])
    dmin = _f16(b[:, 2:4])
    sc, mn = _scale_min_k4(b[:, 4:16])
    qs   = b[:, 16:].reshape(-1, 4, 32)                     # 4 chunks of 32 bytes, one per 64 values
    q    = np.stack([qs & 0xF, qs >> 4], axis=2)           # (nb, 4, 2, 32): low nibbles first
    q    = q.reshape(-1, 8, 32).astype(np.float32)
    d1   = (d * sc.astype(np.float32))[:, :, None]          # float d1 = d * sc
    m1   = (dmin * mn.astype(np.float32))[:, :, None]       # float m1 = min * m
    return (d1 * q - m1).astype(np.float32).reshape(-1)


def dequantize_q6_K(data: np.ndarray | bytes) -> np.ndarray:
    """block_q6_K {u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d}: 16 sub-blocks of 16, y = d*sc*(q-32)."""
    b  = _blocks(data, BLOCK_BYTES["q6_K"])
    ql = b[:, 0:128].reshape(-1, 2, 64).astype(np.int32)     # two halves of 128 values
    qh = b[:, 128:192].reshape(-1, 2, 32).astype(np.int32)
    sc = np.ascontiguousarray(b[:, 192:208]).view(np.int8).reshape(-1, 2, 8).astype(np.float32)
    d  = _f16(b[:, 208:210])[:, :, None]                     # (nb, 1, 1)
    q1 = (ql[:, :, 0:32] & 0xF) | (((qh >> 0) & 3) << 4)
    q2 = (ql[:, :, 32:64] & 0xF) | (((qh >> 2) & 3) << 4)
    q3 = (ql[:, :, 0:32] >> 4) | (((qh >> 4) & 3) << 4)
    q4 = (ql[:, :, 32:64] >> 4) | (((qh >> 6) & 3) << 4)
    q  = np.stack([q1, q2, q3, q4], axis=2) - 32             # (nb, 2, 4, 32): y[l + 32*k]
    # value l of quarter k uses scale index is + 2k, is = l // 16
    scale_idx = (np.arange(32) // 16)[None, :] + 2 * np.arange(4)[:, None]   # (4, 32)
    s  = sc[:, :, scale_idx]                                  # (nb, 2, 4, 32)
    y  = (d[:, :, :, None] * s) * q.astype(np.float32)       # (d * sc) * q, as in C
    return y.astype(np.float32).reshape(-1)


_DEQUANTIZERS = {
    "q4_0": dequantize_q4_0,
    "q8_0": dequantize_q8_0,
    "q4_k": dequantize_q4_K,
    "q6_k": dequantize_q6_K,
}


def dequantize(data: np.ndarray | bytes, qtype: str) -> np.ndarray:
    """Dequantize a run of blocks of qtype ('q4_0', 'q8_0', 'q4_k', 'q6_k') to a flat float32 array."""
    try:
        fn = _DEQUANTIZERS[qtype.lower()]
    except KeyError:
        raise ValueError(f"no reference dequantizer for {qtype!r}; have {', '.join(_DEQUANTIZERS)}") from None
    return fn(data)
