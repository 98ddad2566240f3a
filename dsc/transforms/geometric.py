"""Geometric ops as per-sample affine maps, composed and applied in ONE batched resampling pass.

Coordinates are continuous pixels with corners at integers (as in the format). Each op maps every
sample's current (virtual) size to a new one and contributes a 3x3 matrix taking OUTPUT pixel
coordinates to INPUT pixel coordinates; consecutive ops multiply their matrices, so a chain like
RandomResizedCrop -> RandomHorizontalFlip resamples the pixels once (``affine_grid`` + ``grid_sample``,
bilinear, no antialiasing). Boxes go through the inverse (forward) map, are clipped to the output
and dropped when no area is left, with the box-offset index rewritten, all batched.
"""
from __future__ import annotations

import math

import torch

Size = tuple[int, int]


def _size(size) -> Size:
    if isinstance(size, int):
        return (size, size)
    h, w = size
    return (int(h), int(w))


def _mat(sx, sy, tx, ty) -> torch.Tensor:
    """(B, 3, 3) float64 matrices x_in = sx * x_out + tx, y_in = sy * y_out + ty."""
    B = len(sx)
    m = torch.zeros((B, 3, 3), dtype=torch.float64)
    m[:, 0, 0], m[:, 1, 1], m[:, 0, 2], m[:, 1, 2], m[:, 2, 2] = sx, sy, tx, ty, 1.0
    return m


class Geometric:
    """Base of geometric ops: ``plan(sizes (B, 2) int64 (h, w), generator) -> (matrices, new sizes)``."""

    def plan(self, sizes: torch.Tensor, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({args})"


class Resize(Geometric):
    """``Resize((h, w))`` stretches to a fixed size; ``Resize(s)`` scales the shorter side to ``s``
    (torchvision's rule: the longer side becomes ``int(s * long / short)``), keeping aspect."""

    def __init__(self, size):
        self.size = size

    def plan(self, sizes, gen):
        h, w = sizes[:, 0].double(), sizes[:, 1].double()
        if isinstance(self.size, int):
            s = self.size
            short_is_w = w <= h
            nw = torch.where(short_is_w, torch.full_like(w, s), torch.floor(s * w / h))
            nh = torch.where(short_is_w, torch.floor(s * h / w), torch.full_like(h, s))
        else:
            th, tw = _size(self.size)
            nh, nw = torch.full_like(h, th), torch.full_like(w, tw)
        return _mat(w / nw, h / nh, 0.0, 0.0), torch.stack([nh, nw], 1).long()


class CenterCrop(Geometric):
    """Crop the centre (torchvision: top = round((h - th) / 2)); a crop larger than the image pads with
    zeros, (th - h) // 2 of them on the top, like torchvision."""

    def __init__(self, size):
        self.size = size

    def plan(self, sizes, gen):
        th, tw = _size(self.size)
        h, w = sizes[:, 0].double(), sizes[:, 1].double()
        # inside the image: torchvision's round((h - th) / 2); a larger crop pads like torchvision, with
        # (th - h) // 2 on the top / left
        top = torch.where(h >= th, torch.round((h - th) / 2), -torch.div(th - h, 2, rounding_mode="floor"))
        left = torch.where(w >= tw, torch.round((w - tw) / 2), -torch.div(tw - w, 2, rounding_mode="floor"))
        B = len(sizes)
        return _mat(torch.ones(B), torch.ones(B), left, top), torch.tensor([[th, tw]]).expand(B, 2).clone()


class Letterbox(Geometric):
    """Fit inside ``size`` keeping aspect (the binding side exact, the other rounded), centred; the rest
    is filled with ``fill`` (0-255)."""

    def __init__(self, size, fill: float = 0.0):
        self.size, self.fill = size, fill

    def plan(self, sizes, gen):
        th, tw = _size(self.size)
        h, w = sizes[:, 0].double(), sizes[:, 1].double()
        width_binds = tw / w <= th / h
        nw = torch.where(width_binds, torch.full_like(w, tw), torch.clamp(torch.round(w * th / h), 1, tw))
        nh = torch.where(width_binds, torch.clamp(torch.round(h * tw / w), 1, th), torch.full_like(h, th))
        top, left = torch.div(th - nh, 2, rounding_mode="floor"), torch.div(tw - nw, 2, rounding_mode="floor")
        sx, sy = w / nw, h / nh
        B = len(sizes)
        return _mat(sx, sy, -left * sx, -top * sy), torch.tensor([[th, tw]]).expand(B, 2).clone()


class RandomResizedCrop(Geometric):
    """torchvision's RandomResizedCrop parameter sampling, per sample: up to 10 tries of an area fraction
    ~ U(scale) and a log-uniform aspect ratio in ``ratio``, the crop placed uniformly; else the central
    crop clamped to ``ratio``. The crop is resized to ``size``."""

    def __init__(self, size, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
        self.size, self.scale, self.ratio = size, tuple(scale), tuple(ratio)

    def params(self, sizes: torch.Tensor, gen: torch.Generator):
        """(top, left, crop_h, crop_w) per sample, float64."""
        B, tries = len(sizes), 10
        h, w = sizes[:, 0:1].double(), sizes[:, 1:2].double()
        area = h * w
        u = torch.rand((B, tries, 4), generator=gen, dtype=torch.float64)
        target = area * (self.scale[0] + (self.scale[1] - self.scale[0]) * u[..., 0])
        lo, hi = math.log(self.ratio[0]), math.log(self.ratio[1])
        aspect = torch.exp(lo + (hi - lo) * u[..., 1])
        cw = torch.round(torch.sqrt(target * aspect))
        ch = torch.round(torch.sqrt(target / aspect))
        ok = (cw > 0) & (cw <= w) & (ch > 0) & (ch <= h)
        first = torch.where(ok.any(1), ok.double().argmax(1), torch.full((B,), -1, dtype=torch.long))
        rows = torch.arange(B)
        pick = first.clamp(min=0)
        ch_t, cw_t = ch[rows, pick], cw[rows, pick]
        top = torch.floor(u[rows, pick, 2] * (h[:, 0] - ch_t + 1))
        left = torch.floor(u[rows, pick, 3] * (w[:, 0] - cw_t + 1))
        # fallback: central crop with the ratio clamped
        in_ratio = w[:, 0] / h[:, 0]
        fb_w = torch.where(in_ratio < self.ratio[0], w[:, 0],
                           torch.where(in_ratio > self.ratio[1], torch.round(h[:, 0] * self.ratio[1]), w[:, 0]))
        fb_h = torch.where(in_ratio < self.ratio[0], torch.round(w[:, 0] / self.ratio[0]), h[:, 0])
        fb = first < 0
        ch_t, cw_t = torch.where(fb, fb_h, ch_t), torch.where(fb, fb_w, cw_t)
        top = torch.where(fb, torch.div(h[:, 0] - fb_h, 2, rounding_mode="floor"), top)
        left = torch.where(fb, torch.div(w[:, 0] - fb_w, 2, rounding_mode="floor"), left)
        return top, left, ch_t, cw_t

    def plan(self, sizes, gen):
        th, tw = _size(self.size)
        top, left, ch, cw = self.params(sizes, gen)
        B = len(sizes)
        return _mat(cw / tw, ch / th, left, top), torch.tensor([[th, tw]]).expand(B, 2).clone()


class _RandomFlip(Geometric):
    axis = 0

    def __init__(self, p: float = 0.5):
        self.p = p

    def plan(self, sizes, gen):
        B = len(sizes)
        flip = torch.rand(B, generator=gen, dtype=torch.float64) < self.p
        one, zero = torch.ones(B, dtype=torch.float64), torch.zeros(B, dtype=torch.float64)
        extent = sizes[:, 1 - self.axis].double()  # width for a horizontal flip
        s = torch.where(flip, -one, one)
        t = torch.where(flip, extent, zero)
        m = _mat(s, one, t, zero) if self.axis == 0 else _mat(one, s, zero, t)
        return m, sizes.clone()


class RandomHorizontalFlip(_RandomFlip):
    """Mirror left-right with probability ``p``, per sample. Exact (no resampling when alone)."""

    axis = 0


class RandomVerticalFlip(_RandomFlip):
    """Mirror top-bottom with probability ``p``, per sample. Exact (no resampling when alone)."""

    axis = 1
