"""dsc.open: samples, batched fetch, torch DataLoader, clear errors on damaged datasets."""
import json

import pytest
import torch

import dsc
from damage import edit_manifest, list_shards


@pytest.fixture(scope="module")
def fixed_ds(scenes_src, tmp_path_factory):
    out = tmp_path_factory.mktemp("rt") / "fixed"
    dsc.compile_imagefolder(scenes_src, out, size=(16, 24), shard_size=5, progress=False)
    return out


def test_samples_are_their_own_copies(fixed_ds):
    ds = dsc.open(fixed_ds)
    a, b = ds[5]["image"], ds[6]["image"]  # same shard (5..9): not views of it (a write would change later reads)
    assert b.data_ptr() - a.data_ptr() != 16 * 24 * 3
    assert ds[5]["image"].data_ptr() != a.data_ptr() and torch.equal(ds[5]["image"], a)
    assert torch.equal(ds[-1]["image"], ds[len(ds) - 1]["image"])
    with pytest.raises(IndexError):
        ds[len(ds)]


def test_open_does_no_per_sample_python_work(fixed_ds, monkeypatch):
    ds = dsc.open(fixed_ds)
    assert isinstance(ds.labels, torch.Tensor) and ds.labels.dtype == torch.int64
    assert ds._keys is None  # keys are loaded on first use only
    assert not ds.storage._maps  # shards are mapped on first use only


def test_getitems_one_batched_copy(fixed_ds):
    ds = dsc.open(fixed_ds)
    batch = ds.__getitems__([3, 1, 2])
    assert batch["image"].shape == (3, 16, 24, 3)
    assert batch["label"].tolist() == [ds[3]["label"], ds[1]["label"], ds[2]["label"]]
    assert batch["index"].tolist() == [3, 1, 2]
    assert len(batch) == 3 and torch.equal(batch[0]["image"], ds[3]["image"])
    assert batch[1]["image"].data_ptr() == batch["image"][1].data_ptr()  # views of one buffer


@pytest.mark.parametrize("ctx,collate", [("fork", None), ("fork", dsc.collate), ("spawn", dsc.collate)])
def test_dataloader_with_workers_sees_every_sample_once(fixed_ds, ctx, collate):
    ds = dsc.open(fixed_ds)
    ds[0]  # a mapped shard in the parent must not confuse the workers
    kw = {"collate_fn": collate} if collate else {}
    loader = torch.utils.data.DataLoader(ds, batch_size=7, shuffle=True, num_workers=2,
                                         multiprocessing_context=ctx, **kw)
    seen, images = [], []
    for batch in loader:
        images.append(batch["image"])
        if "index" in batch:
            seen += batch["index"].tolist()
    images = torch.cat(images)
    assert images.shape[0] == len(ds)
    ref = torch.stack([ds[i]["image"] for i in range(len(ds))])
    # every sample exactly once: the multiset of images equals the dataset's
    key = lambda t: sorted(bytes(x.numpy().tobytes()) for x in t)  # noqa: E731
    assert key(images) == key(ref)
    if seen:
        assert sorted(seen) == list(range(len(ds)))


def test_ragged_batches_are_packed(scenes_src, tmp_path):
    dsc.compile_imagefolder(scenes_src, tmp_path / "r", max_side=30, shard_size=4, progress=False)
    ds = dsc.open(tmp_path / "r")
    b = ds.get_batch([9, 2, 30])
    o = b["image_offsets"]
    for k, i in enumerate([9, 2, 30]):
        got = b["image"][o[k]:o[k + 1]].view(*b["image_shapes"][k].tolist())
        assert torch.equal(got, ds[i]["image"])
    assert torch.equal(ds.__getitems__([9, 2])[1]["image"], ds[2]["image"])


def test_not_a_dataset(tmp_path):
    with pytest.raises(dsc.DatasetNotFoundError, match="no such dataset"):
        dsc.open(tmp_path / "missing")
    with pytest.raises(dsc.DatasetNotFoundError, match="not a dsc dataset"):
        dsc.open(tmp_path)
    (tmp_path / "zarr.json").write_text(json.dumps({"zarr_format": 3, "node_type": "group", "attributes": {}}))
    with pytest.raises(FileNotFoundError, match="not a dsc dataset"):  # also a FileNotFoundError
        dsc.open(tmp_path)


def _copy(src, dst):
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_newer_format_version_is_refused(fixed_ds, tmp_path):
    d = _copy(fixed_ds, tmp_path / "d")
    edit_manifest(d, lambda m: m.__setitem__("format_version", 99), sealed=False)
    with pytest.raises(dsc.FormatVersionError, match="version 99"):
        dsc.open(d)


def test_missing_or_truncated_shard(fixed_ds, tmp_path):
    d = _copy(fixed_ds, tmp_path / "d")
    shard = d / "image/c/2/0/0/0"
    shard.write_bytes(shard.read_bytes()[:-10])
    # (a shard table is read when a shard is first read: its size is checked then, not at open)
    with pytest.raises(dsc.CorruptDatasetError, match="truncated"):
        dsc.open(d).get_batch(range(len(dsc.open(d))))
    shard.unlink()
    with pytest.raises(dsc.CorruptDatasetError, match="missing"):
        dsc.open(d).get_batch(range(len(dsc.open(d))))


def test_shard_paths_in_metadata_cannot_leave_the_dataset(fixed_ds, tmp_path):
    d = _copy(fixed_ds, tmp_path / "d")
    list_shards(d)  # (format 4 stores no shard path: a format 3 manifest does)
    edit_manifest(d, lambda m: m["shards"][0].__setitem__("path", "../../etc/passwd"), sealed=False)
    with pytest.raises(dsc.UnsafePathError):
        dsc.open(d)
