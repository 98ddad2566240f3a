"""Compile where the data lives (issue 35), on the loopback S3 server: sources read from the bucket (a WebDataset
set, an ImageFolder prefix, Parquet files by row-group ranges), and a Dask cluster whose workers share no folder
with the client reads the tars from the bucket and uploads its own shards to the output URL: the same bytes as
a local compile, a worker killed mid-unit, a bad member, --resume checked against the bucket."""
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytest.importorskip("obstore")
pytest.importorskip("moto.server")

import dsc  # noqa: E402
from conftest import samples  # noqa: E402
from dsc.errors import SampleError, SourceError  # noqa: E402
from dsc.store import open_store  # noqa: E402
from dsc.synthetic import pack_webdataset, write_imagefolder  # noqa: E402
from object_servers import use_server  # noqa: E402

OPTS = dict(size=(24, 32), shard_size=7, progress=False)


@pytest.fixture(scope="module")
def s3(s3_server):
    with pytest.MonkeyPatch.context() as m:
        use_server(s3_server, m)
        s3_server.bucket("dsc-src")
        s3_server.bucket("dsc-out")
        yield s3_server


def upload_tree(root: Path, url: str) -> None:
    store = open_store(url)
    for p in sorted(root.rglob("*")):
        if p.is_file():
            store.put(p.relative_to(root).as_posix(), p.read_bytes())


@pytest.fixture(scope="module")
def data(s3, tmp_path_factory):
    """(local folder, local tars, the folder compiled locally): the folder and the tars are also in the bucket,
    at s3://dsc-src/folder and s3://dsc-src/wds."""
    root = tmp_path_factory.mktemp("where-data-lives")
    folder, tars = root / "folder", root / "tars"
    write_imagefolder(folder, num_classes=3, per_class=10, size_range=(30, 70), seed=11)
    pack_webdataset(folder, tars, per_tar=10)
    upload_tree(folder, "s3://dsc-src/folder")
    upload_tree(tars, "s3://dsc-src/wds")
    ref = root / "ref.dsc"
    dsc.compile_webdataset(str(tars), ref, workers=1, **OPTS)
    return folder, tars, ref


def shard_files(out: Path) -> dict:
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted((out / "image").rglob("c/*/*/*/*"))
            if p.is_file()}


def bucket_shards(url: str) -> dict:
    store = open_store(url)
    return {rel: store.get(rel) for rel, _ in store.list("image/c/")}


# --------------------------------------------------------------------------- sources read from the bucket
def test_webdataset_and_imagefolder_from_s3_match_local(data, tmp_path):
    folder, tars, ref = data
    r = dsc.compile_webdataset("s3://dsc-src/wds/{00000..00002}.tar", tmp_path / "w", workers=2, **OPTS)
    assert r.manifest.num_samples == 30 and shard_files(tmp_path / "w") == shard_files(ref)
    assert dsc.open(tmp_path / "w").keys == dsc.open(ref).keys
    dsc.compile_webdataset("s3://dsc-src/wds", tmp_path / "p", workers=1, **OPTS)  # a prefix of tars
    assert shard_files(tmp_path / "p") == shard_files(ref)
    dsc.compile_imagefolder("s3://dsc-src/folder", tmp_path / "i", workers=2, **OPTS)
    dsc.compile_imagefolder(folder, tmp_path / "il", workers=1, **OPTS)
    assert samples(dsc.open(tmp_path / "i")) == samples(dsc.open(tmp_path / "il"))
    assert shard_files(tmp_path / "i") == shard_files(tmp_path / "il")


def test_segfolder_from_s3_matches_local(s3, tmp_path):
    from dsc.synthetic import SEG_CLASSES, seg_scenes, write_segfolder

    root = write_segfolder(tmp_path / "seg", seg_scenes(6, seed=4))
    upload_tree(root, "s3://dsc-src/seg")
    kw = dict(classes=list(SEG_CLASSES), size=(24, 32), progress=False)
    dsc.compile_segfolder("s3://dsc-src/seg", tmp_path / "remote", workers=2, **kw)
    dsc.compile_segfolder(root, tmp_path / "local", workers=1, **kw)
    a, b = dsc.open(tmp_path / "remote"), dsc.open(tmp_path / "local")
    assert a.keys == b.keys and len(a) == 6
    ba, bb = a.get_batch(range(6)), b.get_batch(range(6))
    assert (ba["image"] == bb["image"]).all() and (ba["mask"] == bb["mask"]).all()


def test_coco_from_s3_matches_local(s3, tmp_path):
    from dsc.synthetic import detection_scenes, write_coco

    ann, images = write_coco(tmp_path / "coco", detection_scenes(6, seed=2))
    upload_tree(images, "s3://dsc-src/coco/images")
    open_store("s3://dsc-src/coco").put("instances.json", Path(ann).read_bytes())
    kw = dict(size=(32, 32), resize="pad", progress=False)
    dsc.compile_coco("s3://dsc-src/coco/instances.json", "s3://dsc-src/coco/images", tmp_path / "remote", workers=2,
                     **kw)
    dsc.compile_coco(ann, images, tmp_path / "local", workers=1, **kw)
    a, b = dsc.open(tmp_path / "remote"), dsc.open(tmp_path / "local")
    assert a.keys == b.keys and len(a) == len(b) > 0
    ba, bb = a.get_batch(range(len(a))), b.get_batch(range(len(b)))
    assert (ba["image"] == bb["image"]).all() and (ba["boxes"] == bb["boxes"]).all()


def test_yolo_and_voc_from_s3_match_local(s3, tmp_path):
    """YOLO and VOC roots in a bucket (their layout under a URL prefix, found by one listing): the same samples,
    boxes and masks as the same folders compiled locally; a missing split names its URL."""
    from dsc.synthetic import detection_scenes, write_voc_segmentation, write_yolo

    scenes = detection_scenes(6, seed=4)
    yolo = tmp_path / "yolo"
    write_yolo(yolo, scenes)
    write_voc_segmentation(tmp_path / "voc", scenes, split="train")
    import numpy as np
    from PIL import Image

    (tmp_path / "voc" / "SegmentationObject").mkdir()
    for s in scenes:  # object k of the XML: the pixels of value k + 1
        ins = np.zeros((s["height"], s["width"]), np.uint8)
        for k, b in enumerate(s["boxes"]):
            ins[int(b[1]):int(b[3]), int(b[0]):int(b[2])] = k + 1
        Image.fromarray(ins, "L").save(tmp_path / "voc" / "SegmentationObject" / (Path(s["file"]).stem + ".png"))
    upload_tree(yolo, "s3://dsc-src/yolo")
    upload_tree(tmp_path / "voc", "s3://dsc-src/VOC2012")
    kw = dict(size=(32, 32), resize="pad", progress=False)
    for name, local, remote, extra in (("yolo", str(yolo), "s3://dsc-src/yolo", {}),
                                       ("voc", str(tmp_path / "voc"), "s3://dsc-src/VOC2012",
                                        dict(split="train", masks="instance,semantic"))):
        compile_ = getattr(dsc, f"compile_{name}")
        r = compile_(remote, tmp_path / f"{name}-remote", workers=2, **extra, **kw)
        compile_(local, tmp_path / f"{name}-local", workers=1, **extra, **kw)
        a, b = dsc.open(tmp_path / f"{name}-remote"), dsc.open(tmp_path / f"{name}-local")
        assert r.manifest.source["root"].startswith("s3://dsc-src/"), r.manifest.source
        assert a.keys == b.keys and len(a) == len(b) == 6 and a.classes == b.classes, name
        assert shard_files(tmp_path / f"{name}-remote") == shard_files(tmp_path / f"{name}-local"), name
        ba, bb = a.get_batch(range(6)), b.get_batch(range(6))
        assert (ba["image"] == bb["image"]).all() and (ba["boxes"] == bb["boxes"]).all(), name
        if name == "voc":
            assert (ba["mask"] == bb["mask"]).all() and a.manifest.fields["masks"]["kind"] == "object_masks"
            assert all((a[i]["masks"] == b[i]["masks"]).all() for i in range(6))
            assert sum(len(a[i]["masks"]) for i in range(6)) > 0
    r = dsc.compile_yolo("s3://dsc-src/yolo", tmp_path / "yolo-data", data_yaml="s3://dsc-src/yolo/data.yaml",
                         workers=1, **kw)
    assert r.manifest.num_samples == 6
    with pytest.raises(SourceError, match=r"s3://dsc-src/VOC2012/ImageSets/Main/nope.txt: no such split file"):
        dsc.compile_voc("s3://dsc-src/VOC2012", tmp_path / "o", split="nope", **kw)


def test_a_delta_table_in_s3(s3, tmp_path):
    deltalake = pytest.importorskip("deltalake")
    from test_versions import _rows

    table = tmp_path / "table"
    deltalake.write_deltalake(str(table), _rows(range(0, 12)))
    deltalake.write_deltalake(str(table), _rows(range(12, 20)), mode="append")  # table version 1
    upload_tree(table, "s3://dsc-src/delta")
    kw = dict(size=(16, 16), shard_size=8, progress=False)
    r = dsc.compile_delta("s3://dsc-src/delta", tmp_path / "remote", workers=2, **kw)
    assert r.manifest.source["table_version"] == 1 and r.manifest.num_samples == 20
    dsc.compile_delta(str(table), tmp_path / "local", workers=1, **kw)
    assert sorted(samples(dsc.open(tmp_path / "remote")).values()) == sorted(samples(dsc.open(tmp_path / "local")).values())
    v0 = dsc.compile_delta("s3://dsc-src/delta", tmp_path / "v0", version=0, workers=1, **kw)
    assert v0.manifest.num_samples == 12


def test_a_parquet_table_in_s3_is_read_by_row_group(s3, tmp_path, monkeypatch):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    import io

    import numpy as np
    from PIL import Image

    from dsc.store.object import ObjectStore

    rng = np.random.default_rng(3)
    images = []
    for _ in range(64):
        b = io.BytesIO()
        Image.fromarray(rng.integers(0, 255, (40, 50, 3), dtype=np.uint8)).save(b, "PNG")
        images.append(b.getvalue())
    pq.write_table(pa.table({"image": images, "label": [i % 4 for i in range(64)]}), tmp_path / "t.parquet",
                   row_group_size=8)
    size = (tmp_path / "t.parquet").stat().st_size
    open_store("s3://dsc-src/table").put("t.parquet", (tmp_path / "t.parquet").read_bytes())
    dsc.compile_table(tmp_path / "t.parquet", tmp_path / "local", workers=1, **{**OPTS, "shard_size": 8})
    ranges = []
    real = ObjectStore.read_range_pinned  # (an input's ranges: each of the object its first one read)
    monkeypatch.setattr(ObjectStore, "read_range_pinned", lambda self, rel, a, b, etag=None: (
        ranges.append((rel, a, b)), real(self, rel, a, b, etag))[1])
    from dsc.compiler.sources.table import TableSource

    src = TableSource(path="s3://dsc-src/table/t.parquet")
    records = src.scan().records
    ranges.clear()
    fetch = src.fetcher(records[8:16])  # one unit: one row group
    assert fetch(records[9]).obj.getvalue() == images[9]
    got = sum(b - a for rel, a, b in ranges if rel.endswith("t.parquet"))
    assert 0 < got < size / 2, (got, size)  # the footer and that row group, not the file
    r = dsc.compile_table("s3://dsc-src/table", tmp_path / "remote", workers=2, **{**OPTS, "shard_size": 8})
    assert samples(dsc.open(r.path)) == samples(dsc.open(tmp_path / "local"))


@pytest.mark.parametrize("keep", [True, False], ids=["scan-keeps-images", "units-read-ranges"])
def test_the_requests_of_a_compile_from_s3_to_s3(data, tmp_path, monkeypatch, keep):
    """What a compile asks the bucket: the scan one streamed GET per tar and no HEAD (the GET's response says its
    size; its label and text members read as the walk passes them, never a second pass). The scan keeps the
    images it streamed past (up to KEEP_BYTES), so the units read no tar: each byte crosses the network once.
    Past that budget (here 0), a unit makes one GET per tar it reads, for its span only, and no HEAD (the scan's
    identities travel with the task: a unit here runs as in a fresh worker process, which knows nothing). A new
    shard: one create-only PUT, no HEAD before it."""
    import importlib

    from dsc.compiler.sources import inputs, webdataset
    from dsc.store.object import ObjectStore

    if not keep:
        monkeypatch.setattr(webdataset, "KEEP_BYTES", 0)

    C = importlib.import_module("dsc.compiler.compile")  # (dsc.compiler.compile is also the function)
    _, tars, ref = data
    calls = []
    for name in ("stat", "identity", "open_stream", "open_whole", "put", "get", "read_range", "etag"):
        def wrap(self, rel, *a, _real=getattr(ObjectStore, name), _name=name, **k):
            calls.append((_name, rel, a, k))
            return _real(self, rel, *a, **k)
        monkeypatch.setattr(ObjectStore, name, wrap)
    scan_done = []
    real_unit = C.compile_unit

    def fresh_unit(task, source):  # as a worker process would: no identity remembered from the scan
        scan_done.append(len(calls))
        monkeypatch.setattr(inputs, "_IDENTITY", {})
        return real_unit(task, source)
    monkeypatch.setattr(C, "compile_unit", fresh_unit)
    from dsc.store import object as O

    ahead, RA = [], O.ReadAhead
    monkeypatch.setattr(O, "ReadAhead", type("Counted", (RA,), {
        "__init__": lambda self, it, limit: (ahead.append(limit), RA.__init__(self, it, limit))[1]}))
    url = f"s3://dsc-out/counted-{keep}"
    r = dsc.compile_webdataset("s3://dsc-src/wds/{00000..00002}.tar", url, workers=1,
                               cache_dir=str(tmp_path / "cache"), **OPTS)
    assert r.manifest.num_samples == 30 and bucket_shards(url) == shard_files(ref)
    sizes = {t.name: t.stat().st_size for t in tars.glob("*.tar")}
    scan, units = calls[:scan_done[0]], calls[scan_done[0]:]
    tar_reads = [c for c in scan if c[1].endswith(".tar")]
    assert sorted(c[1].rsplit("/", 1)[-1] for c in tar_reads) == sorted(sizes)  # one stream per tar
    assert {c[0] for c in tar_reads} == {"open_whole"}  # (from its start: no HEAD, no range)
    streams = [c for c in units if c[0] == "open_stream" and c[1].endswith(".tar")]
    assert not [c for c in units if c[0] in ("stat", "identity") and c[1].endswith(".tar")]  # no HEAD of a tar
    if keep:
        assert streams == [] and ahead == []  # the units read nothing: their images came with their records
        return
    assert len(streams) <= 5 + 2  # 5 units of 7 samples over 3 tars of 10: at most two tars each, 7 spans in all
    asked = sum(c[2][1] - c[2][0] for c in streams)  # (start, end): each unit asks for its span only
    assert len(ahead) == len(streams)  # and reads it ahead of the decode, on a thread
    assert asked <= sum(sizes.values())
    shards = set(bucket_shards(url))
    assert not [c for c in calls if c[0] == "stat" and c[1] in shards]  # a new shard: put, never asked for first
    assert sorted(c[1] for c in calls if c[0] == "put" and c[1] in shards) == sorted(shards)


def test_the_scan_streams_a_big_tar_once(s3, tmp_path, monkeypatch):
    """A tar larger than the reader's buffer: its labels and captions are read as the walk passes them, so the
    scan is one GET of the tar (reading them after the walk went back to its start: a second GET of it all)."""
    import io
    import tarfile

    from dsc.compiler.sources.webdataset import index_tar
    from dsc.store.object import ObjectStore

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        for k in range(4):
            for ext, data in (("jpg", os.urandom(700_000)), ("cls", str(k).encode()), ("txt", b"a caption")):
                info = tarfile.TarInfo(f"s{k}.{ext}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    open_store("s3://dsc-src/big").put("0.tar", buf.getvalue())
    streams = []
    real, whole = ObjectStore.open_stream, ObjectStore.open_whole
    monkeypatch.setattr(ObjectStore, "open_stream", lambda self, rel, *a: (streams.append(a), real(self, rel, *a))[1])
    monkeypatch.setattr(ObjectStore, "open_whole", lambda self, rel: (streams.append((0,)), whole(self, rel))[1])
    samples_, cut = index_tar("s3://dsc-src/big/0.tar", ("jpg",), "cls", None, {"txt": "text"})
    assert cut is None and [(s.key, s.label, s.values) for s in samples_] == [
        (f"s{k}", k, {"txt": "a caption"}) for k in range(4)]
    assert len(streams) == 1 and streams[0][0] == 0


def test_the_scan_sends_its_index_workers_each_tar_by_its_url_only(data):
    """A prefix's listing says each tar's identity, but the tar's scan is one GET whose answer says it again (and
    is the one remembered): the scan hands its index workers (threads, or a cluster's) the URLs alone, not the
    listing's identities to remember first (dead work, pickled with every task on a cluster)."""
    from dsc.compiler.sources.webdataset import WebDatasetSource

    src = WebDatasetSource(src="s3://dsc-src/wds/")
    sent = []
    src.index_map = lambda fn, items: [fn(x) for x in sent.extend(items) or items]
    scanned = src.scan()
    assert sent == [f"s3://dsc-src/wds/{k:05d}.tar" for k in range(3)] and len(scanned.records) == 30


def test_a_tar_gone_since_the_scan_is_a_named_bad_input(data, s3):
    """Its unit's request is made on the read-ahead thread; the missing object still reaches the sample as
    "the tar is gone since the scan", not as an error of the stream."""
    from dsc.compiler.sources import webdataset
    from dsc.compiler.sources.webdataset import WebDatasetSource

    _, tars, _ = data
    open_store("s3://dsc-src/gone").put("00000.tar", (tars / "00000.tar").read_bytes())
    src = WebDatasetSource(src="s3://dsc-src/gone/00000.tar")
    with pytest.MonkeyPatch.context() as m:
        m.setattr(webdataset, "KEEP_BYTES", 0)  # (the scan keeps no image: the unit reads the tar)
        records = src.scan().records
    open_store("s3://dsc-src/gone").delete("00000.tar")
    with pytest.raises(SampleError, match="gone since the scan"):
        src.fetcher(records[:3])(records[0])


def test_a_tar_replaced_under_its_name_is_read_anew_by_the_next_scan_of_this_process(data, tmp_path):
    """A process that compiled the tars once (and so knows their identities) and compiles again after one was
    replaced by another of that name: the scan takes each tar's identity from its own GET, so the update sees the
    new tar (its samples, at their offsets) and matches a fresh compile; an identity remembered from before is
    never trusted (it read the new bytes with the old size, and judged the tar unchanged)."""
    folder, tars, _ = data
    store = open_store("s3://dsc-src/replaced")
    for t in sorted(tars.glob("*.tar")):
        store.put(t.name, t.read_bytes())
    src = "s3://dsc-src/replaced/{00000..00002}.tar"
    out = tmp_path / "out"
    dsc.compile_webdataset(src, out, workers=1, **OPTS)
    other = tmp_path / "other"
    write_imagefolder(other, num_classes=3, per_class=4, size_range=(30, 70), seed=5)
    new = pack_webdataset(other, tmp_path / "other-tars", per_tar=12)[0]
    store.put("00001.tar", new.read_bytes())
    r = dsc.compile_webdataset(src, out, update=True, workers=1, **OPTS)
    assert r.committed and r.plan["decoded"] == 12, r.plan  # (the new tar's samples, decoded)
    fresh = dsc.compile_webdataset(src, tmp_path / "fresh", workers=1, **OPTS)
    assert samples(dsc.open(out)) == samples(dsc.open(fresh.path)) and fresh.manifest.num_samples == 32


def test_the_scan_keeps_images_up_to_its_budget_and_the_rest_are_read_by_the_units(data, tmp_path, monkeypatch):
    """KEEP_BYTES bounds the image bytes the scan holds: with room for one tar of three, one tar's samples come
    with their bytes and the units read the other two; the shards are the local compile's either way."""
    from dsc.compiler.sources import webdataset

    _, tars, ref = data
    monkeypatch.setattr(webdataset, "KEEP_BYTES", max(t.stat().st_size for t in tars.glob("*.tar")) + 1)
    src = webdataset.WebDatasetSource(src="s3://dsc-src/wds/{00000..00002}.tar")
    records = src.scan().records
    kept = [r for r in records if r.member[3]]
    assert len(kept) == 10 and len({r.path for r in kept}) == 1  # one tar, whole
    assert all(len(r.member[3]) == r.member[2] for r in kept)
    r = dsc.compile_webdataset("s3://dsc-src/wds/{00000..00002}.tar", tmp_path / "w", workers=2, **OPTS)
    assert shard_files(tmp_path / "w") == shard_files(ref)


def test_a_killed_compile_of_tars_in_a_bucket_resumes_with_the_images_the_scan_kept(data, tmp_path):
    """The scan's kept images travel inside the records, never into the journal's fingerprint: a compile killed
    after two units resumes (its scan keeps them again), keeps those units and ends with the local shards."""
    import signal

    from click.testing import CliRunner

    from conftest import journal_units, stopped_at_unit
    from dsc.cli import main

    _, _, ref = data
    out = tmp_path / "out"
    argv = ["compile", "webdataset", "s3://dsc-src/wds/{00000..00002}.tar", str(out), "--size", "24,32",
            "--shard-size", "7", "--workers", "2", "-q"]
    r = stopped_at_unit(argv, 2, signal.SIGKILL)
    assert r.returncode == -signal.SIGKILL, r.stderr
    assert len(journal_units(tmp_path / ".out.dsc-tmp")) >= 2 and not out.exists()
    res = CliRunner().invoke(main, argv + ["--resume"])
    assert res.exit_code == 0 and "resumed:" in res.output, res.output
    assert shard_files(out) == shard_files(ref)


def test_a_network_failure_in_the_scan_is_no_truncated_tar(data, s3, monkeypatch):
    """A stream that keeps failing past its retries is the network's fault, not the tar's: the scan stops with
    an error naming the tar, where it read a cut ("the tar is truncated or damaged") and skipped its samples."""
    from dsc.compiler.sources.webdataset import index_tar
    from dsc.errors import RemoteError
    from dsc.store.object import StreamFile

    real = StreamFile.readinto

    def broken(self, b):  # (a few small reads, then a connection that keeps breaking)
        if self.pos > 3000:
            raise ConnectionResetError("the connection broke")
        return real(self, memoryview(b)[:1024])
    monkeypatch.setattr(StreamFile, "readinto", broken)
    with pytest.raises(RemoteError, match="00000.tar: reading it failed"):
        index_tar("s3://dsc-src/wds/00000.tar", ("jpg",), "cls", None)


def _big_tar() -> bytes:
    """A tar of 4 samples whose images are 300 KB each (a read can fail inside one)."""
    import io
    import random
    import tarfile

    buf, rng = io.BytesIO(), random.Random(3)
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for k in range(4):
            for ext, blob in (("jpg", rng.randbytes(300_000)), ("cls", b"1")):
                ti = tarfile.TarInfo(f"s{k}.{ext}")
                ti.size = len(blob)
                tf.addfile(ti, io.BytesIO(blob))
    return buf.getvalue()


@pytest.mark.parametrize("error", [ConnectionResetError, RuntimeError])  # (RuntimeError: as obstore's GenericError,
def test_a_failure_reading_a_kept_image_or_a_member_names_the_tar(s3, monkeypatch, error):  # no OSError)
    """A stream that fails inside an image the scan keeps, or with an error that is no OSError (obstore's, past
    StreamFile's reopens), and a unit's member read failing so: a RemoteError naming the tar and the byte, never
    a bare exception (a traceback from the CLI)."""
    from dsc.compiler.sources.base import Record
    from dsc.compiler.sources.webdataset import Keep, _member, index_tar
    from dsc.errors import RemoteError
    from dsc.store.object import StreamFile

    open_store("s3://dsc-src/cut").put("0.tar", _big_tar())
    real = StreamFile.readinto

    def broken(self, b):  # (small reads, then a connection that keeps breaking, inside the first image)
        if self.pos > 100_000:
            raise error("the connection broke")
        return real(self, memoryview(b)[:1024])
    monkeypatch.setattr(StreamFile, "readinto", broken)
    with pytest.raises(RemoteError, match=r"cut/0.tar: reading it failed at byte 100,\d{3} of"):  # (where it stopped)
        index_tar("s3://dsc-src/cut/0.tar", ("jpg",), "cls", None, None, Keep(1 << 30))
    f = open_store("s3://dsc-src/cut").reader("0.tar", 1_204_000, sequential=True)
    r = Record("s0", "s3://dsc-src/cut/0.tar")
    with pytest.raises(RemoteError, match=r"cut/0.tar: reading its member at byte 512"):
        _member(f, r, 512, 300_000)


def test_etags_are_one_spelling_whoever_gave_them(s3):
    """A GET and a listing of one object may quote its ETag differently (fake-gcs does); the identity that says
    whether an input changed holds it without quotes or weak mark, the first time it is asked (by a HEAD, whose
    ETag moto quotes) as every time after."""
    from dsc.compiler.sources import inputs

    assert inputs.etag_of('W/"abc"') == inputs.etag_of('"abc"') == inputs.etag_of("abc") == "abc"
    inputs.remember("s3://b/x.tar", 10, 1.0, '"abc"')
    quoted = inputs.identity("s3://b/x.tar")
    inputs.remember("s3://b/x.tar", 10, 1.0, "abc")
    assert inputs.identity("s3://b/x.tar") == quoted
    open_store("s3://dsc-src/etag").put("x.bin", b"some bytes")
    url = "s3://dsc-src/etag/x.bin"
    inputs._IDENTITY.pop(url, None)
    first = inputs.identity(url)  # (a HEAD)
    assert inputs.identity(url) == first  # (remembered)


def test_read_ahead_runs_ahead_within_its_limit_and_hands_failures_on():
    """The thread behind a unit's tar stream (ObjectStore.reader(..., ahead=)): it reads chunks before they are
    asked for, never more than its limit ahead, hands them on in order, and a failure where it happened."""
    import time

    from dsc.store.object import ReadAhead

    pulled = []

    def chunks(fail_at=None):
        for i in range(10):
            if i == fail_at:
                raise ConnectionError("the connection broke")
            pulled.append(i)
            yield bytes([i]) * 1000

    ra = ReadAhead(chunks(), 3000)
    deadline = time.monotonic() + 10
    while len(pulled) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)
    assert len(pulled) == 4  # 3,000 bytes buffered and one chunk in hand, none asked for yet
    assert b"".join(ra) == b"".join(bytes([i]) * 1000 for i in range(10))
    pulled.clear()
    broken = ReadAhead(chunks(fail_at=2), 1 << 20)
    assert next(broken) == bytes([0]) * 1000 and next(broken) == bytes([1]) * 1000
    with pytest.raises(ConnectionError):
        next(broken)
    held = ReadAhead(chunks(), 1000)
    held.stop()  # (a reader closed midway: its thread ends)
    held._thread.join(5)
    assert not held._thread.is_alive()


def test_units_sharing_a_parquet_row_group_read_it_once(s3, tmp_path, monkeypatch):
    """A worker reads a Parquet file's footer once, and a row group that several of its units share (shards of
    fewer rows than a row group) once: one range request for exactly its bytes, not a footer and the group
    (and a buffer's read past it) per unit."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")

    from dsc.compiler.sources import inputs, table
    from dsc.compiler.sources.table import TableSource
    from dsc.store.object import ObjectStore

    images = [bytes([k]) * 3000 for k in range(64)]
    pq.write_table(pa.table({"image": images, "label": [k % 4 for k in range(64)]}), tmp_path / "t.parquet",
                   row_group_size=16)
    open_store("s3://dsc-src/groups").put("t.parquet", (tmp_path / "t.parquet").read_bytes())
    src = TableSource(path="s3://dsc-src/groups/t.parquet")
    records = src.scan().records
    src.footers = {}  # (a source that brought no footer from the scan: read by the worker, once)
    monkeypatch.setattr(table, "_FOOTERS", {})  # (a worker process: nothing read yet)
    monkeypatch.setattr(table, "_GROUPS", {})
    monkeypatch.setattr(inputs, "_IDENTITY", dict(inputs._IDENTITY))
    ranges = []
    real = ObjectStore.read_range_pinned
    monkeypatch.setattr(ObjectStore, "read_range_pinned", lambda self, rel, a, b, etag=None: (
        ranges.append((a, b)), real(self, rel, a, b, etag))[1])
    got = []
    for u in range(0, 64, 8):  # 8 units of 8 rows: two a row group
        fetch = src.fetcher(records[u:u + 8])
        got += [fetch(r).obj.getvalue() for r in records[u:u + 8]]
    assert got == images
    meta = pq.ParquetFile(tmp_path / "t.parquet").metadata
    chunks = sorted((c.data_page_offset if c.dictionary_page_offset is None else c.dictionary_page_offset,
                     c.total_compressed_size) for g in range(4) for c in [meta.row_group(g).column(0)])
    footer = [r for r in ranges if r[1] == (tmp_path / "t.parquet").stat().st_size]
    assert len(footer) == 1  # the footer once
    assert sorted((a, b - a) for a, b in ranges if (a, b) not in footer) == chunks  # each group once, exactly


def test_the_next_units_row_groups_are_read_ahead_once(s3, tmp_path, monkeypatch):
    """``TableSource.prefetch`` (a worker told its next unit) reads that unit's row groups on a thread; the unit,
    when it runs, takes them as they are (or waits for the read in flight): each row group one request."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    import time

    from dsc.compiler.sources import inputs, table
    from dsc.compiler.sources.table import TableSource
    from dsc.store.object import ObjectStore

    images = [bytes([k]) * 2000 for k in range(32)]
    pq.write_table(pa.table({"image": images, "label": [k % 2 for k in range(32)]}), tmp_path / "t.parquet",
                   row_group_size=8)
    open_store("s3://dsc-src/ahead").put("t.parquet", (tmp_path / "t.parquet").read_bytes())
    src = TableSource(path="s3://dsc-src/ahead/t.parquet")
    records = src.scan().records
    for name in ("_FOOTERS", "_GROUPS", "_READING"):  # (a worker process: nothing read yet)
        monkeypatch.setattr(table, name, {})
    monkeypatch.setattr(inputs, "_IDENTITY", dict(inputs._IDENTITY))
    meta = pq.ParquetFile(tmp_path / "t.parquet").metadata
    starts = [(c.dictionary_page_offset if c.has_dictionary_page else c.data_page_offset)
              for g in range(4) for c in [meta.row_group(g).column(0)]]
    ranges = []
    real = ObjectStore.read_range_pinned
    monkeypatch.setattr(ObjectStore, "read_range_pinned", lambda self, rel, a, b, etag=None: (
        ranges.append(a), real(self, rel, a, b, etag))[1])
    fetch = src.fetcher(records[0:8])  # the unit running now: group 0
    src.prefetch(records[8:16])  # its worker's next unit: group 1, read on a thread
    for _ in range(500):
        if len(table._GROUPS) == 2:
            break
        time.sleep(0.01)
    assert len(table._GROUPS) == 2  # read without anyone waiting for it
    asked = len(ranges)
    nxt = src.fetcher(records[8:16])
    assert [nxt(r).obj.getvalue() for r in records[8:16]] == images[8:16]
    assert len(ranges) == asked  # nothing asked again
    src.prefetch(records[16:24])
    then = src.fetcher(records[16:24])  # at once: it waits for the read in flight
    assert [then(r).obj.getvalue() for r in records[16:24]] == images[16:24]
    assert [fetch(r).obj.getvalue() for r in records[0:8]] == images[0:8]
    assert sorted(a for a in ranges if a in starts) == starts[:3]  # each group one request


def _parquet_in_s3(tmp_path, url: str, seed: int) -> tuple[set, set]:
    """96 small PNGs and labels in a Parquet file of 6 row groups, put at ``url``/t.parquet: the byte offsets where
    each row group's image chunk and label chunk start (what a range GET of that chunk asks for first)."""
    import io

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image

    rng = np.random.default_rng(seed)
    images = []
    for _ in range(96):
        b = io.BytesIO()
        Image.fromarray(rng.integers(0, 255, (20, 24, 3), dtype=np.uint8)).save(b, "PNG")
        images.append(b.getvalue())
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"image": images, "label": [i % 3 for i in range(96)]}), path, row_group_size=16)
    open_store(url).put("t.parquet", path.read_bytes())
    meta = pq.ParquetFile(path).metadata

    def starts(column):
        return {(c.data_page_offset if not c.has_dictionary_page else c.dictionary_page_offset)
                for g in range(meta.num_row_groups) for c in [meta.row_group(g).column(column)]}
    return starts(0), starts(1)


def test_the_requests_of_a_parquet_file_compiled_from_s3(s3, tmp_path, monkeypatch):
    """Every request a compile of a Parquet file in the bucket makes of it, as the server sees them: no HEAD (the
    footer is read by one GET of the file's last 64 KiB, whose response says its size and ETag), the label and key
    chunks of each row group (side by side in the file) by one GET, and each row group's image chunk once (units of
    one row group, 2 workers; a unit taken over at the end reads its group again): 1 + 3 + 4 (or 5) requests, where
    there were 2 HEADs, a footer, 8 chunks and 4 (or 5) groups."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    import threading

    from moto.s3.responses import S3Response

    images = [bytes(samples_png(k)) for k in range(64)]
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"image": images, "label": [k % 4 for k in range(64)],
                             "key": [f"k{k:03d}" for k in range(64)]}), path, row_group_size=16)
    open_store("s3://dsc-src/counted").put("t.parquet", path.read_bytes())
    asked, lock = [], threading.Lock()  # (the server runs in this process: it sees the workers' requests too)
    real = S3Response._key_response

    def counted(self, request, full_url):
        if request.path.endswith("/counted/t.parquet"):
            with lock:
                asked.append((request.method, request.headers.get("range")))
        return real(self, request, full_url)
    monkeypatch.setattr(S3Response, "_key_response", counted)
    r = dsc.compile_table("s3://dsc-src/counted/t.parquet", tmp_path / "out", key_column="key", workers=2,
                          **{**OPTS, "shard_size": 16})
    ref = dsc.compile_table(path, tmp_path / "ref", key_column="key", workers=1, **{**OPTS, "shard_size": 16})
    assert samples(dsc.open(r.path)) == samples(dsc.open(ref.path))
    meta = pq.ParquetFile(path).metadata
    chunk = [[(c.dictionary_page_offset if c.has_dictionary_page else c.data_page_offset, c.total_compressed_size)
              for c in map(meta.row_group(g).column, range(3))] for g in range(4)]
    size = path.stat().st_size
    assert [m for m, _ in asked] == ["GET"] * len(asked)  # no HEAD
    assert asked[0] == ("GET", "bytes=-65536")  # the footer first, by a suffix range
    images_read = [r for _, r in asked[1:] if r in {f"bytes={a}-{a + n - 1}" for (a, n), _, _ in chunk}]
    assert len(set(images_read)) == 4 and len(images_read) <= 5, asked  # each group's images once (a unit taken
    #                                                                      over at the end: its group read twice)
    labels = {f"bytes={lab[0]}-{key[0] + key[1] - 1}" for _, lab, key in chunk if key[0] + key[1] < size - 65536}
    assert sorted(r for _, r in asked[1:] if r not in images_read) == sorted(labels), asked  # a group's labels and
    #                                                          keys: one GET (the last group's: in the footer's read)


def test_an_empty_or_missing_parquet_object_says_what_it_is(s3, tmp_path):
    """An empty .parquet object (S3 answers the footer's suffix range with 416): not a readable Parquet file, as a
    local empty file is, not a failed request; a missing one: no such object, its URL named."""
    open_store("s3://dsc-src/empty").put("t.parquet", b"")
    with pytest.raises(SourceError, match=r"empty/t\.parquet: not a readable Parquet or Arrow file \(Parquet file size "
                                          r"is 0 bytes\)"):
        dsc.compile_table("s3://dsc-src/empty/t.parquet", tmp_path / "out", workers=1, **OPTS)
    with pytest.raises(SourceError, match=r"s3://dsc-src/empty/none\.parquet: no such object \(and no objects under "
                                          r"it as a prefix\)"):
        dsc.compile_table("s3://dsc-src/empty/none.parquet", tmp_path / "out2", workers=1, **OPTS)


def samples_png(k: int) -> bytes:
    import io

    import numpy as np
    from PIL import Image

    b = io.BytesIO()
    Image.fromarray(np.random.default_rng(k).integers(0, 255, (20, 24, 3), dtype=np.uint8)).save(b, "PNG")
    return b.getvalue()


def test_two_workers_read_each_parquet_row_group_about_once(s3, tmp_path, monkeypatch):
    """With 2 workers, units of one row group go to one worker (each runs a contiguous run of units, reading the
    group its next unit needs ahead of time): the server is asked for each row group's image chunk about once (a
    run's edge, or a unit taken over at the end, can read one twice), not once per worker as when units went out
    in order, alternating between the workers. The scan reads the label chunks 8 at once, each exactly once."""
    pytest.importorskip("pyarrow.parquet")
    import threading

    from moto.s3.responses import S3Response

    image_chunks, label_chunks = _parquet_in_s3(tmp_path, "s3://dsc-src/runs", seed=5)
    path = tmp_path / "t.parquet"
    asked, lock = [], threading.Lock()  # (the server runs in this process: it sees the workers' requests too)
    real = S3Response._handle_range_header

    def counted(self, request, headers, content):
        if request.path.endswith("/runs/t.parquet"):
            with lock:
                asked.append(int(request.headers["range"].split("=")[1].split("-")[0] or -1))  # (-1: a suffix)
        return real(self, request, headers, content)
    monkeypatch.setattr(S3Response, "_handle_range_header", counted)
    from dsc.store.object import ObjectStore

    threads, read = [], ObjectStore.read_range_pinned  # (the scan runs here: which thread asked for each label chunk)
    monkeypatch.setattr(ObjectStore, "read_range_pinned", lambda self, rel, a, b, etag=None: (
        threads.append((a, threading.current_thread().name)), read(self, rel, a, b, etag))[1])
    r = dsc.compile_table("s3://dsc-src/runs/t.parquet", tmp_path / "out", workers=2,
                          **{**OPTS, "shard_size": 4})  # 24 units, 4 a row group
    ref = dsc.compile_table(path, tmp_path / "ref", workers=1, **{**OPTS, "shard_size": 4})
    assert samples(dsc.open(r.path)) == samples(dsc.open(ref.path))
    group_reads = [a for a in asked if a in image_chunks]
    assert set(group_reads) == image_chunks
    assert len(group_reads) <= len(image_chunks) + 3, sorted(group_reads)  # (in order: about 2 x 6)
    tail = path.stat().st_size - (64 << 10)  # (the footer's read: the label chunks in it are not asked again)
    assert sorted(a for a in asked if a in label_chunks) == sorted(a for a in label_chunks if a < tail)  # each once,
    assert {name.split("_")[0] for a, name in threads if a in label_chunks} == {"dsc-range"}  # read ahead together
    footer = [a for a in asked if a not in image_chunks | label_chunks]
    assert len(footer) == 1, footer  # the footer: read by the scan, handed to the workers with the source


def test_a_pool_in_runs_gives_each_worker_contiguous_tasks_and_says_the_next():
    """``imap_unordered(runs=True)``: every task once; a worker's tasks follow one another (it starts at an evenly
    spaced place and, its run done, takes over the far half of the longest run left); ``then`` tells each task
    the one its worker takes next."""
    from dsc.compiler.pool import WorkerPool, _Runs

    lazy = range(10)  # (a compile's UnitTasks: made on access, never listed whole)
    assert _Runs(lazy, 2).tasks is lazy
    runs = _Runs(list(range(10)), 2)
    order = {0: [], 1: []}
    for w in (0, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 1, 1):  # worker 1 fast at first, then worker 0
        t = runs.peek(w)
        if t is not None:
            runs.take(w)
            order[w].append(t)
    assert sorted(order[0] + order[1]) == list(range(10))
    assert order[1][:5] == [5, 6, 7, 8, 9] and order[0][0] == 0  # runs [0, 5) and [5, 10), then the rest
    assert order[0] == sorted(order[0])  # (worker 1 took nothing of worker 0's run back: it took the far half)

    pool = WorkerPool(2, _task_and_pid)
    try:
        got = list(pool.imap_unordered(list(range(12)), runs=True, then=lambda t, nxt: (t, nxt)))
    finally:
        pool.close()
    assert sorted(t for t, _, _ in got) == list(range(12))
    by_pid: dict = {}
    for t, nxt, pid in got:
        by_pid.setdefault(pid, []).append((t, nxt))
    for seq in by_pid.values():
        for (t, nxt), (t2, _) in zip(seq, seq[1:]):
            assert nxt in (t2, None) or t2 > nxt  # (told the next of its run, unless another took it over)


def _task_and_pid(task):
    t, nxt = task
    return t, nxt, os.getpid()


# --------------------------------------------------------------------------- a cluster with no shared folder
@pytest.fixture(scope="module")
def cluster():
    """A Dask LocalCluster whose worker processes start in a folder of their own, with a TMPDIR of their own
    (where their units write): nothing under the client's tmp_path or cache is theirs. Yields (client, the
    workers' folder). One for the module (a cluster takes seconds to start)."""
    distributed = pytest.importorskip("distributed")
    workers = Path(tempfile.mkdtemp(prefix="dsc-workers-"))
    (workers / "tmp").mkdir()
    here = os.getcwd()
    os.chdir(workers)
    try:
        lc = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                      dashboard_address=None, local_directory=str(workers / "dask"),
                                      env={"TMPDIR": str(workers / "tmp")})
    finally:
        os.chdir(here)
    client = distributed.Client(lc)
    try:
        yield client, workers
    finally:
        client.close()
        lc.close()
        shutil.rmtree(workers, ignore_errors=True)


def _watch_stage(monkeypatch) -> list:
    """The files of the client's staging, listed as each compile to a URL ends (before it is removed)."""
    from dsc.compiler import upload

    seen, real = [], upload._unstage
    monkeypatch.setattr(upload, "_unstage", lambda root, stage, **k: (seen.extend(
        p.relative_to(root).as_posix() for p in Path(root).rglob("*") if p.is_file()), real(root, stage, **k))[1])
    return seen


def _no_index_here(monkeypatch):
    from dsc.compiler.sources import webdataset

    def refuse(*a, **k):
        raise AssertionError("the client read a tar: the scan of a cluster compile runs on its workers")
    monkeypatch.setattr(webdataset, "index_tar", refuse)


_COUNT_SECEDES = """
def arm(path):
    import distributed
    real = getattr(distributed, "_uncounted_secede", distributed.secede)
    distributed._uncounted_secede = real
    def secede():
        with open(path, "a") as f:
            f.write("seceded\\n")
        return real()
    distributed.secede = secede

def disarm():
    import distributed
    distributed.secede = getattr(distributed, "_uncounted_secede", distributed.secede)
"""


def test_a_cluster_without_a_shared_folder_compiles_s3_to_s3(data, cluster, tmp_path, monkeypatch):
    _, _, ref = data
    client, workers = cluster
    assert set(client.run(tempfile.gettempdir).values()) == {str(workers / "tmp")}
    assert set(client.run(os.getcwd).values()) == {str(workers)}
    staged = _watch_stage(monkeypatch)
    _no_index_here(monkeypatch)
    scope: dict = {}
    exec(_COUNT_SECEDES, scope)
    client.run(scope["arm"], str(workers / "seceded"))
    url = "s3://dsc-out/cluster"
    try:
        r = dsc.compile_webdataset("s3://dsc-src/wds/{00000..00002}.tar", url, executor=client,
                                   cache_dir=str(tmp_path / "cache"), **OPTS)
    finally:
        client.run(scope["disarm"])
    # a unit's upload left the worker's thread pool: the worker went on to its next unit meanwhile
    assert (workers / "seceded").read_text().split() and len((workers / "seceded").read_text().split()) <= 5
    assert r.path == url and r.manifest.num_samples == 30
    assert staged and not [p for p in staged if "/image/c/" in p]  # no pixel ever reached the client's staging
    assert not list((workers / "tmp").iterdir())  # the units' folders are gone
    assert bucket_shards(url) == shard_files(ref)  # byte-identical to the local compile
    assert samples(dsc.open(url, cache_dir=tmp_path / "c")) == samples(dsc.open(ref))
    assert dsc.verify(url, cache_dir=tmp_path / "c").ok


_KILL_ONCE = """
def arm(marker):
    import os, signal
    from dsc.compiler import units
    real = units.compile_sample
    def compile_sample(rec, *a, **k):
        if rec.key.endswith("class_01_img_00002") and not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)  # this worker dies in the middle of its unit
        return real(rec, *a, **k)
    units.compile_sample = compile_sample
"""


def test_a_worker_killed_mid_unit_is_retried_elsewhere(data, cluster, tmp_path):
    _, _, ref = data
    client, workers = cluster
    scope: dict = {}
    exec(_KILL_ONCE, scope)
    marker = str(workers / "killed")
    client.run(scope["arm"], marker)
    url = "s3://dsc-out/killed"
    r = dsc.compile_webdataset("s3://dsc-src/wds", url, executor=client, cache_dir=str(tmp_path / "cache"), **OPTS)
    assert os.path.exists(marker) and r.manifest.num_samples == 30
    assert bucket_shards(url) == shard_files(ref)


def test_a_bad_member_on_the_cluster_and_resume_from_the_bucket(data, cluster, tmp_path):
    folder, tars, ref = data
    client, _ = cluster
    bad = tmp_path / "tars"
    shutil.copytree(tars, bad)
    whole = (bad / "00002.tar").read_bytes()
    at = whole.index(b"class_02_img_00009.jpg") + 512  # the last sample's image data: not a JPEG any more
    (bad / "00002.tar").write_bytes(whole[:at] + b"\0" * 64 + whole[at + 64:])
    upload_tree(bad, "s3://dsc-src/badwds")
    url, cache = "s3://dsc-out/resumed", tmp_path / "cache"
    with pytest.raises(SampleError) as e:
        dsc.compile_webdataset("s3://dsc-src/badwds", url, executor=client, cache_dir=str(cache), **OPTS)
    assert "00002.tar:class_02_img_00009.jpg" in str(e.value)
    # a bad member mid-way with --on-error skip: the following shards are compacted (fetched back from the bucket,
    # re-streamed, uploaded again in place of this writer's first upload), as a local compile compacts them
    mid = tmp_path / "mid"
    shutil.copytree(tars, mid)
    whole = (mid / "00001.tar").read_bytes()
    at = whole.index(b"class_01_img_00003.jpg") + 512
    (mid / "00001.tar").write_bytes(whole[:at] + b"\0" * 64 + whole[at + 64:])
    upload_tree(mid, "s3://dsc-src/midwds")
    skipped = dsc.compile_webdataset("s3://dsc-src/midwds", "s3://dsc-out/skipped", executor=client,
                                     cache_dir=str(tmp_path / "c2"), on_error="skip", **OPTS)
    assert [s["key"] for s in skipped.skipped] == ["00001.tar/class_01_img_00003"]
    local = dsc.compile_webdataset(str(mid), tmp_path / "mid.dsc", on_error="skip", workers=1, **OPTS)
    assert local.manifest.num_samples == 29 and bucket_shards("s3://dsc-out/skipped") == shard_files(local.path)
    open_store("s3://dsc-src/badwds").put("00002.tar", (tars / "00002.tar").read_bytes())  # fixed in the bucket
    r = dsc.compile_webdataset("s3://dsc-src/badwds", url, executor=client, cache_dir=str(cache), resume=True,
                               **OPTS)
    assert r.resumed_units >= 1 and r.decoded <= 30 - 7 * r.resumed_units  # (units 2..4 read the replaced tar)
    assert bucket_shards(url) == shard_files(ref)


_COUNT_DECODES = """
def arm(folder):
    import os
    from dsc.compiler import units
    real = getattr(units, "_uncounted", units.compile_sample)
    units._uncounted = real
    def compile_sample(rec, *a, **k):
        with open(os.path.join(folder, "decoded-%d" % os.getpid()), "a") as f:
            f.write(rec.key + "\\n")
        return real(rec, *a, **k)
    units.compile_sample = compile_sample

def disarm():
    from dsc.compiler import units
    units.compile_sample = getattr(units, "_uncounted", units.compile_sample)
"""


def test_an_update_on_a_cluster_without_a_shared_folder(data, cluster, tmp_path, monkeypatch):
    """--update of a dataset in S3 from tars in S3 on the cluster: the workers decode only the changed tar's
    changed samples and upload their shards; the client's staging never holds a shard; the result is what a
    fresh compile of the tars as they are now holds."""
    from PIL import Image

    folder, tars, _ = data
    client, workers = cluster
    url, cache = "s3://dsc-out/updated", str(tmp_path / "cache")
    upload_tree(tars, "s3://dsc-src/upd")
    dsc.compile_webdataset("s3://dsc-src/upd", url, executor=client, cache_dir=cache, **OPTS)
    changed = tmp_path / "folder"
    shutil.copytree(folder, changed)
    for stem, color in (("img_00002", (250, 10, 10)), ("img_00005", (10, 250, 10))):
        Image.new("RGB", (41, 37), color).save(changed / "class_01" / f"{stem}.jpg", quality=90)
    new_tars = pack_webdataset(changed, tmp_path / "tars", per_tar=10)
    differ = [t.name for t in new_tars if t.read_bytes() != (tars / t.name).read_bytes()]
    assert differ == ["00001.tar"]
    open_store("s3://dsc-src/upd").put("00001.tar", (tmp_path / "tars" / "00001.tar").read_bytes())
    scope: dict = {}
    exec(_COUNT_DECODES, scope)
    counts = workers / "counts"
    counts.mkdir()
    client.run(scope["arm"], str(counts))
    staged = _watch_stage(monkeypatch)
    before = set((workers / "tmp").iterdir())  # (a worker killed by another test leaves its unit's folder)
    try:
        r = dsc.compile_webdataset("s3://dsc-src/upd", url, executor=client, cache_dir=cache, update=True, **OPTS)
    finally:
        client.run(scope["disarm"])
    decoded = sorted(k for p in counts.iterdir() for k in p.read_text().split())
    assert decoded == ["00001.tar/class_01_img_00002", "00001.tar/class_01_img_00005"]  # nothing else decoded
    assert r.committed and r.version == 1 and r.plan["changed"] == 2 and r.decoded == 2
    assert staged and not [p for p in staged if "/image/c/" in p]  # the new shard went up from a worker
    assert set((workers / "tmp").iterdir()) == before
    fresh = dsc.compile_webdataset(str(tmp_path / "tars"), tmp_path / "fresh.dsc", workers=1, **OPTS)
    assert samples(dsc.open(url, cache_dir=tmp_path / "c")) == samples(dsc.open(fresh.path))
    assert dsc.verify(url, cache_dir=tmp_path / "c").ok


def test_workers_that_cannot_see_a_local_path_are_named(cluster, tmp_path):
    from dsc.compiler.cluster import check_workers_see

    client, _ = cluster
    with pytest.raises(SourceError, match=r"cannot read /nowhere/a\.jpg .* object storage"):
        check_workers_see(client, ["/nowhere/a.jpg"], None)
    with pytest.raises(SourceError, match="compile to a URL"):
        check_workers_see(client, [], "/nowhere/.out.dsc-tmp")


def test_a_bad_input_on_a_cluster_stops_with_one_line(cluster, tmp_path):
    """The CLI with --executor ADDRESS: a bad input stops the compile with its one-line error, and no traceback
    from the Dask client's shutdown ("Exception ignored in _dask_results ... IOLoop is closed")."""
    client, _ = cluster
    src = tmp_path / "src"
    write_imagefolder(src, num_classes=2, per_class=6, size_range=(30, 40), seed=2)
    (src / "class_01" / "img_00003.jpg").write_bytes(b"not a jpeg")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), *sys.path])}
    r = subprocess.run([sys.executable, "-m", "dsc.cli", "compile", "imagefolder", str(src), str(tmp_path / "out"),
                        "--size", "16", "--shard-size", "3", "-q", "--executor", client.scheduler.address],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stderr
    assert "img_00003.jpg" in r.stderr and "Traceback" not in r.stderr and "Exception ignored" not in r.stderr, \
        r.stderr


def test_webdataset_and_table_on_every_object_store(object_store_url, data, tmp_path):
    """The same reads (a listing, streamed GETs from an offset, range GETs) on S3, GCS and Azure."""
    _, tars, ref = data
    url = object_store_url
    upload_tree(tars, url + "/wds")
    dsc.compile_webdataset(url + "/wds", tmp_path / "w", workers=1, **OPTS)
    assert shard_files(tmp_path / "w") == shard_files(ref)
    from dsc.compiler.sources.inputs import open_input

    whole = (tars / "00001.tar").read_bytes()
    with open_input(url + "/wds/00001.tar", sequential=True) as f:
        f.seek(5000)
        assert f.read(3000) == whole[5000:8000]
        f.seek(100)  # back: a new stream
        assert f.read(10) == whole[100:110]
    with open_input(url + "/wds/00001.tar") as f:  # by ranges
        f.seek(len(whole) - 700)
        assert f.read() == whole[-700:]


_LOG_UNITS = """
def arm(folder):
    import os
    from dsc.compiler import units
    real = getattr(units, "_unlogged", units.compile_unit)
    units._unlogged = real
    def compile_unit(task, source):
        with open(os.path.join(folder, "units-%d" % os.getpid()), "a") as f:
            f.write("%d %d\\n" % (task.records[0].row, task.then[0].row if task.then else -1))
        return real(task, source)
    units.compile_unit = compile_unit

def disarm():
    from dsc.compiler import units
    units.compile_unit = getattr(units, "_unlogged", units.compile_unit)
"""


def test_a_cluster_reads_each_parquet_row_group_about_once_and_ahead(s3, cluster, tmp_path, monkeypatch):
    """On a Dask cluster, units of one Parquet row group go to one worker as in the local pool: each worker runs
    a contiguous run of units, told the unit it runs next (read ahead), so the server is asked for each row
    group's image chunk about once, not once per worker as when Dask handed the units out in order."""
    pytest.importorskip("pyarrow.parquet")
    import threading

    from moto.s3.responses import S3Response

    client, workers = cluster
    image_chunks, _ = _parquet_in_s3(tmp_path, "s3://dsc-src/daskruns", seed=6)
    path = tmp_path / "t.parquet"
    asked, lock = [], threading.Lock()  # (the server runs in this process: it sees the workers' requests)
    real = S3Response._handle_range_header

    def counted(self, request, headers, content):
        if request.path.endswith("/daskruns/t.parquet"):
            with lock:
                asked.append(int(request.headers["range"].split("=")[1].split("-")[0] or -1))  # (-1: a suffix)
        return real(self, request, headers, content)
    monkeypatch.setattr(S3Response, "_handle_range_header", counted)
    scope: dict = {}
    exec(_LOG_UNITS, scope)
    logs = workers / "unit-logs"
    logs.mkdir()
    client.run(scope["arm"], str(logs))
    try:
        r = dsc.compile_table("s3://dsc-src/daskruns/t.parquet", "s3://dsc-out/daskruns", executor=client,
                              cache_dir=str(tmp_path / "cache"), **{**OPTS, "shard_size": 4})  # 24 units, 4 a group
    finally:
        client.run(scope["disarm"])
    ref = dsc.compile_table(path, tmp_path / "ref", workers=1, **{**OPTS, "shard_size": 4})
    assert samples(dsc.open(r.path, cache_dir=tmp_path / "c")) == samples(dsc.open(ref.path))
    group_reads = [a for a in asked if a in image_chunks]
    assert set(group_reads) == image_chunks
    # (in order: about 2 x 6; a run's edge, a unit taken over at the end, or one Dask's work stealing moved to the
    # other worker can read a group twice)
    assert len(group_reads) <= len(image_chunks) + 3, sorted(group_reads)
    runs = [[tuple(map(int, line.split())) for line in p.read_text().splitlines()] for p in logs.iterdir()]
    assert sorted(first for run in runs for first, _ in run) == list(range(0, 96, 4))  # every unit once
    told = [nxt for run in runs for _, nxt in run if nxt >= 0]
    assert len(told) >= 24 - 2 * len(runs)  # every unit told its worker's next, but a run's last
    pairs = [(nxt, first2) for run in runs for (_, nxt), (first2, _) in zip(run, run[1:])]
    assert sum(nxt == first2 for nxt, first2 in pairs) >= len(pairs) - 4, runs  # and ran it next


def test_a_unit_is_told_only_where_its_next_unit_reads():
    """``then`` carries the next unit's paths and rows (all a prefetch reads), not its keys, labels, targets or
    value fields: a task does not pickle a second unit's annotations."""
    import pickle

    from dsc.compiler.compile import _then
    from dsc.compiler.sources.base import Record
    from dsc.compiler.units import UnitTask

    def unit(s):
        return UnitTask(s, 8 * s, [Record(f"t.parquet#{i}", "s3://b/t.parquet", label=i % 3, row=i,
                                          fields=(("caption", f"the caption of row {i} " * 4),))
                                   for i in range(8 * s, 8 * s + 8)], "", None, 8, ())
    a, b = unit(0), unit(1)
    told = _then(a, b)
    assert [(r.path, r.row) for r in told.then] == [(r.path, r.row) for r in b.records]
    assert {(r.key, r.label, r.target, r.fields) for r in told.then} == {("", -1, None, ())}
    assert len(pickle.dumps(told)) - len(pickle.dumps(a)) < len(pickle.dumps(b.records)) / 3
    assert _then(a, None) is a


def _endpoint(_):
    return os.environ.get("AWS_ENDPOINT_URL"), os.environ.get("DSC_TEST_GONE")


def test_fresh_workers_see_the_environment_as_it_is_now(monkeypatch):
    """Workers that read a bucket are forked from a fork server started once per process: they get the parent's
    environment as it is when the pool starts (an endpoint or credentials set since the server started, a
    variable removed since), not the server's, which a second compile in the same process would have used."""
    from dsc.compiler.pool import WorkerPool

    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://first.invalid")
    monkeypatch.setenv("DSC_TEST_GONE", "here")
    for want, gone in (("http://first.invalid", "here"), ("http://second.invalid", None)):
        monkeypatch.setenv("AWS_ENDPOINT_URL", want)
        if gone is None:
            monkeypatch.delenv("DSC_TEST_GONE")
        pool = WorkerPool(2, _endpoint, fresh=True)
        try:
            assert set(pool.imap_unordered([0, 1])) == {(want, gone)}
        finally:
            pool.close()


_KILL_AT = """
def arm(marker, key):
    import os, signal
    from dsc.compiler import units
    real = getattr(units, "_unkilled", units.compile_sample)
    units._unkilled = real
    def compile_sample(rec, *a, **k):
        if rec.key == key and not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        return real(rec, *a, **k)
    units.compile_sample = compile_sample
"""


def test_a_worker_killed_in_its_run_of_parquet_units_is_retried_elsewhere(s3, cluster, tmp_path):
    """Units placed in runs go to their worker by a loose restriction: the unit of a worker killed mid-unit (and
    the units queued behind it) run on another, and the dataset is the local compile's."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    import io

    from PIL import Image

    client, workers = cluster
    images = []
    for i in range(48):
        b = io.BytesIO()
        Image.new("RGB", (20 + i % 5, 24), (i * 5, 255 - i * 5, 7)).save(b, "PNG")
        images.append(b.getvalue())
    path = tmp_path / "k.parquet"
    pq.write_table(pa.table({"image": images, "label": [i % 3 for i in range(48)]}), path, row_group_size=8)
    open_store("s3://dsc-src/killruns").put("k.parquet", path.read_bytes())
    scope: dict = {}
    exec(_KILL_AT, scope)
    marker = str(workers / "killed-in-run")
    client.run(scope["arm"], marker, "k.parquet#13")
    url = "s3://dsc-out/killruns"
    r = dsc.compile_table("s3://dsc-src/killruns/k.parquet", url, executor=client, cache_dir=str(tmp_path / "cache"),
                          **{**OPTS, "shard_size": 4})
    ref = dsc.compile_table(path, tmp_path / "ref", workers=1, **{**OPTS, "shard_size": 4})
    assert os.path.exists(marker) and r.manifest.num_samples == 48
    assert bucket_shards(url) == shard_files(ref.path)


def _quoted_like_main(monkeypatch):
    """This process spells ETags in their quotes, as a dsc before the one spelling did (its stat cache and journal
    hold the checksum of ``"<etag>"``); undone (and what it remembered forgotten) by the returned function."""
    from dsc.compiler.sources import inputs

    real = inputs.etag_of
    monkeypatch.setattr(inputs, "etag_of", lambda etag: f'"{real(etag)}"' if real(etag) else "")
    inputs._IDENTITY.clear()

    def undo():
        monkeypatch.setattr(inputs, "etag_of", real)
        inputs._IDENTITY.clear()
    return undo


def test_an_update_of_a_dataset_whose_stat_cache_holds_quoted_etags_reads_no_input(data, tmp_path, monkeypatch):
    """A dataset compiled from a bucket by a dsc that kept ETags quoted: ``--update`` with nothing changed reads no
    input's bytes (its stat cache's quoted checksums are this dsc's ETags), not every input on every run."""
    from dsc.compiler import update

    src = "s3://dsc-src/wds/{00000..00002}.tar"
    undo = _quoted_like_main(monkeypatch)
    dsc.compile_webdataset(src, tmp_path / "out", workers=1, **OPTS)
    undo()
    read, real = [], update._content
    monkeypatch.setattr(update, "_content", lambda source, records, masks: read.extend(records) or
                        real(source, records, masks))
    r = dsc.compile_webdataset(src, tmp_path / "out", update=True, workers=1, **OPTS)
    assert not r.committed and read == [], len(read)  # (before: the 30 inputs' bytes read, on each update)


def test_a_journal_written_with_quoted_etags_is_read_with_them(data, monkeypatch):
    """A unit journaled by a dsc that kept ETags quoted: its input fingerprint is this dsc's ``quoted`` one, which
    the resume takes (``journal._files``), so its units are kept, not compiled again."""
    from dsc.compiler.journal import _files, inputs_of
    from dsc.compiler.sources.webdataset import WebDatasetSource

    records = WebDatasetSource(src="s3://dsc-src/wds/{00000..00002}.tar").scan().records[:10]
    undo = _quoted_like_main(monkeypatch)
    old = inputs_of(records)
    undo()

    class Inputs(dict):
        def quoted(self, s):
            return inputs_of(records, quoted=True)
    now = Inputs({0: inputs_of(records)})
    assert now[0] != old and now.quoted(0) == old
    assert _files({"files": old}, now, 0) == old and _files({"files": "edited"}, now, 0) == now[0]


def _sent_to_cluster(monkeypatch) -> list:
    """(the function, the tasks) of each ``cluster.results`` call: what the client pickles for the workers."""
    from dsc.compiler import cluster as dask_cluster

    sent, real = [], dask_cluster.results

    def results(executor, todo, run, *a, **k):
        sent.append((run, list(todo)))
        return real(executor, todo, run, *a, **k)
    monkeypatch.setattr(dask_cluster, "results", results)
    return sent


def test_a_table_source_seeds_its_footers_once_a_process(monkeypatch):
    """A pool's worker gets the source (with the scan's footers) once and runs many units and prefetches with it:
    the footers go into the process's cache at the first, not again at every unit and prefetch."""
    from dsc.compiler.sources import table

    class Counted(dict):
        def setdefault(self, k, v):
            seeded.append(k)
            return super().setdefault(k, v)
    seeded = []
    monkeypatch.setattr(table, "_FOOTERS", Counted())
    src = table.TableSource(path="s3://b/t.parquet")
    src.footers = {("s3://b/t.parquet", (1, 0.0, "e")): "footer"}
    src.prefetch([])
    src.fetcher([])
    src.fetcher([])
    assert seeded == [("s3://b/t.parquet", (1, 0.0, "e"))] and dict(table._FOOTERS) == src.footers


def test_a_table_source_keeps_only_its_footers_and_a_cluster_task_carries_none(s3, cluster, tmp_path, monkeypatch):
    """The scan keeps the footers of its own Parquet files only (another table this process read is not sent to
    the workers), and a cluster's tasks, each of which pickles the source, carry none: its workers read them."""
    import pickle

    from dsc.compiler.sources.table import TableSource

    client, _ = cluster
    (tmp_path / "other").mkdir()
    _parquet_in_s3(tmp_path / "other", "s3://dsc-src/other-table", seed=1)
    _parquet_in_s3(tmp_path, "s3://dsc-src/this-table", seed=2)
    TableSource(path="s3://dsc-src/other-table/t.parquet").scan()  # (this process read another table's footer)
    src = TableSource(path="s3://dsc-src/this-table/t.parquet")
    src.scan()
    assert {k[0] for k in src.footers} == {"s3://dsc-src/this-table/t.parquet"}
    assert src.per_task().footers == {} and src.footers  # (a pool's workers still get them, once)
    sent = _sent_to_cluster(monkeypatch)
    r = dsc.compile_table("s3://dsc-src/this-table/t.parquet", tmp_path / "out", executor=client,
                          **{**OPTS, "shard_size": 16})
    assert r.manifest.num_samples == 96
    (run, tasks), = sent
    assert not getattr(run.keywords["source"], "footers", None)
    assert len(pickle.dumps(run)) < 4096  # (a footer is KiBs: none rides with every task)



def test_a_cluster_compile_of_tars_sends_no_pixel_from_the_client(data, cluster, tmp_path, monkeypatch):
    """On a cluster the workers index the tars: no task the client sends carries an image's bytes (the client
    never sees the pixels), and the scan there keeps none."""
    client, _ = cluster
    sent = _sent_to_cluster(monkeypatch)
    r = dsc.compile_webdataset("s3://dsc-src/wds/{00000..00002}.tar", tmp_path / "out", executor=client, **OPTS)
    assert r.manifest.num_samples == 30
    (_, tasks), = sent
    records = [rec for t in tasks for rec in t.records]
    assert len(records) == 30 and not any(rec.member[3] for rec in records)


def test_a_dry_run_scan_keeps_no_image(data, tmp_path, monkeypatch):
    """``--update --dry-run`` (of a dataset, or of nothing yet) decodes nothing: its scan keeps no image bytes
    (up to KEEP_BYTES held for nothing before); a real update's scan still keeps them for its units."""
    from dsc.compiler.sources import webdataset

    src = "s3://dsc-src/wds/{00000..00002}.tar"
    kept, real = [], webdataset.index_tar
    monkeypatch.setattr(webdataset, "index_tar", lambda *a: (kept.append(a[5] is not None), real(*a))[1])
    r = dsc.compile_webdataset(src, tmp_path / "none-yet", update=True, dry_run=True, workers=1, **OPTS)
    assert r.dry_run and kept == [False] * 3
    dsc.compile_webdataset(src, tmp_path / "out", workers=1, **OPTS)
    del kept[:]
    r = dsc.compile_webdataset(src, tmp_path / "out", update=True, dry_run=True, workers=1, **OPTS)
    assert r.dry_run and kept == [False] * 3
    del kept[:]
    dsc.compile_webdataset(src, tmp_path / "out", update=True, workers=1, **OPTS)
    assert kept == [True] * 3


def test_the_keep_budget_honours_a_cgroup_memory_limit(tmp_path):
    """A container's memory limit bounds the scan's kept images to an eighth of it, not of the host's memory: the
    process's own cgroup found as the runtime finds it (env.cgroup_limit: /proc/self/cgroup under its mount), the
    lowest cgroup v2 memory.max along its path (a parent's limit binds a child whose own is "max"), or cgroup v1's
    memory.limit_in_bytes; "max" everywhere (no limit) leaves the machine's."""
    from dsc.compiler.sources import webdataset

    host = webdataset.keep_budget("", {})  # (no cgroup: the machine's memory)
    step = tmp_path / "v2" / "job" / "step"
    step.mkdir(parents=True)
    v2 = ("0::/job/step\n", {"v2": ("/", tmp_path / "v2")})
    (step / "memory.max").write_text("max\n")
    assert webdataset.keep_budget(*v2) == host
    (step.parent / "memory.max").write_text(f"{128 << 20}\n")  # (the parent's limit, not at a fixed path)
    assert webdataset.keep_budget(*v2) == 16 << 20
    v1 = tmp_path / "v1" / "job"
    v1.mkdir(parents=True)
    (v1 / "memory.limit_in_bytes").write_text(f"{256 << 20}\n")
    assert webdataset.keep_budget("4:memory:/job\n", {"v1": ("/", tmp_path / "v1")}) == 32 << 20
