"""Batches say what the Loader's transforms did to each sample (issue 30: "users cannot re-attach targets:
batches do not say which samples were flipped or cropped"): ``affine`` (B, 2, 3), stored-sample pixel
coordinates -> output coordinates, and ``flipped`` (B,). A stored joint put through the reported map (and,
for a flipped sample, the flip permutation) lands exactly where the transforms put that joint, in the dict
form, the padded form and torchvision's targets, for a chain fused in the gather, one run after it, and
both composed."""
import numpy as np
import pytest
import torch

import dsc
from dsc import transforms as T
from dsc.synthetic import write_coco_instances

pytest.importorskip("pycocotools")


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    root = tmp_path_factory.mktemp("georec")
    ann, images = write_coco_instances(root / "src", n=8, seed=11, size_range=(60, 90))
    dsc.compile_coco(ann, images, root / "out", masks="instance", progress=False, workers=1)
    return dsc.open(root / "out")


def _mapped(ds, i: int, affine: torch.Tensor, flipped: bool, w: int, h: int, crowds: bool = True) -> torch.Tensor:
    """Sample ``i``'s stored joints (k, K, 3) through the reported geometry, by COCO's rules: the reported map
    on x, y; a flipped sample's joints permuted by the manifest's flip permutation; hidden or outside joints
    (0, 0, 0)."""
    s = ds[i]
    kp = s["keypoints"].double()
    if not crowds:
        kp = kp[s["iscrowd"] == 0]
    if flipped:
        kp = kp[:, ds.schema["keypoints"].flip_index]
    A = affine.double().cpu()
    x = A[0, 0] * kp[..., 0] + A[0, 1] * kp[..., 1] + A[0, 2]
    y = A[1, 0] * kp[..., 0] + A[1, 1] * kp[..., 1] + A[1, 2]
    vis = (kp[..., 2] > 0) & (x >= 0) & (x <= w) & (y >= 0) & (y <= h)
    return torch.stack([x, y, kp[..., 2]], -1) * vis.unsqueeze(-1)


CHAINS = {
    "flips, mixed sizes": [T.RandomHorizontalFlip(0.5)],
    "fused in the gather": [T.RandomResizedCrop(48, scale=(0.9, 1.0)), T.RandomHorizontalFlip(0.5)],
    "two stages composed": [T.Resize((56, 64)), T.RandomHorizontalFlip(0.5), lambda b: b,
                            T.RandomHorizontalFlip(0.5), T.RandomVerticalFlip(0.5)],
}


@pytest.mark.parametrize("chain", list(CHAINS))
def test_a_joint_through_the_reported_geometry_is_the_transformed_joint(ds, chain):
    loader = dsc.Loader(ds, batch_size=4, order="random", seed=3, num_threads=0, transforms=CHAINS[chain])
    checked, flips = 0, set()
    for epoch in range(3):
        for batch in loader:
            B = len(batch["index"])
            assert batch["affine"].shape == (B, 2, 3) and batch["affine"].dtype == torch.float64
            assert batch["flipped"].shape == (B,) and batch["flipped"].dtype == torch.bool
            o = batch["box_offsets"].tolist()
            sizes = (batch["image_shapes"][:, :2] if "image_shapes" in batch else
                     torch.tensor([batch["image"].shape[1:3]] * B)).tolist()
            for b, i in enumerate(batch["index"].tolist()):
                h, w = sizes[b]
                want = _mapped(ds, i, batch["affine"][b], bool(batch["flipped"][b]), w, h)
                got = batch["keypoints"][o[b]:o[b + 1]].double()
                if len(got) != len(want):  # a box the crop removed took its joints: compare the kept ones only
                    continue
                assert torch.allclose(got, want, atol=1e-4), (chain, i)
                # the map's x scale is negative exactly when the sample is reported flipped
                assert bool(batch["flipped"][b]) == bool(batch["affine"][b, 0, 0] < 0)
                checked += 1
                flips.add(bool(batch["flipped"][b]))
    assert checked >= 12 and flips == {True, False}


def test_the_record_in_torchvision_targets_and_the_padded_form(ds):
    kw = dict(batch_size=4, order="random", seed=5, num_threads=0, transforms=[T.RandomHorizontalFlip(0.5)])
    tv = dsc.Loader(ds, format="torchvision", **kw)
    padded = dsc.Loader(ds, boxes="padded", **kw)
    flips = set()
    for (images, targets), pb in zip(tv, padded):
        assert pb["affine"].shape == (len(images), 2, 3) and pb["flipped"].shape == (len(images),)
        for b, (img, t) in enumerate(zip(images, targets)):
            assert t["affine"].shape == (2, 3) and isinstance(t["flipped"], bool)
            assert torch.equal(t["affine"], pb["affine"][b]) and t["flipped"] == bool(pb["flipped"][b])
            h, w = img.shape[-2:]
            assert t["index"] == int(pb["index"][b])  # the row to map annotations of your own (image_id is COCO's)
            want = _mapped(ds, t["index"], t["affine"], t["flipped"], w, h, crowds=False)
            assert torch.allclose(t["keypoints"].double(), want, atol=1e-4)
            # a flip at native size: x -> w - x
            assert torch.equal(t["affine"], torch.tensor([[-1.0, 0, w], [0, 1.0, 0]], dtype=torch.float64)
                               if t["flipped"] else torch.tensor([[1.0, 0, 0], [0, 1.0, 0]], dtype=torch.float64))
            flips.add(t["flipped"])
    assert flips == {True, False}


def test_no_geometric_transform_no_record(ds):
    batch = next(iter(dsc.Loader(ds, batch_size=2, num_threads=0, transforms=[lambda b: b])))
    assert "affine" not in batch and "flipped" not in batch
    batch = next(iter(dsc.Loader(ds, batch_size=2, num_threads=0)))
    assert "affine" not in batch and "flipped" not in batch


def test_compose_on_a_gathered_batch_records_it_too(ds):
    """``T.Compose(...)(ds.get_batch(...))``, outside a Loader: the same record."""
    batch = ds.get_batch(np.arange(4))
    out = T.Compose([T.RandomHorizontalFlip(1.0)])(batch, seed=0)
    widths = out["image_shapes"][:, 1].double()
    assert out["flipped"].all() and torch.equal(out["affine"][:, 0, 2], widths)


def test_mosaic_voids_the_record(tmp_path):
    """Mosaic puts four samples on one canvas: no map of the stored sample says where it went, so the record
    is NaN (also through a later flip) and there is no ``flipped``, never a stale map."""
    from dsc.synthetic import detection_scenes, write_coco

    ann, images = write_coco(tmp_path / "coco", detection_scenes(6, seed=2))
    dsc.compile_coco(ann, images, tmp_path / "det", size=48, resize="pad", progress=False)
    ds = dsc.open(tmp_path / "det")
    for ops in ([T.RandomHorizontalFlip(1.0), T.Mosaic(24)], [T.Mosaic(24), T.RandomHorizontalFlip(1.0)]):
        batch = next(iter(dsc.Loader(ds, batch_size=4, num_threads=0, transforms=ops)))
        assert batch["affine"].shape == (4, 2, 3) and batch["affine"].isnan().all() and "flipped" not in batch


def test_mosaic_voids_the_record_wherever_it_runs(tmp_path):
    """Mosaic itself voids the record, so a Mosaic that Compose does not see directly (inside RandomChoice, or
    called on its own) leaves no stale map either; the op beside it in RandomChoice keeps the record."""
    from dsc.synthetic import detection_scenes, write_coco

    ann, images = write_coco(tmp_path / "coco", detection_scenes(6, seed=2))
    dsc.compile_coco(ann, images, tmp_path / "det", size=48, resize="pad", progress=False)
    ds = dsc.open(tmp_path / "det")
    ops = [T.RandomHorizontalFlip(1.0), T.RandomChoice([T.Mosaic(24)])]
    batch = next(iter(dsc.Loader(ds, batch_size=4, num_threads=0, transforms=ops)))
    assert batch["affine"].shape == (4, 2, 3) and batch["affine"].isnan().all() and "flipped" not in batch
    alone = T.Mosaic(24)(T.Compose([T.RandomHorizontalFlip(1.0)])(ds.get_batch(np.arange(4)), seed=0),
                         T.batch_generator(0, 0, 0))
    assert alone["affine"].isnan().all() and "flipped" not in alone
    kept = next(iter(dsc.Loader(ds, batch_size=4, num_threads=0,
                                transforms=[T.RandomHorizontalFlip(1.0), T.RandomChoice([lambda b, g: b])])))
    assert kept["flipped"].all() and not kept["affine"].isnan().any()
