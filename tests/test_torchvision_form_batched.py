"""format="torchvision" builds its float images and per-object masks batch-wide (issue 30's speed goal): the
tensors equal the per-image / per-target construction they replace (``_chw_float``, ``object_masks``), also
when the Loader's ring reuses its mask buffers epoch after epoch, and targets the user keeps are never
overwritten by later batches."""
import pytest
import torch

import dsc
from dsc import transforms as T
from dsc.runtime.batches import _chw_float, object_masks, sample_pixels
from dsc.synthetic import write_coco_instances

pytest.importorskip("pycocotools")


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    root = tmp_path_factory.mktemp("tvfast")
    ann, images = write_coco_instances(root / "src", n=6, seed=5)
    dsc.compile_coco(ann, images, root / "out", masks="instance", progress=False, workers=1)
    return dsc.open(root / "out")


def _reference(batch):
    """What format="torchvision" handed out before: each image through _chw_float, each target's masks
    through object_masks (crowds left out)."""
    images = [_chw_float(x) for x in sample_pixels(batch, "image")]
    o = batch["box_offsets"].tolist()
    masks = [object_masks(batch, "masks", k)[batch["iscrowd"][o[k]:o[k + 1]] == 0] for k in range(len(o) - 1)]
    return images, masks


@pytest.mark.parametrize("threads", [0, 2])
def test_torchvision_form_equals_the_per_image_construction_and_keeps_held_targets(ds, threads):
    kw = dict(batch_size=2, num_threads=threads, transforms=[T.RandomHorizontalFlip(1.0)])
    tv, packed = dsc.Loader(ds, format="torchvision", **kw), dsc.Loader(ds, **kw)
    held, seen = [], 0
    for epoch in range(3):  # the ring's slots come round again: their mask buffers are reused
        for (images, targets), batch in zip(tv, packed):
            ref_images, ref_masks = _reference(batch)
            assert len(images) == len(ref_images) == len(targets)
            for img, ref, hwc in zip(images, ref_images, sample_pixels(batch, "image")):
                assert img.dtype == torch.float32 and torch.equal(img, ref)
                # mixed sizes (a list): each image laid out as torchvision's detection reference hands it,
                # PILToTensor (a (C, H, W) permuted view of the HWC pixels) then ToDtype(float, scale=True)
                # (.to keeps the strides, then / 255)
                tv_ref = hwc.permute(2, 0, 1).to(torch.float32) / 255
                assert img.stride() == tv_ref.stride() and torch.equal(img, tv_ref)
            for t, ref in zip(targets, ref_masks):
                assert t["masks"].dtype == torch.uint8 and t["masks"].shape == ref.shape
                assert torch.equal(t["masks"], ref) and len(t["masks"]) == len(t["boxes"])
                seen += int(ref.sum() > 0)
            if epoch == 0:
                held.append([(t["masks"], t["masks"].clone()) for t in targets] + [(x, x.clone()) for x in images])
    assert seen > 0
    for batch in held:  # the images and masks the user kept from the first epoch is as it was handed out
        for kept, copy in batch:
            assert torch.equal(kept, copy)


def test_the_batch_wide_cast_in_pieces_equals_the_per_image_one(ds, monkeypatch):
    """The packed images are cast and divided in cache-sized pieces; pieces that split images anywhere
    (777 bytes) give the same floats."""
    import dsc.runtime.batches as B

    monkeypatch.setattr(B, "_CAST_CHUNK", 777)
    kw = dict(batch_size=3, num_threads=0, transforms=[T.RandomHorizontalFlip(0.5)])
    n = 0
    for (images, _), batch in zip(dsc.Loader(ds, format="torchvision", **kw), dsc.Loader(ds, **kw)):
        assert batch["image"].numel() > 3 * 777
        for img, ref in zip(images, _reference(batch)[0]):
            assert torch.equal(img, ref)
            n += 1
    assert n == len(ds)
