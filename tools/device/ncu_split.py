#!/usr/bin/env python3
"""Summarise tools/device/device.sh ncu-split: the direct-GEMV launches in order, grouped into runs of one kernel
variant (template arguments: T, mode (0 dense, 1 idx, 3 fused), ...); per run the median time, DRAM bytes read and
L2 read sectors from the L1s, for the row layout (first CSV) and the split layout (second), side by side."""
import csv
import gzip
import statistics
import sys


def load(path):
    launches = {}
    with gzip.open(path, 'rt') as f:
        lines = [l for l in f if l.startswith('"')]
    for r in csv.DictReader(lines):
        name = r['Kernel Name']
        e = launches.setdefault(int(r['ID']), {'key': name[name.find('<'):name.find('>') + 1] + ' ' + r['Grid Size']})
        e[r['Metric Name']] = float(r['Metric Value'].replace(',', ''))
    rows = {}
    run, prev = -1, None
    for i in sorted(launches):
        if launches[i]['key'] != prev:
            run, prev = run + 1, launches[i]['key']
        rows.setdefault((run, prev), {})[i] = launches[i]
    out = {}
    for key, launches in rows.items():
        med = {}
        for m in ('gpu__time_duration.sum', 'dram__bytes_read.sum', 'lts__t_sectors_srcunit_tex_op_read.sum'):
            vals = [l[m] for l in launches.values() if m in l]
            med[m] = statistics.median(vals) if vals else float('nan')
        out[key] = (len(launches), med)
    return out


def main():
    a, b = load(sys.argv[1]), load(sys.argv[2])
    print(f"{'run':>3s} {'kernel <T, mode, V, ...> grid':42s} | {'n':>3s} {'us':>7s} {'DRAM MB':>8s} {'L2 sect M':>9s} | "
          f"{'n':>3s} {'us':>7s} {'DRAM MB':>8s} {'L2 sect M':>9s}   (row | split)")
    for key in sorted(set(a) | set(b)):
        cells = []
        for d in (a, b):
            if key in d:
                n, m = d[key]
                cells.append(f"{n:3d} {m['gpu__time_duration.sum'] / 1e3:7.2f} {m['dram__bytes_read.sum'] / 1e6:8.2f} "
                             f"{m['lts__t_sectors_srcunit_tex_op_read.sum'] / 1e6:9.3f}")
            else:
                cells.append(f"{'':3s} {'':7s} {'':8s} {'':9s}")
        print(f"{key[0]:3d} {key[1]:42s} | {cells[0]} | {cells[1]}")


if __name__ == '__main__':
    main()
