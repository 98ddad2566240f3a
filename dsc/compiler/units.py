"""A work unit: decode, resize and write one shard of every field (runs in a worker process), and its result.

A unit's result is everything the driver needs to finish the dataset without touching the pixels
again: per-sample geometry, the kept records and errors, and each field's part (``formats/fields``). It
round-trips through JSON (``to_json`` / ``from_json``) for the resume journal.
"""
from __future__ import annotations

import ctypes
import io
import shutil
import signal
import tempfile
import threading
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from PIL import Image

from ..errors import DscError, SampleError, SourceError
from ..formats.fields import Field, KeypointsField, MaskField, ObjectMasksField, Part, ValueField
from .boxes import boxes_in_display_frame, to_stored
from .capture import captured
from .decode import (NO_INPUT, SWAPS_AXES, Decoded, array_in_mode, bytes_fingerprint, decode_image, orient_array,
                     read_input_file, in_mode, to_mode)
from .geometry import apply_plan, plan_fixed, plan_ragged
from .instances import instance_masks, place_keypoints
from .masks import apply_plan_nearest, check_values, decode_mask, displayed_mask, rasterize
from .options import CompileOptions
from .resample import single_threaded
from .sources.base import Item, Record, Source, where
from .sources.inputs import remember_all
from .upload import file_body, put_shard
from ..store import open_store


@dataclass(frozen=True)
class UnitTask:
    s: int
    start: int
    records: list[Record]
    root: str
    options: CompileOptions
    shard_size: int
    fields: tuple[Field, ...]
    upload: tuple[str, str] | None = None  # (output URL, writer token): the worker uploads its shards itself
    known: tuple = ()  # identities of its inputs in object storage the scan found (inputs.known): no HEAD again
    then: tuple = ()  # where the unit this worker will probably run next reads (where_to_read; Source.prefetch)


INPUT_COLUMNS = ("size", "mtime_ns", "ctime_ns", "inode", "crc32c",
                 "mask_size", "mask_mtime_ns", "mask_ctime_ns", "mask_inode", "mask_crc32c")  # what a worker reports
CONTENT = [0, 4, 5, 9]  # of INPUT_COLUMNS: in the dataset (inputs/fingerprint, with the annotation's digest)
STAT = [1, 2, 3, 6, 7, 8]  # of INPUT_COLUMNS: the stat cache beside the version record (_dsc/stat/<N>.bin)
FINGERPRINT_COLUMNS = ("size", "crc32c", "mask_size", "mask_crc32c", "target")


def as_int64(values) -> list[int]:
    """Fingerprint values as int64 (an inode above 2**63 wraps, as the same bits)."""
    return [v - (1 << 64) if v >= 1 << 63 else v for v in values]


@dataclass
class UnitResult:
    s: int
    kept: np.ndarray  # global record indices stored, in order
    orig: np.ndarray  # (c, 2) int32
    affine: np.ndarray  # (c, 4) float64
    orientation: np.ndarray  # (c,) uint8
    errors: list[tuple[int, str]]
    parts: dict[str, Part]  # field name -> the unit's part of it
    inputs: np.ndarray = None  # (c, 10) int64: each sample's input fingerprint (INPUT_COLUMNS)
    warnings: list[tuple[int, str]] = None  # (record index, message): what decoding a compiled input said
    files: dict | None = None  # a unit that uploaded its shards: the small files it wrote besides them {rel: bytes}

    def __post_init__(self):
        if self.inputs is None:
            self.inputs = np.zeros((len(self.kept), 10), np.int64)
        if self.warnings is None:
            self.warnings = []

    @property
    def nbytes(self) -> int:
        return sum(p.shard.nbytes for p in self.parts.values() if getattr(p, "shard", None) is not None)

    def to_json(self) -> dict:
        """Exact round trip: floats are written with Python's shortest repr, which reads back bit-equal."""
        return {"s": self.s, "kept": self.kept.tolist(), "orig": self.orig.tolist(), "affine": self.affine.tolist(),
                "orientation": self.orientation.tolist(), "errors": [list(e) for e in self.errors],
                "parts": {k: p.to_json() for k, p in self.parts.items()}, "inputs": self.inputs.tolist(),
                "warnings": [list(w) for w in self.warnings]}

    @classmethod
    def from_json(cls, d: dict, fields: tuple[Field, ...]) -> "UnitResult":
        return cls(s=int(d["s"]), kept=np.asarray(d["kept"], np.int64),
                   orig=np.asarray(d["orig"], np.int32).reshape(-1, 2),
                   affine=np.asarray(d["affine"], np.float64).reshape(-1, 4),
                   orientation=np.asarray(d["orientation"], np.uint8),
                   errors=[(int(i), str(r)) for i, r in d["errors"]],
                   parts={f.name: f.load_part(d["parts"][f.name]) for f in fields},
                   inputs=np.asarray(d["inputs"], np.int64).reshape(-1, 10),
                   warnings=[(int(i), str(m)) for i, m in d.get("warnings", [])])


def _mask(item: Item, rec: Record, dec: Decoded, field: MaskField, o: CompileOptions) -> np.ndarray:
    """The sample's mask in its image's displayed frame, values checked."""
    (h, w), orientation, spec = dec.full, dec.orientation, field.spec
    if item.mask is not None:
        at = item.mask if isinstance(item.mask, str) else getattr(item.mask, "name", None) or where(rec)
        mask = displayed_mask(decode_mask(item.mask, at), orientation, h, w, at)
    elif item.target is not None:  # rasterised from the annotation's shapes, in its frame (as its boxes)
        at = item.target.source
        size = item.target.size
        raw = orientation in SWAPS_AXES and size is not None and tuple(size) == (h, w) != (w, h)
        mh, mw = (w, h) if raw else (h, w)
        mask = rasterize(item.target.segments, mh, mw, spec.ignore_index, spec.dtype, at)
        mask = np.ascontiguousarray(orient_array(mask, orientation)) if raw else mask
    else:
        raise SampleError(where(rec), "has no mask, and the dataset stores one per sample")
    check_values(mask, len(spec.classes), spec.ignore_index, spec.dtype, at)
    return mask


def _input(obj, rec: Record, what: str):
    """What to decode (bytes in memory) and the input's fingerprint: a file is read once, here."""
    if isinstance(obj, str):
        data, fp = read_input_file(obj, what)
        buf = io.BytesIO(data)
        buf.name = obj  # error messages name the file
        return buf, fp
    if isinstance(obj, io.BytesIO):  # a table cell
        return obj, bytes_fingerprint(obj.getvalue(), rec.path if rec.row >= 0 and rec.path else None)
    if hasattr(obj, "read") and hasattr(obj, "seek"):
        pos = obj.tell()
        data = obj.read()
        obj.seek(pos)
        return obj, bytes_fingerprint(data)
    return obj, NO_INPUT


def place_objects(target, orientation: int, h: int, w: int, affine, out_h: int, out_w: int) -> tuple:
    """A sample's objects in its stored pixels, from its annotation and the stored geometry (decoded (h, w)
    as displayed, EXIF orientation, affine, stored size): what ``ObjectsPart.add`` takes. An update
    re-places a re-annotated sample's boxes this way, without decoding it."""
    boxes, frame = boxes_in_display_frame(target, orientation, w, h)
    stored, keep = to_stored(boxes, tuple(affine), out_w, out_h)
    return target, stored, keep, frame


def field_values(rec: Record, item: Item, value_fields) -> dict:
    """Each value field's stored bytes for one sample (the record's values, then the fetched item's), checked
    by its kind: a missing, extra or ill-fitting value is a SampleError naming the sample and the field."""
    given = dict(rec.fields)
    if item.fields:
        given.update(item.fields)
    out = {}
    at = where(rec)
    for f in value_fields:
        if f.name not in given:
            raise SampleError(at, f"has no value for field {f.name!r} (every sample gives the fields the first one "
                                  f"gave)")
        out[f.name] = f.encode(given.pop(f.name), at)
    if given:
        raise SampleError(at, f"gives field {next(iter(given))!r}, which the first sample did not; every sample "
                              f"gives the same fields (declare it with fields= to store it)")
    return out


def compile_sample(rec: Record, o: CompileOptions, fetch, mask_field: MaskField | None = None,
                   notes: list[str] | None = None, fields: tuple[Field, ...] = ()):
    """Decode, resize and (for detection) carry the boxes of one record. Raises SampleError.
    Returns ({field name: value}, decoded (h, w), affine, EXIF orientation, input fingerprint). What
    decoding its image and mask said (warnings, C libraries' stderr) is appended to ``notes``. ``fields``:
    the dataset's fields (per-object masks and keypoints are made when it has them)."""
    notes = [] if notes is None else notes
    planner = (lambda h, w: plan_fixed(h, w, o.size, o.resize)) if o.size else \
        (lambda h, w: plan_ragged(h, w, o.max_side))
    try:
        item = fetch(rec)
    except (DscError, MemoryError):
        raise
    except Exception as e:  # noqa: BLE001 - a source's own bug: a bad sample named, not a traceback
        raise SampleError(where(rec), f"the source could not fetch it ({type(e).__name__}: {e})") from None
    mask_fp = NO_INPUT
    if mask_field is not None and item.mask is not None and not isinstance(item.mask, (np.ndarray,)) \
            and not hasattr(item.mask, "getpixel"):
        mask_obj, mask_fp = _input(item.mask, rec, "mask")
        item.mask = mask_obj
    if item.decoded:
        im = item.obj
        if array_in_mode(im, o.mode):  # a dataset's array of the stored pixels: as it is (apply_plan takes it)
            dec = Decoded(im, 1, im.shape[:2])
        else:
            im = Image.fromarray(im) if isinstance(im, np.ndarray) else im  # (RGBA, or L stored as RGB...)
            if not in_mode(im, o.mode):
                with captured(notes):
                    im = to_mode(im, o.mode, o.background, rec.key)
            dec = Decoded(im, 1, (im.height, im.width))
        fp = NO_INPUT
    else:
        draft_for = (lambda h, w: planner(h, w).resized) if o.draft else None
        obj, fp = _input(item.obj, rec, "image")
        with captured(notes):
            dec = decode_image(obj, o.mode, o.background, draft_for, o.max_pixels)
    (h, w), orientation = dec.full, dec.orientation
    if h < 1 or w < 1:  # (a Python dataset's Image.new("RGB", (5, 0)), an empty array): nothing to resize
        raise SampleError(where(rec), f"the image is {w}x{h} pixels: it holds no pixels; replace it or remove it")
    plan = planner(h, w)
    affine = plan.affine(h, w)
    values = {"label": item.label}
    value_fields = tuple(f for f in fields if isinstance(f, ValueField))
    if value_fields or item.fields:
        values.update(field_values(rec, item, value_fields))
    if item.target is not None:
        values["objects"] = place_objects(item.target, orientation, h, w, affine, *plan.out)
        _, _, keep, frame = values["objects"]
        for f in fields:  # per-object fields: the kept boxes' rows, through the same geometry
            if isinstance(f, ObjectMasksField):
                with captured(notes):
                    values[f.name] = instance_masks(item.target, keep, frame, orientation, h, w, plan)
            elif isinstance(f, KeypointsField):
                values[f.name] = place_keypoints(item.target, keep, frame, orientation, h, w, affine, *plan.out,
                                                 f.spec.num_keypoints)
    for f in fields:
        if isinstance(f, ObjectMasksField) and f.name not in values:
            values[f.name] = np.zeros((0, *plan.out), bool)
        elif isinstance(f, KeypointsField) and f.name not in values:
            values[f.name] = np.zeros((0, f.spec.num_keypoints, 3), np.float32)
    if mask_field is not None:
        with captured(notes):
            mask = _mask(item, rec, dec, mask_field, o)
        values[mask_field.name] = apply_plan_nearest(mask, plan, o.mask_ignore)
    values["image"] = apply_plan(dec.image, plan, o.fill, o.filter, full_size=dec.full, draft_scale=dec.scale,
                                 resizer=o.resizer, file_orientation=dec.pending)
    return values, (h, w), affine, orientation, (*fp, *mask_fp)


def compile_unit(task: UnitTask, source: Source) -> UnitResult:
    """Decode, resize and write shard ``task.s`` of every field. Bad inputs are recorded (or stop the unit
    under on_error="fail"); write failures raise WriteError from the shard writers. A task with ``upload``
    (a cluster compile to a URL) writes in a temporary folder of this worker's own and uploads its shards."""
    remember_all(task.known)
    if task.then:
        source.prefetch(list(task.then))
    with single_threaded(task.options.resizer):
        if task.upload is None:
            return _compile_unit(task, source)
        tmp = tempfile.mkdtemp(prefix="dsc-unit-")
        try:
            result = _compile_unit(replace(task, root=tmp), source)
            with _uploading():  # (the worker's slot goes to the next unit while this one's shards go up)
                result.files = upload_unit(Path(tmp), result, *task.upload)
            return result
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


UPLOADS_BEHIND = 2  # units of a Dask worker whose shards upload while its next units compile
_BEHIND = threading.BoundedSemaphore(UPLOADS_BEHIND)


@contextmanager
def _uploading():
    """On a Dask worker, a unit's upload leaves the worker's thread pool (``distributed.secede``): the task goes
    on in a thread of its own and its slot starts the next unit, so an upload never holds up the decoding (its
    result still returns only once its shards are in the bucket). At most ``UPLOADS_BEHIND`` at once; beyond,
    the upload holds its slot (the uploads set the pace). Elsewhere: nothing."""
    if not _BEHIND.acquire(blocking=False):
        yield
        return
    try:
        try:
            from distributed import get_worker, secede

            get_worker()
        except (ImportError, ValueError):  # not on a Dask worker
            yield
            return
        secede()
        yield
    finally:
        _BEHIND.release()


def upload_unit(root: Path, result: UnitResult, url: str, writer: str) -> dict:
    """Upload the unit's shard files under ``root`` to ``url`` (create-only, with their SHA-256 and the writer's
    token: see upload.py); returns the other files it wrote (a ragged shard's zarr.json) as {rel: bytes}, which
    the client writes into its staging."""
    store = open_store(url)
    shards = {p.shard.path: p.shard for p in result.parts.values() if getattr(p, "shard", None) is not None}
    for rel, spec in shards.items():
        with open(root / rel, "rb") as f, file_body(f) as body:  # (its pages, not a copy)
            put_shard(store, rel, body, spec.sha256, spec.nbytes, writer, ask=False)  # (one PUT; a retried unit's:
            #                                                                            judged then)
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.relative_to(root).as_posix() not in shards}


def _compile_unit(task: UnitTask, source: Source) -> UnitResult:
    o = task.options
    root = Path(task.root)
    mask_field = next((f for f in task.fields if isinstance(f, MaskField)), None)
    parts: dict[str, Part] = {}
    kept, orig, affine, orient, errors, inputs, warnings = [], [], [], [], [], [], []
    try:
        for f in task.fields:
            parts[f.name] = f.part(root, task.s, task.shard_size)
        try:
            fetch = source.fetcher(task.records)
        except (DscError, MemoryError):
            raise
        except Exception as e:  # noqa: BLE001
            raise SourceError(f"the {source.name!r} source failed to open shard {task.s}'s records: "
                              f"{type(e).__name__}: {e}") from None
        for j, rec in enumerate(task.records):
            notes: list[str] = []
            try:
                values, hw, aff, orientation, fp = compile_sample(rec, o, fetch, mask_field, notes, task.fields)
            except SampleError as e:
                reason = f"{e.path}: {e.reason}" if e.path != where(rec) else e.reason
                if notes:  # what the decoders printed says why: it joins the reason
                    reason += f" (decoding also said: {'; '.join(notes)})"
                errors.append((task.start + j, reason))
                if o.on_error == "fail":
                    break
                continue
            for f in task.fields:
                parts[f.name].add(values[f.name])
            kept.append(task.start + j)
            orig.append(hw)
            affine.append(aff)
            orient.append(orientation)
            inputs.append(as_int64(fp))
            warnings += [(task.start + j, n) for n in notes]
        if errors and o.on_error == "fail":
            for p in parts.values():
                p.abort()
        else:
            for p in parts.values():
                p.close()
    except BaseException:
        for p in parts.values():
            p.abort()
        raise
    return UnitResult(task.s, np.asarray(kept, np.int64), np.asarray(orig, np.int32).reshape(-1, 2),
                      np.asarray(affine, np.float64).reshape(-1, 4), np.asarray(orient, np.uint8), errors, parts,
                      np.asarray(inputs, np.int64).reshape(-1, 10), warnings)


def worker_init() -> None:
    """Pool initializer: die with the parent (Linux), so a killed compile leaves no orphan writing; keep the heap
    (see keep_heap)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    keep_heap()


# glibc's malloc settings of a compile worker (mallopt's parameters): blocks up to 32 MiB come from the heap, not
# from a mapping of their own, and up to 256 MiB freed at its top (plus 64 MiB of padding) stay in the process
HEAP_SETTINGS = {-3: 32 << 20, -1: 256 << 20, -2: 64 << 20}  # M_MMAP_THRESHOLD, M_TRIM_THRESHOLD, M_TOP_PAD


def keep_heap() -> None:
    """Have glibc's malloc keep, for the worker's next unit, the memory its last unit freed (HEAP_SETTINGS), instead of
    handing it back to the kernel and faulting fresh zeroed pages in again: each unit allocates and frees the same
    buffers (the decoded images, a tar's read-ahead chunks, the network's buffers on the object-store client's
    threads). Left to itself, malloc maps blocks over 128 KiB apart and trims its heaps as soon as their top is free,
    so a worker that read its tars from a bucket (forked fresh from the fork server, with the client's threads and
    their arenas) took 43,000-93,000 page faults per 1,000 images of the bench, where one forked from the compile
    took 7,600 (benchmarks/bench_webdataset.py: 12,500 with these settings). A worker's memory stays bounded: it holds
    at most its largest unit's working set. Nothing where the C library is not glibc."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    for param, value in HEAP_SETTINGS.items():
        mallopt(ctypes.c_int(param), ctypes.c_int(value))
