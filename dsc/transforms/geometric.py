"""Geometric ops: each draws its random parameters once per batch and states them two ways.

* ``steps``: per-sample integer programs of ``crop`` (top, left, height, width; outside the image is the
  fill), ``resize`` (height, width; antialiased bilinear for images, nearest for masks) and ``flip`` —
  exactly torchvision's semantics (RandomResizedCrop = crop, then resize). The fused path runs them on
  each sample while it is gathered (``fused.py``): only the crop is read, one resampling pass.
* ``matrix``: a 3x3 map per sample taking OUTPUT pixel coordinates to INPUT pixel coordinates
  (continuous pixels, corners at integers, as in the format), the same geometry as the steps; boxes go
  through its inverse, and ops without steps (your own ``Geometric`` that only implements ``plan``) are
  applied by one batched ``grid_sample`` pass (``resample.py``).

``params(sizes, gen)`` draws; ``matrix(sizes, params)`` -> (matrices, new sizes); ``steps(sizes, params)`` ->
a list of ``(kind, *per-sample lists)``. ``plan(sizes, gen)`` is params + matrix.
"""
from __future__ import annotations

import math

import torch
from ..errors import ConfigError

Size = tuple[int, int]


def _size(size) -> Size:
    """``s`` or ``(h, w)`` of positive ints; a ConfigError otherwise."""

    pair = (size, size) if isinstance(size, int) else size
    try:
        h, w = pair
        ok = all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (h, w))
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ConfigError(f"a transform size must be a positive int or (height, width) of positive ints, got {size!r}")
    return (h, w)


def _mat(sx, sy, tx, ty) -> torch.Tensor:
    """(B, 3, 3) float64 matrices x_in = sx * x_out + tx, y_in = sy * y_out + ty."""
    B = len(sx)
    m = torch.zeros((B, 3, 3), dtype=torch.float64)
    m[:, 0, 0], m[:, 1, 1], m[:, 0, 2], m[:, 1, 2], m[:, 2, 2] = sx, sy, tx, ty, 1.0
    return m


def _ints(t) -> list[int]:
    return [int(v) for v in torch.as_tensor(t).round().tolist()]


class Geometric:
    """Base of geometric ops. Subclasses implement ``params``, ``matrix`` and (to be fused) ``steps``; an op
    that only implements ``plan(sizes, gen) -> (matrices, new sizes)`` is applied by the batched pass."""

    fill: float | None = None  # what a crop outside the image shows (None: 0; masks: their ignore index)

    def params(self, sizes: torch.Tensor, gen: torch.Generator):
        return None

    def matrix(self, sizes: torch.Tensor, params) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def steps(self, sizes: torch.Tensor, params) -> list | None:
        return None  # not fusable

    def plan(self, sizes: torch.Tensor, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        return self.matrix(sizes, self.params(sizes, gen))

    @property
    def fusable(self) -> bool:
        """Whether it states its geometry as steps (so the fused, per-sample path can run it)."""
        return type(self).plan is Geometric.plan and type(self).steps is not Geometric.steps \
            and not getattr(self, "needs_boxes", False)

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({args})"


class Resize(Geometric):
    """``Resize((h, w))`` stretches to a fixed size; ``Resize(s)`` scales the shorter side to ``s``
    (torchvision's rule: the longer side becomes ``int(s * long / short)``), keeping aspect."""

    def __init__(self, size):
        _size(size)
        self.size = size

    def _new(self, sizes):
        h, w = sizes[:, 0].double(), sizes[:, 1].double()
        if isinstance(self.size, int):
            s = self.size
            short_is_w = w <= h
            nw = torch.where(short_is_w, torch.full_like(w, s), torch.floor(s * w / h))
            nh = torch.where(short_is_w, torch.floor(s * h / w), torch.full_like(h, s))
        else:
            th, tw = _size(self.size)
            nh, nw = torch.full_like(h, th), torch.full_like(w, tw)
        return nh, nw

    def matrix(self, sizes, params):
        nh, nw = self._new(sizes)
        h, w = sizes[:, 0].double(), sizes[:, 1].double()
        return _mat(w / nw, h / nh, 0.0, 0.0), torch.stack([nh, nw], 1).long()

    def steps(self, sizes, params):
        nh, nw = self._new(sizes)
        return [("resize", _ints(nh), _ints(nw))]


class CenterCrop(Geometric):
    """Crop the centre (torchvision: top = round((h - th) / 2)); a crop larger than the image pads with
    zeros, (th - h) // 2 of them on the top, like torchvision."""

    def __init__(self, size):
        _size(size)
        self.size = size

    def _origin(self, sizes):
        th, tw = _size(self.size)
        h, w = sizes[:, 0].double(), sizes[:, 1].double()
        top = torch.where(h >= th, torch.round((h - th) / 2), -torch.div(th - h, 2, rounding_mode="floor"))
        left = torch.where(w >= tw, torch.round((w - tw) / 2), -torch.div(tw - w, 2, rounding_mode="floor"))
        return top, left

    def matrix(self, sizes, params):
        th, tw = _size(self.size)
        top, left = self._origin(sizes)
        B = len(sizes)
        return _mat(torch.ones(B), torch.ones(B), left, top), torch.tensor([[th, tw]]).expand(B, 2).clone()

    def steps(self, sizes, params):
        th, tw = _size(self.size)
        top, left = self._origin(sizes)
        B = len(sizes)
        return [("crop", _ints(top), _ints(left), [th] * B, [tw] * B)]


class Letterbox(Geometric):
    """Fit inside ``size`` keeping aspect (the binding side exact, the other rounded), centred; the rest
    is filled with ``fill`` (0-255; masks get their ignore index)."""

    def __init__(self, size, fill: int = 0):

        _size(size)
        ok = isinstance(fill, (int, float)) and not isinstance(fill, bool) and math.isfinite(fill) \
            and 0 <= fill <= 255 and fill == int(fill)
        if not ok:
            raise ConfigError(f"Letterbox: fill is a pixel value, a whole number 0-255 (e.g. 114), got {fill!r}")
        self.size, self.fill = size, fill

    def _fit(self, sizes):
        th, tw = _size(self.size)
        h, w = sizes[:, 0].double(), sizes[:, 1].double()
        width_binds = tw / w <= th / h
        nw = torch.where(width_binds, torch.full_like(w, tw), torch.clamp(torch.round(w * th / h), 1, tw))
        nh = torch.where(width_binds, torch.clamp(torch.round(h * tw / w), 1, th), torch.full_like(h, th))
        top, left = torch.div(th - nh, 2, rounding_mode="floor"), torch.div(tw - nw, 2, rounding_mode="floor")
        return nh, nw, top, left

    def matrix(self, sizes, params):
        th, tw = _size(self.size)
        h, w = sizes[:, 0].double(), sizes[:, 1].double()
        nh, nw, top, left = self._fit(sizes)
        sx, sy = w / nw, h / nh
        B = len(sizes)
        return _mat(sx, sy, -left * sx, -top * sy), torch.tensor([[th, tw]]).expand(B, 2).clone()

    def steps(self, sizes, params):
        th, tw = _size(self.size)
        nh, nw, top, left = self._fit(sizes)
        B = len(sizes)
        return [("resize", _ints(nh), _ints(nw)), ("crop", _ints(-top), _ints(-left), [th] * B, [tw] * B)]


class RandomResizedCrop(Geometric):
    """torchvision's RandomResizedCrop parameter sampling, per sample: up to 10 tries of an area fraction
    ~ U(scale) and a log-uniform aspect ratio in ``ratio``, the crop placed uniformly; else the central
    crop clamped to ``ratio``. The crop is resized to ``size``."""

    def __init__(self, size, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):

        _size(size)
        self.size, self.scale, self.ratio = size, tuple(scale), tuple(ratio)
        if len(self.scale) != 2 or len(self.ratio) != 2 or not 0 < self.scale[0] <= self.scale[1] \
                or not 0 < self.ratio[0] <= self.ratio[1]:
            raise ConfigError(f"RandomResizedCrop: scale and ratio are (low, high) with 0 < low <= high, got "
                              f"{scale!r}, {ratio!r}")

    def params(self, sizes: torch.Tensor, gen: torch.Generator):
        """(top, left, crop_h, crop_w) per sample, float64 (whole numbers)."""
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

    def matrix(self, sizes, params):
        th, tw = _size(self.size)
        top, left, ch, cw = params
        B = len(sizes)
        return _mat(cw / tw, ch / th, left, top), torch.tensor([[th, tw]]).expand(B, 2).clone()

    def steps(self, sizes, params):
        th, tw = _size(self.size)
        top, left, ch, cw = params
        B = len(sizes)
        return [("crop", _ints(top), _ints(left), _ints(ch), _ints(cw)), ("resize", [th] * B, [tw] * B)]


class _RandomFlip(Geometric):
    axis = 0

    def __init__(self, p: float = 0.5):
        self.p = p

    def params(self, sizes, gen):
        return torch.rand(len(sizes), generator=gen, dtype=torch.float64) < self.p

    def matrix(self, sizes, flip):
        B = len(sizes)
        one, zero = torch.ones(B, dtype=torch.float64), torch.zeros(B, dtype=torch.float64)
        extent = sizes[:, 1 - self.axis].double()  # width for a horizontal flip
        s = torch.where(flip, -one, one)
        t = torch.where(flip, extent, zero)
        m = _mat(s, one, t, zero) if self.axis == 0 else _mat(one, s, zero, t)
        return m, sizes.clone()

    def steps(self, sizes, flip):
        return [("flip", [self.axis] * len(sizes), [bool(f) for f in flip.tolist()])]


class RandomHorizontalFlip(_RandomFlip):
    """Mirror left-right with probability ``p``, per sample. Exact (no resampling)."""

    axis = 0


class RandomVerticalFlip(_RandomFlip):
    """Mirror top-bottom with probability ``p``, per sample. Exact (no resampling)."""

    axis = 1
