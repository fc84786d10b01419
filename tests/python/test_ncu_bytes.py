"""bench/ncu_bytes.py joins test_zz_cuda's launch lines with ncu's CSV (the device's DRAM-bytes step)."""
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "ncu_bytes.py"

HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
          '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"')


def row(kid, metric, unit, value):
    return (f'"{kid}","1","t","h","mul_mat_zz_gemv_q4_K_direct<1>","1","13","(128, 1, 1)","(4, 112, 1)","0","9.0",'
            f'"Command line profiler metrics","{metric}","{unit}","{value}"')


def run(tmp_path, launches, csv_lines):
    out = tmp_path / "prog.out"
    csv = tmp_path / "ncu.csv"
    out.write_text("device X; L2 fetch granularity limit 64 bytes\n" + "".join(launches))
    csv.write_text("==PROF== Connected to process 1\n" + "\n".join(csv_lines) + "\n")
    return subprocess.run([sys.executable, str(SCRIPT), str(out), str(csv)], capture_output=True, text=True)


def test_ratios_and_units(tmp_path):
    launches = ["bytes: 0 dense 4096x4096 0.00 9437184\n", "bytes: 1 idx 4096x4096 0.50 4718592\n"]
    csv = [HEADER,
           row(0, "dram__bytes_read.sum", "Mbyte", "9.44"),
           row(0, "gpu__time_duration.sum", "usecond", "10.5"),
           row(0, "lts__t_sectors_srcunit_tex_op_read.sum", "sector", "294,912"),
           row(1, "dram__bytes_read.sum", "Kbyte", "5,520.75"),
           row(1, "gpu__time_duration.sum", "nsecond", "9,800"),
           row(1, "lts__t_sectors_srcunit_tex_op_read.sum", "sector", "160,000")]
    r = run(tmp_path, launches, csv)
    assert r.returncode == 0, r.stderr
    lines = [l.split() for l in r.stdout.splitlines() if l.startswith(("dense", "idx"))]
    assert len(lines) == 2
    # mode, shape, sp | useful MB, DRAM MB, ratio | L2 MB, ratio | time
    assert lines[0][0] == "dense" and float(lines[0][5]) == 9.44 and abs(float(lines[0][6]) - 1.000) < 1e-3
    assert float(lines[0][8]) == 9.44 and float(lines[0][11]) == 10.5
    assert lines[1][0] == "idx" and abs(float(lines[1][6]) - 5520.75e3 / 4718592) < 1e-3
    assert abs(float(lines[1][11]) - 9.8) < 1e-9


def test_mismatch_and_missing_header(tmp_path):
    launches = ["bytes: 0 dense 4096x4096 0.00 9437184\n", "bytes: 1 idx 4096x4096 0.50 4718592\n"]
    r = run(tmp_path, launches, [HEADER, row(0, "dram__bytes_read.sum", "byte", "9437184")])
    assert r.returncode == 0
    assert "1 profiled kernels for 2 launches" in r.stdout
    r = run(tmp_path, launches, ["no csv here"])
    assert r.returncode == 1 and "no CSV header" in r.stdout
