"""Holding Ctrl-C and SIGTERM off while a temp file is made or removed."""
from __future__ import annotations

import contextlib
import os
import signal
import tempfile
import threading
from pathlib import Path
from typing import Iterator, Type

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


def temp_beside(out: Path, suffix: str, error: Type[Exception], plain_mode: bool = False) -> Path:
    """A new temp file beside out, made with Ctrl-C held off so that it is never made and then lost; error (with a
    message naming -o) where the folder refuses it. plain_mode: the mode a plain open() would give (mkstemp's is
    0600)."""
    with held():
        try:
            fd, name = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=suffix)
        except OSError as exc:
            raise error(f"cannot create a temp file in {out.parent}: {exc.strerror}; pass a writable -o path") from exc
        os.close(fd)
        if plain_mode:
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(name, 0o666 & ~umask)
    return Path(name)


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
