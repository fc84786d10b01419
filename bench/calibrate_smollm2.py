"""Calibration time and achieved sparsity for SmolLM2-135M (zigzag q8_0): Austen text and model-generated text.

    .venv/bin/python bench/calibrate_smollm2.py [--tokens 16384] [--type q8_0] [--skip-generated] > bench/results/calibrate-smollm2.md

Calibrates on five Austen novels (Persuasion held out), then measures on Persuasion: the share of
weight bytes / columns each level skips in dense activations (measure_sparsity), and the share of
columns the runtime skips in batch-1 decode (Llama.sparse_stats()). Then calibrates with no text
(the model writes its own) and measures that file the same way.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import llama_sparse  # noqa: F401  (first: points llama_cpp at the fork)
from llama_sparse.calibrate import calibrate, measure_sparsity
from llama_sparse.cli import cache_dir, default_model
from llama_sparse.convert import convert

AUSTEN = Path(os.environ.get("LLAMA_SPARSE_AUSTEN", "/work/shared/data/austen"))
HELDOUT = "persuasion.txt"


def runtime_skipped(path: Path, level: str, prompt: str, n: int) -> tuple[float, float]:
    llm = llama_sparse.Llama(path, sparsity=level, n_ctx=2048, n_batch=512, verbose=False)
    llm.reset_stats()
    llm.create_completion(prompt, max_tokens=n, temperature=0.0)
    s, p = llm.sparse_stats(), llm.perf()
    llm.close()
    return s["skipped"], p["gen_tps"]


def report(path: Path, summary, heldout_text: str, n_decode: int) -> None:
    measured = measure_sparsity(path, [AUSTEN / HELDOUT], n_tokens=4096)
    prompt = heldout_text[40000:41500]
    print("| level | target | calib. bytes | calib. cols | held-out bytes | held-out cols | runtime cols (batch-1 decode) | decode tok/s |")
    print("|---|---|---|---|---|---|---|---|")
    for lv in summary.levels:
        hb, hc = measured[lv.name]
        rt, tps = runtime_skipped(path, lv.name, prompt, n_decode)
        print(f"| {lv.name} | {lv.target:.2f} | {lv.achieved:.3f} | {lv.achieved_columns:.3f} | {hb:.3f} | {hc:.3f} "
              f"| {rt:.3f} | {tps:.1f} |", flush=True)
    print()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--type", default="q8_0")
    ap.add_argument("--decode", type=int, default=64, help="decode tokens per runtime measurement")
    ap.add_argument("--skip-generated", action="store_true")
    args = ap.parse_args()

    zz = cache_dir() / f"SmolLM2-135M-Instruct.zz-{args.type}.gguf"
    if not zz.exists():
        convert(default_model(), zz, args.type, progress=False)
    out_dir = cache_dir() / "bench-calibrate"
    out_dir.mkdir(exist_ok=True)
    books = sorted(p for p in AUSTEN.glob("*.txt") if p.name != HELDOUT)
    heldout = (AUSTEN / HELDOUT).read_text(encoding="utf-8", errors="replace")
    quiet = lambda msg: None  # noqa: E731

    print(f"# Calibration of SmolLM2-135M-Instruct, zigzag {args.type}\n")
    print(f"Command: `.venv/bin/python bench/calibrate_smollm2.py --tokens {args.tokens} --type {args.type}`; "
          f"{platform.machine()}, {os.cpu_count()} cores, load average at start "
          f"{os.getloadavg()[0]:.1f} (a shared machine: times are indicative); {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.\n")

    t0 = time.perf_counter()
    s = calibrate(zz, output=out_dir / "austen.gguf", texts=books, n_tokens=args.tokens, progress=True, log=quiet)
    wall = time.perf_counter() - t0
    print(f"## Austen: {s.n_tokens} tokens from {len(books)} novels (Persuasion held out)\n")
    print(f"Calibration {wall:.1f} s wall: capture {s.seconds_capture:.1f} s "
          f"({s.n_tokens / s.seconds_capture:.0f} tok/s including the callback), {s.n_chunks} windows of 512.\n")
    report(out_dir / "austen.gguf", s, heldout, args.decode)

    if not args.skip_generated:
        t0 = time.perf_counter()
        g = calibrate(zz, output=out_dir / "generated.gguf", progress=True, log=quiet)
        wall = time.perf_counter() - t0
        print(f"## No text: the model writes its own ({g.n_tokens} tokens)\n")
        print(f"Calibration {wall:.1f} s wall: generating text {g.seconds_generate:.1f} s, capture {g.seconds_capture:.1f} s.\n")
        report(out_dir / "generated.gguf", g, heldout, args.decode)
    print("calib. = on the calibration histograms; held-out = dense activations on Persuasion (4096 tokens); "
          "runtime = Llama.sparse_stats()['skipped'] over batch-1 decode after a Persuasion prompt. "
          "Greedy targets the share of weight bytes, so its column share differs from the target.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
