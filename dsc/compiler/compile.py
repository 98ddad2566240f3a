"""The compile driver: scanned records -> shards written in parallel -> index arrays -> manifest.

Work unit = shard: unit ``s`` decodes records ``[s*K, (s+1)*K)`` and writes shard ``s`` with no
coordination, so the bytes do not depend on the number of workers. Inputs skipped with
``on_error="skip"`` leave a shard short; a compaction pass then re-streams the following shards
(a byte copy, no decode) so that shard ``s`` always holds samples ``[s*K, (s+1)*K)``.

Everything is written into ``.OUT.dsc-tmp`` beside OUT under an exclusive lock and renamed into
place at the end; the manifest is written last. OUT is a complete dataset or absent.
"""
from __future__ import annotations

import fcntl
import math
import multiprocessing as mp
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from .. import __version__
from ..errors import CompileLockedError, DscError, OutputExistsError, SampleError, SourceError
from ..formats import FORMAT_VERSION, ImageSpec, Manifest, ResizeSpec, ShardSpec
from ..formats import layout as L
from ..formats.manifest import RESIZE_POLICIES
from ..formats.zarr_v3 import (node_dir, read_json, sharded_array_json, write_group, write_json,
                               write_plain_array, write_string_array)
from .boxes import boxes_in_display_frame, to_stored
from .decode import decode_image
from .geometry import FILTERS, plan_fixed, plan_ragged, apply_plan
from .sources.base import Record, ScannedSource
from .writer import FixedShardWriter, RaggedShardWriter

SHARD_TARGET_BYTES = 64 << 20
ON_ERROR = ("fail", "skip")


@dataclass(frozen=True, kw_only=True)
class CompileOptions:
    """How to compile. ``size`` (height, width) gives a fixed layout; otherwise images are ragged,
    optionally capped at ``max_side``."""

    size: tuple[int, int] | None = None
    resize: str = "center-crop"
    max_side: int | None = None
    mode: str = "RGB"
    fill: int = 0
    background: tuple[int, int, int] = (255, 255, 255)
    filter: str = "bilinear"
    shard_size: int | None = None
    workers: int | None = None
    on_error: str = "fail"
    overwrite: bool = False
    progress: bool = True

    def __post_init__(self):
        if self.size is not None:
            if isinstance(self.size, int):
                object.__setattr__(self, "size", (self.size, self.size))
            if len(self.size) != 2 or any(not isinstance(v, int) or v < 1 for v in self.size):
                raise SourceError(f"size must be one positive int or (height, width), got {self.size!r}")
            object.__setattr__(self, "size", tuple(self.size))
            if self.max_side is not None:
                raise SourceError("give either size (fixed shape) or max_side (ragged), not both")
        if self.resize not in RESIZE_POLICIES:
            raise SourceError(f"resize must be one of {', '.join(RESIZE_POLICIES)}, got {self.resize!r}")
        if self.max_side is not None and (not isinstance(self.max_side, int) or self.max_side < 1):
            raise SourceError(f"max_side must be a positive int, got {self.max_side!r}")
        if self.mode not in ("RGB", "L"):
            raise SourceError(f"mode must be RGB or L, got {self.mode!r}")
        if not 0 <= self.fill <= 255:
            raise SourceError(f"fill must be 0..255, got {self.fill}")
        if len(self.background) != 3 or any(not 0 <= c <= 255 for c in self.background):
            raise SourceError(f"background must be three values 0..255, got {self.background!r}")
        if self.filter not in FILTERS:
            raise SourceError(f"filter must be one of {', '.join(FILTERS)}, got {self.filter!r}")
        if self.on_error not in ON_ERROR:
            raise SourceError(f"on_error must be fail or skip, got {self.on_error!r}")
        for name in ("shard_size", "workers"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or v < 1):
                raise SourceError(f"{name} must be a positive int, got {v!r}")

    @property
    def layout(self) -> str:
        return "fixed" if self.size is not None else "ragged"

    @property
    def channels(self) -> int:
        return 3 if self.mode == "RGB" else 1


@dataclass(frozen=True)
class CompileReport:
    path: Path
    manifest: Manifest
    skipped: tuple[dict, ...]
    warnings: tuple[str, ...]
    seconds: float
    bytes_written: int

    @property
    def images_per_second(self) -> float:
        return self.manifest.num_samples / self.seconds if self.seconds > 0 else float("inf")


# ----------------------------------------------------------------------------- worker side
@dataclass(frozen=True)
class _UnitTask:
    s: int
    start: int
    records: list[Record]
    root: str
    options: CompileOptions
    shard_size: int


@dataclass
class _Objects:
    """The stored objects of the samples of one unit, concatenated (box-offset layout)."""

    counts: list = field(default_factory=list)  # boxes kept per sample
    boxes: list = field(default_factory=list)  # (k, 4) float32 per sample
    labels: list = field(default_factory=list)
    attrs: dict = field(default_factory=dict)  # name -> list of per-sample arrays
    image_ids: list = field(default_factory=list)
    frames: list = field(default_factory=list)
    dropped: int = 0

    def add(self, rec: Record, boxes: np.ndarray, keep: np.ndarray, frame: int) -> None:
        t = rec.target
        self.counts.append(int(keep.sum()))
        self.boxes.append(boxes[keep])
        self.labels.append(np.asarray(t.labels, np.int64)[keep])
        for name, col in t.attrs.items():
            self.attrs.setdefault(name, []).append(np.asarray(col)[keep])
        self.image_ids.append(t.image_id)
        self.frames.append(frame)
        self.dropped += int((~keep).sum())


@dataclass
class _UnitResult:
    s: int
    kept: np.ndarray  # global record indices stored, in order
    shapes: np.ndarray  # (c, 3) int32
    orig: np.ndarray  # (c, 2) int32
    affine: np.ndarray  # (c, 4) float64
    orientation: np.ndarray  # (c,) uint8
    errors: list[tuple[int, str]]
    shard: ShardSpec | None
    objects: _Objects | None = None


def _compile_sample(rec: Record, o: CompileOptions, objects: _Objects | None):
    """Decode, resize and (for detection) carry the boxes of one record. Raises SampleError."""
    im, orientation = decode_image(rec.path, o.mode, o.background)
    h, w = im.height, im.width
    plan = plan_fixed(h, w, o.size, o.resize) if o.size else plan_ragged(h, w, o.max_side)
    affine = plan.affine(h, w)
    if rec.target is not None:
        boxes, frame = boxes_in_display_frame(rec.target, orientation, w, h)
        stored, keep = to_stored(boxes, affine, plan.out[1], plan.out[0])
    arr = apply_plan(im, plan, o.fill, o.filter)
    if rec.target is not None:
        objects.add(rec, stored, keep, frame)
    return arr, (h, w), affine, orientation


def _compile_unit(task: _UnitTask) -> _UnitResult:
    o = task.options
    root = Path(task.root)
    if o.layout == "fixed":
        writer = FixedShardWriter(root, task.s, task.shard_size, (*o.size, o.channels))
    else:
        writer = RaggedShardWriter(root, task.s)
    objects = _Objects() if any(r.target is not None for r in task.records) else None
    kept, shapes, orig, affine, orient, errors = [], [], [], [], [], []
    try:
        for j, rec in enumerate(task.records):
            try:
                arr, hw, aff, orientation = _compile_sample(rec, o, objects)
            except SampleError as e:
                errors.append((task.start + j, f"{e.path}: {e.reason}" if e.path != rec.path else e.reason))
                if o.on_error == "fail":
                    break
                continue
            writer.write(arr)
            kept.append(task.start + j)
            shapes.append(arr.shape)
            orig.append(hw)
            affine.append(aff)
            orient.append(orientation)
        shard = writer.close() if not (errors and o.on_error == "fail") else writer.abort()
    except BaseException:
        writer.abort()
        raise
    return _UnitResult(task.s, np.asarray(kept, np.int64), np.asarray(shapes, np.int32).reshape(-1, 3),
                       np.asarray(orig, np.int32).reshape(-1, 2), np.asarray(affine, np.float64).reshape(-1, 4),
                       np.asarray(orient, np.uint8), errors, shard, objects)


# ----------------------------------------------------------------------------- output staging
class _Staging:
    """Exclusive lock on OUT, a private temporary directory beside it, and the final rename."""

    def __init__(self, out: Path, overwrite: bool):
        self.out = out
        self.overwrite = overwrite
        self.tmp = out.parent / f".{out.name}.dsc-tmp"
        self._lock_path = out.parent / f".{out.name}.dsc-lock"
        self._lock_fd: int | None = None
        self.published = False

    def __enter__(self) -> "_Staging":
        self.out.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self._lock_path, os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise CompileLockedError(f"another dsc compile is writing {self.out} right now "
                                     f"(lock {self._lock_path}); wait for it to finish") from None
        self._lock_fd = fd
        if self.tmp.exists():  # left by a compile that crashed; we hold the lock, so it is stale
            shutil.rmtree(self.tmp)
        self.tmp.mkdir()
        return self

    def publish(self) -> None:
        check_output(self.out, self.overwrite)
        old = self.out.parent / f".{self.out.name}.dsc-old"
        if self.out.exists():
            if old.exists():
                shutil.rmtree(old)
            os.rename(self.out, old)
        os.rename(self.tmp, self.out)
        self.published = True
        _fsync_dir(self.out.parent)
        if old.exists():
            shutil.rmtree(old)

    def __exit__(self, *exc) -> None:
        if not self.published:
            shutil.rmtree(self.tmp, ignore_errors=True)
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing releases the flock
            self._lock_fd = None
            try:
                self._lock_path.unlink()
            except FileNotFoundError:
                pass


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _is_dsc_dataset(path: Path) -> bool:
    try:
        meta = read_json(path / "zarr.json")
    except (FileNotFoundError, NotADirectoryError, DscError):
        return False
    return isinstance(meta.get("attributes"), dict) and "dsc" in meta["attributes"]


def check_output(out: Path, overwrite: bool) -> None:
    """Refuse an existing OUT unless overwrite; even then, only a dsc dataset or an empty directory."""
    out = Path(out)
    if not out.exists() and not out.is_symlink():
        return
    if not overwrite:
        raise OutputExistsError(f"{out} already exists; pass --overwrite to replace it")
    if out.is_dir() and not out.is_symlink() and (_is_dsc_dataset(out) or not any(out.iterdir())):
        return
    raise OutputExistsError(f"{out} exists and is not a dsc dataset; refusing to overwrite it. "
                            f"Remove it yourself or choose another output path")


# ----------------------------------------------------------------------------- driver
def default_shard_size(num_records: int, options: CompileOptions) -> int:
    """Samples per shard: ~64 MiB of pixels (a power of two in [1, 1024]), and small enough that a
    small dataset still makes ~32 work units to balance across processes. Depends only on the input
    count and options, never on the worker count, so output bytes do not either."""
    if options.size is not None:
        sample = options.size[0] * options.size[1] * options.channels
    elif options.max_side is not None:
        sample = options.max_side * options.max_side * options.channels // 2
    else:
        sample = 512 * 512 * options.channels
    k = 1 << max(0, min(10, int(math.log2(max(1, SHARD_TARGET_BYTES // sample)))))
    return max(1, min(k, max(8, -(-num_records // 32))))


def _pool_context():
    # fork starts workers in milliseconds; the compile path never starts threads before the pool.
    return mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")


def _stop(path: str, reason: str) -> SampleError:
    return SampleError(path, f"{reason} (pass --on-error skip to leave bad inputs out and record them)")


def _run_units(tasks: list[_UnitTask], workers: int, progress: bool, total: int, fail_fast: bool,
               scanned: ScannedSource):
    from tqdm import tqdm

    results: dict[int, _UnitResult] = {}
    written = 0
    t0 = time.perf_counter()

    def consume(it, bar):
        nonlocal written
        for res in it:
            if res.errors and fail_fast:
                i, reason = res.errors[0]
                raise _stop(scanned.records[i].path, reason)
            results[res.s] = res
            written += res.shard.nbytes if res.shard else 0
            bar.update(len(tasks[res.s].records))
            bar.set_postfix_str(f"{written / 1e6 / max(1e-9, time.perf_counter() - t0):.0f} MB/s", refresh=False)

    with tqdm(total=total, unit="img", desc="compile", disable=not progress, file=sys.stderr,
              dynamic_ncols=True, smoothing=0.1) as bar:
        if workers == 1 or len(tasks) == 1:
            consume(map(_compile_unit, tasks), bar)
        else:
            with _pool_context().Pool(min(workers, len(tasks))) as pool:
                consume(pool.imap_unordered(_compile_unit, tasks), bar)
    return [results[s] for s in range(len(tasks))], written


def _compact(tmp: Path, results: list[_UnitResult], options: CompileOptions, shard_size: int) -> list[ShardSpec]:
    """Re-stream shards after the first short one so shard s holds samples [s*K, (s+1)*K)."""
    counts = [len(r.kept) for r in results]
    short = [u for u, c in enumerate(counts) if c < shard_size and (u < len(counts) - 1 or c == 0)]
    if not short:
        return [r.shard for r in results]
    u0 = short[0]
    fixed = options.layout == "fixed"
    scratch = tmp / "_compact"
    specs = [r.shard for r in results[:u0]]
    s = u0
    new_writer = (lambda s: FixedShardWriter(scratch, s, shard_size, (*options.size, options.channels))) if fixed \
        else (lambda s: RaggedShardWriter(scratch, s))
    writer = new_writer(s)
    top = (lambda s: f"{L.IMAGE}/c/{s}") if fixed else L.ragged_shard_node
    for r in results[u0:]:
        if r.shard is None:
            continue
        path = node_dir(tmp, r.shard.path)
        if fixed:
            data = np.memmap(path, np.uint8, "r", shape=(len(r.kept), *options.size, options.channels))
            samples = iter(data)
        else:
            data = np.memmap(path, np.uint8, "r")
            ends = np.cumsum(np.prod(r.shapes, axis=1))
            samples = (data[e - n:e] for e, n in zip(ends, np.prod(r.shapes, axis=1)))
        for sample in samples:
            writer.write(sample)
            if writer.count == shard_size:
                specs.append(writer.close())
                s += 1
                writer = new_writer(s)
        del data
    last = writer.close()
    if last is not None:
        specs.append(last)
    for u in range(u0, len(results)):
        shutil.rmtree(node_dir(tmp, top(u)), ignore_errors=True)
    for u in range(u0, len(specs)):
        os.rename(node_dir(scratch, top(u)), node_dir(tmp, top(u)))
    shutil.rmtree(scratch)
    return specs


def _write_objects(tmp: Path, results: list[_UnitResult], scanned: ScannedSource) -> dict:
    """objects/offsets (N+1), objects/boxes (M, 4) float32, objects/labels (M,), per-box attributes,
    image_id (N,) and transform/box_frame (N,). Returns the manifest's objects summary."""
    parts = [r.objects for r in results if r.objects is not None and r.objects.counts]
    cat = lambda name, shape, dtype: (np.concatenate([np.asarray(x, dtype).reshape(shape) for p in parts  # noqa
                                                      for x in getattr(p, name)]) if parts
                                      else np.zeros((0, *shape[1:]), dtype))
    counts = np.asarray([c for p in parts for c in p.counts], np.int64)
    offsets = np.zeros(len(counts) + 1, np.int64)
    np.cumsum(counts, out=offsets[1:])
    write_group(tmp, L.OBJECTS)
    write_plain_array(tmp, L.OBJ_OFFSETS, offsets, ["sample_edge"])
    write_plain_array(tmp, L.OBJ_BOXES, cat("boxes", (-1, 4), np.float32), ["box", "xyxy"])
    write_plain_array(tmp, L.OBJ_LABELS, cat("labels", (-1,), np.int64), ["box"])
    for name, dtype in scanned.attributes.items():
        col = np.concatenate([np.asarray(x, dtype) for p in parts for x in p.attrs.get(name, [])]) \
            if parts else np.zeros(0, dtype)
        write_plain_array(tmp, f"{L.OBJECTS}/{name}", col, ["box"])
    write_plain_array(tmp, L.IMAGE_ID, np.asarray([i for p in parts for i in p.image_ids], np.int64), ["sample"])
    write_plain_array(tmp, L.BOX_FRAME, np.asarray([f for p in parts for f in p.frames], np.uint8), ["sample"])
    return {"num_boxes": int(offsets[-1]), "box_format": "xyxy", "attributes": dict(scanned.attributes),
            "dropped_boxes": int(sum(p.dropped for p in parts)),
            "images_without_boxes": int((counts == 0).sum())}


def compile_dataset(scanned: ScannedSource, out: str | os.PathLike, options: CompileOptions | None = None,
                    **kwargs) -> CompileReport:
    """Compile scanned records into a dataset at ``out``. Options as a :class:`CompileOptions` or keywords."""
    options = options or CompileOptions(**kwargs)
    t0 = time.perf_counter()
    out = Path(out)
    check_output(out, options.overwrite)
    if scanned.invalid and options.on_error == "fail":
        raise _stop(*scanned.invalid[0])
    records = scanned.records
    if not records:
        raise SourceError(f"{scanned.root}: nothing to compile"
                          + (f"; all {len(scanned.invalid)} inputs are invalid" if scanned.invalid else ""))
    K = options.shard_size or default_shard_size(len(records), options)
    workers = options.workers or os.cpu_count() or 1
    with _Staging(out, options.overwrite) as staging:
        tmp = staging.tmp
        tasks = [_UnitTask(s, start, records[start:start + K], str(tmp), options, K)
                 for s, start in enumerate(range(0, len(records), K))]
        results, _ = _run_units(tasks, workers, options.progress, len(records), options.on_error == "fail", scanned)
        skipped = tuple({"key": k, "reason": r} for k, r in scanned.invalid) + tuple(
            {"key": records[i].key, "reason": reason} for r in results for i, reason in r.errors)
        kept = np.concatenate([r.kept for r in results])
        if len(kept) == 0:
            raise SourceError(f"{scanned.root}: none of the {len(records)} inputs could be compiled; "
                              f"first error: {skipped[0]['key']}: {skipped[0]['reason']}")
        shards = _compact(tmp, results, options, K)
        n = len(kept)
        cat = lambda name: np.concatenate([getattr(r, name) for r in results])  # noqa: E731
        shapes = cat("shapes")

        if options.layout == "fixed":
            h, w = options.size
            image = ImageSpec(layout="fixed", channels=options.channels, mode=options.mode, height=h, width=w)
            write_json(node_dir(tmp, L.IMAGE) / "zarr.json",
                       sharded_array_json((n, h, w, options.channels), K, ["sample", "height", "width", "channel"]))
            resize = ResizeSpec(policy=options.resize, size=options.size, fill=options.fill, filter=options.filter)
        else:
            image = ImageSpec(layout="ragged", channels=options.channels, mode=options.mode)
            write_group(tmp, L.IMAGE)
            write_group(tmp, L.RAGGED_VALUES)
            offsets = np.zeros(n + 1, np.int64)
            np.cumsum(np.prod(shapes.astype(np.int64), axis=1), out=offsets[1:])
            write_plain_array(tmp, L.RAGGED_OFFSETS, offsets, ["sample_edge"])
            write_plain_array(tmp, L.RAGGED_SHAPES, shapes, ["sample", "axis"])
            resize = ResizeSpec(policy=None, max_side=options.max_side, filter=options.filter)
        if scanned.task == "classification":
            write_plain_array(tmp, L.LABEL, np.fromiter((records[i].label for i in kept), np.int64, count=n), ["sample"])
        objects = _write_objects(tmp, results, scanned) if scanned.task == "detection" else None
        write_string_array(tmp, L.KEYS, (records[i].key for i in kept))
        write_group(tmp, L.TRANSFORM)
        write_plain_array(tmp, L.ORIG_SIZE, cat("orig"), ["sample", "hw"])
        write_plain_array(tmp, L.AFFINE, cat("affine"), ["sample", "sx_sy_tx_ty"])
        write_plain_array(tmp, L.EXIF_ORIENTATION, cat("orientation"), ["sample"])

        opts = {k: v for k, v in asdict(options).items() if k not in ("workers", "overwrite", "progress")}
        manifest = Manifest(
            format_version=FORMAT_VERSION, dsc_version=__version__, task=scanned.task, num_samples=n,
            shard_size=K, image=image, resize=resize, shards=tuple(shards), classes=scanned.classes,
            category_ids=scanned.category_ids, objects=objects,
            source={**scanned.summary, "options": opts}, skipped=skipped)
        L.write_manifest(tmp, manifest)
        staging.publish()
    return CompileReport(path=out, manifest=manifest, skipped=skipped, warnings=scanned.warnings,
                         seconds=time.perf_counter() - t0, bytes_written=sum(s.nbytes for s in shards))
