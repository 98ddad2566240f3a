"""``dsc preview``: a PNG grid of samples with their boxes and class names drawn (PIL ImageDraw).

Each cell is ``cell`` x ``cell`` pixels plus a caption band; the sample is scaled to fit the cell
(aspect kept) and drawn at the cell's top-left corner. Detection: every box is outlined in its class
colour with the class name above it. Classification: the class name is written under the image. A mask
is blended over its image in its classes' colours (half opacity; background 0 and ignored pixels are
left as they are). Per-object masks are blended each in its own colour (object k: palette colour k), and
keypoints are drawn as dots joined by the dataset's skeleton (visible joints only).
"""
from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from ..errors import DscError

CAPTION = 14
PALETTE = [(230, 25, 75), (60, 180, 75), (255, 225, 25), (0, 130, 200), (245, 130, 48), (145, 30, 180),
           (70, 240, 240), (240, 50, 230), (210, 245, 60), (250, 190, 212), (0, 128, 128), (220, 190, 255),
           (170, 110, 40), (255, 250, 200), (128, 0, 0), (170, 255, 195), (128, 128, 0), (255, 215, 180),
           (0, 0, 128), (128, 128, 128)]


def class_color(label: int) -> tuple[int, int, int]:
    return PALETTE[label % len(PALETTE)]


def grid_shape(n: int, cols: int | None = None) -> tuple[int, int]:
    cols = cols or max(1, math.ceil(math.sqrt(n)))
    return math.ceil(n / cols), cols


def cell_origin(k: int, cols: int, cell: int) -> tuple[int, int]:
    """(x, y) of the top-left pixel of cell k."""
    return (k % cols) * cell, (k // cols) * (cell + CAPTION)


def _overlay(im: Image.Image, mask: np.ndarray, ignore: int | None) -> Image.Image:
    """The mask's classes in their colours over the image, half opaque (0 and ``ignore`` left clear)."""
    colours = np.asarray([class_color(k) for k in range(len(PALETTE))], np.uint8)[mask.astype(np.int64) % len(PALETTE)]
    rgb = np.asarray(im).astype(np.uint16)
    painted = (mask != 0) & (mask != (ignore if ignore is not None else -1))
    rgb[painted] = (rgb[painted] + colours[painted]) // 2
    return Image.fromarray(rgb.astype(np.uint8))


def _objects_overlay(im: Image.Image, masks: np.ndarray) -> Image.Image:
    """Each object's mask (k, H, W) in its own colour, half opaque (later objects over earlier)."""
    rgb = np.asarray(im).astype(np.uint16)
    for k, m in enumerate(masks):
        painted = m != 0
        rgb[painted] = (rgb[painted] + np.asarray(class_color(k + 3), np.uint16)) // 2
    return Image.fromarray(rgb.astype(np.uint8))


def _skeleton(ds) -> tuple[str | None, list]:
    """The keypoints key of the dataset's samples and its skeleton edges (none: no keypoints)."""
    keys = list(ds.schema.keypoints())
    if not keys:
        return None, []
    return keys[0], [tuple(e) for e in ds.manifest.fields.get(keys[0], {}).get("skeleton", [])]


def preview(ds, out: str | os.PathLike, n: int = 16, cols: int | None = None, cell: int = 256,
            indices=None, seed: int | None = None) -> Path:
    """Write a grid of ``n`` samples (the first ones, ``indices``, or a random draw with ``seed``)."""
    if indices is None:
        n = min(n, len(ds))
        indices = (np.random.default_rng(seed).choice(len(ds), n, replace=False) if seed is not None
                   else np.arange(n))
    indices = [int(i) for i in indices]
    rows, cols = grid_shape(len(indices), cols)
    canvas = Image.new("RGB", (cols * cell, rows * (cell + CAPTION)), (24, 24, 24))
    draw = ImageDraw.Draw(canvas)
    classes = ds.classes
    name = lambda c: classes[c] if 0 <= c < len(classes) and classes[c] else str(c)  # noqa: E731
    object_masks = list(ds.schema.object_masks())
    kp_key, edges = _skeleton(ds)
    for k, i in enumerate(indices):
        s = ds[i]
        img = s["image"].numpy()
        im = Image.fromarray(img[:, :, 0] if img.shape[2] == 1 else img).convert("RGB")
        if "mask" in s:
            im = _overlay(im, s["mask"].numpy(), ds.ignore_index)
        if object_masks:
            im = _objects_overlay(im, s[object_masks[0]].numpy())
        scale = min(cell / im.width, cell / im.height)
        size = (max(1, round(im.width * scale)), max(1, round(im.height * scale)))
        ox, oy = cell_origin(k, cols, cell)
        canvas.paste(im.resize(size, Image.Resampling.BILINEAR), (ox, oy))
        if "boxes" in s:
            for box, label in zip(s["boxes"].tolist(), s["labels"].tolist()):
                x0, y0, x1, y1 = (ox + box[0] * scale, oy + box[1] * scale, ox + box[2] * scale, oy + box[3] * scale)
                draw.rectangle([x0, y0, x1, y1], outline=class_color(label), width=2)
                tx, ty = x0 + 1, max(oy, y0 - 12)
                l, t, r, b = draw.textbbox((tx, ty), name(label))
                draw.rectangle([l - 1, t - 1, r + 1, b + 1], fill=class_color(label))  # readable on any box
                draw.text((tx, ty), name(label), fill=(0, 0, 0))
            if kp_key is not None:
                for j, joints in enumerate(s[kp_key].tolist()):
                    pts = [(ox + x * scale, oy + y * scale, v) for x, y, v in joints]
                    for a, b in edges:
                        if pts[a][2] > 0 and pts[b][2] > 0:
                            draw.line([pts[a][:2], pts[b][:2]], fill=class_color(j + 3), width=2)
                    for x, y, v in pts:
                        if v > 0:
                            draw.ellipse([x - 2, y - 2, x + 2, y + 2], fill=(255, 255, 255), outline=(0, 0, 0))
            caption = f"#{i} {len(s['boxes'])} boxes"
        else:
            caption = name(s["label"]) if "label" in s else f"#{i}"
        draw.text((ox + 2, oy + cell + 1), caption, fill=(255, 255, 255))
    out = Path(out)
    if not out.parent.is_dir():
        raise DscError(f"{out.parent}: no such directory for the preview PNG")
    canvas.save(out, "PNG")
    return out
