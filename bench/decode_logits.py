"""Decode logits of a model at a sparsity level, saved for comparing two runs of the library (for example a backend
knob on and off, set through the environment of each run), or the comparison of two saved runs.

A prefill of --prompt seeded-random token ids, then --gen decode steps of one token each (seeded-random too, so
that both runs see the same inputs whatever they predict). Works with random-weight models, whose vocabulary
cannot tokenize text.

usage: python bench/decode_logits.py save MODEL.gguf OUT.npy [--level 0.50] [--ngl 99] [--prompt 64] [--gen 16]
                                         [--split-mode 1] [--flash-attn] [--verbose]
       python bench/decode_logits.py compare A.npy B.npy [--max-rel 1e-2]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def save(a: argparse.Namespace) -> int:
    # llama_sparse first: it points llama_cpp at the fork's library
    import llama_sparse
    import llama_cpp
    import numpy as np

    llm = llama_sparse.Llama(a.model, sparsity=a.level, n_ctx=a.prompt + a.gen + 16, n_batch=512,
                             n_gpu_layers=a.ngl, split_mode=a.split_mode, flash_attn=a.flash_attn,
                             verbose=a.verbose)
    vocab = llm.n_vocab()
    rng = np.random.default_rng(0)
    prompt = [int(t) for t in rng.integers(10, vocab, a.prompt)]
    gen = [int(t) for t in rng.integers(10, vocab, a.gen)]
    llm.eval(prompt)
    llm.reset_stats()
    out = []
    for t in gen:
        llm.eval([t])
        out.append(np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(vocab,)).copy())
    np.save(a.out, np.stack(out))
    st = llm.sparse_stats()
    print(f"saved {len(out)} decode steps x {vocab} logits, level {a.level or 'dense'}, ngl {a.ngl}: {a.out}; "
          f"decode column sets {st['lists']}, skipped {st['skipped']:.3f}")
    return 0


def compare(a: argparse.Namespace) -> int:
    import numpy as np

    x, y = np.load(a.a).astype(np.float64), np.load(a.b).astype(np.float64)
    if x.shape != y.shape:
        print(f"shapes differ: {x.shape} against {y.shape}")
        return 1
    rel = np.abs(x - y).max(axis=1) / np.abs(x).max(axis=1)
    same = int((x.argmax(axis=1) == y.argmax(axis=1)).sum())
    ok = bool(rel.max() <= a.max_rel)
    print(f"{len(rel)} steps: max |a-b|/max|a| per step: worst {rel.max():.3e}, median {np.median(rel):.3e}; "
          f"argmax equal {same}/{len(rel)}: {'ok' if ok else 'FAIL'} (limit {a.max_rel:g})")
    return 0 if ok else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("save")
    s.add_argument("model", type=Path)
    s.add_argument("out", type=Path)
    s.add_argument("--level", default=None)
    s.add_argument("--ngl", type=int, default=99)
    s.add_argument("--prompt", type=int, default=64)
    s.add_argument("--gen", type=int, default=16)
    s.add_argument("--split-mode", type=int, default=1, help="llama_split_mode: 0 none, 1 layer (default), 3 tensor")
    s.add_argument("--flash-attn", action="store_true", help="flash attention on (llama_cpp.Llama's default is off)")
    s.add_argument("--verbose", action="store_true", help="the library's log (which fusions ran) on stderr")
    c = sub.add_parser("compare")
    c.add_argument("a", type=Path)
    c.add_argument("b", type=Path)
    c.add_argument("--max-rel", type=float, default=1e-2)
    a = ap.parse_args()
    return save(a) if a.cmd == "save" else compare(a)


if __name__ == "__main__":
    sys.exit(main())
