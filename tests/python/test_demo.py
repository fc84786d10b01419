"""The README's main job, end to end on the CPU: convert, calibrate, answer densely and at 50%."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path


def test_demo_end_to_end(tmp_path: Path):
    env = dict(os.environ, LLAMA_SPARSE_CACHE=str(tmp_path))  # a fresh cache: nothing reused
    r = subprocess.run([sys.executable, "-m", "llama_sparse", "demo", "-n", "24"], capture_output=True, text=True,
                       env=env, timeout=1800)
    out = r.stdout
    assert r.returncode == 0, out[-3000:] + r.stderr[-3000:]
    assert "[1/4] converting" in out and "[2/4] calibrating" in out
    assert (tmp_path / "models" / "SmolLM2-135M-Instruct.zz-q4_k.calib.gguf").exists()
    dense = re.search(r"\[3/4\] dense: (.*?)\n\s+(\d+) tokens, ([0-9.]+) tok/s", out, re.S)
    sparse = re.search(r"\[4/4\] 0\.50: (.*?)\n\s+(\d+) tokens, ([0-9.]+) tok/s, (\d+)% of columns skipped", out, re.S)
    assert dense and sparse, out[-3000:]
    assert dense.group(1).strip() and sparse.group(1).strip()
    assert float(dense.group(3)) > 0 and float(sparse.group(3)) > 0
    assert 30 <= int(sparse.group(4)) <= 75  # calibrated for 50%, measured by the runtime's counters
    # the ratio comes from a fixed number of timed decode steps per level, not from the answers' few tokens
    timed = re.findall(r"; (\d+) more timed: ([0-9.]+) tok/s", out)
    assert len(timed) == 2 and all(float(t) > 0 for _, t in timed), out[-3000:]
    ratio = re.search(r"speed ratio, 50% sparse / dense: ([0-9.]+)x \(decode, (\d+) tokens each\)", out)
    assert ratio and ratio.group(2) == timed[0][0], out[-3000:]
    assert abs(float(ratio.group(1)) - float(timed[1][1]) / float(timed[0][1])) < 0.01
    # a second run reuses the cached files
    r2 = subprocess.run([sys.executable, "-m", "llama_sparse", "demo", "-n", "4"], capture_output=True, text=True,
                        env=env, timeout=600)
    assert r2.returncode == 0 and "[1/4] reusing" in r2.stdout and "[2/4] reusing" in r2.stdout, r2.stdout[-2000:]
