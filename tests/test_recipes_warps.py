"""The auto-augment family's warps on the CPU without grid_sample (dsc/transforms/warp_gather.py): shears as
2-tap line blends (bilinear, within a grey level of the exact formula, equal but at rounding ties), every
nearest warp as a gather (grid_sample's very pixels); ops at magnitudes that leave the image as it is are
skipped; AugMix's chains run on groups of samples. The uint8 and float CPU paths give the same numbers
(test_recipes_uint8.py)."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from dsc import transforms as T
from dsc.transforms import augment as A
from dsc.transforms import color as C
from dsc.transforms import warp_gather as G

from test_recipes import images
from test_recipes_uint8 import batch, float_stage


@pytest.fixture
def no_grid_sample(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("grid_sample called")
    monkeypatch.setattr(F, "grid_sample", refuse)
    monkeypatch.setattr(C.F, "grid_sample", refuse)
    monkeypatch.setattr(A.F, "grid_sample", refuse)


def bilinear_ref(img: np.ndarray, M: np.ndarray, fill) -> np.ndarray:
    """float64 (H, W, C): each output pixel centre through the output -> input map M (pixel corners at
    integers), sampled bilinearly with 0 outside (torchvision's tensor affine); ``fill``: its mask plane,
    (v - fill) mask + fill."""
    H, W, Cn = img.shape
    ys, xs = np.mgrid[0:H, 0:W] + 0.5
    sx = M[0, 0] * xs + M[0, 1] * ys + M[0, 2] - 0.5
    sy = M[1, 0] * xs + M[1, 1] * ys + M[1, 2] - 0.5
    x0, y0 = np.floor(sx), np.floor(sy)
    out = np.zeros((H, W, Cn))
    mask = np.zeros((H, W, 1))
    for dy in (0, 1):
        for dx in (0, 1):
            xx, yy = x0 + dx, y0 + dy
            wgt = (1 - np.abs(sx - xx)) * (1 - np.abs(sy - yy))
            ok = (xx >= 0) & (xx < W) & (yy >= 0) & (yy < H)
            v = img[np.clip(yy, 0, H - 1).astype(int), np.clip(xx, 0, W - 1).astype(int)]
            out += np.where(ok[..., None], v * wgt[..., None], 0.0)
            mask += np.where(ok, wgt, 0.0)[..., None]
    if fill is not None:
        f = np.broadcast_to(np.asarray(fill, dtype=np.float64), (Cn,))
        out = (out - f) * mask + f
    return out


@pytest.mark.parametrize("name", ["ShearX", "ShearY"])
@pytest.mark.parametrize("fill", [None, 114, (7, 8, 250)])
def test_shears_are_the_bilinear_formula_without_grid_sample(name, fill, no_grid_sample):
    img = images(6, 23, 31)
    mag = torch.tensor([0.3, -0.3, 0.99, -0.99, 0.05, 0.61], dtype=torch.float64)
    M = A._geometric_matrix(name, mag, 23, 31)
    assert G.shear_axis(M) == (1 if name == "ShearX" else 0)
    got = A.apply_named_u8(name, img.clone(), mag, "bilinear", fill)
    fl = A.apply_named(name, img.permute(0, 3, 1, 2).float(), mag, 255.0, True, "bilinear", fill)
    assert torch.equal(got, fl.clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1))  # (no grid_sample either)
    for n in range(len(img)):
        ref = bilinear_ref(img[n].numpy().astype(np.float64), M[n].numpy(), fill)
        d = np.abs(got[n].numpy().astype(int) - np.clip(np.round(ref), 0, 255))
        tie = np.abs(ref - np.floor(ref) - 0.5) < 1e-3
        assert d.max() <= 1 and not (d[~tie] > 0).any(), (name, n)  # off only at exact rounding ties


@pytest.mark.parametrize("name", ["Rotate", "ShearX", "ShearY"])
@pytest.mark.parametrize("fill", [None, 114, (7, 8, 9)])
def test_nearest_warps_are_grid_sample_s_pixels_as_gathers(name, fill, monkeypatch):
    img = batch()
    mag = torch.tensor([135.0, -30.0, 0.99, -1.5, 0.5, 90.0] if name == "Rotate" else
                       [0.3, -0.3, 0.99, -0.99, 0.05, 0.6], dtype=torch.float64)
    M = A._geometric_matrix(name, mag, img.shape[1], img.shape[2])
    ref = C.warp(img.permute(0, 3, 1, 2).float(), M, fill, "nearest", True)  # (grid_sample)
    ref = ref.clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1)
    monkeypatch.setattr(F, "grid_sample", lambda *a, **k: (_ for _ in ()).throw(AssertionError("grid_sample")))
    assert torch.equal(A.apply_named_u8(name, img.clone(), mag, "nearest", fill), ref)
    fl = A.apply_named(name, img.permute(0, 3, 1, 2).float(), mag, 255.0, True, "nearest", fill)
    assert torch.equal(fl.clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1), ref)


def test_ops_at_identity_magnitudes_are_skipped(monkeypatch):
    """A shear/rotation by 0, a translation under a pixel, an enhance by 1: not run (the float formula gives
    the very pixels back); the others run."""
    ran = []
    real = A.apply_named_u8
    monkeypatch.setattr(A, "apply_named_u8", lambda name, *a, **k: ran.append(name) or real(name, *a, **k))
    op = T.TrivialAugmentWide(interpolation="bilinear")
    still = ["ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness", "Color", "Contrast",
             "Sharpness"]
    names = still + ["Posterize"]
    ops = torch.tensor([[op.names.index(n)] for n in names])
    mag = torch.tensor([[0.0], [-0.0], [0.7], [-0.99], [0.0], [0.0], [0.0], [0.0], [0.0], [4.0]], dtype=torch.float64)
    img = images(len(names), 17, 19)
    p = {"ops": ops, "on": torch.ones_like(ops, dtype=torch.bool), "mag": mag}
    out = op.apply_u8(img.clone(), p, torch.tensor([[17, 19]]).expand(len(names), 2))
    assert ran == ["Posterize"]
    assert torch.equal(out[:-1], img[:-1])
    fl = op.apply(img.permute(0, 3, 1, 2).float(), p, None, 255.0, True)  # the float formula: the same pixels
    assert torch.equal(fl.clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1), out)


def test_augmix_runs_its_chains_group_by_group_as_the_float_stage(monkeypatch):
    """Batches longer than a group (the last one short) mix as the float stage does."""
    monkeypatch.setattr(A, "AUGMIX_SAMPLES", 4)
    op = T.AugMix(interpolation="bilinear")
    img = batch(11)
    for seed in range(3):
        got = A.apply_pixel_ops([op], {"image": img.clone()}, torch.Generator().manual_seed(seed))["image"]
        assert torch.equal(got, float_stage([op], img, seed))


@pytest.mark.parametrize("form", ["uint8", "float"])
def test_cutmix_pastes_the_rolled_box_in_place(form, monkeypatch):
    """Sample b takes sample b - 1's box (sample 0 the last one's), written in place from the end: the rolled
    batch's pixels, with no rolled copy of the images made."""
    img = images(7, 21, 26)
    x = img if form == "uint8" else img.permute(0, 3, 1, 2).float().contiguous()
    y = torch.arange(7) % 3
    ref_roll = x.roll(1, 0)
    real = torch.Tensor.roll
    monkeypatch.setattr(torch.Tensor, "roll", lambda t, *a, **k: (_ for _ in ()).throw(AssertionError("rolled"))
                        if t.dim() == 4 else real(t, *a, **k))
    for seed in range(6):
        out = T.CutMix(1.0, num_classes=3)({"image": x.clone(), "label": y.clone()},
                                          torch.Generator().manual_seed(seed))
        took = (out["image"] != x) & (out["image"] == ref_roll)
        changed = out["image"] != x
        assert torch.equal(changed, changed & took)  # every changed value is the rolled batch's
        box = changed.flatten(0, 1 if form == "float" else 0).any(0) if form == "float" else \
            changed.any(0).any(-1)
        rows, cols = box.any(1).nonzero().view(-1), box.any(0).nonzero().view(-1)
        if len(rows):
            sl = (slice(None), slice(None)) if form == "float" else (slice(None),)
            region = (*sl, slice(int(rows[0]), int(rows[-1]) + 1), slice(int(cols[0]), int(cols[-1]) + 1))
            assert torch.equal(out["image"][region], ref_roll[region])  # the whole box, pasted


def test_a_uint8_batch_of_any_strides_goes_through_the_new_kernels():
    """The uint8 stage on a batch that is a permuted view (N, H, W, C of a CHW tensor), as a user's own call
    may hand it: the shear lines and PIL's point over one table write through any strides, the same bytes as
    the contiguous batch."""
    from dsc.transforms import augment as A

    chw = torch.randint(0, 256, (1, 3, 260, 260), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    for op in (T.RandAugment(interpolation="bilinear"), T.TrivialAugmentWide(interpolation="bilinear"),
               T.RandomPhotometricDistort(p=1.0)):
        for s in range(12):
            strided = A.apply_pixel_ops([op], {"image": chw.clone().permute(0, 2, 3, 1)},
                                        torch.Generator().manual_seed(s))["image"]
            plain = A.apply_pixel_ops([op], {"image": chw.permute(0, 2, 3, 1).contiguous()},
                                      torch.Generator().manual_seed(s))["image"]
            assert torch.equal(strided, plain), (type(op).__name__, s)
