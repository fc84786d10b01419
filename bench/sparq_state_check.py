"""SparQ after a state load, on any backend: the rebuilt transposed K copy must give the logits of the copy kept
up to date by the graph, bit for bit, and the first decode after the load must not stall.

Context A prefills --depth random token ids (SparQ on: the copy is appended in the graph), saves its state, then
decodes --gen tokens. Context B loads that state (the copy is marked stale and rebuilt on the cache's backend
before B's first decode) and decodes the same tokens. The logits must be equal; the times of both first decodes
are printed.

usage: python bench/sparq_state_check.py MODEL.gguf [--ngl 99] [--depth 4096] [--gen 4] [--sparq r=32,k=128,min_kv=0]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", type=Path)
    ap.add_argument("--ngl", type=int, default=99)
    ap.add_argument("--depth", type=int, default=4096)
    ap.add_argument("--gen", type=int, default=4)
    ap.add_argument("--sparq", default="r=32,k=128,min_kv=0")  # min_kv 0: the op at any depth, on any device
    a = ap.parse_args()

    # llama_sparse first (it points llama_cpp at the fork's library), numpy after the native libraries: on the H100
    # machine this script crashed in the model load with numpy imported first, where `import llama_sparse` first
    # (python -c) did not
    import llama_sparse
    import llama_cpp
    import numpy as np

    def ctx():
        return llama_sparse.Llama(a.model, n_ctx=a.depth + a.gen + 16, n_batch=512, n_gpu_layers=a.ngl, flash_attn=True,
                                  verbose=False, sparq=a.sparq)

    rng = np.random.default_rng(0)
    A = ctx()
    vocab = A.n_vocab()
    prompt = [int(t) for t in rng.integers(10, vocab, a.depth)]
    gen = [int(t) for t in rng.integers(10, vocab, a.gen)]
    A.eval(prompt)
    state = A.save_state()

    def decode(llm):
        out, times = [], []
        for t in gen:
            t0 = time.perf_counter()
            llm.eval([t])
            times.append(time.perf_counter() - t0)
            out.append(np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(vocab,)).copy())
        return np.stack(out), times

    la, ta = decode(A)
    del A
    B = ctx()
    B.load_state(state)
    lb, tb = decode(B)
    same = bool(np.array_equal(la, lb))
    print(f"depth {a.depth}, ngl {a.ngl}, sparq {a.sparq}: logits after the state load equal: {same}"
          f" (max |diff| {float(np.abs(la - lb).max()):.3g})")
    print("decode ms, graph-kept copy:  " + " ".join(f"{1e3*t:.1f}" for t in ta))
    print("decode ms, after state load: " + " ".join(f"{1e3*t:.1f}" for t in tb) + " (first one rebuilds the copy)")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
