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
