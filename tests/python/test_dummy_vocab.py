"""A vocabulary that cannot spell the text (bench/make_random_gguf.py's dummy SPM list has no byte tokens, so
llama.cpp throws std::out_of_range) must give a clear error and a nonzero exit, not abort the process; and the
guarded tokenizer must give the same tokens as llama-cpp-python's own on a real vocabulary.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def dummy_zz(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """bench/make_random_gguf.py's tiny shape (2 layers, 256 wide, 1000 dummy tokens), converted to zigzag q8_0."""
    from llama_sparse.convert import convert

    d = tmp_path_factory.mktemp("dummy")
    src = d / "tiny.f16.gguf"
    env = dict(os.environ)
    import llama_sparse
    env.setdefault("LLAMA_SPARSE_LIB_DIR", str(llama_sparse.lib_dir()))  # the script imports the source tree
    subprocess.run([sys.executable, str(REPO / "bench" / "make_random_gguf.py"), "--shape", "tiny", "--type", "f16",
                    "-o", str(src)], check=True, env=env, capture_output=True, timeout=120)
    out = d / "tiny.zz-q8_0.gguf"
    convert(src, out, "q8_0", progress=False)
    return out


def _cli(*args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "llama_sparse", *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.parametrize("with_text", [False, True], ids=["generated-text", "text-file"])
def test_calibrate_dummy_vocab_fails_cleanly(dummy_zz: Path, tmp_path: Path, with_text: bool) -> None:
    text = tmp_path / "calib.txt"
    text.write_text("It is a truth universally acknowledged, that a single man in possession of a good fortune, "
                    "must be in want of a wife.\n" * 20)
    out = tmp_path / "out.gguf"
    args = ["calibrate", str(dummy_zz), "-o", str(out), "--levels", "0.5"] + (["--text", str(text)] if with_text else [])
    res = _cli(*args)
    assert res.returncode == 1, (res.returncode, res.stderr[-2000:])  # an abort would be -6 (SIGABRT)
    assert "terminate called" not in res.stderr
    last = res.stderr.strip().splitlines()[-1]
    assert "calibrate: error:" in last and "cannot tokenize" in last and "make_random_gguf" in last, last
    assert not out.exists()


def test_calibrate_api_raises(dummy_zz: Path, tmp_path: Path) -> None:
    from llama_sparse.calibrate import CalibrationError, calibrate

    with pytest.raises(CalibrationError, match="cannot tokenize"):
        calibrate(dummy_zz, output=tmp_path / "out.gguf", texts=["Emma Woodhouse, handsome, clever, and rich."],
                  levels=[0.5], progress=False)


def test_llama_tokenize_guarded(dummy_zz: Path) -> None:
    import llama_sparse
    from llama_sparse._native import TokenizeError

    llm = llama_sparse.Llama(dummy_zz, n_ctx=64, verbose=False)
    try:
        with pytest.raises(TokenizeError, match="unordered_map::at"):
            llm.tokenize(b"hello world")
        with pytest.raises(TokenizeError):
            llm.create_completion("hello world", max_tokens=2)
        assert llm.tokenize(b"", add_bos=True) == [llm.token_bos()]  # what it can spell still works
    finally:
        llm.close()


def test_guarded_tokenize_matches_stock(smollm2_gguf: Path) -> None:
    """On a real vocabulary the guarded path returns what llama-cpp-python's tokenizer returns, including a text
    longer than one buffer guess and special-token parsing."""
    import llama_sparse

    llm = llama_sparse.Llama(smollm2_gguf, n_ctx=64, verbose=False, vocab_only=True)
    try:
        texts = [b"", b"Hello, world!", "caf\u00e9 \u2014 na\u00efve \U0001F600".encode(),
                 b"<|im_start|>user\nhi<|im_end|>", b"word " * 3000]
        for text in texts:
            for add_bos in (False, True):
                for special in (False, True):
                    ours = llm.tokenize(text, add_bos=add_bos, special=special)
                    stock = llm.tokenizer_.tokenize(text, add_bos, special)
                    assert ours == stock, (text[:40], add_bos, special)
        assert len(llm.tokenize(b"word " * 3000, add_bos=False)) >= 3000
        # a vocab-only context has no KV cache: SparQ off (what __init__ sets) is accepted, on is refused
        llm.set_sparq(None)
        with pytest.raises(ValueError, match="plain KV cache"):
            llm.set_sparq("r=8,k=16")
    finally:
        llm.close()


def test_calibrate_random_tokens(dummy_zz: Path, tmp_path: Path) -> None:
    """--random-tokens calibrates a model that cannot tokenize text: the levels load, and on other random ids the
    share of skipped columns lands near each target (the thresholds come from this model's own activations)."""
    import numpy as np

    import llama_sparse

    out = tmp_path / "rand.gguf"
    res = _cli("calibrate", str(dummy_zz), "-o", str(out), "--levels", "0.3,0.6", "--mode", "unified",
               "--random-tokens", "3", "-n", "512", "-c", "128", "-t", "2")
    assert res.returncode == 0, res.stderr[-2000:]
    assert "random token ids (seed 3)" in res.stdout + res.stderr

    llm = llama_sparse.Llama(out, n_ctx=128, n_threads=2, verbose=False)
    try:
        toks = [int(t) for t in np.random.default_rng(11).integers(3, 1000, 24)]
        for name, target in (("0.30", 0.3), ("0.60", 0.6)):
            llm.set_sparsity(name)
            llm.reset()
            llm.reset_stats()
            for t in toks:
                llm.eval([t])
            skipped = llm.sparse_stats()["skipped"]
            assert abs(skipped - target) < 0.1, (name, skipped)
    finally:
        llm.close()

    # text and random ids together are an error, and nothing is written
    res = _cli("calibrate", str(dummy_zz), "-o", str(tmp_path / "both.gguf"), "--random-tokens", "1", "--text",
               str(tmp_path / "x.txt"))
    assert res.returncode == 2 and "not allowed with" in res.stderr, res.stderr[-500:]
    from llama_sparse.calibrate import CalibrationError, calibrate
    with pytest.raises(CalibrationError, match="either calibration texts or random_tokens"):
        calibrate(dummy_zz, output=tmp_path / "both.gguf", texts=["x"], random_tokens=1, progress=False)
    assert not (tmp_path / "both.gguf").exists()
