"""The reference training recipes (issue 32): photometric and auto-augment ops against references written
here from torchvision's documented formulas (and PIL where torchvision follows it), their sampling
distributions, MixUp/CutMix, the detection geometric ops and Mosaic keeping boxes and masks aligned, the
presets through the Loader (same batches for any thread count and after a resume)."""
import colorsys
import math

import numpy as np
import pytest
import torch
from PIL import Image, ImageEnhance, ImageOps

import dsc
from dsc import transforms as T
from dsc.transforms import augment as A, color as C
from dsc.synthetic import detection_scenes, write_coco


@pytest.fixture(scope="module")
def fixed(scenes_compiled):
    return scenes_compiled(size=(48, 64), resize="stretch")


@pytest.fixture(scope="module")
def detmask(tmp_path_factory):
    """Ragged detection scenes with a semantic mask (label + 1 per box, crowds the ignore index)."""
    root = tmp_path_factory.mktemp("recipes")
    scenes = detection_scenes(10, seed=5, size_range=(70, 140))
    ann, images = write_coco(root / "coco", scenes, segmentation=True)
    dsc.compile_coco(ann, images, root / "ds", masks="semantic", progress=False)
    return dsc.open(root / "ds"), scenes


def images(n=4, h=23, w=31, seed=0):
    """uint8 (n, h, w, 3) with smooth and noisy parts (every code path of the colour ops)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w]
    base = np.stack([xx * 255 // w, yy * 255 // h, (xx + yy) * 127 // (h + w)], -1)
    noise = rng.integers(0, 256, (n, h, w, 3))
    out = np.where(rng.random((n, h, w, 1)) < 0.5, base[None], noise).astype(np.uint8)
    return torch.from_numpy(out)


def run_fn(fn, img, *args):
    """A color.py function on a uint8 (n, h, w, 3) batch, back to uint8 (n, h, w, 3)."""
    x = img.permute(0, 3, 1, 2).float()
    return fn(x, *args, 255.0, True).clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1)


def gray_ref(a):
    a = a.astype(np.float64)
    return a[..., 0] * 0.2989 + a[..., 1] * 0.587 + a[..., 2] * 0.114


def assert_close(got, ref, tol=1):
    d = np.abs(np.asarray(got, np.int64) - np.asarray(ref, np.int64))
    assert d.max() <= tol, f"max difference {d.max()} grey levels"


# ---------------------------------------------------------------------------------------------- fidelity
@pytest.mark.parametrize("f", [0.0, 0.37, 1.0, 1.8])
def test_brightness_contrast_saturation_match_the_documented_blends(f):
    img = images()
    a = img.numpy().astype(np.float64)
    ff = torch.full((len(img),), f)
    # adjust_brightness: blend with black; uint8 truncates
    assert_close(run_fn(C.brightness, img, ff), np.trunc(np.clip(a * f, 0, 255)))
    # adjust_contrast: blend with the mean of the floored grey image
    mean = np.floor(gray_ref(a)).mean(axis=(1, 2))[:, None, None, None]
    assert_close(run_fn(C.contrast, img, ff), np.trunc(np.clip(f * a + (1 - f) * mean, 0, 255)))
    # adjust_saturation: blend with the floored grey image
    g = np.floor(gray_ref(a))[..., None]
    assert_close(run_fn(C.saturation, img, ff), np.trunc(np.clip(f * a + (1 - f) * g, 0, 255)))


@pytest.mark.parametrize("f", [-0.5, -0.21, 0.05, 0.33, 0.5])
def test_hue_is_the_hsv_round_trip(f):
    img = images(2, 9, 11)
    out = run_fn(C.hue, img, torch.full((2,), f)).numpy()
    for n in range(2):
        for y in range(9):
            for x in range(11):
                r, g, b = (v / 255 for v in img[n, y, x].tolist())
                h, s, v = colorsys.rgb_to_hsv(r, g, b)
                ref = [int(c * 255.999) for c in colorsys.hsv_to_rgb((h + f) % 1.0, s, v)]
                assert_close(out[n, y, x], ref)


def test_grayscale_weights():
    img = images()
    out = run_fn(lambda x, b, i: C.to_grayscale(x, i), img)
    ref = np.trunc(gray_ref(img.numpy()))
    for c in range(3):
        assert_close(out[..., c], ref)


@pytest.mark.parametrize("ks,sigma", [((3, 3), 0.8), ((5, 7), 1.7), ((9, 9), 3.0)])
def test_gaussian_blur_kernel_and_reflect_padding(ks, sigma):
    img = images(2, 20, 25)
    out = run_fn(lambda x, b, i: C.gaussian_blur(x, ks, torch.tensor([[sigma, sigma]] * 2), b, i), img).numpy()
    kx, ky = ks

    def kern(k):
        t = np.linspace(-(k - 1) / 2, (k - 1) / 2, k)
        p = np.exp(-0.5 * (t / sigma) ** 2)
        return p / p.sum()
    k2 = np.outer(kern(ky), kern(kx))
    for n in range(2):
        a = np.pad(img[n].numpy().astype(np.float64), ((ky // 2,) * 2, (kx // 2,) * 2, (0, 0)), mode="reflect")
        ref = np.zeros((20, 25, 3))
        for dy in range(ky):
            for dx in range(kx):
                ref += k2[dy, dx] * a[dy:dy + 20, dx:dx + 25]
        assert_close(out[n], np.round(ref))


def test_pil_matched_ops_posterize_solarize_invert_equalize_autocontrast_sharpness():
    """torchvision documents these as PIL's ImageOps / ImageEnhance (on uint8 equal, sharpness within 1)."""
    img = images(3, 30, 40)
    for bits in (1, 3, 6, 8):
        out = run_fn(C.posterize, img, torch.full((3,), bits))
        for n in range(3):
            assert_close(out[n], np.asarray(ImageOps.posterize(Image.fromarray(img[n].numpy()), bits)), 0)
    for thr in (0, 77, 128, 255):
        out = run_fn(C.solarize, img, torch.full((3,), float(thr)))
        for n in range(3):
            assert_close(out[n], np.asarray(ImageOps.solarize(Image.fromarray(img[n].numpy()), thr)), 0)
    out = run_fn(C.invert, img)
    eq = run_fn(C.equalize, img)
    ac = run_fn(C.autocontrast, img)
    low = (img // 3 + 40).to(torch.uint8)  # a narrow range for autocontrast to stretch
    ac_low = run_fn(C.autocontrast, low)
    for n in range(3):
        pil = Image.fromarray(img[n].numpy())
        assert_close(out[n], np.asarray(ImageOps.invert(pil)), 0)
        assert_close(eq[n], np.asarray(ImageOps.equalize(pil)), 0)
        assert_close(ac[n], np.asarray(ImageOps.autocontrast(pil)), 1)
        assert_close(ac_low[n], np.asarray(ImageOps.autocontrast(Image.fromarray(low[n].numpy()))), 1)
    for f in (0.0, 0.5, 1.7):
        sh = run_fn(C.sharpness, img, torch.full((3,), f))
        for n in range(3):
            assert_close(sh[n], np.asarray(ImageEnhance.Sharpness(Image.fromarray(img[n].numpy())).enhance(f)), 1)


def affine_ref(img, angle, translate, scale, shear, center=None):
    """Nearest affine from the forward matrix T C R S SHy SHx C^-1 (torchvision's docstring), inverted with
    numpy, sampled at output pixel centres; 0 outside."""
    h, w = img.shape[:2]
    cx, cy = (w * 0.5, h * 0.5) if center is None else center
    a, sx, sy = (math.radians(v) for v in (angle, *shear))
    R = np.array([[math.cos(a), -math.sin(a), 0], [math.sin(a), math.cos(a), 0], [0, 0, 1]])
    S = np.diag([scale, scale, 1.0])
    SHx = np.array([[1, -math.tan(sx), 0], [0, 1, 0], [0, 0, 1]])
    SHy = np.array([[1, 0, 0], [-math.tan(sy), 1, 0], [0, 0, 1]])
    Cm = np.array([[1, 0, cx], [0, 1, cy], [0, 0, 1]])
    Tm = np.array([[1, 0, translate[0]], [0, 1, translate[1]], [0, 0, 1]])
    inv = np.linalg.inv(Tm @ Cm @ R @ S @ SHy @ SHx @ np.linalg.inv(Cm))
    out = np.zeros_like(img)
    for y in range(h):
        for x in range(w):
            sx_, sy_, _ = inv @ np.array([x + 0.5, y + 0.5, 1.0])
            i, j = int(math.floor(sy_)), int(math.floor(sx_))
            if 0 <= i < h and 0 <= j < w:
                out[y, x] = img[i, j]
    return out


@pytest.mark.parametrize("name,mag", [("Rotate", 23.3), ("Rotate", -61.0), ("ShearX", 0.27), ("ShearY", -0.41),
                                      ("TranslateX", 7.6), ("TranslateY", -5.2)])
def test_auto_augment_geometric_ops_match_the_affine_formula(name, mag):
    img = images(1, 21, 27)
    out = A.apply_named(name, img.permute(0, 3, 1, 2).float(), torch.tensor([mag]), 255.0, True, "nearest")
    out = out.to(torch.uint8).permute(0, 2, 3, 1)[0].numpy()
    deg = math.degrees(math.atan(mag))
    args = {"Rotate": dict(angle=-mag, translate=(0, 0), scale=1, shear=(0, 0)),  # rotate(a) = affine(-a)
            "ShearX": dict(angle=0, translate=(0, 0), scale=1, shear=(deg, 0), center=(0, 0)),
            "ShearY": dict(angle=0, translate=(0, 0), scale=1, shear=(0, deg), center=(0, 0)),
            "TranslateX": dict(angle=0, translate=(int(mag), 0), scale=1, shear=(0, 0)),
            "TranslateY": dict(angle=0, translate=(0, int(mag)), scale=1, shear=(0, 0))}[name]
    ref = affine_ref(img[0].numpy(), **args)
    same = (np.abs(out.astype(int) - ref.astype(int)).max(2) <= 1).mean()
    assert same > 0.98, f"{name}: {same:.3f} of the pixels agree"  # only rounding ties may differ


def test_random_erasing_fills_exactly_its_window():
    img = images(64, 30, 40)
    op = T.RandomErasing(p=1.0, value=(10, 20, 30))
    gen = torch.Generator().manual_seed(3)
    p = op.params(torch.tensor([[30, 40]]).expand(64, 2), torch.Generator().manual_seed(3))
    out = A.apply_pixel_ops([op], {"image": img.clone()}, gen)["image"]
    for n in range(64):
        t, l, h, w = p["box"][n].tolist()
        ref = img[n].clone()
        if p["on"][n]:
            ref[t:t + h, l:l + w] = torch.tensor([10, 20, 30], dtype=torch.uint8)
            assert 0 < h < 30 and 0 < w < 40
        assert torch.equal(out[n], ref)
    frac = (p["box"][:, 2] * p["box"][:, 3]).double() / 1200
    assert float(frac.min()) >= 0.015 and float(frac.max()) <= 0.34  # scale=(0.02, 0.33), up to rounding


# ---------------------------------------------------------------------------------------------- sampling
def test_sampling_distributions():
    B = 6000
    sizes = torch.tensor([[100, 200]]).expand(B, 2)
    g = lambda s: torch.Generator().manual_seed(s)  # noqa: E731
    cj = T.ColorJitter(brightness=0.4, contrast=(0.5, 1.5), hue=0.1).params(sizes, g(0))
    qs = np.array([0.1, 0.5, 0.9])
    assert np.allclose(np.quantile(cj["f0"].numpy(), qs), 0.6 + 0.8 * qs, atol=0.03)
    assert np.allclose(np.quantile(cj["f3"].numpy(), qs), -0.1 + 0.2 * qs, atol=0.01)
    first = np.bincount(cj["order"][:, 0].numpy(), minlength=4) / B  # a uniform permutation
    assert np.allclose(first, 0.25, atol=0.03) and (cj["order"].sort(1).values == torch.arange(4)).all()
    assert abs(float(T.RandomGrayscale(0.1).params(sizes, g(1))["on"].double().mean()) - 0.1) < 0.015
    ta = T.TrivialAugmentWide().params(sizes, g(2))
    assert np.allclose(np.bincount(ta["ops"][:, 0].numpy(), minlength=14) / B, 1 / 14, atol=0.015)
    rot = ta["ops"][:, 0] == T.TrivialAugmentWide.names.index("Rotate")
    mags = ta["mag"][rot, 0].abs()  # 31 bins over 0..135 degrees, uniform, sign 1/2
    assert float(mags.max()) <= 135 and abs(float(mags.mean()) - 67.5) < 6
    assert abs(float((ta["mag"][rot, 0] < 0).double().mean()) - 0.5) < 0.08
    tx = ta["ops"][:, 0] == T.TrivialAugmentWide.names.index("TranslateX")
    assert float(ta["mag"][tx, 0].abs().max()) <= 32
    ra = T.RandAugment(num_ops=2, magnitude=9).params(sizes, g(3))
    assert ra["ops"].shape == (B, 2)
    rr = ra["ops"] == T.RandAugment.names.index("Rotate")
    assert torch.allclose(ra["mag"][rr].abs(), torch.tensor(30.0 * 9 / 30, dtype=torch.float64))
    ttx = ra["ops"] == T.RandAugment.names.index("TranslateX")  # 150/331 of the width at bin 9 of 31
    assert torch.allclose(ra["mag"][ttx].abs(), torch.tensor(150 / 331 * 200 * 9 / 30, dtype=torch.float64))
    aa = T.AutoAugment().params(sizes, g(4))
    post = aa["ops"][:, 0] == T.AutoAugment.names.index("Posterize")
    assert set(aa["mag"][post, 0].tolist()) <= {4.0, 5.0, 6.0}  # bins 8, 7, 6 of 8 - round(i / 2.25)
    am = T.AugMix().params(sizes, g(5))
    assert torch.allclose(am["m0"] + am["w"].sum(1), torch.ones(B, dtype=torch.float64))
    assert abs(float(am["m0"].mean()) - 0.5) < 0.02  # Dirichlet(1, 1): uniform
    lam = C.beta(g(6), 0.2, 0.2, 20000)  # MixUp's Beta(0.2, 0.2): mean 1/2, variance ab/((a+b)^2 (a+b+1)) = 0.1786
    assert abs(float(lam.mean()) - 0.5) < 0.01 and abs(float(lam.var()) - 0.25 / 1.4) < 0.01
    gm = C.gamma(g(7), torch.full((20000,), 3.0))
    assert abs(float(gm.mean()) - 3) < 0.05 and abs(float(gm.var()) - 3) < 0.15
    er = T.RandomErasing(p=0.5).params(sizes, g(8))
    assert abs(float(er["on"].double().mean()) - 0.5) < 0.03
    hsv = T.RandomHSV().params(sizes, g(9))["r"]
    assert float((hsv - 1).abs().max(0).values[0]) <= 0.015 and abs(float(hsv[:, 1].mean()) - 1) < 0.03
    sj = T.ScaleJitter((64, 64)).params(sizes, g(10))
    assert np.allclose(np.quantile(sj.numpy(), qs), 0.1 + 1.9 * qs, atol=0.06)
    ss = T.RandomShortestSize([10, 20, 30]).params(sizes, g(11))
    assert np.allclose(np.bincount(ss.long().numpy())[[10, 20, 30]] / B, 1 / 3, atol=0.03)


def test_photometric_ops_draw_per_sample_and_touch_only_images(detmask):
    ds, _ = detmask
    b = ds.get_batch(range(6))
    ref = {k: v.clone() for k, v in b.items()}
    out = T.Compose([T.ColorJitter(0.5, 0.5, 0.5, 0.2), T.RandomGrayscale(0.5), T.GaussianBlur(3),
                     T.RandomPhotometricDistort(p=1.0), T.RandomHSV()])(b, seed=1)
    for k in ref:
        if k != "image":
            assert torch.equal(out[k], ref[k]), k
    assert out["image"].shape == ref["image"].shape and not torch.equal(out["image"], ref["image"])
    with pytest.raises(dsc.ConfigError, match="auto-augment"):
        T.Compose([T.TrivialAugmentWide()])(ds.get_batch(range(2)))


def test_batched_ops_equal_one_sample_at_a_time(fixed):
    """A batch run at once equals its samples run one by one (ragged path) with the same draws."""
    b = fixed.get_batch(range(8))
    for op in (T.ColorJitter(0.4, 0.4, 0.4, 0.1), T.TrivialAugmentWide(), T.RandAugment(), T.AutoAugment(),
               T.AugMix(), T.RandomErasing(1.0), T.RandomPhotometricDistort(p=1.0), T.GaussianBlur(5)):
        whole = A.apply_pixel_ops([op], {"image": b["image"].clone()}, torch.Generator().manual_seed(2))["image"]
        packed = {"image": b["image"].clone().reshape(-1), "image_offsets": torch.arange(9) * 48 * 64 * 3,
                  "image_shapes": torch.tensor([[48, 64, 3]] * 8)}
        one = A.apply_pixel_ops([op], packed, torch.Generator().manual_seed(2))["image"].view(8, 48, 64, 3)
        assert (whole.int() - one.int()).abs().max() <= 1, op


# ---------------------------------------------------------------------------------------------- MixUp / CutMix
def test_mixup_and_cutmix_semantics(fixed):
    b = fixed.get_batch(range(8))
    x = b["image"].permute(0, 3, 1, 2).float()
    y = b["label"].clone()
    gen = torch.Generator().manual_seed(5)
    lam = float(C.beta(torch.Generator().manual_seed(5), 0.4, 0.4)[0])
    out = T.MixUp(0.4, num_classes=3)({"image": x.clone(), "label": y.clone()}, gen)
    assert torch.allclose(out["image"], lam * x + (1 - lam) * x.roll(1, 0), atol=1e-4)
    onehot = torch.nn.functional.one_hot(y, 3).float()
    assert torch.allclose(out["label"], lam * onehot + (1 - lam) * onehot.roll(1, 0))
    sm = T.MixUp(0.4, num_classes=3, label_smoothing=0.1)({"image": x.clone(), "label": y.clone()},
                                                           torch.Generator().manual_seed(5))["label"]
    assert torch.allclose(sm, out["label"] * 0.9 + 0.1 / 3) and torch.allclose(sm.sum(1), torch.ones(8))
    cm = T.CutMix(1.0, num_classes=3)({"image": x.clone(), "label": y.clone()}, torch.Generator().manual_seed(6))
    changed = (cm["image"] != x).any(1)  # the pasted box: a rectangle from the rolled batch
    took = (cm["image"] == x.roll(1, 0)).all(1)
    assert (changed <= took).all()
    area = float(changed.any(0).double().mean())
    w_self = cm["label"][torch.arange(8), y]
    same = y == y.roll(1, 0)
    assert torch.allclose(w_self[~same], torch.full_like(w_self[~same], 1 - area), atol=0.03) if (~same).any() else True
    with pytest.raises(dsc.ConfigError, match="num_classes"):
        T.MixUp()({"image": x.clone(), "label": y.clone()}, gen)
    # in a Loader: C from the dataset's classes, the same mixes for any thread count
    chain = [T.RandomResizedCrop(32), T.ToFloat(), T.RandomChoice([T.MixUp(0.2), T.CutMix(1.0)])]
    runs = [[bb["label"].clone() for bb in dsc.Loader(fixed, batch_size=8, seed=3, transforms=chain, num_threads=n)]
            for n in (0, 2)]
    assert runs[0][0].shape == (8, 3) and all(torch.equal(a, c) for a, c in zip(*runs))


# ---------------------------------------------------------------------------------------------- geometry
def check_aligned(out, covered=True):
    """Every box frames its mask: inside a box (shrunk by 1) the mask holds one value (its class + 1, or
    the ignore index for a crowd); ``covered``: every object pixel of the mask lies inside a box of its value
    (not after RandomIoUCrop, which drops the boxes whose centre it cut off, as torchvision does)."""
    from dsc.runtime.batches import sample_pixels

    o = out["box_offsets"].tolist()
    masks = sample_pixels(out, "mask")
    checked = 0
    for k in range(len(o) - 1):
        m = masks[k].numpy().astype(int)
        H, W = m.shape
        boxes = out["boxes"][o[k]:o[k + 1]].numpy()
        labels = out["labels"][o[k]:o[k + 1]].numpy()
        crowd = out["iscrowd"][o[k]:o[k + 1]].numpy()
        assert ((boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])).all()
        assert (boxes >= 0).all() and (boxes[:, [0, 2]] <= W).all() and (boxes[:, [1, 3]] <= H).all()
        for (x0, y0, x1, y1), lab, cr in zip(boxes, labels, crowd):
            ya, yb, xa, xb = int(math.ceil(y0)) + 1, int(y1) - 1, int(math.ceil(x0)) + 1, int(x1) - 1
            inner = m[ya:max(ya, yb), xa:max(xa, xb)]  # (a sliver under 1 px: nothing inside; never a wrapped index)
            if inner.size:
                assert (inner == (255 if cr else lab + 1)).all(), "a box does not frame its mask"
                checked += 1
        ys, xs = np.nonzero((m > 0) & (m < 255))
        ok = np.zeros(len(ys), bool)
        for (x0, y0, x1, y1), lab in zip(boxes, labels):
            ok |= (xs + 0.5 >= x0 - 1) & (xs + 0.5 <= x1 + 1) & (ys + 0.5 >= y0 - 1) & (ys + 0.5 <= y1 + 1) & \
                (m[ys, xs] == lab + 1)
        assert ok.all() or not covered, "a mask's object lies outside every box"
    return checked


@pytest.mark.parametrize("chain", [
    lambda: [T.ScaleJitter((96, 96), scale_range=(0.3, 1.5)), T.FixedSizeCrop((96, 96)), T.RandomHorizontalFlip()],
    lambda: [T.RandomShortestSize([40, 60, 80], 120), T.RandomHorizontalFlip()],
    lambda: [T.RandomPhotometricDistort(), T.RandomZoomOut(fill=117, p=1.0), T.RandomIoUCrop(),
             T.RandomHorizontalFlip()],
    lambda: [T.RandomShortestSize(list(range(40, 100))), T.RandomHorizontalFlip(), T.RandomCrop(64, pad_if_needed=True)],
    lambda: [T.RandomAffine(degrees=0, translate=(0.1, 0.1), scale=(0.6, 1.4), size=(80, 80))],
    lambda: [T.Mosaic(64), T.RandomAffine(translate=(0.1, 0.1), scale=(0.5, 1.5), fill=114, size=(64, 64)),
             T.RandomHSV(), T.RandomHorizontalFlip()],
], ids=["lsj", "multiscale", "ssd", "segmentation", "affine", "yolo"])
def test_boxes_and_masks_stay_aligned_through_every_detection_op(detmask, chain):
    ds, _ = detmask
    checked = 0
    for seed in range(4):
        out = T.Compose(chain())(ds.get_batch(range(len(ds))), seed=seed)
        assert len(out["box_offsets"]) == len(ds) + 1
        checked += check_aligned(out, covered=not any(isinstance(op, T.RandomIoUCrop) for op in chain()))
    assert checked > 10


def test_iou_crop_and_zoom_out_follow_torchvision(detmask):
    ds, _ = detmask
    b = ds.get_batch(range(len(ds)))
    sizes = torch.tensor([list(s[:2]) for s in b["image_shapes"].tolist()])
    o = b["box_offsets"].tolist()
    per = [b["boxes"][o[k]:o[k + 1]].double() for k in range(len(ds))]
    op = T.RandomIoUCrop()
    for seed in range(5):
        p = op.params(sizes, torch.Generator().manual_seed(seed), boxes=per)
        for k in range(len(ds)):
            t, l, h, w = (int(p[n][k]) for n in ("top", "left", "h", "w"))
            H, W = sizes[k].tolist()
            assert 0 <= t and t + h <= H and 0 <= l and l + w <= W
            if (h, w) != (H, W) and len(per[k]):
                assert 0.3 * H - 1 <= h and 0.3 * W - 1 <= w and 0.5 <= w / h <= 2.0
    zo = T.RandomZoomOut(side_range=(1.0, 4.0), p=1.0).params(sizes[:1].repeat(2000, 1),
                                                              torch.Generator().manual_seed(0))
    r = (zo[3] / sizes[0, 1]).numpy()
    assert 1 <= r.min() and r.max() <= 4 and abs(np.median(r) - 2.5) < 0.1


def test_size_keeping_chains_on_mixed_sizes_need_no_fixed_size_op(detmask):
    ds, _ = detmask
    chain = [T.RandomHorizontalFlip(), T.ColorJitter(0.3, 0.3, 0.3, 0.05)]
    images_, targets = next(iter(dsc.Loader(ds, batch_size=5, transforms=chain, format="torchvision")))
    assert isinstance(images_, list) and [tuple(i.shape[1:]) for i in images_] == \
        [tuple(ds[i]["image"].shape[:2]) for i in range(5)]
    assert all(t["mask"].shape == i.shape[1:] for t, i in zip(targets, images_))
    for form in ("list", "padded"):  # the Loader gathers packed boxes for the transforms, then makes the form
        b = next(iter(dsc.Loader(ds, batch_size=5, boxes=form, transforms=chain)))
        assert ("targets" in b) == (form == "list") and ("box_mask" in b) == (form == "padded")
        assert len(b["image_offsets"]) == 6
    flipped = T.Compose([T.RandomHorizontalFlip(p=1.0)])(ds.get_batch(range(3)))
    from dsc.runtime.batches import sample_pixels
    assert all(torch.equal(v, ds[k]["image"].flip(1)) for k, v in enumerate(sample_pixels(flipped, "image")))


# ---------------------------------------------------------------------------------------------- presets, Loader
def _resumed_after_one_batch(run, **kw):
    """``run(**kw)``, a Loader resumed from the state a ``run()`` Loader saved after its first batch."""
    first = run()
    it = iter(first)
    next(it)
    state = first.state_dict()
    del it
    second = run(**kw)
    second.load_state_dict(state)
    return second


@pytest.mark.parametrize("name", ["ta_wide", "ra", "augmix", "autoaugment", "imagenet"])
def test_classification_presets_same_batches_any_threads_and_after_resume(fixed, name):
    ops = T.presets.classification({"imagenet": None, "autoaugment": "imagenet"}.get(name, name), crop_size=32,
                                   random_erase=0.5, mixup=0.2, cutmix=1.0)
    run = lambda **kw: dsc.Loader(fixed, batch_size=8, order="random", seed=4, transforms=ops, **kw)  # noqa: E731
    a = [(b["image"].clone(), b["label"].clone()) for b in run()]
    assert a[0][0].shape == (8, 3, 32, 32) and a[0][1].shape == (8, 3)
    b = [(b["image"].clone(), b["label"].clone()) for b in run(num_threads=0)]
    assert all(torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]) for x, y in zip(a, b))
    rest = [bb["image"].clone() for bb in _resumed_after_one_batch(run, prefetch=1)]
    assert all(torch.equal(x, y[0]) for x, y in zip(rest, a[1:]))


def test_detection_presets_through_the_loader(detmask):
    ds, _ = detmask
    for name in T.presets.DETECTION:
        ops = T.presets.detection(name, size=96)
        imgs, targets = next(iter(dsc.Loader(ds, batch_size=4, transforms=ops, format="torchvision", seed=1)))
        assert len(targets) == 4 and all(t["boxes"].shape[1] == 4 for t in targets)
        if name == "lsj":
            assert imgs.shape == (4, 3, 96, 96)
    for ops in (T.presets.detection("ssd"), T.presets.yolo(64)):  # same batches for any thread count, and resumed
        run = lambda **kw: dsc.Loader(ds, batch_size=3, order="random", seed=7, transforms=ops, **kw)  # noqa: E731
        a = [(b["boxes"].clone(), b["box_offsets"].clone()) for b in run()]
        b = [(b["boxes"].clone(), b["box_offsets"].clone()) for b in run(num_threads=0)]
        assert all(torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]) for x, y in zip(a, b))
        assert all(torch.equal(x["boxes"], y[0]) for x, y in zip(_resumed_after_one_batch(run), a[1:]))
    assert T.presets.yolo(64)[0].size == 64 and len(T.presets.segmentation()) == 5
    with pytest.raises(dsc.ConfigError, match="detection preset"):
        T.presets.detection("nope")
    with pytest.raises(dsc.ConfigError, match="auto_augment"):
        T.presets.classification("nope")


def test_the_classification_preset_refuses_what_it_would_silently_drop():
    """Negative probabilities were silently off (while random_erase=2 was refused); label_smoothing without
    MixUp/CutMix smoothed nothing: torchvision's reference puts it in the loss, and the error says so."""
    for kw in ({"mixup": -1}, {"cutmix": -1}, {"random_erase": -0.1}, {"hflip": -0.5}, {"label_smoothing": -0.1}):
        name = next(iter(kw))
        with pytest.raises(dsc.ConfigError, match=f"classification preset: {name} is a number >= 0"):
            T.presets.classification("ra", **kw)
    with pytest.raises(dsc.ConfigError, match=r"torch.nn.CrossEntropyLoss\(label_smoothing=0.1\)"):
        T.presets.classification("ta_wide", label_smoothing=0.1)
    ops = T.presets.classification("ta_wide", mixup=0.2, label_smoothing=0.1, num_classes=3)
    assert isinstance(ops[-1], T.MixUp) and ops[-1].label_smoothing == 0.1


def test_dsc_bench_runs_every_recipe_by_name(fixed, detmask):
    from click.testing import CliRunner

    from dsc.cli import BENCH_RECIPES, main

    assert BENCH_RECIPES == list(T.presets.RECIPES)
    r = CliRunner().invoke(main, ["bench", str(fixed.path), "--batch-size", "8", "--epochs", "1", "--recipe", "ta_wide"])
    assert r.exit_code == 0 and "Traceback" not in r.output, r.output
    assert "TrivialAugmentWide" in r.output and "recipe (batched" in r.output
    r = CliRunner().invoke(main, ["bench", str(detmask[0].path), "--batch-size", "2", "--epochs", "1", "--recipe",
                                  "det-ssd"])
    assert r.exit_code == 0 and "RandomIoUCrop" in r.output, r.output
    r = CliRunner().invoke(main, ["bench", str(fixed.path), "--batch-size", "8", "--epochs", "1", "--recipe", "det-ssd"])
    assert r.exit_code == 1 and "the batch has none (a detection dataset has them" in r.output, r.output
    from dsc.bench import recipe_header  # (the segmentation preset's hundreds of min sizes, summarised)
    seg = recipe_header("segmentation")
    assert len(seg) < 400 and "RandomShortestSize(min_size=[260, 261, ..., " in seg and " values)" in seg, seg
    # the per-image baseline: a decoded JPEG through the per-image part, MixUp/CutMix in the collate
    from dsc.bench import _PerImageRecipe, _collate, source_paths

    ops = T.presets.classification("ta_wide", crop_size=32, random_erase=0.1, mixup=0.2, cutmix=1.0, num_classes=3)
    per = _PerImageRecipe(fixed, source_paths(fixed), ops)
    batch = _collate(ops)([per[i] for i in range(4)])
    assert batch["image"].shape == (4, 3, 32, 32) and batch["label"].shape == (4, 3)
    det = _PerImageRecipe(detmask[0], source_paths(detmask[0]), T.presets.detection("ssd"))
    item = det[1]
    # (ending as DetectionPresetTrain does: ToDtype(torch.float, scale=True) on the (C, H, W) image)
    assert item["image"].shape[0] == 3 and item["image"].dtype == torch.float32 and len(item["box_offsets"]) == 2
    assert 0 <= float(item["image"].min()) and float(item["image"].max()) <= 1


def test_the_per_image_baseline_pairs_each_sample_with_its_own_file(tmp_path):
    """With a source file gone since the compile, the per-image baseline still gives each sample its own
    file (it gave every later sample the next sample's JPEG with this one's boxes)."""
    from dsc.bench import _PerImageRecipe, source_files

    scenes = detection_scenes(6, seed=2, size_range=(40, 60))
    ann, images = write_coco(tmp_path / "coco", scenes)
    dsc.compile_coco(ann, images, tmp_path / "ds", progress=False, workers=1)
    ds = dsc.open(tmp_path / "ds")
    gone = sorted(images.iterdir())[1]
    gone.unlink()
    rows: list[int] = []
    paths, missing = source_files(ds, rows=rows)
    assert missing == [str(gone)] and len(rows) == len(paths) == len(ds) - 1
    per = _PerImageRecipe(ds, paths, [T.RandomHorizontalFlip(p=0.0)], rows)
    for i, (row, path) in enumerate(zip(rows, paths)):
        assert path.endswith(ds.keys[row])
        h, w = per[i]["image"].shape[-2:]
        assert (h, w) == tuple(ds[row]["image"].shape[:2])
