"""Apply a chain of geometric ops to a batch: one resampling pass for the pixels, the inverse map for
the boxes."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..errors import DscError
from ..formats.fields import Schema
from .geometric import Geometric, Letterbox

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
        raise DscError(f"geometric transforms take the integer (B, H, W[, C]) {key!r} a dsc batch holds; "
                       f"put them before ToFloat")
    B, H, W = img.shape[:3]
    return img, torch.tensor([[H, W]], dtype=torch.long).expand(B, 2)


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
    if not bool(valid.all()):
        if out.dim() == 4:
            valid = valid.unsqueeze(-1)
        out = torch.where(valid, out, torch.full((), fill, dtype=out.dtype, device=dev))
    return out.contiguous()


def _resample(canvas: torch.Tensor, src_sizes: torch.Tensor, M: torch.Tensor, out_h: int, out_w: int,
              fill: float, to_float: bool) -> torch.Tensor:
    """Bilinear resampling of every sample through its map in one ``grid_sample`` call.

    Each output pixel centre is mapped to source pixel coordinates; a point outside the sample's own
    image (letterbox bars, a crop larger than the image) gets ``fill``; points inside are clamped to the
    sample's outermost pixel centres, so edges replicate like ``F.interpolate`` instead of blending with
    the zeros of a padded canvas."""
    B, Hm, Wm, C = canvas.shape
    xi, yi, w, h = _source_coords(M, src_sizes, out_h, out_w, canvas.device, torch.float32)
    valid = (xi >= 0) & (xi <= w) & (yi >= 0) & (yi <= h)
    xi = torch.minimum(torch.clamp(xi, min=0.5), w - 0.5) * (2.0 / Wm) - 1.0
    yi = torch.minimum(torch.clamp(yi, min=0.5), h - 0.5) * (2.0 / Hm) - 1.0
    xi, yi = torch.broadcast_tensors(xi, yi)
    grid = torch.stack([xi, yi], -1)
    out = F.grid_sample(canvas.permute(0, 3, 1, 2).float(), grid, mode="bilinear", padding_mode="border",
                        align_corners=False)
    if not bool(valid.all()):
        out = torch.where(valid.expand(B, out_h, out_w).unsqueeze(1), out, torch.full_like(out, fill))
    if to_float:
        return out.div_(255.0)
    return out.round_().clamp_(0, 255).to(torch.uint8).permute(0, 2, 3, 1).contiguous()


def _exact_indices(M, sizes, out_h, out_w):
    """When the map is a pure integer shift / flip inside every image, the source pixel indices."""
    sx, sy, tx, ty = M[:, 0, 0], M[:, 1, 1], M[:, 0, 2], M[:, 1, 2]
    if not (torch.all(M[:, 0, 1] == 0) and torch.all(M[:, 1, 0] == 0)
            and torch.all(sx.abs() == 1) and torch.all(sy.abs() == 1)
            and torch.all(tx == tx.round()) and torch.all(ty == ty.round())):
        return None
    xs = (sx[:, None] * (torch.arange(out_w, dtype=torch.float64) + 0.5) + tx[:, None] - 0.5).long()
    ys = (sy[:, None] * (torch.arange(out_h, dtype=torch.float64) + 0.5) + ty[:, None] - 0.5).long()
    if xs.min() < 0 or ys.min() < 0 or (xs >= sizes[:, 1:2]).any() or (ys >= sizes[:, 0:1]).any():
        return None
    return ys, xs


def apply_geometric(ops: list[Geometric], batch: dict, gen: torch.Generator, to_float: bool = False,
                    schema: Schema | None = None) -> dict:
    """The chain ``ops`` on every image-like key the schema names (the image bilinear, masks nearest with
    their ignore fill) and on the boxes, through one composed map per sample."""
    schema = schema if schema is not None else (getattr(batch, "schema", None) or Schema.default())
    pixels = {k: r for k, r in schema.pixels().items() if k in batch}
    if "image" not in pixels:
        raise DscError("geometric transforms need the batch's 'image'")
    src_sizes = _canvas(batch, "image")[1]
    sizes = src_sizes
    B = len(sizes)
    M = torch.eye(3, dtype=torch.float64).expand(B, 3, 3).clone()
    fill = 0.0
    for op in ops:
        m, sizes_new = op.plan(sizes, gen)
        M = M @ m
        if isinstance(op, Letterbox):
            fill = float(op.fill)
        sizes = sizes_new
    if not bool((sizes == sizes[0]).all()):
        raise DscError("the geometric transforms leave samples at different sizes; end the chain with a "
                       "fixed-size op (RandomResizedCrop, CenterCrop, Letterbox, Resize((h, w)))")
    out_h, out_w = (int(v) for v in sizes[0])
    exact = _exact_indices(M, src_sizes, out_h, out_w)
    for key, role in pixels.items():
        canvas, key_sizes = _canvas(batch, key)
        dev = canvas.device
        if exact is not None:
            ys, xs = (t.to(dev) for t in exact)
            b = torch.arange(B, device=dev)[:, None, None]
            out = canvas[b, ys[:, :, None], xs[:, None, :]]
            if key == "image" and to_float:
                out = out.permute(0, 3, 1, 2).float().div_(255.0)
        elif role.resample == "nearest":
            out = _nearest(canvas, key_sizes, M, out_h, out_w, fill if role.fill is None else role.fill)
        else:
            out = _resample(canvas, key_sizes, M, out_h, out_w, fill if role.fill is None else role.fill,
                            to_float and key == "image")
        for suffix in ("_offsets", "_shapes", "_sizes"):
            batch.pop(key + suffix, None)
        batch[key] = out
    if "boxes" in batch:
        _transform_boxes(batch, M, out_w, out_h, schema.box_rows())
    return batch


def _transform_boxes(batch: dict, M: torch.Tensor, out_w: int, out_h: int, box_keys) -> None:
    if "box_offsets" not in batch:
        raise DscError("transforms move boxes in the packed form: use boxes='packed' (the default)")
    offsets = batch["box_offsets"]
    dev = batch["boxes"].device
    box_keys = [k for k in box_keys if k in batch]
    counts = (offsets[1:] - offsets[:-1]).cpu()
    fwd = torch.linalg.inv(M).to(dev)  # input pixel -> output pixel
    sample = torch.repeat_interleave(torch.arange(len(counts)), counts).to(dev)
    b = batch["boxes"].double()
    xs = torch.stack([b[:, 0], b[:, 2], b[:, 0], b[:, 2]], 1)
    ys = torch.stack([b[:, 1], b[:, 1], b[:, 3], b[:, 3]], 1)
    f = fwd[sample]
    nx = f[:, 0, 0:1] * xs + f[:, 0, 1:2] * ys + f[:, 0, 2:3]
    ny = f[:, 1, 0:1] * xs + f[:, 1, 1:2] * ys + f[:, 1, 2:3]
    nb = torch.stack([nx.amin(1).clamp(0, out_w), ny.amin(1).clamp(0, out_h),
                      nx.amax(1).clamp(0, out_w), ny.amax(1).clamp(0, out_h)], 1)
    keep = (nb[:, 2] > nb[:, 0]) & (nb[:, 3] > nb[:, 1])
    batch["boxes"] = nb.to(batch["boxes"].dtype)
    for k in box_keys:
        batch[k] = batch[k][keep]
    new_counts = torch.zeros(len(counts), dtype=torch.int64, device=dev).index_add_(0, sample, keep.long())
    new_offsets = torch.zeros(len(counts) + 1, dtype=torch.int64, device=dev)
    torch.cumsum(new_counts, 0, out=new_offsets[1:])
    batch["box_offsets"] = new_offsets
