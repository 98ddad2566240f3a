"""Batched functional pixel ops, each written from torchvision.transforms.v2.functional's formula, with a
per-sample factor.

Every function takes ``x``: float32 (N, C, H, W) holding pixel values in ``0..bound`` (255 for an image
stored as uint8, 1 for a float image) and returns the same. ``integer``: the image is uint8 underneath, so
the op quantises as torchvision's does on uint8 tensors (``_blend`` and the grey of contrast/saturation
truncate, blur and resampling round, hue's ``to_dtype`` scales by 255.999 and truncates). Per-sample
factors are (N,) tensors (or broadcastable).

Also here: the draws torchvision makes with ``torch.distributions`` (Beta, Dirichlet), from a
``torch.Generator`` (Marsaglia-Tsang gamma), so they come from the batch's (seed, epoch, rank, batch)
stream too.
"""
from __future__ import annotations

import math
from typing import List

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from ..nogil import nogil
from ..scratch import scratch_tensor

GRAY = (0.2989, 0.587, 0.114)  # torchvision's rgb_to_grayscale weights


def _f(v, x: torch.Tensor) -> torch.Tensor:
    """A per-sample factor as (N, 1, 1, 1) on ``x``'s device."""
    t = torch.as_tensor(v, dtype=x.dtype)
    return t.to(x.device).view(-1, 1, 1, 1) if t.dim() else t.to(x.device)


def quantise(x: torch.Tensor, integer: bool, rounding: str = "trunc") -> torch.Tensor:
    """What torchvision's cast back to uint8 does: ``.to(uint8)`` truncates; some ops round first."""
    if not integer:
        return x
    # (every caller's values are >= 0 by then, where floor is trunc: several times faster on the CPU)
    return x.round_() if rounding == "round" else x.floor_()


def blend(a: torch.Tensor, b: torch.Tensor, ratio, bound: float, integer: bool) -> torch.Tensor:
    """torchvision's ``_blend``: ratio * a + (1 - ratio) * b, clamped to [0, bound] (uint8: truncated)."""
    r = _f(ratio, a)
    return quantise((a * r).add_(b * (1.0 - r)).clamp_(0, bound), integer)


def grayscale(x: torch.Tensor) -> torch.Tensor:
    """(N, 1, H, W): 0.2989 R + 0.587 G + 0.114 B (``rgb_to_grayscale``, float, unrounded); 1 channel: itself."""
    if x.shape[1] == 1:
        return x.clone()
    if x.shape[1] == 3 and x.stride(1) == 1 and x.is_floating_point():  # channels-last memory (the photometric
        # stage's float copy of uint8 pixels): one pass over the interleaved pixels, a 3-vector product each
        return torch.matmul(x.permute(0, 2, 3, 1), torch.tensor(GRAY, dtype=x.dtype, device=x.device)).unsqueeze(1)
    r, g, b = x[:, 0:1], x[:, 1:2], x[:, 2:3]
    return r * GRAY[0] + g * GRAY[1] + b * GRAY[2]


def to_grayscale(x: torch.Tensor, integer: bool) -> torch.Tensor:
    """``rgb_to_grayscale`` with as many output channels as input ones (RandomGrayscale), truncated on uint8."""
    return quantise(grayscale(x), integer).expand_as(x).contiguous()


def brightness(x, factor, bound, integer):
    """``adjust_brightness``: blend with black."""
    return blend(x, torch.zeros((), dtype=x.dtype, device=x.device), factor, bound, integer)


def contrast_mean(x: torch.Tensor, integer: bool) -> torch.Tensor:
    """(N, 1, 1, 1): the mean of the (uint8: floored) grey image, what ``adjust_contrast`` blends with."""
    g = grayscale(x) if x.shape[1] == 3 else x.clone()
    if integer:
        g.floor_()
    return g.mean(dim=(1, 2, 3), keepdim=True)


def contrast(x, factor, bound, integer):
    """``adjust_contrast``: blend with the mean of the (uint8: floored) grey image."""
    return blend(x, contrast_mean(x, integer), factor, bound, integer)


def saturation(x, factor, bound, integer):
    """``adjust_saturation``: blend with the (uint8: floored) grey image."""
    if x.shape[1] == 1:
        return x
    return blend(x, grayscale(x).floor_() if integer else grayscale(x), factor, bound, integer)


def rgb_to_hsv(x: torch.Tensor) -> torch.Tensor:
    """torchvision's ``_rgb_to_hsv`` on [0, 1] RGB (N, 3, H, W): h from the channel holding the maximum (red
    first, then green), s = (max - min) / max, v = max (a grey pixel: h = s = 0)."""
    r, g, b = x[:, 0], x[:, 1], x[:, 2]
    maxc, minc = torch.maximum(torch.maximum(r, g), b), torch.minimum(torch.minimum(r, g), b)
    cr = maxc - minc
    eqc = cr == 0
    s = cr / torch.where(eqc, torch.ones_like(maxc), maxc)
    crd = torch.where(eqc, torch.ones_like(cr), cr)
    h = torch.where(maxc == r, (g - b) / crd, torch.where(maxc == g, (b - r) / crd + 2.0, (r - g) / crd + 4.0))
    h = torch.fmod(h.div_(6.0).add_(1.0), 1.0)
    return torch.stack((h, s, maxc), 1)


def hsv_to_rgb(x: torch.Tensor) -> torch.Tensor:
    """HSV in [0, 1] (N, 3, H, W) -> RGB: torchvision's ``_hsv_to_rgb`` (sector i = floor(6h), f = 6h - i,
    p = v(1 - s), q = v(1 - sf), t = v(1 - s(1 - f))) written without its gather: channel n is
    v - v s clamp(min(k, 4 - k), 0, 1) with k = (n + 6h) mod 6 for n = 5, 3, 1 (the same values)."""
    h, s, v = x[:, 0:1], x[:, 1:2], x[:, 2:3]
    n = torch.tensor([5.0, 3.0, 1.0], dtype=x.dtype, device=x.device).view(1, 3, 1, 1)
    k = torch.remainder(h * 6 + n, 6.0)
    return v - v * s * torch.minimum(k, 4.0 - k).clamp_(0, 1)


def hue(x, factor, bound, integer):
    """``adjust_hue``: to [0, 1], the HSV round trip with h + factor (mod 1), back (uint8: x 255.999, truncated;
    an image stored as uint8 goes through :func:`hue_integer`, the same within a grey level)."""
    if x.shape[1] == 1:
        return x
    if integer and bound == 255.0 and x.shape[1] == 3:
        return hue_integer(x, factor)
    hsv = rgb_to_hsv(x / bound)
    hsv[:, 0] = torch.remainder(hsv[:, 0] + _f(factor, x)[:, 0], 1.0)
    rgb = hsv_to_rgb(hsv)
    return rgb.mul_(255.0 + 1.0 - 1e-3).floor_() if integer else rgb.mul_(bound)


def hexagon(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Whole RGB values 0..255 (N, 3, H, W) -> int16 (N, H, W) planes (max, min, c = max - min, X): X = 6 h c,
    the pixel's place on the hue hexagon in grey levels, exact (g - b, b - r + 2c or r - g + 4c by the
    channel holding the max, red first, then green, as torchvision's ``_rgb_to_hsv``; in [0, 6c)), chosen
    by sign masks (a select by a random mask is slower than ten additions)."""
    N, _, H, W = x.shape
    xi = torch.empty((N, 3, H, W), dtype=torch.int16, device=x.device)
    xi.copy_(x)
    r, g, b = xi[:, 0], xi[:, 1], xi[:, 2]
    mx = torch.maximum(torch.maximum(r, g), b)
    mn = torch.minimum(torch.minimum(r, g), b)
    c = mx - mn
    not_r = (r - mx).bitwise_right_shift_(15)  # -1 where red is not the max, else 0
    not_g = (g - mx).bitwise_right_shift_(15)
    hr = g - b
    hg = (b - r).add_(c, alpha=2)
    h = (r - g).add_(c, alpha=4)
    h.sub_(hg).bitwise_and_(not_g).add_(hg)  # blue's, or green's where green is the max
    h.sub_(hr).bitwise_and_(not_r).add_(hr)  # red's where red is the max: X in [-c, 6c)
    h.add_((c * 6).bitwise_and_(h >> 15))  # X in [0, 6c)
    return mx, mn, c, h


def hsv_jitter_integer(x: torch.Tensor, gains: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Ultralytics' HSV jitter (``RandomHSV``) on whole values 0..255 ((N, 3, H, W), float or uint8; float out),
    ``gains`` (N, 3):
    OpenCV's 8-bit HSV, H = round(30 X / c) mod 180 (X from :func:`hexagon`), S = round(255 c / max),
    V = max; H' = (H r_h) mod 180, S' = clip(S r_s), V' = clip(V r_v), truncated (the lookup tables); back:
    channel k = V' - c' + c' F_k(H' / 30), c' = V' S' / 255 (F: the hexagon's ramps, as in
    :func:`hue_integer`), rounded. Float arithmetic on planes, without the float HSV round trip's selects,
    remainders and truncations: within a grey level of OpenCV's formula in exact arithmetic (the float round
    trip is several levels off where a rounding ties). ``out``: as :func:`_by_pieces`' (``out=x``: in place).
    The loop over samples and pieces is :func:`_hsv_jitter_pieces`, scripted on the CPU: its ~60 ops a piece
    never reach Python, so a Loader's filler thread runs it without the GIL."""
    gains = torch.as_tensor(gains, dtype=torch.float64).reshape(-1, 3)
    N, _, H, W = x.shape
    if out is None:
        out = torch.empty((N, 3, H, W), dtype=x.dtype if x.is_floating_point() else torch.float32, device=x.device)
    _hsv_jitter_pieces(x, gains.to(torch.float32), out, max(1, PIECE_PIXELS // max(W, 1)))
    return out


@nogil(cpu_only=True)
def _hsv_jitter_pieces(x: torch.Tensor, gains: torch.Tensor, out: torch.Tensor, rows: int) -> None:
    """:func:`_by_pieces`' loop of :func:`_hsv_jitter_piece`, ``gains`` (N, 3) float32: on the CPU sample by
    sample, ``rows`` rows at a time (a piece's planes stay in cache; each piece as :func:`_piece` makes it), on a
    device the batch in one call; the same ops, so the same bytes. Scripted on the CPU only (``nogil``'s
    ``cpu_only``: a device runs the one call as plain Python)."""
    if x.device.type != "cpu":
        _hsv_jitter_piece(x, gains, out)
        return
    for n in range(x.shape[0]):
        for r0 in range(0, x.shape[2], rows):
            _hsv_jitter_piece(_piece(x[n, :, r0:r0 + rows]), gains[n:n + 1], _piece(out[n, :, r0:r0 + rows]))


def _hsv_jitter_piece(x: torch.Tensor, gains: torch.Tensor, out: torch.Tensor) -> None:
    mx, mn, c, X = hexagon(x)
    g = gains.to(x.device, torch.float32)
    rh = g[:, 0].view(-1, 1, 1)
    rs = g[:, 1].view(-1, 1, 1)
    rv = g[:, 2].view(-1, 1, 1)
    cf = c.to(torch.float32)
    mxf = mx.to(torch.float32)
    # (each "mod 180" on whole numbers >= 0: f - 180 floor(f / 180), four passes of plain arithmetic, exact
    # below 2^24; torch's remainder, one pass, takes as long as ten of them, and compares and selects are slower)
    hue = _mod180(X.to(torch.float32).mul_(30.0).div_(cf.clamp(min=1.0)).round_())  # (180 is 0)
    hue = _mod180(hue.mul_(rh).clamp_(min=0.0).floor_())  # truncated, mod 180: 0..179
    sat = cf.mul(255.0).div_(mxf.clamp(min=1.0)).round_().mul_(rs).clamp_(0.0, 255.0).floor_()
    val = mxf.mul(rv).clamp_(0.0, 255.0).floor_()
    cp = sat.mul_(val).div_(255.0)  # c' = V' S' / 255
    y = hue.div_(30.0)  # sector units, [0, 6)
    base = val.sub_(cp)  # V' - c'
    for k, (centre, rising) in enumerate([(3.0, False), (2.0, True), (4.0, True)]):
        v = (y - centre).abs_()
        v = v.neg_().add_(2.0) if rising else v.sub_(1.0)
        # (in [V' - c', V'], within 0..255 already: no clamp; a -0.0 casts to 0)
        out[:, k] = torch.addcmul(base, v.clamp_(0.0, 1.0), cp).round_()


def _mod180(f: torch.Tensor) -> torch.Tensor:
    """``f`` mod 180, in place, for float whole numbers >= 0 (below 2^24: every step exact; the same numbers as
    ``remainder_(180.0)``, truncated or not, since floor(a mod 180) = floor(a) mod 180)."""
    return f.sub_(torch.div(f, 180.0).floor_().mul_(180.0))


def hue_integer(x: torch.Tensor, factor) -> torch.Tensor:
    """:func:`hue` on whole values 0..255 (float (N, 3, H, W)) in int16 arithmetic, within one grey level of
    the float round trip (tests/test_recipes_detection.py; about 1% of pixels are one level off), several times
    faster:
    no float HSV planes, no ``where`` (a select by a random mask is slower than ten additions), selections by
    sign masks. The hue round trip keeps each pixel's max and min and moves it on the hue hexagon: with
    c = max - min and X = 6 h c (in grey levels, exact: g - b, b - r + 2c or r - g + 4c by the channel holding
    the max), X' = (X + 6 c (factor mod 1)) mod 6c, and channel k = min + clamp(.., 0, c) of X' (red:
    |X' - 3c| - c, green: 2c - |X' - 2c|, blue: 2c - |X' - 4c|), x 255.999 / 255, truncated. X' is kept
    in 1/16 grey levels (6c x 16 < 2^15); 6 c factor x 16 is an exact int16 product of c with the two
    7-bit halves of the factor."""
    return _by_pieces(_hue_piece, x, torch.as_tensor(factor, dtype=torch.float64).reshape(-1).expand(len(x)))


def _hue_piece(x: torch.Tensor, factor, out: torch.Tensor) -> None:
    dh, dl = _hue_steps(torch.as_tensor(factor, dtype=torch.float64).reshape(-1).expand(len(x)), x.device)
    _hue_shift(x, dh, dl, out)


def _hue_shift(x: torch.Tensor, dh: torch.Tensor, dl: torch.Tensor, out: torch.Tensor) -> None:
    """:func:`_hue_piece` at the shift ``dh``, ``dl`` (int16 (N, 1, 1), on ``x``'s device; scriptable)."""
    mx, mn, c, h = hexagon(x)
    c16 = c * 16
    c96 = c16 * 6
    t = (c * dh).add_((c * dl).add_(64).bitwise_right_shift_(7))  # round(16 * 6c * factor), in [0, c96]
    c96.sub_(t)
    h.mul_(16).sub_(c96)  # 16 X + t - c96, in (-c96, c96): no int16 overflow
    h.add_(c96.add_(t).bitwise_and_(h >> 15))  # X' = that, or that + c96 where negative
    mn.mul_(16)
    for k, (centre, rising) in enumerate([(3, False), (2, True), (4, True)]):
        v = (h - c16 * centre).abs_()
        v = (c16 * 2).sub_(v) if rising else v.sub_(c16)
        torch.minimum(v.clamp_(min=0), c16, out=v)  # clamp(v, 0, c) (two vector ops, no mask)
        v.add_(mn)
        v.add_(v >> 8).bitwise_right_shift_(4)  # x 255.999 / 255 (1 + 1/256), truncated to whole levels
        out[:, k] = v


PIECE_PIXELS = 1 << 17  # a CPU kernel's pixels at once: its dozen int16 / float planes stay in cache


def _piece(v: torch.Tensor) -> torch.Tensor:
    """(1, *v.shape): ``v`` (a slice of rows of one sample) with a dense stride of its own in front (a slice
    ``x[n:n + 1]`` keeps the whole sample's stride there, which a float copy keeps too: torch.matmul (the grey)
    then takes a path about 4x slower)."""
    return v.as_strided([1] + list(v.size()), [v.numel()] + list(v.stride()), v.storage_offset())


def _by_pieces(kernel, x: torch.Tensor, per_sample: torch.Tensor, out: torch.Tensor | None = None,
               samples=None) -> torch.Tensor:
    """``kernel(piece, its samples' parameters, out piece)`` over (N, 3, H, W) ``x`` into ``out``: by default a
    new float tensor; ``out=x`` runs in place (uint8 kernels that read their piece whole before writing it).
    ``samples``: only those (a list of indices; default all). On the CPU sample by sample, in pieces of rows
    of about :data:`PIECE_PIXELS` (a whole batch's planes would not stay in cache between the kernel's
    passes: about twice slower); on a GPU in one call (on the samples' rows, written back)."""
    N, _, H, W = x.shape
    if out is None:
        out = torch.empty((N, 3, H, W), dtype=x.dtype if x.is_floating_point() else torch.float32, device=x.device)
    if x.device.type != "cpu":
        if samples is None:
            kernel(x, per_sample, out)
        elif len(samples):
            rows = torch.as_tensor(samples, dtype=torch.long)
            sub = out[rows.to(out.device)]
            kernel(x[rows.to(x.device)], per_sample[rows], sub)
            out[rows.to(out.device)] = sub
        return out
    rows = max(1, PIECE_PIXELS // max(W, 1))
    for n in range(N) if samples is None else samples:
        for r0 in range(0, H, rows):
            kernel(_piece(x[n, :, r0:r0 + rows]), per_sample[n:n + 1], _piece(out[n, :, r0:r0 + rows]))
    return out


def _saturation_hue_piece(x: torch.Tensor, p: torch.Tensor, out: torch.Tensor) -> None:
    """RandomPhotometricDistort's saturation then hue on whole values 0..255 ((n, 3, h, w), uint8 or float) into
    ``out`` (may be ``x``): ``p`` (n, 4) float64, per sample (saturation on, its factor, hue on, its factor).
    Saturation on a float copy (its grey, its blend); the hue by :func:`_hue_piece`'s integer kernel, which
    reads the pixels into int16 before it writes any (a hue alone never goes through float)."""
    sat, hue_on = p[:, 0] > 0, p[:, 2] > 0
    y = x
    if bool(sat.any()):
        y = x.to(torch.float32)
        rows = sat.nonzero().view(-1)
        every = len(rows) == len(x)
        d = rows.to(x.device)
        new = saturation(y if every else y[d], p[rows, 1], 255.0, True)  # (whole values in 0..255: it floors)
        if every:
            y = new
        else:
            y[d] = new
    if bool(hue_on.all()):
        _hue_piece(y, p[:, 3], out)
        return
    if bool(hue_on.any()):
        rows = hue_on.nonzero().view(-1)
        d = rows.to(x.device)
        sub = out[d]
        _hue_piece(y[d], p[rows, 3], sub)
        if y is not out:
            out.copy_(y)
        out[d] = sub
        return
    if y is not out:
        out.copy_(y)


def saturation_hwc_of(xf: torch.Tensor, grey: torch.Tensor, factor: float, other: float, weights: torch.Tensor,
                      gray: List[float]) -> torch.Tensor:
    """:func:`saturation`'s blend on a float32 (H, W, C) copy of whole values, in place, its very float32
    operations: the grey (grayscale's product for channels-last float pixels, ``weights`` = :func:`_gray_weights`;
    of channels 0-2 where C is not 3, as grayscale's elementwise product with ``gray`` = :data:`GRAY`) into
    ``grey`` (H, W), floored, times ``other`` = 1 - factor; the pixels times ``factor`` (float32 scalars:
    blend's r * a and (1 - r) * grey, each rounded); the grey added channel by channel (a broadcast over the
    innermost axis is a slow inner loop); clamped to [0, 255]. Returns ``xf``. (TorchScript's subset: a scripted
    loop calls it for each sample.)"""
    if xf.shape[2] == 3:
        torch.matmul(xf, weights, out=grey)
    else:  # (the matmul takes 3 channels)
        torch.add(torch.add(xf[..., 0] * gray[0], xf[..., 1] * gray[1]), xf[..., 2] * gray[2], out=grey)
    grey.floor_().mul_(other)
    xf.mul_(factor)
    for c in range(xf.shape[2]):
        xf.select(2, c).add_(grey)
    return xf.clamp_(0, 255)


def _gray_weights() -> torch.Tensor:
    """:data:`GRAY` as a float32 (3,) tensor (made once)."""
    w = _gray_weights.__dict__.get("w")
    if w is None:
        w = _gray_weights.w = torch.tensor(GRAY, dtype=torch.float32)
    return w


def saturation_hue_u8(x: torch.Tensor, sat_on, sat, hue_on, hue) -> torch.Tensor:
    """RandomPhotometricDistort's saturation then hue (each where ``*_on``, at the per-sample factors) on uint8
    RGB (N, H, W, 3), in place, on the samples that drew either: on the CPU piece by piece (rows of about
    :data:`PIECE_PIXELS` pixels of one sample: a piece's float copy, the grey, the blend and the hue's int16
    planes all stay in cache, and the hue writes its bytes straight back into the piece), on a GPU as one
    batch. Both ops are per pixel, so the pieces give the whole sample's numbers: the float stage's."""
    planes = x.permute(0, 3, 1, 2)  # (N, 3, H, W) view of the bytes
    samples = (sat_on | hue_on).nonzero().view(-1).tolist()
    if x.device.type == "cpu":  # the loop over samples and pieces scripted: its ~70 ops a piece never reach Python
        if samples:
            r = torch.as_tensor(sat, dtype=torch.float32).reshape(-1).expand(len(x))
            dh, dl = _hue_steps(torch.as_tensor(hue, dtype=torch.float64).reshape(-1).expand(len(x)), x.device)
            H, W = planes.shape[2], planes.shape[3]
            rows = max(1, PIECE_PIXELS // max(W, 1))
            _saturation_hue_pieces(planes, samples, sat_on.tolist(), r.tolist(), (1.0 - r).tolist(), hue_on.tolist(),
                                   dh, dl, rows,
                                   scratch_tensor("saturation:float", (min(rows, H) * W * 3,), torch.float32),
                                   scratch_tensor("saturation:grey", (min(rows, H) * W,), torch.float32),
                                   _gray_weights(), list(GRAY))
        return x
    p = torch.stack([sat_on.double(), torch.as_tensor(sat, dtype=torch.float64), hue_on.double(),
                     torch.as_tensor(hue, dtype=torch.float64)], 1)
    _by_pieces(_saturation_hue_piece, planes, p, out=planes, samples=samples)
    return x


def _hue_steps(factor: torch.Tensor, device) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`_hue_piece`'s shift per sample (``factor`` float64 (N,)): 16 x 6 sectors x (factor mod 1), to
    1/128, as its two 7-bit halves, int16 (N, 1, 1) each on ``device`` (6 c x each half stays in int16)."""
    d = factor.remainder(1.0) * 96.0  # 6 sectors x 16
    D = torch.round(d * 128).to(torch.int64).clamp_(0, 96 * 128 - 1)
    return (D >> 7).to(torch.int16).view(-1, 1, 1).to(device), (D & 127).to(torch.int16).view(-1, 1, 1).to(device)


@nogil(cpu_only=True)
def _saturation_hue_pieces(planes: torch.Tensor, samples: List[int], sat_on: List[bool], factors: List[float],
                           others: List[float], hue_on: List[bool], dh: torch.Tensor, dl: torch.Tensor, rows: int,
                           yf: torch.Tensor, grey: torch.Tensor, weights: torch.Tensor, gray: List[float]) -> None:
    """:func:`saturation_hue_u8`'s loop on the CPU, in place on uint8 ``planes`` (N, 3, H, W): for each sample
    drawn, piece by piece (``rows`` rows; ``yf``, ``grey``: scratch for a piece's float pixels and grey), the
    saturation (a float copy of the piece blended by :func:`saturation_hwc_of`, floored; factor and 1 - factor
    as float32 numbers) and the hue (:func:`_hue_piece`'s, shift ``dh``/``dl`` from :func:`_hue_steps`): the same ops, the same bytes."""
    H, W = planes.shape[2], planes.shape[3]
    for n in samples:
        for r0 in range(0, H, rows):
            h = min(rows, H - r0)
            x = _piece(planes[n, :, r0:r0 + h])
            y = x
            if sat_on[n]:
                f = yf[:h * W * 3].view(h, W, 3)
                f.copy_(x[0].permute(1, 2, 0))
                saturation_hwc_of(f, grey[:h * W].view(h, W), factors[n], others[n], weights, gray).floor_()
                y = _piece(f.permute(2, 0, 1))
            if hue_on[n]:
                _hue_shift(y, dh[n:n + 1], dl[n:n + 1], x)
            elif sat_on[n]:
                x.copy_(y)


def sharpness(x, factor, bound, integer):
    """``adjust_sharpness``: the interior blended with the 3x3 [1 1 1; 1 5 1; 1 1 1] / 13 smoothing (rounded on
    uint8); the border rows and columns are kept."""
    N, C, H, W = x.shape
    if H <= 2 or W <= 2:
        return x
    p = x[..., :, :-2] + x[..., :, 1:-1] + x[..., :, 2:]  # the 3x3 sum as two 3-tap sums (no depthwise conv)
    box = p[..., :-2, :] + p[..., 1:-1, :] + p[..., 2:, :]
    deg = box.add_(x[..., 1:-1, 1:-1], alpha=4.0).div_(13.0)  # (sum + 4 centre) / 13 = [1 1 1; 1 5 1; 1 1 1] / 13
    if integer:
        deg.round_()
    out = x.clone()
    view = out[..., 1:-1, 1:-1]
    view.add_((deg - view) * (1.0 - _f(factor, x)))
    return quantise(out.clamp_(0, bound), integer)


def posterize(x, bits, bound, integer):
    """``posterize``: uint8 keeps the top ``bits`` bits; float: floor(x * 2^bits) / 2^bits."""
    bits = torch.as_tensor(bits).long().view(-1, 1, 1, 1).to(x.device)
    if integer:
        mask = ((1 << bits) - 1) << (8 - bits)
        return (x.to(torch.uint8) & mask.to(torch.uint8)).to(x.dtype)
    levels = (1 << bits).to(x.dtype)
    return (x * levels).floor_().clamp_(min=0).minimum(levels - 1).div_(levels)


def solarize(x, threshold, bound, integer):
    """``solarize``: bound - x where x >= threshold."""
    return torch.where(x >= _f(threshold, x), bound - x, x)


def invert(x, bound, integer):
    return bound - x


def autocontrast(x, bound, integer):
    """``autocontrast``: each channel stretched from its [min, max] to [0, bound] (a flat channel is kept)."""
    return stretch(x, x.amin(dim=(-2, -1), keepdim=True), x.amax(dim=(-2, -1), keepdim=True), bound, integer)


def stretch(x, lo, hi, bound, integer):
    """``autocontrast``'s map given each channel's [lo, hi] ((N, C, 1, 1), as x's dtype)."""
    eq = hi == lo
    inv_scale = torch.where(eq, torch.ones_like(hi), (hi - lo) / bound)
    lo = torch.where(eq, torch.zeros_like(lo), lo)
    return quantise((x - lo).div_(inv_scale).clamp_(0, bound), integer)


def equalize(x, bound, integer):
    """``equalize`` (PIL's algorithm, as torchvision v2 batches it): per channel, a lookup table from the
    cumulative histogram of the uint8 values; a channel whose values but the last are under 255 is kept."""
    u8 = x if integer else (x * (255.0 + 1.0 - 1e-3) / bound).trunc()
    flat = u8.flatten(-2).long()  # (N, C, HW)
    hist = torch.zeros((*flat.shape[:-1], 256), dtype=torch.int64, device=x.device)
    hist.scatter_add_(-1, flat, torch.ones_like(flat))
    out = equalize_lut(hist).gather(-1, flat).view_as(x).to(x.dtype)
    return out if integer else out / 255.0 * bound


def equalize_lut(hist: torch.Tensor) -> torch.Tensor:
    """(..., 256) int64 lookup tables of ``equalize`` from (..., 256) int64 histograms (a channel whose values
    but the last are under 255: the identity)."""
    cum = hist.cumsum(-1)
    last = cum.argmax(-1, keepdim=True)  # the last non-empty bin
    step = torch.div(cum[..., -1:] - hist.gather(-1, last), 255, rounding_mode="floor")
    valid = step.ne(0)
    lut = torch.div(cum[..., :-1] + torch.div(step, 2, rounding_mode="floor"),
                    torch.where(valid, step, torch.ones_like(step)), rounding_mode="floor").clamp_(0, 255)
    lut = torch.cat([torch.zeros_like(lut[..., :1]), lut], -1)
    return torch.where(valid, lut, torch.arange(256, device=hist.device))


def gaussian_kernel(ksize: int, sigma: torch.Tensor) -> torch.Tensor:
    """(N, ksize) 1-D kernels: exp(-x^2 / 2 sigma^2) on linspace(-(k-1)/2, (k-1)/2, k), normalised."""
    half = (ksize - 1) * 0.5
    t = torch.linspace(-half, half, ksize, dtype=torch.float64)
    pdf = torch.exp(-0.5 * (t.view(1, -1) / sigma.double().view(-1, 1)) ** 2)
    return pdf / pdf.sum(1, keepdim=True)


def gaussian_blur(x, ksize: tuple[int, int], sigma: torch.Tensor, bound, integer):
    """``gaussian_blur``: reflect padding, the separable kernel (x: ``ksize[0]``, y: ``ksize[1]``), per-sample
    sigmas (N, 2) (x, y); rounded on uint8."""
    N, C, H, W = x.shape
    kx, ky = ksize
    sigma = torch.as_tensor(sigma, dtype=torch.float64).reshape(N, -1)
    wx = gaussian_kernel(kx, sigma[:, 0]).to(x.dtype).repeat_interleave(C, 0).view(N * C, 1, 1, kx)
    wy = gaussian_kernel(ky, sigma[:, -1]).to(x.dtype).repeat_interleave(C, 0).view(N * C, 1, ky, 1)
    px, py = kx // 2, ky // 2
    if px >= W or py >= H:  # reflect needs padding < size: torchvision refuses too; keep the image
        return x
    y = F.pad(x.reshape(1, N * C, H, W), [px, px, py, py], mode="reflect")
    y = F.conv2d(F.conv2d(y, wx.to(x.device), groups=N * C), wy.to(x.device), groups=N * C)
    return quantise(y.view(N, C, H, W).clamp_(0, bound), integer, "round")


# ---------------------------------------------------------------------------------------------- uint8
# The auto-augment family's stage on the CPU keeps the batch uint8 (N, H, W, C) between ops: an op that maps
# each value alone (brightness, contrast given its mean, posterize, solarize, invert, autocontrast, equalize)
# is a per-sample (per-channel) lookup table made by the float formula above on the 256 values, so it gives
# the float path's numbers exactly; the others run on float copies of the samples that drew them.
def value_image(n: int, channels: int = 1, device=None) -> torch.Tensor:
    """(n, channels, 1, 256) float32 holding 0..255: the float formulas run on it give lookup tables."""
    return torch.arange(256, dtype=torch.float32, device=device).view(1, 1, 1, 256).expand(n, channels, 1, 256)


def apply_lut(x: torch.Tensor, lut: torch.Tensor, rows=None) -> torch.Tensor:
    """CPU uint8 (N, H, W, C) through per-sample lookup tables ``lut`` (N, 1 or C, 256) (any dtype holding
    0..255), in place: PIL's point per sample (:func:`pil_lut`) where the sample is a C-contiguous uint8 image
    large enough, else numpy's take per sample (per channel), several times torch's gathers on uint8.
    ``rows``: only these samples of ``x`` (``lut`` one per row)."""
    _, H, W, Cn = x.shape
    rows = range(len(x)) if rows is None else rows
    t = lut.reshape(len(rows), -1, 256).to(torch.uint8).numpy()
    a = x.numpy()
    per_channel = t.shape[1] != 1
    big = H * W * Cn >= 1 << 16 if not per_channel else Cn == 3 and H * W >= 1 << 14
    for i, b in enumerate(rows):
        if big and a.dtype == np.uint8 and a[b].flags.c_contiguous:
            pil_lut(a[b], t[i])
        elif not per_channel:
            np.take(t[i, 0], a[b], out=a[b], mode="clip")
        else:
            for c in range(Cn):
                np.take(t[i, c], a[b, :, :, c], out=a[b, :, :, c], mode="clip")
    return x


def pil_lut(a: np.ndarray, tables: np.ndarray, im: "Image.Image | None" = None) -> None:
    """One C-contiguous uint8 (H, W, C) sample through ``tables`` (1 or C, 256) uint8, in place, with PIL's C
    loops. One table: the sample's bytes as a greyscale image over its own memory (no copy in), its point
    pasted straight back into that memory (no copy out through ``tobytes``: about 1.5x numpy's take, and
    the bytes never pass through a Python ``bytes``). A table per channel (RGB): PIL's RGB point (the three
    lookups in one pass over the interleaved pixels; numpy's take on each strided channel is about twice
    slower), copied back. ``im``: the sample's PIL image (or core image, :func:`pil_core`) already made
    (per-channel tables)."""
    H, W, Cn = a.shape
    if tables.shape[0] == 1:
        core = _map_l(a, W * Cn, H)
        if core is not None:  # (three C calls, no Image objects: each Image made and wrapped was about 25 Python
            # calls a sample, every one holding the GIL the Loader's other thread waits for)
            core.paste(core.point(tables[0].tolist(), None), (0, 0, W * Cn, H))
            return
        im = Image.frombuffer("L", (W * Cn, H), a, "raw", "L", 0, 1)
        out = pil_point(im, tables[0].tolist())
        if not _paste_back(im, out):
            np.copyto(a, np.asarray(out).reshape(H, W, Cn))
        return
    core = im if im is not None and not isinstance(im, Image.Image) else None
    if core is None and im is None:
        core = pil_core(a)
    if core is not None:  # (the RGB point, its bytes straight back by the raw encoder: no Image objects)
        _rgb_back(core.point(tables.reshape(-1).tolist(), None), a)
        return
    out = pil_point(im if im is not None else Image.fromarray(a, "RGB"), tables.reshape(-1).tolist())
    np.copyto(a, np.asarray(out))


def pil_core(a: np.ndarray):
    """PIL's core image of a C-contiguous uint8 (H, W, 1 or 3) sample without an ``Image`` around it (each
    ``Image.fromarray`` was about 30 Python calls, every one holding the GIL): one channel mapped over the
    sample's memory (:func:`_map_l`), three decoded into an RGB core by the raw decoder (one C call: PIL keeps
    RGB 4 bytes a pixel, so it cannot map them). None where this Pillow lacks these calls: the caller takes
    ``Image.fromarray``."""
    H, W, Cn = a.shape
    if Cn == 1:
        return _map_l(a, W, H)
    new = getattr(Image.core, "new", None) if _CORE_CALLS and Cn == 3 else None
    decoder = getattr(Image.core, "raw_decoder", None)
    if new is None or decoder is None:
        return None
    try:
        core = new("RGB", (W, H))
        d = decoder("RGB", "RGB", 0, 1)
        d.setimage(core, (0, 0, W, H))
        done = d.decode(a)[0] < 0
    except (TypeError, ValueError, AttributeError):
        return None
    return core if done and hasattr(core, "point") and hasattr(core, "histogram") else None


def _rgb_back(core, a: np.ndarray) -> None:
    """An RGB core image's pixels into the C-contiguous uint8 (H, W, 3) ``a``: the raw encoder's bytes in one
    call (``Image.tobytes`` ran it in 64 KiB blocks from a Python loop and joined them), one copy in."""
    H, W, _ = a.shape
    e = Image.core.raw_encoder("RGB", "RGB", 0, 1)
    e.setimage(core, (0, 0, W, H))
    parts = []
    while True:
        _, err, data = e.encode(H * W * 3 + 64)
        parts.append(data)
        if err:
            break
    if err < 0:
        raise RuntimeError(f"PIL's raw encoder failed ({err})")
    data = parts[0] if len(parts) == 1 else b"".join(parts)
    np.copyto(a.reshape(-1), np.frombuffer(data, np.uint8, count=a.size))


def _map_l(a: np.ndarray, width: int, height: int):
    """PIL's core image over a C-contiguous uint8 array's own memory as an "L" image of (width, height) (what
    ``Image.frombuffer("L", ...)`` wraps, without the wrapping), where this Pillow's core has ``map_buffer``
    and its images ``point`` and ``paste``; else None (the caller takes Pillow's public calls)."""
    map_buffer = getattr(Image.core, "map_buffer", None) if _CORE_CALLS else None
    if map_buffer is None:
        return None
    try:
        core = map_buffer(a, (width, height), "raw", 0, ("L", 0, 1))
    except (TypeError, ValueError):
        return None
    return core if hasattr(core, "point") and hasattr(core, "paste") else None


_CORE_CALLS = True  # use PIL's core image calls where this Pillow has them (tests turn it off)


def _paste_back(im: "Image.Image", out: "Image.Image") -> bool:
    """``out``'s pixels written into the memory ``im`` maps (``Image.frombuffer``'s image of an array), with
    the core's paste (``Image.paste`` would first copy a mapped, read-only image); False where this Pillow's
    core has no paste or PIL copied the array rather than mapping it (the caller copies)."""
    core, src = _core(im, "paste"), _core(out, "paste")
    if core is None or src is None or not getattr(im, "readonly", 0):
        # (``readonly`` is set only where PIL mapped the array: an image it copied would take the paste and
        # leave the array as it was)
        return False
    core.paste(src, (0, 0) + im.size)
    return True


def _core(im: "Image.Image", method: str):
    """``im``'s core image object (loaded) where it has ``method`` and the image has ``_new`` (Pillow internals
    :func:`pil_point` and :func:`_paste_back` use), else None: they then take Pillow's public calls."""
    im.load()  # (an image not loaded yet has no core object: Pillow 11+'s ``im`` property asserts)
    core = getattr(im, "im", None)
    return core if core is not None and hasattr(core, method) and hasattr(im, "_new") else None


def pil_point(im: "Image.Image", table: list[int]) -> "Image.Image":
    """``im.point(table)`` for a table of whole numbers 0..255 (a list of ints), without ``Image.point``'s
    ``[round(i) for i in table]``: a Python loop of 256 (RGB: 768) calls per image that holds the GIL while
    the Loader's other thread waits for it (it was about half the time of a lookup); the C lookup itself
    lets the GIL go."""
    core = _core(im, "point")
    if core is None:  # (the public call)
        return im.point(table)
    return im._new(core.point(table, None))


def histograms_u8(x: torch.Tensor) -> torch.Tensor:
    """(N, C, 256) int64 value counts of uint8 (N, H, W, C), channel by channel."""
    N, H, W, Cn = x.shape
    planes = x.permute(0, 3, 1, 2).contiguous().view(N * Cn, H * W)
    return torch.stack([torch.bincount(p, minlength=256) for p in planes]).view(N, Cn, 256)


def shift_u8(x: torch.Tensor, dx: list[int], dy: list[int], fill) -> torch.Tensor:
    """uint8 (N, H, W, C) moved by whole pixels (sample b: ``dx[b]`` right, ``dy[b]`` down), ``fill`` (a uint8
    value or one per channel) where nothing lands: an affine translation by whole pixels, without resampling."""
    out = torch.empty_like(x)
    out[:] = torch.as_tensor(fill, dtype=torch.uint8, device=x.device).view(-1)
    _shift_rows(x, out, list(dx), list(dy))
    return out


@nogil
def _shift_rows(x: torch.Tensor, out: torch.Tensor, dx: List[int], dy: List[int]) -> None:
    """:func:`shift_u8`'s per-sample copies, scripted (their torch calls never reach Python)."""
    H, W = x.shape[1], x.shape[2]
    for b in range(len(dx)):
        sx, sy = dx[b], dy[b]
        if abs(sx) >= W or abs(sy) >= H:
            continue
        out[b, max(sy, 0):H + min(sy, 0), max(sx, 0):W + min(sx, 0)] = \
            x[b, max(-sy, 0):H - max(sy, 0), max(-sx, 0):W - max(sx, 0)]


# ---------------------------------------------------------------------------------------------- affine
def inverse_affine(angle, translate, scale, shear, center) -> torch.Tensor:
    """torchvision's ``_get_inverse_affine_matrix`` per sample, as (N, 3, 3) float64: output -> input, in
    coordinates centred on ``center`` (N, 2). Angles in degrees (clockwise positive, as ``F.affine``)."""
    f64 = torch.float64
    return _inverse_affine(torch.as_tensor(angle, dtype=f64), torch.as_tensor(shear[0], dtype=f64),
                           torch.as_tensor(shear[1], dtype=f64), torch.as_tensor(translate[0], dtype=f64),
                           torch.as_tensor(translate[1], dtype=f64), torch.as_tensor(scale, dtype=f64), center)


@nogil
def _inverse_affine(angle: torch.Tensor, shear_x: torch.Tensor, shear_y: torch.Tensor, tx: torch.Tensor,
                    ty: torch.Tensor, scale: torch.Tensor, center: torch.Tensor) -> torch.Tensor:
    """:func:`inverse_affine` on float64 tensors (scripted: its 40 small ops, a call each, never reach Python)."""
    rot = torch.deg2rad(angle)
    sx = torch.deg2rad(shear_x)
    sy = torch.deg2rad(shear_y)
    cx, cy = center[:, 0].double(), center[:, 1].double()
    a = torch.cos(rot - sy) / torch.cos(sy)
    b = -(a * torch.tan(sx) + torch.sin(rot))
    c = torch.sin(rot - sy) / torch.cos(sy)
    d = torch.cos(rot) - c * torch.tan(sx)
    m0, m1, m3, m4 = d / scale, -b / scale, -c / scale, a / scale
    N = cx.shape[0]
    m = torch.zeros((N, 3, 3), dtype=torch.float64)
    m[:, 0, 0] = m0
    m[:, 0, 1] = m1
    m[:, 1, 0] = m3
    m[:, 1, 1] = m4
    m[:, 2, 2] = 1.0
    m[:, 0, 2] = cx - m0 * (cx + tx) - m1 * (cy + ty)
    m[:, 1, 2] = cy - m3 * (cx + tx) - m4 * (cy + ty)
    return m


def affine_matrix(sizes: torch.Tensor, angle, translate, scale, shear, center=None) -> torch.Tensor:
    """(N, 3, 3) output -> input maps in dsc's pixel coordinates (corners at integers) of torchvision's
    ``affine(img, angle, translate, scale, shear, center)`` on images of ``sizes`` (N, 2) (h, w): its grid is
    centred on the image centre, its ``center`` given in pixels from the top-left corner."""
    h, w = sizes[:, 0].double(), sizes[:, 1].double()
    N = len(sizes)
    c = torch.zeros((N, 2), dtype=torch.float64) if center is None else \
        torch.as_tensor(center, dtype=torch.float64).expand(N, 2) - torch.stack([w, h], 1) * 0.5
    return _centred(inverse_affine(angle, translate, scale, shear, c), h, w)


@nogil
def _centred(m: torch.Tensor, h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """shift @ m @ back: the maps ``m`` (about the image centre) in pixels from the top-left corner (scripted)."""
    shift = torch.eye(3, dtype=torch.float64).repeat(m.shape[0], 1, 1)
    back = shift.clone()
    shift[:, 0, 2] = w * 0.5
    shift[:, 1, 2] = h * 0.5
    back[:, 0, 2] = -w * 0.5
    back[:, 1, 2] = -h * 0.5
    return shift @ m @ back


def warp(x: torch.Tensor, M: torch.Tensor, fill, mode: str, integer: bool, out_hw=None) -> torch.Tensor:
    """Each sample through its output -> input map ``M`` (N, 3, 3) with ``grid_sample`` (torchvision's
    tensor affine: ``mode`` nearest | bilinear, ``fill`` outside through a mask channel; uint8 rounded)."""
    N, C, H, W = x.shape
    oh, ow = out_hw or (H, W)
    m = M.to(torch.float64)
    ax = (m[:, 0] * (2.0 / W)).to(x.dtype).to(x.device)  # straight to grid_sample's [-1, 1] units
    ay = (m[:, 1] * (2.0 / H)).to(x.dtype).to(x.device)
    xs = (torch.arange(ow, dtype=x.dtype, device=x.device) + 0.5).view(1, 1, ow)
    ys = (torch.arange(oh, dtype=x.dtype, device=x.device) + 0.5).view(1, oh, 1)
    gx = ax[:, 0].view(-1, 1, 1) * xs + (ax[:, 1].view(-1, 1, 1) * ys + (ax[:, 2].view(-1, 1, 1) - 1.0))
    gy = ay[:, 0].view(-1, 1, 1) * xs + (ay[:, 1].view(-1, 1, 1) * ys + (ay[:, 2].view(-1, 1, 1) - 1.0))
    grid = torch.stack([gx, gy], -1)
    if fill is None:  # torchvision: no mask channel, zeros outside
        return quantise(F.grid_sample(x, grid, mode=mode, padding_mode="zeros", align_corners=False), integer, "round")
    fill_t = torch.as_tensor(fill, dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
    xm = torch.cat([x, torch.ones_like(x[:, :1])], 1)
    y = F.grid_sample(xm, grid, mode=mode, padding_mode="zeros", align_corners=False)
    y, mask = y[:, :-1], y[:, -1:]
    if mode == "nearest":
        y = torch.where(mask < 0.5, fill_t.expand_as(y), y)
    else:
        y = (y - fill_t).mul_(mask).add_(fill_t)
    return quantise(y, integer, "round")


# ---------------------------------------------------------------------------------------------- draws
def uniform(gen: torch.Generator, n: int, lo: float, hi: float) -> torch.Tensor:
    return lo + (hi - lo) * torch.rand(n, generator=gen, dtype=torch.float64)


def gamma(gen: torch.Generator, alpha: torch.Tensor) -> torch.Tensor:
    """Gamma(alpha, 1) draws, one per element of ``alpha`` (Marsaglia-Tsang; alpha < 1 boosted by U^(1/alpha))."""
    alpha = torch.as_tensor(alpha, dtype=torch.float64)
    a = torch.where(alpha < 1, alpha + 1, alpha)
    d = a - 1.0 / 3.0
    c = 1.0 / torch.sqrt(9.0 * d)
    out = torch.zeros_like(a)
    todo = torch.ones_like(a, dtype=torch.bool)
    for _ in range(64):  # each round accepts with probability > 0.95
        z = torch.randn(a.shape, generator=gen, dtype=torch.float64)
        u = torch.rand(a.shape, generator=gen, dtype=torch.float64)
        v = (1 + c * z) ** 3
        ok = (v > 0) & (torch.log(u.clamp(min=1e-300)) < 0.5 * z * z + d - d * v + d * torch.log(v.clamp(min=1e-300)))
        take = todo & ok
        out = torch.where(take, d * v, out)
        todo &= ~ok
        if not bool(todo.any()):
            break
    out = torch.where(todo, d, out)  # (never in practice) the mean-ish value
    boost = torch.rand(a.shape, generator=gen, dtype=torch.float64) ** (1.0 / alpha)
    return torch.where(alpha < 1, out * boost, out)


def beta(gen: torch.Generator, a: float, b: float, n: int = 1) -> torch.Tensor:
    """Beta(a, b) draws (``torch.distributions.Beta``'s distribution, from ``gen``)."""
    g = gamma(gen, torch.tensor([[a, b]], dtype=torch.float64).expand(n, 2))
    return g[:, 0] / g.sum(1)


def dirichlet(gen: torch.Generator, alpha: torch.Tensor) -> torch.Tensor:
    """Dirichlet(alpha) draws along the last axis."""
    g = gamma(gen, alpha)
    return g / g.sum(-1, keepdim=True)


def magnitude_bins(n: int, lo: float, hi) -> torch.Tensor:
    """``torch.linspace(lo, hi, n)`` per sample when ``hi`` is (N,) (TranslateX's bins scale with the width)."""
    hi = torch.as_tensor(hi, dtype=torch.float64)
    t = torch.linspace(0, 1, n, dtype=torch.float64)
    return lo + (hi.view(-1, 1) - lo) * t.view(1, -1) if hi.dim() else lo + (float(hi) - lo) * t


def log_uniform(gen, n, lo, hi):
    return torch.exp(uniform(gen, n, math.log(lo), math.log(hi)))
