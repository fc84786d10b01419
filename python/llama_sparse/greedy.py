"""Block-wise greedy sparsity allocation (TEAL, Liu et al. 2024, section 4.2), on our own activations.

For every transformer block, the four threshold groups (qkv input, o input, gate/up input, down input)
start at sparsity 0. Each step raises the one group whose step adds the least error to the block's
output, the step of group g being sized so the block's weight-byte-weighted sparsity rises by a fixed
increment (ds_g = increment * block bytes / bytes_g). The allocation is recorded when the block reaches
each target level. The error is measured by recomputing the block in numpy:

    h  -> x1 = rms_norm(h) * attn_norm                         qkv input   (masked with t_qkv)
          q, k, v = x1 Wq, x1 Wk, x1 Wv (+ biases), RoPE on q, k as ggml applies it, GQA, causal softmax
          o_in = attention output                              o input     (masked with t_o)
    r  =  h + o_in Wo
          x2 = rms_norm(r) * ffn_norm                          gate/up in. (masked with t_gate_up)
          a  = silu(x2 Wgate) * (x2 Wup)                       down input  (masked with t_down)
    out = r + a Wdown

on block inputs h sampled from dense windows of calibration text run through our engine
(llama_sparse_calib_sample_*), with weights dequantized from the GGUF. Masking keeps |x| >= t like the
runtime, and t is the calibration-histogram quantile of the group at the allocated sparsity. The error of
an allocation is the mean squared difference of `out` from the dense block's, over query positions in the
last quarter of each sampled window (every key before them attends), as TEAL does.
"""
from __future__ import annotations

import ctypes
import glob
import math
import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator, Optional, Sequence

import numpy as np

GROUPS = ("qkv", "o", "gate_up", "down")
N_GROUPS = 4
MAX_SPARSITY = 0.99

# ggml rope types (llama.h: LLAMA_ROPE_TYPE_*)
ROPE_NORM, ROPE_NEOX = 0, 2

# per-block tensors the reference block understands; any other blk.N.* tensor means another block shape
_BLOCK_TENSORS = {
    "attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight",
    "attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_output.bias",
    "ffn_norm.weight", "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight",
}


def _openblas_setter() -> Optional[Callable[[int], None]]:
    """openblas_set_num_threads of the OpenBLAS numpy links (its wheel bundles a renamed copy), or None."""
    libs = glob.glob(os.path.join(os.path.dirname(np.__file__), os.pardir, "numpy.libs", "*openblas*"))
    for path in libs + ["libopenblas.so.0"]:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for name in ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads_64_",
                     "openblas_set_num_threads64_", "openblas_set_num_threads"):
            fn = getattr(lib, name, None)
            if fn is not None:
                fn.argtypes, fn.restype = [ctypes.c_int], None
                return fn
    return None


@contextmanager
def blas_threads(n: int) -> Iterator[int]:
    """Run numpy's BLAS on n threads (1 when the machine is already busier than its cores: OpenBLAS's
    spinning threads then stall each other, 10x slower here). Yields the count used."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if os.getloadavg()[0] >= cpus:
        n = 1
    setter = _openblas_setter()
    if setter is None:
        yield n
        return
    setter(max(1, n))
    try:
        yield n
    finally:
        setter(cpus)


class UnsupportedBlock(ValueError):
    """The model's blocks are not the pre-norm attention + SwiGLU shape that greedy recomputes."""


@dataclass
class BlockSpec:
    """Model-wide hyperparameters of a llama-style block, from the GGUF keys."""

    n_embd:       int
    n_head:       int
    n_head_kv:    int
    head_dim:     int          # of q and k
    head_dim_v:   int
    n_rot:        int
    rope_type:    int          # ROPE_NORM: pairs (2i, 2i+1); ROPE_NEOX: pairs (i, i + n_rot/2)
    freq_base:    float
    freq_scale:   float        # 1 / linear scaling factor
    rms_eps:      float
    attn_scale:   float
    freq_factors: Optional[np.ndarray] = None  # rope_freqs.weight (Llama 3.1 style), divides theta


def _key(reader, name: str, default=None):
    f = reader.get_field(name)
    if f is None:
        return default
    v = f.contents()
    return v


def read_spec(reader, rope_type: int) -> BlockSpec:
    """BlockSpec from the GGUF metadata; UnsupportedBlock naming what differs from a llama-style block."""
    from gguf.quants import dequantize

    arch = _key(reader, "general.architecture")
    if rope_type not in (ROPE_NORM, ROPE_NEOX):
        raise UnsupportedBlock(f"rope type {rope_type} of {arch} (only normal and NeoX RoPE are recomputed)")
    kv = lambda k, d=None: _key(reader, f"{arch}.{k}", d)  # noqa: E731
    n_embd = int(kv("embedding_length"))
    n_head = kv("attention.head_count")
    n_head_kv = kv("attention.head_count_kv", n_head)
    if isinstance(n_head, list) or isinstance(n_head_kv, list):
        raise UnsupportedBlock(f"per-layer head counts of {arch}")
    n_head, n_head_kv = int(n_head), int(n_head_kv)
    head_dim = int(kv("attention.key_length", n_embd // n_head))
    head_dim_v = int(kv("attention.value_length", head_dim))
    eps = kv("attention.layer_norm_rms_epsilon")
    if eps is None:
        raise UnsupportedBlock(f"{arch} has no RMS norm epsilon (not an RMS-norm block)")
    scaling = kv("rope.scaling.type", "none")
    factor = float(kv("rope.scaling.factor", 0.0) or 0.0)
    if scaling not in ("none", "linear") and factor not in (0.0, 1.0):
        raise UnsupportedBlock(f"rope scaling {scaling!r} of {arch}")
    for k in ("attn_logit_softcapping", "final_logit_softcapping", "attention.sliding_window", "expert_count"):
        if kv(k) is not None and kv(k) != 0:
            raise UnsupportedBlock(f"{arch}.{k} is set")
    freq_factors = None
    for t in reader.tensors:
        if t.name == "rope_freqs.weight":
            freq_factors = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(-1)
        elif t.name.startswith("blk."):
            rest = t.name.split(".", 2)[2]
            if rest not in _BLOCK_TENSORS:
                raise UnsupportedBlock(f"block tensor {t.name} (the reference block has no {rest})")
    return BlockSpec(
        n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, head_dim=head_dim, head_dim_v=head_dim_v,
        n_rot=int(kv("rope.dimension_count", head_dim)), rope_type=rope_type,
        freq_base=float(kv("rope.freq_base", 10000.0)),
        freq_scale=1.0 / factor if scaling == "linear" and factor > 0 else 1.0,
        rms_eps=float(eps), attn_scale=float(kv("attention.scale", 0.0) or 1.0 / math.sqrt(head_dim)),
        freq_factors=freq_factors,
    )


@dataclass
class BlockWeights:
    """Dequantized float32 weights of one block, stored transposed (n_in, n_out) so rows @ W is the matmul."""

    attn_norm: np.ndarray
    wq: np.ndarray
    wk: np.ndarray
    wv: np.ndarray
    wo: np.ndarray
    ffn_norm: np.ndarray
    wgate: np.ndarray
    wup: np.ndarray
    wdown: np.ndarray
    bq: Optional[np.ndarray] = None
    bk: Optional[np.ndarray] = None
    bv: Optional[np.ndarray] = None
    bo: Optional[np.ndarray] = None


def load_block(tensors: dict, zigzag_blocks: dict[str, int], layer: int) -> BlockWeights:
    """Weights of block `layer` from GGUFReader tensors {name: tensor}; zigzag ones are un-zigzagged."""
    from gguf.quants import dequantize

    from . import zigzag

    def get(name: str, required: bool = True) -> Optional[np.ndarray]:
        full = f"blk.{layer}.{name}"
        t = tensors.get(full)
        if t is None:
            if required:
                raise UnsupportedBlock(f"{full} is missing")
            return None
        if full in zigzag_blocks:
            w = zigzag.zigzag_dequantize(np.asarray(t.data), t.tensor_type)
        else:
            w = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
            ne = [int(x) for x in t.shape]
            w = w.reshape(ne[1], ne[0]) if len(ne) == 2 and ne[1] > 1 else w.reshape(-1)
        return np.asarray(w, dtype=np.float32)

    def mat(name: str) -> np.ndarray:
        return np.ascontiguousarray(get(name).T)  # (m, n) -> (n, m)

    return BlockWeights(
        attn_norm=get("attn_norm.weight").reshape(-1), wq=mat("attn_q.weight"), wk=mat("attn_k.weight"),
        wv=mat("attn_v.weight"), wo=mat("attn_output.weight"), ffn_norm=get("ffn_norm.weight").reshape(-1),
        wgate=mat("ffn_gate.weight"), wup=mat("ffn_up.weight"), wdown=mat("ffn_down.weight"),
        bq=get("attn_q.bias", False), bk=get("attn_k.bias", False), bv=get("attn_v.bias", False),
        bo=get("attn_output.bias", False),
    )


# --------------------------------------------------------------------------------------------------
# the block


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    ms = np.mean(np.square(x, dtype=np.float64), axis=-1, keepdims=True)
    return (x * (1.0 / np.sqrt(ms + eps)).astype(np.float32)) * w


def mask(x: np.ndarray, t: float) -> np.ndarray:
    """The runtime's rule: keep x_j where |x_j| >= t (t = 0 keeps everything)."""
    return x if t <= 0 else np.where(np.abs(x) >= t, x, np.float32(0))


def rope(x: np.ndarray, pos: np.ndarray, spec: BlockSpec) -> np.ndarray:
    """RoPE of x (rows, heads, head_dim) at positions pos (rows,), as ggml_rope_ext with ext_factor 0."""
    n_rot, half = spec.n_rot, spec.n_rot // 2
    theta = spec.freq_base ** (-2.0 * np.arange(half) / n_rot)
    theta = pos.astype(np.float64)[:, None] * spec.freq_scale * theta[None, :]
    if spec.freq_factors is not None:
        theta = theta / spec.freq_factors[:half].astype(np.float64)[None, :]
    cos = np.cos(theta).astype(np.float32)[:, None, :]
    sin = np.sin(theta).astype(np.float32)[:, None, :]
    out = x.copy()
    if spec.rope_type == ROPE_NEOX:
        x0, x1 = x[:, :, :half], x[:, :, half:n_rot]
        out[:, :, :half] = x0 * cos - x1 * sin
        out[:, :, half:n_rot] = x0 * sin + x1 * cos
    else:
        x0, x1 = x[:, :, 0:n_rot:2], x[:, :, 1:n_rot:2]
        out[:, :, 0:n_rot:2] = x0 * cos - x1 * sin
        out[:, :, 1:n_rot:2] = x0 * sin + x1 * cos
    return out


def _bias(y: np.ndarray, b: Optional[np.ndarray]) -> np.ndarray:
    return y if b is None else y + b


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


class Block:
    """One block, its sampled inputs and the cached intermediates of one threshold setting."""

    def __init__(self, spec: BlockSpec, weights: BlockWeights, windows: Sequence[np.ndarray],
                 queries_per_window: int) -> None:
        self.spec, self.w = spec, weights
        self.windows = [np.ascontiguousarray(h, dtype=np.float32) for h in windows]
        # query rows: evenly spaced over the last quarter of each window
        self.queries = []
        for h in self.windows:
            n = h.shape[0]
            lo = (3 * n) // 4
            k = max(1, min(queries_per_window, n - lo))
            self.queries.append(np.unique(np.linspace(lo, n - 1, k).round().astype(np.int64)))
        self.x1 = [rms_norm(h, weights.attn_norm, spec.rms_eps) for h in self.windows]
        self.w_gate_up = np.concatenate([weights.wgate, weights.wup], axis=1)  # one GEMM for both
        self.h_q = np.concatenate([h[q] for h, q in zip(self.windows, self.queries)])

    # stage 1: attention input -> o input at the query rows
    def o_input(self, t_qkv: float) -> np.ndarray:
        sp, w = self.spec, self.w
        outs = []
        for x1, q_rows in zip(self.x1, self.queries):
            xm = mask(x1, t_qkv)
            n = xm.shape[0]
            pos = np.arange(n)
            k = _bias(xm @ w.wk, w.bk).reshape(n, sp.n_head_kv, sp.head_dim)
            v = _bias(xm @ w.wv, w.bv).reshape(n, sp.n_head_kv, sp.head_dim_v)
            q = _bias(xm[q_rows] @ w.wq, w.bq).reshape(len(q_rows), sp.n_head, sp.head_dim)
            k = rope(k, pos, sp)
            q = rope(q, q_rows, sp)
            g = sp.n_head // sp.n_head_kv
            q = q.reshape(len(q_rows), sp.n_head_kv, g, sp.head_dim)
            scores = np.einsum("qhgd,khd->hgqk", q, k, optimize=True) * np.float32(sp.attn_scale)
            scores = np.where(pos[None, None, None, :] <= q_rows[None, None, :, None], scores, -np.inf)
            scores -= scores.max(axis=-1, keepdims=True)
            p = np.exp(scores)
            p /= p.sum(axis=-1, keepdims=True)
            o = np.einsum("hgqk,khd->qhgd", p, v, optimize=True)
            outs.append(o.reshape(len(q_rows), sp.n_head * sp.head_dim_v).astype(np.float32))
        return np.concatenate(outs)

    # stage 2: o input -> residual after attention
    def residual(self, o_in: np.ndarray, t_o: float) -> np.ndarray:
        return self.h_q + _bias(mask(o_in, t_o) @ self.w.wo, self.w.bo)

    def ffn_input(self, r: np.ndarray) -> np.ndarray:
        return rms_norm(r, self.w.ffn_norm, self.spec.rms_eps)

    # stage 3: gate/up input -> down input
    def down_input(self, x2: np.ndarray, t_gate_up: float) -> np.ndarray:
        gu = mask(x2, t_gate_up) @ self.w_gate_up
        n_ff = self.w.wgate.shape[1]
        return silu(gu[:, :n_ff]) * gu[:, n_ff:]

    # stage 4: down input -> block output
    def output(self, r: np.ndarray, a: np.ndarray, t_down: float) -> np.ndarray:
        return r + mask(a, t_down) @ self.w.wdown

    def forward(self, t: Sequence[float]) -> dict[str, np.ndarray]:
        """All intermediates at the query rows for thresholds t (one per group)."""
        o_in = self.o_input(t[0])
        r = self.residual(o_in, t[1])
        x2 = self.ffn_input(r)
        a = self.down_input(x2, t[2])
        return {"o_in": o_in, "r": r, "x2": x2, "a": a, "out": self.output(r, a, t[3])}


def block_error(block: Block, ref: dict[str, np.ndarray], t: Sequence[float]) -> float:
    """||out(t) - out(dense)||^2 / ||out(dense) - h||^2 at the query rows: the relative error of the
    block's update to the residual stream."""
    out = block.forward(t)["out"]
    return float(np.sum(np.square(out - ref["out"], dtype=np.float64)) /
                 max(1e-30, np.sum(np.square(ref["out"] - block.h_q, dtype=np.float64))))


# --------------------------------------------------------------------------------------------------
# the search


@dataclass
class GreedyTrace:
    """The path of one block: after every step, its byte-weighted sparsity, relative error and allocation."""

    level:    list[float] = field(default_factory=list)
    error:    list[float] = field(default_factory=list)
    sparsity: list[list[float]] = field(default_factory=list)
    chosen:   list[int] = field(default_factory=list)


def greedy_block(block: Block, group_bytes: Sequence[float], valid: Sequence[bool],
                 threshold_of: Callable[[int, float], float], targets: Sequence[float], increment: float,
                 trace: Optional[GreedyTrace] = None) -> dict[float, np.ndarray]:
    """Greedy allocation of one block: {target: per-group sparsity [4]} for every target (ascending).

    group_bytes / valid: weight bytes per group and whether the group is sparse at all (invalid groups stay 0).
    threshold_of(g, s): the calibrated threshold giving sparsity s in group g.
    """
    groups = [g for g in range(N_GROUPS) if valid[g] and group_bytes[g] > 0]
    out: dict[float, np.ndarray] = {}
    s = np.zeros(N_GROUPS)
    if not groups:
        return {tg: s.copy() for tg in targets}
    total = float(sum(group_bytes[g] for g in groups))
    share = {g: group_bytes[g] / total for g in groups}
    t = [0.0] * N_GROUPS

    ref = block.forward(t)
    norm = max(1e-30, float(np.sum(np.square(ref["out"] - block.h_q, dtype=np.float64))))
    cur = dict(ref)  # intermediates at the current allocation

    def err(o: np.ndarray) -> float:
        return float(np.sum(np.square(o - ref["out"], dtype=np.float64))) / norm

    # o_input depends on t_qkv alone and is the costly stage (k and v of every row): a qkv candidate that
    # was not taken is offered again, with the same threshold, in the next step
    o_memo: dict[float, np.ndarray] = {0.0: ref["o_in"]}

    def o_input(tq: float) -> np.ndarray:
        if tq not in o_memo:
            if len(o_memo) > 2:
                for k in [k for k in o_memo if k != t[0]]:
                    del o_memo[k]
            o_memo[tq] = block.o_input(tq)
        return o_memo[tq]

    cur_err, level = 0.0, 0.0
    for target in sorted(targets):
        while level < target - 1e-9:
            inc = min(increment, target - level)
            best = None
            for g in groups:
                ds = min(inc / share[g], MAX_SPARSITY - s[g])
                if ds <= 1e-9:
                    continue
                tn = threshold_of(g, float(s[g] + ds))
                cand = dict(cur)
                if g == 0:
                    cand["o_in"] = o_input(tn)
                if g <= 1:
                    cand["r"] = block.residual(cand["o_in"], tn if g == 1 else t[1])
                    cand["x2"] = block.ffn_input(cand["r"])
                if g <= 2:
                    cand["a"] = block.down_input(cand["x2"], tn if g == 2 else t[2])
                cand["out"] = block.output(cand["r"], cand["a"], tn if g == 3 else t[3])
                e = err(cand["out"])
                gain = ds * share[g]
                score = (e - cur_err) / gain
                if best is None or score < best[0]:
                    best = (score, g, ds, tn, e, gain, cand)
            if best is None:
                break  # every group is at MAX_SPARSITY
            _, g, ds, tn, e, gain, cand = best
            s[g] += ds
            t[g] = tn
            cur, cur_err = cand, e
            level += gain
            if trace is not None:
                trace.level.append(level)
                trace.error.append(e)
                trace.sparsity.append(s.tolist())
                trace.chosen.append(g)
        out[target] = s.copy()
    return out
