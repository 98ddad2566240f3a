"""Boxes follow their image: annotation frame -> displayed frame -> stored sample, validated and clipped.

Convention (documented in the README): annotations are in the frame of the image as displayed
(EXIF orientation applied), which is what annotation tools show. When a source declares the image size
and that size matches the raw, un-rotated pixels instead (only distinguishable for orientations 5-8,
which swap width and height), the boxes are in the raw frame and are rotated with the image.
"""
from __future__ import annotations

import numpy as np

from ..errors import SampleError
from ..formats.coords import apply_affine
from .decode import SWAPS_AXES
from .sources.base import Target

TOLERANCE_PX = 1.0  # boxes may overhang the image by this much (rounding in annotation tools); clipped
FRAME_DISPLAYED, FRAME_RAW = 0, 1


def raw_to_displayed(boxes: np.ndarray, orientation: int, raw_w: int, raw_h: int) -> np.ndarray:
    """Map xyxy boxes through the EXIF orientation transform (PIL's exif_transpose)."""
    x0, y0, x1, y1 = boxes.T
    W, H = raw_w, raw_h
    xs, ys = {
        1: ((x0, x1), (y0, y1)),
        2: ((W - x0, W - x1), (y0, y1)),          # mirror horizontal
        3: ((W - x0, W - x1), (H - y0, H - y1)),  # rotate 180
        4: ((x0, x1), (H - y0, H - y1)),          # mirror vertical
        5: ((y0, y1), (x0, x1)),                  # transpose
        6: ((H - y0, H - y1), (x0, x1)),          # rotate 90 clockwise
        7: ((H - y0, H - y1), (W - x0, W - x1)),  # transverse
        8: ((y0, y1), (W - x0, W - x1)),          # rotate 90 counter-clockwise
    }[orientation]
    return np.stack([np.minimum(*xs), np.minimum(*ys), np.maximum(*xs), np.maximum(*ys)], -1).reshape(-1, 4)


def boxes_in_display_frame(t: Target, orientation: int, disp_w: int, disp_h: int) -> tuple[np.ndarray, int]:
    """The target's boxes in displayed-image pixels, checked; returns (boxes, frame flag)."""
    swapped = orientation in SWAPS_AXES
    raw_w, raw_h = (disp_h, disp_w) if swapped else (disp_w, disp_h)
    boxes = np.asarray(t.boxes, np.float64).reshape(-1, 4)
    frame = FRAME_DISPLAYED
    if t.normalized:
        boxes = boxes * np.array([disp_w, disp_h, disp_w, disp_h], np.float64)
    elif t.size is not None:
        if tuple(t.size) == (disp_w, disp_h):
            pass
        elif tuple(t.size) == (raw_w, raw_h):
            frame = FRAME_RAW
        else:
            raise SampleError(t.source, f"the annotation says the image is {t.size[0]}x{t.size[1]} but it "
                                        f"decodes to {disp_w}x{disp_h}; fix the annotation's width/height")
    if not np.all(np.isfinite(boxes)):
        bad = boxes[~np.all(np.isfinite(boxes), axis=1)][0]
        raise SampleError(t.source, f"box {_fmt(bad)} has a NaN or infinite coordinate")
    neg = (boxes[:, 2] < boxes[:, 0]) | (boxes[:, 3] < boxes[:, 1])
    if neg.any():
        raise SampleError(t.source, f"box {_fmt(boxes[neg][0])} has a negative width or height")
    if frame == FRAME_RAW:
        boxes = raw_to_displayed(boxes, orientation, raw_w, raw_h)
    out = ((boxes[:, 0] < -TOLERANCE_PX) | (boxes[:, 1] < -TOLERANCE_PX)
           | (boxes[:, 2] > disp_w + TOLERANCE_PX) | (boxes[:, 3] > disp_h + TOLERANCE_PX))
    if out.any():
        raise SampleError(t.source, f"box {_fmt(boxes[out][0])} (xyxy) lies outside the {disp_w}x{disp_h} image")
    return boxes, frame


def to_stored(boxes: np.ndarray, affine, out_w: int, out_h: int) -> tuple[np.ndarray, np.ndarray]:
    """Apply the sample's affine map and clip to the stored image. Returns (boxes float32, kept mask):
    boxes with no area left (cut away by a crop, or degenerate in the source) are dropped."""
    b = apply_affine(boxes, affine)
    b[:, [0, 2]] = np.clip(b[:, [0, 2]], 0, out_w)
    b[:, [1, 3]] = np.clip(b[:, [1, 3]], 0, out_h)
    b = b.astype(np.float32)  # decide on what is stored: a box thinner than a float32 step has no area
    keep = (b[:, 2] > b[:, 0]) & (b[:, 3] > b[:, 1])
    return b, keep


def _fmt(b) -> str:
    return "[" + ", ".join(f"{v:g}" for v in b) + "]"
