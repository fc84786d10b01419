"""GGML_OP_SPARQ_ATTN and its stock-ops composite (ggml_sparq_attn_ref) on the CPU against the numpy port
of the paper's Appendix B (llama_sparse.sparq_ref): random q/K/V, GQA and MHA, S from 1 to 8k,
k >= S equal to dense attention, both with and without the mean-V blend.

The graphs are built through ctypes on the fork's libggml-base / libggml-cpu.
"""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

from llama_sparse import _lib
from llama_sparse.sparq_ref import attention, sparq_attention

F32, F16, Q8_0, I32 = 0, 1, 8, 26
MEAN_V = 1


class _InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


@pytest.fixture(scope="module")
def ggml():
    base = _lib.load_ggml()
    cpu = _lib._load("ggml-cpu")
    if not hasattr(base, "ggml_sparq_attn"):
        pytest.fail(f"{_lib.lib_dir()} is not the fork's build (no ggml_sparq_attn): build with tools/setup.sh install")
    P = ctypes.c_void_p
    base.ggml_init.restype = P
    base.ggml_init.argtypes = [_InitParams]
    base.ggml_free.argtypes = [P]
    base.ggml_new_tensor_4d.restype = P
    base.ggml_new_tensor_4d.argtypes = [P, ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64]
    base.ggml_get_data.restype = P
    base.ggml_get_data.argtypes = [P]
    base.ggml_nbytes.restype = ctypes.c_size_t
    base.ggml_nbytes.argtypes = [P]
    for name in ("ggml_sparq_attn", "ggml_sparq_attn_ref"):
        fn = getattr(base, name)
        fn.restype = P
        fn.argtypes = [P, P, P, P, P, P, P, ctypes.c_float, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32]
    base.ggml_new_graph_custom.restype = P
    base.ggml_new_graph_custom.argtypes = [P, ctypes.c_size_t, ctypes.c_bool]
    base.ggml_build_forward_expand.argtypes = [P, P]
    cpu.ggml_graph_compute_with_ctx.restype = ctypes.c_int
    cpu.ggml_graph_compute_with_ctx.argtypes = [P, P, ctypes.c_int]
    return base, cpu


def _tensor(base, ctx, arr: np.ndarray, gtype: int):
    """A ggml tensor holding arr (numpy order reversed: arr.shape[-1] is ne0)."""
    ne = list(arr.shape[::-1]) + [1] * (4 - arr.ndim)
    t = base.ggml_new_tensor_4d(ctx, gtype, *ne)
    data = np.ascontiguousarray(arr, dtype=np.float16 if gtype == F16 else np.float32)
    assert base.ggml_nbytes(t) == data.nbytes
    ctypes.memmove(base.ggml_get_data(t), data.ctypes.data, data.nbytes)
    return t


def quantize_q8_0(x: np.ndarray) -> tuple[bytes, np.ndarray]:
    """ggml's Q8_0 of x along its last axis (blocks of 32): (the blocks' bytes, the values they decode to)."""
    from llama_sparse import _ggml
    raw = _ggml.quantize("q8_0", x.reshape(-1, x.shape[-1]))
    return raw.tobytes(), _ggml.dequantize("q8_0", raw, x.shape[-1]).reshape(x.shape)


def run_op(ggml, q, k, v, v_mean, mask, r, k_top, flags, kv_type=F16, mask_type=F16, composite=False, threads=2,
           kt_q8: bytes | None = None):
    """q [ns, H, T, D], k/v [ns, Hkv, S, D], v_mean [ns, T, Hkv, Dv], mask [ns, T, S] -> out [ns, T, H, Dv].
    kt_q8: the transposed K as Q8_0 blocks (quantize_q8_0 of k transposed) instead of k's type."""
    base, cpu = ggml
    ns, H, T, D = q.shape
    size = 64 * 1024 * 1024 + 64 * (q.nbytes + 4 * k.nbytes + 4 * v.nbytes + 2 * mask.nbytes * max(1, H))
    ctx = base.ggml_init(_InitParams(size, None, False))
    assert ctx
    try:
        tq = _tensor(base, ctx, q, F32)
        tk = _tensor(base, ctx, k, kv_type)
        if kt_q8 is None:
            tkt = _tensor(base, ctx, np.swapaxes(k, -1, -2), kv_type)   # [ns, Hkv, D, S]: ne [S, D, Hkv, ns]
        else:
            ns_, Hkv_, S_, D_ = k.shape
            tkt = base.ggml_new_tensor_4d(ctx, Q8_0, S_, D_, Hkv_, ns_)
            assert base.ggml_nbytes(tkt) == len(kt_q8)
            ctypes.memmove(base.ggml_get_data(tkt), kt_q8, len(kt_q8))
        tv = _tensor(base, ctx, v, kv_type)
        tm = _tensor(base, ctx, mask[:, None, :, :], mask_type)    # ne [S, T, 1, ns]
        tvm = _tensor(base, ctx, v_mean, F32) if v_mean is not None else None
        fn = base.ggml_sparq_attn_ref if composite else base.ggml_sparq_attn
        out = fn(ctx, tq, tk, tkt, tv, tm, tvm, 1.0 / np.sqrt(D), r, k_top, flags)
        gf = base.ggml_new_graph_custom(ctx, 8192, False)
        base.ggml_build_forward_expand(gf, out)
        assert cpu.ggml_graph_compute_with_ctx(ctx, gf, threads) == 0
        Dv = v.shape[-1]
        res = np.empty((ns, T, H, Dv), dtype=np.float32)
        ctypes.memmove(res.ctypes.data, base.ggml_get_data(out), res.nbytes)
        return res
    finally:
        base.ggml_free(ctx)


def make_case(rng, ns, H, Hkv, T, S, D, Dv, n_seq=1, holes=True):
    q = (rng.standard_normal((ns, H, T, D)) * (1 + 2 * (np.arange(D) % 7 == 0))).astype(np.float32)
    k = rng.standard_normal((ns, Hkv, S, D)).astype(np.float16).astype(np.float32)
    v = rng.standard_normal((ns, Hkv, S, Dv)).astype(np.float16).astype(np.float32)
    seq = rng.integers(0, n_seq, size=(ns, S))
    vis = seq[:, None, :] == (np.arange(T) % n_seq)[None, :, None]
    if holes:
        vis &= rng.random((ns, T, S)) > 0.02
    mask = np.where(vis, 0.0, -np.inf).astype(np.float32)
    # the mean of V over what each token sees, as the KV cache keeps it
    w = vis.astype(np.float64)
    v_mean = np.einsum("nts,nhsd->nthd", w, v) / np.maximum(w.sum(-1), 1)[:, :, None, None]
    return q, k, v, v_mean.astype(np.float32), mask


def numpy_ref(q, k, v, v_mean, mask, r, k_top, mean_v, k_approx=None):
    ns, H, T, D = q.shape
    Hkv = k.shape[1]
    G = H // Hkv
    qg = q.reshape(ns, Hkv, G, T, D)
    vm = np.transpose(v_mean, (0, 2, 1, 3))[:, :, None]                         # [ns, Hkv, 1, T, Dv]
    m = mask[:, None, None]                                                      # [ns, 1, 1, T, S]
    ka = None if k_approx is None else k_approx[:, :, None]
    out = sparq_attention(qg, k[:, :, None], v[:, :, None], vm, m, r, k_top, mean_v=mean_v, k_approx=ka)
    return out.reshape(ns, H, T, -1).transpose(0, 2, 1, 3)                       # [ns, T, H, Dv]


def dense_ref(q, k, v, mask):
    """Exact attention in the op's output layout [ns, T, H, Dv]."""
    ns, H, T, D = q.shape
    Hkv, Dv = k.shape[1], v.shape[-1]
    return attention(q.reshape(ns, Hkv, H // Hkv, T, D).astype(np.float64), k[:, :, None], v[:, :, None],
                     mask[:, None, None]).reshape(ns, H, T, Dv).transpose(0, 2, 1, 3)


def check_op(ggml, want, *args, **kw):
    """The op and the composite of stock ops on args, both within 1e-4 of want; returns the op's output."""
    got = run_op(ggml, *args, **kw)
    assert np.all(np.isfinite(got))
    assert rel_err(got, want) < 1e-4, rel_err(got, want)
    comp = run_op(ggml, *args, composite=True, **kw)
    assert rel_err(comp, want) < 1e-4, rel_err(comp, want)
    return got


def rel_err(a, b):
    return float(np.linalg.norm(a.astype(np.float64) - b) / np.linalg.norm(b))


CASES = [
    # ns, H, Hkv, T, S, D, Dv, n_seq, r, k
    (1, 9, 3, 1, 1, 64, 64, 1, 16, 64),        # S = 1
    (1, 9, 3, 1, 100, 64, 64, 1, 8, 10),       # SmolLM2 shape
    (1, 9, 3, 1, 2048, 64, 64, 1, 16, 256),
    (1, 9, 3, 1, 8192, 64, 64, 1, 8, 1024),    # 8k, compression 1/8
    (1, 32, 8, 1, 1024, 128, 128, 1, 32, 128), # Llama-3-8B shape
    (1, 4, 4, 1, 700, 64, 64, 1, 16, 70),      # MHA
    (1, 6, 3, 3, 500, 64, 64, 3, 16, 40),      # three sequences in one stream
    (2, 4, 2, 2, 300, 32, 48, 2, 8, 30),       # two streams, D != Dv
]


@pytest.mark.parametrize("case", CASES, ids=[f"ns{c[0]}-H{c[1]}/{c[2]}-T{c[3]}-S{c[4]}-D{c[5]}-r{c[8]}-k{c[9]}" for c in CASES])
@pytest.mark.parametrize("mean_v", [False, True])
def test_op_matches_appendix_b(ggml, case, mean_v):
    ns, H, Hkv, T, S, D, Dv, n_seq, r, k_top = case
    rng = np.random.default_rng(abs(hash((case, mean_v))) % 2**32)
    q, k, v, v_mean, mask = make_case(rng, ns, H, Hkv, T, S, D, Dv, n_seq)
    flags = MEAN_V if mean_v else 0
    want = numpy_ref(q, k, v, v_mean, mask, r, k_top, mean_v)
    # the op, and the composite of stock ops, give the port's result
    got = check_op(ggml, want, q, k, v, v_mean, mask, r, k_top, flags)
    # and the sparsity is real: far from dense when k is well below the visible count
    if k_top * 4 < (mask == 0).sum(-1).min() and r < D:
        assert rel_err(got, dense_ref(q, k, v, mask)) > 1e-3


Q8_CASES = [
    # ns, H, Hkv, T, S, D, Dv, n_seq, r, k: S a multiple of 32 (Q8_0 blocks of positions)
    (1, 9, 3, 1, 32, 64, 64, 1, 16, 8),
    (1, 9, 3, 1, 2048, 64, 64, 1, 16, 128),
    (1, 9, 3, 1, 8192, 64, 64, 1, 16, 480),    # 8k, compression 1/8 with an 8-bit k_t
    (1, 32, 8, 1, 1024, 128, 128, 1, 32, 128),
    (1, 6, 3, 3, 512, 64, 64, 3, 16, 40),      # three sequences in one stream
    (2, 4, 2, 2, 320, 32, 48, 2, 8, 30),       # two streams, D != Dv
]


@pytest.mark.parametrize("case", Q8_CASES, ids=[f"ns{c[0]}-H{c[1]}/{c[2]}-T{c[3]}-S{c[4]}-D{c[5]}-r{c[8]}-k{c[9]}" for c in Q8_CASES])
@pytest.mark.parametrize("kv_type", [F16, F32])
def test_op_q8_0_kt_matches_appendix_b(ggml, case, kv_type):
    """An 8-bit transposed K: step 1 reads the dequantized copy, steps 2-3 the exact K/V."""
    ns, H, Hkv, T, S, D, Dv, n_seq, r, k_top = case
    rng = np.random.default_rng(abs(hash((case, kv_type, "q8"))) % 2**32)
    q, k, v, v_mean, mask = make_case(rng, ns, H, Hkv, T, S, D, Dv, n_seq)
    raw, kt_deq = quantize_q8_0(np.swapaxes(k, -1, -2))                # [ns, Hkv, D, S]
    k_approx = np.swapaxes(kt_deq, -1, -2)
    assert 0 < rel_err(k_approx, k) < 0.02                            # quantized, but close
    for flags in (0, MEAN_V):
        want = numpy_ref(q, k, v, v_mean, mask, r, k_top, bool(flags), k_approx=k_approx)
        check_op(ggml, want, q, k, v, v_mean, mask, r, k_top, flags, kv_type=kv_type, kt_q8=raw)
    # k >= S: dense attention, the 8-bit copy not read
    dense = dense_ref(q, k, v, mask)
    assert rel_err(run_op(ggml, q, k, v, v_mean, mask, r, S, 0, kv_type=kv_type, kt_q8=raw), dense) < 1e-5


@pytest.mark.parametrize("S", [1, 37, 4096])
@pytest.mark.parametrize("types", [(F16, F16), (F32, F32)])
def test_k_at_least_s_is_dense(ggml, S, types):
    rng = np.random.default_rng(S)
    q, k, v, v_mean, mask = make_case(rng, 1, 9, 3, 1, S, 64, 64)
    dense = dense_ref(q, k, v, mask)
    for k_top in (S, S + 5):
        for flags in (0, MEAN_V):
            got = run_op(ggml, q, k, v, v_mean, mask, 4, k_top, flags, kv_type=types[0], mask_type=types[1])
            assert rel_err(got, dense) < 1e-5


def test_threads_agree(ggml):
    rng = np.random.default_rng(7)
    q, k, v, v_mean, mask = make_case(rng, 1, 9, 3, 2, 3000, 64, 64, n_seq=2)
    outs = [run_op(ggml, q, k, v, v_mean, mask, 16, 200, MEAN_V, threads=n) for n in (1, 2, 3)]
    assert np.array_equal(outs[0], outs[1]) and np.array_equal(outs[0], outs[2])


def test_numpy_port_k_ge_s_is_dense():
    # the reference itself: every position picked means alpha = 1 and exact attention
    rng = np.random.default_rng(3)
    q, k, v, v_mean, mask = make_case(rng, 1, 8, 2, 1, 50, 32, 32, holes=False)
    got = numpy_ref(q, k, v, v_mean, mask, 4, 50, True)
    dense = dense_ref(q, k, v, mask)
    assert rel_err(got, dense) < 1e-12
