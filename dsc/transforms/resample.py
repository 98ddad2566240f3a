"""Apply a chain of geometric ops to a batch: one resampling pass for the pixels, the inverse map for
the boxes."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..errors import DscError
from .geometric import Geometric, Letterbox

PER_SAMPLE_KEYS = {"image", "label", "index", "image_id", "orig_size", "image_sizes", "image_shapes",
                   "image_offsets", "box_offsets", "box_mask", "box_counts", "targets"}


def _images_and_sizes(batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, Hm, Wm, C) canvas and (B, 2) true sizes, from a fixed, padded or packed batch."""
    img = batch["image"]
    if "image_offsets" in batch:  # packed ragged -> padded canvas
        shapes, offsets = batch["image_shapes"].long(), batch["image_offsets"].tolist()
        B = len(shapes)
        canvas = torch.zeros((B, int(shapes[:, 0].max()), int(shapes[:, 1].max()), int(shapes[0, 2])),
                             dtype=img.dtype, device=img.device)
        for b, (h, w, c) in enumerate(shapes.tolist()):
            canvas[b, :h, :w] = img[offsets[b]:offsets[b + 1]].view(h, w, c)
        return canvas, shapes[:, :2].cpu()
    if "image_sizes" in batch:
        return img, batch["image_sizes"].long().cpu()
    if img.dtype != torch.uint8 or img.dim() != 4:
        raise DscError("geometric transforms take the uint8 (B, H, W, C) image a dsc batch holds; "
                       "put them before ToFloat")
    B, H, W, _ = img.shape
    return img, torch.tensor([[H, W]], dtype=torch.long).expand(B, 2)


def _resample(canvas: torch.Tensor, src_sizes: torch.Tensor, M: torch.Tensor, out_h: int, out_w: int,
              fill: float, to_float: bool) -> torch.Tensor:
    """Bilinear resampling of every sample through its map in one ``grid_sample`` call.

    Each output pixel centre is mapped to source pixel coordinates; a point outside the sample's own
    image (letterbox bars, a crop larger than the image) gets ``fill``; points inside are clamped to the
    sample's outermost pixel centres, so edges replicate like ``F.interpolate`` instead of blending with
    the zeros of a padded canvas."""
    B, Hm, Wm, C = canvas.shape
    dev = canvas.device
    Md = M.to(dev, torch.float32)
    w = src_sizes[:, 1].to(dev, torch.float32).view(B, 1, 1)
    h = src_sizes[:, 0].to(dev, torch.float32).view(B, 1, 1)
    xo = (torch.arange(out_w, device=dev, dtype=torch.float32) + 0.5).view(1, 1, out_w)
    yo = (torch.arange(out_h, device=dev, dtype=torch.float32) + 0.5).view(1, out_h, 1)
    m = Md.view(B, 3, 3, 1, 1)
    if bool((M[:, 0, 1] == 0).all() and (M[:, 1, 0] == 0).all()):  # axis-aligned: separable, (B,1,W) + (B,H,1)
        xi, yi = m[:, 0, 0] * xo + m[:, 0, 2], m[:, 1, 1] * yo + m[:, 1, 2]
    else:
        xi = m[:, 0, 0] * xo + m[:, 0, 1] * yo + m[:, 0, 2]
        yi = m[:, 1, 0] * xo + m[:, 1, 1] * yo + m[:, 1, 2]
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
                    box_keys=None) -> dict:
    canvas, src_sizes = _images_and_sizes(batch)
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
    dev = canvas.device
    exact = _exact_indices(M, src_sizes, out_h, out_w)
    if exact is not None:
        ys, xs = (t.to(dev) for t in exact)
        b = torch.arange(B, device=dev)[:, None, None]
        out = canvas[b, ys[:, :, None], xs[:, None, :]]
        out = out.permute(0, 3, 1, 2).float().div_(255.0) if to_float else out
    else:
        out = _resample(canvas, src_sizes, M, out_h, out_w, fill, to_float)
    for k in ("image_offsets", "image_shapes", "image_sizes"):
        batch.pop(k, None)
    batch["image"] = out
    if "boxes" in batch:
        _transform_boxes(batch, M, out_w, out_h, box_keys)
    return batch


def _transform_boxes(batch: dict, M: torch.Tensor, out_w: int, out_h: int, box_keys) -> None:
    if "box_offsets" not in batch:
        raise DscError("transforms move boxes in the packed form: use boxes='packed' (the default)")
    offsets = batch["box_offsets"]
    dev = batch["boxes"].device
    total = int(offsets[-1])
    if box_keys is None:
        box_keys = [k for k, v in batch.items() if k not in PER_SAMPLE_KEYS and isinstance(v, torch.Tensor)
                    and v.dim() >= 1 and v.shape[0] == total]
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
