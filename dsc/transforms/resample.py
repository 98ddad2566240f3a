"""Apply a chain of geometric ops to a gathered batch: per sample through the fused executor when every
op has steps (``fused.py``), else one batched ``grid_sample`` pass through the composed maps (antialiased
by supersampling where it shrinks); boxes through the inverse maps either way."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..errors import ConfigError
from ..formats.fields import Schema
from ..formats.fields.base import drop_companions
from .fused import casts_directly, full, plan_chain, resize_ragged, run_batch, run_program
from .geometric import Geometric
from .warp_gather import affine_bilinear
from .objects import move_objects, transform_boxes  # noqa: F401 - (per-object data moves in objects.py)

def _canvas(batch: dict, key: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, Hm, Wm[, C]) canvas and (B, 2) true sizes of an image-like key, from a fixed, padded or packed
    batch."""
    img = batch[key]
    if f"{key}_offsets" in batch:  # packed ragged -> padded canvas
        shapes, offsets = batch[f"{key}_shapes"].long(), batch[f"{key}_offsets"].tolist()
        B = len(shapes)
        tail = tuple(int(v) for v in shapes[0, 2:]) if B else ()
        hw = shapes[:, :2].max(0).values.tolist() if B else [0, 0]
        canvas = torch.zeros((B, *hw, *tail), dtype=img.dtype, device=img.device)
        for b, shp in enumerate(shapes.tolist()):
            canvas[b, :shp[0], :shp[1]] = img[offsets[b]:offsets[b + 1]].view(*shp)
        return canvas, shapes[:, :2].cpu()
    if f"{key}_sizes" in batch:
        return img, batch[f"{key}_sizes"].long().cpu()
    if img.is_floating_point() or img.dim() not in (3, 4):
        raise ConfigError(f"geometric transforms take the integer (B, H, W[, C]) {key!r} a dsc batch holds; "
                          f"put them before ToFloat")
    B, H, W = img.shape[:3]
    return img, torch.tensor([[H, W]], dtype=torch.long).expand(B, 2)


def _views(batch: dict, key: str) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Per-sample views (H_b, W_b[, C]) of an image-like key and the (B, 2) sizes, whatever its form."""
    img = batch[key]
    if img.is_floating_point():
        raise ConfigError(f"geometric transforms take the integer {key!r} a dsc batch holds; put them before ToFloat")
    if f"{key}_offsets" in batch:
        o, shapes = batch[f"{key}_offsets"].tolist(), batch[f"{key}_shapes"]
        views = [img[o[b]:o[b + 1]].view(*shp) for b, shp in enumerate(shapes.tolist())]
        return views, shapes[:, :2].long().cpu()
    if f"{key}_sizes" in batch:
        sizes = batch[f"{key}_sizes"].long().cpu()
        return [img[b, :h, :w] for b, (h, w) in enumerate(sizes.tolist())], sizes
    canvas, sizes = _canvas(batch, key)
    return list(canvas), sizes


def _source_coords(M: torch.Tensor, src_sizes: torch.Tensor, out_h: int, out_w: int, dev, dtype):
    """Source pixel coordinates of every output pixel centre, (B, H|1, W) and (B, H, W|1) (separable when
    every map is axis-aligned), and which lie inside their sample's own image."""
    B = len(M)
    Md = M.to(dev, dtype)
    w = src_sizes[:, 1].to(dev, dtype).view(B, 1, 1)
    h = src_sizes[:, 0].to(dev, dtype).view(B, 1, 1)
    xo = (torch.arange(out_w, device=dev, dtype=dtype) + 0.5).view(1, 1, out_w)
    yo = (torch.arange(out_h, device=dev, dtype=dtype) + 0.5).view(1, out_h, 1)
    m = Md.view(B, 3, 3, 1, 1)
    if bool((M[:, 0, 1] == 0).all() and (M[:, 1, 0] == 0).all()):  # axis-aligned: separable, (B,1,W) + (B,H,1)
        xi, yi = m[:, 0, 0] * xo + m[:, 0, 2], m[:, 1, 1] * yo + m[:, 1, 2]
    else:
        xi = m[:, 0, 0] * xo + m[:, 0, 1] * yo + m[:, 0, 2]
        yi = m[:, 1, 0] * xo + m[:, 1, 1] * yo + m[:, 1, 2]
    return xi, yi, w, h


def _nearest(canvas: torch.Tensor, src_sizes: torch.Tensor, M: torch.Tensor, out_h: int, out_w: int,
             fill: float) -> torch.Tensor:
    """Nearest-neighbour resampling (masks: class ids are never blended): the source pixel that contains
    each output pixel centre, ``fill`` outside the sample's image. Any integer dtype."""
    B = canvas.shape[0]
    dev = canvas.device
    xi, yi, w, h = _source_coords(M, src_sizes, out_h, out_w, dev, torch.float64)
    valid = (xi >= 0) & (xi < w) & (yi >= 0) & (yi < h)
    xs = torch.minimum(xi.floor().clamp(min=0), w - 1).long()
    ys = torch.minimum(yi.floor().clamp(min=0), h - 1).long()
    xs, ys, valid = torch.broadcast_tensors(xs, ys, valid)
    b = torch.arange(B, device=dev).view(B, 1, 1)
    out = canvas[b, ys, xs]
    if out.dim() == 4:
        valid = valid.unsqueeze(-1)
    return torch.where(valid, out, _fill_like(fill, out)).contiguous()  # no branch


def _fill_like(fill, out: torch.Tensor) -> torch.Tensor:
    """``fill`` (a number, or one per channel) broadcastable against ``out`` (..., C) or a mask."""
    if isinstance(fill, (tuple, list)):
        return full((1,) * (out.dim() - 1) + (out.shape[-1],), fill, out.dtype, out.device)
    return torch.full((), fill, dtype=out.dtype, device=out.device)


def _warp(canvas: torch.Tensor, src_sizes: torch.Tensor, M: torch.Tensor, out_h: int, out_w: int, fill,
          mode: str) -> torch.Tensor:
    """torchvision's affine resampling (``F.affine``: ``grid_sample``, align_corners=False, no antialiasing)
    straight from the integer canvas (B, Hm, Wm[, C]): nearest gathers the output's pixels, bilinear converts
    to float only the part of each image its output reads. ``nearest``: the pixel nearest each output pixel centre's source point, ``fill`` where it
    lies outside the sample's image; ``bilinear``: the four neighbours (those outside count as zeros)
    weighted, blended with ``fill`` by the weight that lay inside (torchvision's mask channel:
    (S - fill) * inside + fill), rounded."""
    B, Hm, Wm = canvas.shape[:3]
    dev = canvas.device
    squeeze = canvas.dim() == 3
    C = 1 if squeeze else canvas.shape[3]
    xi, yi, w, h = _source_coords(M, src_sizes, out_h, out_w, dev, torch.float32)
    if mode == "nearest":
        u, v = torch.broadcast_tensors(xi - 0.5, yi - 0.5)  # pixel-index coordinates of the source points
        rows = canvas.reshape(B * Hm * Wm, C)  # one row of C values per pixel: gathered by a 1-D index
        base = (torch.arange(B, device=dev) * (Hm * Wm)).view(B, 1, 1)
        xs, ys = torch.round(u), torch.round(v)  # grid_sample's nearest: half to even
        inside = (xs >= 0) & (xs <= w - 1) & (ys >= 0) & (ys <= h - 1)
        idx = (ys.clamp_(0, Hm - 1).long() * Wm + xs.clamp_(0, Wm - 1).long() + base).view(-1)
        out = rows.index_select(0, idx).view(B, out_h, out_w, C)
        out = torch.where(inside.unsqueeze(-1), out, _fill_like(fill, out))
        return (out[..., 0] if squeeze else out).contiguous()
    # bilinear: grid_sample over the image (zeros outside, as torchvision's), and the weight that lay inside
    # the sample's own image, which factors into x and y parts (torchvision gets it from a ones channel)
    # (per axis: 1 within [0, w - 1], falling linearly to 0 over the pixel beyond each edge). Sample by sample,
    # straight into the output: a sample whose source points all lie within its image (the corners of the
    # affine grid say so) has that weight 1 everywhere, and skips the blend with the fill (as torchvision's
    # mask blend leaves it, within float rounding).
    img = canvas.unsqueeze(-1) if squeeze else canvas
    gx, gy = xi.expand(B, out_h, out_w), yi.expand(B, out_h, out_w)
    out = torch.empty((B, out_h, out_w, C), dtype=canvas.dtype, device=dev)
    f = _fill_like(fill, out).float().reshape(-1)  # (C,) or (1,)
    hw = src_sizes.tolist()
    # the source points are an affine map of the output grid: their extremes lie at its four corners
    corners = (torch.tensor([0, 0, out_h - 1, out_h - 1]), torch.tensor([0, out_w - 1, 0, out_w - 1]))
    ext = torch.stack([gx[:, corners[0], corners[1]], gy[:, corners[0], corners[1]]], 1).to(torch.float64)
    if bool(ext.isnan().any()):
        raise ConfigError("RandomAffine: a sample's map has no inverse (its scale is 0 or too small to invert): "
                          "give scale a range of positive numbers, e.g. scale=(0.5, 1.5)")
    # (B, x|y, min|max), output pixel centres; bounded (a map that scales by 1e-20 sends the grid beyond int64,
    # which the scripted loop's int() refuses: at 2^40 a sample is as far outside, all fill)
    ext = torch.stack([ext.amin(2), ext.amax(2)], 2).clamp_(-2.0 ** 40, 2.0 ** 40).tolist()
    # (sample by sample, scripted on the CPU: warp_gather; on a device the plain ops, as before)
    affine_bilinear(img, xi, yi, hw, ext, f, out)
    return out[..., 0] if squeeze else out


def _resampler(plan, nearest: bool):
    """The batched pass's resampling for a role: masks nearest; images as the chain's op says (RandomAffine:
    torchvision's nearest or bilinear), else antialiased bilinear."""
    mode = getattr(plan, "interpolation", None)
    if mode is not None:
        return lambda *a: _warp(*a, "nearest" if nearest else mode)
    return _nearest if nearest else _resample


def _resample(canvas: torch.Tensor, src_sizes: torch.Tensor, M: torch.Tensor, out_h: int, out_w: int,
              fill: float) -> torch.Tensor:
    """Bilinear resampling of every sample through its map with ``grid_sample``, antialiased where the map
    shrinks: each output pixel averages n x n bilinear taps spread over its footprint in the source (n = the
    shrink factor, rounded up, at most 8), which approximates the widened filter of an antialiased resize.

    A point outside the sample's own image (letterbox bars, a crop larger than the image) gets ``fill``;
    points inside are clamped to the sample's outermost pixel centres, so edges replicate like
    ``F.interpolate`` instead of blending with the zeros of a padded canvas."""
    B, Hm, Wm, C = canvas.shape
    src = canvas.permute(0, 3, 1, 2).float()
    taps = [min(8, max(1, math.ceil(float(M[:, :2, a].norm(dim=1).max()) - 1e-9))) for a in (0, 1)]
    cx, cy, w, h = _source_coords(M, src_sizes, out_h, out_w, canvas.device, torch.float32)
    valid = (cx >= 0) & (cx <= w) & (cy >= 0) & (cy <= h)  # inside / outside: decided at the pixel centre
    out = None
    for i in range(taps[0]):
        for j in range(taps[1]):
            shift = torch.tensor([[1.0, 0, (i + 0.5) / taps[0] - 0.5], [0, 1.0, (j + 0.5) / taps[1] - 0.5],
                                  [0, 0, 1.0]], dtype=torch.float64)
            xi, yi, _, _ = _source_coords(M @ shift, src_sizes, out_h, out_w, canvas.device, torch.float32)
            xi = torch.minimum(torch.clamp(xi, min=0.5), w - 0.5) * (2.0 / Wm) - 1.0
            yi = torch.minimum(torch.clamp(yi, min=0.5), h - 0.5) * (2.0 / Hm) - 1.0
            xi, yi = torch.broadcast_tensors(xi, yi)
            tap = F.grid_sample(src, torch.stack([xi, yi], -1), mode="bilinear", padding_mode="border",
                                align_corners=False)
            out = tap if out is None else out.add_(tap)
    out.div_(taps[0] * taps[1])
    f = _fill_like(fill, out.permute(0, 2, 3, 1)).permute(0, 3, 1, 2) if isinstance(fill, (tuple, list)) else fill
    out = torch.where(valid.expand(B, out_h, out_w).unsqueeze(1), out, f if torch.is_tensor(f) else
                      torch.full_like(out, f))
    return out.round_().clamp_(0, 255).to(canvas.dtype).permute(0, 2, 3, 1).contiguous()


def apply_geometric(ops: list[Geometric], batch: dict, gen: torch.Generator, schema: Schema | None = None,
                    alloc=None, name: str = "geometric", divisor: torch.Tensor | None = None) -> dict:
    """The chain ``ops`` on every image-like key the schema names (the image bilinear, masks nearest with
    their ignore fill) and on the boxes, from one draw of the parameters per batch. ``alloc(name, shape,
    dtype)``: where a chain that leaves samples at several sizes writes its packed pixels (the Loader's ring:
    buffers reused batch after batch, no fresh pages to fault in; default new tensors), under ``name`` + the
    key (a name of its own per stage: a later stage reads this one's output). ``divisor`` (a 0-dim tensor): a chain
    that leaves uint8 images at several sizes by crops and flips only (zoom-out, IoU crop: where
    :func:`fused.casts_directly`; a resize's are left to the caller's cast) on the CPU writes its packed
    ``image`` as float32 divided by it instead (each sample cast as it is written: :func:`fused.run_program`'s
    ``divisor``); elsewhere the image stays as it is (the caller checks its dtype)."""
    _check_batch(batch)
    schema = schema if schema is not None else getattr(batch, "schema", None)
    if schema is None:
        extra = sorted(k for k in ("boxes", "mask") if k in batch)
        if extra:
            raise ConfigError(f"this batch has {' and '.join(extra)} but no schema saying how they move; pass "
                              f"schema=ds.schema (a dict rebuilt from a dsc batch loses it: use batch.to(device))")
        schema = Schema.default()
    pixels = {k: r for k, r in schema.pixels().items() if k in batch}
    if "image" not in pixels:
        raise ConfigError("geometric transforms take a batch (ds.get_batch(...) or a Loader's), with its 'image'")
    boxes = (batch["boxes"], batch["box_offsets"]) if "boxes" in batch and "box_offsets" in batch else None
    return apply_plan(plan_chain(ops, _views(batch, "image")[1], gen, boxes=boxes), batch, schema, alloc, name,
                      divisor)


def apply_plan(plan, batch: dict, schema: Schema, alloc=None, name: str = "geometric",
               divisor: torch.Tensor | None = None) -> dict:
    """A drawn chain (``fused.ChainPlan``) on every image-like key of a packed batch and on its objects
    (``alloc``, ``name``, ``divisor``: as :func:`apply_geometric`'s)."""
    pixels = {k: r for k, r in schema.pixels().items() if k in batch}
    if plan.out is None and torch.equal(plan.out_sizes.long(), plan.sizes.long()):
        # a size-keeping chain on mixed sizes (flips): each sample at its own size, in the batch's own form
        for key, role in pixels.items():
            _each_own_size(batch, key, role, plan)
        move_objects(batch, plan, schema)
        return batch
    if plan.out is None:  # samples of several sizes (scale jitter, zoom-out): a packed ragged batch out
        return _apply_ragged(plan, batch, pixels, schema, alloc, name, divisor)
    out_h, out_w = plan.out
    for key, role in pixels.items():
        nearest = role.resample == "nearest"
        if plan.programs is not None:
            views = _views(batch, key)[0]
            tail = (tuple(views[0].shape[2:]) if views else role.tail if f"{key}_offsets" in batch
                    else tuple(batch[key].shape[3:]))
            out = run_batch(views, plan.programs, torch.empty((len(views), out_h, out_w, *tail),
                                                              dtype=batch[key].dtype, device=batch[key].device),
                            nearest, role.fill)
        else:
            fill = plan.fill if role.fill is None else role.fill
            resample = _resampler(plan, nearest)
            if f"{key}_offsets" in batch and len(batch[f"{key}_offsets"]) > 1:
                # packed ragged: one sample at a time, never a canvas of the largest height by the largest width
                # (a 1x4000 and a 4000x1 image would make it 4000x4000 per sample)
                views, key_sizes = _views(batch, key)
                out = torch.cat([resample(v.unsqueeze(0), key_sizes[b:b + 1], plan.matrices[b:b + 1], out_h, out_w,
                                          fill) for b, v in enumerate(views)])
            else:
                canvas, key_sizes = _canvas(batch, key)
                out = resample(canvas, key_sizes, plan.matrices, out_h, out_w, fill)
        drop_companions(batch, key)
        batch[key] = out
    move_objects(batch, plan, schema)  # boxes, per-box rows, object masks, keypoints
    return batch


def move_sample(view: torch.Tensor, role, plan, b: int, out_hw: tuple[int, int]) -> torch.Tensor:
    """THE per-sample mover: sample ``b``'s pixels of one role (``view`` (H, W[, C])) through the plan's
    geometry into a new (h, w[, C]) tensor: its integer program when it has one, else its matrix (bilinear
    or nearest by the role, the role's fill outside, else the op's)."""
    nearest = role.resample == "nearest"
    h, w = out_hw
    if plan.programs is not None:
        out = torch.empty((h, w, *view.shape[2:]), dtype=view.dtype, device=view.device)
        run_program(view, plan.programs[b], out, nearest, role.fill)
        return out
    fill = plan.fill if role.fill is None else role.fill
    size = torch.tensor([list(view.shape[:2])])
    return _resampler(plan, nearest)(view.unsqueeze(0), size, plan.matrices[b:b + 1], h, w, fill)[0]


def pack(batch: dict, key: str, samples: list[torch.Tensor]) -> None:
    """Per-sample tensors as the packed ragged form: flat ``key``, ``key_offsets`` (B+1,), ``key_shapes``."""
    drop_companions(batch, key)
    dev = batch[key].device
    dtype = batch[key].dtype
    sizes = [s.numel() for s in samples]
    offsets = torch.zeros(len(samples) + 1, dtype=torch.int64)
    torch.cumsum(torch.tensor(sizes, dtype=torch.int64), 0, out=offsets[1:])
    batch[key] = torch.cat([s.reshape(-1) for s in samples]) if samples else torch.empty(0, dtype=dtype, device=dev)
    batch[f"{key}_offsets"] = offsets.to(dev)
    ndim = max((s.dim() for s in samples), default=3)
    batch[f"{key}_shapes"] = torch.tensor([list(s.shape) for s in samples], dtype=torch.int64, device=dev).view(-1, ndim)


def _apply_ragged(plan, batch: dict, pixels: dict, schema, alloc=None, name: str = "geometric",
                  divisor: torch.Tensor | None = None) -> dict:
    """A chain that leaves samples at several sizes (flips on mixed sizes, scale jitter, zoom-out): every
    pixel role moved sample by sample (:func:`move_sample`), the batch handed back packed ragged (the
    programs' output into ``alloc``'s buffer ``{name}_{key}`` when given; with ``divisor``, a CPU uint8
    ``image`` as float32 divided by it, into ``{name}_{key}:float``)."""
    out_sizes = plan.out_sizes.tolist()
    for key, role in pixels.items():
        views = _views(batch, key)[0]
        if plan.programs is None or not views:
            pack(batch, key, [move_sample(v, role, plan, b, tuple(out_sizes[b])) for b, v in enumerate(views)])
            continue
        # the programs write each sample straight into its place in the packed output (no second copy)
        tail = tuple(views[0].shape[2:])
        shapes = [(int(h), int(w), *tail) for h, w in out_sizes]
        sizes = torch.tensor([math.prod(shp) for shp in shapes], dtype=torch.int64)
        offsets = torch.zeros(len(shapes) + 1, dtype=torch.int64)
        torch.cumsum(sizes, 0, out=offsets[1:])
        dev = batch[key].device
        cast = divisor if key == "image" and dev.type == "cpu" and batch[key].dtype == torch.uint8 and \
            all(casts_directly(p, hw) for p, hw in zip(plan.programs, out_sizes)) else None
        dtype, buf = (torch.float32, f"{name}_{key}:float") if cast is not None else (batch[key].dtype, f"{name}_{key}")
        if alloc is not None and dev.type == "cpu":  # (the ring's buffers are host memory)
            flat = alloc(buf, (int(offsets[-1]),), dtype)
        else:
            flat = torch.empty(int(offsets[-1]), dtype=dtype, device=dev)
        o = offsets.tolist()
        fills: dict = {}  # (each fill's float form made once for the batch: fused._float_fill_of)
        nearest = role.resample == "nearest"
        # resizes and flips (multiscale, scale jitter) by one scripted call for the batch; the rest sample by sample
        rest = range(len(views)) if cast is not None else resize_ragged(views, plan.programs, flat, o, shapes, nearest)
        for b in rest:
            run_program(views[b], plan.programs[b], flat[o[b]:o[b + 1]].view(shapes[b]), nearest, role.fill,
                        divisor=cast, fills=fills)
        drop_companions(batch, key)
        batch[key] = flat
        batch[f"{key}_offsets"] = offsets.to(flat.device)
        batch[f"{key}_shapes"] = torch.tensor(shapes, dtype=torch.int64, device=flat.device).view(-1, 2 + len(tail))
    move_objects(batch, plan, schema)  # boxes, per-box rows, object masks, keypoints
    return batch


def _each_own_size(batch: dict, key: str, role, plan) -> None:
    """``batch[key]`` through a chain that keeps every sample's size, in the form it came in: each sample
    written straight into its place in a new tensor of the same layout."""
    views, sizes = _views(batch, key)
    nearest = role.resample == "nearest"
    new = torch.empty_like(batch[key]) if f"{key}_sizes" not in batch else batch[key].clone()
    if f"{key}_offsets" in batch:
        o = batch[f"{key}_offsets"].tolist()
        dest = [new[o[b]:o[b + 1]].view(v.shape) for b, v in enumerate(views)]
    else:
        dest = [new[b, :v.shape[0], :v.shape[1]] for b, v in enumerate(views)]
    for b, v in enumerate(views):
        h, w = (int(x) for x in sizes[b].tolist())
        if plan.programs is not None:
            out = dest[b] if dest[b].is_contiguous() else torch.empty(v.shape, dtype=v.dtype, device=v.device)
            run_program(v, plan.programs[b], out, nearest, role.fill)
            if out is not dest[b]:
                dest[b].copy_(out)
        else:
            fill = plan.fill if role.fill is None else role.fill
            dest[b].copy_(_resampler(plan, nearest)(v.unsqueeze(0), sizes[b:b + 1], plan.matrices[b:b + 1], h, w,
                                                    fill)[0])
    batch[key] = new


def _check_batch(batch: dict) -> None:
    if not isinstance(batch, dict) or "image" not in batch or not isinstance(batch["image"], torch.Tensor):
        raise ConfigError("transforms take a batch dict (ds.get_batch(...) or a Loader's), not a sample or a list "
                          "of samples")
    sample = any(isinstance(batch.get(k), (int, tuple)) for k in ("index", "label", "image_id", "orig_size"))
    if sample or batch["image"].dim() < 1 or ("image_offsets" not in batch and batch["image"].dim() < 3):
        raise ConfigError("transforms take a batch dict (ds.get_batch(...) or a Loader's), not a sample")
    if "targets" in batch or "box_mask" in batch:
        raise ConfigError("transforms move boxes in the packed form: gather with boxes='packed' (the default); the "
                          "Loader makes padded or list batches after its transforms")
