#!/usr/bin/env python3
"""Per-token decode times around the step where SparQ comes on (its min_kv), to measure the one-time cost of the
op's first run in a process. Prefills --depth random token ids, then decodes --n tokens one llama_decode each.

    python bench/sparq_first_step.py MODEL --depth 3800 --n 160 --sparq r=32,k=128,min_kv=4096

The KV cache view is the used cells rounded up to 256, so with min_kv M the op first runs at the step whose view
reaches M. Prints the median step, the first step, that step and the slowest steps (ms).
"""
import argparse
import statistics
import sys
import time

import numpy as np

import llama_sparse


def view(cells: int) -> int:
    return (cells + 255)//256*256


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--depth", type=int, default=3800, help="prefilled positions")
    ap.add_argument("--n", type=int, default=160, help="decode steps timed")
    ap.add_argument("--sparq", default="r=32,k=128,min_kv=4096", help='SparQ settings, or "off"')
    ap.add_argument("--sparsity", default=None, help="TEAL level of a calibrated zigzag model")
    ap.add_argument("--ngl", type=int, default=99)
    ap.add_argument("--label", default="")
    a = ap.parse_args()
    if a.depth < 1 or a.n < 2:
        ap.error("--depth must be >= 1 and --n >= 2")

    kw = {"sparsity": a.sparsity} if a.sparsity else {}
    llm = llama_sparse.Llama(a.model, n_ctx=view(a.depth + a.n) + 256, n_batch=2048, n_ubatch=512,
                             n_gpu_layers=a.ngl, flash_attn=True, verbose=False, **kw)
    t = time.perf_counter()
    llm.set_sparq(a.sparq)  # allocates the K copy; on a GPU also runs the op once to load it (sparq_preload)
    set_ms = 1e3*(time.perf_counter() - t)
    rng = np.random.default_rng(0)
    toks = rng.integers(100, llm.n_vocab(), size=a.depth + a.n).tolist()
    t = time.perf_counter()
    llm.eval(toks[:a.depth])
    prefill = time.perf_counter() - t

    ms = []
    for i in range(a.n):
        t = time.perf_counter()
        llm.eval([toks[a.depth + i]])
        ms.append(1e3*(time.perf_counter() - t))

    # step i decodes with depth + i + 1 used cells
    min_kv = llm.sparq.min_kv if llm.sparq else None  # (None also for auto)
    on = next((i for i in range(a.n) if view(a.depth + i + 1) >= min_kv), None) if min_kv else None
    # steps whose view grows by 256 (graph shapes change there) besides the op's
    grows = [i for i in range(1, a.n) if view(a.depth + i + 1) != view(a.depth + i) and i != on]
    med = statistics.median(ms[1:])
    slow = sorted(range(a.n), key=lambda i: -ms[i])[:5]
    print(f"{a.label or a.sparq}: set_sparq {set_ms:.1f} ms; prefill {a.depth} in {prefill:.2f} s; decode median {med:.3f} ms, "
          f"first step {ms[0]:.2f} ms", end="")
    if on is not None:
        print(f", op's first step (#{on}, view {view(a.depth + on + 1)}) {ms[on]:.2f} ms "
              f"(+{ms[on] - med:.2f} ms)", end="")
    if grows:
        print(f", other view growths {', '.join(f'#{i} {ms[i]:.2f}' for i in grows[:3])}", end="")
    print(f"; slowest {', '.join(f'#{i} {ms[i]:.2f}' for i in slow)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
