#!/usr/bin/env python3
"""Write sparsity levels into a random-weight zigzag GGUF from activation quantiles, without text.

  bench/r7b_thresholds.py in.zz.gguf -o out.gguf [--levels 0.25,0.4,0.5,0.65]

Prefer `llama-sparse calibrate MODEL --random-tokens 0 --mode unified` (bench/cpu_e2e.sh, device.sh calib): it
gives every group its own threshold, so a level skips its share of every matmul's weight bytes. Here one threshold
serves every group and layer: a grid of candidate thresholds is written as levels, the share of matmul input
columns each skips is measured by decoding random tokens (Llama.sparse_stats), and per target the threshold whose
share is nearest (interpolated on the grid) is written. On the random 7B-shaped model that share is not the share
of weight bytes: the q/k/v and gate/up inputs (2/3 of the bytes) are wider-spread than the attn_output and
ffn_down inputs, so "0.50" skips ~1/3 of q/k/v and gate/up and far more of the rest, and decodes slower than a
calibrated 0.50 (bench/results/cpu_e2e-r7b-2026-11-25b-calibrated-32l.md). Kept for the uncalibrated device step.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", type=Path)
    ap.add_argument("-o", "--output", type=Path, required=True)
    ap.add_argument("--levels", default="0.25,0.4,0.5,0.65")
    ap.add_argument("--tokens", type=int, default=8, help="random tokens decoded per level to measure the skipped share")
    ap.add_argument("--thresholds", default=None,
                    help="one threshold per level, e.g. from an earlier run on a smaller file of the same shapes: "
                         "written as they are, without loading the model (nothing is measured)")
    a = ap.parse_args()

    from gguf import GGUFReader

    from llama_sparse.calibrate import LevelResult, write_levels

    import llama_sparse

    def level(name: str, target: float, t: float, n_layer: int) -> LevelResult:
        return LevelResult(name=name, mode="unified", target=target, achieved=float("nan"),
                           achieved_columns=float("nan"), rel_error=float("nan"),
                           thresholds=np.full((n_layer, 4), t, np.float32),
                           group_sparsity=np.full((n_layer, 4), float("nan"), np.float32))

    def skipped(path: Path, names: list[str]) -> list[float]:
        rng = np.random.default_rng(0)
        toks = [int(v) for v in rng.integers(3, 1000, a.tokens)]
        llm = llama_sparse.Llama(str(path), n_ctx=64, n_threads=2, verbose=False)
        out = []
        for nm in names:
            llm.set_sparsity(nm)
            llm.reset()
            llm.reset_stats()
            for tok in toks:
                llm.eval([tok])
            out.append(llm.sparse_stats()["skipped"])
        del llm
        return out

    reader = GGUFReader(a.model)
    n_layer = int(next(f.contents() for k, f in reader.fields.items() if k.endswith(".block_count")))
    targets = [float(v) for v in a.levels.split(",")]
    if a.thresholds is not None:
        chosen = [float(v) for v in a.thresholds.split(",")]
        if len(chosen) != len(targets):
            ap.error(f"--thresholds has {len(chosen)} values for {len(targets)} levels")
        write_levels(reader, a.model, a.output, [level(f"{s:.2f}", s, t, n_layer) for s, t in zip(targets, chosen)])
        for s, t in zip(targets, chosen):
            print(f"level {s:.2f}: threshold {t:.4f} (every group; given, not measured on this file)")
        return 0
    grid = np.round(np.linspace(0.05, 1.5, 30), 4)
    probe = a.output.with_suffix(".probe.gguf")  # level targets of the probe are placeholders in (0, 1)
    write_levels(reader, a.model, probe, [level(f"{g:.4f}", (i + 1)/(len(grid) + 1), float(g), n_layer) for i, g in enumerate(grid)])
    share = np.array(skipped(probe, [f"{g:.4f}" for g in grid]))
    probe.unlink()
    chosen = [float(np.interp(s, share, grid)) for s in targets]
    write_levels(reader, a.model, a.output, [level(f"{s:.2f}", s, t, n_layer) for s, t in zip(targets, chosen)])
    del reader
    for s, t, got in zip(targets, chosen, skipped(a.output, [f"{s:.2f}" for s in targets])):
        print(f"level {s:.2f}: threshold {t:.4f} (every group), columns skipped decoding {a.tokens} random tokens: {got:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
