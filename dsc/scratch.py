"""This thread's work buffers, kept and reused call after call (one pool per thread, for every layer; a Loader's
filler threads adopt the pools its ring keeps, so their buffers live as long as the Loader, until its close()): a
buffer's pages are faulted in once, not every batch, and a freed large buffer is not a TLB shootdown on the
other filler thread's core. Only for temporaries whose contents the caller overwrites and does not hand out
beyond its next use of the same name. Imports nothing of dsc (numpy and torch only where asked for)."""
from __future__ import annotations

import math
import threading

import numpy as np

_LOCAL = threading.local()
ALIGN = 64


def scratch_bytes(name: str, n: int, grow: float = 1.0, local: threading.local | None = None) -> np.ndarray:
    """This thread's uint8 buffer ``name``, ``n`` bytes long (its first ``n``), starting on a 64-byte boundary:
    kept, and replaced by a larger one (``grow`` times the old size at least: fewer regrowths where sizes creep
    up) when ``n`` exceeds it. ``local``: a pool of the caller's own (a ``threading.local`` whose buffers go with
    the object holding it) instead of this module's, which lives as long as the thread (or, in a Loader's filler
thread, as long as the Loader: :func:`adopt`)."""
    pool = (_LOCAL if local is None else local).__dict__.setdefault("pool", {})  # (adopt() may set it)
    buf = pool.get(name)
    if buf is None or len(buf) < n:
        size = max(n, int(len(buf) * grow) if buf is not None else n)
        _MADE[0] += 1  # (threads racing here can only miscount: the count is for tests)
        raw = np.empty(size + ALIGN, np.uint8)  # (numpy's large blocks start 16 bytes into a page: aligned here
        start = -raw.ctypes.data % ALIGN  # to a cache line, as torch's own allocations are, for vector loads)
        buf = pool[name] = raw[start:start + size]
    return buf[:n]


def adopt(pool: dict) -> None:
    """Make ``pool`` (a dict the caller keeps) this thread's pool. A Loader's filler threads are made anew each
    epoch: each takes the pool its predecessor filled (the ring keeps one per filler), so an epoch's first
    batches find their buffers there instead of making and faulting in new ones."""
    _LOCAL.pool = pool


def made() -> int:
    """How many buffers :func:`scratch_bytes` has made, every thread and pool together (a count for tests)."""
    return _MADE[0]


_MADE = [0]


def scratch_tensor(name: str, shape, dtype):
    """A CPU torch tensor of ``shape`` and ``dtype`` over this thread's buffer ``name`` (:func:`scratch_bytes`;
    one buffer per name and dtype)."""
    import torch

    n = math.prod(shape)
    itemsize = torch.empty((), dtype=dtype).element_size()
    buf = scratch_bytes(f"{name}:{dtype}", n * itemsize)
    return torch.from_numpy(buf).view(dtype).view(shape)
