"""The reference recipes (dsc.transforms.presets) on CPU: each preset through dsc.Loader (batched ops,
geometry fused into the gather) beside torch DataLoaders (2 persistent workers) that decode the same JPEGs
and run the same recipe per image, same run. Classification has two of them, measured in interleaved
rounds: "reference" (the goal's baseline, dsc.bench._ReferenceClassification) is torchvision's reference as
its train.py runs it: RandomResizedCrop, flip and AutoAugment / RandAugment / TrivialAugmentWide on the PIL
image with PIL's kernels, AugMix on a uint8 tensor with torch ops, PILToTensor, ToDtype, Normalize and
RandomErasing on the tensor, MixUp/CutMix in the collate; "dsc-per-image" (dsc.bench._PerImageRecipe) runs
dsc's own batched kernels on a batch of one image. Each row gives wall-time ratios (same round) and CPU
time per image (each side's work run in one thread: the Loader's epoch with one filler thread; the
DataLoader's items and collates in this process), with the load average. Detection: dsc hands out
format="torchvision" (float CHW images) and the per-image side ends, as torchvision's DetectionPresetTrain,
with ToDtype(float, scale=True); a second line gives dsc's uint8 packed batches (what goes to a GPU, which
converts there) against the same per-image rate.

Classification: the recipe benchmark's 4,000 JPEGs of 256-384 px, compiled at 256 (fixed). Detection: the
detection benchmark's 400 JPEG scenes of 400-640 px with boxes, stored as decoded (ragged). Timed: one
epoch of SAMPLES after a warm-up batch (dsc) / after the start-up batches (DataLoader)."""
from __future__ import annotations

import time

from common import BENCH_DIR, cached, row

ROUNDS = int(__import__("os").environ.get("PRESET_ROUNDS", 2))  # interleaved rounds of (dsc, reference, dsc-per-image) per classification preset; best of each kept

SAMPLES = 1024
CLASSIFICATION = ("imagenet", "ta_wide", "ra", "augmix", "autoaugment")
DETECTION = ("det-hflip", "det-multiscale", "det-ssdlite", "det-ssd", "det-lsj", "yolo")


def dsc_rate(ds, ops, batch_size: int, fmt: str, threads: int = 2) -> float:
    import dsc

    loader = dsc.Loader(ds, batch_size=batch_size, order="random", num_threads=threads, transforms=ops, format=fmt,
                        indices=range(min(SAMPLES, len(ds))))
    next(iter(loader))  # map the shards, warm the ring
    t0, c0, n = time.perf_counter(), time.process_time(), 0
    for b in loader:
        n += len(b[0]) if isinstance(b, tuple) else len(b["image_offsets"]) - 1 if "image_offsets" in b else \
            len(b["image"])
    LAST["cpu"] = (time.process_time() - c0) / n  # (the process's threads together, per image)
    return n / (time.perf_counter() - t0)


LAST: dict = {}  # dsc_rate's last CPU seconds per image


def classification_ops(name: str) -> list:
    from dsc.transforms.presets import classification, recipe

    # imagenet+mix: the plain recipe with RandomErasing(0.1) and MixUp(0.2)/CutMix(1.0) (the others have them too)
    return classification(None, random_erase=0.1, mixup=0.2, cutmix=1.0) if name == "imagenet+mix" else recipe(name)


def cpu_per_image(fn, n: int) -> float:
    """CPU seconds per image of ``fn()`` (which makes ``n`` images), this process's threads together."""
    c0 = time.process_time()
    fn()
    return (time.process_time() - c0) / n


def items_cpu(dataset, collate, n: int = 256, batch: int = 32) -> float:
    """CPU seconds per image of a DataLoader's work done in this process: ``n`` items, collated ``batch`` at a time."""
    def run():
        for b0 in range(0, n, batch):
            collate([dataset[i] for i in range(b0, b0 + batch)])
    return cpu_per_image(run, n)


def classification_row(ds, name: str) -> dict:
    """``name`` through the Loader beside both per-image DataLoaders, :data:`ROUNDS` interleaved rounds (best rate
    of each kept), then each side's CPU time per image; printed with the load average."""
    import os

    import torch

    from dsc.bench import (_collate, _PerImageRecipe, _reference_collate, _ReferenceClassification,
                           preset_dataloader_rate, reference_dataloader_rate, source_files)

    ops = classification_ops(name)
    rates: dict[str, float] = {"dsc": 0.0, "reference": 0.0, "per-image": 0.0}
    for _ in range(ROUNDS):
        rates["dsc"] = max(rates["dsc"], dsc_rate(ds, ops, 128, "dict"))
        rates["reference"] = max(rates["reference"], reference_dataloader_rate(ds, ops, 128, limit=SAMPLES // 2) or 0)
        rates["per-image"] = max(rates["per-image"], preset_dataloader_rate(ds, ops, 128, limit=SAMPLES // 2) or 0)
    torch.set_num_threads(1)  # (as a DataLoader worker)
    rows: list[int] = []
    paths = source_files(ds, rows=rows)[0]
    cpu = {"reference": items_cpu(_ReferenceClassification(ds, paths, ops, rows), _reference_collate(ds, ops)),
           "per-image": items_cpu(_PerImageRecipe(ds, paths, ops, rows), _collate(ops))}
    torch.set_num_threads(os.cpu_count() or 1)
    dsc_rate(ds, ops, 128, "dict", threads=1)  # (one filler thread, as one worker process is one thread)
    cpu["dsc"] = LAST["cpu"]
    load = open("/proc/loadavg").read().split()[0]
    print(row(f"{name} (fixed 256 -> 224)", rates["dsc"], "img/s", rates["reference"],
              f"vs the reference ({rates['reference']:,.0f} img/s); CPU {cpu['dsc'] * 1e3:.2f} vs "
              f"{cpu['reference'] * 1e3:.2f} ms/img: {cpu['reference'] / cpu['dsc']:.1f}x; load {load}"))
    print(row("  same, against dsc's kernels per image", rates["dsc"], "img/s", rates["per-image"],
              f"vs dsc-per-image ({rates['per-image']:,.0f} img/s); CPU {cpu['per-image'] * 1e3:.2f} ms/img: "
              f"{cpu['per-image'] / cpu['dsc']:.1f}x"))
    return {"rates": rates, "cpu": cpu, "load": float(load)}


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
    for name in CLASSIFICATION + ("imagenet+mix",):
        if only and name not in only:
            continue
        cls = cls or bench_recipe.compiled(bench_recipe.sources(), "fixed", size=256)
        classification_row(cls, name)
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
