"""Procedural images for the demo, the tests and the benchmarks: no downloads, no binary blobs.

Scenes are a colour gradient, a few filled shapes and mild noise, so JPEG files come out at
realistic sizes (about 40-120 kB for 500x375) rather than the few kB of flat test images.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw


def make_scene(rng: np.random.Generator, height: int, width: int, noise: float = 12.0) -> Image.Image:
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    c0, c1 = rng.uniform(0, 255, 3), rng.uniform(0, 255, 3)
    angle = rng.uniform(0, 2 * np.pi)
    t = (np.cos(angle) * xx / max(1, width - 1) + np.sin(angle) * yy / max(1, height - 1))
    t = (t - t.min()) / max(1e-6, float(t.max() - t.min()))
    img = c0 * (1 - t[..., None]) + c1 * t[..., None]
    img += rng.normal(0, noise, img.shape)
    im = Image.fromarray(np.clip(img, 0, 255).astype(np.uint8), "RGB")
    draw = ImageDraw.Draw(im)
    for _ in range(int(rng.integers(2, 6))):
        x0, y0 = rng.uniform(0, width * 0.8), rng.uniform(0, height * 0.8)
        x1 = x0 + rng.uniform(min(8, width / 2), max(8, width / 2))
        y1 = y0 + rng.uniform(min(8, height / 2), max(8, height / 2))
        color = tuple(int(c) for c in rng.integers(0, 256, 3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)([x0, y0, x1, y1], fill=color)
    return im


def write_imagefolder(root: str | os.PathLike, num_classes: int = 4, per_class: int = 25,
                      size_range: tuple[int, int] = (300, 500), seed: int = 0, quality: int = 90,
                      fmt: str = "JPEG") -> list[Path]:
    """Write ``root/class_XX/img_XXXXX.jpg`` scenes with sides drawn from ``size_range``."""
    rng = np.random.default_rng(seed)
    root = Path(root)
    paths = []
    ext = {"JPEG": ".jpg", "PNG": ".png"}[fmt]
    for c in range(num_classes):
        d = root / f"class_{c:02d}"
        d.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            h, w = (int(v) for v in rng.integers(size_range[0], size_range[1] + 1, 2))
            p = d / f"img_{i:05d}{ext}"
            make_scene(rng, h, w).save(p, fmt, **({"quality": quality} if fmt == "JPEG" else {}))
            paths.append(p)
    return paths
