"""Per-object masks and keypoints of a detection sample, into its stored pixels.

An instance shape (``Target.shapes``, one per box) is one of:

* a COCO ``segmentation``: polygons ``[[x, y, ...], ...]`` (their union; holes as pycocotools draws them)
  or RLE ``{"size", "counts"}`` (plain or compressed counts), in the annotated frame: pixel-equal to
  pycocotools' ``annToMask`` (``masks.segmentation_mask``);
* :class:`NormalizedPolygons`: YOLO segment polygons in [0, 1] units of the displayed image, scaled to
  its pixels and drawn by the same rule;
* :class:`InstanceId`: the pixels of value ``value`` in an instance-id PNG (VOC's SegmentationObject),
  decoded once per sample;
* an (H, W) array (nonzero = the object), in the annotated frame (``dsc.compile(dataset)`` targets).

Each mask is brought into the displayed frame (EXIF) as the semantic mask is, then through the sample's
resize plan with the semantic mask's nearest rule (``masks.apply_plan_nearest``). Keypoints go through
the same affine map as the boxes; a joint that is hidden (v = 0) or leaves the stored image is (0, 0, 0).
"""
from __future__ import annotations

import io

import numpy as np

from ..errors import SampleError
from ..formats.coords import apply_affine
from .boxes import FRAME_RAW, raw_to_displayed
from .decode import SWAPS_AXES, orient_array
from .geometry import Plan
from .masks import apply_plan_nearest, decode_mask, segmentation_mask
from .sources.base import InstanceId, NormalizedPolygons
from .sources.inputs import is_remote, read_bytes


def _raster(shape, h: int, w: int, files: dict, where: str) -> np.ndarray:
    if isinstance(shape, NormalizedPolygons):
        polys = [[v * (w if k % 2 == 0 else h) for k, v in enumerate(p)] for p in shape.polygons]
        return segmentation_mask(polys, h, w)
    if isinstance(shape, InstanceId):
        if shape.path not in files:
            obj = shape.path
            if is_remote(obj):  # (an object in a bucket: VOC's SegmentationObject under a URL root)
                obj = io.BytesIO(read_bytes(obj))
            files[shape.path] = decode_mask(obj, shape.path)
        ids = files[shape.path]
        if ids.shape != (h, w):
            raise ValueError(f"the instance mask {shape.path} is {ids.shape[1]}x{ids.shape[0]} but its image is "
                             f"{w}x{h}")
        return ids == shape.value
    if isinstance(shape, np.ndarray):
        if shape.shape != (h, w):
            raise ValueError(f"its mask is {shape.shape} but the image is ({h}, {w})")
        return shape != 0
    return segmentation_mask(shape, h, w)


def instance_masks(target, keep: np.ndarray, frame: int, orientation: int, h: int, w: int, plan: Plan
                   ) -> np.ndarray:
    """(k, H, W) bool masks of the kept boxes in the stored sample (``h``, ``w``: the displayed size)."""
    shapes = target.shapes
    if len(shapes) != len(keep):
        raise SampleError(target.source, f"has {len(keep)} boxes but {len(shapes)} instance masks; one per box")
    raw = frame == FRAME_RAW  # annotated on the raw pixels (only told apart for orientations that swap axes)
    mh, mw = (w, h) if raw else (h, w)
    files: dict = {}
    out = np.zeros((int(keep.sum()), *plan.out), bool)
    j = 0
    for k, shape in enumerate(shapes):
        if not keep[k]:
            continue
        try:
            m = _raster(shape, mh, mw, files, target.source)
        except SampleError:
            raise
        except (ValueError, TypeError, KeyError, IndexError, OverflowError, MemoryError) as e:
            raise SampleError(target.source, f"object {k}: cannot rasterise its mask ({e})") from None
        m = np.ascontiguousarray(orient_array(m, orientation)) if raw else m
        out[j] = apply_plan_nearest(m.astype(np.uint8), plan, 0) != 0
        j += 1
    return out


def place_keypoints(target, keep: np.ndarray, frame: int, orientation: int, h: int, w: int, affine,
                    out_h: int, out_w: int, K: int) -> np.ndarray:
    """(k, K, 3) float32 joints of the kept boxes in stored pixels; hidden or outside joints are zeros."""
    n = len(keep)
    if target.keypoints is None:
        return np.zeros((int(keep.sum()), K, 3), np.float32)
    kp = np.asarray(target.keypoints, np.float64)
    if kp.shape != (n, K, 3) or not np.isfinite(kp).all():
        raise SampleError(target.source, f"keypoints of shape {kp.shape} (or not finite); expected ({n}, {K}, 3): "
                                         f"x, y, visibility of {K} joints per box")
    kp = kp[keep].copy()
    x, y, v = kp[..., 0].reshape(-1), kp[..., 1].reshape(-1), kp[..., 2].reshape(-1)
    if target.normalized:
        x, y = x * w, y * h
    elif frame == FRAME_RAW:
        raw_w, raw_h = (h, w) if orientation in SWAPS_AXES else (w, h)
        p = raw_to_displayed(np.stack([x, y, x, y], 1), orientation, raw_w, raw_h)
        x, y = p[:, 0], p[:, 1]
    p = apply_affine(np.stack([x, y, x, y], 1), tuple(affine))
    x, y = p[:, 0], p[:, 1]
    vis = (v > 0) & (x >= 0) & (x <= out_w) & (y >= 0) & (y <= out_h)
    out = np.stack([x, y, v], 1) * vis[:, None]
    return out.reshape(-1, K, 3).astype(np.float32)
