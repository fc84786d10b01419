"""Needle-in-a-haystack retrieval with SparQ attention against dense (CPU, llama_sparse.Llama).

A passphrase sentence is hidden at a relative depth of an Austen haystack of about N tokens. The haystack is
prefilled densely once per (N, depth); then, for dense and each compression c, the question is decoded one token
at a time (so SparQ sees it: SparQ only acts at decode) and the answer is generated greedily. A cell counts as
retrieved when the generated text contains the passphrase's number. Compression c uses k = S*c (S = tokens in the cache
when the question starts) and r = d_h*c (d_h = 64 for SmolLM2), as in issue 7.

usage: python bench/sparq_needle.py MODEL.gguf [--ctx 2048,4096,8192] [--depths 0.1,0.3,0.5,0.7,0.9]
       [--comp 0.5,0.25,0.125] [--mean-v] [--out bench/results/sparq_needle_smollm2.json]
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

AUSTEN = Path("/work/shared/data/austen")
WORDS = ["amber", "falcon", "orchard", "lantern", "meadow", "harbor", "velvet", "thistle", "copper", "willow"]


def haystack_text() -> str:
    parts = []
    for name in ("prideprejudice.txt", "emma.txt", "persuasion.txt"):
        t = (AUSTEN / name).read_text(encoding="utf-8", errors="replace")
        parts.append(t[len(t) // 10:])  # skip front matter
    return "\n".join(parts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", type=Path)
    ap.add_argument("--ctx", default="2048,4096,8192")
    ap.add_argument("--depths", default="0.1,0.3,0.5,0.7,0.9")
    ap.add_argument("--comp", default="0.5,0.25,0.125")
    ap.add_argument("--mean-v", action="store_true")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()

    import llama_sparse
    from llama_sparse import SparQ

    ctxs = [int(x) for x in a.ctx.split(",")]
    depths = [float(x) for x in a.depths.split(",")]
    comps = [float(x) for x in a.comp.split(",")]
    llm = llama_sparse.Llama(a.model, n_ctx=max(ctxs) + 256, n_batch=512, n_threads=a.threads, verbose=False)
    hay = llm.tokenize(haystack_text().encode(), add_bos=False)
    rng = random.Random(7)
    rows = []
    t0 = time.time()
    for n_ctx in ctxs:
        for depth in depths:
            secret = f"{rng.choice(WORDS)}-{rng.randint(100, 999)}"
            needle = llm.tokenize(f" The secret passphrase is {secret}. Remember it: {secret}. ".encode(), add_bos=False)
            question = llm.tokenize(b"\n\nQuestion: What is the secret passphrase mentioned in the text above?\n"
                                    b"Answer: The secret passphrase is", add_bos=False)
            n_hay = n_ctx - len(needle) - len(question) - 24
            body = hay[:n_hay]
            cut = int(depth * n_hay)
            prompt = [llm.token_bos()] + body[:cut] + needle + body[cut:]
            llm.reset()
            llm.eval(prompt)  # dense prefill, shared by every setting
            S = len(prompt)
            settings = [("dense", None)] + [(f"c={c:g}", SparQ(r=max(1, round(64 * c)), k=max(1, round(S * c)), mean_v=a.mean_v))
                                           for c in comps]
            for name, sp in settings:
                llm.set_sparq(sp)
                llm.n_tokens = S  # drop what the previous setting decoded
                for t in question:  # the question is decoded: SparQ reads the haystack here
                    llm.eval([t])
                out = []
                for _ in range(10):
                    tok = llm.sample(temp=0.0)
                    if tok == llm.token_eos():
                        break
                    out.append(tok)
                    llm.eval([tok])
                text = llm.detokenize(out).decode(errors="replace")
                ok = secret.split("-")[1] in text  # the number: the model may respell the word ("harbour")
                rows.append({"ctx": n_ctx, "S": S, "depth": depth, "setting": name,
                             "r": sp.r if sp else None, "k": sp.k if sp else None, "mean_v": bool(sp and sp.mean_v),
                             "secret": secret, "answer": text.strip(), "retrieved": ok})
                print(f"[{time.time() - t0:7.1f}s] ctx {n_ctx} depth {depth:.2f} {name:8s} "
                      f"{'OK ' if ok else 'MISS'} {text.strip()!r} (secret {secret})", flush=True)
            llm.set_sparq(None)

    print("\nretrieved (of depths) per context and setting:")
    names = ["dense"] + [f"c={c:g}" for c in comps]
    print(f"{'ctx':>6s} " + " ".join(f"{n:>8s}" for n in names))
    for n_ctx in ctxs:
        cells = []
        for n in names:
            sel = [r for r in rows if r["ctx"] == n_ctx and r["setting"] == n]
            cells.append(f"{sum(r['retrieved'] for r in sel)}/{len(sel)}")
        print(f"{n_ctx:6d} " + " ".join(f"{c:>8s}" for c in cells))
    agree = sum(1 for r in rows if r["setting"] != "dense" and
                r["retrieved"] == next(d["retrieved"] for d in rows if d["setting"] == "dense"
                                       and d["ctx"] == r["ctx"] and d["depth"] == r["depth"]))
    print(f"cells where SparQ agrees with dense: {agree}/{len(rows) - len(rows) // len(names)}")
    if a.out:
        a.out.write_text(json.dumps({"model": str(a.model), "mean_v": a.mean_v, "rows": rows}, indent=1))
        print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
