"""What a compile to object storage costs the compiling machine (issue 35, S3 -> S3 at the local compile's CPU): each
PUT of a shard carries a CRC64-NVME checksum the server checks and is signed without hashing its body
(UNSIGNED-PAYLOAD), over plain http as over https; its body is the file's pages (a map), not a copy; the
local staging of a compile to a URL is not flushed to disk. Counted on the loopback S3 server (moto, in this
process: it sees every request's headers and body). Also: a cluster task's pickled function stays small, the
stores' one range read and one identity, the cache's one flock probe."""
import base64
import hashlib
import threading

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


def test_the_staging_of_a_compile_to_a_url_is_not_flushed(s3, src, tmp_path, monkeypatch):
    """syncfs(2) on the staging folder made the compile wait for the disk (0.6 s of a 12 s compile of 1,000 images
    under load) for files whose only future is to be uploaded and removed; the bucket's version record, put after
    every upload, is the commit. A local compile still flushes its output."""
    from dsc.compiler import staging

    synced, real = [], staging.sync_filesystem
    monkeypatch.setattr(staging, "sync_filesystem", lambda path: (synced.append(path), real(path))[1])
    dsc.compile_imagefolder(src, "s3://dsc-up/nosync", cache_dir=str(tmp_path / "cache"), **OPTS)
    assert synced == []
    dsc.compile_imagefolder(src, tmp_path / "local", **OPTS)
    assert len(synced) == 1


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
    """The staging is not flushed, so after a power loss a staged shard may not hold what was written: a resumed
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
