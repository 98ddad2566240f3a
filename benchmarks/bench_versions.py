"""Versions: ``--update`` adding 10% new images against a full compile of the grown source (the baseline,
measured in the same run; the goal is at most 15%), and opening a dataset with 100 versions against one
with 1 (the goal: about the same, because opening reads one version record, never the log)."""
from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

from common import BENCH_DIR, best_of, imagenet_like

N = 1000  # images in version 0; the update adds N // 10
SIZE = 224


def _link_tree(paths: list[Path], src_root: Path, dst: Path) -> None:
    for p in paths:
        q = dst / p.relative_to(src_root)
        q.parent.mkdir(parents=True, exist_ok=True)
        os.link(p, q)


def update_vs_full() -> None:
    import dsc

    pool = imagenet_like(N + N // 10)
    paths = sorted(pool.rglob("*.jpg"))
    base, extra = paths[:N], paths[N:]
    opts = dict(size=SIZE, workers=2, progress=False)
    with tempfile.TemporaryDirectory(dir=BENCH_DIR) as tmp:
        tmp = Path(tmp)
        src = tmp / "src"
        _link_tree(base, pool, src)
        v0 = tmp / "v0"
        dsc.compile_imagefolder(src, v0, **opts)
        _link_tree(extra, pool, src)  # the source grows by 10%: new files in the class folders

        def full():
            out = tmp / "full"
            shutil.rmtree(out, ignore_errors=True)
            dsc.compile_imagefolder(src, out, **opts)

        times = []
        for _ in range(3):
            out = tmp / "upd"
            shutil.rmtree(out, ignore_errors=True)
            shutil.copytree(v0, out, copy_function=os.link)  # version 0 as compiled (shards shared, not copied)
            t0 = time.perf_counter()
            r = dsc.compile_imagefolder(src, out, update=True, **opts)
            times.append(time.perf_counter() - t0)
            assert r.committed and r.plan["decoded"] == len(extra), r.plan
        t_update = min(times)
        t_full = best_of(full, 3)
    print(f"versions: --update adding {len(extra)} images to {N} (ImageNet-like JPEGs -> {SIZE}x{SIZE}, 2 workers)")
    print(f"  full compile of the {N + len(extra)} images (baseline)   {t_full:8.2f} s")
    print(f"  --update decoding only the {len(extra)} new ones          {t_update:8.2f} s   "
          f"{t_update / t_full:.0%} of the full compile (goal: at most 15%)")


def open_cost() -> None:
    import dsc
    from dsc.synthetic import write_imagefolder

    with tempfile.TemporaryDirectory(dir=BENCH_DIR) as tmp:
        tmp = Path(tmp)
        src = tmp / "src"
        write_imagefolder(src, num_classes=8, per_class=250, size_range=(24, 40), seed=3)
        one, many = tmp / "one", tmp / "many"
        dsc.compile_imagefolder(src, one, size=32, progress=False)
        shutil.copytree(one, many)
        for k in range(99):  # 100 versions: each a restore of the previous one (a full record in the log)
            dsc.restore(many, version=k)

        def opens(path):
            return lambda: [dsc.open(path) for _ in range(20)]

        t1, t100 = best_of(opens(one), 5) / 20, best_of(opens(many), 5) / 20
    print(f"versions: dsc.open of a {2000}-sample dataset")
    print(f"  with 1 version (baseline)                     {t1 * 1e3:8.2f} ms")
    print(f"  with 100 versions                             {t100 * 1e3:8.2f} ms   {t100 / t1:.2f}x")


def main() -> None:
    BENCH_DIR.mkdir(parents=True, exist_ok=True)
    update_vs_full()
    open_cost()


if __name__ == "__main__":
    main()
