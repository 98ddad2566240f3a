"""The compile driver: scanned records -> shards written in parallel -> index arrays -> manifest.

Work unit = shard: unit ``s`` decodes records ``[s*K, (s+1)*K)`` and writes shard ``s`` with no
coordination, so the bytes do not depend on the number of workers. Each finished unit is journaled
(see journal.py), so an interrupted compile resumes with ``resume=True``. Inputs skipped with
``on_error="skip"`` leave a shard short; a compaction pass then re-streams the following shards
(a byte copy, no decode) so that shard ``s`` always holds samples ``[s*K, (s+1)*K)``.

Everything is written into ``.OUT.dsc-tmp`` beside OUT under an exclusive lock and renamed into
place at the end; the manifest is written last. OUT is a complete dataset or absent.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from .. import __version__
from ..errors import DscError, SampleError, SourceError, WriteError
from ..formats import FORMAT_VERSION, ImageSpec, Manifest, ResizeSpec, ShardSpec
from ..formats import layout as L
from ..formats.zarr_v3 import (node_dir, sharded_array_json, write_group, write_json, write_plain_array,
                               write_string_array)
from ..formats.verify import file_checksums
from .inputs import set_dataset, where
from .journal import Journal, fingerprint
from .options import CompileOptions, CompileReport, default_shard_size
from .pool import CAN_FORK, WorkerPool
from .sources.base import ScannedSource
from .staging import Staging, check_output
from .units import UnitResult, UnitTask, compile_unit, worker_init
from .writer import FixedShardWriter, RaggedShardWriter


def _stop(key: str, path: str, reason: str) -> SampleError:
    """The error that stops a compile under on_error="fail"."""
    return SampleError(path, reason, key=key,
                       hint=" (--on-error skip, or on_error='skip', leaves bad inputs out and records them)")


def _dask_results(executor, todo: list[UnitTask]):
    """Run units on a Dask cluster; yield results as they finish. Workers write to the shared filesystem."""
    try:
        from dask.distributed import Client, as_completed
    except ImportError:
        raise SourceError("--executor needs dask.distributed: pip install 'dsc[dask]'") from None
    if isinstance(executor, Client):
        client = executor
    else:
        try:
            client = Client(executor, timeout="20s")
        except (OSError, ValueError, TypeError) as e:
            raise SourceError(f"cannot reach the Dask scheduler at {executor!r}: {e}; give its address as "
                              f"tcp://host:8786") from None
    futures = client.map(compile_unit, todo, pure=False)
    try:
        for fut in as_completed(futures):
            yield fut.result()
    finally:
        client.cancel(futures)
        if client is not executor:
            client.close()


def _run_units(tasks: list[UnitTask], workers: int, progress: bool, total: int, fail_fast: bool,
               scanned: ScannedSource, journal: Journal, done: dict[int, UnitResult], executor=None
               ) -> list[UnitResult]:
    from tqdm import tqdm

    results: dict[int, UnitResult] = dict(done)
    todo = [t for t in tasks if t.s not in done]
    written = 0
    t0 = time.perf_counter()

    def consume(it, bar):
        nonlocal written
        for res in it:
            if res.errors and fail_fast:
                i, reason = res.errors[0]
                raise _stop(scanned.records[i].key, where(scanned.records[i]), reason)
            journal.record(res)
            results[res.s] = res
            written += res.shard.nbytes if res.shard else 0
            bar.update(len(tasks[res.s].records))
            bar.set_postfix_str(f"{written / 1e6 / max(1e-9, time.perf_counter() - t0):.0f} MB/s", refresh=False)

    # The pool forks before the progress bar exists: tqdm starts a monitor thread, and forking a process
    # that has threads can deadlock the child.
    pool = None
    if executor is None and workers > 1 and len(todo) > 1:
        if todo[0].options.resizer == "torch":
            import torch  # noqa: F401  (once here, before the fork, not once per worker)
        pool = WorkerPool(min(workers, len(todo)), compile_unit, worker_init)
    try:
        with tqdm(total=total, unit="img", desc="compile", disable=not progress, file=sys.stderr,
                  dynamic_ncols=True, smoothing=0.1) as bar:
            bar.update(sum(len(tasks[s].records) for s in done))
            if executor is not None and todo:
                consume(_dask_results(executor, todo), bar)
            elif pool is not None:
                consume(pool.imap_unordered(todo), bar)
            else:
                consume(map(compile_unit, todo), bar)
    finally:
        if pool is not None:
            pool.close()
    return [results[s] for s in range(len(tasks))]


def _compact(tmp: Path, results: list[UnitResult], options: CompileOptions, shard_size: int) -> list[ShardSpec]:
    """Re-stream shards after the first short one so shard s holds samples [s*K, (s+1)*K)."""
    scratch = tmp / "_compact"
    shutil.rmtree(scratch, ignore_errors=True)  # an interrupted compaction (then resumed) starts over
    counts = [len(r.kept) for r in results]
    short = [u for u, c in enumerate(counts) if c < shard_size and (u < len(counts) - 1 or c == 0)]
    if not short:
        return [r.shard for r in results]
    u0 = short[0]
    fixed = options.layout == "fixed"
    specs = [r.shard for r in results[:u0]]
    s = u0
    new_writer = (lambda s: FixedShardWriter(scratch, s, shard_size, (*options.size, options.channels))) if fixed \
        else (lambda s: RaggedShardWriter(scratch, s))
    writer = new_writer(s)
    top = L.fixed_shard_node if fixed else L.ragged_shard_node
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


def _write_objects(tmp: Path, results: list[UnitResult], scanned: ScannedSource) -> dict:
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


def _write_error_report(path: str, entries) -> None:
    """JSON lines {key, path, reason} from (key, path, reason) triples."""
    with open(path, "w", encoding="utf-8") as f:
        for key, where_, reason in entries:
            f.write(json.dumps({"key": key, "path": where_, "reason": reason}, ensure_ascii=False) + "\n")


def compile_dataset(scanned: ScannedSource, out: str | os.PathLike, options: CompileOptions | None = None,
                    warn=None, dataset=None, **kwargs) -> CompileReport:
    """Compile scanned records into a dataset at ``out``. Options as a :class:`CompileOptions` or keywords.
    ``warn(message)`` receives notes for the user (e.g. a stale partial output being removed).
    ``dataset``: the Python dataset of a dataset source (its items are fetched in the workers)."""
    options = options or CompileOptions(**kwargs)
    if scanned.input.get("kind") == "dataset":
        if options.executor is not None:
            raise SourceError("a Python dataset compiles on local worker processes; drop --executor")
        set_dataset(dataset)
        if not CAN_FORK:
            options = replace(options, workers=1)  # the dataset reaches workers only by fork
    t0 = time.perf_counter()
    out = Path(out)
    check_output(out, options.overwrite)
    if scanned.invalid and options.on_error == "fail":
        key, reason = scanned.invalid[0]
        if options.error_report:
            _write_error_report(options.error_report, [(key, key, reason)])
        raise _stop(key, key, reason)
    records = scanned.records
    if not records:
        raise SourceError(f"{scanned.root}: nothing to compile"
                          + (f"; all {len(scanned.invalid)} inputs are invalid" if scanned.invalid else ""))
    K = options.shard_size or default_shard_size(len(records), options)
    workers = options.workers or os.cpu_count() or 1
    staging = Staging(out, options.overwrite, resume=options.resume, warn=warn)
    with staging:
        tmp = staging.tmp
        journal = Journal(tmp, fingerprint(scanned, options, K), dict(scanned.attributes))
        staging.keep_on_failure = journal.has_units
        unit_options = replace(options, executor=None)  # a Dask Client does not travel with the tasks
        tasks = [UnitTask(s, start, records[start:start + K], str(tmp), unit_options, K, scanned.input)
                 for s, start in enumerate(range(0, len(records), K))]
        done = {}
        if options.resume:
            journal.check_plan()
            done = journal.finished_units(len(tasks))
            failed = [r for r in done.values() if r.errors]
            if failed and options.on_error == "fail":  # a skip run's shards leave inputs out: not under fail
                i, reason = min(e for r in failed for e in r.errors)
                raise _stop(records[i].key, where(records[i]), reason)
        journal.start()
        try:
            results = _run_units(tasks, workers, options.progress, len(records), options.on_error == "fail",
                                 scanned, journal, done, options.executor)
        except SampleError as e:
            if options.error_report:
                _write_error_report(options.error_report, [(e.key, e.path, e.reason)])
            raise
        bad = [(k, k, r) for k, r in scanned.invalid] + [
            (records[i].key, where(records[i]), reason) for r in results for i, reason in r.errors]
        skipped = tuple({"key": k, "reason": r} for k, _, r in bad)
        if options.error_report:
            _write_error_report(options.error_report, bad)
        kept = np.concatenate([r.kept for r in results])
        if len(kept) == 0:
            raise SourceError(f"{scanned.root}: none of the {len(records)} inputs could be compiled; "
                              f"first error: {skipped[0]['key']}: {skipped[0]['reason']}")
        try:
            shards = _compact(tmp, results, options, K)
            manifest = _finalize(tmp, scanned, options, results, kept, shards, K, skipped)
            staging.publish(before_rename=journal.remove)
        except OSError as e:
            if isinstance(e, DscError):
                raise
            raise WriteError.writing(e.filename or tmp, e) from None
    return CompileReport(path=out, manifest=manifest, skipped=skipped, warnings=scanned.warnings,
                         seconds=time.perf_counter() - t0, bytes_written=sum(s.nbytes for s in shards),
                         resumed_units=len(done))


def _classes(scanned: ScannedSource, results: list[UnitResult]) -> tuple[str, ...]:
    """The source's class names; for a dataset without them, the label values as text."""
    if scanned.classes or scanned.task not in ("classification", "detection"):
        return scanned.classes
    if scanned.task == "classification":
        top = max((int(r.labels.max()) for r in results if len(r.labels)), default=-1)
    else:
        top = max((int(x.max()) for r in results if r.objects for x in r.objects.labels if len(x)), default=-1)
    return tuple(str(i) for i in range(top + 1))


def _finalize(tmp: Path, scanned: ScannedSource, options: CompileOptions, results: list[UnitResult],
              kept: np.ndarray, shards: list[ShardSpec], K: int, skipped: tuple[dict, ...]) -> Manifest:
    """Index arrays, keys, per-sample geometry, objects; the manifest last."""
    records = scanned.records
    n = len(kept)
    cat = lambda name: np.concatenate([getattr(r, name) for r in results])  # noqa: E731
    shapes = cat("shapes")
    if options.layout == "fixed":
        h, w = options.size
        image = ImageSpec(layout="fixed", channels=options.channels, mode=options.mode, height=h, width=w)
        write_json(node_dir(tmp, L.IMAGE) / "zarr.json",
                   sharded_array_json((n, h, w, options.channels), K, ["sample", "height", "width", "channel"]))
        resize = ResizeSpec(policy=options.resize, size=options.size, fill=options.fill, filter=options.filter,
                            resizer=options.resizer)
    else:
        image = ImageSpec(layout="ragged", channels=options.channels, mode=options.mode)
        write_group(tmp, L.IMAGE)
        write_group(tmp, L.RAGGED_VALUES)
        offsets = np.zeros(n + 1, np.int64)
        np.cumsum(np.prod(shapes.astype(np.int64), axis=1), out=offsets[1:])
        write_plain_array(tmp, L.RAGGED_OFFSETS, offsets, ["sample_edge"])
        write_plain_array(tmp, L.RAGGED_SHAPES, shapes, ["sample", "axis"])
        resize = ResizeSpec(policy=None, max_side=options.max_side, filter=options.filter,
                            resizer=options.resizer)
    if scanned.task == "classification":
        write_plain_array(tmp, L.LABEL, cat("labels"), ["sample"])
    objects = _write_objects(tmp, results, scanned) if scanned.task == "detection" else None
    write_string_array(tmp, L.KEYS, (records[i].key for i in kept))
    write_group(tmp, L.TRANSFORM)
    write_plain_array(tmp, L.ORIG_SIZE, cat("orig"), ["sample", "hw"])
    write_plain_array(tmp, L.AFFINE, cat("affine"), ["sample", "sx_sy_tx_ty"])
    write_plain_array(tmp, L.EXIF_ORIENTATION, cat("orientation"), ["sample"])
    write_group(tmp, L.CHECKSUMS)
    write_plain_array(tmp, L.SAMPLE_CRC32C, cat("crc"), ["sample"])
    opts = {**options.recorded(), "on_error": options.on_error}
    manifest = Manifest(
        format_version=FORMAT_VERSION, dsc_version=__version__, task=scanned.task, num_samples=n,
        shard_size=K, image=image, resize=resize, shards=tuple(shards), classes=_classes(scanned, results),
        category_ids=scanned.category_ids, objects=objects,
        source={**scanned.summary, "options": opts}, skipped=skipped,
        files=file_checksums(tmp, {s.path for s in shards}))
    L.write_manifest(tmp, manifest)
    return manifest
