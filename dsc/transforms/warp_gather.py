"""The auto-augment family's shears and nearest warps on the CPU without ``grid_sample``.

``color.warp`` (torchvision's tensor ``affine``) samples each output pixel through ``F.grid_sample``, a
general kernel that costs 1-2 ms for a 224 x 224 RGB image on the CPU. Two cases need much less:

* Nearest (the auto-augment ops' default interpolation): per output pixel one source pixel, found as
  grid_sample finds it (the same float32 grid, x = (g + 1) W / 2 - 1/2, rounded half to even), read from a
  copy of the image with a border (0, or the ``fill``) where the pixel falls outside: a gather
  (``torch.index_select``) per channel, the very pixels of grid_sample.
* A shear (ShearX / ShearY at any interpolation): the map keeps every row (ShearX; columns for ShearY), so
  output row y is input row y moved by t_y = m01 (y + 1/2) + m02 pixels (in float64 from the map), and the
  bilinear value is the 2-tap blend (1 - w) v[x + k] + w v[x + k + 1], k = floor(t_y), w = t_y - k (float32)
  -- grid_sample's formula where the other axis' weight is exactly 0. Each row's window is a slice of a
  zero-bordered copy (each chosen window copied
  as a block: ``index_select`` of one row per line from the ``unfold`` view of every window), so there is no
  per-pixel index at all; the result goes back to uint8 through int16 (``write_u8``: torch's float -> uint8
  cast is the slow one);
  ``fill``: torchvision's mask plane through the same blend, (y - fill) mask + fill. grid_sample computes the
  coordinates in float32 (its row weight is then ~1e-6, not 0), so a pixel exactly at a rounding tie may move
  one grey level against it (a shear by 0.3 puts about 3% of the pixels on a tie; tests/test_recipes_warps.py).
  The float path (``shear_float``) and the uint8 path (``shear_u8``) run the same operations: the same numbers.

Also here, for RandomAffine's bilinear resampling (``resample._warp``, torchvision's affine: ``grid_sample``):
the loop over samples, scripted (``affine_bilinear``: a Loader's filler thread runs its dozen ops a sample
without the GIL).
"""
from __future__ import annotations

import math
from typing import List, Optional

import torch
import torch.nn.functional as F

from ..nogil import nogil


# ------------------------------------------------------------------------------------------ uint8 stores
def write_u8(dst: torch.Tensor, src: torch.Tensor) -> None:
    """``dst.copy_(src)`` for float ``src`` holding values in 0..255 into uint8 ``dst`` (truncated, as that copy
    truncates), the same bytes, through int16: torch's CPU cast float -> uint8 is ~3x slower than float ->
    int16 -> uint8 (measured 0.147 against 0.057 ms a 224 x 224 RGB image), and where the layouts differ (planes
    into interleaved pixels) the strided copy then moves bytes, not floats (0.63 against 0.30 ms)."""
    if src.stride() == dst.stride():
        dst.copy_(src.to(torch.int16))
    else:
        dst.copy_(src.to(torch.int16).to(torch.uint8))


# ----------------------------------------------------------------------------------------------- nearest
def _grid(m: torch.Tensor, H: int, W: int) -> tuple[torch.Tensor, torch.Tensor]:
    """grid_sample's source coordinates (H * W,) float32 of one output -> input map ``m`` (3, 3) float64:
    the normalised grid as ``color.warp`` makes it, then unnormalised as grid_sample does (align_corners
    False): (g + 1) * size / 2 - 0.5."""
    ax = (m[0] * (2.0 / W)).to(torch.float32)
    ay = (m[1] * (2.0 / H)).to(torch.float32)
    xs = (torch.arange(W, dtype=torch.float32) + 0.5).view(1, W)
    ys = (torch.arange(H, dtype=torch.float32) + 0.5).view(H, 1)
    gx = torch.add(ax[0] * xs, ax[1] * ys + (ax[2] - 1.0))
    gy = torch.add(ay[0] * xs, ay[1] * ys + (ay[2] - 1.0))
    return gx.add_(1.0).mul_(W / 2).sub_(0.5).view(-1), gy.add_(1.0).mul_(H / 2).sub_(0.5).view(-1)


def padded_length(H: int, W: int) -> int:
    """Elements of a bordered plane: rows -1..H of columns -1..W, one more element before (a source pixel
    clamped to row or column -1 / H or W reads only border)."""
    return (H + 2) * (W + 2) + 1


def interior(plane: torch.Tensor, H: int, W: int) -> torch.Tensor:
    """The (H, W) view of the image inside bordered planes (..., padded_length)."""
    Wp = W + 2
    return plane[..., 1 + Wp:1 + (H + 1) * Wp].unflatten(-1, (H, Wp))[..., 1:W + 1]


def nearest_index(M: torch.Tensor, H: int, W: int) -> torch.Tensor:
    """(H * W,) int64: each output pixel's source in a bordered plane, as grid_sample's nearest picks it
    (round half to even; outside the image: the border)."""
    ix, iy = _grid(M.to(torch.float64).reshape(3, 3), H, W)
    ix, iy = ix.round_().clamp_(-1, W), iy.round_().clamp_(-1, H)
    if padded_length(H, W) < 1 << 24:  # (whole numbers exact in float32)
        return iy.add_(1).mul_(W + 2).add_(ix).add_(2).to(torch.int64)
    return iy.to(torch.int64).add_(1).mul_(W + 2).add_(ix.to(torch.int64)).add_(2)


def _bordered(C: int, H: int, W: int, fill, dtype) -> torch.Tensor:
    planes = torch.zeros((C, padded_length(H, W)), dtype=dtype)
    if fill is not None:
        planes[:] = torch.as_tensor(fill, dtype=torch.float32).round().clamp(0, 255).to(dtype).reshape(-1, 1) \
            if dtype == torch.uint8 else torch.as_tensor(fill, dtype=dtype).reshape(-1, 1)
    return planes


def nearest_u8(x: torch.Tensor, M: torch.Tensor, fill) -> torch.Tensor:
    """CPU uint8 (N, H, W, C) through output -> input maps ``M`` (N, 3, 3) with nearest sampling, in place:
    ``color.warp``'s pixels (``fill`` outside, rounded to uint8; None: 0)."""
    N, H, W, C = x.shape
    planes = _bordered(C, H, W, fill, torch.uint8)
    inner = interior(planes, H, W)
    out = torch.empty((C, H * W), dtype=torch.uint8)
    for b in range(N):
        idx = nearest_index(M[b], H, W)
        inner.copy_(x[b].permute(2, 0, 1))
        for c in range(C):
            torch.index_select(planes[c], 0, idx, out=out[c])
        x[b].copy_(out.view(C, H, W).permute(1, 2, 0))
    return x


def nearest_float(x: torch.Tensor, M: torch.Tensor, fill) -> torch.Tensor:
    """:func:`nearest_u8` on CPU float (N, C, H, W) (the fill as given)."""
    N, C, H, W = x.shape
    planes = _bordered(C, H, W, fill, x.dtype)
    inner = interior(planes, H, W)
    y = torch.empty((N, C, H * W), dtype=x.dtype)
    for b in range(N):
        idx = nearest_index(M[b], H, W)
        inner.copy_(x[b])
        for c in range(C):
            torch.index_select(planes[c], 0, idx, out=y[b, c])
    return y.view(N, C, H, W)


# ------------------------------------------------------------------------------------------------ shears
def shear_axis(M: torch.Tensor) -> int | None:
    """1: every map of ``M`` (N, 3, 3) keeps rows (input y = output y: ShearX), 0: keeps columns (ShearY), else
    None."""
    m = M.to(torch.float64)
    if bool((m[:, 1, 0] == 0).all() and (m[:, 1, 1] == 1).all() and (m[:, 1, 2] == 0).all()
            and (m[:, 0, 0] == 1).all()):
        return 1
    if bool((m[:, 0, 1] == 0).all() and (m[:, 0, 0] == 1).all() and (m[:, 0, 2] == 0).all()
            and (m[:, 1, 1] == 1).all()):
        return 0
    return None


def _shifts(m: torch.Tensor, axis: int, n: int) -> torch.Tensor:
    """(n,) float64: how far line i (row for axis 1, column for axis 0) reads from, in pixels."""
    centres = torch.arange(n, dtype=torch.float64) + 0.5
    return m[0, 1] * centres + m[0, 2] if axis == 1 else m[1, 0] * centres + m[1, 2]


def _taps(pad: torch.Tensor, src: torch.Tensor, start: torch.Tensor) -> List[torch.Tensor]:
    """The 2 taps of every line of ``src`` (R, L, c) (any strides), float32 (R, L * c) each: ``pad`` (R, (3 L + 2)
    c), contiguous, holds the lines bordered by L + 1 zero pixels each side (its middle written here, its
    borders left zero), and each line's window of L + 1 pixels from ``start`` is one row of the view of every
    window of the flat buffer (``unfold``: all of them at once, by pixel), picked by ``index_select`` (a block
    copy a line: ~4x faster than an advanced index of a strided view, which copies byte by byte)."""
    R, L, c = src.shape[0], src.shape[1], src.shape[2]
    n = pad.shape[1]
    pad[:, (L + 1) * c:(2 * L + 1) * c].view(R, L, c).copy_(src)
    windows = pad.view(-1).unfold(0, (L + 1) * c, c)  # (window j: the L + 1 pixels from pixel j of the buffer)
    rows = windows.index_select(0, start + torch.arange(R, device=start.device) * (n // c))
    if rows.dtype != torch.float32:
        rows = rows.to(torch.float32)
    return [rows[:, :L * c], rows[:, c:]]


def _blend_lines(lines: torch.Tensor, t: torch.Tensor, fill: Optional[torch.Tensor], pad: torch.Tensor,
                 ones: Optional[torch.Tensor]) -> torch.Tensor:
    """float32 (R, L * C): lines (R, L, C) (uint8 or float, any strides) each moved by t (R,) pixels with the
    2-tap blend (1 - w) v[x + k] + w v[x + k + 1] (0 outside; ``fill`` (1 or C,) float32: (y - fill) mask +
    fill). ``pad``: zeros (R, (3 L + 2) C) of the lines' dtype, ``ones``: zeros (R, 3 L + 2) float32 (with a
    fill): their middles are written, their borders stay zero (kept from line set to line set)."""
    R, L, C = lines.shape[0], lines.shape[1], lines.shape[2]
    k = torch.floor(t)
    w = (t - k).to(torch.float32).view(-1, 1)
    e = 1.0 - w
    start = k.to(torch.int64).clamp_(-L - 1, L).add_(L + 1)  # window start in a line bordered by L + 1 zeros
    v = _taps(pad, lines, start)
    y = torch.mul(v[0], e).add_(torch.mul(v[1], w))
    if fill is None or ones is None:
        return y
    m = _taps(ones, torch.ones((R, L, 1), dtype=torch.float32), start)
    mask = torch.mul(m[0], e).add_(torch.mul(m[1], w)).repeat_interleave(C, 1)
    f = fill.reshape(-1).expand(C).repeat(L)
    return y.sub_(f).mul_(mask).add_(f)


def _pads(R: int, L: int, C: int, dtype, fill) -> tuple[torch.Tensor, torch.Tensor | None]:
    return torch.zeros((R, (3 * L + 2) * C), dtype=dtype), None if fill is None else \
        torch.zeros((R, 3 * L + 2), dtype=torch.float32)


def _fill_tensor(fill) -> torch.Tensor | None:
    return None if fill is None else torch.as_tensor(fill, dtype=torch.float32).reshape(-1)


def shear_u8(x: torch.Tensor, M: torch.Tensor, fill, axis: int, rows=None) -> torch.Tensor:
    """CPU uint8 (N, H, W, C) through shear maps ``M`` (N, 3, 3) (``axis`` from :func:`shear_axis`), bilinear,
    rounded, in place; ``rows``: only these samples of ``x`` (``M`` one per row)."""
    N, H, W, C = x.shape
    if x.numel() == 0:  # (no line to move; unfold cannot view an empty buffer's windows)
        return x
    if axis == 0 and fill is None:  # (columns, no fill: both taps by one gather, as the bytes lie)
        return _shear_columns_u8(x, M, list(range(N)) if rows is None else [int(b) for b in rows])
    R, L = (H, W) if axis == 1 else (W, H)
    pad, ones = _pads(R, L, C, x.dtype, fill)  # (each sample's zero-bordered lines in one buffer, zeroed once)
    _shear_rows(x, M, list(range(N)) if rows is None else [int(b) for b in rows], axis, _fill_tensor(fill), pad,
                ones)
    return x


@nogil
def _shear_rows(x: torch.Tensor, M: torch.Tensor, rows: List[int], axis: int, fill: Optional[torch.Tensor],
                pad: torch.Tensor, ones: Optional[torch.Tensor]) -> None:
    """:func:`shear_u8`'s loop over samples, scripted (dsc.nogil: its ~25 torch calls a sample never reach
    Python, and the windows' copies no longer hold the GIL as numpy's fancy index did)."""
    H, W, C = x.shape[1], x.shape[2], x.shape[3]
    for i in range(len(rows)):
        b = rows[i]
        m = M[i].to(torch.float64)
        if axis == 1:
            y = _blend_lines(x[b], _shifts(m, 1, H), fill, pad, ones)
            write_u8(x[b], y.round_().clamp_(0, 255).view(H, W, C))  # (x[b] may be any strides)
        else:
            y = _blend_lines(x[b].transpose(0, 1), _shifts(m, 0, W), fill, pad, ones)
            write_u8(x[b], y.round_().clamp_(0, 255).view(W, H, C).transpose(0, 1))


def by_map(m: torch.Tensor) -> tuple[torch.Tensor, List[bool]]:
    """The samples of maps ``m`` (N, 3, 3) ordered so that equal maps are neighbours (the groups in
    the order torch.unique sorts the maps), and for each in that order whether its map differs from the one
    before (a grid to make)."""
    N = len(m)
    if N == 0:
        return torch.zeros(0, dtype=torch.long), []
    _, inverse = torch.unique(m.reshape(N, -1), dim=0, return_inverse=True)
    key, order = torch.sort(inverse, stable=True)
    key = key.tolist()
    return order, [i == 0 or key[i] != key[i - 1] for i in range(N)]


def _shear_columns_u8(x: torch.Tensor, M: torch.Tensor, rows: List[int]) -> torch.Tensor:
    """What :func:`shear_u8` does for maps that move columns (ShearY), no fill, on samples ``rows`` of CPU
    uint8 (N, H, W, C), in place, its very numbers without its two transposing copies (lines = columns: a
    strided copy of 3-byte pixels each way, about a third of its time). Column x reads rows y + k_x and
    y + k_x + 1 (k_x = floor(t_x)) of the sample bordered by H + 1 zero rows above and below: both taps of
    every pixel come from one gather of bytes (``index_select`` through an index made once for the
    samples that share a map: RandAugment's shears of a batch are two, +-magnitude), tap 1 being tap 0 a
    row down, as the sample lies; then blended as ``_blend_lines`` blends, (1 - w_x) v0 + w_x v1 in float32
    (the weights along the contiguous rows: vectorised), rounded, clamped, written back as the bytes lie."""
    N, H, W, Cn = x.shape
    if x.numel() == 0 or not len(rows):
        return x
    m = M.to(torch.float64)
    order, fresh = by_map(m)
    bordered = torch.zeros((3 * H + 2, W * Cn), dtype=x.dtype)  # (zeroed once a call; its middle rewritten)
    index = torch.empty((H + 1, W * Cn), dtype=torch.int64)
    taps = torch.empty((H + 1, W * Cn), dtype=x.dtype)
    _shear_columns(x, m.index_select(0, order), [rows[i] for i in order.tolist()], fresh, bordered, index, taps)
    return x


@nogil
def _shear_columns(x: torch.Tensor, M: torch.Tensor, rows: List[int], fresh: List[bool], bordered: torch.Tensor,
                   index: torch.Tensor, taps: torch.Tensor) -> None:
    """:func:`_shear_columns_u8`'s loop over samples (a new index and weights where ``fresh[i]``), scripted
    (its torch calls never reach Python)."""
    H, W, Cn = x.shape[1], x.shape[2], x.shape[3]
    lines = torch.arange(H + 1, dtype=torch.int64).mul_(W * Cn).view(-1, 1)
    within = torch.arange(W * Cn, dtype=torch.int64).view(1, -1)
    w = torch.empty((1, W * Cn), dtype=torch.float32)
    e = torch.empty((1, W * Cn), dtype=torch.float32)
    flat = bordered.view(-1)
    for i in range(len(rows)):
        b = rows[i]
        if fresh[i]:
            t = _shifts(M[i], 0, W)
            k = torch.floor(t)
            wx = (t - k).to(torch.float32)
            w.copy_(wx.view(W, 1).expand(W, Cn).reshape(1, W * Cn))
            e.copy_((1.0 - wx).view(W, 1).expand(W, Cn).reshape(1, W * Cn))
            start = k.to(torch.int64).clamp_(-H - 1, H).add_(H + 1).mul_(W * Cn)  # (y + k_x's row, as a flat offset)
            torch.add(lines, within + start.view(W, 1).expand(W, Cn).reshape(1, W * Cn), out=index)
        bordered[H + 1:2 * H + 1].view(H, W, Cn).copy_(x[b])
        torch.index_select(flat, 0, index.view(-1), out=taps.view(-1))
        v = taps.to(torch.float32)
        y = torch.mul(v[:H], e).add_(torch.mul(v[1:], w))
        write_u8(x[b], y.round_().clamp_(0, 255).view(H, W, Cn))


def shear_float(x: torch.Tensor, M: torch.Tensor, fill, axis: int, integer: bool) -> torch.Tensor:
    """:func:`shear_u8`'s operations on CPU float (N, C, H, W), plane by plane (``integer``: rounded)."""
    N, C, H, W = x.shape
    y = torch.empty_like(x, dtype=torch.float32)
    if x.numel() == 0:
        return y
    fills = [None] * C if fill is None else [_fill_tensor(v) for v in
                                             torch.as_tensor(fill, dtype=torch.float32).reshape(-1).expand(C).tolist()]
    R, L = (H, W) if axis == 1 else (W, H)
    pad, ones = _pads(R, L, 1, x.dtype, fill)
    for b in range(N):
        m = M[b].to(torch.float64)
        for c in range(C):
            if axis == 1:
                y[b, c] = _blend_lines(x[b, c].unsqueeze(-1), _shifts(m, 1, H), fills[c], pad, ones)
            else:
                y[b, c] = _blend_lines(x[b, c].t().unsqueeze(-1), _shifts(m, 0, W), fills[c], pad, ones).t()
    y = y.to(x.dtype)
    return y.round_() if integer else y


@nogil(cpu_only=True)
def affine_bilinear(img: torch.Tensor, xi: torch.Tensor, yi: torch.Tensor, hw: List[List[int]],
                    ext: List[List[List[float]]], fill: torch.Tensor, out: torch.Tensor) -> None:
    """``resample._warp``'s bilinear loop: each sample ``b`` of the integer canvas ``img`` (B, Hm, Wm, C) (its
    own image (hw[b]) at the top left) into ``out[b]`` (h, w, C), ``img``'s dtype, through its source points
    ``xi[b]``, ``yi[b]`` (float32, (h | 1, w) and (h, w | 1): pixel centres of the source); ``ext[b]``: their
    extremes [[x min, x max], [y min, y max]] (float64, as Python numbers: no device sync per sample);
    ``fill`` (C,) or (1,) float32. Only the part of the image the output reads goes to float, into
    ``grid_sample`` (zeros outside, as torchvision's); where a source point leaves the image, the result is
    blended with the fill by the weight that lay inside (torchvision's mask channel), per axis: 1 within
    [0, w - 1], falling linearly to 0 over the pixel beyond each edge; rounded (uint8: clamped, and cast
    plane by plane, through int16, before the planes are interleaved: the same values, one strided copy of
    bytes, not of floats)."""
    B, oh, ow = out.shape[0], out.shape[1], out.shape[2]
    grid = torch.empty((1, oh, ow, 2), dtype=torch.float32, device=img.device)  # (one for the batch)
    for b in range(B):  # (a zoom reads little of its image)
        Hb, Wb = hw[b][0], hw[b][1]
        xa, xb = int(math.floor(ext[b][0][0])), int(math.floor(ext[b][0][1]))
        ya, yb = int(math.floor(ext[b][1][0])), int(math.floor(ext[b][1][1]))
        x0c, x1c = min(max(xa - 2, 0), Wb), min(max(xb + 3, 0), Wb)
        y0c, y1c = min(max(ya - 2, 0), Hb), min(max(yb + 3, 0), Hb)
        if x1c <= x0c or y1c <= y0c:
            out[b] = fill.round().clamp(0, 255) if out.dtype == torch.uint8 else fill.round()
            continue
        src = img[b:b + 1, y0c:y1c, x0c:x1c].permute(0, 3, 1, 2).float()  # channels-last memory
        grid[0, :, :, 0] = (xi[b] - x0c) * (2.0 / (x1c - x0c)) - 1.0  # (each plane written whole, from its row or
        grid[0, :, :, 1] = (yi[b] - y0c) * (2.0 / (y1c - y0c)) - 1.0  # column when axis-aligned: no stack)
        planes = F.grid_sample(src, grid, mode="bilinear", padding_mode="zeros", align_corners=False)[0]
        y = planes.permute(1, 2, 0)
        if not (ext[b][0][0] - 0.5 >= 0 and ext[b][0][1] - 0.5 <= Wb - 1 and ext[b][1][0] - 0.5 >= 0
                and ext[b][1][1] - 0.5 <= Hb - 1):  # some points outside: blend with the fill
            u, v = xi[b] - 0.5, yi[b] - 0.5  # (a row and a column when axis-aligned: their product the plane)
            ins = torch.minimum(u + 1, Wb - u).clamp_(0, 1).mul(torch.minimum(v + 1, Hb - v).clamp_(0, 1))
            y = y.sub_(fill).mul_(ins.unsqueeze(-1)).add_(fill)
        y = y.round_()
        if out.dtype == torch.uint8:  # (whole numbers in 0..255: through int16)
            write_u8(out[b], planes.clamp_(0, 255).permute(1, 2, 0))
        else:
            out[b].copy_(y)
