"""How far two threads can scale on this machine right now: a perfectly parallel control (GIL-free torch.mm,
one intra-op thread each), its 2-thread over 1-thread rate. On a machine shared between sessions the kernel's
autogroup scheduler shares the CPU per session, not per thread, so a Loader's 2-thread scaling means something
only beside this number measured in the same minutes."""
from __future__ import annotations

import threading
import time


def rate(threads: int, seconds: float = 1.0) -> float:
    """torch.mm calls per second of ``threads`` threads together."""
    import torch

    a = torch.randn(192, 192)
    counts = []

    def work():
        torch.set_num_threads(1)
        out, n, t0 = torch.empty(192, 192), 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            torch.mm(a, a, out=out)
            n += 1
        counts.append(n)
    ths = [threading.Thread(target=work) for _ in range(threads)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    return sum(counts) / seconds


def scaling() -> float:
    """The control's 2-thread rate over its 1-thread rate (2.0: two free cores)."""
    one = rate(1)
    return rate(2) / one


if __name__ == "__main__":
    print(f"parallel control: 2 threads x{scaling():.2f} over 1")
