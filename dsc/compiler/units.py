"""A work unit: decode, resize and write one shard (runs in a worker process), and its result.

A unit's result is everything the driver needs to finish the dataset without touching the pixels
again; it round-trips through JSON (``to_json`` / ``from_json``) for the resume journal.
"""
from __future__ import annotations

import ctypes
import signal
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import SampleError
from ..formats import ShardSpec
from .boxes import boxes_in_display_frame, to_stored
from .decode import Decoded, decode_image, to_mode
from .inputs import fetcher, where
from .geometry import apply_plan, plan_fixed, plan_ragged
from .options import CompileOptions
from .resample import single_threaded
from .sources.base import Record, Target
from .writer import FixedShardWriter, RaggedShardWriter


@dataclass(frozen=True)
class UnitTask:
    s: int
    start: int
    records: list[Record]
    root: str
    options: CompileOptions
    shard_size: int
    input: dict = field(default_factory=lambda: {"kind": "file"})


@dataclass
class Objects:
    """The stored objects of the samples of one unit, concatenated (box-offset layout)."""

    counts: list = field(default_factory=list)  # boxes kept per sample
    boxes: list = field(default_factory=list)  # (k, 4) float32 per sample
    labels: list = field(default_factory=list)
    attrs: dict = field(default_factory=dict)  # name -> list of per-sample arrays
    image_ids: list = field(default_factory=list)
    frames: list = field(default_factory=list)
    dropped: int = 0

    def to_json(self) -> dict:
        return {"counts": self.counts, "boxes": [b.tolist() for b in self.boxes],
                "labels": [x.tolist() for x in self.labels],
                "attrs": {k: [x.tolist() for x in v] for k, v in self.attrs.items()},
                "image_ids": self.image_ids, "frames": self.frames, "dropped": self.dropped}

    @classmethod
    def from_json(cls, d: dict, attr_dtypes: dict) -> "Objects":
        return cls(counts=list(d["counts"]), boxes=[np.asarray(b, np.float32).reshape(-1, 4) for b in d["boxes"]],
                   labels=[np.asarray(x, np.int64) for x in d["labels"]],
                   attrs={k: [np.asarray(x, attr_dtypes.get(k, "float64")) for x in v] for k, v in d["attrs"].items()},
                   image_ids=list(d["image_ids"]), frames=list(d["frames"]), dropped=int(d["dropped"]))

    def add(self, t: Target, boxes: np.ndarray, keep: np.ndarray, frame: int) -> None:
        self.counts.append(int(keep.sum()))
        self.boxes.append(boxes[keep])
        self.labels.append(np.asarray(t.labels, np.int64)[keep])
        for name, col in t.attrs.items():
            self.attrs.setdefault(name, []).append(np.asarray(col)[keep])
        self.image_ids.append(t.image_id)
        self.frames.append(frame)
        self.dropped += int((~keep).sum())


@dataclass
class UnitResult:
    s: int
    kept: np.ndarray  # global record indices stored, in order
    shapes: np.ndarray  # (c, 3) int32
    orig: np.ndarray  # (c, 2) int32
    affine: np.ndarray  # (c, 4) float64
    orientation: np.ndarray  # (c,) uint8
    labels: np.ndarray  # (c,) int64 class index per stored sample (-1: none)
    crc: np.ndarray  # (c,) uint32 crc32c of each stored sample's bytes (lets verify name damaged samples)
    errors: list[tuple[int, str]]
    shard: ShardSpec | None
    objects: Objects | None = None

    def to_json(self) -> dict:
        """Exact round trip: floats are written with Python's shortest repr, which reads back bit-equal."""
        return {"s": self.s, "kept": self.kept.tolist(), "shapes": self.shapes.tolist(), "orig": self.orig.tolist(),
                "affine": self.affine.tolist(), "orientation": self.orientation.tolist(),
                "labels": self.labels.tolist(), "crc": self.crc.tolist(), "errors": [list(e) for e in self.errors], "shard": self.shard.to_dict() if self.shard else None,
                "objects": self.objects.to_json() if self.objects is not None else None}

    @classmethod
    def from_json(cls, d: dict, attr_dtypes: dict) -> "UnitResult":
        return cls(s=int(d["s"]), kept=np.asarray(d["kept"], np.int64),
                   shapes=np.asarray(d["shapes"], np.int32).reshape(-1, 3),
                   orig=np.asarray(d["orig"], np.int32).reshape(-1, 2),
                   affine=np.asarray(d["affine"], np.float64).reshape(-1, 4),
                   orientation=np.asarray(d["orientation"], np.uint8),
                   labels=np.asarray(d["labels"], np.int64), crc=np.asarray(d["crc"], np.uint32),
                   errors=[(int(i), str(r)) for i, r in d["errors"]],
                   shard=ShardSpec.from_dict(d["shard"]) if d["shard"] else None,
                   objects=Objects.from_json(d["objects"], attr_dtypes) if d["objects"] is not None else None)


def compile_sample(rec: Record, o: CompileOptions, objects: Objects | None, fetch):
    """Decode, resize and (for detection) carry the boxes of one record. Raises SampleError.
    Returns (pixels, decoded (h, w), affine, EXIF orientation, label)."""
    planner = (lambda h, w: plan_fixed(h, w, o.size, o.resize)) if o.size else \
        (lambda h, w: plan_ragged(h, w, o.max_side))
    item = fetch(rec)
    if item.decoded:
        im = to_mode(item.obj, o.mode, o.background, rec.key)
        dec = Decoded(im, 1, (im.height, im.width))
    else:
        draft_for = (lambda h, w: planner(h, w).resized) if o.draft else None
        dec = decode_image(item.obj, o.mode, o.background, draft_for)
    (h, w), orientation = dec.full, dec.orientation
    plan = planner(h, w)
    affine = plan.affine(h, w)
    if item.target is not None:
        boxes, frame = boxes_in_display_frame(item.target, orientation, w, h)
        stored, keep = to_stored(boxes, affine, plan.out[1], plan.out[0])
    arr = apply_plan(dec.image, plan, o.fill, o.filter, full_size=dec.full, draft_scale=dec.scale,
                     resizer=o.resizer, file_orientation=dec.pending)
    if item.target is not None:
        objects.add(item.target, stored, keep, frame)
    return arr, (h, w), affine, orientation, item.label


def compile_unit(task: UnitTask) -> UnitResult:
    """Decode, resize and write shard ``task.s``. Bad inputs are recorded (or stop the unit under
    on_error="fail"); write failures raise WriteError from the shard writer."""
    with single_threaded(task.options.resizer):
        return _compile_unit(task)


def _compile_unit(task: UnitTask) -> UnitResult:
    o = task.options
    root = Path(task.root)
    if o.layout == "fixed":
        writer = FixedShardWriter(root, task.s, task.shard_size, (*o.size, o.channels))
    else:
        writer = RaggedShardWriter(root, task.s)
    import google_crc32c

    objects = Objects()
    kept, shapes, orig, affine, orient, labels, crc, errors = [], [], [], [], [], [], [], []
    try:
        fetch = fetcher(task.records, task.input)
        for j, rec in enumerate(task.records):
            try:
                arr, hw, aff, orientation, label = compile_sample(rec, o, objects, fetch)
            except SampleError as e:
                errors.append((task.start + j, f"{e.path}: {e.reason}" if e.path != where(rec) else e.reason))
                if o.on_error == "fail":
                    break
                continue
            writer.write(arr)
            kept.append(task.start + j)
            shapes.append(arr.shape)
            orig.append(hw)
            affine.append(aff)
            orient.append(orientation)
            labels.append(label)
            crc.append(google_crc32c.value(np.ascontiguousarray(arr).tobytes()))
        shard = writer.close() if not (errors and o.on_error == "fail") else writer.abort()
    except BaseException:
        writer.abort()
        raise
    return UnitResult(task.s, np.asarray(kept, np.int64), np.asarray(shapes, np.int32).reshape(-1, 3),
                       np.asarray(orig, np.int32).reshape(-1, 2), np.asarray(affine, np.float64).reshape(-1, 4),
                       np.asarray(orient, np.uint8), np.asarray(labels, np.int64), np.asarray(crc, np.uint32),
                       errors, shard, objects if objects.counts else None)


def worker_init() -> None:
    """Pool initializer: die with the parent (Linux), so a killed compile leaves no orphan writing."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
