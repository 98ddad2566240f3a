"""The field-kind protocol: one class per kind of per-sample field (image, label, objects, mask...).

A field kind knows, in one module:

* its **format**: the nodes it owns and what it adds to the manifest (``from_manifest`` reads it back);
* how a compile **unit accumulates** it (``part``: one shard's worth of samples, JSON for the resume
  journal) and how the driver **finishes** it from every unit's part (``finish``);
* how the runtime **reads** it (``reader``: one sample, a batch gathered into preallocated buffers);
* how ``dsc verify`` **checks** it (``verify``);
* how geometric transforms **move** it (``roles``: which batch keys are pixels, boxes, box rows).

Everything here is numpy and JSON: the compiler and the runtime both build on it (they meet only in
``formats/``), and the runtime wraps the arrays as tensors.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, ClassVar

import numpy as np

Alloc = Callable[[str, tuple, np.dtype], np.ndarray]  # (name, shape, dtype) -> a writable output array


@dataclass(frozen=True)
class Role:
    """How geometric transforms treat one batch key.

    ``pixels``: an image-like (B, H, W[, C]) key, resampled (``resample`` = bilinear | nearest) with
    ``fill`` outside the image (None: the op's own fill, e.g. Letterbox's); ``boxes``: (M, 4) xyxy boxes
    packed by ``box_offsets``; ``box_rows``: another per-box column (filtered with the boxes);
    ``sample``: a per-sample value no geometric op changes; ``value``, ``ragged``, ``host``: a value field's
    (``columns.py``): gathered to the device, packed with ``<key>_offsets``, kept on the host as a list; no
    op moves them. ``tail``: a pixels key's trailing axes (its channels), which an empty ragged batch cannot
    show. ``object_masks``: one binary mask per box row, packed as crops (``fields/object_masks.py``);
    ``keypoints``: (M, K, 3) joints per box row, whose ``flip_index`` says which joint each becomes under a
    horizontal flip. Both move with the boxes (``dsc/transforms/objects.py``)."""

    kind: str
    resample: str = "bilinear"
    fill: float | None = None
    tail: tuple = ()  # pixels: each sample's trailing axes after (H, W), e.g. (3,) for RGB
    flip_index: tuple | None = ()  # keypoints: joint j becomes joint flip_index[j] under a horizontal flip
    # (None: the dataset does not know its permutation; flips keep the joints in place)


class Schema(dict):
    """{batch key: Role} of a dataset's batches (``ds.schema``); transforms read it instead of guessing."""

    def pixels(self) -> dict[str, Role]:
        return {k: r for k, r in self.items() if r.kind == "pixels"}

    def box_rows(self) -> list[str]:
        return [k for k, r in self.items() if r.kind in ("boxes", "box_rows", "keypoints")]

    def object_masks(self) -> list[str]:
        return [k for k, r in self.items() if r.kind == "object_masks"]

    def keypoints(self) -> dict[str, Role]:
        return {k: r for k, r in self.items() if r.kind == "keypoints"}

    @classmethod
    def default(cls) -> "Schema":
        """For a plain dict batch with nothing but ``image``: which other keys are masks, boxes or per-box
        rows is the dataset's to say (``ds.schema``), never guessed."""
        return cls(image=Role("pixels"))


BATCH_SUFFIXES = ("_offsets", "_shapes", "_sizes")  # a ragged or padded key's companions in a batch


def drop_companions(batch: dict, key: str) -> None:
    """Remove ``key``'s ragged or padded companions (``key_offsets``, ``key_shapes``, ``key_sizes``) from
    ``batch``: for an op that makes ``key`` one dense tensor again."""
    for suffix in BATCH_SUFFIXES:
        batch.pop(key + suffix, None)


class Batch(dict):
    """A batch: {key: tensor}. ``schema`` says what each key is to geometric transforms."""

    schema: Schema | None = None

    def __init__(self, *args, schema: Schema | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.schema = schema

    def to(self, device, non_blocking: bool = False) -> "Batch":
        """Every tensor on ``device`` (lists of target dicts too); the schema stays with the batch."""
        def move(v):
            if isinstance(v, list):
                return [move(x) for x in v]
            if isinstance(v, dict):
                return {k: move(x) for k, x in v.items()}
            if hasattr(v, "to"):  # a tensor (formats/ does not import torch)
                return v.to(device, non_blocking=non_blocking)
            return v
        return Batch({k: move(v) for k, v in self.items()}, schema=self.schema)


class Part:
    """One unit's share of a field: accumulated sample by sample in a worker, journaled as JSON."""

    def add(self, value) -> None:
        raise NotImplementedError

    def close(self) -> "Part":
        """The unit finished: publish what it wrote (shard files)."""
        return self

    def abort(self) -> None:
        """The unit failed: remove what it wrote."""

    def to_json(self) -> dict:
        raise NotImplementedError

    def pad(self, n: int) -> None:
        """Append ``n`` holes: rows of the shard grid with no sample (format 3; see docs/FORMAT.md)."""
        raise NotImplementedError


def run_index(rows: np.ndarray):
    """An index of the input ``rows`` (ascending) for writing their values into a column: a slice when they are
    one run (a unit none of whose inputs was skipped), cheaper than the index array."""
    n = len(rows)
    return slice(int(rows[0]), int(rows[0]) + n) if n and int(rows[-1]) - int(rows[0]) == n - 1 else rows


class RowBuffer:
    """Rows of varying size by position (``N`` of them), put in any order into one buffer: each position's length
    (bytes) and where its bytes start there in flat arrays, no object a row or a part; ``gather`` joins the rows of
    some positions in their order (what ``ColumnsParts`` keeps a ragged column in)."""

    def __init__(self, N: int):
        self.lengths, self.start = np.zeros(N, np.int64), np.zeros(N, np.int64)
        self.buf = bytearray()

    def put(self, rows: np.ndarray, data: np.ndarray, lengths: np.ndarray) -> None:
        """Positions ``rows`` (ascending) hold ``lengths`` bytes each of ``data`` (any dtype), back to back."""
        if len(rows):
            at = run_index(rows)
            self.lengths[at] = lengths
            self.start[at] = len(self.buf) + np.cumsum(lengths) - lengths
            self.buf += memoryview(raw_bytes(data))

    def gather(self, positions) -> tuple[np.ndarray, np.ndarray]:
        """(the rows' bytes back to back as uint8, each one's length) of ``positions`` (a mask or indices)."""
        lengths, start = self.lengths[positions], self.start[positions]
        offs = np.cumsum(lengths) - lengths
        idx = np.arange(int(lengths.sum()), dtype=np.int64) + np.repeat(start - offs, lengths)
        return np.frombuffer(self.buf, np.uint8)[idx], lengths


class LazySequence(Sequence):
    """A sequence whose items are made on access (``_item(i)``, ``0 <= i < len(self)``) from flat arrays it holds:
    indexing from the end and slices (a list of items) as a list's."""

    def _item(self, i: int):
        raise NotImplementedError

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self._item(k) for k in range(*i.indices(len(self)))]
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(i)
        return self._item(i)


class Parts(Sequence):
    """Every compile unit's part of one field, gathered as the units finish (in any order: ``add``) and read back
    in unit order (what ``Field.finish`` takes). This one keeps each unit's part; a field whose parts are a few
    numbers a sample keeps those in flat arrays instead (``Field.collect``), so that a compile of many small
    units holds no object per unit. ``S`` units; unit u holds inputs ``[u*K, u*K + K)`` of ``N``."""

    def __init__(self, S: int, N: int = 0, K: int = 1):
        self._parts: list = [None] * S

    def add(self, u: int, part: Part, rows: np.ndarray) -> None:
        """Unit ``u``'s part; ``rows``: the inputs (0..N-1) its samples are, in order."""
        self._parts[u] = part

    def settle(self, kept: np.ndarray) -> None:
        """Every unit is in; ``kept`` (N,) bool says which inputs became samples."""

    def set_shard(self, u: int, shard) -> None:
        """A compaction moved unit ``u``'s shard (image-like fields)."""
        self._parts[u].shard = shard

    def keep_slots(self, S: int) -> None:
        """The version has the first ``S`` of these slots (an update drops the empty ones after its last shard)."""
        del self._parts[S:]

    def __len__(self) -> int:
        return len(self._parts)

    def __getitem__(self, u):
        if isinstance(u, slice):
            return [self[i] for i in range(*u.indices(len(self)))]
        return self._parts[u]


class FlatParts(LazySequence, Parts):
    """Parts kept in flat arrays by input position (``Field.collect``): ``S`` units of ``K`` inputs each; once
    settled, ``kept`` says which inputs became samples. Unit ``u``'s part is made on access (``_item``)."""

    S: int
    K: int
    kept: "np.ndarray | None" = None

    def settle(self, kept: np.ndarray) -> None:
        self.kept = kept

    def keep_slots(self, S: int) -> None:
        self.S = S

    def __len__(self) -> int:
        return self.S

    def unit_rows(self, u: int) -> np.ndarray:
        """The inputs unit ``u``'s samples are (once settled)."""
        lo = u * self.K
        return lo + np.flatnonzero(self.kept[lo:lo + self.K])


def _count(positions) -> int:
    """How many rows ``positions`` (a bool mask or indices) names."""
    return int(np.count_nonzero(positions)) if np.asarray(positions).dtype == bool else len(positions)


class CarriedPart(Part):
    """A base version's rows as arrays, in the ``columns`` shape of ``ColumnsParts`` (``flat``: {name: a value a
    sample}; ``ragged``: {name: (bytes back to back, each sample's length in bytes)}): what an update or a
    compaction carries a slot over with, no object a row. ``to_part(cols)`` makes the kind's own part from them,
    only when a row is set (a re-annotated sample) or the part is journaled; ``fill``: a padded hole's values, a
    flat column's (0 where not named) or a ragged column's bytes (none where not named)."""

    def __init__(self, cols: dict, to_part, fill: dict | None = None):
        self.cols, self._to_part, self._fill, self._part = cols, to_part, fill or {}, None

    def columns(self, *spec) -> dict:
        return self.cols if self._part is None else self._part.columns(*spec)

    def _as_part(self) -> Part:
        if self._part is None:
            self._part = self._to_part(self.cols)
        return self._part

    def pad(self, n: int) -> None:
        if self._part is not None:
            return self._part.pad(n)
        flat = self.cols["flat"]
        for name, col in flat.items():
            flat[name] = np.concatenate([col, np.full(n, self._fill.get(name, 0), col.dtype)])
        for name, (data, lengths) in self.cols["ragged"].items():
            hole = self._fill.get(name, b"")
            if hole:
                data = np.concatenate([raw_bytes(data),
                                       np.frombuffer(hole * n, np.uint8)])
            self.cols["ragged"][name] = (data, np.concatenate([lengths, np.full(n, len(hole), np.int64)]))

    def set_row(self, j: int, value) -> None:
        self._as_part().set_row(j, value)

    def to_json(self) -> dict:
        return self._as_part().to_json()


def raw_bytes(a) -> np.ndarray:
    """An array's elements as its flat uint8 bytes, C order (a copy only where it is not contiguous)."""
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def split_rows(data: np.ndarray, counts: np.ndarray) -> list[np.ndarray]:
    """``data``'s rows cut into consecutive pieces of ``counts`` rows (a list a sample: a kind's own part)."""
    return np.split(data, np.cumsum(counts)[:-1]) if len(counts) else []


class ColumnsParts(FlatParts):
    """A kind's parts of a compile's units (or an update's, a compaction's slots: ``compile.fold_slots``) by input
    position, with no object kept a unit: each part's ``columns()`` (see ``CarriedPart``) put into flat arrays (a
    value a sample) and ``RowBuffer``s (rows of varying size), read back for the kept rows (``flat``, ``ragged``)
    or as unit u's ``CarriedPart`` (``carried(cols)``). ``dropped``: the parts' ``dropped`` counts, summed."""

    def __init__(self, S: int, N: int, K: int, carried, columns_of=None):
        self.S, self.N, self.K, self.carried = S, N, K, carried
        self.columns_of = columns_of or (lambda part: part.columns())  # (a kind whose parts need its spec to say)
        self._flat: dict[str, np.ndarray] = {}
        self._ragged: dict[str, RowBuffer] = {}
        self.dropped = 0
        self.kept: np.ndarray | None = None

    def add(self, u: int, part, rows: np.ndarray) -> None:
        c = self.columns_of(part)
        if len(rows):
            at = run_index(rows)
            for name, col in c["flat"].items():
                if name not in self._flat:
                    self._flat[name] = np.zeros(self.N, col.dtype)
                self._flat[name][at] = col
            for name, (data, lengths) in c["ragged"].items():
                self._ragged.setdefault(name, RowBuffer(self.N)).put(rows, data, lengths)
        self.dropped += int(c.get("dropped", 0))

    def flat(self, name: str, dtype, positions=None) -> np.ndarray:
        """Flat column ``name`` at ``positions`` (default: the kept rows)."""
        positions = self.kept if positions is None else positions
        col = self._flat.get(name)
        return col[positions] if col is not None else np.zeros(_count(positions), dtype)

    def rows(self, name: str, positions=None) -> tuple[np.ndarray, np.ndarray]:
        """(ragged column ``name``'s bytes of ``positions`` (default: the kept rows) back to back, as uint8; each
        one's length)."""
        positions = self.kept if positions is None else positions
        buf = self._ragged.get(name)
        if buf is None:
            return np.zeros(0, np.uint8), np.zeros(_count(positions), np.int64)
        return buf.gather(positions)

    def ragged(self, name: str, dtype, shape: tuple = (), positions=None) -> np.ndarray:
        """Ragged column ``name``'s rows of ``positions`` (default: the kept rows), back to back, (-1, *shape)."""
        return self.rows(name, positions)[0].view(dtype).reshape(-1, *shape)

    def _item(self, u: int):
        at = self.unit_rows(u)
        return self.carried({"flat": {n: c[at] for n, c in self._flat.items()},
                             "ragged": {n: b.gather(at) for n, b in self._ragged.items()}, "dropped": 0})


class Field:
    """Base of every field kind. ``name`` is its key in samples and batches."""

    kind: ClassVar[str] = ""
    in_fields: ClassVar[bool] = False  # described under the manifest's `fields` (kinds after format version 1)
    # its rows are made while the sample is decoded (placed by the image's geometry: compile-time resize, EXIF
    # orientation), so an update decodes a sample again when its annotations change
    placed_at_decode: ClassVar[bool] = False
    name: str = ""

    # ------------------------------------------------------------------ format
    @classmethod
    def from_manifest(cls, manifest) -> list["Field"]:
        """The fields of this kind the dataset has (usually zero or one)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ compile
    def part(self, root: Path, s: int, capacity: int) -> Part:
        raise NotImplementedError

    def load_part(self, d: dict) -> Part:
        raise NotImplementedError

    def collect(self, S: int, N: int, K: int, s0: int = 0) -> Parts:
        """Where a compile gathers this field's parts of its ``S`` units (the first is slot ``s0``) as they finish
        (see :class:`Parts`)."""
        return Parts(S, N, K)

    def finish(self, root: Path, parts: list[Part], n: int, K: int) -> dict:
        """Write the field's arrays from every unit's part (in unit order, shards already compacted);
        returns what it adds to the manifest (keyword -> value; ``fields`` entries are merged)."""
        raise NotImplementedError

    def rows_part(self, reader: "Reader", start: int, count: int, shard) -> Part:
        """A part holding rows ``[start, start + count)`` of an open version (``reader``) as they are, with
        their shard ``shard`` (image-like fields): what an update carries over without touching a pixel."""
        raise NotImplementedError

    def empty_part(self) -> Part:
        """A part with no rows (a slot a version drops), to be padded with holes."""
        raise NotImplementedError

    # ------------------------------------------------------------------ read
    def reader(self, store, manifest) -> "Reader":
        raise NotImplementedError

    # ------------------------------------------------------------------ verify
    def verify(self, root: Path, manifest, problems: list, context: dict) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------------ transforms
    def roles(self) -> dict[str, Role]:
        return {}

    @classmethod
    def batch_keys_of(cls, name: str) -> tuple[str, ...]:
        """The batch keys a field of this kind named ``name`` fills besides the ragged companions every key may
        have (``BATCH_SUFFIXES``): no other field may be named one of them (a compile refuses it:
        ``manifest.batch_name_problem``'s ``taken``; an open refuses a manifest where one is)."""
        return (name,)

    def describe(self) -> str:
        """One line for ``dsc info`` (the image, label and objects have their own lines there)."""
        return self.kind


class Reader:
    """A field opened for reading. ``sample(i)``: its keys of ``ds[i]``; ``gather(idx, alloc, forms)``:
    its keys of a batch (``forms``: the batch forms, ``images`` packed | padded, and ``reads``, the runtime's
    read strategy or None: see ``pixels.PixelsReader``); ``split(batch, k)``: sample ``k``'s keys as views
    of a gathered batch."""

    def sample(self, i: int) -> dict:
        raise NotImplementedError

    def gather(self, idx: np.ndarray, alloc: Alloc, forms: dict) -> dict:
        raise NotImplementedError

    def split(self, batch: dict, k: int) -> dict:
        raise NotImplementedError


def from_json_array(v, dtype, shape=(-1,)) -> np.ndarray:
    return np.asarray(v, dtype).reshape(shape)
