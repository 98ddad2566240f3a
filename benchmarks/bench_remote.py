"""Remote datasets, against an S3 API server (moto) started here in its own process on loopback:

* a warm-cache epoch (every shard already in the local cache) against the same dataset read locally
  (the goal: at least 90%), for quasi_random batches of 256 and for random batches of 100 that each touch
  most of 60 small shards (600 images of 112x112 in shards of 10: the case where per-batch, per-shard
  bookkeeping would show);
* a cold epoch (empty cache: every shard downloaded, verified and mapped during the epoch) against a
  plain parallel download of the same objects with obstore (8 connections, streamed to files, nothing
  else; the goal: within 20% of it);
* the library choice: obstore against s3fs downloading the same objects (when s3fs is installed).

moto is a Python server: on this 2-core machine it competes with the loader for the cores, the same way
for both sides of each ratio.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from common import BENCH_DIR, scenes

SIZE = 128
BATCH = 256


def _dataset() -> Path:
    import dsc

    out = BENCH_DIR / f"remote-{SIZE}-4096.dsc"
    if not out.exists():
        src = scenes(16, 256, size_range=(48, 96))  # 4,096 small JPEGs
        dsc.compile_imagefolder(src, out, size=SIZE, resize="stretch", shard_size=128, progress=False)
    return out


def _many_shards() -> Path:
    """600 images of 112x112 in 60 shards of 10: a random batch of 100 touches most shards."""
    import dsc

    out = BENCH_DIR / "remote-112-600x10.dsc"
    if not out.exists():
        src = scenes(6, 100, size_range=(48, 96))
        dsc.compile_imagefolder(src, out, size=112, resize="stretch", shard_size=10, progress=False)
    return out


def _random_epochs(ds, epochs: int = 20) -> float:
    """Seconds per random-order epoch of batch 100 (one Loader, ``epochs`` epochs)."""
    import dsc

    loader = dsc.Loader(ds, batch_size=100, order="random", num_threads=2)
    t0 = time.perf_counter()
    for e in range(epochs):
        loader.set_epoch(e)
        for _ in loader:
            pass
    loader.close()
    return (time.perf_counter() - t0) / epochs


def _server(log=None, tls: bool = False, keep_alive: bool = False) -> tuple[subprocess.Popen, str]:
    """moto's S3 server in its own process; ``log``: a file its request log (one line a request) goes to. ``tls``:
    served over https with a certificate made up on the spot (a client must be told to accept it:
    ``AWS_ALLOW_INVALID_CERTIFICATES=true``), as a real bucket is reached. ``keep_alive``: the connections kept
    open between requests, as a bucket keeps them (moto_keepalive.py)."""
    import ssl

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # (keep_alive: moto's application with its connections kept open between requests, as a bucket keeps them:
    # see moto_keepalive.py; else werkzeug's server as moto runs it, one connection per request)
    cmd = ([sys.executable, str(Path(__file__).with_name("moto_keepalive.py")), str(port)] if keep_alive else
           [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)])
    proc = subprocess.Popen(cmd + (["--ssl"] if tls else []),
                            stdout=subprocess.DEVNULL, stderr=log if log is not None else subprocess.DEVNULL)
    endpoint = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
    context = ssl._create_unverified_context() if tls else None
    for _ in range(200):
        try:
            urllib.request.urlopen(endpoint + "/moto-api/", timeout=1, context=context)
            break
        except OSError:
            time.sleep(0.05)
    urllib.request.urlopen(urllib.request.Request(endpoint + "/bench", method="PUT"), context=context)
    return proc, endpoint


@contextlib.contextmanager
def _moto_s3():
    """``_server()`` with the bench's credentials and endpoint in the environment: yields (proc, endpoint);
    on leaving, the server is killed and the environment restored."""
    proc, endpoint = _server()
    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL")}
    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_ENDPOINT_URL=endpoint)
    try:
        yield proc, endpoint
    finally:
        proc.kill()
        proc.wait()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _epoch(ds, epochs: int = 1) -> float:
    """Seconds per epoch, over ``epochs`` epochs of one Loader."""
    import dsc

    loader = dsc.Loader(ds, batch_size=BATCH, order="quasi_random", window=4, num_threads=2)
    t0 = time.perf_counter()
    for e in range(epochs):
        loader.set_epoch(e)
        for _ in loader:
            pass
    return (time.perf_counter() - t0) / epochs


def _cpu(server_pid: int) -> np.ndarray:
    """(this process's CPU seconds, the server's): where a cold epoch's time goes on a 2-core machine."""
    from dsc.bench import proc_cpu

    return np.array([time.process_time(), proc_cpu(server_pid)])


def _raw_download(store, rels: list[str], dst: Path) -> float:
    """obstore, 8 parallel streams straight into files: what moving the bytes alone costs."""
    import obstore

    dst.mkdir(parents=True, exist_ok=True)

    def one(rel):
        with open(dst / rel.replace("/", "_"), "wb") as f:
            for chunk in obstore.get(store, rel).stream(min_chunk_size=1 << 21):
                f.write(chunk)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(8) as ex:
        list(ex.map(one, rels))
    return time.perf_counter() - t0


def _s3fs_download(endpoint: str, url: str, rels: list[str], dst: Path) -> float | None:
    try:
        import s3fs
    except ImportError:
        return None
    fs = s3fs.S3FileSystem(endpoint_url=endpoint, key="bench", secret="bench")
    base = url[5:]
    t0 = time.perf_counter()
    fs.get([f"{base}/{r}" for r in rels], [str(dst / r.replace("/", "_")) for r in rels])
    return time.perf_counter() - t0


def main() -> None:
    import dsc
    from dsc.compiler.upload import push
    from dsc.store import open_store
    from dsc.runtime.remote import warm

    local = _dataset()
    small = _many_shards()
    url = "s3://bench/remote"
    with _moto_s3() as (proc, endpoint):
        push(local, url, progress=False)
        push(small, url + "-small", progress=False)
        ds_local = dsc.open(local)
        specs = ds_local.manifest.shards
        total = sum(s.nbytes for s in specs)
        with tempfile.TemporaryDirectory(dir=BENCH_DIR) as tmp:
            tmp = Path(tmp)
            warm(url, tmp / "warm", progress=False)
            ds_warm = dsc.open(url, cache_dir=tmp / "warm")
            t_local, t_warm = [], []
            _epoch(ds_local), _epoch(ds_warm)  # (page cache and mappings warm for both)
            for _ in range(5):  # interleaved: both sides see the same machine
                t_local.append(_epoch(ds_local, 4))
                t_warm.append(_epoch(ds_warm, 4))
            warm(url + "-small", tmp / "warm", progress=False)
            small_local, small_warm = dsc.open(small), dsc.open(url + "-small", cache_dir=tmp / "warm")
            _random_epochs(small_local, 3), _random_epochs(small_warm, 3)
            small_pairs = []
            for _ in range(7):
                a, b = _random_epochs(small_local), _random_epochs(small_warm)
                small_pairs.append(a / b)
            t_cold, t_raw = [], []
            store = open_store(url)._store
            rels = [s.path for s in specs]
            cpu_raw, cpu_cold = [], []
            for k in range(5):  # pairs, alternating: the ratio is taken pair by pair
                shutil.rmtree(tmp / "raw", ignore_errors=True)
                c0 = _cpu(proc.pid)
                t_raw.append(_raw_download(store, rels, tmp / "raw"))
                cpu_raw.append(_cpu(proc.pid) - c0)
                ds_cold = dsc.open(url, cache_dir=tmp / f"cold{k}")
                c0 = _cpu(proc.pid)
                t_cold.append(_epoch(ds_cold))
                cpu_cold.append(_cpu(proc.pid) - c0)
                ds_cold.storage.close()
            t_s3fs = []
            for _ in range(3):
                shutil.rmtree(tmp / "s3fs", ignore_errors=True)
                (tmp / "s3fs").mkdir()
                t = _s3fs_download(endpoint, url, rels, tmp / "s3fs")
                if t is None:
                    break
                t_s3fs.append(t)
            t_ob = min(t_raw)
    n = len(ds_local)
    mb = total / 1e6
    print(f"remote: {n:,} images {SIZE}x{SIZE} ({mb:.0f} MB in {len(specs)} shards), batch {BATCH}, quasi_random; "
          f"S3 API server (moto) in its own process")
    print(f"  local epoch (baseline)                    {n / min(t_local):10,.0f} img/s")
    print(f"  warm-cache epoch from s3://               {n / min(t_warm):10,.0f} img/s   "
          f"{min(t_local) / min(t_warm):.0%} of local (goal: at least 90%)")
    small_pairs.sort()
    print(f"  warm-cache random epochs, 600 images 112x112 in 60 shards of 10, batch 100: "
          f"{small_pairs[len(small_pairs) // 2]:.0%} of local, median of {len(small_pairs)} pairs "
          f"(range {small_pairs[0]:.0%}-{small_pairs[-1]:.0%}; goal: at least 90%)")
    print(f"  plain obstore download, 8 streams (base)  {mb / t_ob:10,.0f} MB/s")
    pairs = sorted(r / c for r, c in zip(t_raw, t_cold))
    print(f"  cold epoch from s3:// (download+verify)   {mb / min(t_cold):10,.0f} MB/s   "
          f"{pairs[len(pairs) // 2]:.0%} of the plain download rate, median of {len(pairs)} pairs "
          f"(range {pairs[0]:.0%}-{pairs[-1]:.0%}; goal: at least 80%)")
    k_raw, k_cold = int(np.argmin(t_raw)), int(np.argmin(t_cold))
    print(f"    CPU seconds (this process + the server): plain download {cpu_raw[k_raw][0]:.2f} + "
          f"{cpu_raw[k_raw][1]:.2f} in {t_raw[k_raw]:.2f} s; cold epoch {cpu_cold[k_cold][0]:.2f} + "
          f"{cpu_cold[k_cold][1]:.2f} in {t_cold[k_cold]:.2f} s, on {os.cpu_count()} cores (the difference is the "
          f"SHA-256 check and the batches' gather)")
    if t_s3fs:
        print(f"  s3fs download of the same objects          {mb / min(t_s3fs):10,.0f} MB/s   "
              f"obstore is {min(t_s3fs) / t_ob:.2f}x faster")
    else:
        print("  (s3fs not installed: `make bench` installs it; by hand: pip install -e '.[bench]')")


if __name__ == "__main__":
    main()
