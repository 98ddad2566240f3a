"""The reference recipes (dsc.transforms.presets) on CPU: each preset through dsc.Loader (batched ops,
geometry fused into the gather) beside a torch DataLoader (2 persistent workers) that decodes the same
JPEGs with PIL and runs the same recipe per image with torch ops (what torchvision.transforms.v2 does per
sample; MixUp/CutMix in its collate, as torchvision's train.py), same run. Detection: dsc hands out
format="torchvision" (float CHW images) and the per-image side ends, as torchvision's DetectionPresetTrain,
with ToDtype(float, scale=True); a second line gives dsc's uint8 packed batches (what goes to a GPU, which
converts there) against the same per-image rates.

Detection, segmentation and YOLO have two per-image baselines, measured in the same run, interleaved
(``--rounds N``: medians of N rounds), each with its CPU time per image (this process and its 2 workers):
the goal's, a DataLoader running the preset AS ITS REFERENCE DOES (dsc.bench._ReferenceRecipe: torchvision's
references/detection and references/segmentation transforms on PIL images, Ultralytics' pipeline with a
mosaic of four decoded JPEGs; OpenCV's calls done with PIL where cv2 is not installed), and a stricter one
running dsc's own batched kernels on a batch of one image (dsc.bench._PerImageRecipe: a faster dsc kernel
speeds it too).

Classification: the recipe benchmark's 4,000 JPEGs of 256-384 px, compiled at 256 (fixed). Detection: the
detection benchmark's 400 JPEG scenes of 400-640 px with boxes, stored as decoded (ragged); segmentation:
the same scenes with a semantic mask. Timed: one epoch of SAMPLES (DET_SAMPLES) after a warm-up batch (dsc)
/ BASELINE_SAMPLES after the start-up batches (DataLoader)."""
from __future__ import annotations

import time

from common import BENCH_DIR, cached, row

SAMPLES = 1024
DET_SAMPLES = 512  # dsc's detection epochs (the slow presets run at tens of images/s on 2 shared cores)
BASELINE_SAMPLES = 256
CLASSIFICATION = ("imagenet", "ta_wide", "ra", "augmix", "autoaugment")
DETECTION = ("det-hflip", "det-multiscale", "det-ssdlite", "det-ssd", "det-lsj", "yolo", "segmentation")


def dsc_rate(ds, ops, batch_size: int, fmt: str, samples: int = SAMPLES, cpu: bool = False):
    """Images/s of one epoch of ``samples`` through dsc.Loader (2 threads); ``cpu``: (images/s, CPU ms per
    image of this process, every thread)."""
    import dsc

    loader = dsc.Loader(ds, batch_size=batch_size, order="random", num_threads=2, transforms=ops, format=fmt,
                        indices=range(min(samples, len(ds))))
    next(iter(loader))  # map the shards, warm the ring
    c0, t0, n = time.process_time(), time.perf_counter(), 0
    for b in loader:
        n += len(b[0]) if isinstance(b, tuple) else len(b["image_offsets"]) - 1 if "image_offsets" in b else \
            len(b["image"])
    rate = n / (time.perf_counter() - t0)
    return (rate, 1e3 * (time.process_time() - c0) / n) if cpu else rate


def _median(values):
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    k = len(values) // 2
    return values[k] if len(values) % 2 else (values[k - 1] + values[k]) / 2


def detection_rows(name, ds, ops, batch_size, rounds: int) -> None:
    """dsc (torchvision form; uint8 packed) against the reference-faithful per-image DataLoader (the goal's
    baseline) and the per-image DataLoader running dsc's own kernels on one image (stricter), interleaved
    over ``rounds``; medians; wall-time and CPU-time ratios."""
    from dsc.bench import baseline_rates

    fmt = "dict" if name in ("segmentation",) else "torchvision"
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
    load = open("/proc/loadavg").read().split()[0]

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


def main(argv=None) -> None:
    """``python bench_presets.py [--rounds N] [NAME ...]``: only the presets named (all of them without),
    the detection ones measured in N interleaved rounds (medians)."""
    import sys

    import dsc
    from dsc.bench import preset_dataloader_rate
    from dsc.synthetic import detection_scenes, write_coco
    from dsc.transforms.presets import detection, recipe, yolo

    import bench_recipe

    args = list(sys.argv[1:] if argv is None else argv)
    rounds = 1
    if "--rounds" in args:
        k = args.index("--rounds")
        rounds = int(args[k + 1])
        del args[k:k + 2]
    only = set(args)
    load = open("/proc/loadavg").read().split()[0]
    print(f"reference recipes on CPU: {SAMPLES} samples per preset ({DET_SAMPLES} detection), 2 threads vs torch "
          f"DataLoader(2 workers) per image ({BASELINE_SAMPLES} detection), load {load}")
    cls = None
    for name in CLASSIFICATION:
        if only and name not in only:
            continue
        cls = cls or bench_recipe.compiled(bench_recipe.sources(), "fixed", size=256)
        ops = recipe(name)
        rate = dsc_rate(cls, ops, 128, "dict")
        base = preset_dataloader_rate(cls, ops, 128, limit=SAMPLES // 2)
        print(row(f"{name} (fixed 256 -> 224)", rate, "img/s", base, f"vs per-image ({base or 0:,.0f} img/s)"))
    if only and not only & set(DETECTION):
        return
    root = cached("coco-400", lambda r: write_coco(r, detection_scenes(400, seed=0, size_range=(400, 640),
                                                                        ext=".jpg")))
    out = BENCH_DIR / "coco-400-ragged.dsc"
    if not out.exists():
        dsc.compile_coco(root / "annotations.json", root / "images", out, progress=False)
    det = dsc.open(out)
    for name in DETECTION:
        if only and name not in only:
            continue
        if name == "segmentation":  # the same scenes with a semantic mask (label + 1 per box)
            seg_root = cached("coco-400-seg", lambda r: write_coco(r, detection_scenes(
                400, seed=0, size_range=(400, 640), ext=".jpg"), segmentation=True))
            seg_out = BENCH_DIR / "coco-400-semantic.dsc"
            if not seg_out.exists():
                dsc.compile_coco(seg_root / "annotations.json", seg_root / "images", seg_out, masks="semantic",
                                 progress=False)
            detection_rows(name, dsc.open(seg_out), recipe(name), 16, rounds)
            continue
        ops = detection("lsj", size=640) if name == "det-lsj" else yolo(320) if name == "yolo" else recipe(name)
        detection_rows(name, det, ops, 16, rounds)


if __name__ == "__main__":
    main()
