#!/usr/bin/env python3
"""Join `test_zz_cuda bytes` launch lines with ncu's CSV (--csv --log-file, one row per kernel and metric).

    python3 bench/ncu_bytes.py PROGRAM_STDOUT NCU_CSV

Prints per launch: mode, shape, sparsity, the active columns' weight bytes, DRAM bytes read, their ratio (1.0 = no
over-fetch), the bytes the SMs asked L2 for, and the kernel's time under ncu (caches flushed, no graph).
"""
import csv
import sys


def main():
    if len(sys.argv) != 3:
        print(__doc__.strip())
        return 2
    launches = []
    for line in open(sys.argv[1], errors="replace"):
        if line.startswith("bytes: "):
            k, mode, shape, sp, useful = line.split()[1:6]
            launches.append((int(k), mode, shape, float(sp), float(useful)))
    rows = {}
    order = []
    text = open(sys.argv[2], errors="replace").read().splitlines()
    start = next((i for i, l in enumerate(text) if l.startswith('"ID"')), None)
    if start is None:
        print("ncu_bytes: no CSV header in %s" % sys.argv[2])
        return 1
    for r in csv.DictReader(text[start:]):
        kid = r["ID"]
        if kid not in rows:
            rows[kid] = {}
            order.append(kid)
        rows[kid][r["Metric Name"]] = (float(r["Metric Value"].replace(",", "")), r["Metric Unit"])
    if len(order) != len(launches):
        print("ncu_bytes: %d profiled kernels for %d launches; joined in order up to the shorter" % (len(order), len(launches)))

    def val(m, name, unit_scale):
        v, unit = m.get(name, (float("nan"), ""))
        return v * unit_scale.get(unit, 1.0)

    scale = {"byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "KB": 1e3, "MB": 1e6, "GB": 1e9}
    tscale = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "ns": 1e-3, "us": 1.0, "ms": 1e3}
    print("%-6s %-11s %5s | %9s %9s %6s | %9s %6s | %8s" % ("mode", "m x n", "sp%", "useful MB", "DRAM MB", "ratio",
                                                          "L2 req MB", "ratio", "time us"))
    for (k, mode, shape, sp, useful), kid in zip(launches, order):
        m = rows[kid]
        dram = val(m, "dram__bytes_read.sum", scale)
        req = val(m, "lts__t_sectors_srcunit_tex_op_read.sum", {"sector": 32.0})
        t = val(m, "gpu__time_duration.sum", tscale)
        print("%-6s %-11s %5.0f | %9.2f %9.2f %6.3f | %9.2f %6.3f | %8.2f" % (
            mode, shape, 100 * sp, useful / 1e6, dram / 1e6, dram / useful if useful else float("nan"),
            req / 1e6, req / useful if useful else float("nan"), t))
    return 0


if __name__ == "__main__":
    sys.exit(main())
