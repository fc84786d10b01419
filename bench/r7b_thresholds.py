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

Calibrated levels can also move between two files of the same shapes (the random generator is seeded, so a
model made and calibrated on one machine stands for the same model made on another):

  bench/r7b_thresholds.py calibrated.gguf --save-levels levels.json
  bench/r7b_thresholds.py in.zz.gguf -o out.gguf --levels-from levels.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np


def save_levels(reader, path: Path, n_layer: int, out: Path) -> int:
    from llama_sparse import zigzag

    def field(key: str):
        f = reader.get_field(key)
        if f is None:
            sys.exit(f"{path} has no {key}: calibrate it first (llama-sparse calibrate)")
        return f.contents()

    levels = []
    for name, target in zip(field(zigzag.KEY_LEVELS), field(zigzag.KEY_LEVEL_TARGETS)):
        thr = [float(v) for v in field(zigzag.KEY_THRESHOLDS_FMT.format(level=name))]
        levels.append({"name": name, "target": float(target), "thresholds": thr})
    out.write_text(json.dumps({"source": str(path), "n_layer": n_layer, "levels": levels}) + "\n")
    print(f"{len(levels)} levels of {path} ({n_layer} layers) written to {out}")
    return 0


def load_levels(path: Path, n_layer: int):
    from llama_sparse.calibrate import LevelResult

    try:
        doc = json.loads(path.read_text())
        levels = doc["levels"]
        if int(doc["n_layer"]) != n_layer:
            sys.exit(f"{path} holds levels for {doc['n_layer']} layers, the model has {n_layer}")
        out = []
        for lv in levels:
            thr = np.asarray(lv["thresholds"], np.float32)
            if thr.size != 4*n_layer or not np.all(np.isfinite(thr)):
                sys.exit(f"{path}: level {lv['name']} has {thr.size} thresholds (want {4*n_layer} finite values)")
            out.append(LevelResult(name=str(lv["name"]), mode="greedy" if str(lv["name"]).startswith("greedy") else "unified", target=float(lv["target"]),
                                   achieved=float("nan"), achieved_columns=float("nan"), rel_error=float("nan"),
                                   thresholds=thr.reshape(n_layer, 4),
                                   group_sparsity=np.full((n_layer, 4), float("nan"), np.float32)))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        sys.exit(f"cannot read levels from {path}: {exc}")
    if not out:
        sys.exit(f"{path} holds no levels")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", type=Path)
    ap.add_argument("-o", "--output", type=Path, default=None)
    ap.add_argument("--levels", default="0.25,0.4,0.5,0.65")
    ap.add_argument("--tokens", type=int, default=8, help="random tokens decoded per level to measure the skipped share")
    ap.add_argument("--thresholds", default=None,
                    help="one threshold per level, e.g. from an earlier run on a smaller file of the same shapes: "
                         "written as they are, without loading the model (nothing is measured)")
    ap.add_argument("--save-levels", type=Path, default=None, metavar="JSON",
                    help="write the levels of MODEL (a calibrated file) to JSON and stop")
    ap.add_argument("--levels-from", type=Path, default=None, metavar="JSON",
                    help="write the levels saved by --save-levels (same block count) instead of measuring")
    a = ap.parse_args()
    if a.save_levels is None and a.output is None:
        ap.error("-o/--output is required")

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
    if a.save_levels is not None:
        return save_levels(reader, a.model, n_layer, a.save_levels)
    if a.levels_from is not None:
        levels = load_levels(a.levels_from, n_layer)
        write_levels(reader, a.model, a.output, levels)
        for lv in levels:
            print(f"level {lv.name}: target {lv.target:.2f}, thresholds from {a.levels_from} "
                  f"(median {float(np.median(lv.thresholds)):.4f}; not measured on this file)")
        return 0
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
