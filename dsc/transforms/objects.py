"""How geometric ops move per-object data: boxes, their per-box rows, per-object masks and keypoints.

The one place that knows it. Every geometric op states its geometry per sample (a ``ChainPlan``: the
output->input matrices, and the integer programs when it has steps); :func:`move_objects` takes a packed
batch and that plan and moves every key the schema gives a per-object role:

* ``boxes``: the four corners through the forward map, their extent clipped to the output; a box left
  without area is dropped, and with it every per-box row, its mask and its keypoints;
* ``object_masks`` (``masks`` crops, ``masks_rects``, ``masks_offsets``): resampled with nearest neighbour
  by exactly the rule of the semantic mask: when the chain runs as programs, each output pixel takes the
  source pixel that ``run_program`` (nearest) would give it (computed once per sample by running the
  program on row and column index ramps, so rounding and ties are the mask's own); else the source pixel
  containing the output pixel centre under the matrix, as ``resample._nearest``. Outside the image: 0;
* ``keypoints`` (M, K, 3): x, y through the forward map; a sample whose map mirrors x (a horizontal
  flip: the op's matrix has a negative determinant and a negative x scale, or the op says so with
  ``hflips(sizes, params)``) has its joints permuted by the role's ``flip_index`` (torchvision's
  ``_flip_coco_person_keypoints``); a joint with visibility 0 or that leaves the output (outside
  [0, w] x [0, h]) becomes (0, 0, 0), COCO's convention.

A new geometric op needs nothing here as long as its matrices and programs are right; a new per-object
role is taught here once, for every op.

Every batch a geometric op moved also says what it did to each sample (:func:`record_geometry`), so a user
can move annotations of their own: ``affine`` (B, 2, 3) float64, the map from the stored sample's pixel
coordinates to the output's, composed over every geometric stage (the Loader's gather and the ops after it),
and ``flipped`` (B,) bool, the output mirrors the stored image left-right (its joints were swapped).
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import numpy as np
import torch

from ..errors import DscError
from ..formats.fields import Schema
from ..formats.fields.object_masks import crops_of_bits, rects_key
from ..nogil import nogil
from .fused import ChainPlan, run_program
from .geometric import RandomHorizontalFlip


# ----------------------------------------------------------------------------- nearest maps
def _program_maps(h: int, w: int, program, out_h: int, out_w: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Source row of each output row (out_h, 1) and source column of each output column (1, out_w), -1
    outside the image, exactly as ``run_program(..., nearest=True)`` picks them (the ops are axis-aligned)."""
    ramps = (torch.arange(h, dtype=torch.int32).view(h, 1).expand(h, w),
             torch.arange(w, dtype=torch.int32).view(1, w).expand(h, w))
    maps = []
    for ramp in ramps:
        out = torch.empty((out_h, out_w), dtype=torch.int32)
        run_program(ramp, program, out, True, -1.0)
        maps.append(out)
    return maps[0].amax(1, keepdim=True).long(), maps[1].amax(0, keepdim=True).long()


def _matrix_maps(M: torch.Tensor, h: int, w: int, out_h: int, out_w: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Source (row, column) of each output pixel centre under one output->input map (``resample._nearest``'s
    rule), -1 outside the image: (out_h, 1) and (1, out_w) when the map is axis-aligned, else (out_h, out_w)."""
    m = M.double()
    xo = (torch.arange(out_w, dtype=torch.float64) + 0.5).view(1, out_w)
    yo = (torch.arange(out_h, dtype=torch.float64) + 0.5).view(out_h, 1)
    if float(m[0, 1]) == 0 and float(m[1, 0]) == 0:
        xi, yi = m[0, 0] * xo + m[0, 2], m[1, 1] * yo + m[1, 2]
    else:
        xi = m[0, 0] * xo + m[0, 1] * yo + m[0, 2]
        yi = m[1, 0] * xo + m[1, 1] * yo + m[1, 2]
    vx, vy = (xi >= 0) & (xi < w), (yi >= 0) & (yi < h)
    xs = torch.minimum(xi.floor().clamp(min=0), torch.tensor(w - 1.0)).long()
    ys = torch.minimum(yi.floor().clamp(min=0), torch.tensor(h - 1.0)).long()
    if xi.shape != yi.shape:  # separable
        return torch.where(vy, ys, -1), torch.where(vx, xs, -1)
    valid = vx & vy
    return torch.where(valid, ys, -1), torch.where(valid, xs, -1)


class Flips(tuple):
    """A sample's map when its program is flips only: (flip rows, flip columns, h, w)."""

    def __new__(cls, fh: bool, fw: bool, h: int, w: int):
        return super().__new__(cls, (fh, fw, h, w))


def nearest_maps(plan: ChainPlan, sizes: torch.Tensor) -> list:
    """Per sample, (source rows, source columns) of the output pixels, broadcastable to the output size (or
    :class:`Flips` when the sample's program only flips)."""
    outs = _out_sizes(plan, len(sizes)).tolist()
    maps = []
    for b, (h, w) in enumerate(sizes.tolist()):
        out_h, out_w = outs[b]
        if plan.programs is not None and all(step[0] == "flip" for step in plan.programs[b]):
            fh = sum(1 for step in plan.programs[b] if step[1] == 1 and step[2]) % 2 == 1
            fw = sum(1 for step in plan.programs[b] if step[1] == 0 and step[2]) % 2 == 1
            maps.append(Flips(fh, fw, h, w))  # flips only (torchvision's detection recipe): exact reversals
        elif plan.programs is not None:
            maps.append(_program_maps(h, w, plan.programs[b], out_h, out_w))
        else:
            maps.append(_matrix_maps(plan.matrices[b], h, w, out_h, out_w))
    return maps


def _out_sizes(plan: ChainPlan, B: int) -> torch.Tensor:
    """(B, 2) each sample's (h, w) after the chain (one size, or each its own: a size-keeping chain)."""
    if plan.out_sizes is not None:
        return plan.out_sizes.long()
    return torch.tensor([plan.out], dtype=torch.long).expand(B, 2)


# ----------------------------------------------------------------------------- masks
def _move_mask(crop: np.ndarray, rect, ys: np.ndarray, xs: np.ndarray) -> tuple[np.ndarray, tuple]:
    """One object's crop (h, w) at ``rect`` (top, left, h, w) through the maps -> (new crop, new rect)."""
    t, l, h, w = rect
    iy, ix = ys - t, xs - l
    iny, inx = (iy >= 0) & (iy < h), (ix >= 0) & (ix < w)
    empty = np.zeros(0, np.uint8), (0, 0, 0, 0)
    if h == 0 or w == 0 or not iny.any() or not inx.any():
        return empty
    if iy.shape[1] == 1 and ix.shape[0] == 1:  # separable: only the output rows and columns that land inside
        rows, cols = np.flatnonzero(iny[:, 0]), np.flatnonzero(inx[0])
        r0, r1, c0, c1 = int(rows[0]), int(rows[-1]) + 1, int(cols[0]), int(cols[-1]) + 1
        ry, cx = iy[r0:r1, 0], ix[0, c0:c1]
        out = crop[np.clip(ry, 0, h - 1)][:, np.clip(cx, 0, w - 1)]
        if not (iny[r0:r1, 0].all() and inx[0, c0:c1].all()):
            out = out * (iny[r0:r1, 0][:, None] & inx[0, c0:c1][None, :])
        return out.reshape(-1), (r0, c0, r1 - r0, c1 - c0)
    inside = iny & inx
    full = crop[np.clip(iy, 0, h - 1), np.clip(ix, 0, w - 1)] * inside
    rows, cols = np.flatnonzero(full.any(1)), np.flatnonzero(full.any(0))
    if not len(rows):
        return empty
    r0, r1, c0, c1 = int(rows[0]), int(rows[-1]) + 1, int(cols[0]), int(cols[-1]) + 1
    return np.ascontiguousarray(full[r0:r1, c0:c1]).reshape(-1), (r0, c0, r1 - r0, c1 - c0)


def move_object_masks(batch: dict, key: str, maps, sample: np.ndarray, keep: np.ndarray) -> None:
    """Every kept object's mask of ``batch[key]`` (packed crops) through its sample's nearest maps (``sample``:
    each object row's sample; ``keep``: the rows whose boxes survived); the others are dropped."""
    flat, rects, offs = batch[key], batch[rects_key(key)], batch[f"{key}_offsets"]
    dev = flat.device
    if all(isinstance(m, Flips) for m in maps):
        _flip_object_masks(batch, key, maps, sample, keep)
        return
    flat_c, o, r = flat.cpu().numpy(), offs.tolist(), rects.tolist()
    np_maps = {}
    new_flat, new_rects = [], []
    for j in np.flatnonzero(keep).tolist():
        b = int(sample[j])
        if b not in np_maps and not isinstance(maps[b], Flips):
            np_maps[b] = tuple(m.numpy() for m in maps[b])
        t, l, h, w = r[j]
        crop = flat_c[o[j]:o[j + 1]].reshape(h, w)
        if isinstance(maps[b], Flips):  # the crop reversed, its rectangle mirrored
            fh, fw, H, W = maps[b]
            crop = crop[::-1] if fh else crop
            crop = crop[:, ::-1] if fw else crop
            new_flat.append(np.ascontiguousarray(crop).reshape(-1))
            new_rects.append((H - t - h if fh and h else t, W - l - w if fw and w else l, h, w))
            continue
        out, rect = _move_mask(crop, (t, l, h, w), *np_maps[b])
        new_flat.append(out)
        new_rects.append(rect)
    sizes = np.asarray([q[2] * q[3] for q in new_rects], np.int64)
    offsets = np.zeros(len(sizes) + 1, np.int64)
    np.cumsum(sizes, out=offsets[1:])
    batch[key] = torch.from_numpy(np.concatenate(new_flat) if new_flat else np.zeros(0, np.uint8)).to(dev)
    batch[rects_key(key)] = torch.tensor(new_rects, dtype=torch.int64).view(-1, 4).to(dev)
    batch[f"{key}_offsets"] = torch.from_numpy(offsets).to(dev)


def _flip_object_masks(batch: dict, key: str, maps: list, sample: np.ndarray, keep: np.ndarray) -> None:
    """:func:`move_object_masks` when every sample's map only flips (torchvision's detection recipe): the
    crops keep their sizes, so the output is allocated once; a run of kept crops of samples that are not
    flipped is one block copy, a flipped crop one reversed slice assignment into its place (no per-object
    arrays, no concatenation), and the rectangles are mirrored batch-wide."""
    flat, rects, offs = batch[key], batch[rects_key(key)], batch[f"{key}_offsets"]
    dev = flat.device
    src, o = flat.cpu().numpy(), offs.cpu().numpy()
    rows = np.flatnonzero(keep)
    r = rects.cpu().numpy()[rows].astype(np.int64)
    flips = np.asarray([(m[0], m[1], m[2], m[3]) for m in maps], np.int64).reshape(-1, 4)[sample[rows]]
    sizes = r[:, 2] * r[:, 3]
    offsets = np.zeros(len(rows) + 1, np.int64)
    np.cumsum(sizes, out=offsets[1:])
    out = np.empty(int(offsets[-1]), np.uint8)
    moved = (flips[:, 0] | flips[:, 1]).astype(bool) & (sizes > 0)
    src_start, src_end, dst = o[rows].tolist(), o[rows + 1].tolist(), offsets.tolist()
    todo = moved.tolist()
    j, n = 0, len(rows)
    while j < n:
        if todo[j]:
            t, l, h, w = r[j].tolist()
            crop = src[src_start[j]:src_end[j]].reshape(h, w)
            out[dst[j]:dst[j + 1]].reshape(h, w)[...] = crop[::-1 if flips[j, 0] else 1, ::-1 if flips[j, 1] else 1]
            j += 1
            continue
        k = j  # a run of unmoved crops, back to back in the source as in the output: one copy
        while k + 1 < n and not todo[k + 1] and rows[k + 1] == rows[k] + 1:
            k += 1
        out[dst[j]:dst[k + 1]] = src[src_start[j]:src_end[k]]
        j = k + 1
    fh, fw = flips[:, 0].astype(bool) & (r[:, 2] > 0), flips[:, 1].astype(bool) & (r[:, 3] > 0)
    r[fh, 0] = flips[fh, 2] - r[fh, 0] - r[fh, 2]
    r[fw, 1] = flips[fw, 3] - r[fw, 1] - r[fw, 3]
    batch[key] = torch.from_numpy(out).to(dev)
    batch[rects_key(key)] = torch.from_numpy(r).to(dev)
    batch[f"{key}_offsets"] = torch.from_numpy(offsets).to(dev)


# ----------------------------------------------------------------------------- keypoints
def move_keypoints(points: torch.Tensor, fwd: torch.Tensor, hflip: torch.Tensor, flip_index, out_w, out_h
                   ) -> torch.Tensor:
    """(M, K, 3) joints through per-row forward maps ``fwd`` (M, 3, 3); rows with ``hflip`` get their joints
    permuted by ``flip_index``; hidden or outside joints become (0, 0, 0). ``out_w``, ``out_h``: the output
    size, one for all or (M,) per row. (None ``flip_index``: unknown, joints stay; the Loader warned.)"""
    ow, oh = (torch.as_tensor(out_w, dtype=torch.float64, device=points.device).reshape(-1, 1),
              torch.as_tensor(out_h, dtype=torch.float64, device=points.device).reshape(-1, 1))
    return keypoints_through(points, fwd.to(points.device), hflip, list(flip_index or ()), ow, oh)


@nogil
def keypoints_through(points: torch.Tensor, fwd: torch.Tensor, hflip: torch.Tensor, flip_index: List[int],
                      ow: torch.Tensor, oh: torch.Tensor) -> torch.Tensor:
    """:func:`move_keypoints`' arithmetic, scripted (dsc.nogil: its dozen small ops a batch run without the
    GIL): ``ow``, ``oh`` (1 or M, 1) float64, ``flip_index`` empty when unknown."""
    p = points.double()
    if len(flip_index) > 0 and bool(hflip.any()):
        p = torch.where(hflip.view(-1, 1, 1), p.index_select(1, torch.tensor(flip_index, device=p.device)), p)
    x, y, v = p[:, :, 0], p[:, :, 1], p[:, :, 2]
    nx = fwd[:, 0, 0:1] * x + fwd[:, 0, 1:2] * y + fwd[:, 0, 2:3]
    ny = fwd[:, 1, 0:1] * x + fwd[:, 1, 1:2] * y + fwd[:, 1, 2:3]
    vis = (v > 0) & (nx >= 0) & (nx <= ow) & (ny >= 0) & (ny <= oh)
    out = torch.stack([nx, ny, v], -1) * vis.unsqueeze(-1)
    return out.to(points.dtype)


# ----------------------------------------------------------------------------- boxes
def transform_boxes(batch: dict, M: torch.Tensor, out_w, out_h, box_keys, keep=None, fwd=None,
                    sample=None) -> torch.Tensor:
    """Boxes through the forward maps, clipped to the output (``out_w``, ``out_h``: one size, or (B,) per
    sample); boxes left without area (or False in ``keep``, per box: an op that drops boxes itself) are
    dropped with every per-box row, and ``box_offsets`` rewritten (batched, no loop per box). Returns which
    were kept. ``fwd`` (the inverses of ``M``) and ``sample`` (each box's sample): when the caller has them."""
    if "box_offsets" not in batch:
        raise DscError("transforms move boxes in the packed form: use boxes='packed' (the default)")
    offsets = batch["box_offsets"]
    dev = batch["boxes"].device
    rows = [k for k in box_keys if k in batch and k != "boxes"]
    B = len(offsets) - 1
    fwd = (torch.linalg.inv(M) if fwd is None else fwd).to(dev)  # input pixel -> output pixel
    if sample is None:
        counts = (offsets[1:] - offsets[:-1]).cpu()
        sample = torch.repeat_interleave(torch.arange(B), counts)
    ow = torch.as_tensor(out_w, dtype=torch.float64).to(dev).expand(B)
    oh = torch.as_tensor(out_h, dtype=torch.float64).to(dev).expand(B)
    batch["boxes"], keep, kept, batch["box_offsets"] = boxes_through(
        batch["boxes"], fwd, sample.to(dev), ow, oh, keep, [batch[k] for k in rows], "boxes" in box_keys)
    batch.update(zip(rows, kept))
    return keep


@nogil
def boxes_through(boxes: torch.Tensor, fwd: torch.Tensor, sample: torch.Tensor, ow: torch.Tensor, oh: torch.Tensor,
                  drop: Optional[torch.Tensor], rows: List[torch.Tensor], filter_boxes: bool
                  ) -> Tuple[torch.Tensor, torch.Tensor, List[torch.Tensor], torch.Tensor]:
    """:func:`transform_boxes`' arithmetic, scripted (dsc.nogil: its few dozen small ops a batch run without the
    GIL): the moved boxes (their dtype; only the kept ones with ``filter_boxes``), which were kept, the other
    per-box ``rows`` kept, the new box offsets. ``fwd`` (B, 3, 3) input -> output per sample, ``sample`` each
    box's, ``ow``, ``oh`` (B,) float64."""
    B = fwd.shape[0]
    b = boxes.double()
    xs = torch.stack([b[:, 0], b[:, 2], b[:, 0], b[:, 2]], 1)
    ys = torch.stack([b[:, 1], b[:, 1], b[:, 3], b[:, 3]], 1)
    f = fwd[sample]
    nx = f[:, 0, 0:1] * xs + f[:, 0, 1:2] * ys + f[:, 0, 2:3]
    ny = f[:, 1, 0:1] * xs + f[:, 1, 1:2] * ys + f[:, 1, 2:3]
    w, h = ow[sample], oh[sample]
    nb = torch.stack([torch.minimum(nx.amin(1).clamp(min=0), w), torch.minimum(ny.amin(1).clamp(min=0), h),
                      torch.minimum(nx.amax(1).clamp(min=0), w), torch.minimum(ny.amax(1).clamp(min=0), h)], 1)
    keep = (nb[:, 2] > nb[:, 0]) & (nb[:, 3] > nb[:, 1])
    if drop is not None:
        keep &= drop.to(keep.device)
    kept = [r[keep] for r in rows]
    counts = torch.zeros(B, dtype=torch.int64, device=keep.device).index_add_(0, sample, keep.long())
    offsets = torch.zeros(B + 1, dtype=torch.int64, device=keep.device)
    torch.cumsum(counts, 0, out=offsets[1:])
    moved = nb.to(boxes.dtype)
    return moved[keep] if filter_boxes else moved, keep, kept, offsets


# ----------------------------------------------------------------------------- the record


def record_geometry(batch: dict, plan: ChainPlan, schema: Schema, fwd: torch.Tensor | None = None) -> None:
    """Compose ``plan`` into the batch's record of its samples' geometry: ``affine`` (B, 2, 3) float64, the
    point (x, y) of the stored sample (continuous pixel coordinates, pixel corners at integers: the
    convention of boxes, keypoints and ``transform/affine``) lands at ``affine[b] @ (x, y, 1)`` of the
    output; ``flipped`` (B,) bool, the output mirrors the stored image left-right (an odd number of
    horizontal flips: keypoints had their left and right joints swapped). A later stage composes onto the
    record of the earlier ones; after an op that moves samples in a way no map states (Mosaic) ``affine`` is
    NaN and there is no ``flipped``. A field of the dataset named like one of them keeps its name (not
    recorded)."""
    B = len(plan.matrices)
    if fwd is None:  # (``fwd``: the plan's forward maps, when the caller has them)
        fwd = torch.linalg.inv(plan.matrices)  # output -> input, inverted: input -> output
    fwd = fwd.double().cpu()
    hflip = plan.hflip.cpu() if plan.hflip is not None else torch.zeros(B, dtype=torch.bool)
    prev, was = batch.get("affine"), batch.get("flipped")
    if "affine" not in schema:
        if isinstance(prev, torch.Tensor) and prev.shape == (B, 2, 3):  # an earlier stage's: this one after it
            fwd = fwd.to(prev.device) @ torch.cat([prev.double(), fwd.new_tensor([[[0.0, 0.0, 1.0]]]).to(
                prev.device).expand(B, 1, 3)], 1)
        dev = prev.device if isinstance(prev, torch.Tensor) else batch["image"].device
        batch["affine"] = (fwd[:, :2] + 0.0).to(dev)  # (+ 0.0: no -0.0 in the record)
    if "flipped" not in schema:
        if isinstance(prev, torch.Tensor) and "affine" not in schema and bool(prev.isnan().any()):
            batch.pop("flipped", None)  # the samples were moved in a way no map states (Mosaic): no record
            return
        if isinstance(was, torch.Tensor) and was.shape == (B,):
            hflip = hflip.to(was.device) ^ was.bool()
        dev = was.device if isinstance(was, torch.Tensor) else batch["image"].device
        batch["flipped"] = hflip.to(dev)


def void_record(batch: dict, schema: Schema | None) -> None:
    """The samples were moved in a way no per-sample map states (Mosaic: four samples on one canvas): the
    record says so, ``affine`` NaN (it stays NaN through later ops) and no ``flipped`` (fields of the
    dataset named so are left alone)."""
    schema = schema or {}
    if "affine" not in schema:
        B = batch["image"].shape[0]  # (the canvas: (B, H, W, C))
        batch["affine"] = torch.full((B, 2, 3), float("nan"), dtype=torch.float64, device=batch["image"].device)
    if "flipped" not in schema:
        batch.pop("flipped", None)


# ----------------------------------------------------------------------------- all of them
def flip_only(plan: ChainPlan) -> np.ndarray | None:
    """(B, 4) int64 (flip rows, flip columns, height, width) of each sample when every program of ``plan`` only
    flips (torchvision's detection recipe), else None."""
    if plan.programs is None or not all(step[0] == "flip" for p in plan.programs for step in p):
        return None
    maps = nearest_maps(plan, plan.sizes)
    return np.asarray([tuple(m) for m in maps], np.int64).reshape(-1, 4)


def move_objects(batch: dict, plan: ChainPlan, schema: Schema, sizes: torch.Tensor | None = None,
                 record: bool = True, placed: tuple = ()) -> None:
    """Every per-object key of a packed batch through ``plan`` (see the module docstring). ``sizes``: the
    samples' (h, w) before the chain (default: the plan's). ``record=False``: ``batch`` is not a batch of
    samples (Mosaic's placements), so no record of its geometry is made. ``placed``: object-mask keys the
    gather already moved through ``plan`` (mirrored while unpacked, :func:`flip_only`): they only lose the
    rows of dropped boxes."""
    fwd = torch.linalg.inv(plan.matrices)  # input pixel -> output pixel, per sample
    if record:
        record_geometry(batch, plan, schema, fwd)
    if "boxes" not in batch:
        return
    sizes = sizes if sizes is not None else plan.sizes
    offsets = batch["box_offsets"]
    counts = (offsets[1:] - offsets[:-1]).cpu()
    sample = torch.repeat_interleave(torch.arange(len(counts)), counts)
    outs = _out_sizes(plan, len(counts)).double()
    out_h, out_w = outs[:, 0], outs[:, 1]
    keep = transform_boxes(batch, plan.matrices, out_w, out_h, schema.box_rows(),  # filters keypoints too
                           keep=getattr(plan, "keep", None), fwd=fwd, sample=sample).cpu()
    masks = [k for k in schema.object_masks() if k in batch and k not in placed]
    if masks:
        maps = nearest_maps(plan, sizes)
        for k in masks:
            move_object_masks(batch, k, maps, sample.numpy(), keep.numpy())
    dropped = [k for k in placed if k in batch] if not bool(keep.all()) else []
    if dropped:  # (no move left: each sample's map the identity, the kept crops' runs copied)
        still = [Flips(False, False, int(h), int(w)) for h, w in _out_sizes(plan, len(counts)).tolist()]
        for k in dropped:
            crops_of_bits(batch, k)  # (the gather's packed bits, if it left them so: crops to drop rows from)
            _flip_object_masks(batch, k, still, sample.numpy(), keep.numpy())
    points = {k: r for k, r in schema.keypoints().items() if k in batch}
    if points:
        kept = sample[keep]
        fwd = fwd[kept]
        hflip = (plan.hflip if plan.hflip is not None else torch.zeros(len(counts), dtype=torch.bool))[kept]
        for k, role in points.items():
            batch[k] = move_keypoints(batch[k], fwd, hflip.to(batch[k].device), role.flip_index, out_w[kept],
                                      out_h[kept])


def unknown_flip_warning(ops, schema: Schema) -> str | None:
    """The Loader's warning when ``ops`` (a Compose's, RandomChoice's nested) flip horizontally over keypoints
    whose flip permutation the dataset does not know (``Role.flip_index`` None): the flip mirrors x and keeps
    every joint in place, so a left joint ends up as the right one's label. None when there is nothing to say."""
    unknown = [k for k, r in schema.keypoints().items() if r.flip_index is None]

    def flips(op) -> bool:
        if isinstance(op, RandomHorizontalFlip):
            return op.p > 0
        return hasattr(op, "hflips") or any(flips(o) for o in getattr(op, "ops", ()) or ())

    if not unknown or not any(flips(op) for op in ops):
        return None
    return (f"the transforms flip horizontally, but the dataset's {', '.join(map(repr, unknown))} have no known flip "
            f"permutation (manifest flip_index null): flipped samples keep every joint in place, so left and right "
            f"joints trade sides. Recompile with the permutation (COCO: --keypoint-flip or left_/right_ joint names; "
            f"YOLO: flip_idx in data.yaml; dsc.compile(dataset): dataset.keypoint_flip_index)")
