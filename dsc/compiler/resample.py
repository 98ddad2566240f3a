"""The two resamplers a compile can use. Both are antialiased (the filter widens with the downscale).

* ``pil``: PIL's ``Image.resize``, which is what torchvision's ``Resize`` does to PIL images, pixel for
  pixel. The default.
* ``torch``: torch's ``interpolate(..., antialias=True)`` on uint8, which is what torchvision's ``Resize``
  does to tensors. On a CPU with AVX2 it runs fixed-point SIMD kernels (the pillow-simd algorithm), about
  3.5x faster than stock Pillow here. Bilinear differs from PIL by at most one level, in about 0.2% of the
  values of a downscaled photo; bicubic likewise, except at hard edges (up to 9 levels measured on
  black-on-white shapes).
  Bilinear and bicubic only. Its bytes depend on torch's CPU kernel (``dsc info --env`` names it), as
  PIL's depend on Pillow or pillow-simd.

Sizes are (height, width). ``scale`` (sy, sx), when given, is the map from input to output pixel
coordinates (``x_out = sx * x_in``); it replaces ``size / input size`` so that a JPEG draft whose last
block column is only partly image maps exactly like the full image.
"""
from __future__ import annotations

import threading
import warnings
from contextlib import contextmanager

import numpy as np
from PIL import Image

from ..formats.manifest import RESIZERS

FILTERS = {"bilinear": Image.Resampling.BILINEAR, "bicubic": Image.Resampling.BICUBIC,
           "lanczos": Image.Resampling.LANCZOS, "nearest": Image.Resampling.NEAREST}
TORCH_FILTERS = ("bilinear", "bicubic")


def check(resizer: str, filter: str) -> str | None:
    """Why (resizer, filter) cannot be used, or None."""
    if resizer not in RESIZERS:
        return f"resizer must be one of {', '.join(RESIZERS)}, got {resizer!r}"
    if filter not in FILTERS:
        return f"filter must be one of {', '.join(FILTERS)}, got {filter!r}"
    if resizer == "torch" and filter not in TORCH_FILTERS:
        return (f"the torch resizer has no antialiased {filter} filter; use --filter bilinear or bicubic, "
                f"or --resizer pil")
    return None


def as_hwc(im: Image.Image | np.ndarray) -> np.ndarray:
    """The pixels as an (H, W, C) array (a grayscale image gets C = 1)."""
    arr = np.asarray(im)
    return arr[:, :, None] if arr.ndim == 2 else arr


def as_pil(im: Image.Image | np.ndarray) -> Image.Image:
    """``im`` as a PIL image, for PIL's resampling (a Python dataset's array of the stored pixels is one)."""
    return Image.fromarray(im) if isinstance(im, np.ndarray) else im


_quiet = threading.Lock()
_warned = False


def _from_readonly(arr: np.ndarray):
    """``torch.from_numpy`` of PIL's read-only array (interpolate only reads it). torch warns about that
    once per process: the first call hides the warning; ``catch_warnings`` is not thread-safe, so not
    every call."""
    global _warned
    import torch

    if _warned or arr.flags.writeable:  # (a Python dataset's own array is writable: nothing to hide)
        return torch.from_numpy(arr)
    with _quiet, warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        t = torch.from_numpy(arr)
        _warned = True
    return t


def resize(im: Image.Image | np.ndarray, size: tuple[int, int], filter: str, resizer: str,
           scale: tuple[float, float] | None = None) -> np.ndarray:
    """``im`` (an image, or an (H, W[, C]) uint8 array of its pixels) resampled to ``size``: an (H, W, C) uint8
    array (a view, maybe not contiguous)."""
    h, w = size
    if resizer == "pil":
        box = None if scale is None else (0.0, 0.0, w / scale[1], h / scale[0])
        return as_hwc(as_pil(im).resize((w, h), FILTERS[filter], box=box))
    import math

    import torch

    x = _from_readonly(as_hwc(im)).unsqueeze(0).permute(0, 3, 1, 2)  # channels_last: the SIMD uint8 path
    if scale is None:
        size_out, scales = [h, w], (None, None)
    else:  # output size = floor(input * scale): nudge up so that rounding never leaves it a pixel short
        scales = (scale[0] * (1 + 1e-9), scale[1] * (1 + 1e-9))
        size_out = [math.floor(x.shape[2] * scales[0]), math.floor(x.shape[3] * scales[1])]
    # interpolate(..., antialias=True) is this op; called with out= into HWC memory, the result needs no
    # transpose copy (interpolate returns it channels-first)
    op = torch.ops.aten._upsample_bilinear2d_aa if filter == "bilinear" else torch.ops.aten._upsample_bicubic2d_aa
    out = torch.empty((1, *size_out, x.shape[1]), dtype=torch.uint8)
    op.out(x, size_out, False, *scales, out=out.permute(0, 3, 1, 2))
    return out[0].numpy()[:h, :w]


@contextmanager
def single_threaded(resizer: str):
    """Run torch's resize on one thread (a compile worker is one process per core). torch's OpenMP thread
    count belongs to the calling thread: set and restored here, in it."""
    if resizer != "torch":
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
