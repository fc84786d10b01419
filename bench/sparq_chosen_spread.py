#!/usr/bin/env python3
"""Where SparQ's chosen positions fall at decode, over the position ranges the CUDA fused kernel gives its blocks.

    sparq_chosen_spread.py MODEL.gguf [--text FILE | --random-tokens] [-n N] [--r R] [--k K] [--steps S]

Fills the context with N tokens (a text's, or seeded-random ids for random-weight models), turns SparQ on, decodes
S tokens and, through the scheduler's eval callback, reads each SPARQ_ATTN node's q, K and mask on the CPU. For
every layer and KV head it recomputes the op's chosen positions (llama_sparse.sparq_ref's steps 1 and 2) and counts
them per block range of the fused CUDA kernel (nb = min(8, ceil(n_kv/512)) blocks of P positions). Each block
attends to its own chosen rows, so the largest share bounds how evenly step 2 is spread: 1/nb is even.
"""
from __future__ import annotations

import argparse
import ctypes
import sys
from pathlib import Path

import numpy as np


_F32, _F16 = 0, 1


def _array(t) -> np.ndarray:
    """A 4-d tensor on the host as float64, numpy axes reversed (ne[3], ne[2], ne[1], ne[0])."""
    dt = {_F32: np.float32, _F16: np.float16}[t.type]
    ne = [t.ne[i] for i in range(4)]
    nb = [t.nb[i] for i in range(4)]
    span = sum((n - 1) * b for n, b in zip(ne, nb)) + np.dtype(dt).itemsize
    buf = (ctypes.c_char * span).from_address(t.data)
    flat = np.frombuffer(buf, dtype=np.uint8)
    a = np.lib.stride_tricks.as_strided(flat.view(dt), shape=ne[::-1], strides=nb[::-1])
    return np.array(a, dtype=np.float64)


def chosen(q: np.ndarray, k: np.ndarray, mask: np.ndarray, r: int, k_top: int, scale: float) -> np.ndarray:
    """Chosen positions [Hkv, k_top] of one token, q [H, D], k [Hkv, S, D], mask [S] (llama_sparse.sparq_ref)."""
    from llama_sparse.sparq_ref import sparq_select

    Hkv, S, D = k.shape
    _, i2 = sparq_select(q.reshape(1, Hkv, -1, 1, D), k[None, :, None], mask.reshape(1, 1, 1, 1, S), r, k_top, scale)
    return i2[0, :, 0, 0, :]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--text", type=Path, help="fill the context with this text's tokens")
    src.add_argument("--random-tokens", action="store_true", help="seeded-random token ids (random-weight models)")
    ap.add_argument("-n", type=int, default=4096, help="tokens in the context before decoding (default 4096)")
    ap.add_argument("--r", type=int, default=32)
    ap.add_argument("--k", type=int, default=128)
    ap.add_argument("--steps", type=int, default=2, help="decode steps looked at (default 2)")
    ap.add_argument("-t", "--threads", type=int, default=2)
    a = ap.parse_args()

    import llama_sparse  # noqa: F401  (points llama_cpp at the fork's library)
    import llama_cpp

    from llama_sparse import _native
    from llama_sparse._ggml import GgmlTensor

    spreads: list[float] = []
    rows: list[tuple[int, int, list[int]]] = []   # (step, layer, counts of every block, all heads)
    step = [0]

    def cb(t, ask, _ud):
        node = ctypes.cast(t, ctypes.POINTER(GgmlTensor)).contents
        if not node.name.startswith(b"sparq_attn"):
            return False
        if ask:
            return True
        q, k, mask = (node.src[i].contents for i in (0, 1, 4))
        qa, ka, ma = _array(q), _array(k), _array(mask)   # [ns, H, T, D], [ns, Hkv, S, D], [ns, 1, T_pad, S]
        n_kv = ka.shape[2]
        scale = ctypes.c_float.from_buffer_copy(bytes(node.op_params)[:4]).value
        r, k_top = node.op_params[1], node.op_params[2]
        sel = chosen(qa[0, :, 0, :], ka[0], ma[0, 0, 0, :], r, k_top, scale)
        nb = max(1, min(8, (n_kv + 511) // 512))
        P = ((n_kv + nb - 1) // nb + 7) & ~7
        il = int(node.name.decode().rsplit("-", 1)[-1]) if b"-" in node.name else -1
        counts = np.zeros(nb, dtype=np.int64)
        for h in range(sel.shape[0]):
            c = np.bincount(sel[h] // P, minlength=nb)
            counts += c
            spreads.append(c.max() / sel.shape[1])
        rows.append((step[0], il, counts.tolist()))
        return True

    cb_c = llama_cpp.ggml_backend_sched_eval_callback(cb)
    model = llama_cpp.llama_model_load_from_file(str(a.model).encode(), llama_cpp.llama_model_default_params())
    if not model:
        sys.exit(f"cannot load {a.model}")
    vocab = llama_cpp.llama_model_get_vocab(model)
    if a.text:
        raw = a.text.read_bytes()
        buf = (llama_cpp.llama_token * (len(raw) + 16))()
        n = llama_cpp.llama_tokenize(vocab, raw, len(raw), buf, len(buf), True, False)
        if n < a.n + a.steps:
            sys.exit(f"{a.text}: {n} tokens, fewer than -n {a.n} + {a.steps}")
        toks = list(buf[:a.n + a.steps])
    else:
        rng = np.random.default_rng(0)
        toks = rng.integers(3, llama_cpp.llama_vocab_n_tokens(vocab), a.n + a.steps).tolist()
    cp = llama_cpp.llama_context_default_params()
    cp.n_ctx = a.n + a.steps + 64
    cp.n_batch = cp.n_ubatch = 512
    cp.n_threads = cp.n_threads_batch = a.threads
    cp.cb_eval = cb_c
    ctx = llama_cpp.llama_init_from_model(model, cp)
    if not ctx:
        sys.exit("cannot make a context")
    try:
        if _native.llama_sparse_set_sparq_min_kv(ctx, 0) != 0 or _native.llama_sparse_set_sparq(ctx, a.r, a.k, False) != 0:
            sys.exit(f"SparQ: {_native.sparq_last_error()}")
        for i0 in range(0, a.n, 512):   # prefill (dense)
            chunk = toks[i0:min(a.n, i0 + 512)]
            arr = (llama_cpp.llama_token * len(chunk))(*chunk)
            if llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(arr, len(chunk))) != 0:
                sys.exit("prefill failed")
            print(f"\rprefill {min(a.n, i0 + 512)}/{a.n}", end="", file=sys.stderr, flush=True)
        print(file=sys.stderr)
        for s in range(a.steps):
            step[0] = s
            arr = (llama_cpp.llama_token * 1)(toks[a.n + s])
            if llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(arr, 1)) != 0:
                sys.exit("decode failed")
    finally:
        llama_cpp.llama_free(ctx)
        llama_cpp.llama_model_free(model)
    if not rows:
        sys.exit("no SPARQ_ATTN node ran (k >= the context? SparQ off?)")
    sp = np.array(spreads)
    nb = len(rows[0][2])
    print(f"{a.model.name}: n_kv ~{a.n}, r {a.r}, k {a.k}, {nb} block ranges; per (layer, KV head, step) the largest "
          f"share of the k chosen positions in one block (even: {1 / nb:.3f})")
    print(f"  median {np.median(sp):.3f}, p90 {np.quantile(sp, 0.9):.3f}, max {sp.max():.3f}, "
          f"share of cases above 2/nb: {(sp > 2 / nb).mean():.2f}")
    tot = np.sum([r[2] for r in rows], axis=0)
    print(f"  all chosen positions by block: {(tot / tot.sum()).round(3).tolist()}")
    for s, il, c in rows[:: max(1, len(rows) // 8)]:
        print(f"  step {s} layer {il}: {c}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
