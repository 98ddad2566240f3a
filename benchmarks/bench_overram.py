"""Data bigger than RAM: each order served by dsc.Loader (default options) beside the disk's own rates.

A 3.2 GB dataset of 224x224x3 uint8 samples (default 64 MiB shards) is read by processes confined to a memory
cgroup of 1 GiB (3x its limit in data) (cgroup v1 or v2; the page cache is charged to the cgroup, so the dataset does not fit in
memory, as ImageNet at 224 does not on most machines). Page cache cold before each run (every shard file's
pages dropped with POSIX_FADV_DONTNEED). Baselines, measured in the same run on the same files: a plain
sequential read (8 MiB reads, one thread) and one pread per random sample (8 and 16 threads). Reported per
run: MB/s served, bytes read from disk (/proc/self/io) per byte served, peak RSS, time to the first batch.

Needs root (to make the cgroup); elsewhere it says so and stops. ``python benchmarks/bench_overram.py``.
"""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import BENCH_DIR  # noqa: E402

N = 21_400  # 224x224x3: 3.22 GB, 3x the limit
LIMIT = 1 << 30  # the cgroup's memory limit
BATCH = 256
CG_NAME = f"dsc-bench-overram-{os.getpid()}"  # (one per run: two runs at once must not share a limit)
ROUNDS = int(os.environ.get("DSC_BENCH_ROUNDS", 3))
MODES = tuple(os.environ.get("DSC_BENCH_MODES", "seqread,loader-sequential,loader-quasi_random,pread8,pread16,"
                                                   "loader-random").split(","))


def _dataset() -> Path:
    out = BENCH_DIR / f"overram-{N}.dsc"
    if not out.exists():
        import torch

        import dsc

        class Arrays(torch.utils.data.Dataset):  # distinct samples, no decode: the build takes ~1 minute
            def __init__(self):
                self.base = np.random.default_rng(0).integers(0, 255, (256, 256, 3), dtype=np.uint8)

            def __len__(self):
                return N

            def __getitem__(self, i):
                y, x = i % 32, (i // 32) % 32
                return self.base[y:y + 224, x:x + 224], i % 10

        print(f"  building {out} ({N:,} samples of 224x224x3, ~{N * 150528 / 1e9:.1f} GB; once)...", flush=True)
        dsc.compile(Arrays(), out, size=224, progress=False)
    return out


def _shard_files(path: Path) -> list[Path]:
    import dsc

    ds = dsc.open(path)
    return [path / spec.path for spec in ds.manifest.shards if spec is not None]


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# ----------------------------------------------------------------------------- children (in the cgroup)
def _child(mode: str, path: Path) -> dict:
    from dsc.bench import disk_read_bytes, drop_page_cache

    files = _shard_files(path)  # (dsc.open: torch is imported in every mode)
    drop_page_cache(files)
    b0, t0 = disk_read_bytes(), time.perf_counter()
    first = None
    if mode == "seqread":
        buf = bytearray(8 << 20)
        served = 0
        for f in files:
            with open(f, "rb", buffering=0) as fh:
                while n := fh.readinto(buf):
                    served += n
    elif mode.startswith("pread"):
        from concurrent.futures import ThreadPoolExecutor

        threads = int(mode[5:])
        S = 224 * 224 * 3
        counts = [(os.path.getsize(f) - 4) // (S + 16) for f in files]
        rng = np.random.default_rng(0)
        picks = rng.permutation(sum(counts))[:12_000]
        starts = np.cumsum([0, *counts])
        fds = [os.open(f, os.O_RDONLY) for f in files]
        for fd in fds:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        bufs = [bytearray(S) for _ in range(threads)]

        def one(k):
            i = int(picks[k])
            s = int(np.searchsorted(starts, i, side="right") - 1)
            os.preadv(fds[s], [bufs[k % threads]], (i - int(starts[s])) * S)

        with ThreadPoolExecutor(threads) as ex:
            list(ex.map(one, range(len(picks)), chunksize=32))
        served = len(picks) * S
    else:
        import dsc

        order = mode.split("-", 1)[1]
        loader = dsc.Loader(dsc.open(path), batch_size=BATCH, order=order, device="cpu", num_threads=2)
        served = 0
        for b in loader:
            if first is None:
                first = time.perf_counter() - t0
            served += b["image"].numel()
        strategy = loader.read_strategy
        loader.close()
    dt = time.perf_counter() - t0
    out = {"mb_s": served / dt / 1e6, "ratio": (disk_read_bytes() - b0) / served, "rss": _peak_rss(), "first": first,
           "served": served}
    if mode.startswith("loader"):
        out["strategy"] = strategy
    return out


# ----------------------------------------------------------------------------- the parent
def _cgroup() -> Path | None:
    """A fresh memory cgroup limited to LIMIT (v2, else v1), or None where none can be made."""
    v2 = Path("/sys/fs/cgroup")
    if "memory" in (v2 / "cgroup.controllers").read_text().split() if (v2 / "cgroup.controllers").exists() else False:
        where = (v2 / CG_NAME, "memory.max")
    elif (v2 / "memory" / "memory.limit_in_bytes").exists():
        where = (v2 / "memory" / CG_NAME, "memory.limit_in_bytes")
    else:
        return None
    d, limit_file = where
    try:
        d.mkdir(exist_ok=True)
        (d / limit_file).write_text(str(LIMIT))
    except OSError:
        return None
    return d


def _run(cg: Path, mode: str, path: Path) -> dict:
    def enter():
        (cg / "cgroup.procs").write_text(str(os.getpid()))

    r = subprocess.run([sys.executable, __file__, "--child", mode, str(path)], preexec_fn=enter, capture_output=True,
                       text=True, timeout=900)
    if r.returncode != 0:
        raise RuntimeError(f"{mode} failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    path = _dataset()
    cg = _cgroup()
    gb = sum(f.stat().st_size for f in _shard_files(path)) / 1e9
    if cg is None:
        print(f"over-RAM: skipped (making a memory cgroup needs root and cgroup v1 or v2); the dataset is {path}")
        return
    print(f"over-RAM: {gb:.1f} GB dataset of 224x224x3 in 64 MiB shards, read under a {LIMIT / 2**30:.0f} GiB memory "
          f"cgroup ({gb / (LIMIT / 1e9):.1f}x its memory), page cache cold, batch {BATCH}, 2 threads, default options")
    rounds = []
    try:  # each round measures the baselines next to the runs they are compared with: ratios per round
        for _ in range(ROUNDS):
            rounds.append({m: _run(cg, m, path) for m in MODES})
    finally:
        try:
            cg.rmdir()
        except OSError:
            pass
    print(f"  medians of {ROUNDS} rounds; 'share' is the median of the rounds' ratios (range in brackets)")
    print(f"  {'':44} {'MB/s':>8} {'share of the disk':>30} {'read/served':>12} {'peak RSS':>9} {'first batch':>12}")
    names = {"seqread": "disk: sequential read of the shard files", "pread8": "disk: one pread per random sample, 8 thr",
             "pread16": "disk: one pread per random sample, 16 thr"}

    def med(v):
        v = sorted(v)
        return v[len(v) // 2]

    for m in rounds[0]:
        rs = [r[m] for r in rounds]
        share = ""
        if m.startswith("loader"):
            order = m.split("-", 1)[1]
            if ("pread8" if order == "random" else "seqread") not in rounds[0]:  # (a baseline left out: no share)
                shares = [float("nan")]
                what = "(no baseline run)"
            elif order == "random":
                shares = [r[m]["mb_s"] / max(r["pread8"]["mb_s"], r["pread16"]["mb_s"]) for r in rounds]
                what = "of the best random pread"
            else:
                shares = [r[m]["mb_s"] / r["seqread"]["mb_s"] for r in rounds]
                what = "of sequential read"
            share = f"{med(shares):.0%} [{min(shares):.0%}-{max(shares):.0%}] {what}"
            name = f"dsc.Loader {order} ({rs[0]['strategy']})"
        else:
            name = names[m]
        firsts = [r["first"] for r in rs if r["first"] is not None]
        first = f"{med(firsts):.2f} s" if firsts else "-"
        print(f"  {name:44} {med([r['mb_s'] for r in rs]):8,.0f} {share:>30} {max(r['ratio'] for r in rs):12.2f} "
              f"{max(r['rss'] for r in rs) / 1e9:7.2f} GB {first:>12}")
    print("  goals: sequential >= 85% and quasi_random >= 90% of the sequential read; random >= 75% of the best "
          "random pread; read/served <= 1.15; peak RSS <= 2 GB; first batch within 2 s. (The loaders read with "
          "two threads at once; the sequential baseline is one thread of 8 MiB reads, so a loader can pass it.)")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        print(json.dumps(_child(sys.argv[2], Path(sys.argv[3]))))
    else:
        main()
