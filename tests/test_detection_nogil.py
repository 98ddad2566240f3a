"""The detection recipes' per-sample loops run as TorchScript (dsc.nogil), so a Loader's filler thread runs
them without the GIL: YOLO's RandomHSV (color.hsv_jitter_integer's pieces) and RandomAffine's bilinear warp
(warp_gather.affine_bilinear). Counted: the torch calls that reach Python do not grow with the batch; and the
scripted loops give the bytes their plain-Python forms give."""
import numpy as np
import torch
from torch.overrides import TorchFunctionMode

from dsc import transforms as T
from dsc.transforms import color as C
from dsc.transforms import resample as R
from dsc.transforms import warp_gather as G
from torch_calls import TorchCalls as _Count  # noqa: E402
from torch_calls import scripted_only  # noqa: E402



def _calls(fn) -> int:
    fn()  # (compiles on the first call)
    with _Count() as c:
        fn()
    return c.n


def _images(n: int, h: int, w: int, seed: int = 0) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed).integers(0, 256, (n, h, w, 3), dtype=np.uint8))


@scripted_only
def test_random_hsv_on_a_uint8_batch_makes_no_torch_call_per_sample_or_piece(monkeypatch):
    monkeypatch.setattr(C, "PIECE_PIXELS", 1 << 9)  # (several pieces a sample)
    op = T.RandomHSV(0.2, 0.7, 0.4)

    def run(n):
        x = _images(n, 30, 40)
        sizes = torch.tensor([[30, 40]]).expand(n, 2)
        p = op.params(sizes, torch.Generator().manual_seed(1))
        return lambda: op.apply_u8(x.clone(), p, sizes)

    two, eight = _calls(run(2)), _calls(run(8))
    assert eight == two, (two, eight)  # (main: ~50 calls more per piece)
    assert eight < 20


def test_scripted_hsv_loop_gives_the_bytes_of_its_python_form():
    x = _images(3, 37, 50, seed=2).permute(0, 3, 1, 2)
    gains = 1 + (torch.rand((3, 3), generator=torch.Generator().manual_seed(3), dtype=torch.float64) * 2 - 1) * \
        torch.tensor([0.3, 0.7, 0.4], dtype=torch.float64)
    for rows in (1, 7, 37):
        a, b = x.clone(), x.clone()
        C._hsv_jitter_pieces(a, gains.float(), a, rows)
        C._hsv_jitter_pieces.eager(b, gains.float(), b, rows)
        assert torch.equal(a, b), rows
    f = x.float()
    assert torch.equal(C.hsv_jitter_integer(f, gains), C._by_pieces(C._hsv_jitter_piece, f, gains))


def _warp_args(B: int, seed: int, degrees: float):
    img = _images(B, 40, 60, seed)
    op = T.RandomAffine(degrees, translate=(0.1, 0.1), scale=(0.5, 1.5), interpolation="bilinear", fill=114,
                        size=(32, 48))
    from dsc.transforms.fused import plan_chain
    plan = plan_chain([op], torch.tensor([[40, 60]]).repeat(B, 1), T.batch_generator(seed, 0, 0))
    return img, plan.matrices


@scripted_only
def test_random_affine_bilinear_makes_no_torch_call_per_sample():
    for degrees in (0, 20):
        counts = []
        for B in (2, 8):
            img, M = _warp_args(B, 5, degrees)
            sizes = torch.tensor([[40, 60]]).repeat(B, 1)
            counts.append(_calls(lambda: R._warp(img, sizes, M, 32, 48, 114.0, "bilinear")))
        assert counts[0] == counts[1], (degrees, counts)  # (main: ~25 calls more a sample)


def test_scripted_affine_bilinear_gives_the_bytes_of_its_python_form():
    for degrees, fill in ((0, 114.0), (25, 0.0), (10, (10, 200, 30))):
        img, M = _warp_args(4, 6, degrees)
        sizes = torch.tensor([[40, 60], [30, 60], [40, 20], [1, 1]])
        a = R._warp(img, sizes, M, 32, 48, fill, "bilinear")
        real = G.affine_bilinear
        try:
            R.affine_bilinear = real.eager
            b = R._warp(img, sizes, M, 32, 48, fill, "bilinear")
        finally:
            R.affine_bilinear = real
        assert torch.equal(a, b), degrees
        one = R._warp(img[..., :1].contiguous(), sizes, M, 32, 48, 7.0, "bilinear")  # (one channel)
        assert one.shape == (4, 32, 48, 1)


@scripted_only
def test_mosaic_places_and_pastes_without_a_torch_call_per_sample():
    """Mosaic's placements are drawn as tensors once and read as Python numbers, and its pastes run in the
    scripted ``_paste``: of the torch calls Mosaic itself makes (not counting the resizes) only the resize's
    output, one a source image, grows with the batch; the canvases are the eager loop's."""
    import os
    import sys

    from dsc.transforms import detection as D

    class Own(TorchFunctionMode):  # the calls made from detection.py's own lines
        n = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            self.n += os.path.basename(sys._getframe(1).f_code.co_filename) == "detection.py"
            return func(*args, **(kwargs or {}))

    def batch(B):
        img = _images(B, 30, 40, seed=B)
        return {"image": img.reshape(-1), "image_offsets": torch.arange(B + 1) * (30 * 40 * 3),
                "image_shapes": torch.tensor([[30, 40, 3]]).repeat(B, 1)}

    counts = []
    for B in (2, 8):
        D.Mosaic(24)(batch(B), torch.Generator().manual_seed(0))  # (compiles the paste)
        with Own() as c:
            D.Mosaic(24)(batch(B), torch.Generator().manual_seed(0))
        counts.append(c.n)
    assert counts[1] - counts[0] <= 6, counts  # (one allocation a source image, for its resize; main: ~17 a sample)
    real = D._paste
    got = D.Mosaic(24, fill=(1, 2, 3))(batch(5), torch.Generator().manual_seed(4))["image"]
    try:
        D._paste = real.eager
        want = D.Mosaic(24, fill=(1, 2, 3))(batch(5), torch.Generator().manual_seed(4))["image"]
    finally:
        D._paste = real
    assert torch.equal(got, want)


def test_the_hsv_kernel_takes_mod_180_without_torch_s_remainder():
    """Both of RandomHSV's "mod 180"s (the hue, and the hue times its gain) are f - 180 floor(f / 180) on
    whole numbers (no remainder pass: as slow as ten plain ones), the same numbers as the remainder gave."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(func.__name__)
            return func(*args, **(kwargs or {}))

    x = _images(1, 40, 50, seed=9).permute(0, 3, 1, 2).float()
    out = torch.empty_like(x)
    gains = torch.tensor([[1.9, 1.3, 0.7]])
    with Ops() as ops:
        C._hsv_jitter_piece(x, gains, out)
    assert not [n for n in ops.names if "remainder" in n or "fmod" in n], ops.names
    f = torch.arange(0, 720, dtype=torch.float32) * 0.5
    assert torch.equal(C._mod180(f.floor()), f.remainder(180.0).floor())


def test_random_affine_at_a_vanishing_scale_gives_the_fill_and_a_nan_map_a_clear_error():
    """A map that scales by 1e-20 sends the source grid past int64 (the scripted warp's int()): the samples are
    all fill, as before the loop was scripted; a map with no inverse is a ConfigError naming the scale."""
    import pytest
    import torch

    import dsc
    from dsc import transforms as T

    x = torch.randint(0, 256, (2, 20, 20, 3), dtype=torch.uint8)
    for s in (1e-19, 1e-21):
        out = T.Compose([T.RandomAffine(degrees=0, interpolation="bilinear", fill=114, size=(16, 16),
                                        scale=(s, s))])({"image": x.clone()}, seed=0)["image"]
        assert bool((out == 114).all())
    with pytest.raises(dsc.ConfigError, match="scale"):
        T.Compose([T.RandomAffine(degrees=0, interpolation="bilinear", fill=114, size=(16, 16),
                                  scale=(1e-300, 1e-300))])({"image": x.clone()}, seed=0)
