"""Photometric ops before a crop work only on the pixels the crop keeps (issue 32's SSD recipe): the
look-ahead draws the geometric stage's parameters right after the photometric ones (the same generator, the
same order) and runs the photometric ops on each sample's source window (``T.read_window``); the batches'
bytes are those of processing every pixel (``DSC_PHOTOMETRIC_WHOLE=1``)."""
import hashlib

import pytest
import torch

import dsc
from dsc import transforms as T
from dsc.synthetic import detection_scenes, write_coco
from dsc.transforms.presets import MEAN_255


@pytest.fixture(scope="module")
def scenes(tmp_path_factory):
    """24 JPEG scenes of 64-128 px with boxes (JPEG: textured pixels), stored ragged."""
    root = tmp_path_factory.mktemp("lookahead")
    ann, images = write_coco(root / "src", detection_scenes(24, seed=2, size_range=(64, 128), ext=".jpg"))
    dsc.compile_coco(ann, images, root / "ds", progress=False, workers=1)
    return dsc.open(root / "ds")


def _feed(h, v):
    if isinstance(v, torch.Tensor):
        h.update(str((tuple(v.shape), v.dtype)).encode())
        h.update(v.contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    elif isinstance(v, dict):
        for k in sorted(v):
            h.update(k.encode())
            _feed(h, v[k])
    elif isinstance(v, (list, tuple)):
        for x in v:
            _feed(h, x)
    else:
        h.update(repr(v).encode())


def _digest(ds, ops, fmt, monkeypatch, whole: bool, threads: int = 2, windowed: list | None = None) -> str:
    """The Loader's batches digested; ``windowed`` collects whether each sample ran on its window."""
    monkeypatch.setenv("DSC_PHOTOMETRIC_WHOLE", "1" if whole else "0")
    if windowed is not None:
        from dsc.transforms import augment

        real = augment._run_window

        def counted(*a, **k):
            windowed.append(real(*a, **k))
            return windowed[-1]
        monkeypatch.setattr(augment, "_run_window", counted)
    loader = dsc.Loader(ds, batch_size=8, order="random", seed=3, transforms=ops, format=fmt, num_threads=threads)
    h = hashlib.sha256()
    for epoch in (0, 1):
        loader.set_epoch(epoch)
        for b in loader:
            _feed(h, b)
    return h.hexdigest()


CHAINS = {
    "ssd": lambda: T.presets.detection("ssd"),
    # the YOLO recipe's HSV jitter before a crop (its preset puts it last: no window there)
    "hsv-crop": lambda: [T.RandomHSV(), T.RandomIoUCrop(), T.RandomHorizontalFlip()],
    # every photometric op drawn: contrast before and after saturation/hue, permutations
    "distort-all": lambda: [T.RandomPhotometricDistort(p=1.0), T.RandomZoomOut(fill=MEAN_255, p=1.0),
                            T.RandomIoUCrop(), T.RandomHorizontalFlip()],
    # a flip before the crop (the window mirrored), a crop partly outside the image, a per-pixel op after it
    "flip-then-crop": lambda: [T.RandomPhotometricDistort(), T.RandomHSV(), T.RandomHorizontalFlip(1.0),
                               T.RandomCrop(72, pad_if_needed=True, fill=0)],
    # a resize after the crop (the window is the crop's), a crop after the resize
    "crop-resize-crop": lambda: [T.RandomPhotometricDistort(p=1.0), T.RandomGrayscale(0.5), T.RandomIoUCrop(),
                                 T.RandomShortestSize([40, 56], 80), T.RandomCrop(32, pad_if_needed=True)],
    # an op with whole-image statistics after another op: the whole image
    "stats-second": lambda: [T.RandomHSV(), T.RandomPhotometricDistort(p=1.0), T.RandomIoUCrop()],
}


@pytest.mark.parametrize("name,fmt", [("ssd", "torchvision"), ("ssd", "dict"), ("hsv-crop", "torchvision"), ("distort-all", "torchvision"), ("distort-all", "dict"),
                                      ("flip-then-crop", "dict"), ("crop-resize-crop", "dict"),
                                      ("stats-second", "dict")])
def test_the_look_ahead_gives_the_bytes_of_processing_every_pixel(scenes, monkeypatch, name, fmt):
    """Two epochs of 3 batches of 8, digested (every key, shape and byte): look-ahead on = every pixel
    processed, for the ssd preset, its forms and chains that reach each case of the window (each one windowing
    some samples, which the test sees)."""
    whole = _digest(scenes, CHAINS[name](), fmt, monkeypatch, whole=True)
    windowed = []
    assert _digest(scenes, CHAINS[name](), fmt, monkeypatch, whole=False, windowed=windowed) == whole
    # the look-ahead ran (some samples on their window), except where an op with whole-image statistics follows
    assert any(windowed) == (name != "stats-second"), windowed
    if name == "distort-all":  # (and for any thread count)
        assert _digest(scenes, CHAINS[name](), fmt, monkeypatch, whole=False, threads=0) == whole


class _Counted(T.RandomPhotometricDistort):
    """The SSD recipe's RandomPhotometricDistort, counting the pixels its per-pixel work is run on."""

    pixels = 0

    def apply_u8(self, x, p, sizes):
        _Counted.pixels += x.shape[0] * x.shape[1] * x.shape[2]
        return super().apply_u8(x, p, sizes)


def test_the_ssd_recipe_s_photometric_ops_process_only_the_pixels_its_crops_keep(scenes, monkeypatch):
    ops = [_Counted(), T.RandomZoomOut(fill=MEAN_255), T.RandomIoUCrop(), T.RandomHorizontalFlip()]
    total = sum(h * w for h, w, _ in scenes.get_batch(list(range(len(scenes))))["image_shapes"].tolist())
    counts = {}
    for whole in (True, False):
        monkeypatch.setenv("DSC_PHOTOMETRIC_WHOLE", "1" if whole else "0")
        _Counted.pixels = 0
        for b in dsc.Loader(scenes, batch_size=8, order="random", seed=1, transforms=ops, format="torchvision"):
            pass
        counts[whole] = _Counted.pixels
    assert counts[True] == total
    assert counts[False] < 0.85 * total, counts[False] / total


def test_read_window_follows_crops_and_flips_and_stops_at_a_resize():
    W = T.read_window
    assert W([], 10, 12) == (0, 10, 0, 12)
    assert W([("crop", 2, 3, 4, 5, 0.0), ("flip", 0, True)], 10, 10) == (2, 6, 3, 8)
    assert W([("flip", 0, True), ("crop", 2, 3, 4, 5, 0.0)], 10, 10) == (2, 6, 2, 7)  # mirrored columns
    assert W([("flip", 1, True), ("crop", 1, 0, 3, 10)], 10, 10) == (6, 9, 0, 10)  # mirrored rows
    assert W([("flip", 0, False), ("crop", 1, 0, 3, 10)], 10, 10) == (1, 4, 0, 10)  # a flip not drawn
    # a zoom-out canvas, then a crop of it partly over the image
    assert W([("crop", -5, -6, 30, 30, 0.0), ("crop", 0, 0, 8, 9, 0.0)], 10, 10) == (0, 3, 0, 3)
    assert W([("crop", -20, 0, 5, 5, 0.0)], 10, 10)[1] == 0  # none of it read
    assert W([("crop", 1, 1, 5, 5), ("resize", 10, 10), ("crop", 0, 0, 2, 2)], 10, 10) == (1, 6, 1, 6)
