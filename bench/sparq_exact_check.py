#!/usr/bin/env python3
"""SparQ with k >= the context against upstream's attention, tensor by tensor: decodes a few tokens one at a time
with SparQ off and on (k above the visible positions, below the cache view, so the op runs its exact path),
captures each layer's attention output through the graph's eval callback, and prints

- layer 0's output against an fp64 attention over the captured Qcur/Kcur/Vcur (max |diff| / max |ref|), both runs;
- the two runs against each other at a few layers, and their logits.

    python bench/sparq_exact_check.py MODEL [--kv f32|f16] [--fa on|off]

For a Llama-shaped model on the CPU (head size from the model; GQA by heads / KV heads).
"""
import argparse
import ctypes
import sys

import numpy as np

import llama_sparse  # noqa: F401  (points llama_cpp at the fork)
import llama_cpp
from llama_sparse import _native

# struct ggml_tensor offsets (ggml.h at 0c1e570, 64-bit): type 0, ne 16, nb 48, data 248, name 256
OFF_NE, OFF_NB, OFF_DATA, OFF_NAME = 16, 48, 248, 256
GGML_TYPE_F32 = 0


def capture(model, sparq, want, tokens, kv_type, fa):
    steps = []

    @ctypes.CFUNCTYPE(ctypes.c_bool, ctypes.c_void_p, ctypes.c_bool, ctypes.c_void_p)
    def cb(tp, ask, _ud):
        name = ctypes.string_at(tp + OFF_NAME, 64).split(b"\0")[0].decode()
        if name not in want:
            return not ask
        if ask:
            return True
        ne = [ctypes.c_int64.from_address(tp + OFF_NE + 8*i).value for i in range(4)]
        nb = [ctypes.c_int64.from_address(tp + OFF_NB + 8*i).value for i in range(4)]
        if ctypes.c_int32.from_address(tp).value == GGML_TYPE_F32 and nb[1] == 4*ne[0] and nb[2] == nb[1]*ne[1]:
            n = ne[0]*ne[1]*ne[2]*ne[3]
            data = ctypes.c_void_p.from_address(tp + OFF_DATA).value
            steps[-1][name] = np.ctypeslib.as_array((ctypes.c_float*n).from_address(data)).copy()
        return True

    cp = llama_cpp.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_threads, cp.n_threads_batch = 512, 256, 2, 2
    cp.type_k = cp.type_v = kv_type
    cp.flash_attn_type = fa
    cp.cb_eval = ctypes.cast(cb, type(cp.cb_eval))
    ctx = llama_cpp.llama_init_from_model(model, cp)
    if sparq and _native.llama_sparse_set_sparq_str(ctx, sparq.encode()) != 0:
        raise SystemExit(_native.sparq_last_error())
    for t in tokens:
        steps.append({})
        if llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one((llama_cpp.llama_token*1)(t), 1)) != 0:
            raise SystemExit("llama_decode failed")
    llama_cpp.llama_free(ctx)
    return steps


def attention_f64(steps, step, d, group):
    q = steps[step]["Qcur-0"].reshape(-1, d).astype(np.float64)
    k = np.stack([steps[s]["Kcur-0"].reshape(-1, d) for s in range(step + 1)]).astype(np.float64)
    v = np.stack([steps[s]["Vcur-0"].reshape(-1, d) for s in range(step + 1)]).astype(np.float64)
    out = []
    for h in range(q.shape[0]):
        logit = k[:, h // group] @ q[h] / np.sqrt(d)
        p = np.exp(logit - logit.max())
        out.append((p / p.sum()) @ v[:, h // group])
    return np.concatenate(out)


def rel(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--kv", choices=("f32", "f16"), default="f32", help="KV cache type (default f32)")
    ap.add_argument("--fa", choices=("on", "off"), default="off", help="upstream's flash attention (default off)")
    ap.add_argument("--text", default="Once upon a time there was", help="tokens decoded one at a time")
    args = ap.parse_args()

    llama_cpp.llama_backend_init()
    model = llama_cpp.llama_model_load_from_file(args.model.encode(), llama_cpp.llama_model_default_params())
    if not model:
        raise SystemExit(f"cannot load {args.model}")
    n_head = llama_cpp.llama_model_n_head(model)
    n_head_kv = llama_cpp.llama_model_n_head_kv(model)
    d = llama_cpp.llama_model_n_embd(model) // n_head
    n_layer = llama_cpp.llama_model_n_layer(model)
    vocab = llama_cpp.llama_model_get_vocab(model)
    buf = (llama_cpp.llama_token*256)()
    text = args.text.encode()
    n = llama_cpp.llama_tokenize(vocab, text, len(text), buf, 256, True, False)
    tokens = list(buf[:n])
    layers = sorted({0, 1, 2, n_layer // 4, n_layer // 2, n_layer - 1})
    want = {"Qcur-0", "Kcur-0", "Vcur-0", "result_output"}
    want |= {f"kqv_out-{il}" for il in layers} | {f"sparq_attn-{il}" for il in layers}
    kv_type = 0 if args.kv == "f32" else 1
    fa = 1 if args.fa == "on" else 0
    # k above the positions decoded here, below the 256-cell cache view: the op's exact path
    off = capture(model, None, want, tokens, kv_type, fa)
    on = capture(model, "r=8,k=128,min_kv=0", want, tokens, kv_type, fa)
    print(f"{args.model}: {len(tokens)} tokens, KV {args.kv}, upstream flash attention {args.fa}, "
          f"head size {d}, GQA {n_head}/{n_head_kv}")
    print("step | layer 0 vs fp64: upstream, SparQ | SparQ vs upstream at layers " + " ".join(map(str, layers))
          + " | logits max |diff|")
    for step in range(1, len(tokens)):
        ref = attention_f64(off, step, d, n_head // n_head_kv)
        a, b = off[step], on[step]
        per_layer = " ".join(f"{rel(b[f'sparq_attn-{il}'], a[f'kqv_out-{il}']):.1e}" for il in layers)
        print(f"{step:4d} | {rel(a['kqv_out-0'], ref):.1e} {rel(b['sparq_attn-0'], ref):.1e} | {per_layer} | "
              f"{np.abs(a['result_output'] - b['result_output']).max():.3f}")
    llama_cpp.llama_model_free(model)
    return 0


if __name__ == "__main__":
    sys.exit(main())
