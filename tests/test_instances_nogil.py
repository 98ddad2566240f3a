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
        got = _both(B.paste_masks, src, offsets, r.tolist(), flips, rows, sizes_hw, buf, True, B._UNPACKED, words,
                    words.view(torch.uint8), shared=(9, 10))
        for x, m in zip(rows, got):
            want = [np.flip(full[i], [d for d, f in ((0, fh), (1, fw)) if f]) for i in x]
            assert np.array_equal(m.numpy(), np.asarray(want, np.uint8).reshape(len(x), H, W))
    # the crops' form (a chain that resampled the masks): crops back to back, byte offsets of the crops
    crops = [full[i][t:t + h, l:l + w] for i, (t, l, h, w) in enumerate(rects.tolist())]
    flat = torch.from_numpy(np.concatenate([c.reshape(-1) for c in crops]).astype(np.uint8))
    coff = np.concatenate([[0], np.cumsum([c.size for c in crops])]).tolist()
    got = _both(B.paste_masks, flat, coff, rects.astype(np.int64).tolist(), [], rows, sizes_hw,
                torch.full((sum(len(x) for x in rows) * H * W,), 7, dtype=torch.uint8), False, B._UNPACKED,
                torch.empty(0, dtype=torch.int64), torch.empty(0, dtype=torch.uint8))
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
