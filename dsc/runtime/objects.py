"""Detection batches: the box-offset index, and the three batch forms users choose between.

``packed`` (default): all boxes of the batch back to back, ``box_offsets`` (B+1,): image b owns rows
``box_offsets[b]:box_offsets[b+1]``. No padding, one tensor per column, one host-to-device copy.
``padded``: (B, max_k, ...) with ``box_mask`` and ``box_counts``; labels padded with -1.
``list``: torchvision-style list of per-image target dicts (views of the packed tensors).
All conversions are batched tensor ops with no Python loop per box.
"""
from __future__ import annotations

import numpy as np
import torch

BOX_FORMS = ("packed", "padded", "list")


def gather_rows(offsets: np.ndarray, idx: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """Row numbers of samples ``idx`` in the box columns, and the batch's (B+1,) box offsets."""
    starts, counts = offsets[idx], offsets[idx + 1] - offsets[idx]
    box_offsets = np.zeros(len(idx) + 1, np.int64)
    np.cumsum(counts, out=box_offsets[1:])
    rows = np.arange(box_offsets[-1], dtype=np.int64) - np.repeat(box_offsets[:-1] - starts, counts)
    return torch.from_numpy(rows), torch.from_numpy(box_offsets)


def new_tensor(name: str, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
    """The default allocator: a new tensor (the Loader passes its ring of reusable, pinned buffers)."""
    return torch.empty(shape, dtype=dtype)


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
