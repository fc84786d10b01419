"""numpy port of SparQ attention, Appendix B of Ribar et al. 2023 ("SparQ Attention: Bandwidth-Efficient
LLM Inference"), used as the independent reference for GGML_OP_SPARQ_ATTN (docs/sparq.md).

Shapes follow the paper's grouped layout:
    q       [B, Hkv, G, T, D]    G query heads share one KV head
    k       [B, Hkv, 1, S, D]
    v       [B, Hkv, 1, S, Dv]
    v_mean  [B, Hkv, 1, T|1, Dv] mean of v over the positions each query sees
    mask    [B, 1,   1, T, S]    additive: 0 visible, -inf not
Ties in top-k go to the lower index (a stable sort), as in the ggml op.
"""
from __future__ import annotations

import numpy as np


def _softmax(x: np.ndarray) -> np.ndarray:
    m = np.max(x, axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(x - m)
    s = e.sum(axis=-1, keepdims=True)
    return e / np.where(s > 0, s, 1.0)


def _topk_indices(x: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest entries along the last axis, ties to the lower index."""
    return np.argsort(-x, axis=-1, kind="stable")[..., :k]


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray, scale: float | None = None) -> np.ndarray:
    """Dense attention, the paper's ``attn``: softmax(q k^T * scale + mask) v."""
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    s = q @ np.swapaxes(k, -1, -2) * scale + mask
    return _softmax(s) @ v


def sparq_select(q: np.ndarray, k: np.ndarray, mask: np.ndarray, r: int, k_top: int, scale: float | None = None,
                 k_approx: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Steps 1 and 2's selection of sparq_attention: (s_hat, i2), the approximate scores [B, Hkv, G, T, S] and the
    chosen positions [B, Hkv, 1, T, k_top] (k_top capped at S)."""
    q64, k64 = (np.asarray(a, dtype=np.float64) for a in (q, k))
    mask = np.asarray(mask, dtype=np.float64)
    D, S = q64.shape[-1], k64.shape[-2]
    scale = 1.0 / np.sqrt(D) if scale is None else scale
    r = min(r, D)
    k_top = min(k_top, S)

    # 1. approximate scores from the r largest components of |q|, summed over the group
    i1 = _topk_indices(np.abs(q64).sum(axis=2, keepdims=True), r)                       # [B, Hkv, 1, T, r]
    q_hat = np.take_along_axis(q64, np.broadcast_to(i1, q64.shape[:-1] + (r,)), axis=-1)  # [B, Hkv, G, T, r]
    # K[:, i1] per query token: [B, Hkv, 1, T, S, r]
    ka64 = k64 if k_approx is None else np.asarray(k_approx, dtype=np.float64)
    k_hat = np.take_along_axis(ka64[:, :, :, None, :, :], i1[:, :, :, :, None, :], axis=-1)
    l1 = np.abs(q64).sum(axis=-1, keepdims=True)
    l1r = np.abs(q_hat).sum(axis=-1, keepdims=True)
    rho = np.where((l1 > 0) & (l1r > 0), l1r / np.where(l1 > 0, l1, 1.0), 1.0)
    logits = np.einsum("bhgtr,bhtsr->bhgts", q_hat, k_hat[:, :, 0]) * (scale / np.sqrt(rho)) + mask
    s_hat = _softmax(logits)                                                             # [B, Hkv, G, T, S]

    # 2. top-k positions of the group-summed approximate scores
    return s_hat, _topk_indices(s_hat.sum(axis=2, keepdims=True), k_top)                # [B, Hkv, 1, T, k]


def sparq_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, v_mean: np.ndarray | None, mask: np.ndarray,
                    r: int, k_top: int, mean_v: bool = True, scale: float | None = None,
                    k_approx: np.ndarray | None = None) -> np.ndarray:
    """SparQ attention; returns [B, Hkv, G, T, Dv].

    scale is the model's softmax scale (1/sqrt(D) by default); the approximate scores use
    scale / sqrt(rho), which is the paper's temperature sqrt(D * rho) for scale = 1/sqrt(D).
    With mean_v=False step 3 is skipped (the paper's choice for GQA models). k_top >= S gives dense
    attention, as in the paper (every position is picked and alpha = 1). k_approx: the keys step 1 reads
    (same shape as k; default k), e.g. the 8-bit transposed copy dequantized.
    """
    q64, k64, v64 = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    mask = np.asarray(mask, dtype=np.float64)
    S = k64.shape[-2]
    scale = 1.0 / np.sqrt(q64.shape[-1]) if scale is None else scale
    k_top = min(k_top, S)
    s_hat, i2 = sparq_select(q64, k64, mask, r, k_top, scale, k_approx)

    # exact attention over the chosen positions
    y = np.empty(q64.shape[:-1] + (v64.shape[-1],))
    for t in range(q64.shape[3]):
        idx = i2[:, :, :, t, :]                                                          # [B, Hkv, 1, k]
        k_sel = np.take_along_axis(k64, idx[..., None], axis=-2)                        # [B, Hkv, 1, k, D]
        v_sel = np.take_along_axis(v64, idx[..., None], axis=-2)
        m_sel = np.take_along_axis(np.broadcast_to(mask[:, :, :, t, :], idx.shape[:-1] + (S,)), idx, axis=-1)
        y[:, :, :, t, :] = attention(q64[:, :, :, t:t + 1, :], k_sel, v_sel, m_sel[..., None, :], scale)[:, :, :, 0, :]

    if not mean_v:
        return y
    # 3. interpolate with the mean of V by the approximate score mass of the chosen positions
    alpha = np.take_along_axis(s_hat, np.broadcast_to(i2, s_hat.shape[:-1] + (k_top,)), axis=-1).sum(axis=-1, keepdims=True)
    return alpha * y + (1.0 - alpha) * np.asarray(v_mean, dtype=np.float64)
