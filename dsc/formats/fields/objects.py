"""The ``objects`` field: boxes of detection samples in the box-offset layout.

``objects/offsets`` (N+1,) int64: sample i owns rows ``[offsets[i], offsets[i+1])`` of ``objects/boxes``
(M, 4) float32 xyxy in stored-image pixels, ``objects/labels`` (M,) int64 and every per-box attribute
column ``objects/<name>`` (manifest ``objects.attributes``). Per sample: ``image_id`` (N,) int64 and
``transform/box_frame`` (N,) uint8. Batches are packed here (one gather per column, no Python loop per
box); the runtime turns them into its padded and list forms.
"""
from __future__ import annotations

from dataclasses import dataclass, field as dc_field
from pathlib import Path

import numpy as np

from ...errors import CorruptDatasetError
from ..zarr_v3 import read_plain_array, write_group, write_plain_array
from .base import CarriedPart, ColumnsParts, Field, Part, Reader, Role, raw_bytes, split_rows
from .pixels import valid_offsets

from ..names import (BOX_FRAME, IMAGE_ID, OBJ_BOXES as BOXES, OBJ_LABELS as LABELS, OBJ_OFFSETS as OFFSETS,
                      OBJECTS, ORIG_SIZE)
from ..problems import Problem, try_read


@dataclass
class ObjectsPart(Part):
    """The stored objects of one unit's samples, concatenated (box-offset layout)."""

    counts: list = dc_field(default_factory=list)  # boxes kept per sample
    boxes: list = dc_field(default_factory=list)  # (k, 4) float32 per sample
    labels: list = dc_field(default_factory=list)
    attrs: dict = dc_field(default_factory=dict)  # name -> list of per-sample arrays
    image_ids: list = dc_field(default_factory=list)
    frames: list = dc_field(default_factory=list)
    dropped: int = 0

    def add(self, value) -> None:
        """``value``: (target, stored boxes, kept mask, frame) of one sample."""
        t, boxes, keep, frame = value
        self.counts.append(int(keep.sum()))
        self.boxes.append(boxes[keep])
        self.labels.append(np.asarray(t.labels, np.int64)[keep])
        for name, col in t.attrs.items():
            self.attrs.setdefault(name, []).append(np.asarray(col)[keep])
        self.image_ids.append(t.image_id)
        self.frames.append(frame)
        self.dropped += int((~keep).sum())

    def pad(self, n: int) -> None:
        for _ in range(n):
            self.counts.append(0)
            self.boxes.append(np.zeros((0, 4), np.float32))
            self.labels.append(np.zeros(0, np.int64))
            for name in self.attrs:
                self.attrs[name].append(np.zeros(0))
            self.image_ids.append(-1)
            self.frames.append(0)

    def set_row(self, j: int, value) -> None:
        """Replace row ``j`` with ``value`` (as :meth:`add` takes it): a re-annotated sample, pixels kept."""
        other = ObjectsPart(attrs={name: [] for name in self.attrs})
        other.add(value)
        self.dropped += other.dropped
        self.counts[j], self.boxes[j], self.labels[j] = other.counts[0], other.boxes[0], other.labels[0]
        for name in self.attrs:
            self.attrs[name][j] = other.attrs.get(name, [np.zeros(0)])[0]
        self.image_ids[j], self.frames[j] = other.image_ids[0], other.frames[0]

    def to_json(self) -> dict:
        return {"counts": self.counts, "boxes": [b.tolist() for b in self.boxes],
                "labels": [x.tolist() for x in self.labels],
                "attrs": {k: [x.tolist() for x in v] for k, v in self.attrs.items()},
                "image_ids": self.image_ids, "frames": self.frames, "dropped": self.dropped}

    def columns(self, attributes: dict) -> dict:
        """This part as columns (``ColumnsParts``' shape): per sample ``counts``, ``image_ids``, ``frames``; each box
        column's rows (boxes, labels, each attribute of ``attributes`` {name: dtype}); ``dropped``."""
        counts = np.asarray(self.counts, np.int64)

        def cat(xs, dtype, width=1):
            data = (np.concatenate([np.asarray(x, dtype).reshape(-1, width) for x in xs]) if xs
                    else np.zeros((0, width), dtype))
            return data, counts * (data.itemsize * width)

        ragged = {"boxes": cat(self.boxes, np.float32, 4), "labels": cat(self.labels, np.int64)}
        for name, dtype in attributes.items():
            ragged[name] = cat(self.attrs.get(name, []), dtype)
        return {"flat": {"counts": counts, "image_ids": np.asarray(self.image_ids, np.int64),
                         "frames": np.asarray(self.frames, np.uint8)}, "ragged": ragged, "dropped": self.dropped}

    @classmethod
    def from_json(cls, d: dict, attr_dtypes: dict) -> "ObjectsPart":
        return cls(counts=list(d["counts"]), boxes=[np.asarray(b, np.float32).reshape(-1, 4) for b in d["boxes"]],
                   labels=[np.asarray(x, np.int64) for x in d["labels"]],
                   attrs={k: [np.asarray(x, attr_dtypes.get(k, "float64")) for x in v] for k, v in d["attrs"].items()},
                   image_ids=list(d["image_ids"]), frames=list(d["frames"]), dropped=int(d["dropped"]))


def object_rows(cols: dict, attributes: dict) -> CarriedPart:
    """Rows of a base version's objects as columns (what an update or a compaction carries a slot over with)."""
    def to_part(c):
        counts, ragged = c["flat"]["counts"], c["ragged"]
        box = {name: split_rows(data.view(np.dtype(dtype)).reshape(-1, 4) if name == "boxes" else
                                data.view(np.dtype(dtype)).reshape(-1), counts)
               for name, dtype in (("boxes", np.float32), ("labels", np.int64), *attributes.items())
               for data in [raw_bytes(ragged[name][0])]}
        return ObjectsPart(counts=counts.tolist(), boxes=box["boxes"], labels=box["labels"],
                           attrs={k: box[k] for k in attributes}, image_ids=c["flat"]["image_ids"].tolist(),
                           frames=c["flat"]["frames"].tolist(), dropped=int(c.get("dropped", 0)))
    return CarriedPart(cols, to_part, fill={"image_ids": -1})


def gather_rows(offsets: np.ndarray, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Row numbers of samples ``idx`` in the box columns, and the batch's (B+1,) box offsets."""
    starts, counts = offsets[idx], offsets[idx + 1] - offsets[idx]
    box_offsets = np.zeros(len(idx) + 1, np.int64)
    np.cumsum(counts, out=box_offsets[1:])
    rows = np.arange(box_offsets[-1], dtype=np.int64) - np.repeat(box_offsets[:-1] - starts, counts)
    return rows, box_offsets


class ObjectsReader(Reader):
    def __init__(self, store, m, attributes: dict):
        n, M = m.num_rows, int(m.objects["num_boxes"])
        self.offsets = store.array(OFFSETS, (n + 1,))
        if not valid_offsets(self.offsets, M):
            raise CorruptDatasetError(f"{store.root}/{OFFSETS} is not a valid box-offset index for {M} boxes")
        self.columns = {"boxes": store.array(BOXES, (M, 4)), "labels": store.array(LABELS, (M,))}
        for name in attributes:
            self.columns[name] = store.array(f"{OBJECTS}/{name}", (M,))
        self.image_ids = store.array(IMAGE_ID, (n,))
        self.orig = store.array(ORIG_SIZE, (n, 2))
        self._store, self._n, self._frames = store, n, None

    @property
    def frames(self) -> np.ndarray:
        """(rows,) uint8: the frame each sample's boxes were annotated in (read on first use)."""
        if self._frames is None:
            self._frames = self._store.array(BOX_FRAME, (self._n,))
        return self._frames

    def sample(self, i: int) -> dict:
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        out = {name: col[a:b] for name, col in self.columns.items()}
        out["image_id"] = int(self.image_ids[i])
        out["orig_size"] = tuple(int(v) for v in self.orig[i])
        return out

    def gather(self, idx: np.ndarray, alloc, forms: dict) -> dict:
        """Packed: every column's rows of the batch, ``box_offsets`` (B+1,), ``image_id``, ``orig_size``."""
        rows, box_offsets = gather_rows(self.offsets, idx)
        out = {}
        for name, col in self.columns.items():
            out[name] = np.take(col, rows, axis=0, out=alloc(name, (len(rows), *col.shape[1:]), col.dtype))
        out["box_offsets"] = alloc("box_offsets", box_offsets.shape, np.dtype(np.int64))
        out["box_offsets"][:] = box_offsets
        out["image_id"] = np.take(self.image_ids, idx, out=alloc("image_id", (len(idx),), np.dtype(np.int64)))
        out["orig_size"] = np.take(self.orig, idx, axis=0, out=alloc("orig_size", (len(idx), 2), self.orig.dtype))
        return out

    def split(self, batch: dict, k: int) -> dict:
        out = {}
        if "box_offsets" in batch:
            o = batch["box_offsets"]
            a, b = int(o[k]), int(o[k + 1])
            out.update({name: batch[name][a:b] for name in self.columns})
        out["image_id"] = int(batch["image_id"][k])
        out["orig_size"] = tuple(int(v) for v in batch["orig_size"][k].tolist())
        return out


class ObjectsField(Field):
    kind = "objects"
    name = "objects"

    def __init__(self, attributes: dict):
        self.attributes = dict(attributes)  # extra per-box columns: name -> dtype

    @classmethod
    def from_manifest(cls, m) -> list["ObjectsField"]:
        return [cls(m.objects.get("attributes", {}))] if m.objects is not None else []

    def part(self, root: Path, s: int, capacity: int) -> ObjectsPart:
        return ObjectsPart()

    def load_part(self, d: dict) -> ObjectsPart:
        return ObjectsPart.from_json(d, self.attributes)

    def collect(self, S: int, N: int, K: int, s0: int = 0) -> ColumnsParts:
        return ColumnsParts(S, N, K, lambda cols: object_rows(cols, self.attributes),
                            lambda part: part.columns(self.attributes))

    def rows_part(self, reader: ObjectsReader, start: int, count: int, shard) -> CarriedPart:
        """Rows ``[start, start + count)`` of the base as its arrays, in one slice a column (no object a row)."""
        off = reader.offsets
        a, b = int(off[start]), int(off[start + count])
        counts = np.diff(off[start:start + count + 1]).astype(np.int64)
        ragged = {}
        for name, dtype in (("boxes", np.float32), ("labels", np.int64), *self.attributes.items()):
            data = np.ascontiguousarray(reader.columns[name][a:b], np.dtype(dtype))
            ragged[name] = (data, counts * (data.itemsize * (4 if name == "boxes" else 1)))
        return object_rows({"flat": {"counts": counts,
                                     "image_ids": np.asarray(reader.image_ids[start:start + count], np.int64),
                                     "frames": np.asarray(reader.frames[start:start + count], np.uint8)},
                            "ragged": ragged, "dropped": 0}, self.attributes)

    def empty_part(self) -> ObjectsPart:
        return ObjectsPart(attrs={name: [] for name in self.attributes})

    def finish(self, root: Path, parts: ColumnsParts, n: int, K: int) -> dict:
        counts = parts.flat("counts", np.int64)  # (a ColumnsParts: every version's, Field.collect; the kept rows)
        offsets = np.zeros(len(counts) + 1, np.int64)
        np.cumsum(counts, out=offsets[1:])
        write_group(root, OBJECTS)
        write_plain_array(root, OFFSETS, offsets, ["sample_edge"])
        write_plain_array(root, BOXES, parts.ragged("boxes", np.float32, (4,)), ["box", "xyxy"])
        write_plain_array(root, LABELS, parts.ragged("labels", np.int64), ["box"])
        for name, dtype in self.attributes.items():
            write_plain_array(root, f"{OBJECTS}/{name}", parts.ragged(name, np.dtype(dtype)), ["box"])
        write_plain_array(root, IMAGE_ID, parts.flat("image_ids", np.int64), ["sample"])
        write_plain_array(root, BOX_FRAME, parts.flat("frames", np.uint8), ["sample"])
        return {"objects": {"num_boxes": int(offsets[-1]), "box_format": "xyxy", "attributes": dict(self.attributes),
                            "dropped_boxes": int(parts.dropped),
                            "images_without_boxes": int((counts == 0).sum())}}

    def reader(self, store, m) -> ObjectsReader:
        return ObjectsReader(store, m, self.attributes)

    def verify(self, root: Path, m, problems: list, context: dict) -> None:
        n = m.num_rows
        off = try_read(problems, OFFSETS, lambda: read_plain_array(root, OFFSETS))
        boxes = try_read(problems, BOXES, lambda: read_plain_array(root, BOXES))
        labels = try_read(problems, LABELS, lambda: read_plain_array(root, LABELS))
        if off is None or boxes is None or labels is None:
            return
        M = len(boxes)
        if off.shape != (n + 1,) or not valid_offsets(off, M):
            bad = np.flatnonzero(np.diff(off) < 0).tolist() if off.shape == (n + 1,) else []
            problems.append(Problem(OFFSETS, f"not a valid box-offset index for {M} boxes", bad))
            return
        sample_of, h, w = row_image_sizes(m, off, context)
        if h is None:
            return
        finite = np.all(np.isfinite(boxes), axis=1)
        inside = finite & (boxes[:, 0] >= 0) & (boxes[:, 1] >= 0) & (boxes[:, 2] <= w) & (boxes[:, 3] <= h) \
            & (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])
        if not inside.all():
            problems.append(Problem(BOXES, "boxes not finite, empty, or outside their image",
                                    sorted(set(sample_of[~inside].tolist()))))
        bad_label = (labels < 0) | (labels >= max(1, len(m.classes)))
        if bad_label.any():
            problems.append(Problem(LABELS, f"box labels outside 0..{len(m.classes) - 1}",
                                    sorted(set(sample_of[bad_label].tolist()))))

    def roles(self) -> dict[str, Role]:
        return {"boxes": Role("boxes"), "labels": Role("box_rows"), **{k: Role("box_rows") for k in self.attributes}}


def row_image_sizes(manifest, box_off: np.ndarray, context: dict):
    """For ``dsc verify`` of per-box rows: (the sample of each row, its image's height and width per row), the
    sizes None when they are not known (ragged images whose shapes could not be read)."""
    M = int(box_off[-1]) if len(box_off) else 0
    sample_of = np.repeat(np.arange(len(box_off) - 1), np.diff(box_off))
    shapes = context.get("image_shapes")
    if manifest.image.layout == "fixed":
        return sample_of, np.full(M, manifest.image.height), np.full(M, manifest.image.width)
    if shapes is not None:
        return sample_of, shapes[sample_of, 0], shapes[sample_of, 1]
    return sample_of, None, None
