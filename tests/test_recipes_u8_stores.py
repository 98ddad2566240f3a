"""The CPU uint8 kernels of the auto-augment family store their float results through int16 (warp_gather.write_u8:
torch's float -> uint8 cast is ~3x slower than float -> int16 -> uint8, and a planes -> pixels copy then moves
bytes, not floats), and the shears pick each line's window by index_select of an unfold view (an advanced
index of a strided view copies byte by byte): the same bytes as before (the float formula's, test_recipes_uint8.py).
The loops run here as plain Python (dsc.nogil off) so that every torch call is seen."""
import pytest
import torch
from torch.overrides import TorchFunctionMode

from dsc import nogil as N
from dsc import transforms as T
from dsc.transforms import augment as A
from dsc.transforms import warp_gather as G

from test_recipes_uint8 import batch, float_stage

PIXELS = 64  # a store at least this big is a sample's (the 256-entry lookup tables are not)


class Casts(TorchFunctionMode):
    """Records the float -> uint8 stores (copy_, __setitem__, .to) of more than PIXELS values, and every advanced
    index (a __getitem__ with a tensor in its key) and index_select."""

    def __init__(self):
        super().__init__()
        self.casts, self.advanced, self.index_selects = [], 0, 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in ("copy_", "__setitem__"):
            dst, src = args[0], args[-1]
            if isinstance(src, torch.Tensor) and dst.dtype == torch.uint8 and src.is_floating_point() \
                    and src.numel() > PIXELS:
                self.casts.append((name, tuple(src.shape)))
        if name == "to" and args[0].is_floating_point() and args[0].numel() > PIXELS and \
                torch.uint8 in tuple(args[1:]) + tuple(kwargs.values()):
            self.casts.append(("to", tuple(args[0].shape)))
        if name == "__getitem__":
            key = args[1] if isinstance(args[1], tuple) else (args[1],)
            self.advanced += any(isinstance(k, torch.Tensor) for k in key)
        self.index_selects += name == "index_select"
        return func(*args, **kwargs)


def _plain(fn):
    """``fn()``'s result and the Casts seen, its scripted loops run as plain Python."""
    with Casts() as seen:
        out = fn()
    return out, seen


@pytest.fixture
def plain(monkeypatch):
    monkeypatch.setattr(N, "ENABLED", False)


def test_write_u8_is_the_casts_bytes():
    """Whole and fractional values in 0..255 (truncated), into the same layout and into interleaved pixels."""
    src = torch.cat([torch.arange(256, dtype=torch.float32), torch.rand(3 * 40 * 40 - 256) * 255.999]).view(3, 40, 40)
    for s, dst in ((src, torch.empty((3, 40, 40), dtype=torch.uint8)),
                   (src.permute(1, 2, 0), torch.empty((40, 40, 3), dtype=torch.uint8)),
                   (src.permute(1, 2, 0)[1:-1, 2:], torch.empty((40, 40, 3), dtype=torch.uint8)[1:-1, 2:])):
        want = torch.empty_like(dst).copy_(s)
        G.write_u8(dst, s)
        assert torch.equal(dst, want)


@pytest.mark.parametrize("name", ["ShearX", "ShearY"])
@pytest.mark.parametrize("fill", [None, (7, 8, 250)])
def test_shears_store_through_int16_and_pick_windows_by_index_select(name, fill, plain):
    img = batch(4, 23, 31)
    mag = torch.tensor([0.3, -0.05, 0.99, -0.6], dtype=torch.float64)
    want = A.apply_named(name, img.permute(0, 3, 1, 2).float(), mag, 255.0, True, "bilinear", fill)
    got, seen = _plain(lambda: A.apply_named_u8(name, img.clone(), mag, "bilinear", fill))
    assert seen.advanced == 0 and seen.index_selects >= 4  # (one a sample; with a fill, the mask's too)
    assert seen.casts == []
    assert torch.equal(got, want.clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1))


@pytest.mark.parametrize("name,mag", [("Rotate", 20.0), ("Sharpness", 0.7), ("Color", -0.6)])
def test_sample_kernels_store_through_int16(name, mag, plain):
    img = batch(3, 23, 31)
    mags = torch.full((3,), mag, dtype=torch.float64)
    want = A.apply_named(name, img.permute(0, 3, 1, 2).float(), mags, 255.0, True, "bilinear")
    got, seen = _plain(lambda: A.apply_named_u8(name, img.clone(), mags, "bilinear"))
    assert seen.casts == []
    assert torch.equal(got, want.clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1))


def test_augmix_mix_stores_through_int16(plain):
    op = T.AugMix(interpolation="bilinear")
    img = batch(5, 23, 31)
    sizes = torch.tensor([[23, 31]]).expand(5, 2)
    p = op.params(sizes, torch.Generator().manual_seed(3))
    got, seen = _plain(lambda: A._augmix_mix(img.clone(), img.repeat(3, 1, 1, 1), p["m0"].float().view(-1, 1, 1, 1),
                                             p["w"].float(), torch.empty((2, 23, 31, 3)), torch.empty((2, 23, 31, 3)),
                                             2))
    assert seen.casts == []
    out = op.apply_u8(img.clone(), p, sizes)
    assert torch.equal(out, float_stage([op], img, 3))


def test_augmix_mixes_a_224_px_sample_at_a_time(monkeypatch):
    """The mix's two float buffers hold one 224 px sample each (0.6 MB: three at a time, 1.8 MB each, left the
    L2 and cost ~30% more); small samples go several at a time. The mix's numbers are the float stage's."""
    steps = []
    real = A._augmix_mix
    monkeypatch.setattr(A, "_augmix_mix", lambda *a: steps.append(a[-1]) or real(*a))
    op = T.AugMix(interpolation="bilinear", mixture_width=1, chain_depth=1)
    for n, h in ((2, 224), (3, 32)):
        img = torch.randint(0, 256, (n, h, h, 3), dtype=torch.uint8)
        sizes = torch.tensor([[h, h]]).expand(n, 2)
        p = op.params(sizes, torch.Generator().manual_seed(1))
        out = op.apply_u8(img.clone(), p, sizes)
        assert torch.equal(out, float_stage([op], img, 1))
    assert steps == [1, A.MIX_BYTES // (32 * 32 * 3 * 4)]


@pytest.mark.parametrize("shape", [(1, 0, 5, 3), (1, 5, 0, 3), (2, 0, 0, 1)])
def test_shears_of_an_empty_image_return_it(shape):
    """A shear with no line to move gives the empty image back (an unfold view of an empty buffer would raise)."""
    x = torch.zeros(shape, dtype=torch.uint8)
    M = torch.eye(3, dtype=torch.float64).expand(shape[0], 3, 3).clone()
    M[:, 0, 1] = 0.3
    for axis in (0, 1):
        assert G.shear_u8(x.clone(), M, None, axis).shape == shape
        xf = x.permute(0, 3, 1, 2).float()
        assert G.shear_float(xf, M, None, axis, True).shape == xf.shape
