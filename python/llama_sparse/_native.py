"""ctypes signatures for include/llama-sparse.h, bound to the libllama that llama_cpp loaded."""
from __future__ import annotations

import ctypes

import llama_cpp.llama_cpp as _llama

_lib = _llama._lib

GROUPS = ("qkv", "o", "gate_up", "down")


class llama_sparse_stats(ctypes.Structure):
    _fields_ = [
        ("n_lists", ctypes.c_uint64),
        ("n_cols", ctypes.c_uint64),
        ("n_active", ctypes.c_uint64),
    ]


def _fn(name: str, argtypes: list, restype):
    try:
        f = getattr(_lib, name)
    except AttributeError as e:
        raise ImportError(
            f"{name} is missing from {_lib._name}: llama_cpp loaded a stock libllama, not the fork's") from e
    f.argtypes = argtypes
    f.restype = restype
    return f


_p = ctypes.c_void_p

llama_sparse_model_n_zigzag     = _fn("llama_sparse_model_n_zigzag",     [_p], ctypes.c_int32)
llama_sparse_model_n_levels     = _fn("llama_sparse_model_n_levels",     [_p], ctypes.c_int32)
llama_sparse_model_level_name   = _fn("llama_sparse_model_level_name",   [_p, ctypes.c_int32], ctypes.c_char_p)
llama_sparse_model_level_target = _fn("llama_sparse_model_level_target", [_p, ctypes.c_int32], ctypes.c_float)
llama_sparse_model_threshold    = _fn("llama_sparse_model_threshold",    [_p, ctypes.c_int32, ctypes.c_int32, ctypes.c_int], ctypes.c_float)
llama_sparse_set_level          = _fn("llama_sparse_set_level",          [_p, ctypes.c_char_p], ctypes.c_int32)
llama_sparse_get_level          = _fn("llama_sparse_get_level",          [_p], ctypes.c_char_p)
llama_sparse_set_emulate        = _fn("llama_sparse_set_emulate",        [_p, ctypes.c_bool], None)
llama_sparse_get_stats          = _fn("llama_sparse_get_stats",          [_p], llama_sparse_stats)
llama_sparse_reset_stats        = _fn("llama_sparse_reset_stats",        [_p], None)
llama_sparse_last_error         = _fn("llama_sparse_last_error",         [], ctypes.c_char_p)
llama_sparse_tokenize           = _fn("llama_sparse_tokenize",           [_p, ctypes.c_char_p, ctypes.c_int32, ctypes.POINTER(ctypes.c_int32), ctypes.c_int32, ctypes.c_bool, ctypes.c_bool], ctypes.c_int32)
llama_sparse_set_sparq          = _fn("llama_sparse_set_sparq",          [_p, ctypes.c_int32, ctypes.c_int32, ctypes.c_bool], ctypes.c_int32)
llama_sparse_set_sparq_str      = _fn("llama_sparse_set_sparq_str",      [_p, ctypes.c_char_p], ctypes.c_int32)
llama_sparse_set_sparq_kt       = _fn("llama_sparse_set_sparq_kt",       [_p, ctypes.c_int], ctypes.c_int32)
llama_sparse_get_sparq_kt       = _fn("llama_sparse_get_sparq_kt",       [_p], ctypes.c_int)
llama_sparse_set_sparq_min_kv   = _fn("llama_sparse_set_sparq_min_kv",   [_p, ctypes.c_int32], ctypes.c_int32)
llama_sparse_get_sparq_min_kv   = _fn("llama_sparse_get_sparq_min_kv",   [_p], ctypes.c_int32)
llama_sparse_get_sparq          = _fn("llama_sparse_get_sparq",          [_p, ctypes.POINTER(ctypes.c_int32), ctypes.POINTER(ctypes.c_int32), ctypes.POINTER(ctypes.c_bool)], ctypes.c_bool)
llama_sparse_sparq_last_error   = _fn("llama_sparse_sparq_last_error",   [], ctypes.c_char_p)


def last_error() -> str:
    msg = llama_sparse_last_error()
    return msg.decode("utf-8", "replace") if msg else "unknown error"


class TokenizeError(RuntimeError):
    """llama.cpp could not tokenize a text with this vocabulary (it threw, which would have aborted the process)."""


def tokenize(vocab, data: bytes, add_special: bool, parse_special: bool) -> list[int]:
    """llama_tokenize through the exception-guarded llama_sparse_tokenize; TokenizeError instead of an abort."""
    cap = len(data) + 16  # at most one token per byte, plus BOS/EOS
    for _ in range(2):
        buf = (ctypes.c_int32 * cap)()
        n = llama_sparse_tokenize(vocab, data, len(data), buf, cap, add_special, parse_special)
        if n == -(2 ** 31):
            raise TokenizeError(last_error())
        if n >= 0:
            return list(buf[:n])
        cap = -n  # the buffer was short: llama_tokenize returned minus the count it needs
    raise TokenizeError(f"llama_tokenize asked for {cap} tokens twice")


def sparq_last_error() -> str:
    msg = llama_sparse_sparq_last_error()
    return msg.decode("utf-8", "replace") if msg else "unknown error"


def library_path() -> str:
    """Path of the libllama this process runs on."""
    return _lib._name
