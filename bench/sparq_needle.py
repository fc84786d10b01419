"""Needle-in-a-haystack retrieval with SparQ attention against dense (CPU, llama_sparse.Llama, the fork's SparQ op).

Prompt (SmolLM2's chat template): a user turn holding an Austen haystack of about N tokens with one needle
sentence "The special magic number is NNNNN." at a relative depth, then the question; the assistant turn is primed
with "The special magic number is". The haystack before the needle is prefilled densely once per (N, depth) and
kept; each needle then prefills from its own position on (llama.cpp drops the cache past n_tokens). Everything from
the end of the haystack on (the question, the template, the primer) is decoded one token at a time, so SparQ reads
the whole haystack for those tokens and for the answer (SparQ acts at decode only). A needle counts as retrieved
when the greedy answer contains its number.

Compression c is the paper's: the attention data read per KV head and step, over dense's 2*S*d_h. SparQ reads
S*r (r components of every key) + 2*k*d_h (full K and V of k rows), so c = r/(2*d_h) + k/S, S = cached positions
when the question starts. --split f gives the share f of c to the r term: r = round(2*d_h*c*f), and the rest to
k: k = round(S*(c - r/(2*d_h))), so c stays exact whatever r rounds to. The default, the even split f = 0.5
(DEFAULT_SPLIT; other splits compared in bench/results/sparq_needle_split_2026-11-23.md), gives for d_h = 64:
c=1/2 -> r=32, k=S/4; c=1/4 -> r=16, k=S/8; c=1/8 -> r=8, k=S/16. Several splits and --mean-v both run every
combination on the same needles (one dense prefill per needle; the settings only re-decode the question).

--kt q8_0 stores the transposed K in 8 bits (Q8_0: 34 bytes per 32 values against 64 for the f16 cache), so the r
term costs r*(34/32)/(4*d_h) and c = r*(34/32)/(4*d_h) + k/S; the split then gives r = round(4*d_h*c*f/(34/32)) and
k the exact rest. At c=1/8 and f = 0.5: r=15, k=S/15.9. "--kt k,q8_0" runs both storages.

usage: python bench/sparq_needle.py MODEL.gguf [--ctx 2048,4096,8192] [--depths 0.1,0.5,0.9]
       [--comp 0.5,0.25,0.125] [--split 0.5[,0.25,...]] [--needles 3] [--seed 7] [--mean-v [off|on|both]]
       [--out results.json]
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path


AUSTEN = Path("/work/shared/data/austen")
HEAD_DIM = 64  # SmolLM2-135M
# share of the compression on the r term: even. 0.75 won on a development needle set but not on the evaluation
# needles (bench/results/sparq_needle_split_2026-11-23.md), so the even split stays.
DEFAULT_SPLIT = 0.5
SYSTEM = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
USER = "<|im_start|>user\nRead the following text and remember the special magic number hidden in it.\n\n"
QUESTION = ("\n\nWhat is the special magic number mentioned in the text above? Answer with the number only."
            "<|im_end|>\n<|im_start|>assistant\nThe special magic number is")


def haystack_text() -> str:
    parts = []
    for name in ("prideprejudice.txt", "emma.txt", "persuasion.txt"):
        t = (AUSTEN / name).read_text(encoding="utf-8", errors="replace")
        parts.append(t[len(t) // 10:])  # skip front matter
    return "\n".join(parts)


# bytes per transposed-K element over the f16 cache's 2: the r term of c scales by this
KT_COST = {"k": 1.0, "q8_0": 34 / 32 / 2}


def split_rk(S: int, c: float, f: float, head_dim: int = HEAD_DIM, kt: str = "k") -> tuple[int, int]:
    """(r, k) for compression c with the share f of it on the r term (c = cost*r/(2*head_dim) + k/S)."""
    cost = KT_COST[kt]
    r = min(head_dim, max(1, round(2 * head_dim * c * f / cost)))
    k = max(1, round(S * (c - cost * r / (2 * head_dim))))
    return r, k


def setting_names(comps: list[float], splits: list[float], mean_vs: list[bool], kts: list[str] = ("k",)) -> list[tuple]:
    """(name, c, f, mean_v, kt) per SparQ setting; plain "c=X" names when one split and one mean-V mode run;
    ",q8" marks the 8-bit transposed K."""
    plain = len(splits) == 1 and len(mean_vs) == 1
    return [((f"c={c:g}" if plain else f"c={c:g},f={f:g}{',mv' if mv else ''}") + (",q8" if kt == "q8_0" else ""),
             c, f, mv, kt)
            for c in comps for f in splits for mv in mean_vs for kt in kts]


def settings_for(S: int, comps: list[float], splits: list[float], mean_vs: list[bool], kts: list[str] = ("k",),
                 head_dim: int = HEAD_DIM):
    """[("dense", None, None)] then (name, f, SparQ) per setting of setting_names, (r, k) by split_rk at S."""
    from llama_sparse import SparQ
    out = [("dense", None, None)]
    for name, c, f, mv, kt in setting_names(comps, splits, mean_vs, kts):
        r, k = split_rk(S, c, f, head_dim, kt=kt)
        out.append((name, f, SparQ(r=r, k=k, mean_v=mv, kt=kt, min_kv=0)))  # min_kv 0: the op on every device
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", type=Path)
    ap.add_argument("--ctx", default="2048,4096,8192")
    ap.add_argument("--depths", default="0.1,0.5,0.9")
    ap.add_argument("--comp", default="0.5,0.25,0.125")
    ap.add_argument("--needles", type=int, default=3, help="needles (random numbers) per (context, depth)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--split", default=str(DEFAULT_SPLIT),
                    help="share(s) of c given to the r term, comma-separated (0.5 = even; see the docstring)")
    ap.add_argument("--mean-v", nargs="?", const="on", default="off", choices=("off", "on", "both"),
                    help="paper's mean-V blend (step 3): off (default), on (bare --mean-v), or both")
    ap.add_argument("--kt", default="k", help="transposed-K storage(s), comma-separated: k (f16, as the cache), q8_0")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--decode-threads", type=int, default=0,
                    help="threads for single-token decodes (default: --threads); 1 avoids stalls on a busy CPU")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()

    import llama_sparse

    ctxs = [int(x) for x in a.ctx.split(",")]
    depths = [float(x) for x in a.depths.split(",")]
    comps = [float(x) for x in a.comp.split(",")]
    splits = [float(x) for x in a.split.split(",")]
    mean_vs = {"off": [False], "on": [True], "both": [False, True]}[a.mean_v]
    kts = [x.strip() for x in a.kt.split(",")]
    if any(k not in KT_COST for k in kts):
        ap.error(f"--kt takes {', '.join(KT_COST)}")
    meta = {"model": str(a.model), "seed": a.seed, "needles": a.needles, "comp": comps, "split": splits,
            "mean_v": a.mean_v, "kt": kts, "argv": sys.argv[1:]}
    llm = llama_sparse.Llama(a.model, n_ctx=max(ctxs) + 128, n_batch=512,
                             n_threads=a.decode_threads or a.threads, n_threads_batch=a.threads, verbose=False)
    hay = llm.tokenize(haystack_text().encode(), add_bos=False)
    head = llm.tokenize((SYSTEM + USER).encode(), add_bos=False, special=True)
    question = llm.tokenize(QUESTION.encode(), add_bos=False, special=True)
    rng = random.Random(a.seed)
    rows = []
    t0 = time.time()

    def log(msg: str) -> None:
        print(f"[{time.time() - t0:7.1f}s] {msg}", flush=True)

    for n_ctx in ctxs:
        # one haystack per context; depths ascend, so each depth's prefix extends the cached one of the last
        n_needle = len(llm.tokenize(b" The special magic number is 99999. ", add_bos=False))
        n_hay = n_ctx - len(head) - n_needle - len(question) - 8
        body = hay[:n_hay]
        cached = None  # haystack tokens body[:cached] sit in the cache right after the head
        for depth in sorted(depths):
            numbers = [rng.randint(10000, 99999) for _ in range(a.needles)]
            needles = [llm.tokenize(f" The special magic number is {n}. ".encode(), add_bos=False) for n in numbers]
            assert all(len(t) == n_needle for t in needles), "needle token counts differ"
            cut = int(depth * n_hay)
            # don't split a sentence: move the needle back to just after a full stop (within 60 tokens)
            stops = [j for j in range(max(1, cut - 60), cut + 1) if llm.detokenize([body[j - 1]]).rstrip().endswith(b".")]
            cut = stops[-1] if stops else cut
            prefix = head + body[:cut]
            llm.set_sparq(None)
            if cached is None or cut < cached:
                llm.reset()
                llm.eval(prefix)  # dense, shared by the needles of this depth
            else:
                llm.n_tokens = len(head) + cached
                llm.eval(body[cached:cut])
            cached = cut
            for number, needle in zip(numbers, needles):
                llm.set_sparq(None)
                llm.n_tokens = len(prefix)
                llm.eval(needle + body[cut:])  # dense prefill of the rest of the haystack
                S = llm.n_tokens
                for name, f, sp in settings_for(S, comps, splits, mean_vs, kts):
                    llm.set_sparq(sp)
                    llm.n_tokens = S  # drop what the previous setting decoded
                    for t in question:  # decoded: SparQ reads the haystack here
                        llm.eval([t])
                    out = []
                    for _ in range(8):
                        tok = llm.sample(temp=0.0)
                        if tok == llm.token_eos() or llm.detokenize([tok]).strip() in (b"<|im_end|>",):
                            break
                        out.append(tok)
                        llm.eval([tok])
                    text = llm.detokenize(out).decode(errors="replace")
                    ok = str(number) in text.replace(",", "")
                    rows.append({"ctx": n_ctx, "S": S, "depth": depth, "setting": name, "number": number,
                                 "split": f, "r": sp.r if sp else None, "k": sp.k if sp else None,
                                 "mean_v": bool(sp and sp.mean_v), "kt": sp.kt if sp else None,
                                 "answer": text.strip(), "retrieved": ok})
                    log(f"ctx {n_ctx} S {S} depth {depth:.2f} {name:8s} r={rows[-1]['r']} k={rows[-1]['k']} "
                        f"{'OK ' if ok else 'MISS'} {text.strip()!r} (needle {number})")
                llm.set_sparq(None)
            if a.out:  # partial results survive a stopped run
                a.out.write_text(json.dumps({**meta, "rows": rows}, indent=1))

    names = ["dense"] + [n for n, *_ in setting_names(comps, splits, mean_vs, kts)]
    w = max(8, *map(len, names))
    print("\nretrieved (needles) per context and setting:")
    print(f"{'ctx':>6s} " + " ".join(f"{n:>{w}s}" for n in names))
    for n_ctx in ctxs:
        cells = []
        for n in names:
            sel = [r for r in rows if r["ctx"] == n_ctx and r["setting"] == n]
            cells.append(f"{sum(r['retrieved'] for r in sel)}/{len(sel)}")
        print(f"{n_ctx:6d} " + " ".join(f"{c:>{w}s}" for c in cells))
    dense = {(r["ctx"], r["depth"], r["number"]): r["retrieved"] for r in rows if r["setting"] == "dense"}
    sparse = [r for r in rows if r["setting"] != "dense"]
    agree = sum(r["retrieved"] == dense[(r["ctx"], r["depth"], r["number"])] for r in sparse)
    print(f"SparQ runs agreeing with dense: {agree}/{len(sparse)}")
    for n in names[1:]:
        sel = [r for r in rows if r["setting"] == n]
        both = sum(r["retrieved"] and dense[(r["ctx"], r["depth"], r["number"])] for r in sel)
        print(f"  {n:{w}s} retrieved {sum(r['retrieved'] for r in sel)}/{len(sel)}, "
              f"of dense's hits {both}/{sum(dense.values())}")
    if a.out:
        a.out.write_text(json.dumps({**meta, "rows": rows}, indent=1))
        print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
