"""Batch forms: how gathered fields are handed to the user.

* ``Batch``: the dict of tensors a batch is, carrying the dataset's :class:`~dsc.formats.fields.Schema`
  (which keys are pixels, boxes, box rows), so transforms never guess;
* boxes ``packed`` (default: every box of the batch back to back, ``box_offsets`` (B+1,): image b owns
  rows ``box_offsets[b]:box_offsets[b+1]``), ``padded`` ((B, max_k, ...) with ``box_mask`` and
  ``box_counts``; labels padded with -1) or ``list`` (torchvision-style target dicts, views of the packed
  tensors). All conversions are batched tensor ops with no Python loop per box;
* ragged images ``packed`` or ``padded`` (done by the field readers, see ``formats/fields/pixels.py``);
* ``SampleBatch`` / ``collate``: what torch's DataLoader gets from ``Dataset.__getitems__``;
* what a Loader hands out besides the dict: tuples of chosen keys (``select_keys``) and torchvision's
  ``(images, targets)`` (``torchvision_form``).
"""
from __future__ import annotations

import os
from typing import List, Optional, Tuple

import numpy as np
import torch

from ..errors import ConfigError
from ..nogil import nogil
from ..formats.fields import Schema
from ..formats.fields.object_masks import bits_key, crops_of_bits, image_size, paste, rects_key
from ..transforms.fused import mirrored
from ..formats.fields.base import Batch  # noqa: F401 - (a batch and its schema: formats/fields/base.py)

BOX_FORMS = ("packed", "padded", "list")
IMAGE_FORMS = ("packed", "padded")


def new_tensor(name: str, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
    """The default allocator: a new tensor (the Loader passes its ring of reusable, pinned buffers)."""
    return torch.empty(shape, dtype=dtype)


def numpy_alloc(alloc, tensors: dict):
    """The field readers' (numpy) allocator over a torch one: each output is a numpy view of a tensor
    from ``alloc``, recorded in ``tensors`` under its name so the batch hands out that very tensor."""
    def np_alloc(name: str, shape: tuple, dtype) -> np.ndarray:
        t = alloc(name, tuple(int(v) for v in shape), torch_dtype(dtype))
        tensors[name] = t
        return t.numpy()
    return np_alloc


_TORCH_DTYPES = {np.dtype(k): v for k, v in ((np.uint8, torch.uint8), (np.int8, torch.int8), (np.int16, torch.int16),
                                             (np.int32, torch.int32), (np.int64, torch.int64),
                                             (np.float32, torch.float32), (np.float64, torch.float64),
                                             (np.bool_, torch.bool), (np.uint16, torch.uint16),
                                             (np.uint32, torch.uint32), (np.float16, torch.float16),
                                             (np.uint64, torch.uint64))}


def torch_dtype(dtype) -> torch.dtype:
    return _TORCH_DTYPES[np.dtype(dtype).newbyteorder("=")]


def as_tensors(fields: dict, tensors: dict) -> dict:
    """Reader outputs -> tensors: the allocated ones as they are, other arrays (views) wrapped."""
    out = {}
    for k, v in fields.items():
        t = tensors.get(k)
        out[k] = t if t is not None else (torch.from_numpy(v) if isinstance(v, np.ndarray) else v)
    return out


def packed_to_padded(box_offsets: torch.Tensor, columns: dict[str, torch.Tensor], alloc=new_tensor
                     ) -> dict[str, torch.Tensor]:
    """{name: (M, ...)} packed columns -> {name: (B, max_k, ...)} + ``box_mask`` (B, max_k) + ``box_counts``.
    ``alloc(name, shape, dtype)`` provides the outputs (the Loader's pinned ring)."""
    counts = box_offsets[1:] - box_offsets[:-1]
    B = len(counts)
    K = int(counts.max()) if B else 0
    sample = torch.repeat_interleave(torch.arange(B), counts)
    slot = torch.arange(int(box_offsets[-1])) - box_offsets[:-1][sample]
    out = {}
    for name, col in columns.items():
        padded = alloc(f"padded_{name}", (B, K, *col.shape[1:]), col.dtype)
        padded.fill_(-1 if name == "labels" else 0)
        padded[sample, slot] = col
        out[name] = padded
    mask = alloc("box_mask", (B, K), torch.bool)
    mask.fill_(False)
    mask[sample, slot] = True
    out["box_mask"] = mask
    out["box_counts"] = alloc("box_counts", (B,), torch.int64).copy_(counts)
    return out


def padded_to_packed(padded: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Inverse of :func:`packed_to_padded`: (box_offsets, {name: (M, ...)})."""
    mask, counts = padded["box_mask"], padded["box_counts"]
    box_offsets = torch.zeros(len(counts) + 1, dtype=torch.int64)
    torch.cumsum(counts, 0, out=box_offsets[1:])
    return box_offsets, {k: v[mask] for k, v in padded.items() if k not in ("box_mask", "box_counts")}


def split_rows(cols: List[torch.Tensor], offsets: List[int]) -> List[List[torch.Tensor]]:
    """Packed columns split by box ``offsets`` (B+1): sample ``b``'s list holds each column's rows
    ``offsets[b]:offsets[b + 1]`` as views (one ``torch.split`` a column). Scriptable: the scripted
    :func:`target_rows` runs it as it is, :func:`packed_to_list` in Python."""
    out: List[List[torch.Tensor]] = []
    if len(offsets) < 2:
        return out
    counts = [offsets[b + 1] - offsets[b] for b in range(len(offsets) - 1)]
    per = [torch.split(c[offsets[0]:offsets[-1]], counts) for c in cols]
    for b in range(len(counts)):
        out.append([views[b] for views in per])
    return out


def packed_to_list(box_offsets: torch.Tensor, columns: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
    """Per-image target dicts whose tensors are views of the packed columns (torchvision's form)."""
    names = list(columns)
    return [dict(zip(names, views)) for views in split_rows(list(columns.values()), box_offsets.tolist())]


def ragged_list(batch: dict, name: str) -> list:
    """A packed ragged key (``<name>`` rows + ``<name>_offsets``) as one view per sample."""
    o = batch[f"{name}_offsets"].tolist()
    return [batch[name][o[k]:o[k + 1]] for k in range(len(o) - 1)]


def value_keys(schema: Schema) -> list[str]:
    """The batch keys of value fields (numbers, arrays, ragged, text, json, bytes), in schema order."""
    return [k for k, r in schema.items() if r.kind in ("value", "ragged", "host")]


def object_masks(batch: dict, key: str, k: int, h: int | None = None, w: int | None = None) -> torch.Tensor:
    """Sample ``k``'s per-object masks (k, H, W) uint8 from a packed batch (``H, W``: its image's size unless
    given, e.g. a padded canvas)."""
    o = batch["box_offsets"]
    a, b = int(o[k]), int(o[k + 1])
    mo = batch[f"{key}_offsets"]
    if h is None:
        h, w = image_size(batch, k)
    offsets, rects = mo[a:b + 1] - mo[a], batch[rects_key(key)][a:b]
    return paste(batch[key][int(mo[a]):int(mo[b])], offsets, rects, h, w)


def _object_masks_form(batch: dict, schema: Schema, form: str, alloc=new_tensor) -> dict:
    """Per-object masks in the box form: ``list``: {key: [(k, H, W) uint8 per sample]}; ``padded``:
    {key: (B, max_k, H, W) uint8} at the batch's largest image size (zeros for the padding rows)."""
    out = {}
    for key in [k for k in schema.object_masks() if k in batch]:
        B = len(batch["box_offsets"]) - 1
        if form == "list":
            out[key] = [object_masks(batch, key, b) for b in range(B)]
        else:
            sizes = [image_size(batch, b) for b in range(B)]
            H, W = (max(s[0] for s in sizes), max(s[1] for s in sizes)) if B else (0, 0)
            counts = (batch["box_offsets"][1:] - batch["box_offsets"][:-1]).tolist()
            padded = alloc(f"padded_{key}", (B, max(counts, default=0), H, W), torch.uint8)
            padded.zero_()
            for b in range(B):
                if counts[b]:
                    padded[b, :counts[b]] = object_masks(batch, key, b, H, W)
            out[key] = padded
        for suffix in ("", "_rects", "_offsets"):
            batch.pop(key + suffix)
    return out


def box_form(batch: dict, schema: Schema, form: str, alloc=new_tensor) -> dict:
    """Turn a batch's packed box rows into ``form`` (packed: unchanged). The ``list`` form also turns each
    ragged value field into a list of per-sample views."""
    if form == "list":
        for name in [k for k, r in schema.items() if r.kind == "ragged" and f"{k}_offsets" in batch]:
            batch[name] = ragged_list(batch, name)
            del batch[f"{name}_offsets"]
    if form == "packed" or "box_offsets" not in batch:
        return batch
    masks = _object_masks_form(batch, schema, form, alloc)
    rows = [k for k in schema.box_rows() if k in batch]
    cols = {k: batch.pop(k) for k in rows}
    offsets = batch.pop("box_offsets")
    if form == "padded":
        batch.update(packed_to_padded(offsets, cols, alloc))
        batch.update(masks)
    else:
        targets = packed_to_list(offsets, cols)
        for t, iid in zip(targets, batch["image_id"].tolist() if "image_id" in batch else []):
            t["image_id"] = iid
        for key, per_sample in masks.items():
            for t, m in zip(targets, per_sample):
                t[key] = m
        batch["targets"] = targets
    return batch


class SampleBatch(list):
    """What ``Dataset.__getitems__`` returns: a list of per-sample dicts (what torch's
    ``default_collate`` expects) whose tensors are views into one batched gather, and, indexed by a
    field name, the batched tensors themselves: ``batch["image"]`` is (B, H, W, C)."""

    def __init__(self, samples: list[dict], fields: dict[str, torch.Tensor]):
        super().__init__(samples)
        self.fields = fields

    def __getitem__(self, key):
        if isinstance(key, str):
            return self.fields[key]
        return super().__getitem__(key)


class Sample(dict):
    """What ``ds[i]`` returns: a dict of the sample's fields that carries the dataset's ``schema``, so
    :func:`collate` batches a list of them as the Loader would (wrappers such as ``ConcatDataset`` hand the
    samples on as they are)."""

    def __init__(self, *args, schema: Schema | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.schema = schema


def collate(batch):
    """``collate_fn`` for torch's DataLoader: a :class:`SampleBatch` is already batched, so its fields
    are returned with no second copy. A list of per-sample dicts (``ds[i]``, through a wrapper that does not
    forward ``__getitems__``) is batched as a Loader batch is, key by key, by the schema the samples carry
    (else by their values): value fields' ``ragged`` rows packed with ``<key>_offsets``, ``host`` values (text,
    json, bytes) as a Python list, as they are; the rest through ``default_collate`` (stacked). Anything else
    goes to ``default_collate``."""
    if isinstance(batch, SampleBatch):
        return batch.fields
    if batch and all(isinstance(s, dict) for s in batch):
        schema = getattr(batch[0], "schema", None) or {}
        out = {}
        for key in batch[0]:
            values = [s[key] for s in batch]
            role = schema.get(key)
            kind = role.kind if role is not None else _inferred_kind(values)
            if kind == "host":
                out[key] = values
            elif kind == "ragged":
                rows = [torch.as_tensor(v) for v in values]
                offsets = torch.zeros(len(rows) + 1, dtype=torch.int64)
                torch.cumsum(torch.tensor([len(r) for r in rows], dtype=torch.int64), 0, out=offsets[1:])
                out[key], out[f"{key}_offsets"] = torch.cat(rows), offsets
            else:
                out[key] = torch.utils.data.default_collate(values)
        return out
    return torch.utils.data.default_collate(batch)


def _inferred_kind(values: list) -> str:
    """A key's role when the samples carry no schema (plain dicts): str, bytes, dicts, lists and None stay
    a Python list (``host``); arrays whose first dimension differs are ``ragged``; the rest is stacked."""
    if any(v is None or isinstance(v, (str, bytes, bytearray, dict, list, tuple)) for v in values):
        return "host"
    if all(isinstance(v, (torch.Tensor, np.ndarray)) and v.ndim >= 1 for v in values) \
            and len({tuple(v.shape[1:]) for v in values}) == 1 and len({v.shape[0] for v in values}) > 1:
        return "ragged"
    return "stack"


def select_keys(batch: dict, keys: tuple[str, ...]) -> tuple:
    """``dsc.Loader(..., keys=("image", "label"))``: the batch as a tuple of those keys, in that order."""
    missing = [k for k in keys if k not in batch]
    if missing:
        raise ConfigError(f"keys={keys!r}: {missing[0]!r} is not a key of this loader's batches, which have "
                          f"{', '.join(map(repr, batch))}; pick keys among those")
    return tuple(batch[k] for k in keys)


def sample_pixels(batch: dict, name: str) -> torch.Tensor | list[torch.Tensor]:
    """An image-like key of a batch, per sample: the (B, ...) tensor itself when its samples are one size
    (fixed layout, or a fixed-size transform), else a list of each sample's view at its own size (ragged:
    packed ``<name>_offsets`` / ``<name>_shapes``, or padded ``<name>_sizes``)."""
    if f"{name}_offsets" in batch:
        o, shapes = batch[f"{name}_offsets"].tolist(), batch[f"{name}_shapes"].tolist()
        flat = batch[name]
        return [flat[o[k]:o[k + 1]].view(shapes[k]) for k in range(len(shapes))]
    if f"{name}_sizes" in batch:
        return [batch[name][k, :h, :w] for k, (h, w) in enumerate(batch[f"{name}_sizes"].tolist())]
    return batch[name]


def _each(x, fn):
    return [fn(v) for v in x] if isinstance(x, list) else fn(x)


def divisor_255(device=None) -> torch.Tensor:
    """255 as a 0-dim float32 tensor on ``device``: what the torchvision form's casts of uint8 pixels to [0, 1]
    divide by (torchvision's ``float(x) / 255``; ``T.ToFloat`` multiplies by 1/255 instead). CUDA turns a division by a Python number into a multiplication by its
    reciprocal (off by one ulp for about half the values), the CPU divides exactly; dividing by a 0-dim tensor
    divides exactly on both, so a device batch equals the CPU loader's."""
    return torch.full((), 255.0, device=device)


def _chw_float(image: torch.Tensor) -> torch.Tensor:
    """uint8 (..., H, W, C) as stored -> float32 (..., C, H, W) in [0, 1], contiguous (torchvision's
    ``ToTensor``); a float image (dsc.transforms' ToFloat made it (..., C, H, W)) as it is."""
    if image.is_floating_point():
        return image
    out = image.movedim(-1, -3).to(torch.float32, memory_format=torch.contiguous_format)
    return out.div_(divisor_255(out.device))


@nogil
def cast_image(src: torch.Tensor, out: torch.Tensor, flip_rows: bool, flip_columns: bool, divisor: torch.Tensor
               ) -> None:
    """``out`` (H, W, C) float32 = ``src`` (H, W, C) uint8, mirrored as asked, divided by ``divisor`` (a 0-dim
    255, as :func:`_chw_float` divides): the gather's cast of a flip-only chain for the torchvision form, one
    scripted call a sample (dsc.nogil), where the flip, the cast's copy and the division each released and
    retook the GIL from Python (a handover to the Loader's other thread each)."""
    out.copy_(mirrored(src, flip_rows, flip_columns)).div_(divisor)


def _on_device(device):
    """An allocator of new tensors on ``device`` (a batch already there: the CUDA path's output form)."""
    return lambda name, shape, dtype: torch.empty(shape, dtype=dtype, device=device)


def _chw_floats(images, alloc=None):
    """:func:`_chw_float` of a batch's images (the (B, H, W, C) tensor, or a list of (H, W, C) views), the
    same values, faster: converted into their places in one float buffer from ``alloc`` (the Loader's ring:
    reused batch after batch, no fresh pages to fault in) and divided there. The (B, C, H, W) tensor is
    contiguous (its channels moved first as bytes through a scratch buffer that stays in cache, then cast);
    a list's images (mixed sizes: torchvision's detection recipe at native size) are (C, H, W) views of
    channels-last memory, exactly as torchvision's detection reference hands them to its models
    (``PILToTensor`` permutes a view, ``ToDtype(float, scale=True)`` keeps its strides), which spares the
    channel shuffle, the costliest pass of the conversion (measured: the list form's conversion about twice
    as fast under load, values equal)."""
    one = isinstance(images, torch.Tensor)
    items = [images] if one else images
    if (not items or any(x.is_floating_point() or x.dim() < 3 for x in items)
            or len({(x.dtype, x.device) for x in items}) > 1):
        return _each(images, _chw_float)
    alloc = alloc or _on_device(items[0].device)
    sizes = [x.numel() for x in items]
    buf = alloc("torchvision_image", (sum(sizes),), torch.float32)
    divisor = divisor_255(buf.device)
    if not one:  # each image cast where it lies, channels last, and divided while it is still in cache
        out, o = [], 0
        for x, n in zip(items, sizes):
            out.append(buf[o:o + n].view(x.shape).copy_(x).div_(divisor).movedim(-1, -3))
            o += n
        return out
    scratch = alloc("torchvision_image_chw", (max(sizes),), items[0].dtype)
    chw = images.movedim(-1, -3)
    n = sizes[0]
    return buf.view(chw.shape).copy_(scratch[:n].view(chw.shape).copy_(chw)).div_(divisor)


def _image_sizes(batch: dict, B: int) -> list[tuple[int, int]]:
    """Every sample's (height, width) in a batch of any image form (:func:`image_size` of each, one
    ``tolist`` for the batch)."""
    if "image_shapes" in batch:
        return [(h, w) for h, w, *_ in batch["image_shapes"].tolist()]
    if "image_sizes" in batch:
        return [(h, w) for h, w in batch["image_sizes"].tolist()]
    return [image_size(batch, 0)] * B


# uint8 -> float32 conversion in pieces of 4 MB of floats (two of the ring's huge pages, a core's L2 and
# then some): measured against 1 MB pieces, same batches, runs interleaved, the pass took about 13% less
# CPU, and each piece's two tensor ops release and retake the GIL a quarter as often (14 times a batch of
# COCO-sized images instead of 51), so the Loader's other thread is handed the GIL less often
_CAST_CHUNK = 1 << 20


# The batch key by which Dataset.get_batch(to_torchvision=True) (cast as it was gathered) or the Loader's
# transforms (a last geometric stage that cropped and flipped, prefetch._transform_rest) say the packed
# ``image`` is float32 already, the form's own values, channels last: with a ``:``, which no field name has, so
# no field takes it. (The Loader marks a float32 image after its stages: no geometric stage takes float input.)
CAST_KEY = "image:cast"


def _packed_chw_floats(batch: dict, alloc=None):
    """:func:`_chw_floats` of a packed ragged batch's images (``image`` flat, ``image_offsets``,
    ``image_shapes``): the images lie back to back in the flat buffer, so the float buffer takes the same
    layout and the batch is cast and divided as one run of bytes, in cache-sized pieces (two tensor ops a
    piece, none per image: less of the Loader threads' time holds the GIL); each image a (C, H, W) view of
    it, channels-last as the list form of :func:`_chw_floats`. A float32 flat that the gather marked
    (:data:`CAST_KEY`: ``Dataset.get_batch``'s ``to_torchvision`` casts each image as it gathers it, the same
    values) is that buffer already: only the views are made; the mark is taken out of the batch."""
    flat = batch["image"]
    shapes = batch["image_shapes"].tolist()
    # cast already only where the gather says so (a float image made any other way: a user's op, a direct
    # call, is taken as main took it, through _chw_floats)
    cast = batch.pop(CAST_KEY, None) is not None  # (set only on a float32 (h, w, c) cast: Dataset._get_batch)
    if not cast and (flat.is_floating_point() or not shapes or len(shapes[0]) != 3):
        return _chw_floats(sample_pixels(batch, "image"), alloc)
    buf = flat
    if not cast:
        alloc = alloc or _on_device(flat.device)
        buf = alloc("torchvision_image", (flat.numel(),), torch.float32)
        divisor = divisor_255(buf.device)
        cast_pieces(flat, buf, divisor, flat.numel() if flat.device.type != "cpu" else _CAST_CHUNK)
    # the images' (C, H, W) views, made by one scripted call for the batch (a slice, view and movedim were three
    # calls an image, then one as_strided: each released the GIL, handing it to the Loader's other thread)
    return image_views(buf, shapes, batch["image_offsets"].tolist(), buf.storage_offset())


@nogil
def cast_pieces(flat: torch.Tensor, buf: torch.Tensor, divisor: torch.Tensor, step: int) -> None:
    """``buf`` (float) = ``flat`` (uint8, the same length) cast and divided by ``divisor``, ``step`` elements at a
    time (on the CPU a piece's floats are still in cache for the division). Scripted (dsc.nogil): one call a
    batch, where each piece's slices, cast and division were four torch calls from Python (a GIL handover
    each: ~90 a batch of multiscale-sized images)."""
    n = flat.numel()
    step = max(1, step)
    for a in range(0, n, step):
        buf[a:a + step].copy_(flat[a:a + step]).div_(divisor)


@nogil
def image_views(buf: torch.Tensor, shapes: List[List[int]], offsets: List[int], at: int) -> List[torch.Tensor]:
    """Each image ``k`` of a packed channels-last ``buf`` (its (h, w, c) in ``shapes``, its first element at
    ``offsets[k]`` past ``at``, the buffer's storage offset) as a (C, H, W) view."""
    out: List[torch.Tensor] = []
    for k in range(len(shapes)):
        h, w, c = shapes[k][0], shapes[k][1], shapes[k][2]
        out.append(buf.as_strided([c, h, w], [1, w * c, c], at + offsets[k]))
    return out


# each byte's 8 bits, most significant first, as 0/1 bytes (numpy.unpackbits of 0..255), a row an int64: one
# index_select of a run of packed bytes unpacks it (a shift and mask of each bit took 6x as long); and least
# significant first (a run unpacked back to front: paste_masks' left-right flips)
_UNPACKED = torch.from_numpy(np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1)).view(torch.int64).view(-1)
_UNPACKED_REVERSED = torch.from_numpy(np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1,
                                                    bitorder="little")).view(torch.int64).view(-1)
_DESCENDING = [torch.zeros(0, dtype=torch.int64)]  # n - 1, ..., 1, 0 for the tallest mask yet: rows in reverse


def _descending(n: int) -> torch.Tensor:
    """n - 1, ..., 0 ending a tensor of at least ``n`` elements (its last ``m``: ``m - 1, ..., 0``), made once."""
    d = _DESCENDING[0]  # (read once: another thread may replace it meanwhile with a shorter one of its own)
    if len(d) < n:
        d = torch.arange(max(n, 2048) - 1, -1, -1)
        _DESCENDING[0] = d
    return d


@nogil
def paste_masks(src: torch.Tensor, offsets: List[int], rects: List[List[int]], flips: List[List[int]],
                rows: List[List[int]], sizes: List[List[int]], buf: torch.Tensor, bits: bool,
                table: torch.Tensor, reversed_table: torch.Tensor, words: torch.Tensor, unpacked: torch.Tensor,
                descending: torch.Tensor, clear: List[int], zero_from: int) -> Tuple[List[torch.Tensor], List[int]]:
    """Each sample's per-object masks (len(rows[b]), H, W) uint8 as views of ``buf``, one after the other,
    zeroed, each object ``i`` of ``rows[b]`` (ascending) pasted at ``rects[i]`` (top, left, height, width in the
    output): from ``src`` crops (uint8 0/1, crop ``i`` at ``offsets[i]:offsets[i + 1]``), or with ``bits``
    from the gather's packed bits (byte ``offsets``, each crop's bits starting a byte, most significant bit
    first: ``numpy.packbits``; ``table``: :data:`_UNPACKED`, ``reversed_table`` its bits least significant first;
    ``words`` int64 of the most bytes a sample's objects span, ``unpacked`` its uint8 view: TorchScript has no
    view as another dtype), mirrored by ``flips[i]`` (rows, columns; empty: none; ``descending``: ends with
    ``h - 1, ..., 0`` for the tallest mask, :func:`_descending`). Returns the masks and the rectangles written
    (storage offset, height, width, row stride: four ints a rectangle, flat), for the buffer's next batch.

    What is zeroed on the CPU: ``buf`` from element ``zero_from`` on, and the rectangles ``clear`` (those this
    buffer's last batch wrote; :func:`_target_masks` knows the rest of it is still zero): a reused buffer has
    its crops' bytes cleared and written, not its whole (k, H, W) masks zeroed (8x the crops' bytes on the
    bench's COCO-like set, a memory-bound pass: the fill was 9% of the torchvision form's CPU, 3% now). A
    sample's part from ``zero_from`` is zeroed just before its crops go in (a few MB, still in cache for them).
    A sample's bits are unpacked by one lookup of the bytes from its first object's to its last's (rows left
    out between them, crowds, are unpacked and not used); where every object of the sample is mirrored left to
    right (a horizontal flip), back to front (its bytes reversed, through ``reversed_table``): each crop comes
    out mirrored both ways, so a left-right flip is a copy with its rows in reverse order (one index_select,
    about 60% of ``flip``'s time on a crop) and a flip both ways a plain copy. Scripted (dsc.nogil): the loop
    over samples and objects runs without the GIL, one call a batch."""
    cpu = buf.device.type == "cpu"
    if not cpu:  # on a device the whole buffer by one kernel, not a launch a sample
        buf.zero_()
    else:
        for j in range(0, len(clear), 4):
            buf.as_strided([clear[j + 1], clear[j + 2]], [clear[j + 3], 1], clear[j]).zero_()
    out: List[torch.Tensor] = []
    pasted: List[int] = []
    at = 0
    for b in range(len(rows)):
        r = rows[b]
        h, w = sizes[b][0], sizes[b][1]
        n = len(r) * h * w
        m = buf[at:at + n].view(len(r), h, w)
        base = buf.storage_offset() + at
        if cpu and at + n > zero_from:
            buf[max(at, zero_from):at + n].zero_()
        at += n
        out.append(m)
        if len(r) == 0:
            continue
        start = offsets[r[0]]
        run, first = src, src.storage_offset()
        back = bits and len(flips) > 0  # every object mirrored left to right: unpacked back to front
        for i in r:
            back = back and flips[i][1] != 0
        end = offsets[r[-1] + 1]
        if bits:
            if end == start:
                continue
            n = end - start
            if back:
                torch.index_select(reversed_table, 0, src[start:end].flip([0]).int(), out=words[:n])
            else:
                torch.index_select(table, 0, src[start:end].int(), out=words[:n])
            run, first = unpacked, unpacked.storage_offset() - 8 * start
        for k in range(len(r)):
            i = r[k]
            t, l, mh, mw = rects[i][0], rects[i][1], rects[i][2], rects[i][3]
            if mh > 0 and mw > 0:  # (views by as_strided: one op each, where a slice, view and index took three)
                at_place = base + k * h * w + t * w + l
                place = buf.as_strided([mh, mw], [w, 1], at_place)
                pasted.extend([at_place, mh, mw, w])
                fh = len(flips) > 0 and flips[i][0] != 0
                if back:  # (mirrored both ways: its bits end 8 * (offsets[i] - start) bits before the run's end)
                    crop = run.as_strided([mh, mw], [mw, 1],
                                          unpacked.storage_offset() + 8 * (end - offsets[i]) - mh * mw)
                    fh = not fh
                else:
                    crop = run.as_strided([mh, mw], [mw, 1], first + (8 * offsets[i] if bits else offsets[i]))
                if not back and len(flips) > 0 and flips[i][1] != 0:  # (a sample of mixed flips)
                    place.copy_(mirrored(crop, fh, True))
                elif fh:  # rows in reverse order
                    torch.index_select(crop, 0, descending[descending.shape[0] - mh:], out=place)
                else:
                    place.copy_(crop)
    return out, pasted


# where a CPU mask buffer (the ring's, reused batch after batch) says what its last batch left in it: a tuple
# (its version counter then, its data pointer, how many leading elements are zero but for the rectangles, the
# rectangles written), as an attribute of the buffer's base tensor (the ring's own, which lives as long as it)
_WRITTEN = "_dsc_masks_written"


def _mask_buffer_state(buf: torch.Tensor) -> tuple[torch.Tensor | None, list, int]:
    """(the base tensor to record ``buf``'s state on, or None where it cannot be; the rectangles to clear; from
    which element ``buf`` must be zeroed): a buffer whose last batch's record still holds (same memory, and not
    written since: the version counter that every in-place torch op on it or any view of it counts up) is zero
    but for that batch's rectangles up to the recorded length; any other is zeroed whole. A write that torch's
    version counter does not see (numpy, ``.data``, DLPack, storage or raw-pointer writes, another process) into
    a mask a user dropped is not seen (README); ``DSC_MASKS_ZERO_WHOLE=1`` zeroes every buffer whole."""
    base = buf._base if buf._base is not None else buf
    if buf.device.type != "cpu" or buf.is_inference() or buf.storage_offset() != base.storage_offset() \
            or buf.dim() != 1 or os.environ.get("DSC_MASKS_ZERO_WHOLE", "0") not in ("", "0"):
        return None, [], 0
    seen = base.__dict__.get(_WRITTEN)
    if seen is None or seen[0] != buf._version or seen[1] != base.data_ptr():
        return base, [], 0
    return base, seen[3], seen[2]


def _target_masks(batch: dict, key: str, keep: torch.Tensor | None, alloc=None) -> list[torch.Tensor]:
    """Each sample's per-object masks (k, H, W) uint8 at its image's size (``keep``: a bool per box row of the
    batch, only those; None: all), as :func:`object_masks` makes them, but as views of one buffer from
    ``alloc`` for the whole batch, each crop pasted straight into its place by :func:`paste_masks` (one
    scripted call for the batch, on the CPU from the gather's packed bits when it left them so: each crop
    written once). A buffer that ``alloc`` hands again (the Loader's ring) is cleared where its last batch
    wrote, not zeroed whole (:func:`_mask_buffer_state`)."""
    o, mo = batch["box_offsets"].tolist(), batch[f"{key}_offsets"].tolist()
    rects, flat = batch[rects_key(key)].tolist(), batch[key]
    how = batch[bits_key(key)].tolist() if bits_key(key) in batch else None
    kept = keep.tolist() if keep is not None else None
    rows = []
    for b in range(len(o) - 1):
        r = range(o[b], o[b + 1])
        rows.append(list(r) if kept is None else [i for i in r if kept[i]])
    sizes = _image_sizes(batch, len(o) - 1)
    alloc = alloc or _on_device(flat.device)
    buf = alloc(f"torchvision_{key}", (sum(len(r) * h * w for r, (h, w) in zip(rows, sizes)),), torch.uint8)
    if how is not None and (buf.device.type != "cpu" or flat.device.type != "cpu"):
        crops_of_bits(batch, key)  # (the gather's packed bits are a CPU form: crops first, on a device)
        return _target_masks(batch, key, keep, alloc)
    words = alloc(f"torchvision_{key}:unpacked", (max([mo[r[-1] + 1] - mo[r[0]] for r in rows if r] or [0])
                                                  if how is not None else 0,), torch.int64)
    base, clear, zero_from = _mask_buffer_state(buf)
    masks, written = paste_masks(flat, mo, rects, how or [], rows, [list(s) for s in sizes], buf, how is not None,
                                 _UNPACKED, _UNPACKED_REVERSED, words, words.view(torch.uint8),
                                 _descending(max([h for h, _ in sizes] or [0])), clear, zero_from)
    if base is not None:  # (the version after the paste's own writes: the next batch's check)
        base.__dict__[_WRITTEN] = (buf._version, base.data_ptr(), max(zero_from, buf.numel()), written)
    return masks


def mask_values_of_labels(classes, mask_classes, ids: bool = False) -> tuple[torch.Tensor | None, str]:
    """For a detection dataset with a semantic mask: (the mask value of each 1-based torchvision label, index 0
    the background: -1; why there is none, when there is none). dsc's sources' rules first: with ``ids``
    (COCO's --keep-category-ids: labels are category ids) stored label k is the value k; else 0 is the
    background and label k the value k + 1 (VOC, COCO; also where the mask's values are unnamed); for another
    layout, each class by a name that the box classes and the mask's classes both hold exactly once."""
    if mask_classes is None:
        return None, "the dataset has no mask"
    classes, mask_classes, n = list(classes), list(mask_classes), len(classes)
    if ids:
        return torch.tensor([-1, -1, *range(1, n)], dtype=torch.int64)[:n + 1], ""
    if not mask_classes or mask_classes[1:n + 1] == classes:
        return torch.tensor([-1, *range(1, n + 1)], dtype=torch.int64), ""
    values = [-1]
    for name in classes:
        if classes.count(name) != 1 or mask_classes.count(name) != 1:
            return None, (f"the mask's classes do not name box class {name!r} exactly once, so which mask value "
                          f"is its class is not known")
        values.append(mask_classes.index(name))
    return torch.tensor(values, dtype=torch.int64), ""


def instance_masks(mask: torch.Tensor, boxes: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """uint8 (k, H, W): for each box, the pixels of the semantic ``mask`` (H, W) that hold its class's value
    ``values[j]`` and lie in the box (a pixel whose square meets the box's interior)."""
    h, w = mask.shape[-2:]
    ys = torch.arange(h, device=mask.device).view(1, h, 1)
    xs = torch.arange(w, device=mask.device).view(1, 1, w)
    b = boxes.to(mask.device).view(-1, 4, 1, 1)
    inside = ((xs + 1 > b[:, 0]) & (xs < b[:, 2]) & (ys + 1 > b[:, 1]) & (ys < b[:, 3])
              & (b[:, 2] > b[:, 0]) & (b[:, 3] > b[:, 1]))  # (a box of no area has no interior)
    return ((mask.unsqueeze(0) == values.to(mask.device).view(-1, 1, 1)) & inside).to(torch.uint8)


@nogil
def target_rows(names: List[str], cols: List[torch.Tensor], offsets: torch.Tensor, drop_crowds: bool
                ) -> Tuple[List[List[torch.Tensor]], Optional[torch.Tensor]]:
    """The torchvision form's per-box columns (``names``, ``cols``: packed, ``offsets`` the box offsets), per
    sample as views (:func:`split_rows`), ``boxes`` float32 and ``labels`` int64 1-based; with
    ``drop_crowds`` the rows whose ``iscrowd`` is set left out, batch-wide (and which rows were kept, None when
    all were). Scripted (dsc.nogil): one call a batch, where the conversions, the crowds' filter and a split
    a column each took the GIL back from Python."""
    cols = [c.to(torch.float32) if n == "boxes" else (c.to(torch.int64) + 1 if n == "labels" else c)
            for n, c in zip(names, cols)]
    keep: Optional[torch.Tensor] = None
    if drop_crowds and "iscrowd" in names and bool(cols[names.index("iscrowd")].any()):
        k = cols[names.index("iscrowd")] == 0
        cols = [c[k] for c in cols]
        kept = torch.zeros(k.shape[0] + 1, dtype=torch.int64, device=k.device)
        torch.cumsum(k, 0, out=kept[1:])
        offsets = kept[offsets]
        keep = k
    o: List[int] = offsets.tolist()
    return split_rows(cols, o), keep


def torchvision_form(batch: dict, schema: Schema, mask_values: torch.Tensor | None = None,
                     keep_crowd: bool = False, alloc=None) -> tuple:
    """``dsc.Loader(..., format="torchvision")``: ``(images, targets)`` as torchvision's models take them.

    ``images``: float (B, C, H, W) in [0, 1] (or as dsc.transforms' ToFloat / Normalize made them) when the
    batch's images are one size, else a list of (C, H, W) tensors. ``targets``: with boxes, a list of dicts
    ``{"boxes": float32 (k, 4) xyxy, "labels": int64 (k,) 1-based (0 is torchvision's background: label k
    is class ``classes[k - 1]``), "image_id" (the source's), "index" (the dataset's row), per-box columns
    (iscrowd, area, difficult...)}``, and when the
    dataset has a semantic mask, "mask" (H, W) int64 and "masks" uint8 (k, H, W), one per box: the pixels
    of the box's class inside the box (``mask_values``: each label's mask value; dsc stores class masks, not
    instances, so two overlapping boxes of one class share their pixels). A dataset compiled with
    ``--masks instance`` gives each box its own exact mask as "masks" instead, and one with keypoints
    "keypoints" float32 (k, K, 3). Crowd boxes (``iscrowd`` 1) are left out of the targets, with their masks
    and keypoints, unless ``keep_crowd`` (torchvision's reference recipe removes them); segmentation, the masks: int64
    (B, H, W) (or a list of (H, W)), with the dataset's ignore index for pixels of no class; classification,
    the labels (B,). Value fields (numbers, arrays, ragged, text, json, bytes) join each detection target dict
    (sample k's value); otherwise the target is a dict ``{"label" or "mask": ..., field: batch value}`` (ragged
    ones as lists of per-sample tensors), or, for a dataset whose only target is one field (a regression
    ``target``, multi-hot, multi-label ids), that field's batch value itself. ``alloc(name, shape, dtype)``:
    the Loader's ring (default: new tensors), where the float images and the (k, H, W) masks go: each
    sample's are views of one buffer for the batch (a batch or target the user keeps keeps its buffer from
    being reused: the ring then makes another)."""
    images = _packed_chw_floats(batch, alloc) if "image_offsets" in batch else \
        _chw_floats(sample_pixels(batch, "image"), alloc)
    values = {k: (ragged_list(batch, k) if f"{k}_offsets" in batch else batch[k]) for k in value_keys(schema)
              if k in batch}
    masks = [k for k, r in schema.pixels().items() if k != "image" and k in batch]
    mask = _each(sample_pixels(batch, masks[0]), lambda m: m.to(torch.int64)) if masks else None
    if "box_offsets" in batch:
        names = [k for k in schema.box_rows() if k in batch]
        per, keep = target_rows(names, [batch[k] for k in names], batch["box_offsets"], not keep_crowd)
        targets = [dict(zip(names, views)) for views in per]
        ids = batch["image_id"].tolist() if "image_id" in batch else []
        index = batch["index"].tolist() if "index" in batch and "index" not in schema else []  # the dataset row
        # the transforms' record of each sample's geometry (transforms/objects.py record_geometry)
        affine = batch["affine"].unbind(0) if "affine" in batch and "affine" not in schema else None
        flipped = batch["flipped"].tolist() if "flipped" in batch and "flipped" not in schema else None
        exact = [k for k in schema.object_masks() if k in batch]
        exact_masks = _target_masks(batch, exact[0], keep, alloc) if exact else None
        for k, t in enumerate(targets):
            if ids:
                t["image_id"] = ids[k]
            if index:
                t["index"] = index[k]
            if affine is not None:
                t["affine"] = affine[k]
            if flipped is not None:
                t["flipped"] = flipped[k]
            if exact:
                t["masks"] = exact_masks[k]
            t.update({name: v[k] for name, v in values.items()})
            if mask is not None:
                t["mask"] = mask[k]
                if mask_values is not None and not exact:
                    t["masks"] = instance_masks(mask[k], t["boxes"], mask_values.to(t["labels"].device)[t["labels"]])
        return images, targets
    if mask is not None:
        return images, mask if not values else {"mask": mask, **values}
    if "label" in batch:
        return images, batch["label"] if not values else {"label": batch["label"], **values}
    if len(values) == 1:  # a regression target, multi-hot or multi-label ids alone: the tensor (or list) itself
        return images, next(iter(values.values()))
    if values:
        return images, values
    raise ConfigError(f"format='torchvision' needs boxes, a mask or labels in the batch, which has "
                      f"{', '.join(map(repr, batch))}")
