"""Developer tools that run without a model: tools/device/ncu_sass.py on a synthetic ncu source export."""
import csv
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NCU_SASS = ROOT / "tools" / "device" / "ncu_sass.py"

HEADER = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed",
          "stall_barrier", "stall_long_sb", "stall_no_inst", "stall_long_sb (Not Issued)"]


def write_export(path, rows):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["Kernel Name", "void k(int)"])
        w.writerow(HEADER)
        for r in rows:
            w.writerow(r)


def run(*args):
    return subprocess.run([sys.executable, str(NCU_SASS), *map(str, args)], capture_output=True, text=True)


def test_ncu_sass_totals_regions_barriers(tmp_path):
    rows = [
        ["0x0", "LDG.E R2, desc[UR4][R2.64]", "6", "64", "0", "6", "0", "6"],
        ["0x10", "FFMA R4, R2, R2, R4", "2", "64", "0", "0", "2", "0"],
        ["0x20", "BAR.SYNC.DEFER_BLOCKING 0x0", "4", "64", "4", "0", "0", "0"],
        ["0x30", "@P0 EXIT", "0", "8", "0", "0", "0", "0"],
        ["0x40", "STG.E desc[UR4][R6.64], R4", "8", "8", "0", "0", "8", "0"],
        ["0x50", "EXIT", "0", "8", "-", "-", "-", "-"],
    ]
    csv_path = tmp_path / "k-src-sass.csv"
    write_export(csv_path, rows)
    r = run(csv_path, "--regions", "3", "--barriers", "0", "--top", "2")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "6 instructions, 20 samples" in out
    # reason shares of all samples; "Not Issued" columns are not reasons of their own
    assert "no_inst=50.0%" in out and "long_sb=30.0%" in out and "barrier=20.0%" in out
    assert "Not Issued" not in out
    # two regions of 3: 12 and 8 samples, 192 and 24 warp instructions
    assert "0-    2 samples   12 ( 60.0%) warp-inst      192" in out
    assert "3-    5 samples    8 ( 40.0%) warp-inst       24" in out
    # stretches end at the barrier and at each exit
    assert "0-    2 samples   12 warp-inst      192  ends BAR.SYNC" in out
    assert "4-    5 samples    8 warp-inst       16  ends EXIT" in out
    # the two instructions with the most samples, in address order
    top = out.split("top 2 instructions by samples:")[1]
    assert top.index("LDG.E") < top.index("STG.E") and "FFMA" not in top


def test_ncu_sass_rejects_other_exports(tmp_path):
    csv_path = tmp_path / "raw.csv"
    csv_path.write_text('"ID","Kernel Name"\n"","" \n"0","k"\n')
    r = run(csv_path)
    assert r.returncode != 0
    assert "no 'Source' column" in r.stderr
