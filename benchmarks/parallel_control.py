"""How far two threads can scale on this machine right now: perfectly parallel controls (GIL-free torch ops,
one intra-op thread each), each one's 2-thread over 1-thread rate. On a machine shared between sessions the
kernel's autogroup scheduler shares the CPU per session, not per thread, so a Loader's 2-thread scaling means
something only beside these numbers measured in the same minutes. Three controls, because one is blind to what
the others see: ``mm`` (torch.mm of 192 x 192: compute-bound, in a core's cache), ``stream`` (torch.add over
64 MB tensors: bound by memory bandwidth, which two cores share) and ``cache`` (torch.add over 256 KB tensors:
in each core's own L2). A Loader that scales like ``mm`` and ``cache`` but not like ``stream`` is
bandwidth-bound; one that scales worse than all three loses its second thread to something of its own (the
GIL, locks, the handoff)."""
from __future__ import annotations

import threading
import time

KINDS = {"mm": 0, "stream": 16 << 20, "cache": 64 << 10}  # (float32 elements of each add operand)


def rate(threads: int, seconds: float = 1.0, kind: str = "mm") -> float:
    """Calls per second of ``threads`` threads together, each calling the ``kind`` op."""
    import torch

    counts = []
    start = threading.Barrier(threads)  # every thread's clock starts together, after all have set up (the
    # stream control's 64 MB operands take long to make: staggered, each thread ran mostly alone)

    def work():
        torch.set_num_threads(1)
        if kind == "mm":
            a, out = torch.randn(192, 192), torch.empty(192, 192)
            op = lambda: torch.mm(a, a, out=out)  # noqa: E731
        else:
            n = KINDS[kind]
            a, b, out = torch.rand(n), torch.rand(n), torch.empty(n)
            op = lambda: torch.add(a, b, out=out)  # noqa: E731
        op()  # (pages faulted in before the clock starts)
        start.wait()
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            op()
            n += 1
        counts.append(n / (time.perf_counter() - t0))
    ths = [threading.Thread(target=work) for _ in range(threads)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    return sum(counts)


def scaling(kind: str = "mm") -> float:
    """The ``kind`` control's 2-thread rate over its 1-thread rate (2.0: two free cores)."""
    one = rate(1, kind=kind)
    return rate(2, kind=kind) / one


def scalings() -> dict[str, float]:
    """:func:`scaling` of every control, one after another."""
    return {kind: scaling(kind) for kind in KINDS}


if __name__ == "__main__":
    print("parallel controls, 2 threads over 1: " + ", ".join(f"{k} x{v:.2f}" for k, v in scalings().items()))
