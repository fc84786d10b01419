"""Test helper: copy a GGUF with some metadata replaced or dropped (to make lying files)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from gguf import GGUFReader, GGUFValueType, GGUFWriter


def rewrite_gguf(src: Path, dst: Path, set_kv: dict[str, tuple[Any, GGUFValueType, Any]] | None = None,
                 drop: tuple[str, ...] = ()) -> Path:
    """set_kv: key -> (value, type, array sub-type or None); drop: keys (or key prefixes ending in '.') to remove.
    general.architecture in set_kv replaces the string the writer puts first (any type: a lying file)."""
    set_kv = dict(set_kv or {})
    r = GGUFReader(src)
    arch = r.get_field("general.architecture").contents()
    w = GGUFWriter(dst, arch)
    if "general.architecture" in set_kv:
        w.kv_data[0].pop("general.architecture")
        v, vtype, sub = set_kv.pop("general.architecture")
        w.add_key_value("general.architecture", v, vtype, sub_type=sub)
    for f in r.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture" or f.name in set_kv:
            continue
        if any(f.name == d or (d.endswith(".") and f.name.startswith(d)) for d in drop):
            continue
        vtype = f.types[0]
        if f.name == "general.alignment":
            w.add_custom_alignment(int(f.contents()))
            continue
        w.add_key_value(f.name, f.contents(), vtype, sub_type=f.types[-1] if vtype == GGUFValueType.ARRAY else None)
    for k, (v, vtype, sub) in set_kv.items():
        w.add_key_value(k, v, vtype, sub_type=sub)
    for t in r.tensors:
        w.add_tensor(t.name, t.data, raw_shape=t.data.shape, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def zigzag_with_levels(src: Path, d: Path, zz_type: str, levels: dict[str, tuple[float, float]]) -> Path:
    """src converted to zigzag zz_type in d, with hand-set levels: name -> (target, one threshold for every group).
    Mechanics only: real thresholds come from calibrate."""
    from llama_sparse.convert import convert
    zz = convert(src, d / "zz.gguf", zz_type, progress=False).output
    n_layer = int(GGUFReader(zz).get_field("llama.block_count").contents())
    V = GGUFValueType
    kv: dict[str, tuple[Any, GGUFValueType, Any]] = {
        "llama_sparse.levels": (list(levels), V.ARRAY, V.STRING),
        "llama_sparse.level_targets": ([t for t, _ in levels.values()], V.ARRAY, V.FLOAT32)}
    for name, (_, thr) in levels.items():
        kv[f"llama_sparse.thresholds.{name}"] = ([thr] * (4 * n_layer), V.ARRAY, V.FLOAT32)
    return rewrite_gguf(zz, d / "zz-levels.gguf", kv)

