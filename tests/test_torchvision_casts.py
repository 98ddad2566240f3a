"""The torchvision form's casts in the last geometric stage: each fill's float form made once a batch, and the
one crop-merge rule that run_program and casts_directly share."""
import torch

from dsc import transforms as T
from dsc.transforms import fused
from dsc.transforms.resample import apply_geometric
from torch_calls import TorchCalls, scripted_only


def _packed(shapes, seed=0):
    g = torch.Generator().manual_seed(seed)
    images = [torch.randint(0, 256, s, dtype=torch.uint8, generator=g) for s in shapes]
    offsets = torch.zeros(len(images) + 1, dtype=torch.int64)
    torch.cumsum(torch.tensor([x.numel() for x in images]), 0, out=offsets[1:])
    return {"image": torch.cat([x.reshape(-1) for x in images]), "image_offsets": offsets,
            "image_shapes": torch.tensor(shapes, dtype=torch.int64)}


def test_a_zoom_outs_float_fill_is_made_once_a_batch_not_per_sample(monkeypatch):
    """A zoom-out (every sample on a canvas of the fill) cast as it is moved (``divisor``): the fill's float
    form (a dozen torch calls from Python for a fill per channel, each a GIL handover) is made once for the
    batch's eight samples, and every sample equals its uint8 result divided by 255."""
    made = []
    real = fused._float_fill
    monkeypatch.setattr(fused, "_float_fill", lambda *a: made.append(1) or real(*a))
    shapes = [(20 + 3 * b, 30 - 2 * b, 3) for b in range(8)]
    ops = [T.RandomZoomOut(fill=(123, 117, 104), side_range=(1.5, 2.5), p=1.0)]
    d = torch.full((), 255.0)
    got = apply_geometric(ops, _packed(shapes), torch.Generator().manual_seed(3), divisor=d)
    assert len(made) == 1
    want = apply_geometric(ops, _packed(shapes), torch.Generator().manual_seed(3))
    assert got["image"].dtype == torch.float32 and torch.equal(got["image_shapes"], want["image_shapes"])
    assert torch.equal(got["image"], want["image"].float().div_(d))


def test_run_program_and_casts_directly_merge_the_same_crops():
    """A crop inside the crop before it is one crop for both; one that leaves it is not merged by either."""
    inside = [("crop", -4, -6, 40, 50, 0.0), ("crop", 3, 5, 20, 25), ("flip", 0, True)]
    outside = [("crop", 2, 2, 10, 10, 0.0), ("crop", 3, 5, 20, 25)]
    assert fused._merged_crop(inside, 0) == ((-1, -1, 20, 25), 1)
    assert fused._merged_crop(outside, 0) == ((2, 2, 10, 10), 0)
    assert fused.casts_directly(inside, (20, 25)) and not fused.casts_directly(outside, (20, 25))
    x = torch.randint(0, 256, (30, 40, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    for program, hw in ((inside, (20, 25)), (outside, (20, 25))):
        want = torch.empty((*hw, 3), dtype=torch.uint8)
        fused.run_program(x, program, want, False, None)
        got = torch.empty((*hw, 3))
        fused.run_program(x, program, got, False, None, divisor=torch.full((), 255.0))
        assert torch.equal(got, want.float() / 255), program


@scripted_only
def test_the_batch_wide_cast_makes_no_torch_call_from_python_per_piece(monkeypatch):
    """Packed uint8 images cast by the torchvision form (a resize's output: the multiscale recipe) in pieces of
    ``_CAST_CHUNK``: the pieces' slices, casts and divisions run in one scripted call, so 100 pieces or 1 cost
    the same torch calls from Python (each a GIL handover to the Loader's other thread); the floats equal
    torchvision's ``float(x) / 255`` of each image."""
    import dsc.runtime.batches as B

    shapes = [(40 + b, 50 - b, 3) for b in range(5)]
    batch = _packed(shapes)
    calls = {}
    for chunk in (batch["image"].numel(), batch["image"].numel() // 100):
        monkeypatch.setattr(B, "_CAST_CHUNK", chunk)
        B._packed_chw_floats(dict(batch))  # (compiles on a first call)
        with TorchCalls(attributes=False) as c:
            images = B._packed_chw_floats(dict(batch))
        calls[chunk] = c.n
        o = batch["image_offsets"].tolist()
        for k, (img, shp) in enumerate(zip(images, shapes)):
            want = batch["image"][o[k]:o[k + 1]].view(shp).permute(2, 0, 1).float() / 255
            assert torch.equal(img, want)
    assert len(set(calls.values())) == 1, calls


@scripted_only
def test_resizes_of_several_sizes_run_in_one_scripted_call_with_run_programs_bytes():
    """A chain that resizes samples to several sizes and flips them (multiscale, scale jitter): every sample goes
    from its view into its place in the packed batch by one scripted call (fused.resize_ragged), not by
    run_program's ~10 torch calls from Python a sample (each a GIL handover); the same bytes as run_program."""
    from dsc.transforms.fused import plan_chain

    ops = [T.RandomShortestSize([24, 31, 40], 60), T.RandomHorizontalFlip(), T.RandomVerticalFlip()]
    calls = {}
    for B in (4, 12):
        shapes = [(20 + 3 * b, 33 - b, 3) for b in range(B)]
        apply_geometric(ops, _packed(shapes), torch.Generator().manual_seed(B))  # (compiles on a first call)
        with TorchCalls(attributes=False) as c:
            got = apply_geometric(ops, _packed(shapes), torch.Generator().manual_seed(B))
        calls[B] = c.n
        batch = _packed(shapes)
        plan = plan_chain(ops, batch["image_shapes"][:, :2], torch.Generator().manual_seed(B))
        o, out_o = batch["image_offsets"].tolist(), got["image_offsets"].tolist()
        for b, shp in enumerate(got["image_shapes"].tolist()):
            want = torch.empty(shp, dtype=torch.uint8)
            fused.run_program(batch["image"][o[b]:o[b + 1]].view(shapes[b]), plan.programs[b], want, False, None)
            assert torch.equal(got["image"][out_o[b]:out_o[b + 1]].view(shp), want), b
    assert (calls[12] - calls[4]) / 8 <= 10, calls  # (7 a sample: its views, its plan, its steps; with run_program 16)


def test_resize_ragged_leaves_nearest_roles_and_cast_pieces_any_step_to_the_exact_paths():
    """``fused.resize_ragged`` runs a nearest role (masks) through run_program, never its bilinear kernel, and
    ``batches.cast_pieces`` casts every element whatever the step (a step of 0 once left the buffer unwritten)."""
    import dsc.runtime.batches as B
    from dsc.transforms.fused import plan_chain

    shapes = [(20, 30, 1), (25, 18, 1)]
    batch = _packed(shapes)
    plan = plan_chain([T.RandomShortestSize([12], 40)], batch["image_shapes"][:, :2], torch.Generator())
    o = batch["image_offsets"].tolist()
    views = [batch["image"][o[b]:o[b + 1]].view(shp) for b, shp in enumerate(shapes)]
    out = [(h, w, 1) for h, w in plan.out_sizes.tolist()]
    starts = [0, out[0][0] * out[0][1], sum(h * w for h, w, _ in out)]
    flat = torch.zeros(starts[-1], dtype=torch.uint8)
    assert fused.resize_ragged(views, plan.programs, flat, starts, out, nearest=True) == [0, 1]
    assert not flat.any()
    assert fused.resize_ragged(views, plan.programs, flat, starts, out) == []  # (a bilinear role: the fast path)
    src = torch.arange(10, dtype=torch.uint8)
    for step in (0, 1, 3, 10, 100):
        buf = torch.full((10,), -7.0)
        B.cast_pieces(src, buf, torch.tensor(255.0), step)
        assert torch.equal(buf, src.float() / 255), step
