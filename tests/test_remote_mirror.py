"""A remote handle whose node mirror was removed under it (``dsc cache clear``) fetches the version's small files
again when it first reads one it had not read (keys, original sizes, affine), as an open would."""
import os
import uuid

import numpy as np

import dsc
from test_shard_table import Tiny, s3  # noqa: F401 - s3: the fixture


def _pushed(tmp_path):
    """(url, the local dataset, a handle on the URL caching under tmp_path/c) of 8 samples pushed to S3."""
    from dsc.compiler.upload import push

    local = tmp_path / "d"
    dsc.compile(Tiny(8), local, size=2, shard_size=2, progress=False, workers=1)
    url = f"s3://dsc-test/mirror-{uuid.uuid4().hex}"
    push(local, url, progress=False)
    return url, dsc.open(local), dsc.open(url, cache_dir=tmp_path / "c")


def test_a_remote_handle_reads_its_keys_after_a_cache_clear(s3, tmp_path):
    from dsc.runtime.remote import cache_clear

    url, want, ds = _pushed(tmp_path)
    assert ds[0]["label"] == 0
    cache_clear(tmp_path / "c", url)
    assert not (tmp_path / "c" / "datasets").exists() or not any((tmp_path / "c" / "datasets").iterdir())
    assert ds.keys == want.keys  # (a MissingFile "open it again" before)
    assert np.array_equal(ds.orig_sizes, want.orig_sizes) and np.array_equal(ds.affine, want.affine)
    assert [ds[i]["label"] for i in (7, 3)] == [7, 3]


def test_a_remote_handle_fetches_a_small_file_deleted_from_its_mirror_and_checks_nothing_while_files_are_there(
        s3, tmp_path, monkeypatch):
    """`dsc cache verify` deletes a damaged small file of the mirror and leaves its folder: the handle fetches the
    version again when it reads that file (a MissingFile before: only a removed folder was fetched again). A
    read of the mirror whose files are there costs no check of the folder (an fstat on every `storage.dir`
    before)."""
    from dsc.formats import layout as L

    _, want, ds = _pushed(tmp_path)
    mirror = ds.storage.dir
    obj = next(mirror.path / o for r, o in sorted(mirror.redirect.items()) if r.startswith(L.KEYS + "/c/"))
    obj.unlink()  # (what cache_check does with a damaged copy)
    real = os.fstat
    calls = []
    monkeypatch.setattr("os.fstat", lambda fd: calls.append(fd) or real(fd))
    for _ in range(100):
        assert ds.storage.dir is mirror
    assert calls == []
    monkeypatch.undo()
    assert ds.keys == want.keys
    assert obj.is_file()


def test_a_remote_open_makes_its_mirror_folder_once(s3, tmp_path, monkeypatch):
    """An open of a dataset in a bucket finds (and makes) its node mirror once: the handle's mirror is the folder
    the open fetched the version into (_Mirror computed it again: two mkdirs and a stat at every remote open)."""
    from dsc.runtime import remote

    url, want, _ = _pushed(tmp_path)
    calls = []
    real = remote.mirror_dir
    monkeypatch.setattr(remote, "mirror_dir", lambda cache, u: calls.append(u) or real(cache, u))
    ds = dsc.open(url, cache_dir=tmp_path / "c")
    assert calls == [url] and ds.keys == want.keys and ds.storage.dir.path == real(ds.storage.cache, url)
