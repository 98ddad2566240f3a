"""Progress bars for long runs (compile, upload, cache warm, load to RAM): tqdm's bar on a terminal; where the
stream is not a terminal (a log file, a pipe, a CI job) a plain line now and then instead, never tqdm's
``\\r`` frames, which a log shows as one endless line of overwritten bars. Imports nothing of dsc.
"""
from __future__ import annotations

import sys
import threading

PLAIN_EVERY = 30.0  # seconds between two plain progress lines (and one at the start and one at the end)
PLAIN_FORMAT = "{desc}: {n_fmt}/{total_fmt} {unit} ({percentage:.0f}%), {elapsed} elapsed, {remaining} left{postfix}"


class _Lines:
    """A stream that takes tqdm's frames (``\\r`` + the bar, padded) and writes each as one plain line."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, s: str) -> None:
        s = s.replace("\r", "").strip()
        if s:
            self.stream.write(s + "\n")

    def flush(self) -> None:
        self.stream.flush()


def _is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # (no isatty, or closed)
        return False


_BAR = None


def _bar_class():
    """tqdm with a write lock of its own that only this process's threads take. tqdm's default lock adds a
    process-shared semaphore, inherited by every forked child (compile pools, crash tests): a child killed while
    holding it (it takes it even to forget an inherited bar) leaves it held for good, and the next bar of the
    parent, even a disabled one, waits forever. dsc's bars are only ever written by the process that made them."""
    global _BAR
    if _BAR is None:
        from tqdm import tqdm

        class Bar(tqdm):
            pass

        Bar.set_lock(threading.RLock())
        _BAR = Bar
    return _BAR


def progress_bar(*, disable: bool = False, file=None, **kwargs):
    """A ``tqdm`` bar (same arguments) writing to ``file`` (default: stderr): the bar itself on a terminal,
    plain lines every :data:`PLAIN_EVERY` seconds elsewhere."""
    tqdm = _bar_class()
    stream = sys.stderr if file is None else file
    if disable or _is_terminal(stream):
        return tqdm(disable=disable, file=stream, **kwargs)
    kwargs.pop("dynamic_ncols", None)  # (no terminal to measure)
    return tqdm(file=_Lines(stream), mininterval=PLAIN_EVERY, ascii=True, bar_format=PLAIN_FORMAT, **kwargs)
