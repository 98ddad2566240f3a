"""Resize policies: where a decoded (h, w) image lands in the stored sample.

Each policy is a pure function of the decoded size and the options, returning a :class:`Plan` with
the resize, crop or pad it needs and the affine map of coordinates (continuous pixel coordinates,
corners at integers): ``x_stored = sx * x + tx``, ``y_stored = sy * y + ty``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image

from .decode import SWAPS_AXES, orient_array
from .resample import FILTERS, as_hwc, as_pil, resize
from ..formats.coords import dwarfs  # noqa: F401 - (shared with the transforms: formats/coords.py)


@dataclass(frozen=True, slots=True)
class Plan:
    resized: tuple[int, int]  # (h, w) after the resize (== decoded size when no resize)
    out: tuple[int, int]  # (h, w) of the stored sample
    crop: tuple[int, int] = (0, 0)  # (top, left) taken from the resized image (center-crop)
    pad: tuple[int, int] = (0, 0)  # (top, left) where the resized image is placed (pad)

    def affine(self, h: int, w: int) -> tuple[float, float, float, float]:
        sx, sy = self.resized[1] / w, self.resized[0] / h
        return (sx, sy, float(self.pad[1] - self.crop[1]), float(self.pad[0] - self.crop[0]))


def _fit(h: int, w: int, th: int, tw: int, cover: bool) -> tuple[int, int]:
    """Scale (h, w) so it covers (cover=True) or fits inside (th, tw), keeping aspect. The binding side
    gets its target exactly; the other is truncated like torchvision's Resize (cover) or rounded (fit)."""
    width_binds = (tw / w >= th / h) if cover else (tw / w <= th / h)
    if width_binds:
        other = int(tw * h / w) if cover else round(tw * h / w)
        return (max(th, other) if cover else min(th, max(1, other))), tw
    other = int(th * w / h) if cover else round(th * w / h)
    return th, (max(tw, other) if cover else min(tw, max(1, other)))


def plan_fixed(h: int, w: int, size: tuple[int, int], policy: str) -> Plan:
    th, tw = size
    if policy == "stretch":
        return Plan(resized=(th, tw), out=(th, tw))
    if policy == "center-crop":  # torchvision Resize(shorter side) + CenterCrop, generalised to (th, tw)
        nh, nw = _fit(h, w, th, tw, cover=True)
        return Plan(resized=(nh, nw), out=(th, tw),
                    crop=(int(round((nh - th) / 2.0)), int(round((nw - tw) / 2.0))))
    if policy == "pad":  # letterbox: fit inside, centre, fill the rest
        nh, nw = _fit(h, w, th, tw, cover=False)
        return Plan(resized=(nh, nw), out=(th, tw), pad=((th - nh) // 2, (tw - nw) // 2))
    raise ValueError(f"unknown resize policy {policy!r}")


def plan_ragged(h: int, w: int, max_side: int | None) -> Plan:
    if max_side is None or max(h, w) <= max_side:
        return Plan(resized=(h, w), out=(h, w))
    if w >= h:
        nh, nw = max(1, round(h * max_side / w)), max_side
    else:
        nh, nw = max_side, max(1, round(w * max_side / h))
    return Plan(resized=(nh, nw), out=(nh, nw))


def oversized(plan: Plan) -> bool:
    """A center-crop plan that :func:`dwarfs` its output."""
    return dwarfs(plan.resized, plan.out)


def apply_plan(im: Image.Image | np.ndarray, plan: Plan, fill: int = 0, resample: str = "bilinear",
               full_size: tuple[int, int] | None = None, draft_scale: int = 1, resizer: str = "pil",
               file_orientation: int = 1) -> np.ndarray:
    """Resize / crop / pad a decoded image per ``plan``; returns a C-contiguous (H, W, C) uint8 array. ``im``
    may be an (H, W[, C]) uint8 array of the pixels (what ``np.asarray`` of the image gives).

    Resize, then crop, exactly as torchvision's Resize + CenterCrop (cropping inside the resize would be
    faster but differs by one level in ~6% of pixels: the filter weights round differently).
    ``full_size`` (h, w) is the displayed size the plan was made for when ``im`` is a JPEG draft, decoded
    with DCT scaling by 1/``draft_scale``: the draft is resampled as the full image would be, its pixel x
    standing for the full image's ``draft_scale * x`` (its last row and column may be partly padding). A
    draft comes in the file's orientation: ``file_orientation`` (EXIF) is applied after resampling, which
    keeps that padding at the far edges where the scale is exact."""
    # (an array: a Python dataset's pixels in the stored mode (units.compile_sample); PIL's resampling takes it
    # as an image, the torch resizer and a crop as it is)
    h, w = full_size or (im.shape[:2] if isinstance(im, np.ndarray) else (im.height, im.width))
    nh, nw = plan.resized
    oh, ow = plan.out
    if oversized(plan) and draft_scale == 1:  # only the crop is resampled (PIL, exact box): bounded memory
        top, left = plan.crop
        box = (left * w / nw, top * h / nh, (left + ow) * w / nw, (top + oh) * h / nh)
        return np.ascontiguousarray(as_hwc(as_pil(im).resize((ow, oh), FILTERS[resample], box=box)))
    if draft_scale != 1:
        s = draft_scale
        swapped = file_orientation in SWAPS_AXES
        (fh, fw), (rh, rw) = ((w, h), (nw, nh)) if swapped else ((h, w), (nh, nw))  # in the file's orientation
        arr = orient_array(resize(im, (rh, rw), resample, resizer, scale=(rh * s / fh, rw * s / fw)),
                           file_orientation)
    elif file_orientation != 1:
        raise ValueError("only a JPEG draft comes in the file's orientation")
    elif (nh, nw) != (h, w):
        arr = resize(im, (nh, nw), resample, resizer)
    else:
        arr = as_hwc(im)
    if nh < oh or nw < ow:  # letterbox
        canvas = np.full((oh, ow, arr.shape[2]), fill, dtype=np.uint8)
        top, left = plan.pad
        canvas[top:top + arr.shape[0], left:left + arr.shape[1]] = arr
        return canvas
    top, left = plan.crop
    return np.ascontiguousarray(arr[top:top + oh, left:left + ow])
