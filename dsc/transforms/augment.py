"""Photometric augmentations: torchvision.transforms.v2's ColorJitter, RandomGrayscale, GaussianBlur,
RandomPhotometricDistort, RandomErasing, AutoAugment, RandAugment, TrivialAugmentWide and AugMix, and
Ultralytics' HSV jitter (RandomHSV), run batched.

Each op draws its parameters per sample from the batch's (seed, epoch, rank, batch) generator with
torchvision's distributions (``params(sizes, gen)``: a dict of per-sample tensors), then applies them to the
whole batch at once (``apply``): one vectorised pass per op, or per distinct sub-op where samples drew
different ones (AutoAugment's policies: the samples that drew Rotate are rotated together). A run of these
ops is one stage. Each op's formula is written once, on float pixels (``apply``), quantising as torchvision
does on uint8 tensors (so a single op is within a grey level of torchvision on the same parameters). On the
CPU a fixed-size uint8 batch stays uint8 between ops (``apply_u8``): an op runs on just the samples that drew
it, as a per-sample lookup table made by its float formula on the 256 values (brightness, contrast,
posterize, solarize, invert, autocontrast, equalize: its histograms and lookups by PIL's C loops), a
whole-pixel shift (translate), a shear as each line's 2-tap blend (ShearY's taps gathered as the sample lies),
a nearest warp as a gather (warp_gather.py: no grid_sample), or a float copy of those samples (sharpness, colour
sample by sample in the batch's own layout, bilinear rotate on each one's channels-last copy...), each giving the
float formula's very numbers (tests/test_recipes_uint8.py); an op at a magnitude that leaves the image as it
is is skipped; the ToFloat/Normalize pass after it writes the float
batch into the Loader's ring slot. On CUDA (after the uint8 copy) the batch becomes float (B, C, H, W) once
and the ops run on it. A float image (after ToFloat, before Normalize) is taken as [0, 1] (RandomErasing
there writes its windows in place). Ragged batches (images of several sizes) are run one sample at a time,
with the same draws.

Photometric ops touch only the image: boxes, masks and labels are left as they are. The auto-augment
family's geometric sub-ops (shear, translate, rotate) move the image only, as in classification
training; a batch with boxes or masks is refused by them (use RandomAffine for detection).
"""
from __future__ import annotations

import math
from typing import List, Optional

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from . import color as C
from . import warp_gather as G
from ..errors import ConfigError
from ..nogil import nogil
from ..scratch import scratch_tensor


class BatchOp:
    """A batch op of dsc.transforms that is not geometric: ``op(batch, gen) -> batch``."""

    def __call__(self, batch: dict, gen: torch.Generator) -> dict:
        raise NotImplementedError

    def bind(self, dataset) -> None:
        """Learn what it needs from the dataset the Loader reads (MixUp: the number of classes)."""

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({args})"


class PixelOp(BatchOp):
    """A photometric op: ``params(sizes, gen)`` draws per-sample parameters ({name: (B, ...) tensor}),
    ``apply(x, params, sizes, bound, integer)`` runs them on float (N, C, H, W) pixels in 0..bound."""

    moves_pixels = False  # the auto-augment family shears/rotates the image: refused beside boxes and masks
    # Look-ahead (Compose, a geometric stage next: apply_pixel_ops' ``windows``): an op whose output pixel is
    # its input pixel's alone, but for statistics of the whole image that ``whole_prefix`` computes, runs on
    # just the rectangle of each sample the later crops read. ``whole_stats``: it reads such statistics (then
    # it must be the stage's first op: an op after it would see the rest of the image unprocessed).
    windowed = False
    whole_stats = False

    def whole_prefix(self, x: torch.Tensor, p: dict) -> dict | None:
        """For the look-ahead, on one whole CPU uint8 sample ``x`` (1, H, W, C) and its params: run in place
        what the whole-image statistics read, and return the params of what is left (per pixel: run on any
        window by ``apply_u8``), or None, having written nothing: run the whole sample."""
        return p

    def params(self, sizes: torch.Tensor, gen: torch.Generator) -> dict:
        return {}

    def apply(self, x: torch.Tensor, p: dict, sizes: torch.Tensor, bound: float, integer: bool) -> torch.Tensor:
        raise NotImplementedError

    def apply_u8(self, x: torch.Tensor, p: dict, sizes: torch.Tensor) -> torch.Tensor:
        """The same on uint8 (N, H, W, C) pixels (the CPU stage keeps them uint8 between ops): ``apply`` on a
        float copy, quantised as on uint8 (ops with a uint8 kernel override it). May write into ``x``."""
        return _to_u8(self.apply(_to_float(x), p, sizes, 255.0, True))

    def __call__(self, batch: dict, gen: torch.Generator) -> dict:
        return apply_pixel_ops([self], batch, gen)


def _take_rows(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """A copy of samples ``rows`` of a contiguous batch (index_select over flat rows: a memcpy each)."""
    return x.reshape(len(x), -1).index_select(0, rows.to(x.device)).view(len(rows), *x.shape[1:])


def _put_rows(x: torch.Tensor, rows: torch.Tensor, y: torch.Tensor) -> None:
    """x[rows] = y, a sample at a time (torch's index_copy_/index_put_ on images are many times slower)."""
    _copy_rows(x, rows.tolist(), y)


@nogil
def _copy_rows(x: torch.Tensor, rows: List[int], y: torch.Tensor) -> None:
    for i in range(len(rows)):
        x[rows[i]].copy_(y[i])


def _to_float(x: torch.Tensor) -> torch.Tensor:
    """uint8 (N, H, W, C) -> float32 (N, C, H, W) (channels-last in memory, as the float stage has it)."""
    return x.permute(0, 3, 1, 2).to(torch.float32)


def _to_u8(y: torch.Tensor) -> torch.Tensor:
    """float (N, C, H, W) holding whole values -> uint8 (N, H, W, C), clamped to 0..255."""
    return y.clamp_(0, 255).to(torch.uint8).permute(0, 2, 3, 1)


def _range(value, name: str, center: float = 1.0, bound=(0, float("inf")), clip_first: bool = True):
    """torchvision's ``_check_input``: a number v -> [center - v, center + v] (clipped at 0), or (lo, hi)."""
    if value is None or value == 0:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if value < 0:
            raise ConfigError(f"{name}: a single value must be non-negative, got {value!r}")
        lo, hi = center - value, center + value
        if clip_first:
            lo = max(lo, 0.0)
    else:
        try:
            lo, hi = (float(v) for v in value)
        except (TypeError, ValueError):
            raise ConfigError(f"{name} is a number or (low, high), got {value!r}") from None
    if not bound[0] <= lo <= hi <= bound[1]:
        raise ConfigError(f"{name}: values should be between {bound}, got ({lo}, {hi})")
    return None if lo == hi == center else (float(lo), float(hi))


def _prob(p, name):
    if not isinstance(p, (int, float)) or isinstance(p, bool) or not 0 <= p <= 1:
        raise ConfigError(f"{name}: p is a probability in [0, 1], got {p!r}")
    return float(p)


def _take(p: dict, idx) -> dict:
    return {k: v[idx] for k, v in p.items()}


def _subset_apply(x: torch.Tensor, on: torch.Tensor, fn) -> torch.Tensor:
    """``fn(x[on], rows)`` written back into x (all: in one call; none: x untouched)."""
    on = on.to(torch.bool)
    if bool(on.all()):
        return fn(x, torch.arange(len(x)))
    if not bool(on.any()):
        return x
    rows = on.nonzero().view(-1)
    x = x.clone() if x.requires_grad else x
    x[rows.to(x.device)] = fn(x[rows.to(x.device)], rows)
    return x


# ------------------------------------------------------------------------------------------------ simple ops
class ColorJitter(PixelOp):
    """torchvision ``ColorJitter(brightness, contrast, saturation, hue)``: per sample, factors ~ U(range) (a
    number v means [max(0, 1 - v), 1 + v]; hue: [-v, v], v <= 0.5) applied in a random order (a random
    permutation of the four per sample, as ``torch.randperm(4)``)."""

    _FNS = (C.brightness, C.contrast, C.saturation, C.hue)

    def __init__(self, brightness=0, contrast=0, saturation=0, hue=0):
        self.brightness = _range(brightness, "ColorJitter brightness")
        self.contrast = _range(contrast, "ColorJitter contrast")
        self.saturation = _range(saturation, "ColorJitter saturation")
        self.hue = _range(hue, "ColorJitter hue", center=0, bound=(-0.5, 0.5), clip_first=False)

    def params(self, sizes, gen):
        B = len(sizes)
        order = torch.argsort(torch.rand((B, 4), generator=gen), 1)  # a uniform permutation per sample
        p = {"order": order}
        for k, rng in enumerate((self.brightness, self.contrast, self.saturation, self.hue)):
            p[f"f{k}"] = C.uniform(gen, B, *rng) if rng else torch.full((B,), 0.0 if k == 3 else 1.0, dtype=torch.float64)
        return p

    def apply(self, x, p, sizes, bound, integer):
        ranges = (self.brightness, self.contrast, self.saturation, self.hue)
        for slot in range(4):
            for k in sorted(set(p["order"][:, slot].tolist())):  # the ops these samples put in this slot
                if ranges[k] is None:
                    continue
                on = p["order"][:, slot] == k
                x = _subset_apply(x, on, lambda v, r, k=k: self._FNS[k](v, p[f"f{k}"][r], bound, integer))
        return x


class RandomGrayscale(PixelOp):
    """torchvision ``RandomGrayscale(p=0.1)``: with probability p the sample becomes its grey image
    (0.2989 R + 0.587 G + 0.114 B) in every channel."""

    windowed = True  # (per pixel)

    def __init__(self, p: float = 0.1):
        self.p = _prob(p, "RandomGrayscale")

    def params(self, sizes, gen):
        return {"on": torch.rand(len(sizes), generator=gen, dtype=torch.float64) < self.p}

    def apply(self, x, p, sizes, bound, integer):
        return _subset_apply(x, p["on"], lambda v, r: C.to_grayscale(v, integer))


class GaussianBlur(PixelOp):
    """torchvision ``GaussianBlur(kernel_size, sigma=(0.1, 2.0))``: sigma ~ U(sigma) per sample (the same in x
    and y), kernel exp(-t^2 / 2 sigma^2) on t = -(k-1)/2..(k-1)/2 normalised, reflect padding; kernel_size
    an odd int or (kx, ky)."""

    def __init__(self, kernel_size, sigma=(0.1, 2.0)):
        ks = (kernel_size, kernel_size) if isinstance(kernel_size, int) else tuple(kernel_size)
        if len(ks) != 2 or not all(isinstance(k, int) and k > 0 and k % 2 == 1 for k in ks):
            raise ConfigError(f"GaussianBlur: kernel_size is an odd positive int or (kx, ky), got {kernel_size!r}")
        s = (sigma, sigma) if isinstance(sigma, (int, float)) else tuple(sigma)
        if len(s) != 2 or not 0 < s[0] <= s[1]:
            raise ConfigError(f"GaussianBlur: sigma is a positive number or (min, max), got {sigma!r}")
        self.kernel_size, self.sigma = ks, (float(s[0]), float(s[1]))

    def params(self, sizes, gen):
        return {"sigma": C.uniform(gen, len(sizes), *self.sigma)}

    def apply(self, x, p, sizes, bound, integer):
        return C.gaussian_blur(x, self.kernel_size, p["sigma"].view(-1, 1).expand(-1, 2), bound, integer)


class RandomPhotometricDistort(PixelOp):
    """torchvision ``RandomPhotometricDistort`` (the SSD recipe): brightness, contrast, saturation and hue each
    applied with probability p at a factor ~ U(range); contrast before or after saturation+hue (1/2 each);
    with probability p the channels permuted at random. Per pixel but for contrast's mean, over the whole
    image at its point of the chain: before a crop (the SSD recipe) only the pixels the crop keeps are
    processed (:meth:`whole_prefix`)."""

    windowed = True
    whole_stats = True

    def __init__(self, brightness=(0.875, 1.125), contrast=(0.5, 1.5), saturation=(0.5, 1.5), hue=(-0.05, 0.05),
                 p: float = 0.5):
        self.brightness = _range(brightness, "RandomPhotometricDistort brightness")
        self.contrast = _range(contrast, "RandomPhotometricDistort contrast")
        self.saturation = _range(saturation, "RandomPhotometricDistort saturation")
        self.hue = _range(hue, "RandomPhotometricDistort hue", center=0, bound=(-0.5, 0.5), clip_first=False)
        self.p = _prob(p, "RandomPhotometricDistort")

    def params(self, sizes, gen):
        B = len(sizes)
        p = {}
        for k, rng in enumerate((self.brightness, self.contrast, self.saturation, self.hue)):
            on = torch.rand(B, generator=gen, dtype=torch.float64) < self.p
            p[f"on{k}"] = on & (rng is not None)
            p[f"f{k}"] = C.uniform(gen, B, *rng) if rng else torch.zeros(B, dtype=torch.float64)
        p["contrast_before"] = torch.rand(B, generator=gen, dtype=torch.float64) < 0.5
        p["permute"] = torch.rand(B, generator=gen, dtype=torch.float64) < self.p
        p["perm"] = torch.argsort(torch.rand((B, 3), generator=gen), 1)
        return p

    def apply(self, x, p, sizes, bound, integer):
        def op(k, only=None):
            nonlocal x
            on = p[f"on{k}"] if only is None else p[f"on{k}"] & only
            fn = (C.brightness, C.contrast, C.saturation, C.hue)[k]
            x = _subset_apply(x, on, lambda v, r: fn(v, p[f"f{k}"][r], bound, integer))
        op(0)
        op(1, p["contrast_before"])
        op(2)
        op(3)
        op(1, ~p["contrast_before"])
        if x.shape[1] == 3:
            x = _subset_apply(x, p["permute"], lambda v, r: v.gather(
                1, p["perm"][r].to(v.device).view(-1, 3, 1, 1).expand_as(v)))
        return x

    def whole_prefix(self, x, p):
        """Contrast's mean is the whole image's at its point: with contrast drawn, the brightness runs on the
        whole sample (a lookup) and the mean is taken there (``p["mean"]``, which :meth:`apply_u8` then uses);
        contrast after a saturation or hue: None (those on the whole sample too)."""
        if not bool(p["on1"][0]):
            return p
        if not bool(p["contrast_before"][0]) and (bool(p["on2"][0]) or bool(p["on3"][0])):
            return None
        p = dict(p)
        if bool(p["on0"][0]):
            C.apply_lut(x, C.brightness(C.value_image(1), p["f0"], 255.0, True), [0])
            p["on0"] = torch.zeros_like(p["on0"])
        p["mean"] = contrast_mean_u8(x, [0]).view(-1)
        return p

    def apply_u8(self, x, p, sizes):
        """On uint8 (N, H, W, C), each op on just the samples that drew it (in place when all did): brightness
        and contrast as per-sample lookup tables (the float formula on the 256 values), saturation on a float
        copy of those samples, hue by the integer kernel, the channel permutation as a gather of bytes: the
        float stage's numbers (tests/test_recipes_uint8.py). ``p["mean"]`` (N,), when given: contrast's means
        (:meth:`whole_prefix`'s, of the whole images when ``x`` is a window of them)."""
        def op(k, only=None):
            on = p[f"on{k}"] if only is None else p[f"on{k}"] & only
            rows = on.nonzero().view(-1)
            if not len(rows):
                return
            f = p[f"f{k}"][rows]
            if k == 0:  # (lookups on just those samples, in place: no copy of them out and back)
                C.apply_lut(x, C.brightness(C.value_image(len(rows)), f, 255.0, True), rows.tolist())
                return
            if k == 1:  # (the mean sample by sample in cache, then the lookups in place)
                r = rows.tolist()
                mean = p["mean"][rows].view(-1, 1, 1, 1) if "mean" in p else contrast_mean_u8(x, r)
                C.apply_lut(x, C.blend(C.value_image(len(rows)), mean, f, 255.0, True), r)
                return
            every = len(rows) == len(x)
            sub = x if every else _take_rows(x, rows)
            sub = _to_u8((C.saturation if k == 2 else C.hue)(_to_float(sub), f, 255.0, True))
            if every:
                if sub is not x:
                    x.copy_(sub)
            else:
                _put_rows(x, rows, sub)

        op(0)
        op(1, p["contrast_before"])
        if x.shape[3] == 3:
            C.saturation_hue_u8(x, p["on2"], p["f2"], p["on3"], p["f3"])
        else:
            op(2)
            op(3)
        op(1, ~p["contrast_before"])
        if x.shape[3] == 3:
            for r in p["permute"].nonzero().view(-1).tolist():  # channel by channel (an indexed gather of the
                src = x[r].clone()  # last axis is ten times slower)
                for c, k in enumerate(p["perm"][r].tolist()):
                    x[r][..., c].copy_(src[..., k])
        return x


class RandomHSV(PixelOp):
    """Ultralytics' HSV jitter (``RandomHSV(hgain=0.015, sgain=0.7, vgain=0.4)``, the YOLO default): gains
    r = 1 + U(-1, 1) * gain per channel and sample; in OpenCV's 8-bit HSV (H 0-179, S and V 0-255) the
    lookup tables H' = (H r_h) mod 180, S' = clip(S r_s), V' = clip(V r_v) (truncated), then back to RGB."""

    windowed = True  # (per pixel)

    def __init__(self, hgain: float = 0.015, sgain: float = 0.7, vgain: float = 0.4):
        for n, g in (("hgain", hgain), ("sgain", sgain), ("vgain", vgain)):
            if not isinstance(g, (int, float)) or not 0 <= g <= 1:
                raise ConfigError(f"RandomHSV: {n} is a gain in [0, 1], got {g!r}")
        self.hgain, self.sgain, self.vgain = float(hgain), float(sgain), float(vgain)

    def params(self, sizes, gen):
        u = torch.rand((len(sizes), 3), generator=gen, dtype=torch.float64) * 2 - 1
        return {"r": u * torch.tensor([self.hgain, self.sgain, self.vgain], dtype=torch.float64) + 1}

    def apply(self, x, p, sizes, bound, integer):
        if x.shape[1] != 3:
            return x
        if integer and bound == 255.0:  # uint8 pixels: OpenCV's 8-bit HSV without the float round trip
            return C.hsv_jitter_integer(x, p["r"])
        hsv = C.rgb_to_hsv(x / bound)
        r = p["r"].to(x.device, x.dtype)
        h = torch.round(hsv[:, 0] * 180.0).remainder_(180.0)  # OpenCV: H in 0..179
        s = torch.round(hsv[:, 1] * 255.0)
        v = torch.round(hsv[:, 2] * 255.0)
        h = torch.remainder(h * r[:, 0].view(-1, 1, 1), 180.0).trunc_()
        s = (s * r[:, 1].view(-1, 1, 1)).clamp_(0, 255).trunc_()
        v = (v * r[:, 2].view(-1, 1, 1)).clamp_(0, 255).trunc_()
        rgb = C.hsv_to_rgb(torch.stack([h / 180.0, s / 255.0, v / 255.0], 1))
        return C.quantise(rgb.mul_(bound), integer, "round")

    def apply_u8(self, x, p, sizes):
        if x.shape[3] != 3:
            return x
        planes = x.permute(0, 3, 1, 2)  # in place: each piece's bytes read into int16 planes, then written
        C.hsv_jitter_integer(planes, p["r"], out=planes)
        return x


class RandomErasing(PixelOp):
    """torchvision ``RandomErasing(p=0.5, scale=(0.02, 0.33), ratio=(0.3, 3.3), value=0)``: with probability
    p, up to 10 tries of an area fraction ~ U(scale) and aspect ~ log-U(ratio), h = round(sqrt(area *
    aspect)), w = round(sqrt(area / aspect)), kept when h < H and w < W, placed uniformly; filled with
    ``value`` (a number, one per channel, or "random": standard normal noise). torchvision's recipe erases
    the normalised float image: put it after Normalize for that (0 is then the mean colour); before ToFloat
    it erases uint8 pixels with ``value`` in 0-255."""

    def __init__(self, p: float = 0.5, scale=(0.02, 0.33), ratio=(0.3, 3.3), value=0):
        self.p = _prob(p, "RandomErasing")
        self.scale, self.ratio = tuple(float(v) for v in scale), tuple(float(v) for v in ratio)
        if len(self.scale) != 2 or len(self.ratio) != 2 or not 0 <= self.scale[0] <= self.scale[1] <= 1 \
                or not 0 < self.ratio[0] <= self.ratio[1]:
            raise ConfigError(f"RandomErasing: scale is (low, high) in [0, 1], ratio (low, high) > 0; got "
                              f"{scale!r}, {ratio!r}")
        if not (value == "random" or isinstance(value, (int, float)) or
                (isinstance(value, (tuple, list)) and all(isinstance(v, (int, float)) for v in value))):
            raise ConfigError(f"RandomErasing: value is a number, one per channel, or 'random'; got {value!r}")
        self.value = tuple(value) if isinstance(value, list) else value

    def params(self, sizes, gen):
        B, tries = len(sizes), 10
        h, w = sizes[:, 0:1].double(), sizes[:, 1:2].double()
        u = torch.rand((B, tries, 4), generator=gen, dtype=torch.float64)
        area = h * w * (self.scale[0] + (self.scale[1] - self.scale[0]) * u[..., 0])
        lo, hi = math.log(self.ratio[0]), math.log(self.ratio[1])
        aspect = torch.exp(lo + (hi - lo) * u[..., 1])
        eh = torch.round(torch.sqrt(area * aspect))
        ew = torch.round(torch.sqrt(area / aspect))
        ok = (eh < h) & (ew < w)
        rows = torch.arange(B)
        pick = ok.double().argmax(1)
        eh, ew = eh[rows, pick], ew[rows, pick]
        top = torch.floor(u[rows, pick, 2] * (h[:, 0] - eh + 1))
        left = torch.floor(u[rows, pick, 3] * (w[:, 0] - ew + 1))
        on = (torch.rand(B, generator=gen, dtype=torch.float64) < self.p) & ok.any(1)
        p = {"on": on, "box": torch.stack([top, left, eh, ew], 1).long()}
        if self.value == "random":  # noise over the largest image, each sample's window read from it
            H, W = int(sizes[:, 0].max()) if B else 0, int(sizes[:, 1].max()) if B else 0
            p["noise"] = torch.randn((B, 4, H, W), generator=gen)  # up to 4 channels
        return p

    def apply(self, x, p, sizes, bound, integer):
        """Only the erased windows are written (a per-sample slice each): no pass over the batch."""
        Cn = x.shape[1]
        rows = p["on"].nonzero().view(-1).tolist()
        if self.value != "random":
            v = torch.as_tensor(self.value, dtype=x.dtype, device=x.device).view(-1, 1, 1)
            _erase_rows(x, rows, p["box"][rows].tolist(), v)
            return x
        for b in rows:
            t, l, eh, ew = p["box"][b].tolist()
            x[b, :, t:t + eh, l:l + ew] = p["noise"][b, :Cn, t:t + eh, l:l + ew].to(x.device, x.dtype)
        return x

    def apply_u8(self, x, p, sizes):
        """The windows written straight into the uint8 pixels (values clamped to 0..255, truncated)."""
        Cn = x.shape[3]
        if self.value != "random":
            v = torch.as_tensor(self.value, dtype=torch.float32).clamp(0, 255).to(torch.uint8).to(x.device)
        for b in p["on"].nonzero().view(-1).tolist():
            t, l, eh, ew = p["box"][b].tolist()
            x[b, t:t + eh, l:l + ew] = p["noise"][b, :Cn, t:t + eh, l:l + ew].permute(1, 2, 0).clamp(0, 255).to(
                x.device, torch.uint8) if self.value == "random" else v
        return x


@nogil
def _erase_rows(x: torch.Tensor, rows: List[int], boxes: List[List[int]], v: torch.Tensor) -> None:
    """RandomErasing's windows (top, left, h, w) of float (N, C, H, W) samples ``rows`` set to ``v`` (C or 1,
    1, 1), scripted: its torch calls never reach Python (each took the GIL)."""
    for i in range(len(rows)):
        t, l, eh, ew = boxes[i][0], boxes[i][1], boxes[i][2], boxes[i][3]
        x[rows[i], :, t:t + eh, l:l + ew] = v


# ------------------------------------------------------------------------------------------- auto-augment
def _bins_shear(hi):
    return lambda n, h, w: C.magnitude_bins(n, 0.0, hi)


def _bins_posterize(div):
    return lambda n, h, w: (8 - (torch.arange(n) / ((n - 1) / div)).round().int()).double()


def _bins_posterize_augmix(n, h, w):
    return (4 - (torch.arange(n) / ((n - 1) / 4)).round().int()).double()


_SOLARIZE = lambda n, h, w: C.magnitude_bins(n, 1.0, 0.0)  # noqa: E731 (x bound: a threshold)

_AA_SPACE = {  # AutoAugment and RandAugment (num_bins 10 and 31): name -> (bins(n, h, w) or None, signed)
    "Identity": (None, False),
    "ShearX": (_bins_shear(0.3), True), "ShearY": (_bins_shear(0.3), True),
    "TranslateX": (lambda n, h, w: C.magnitude_bins(n, 0.0, 150.0 / 331.0 * w), True),
    "TranslateY": (lambda n, h, w: C.magnitude_bins(n, 0.0, 150.0 / 331.0 * h), True),
    "Rotate": (_bins_shear(30.0), True),
    "Brightness": (_bins_shear(0.9), True), "Color": (_bins_shear(0.9), True),
    "Contrast": (_bins_shear(0.9), True), "Sharpness": (_bins_shear(0.9), True),
    "Posterize": (_bins_posterize(4), False), "Solarize": (_SOLARIZE, False),
    "AutoContrast": (None, False), "Equalize": (None, False), "Invert": (None, False),
}
_TA_SPACE = {  # TrivialAugmentWide (num_bins 31)
    "Identity": (None, False),
    "ShearX": (_bins_shear(0.99), True), "ShearY": (_bins_shear(0.99), True),
    "TranslateX": (_bins_shear(32.0), True), "TranslateY": (_bins_shear(32.0), True),
    "Rotate": (_bins_shear(135.0), True),
    "Brightness": (_bins_shear(0.99), True), "Color": (_bins_shear(0.99), True),
    "Contrast": (_bins_shear(0.99), True), "Sharpness": (_bins_shear(0.99), True),
    "Posterize": (_bins_posterize(6), False), "Solarize": (_SOLARIZE, False),
    "AutoContrast": (None, False), "Equalize": (None, False),
}
_AUGMIX_SPACE = {  # AugMix (10 bins; the last four with all_ops=True)
    "ShearX": (_bins_shear(0.3), True), "ShearY": (_bins_shear(0.3), True),
    "TranslateX": (lambda n, h, w: C.magnitude_bins(n, 0.0, w / 3.0), True),
    "TranslateY": (lambda n, h, w: C.magnitude_bins(n, 0.0, h / 3.0), True),
    "Rotate": (_bins_shear(30.0), True),
    "Posterize": (_bins_posterize_augmix, False), "Solarize": (_SOLARIZE, False),
    "AutoContrast": (None, False), "Equalize": (None, False),
    "Brightness": (_bins_shear(0.9), True), "Color": (_bins_shear(0.9), True),
    "Contrast": (_bins_shear(0.9), True), "Sharpness": (_bins_shear(0.9), True),
}
_RA_NAMES = ["Identity", "ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness", "Color",
             "Contrast", "Sharpness", "Posterize", "Solarize", "AutoContrast", "Equalize"]

IMAGENET_POLICY = (
    (("Posterize", 0.4, 8), ("Rotate", 0.6, 9)), (("Solarize", 0.6, 5), ("AutoContrast", 0.6, None)),
    (("Equalize", 0.8, None), ("Equalize", 0.6, None)), (("Posterize", 0.6, 7), ("Posterize", 0.6, 6)),
    (("Equalize", 0.4, None), ("Solarize", 0.2, 4)), (("Equalize", 0.4, None), ("Rotate", 0.8, 8)),
    (("Solarize", 0.6, 3), ("Equalize", 0.6, None)), (("Posterize", 0.8, 5), ("Equalize", 1.0, None)),
    (("Rotate", 0.2, 3), ("Solarize", 0.6, 8)), (("Equalize", 0.6, None), ("Posterize", 0.4, 6)),
    (("Rotate", 0.8, 8), ("Color", 0.4, 0)), (("Rotate", 0.4, 9), ("Equalize", 0.6, None)),
    (("Equalize", 0.0, None), ("Equalize", 0.8, None)), (("Invert", 0.6, None), ("Equalize", 1.0, None)),
    (("Color", 0.6, 4), ("Contrast", 1.0, 8)), (("Rotate", 0.8, 8), ("Color", 1.0, 2)),
    (("Color", 0.8, 8), ("Solarize", 0.8, 7)), (("Sharpness", 0.4, 7), ("Invert", 0.6, None)),
    (("ShearX", 0.6, 5), ("Equalize", 1.0, None)), (("Color", 0.4, 0), ("Equalize", 0.6, None)),
    (("Equalize", 0.4, None), ("Solarize", 0.2, 4)), (("Solarize", 0.6, 5), ("AutoContrast", 0.6, None)),
    (("Invert", 0.6, None), ("Equalize", 1.0, None)), (("Color", 0.6, 4), ("Contrast", 1.0, 8)),
    (("Equalize", 0.8, None), ("Equalize", 0.6, None)),
)  # torchvision's AutoAugmentPolicy.IMAGENET: 25 sub-policies of (op, probability, magnitude bin)


def _geometric_matrix(name: str, mag: torch.Tensor, H: int, W: int) -> torch.Tensor:
    """(N, 3, 3) output -> input maps of the auto-augment family's geometric ops on (H, W) images, at float64
    magnitudes ``mag`` (torchvision's ``affine`` arguments for each)."""
    N = len(mag)
    sizes = torch.tensor([[H, W]]).expand(N, 2)
    zero = torch.zeros(N, dtype=torch.float64)
    if name.startswith("Shear"):
        deg = torch.rad2deg(torch.atan(mag))
        shear = (deg, zero) if name == "ShearX" else (zero, deg)
        return C.affine_matrix(sizes, zero, (zero, zero), 1.0, shear, center=(0.0, 0.0))
    if name.startswith("Translate"):
        t = torch.trunc(mag)  # int(magnitude)
        return C.affine_matrix(sizes, zero, (t, zero) if name == "TranslateX" else (zero, t), 1.0, (zero, zero))
    return C.affine_matrix(sizes, -mag, (zero, zero), 1.0, (zero, zero))  # rotate(angle) is affine(-angle)


def _warp_u8(x: torch.Tensor, M: torch.Tensor, fill, mode: str, rows=None) -> torch.Tensor:
    """:func:`color.warp` on uint8 (N, H, W, C), in place, the same numbers, sample by sample (one sample's
    grid, float pixels and output stay in cache: about 3x faster than the batch's at once): its grid
    (written into one buffer, not stacked; made once for the samples that share a map: RandAugment's
    rotations of a batch are two, +-magnitude), ``grid_sample`` on a float copy in the sample's own
    channels-last layout (a copy without a transpose; a fill through a mask channel beside the pixels'),
    its output channels-last too, rounded, clamped and written back into ``x`` as the bytes lie (a cast of
    planes into interleaved pixels was a strided copy). ``rows``: the samples of ``x`` (``M`` one per row;
    None: all)."""
    _, H, W, Cn = x.shape
    rows = list(range(len(x))) if rows is None else [int(b) for b in rows]
    m = M.to(torch.float64)
    order, fresh = G.by_map(m)
    m = m.index_select(0, order)
    ax = (m[:, 0] * (2.0 / W)).to(torch.float32)
    ay = (m[:, 1] * (2.0 / H)).to(torch.float32)
    xs = (torch.arange(W, dtype=torch.float32) + 0.5).view(1, W)
    ys = (torch.arange(H, dtype=torch.float32) + 0.5).view(H, 1)
    grid = torch.empty((1, H, W, 2), dtype=torch.float32)
    k = Cn + (fill is not None)
    pixels = torch.empty((1, H, W, k), dtype=torch.float32)  # (grid_sample reads it as (1, k, H, W) planes)
    out = torch.empty_like(pixels)  # (grid_sample's output, reused sample after sample)
    fill_t = None
    if fill is not None:
        pixels[..., Cn] = 1.0
        fill_t = torch.as_tensor(fill, dtype=torch.float32).view(-1, 1, 1)
    _warp_rows(x, [rows[i] for i in order.tolist()], fresh, ax, ay, xs, ys, grid, pixels, out, fill_t,
               mode == "nearest")
    return x


@nogil
def _warp_rows(x: torch.Tensor, rows: List[int], fresh: List[bool], ax: torch.Tensor, ay: torch.Tensor,
               xs: torch.Tensor, ys: torch.Tensor, grid: torch.Tensor, pixels: torch.Tensor, out: torch.Tensor,
               fill_t: Optional[torch.Tensor], nearest: bool) -> None:
    """:func:`_warp_u8`'s loop (sample ``rows[i]`` through the maps ``ax[i]``, ``ay[i]``; a new grid where
    ``fresh[i]``), scripted: its dozen torch calls a sample never reach Python (each took the GIL)."""
    Cn = x.shape[3]
    planes = pixels.permute(0, 3, 1, 2)
    into = out.permute(0, 3, 1, 2)
    for i in range(len(rows)):
        b = rows[i]
        if fresh[i]:
            torch.add(ax[i, 0] * xs, ax[i, 1] * ys + (ax[i, 2] - 1.0), out=grid[0, :, :, 0])
            torch.add(ay[i, 0] * xs, ay[i, 1] * ys + (ay[i, 2] - 1.0), out=grid[0, :, :, 1])
        pixels[0, :, :, :Cn].copy_(x[b])
        if torch.jit.is_scripting():
            y = torch.grid_sampler_2d(planes, grid, 1 if nearest else 0, 0, False, out=into)[0]
        else:
            y = _grid_sample(planes, grid, "nearest" if nearest else "bilinear", into)[0]
        if fill_t is None:  # torchvision: no mask channel, zeros outside (a blend of 0..255 and 0: no clamp)
            y.round_()
        else:
            v, mask = y[:-1], y[-1:]
            if nearest:
                v = torch.where(mask < 0.5, fill_t.expand_as(v), v)
            else:
                v = (v - fill_t).mul_(mask).add_(fill_t)
            y = v.round_().clamp_(0, 255)
        G.write_u8(x[b], y.permute(1, 2, 0))  # (whole values in 0..255: the copy's truncation keeps them)


def _grid_sample(x: torch.Tensor, grid: torch.Tensor, mode: str, out: torch.Tensor) -> torch.Tensor:
    """``F.grid_sample(x, grid, mode, padding_mode="zeros", align_corners=False)`` written into ``out`` (aten's
    out= variant: no fresh output a sample), or F.grid_sample's where that variant is not there."""
    try:
        return torch.ops.aten.grid_sampler_2d.out(x, grid, 0 if mode == "bilinear" else 1, 0, False, out=out)
    except (AttributeError, RuntimeError):
        return F.grid_sample(x, grid, mode=mode, padding_mode="zeros", align_corners=False)


def apply_named(name: str, x: torch.Tensor, mag: torch.Tensor, bound: float, integer: bool,
                interpolation: str = "nearest", fill=None) -> torch.Tensor:
    """torchvision's ``_apply_image_or_video_transform``: one auto-augment op at per-sample magnitudes ``mag``."""
    N, _, H, W = x.shape
    mag = mag.double()
    if name == "Identity":
        return x
    if name in ("ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate"):
        M = _geometric_matrix(name, mag, H, W)
        if x.device.type == "cpu":  # without grid_sample where warp_gather can (the uint8 path's very numbers)
            if interpolation == "nearest":
                y = G.nearest_float(x, M, fill)
                return y.round_() if integer else y
            axis = G.shear_axis(M)
            if axis is not None:
                return G.shear_float(x, M, fill, axis, integer)
        return C.warp(x, M, fill, interpolation, integer)
    fns = {"Brightness": C.brightness, "Color": C.saturation, "Contrast": C.contrast, "Sharpness": C.sharpness}
    if name in fns:
        return fns[name](x, 1.0 + mag, bound, integer)
    if name == "Posterize":
        return C.posterize(x, mag.long(), bound, integer)
    if name == "Solarize":
        return C.solarize(x, bound * mag, bound, integer)
    if name == "AutoContrast":
        return C.autocontrast(x, bound, integer)
    if name == "Equalize":
        return C.equalize(x, bound, integer)
    if name == "Invert":
        return C.invert(x, bound, integer)
    raise ConfigError(f"unknown auto-augment op {name!r}")


_LUT_OPS = {"Brightness": lambda v, m: C.brightness(v, 1.0 + m, 255.0, True),
            "Solarize": lambda v, m: C.solarize(v, 255.0 * m, 255.0, True)}


def apply_named_u8(name: str, x: torch.Tensor, mag: torch.Tensor, interpolation: str = "nearest",
                   fill=None, rows: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`apply_named` on uint8 (N, H, W, C) pixels, the same numbers: whole-pixel translations as shifts,
    the ops that map each value alone as lookup tables (made by the float formulas), the rest on a float copy.
    May write into ``x``. ``rows``: only these samples of ``x`` (``mag`` one per row), written back into
    ``x``: a kernel whose ``in_rows(x, interpolation)`` says so (those that run sample by sample anyway:
    shears, bilinear rotate, one-table lookups, sharpness, colour, the histogram ops) works on the rows in
    place, the others on a copy of them."""
    mag = mag.double()
    kernel = _U8_KERNELS.get(name)
    if kernel is None:
        raise ConfigError(f"unknown auto-augment op {name!r}")
    if kernel is _identity_u8:  # (free on any device: no rows copied out and back, no float pass on a GPU)
        return x
    if x.device.type != "cpu":  # (the kernels are the CPU's; a device runs the float formula, in one place)
        if rows is None:
            return _float_u8(name, x, mag, interpolation, fill)
        _put_rows(x, rows, _float_u8(name, _take_rows(x, rows), mag, interpolation, fill))
        return x
    if kernel.in_rows(x, interpolation):  # (asked once: a kernel given a list of rows knows it said yes)
        return kernel(name, x, mag, interpolation, fill, list(range(len(x))) if rows is None else rows.tolist())
    if rows is None:
        return kernel(name, x, mag, interpolation, fill, None)
    _put_rows(x, rows, kernel(name, _take_rows(x, rows), mag, interpolation, fill, None))
    return x


_U8_KERNELS: dict = {}  # auto-augment op name -> its uint8 kernel (the one place that says what takes rows)


def _u8_kernel(*names: str, in_rows=None):
    """Register ``fn(name, x, mag, interpolation, fill, rows)`` as the CPU uint8 kernel of ``names``.
    ``in_rows(x, interpolation)``: whether it works on ``rows`` (a list) of ``x`` in place, the other samples
    untouched (None: never). :func:`apply_named_u8` asks it once: where it says yes the kernel is always given
    a list (every row when all samples drew the op), else always rows=None (the batch, or a copy of the
    samples that drew it), so a kernel tells which case it is in from ``rows`` alone."""
    def register(fn):
        fn.in_rows = in_rows or (lambda x, interpolation: False)
        for n in names:
            _U8_KERNELS[n] = fn
        return fn
    return register


def _always(x, interpolation) -> bool:
    return True


@_u8_kernel("Identity")
def _identity_u8(name, x, mag, interpolation, fill, rows):
    return x


@_u8_kernel("TranslateX", "TranslateY")
def _translate_u8(name, x, mag, interpolation, fill, rows):
    t = torch.trunc(mag).long().tolist()  # int(magnitude): whole pixels, so the bilinear/nearest warp is a shift
    zero = [0] * len(x)
    f = 0.0 if fill is None else fill
    f = torch.as_tensor(f, dtype=torch.float32).round().clamp(0, 255)
    return C.shift_u8(x, t if name == "TranslateX" else zero, zero if name == "TranslateX" else t, f)


@_u8_kernel("ShearX", "ShearY", "Rotate", in_rows=lambda x, interpolation: interpolation != "nearest")
def _geometric_u8(name, x, mag, interpolation, fill, rows):
    M = _geometric_matrix(name, mag, x.shape[1], x.shape[2])
    if rows is None:  # (nearest: the gather, on the samples that drew it)
        return G.nearest_u8(x, M, fill)
    axis = _SHEAR_AXES.get(name)
    if axis is None:  # (a rotation: a shear only where it is the identity)
        axis = G.shear_axis(M)
    return G.shear_u8(x, M, fill, axis, rows) if axis is not None else _warp_u8(x, M, fill, interpolation, rows)


_SHEAR_AXES = {"ShearX": 1, "ShearY": 0}  # (what shear_axis finds for every map _geometric_matrix makes of them)


@_u8_kernel(*_LUT_OPS, in_rows=_always)
def _lut_u8(name, x, mag, interpolation, fill, rows):
    return C.apply_lut(x, _LUT_OPS[name](C.value_image(len(rows), device=x.device), mag), rows)


@_u8_kernel("Contrast", in_rows=_always)
def _contrast_u8(name, x, mag, interpolation, fill, rows):
    mean = contrast_mean_u8(x, rows)
    return C.apply_lut(x, C.blend(C.value_image(len(rows), device=x.device), mean, 1.0 + mag, 255.0, True), rows)


def contrast_mean_u8(x: torch.Tensor, rows) -> torch.Tensor:
    """(len(rows), 1, 1, 1): :func:`color.contrast_mean` of samples ``rows`` of CPU uint8 (N, H, W, C), its very
    float32 operations (the grey's product, floor and mean of one sample as of a batch of one), sample by
    sample in this thread's scratch: a sample's float copy and grey stay in cache, where a float copy of all
    the samples (a batch's, 12 MB a 32 of 224 px) went through memory twice, then was freed."""
    _, H, W, Cn = x.shape
    xf = scratch("float", (1, H, W, Cn), torch.float32, x.device)
    grey = scratch("contrast:grey", (1, 1, H, W), torch.float32, x.device)
    out = torch.empty((len(rows), 1, 1, 1), dtype=torch.float32)
    weights = C._gray_weights()
    threads = torch.get_num_threads()  # one sample's mean is a single-output reduction, which torch splits
    torch.set_num_threads(1)  # across its threads past 32,768 values (another float32 summation order, the
    try:  # mean's last bits, now and then a lookup entry): summed on one thread, whatever the caller's count
        if Cn in (1, 3):
            _contrast_means(x, list(rows), xf, grey, out, weights)
        else:  # (2 or 4 channels: the mean of them all, as the float formula)
            for i, b in enumerate(rows):
                out[i:i + 1] = C.contrast_mean(_to_float(x[b:b + 1]), True)
    finally:
        torch.set_num_threads(threads)
    return out


@nogil
def _contrast_means(x: torch.Tensor, rows: List[int], xf: torch.Tensor, grey: torch.Tensor, out: torch.Tensor,
                    weights: torch.Tensor) -> None:
    """The loop of :func:`contrast_mean_u8` on 1 or 3 channels, scripted (its torch calls never reach Python)."""
    H, W, Cn = x.shape[1], x.shape[2], x.shape[3]
    for i in range(len(rows)):
        xf.copy_(x[rows[i]])
        if Cn == 3:  # (color.grayscale's product for channels-last float pixels)
            torch.matmul(xf, weights, out=grey.view(1, H, W))
        else:
            grey.copy_(xf.view(1, 1, H, W))
        torch.mean(grey.floor_(), dim=[1, 2, 3], keepdim=True, out=out[i:i + 1])


@_u8_kernel("Posterize")
def _posterize_u8(name, x, mag, interpolation, fill, rows):
    bits = mag.long().view(-1, 1, 1, 1)
    return x.bitwise_and_((((1 << bits) - 1) << (8 - bits)).to(torch.uint8).to(x.device))


@_u8_kernel("Invert")
def _invert_u8(name, x, mag, interpolation, fill, rows):
    return x.bitwise_not_()


def _pil_histograms(x, interpolation) -> bool:
    return x.shape[3] in _PIL_MODES and x.is_contiguous()


@_u8_kernel("Equalize", "AutoContrast", in_rows=_pil_histograms)
def _histogram_u8(name, x, mag, interpolation, fill, rows):
    if rows is not None:  # (its in_rows said yes: PIL's histograms and lookups)
        return _by_histograms(x, C.equalize_lut if name == "Equalize" else _autocontrast_tables, rows)
    if name == "Equalize":
        return C.apply_lut(x, C.equalize_lut(C.histograms_u8(x)))
    N = len(x)
    lo, hi = x.permute(0, 3, 1, 2).reshape(N * x.shape[3], -1).aminmax(dim=1)  # (channel planes: one pass)
    lo, hi = (v.to(torch.float32).view(N, -1, 1, 1) for v in (lo, hi))
    return C.apply_lut(x, C.stretch(C.value_image(N, x.shape[3], x.device), lo, hi, 255.0, True))


@_u8_kernel("Sharpness", "Color", in_rows=_always)
def _enhance_u8(name, x, mag, interpolation, fill, rows):
    """Sample by sample (each one's float copy stays in cache: 3x faster than the batch's), in buffers taken
    once for all the samples (this thread's scratch) and each sample's blend factors as float32 numbers made
    at once: a few torch calls a sample, each one's Python overhead time the GIL is held."""
    _, H, W, Cn = x.shape
    r = torch.as_tensor(1.0 + mag, dtype=torch.float32)  # (color._f's float32 factor, and its 1 - r in float32)
    factors, others = r.tolist(), (1.0 - r).tolist()
    if name == "Sharpness":
        if H <= 2 or W <= 2:
            return x
        bufs = (scratch("float", (H, W, Cn), torch.float32, x.device),
                scratch("sharpness:rows", (H, W - 2, Cn), torch.float32, x.device),
                scratch("sharpness:box", (H - 2, W - 2, Cn), torch.float32, x.device))
        _sharpness_rows(x, list(rows), others, *bufs)
        return x
    if Cn == 1:
        return x
    if Cn not in (3, 4):
        raise ConfigError(f"Color (saturation) takes grey, RGB or RGBA images, not {Cn} channels")
    bufs = (scratch("float", (H, W, Cn), torch.float32, x.device), scratch("saturation:grey", (H, W), torch.float32,
                                                                           x.device))
    _saturation_rows(x, list(rows), factors, others, *bufs, C._gray_weights(), list(C.GRAY))
    return x


def _float_u8(name, x, mag, interpolation, fill):
    """The float formula on a float copy (every op on a device: the uint8 kernels are the CPU's)."""
    return _to_u8(apply_named(name, _to_float(x), mag, 255.0, True, interpolation, fill))


@nogil
def _sharpness_rows(x: torch.Tensor, rows: List[int], others: List[float], xf: torch.Tensor, p: torch.Tensor,
                    box: torch.Tensor) -> None:
    """:func:`_sharpness_sample` on samples ``rows`` (``others[i]`` each), scripted: none of its dozen torch
    calls a sample reaches Python (each took the GIL)."""
    for i in range(len(rows)):
        _sharpness_sample(x[rows[i]], others[i], xf, p, box)


def _sharpness_sample(x: torch.Tensor, other: float, xf: torch.Tensor, p: torch.Tensor, box: torch.Tensor) -> None:
    """:func:`color.sharpness` on one uint8 (H, W, C) sample, in place, its very float32 operations on a float
    copy in the sample's own layout: the 3x3 sums of whole numbers (exact), their rounded 13th, the blend of
    the interior at ``other`` = 1 - factor (a float32 value); the border rows and columns kept. ``xf``, ``p``,
    ``box``: (H, W, C), (H, W - 2, C), (H - 2, W - 2, C) float32 buffers. (Vectorised float division, where
    an int16 floor division is a scalar loop.)"""
    xf.copy_(x)
    torch.add(xf[:, :-2], xf[:, 1:-1], out=p)
    p += xf[:, 2:]
    torch.add(p[:-2], p[1:-1], out=box)
    box += p[2:]
    view = xf[1:-1, 1:-1]
    deg = box.add_(view, alpha=4.0).div_(13.0).round_()
    view.add_(deg.sub_(view).mul_(other))
    G.write_u8(x[1:-1, 1:-1], view.clamp_(0, 255))


@nogil
def _saturation_rows(x: torch.Tensor, rows: List[int], factors: List[float], others: List[float], xf: torch.Tensor,
                     grey: torch.Tensor, weights: torch.Tensor, gray: List[float]) -> None:
    """:func:`color.saturation` on uint8 (H, W, C) samples ``rows`` of ``x``, in place, scripted: each sample
    copied into the float (H, W, C) buffer ``xf`` and blended there by :func:`color.saturation_hwc_of`'s very
    float32 operations (at ``factors[i]``, ``others[i]`` = 1 - factor), then written back."""
    for i in range(len(rows)):
        b = rows[i]
        xf.copy_(x[b])
        G.write_u8(x[b], C.saturation_hwc_of(xf, grey, factors[i], others[i], weights, gray))


_PIL_MODES = {1: "L", 3: "RGB"}


def _by_histograms(x: torch.Tensor, tables_of, rows=None) -> torch.Tensor:
    """CPU uint8 (N, H, W, 1 or 3), in place, through the tables ``tables_of(hist)`` makes from the (N, C, 256)
    value counts: each sample's PIL image made once, its histogram (one pass over the interleaved pixels,
    no channel planes copied out) and its lookups by PIL's C loops (``color.pil_lut``). Equalize and
    AutoContrast (its [min, max] are the first and last counted values). ``rows``: only those samples."""
    Cn = x.shape[3]
    rows = range(len(x)) if rows is None else rows
    a = x.numpy()
    ims = [C.pil_core(a[b]) for b in rows]  # (core images: no Image objects, a few C calls a sample)
    if None in ims:
        ims = [Image.fromarray(a[b] if Cn > 1 else a[b, :, :, 0], _PIL_MODES[Cn]) for b in rows]
    if not ims:
        return x
    # (each histogram's list of ints through numpy: torch.tensor of the nested lists took 0.09 ms an image
    # of its element-by-element store, holding the GIL)
    hist = torch.from_numpy(np.stack([np.array(im.histogram(), np.int64) for im in ims])).view(len(ims), Cn, 256)
    tables = tables_of(hist).to(torch.uint8).view(len(ims), Cn, 256).numpy()
    for i, (b, im) in enumerate(zip(rows, ims)):
        C.pil_lut(a[b], tables[i], im)
    return x


def _autocontrast_tables(hist: torch.Tensor) -> torch.Tensor:
    """(N, C, 256) autocontrast tables (the float formula on the 256 values) from (N, C, 256) value counts."""
    N, Cn, _ = hist.shape
    seen = hist > 0
    lo = seen.to(torch.uint8).argmax(-1).to(torch.float32).view(N, Cn, 1, 1)
    hi = (255 - seen.flip(-1).to(torch.uint8).argmax(-1)).to(torch.float32).view(N, Cn, 1, 1)
    return C.stretch(C.value_image(N, Cn), lo, hi, 255.0, True)


_STILL_BELOW = {"TranslateX": 1.0, "TranslateY": 1.0,  # |magnitude| under which an op leaves the image as it is
                **{n: 1e-300 for n in ("ShearX", "ShearY", "Rotate", "Brightness", "Color", "Contrast", "Sharpness")}}


_MAGNITUDE_TABLES: dict = {}  # (space, op names, bins, H, W) -> the auto-augment family's magnitude tables


class _AutoBase(PixelOp):
    """Per sample, slots of (op, on, magnitude); ``apply`` runs slot by slot, each op on the samples that
    drew it, together."""

    moves_pixels = True
    names: list[str] = []

    def _interp(self, interpolation):
        mode = str(getattr(interpolation, "value", interpolation)).lower()
        if mode not in ("nearest", "bilinear"):
            raise ConfigError(f"{type(self).__name__}: interpolation is 'nearest' or 'bilinear', got {interpolation!r}")
        return mode

    def _magnitudes(self, space, ops: torch.Tensor, bins: torch.Tensor, sizes, num_bins: int, gen) -> torch.Tensor:
        """(B, K) magnitudes: bin ``bins`` of each drawn op's magnitudes (0 for ops without), negated with
        probability 1/2 for signed ops."""
        B, K = ops.shape
        sign = torch.rand((B, K), generator=gen, dtype=torch.float64) <= 0.5
        if B and bool((sizes == sizes[0]).all()):  # (one size: every op's bins from one table, made once)
            table, signed = self._magnitude_table(space, num_bins, int(sizes[0, 0]), int(sizes[0, 1]))
            m = table[ops, bins.clamp(max=num_bins - 1)]
            return torch.where(sign & signed[ops], -m, m)
        mags = torch.zeros((B, K), dtype=torch.float64)
        h, w = sizes[:, 0].double(), sizes[:, 1].double()
        for i, name in enumerate(self.names):
            fn, signed = space[name]
            sel = ops == i
            if fn is None or not bool(sel.any()):
                continue
            table = fn(num_bins, h, w)  # (n,) or (B, n)
            table = table.view(1, -1).expand(B, -1) if table.dim() == 1 else table
            m = table.gather(1, bins.clamp(max=num_bins - 1))
            if signed:
                m = torch.where(sign, -m, m)
            mags = torch.where(sel, m, mags)
        return mags

    def _magnitude_table(self, space, num_bins: int, H: int, W: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(len(names), num_bins) float64: each op's magnitudes on (H, W) images (0 for ops without; the very
        numbers :meth:`_magnitudes`' loop takes from ``space``), and (len(names),) whether each is signed;
        made once per space, bins and size (a batch's draws then read it with two torch calls, where the
        loop over the op names made ~120 a batch, each a GIL handover)."""
        key = (id(space), tuple(self.names), num_bins, H, W)
        got = _MAGNITUDE_TABLES.get(key) if len(_MAGNITUDE_TABLES) < 256 else _MAGNITUDE_TABLES.clear()  # (bounded)
        if got is not None and got[2] is space:  # (the very space: an id a freed dict's may take again)
            return got[0], got[1]
        h, w = torch.tensor([H], dtype=torch.float64), torch.tensor([W], dtype=torch.float64)
        table = torch.zeros((len(self.names), num_bins), dtype=torch.float64)
        for i, name in enumerate(self.names):
            fn = space[name][0]
            if fn is not None:
                table[i] = fn(num_bins, h, w).reshape(-1)
        signed = torch.tensor([space[name][1] for name in self.names], dtype=torch.bool)
        _MAGNITUDE_TABLES[key] = (table, signed, space)  # (read only: callers index it, which copies)
        return table, signed

    def apply(self, x, p, sizes, bound, integer):
        if "ops" not in p:
            return x
        ops = torch.where(p["on"], p["ops"], -1)
        for k in range(ops.shape[1]):
            for i in sorted(set(ops[:, k].tolist()) - {-1}):  # only the ops these samples drew (few per chunk)
                name = self.names[i]
                if name == "Identity":
                    continue
                x = _subset_apply(x, ops[:, k] == i, lambda v, r, name=name: apply_named(
                    name, v, p["mag"][r, k], bound, integer, self.interpolation, self.fill))
        return x

    def apply_u8(self, x, p, sizes):
        """Slot by slot, each drawn op once on the uint8 samples that drew it (gathered, run, written back).
        An op whose magnitude leaves the image as it is (a shear, rotation or translation by 0, an enhance by
        a factor of 1: the float formula gives back the very pixels) is skipped."""
        if "ops" not in p:
            return x
        ops = torch.where(p["on"], p["ops"], -1)
        limit = torch.tensor([_STILL_BELOW.get(n, 0.0) for n in self.names] + [0.0], dtype=torch.float64)
        ops = torch.where(p["mag"].abs() < limit[ops], -1, ops)  # (ops -1 read the last limit: 0, never)
        mag = p["mag"].double()
        for k, col in enumerate(ops.t().tolist()):  # (the rows of each op as Python lists: a torch call
            for i in sorted(set(col) - {-1}):  # from Python is a GIL handover, a few each op these spared)
                name = self.names[i]
                if name == "Identity":
                    continue
                rows = [b for b, o in enumerate(col) if o == i]
                if len(rows) == len(col):
                    y = apply_named_u8(name, x, mag[:, k], self.interpolation, self.fill)
                    if y.data_ptr() != x.data_ptr() or y.stride() != x.stride():
                        x.copy_(y)  # (x stays the contiguous batch the next op gathers from)
                    continue
                apply_named_u8(name, x, mag[rows, k], self.interpolation, self.fill, rows=torch.tensor(rows))
        return x


class AutoAugment(_AutoBase):
    """torchvision ``AutoAugment(policy="imagenet")``: per sample one of the 25 ImageNet sub-policies,
    uniformly; each of its two ops runs with its probability at its magnitude bin (of 10), signed ops
    negated with probability 1/2. Geometric sub-ops: nearest, ``fill`` outside (None: 0)."""

    names = list(_AA_SPACE)

    def __init__(self, policy: str = "imagenet", interpolation: str = "nearest", fill=None):
        if str(getattr(policy, "value", policy)).lower() != "imagenet":
            raise ConfigError(f"AutoAugment: the policy dsc has is 'imagenet' (torchvision's default), got {policy!r}")
        self.policy, self.interpolation, self.fill = "imagenet", self._interp(interpolation), fill

    def params(self, sizes, gen):
        B = len(sizes)
        pid = torch.randint(len(IMAGENET_POLICY), (B,), generator=gen)
        u = torch.rand((B, 2), generator=gen, dtype=torch.float64)
        table_ops, table_bins, table_prob = self._policy_tables()
        ops, bins = table_ops[pid], table_bins[pid]  # (each sample's sub-policy read from the tables at once:
        on = u <= table_prob[pid]  # no per-sample Python, which held the GIL from the Loader's other thread)
        return {"ops": ops, "on": on, "mag": self._magnitudes(_AA_SPACE, ops, bins, sizes, 10, gen)}

    @classmethod
    def _policy_tables(cls):
        """(25, 2) op indices, magnitude bins and probabilities of :data:`IMAGENET_POLICY` (made once)."""
        tables = cls.__dict__.get("_tables")
        if tables is None:
            tables = (torch.tensor([[cls.names.index(name) for name, _, _ in q] for q in IMAGENET_POLICY]),
                      torch.tensor([[mi or 0 for _, _, mi in q] for q in IMAGENET_POLICY]),
                      torch.tensor([[prob for _, prob, _ in q] for q in IMAGENET_POLICY], dtype=torch.float64))
            cls._tables = tables
        return tables


class RandAugment(_AutoBase):
    """torchvision ``RandAugment(num_ops=2, magnitude=9, num_magnitude_bins=31)``: per sample ``num_ops`` ops
    drawn uniformly from its 14 (Identity, ShearX/Y, TranslateX/Y, Rotate, Brightness, Color, Contrast,
    Sharpness, Posterize, Solarize, AutoContrast, Equalize), each at bin ``magnitude``, signed ops negated
    with probability 1/2."""

    names = _RA_NAMES

    def __init__(self, num_ops: int = 2, magnitude: int = 9, num_magnitude_bins: int = 31,
                 interpolation: str = "nearest", fill=None):
        if not (isinstance(num_ops, int) and num_ops >= 0 and isinstance(num_magnitude_bins, int)
                and num_magnitude_bins >= 2 and isinstance(magnitude, int) and 0 <= magnitude < num_magnitude_bins):
            raise ConfigError(f"RandAugment: num_ops >= 0 and 0 <= magnitude < num_magnitude_bins, got {num_ops!r}, "
                              f"{magnitude!r}, {num_magnitude_bins!r}")
        self.num_ops, self.magnitude, self.num_magnitude_bins = num_ops, magnitude, num_magnitude_bins
        self.interpolation, self.fill = self._interp(interpolation), fill

    def params(self, sizes, gen):
        B = len(sizes)
        ops = torch.randint(len(self.names), (B, self.num_ops), generator=gen)
        bins = torch.full((B, self.num_ops), self.magnitude, dtype=torch.long)
        return {"ops": ops, "on": torch.ones_like(ops, dtype=torch.bool),
                "mag": self._magnitudes(_AA_SPACE, ops, bins, sizes, self.num_magnitude_bins, gen)}


class TrivialAugmentWide(_AutoBase):
    """torchvision ``TrivialAugmentWide(num_magnitude_bins=31)``: per sample one op drawn uniformly from its
    14 (wide ranges: shear 0.99, translate 32 px, rotate 135 degrees, enhance 0.99, posterize 2-8 bits) at a
    bin drawn uniformly, signed ops negated with probability 1/2."""

    names = list(_TA_SPACE)

    def __init__(self, num_magnitude_bins: int = 31, interpolation: str = "nearest", fill=None):
        if not isinstance(num_magnitude_bins, int) or num_magnitude_bins < 2:
            raise ConfigError(f"TrivialAugmentWide: num_magnitude_bins is an int >= 2, got {num_magnitude_bins!r}")
        self.num_magnitude_bins, self.interpolation, self.fill = num_magnitude_bins, self._interp(interpolation), fill

    def params(self, sizes, gen):
        B = len(sizes)
        ops = torch.randint(len(self.names), (B, 1), generator=gen)
        bins = torch.randint(self.num_magnitude_bins, (B, 1), generator=gen)
        return {"ops": ops, "on": torch.ones_like(ops, dtype=torch.bool),
                "mag": self._magnitudes(_TA_SPACE, ops, bins, sizes, self.num_magnitude_bins, gen)}


class AugMix(_AutoBase):
    """torchvision ``AugMix(severity=3, mixture_width=3, chain_depth=-1, alpha=1.0, all_ops=True)``: per sample,
    ``mixture_width`` chains of 1-3 ops (or ``chain_depth``) from its space at bins drawn below
    ``severity``; mixed with weights ~ Dirichlet(alpha, ..., alpha) and blended with the original at
    m ~ Dirichlet(alpha, alpha) (torchvision's ``_sample_dirichlet``, drawn here from the batch's
    generator); uint8 truncated at the end."""

    def __init__(self, severity: int = 3, mixture_width: int = 3, chain_depth: int = -1, alpha: float = 1.0,
                 all_ops: bool = True, interpolation: str = "bilinear", fill=None):
        if not (isinstance(severity, int) and 1 <= severity <= 10 and isinstance(mixture_width, int)
                and mixture_width >= 1 and isinstance(chain_depth, int) and alpha > 0):
            raise ConfigError(f"AugMix: severity in 1..10, mixture_width >= 1, alpha > 0; got {severity!r}, "
                              f"{mixture_width!r}, {alpha!r}")
        self.severity, self.mixture_width, self.chain_depth, self.alpha = severity, mixture_width, chain_depth, alpha
        self.all_ops, self.interpolation, self.fill = all_ops, self._interp(interpolation), fill
        self.names = list(_AUGMIX_SPACE)[:None if all_ops else 9]

    def params(self, sizes, gen):
        B, W = len(sizes), self.mixture_width
        K = self.chain_depth if self.chain_depth > 0 else 3
        m = C.dirichlet(gen, torch.full((B, 2), float(self.alpha), dtype=torch.float64))
        weights = C.dirichlet(gen, torch.full((B, W), float(self.alpha), dtype=torch.float64)) * m[:, 1:2]
        depth = torch.full((B, W), K) if self.chain_depth > 0 else torch.randint(1, 4, (B, W), generator=gen)
        ops = torch.randint(len(self.names), (B, W * K), generator=gen)
        bins = torch.randint(self.severity, (B, W * K), generator=gen)
        on = (torch.arange(K).repeat(W).view(1, -1) < depth.repeat_interleave(K, 1))
        return {"m0": m[:, 0], "w": weights, "ops": ops, "on": on,
                "mag": self._magnitudes(_AUGMIX_SPACE, ops, bins, sizes, 10, gen)}

    def apply(self, x, p, sizes, bound, integer):
        W = self.mixture_width
        K = p["ops"].shape[1] // W
        mix = x * p["m0"].to(x.device, x.dtype).view(-1, 1, 1, 1)
        for i in range(W):
            sl = slice(i * K, (i + 1) * K)
            aug = super().apply(x.clone(), {"ops": p["ops"][:, sl], "on": p["on"][:, sl], "mag": p["mag"][:, sl]},
                                sizes, bound, integer)
            mix.add_(aug * p["w"][:, i].to(x.device, x.dtype).view(-1, 1, 1, 1))
        return C.quantise(mix, integer)

    def apply_u8(self, x, p, sizes):
        """:data:`AUGMIX_SAMPLES` samples at a time (no batch-sized copies): the ``mixture_width`` chains of
        those samples as one uint8 batch of chain copies (chain i of sample j at row i n + j), run slot by
        slot, each drawn op once on every chain copy that drew it (one call per op and slot for all the
        chains, not one per chain); then their mix (the same float arithmetic as ``apply``), a sample or a
        few at a time (:data:`MIX_BYTES`), truncated to uint8 into ``x``."""
        W = self.mixture_width
        K = p["ops"].shape[1] // W
        m0 = p["m0"].to(x.device, torch.float32).view(-1, 1, 1, 1)
        w = p["w"].to(x.device, torch.float32)
        step = max(1, MIX_BYTES // max(1, x[0].numel() * 4))
        # the chain copies and the (n, H, W, C) float buffers are this thread's scratch, reused group after
        # group and batch after batch (no fresh pages: a fresh 14 MB of chain copies a group was about 100 page
        # faults an image, each freed one a TLB shootdown on the other filler thread's core); each product is
        # its own rounding, as in ``apply``; the copy into uint8 truncates what the clamp left
        n_max = min(AUGMIX_SAMPLES, len(x))
        acc = scratch("augmix:acc", (min(step, len(x)), *x.shape[1:]), torch.float32, x.device)
        tmp = scratch("augmix:tmp", acc.shape, torch.float32, x.device)
        copies = scratch("augmix:chains", (W * n_max, *x.shape[1:]), x.dtype, x.device)
        for g0 in range(0, len(x), AUGMIX_SAMPLES):
            rows = slice(g0, g0 + AUGMIX_SAMPLES)
            xg = x[rows]
            n = len(xg)
            chains = {k: torch.cat([p[k][rows, i * K:(i + 1) * K] for i in range(W)]) for k in ("ops", "on", "mag")}
            augs = copies[:W * n]
            for i in range(W):
                augs[i * n:(i + 1) * n].copy_(xg)
            augs = super(AugMix, self).apply_u8(augs, chains, sizes[rows].repeat(W, 1))
            _augmix_mix(xg, augs, m0[rows], w[rows], acc, tmp, step)
        return x


@nogil
def _augmix_mix(xg: torch.Tensor, augs: torch.Tensor, m0: torch.Tensor, w: torch.Tensor, acc: torch.Tensor,
                tmp: torch.Tensor, step: int) -> None:
    """AugMix's mix of the ``n`` uint8 samples ``xg`` (weights ``m0`` (n, 1, 1, 1)) and their chains ``augs``
    (chain i of sample j at row i n + j, weights ``w`` (n, W)), ``step`` samples at a time (in cache) in the
    float buffers ``acc`` and ``tmp``, truncated into ``xg``; scripted (its torch calls never reach Python).
    Each uint8 operand is cast into its float buffer, then multiplied there (a uint8 operand of torch.mul is
    first cast into a fresh float temporary, a malloc and a free each product)."""
    n = xg.shape[0]
    for c0 in range(0, n, step):
        k = min(step, n - c0)
        a, t = acc[:k], tmp[:k]
        a.copy_(xg[c0:c0 + k]).mul_(m0[c0:c0 + k])
        for i in range(w.shape[1]):
            a.add_(t.copy_(augs[i * n + c0:i * n + c0 + k]).mul_(w[c0:c0 + k, i].view(-1, 1, 1, 1)))
        G.write_u8(xg[c0:c0 + k], a.clamp_(0, 255))  # (truncated, as the cast to uint8)


AUGMIX_SAMPLES = 32  # AugMix's chains run on copies of this many samples at a time
MIX_BYTES = 1 << 19  # AugMix's mix: the float pixels of the samples summed at once (one 224 px sample: measured
# 0.49 ms an image, against 0.64 for three at a time, whose two 1.8 MB buffers left the 512 KB L2)

def scratch(name: str, shape, dtype: torch.dtype, device) -> torch.Tensor:
    """A CPU work buffer of ``shape``: this thread's buffer ``name`` of dsc's one per-thread pool
    (:func:`dsc.scratch.scratch_tensor`: kept and reused call after call, its pages faulted in once). Only for
    temporaries whose contents the caller overwrites and does not hand out. (Not CPU: a fresh tensor; the
    caching allocator reuses device memory.)"""
    if torch.device(device).type != "cpu":
        return torch.empty(shape, dtype=dtype, device=device)
    return scratch_tensor(name, shape, dtype)


# ------------------------------------------------------------------------------------------------ the stage
def _pixel_views(batch: dict):
    """(per-sample (H, W, C) views or None, the fixed (B, H, W, C) / float (B, C, H, W) tensor or None)."""
    img = batch["image"]
    if "image_offsets" in batch:
        o, shapes = batch["image_offsets"].tolist(), batch["image_shapes"].tolist()
        return [img[o[b]:o[b + 1]].view(*s) for b, s in enumerate(shapes)], None
    if "image_sizes" in batch:
        return [img[b, :h, :w] for b, (h, w) in enumerate(batch["image_sizes"].tolist())], None
    return None, img


def _window_ok(ops: list[PixelOp]) -> bool:
    """Whether a run of ops can work on just a window of each sample (:meth:`PixelOp.whole_prefix`)."""
    return all(op.windowed for op in ops) and not any(op.whole_stats for op in ops[1:])


def _run_window(ops: list[PixelOp], params: list[dict], v: torch.Tensor, window) -> bool:
    """The ops on just rows t0:t1, columns l0:l1 (``window``) of CPU uint8 sample ``v`` (H, W, C), in place;
    False (nothing written): run the whole sample."""
    t0, t1, l0, l1 = window
    H, W = v.shape[:2]
    if (t0, t1, l0, l1) == (0, H, 0, W):
        return False
    if t1 <= t0 or l1 <= l0:  # (nothing of it is read)
        return True
    first = ops[0].whole_prefix(v.unsqueeze(0), params[0])
    if first is None:
        return False
    part = v[t0:t1, l0:l1]
    x = part if part.is_contiguous() else scratch("photometric:window", part.shape, v.dtype, v.device).copy_(part)
    x, size = x.unsqueeze(0), torch.tensor([[t1 - t0, l1 - l0]])
    for op, p in zip(ops, [first] + params[1:]):
        x = op.apply_u8(x, p, size)
    if x.data_ptr() != part.data_ptr() or not x.is_contiguous():
        part.copy_(x[0])
    return True


def apply_pixel_ops(ops: list[PixelOp], batch: dict, gen: torch.Generator, post=None, inplace: bool = False,
                    alloc=None, lookahead=None) -> dict:
    """A run of photometric ops over the batch: every op's per-sample draws first (in op order), then the
    ops on float pixels, converted once; uint8 written back (ragged: sample by sample, in place). ``post``:
    the ToFloat/Normalize pass that follows (a fixed-size uint8 batch goes straight into it, in float: its
    values are whole numbers already, so the result is the same as through uint8). ``inplace``: the image
    is this pipeline's own (a ring slot, an earlier stage's output) and may be written into; ``alloc``: the
    Loader's ring-slot allocator, for the float output (memory reused batch after batch). ``lookahead(sizes)``
    (Compose's, a geometric stage next): called once the params are drawn, it draws the next stage's and
    gives each sample's source window (t0, t1, l0, l1) that stage reads, or None (all of it): samples of
    several sizes on the CPU are then processed only there, when the ops allow it (:func:`_window_ok`)."""
    views, img = _pixel_views(batch)
    if views is not None and not inplace:  # ragged / padded: written sample by sample, so on a copy of the caller's
        batch["image"] = batch["image"].clone()
        views, img = _pixel_views(batch)
    if any(op.moves_pixels for op in ops):
        moved = [k for k in batch if k in ("boxes", "mask") or k.endswith("_mask")]
        schema = getattr(batch, "schema", None)
        if schema is not None:
            moved = [k for k, r in schema.items() if r.kind in ("boxes",) or (r.kind == "pixels" and k != "image")]
            moved = [k for k in moved if k in batch]
        if moved:
            raise ConfigError(f"the auto-augment ops move the image alone (classification); this batch has "
                              f"{', '.join(map(repr, moved))}: use RandomAffine and the photometric ops for those")
    if views is not None:
        sizes = torch.tensor([list(v.shape[:2]) for v in views], dtype=torch.long).view(-1, 2)
    elif img.is_floating_point():
        if img.dim() != 4:
            raise ConfigError("photometric ops take a (B, C, H, W) float image or dsc's uint8 (B, H, W, C)")
        sizes = torch.tensor([list(img.shape[2:])], dtype=torch.long).expand(img.shape[0], 2)
    else:
        if img.dim() != 4:
            raise ConfigError("photometric ops take dsc's uint8 (B, H, W, C) image (a batch, not a sample)")
        sizes = torch.tensor([list(img.shape[1:3])], dtype=torch.long).expand(img.shape[0], 2)
    params = [op.params(sizes, gen) for op in ops]
    windows = lookahead(sizes) if lookahead is not None else None  # (made only for ops _window_ok takes)

    def run(x, rows, integer, bound):
        for op, p in zip(ops, params):
            x = op.apply(x, _take(p, rows) if rows is not None else p, sizes if rows is None else sizes[rows],
                         bound, integer)
        return x

    if views is not None:
        for b, v in enumerate(views):
            if v.is_floating_point():
                raise ConfigError("photometric ops on images of several sizes take them as stored (uint8)")
            if v.device.type == "cpu" and v.is_contiguous():  # uint8 between ops, as the fixed-size CPU stage
                x, row = v.unsqueeze(0), torch.tensor([b])
                taken = [_take(p, row) for p in params]
                if windows is not None and windows[b] is not None and _run_window(ops, taken, v, windows[b]):
                    continue
                for op, p in zip(ops, taken):
                    x = op.apply_u8(x, p, sizes[row])
                if x.data_ptr() != v.data_ptr() or not x.is_contiguous():
                    v.copy_(x[0])
                continue
            x = v.permute(2, 0, 1).unsqueeze(0).to(torch.float32)
            y = run(x, torch.tensor([b]), True, 255.0)
            v.copy_(y[0].permute(1, 2, 0).clamp_(0, 255).to(v.dtype))
        return batch
    if img.is_floating_point():
        x = img.to(torch.float32) if img.dtype != torch.float32 else img if inplace else img.clone()
        batch["image"] = run(x, None, False, 1.0).to(img.dtype)
        return batch
    if img.dtype != torch.uint8:
        raise ConfigError(f"photometric ops take uint8 or float images, got {img.dtype}")
    B, H, W, Cn = img.shape
    if img.device.type == "cpu":
        # On the CPU the batch stays uint8 between ops: each op runs once on the samples that drew it (a lookup
        # table, a shift, or a float copy of just those samples), then one pass to float when ``post`` follows.
        x = img if inplace else img.clone()
        for op, p in zip(ops, params):
            x = op.apply_u8(x, p, sizes)
        if post is None:
            batch["image"] = x.contiguous()
            return batch
        out = post.empty(B, H, W, Cn, alloc=(lambda name, shape, dtype: alloc(f"{name}:float", shape, dtype))
                         if alloc is not None else None)
        post.apply_samples(x, out)  # (sample by sample: each stays in cache through the conversion)
        batch["image"] = out
        return batch
    # On a GPU (the CPU returned above) the whole batch at once, in float.
    out = post.empty(B, H, W, Cn) if post is not None else img
    if post is not None and out.device != img.device:
        out = out.to(img.device)
    y = run(img.permute(0, 3, 1, 2).to(torch.float32), None, True, 255.0).clamp_(0, 255)
    if post is not None:
        post.apply_float(y, out=out)
    else:
        out[:] = y.to(torch.uint8).permute(0, 2, 3, 1)
    batch["image"] = out
    return batch
