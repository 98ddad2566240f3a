"""The detection side of the reference recipes (issue 32): Mosaic's probability and its per-object masks and
keypoints against a reference written here from the placements it states, YOLO's MixUp, RandomAffine's
torchvision interpolation against torchvision's affine written out here, the presets' mean-colour fills."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import dsc
from dsc import nogil as N
from dsc import transforms as T
from dsc.runtime.batches import object_masks
from dsc.synthetic import write_coco_instances
from torch_calls import scripted_only  # noqa: E402


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


def test_the_yolo_preset_resamples_once_for_perspective_and_flip(people, monkeypatch):
    """Without MixUp the flip comes before the (per-pixel) HSV jitter, so it joins RandomAffine's geometric
    stage: one resampling pass a batch, not a warp and then a flip pass (main ran two); the boxes, masks and
    keypoints still follow (every box frames its mask). With MixUp the flip stays last (it flips the blend)."""
    from dsc.transforms import resample

    stages = [(kind, [type(op).__name__ for op in ops]) for kind, ops in T.Compose(T.presets.yolo(48)).stages
              if kind == "geometric"]
    assert stages == [("geometric", ["RandomAffine", "RandomHorizontalFlip"])]
    assert type(T.presets.yolo(48, mixup=0.5)[-1]).__name__ == "RandomHorizontalFlip"
    calls = []
    real = resample.apply_plan
    monkeypatch.setattr(resample, "apply_plan", lambda *a, **k: calls.append(1) or real(*a, **k))
    batches = list(dsc.Loader(people, batch_size=3, transforms=T.presets.yolo(48), seed=4))
    assert len(calls) == len(batches)  # one pass a batch
    for batch in batches:
        o = batch["box_offsets"].tolist()
        for b in range(len(o) - 1):
            masks = object_masks(batch, "masks", b)
            for j, (x0, y0, x1, y1) in enumerate(batch["boxes"][o[b]:o[b + 1]].tolist()):
                ys, xs = np.nonzero(masks[j].numpy())
                if len(xs):  # (a mask nearest-sampled may lose a sliver: it still lies inside its box)
                    assert xs.min() >= int(x0) - 1 and xs.max() <= x1 and ys.min() >= int(y0) - 1 and ys.max() <= y1


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
    # (exact but for source points on a pixel edge, where rounding picks either side; bilinear: float rounding
    # at a tie of the uint8 cast's rounding)
    assert (d > 0).any(-1).double().mean() < 0.002
    assert d.max() <= 1 or mode == "nearest"
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


# ---------------------------------------------------------------------------------------------- uint8 colour kernels
def _rgb(n=4, h=40, w=52, seed=0):
    """Float (n, 3, h, w) whole values: noise, greys, saturated and near-tie colours (every hexagon sector)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 256, (n, 3, h, w), generator=g).float()
    x[:, :, :4] = x[:, :1, :4]  # grey rows (c = 0)
    x[:, :, 4:8, :6] = torch.tensor([255.0, 0, 0]).view(3, 1, 1)  # pure red, then channels one apart
    x[:, :, 8:12] = x[:, :1, 8:12] + torch.tensor([0.0, 1, 2]).view(3, 1, 1).clamp(max=255 - x[:, :1, 8:12].max())
    return x


def _hsv_round_trip_ref(x: np.ndarray, f: float) -> np.ndarray:
    """adjust_hue written from its formula in float64 (rgb -> hsv, h + f mod 1, back, x 255.999 truncated)."""
    r, g, b = x[:, 0] / 255, x[:, 1] / 255, x[:, 2] / 255
    mx, mn = np.maximum(np.maximum(r, g), b), np.minimum(np.minimum(r, g), b)
    c = mx - mn
    cs = np.where(c == 0, 1, c)
    h = np.where(mx == r, (g - b) / cs, np.where(mx == g, (b - r) / cs + 2, (r - g) / cs + 4))
    h = ((h / 6 + 1) % 1 + f) % 1
    s = np.where(mx == 0, 0, c / np.where(mx == 0, 1, mx))
    out = []
    for n in (5, 3, 1):
        k = (n + 6 * h) % 6
        out.append(mx - mx * s * np.clip(np.minimum(k, 4 - k), 0, 1))
    return np.floor(np.stack(out, 1) * 255.999)


@pytest.mark.parametrize("f", [-0.5, -0.37, -0.05, 0.0, 0.013, 0.05, 0.26, 0.4999])
def test_uint8_hue_is_within_a_grey_level_of_the_hsv_round_trip(f):
    """The uint8 hue (int16 on the hue hexagon, selects by sign masks) against adjust_hue's float formula:
    every pixel within one grey level, almost all equal; the float path (float images) is untouched."""
    from dsc.transforms import color as C

    x = _rgb()
    got = C.hue(x, torch.full((4,), f), 255.0, True)
    ref = _hsv_round_trip_ref(x.double().numpy(), f)
    d = np.abs(got.numpy() - ref)
    assert d.max() <= 1 and (d > 0).mean() < 0.02, (d.max(), (d > 0).mean())
    flt = C.hue(x / 255, torch.full((4,), f), 1.0, False)  # a float image: the float round trip
    assert np.abs(flt.double().numpy() * 255.999 - ref).max() < 1.01


def _opencv_hsv_ref(x: np.ndarray, gains: np.ndarray) -> np.ndarray:
    """Ultralytics' augment_hsv written from OpenCV's documented 8-bit HSV (V = max, S = 255 (max - min) / max,
    H = hue in degrees / 2, each rounded), the gains' lookup tables (truncated), and back, in float64."""
    r, g, b = x[:, 0], x[:, 1], x[:, 2]
    mx, mn = x.max(1), x.min(1)
    c = mx - mn
    X = np.where(mx == r, g - b, np.where(mx == g, b - r + 2 * c, r - g + 4 * c))
    X = np.where(X < 0, X + 6 * c, X)
    H = np.round(30 * X / np.where(c == 0, 1, c)) % 180
    S = np.round(255 * c / np.where(mx == 0, 1, mx))
    rh, rs, rv = (gains[:, k].reshape(-1, 1, 1) for k in range(3))
    H2, S2, V2 = np.floor((H * rh) % 180), np.floor(np.clip(S * rs, 0, 255)), np.floor(np.clip(mx * rv, 0, 255))
    cp, y = V2 * S2 / 255, H2 / 30
    out = [V2 - cp + cp * np.clip(np.abs(y - 3) - 1, 0, 1), V2 - cp + cp * np.clip(2 - np.abs(y - 2), 0, 1),
           V2 - cp + cp * np.clip(2 - np.abs(y - 4), 0, 1)]
    return np.round(np.stack(out, 1))


def test_random_hsv_on_uint8_is_within_a_grey_level_of_opencv_s_formula():
    """RandomHSV on uint8 pixels (the float stage with integer=True and the CPU's uint8 stage: the same kernel)
    against OpenCV's 8-bit HSV jitter written out here: every pixel within a grey level."""
    from dsc.transforms import augment as A

    x = _rgb(6, seed=3)
    op = A.RandomHSV(0.2, 0.7, 0.4)  # (a wide hue gain: every hue moves)
    for seed in range(3):
        p = op.params(torch.tensor([[40, 52]]).expand(6, 2), torch.Generator().manual_seed(seed))
        ref = _opencv_hsv_ref(x.double().numpy(), p["r"].numpy())
        got = op.apply(x.clone(), p, None, 255.0, True)
        assert np.abs(got.numpy() - ref).max() <= 1
        u8 = op.apply_u8(x.permute(0, 2, 3, 1).to(torch.uint8).contiguous(), p, None)
        assert torch.equal(u8.permute(0, 3, 1, 2), got.to(torch.uint8))


def test_the_hsv_and_hue_kernels_make_fewer_passes():
    """color._hsv_jitter_piece's "mod 180"s are plain arithmetic (f - 180 floor(f / 180): four passes each,
    not a compare, a cast, a multiply and a subtraction, nor one remainder, whose pass costs as much as ten
    of these) and its last clamp is gone (every channel lies in [V' - c', V'] already): 87 passes over the
    piece's planes, not 94; the numbers are OpenCV's formula's (the test above) and the same as before over
    all 2^24 colours (checked when this was written, 8 gain sets, equal)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from dsc.transforms import color as C

    class Count(TorchDispatchMode):
        planes = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            self.planes += isinstance(out, torch.Tensor) and out.numel() >= 600
            return out

    x = _rgb(1, seed=4)
    out = torch.empty_like(x)
    with Count() as count:
        C._hsv_jitter_piece(x, torch.tensor([[1.01, 1.2, 0.8]], dtype=torch.float64), out)
    assert count.planes <= 87
    ref = _opencv_hsv_ref(x.double().numpy(), np.array([[1.01, 1.2, 0.8]]))
    assert np.abs(out.numpy() - ref).max() <= 1
    # the hue's integer kernel (RandomPhotometricDistort): each channel's clamp to [0, c] two vector ops
    # (clamp, minimum) instead of six sign-mask steps: 83 passes, not 98; the same numbers over all 2^24
    # colours (6 factors, checked when written); here the float round trip's, within a level
    count.planes = 0
    with Count() as count:
        C._hue_piece(x.to(torch.uint8), torch.tensor([0.03], dtype=torch.float64), out)
    assert count.planes <= 85  # (main: 98)
    ref = C.rgb_to_hsv(x / 255.0)
    ref[:, 0] = torch.remainder(ref[:, 0] + 0.03, 1.0)
    assert float((out - C.hsv_to_rgb(ref).mul_(255.999).floor_()).abs().max()) <= 1


# ---------------------------------------------------------------------------------------------- the bench's baseline
def test_the_reference_baseline_runs_each_preset_as_its_reference(tmp_path):
    """bench's _ReferenceRecipe (the per-image DataLoader the detection goal is measured against): every
    detection, segmentation and YOLO preset has a reference implementation; each item is the reference's
    output (float CHW; YOLO uint8 at the output size; segmentation normalised, its mask int64 at the crop
    size padded with 255), its boxes inside the image; classification recipes have none."""
    from dsc import bench
    from dsc.synthetic import detection_scenes, write_coco

    ann, images = write_coco(tmp_path / "coco", detection_scenes(6, seed=4, size_range=(60, 120), ext=".jpg"),
                             segmentation=True)
    dsc.compile_coco(ann, images, tmp_path / "ds", masks="semantic", progress=False)
    ds = dsc.open(tmp_path / "ds")
    rows: list = []
    paths = bench.source_files(ds, rows=rows)[0]
    presets = {n: T.presets.recipe(n) for n in ("det-hflip", "det-ssd", "det-ssdlite", "det-multiscale")}
    presets.update({"det-lsj": T.presets.detection("lsj", size=96), "yolo": T.presets.yolo(64),
                    "segmentation": T.presets.segmentation(base_size=80, crop_size=72)})
    assert not bench.reference_supported(T.presets.recipe("ta_wide"))
    torch.manual_seed(0)
    for name, ops in presets.items():
        assert bench.reference_supported(ops), name
        data = bench._ReferenceRecipe(ds, paths, ops, rows)
        for i in range(len(data)):
            out = data[i]
            img = out["image"]
            assert img.dim() == 3 and img.shape[0] == 3, name
            if name == "yolo":
                assert img.dtype == torch.uint8 and img.shape[1:] == (64, 64)
            else:
                assert img.dtype == torch.float32
            if name == "det-lsj":
                assert img.shape[1:] == (96, 96)
            if name == "segmentation":
                assert "boxes" not in out and out["mask"].shape == (72, 72) and out["mask"].dtype == torch.int64
                assert float(img.min()) < 0  # normalised
                continue
            b = out["boxes"]
            assert len(b) == len(out["labels"]), name
            assert bool((b[:, 0::2] >= 0).all() and (b[:, 2] <= img.shape[2] + 1e-3).all()
                        and (b[:, 3] <= img.shape[1] + 1e-3).all()), name


def test_photometric_distort_on_uint8_equals_the_float_stage_fixed_and_ragged():
    """RandomPhotometricDistort's uint8 path (each op on just the samples that drew it: lookup tables,
    a float copy for saturation, the integer hue, a byte gather) gives the float stage's very numbers, on a
    fixed-size batch and on a packed ragged one (images of several sizes: sample by sample, in place)."""
    from dsc.transforms import augment as A

    op = A.RandomPhotometricDistort(p=0.5)
    g = torch.Generator().manual_seed(1)
    img = torch.randint(0, 256, (9, 21, 27, 3), dtype=torch.uint8, generator=g)
    sizes = torch.tensor([[21, 27]]).expand(9, 2)
    for seed in range(4):
        p = op.params(sizes, torch.Generator().manual_seed(seed))
        assert 0 < int(p["on3"].sum()) < 9  # (some samples drew the hue, some not)
        ref = op.apply(img.permute(0, 3, 1, 2).float(), p, sizes, 255.0, True).clamp(0, 255).to(torch.uint8)
        got = A.apply_pixel_ops([op], {"image": img.clone()}, torch.Generator().manual_seed(seed))["image"]
        assert torch.equal(got, ref.permute(0, 2, 3, 1))
    shapes = [(21, 27, 3), (15, 30, 3), (24, 11, 3), (9, 9, 3)]
    flat = torch.randint(0, 256, (sum(h * w * c for h, w, c in shapes),), dtype=torch.uint8, generator=g)
    offsets = torch.tensor([0] + [h * w * c for h, w, c in shapes]).cumsum(0)
    for seed in range(4):
        batch = {"image": flat.clone(), "image_offsets": offsets, "image_shapes": torch.tensor(shapes)}
        out = A.apply_pixel_ops([op], batch, torch.Generator().manual_seed(seed))["image"]
        p = op.params(torch.tensor([s[:2] for s in shapes]), torch.Generator().manual_seed(seed))
        for b, (h, w, c) in enumerate(shapes):
            x = flat[offsets[b]:offsets[b + 1]].view(1, h, w, c).permute(0, 3, 1, 2).float()
            ref = op.apply(x, {k: v[[b]] for k, v in p.items()}, None, 255.0, True).clamp(0, 255).to(torch.uint8)
            assert torch.equal(out[offsets[b]:offsets[b + 1]].view(h, w, c), ref[0].permute(1, 2, 0)), (seed, b)


def test_photometric_distort_runs_saturation_and_hue_on_one_float_copy(monkeypatch):
    """A sample that draws both saturation and hue goes to float once for the two (saturation's whole values
    straight into the hue), with the float stage's very numbers: one copy for the contrast's mean, one for
    saturation + hue."""
    from dsc.transforms import augment as A

    op = A.RandomPhotometricDistort(p=1.0)
    img = torch.randint(0, 256, (1, 21, 27, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(2))
    sizes = torch.tensor([[21, 27]])
    from dsc.transforms import color as C

    copies = []
    real, real_sat = A.contrast_mean_u8, C.saturation_hwc_of
    # (the contrast's mean: each sample's float copy in scratch; saturation + hue: the piece's, in scratch; the
    # loop over pieces runs as plain Python here, where each call is seen)
    monkeypatch.setattr(N, "ENABLED", False)
    monkeypatch.setattr(A, "contrast_mean_u8", lambda x, rows: copies.append(len(rows)) or real(x, rows))
    monkeypatch.setattr(C, "saturation_hwc_of", lambda x, *a: copies.append(1) or real_sat(x, *a))
    for seed in range(3):
        copies.clear()
        got = A.apply_pixel_ops([op], {"image": img.clone()}, torch.Generator().manual_seed(seed))["image"]
        assert copies == [1, 1], seed
        p = op.params(sizes, torch.Generator().manual_seed(seed))
        ref = op.apply(img.permute(0, 3, 1, 2).float(), p, sizes, 255.0, True).clamp(0, 255).to(torch.uint8)
        assert torch.equal(got, ref.permute(0, 2, 3, 1)), seed


def test_random_affine_bilinear_builds_each_grid_without_stacking_planes(monkeypatch):
    """The bilinear warp writes each sample's sampling grid plane by plane from its map (a row and a column
    when the map is axis-aligned, YOLO's translate + scale) instead of stacking two full planes, and
    computes the inside weight only for samples whose source points leave the image; the pixels stay within
    a level of torchvision's affine (the reference above), with and without rotation."""
    from dsc.transforms import resample
    from dsc.transforms.fused import plan_chain

    stacks = []
    real = torch.stack
    monkeypatch.setattr(resample.torch, "stack", lambda *a, **k: stacks.append(1) or real(*a, **k))
    rng = np.random.default_rng(1)
    img = torch.from_numpy(rng.integers(0, 256, (5, 40, 60, 3), dtype=np.uint8))
    for degrees in (0, 20):
        op = T.RandomAffine(degrees, translate=(0.1, 0.1), scale=(0.5, 1.5), interpolation="bilinear", fill=114,
                            size=(32, 48))
        stacks.clear()
        out = T.Compose([op])({"image": img.clone()}, seed=3)["image"]
        n = len(stacks)
        monkeypatch.setattr(resample.torch, "stack", real)
        plan = plan_chain([op], torch.tensor([[40, 60]]).repeat(5, 1), T.batch_generator(3, 0, 0))
        ref = _tv_affine(img, plan.matrices, (114, 114, 114), "bilinear", (32, 48))
        monkeypatch.setattr(resample.torch, "stack", lambda *a, **k: stacks.append(1) or real(*a, **k))
        assert int((out.int() - ref.int()).abs().max()) <= 1, degrees
        assert n <= 2, (degrees, n)  # (the corners' extremes: one batched stack, none per sample)


def test_one_lookup_table_per_sample_maps_bytes_through_pil_point(monkeypatch):
    """RandomPhotometricDistort's brightness and contrast tables (one per sample) map a sample's bytes with
    PIL's point over them as a greyscale image, not numpy's take (which converts every byte to an index
    first); small samples keep the take. The bytes are the table's, exactly."""
    from dsc.transforms import color as C

    g = torch.Generator().manual_seed(4)
    real_copyto = np.copyto
    lut = torch.randint(0, 256, (2, 1, 256), generator=g).float()
    for shape, takes in (((2, 160, 200, 3), 0), ((2, 9, 7, 3), 2)):
        x = torch.randint(0, 256, shape, dtype=torch.uint8, generator=g)
        want = torch.stack([lut[b, 0].long()[x[b].long()] for b in range(2)]).to(torch.uint8)
        calls, copies = [], []
        real = np.take
        monkeypatch.setattr(C.np, "take", lambda *a, **k: calls.append(1) or real(*a, **k))
        monkeypatch.setattr(C.np, "copyto", lambda *a, **k: copies.append(1) or real_copyto(*a, **k))
        x0 = x.clone()
        got = C.apply_lut(x0, lut)
        monkeypatch.setattr(C.np, "take", real)
        assert torch.equal(got, want) and len(calls) == takes, shape
        # the table's bytes pasted by PIL straight into the sample's memory: no tobytes + copy back
        assert got.data_ptr() == x0.data_ptr() and copies == [], shape
    from PIL import Image  # an image PIL copied rather than mapped (readonly unset): the copy back instead

    a = np.arange(24, dtype=np.uint8).reshape(2, 4, 3)
    unmapped = Image.frombytes("L", (12, 2), a.tobytes())
    assert not C._paste_back(unmapped, C.pil_point(unmapped, list(range(255, -1, -1))))
    assert (a == np.arange(24).reshape(2, 4, 3)).all()


@scripted_only
def test_saturation_hue_and_hsv_on_uint8_run_in_place_piece_by_piece(monkeypatch):
    """RandomPhotometricDistort's saturation + hue and RandomHSV on a CPU uint8 sample larger than a piece
    (color.PIECE_PIXELS, shrunk here) run on pieces of rows, in place: no float copy bigger than a piece
    (saturation), none at all for a hue alone, RandomHSV hands back its input's own memory; the numbers
    are the whole-sample float stage's."""
    from dsc.transforms import augment as A
    from dsc.transforms import color as C

    monkeypatch.setattr(C, "PIECE_PIXELS", 1 << 10)
    g = torch.Generator().manual_seed(5)
    img = torch.randint(0, 256, (2, 45, 61, 3), dtype=torch.uint8, generator=g)  # 2745 pixels: 3 pieces
    sizes = torch.tensor([[45, 61]]).expand(2, 2)
    op = A.RandomPhotometricDistort(p=1.0)
    log, pieces = ([], []), []
    real, real_hue, real_hsv = C.saturation_hwc_of, C._hue_shift, C._hsv_jitter_piece
    monkeypatch.setattr(N, "ENABLED", False)  # (the loops over pieces as plain Python: each call is seen)
    monkeypatch.setattr(C, "saturation_hwc_of", lambda v, *a: log[0].append(v[..., 0].numel()) or real(v, *a))
    monkeypatch.setattr(C, "_hue_shift", lambda v, *a: log[1].append(v.dtype) or pieces.append(v) or real_hue(v, *a))
    monkeypatch.setattr(C, "_hsv_jitter_piece", lambda v, *a: pieces.append(v) or real_hsv(v, *a))
    for sat, hue in ((True, False), (False, True), (True, True)):
        p = op.params(sizes, torch.Generator().manual_seed(7))
        p.update(on0=torch.zeros(2, dtype=torch.bool), on1=torch.zeros(2, dtype=torch.bool), on2=torch.full((2,), sat),
                 on3=torch.full((2,), hue), permute=torch.zeros(2, dtype=torch.bool))
        log[0].clear(), log[1].clear(), pieces.clear()
        x = img.clone()
        got = op.apply_u8(x, p, sizes)
        copies, hues = list(log[0]), list(log[1])  # (the float stage below, the reference, makes its own)
        assert got.data_ptr() == x.data_ptr()
        ref = op.apply(img.permute(0, 3, 1, 2).float(), p, sizes, 255.0, True).clamp(0, 255).to(torch.uint8)
        assert torch.equal(got, ref.permute(0, 2, 3, 1)), (sat, hue)
        assert (len(copies) == 6 and max(copies) <= 1 << 10) if sat else copies == [], (sat, hue, copies)
        assert hues == ([torch.float32] * 6 if sat else [torch.uint8] * 6) if hue else hues == [], (sat, hue, hues)
    hsv = A.RandomHSV(0.2, 0.7, 0.4)
    p = hsv.params(sizes, torch.Generator().manual_seed(8))
    x = img.clone()
    got = hsv.apply_u8(x, p, sizes)
    ref = hsv.apply(img.permute(0, 3, 1, 2).float(), p, sizes, 255.0, True).to(torch.uint8)
    assert got.data_ptr() == x.data_ptr() and torch.equal(got, ref.permute(0, 2, 3, 1))
    for piece in pieces:  # each piece dense with its own stride (a whole sample's in front sends the grey's
        assert piece.shape[0] == 1 and piece.stride(0) == piece[0].numel()  # torch.matmul down a ~4x slower path)
    assert len(pieces) >= 6


def test_random_iou_crop_tests_eight_of_torchvision_s_rounds_at_once(monkeypatch):
    """RandomIoUCrop draws and tests ROUNDS_AT_ONCE (8) of torchvision's rounds per set of tensor ops (each
    sample takes its first round that ends it): a sample that can never pass (minimum IoU 0.99 of a small
    box) runs torchvision's 1,000 rounds in 125 draws, and keeps its image; crops stay in range."""
    from dsc.transforms import detection as D

    draws = []
    real = torch.randint
    monkeypatch.setattr(D.torch, "randint", lambda *a, **k: draws.append(1) or real(*a, **k))
    sizes = torch.tensor([[60, 80], [50, 50]])
    boxes = [torch.tensor([[10.0, 10.0, 14.0, 13.0]], dtype=torch.float64)] * 2
    p = T.RandomIoUCrop(sampler_options=[0.99]).params(sizes, torch.Generator().manual_seed(0), boxes=boxes)
    assert len(draws) == 1000 // D.ROUNDS_AT_ONCE
    assert p["h"].tolist() == [60, 50] and p["w"].tolist() == [80, 50] and bool(p["keep"].all())
    draws.clear()
    p = T.RandomIoUCrop().params(sizes.repeat(8, 1), torch.Generator().manual_seed(1), boxes=boxes * 8)
    assert len(draws) <= 3
    assert bool(((p["top"] >= 0) & (p["top"] + p["h"] <= sizes.repeat(8, 1)[:, 0])).all())


def test_random_iou_crop_bounds_its_work_on_box_dense_batches_and_refuses_no_trials(monkeypatch):
    """A batch of many boxes draws fewer rounds at once, so no temporary holds more than ROUND_ELEMENTS (round,
    sample, trial, box) entries (8 rounds of 64 samples x 40 trials x 150 boxes in float64 took 200 MB), still
    up to torchvision's 1,000 rounds; trials=0 (torchvision's loop would never end) is refused."""
    from dsc.errors import ConfigError
    from dsc.transforms import detection as D

    shapes = []
    real = torch.rand
    monkeypatch.setattr(D.torch, "rand", lambda *a, **k: shapes.append(tuple(a[0])) or real(*a, **k))
    B, N = 64, 150
    sizes = torch.tensor([[400, 400]]).repeat(B, 1)
    boxes = [torch.tensor([[20.0 * (i % 19), 20.0 * (i // 19), 20.0 * (i % 19) + 8, 20.0 * (i // 19) + 8]
                           for i in range(N)], dtype=torch.float64)] * B
    T.RandomIoUCrop(sampler_options=[0.99]).params(sizes, torch.Generator().manual_seed(0), boxes=boxes)
    rounds = [s[0] for s in shapes if len(s) == 4]
    assert rounds and max(rounds) * B * 40 * N <= max(D.ROUND_ELEMENTS, B * 40 * N) and sum(rounds) // 2 >= 1000
    with pytest.raises(ConfigError, match="trials must be at least 1"):
        T.RandomIoUCrop(trials=0)


def test_photometric_ops_never_write_into_the_callers_ragged_image():
    """Compose's promise (the caller's pixels are never written into) holds for packed ragged batches too: the
    photometric ops write sample by sample, so they work on a copy (a fixed-size batch already did)."""
    g = torch.Generator().manual_seed(0)
    a = torch.randint(0, 256, (5, 7, 3), dtype=torch.uint8, generator=g)
    b = torch.randint(0, 256, (4, 9, 3), dtype=torch.uint8, generator=g)
    flat = torch.cat([a.reshape(-1), b.reshape(-1)])
    batch = {"image": flat, "image_offsets": torch.tensor([0, a.numel(), a.numel() + b.numel()]),
             "image_shapes": torch.tensor([[5, 7, 3], [4, 9, 3]])}
    keep = flat.clone()
    for op in (T.RandomHSV(), T.RandomPhotometricDistort(p=1.0)):
        out = T.Compose([op])(dict(batch), seed=1)
        assert torch.equal(flat, keep) and out["image"].data_ptr() != flat.data_ptr()
        assert not torch.equal(out["image"], keep)


def test_a_ragged_geometric_stage_in_the_loader_writes_into_the_ring(people):
    """The SSD chain (photometric, zoom-out, IoU crop, flip: samples of several sizes) after the gather: inside
    the Loader its packed output is a buffer of the batch's ring slot, reused batch after batch (a fresh
    batch-sized tensor faulted in every page of zoom-out canvases, every batch: ~500 faults an image on the
    bench's scenes); the batches are those of Compose on the user's batch, and the user's pixels untouched."""
    ops = T.presets.detection("ssd")
    loader = dsc.Loader(people, batch_size=3, transforms=ops, format="dict", seed=4)
    for _ in range(2):
        for got in loader:
            ptrs = {buf.untyped_storage().data_ptr() for slot in loader._ring.slots
                    for name, buf in slot.items() if name.startswith("geometric")}
            assert got["image"].untyped_storage().data_ptr() in ptrs
            del got
    for j, got in enumerate(loader):
        b = people.get_batch(got["index"].tolist())
        before = b["image"].clone()
        want = T.Compose(ops)(b, seed=4, epoch=loader.epoch, batch_index=j)
        assert torch.equal(b["image"], before)
        for k in ("image", "image_offsets", "image_shapes", "boxes", "box_offsets", "mask"):
            assert torch.equal(got[k], want[k]), k


@pytest.mark.parametrize("fmt", ["dict", "torchvision"])
def test_ring_held_ssd_batches_are_the_same_for_any_thread_count_and_after_a_resume(people, fmt):
    """The SSD chain's pixels come from the ring slot's buffers now: batches held (not copied) stay what they
    were (a slot whose batch is held makes another buffer), equal for 0 and 2 threads and after a resume. Two
    epochs of 6 batches each through one Loader's ring of 3 slots: every slot is met again while its earlier
    batches are held."""
    def run(**kw):
        return dsc.Loader(people, batch_size=1, order="random", seed=5, transforms=T.presets.detection("ssd"),
                          format=fmt, prefetch=1, **kw)

    def images(b):
        if fmt == "torchvision":
            return [im.clone() for im in b[0]]
        return [b["image"].clone()] + ([b["image_shapes"].clone()] if "image_shapes" in b else [])

    copied = run(num_threads=0)
    want = []
    for epoch in (0, 1):  # copied as they come
        copied.set_epoch(epoch)
        want += [images(b) for b in copied]
    for threads in (0, 2):
        loader, held = run(num_threads=threads), []
        for epoch in (0, 1):  # every batch of both epochs held, none copied
            loader.set_epoch(epoch)
            held += list(loader)
        assert len(held) == len(want) == 12 and len(loader._ring.slots) == 3
        assert all(torch.equal(x, y) for a, b in zip(held, want) for x, y in zip(images(a), b)), threads
    want = want[:6]
    first = run()
    it = iter(first)
    next(it)
    state = first.state_dict()
    del it
    resumed = run()
    resumed.load_state_dict(state)
    rest = [images(b) for b in resumed]
    assert len(rest) == 5 and all(torch.equal(x, y) for a, b in zip(rest, want[1:]) for x, y in zip(a, b))


@pytest.mark.parametrize("name", ["ssd", "multiscale"])
def test_the_last_geometric_stage_casts_the_torchvision_form_as_it_moves_the_images(people, name):
    """format="torchvision" after a chain that leaves samples at several sizes by crops and flips (SSD's zoom-out
    and IoU crop): the stage writes each image as float32 / 255 as it moves it (the zoom-out's fill as float,
    never as bytes cast by a second pass over the batch): the form's images are views of that stage's float
    ring buffer. A resize's (multiscale) are left to the form's own cast in cache-sized pieces (a cast of each
    resized sample out of cache was slower). Either way equal, value for value, the stage's uint8 output cast
    by the form."""
    from dsc.runtime.batches import torchvision_form

    ops = T.presets.detection(name)
    loader = dsc.Loader(people, batch_size=3, transforms=ops, format="torchvision", seed=4, num_threads=1)
    for j, (images, targets) in enumerate(loader):
        floats = {buf.untyped_storage().data_ptr() for slot in loader._ring.slots for key, buf in slot.items()
                  if key.startswith("geometric") and key.endswith(":float")}
        assert all((im.untyped_storage().data_ptr() in floats) == (name == "ssd") for im in images)
        b = people.get_batch([t["index"] for t in targets])
        want, want_targets = torchvision_form(T.Compose(ops)(b, seed=4, epoch=loader.epoch, batch_index=j),
                                              people.schema)
        assert len(images) == len(want) == 3
        for got, ref in zip(images, want):
            assert got.dtype == torch.float32 and got.shape == ref.shape and torch.equal(got, ref)
        for got, ref in zip(targets, want_targets):
            assert torch.equal(got["boxes"], ref["boxes"])


@pytest.mark.parametrize("fill", [117, (123, 117, 104)])
def test_a_program_run_into_floats_equals_its_uint8_result_divided(fill):
    """fused.run_program with ``divisor``: every program (crops partly or wholly outside the image, a crop inside
    the crop before it, flips, resizes) gives float(uint8 result) / 255 exactly, the fill included."""
    from dsc.transforms.fused import run_program

    x = torch.randint(0, 256, (30, 40, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    d = torch.full((), 255.0)
    f = float(fill) if isinstance(fill, int) else fill
    programs = [
        [("crop", -7, -9, 60, 70, f), ("crop", 3, 5, 40, 50), ("flip", 0, True)],  # zoom-out, IoU crop, flip
        [("crop", -7, -9, 60, 70, f), ("crop", 20, 30, 40, 40), ("flip", 0, False)],  # the crop holds no pixel
        [("crop", -7, -9, 60, 70, f), ("flip", 0, True), ("flip", 1, True)],
        [("crop", 0, 0, 30, 40, f), ("crop", 2, 3, 20, 25), ("flip", 0, True)],  # inside the image
        [("crop", 5, 5, 10, 10, f), ("crop", 2, 3, 20, 25)],  # not inside the crop before it: the general path
        [("resize", 45, 33), ("flip", 0, True)],
        [("flip", 0, True), ("crop", -2, -3, 35, 45, f)],  # a flip before the crop: the general path
    ]
    for program in programs:
        want = torch.empty(_out_shape(program, x), dtype=torch.uint8)
        run_program(x, program, want, False, None)
        got = torch.full(want.shape, -1.0)
        run_program(x, program, got, False, None, divisor=d)
        assert torch.equal(got, want.float().div_(d)), program



def test_a_program_run_into_floats_takes_its_fill_as_the_uint8_path_does():
    """A fill that is not a whole number is the uint8 canvas's (torch.full truncates it), a fill out of 0..255
    is refused as there, and a fill of 3 values on a 1- or 4-channel image is the same ConfigError."""
    from dsc.errors import ConfigError
    from dsc.transforms.fused import run_program

    d = torch.full((), 255.0)
    for fill in (1.5, 2.7):
        for C in (1, 3):
            x = torch.randint(0, 256, (6, 8, C), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
            program = [("crop", -2, -3, 10, 12, fill), ("flip", 0, True)]
            want = torch.empty((10, 12, C), dtype=torch.uint8)
            run_program(x, program, want, False, None)
            got = torch.empty((10, 12, C))
            run_program(x, program, got, False, None, divisor=d)
            assert torch.equal(got, want.float().div_(d)), (fill, C)
    for fill in (-1.0, 300.0):
        x = torch.zeros((6, 8, 3), dtype=torch.uint8)
        with pytest.raises(RuntimeError):
            run_program(x, [("crop", -2, -3, 10, 12, fill)], torch.empty((10, 12, 3)), False, None, divisor=d)
    for C in (1, 4):
        x = torch.zeros((6, 8, C), dtype=torch.uint8)
        for out in (torch.empty((10, 12, C), dtype=torch.uint8), torch.empty((10, 12, C))):
            with pytest.raises(ConfigError, match="a fill of 3 values"):
                run_program(x, [("crop", -2, -3, 10, 12, (123, 117, 104))], out, False, None,
                            divisor=None if out.dtype == torch.uint8 else d)

def _out_shape(program, x):
    h, w = x.shape[:2]
    for step in program:
        if step[0] == "crop":
            h, w = step[3], step[4]
        elif step[0] == "resize":
            h, w = step[1], step[2]
    return (h, w, x.shape[2])
