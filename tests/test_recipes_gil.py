"""What the photometric / auto-augment kernels run while holding the GIL, counted (issue 32): the Loader's two
filler threads scale only as far as a kernel lets the GIL go, so per-sample Python (PIL ``Image`` objects made
and wrapped, fresh tensors, batch-sized float copies) is counted here; the pixels stay the float formula's."""
import sys

import torch

from dsc.transforms import augment as A
from dsc import nogil as N
from dsc.transforms import color as C
from torch_calls import TorchCalls, scripted_only

from test_recipes_uint8 import batch


def _python_calls(fn) -> int:
    """Python-level calls (Python functions and C functions called from Python) while ``fn`` runs."""
    n = 0

    def count(frame, event, arg):
        nonlocal n
        if event in ("call", "c_call"):
            n += 1
    sys.setprofile(count)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return n


def _per_sample_calls(name: str, m: float, channels: int = 3) -> float:
    """The Python calls one more sample adds to the op's kernel (calls on 12 samples less those on 4, over 8)."""
    def run(n):
        img = batch(n, 160, 150)[..., :channels].contiguous()  # (large enough for the PIL path)
        mag = torch.full((n,), m, dtype=torch.float64)
        A.apply_named_u8(name, img[:1].clone(), mag[:1])  # (warm: first-call imports and caches)
        return _python_calls(lambda: A.apply_named_u8(name, img, mag))
    return (run(12) - run(4)) / 8


def test_lookups_and_histograms_take_a_few_python_calls_a_sample():
    """One-table lookups (brightness, solarize, contrast) through PIL's core calls over the sample's memory,
    Equalize / AutoContrast from core images (the RGB raw decoder in, the encoder back), Color and Sharpness in
    buffers taken once a batch with float factors made at once: main made and wrapped PIL ``Image`` objects a
    sample (79 Python calls a sample for a lookup, 146 for Equalize) and took its scratch and factor tensors
    sample by sample (Color 30, Sharpness 56)."""
    for name, m, most in (("Brightness", 0.3, 16), ("Solarize", 0.4, 16), ("Contrast", -0.4, 24),
                          ("Equalize", 0.0, 36), ("AutoContrast", 0.0, 36), ("Color", 0.3, 18),
                          ("Sharpness", 0.3, 18)):
        got = _per_sample_calls(name, m)
        assert got <= most, (name, got)
    assert _per_sample_calls("Equalize", 0.0, channels=1) <= 24


def test_core_calls_give_the_image_paths_pixels(monkeypatch):
    """The PIL core path and the ``Image`` path it replaced (still there where a Pillow lacks the core calls)
    give the same pixels: lookups and histogram ops, one and three channels."""
    called = []
    real_map = C._map_l
    monkeypatch.setattr(C, "_map_l", lambda *a: called.append(a[1:]) or real_map(*a))
    for cn in (1, 3):
        img = batch(4, 260, 260)[..., :cn].contiguous()  # (>= 64 KiB a sample: the lookups take the core path)
        img[0] = 9  # (a flat sample)
        for name, m in (("Brightness", 0.3), ("Contrast", -0.4), ("Equalize", 0.0), ("AutoContrast", 0.0)):
            mag = torch.full((4,), m, dtype=torch.float64)
            got = A.apply_named_u8(name, img.clone(), mag)
            with monkeypatch.context() as mp:
                mp.setattr(C, "_CORE_CALLS", False)
                ref = A.apply_named_u8(name, img.clone(), mag)
            assert torch.equal(got, ref), (name, cn)
            assert torch.equal(got, A._to_u8(A.apply_named(name, A._to_float(img), mag, 255.0, True))), (name, cn)
    assert called, "the core lookup never ran"


def test_color_on_rgba_and_contrast_at_two_torch_threads_are_the_float_formulas():
    """Color's grey on 4 channels is that of channels 0-2 (the matmul takes 3); Contrast's per-sample mean is
    summed on one thread whatever the caller's torch thread count (num_threads=0 loaders run in the caller's)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (2, 20, 21, 4), generator=g, dtype=torch.uint8)
    m = torch.tensor([0.3, -0.5], dtype=torch.float64)
    assert torch.equal(A.apply_named_u8("Color", x.clone(), m),
                       A._to_u8(A.apply_named("Color", A._to_float(x), m, 255.0, True)))
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        x = torch.randint(0, 256, (3, 300, 320, 3), generator=g, dtype=torch.uint8)
        mag = torch.full((3,), 0.28927720543522306 - 1.0, dtype=torch.float64)
        means = A.contrast_mean_u8(x, range(3))
        torch.set_num_threads(1)
        assert torch.equal(means, C.contrast_mean(A._to_float(x), True))
        torch.set_num_threads(2)
        assert torch.equal(A.apply_named_u8("Contrast", x.clone(), mag),
                           A._to_u8(A.apply_named("Contrast", A._to_float(x), mag, 255.0, True)))
    finally:
        torch.set_num_threads(threads)


def test_contrast_mean_makes_no_float_copy_of_the_samples(monkeypatch):
    """Contrast (auto-augment and RandomPhotometricDistort) takes each sample's grey mean from its float copy in
    the thread's scratch, in cache: main cast every sample that drew it to float at once (12 MB for 32 images
    of 224 px), read it twice and freed it. The means are the float formula's to the bit."""
    img = batch(6, 40, 50)
    img[2] = 17
    ref_mean = C.contrast_mean(A._to_float(img), True)
    ref = {k: A._to_u8(A.apply_named("Contrast", A._to_float(img), torch.full((6,), -0.4, dtype=torch.float64),
                                     255.0, True)) for k in (0,)}
    sizes = torch.tensor([[40, 50]]).expand(6, 2)
    op = A.RandomPhotometricDistort(p=1.0)
    p = op.params(sizes, torch.Generator().manual_seed(2))
    ref_rpd = A._to_u8(op.apply(A._to_float(img), p, sizes, 255.0, True))
    cast = []
    real = A._to_float
    monkeypatch.setattr(A, "_to_float", lambda x: cast.append(len(x)) or real(x))
    assert torch.equal(A.contrast_mean_u8(img, range(6)), ref_mean)
    got = A.apply_named_u8("Contrast", img.clone(), torch.full((6,), -0.4, dtype=torch.float64))
    assert torch.equal(got, ref[0])
    got = A.apply_named_u8("Contrast", img.clone(), torch.full((2,), -0.4, dtype=torch.float64),
                           rows=torch.tensor([1, 4]))
    assert torch.equal(got[[1, 4]], ref[0][[1, 4]]) and torch.equal(got[[0, 2, 3, 5]], img[[0, 2, 3, 5]])
    assert torch.equal(op.apply_u8(img.clone(), p, sizes), ref_rpd)
    assert cast == []


def test_photometric_saturation_on_the_cpu_makes_no_fresh_float_tensors(monkeypatch):
    """RandomPhotometricDistort's saturation (then hue) on a CPU piece runs in the thread's scratch, products in
    place and the grey added channel by channel: it never goes through ``blend`` (two fresh tensors a piece and
    a broadcast over the innermost axis of 3), and gives the float formulas' pixels."""
    img = batch(5, 33, 47)
    img[1] = 200
    on = torch.tensor([True, True, False, True, True])
    hue_on = torch.tensor([True, False, True, False, True])
    f = torch.tensor([0.5, 1.4, 1.2, 0.0, 1.5], dtype=torch.float64)
    h = torch.tensor([0.05, 0.0, -0.03, 0.1, -0.5], dtype=torch.float64)
    ref = A._to_float(img)
    for b in range(5):
        y = ref[b:b + 1]
        if on[b]:
            y = C.saturation(y, f[b:b + 1], 255.0, True)
        if hue_on[b]:
            y = C.hue(y, h[b:b + 1], 255.0, True)
        ref[b:b + 1] = y
    ref = A._to_u8(ref)

    def refuse(*a, **k):
        raise AssertionError("blend on the CPU's pieces")
    monkeypatch.setattr(C, "blend", refuse)
    got = C.saturation_hue_u8(img.clone(), on, f, hue_on, h)
    assert torch.equal(got, ref)


def test_the_dispatcher_asks_a_kernel_s_predicate_once(monkeypatch):
    """``apply_named_u8`` asks ``in_rows`` once and hands a kernel that said yes a list of rows (every row when
    all drew it): the histogram kernel no longer asks its own predicate again (main re-called it inside)."""
    asked = []
    real = A._U8_KERNELS["Equalize"].in_rows

    def refuse(*a, **k):
        raise AssertionError("the kernel re-asked its predicate")
    monkeypatch.setattr(A, "_pil_histograms", refuse)
    monkeypatch.setattr(A._U8_KERNELS["Equalize"], "in_rows", lambda x, i: asked.append(1) or real(x, i))
    img = batch(4, 30, 40)
    mag = torch.zeros(4, dtype=torch.float64)
    ref = A._to_u8(A.apply_named("Equalize", A._to_float(img), mag, 255.0, True))
    assert torch.equal(A.apply_named_u8("Equalize", img.clone(), mag), ref)
    got = A.apply_named_u8("Equalize", img.clone(), mag[:2], rows=torch.tensor([0, 3]))
    assert torch.equal(got[[0, 3]], ref[[0, 3]]) and torch.equal(got[[1, 2]], img[[1, 2]])
    assert asked == [1, 1]


@scripted_only
def test_saturation_and_hue_on_the_cpu_reach_python_a_few_times_a_batch(monkeypatch):
    """RandomPhotometricDistort's saturation + hue on CPU uint8 run their loop over samples and pieces scripted
    (color._saturation_hue_pieces, dsc.nogil): a batch's ~70 ops a piece never come back to Python (each took the
    GIL, the Loader's other filler thread waiting); the bytes are the plain loop's."""
    monkeypatch.setattr(C, "PIECE_PIXELS", 1 << 10)
    img = batch(6, 45, 61)  # 3 pieces a sample
    on = torch.tensor([True, False, True, True, False, True])
    hue_on = torch.tensor([True, True, False, True, False, True])
    f = torch.tensor([0.5, 1.4, 1.2, 0.7, 1.0, 1.5], dtype=torch.float64)
    h = torch.tensor([0.05, 0.0, -0.03, 0.1, 0.02, -0.5], dtype=torch.float64)
    C.saturation_hue_u8(img.clone(), on, f, hue_on, h)  # (the first call compiles)
    with TorchCalls(attributes=False) as calls:
        got = C.saturation_hue_u8(img.clone(), on, f, hue_on, h)
    assert calls.n < 60, calls.n  # (the same outside the loop, any batch; the plain loop: 1,958 here)
    monkeypatch.setattr(N, "ENABLED", False)
    assert torch.equal(got, C.saturation_hue_u8(img.clone(), on, f, hue_on, h))
