"""The auto-augment family's uint8 stage on the CPU (issue 32's speed): every op run on uint8 pixels (lookup
tables, whole-pixel shifts, the int16 sharpness sum, float copies of the samples that drew an op) gives the
very numbers of the float formulas (the fidelity tests in test_recipes.py check those against torchvision's);
the stage writes only into pixels it owns; MixUp mixes in place with the same arithmetic."""
import pytest
import torch

import dsc
from dsc import transforms as T
from dsc.transforms import augment as A
from dsc.transforms.mix import _mix_rolled_

from test_recipes import images

NAMES = ["Identity", "ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness", "Color", "Contrast",
         "Sharpness", "Posterize", "Solarize", "AutoContrast", "Equalize", "Invert"]


def batch(n=6, h=23, w=31):
    img = images(n, h, w)
    img[1] = 9  # a flat image (autocontrast / equalize keep it)
    img[2, :, :, 1] = 250  # a flat channel
    return img


def float_stage(ops, img, seed):
    """The float stage (what the CPU ran before, and CUDA runs): the draws, then each op on float pixels."""
    gen = torch.Generator().manual_seed(seed)
    sizes = torch.tensor([list(img.shape[1:3])]).expand(len(img), 2)
    params = [op.params(sizes, gen) for op in ops]
    x = img.permute(0, 3, 1, 2).to(torch.float32)
    for op, p in zip(ops, params):
        x = op.apply(x, p, sizes, 255.0, True)
    return x.clamp_(0, 255).to(torch.uint8).permute(0, 2, 3, 1)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("mode,fill", [("nearest", None), ("bilinear", None), ("bilinear", 114), ("nearest", (7, 8, 9))])
def test_each_op_on_uint8_equals_its_float_formula(name, mode, fill):
    img = batch()
    n = len(img)
    for mag in ([0.0] * n, [0.3, -0.3, 0.99, -0.99, 0.05, 0.6], [8, 7, 6, 4, 2, 1], [12.7, -12.7, 1.0, -40.0, 40.0, 0.4],
                [135.0, -30.0, 9.0, -1.5, 0.5, 90.0]):
        m = torch.tensor(mag, dtype=torch.float64)
        if name == "Posterize":
            m = m.abs().clamp(1, 8).round()
        if name in ("Solarize",):
            m = m.abs().clamp(0, 1)
        ref = A.apply_named(name, img.permute(0, 3, 1, 2).float(), m, 255.0, True, mode, fill)
        ref = ref.clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1)
        got = A.apply_named_u8(name, img.clone(), m, mode, fill)
        assert got.dtype == torch.uint8 and torch.equal(got, ref), (name, mag)


OPS = [lambda: T.TrivialAugmentWide(interpolation="bilinear"), lambda: T.TrivialAugmentWide(fill=114),
       lambda: T.RandAugment(num_ops=3, magnitude=15, interpolation="bilinear", fill=(1, 2, 3)),
       lambda: T.RandAugment(), lambda: T.AutoAugment(interpolation="bilinear"), lambda: T.AugMix(),
       lambda: T.AugMix(severity=10, mixture_width=2, chain_depth=2, alpha=0.5, interpolation="nearest"),
       lambda: T.RandomErasing(1.0), lambda: T.RandomErasing(1.0, value="random"),
       lambda: T.RandomErasing(1.0, value=(1, 2, 300)), lambda: T.ColorJitter(0.4, 0.4, 0.4, 0.1),
       lambda: T.GaussianBlur(5), lambda: T.RandomPhotometricDistort(p=1.0), lambda: T.RandomHSV(),
       lambda: T.RandomGrayscale(0.5)]


@pytest.mark.parametrize("make", OPS)
def test_the_uint8_stage_gives_the_float_stage_s_batches(make):
    """Same draws, same pixels: the CPU's uint8 stage equals the float stage op for op, also chained."""
    op = make()
    img = batch(9)
    for seed in range(4):
        got = A.apply_pixel_ops([op], {"image": img.clone()}, torch.Generator().manual_seed(seed))["image"]
        assert got.is_contiguous() and torch.equal(got, float_stage([op], img, seed)), (op, seed)
    if isinstance(op, T.RandomErasing) and op.value != 0:  # (noise or 300 erased into uint8 is cut to 0..255 at
        return  # once, as in torchvision's uint8 tensor; the float stage carried it on to the next op)
    chain = [T.ColorJitter(0.2, 0.2), op, T.RandAugment()]
    got = A.apply_pixel_ops(chain, {"image": img.clone()}, torch.Generator().manual_seed(7))["image"]
    assert torch.equal(got, float_stage(chain, img, 7))


def test_the_stage_writes_only_into_pixels_it_owns(fixed_ds):
    """Called on the user's batch, Compose leaves their tensors as they were; inside the Loader the stage works
    in the ring slot and its float output comes from the slot's memory, reused batch after batch."""
    b = fixed_ds.get_batch(range(4))
    before = b["image"].clone()
    ops = T.Compose([T.TrivialAugmentWide(), T.AutoAugment(), T.ToFloat(), T.RandomErasing(1.0)])
    out = ops(dict(b), seed=1)
    assert torch.equal(b["image"], before) and out["image"].dtype == torch.float32
    loader = dsc.Loader(fixed_ds, batch_size=4, transforms=T.presets.classification("ta_wide", crop_size=32,
                                                                                    random_erase=0.5, mixup=0.2))
    for _ in range(2):
        for got in loader:
            ptrs = {buf.untyped_storage().data_ptr() for slot in loader._ring.slots for buf in slot.values()}
            assert got["image"].untyped_storage().data_ptr() in ptrs
            del got
    made = loader._ring.allocations
    for _b in loader:
        pass
    assert loader._ring.allocations == made  # (the float images are the slots', not fresh batch-sized tensors)


@pytest.mark.parametrize("B", [1, 2, 3, 5, 8, 9, 13])
def test_mixup_in_place_is_the_rolled_mix(B):
    x = torch.randn(B, 3, 7, 9)
    lam = 0.37
    ref = torch.mul(x, lam)
    ref[1:].add_(x[:-1], alpha=1 - lam)
    ref[0].add_(x[-1], alpha=1 - lam)
    y = x.clone()
    assert _mix_rolled_(y, lam) is y and torch.equal(y, ref)
    z = x.clone()
    out = T.MixUp(0.4, num_classes=3)({"image": z, "label": torch.zeros(B, dtype=torch.long)},
                                      torch.Generator().manual_seed(0))
    assert out["image"] is z  # (in place, as CutMix)


@pytest.fixture(scope="module")
def fixed_ds(scenes_compiled):
    return scenes_compiled(size=(48, 64), resize="stretch")


@pytest.mark.parametrize("channels", [1, 3, 2])
@pytest.mark.parametrize("name", ["AutoContrast", "Equalize"])
def test_channel_lookups_equal_the_float_formula(name, channels):
    """AutoContrast/Equalize's per-channel lookups (Equalize's histograms and lookups made by PIL's loops for 1
    and 3 channels, by torch's for others) give the float formula's pixels."""
    img = batch(5)[..., :channels].contiguous()
    img[3, :, :, 0] = 250  # a flat channel
    m = torch.zeros(5, dtype=torch.float64)
    ref = A.apply_named(name, img.permute(0, 3, 1, 2).float(), m, 255.0, True)
    got = A.apply_named_u8(name, img.clone(), m)
    assert torch.equal(got, ref.clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1))


def test_augmix_mixes_chunk_by_chunk_as_the_float_stage():
    """A batch larger than a mixing chunk (the reused buffers' last chunk short) mixes as the float stage."""
    op = T.AugMix(interpolation="bilinear")
    img = batch(23, 128, 128)
    assert len(img) > A.MIX_BYTES // (128 * 128 * 3 * 4) * 2  # (three chunks or more, the last one short)
    got = A.apply_pixel_ops([op], {"image": img.clone()}, torch.Generator().manual_seed(4))["image"]
    assert torch.equal(got, float_stage([op], img, 4))
