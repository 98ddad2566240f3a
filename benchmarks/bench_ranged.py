"""Random order from object storage without whole shards (``read="ranged"``), against a plain parallel
range-GET of the same bytes with the same client (obstore, as many requests in flight), in the same run.

The dataset (4,096 images of 128x128 in 32 shards of 128, ~200 MB) is pushed to an S3 API server (moto) started
here in its own process; the Loader opens it with ``cache_limit=0`` (no shard cache: the strategy the
Loader chooses by itself when the cache cannot hold a batch's shards). The baseline fetches each sample's
byte range of the very same batches (``Loader.batch_indices``, the field reader's ``extents``) with
``obstore.get_range`` from a pool of the same number of threads, and copies nothing. Pairs alternate;
the share is the median of the pairs' ratios. moto is a Python server: on a 2-core machine it competes
with both sides for the cores, the same way for each. ``python benchmarks/bench_ranged.py``.
"""
from __future__ import annotations

import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_remote import BATCH, _dataset, _moto_s3  # noqa: E402
from common import BENCH_DIR  # noqa: E402

PAIRS = 5
EPOCH_BATCHES = 8  # batches of each timed run (random order, batch 256)


def _ranges(ds, batches):
    """[(path, start, end)] of every sample of ``batches``, batch by batch."""
    reader = ds.readers["image"].px
    out = []
    for b in batches:
        slots, offsets, sizes = reader.extents(ds._to_rows(np.asarray(b, np.int64)))
        out.append([(reader.shards[s].path, int(o), int(o + n)) for s, o, n in zip(slots.tolist(), offsets.tolist(),
                                                                                    sizes.tolist())])
    return out


def _plain(store, ranges, threads: int) -> float:
    import obstore

    def one(r):
        return len(obstore.get_range(store, r[0], start=r[1], end=r[2]))

    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as ex:
        for batch in ranges:  # (batch by batch, as a loader needs them)
            sum(ex.map(one, batch))
    return time.perf_counter() - t0


def _ranged(loader, epoch: int, n: int) -> float:
    loader.set_epoch(epoch)
    t0 = time.perf_counter()
    for k, _ in enumerate(loader):
        if k + 1 == n:
            break
    return time.perf_counter() - t0


def main() -> None:
    import tempfile

    import dsc
    from dsc.compiler.upload import push
    from dsc.runtime.reads import RANGE_DEPTH
    from dsc.store import open_store

    local = _dataset()
    url = "s3://bench/ranged"
    with _moto_s3():
        push(local, url, progress=False)
        with tempfile.TemporaryDirectory(dir=BENCH_DIR) as tmp:
            ds = dsc.open(url, cache_dir=tmp, cache_limit=0)
            loader = dsc.Loader(ds, batch_size=BATCH, order="random", num_threads=2)
            assert loader.read_strategy == "ranged", loader.read_reason
            store = open_store(url)._store
            _ranged(loader, 0, 2)  # (connections and threads up)
            t_plain, t_ranged, served = [], [], 0
            for p in range(PAIRS):
                ranges = _ranges(ds, loader.batch_indices(p + 1)[:EPOCH_BATCHES])
                served = sum(e - s for b in ranges for _, s, e in b)
                t_plain.append(_plain(store, ranges, RANGE_DEPTH))
                t_ranged.append(_ranged(loader, p + 1, EPOCH_BATCHES))
            reads = loader._reads
            loader.close()
    shares = sorted(a / b for a, b in zip(t_plain, t_ranged))
    mb = served / 1e6
    print(f"ranged reads: {len(ds):,} images 128x128 in s3:// (moto), random order, batch {BATCH}, cache_limit=0, "
          f"{EPOCH_BATCHES} batches a run, {PAIRS} pairs")
    print(f"  plain parallel range-GET of the same samples, obstore, {RANGE_DEPTH} threads (base) "
          f"{mb / min(t_plain):8,.1f} MB/s")
    print(f"  dsc.Loader read='ranged' (auto: cache_limit=0)                     {mb / min(t_ranged):8,.1f} MB/s   "
          f"{shares[len(shares) // 2]:.0%} of the base, median of {len(shares)} pairs ({shares[0]:.0%}-"
          f"{shares[-1]:.0%}; goal: at least 80%); {reads.requests:,} GETs for {reads.bytes_fetched / 1e6:,.1f} MB")


if __name__ == "__main__":
    main()
