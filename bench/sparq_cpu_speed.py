"""CPU decode speed at depth, dense against SparQ, in one process and one prefill (llama_sparse.Llama, flash attn on).

The context is prefilled densely to the first depth D; then, for each setting in turn, the cache is cut back to D,
SparQ is set, 2 warm-up tokens are decoded (the first SparQ step after a pause rebuilds the transposed K), and the
next --gen tokens are timed one llama_decode each. Settings alternate within each of --rounds rounds (dense, c1, c2,
..., dense, c1, ...) so that load drifts hit all of them alike; the report gives each round and the median. Then the
prefill is extended to the next depth. llama-bench -d would redo the whole prefill for every setting (a separate
process per LLAMA_SPARQ value); this measures the same decode steps with one prefill per model.

Compression c (the paper's attention data per KV head and step over dense's 2*S*d_h, c = r/(2*d_h) + k/D) is
turned into (r, k) by bench/sparq_needle.py's split_rk: the share --split of c goes to the r term (default
sparq_needle.DEFAULT_SPLIT = 0.5, the even split r = d_h*c, k = D*c/2), the exact rest to k. --kt k,q8_0 runs
each compression with the f16 and the 8-bit transposed K (names ",q8"; sparq_needle.split_rk prices q8_0's r term).

usage: python bench/sparq_cpu_speed.py MODEL.gguf [--depths 4096,8192] [--comp 0.5,0.25,0.125] [--split F] [--gen 32]
       [--rounds 2] [--threads 2] [--head-dim 64] [--kt k[,q8_0]] [--out results.json]
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

from sparq_needle import DEFAULT_SPLIT, settings_for  # bench/ is on sys.path when this file runs as a script

AUSTEN = Path("/work/shared/data/austen/emma.txt")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", type=Path)
    ap.add_argument("--depths", default="4096,8192")
    ap.add_argument("--comp", default="0.5,0.25,0.125")
    ap.add_argument("--split", type=float, default=DEFAULT_SPLIT, help="share of c on the r term (0.5 = even)")
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--kt", default="k", help="transposed-K storage(s), comma-separated: k, q8_0")
    ap.add_argument("--random-tokens", action="store_true", help="feed token ids, not text (dummy vocabularies)")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()

    import numpy as np

    import llama_sparse

    depths = [int(x) for x in a.depths.split(",")]
    comps = [float(x) for x in a.comp.split(",")]
    need = max(depths) + a.gen + 8
    llm = llama_sparse.Llama(a.model, n_ctx=need + 64, n_batch=512, n_threads=a.threads, n_threads_batch=a.threads,
                             flash_attn=True, verbose=False)
    if a.random_tokens:
        toks = np.random.default_rng(0).integers(3, llm.n_vocab(), need).tolist()
    else:
        toks = llm.tokenize(AUSTEN.read_text(encoding="utf-8", errors="replace").encode(), add_bos=False)[:need]
    print(f"# {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC {platform.machine()} model {a.model} "
          f"threads {a.threads} load {open('/proc/loadavg').read().split()[:3]}", flush=True)

    results = []
    done = 0
    for D in depths:
        t = time.time()
        llm.set_sparq(None)
        llm.n_tokens = done
        llm.eval(toks[done:D])
        done = D
        print(f"# prefill to {D}: {time.time() - t:.1f}s", flush=True)
        settings = [(name, sp) for name, _, sp in settings_for(D, comps, [a.split], [False], a.kt.split(","), a.head_dim)]
        times: dict[str, list[float]] = {n: [] for n, _ in settings}
        for rnd in range(a.rounds):
            for name, sp in settings:
                llm.set_sparq(sp)
                llm.n_tokens = D
                for t in toks[D:D + 2]:  # warm-up
                    llm.eval([t])
                t0 = time.perf_counter()
                for t in toks[D + 2:D + 2 + a.gen]:
                    llm.eval([t])
                dt = time.perf_counter() - t0
                times[name].append(a.gen / dt)
                print(f"depth {D} round {rnd} {name:8s} {a.gen / dt:8.2f} tok/s  load "
                      f"{open('/proc/loadavg').read().split()[0]}", flush=True)
        llm.set_sparq(None)
        llm.n_tokens = D
        base = statistics.median(times["dense"])
        for name, sp in settings:
            med = statistics.median(times[name])
            results.append({"depth": D, "setting": name, "r": sp.r if sp else None, "k": sp.k if sp else None,
                            "kt": sp.kt if sp else None,
                            "tok_s": times[name], "median_tok_s": med, "speedup": med / base})
            print(f"depth {D} {name:8s} r={sp.r if sp else '-'} k={sp.k if sp else '-'} median {med:8.2f} tok/s "
                  f"x{med / base:.2f} vs dense (rounds: {', '.join(f'{x:.2f}' for x in times[name])})", flush=True)
    print(f"# end load {open('/proc/loadavg').read().split()[:3]}")
    if a.out:
        a.out.write_text(json.dumps({"model": str(a.model), "threads": a.threads, "gen": a.gen, "rows": results},
                                    indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
