"""Converter on real and synthetic GGUF input: layout rule, metadata, values, standard tensors."""
from __future__ import annotations

import functools
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader
from gguf.quants import dequantize as gguf_dequantize

from llama_sparse import dequant_ref, zigzag
from llama_sparse.convert import ConvertSummary, add_convert_args, convert, run_convert

@functools.lru_cache(maxsize=8)
def _read(path: Path) -> GGUFReader:
    """Parsing SmolLM2's 49k-token vocabulary takes seconds; each file is read once per session."""
    return GGUFReader(path)


PROJECTIONS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def _tensors(reader: GGUFReader) -> dict[str, object]:
    return {t.name: t for t in reader.tensors}


def _source_matrix(tensor: object) -> np.ndarray:
    """Source weight (m, n) as float32 through gguf-py's numpy dequantizer (independent of ggml)."""
    n, m = (int(x) for x in tensor.shape)  # type: ignore[attr-defined]
    return gguf_dequantize(tensor.data, tensor.tensor_type).astype(np.float32).reshape(m, n)  # type: ignore[attr-defined]


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def check_zigzag_file(src: Path, out: Path, target: Q, fallback: Q | None = Q.Q8_0) -> GGUFReader:
    """Everything the format contract promises about `out`, converted from `src` with `target`."""
    src_reader, out_reader = _read(src), _read(out)
    src_t, out_t = _tensors(src_reader), _tensors(out_reader)
    assert list(src_t) == list(out_t), "tensor names and order are kept"

    assert out_reader.get_field(zigzag.KEY_FORMAT_VERSION).contents() == 1
    names = out_reader.get_field(zigzag.KEY_ZIGZAG_TENSORS).contents()
    blocks = out_reader.get_field(zigzag.KEY_ZIGZAG_BLOCKS).contents()
    assert len(names) == len(blocks) == len(set(names)) > 0
    info = dict(zip(names, blocks))
    assert zigzag.read_zigzag_info(out_reader) == info

    target_block = 256 if target in (Q.Q4_K, Q.Q6_K) else 32
    for name, st in src_t.items():
        ot = out_t[name]
        n, *rest = (int(x) for x in st.shape)
        is_projection = any(name.endswith(f".{p}.weight") for p in PROJECTIONS) and name.startswith("blk.") and len(rest) == 1
        if is_projection and (rest[0] % target_block == 0 or (fallback is not None and rest[0] % 32 == 0)):
            m = rest[0]
            assert name in info, f"{name} should be zigzag"
            B = info[name]
            expected_type = target if m % target_block == 0 else fallback
            assert ot.tensor_type == expected_type, name
            assert B == (256 if expected_type in (Q.Q4_K, Q.Q6_K) else 32)
            assert [int(x) for x in ot.shape] == [B * n, m // B], f"{name}: ne must be [B*n, m/B]"
        else:
            assert name not in info, f"{name} must stay standard"
            assert [int(x) for x in ot.shape] == [int(x) for x in st.shape], name
            if st.tensor_type not in (Q.F32, Q.F16, Q.BF16) or len(st.shape) == 1 or "norm" in name:
                assert ot.tensor_type == st.tensor_type, name
                assert np.array_equal(np.asarray(ot.data).view(np.uint8), np.asarray(st.data).view(np.uint8)), f"{name} copied as-is"

    # every KV is carried unchanged except file_type; the llama_sparse keys are added
    for key, fld in src_reader.fields.items():
        if key.startswith("GGUF.") or key == "general.file_type":
            continue
        assert key in out_reader.fields, f"metadata {key} lost"
        assert out_reader.fields[key].contents() == fld.contents(), f"metadata {key} changed"
    assert out_reader.get_field("general.file_type").contents() in (2, 7, 14, 18)
    return out_reader


@pytest.fixture(scope="module")
def smollm2_q4k(smollm2_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, ConvertSummary]:
    out = tmp_path_factory.mktemp("smol") / "smollm2-q4_k.gguf"
    return out, convert(smollm2_gguf, out, "q4_k", progress=False)


def test_smollm2_q4k_layout_and_metadata(smollm2_gguf: Path, smollm2_q4k: tuple[Path, ConvertSummary]) -> None:
    out, summary = smollm2_q4k
    reader = check_zigzag_file(smollm2_gguf, out, Q.Q4_K)
    # SmolLM2: 30 layers x 7 projections; only ffn_gate/ffn_up (1536 rows) take Q4_K, the 576/192-row ones fall back
    assert len(summary.zigzagged) == 210
    assert sum(t == "q4_K" for t in summary.zigzagged.values()) == 60
    assert sum(t == "q8_0" for t in summary.zigzagged.values()) == 150
    assert len(summary.fallbacks) == 150 and all(f.used == "q8_0" for f in summary.fallbacks)
    assert summary.output_bytes == out.stat().st_size > 0
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.model", "tokenizer.chat_template"):
        assert reader.get_field(key) is not None, key
    assert "im_start" in reader.get_field("tokenizer.chat_template").contents()
    assert reader.get_field("general.file_type").contents() == 14  # MOSTLY_Q4_K_S


@pytest.mark.parametrize("name,max_rel", [("blk.0.ffn_gate.weight", 0.12), ("blk.5.attn_q.weight", 0.02), ("blk.29.ffn_down.weight", 0.02)])
def test_smollm2_q4k_values_match_source(smollm2_gguf: Path, smollm2_q4k: tuple[Path, ConvertSummary], name: str, max_rel: float) -> None:
    out, _ = smollm2_q4k
    src_tensor = _tensors(_read(smollm2_gguf))[name]
    out_tensor = _tensors(_read(out))[name]
    W_src = _source_matrix(src_tensor)
    qtype = Q(out_tensor.tensor_type)
    data = np.asarray(out_tensor.data)
    W_out = zigzag.zigzag_dequantize(data, qtype)
    assert W_out.shape == W_src.shape
    assert _rel(W_out, W_src) < max_rel
    # the numpy reference reads the same values from the raw blocks
    B = 256 if qtype == Q.Q4_K else 32
    m, n = W_src.shape
    W_ref = dequant_ref.dequantize(data, qtype.name.lower()).reshape(m // B, n, B).transpose(0, 2, 1).reshape(m, n)
    np.testing.assert_allclose(W_ref, W_out, rtol=1e-6, atol=1e-6 * float(np.abs(W_out).max()))


def test_smollm2_readable_by_gguf_dump(smollm2_q4k: tuple[Path, ConvertSummary]) -> None:
    out, _ = smollm2_q4k
    exe = shutil.which("gguf-dump")
    cmd = [exe, str(out)] if exe else [sys.executable, "-m", "gguf.scripts.gguf_dump", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "llama_sparse.format_version = 1" in proc.stdout
    assert "llama_sparse.zigzag.tensors" in proc.stdout
    # ffn_gate: n=576, m=1536 -> ne [256*576, 1536/256]
    line = next(l for l in proc.stdout.splitlines() if l.rstrip().endswith("blk.0.ffn_gate.weight"))
    assert "147456," in line and " 6," in line and "Q4_K" in line


def test_smollm2_q8_0(smollm2_gguf: Path, tmp_path: Path) -> None:
    out = tmp_path / "smollm2-q8_0.gguf"
    summary = convert(smollm2_gguf, out, "q8_0", progress=False)
    check_zigzag_file(smollm2_gguf, out, Q.Q8_0)
    assert set(summary.zigzagged.values()) == {"q8_0"} and len(summary.zigzagged) == 210
    assert summary.fallbacks == []
    name = "blk.3.ffn_up.weight"
    W_src = _source_matrix(_tensors(_read(smollm2_gguf))[name])
    W_out = zigzag.zigzag_dequantize(np.asarray(_tensors(_read(out))[name].data), Q.Q8_0)
    assert _rel(W_out, W_src) < 0.01


def test_tiny_float_model_all_paths(tiny_gguf: Path, tmp_path: Path) -> None:
    out = tmp_path / "tiny-q4_k.gguf"
    summary = convert(tiny_gguf, out, "q4_k", progress=False)
    reader = check_zigzag_file(tiny_gguf, out, Q.Q4_K)
    t = _tensors(reader)
    assert t["blk.0.ffn_gate.weight"].tensor_type == Q.Q4_K      # m=512: target
    assert t["blk.0.attn_q.weight"].tensor_type == Q.Q4_K        # m=256: target
    assert t["blk.0.attn_v.weight"].tensor_type == Q.Q8_0        # m=64: 32-block fallback
    assert t["blk.0.attn_k.weight"].tensor_type == Q.Q4_K        # m=48: no zigzag type, standard q4_k
    assert "blk.0.attn_k.weight" not in summary.zigzagged
    assert [f for f in summary.fallbacks if f.name == "blk.0.attn_k.weight"][0].used is None
    assert t["token_embd.weight"].tensor_type == Q.Q4_K          # float source, n=256: standard q4_k
    assert t["blk.0.attn_norm.weight"].tensor_type == Q.F32
    src = _tensors(_read(tiny_gguf))
    for name in ("token_embd.weight", "blk.1.attn_k.weight"):
        W_src = _source_matrix(src[name])
        W_out = gguf_dequantize(np.asarray(t[name].data), Q.Q4_K).reshape(W_src.shape)
        assert _rel(W_out, W_src) < 0.1, name
    W_src = _source_matrix(src["blk.1.ffn_down.weight"])
    assert _rel(zigzag.zigzag_dequantize(np.asarray(t["blk.1.ffn_down.weight"].data), Q.Q4_K), W_src) < 0.1


@pytest.mark.parametrize("qtype", ["q4_0", "q6_k"])
def test_tiny_f16_other_types(tmp_path: Path, qtype: str) -> None:
    from conftest import write_tiny_gguf

    src = write_tiny_gguf(tmp_path / "tiny-f16.gguf", float_type="f16", seed=3)
    out = tmp_path / f"tiny-{qtype}.gguf"
    convert(src, out, qtype, progress=False)
    check_zigzag_file(src, out, Q[qtype.upper()])


def test_run_convert_cli_wrapper(tiny_gguf: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    parser = add_convert_args(argparse.ArgumentParser(prog="llama-sparse convert"))
    out = tmp_path / "cli.gguf"
    assert run_convert(parser.parse_args([str(tiny_gguf), "-o", str(out), "--type", "q8_0"])) == 0
    assert out.is_file()
    assert "zigzag:" in capsys.readouterr().err
    assert run_convert(parser.parse_args([str(tmp_path / "missing.gguf"), "-o", str(out)])) == 1
    assert "does not exist" in capsys.readouterr().err
