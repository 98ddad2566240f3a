"""``dsc bench``: the Loader's epoch throughput beside two baselines measured in the same run.

(a) the machine's copy limit: ``torch.index_select`` of the same batches from the page-cache-mapped
    shards into a ring of as many output buffers as the loader keeps (one reused buffer would stay in
    the L3 cache and overstate the limit);
(b) the classic pipeline: torch ``DataLoader(num_workers=2)`` decoding the source JPEGs with PIL and
    applying the same resize, when the source files are still where the manifest says (worker start-up
    and the first batch not timed).
Also printed: the same gathers from as many threads as the loader uses, without the loader's queueing:
the loader's own overhead is the gap to that line.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass
class BenchResult:
    name: str
    images_per_s: float
    gb_per_s: float | None = None


def _best(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _ring(ds, loader) -> list[torch.Tensor]:
    """prefetch + 2 batch buffers, as many as the loader cycles through."""
    im = ds.manifest.image
    return [torch.empty((loader.batch_size, im.height, im.width, im.channels), dtype=torch.uint8)
            for _ in range(loader.prefetch + 2)]


def copy_limit(ds, loader) -> float:
    """Images/s of index_select-ing the loader's batches into a ring of prefetch+2 buffers."""
    ring = _ring(ds, loader)
    slots = len(ring)
    batches = loader.batch_indices()
    shards = [ds._shard(s) for s in range(len(ds.manifest.shards))]
    runs = [ds.shard_runs(idx) for idx in batches]

    def epoch():
        for k, batch_runs in enumerate(runs):
            out = ring[k % slots]
            for s, a, b, local in batch_runs:
                torch.index_select(shards[s], 0, torch.from_numpy(local), out=out[a:b])

    epoch()
    return sum(len(b) for b in batches) / _best(epoch, 3)


def threaded_take_limit(ds, loader) -> float:
    """Images/s of the same gathers (numpy.take, GIL released) from as many threads as the loader uses,
    into the same ring size, with no loader machinery: what the loader could reach at best."""
    from concurrent.futures import ThreadPoolExecutor

    ring = _ring(ds, loader)
    slots = len(ring)
    batches = loader.batch_indices()

    def epoch():
        with ThreadPoolExecutor(loader.threads_used) as pool:
            list(pool.map(lambda kb: ds.gather_images(kb[1], out=ring[kb[0] % slots][:len(kb[1])]),
                          enumerate(batches)))

    epoch()
    return sum(len(b) for b in batches) / _best(epoch, 3)


def loader_rate(loader, epochs: int = 3) -> float:
    def epoch():
        for _ in loader:
            pass

    epoch()  # map the shards, fault the ring in
    n = sum(len(b) for b in loader.batch_indices())
    return n / _best(epoch, epochs)


class _PILSource(torch.utils.data.Dataset):
    """The same images, decoded and resized with PIL per access (what dsc compiles away)."""

    def __init__(self, paths, manifest):
        self.paths, self.m = paths, manifest

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        from .compiler.decode import decode_image
        from .compiler.geometry import apply_plan, plan_fixed

        im = decode_image(self.paths[i], self.m.image.mode).image
        plan = plan_fixed(im.height, im.width, self.m.resize.size, self.m.resize.policy)
        return torch.tensor(apply_plan(im, plan, self.m.resize.fill, self.m.resize.filter))


def pil_dataloader_rate(ds, batch_size: int, limit: int = 1024) -> float | None:
    m = ds.manifest
    root = Path(m.source.get("images") or m.source.get("root") or "")  # COCO keys are relative to images/
    paths = [str(root / k) for k in ds.keys[:limit]]
    if m.image.layout != "fixed" or not paths or not Path(paths[0]).exists():
        return None
    dl = torch.utils.data.DataLoader(_PILSource(paths, m), batch_size=batch_size, num_workers=2, shuffle=True)
    it = iter(dl)
    next(it)  # worker start-up and the first batch are not timed
    t0 = time.perf_counter()
    n = sum(len(b) for b in it)
    return n / (time.perf_counter() - t0) if n else None


def run_bench(path, batch_size: int = 256, order: str = "random", num_threads: int = 2, prefetch: int = 3,
              epochs: int = 3, echo=print) -> dict:
    from .runtime import Loader, open as open_dataset

    ds = open_dataset(path)
    im = ds.manifest.image
    loader = Loader(ds, batch_size=batch_size, order=order, num_threads=num_threads, prefetch=prefetch)
    nbytes = im.sample_nbytes if im.layout == "fixed" else None
    shape = f"{im.height}x{im.width}x{im.channels}" if nbytes else "ragged"
    echo(f"dsc bench {path}: {len(ds):,} samples {shape}, batch {batch_size}, order {order}, "
         f"{loader.threads_used} threads, prefetch {prefetch}")
    gb = (lambda r: r * nbytes / 1e9) if nbytes else (lambda r: None)
    rate = loader_rate(loader, epochs)
    limit = copy_limit(ds, loader) if nbytes else None
    take = threaded_take_limit(ds, loader) if nbytes else None
    pil = pil_dataloader_rate(ds, batch_size)

    def line(name, r, note):
        g = gb(r)
        echo(f"  {name:<52} {r:>10,.0f} img/s {'' if g is None else f'{g:6.2f} GB/s'}  {note}")

    if limit:
        line(f"copy limit: index_select into a ring of {prefetch + 2} buffers", limit, "(baseline a)")
        line(f"same gathers, numpy.take from {loader.threads_used} threads, no loader", take,
             "(best the loader could do)")
    line("dsc.Loader", rate, f"{rate / limit:.0%} of the copy limit, {rate / take:.0%} of the threaded gathers"
         if limit else "")
    if pil:
        line("torch DataLoader(num_workers=2) + PIL decode/resize", pil, f"(baseline b) dsc is {rate / pil:,.0f}x")
    else:
        echo("  (baseline b skipped: it decodes the source files again, and they are not found where the manifest "
             "says, the source is a table or Python dataset, or the layout is ragged)")
    return {"loader": rate, "copy_limit": limit, "threaded_take": take, "pil_dataloader": pil, "gb_per_s": gb(rate)}
