"""``make demo`` / ``python -m dsc.demo``: generate a small ImageFolder of procedural JPEG scenes,
compile it, read it back, and print throughput next to decoding the same JPEGs with PIL.
Nothing is downloaded."""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
from dsc.env import pil_build
from dsc.synthetic import write_imagefolder
import dsc


def pil_epoch_rate(paths: list[Path], size: int) -> float:
    """Images/s of the classic input pipeline: PIL decode + Resize(size) + CenterCrop(size)."""
    from PIL import Image

    t0 = time.perf_counter()
    for p in paths:
        with Image.open(p) as im:
            im = im.convert("RGB")
            w, h = im.size
            s = size / min(w, h)
            im = im.resize((max(size, int(w * s)), max(size, int(h * s))), Image.Resampling.BILINEAR)
            l, t = (im.width - size) // 2, (im.height - size) // 2
            np.asarray(im.crop((l, t, l + size, t + size)))
    return len(paths) / (time.perf_counter() - t0)


def main(argv=None) -> None:

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, default=Path("build/demo"))
    ap.add_argument("--classes", type=int, default=8)
    ap.add_argument("--per-class", type=int, default=100)
    ap.add_argument("--size", type=int, default=224)
    args = ap.parse_args(argv)

    src, out = args.out / "src", args.out / f"train-{args.size}.dsc"
    if not src.exists():
        t0 = time.perf_counter()
        write_imagefolder(src, args.classes, args.per_class, size_range=(300, 500), seed=0)
        print(f"[1/3] wrote {args.classes * args.per_class} procedural JPEG scenes to {src} "
              f"in {time.perf_counter() - t0:.1f} s")
    else:
        print(f"[1/3] using the scenes already in {src}")
    pil = pil_build()
    print(f"      decoding with {pil['pil_distribution']} {pil['pil_version']} (libjpeg-turbo {pil['libjpeg_turbo']})")

    report = dsc.compile_imagefolder(src, out, size=args.size, overwrite=True, progress=False)
    m = report.manifest
    print(f"[2/3] compiled {m.num_samples} images to {out}: {m.shard_count} shards, "
          f"{report.bytes_written / 1e6:.0f} MB, {report.images_per_second:,.0f} img/s")

    ds = dsc.open(out)
    loader = dsc.Loader(ds, batch_size=128, order="random", seed=0, num_threads=2, prefetch=3)
    first = None
    for b in loader:  # first epoch maps the shards and faults the ring buffers in
        if first is None:
            first = {"shape": tuple(b["image"].shape), "dtype": b["image"].dtype,
                     "classes": np.bincount(b["label"].numpy(), minlength=len(ds.classes)).tolist()}
    epochs = 5
    t0 = time.perf_counter()
    for epoch in range(1, epochs + 1):
        loader.set_epoch(epoch)
        for b in loader:
            pass
    dsc_rate = epochs * len(ds) / (time.perf_counter() - t0)
    sample = sorted(src.rglob("*.jpg"))[:200]
    pil_rate = pil_epoch_rate(sample, args.size)
    print(f"[3/3] read back with dsc.Loader: batch {first['shape']} {first['dtype']}, "
          f"samples per class in it {first['classes']} (a random draw; within a batch, storage order)")
    print(f"      dsc.Loader random-order epochs: {dsc_rate:,.0f} img/s "
          f"({dsc_rate * args.size * args.size * 3 / 1e9:.1f} GB/s)")
    print(f"      PIL decode+resize+crop:         {pil_rate:,.0f} img/s (one core, same images)")
    print(f"      ratio: {dsc_rate / pil_rate:,.0f}x")
    print(f"next: dsc info {out}")


if __name__ == "__main__":
    main()
