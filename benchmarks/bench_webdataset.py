"""Compiles where the data lives (issue 35), against an S3 API server (moto) in its own process:

* ``dsc compile webdataset`` of tars in the bucket against the same tars on local disk (the goal: at least 90%
  of the local compile's images per second), and of the bucket straight to a bucket, over http and again over
  https (a second server, with a certificate made up on the spot): a real bucket is reached over TLS, where dsc
  signs its puts UNSIGNED-PAYLOAD and TLS encrypts the bodies, while over http SigV4 hashes each body it signs;
* ``dsc compile table`` of a Parquet file in the bucket (row groups read by range) against the same file on
  local disk;
* against ``webdataset``'s own reader decoding the same tars with the same resize (the per-epoch cost a
  WebDataset user pays today: a compile costs about one such epoch, and every epoch after it none), when
  the package is installed (``make bench`` installs it: the bench extra); else a plain ``tarfile`` + PIL loop,
  and the line says so.

Every side uses 2 processes (the machine's cores) and stores or returns 224x224 RGB by a plain stretch. The runs
are interleaved, 3 rounds (``BENCH_ROUNDS=5``: more), each printing its wall seconds; each ratio is taken against
the local compile of its own round (before them, one small compile of each kind: no first round pays alone what a
process does once; after each run, its output in the bucket is deleted: every round's server holds the inputs
only). moto is a Python server in its own process: on a 2-core machine it competes with the compile for the cores
(moto_keepalive.py serves a range of an object without reading the whole object, as moto does: a Parquet row group
cost it the file), so each run also says what dsc's CPU per image was (this process: scan, uploads,
commit; its workers: decoding), against the local compile's in the same round, the workers' page faults (a worker
forked fresh to read a bucket starts with an empty heap: units.keep_heap), and the server's CPU seconds and
requests (by method, the connections they came on, and the MB the server served and stored: what a compile costs
the bucket, counted, where wall ratios on a shared machine are not). dsc's own cost against the local compile's is the CPU ratio; the wall ratio stays the measured one, and
the summary adds beside it an estimate of the wall ratio were the server's CPU seconds on other cores (the wall
time less the server's CPU shared by the cores).

The server keeps each connection open for the next request, as S3, GCS and Azure do (moto_keepalive.py: moto's
application behind a keep-alive HTTP/1.1 server). moto's own server (werkzeug's) closes every connection, so a
client paid a TCP connection and, over https, a TLS handshake for every request (124 connections for the 153
requests of one S3 -> S3 compile; 16 kept alive), which no bucket charges; ``BENCH_MOTO_CLOSE=1`` measures against
that server still.
"""
from __future__ import annotations

import io
import os
import shutil
import tempfile
import time
from multiprocessing import get_context
from pathlib import Path

import numpy as np
from bench_remote import _cpu, _server
from common import BENCH_DIR, cached, row, scenes

from dsc.bench import proc_cpu
from dsc.compiler import upload

SIZE = 224
WORKERS = 2
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))  # (more on a quieter machine: BENCH_ROUNDS=5)
# the server keeps its connections open between requests, as a bucket does (moto_keepalive.py); BENCH_MOTO_CLOSE=1:
# moto's own server, which closes every connection (a new TCP connection, over https a TLS handshake, a request)
KEEP_ALIVE = not os.environ.get("BENCH_MOTO_CLOSE")


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
    upload.unstaged()  # (as in the rounds below)
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


def _parquet(tars: list[Path]) -> Path:
    """The same 1,000 JPEGs as a Parquet file (image bytes, label), in row groups of 100."""
    def build(root: Path) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        from dsc.compiler.sources.webdataset import index_tar

        images, labels = [], []
        for t in tars:
            data = t.read_bytes()
            for smp in index_tar(str(t), ("jpg",), "cls", None)[0]:
                _, off, n = smp.image
                images.append(data[off:off + n])
                labels.append(smp.label)
        root.mkdir(parents=True)
        pq.write_table(pa.table({"image": images, "label": labels}), root / "images.parquet", row_group_size=100)

    return cached("parquet-8x125", build) / "images.parquet"


def _dsc_cpu(servers) -> tuple[float, float, int]:
    """(this process's CPU seconds: the scan, the uploads, the client's bookkeeping; its workers'; its workers' page
    faults): the workers are children it has reaped (forked from it), or children the fork server reaped (a compile
    from a bucket forks its workers from it: a child of this process, as the server is, which is left out). Read,
    not sampled: a compile's workers are reaped when it returns, and nothing polls while it runs."""
    import resource

    t = os.times()
    workers = t.children_user + t.children_system
    faults = resource.getrusage(resource.RUSAGE_CHILDREN).ru_minflt
    me = str(os.getpid())
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and int(entry.name) not in servers:
            try:
                with open(f"/proc/{entry.name}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                if fields[1] == me:  # (field 4: the parent)
                    workers += proc_cpu(int(entry.name), children=True)
                    faults += int(fields[8])  # (field 11: the minor faults of the children it reaped)
            except (OSError, IndexError, ValueError):  # (gone meanwhile)
                pass
    return t.user + t.system, workers, faults


def _ms(run: tuple) -> float:
    """dsc's CPU milliseconds per image of a run (this process's and its workers')."""
    return (run[1] + run[2]) / 1000 * 1000


def _requests(log: Path, start: int) -> tuple[dict, int]:
    """(what the server logged since line ``start``: {"n": requests, "GET"/"PUT"/...: requests of that method
    ("LIST": a GET of a bucket's listing), "in"/"out": MB sent to it and by it, "conns": the connections they
    came on (moto_keepalive.py logs them; 0 with moto's own server)}, lines now)."""
    lines = log.read_text(errors="replace").splitlines()
    seen = {"n": 0, "in": 0.0, "out": 0.0}
    conns = set()
    for line in lines[start:]:
        if "HTTP/1.1" not in line or '"' not in line:
            continue
        seen["n"] += 1
        method, _, target = line.split('"')[1].partition(" ")
        if method == "GET" and ("list-type" in target or target.split(" ")[0].rstrip("/").count("/") <= 1):
            method = "LIST"
        seen[method] = seen.get(method, 0) + 1
        for part in line.split()[-3:]:
            k, _, v = part.partition("=")
            if k in ("in", "out") and v.isdigit():
                seen[k] += int(v) / 1e6
            elif k == "conn":
                conns.add(v)
    seen["conns"] = len(conns)
    return seen, len(lines)


def _said(seen: dict) -> str:
    """A run's requests as a line: their number, by method, and the MB each way."""
    methods = ", ".join(f"{k} {v}" for k, v in sorted(seen.items()) if k not in ("n", "in", "out", "conns"))
    return (f"{seen['n']} requests ({methods}) on {seen.get('conns', 0)} connections, {seen['out']:.1f} MB served, "
            f"{seen['in']:.1f} MB stored")


def _drop(url: str) -> None:
    """Delete every object under ``url`` (a round's output in the bucket): moto keeps every object in its process's
    memory, so without this each round's server holds one more compiled set (150 MB) than the last one's did."""
    from dsc.store import open_store

    store = open_store(url)
    for rel, *_ in store.list_detailed(""):
        store.delete(rel)


def _warm(work: Path, parquet: Path, use) -> None:
    """One small compile of each kind the rounds run, before them, so that no first round pays alone what a process
    does once (the fork server a compile from a bucket forks its workers from, pyarrow's import, the upload
    threads, the first TLS connections): one tar from the bucket to local disk and to the bucket over http and
    https, and the first 100 rows of the Parquet file from the bucket. ``use(via)``: the server's variables set."""
    import dsc
    import pyarrow.parquet as pq
    from dsc.store import open_store

    use("http")
    small = work / "warm.parquet"
    pq.write_table(pq.read_table(parquet).slice(0, 100), small)
    open_store("s3://bench").put("table/warm.parquet", small)
    opts = dict(size=SIZE, resize="stretch", workers=WORKERS, progress=False, cache_dir=str(work / "cache"))
    dsc.compile_webdataset("s3://bench/wds/00000.tar", str(work / "warm"), **opts)
    dsc.compile_table("s3://bench/table/warm.parquet", str(work / "warm-table"), **opts)
    for via, src in (("http", "s3://bench/wds/00000.tar"), ("https", "s3://bench/wdss/00000.tar")):
        use(via)
        dsc.compile_webdataset(src, f"s3://bench/warm-{via}", **opts)
        upload.unstaged()
        _drop(f"s3://bench/warm-{via}")


def main() -> None:
    import dsc
    from dsc.store import open_store

    print(f"\nCompiles where the data lives: 1,000 JPEGs (300-500 px) as 10 WebDataset tars and as one Parquet file "
          f"(row groups of 100), compiled to {SIZE}x{SIZE} with {WORKERS} workers; an S3 API server (moto) in its "
          f"own process on the same {os.cpu_count()} cores, "
          f"{'connections kept alive, as a bucket keeps them' if KEEP_ALIVE else 'a connection a request (BENCH_MOTO_CLOSE)'}")
    tars = _tars()
    parquet = _parquet(tars)
    work = Path(tempfile.mkdtemp(prefix="bench-wds-", dir=BENCH_DIR))
    # two servers: plain http (where S3's SigV4 hashes each body it signs), and https, as a real bucket is reached
    # (where dsc signs UNSIGNED-PAYLOAD and TLS encrypts the bodies instead); the https one only for S3 -> S3
    servers = {}
    for name in ("http", "https"):
        with open(work / f"{name}.log", "w") as logf:
            proc, endpoint = _server(logf, tls=name == "https", keep_alive=KEEP_ALIVE)
        servers[name] = (proc, work / f"{name}.log", {
            "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_ENDPOINT_URL": endpoint,
            "AWS_DEFAULT_REGION": "us-east-1", "AWS_ALLOW_INVALID_CERTIFICATES": "true" if name == "https" else None})
    pids = {proc.pid for proc, _, _ in servers.values()}
    old = {k: os.environ.get(k) for k in servers["https"][2]}

    def use(name: str) -> None:
        for k, v in servers[name][2].items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    try:
        use("https")
        store = open_store("s3://bench")
        for t in tars:
            store.put(f"wdss/{t.name}", t)
        use("http")
        store = open_store("s3://bench")
        for t in tars:
            store.put(f"wds/{t.name}", t)
        store.put("table/images.parquet", parquet)
        tar_src, s3_tars = str(tars[0].parent), "s3://bench/wds/{00000..00009}.tar"
        runs = [("tars, local disk", "webdataset", tar_src, None, "http"),
                ("tars in S3", "webdataset", s3_tars, None, "http"),
                ("tars in S3 -> dataset in S3", "webdataset", s3_tars, "s3", "http"),
                ("the same over https", "webdataset", "s3://bench/wdss/{00000..00009}.tar", "s3", "https"),
                ("Parquet, local disk", "table", str(parquet), None, "http"),
                ("Parquet in S3", "table", "s3://bench/table/images.parquet", None, "http")]
        local = {"webdataset": "tars, local disk", "table": "Parquet, local disk"}  # each run's baseline
        seen: dict[str, list] = {name: [] for name, *_ in runs}  # (img/s, client CPU s, workers' CPU s, server CPU s,
        #                                                          requests, load average, workers' page faults)
        _warm(work, parquet, use)  # (what a process does once, done before the rounds)
        for k in range(ROUNDS):  # interleaved rounds: every run of a round sees about the same machine
            print(f"  round {k + 1}: uptime {' '.join(os.popen('uptime').read().split()[-5:])}")
            for name, kind, src, to, via in runs:
                use(via)
                proc, log, _ = servers[via]
                out = f"s3://bench/out-{kind}-{via}-{k}" if to else str(work / f"{kind}-{k}")
                (c0, w0, f0), s0, (_, n0) = _dsc_cpu(pids), _cpu(proc.pid)[1], _requests(log, 0)
                t0 = time.perf_counter()
                fn = dsc.compile_webdataset if kind == "webdataset" else dsc.compile_table
                r = fn(src, out, size=SIZE, resize="stretch", workers=WORKERS, progress=False,
                       cache_dir=str(work / "cache"))
                upload.unstaged()  # (the staging's removal on its thread counted: a CLI process waits for it at exit)
                dt = time.perf_counter() - t0
                assert r.manifest.num_samples == 1000, r.manifest.num_samples
                c1, w1, f1 = _dsc_cpu(pids)
                seen[name].append((1000 / dt, c1 - c0, w1 - w0, _cpu(proc.pid)[1] - s0, _requests(log, n0)[0],
                                   os.getloadavg()[0], f1 - f0))
                a, base = seen[name][k], seen[local[kind]][k]
                print(f"    {name:<30} {dt:5.2f} s {a[0]:7.1f} img/s {a[0] / base[0]:5.2f}x of local; "
                      f"dsc {_ms(a):5.2f} ms CPU/img "
                      f"(client {a[1]:4.2f} s, workers {a[2]:4.2f} s, {a[6]:,} page faults; {_ms(base) / _ms(a):4.2f}x "
                      f"local's), server "
                      f"{a[3]:4.2f} CPU s, {_said(a[4])}, load {a[5]:.1f}")
                if not to:
                    shutil.rmtree(out, ignore_errors=True)
                else:  # (out of the timing: each round's server holds the inputs only, as the first round's did)
                    _drop(out)
        reader, what = _reader_rate(tars)
        print(f"  best of {ROUNDS} (each ratio: the median of the rounds' ratios to the local compile of their "
              f"round; CPU: "
              "dsc's own, this process and its workers, per image, local's over this one's)")
        for name, kind, *_ in runs:
            base = seen[local[kind]]
            ratios = sorted(a[0] / b[0] for a, b in zip(seen[name], base))
            mid = len(ratios) // 2
            if seen[name] is base:
                extra = (f"(baseline) dsc {np.median([_ms(a) for a in base]):.2f} ms CPU/img, "
                         f"{np.median([1000 / a[0] for a in base]):.2f} s wall")
            else:
                # what the server's CPU would free were it on other cores: its seconds off this compile's wall time
                # shared by the cores (an estimate, beside the measured ratio, not instead of it)
                freed = sorted(1000 / (1000 / a[0] - a[3] / os.cpu_count()) / b[0] for a, b in zip(seen[name], base))
                cpu = sorted(_ms(b) / _ms(a) for a, b in zip(seen[name], base))
                extra = (f"rounds {', '.join(f'{a[0] / b[0]:.2f}' for a, b in zip(seen[name], base))}; dsc CPU "
                         f"{np.median(cpu):.2f}x of local's (rounds {cpu[0]:.2f}-{cpu[-1]:.2f}; "
                         f"{np.median([_ms(a) for a in seen[name]]):.2f} ms/img; client "
                         f"{np.median([a[1] - b[1] for a, b in zip(seen[name], base)]):+.2f} s over local's); server "
                         f"{np.median([a[3] for a in seen[name]]):.2f} CPU s, {_said(seen[name][-1][4])}; without "
                         f"the server's CPU on these cores ~{freed[mid]:.2f}x (estimate); wall "
                         f"{np.median([1000 / a[0] for a in seen[name]]):.2f} s")
            extra += f"; workers' page faults {np.median([a[6] for a in seen[name]]):,.0f}"
            print(f"  {'compile, ' + name:<44} {max(a[0] for a in seen[name]):>12,.0f} img/s  {ratios[mid]:8.2f}x  "
                  f"{extra}")
        best = max(a[0] for a in seen[runs[0][0]])
        print(row(what, reader, "img/s", best))
        print(row("  the compile against that reader's epoch", best, "img/s", reader,
                  "(one such epoch; dsc's epochs after it decode nothing)"))
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        for proc, _, _ in servers.values():
            proc.terminate()
            proc.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
