"""The fused path: geometric transforms run per sample inside the Loader's gather (and, on the CPU, the
photometric pass after them). Fidelity against an independent antialiased reference for given crop
boxes; the same batches as the batched path, for 1 and 2 threads, and after a resume; boxes and masks
stay aligned."""
import math

import numpy as np
import pytest
import torch

import dsc
from dsc import transforms as T
from dsc.synthetic import seg_scenes, write_segfolder
from dsc.transforms.fused import plan_chain, run_program

from reference import aa_resize

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
RECIPE = [T.RandomResizedCrop(56), T.RandomHorizontalFlip(), T.ToFloat(), T.Normalize(MEAN, STD)]


@pytest.fixture(scope="module")
def fixed(scenes_compiled):
    return scenes_compiled(size=(64, 72), resize="stretch")


@pytest.fixture(scope="module")
def ragged(scenes_compiled):
    return scenes_compiled()


def test_crop_resize_is_within_one_level_of_an_antialiased_reference():
    """For a given crop box, torchvision's ``resized_crop(..., antialias=True)`` on uint8: against a float64
    model of that algorithm (tests/reference.py: the antialiased bilinear filter, horizontal pass, uint8,
    vertical pass), and against exact float math. The only differences of 2 are rare, when upscaling
    (torch's fixed-point weights)."""
    from dsc.synthetic import make_scene

    rng = np.random.default_rng(0)
    near, exact, n = [], [], 0
    for k in range(40):
        img = np.ascontiguousarray(make_scene(rng, 256, 300))
        h, w = int(rng.integers(20, 256)), int(rng.integers(20, 300))
        top, left = int(rng.integers(0, 257 - h)), int(rng.integers(0, 301 - w))
        oh, ow = [(224, 224), (96, 80), (300, 280)][k % 3]  # down, down, up
        flip = bool(k % 2)
        out = torch.empty((oh, ow, 3), dtype=torch.uint8)
        program = [("crop", top, left, h, w), ("resize", oh, ow), ("flip", 0, flip)]
        run_program(torch.from_numpy(img.copy()), program, out, nearest=False, fill=0)
        got = out.numpy().astype(int)
        crop = img[top:top + h, left:left + w]
        for refs, rb in ((near, True), (exact, False)):
            ref = aa_resize(crop, oh, ow, round_between=rb)
            refs.append(np.abs(got - (ref[:, ::-1] if flip else ref).astype(int)))
        n += got.size
    near, exact = np.concatenate([d.ravel() for d in near]), np.concatenate([d.ravel() for d in exact])
    assert near.mean() < 0.1 and (near <= 1).mean() >= 0.9999 and near.max() <= 2
    assert exact.max() <= 1 and exact.mean() < 0.15


@pytest.mark.parametrize("which", ["fixed", "ragged"])
def test_loader_equals_the_batched_path_for_1_and_2_threads(fixed, ragged, which):
    ds = fixed if which == "fixed" else ragged
    runs = {}
    for nt in (1, 2):
        loader = dsc.Loader(ds, batch_size=8, order="random", seed=3, transforms=RECIPE, num_threads=nt)
        runs[nt] = [(b["index"].clone(), b["image"].clone()) for b in loader]
    for (i1, x1), (i2, x2) in zip(runs[1], runs[2]):
        assert torch.equal(i1, i2) and torch.equal(x1, x2)
    # the same chain on gathered batches (the path a user calling Compose gets)
    loader = dsc.Loader(ds, batch_size=8, order="random", seed=3)
    compose = T.Compose(RECIPE)
    for j, (idx, batch) in enumerate(zip(loader.batch_indices(), runs[1])):
        ref = compose(ds.get_batch(idx), seed=3, epoch=0, batch_index=j)["image"]
        assert torch.allclose(ref, batch[1], atol=1e-6)
    x = runs[1][0][1]
    assert x.dtype == torch.float32 and x.shape[1:] == (3, 56, 56) and x.is_contiguous()
    assert abs(float(x.mean())) < 2.5  # normalised


def test_resume_mid_epoch_replays_the_same_augmented_batches(fixed):
    make = lambda **kw: dsc.Loader(fixed, batch_size=4, order="random", seed=5, transforms=RECIPE, **kw)  # noqa
    full = [b["image"].clone() for b in make()]
    first = make()
    it = iter(first)
    got = [next(it)["image"].clone() for _ in range(3)]
    state = first.state_dict()
    del it
    second = make(prefetch=1, num_threads=1)
    second.load_state_dict(state)
    got += [b["image"].clone() for b in second]
    assert len(got) == len(full) and all(torch.equal(a, b) for a, b in zip(got, full))


def test_channels_last_and_dtype_in_the_fused_pass(fixed):
    chain = [T.RandomResizedCrop(32), T.ToFloat(), T.Normalize(MEAN, STD), T.ChannelsLast()]
    b = next(iter(dsc.Loader(fixed, batch_size=4, transforms=chain)))
    assert b["image"].is_contiguous(memory_format=torch.channels_last) and b["image"].shape == (4, 3, 32, 32)
    b = next(iter(dsc.Loader(fixed, batch_size=4, transforms=[T.CenterCrop(40), T.ToFloat(),
                                                               T.ToDtype(torch.bfloat16)])))
    assert b["image"].dtype == torch.bfloat16 and b["image"].max() <= 1.0
    # no geometric op on a fixed dataset: the float pass reads the mapped samples directly
    b = next(iter(dsc.Loader(fixed, batch_size=4, transforms=[T.ToFloat(scale=False)])))
    assert torch.equal(b["image"], fixed.get_batch(b["index"])["image"].permute(0, 3, 1, 2).float())


def test_plans_are_the_batched_draws(fixed):
    """The fused plan draws exactly what Compose on a batch draws (one generator, op order)."""
    sizes = torch.tensor([[64, 72]] * 6)
    ops = [T.RandomResizedCrop(30), T.RandomHorizontalFlip(), T.RandomVerticalFlip()]
    plan = plan_chain(ops, sizes, T.batch_generator(1, 2, 3))
    gen = T.batch_generator(1, 2, 3)
    M = torch.eye(3, dtype=torch.float64).expand(6, 3, 3)
    for op in ops:
        m, sizes = op.plan(sizes, gen)
        M = M @ m
    assert torch.equal(plan.matrices, M) and plan.out == (30, 30)
    crops = [p[0] for p in plan.programs]
    top, left, ch, cw = ops[0].params(torch.tensor([[64, 72]] * 6), T.batch_generator(1, 2, 3))
    assert [c[1:5] for c in crops] == [tuple(int(v) for v in r) for r in zip(top, left, ch, cw)]
    assert all(c[5] == 0.0 for c in crops)  # each crop carries its op's fill


def test_boxes_and_masks_follow_the_fused_path(tmp_path):
    from test_masks import _class_of_pixels

    scenes = seg_scenes(8, seed=11, size_range=(80, 140))
    root = write_segfolder(tmp_path / "src", scenes)
    dsc.compile_segfolder(root, tmp_path / "out", max_side=100, progress=False)
    ds = dsc.open(tmp_path / "out")
    chain = [T.RandomResizedCrop(64, scale=(0.3, 1.0)), T.RandomHorizontalFlip(), T.RandomVerticalFlip()]
    agree = total = 0
    for b in dsc.Loader(ds, batch_size=3, order="random", transforms=chain):
        cls = _class_of_pixels(b["image"].numpy())
        valid = cls >= 0
        agree += int((cls[valid] == b["mask"].numpy()[valid]).sum())
        total += int(valid.sum())
    assert agree / total >= 0.99


def test_fused_boxes_frame_their_shapes(tmp_path):
    from dsc.synthetic import detection_scenes, write_coco

    scenes = detection_scenes(10, seed=2, size_range=(80, 150))
    ann, images = write_coco(tmp_path / "coco", scenes)
    dsc.compile_coco(ann, images, tmp_path / "det", progress=False)
    ds = dsc.open(tmp_path / "det")
    loader = dsc.Loader(ds, batch_size=5, order="random", boxes="padded",
                        transforms=[T.RandomResizedCrop(72, scale=(0.5, 1.0)), T.RandomHorizontalFlip()])
    checked = 0
    for b in loader:  # padded boxes now work with transforms: boxes move before the form is made
        for k in range(len(b["index"])):
            img = b["image"][k].numpy().astype(int)
            for box, ok in zip(b["boxes"][k].tolist(), b["box_mask"][k].tolist()):
                x0, y0, x1, y1 = box
                if ok and x1 - x0 >= 8 and y1 - y0 >= 8:
                    inner = img[math.ceil(y0) + 2:int(y1) - 2, math.ceil(x0) + 2:int(x1) - 2].reshape(-1, 3)
                    assert np.abs(inner - inner[0]).max() <= 6  # one solid shape inside the box
                    checked += 1
    assert checked >= 5


def test_each_crop_keeps_its_own_fill(fixed):
    """CenterCrop pads with zeros even when a Letterbox with another fill follows (one fill per chain painted
    the CenterCrop's padding grey)."""
    b = fixed.get_batch(range(2))  # 64x72
    out = T.Compose([T.CenterCrop((120, 72)), T.Letterbox(60, fill=114)])(b)["image"]
    # 120x72 -> 60x36, centred: bars of 114 left and right; the CenterCrop's 28 zero rows -> 14 rows of 0
    assert (out[:, :, :12] == 114).all() and (out[:, :, -12:] == 114).all()
    assert (out[:, :13, 12:-12] == 0).all() and (out[:, -13:, 12:-12] == 0).all()
    fused = next(iter(dsc.Loader(fixed, batch_size=2, transforms=[T.CenterCrop((120, 72)), T.Letterbox(60, fill=114)])))
    assert torch.equal(fused["image"], out)


@pytest.mark.parametrize("nearest", [False, True])
def test_a_resize_that_dwarfs_its_crop_resamples_only_the_window(monkeypatch, nearest):
    """Resize then crop (with flips between, a window partly outside) through the window-only path equals the
    whole resize then the crop: exactly for nearest, within a level for bilinear (PIL's box filter). (Nearest
    now takes the window whatever the sizes: the next test checks it against the whole resize.)"""
    import dsc.transforms.fused as fused

    rng = np.random.default_rng(3)
    x = torch.from_numpy(rng.integers(0, 256, (60, 90) if nearest else (60, 90, 3), dtype=np.uint8))
    x[20:40, 30:60] = 200  # structure, not only noise
    programs = [[("resize", 100, 150), ("flip", 0, True), ("crop", 20, 30, 40, 50, 0.0)],
                [("flip", 1, True), ("resize", 80, 200), ("crop", 60, -10, 40, 60, 7.0), ("flip", 0, True)],
                [("crop", 5, 5, 50, 80, 0.0), ("resize", 30, 240), ("crop", 0, 100, 30, 30, 0.0)]]
    for program in programs:
        h, w = program[-1][3:5] if program[-1][0] == "crop" else program[-2][3:5]
        outs = []
        for forced in (False, True):
            monkeypatch.setattr(fused, "dwarfs", lambda resized, crop, f=forced: f)
            out = torch.empty((h, w, *x.shape[2:]), dtype=torch.uint8)
            run_program(x, program, out, nearest, None)
            outs.append(out.int())
        diff = (outs[0] - outs[1]).abs()
        assert int(diff.max()) <= (0 if nearest else 1), program
        assert float((diff > 0).float().mean()) < 0.2


def test_a_nearest_resize_then_crop_never_makes_the_whole_resize(monkeypatch):
    """A mask's resize followed by a crop (segmentation's random resize then RandomCrop, flips between) picks
    only the crop's pixels, whatever the sizes: the whole nearest resize is never made, and the result is
    exactly the whole resize cropped (flipped), fill outside."""
    import dsc.transforms.fused as fused

    rng = np.random.default_rng(5)
    x = torch.from_numpy(rng.integers(0, 20, (48, 64), dtype=np.uint8))
    whole = []
    monkeypatch.setattr(fused, "_resize_nearest", lambda *a: whole.append(1) or (_ for _ in ()).throw(AssertionError))
    for (nh, nw), flip, (top, left, ch, cw) in [((96, 128), False, (10, 20, 40, 50)), ((40, 50), True, (-5, -3, 48, 48)),
                                                ((120, 70), True, (100, 60, 30, 30))]:
        program = [("resize", nh, nw), ("flip", 0, flip), ("crop", top, left, ch, cw, 0.0)]
        out = torch.empty((ch, cw), dtype=torch.uint8)
        run_program(x, program, out, True, 255.0)
        ys = torch.clamp(((torch.arange(nh) + 0.5) * (48 / nh)).floor().long(), max=47)
        xs = torch.clamp(((torch.arange(nw) + 0.5) * (64 / nw)).floor().long(), max=63)
        ref = x[ys][:, xs]
        ref = ref.flip(1) if flip else ref
        want = torch.full((ch, cw), 255, dtype=torch.uint8)
        t0, t1, l0, l1 = max(top, 0), min(top + ch, nh), max(left, 0), min(left + cw, nw)
        if t1 > t0 and l1 > l0:
            want[t0 - top:t1 - top, l0 - left:l1 - left] = ref[t0:t1, l0:l1]
        assert torch.equal(out, want), program
    assert not whole


def test_a_zoom_out_and_crop_last_but_flips_writes_the_output_without_a_canvas(monkeypatch):
    """Zoom-out, IoU crop, flip (ssd's chain): the crop partly outside the image is written straight into the
    output, the fill only around the pasted part, the flips placing and mirroring it; no canvas is made, and
    the pixels equal the canvas-then-flip steps, for per-channel and single fills, masks too."""
    import dsc.transforms.fused as fused

    rng = np.random.default_rng(7)
    made = []
    real_full = fused.full
    for shape, fill in (((20, 30, 3), (123.0, 117.0, 104.0)), ((20, 30), 255.0)):
        x = torch.from_numpy(rng.integers(0, 256, shape, dtype=np.uint8))
        for fh, fw in ((False, False), (True, False), (False, True), (True, True)):
            for crop in (("crop", -15, -7, 60, 70, fill), ("crop", 5, -4, 10, 50, fill), ("crop", -40, 0, 10, 10, fill)):
                program = [crop, ("flip", 0, fw), ("flip", 1, fh)]
                h, w = crop[3], crop[4]
                canvas = real_full((h, w, *shape[2:]), fill, torch.uint8, "cpu")  # the steps, one by one
                t0, t1, l0, l1 = max(crop[1], 0), min(crop[1] + h, 20), max(crop[2], 0), min(crop[2] + w, 30)
                if t1 > t0 and l1 > l0:
                    canvas[t0 - crop[1]:t1 - crop[1], l0 - crop[2]:l1 - crop[2]] = x[t0:t1, l0:l1]
                dims = [d for d, f in ((0, fh), (1, fw)) if f]
                want = canvas.flip(dims) if dims else canvas
                monkeypatch.setattr(fused, "full", lambda *a: made.append(a) or real_full(*a))
                out = torch.empty((h, w, *shape[2:]), dtype=torch.uint8)
                run_program(x, program, out, False, None)
                monkeypatch.setattr(fused, "full", real_full)
                assert torch.equal(out, want), (shape, fh, fw, crop)
    assert made and all(a[0][0] == 1 for a in made)  # (one line of the per-channel fill, never a canvas)


def test_nearest_resizes_and_flips_run_in_their_order_at_tie_ratios():
    """A nearest resize does not commute with a flip where (i + 1/2) H / h is whole (every 2:1 downscale): a
    flip before the resize (then a crop), and flips after the last resize, give the literal steps' pixels."""
    x = torch.arange(4, dtype=torch.uint8).view(1, 4).expand(4, 4).contiguous()  # value: the column
    cols = torch.tensor([1, 3])  # floor((i + 1/2) 4 / 2)
    literal = {"flip first": x.flip(1)[:, cols][cols], "flip last": x[:, cols][cols].flip(1)}
    for name, program in [("flip first", [("flip", 0, True), ("resize", 2, 2), ("crop", 0, 0, 2, 2)]),
                          ("flip first", [("flip", 0, True), ("resize", 2, 2)]),
                          ("flip last", [("resize", 2, 2), ("flip", 0, True)]),
                          ("flip last", [("resize", 2, 2), ("flip", 0, True), ("crop", 0, 0, 2, 2)])]:
        out = torch.zeros(2, 2, dtype=torch.uint8)
        run_program(x, program, out, True, 255.0)
        assert torch.equal(out, literal[name]), (program, out.tolist())
