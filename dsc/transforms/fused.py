"""Geometric chains run per sample, from a view of the stored sample straight into the output buffer.

A chain is planned once per batch (``plan_chain``): every op draws its parameters from the batch's
generator, giving each sample a matrix (boxes) and a program of integer steps (crop, resize, flip). The
program is run on each sample's zero-copy view of the mapped shard (``run_program``): a crop is a slice of
the view, flips are folded into the one contiguous copy that resampling needs, and the last resize
writes into the output slot itself with torch's antialiased uint8 kernel (``_upsample_bilinear2d_aa``, the
AVX2 fixed-point path torchvision's ``resize`` on uint8 tensors runs; masks: nearest neighbour by index).
The kernel releases the GIL, so the Loader's filler threads resize in parallel; torch runs it
single-threaded in each of them.

Resizing a flipped crop equals flipping the resized crop up to the rounding of exact ties in the filter's
support, so the copy that resampling needs applies the flips too.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

import numpy as np
import torch

from ..formats.coords import dwarfs
from .geometric import Geometric
from ..errors import ConfigError
from ..nogil import nogil
from .photometric import post_row

_aa = getattr(torch.ops.aten._upsample_bilinear2d_aa, "out", None)


@dataclass
class ChainPlan:
    """One batch's geometry: (B, 3, 3) output->input matrices, the output (h, w), the per-sample programs
    (None when an op has no steps: then the batched resampling pass applies the matrices), and the fill
    of pixels outside the image for that batched pass (the last op's with one; in the programs each crop
    carries its own op's fill)."""

    matrices: torch.Tensor
    out: tuple[int, int] | None
    programs: list[list[tuple]] | None
    fill: float = 0.0
    sizes: torch.Tensor | None = None  # (B, 2) (h, w) of the samples before the chain
    hflip: torch.Tensor | None = None  # (B,) bool: the sample's map mirrors x (keypoints swap left/right)
    out_sizes: torch.Tensor | None = None  # (B, 2) each sample's (h, w) after the chain; ``out`` None: they differ
    keep: torch.Tensor | None = None  # per box (packed order): False where an op drops it (RandomIoUCrop)
    interpolation: str | None = None  # the batched pass: None antialiased bilinear; "nearest" | "bilinear" as
    # torchvision's affine (no antialiasing): the last op of the chain with an ``interpolation`` says


def full(shape, fill, dtype, device) -> torch.Tensor:
    """A tensor of ``shape`` holding ``fill``: one number, or one per channel (the last dimension), as
    torchvision's ``fill=(123, 117, 104)``."""
    if isinstance(fill, (tuple, list)):
        if len(shape) < 3 or shape[-1] != len(fill):
            raise ConfigError(f"a fill of {len(fill)} values (one per channel) on pixels of shape {tuple(shape)}: "
                              f"give one number, or one per channel")
        row = torch.tensor(fill, dtype=torch.float64).round().to(dtype).to(device).repeat(shape[-2])  # one line
        out = torch.empty(shape, dtype=dtype, device=device)
        flat = out.view(-1, row.numel())
        flat.copy_(row.expand_as(flat))  # (a broadcast row: copied line by line, not value by value)
        return out
    return torch.full(shape, fill, dtype=dtype, device=device)


def _current_boxes(boxes, M: torch.Tensor) -> list[torch.Tensor]:
    """Each sample's boxes (packed ``(boxes, offsets)``) in the coordinates after the maps ``M`` so far."""
    flat, offsets = boxes
    fwd = torch.linalg.inv(M)
    o = offsets.tolist()
    out = []
    for b in range(len(o) - 1):
        bx = flat[o[b]:o[b + 1]].double().cpu()
        xs = torch.stack([bx[:, 0], bx[:, 2], bx[:, 0], bx[:, 2]], 1)
        ys = torch.stack([bx[:, 1], bx[:, 1], bx[:, 3], bx[:, 3]], 1)
        f = fwd[b]
        nx, ny = f[0, 0] * xs + f[0, 1] * ys + f[0, 2], f[1, 0] * xs + f[1, 1] * ys + f[1, 2]
        out.append(torch.stack([nx.amin(1), ny.amin(1), nx.amax(1), ny.amax(1)], 1))
    return out


def plan_chain(ops: list[Geometric], sizes: torch.Tensor, gen: torch.Generator, boxes=None) -> ChainPlan:
    """Draw every op's parameters for a batch of samples of ``sizes`` (B, 2) (h, w), in op order. ``boxes``:
    the batch's packed ``(boxes, box_offsets)``, for ops that draw from them (``needs_boxes``)."""

    B = len(sizes)
    M = torch.eye(3, dtype=torch.float64).expand(B, 3, 3).clone()
    steps: list | None = []
    fill = 0.0
    keep, interpolation = None, None
    sizes_in, hflip = sizes, torch.zeros(B, dtype=torch.bool)
    for op in ops:
        if getattr(op, "needs_boxes", False):
            if boxes is None:
                raise ConfigError(f"{type(op).__name__} draws its crops from the boxes: the batch has none (a "
                                  f"detection dataset has them: dsc compile coco / yolo / voc; the SSD recipes "
                                  f"and `dsc bench --recipe det-ssd / det-ssdlite` need one)")
            p = op.params(sizes, gen, boxes=_current_boxes(boxes, M))
            k = p.get("keep") if isinstance(p, dict) else None
            if k is not None:
                keep = k if keep is None else keep & k
            m, new = op.matrix(sizes, p)
            hflip ^= op.hflips(sizes, p) if hasattr(op, "hflips") else mirrors_x(m)
            s = op.steps(sizes, p)
            steps = None if steps is None or s is None else steps + s
        elif type(op).plan is not Geometric.plan:  # an op that only knows its matrices
            m, new = op.plan(sizes, gen)
            steps = None
            hflip ^= mirrors_x(m)
        else:
            p = op.params(sizes, gen)
            m, new = op.matrix(sizes, p)
            hflip ^= op.hflips(sizes, p) if hasattr(op, "hflips") else mirrors_x(m)
            s = op.steps(sizes, p)
            if s is not None:  # each crop carries the fill of the op that made it (CenterCrop's zeros stay zeros)
                own = _fill_value(op.fill) if getattr(op, "fill", None) is not None else 0.0
                s = [(*st, [own] * B) if st[0] == "crop" and len(st) == 5 else st for st in s]
            steps = None if steps is None or s is None else steps + s
        if getattr(op, "fill", None) is not None:
            fill = _fill_value(op.fill)
        if getattr(op, "interpolation", None) is not None:
            interpolation = op.interpolation
        M = M @ m
        sizes = new
    if B == 0:  # an empty batch: the output size is the chain's, whatever the (absent) input
        out = plan_chain(ops, torch.tensor([[1, 1]]), torch.Generator(),
                         boxes=(torch.zeros((0, 4)), torch.zeros(2, dtype=torch.long))).out
        return ChainPlan(M, out, [], fill, sizes=sizes_in, hflip=hflip, out_sizes=sizes.long().view(0, 2),
                         interpolation=interpolation)
    programs = None
    if steps is not None:  # per sample: [(kind, args...)], from the batched lists
        programs = [[(kind, *(a[b] for a in args)) for kind, *args in steps] for b in range(B)]
    sizes = sizes.long()
    if not bool((sizes == sizes[0]).all()):  # samples of several sizes (flips, scale jitter): a ragged batch
        return ChainPlan(M, None, programs, fill, sizes=sizes_in, hflip=hflip, out_sizes=sizes, keep=keep,
                         interpolation=interpolation)
    return ChainPlan(M, (int(sizes[0, 0]), int(sizes[0, 1])), programs, fill, sizes=sizes_in, hflip=hflip,
                     out_sizes=sizes, keep=keep, interpolation=interpolation)


def _fill_value(fill):
    """An op's fill as the plan carries it: a float, or a tuple of floats (one per channel)."""
    return tuple(float(v) for v in fill) if isinstance(fill, (tuple, list)) else float(fill)


def fixes_size(ops: list[Geometric]) -> bool:
    """Whether the chain leaves every sample at one size (only then can a gather run it into one buffer)."""
    try:
        probe = plan_chain(ops, torch.tensor([[37, 91], [120, 55], [64, 64]]), torch.Generator().manual_seed(0))
    except ConfigError:
        return False
    return probe.out is not None


def keeps_sizes(ops: list[Geometric]) -> bool:
    """Whether the chain leaves every sample at its own size with integer programs (flips): a gather can then
    run it into the packed ragged batch, each sample straight into its place (a draw that turns out otherwise,
    e.g. a RandomZoomOut(p=0.2) that the probe drew as a no-op, is run after the gather: the gather checks each
    batch's plan)."""
    sizes = torch.tensor([[37, 91], [120, 55], [64, 64]])
    try:
        probe = plan_chain(ops, sizes, torch.Generator().manual_seed(0))
    except ConfigError:
        return False
    return probe.out is None and probe.programs is not None and torch.equal(probe.out_sizes, sizes)


def mirrors_x(m: torch.Tensor) -> torch.Tensor:
    """(B,) bool: which of the (B, 3, 3) maps mirror horizontally (a negative determinant and a negative x
    scale: a horizontal flip; a vertical flip mirrors y only). An op may say it itself: ``hflips(sizes, params)``."""
    det = m[:, 0, 0] * m[:, 1, 1] - m[:, 0, 1] * m[:, 1, 0]
    return (det < 0) & (m[:, 0, 0] < 0)


def mirrored(x: torch.Tensor, rows: bool, columns: bool) -> torch.Tensor:
    """``x`` mirrored top to bottom (``rows``: its dim 0) and / or left to right (``columns``: dim 1); ``x`` itself
    when neither. Scriptable: the one flip of an image or mask sample, in the scripted kernels
    (``_crop_resize_rows``, ``batches.cast_image``, ``batches.paste_masks``) as in Python. uint16 (no flip kernel)
    by index_select."""
    dims: List[int] = []
    if rows:
        dims.append(0)
    if columns:
        dims.append(1)
    if len(dims) == 0:
        return x
    if x.dtype == torch.uint16:
        for d in dims:
            x = x.index_select(d, torch.arange(x.shape[d] - 1, -1, -1, device=x.device))
        return x
    return x.flip(dims)


def dense_hwc(x: torch.Tensor) -> torch.Tensor:
    """``x`` (H, W, C) with the strides of a fresh tensor (W C, C, 1). torch calls a view with a size-1 axis
    contiguous whatever that axis' stride (a one-pixel-wide crop of a transposed view: (1, 20, 1)), and
    ``.contiguous()`` keeps it; the uint8 antialiased kernel then reads by that stride (other pixels, or past
    the buffer): such a view is copied."""
    s = x.stride()
    if s[0] != x.shape[1] * x.shape[2] or s[1] != x.shape[2] or s[2] != 1:
        return torch.empty(x.shape, dtype=x.dtype, device=x.device).copy_(x)
    return x


def _resize_image(x: torch.Tensor, h: int, w: int, out: torch.Tensor | None) -> torch.Tensor:
    """Antialiased bilinear resize of a contiguous (H, W, C) uint8 tensor, into ``out`` (h, w, C) if given."""
    x = dense_hwc(x)
    src = x.permute(2, 0, 1).unsqueeze(0)  # NCHW view of HWC memory: channels-last, the fast uint8 path
    if out is None:
        out = torch.empty((h, w, x.shape[2]), dtype=x.dtype)
    dst = out.permute(2, 0, 1).unsqueeze(0)
    if _aa is not None and x.dtype == torch.uint8 and x.device.type == "cpu":  # the SIMD uint8 kernel
        _aa(src, [h, w], False, None, None, out=dst)
    else:  # another device or dtype: the same filter in float, rounded back
        y = torch.nn.functional.interpolate(src.float(), size=(h, w), mode="bilinear", antialias=True)
        dst.copy_(y.round_().clamp_(0, 255) if not x.is_floating_point() else y)
    return out


def _nearest_index(start: int, stop: int, n_in: int, n_out: int, device) -> torch.Tensor:
    """Source indices of output pixels start..stop-1 of a nearest resize from n_in to n_out pixels."""
    i = torch.arange(start, stop, dtype=torch.float64)
    return torch.clamp(((i + 0.5) * (n_in / n_out)).floor().long(), max=n_in - 1).to(device)


def _resize_nearest(x: torch.Tensor, h: int, w: int, out: torch.Tensor | None) -> torch.Tensor:
    """Nearest neighbour: output pixel (i, j) takes input pixel (floor((i + .5) H / h), floor((j + .5) W / w))."""
    H, W = x.shape[:2]
    ys, xs = _nearest_index(0, h, H, h, x.device), _nearest_index(0, w, W, w, x.device)
    rows = x.index_select(0, ys)
    if out is None:
        return rows.index_select(1, xs)
    torch.index_select(rows, 1, xs, out=out)
    return out


def _region_ok(x: torch.Tensor, nearest: bool) -> bool:
    """Whether :func:`_resized_region` handles ``x``: nearest anywhere, bilinear on CPU uint8 L/RGB/RGBA
    (elsewhere the whole resize is made, as before)."""
    return nearest or (x.dtype == torch.uint8 and x.device.type == "cpu" and x.dim() == 3 and x.shape[2] in (1, 3, 4))


def _resized_region(x: torch.Tensor, size: tuple[int, int], top: int, left: int, h: int, w: int, nearest: bool,
                    fill: float) -> torch.Tensor:
    """The (h, w) window at (top, left) of ``x`` resized to ``size``, without making the whole resize (a
    crop that the resize :func:`~dsc.compiler.geometry.dwarfs`; ``x`` passes :func:`_region_ok`): nearest picks the same source pixels ``_resize_nearest`` would; bilinear resamples PIL's exact
    fractional source box (antialiased, like the kernel used otherwise). Outside the resize: ``fill``."""
    from PIL import Image

    H, W = x.shape[:2]
    nh, nw = size
    t0, t1, l0, l1 = max(top, 0), min(top + h, nh), max(left, 0), min(left + w, nw)
    canvas = full((h, w, *x.shape[2:]), fill, x.dtype, x.device)
    if t1 <= t0 or l1 <= l0:
        return canvas
    if nearest:
        part = x.index_select(0, _nearest_index(t0, t1, H, nh, x.device)).index_select(
            1, _nearest_index(l0, l1, W, nw, x.device))
    else:
        arr = x.contiguous().numpy()
        im = Image.fromarray(arr[..., 0] if arr.shape[2] == 1 else arr)
        box = (l0 * W / nw, t0 * H / nh, l1 * W / nw, t1 * H / nh)
        part = torch.from_numpy(np.asarray(im.resize((l1 - l0, t1 - t0), Image.BILINEAR, box=box)).copy())
        part = part.view(t1 - t0, l1 - l0, x.shape[2])
    canvas[t0 - top:t1 - top, l0 - left:l1 - left] = part
    return canvas


def _pending_flips(steps, fh: bool, fw: bool) -> tuple[bool, bool]:
    """The pending (vertical, horizontal) flips after the program's ``("flip", axis, on)`` ``steps``: each one
    drawn on toggles its axis (0: horizontal)."""
    for step in steps:
        if step[2]:
            fw, fh = (not fw, fh) if step[1] == 0 else (fw, not fh)
    return fh, fw


def _fill_around(out: torch.Tensor, part: tuple[int, int, int, int], fill) -> None:
    """``fill`` (a number, or one per channel) written into ``out`` (h, w[, C]) everywhere but the rows
    part[0]:part[1] x columns part[2]:part[3] (an empty part: everywhere); per channel as one line of the
    fill copied to every row of a band (a broadcast of the C values themselves is copied value by value,
    many times slower)."""
    h, w = out.shape[:2]
    a0, a1, b0, b1 = part
    if a1 <= a0 or b1 <= b0:
        a0 = a1 = b0 = b1 = 0
    if isinstance(fill, torch.Tensor):  # (one value per channel, float already: run_program's float out)
        line = fill.to(out.dtype).repeat(w).view(w, -1)
    else:
        line = full((1, w, *out.shape[2:]), fill, out.dtype, out.device)[0] if isinstance(fill, (tuple, list)) else None
    for r0, r1, c0, c1 in ((0, a0, 0, w), (a1, h, 0, w), (a0, a1, 0, b0), (a0, a1, b1, w)):
        if r1 > r0 and c1 > c0:
            band = out[r0:r1, c0:c1]
            if line is None:
                band.fill_(fill)
            else:
                band.copy_(line[c0:c1].unsqueeze(0).expand_as(band))


def _float_fill(fill, divisor: torch.Tensor, out: torch.Tensor):
    """A crop's fill as a float ``out`` of :func:`run_program` with ``divisor`` holds it: the uint8 fill
    :func:`full` makes (a number as torch.full makes it, one per channel rounded; the same checks), as float,
    divided: the cast of the uint8 path's canvas (one number, or a tensor of one per channel)."""
    if isinstance(fill, (tuple, list)):
        f = full((1, 1, out.shape[-1]) if out.dim() >= 3 else (1, 1), fill, torch.uint8, "cpu").view(-1)
        return f.to(out.dtype).div_(divisor.to(out.dtype))
    f = torch.full((1,), fill, dtype=torch.uint8).to(out.dtype).div_(divisor.to(out.dtype))
    return float(f[0])


def _float_fill_of(fill, divisor: torch.Tensor, out: torch.Tensor, fills: dict | None):
    """:func:`_float_fill`, made once per fill, channel count and dtype in ``fills`` (None: made here)."""
    if fills is None:
        return _float_fill(fill, divisor, out)
    key = (tuple(fill) if isinstance(fill, list) else fill, out.shape[-1] if out.dim() >= 3 else 0, out.dtype)
    made = fills.get(key)
    if made is None:
        made = fills[key] = _float_fill(fill, divisor, out)  # (a fill that fails to make raises, never kept)
    return made


def run_program(src: torch.Tensor, program: list[tuple], out: torch.Tensor, nearest: bool, fill: float | None,
                post=None, divisor: torch.Tensor | None = None, fills: dict | None = None) -> None:
    """One sample: ``src`` (H, W[, C]) through ``program`` into ``out`` (h, w[, C]); with ``post`` (a
    :class:`~dsc.transforms.photometric.PixelPost`) the uint8 result goes through it into ``out`` (C, h, w).
    ``fill``: what a crop outside the image shows (a mask's ignore index); None: each crop's own fill.
    ``divisor`` (a 0-dim tensor, e.g. 255): ``out`` is float, the uint8 result cast and divided by it as it is
    written (the last copy does the cast: a zoom-out's fill is written as float(fill) / divisor, never as bytes
    cast later; exactly the values of the uint8 result's ``float(x) / divisor``). ``fills``: a dict the caller
    keeps for a batch's samples (one ``divisor``), where each fill's float form is made once, not per sample
    (:func:`_float_fill`: a dozen torch calls from Python for a fill per channel)."""
    if divisor is not None and post is None and out.is_floating_point() and not src.is_floating_point():
        _run_program_float(src, program, out, nearest, fill, divisor, fills)
        return
    target = out
    if post is not None:
        if not program and src.dim() == 3:
            post.apply_sample(src, out)  # nothing geometric: straight from the view
            return
        target = torch.empty((out.shape[1], out.shape[2], out.shape[0]), dtype=src.dtype, device=src.device)
    x = src
    fh = fw = False  # flips not applied yet: crops mirror their coordinates instead
    done = False
    skip = -1
    for k, (kind, *a) in enumerate(program):
        if k <= skip:
            continue
        if kind == "flip":
            fh, fw = _pending_flips([program[k]], fh, fw)
        elif kind == "crop":
            cfill = fill if fill is not None else (a[4] if len(a) > 4 else 0.0)
            (top, left, h, w), last = _merged_crop(program, k)  # (zoom-out, then IoU crop): one crop, the first's fill
            if last > k:
                k = skip = last
            H, W = x.shape[:2]
            top = H - top - h if fh else top
            left = W - left - w if fw else left
            if 0 <= top and top + h <= H and 0 <= left and left + w <= W:
                x = x[top:top + h, left:left + w]
            else:  # partly outside: a canvas of the fill with the inside part pasted
                t0, t1, l0, l1 = max(top, 0), min(top + h, H), max(left, 0), min(left + w, W)
                rest = program[k + 1:]
                if all(step[0] == "flip" for step in rest) and tuple(target.shape[:2]) == (h, w):
                    # the last step but flips (zoom-out, IoU crop, flip): the target is the canvas, the flips
                    # placing the pasted part (mirrored) and mirroring it; the fill written only around it
                    fh, fw = _pending_flips(rest, fh, fw)
                    a0, a1, b0, b1 = t0 - top, t1 - top, l0 - left, l1 - left  # the part, in the canvas
                    if fh:
                        a0, a1 = h - a1, h - a0
                    if fw:
                        b0, b1 = w - b1, w - b0
                    _fill_around(target, (a0, a1, b0, b1), cfill)  # (no part inside: the fill everywhere)
                    if t1 > t0 and l1 > l0:
                        target[a0:a1, b0:b1] = mirrored(x[t0:t1, l0:l1], fh, fw)
                    done = True
                    break
                canvas = full((h, w, *x.shape[2:]), cfill, x.dtype, x.device)
                if t1 > t0 and l1 > l0:
                    canvas[t0 - top:t1 - top, l0 - left:l1 - left] = x[t0:t1, l0:l1]
                x = canvas
        else:  # resize
            h, w = a
            if x.shape[:2] == (h, w):
                continue
            j = k + 1
            while j < len(program) and program[j][0] == "flip":
                j += 1
            if j < len(program) and program[j][0] == "crop" and _region_ok(x, nearest) and \
                    (not (fh or fw) if nearest else dwarfs((h, w), tuple(program[j][3:5]))):
                # (nearest: the same source pixels as the whole resize, only the crop's made; flips between the
                # resize and the crop mirror the window. A nearest resize does not commute with a flip where
                # (i + 1/2) H / h is whole: not with flips pending from before it)
                fh, fw = _pending_flips(program[k + 1:j], fh, fw)  # the flips between: pending, like the ones before
                top, left, ch, cw = program[j][1:5]
                cfill = fill if fill is not None else (program[j][5] if len(program[j]) > 5 else 0.0)
                top = h - top - ch if fh else top  # the window in the unflipped resize; the flips stay pending
                left = w - left - cw if fw else left
                x = _resized_region(x, (h, w), top, left, ch, cw, nearest, cfill)
                skip = j
                continue
            rest = program[k + 1:]
            # flips after the last resize commute with it (not a nearest one: see above): fold them into the copy
            last = all(step[0] == "flip" for step in rest) and not (nearest and any(step[2] for step in rest))
            if last:
                fh, fw = _pending_flips(rest, fh, fw)
            x = mirrored(x, fh, fw).contiguous()
            fh = fw = False
            x = (_resize_nearest if nearest else _resize_image)(x, h, w, target if last else None)
            if last:
                done = True
                break
    if not done:
        target.copy_(mirrored(x, fh, fw))
    if post is not None:
        post.apply_sample(target, out)


def casts_directly(program: list[tuple], out_hw: tuple[int, int]) -> bool:
    """Whether :func:`run_program` with ``divisor`` writes a sample of ``program`` (its output ``out_hw``)
    straight as float: one crop, or two that merge (zoom-out's canvas, the IoU crop inside it), then flips
    only. Others (a resize: its kernel writes bytes) would go through a uint8 copy of the sample and a
    cast of it out of cache, slower than the torchvision form's own cast in cache-sized pieces: a caller
    leaves those to it."""
    return _direct_crop(program, out_hw) is not None


def _direct_crop(program: list[tuple], out_hw: tuple[int, int]):
    """(top, left, h, w, its fill, the number of crops) of :func:`casts_directly`'s programs, else None."""
    if not program or program[0][0] != "crop":
        return None
    (top, left, h, w), last = _merged_crop(program, 0)  # (as run_program merges a crop inside the crop before it)
    n = last + 1
    if n > 2 or any(st[0] != "flip" for st in program[n:]) or tuple(out_hw) != (h, w):
        return None
    return top, left, h, w, (program[0][5] if len(program[0]) > 5 else 0.0), n


def _merged_crop(program: list[tuple], k: int) -> tuple[tuple[int, int, int, int], int]:
    """The crop ``program[k]`` with every crop right after it that lies inside the crop before it (zoom-out's
    canvas, then the IoU crop inside it) merged into it: ((top, left, h, w) in the input, the index of the last
    step merged). The one rule :func:`run_program` and :func:`casts_directly` both follow."""
    top, left, h, w = program[k][1:5]
    while k + 1 < len(program) and program[k + 1][0] == "crop":
        t2, l2, h2, w2 = program[k + 1][1:5]
        if not (0 <= t2 and t2 + h2 <= h and 0 <= l2 and l2 + w2 <= w):
            break
        top, left, h, w = top + t2, left + l2, h2, w2
        k += 1
    return (top, left, h, w), k


def _run_program_float(src: torch.Tensor, program: list[tuple], out: torch.Tensor, nearest: bool, fill,
                       divisor: torch.Tensor, fills: dict | None = None) -> None:
    """:func:`run_program` into a float ``out``, divided by ``divisor``. A program :func:`casts_directly`: the
    fill written as float around the part of the image the crop holds, that part cast, mirrored and divided in
    place (in cache), as :func:`run_program` places it. Any other: into a uint8 copy of the sample, then one
    cast and division into ``out``."""
    crop = _direct_crop(program, tuple(out.shape[:2])) if out.dim() >= 2 else None
    if crop is None:
        tmp = torch.empty(out.shape, dtype=src.dtype, device=src.device)
        run_program(src, program, tmp, nearest, fill)
        out.copy_(tmp).div_(divisor)
        return
    top, left, h, w, own, n = crop
    fh, fw = _pending_flips(program[n:], False, False)
    H, W = src.shape[:2]
    t0, t1, l0, l1 = max(top, 0), min(top + h, H), max(left, 0), min(left + w, W)
    a0, a1, b0, b1 = t0 - top, t1 - top, l0 - left, l1 - left  # the part, in the output
    if fh:
        a0, a1 = h - a1, h - a0
    if fw:
        b0, b1 = w - b1, w - b0
    _fill_around(out, (a0, a1, b0, b1), _float_fill_of(fill if fill is not None else own, divisor, out, fills))
    if t1 > t0 and l1 > l0:
        out[a0:a1, b0:b1].copy_(mirrored(src[t0:t1, l0:l1], fh, fw)).div_(divisor)


def run_batch(views, programs: list[list[tuple]] | None, out: torch.Tensor, nearest: bool, fill: float,
              post=None) -> torch.Tensor:
    """``views[b]`` (a tensor or array per sample) through ``programs[b]`` (None: none) into ``out[b]``. The
    samples whose program is a crop inside the image (or none), a resize and flips (RandomResizedCrop and flips,
    the classification recipes' geometry; Resize and flips) on CPU uint8 (H, W, C) go through :func:`_crop_resize_rows`, one scripted
    call for all of them (the same ops as :func:`run_program`'s; no GIL); the rest sample by sample."""
    views = [torch.from_numpy(v) if isinstance(v, np.ndarray) else v for v in views]
    simple = bool(programs) and not nearest and _aa is not None and out.device.type == "cpu" and \
        (post is not None or out.dtype == torch.uint8)
    fast, steps, rest = _split_steps(views, programs, simple)
    if fast:
        tmp, scale, shift, last, f32 = None, None, None, False, False
        if post is not None:  # (one (h, w, C) sample in cache between its resize and its float pass)
            tmp = torch.empty((out.shape[2], out.shape[3], out.shape[1]), dtype=torch.uint8)
            scale, shift = post._consts(out.device, out.shape[1])
            last, f32 = post.channels_last, post.dtype == torch.float32
        _crop_resize_rows([views[b] for b in fast], steps, out, fast, tmp, scale, shift, last, f32)
    for b in rest:
        run_program(views[b], programs[b] if programs else [], out[b], nearest, fill, post)
    return out


def _split_steps(views, programs, ok: bool) -> tuple[list[int], list[list[int]], list[int]]:
    """(the samples whose program :func:`_crop_resize_steps` takes, their steps, the other samples); with ``ok``
    False every sample is another."""
    fast, steps, rest = [], [], []
    for b, v in enumerate(views):
        step = _crop_resize_steps(programs[b], v) if ok else None
        if step is None:
            rest.append(b)
        else:
            fast.append(b)
            steps.append(step)
    return fast, steps, rest


def _crop_resize_steps(program: list[tuple], x: torch.Tensor) -> list[int] | None:
    """[top, left, h, w, out h, out w, flip rows, flip columns] where ``program`` is a crop inside ``x`` (a CPU
    uint8 (H, W, C) view), a resize and flips only, or a resize and flips: what :func:`run_program` does with it
    (the flips folded into the crop's contiguous copy, the resize into the output); None otherwise."""
    if x.dtype != torch.uint8 or x.ndim != 3 or x.device.type != "cpu":
        return None
    H, W = x.shape[0], x.shape[1]
    if program and program[0][0] == "resize" and all(step[0] == "flip" for step in program[1:]):
        # a resize and flips (RandomShortestSize, ScaleJitter): the crop is the whole image (run_program folds
        # the flips into the copy the resize reads, or into the copy of a sample already at its size)
        fh, fw = _pending_flips(program[1:], False, False)
        return [0, 0, H, W, program[0][1], program[0][2], int(fh), int(fw)]
    if len(program) < 2 or program[0][0] != "crop" or program[1][0] != "resize" or \
            any(step[0] != "flip" for step in program[2:]):
        return None
    top, left, h, w = program[0][1:5]
    if not (0 <= top and top + h <= H and 0 <= left and left + w <= W):
        return None
    fh, fw = _pending_flips(program[2:], False, False)
    return [top, left, h, w, program[1][1], program[1][2], int(fh), int(fw)]


@nogil
def _crop_resize_rows(views: List[torch.Tensor], steps: List[List[int]], out: torch.Tensor, rows: List[int],
                      tmp: Optional[torch.Tensor], scale: Optional[torch.Tensor], shift: Optional[torch.Tensor],
                      channels_last: bool, float32: bool) -> None:
    """Sample ``views[i]`` (uint8 (H, W, C)) cropped, flipped and resized as ``steps[i]``
    (:func:`_crop_resize_steps`) into ``out[rows[i]]``; with ``tmp`` (h, w, C) into it, then through the float
    pass (``scale``, ``shift``: :class:`~dsc.transforms.photometric.PixelPost`'s) into the (C, h, w) slot.
    Scripted (dsc.nogil): :func:`run_program`'s ~10 torch calls a sample never reach Python."""
    for i in range(len(views)):
        _crop_resize_into(views[i], steps[i], out[rows[i]] if tmp is None else tmp)
        if tmp is not None and scale is not None and shift is not None:
            post_row(tmp, out[rows[i]], scale, shift, channels_last, float32)


def resize_ragged(views: list[torch.Tensor], programs: list[list[tuple]], flat: torch.Tensor, offsets: list[int],
                  shapes: list[tuple], nearest: bool = False) -> list[int]:
    """The samples ``views[b]`` whose program :func:`_crop_resize_steps` takes (a resize or a crop and a resize,
    then flips: multiscale, scale jitter) run into their places ``flat[offsets[b]:offsets[b + 1]]`` (of
    ``shapes[b]``) of a packed ragged uint8 batch by one scripted call (:func:`_crop_resize_packed`: the same ops
    as :func:`run_program`'s, ~10 torch calls a sample that never reach Python); returns the others' indices,
    for :func:`run_program` (all of them for a ``nearest`` role: the scripted resize is bilinear)."""
    fast, steps, rest = _split_steps(views, programs, not nearest and _aa is not None and flat.device.type == "cpu"
                                     and flat.dtype == torch.uint8)
    if fast:
        _crop_resize_packed([views[b] for b in fast], steps, flat, [offsets[b] for b in fast],
                            [list(shapes[b]) for b in fast])
    return rest


@nogil
def _crop_resize_packed(views: List[torch.Tensor], steps: List[List[int]], flat: torch.Tensor, starts: List[int],
                        shapes: List[List[int]]) -> None:
    """Sample ``views[i]`` cropped, flipped and resized as ``steps[i]`` (:func:`_crop_resize_steps`) into
    ``flat[starts[i]:]`` viewed as ``shapes[i]`` (h, w, C): :func:`_crop_resize_rows`'s ops for a packed ragged
    batch."""
    for i in range(len(views)):
        shp = shapes[i]
        _crop_resize_into(views[i], steps[i], flat[starts[i]:starts[i] + shp[0] * shp[1] * shp[2]].view(shp))


def _crop_resize_into(view: torch.Tensor, s: List[int], target: torch.Tensor) -> None:
    """One sample of :func:`_crop_resize_rows` / :func:`_crop_resize_packed`: ``view`` cropped and flipped as
    ``s`` (:func:`_crop_resize_steps`) and resized into ``target`` (h, w, C) (scriptable)."""
    top, left, h, w, oh, ow = s[0], s[1], s[2], s[3], s[4], s[5]
    x = mirrored(view[top:top + h, left:left + w], s[6] != 0, s[7] != 0)
    if h == oh and w == ow:
        target.copy_(x)
    else:
        src = dense_hwc(x).permute(2, 0, 1).unsqueeze(0)  # (a fresh dense copy of any other view)
        torch.ops.aten._upsample_bilinear2d_aa(src, [oh, ow], False, None, None,
                                               out=target.permute(2, 0, 1).unsqueeze(0))
