"""Progress of long work (convert, calibrate): a tqdm bar on a TTY, else one log line per 10 %, so CI logs stay short."""
from __future__ import annotations

import sys
import time
from typing import Callable


def _scaled(x: float, unit: str) -> str:
    """x in unit, 3 digits; bytes in binary prefixes (KiB .. TiB)."""
    prefix = ""
    if unit == "B":
        for prefix in ("", "Ki", "Mi", "Gi", "Ti"):
            if x < 1024 or prefix == "Ti":
                break
            x /= 1024
    return f"{x:.3g} {prefix}{unit}"


class Progress:
    """`update(n)` after each piece of work, `close()` at the end; `unit="B"` shows bytes in KiB/MiB/GiB."""

    def __init__(self, total: int, desc: str, enabled: bool, log: Callable[[str], None], unit: str = "tok") -> None:
        self.total, self.desc, self.log, self.unit = max(1, total), desc, log, unit
        self.done, self.next_pct, self.enabled, self.bar = 0, 10, enabled, None
        self.start = time.perf_counter()
        if enabled and sys.stderr.isatty():
            from tqdm import tqdm
            self.bar = tqdm(total=total, desc=desc, unit=unit, unit_scale=unit == "B", unit_divisor=1024, leave=False)

    def update(self, n: int) -> None:
        self.done += n
        if self.bar is not None:
            self.bar.update(n)
        elif self.enabled:
            pct = 100 * self.done // self.total
            if pct >= self.next_pct:
                rate = self.done / max(1e-9, time.perf_counter() - self.start)
                if self.unit == "B":
                    done = f"{_scaled(self.done, 'B')} of {_scaled(self.total, 'B')}"
                else:
                    done = f"{self.done}/{self.total} {self.unit}"
                self.log(f"{self.desc}: {pct}% ({done}, {_scaled(rate, self.unit)}/s)")
                self.next_pct = (pct // 10 + 1) * 10

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
