"""dsc in training scripts written for torchvision's datasets and DataLoader: epochs that advance by
themselves, per-rank augmentation, tuple and torchvision batches, Subsets, ``num_threads=0``, clear errors
for what is not compiled, and a segmentation-only VOC set.

torchvision is not installed here: its models' documented input format is reproduced by
``check_torchvision_detection`` (the checks ``GeneralizedRCNN.forward`` and ``RoIHeads.check_targets``
make, plus what training needs: labels 1-based, 0 being the background)."""
import shutil
import threading

import numpy as np
import pytest
import torch

import dsc
from dsc import transforms as T
from dsc.compiler.sources.voc import VOC_CLASSES
from dsc.synthetic import detection_scenes, seg_scenes, write_coco, write_segfolder, write_voc_segmentation

RECIPE = [T.RandomResizedCrop(8, scale=(0.2, 1.0)), T.RandomHorizontalFlip()]


@pytest.fixture(scope="module")
def fixed(scenes_compiled):
    return scenes_compiled(size=(12, 10), shard_size=5)


@pytest.fixture(scope="module")
def det(tmp_path_factory):
    root = tmp_path_factory.mktemp("tsdet")
    ann, images = write_coco(root / "coco", detection_scenes(10, seed=2))
    dsc.compile_coco(ann, images, root / "d", max_side=64, shard_size=3, progress=False)
    return dsc.open(root / "d")


def snapshot(loader):
    """One iteration of ``loader``: [(index, image)] copies."""
    return [(b["index"].clone(), b["image"].clone()) for b in loader]


def same(a, b) -> bool:
    return len(a) == len(b) and all(torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]) for x, y in zip(a, b))


# ----------------------------------------------------------------------------------- epochs
def test_epochs_advance_without_set_epoch(fixed):
    """A single-process script that never calls set_epoch gets a new order and new augmentations each epoch."""
    loader = dsc.Loader(fixed, batch_size=8, order="random", seed=1, transforms=RECIPE)
    epochs = [snapshot(loader) for _ in range(3)]
    orders = [torch.cat([i for i, _ in e]) for e in epochs]
    assert not torch.equal(orders[0], orders[1]) and not torch.equal(orders[1], orders[2])
    for e, ep in enumerate(epochs):
        pinned = dsc.Loader(fixed, batch_size=8, order="random", seed=1, transforms=RECIPE)
        pinned.set_epoch(e)  # set_epoch still pins one: the same batches as the e-th iteration
        assert same(snapshot(pinned), ep)
    # the same samples in the same order: only the augmentation differs from one epoch to the next
    seq = dsc.Loader(fixed, batch_size=8, order="sequential", transforms=RECIPE)
    a, b = snapshot(seq), snapshot(seq)
    assert all(torch.equal(x[0], y[0]) for x, y in zip(a, b)) and not same(a, b)
    # a broken-off epoch counts: the next iteration is the next epoch (FFCV's rule)
    loader = dsc.Loader(fixed, batch_size=8, order="random", seed=1)
    for _ in loader:
        break
    assert loader.state_dict()["epoch"] == 1 and torch.equal(torch.cat([i for i, _ in snapshot(loader)]), orders[1])


def test_set_epoch_pins_then_advances(fixed):
    loader = dsc.Loader(fixed, batch_size=8, order="random", seed=4)
    loader.set_epoch(5)
    five, six = snapshot(loader), snapshot(loader)
    assert loader.epoch == 6
    for e, want in ((5, five), (6, six)):  # the usual `for epoch ...: loader.set_epoch(epoch)` loop still works
        loader.set_epoch(e)
        assert same(snapshot(loader), want)


@pytest.mark.parametrize("stop_after", [0, 2])
def test_resume_continues_the_saved_epoch_then_advances(fixed, stop_after):
    kw = dict(batch_size=7, order="random", seed=11, transforms=RECIPE)
    full = dsc.Loader(fixed, **kw)
    want = [snapshot(full) for _ in range(3)]  # epochs 0, 1, 2 of an uninterrupted run
    first = dsc.Loader(fixed, **kw)
    snapshot(first)
    assert first.state_dict()["epoch"] == 1 and first.state_dict()["batches_served"] == 0  # after a whole epoch
    it = iter(first)
    got = [(b["index"].clone(), b["image"].clone()) for _, b in zip(range(stop_after), it)]
    state = first.state_dict()
    assert (state["epoch"], state["batches_served"]) == (1, stop_after)
    del it, first
    second = dsc.Loader(fixed, **{**kw, "num_threads": 1})
    second.load_state_dict(state)
    assert same(got + snapshot(second), want[1])  # the rest of the saved epoch ...
    assert same(snapshot(second), want[2])  # ... then the next one


# ----------------------------------------------------------------------------------- ranks
def test_ranks_draw_different_augmentations(fixed):
    """Two ranks that hold the same samples (indices listing them twice) draw different crops for batch j;
    each rank's draws are those of Compose(..., rank=r) and are replayed after a resume."""
    half = list(range(18))
    kw = dict(batch_size=6, order="sequential", seed=3, transforms=RECIPE, world_size=2, indices=half * 2)
    r0, r1 = dsc.Loader(fixed, rank=0, **kw), dsc.Loader(fixed, rank=1, **kw)
    a, b = snapshot(r0), snapshot(r1)
    assert all(torch.equal(x[0], y[0]) for x, y in zip(a, b))  # the same samples ...
    assert not any(torch.equal(x[1], y[1]) for x, y in zip(a, b))  # ... augmented differently in every batch
    compose = T.Compose(RECIPE)
    for j, (idx, img) in enumerate(b):
        ref = compose(fixed.get_batch(idx.numpy()), seed=3, epoch=0, batch_index=j, rank=1)
        assert torch.equal(ref["image"], img)
    it = iter(r1)  # epoch 1 on rank 1, interrupted after a batch and resumed
    got = [(x["index"].clone(), x["image"].clone()) for _, x in zip(range(1), it)]
    state = r1.state_dict()
    del it
    again = dsc.Loader(fixed, rank=1, **kw)
    again.load_state_dict(state)
    want = dsc.Loader(fixed, rank=1, **kw)
    want.set_epoch(1)
    assert same(got + snapshot(again), snapshot(want))
    other = dsc.Loader(fixed, rank=0, **kw)  # any rank's state resumes any rank (the ranks step together)
    other.load_state_dict(state)
    want = dsc.Loader(fixed, rank=0, **kw)
    want.set_epoch(1)
    assert same(snapshot(other), snapshot(want)[1:])


def test_a_plain_transform_callable_gets_the_rank_when_it_takes_it(fixed):
    seen = []

    def old_style(batch, seed, epoch, batch_index):
        return batch

    def new_style(batch, seed, epoch, batch_index, rank):
        seen.append(rank)
        return batch

    assert len(list(dsc.Loader(fixed, batch_size=9, transforms=old_style, rank=1, world_size=2))) == 2
    list(dsc.Loader(fixed, batch_size=9, transforms=new_style, rank=1, world_size=2))
    assert seen == [1, 1]


# ----------------------------------------------------------------------------------- forms
def test_keys_give_tuples(fixed):
    loader = dsc.Loader(fixed, batch_size=8, order="random", keys=("image", "label"))
    n = 0
    for images, target in loader:  # what `for images, target in train_loader` needs
        assert images.shape[1:] == (12, 10, 3) and target.dtype == torch.int64
        n += len(target)
    assert n == len(fixed)
    ref = dsc.Loader(fixed, batch_size=8, order="random")
    for (images, labels, index), b in zip(dsc.Loader(fixed, batch_size=8, order="random",
                                                     keys=("image", "label", "index")), ref):
        assert torch.equal(images, b["image"]) and torch.equal(labels, b["label"]) and torch.equal(index, b["index"])
    with pytest.raises(dsc.ConfigError, match="'labels' is not a key.*'label'"):
        next(iter(dsc.Loader(fixed, batch_size=8, keys=("image", "labels"))))
    for bad in ("image", (), ("image", 1)):
        with pytest.raises(dsc.ConfigError, match="keys must be a tuple"):
            dsc.Loader(fixed, batch_size=8, keys=bad)
    with pytest.raises(dsc.ConfigError, match="format"):
        dsc.Loader(fixed, batch_size=8, format="coco")
    with pytest.raises(dsc.ConfigError, match="one of the two"):
        dsc.Loader(fixed, batch_size=8, keys=("image",), format="torchvision")


def check_torchvision_detection(images, targets):
    """What torchvision's detection models take for training (GeneralizedRCNN.forward, RoIHeads.check_targets,
    GeneralizedRCNNTransform.normalize): a list (or a batch) of float (3, H, W) images in [0, 1]; per image a
    dict with float "boxes" (N, 4) xyxy of positive size and int64 "labels" (N,), 0 being the background."""
    assert len(images) == len(targets)
    for img, t in zip(images, targets):
        assert img.dim() == 3 and img.shape[0] == 3 and img.dtype == torch.float32
        assert 0 <= float(img.min()) and float(img.max()) <= 1
        assert t["boxes"].dtype == torch.float32 and t["boxes"].dim() == 2 and t["boxes"].shape[-1] == 4
        assert t["labels"].dtype == torch.int64 and t["labels"].shape == t["boxes"].shape[:1]
        assert (t["boxes"][:, 2:] > t["boxes"][:, :2]).all()
        assert (t["labels"] >= 1).all()  # no object is trained as background
        assert (t["boxes"][:, 2] <= img.shape[2]).all() and (t["boxes"][:, 3] <= img.shape[1]).all()


def test_torchvision_form_detection_ragged(det):
    loader = dsc.Loader(det, batch_size=4, order="random", format="torchvision")
    assert loader.classes == ["__background__", *det.classes]
    sample_of = {int(det[i]["image_id"]): i for i in range(len(det))}
    seen = 0
    for images, targets in loader:  # native sizes: a list of (3, H, W) float tensors
        assert isinstance(images, list)
        check_torchvision_detection(images, targets)
        for img, t in zip(images, targets):
            s = det[sample_of[t["image_id"]]]
            assert torch.equal(img, s["image"].permute(2, 0, 1).float() / 255)
            solid = s["iscrowd"] == 0  # crowd boxes are left out of torchvision's targets (keep_crowd=True keeps them)
            assert torch.equal(t["boxes"], s["boxes"][solid]) and torch.equal(t["labels"], s["labels"][solid] + 1)
            assert [loader.classes[k] for k in t["labels"].tolist()] == [det.classes[k]
                                                                         for k in s["labels"][solid].tolist()]
            seen += 1
    assert seen == len(det)
    padded = dsc.Loader(det, batch_size=4, images="padded", format="torchvision")  # ragged padded: true sizes
    plain = dsc.Loader(det, batch_size=4, format="torchvision")
    for (a, ta), (b, tb) in zip(padded, plain):
        assert all(torch.equal(x, y) for x, y in zip(a, b))
        assert all(torch.equal(x["boxes"], y["boxes"]) for x, y in zip(ta, tb))
    with pytest.raises(dsc.ConfigError, match="drop boxes"):
        dsc.Loader(det, batch_size=4, format="torchvision", boxes="padded")


def test_torchvision_form_detection_fixed_size(det):
    """A training size: one stacked (B, 3, H, W) float tensor; boxes through the crop, as in the dict form."""
    ops = [T.Letterbox(48), T.RandomHorizontalFlip()]
    tv = dsc.Loader(det, batch_size=4, order="random", seed=2, transforms=ops, format="torchvision")
    ref = dsc.Loader(det, batch_size=4, order="random", seed=2, transforms=ops, boxes="list")
    for (images, targets), b in zip(tv, ref):
        assert images.shape == (len(targets), 3, 48, 48)
        check_torchvision_detection(images, targets)
        assert torch.equal(images, b["image"].permute(0, 3, 1, 2).float() / 255)
        for t, r in zip(targets, b["targets"]):
            solid = r["iscrowd"] == 0  # crowd boxes are left out of torchvision's targets
            assert torch.equal(t["boxes"], r["boxes"][solid]) and torch.equal(t["labels"], r["labels"][solid] + 1)
    normalized = dsc.Loader(det, batch_size=4, transforms=[T.Letterbox(48), T.ToFloat(), T.Normalize([0.5] * 3,
                                                                                                     [0.5] * 3)],
                            format="torchvision")
    images, _ = next(iter(normalized))  # float already: handed over as the transforms made it
    assert images.dtype == torch.float32 and float(images.min()) < 0


def box_class_pixels(mask: torch.Tensor, box, value) -> np.ndarray:
    """What "masks" must hold for one box: the pixels of ``value`` in ``mask`` whose squares meet the box."""
    want = np.zeros(mask.shape, np.uint8)
    x0, y0, x1, y1 = int(np.floor(box[0])), int(np.floor(box[1])), int(np.ceil(box[2])), int(np.ceil(box[3]))
    if box[2] > box[0] and box[3] > box[1]:
        want[y0:y1, x0:x1] = mask.numpy()[y0:y1, x0:x1] == value
    return want


def test_torchvision_form_detection_with_masks(tmp_path, monkeypatch):
    """VOC with boxes and masks: each target dict carries its semantic mask under "mask", and a box's 1-based
    label is the mask value inside it (both count 0 as the background); "masks" (k, H, W) uint8 has, per box,
    the pixels of its class inside it, as torchvision's Mask R-CNN takes them."""
    root = write_voc_segmentation(tmp_path / "voc", detection_scenes(6, seed=4))
    dsc.compile_voc(root, tmp_path / "out", split="train", masks=True, max_side=80, progress=False)
    ds = dsc.open(tmp_path / "out")
    loader = dsc.Loader(ds, batch_size=3, format="torchvision")
    assert loader.classes == ["__background__", *VOC_CLASSES]
    k = 0
    for images, targets in loader:
        check_torchvision_detection(images, targets)
        for img, t in zip(images, targets):
            assert t["mask"].dtype == torch.int64 and torch.equal(t["mask"], ds[k]["mask"].long())
            h, w = t["mask"].shape
            assert t["masks"].dtype == torch.uint8 and t["masks"].shape == (len(t["boxes"]), h, w)
            for j, (box, lab) in enumerate(zip(t["boxes"].tolist(), t["labels"].tolist())):
                cx, cy = int((box[0] + box[2]) / 2), int((box[1] + box[3]) / 2)
                assert int(t["mask"][cy, cx]) == lab and loader.classes[lab] == ds.mask_classes[lab]
                want = box_class_pixels(t["mask"], box, lab)
                assert np.array_equal(t["masks"][j].numpy(), want) and want.any()
            k += 1
    assert k == len(ds)
    cropped = dsc.Loader(ds, batch_size=3, format="torchvision", transforms=[T.RandomResizedCrop(40)], seed=3)
    filled = 0
    for images, targets in cropped:  # after a crop: the masks follow the boxes and the mask
        for t in targets:
            assert t["masks"].shape == (len(t["boxes"]), 40, 40)
            for j, (box, lab) in enumerate(zip(t["boxes"].tolist(), t["labels"].tolist())):
                assert np.array_equal(t["masks"][j].numpy(), box_class_pixels(t["mask"], box, lab))
                filled += bool(t["masks"][j].any())
    assert filled
    monkeypatch.setattr(type(ds), "mask_classes", property(lambda self: ["background", "something else"]))
    with pytest.warns(UserWarning, match='no per-box "masks": the mask\'s classes do not name box class'):
        loader = dsc.Loader(ds, batch_size=3, format="torchvision")
    _, targets = next(iter(loader))
    assert "masks" not in targets[0] and "mask" in targets[0]


def test_per_box_masks_find_each_class_value():
    """Which mask value is a box's class: dsc's sources' rules (label + 1; COCO's category ids as they are),
    a category named "background" included, else unique names; else no "masks" (and the Loader says why)."""
    from dsc.runtime.batches import instance_masks, mask_values_of_labels

    def values(*a):
        v, why = mask_values_of_labels(*a)
        return v.tolist() if v is not None else why

    assert values(["background", "dog"], ["background", "background", "dog"]) == [-1, 1, 2]
    assert values(["", "", "cat"], ["background", "", "cat"], True) == [-1, -1, 1, 2]
    assert values(["cat", "dog"], []) == [-1, 1, 2]  # unnamed mask values: the sources' rule
    assert values(["dog", "cat"], ["bg", "cat", "dog"]) == [-1, 2, 1]
    assert "do not name box class 'a' exactly once" in values(["a", "b"], ["background", "b"])
    assert "exactly once" in values(["a", "b"], ["x", "b", "a", "a"])
    ones = torch.ones(4, 5, dtype=torch.int64)
    assert instance_masks(ones, torch.tensor([[2.5, 1.0, 2.5, 3.0]]), torch.tensor([1])).sum() == 0  # no area
    assert instance_masks(ones, torch.tensor([[0.5, 0.5, 1.5, 1.0]]), torch.tensor([1]))[0].nonzero().tolist() == \
        [[0, 0], [0, 1]]
    assert instance_masks(ones, torch.zeros(0, 4), torch.zeros(0, dtype=torch.int64)).shape == (0, 4, 5)


@pytest.fixture(scope="module")
def voc_seg(tmp_path_factory):
    """A segmentation-only VOC-style set: JPEGImages, SegmentationClass, ImageSets/Segmentation; no XML."""
    root = write_voc_segmentation(tmp_path_factory.mktemp("vocseg") / "voc", detection_scenes(8, seed=5, ext=".jpg"))
    shutil.rmtree(root / "Annotations")
    return root


def test_voc_segmentation_only_compiles_as_segmentation(voc_seg, tmp_path):
    r = dsc.compile_voc(voc_seg, tmp_path / "out", split="train", masks=True, max_side=64, progress=False)
    assert r.manifest.task == "segmentation" and not r.warnings
    ds = dsc.open(tmp_path / "out")
    assert ds.classes == ["background", *VOC_CLASSES] == ds.mask_classes
    assert set(ds[0]) == {"image", "mask"}
    assert set(ds.get_batch([0, 1])) == {"image", "image_offsets", "image_shapes", "mask", "mask_offsets",
                                         "mask_shapes", "index"}
    # with one XML the split is still a detection set, and the warning counts the images without one
    mixed = tmp_path / "mixed"
    shutil.copytree(voc_seg, mixed)
    (mixed / "Annotations").mkdir()
    first = (mixed / "ImageSets/Segmentation/train.txt").read_text().split()[0]
    (mixed / "Annotations" / f"{first}.xml").write_text(
        "<annotation><object><name>cat</name><bndbox><xmin>2</xmin><ymin>2</ymin><xmax>9</xmax><ymax>9</ymax>"
        "</bndbox></object></annotation>")
    r = dsc.compile_voc(mixed, tmp_path / "mixed_out", split="train", masks=True, size=32, progress=False)
    assert r.manifest.task == "detection" and r.warnings == ("7 images of split 'train' have no annotation XML and "
                                                             "are kept without boxes",)


def test_torchvision_form_segmentation(voc_seg, tmp_path):
    dsc.compile_voc(voc_seg, tmp_path / "seg", split="train", masks=True, max_side=64, progress=False)
    ds = dsc.open(tmp_path / "seg")
    ops = [T.RandomResizedCrop(32), T.RandomHorizontalFlip(), T.ToFloat(), T.Normalize([0.5] * 3, [0.25] * 3)]
    tv = dsc.Loader(ds, batch_size=3, order="random", seed=1, transforms=ops, format="torchvision")
    ref = dsc.Loader(ds, batch_size=3, order="random", seed=1, transforms=ops)
    for (images, masks), b in zip(tv, ref):  # what CrossEntropyLoss(ignore_index=ds.ignore_index) takes
        assert images.shape == (len(masks), 3, 32, 32) and torch.equal(images, b["image"])
        assert masks.dtype == torch.int64 and masks.shape == (len(masks), 32, 32)
        assert torch.equal(masks, b["mask"].long())
        values = set(masks.unique().tolist())
        assert values <= set(range(len(ds.mask_classes))) | {ds.ignore_index} and values - {0, ds.ignore_index}
    images, masks = next(iter(dsc.Loader(ds, batch_size=3, format="torchvision")))  # native sizes: lists
    for k, (img, m) in enumerate(zip(images, masks)):
        assert img.shape[1:] == m.shape and torch.equal(m, ds[k]["mask"].long())
    # segfolder and classification take the same form
    write_segfolder(tmp_path / "sf", seg_scenes(4, seed=1))
    dsc.compile_segfolder(tmp_path / "sf", tmp_path / "sfo", size=(16, 16), progress=False)
    images, masks = next(iter(dsc.Loader(dsc.open(tmp_path / "sfo"), batch_size=4, format="torchvision")))
    assert images.shape == (4, 3, 16, 16) and masks.shape == (4, 16, 16) and masks.dtype == torch.int64


def test_torchvision_form_classification(fixed):
    tv, ref = dsc.Loader(fixed, batch_size=8, format="torchvision"), dsc.Loader(fixed, batch_size=8)
    for (images, labels), b in zip(tv, ref):
        assert images.shape == (len(labels), 3, 12, 10) and images.dtype == torch.float32
        assert torch.equal(images, b["image"].permute(0, 3, 1, 2).float() / 255) and torch.equal(labels, b["label"])


# ----------------------------------------------------------------------------------- threads, sampler
def test_num_threads_zero_makes_batches_in_the_calling_thread(fixed):
    where = []

    def record(batch, gen):
        where.append(threading.current_thread())
        return batch

    zero = dsc.Loader(fixed, batch_size=8, order="random", num_threads=0, transforms=[*RECIPE, record])
    two = dsc.Loader(fixed, batch_size=8, order="random", num_threads=2, transforms=[*RECIPE, record])
    a = snapshot(zero)
    assert set(where) == {threading.current_thread()}
    where.clear()
    assert same(a, snapshot(two)) and threading.current_thread() not in where
    with pytest.raises(dsc.ConfigError, match="num_threads must be an int >= 0"):
        dsc.Loader(fixed, batch_size=8, num_threads=-1)


def test_sampler_as_scripts_use_it(fixed):
    loader = dsc.Loader(fixed, batch_size=5, order="random", seed=2, rank=1, world_size=3)
    assert len(loader.sampler) == 12 == loader.samples_per_rank()
    loader.sampler.set_epoch(3)  # what `train_loader.sampler.set_epoch(epoch)` does in a DDP script
    assert list(loader.sampler) == loader.epoch_order(3).tolist()
    assert torch.equal(torch.cat([b["index"] for b in loader]).sort().values,
                       torch.from_numpy(np.sort(loader.epoch_order(3))))


# ----------------------------------------------------------------------------------- subsets
@pytest.mark.parametrize("order", ["sequential", "random", "quasi_random"])
def test_a_subset_loads_exactly_its_samples(fixed, order):
    train, val = torch.utils.data.random_split(fixed, [24, 12], generator=torch.Generator().manual_seed(0))
    for sub in (train, val):
        want = sorted(sub.indices)
        for world_size in (1, 2, 3):
            for tail in ("pad", "drop"):
                parts = []
                for rank in range(world_size):
                    loader = dsc.Loader(sub, batch_size=5, order=order, seed=1, window=2, rank=rank,
                                        world_size=world_size, tail=tail)
                    for e in range(2):
                        got = [b for b in loader]
                        for b in got:  # the bytes of the samples it names
                            assert torch.equal(b["image"], fixed.get_batch(b["index"].numpy())["image"])
                        if e == 0:
                            parts.append(torch.cat([b["index"] for b in got]).tolist())
                assert len({len(p) for p in parts}) == 1
                served = [i for p in parts for i in p]
                if tail == "drop":
                    assert len(served) == len(set(served)) == len(want) // world_size * world_size
                    assert set(served) <= set(want)
                else:
                    assert sorted(set(served)) == want
    # indices= is the same as a Subset; nested Subsets compose; a resume refuses other samples
    a = dsc.Loader(fixed, batch_size=5, order=order, indices=train.indices)
    b = dsc.Loader(train, batch_size=5, order=order)
    assert np.array_equal(a.epoch_order(1), b.epoch_order(1))
    nested = torch.utils.data.Subset(train, [0, 1, 2])
    assert sorted(dsc.Loader(nested, batch_size=2).epoch_order().tolist()) == sorted(train.indices[:3])
    assert dsc.Loader(nested, batch_size=2, indices=[2]).epoch_order().tolist() == [train.indices[2]]
    b.load_state_dict(a.state_dict())
    with pytest.raises(dsc.ConfigError, match="other samples"):
        dsc.Loader(val, batch_size=5, order=order).load_state_dict(
            dsc.Loader(fixed, batch_size=5, order=order, indices=val.indices[::-1]).state_dict())


def test_a_sequential_subset_keeps_its_order(fixed):
    loader = dsc.Loader(torch.utils.data.Subset(fixed, [30, 2, 17, 5]), batch_size=2)
    assert loader.epoch_order().tolist() == [30, 2, 17, 5]
    assert [b["index"].tolist() for b in loader] == [[2, 30], [5, 17]]  # each batch in storage order


def test_bad_indices(fixed):
    for bad, match in (([], "selects no sample"), ([0, 36], "36, outside the 36"), ([0.5], "ints"),
                       ([[0, 1]], "1-D")):
        with pytest.raises(dsc.ConfigError, match=match):
            dsc.Loader(fixed, batch_size=2, indices=bad)
    assert dsc.Loader(fixed, batch_size=2, indices=torch.tensor([-1])).epoch_order().tolist() == [35]


@pytest.mark.parametrize("order", ["sequential", "quasi_random", "random"])
def test_an_index_listed_twice_is_served_twice(fixed, order):
    from collections import Counter

    served = Counter(i for b in dsc.Loader(fixed, batch_size=3, order=order, indices=[1, 1, 2, -1, 5, 5, 5])
                     for i in b["index"].tolist())
    assert served == {1: 2, 2: 1, 35: 1, 5: 3}


class FakeData(torch.utils.data.Dataset):
    """Like torchvision.datasets.FakeData: (PIL image, label) made on the fly."""

    def __len__(self):
        return 4

    def __getitem__(self, i):
        from PIL import Image

        return Image.new("RGB", (8, 8), (i, i, i)), i % 2


def test_what_is_not_compiled_is_refused_naming_the_fix(fixed, tmp_path):
    for obj in (FakeData(), torch.utils.data.Subset(FakeData(), [0, 1]), [1, 2], torch.zeros(3)):
        for make in (lambda o: dsc.Loader(o, batch_size=2), dsc.open):
            with pytest.raises(dsc.ConfigError, match=r"(?i)compile it first with dsc\.compile\(dataset, 'OUT'\)") as e:
                make(obj)
            assert type(obj).__name__ in str(e.value) or "Subset of" in str(e.value)
    # the fix works: compile it, then load it
    dsc.compile(FakeData(), tmp_path / "fake", progress=False)
    assert len(list(dsc.Loader(tmp_path / "fake", batch_size=2, keys=("image", "label")))) == 2


# ----------------------------------------------------------------------------------- examples
def test_examples_parse_and_their_tiny_data_compiles(tmp_path):
    """The examples need torchvision to run (see examples/README.md); here: they parse, make_tiny.py writes
    its data, and the compile commands of the README give the datasets the examples read."""
    import py_compile
    import runpy
    from pathlib import Path

    examples = Path(__file__).resolve().parent.parent / "examples"
    scripts = sorted(examples.rglob("*.py"))
    assert {p.name for p in scripts} >= {"main.py", "detection.py", "segmentation.py", "make_tiny.py"}
    for p in scripts:
        py_compile.compile(str(p), cfile=str(tmp_path / "x.pyc"), doraise=True)
    runpy.run_path(str(examples / "make_tiny.py"), run_name="make_tiny")["main"](str(tmp_path / "tiny"))
    tiny, out = tmp_path / "tiny", tmp_path / "tiny-dsc"
    dsc.compile_imagefolder(tiny / "imagenet/val", out / "val", size=256, resize="center-crop", progress=False)
    r = dsc.compile_voc(tiny / "voc", out / "voc", split="train", masks=True, progress=False)
    assert r.manifest.task == "segmentation" and not r.warnings
    val = dsc.Loader(dsc.open(out / "val"), batch_size=8, tail="drop", keys=("image", "label"),
                     transforms=[T.CenterCrop(224), T.ToFloat()])
    images, target = next(iter(val))
    assert images.shape == (8, 3, 224, 224) and target.shape == (8,)
