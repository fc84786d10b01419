"""Sparse decode end to end: counters follow the level, level 0 is dense, masking emulation is exact."""
from __future__ import annotations

import ctypes
import os
import re
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from ggufedit import zigzag_with_levels
from test_runtime import _kl_top1, _logprobs, _text_tokens


@pytest.fixture(scope="module")
def leveled(smollm2_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Zigzag SmolLM2 with hand-set thresholds."""
    return zigzag_with_levels(smollm2_gguf, tmp_path_factory.mktemp("sparse"), "q8_0",
                              {"0.25": (0.25, 0.02), "0.50": (0.5, 0.05)})


def _greedy(llm, prompt: str, n: int = 24) -> str:
    return llm(prompt, max_tokens=n, temperature=0.0)["choices"][0]["text"]


def test_counters_follow_level(leveled: Path):
    import llama_sparse
    llm = llama_sparse.Llama(leveled, n_ctx=256, verbose=False)
    skipped = {}
    for level in (None, "0.25", "0.50"):
        llm.set_sparsity(level)
        llm.reset_stats()
        _greedy(llm, "Once upon a time", 12)
        s = llm.sparse_stats()
        skipped[level] = s["skipped"]
        if level is None:
            assert s["lists"] == 0  # dense decoding builds no index lists
        else:
            assert s["lists"] > 0 and 0 < s["active"] < s["columns"]
    assert 0.0 < skipped["0.25"] < skipped["0.50"] < 1.0, skipped


def test_level_zero_is_dense(leveled: Path):
    import llama_sparse
    llm = llama_sparse.Llama(leveled, n_ctx=256, verbose=False)
    dense = _greedy(llm, "The history of the Roman Empire")
    for zero in ("0.00", 0, "0"):  # a zero is dense (a file may not name a level 0.00: test_bad_input.py)
        llm.set_sparsity("0.50")
        llm.set_sparsity(zero)
        assert llm.sparsity == "dense"
        assert _greedy(llm, "The history of the Roman Empire") == dense


def test_sparse_changes_output_but_stays_coherent(leveled: Path):
    import llama_sparse
    llm = llama_sparse.Llama(leveled, n_ctx=256, logits_all=True, verbose=False)
    tokens = _text_tokens(llm, 48)
    llm.set_sparsity(None)
    dense = _logprobs(llm, tokens, stepwise=True)
    llm.set_sparsity("0.25")
    sparse = _logprobs(llm, tokens, stepwise=True)
    kl, top1 = _kl_top1(dense, sparse)
    assert kl > 0  # sparsity is really applied at batch 1
    assert top1 > 0.7, (kl, top1)


def test_emulation_matches_batch1_sparse_decode(leveled: Path):
    """Per-token masking in large batches computes what batch-1 sparse decode computes. End to end they
    differ only where rounding moves an activation across its threshold (masking is discontinuous),
    which must stay far below the effect of the sparsity itself."""
    import llama_sparse
    llm = llama_sparse.Llama(leveled, n_ctx=256, n_batch=64, logits_all=True, verbose=False)
    tokens = _text_tokens(llm, 48)
    llm.set_sparsity("0.25")
    step = _logprobs(llm, tokens, stepwise=True)
    llm.set_emulate(True)
    emulated = _logprobs(llm, tokens)
    llm.set_emulate(False)
    unmasked = _logprobs(llm, tokens)  # batched without emulation: a dense prefill
    kl_emul, top_emul = _kl_top1(step, emulated)
    kl_plain, _ = _kl_top1(step, unmasked)
    assert kl_emul < kl_plain / 4, (kl_emul, kl_plain)
    assert kl_emul < 0.02 and top_emul > 0.9, (kl_emul, top_emul)


def test_small_batches_use_the_union(leveled: Path):
    import llama_sparse
    llm = llama_sparse.Llama(leveled, n_ctx=256, n_batch=8, n_ubatch=8, logits_all=True, verbose=False)
    tokens = _text_tokens(llm, 32)
    llm.set_sparsity("0.50")
    llm.reset_stats()
    llm.reset()
    llm.eval(tokens)  # micro-batches of 8: sparse, with the union of active columns
    s8 = llm.sparse_stats()
    llm.reset_stats()
    _logprobs(llm, tokens, stepwise=True)
    s1 = llm.sparse_stats()
    assert s8["lists"] > 0 and s1["lists"] > 0
    assert s8["skipped"] < s1["skipped"]  # a union keeps more columns than each token alone


@pytest.fixture(scope="module")
def leveled_q4k(smollm2_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same levels on a q4_k zigzag SmolLM2 (gate/up Q4_K, 1536 rows; the 576-row weights Q8_0)."""
    return zigzag_with_levels(smollm2_gguf, tmp_path_factory.mktemp("sparse_q4k"), "q4_k",
                              {"0.50": (0.5, 0.05), "0.25": (0.25, 0.02)})


@pytest.mark.parametrize("use_mmap", [True, False])
def test_cpu_colmajor_layout_matches_rows(leveled_q4k: Path, capfd, monkeypatch, use_mmap):
    """LLAMA_SPARSE_CPU_LAYOUT=cols repacks the Q4_K weights at the first context (mapped: copied out into one
    huge-page arena; loaded: in place) and, on one thread (same chunks and coefficients as the row-layout
    kernel), decodes the same logits, dense and sparse. (On two
    threads it matches the row layout's list split, LLAMA_SPARSE_CPU_SPLIT=cols, exactly; that split and the
    default block-row split differ by ~1-5 % in logits on this model, both ~1-6 % from the reference.)"""
    import llama_sparse
    monkeypatch.setenv("LLAMA_SPARSE_CPU_LAYOUT", "rows")
    rows = llama_sparse.Llama(leveled_q4k, n_ctx=256, logits_all=True, n_threads=1, verbose=False)
    tokens = _text_tokens(rows, 40)
    ref = {}
    for level in (None, "0.50"):
        rows.set_sparsity(level)
        ref[level] = _logprobs(rows, tokens, stepwise=True)
    del rows

    capfd.readouterr()
    monkeypatch.setenv("LLAMA_SPARSE_CPU_LAYOUT", "cols")
    cols = llama_sparse.Llama(leveled_q4k, n_ctx=256, logits_all=True, n_threads=1, verbose=True, use_mmap=use_mmap)
    log = re.search(r"zigzag weights \(.*\) in the column-major CPU layout \((\d+) copied", capfd.readouterr().err)
    assert log is not None  # the repack ran
    assert (int(log.group(1)) > 0) == use_mmap
    for level in (None, "0.50"):
        cols.set_sparsity(level)
        got = _logprobs(cols, tokens, stepwise=True)
        assert np.abs(got - ref[level]).max() < 1e-4, level
    assert not np.allclose(ref[None], ref["0.50"])  # the level is really sparse
    del cols

    # rows32: the Q4_K weights column-major, the Q8_0 ones (576 rows) in the row layout (mapped: copied out)
    capfd.readouterr()
    monkeypatch.setenv("LLAMA_SPARSE_CPU_LAYOUT", "rows32")
    mixed = llama_sparse.Llama(leveled_q4k, n_ctx=256, logits_all=True, n_threads=1, verbose=True, use_mmap=use_mmap)
    err = capfd.readouterr().err
    n_cols = re.search(r"(\d+) zigzag weights \(.*\) in the column-major CPU layout", err)
    n_rows = re.search(r"(\d+) zigzag weights \(.*\) copied out of read-only mappings into memory \(row layout\)", err)
    assert n_cols is not None and int(n_cols.group(1)) == 2*int(mixed.metadata["llama.block_count"])  # ffn_gate, ffn_up
    assert (n_rows is not None) == use_mmap
    if use_mmap:
        assert int(n_rows.group(1)) == 5*int(mixed.metadata["llama.block_count"])  # q, k, v, o, down
    for level in (None, "0.50"):
        mixed.set_sparsity(level)
        got = _logprobs(mixed, tokens, stepwise=True)
        assert np.abs(got - ref[level]).max() < 1e-4, level


@pytest.mark.parametrize("start, layout_env, expect_cols", [
    (None, None, True), ("0.50", None, True), ("0.50", "auto", True), ("0.50", "rows", False), (None, "rows", False),
    (None, "cols", True), ("0.25", None, True), ("0.50", "rows32", True)])
def test_cpu_layout_default(leveled_q4k: Path, capfd, monkeypatch, start, layout_env, expect_cols):
    """LLAMA_SPARSE_CPU_LAYOUT unset, auto or cols: the Q4_K weights go column-major at the model's first context,
    whatever level it starts at (Llama(sparsity=...)); rows keeps the row layout. The caller's environment is left
    as it was."""
    import llama_sparse
    if layout_env is None:
        monkeypatch.delenv("LLAMA_SPARSE_CPU_LAYOUT", raising=False)
    else:
        monkeypatch.setenv("LLAMA_SPARSE_CPU_LAYOUT", layout_env)
    capfd.readouterr()
    llm = llama_sparse.Llama(leveled_q4k, n_ctx=64, n_threads=1, verbose=True, sparsity=start)
    try:
        assert ("column-major CPU layout" in capfd.readouterr().err) == expect_cols
        assert llm.sparsity == (start or "dense")
    finally:
        llm.close()
    assert os.environ.get("LLAMA_SPARSE_CPU_LAYOUT") == layout_env


def test_cpu_rows_copied_out_of_mapping(leveled_q4k: Path, capfd, monkeypatch):
    """LLAMA_SPARSE_CPU_LAYOUT=rows keeps the row layout; mapped Q4_K zigzag weights are then copied into memory (not
    with LLAMA_SPARSE_CPU_COPY=0, nor when the model was loaded without mmap), and decode the same logits."""
    import llama_sparse
    monkeypatch.setenv("LLAMA_SPARSE_CPU_LAYOUT", "rows")
    msg = "copied out of read-only mappings into memory (row layout)"
    got = {}
    for copy_env, use_mmap, expect in (("0", True, False), (None, True, True), (None, False, False)):
        if copy_env is None:
            monkeypatch.delenv("LLAMA_SPARSE_CPU_COPY", raising=False)
        else:
            monkeypatch.setenv("LLAMA_SPARSE_CPU_COPY", copy_env)
        capfd.readouterr()
        llm = llama_sparse.Llama(leveled_q4k, n_ctx=256, logits_all=True, n_threads=1, verbose=True, use_mmap=use_mmap)
        try:
            err = capfd.readouterr().err
            assert (msg in err) == expect, (copy_env, use_mmap)
            assert "column-major CPU layout" not in err
            tokens = _text_tokens(llm, 40)
            for level in (None, "0.50"):
                llm.set_sparsity(level)
                got[(copy_env, use_mmap, level)] = _logprobs(llm, tokens, stepwise=True)
        finally:
            llm.close()
    for level in (None, "0.50"):
        assert np.array_equal(got[("0", True, level)], got[(None, True, level)]), level
        assert np.array_equal(got[("0", True, level)], got[(None, False, level)]), level


@pytest.mark.parametrize("level", ["dense", "0.50"])
def test_cpu_layout_from_llama_sparse_env(leveled_q4k: Path, capfd, monkeypatch, level):
    """The fork's CLI tools start at the level in LLAMA_SPARSE: column-major there too, dense or sparse."""
    import llama_sparse
    monkeypatch.delenv("LLAMA_SPARSE_CPU_LAYOUT", raising=False)
    monkeypatch.setenv("LLAMA_SPARSE", level)
    capfd.readouterr()
    llm = llama_sparse.Llama(leveled_q4k, n_ctx=64, n_threads=1, verbose=True)
    try:
        assert "column-major CPU layout" in capfd.readouterr().err
    finally:
        llm.close()


@contextmanager
def _raw_context(path: Path, n_ctx: int, cb_eval=None):
    """(model, context) of the low-level API, 2 threads, freed on exit."""
    import llama_cpp

    model = llama_cpp.llama_model_load_from_file(str(path).encode(), llama_cpp.llama_model_default_params())
    assert model
    cparams = llama_cpp.llama_context_default_params()
    cparams.n_ctx = n_ctx
    cparams.n_threads = cparams.n_threads_batch = 2
    if cb_eval is not None:
        cparams.cb_eval = cb_eval
    ctx = llama_cpp.llama_init_from_model(model, cparams)
    try:
        assert ctx
        yield model, ctx
    finally:
        if ctx:
            llama_cpp.llama_free(ctx)
        llama_cpp.llama_model_free(model)


def _tokens(model, text: bytes) -> list[int]:
    import llama_cpp

    buf = (llama_cpp.llama_token * 64)()
    n = llama_cpp.llama_tokenize(llama_cpp.llama_model_get_vocab(model), text, len(text), buf, 64, True, False)
    return list(buf[:n])




@pytest.mark.parametrize("level", [None, "0.50"])
def test_decode_graph_keeps_siblings_adjacent(leveled: Path, level):
    """In a decode graph, matmuls that read one input (q/k/v, gate/up) are consecutive nodes: that is what lets
    a backend run them as one launch with all their outputs live (CUDA sibling groups). And the nodes CUDA runs
    with a zigzag GEMV sit next to it: the SwiGLU (and the lazy index list) before ffn_down, the residual add
    after attn_output and ffn_down (ggml_cuda_op_mul_mat_zz_fuse)."""
    import llama_cpp

    from llama_sparse import _native
    from llama_sparse._ggml import GgmlTensor

    order: list[tuple[int, str, str, list[int]]] = []   # (node, its name, src0's name, srcs)

    def cb(t, ask, _ud):
        if ask:
            node = ctypes.cast(t, ctypes.POINTER(GgmlTensor)).contents
            srcs = [ctypes.addressof(p.contents) for p in node.src if p]
            src0 = node.src[0].contents.name.decode() if node.src[0] else ""
            order.append((t, node.name.decode(), src0, srcs))
        return False

    cb_c = llama_cpp.ggml_backend_sched_eval_callback(cb)
    with _raw_context(leveled, 64, cb_c) as (_model, ctx):
        assert _native.llama_sparse_set_level(ctx, level.encode() if level else None) == 0
        for tok in (1, 2):   # a one-token batch twice; keep the second (decode) graph
            order.clear()
            arr = (llama_cpp.llama_token * 1)(tok)
            assert llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(arr, 1)) == 0
    src0s = [o[2] for o in order]
    for il in (0, 15):
        for names in (("attn_q", "attn_k", "attn_v"), ("ffn_gate", "ffn_up")):
            pos = sorted(src0s.index(f"blk.{il}.{n}.weight") for n in names)
            assert pos == list(range(pos[0], pos[0] + len(names))), (il, names, pos, src0s[pos[0]:pos[-1] + 1])
        for w in ("attn_output", "ffn_down"):
            i = src0s.index(f"blk.{il}.{w}.weight")
            # the residual add reads the matmul's output right away
            assert order[i][0] in order[i + 1][3], (il, w, [o[1] for o in order[i - 2:i + 3]])
        i = src0s.index(f"blk.{il}.ffn_down.weight")
        glu = order[i - 2] if level else order[i - 1]
        assert glu[1].startswith("ffn_swiglu"), (il, [o[1] for o in order[i - 3:i + 1]])
        if level:   # the index list over the SwiGLU's output, between it and the matmul
            assert order[i - 1][1].startswith("sparse_idx") and order[i - 1][3][0] == glu[0]
        assert glu[0] in order[i][3]


def _last_logits(ctx, model, chunks: list[list[int]]) -> np.ndarray:
    """Logits of the last token after decoding `chunks` one batch each, only the last token of a batch as output."""
    import llama_cpp

    llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)
    for chunk in chunks:
        arr = (llama_cpp.llama_token * len(chunk))(*chunk)
        assert llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(arr, len(chunk))) == 0
    n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
    return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, -1), shape=(n_vocab,)).astype(np.float64)


@pytest.mark.parametrize("level", [None, "0.50"])
def test_decode_after_prefill_matches_one_batch(leveled: Path, level):
    """A one-token decode run right after a prefill (graphs of equal node count, the allocator may keep the
    prefill's buffer plan) gives the logits that one batch over the same tokens gives. Decode graphs and
    prefill graphs must list their nodes in the same order for that plan to hold."""
    from llama_sparse import _native

    with _raw_context(leveled, 256) as (model, ctx):
        assert _native.llama_sparse_set_level(ctx, level.encode() if level else None) == 0
        tokens = _tokens(model, b"The history of the Roman Empire begins with the founding of the city, and")
        split = _last_logits(ctx, model, [tokens[:-1], tokens[-1:]])
        for _ in range(2):   # and again, now that the decode graph has been seen
            split2 = _last_logits(ctx, model, [tokens[:-1], tokens[-1:]])
        # the last token decoded on its own (sparse at 0.50) against the same token in one dense batch:
        # at level None both are dense and agree to rounding; at 0.50 compare the split runs with each other
        np.testing.assert_allclose(split2, split, rtol=0, atol=1e-4 * np.abs(split).max())
        if level is None:
            whole = _last_logits(ctx, model, [tokens])
            err = np.abs(split - whole).max() / np.abs(whole).max()
            assert err < 0.02 and split.argmax() == whole.argmax(), err


def test_prefill_is_dense_whatever_its_outputs(leveled: Path):
    """A prefill batch runs dense at any level, also where only its last token is an output (the last layer then
    sees one row): the graph's shape follows the batch, not the number of outputs, as upstream requires."""
    from llama_sparse import _native

    with _raw_context(leveled, 256) as (model, ctx):
        tokens = _tokens(model, b"It is a truth universally acknowledged, that a single man in possession of a good fortune")
        assert len(tokens) > 8
        out = {}
        for level in (None, "0.50"):
            assert _native.llama_sparse_set_level(ctx, level.encode() if level else None) == 0
            _native.llama_sparse_reset_stats(ctx)
            out[level] = _last_logits(ctx, model, [tokens])
            n_lists = _native.llama_sparse_get_stats(ctx).n_lists
            assert n_lists == 0, (level, n_lists)   # no index list built for a prefill
        np.testing.assert_array_equal(out["0.50"], out[None])


_SAME_AT_ANY_THREADS = r"""
import sys, numpy as np, llama_sparse
out = []
for nt in (1, 2, 3):
    l = llama_sparse.Llama(sys.argv[1], n_ctx=256, n_threads=nt, n_threads_batch=nt, logits_all=True,
                           sparsity=sys.argv[2], verbose=False)
    toks = l.tokenize(b"Write a short story about a cat who learns to fly. Once upon a time,")
    l.eval(toks)                      # 17 tokens: prefill (token slices on column-major Q4_K)
    for _ in range(6):                # then decode steps, greedy
        l.eval([int(np.argmax(l.scores[l.n_tokens - 1]))])
    out.append(np.array(l.scores[:l.n_tokens]))
    l.close()
print(max(float(np.abs(o - out[0]).max()) for o in out[1:]))
"""


@pytest.mark.parametrize("level", ["dense", "0.50"])
def test_split_rows_gives_the_same_logits_at_any_thread_count(leveled_q4k: Path, level: str):
    # LLAMA_SPARSE_CPU_SPLIT=rows: every output of a zigzag matmul from one thread (by default the active list is
    # split and partial sums added, whose order, and the int8 rounding after it, moves with the thread count)
    import subprocess
    import sys
    env = {**os.environ, "LLAMA_SPARSE_CPU_SPLIT": "rows"}
    r = subprocess.run([sys.executable, "-c", _SAME_AT_ANY_THREADS, str(leveled_q4k), level], capture_output=True,
                       text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert float(r.stdout.split()[-1]) == 0.0, r.stdout
