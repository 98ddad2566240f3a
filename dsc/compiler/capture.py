"""What decoding one input says, caught and kept with the input's name.

Pillow reports some damage as Python warnings (``Corrupt EXIF data``, ``Truncated File Read`` as a
warning, ...), and the C libraries under it write straight to the process's stderr (libtiff's errors:
``ZIPDecode: Decoding error at scanline 0``; libjpeg's corrupt-data notes). Left alone, both reach the
terminal without saying which file they are about, interleaved from every worker. ``captured(into)``
collects both while its block runs: the warnings Python's filters let through (each block clears the
once-per-location memory, so a second file's warning is not hidden by the first's), and what is written
to file descriptor 2, redirected meanwhile into a temporary file of this process. The caller attaches
the lines to the input: a compiled input's become the compile report's warnings, a skipped input's join
its reason.

Both are process-wide, so a block holds :data:`LOCK`, which Pillow's settings (``decode.pil_rules``)
share: in one process, inputs are decoded one at a time. dsc's compile workers are processes (one
decode at a time each anyway); a Dask worker running several threads decodes one input at a time per
process (its resizes still run in parallel).
"""
from __future__ import annotations

import os
import sys
import tempfile
import threading
import warnings
from contextlib import contextmanager

LOCK = threading.RLock()
MAX_LINES = 8  # kept per input; more are counted
_sink: tuple[int, object] | None = None  # (pid, temporary file) receiving fd 2 during a block


def _sink_file():
    """This process's capture file (a forked worker makes its own: the parent's offset is shared)."""
    global _sink
    if _sink is None or _sink[0] != os.getpid():
        _sink = (os.getpid(), tempfile.TemporaryFile())
    return _sink[1]


@contextmanager
def _stderr_to(f):
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):  # no fd 2 (a daemon), or a stderr that is not a file
        yield False
        return
    f.seek(0)
    f.truncate()
    os.dup2(f.fileno(), 2)
    try:
        yield True
    finally:
        try:
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        os.dup2(saved, 2)
        os.close(saved)


@contextmanager
def captured(into: list[str]):
    """Run the block with Python warnings and fd 2 captured; append what they said to ``into``, one line
    each, duplicates dropped, at most :data:`MAX_LINES` (then a count of the rest). Not nested."""
    with LOCK:
        f = _sink_file()
        caught, redirected = [], False
        try:
            with warnings.catch_warnings(record=True) as caught, _stderr_to(f) as redirected:
                yield
        finally:
            lines = [f"{w.category.__name__}: {w.message}" for w in caught]
            if redirected:
                f.seek(0)
                lines += f.read(64 << 10).decode("utf-8", "replace").splitlines()
            into.extend(_tidy(lines))


def _tidy(lines: list[str]) -> list[str]:
    seen: dict[str, None] = {}
    for line in lines:
        line = " ".join(line.split())
        if line:
            seen.setdefault(line)
    kept = list(seen)
    if len(kept) > MAX_LINES:
        kept = kept[:MAX_LINES] + [f"... and {len(kept) - MAX_LINES} more messages"]
    return kept
