"""format="torchvision" builds its float images and per-object masks batch-wide (issue 30's speed goal): the
tensors equal the per-image / per-target construction they replace (``_chw_float``, ``object_masks``), also
when the Loader's ring reuses its mask buffers epoch after epoch, and targets the user keeps are never
overwritten by later batches."""
import numpy as np
import pytest
import torch

import dsc
from dsc import transforms as T
from dsc.runtime.batches import CAST_KEY, _chw_float, object_masks, sample_pixels
from dsc.synthetic import write_coco_instances
from torch_calls import TorchCalls as _TorchCalls  # noqa: E402

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
    """Packed uint8 images (where the gather did not cast them: a Mixture, a transform after the gather) are
    cast and divided in cache-sized pieces; pieces that split images anywhere (777 bytes) give the same
    floats."""
    import dsc.runtime.batches as B

    monkeypatch.setattr(B, "_CAST_CHUNK", 777)
    n = 0
    for batch in dsc.Loader(ds, batch_size=3, num_threads=0, transforms=[T.RandomHorizontalFlip(0.5)]):
        assert batch["image"].dtype == torch.uint8 and batch["image"].numel() > 3 * 777
        for img, ref in zip(B._packed_chw_floats(dict(batch)), _reference(batch)[0]):
            assert torch.equal(img, ref)
            n += 1
    assert n == len(ds)


@pytest.mark.parametrize("transforms", [None, [T.RandomHorizontalFlip(0.5)], [T.RandomVerticalFlip(0.5)],
                                        [T.RandomHorizontalFlip(0.5), T.RandomVerticalFlip(0.5)]])
def test_the_gather_casts_the_images_the_torchvision_form_takes_straight(ds, transforms):
    """A batch that goes from the gather straight to format="torchvision" on the CPU has its images cast to
    float32 as they are gathered (flipped on the way where drawn): no uint8 batch and no second float buffer
    in the ring, and the images equal the per-image construction (values and channels-last strides) at 0, 1
    and 2 threads, and after a resume mid-epoch."""
    kw = dict(batch_size=2, order="random", seed=4, transforms=transforms)
    want = [([x.clone() for x in images], [t["index"] for t in targets])
            for images, targets in dsc.Loader(ds, format="torchvision", num_threads=0, **kw)]
    refs = []
    for batch in dsc.Loader(ds, num_threads=0, **kw):
        refs.append([hwc.permute(2, 0, 1).to(torch.float32) / 255 for hwc in sample_pixels(batch, "image")])
    assert len(want) == len(refs) == 3
    for (images, _), ref in zip(want, refs):
        assert all(torch.equal(a, b) and a.stride() == b.stride() for a, b in zip(images, ref))
    for threads in (1, 2):
        loader = dsc.Loader(ds, format="torchvision", num_threads=threads, **kw)
        got = [[x.clone() for x in images] for images, _ in loader]
        assert all(torch.equal(a, b) for g, w in zip(got, want) for a, b in zip(g, w[0]))
        slot = next(s for s in loader._ring.slots if "image" in s)
        assert slot["image"].dtype == torch.float32 and "torchvision_image" not in slot
    first = dsc.Loader(ds, format="torchvision", num_threads=2, **kw)
    it = iter(first)
    next(it)
    state = first.state_dict()
    del it, first
    second = dsc.Loader(ds, format="torchvision", num_threads=1, **kw)
    second.load_state_dict(state)
    rest = [[x.clone() for x in images] for images, _ in second]
    assert len(rest) == 2 and all(torch.equal(a, b) for g, w in zip(rest, want[1:]) for a, b in zip(g, w[0]))


def test_a_float_image_a_users_op_made_is_not_taken_for_the_gathers_cast(ds, tmp_path):
    """Only the gather's mark (batches.CAST_KEY) says a packed float32 image is cast already: a user's op that
    makes float images of its own, (C, H, W) and packed, gets them back as the per-image path makes them
    (not read as channels-last, which scrambled them), and a float (H, W, C) one keeps main's shape; the mark
    is never handed out."""
    def chw_float(b, **kw):
        o, shp = b["image_offsets"].tolist(), b["image_shapes"].tolist()
        parts = [b["image"][o[k]:o[k + 1]].view(shp[k]).permute(2, 0, 1).float().div(255) for k in range(len(shp))]
        b["image"] = torch.cat([p.reshape(-1) for p in parts])
        b["image_shapes"] = torch.tensor([p.shape for p in parts], dtype=torch.int32)
        return b

    def hwc_float(b, **kw):
        b["image"] = b["image"].to(torch.float32) / 255
        return b

    rng = np.random.default_rng(1)
    items = [(rng.integers(0, 256, (int(rng.integers(20, 50)), int(rng.integers(20, 50)), 3), dtype=np.uint8), i % 3)
             for i in range(7)]
    dsc.compile(items, tmp_path / "cls", classes=["a", "b", "c"], progress=False, workers=1)
    cls = dsc.open(tmp_path / "cls")  # (mixed sizes, no targets but the labels)
    for threads in (0, 2):
        plain = dsc.Loader(cls, batch_size=2, num_threads=threads, transforms=chw_float)
        refs = [[x.clone() for x in sample_pixels(b, "image")] for b in plain]
        got = [[x.clone() for x in images]
               for images, _ in dsc.Loader(cls, batch_size=2, num_threads=threads, transforms=chw_float,
                                           format="torchvision")]
        assert all(a.shape == r.shape and torch.equal(a, r) for g, rs in zip(got, refs) for a, r in zip(g, rs))
        images, _ = next(iter(dsc.Loader(ds, batch_size=2, num_threads=threads,
                                         transforms=T.Compose([T.RandomHorizontalFlip(0.5), hwc_float]),
                                         format="torchvision")))
        assert images[0].dim() == 3 and images[0].shape[-1] == 3  # (H, W, C) as the user's op made it
    batch = next(iter(dsc.Loader(ds, batch_size=2, num_threads=0)))
    assert CAST_KEY not in batch
    _, targets = next(iter(dsc.Loader(ds, batch_size=2, num_threads=0, format="torchvision")))
    assert all(CAST_KEY not in t for t in targets)



def test_the_torchvision_form_makes_its_views_per_sample_and_unpacks_masks_per_sample(ds, monkeypatch):
    """Calls a batch, not an object's or three an image: each image's (C, H, W) view and each sample's
    (k, H, W) masks view are one torch call each (were a slice, view and movedim, and a slice and view), the
    gather unpacks a sample's mask bits with one ``unpackbits`` (was one per object); counted on batches of
    1 and 6 samples, so what grows with the samples is per sample."""
    import numpy as np

    import dsc.formats.fields.object_masks as OM
    from dsc import nogil
    from dsc.runtime.batches import torchvision_form

    if not nogil.ENABLED:  # (the views and masks are made by scripted kernels: test_instances_nogil.py)
        pytest.skip("DSC_NOGIL=0: the kernels run as plain Python, each op a call")

    unpacks = []
    real = np.unpackbits
    monkeypatch.setattr(OM, "np", type("np", (), {"__getattr__": lambda self, k: getattr(np, k),
                                                  "unpackbits": staticmethod(lambda *a, **k: unpacks.append(1)
                                                                             or real(*a, **k))})())
    calls, objects = {}, {}
    for b in (1, 6):
        loader = dsc.Loader(ds, batch_size=b, num_threads=0, transforms=[T.RandomHorizontalFlip(1.0)])
        unpacks.clear()
        batch = next(iter(loader))
        assert len(unpacks) <= b < int(batch["box_offsets"][-1])  # (more objects than samples)
        objects[b] = int((batch["iscrowd"] == 0).sum())
        with _TorchCalls() as mode:
            images, targets = torchvision_form(dict(batch), ds.schema)
        calls[b] = mode.calls
        assert len(images) == len(targets) == b and sum(len(t["masks"]) for t in targets) == objects[b]
    # per sample: the image's view and the masks' view
    assert objects[6] > objects[1] and calls[6] - calls[1] <= 2 * 5


def test_unpack_finds_its_runs_once_not_per_object():
    """``object_masks.unpack`` finds where the back-to-back runs of mask bits start and end by one numpy
    comparison, before its loop; the per-object loop only copies each crop (main rediscovered each run's end
    inside it: ~8 Python lines an object against 5). Counted as the lines it runs on 40 masks in 3 runs, and
    the crops equal each mask's own unpacking."""
    import sys

    import numpy as np

    from dsc.formats.fields.object_masks import encode, unpack

    rng = np.random.default_rng(0)
    masks = [rng.random((rng.integers(3, 9), rng.integers(3, 9))) < 0.5 for _ in range(40)]
    rects, sizes, bits = encode([np.pad(m, 1) for m in masks])
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    rows = np.r_[0:14, 20:40, 14:20]  # three runs of back-to-back bits
    code, lines = unpack.__code__, []

    def trace(frame, event, arg):
        if frame.f_code is code:
            if event == "line":
                lines.append(frame.f_lineno)
            return trace
        return None
    sys.settrace(trace)
    try:
        flat, off = unpack(np.frombuffer(bits, np.uint8), offsets, rects, rows)
    finally:
        sys.settrace(None)
    for k, j in enumerate(rows.tolist()):
        t, l, h, w = rects[j].tolist()
        assert np.array_equal(flat[off[k]:off[k + 1]].reshape(h, w), np.pad(masks[j], 1)[t:t + h, l:l + w])
    assert len(lines) <= 5 * len(rows) + 4 * 3 + 25, len(lines)


def _bits_and_crops(ds, idx, flips=None):
    """The masks reader's gather of samples ``idx`` both ways: packed bits (``object_mask_bits``) and crops."""
    import numpy as np

    reader = ds.readers["masks"]
    rows = np.asarray(idx, np.int64)
    alloc = lambda name, shape, dtype: np.empty(shape, dtype)  # noqa: E731
    forms = {} if flips is None else {"object_flips": flips}
    return (reader.gather(rows, alloc, {**forms, "object_mask_bits": True}), reader.gather(rows, alloc, forms))


def test_the_torchvision_form_unpacks_the_gathered_bits_straight_into_its_masks(ds, monkeypatch):
    """With format="torchvision" and nothing but flips after the gather, the gather leaves each mask as its
    packed bits and the form unpacks them straight into the (k, H, W) masks: the crops are not written into
    the batch first (main wrote every crop twice: unpacked into the batch, then pasted). Counted: the ring's
    ``masks`` buffer holds the bits (about an eighth of the crops' bytes), the gather calls no ``unpack``, and
    the masks equal the per-target construction (crowds left out) with flips of every kind."""
    import dsc.formats.fields.object_masks as OM
    from dsc.runtime.batches import _target_masks

    unpacks = []
    real = OM.unpack
    monkeypatch.setattr(OM, "unpack", lambda *a, **k: unpacks.append(1) or real(*a, **k))
    crop_bytes = int((ds.readers["masks"].rects[:, 2].astype("int64") * ds.readers["masks"].rects[:, 3]).sum())
    bits_bytes = int(ds.readers["masks"].offsets[-1])
    assert 0 < bits_bytes < crop_bytes / 4
    loader = dsc.Loader(ds, batch_size=len(ds), num_threads=0, format="torchvision",
                        transforms=[T.RandomHorizontalFlip(1.0)])
    next(iter(loader))
    assert not unpacks
    held = [slot["masks"].numel() for slot in loader._ring.slots if "masks" in slot]
    assert held and max(held) <= bits_bytes  # (main: the crops, crop_bytes)
    monkeypatch.setattr(OM, "unpack", real)
    rects = ds.readers["masks"].rects
    for fh, fw in ((0, 0), (1, 0), (0, 1), (1, 1)):
        idx = list(range(len(ds)))
        sizes = ds.sample_sizes(idx).numpy()
        flips = [(fh, fw, h, w) for h, w in sizes.tolist()]
        bits, crops = _bits_and_crops(ds, idx, flips)
        assert bits["masks"].nbytes == bits_bytes and crops["masks"].nbytes == crop_bytes and len(rects)
        assert (bits["masks_rects"] == crops["masks_rects"]).all()
        o = ds.readers["masks"].box_offsets[:len(ds) + 1]
        for form in (bits, crops):
            form.update(box_offsets=torch.from_numpy(o.astype("int64")), image_sizes=torch.from_numpy(sizes))
        tb = {k: torch.from_numpy(v) if not torch.is_tensor(v) else v for k, v in bits.items()}
        tc = {k: torch.from_numpy(v) if not torch.is_tensor(v) else v for k, v in crops.items()}
        keep = torch.from_numpy(ds.readers["masks"].rects[:, 2] >= 0)
        keep[::3] = False  # rows left out between kept ones (as crowds are)
        for got, ref in zip(_target_masks(tb, "masks", keep), _target_masks(tc, "masks", keep)):
            assert torch.equal(got, ref)
        OM.crops_of_bits(tb, "masks")  # a step that needs the crops after all gets exactly them
        assert OM.bits_key("masks") not in tb and torch.equal(tb["masks"], tc["masks"])
        assert torch.equal(tb["masks_offsets"], tc["masks_offsets"])


def test_a_field_named_like_the_gathers_mask_bits_is_its_own(tmp_path):
    """The gather's packed mask bits carry their flips under a batch key (and a ring buffer) that no field can
    be named (field names are letters, digits and _): a value field named ``masks_bits`` beside instance
    masks keeps its own values in the torchvision targets, and the masks stay exact (main named both
    ``masks_bits``: the field and the flips shared one key and one ring buffer)."""
    import numpy as np

    rng = np.random.default_rng(3)
    items = []
    for i in range(6):
        h, w = 20 + i, 30 - i
        masks = (rng.random((2, h, w)) < 0.3).astype(np.uint8)
        items.append((rng.integers(0, 255, (h, w, 3), dtype=np.uint8),
                      {"boxes": torch.tensor([[1.0, 1.0, w - 1.0, h - 1.0]] * 2), "labels": torch.tensor([0, 1]),
                       "masks": torch.from_numpy(masks), "masks_bits": np.array([7 + i, 200], np.uint8)}))
    dsc.compile(items, tmp_path / "out", classes=["a", "b"], progress=False, workers=1)
    ds = dsc.open(tmp_path / "out")
    assert "masks_bits" in ds.schema and ds.schema.object_masks() == ["masks"]
    for threads in (0, 2):
        loader = dsc.Loader(ds, batch_size=3, num_threads=threads, format="torchvision",
                            transforms=[T.RandomHorizontalFlip(1.0)])
        n = 0
        for epoch in range(2):
            for _, targets in loader:
                for t in targets:
                    i = int(t["index"])
                    assert t["masks_bits"].tolist() == [7 + i, 200]
                    assert torch.equal(t["masks"], items[i][1]["masks"].flip(-1))
                    n += 1
        assert n == 2 * len(ds)


def test_the_gather_leaves_mask_bits_exactly_where_the_torchvision_form_takes_them_straight(ds):
    """One decision (``Dataset._get_batch``) from one fact the Loader states (``to_torchvision``: its batches go
    from the gather straight to format="torchvision" on the CPU): bits with no transforms or flips only, crops
    where a resize moves the masks, where the dict form is asked for, or where the boxes are not packed."""
    from dsc.formats.fields.object_masks import bits_key

    key = bits_key("masks")

    def gathered_bits(**kw):
        loader = dsc.Loader(ds, batch_size=2, num_threads=0, **kw)
        next(iter(loader))
        return any(key in slot for slot in loader._ring.slots)

    assert gathered_bits(format="torchvision")
    assert gathered_bits(format="torchvision", transforms=[T.RandomHorizontalFlip(1.0)])
    assert gathered_bits(format="torchvision", transforms=T.Compose([T.RandomVerticalFlip(1.0),
                                                                       T.RandomHorizontalFlip(0.5)]))
    assert not gathered_bits(format="torchvision", transforms=[T.Resize((40, 48))])
    assert not gathered_bits(transforms=[T.RandomHorizontalFlip(1.0)])
    assert key in ds.get_batch([0, 1], to_torchvision=True)
    assert key not in ds.get_batch([0, 1], boxes="padded", to_torchvision=True)
    assert key not in ds.get_batch([0, 1])


def test_a_field_named_like_the_masks_rects_is_refused_at_compile(tmp_path):
    """The object masks' crop rectangles are the batch key ``masks_rects`` (a documented key): a value field of
    that name beside instance masks would share it (main compiled it, and the torchvision form then failed on the
    field's values as rects). The compile refuses it in one line naming the field and the fix."""
    import numpy as np

    from dsc.errors import SourceError

    target = {"boxes": torch.tensor([[1.0, 1.0, 6.0, 6.0]]), "labels": torch.tensor([0]),
              "masks": torch.ones((1, 8, 8), dtype=torch.uint8), "masks_rects": np.array([7, 200], np.uint8)}
    items = [(np.zeros((8, 8, 3), np.uint8), target)] * 2
    with pytest.raises(SourceError, match="field 'masks_rects'.*rename it"):
        dsc.compile(items, tmp_path / "out", classes=["a"], progress=False, workers=1)
    without_masks = [(img, {k: v for k, v in t.items() if k != "masks"}) for img, t in items]
    dsc.compile(without_masks, tmp_path / "ok", classes=["a"], progress=False, workers=1)  # (no masks: its own key)
    assert "masks_rects" in dsc.open(tmp_path / "ok").schema


def test_a_dataset_an_older_dsc_compiled_with_a_field_named_like_the_masks_rects_is_refused_at_open(tmp_path,
                                                                                                  monkeypatch):
    """An older dsc compiled a value field ``masks_rects`` beside instance masks: opened, its values would be read
    as the masks' crop rectangles. The open refuses it, naming the field and the fix."""
    import numpy as np

    from dsc.errors import CorruptDatasetError
    from dsc.formats.fields import object_masks

    target = {"boxes": torch.tensor([[1.0, 1.0, 6.0, 6.0]]), "labels": torch.tensor([0]),
              "masks": torch.ones((1, 8, 8), dtype=torch.uint8), "masks_rects": np.array([7, 200], np.uint8)}
    items = [(np.zeros((8, 8, 3), np.uint8), target)] * 2
    with monkeypatch.context() as mp:  # (the older dsc: no rects key taken, at compile nor at open)
        mp.setattr(object_masks.ObjectMasksField, "batch_keys_of", classmethod(lambda cls, name: (name,)))
        dsc.compile(items, tmp_path / "old", classes=["a"], progress=False, workers=1)
    with pytest.raises(CorruptDatasetError, match="field 'masks_rects'.*recompile"):
        dsc.open(tmp_path / "old")
