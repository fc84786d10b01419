"""Lying or damaged zigzag metadata is refused with a clear error, never a crash or garbage."""
from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from gguf import GGUFReader, GGUFValueType

from ggufedit import rewrite_gguf

V = GGUFValueType


@pytest.fixture(scope="module")
def zz(smollm2_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from llama_sparse.convert import convert
    out = tmp_path_factory.mktemp("badinput") / "smollm2.zz-q8_0.gguf"
    convert(smollm2_gguf, out, "q8_0", progress=False)
    return out


def _load_error(path: Path, env: dict | None = None, verbose: bool = False) -> str:
    """Load in a subprocess (a native crash must fail the test, not the run) and return what the user sees: the
    ValueError's message (without verbose the native log goes to /dev/null, so the reason must be in it), and with
    verbose the log too."""
    code = ("import sys, llama_sparse\n"
            "try:\n"
            f"    llama_sparse.Llama({str(path)!r}, n_ctx=64, verbose={verbose})\n"
            "except ValueError as e:\n"
            "    print('REFUSED', e); sys.exit(0)\n"
            "print('LOADED'); sys.exit(1)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={**os.environ, **(env or {})})
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr[-3000:]}"
    assert r.stdout.startswith("REFUSED ")
    return r.stdout + (r.stderr if verbose else "")


def _names(path: Path) -> list[str]:
    return list(GGUFReader(path).get_field("llama_sparse.zigzag.tensors").contents())


def test_wrong_block_size(zz: Path, tmp_path: Path):
    n = len(_names(zz))
    bad = rewrite_gguf(zz, tmp_path / "bs.gguf", {"llama_sparse.zigzag.block_sizes": ([256] * n, V.ARRAY, V.UINT32)})
    assert "does not match block size 256" in _load_error(bad)


def test_missing_tensor(zz: Path, tmp_path: Path):
    names = _names(zz) + ["blk.0.attn_nonexistent.weight"]
    sizes = list(GGUFReader(zz).get_field("llama_sparse.zigzag.block_sizes").contents()) + [32]
    bad = rewrite_gguf(zz, tmp_path / "missing.gguf", {
        "llama_sparse.zigzag.tensors": (names, V.ARRAY, V.STRING),
        "llama_sparse.zigzag.block_sizes": (sizes, V.ARRAY, V.UINT32)})
    assert "is not in the file" in _load_error(bad)


def test_unlisted_zigzag_tensor_is_a_shape_error(zz: Path, tmp_path: Path):
    # metadata claims nothing is zigzag: the loader sees the stored shape and refuses it
    bad = rewrite_gguf(zz, tmp_path / "unlisted.gguf", drop=("llama_sparse.",))
    assert "wrong shape" in _load_error(bad)


def test_future_version(zz: Path, tmp_path: Path):
    bad = rewrite_gguf(zz, tmp_path / "v2.gguf", {"llama_sparse.format_version": (2, V.UINT32, None)})
    assert "format version 2 is not supported" in _load_error(bad)


def test_thresholds_wrong_length(zz: Path, tmp_path: Path):
    bad = rewrite_gguf(zz, tmp_path / "thr.gguf", {
        "llama_sparse.levels": (["0.50"], V.ARRAY, V.STRING),
        "llama_sparse.level_targets": ([0.5], V.ARRAY, V.FLOAT32),
        "llama_sparse.thresholds.0.50": ([0.1] * 7, V.ARRAY, V.FLOAT32)})
    assert "has 7 thresholds" in _load_error(bad)


def test_negative_threshold_and_missing_level(zz: Path, tmp_path: Path):
    n_layer = int(GGUFReader(zz).get_field("llama.block_count").contents())
    bad = rewrite_gguf(zz, tmp_path / "neg.gguf", {
        "llama_sparse.levels": (["0.50"], V.ARRAY, V.STRING),
        "llama_sparse.level_targets": ([0.5], V.ARRAY, V.FLOAT32),
        "llama_sparse.thresholds.0.50": ([-1.0] * (4 * n_layer), V.ARRAY, V.FLOAT32)})
    assert "holds a threshold of -1" in _load_error(bad)
    bad = rewrite_gguf(zz, tmp_path / "huge.gguf", {  # would drop every column: text of one repeated token
        "llama_sparse.levels": (["0.50"], V.ARRAY, V.STRING),
        "llama_sparse.level_targets": ([0.5], V.ARRAY, V.FLOAT32),
        "llama_sparse.thresholds.0.50": ([1e30] * (4 * n_layer), V.ARRAY, V.FLOAT32)})
    assert "holds a threshold of 1e+30 (thresholds lie in [0, 1e+06])" in _load_error(bad)
    bad = rewrite_gguf(zz, tmp_path / "nolevel.gguf", {
        "llama_sparse.levels": (["0.50"], V.ARRAY, V.STRING),
        "llama_sparse.level_targets": ([0.5], V.ARRAY, V.FLOAT32)})
    assert "has 0 thresholds" in _load_error(bad)


def test_levels_round_trip_and_unknown_level(zz: Path, tmp_path: Path):
    import llama_sparse
    n_layer = int(GGUFReader(zz).get_field("llama.block_count").contents())
    thr = [0.01 * (1 + i % 4) for i in range(4 * n_layer)]
    good = rewrite_gguf(zz, tmp_path / "levels.gguf", {
        "llama_sparse.levels": (["0.50", "greedy-0.50"], V.ARRAY, V.STRING),
        "llama_sparse.level_targets": ([0.5, 0.5], V.ARRAY, V.FLOAT32),
        "llama_sparse.thresholds.0.50": (thr, V.ARRAY, V.FLOAT32),
        "llama_sparse.thresholds.greedy-0.50": (thr, V.ARRAY, V.FLOAT32)})
    llm = llama_sparse.Llama(good, n_ctx=64, verbose=False)
    assert llm.sparsity_levels == ["0.50", "greedy-0.50"]
    for spec, name in ((0.5, "0.50"), ("0.5", "0.50"), ("unified-0.50", "0.50"), ("greedy-0.5", "greedy-0.50")):
        llm.set_sparsity(spec)
        assert llm.sparsity == name
    with pytest.raises(ValueError, match=r"0\.65.*not in the model; it has: 0\.50, greedy-0\.50"):
        llm.set_sparsity(0.65)
    assert llm.sparsity == "greedy-0.50"  # a failed switch keeps the level
    llm.set_sparsity(None)
    assert llm.sparsity == "dense"


def test_non_projection_listed_as_zigzag(zz: Path, tmp_path: Path):
    """An embedding is read by rows, not through a matmul: listed as zigzag it used to abort at context creation."""
    r = GGUFReader(zz)
    names = _names(zz) + ["token_embd.weight"]
    sizes = list(r.get_field("llama_sparse.zigzag.block_sizes").contents()) + [32]
    bad = rewrite_gguf(zz, tmp_path / "embd.gguf", {
        "llama_sparse.zigzag.tensors": (names, V.ARRAY, V.STRING),
        "llama_sparse.zigzag.block_sizes": (sizes, V.ARRAY, V.UINT32)})
    msg = _load_error(bad)
    assert "'token_embd.weight' is listed as zigzag, but only the projection weights" in msg


def _with_levels(zz: Path, path: Path, names: list[str]) -> Path:
    n_layer = int(GGUFReader(zz).get_field("llama.block_count").contents())
    kv = {"llama_sparse.levels": (names, V.ARRAY, V.STRING),
          "llama_sparse.level_targets": ([0.5] * len(names), V.ARRAY, V.FLOAT32)}
    for name in names:
        kv[f"llama_sparse.thresholds.{name}"] = ([0.01] * (4 * n_layer), V.ARRAY, V.FLOAT32)
    return rewrite_gguf(zz, path, kv)


@pytest.mark.parametrize("name", ["foo", "off", "0.00", "", "1.5", "greedy 0.5", "0.5x"])
def test_level_names_a_user_cannot_ask_for(zz: Path, tmp_path: Path, name: str):
    """"off" and "0.00" used to load and then run dense under the level's name; "foo" could never be selected."""
    msg = _load_error(_with_levels(zz, tmp_path / "name.gguf", [name]))
    assert f"llama_sparse.levels entry 0, '{name}', is not a level name" in msg


def test_two_names_for_one_level(zz: Path, tmp_path: Path):
    """Asking for "0.50" used to run the level stored as "0.5", whatever the thresholds stored under "0.50"."""
    for names in (["0.5", "0.50"], ["0.50", "0.50"], ["0.50", "unified-0.50"]):
        msg = _load_error(_with_levels(zz, tmp_path / "dup.gguf", ["greedy-0.50"] + names))
        assert f"levels '{names[0]}' and '{names[1]}' name the same level" in msg


def test_too_many_levels(zz: Path, tmp_path: Path):
    msg = _load_error(_with_levels(zz, tmp_path / "many.gguf", [f"{(i + 1) / 100:.2f}" for i in range(65)]))
    assert "lists 65 levels; at most 64 are allowed" in msg


def test_bad_grammar_is_an_error_not_a_crash(zz: Path):
    """llama-cpp-python adds the NULL sampler of a grammar llama.cpp cannot parse and the process segfaults (the
    server with it); llama_sparse.Llama refuses the grammar first. A good grammar still constrains the text."""
    code = ("import llama_sparse\n"
            "from llama_cpp import LlamaGrammar\n"
            f"llm = llama_sparse.Llama({str(zz)!r}, n_ctx=64, verbose=False)\n"
            "for g in ('root ::= (', 'foo ::= \"a\"'):\n"
            "    for stream in (False, True):\n"
            "        try:\n"
            "            llm.create_completion('Hi', max_tokens=2, stream=stream, grammar=LlamaGrammar.from_string(g, verbose=False))\n"
            "        except ValueError as e:\n"
            "            print('REFUSED', e)\n"
            "out = llm.create_completion('Hi', max_tokens=3, temperature=0, grammar=LlamaGrammar.from_string('root ::= \"ab\"+', verbose=False))\n"
            "print('TEXT', repr(out['choices'][0]['text']))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr[-3000:]}"
    assert r.stdout.count("REFUSED grammar: llama.cpp cannot parse it") == 4, r.stdout
    text = ast.literal_eval(r.stdout.split("TEXT ")[1].strip())
    assert re.fullmatch(r"(ab)+a?|a", text), r.stdout


def test_bad_sampling_settings_and_content_parts(zz: Path):
    """A NaN temperature, p or penalty samples garbage and an out-of-vocabulary logit_bias id makes llama-cpp-python
    drop the whole bias (a traceback a token): each raises ValueError before any token, streaming or not, chat too.
    Valid settings (a string id, a numpy temperature, llama-cpp-python's negative temperature) still run. A chat
    message may be a list of OpenAI text parts (llama-cpp-python's templates raised TypeError on it)."""
    import math

    import numpy as np

    import llama_sparse
    llm = llama_sparse.Llama(str(zz), n_ctx=64, verbose=False)
    try:
        n = llm.n_vocab()
        bad = [({"temperature": math.nan}, "temperature must be a finite number"),
               ({"top_p": math.inf}, "top_p must be a finite number"),
               ({"repeat_penalty": math.nan}, "repeat_penalty must be a finite number"),
               ({"min_p": 1.5}, "min_p must be between 0 and 1"),
               ({"logit_bias": {n: 1.0}}, f"token id {n} is not in the vocabulary"),
               ({"logit_bias": {"-1": 1.0}}, "token id -1 is not in the vocabulary"),
               ({"logit_bias": {"eos": 1.0}}, "'eos' is not a token id"),
               ({"logit_bias": {5: math.nan}}, "the bias of token 5 must be a finite number")]
        for kw, msg in bad:
            for stream in (False, True):
                with pytest.raises(ValueError, match=re.escape(msg)):
                    llm.create_completion("Hi", max_tokens=2, stream=stream, **kw)
            with pytest.raises(ValueError, match=re.escape(msg)):
                llm.create_chat_completion(messages=[{"role": "user", "content": "Hi"}], max_tokens=2, **kw)
        # a bias on one token steers greedy decoding onto it
        forced = llm.tokenize(b" moose", add_bos=False)[0]
        out = llm.create_completion("Hi", max_tokens=2, temperature=0, logit_bias={str(forced): 100.0})
        assert llm.tokenize(out["choices"][0]["text"].encode(), add_bos=False)[0] == forced, out
        for kw in ({"temperature": np.float32(0.5), "seed": 1}, {"temperature": -1.0, "seed": 1}):
            assert llm.create_completion("Hi", max_tokens=2, **kw)["usage"]["completion_tokens"] >= 1
        # OpenAI content parts: text parts are the message, one a line; other parts are refused
        chat = [{"role": "user", "content": "Say\nhi"}]
        parts = [{"role": "user", "content": [{"type": "text", "text": "Say"}, {"type": "text", "text": "hi"}]}]
        want = llm.create_chat_completion(messages=chat, max_tokens=4, temperature=0)["choices"][0]["message"]
        assert llm.create_chat_completion(parts, max_tokens=4, temperature=0)["choices"][0]["message"] == want
        for part in ({"type": "image_url", "image_url": {"url": "http://example.com/a.png"}}, "Say hi"):
            with pytest.raises(ValueError, match="only text parts can be read"):
                llm.create_chat_completion(messages=[{"role": "user", "content": [part]}], max_tokens=2)
    finally:
        llm.close()


def test_truncated_file_says_so(zz: Path, tmp_path: Path):
    bad = tmp_path / "trunc.gguf"
    bad.write_bytes(zz.read_bytes()[: zz.stat().st_size // 3])
    msg = _load_error(bad)
    assert "Failed to load model from file" in msg
    assert "not within the file bounds" in msg and "corrupted or incomplete" in msg


def test_not_a_gguf_says_so(tmp_path: Path):
    bad = tmp_path / "text.gguf"
    bad.write_text("hello, this is not a model\n")
    assert "invalid magic characters" in _load_error(bad)


def test_bad_sparq_env_says_why(zz: Path):
    msg = _load_error(zz, env={"LLAMA_SPARQ": "r=abc"})
    assert "Failed to create llama_context" in msg and "'r' needs an integer, got 'abc'" in msg


def test_verbose_still_logs(zz: Path, tmp_path: Path):
    bad = rewrite_gguf(zz, tmp_path / "v2v.gguf", {"llama_sparse.format_version": (2, V.UINT32, None)})
    out = _load_error(bad, verbose=True)
    assert out.count("format version 2 is not supported") >= 2  # the message, and the log line it came from
    assert "llama_model_loader: loaded meta data" in out
