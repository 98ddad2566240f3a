"""Compile throughput at scale: images/s with 1 and 2 workers (parallel efficiency), with and without
JPEG draft mode and with either resizer, against a naive loop (PIL open, convert, resize, np.save) in the
same run, and the compile's peak RSS. Rates are end to end: they include start-up (the torch import of
--resizer torch, about a second here), staging, hashing and the final syncfs."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from common import BENCH_DIR, imagenet_like, row

SIZE = 224


def naive_loop(paths, out_dir: Path) -> float:
    """One process: PIL open, convert to RGB, resize to 224x224 (bilinear), np.save. Seconds."""
    from PIL import Image

    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    for k, p in enumerate(paths):
        with Image.open(p) as im:
            arr = np.asarray(im.convert("RGB").resize((SIZE, SIZE), Image.Resampling.BILINEAR))
        np.save(out_dir / f"{k}.npy", arr)
    return time.perf_counter() - t0


def decode_only(paths) -> float:
    """One process: the JPEG decode alone, at the draft scale a 224x224 output allows. Seconds. No pipeline
    built on libjpeg-turbo decodes less (its DCT scaling saves little here: the entropy decoding dominates)."""
    from PIL import Image

    t0 = time.perf_counter()
    for p in paths:
        with Image.open(p) as im:
            im.draft("RGB", (SIZE, SIZE))
            im.load()
    return time.perf_counter() - t0


def compile_run(src: Path, out: Path, workers: int, draft: bool, resizer: str) -> tuple[float, float, float]:
    """(seconds of the compile call, scan included; seconds of its one-off `import torch`, which the torch
    resizer needs and is timed apart so that its jitter stays out of the steady rate; peak RSS in MB of the
    compile process tree)."""
    shutil.rmtree(out, ignore_errors=True)
    # VmHWM, not RUSAGE_SELF: ru_maxrss survives exec, so it would report this benchmark's own peak
    code = ("import time, dsc, resource as R, re; t0 = time.perf_counter(); "
            "exec('import torch') if %r == 'torch' else None; t1 = time.perf_counter(); "
            "dsc.compile_imagefolder(%r, %r, size=%d, resize='stretch', workers=%d, draft=%r, resizer=%r, "
            "progress=False); t2 = time.perf_counter(); "
            "hwm = int(re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read())[1]); "
            "print(t2 - t1, t1 - t0, hwm, R.getrusage(R.RUSAGE_CHILDREN).ru_maxrss)") % (
        resizer, str(src), str(out), SIZE, workers, draft, resizer)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                       env={**os.environ, "PYTHONPATH": os.getcwd()})
    seconds, imports, main_kib, worker_kib = r.stdout.split()[-4:]
    return float(seconds), float(imports), (int(main_kib) + int(worker_kib) * (workers > 1)) / 1024


CONFIGS = [(False, "pil", ""), (True, "pil", ", --draft"), (True, "torch", ", --draft --resizer torch")]
N = int(os.environ.get("DSC_BENCH_COMPILE_N", "1920"))


def main() -> None:
    """Each configuration compiles the first n = N/8 images and all N (best of 3 each): the rate over N is end to end;
    the steady rate (N - n) / (T(N) - T(n)) leaves out what does not grow with the dataset (interpreter
    and torch start-up, staging, the final syncfs), which is what a compile of ImageNet's 1.28M images sees.
    The import of torch (--resizer torch) is timed apart and added to the end-to-end time only."""
    src = imagenet_like(N)
    n = N // 8
    small = imagenet_like(n)  # the same generator and seed: its images are the first n of src
    paths = sorted(src.rglob("*.jpg"))
    out = BENCH_DIR / "compile-scale.dsc"
    print(f"compile at scale: {len(paths)} ImageNet-like JPEGs (75% 500x375, 25% 800-1600 px) -> {SIZE}x{SIZE}")
    print(f"  (end to end over {N} images; steady: the extra {N - n} images over a compile of the first {n})")
    with tempfile.TemporaryDirectory() as tmp:
        t_all = min(naive_loop(paths, Path(tmp) / f"n{k}") for k in range(2))
    naive = N / t_all
    print(row("naive loop: PIL open/convert/resize + np.save, 1 core", naive, "img/s", None, "(baseline)"))
    decode = N / min(decode_only(paths) for _ in range(2))
    print(row("JPEG decode alone (draft scale), 1 core", decode, "img/s", naive,
              "the ceiling per core of any compile that decodes with libjpeg-turbo"))
    for draft, resizer, flags in CONFIGS:
        steady = {}
        for workers in (1, 2):
            (t_big, t_import, rss), (t_small, _, _) = (min(compile_run(s, out, workers, draft, resizer)
                                                           for _ in range(3)) for s in (src, small))
            steady[workers] = (N - n) / max(1e-9, t_big - t_small)
            end_to_end = N / (t_big + t_import)
            print(row(f"dsc compile, {workers} worker(s){flags}", end_to_end, "img/s", naive,
                      f"per core {end_to_end / workers / naive:.2f}x; steady {steady[workers]:,.0f} img/s, "
                      f"per core {steady[workers] / workers / naive:.2f}x; peak RSS main+worker {rss:,.0f} MB"
                      + (f"; import torch {t_import:.1f} s" if resizer == "torch" else "")))
        print(f"  parallel efficiency (steady){flags.replace(',', '', 1)}: {steady[2] / (2 * steady[1]):.0%}")


if __name__ == "__main__":
    main()
