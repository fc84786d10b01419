"""`llama_sparse.Llama`: llama-cpp-python's Llama with a sparsity knob."""
from __future__ import annotations

import ctypes
import dataclasses
import inspect
import math
import numbers
import os
from pathlib import Path
from typing import Any, Optional, Union

import llama_cpp
import numpy as np

from . import _log, _native

_log.install()

_COMPLETION_SIG = inspect.signature(llama_cpp.Llama.create_completion)
# create_completion's sampling settings that must be finite (NaN passes llama.cpp's range checks and samples garbage)
_FINITE_SETTINGS = ("temperature", "top_p", "min_p", "typical_p", "frequency_penalty", "presence_penalty",
                    "repeat_penalty", "tfs_z", "mirostat_tau", "mirostat_eta")

SparsityLevel = Union[None, float, str]


KT_TYPES = ("k", "q8_0")  # SparQ.kt: the K cache's type, or 8 bits
_GGML_TYPE_Q8_0 = 8        # enum ggml_type
CTX_PAD = 256              # llama.cpp rounds a context size up to a multiple of this (llama-context.cpp)


def padded_ctx(n_ctx: int) -> int:
    """The context llama.cpp makes for n_ctx (> 0)."""
    return -(-n_ctx // CTX_PAD)*CTX_PAD


@dataclasses.dataclass(frozen=True)
class SparQ:
    """SparQ attention settings (docs/sparq.md), used at decode only.

    r: query components read per key (of the head size; more than the head size reads them all);
    k: cached positions attended to exactly; mean_v: blend the output with the mean of V by the estimated
    attention mass of those k positions (the paper does this for MHA models and skips it for GQA ones);
    kt: storage of the transposed K that the r components are read from, "k" (the K cache's type) or "q8_0"
    (8 bits, 34/64 of f16's bytes; needs the default f16 K cache);
    min_kv: decode runs dense attention while the KV cache view (the used cells, rounded up to 256) holds fewer
    positions, so SparQ starts where the context is long enough for it to pay. None ("auto", the default): where
    the op pays on the device holding the cache (the CPU: from the start; a GPU: from 80 MiB of K and V a layer,
    20480 positions at Llama-3-8B shapes); 0: from the start on every device.
    A decode step with k >= the cached positions is exact dense attention.
    """
    r: int = 32
    k: int = 128
    mean_v: bool = False
    kt: str = "k"
    min_kv: Optional[int] = None

    def __post_init__(self) -> None:
        for name, least in (("r", 1), ("k", 1), ("min_kv", 0)):
            v = getattr(self, name)
            if name == "min_kv" and v is None:
                continue
            if not isinstance(v, int) or isinstance(v, bool):
                raise TypeError(f"SparQ.{name} must be an int, got {v!r}")
            if not least <= v < 2**31:
                raise ValueError(f"SparQ.{name} must be >= {least} (and below 2^31), got {v}")
        if not isinstance(self.mean_v, bool):
            raise TypeError(f"SparQ.mean_v must be a bool, got {self.mean_v!r}")
        if self.kt not in KT_TYPES:
            raise ValueError(f"SparQ.kt must be one of {', '.join(KT_TYPES)}, got {self.kt!r}")

    @property
    def spec(self) -> str:
        """The LLAMA_SPARQ / --sparq form, e.g. "r=32,k=128,mean_v=0" (",kt=q8_0", ",min_kv=N" when set)."""
        return (f"r={self.r},k={self.k},mean_v={int(self.mean_v)}" + (f",kt={self.kt}" if self.kt != "k" else "") +
                (f",min_kv={self.min_kv}" if self.min_kv is not None else ""))

    @classmethod
    def parse(cls, spec: str) -> Optional["SparQ"]:
        """"r=32,k=128[,mean_v=1][,kt=q8_0][,min_kv=N|auto]" -> SparQ; "off", "0", "none" or "" -> None."""
        if not isinstance(spec, str):
            raise TypeError(f"a SparQ setting is a string like 'r=32,k=128', not {type(spec).__name__}")
        text = spec.strip()
        if text.lower() in ("", "0", "off", "none"):
            return None
        fields: dict[str, Any] = {}
        for item in text.split(","):
            key, sep, val = item.partition("=")
            key = key.strip()
            if not sep or key not in ("r", "k", "mean_v", "kt", "min_kv"):
                raise ValueError(f"bad SparQ setting {spec!r}: use r=INT,k=INT[,mean_v=0|1][,kt=k|q8_0]"
                                 f"[,min_kv=INT|auto]")
            if key in fields:
                raise ValueError(f"bad SparQ setting {spec!r}: {key} is given twice")
            if key == "min_kv" and val.strip() == "auto":
                fields[key] = None
                continue
            if key == "kt":
                if val.strip() not in KT_TYPES:
                    raise ValueError(f"bad SparQ setting {spec!r}: kt is one of {', '.join(KT_TYPES)}")
                fields[key] = val.strip()
                continue
            try:
                num = int(val)
            except ValueError:
                raise ValueError(f"bad SparQ setting {spec!r}: {key} needs an integer, got {val.strip()!r}") from None
            if key == "mean_v":
                if num not in (0, 1):
                    raise ValueError(f"bad SparQ setting {spec!r}: mean_v is 0 or 1")
                fields[key] = bool(num)
            else:
                fields[key] = num
        if "r" not in fields or "k" not in fields:
            raise ValueError(f"bad SparQ setting {spec!r}: both r and k are needed, e.g. r=32,k=128")
        return cls(**fields)


def _min_kv_of(n: int) -> Optional[int]:
    """The C API's min_kv (LLAMA_SPARSE_SPARQ_MIN_KV_AUTO = -1: auto) as SparQ.min_kv (None: auto)."""
    return None if n < 0 else n


class _Closed:
    """Stands in for a closed Llama's native objects: any use raises instead of reaching freed memory."""

    def __init__(self, path) -> None:
        self._path = path

    def __getattr__(self, name):
        raise RuntimeError(f"{self._path} was closed; make a new Llama to use it again")


def level_name(level: SparsityLevel) -> Optional[str]:
    """Normalize a user level (None, 0.5, "0.5", "greedy-0.5", "dense") to what the C API takes."""
    if level is None:
        return None
    if isinstance(level, bool):
        raise TypeError("sparsity must be None, a float in [0, 1) or a level name like 'greedy-0.5', not a bool")
    if isinstance(level, (int, float)):
        if not 0.0 <= float(level) < 1.0:
            raise ValueError(f"sparsity must be in [0, 1), got {level}")
        if float(level) == 0.0:
            return None
        name = f"{float(level):.2f}"
        if float(name) in (0.0, 1.0):
            raise ValueError(f"sparsity {level} rounds to {name} (levels have two decimals); use 0 for dense or a "
                             "calibrated level such as 0.5")
        return name
    if isinstance(level, str):
        s = level.strip()
        if "\0" in s:
            raise ValueError(f"sparsity level {level!r} holds a NUL character")
        if s.lower() in ("", "0", "off", "dense", "none"):
            return None
        try:
            v = float(s)
        except ValueError:
            return s  # a level name such as "greedy-0.5"; the library checks it against the model
        return level_name(v)  # numbers as numbers: "0.0" is dense, "-0.5" and "1.0" are refused
    raise TypeError(f"sparsity must be None, a float or a level name, not {type(level).__name__}")


def _text_messages(messages):
    """Chat messages with list content (OpenAI content parts) as plain text: the text parts joined by newlines."""
    if not isinstance(messages, (list, tuple)):
        return messages  # llama-cpp-python says what is wrong
    out = []
    for m in messages:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, (list, tuple)):
            texts = []
            for part in content:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                if kind != "text" or not isinstance(part.get("text"), str):
                    raise ValueError(f"message content part of type {kind!r}: only text parts can be read "
                                     "(these models take text)")
                texts.append(part["text"])
            m = {**m, "content": "\n".join(texts)}
        out.append(m)
    return out


class Llama(llama_cpp.Llama):
    """llama_cpp.Llama on the llama-sparse library.

    sparsity: None (dense), a level such as 0.5, or a level name stored in the model ("greedy-0.50").
    sparq: a SparQ or "r=32,k=128" turns SparQ attention on, "off" turns it off; None leaves what the context was
    made with (LLAMA_SPARQ in the environment, else off).
    Everything else (`__call__`, `create_chat_completion`, streaming, embeddings) is llama-cpp-python's;
    `tokenize` is too, guarded against llama.cpp's C++ exceptions.
    """

    def __init__(self, model_path: Union[str, os.PathLike], *, sparsity: SparsityLevel = None,
                 sparq: Union[None, SparQ, str] = None, **kwargs: Any) -> None:
        if not isinstance(model_path, (str, os.PathLike)):
            raise TypeError(f"model_path must be a path, not {type(model_path).__name__}")
        path = Path(model_path)
        if not path.is_file():
            raise FileNotFoundError(f"model file not found: {path}")
        name = level_name(sparsity)  # validate before the (slow) load
        sparq_given = sparq is not None  # "off" turns LLAMA_SPARQ off; None leaves it
        if isinstance(sparq, str):
            sparq = SparQ.parse(sparq)
        if sparq is not None and not isinstance(sparq, SparQ):
            raise TypeError(f"sparq must be a llama_sparse.SparQ, a string like 'r=32,k=128' or None, "
                            f"not {type(sparq).__name__}")
        n_ctx = kwargs.get("n_ctx")
        if isinstance(n_ctx, int) and not isinstance(n_ctx, bool) and n_ctx > 0 and n_ctx % CTX_PAD:
            # llama.cpp pads the context anyway; llama-cpp-python would size its token arrays by the unpadded one
            kwargs["n_ctx"] = padded_ctx(n_ctx)
        start = _log.mark()
        # contexts read LLAMA_SPARSE / LLAMA_SPARQ when made; here sparsity= always decides (set below) and sparq=
        # when given, so a bad value in the environment must not fail the context
        drop = ("LLAMA_SPARSE",) + (("LLAMA_SPARQ",) if sparq_given else ())
        saved = {k: os.environ.pop(k) for k in drop if k in os.environ}
        try:
            super().__init__(model_path=str(path), **kwargs)
        except ValueError as e:
            # llama-cpp-python's message is bare; the native log (sent to /dev/null unless verbose) said why
            why = _log.reason_since(start) if str(e).startswith("Failed to") else None
            if why is None:
                raise
            raise ValueError(f"{e}: {why}") from e
        finally:
            os.environ.update(saved)
        self.set_sparsity(name)
        if sparq_given:
            self.set_sparq(sparq)
        else:
            self._sparq = self._sparq_of_context()  # LLAMA_SPARQ, read when the context was made, or off

    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = False) -> list[int]:
        """llama_cpp.Llama.tokenize, but a text the vocabulary cannot spell raises _native.TokenizeError (a
        RuntimeError) where llama.cpp's C++ exception would abort the process. Chat and completion calls
        tokenize through here too."""
        self._check_open()
        return _native.tokenize(self._model.vocab, text, add_bos, special)

    def detokenize(self, tokens, prev_tokens=None, special: bool = False) -> bytes:
        """llama_cpp.Llama.detokenize, but an id outside the vocabulary raises ValueError where llama.cpp's C++
        exception would abort the process (the server's /extras/detokenize passes ids from the request)."""
        self._check_open()
        n = self.n_vocab()
        for ids in (tokens, prev_tokens):
            if ids is None or len(ids) == 0:
                continue
            a = np.asarray(ids)
            if a.dtype.kind not in "iu" or a.ndim != 1:
                raise ValueError(f"token ids must be a list of integers, got {list(ids)[:8]!r}")
            if a.min() < 0 or a.max() >= n:
                bad = int(a[(a < 0) | (a >= n)][0])
                raise ValueError(f"token id {bad} is not in the vocabulary (0..{n - 1})")
        return super().detokenize(tokens, prev_tokens=prev_tokens, special=special)

    def create_completion(self, *args, **kwargs):
        """llama_cpp.Llama.create_completion, but bad sampling settings raise ValueError before any token (chat
        calls come here too): a grammar llama.cpp cannot parse (llama-cpp-python would add its NULL sampler and
        crash the process), a NaN or infinite temperature, p or penalty (garbage tokens), a logit_bias id outside
        the vocabulary or a non-finite bias (llama-cpp-python drops the whole bias, printing a traceback a token)."""
        bound = _COMPLETION_SIG.bind(self, *args, **kwargs).arguments
        if bound.get("grammar") is not None:
            self._check_grammar(bound["grammar"])
        for name in _FINITE_SETTINGS:
            v = bound.get(name)
            if v is not None and not (isinstance(v, numbers.Real) and math.isfinite(v)):
                raise ValueError(f"{name} must be a finite number, got {v!r}")
        for name in ("top_p", "min_p", "typical_p"):
            v = bound.get(name)
            if v is not None and not 0.0 <= v <= 1.0:
                raise ValueError(f"{name} must be between 0 and 1, got {v!r}")
        if bound.get("logit_bias"):
            self._check_logit_bias(bound["logit_bias"])
        return super().create_completion(*args, **kwargs)

    def create_chat_completion(self, *args, **kwargs):
        """llama_cpp.Llama.create_chat_completion, but a message whose content is a list of OpenAI content parts
        is read as its text parts, one a line (llama-cpp-python's templates raise TypeError on a list); a part that
        is not text (an image) raises ValueError, as these models read text only."""
        if args:
            args = (_text_messages(args[0]),) + args[1:]
        elif "messages" in kwargs:
            kwargs["messages"] = _text_messages(kwargs["messages"])
        return super().create_chat_completion(*args, **kwargs)

    def _check_logit_bias(self, bias) -> None:
        self._check_open()
        n = self.n_vocab()
        for k, v in dict(bias).items():
            try:
                tok = int(k)
            except (TypeError, ValueError):
                raise ValueError(f"logit_bias: {k!r} is not a token id") from None
            if not 0 <= tok < n:
                raise ValueError(f"logit_bias: token id {tok} is not in the vocabulary (0..{n - 1})")
            try:
                ok = math.isfinite(float(v))
            except (TypeError, ValueError):
                ok = False
            if not ok:
                raise ValueError(f"logit_bias: the bias of token {tok} must be a finite number, got {v!r}")

    def _check_grammar(self, grammar) -> None:
        self._check_open()
        start = _log.mark()
        sampler = llama_cpp.llama_sampler_init_grammar(self._model.vocab, grammar._grammar.encode("utf-8"),
                                                       grammar._root.encode("utf-8"))
        if not sampler:
            why = _log.reason_since(start)
            raise ValueError(f"grammar: llama.cpp cannot parse it ({why or 'no root rule, or a syntax error'})")
        llama_cpp.llama_sampler_free(sampler)

    def eval(self, tokens) -> None:
        self._check_open()
        super().eval(tokens)

    def __getstate__(self) -> dict:
        # pickle and copy.deepcopy rebuild the object from llama-cpp-python's settings: the knobs go along
        state = super().__getstate__()
        state["sparsity"] = None if self.sparsity == "dense" else self.sparsity
        state["sparq"] = self._sparq if self._sparq is not None else "off"
        return state

    def close(self) -> None:
        # __init__ may fail before llama_cpp.Llama set up its resources
        if hasattr(self, "_stack"):
            super().close()
        self._closed = True
        # llama_cpp.Llama's methods reach the freed model and context through these: make every use an error
        for attr in ("_model", "_ctx", "_batch"):
            if attr in self.__dict__:
                setattr(self, attr, _Closed(getattr(self, "model_path", "this model")))

    def _check_open(self) -> None:
        if getattr(self, "_closed", False):
            raise RuntimeError(f"{self.model_path} was closed; make a new Llama to use it again")

    # --- sparsity -------------------------------------------------------------------------

    @property
    def is_zigzag(self) -> bool:
        self._check_open()
        return _native.llama_sparse_model_n_zigzag(self._model.model) > 0

    @property
    def sparsity_levels(self) -> list[str]:
        self._check_open()
        m = self._model.model
        return [_native.llama_sparse_model_level_name(m, i).decode()
                for i in range(_native.llama_sparse_model_n_levels(m))]

    @property
    def sparsity(self) -> str:
        """The active level's name, or "dense"."""
        self._check_open()
        return _native.llama_sparse_get_level(self._ctx.ctx).decode()

    def set_sparsity(self, level: SparsityLevel) -> None:
        """Switch the sparsity level; it applies from the next decoded token."""
        name = level_name(level)
        self._check_open()
        if name is not None and not self.is_zigzag:
            raise ValueError(f"{self.model_path} is not a zigzag GGUF, so it cannot run sparse; "
                             "convert it with `llama-sparse convert` and calibrate it first")
        if _native.llama_sparse_set_level(self._ctx.ctx, name.encode() if name else None) != 0:
            raise ValueError(_native.last_error())

    def set_emulate(self, on: bool) -> None:
        """Apply thresholds to large batches too (per-token masking), e.g. for perplexity runs."""
        self._check_open()
        _native.llama_sparse_set_emulate(self._ctx.ctx, bool(on))

    # --- SparQ ----------------------------------------------------------------------------

    @property
    def sparq(self) -> Optional[SparQ]:
        return self._sparq

    def _sparq_of_context(self) -> Optional[SparQ]:
        r, k, mean_v = ctypes.c_int32(), ctypes.c_int32(), ctypes.c_bool()
        if not _native.llama_sparse_get_sparq(self._ctx.ctx, ctypes.byref(r), ctypes.byref(k), ctypes.byref(mean_v)):
            return None
        kt = "q8_0" if _native.llama_sparse_get_sparq_kt(self._ctx.ctx) == _GGML_TYPE_Q8_0 else "k"
        return SparQ(r=r.value, k=k.value, mean_v=bool(mean_v.value), kt=kt,
                     min_kv=_min_kv_of(_native.llama_sparse_get_sparq_min_kv(self._ctx.ctx)))

    def set_sparq(self, sparq: Union[None, SparQ, str]) -> None:
        """Turn SparQ attention on (a SparQ or "r=32,k=128[,mean_v=1]") or off (None); applies from the next token."""
        if isinstance(sparq, str):
            sparq = SparQ.parse(sparq)
        if sparq is not None and not isinstance(sparq, SparQ):
            raise TypeError(f"sparq must be a llama_sparse.SparQ, a string like 'r=32,k=128' or None, "
                            f"not {type(sparq).__name__}")
        self._check_open()
        if sparq is None:
            rc = _native.llama_sparse_set_sparq(self._ctx.ctx, 0, 0, False)
        else:
            rc = _native.llama_sparse_set_sparq_str(self._ctx.ctx, sparq.spec.encode())
        if rc != 0:
            raise ValueError(f"{self.model_path}: {_native.sparq_last_error()}")
        self._sparq = sparq

    # --- counters -------------------------------------------------------------------------

    def sparse_stats(self) -> dict[str, float]:
        """Active-column sets found since the last reset (one per matmul input and decode step, on the CPU,
        CUDA or Metal; not counted: CUDA batches of 2-8 tokens through Q4_K weights), the columns examined and
        kept, and the share skipped."""
        self._check_open()
        s = _native.llama_sparse_get_stats(self._ctx.ctx)
        skipped = 1.0 - s.n_active / s.n_cols if s.n_cols else 0.0
        return {"lists": s.n_lists, "columns": s.n_cols, "active": s.n_active, "skipped": skipped}

    def reset_stats(self) -> None:
        self._check_open()
        _native.llama_sparse_reset_stats(self._ctx.ctx)
        llama_cpp.llama_perf_context_reset(self._ctx.ctx)

    def perf(self) -> dict[str, float]:
        """Prompt and generation throughput since the last reset (llama.cpp's own timers)."""
        self._check_open()
        d = llama_cpp.llama_perf_context(self._ctx.ctx)
        # llama.cpp reports max(1, n): with no time on a timer nothing ran there (a reset, a cached prompt)
        n_p = d.n_p_eval if d.t_p_eval_ms > 0 else 0
        n_g = d.n_eval if d.t_eval_ms > 0 else 0
        return {
            "prompt_tokens": n_p,
            "prompt_tps": n_p / (d.t_p_eval_ms / 1e3) if d.t_p_eval_ms > 0 else 0.0,
            "gen_tokens": n_g,
            "gen_tps": n_g / (d.t_eval_ms / 1e3) if d.t_eval_ms > 0 else 0.0,
        }
