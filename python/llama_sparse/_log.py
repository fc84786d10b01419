"""Why a load or a context failed, from llama.cpp's own error log lines.

llama-cpp-python raises a bare "Failed to load model from file" / "Failed to create llama_context", and
unless verbose it sends the native log to /dev/null while it loads, so the reason (a truncated file, a zigzag
format version, a bad LLAMA_SPARQ, memory) never reached the user. This wraps llama-cpp-python's log callback:
every line still goes there, and error lines are also kept for `reason_since`.
"""
from __future__ import annotations

import atexit
import collections
import contextlib
import ctypes
import itertools
import re
import threading
from typing import Optional

import llama_cpp
from llama_cpp import _logger

_ERROR, _CONT = 4, 5  # enum ggml_log_level of upstream 0c1e570 (llama-cpp-python's _logger still has 3 for ERROR)

_lock = threading.Lock()
_seq = itertools.count(1)
_kept: collections.deque = collections.deque(maxlen=64)  # (seq, message) of error-level lines
_last_error = False
_installed = False
_quiet = 0  # > 0: nothing is printed (the error lines are still kept)


@llama_cpp.llama_log_callback
def _callback(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    global _last_error
    try:
        msg = text.decode("utf-8", "replace")
        with _lock:
            if level == _ERROR:
                _kept.append((next(_seq), msg))
            elif level == _CONT and _last_error and _kept:
                seq, prev = _kept.pop()
                _kept.append((seq, prev + msg))
            if level != _CONT:
                _last_error = level == _ERROR
    finally:
        if not _quiet:
            _logger.llama_log_callback(level, text, user_data)


@contextlib.contextmanager
def quiet(on: bool = True):
    """Print none of the native log inside (llama.cpp's load log is thousands of lines); `reason_since` still
    sees the error lines, so a failure can say why."""
    global _quiet
    install()
    _quiet += bool(on)
    try:
        yield
    finally:
        _quiet -= bool(on)


def install() -> None:
    """Put the wrapper in front of llama-cpp-python's callback (once)."""
    global _installed
    if not _installed:
        llama_cpp.llama_log_set(_callback, ctypes.c_void_p(0))
        # models freed during interpreter teardown still log: by then this module may be gone, so hand the log
        # back to llama-cpp-python's callback (as before install) at exit (a server segfaulted on SIGINT without it)
        atexit.register(llama_cpp.llama_log_set, _logger.llama_log_callback, ctypes.c_void_p(0))
        _installed = True


def mark() -> int:
    """A point in the log; `reason_since(mark())` sees only the error lines logged after it."""
    with _lock:
        return _kept[-1][0] if _kept else 0


# the wrappers' lines that only say "failed", and where the real reason follows
_GENERIC = re.compile(r"failed to load model( from .*)?$|failed to create context.*$", re.IGNORECASE)
_CAUSE = re.compile(r"(?:error loading model|failed to initialize the context|failed to load model): (.+)$")


def _strip(line: str) -> str:
    line = line.strip()
    # "func_name: message" -> "message" (llama.cpp prefixes __func__)
    m = re.match(r"^[A-Za-z_][A-Za-z0-9_:]*: (.+)$", line)
    return m.group(1) if m else line


def reason_since(start: int) -> Optional[str]:
    """The error lines logged after `start` as one sentence: the cause the loader or the context reported,
    then the most specific earlier line (e.g. gguf's or the allocator's) in parentheses; None if there is none."""
    with _lock:
        lines = [m for s, m in _kept if s > start]
    causes, details = [], []
    for raw in lines:
        for line in raw.splitlines():
            line = line.strip()
            if not line:
                continue
            m = _CAUSE.search(line)
            text = _strip(m.group(1)) if m else _strip(line)
            if not text or _GENERIC.fullmatch(text):
                continue
            (causes if m else details).append(text)
    if not causes and not details:
        return None
    main = causes[0] if causes else details[0]
    rest = [d for d in details if d != main and d not in main]
    return main + (f" ({rest[0]})" if rest else "")
