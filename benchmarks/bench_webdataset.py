"""WebDataset tars compiled where they live (issue 35), against an S3 API server (moto) in its own process:

* ``dsc compile webdataset`` of tars in the bucket against the same tars on local disk (the goal: at least 90%
  of the local compile's images per second), and of the bucket straight to a bucket;
* against ``webdataset``'s own reader decoding the same tars with the same resize (the per-epoch cost a
  WebDataset user pays today: a compile costs about one such epoch, and every epoch after it none), when
  the package is installed (``make bench`` installs it: the bench extra); else a plain ``tarfile`` + PIL loop,
  and the line says so.

Every side uses 2 processes (the machine's cores) and stores or returns 224x224 RGB by a plain stretch. moto is a
Python server: on a 2-core machine it competes with the compile for the cores.
"""
from __future__ import annotations

import io
import os
import shutil
import tempfile
import time
from multiprocessing import get_context
from pathlib import Path

from bench_remote import _cpu, _server
from common import BENCH_DIR, cached, row, scenes

SIZE = 224
WORKERS = 2


def _tars() -> list[Path]:
    from dsc.synthetic import pack_webdataset

    src = scenes(8, 125)  # 1,000 ImageNet-like JPEGs (300-500 px), 40-120 kB
    root = cached("webdataset-8x125", lambda root: pack_webdataset(src, root, per_tar=100))
    return sorted(root.glob("*.tar"))


def _compile(src: str, out: str, cache: Path) -> float:
    import dsc

    t0 = time.perf_counter()
    r = dsc.compile_webdataset(src, out, size=SIZE, resize="stretch", workers=WORKERS, progress=False,
                               cache_dir=str(cache))
    dt = time.perf_counter() - t0
    assert r.manifest.num_samples == 1000, r.manifest.num_samples
    return 1000 / dt


def _wds_epoch(tars: list[str]) -> int:
    """One pass of webdataset's reader over ``tars``: decode (PIL) and resize every image; the images seen."""
    import webdataset as wds
    from PIL import Image

    n = 0
    for im, _ in wds.WebDataset(tars, shardshuffle=False).decode("pil").to_tuple("jpg", "cls"):
        im.convert("RGB").resize((SIZE, SIZE), Image.BILINEAR)
        n += 1
    return n


def _tar_epoch(tars: list[str]) -> int:
    """The same with tarfile + PIL (when webdataset is not installed)."""
    import tarfile

    from PIL import Image

    n = 0
    for t in tars:
        with tarfile.open(t, "r|") as tf:
            for m in tf:
                if m.name.endswith(".jpg"):
                    im = Image.open(io.BytesIO(tf.extractfile(m).read()))
                    im.convert("RGB").resize((SIZE, SIZE), Image.BILINEAR)
                    n += 1
    return n


def _reader_rate(tars: list[Path]) -> tuple[float, str]:
    try:
        import webdataset  # noqa: F401
        fn, what = _wds_epoch, "webdataset's reader (decode pil + resize), 2 processes"
    except ImportError:
        fn, what = _tar_epoch, "tarfile + PIL decode + resize, 2 processes (webdataset is not installed)"
    halves = [[str(t) for t in tars[i::WORKERS]] for i in range(WORKERS)]
    with get_context("spawn").Pool(WORKERS) as pool:
        pool.map(fn, [[str(tars[0])]] * WORKERS)  # (imports and the first tar: warm, as the compiles are)
        t0 = time.perf_counter()
        n = sum(pool.map(fn, halves))
    return n / (time.perf_counter() - t0), what


def main() -> None:
    from dsc.store import open_store

    print(f"\nWebDataset tars where they live: 1,000 JPEGs (300-500 px) in 10 tars, compiled to {SIZE}x{SIZE} "
          f"with {WORKERS} workers; an S3 API server (moto) in its own process")
    tars = _tars()
    proc, endpoint = _server()
    old = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL",
                                          "AWS_DEFAULT_REGION")}
    os.environ.update({"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_ENDPOINT_URL": endpoint,
                       "AWS_DEFAULT_REGION": "us-east-1"})
    work = Path(tempfile.mkdtemp(prefix="bench-wds-", dir=BENCH_DIR))
    try:
        store = open_store("s3://bench")
        for t in tars:
            store.put(f"wds/{t.name}", t)
        local_src, remote_src = str(tars[0].parent), "s3://bench/wds/{00000..00009}.tar"
        rates = {"local": [], "s3": [], "s3->s3": []}
        server_cpu = {"local": [], "s3": [], "s3->s3": []}  # the S3 server's CPU seconds during each compile
        for k in range(3):  # alternating, best of 3 each
            for name, src, out in (("local", local_src, str(work / f"l{k}")), ("s3", remote_src, str(work / f"s{k}")),
                                   ("s3->s3", remote_src, f"s3://bench/out{k}")):
                before = _cpu(proc.pid)[1]
                rates[name].append(_compile(src, out, work / "cache"))
                server_cpu[name].append(_cpu(proc.pid)[1] - before)
                if not out.startswith("s3://"):
                    shutil.rmtree(out, ignore_errors=True)
        best = {k: max(v) for k, v in rates.items()}
        reader, what = _reader_rate(tars)
        print(row("compile, tars on local disk (baseline)", best["local"], "img/s"))
        cpu = {k: min(v) for k, v in server_cpu.items()}
        print(row("compile, tars in S3", best["s3"], "img/s", best["local"],
                  f"goal >= 0.90x; the S3 server used {cpu['s3']:.1f} CPU s of the 2 cores"))
        print(row("compile, tars in S3 -> dataset in S3", best["s3->s3"], "img/s", best["local"],
                  f"the S3 server used {cpu['s3->s3']:.1f} CPU s"))
        print(row(what, reader, "img/s", best["local"]))
        print(row("  the compile against that reader's epoch", best["local"], "img/s", reader,
                  "(one such epoch; dsc's epochs after it decode nothing)"))
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        proc.terminate()
        proc.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
