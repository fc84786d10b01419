"""Tiny random-weight HF checkpoints of several architectures, and their transformers logits (dense or with
TEAL's input masks). Run as a script so that torch stays out of the test process:

    python hf_tiny.py make OUT_DIR SPM_MODEL KEY...      one checkpoint per KEY under OUT_DIR/KEY
    python hf_tiny.py ref HF_DIR REQUEST.json OUT.npz     logits for the request's tokens, dense and per level
"""
from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

# key -> (transformers model_type, config beyond COMMON). Shapes: hidden 256, ffn 512, 4 heads of 64, 2 KV heads.
ARCHS: dict[str, tuple[str, dict]] = {
    "qwen2":   ("qwen2", {}),                                    # q/k/v biases
    "qwen3":   ("qwen3", {"head_dim": 64}),                      # q/k norms
    "phi3":    ("phi3", {"pad_token_id": 0}),                    # fused attn_qkv, gate and up in one ffn_up
    "gemma":   ("gemma", {"head_dim": 64, "tie_word_embeddings": True}),  # GeGLU, scaled embeddings
    "gemma2":  ("gemma2", {"head_dim": 64, "query_pre_attn_scalar": 64, "sliding_window": 128,
                           "tie_word_embeddings": True}),        # softcaps, post-norms, sliding-window cache
    "granite": ("granite", {"embedding_multiplier": 4.0, "residual_multiplier": 0.5,
                            "attention_multiplier": 0.1, "logits_scaling": 2.0}),
    "mixtral": ("mixtral", {"num_local_experts": 4, "num_experts_per_tok": 2}),  # MoE: experts stay standard
}
COMMON = dict(vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=1024, bos_token_id=1, eos_token_id=2,
              tie_word_embeddings=False)

# projection module name -> calibration group (docs/format.md: qkv, o, gate_up, down)
GROUPS = {"q_proj": 0, "k_proj": 0, "v_proj": 0, "qkv_proj": 0, "o_proj": 1,
          "gate_proj": 2, "up_proj": 2, "gate_up_proj": 2, "down_proj": 3}


def make(out: Path, spm: Path, keys: list[str]) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    for key in keys:
        model_type, extra = ARCHS[key]
        cfg = AutoConfig.for_model(model_type, **{**COMMON, **extra})
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(cfg).float()
        with torch.no_grad():
            for name, p in model.named_parameters():
                if p.dim() >= 2:
                    p.normal_(0.0, 0.05)
                elif name.endswith("bias"):
                    p.normal_(0.0, 0.02)
        d = out / key
        model.save_pretrained(d)
        shutil.copy(spm, d / "tokenizer.model")
        print(key, type(model).__name__, flush=True)


def reference(hf_dir: Path, request: Path, out: Path) -> None:
    """request: {"tokens": [...], "levels": {name: [4*n_layer thresholds, layer-major]}}"""
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM
    req = json.loads(request.read_text())
    model = AutoModelForCausalLM.from_pretrained(hf_dir).float().eval()
    thr: list[float] = []  # the level being computed; empty: dense

    def masker(layer: int, group: int):
        def pre(_mod, args):
            t = thr[4*layer + group] if thr else 0.0
            if t <= 0.0:
                return None
            x = args[0]
            return (torch.where(x.abs() < t, torch.zeros_like(x), x),) + tuple(args[1:])
        return pre

    hooked = 0
    for name, mod in model.named_modules():
        m = re.search(r"layers\.(\d+)\.(?:.*\.)?([a-z_]+)$", name)
        if m and m.group(2) in GROUPS and "expert" not in name and isinstance(mod, torch.nn.Linear):
            mod.register_forward_pre_hook(masker(int(m.group(1)), GROUPS[m.group(2)]))
            hooked += 1
    ids = torch.tensor([req["tokens"]])
    res = {"hooked": np.array(hooked)}
    with torch.no_grad():
        res["dense"] = model(ids).logits[0].float().numpy()
        for level, t in req["levels"].items():
            thr[:] = t
            res[level] = model(ids).logits[0].float().numpy()
    np.savez(out, **res)


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4:])
    elif sys.argv[1] == "ref":
        reference(Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4]))
    else:
        sys.exit(f"usage: {sys.argv[0]} make OUT SPM KEY... | ref HF_DIR REQUEST.json OUT.npz")
