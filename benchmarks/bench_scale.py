"""Many shards: what opening a dataset costs as its shard count grows (the simulation of issue 34: one tiny
sample per shard, so the metadata is all there is).

For each shard count: the compile's fixed cost per shard ((time - time of the smallest) / (shards - its
shards)), in wall time and in CPU time (user + system of the compiling process: on a shared machine the wall
time is mostly waiting for a core and for the disk's inode creation), and the files and folders it made per
shard; then, in a fresh process each: ``dsc.open`` (seconds, and bytes read by read calls, /proc/self/io
``rchar``), the first random batch of 256 (seconds), RSS after both against a process that only imported dsc,
and the metadata on disk (JSON: the root zarr.json with the manifest, the version records, every other
*.json; table: a columnar per-shard table, where the format has one). Goals (issue 34, at 1M shards):
open <= 1 s, <= 200 MB RSS per process, first batch <= 2 s, bytes read at open independent of the
shards, compile's fixed cost <= 0.5 ms a shard.

``DSC_BENCH_SHARDS`` (default ``1024,32768,1048576``, the issue's counts) picks the counts (each dataset is
compiled once and kept under build/bench, with its compile's timing stamp: delete both for a fresh compile).
1M shards are 4M files and folders (a fixed shard is ``image/c/<s>/0/0/0``) and ~16 GB on disk: this bench's
2-core machine compiles them in about 8 minutes when it is quiet (and deletes them in several more);
``DSC_BENCH_SHARDS=1024,32768,131072`` is a quicker run. The baseline (below) is compiled only up to
``DSC_BENCH_BASELINE_MAX`` shards (default 131,072: the older formats take about an hour at 1M).
``DSC_BENCH_LAYOUT=ragged`` compiles the same samples in the ragged layout (``max_side``: each shard a Zarr
array of its own, whose ``zarr.json`` the manifest once listed).
``DSC_BENCH_BASELINE`` (a dsc source tree, e.g. the checkout of the commit before the shard table) compiles
and opens the same simulation with that code too, in the same run, each row beside its baseline; unset, the
baseline is the ``dsc`` package of the git revision ``DSC_BENCH_BASELINE_REV`` (default ``b636065``, the
commit before the compile's per-shard cost was cut and a ragged shard's zarr.json became implied), exported
once under build/bench (none, with a note, outside a git checkout; ``DSC_BENCH_BASELINE_REV=`` for none).
``python benchmarks/bench_scale.py``.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import BENCH_DIR  # noqa: E402

SHARDS = [int(x) for x in os.environ.get("DSC_BENCH_SHARDS", "1024,32768,1048576").split(",")]
BASELINE_MAX = int(os.environ.get("DSC_BENCH_BASELINE_MAX", 131072))


LAYOUT = os.environ.get("DSC_BENCH_LAYOUT", "fixed")
BASELINE = os.environ.get("DSC_BENCH_BASELINE")
BASELINE_REV = os.environ.get("DSC_BENCH_BASELINE_REV", "b636065")
HERE = str(Path(__file__).resolve().parents[1])


def _baseline() -> str | None:
    """The baseline's source tree: ``DSC_BENCH_BASELINE``, else the dsc package of ``BASELINE_REV`` exported from
    git once under build/bench (None when there is no such revision)."""
    if BASELINE or not BASELINE_REV:
        return BASELINE
    dst = (BENCH_DIR / f"src-{BASELINE_REV}").resolve()
    if not (dst / "dsc" / "__init__.py").is_file():
        dst.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "-C", HERE, "archive", BASELINE_REV, "dsc"], capture_output=True)
        if archive.returncode != 0 or subprocess.run(["tar", "-x", "-C", str(dst)], input=archive.stdout,
                                                     capture_output=True).returncode != 0:
            print(f"  (no baseline: git revision {BASELINE_REV} is not in {HERE})")
            return None
    return str(dst)


def _env(code: str) -> dict:
    """The environment of a child process that imports dsc from the source tree ``code``."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([code, *sys.path])}


def _compile(n: int, out: str) -> str:
    """(In a child process) compile the simulation of ``n`` shards into ``out``; its seconds, wall and CPU."""
    import shutil

    import torch

    import dsc

    class Tiny(torch.utils.data.Dataset):
        def __len__(self):
            return n

        def __getitem__(self, i):
            return np.full((2, 2, 3), i % 251, np.uint8), i % 10

    shutil.rmtree(out, ignore_errors=True)
    t0, c0 = time.perf_counter(), time.process_time()
    dsc.compile(Tiny(), out, **(dict(size=2) if LAYOUT == "fixed" else dict(max_side=2)), shard_size=1,
                progress=False, workers=1)
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return f"{time.perf_counter() - t0} {time.process_time() - c0} {peak}"


def _build(n: int, code: str = HERE, name: str = "") -> tuple[Path, float, float | None, int | None]:
    """The simulation of ``n`` shards compiled by the dsc at ``code`` (built once, kept under build/bench)
    and its compile's seconds (wall, CPU) and peak RSS (None in a stamp that predates them)."""
    kind = "" if LAYOUT == "fixed" else f"-{LAYOUT}"
    out = BENCH_DIR / f"scale{kind}{name}-{n}.dsc"
    stamp = BENCH_DIR / f"scale{kind}{name}-{n}.seconds"
    if not (out.exists() and stamp.exists()):
        print(f"  compiling {n:,} shards of one 2x2 sample{f' ({name})' if name else ''} (once)...", flush=True)
        BENCH_DIR.mkdir(parents=True, exist_ok=True)
        r = subprocess.run([sys.executable, __file__, "--compile", str(n), str(out)], capture_output=True, text=True,
                           env=_env(code), timeout=24 * 3600)
        if r.returncode != 0:
            raise RuntimeError(r.stderr[-3000:])
        stamp.write_text(r.stdout.strip().splitlines()[-1])
    wall, *more = stamp.read_text().split()
    return out, float(wall), float(more[0]) if more else None, int(more[1]) if len(more) > 1 else None


def _rchar() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    return 0


def _rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _child(path: str | None) -> dict:
    import numpy.random  # noqa: F401 - (imported lazily by an order or by dsc.open: not what this measures)
    import torch  # noqa: F401 - (imported by dsc.open anyway: the baseline process holds it too)

    import dsc

    if path is None:
        return {"rss": _rss()}
    r0, t0 = _rchar(), time.perf_counter()
    ds = dsc.open(path)
    t_open, read = time.perf_counter() - t0, _rchar() - r0
    loader = dsc.Loader(ds, batch_size=256, order="random", num_threads=1)
    t0 = time.perf_counter()
    next(iter(loader))
    return {"open": t_open, "read": read, "first": time.perf_counter() - t0, "rss": _rss()}


def _measure(path: Path | None, code: str = HERE) -> dict:
    r = subprocess.run([sys.executable, __file__, "--child", str(path) if path else "-"], capture_output=True,
                       text=True, timeout=3600, env=_env(code))
    if r.returncode != 0:
        raise RuntimeError(r.stderr[-3000:])
    return json.loads(r.stdout.strip().splitlines()[-1])


def _metadata_bytes(path: Path) -> tuple[int, int, int]:
    """(JSON bytes, table bytes, root bytes) of a dataset's metadata: every *.json (a ragged shard's own
    zarr.json, beside it, included), its shard table's objects (format 4: the objects that start with the table's
    magic), and the root zarr.json with the version records (the manifest: what dsc.open reads)."""
    js = sum(p.stat().st_size for p in path.rglob("*.json"))
    root = (path / "zarr.json").stat().st_size + sum(p.stat().st_size for p in (path / "_dsc" / "log").glob("*.json"))
    table = 0
    for p in (path / "_dsc" / "objects").rglob("*"):
        if p.is_file():
            with open(p, "rb") as f:
                if f.read(8) == b"DSCSHTAB":
                    table += p.stat().st_size
    return js, table, root


def _entries(path: Path) -> int:
    """Files and folders under ``path`` (what the compile created)."""
    return sum(len(dirs) + len(files) for _, dirs, files in os.walk(path))


def main() -> None:
    baseline = _baseline()
    codes = [("", HERE)] + ([("-baseline", baseline)] if baseline else [])
    print(f"many shards (one 2x2 sample a shard, {LAYOUT} layout; each open in a fresh process; RSS against a "
          f"process that imported dsc and torch only"
          + (f"; each row beside the same with the dsc at {baseline} (baseline), same run" if baseline else "") + ")")
    print(f"  {'shards':>10} {'code':>9} {'JSON on disk':>13} {'root+log':>9} {'table':>9} {'read at open':>13} "
          f"{'dsc.open':>9} {'first batch':>12} {'RSS +':>8} {'compile / shard':>16} {'CPU / shard':>12} "
          f"{'files / shard':>14} {'compile RSS':>12}")
    bases = {name: _measure(None, code) for name, code in codes}
    first: dict = {}
    for n in SHARDS:  # (each count: the baseline's compile and open, then this code's, so both see the same load)
        for name, code in codes:
            if name and n > BASELINE_MAX:
                continue
            path, seconds, cpu, peak = _build(n, code, name)
            m, (js, table, root), entries = _measure(path, code), _metadata_bytes(path), _entries(path)
            n0, s0, c0, e0 = first.setdefault(name, (n, seconds, cpu, entries))
            per = f"{(seconds - s0) / (n - n0) * 1e3:.2f} ms" if n > n0 else f"({seconds / n * 1e3:.2f} ms)"
            per_cpu = ("-" if cpu is None or c0 is None else f"{(cpu - c0) / (n - n0) * 1e3:.2f} ms" if n > n0
                       else f"({cpu / n * 1e3:.2f} ms)")
            per_files = f"{(entries - e0) / (n - n0):.2f}" if n > n0 else f"({entries / n:.2f})"
            print(f"  {n:>10,} {name.strip('-') or 'this':>9} {js / 1e6:>10.1f} MB {root / 1e6:>6.2f} MB "
                  f"{table / 1e6:>6.1f} MB "
                  f"{m['read'] / 1e6:>10.1f} MB {m['open']:>7.2f} s {m['first']:>10.2f} s "
                  f"{(m['rss'] - bases[name]['rss']) / 1e6:>5.0f} MB {per:>16} {per_cpu:>12} {per_files:>14} "
                  f"{'-' if peak is None else f'{peak / 1e6:.0f} MB':>12}   "
                  f"(load {os.getloadavg()[0]:.1f})", flush=True)
    print("  goals at 1M shards: dsc.open <= 1 s, RSS <= 200 MB a process, first batch <= 2 s, read at open "
          "independent of the shards, compile <= 0.5 ms a shard (fixed cost)")


if __name__ == "__main__":
    if len(sys.argv) > 3 and sys.argv[1] == "--compile":
        print(_compile(int(sys.argv[2]), sys.argv[3]))
    elif len(sys.argv) > 2 and sys.argv[1] == "--child":
        print(json.dumps(_child(None if sys.argv[2] == "-" else sys.argv[2])))
    else:
        main()
