"""Batch forms: how gathered fields are handed to the user.

* ``Batch``: the dict of tensors a batch is, carrying the dataset's :class:`~dsc.formats.fields.Schema`
  (which keys are pixels, boxes, box rows), so transforms never guess;
* boxes ``packed`` (default: every box of the batch back to back, ``box_offsets`` (B+1,): image b owns
  rows ``box_offsets[b]:box_offsets[b+1]``), ``padded`` ((B, max_k, ...) with ``box_mask`` and
  ``box_counts``; labels padded with -1) or ``list`` (torchvision-style target dicts, views of the packed
  tensors). All conversions are batched tensor ops with no Python loop per box;
* ragged images ``packed`` or ``padded`` (done by the field readers, see ``formats/fields/pixels.py``);
* ``SampleBatch`` / ``collate``: what torch's DataLoader gets from ``Dataset.__getitems__``.
"""
from __future__ import annotations

import numpy as np
import torch

from ..formats.fields import Schema

BOX_FORMS = ("packed", "padded", "list")
IMAGE_FORMS = ("packed", "padded")


class Batch(dict):
    """A batch: {key: tensor}. ``schema`` says what each key is to geometric transforms."""

    schema: Schema | None = None

    def __init__(self, *args, schema: Schema | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.schema = schema

    def to(self, device, non_blocking: bool = False) -> "Batch":
        """Every tensor on ``device`` (lists of target dicts too); the schema stays with the batch."""
        def move(v):
            if isinstance(v, torch.Tensor):
                return v.to(device, non_blocking=non_blocking)
            if isinstance(v, list):
                return [move(x) for x in v]
            if isinstance(v, dict):
                return {k: move(x) for k, x in v.items()}
            return v
        return Batch({k: move(v) for k, v in self.items()}, schema=self.schema)


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
                                             (np.uint32, torch.uint32))}


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


def packed_to_list(box_offsets: torch.Tensor, columns: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
    """Per-image target dicts whose tensors are views of the packed columns (torchvision's form)."""
    o = box_offsets.tolist()
    return [{name: col[o[b]:o[b + 1]] for name, col in columns.items()} for b in range(len(o) - 1)]


def box_form(batch: dict, schema: Schema, form: str, alloc=new_tensor) -> dict:
    """Turn a batch's packed box rows into ``form`` (packed: unchanged)."""
    if form == "packed" or "box_offsets" not in batch:
        return batch
    rows = [k for k in schema.box_rows() if k in batch]
    cols = {k: batch.pop(k) for k in rows}
    offsets = batch.pop("box_offsets")
    if form == "padded":
        batch.update(packed_to_padded(offsets, cols, alloc))
    else:
        targets = packed_to_list(offsets, cols)
        for t, iid in zip(targets, batch["image_id"].tolist() if "image_id" in batch else []):
            t["image_id"] = iid
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


def collate(batch):
    """``collate_fn`` for torch's DataLoader: a :class:`SampleBatch` is already batched, so its fields
    are returned with no second copy; anything else goes to ``default_collate``."""
    if isinstance(batch, SampleBatch):
        return batch.fields
    return torch.utils.data.default_collate(batch)
