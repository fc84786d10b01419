"""SparQ attention end to end on SmolLM2 (GQA 9/3, head size 64): knobs, errors, and the KV-cache copies.

Decode runs one token per step (llm.eval([t])), so SparQ is active; the prompt is prefilled densely.
The transposed K copy and the V sums are checked through their effect: a copy rebuilt on the host after an
enable, a removal or a state load must give the same logits as the copy kept up to date in the graph.
"""
from __future__ import annotations

import contextlib
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from test_runtime import _text_tokens

N_CTX = 512


def _llm(model: Path, **kw):
    import llama_sparse
    return llama_sparse.Llama(model, n_ctx=N_CTX, n_batch=256, n_threads=2, logits_all=True, verbose=False, **kw)


def _decode(llm, prompt: list[int], gen: list[int], fresh: bool = True) -> np.ndarray:
    """Prefill prompt (dense), then decode gen one token at a time; log-probabilities of each decode step."""
    if fresh:
        llm.reset()
        llm.eval(prompt)
    out = []
    for t in gen:
        llm.eval([t])
        out.append(np.array(llm.scores[llm.n_tokens - 1], dtype=np.float64))
    s = np.stack(out)
    s -= s.max(axis=1, keepdims=True)
    return s - np.log(np.exp(s).sum(axis=1, keepdims=True))


def _kl(ref: np.ndarray, got: np.ndarray) -> tuple[float, float]:
    """Mean KL(ref || got) per step, and the share of steps with the same top token.

    SmolLM2's decode logits are sensitive: dense flash and non-flash attention differ by KL ~5e-3 on this
    text. Different-but-exact computations are held to that scale; the same computation to ~0."""
    kl = float((np.exp(ref) * (ref - got)).sum(axis=1).mean())
    return kl, float((ref.argmax(axis=1) == got.argmax(axis=1)).mean())


@pytest.fixture(scope="module")
def tokens(smollm2_gguf: Path) -> list[int]:
    llm = _llm(smollm2_gguf)
    toks = _text_tokens(llm, 200)
    assert len(toks) >= 180
    return toks


def test_sparq_settings_validate():
    from llama_sparse import SparQ
    assert SparQ.parse("r=16,k=64") == SparQ(r=16, k=64, mean_v=False)
    assert SparQ.parse(" r=8 , k=32 , mean_v=1 ") == SparQ(r=8, k=32, mean_v=True)
    assert SparQ.parse("off") is None and SparQ.parse("") is None
    assert SparQ(r=4, k=9).spec == "r=4,k=9,mean_v=0"
    assert SparQ.parse("r=16,k=64,kt=q8_0") == SparQ(r=16, k=64, kt="q8_0")
    assert SparQ(r=4, k=9, kt="q8_0").spec == "r=4,k=9,mean_v=0,kt=q8_0"
    assert SparQ.parse("r=4,k=9,kt=k") == SparQ(r=4, k=9)
    assert SparQ.parse("r=4,k=9,min_kv=16384") == SparQ(r=4, k=9, min_kv=16384)
    assert SparQ(r=4, k=9, min_kv=512).spec == "r=4,k=9,mean_v=0,min_kv=512"
    assert SparQ.parse(SparQ(r=4, k=9, kt="q8_0", min_kv=7).spec) == SparQ(r=4, k=9, kt="q8_0", min_kv=7)
    # min_kv: auto (None) by default and where left out; 0 is kept in the string (from the start on every device)
    assert SparQ(r=4, k=9).min_kv is None and SparQ.parse("r=4,k=9,min_kv=auto") == SparQ(r=4, k=9)
    assert SparQ(r=4, k=9, min_kv=0).spec == "r=4,k=9,mean_v=0,min_kv=0"
    assert SparQ.parse(SparQ(r=4, k=9, min_kv=0).spec) == SparQ(r=4, k=9, min_kv=0)
    with pytest.raises(ValueError, match="kt"):
        SparQ.parse("r=4,k=9,kt=q4_0")
    with pytest.raises(ValueError, match="kt"):
        SparQ(r=4, k=9, kt="f8")
    for bad, err in [("r=16", ValueError), ("k=3", ValueError), ("r=x,k=3", ValueError), ("r=1,k=2,q=3", ValueError),
                     ("r=0,k=5", ValueError), ("r=5,k=-1", ValueError), ("r=1,k=1,mean_v=2", ValueError),
                     ("r=1,k=1,min_kv=-1", ValueError), ("r=1,k=1,min_kv=x", ValueError)]:
        with pytest.raises(err):
            SparQ.parse(bad)
    with pytest.raises(TypeError):
        SparQ(r=1.5, k=3)
    with pytest.raises(TypeError):
        SparQ(r=2, k=3, mean_v=1)
    with pytest.raises(ValueError):
        SparQ(r=2, k=0)


def test_knobs_and_errors(smollm2_gguf: Path):
    from llama_sparse import SparQ, _native
    import ctypes
    llm = _llm(smollm2_gguf, sparq=SparQ(r=16, k=32))
    assert llm.sparq == SparQ(r=16, k=32)
    r, k, mv = ctypes.c_int32(), ctypes.c_int32(), ctypes.c_bool()
    assert _native.llama_sparse_get_sparq(llm._ctx.ctx, ctypes.byref(r), ctypes.byref(k), ctypes.byref(mv))
    assert (r.value, k.value, mv.value) == (16, 32, False)
    llm.set_sparq("r=8,k=64,mean_v=1")
    assert llm.sparq == SparQ(r=8, k=64, mean_v=True)
    llm.set_sparq(None)
    assert llm.sparq is None
    assert not _native.llama_sparse_get_sparq(llm._ctx.ctx, None, None, None)
    with pytest.raises(TypeError):
        llm.set_sparq(32)
    with pytest.raises(ValueError, match="r=INT"):
        llm.set_sparq("r:3")
    # the C API refuses half settings with a message
    assert _native.llama_sparse_set_sparq(llm._ctx.ctx, 4, 0, False) == -1
    assert "both" in _native.sparq_last_error()
    # min_kv: kept while off, set by the string (auto, -1, where left out), refused below -1 and by the string parser
    assert _native.llama_sparse_get_sparq_min_kv(llm._ctx.ctx) == -1
    assert _native.llama_sparse_set_sparq_min_kv(llm._ctx.ctx, 4096) == 0
    assert _native.llama_sparse_get_sparq_min_kv(llm._ctx.ctx) == 4096
    llm.set_sparq("r=8,k=64,min_kv=1000")
    assert _native.llama_sparse_get_sparq_min_kv(llm._ctx.ctx) == 1000
    assert llm.sparq.min_kv == 1000
    llm.set_sparq("r=8,k=64")
    assert _native.llama_sparse_get_sparq_min_kv(llm._ctx.ctx) == -1
    llm.set_sparq("r=8,k=64,min_kv=0")
    assert _native.llama_sparse_get_sparq_min_kv(llm._ctx.ctx) == 0
    assert _native.llama_sparse_set_sparq_min_kv(llm._ctx.ctx, -1) == 0
    assert _native.llama_sparse_get_sparq_min_kv(llm._ctx.ctx) == -1
    assert _native.llama_sparse_set_sparq_min_kv(llm._ctx.ctx, -5) == -1
    assert "min_kv" in _native.sparq_last_error()
    assert _native.llama_sparse_set_sparq_str(llm._ctx.ctx, b"r=8,k=64,min_kv=-5") == -1
    assert "min_kv" in _native.sparq_last_error()
    llm.set_sparq(None)
    # a quantized KV cache cannot hold the transposed copy: a clear error, no crash
    with pytest.raises(ValueError, match="f16 or f32"):
        _llm(smollm2_gguf, sparq=SparQ(r=16, k=32), type_k=8, flash_attn=True)  # 8 = GGML_TYPE_Q8_0


def test_k_beyond_context_is_dense(smollm2_gguf: Path, tokens: list[int]):
    llm = _llm(smollm2_gguf)
    prompt, gen = tokens[:100], tokens[100:110]
    dense = _decode(llm, prompt, gen)
    # k above every cached position: the graph keeps upstream's attention
    llm.set_sparq("r=8,k=100000")
    assert np.array_equal(_decode(llm, prompt, gen), dense)
    # k above the visible positions but below the cache view (padded to 256 cells): the op's exact path
    llm.set_sparq("r=8,k=200")
    kl, top1 = _kl(dense, _decode(llm, prompt, gen))
    assert kl < 0.02 and top1 >= 0.8, (kl, top1)


def test_min_kv_keeps_short_contexts_dense(smollm2_gguf: Path, tokens: list[int]):
    # the cache view is 256 cells up to 256 tokens, then 512 (N_CTX): prompt 240, decode across the step
    llm = _llm(smollm2_gguf)
    prompt, gen = tokens[:160], tokens[160:180]
    long_prompt = (tokens * 2)[:240]
    gen2 = (tokens * 2)[240:270]
    dense = _decode(llm, prompt, gen)
    dense2 = _decode(llm, long_prompt, gen2)
    llm.set_sparq("r=8,k=16,min_kv=512")
    assert np.array_equal(_decode(llm, prompt, gen), dense)  # a 256-cell view, below min_kv: dense
    got = _decode(llm, long_prompt, gen2)
    # steps 0-15 attend over up to 256 cells (dense); from step 16 (257 cells and more) the view is 512: SparQ
    assert np.array_equal(got[:16], dense2[:16])
    assert not np.array_equal(got[16:], dense2[16:])
    assert _kl(dense2[16:], got[16:])[0] > _kl(dense2[16:], dense2[16:])[0]
    # below min_kv the copy is not kept; the first step at min_kv rebuilds it from the cache. SparQ turned on at
    # step 16 instead (its copy rebuilt when it comes on) gives the same steps bit for bit
    llm.set_sparq(None)
    llm.reset()
    llm.eval(long_prompt)
    _decode(llm, long_prompt, gen2[:16], fresh=False)
    llm.set_sparq("r=8,k=16")
    assert np.array_equal(_decode(llm, long_prompt, gen2[16:], fresh=False), got[16:])
    # at min_kv 256 (the smallest view) SparQ runs from the first step, as with min_kv 0, and as auto does with the
    # cache on the CPU
    llm.set_sparq("r=8,k=16,min_kv=256")
    on256 = _decode(llm, prompt, gen)
    llm.set_sparq("r=8,k=16,min_kv=0")
    assert np.array_equal(_decode(llm, prompt, gen), on256)
    llm.set_sparq("r=8,k=16")
    assert llm.sparq.min_kv is None
    assert np.array_equal(_decode(llm, prompt, gen), on256)
    assert not np.array_equal(on256, dense)


def test_sparse_decode_changes_logits_by_compression(smollm2_gguf: Path, tokens: list[int]):
    llm = _llm(smollm2_gguf)
    prompt, gen = tokens[:160], tokens[160:168]
    dense = _decode(llm, prompt, gen)
    errs = {}
    for spec in ("r=64,k=150", "r=8,k=16"):
        llm.set_sparq(spec)
        errs[spec] = _kl(dense, _decode(llm, prompt, gen))[0]
    llm.set_sparq("r=8,k=16,mean_v=1")
    mean_v = _kl(dense, _decode(llm, prompt, gen))[0]
    llm.set_sparq(None)
    assert np.array_equal(_decode(llm, prompt, gen), dense)
    # r = head size and k close to the context: about dense; strong compression moves far away
    assert 0 < errs["r=64,k=150"] < 0.03 < 0.1 < errs["r=8,k=16"], errs
    assert mean_v != errs["r=8,k=16"]


@pytest.mark.parametrize("kt", ["", ",kt=q8_0"])
def test_copies_rebuilt_on_host_match_graph_appends(smollm2_gguf: Path, tokens: list[int], kt: str):
    prompt, gen = tokens[:150], tokens[150:158]
    spec = "r=16,k=24,mean_v=1" + kt
    # SparQ on from the start: the copies are appended in the graph (prefill and decode)
    on = _llm(smollm2_gguf, sparq=spec)
    ref = _decode(on, prompt, gen)
    # enabled after the prefill: both copies are rebuilt from the cache on the host
    late = _llm(smollm2_gguf)
    late.reset()
    late.eval(prompt)
    late.set_sparq(spec)
    assert _kl(ref, _decode(late, prompt, gen, fresh=False)) == (0.0, 1.0)  # bit-identical copies
    # a removal in the middle of decoding (V sums rebuilt), then the same tokens again
    on.reset()
    on.eval(prompt)
    _decode(on, prompt, gen[:6], fresh=False)
    on.n_tokens -= 4  # llama-cpp-python removes positions >= n_tokens before the next eval
    kl, top1 = _kl(ref[2:], _decode(on, prompt, gen[2:], fresh=False))
    assert kl < 1e-4 and top1 == 1.0, (kl, top1)
    # off for a while (no appends), then on again: rebuilt
    on.reset()
    on.eval(prompt[:100])
    on.set_sparq(None)
    on.eval(prompt[100:])
    on.set_sparq(spec)
    kl, top1 = _kl(ref, _decode(on, prompt, gen, fresh=False))
    assert kl < 1e-4 and top1 == 1.0, (kl, top1)


def test_kt_q8_0_blocks_kept_at_decode(smollm2_gguf: Path, tokens: list[int]):
    """The 8-bit copy: decode requantizes the 32-cell blocks it writes into; a copy rebuilt from the K cache at
    the same point gives the same logits, and the copy reads differently from the f16 one."""
    from llama_sparse import SparQ, _native
    prompt, gen = tokens[:150], tokens[150:170]  # the decode crosses the cell-160 block boundary
    spec = "r=16,k=24,kt=q8_0"
    a = _llm(smollm2_gguf, sparq=spec)
    assert a.sparq == SparQ(r=16, k=24, kt="q8_0")
    assert _native.llama_sparse_get_sparq_kt(a._ctx.ctx) == 8  # GGML_TYPE_Q8_0
    ref = _decode(a, prompt, gen)
    # decode half with appends, pause (no appends: stale), back on: rebuilt from the K cache
    a.reset()
    a.eval(prompt)
    _decode(a, prompt, gen[:10], fresh=False)
    a.set_sparq(None)
    a.set_sparq(spec)
    kl, top1 = _kl(ref[10:], _decode(a, prompt, gen[10:], fresh=False))
    assert kl < 1e-4 and top1 == 1.0, (kl, top1)
    # the 8-bit copy is read: not the f16 copy's logits, but close to them
    f16 = _decode(_llm(smollm2_gguf, sparq="r=16,k=24"), prompt, gen)
    kl, top1 = _kl(f16, ref)
    assert 0 < kl < 0.05 and top1 >= 0.8, (kl, top1)
    # switching storage reallocates the copy; off keeps the setting for the next enable
    a.set_sparq("r=16,k=24")
    assert _native.llama_sparse_get_sparq_kt(a._ctx.ctx) > 8  # GGML_TYPE_COUNT: the K cache's type
    kl, _ = _kl(f16, _decode(a, prompt, gen))
    assert kl < 1e-4, kl
    assert _native.llama_sparse_set_sparq_kt(a._ctx.ctx, 2) == -1  # Q4_0: refused with a message
    assert "q8_0" in _native.sparq_last_error()


def test_graph_reuse_with_sparq_on(smollm2_gguf: Path, tokens: list[int], monkeypatch):
    """Decode graphs with SparQ on are reused token to token (like upstream's), with the same logits as when
    every graph is rebuilt; a knob change or a removal (stale V sums, rebuilt in set_input) must still hold."""
    import llama_cpp
    prompt, gen = tokens[:150], tokens[150:162]
    spec = "r=16,k=24,mean_v=1"

    def run(llm):
        llama_cpp.llama_perf_context_reset(llm.ctx)
        out = [_decode(llm, prompt, gen[:8])]
        llm.n_tokens -= 3  # removal: V sums rebuilt on the host before the next graph runs
        out.append(_decode(llm, prompt, gen[5:], fresh=False))
        llm.set_sparq("r=8,k=16")  # a retune: no graph built for the old knobs may run
        out.append(_decode(llm, prompt, gen[:4]))
        return out, llama_cpp.llama_perf_context(llm.ctx).n_reused

    monkeypatch.setenv("LLAMA_GRAPH_REUSE_DISABLE", "1")
    ref, reused_off = run(_llm(smollm2_gguf, sparq=spec))
    monkeypatch.delenv("LLAMA_GRAPH_REUSE_DISABLE")
    got, reused_on = run(_llm(smollm2_gguf, sparq=spec))
    assert reused_off == 0 and reused_on >= len(gen), (reused_off, reused_on)
    for a, b in zip(ref, got):
        assert np.array_equal(a, b)


def test_mean_v_turned_on_later(smollm2_gguf: Path, tokens: list[int]):
    """With mean-V off the graphs do not keep the V sums; turning it on must rebuild them from the cache."""
    prompt, gen = tokens[:150], tokens[150:158]
    ref = _decode(_llm(smollm2_gguf, sparq="r=16,k=24,mean_v=1"), prompt, gen)
    late = _llm(smollm2_gguf, sparq="r=16,k=24")
    late.reset()
    late.eval(prompt)
    off = _decode(late, prompt, gen[:3], fresh=False)  # decode with the sums not kept
    late.n_tokens -= 3
    late.set_sparq("r=16,k=24,mean_v=1")
    kl, top1 = _kl(ref, _decode(late, prompt, gen, fresh=False))
    assert kl < 1e-4 and top1 == 1.0, (kl, top1)
    assert _kl(ref[:3], off)[0] > 1e-4  # mean-V changes the output, so the check above can fail

    # on, off for 3 decoded tokens that stay in the cache, on again: the sums must count those tokens too.
    # Reference: the same steps with every copy rebuilt from the cache (a state load) before mean-V comes back.
    def on_off_on(reload: bool) -> np.ndarray:
        llm = _llm(smollm2_gguf, sparq="r=16,k=24,mean_v=1")
        llm.reset()
        llm.eval(prompt)
        llm.set_sparq("r=16,k=24")
        _decode(llm, prompt, gen[:3], fresh=False)
        if reload:
            llm.load_state(llm.save_state())
        llm.set_sparq("r=16,k=24,mean_v=1")
        return _decode(llm, prompt, gen[3:], fresh=False)
    kl, top1 = _kl(on_off_on(True), on_off_on(False))
    assert kl < 1e-4 and top1 == 1.0, (kl, top1)


@pytest.mark.parametrize("kt", ["", ",kt=q8_0"])
def test_state_save_load(smollm2_gguf: Path, tokens: list[int], kt: str):
    prompt, gen = tokens[:150], tokens[150:160]
    a = _llm(smollm2_gguf, sparq="r=16,k=24" + kt)
    ref = _decode(a, prompt, gen)
    a.reset()
    a.eval(prompt)
    state = a.save_state()
    b = _llm(smollm2_gguf, sparq="r=16,k=24" + kt)
    b.load_state(state)
    kl, top1 = _kl(ref, _decode(b, prompt, gen, fresh=False))
    assert kl < 1e-4 and top1 == 1.0, (kl, top1)


@pytest.mark.parametrize("kt", ["", ",kt=q8_0"])
def test_k_shift_follows(smollm2_gguf: Path, tokens: list[int], kt: str):
    """Drop the first 40 positions and shift the rest down (a context shift): K is re-roped in the cache and
    the transposed copy must follow. Context a has SparQ on across the shift; context b turns it on only
    after the shift (its copy is built from the shifted K). A copy left behind would change a's selection."""
    import llama_cpp
    prompt, gen = tokens[:160], tokens[160:168]
    spec = "r=16,k=24" + kt

    def shifted(llm):
        llm.reset()
        llm.eval(prompt)
        mem = llama_cpp.llama_get_memory(llm._ctx.ctx)
        llama_cpp.llama_memory_seq_rm(mem, 0, 0, 40)
        llama_cpp.llama_memory_seq_add(mem, 0, 40, -1, -40)
        llm.input_ids[: len(prompt) - 40] = llm.input_ids[40: len(prompt)]
        llm.n_tokens = len(prompt) - 40

    # a: SparQ on (copies kept) across the shift; the step that applies the shift attends densely (k beyond
    # the cache), so a and b store the same K/V for it
    a = _llm(smollm2_gguf, sparq="r=16,k=100000" + kt)
    shifted(a)
    a.eval(gen[:1])
    a.set_sparq(spec)
    got = _decode(a, prompt, gen[1:], fresh=False)
    b = _llm(smollm2_gguf)
    shifted(b)
    b.eval(gen[:1])
    b.set_sparq(spec)
    want = _decode(b, prompt, gen[1:], fresh=False)
    kl, top1 = _kl(want, got)
    assert kl < 1e-4 and top1 == 1.0, (kl, top1)


SPECS = ["r=8,k=16", " r=8 , k=16 ", "r=8,k=16,mean_v=1,kt=q8_0,min_kv=300", "r=8,k=16,min_kv=auto", "off", "",
         "r=32,r=16,k=8", "r=4294967304,k=16", "k=-2147483649,r=8", "r=8,k=2147483648", "r=8", "R=8,k=16",
         "r=8,k=16,foo=1", "r=8,k=16,mean_v=2", "r=0,k=16", "r=8,k=16,", "r=8,k=16,kt=q4_0", "r=8,k=16,min_kv=-5"]


@pytest.mark.parametrize("spec", SPECS)
def test_c_parser_agrees_with_python(smollm2_gguf: Path, spec: str):
    """LLAMA_SPARQ goes through the C parser (the C tools, and Python where sparq= is not given) and --sparq through
    SparQ.parse: one string must mean one setting. The C parser wrapped numbers past 32 bits (r=4294967304 ran as
    r=8) and took the last of a repeated key."""
    from llama_sparse import SparQ, _native
    import ctypes
    try:
        want = SparQ.parse(spec)
        py_ok = True
    except ValueError:
        py_ok = False
    llm = _llm(smollm2_gguf)
    rc = _native.llama_sparse_set_sparq_str(llm._ctx.ctx, spec.encode())
    assert (rc == 0) == py_ok, (spec, _native.sparq_last_error())
    if py_ok:
        r, k, mv = ctypes.c_int32(), ctypes.c_int32(), ctypes.c_bool()
        on = _native.llama_sparse_get_sparq(llm._ctx.ctx, ctypes.byref(r), ctypes.byref(k), ctypes.byref(mv))
        got = None if not on else (r.value, k.value, mv.value)
        assert got == (None if want is None else (want.r, want.k, want.mean_v)), spec
        if want is not None:
            assert _native.llama_sparse_get_sparq_min_kv(llm._ctx.ctx) == (-1 if want.min_kv is None else want.min_kv)
    else:
        assert _native.sparq_last_error().startswith(f"SparQ setting '{spec}': "), _native.sparq_last_error()


def test_refused_string_changes_nothing(smollm2_gguf: Path):
    """A string refused at its last step (SparQ on a quantized K cache) used to leave its kt and min_kv set."""
    from llama_sparse import _native
    llm = _llm(smollm2_gguf, type_k=8, flash_attn=True)  # 8 = GGML_TYPE_Q8_0: no transposed copy possible
    assert _native.llama_sparse_set_sparq_min_kv(llm._ctx.ctx, 4096) == 0
    assert _native.llama_sparse_set_sparq_str(llm._ctx.ctx, b"r=8,k=16,min_kv=100,kt=q8_0") == -1
    assert "f16 or f32" in _native.sparq_last_error()
    assert _native.llama_sparse_get_sparq_min_kv(llm._ctx.ctx) == 4096
    assert _native.llama_sparse_get_sparq_kt(llm._ctx.ctx) == 43  # GGML_TYPE_COUNT (0c1e570): the K cache's type


def test_env_var_for_tools(smollm2_gguf: Path):
    """LLAMA_SPARQ reaches contexts made by the fork's C tools; a bad value stops them with the reason."""
    from llama_sparse.tools import tool_path
    import os
    exe = tool_path("completion")
    env = dict(os.environ, LLAMA_SPARQ="r=8,k=16")
    r = subprocess.run([str(exe), "-m", str(smollm2_gguf), "-p", "Once upon a time", "-n", "8", "-no-cnv",
                        "-c", "256", "-t", "2", "--temp", "0", "-v"], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "SparQ attention on: r = 8, k = 16" in r.stderr
    env["LLAMA_SPARQ"] = "r=8,k=zero"
    r = subprocess.run([str(exe), "-m", str(smollm2_gguf), "-p", "Hi", "-n", "2", "-no-cnv", "-c", "256"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode != 0 and "LLAMA_SPARQ" in r.stderr and "integer" in r.stderr, r.stderr[-2000:]
    # a good string the cache cannot take (q8_0 K) says why on stderr too (llama-bench mutes the log)
    env["LLAMA_SPARQ"] = "r=8,k=16"
    r = subprocess.run([str(exe), "-m", str(smollm2_gguf), "-p", "Hi", "-n", "2", "-no-cnv", "-c", "256", "-ctk", "q8_0",
                        "-fa", "on"], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode != 0 and "llama-sparse: LLAMA_SPARQ='r=8,k=16': " in r.stderr, r.stderr[-2000:]
    # LLAMA_SPARSE_EMULATE takes 1/0 (and true/false, on/off, yes/no); anything else stops the tool
    env = dict(os.environ, LLAMA_SPARSE_EMULATE="maybe")
    r = subprocess.run([str(exe), "-m", str(smollm2_gguf), "-p", "Hi", "-n", "2", "-no-cnv", "-c", "256"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode != 0 and "LLAMA_SPARSE_EMULATE='maybe': use 1 (on) or 0 (off)" in r.stderr, r.stderr[-2000:]


@pytest.mark.parametrize("fa,kt", [("on", "k"), ("off", "k"), ("on", "q8_0")])
def test_preload_runs_the_op_when_the_copy_is_made(smollm2_gguf: Path, fa: str, kt: str):
    """Enabling SparQ runs the op once on a small input per device and variant, so a GPU loads its kernels at
    context creation, not at the decode step where the view reaches min_kv. Only GPU devices by default;
    LLAMA_SPARSE_SPARQ_PRELOAD=2 takes the CPU too, which checks the preload's graph for each cache layout."""
    from llama_sparse.tools import tool_path
    import os
    exe = tool_path("completion")
    cmd = [str(exe), "-m", str(smollm2_gguf), "-p", "Once upon a time", "-n", "4", "-no-cnv", "-c", "256", "-t", "2",
           "--temp", "0", "-v", "-fa", fa]
    out = {}
    for mode in ("2", "1", "0"):
        env = dict(os.environ, LLAMA_SPARQ=f"r=8,k=16,kt={kt}", LLAMA_SPARSE_SPARQ_PRELOAD=mode)
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        out[mode] = r
    want = f"SparQ op loaded on CPU (D 64, 9/3 heads, k_t {'q8_0' if kt == 'q8_0' else 'f16'}) in"
    assert out["2"].stderr.count("SparQ op loaded on") == 1, out["2"].stderr[-3000:]  # one variant: once, not per layer
    assert want in out["2"].stderr, out["2"].stderr[-3000:]
    assert "SparQ op loaded" not in out["1"].stderr and "SparQ op loaded" not in out["0"].stderr
    # the preload leaves decode as it was
    assert out["2"].stdout == out["0"].stdout


@pytest.mark.parametrize("kt", ["k", "q8_0"])
def test_copy_not_kept_below_min_kv(smollm2_gguf: Path, kt: str):
    """Below min_kv no graph appends to the transposed K copy; the first graph at min_kv rebuilds it once from the
    cache. LLAMA_SPARSE_SPARQ_KEEP_COPY=1 appends always (rebuilt at the first graph, from the empty cache).
    Greedy text is the same either way."""
    from llama_sparse.tools import tool_path
    import os
    exe = tool_path("completion")

    def run(n: int, min_kv: int, keep: str) -> subprocess.CompletedProcess:
        env = dict(os.environ, LLAMA_SPARQ=f"r=8,k=16,kt={kt},min_kv={min_kv}", LLAMA_SPARSE_SPARQ_KEEP_COPY=keep)
        r = subprocess.run([str(exe), "-m", str(smollm2_gguf), "-p", "Once upon a time", "-n", str(n), "-no-cnv",
                            "-c", "1024", "-t", "2", "--temp", "0", "-v", "--ignore-eos"],
                           capture_output=True, text=True, env=env, timeout=600)
        assert r.returncode == 0, r.stderr[-2000:]
        return r

    rebuilt = "SparQ K copy rebuilt"
    # never reaching min_kv: never kept, never rebuilt
    assert run(8, 1024, "0").stderr.count(rebuilt) == 0
    assert run(8, 1024, "1").stderr.count(rebuilt) >= 1  # (Q8_0: again after the warm-up's removal)
    # crossing it (the view grows from 256 to 512 cells at the 257th): one rebuild there
    cross, keep = run(300, 512, "0"), run(300, 512, "1")
    assert cross.stderr.count(rebuilt) == 1 and keep.stderr.count(rebuilt) >= 1
    assert cross.stdout == keep.stdout


def test_env_var_for_python(smollm2_gguf: Path, tokens: list[int], monkeypatch):
    """Llama() without sparq= keeps what LLAMA_SPARQ set up (the context reads it when made); sparq="off" ends it.
    The env-enabled context decodes as one given the same setting in Python."""
    from llama_sparse import SparQ
    prompt, gen = tokens[:150], tokens[150:158]
    ref = _llm(smollm2_gguf, sparq="r=8,k=16,min_kv=0")
    want = _decode(ref, prompt, gen)
    ref.close()
    monkeypatch.setenv("LLAMA_SPARQ", "r=8,k=16")
    env = _llm(smollm2_gguf)
    assert env.sparq == SparQ(r=8, k=16), env.sparq
    got = _decode(env, prompt, gen)
    kl, top1 = _kl(want, got)
    assert kl < 1e-9 and top1 == 1.0, (kl, top1)
    env.close()
    off = _llm(smollm2_gguf, sparq="off")
    assert off.sparq is None
    dense = _decode(off, prompt, gen)
    assert np.abs(dense - got).max() > 1e-6  # SparQ at k 16 of ~158 positions differs from dense attention
    off.close()
    monkeypatch.setenv("LLAMA_SPARQ", "r=8,k=16,min_kv=4096")
    assert _llm(smollm2_gguf).sparq == SparQ(r=8, k=16, min_kv=4096)


def test_cli_sparq_flag(smollm2_gguf: Path):
    base = [sys.executable, "-m", "llama_sparse"]
    r = subprocess.run(base + ["generate", str(smollm2_gguf), "-p", "The capital of France is", "-n", "6",
                               "-c", "256", "-t", "2", "--sparq", "r=16,k=32"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "sparq r=16,k=32" in r.stderr
    r = subprocess.run(base + ["generate", str(smollm2_gguf), "-p", "x", "--sparq", "r=16"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "both r and k" in r.stderr
    # LLAMA_SPARQ applies without the flag; --sparq off turns it off
    import os
    env = dict(os.environ, LLAMA_SPARQ="r=8,k=16")
    gen = base + ["generate", str(smollm2_gguf), "-p", "The capital of France is", "-n", "2", "-c", "256", "-t", "2"]
    r = subprocess.run(gen, capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0 and "sparq r=8,k=16" in r.stderr, r.stderr[-2000:]
    r = subprocess.run(gen + ["--sparq", "off"], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0 and "sparq off" in r.stderr, r.stderr[-2000:]


@contextlib.contextmanager
def _two_seq_context(owner, unified: bool):
    """A context for two sequences on owner's model (n_seq_max 2, one stream if unified), and decode(items,
    last_only=False) for items (seq, pos, token) in one batch, returning the logits of each item (or the last)."""
    import llama_cpp
    params = llama_cpp.llama_context_default_params()
    params.n_ctx, params.n_batch, params.n_ubatch, params.n_seq_max = 1024, 256, 256, 2
    params.n_threads = params.n_threads_batch = 2
    params.kv_unified = unified
    n_vocab = owner.n_vocab()
    ctx = llama_cpp.llama_init_from_model(owner._model.model, params)
    assert ctx
    batch = llama_cpp.llama_batch_init(256, 0, 2)

    def decode(items, last_only=False):
        batch.n_tokens = len(items)
        for i, (s, p, t) in enumerate(items):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = t, p, 1
            batch.seq_id[i][0], batch.logits[i] = s, int(not last_only or i == len(items) - 1)
        assert llama_cpp.llama_decode(ctx, batch) == 0
        rows = [len(items) - 1] if last_only else range(len(items))
        return [np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, i), shape=(n_vocab,)).copy() for i in rows]
    try:
        yield ctx, decode
    finally:
        llama_cpp.llama_batch_free(batch)
        llama_cpp.llama_free(ctx)


def _sparq_pause(ctx, spec: bytes) -> None:
    """SparQ off and on again: the next graph rebuilds the copies from the cache."""
    from llama_sparse import _native
    assert _native.llama_sparse_set_sparq(ctx, 0, 0, False) == 0
    assert _native.llama_sparse_set_sparq_str(ctx, spec) == 0


@pytest.mark.parametrize("unified", [True, False], ids=["one-stream", "two-streams"])
@pytest.mark.parametrize("kt", ["", ",kt=q8_0"])
def test_two_sequences_decoded_together(smollm2_gguf: Path, tokens: list[int], unified: bool, kt: str):
    """Two sequences decode one token each per ubatch. In one stream their new cells share 32-cell blocks (the
    8-bit copy's slots are shared); each step must give the logits of a copy rebuilt from the K cache before it."""
    from llama_sparse import _native
    owner = _llm(smollm2_gguf)
    prompts = (tokens[:100], tokens[40:140])
    gen = (tokens[140:148], tokens[150:158])
    spec = ("r=16,k=24" + kt).encode()

    def run(rebuild_each_step: bool) -> np.ndarray:
        with _two_seq_context(owner, unified) as (ctx, decode):
            for s, pr in enumerate(prompts):
                decode([(s, p, t) for p, t in enumerate(pr)])
            assert _native.llama_sparse_set_sparq_str(ctx, spec) == 0
            out = []
            for i in range(len(gen[0])):
                if rebuild_each_step:
                    _sparq_pause(ctx, spec)
                out += decode([(s, len(prompts[s]) + i, gen[s][i]) for s in range(2)])
            return np.stack(out)

    kept, rebuilt = run(False), run(True)
    assert np.array_equal(kept, rebuilt), float(np.abs(kept - rebuilt).max())


def test_kt_q8_0_prefill_over_scattered_cells(smollm2_gguf: Path, tokens: list[int]):
    """A prefill whose cells are scattered over more 32-cell blocks than its graph requantizes (n/32 + 2) must leave
    the 8-bit copy stale, so that the next decode rebuilds it: the logits equal those of a forced rebuild.
    Cells: two sequences decoded in turn fill 0..383 alternately; removing sequence 0 frees the even cells, and 80
    prefill tokens of sequence 1 land in 0, 2, .., 158 (5 blocks, 4 slots)."""
    import llama_cpp
    from llama_sparse import _native
    owner = _llm(smollm2_gguf)
    tok = lambda i: tokens[i % len(tokens)]
    spec = b"r=16,k=24,kt=q8_0"

    def run(rebuild: bool) -> np.ndarray:
        with _two_seq_context(owner, True) as (ctx, decode):
            assert _native.llama_sparse_set_sparq_str(ctx, spec) == 0
            for p in range(192):
                decode([(0, p, tok(p)), (1, p, tok(p + 7))])
            assert llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(ctx), 0, -1, -1)
            decode([(1, 192 + i, tok(200 + i)) for i in range(80)], last_only=True)
            if rebuild:
                _sparq_pause(ctx, spec)
            return np.stack([decode([(1, 272 + i, tok(300 + i))])[0] for i in range(6)])

    kept, rebuilt = run(False), run(True)
    assert np.array_equal(kept, rebuilt), float(np.abs(kept - rebuilt).max())


def test_perplexity_notes_that_prompts_attend_densely(smollm2_gguf: Path, tmp_path: Path):
    """llama-perplexity with LLAMA_SPARQ evaluates whole chunks, which attend densely: it says so (it used to print
    dense figures without a word)."""
    from llama_sparse.tools import tool_path
    import os
    text = tmp_path / "t.txt"
    text.write_text("It is a truth universally acknowledged, that a single man in possession of a good fortune, "
                    "must be in want of a wife. " * 40)
    env = dict(os.environ, LLAMA_SPARQ="r=8,k=16")
    r = subprocess.run([str(tool_path("perplexity")), "-m", str(smollm2_gguf), "-f", str(text), "-c", "128",
                        "--chunks", "1", "-t", "2"], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stderr.count("LLAMA_SPARQ is set, but batches with several tokens") == 1, r.stderr[-2000:]


def test_tokenize_refuses_bad_arguments():
    """A NULL vocabulary used to segfault, a negative length to be blamed on the vocabulary."""
    import ctypes
    from llama_sparse import _native
    buf = (ctypes.c_int32 * 8)()
    assert _native.llama_sparse_tokenize(None, b"hi", 2, buf, 8, True, False) == -2**31
    assert "bad arguments (vocab NULL" in _native.last_error()
