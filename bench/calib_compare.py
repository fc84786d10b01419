"""Calibrate once and store three kinds of levels side by side, for perplexity comparisons on the same capture:
unified ("0.50"), greedy by TEAL's block search ("greedy-0.50") and greedy by the old first-order proxy
("proxy-0.50"). The runtime accepts any "<mode>-<target>" level name, so `llama-sparse perplexity` (or
LLAMA_SPARSE=proxy-0.50 with the fork's llama-perplexity) evaluates each.

    .venv/bin/python bench/calib_compare.py MODEL.zz.gguf -o OUT.gguf --text FILES... [-n TOKENS] [-t THREADS]

Apart from the extra proxy levels this is `llama-sparse calibrate --mode both`, so its summary times are the
calibrate times.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import llama_sparse  # noqa: F401  (points llama_cpp at the fork)
import llama_sparse.calibrate as C


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", type=Path)
    ap.add_argument("-o", "--outfile", type=Path, required=True)
    ap.add_argument("--text", type=Path, nargs="+", required=True)
    ap.add_argument("--levels", default="0.25,0.4,0.5,0.65")
    ap.add_argument("-n", "--n-tokens", type=int, default=C.DEFAULT_N_TOKENS)
    ap.add_argument("-t", "--threads", type=int, default=None)
    args = ap.parse_args()

    proxy_levels = []
    level = C._level

    def level_and_proxy(cn, st, mode, target, greedy=None):  # type: ignore[no-untyped-def]
        lv = level(cn, st, mode, target, greedy)
        if mode == "greedy":
            p = level(cn, st, mode, target, None)  # greedy=None: the first-order proxy allocation
            p.name, p.mode = f"proxy-{target:.2f}", "proxy"
            proxy_levels.append(p)
        return lv

    write = C.write_levels
    C._level = level_and_proxy
    C.write_levels = lambda reader, src, out, levels: write(reader, src, out, list(levels) + proxy_levels)
    C.calibrate(args.model, output=args.outfile, texts=args.text,
                levels=[float(x) for x in args.levels.split(",")], n_tokens=args.n_tokens, threads=args.threads)
    for p in proxy_levels:
        print(f"    {p.name:>12}: target {p.target:.2f}, achieved {p.achieved:.3f} of weight bytes, "
              f"{p.achieved_columns:.3f} of columns, error mass dropped {p.rel_error:.4f}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
