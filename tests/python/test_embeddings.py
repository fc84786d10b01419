"""Embeddings through llama_sparse.Llama: llama-cpp-python's API, on zigzag weights, at any level."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

TEXTS = ["The cat sat on the mat.", "A kitten rested on the rug.", "Stock markets fell sharply on Monday."]


@pytest.fixture(scope="module")
def zz_q8(smollm2_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from llama_sparse.convert import convert
    return convert(smollm2_gguf, tmp_path_factory.mktemp("emb") / "zz-q8_0.gguf", "q8_0", progress=False).output


def _embed(path: Path, **kw) -> np.ndarray:
    import llama_sparse
    import llama_cpp
    llm = llama_sparse.Llama(path, embedding=True, n_ctx=256, verbose=False,
                             pooling_type=llama_cpp.LLAMA_POOLING_TYPE_MEAN, **kw)
    try:
        out = llm.create_embedding(TEXTS)
        assert out["object"] == "list" and len(out["data"]) == len(TEXTS)
        e = np.array([d["embedding"] for d in out["data"]], dtype=np.float64)
        single = np.array(llm.embed(TEXTS[0]), dtype=np.float64)
    finally:
        llm.close()
    assert e.shape == (len(TEXTS), 576) and np.isfinite(e).all()
    # one text alone embeds like the same text in a list (other batch shapes round differently)
    cos = single @ e[0] / (np.linalg.norm(single) * np.linalg.norm(e[0]))
    assert cos > 0.9999, cos
    return e / np.linalg.norm(e, axis=1, keepdims=True)


def test_zigzag_embeddings_match_the_original(smollm2_gguf: Path, zz_q8: Path):
    stock = _embed(smollm2_gguf)   # Q4_1, standard layout
    zz = _embed(zz_q8)             # zigzag q8_0 of the same weights
    cos = (stock * zz).sum(axis=1)
    assert (cos > 0.98).all(), cos
    # and they still mean something: the two cat sentences are closer than cat and markets
    sim = zz @ zz.T
    assert sim[0, 1] > sim[0, 2], sim


def test_embeddings_at_a_sparsity_level(zz_q8: Path):
    """Texts longer than the decode limit (8 tokens) embed in one dense prefill whatever the level;
    shorter ones take the sparse path and move a little."""
    import llama_sparse
    from gguf import GGUFReader, GGUFValueType as V

    from ggufedit import rewrite_gguf
    n_layer = int(GGUFReader(zz_q8).get_field("llama.block_count").contents())
    leveled = rewrite_gguf(zz_q8, zz_q8.with_name("zz-q8_0-lv.gguf"), {
        "llama_sparse.levels": (["0.50"], V.ARRAY, V.STRING),
        "llama_sparse.level_targets": ([0.5], V.ARRAY, V.FLOAT32),
        "llama_sparse.thresholds.0.50": ([0.05] * (4 * n_layer), V.ARRAY, V.FLOAT32)})
    long_text = "It is a truth universally acknowledged, that a single man in possession of a good fortune must be in want of a wife."
    short_text = "Good morning."

    def emb(llm, text):
        v = np.array(llm.embed(text), dtype=np.float64)
        return v / np.linalg.norm(v)

    import llama_cpp
    llm = llama_sparse.Llama(leveled, embedding=True, n_ctx=256, n_batch=64, n_ubatch=64, verbose=False,
                             pooling_type=llama_cpp.LLAMA_POOLING_TYPE_MEAN)
    try:
        assert len(llm.tokenize(long_text.encode())) > 8 >= len(llm.tokenize(short_text.encode()))
        dense = [emb(llm, t) for t in (long_text, short_text)]
        llm.set_sparsity(0.5)
        llm.reset_stats()
        long_sparse = emb(llm, long_text)
        assert llm.sparse_stats()["lists"] == 0  # one dense prefill
        short_sparse = emb(llm, short_text)
        assert llm.sparse_stats()["lists"] > 0   # the short text went through the sparse path
    finally:
        llm.close()
    assert np.allclose(dense[0], long_sparse, atol=1e-5)
    cos = float(dense[1] @ short_sparse)
    assert 0.8 < cos < 1.0 - 1e-7, cos
