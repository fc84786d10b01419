#!/usr/bin/env python3
"""Which activations to drop: TEAL's |x_j| >= t against WINA's |x_j|·||W[:, j]|| >= t (column norm of the
group's weights), at the same share of columns per layer and group, on a llama-architecture GGUF in numpy.

Thresholds are the per-(layer, group) quantiles of each criterion over dense forward passes of calibration
windows (Austen by default); perplexity is then taken over evaluation windows (WikiText-2 by default) with every
token of every layer masked, scoring each window's second half as llama-perplexity does. Blocks are the
calibrator's numpy reference (llama_sparse.greedy), weights dequantized from the file.

usage: bench/mask_criterion.py MODEL.gguf [--ctx 512] [--calib-windows 3] [--eval-windows 6] [--levels 0.25,0.4,0.5]
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

import llama_sparse  # noqa: F401  (llama_cpp on the fork's library, for the tokenizer)
import llama_cpp
from gguf import GGUFReader
from gguf.quants import dequantize
from llama_sparse import greedy as gr

GROUPS = ("qkv", "o", "gate_up", "down")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--calib", default="/work/shared/data/austen/emma.txt")
    ap.add_argument("--calib-skip", type=int, default=20000, help="characters of the calibration text to skip")
    ap.add_argument("--eval", default="/work/shared/data/wikitext-2-raw/wiki.test.raw")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--calib-windows", type=int, default=3)
    ap.add_argument("--eval-windows", type=int, default=6)
    ap.add_argument("--levels", default="0.25,0.4,0.5")
    args = ap.parse_args()

    vocab = llama_cpp.Llama(args.model, vocab_only=True, verbose=False)
    reader = GGUFReader(args.model)
    tensors = {t.name: t for t in reader.tensors}
    arch = reader.get_field("general.architecture").contents()
    spec = gr.read_spec(reader, int(llama_cpp.llama_model_rope_type(vocab.model)))
    n_layer = int(reader.get_field(f"{arch}.block_count").contents())
    weights = [gr.load_block(tensors, {}, il) for il in range(n_layer)]

    def mat(name: str) -> np.ndarray:
        t = tensors[name]
        w = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        return w.reshape(int(t.shape[1]), int(t.shape[0])) if len(t.shape) == 2 else w.reshape(-1)

    emb = mat("token_embd.weight")
    out_w = mat("output.weight") if "output.weight" in tensors else emb
    out_norm = mat("output_norm.weight")

    # column norms per input column of each group (BlockWeights are stored (n_in, n_out))
    def colnorm(*ws: np.ndarray) -> np.ndarray:
        return np.sqrt(sum(np.sum(np.square(w, dtype=np.float64), axis=1) for w in ws)).astype(np.float32)

    scales = [[colnorm(w.wq, w.wk, w.wv), colnorm(w.wo), colnorm(w.wgate, w.wup), colnorm(w.wdown)] for w in weights]

    # greedy.Block masks through the module's mask(); the subclass tells it which group is being masked
    state = {"layer": 0, "group": 0, "crit": "teal", "collect": None}

    def criterion(x: np.ndarray) -> np.ndarray:
        a = np.abs(x)
        return a * scales[state["layer"]][state["group"]] if state["crit"] == "wina" else a

    def mask(x: np.ndarray, t: float) -> np.ndarray:
        if state["collect"] is not None:
            state["collect"][(state["layer"], state["group"])].append(criterion(x).ravel())
        return x if t <= 0 else np.where(criterion(x) >= t, x, np.float32(0))

    gr.mask = mask

    class Block(gr.Block):
        def o_input(self, t):
            state["group"] = 0
            return super().o_input(t)

        def residual(self, o_in, t):
            state["group"] = 1
            return super().residual(o_in, t)

        def down_input(self, x2, t):
            state["group"] = 2
            return super().down_input(x2, t)

        def output(self, r, a, t):
            state["group"] = 3
            return super().output(r, a, t)

    def logits(ids: list[int], thr) -> np.ndarray:
        h = emb[np.asarray(ids)]
        n = h.shape[0]
        for il in range(n_layer):
            state["layer"] = il
            b = Block(spec, weights[il], [h], 1)
            b.queries, b.h_q = [np.arange(n)], h  # every row is a query: the block's full output
            h = b.forward(thr[il])["out"].astype(np.float32)
        return gr.rms_norm(h, out_norm, spec.rms_eps) @ out_w.T

    def windows(path: str, k: int, skip: int) -> list[list[int]]:
        text = Path(path).read_text(encoding="utf-8", errors="replace")[skip:]
        ids = vocab.tokenize(text[: 400 * args.ctx * k].encode(), add_bos=False)
        if len(ids) < k * (args.ctx - 1):
            raise SystemExit(f"{path} gives {len(ids)} tokens, fewer than {k} windows of {args.ctx}")
        return [[vocab.token_bos()] + ids[i * (args.ctx - 1):(i + 1) * (args.ctx - 1)] for i in range(k)]

    def perplexity(crit: str, thr) -> float:
        state["crit"] = crit
        nll, count = 0.0, 0
        for ids in evals:
            lg = logits(ids, thr).astype(np.float64)
            half = len(ids) // 2
            lg, tgt = lg[half - 1:-1], np.asarray(ids[half:])
            lg -= lg.max(axis=1, keepdims=True)
            nll -= float(np.sum(lg[np.arange(len(tgt)), tgt] - np.log(np.exp(lg).sum(axis=1))))
            count += len(tgt)
        return float(np.exp(nll / count))

    levels = [float(s) for s in args.levels.split(",")]
    calib = windows(args.calib, args.calib_windows, args.calib_skip)
    evals = windows(args.eval, args.eval_windows, 0)
    dense_thr = [[0.0] * len(GROUPS) for _ in range(n_layer)]
    thresholds = {}
    for crit in ("teal", "wina"):
        t0 = time.time()
        state["crit"] = crit
        state["collect"] = {(il, g): [] for il in range(n_layer) for g in range(len(GROUPS))}
        for ids in calib:
            logits(ids, dense_thr)
        vals = {k: np.concatenate(v) for k, v in state["collect"].items()}
        state["collect"] = None
        for s in levels:
            thresholds[(crit, s)] = [[float(np.quantile(vals[(il, g)], s)) for g in range(len(GROUPS))]
                                     for il in range(n_layer)]
        print(f"thresholds ({crit}): {len(calib)} windows of {args.ctx} from {args.calib}, {time.time() - t0:.1f} s", flush=True)

    t0 = time.time()
    dense = perplexity("teal", dense_thr)
    print(f"perplexity over {len(evals)} windows of {args.ctx} from {args.eval} (second halves scored)")
    print("| level | TEAL | vs dense | WINA | vs dense |")
    print("|---|---|---|---|---|")
    print(f"| dense | {dense:.4f} | | | |  ({time.time() - t0:.1f} s a pass)", flush=True)
    for s in levels:
        p = {c: perplexity(c, thresholds[(c, s)]) for c in ("teal", "wina")}
        print(f"| {s:.2f} | {p['teal']:.4f} | {(p['teal'] / dense - 1) * 100:+.2f} % | {p['wina']:.4f} | "
              f"{(p['wina'] / dense - 1) * 100:+.2f} % |", flush=True)


if __name__ == "__main__":
    main()
