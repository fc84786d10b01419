"""ctypes signatures for include/llama-sparse-calib.h (calibration statistics), on the fork's libllama."""
from __future__ import annotations

import ctypes

import llama_cpp.llama_cpp as _llama

from ._native import _fn

_p = ctypes.c_void_p
_i32 = ctypes.c_int32
_fp = ctypes.POINTER(ctypes.c_float)
_dp = ctypes.POINTER(ctypes.c_double)

llama_sparse_calib_new          = _fn("llama_sparse_calib_new",          [_p, _i32], _p)
llama_sparse_calib_free         = _fn("llama_sparse_calib_free",         [_p], None)
llama_sparse_calib_error        = _fn("llama_sparse_calib_error",        [_p], ctypes.c_char_p)
llama_sparse_calib_last_error   = _fn("llama_sparse_calib_last_error",   [], ctypes.c_char_p)
llama_sparse_calib_reset        = _fn("llama_sparse_calib_reset",        [_p], None)
llama_sparse_calib_n_layer      = _fn("llama_sparse_calib_n_layer",      [_p], _i32)
llama_sparse_calib_n_tokens     = _fn("llama_sparse_calib_n_tokens",     [_p], ctypes.c_uint64)
llama_sparse_calib_n_cols       = _fn("llama_sparse_calib_n_cols",       [_p, _i32, _i32], ctypes.c_int64)
llama_sparse_calib_weight_bytes = _fn("llama_sparse_calib_weight_bytes", [_p, _i32, _i32], ctypes.c_uint64)
llama_sparse_calib_n_values     = _fn("llama_sparse_calib_n_values",     [_p, _i32, _i32], ctypes.c_uint64)
llama_sparse_calib_threshold    = _fn("llama_sparse_calib_threshold",    [_p, _i32, _i32, ctypes.c_float, _fp, _fp], _i32)
llama_sparse_calib_sparsity_at  = _fn("llama_sparse_calib_sparsity_at",  [_p, _i32, _i32, ctypes.c_float, _fp, _fp], _i32)
llama_sparse_calib_histogram    = _fn("llama_sparse_calib_histogram",    [_p, _i32, _i32, _dp, _dp, _fp, _i32], _i32)
llama_sparse_calib_sample_init  = _fn("llama_sparse_calib_sample_init",  [_p, _i32, ctypes.c_int64, ctypes.c_uint32], _i32)
llama_sparse_calib_sample_slot  = _fn("llama_sparse_calib_sample_slot",  [_p, _i32], _i32)
llama_sparse_calib_sample_width = _fn("llama_sparse_calib_sample_width", [_p, _i32, _i32], ctypes.c_int64)
llama_sparse_calib_sample_rows  = _fn("llama_sparse_calib_sample_rows",  [_p, _i32, _i32, _i32], ctypes.c_int64)
llama_sparse_calib_sample_get   = _fn("llama_sparse_calib_sample_get",   [_p, _i32, _i32, _i32, _fp, ctypes.c_int64],
                                      ctypes.c_int64)

# enum llama_sparse_calib_point: the four matmul inputs (group ids), then the residual stream entering
# the attention norm (the block input) and the ffn norm
POINT_ATTN_RESIDUAL, POINT_FFN_RESIDUAL, N_POINTS = 4, 5, 6

# the callback as llama_context_params.cb_eval wants it (a C function pointer, no Python in the loop)
eval_cb = ctypes.cast(_fn("llama_sparse_calib_eval_cb", [_p, ctypes.c_bool, _p], ctypes.c_bool),
                      _llama.ggml_backend_sched_eval_callback)


def last_error() -> str:
    msg = llama_sparse_calib_last_error()
    return msg.decode() if msg else "unknown error"


def threshold(calib: int, layer: int, group: int, sparsity: float) -> tuple[float, float]:
    """(threshold, share of error mass dropped) for the given share of |x| below the threshold."""
    t, e = ctypes.c_float(), ctypes.c_float()
    if llama_sparse_calib_threshold(calib, layer, group, sparsity, ctypes.byref(t), ctypes.byref(e)) != 0:
        raise RuntimeError(last_error())
    return t.value, e.value


def sparsity_at(calib: int, layer: int, group: int, thresh: float) -> tuple[float, float]:
    """(share of |x| below thresh, share of error mass dropped) as measured by the histograms."""
    s, e = ctypes.c_float(), ctypes.c_float()
    if llama_sparse_calib_sparsity_at(calib, layer, group, thresh, ctypes.byref(s), ctypes.byref(e)) != 0:
        raise RuntimeError(last_error())
    return s.value, e.value


def sample(calib: int, layer: int, point: int, slot: int):
    """Rows sampled for (layer, point) in slot, as a float32 array (rows, width); None if none were kept."""
    import numpy as np

    width = llama_sparse_calib_sample_width(calib, layer, point)
    rows = llama_sparse_calib_sample_rows(calib, layer, point, slot)
    if width <= 0 or rows <= 0:
        return None
    out = np.empty((rows, width), dtype=np.float32)
    got = llama_sparse_calib_sample_get(calib, layer, point, slot, out.ctypes.data_as(_fp), rows)
    if got != rows:
        raise RuntimeError(last_error())
    return out
