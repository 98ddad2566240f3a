"""Shared pieces of the benchmarks: data generation (cached under build/bench) and timing."""
from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

# DSC_BENCH_DIR: another folder for the cached data (e.g. one several checkouts share)
BENCH_DIR = Path(os.environ.get("DSC_BENCH_DIR", "build/bench"))


def cached(name: str, build) -> Path:
    """``BENCH_DIR / name``, made by ``build(root)`` once and reused across runs; a folder left half-built
    by an interrupted run (no ``.complete`` mark) is made again from scratch."""
    root = BENCH_DIR / name
    if not (root / ".complete").exists():
        shutil.rmtree(root, ignore_errors=True)
        build(root)
        (root / ".complete").write_text("")
    return root


def scenes(num_classes: int = 8, per_class: int = 125, size_range=(300, 500)) -> Path:
    """An ImageFolder of ImageNet-like JPEG scenes (generated once, reused across runs)."""
    from dsc.synthetic import write_imagefolder

    return cached(f"scenes-{num_classes}x{per_class}-{size_range[0]}-{size_range[1]}",
                  lambda root: write_imagefolder(root, num_classes, per_class, size_range=size_range, seed=0))


def pop_rounds(args: list) -> int:
    """``--rounds N`` taken out of ``args`` (a bench's command line): N, or 1 without it."""
    if "--rounds" not in args:
        return 1
    k = args.index("--rounds")
    rounds = int(args[k + 1])
    del args[k:k + 2]
    return rounds


def best_of(fn, repeat: int = 3) -> float:
    """Smallest wall time of ``repeat`` calls: the least disturbed by the shared machine's noise."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def row(name: str, rate: float, unit: str, baseline: float | None = None, extra: str = "") -> str:
    ratio = f"{rate / baseline:8.2f}x" if baseline else " " * 9
    return f"  {name:<44} {rate:>12,.0f} {unit:<6} {ratio}  {extra}"


def compiled_224(n_classes: int = 16, per_class: int = 512) -> Path:
    """A 224x224 fixed-shape dataset of n_classes*per_class samples (1.2 GB for 8192), compiled from small
    JPEGs so that generating it takes seconds; for reader benchmarks."""
    import dsc

    out = BENCH_DIR / f"fixed224-{n_classes * per_class}.dsc"
    if not out.exists():
        src = scenes(n_classes, per_class, size_range=(48, 96))
        dsc.compile_imagefolder(src, out, size=224, resize="stretch", progress=False)
    return out


def imagenet_like(n: int = 240) -> Path:
    """JPEGs with ImageNet's shape of sizes: most 500x375 (either orientation), a quarter large photos
    (long side 800-1600), quality 90. Generated once."""
    import numpy as np

    from dsc.synthetic import make_scene

    def build(root: Path) -> None:
        rng = np.random.default_rng(0)
        for i in range(n):
            if rng.random() < 0.75:
                h, w = (375, 500) if rng.random() < 0.8 else (500, 375)
            else:
                w = int(rng.integers(800, 1601))
                h = int(w * rng.uniform(0.6, 0.8))
            d = root / f"class_{i % 8:02d}"
            d.mkdir(parents=True, exist_ok=True)
            make_scene(rng, h, w).save(d / f"img_{i:05d}.jpg", quality=90)
    return cached(f"imagenet-like-{n}", build)
