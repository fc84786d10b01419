"""Which zigzag GEMV launches of a decode graph could have their output initialized by the launch before them.

The EARLY reduction sets each GEMV's output (to 0 or the residual) inside the launch itself; what that costs is
bounded by LLAMA_SPARSE_CUDA_WHATIF_NOINIT (cuda/README.md). Doing it in the previous zigzag launch P instead is
only safe when the output C writes shares no memory with what P reads or writes, or with any node that runs between
P and C. ggml's graph allocator reuses the memory of dead tensors, so this depends on the graph's allocation. This
script decodes one token with an eval callback, records every node's data range, and counts the safe pairs, taking
the CUDA hook's fusions into account: sibling launches (q/k/v, up/gate), the RMS norm folded into the GEMV that reads
its input (so the norm nodes never run), SwiGLU and the residual add fused into the down / o launch.

The allocation is the host buffer's (the CPU backend), not CUDA's; the two differ only in alignment.

usage: python bench/graph_alias.py MODEL.gguf [--level 0.50] [--list]
"""
from __future__ import annotations

import argparse
import ctypes
import sys


class _Tensor(ctypes.Structure):
    pass


# struct ggml_tensor of upstream 0c1e570 (GGML_MAX_DIMS 4, GGML_MAX_OP_PARAMS 64, GGML_MAX_SRC 10, GGML_MAX_NAME 64)
_Tensor._fields_ = [
    ("type", ctypes.c_int), ("buffer", ctypes.c_void_p), ("ne", ctypes.c_int64 * 4), ("nb", ctypes.c_size_t * 4),
    ("op", ctypes.c_int), ("op_params", ctypes.c_int32 * 16), ("flags", ctypes.c_int32),
    ("src", ctypes.POINTER(_Tensor) * 10), ("view_src", ctypes.POINTER(_Tensor)), ("view_offs", ctypes.c_size_t),
    ("data", ctypes.c_void_p), ("name", ctypes.c_char * 64), ("extra", ctypes.c_void_p), ("padding", ctypes.c_char * 8),
]


def record_decode(model: str, level: str) -> list[dict]:
    """every node of one decode step after a short prefill: name, op, data range, sources"""
    import os
    import llama_sparse  # points llama_cpp at the fork's library
    import llama_cpp as L

    os.environ["LLAMA_SPARSE"] = level
    lib = os.path.join(os.path.dirname(llama_sparse.__file__), "lib")
    base = ctypes.CDLL(os.path.join(lib, "libggml-base.so"))
    base.ggml_op_name.restype = ctypes.c_char_p
    base.ggml_op_name.argtypes = [ctypes.c_int]
    base.ggml_nbytes.restype = ctypes.c_size_t
    base.ggml_nbytes.argtypes = [ctypes.c_void_p]

    def desc(p) -> dict:
        t = p.contents
        return {"id": ctypes.addressof(t), "name": t.name.decode(errors="replace"), "op": base.ggml_op_name(t.op).decode(),
                "data": t.data or 0, "nbytes": base.ggml_nbytes(ctypes.addressof(t))}

    nodes: list[dict] = []
    on = [False]

    @L.ggml_backend_sched_eval_callback
    def cb(t, ask, _ud):
        if not ask and on[0]:
            p = ctypes.cast(t, ctypes.POINTER(_Tensor))
            d = desc(p)
            d["src"] = [desc(p.contents.src[i]) for i in range(10) if p.contents.src[i]]
            nodes.append(d)
        return True

    L.llama_backend_init()
    m = L.llama_model_load_from_file(model.encode(), L.llama_model_default_params())
    if not m:
        sys.exit(f"graph_alias: cannot load {model}")
    cp = L.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch = 256, 64, 64
    cp.cb_eval = cb
    ctx = L.llama_init_from_model(m, cp)
    prompt = (L.llama_token * 8)(1, 504, 3458, 282, 1345, 30, 800, 421)
    if L.llama_decode(ctx, L.llama_batch_get_one(prompt, 8)) != 0:
        sys.exit("graph_alias: prefill failed")
    on[0] = True
    one = (L.llama_token * 1)(42)
    if L.llama_decode(ctx, L.llama_batch_get_one(one, 1)) != 0:
        sys.exit("graph_alias: decode failed")
    L.llama_free(ctx)
    L.llama_model_free(m)
    return nodes


def _range(d: dict) -> tuple[int, int]:
    return d["data"], d["data"] + d["nbytes"]


def _overlaps(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def launches(nodes: list[dict]) -> list[tuple[int, int, list, list]]:
    """the zigzag launches as the CUDA hook runs them: (first node, next node, outputs, tensors the launch touches)"""
    by_id = {d["id"]: d for d in nodes}

    def reads(d: dict) -> list[dict]:
        x = by_id.get(d["src"][1]["id"], d["src"][1])
        if x["op"] == "MUL" and by_id.get(x["src"][0]["id"], {}).get("op") == "RMS_NORM":
            return [by_id[x["src"][0]["id"]]["src"][0]]  # folded norm: the launch reads the norm's input
        if x["op"] == "GLU":
            return x["src"][:2]  # fused SwiGLU: gate and up
        return [x]

    out, i = [], 0
    while i < len(nodes):
        if nodes[i]["op"] != "MUL_MAT_ZZ":
            i += 1
            continue
        x, grp, j = nodes[i]["src"][1]["id"], [i], i + 1
        while j < len(nodes) and nodes[j]["op"] == "MUL_MAT_ZZ" and nodes[j]["src"][1]["id"] == x:
            grp.append(j)
            j += 1
        outs, touch = [], []
        for g in grp:
            touch += reads(nodes[g])
            a = nodes[g + 1] if g + 1 < len(nodes) else None
            if a is not None and a["op"] == "ADD" and any(s["id"] == nodes[g]["id"] for s in a["src"]):
                outs.append((a["name"], _range(a)))  # fused residual add: the launch writes the add's output
                touch += [a] + a["src"]
                j = max(j, g + 2)
            else:
                outs.append((nodes[g]["name"], _range(nodes[g])))
                touch.append(nodes[g])
        out.append((grp[0], j, outs, touch))
        i = j
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--level", default="0.50")
    ap.add_argument("--list", action="store_true", help="print each conflicting pair")
    a = ap.parse_args()
    nodes = record_decode(a.model, a.level)
    ls = launches(nodes)
    folded = {"RMS_NORM", "MUL", "SPARSE_IDX", "GLU", "MUL_MAT_ZZ", "ADD"}  # not run between launches on CUDA
    counts: dict[str, list[int]] = {}
    for k in range(1, len(ls)):
        _, p_end, _, p_touch = ls[k - 1]
        c_begin, _, c_outs, _ = ls[k]
        why = []
        for name, o in c_outs:
            why += [f"the launch before touches {t['name']}" for t in p_touch if t["nbytes"] and _overlaps(o, _range(t))]
            for n in range(p_end, c_begin):
                d = nodes[n]
                if d["op"] not in folded:
                    why += [f"{d['op']} {t['name']}" for t in [d] + d["src"] if t["nbytes"] and _overlaps(o, _range(t))]
        kind = c_outs[0][0].rsplit("-", 1)[0]
        counts.setdefault(kind, [0, 0])[1 if why else 0] += 1
        if why and a.list:
            print(f"{c_outs[0][0]}: {why[0]}")
    print(f"{len(nodes)} nodes, {len(ls)} zigzag launches; launches whose output the launch before could set "
          f"(safe / not), by output:")
    for kind, (ok, bad) in counts.items():
        print(f"  {kind:10s} {ok:4d} / {bad}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
