"""Converter failures: each is a ConvertError that names the problem, and no file is left behind."""
from __future__ import annotations

import errno
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

import llama_sparse.convert as convert_mod
from llama_sparse.convert import ConvertError, convert


def _leftovers(directory: Path, keep: set[str] = frozenset()) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name not in keep)


def _hf_dir(path: Path, *, architecture: str = "LlamaForCausalLM", tokenizer: bool = True) -> Path:
    """A directory that looks like an HF checkpoint: config.json, one safetensors file, maybe a tokenizer."""
    from safetensors.numpy import save_file

    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({
        "architectures": [architecture], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2, "vocab_size": 32,
        "rms_norm_eps": 1e-5, "max_position_embeddings": 64,
    }))
    save_file({"model.embed_tokens.weight": np.random.default_rng(0).standard_normal((32, 64)).astype(np.float32)},
              str(path / "model.safetensors"))
    if tokenizer:
        (path / "tokenizer.json").write_text(json.dumps({"model": {"type": "BPE", "vocab": {}, "merges": []}}))
    return path


def test_missing_input(tmp_path: Path) -> None:
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    with pytest.raises(ConvertError, match=r"does not exist.*\.gguf file or a Hugging Face model directory"):
        convert(tmp_path / "nope.gguf", out_dir / "x.gguf", progress=False)
    assert _leftovers(out_dir) == []


def test_not_a_gguf(tmp_path: Path) -> None:
    src = tmp_path / "model.gguf"
    src.write_bytes(b"not a gguf file at all")
    with pytest.raises(ConvertError, match="not a GGUF file"):
        convert(src, tmp_path / "x.gguf", progress=False)
    assert _leftovers(tmp_path) == ["model.gguf"]


@pytest.mark.parametrize("qtype", ["q5_k", "iq4_xs", "f16", "bogus"])
def test_unknown_or_unimplemented_type(tiny_gguf: Path, tmp_path: Path, qtype: str) -> None:
    with pytest.raises(ConvertError, match=rf"--type {qtype}.*q4_k"):
        convert(tiny_gguf, tmp_path / "x.gguf", qtype, progress=False)
    assert _leftovers(tmp_path) == []


def test_hf_dir_without_tokenizer(tmp_path: Path) -> None:
    src = _hf_dir(tmp_path / "hf", tokenizer=False)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    with pytest.raises(ConvertError, match=r"has no tokenizer.*save_pretrained"):
        convert(src, out_dir / "x.gguf", progress=False)
    assert _leftovers(out_dir) == []


def test_hf_dir_without_config(tmp_path: Path) -> None:
    src = tmp_path / "hf"
    src.mkdir()
    with pytest.raises(ConvertError, match="no config.json"):
        convert(src, tmp_path / "x.gguf", progress=False)


def test_hf_unsupported_architecture_precheck(tmp_path: Path) -> None:
    src = _hf_dir(tmp_path / "hf", architecture="TotallyNewForCausalLM")
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    with pytest.raises(ConvertError, match="TotallyNewForCausalLM.*not supported"):
        convert(src, out_dir / "x.gguf", progress=False)
    assert _leftovers(out_dir) == []


def test_hf_unsupported_architecture_from_upstream(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # without the pre-check, upstream's convert_hf_to_gguf.py itself refuses the architecture
    monkeypatch.setattr(convert_mod, "_upstream_architectures", lambda upstream: None)
    src = _hf_dir(tmp_path / "hf", architecture="TotallyNewForCausalLM")
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    with pytest.raises(ConvertError, match="TotallyNewForCausalLM.*not supported"):
        convert(src, out_dir / "x.gguf", progress=False)
    assert _leftovers(out_dir) == []


def test_output_directory_missing(tiny_gguf: Path, tmp_path: Path) -> None:
    with pytest.raises(ConvertError, match="does not exist; create it"):
        convert(tiny_gguf, tmp_path / "no" / "such" / "x.gguf", progress=False)


def test_output_is_a_directory(tiny_gguf: Path, tmp_path: Path) -> None:
    with pytest.raises(ConvertError, match="is a directory"):
        convert(tiny_gguf, tmp_path, progress=False)


def test_output_not_writable(tiny_gguf: Path, tmp_path: Path) -> None:
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        # root ignores directory modes; /proc refuses new files even to root
        if not Path("/proc/self").exists():
            pytest.fail("running as root without /proc: cannot make an unwritable directory for this test")
        out = Path("/proc/llama-sparse-test.gguf")
    else:
        locked = tmp_path / "locked"
        locked.mkdir()
        locked.chmod(0o500)
        out = locked / "x.gguf"
    try:
        with pytest.raises(ConvertError, match=r"writ"):
            convert(tiny_gguf, out, progress=False)
        assert not out.exists()
    finally:
        if out.parent != Path("/proc"):
            out.parent.chmod(0o700)


def test_disk_full_while_writing(tiny_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    real_write = convert_mod.GGUFWriter.write_tensor_data
    calls = {"n": 0}

    def write_until_full(self, tensor, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] == 5:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(self, tensor, *args, **kwargs)

    monkeypatch.setattr(convert_mod.GGUFWriter, "write_tensor_data", write_until_full)
    with pytest.raises(ConvertError, match="disk full"):
        convert(tiny_gguf, out_dir / "x.gguf", progress=False)
    assert calls["n"] == 5
    assert _leftovers(out_dir) == [], "the partial temp file must be removed"


def test_disk_full_on_header(tiny_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_space(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(convert_mod.GGUFWriter, "write_kv_data_to_file", no_space)
    with pytest.raises(ConvertError, match="disk full"):
        convert(tiny_gguf, tmp_path / "x.gguf", progress=False)
    assert _leftovers(tmp_path) == []


def test_not_enough_free_space_precheck(tiny_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10 << 30, 10 << 30, 1024))  # type: ignore[attr-defined]
    with pytest.raises(ConvertError, match="not enough disk space"):
        convert(tiny_gguf, tmp_path / "x.gguf", progress=False)
    assert _leftovers(tmp_path) == []


def test_keyboard_interrupt_removes_temp_and_keeps_old_output(tiny_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "x.gguf"
    out.write_bytes(b"previous output")
    real_produce = convert_mod._produce
    calls = {"n": 0}

    def interrupted(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real_produce(*args, **kwargs)

    monkeypatch.setattr(convert_mod, "_produce", interrupted)
    with pytest.raises(KeyboardInterrupt):
        convert(tiny_gguf, out, progress=False)
    assert _leftovers(tmp_path) == ["x.gguf"]
    assert out.read_bytes() == b"previous output"


def test_zigzag_input_is_refused(tiny_gguf: Path, tmp_path: Path) -> None:
    first = tmp_path / "zz.gguf"
    convert(tiny_gguf, first, "q8_0", progress=False)
    with pytest.raises(ConvertError, match="already a llama-sparse zigzag file"):
        convert(first, tmp_path / "again.gguf", progress=False)
    assert _leftovers(tmp_path) == ["zz.gguf"]


def test_output_equal_to_input(tiny_gguf: Path) -> None:
    before = tiny_gguf.read_bytes()
    with pytest.raises(ConvertError, match="is the input file"):
        convert(tiny_gguf, tiny_gguf, progress=False)
    assert tiny_gguf.read_bytes() == before


def test_error_from_module_entry_point(tmp_path: Path) -> None:
    import subprocess

    proc = subprocess.run(
        [sys.executable, "-m", "llama_sparse.convert", str(tmp_path / "nope.gguf"), "-o", str(tmp_path / "x.gguf")],
        capture_output=True, text=True, env=os.environ | {"PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert proc.returncode == 1
    assert "does not exist" in proc.stderr


@pytest.mark.parametrize("declared", [1, 3])
def test_block_count_that_lies(tiny_gguf: Path, tmp_path: Path, declared: int) -> None:
    # a file declaring more layers than it holds once converted cleanly and then failed to load
    from gguf import GGUFReader, GGUFValueType

    from ggufedit import rewrite_gguf
    arch = GGUFReader(tiny_gguf).get_field("general.architecture").contents()
    src = rewrite_gguf(tiny_gguf, tmp_path / "lying.gguf", {f"{arch}.block_count": (declared, GGUFValueType.UINT32, None)})
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    with pytest.raises(ConvertError, match=rf"block_count = {declared} but holds tensors for blk\.0-1"):
        convert(src, out_dir / "x.gguf", progress=False)
    assert _leftovers(out_dir) == []


@pytest.mark.parametrize("config,needle", [
    ([1, 2], "holds a JSON list, not an object"),
    ({"model_type": "llama"}, 'no "architectures" list'),
])
def test_hf_config_without_architectures(tmp_path: Path, config, needle: str) -> None:
    src = _hf_dir(tmp_path / "hf")
    (src / "config.json").write_text(json.dumps(config))
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    with pytest.raises(ConvertError, match=needle):
        convert(src, out_dir / "x.gguf", progress=False)
    assert _leftovers(out_dir) == []


def test_vocabulary_that_cannot_tokenize_is_reported(smollm2_gguf: Path, tmp_path: Path) -> None:
    # a byte-level BPE vocabulary labelled SentencePiece (as transformers' GGUF export can leave an HF directory)
    # converted cleanly and failed only at the first prompt
    from gguf import GGUFValueType

    from ggufedit import rewrite_gguf
    bad = rewrite_gguf(smollm2_gguf, tmp_path / "spm.gguf", {"tokenizer.ggml.model": ("llama", GGUFValueType.STRING, None)})
    summary = convert(bad, tmp_path / "bad.zz.gguf", "q8_0", progress=False)
    assert len(summary.warnings) == 1 and "cannot tokenize a plain sentence" in summary.warnings[0]
    assert "warning:" in summary.report()
    assert convert(smollm2_gguf, tmp_path / "good.zz.gguf", "q8_0", progress=False).warnings == []


@pytest.mark.parametrize("kv,drop,needle", [
    ({"{arch}.block_count": ("thirty", "STRING", None)}, (), r"block_count must be an integer, not string"),
    ({"general.architecture": (5, "UINT32", None)}, (), r"general.architecture must be a string, not uint32"),
    ({}, ("{arch}.block_count",), r"has no \w+\.block_count key"),
])
def test_metadata_of_the_wrong_type(tiny_gguf: Path, tmp_path: Path, kv, drop, needle: str) -> None:
    # these once ended in "invalid literal for int()" / "object of type 'int' has no len()", or converted a file
    # without block_count that then failed to load
    from gguf import GGUFReader, GGUFValueType

    from ggufedit import rewrite_gguf
    arch = GGUFReader(tiny_gguf).get_field("general.architecture").contents()
    set_kv = {k.format(arch=arch): (v, GGUFValueType[t], s) for k, (v, t, s) in kv.items()}
    src = rewrite_gguf(tiny_gguf, tmp_path / "typed.gguf", set_kv, drop=tuple(d.format(arch=arch) for d in drop))
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    with pytest.raises(ConvertError, match=needle):
        convert(src, out_dir / "x.gguf", progress=False)
    assert _leftovers(out_dir) == []


def test_output_that_is_a_checkpoint_file_refused(tmp_path: Path) -> None:
    # -o hf/model.safetensors once replaced the checkpoint's weights with the converted GGUF
    src = _hf_dir(tmp_path / "hf")
    before = {p.name: p.read_bytes() for p in src.iterdir()}
    for name in before:
        with pytest.raises(ConvertError, match="is a file of the input checkpoint"):
            convert(src, src / name, progress=False)
    assert {p.name: p.read_bytes() for p in src.iterdir()} == before


def test_output_through_a_symlink_writes_its_target(tiny_gguf: Path, tmp_path: Path) -> None:
    (tmp_path / "real.gguf").write_bytes(b"old")
    (tmp_path / "link.gguf").symlink_to("real.gguf")
    convert(tiny_gguf, tmp_path / "link.gguf", "q8_0", progress=False)
    assert (tmp_path / "link.gguf").is_symlink()
    assert (tmp_path / "real.gguf").read_bytes()[:4] == b"GGUF"
