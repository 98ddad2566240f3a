"""The bytes dsc writes are the bytes zarr-python writes; the manifest round-trips and refuses junk."""
import numpy as np
import pytest
import zarr

from dsc.formats.fields import Pixels
from dsc.errors import CorruptDatasetError, UnsafePathError
from dsc.formats import ImageSpec, Manifest, ResizeSpec, ShardSpec
from dsc.formats.zarr_v3 import (check_node_path, read_plain_array, read_string_array, sharded_array_json,
                                 write_json, write_plain_array, write_string_array)


def test_fixed_shards_are_byte_identical_to_zarr_python(tmp_path):
    rng = np.random.default_rng(0)
    data = rng.integers(0, 256, (11, 5, 7, 3), dtype=np.uint8)
    data[4] = 0  # an all-zero sample must still be stored
    ref = zarr.create_array(tmp_path / "ref", shape=data.shape, dtype="uint8", shards=(4, 5, 7, 3),
                            chunks=(1, 5, 7, 3), compressors=None, fill_value=0,
                            config={"write_empty_chunks": True})
    ref[:] = data
    ours = tmp_path / "ours"
    for s in range(3):
        w = Pixels("image", "uint8", "fixed", 3, 5, 7).writer(ours, s, 4)
        for sample in data[s * 4:(s + 1) * 4]:
            w.write(sample)
        w.close()
    write_json(ours / "image" / "zarr.json", sharded_array_json(data.shape, 4))
    for s in range(3):
        assert (ours / f"image/c/{s}/0/0/0").read_bytes() == (tmp_path / f"ref/c/{s}/0/0/0").read_bytes()
    np.testing.assert_array_equal(zarr.open_array(ours / "image", mode="r")[:], data)


def test_plain_and_string_arrays_roundtrip_through_zarr(tmp_path):
    arrays = {"a": np.arange(12, dtype=np.int64).reshape(3, 4), "b": np.array([1.5, -2.0]),
              "c": np.array([[1, 2, 3]], dtype=np.int32), "d": np.arange(5, dtype=np.uint8)}
    for name, arr in arrays.items():
        write_plain_array(tmp_path, name, arr)
        np.testing.assert_array_equal(zarr.open_array(tmp_path / name, mode="r")[:], arr)
        np.testing.assert_array_equal(read_plain_array(tmp_path, name), arr)
    keys = ["a/b.jpg", "é ü/空 白.png", ""]
    write_string_array(tmp_path, "keys", keys)
    assert list(zarr.open_array(tmp_path / "keys", mode="r")[:]) == keys
    assert read_string_array(tmp_path, "keys") == keys


def _manifest(**kw):
    base = dict(format_version=1, dsc_version="0.1.0", task="classification", num_samples=5, shard_size=2,
                image=ImageSpec(layout="fixed", channels=3, mode="RGB", height=4, width=4),
                resize=ResizeSpec(policy="pad", size=(4, 4), fill=3),
                shards=tuple(ShardSpec(path=f"image/c/{s}/0/0/0", count=c, nbytes=c * 48 + 16 * 2 + 4, sha256="0" * 64)
                             for s, c in enumerate([2, 2, 1])),
                classes=("a", "b"), source={"kind": "imagefolder"}, skipped=({"key": "x", "reason": "y"},))
    base.update(kw)
    return Manifest(**base)


def _stored(m: Manifest) -> dict:
    """The manifest as a dataset stores it: with its checksum."""
    return {**m.to_dict(), "checksum": m.checksum()}


def _resealed(d: dict) -> dict:
    """An edited manifest with its checksum recomputed (what a careless or hostile editor would do)."""
    import hashlib
    import json

    body = {k: v for k, v in d.items() if k != "checksum"}
    return {**body, "checksum": hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":"),
                                                          ensure_ascii=False).encode()).hexdigest()}


def test_manifest_roundtrip():
    m = _manifest()
    assert Manifest.from_dict(_stored(m)) == m
    with pytest.raises(CorruptDatasetError, match="missing keys.*checksum"):  # the checksum is mandatory
        Manifest.from_dict(m.to_dict())


def test_manifest_resizer_defaults_to_pil_and_is_checked():
    d = _manifest().to_dict()
    assert d["resize"]["resizer"] == "pil"
    del d["resize"]["resizer"]  # written before the torch resizer existed
    assert Manifest.from_dict(_resealed(d)).resize.resizer == "pil"
    d["resize"]["resizer"] = "magic"
    with pytest.raises(CorruptDatasetError, match="resize.resizer"):
        Manifest.from_dict(_resealed(d))


def test_manifest_refuses_unknown_keys_and_inconsistency():
    d = _stored(_manifest())
    d["surprise"] = 1
    with pytest.raises(CorruptDatasetError, match="unknown keys"):
        Manifest.from_dict(d)
    with pytest.raises(CorruptDatasetError, match="shards listed"):
        _manifest(num_samples=9)


@pytest.mark.parametrize("bad", ["../x", "/abs", "a/../b", "a//b", "a/./b", "", "a\\b", "c/~x"])
def test_node_paths_are_plain(bad):
    with pytest.raises(UnsafePathError):
        check_node_path(bad)
