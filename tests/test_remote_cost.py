"""What a compile to object storage costs the compiling machine (issue 35, S3 -> S3 at the local compile's CPU): each
PUT of a shard carries a CRC64-NVME checksum the server checks and is signed without hashing its body
(UNSIGNED-PAYLOAD), over plain http as over https; its body is the file's pages (a map), not a copy; the
local staging of a compile to a URL is still flushed as a local output is. Counted on the loopback S3 server (moto, in this
process: it sees every request's headers and body). Also: a cluster task's pickled function stays small, the
stores' one range read and one identity, the cache's one flock probe."""
import base64
import hashlib
import threading
import time

import pytest

pytest.importorskip("obstore")
pytest.importorskip("moto.server")

import dsc  # noqa: E402
from dsc.store import open_store  # noqa: E402
from dsc.synthetic import write_imagefolder  # noqa: E402
from object_servers import use_server  # noqa: E402

OPTS = dict(size=(24, 32), shard_size=8, progress=False, workers=1)


def _crc64_table():
    poly, table = 0x9A6C9329AC4BC9B5, []  # CRC-64/NVME (reflected), as S3 documents it
    for b in range(256):
        c = b
        for _ in range(8):
            c = (c >> 1) ^ poly if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _crc64_table()


def crc64nvme(data: bytes) -> int:
    """CRC-64/NVME written from its definition (init and final xor all ones), for the test's small bodies."""
    c = 0xFFFFFFFFFFFFFFFF
    for b in data:
        c = _TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFFFFFFFFFF


def test_the_reference_crc64nvme():
    assert crc64nvme(b"123456789") == 0xAE8B14860A799888  # (the algorithm's published check value)


@pytest.fixture
def s3(s3_server, monkeypatch):
    use_server(s3_server, monkeypatch)
    for k in ("AWS_UNSIGNED_PAYLOAD", "AWS_CHECKSUM_ALGORITHM"):
        monkeypatch.delenv(k, raising=False)
    s3_server.bucket("dsc-up")
    return s3_server


@pytest.fixture
def puts(monkeypatch):
    """Every PUT of an object the server takes: (key, its headers, its body)."""
    from moto.s3.responses import S3Response

    seen, lock, real = [], threading.Lock(), S3Response.put_object

    def put_object(self):
        with lock:
            seen.append((self.path, {k.lower(): v for k, v in self.headers.items()}, bytes(self.body or b"")))
        return real(self)
    monkeypatch.setattr(S3Response, "put_object", put_object)
    return seen


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    root = tmp_path_factory.mktemp("upload-cost") / "src"
    write_imagefolder(root, num_classes=2, per_class=12, size_range=(40, 64), seed=3)
    return root


def _shard_puts(seen):
    return [(p, h, b) for p, h, b in seen if "/image/c/" in p]


def test_a_compile_to_s3_checks_each_shard_by_crc64nvme_and_signs_no_body_hash(s3, puts, src, tmp_path):
    """Over plain http too (the test server's): SigV4's SHA-256 of every shard body (a second pass over each
    shard, the first being dsc's own as it wrote it) is replaced by a CRC64-NVME header the server verifies."""
    url = "s3://dsc-up/crc"
    r = dsc.compile_imagefolder(src, url, cache_dir=str(tmp_path / "cache"), **OPTS)
    shards = _shard_puts(puts)
    assert r.manifest.num_samples == 24 and len(shards) == 3
    for path, headers, body in shards:
        assert headers["x-amz-content-sha256"] == "UNSIGNED-PAYLOAD", path  # the body not hashed to sign it
        want = base64.b64encode(crc64nvme(body).to_bytes(8, "big")).decode()
        assert headers["x-amz-checksum-crc64nvme"] == want, path
        assert headers["x-amz-meta-sha256"] == hashlib.sha256(body).hexdigest()  # (dsc's own, as before)
        assert headers.get("if-none-match") == "*"  # still create-only
    assert all(h["x-amz-content-sha256"] == "UNSIGNED-PAYLOAD" for _, h, _ in puts)  # every put, not only shards


def test_the_users_settings_win(s3, puts, src, tmp_path, monkeypatch):
    """AWS_UNSIGNED_PAYLOAD=false signs the body's hash; AWS_CHECKSUM_ALGORITHM=sha256 (a server that refuses
    CRC64-NVME) sends that checksum instead."""
    monkeypatch.setenv("AWS_UNSIGNED_PAYLOAD", "false")
    monkeypatch.setenv("AWS_CHECKSUM_ALGORITHM", "sha256")
    open_store("s3://dsc-up/env").put("x", b"some bytes")
    (_, headers, body), = puts
    digest = hashlib.sha256(body).digest()
    assert headers["x-amz-content-sha256"] == digest.hex()
    assert headers["x-amz-checksum-sha256"] == base64.b64encode(digest).decode()
    assert "x-amz-checksum-crc64nvme" not in headers


def test_an_upload_sends_the_files_pages_not_a_copy(s3, src, tmp_path, monkeypatch):
    """The uploader hands obstore a read-only map of each staged shard (it read every shard into a new bytes
    object first: 150 MB of copies per 1,000 images of 224x224)."""
    import mmap

    import obstore

    kinds, real = [], obstore.put

    def put(store, path, file, **kw):
        if path.startswith("image/c/"):
            kinds.append(type(file))
        return real(store, path, file, **kw)
    monkeypatch.setattr(obstore, "put", put)
    r = dsc.compile_imagefolder(src, "s3://dsc-up/map", cache_dir=str(tmp_path / "cache"), **OPTS)
    assert r.manifest.num_samples == 24 and kinds == [mmap.mmap] * 3
    ref = dsc.compile_imagefolder(src, tmp_path / "local", **OPTS)
    store = open_store("s3://dsc-up/map")
    for path in (tmp_path / "local" / "image").rglob("c/*/*/*/*"):
        assert store.get(path.relative_to(tmp_path / "local").as_posix()) == path.read_bytes()
    assert ref.manifest.num_samples == 24


def test_the_staging_of_a_compile_to_a_url_is_flushed_as_a_local_output(s3, src, tmp_path, monkeypatch):
    """The staging of a compile to a URL is flushed before it is published, as a local output is: an unflushed one
    could come back after a power loss with its root zarr.json empty (every later compile to that URL then stops
    on "not a dsc dataset"), a node's zarr.json object zeroed after the record was committed (every --resume fails),
    or a zeroed object copied into the plain-Zarr view without a check (a review of an unflushed staging found all
    three). Counted: one syncfs each."""
    from dsc.compiler import staging

    synced, real = [], staging.sync_filesystem
    monkeypatch.setattr(staging, "sync_filesystem", lambda path: (synced.append(path), real(path))[1])
    dsc.compile_imagefolder(src, "s3://dsc-up/synced", cache_dir=str(tmp_path / "cache"), **OPTS)
    assert len(synced) == 1
    dsc.compile_imagefolder(src, tmp_path / "local", **OPTS)
    assert len(synced) == 2


def test_a_compile_to_a_url_flushes_and_keeps_no_shard_it_uploaded(s3, src, tmp_path, monkeypatch):
    """Each shard a compile to a URL stages leaves the staging once the bucket has it, before the staging is flushed:
    the flush writes none of the dataset's pixels to the local disk (it wrote them all: 150 MB per 1,000 images of
    224x224, written back, then unlinked), and the staging never holds more than the shards on their way up (it held
    the whole dataset until the end). Counted: the shard bytes staged when the one syncfs runs, and the shards taken
    out. A resumed compile counts a journaled shard the bucket has as done (no unit decoded again), and a compaction
    (an input skipped in the first unit) gets back the shards it re-streams: the bucket's bytes are a local
    compile's."""
    from dsc.compiler import staging, upload

    staged_at_flush, real = [], staging.sync_filesystem

    def sync(path):
        staged_at_flush.append(sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and "c" in p.parts
                                   and "image" in p.parts))
        return real(path)
    monkeypatch.setattr(staging, "sync_filesystem", sync)
    made, Real = [], upload.Uploader
    monkeypatch.setattr(upload, "Uploader", lambda *a, **kw: made.append(Real(*a, **kw)) or made[-1])
    r = dsc.compile_imagefolder(src, "s3://dsc-up/unstaged", cache_dir=str(tmp_path / "cache"), **OPTS)
    assert r.manifest.num_samples == 24 and staged_at_flush == [0] and made[-1].unstaged == 3
    assert made[-1].sent == len(made[-1].jobs)  # (every file sent once)

    bad = tmp_path / "bad"  # an input that does not decode, in the first unit: the two after it are re-streamed
    import shutil
    shutil.copytree(src, bad)
    first = sorted(p for p in bad.rglob("*") if p.is_file())[0]
    first.write_bytes(b"not an image")
    url = "s3://dsc-up/compacted"
    r = dsc.compile_imagefolder(bad, url, cache_dir=str(tmp_path / "cache"), on_error="skip", **OPTS)
    ref = dsc.compile_imagefolder(bad, tmp_path / "local", on_error="skip", **OPTS)
    assert r.manifest.num_samples == ref.manifest.num_samples == 23
    store = open_store(url)
    shards = sorted((tmp_path / "local" / "image").rglob("c/*/*/*/*"))
    assert len(shards) == 3
    for path in shards:
        assert store.get(path.relative_to(tmp_path / "local").as_posix()) == path.read_bytes()


def _stopped_at_the_third_unit(monkeypatch, src, url: str, cache: str, **kw) -> list:
    """A compile of ``src`` to ``url`` stopped as its third unit is journaled, once the first two are in the bucket
    (and out of the staging); the Uploaders it made."""
    from dsc.compiler import upload
    from dsc.compiler.journal import Journal

    made, Real = [], upload.Uploader
    monkeypatch.setattr(upload, "Uploader", lambda *a, **k: made.append(Real(*a, **k)) or made[-1])
    real = Journal.record

    def record(self, res, *a):
        if res.s == 2:
            made[-1].settle()
            raise KeyboardInterrupt
        return real(self, res, *a)

    monkeypatch.setattr(Journal, "record", record)
    with pytest.raises(KeyboardInterrupt):
        dsc.compile_imagefolder(src, url, cache_dir=cache, **kw, **OPTS)
    monkeypatch.setattr(Journal, "record", real)
    return made


def test_a_resumed_compile_to_a_url_keeps_the_units_whose_shards_left_the_staging(s3, src, tmp_path, monkeypatch):
    """A compile to a URL interrupted after two units, whose shards are in the bucket and out of the staging: the
    resumed compile decodes only the third unit (a journaled shard counts when the bucket has it, this writer's)."""
    url, cache = "s3://dsc-up/resumed-unstaged", str(tmp_path / "cache")
    made = _stopped_at_the_third_unit(monkeypatch, src, url, cache)
    assert made[-1].unstaged == 2
    r = dsc.compile_imagefolder(src, url, cache_dir=cache, resume=True, **OPTS)
    assert r.resumed_units == 2 and r.decoded == 8 and r.manifest.num_samples == 24
    ref = dsc.compile_imagefolder(src, tmp_path / "local", **OPTS)
    store = open_store(url)
    for path in (tmp_path / "local" / "image").rglob("c/*/*/*/*"):
        assert store.get(path.relative_to(tmp_path / "local").as_posix()) == path.read_bytes()
    assert ref.manifest.num_samples == 24


def test_a_fresh_worker_has_the_object_store_library_loaded_before_its_first_unit():
    """A compile from a bucket starts fresh workers, forked from a fork server: each loaded obstore's Rust library
    and the CRC32C one on its first unit (about 0.1 s of CPU per worker per compile, counted by ``-X importtime``);
    the server now loads them once. Counted: the libraries mapped in a fresh worker that has run nothing yet. (In a
    process of its own: the fork server is started once per process, with the preload of whoever started it.)"""
    import subprocess
    import sys

    code = ("import os\nfrom dsc.compiler.pool import WorkerPool\np = WorkerPool(2, os.getpid, fresh=True)\n"
            "maps = [open(f'/proc/{w.pid}/maps').read() for w, _ in p._workers]\np.close()\n"
            "print(sum('_obstore' in m for m in maps), sum('crc32c' in m for m in maps))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["2", "2"], out.stderr[-2000:]


def test_a_cluster_task_carries_the_source_not_its_scan(src, tmp_path):
    """On a Dask cluster each unit's task pickles ``partial(compile_unit, source=...)`` again (Dask serializes a
    task's function with the task: counted, one pickle per submitted task). That costs nothing while a source
    keeps only its parameters (about 300 bytes, 0.1 ms per unit); one that kept its scan would send it with
    every unit."""
    import pickle
    from functools import partial

    from dsc.compiler.sources.webdataset import WebDatasetSource
    from dsc.compiler.units import compile_unit
    from dsc.synthetic import pack_webdataset

    tars = pack_webdataset(src, tmp_path / "wds", per_tar=6)
    source = WebDatasetSource(src=str(tmp_path / "wds"))
    assert len(source.prepare().records) == 24 and tars
    assert len(pickle.dumps(partial(compile_unit, source=source))) < 1000


def test_a_resumed_upload_hashes_what_it_still_has_to_send(s3, src, tmp_path, monkeypatch):
    """After a crash a staged shard may not hold what was written (a unit whose journal line outlived its bytes): a resumed
    upload hashes each staged file the bucket lacks and refuses one whose bytes changed (one the bucket has, this
    writer's, is kept without reading it)."""
    from dsc.errors import RemoteError
    from dsc.store.object import ObjectStore

    url, real, failed = "s3://dsc-up/resume", ObjectStore.put, []

    def put(self, rel, data, create_only=False, attributes=None):
        if rel.startswith("image/c/") and not failed:
            failed.append(rel)
            raise RemoteError(f"{self.where(rel)}: writing failed: simulated outage")
        return real(self, rel, data, create_only, attributes)
    monkeypatch.setattr(ObjectStore, "put", put)
    with pytest.raises(RemoteError, match="simulated outage"):
        dsc.compile_imagefolder(src, url, cache_dir=str(tmp_path / "cache"), **OPTS)
    staged = [p for p in (tmp_path / "cache" / "uploads").rglob(failed[0]) if "dataset" in p.parts]
    assert len(staged) == 1
    data = bytearray(staged[0].read_bytes())
    data[len(data) // 2] ^= 0xFF  # (same size: only its hash can tell)
    staged[0].write_bytes(bytes(data))
    with pytest.raises(RemoteError, match="is not the file the dataset records"):
        dsc.compile_imagefolder(src, url, cache_dir=str(tmp_path / "cache"), resume=True, **OPTS)
    data[len(data) // 2] ^= 0xFF
    staged[0].write_bytes(bytes(data))
    r = dsc.compile_imagefolder(src, url, cache_dir=str(tmp_path / "cache"), resume=True, **OPTS)
    assert r.manifest.num_samples == 24 and open_store(url).get(failed[0]) == bytes(data)


def test_one_range_read_and_one_identity_per_store(s3, tmp_path):
    """``read_range`` (fewer bytes at the end; in object storage obstore's buffer, not copied into a bytes object:
    a Parquet row group, a shard's samples) under ``get_range``'s exact check, and ``etag`` from ``identity`` (one
    HEAD), for the object store and a folder alike."""
    from dsc.errors import CorruptDatasetError
    from dsc.store import LocalStore

    data = bytes(range(100))
    (tmp_path / "f").write_bytes(data)
    remote = open_store("s3://dsc-up/ranges")
    remote.put("f", data)
    for store in (remote, LocalStore(tmp_path)):
        assert bytes(store.read_range("f", 10, 20)) == data[10:20] and bytes(store.read_range("f", 90, 200)) == data[90:]
        assert bytes(store.read_range("f", 5, 5)) == b"" and bytes(store.get_range("f", 0, 100)) == data
        with pytest.raises(CorruptDatasetError, match="ends before byte 200"):
            store.get_range("f", 90, 200)
    assert not isinstance(remote.read_range("f", 10, 20), bytes)  # (the response's own buffer)
    from dsc.store.base import Store  # the default, for a store that cannot read a range: the whole object, cut
    assert bytes(Store.read_range(LocalStore(tmp_path), "f", 10, 20)) == data[10:20]
    size, _, tag = remote.identity("f")
    assert size == 100 and tag and remote.etag("f") == tag and remote.etag("missing") is None
    assert LocalStore(tmp_path).etag("f") is None and LocalStore(tmp_path).identity("f") is None


def test_the_caches_one_flock_probe(tmp_path):
    """cache.py's probes of a file another holder may have flock'ed (a reader's mark, a partial download, a cached
    shard) are one ``try_exclusive``: False while it is held, True once it is not (this descriptor then holds it)."""
    import fcntl
    import os

    from dsc.runtime.cache import _downloading, live_holder, try_exclusive

    path = tmp_path / "mark"
    path.write_bytes(b"0")
    held = os.open(path, os.O_RDONLY)
    fcntl.flock(held, fcntl.LOCK_SH)  # (another open file description: conflicts as another process's would)
    probe = os.open(path, os.O_RDONLY)
    try:
        assert try_exclusive(probe) is False and _downloading(str(path))
        fd = live_holder(str(path))
        assert fd is not None
        os.close(fd)
        os.close(held)
        assert try_exclusive(probe) is True
    finally:
        os.close(probe)
    assert not _downloading(str(path)) and live_holder(str(path)) is None and not path.exists()  # (a dead mark goes)


def test_one_flock_probe_for_every_writer_and_reader(tmp_path):
    """The non-blocking flock probe is written once (``store.local.try_exclusive``), and the cache, the vacuum's
    lock on a version's pin (``lock_unpinned``) and a writer's lock (``OutLock``) all use it: a held pin is
    refused, a held OUT names its holder, and both are taken once let go."""
    import fcntl
    import os
    import re
    from pathlib import Path

    import dsc
    from dsc.errors import CompileLockedError
    from dsc.formats import versions as V
    from dsc.runtime import cache
    from dsc.store import local

    pkg = Path(dsc.__file__).parent
    probes = [p.relative_to(pkg).as_posix() for p in pkg.rglob("*.py") if "LOCK_NB" in p.read_text()]
    assert probes == ["store/local.py"] and local.try_exclusive is cache.try_exclusive is V.try_exclusive
    assert len(re.findall(r"LOCK_NB", (pkg / "store/local.py").read_text())) == 1

    pin = V.open_pin(tmp_path, 3)
    fcntl.flock(pin, fcntl.LOCK_SH)  # (a reader of version 3)
    assert V.lock_unpinned(tmp_path, 3) is None
    os.close(pin)
    fd = V.lock_unpinned(tmp_path, 3)
    assert fd is not None
    os.close(fd)

    out = tmp_path / "out"
    with local.OutLock(out, "vacuum"):
        try:
            with local.OutLock(out):
                raise AssertionError("a second writer took the lock")
        except CompileLockedError as e:
            assert "another dsc vacuum" in str(e)
    with local.OutLock(out):
        pass


def _answer_puts(monkeypatch, answer):
    """The loopback server answers a PUT with ``answer(path, headers)`` when that gives one, else as S3 does."""
    from moto.s3.responses import S3Response

    real = S3Response.put_object

    def put_object(self):
        got = answer(self.path, {k.lower(): v for k, v in self.headers.items()})
        return got if got is not None else real(self)
    monkeypatch.setattr(S3Response, "put_object", put_object)


def test_a_put_refused_by_its_checksum_is_sent_again(s3, src, tmp_path, monkeypatch):
    """The CRC64-NVME header exists to catch a body damaged on its way in: a put the server refuses for a checksum
    mismatch (400 BadDigest) is sent again (the mapped body is intact), not the end of the compile."""
    hit = []

    def answer(path, headers):
        if "/image/c/" in path and not hit:
            hit.append(path)
            return 400, {}, (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>BadDigest</Code><Message>The '
                             b'CRC64NVME you specified did not match the calculated checksum.</Message></Error>')
    _answer_puts(monkeypatch, answer)
    r = dsc.compile_imagefolder(src, "s3://dsc-up/baddigest", cache_dir=str(tmp_path / "cache"), **OPTS)
    assert hit and r.manifest.num_samples == 24


@pytest.mark.parametrize("code", [400, 501])
def test_a_server_that_refuses_the_checksum_header_names_the_setting(s3, src, tmp_path, monkeypatch, code):
    """An S3-compatible server that does not take ``x-amz-checksum-crc64nvme`` fails at once (501 is not retried
    for two minutes) with the setting that makes it work in the message."""
    from dsc.errors import RemoteError

    monkeypatch.setenv("DSC_RETRY_SECONDS", "30")

    def answer(path, headers):
        if "x-amz-checksum-crc64nvme" in headers:
            if code == 400:
                return 400, {}, (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>InvalidArgument</Code><Message>'
                                 b'x-amz-checksum-crc64nvme header is not supported</Message></Error>')
            return 501, {}, (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>NotImplemented</Code><Message>A '
                             b'header you provided implies functionality that is not implemented</Message></Error>')
    _answer_puts(monkeypatch, answer)
    t0 = time.monotonic()
    with pytest.raises(RemoteError, match="AWS_CHECKSUM_ALGORITHM=sha256"):
        dsc.compile_imagefolder(src, f"s3://dsc-up/refuses{code}", cache_dir=str(tmp_path / "cache"), **OPTS)
    assert time.monotonic() - t0 < 20


def _with_a_bad_first_file(src, tmp_path):
    """``src`` copied with its first file not an image: skipped, so the compile compacts the shards after it."""
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(src, bad)
    sorted(p for p in bad.rglob("*") if p.is_file())[0].write_bytes(b"not an image")
    return bad


def _same_shards_as_a_local_compile(src, url, tmp_path):
    dsc.compile_imagefolder(src, tmp_path / "local", on_error="skip", **OPTS)
    store = open_store(url)
    shards = sorted((tmp_path / "local" / "image").rglob("c/*/*/*/*"))
    assert shards
    for path in shards:
        assert store.get(path.relative_to(tmp_path / "local").as_posix()) == path.read_bytes(), path


def test_a_resume_after_an_interrupted_compaction_fetches_the_uploaded_shards_again(s3, src, tmp_path, monkeypatch):
    """Interrupted after the compaction re-streamed its shards into the staging (before publishing): the journal
    names the shards as uploaded, the staging holds the compacted ones. The resume must not compact those again
    (samples shifted, one lost, one twice, every hash consistent): it takes the uploaded shards back from the bucket
    (a staged copy is kept only with the journal's bytes)."""
    import importlib

    C = importlib.import_module("dsc.compiler.compile")  # (the module: dsc.compiler.compile is also a function)
    bad = _with_a_bad_first_file(src, tmp_path)
    url, cache = "s3://dsc-up/interrupted-compaction", str(tmp_path / "cache")
    real = C._finalize

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(C, "_finalize", interrupted)
    with pytest.raises(KeyboardInterrupt):
        dsc.compile_imagefolder(bad, url, cache_dir=cache, on_error="skip", **OPTS)
    monkeypatch.setattr(C, "_finalize", real)
    r = dsc.compile_imagefolder(bad, url, cache_dir=cache, on_error="skip", resume=True, **OPTS)
    assert r.manifest.num_samples == 23
    _same_shards_as_a_local_compile(bad, url, tmp_path)


def test_a_torn_staged_shard_is_fetched_from_the_bucket_for_the_compaction(s3, src, tmp_path, monkeypatch):
    """A shard uploaded and taken out of the staging, back after a power loss as zeros of its size (the unlink was
    not durable): the resume counts its unit by the bucket, and the compaction re-streams the bucket's shard, not
    the torn file."""
    bad = _with_a_bad_first_file(src, tmp_path)
    url, cache = "s3://dsc-up/torn-staged", str(tmp_path / "cache")
    _stopped_at_the_third_unit(monkeypatch, bad, url, cache, on_error="skip")
    rel = "image/c/1/0/0/0"
    staging = next(p.parent for p in (tmp_path / "cache").rglob("units.jsonl")).parent
    if not (staging / "image").is_dir():
        staging = next(p.parent for p in (tmp_path / "cache").rglob("image") if p.is_dir())
    assert not (staging / rel).exists()  # (uploaded, out of the staging)
    (staging / rel).parent.mkdir(parents=True, exist_ok=True)
    (staging / rel).write_bytes(bytes(open_store(url).stat(rel)[0]))
    r = dsc.compile_imagefolder(bad, url, cache_dir=cache, on_error="skip", resume=True, **OPTS)
    assert r.manifest.num_samples == 23
    _same_shards_as_a_local_compile(bad, url, tmp_path)


def test_a_download_interrupted_for_the_compaction_does_not_stick(s3, src, tmp_path, monkeypatch):
    """The compaction's download of an uploaded shard stops half way: it wrote a private name, so the resume
    downloads it again (a partial file at the shard's name stopped every later resume)."""
    import io

    from dsc.store import object as O

    bad = _with_a_bad_first_file(src, tmp_path)
    url, cache = "s3://dsc-up/interrupted-download", str(tmp_path / "cache")
    real = O.ObjectStore.download

    def half(self, rel, f, on_chunk=None, limit=None):
        if "/c/" in rel:
            b = io.BytesIO()
            real(self, rel, b, limit=limit)
            f.write(b.getvalue()[:len(b.getvalue()) // 2])
            f.flush()
            raise KeyboardInterrupt
        return real(self, rel, f, on_chunk=on_chunk, limit=limit)

    monkeypatch.setattr(O.ObjectStore, "download", half)
    with pytest.raises(KeyboardInterrupt):
        dsc.compile_imagefolder(bad, url, cache_dir=cache, on_error="skip", **OPTS)
    monkeypatch.setattr(O.ObjectStore, "download", real)
    r = dsc.compile_imagefolder(bad, url, cache_dir=cache, on_error="skip", resume=True, **OPTS)
    assert r.manifest.num_samples == 23
    _same_shards_as_a_local_compile(bad, url, tmp_path)


def test_the_compaction_hashes_no_staged_shard_this_resume_hashed(s3, src, tmp_path, monkeypatch):
    """A compile to a URL interrupted before its first two units' shards were uploaded (still staged), resumed with an
    input skipped in the first unit: the resume re-hashes the two staged shards to keep their units, and the
    compaction that follows takes them as they are (it hashed them a second time); the third unit's shard, uploaded
    and out of the staging, comes back from the bucket, its download hashed. Counted: every file hashed."""
    from dsc.compiler import journal, upload

    bad = _with_a_bad_first_file(src, tmp_path)
    url, cache = "s3://dsc-up/compaction-hashes", str(tmp_path / "cache")
    with monkeypatch.context() as mp:
        mp.setattr(upload.Uploader, "submit", lambda self, *a, **k: None)  # (nothing leaves the staging)
        real = journal.Journal.record

        def record(self, res, *a):
            if res.s == 2:
                raise KeyboardInterrupt
            return real(self, res, *a)
        mp.setattr(journal.Journal, "record", record)
        with pytest.raises(KeyboardInterrupt):
            dsc.compile_imagefolder(bad, url, cache_dir=cache, on_error="skip", **OPTS)
    hashed, real_hash = [], journal.sha256_file
    monkeypatch.setattr(journal, "sha256_file", lambda p, *a, **k: hashed.append(str(p).split("/image/")[-1]) or
                        real_hash(p, *a, **k))
    r = dsc.compile_imagefolder(bad, url, cache_dir=cache, on_error="skip", resume=True, **OPTS)
    assert r.resumed_units == 2 and r.manifest.num_samples == 23
    assert sorted(hashed) == ["c/0/0/0/0", "c/1/0/0/0", "c/2/0/0/.0.fetching"], hashed
    _same_shards_as_a_local_compile(bad, url, tmp_path)
