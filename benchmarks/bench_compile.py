"""Compile throughput at scale: images/s with 1 and 2 workers (parallel efficiency), with and without
JPEG draft mode, against a naive loop (PIL open, convert, resize, np.save) in the same run, and the
compile's peak RSS."""
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
    """One process: PIL open, convert to RGB, resize to 224x224 (bilinear), np.save. Images/s."""
    from PIL import Image

    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    for k, p in enumerate(paths):
        with Image.open(p) as im:
            arr = np.asarray(im.convert("RGB").resize((SIZE, SIZE), Image.Resampling.BILINEAR))
        np.save(out_dir / f"{k}.npy", arr)
    return len(paths) / (time.perf_counter() - t0)


def compile_run(src: Path, out: Path, workers: int, draft: bool) -> tuple[float, float]:
    """(images/s measured inside the compile, peak RSS in MB of the compile process tree)."""
    shutil.rmtree(out, ignore_errors=True)
    # VmHWM, not RUSAGE_SELF: ru_maxrss survives exec, so it would report this benchmark's own peak
    code = ("import dsc, resource as R, re; r = dsc.compile_imagefolder(%r, %r, size=%d, resize='stretch', workers=%d, "
            "draft=%r, progress=False); hwm = int(re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read())[1]); "
            "print(r.images_per_second, hwm, R.getrusage(R.RUSAGE_CHILDREN).ru_maxrss)") % (
        str(src), str(out), SIZE, workers, draft)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                       env={**os.environ, "PYTHONPATH": os.getcwd()})
    rate, main_kib, worker_kib = r.stdout.split()[-3:]
    return float(rate), (int(main_kib) + int(worker_kib) * (workers > 1)) / 1024  # main + largest worker


def main() -> None:
    src = imagenet_like(480)
    paths = sorted(src.rglob("*.jpg"))
    out = BENCH_DIR / "compile-scale.dsc"
    print(f"compile at scale: {len(paths)} ImageNet-like JPEGs (75% 500x375, 25% 800-1600 px) -> {SIZE}x{SIZE}")
    with tempfile.TemporaryDirectory() as tmp:
        naive = max(naive_loop(paths, Path(tmp) / f"n{k}") for k in range(2))
    print(row("naive loop: PIL open/convert/resize + np.save, 1 core", naive, "img/s", None, "(baseline)"))
    results = {}
    for draft in (False, True):
        for workers in (1, 2):
            rate, rss = max(compile_run(src, out, workers, draft) for _ in range(2))
            results[(workers, draft)] = rate
            print(row(f"dsc compile, {workers} worker(s){', --draft' if draft else ''}", rate, "img/s", naive,
                      f"per core {rate / workers / naive:.2f}x; peak RSS main+worker {rss:,.0f} MB"))
        eff = results[(2, draft)] / (2 * results[(1, draft)])
        print(f"  parallel efficiency{' (draft)' if draft else ''}: {eff:.0%}")


if __name__ == "__main__":
    main()
