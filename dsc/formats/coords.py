"""The coordinate convention of the format (docs/FORMAT.md, "Coordinates"), as functions.

Continuous pixel coordinates, corners at integers. ``affine = (sx, sy, tx, ty)`` maps a point of the
decoded source image (EXIF orientation applied) to the stored sample: ``x' = sx*x + tx``.
"""
from __future__ import annotations

import numpy as np


def apply_affine(boxes: np.ndarray, affine) -> np.ndarray:
    """xyxy boxes of the source image -> the stored image."""
    sx, sy, tx, ty = (float(v) for v in affine)
    b = np.asarray(boxes, dtype=np.float64)
    return np.stack([b[..., 0] * sx + tx, b[..., 1] * sy + ty, b[..., 2] * sx + tx, b[..., 3] * sy + ty], -1)


def invert_affine(boxes: np.ndarray, affine) -> np.ndarray:
    """xyxy boxes of the stored image (e.g. a model's predictions) -> the source image's pixels."""
    sx, sy, tx, ty = (float(v) for v in affine)
    b = np.asarray(boxes, dtype=np.float64)
    return np.stack([(b[..., 0] - tx) / sx, (b[..., 1] - ty) / sy, (b[..., 2] - tx) / sx, (b[..., 3] - ty) / sy], -1)


def dwarfs(resized: tuple[int, int], crop: tuple[int, int]) -> bool:
    """A resize whose whole output would dwarf the crop taken from it (an extreme aspect ratio: a 1x4000
    image at 224 would be resized to 224x896000 first). Then only the region that survives the crop is
    resampled, so no intermediate is much larger than the output (values may differ by a level from
    resizing the whole image, as the filter weights round differently; ordinary images keep
    resize-then-crop). The compiler and the runtime's transforms share this rule."""
    return resized[0] * resized[1] > max(4 * crop[0] * crop[1], 1 << 22)
