"""Compile a real ImageFolder, read it back, compare with an independent PIL reference."""
import numpy as np
import pytest
import torch
import zarr

import dsc
from conftest import MIXED_IMAGES, tree_bytes
from reference import reference

POLICIES = [
    dict(size=(48, 48), resize="center-crop"),
    dict(size=(40, 56), resize="center-crop"),
    dict(size=(48, 64), resize="stretch"),
    dict(size=(64, 48), resize="pad", fill=7),
    dict(max_side=50),
    dict(),  # ragged, stored exactly as decoded
    dict(size=(32, 32), resize="pad", mode="L"),
    dict(max_side=40, mode="L"),
    dict(size=(48, 48), resize="center-crop", resizer="torch"),
    dict(size=(64, 48), resize="pad", fill=7, resizer="torch"),
    dict(max_side=50, resizer="torch"),
    dict(size=(32, 40), resize="stretch", mode="L", resizer="torch"),
]


@pytest.mark.parametrize("opts", POLICIES, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "asis")
def test_every_sample_matches_reference(mixed_src, out, opts):
    dsc.compile_imagefolder(mixed_src, out, workers=2, shard_size=3, progress=False, **opts)
    ds = dsc.open(out)
    assert len(ds) == len(MIXED_IMAGES)
    assert ds.keys == MIXED_IMAGES
    affine = ds.affine
    for i, key in enumerate(ds.keys):
        want, want_affine = reference(mixed_src / key, **{k: v for k, v in opts.items()})
        got = ds[i]["image"]
        assert got.dtype == torch.uint8 and got.shape == want.shape, key
        np.testing.assert_array_equal(got.numpy(), want, err_msg=key)
        np.testing.assert_allclose(affine[i], want_affine, rtol=1e-12, err_msg=key)
    # The batched path returns the same samples in the requested order.
    order = [5, 0, 14, 3, 3, 9]
    batch = ds.__getitems__(order)
    for k, i in enumerate(order):
        assert torch.equal(batch[k]["image"], ds[i]["image"])
        assert batch[k]["label"] == ds[i]["label"]
    if "size" in opts:
        assert batch["image"].shape == (len(order), *ds[0]["image"].shape)


def test_labels_classes_and_zarr_without_dsc(mixed_src, out):
    dsc.compile_imagefolder(mixed_src, out, size=32, progress=False)
    ds = dsc.open(out)
    assert ds.classes == ["cat", "dog", "empty"]  # the empty class keeps its index
    assert ds.class_to_idx == {"cat": 0, "dog": 1, "empty": 2}
    labels = [ds[i]["label"] for i in range(len(ds))]
    assert labels == [ds.class_to_idx[k.split("/")[0]] for k in MIXED_IMAGES]
    # zarr-python alone: same pixels, labels, keys.
    g = zarr.open_group(out, mode="r")
    assert g["image"].shape == (len(ds), 32, 32, 3)
    np.testing.assert_array_equal(g["image"][:], np.stack([ds[i]["image"].numpy() for i in range(len(ds))]))
    np.testing.assert_array_equal(g["label"][:], labels)
    assert list(g["keys"][:]) == MIXED_IMAGES
    assert g.attrs["dsc"]["num_samples"] == len(ds)
    np.testing.assert_array_equal(g["image"][7], ds[7]["image"].numpy())  # single-sample random access


def test_ragged_readable_with_zarr_alone(mixed_src, out):
    dsc.compile_imagefolder(mixed_src, out, max_side=60, shard_size=4, progress=False)
    ds = dsc.open(out)
    g = zarr.open_group(out, mode="r")
    offsets, shapes = g["image/offsets"][:], g["image/shapes"][:]
    # (each shard's array through its group: its metadata is beside it, not in the root's consolidated metadata)
    flat = np.concatenate([g["image/values"][str(s)][:] for s in range(g.attrs["dsc"]["shard_table"]["slots"])])
    for i in range(len(ds)):
        np.testing.assert_array_equal(flat[offsets[i]:offsets[i + 1]].reshape(shapes[i]), ds[i]["image"].numpy())


@pytest.mark.parametrize("opts", [dict(size=(24, 24)), dict(max_side=30)], ids=["fixed", "ragged"])
def test_deterministic_whatever_the_worker_count(scenes_src, tmp_path, opts):
    a, b = tmp_path / "a", tmp_path / "b"
    dsc.compile_imagefolder(scenes_src, a, workers=1, progress=False, **opts)
    dsc.compile_imagefolder(scenes_src, b, workers=2, progress=False, **opts)
    ta, tb = tree_bytes(a), tree_bytes(b)
    assert ta.keys() == tb.keys()
    assert ta == tb


def _with_bad_files(src, dst):
    import shutil

    shutil.copytree(src, dst)
    (dst / "class_00" / "img_00003.jpg").write_bytes(b"")  # zero bytes
    data = (dst / "class_01" / "img_00004.jpg").read_bytes()
    (dst / "class_01" / "img_00004.jpg").write_bytes(data[: len(data) // 2])  # truncated
    (dst / "class_01" / "img_00005.jpg").write_text("this is text")
    return ["class_00/img_00003.jpg", "class_01/img_00004.jpg", "class_01/img_00005.jpg"]


@pytest.mark.parametrize("opts", [dict(size=(20, 20)), dict(max_side=25)], ids=["fixed", "ragged"])
def test_skip_records_bad_inputs_and_keeps_shards_aligned(scenes_src, tmp_path, opts):
    src = tmp_path / "src"
    bad = _with_bad_files(scenes_src, src)
    out = tmp_path / "out"
    report = dsc.compile_imagefolder(src, out, on_error="skip", shard_size=5, workers=2, progress=False, **opts)
    assert sorted(s["key"] for s in report.skipped) == bad
    ds = dsc.open(out)
    assert len(ds) == 36 - 3
    assert [s.count for s in ds.manifest.shards] == [5] * 6 + [3]
    assert sorted(s["key"] for s in ds.manifest.skipped) == bad
    assert not set(bad) & set(ds.keys)
    for i, key in enumerate(ds.keys):
        want, _ = reference(src / key, **opts)
        np.testing.assert_array_equal(ds[i]["image"].numpy(), want, err_msg=key)
        assert ds[i]["label"] == int(key.split("/")[0][-2:])
    if "size" in opts:  # zarr sees the same compacted array
        g = zarr.open_group(out, mode="r")
        np.testing.assert_array_equal(g["image"][31], ds[31]["image"].numpy())
    assert not any(p.name.endswith(".partial") or p.name == "_compact" for p in out.rglob("*"))


def test_fail_is_the_default_and_leaves_no_output(scenes_src, tmp_path):
    src = tmp_path / "src"
    _with_bad_files(scenes_src, src)
    out = tmp_path / "out"
    with pytest.raises(dsc.SampleError) as e:
        dsc.compile_imagefolder(src, out, size=16, workers=2, progress=False)
    assert "img_0000" in str(e.value) and "--on-error skip" in str(e.value)
    left = sorted(p.name for p in tmp_path.iterdir())
    assert "out" not in left and ".out.dsc-lock" not in left  # no OUT, no lock held
    if ".out.dsc-tmp" in left:  # finished shards kept for --resume, never presented as a dataset
        with pytest.raises(dsc.DatasetNotFoundError):
            dsc.open(tmp_path / ".out.dsc-tmp")


def test_overwrite_rules(scenes_src, tmp_path):
    out = tmp_path / "out"
    dsc.compile_imagefolder(scenes_src, out, size=8, progress=False)
    with pytest.raises(dsc.OutputExistsError, match="--overwrite"):
        dsc.compile_imagefolder(scenes_src, out, size=8, progress=False)
    dsc.compile_imagefolder(scenes_src, out, size=12, progress=False, overwrite=True)
    assert dsc.open(out)[0]["image"].shape == (12, 12, 3)
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "thesis.tex").write_text("do not delete")
    with pytest.raises(dsc.OutputExistsError, match="not a dsc dataset"):
        dsc.compile_imagefolder(scenes_src, precious, size=8, progress=False, overwrite=True)
    assert (precious / "thesis.tex").exists()


def test_concurrent_compile_is_refused(scenes_src, tmp_path):
    import fcntl
    import os

    out = tmp_path / "out"
    fd = os.open(tmp_path / ".out.dsc-lock", os.O_CREAT | os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        with pytest.raises(dsc.CompileLockedError, match="another dsc compile"):
            dsc.compile_imagefolder(scenes_src, out, size=8, progress=False)
    finally:
        os.close(fd)
    assert not out.exists()


def test_samples_per_shard_come_from_bytes_alone_without_a_count_cap(tmp_path):
    """Small samples make few large shards (before: at most 1,024 samples a shard, so 32x32 images made
    64 KiB... 3 MiB shards, and a billion of them a million shards)."""
    from dsc.compiler.options import CompileOptions, SHARD_TARGET_BYTES, default_shard_size

    opts = CompileOptions(size=(32, 32))
    k = default_shard_size(10_000_000, opts)
    assert k > 1024 and k * (32 * 32 * 3 + 16) <= SHARD_TARGET_BYTES < 2 * k * (32 * 32 * 3 + 16)
    assert default_shard_size(10_000_000, CompileOptions(size=(224, 224))) == 256  # (large samples: as before)
    assert default_shard_size(4_000, opts) == 125  # (a small dataset: ~32 shards, as before)


@pytest.mark.parametrize("resizer", ["pil", "torch"])
def test_apply_plan_takes_the_array_of_an_images_pixels_as_the_image(resizer):
    """``geometry.apply_plan`` gives the same pixels for an image and for the (H, W, C) array of its pixels (a
    Python dataset's), on every path: a resize (PIL's or torch's), the crop of a resize that dwarfs it (PIL's
    exact box), a letterbox, no resize."""
    from PIL import Image

    from dsc.compiler.geometry import apply_plan, oversized, plan_fixed, plan_ragged

    rng = np.random.default_rng(0)
    cases = [((40, 60), plan_fixed(40, 60, (16, 16), "center-crop")),
             ((1, 20000), plan_fixed(1, 20000, (16, 16), "center-crop")),
             ((40, 60), plan_fixed(40, 60, (32, 32), "pad")), ((40, 60), plan_ragged(40, 60, None))]
    assert oversized(cases[1][1]) and not oversized(cases[0][1])
    for (h, w), plan in cases:
        arr = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        want = apply_plan(Image.fromarray(arr), plan, 7, "bilinear", resizer=resizer)
        assert np.array_equal(apply_plan(arr, plan, 7, "bilinear", resizer=resizer), want)
