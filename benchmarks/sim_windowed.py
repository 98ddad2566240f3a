"""The over-RAM benchmark's windowed reads, simulated: how long the disk sits idle under dsc's read schedule.

bench_overram.py measures wall rates, which a shared machine's load swings by tens of percent. This runs the
real ``Windowed.schedule`` (its budget, its walk) over the real orders of that benchmark's dataset (21,400
samples of 224x224x3, 256 a shard: 84 shards of 38.5 MB; batch 256; quasi_random's window of 8), with a
simulated disk (one at a time, ``DSC_SIM_READ`` seconds a shard: 0.038, about 1 GB/s) and two filler threads
(``DSC_SIM_GATHER`` seconds a batch: 0.012), both by sleeping, so the figures depend less on the machine's
load. The memory figure is the one a Loader sees under bench_overram's 1 GiB cgroup (912 MB). Printed per
order: the epoch against the disk's pure read time (what a schedule that never leaves the disk idle reaches),
the disk's busy share, the fillers' waits, the shards fetched (each once) and the most held.

``python benchmarks/sim_windowed.py`` (with ``PYTHONPATH`` at another checkout to compare with it).
"""
from __future__ import annotations

import os
import threading
import time

import numpy as np

from dsc.runtime import reads as R
from dsc.runtime.orders.quasi_random import quasi_random_order
from dsc.runtime.schedule import shard_needs

N, K, B, WINDOW = 21_400, 256, 256, 8
SAMPLE = 224 * 224 * 3
MEMORY = 912_000_000  # bench_overram's cgroup: 1 GiB less what the Loader's process holds
READ = float(os.environ.get("DSC_SIM_READ", 0.038))
GATHER = float(os.environ.get("DSC_SIM_GATHER", 0.012))


class _Disk:
    """A storage whose shard reads take READ seconds each, one at a time."""

    remote = False

    def __init__(self):
        self.lock = threading.Lock()
        self.busy = 0.0

    def acquire(self, rel, mapped=True):
        pass

    def release(self, rel):
        pass

    def drop_pages(self, rel):
        pass

    def map_file(self, rel, nbytes, populate=True):
        with self.lock:
            t = time.perf_counter()
            time.sleep(READ)
            self.busy += time.perf_counter() - t
        return np.zeros(1, np.uint8)


def simulate(order: np.ndarray) -> dict:
    batches = [np.sort(order[i:i + B]) for i in range(0, N, B)]
    needs = shard_needs(batches, K)
    shards = -(-N // K)
    nbytes = np.array([min(K, N - s * K) * SAMPLE + 4100 for s in range(shards)], np.int64)
    disk = _Disk()
    os.environ["DSC_MEMORY"] = str(MEMORY)  # (taken as it is: no cgroup read)
    reads = R.Windowed(disk, memory=MEMORY)
    t0 = time.perf_counter()
    sched = reads.schedule(needs, 0, nbytes, [str(s) for s in range(shards)])
    nxt, lock, waits = iter(range(len(needs))), threading.Lock(), [0.0]

    def filler():
        while True:
            with lock:
                j = next(nxt, None)
            if j is None:
                return
            t = time.perf_counter()
            sched.wait(j)
            with lock:
                waits[0] += time.perf_counter() - t
            time.sleep(GATHER)
            sched.done(j)

    threads = [threading.Thread(target=filler) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    dt = time.perf_counter() - t0
    sched.close()
    return {"epoch": dt, "share": shards * READ / dt, "busy": disk.busy / dt, "waits": waits[0],
            "fetches": sched.fetches, "shards": shards, "peak": sched.peak_bytes, "budget": reads.budget}


def main() -> None:
    print(f"windowed reads, simulated: {N:,} samples of 224x224x3 in {-(-N // K)} shards of {K}, batch {B}, "
          f"{MEMORY / 1e6:.0f} MB of memory; disk {READ * 1e3:.0f} ms a shard, 2 fillers {GATHER * 1e3:.0f} ms a batch")
    for name, order in (("quasi_random", quasi_random_order(N, K, 0, 0, window=WINDOW)), ("sequential", np.arange(N))):
        r = simulate(order)
        print(f"  {name:13} epoch {r['epoch']:.2f} s = {r['share']:.0%} of the disk's pure read; disk busy "
              f"{r['busy']:.0%}; fillers waited {r['waits']:.2f} s; {r['fetches']} fetches of {r['shards']} shards; "
              f"budget {r['budget'] / 1e6:.0f} MB, peak held {r['peak'] / 1e6:.0f} MB")


if __name__ == "__main__":
    main()
