"""An object read in several requests is read as one object: the first request's ETag (or a listing's) is sent
as If-Match with every later one, and the answer's ETag is checked (fake-gcs-server ignores If-Match), so an
object replaced at its name in between is an ObjectChangedError, never bytes of two versions: a tar scanned by
ranges or re-opened streams, a tar's unit read after its scan, a dataset's shard read by ranges."""
import os
import sys
import uuid

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))

import dsc  # noqa: E402
from dsc.errors import ObjectChangedError  # noqa: E402

OLD, NEW = bytes(range(256)) * 64, bytes(255 - b for b in range(256)) * 64  # 16 KiB each, every byte differs


def _store(url):
    from dsc.store import open_store

    return open_store(url)


def test_a_range_of_an_object_replaced_after_the_first_range_is_refused(object_store_url):
    """RangeFile (a Parquet file's footer then its row groups): the second range of a replaced object is refused,
    on every server (S3 and Azure answer 412 to If-Match; fake-gcs-server's answer carries the new ETag)."""
    store = _store(object_store_url)
    store.put("a.bin", OLD)
    f = store.reader("a.bin", len(OLD), buffer=1024)
    assert f.read(1024) == OLD[:1024]
    store.put("a.bin", NEW)
    with pytest.raises(ObjectChangedError, match="a.bin was replaced while dsc was reading it"):
        f.seek(8192)
        f.read(1024)
    fresh = store.reader("a.bin", len(NEW), buffer=1024)  # (a new reader reads the new object whole)
    assert fresh.read() == NEW


def test_a_stream_reopened_after_the_object_was_replaced_is_refused(object_store_url):
    """StreamFile (a tar read member after member): a seek back opens a new GET, of the object the first read."""
    store = _store(object_store_url)
    store.put("t.tar", OLD * 192)  # (3 MiB: more than the reader's buffer)
    f = store.reader("t.tar", len(OLD) * 192, sequential=True)
    assert f.read(2 << 20) == (OLD * 128)
    store.put("t.tar", NEW)
    with pytest.raises(ObjectChangedError, match="t.tar was replaced"):
        f.seek(0)
        f.read(10)


def test_a_scan_stream_cut_and_reopened_after_the_object_was_replaced_is_refused(object_store_url):
    """ObjectStore.open_whole (a tar's scan: one GET that gives the size and ETag): the connection breaks midway, the
    tar is replaced while it is down, and the reopening where it stopped is refused (If-Match with the first
    GET's ETag), never the new tar's bytes after the old one's under the old ETag (a kept image of two versions)."""
    store = _store(object_store_url)
    store.put("w.tar", OLD * 192)
    f, (size, _, etag) = store.open_whole("w.tar")
    assert size == len(OLD) * 192 and etag
    raw, inner = f.raw, f.raw._it

    def cut():
        yield next(inner)
        store.put("w.tar", NEW * 192)  # (replaced while the connection is down)
        raise ConnectionResetError("cut")
    raw._it = cut()
    with pytest.raises(ObjectChangedError, match="w.tar was replaced"):
        f.read()


def test_an_input_is_read_as_the_listing_saw_it(object_store_url):
    """A source's input opened after its listing (a tar's unit read after the scan) reads the object the listing
    named: replaced since, it is refused at its first request, never read at the scan's offsets."""
    from dsc.compiler.sources.inputs import list_objects, open_input

    store = _store(object_store_url)
    store.put("src/0.tar", OLD)
    (url, size), = list_objects(object_store_url + "/src")
    store.put("src/0.tar", NEW)
    for kw in (dict(sequential=True, start=100, ahead=1 << 20), dict(sequential=True), dict(buffer=0), {}):
        with pytest.raises(ObjectChangedError, match="0.tar was replaced"):
            with open_input(url, size, **kw) as f:
                f.seek(100)
                f.read(10)
    list_objects(object_store_url + "/src")  # (listed again: the new object is read)
    with open_input(url, size, sequential=True) as f:
        assert f.read() == NEW


@pytest.fixture
def pushed(s3_server, tmp_path, monkeypatch):
    """(url, local dataset) of 40 images in shards of 8 pushed to the session's S3 server."""
    pytest.importorskip("obstore")
    from object_servers import use_server

    from dsc.compiler.upload import push
    from test_versions import make_folder

    use_server(s3_server, monkeypatch)
    monkeypatch.delenv("DSC_CACHE_DIR", raising=False)
    s3_server.bucket("dsc-test")
    make_folder(tmp_path / "src", 40)
    local = tmp_path / "d"
    dsc.compile_imagefolder(tmp_path / "src", local, size=8, shard_size=8, progress=False, workers=1)
    url = f"s3://dsc-test/pinned-{uuid.uuid4().hex}"
    push(local, url, progress=False)
    return url, local


def _first_shard(ds):
    from dsc.formats import layout as L

    return next(s for s in L.shard_specs(ds.manifest) if s is not None and s.path.startswith("image/"))


def test_ranged_reads_refuse_a_shard_replaced_before_or_between_their_ranges(pushed, tmp_path):
    """read='ranged': the first range of a shard checks the object is the one the version names (the SHA-256 its
    upload recorded); later ranges are of the object the first one read. A shard replaced at its name (another
    object put there, with or without dsc's metadata) is refused, never served as the version's samples."""
    url, local = pushed
    store = _store(url)
    ds = dsc.open(url, cache_dir=tmp_path / "c", cache_limit=0)
    spec = _first_shard(ds)
    good = store.get(spec.path)
    loader = dsc.Loader(ds, batch_size=8, order="sequential")
    assert loader.read_strategy == "ranged"
    want = [b["image"].clone() for b in loader]
    assert spec.path in ds.storage.range_etags
    store.put(spec.path, bytes(255 - b for b in good))  # another object at the shard's name
    with pytest.raises(ObjectChangedError, match="was replaced"):
        next(iter(dsc.Loader(ds, batch_size=8, order="sequential")))
    other = dsc.open(url, cache_dir=tmp_path / "c2", cache_limit=0)  # a new handle: its first range sees no
    store.put(spec.path, bytes(255 - b for b in good), attributes={"sha256": "0" * 64})  # dsc metadata of this
    with pytest.raises(dsc.CorruptDatasetError, match="is not the shard this version names"):  # version's shard
        next(iter(dsc.Loader(other, batch_size=8, order="sequential")))
    store.put(spec.path, bytes(good), attributes={"sha256": spec.sha256, "writer": "x"})
    again = dsc.open(url, cache_dir=tmp_path / "c3", cache_limit=0)
    got = [b["image"] for b in dsc.Loader(again, batch_size=8, order="sequential")]
    assert all(np.array_equal(a, b) for a, b in zip(want, got, strict=True))


def test_a_compile_stops_when_a_tar_is_replaced_between_its_scan_and_its_units(pushed, tmp_path, monkeypatch):
    """A tar in a bucket replaced (other images) after the scan read its labels and offsets:
    the unit's read of it is refused, and the compile stops naming it; no sample of the new tar is compiled
    under the old one's labels."""
    from dsc.compiler.sources.webdataset import WebDatasetSource
    from dsc.synthetic import pack_webdataset
    from test_versions import make_folder

    url, _ = pushed
    store = _store(url)
    make_folder(tmp_path / "a", 12)
    make_folder(tmp_path / "b", 12, seed0=100)
    for name in ("a", "b"):
        pack_webdataset(tmp_path / name, tmp_path / f"wds-{name}", per_tar=6)
    for tar in sorted((tmp_path / "wds-a").glob("*.tar")):
        store.put(f"wds/{tar.name}", tar.read_bytes())
    first = sorted((tmp_path / "wds-b").glob("*.tar"))[0]
    real, replaced = WebDatasetSource.fetcher, []

    def fetcher(self, records):
        if not replaced:  # (the scan is done: the units start)
            replaced.append(first.name)
            store.put(f"wds/{first.name}", first.read_bytes())
        return real(self, records)
    monkeypatch.setattr(WebDatasetSource, "fetcher", fetcher)
    # (no image kept by the scan: the units read the tars again; a kept image is the scanned tar's, no re-read)
    monkeypatch.setattr("dsc.compiler.sources.webdataset.KEEP_BYTES", 0)
    with pytest.raises(ObjectChangedError, match=f"wds/{first.name} was replaced"):
        dsc.compile_webdataset(f"{url}/wds", tmp_path / "out", size=8, shard_size=6, progress=False, workers=1)
    assert replaced


def test_a_tar_named_by_its_url_and_replaced_is_read_anew_by_the_next_compile_of_the_process(pushed, tmp_path):
    """A tar named by its URL (no listing) and replaced by another of the same size, labels changed: the next
    compile in the same process reads the new tar (each scan starts from what the bucket says then), not a
    refusal pinned to the ETag an earlier compile kept, nor the old labels."""
    import io
    import tarfile

    from test_versions import make_folder

    url, _ = pushed
    store = _store(url)
    imgs = make_folder(tmp_path / "a", 6)

    def tar(labels):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tf:
            for i, (p, label) in enumerate(zip(imgs, labels)):
                for ext, data in (("jpg", p.read_bytes()), ("cls", str(label).encode())):
                    info = tarfile.TarInfo(f"s{i}.{ext}")
                    info.size, info.mtime = len(data), 0
                    tf.addfile(info, io.BytesIO(data))
        return buf.getvalue()
    a, b = tar([0, 1, 2, 3, 0, 1]), tar([3, 2, 1, 0, 3, 2])
    assert len(a) == len(b) and a != b
    store.put("one/0.tar", a)
    for n, data, want in (("o1", None, [0, 1, 2, 3, 0, 1]), ("o2", b, [3, 2, 1, 0, 3, 2]), ("o3", None, [3, 2, 1, 0, 3, 2])):
        if data is not None:
            store.put("one/0.tar", data)
        dsc.compile_webdataset(f"{url}/one/0.tar", tmp_path / n, size=8, shard_size=6, progress=False, workers=1)
        ds = dsc.open(tmp_path / n)
        assert [int(ds[i]["label"]) for i in range(6)] == want, n


def test_a_newer_identity_replaces_a_kept_one_even_when_the_cache_is_full(monkeypatch):
    from dsc.compiler.sources import inputs

    monkeypatch.setattr(inputs, "IDENTITY_LIMIT", 1)
    monkeypatch.setattr(inputs, "_IDENTITY", {})
    inputs.remember("s3://b/x", 3, 1.0, "old")
    inputs.remember("s3://b/y", 3, 1.0, "other")  # (full: not kept)
    inputs.remember("s3://b/x", 3, 2.0, "new")
    assert inputs._IDENTITY == {"s3://b/x": (3, 2.0, "new")}


def test_the_errors_of_remote_reads_are_importable_from_dsc():
    assert dsc.ObjectChangedError is ObjectChangedError and issubclass(dsc.RemoteError, OSError)

