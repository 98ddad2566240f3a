"""A remote handle whose node mirror was removed under it (``dsc cache clear``) fetches the version's small files
again when it first reads one it had not read (keys, original sizes, affine), as an open would."""
import uuid

import numpy as np

import dsc
from test_shard_table import Tiny, s3  # noqa: F401 - s3: the fixture


def test_a_remote_handle_reads_its_keys_after_a_cache_clear(s3, tmp_path):
    from dsc.compiler.upload import push
    from dsc.runtime.remote import cache_clear

    local = tmp_path / "d"
    dsc.compile(Tiny(8), local, size=2, shard_size=2, progress=False, workers=1)
    url = f"s3://dsc-test/mirror-{uuid.uuid4().hex}"
    push(local, url, progress=False)
    want = dsc.open(local)
    ds = dsc.open(url, cache_dir=tmp_path / "c")
    assert ds[0]["label"] == 0
    cache_clear(tmp_path / "c", url)
    assert not (tmp_path / "c" / "datasets").exists() or not any((tmp_path / "c" / "datasets").iterdir())
    assert ds.keys == want.keys  # (a MissingFile "open it again" before)
    assert np.array_equal(ds.orig_sizes, want.orig_sizes) and np.array_equal(ds.affine, want.affine)
    assert [ds[i]["label"] for i in (7, 3)] == [7, 3]
