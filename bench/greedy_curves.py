"""Why greedy helps (or not): per-group block-output error curves and the greedy allocation of a calibrated model.

    .venv/bin/python bench/greedy_curves.py MODEL.calib.gguf --text /work/shared/data/austen/persuasion.txt

On held-out text, block inputs of a few windows are sampled from our engine and every block is recomputed in
numpy (llama_sparse.greedy). Printed (markdown): the relative block-output error ||out - out_dense||^2 /
||out_dense - h||^2 when only one group is sparse (thresholds of the unified level at s), for s in 0.25..0.75,
averaged over blocks; the per-level error of unified and greedy; and greedy's mean per-group sparsity.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

import llama_sparse  # noqa: F401  (points llama_cpp at the fork)
import llama_cpp
from llama_sparse import _calib_native as cn
from llama_sparse import _native
from llama_sparse import greedy as gr
from llama_sparse import zigzag
from llama_sparse.calibrate import GROUP_NAMES, _Capture, _open_model, _run_texts, _sample_points, block_samples


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", type=Path)
    ap.add_argument("--text", type=Path, nargs="+", required=True)
    ap.add_argument("-n", "--n-tokens", type=int, default=2048)
    ap.add_argument("--windows", type=int, default=4)
    ap.add_argument("--queries", type=int, default=32)
    ap.add_argument("-t", "--threads", type=int, default=2)
    args = ap.parse_args()

    start = time.perf_counter()
    reader = _open_model(args.model)
    cap = _Capture(args.model, 512, args.threads, 0)
    try:
        cap.sample(args.windows, 512, _sample_points())
        _run_texts(cap, [p.read_text(errors="replace") for p in args.text], args.n_tokens, 512, "", False, print,
                   sample_slots=args.windows, sample_rows=512)
        n_layer = cn.llama_sparse_calib_n_layer(cap.calib)
        spec = gr.read_spec(reader, int(llama_cpp.llama_model_rope_type(cap.model)))
        tensors = {t.name: t for t in reader.tensors}
        zz = zigzag.read_zigzag_info(reader)
        names = [_native.llama_sparse_model_level_name(cap.model, i).decode()
                 for i in range(_native.llama_sparse_model_n_levels(cap.model))]
        idx = {n: i for i, n in enumerate(names)}
        blas = gr.blas_threads(args.threads)
        blas.__enter__()
        unified = [n for n in names if not n.startswith("greedy")]
        curve_levels = [n for n in unified if n in ("0.25", "0.50", "0.65")] + (["0.75"] if "0.75" in unified else [])
        curves = {(g, n): np.zeros(n_layer) for g in range(4) for n in curve_levels}
        level_err = {n: np.zeros(n_layer) for n in names}
        alloc = {n: np.zeros((n_layer, 4)) for n in names if n.startswith("greedy")}
        for il in range(n_layer):
            hs, _ = block_samples(cn, cap.calib, il, args.windows)
            block = gr.Block(spec, gr.load_block(tensors, zz, il), hs, args.queries)
            ref = block.forward([0.0] * 4)

            def thr(name: str) -> list[float]:
                return [max(0.0, float(_native.llama_sparse_model_threshold(cap.model, idx[name], il, g))) for g in range(4)]

            for n in names:
                level_err[n][il] = gr.block_error(block, ref, thr(n))
            for n in curve_levels:
                t = thr(n)
                for g in range(4):
                    only = [0.0] * 4
                    only[g] = t[g]
                    curves[(g, n)][il] = gr.block_error(block, ref, only)
            for n in alloc:
                t = thr(n)
                for g in range(4):
                    alloc[n][il, g] = cn.sparsity_at(cap.calib, il, g, t[g])[0] if t[g] > 0 else 0.0
        w = np.array([[cn.llama_sparse_calib_weight_bytes(cap.calib, il, g) for g in range(4)] for il in range(n_layer)], float)
    finally:
        cap.close()

    print(f"Held-out text: {', '.join(p.name for p in args.text)}, {args.windows} windows x {args.queries} query positions "
          f"per block; {time.perf_counter() - start:.0f} s.\n")
    print("Block-output error when only one group is sparse (unified level's threshold), mean over blocks:\n")
    print("| group | share of block bytes | " + " | ".join(f"s = {n}" for n in curve_levels) + " |")
    print("|---|---|" + "---|" * len(curve_levels))
    share = (w / w.sum(axis=1, keepdims=True)).mean(axis=0)
    for g in range(4):
        print(f"| {GROUP_NAMES[g]} | {share[g]:.3f} | " + " | ".join(f"{curves[(g, n)].mean():.4f}" for n in curve_levels) + " |")
    print("\nPer level, block-output error (mean over blocks; all groups sparse) and greedy's per-group sparsity "
          "(measured on the held-out histograms, mean over blocks):\n")
    print("| level | block error | " + " | ".join(GROUP_NAMES) + " | worst block (error) |")
    print("|---|---|" + "---|" * 5)
    for n in names:
        a = alloc.get(n)
        cols = " | ".join(f"{a[:, g].mean():.3f}" for g in range(4)) if a is not None else " | ".join(["(= level)"] * 4)
        worst = int(np.argmax(level_err[n]))
        print(f"| {n} | {level_err[n].mean():.4f} | {cols} | {worst} ({level_err[n][worst]:.4f}) |")
    for n in ("0.50", "greedy-0.50"):
        if n in level_err:
            print(f"\nPer-block error at {n}: " + ", ".join(f"{e:.3f}" for e in level_err[n]))
    if "greedy-0.50" in alloc:
        print("\nGreedy-0.50 per-block sparsity (qkv / o / gate_up / down):\n")
        print("| block | " + " | ".join(GROUP_NAMES) + " |\n|---|---|---|---|---|")
        for il in range(n_layer):
            print(f"| {il} | " + " | ".join(f"{alloc['greedy-0.50'][il, g]:.2f}" for g in range(4)) + " |")


if __name__ == "__main__":
    main()
