"""HF directory -> zigzag GGUF, on an HF checkpoint rebuilt from the SmolLM2 GGUF with transformers."""
from __future__ import annotations

import functools
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader
from gguf.quants import dequantize as gguf_dequantize

from llama_sparse import zigzag
from llama_sparse.convert import ConvertSummary, convert

# transformers dequantizes the GGUF to float32 and saves safetensors + tokenizer; run apart so torch
# and the model's memory leave with the subprocess
MAKE_HF = textwrap.dedent("""
    import sys
    from pathlib import Path
    from transformers import AutoModelForCausalLM, AutoTokenizer
    gguf_path, out = Path(sys.argv[1]), sys.argv[2]
    tok = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    model.save_pretrained(out)
    tok.save_pretrained(out)
""")


@functools.lru_cache(maxsize=4)
def _tensors(path: Path) -> dict[str, object]:
    return {t.name: t for t in GGUFReader(path).tensors}


@pytest.fixture(scope="module")
def smollm2_hf_dir(smollm2_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("smollm2-hf")
    proc = subprocess.run([sys.executable, "-c", MAKE_HF, str(smollm2_gguf), str(out)], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"building the HF checkpoint with transformers failed:\n{proc.stderr[-3000:]}"
    # transformers copies the .gguf itself as the 'vocab file' tokenizer.model; it is not a
    # sentencepiece model, and SmolLM2's real HF repo has only tokenizer.json
    bogus = out / "tokenizer.model"
    if bogus.exists() and bogus.read_bytes()[:4] == b"GGUF":
        bogus.unlink()
    assert (out / "config.json").is_file() and (out / "tokenizer.json").is_file()
    assert list(out.glob("*.safetensors"))
    return out


@pytest.fixture(scope="module")
def smollm2_hf_converted(smollm2_hf_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, ConvertSummary]:
    out_dir = tmp_path_factory.mktemp("smollm2-hf-out")
    out = out_dir / "smollm2-hf-q4_k.gguf"
    summary = convert(smollm2_hf_dir, out, "q4_k", progress=False)
    assert sorted(p.name for p in out_dir.iterdir()) == [out.name], "the intermediate 16-bit GGUF must be removed"
    return out, summary


def test_hf_layout_and_metadata(smollm2_gguf: Path, smollm2_hf_converted: tuple[Path, ConvertSummary]) -> None:
    out, summary = smollm2_hf_converted
    assert summary.hf_seconds > 0
    reader = GGUFReader(out)
    src = _tensors(smollm2_gguf)
    outt = {t.name: t for t in reader.tensors}
    assert reader.get_field(zigzag.KEY_FORMAT_VERSION).contents() == 1
    info = zigzag.read_zigzag_info(reader)
    assert len(info) == 210
    for name, B in info.items():
        n, m = (int(x) for x in src[name].shape)
        assert [int(x) for x in outt[name].shape] == [B * n, m // B], name
        assert outt[name].tensor_type == (Q.Q4_K if m % 256 == 0 else Q.Q8_0), name
    # standard tensors: norms stay F32; the float embedding is quantized (n=576: q8_0 fallback)
    assert outt["blk.0.attn_norm.weight"].tensor_type == Q.F32
    assert outt["token_embd.weight"].tensor_type == Q.Q8_0
    assert "token_embd.weight" not in info
    for key in ("tokenizer.ggml.model", "tokenizer.ggml.tokens", "tokenizer.chat_template", "llama.block_count"):
        assert reader.get_field(key) is not None, key
    assert "im_start" in reader.get_field("tokenizer.chat_template").contents()
    assert reader.get_field("llama.block_count").contents() == 30


@pytest.mark.parametrize("name,max_rel", [("blk.0.ffn_gate.weight", 0.12), ("blk.7.attn_q.weight", 0.02), ("blk.7.attn_k.weight", 0.02)])
def test_hf_values_match_source(smollm2_gguf: Path, smollm2_hf_converted: tuple[Path, ConvertSummary], name: str, max_rel: float) -> None:
    out, _ = smollm2_hf_converted
    src_t = _tensors(smollm2_gguf)[name]
    out_t = _tensors(out)[name]
    n, m = (int(x) for x in src_t.shape)
    W_src = gguf_dequantize(src_t.data, src_t.tensor_type).astype(np.float32).reshape(m, n)
    W_out = zigzag.zigzag_dequantize(np.asarray(out_t.data), Q(out_t.tensor_type))
    rel = float(np.linalg.norm(W_out - W_src) / np.linalg.norm(W_src))
    # attn_q/attn_k go through transformers' un-permute and upstream's re-permute: a wrong one shows here
    assert rel < max_rel, f"{name}: relative error {rel:.4f}"
