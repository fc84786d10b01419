#!/usr/bin/env python3
"""Write a random-weight Llama-shaped GGUF for speed tests (weights are N(0, 0.02), tokenizer is dummy).

  bench/make_random_gguf.py --shape llama2-7b --type q4_k -o /tmp/rand-7b.q4_k.gguf

Speed only: the text it produces is noise. Convert the result with `llama-sparse convert` for the
zigzag twin, and calibrate it on any text (thresholds follow the activation statistics of the noise).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))  # llama_sparse, also in workers

SHAPES = {
    # n_embd, n_ff, n_layer, n_head, n_head_kv, n_vocab, n_ctx
    "llama2-7b":  (4096, 11008, 32, 32, 32, 32000, 4096),
    "llama2-13b": (5120, 13824, 40, 40, 40, 32000, 4096),
    "llama3-8b":  (4096, 14336, 32, 32, 8, 128256, 8192),
    "llama-1b":   (2048, 8192, 16, 32, 8, 128256, 8192),
    "tiny":       (256, 512, 2, 4, 2, 1000, 512),
}


def _draw(job: tuple[int, int, int, int, int]) -> np.ndarray:
    """Tensor i of the file: N(0, 0.02) from its own seed, as f32/f16 or quantized."""
    from gguf import GGMLQuantizationType
    from llama_sparse import _ggml

    seed, i, m, n, qt = job
    qtype = GGMLQuantizationType(qt)
    x = np.random.default_rng([seed, i]).standard_normal((m, n), dtype=np.float32) * 0.02
    if qtype == GGMLQuantizationType.F16:
        return x.astype(np.float16)
    if qtype == GGMLQuantizationType.F32:
        return x
    return _ggml.quantize(qtype, x)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="llama2-7b")
    ap.add_argument("--type", default="q4_k", help="standard-layout weight type (q4_k, q8_0, f16, ...)")
    ap.add_argument("-o", "--output", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1,
                    help="processes drawing and quantizing tensors (each tensor has its own seed: same file for any -j)")
    ap.add_argument("--layers", type=int, default=0,
                    help="number of blocks instead of the shape's (same per-layer shapes, smaller file: quicker to make)")
    a = ap.parse_args()

    from gguf import GGMLQuantizationType, GGUFWriter
    from llama_sparse import _ggml

    _ggml._lib()  # load libggml-base here: a worker's load error would not pickle back

    n_embd, n_ff, n_layer, n_head, n_head_kv, n_vocab, n_ctx = SHAPES[a.shape]
    if a.layers > 0:
        n_layer = a.layers
    qtype = GGMLQuantizationType[a.type.upper()]
    head_dim = n_embd // n_head

    w = GGUFWriter(a.output, "llama")
    w.add_name(f"random-{a.shape}")
    w.add_block_count(n_layer)
    w.add_context_length(n_ctx)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_rope_dimension_count(head_dim)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(n_vocab)
    w.add_tokenizer_model("llama")
    w.add_token_list(["<unk>", "<s>", "</s>"] + [f"<t{i}>" for i in range(3, n_vocab)])
    w.add_token_scores([0.0] * n_vocab)
    w.add_token_types([2, 3, 3] + [1] * (n_vocab - 3))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)

    t0 = time.time()
    tensors = [("token_embd.weight", n_vocab, n_embd)]
    for i in range(n_layer):
        kv = n_head_kv * head_dim
        tensors += [(f"blk.{i}.attn_q.weight", n_embd, n_embd), (f"blk.{i}.attn_k.weight", kv, n_embd),
                    (f"blk.{i}.attn_v.weight", kv, n_embd), (f"blk.{i}.attn_output.weight", n_embd, n_embd),
                    (f"blk.{i}.ffn_gate.weight", n_ff, n_embd), (f"blk.{i}.ffn_up.weight", n_ff, n_embd),
                    (f"blk.{i}.ffn_down.weight", n_embd, n_ff)]
    tensors.append(("output.weight", n_vocab, n_embd))
    jobs = [(a.seed, i, m, n, int(qtype)) for i, (_, m, n) in enumerate(tensors)]
    with ProcessPoolExecutor(max(1, a.jobs)) as pool:
        for i, ((name, _, _), data) in enumerate(zip(tensors, pool.map(_draw, jobs))):
            if qtype in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
                w.add_tensor(name, data)
            else:
                w.add_tensor(name, data, raw_shape=data.shape, raw_dtype=qtype)
            print(f"\r[{i + 1}/{len(tensors)}] {name:32s} {time.time() - t0:6.1f}s", end="", file=sys.stderr, flush=True)
    for i in range(n_layer):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(n_embd, np.float32))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(n_embd, np.float32))
    w.add_tensor("output_norm.weight", np.ones(n_embd, np.float32))
    print(file=sys.stderr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file(progress=False)
    w.close()
    print(f"wrote {a.output} ({a.output.stat().st_size / 2**30:.2f} GiB) in {time.time() - t0:.0f}s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
