"""format="torchvision" on instance masks and keypoints (issue 30's speed goal): the per-sample and per-object
work of a flip batch runs in scripted kernels (dsc.nogil), so a Loader's filler thread hands the GIL to the
other one a few times a batch, not a few hundred. Each kernel gives the bytes of its plain-Python form
(``f.eager``), and the torch calls that reach Python are counted: they no longer grow with the samples."""
import numpy as np
import pytest
import torch

import dsc
from dsc import transforms as T
from dsc.formats.fields.object_masks import encode
from dsc.runtime import batches as B
from dsc.transforms import objects as O
from torch.overrides import TorchFunctionMode
from torch_calls import TorchCalls  # noqa: E402

pytest.importorskip("pycocotools")

from test_torchvision_form_batched import ds  # noqa: E402,F401 (its six COCO scenes with instance masks)


def _same(a, b):
    if isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride() and torch.equal(a, b)
    else:
        assert a == b


def _both(f, *args, shared=()):
    """``f`` scripted and plain on the same inputs (each on its own copies of the tensors, but for the
    ``shared`` arguments: scratch views of one buffer): the outputs and what each wrote into its inputs."""
    def copy(k, a):
        return a.clone() if isinstance(a, torch.Tensor) and k not in shared else a
    runs = []
    for g in (f.scripted(), f.eager):
        ins = [copy(k, a) for k, a in enumerate(args)]
        runs.append((g(*ins), [a for k, a in enumerate(ins) if k not in shared]))
    _same(runs[0][0], runs[1][0])
    _same(runs[0][1], runs[1][1])
    return runs[0][0]


def test_paste_masks_scripted_equals_eager_and_the_numpy_paste():
    rng = np.random.default_rng(1)
    masks = [rng.random((int(rng.integers(1, 9)), int(rng.integers(1, 11)))) < 0.5 for _ in range(12)]
    masks[4] = np.zeros((3, 3), bool)  # an empty mask: (0, 0, 0, 0)
    H, W = 14, 17
    full = []
    for m in masks:
        canvas = np.zeros((H, W), bool)
        t, l = int(rng.integers(0, H - m.shape[0] + 1)), int(rng.integers(0, W - m.shape[1] + 1))
        canvas[t:t + m.shape[0], l:l + m.shape[1]] = m
        full.append(canvas)
    rects, sizes, bits = encode(full)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).tolist()
    src = torch.from_numpy(np.frombuffer(bits, np.uint8).copy())
    rows = [[0, 1, 2], [], [3, 4, 6, 7], [9, 11]]  # rows 5, 8, 10 left out between kept ones (crowds)
    sizes_hw = [[H, W]] * len(rows)
    for fh, fw in ((0, 0), (1, 0), (0, 1), (1, 1)):
        flips = [[fh, fw]] * len(masks)
        r = rects.astype(np.int64)
        if fh:
            r[:, 0] = np.where(r[:, 2] > 0, H - r[:, 0] - r[:, 2], r[:, 0])
        if fw:
            r[:, 1] = np.where(r[:, 3] > 0, W - r[:, 1] - r[:, 3], r[:, 1])
        n = sum(len(x) for x in rows) * H * W
        words = torch.empty(max(offsets[x[-1] + 1] - offsets[x[0]] for x in rows if x), dtype=torch.int64)
        buf = torch.full((n,), 7, dtype=torch.uint8)  # (stale bytes: each sample's masks are zeroed)
        got, _ = _both(B.paste_masks, src, offsets, r.tolist(), flips, rows, sizes_hw, buf, True, B._UNPACKED,
                       B._UNPACKED_REVERSED, words, words.view(torch.uint8), B._descending(H), [], 0, shared=(10, 11))
        for x, m in zip(rows, got):
            want = [np.flip(full[i], [d for d, f in ((0, fh), (1, fw)) if f]) for i in x]
            assert np.array_equal(m.numpy(), np.asarray(want, np.uint8).reshape(len(x), H, W))
    # the crops' form (a chain that resampled the masks): crops back to back, byte offsets of the crops
    crops = [full[i][t:t + h, l:l + w] for i, (t, l, h, w) in enumerate(rects.tolist())]
    flat = torch.from_numpy(np.concatenate([c.reshape(-1) for c in crops]).astype(np.uint8))
    coff = np.concatenate([[0], np.cumsum([c.size for c in crops])]).tolist()
    got, _ = _both(B.paste_masks, flat, coff, rects.astype(np.int64).tolist(), [], rows, sizes_hw,
                   torch.full((sum(len(x) for x in rows) * H * W,), 7, dtype=torch.uint8), False, B._UNPACKED,
                   B._UNPACKED_REVERSED, torch.empty(0, dtype=torch.int64), torch.empty(0, dtype=torch.uint8),
                   B._descending(H), [], 0)
    for x, m in zip(rows, got):
        assert np.array_equal(m.numpy(), np.asarray([full[i] for i in x], np.uint8).reshape(len(x), H, W))


def test_the_image_kernels_scripted_equal_eager():
    src = torch.randint(0, 256, (5, 7, 3), dtype=torch.uint8)
    for fh in (False, True):
        for fw in (False, True):
            out = torch.empty(5, 7, 3)
            _both(B.cast_image, src, out, fh, fw, torch.full((), 255.0))
            B.cast_image(src, out, fh, fw, torch.full((), 255.0))
            dims = [d for d, f in ((0, fh), (1, fw)) if f]
            assert torch.equal(out, (src.flip(dims) if dims else src).float() / 255)
    buf = torch.arange(2 * (5 * 7 * 3 + 4 * 2 * 3), dtype=torch.float32)[1:]
    views = _both(B.image_views, buf, [[5, 7, 3], [4, 2, 3]], [0, 5 * 7 * 3], buf.storage_offset(), shared=(0,))
    assert torch.equal(views[0], buf[:105].view(5, 7, 3).permute(2, 0, 1))
    assert torch.equal(views[1], buf[105:105 + 24].view(4, 2, 3).permute(2, 0, 1))


def test_the_target_and_geometry_kernels_scripted_equal_eager():
    g = torch.Generator().manual_seed(0)
    boxes = torch.rand(7, 4, generator=g) * 50
    boxes[:, 2:] += boxes[:, :2]
    labels, crowd = torch.arange(7, dtype=torch.int32), torch.tensor([0, 1, 0, 0, 1, 0, 0], dtype=torch.uint8)
    offsets = torch.tensor([0, 3, 3, 7])
    for drop in (True, False):
        per, keep = _both(B.target_rows, ["boxes", "labels", "iscrowd"], [boxes, labels, crowd], offsets, drop)
        assert [len(p[0]) for p in per] == ([2, 0, 3] if drop else [3, 0, 4]) and (keep is None) == (not drop)
    fwd = torch.linalg.inv(torch.tensor([[[-1.0, 0, 60], [0, 1, 0], [0, 0, 1]], [[0.5, 0, 3], [0, 0.5, 1], [0, 0, 1]],
                                         [[1.0, 0, 0], [0, 1, 0], [0, 0, 1]]], dtype=torch.float64))
    sample = torch.tensor([0, 0, 0, 2, 2, 2, 2])
    w, h = torch.tensor([60.0, 40, 30], dtype=torch.float64), torch.tensor([60.0, 40, 30], dtype=torch.float64)
    for drop in (None, torch.tensor([True, False, True, True, True, True, True])):
        for filt in (True, False):
            _both(O.boxes_through, boxes, fwd, sample, w, h, drop, [labels, crowd], filt)
    points = torch.rand(7, 17, 3, generator=g) * 80
    points[..., 2] = torch.randint(0, 3, (7, 17), generator=g).float()
    flip = list(range(17))[::-1]
    for index in (flip, []):
        _both(O.keypoints_through, points, fwd[sample], sample == 0, index, w[sample].view(-1, 1),
              h[sample].view(-1, 1))


def test_a_flip_batch_in_the_torchvision_form_makes_few_torch_calls_from_python(ds):
    """Counted in the pieces this path runs: the form (main: 54 calls for 1 sample, 69 for 6, growing with
    the samples; now the same for both) and the boxes', masks' and keypoints' move (main: 147-162)."""
    import dsc.runtime.dataset as D
    from dsc import nogil

    if not nogil.ENABLED:
        pytest.skip("DSC_NOGIL=0: the kernels run as plain Python, each op a call")

    form, moves = {}, []
    real = D.move_objects

    def counted(*a, **k):
        with TorchCalls(attributes=False) as c:
            real(*a, **k)
        moves.append(c.n)
    for b in (1, 6):
        batch = next(iter(dsc.Loader(ds, batch_size=b, num_threads=0, transforms=[T.RandomHorizontalFlip(1.0)])))
        with TorchCalls(attributes=False) as c:
            B.torchvision_form(dict(batch), ds.schema)
        form[b] = c.n
        D.move_objects = counted
        try:
            next(iter(dsc.Loader(ds, batch_size=b, num_threads=0, format="torchvision",
                                 transforms=[T.RandomHorizontalFlip(1.0)])))
        finally:
            D.move_objects = real
    assert form[6] <= form[1] + 2 and form[6] <= 35, form
    assert max(moves) <= 80, moves


class _Ops(TorchFunctionMode):
    """The torch functions called from Python in its block, each with its first argument's shape: ``ops``."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name != "__get__":
            self.ops.append((name, tuple(args[0].shape) if args and isinstance(args[0], torch.Tensor) else None))
        return func(*args, **(kwargs or {}))


def _ring():
    """An allocator that hands each name's buffer again, batch after batch (the Loader's ring once a batch is
    dropped), made with stale bytes (7s) in it."""
    bufs = {}

    def alloc(name, shape, dtype):
        n = int(np.prod(shape))
        if name not in bufs or bufs[name].numel() < n or bufs[name].dtype != dtype:
            bufs[name] = torch.full((2 * n + 64,), 7, dtype=dtype)
        return bufs[name][:n].view(shape)
    return alloc, bufs


def _bits_batch(ds, idx, fw):
    """Samples ``idx``' masks as the gather leaves them for format="torchvision" (packed bits, flips to make:
    ``fw`` a left-right flip a sample), with their box offsets and sizes; and the same as crops."""
    from test_torchvision_form_batched import _bits_and_crops

    sizes = ds.sample_sizes(idx).numpy()
    bits, crops = _bits_and_crops(ds, idx, [(0, f, h, w) for f, (h, w) in zip(fw, sizes.tolist())])
    counts = np.diff(ds.readers["masks"].box_offsets.astype(np.int64))[idx]
    o = torch.from_numpy(np.concatenate([[0], np.cumsum(counts)]))
    return [{**{k: torch.as_tensor(v) for k, v in form.items()}, "box_offsets": o,
             "image_sizes": torch.from_numpy(sizes)} for form in (bits, crops)]


SERIES = [([0, 1, 2], [1, 0, 1]), ([3, 4, 5], [0, 0, 1]), ([5, 0, 3], [1, 1, 1]), ([1, 2, 4], [0, 1, 0]),
          ([2, 5], [1, 1])]


def test_a_reused_mask_buffer_is_cleared_where_its_last_batch_wrote(ds, monkeypatch):
    """format="torchvision"'s (k, H, W) masks from a buffer the ring hands again: only the rectangles its last
    batch pasted are zeroed (main zeroed the whole buffer every batch: 8x the crops' bytes on the bench set, the
    form's costliest mask pass), the masks still exact, batch after batch, with flips of every kind. Counted in
    the plain form of the kernel: the elements each batch zeroes."""
    monkeypatch.setattr(B, "paste_masks", B.paste_masks.eager)  # (its ops reach Python: counted)
    alloc, bufs = _ring()

    def run(idx, fw):
        bits, crops = _bits_batch(ds, idx, fw)
        with _Ops() as c:
            got = B._target_masks(bits, "masks", None, alloc)
        ref = B._target_masks(crops, "masks", None)  # (a new buffer, zeroed whole)
        assert len(got) == len(ref) and all(torch.equal(a, b) for a, b in zip(got, ref))
        zeroed = sum(int(np.prod(shape)) for name, shape in c.ops if name == "zero_")
        area = int((crops["masks_rects"][:, 2] * crops["masks_rects"][:, 3]).sum())
        return zeroed, area, sum(m.numel() for m in got)
    zeroed, last, total = run(list(range(len(ds))), [0] * len(ds))  # the largest batch first: no growth later
    assert zeroed == total  # (a buffer's first batch: zeroed whole, its stale bytes with it)
    for idx, fw in SERIES:
        zeroed, area, total = run(idx, fw)
        assert zeroed == last < total / 2, (zeroed, last, total)  # main: zeroed == total
        last = area


def test_a_torch_write_into_a_dropped_mask_is_cleared_in_the_next_batch(ds):
    """A user who writes into a target's masks with torch (any in-place op, on any view) and drops them: the
    buffer's next batch sees the write (its version counter moved) and zeroes the whole buffer again."""
    alloc, bufs = _ring()
    bits, _ = _bits_batch(ds, *SERIES[0])
    got = B._target_masks(bits, "masks", None, alloc)
    got[1][0].fill_(1)  # (one object's whole mask: pixels no rectangle covers)
    got[2][:, -1].add_(3)
    del got
    for idx, fw in SERIES[1:3]:
        bits, crops = _bits_batch(ds, idx, fw)
        got = B._target_masks(bits, "masks", None, alloc)
        ref = B._target_masks(crops, "masks", None)
        assert all(torch.equal(a, b) for a, b in zip(got, ref))
        del got


def test_left_right_flips_unpack_the_bits_back_to_front_not_flip_each_crop(ds, monkeypatch):
    """A sample flipped left to right has its packed bits unpacked back to front (each crop comes out mirrored
    both ways) and each crop's rows put back in order by one index_select: no ``flip`` of a crop (main flipped
    each, flip's kernel at twice the time); the flip of the sample's bytes (1-D) is the only one."""
    monkeypatch.setattr(B, "paste_masks", B.paste_masks.eager)
    bits, crops = _bits_batch(ds, [0, 1, 2, 3], [1, 1, 0, 1])
    with _Ops() as c:
        got = B._target_masks(bits, "masks", None)
    assert all(torch.equal(a, b) for a, b in zip(got, B._target_masks(crops, "masks", None)))
    flips = [shape for name, shape in c.ops if name == "flip"]
    assert flips and all(len(shape) == 1 for shape in flips), flips
    assert sum(name == "index_select" for name, _ in c.ops) > len(flips)


def test_one_mirror_helper_serves_images_and_masks_scripted_and_plain():
    from dsc.transforms.fused import mirrored

    scripted = torch.jit.script(mirrored)
    for dtype in (torch.uint8, torch.uint16, torch.float32):
        x = torch.arange(5 * 7 * 3).view(5, 7, 3).to(dtype)
        for rows in (False, True):
            for columns in (False, True):
                want = np.flip(x.to(torch.int64).numpy(), [d for d, f in ((0, rows), (1, columns)) if f])
                for f in (mirrored, scripted):
                    y = f(x, rows, columns)
                    assert y.dtype == dtype and np.array_equal(y.to(torch.int64).numpy(), want)


def test_an_untracked_write_is_cleared_with_the_opt_out(ds, monkeypatch):
    """``DSC_MASKS_ZERO_WHOLE=1``: every buffer zeroed whole, so a write torch's version counter does not see (a
    numpy write into dropped masks) never reaches a later batch."""
    monkeypatch.setenv("DSC_MASKS_ZERO_WHOLE", "1")
    alloc, bufs = _ring()
    bits, _ = _bits_batch(ds, *SERIES[0])
    got = B._target_masks(bits, "masks", None, alloc)
    got[1][0].numpy()[...] = 1  # (unseen by torch)
    del got
    bits, crops = _bits_batch(ds, *SERIES[1])
    got = B._target_masks(bits, "masks", None, alloc)
    ref = B._target_masks(crops, "masks", None)
    assert all(torch.equal(a, b) for a, b in zip(got, ref))


def test_the_descending_rows_are_long_enough_whatever_another_thread_made(monkeypatch):
    """_descending hands the tensor it checked or made (another thread replacing the shared one with a shorter
    one of its own in between cannot shorten it)."""
    class Racing(list):
        def __setitem__(self, i, v):  # (another thread's shorter table lands right after this one's)
            super().__setitem__(i, v)
            super().__setitem__(i, torch.arange(2047, -1, -1))
    monkeypatch.setattr(B, "_DESCENDING", Racing([torch.zeros(0, dtype=torch.int64)]))
    assert len(B._descending(4000)) >= 4000
