"""The auto-augment stage's CPU savings that keep the same pixels (issue 32): lookup tables written back into
the sample's own memory, Equalize and AutoContrast from one PIL histogram, AugMix's chain copies in reused
scratch, and who may write into a batch (Compose's ``owned``, which the Loader states)."""
import numpy as np
import torch
from PIL import Image

from dsc import transforms as T
from dsc.transforms import augment as A
from dsc.transforms import color as C

from test_recipes_uint8 import batch, float_stage
from torch_calls import scripted_only  # noqa: E402


def _float_formula(name, img, m, interpolation="nearest"):
    mag = torch.full((len(img),), m, dtype=torch.float64)
    return A.apply_named(name, img.permute(0, 3, 1, 2).float(), mag, 255.0, True, interpolation).clamp(0, 255) \
        .to(torch.uint8).permute(0, 2, 3, 1)


def test_one_table_lookups_write_into_the_sample_without_a_copy_back(monkeypatch):
    """A single table (brightness, solarize, contrast): PIL's point over the sample's own bytes, pasted back
    into them; no np.copyto of a tobytes() copy (main made both: two passes more and a Python bytes join)."""
    def refuse(*a, **k):
        raise AssertionError("copied back")
    img = batch(3, 160, 150)
    for name, m in (("Solarize", 0.4), ("Brightness", 0.3), ("Contrast", -0.5)):
        ref = _float_formula(name, img, m)
        with monkeypatch.context() as mp:
            mp.setattr(np, "copyto", refuse)
            mp.setattr(Image.Image, "tobytes", refuse)
            got = A.apply_named_u8(name, img.clone(), torch.full((3,), m, dtype=torch.float64))
        assert torch.equal(got, ref), name


def test_pil_point_and_paste_fall_back_to_pillows_public_calls(monkeypatch):
    """Where this Pillow's internals (an image's ``_new``, its core's point and paste) are not there, the lookup
    takes ``Image.point`` and is copied back; the pixels are the same either way."""
    img = batch(3, 160, 150)
    lut = torch.randint(0, 256, (3, 1, 256), generator=torch.Generator().manual_seed(1)).to(torch.uint8)
    ref = C.apply_lut(img.clone(), lut)
    calls = []
    real_point = Image.Image.point
    monkeypatch.setattr(C, "_core", lambda im, method: None)
    monkeypatch.setattr(C, "_CORE_CALLS", False)
    monkeypatch.setattr(Image.Image, "point", lambda self, t, *a: calls.append(len(t)) or real_point(self, t, *a))
    got = C.apply_lut(img.clone(), lut)
    assert calls == [256] * 3
    assert torch.equal(got, ref)


def test_equalize_and_autocontrast_take_one_histogram_pass_no_channel_planes(monkeypatch):
    """Equalize and AutoContrast: each sample's tables from PIL's histogram of the interleaved pixels (main's
    AutoContrast copied the samples out into channel planes for aminmax); the float formula's pixels."""
    counted = []
    real = Image.Image.histogram
    monkeypatch.setattr(C, "_CORE_CALLS", False)  # (the Image path, where a Pillow lacks the core calls:
    # tests/test_recipes_gil.py counts the core path's)
    monkeypatch.setattr(Image.Image, "histogram", lambda self, *a, **k: counted.append(self.mode) or real(self, *a, **k))

    def refuse(*a, **k):
        raise AssertionError("channel planes")
    monkeypatch.setattr(torch.Tensor, "aminmax", refuse)
    img = batch(4, 40, 50)
    img[0, ..., 0] = img[0, ..., 0] // 2 + 20  # (a channel autocontrast stretches)
    img[3, ..., 2] = 0  # (an empty bottom, a flat channel)
    for name in ("AutoContrast", "Equalize"):
        counted.clear()
        got = A.apply_named_u8(name, img.clone(), torch.zeros(4, dtype=torch.float64))
        assert counted == ["RGB"] * 4, name
        assert torch.equal(got, _float_formula(name, img, 0.0)), name


def test_augmix_chain_copies_and_mix_buffers_are_reused_scratch(monkeypatch):
    """AugMix's chain copies (mixture_width copies of 32 samples: 14 MB at 224 px) and its float mix buffers are
    the thread's scratch, reused batch after batch: no Tensor.repeat of the images (main made a fresh copy a
    group), the same memory on the second batch, the float formula's pixels."""
    repeats = []
    real = torch.Tensor.repeat
    monkeypatch.setattr(torch.Tensor, "repeat",
                        lambda self, *s: repeats.append(self.dim()) or real(self, *s))
    op = T.AugMix(interpolation="bilinear")
    img = batch(6, 20, 22)
    sizes = torch.tensor([[20, 22]]).expand(6, 2)
    ptrs = []
    for seed in (3, 4):
        p = op.params(sizes, torch.Generator().manual_seed(seed))
        out = op.apply_u8(img.clone(), p, sizes)
        ptrs.append(A.scratch("augmix:chains", (1,), torch.uint8, "cpu").data_ptr())
        monkeypatch.setattr(torch.Tensor, "repeat", real)
        assert torch.equal(out, float_stage([op], img, seed))
        monkeypatch.setattr(torch.Tensor, "repeat", lambda self, *s: repeats.append(self.dim()) or real(self, *s))
    assert 4 not in repeats  # (the (n, 2) sizes table is repeated; no image batch)
    assert ptrs[0] == ptrs[1]


def test_compose_writes_into_a_batch_only_when_the_caller_says_it_owns_it():
    """``owned`` alone decides: a batch continued from a later stage (``start``) or given an ``alloc`` is still
    the caller's unless it says so (main read either as "the Loader owns it" and wrote into it); the Loader
    passes owned=True (its ring slot) and its batches are the same."""
    img = batch(4, 30, 30)
    ops = T.Compose([T.RandomHorizontalFlip(), T.RandAugment(num_ops=3, magnitude=15)])
    for kw in ({"start": 1}, {"start": 1, "alloc": lambda name, shape, dtype: torch.empty(shape, dtype=dtype)}):
        x = img.clone()
        out = ops({"image": x}, seed=5, **kw)
        assert torch.equal(x, img), kw
        assert not torch.equal(out["image"], img)
    x = img.clone()
    owned = ops({"image": x}, seed=5, start=1, owned=True)
    assert owned["image"].data_ptr() == x.data_ptr() and torch.equal(owned["image"], out["image"])


def test_sample_by_sample_ops_work_on_the_rows_that_drew_them_in_place(monkeypatch):
    """RandAugment's shears, bilinear rotate, one-table lookups, sharpness, colour and the histogram ops run on
    the batch's own rows (main copied the samples that drew an op out with index_select and back, two copies a
    sample and op); the other ops still take their copy; the float formula's pixels."""
    taken = []
    real = A._take_rows
    monkeypatch.setattr(A, "_take_rows", lambda x, rows: taken.append(len(rows)) or real(x, rows))
    op = T.RandAugment(num_ops=2, magnitude=9, interpolation="bilinear")
    img = batch(24, 20, 22)
    sizes = torch.tensor([[20, 22]]).expand(24, 2)
    p = op.params(sizes, torch.Generator().manual_seed(7))
    got = op.apply_u8(img.clone(), p, sizes)
    drawn = [op.names[i] for i in p["ops"].view(-1).tolist()]
    in_rows = sum(A._U8_KERNELS[n].in_rows(img, "bilinear") for n in drawn)
    others = sum(not A._U8_KERNELS[n].in_rows(img, "bilinear") and n != "Identity" for n in drawn)
    assert in_rows >= 20 and others >= 5  # (the draws have both kinds)
    assert sum(taken) <= others
    assert torch.equal(got, float_stage([op], img, 7))


@scripted_only
def test_per_sample_kernels_reuse_their_buffers_no_fresh_temporaries(monkeypatch):
    """A shear's zero-bordered lines are zeroed once a call (main: a fresh zeroed buffer a sample), sharpness and
    colour take their float copy in the thread's scratch (main: a fresh ``x.to(float32)`` a sample), the
    bilinear rotate writes grid_sample's output into one buffer; the same pixels."""
    from dsc.transforms import warp_gather as G

    zeros, converts = [], []
    real_zeros, real_to = torch.zeros, torch.Tensor.to
    img = batch(5, 30, 34)
    refs = {name: _float_formula(name, img, 0.3, "bilinear") for name in ("ShearX", "ShearY", "Rotate", "Sharpness",
                                                                          "Color")}
    monkeypatch.setattr(G.torch, "zeros", lambda *a, **k: zeros.append(a) or real_zeros(*a, **k))
    monkeypatch.setattr(torch.Tensor, "to", lambda self, *a, **k: converts.append(
        (self.dtype, a)) or real_to(self, *a, **k))
    got = {}
    for name in refs:
        zeros.clear()
        converts.clear()
        got[name] = A.apply_named_u8(name, img.clone(), torch.full((5,), 0.3, dtype=torch.float64), "bilinear")
        if name.startswith("Shear"):
            assert len([a for a in zeros if isinstance(a[0], tuple) and len(a[0]) == 2]) == 1, name  # (lines)
        assert not [c for c in converts if c[0] == torch.uint8 and torch.float32 in c[1]], name
    monkeypatch.undo()
    for name in refs:
        assert torch.equal(got[name], refs[name]), name


def test_every_kernel_that_claims_rows_works_on_just_those_rows():
    """One source of truth for which uint8 kernels take ``rows`` (``in_rows`` on each registered kernel): for
    every op, interpolation and channel count where a kernel says it does, running it on some rows of a batch
    in place gives the pixels of the same op on a copy of those rows, and leaves the other rows as they were
    (a kernel that claimed rows and ran on the whole batch, or on the first rows, fails here)."""
    claimed = set()
    for cn in (1, 3):
        img = batch(6, 24, 26)[..., :cn].contiguous()
        rows = torch.tensor([1, 4])
        for name, kernel in A._U8_KERNELS.items():
            for mode in ("nearest", "bilinear"):
                if name == "Identity" or not kernel.in_rows(img, mode):
                    continue
                claimed.add((name, mode))
                mag = torch.tensor([0.3, -0.2], dtype=torch.float64)
                if name == "Posterize":
                    mag = torch.tensor([3.0, 5.0], dtype=torch.float64)
                ref = A.apply_named_u8(name, img[rows].clone(), mag, mode)
                got = A.apply_named_u8(name, img.clone(), mag, mode, rows=rows)
                assert torch.equal(got[rows], ref), (name, mode, cn)
                others = torch.tensor([0, 2, 3, 5])
                assert torch.equal(got[others], img[others]), (name, mode, cn)
    # (the kernels that say they take rows: the bilinear warps, one-table lookups, the enhance and histogram ops)
    assert {("ShearX", "bilinear"), ("Rotate", "bilinear"), ("Brightness", "nearest"), ("Equalize", "nearest"),
            ("Sharpness", "bilinear"), ("Color", "nearest")} <= claimed
    assert ("Rotate", "nearest") not in claimed


def test_a_kernel_claiming_rows_it_lacks_is_caught(monkeypatch):
    """The check above fails for a kernel that says it takes rows and does not (Invert runs on every row)."""
    import pytest

    monkeypatch.setattr(A._U8_KERNELS["Invert"], "in_rows", lambda x, interpolation: True)
    with pytest.raises(AssertionError):
        test_every_kernel_that_claims_rows_works_on_just_those_rows()


def test_autoaugment_draws_its_sub_policies_without_per_sample_python(monkeypatch):
    """AutoAugment reads each sample's sub-policy (ops, bins, whether each runs) from (25, 2) tables at once (main
    wrote three tensor elements a sample and op in a Python loop: about 0.1 ms an image holding the GIL); the
    draws are the loop's."""
    sizes = torch.tensor([[32, 40]]).expand(300, 2)
    op = T.AutoAugment()
    ref_gen = torch.Generator().manual_seed(3)
    pid = torch.randint(len(A.IMAGENET_POLICY), (300,), generator=ref_gen)
    u = torch.rand((300, 2), generator=ref_gen, dtype=torch.float64)
    ops, bins, on = (torch.zeros((300, 2), dtype=d) for d in (torch.long, torch.long, torch.bool))
    for b, q in enumerate(pid.tolist()):  # (main's loop, the reference)
        for k, (name, prob, mi) in enumerate(A.IMAGENET_POLICY[q]):
            ops[b, k], bins[b, k], on[b, k] = op.names.index(name), mi or 0, u[b, k] <= prob
    ref_mag = op._magnitudes(A._AA_SPACE, ops, bins, sizes, 10, ref_gen)
    writes = []
    real = torch.Tensor.__setitem__
    monkeypatch.setattr(torch.Tensor, "__setitem__", lambda self, k, v: writes.append(k) or real(self, k, v))
    p = op.params(sizes, torch.Generator().manual_seed(3))
    monkeypatch.undo()
    assert len(writes) == 0
    assert torch.equal(p["ops"], ops) and torch.equal(p["on"], on) and torch.equal(p["mag"], ref_mag)


def test_histograms_reach_torch_without_torch_tensor_of_nested_lists(monkeypatch):
    """Equalize / AutoContrast take PIL's histogram lists through numpy (torch.tensor's element-by-element store
    of the nested lists was about 0.09 ms an image, holding the GIL); the same pixels."""
    img = batch(4, 40, 44)
    refs = {name: _float_formula(name, img, 0.0) for name in ("Equalize", "AutoContrast")}
    made = []
    real = torch.tensor
    monkeypatch.setattr(torch, "tensor", lambda data, *a, **k: made.append(
        isinstance(data, list) and data and isinstance(data[0], list)) or real(data, *a, **k))
    got = {name: A.apply_named_u8(name, img.clone(), torch.zeros(4, dtype=torch.float64)) for name in refs}
    monkeypatch.undo()
    assert not any(made)
    for name in refs:
        assert torch.equal(got[name], refs[name]), name


def test_augmix_mix_multiplies_no_uint8_operand(monkeypatch):
    """AugMix's mix casts each uint8 operand into its float buffer and multiplies there (main's torch.mul of a
    uint8 operand cast it into a fresh float temporary first: a malloc and a free a product); the same pixels."""
    op = T.AugMix()
    img = batch(5, 30, 34)
    sizes = torch.tensor([[30, 34]]).expand(5, 2)
    p = op.params(sizes, torch.Generator().manual_seed(1))
    p["on"] = torch.zeros_like(p["on"])  # (no chain op: the mix alone)
    ref = op.apply(img.permute(0, 3, 1, 2).float(), p, sizes, 255.0, True).clamp(0, 255).to(torch.uint8) \
        .permute(0, 2, 3, 1)
    u8 = []
    real = torch.mul
    monkeypatch.setattr(torch, "mul", lambda a, *r, **k: u8.append(getattr(a, "dtype", None) == torch.uint8)
                        or real(a, *r, **k))
    got = op.apply_u8(img.clone(), p, sizes)
    monkeypatch.undo()
    assert not any(u8)
    assert torch.equal(got, ref)


def test_shear_blends_multiply_no_uint8_operand(monkeypatch):
    """A bilinear shear's line windows are cast to float once, then blended (main multiplied the two uint8
    window views, each cast into a fresh float temporary first); the float formula's pixels. (Its loop run as
    plain Python, whose torch.mul calls can be watched: scripted, the same ops never reach Python.)"""
    from dsc import nogil

    monkeypatch.setattr(nogil, "ENABLED", False)
    img = batch(4, 30, 34)
    refs = {name: _float_formula(name, img, 0.3, "bilinear") for name in ("ShearX", "ShearY")}
    u8 = []
    real = torch.mul
    monkeypatch.setattr(torch, "mul", lambda a, *r, **k: u8.append(getattr(a, "dtype", None) == torch.uint8)
                        or real(a, *r, **k))
    got = {name: A.apply_named_u8(name, img.clone(), torch.full((4,), 0.3, dtype=torch.float64), "bilinear")
           for name in refs}
    monkeypatch.setattr(torch, "mul", real)
    assert u8 and not any(u8)
    for name in refs:
        assert torch.equal(got[name], refs[name]), name
