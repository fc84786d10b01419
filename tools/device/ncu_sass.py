#!/usr/bin/env python3
"""Summarize an ncu per-instruction source export (`ncu -i REP --page source --csv --print-source sass`).

    ncu_sass.py CSV [--regions N] [--top N] [--barriers FROM]
    ncu_sass.py --raw RAW_CSV        (`--page raw --csv`: per-reason stall cycles per issued instruction, time)

Prints the stall-reason totals, then the warp stall samples and executed warp instructions per region of N
instructions (default 250), the top N instructions by samples (default 0: none), and with --barriers the stretches
between block barriers from instruction FROM on. Samples are per SM sub-partition, so a stretch that only some
blocks run (say block 0 of a cluster) weighs less per sample than one every block runs: compare stretches by
samples / (sub-partitions running them), not by raw counts.
"""
import argparse
import csv
import re
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


def load(path):
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    if len(rows) < 3:
        sys.exit(f"{path}: no instruction rows")
    hdr, data = rows[1], rows[2:]
    ix = {h: i for i, h in enumerate(hdr)}
    for need in ("Source", SAMPLES, EXECUTED):
        if need not in ix:
            sys.exit(f"{path}: no '{need}' column (export with --print-source sass)")
    reasons = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
    return data, ix, reasons


def num(row, ix, col):
    v = row[ix[col]]
    return int(v) if v and v not in ("-",) else 0


def reason_line(rows, ix, reasons, top=4):
    tot = {r: sum(num(x, ix, r) for x in rows) for r in reasons}
    return " ".join(f"{k[6:]}:{v}" for k, v in sorted(tot.items(), key=lambda kv: -kv[1])[:top] if v)


RAW_KEEP = ("gpu__time_duration.sum", "launch__registers_per_thread", "smsp__inst_executed.sum")


def print_raw(path):
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    if len(rows) < 3:
        sys.exit(f"{path}: no metric rows")
    for name, unit, value in sorted(zip(rows[0], rows[1], rows[2])):
        if ("issue_stalled" in name and name.endswith("per_issue_active.ratio")) or name in RAW_KEEP:
            print(f"  {name:90s} {value} {unit}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("--regions", type=int, default=250)
    ap.add_argument("--top", type=int, default=0)
    ap.add_argument("--barriers", type=int, default=None)
    ap.add_argument("--raw", action="store_true", help="CSV is a raw-page export")
    args = ap.parse_args()
    if args.raw:
        print_raw(args.csv)
        return

    data, ix, reasons = load(args.csv)
    total = sum(num(r, ix, SAMPLES) for r in data)
    print(f"{len(data)} instructions, {total} samples")
    tot = {r: sum(num(x, ix, r) for x in data) for r in reasons}
    print(" ".join(f"{k[6:]}={v * 100 / max(total, 1):.1f}%" for k, v in sorted(tot.items(), key=lambda kv: -kv[1]) if v))

    print(f"\nregions of {args.regions} instructions:")
    for a in range(0, len(data), args.regions):
        seg = data[a:a + args.regions]
        s = sum(num(r, ix, SAMPLES) for r in seg)
        ex = sum(num(r, ix, EXECUTED) for r in seg)
        if s or ex:
            print(f"  {a:5d}-{a + len(seg) - 1:5d} samples {s:4d} ({s * 100 / max(total, 1):5.1f}%) "
                  f"warp-inst {ex:8d}  {reason_line(seg, ix, reasons)}")

    if args.barriers is not None:
        print(f"\nstretches between barriers from instruction {args.barriers}:")
        start = args.barriers
        for i in range(args.barriers, len(data)):
            src = data[i][ix["Source"]].strip()
            if re.match(r"(@!?U?P\w+\s+)?(BAR\.|EXIT|UCGABAR|RET)", src) or i == len(data) - 1:
                seg = data[start:i + 1]
                s = sum(num(r, ix, SAMPLES) for r in seg)
                ex = sum(num(r, ix, EXECUTED) for r in seg)
                if s or ex:
                    print(f"  {start:5d}-{i:5d} samples {s:4d} warp-inst {ex:8d}  ends {src[:40]:40s} "
                          f"{reason_line(seg, ix, reasons, 3)}")
                start = i + 1

    if args.top:
        print(f"\ntop {args.top} instructions by samples:")
        order = sorted(range(len(data)), key=lambda i: -num(data[i], ix, SAMPLES))[:args.top]
        for i in sorted(order):
            r = data[i]
            print(f"  {i:5d} {num(r, ix, SAMPLES) * 100 / max(total, 1):5.2f}% ex={num(r, ix, EXECUTED):7d} "
                  f"{r[ix['Source']].strip()[:60]:60s} {reason_line([r], ix, reasons, 3)}")


if __name__ == "__main__":
    main()
