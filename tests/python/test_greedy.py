"""The block-wise greedy search (python/llama_sparse/greedy.py) on small random blocks, without a model.

tests/python/test_calibrate.py checks the numpy block against the engine on SmolLM2 and the search end to
end; these check the search's own contract fast: targets hit exactly, monotone paths, a cheap group taken
first, and in-sample error below unified's.
"""
from __future__ import annotations

import numpy as np
import pytest

from llama_sparse import greedy as gr

D, FF, H, HKV, HD = 64, 160, 4, 2, 16


def _block(seed: int, quiet_head: bool = False, n_windows: int = 2, rows: int = 48):
    rng = np.random.default_rng(seed)
    spec = gr.BlockSpec(n_embd=D, n_head=H, n_head_kv=HKV, head_dim=HD, head_dim_v=HD, n_rot=HD,
                        rope_type=gr.ROPE_NORM, freq_base=10000.0, freq_scale=1.0, rms_eps=1e-5,
                        attn_scale=1 / np.sqrt(HD))

    def mat(n_in: int, n_out: int, scale: float = 1.0) -> np.ndarray:
        return (rng.standard_normal((n_in, n_out)) * scale / np.sqrt(n_in)).astype(np.float32)

    wv = mat(D, HKV * HD)
    if quiet_head:  # kv head 0 gives almost nothing: half of the o input is tiny
        wv[:, :HD] *= 1e-4
    w = gr.BlockWeights(attn_norm=(1 + 0.1 * rng.standard_normal(D)).astype(np.float32), wq=mat(D, H * HD),
                        wk=mat(D, HKV * HD), wv=wv, wo=mat(H * HD, D),
                        ffn_norm=(1 + 0.1 * rng.standard_normal(D)).astype(np.float32), wgate=mat(D, FF),
                        wup=mat(D, FF), wdown=mat(FF, D))
    # heavy-tailed inputs with a few large channels, like a residual stream
    windows = [(rng.standard_t(4, (rows, D)) * (1 + 3 * (rng.random(D) < 0.05))).astype(np.float32)
               for _ in range(n_windows)]
    block = gr.Block(spec, w, windows, 12)
    bytes_ = [D * (H + 2 * HKV) * HD, H * HD * D, 2 * D * FF, FF * D]
    return block, bytes_


def _quantile_thresholds(block: gr.Block):
    """threshold_of from the dense intermediates' own |x| quantiles (calibrate uses its histograms)."""
    ref = block.forward([0.0] * 4)
    samples = [np.abs(np.concatenate(block.x1)).ravel(), np.abs(ref["o_in"]).ravel(),
               np.abs(ref["x2"]).ravel(), np.abs(ref["a"]).ravel()]
    return lambda g, s: float(np.quantile(samples[g], s)) if s > 0 else 0.0


def test_dense_error_is_zero_and_mask_rule() -> None:
    block, _ = _block(0)
    ref = block.forward([0.0] * 4)
    assert gr.block_error(block, ref, [0.0] * 4) == 0.0
    x = np.array([[-2.0, -1.0, 0.5, 1.0, 3.0]], dtype=np.float32)
    np.testing.assert_array_equal(gr.mask(x, 1.0), [[-2.0, -1.0, 0.0, 1.0, 3.0]])  # |x| >= t stays


@pytest.mark.parametrize("rope_type", [gr.ROPE_NORM, gr.ROPE_NEOX])
def test_rope_rotates_pairs(rope_type: int) -> None:
    """Each rotated pair keeps its norm and turns by pos * base^(-2i/n_rot); dims past n_rot are untouched."""
    rng = np.random.default_rng(1)
    spec = gr.BlockSpec(n_embd=32, n_head=2, n_head_kv=2, head_dim=16, head_dim_v=16, n_rot=12, rope_type=rope_type,
                        freq_base=500.0, freq_scale=0.5, rms_eps=1e-5, attn_scale=0.25)
    x = rng.standard_normal((5, 2, 16)).astype(np.float32)
    pos = np.array([0, 1, 7, 100, 511])
    y = gr.rope(x, pos, spec)
    for i in range(6):
        a, b = (2 * i, 2 * i + 1) if rope_type == gr.ROPE_NORM else (i, i + 6)
        theta = pos * 0.5 * 500.0 ** (-2 * i / 12)
        zx = x[:, :, a] + 1j * x[:, :, b]
        zy = y[:, :, a] + 1j * y[:, :, b]
        np.testing.assert_allclose(zy, zx * np.exp(1j * theta)[:, None], rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(y[:, :, 12:], x[:, :, 12:])


def test_cheap_group_is_taken_first() -> None:
    """When half of the o input is ~0, dropping it costs almost nothing: greedy spends the budget there first,
    not an even split."""
    block, bytes_ = _block(2, quiet_head=True)
    share_o = bytes_[1] / sum(bytes_)
    target = round(0.45 * share_o, 4)
    alloc = gr.greedy_block(block, bytes_, [True] * 4, _quantile_thresholds(block), [target], 0.01)
    s = alloc[target]
    assert s[1] == pytest.approx(target / share_o, abs=1e-6), s
    assert np.all(s[[0, 2, 3]] == 0), s


@pytest.mark.parametrize("seed", [3, 4])
def test_targets_monotone_and_better_than_unified(seed: int) -> None:
    block, bytes_ = _block(seed)
    thr = _quantile_thresholds(block)
    targets = [0.25, 0.4, 0.5, 0.65]
    trace = gr.GreedyTrace()
    alloc = gr.greedy_block(block, bytes_, [True] * 4, thr, targets, 0.025, trace)
    w = np.asarray(bytes_, float) / sum(bytes_)
    ref = block.forward([0.0] * 4)
    prev = np.zeros(4)
    for t in targets:
        s = alloc[t]
        assert float(s @ w) == pytest.approx(t, abs=1e-9)
        assert np.all(s >= prev - 1e-12) and np.all(s <= gr.MAX_SPARSITY + 1e-12)
        prev = s
        e_greedy = gr.block_error(block, ref, [thr(g, s[g]) for g in range(4)])
        e_unified = gr.block_error(block, ref, [thr(g, t) for g in range(4)])
        assert 0 < e_greedy <= e_unified, (t, e_greedy, e_unified)
    # every step raised the block by the increment (or up to a target) and the trace is consistent
    steps = np.diff([0.0] + trace.level)
    assert np.all(steps > 0) and np.all(steps <= 0.025 + 1e-9)
    assert trace.level[-1] == pytest.approx(0.65)


def test_invalid_group_stays_dense() -> None:
    block, bytes_ = _block(5)
    alloc = gr.greedy_block(block, bytes_, [True, True, False, True], _quantile_thresholds(block), [0.3], 0.025)
    s = alloc[0.3]
    assert s[2] == 0
    w = np.asarray(bytes_, float) * [1, 1, 0, 1]
    assert float(s @ w / w.sum()) == pytest.approx(0.3, abs=1e-9)
