"""ShearY and the bilinear Rotate on CPU uint8 samples work in the sample's own (H, W, C) layout: no copy of
pixels between layouts (ShearY read its columns through a transposing copy each way, Rotate its planes from
interleaved pixels and back: strided copies of 3-byte pixels), and the grid (Rotate) or gather index
(ShearY) is made once for the samples that share a map (RandAugment's of a batch are two, +-magnitude).
The same bytes as the float formula (test_recipes_uint8.py). The loops run here as plain Python (dsc.nogil
off) so that every torch call is seen."""
import pytest
import torch
from torch.overrides import TorchFunctionMode

from dsc import nogil as N
from dsc.transforms import augment as A

from test_recipes_uint8 import batch

PIXELS = 64  # a copy at least this big is a sample's pixels (not a 3 x 3 map's or a line's weights)


class Copies(TorchFunctionMode):
    """Records the copies of more than PIXELS values whose source and destination lie otherwise in memory
    (a transposing copy), and the grids / indices written (torch.add with out= of more than PIXELS values)."""

    def __init__(self):
        super().__init__()
        self.relayouts, self.made = [], 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name == "copy_":
            dst, src = args[0], args[1]
            if src.numel() > PIXELS and src.dim() == dst.dim() and src.shape == dst.shape and \
                    src.stride() != dst.stride():
                self.relayouts.append((tuple(src.shape), src.stride(), dst.stride()))
        if name == "add" and kwargs.get("out") is not None and kwargs["out"].numel() > PIXELS:
            self.made += 1
        return func(*args, **kwargs)


@pytest.mark.parametrize("name,mag", [("ShearY", 0.3), ("Rotate", 30.0)])
def test_shear_y_and_rotate_keep_the_pixels_layout_and_share_maps(name, mag, monkeypatch):
    monkeypatch.setattr(N, "ENABLED", False)
    img = batch(6, 23, 31)
    mags = torch.tensor([mag, -mag, mag, mag, -mag, mag], dtype=torch.float64)  # (two maps)
    want = A.apply_named(name, img.permute(0, 3, 1, 2).float(), mags, 255.0, True, "bilinear")
    with Copies() as seen:
        got = A.apply_named_u8(name, img.clone(), mags, "bilinear")
    assert seen.relayouts == []
    assert seen.made == (2 if name == "ShearY" else 4)  # (an index a map; a grid's two planes a map)
    assert torch.equal(got, want.clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1))


@pytest.mark.parametrize("mags", [[0.99, -0.99, 5.0, -5.0, 0.01, -0.3], [0.05, 0.05, 0.05, 0.05, 0.05, 0.05]])
def test_shear_y_by_gather_is_the_float_formula(mags):
    """Steep shears (columns read wholly from the border: its shift clamped), tiny ones, one map for all, some
    samples only (the others untouched), scripted and plain: the float formula's bytes."""
    img = batch(6, 23, 31)
    m = torch.tensor(mags, dtype=torch.float64)
    want = A.apply_named("ShearY", img.permute(0, 3, 1, 2).float(), m, 255.0, True, "bilinear")
    want = want.clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1)
    assert torch.equal(A.apply_named_u8("ShearY", img.clone(), m, "bilinear"), want)
    rows = torch.tensor([4, 1, 3])
    got = A.apply_named_u8("ShearY", img.clone(), m[rows], "bilinear", rows=rows)
    keep = torch.tensor([0, 2, 5])
    assert torch.equal(got[rows], want[rows]) and torch.equal(got[keep], img[keep])
