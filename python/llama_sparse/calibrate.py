"""`llama-sparse calibrate`: TEAL threshold calibration of a zigzag GGUF (docs/calibration.md).

The model runs densely on our own engine over calibration text, with an eval callback
(src/llama-sparse-calib.cpp) that folds the input of every zigzag matmul into per-(layer, group)
histograms of |x| and of the error mass x_j^2 ||W[:, j]||^2. Thresholds per level are read off those
histograms: `unified` uses one sparsity everywhere, `greedy` runs TEAL's block-wise greedy search
(llama_sparse.greedy): per block, the group whose sparsity step adds the least error to the recomputed
block output is raised, on block inputs sampled by the same callback. The result is a new GGUF with
every key and tensor of the input and the llama_sparse.levels / level_targets / thresholds.* keys
(docs/format.md), written to a temp file next to the output and renamed when complete.
"""
from __future__ import annotations

import argparse
import errno
import math
import os
import shutil
import sys
import tempfile
import time
import types
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence, Union

import numpy as np

from ._progress import Progress

GROUP_NAMES = ("qkv", "o", "gate_up", "down")
MODES = ("unified", "greedy")
DEFAULT_LEVELS = (0.25, 0.4, 0.5, 0.65)
DEFAULT_N_TOKENS = 16384
GREEDY_STEP = 0.025        # proxy fallback: per-group sparsity step
GREEDY_MAX_SPARSITY = 0.99
GREEDY_INCREMENT = 0.025   # block search: the block's byte-weighted sparsity rises this much per step
GREEDY_WINDOWS = 4         # calibration windows whose block inputs are kept for the search
GREEDY_QUERIES = 16        # query positions per window (last quarter) where the block error is measured
GREEDY_SAMPLE_MIB = 512    # memory cap of the kept rows; fewer windows are kept above it

# neutral prompts for the default calibration text: the model writes its own (chat-style) text
DEFAULT_PROMPTS = (
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain how a bicycle works, from the pedals to the wheels.",
    "Describe a busy market in a small town on a Saturday morning.",
    "What are some good habits for learning a new language? Give examples.",
    "Write a friendly letter to a neighbour inviting them to a garden party.",
    "Summarize the water cycle for a curious ten-year-old.",
    "Give step-by-step instructions for baking a loaf of bread at home.",
    "Write a Python function that counts the words in a text file, and explain it.",
)
DEFAULT_GEN_TOKENS = 320

TextSource = Union[str, "os.PathLike[str]"]


class CalibrationError(ValueError):
    """Calibration failed; the message names the file and the fix. No output file is left behind."""


@dataclass
class LevelResult:
    name:             str    # as stored: "0.50" or "greedy-0.50"
    mode:             str    # "unified" or "greedy"
    target:           float
    achieved:         float  # share of weight bytes skipped, measured on the calibration histograms
    achieved_columns: float  # share of matmul input columns skipped (what Llama.sparse_stats() counts)
    rel_error:        float  # share of the error mass dropped, averaged over (layer, group)
    thresholds:       np.ndarray = field(repr=False)  # [n_layer, 4]
    group_sparsity:   np.ndarray = field(repr=False)  # [n_layer, 4], measured
    block_error:      float = float("nan")  # mean over blocks of the recomputed block-output error (greedy.py)


@dataclass
class CalibrationSummary:
    source:           Path
    output:           Path
    text_source:      str     # "files", "texts", "generated" or "random token ids (seed N)"
    n_tokens:         int     # tokens run through the model (per capture point)
    n_chunks:         int
    levels:           list[LevelResult] = field(default_factory=list)
    seconds_generate: float = 0.0
    seconds_capture:  float = 0.0
    seconds_greedy:   float = 0.0
    seconds:          float = 0.0
    greedy_method:    str = ""    # "block search" or why the first-order proxy was used instead

    @property
    def level_names(self) -> list[str]:
        return [lv.name for lv in self.levels]

    def report(self) -> str:
        gen = f", generating text {self.seconds_generate:.1f} s" if self.text_source == "generated" else ""
        greedy = f", greedy {self.seconds_greedy:.1f} s" if self.greedy_method else ""
        lines = [
            f"calibrated {self.source} -> {self.output} in {self.seconds:.1f} s "
            f"(capture {self.seconds_capture:.1f} s{greedy}{gen})",
            f"  text:   {self.n_tokens} tokens in {self.n_chunks} window{'s' if self.n_chunks != 1 else ''} "
            f"of {self.text_source}",
        ]
        if self.greedy_method:
            lines.append(f"  greedy: {self.greedy_method}")
        lines.append(f"  levels: {len(self.levels)} written")
        for lv in self.levels:
            block = "" if math.isnan(lv.block_error) else f", block-output error {lv.block_error:.4f}"
            lines.append(f"    {lv.name:>12}: target {lv.target:.2f}, achieved {lv.achieved:.3f} of weight bytes, "
                         f"{lv.achieved_columns:.3f} of columns, error mass dropped {lv.rel_error:.4f}{block}")
        return "\n".join(lines)


def _default_log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------------
# checks


def level_name(mode: str, target: float) -> str:
    return f"{target:.2f}" if mode == "unified" else f"{mode}-{target:.2f}"


def _check_levels(levels: Sequence[float], modes: Sequence[str]) -> tuple[list[float], list[str]]:
    if isinstance(modes, str):
        modes = [modes]
    modes = list(dict.fromkeys(modes))
    if not modes:
        raise CalibrationError("no calibration mode given; use unified, greedy or both")
    for m in modes:
        if m not in MODES:
            raise CalibrationError(f"unknown calibration mode {m!r}; use one of {', '.join(MODES)}")
    if isinstance(levels, (int, float)):
        levels = [levels]
    out: list[float] = []
    for lv in levels:
        try:
            t = float(lv)
        except (TypeError, ValueError):
            raise CalibrationError(f"sparsity level {lv!r} is not a number; pass levels like 0.25,0.5") from None
        if isinstance(lv, bool) or not 0.0 < t < 1.0:
            raise CalibrationError(f"sparsity level {lv!r} is outside (0, 1); pass levels like 0.25,0.5")
        if not 0.0 < round(t, 2) < 1.0:  # levels are named and matched at 2 decimals
            raise CalibrationError(f"sparsity level {lv!r} would be stored as {t:.2f}; pass levels from 0.01 to 0.99")
        if abs(t - round(t, 2)) > 1e-9:
            raise CalibrationError(f"sparsity level {lv!r} has more than two decimals; levels are named and chosen "
                                   f"at two (it would be {t:.2f}), so pass {t:.2f} or another two-decimal level")
        if f"{t:.2f}" in {f"{o:.2f}" for o in out}:
            raise CalibrationError(f"sparsity level {t:.2f} is given twice")
        out.append(t)
    if not out:
        raise CalibrationError("no sparsity levels given; pass levels like 0.25,0.4,0.5,0.65")
    return sorted(out), modes


def _check_model_path(path: Path) -> None:
    if not path.exists():
        raise CalibrationError(f"model file {path} does not exist; pass a zigzag .gguf made by `llama-sparse convert`")
    if not path.is_file():
        raise CalibrationError(f"model path {path} is not a file; pass a zigzag .gguf made by `llama-sparse convert`")


def _open_model(path: Path):
    """GGUFReader of a zigzag GGUF, or CalibrationError saying what the file is instead."""
    from . import zigzag

    _check_model_path(path)
    reader = zigzag.open_gguf(path, CalibrationError,
                              bad_magic_hint="pass a zigzag .gguf made by `llama-sparse convert`")
    version = reader.get_field(zigzag.KEY_FORMAT_VERSION)
    if version is None:
        raise CalibrationError(f"{path} has no {zigzag.KEY_FORMAT_VERSION} key, so it is not a zigzag model; "
                               f"convert it first with `llama-sparse convert {path.name} -o model.zz.gguf`")
    if int(version.contents()) != zigzag.FORMAT_VERSION:
        raise CalibrationError(f"{path} is zigzag format version {int(version.contents())}; this build reads version "
                               f"{zigzag.FORMAT_VERSION}, convert the original model again")
    names = reader.get_field(zigzag.KEY_ZIGZAG_TENSORS)
    if names is None or not names.contents():
        raise CalibrationError(f"{path} lists no zigzag tensors ({zigzag.KEY_ZIGZAG_TENSORS}); "
                               f"convert the original model again with `llama-sparse convert`")
    arch = reader.get_field("general.architecture")
    blocks = reader.get_field(f"{arch.contents()}.block_count") if arch is not None else None
    if blocks is None:
        raise CalibrationError(f"{path} has no general.architecture / block_count keys; it is not a llama.cpp model file")
    return reader


def _check_output(out: Path, src: Path, in_place: bool) -> None:
    if out.exists() and out.is_dir():
        raise CalibrationError(f"output {out} is a directory; pass a file name such as {out / 'model.calib.gguf'}")
    if (out.exists() or out.is_symlink()) and not out.is_file():
        # the result is renamed over the output: never over a device, a FIFO or a socket
        raise CalibrationError(f"output {out} exists and is not a regular file; pass another -o path")
    if out.exists() and out.resolve() == src.resolve() and not in_place:
        raise CalibrationError(f"output {out} is the input file; pass --in-place (in_place=True) to overwrite it")
    parent = out.parent
    if not parent.is_dir():
        raise CalibrationError(f"output directory {parent} does not exist; create it or pass another -o path")
    # a probe file, not os.access: root passes access checks on directories it still cannot write (/proc, ro mounts)
    try:
        fd, probe = tempfile.mkstemp(dir=parent, prefix=f".{out.name}.", suffix=".probe")
    except OSError as exc:
        raise CalibrationError(f"output directory {parent} is not writable ({exc.strerror}); "
                               f"pass a -o path in a directory you can write") from exc
    os.close(fd)
    os.unlink(probe)
    if out.exists() and not os.access(out, os.W_OK):
        raise CalibrationError(f"output file {out} exists and is not writable; remove it or pass another -o path")
    # the output is the model plus a few KiB of thresholds, written whole beside any old file before the rename:
    # say so now, not after minutes of calibration
    needed = src.stat().st_size + (16 << 20)
    free = shutil.disk_usage(parent).free
    if free < needed:
        raise CalibrationError(f"not enough disk space in {parent} for {out.name}: needs {needed / 2**30:.2f} GiB, "
                               f"{free / 2**30:.2f} GiB free; free some space or pass a -o path on another disk")


# --------------------------------------------------------------------------------------------------
# calibration text


def _read_utf8(p: Path) -> str:
    """A text file's contents (stray bad bytes replaced); UnicodeDecodeError for a binary file, such as a model
    passed as text: NUL bytes, or more than 1 % of it not UTF-8."""
    data = p.read_bytes()
    nul = data.find(b"\0", 0, 1 << 16)
    text = data.decode("utf-8", errors="replace")
    if nul >= 0 or text.count("\ufffd") > len(text) // 100:
        at = nul if nul >= 0 else 0
        raise UnicodeDecodeError("utf-8", data[:at + 1], at, at + 1, "a binary file")
    return text


def _read_texts(texts: Union[TextSource, Sequence[TextSource]],
                output: Optional[Path] = None) -> tuple[list[str], str]:
    """Path-likes are files to read, plain str are text; a file that is `output` (to be written) is refused."""
    if isinstance(texts, (str, os.PathLike)):
        texts = [texts]
    out: list[str] = []
    kinds = set()
    for t in texts:
        if isinstance(t, os.PathLike):
            p = Path(t).expanduser()
            if not p.exists():
                raise CalibrationError(f"calibration text file {p} does not exist; pass existing --text files")
            if not p.is_file():
                raise CalibrationError(f"calibration text {p} is not a file; pass text files to --text")
            if output is not None and output.exists() and os.path.samefile(p, output):
                raise CalibrationError(f"output {output} is the calibration text {t}; pass another -o path")
            try:
                out.append(_read_utf8(p))
            except OSError as exc:
                raise CalibrationError(f"cannot read calibration text {p}: {exc.strerror}") from exc
            except UnicodeDecodeError as exc:
                raise CalibrationError(f"calibration text {p} is not UTF-8 text (byte {exc.start}); "
                                       "pass plain text files") from exc
            kinds.add("files")
        elif isinstance(t, str):
            out.append(t)
            kinds.add("texts")
        else:
            raise CalibrationError(f"calibration texts must be str (text) or paths (files), not {type(t).__name__}")
    if not any(s.strip() for s in out):
        raise CalibrationError("the calibration texts are empty; pass files with text in them")
    return out, "+".join(sorted(kinds))


_TOKENIZER_HINT = ("the model's tokenizer must cover the calibration text (a dummy vocabulary like "
                   "bench/make_random_gguf.py's has no byte tokens to fall back on; for speed tests of such "
                   "a model, calibrate on random token ids: --random-tokens SEED)")


def generate_texts(model: Path, *, prompts: Optional[Sequence[str]] = None, max_tokens: Optional[int] = None,
                   threads: Optional[int] = None, n_gpu_layers: int = 0, progress: bool = True,
                   log: Callable[[str], None] = _default_log) -> list[str]:
    """Text the model writes itself from neutral prompts (dense, low temperature, fixed seeds).
    prompts / max_tokens default to DEFAULT_PROMPTS / DEFAULT_GEN_TOKENS."""
    from ._native import TokenizeError
    from .llama import Llama

    prompts = DEFAULT_PROMPTS if prompts is None else prompts
    max_tokens = DEFAULT_GEN_TOKENS if max_tokens is None else max_tokens

    with _dense_env(ignore_levels=True):
        llm = Llama(model, n_ctx=max_tokens + 256, n_threads=threads, n_threads_batch=threads or _default_threads(),
                    n_gpu_layers=n_gpu_layers, verbose=False, seed=1234)
    bar = Progress(len(prompts) * max_tokens, "generating calibration text", progress, log)
    out = []
    try:
        for i, prompt in enumerate(prompts):
            try:
                res = llm.create_chat_completion(messages=[{"role": "user", "content": prompt}],
                                                 max_tokens=max_tokens, temperature=0.3, top_k=40, top_p=0.95,
                                                 repeat_penalty=1.1, seed=1234 + i)
            except TokenizeError as exc:
                raise CalibrationError(f"cannot generate calibration text: {exc}; {_TOKENIZER_HINT}") from None
            reply = res["choices"][0]["message"]["content"] or ""
            out.append(f"{prompt}\n\n{reply}")
            bar.update(max_tokens)
    finally:
        bar.close()
        llm.close()
    return out


@contextmanager
def _dense_env(ignore_levels: bool = False) -> Iterator[None]:
    """Contexts read LLAMA_SPARSE / LLAMA_SPARSE_EMULATE when created; calibration must run dense. With
    ignore_levels, models loaded inside skip the file's calibration (LLAMA_SPARSE_IGNORE_LEVELS): calibrate
    replaces it, so a broken one must not stop it."""
    keys = ("LLAMA_SPARSE", "LLAMA_SPARSE_EMULATE", "LLAMA_SPARSE_IGNORE_LEVELS")
    saved = {k: os.environ.pop(k) for k in keys if k in os.environ}
    if ignore_levels:
        os.environ["LLAMA_SPARSE_IGNORE_LEVELS"] = "1"
    try:
        yield
    finally:
        os.environ.pop("LLAMA_SPARSE_IGNORE_LEVELS", None)
        os.environ.update(saved)


# --------------------------------------------------------------------------------------------------
# capture


def _default_threads() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


def _tokenize(vocab, text: str, add_bos: bool, max_tokens: int) -> list[int]:
    from . import _native

    # a prefix of the text is enough: English BPE tokens average about 4 characters, 8 leaves a margin
    data = text[: max(1024, max_tokens * 8)].encode("utf-8", errors="replace")
    try:
        toks = _native.tokenize(vocab, data, add_bos, False)
    except _native.TokenizeError as exc:
        raise CalibrationError(f"{exc}; {_TOKENIZER_HINT}") from None
    return toks[:max_tokens]


def _chunks(token_lists: list[list[int]], ctx: int, bos: Optional[int]) -> list[list[int]]:
    """Split each text into windows of at most ctx tokens, each starting with BOS when the model uses one."""
    chunks = []
    for toks in token_lists:
        if bos is not None and toks and toks[0] == bos:
            toks = toks[1:]
        step = ctx - (1 if bos is not None else 0)
        for a in range(0, len(toks), step):
            piece = toks[a:a + step]
            if len(piece) < 8 and chunks:  # a tail this short adds nothing
                continue
            chunks.append(([bos] if bos is not None else []) + piece)
    return chunks


class _Capture:
    """Model + dense context whose eval callback feeds a llama_sparse_calib object."""

    def __init__(self, path: Path, ctx: int, threads: int, n_gpu_layers: int, ignore_levels: bool = False) -> None:
        import llama_cpp

        from . import _calib_native as cn
        from . import _log, _native

        self.cn = cn
        self.model = self.ctx = self.calib = None
        # no native log while it lives (the load log, ggml-cuda's graph lines per window); errors still reach messages
        self._quiet = _log.quiet()
        self._quiet.__enter__()
        mparams = llama_cpp.llama_model_default_params()
        mparams.n_gpu_layers = n_gpu_layers
        start = _log.mark()
        with _dense_env(ignore_levels):
            self.model = llama_cpp.llama_model_load_from_file(str(path).encode(), mparams)
        if not self.model:
            why = _log.reason_since(start)
            raise CalibrationError(f"llama.cpp could not load {path}: {why}" if why else
                                   f"llama.cpp could not load {path}; run `llama-sparse generate {path} -p hi -v` to see why")
        try:
            if _native.llama_sparse_model_n_zigzag(self.model) <= 0:
                raise CalibrationError(f"{path} loaded without zigzag weights; convert the original model again")
            self.calib = cn.llama_sparse_calib_new(self.model, 0)
            if not self.calib:
                raise CalibrationError(f"{path}: {cn.last_error()}")
            cparams = llama_cpp.llama_context_default_params()
            cparams.n_ctx = ctx
            cparams.n_batch = ctx
            cparams.n_ubatch = ctx
            cparams.n_seq_max = 1
            cparams.n_threads = threads
            cparams.n_threads_batch = threads
            cparams.cb_eval = cn.eval_cb
            cparams.cb_eval_user_data = self.calib
            start = _log.mark()
            with _dense_env():
                self.ctx = llama_cpp.llama_init_from_model(self.model, cparams)
            if not self.ctx:
                why = _log.reason_since(start)
                raise CalibrationError(f"could not create a llama.cpp context for {path} (n_ctx {ctx})"
                                       + (f": {why}" if why else ""))
            if _native.llama_sparse_set_level(self.ctx, None) != 0:
                raise CalibrationError(f"could not switch the calibration context to dense: {_native.last_error()}")
            self.vocab = llama_cpp.llama_model_get_vocab(self.model)
            self.add_bos = bool(llama_cpp.llama_vocab_get_add_bos(self.vocab))
            self.bos = int(llama_cpp.llama_vocab_bos(self.vocab)) if self.add_bos else None
        except BaseException:
            self.close()
            raise

    def sample(self, slots: int, rows: int, points: Sequence[int]) -> None:
        """Keep the first `rows` rows of `points` for up to `slots` windows (see decode's slot)."""
        mask = sum(1 << p for p in points)
        if self.cn.llama_sparse_calib_sample_init(self.calib, slots, rows, mask) != 0:
            raise CalibrationError(self.cn.last_error())

    def decode(self, tokens: list[int], slot: int = -1) -> None:
        """Run one window densely; slot >= 0 keeps its sampled rows there. A sampled window asks for the
        output of every token, so the last block computes its feed-forward part on every row too."""
        import llama_cpp

        if self.cn.llama_sparse_calib_sample_slot(self.calib, slot) != 0:
            raise CalibrationError(self.cn.last_error())
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(self.ctx), True)
        if slot < 0:
            arr = (llama_cpp.llama_token * len(tokens))(*tokens)
            rc = llama_cpp.llama_decode(self.ctx, llama_cpp.llama_batch_get_one(arr, len(tokens)))
        else:
            batch = llama_cpp.llama_batch_init(len(tokens), 0, 1)
            try:
                batch.n_tokens = len(tokens)
                for i, tok in enumerate(tokens):
                    batch.token[i] = tok
                    batch.pos[i] = i
                    batch.n_seq_id[i] = 1
                    batch.seq_id[i][0] = 0
                    batch.logits[i] = 1
                rc = llama_cpp.llama_decode(self.ctx, batch)
            finally:
                llama_cpp.llama_batch_free(batch)
            self.cn.llama_sparse_calib_sample_slot(self.calib, -1)
        if rc != 0:
            raise CalibrationError(f"llama_decode failed ({rc}) on a calibration chunk of {len(tokens)} tokens")
        err = self.cn.llama_sparse_calib_error(self.calib)
        if err:
            raise CalibrationError(err.decode())

    def close(self) -> None:
        import llama_cpp

        if self.ctx:
            llama_cpp.llama_free(self.ctx)
            self.ctx = None
        if self.calib:
            self.cn.llama_sparse_calib_free(self.calib)
            self.calib = None
        if self.model:
            llama_cpp.llama_model_free(self.model)
            self.model = None
        if getattr(self, "_quiet", None) is not None:
            self._quiet.__exit__(None, None, None)
            self._quiet = None


def _random_ids(vocab, n: int, seed: int) -> list[int]:
    """n seeded-random ids of the vocabulary's ordinary tokens (no control or end-of-generation tokens)."""
    import llama_cpp

    n_vocab = int(llama_cpp.llama_vocab_n_tokens(vocab))
    ok = np.array([not (llama_cpp.llama_vocab_is_control(vocab, t) or llama_cpp.llama_vocab_is_eog(vocab, t))
                   for t in range(n_vocab)])
    ids = np.flatnonzero(ok)
    if ids.size == 0:
        raise CalibrationError("the vocabulary has no ordinary tokens to draw random ids from")
    return [int(t) for t in np.random.default_rng(seed).choice(ids, size=n)]


def _run_texts(cap: _Capture, text_list: Optional[list[str]], n_tokens: int, ctx: int, desc: str, progress: bool,
               log: Callable[[str], None], sample_slots: int = 0, sample_rows: int = 0, seed: int = 0,
               random_tokens: Optional[int] = None) -> int:
    """Decode at most n_tokens of the texts in windows of ctx tokens; returns the number of windows.
    random_tokens (a seed): n_tokens seeded-random token ids instead of text.
    With sample_slots > 0, a uniformly random set of that many windows (reservoir sampling over the windows
    at least sample_rows long, or the longest ones if none is) keeps its sampled rows."""
    if random_tokens is not None:
        token_lists = [_random_ids(cap.vocab, n_tokens, random_tokens)]
    else:
        # spread the token budget evenly over the texts; a short text leaves its share to the next
        token_lists, left = [], n_tokens
        for i, text in enumerate(text_list):
            quota = left // (len(text_list) - i)
            toks = _tokenize(cap.vocab, text, cap.add_bos, quota) if quota > 0 else []
            token_lists.append(toks)
            left -= len(toks)
    chunks = _chunks(token_lists, ctx, cap.bos)
    total = sum(len(c) for c in chunks)
    if total < 16:
        raise CalibrationError(f"the calibration text gives only {total} tokens; pass more text (at least a few thousand tokens)")
    min_len = min(sample_rows, max(len(c) for c in chunks))
    rng = np.random.default_rng(seed)
    seen = 0
    bar = Progress(total, desc, progress, log)
    try:
        for chunk in chunks:
            slot = -1
            if sample_slots > 0 and len(chunk) >= min_len:
                slot = seen if seen < sample_slots else int(rng.integers(0, seen + 1))
                slot = slot if slot < sample_slots else -1
                seen += 1
            cap.decode(chunk, slot)
            bar.update(len(chunk))
    finally:
        bar.close()
    return len(chunks)


# --------------------------------------------------------------------------------------------------
# thresholds


@dataclass
class _Stats:
    """What the thresholds are read from: per (layer, group) weight bytes and input widths."""

    calib:   int
    n_layer: int
    bytes:   np.ndarray  # [n_layer, 4] bytes of zigzag weights
    cols:    np.ndarray  # [n_layer, 4] input width
    valid:   np.ndarray  # [n_layer, 4] bool: zigzag weights and recorded activations


def _stats(cn, calib: int) -> _Stats:
    n_layer = cn.llama_sparse_calib_n_layer(calib)
    shape = (n_layer, len(GROUP_NAMES))
    nbytes, cols, valid = np.zeros(shape), np.zeros(shape), np.zeros(shape, dtype=bool)
    for il in range(n_layer):
        for g in range(len(GROUP_NAMES)):
            nbytes[il, g] = cn.llama_sparse_calib_weight_bytes(calib, il, g)
            cols[il, g] = cn.llama_sparse_calib_n_cols(calib, il, g)
            valid[il, g] = cols[il, g] > 0 and cn.llama_sparse_calib_n_values(calib, il, g) > 0
    return _Stats(calib, n_layer, nbytes, cols, valid)


def _unified(cn, st: _Stats, target: float) -> np.ndarray:
    sparsity = np.zeros((st.n_layer, len(GROUP_NAMES)))
    sparsity[st.valid] = target
    return sparsity


def _greedy_proxy(cn, st: _Stats, target: float, step: float = GREEDY_STEP) -> np.ndarray:
    """Fallback when the block cannot be recomputed: per layer, raise the sparsity of the group whose
    dropped error-mass share grows least per byte skipped, in steps, until the byte-weighted sparsity
    of the layer reaches target. A first-order proxy that ignores how the groups interact."""
    sparsity = np.zeros((st.n_layer, len(GROUP_NAMES)))
    for il in range(st.n_layer):
        groups = [g for g in range(len(GROUP_NAMES)) if st.valid[il, g] and st.bytes[il, g] > 0]
        if not groups:
            continue
        total = sum(st.bytes[il, g] for g in groups)
        err = {g: 0.0 for g in groups}
        s = {g: 0.0 for g in groups}
        skipped = 0.0
        while skipped < target * total * (1 - 1e-6):
            best = None
            for g in groups:
                ds = min(step, GREEDY_MAX_SPARSITY - s[g], (target * total - skipped) / st.bytes[il, g])
                if ds <= 1e-9:
                    continue
                e = cn.threshold(st.calib, il, g, s[g] + ds)[1]
                cost = (e - err[g]) / (ds * st.bytes[il, g])
                if best is None or cost < best[0]:
                    best = (cost, g, ds, e)
            if best is None:
                break  # every group at the cap
            _, g, ds, e = best
            s[g] += ds
            err[g] = e
            skipped += ds * st.bytes[il, g]
        for g in groups:
            sparsity[il, g] = s[g]
    return sparsity


@dataclass
class _Greedy:
    """Result of the block search: allocations and recomputed block errors."""

    sparsity:     dict[float, np.ndarray]              # target -> [n_layer, 4]
    block_errors: dict[tuple[str, float], np.ndarray]  # (mode, target) -> [n_layer]
    check:        np.ndarray                           # [n_layer] numpy-vs-engine error of the attention residual
    traces:       list = field(default_factory=list)   # greedy.GreedyTrace per layer
    windows:      int = 0                              # windows sampled (short texts may give fewer than asked)
    queries:      int = 0                              # query positions per block


# the numpy block must reproduce the engine's residual after attention to within this (relative to the
# attention output): f16 KV cache rounding gives ~1e-3, a wrong RoPE or attention layout ~1
GREEDY_CHECK_TOLERANCE = 0.05


def _sample_points() -> tuple[int, int]:
    from . import _calib_native as cn
    return cn.POINT_ATTN_RESIDUAL, cn.POINT_FFN_RESIDUAL


def block_samples(cn, calib: int, layer: int, slots: int) -> tuple[list[np.ndarray], list[Optional[np.ndarray]]]:
    """(block inputs, residuals after attention) of the windows sampled for `layer`."""
    attn_pt, ffn_pt = _sample_points()
    hs, rs = [], []
    for k in range(slots):
        h = cn.sample(calib, layer, attn_pt, k)
        if h is None:
            continue
        hs.append(h)
        rs.append(cn.sample(calib, layer, ffn_pt, k))
    return hs, rs


def _check_block(block, rs: list[Optional[np.ndarray]], layer: int) -> float:
    """Relative error of the numpy residual after attention against the engine's, at the query rows."""
    from . import greedy as gr

    r_np = block.residual(block.o_input(0.0), 0.0)
    parts = []
    for r, q in zip(rs, block.queries):
        if r is None or r.shape[0] <= q[-1]:
            return float("nan")  # rows dropped by the engine (an output-only last block): nothing to compare
        parts.append(r[q])
    r_eng = np.concatenate(parts)
    rel = float(np.linalg.norm(r_np - r_eng) / max(1e-30, np.linalg.norm(r_eng - block.h_q)))
    if not rel <= GREEDY_CHECK_TOLERANCE:
        raise gr.UnsupportedBlock(f"the numpy block does not reproduce block {layer} of the engine "
                                  f"(attention output off by {rel:.1%})")
    return rel


def _greedy_search(cn, st: _Stats, reader, rope_type: int, targets: Sequence[float], modes: Sequence[str], *,
                   slots: int, queries: int, increment: float, progress: bool, log: Callable[[str], None],
                   threads: int = 1, keep_traces: bool = False) -> _Greedy:
    """TEAL's block-wise greedy search for every block (llama_sparse.greedy); UnsupportedBlock when the
    blocks are not the shape it recomputes."""
    from . import greedy as gr
    from . import zigzag

    spec = gr.read_spec(reader, rope_type)
    tensors = {t.name: t for t in reader.tensors}
    zz = zigzag.read_zigzag_info(reader)
    res = _Greedy(sparsity={t: np.zeros((st.n_layer, len(GROUP_NAMES))) for t in targets},
                  block_errors={(m, t): np.zeros(st.n_layer) for m in modes for t in targets},
                  check=np.full(st.n_layer, np.nan))
    bar = Progress(st.n_layer, "greedy block search", progress, log, unit="block")
    with gr.blas_threads(threads):
        _greedy_blocks(cn, st, res, spec, tensors, zz, targets, modes, slots, queries, increment, bar, keep_traces)
    return res


def _greedy_blocks(cn, st: _Stats, res: _Greedy, spec, tensors: dict, zz: dict, targets: Sequence[float],
                   modes: Sequence[str], slots: int, queries: int, increment: float, bar: Progress,
                   keep_traces: bool) -> None:
    from . import greedy as gr

    try:
        for il in range(st.n_layer):
            hs, rs = block_samples(cn, st.calib, il, slots)
            if not hs:
                raise gr.UnsupportedBlock(f"no block input was sampled for block {il} (no RMS norm feeds its qkv matmul)")
            block = gr.Block(spec, gr.load_block(tensors, zz, il), hs, queries)
            res.check[il] = _check_block(block, rs, il)
            res.windows, res.queries = len(hs), len(block.h_q)

            def threshold_of(g: int, s: float, il: int = il) -> float:
                return cn.threshold(st.calib, il, g, s)[0] if s > 0 else 0.0

            trace = gr.GreedyTrace() if keep_traces else None
            alloc = gr.greedy_block(block, st.bytes[il], st.valid[il], threshold_of, targets, increment, trace)
            if trace is not None:
                res.traces.append(trace)
            ref = block.forward([0.0] * len(GROUP_NAMES))
            for t in targets:
                res.sparsity[t][il] = alloc[t]
                for m in modes:
                    s = alloc[t] if m == "greedy" else np.where(st.valid[il], t, 0.0)
                    res.block_errors[(m, t)][il] = gr.block_error(block, ref, [threshold_of(g, float(s[g])) for g in range(4)])
            del block
            bar.update(1)
    finally:
        bar.close()


def _sample_slots(reader, windows: int, ctx: int, log: Optional[Callable[[str], None]]) -> int:
    """Windows to keep for the greedy search, fewer if their rows would pass GREEDY_SAMPLE_MIB."""
    arch = reader.get_field("general.architecture").contents()
    n_layer = int(reader.get_field(f"{arch}.block_count").contents())
    emb = reader.get_field(f"{arch}.embedding_length")
    n_embd = int(emb.contents()) if emb is not None else 4096
    per_window = n_layer * ctx * n_embd * 4 * len(_sample_points())
    fit = max(1, (GREEDY_SAMPLE_MIB << 20) // per_window)
    if fit < windows and log is not None:
        log(f"greedy: keeping {fit} windows instead of {windows} ({per_window / 2**20:.0f} MiB each, cap {GREEDY_SAMPLE_MIB} MiB)")
    return int(min(windows, fit))


def _level(cn, st: _Stats, mode: str, target: float, greedy: Optional[_Greedy] = None) -> LevelResult:
    if mode == "unified":
        sparsity = _unified(cn, st, target)
    elif greedy is not None:
        sparsity = greedy.sparsity[target]
    else:
        sparsity = _greedy_proxy(cn, st, target)
    thresholds = np.zeros_like(sparsity, dtype=np.float32)
    measured = np.zeros_like(sparsity)
    errors = []
    for il in range(st.n_layer):
        for g in range(len(GROUP_NAMES)):
            if not st.valid[il, g]:
                continue
            if sparsity[il, g] <= 0:
                errors.append(0.0)
                continue
            thresholds[il, g] = cn.threshold(st.calib, il, g, float(sparsity[il, g]))[0]
            measured[il, g], e = cn.sparsity_at(st.calib, il, g, float(thresholds[il, g]))
            errors.append(e)
    w, c = st.bytes * st.valid, st.cols * st.valid
    return LevelResult(
        name=level_name(mode, target), mode=mode, target=target,
        achieved=float((measured * w).sum() / max(1.0, w.sum())),
        achieved_columns=float((measured * c).sum() / max(1.0, c.sum())),
        rel_error=float(np.mean(errors)) if errors else 0.0,
        thresholds=thresholds, group_sparsity=measured,
        block_error=float(np.mean(greedy.block_errors[(mode, target)])) if greedy is not None else float("nan"),
    )


# --------------------------------------------------------------------------------------------------
# output


def _temp_path(out: Path) -> Path:
    from . import _signals
    return _signals.temp_beside(out, ".calib.tmp", CalibrationError)  # its mode: the source's, set when written


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_levels(reader, src: Path, out: Path, levels: Sequence[LevelResult]) -> None:
    """Copy every key and tensor of reader to out, replacing the calibration keys with levels."""
    from gguf import GGUFValueType, GGUFWriter

    from . import _signals, zigzag

    level_prefix = zigzag.KEY_THRESHOLDS_FMT.format(level="")
    tmp = None
    writer = None
    try:
        tmp = _temp_path(out)
        arch = reader.get_field("general.architecture").contents()
        writer = GGUFWriter(tmp, arch)
        for fld in reader.fields.values():
            name = fld.name
            # virtual fields, the architecture (GGUFWriter writes it) and the old calibration are not copied
            if (name.startswith("GGUF.") or name == "general.architecture" or name.startswith(level_prefix)
                    or name in (zigzag.KEY_LEVELS, zigzag.KEY_LEVEL_TARGETS)):
                continue
            if name == "general.alignment":
                writer.add_custom_alignment(int(fld.contents()))
                continue
            vtype = fld.types[0]
            if vtype == GGUFValueType.ARRAY and len(fld.types) > 2:
                raise CalibrationError(f"metadata key {name} of {src} is a nested array, which calibrate cannot copy")
            writer.add_key_value(name, fld.contents(), vtype, sub_type=fld.types[-1] if vtype == GGUFValueType.ARRAY else None)
        writer.add_key_value(zigzag.KEY_LEVELS, [lv.name for lv in levels], GGUFValueType.ARRAY, sub_type=GGUFValueType.STRING)
        writer.add_key_value(zigzag.KEY_LEVEL_TARGETS, [float(lv.target) for lv in levels], GGUFValueType.ARRAY,
                             sub_type=GGUFValueType.FLOAT32)
        for lv in levels:
            writer.add_key_value(zigzag.KEY_THRESHOLDS_FMT.format(level=lv.name),
                                 [float(t) for t in lv.thresholds.reshape(-1)], GGUFValueType.ARRAY,
                                 sub_type=GGUFValueType.FLOAT32)
        for t in reader.tensors:
            writer.add_tensor_info(t.name, tuple(t.data.shape), t.data.dtype, int(t.data.nbytes), raw_dtype=t.tensor_type)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for t in reader.tensors:
            writer.write_tensor_data(t.data)
        for f in writer.fout or []:
            f.flush()
            os.fsync(f.fileno())
        writer.close()
        # the output gets the input's mode (an in-place run keeps it as it was)
        os.chmod(tmp, src.stat().st_mode & 0o777)
        os.replace(tmp, out)
        _fsync_dir(out.parent)
    except BaseException as exc:
        _signals.discard(writer, tmp)
        if isinstance(exc, OSError):
            if exc.errno == errno.ENOSPC:
                raise CalibrationError(f"disk full while writing {out}; free space in {out.parent} or pass another -o path") from exc
            raise CalibrationError(f"cannot write {out}: {exc}; pass a -o path in a writable directory") from exc
        raise


# --------------------------------------------------------------------------------------------------
# public API


def calibrate(
    model: Union[str, "os.PathLike[str]"],
    *,
    output: Union[str, "os.PathLike[str]", None] = None,
    texts: Union[TextSource, Sequence[TextSource], None] = None,
    levels: Sequence[float] = DEFAULT_LEVELS,
    modes: Sequence[str] = MODES,
    n_tokens: int = DEFAULT_N_TOKENS,
    ctx: int = 512,
    threads: Optional[int] = None,
    progress: bool = True,
    in_place: bool = False,
    n_gpu_layers: int = 0,
    log: Optional[Callable[[str], None]] = None,
    greedy_windows: int = GREEDY_WINDOWS,
    greedy_queries: int = GREEDY_QUERIES,
    greedy_increment: float = GREEDY_INCREMENT,
    greedy_proxy: bool = False,
    random_tokens: Optional[int] = None,
) -> CalibrationSummary:
    """Calibrate TEAL thresholds of the zigzag GGUF `model` and write them with the model to `output`.

    output: required, unless in_place=True (then the input is replaced atomically).
    texts: calibration text: str items are text, path-likes are files; None lets the model write its
    own text from a few neutral prompts. At most n_tokens tokens are used, in windows of ctx tokens.
    levels / modes: target sparsities, each written as a "unified" level ("0.50") and/or a "greedy"
    one ("greedy-0.50"). Raises CalibrationError (and leaves no file behind) on any failure.
    greedy_windows / greedy_queries / greedy_increment: the greedy search's sample (calibration windows
    whose block inputs are kept, query positions per window) and the block sparsity added per step.
    greedy_proxy: allocate greedy levels with the first-order proxy instead of the block search (the
    method of earlier versions; for comparisons).
    random_tokens: a seed: calibrate on n_tokens seeded-random token ids instead of text (texts must be None).
    For speed tests of random-weight models, whose placeholder vocabulary cannot tokenize text; the levels then
    hit their targets on that model's activations, with no claim about accuracy.
    """
    start = time.perf_counter()
    log = log or _default_log
    src = Path(model).expanduser()
    if output is None:
        if not in_place:
            raise CalibrationError("no output given; pass output=PATH (-o PATH), or in_place=True (--in-place) "
                                   "to replace the input")
        out = src
    else:
        out = Path(output).expanduser()
    if out.is_symlink() and out.exists():
        out = out.resolve()  # write where the link points (a hub snapshot's blob), keeping the link
    target_levels, modes = _check_levels(levels, modes)
    if not isinstance(n_tokens, int) or isinstance(n_tokens, bool) or n_tokens < 16:
        raise CalibrationError(f"n_tokens (-n) must be an int >= 16, got {n_tokens!r}")
    if not isinstance(ctx, int) or isinstance(ctx, bool) or not 32 <= ctx <= 1 << 16:
        raise CalibrationError(f"ctx (-c) must be an int in [32, 65536], got {ctx!r}")
    if not isinstance(greedy_windows, int) or isinstance(greedy_windows, bool) or greedy_windows < 1:
        raise CalibrationError(f"greedy_windows (--greedy-windows) must be an int >= 1, got {greedy_windows!r}")
    if not isinstance(greedy_queries, int) or isinstance(greedy_queries, bool) or greedy_queries < 1:
        raise CalibrationError(f"greedy_queries must be an int >= 1, got {greedy_queries!r}")
    from . import _ggml
    _ggml.check_threads(threads, CalibrationError)
    if not 0.0 < float(greedy_increment) <= 0.25:
        raise CalibrationError(f"greedy_increment (--greedy-step) must be in (0, 0.25], got {greedy_increment!r}")
    # cheap path checks first; parsing the GGUF takes seconds on a large vocabulary
    _check_model_path(src)
    _check_output(out, src, in_place)
    summary = CalibrationSummary(source=src, output=out, text_source="generated", n_tokens=0, n_chunks=0)
    text_list = None
    if random_tokens is not None:
        if texts is not None:
            raise CalibrationError("pass either calibration texts or random_tokens, not both")
        if not isinstance(random_tokens, int) or isinstance(random_tokens, bool) or random_tokens < 0:
            raise CalibrationError(f"random_tokens must be a seed (an int >= 0), got {random_tokens!r}")
        summary.text_source = f"random token ids (seed {random_tokens})"
    elif texts is not None:
        text_list, summary.text_source = _read_texts(texts, out)
    reader = _open_model(src)

    if texts is None and random_tokens is None:
        gen_start = time.perf_counter()
        if progress:
            log(f"no --text given: {src.name} writes its own calibration text from {len(DEFAULT_PROMPTS)} prompts")
        # threads=None keeps llama-cpp-python's decode default (half the cores), like llama_sparse.Llama
        text_list = generate_texts(src, threads=threads, n_gpu_layers=n_gpu_layers, progress=progress, log=log)
        summary.seconds_generate = time.perf_counter() - gen_start
    threads = threads or _default_threads()

    from . import _calib_native as cn

    capture_start = time.perf_counter()
    cap = _Capture(src, ctx, threads, n_gpu_layers, ignore_levels=True)  # the levels are being replaced
    try:
        slots = 0
        if "greedy" in modes and not greedy_proxy:
            slots = _sample_slots(reader, greedy_windows, ctx, log if progress else None)
            cap.sample(slots, ctx, _sample_points())
        summary.n_chunks = _run_texts(cap, text_list, n_tokens, ctx, f"calibrating {src.name}", progress, log,
                                      sample_slots=slots, sample_rows=ctx, random_tokens=random_tokens)
        summary.n_tokens = int(cn.llama_sparse_calib_n_tokens(cap.calib))
        st = _stats(cn, cap.calib)
        if not st.valid.any():
            raise CalibrationError(f"no zigzag matmul of {src} ran during calibration; the model's graph does not use its zigzag weights")
        summary.seconds_capture = time.perf_counter() - capture_start

        greedy = None
        if "greedy" in modes and greedy_proxy:
            summary.greedy_method = "first-order proxy (asked for)"
        elif "greedy" in modes:
            import llama_cpp

            from .greedy import UnsupportedBlock

            greedy_start = time.perf_counter()
            try:
                greedy = _greedy_search(cn, st, reader, int(llama_cpp.llama_model_rope_type(cap.model)), target_levels,
                                        modes, slots=slots, queries=greedy_queries, increment=float(greedy_increment),
                                        progress=progress, log=log, threads=threads)
                checked = greedy.check[np.isfinite(greedy.check)]
                summary.greedy_method = (f"block search on {greedy.windows} windows ({greedy.queries} query positions), step "
                                         f"{greedy_increment:g}; numpy block vs engine max error "
                                         f"{checked.max() if checked.size else float('nan'):.2e}")
            except UnsupportedBlock as exc:
                summary.greedy_method = f"first-order proxy, because {exc}"
                log(f"warning: greedy levels use the first-order proxy: {exc}")
            summary.seconds_greedy = time.perf_counter() - greedy_start
        for mode in modes:
            for t in target_levels:
                summary.levels.append(_level(cn, st, mode, t, greedy))
    finally:
        cap.close()

    write_levels(reader, src, out, summary.levels)
    summary.seconds = time.perf_counter() - start
    if progress:
        log(summary.report())
    return summary


def measure_sparsity(
    model: Union[str, "os.PathLike[str]"],
    texts: Union[TextSource, Sequence[TextSource]],
    *,
    n_tokens: int = 4096,
    ctx: int = 512,
    threads: Optional[int] = None,
    n_gpu_layers: int = 0,
    progress: bool = False,
    log: Optional[Callable[[str], None]] = None,
    per_block: bool = False,
) -> dict:
    """Share of weight bytes and of input columns that each stored level skips on `texts` (e.g. held-out text).

    The texts run densely; a decoded token at batch 1 sees these activations exactly (prefill and decode of a
    causal model compute the same), up to the drift that sparsity in earlier layers adds.
    Returns {level name: (bytes share, columns share)}, or with per_block=True {level name: [n_layer] array of
    each block's share of weight bytes skipped} (greedy's per-block target).
    """
    from . import _calib_native as cn
    from . import _native

    log = log or _default_log
    src = Path(model).expanduser()
    _open_model(src)
    text_list, _ = _read_texts(texts)
    cap = _Capture(src, ctx, threads or _default_threads(), n_gpu_layers)
    try:
        _run_texts(cap, text_list, n_tokens, ctx, f"measuring {src.name}", progress, log)
        st = _stats(cn, cap.calib)
        w, c = st.bytes * st.valid, st.cols * st.valid
        out = {}
        for i in range(_native.llama_sparse_model_n_levels(cap.model)):
            name = _native.llama_sparse_model_level_name(cap.model, i).decode()
            s = np.zeros_like(w)
            for il in range(st.n_layer):
                for g in range(len(GROUP_NAMES)):
                    if st.valid[il, g]:
                        t = _native.llama_sparse_model_threshold(cap.model, i, il, g)
                        s[il, g] = cn.sparsity_at(cap.calib, il, g, t)[0] if t > 0 else 0.0
            if per_block:
                out[name] = (s * w).sum(axis=1) / np.maximum(1.0, w.sum(axis=1))
            else:
                out[name] = (float((s * w).sum() / max(1.0, w.sum())), float((s * c).sum() / max(1.0, c.sum())))
        return out
    finally:
        cap.close()


def block_errors(
    model: Union[str, "os.PathLike[str]"],
    texts: Union[TextSource, Sequence[TextSource]],
    *,
    n_tokens: int = 2048,
    ctx: int = 512,
    windows: int = 2,
    queries: int = GREEDY_QUERIES,
    threads: Optional[int] = None,
    n_gpu_layers: int = 0,
) -> dict[str, np.ndarray]:
    """Recomputed block-output error of every stored level on `texts` (e.g. held-out text), per block.

    Block inputs of `windows` windows of the texts are sampled from our engine, and each block is recomputed in
    numpy (llama_sparse.greedy) densely and with the level's thresholds. Returns {level name: [n_layer] array of
    ||out - out_dense||^2 / ||out_dense - h||^2 over the query positions}; key "check" holds each block's
    numpy-vs-engine error of the residual after attention.
    """
    import llama_cpp

    from . import _calib_native as cn
    from . import _native
    from . import greedy as gr
    from . import zigzag

    src = Path(model).expanduser()
    reader = _open_model(src)
    text_list, _ = _read_texts(texts)
    cap = _Capture(src, ctx, threads or _default_threads(), n_gpu_layers)
    try:
        cap.sample(windows, ctx, _sample_points())
        _run_texts(cap, text_list, n_tokens, ctx, f"sampling {src.name}", False, _default_log,
                   sample_slots=windows, sample_rows=ctx)
        n_layer = cn.llama_sparse_calib_n_layer(cap.calib)
        spec = gr.read_spec(reader, int(llama_cpp.llama_model_rope_type(cap.model)))
        tensors = {t.name: t for t in reader.tensors}
        zz = zigzag.read_zigzag_info(reader)
        names = [_native.llama_sparse_model_level_name(cap.model, i).decode()
                 for i in range(_native.llama_sparse_model_n_levels(cap.model))]
        out = {name: np.zeros(n_layer) for name in names}
        out["check"] = np.full(n_layer, np.nan)
        with gr.blas_threads(threads or _default_threads()):
            _level_block_errors(cn, _native, gr, cap, spec, tensors, zz, names, windows, queries, out)
        return out
    finally:
        cap.close()


def _level_block_errors(cn, native, gr, cap: _Capture, spec, tensors: dict, zz: dict, names: list[str], windows: int,
                        queries: int, out: dict[str, np.ndarray]) -> None:
    for il in range(len(out["check"])):
        hs, rs = block_samples(cn, cap.calib, il, windows)
        if not hs:
            raise gr.UnsupportedBlock(f"no block input was sampled for block {il}")
        block = gr.Block(spec, gr.load_block(tensors, zz, il), hs, queries)
        out["check"][il] = _check_block(block, rs, il)
        ref = block.forward([0.0] * len(GROUP_NAMES))
        for i, name in enumerate(names):
            t = [max(0.0, float(native.llama_sparse_model_threshold(cap.model, i, il, g))) for g in range(len(GROUP_NAMES))]
            out[name][il] = gr.block_error(block, ref, t)


def add_calibrate_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Arguments of `llama-sparse calibrate`; pair with run_calibrate."""
    parser.add_argument("model", type=Path, help="zigzag .gguf (from `llama-sparse convert`)")
    out = parser.add_mutually_exclusive_group(required=True)
    out.add_argument("-o", "--outfile", type=Path, help="output .gguf: the model with the calibrated levels")
    out.add_argument("--in-place", action="store_true", help="replace the input file (atomically) instead")
    src = parser.add_mutually_exclusive_group()
    src.add_argument("--text", type=Path, nargs="+", default=None, metavar="FILE",
                     help="calibration text files (default: text the model writes itself)")
    src.add_argument("--random-tokens", type=int, default=None, metavar="SEED",
                     help="calibrate on seeded-random token ids instead of text: for speed tests of random-weight "
                          "models whose placeholder vocabulary cannot tokenize text (says nothing about accuracy)")
    parser.add_argument("--levels", default=",".join(f"{t:g}" for t in DEFAULT_LEVELS),
                        help="comma-separated target sparsities (default: 0.25,0.4,0.5,0.65)")
    parser.add_argument("--mode", choices=MODES + ("both",), default="both",
                        help="unified (one sparsity everywhere), greedy (per-group allocation), or both (default)")
    parser.add_argument("-n", "--n-tokens", type=int, default=DEFAULT_N_TOKENS,
                        help=f"at most this many calibration tokens (default {DEFAULT_N_TOKENS})")
    parser.add_argument("-c", "--ctx-size", type=int, default=512, help="tokens per calibration window (default 512)")
    parser.add_argument("-t", "--threads", type=int, default=None,
                        help="threads (default: all cores; without --text, the model writes its calibration text on "
                             "llama-cpp-python's default, half the cores)")
    parser.add_argument("--greedy-windows", type=int, default=GREEDY_WINDOWS,
                        help=f"calibration windows whose block inputs the greedy search uses (default {GREEDY_WINDOWS})")
    parser.add_argument("--greedy-step", type=float, default=GREEDY_INCREMENT,
                        help=f"block sparsity added per greedy step (default {GREEDY_INCREMENT})")
    parser.add_argument("-ngl", "--n-gpu-layers", type=int, default=0, help="layers on the GPU (default: 0; 99: all)")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress or summary output")
    return parser


def run_calibrate(args: argparse.Namespace) -> int:
    """Entry point for `llama-sparse calibrate`: 0 on success, 1 on CalibrationError, 130 on Ctrl-C."""
    try:
        try:
            levels = [float(x) for x in str(args.levels).split(",") if x.strip()]
        except ValueError:
            raise CalibrationError(f"--levels {args.levels}: pass comma-separated numbers such as 0.25,0.5") from None
        calibrate(
            args.model, output=args.outfile, in_place=args.in_place, texts=args.text, levels=levels,
            modes=MODES if args.mode == "both" else (args.mode,), n_tokens=args.n_tokens, ctx=args.ctx_size,
            threads=args.threads, n_gpu_layers=args.n_gpu_layers, progress=not args.quiet,
            greedy_windows=args.greedy_windows, greedy_increment=args.greedy_step,
            random_tokens=args.random_tokens,
        )
    except CalibrationError as exc:
        print(f"llama-sparse calibrate: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("llama-sparse calibrate: interrupted; no output written", file=sys.stderr)
        return 130
    return 0


class _CallableModule(types.ModuleType):
    """`llama_sparse.calibrate` is both this module and, lazily, the function: importing the module binds it
    as the package attribute, so the module forwards calls to keep `llama_sparse.calibrate(...)` working."""

    def __call__(self, *args, **kwargs) -> CalibrationSummary:
        return calibrate(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule


if __name__ == "__main__":
    sys.exit(run_calibrate(add_calibrate_args(argparse.ArgumentParser(prog="llama-sparse calibrate")).parse_args()))
