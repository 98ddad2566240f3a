"""The detection side of the reference recipes (issue 32): Mosaic's probability and its per-object masks and
keypoints against a reference written here from the placements it states, YOLO's MixUp, RandomAffine's
torchvision interpolation against torchvision's affine written out here, the presets' mean-colour fills."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import dsc
from dsc import transforms as T
from dsc.runtime.batches import object_masks
from dsc.synthetic import write_coco_instances


@pytest.fixture(scope="module")
def people(tmp_path_factory):
    """Ragged images with per-object masks, keypoints and a semantic mask."""
    root = tmp_path_factory.mktemp("mosaic")
    ann, images = write_coco_instances(root / "src", n=6, seed=3)
    dsc.compile_coco(ann, images, root / "ds", masks="instance,semantic", progress=False, workers=1)
    return dsc.open(root / "ds")


def _nearest(m: np.ndarray, h: int, w: int) -> np.ndarray:
    """dsc's nearest rule: output (i, j) takes input (floor((i + .5) H / h), floor((j + .5) W / w))."""
    H, W = m.shape
    ys = np.minimum(np.floor((np.arange(h) + 0.5) * H / h).astype(int), H - 1)
    xs = np.minimum(np.floor((np.arange(w) + 0.5) * W / w).astype(int), W - 1)
    return m[ys][:, xs]


def _mosaic_reference(ds, batch, parts, side):
    """Per output sample: the expected (boxes, keypoints, full masks) from each placement's source objects,
    placed by the placement's scale and shift, boxes clipped to the canvas and dropped when empty."""
    out = []
    for own in parts:
        boxes, kps, masks = [], [], []
        for j, (h, w), a, bb in own:
            s = ds[int(batch["index"][j])]
            H0, W0 = s["image"].shape[:2]
            sx, sy, ox, oy = w / W0, h / H0, a[0] - bb[0], a[1] - bb[1]
            for box, kp, m in zip(s["boxes"].double().numpy(), s["keypoints"].double().numpy(), s["masks"].numpy()):
                nb = np.array([box[0] * sx + ox, box[1] * sy + oy, box[2] * sx + ox, box[3] * sy + oy]).clip(0, side)
                if not (nb[2] > nb[0] and nb[3] > nb[1]):
                    continue
                boxes.append(nb)
                x, y = kp[:, 0] * sx + ox, kp[:, 1] * sy + oy
                vis = (kp[:, 2] > 0) & (x >= 0) & (x <= side) & (y >= 0) & (y <= side)
                kps.append(np.stack([x, y, kp[:, 2]], -1) * vis[:, None])
                full = np.zeros((side, side), np.uint8)
                r = _nearest(m, h, w)
                y0, x0 = max(oy, 0), max(ox, 0)
                y1, x1 = min(oy + h, side), min(ox + w, side)
                full[y0:y1, x0:x1] = r[y0 - oy:y1 - oy, x0 - ox:x1 - ox]
                masks.append(full)
        out.append((np.array(boxes).reshape(-1, 4), np.array(kps).reshape(-1, 17, 3),
                    np.array(masks).reshape(-1, side, side)))
    return out


@pytest.mark.parametrize("p", [1.0, 0.0, 0.5])
def test_mosaic_places_object_masks_and_keypoints_with_their_boxes(people, p):
    ds = people
    batch = ds.get_batch(range(len(ds)))
    op = T.Mosaic(48, p=p)
    parts = op.placements(batch["image_shapes"][:, :2].long(), T.batch_generator(3, 0, 0))
    out = T.Compose([op])(batch, seed=3)
    side = 96
    assert out["image"].shape == (len(ds), side, side, 3) and out["mask"].shape == (len(ds), side, side)
    assert [len(own) for own in parts] == ([4] * len(ds) if p == 1 else [1] * len(ds) if p == 0 else
                                           [len(own) for own in parts])
    ref = _mosaic_reference(ds, batch, parts, side)
    o = out["box_offsets"].tolist()
    assert len(o) == len(ds) + 1 and o[-1] == len(out["keypoints"]) == len(out["masks_rects"])
    exact = []
    for b, (boxes, kps, masks) in enumerate(ref):
        assert o[b + 1] - o[b] == len(boxes)
        np.testing.assert_allclose(out["boxes"][o[b]:o[b + 1]].double().numpy(), boxes, atol=1e-3)
        np.testing.assert_allclose(out["keypoints"][o[b]:o[b + 1]].double().numpy(), kps, atol=1e-3)
        got = object_masks(out, "masks", b, side, side).numpy()
        for g, m in zip(got, masks):  # (the same nearest rule; a pixel may differ where a source pixel edge
            exact.append((g == m).all())  # falls exactly on an output pixel centre: float rounding of the map)
            assert (g != m).sum() <= max(2, 0.05 * m.sum())
        for m, box in zip(got, out["boxes"][o[b]:o[b + 1]].numpy()):  # every box still frames its mask
            ys, xs = np.nonzero(m)
            if len(ys):
                assert xs.min() >= box[0] - 1 and xs.max() + 1 <= box[2] + 1
                assert ys.min() >= box[1] - 1 and ys.max() + 1 <= box[3] + 1
    assert len(exact) > 10 and np.mean(exact) >= 0.9
    if p == 0:  # letterboxed at the centre: a size x size square of the image and the fill
        for b, own in enumerate(parts):
            (j, (h, w), a, bb), = own
            assert max(h, w) == 48 and a[0] >= 24 and a[2] <= 72 and a[1] >= 24 and a[3] <= 72
            assert (out["image"][b, :24] == 114).all() and (out["image"][b, 72:] == 114).all()


def test_mosaic_probability_and_what_follows_it_in_the_yolo_preset(people):
    sizes = torch.tensor([[50, 70]]).repeat(4000, 1)
    parts = T.Mosaic(32, p=0.3).placements(sizes, torch.Generator().manual_seed(0))
    frac = np.mean([len(own) == 4 for own in parts])
    assert abs(frac - 0.3) < 0.03
    with pytest.raises(dsc.ConfigError, match="probability"):
        T.Mosaic(32, p=1.5)
    ops = T.presets.yolo(48, mosaic=0.5)
    assert ops[0].p == 0.5 and ops[1].interpolation == "bilinear" and ops[1].fill == 114
    for batch in dsc.Loader(people, batch_size=3, transforms=ops, seed=2):
        assert batch["image"].shape == (3, 48, 48, 3)
        assert len(batch["keypoints"]) == len(batch["boxes"]) == len(batch["masks_rects"])


def test_yolo_mixup_blends_pairs_and_concatenates_their_objects(people):
    op = T.YoloMixUp(p=0.5)
    on, partner, r = op.draw(4000, torch.Generator().manual_seed(1))
    assert abs(on.double().mean() - 0.5) < 0.03 and (partner != torch.arange(4000)).all()
    assert abs(r.mean() - 0.5) < 0.01 and abs(r.std() - (1 / (4 * 65)) ** 0.5) < 0.005  # Beta(32, 32)
    base = T.Compose([T.Mosaic(32)])(people.get_batch(range(len(people))), seed=0)
    del base["mask"]
    gen = T.batch_generator(5, 0, 0)
    on, partner, r = T.YoloMixUp(p=0.7).draw(len(people), T.batch_generator(5, 0, 0))
    before = {k: v.clone() for k, v in base.items() if torch.is_tensor(v)}
    out = T.YoloMixUp(p=0.7)(base, gen)
    assert on.any() and not on.all()
    o, o0 = out["box_offsets"].tolist(), before["box_offsets"].tolist()
    for b in range(len(people)):
        j = int(partner[b])
        own = range(o0[b], o0[b + 1])
        rows = list(own) + (list(range(o0[j], o0[j + 1])) if on[b] else [])
        if on[b]:
            ref = (before["image"][b].double() * r[b] + before["image"][j].double() * (1 - r[b])).floor()
            assert (out["image"][b].double() - ref).abs().max() <= 1  # (float32 arithmetic at a truncation edge)
        else:
            assert torch.equal(out["image"][b], before["image"][b])
        assert o[b + 1] - o[b] == len(rows)
        for k in ("boxes", "labels", "keypoints", "masks_rects"):
            assert torch.equal(out[k][o[b]:o[b + 1]], before[k][rows])
        got = object_masks(out, "masks", b, 64, 64)
        ref_m = torch.cat([object_masks(before, "masks", b, 64, 64)] +
                          ([object_masks(before, "masks", j, 64, 64)] if on[b] else []))
        assert torch.equal(got, ref_m)
    sem = T.YoloMixUp(p=1.0)(T.Compose([T.Mosaic(32)])(people.get_batch(range(3)), seed=0), gen)["mask"]
    assert sem.dtype == torch.uint8 and set(sem.unique().tolist()) <= set(range(0, 100)) | {255}
    with pytest.raises(dsc.ConfigError, match="one size"):
        T.YoloMixUp(p=1.0)(people.get_batch(range(3)), gen)
    ops = T.presets.yolo(48, mixup=1.0)
    assert any(isinstance(op, T.YoloMixUp) for op in ops)
    batch = next(iter(dsc.Loader(people, batch_size=4, transforms=ops, seed=1, keys=("image", "boxes", "masks",
                                                                                     "keypoints", "labels"))))
    assert batch[0].shape == (4, 48, 48, 3)


def test_detection_presets_fill_with_the_references_mean_colour(people):
    zo = next(op for op in T.presets.detection("ssd") if isinstance(op, T.RandomZoomOut))
    fc = next(op for op in T.presets.detection("lsj", size=64) if isinstance(op, T.FixedSizeCrop))
    assert zo.fill == fc.fill == (123.0, 117.0, 104.0)  # references/detection/presets.py: fill=mean
    b = people.get_batch(range(3))
    out = T.Compose([T.RandomZoomOut(fill=(123, 117, 104), side_range=(3.0, 3.0), p=1.0)])(b, seed=0)
    from dsc.runtime.batches import sample_pixels
    for img, (h, w, _) in zip(sample_pixels(out, "image"), b["image_shapes"].tolist()):
        assert img.shape[:2] == (3 * h, 3 * w)
        corners = torch.stack([img[0, 0], img[0, -1], img[-1, 0], img[-1, -1]])
        canvas = (img == torch.tensor([123, 117, 104], dtype=torch.uint8)).all(-1)
        assert canvas.sum() >= 8 * h * w - 1 and (corners == torch.tensor([123, 117, 104])).all(-1).sum() >= 3
    # the fused gather: FixedSizeCrop's padding takes the colour too, masks their ignore index
    batch = next(iter(dsc.Loader(people, batch_size=3, transforms=[T.FixedSizeCrop((120, 120), fill=(123, 117, 104))])))
    assert (batch["image"][:, -1, -1] == torch.tensor([123, 117, 104], dtype=torch.uint8)).all()
    assert (batch["mask"][:, -1, -1] == 255).all()
    with pytest.raises(dsc.ConfigError, match="fill"):
        T.RandomZoomOut(fill=(1, 2, 300))


def test_every_fill_is_a_whole_pixel_value_as_letterbox_takes_it():
    """A fill for uint8 images is a whole number 0-255 (or one per channel) in every op, as Letterbox refused
    0.5 already: Mosaic(640, 0.5), meant as p=0.5, once took 0.5 as the fill."""
    ops = {"Mosaic": lambda f: T.Mosaic(48, f), "RandomZoomOut": lambda f: T.RandomZoomOut(f),
           "RandomAffine": lambda f: T.RandomAffine(10, fill=f), "FixedSizeCrop": lambda f: T.FixedSizeCrop(32, f),
           "RandomCrop": lambda f: T.RandomCrop(32, fill=f), "Letterbox": lambda f: T.Letterbox(32, f)}
    for name, make in ops.items():
        for bad in (0.5, 114.5, (1, 2, 2.5), -1, 256, float("nan")):
            with pytest.raises(dsc.ConfigError, match=f"{name}: fill is a pixel value, a whole number 0-255"):
                make(bad)
        assert make(114).fill == 114 and make(114.0).fill == 114.0
    with pytest.raises(dsc.ConfigError, match=r"for the probability, name it: Mosaic\(\.\.\., p=0.5\)"):
        T.Mosaic(640, 0.5)
    assert T.Mosaic(640, p=0.5).p == 0.5 and T.RandomAffine(10, fill=(123, 117, 104)).fill == (123, 117, 104)


def _tv_affine(img: torch.Tensor, M: torch.Tensor, fill, mode: str, out_hw) -> torch.Tensor:
    """torchvision's tensor affine resampling written out (``_apply_grid_transform``): grid_sample
    (align_corners=False, zeros outside) of the image with a ones channel at each output pixel centre's
    source point; nearest: ``fill`` where the mask < 0.5; bilinear: (img - fill) * mask + fill; rounded."""
    x = img.permute(0, 3, 1, 2).double()
    N, C, H, W = x.shape
    oh, ow = out_hw
    ys, xs = torch.meshgrid(torch.arange(oh, dtype=torch.float64) + 0.5, torch.arange(ow, dtype=torch.float64) + 0.5,
                            indexing="ij")
    pts = torch.stack([xs, ys, torch.ones_like(xs)], -1).view(1, -1, 3) @ M.transpose(1, 2)
    grid = torch.stack([pts[..., 0] * 2 / W - 1, pts[..., 1] * 2 / H - 1], -1).view(N, oh, ow, 2)
    y = F.grid_sample(torch.cat([x, torch.ones_like(x[:, :1])], 1), grid, mode=mode, padding_mode="zeros",
                      align_corners=False)
    y, mask = y[:, :-1], y[:, -1:]
    f = torch.tensor(fill, dtype=torch.float64).view(1, -1, 1, 1)
    y = torch.where(mask < 0.5, f.expand_as(y), y) if mode == "nearest" else (y - f) * mask + f
    return y.round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1)


@pytest.mark.parametrize("mode", ["nearest", "bilinear"])
def test_random_affine_resamples_as_torchvision(mode):
    from dsc.transforms.fused import plan_chain

    assert T.RandomAffine(10).interpolation == "nearest"  # torchvision v2's default
    rng = np.random.default_rng(0)
    img = torch.from_numpy(rng.integers(0, 256, (6, 37, 53, 3), dtype=np.uint8))
    kw = dict(degrees=25, translate=(0.1, 0.2), scale=(0.6, 1.7), shear=(-10, 10, -5, 5), fill=(10, 200, 30))
    op = T.RandomAffine(**kw) if mode == "nearest" else T.RandomAffine(interpolation=mode, **kw)
    out = T.Compose([op])({"image": img.clone()}, seed=4)["image"]
    plan = plan_chain([op], torch.tensor([[37, 53]]).repeat(6, 1), T.batch_generator(4, 0, 0))
    ref = _tv_affine(img, plan.matrices, (10, 200, 30), mode, (37, 53))
    d = (out.int() - ref.int()).abs()
    if mode == "nearest":  # (exact but for source points on a pixel edge, where rounding picks either side)
        assert (d > 0).any(-1).double().mean() < 0.002
    else:
        assert d.max() <= 1
    assert not torch.equal(out, img)


def test_a_crop_inside_the_crop_before_it_runs_as_one():
    """Zoom-out then IoU crop: the crop of the canvas, cut straight from the image (the canvas is never made),
    equals the two crops one after the other, flips pending or not."""
    from dsc.transforms.fused import run_program

    img = torch.from_numpy(np.random.default_rng(0).integers(0, 256, (20, 30, 3), dtype=np.uint8))
    fill = (123.0, 117.0, 104.0)
    for flip in (False, True):
        flips = [("flip", 0, flip)]
        first = flips + [("crop", -15, -7, 60, 70, fill)]
        canvas = torch.empty((60, 70, 3), dtype=torch.uint8)
        run_program(img, first, canvas, False, None)
        for second in [("crop", 10, 3, 25, 40, 0.0), ("crop", 0, 0, 60, 70, 0.0), ("crop", 40, 50, 20, 20, 0.0)]:
            want = torch.empty((second[3], second[4], 3), dtype=torch.uint8)
            run_program(canvas, [second], want, False, None)
            got = torch.empty_like(want)
            run_program(img, first + [second], got, False, None)
            assert torch.equal(got, want)
