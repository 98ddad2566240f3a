"""A remote version's shard table read by range (issue 34): a remote open and a sample's first read fetch the
table's head and the one page that sample's slot is in, checked against their own SHA-256s, into the node's
mirror (a second handle on the node fetches nothing), whatever the number of shards; a damaged page or a
damaged shard stops the read with the file named."""
import threading
import uuid

import pytest

import dsc
from dsc.errors import CorruptDatasetError
from dsc.formats import shardtable
from dsc.formats import versions as V
from dsc.store.object import ObjectStore
from test_shard_table import Tiny, open_store_of, s3, table_objects  # noqa: F401 - s3: the fixture

PAGE_ROWS = 4


def _requests(monkeypatch) -> list[tuple[str, str, int]]:
    """(operation, object, bytes) of every GET (whole or ranged) an ObjectStore makes from now on."""
    log, lock = [], threading.Lock()
    real_get, real_range = ObjectStore.get, ObjectStore.read_range

    def get(self, rel, *a, **k):
        out = real_get(self, rel, *a, **k)
        with lock:
            log.append(("get", rel, len(out)))
        return out

    def read_range(self, rel, start, end):
        out = real_range(self, rel, start, end)
        with lock:
            log.append(("range", rel, len(memoryview(out))))
        return out

    monkeypatch.setattr(ObjectStore, "get", get)
    monkeypatch.setattr(ObjectStore, "read_range", read_range)
    return log


@pytest.fixture
def pushed(s3, tmp_path_factory, monkeypatch):
    """{shards: url} of two datasets of 6 and 48 one-sample shards (pages of 4 entries), pushed to S3."""
    from dsc.compiler.upload import push

    monkeypatch.setattr(shardtable, "PAGE_BYTES", PAGE_ROWS * shardtable.ENTRY)
    out = {}
    for n in (6, 48):
        local = tmp_path_factory.mktemp("local") / f"d{n}"
        dsc.compile(Tiny(n), local, size=2, shard_size=1, progress=False, workers=1)
        url = f"s3://dsc-test/ranges-{n}-{uuid.uuid4().hex}"
        push(local, url, progress=False)
        out[n] = (local, url)
    return out


def test_a_remote_first_read_fetches_the_same_table_bytes_for_6_and_48_shards(pushed, tmp_path, monkeypatch):
    fetched = {}
    for n, (local, url) in pushed.items():
        (table,) = table_objects(local)
        log = _requests(monkeypatch)
        ds = dsc.open(url, cache_dir=tmp_path / f"cache{n}")
        assert not [r for r in log if r[1] == table]  # none of the table at open
        assert ds[n - 1]["image"][0, 0, 0] == (n - 1) % 251  # (the last slot: the last page)
        assert ds[0]["image"][0, 0, 0] == 0  # (the first page)
        got = [r for r in log if r[1] == table]
        assert all(op == "range" for op, _, _ in got), got  # never the whole table
        fetched[n] = sorted(nbytes for _, _, nbytes in got)
        # a second handle of the node (another rank) reads the mirror's copies: no request for the table
        del log[:]
        again = dsc.open(url, cache_dir=tmp_path / f"cache{n}")
        assert again[n - 1]["label"] == (n - 1) % 10
        assert not [r for r in log if r[1] == table]
        monkeypatch.undo()
        monkeypatch.setattr(shardtable, "PAGE_BYTES", PAGE_ROWS * shardtable.ENTRY)
    # the head (128 bytes) and the two pages read, for either; the whole table grows 48 bytes a shard (6 shards:
    # 2 pages, 48: 12); 6's last page holds 2 entries, so it is smaller
    page = PAGE_ROWS * shardtable.ENTRY + 32
    assert fetched[48] == [128, page, page] and fetched[6] == [128, 2 * shardtable.ENTRY + 32, page]


def test_a_damaged_page_or_shard_in_the_bucket_stops_the_read(pushed, tmp_path):
    local, url = pushed[48]
    (table,) = table_objects(local)
    store = open_store_of(url)
    data = bytearray((local / table).read_bytes())
    at = shardtable.full_entry_at(bytes(data), 45)
    data[at + 20] ^= 0xFF  # one bit of slot 45's SHA-256, in the table's page 11
    store.put(table, bytes(data))
    ds = dsc.open(url, cache_dir=tmp_path / "c")
    assert ds[2]["label"] == 2  # (another page: intact)
    with pytest.raises(CorruptDatasetError, match=f"{table.split('/')[-1]}: page 11 does not match its SHA-256"):
        ds[45]
    store.put(table, (local / table).read_bytes())  # the table intact again, a shard damaged
    m = V.read_record(local, 0)["manifest"]
    rel = m.shards[7].path
    shard = bytearray((local / rel).read_bytes())
    shard[-1] ^= 0xFF
    store.put(rel, bytes(shard))
    ds = dsc.open(url, cache_dir=tmp_path / "c2")
    with pytest.raises(CorruptDatasetError, match=rel):
        ds[7]
    assert ds[8]["image"][0, 0, 0] == 8


def _retable(out, data: bytes) -> str:
    """Make ``data`` the (one-object) table of version 0 of the dataset ``out`` (record and checksum rewritten)."""
    import hashlib
    import json

    from dsc.formats.manifest import canonical_sha256

    sha = hashlib.sha256(data).hexdigest()
    (out / V.object_path(sha)).parent.mkdir(parents=True, exist_ok=True)
    (out / V.object_path(sha)).write_bytes(data)
    rp = out / V.record_path(0)
    rec = json.loads(rp.read_bytes())
    rec["manifest"]["shard_table"]["chain"] = [{"sha256": sha, "nbytes": len(data)}]
    man = {k: v for k, v in rec["manifest"].items() if k != "checksum"}
    rec["manifest"]["checksum"] = canonical_sha256(man)
    rp.write_bytes(json.dumps(rec).encode())
    return V.object_path(sha)


def test_a_version_1_table_opens_locally_and_from_object_storage(s3, tmp_path):
    """A format-4 dataset an earlier dsc wrote (its table in one block, version 1) reads as before: mapped from a
    folder, fetched whole from object storage."""
    from dsc.compiler.upload import push

    out = tmp_path / "old"
    dsc.compile(Tiny(9), out, size=2, shard_size=1, progress=False, workers=1)
    (rel,) = table_objects(out)
    rows, index, slots, base = shardtable.decode((out / rel).read_bytes())
    assert index is None and base is None and slots == 9
    v1 = (shardtable.MAGIC + (1).to_bytes(4, "little") + (rows.shape[1] // shardtable.ENTRY).to_bytes(4, "little")
          + slots.to_bytes(8, "little") + len(rows).to_bytes(8, "little") + bytes(32) + rows.tobytes())
    _retable(out, v1)
    assert [dsc.open(out)[i]["label"] for i in range(9)] == [i % 10 for i in range(9)]
    assert not [p for p in dsc.verify(out).problems if not p.view]  # (the view: its old manifest, here)
    url = "s3://dsc-test/version-1-table"
    push(out, url, progress=False)
    ds = dsc.open(url, cache_dir=tmp_path / "c")
    assert ds[8]["image"][0, 0, 0] == 8 and not [p for p in dsc.verify(url).problems if not p.view]


def test_verify_names_a_page_that_does_not_match_its_own_sha256(tmp_path):
    """A table object that matches its name but not its pages' own hashes (a writer's bug) reads locally (the
    name is checked there) and would be refused from object storage: verify says which page."""
    out = tmp_path / "t"
    dsc.compile(Tiny(6), out, size=2, shard_size=1, progress=False, workers=1)
    (rel,) = table_objects(out)
    data = bytearray((out / rel).read_bytes())
    data[-1] ^= 0xFF  # the last page's SHA-256
    new = _retable(out, bytes(data))
    problems = [str(p) for p in dsc.verify(out).problems if not p.view]
    assert problems == [f"shard table: {new}: page 0 does not match its own SHA-256 (readers of object storage "
                        f"refuse it)"], problems


def test_a_second_handle_fetches_nothing_of_a_delta_table(s3, tmp_path, monkeypatch):
    """An --update's table is a delta, whose head is longer than the first range a reader asks for (its length
    is known only from those bytes): the whole head is kept in the node's mirror, so a second handle of the node
    (another rank) asks the bucket for nothing of either table object, the delta's included."""
    from PIL import Image

    from dsc.compiler.upload import push
    from test_shard_table import _tiny_folder

    src, local = tmp_path / "src", tmp_path / "d"
    _tiny_folder(src, 6, classes=2)
    opts = dict(size=2, shard_size=1, progress=False, workers=1)
    dsc.compile_imagefolder(src, local, **opts)
    Image.new("RGB", (4, 4), (7, 7, 7)).save(src / "c1" / "new.png")
    dsc.compile_imagefolder(src, local, update=True, **opts)
    tables = table_objects(local)
    assert len(tables) == 2  # (the full table and the update's delta)
    url = f"s3://dsc-test/delta-{uuid.uuid4().hex}"
    push(local, url, progress=False)
    n = len(dsc.open(local))
    for handle in range(2):
        log = _requests(monkeypatch)
        ds = dsc.open(url, cache_dir=tmp_path / "cache")
        assert [ds[i]["label"] for i in range(n)] == [int(k.split("/")[0][1:]) for k in ds.keys]
        got = [r for r in log if r[1] in tables]
        assert (got != []) if handle == 0 else (got == []), (handle, got)
        monkeypatch.undo()


@pytest.mark.parametrize("cache_limit", [0, None])
def test_a_remote_loader_fetches_only_the_pages_of_the_shards_it_reads(pushed, tmp_path, monkeypatch, cache_limit):
    """A Loader over a dataset in object storage fetches the table's head and the pages of the slots its epoch
    reads, never the whole table (it did, for its shard sizes): its read strategy is chosen from the layout, and
    its epoch plan reads the entries of the slots it touches. By ranges (cache_limit=0) and through the shard
    cache (no limit); 6 samples of 48 one-sample shards in 3 of the 12 pages."""
    local, url = pushed[48]
    (table,) = table_objects(local)
    picked = [4, 5, 20, 21, 36, 37]  # pages 1, 5 and 9
    log = _requests(monkeypatch)
    ds = dsc.open(url, cache_dir=tmp_path / "c", cache_limit=cache_limit)
    loader = dsc.Loader(ds, batch_size=2, order="random", indices=picked, num_threads=0)
    assert loader.read_strategy == ("ranged" if cache_limit == 0 else "mapped")
    got = sorted((int(i), int(px)) for b in loader for i, px in zip(b["index"], b["image"][:, 0, 0, 0]))
    assert got == [(i, i) for i in picked]
    fetched = [r for r in log if r[1] == table]
    page = PAGE_ROWS * shardtable.ENTRY + 32
    assert sorted((op, n) for op, _, n in fetched) == [("range", 128)] + [("range", page)] * 3, fetched


def test_an_epoch_plans_table_pages_are_fetched_together_not_one_after_another(pushed, tmp_path, monkeypatch):
    """The shard cache's epoch plan over a rank's contiguous share (here samples 0-19 of 48 shards: 5 of 12
    pages, under half, so by page) asks for its pages with several ranged GETs in flight, not one round trip
    after another (1M slots on 8 ranks: ~92 pages a rank)."""
    import time

    local, url = pushed[48]
    (table,) = table_objects(local)
    lock, flight = threading.Lock(), {"now": 0, "most": 0, "pages": 0}
    real_range = ObjectStore.read_range

    def read_range(self, rel, start, end):
        if rel != table or end - start == 128:  # (the head)
            return real_range(self, rel, start, end)
        with lock:
            flight["now"] += 1
            flight["pages"] += 1
            flight["most"] = max(flight["most"], flight["now"])
        time.sleep(0.05)  # (a bucket's round trip)
        try:
            return real_range(self, rel, start, end)
        finally:
            with lock:
                flight["now"] -= 1

    ds = dsc.open(url, cache_dir=tmp_path / "c")
    monkeypatch.setattr(ObjectStore, "read_range", read_range)
    loader = dsc.Loader(ds, batch_size=4, order="sequential", indices=list(range(20)), num_threads=0)
    assert loader.read_strategy == "mapped"
    got = [int(i) for b in loader for i in b["index"]]
    assert got == list(range(20))
    assert flight["pages"] == 5 and flight["most"] > 1, flight


def test_a_remote_loaders_first_batches_fetch_the_pages_of_their_samples(pushed, tmp_path, monkeypatch):
    """By ranges, a random-order Loader over all 48 shards fetches, for its first two batches (and the one it
    gathers ahead), the pages of the samples they hold, each once: not the table."""
    local, url = pushed[48]
    (table,) = table_objects(local)
    log = _requests(monkeypatch)
    ds = dsc.open(url, cache_dir=tmp_path / "c", cache_limit=0)
    loader = dsc.Loader(ds, batch_size=2, order="random", num_threads=0, prefetch=1)
    batches = [[int(i) for i in b] for b in loader.batch_indices()]
    it = iter(loader)
    assert [[int(i) for i in next(it)["index"]] for _ in range(2)] == batches[:2]
    loader.close()
    fetched = [r for r in log if r[1] == table]
    pages = [len({i // PAGE_ROWS for b in batches[:k] for i in b}) for k in (2, 4)]
    assert all(op == "range" for op, _, _ in fetched), fetched
    assert pages[0] <= len(fetched) - 1 <= pages[1] < 12, (fetched, batches[:4])  # (the head, then pages)


def test_a_remote_loader_over_ragged_images_weighs_its_batches_without_the_table(s3, tmp_path, monkeypatch):
    """Images of their own sizes (the ragged layout): a Loader with a cache limit weighs a batch's shards from the
    offsets read at open, so over 2 of 24 samples it fetches the head and 2 pages of the table, not the table."""
    from dsc.compiler.upload import push
    from test_shard_table import _tiny_folder

    monkeypatch.setattr(shardtable, "PAGE_BYTES", PAGE_ROWS * shardtable.ENTRY)
    src, local = tmp_path / "src", tmp_path / "d"
    _tiny_folder(src, 24, classes=2)
    dsc.compile_imagefolder(src, local, size=None, shard_size=1, progress=False, workers=1)
    url = f"s3://dsc-test/ragged-{uuid.uuid4().hex}"
    push(local, url, progress=False)
    (table,) = table_objects(local)
    log = _requests(monkeypatch)
    ds = dsc.open(url, cache_dir=tmp_path / "c", cache_limit="1MB")
    loader = dsc.Loader(ds, batch_size=1, indices=[1, 22], num_threads=0)
    assert loader.read_strategy == "mapped"
    assert sum(len(b["index"]) for b in loader) == 2
    fetched = [r for r in log if r[1] == table]
    assert sorted(op for op, _, _ in fetched) == ["range"] * 3, fetched  # (the head, pages 0 and 5)


def test_pages_are_read_from_a_whole_table_the_node_fetched(pushed, tmp_path, monkeypatch):
    """A Loader whose epoch touches most pages fetches the table whole, into the node's mirror; another handle of
    the node (another rank) then reads its pages from that copy (each checked by its own hash): no request."""
    local, url = pushed[48]
    (table,) = table_objects(local)
    log = _requests(monkeypatch)
    ds = dsc.open(url, cache_dir=tmp_path / "c")
    loader = dsc.Loader(ds, batch_size=8, order="random", num_threads=0)
    assert sum(len(b["index"]) for b in loader) == 48
    assert [op for op, rel, _ in log if rel == table] == ["range", "get"]  # (the head, then the table whole)
    del log[:]
    other = dsc.open(url, cache_dir=tmp_path / "c")
    assert [other[i]["label"] for i in (0, 21, 47)] == [0, 1, 7]
    assert not [r for r in log if r[1] == table], log
