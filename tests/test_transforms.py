"""dsc.transforms against references: exact where no resampling is involved, within 1 level of
bilinear references where there is; boxes keep framing their shapes; RandomResizedCrop's statistics;
same seed -> same augmentation, also after a resume."""
import math

import numpy as np
import pytest
import torch
from PIL import Image

import dsc
from dsc import transforms as T
from dsc.synthetic import detection_scenes, write_coco

from dsc.formats.fields import Role, Schema
from reference import aa_resize


@pytest.fixture(scope="module")
def fixed(scenes_compiled):
    return scenes_compiled(size=(48, 64), resize="stretch")


@pytest.fixture(scope="module")
def det(tmp_path_factory):
    root = tmp_path_factory.mktemp("tfdet")
    scenes = detection_scenes(12, seed=9, size_range=(80, 160))
    ann, images = write_coco(root / "coco", scenes)
    dsc.compile_coco(ann, images, root / "ragged", progress=False)  # ragged, stored as decoded
    return dsc.open(root / "ragged"), scenes


def interp_ref(img_bhwc, size):
    """The independent antialiased bilinear reference (tests/reference.py, exact float math), per sample."""
    return torch.stack([torch.from_numpy(aa_resize(x.numpy(), *size, round_between=False)) for x in img_bhwc])


def test_identity_crop_and_resize_return_the_input_exactly(fixed):
    b = fixed.get_batch(range(10))
    ident = T.Compose([T.RandomResizedCrop((48, 64), scale=(1.0, 1.0), ratio=(64 / 48, 64 / 48))])(b)
    assert torch.equal(ident["image"], b["image"])
    assert torch.equal(T.Compose([T.Resize((48, 64))])(b)["image"], b["image"])


def test_flips_are_exact(fixed):
    b = fixed.get_batch(range(10))
    assert torch.equal(T.Compose([T.RandomHorizontalFlip(p=1.0)])(b)["image"], b["image"].flip(2))
    assert torch.equal(T.Compose([T.RandomVerticalFlip(p=1.0)])(b)["image"], b["image"].flip(1))
    half = T.Compose([T.RandomHorizontalFlip(p=0.5)])(b, seed=1)["image"]
    flipped = [torch.equal(half[k], b["image"][k].flip(1)) for k in range(10)]
    kept = [torch.equal(half[k], b["image"][k]) for k in range(10)]
    assert all(f or k for f, k in zip(flipped, kept)) and any(flipped) and any(kept)


def test_center_crop_is_slicing(fixed):
    b = fixed.get_batch(range(6))
    out = T.Compose([T.CenterCrop((20, 30))])(b)["image"]
    top, left = round((48 - 20) / 2), round((64 - 30) / 2)
    assert torch.equal(out, b["image"][:, top:top + 20, left:left + 30])
    big = T.Compose([T.CenterCrop((60, 64))])(b)["image"]  # larger than the image: zero padded
    assert torch.equal(big[:, 6:54], b["image"]) and (big[:, :6] == 0).all() and (big[:, 54:] == 0).all()
    odd = T.Compose([T.CenterCrop((51, 64))])(b)["image"]  # torchvision pads (51 - 48) // 2 = 1 on top
    assert torch.equal(odd[:, 1:49], b["image"]) and (odd[:, :1] == 0).all() and (odd[:, 49:] == 0).all()


@pytest.mark.parametrize("size", [(24, 40), (96, 100), (48, 20)])
def test_resize_matches_bilinear_reference(fixed, size):
    b = fixed.get_batch(range(6))
    out = T.Compose([T.Resize(size)])(b)["image"]
    assert (out.int() - interp_ref(b["image"], size).int()).abs().max() <= 1
    if size[0] >= 48 and size[1] >= 64:  # upscaling: PIL's bilinear is the same filter
        for k in range(6):
            pil = np.asarray(Image.fromarray(b["image"][k].numpy()).resize(size[::-1], Image.Resampling.BILINEAR))
            assert np.abs(out[k].numpy().astype(int) - pil.astype(int)).max() <= 1


def test_letterbox_matches_reference_on_ragged_batches(det):
    ds, _ = det
    idx = list(range(8))
    b = ds.get_batch(idx)  # packed ragged images
    out = T.Compose([T.Letterbox(96, fill=114)])(b)
    assert out["image"].shape == (8, 96, 96, 3)
    for k, i in enumerate(idx):
        img = ds[i]["image"]
        h, w = img.shape[:2]
        s = min(96 / h, 96 / w)
        nh, nw = (round(h * 96 / w), 96) if 96 / w <= 96 / h else (96, round(w * 96 / h))
        ref = torch.full((96, 96, 3), 114, dtype=torch.uint8)
        top, left = (96 - nh) // 2, (96 - nw) // 2
        ref[top:top + nh, left:left + nw] = interp_ref(img[None], (nh, nw))[0]
        assert (out["image"][k].int() - ref.int()).abs().max() <= 1, (i, s)
    # padded ragged batches give the same result
    padded = T.Compose([T.Letterbox(96, fill=114)])(ds.get_batch(idx, images="padded"))
    assert torch.equal(padded["image"], out["image"])


@pytest.mark.parametrize("chain", [
    [T.Letterbox(128, fill=0), T.RandomHorizontalFlip(), T.RandomVerticalFlip()],
    [T.RandomResizedCrop(112, scale=(0.3, 1.0)), T.RandomHorizontalFlip()],
    [T.Resize(100), T.CenterCrop(90), T.RandomHorizontalFlip(p=1.0)],
], ids=["letterbox-flips", "rrc-flip", "resize-crop-flip"])
def test_boxes_follow_every_chain(det, chain):
    """After the chain, every box still frames its drawn shape: inside a box the pixels are the shape's
    colour, and every pixel of a shape's colour lies inside a box of that shape."""
    ds, scenes = det
    idx = list(range(len(ds)))
    inside_checked = covered_checked = 0
    for seed in range(3):
        out = T.Compose(chain)(ds.get_batch(idx), seed=seed)
        o = out["box_offsets"].tolist()
        assert out["boxes"].shape[0] == o[-1] == len(out["labels"]) == len(out["iscrowd"])
        H, W = out["image"].shape[1:3]
        for k, i in enumerate(idx):
            img = out["image"][k].numpy().astype(int)
            boxes = out["boxes"][o[k]:o[k + 1]].numpy()
            assert (boxes[:, [0, 2]] >= 0).all() and (boxes[:, [0, 2]] <= W).all()
            assert (boxes[:, [1, 3]] >= 0).all() and (boxes[:, [1, 3]] <= H).all()
            assert (boxes[:, 2] > boxes[:, 0]).all() and (boxes[:, 3] > boxes[:, 1]).all()
            box_colour = []
            for x0, y0, x1, y1 in boxes:
                if x1 - x0 >= 6 and y1 - y0 >= 6:
                    inner = img[int(math.ceil(y0)) + 2:int(y1) - 2, int(math.ceil(x0)) + 2:int(x1) - 2].reshape(-1, 3)
                    colour = inner[0]
                    assert np.abs(inner - colour).max() <= 4, "a box interior is not one shape"
                    assert any(np.abs(colour - np.array(c)).max() <= 4 for c in scenes[i]["colors"])
                    box_colour.append(colour)
                    inside_checked += 1
                else:
                    box_colour.append(None)
            for c in scenes[i]["colors"]:
                ys, xs = np.nonzero(np.abs(img - np.array(c)).max(2) <= 2)
                if len(ys) == 0:
                    continue  # cropped away
                ok = np.zeros(len(ys), bool)
                for (x0, y0, x1, y1) in boxes:
                    ok |= (xs + 0.5 >= x0 - 1) & (xs + 0.5 <= x1 + 1) & (ys + 0.5 >= y0 - 1) & (ys + 0.5 <= y1 + 1)
                assert ok.all(), "a drawn shape lies outside every box"
                covered_checked += 1
    assert inside_checked > 10 and covered_checked > 10


def test_degenerate_boxes_are_dropped_and_offsets_rewritten():
    batch = {"image": torch.zeros((2, 10, 10, 3), dtype=torch.uint8),
             "boxes": torch.tensor([[0, 0, 2, 2], [8, 8, 10, 10], [1, 1, 9, 9]], dtype=torch.float32),
             "labels": torch.tensor([1, 2, 3]), "box_offsets": torch.tensor([0, 2, 3])}
    with pytest.raises(dsc.ConfigError, match="no schema"):  # a plain dict: which keys are box rows is not guessed
        T.Compose([T.CenterCrop(4)])(dict(batch))
    schema = Schema(image=Role("pixels"), boxes=Role("boxes"), labels=Role("box_rows"))
    out = T.Compose([T.CenterCrop(4)])(batch, schema=schema)  # keeps [3, 7): the corner boxes vanish
    assert out["box_offsets"].tolist() == [0, 0, 1]
    assert out["labels"].tolist() == [3] and out["boxes"].tolist() == [[0, 0, 4, 4]]
    # a dsc batch moved with Batch.to keeps its schema: every per-box column is filtered with the boxes
    b = dsc.Batch(batch, schema=schema).to("cpu")
    assert b.schema is schema and T.Compose([T.CenterCrop(4)])(b)["labels"].tolist() == [3]


def test_random_resized_crop_statistics():
    rrc = T.RandomResizedCrop(32, scale=(0.1, 0.5), ratio=(3 / 4, 4 / 3))
    sizes = torch.tensor([[400, 400]]).expand(20000, 2)
    top, left, ch, cw = rrc.params(sizes, torch.Generator().manual_seed(0))
    area = (ch * cw / 160000).numpy()
    logr = torch.log(cw / ch).numpy()
    # area fraction ~ U(0.1, 0.5) and log aspect ~ U(log 3/4, log 4/3), up to rounding to whole pixels
    assert np.allclose(np.quantile(area, [0.1, 0.25, 0.5, 0.75, 0.9]), 0.1 + 0.4 * np.array([0.1, 0.25, 0.5, 0.75, 0.9]),
                       atol=0.01)
    lo, hi = math.log(3 / 4), math.log(4 / 3)
    assert np.allclose(np.quantile(logr, [0.1, 0.5, 0.9]), lo + (hi - lo) * np.array([0.1, 0.5, 0.9]), atol=0.02)
    assert (top >= 0).all() and (left >= 0).all() and ((top + ch) <= 400).all() and ((left + cw) <= 400).all()
    # placement is uniform: the crop's centre averages to the image centre
    assert abs(float((left + cw / 2).mean()) - 200) < 2
    # impossible requests fall back to the central crop clamped to the ratio (torchvision)
    t, l, h, w = T.RandomResizedCrop(8, scale=(2.0, 3.0)).params(torch.tensor([[100, 300]]), torch.Generator())
    assert (h.item(), w.item(), t.item(), l.item()) == (100, 133, 0, 83)


def test_photometric_ops(fixed):
    b = fixed.get_batch(range(4))
    mean, std = (0.4, 0.5, 0.6), (0.2, 0.25, 0.3)
    out = T.Compose([T.ToFloat(), T.Normalize(mean, std), T.ChannelsLast()])(b)["image"]
    ref = (b["image"].permute(0, 3, 1, 2).float() / 255 - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(1, 3, 1, 1)
    assert out.shape == (4, 3, 48, 64) and out.is_contiguous(memory_format=torch.channels_last)
    assert torch.allclose(out, ref, atol=1e-6)
    half = T.Compose([T.ToFloat(), T.ToDtype(torch.bfloat16), T.ChannelsFirst()])(b)["image"]
    assert half.dtype == torch.bfloat16 and half.is_contiguous()
    with pytest.raises(dsc.DscError, match="ToFloat"):
        T.Compose([T.Normalize(mean, std)])(b)
    # fused geometric + ToFloat equals the unfused chain
    fused = T.Compose([T.Resize((30, 40)), T.ToFloat()])(b)["image"]
    assert fused.shape == (4, 3, 30, 40) and fused.max() <= 1.0


def test_same_seed_same_augmentation_also_after_resume(fixed):
    chain = [T.RandomResizedCrop(32), T.RandomHorizontalFlip(), T.ToFloat()]
    run = lambda **kw: dsc.Loader(fixed, batch_size=8, order="random", seed=4, transforms=chain, **kw)  # noqa
    a = [b["image"].clone() for b in run()]
    b = [b["image"].clone() for b in run(num_threads=1)]
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    other = [b["image"].clone() for b in dsc.Loader(fixed, batch_size=8, order="random", seed=5, transforms=chain)]
    assert not torch.equal(a[0], other[0])
    first = run()
    it = iter(first)
    got = [next(it)["image"].clone() for _ in range(2)]
    state = first.state_dict()
    del it
    second = run(prefetch=1)
    second.load_state_dict(state)
    got += [b["image"].clone() for b in second]
    assert len(got) == len(a) and all(torch.equal(x, y) for x, y in zip(got, a))


def test_loader_detection_chain(det):
    ds, _ = det
    loader = dsc.Loader(ds, batch_size=4, order="random", transforms=[T.Letterbox(64), T.RandomHorizontalFlip(),
                                                                      T.ToFloat()])
    n = 0
    for b in loader:
        assert b["image"].shape[1:] == (3, 64, 64) and b["image"].dtype == torch.float32
        assert len(b["box_offsets"]) == len(b["index"]) + 1 and b["boxes"].shape[0] == int(b["box_offsets"][-1])
        n += len(b["index"])
    assert n == len(ds)


@pytest.mark.parametrize("make", [lambda: T.RandomResizedCrop(0), lambda: T.Letterbox(-3), lambda: T.CenterCrop("a"),
                                  lambda: T.Resize((2, 0)), lambda: T.RandomResizedCrop(8, scale=(0.5, 0.1)),
                                  lambda: T.Letterbox(8, fill=-1), lambda: T.Letterbox(8, fill=300),
                                  lambda: T.Letterbox(8, fill=255.9), lambda: T.Letterbox(8, fill=float("nan"))])
def test_bad_transform_arguments_are_config_errors(make):
    with pytest.raises(dsc.ConfigError):
        make()


def test_photometric_arguments_and_order_are_checked(fixed):
    b = fixed.get_batch(range(4))
    for mean, std in [((0.5, 0.5), (0.2, 0.2, 0.2)), ((0.5,) * 3, (0.2, 0.0, 0.2)), ("abc", (1, 1, 1)), ((), ())]:
        with pytest.raises(dsc.ConfigError, match="Normalize"):
            T.Normalize(mean, std)
    for make in (lambda: T.ToDtype(torch.int32), lambda: T.ToFloat(torch.uint8), lambda: T.ToDtype("half")):
        with pytest.raises(dsc.ConfigError):
            make()
    with pytest.raises(dsc.ConfigError, match="after T.ToFloat"):
        T.Compose([T.ChannelsLast(), T.ToFloat()])(b)
    two = T.Normalize((0.5, 0.5), (0.2, 0.2))  # 2 channels on an RGB image: refused, fused or not
    with pytest.raises(dsc.ConfigError, match="2 channels"):
        T.Compose([T.ToFloat(), two])(b)
    with pytest.raises(dsc.ConfigError, match="2 channels"):
        next(iter(dsc.Loader(fixed, batch_size=4, transforms=[T.CenterCrop(16), T.ToFloat(), two])))


def test_transforms_take_batches_in_the_packed_form(det):
    ds, _ = det
    chain = T.Compose([T.Letterbox(32)])
    with pytest.raises(dsc.ConfigError, match="packed"):
        chain(ds.get_batch(range(3), boxes="padded"))
    with pytest.raises(dsc.ConfigError, match="not a sample"):
        chain(ds[0])
    with pytest.raises(dsc.ConfigError, match="not a sample"):
        chain([ds[0], ds[1]])


def test_custom_ops_single_ops_and_empty_batches(fixed):
    seen = []

    def one_arg(batch):  # a custom op may take the batch alone
        seen.append(len(batch["index"]))
        return batch
    loader = dsc.Loader(fixed, batch_size=4, transforms=[T.CenterCrop(16), one_arg, T.ToFloat()])
    b = next(iter(loader))
    assert b["image"].shape == (4, 3, 16, 16) and seen and set(seen) == {4}
    single = dsc.Loader(fixed, batch_size=4, transforms=T.CenterCrop(16))  # one op, not a list
    assert next(iter(single))["image"].shape == (4, 16, 16, 3)
    with pytest.raises(dsc.ConfigError, match="transforms must be"):
        dsc.Loader(fixed, batch_size=4, transforms=3)
    empty = T.Compose([T.RandomResizedCrop(16), T.ToFloat()])(fixed.get_batch([]))
    assert empty["image"].shape == (0, 3, 16, 16)


def test_resume_refuses_other_transforms(fixed):
    a = dsc.Loader(fixed, batch_size=4, transforms=[T.RandomResizedCrop(16)])
    it = iter(a)
    next(it)
    state = a.state_dict()
    del it
    other = dsc.Loader(fixed, batch_size=4, transforms=[T.RandomResizedCrop(20)])
    with pytest.raises(dsc.ConfigError, match="transforms"):
        other.load_state_dict(state)
    same = dsc.Loader(fixed, batch_size=4, transforms=[T.RandomResizedCrop(16)])
    same.load_state_dict(state)  # the same chain, rebuilt: accepted
    old = {k: v for k, v in state.items() if k != "transforms"}  # a state saved before transforms were recorded
    same.load_state_dict(old)


class _MatrixOnly(T.Geometric):
    """A custom op that knows only its matrices (the batched grid_sample path), wrapping a built-in one."""

    def __init__(self, inner):
        self.inner, self.fill = inner, inner.fill

    def plan(self, sizes, gen):
        return self.inner.matrix(sizes, self.inner.params(sizes, gen))


@pytest.mark.parametrize("which", ["fixed", "ragged"])
def test_ops_with_matrices_only_go_through_the_batched_path(fixed, det, which):
    """The grid_sample fallback agrees with the fused steps of the same geometry (it approximates the
    antialiasing filter by supersampling) and moves boxes identically; a ragged batch is resampled one
    sample at a time (no canvas of the largest height by the largest width)."""
    import dsc.transforms.resample as R

    assert not _MatrixOnly(T.Resize(8)).fusable
    ds = fixed if which == "fixed" else det[0]
    op = T.Resize((30, 40)) if which == "fixed" else T.Letterbox(48, fill=114)
    ref = T.Compose([op])(ds.get_batch(range(6)))
    calls = []
    real = R._canvas
    R._canvas = lambda *a: calls.append(1) or real(*a)
    try:
        got = T.Compose([_MatrixOnly(op)])(ds.get_batch(range(6)))
    finally:
        R._canvas = real
    assert got["image"].shape == ref["image"].shape
    diff = (got["image"].float() - ref["image"].float()).abs()
    assert float(diff.mean()) < 2.0 and float(diff.max()) <= 64
    if which == "ragged":
        assert not calls
        assert torch.allclose(got["boxes"], ref["boxes"]) and torch.equal(got["box_offsets"], ref["box_offsets"])


def test_to_float_after_a_size_keeping_chain_on_mixed_sizes_is_refused_in_words(det):
    """Flips keep each sample's own size, so ToFloat/Normalize cannot make one (B, C, H, W) tensor of them: a
    ConfigError saying what to add (it was an IndexError from inside ToFloat)."""
    loader = dsc.Loader(det[0], batch_size=4, transforms=[T.RandomHorizontalFlip(), T.ToFloat()])
    with pytest.raises(dsc.ConfigError, match="ragged images need a fixed-size geometric op"):
        next(iter(loader))
