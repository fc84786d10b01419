"""Holding Ctrl-C and SIGTERM off while a temp file is made or removed."""
from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator

_HELD = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def held() -> Iterator[None]:
    """Within the block, SIGINT and SIGTERM are noted, not acted on; the first one noted is raised at its end by
    the handler in place before (Python's KeyboardInterrupt, or the CLI's SIGTERM handler). Outside the main
    thread, where handlers cannot be set, it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    saved = {s: signal.getsignal(s) for s in _HELD}
    for s in _HELD:
        signal.signal(s, lambda signum, frame: pending.append(signum))
    try:
        yield
    finally:
        for s, h in saved.items():
            signal.signal(s, h)
    if pending:
        h = saved[pending[0]]
        if callable(h):
            h(pending[0], None)
        elif h == signal.SIG_DFL and pending[0] == signal.SIGINT:
            raise KeyboardInterrupt


def discard(writer, tmp) -> None:
    """After a failed or interrupted write: close the GGUF writer (if any) and remove the temp file (if any), with
    Ctrl-C held off so that a second one cannot leave the file behind."""
    with held():
        if writer is not None:
            try:
                writer.close()
            except OSError:
                pass
        if tmp is not None:
            tmp.unlink(missing_ok=True)
