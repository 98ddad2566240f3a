"""Compile throughput, and epoch throughput of reading the compiled dataset vs decoding JPEGs with PIL.

Both baselines are measured in the same run on the same images.
"""
from __future__ import annotations

import shutil

import numpy as np

from common import BENCH_DIR, best_of, row, scenes
from dsc.demo import pil_epoch_rate

SIZE = 224


def main() -> None:
    import dsc

    src = scenes()
    paths = sorted(src.rglob("*.jpg"))
    out = BENCH_DIR / "compile-out.dsc"
    print(f"compile + read: {len(paths)} JPEG scenes 300-500 px -> {SIZE}x{SIZE} center-crop")

    pil_rate = max(pil_epoch_rate(paths[:300], SIZE) for _ in range(2))
    rates = {}
    for workers in (1, 2):
        def run():
            shutil.rmtree(out, ignore_errors=True)
            dsc.compile_imagefolder(src, out, size=SIZE, workers=workers, progress=False)
        rates[workers] = len(paths) / best_of(run, repeat=2)
    print(row("PIL decode+resize+crop loop, 1 process", pil_rate, "img/s", None, "(baseline)"))
    for w, r in rates.items():
        print(row(f"dsc compile, {w} worker(s)", r, "img/s", pil_rate))
    print(f"  parallel efficiency 2 workers: {rates[2] / (2 * rates[1]):.0%}")

    ds = dsc.open(out)
    rng = np.random.default_rng(0)
    import torch

    ring = [torch.empty((256, SIZE, SIZE, 3), dtype=torch.uint8) for _ in range(4)]

    def dsc_epoch():
        order = rng.permutation(len(ds))
        for k, a in enumerate(range(0, len(ds), 256)):
            idx = np.sort(order[a:a + 256])
            ds.gather_images(idx, out=ring[k % 4][:len(idx)])

    dsc_epoch()  # map the shards once
    dsc_rate = len(ds) / best_of(dsc_epoch, repeat=5)
    print(row("PIL decode epoch (1 core)", pil_rate, "img/s", None, "(baseline)"))
    print(row("dsc.open batched random epoch (1 thread)", dsc_rate, "img/s", pil_rate,
              f"{dsc_rate * SIZE * SIZE * 3 / 1e9:.1f} GB/s"))


if __name__ == "__main__":
    main()
