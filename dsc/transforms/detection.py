"""Geometric ops of the detection and segmentation recipes, torchvision.transforms.v2's ScaleJitter,
RandomShortestSize, FixedSizeCrop, RandomZoomOut, RandomIoUCrop and RandomAffine, and Ultralytics' Mosaic.

Each geometric op reduces to a per-sample geometric description (``Geometric``: a 3x3 output -> input map,
the output size, and where it can, integer steps crop / resize / flip); ONE function moves every role of
the batch through it (``resample.apply_geometric``: pixels with their resampling and fill, boxes clipped
and dropped when empty with their per-box rows, semantic masks nearest with the ignore index outside), so
a new role plugs in there once. A chain that leaves samples at several sizes (scale jitter, zoom-out, IoU
crop, flips on mixed sizes) hands back a packed ragged batch (the list and torchvision forms take it as
it is: detection models resize themselves). Parameters are drawn per sample with torchvision's
distributions from the batch's (seed, epoch, rank, batch) generator.
"""
from __future__ import annotations

import math
from typing import List

import torch

from . import color as C
from .augment import BatchOp
from .fused import ChainPlan, full, run_program
from .geometric import Geometric, _ints, _mat, _size
from .objects import move_objects, void_record
from ..errors import ConfigError
from ..formats.fields import Schema
from ..formats.fields.base import drop_companions
from ..formats.fields.object_masks import rects_key
from ..nogil import nogil


def _fill(fill, name, p: bool = False):
    """A uint8 pixel value, a whole number 0-255, or one per channel (torchvision's ``fill=(123, 117, 104)``,
    the mean colour), as Letterbox takes it. ``p``: the op also takes a probability ``p``, which a fraction
    given as the fill likely meant (``Mosaic(640, 0.5)``)."""
    values = list(fill) if isinstance(fill, (tuple, list)) else [fill]
    if not values or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                             and 0 <= v <= 255 and v == int(v) for v in values):
        hint = (f"; for the probability, name it: {name}(..., p={fill!r})" if p and isinstance(fill, float)
                and 0 < fill < 1 else "")
        raise ConfigError(f"{name}: fill is a pixel value, a whole number 0-255 (e.g. 114) or one per channel, "
                          f"got {fill!r}{hint}")
    return tuple(values) if isinstance(fill, (tuple, list)) else fill


def _resize_to(sizes, nh, nw):
    h, w = sizes[:, 0].double(), sizes[:, 1].double()
    nh, nw = nh.clamp(min=1), nw.clamp(min=1)
    return _mat(w / nw, h / nh, 0.0, 0.0), torch.stack([nh, nw], 1).long()


class _DrawnResize(Geometric):
    """A resize of each sample to the size ``self._new(sizes, params)`` computes from the drawn params."""

    def matrix(self, sizes, p):
        return _resize_to(sizes, *self._new(sizes, p))

    def steps(self, sizes, p):
        nh, nw = self._new(sizes, p)
        return [("resize", _ints(nh), _ints(nw))]


class ScaleJitter(_DrawnResize):
    """torchvision ``ScaleJitter(target_size, scale_range=(0.1, 2.0))`` (the LSJ recipe): per sample
    r = min(th / h, tw / w) * U(scale_range); resized to (int(h r), int(w r)), antialiased."""

    def __init__(self, target_size, scale_range=(0.1, 2.0)):
        _size(target_size)
        lo, hi = scale_range
        if not 0 < lo <= hi:
            raise ConfigError(f"ScaleJitter: scale_range is (low, high) with 0 < low <= high, got {scale_range!r}")
        self.target_size, self.scale_range = target_size, (float(lo), float(hi))

    def params(self, sizes, gen):
        return C.uniform(gen, len(sizes), *self.scale_range)

    def _new(self, sizes, scale):
        th, tw = _size(self.target_size)
        h, w = sizes[:, 0].double(), sizes[:, 1].double()
        r = torch.minimum(th / h, tw / w) * scale
        return torch.floor(h * r).clamp(min=1), torch.floor(w * r).clamp(min=1)


class RandomShortestSize(_DrawnResize):
    """torchvision ``RandomShortestSize(min_size, max_size=None)`` (the multiscale recipe): per sample a
    shorter side drawn uniformly from ``min_size``, r = that / min(h, w), capped at max_size / max(h, w);
    resized to (int(h r), int(w r))."""

    def __init__(self, min_size, max_size: int | None = None):
        ms = [min_size] if isinstance(min_size, int) else list(min_size)
        if not ms or not all(isinstance(v, int) and v > 0 for v in ms) or \
                (max_size is not None and (not isinstance(max_size, int) or max_size <= 0)):
            raise ConfigError(f"RandomShortestSize: min_size is a positive int or a list of them, max_size a positive "
                              f"int or None; got {min_size!r}, {max_size!r}")
        self.min_size, self.max_size = ms, max_size

    def params(self, sizes, gen):
        return torch.tensor(self.min_size, dtype=torch.float64)[torch.randint(len(self.min_size), (len(sizes),),
                                                                              generator=gen)]

    def _new(self, sizes, short):
        h, w = sizes[:, 0].double(), sizes[:, 1].double()
        r = short / torch.minimum(h, w)
        if self.max_size is not None:
            r = torch.minimum(r, self.max_size / torch.maximum(h, w))
        return torch.floor(h * r).clamp(min=1), torch.floor(w * r).clamp(min=1)


class _SizedCrop(Geometric):
    """A crop of ``self.size`` at per-sample (top, left) offsets that ``params`` draws (pads where they
    fall outside the image)."""

    def matrix(self, sizes, p):
        th, tw = _size(self.size)
        top, left = p
        B = len(sizes)
        return _mat(torch.ones(B), torch.ones(B), left, top), torch.tensor([[th, tw]]).expand(B, 2).clone()

    def steps(self, sizes, p):
        th, tw = _size(self.size)
        top, left = p
        B = len(sizes)
        return [("crop", _ints(top), _ints(left), [th] * B, [tw] * B)]


class FixedSizeCrop(_SizedCrop):
    """torchvision ``FixedSizeCrop(size, fill=0)`` (the LSJ recipe): a crop of at most ``size`` at offset
    int(r * (h - th)), int(r * (w - tw)) (one r ~ U(0, 1) for both axes, per sample), padded at the bottom
    and right to ``size`` with ``fill`` (masks: their ignore index)."""

    def __init__(self, size, fill: int = 0):
        _size(size)
        self.size, self.fill = size, _fill(fill, "FixedSizeCrop")

    def params(self, sizes, gen):
        th, tw = _size(self.size)
        r = torch.rand(len(sizes), generator=gen, dtype=torch.float64)
        top = torch.floor((sizes[:, 0].double() - th).clamp(min=0) * r)
        left = torch.floor((sizes[:, 1].double() - tw).clamp(min=0) * r)
        return top, left


class RandomZoomOut(Geometric):
    """torchvision ``RandomZoomOut(fill=0, side_range=(1.0, 4.0), p=0.5)`` (the SSD recipe): with probability
    p, the image placed on a canvas int(r w) x int(r h), r ~ U(side_range), at a uniform offset; the rest
    ``fill`` (masks: their ignore index)."""

    def __init__(self, fill: int = 0, side_range=(1.0, 4.0), p: float = 0.5):
        lo, hi = side_range
        if not 1 <= lo <= hi:
            raise ConfigError(f"RandomZoomOut: side_range is (low, high) with 1 <= low <= high, got {side_range!r}")
        if not 0 <= p <= 1:
            raise ConfigError(f"RandomZoomOut: p is a probability, got {p!r}")
        self.fill, self.side_range, self.p = _fill(fill, "RandomZoomOut", p=True), (float(lo), float(hi)), float(p)

    def params(self, sizes, gen):
        B = len(sizes)
        on = torch.rand(B, generator=gen, dtype=torch.float64) < self.p
        r = C.uniform(gen, B, *self.side_range)
        u = torch.rand((B, 2), generator=gen, dtype=torch.float64)
        h, w = sizes[:, 0].double(), sizes[:, 1].double()
        ch, cw = torch.where(on, torch.floor(h * r), h), torch.where(on, torch.floor(w * r), w)
        left, top = torch.floor((cw - w) * u[:, 0]), torch.floor((ch - h) * u[:, 1])
        return top, left, ch, cw

    def matrix(self, sizes, p):
        top, left, ch, cw = p
        B = len(sizes)
        return _mat(torch.ones(B), torch.ones(B), -left, -top), torch.stack([ch, cw], 1).long()

    def steps(self, sizes, p):
        top, left, ch, cw = p
        return [("crop", _ints(-top), _ints(-left), _ints(ch), _ints(cw))]


ROUNDS_AT_ONCE = 8  # RandomIoUCrop: torchvision's rounds drawn and tested together (one set of tensor ops)
ROUND_ELEMENTS = 1 << 18  # ... at most this many (round, sample, trial, box) entries at once (box-dense batches)


class RandomIoUCrop(Geometric):
    """torchvision ``RandomIoUCrop(min_scale=0.3, max_scale=1.0, min_aspect_ratio=0.5, max_aspect_ratio=2.0,
    sampler_options=[0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0], trials=40)`` (the SSD recipe), per sample: draw a
    minimum IoU from the options (1.0: keep the image); up to ``trials`` crops of int(w U(scale)) x
    int(h U(scale)) with aspect in range, placed uniformly, that hold a box centre and reach the IoU with
    one of them; repeat. Boxes whose centre lies outside the crop are dropped (with their rows), the rest
    clipped. Draws from the boxes, so it runs on the gathered batch (not fused into the gather)."""

    needs_boxes = True

    def __init__(self, min_scale=0.3, max_scale=1.0, min_aspect_ratio=0.5, max_aspect_ratio=2.0,
                 sampler_options=None, trials: int = 40):
        if not 0 < min_scale <= max_scale <= 1 or not 0 < min_aspect_ratio <= max_aspect_ratio:
            raise ConfigError("RandomIoUCrop: 0 < min_scale <= max_scale <= 1 and 0 < min_aspect_ratio <= "
                              "max_aspect_ratio")
        self.min_scale, self.max_scale = float(min_scale), float(max_scale)
        self.min_aspect_ratio, self.max_aspect_ratio = float(min_aspect_ratio), float(max_aspect_ratio)
        self.sampler_options = [0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0] if sampler_options is None else \
            [float(v) for v in sampler_options]
        self.trials = int(trials)
        if self.trials < 1:  # (torchvision's loop would never end unless it drew 1.0)
            raise ConfigError(f"RandomIoUCrop: trials must be at least 1, got {trials}")

    def params(self, sizes, gen, boxes=None):
        """torchvision's loop, run for the whole batch at once: each round draws every unfinished sample's
        minimum IoU and its ``trials`` candidate crops together, and each sample takes its first candidate
        that passes (as the loop would, trial by trial); a sample whose draw is 1.0 keeps its image."""
        B = len(sizes)
        counts = [len(b) for b in boxes] if boxes is not None else [0] * B
        N = max(counts, default=0)
        bx = torch.zeros((B, max(N, 1), 4), dtype=torch.float64)
        has = torch.zeros((B, max(N, 1)), dtype=torch.bool)
        for b, n in enumerate(counts):
            if n:
                bx[b, :n], has[b, :n] = boxes[b].double().cpu(), True
        H, W = sizes[:, 0].double(), sizes[:, 1].double()
        top, left, ch, cw = torch.zeros(B, dtype=torch.float64), torch.zeros(B, dtype=torch.float64), H.clone(), W.clone()
        found = torch.zeros(B, dtype=torch.bool)  # a crop was taken
        todo = torch.ones(B, dtype=torch.bool)
        options = torch.tensor(self.sampler_options, dtype=torch.float64)
        cx = (0.5 * (bx[..., 0] + bx[..., 2])).unsqueeze(1)  # (B, 1, N)
        cy = (0.5 * (bx[..., 1] + bx[..., 3])).unsqueeze(1)
        area = ((bx[..., 2] - bx[..., 0]) * (bx[..., 3] - bx[..., 1])).unsqueeze(1)
        T_ = self.trials  # K rounds at once, fewer where the batch's boxes are many (each temporary is (K, B, T, N))
        K = max(1, min(ROUNDS_AT_ONCE, ROUND_ELEMENTS // max(1, B * T_ * max(N, 1))))
        cx, cy, area = cx.unsqueeze(0), cy.unsqueeze(0), area.unsqueeze(0)  # (1, B, 1, N)
        bxk, hask = bx.unsqueeze(1).unsqueeze(0), has.unsqueeze(1).unsqueeze(0)  # (1, B, 1, N, 4), (1, B, 1, N)
        Wk, Hk = W.view(1, B, 1), H.view(1, B, 1)
        rows = torch.arange(B)
        for _ in range(-(-1000 // K)):  # torchvision loops until it finds one; 1.0 (1 in 7) ends it
            if not bool(todo.any()):
                break
            # K of torchvision's rounds drawn at once for every sample: (minimum IoU, trials) per round; each
            # sample ends at its first round that draws 1.0 or has a passing trial (the draws of the rounds
            # after it go unused: each round's draws are independent, so the crop's distribution is the loop's)
            m = options[torch.randint(len(options), (K, B), generator=gen)]
            r = self.min_scale + (self.max_scale - self.min_scale) * torch.rand((K, B, T_, 2), generator=gen,
                                                                                dtype=torch.float64)
            u = torch.rand((K, B, T_, 2), generator=gen, dtype=torch.float64)
            nw, nh = torch.floor(Wk * r[..., 0]), torch.floor(Hk * r[..., 1])  # (K, B, T)
            ok = (nh > 0) & (nw > 0)
            aspect = nw / nh.clamp(min=1)
            ok &= (self.min_aspect_ratio <= aspect) & (aspect <= self.max_aspect_ratio)
            lf, tp = torch.floor((Wk - nw) * u[..., 0]), torch.floor((Hk - nh) * u[..., 1])
            l4, t4, r4, b4 = (v.unsqueeze(-1) for v in (lf, tp, lf + nw, tp + nh))  # (K, B, T, 1)
            inside = hask & (l4 < cx) & (cx < r4) & (t4 < cy) & (cy < b4)  # (K, B, T, N)
            iw = (torch.minimum(bxk[..., 2], r4) - torch.maximum(bxk[..., 0], l4)).clamp(min=0)
            ih = (torch.minimum(bxk[..., 3], b4) - torch.maximum(bxk[..., 1], t4)).clamp(min=0)
            inter = iw * ih
            iou = inter / (area + (nw * nh).unsqueeze(-1) - inter)
            best = torch.where(inside, iou, torch.full_like(iou, -1.0)).amax(-1)
            ok &= inside.any(-1) & (best >= m.unsqueeze(-1)) & (m < 1.0).unsqueeze(-1)
            ends = (ok.any(-1) | (m >= 1.0)) & todo.view(1, B)  # (K, B)
            hit_any = ends.any(0)
            if not bool(hit_any.any()):
                continue
            k = ends.to(torch.uint8).argmax(0)  # each sample's first round that ends it
            crop = hit_any & (m[k, rows] < 1.0)
            t = ok[k, rows].to(torch.uint8).argmax(-1)  # that round's first passing trial
            top, left = torch.where(crop, tp[k, rows, t], top), torch.where(crop, lf[k, rows, t], left)
            ch, cw = torch.where(crop, nh[k, rows, t], ch), torch.where(crop, nw[k, rows, t], cw)
            found |= crop
            todo &= ~hit_any
        cx, cy = cx[0], cy[0]
        # the boxes whose centre lies inside the crop (a sample that kept its image keeps them all)
        l3, t3, r3, b3 = (v.view(B, 1, 1) for v in (left, top, left + cw, top + ch))
        inside = (l3 < cx) & (cx < r3) & (t3 < cy) & (cy < b3)
        keep = (inside[:, 0] | ~found.view(B, 1))
        keep = torch.cat([keep[b, :n] for b, n in enumerate(counts)]) if B else torch.zeros(0, dtype=torch.bool)
        return {"top": top, "left": left, "h": ch, "w": cw, "keep": keep}

    def matrix(self, sizes, p):
        B = len(sizes)
        return _mat(torch.ones(B), torch.ones(B), p["left"], p["top"]), torch.stack([p["h"], p["w"]], 1).long()

    def steps(self, sizes, p):
        return [("crop", _ints(p["top"]), _ints(p["left"]), _ints(p["h"]), _ints(p["w"]))]


def _pair(v, name, sym=True):
    if v is None:
        return None
    if isinstance(v, (int, float)):
        if v < 0:
            raise ConfigError(f"RandomAffine: a single {name} must be non-negative, got {v!r}")
        return (-float(v), float(v)) if sym else (float(v), float(v))
    return tuple(float(x) for x in v)


class RandomAffine(Geometric):
    """torchvision ``RandomAffine(degrees, translate=None, scale=None, shear=None, interpolation=NEAREST,
    fill=0, center=None)``: per sample angle ~ U(degrees), translation round(U(-t w, t w)), round(U(-t h, t h))
    pixels, scale ~ U(scale), shear x ~ U(shear[0:2]) (and y ~ U(shear[2:4])), composed as torchvision's
    inverse affine matrix about ``center`` (default the image centre). dsc's ``size=(h, w)``: the output size
    (Ultralytics' random_perspective after Mosaic: the input centre lands on the output centre + the
    translation, as a fraction of the output size). Resampled as torchvision's affine (no antialiasing):
    images by ``interpolation`` ("nearest", torchvision's default, or "bilinear"), straight from the uint8
    pixels; masks nearest; boxes by their corners, clipped and dropped when empty. A chain holding it is
    resampled once, through the composed map, with its interpolation."""

    def __init__(self, degrees=0, translate=None, scale=None, shear=None, interpolation="nearest", fill: int = 0,
                 center=None, size=None):
        mode = str(getattr(interpolation, "value", interpolation)).lower()
        if mode not in ("nearest", "bilinear"):
            raise ConfigError(f"RandomAffine: interpolation is 'nearest' (torchvision's default) or 'bilinear', got "
                              f"{interpolation!r}")
        self.interpolation = mode
        self.degrees = _pair(degrees, "degrees")
        self.translate = None if translate is None else tuple(float(v) for v in translate)
        if self.translate is not None and (len(self.translate) != 2 or not all(0 <= v <= 1 for v in self.translate)):
            raise ConfigError(f"RandomAffine: translate is (fraction x, fraction y) in [0, 1], got {translate!r}")
        self.scale = None if scale is None else tuple(float(v) for v in scale)
        if self.scale is not None and (len(self.scale) != 2 or not 0 < self.scale[0] <= self.scale[1]):
            raise ConfigError(f"RandomAffine: scale is (low, high) > 0, got {scale!r}")
        self.shear = _pair(shear, "shear")
        if self.shear is not None and len(self.shear) not in (2, 4):
            raise ConfigError(f"RandomAffine: shear is a number, (x low, x high) or 4 numbers, got {shear!r}")
        self.fill, self.center = _fill(fill, "RandomAffine"), center
        if size is not None:
            _size(size)
        self.size = size

    def params(self, sizes, gen):
        B = len(sizes)
        out = sizes.double() if self.size is None else torch.tensor([_size(self.size)], dtype=torch.float64).expand(B, 2)
        angle = C.uniform(gen, B, *self.degrees)
        if self.translate is not None:
            tx = torch.round(C.uniform(gen, B, -1, 1) * self.translate[0] * out[:, 1])
            ty = torch.round(C.uniform(gen, B, -1, 1) * self.translate[1] * out[:, 0])
        else:
            tx = ty = torch.zeros(B, dtype=torch.float64)
        sc = C.uniform(gen, B, *self.scale) if self.scale is not None else torch.ones(B, dtype=torch.float64)
        shx = shy = torch.zeros(B, dtype=torch.float64)
        if self.shear is not None:
            shx = C.uniform(gen, B, *self.shear[:2])
            if len(self.shear) == 4:
                shy = C.uniform(gen, B, *self.shear[2:])
        return angle, tx, ty, sc, shx, shy

    def matrix(self, sizes, p):
        angle, tx, ty, sc, shx, shy = p
        B = len(sizes)
        M = C.affine_matrix(sizes, angle, (tx, ty), sc, (shx, shy), self.center)
        if self.size is None:
            return M, sizes.clone().long()
        oh, ow = _size(self.size)
        shift = torch.eye(3, dtype=torch.float64).repeat(B, 1, 1)
        shift[:, 0, 2] = sizes[:, 1].double() / 2 - ow / 2
        shift[:, 1, 2] = sizes[:, 0].double() / 2 - oh / 2
        return M @ shift, torch.tensor([[oh, ow]]).expand(B, 2).clone()


class Mosaic(BatchOp):
    """Ultralytics' ``Mosaic(imgsz=640, p=1.0, n=4)`` (the YOLO default). Per sample, with probability ``p``:
    it and three partners are each resized to a longer side of ``size`` (min(ceil(side r), size)) and placed
    around a centre (xc, yc) ~ U(size/2, 3 size/2) on a 2 size x 2 size canvas of ``fill`` (top-left,
    top-right, bottom-left, bottom-right); otherwise (Ultralytics' ``p`` < 1: the image alone, letterboxed
    to size x size before its random_perspective) it is resized alike and letterboxed into a size x size
    square at the canvas centre, so the ``RandomAffine(..., size=size)`` that follows treats both as
    Ultralytics does.

    Which samples are combined: the partners are drawn uniformly (with replacement, the sample itself
    included) from the same batch. Ultralytics draws them from its buffer of the images it loaded last (up to
    64); dsc's batch plays that buffer, so Mosaic stays one pass over the gathered batch, and the draws come
    from the batch's (seed, epoch, rank, batch) generator: deterministic, the same for any thread count,
    replayed on resume. Per-sample values (label fields, value fields) stay the sample's own.

    Everything per object moves with the image it belongs to: each placement is one per-sample map (scale,
    then shift) through the shared mover (``objects.move_objects``): boxes scaled, shifted, clipped to the
    canvas (where each placed image shows: its inner edges are the image's own), dropped when empty with
    every per-box row, per-object mask and keypoint row; per-object masks nearest; keypoints moved (a joint
    that leaves the canvas becomes (0, 0, 0)); semantic masks placed alike (nearest, their ignore index
    around). The four images' objects are merged per sample in placement order."""

    def __init__(self, size: int = 640, fill: int = 114, p: float = 1.0):
        if not isinstance(size, int) or size <= 0:
            raise ConfigError(f"Mosaic: size is a positive int, got {size!r}")
        if not isinstance(p, (int, float)) or isinstance(p, bool) or not 0 <= p <= 1:
            raise ConfigError(f"Mosaic: p is a probability 0-1 (Ultralytics' mosaic=), got {p!r}")
        self.size, self.fill, self.p = size, _fill(fill, "Mosaic", p=True), float(p)

    def placements(self, sizes: torch.Tensor, gen: torch.Generator) -> list[list[tuple]]:
        """Per output sample, its placements: (source sample, (h, w) resized, canvas region (x1a, y1a, x2a,
        y2a), region of the resized image shown there (x1b, y1b, x2b, y2b))."""
        B, s = len(sizes), self.size
        on = torch.rand(B, generator=gen, dtype=torch.float64) < self.p
        partners = torch.randint(max(B, 1), (B, 3), generator=gen)
        centres = torch.floor(C.uniform(gen, 2 * B, s / 2, 3 * s / 2)).long().view(B, 2).tolist()  # (xc, yc)
        hw = sizes.tolist()
        on, partners = on.tolist(), partners.tolist()  # (Python numbers: no tensor call per sample)

        def resized(j):
            h0, w0 = hw[j]
            r = s / max(h0, w0)
            return min(math.ceil(h0 * r), s), min(math.ceil(w0 * r), s)

        parts = []
        for b in range(B):
            if not on[b]:  # letterboxed to s x s (Ultralytics' LetterBox: round(d - 0.1)), at the centre
                h, w = resized(b)
                top, left = s // 2 + round((s - h) / 2 - 0.1), s // 2 + round((s - w) / 2 - 0.1)
                parts.append([(b, (h, w), (left, top, left + w, top + h), (0, 0, w, h))])
                continue
            xc, yc = centres[b]
            own = []
            for i, j in enumerate([b] + partners[b]):
                h, w = resized(j)
                if i == 0:
                    a = (max(xc - w, 0), max(yc - h, 0), xc, yc)
                    bb = (w - (a[2] - a[0]), h - (a[3] - a[1]), w, h)
                elif i == 1:
                    a = (xc, max(yc - h, 0), min(xc + w, 2 * s), yc)
                    bb = (0, h - (a[3] - a[1]), min(w, a[2] - a[0]), h)
                elif i == 2:
                    a = (max(xc - w, 0), yc, xc, min(2 * s, yc + h))
                    bb = (w - (a[2] - a[0]), 0, w, min(a[3] - a[1], h))
                else:
                    a = (xc, yc, min(xc + w, 2 * s), min(2 * s, yc + h))
                    bb = (0, 0, min(w, a[2] - a[0]), min(a[3] - a[1], h))
                own.append((j, (h, w), a, bb))
            parts.append(own)
        return parts

    def __call__(self, batch, gen):
        from .resample import _views  # lazy: resample imports this package's geometric ops

        schema = getattr(batch, "schema", None)
        if schema is None:
            if "boxes" in batch or "mask" in batch:
                raise ConfigError("Mosaic: this batch has boxes or a mask but no schema; pass schema=ds.schema")
            schema = Schema.default()
        if "box_offsets" not in batch and "boxes" in batch:
            raise ConfigError("Mosaic moves boxes in the packed form: gather with boxes='packed' (the default)")
        pixels = {k: r for k, r in schema.pixels().items() if k in batch}
        sizes = _views(batch, "image")[1]
        B, s = len(sizes), self.size
        parts = self.placements(sizes, gen)
        for key, role in pixels.items():
            views = _views(batch, key)[0]
            nearest = role.resample == "nearest"
            fill = role.fill if role.fill is not None else self.fill
            tail = tuple(views[0].shape[2:]) if views else role.tail
            canvas = full((B, 2 * s, 2 * s, *tail), fill, batch[key].dtype, batch[key].device)
            resized: list = []  # each source resized once, however many placements show it
            slot: dict = {}
            pastes = []  # (sample, its resized source's slot, canvas region, region of the resized image)
            dtype, dev = canvas.dtype, canvas.device
            for b, own in enumerate(parts):
                for j, (h, w), a, bb in own:
                    if a[3] - a[1] <= 0 or a[2] - a[0] <= 0:
                        continue
                    if j not in slot:
                        slot[j] = len(resized)
                        resized.append(torch.empty((h, w, *tail), dtype=dtype, device=dev))
                        run_program(views[j], [("resize", h, w)], resized[-1], nearest, fill)
                    pastes.append([b, slot[j], *a, *bb])
            _paste(canvas, resized, pastes)
            drop_companions(batch, key)
            batch[key] = canvas
        if "boxes" in batch:
            self._objects(batch, schema, sizes, parts)
        void_record(batch, getattr(batch, "schema", None))  # (wherever it runs: in Compose, RandomChoice...)
        return batch

    def _objects(self, batch, schema, sizes, parts):
        """Every placement is one per-sample map from the canvas to its source (undo the shift, then the
        resize): the placements' objects (each its source's box rows, per-object masks, keypoints) go as one
        batch of placements through ``move_objects``, whose per-placement offsets then regroup per sample."""
        side = 2 * self.size
        hw = sizes.tolist()
        src, M = [], []
        for own in parts:
            for j, (h, w), a, bb in own:
                h0, w0 = hw[j]
                sx, sy = w0 / w, h0 / h
                src.append(j)
                M.append([[sx, 0, -(a[0] - bb[0]) * sx], [0, sy, -(a[1] - bb[1]) * sy], [0, 0, 1]])
        P = len(src)
        M = torch.tensor(M, dtype=torch.float64).view(P, 3, 3)
        sub = take_objects(batch, schema, torch.tensor(src, dtype=torch.long))
        plan = ChainPlan(M, (side, side), None, sizes=sizes[src].view(P, 2), hflip=torch.zeros(P, dtype=torch.bool),
                         out_sizes=torch.tensor([[side, side]], dtype=torch.long).expand(P, 2))
        move_objects(sub, plan, schema, record=False)  # (placements, not samples: Mosaic voids the record)
        first = torch.tensor([0] + [len(own) for own in parts], dtype=torch.long).cumsum(0)
        sub["box_offsets"] = sub["box_offsets"][first.to(sub["box_offsets"].device)]
        batch.update(sub)


@nogil(cpu_only=True)
def _paste(canvas: torch.Tensor, sources: List[torch.Tensor], pastes: List[List[int]]) -> None:
    """Mosaic's placements into the canvases: each row (sample b, source k, x1a, y1a, x2a, y2a, x1b, y1b, x2b,
    y2b) copies ``sources[k]``'s region (x1b, y1b)-(x2b, y2b) to ``canvas[b]``'s (x1a, y1a)-(x2a, y2a) (scripted:
    a filler thread's copies and slices never reach Python)."""
    for r in pastes:
        canvas[r[0], r[3]:r[5], r[2]:r[4]].copy_(sources[r[1]][r[7]:r[9], r[6]:r[8]])


class YoloMixUp(BatchOp):
    """Ultralytics' ``MixUp(p=mixup)`` of the YOLO recipe (``T.presets.yolo(mixup=...)``; after Mosaic and
    the random perspective, as Ultralytics runs it on two images that both went through them): per sample,
    with probability ``p``, a partner drawn uniformly from the OTHER samples of the batch (Ultralytics: an
    image from its buffer of recent loads, through its own mosaic and perspective; here the partner as it
    is after the ops before this one) and a ratio r ~ Beta(alpha, alpha) (Ultralytics: Beta(32, 32)); the
    image becomes uint8(r · image + (1 - r) · partner) (truncated, as numpy's astype), and its objects are
    its own followed by the partner's (boxes, per-box rows, per-object masks, keypoints: Ultralytics'
    Instances.concatenate). Images of one size. A semantic mask (Ultralytics has none) is not blended: each
    pixel takes the class of the image that has an object there, the ignore index where both have different
    ones."""

    def __init__(self, p: float = 0.0, alpha: float = 32.0):
        if not isinstance(p, (int, float)) or isinstance(p, bool) or not 0 <= p <= 1:
            raise ConfigError(f"YoloMixUp: p is a probability 0-1 (Ultralytics' mixup=), got {p!r}")
        if not isinstance(alpha, (int, float)) or alpha <= 0:
            raise ConfigError(f"YoloMixUp: alpha is a positive number (Ultralytics: 32.0), got {alpha!r}")
        self.p, self.alpha = float(p), float(alpha)

    def draw(self, B: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(mixed (B,) bool, partner (B,) long, ratio (B,) float64)."""
        on = torch.rand(B, generator=gen, dtype=torch.float64) < self.p
        other = torch.randint(max(B - 1, 1), (B,), generator=gen)
        partner = torch.where(other >= torch.arange(B), other + 1, other) if B > 1 else torch.zeros(B, dtype=torch.long)
        return on & (B > 1), partner, C.beta(gen, self.alpha, self.alpha, B).view(B)

    def __call__(self, batch, gen):
        schema = getattr(batch, "schema", None) or Schema.default()
        img = batch["image"]
        if "image_offsets" in batch and len(batch["image_offsets"]) <= 1 or len(img) == 0:
            return batch  # an empty batch
        if "image_offsets" in batch or "image_sizes" in batch or img.dim() != 4:
            raise ConfigError("YoloMixUp blends images of one size: put it after Mosaic and RandomAffine(size=...)")
        masks = {k: r for k, r in schema.pixels().items() if k != "image" and k in batch}
        if any(f"{k}_offsets" in batch or f"{k}_sizes" in batch for k in masks):
            raise ConfigError("YoloMixUp blends images of one size: put it after Mosaic and RandomAffine(size=...)")
        B = len(img)
        on, partner, r = self.draw(B, gen)
        if not bool(on.any()):
            return batch
        idx = torch.nonzero(on).view(-1)
        rr = r[idx].to(torch.float32).to(img.device).view(-1, 1, 1, 1)
        a, b = img[idx.to(img.device)].float(), img[partner[idx].to(img.device)].float()
        mixed = a.mul_(rr).add_(b.mul_(1 - rr))
        out = img.clone()
        out[idx.to(img.device)] = (mixed.trunc_().clamp_(0, 255) if img.dtype == torch.uint8 else mixed).to(img.dtype)
        batch["image"] = out
        for k, role in masks.items():  # class ids are not blended: each pixel keeps the object that is there
            m, d = batch[k], idx.to(batch[k].device)
            a, b = m[d], m[partner[idx].to(m.device)]
            ignore = torch.full((), role.fill if role.fill is not None else 255, dtype=m.dtype, device=m.device)
            new = m.clone()
            new[d] = torch.where(a == 0, b, torch.where((b == 0) | (b == a), a, ignore))
            batch[k] = new
        if "boxes" in batch:
            src, groups = [], []
            for k in range(B):
                src += [k, int(partner[k])] if bool(on[k]) else [k]
                groups.append(len(src))
            sub = take_objects(batch, schema, torch.tensor(src, dtype=torch.long))
            first = torch.tensor([0] + groups, dtype=torch.long)
            sub["box_offsets"] = sub["box_offsets"][first.to(sub["box_offsets"].device)]
            batch.update(sub)
        return batch


def take_objects(batch: dict, schema: Schema, samples: torch.Tensor) -> dict:
    """The per-object keys of a packed batch (boxes, per-box rows, keypoints, per-object masks) for the
    samples ``samples`` (a sample may come several times), in that order, with their ``box_offsets``."""
    offsets = batch["box_offsets"].cpu()
    counts = (offsets[1:] - offsets[:-1])[samples]
    rows = torch.repeat_interleave(offsets[:-1][samples], counts) + torch.arange(int(counts.sum())) - \
        torch.repeat_interleave(torch.cumsum(counts, 0) - counts, counts)
    out = {}
    for k in schema.box_rows():
        if k in batch:
            out[k] = batch[k][rows.to(batch[k].device)]
    for k in schema.object_masks():
        if k not in batch:
            continue
        mo = batch[f"{k}_offsets"].cpu()
        lengths = mo[1:][rows] - mo[:-1][rows]
        starts = torch.cumsum(lengths, 0) - lengths
        pix = torch.repeat_interleave(mo[:-1][rows] - starts, lengths) + torch.arange(int(lengths.sum()))
        dev = batch[k].device
        out[k] = batch[k][pix.to(dev)]
        out[rects_key(k)] = batch[rects_key(k)][rows.to(dev)]
        new = torch.zeros(len(rows) + 1, dtype=torch.int64)
        torch.cumsum(lengths, 0, out=new[1:])
        out[f"{k}_offsets"] = new.to(dev)
    new = torch.zeros(len(samples) + 1, dtype=torch.int64)
    torch.cumsum(counts, 0, out=new[1:])
    out["box_offsets"] = new.to(batch["box_offsets"].device)
    return out


class RandomCrop(_SizedCrop):
    """torchvision ``RandomCrop(size, pad_if_needed=False, fill=0)`` (the segmentation recipe's crop): a
    side shorter than the crop is padded by the difference on both sides when ``pad_if_needed`` (v2's
    rule), then the crop is placed uniformly (``torch.randint(0, h - th + 1)``); outside: ``fill`` (masks:
    their ignore index)."""

    def __init__(self, size, pad_if_needed: bool = False, fill: int = 0):
        _size(size)
        self.size, self.pad_if_needed, self.fill = size, bool(pad_if_needed), _fill(fill, "RandomCrop")

    def params(self, sizes, gen):
        th, tw = _size(self.size)
        h, w = sizes[:, 0].double(), sizes[:, 1].double()
        ph = (th - h).clamp(min=0) if self.pad_if_needed else torch.zeros_like(h)
        pw = (tw - w).clamp(min=0) if self.pad_if_needed else torch.zeros_like(w)
        if not self.pad_if_needed and bool(((h < th) | (w < tw)).any()):
            raise ConfigError(f"RandomCrop({self.size}): an image is smaller than the crop; pass pad_if_needed=True")
        u = torch.rand((len(sizes), 2), generator=gen, dtype=torch.float64)
        top = torch.floor(u[:, 0] * (h + 2 * ph - th + 1)) - ph
        left = torch.floor(u[:, 1] * (w + 2 * pw - tw + 1)) - pw
        return top, left
