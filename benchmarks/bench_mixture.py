"""A mixture of three datasets vs one dataset of the same total size and sample shape, same run (issue 33).

The three sources (2,048 + 1,024 + 1,024 images at 224x224x3) and the single dataset (4,096 of the same shape,
the same shard size, so as many shards in all) are read by dsc.Loader epochs of batch 256 (the same read
strategy and threads, checked), in random and quasi_random order. Goal: the mixture at >= 95% of the single
dataset's rate.

Made to be trusted on a shared machine: every shard file is read once first (the page cache warm for both
sides), one timed sample is as many whole epochs as take >= 1 s, and the loaders take turns within each round
(single, mixture, weighted, then the reverse order the next round), so each round's ratio compares runs a
second apart. Each ratio is the median of the rounds' ratios, with their range; ``cpu`` is the same ratio of
the process's CPU time per sample (what the machine's other load disturbs least). A second Loader over the single
dataset (another seed) is timed the same way: its ratio, which should be 1.00, shows what the method's noise and
bias are in that run. The load average is printed before and after.
"""
import math
import os
import statistics
import time

from common import BENCH_DIR, row, scenes

ROUNDS = 7
MIN_SECONDS = 1.0  # one timed sample: whole epochs, at least this long
SHARD = 128  # one shard size for all four (compile's default grows with the dataset: 32 shards each), so that
#              a batch touches as many shard runs in the mixture as in the single dataset


def _compiled(name: str, n_classes: int, seed_classes: int) -> str:
    import dsc

    out = BENCH_DIR / f"mix-{name}-k{SHARD}.dsc"
    if not out.exists():
        src = scenes(n_classes, 512, size_range=(48, 96 + seed_classes))
        dsc.compile_imagefolder(src, out, size=224, resize="stretch", shard_size=SHARD, progress=False)
    return str(out)


def _warm(path: str) -> None:
    """Every file of a dataset read once: its pages in the page cache."""
    for root, _, files in os.walk(path):
        for f in files:
            with open(os.path.join(root, f), "rb") as fh:
                while fh.read(1 << 24):
                    pass


def _epochs(loader, n: int) -> tuple[float, float]:
    """(samples per second of wall time, per second of this process's CPU time) over ``n`` epochs."""
    t0, c0, k = time.perf_counter(), time.process_time(), 0
    for _ in range(n):
        for b in loader:
            k += len(b["index"])
    return k / (time.perf_counter() - t0), k / (time.process_time() - c0)


def _alternated(loaders: dict, epochs: int) -> dict[str, float]:
    """Samples per CPU second of the calling thread, each loader's batches made in that thread (num_threads=0)
    and the loaders' batches taken in turn, one batch each (the order reversed every turn): the finest
    interleaving, and CPU time, which a preemption by the machine's other load does not count."""
    cpu = {k: 0.0 for k in loaders}
    got = {k: 0 for k in loaders}
    for _ in range(epochs):
        live = {k: iter(L) for k, L in loaders.items()}
        turn = 0
        while live:
            for k in (list(live) if turn % 2 == 0 else list(live)[::-1]):
                t0 = time.thread_time()
                b = next(live[k], None)
                if b is None:
                    del live[k]
                    continue
                cpu[k] += time.thread_time() - t0
                got[k] += len(b["index"])
                b = None
            turn += 1
    return {k: got[k] / cpu[k] for k in loaders}


def _load() -> str:
    return "load average " + " ".join(f"{v:.2f}" for v in os.getloadavg()) + f" on {os.cpu_count()} cores"


def main() -> None:
    import dsc

    paths = [_compiled("single", 8, 0), _compiled("a", 4, 1), _compiled("b", 2, 2), _compiled("c", 2, 3)]
    for p in paths:
        _warm(p)
    single, *parts = (dsc.open(p) for p in paths)
    assert len(single) == sum(len(p) for p in parts) == 4096
    assert all(p.manifest.image == single.manifest.image and p.manifest.shard_size == single.manifest.shard_size
               for p in parts), "the sources and the single dataset must share sample shapes and shard size"
    assert sum(p.shard_bytes for p in parts) == single.shard_bytes
    print(f"mixture of 3 datasets (2,048 + 1,024 + 1,024 of 224x224x3) vs one of 4,096 (batch 256, 2 threads; "
          f"medians of {ROUNDS} interleaved rounds, each sample >= {MIN_SECONDS:.0f} s of whole epochs); {_load()}")
    for order in ("random", "quasi_random"):
        loaders = {"single": dsc.Loader(single, batch_size=256, order=order, num_threads=2),
                   "mixture": dsc.Loader(parts, batch_size=256, order=order, num_threads=2),
                   "weighted": dsc.Loader(parts, batch_size=256, order=order, num_threads=2, weights=[0.5, 0.3, 0.2]),
                   "again": dsc.Loader(single, batch_size=256, order=order, num_threads=2, seed=1)}
        same = {(L.read_strategy, L.threads_used, L.batch_size, len(L)) for L in loaders.values()}
        assert len(same) == 1, f"the loaders differ in read strategy, threads, batch size or batches: {same}"
        for loader in loaders.values():
            _epochs(loader, 1)  # warm: pages mapped, ring allocated
        n = max(1, math.ceil(MIN_SECONDS * _epochs(loaders["single"], 1)[0] / 4096))
        wall = {k: [] for k in loaders}
        cpu = {k: [] for k in loaders}
        for r in range(ROUNDS):
            for k in (list(loaders) if r % 2 == 0 else list(loaders)[::-1]):
                w, c = _epochs(loaders[k], n)
                wall[k].append(w)
                cpu[k].append(c)
        base = statistics.median(wall["single"])
        print(row(f"{order}: one dataset (baseline)", base, "img/s", base, f"{n} epochs per sample"))
        for k, what in (("mixture", "mixture of three"), ("weighted", "weighted of three"),
                        ("again", "one dataset again (control)")):
            ratios = [m / s for m, s in zip(wall[k], wall["single"])]
            cpus = [m / s for m, s in zip(cpu[k], cpu["single"])]
            print(f"  {f'{order}: {what}':<44} {statistics.median(wall[k]):>12,.0f} img/s  "
                  f"{statistics.median(ratios):8.2f}x  rounds {min(ratios):.2f}-{max(ratios):.2f}; "
                  f"cpu {statistics.median(cpus):.2f}x")
        for loader in loaders.values():
            loader.close()
        # the same, batches made in the calling thread and alternated batch by batch; CPU time of that thread
        loaders = {"single": dsc.Loader(single, batch_size=256, order=order, num_threads=0),
                   "mixture": dsc.Loader(parts, batch_size=256, order=order, num_threads=0),
                   "weighted": dsc.Loader(parts, batch_size=256, order=order, num_threads=0, weights=[0.5, 0.3, 0.2]),
                   "again": dsc.Loader(single, batch_size=256, order=order, num_threads=0, seed=1)}
        _alternated(loaders, 1)
        rounds = [_alternated(loaders, 2) for _ in range(ROUNDS)]
        print(f"  {order}, batches alternated one by one in the calling thread, its CPU time: " + ", ".join(
            f"{k} {statistics.median([r[k] / r['single'] for r in rounds]):.2f}x "
            f"({min(r[k] / r['single'] for r in rounds):.2f}-{max(r[k] / r['single'] for r in rounds):.2f})"
            for k in ("mixture", "weighted", "again")))
        for loader in loaders.values():
            loader.close()
    print(f"  ({_load()})")


if __name__ == "__main__":
    main()
