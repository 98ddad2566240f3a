"""fused.run_batch's scripted path (crop inside the image, resize, flips: RandomResizedCrop + flips) gives
run_program's bytes, uint8 and through the float pass, and makes no torch call a sample from Python."""
import numpy as np
import torch

from dsc.transforms import fused
from dsc.transforms.photometric import PixelPost
from torch_calls import TorchCalls  # noqa: E402
from torch_calls import scripted_only  # noqa: E402



def _programs(rng, views, out_hw):
    progs = []
    for v in views:
        H, W = v.shape[:2]
        kind = rng.integers(0, 4)
        if kind == 0:  # partly outside: the per-sample path
            progs.append([("crop", -3, -2, H, W, 0.0), ("resize", *out_hw)])
            continue
        h, w = (int(rng.integers(1, H + 1)), int(rng.integers(1, W + 1))) if kind != 1 else out_hw
        top, left = int(rng.integers(0, H - h + 1)), int(rng.integers(0, W - w + 1))
        flips = [("flip", int(a), bool(rng.integers(0, 2))) for a in rng.integers(0, 2, rng.integers(0, 3))]
        progs.append([("crop", top, left, h, w), ("resize", *out_hw), *flips])
    return progs


def _run(views, progs, out, post, per_sample):
    if per_sample:
        for b, v in enumerate(views):
            fused.run_program(torch.from_numpy(v), progs[b], out[b], False, 0.0, post)
        return out
    return fused.run_batch(views, progs, out, False, 0.0, post)


def test_the_scripted_crop_resize_flip_path_gives_run_programs_bytes():
    rng = np.random.default_rng(0)
    for c in (1, 3, 4):
        views = [rng.integers(0, 256, (int(rng.integers(20, 60)), int(rng.integers(20, 60)), c), dtype=np.uint8)
                 for _ in range(24)]
        progs = _programs(rng, views, (17, 19))
        for post in (None, PixelPost(torch.float32, (1 / 255,), (0.0,)),
                     PixelPost(torch.float16, tuple(0.01 * (k + 1) for k in range(c)), (-0.5,) * c, True)):
            if post is None:
                a, b = (torch.zeros(24, 17, 19, c, dtype=torch.uint8) for _ in range(2))
            else:
                a, b = (post.empty(24, 17, 19, c) for _ in range(2))
            _run(views, progs, a, post, True)
            _run(views, progs, b, post, False)
            assert torch.equal(a, b), (c, post)


@scripted_only
def test_the_scripted_path_makes_no_torch_call_a_sample():
    rng = np.random.default_rng(1)

    def calls(n):
        views = [rng.integers(0, 256, (40, 50, 3), dtype=np.uint8) for _ in range(n)]
        progs = [[("crop", 2, 3, 30, 31), ("resize", 16, 16), ("flip", 0, True)] for _ in range(n)]
        out = torch.empty(n, 16, 16, 3, dtype=torch.uint8)
        fused.run_batch(views, progs, out, False, 0.0)  # (compiled on a first call)
        with TorchCalls(attributes=False) as c:
            fused.run_batch(views, progs, out, False, 0.0)
        return c.n
    assert calls(9) == calls(3)


def test_the_scripted_shear_gives_the_plain_bytes_and_makes_no_torch_call_a_sample(monkeypatch):
    from dsc import nogil
    from dsc.transforms import warp_gather as G

    g = torch.Generator().manual_seed(3)

    def case(N, axis, fill):
        M = torch.eye(3, dtype=torch.float64).repeat(N, 1, 1)
        M[:, 0 if axis == 1 else 1, 1 if axis == 1 else 0] = torch.rand(N, generator=g, dtype=torch.float64) - 0.5
        return torch.randint(0, 256, (N, 21, 17, 3), dtype=torch.uint8, generator=g), M

    for axis in (0, 1):
        for fill in (None, 7.0, (1.0, 2.0, 250.0)):
            x, M = case(6, axis, fill)
            got = G.shear_u8(x.clone(), M, fill, axis)
            monkeypatch.setattr(nogil, "ENABLED", False)
            want = G.shear_u8(x.clone(), M, fill, axis)
            monkeypatch.setattr(nogil, "ENABLED", True)
            assert torch.equal(got, want), (axis, fill)

    def calls(N):
        x, M = case(N, 1, 7.0)
        G.shear_u8(x, M, 7.0, 1)
        with TorchCalls(attributes=False) as c:
            G.shear_u8(x, M, 7.0, 1)
        return c.n
    assert calls(9) == calls(3)


def test_a_one_pixel_wide_crop_of_a_transposed_view_is_resized_from_its_own_pixels():
    """torch calls a (11, 1, 1) view with strides (1, 20, 1) contiguous; the uint8 antialiased kernel read it by
    the stride of 20 (other pixels, or past the buffer). Both paths copy such a view first (review)."""
    big = np.random.default_rng(0).integers(0, 256, (3, 20, 1), dtype=np.uint8)
    v = torch.from_numpy(big).transpose(0, 1)  # (20, 3, 1)
    program = [("crop", 2, 0, 11, 1), ("resize", 1, 18)]
    want = torch.empty(1, 18, 1, dtype=torch.uint8)
    fused.run_program(v[2:13, 0:1].contiguous().clone(), [("resize", 1, 18)], want, False, 0.0)
    for per_sample in (True, False):
        out = torch.zeros(1, 1, 18, 1, dtype=torch.uint8)
        if per_sample:
            fused.run_program(v, program, out[0], False, 0.0)
        else:
            fused.run_batch([v], [program], out, False, 0.0)
        assert torch.equal(out[0], want), per_sample


def test_run_batch_with_no_programs_runs_each_sample_as_it_is():
    out = torch.zeros(1, 4, 4, 3, dtype=torch.uint8)
    fused.run_batch([torch.full((4, 4, 3), 7, dtype=torch.uint8)], [], out, False, 0.0)
    assert bool((out == 7).all())
