"""The shard table (format 4, issue 34): opening a version reads metadata whose size does not grow with the
shards (the bytes read are counted); an --update writes a delta of its parent's table, the chain stays
bounded; verify, vacuum, restore, compact and object storage keep working; a dataset whose manifest lists its
shards (formats 1-3) still opens, verifies and updates."""
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import dsc
from dsc.formats import shardtable
from dsc.formats import versions as V
from dsc.store.local import Root
from damage import list_shards
from test_versions import content, make_folder


class Tiny(torch.utils.data.Dataset):
    """``n`` samples of 2x2 pixels: with shard_size=1, one shard each (the issue's simulation)."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return np.full((2, 2, 3), i % 251, np.uint8), i % 10



def _tiny_folder(src, n: int, classes: int, step: int = 1) -> None:
    """``n`` 4x4 PNGs in ``classes`` class folders (sample i in class i % classes, red i * step)."""
    from PIL import Image

    for i in range(n):
        (src / f"c{i % classes}").mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (4, 4), (i * step, 0, 0)).save(src / f"c{i % classes}" / f"{i}.png")

def tiny(path: Path, n: int) -> Path:
    dsc.compile(Tiny(n), path, size=2, shard_size=1, progress=False, workers=1)
    return path


def reads_at_open(path, monkeypatch) -> list[tuple[str, int]]:
    """(file, bytes) of every read and mapping ``dsc.open`` makes (files by their name in the dataset)."""
    log = []
    real_read, real_map = Root.read, Root.map

    def read(self, rel, limit=None):
        out = real_read(self, rel, limit)
        log.append((self.redirect.get(rel, rel) if self.redirect else rel, len(out)))
        return out

    def map_(self, rel, nbytes, populate=True):
        log.append((self.redirect.get(rel, rel) if self.redirect else rel, nbytes))
        return real_map(self, rel, nbytes, populate)

    with monkeypatch.context() as m:
        m.setattr(Root, "read", read)
        m.setattr(Root, "map", map_)
        ds = dsc.open(path)
    return ds, log


def table_objects(path) -> list[str]:
    m = V.read_record(path, V.versions(path)[-1])["manifest"]
    return [V.object_path(t["sha256"]) for t in m.shard_table.objects]


def test_open_reads_the_same_metadata_bytes_for_20_and_2000_shards(tmp_path, monkeypatch):
    small, big = tiny(tmp_path / "s", 20), tiny(tmp_path / "b", 2000)
    metadata = {}
    for path in (small, big):
        ds, log = reads_at_open(path, monkeypatch)
        assert len(ds) in (20, 2000) and ds.manifest.shard_count == len(ds)
        tables = set(table_objects(path))
        assert not tables & {rel for rel, _ in log}  # the table is not read at open
        metadata[path] = sum(n for rel, n in log if rel.endswith(".json"))  # the record (and any zarr.json)
        assert metadata[path] > 0
        # the table is read when a shard is first touched, and every sample is right
        assert ds[len(ds) - 1]["image"][0, 0, 0] == (len(ds) - 1) % 251
        assert ds.get_batch(np.arange(len(ds)))["label"].tolist() == [i % 10 for i in range(len(ds))]
    # the record differs only by the digits of its counts; with the shards listed it would grow ~100 B a shard
    assert abs(metadata[big] - metadata[small]) < 200, metadata
    assert (big / "zarr.json").stat().st_size < 2 * (small / "zarr.json").stat().st_size
    assert (big / V.record_path(0)).stat().st_size - (small / V.record_path(0)).stat().st_size < 200
    # the table itself: a 128-byte head + 48 a slot, in pages each with its 32-byte SHA-256
    (rel,) = table_objects(big)
    pages = -(-2000 // (shardtable.PAGE_BYTES // shardtable.ENTRY))
    assert (big / rel).stat().st_size == shardtable.HEADER2 + 32 + 2000 * shardtable.ENTRY + 32 * pages
    loader = dsc.Loader(dsc.open(big), batch_size=64, order="random", seed=0)
    assert sum(len(b["image"]) for b in loader) == 2000


def _header(path: Path) -> dict:
    data = path.read_bytes()
    return {"slots": int.from_bytes(data[16:24], "little"), "entries": int.from_bytes(data[24:32], "little"),
            "base": data[32:64].hex() if any(data[32:64]) else None, "nbytes": len(data)}


@pytest.fixture
def updated(tmp_path):
    """(source, dataset): 64 images in 16 slots of 4, then an --update adding 4 and removing 1."""
    src, out = tmp_path / "src", tmp_path / "out"
    paths = make_folder(src, 64)
    opts = dict(size=8, shard_size=4, progress=False, workers=1)
    dsc.compile_imagefolder(src, out, **opts)
    make_folder(src, 4, seed0=5000)
    paths[10].unlink()
    r = dsc.compile_imagefolder(src, out, update=True, **opts)
    assert r.committed and r.version == 1
    return src, out, opts


def test_an_update_writes_a_delta_of_its_parents_table(updated):
    src, out, opts = updated
    m0, m1 = (V.read_record(out, n)["manifest"] for n in (0, 1))
    full, = m0.shard_table.objects
    assert m1.shard_table.objects[0] == full and len(m1.shard_table.objects) == 2  # shared, not copied
    delta = _header(out / V.object_path(m1.shard_table.objects[1]["sha256"]))
    head = _header(out / V.object_path(full["sha256"]))
    assert head == {"slots": 16, "entries": 16, "base": None, "nbytes": 96 + 32 + 16 * 48 + 32}  # (one page)
    # the new slot only (the removed sample's slot keeps its shard: the sample is not live)
    assert delta["entries"] == 1 and delta["base"] == full["sha256"] and delta["slots"] == 17
    assert delta["nbytes"] == 96 + 8 + 32 + 8 + 48 + 32 < head["nbytes"]  # (head, its page's first slot, a page)
    ds = dsc.open(out)
    fresh = out.parent / "fresh"
    dsc.compile_imagefolder(src, fresh, **opts)
    assert content(out) == content(fresh) and len(ds) == 67
    assert [s.path for s in ds.manifest.shards if s is not None][-1] == "image/c/16/0/0/0"
    assert not dsc.verify(out).problems


def test_the_delta_chain_stays_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr(shardtable, "MAX_CHAIN", 3)
    src, out = tmp_path / "src", tmp_path / "out"
    make_folder(src, 16)
    opts = dict(size=8, shard_size=4, progress=False, workers=1)
    dsc.compile_imagefolder(src, out, **opts)
    chains = []
    for k in range(4):
        make_folder(src, 1, seed0=7000 + k)
        dsc.compile_imagefolder(src, out, update=True, **opts)
        chains.append(len(V.read_record(out, k + 1)["manifest"].shard_table.objects))
    assert chains == [2, 3, 1, 2]  # a full table again once the chain would pass MAX_CHAIN
    assert len(dsc.open(out)) == 20 and not dsc.verify(out).problems


def test_verify_vacuum_restore_and_compact_with_tables(updated):
    src, out, opts = updated
    before = content(out, version=0)
    # vacuum keeps the objects of the kept version's chain (its parent's full table among them)
    rep = dsc.vacuum(out, keep=1, older_than="0")
    assert rep.removed == [0]
    assert all((out / rel).is_file() for rel in table_objects(out))
    assert not dsc.verify(out).problems and len(dsc.open(out)) == 67
    # a damaged table is named by verify, and by a read
    rel = table_objects(out)[-1]
    data = bytearray((out / rel).read_bytes())
    data[-1] ^= 0xFF
    good = (out / rel).read_bytes()
    (out / rel).write_bytes(bytes(data))
    problems = dsc.verify(out).problems
    assert any(rel in p.file for p in problems), problems
    (out / rel).write_bytes(good)
    # restore names its version's table as it is; compact writes a full one; vacuum frees what none uses
    assert dsc.compact(out).committed
    m = V.read_record(out, V.versions(out)[-1])["manifest"]
    assert len(m.shard_table.objects) == 1 and m.version["operation"] == "compact"
    assert not dsc.verify(out).problems
    assert content(out) == content(out, version=1)
    dsc.vacuum(out, keep=1, older_than="0")
    assert sorted(p.name for p in (out / V.OBJECTS).rglob("*") if p.is_file() and
                  p.read_bytes()[:8] == shardtable.MAGIC) == [m.shard_table.objects[0]["sha256"]]
    assert not dsc.verify(out).problems and content(out) == content(out, version=1 + 1)
    del before


def test_a_missing_or_damaged_table_is_named_at_the_first_read(tmp_path):
    out = tiny(tmp_path / "t", 12)
    (rel,) = table_objects(out)
    good = (out / rel).read_bytes()
    (out / rel).write_bytes(good[:-48])  # (one entry short)
    ds = dsc.open(out)  # (the table is not read at open)
    with pytest.raises(dsc.CorruptDatasetError, match=rel.split("/")[-1]):
        ds[0]
    bad = bytearray(good)
    bad[64 + 5 * 48] = 7  # slot 5 says 7 samples in a shard of 1
    (out / rel).write_bytes(bytes(bad))
    ds = dsc.open(out)
    with pytest.raises(dsc.CorruptDatasetError, match=f"{rel}.*SHA-256"):  # (hashed at its first load: any slot)
        ds[4]
    (out / rel).unlink()
    with pytest.raises(dsc.CorruptDatasetError, match="missing"):
        dsc.open(out)[0]


def test_restore_shares_the_table(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    make_folder(src, 12)
    opts = dict(size=8, shard_size=4, progress=False, workers=1)
    dsc.compile_imagefolder(src, out, **opts)
    make_folder(src, 3, seed0=800)
    dsc.compile_imagefolder(src, out, update=True, **opts)
    n = dsc.restore(out, version=0)
    m0, mn = (V.read_record(out, k)["manifest"] for k in (0, n))
    assert mn.shard_table.ref == m0.shard_table.ref
    assert content(out) == content(out, version=0)
    dsc.vacuum(out, keep=1, older_than="0")
    assert not dsc.verify(out).problems and content(out) == content(out, version=n)


def test_a_dataset_with_its_shards_listed_opens_verifies_and_updates(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    make_folder(src, 20)
    opts = dict(size=8, shard_size=4, progress=False, workers=1)
    dsc.compile_imagefolder(src, out, **opts)
    want = content(out)
    tables = table_objects(out)
    list_shards(out)
    for rel in tables:
        (out / rel).unlink()  # (an old dataset has no table)
    m = V.read_record(out, 0)["manifest"]
    assert m.shard_table is None and m.format_version == 3 and len(m.shards) == 5
    ds = dsc.open(out)
    assert content(out) == want and ds.manifest.shard_count == 5
    assert not dsc.verify(out).problems
    import zarr

    assert zarr.open_group(str(out), mode="r")["image"].shape[0] == 20
    make_folder(src, 2, seed0=900)
    r = dsc.compile_imagefolder(src, out, update=True, **opts)
    m1 = V.read_record(out, r.version)["manifest"]
    assert m1.format_version == 4 and len(m1.shard_table.objects) == 1  # (no parent table: a full one)
    assert len(dsc.open(out)) == 22 and not dsc.verify(out).problems
    assert content(out, version=0) == want


def test_masks_are_a_column_of_the_table(tmp_path):
    from dsc.synthetic import detection_scenes, write_voc_segmentation

    root, out = tmp_path / "src", tmp_path / "out"
    write_voc_segmentation(root, detection_scenes(6, seed=3))
    dsc.compile_voc(root, out, split="train", masks=True, size=16, shard_size=2, workers=1, progress=False)
    m = V.read_record(out, 0)["manifest"]
    assert m.shard_table.columns == ["image", "mask"] and "shards" not in m.fields["mask"]
    assert [s.path for s in m.shard_table.column("mask")] == [f"mask/c/{s}/0/0" for s in range(3)]
    ds = dsc.open(out)
    assert ds[5]["mask"].shape == (16, 16)
    assert not dsc.verify(out).problems


@pytest.fixture
def s3(s3_server):
    pytest.importorskip("obstore")
    from object_servers import use_server

    with pytest.MonkeyPatch.context() as m:
        use_server(s3_server, m)
        m.delenv("DSC_CACHE_DIR", raising=False)
        s3_server.bucket("dsc-test")
        yield s3_server


def test_object_storage_fetches_the_table_when_a_shard_is_first_read(s3, tmp_path):
    """push uploads every table of the chain; a remote open fetches none of it; the first read fetches the ranges
    it needs once into the node's mirror (a second handle on the node reads that copy); an --update of the URL writes a
    delta; vacuum and verify of the URL count the tables."""
    from dsc.compiler.upload import push

    src, out = tmp_path / "src", tmp_path / "out"
    make_folder(src, 20)
    opts = dict(size=8, shard_size=4, progress=False, workers=1)
    dsc.compile_imagefolder(src, out, **opts)
    make_folder(src, 3, seed0=600)
    dsc.compile_imagefolder(src, out, update=True, **opts)
    url = "s3://dsc-test/shard-table"
    push(out, url, progress=False)
    tables = table_objects(out)
    assert len(tables) == 2
    cache = tmp_path / "cache"
    ds = dsc.open(url, cache_dir=cache)
    mirror = next((cache / "datasets").iterdir())
    assert not any((mirror / rel).exists() for rel in tables)  # not at open
    assert ds[len(ds) - 1]["image"].numpy().tobytes() == dsc.open(out)[len(ds) - 1]["image"].numpy().tobytes()
    ranges = {p.name.split(".")[0] for p in (mirror / shardtable.RANGES).iterdir()}
    assert ranges == {rel.split("/")[-1] for rel in tables}  # at the first read, by range, into the node's mirror
    assert set(map(tuple, ((k, v) for k, v in zip(ds.keys, ds.get_batch(range(len(ds)))["label"].tolist())))) == \
        set(zip(dsc.open(out).keys, dsc.open(out).get_batch(range(len(ds)))["label"].tolist()))
    assert not dsc.verify(url).problems
    # an update of the URL: a delta of the bucket's table
    make_folder(src, 2, seed0=700)
    r = dsc.compile_imagefolder(src, url, update=True, **dict(opts, cache_dir=str(tmp_path / "stage")))
    m = V.read_record(open_store_of(url), r.version)["manifest"]
    assert len(m.shard_table.objects) == 3 and m.shard_table.objects[:2] == \
        V.read_record(out, 1)["manifest"].shard_table.objects
    assert len(dsc.open(url, cache_dir=cache)) == 25
    dsc.vacuum(url, keep=1, older_than="0")
    assert not dsc.verify(url).problems and len(dsc.open(url, cache_dir=tmp_path / "c2")) == 25


def open_store_of(url):
    from dsc.store import open_store

    return open_store(url)


def _zero_entries(path: Path, slots) -> bytes:
    """Zero the whole 48-byte entries of ``slots`` in the full table (its size and header kept: a zero-filled
    disk block); returns the good bytes."""
    (rel,) = table_objects(path)
    good = (path / rel).read_bytes()
    bad = bytearray(good)
    for s in slots:
        at = shardtable.full_entry_at(good, s)
        bad[at:at + shardtable.ENTRY] = bytes(shardtable.ENTRY)
    (path / rel).write_bytes(bytes(bad))
    return good


def test_a_damaged_local_table_stops_reads_and_vacuum_deletes_nothing(tmp_path):
    """A table whose entries were zeroed (size and magic intact) read as 'no shard there': vacuum deleted the
    latest version's shards. The local table is hashed when first loaded: reads and vacuum name it."""
    out = tiny(tmp_path / "t", 12)
    (rel,) = table_objects(out)
    want = content(out)
    shards = sorted(p for p in (out / "image" / "c").rglob("*") if p.is_file())
    good = _zero_entries(out, [1, 2, 3])
    with pytest.raises(dsc.CorruptDatasetError, match=f"{rel}.*SHA-256.*dsc verify"):
        dsc.open(out)[0]  # (slot 0's entry is intact: the whole table is checked at its first load)
    for dry_run in (True, False):
        with pytest.raises(dsc.CorruptDatasetError, match=f"version 0, which vacuum keeps: .*{rel}.*nothing was "
                                                          f"removed"):
            dsc.vacuum(out, keep=1, older_than="0", dry_run=dry_run)
    assert sorted(p for p in (out / "image" / "c").rglob("*") if p.is_file()) == shards  # (all 12 still there)
    assert len(shards) == 12
    (out / rel).write_bytes(good)  # (restored from a copy: the dataset is whole)
    assert content(out) == want and not dsc.verify(out).problems
    assert dsc.vacuum(out, keep=1, older_than="0").files == 0


def test_an_update_of_a_damaged_table_names_it(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    make_folder(src, 8)
    opts = dict(size=8, shard_size=2, progress=False, workers=1)
    dsc.compile_imagefolder(src, out, **opts)
    (rel,) = table_objects(out)
    _zero_entries(out, [1])
    make_folder(src, 1, seed0=77)
    with pytest.raises(dsc.CorruptDatasetError, match=f"{rel}.*nothing was written.*dsc verify"):
        dsc.compile_imagefolder(src, out, update=True, **opts)
    assert V.versions(out) == [0]


def test_verify_reports_live_rows_that_no_shard_holds(tmp_path):
    """A version whose (hash-consistent) table has no entry for a slot with live rows (a writer's bug): verify
    says so (formats 1-3 checked it at open), instead of passing a version every read of which fails."""
    import hashlib

    from dsc.formats.manifest import canonical_sha256

    out = tiny(tmp_path / "t", 6)
    rp = out / V.record_path(0)
    rec = json.loads(rp.read_bytes())
    ref = rec["manifest"]["shard_table"]
    b = bytearray((out / V.object_path(ref["chain"][0]["sha256"])).read_bytes())
    at = shardtable.full_entry_at(b, 2)
    nbytes = int.from_bytes(b[at + 8:at + 16], "little")
    b[at:at + shardtable.ENTRY] = bytes(shardtable.ENTRY)  # slot 2: no shard
    sha = hashlib.sha256(bytes(b)).hexdigest()
    (out / V.object_path(sha)).parent.mkdir(parents=True, exist_ok=True)
    (out / V.object_path(sha)).write_bytes(bytes(b))
    ref["chain"] = [{"sha256": sha, "nbytes": len(b)}]
    ref["shards"] -= 1
    ref["nbytes"] -= nbytes
    man = {k: v for k, v in rec["manifest"].items() if k != "checksum"}
    rec["manifest"]["checksum"] = canonical_sha256(man)
    rp.write_bytes(json.dumps(rec).encode())
    problems = dsc.verify(out).problems
    assert [p.file for p in problems if "no shard of the version holds" in str(p)] == ["live"], problems
    assert "slots 2;" in str(problems[-1])


def test_push_of_a_damaged_local_table_names_it(s3, tmp_path):
    from dsc.compiler.upload import push

    out = tiny(tmp_path / "t", 6)
    (rel,) = table_objects(out)
    _zero_entries(out, [1])
    with pytest.raises(dsc.DscError, match=f"{rel}.*dsc verify"):
        push(out, "s3://dsc-test/damaged", progress=False)


def test_an_update_of_an_older_format_says_it_writes_format_4(tmp_path):
    from click.testing import CliRunner

    from dsc.cli import main

    src, out = tmp_path / "src", tmp_path / "out"
    make_folder(src, 8)
    args = ["compile", "imagefolder", str(src), str(out), "--size", "8", "--shard-size", "4"]
    assert CliRunner().invoke(main, args).exit_code == 0
    for rel in table_objects(out):
        list_shards(out)
        (out / rel).unlink()  # (format 3: the shards listed in the manifest)
    assert V.read_record(out, 0)["manifest"].format_version == 3
    make_folder(src, 2, seed0=900)
    r = CliRunner().invoke(main, [*args, "--update"])
    assert r.exit_code == 0, r.output
    said = [line for line in r.output.splitlines() if "format 4" in line]
    assert len(said) == 1 and "version 0 is format 3" in said[0] and "older dsc" in said[0], r.output
    assert V.read_record(out, 1)["manifest"].format_version == 4
    r = CliRunner().invoke(main, [*args, "--update"])  # (a format-4 parent: nothing said)
    assert "format 4" not in r.output


def test_a_local_table_is_hashed_once_per_process(tmp_path, monkeypatch):
    import hashlib

    out = tiny(tmp_path / "t", 5)
    (sha,) = [rel.rsplit("/", 1)[-1] for rel in table_objects(out)]
    hashed, real = [], hashlib.sha256

    def counting(data=b""):
        h = real(data)
        hashed.append(h.hexdigest())
        return h

    monkeypatch.setattr(shardtable.hashlib, "sha256", counting)
    monkeypatch.setattr(shardtable, "_CHECKED", set())
    for _ in range(3):
        ds = dsc.open(out)
        assert ds[4]["label"] == 4
    assert hashed.count(sha) == 1


class RaggedTiny(Tiny):
    """``n`` samples of 2-4 x 3 pixels (ragged layout): with shard_size=1, one shard each."""

    def __getitem__(self, i):
        return np.full((2 + i % 3, 3, 3), i % 251, np.uint8), i % 10


def ragged(path: Path, n: int) -> Path:
    dsc.compile(RaggedTiny(n), path, max_side=8, shard_size=1, progress=False, workers=1)
    return path


def test_a_ragged_shards_zarr_json_is_implied_not_listed(tmp_path):
    """A ragged shard's own zarr.json sits beside it (plain Zarr reads it there) but neither the manifest's
    files, nor the root zarr.json dsc.open reads, nor the objects grow with the shards; verify checks it."""
    import zarr

    a, b = ragged(tmp_path / "a", 10), ragged(tmp_path / "b", 40)
    ma, mb = V.read_record(a, 0)["manifest"], V.read_record(b, 0)["manifest"]
    assert set(ma.files) == set(mb.files) and "image/values/zarr.json" in mb.files
    assert not [rel for rel in mb.files if rel.startswith("image/values/") and rel.count("/") > 2]
    objects = lambda p: sorted(q.name for q in (p / "_dsc" / "objects").rglob("*") if q.is_file())  # noqa: E731
    assert len(objects(a)) == len(objects(b))  # (no object per shard)
    assert abs((b / "zarr.json").stat().st_size - (a / "zarr.json").stat().st_size) < 100  # (a few counts' digits)
    ds, g = dsc.open(b), zarr.open_group(str(b), mode="r")
    for s in range(40):  # each shard's array through its group (its metadata is beside it, not consolidated)
        assert g["image/values"][str(s)][:].tobytes() == ds[s]["image"].numpy().tobytes()
    assert not dsc.verify(b).problems
    from dsc.formats import layout as L

    # (a view refresh keeps such a file that an older format-4 manifest listed: the new version implies it)
    assert L.implies(mb, "image/values/39/zarr.json") and not L.implies(mb, "image/values/40/zarr.json")
    assert not L.implies(mb, "image/values/zarr.json") and not L.implies(mb, "image/offsets/c/0")
    (b / "image/values/7/zarr.json").write_text("{}")
    assert [p.file for p in dsc.verify(b).problems] == ["image/values/7/zarr.json"]


def test_push_and_update_of_a_url_keep_each_ragged_shards_zarr_json(s3, tmp_path):
    """push uploads each ragged shard's implied zarr.json beside it; an --update of the URL and its view refresh
    keep the ones of the slots it still uses."""
    from dsc.compiler.upload import push
    from dsc.store import open_store

    src, out = tmp_path / "src", tmp_path / "out"
    make_folder(src, 6)
    opts = dict(max_side=8, shard_size=1, progress=False, workers=1)
    dsc.compile_imagefolder(src, out, **opts)
    url = "s3://dsc-test/ragged-implied"
    push(out, url, progress=False)
    store = open_store(url)
    for s in range(6):
        rel = f"image/values/{s}/zarr.json"
        assert store.get(rel) == (out / rel).read_bytes()
    assert not dsc.verify(url).problems
    make_folder(src, 2, seed0=900)
    r = dsc.compile_imagefolder(src, url, update=True, cache_dir=str(tmp_path / "stage"), **opts)
    assert r.version == 1 and len(dsc.open(url, cache_dir=tmp_path / "c")) == 8
    assert store.get("image/values/7/zarr.json") and not dsc.verify(url).problems


def _file_calls(monkeypatch, fn) -> dict:
    """How many times the compile units that ``fn()`` runs (in this process) call os.open, os.mkdir, os.unlink,
    os.replace, os.stat, os.lstat, os.close and os.fdopen."""
    import os
    from collections import Counter

    from dsc.compiler import units

    calls, inside = Counter(), [False]
    for name in ("open", "mkdir", "unlink", "replace", "stat", "lstat", "close", "fdopen"):
        real = getattr(os, name)

        def counted(*a, _real=real, _name=name, **k):
            calls[_name] += inside[0]
            return _real(*a, **k)

        monkeypatch.setattr(os, name, counted)
    real_unit = units._compile_unit

    def unit(*a, **k):
        inside[0] = True
        try:
            return real_unit(*a, **k)
        finally:
            inside[0] = False

    monkeypatch.setattr(units, "_compile_unit", unit)
    try:
        fn()
    finally:
        monkeypatch.undo()
    return dict(calls)


@pytest.mark.parametrize("layout", ["fixed", "ragged"])
def test_a_shards_fixed_cost_in_file_operations(tmp_path, monkeypatch, layout):
    """What one more shard costs a compile in file operations (one tiny sample a shard): its folders made
    without first looking for them, below a folder kept open (image/c: one lstat checks it is still the one
    its path names), its file written at its name with nothing renamed or removed and no Python file object
    (fdopen's fstat and lseek), and (ragged) its zarr.json beside it (and no object of it:
    test_a_ragged_shards_zarr_json_is_implied_not_listed). Counted in the units, as the difference between 5
    and 25 shards."""
    make = tiny if layout == "fixed" else ragged
    make(tmp_path / "warm", 1)  # (what a process opens once: the decoders' capture file)
    c5 = _file_calls(monkeypatch, lambda: make(tmp_path / "a", 5))
    c25 = _file_calls(monkeypatch, lambda: make(tmp_path / "b", 25))
    per = {k: (c25.get(k, 0) - c5.get(k, 0)) / 20
           for k in ("open", "mkdir", "unlink", "replace", "stat", "lstat", "close", "fdopen")}
    if layout == "fixed":  # image/c/<s>/0/0/0: 3 new folders below the kept image/c, the file
        assert per == {"open": 4, "mkdir": 3, "unlink": 0, "replace": 0, "stat": 0, "lstat": 1, "close": 4,
                       "fdopen": 0}, per  # (was: 8 opens (the staging, image, c, <s> missing first), 7 closes, a
        # rename and an fdopen; before: 10 opens, 1 unlink; then a stat of the staging before its open)
    else:  # image/values/<s>/c/0 and image/values/<s>/zarr.json (was: a hash, a link and an entry in files too)
        assert per["unlink"] == 0 and per["mkdir"] == 2 and per["replace"] == 1 and per["fdopen"] == 0, per


def _held_after_units(tmp_path, monkeypatch, n: int) -> tuple[int, int]:
    """(unit results and field parts alive, bytes traced) when a compile of ``n`` one-sample shards has run its
    units (before the index arrays and the manifest are written)."""
    import gc
    import sys
    import tracemalloc

    from dsc.compiler.units import UnitResult
    from dsc.formats.fields import Part

    C = sys.modules["dsc.compiler.compile"]
    real, seen = C.decode_units, {}

    def decode_units(*a, **k):
        out = real(*a, **k)
        gc.collect()
        seen["objects"] = sum(isinstance(o, (UnitResult, Part)) for o in gc.get_objects())
        seen["bytes"] = tracemalloc.get_traced_memory()[0] - seen["start"]
        return out

    tiny(tmp_path / f"warm{n}", 2)  # (what a process makes once: the decoders' capture file, caches)
    monkeypatch.setattr(C, "decode_units", decode_units)
    gc.collect()
    tracemalloc.start()
    try:
        seen["start"] = tracemalloc.get_traced_memory()[0]
        tiny(tmp_path / f"n{n}", n)
    finally:
        tracemalloc.stop()
    return seen["objects"], seen["bytes"]


def test_the_compile_holds_no_object_per_unit(tmp_path, monkeypatch):
    """DESIGN: compile RSS does not grow with the dataset. A unit's result is journaled and folded into flat
    arrays as it finishes (collect.py): once the units have run, no UnitResult or field part is alive whatever the
    number of units (it held one of each a unit, ~3 KB), and what the driver holds grows by its per-sample
    columns only (the scan's records, ~400 bytes a one-sample unit in all; it was ~3.4 KB)."""
    few, few_bytes = _held_after_units(tmp_path, monkeypatch, 40)
    many, many_bytes = _held_after_units(tmp_path, monkeypatch, 200)
    assert few == many <= 2, (few, many)
    per_unit = (many_bytes - few_bytes) / 160
    assert per_unit < 1000, per_unit


def test_open_reads_no_array_that_grows_with_the_samples(tmp_path, monkeypatch):
    """Every byte ``dsc.open`` reads (any file, not only the JSON): the same for 20 and 2000 one-sample shards.
    The labels (8 bytes a sample) are read when first used, and ``live`` (a byte a row) not at all while every row
    is live (the manifest says so); each slot's shard is still checked to hold its rows when first read."""
    read = {}
    for n in (20, 2000):
        ds, log = reads_at_open(tiny(tmp_path / str(n), n), monkeypatch)
        read[n] = sum(b for _, b in log)
        assert ds.labels.tolist() == [i % 10 for i in range(n)]  # (read now)
        assert ds[n - 1]["label"] == (n - 1) % 10
    assert abs(read[2000] - read[20]) < 200, read


def test_labels_not_read_before_close_are_refused_after_it_with_the_fix(tmp_path):
    """Labels are read on first use, not at open, nor at ``close()`` (a pass over every row for a handle that may
    never need them): a closed handle's first ask for them names the fix; labels read before ``close()`` stay
    readable after it, also once a vacuum removed the version."""
    from dsc.versions import vacuum

    from PIL import Image

    src, path = tmp_path / "src", tmp_path / "d"
    _tiny_folder(src, 6, classes=3)
    opts = dict(size=2, shard_size=2, progress=False, workers=1)
    dsc.compile_imagefolder(src, path, **opts)
    ds, read_first = dsc.open(path), dsc.open(path)
    want = [int(k.split("/")[0][1:]) for k in ds.keys]
    assert read_first.labels.tolist() == want
    Image.new("RGB", (4, 4)).save(src / "c0" / "new.png")
    dsc.compile_imagefolder(src, path, update=True, **opts)  # version 1
    assert ds._labels is None
    ds.close()
    read_first.close()
    assert ds._labels is None  # (not read by close)
    assert 0 in vacuum(path, keep=1, older_than=0).removed
    with pytest.raises(dsc.DscError, match=r"closed before it first read its labels.*Read them before close\(\) "
                                           r"\(e\.g\. ds\.labels\), or open the dataset again"):
        ds.labels
    assert read_first.labels.tolist() == want


def test_a_version_with_removed_rows_reads_live_when_first_used(tmp_path, monkeypatch):
    """``live`` (a byte a row) is not read at open of a version whose rows were removed either: it is read, and
    checked against the manifest, when a sample's row is first needed; ``close()`` does not read it (a closed
    handle's first need of it names the fix). A damaged ``live`` is still refused, at first use."""
    import os

    from PIL import Image

    from dsc.errors import CorruptDatasetError
    from dsc.formats import layout as L
    from dsc.versions import vacuum

    src, path = tmp_path / "src", tmp_path / "d"
    _tiny_folder(src, 8, classes=2, step=20)
    opts = dict(size=2, shard_size=2, progress=False, workers=1)
    dsc.compile_imagefolder(src, path, **opts)
    (src / "c0" / "2.png").unlink()
    dsc.compile_imagefolder(src, path, update=True, **opts)  # version 1: a row removed
    ds, log = reads_at_open(path, monkeypatch)
    m = ds.manifest
    assert (m.num_samples, m.num_rows) == (7, 8)
    live = next(rel for rel in m.files if rel.startswith(L.LIVE + "/c"))
    live_obj = V.object_path(m.files[live]["sha256"])
    read = [rel for rel, _ in log]
    assert live_obj not in read and live not in read, read
    assert ds._live._rows is None
    keys = ds.keys  # (live read now: the keys of the version's samples)
    assert len(keys) == 7 and "c0/2.png" not in keys and ds._live._rows is not None
    ds.close()

    ds, read_first = dsc.open(path), dsc.open(path)
    rows = read_first._to_rows(np.arange(7)).tolist()
    assert ds._live._rows is None
    ds.close()  # does not read live (a byte a row): a closed handle's first need of it names the fix
    read_first.close()
    Image.new("RGB", (4, 4)).save(src / "c0" / "new.png")
    dsc.compile_imagefolder(src, path, update=True, **opts)  # version 2
    vacuum(path, keep=1, older_than=0)
    assert 1 not in V.versions(path)
    assert len(ds) == 7 and ds._live._rows is None
    with pytest.raises(dsc.DscError, match="closed before it first read its live array.*open the dataset again"):
        ds[0]
    with pytest.raises(dsc.DscError, match="closed before it first read its keys.*open the dataset again"):
        ds.keys
    assert read_first._to_rows(np.arange(7)).tolist() == rows == read_first._live.rows.tolist()

    (src / "c1" / "3.png").unlink()
    dsc.compile_imagefolder(src, path, update=True, **opts)  # version 3: rows removed again
    m = V.read_record(path, V.versions(path)[-1])["manifest"]
    live_obj = path / V.object_path(m.files[next(r for r in m.files if r.startswith(L.LIVE + "/c"))]["sha256"])
    data = bytearray(live_obj.read_bytes())
    data[data.index(1)] = 0  # one live row fewer than the manifest's samples: damage, refused when first used
    os.chmod(live_obj, 0o644)
    live_obj.write_bytes(bytes(data))
    ds = dsc.open(path)
    with pytest.raises(CorruptDatasetError, match="marks"):
        ds.keys
    ds.close()


def test_the_labels_metadata_is_read_once(tmp_path, monkeypatch):
    """``label/zarr.json`` is read and checked at open; the labels' first use reads their chunk only."""
    path = tiny(tmp_path / "d", 6)
    log = []
    real_read = Root.read

    def read(self, rel, limit=None):
        out = real_read(self, rel, limit)
        log.append(self.redirect.get(rel, rel) if self.redirect else rel)
        return out

    monkeypatch.setattr(Root, "read", read)
    ds = dsc.open(path)
    meta = V.object_path(ds.manifest.files["label/zarr.json"]["sha256"])
    assert log.count(meta) == 1
    assert ds.labels.tolist() == [i % 10 for i in range(6)]
    assert log.count(meta) == 1, log
    ds.close()


def _held_after_resumed_units(tmp_path, monkeypatch, n: int) -> int:
    """Unit results and field parts alive once a resumed compile of ``n`` one-sample shards, all of them journaled
    by a first run stopped before its commit, has folded them in."""
    import gc
    import sys

    from dsc.compiler.units import UnitResult
    from dsc.formats.fields import Part

    C = sys.modules["dsc.compiler.compile"]
    out = tmp_path / f"r{n}"
    with monkeypatch.context() as mp:
        def stop(*a, **k):
            raise KeyboardInterrupt

        mp.setattr(C, "_finalize", stop)
        with pytest.raises(KeyboardInterrupt):
            tiny(out, n)
    real, seen = C.decode_units, {}

    def decode_units(*a, **k):
        res = real(*a, **k)
        gc.collect()
        seen["objects"] = sum(isinstance(o, (UnitResult, Part)) for o in gc.get_objects())
        return res

    with monkeypatch.context() as mp:
        mp.setattr(C, "decode_units", decode_units)
        report = dsc.compile(Tiny(n), out, size=2, shard_size=1, progress=False, workers=1, resume=True)
    assert report.resumed_units == n and report.decoded == 0
    assert dsc.open(out).labels.tolist() == [i % 10 for i in range(n)]
    return seen["objects"]


def test_a_resume_holds_no_object_per_resumed_unit(tmp_path, monkeypatch):
    """The units a resume keeps are read from the journal one at a time and folded into the compile's flat arrays
    (journal.Resumed): none is held as a UnitResult (it held one a unit, with its parts, until the commit)."""
    few = _held_after_resumed_units(tmp_path, monkeypatch, 10)
    many = _held_after_resumed_units(tmp_path, monkeypatch, 60)
    assert few == many <= 2, (few, many)


def _parts_held_by_an_update(tmp_path, monkeypatch, n: int) -> int:
    """Field parts and unit results alive when an ``--update`` of a dataset of ``n`` one-sample slots (one input
    added) writes its version: the base's slots carried over, the new one compiled."""
    import gc
    import sys

    from PIL import Image

    from dsc.compiler.units import UnitResult
    from dsc.formats.fields import Part

    src, path = tmp_path / f"src{n}", tmp_path / f"d{n}"
    _tiny_folder(src, n, classes=2)
    opts = dict(size=2, shard_size=1, progress=False, workers=1)
    dsc.compile_imagefolder(src, path, **opts)
    Image.new("RGB", (4, 4)).save(src / "c0" / "new.png")
    U = sys.modules["dsc.compiler.update"]
    real, seen = U.write_version, {}

    def write_version(*a, **k):
        gc.collect()
        seen["objects"] = sum(isinstance(o, (UnitResult, Part)) for o in gc.get_objects())
        return real(*a, **k)

    monkeypatch.setattr(U, "write_version", write_version)
    dsc.compile_imagefolder(src, path, update=True, **opts)
    ds = dsc.open(path)
    assert len(ds) == n + 1 and ds.manifest.shard_table.ref["shards"] == n + 1
    return seen["objects"]


def test_an_update_holds_no_object_per_slot(tmp_path, monkeypatch):
    """An update carries the base's slots over and folds each, as it is made, into flat arrays (compile.fold_slots:
    the shape a fresh compile's parts have), so what it holds when it writes the version does not grow with the
    slots (it held a label and an image part a slot, with their lists)."""
    few = _parts_held_by_an_update(tmp_path, monkeypatch, 6)
    many = _parts_held_by_an_update(tmp_path, monkeypatch, 40)
    assert few == many <= 2, (few, many)


def test_an_updates_work_per_slot_does_not_walk_every_row(tmp_path, monkeypatch):
    """An update carries each base slot over by looking up that slot's own rows (removed or not, their input files'
    stat): it walked every input's stat probe once per slot, O(slots x rows), which a million one-sample slots
    cannot afford. Counted: the probes read per row carried over."""
    import sys

    src, path = tmp_path / "src", tmp_path / "d"
    _tiny_folder(src, 30, classes=2)
    opts = dict(size=2, shard_size=1, progress=False, workers=1)
    dsc.compile_imagefolder(src, path, **opts)
    (src / "c0" / "0.png").unlink()
    U = sys.modules["dsc.compiler.update"]
    real, reads = U._apply, {"n": 0}

    class Counted(dict):
        def get(self, *a):
            reads["n"] += 1
            return super().get(*a)

        def items(self):
            reads["n"] += len(self)
            return super().items()

    def apply(base, plan, *a, **k):
        plan.stat = Counted(plan.stat)
        return real(base, plan, *a, **k)

    monkeypatch.setattr(U, "_apply", apply)
    dsc.compile_imagefolder(src, path, update=True, **opts)
    assert len(dsc.open(path)) == 29
    assert reads["n"] <= 30, reads  # (one a carried row; it was 29 a slot: 841)


def _one_shard(root, s: int, value: int):
    """Shard ``s`` of a fixed 2x2x3 uint8 image field written under ``root`` (one sample of ``value``)."""
    from dsc.formats.fields.pixels import Pixels

    px = Pixels("image", "uint8", "fixed", 3, 2, 2)
    w = px.writer(root, s, 1)
    w.write(np.full((2, 2, 3), value, np.uint8))
    return w.close()


def test_a_shard_written_at_its_name_never_writes_through_what_is_there(tmp_path):
    """A shard file is created at its final name (no private name, no rename): a crashed writer's torn file there
    is replaced, and a hard or symbolic link planted there is removed, its target untouched (O_EXCL | O_NOFOLLOW,
    then unlink)."""
    import os

    root = tmp_path / "stage"
    outside = tmp_path / "outside"
    outside.write_bytes(b"keep me")
    for s, plant in enumerate(["torn", "hard", "soft"]):
        folder = root / "image" / "c" / str(s) / "0" / "0"
        folder.mkdir(parents=True)
        if plant == "torn":
            (folder / "0").write_bytes(b"\x01" * 5)
        elif plant == "hard":
            os.link(outside, folder / "0")
        else:
            os.symlink(outside, folder / "0")
        spec = _one_shard(root, s, 7 + s)
        data = (folder / "0").read_bytes()
        assert not (folder / "0").is_symlink() and data[:12] == bytes([7 + s]) * 12 and len(data) == spec.nbytes
        assert outside.read_bytes() == b"keep me", plant
        assert os.listdir(folder) == ["0"]  # (nothing left beside it)


def test_a_kept_folder_is_used_only_while_its_path_names_it(tmp_path):
    """The folder a shard writer keeps open (image/c, so that each shard makes only its own folders) is checked
    against its path before each use: a staging folder removed and made again under the same name (a compile run
    again in the same process) gets its shards, not the removed folder (where nothing can be made)."""
    root = tmp_path / "stage"
    _one_shard(root, 0, 1)
    _one_shard(root, 1, 2)  # (below the kept image/c)
    shutil.rmtree(root)
    (root / "image" / "c").mkdir(parents=True)  # (the same path, another folder)
    _one_shard(root, 2, 3)
    assert (root / "image/c/2/0/0/0").read_bytes()[:12] == bytes([3]) * 12
    _one_shard(root, 3, 4)
    assert sorted(p.name for p in (root / "image/c").iterdir()) == ["2", "3"]


def test_a_closed_handle_still_reads_what_it_did_not_read_while_its_version_is_there(tmp_path):
    """``with dsc.open(p) as ds: loader = dsc.Loader(ds)``, then training after the block: close() reads nothing
    (O(1)), and the handle still reads labels, keys, sizes and ``live`` (a version with removed rows) on first use
    while no vacuum removed its version (the clear error is for a version that is gone)."""
    from PIL import Image

    src, path = tmp_path / "src", tmp_path / "d"
    _tiny_folder(src, 8, classes=2, step=20)
    opts = dict(size=2, shard_size=2, progress=False, workers=1)
    dsc.compile_imagefolder(src, path, **opts)
    (src / "c0" / "2.png").unlink()
    Image.new("RGB", (4, 4)).save(src / "c1" / "new.png")
    dsc.compile_imagefolder(src, path, update=True, **opts)  # a version with a removed row
    with dsc.open(path) as ds:
        loader = dsc.Loader(ds, batch_size=4, order="sequential", num_threads=1)
    assert ds._live._rows is None and ds._labels is None and ds._keys is None  # (close read none of them)
    batches = list(loader)
    assert sum(len(b["label"]) for b in batches) == len(ds) == 8
    assert "c0/2.png" not in ds.keys and "c1/new.png" in ds.keys
    assert ds.labels.tolist() == [int(k.split("/")[0][1:]) for k in ds.keys]
    assert ds.orig_sizes.shape == (8, 2) and ds.affine.shape == (8, 4)


def test_a_finished_compile_keeps_no_folder_open(tmp_path):
    """The shard writer keeps a compile's ``image/c`` folder open between shards (``store.local._Kept``); once
    the writer lets go of OUT, none stays open: a process that compiled several datasets holds no descriptor of
    their folders (it would block an unmount, or a removal on some systems)."""
    import os

    from dsc.store import local

    src = tmp_path / "src"
    _tiny_folder(src, 6, classes=2)
    fds = lambda: set(os.listdir("/proc/self/fd"))  # noqa: E731
    before = fds()
    for i in range(3):
        dsc.compile_imagefolder(src, tmp_path / f"o{i}", size=2, shard_size=1, progress=False, workers=1)
    assert local._KEPT.folders == {}
    left = [os.readlink(f"/proc/self/fd/{fd}") for fd in fds() - before if os.path.exists(f"/proc/self/fd/{fd}")]
    assert not [p for p in left if str(tmp_path) in p], left


def test_a_batchs_largest_shard_bytes_come_from_the_layout_without_reading_the_table(tmp_path, monkeypatch):
    """What a Loader over object storage weighs against its cache (a batch's shards: the n largest slots) comes
    from the shard table's layout and reference (fixed layout) or the offsets read at open (ragged), reading no
    entry of the table (issue 34), and equals the bytes of the n largest slots the table records."""
    from dsc.formats.shardtable import ShardTable

    dsc.compile(Tiny(10), tmp_path / "f", size=2, shard_size=4, progress=False, workers=1)  # slots of 4, 4, 2
    src = tmp_path / "src"
    _tiny_folder(src, 9, classes=3)
    dsc.compile_imagefolder(src, tmp_path / "r", size=None, shard_size=4, progress=False, workers=1)  # ragged
    for name in ("f", "r"):
        ds = dsc.open(tmp_path / name)
        exact = np.sort(ds.manifest.shard_table.column("image").nbytes())[::-1]
        ds = dsc.open(tmp_path / name)
        rows, real_row, real_rows = [], ShardTable.row, ShardTable.rows
        monkeypatch.setattr(ShardTable, "row", lambda self, s: rows.append(s) or real_row(self, s))
        monkeypatch.setattr(ShardTable, "rows", lambda self: rows.append("all") or real_rows(self))
        got = [ds.largest_slots_bytes(n) for n in (1, 2, 3, 4)]
        monkeypatch.undo()
        assert rows == [], (name, rows)
        assert got == [int(exact[:n].sum()) for n in (1, 2, 3, 4)] and exact[0] > exact[-1] > 0, name


def test_a_batchs_shard_bytes_above_the_cache_share_are_the_exact_ones_on_a_dataset_updates_grew(tmp_path):
    """Updates that add rows leave partial slots, where the layout's figure (n full shards) is above the n largest
    slots' real bytes: where that bound is above the cache share it is weighed against, the exact figure is read,
    so the Loader picks the strategy the exact sizes give (the cache, where a batch's shards fit in it)."""
    from PIL import Image

    from dsc.runtime import reads as R

    src, out = tmp_path / "src", tmp_path / "d"
    _tiny_folder(src, 16, classes=2)
    opts = dict(size=2, shard_size=4, progress=False, workers=1)
    dsc.compile_imagefolder(src, out, **opts)  # 4 full slots of 4
    for u in range(3):  # 3 updates adding 2 samples each: 3 half slots
        for j in range(2):
            Image.new("RGB", (4, 4), (u, j, 9)).save(src / "c1" / f"new{u}_{j}.png")
        dsc.compile_imagefolder(src, out, update=True, **opts)
    ds = dsc.open(out)
    sizes = ds.slot_bytes()
    n = 6
    exact = int(np.sort(sizes[sizes > 0])[::-1][:n].sum())
    bound = ds.largest_slots_bytes(n)
    assert bound > exact  # (the layout's figure: 6 full slots)
    share = (exact + bound) // 2
    assert ds.largest_slots_bytes(n, within=share) == exact
    assert ds.largest_slots_bytes(n, within=bound) == bound
    strategy, _ = R.choose("random", ds.shard_bytes, "auto", (1 << 34, "test"), None,
                           (share, ds.largest_slots_bytes(n, within=share)))
    assert strategy != "ranged"


def test_a_resume_parses_each_journal_line_twice_not_three_times(tmp_path, monkeypatch):
    """A resume parses each journal line once to find and check its unit's last entry, and once more as it folds
    the unit in (what keeps no object a unit): 2 parses a resumed unit (3 before: the scan, the check, the fold)."""
    import json
    import sys

    C, J = sys.modules["dsc.compiler.compile"], sys.modules["dsc.compiler.journal"]
    n = 12
    out = tmp_path / "r"
    with monkeypatch.context() as mp:
        mp.setattr(C, "_finalize", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt))
        with pytest.raises(KeyboardInterrupt):
            tiny(out, n)
    parsed = []

    class CountingJson:
        def __getattr__(self, name):
            return getattr(json, name)

        @staticmethod
        def loads(s, *a, **k):
            d = json.loads(s, *a, **k)
            if isinstance(d, dict) and "result" in d:
                parsed.append(d["s"])
            return d

    monkeypatch.setattr(J, "json", CountingJson())
    report = dsc.compile(Tiny(n), out, size=2, shard_size=1, progress=False, workers=1, resume=True)
    assert report.resumed_units == n and report.decoded == 0
    assert sorted(parsed) == sorted(list(range(n)) * 2), parsed


def test_a_resume_hashes_only_the_last_entry_of_a_unit_compiled_twice(tmp_path, monkeypatch):
    """A unit compiled again by a resume (its shard was gone) has two journal entries; the next resume checks only
    the last one: each shard is hashed once (the earlier entry's shard, at the same path, was hashed too)."""
    import sys

    C, J = sys.modules["dsc.compiler.compile"], sys.modules["dsc.compiler.journal"]
    n, out = 6, tmp_path / "r"
    stop = lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt)  # noqa: E731
    with monkeypatch.context() as mp:
        mp.setattr(C, "_finalize", stop)
        with pytest.raises(KeyboardInterrupt):
            tiny(out, n)
        (tmp_path / ".r.dsc-tmp" / "image/c/3/0/0/0").unlink()
        with pytest.raises(KeyboardInterrupt):  # (unit 3 compiled again: a second entry)
            dsc.compile(Tiny(n), out, size=2, shard_size=1, progress=False, workers=1, resume=True)
    lines = (tmp_path / ".r.dsc-tmp" / ".journal" / "units.jsonl").read_text().splitlines()
    assert sorted(json.loads(line)["s"] for line in lines) == [0, 1, 2, 3, 3, 4, 5]
    hashed, real = [], J.sha256_file
    monkeypatch.setattr(J, "sha256_file", lambda p, *a, **k: hashed.append(Path(p).relative_to(tmp_path)) or
                        real(p, *a, **k))
    report = dsc.compile(Tiny(n), out, size=2, shard_size=1, progress=False, workers=1, resume=True)
    assert report.resumed_units == n and report.decoded == 0
    assert sorted(map(str, hashed)) == [f".r.dsc-tmp/image/c/{s}/0/0/0" for s in range(n)]
    assert content(out) == content(tiny(tmp_path / "fresh", n))


def test_the_journal_read_backward_gives_every_line_and_its_offset_whatever_the_block():
    """``journal._backward`` (a resume reads units.jsonl last line first) gives exactly the file's non-empty
    lines and their offsets, last to first, at any block size: lines longer than a block, blank lines, no final
    newline (each block is split once; a long line is joined once its start is found)."""
    import io
    import random

    from dsc.compiler.journal import _backward

    rng = random.Random(0)
    for _ in range(400):
        data = b"".join(bytes(rng.choice(b"ab\n") for _ in range(rng.randint(0, 30))) for _ in range(rng.randint(0, 6)))
        ref, at = [], 0
        for line in data.split(b"\n"):
            if line:
                ref.append((at, line))
            at += len(line) + 1
        for block in (1, 2, 3, 7, 64):
            assert list(_backward(io.BytesIO(data), block)) == ref[::-1], (data, block)
