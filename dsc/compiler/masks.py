"""Segmentation masks: decode a mask file, rasterise COCO shapes, bring the mask into the image's displayed
frame (EXIF), and resample it through the image's resize plan with nearest neighbour.

COCO rasterisation follows pycocotools (the reference every COCO user's masks come from):

* a polygon's vertices are scaled by 5 and rounded, each edge is walked one step at a time along its
  longer axis, and each step that crosses a pixel column's centre toggles the mask at the first pixel
  centre below the edge; a pixel is inside when an odd number of toggles lie above it in its column;
* an annotation with several polygons is their union;
* RLE counts are column-major run lengths starting with a run of zeros, given as a list or in COCO's
  compressed string form (6-bit chunks with a continuation bit, each count a delta from the one two back).
"""
from __future__ import annotations

import numpy as np
from PIL import Image

from ..errors import SampleError
from .decode import SWAPS_AXES, check_regular, failure, is_empty, orient_array, pil_rules
from .geometry import Plan, oversized

_MASK_MODES = {"L", "P", "1", "I;16", "I;16L", "I;16B", "I;16N", "I"}


def decode_mask(obj, where: str) -> np.ndarray:
    """A mask file (path or binary file), a PIL image or an integer array -> 2-D integer array of class ids."""
    if isinstance(obj, str):
        check_regular(obj)
    if isinstance(obj, np.ndarray):
        arr = obj
    else:
        if not isinstance(obj, Image.Image) and is_empty(obj):
            raise SampleError(where, "the mask file is empty (0 bytes); replace it with the mask, or remove it")
        try:
            with pil_rules():  # a truncated mask is an error, never a half mask
                im = obj if isinstance(obj, Image.Image) else Image.open(obj)
                im.load()
        except Image.DecompressionBombError as e:
            raise SampleError(where, f"mask refused as a decompression bomb ({e})") from None
        except Exception as e:  # noqa: BLE001 - PIL raises many types for bad files
            raise SampleError(where, f"cannot decode mask: {failure(e, obj)}") from None
        if im.mode not in _MASK_MODES:
            raise SampleError(where, f"the mask is a {im.mode} image; a mask holds one class id per pixel (a "
                                     f"palette or grayscale PNG, 8 or 16 bits)")
        arr = np.asarray(im)
    if arr.dtype == np.bool_:
        arr = arr.astype(np.uint8)
    if arr.ndim != 2 or arr.dtype.kind not in "ui":
        raise SampleError(where, f"a mask must be a 2-D array of integer class ids, got {arr.dtype} {arr.shape}")
    if arr.size and arr.min() < 0:
        raise SampleError(where, f"mask value {int(arr.min())} is negative; class ids are >= 0")
    return arr


def check_values(mask: np.ndarray, num_classes: int, ignore: int, dtype: str, where: str) -> None:
    """Every value a class id (0..C-1 when the classes are known) or the ignore index, and storable."""
    if not mask.size:
        return
    if num_classes:
        bad = (mask >= num_classes) & (mask != ignore)
        if bad.any():
            raise SampleError(where, f"mask value {int(mask[bad][0])} is neither a class id (0..{num_classes - 1}) "
                                     f"nor the ignore index {ignore}")
    top = int(mask.max())
    if top > np.iinfo(dtype).max:
        raise SampleError(where, f"mask value {top} does not fit the dataset's {dtype} masks; give the full class "
                                 f"list (more than 255 classes are stored as uint16)")


# ----------------------------------------------------------------------------- COCO shapes
def _polygon_toggles(xy: np.ndarray, h: int, w: int) -> np.ndarray:
    """Column-major positions (x * h + y) where one polygon's boundary toggles the mask."""
    scale = 5.0
    x = np.trunc(scale * xy[0::2] + 0.5).astype(np.int64)  # C's (int)(v + .5): truncation toward zero
    y = np.trunc(scale * xy[1::2] + 0.5).astype(np.int64)
    x, y = np.append(x, x[0]), np.append(y, y[0])
    us, vs = [], []
    for j in range(len(x) - 1):  # every edge, walked one step at a time along its longer axis
        xs, xe, ys, ye = x[j], x[j + 1], y[j], y[j + 1]
        dx, dy = abs(xe - xs), abs(ys - ye)
        flip = (dx >= dy and xs > xe) or (dx < dy and ys > ye)
        if flip:
            xs, xe, ys, ye = xe, xs, ye, ys
        if dx >= dy:
            t = np.arange(dx + 1)
            t = dx - t if flip else t
            s = (ye - ys) / dx if dx else 0.0
            us.append(t + xs)
            vs.append(np.trunc(ys + s * t + 0.5).astype(np.int64))
        else:
            t = np.arange(dy + 1)
            t = dy - t if flip else t
            s = (xe - xs) / dy
            vs.append(t + ys)
            us.append(np.trunc(xs + s * t + 0.5).astype(np.int64))
    u, v = np.concatenate(us), np.concatenate(vs)
    step = np.flatnonzero(u[1:] != u[:-1]) + 1  # steps that move to another column
    xd = np.where(u[step] < u[step - 1], u[step], u[step] - 1).astype(np.float64)
    xd = (xd + 0.5) / scale - 0.5
    keep = (np.floor(xd) == xd) & (xd >= 0) & (xd <= w - 1)  # it crossed the centre of a pixel column
    yd = np.minimum(v[step], v[step - 1]).astype(np.float64)
    yd = np.ceil(np.clip((yd + 0.5) / scale - 0.5, 0, h))
    return (xd[keep].astype(np.int64) * h + yd[keep].astype(np.int64))


def _toggles_to_mask(toggles: np.ndarray, h: int, w: int) -> np.ndarray:
    """A pixel is inside when an odd number of toggles lie at or above it in its column."""
    counts = np.bincount(toggles, minlength=h * w + 1)[:h * w]
    return (np.cumsum(counts) & 1).astype(bool).reshape(w, h).T


def rle_counts(counts: str) -> list[int]:
    """COCO's compressed RLE string -> run lengths (checked by ``rle_decode``)."""
    out, p = [], 0
    while p < len(counts):
        x, k, more = 0, 0, True
        while more:
            if p >= len(counts) or k > 12 or not 48 <= ord(counts[p]) < 48 + 64:
                raise ValueError("its compressed RLE counts are malformed")
            c = ord(counts[p]) - 48
            x |= (c & 0x1F) << (5 * k)
            more = bool(c & 0x20)
            p += 1
            k += 1
            if not more and c & 0x10:
                x |= -1 << (5 * k)
        if len(out) > 2:
            x += out[-2]
        out.append(x)
    return out


def rle_decode(counts: list[int], h: int, w: int) -> np.ndarray:
    """Column-major run lengths, alternating 0 and 1 starting with 0 -> (h, w) bool."""
    total = 0  # Python ints first: a crafted count must not wrap around in int64
    for c in counts:
        if not isinstance(c, int) or c < 0 or c > h * w:
            raise ValueError(f"RLE count {c!r} is not a run length within the {w}x{h} image")
        total += c
    if total != h * w:
        raise ValueError(f"RLE counts sum to {total}, not {h}x{w} = {h * w} pixels")
    flat = np.repeat(np.arange(len(counts)) % 2, np.asarray(counts, np.int64)).astype(bool)
    return flat.reshape(w, h).T


def segmentation_mask(seg, h: int, w: int) -> np.ndarray:
    """One annotation's ``segmentation`` (polygons or RLE) rasterised to (h, w) bool."""
    if isinstance(seg, dict):
        rh, rw = seg["size"]
        if (rh, rw) != (h, w):
            raise ValueError(f"its RLE is {rw}x{rh} but the image is {w}x{h}")
        counts = seg["counts"]
        return rle_decode(rle_counts(counts) if isinstance(counts, str) else counts, h, w)
    reach = 4 * max(h, w) + 64  # a vertex may lie outside the image, not arbitrarily far (each edge is walked)
    # pycocotools' frPoly takes len(p) // 2 points (an odd last number is dropped), and a part of fewer than 3
    # points toggles every pixel it walks twice: it draws nothing (so it is not walked here)
    seg = [np.asarray(p[:len(p) - len(p) % 2], np.float64) for p in seg if len(p) >= 6]
    for xy in seg:
        if not np.all(np.isfinite(xy)) or np.abs(xy).max() > reach:
            raise ValueError(f"a polygon vertex lies far outside the {w}x{h} image (or is not finite)")
    toggles = [_polygon_toggles(xy, h, w) for xy in seg]
    mask = np.zeros((h, w), bool)
    for t in toggles:  # several polygons: their union
        mask |= _toggles_to_mask(t, h, w)
    return mask


def rasterize(segments, h: int, w: int, ignore: int, dtype: str, where: str) -> np.ndarray:
    """((segmentation, value), ...) drawn in order, later over earlier; value -1 paints ``ignore``."""
    out = np.zeros((h, w), dtype)
    for k, (seg, value) in enumerate(segments):
        try:
            m = segmentation_mask(seg, h, w)
        except (ValueError, TypeError, KeyError, IndexError, OverflowError, MemoryError) as e:
            raise SampleError(where, f"annotation {k} of this image: cannot rasterise its segmentation ({e})") from None
        out[m] = ignore if value < 0 else value
    return out


# ----------------------------------------------------------------------------- into the stored frame
def displayed_mask(mask: np.ndarray, orientation: int, h: int, w: int, where: str) -> np.ndarray:
    """The mask in the image's displayed frame: a mask of the displayed size is taken as is, one of the raw
    (un-rotated) size turns with the image (only distinguishable for the orientations that swap axes)."""
    mh, mw = mask.shape
    if (mh, mw) == (h, w):
        return mask
    if orientation in SWAPS_AXES and (mh, mw) == (w, h):
        return orient_array(mask, orientation)
    raise SampleError(where, f"the mask is {mw}x{mh} but its image is {w}x{h}; a mask must have its image's size")


def nearest(mask: np.ndarray, h: int, w: int) -> np.ndarray:
    """Nearest-neighbour resize, exactly PIL's ``Image.resize(..., NEAREST)``."""
    if mask.shape == (h, w):
        return mask
    if mask.dtype == np.uint8:
        return np.asarray(Image.fromarray(mask, "L").resize((w, h), Image.Resampling.NEAREST))
    out = Image.fromarray(mask.astype(np.int32), "I").resize((w, h), Image.Resampling.NEAREST)
    return np.asarray(out).astype(mask.dtype)


def apply_plan_nearest(mask: np.ndarray, plan: Plan, ignore: int) -> np.ndarray:
    """The mask through the image's resize plan: nearest resize, then the same crop or letterbox (padding
    = ``ignore``). Returns a C-contiguous (H, W) array."""
    oh, ow = plan.out
    nh, nw = plan.resized
    if oversized(plan):  # only the crop's rows and columns, picked as nearest() would pick them
        h, w = mask.shape
        top, left = plan.crop
        ys = np.minimum(((np.arange(top, top + oh) + 0.5) * (h / nh)).astype(np.int64), h - 1)
        xs = np.minimum(((np.arange(left, left + ow) + 0.5) * (w / nw)).astype(np.int64), w - 1)
        return np.ascontiguousarray(mask[ys][:, xs])
    arr = nearest(mask, *plan.resized)
    if nh < oh or nw < ow:
        canvas = np.full((oh, ow), ignore, mask.dtype)
        top, left = plan.pad
        canvas[top:top + nh, left:left + nw] = arr
        return canvas
    top, left = plan.crop
    return np.ascontiguousarray(arr[top:top + oh, left:left + ow])
