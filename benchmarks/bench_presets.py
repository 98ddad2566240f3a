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

Detection, segmentation and YOLO have two per-image baselines, measured in the same run, interleaved
(``--rounds N``: medians of N rounds), each with its CPU time per image (this process and its 2 workers):
the goal's, a DataLoader running the preset AS ITS REFERENCE DOES (dsc.bench._ReferenceRecipe: torchvision's
references/detection and references/segmentation transforms on PIL images, Ultralytics' pipeline with a
mosaic of four decoded JPEGs; OpenCV's calls done with PIL where cv2 is not installed), and a stricter one
running dsc's own batched kernels on a batch of one image (dsc.bench._PerImageRecipe: a faster dsc kernel
speeds it too).

Classification: the recipe benchmark's 4,000 JPEGs of 256-384 px, compiled at 256 (fixed). Detection: the
detection benchmark's 400 JPEG scenes of 400-640 px with boxes, stored as decoded (ragged); segmentation:
the same scenes with a semantic mask. Timed: one epoch of SAMPLES (DET_SAMPLES) after a warm-up epoch (dsc: the ring's buffers grown, as in every
epoch of a training run but its first; `dsc bench` and bench_instances time the same way)
/ BASELINE_SAMPLES after the start-up batches (DataLoader)."""
from __future__ import annotations

import os
import statistics
import time

import parallel_control
from common import BENCH_DIR, cached, pop_rounds, row

# interleaved rounds of (dsc, reference, dsc-per-image) per classification preset; best of each kept
ROUNDS = int(os.environ.get("PRESET_ROUNDS", 2))

SAMPLES = 1024
DET_SAMPLES = 512  # dsc's detection epochs (the slow presets run at tens of images/s on 2 shared cores)
BASELINE_SAMPLES = 256
CLASSIFICATION = ("imagenet", "ta_wide", "ra", "augmix", "autoaugment")
DETECTION = ("det-hflip", "det-multiscale", "det-ssdlite", "det-ssd", "det-lsj", "yolo", "segmentation")
SEMANTIC = ("segmentation",)  # recipes of the scenes with a semantic mask: dict batches (no torchvision form)


def dsc_rate(ds, ops, batch_size: int, fmt: str, samples: int = SAMPLES, cpu: bool = False, threads: int = 2):
    """Images/s of one epoch of ``samples`` through dsc.Loader (2 threads); ``cpu``: (images/s, CPU ms per
    image of this process, every thread)."""
    import dsc

    loader = dsc.Loader(ds, batch_size=batch_size, order="random", num_threads=threads, transforms=ops, format=fmt,
                        indices=range(min(samples, len(ds))))
    for _ in loader:  # a first epoch maps the shards and grows the ring's buffers to their size (page faults a
        pass  # training run pays once, not every epoch): timed is the next one, as the DataLoaders' warm workers
    c0, t0, n = time.process_time(), time.perf_counter(), 0
    for b in loader:
        n += len(b[0]) if isinstance(b, tuple) else len(b["image_offsets"]) - 1 if "image_offsets" in b else \
            len(b["image"])
    rate = n / (time.perf_counter() - t0)
    cpu_s = (time.process_time() - c0) / n  # (the process's threads together, per image)
    return (rate, 1e3 * cpu_s) if cpu else rate


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def detection_rows(name, ds, ops, batch_size, rounds: int) -> None:
    """dsc (torchvision form; uint8 packed) against the reference-faithful per-image DataLoader (the goal's
    baseline) and the per-image DataLoader running dsc's own kernels on one image (stricter), interleaved
    over ``rounds``; medians; wall-time and CPU-time ratios."""
    from dsc.bench import baseline_rates

    fmt = "dict" if name in SEMANTIC else "torchvision"
    got: dict = {"tv": [], "packed": [], "ref": [], "own": []}
    for _ in range(rounds):
        got["ref"].append(baseline_rates(ds, ops, batch_size, BASELINE_SAMPLES, reference=True))
        got["tv"].append(dsc_rate(ds, ops, batch_size, fmt, DET_SAMPLES, cpu=True))
        got["own"].append(baseline_rates(ds, ops, batch_size, BASELINE_SAMPLES, reference=False))
        if fmt == "torchvision":
            got["packed"].append(dsc_rate(ds, ops, batch_size, "dict", DET_SAMPLES, cpu=True))
    med = {k: (_median([v[0] if isinstance(v, tuple) else v["rate"] for v in vs if v]),
               _median([v[1] if isinstance(v, tuple) else v["cpu_ms"] for v in vs if v])) for k, vs in got.items()}
    ref, own = med["ref"], med["own"]
    load = f"{os.getloadavg()[0]:.2f}"

    def line(label, key):
        rate, cpu = med[key]
        if rate is None:
            return
        vs = []
        for base, bname in ((ref, "reference"), (own, "dsc-kernels per image")):
            if base[0]:
                vs.append(f"{rate / base[0]:5.2f}x wall, {base[1] / cpu:5.2f}x CPU vs {bname}")
        print(row(label, rate, "img/s", ref[0], f"{cpu:7.1f} CPU ms/img; " + "; ".join(vs) + f" (load {load})"))

    label = {"det-lsj": "det-lsj (640)", "yolo": "yolo (320)"}.get(name, name)
    line(f"{label} ({'torchvision form' if fmt == 'torchvision' else 'dict'})", "tv")
    line("  same, uint8 packed (the form sent to a GPU)", "packed")
    for key, what in (("ref", "per-image DataLoader, as the reference runs it"),
                      ("own", "per-image DataLoader, dsc's kernels on one image")):
        if med[key][0]:
            print(row(f"  baseline: {what}", med[key][0], "img/s", None, f"{med[key][1]:7.1f} CPU ms/img"))


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
    # (one filler thread, as one worker process is one thread: its rate shows how far two threads scale)
    rates["dsc-1"], ms = dsc_rate(ds, ops, 128, "dict", cpu=True, threads=1)
    cpu["dsc"] = ms / 1e3
    controls = parallel_control.scalings()  # (what two threads can get on this machine now: shared, often < 2;
    control = controls["mm"]  # compute-bound, memory-bound and in-cache controls)
    load = f"{os.getloadavg()[0]:.2f}"
    print(row(f"{name} (fixed 256 -> 224)", rates["dsc"], "img/s", rates["reference"],
              f"vs the reference ({rates['reference']:,.0f} img/s); CPU {cpu['dsc'] * 1e3:.2f} vs "
              f"{cpu['reference'] * 1e3:.2f} ms/img: {cpu['reference'] / cpu['dsc']:.1f}x; 1 thread "
              f"{rates['dsc-1']:,.0f} img/s (2 threads x{rates['dsc'] / rates['dsc-1']:.2f}; parallel controls "
              + ", ".join(f"{k} x{v:.2f}" for k, v in controls.items()) + f"); load {load}"))
    print(row("  same, against dsc's kernels per image", rates["dsc"], "img/s", rates["per-image"],
              f"vs dsc-per-image ({rates['per-image']:,.0f} img/s); CPU {cpu['per-image'] * 1e3:.2f} ms/img: "
              f"{cpu['per-image'] / cpu['dsc']:.1f}x"))
    return {"rates": rates, "cpu": cpu, "load": float(load), "control": control, "controls": controls}


def detection_ops(name: str) -> list:
    from dsc.transforms.presets import detection, recipe, yolo

    return detection("lsj", size=640) if name == "det-lsj" else yolo(320) if name == "yolo" else recipe(name)


_SCENES: dict = {}


def scenes(semantic: bool):
    """The detection benchmark's 400 COCO scenes of 400-640 px, compiled ragged once (cached on disk, opened once);
    ``semantic``: with a semantic mask (label + 1 per box)."""
    import dsc
    from dsc.synthetic import detection_scenes, write_coco

    if semantic not in _SCENES:
        root = cached("coco-400-seg" if semantic else "coco-400", lambda r: write_coco(r, detection_scenes(
            400, seed=0, size_range=(400, 640), ext=".jpg"), segmentation=semantic))
        out = BENCH_DIR / ("coco-400-semantic.dsc" if semantic else "coco-400-ragged.dsc")
        if not out.exists():
            dsc.compile_coco(root / "annotations.json", root / "images", out, progress=False,
                             **({"masks": "semantic"} if semantic else {}))
        _SCENES[semantic] = dsc.open(out)
    return _SCENES[semantic]


def main(argv=None) -> None:
    """``python bench_presets.py [--rounds N] [NAME ...]``: only the presets named (all of them without),
    the detection ones measured in N interleaved rounds (medians)."""
    import sys

    import bench_recipe

    args = list(sys.argv[1:] if argv is None else argv)
    rounds = pop_rounds(args)
    names = CLASSIFICATION + ("imagenet+mix",) + DETECTION
    if any(a.startswith("-") for a in args) or not set(args) <= set(names):
        print(f"usage: python bench_presets.py [--rounds N] [NAME ...]; NAME in {', '.join(names)}")
        raise SystemExit(0 if {"-h", "--help"} & set(args) else 2)
    only = set(args)
    load = f"{os.getloadavg()[0]:.2f}"
    print(f"reference recipes on CPU: {SAMPLES} samples per preset ({DET_SAMPLES} detection), 2 threads vs torch "
          f"DataLoader(2 workers) per image ({BASELINE_SAMPLES} detection), load {load}")
    cls = None
    for name in CLASSIFICATION + ("imagenet+mix",):
        if only and name not in only:
            continue
        cls = cls or bench_recipe.compiled(bench_recipe.sources(), "fixed", size=256)
        classification_row(cls, name)
    for name in DETECTION:
        if only and name not in only:
            continue
        detection_rows(name, scenes(semantic=name in SEMANTIC), detection_ops(name), 16, rounds)


if __name__ == "__main__":
    main()
