"""The ``label`` field: one int64 class index per sample (classification), at ``label`` (N,)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..zarr_v3 import read_plain_array, write_plain_array
from .base import Field, FlatParts, Part, Reader, Role, run_index

from ..names import LABEL as NODE
from ..problems import Problem, try_read


class LabelPart(Part):
    def __init__(self, labels=None):
        self.labels = [] if labels is None else labels

    def add(self, value: int) -> None:
        self.labels.append(int(value))

    def to_json(self) -> dict:
        return {"labels": self.labels}

    def pad(self, n: int) -> None:
        self.labels.extend([-1] * n)  # a hole has no class


class LabelParts(FlatParts):
    """The labels of a compile's units (or an update's, a compaction's slots: ``compile.fold_slots``) in one flat
    array by input position (no part object a unit)."""

    def __init__(self, S: int, N: int, K: int):
        self.S, self.K = S, K
        self.labels = np.zeros(N, np.int64)
        self.kept: np.ndarray | None = None

    def add(self, u: int, part: LabelPart, rows: np.ndarray) -> None:
        n = len(rows)
        if n:  # (one run of inputs unless some were skipped: a slice then)
            at = run_index(rows)
            self.labels[at] = part.labels

    def values(self) -> np.ndarray:
        """Every kept sample's label, in order (once settled)."""
        return self.labels[self.kept]

    def _item(self, u: int) -> LabelPart:
        return LabelPart(self.labels[self.unit_rows(u)].tolist())


class LabelReader(Reader):
    """The labels, read whole when first used (not at open: 8 bytes a sample; their metadata is checked then)."""

    def __init__(self, store, n: int):
        self._store, self._labels = store, None
        self._meta = store.check_array(NODE, (n,))  # (every store a reader gets is a layout.Arrays)

    @property
    def labels(self) -> np.ndarray:
        if self._labels is None:  # (its zarr.json read once, at open)
            self._labels = self._store.checked_array(NODE, self._meta)
        return self._labels

    def sample(self, i: int) -> dict:
        return {"label": int(self.labels[i])}

    def gather(self, idx: np.ndarray, alloc, forms: dict) -> dict:
        out = alloc("label", (len(idx),), np.dtype(np.int64))
        np.take(self.labels, idx, out=out)
        return {"label": out}

    def split(self, batch: dict, k: int) -> dict:
        return {"label": int(batch["label"][k])}


class LabelField(Field):
    kind = "label"
    name = "label"

    @classmethod
    def from_manifest(cls, m) -> list["LabelField"]:
        return [cls()] if m.task == "classification" else []

    def part(self, root: Path, s: int, capacity: int) -> LabelPart:
        return LabelPart()

    def load_part(self, d: dict) -> LabelPart:
        return LabelPart([int(v) for v in d["labels"]])

    def collect(self, S: int, N: int, K: int, s0: int = 0) -> LabelParts:
        return LabelParts(S, N, K)

    def rows_part(self, reader: LabelReader, start: int, count: int, shard) -> LabelPart:
        return LabelPart(reader.labels[start:start + count].tolist())

    def empty_part(self) -> LabelPart:
        return LabelPart()

    def finish(self, root: Path, parts, n: int, K: int) -> dict:
        write_plain_array(root, NODE, parts.values(), ["sample"])  # (a LabelParts: every version's, Field.collect)
        return {}

    def reader(self, store, m) -> LabelReader:
        return LabelReader(store, m.num_rows)

    def verify(self, root: Path, m, problems: list, context: dict) -> None:
        labels = try_read(problems, NODE, lambda: read_plain_array(root, NODE))
        if labels is None:
            return
        if labels.shape != (m.num_rows,):
            problems.append(Problem(NODE, f"has shape {labels.shape}, expected ({m.num_rows},)"))
            return
        live = context.get("live")
        bad = np.flatnonzero(((labels < 0) | (labels >= max(1, len(m.classes)))) & (True if live is None else live))
        if len(bad):
            problems.append(Problem(NODE, f"labels outside 0..{len(m.classes) - 1}", bad.tolist()))

    def roles(self) -> dict[str, Role]:
        return {"label": Role("sample")}
