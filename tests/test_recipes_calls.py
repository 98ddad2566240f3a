"""How many kernel calls the auto-augment family's uint8 CPU stage makes (each call lets the GIL go, and the
Python between them holds it while the Loader's other fill thread waits): AugMix runs each op once per
slot on all its chains' copies together; lookup tables go through PIL's C point without Image.point's
Python loop over the table; the bilinear warp (Rotate) runs sample by sample (in cache)."""
import torch
from PIL import Image

from dsc import transforms as T
from dsc.transforms import augment as A

from test_recipes_uint8 import batch, float_stage
from torch_calls import scripted_only  # noqa: E402


def test_augmix_runs_each_drawn_op_once_per_slot_for_all_its_chains(monkeypatch):
    op = T.AugMix(interpolation="bilinear")
    img = batch(6, 20, 22)
    sizes = torch.tensor([[20, 22]]).expand(6, 2)
    p = op.params(sizes, torch.Generator().manual_seed(3))
    W, K = op.mixture_width, p["ops"].shape[1] // op.mixture_width
    ops = torch.where(p["on"], p["ops"], -1).view(6, W, K)
    per_slot = sum(len(set(ops[:, :, k].reshape(-1).tolist()) - {-1}) for k in range(K))
    per_chain = sum(len(set(ops[:, i, k].tolist()) - {-1}) for i in range(W) for k in range(K))
    assert per_chain > per_slot  # (the draws have an op that several chains drew in the same slot)
    calls = []
    real = A.apply_named_u8
    monkeypatch.setattr(A, "apply_named_u8",
                        lambda name, x, *a, **k: calls.append((name, len(x) if k.get("rows") is None else
                                                               len(k["rows"]))) or real(name, x, *a, **k))
    monkeypatch.setattr(A, "_STILL_BELOW", {})  # (count every drawn op, none skipped)
    out = op.apply_u8(img.clone(), p, sizes)
    assert len(calls) == per_slot
    assert sum(n for _, n in calls) == int((ops >= 0).sum())
    monkeypatch.setattr(A, "apply_named_u8", real)
    assert torch.equal(out, float_stage([op], img, 3))


def test_lookup_tables_skip_image_points_python_loop(monkeypatch):
    """Image.point rounds the table in Python (256 calls an image, GIL held); the stage calls the C point."""
    def refuse(*a, **k):
        raise AssertionError("Image.point called")
    monkeypatch.setattr(Image.Image, "point", refuse)
    img = batch(3, 160, 150)  # (large enough for the PIL path)
    for name, m in (("Solarize", 0.4), ("Brightness", 0.3), ("Equalize", 0.0), ("Contrast", -0.5)):
        got = A.apply_named_u8(name, img.clone(), torch.full((3,), m, dtype=torch.float64))
        mag = torch.full((3,), m, dtype=torch.float64)
        ref = A.apply_named(name, img.permute(0, 3, 1, 2).float(), mag, 255.0, True)
        assert torch.equal(got, ref.clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1)), name


@scripted_only
def test_bilinear_rotate_runs_sample_by_sample(monkeypatch):
    """One grid_sample call per sample, each on one sample (its planes and grid stay in cache) and into one
    output buffer, the same pixels as the float formula."""
    from dsc import nogil as N

    seen = []
    real = A._grid_sample
    monkeypatch.setattr(A, "_grid_sample", lambda x, g, *a: seen.append(len(x)) or real(x, g, *a))
    img = batch(5, 33, 41)
    mag = torch.tensor([20.0, -45.0, 135.0, 3.0, -90.0], dtype=torch.float64)
    scripted = A.apply_named_u8("Rotate", img.clone(), mag, "bilinear")  # (the loop as TorchScript: no Python)
    assert seen == []
    monkeypatch.setattr(N, "ENABLED", False)  # (the same loop as plain Python, its calls seen)
    got = A.apply_named_u8("Rotate", img.clone(), mag, "bilinear")
    assert seen == [1] * 5
    assert torch.equal(scripted, got)
    ref = A.apply_named("Rotate", img.permute(0, 3, 1, 2).float(), mag, 255.0, True, "bilinear")
    assert torch.equal(got, ref.clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1))


def test_autocontrast_tables_run_as_one_pil_lookup_per_sample(monkeypatch):
    """A table per channel: one RGB point per sample (not a numpy take per channel), the float formula's pixels."""
    import numpy as np

    def refuse(*a, **k):
        raise AssertionError("np.take called")
    monkeypatch.setattr(np, "take", refuse)
    img = batch(3, 160, 150)
    img[0, ..., 0] = img[0, ..., 0] // 2 + 20  # (a channel that autocontrast stretches)
    m = torch.zeros(3, dtype=torch.float64)
    got = A.apply_named_u8("AutoContrast", img.clone(), m)
    ref = A.apply_named("AutoContrast", img.permute(0, 3, 1, 2).float(), m, 255.0, True)
    assert torch.equal(got, ref.clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1))


def test_auto_augment_draws_read_one_magnitude_table():
    """A fixed-size batch's magnitudes come from one table per space, bins and size (made once): a couple of
    torch calls a batch where the loop over the op names made ~180 (each a GIL handover); the same numbers
    as the loop, which images of several sizes still take (TranslateX/Y's bins scale with each one's size)."""
    from torch_calls import TorchCalls

    B = 64
    for op in (T.RandAugment(), T.TrivialAugmentWide(), T.AutoAugment(), T.AugMix()):
        sizes = torch.tensor([[40, 52]]).expand(B, 2)
        op.params(sizes, torch.Generator().manual_seed(0))  # (the table made)
        with TorchCalls(attributes=False) as calls:
            fixed = op.params(sizes, torch.Generator().manual_seed(1))["mag"]
        ragged = sizes.clone()
        ragged[0] = torch.tensor([41, 53])  # (another size: the loop)
        loop = op.params(ragged, torch.Generator().manual_seed(1))["mag"]
        assert torch.equal(fixed[1:], loop[1:]) and torch.equal(fixed[1:].signbit(), loop[1:].signbit())
        assert bool((fixed != 0).any())
        if not isinstance(op, T.AugMix):  # (AugMix's Dirichlet draws make their own)
            assert calls.n <= 30, (type(op).__name__, calls.n)


def test_a_magnitude_table_is_kept_for_its_own_space_only():
    """The tables are keyed by the space's id: a table left by another space under the same id (a freed dict's
    id, taken again) is made anew, never read."""
    from dsc.transforms import augment as A

    op = T.RandAugment()
    right = op._magnitude_table(A._AA_SPACE, 31, 40, 52)[0].clone()
    key = (id(A._AA_SPACE), tuple(op.names), 31, 40, 52)
    stale = A._TA_SPACE
    A._MAGNITUDE_TABLES[key] = (torch.full_like(right, 7.0), A._MAGNITUDE_TABLES[key][1], stale)
    assert torch.equal(op._magnitude_table(A._AA_SPACE, 31, 40, 52)[0], right)


def test_shears_take_their_axis_from_their_name():
    """ShearX moves rows, ShearY columns, for every magnitude but 0 (the identity, whose pixels either
    path keeps): what warp_gather.shear_axis finds in their maps, without its eight torch calls an op."""
    from dsc.transforms import warp_gather as G

    mags = torch.cat([torch.linspace(-0.99, 0.99, 61, dtype=torch.float64), torch.tensor([0.09, -0.09, 1e-9])])
    for name in ("ShearX", "ShearY"):
        for H, W in ((224, 224), (23, 31), (331, 500)):
            M = A._geometric_matrix(name, mags, H, W)
            assert all(G.shear_axis(M[i:i + 1]) == A._SHEAR_AXES[name] for i in range(len(mags)))
    img = batch(3, 23, 31)
    zero = torch.zeros(3, dtype=torch.float64)
    for name in ("ShearX", "ShearY"):
        assert torch.equal(A.apply_named_u8(name, img.clone(), zero, "bilinear", rows=torch.arange(3)), img)
