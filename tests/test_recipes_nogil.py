"""The classification presets' per-sample loops run as TorchScript (dsc.nogil, issue 32): counted, none of
their torch calls reaches Python (each one a GIL handover the Loader's other filler thread waits on), so the
calls a batch makes do not grow with its samples; and each scripted loop gives the plain Python loop's very
bytes (``DSC_NOGIL=0``), the float formulas' (tests/test_recipes_uint8.py checks those)."""
import pytest
import torch

from dsc import nogil as N
from dsc import transforms as T
from dsc.transforms import augment as A
from dsc.transforms import color as C
from dsc.transforms.photometric import fuse_photometric

from test_recipes_uint8 import batch
from torch_calls import TorchCalls as _Count  # noqa: E402
from torch_calls import scripted_only  # noqa: E402



def _calls(fn) -> int:
    with _Count() as c:
        fn()
    return c.n


def _per_sample(prepare) -> float:
    """The torch calls reaching Python that one more sample adds to ``prepare(n)()`` (its inputs made outside the
    count; 12 samples less 4, over 8)."""
    prepare(4)()  # (compiles the scripted loops)
    return (_calls(prepare(12)) - _calls(prepare(4))) / 8


def _op(name, m, interpolation="bilinear", fill=None, channels=3):
    def prepare(n):
        img, mag = batch(n, 29, 37)[..., :channels].contiguous(), torch.full((n,), m, dtype=torch.float64)
        return lambda: A.apply_named_u8(name, img, mag, interpolation, fill)
    return prepare


@pytest.mark.parametrize("name, m, fill", [("Rotate", 20.0, None), ("Rotate", -35.0, (10, 20, 30)),
                                           ("Sharpness", 0.6, None), ("Color", -0.5, None),
                                           ("Contrast", 0.4, None), ("TranslateX", 7.0, 3)])
@scripted_only
def test_auto_augment_kernels_make_no_torch_call_per_sample(name, m, fill):
    assert _per_sample(_op(name, m, fill=fill)) == 0


@scripted_only
def test_the_float_pass_augmix_mix_cutmix_mixup_and_erasing_make_no_torch_call_per_sample():
    post, _ = fuse_photometric([T.ToFloat(), T.Normalize((0.5, 0.4, 0.3), (0.2, 0.3, 0.4))])

    def float_pass(n):
        img, out = batch(n, 29, 37), post.empty(n, 29, 37, 3)
        return lambda: post.apply_samples(img, out)
    assert _per_sample(float_pass) == 0

    def augmix_mix(n):  # (AugMix's mix of a sample and its 3 chains)
        xg, augs = batch(n, 29, 37), batch(3 * n, 29, 37)
        m0, w = torch.rand(n, 1, 1, 1), torch.rand(n, 3)
        acc, tmp = torch.empty(2, 29, 37, 3), torch.empty(2, 29, 37, 3)
        return lambda: A._augmix_mix(xg, augs, m0, w, acc, tmp, 2)
    assert _per_sample(augmix_mix) == 0

    for op in (T.CutMix(1.0, num_classes=4), T.MixUp(1.0, num_classes=4), T.RandomErasing(p=1.0)):
        def mix(n):
            b = {"image": batch(n, 29, 37).permute(0, 3, 1, 2).float(), "label": torch.zeros(n, dtype=torch.long)}
            return lambda: op(b, torch.Generator().manual_seed(2))
        assert _per_sample(mix) == 0, op


def _both(fn):
    """``fn()`` with the scripted loops (three times: past TorchScript's profiling runs) and as plain Python."""
    got = [fn() for _ in range(3)]
    N.ENABLED = False
    try:
        want = fn()
    finally:
        N.ENABLED = True
    return got, want


@pytest.mark.parametrize("channels", [1, 3])
def test_scripted_kernels_give_the_plain_python_bytes(channels):
    img = batch(7, 33, 41)[..., :channels].contiguous()
    mags = torch.tensor([20.0, -45.0, 0.4, 3.0, -0.9, 0.7, -135.0], dtype=torch.float64)
    rows = torch.tensor([0, 2, 3, 6])
    cases = [("Rotate", "bilinear", None), ("Rotate", "nearest", 66), ("Rotate", "bilinear", 77),
             ("Rotate", "bilinear", (1, 2, 3)[:channels]),
             ("Sharpness", "bilinear", None), ("Color", "bilinear", None), ("Contrast", "bilinear", None),
             ("TranslateY", "nearest", 5), ("TranslateX", "bilinear", None)]
    for name, mode, fill in cases:
        for r in (None, rows):
            m = mags if r is None else mags[:len(r)]
            got, want = _both(lambda: A.apply_named_u8(name, img.clone(), m, mode, fill, rows=r))
            for g in got:
                assert torch.equal(g, want), (name, mode, fill, r)


def test_scripted_stage_and_batch_ops_give_the_plain_python_bytes():
    post, _ = fuse_photometric([T.ToFloat(), T.Normalize((0.5, 0.4, 0.3), (0.2, 0.3, 0.4)), T.ChannelsLast()])
    for p in (post, fuse_photometric([T.ToFloat(), T.ToDtype(torch.float16)])[0]):
        img = batch(5, 21, 19)

        def run():
            out = p.empty(5, 21, 19, 3)
            p.apply_samples(img, out)
            return out
        got, want = _both(run)
        assert all(torch.equal(g, want) for g in got)
        assert torch.equal(want, p.apply_batch(img))  # (the batch formula: the same numbers)
    for op in (T.AugMix(), T.RandAugment(num_ops=3, interpolation="bilinear"), T.TrivialAugmentWide(),
               T.AutoAugment(), T.CutMix(1.0, num_classes=3), T.MixUp(0.4, num_classes=3),
               T.RandomErasing(p=0.6, value=(0.1, 0.5, 0.9))):
        for chw in (False, True):
            if chw and isinstance(op, A._AutoBase) or not chw and isinstance(op, T.RandomErasing):
                continue

            def run():
                img = batch(9, 27, 31)
                b = {"image": img.permute(0, 3, 1, 2).float() if chw else img,
                     "label": torch.arange(9) % 3}
                return op(b, torch.Generator().manual_seed(5))["image"]
            got, want = _both(run)
            assert all(torch.equal(g, want) for g in got), (op, chw)
    for dtype in (torch.float16, torch.bfloat16, torch.float64):  # (half: TorchScript's mul_ by a float rounds it)
        def run():
            b = {"image": batch(9, 27, 31).permute(0, 3, 1, 2).to(dtype), "label": torch.arange(9) % 3}
            return T.MixUp(0.4, num_classes=3)(b, torch.Generator().manual_seed(5))["image"]
        got, want = _both(run)
        assert all(torch.equal(g, want) for g in got), dtype


def test_affine_maps_scripted_are_the_plain_python_maps():
    g = torch.Generator().manual_seed(0)
    n = 9
    sizes = torch.randint(10, 500, (n, 2), generator=g)
    r = lambda lo, hi: lo + (hi - lo) * torch.rand(n, generator=g, dtype=torch.float64)  # noqa: E731
    for center in (None, (3.0, 7.5)):
        args = (sizes, r(-180, 180), (r(0, 50), r(-20, 20)), r(0.5, 1.5), (r(-30, 30), r(0, 20)), center)
        got, want = _both(lambda: C.affine_matrix(*args))
        assert all(torch.equal(x, want) for x in got)
