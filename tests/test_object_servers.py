"""dsc's object store against three real servers on loopback (tests/object_servers.py): moto for S3,
fake-gcs-server for GCS, Azurite for Azure Blob. The same checks on each: put, get (and a byte limit),
stat (size and the sha256 attribute), list under a prefix, delete, a conditional create refused when the
object exists, a streamed download of a few MB, a missing object; then a dataset compiled to the URL,
opened, read for an epoch and verified."""
import hashlib
import io
import os
import threading

import pytest

pytest.importorskip("obstore")

import dsc  # noqa: E402
from dsc.errors import CorruptDatasetError, DatasetNotFoundError  # noqa: E402
from dsc.store import open_store  # noqa: E402

from object_servers import BUCKET  # noqa: E402  (the fixtures come through conftest.py)
from test_versions import make_folder  # noqa: E402


def test_put_get_stat_list_delete(object_store_url):
    store = open_store(object_store_url)
    data = b"some bytes \x00\xff" * 100
    digest = hashlib.sha256(data).hexdigest()
    store.put("image/c/0/0", data, attributes={"sha256": digest})
    store.put("image/c/0/1", b"x")
    store.put("label/c/0", b"yz")
    assert store.get("image/c/0/0") == data
    assert store.get("image/c/0/0", limit=len(data)) == data
    with pytest.raises(CorruptDatasetError, match="more than the 10 bytes"):
        store.get("image/c/0/0", limit=10)
    size, attrs = store.stat("image/c/0/0")
    assert size == len(data) and attrs["sha256"] == digest
    assert store.stat("image/c/0/1")[0] == 1
    assert sorted(store.list("image/")) == [("image/c/0/0", len(data)), ("image/c/0/1", 1)]
    assert sorted(store.list("")) == [("image/c/0/0", len(data)), ("image/c/0/1", 1), ("label/c/0", 2)]
    store.put("image/c/0/1", b"replaced")  # an overwrite
    assert store.get("image/c/0/1") == b"replaced"
    store.delete("image/c/0/1")
    store.delete("image/c/0/1")  # deleting what is gone is no error
    assert store.stat("image/c/0/1") is None
    assert store.list("image/") == [("image/c/0/0", len(data))]


def test_create_only_refuses_an_existing_object(object_store_url):
    """The version commit's put-if-absent: each server honours the condition (S3 If-None-Match, GCS
    x-goog-if-generation-match: 0, Azure If-None-Match: *), so the second writer is refused."""
    store = open_store(object_store_url)
    store.put("_dsc/log/00000000000000000000.json", b"first", create_only=True, attributes={"sha256": "a"})
    with pytest.raises(FileExistsError, match=object_store_url):
        store.put("_dsc/log/00000000000000000000.json", b"second", create_only=True)
    assert store.get("_dsc/log/00000000000000000000.json") == b"first"
    assert store.stat("_dsc/log/00000000000000000000.json")[1]["sha256"] == "a"


def test_a_few_mb_up_and_down_streamed(object_store_url, tmp_path):
    """A 6 MiB file goes up in parts (obstore's multipart upload above 5 MiB) and comes down streamed."""
    store = open_store(object_store_url)
    data = os.urandom(6 << 20)
    (tmp_path / "shard").write_bytes(data)
    store.put("shard", tmp_path / "shard", attributes={"sha256": hashlib.sha256(data).hexdigest()})
    size, attrs = store.stat("shard")
    assert size == len(data) and attrs["sha256"] == hashlib.sha256(data).hexdigest()
    chunks = []
    with open(tmp_path / "down", "wb") as f:
        n = store.download("shard", f, on_chunk=lambda c: chunks.append(None if c is None else len(c)))
    assert n == len(data) and (tmp_path / "down").read_bytes() == data
    assert chunks[0] is None and sum(chunks[1:]) == len(data)
    with pytest.raises(FileExistsError):  # (a conditional create of a large object: one request, refused)
        store.put("shard", io.BytesIO(b"y" * (6 << 20)), create_only=True)
    assert store.get("shard", limit=len(data)) == data


def test_a_missing_object_and_a_missing_bucket(object_store_url):
    store = open_store(object_store_url)
    with pytest.raises(FileNotFoundError, match="nothing/here"):
        store.get("nothing/here")
    assert store.get_or_none("nothing/here") is None and store.stat("nothing/here") is None
    assert store.list("nothing/") == []
    gone = open_store(object_store_url.replace(BUCKET, "no-such-bucket"))
    with pytest.raises(FileNotFoundError):
        gone.get("x")
    assert gone.stat("x") is None
    with pytest.raises(DatasetNotFoundError, match="no-such-bucket"):
        gone.list("")


def test_an_outage_mid_epoch_is_survived(object_server, object_store_url, tmp_path):
    """The server stopped after the third batch and started again 2 s later (its objects kept): the epoch
    waits, says so, and completes with every sample."""
    src = tmp_path / "src"
    make_folder(src, 48, classes=3)
    url = object_store_url + "/ds"
    dsc.compile_imagefolder(src, url, size=16, shard_size=8, workers=1, progress=False, cache_dir=str(tmp_path / "s"))
    probe = dsc.open(url, cache_dir=tmp_path / "probe")
    ds = dsc.open(url, cache_dir=tmp_path / "c", retry_seconds=60,
                  cache_limit=2 * max(s.nbytes for s in probe.manifest.shards))
    loader = dsc.Loader(ds, batch_size=8, order="sequential", prefetch=1)
    seen = set()
    restarted = threading.Event()
    try:
        with pytest.warns(RuntimeWarning, match="retrying for up to"):
            for k, b in enumerate(loader):
                seen.update(b["index"].tolist())
                if k == 2:
                    object_server.stop()
                    threading.Timer(2.0, lambda: (object_server.start(), restarted.set())).start()
    finally:
        restarted.wait(30)
    assert restarted.is_set() and seen == set(range(48))
