"""A mixture of three datasets vs one dataset of the same total size and sample shape, same run (issue 33).

The three sources (2,048 + 1,024 + 1,024 images at 224x224x3) and the single dataset (4,096 of the same shape,
the same shard size) are read by dsc.Loader epochs of batch 256, alternately, in random and quasi_random order; each figure is the
median over rounds of in-process epoch rates (warm page cache: the mapped read strategy). Goal: the mixture at
>= 95% of the single dataset's rate. A second line weights the sources [0.5, 0.3, 0.2] (source 3 up-sampled).
On a shared machine whole epochs swing with the load: read the pairwise range beside each median.
"""
import statistics
import time

from common import BENCH_DIR, row, scenes

ROUNDS = 5
SHARD = 128  # one shard size for all four (compile's default grows with the dataset: 32 shards each), so that
#              a batch touches as many shard runs in the mixture as in the single dataset


def _compiled(name: str, n_classes: int, seed_classes: int) -> str:
    import dsc

    out = BENCH_DIR / f"mix-{name}-k{SHARD}.dsc"
    if not out.exists():
        src = scenes(n_classes, 512, size_range=(48, 96 + seed_classes))
        dsc.compile_imagefolder(src, out, size=224, resize="stretch", shard_size=SHARD, progress=False)
    return str(out)


def _epoch_rate(loader) -> float:
    t0 = time.perf_counter()
    n = 0
    for b in loader:
        n += len(b["index"])
    return n / (time.perf_counter() - t0)


def main() -> None:
    import dsc

    single = dsc.open(_compiled("single", 8, 0))
    parts = [dsc.open(_compiled("a", 4, 1)), dsc.open(_compiled("b", 2, 2)), dsc.open(_compiled("c", 2, 3))]
    assert len(single) == sum(len(p) for p in parts) == 4096
    print(f"mixture of 3 datasets (2,048 + 1,024 + 1,024 of 224x224x3) vs one of 4,096 (batch 256, 2 threads, "
          f"medians of {ROUNDS} rounds)")
    for order in ("random", "quasi_random"):
        loaders = {"single": dsc.Loader(single, batch_size=256, order=order),
                   "mixture": dsc.Loader(parts, batch_size=256, order=order),
                   "weighted": dsc.Loader(parts, batch_size=256, order=order, weights=[0.5, 0.3, 0.2])}
        for loader in loaders.values():
            _epoch_rate(loader)  # warm: pages in, ring allocated
        rates = {k: [] for k in loaders}
        for _ in range(ROUNDS):
            for k, loader in loaders.items():
                rates[k].append(_epoch_rate(loader))
        base = statistics.median(rates["single"])
        print(row(f"{order}: one dataset (baseline)", base, "img/s", base))
        for k in ("mixture", "weighted"):
            ratios = [m / s for m, s in zip(rates[k], rates["single"])]
            print(row(f"{order}: {k} of three", statistics.median(rates[k]), "img/s", base,
                      f"pairwise {min(ratios):.2f}-{max(ratios):.2f}"))
        for loader in loaders.values():
            loader.close()


if __name__ == "__main__":
    main()
