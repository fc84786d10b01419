#!/usr/bin/env python3
"""Device time per decode token by kernel, from `ncu --csv --metrics gpu__time_duration.sum --log-file F`.

    ncu_decode_split.py CSV[.gz] --tokens N [--label L] [--top K]

Kernels are grouped by their name up to the first '<' or '(' (template arguments dropped); times are summed
and divided by the number of decode tokens profiled (llama-bench -p 0 -n 4 runs 1 warm-up + 4).
"""
import argparse
import csv
import gzip
import re
import sys
from collections import defaultdict


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--tokens", type=int, required=True)
    ap.add_argument("--label", default="")
    ap.add_argument("--top", type=int, default=14)
    a = ap.parse_args()
    opener = gzip.open if a.csv.endswith(".gz") else open
    with opener(a.csv, "rt", newline="", errors="replace") as f:
        lines = [ln for ln in f if ln.startswith('"')]
    rows = list(csv.DictReader(lines))
    if not rows:
        sys.exit(f"{a.csv}: no ncu rows")
    tot = defaultdict(float)
    cnt = defaultdict(int)
    for r in rows:
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        name = re.split(r"[<(]", r["Kernel Name"].strip())[0].replace("void ", "").strip()
        v = float(r["Metric Value"].replace(",", ""))
        unit = r.get("Metric Unit", "nsecond")
        v *= {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3}.get(unit, 1e-3)
        tot[name] += v
        cnt[name] += 1
    all_us = sum(tot.values()) / a.tokens
    n_k = sum(cnt.values()) / a.tokens
    print(f"== {a.label}: {all_us:.1f} us device time per token over {n_k:.0f} kernels")
    for name, v in sorted(tot.items(), key=lambda kv: -kv[1])[: a.top]:
        print(f"  {v / a.tokens:9.1f} us {100 * v / a.tokens / all_us:5.1f} %  {cnt[name] / a.tokens:6.1f}/tok  {name}")


if __name__ == "__main__":
    main()
