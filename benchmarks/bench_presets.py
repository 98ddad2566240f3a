"""The reference recipes (dsc.transforms.presets) on CPU: each preset through dsc.Loader (batched ops,
geometry fused into the gather) beside a torch DataLoader (2 persistent workers) that decodes the same
JPEGs with PIL and runs the same recipe per image with torch ops (what torchvision.transforms.v2 does per
sample; MixUp/CutMix in its collate, as torchvision's train.py), same run. Detection: dsc hands out
format="torchvision" (float CHW images) and the per-image side ends, as torchvision's DetectionPresetTrain,
with ToDtype(float, scale=True); a second line gives dsc's uint8 packed batches (what goes to a GPU, which
converts there) against the same per-image rate.

Classification: the recipe benchmark's 4,000 JPEGs of 256-384 px, compiled at 256 (fixed). Detection: the
detection benchmark's 400 JPEG scenes of 400-640 px with boxes, stored as decoded (ragged). Timed: one
epoch of SAMPLES after a warm-up batch (dsc) / after the start-up batches (DataLoader)."""
from __future__ import annotations

import time

from common import BENCH_DIR, cached, row

SAMPLES = 1024
CLASSIFICATION = ("imagenet", "ta_wide", "ra", "augmix", "autoaugment")
DETECTION = ("det-hflip", "det-multiscale", "det-ssdlite", "det-ssd", "det-lsj", "yolo")


def dsc_rate(ds, ops, batch_size: int, fmt: str) -> float:
    import dsc

    loader = dsc.Loader(ds, batch_size=batch_size, order="random", num_threads=2, transforms=ops, format=fmt,
                        indices=range(min(SAMPLES, len(ds))))
    next(iter(loader))  # map the shards, warm the ring
    t0, n = time.perf_counter(), 0
    for b in loader:
        n += len(b[0]) if isinstance(b, tuple) else len(b["image_offsets"]) - 1 if "image_offsets" in b else \
            len(b["image"])
    return n / (time.perf_counter() - t0)


def main(argv=None) -> None:
    """``python bench_presets.py [NAME ...]``: only the presets named (all of them without)."""
    import sys

    import dsc
    from dsc.bench import preset_dataloader_rate
    from dsc.synthetic import detection_scenes, write_coco
    from dsc.transforms.presets import detection, recipe, yolo

    import bench_recipe

    only = set(sys.argv[1:] if argv is None else argv)
    print(f"reference recipes on CPU: {SAMPLES} samples per preset, 2 threads vs torch DataLoader(2 workers) per "
          f"image")
    cls = None
    for name in CLASSIFICATION:
        if only and name not in only:
            continue
        cls = cls or bench_recipe.compiled(bench_recipe.sources(), "fixed", size=256)
        ops = recipe(name)
        rate = dsc_rate(cls, ops, 128, "dict")
        base = preset_dataloader_rate(cls, ops, 128, limit=SAMPLES // 2)
        print(row(f"{name} (fixed 256 -> 224)", rate, "img/s", base, f"vs per-image ({base or 0:,.0f} img/s)"))
    root = cached("coco-400", lambda r: write_coco(r, detection_scenes(400, seed=0, size_range=(400, 640),
                                                                        ext=".jpg")))
    out = BENCH_DIR / "coco-400-ragged.dsc"
    if not out.exists():
        dsc.compile_coco(root / "annotations.json", root / "images", out, progress=False)
    det = dsc.open(out)
    for name in DETECTION:
        if only and name not in only:
            continue
        ops = detection("lsj", size=640) if name == "det-lsj" else yolo(320) if name == "yolo" else recipe(name)
        rate = dsc_rate(det, ops, 16, "torchvision")
        packed = dsc_rate(det, ops, 16, "dict")
        base = preset_dataloader_rate(det, ops, 16, limit=SAMPLES // 4)
        label = {"det-lsj": "det-lsj (640)", "yolo": "yolo (320)"}.get(name, name)
        print(row(f"{label} (ragged 400-640)", rate, "img/s", base, f"vs per-image ({base or 0:,.0f} img/s)"))
        print(row("  same, uint8 packed (the form sent to a GPU)", packed, "img/s", base, "vs the same per-image"))


if __name__ == "__main__":
    main()
