"""The compile driver: scanned records -> shards written in parallel -> index arrays -> manifest.

Work unit = shard: unit ``s`` decodes records ``[s*K, (s+1)*K)`` and writes shard ``s`` with no
coordination, so the bytes do not depend on the number of workers. Each finished unit is journaled
(see journal.py), so an interrupted compile resumes with ``resume=True``. Inputs skipped with
``on_error="skip"`` leave a shard short; a compaction pass then re-streams the following shards
(a byte copy, no decode) so that shard ``s`` always holds samples ``[s*K, (s+1)*K)``.

Everything is written into ``.OUT.dsc-tmp`` beside OUT under an exclusive lock and renamed into
place at the end; the manifest is written last. OUT is a complete dataset or absent. What is written per
field (image, label, objects, mask) is the field kind's business (``formats/fields``); the driver keeps
the per-sample keys and geometry.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Mapping, Sequence
from contextlib import closing
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import numpy as np

from .._version import __version__
from ..errors import ConfigError, DscError, SampleError, SourceError, WriteError
from ..progress import progress_bar
from ..formats import ImageSpec, Manifest, ResizeSpec
from ..formats import layout as L
from ..formats.fields import (Field, ImageField, KeypointsField, LabelField, MaskField, MaskSpec, ObjectMasksField,
                              ObjectsField, mask_dtype, value_field)
from ..formats import shardtable, versions, view
from ..formats.verify import file_checksums
from ..formats.zarr_v3 import node_dir, write_group, write_plain_array, write_string_array
from .journal import Journal, Resumed, fingerprint, inputs_of, settings, shard_check, shard_intact
from .options import CompileOptions, CompileReport, default_shard_size
from .pool import CAN_FORK, WorkerPool
from .sources.base import ScannedSource, Source, record_digest, record_digests, where, where_to_read
from .sources.inputs import is_remote, known
from . import cluster
from .upload import Uploader
from ..store import open_store
from ..store.local import write_atomic
from ..store.paths import check_node_path
from .collect import UnitResults
from .staging import Staging, check_output
from .units import CONTENT, FINGERPRINT_COLUMNS, STAT, UnitResult, UnitTask, compile_unit, worker_init
from ..formats.manifest import batch_name_problem


def _stop(key: str, path: str, reason: str) -> SampleError:
    """The error that stops a compile under on_error="fail"."""
    return SampleError(path, reason, key=key,
                       hint=" (--on-error skip, or on_error='skip', leaves bad inputs out and records them)")


class UnitTasks(Sequence):
    """A compile's units as a sequence of ``UnitTask``, each made when asked (a list of them held ~300 bytes a
    unit for the whole compile): unit u is slot ``s0 + u`` and holds ``records[u*K:(u+1)*K]``."""

    def __init__(self, records, K: int, root: str, options: CompileOptions, fields: tuple, direct=None, s0: int = 0):
        self.records, self.K, self.root, self.options, self.fields = records, K, root, options, fields
        self.direct, self.s0 = direct, s0
        # the identities the scan found of each unit's objects in a bucket, as they are now (none for local files)
        self._known = {u: k for u in range(len(self)) if (k := known(r.path for r in records[u * K:(u + 1) * K]))}

    def __len__(self) -> int:
        return -(-len(self.records) // self.K)

    def __getitem__(self, u):
        if isinstance(u, slice):
            return [self[i] for i in range(*u.indices(len(self)))]
        if u < 0:
            u += len(self)
        if not 0 <= u < len(self):
            raise IndexError(u)
        start = u * self.K
        recs = self.records[start:start + self.K]
        return UnitTask(self.s0 + u, start, recs, self.root, self.options, self.K, self.fields, self.direct,
                        self._known.get(u, ()))


class UnitInputs(Mapping):
    """{slot: ``inputs_of`` its unit's records}, every unit's taken now, before any unit decodes (an input edited
    later makes a resume compile its unit again), and held as 32 bytes a unit (not a dict of hex strings)."""

    def __init__(self, tasks: UnitTasks):
        self.tasks = tasks
        K, recs = tasks.K, tasks.records
        self._sha = np.zeros((len(tasks), 32), np.uint8)
        for u in range(len(tasks)):
            self._sha[u] = np.frombuffer(bytes.fromhex(inputs_of(recs[u * K:(u + 1) * K])), np.uint8)

    def __len__(self) -> int:
        return len(self.tasks)

    @property
    def slots(self) -> range:
        """The units' slots (one run)."""
        return range(self.tasks.s0, self.tasks.s0 + len(self.tasks))

    def __iter__(self):
        return iter(self.slots)

    def __getitem__(self, s: int) -> str:
        u = s - self.tasks.s0
        if not 0 <= u < len(self.tasks):
            raise KeyError(s)
        return bytes(self._sha[u]).hex()

    def quoted(self, s: int) -> str:
        """Unit ``s``'s fingerprint as a dsc that kept ETags quoted took it (``inputs_of(quoted=True)``): asked only
        of a journal entry that differs from ``self[s]``."""
        K, u = self.tasks.K, s - self.tasks.s0
        return inputs_of(self.tasks.records[u * K:(u + 1) * K], quoted=True)


class _Todo(Sequence):
    """The units still to run (positions in ``tasks``), each made when taken."""

    def __init__(self, tasks, us: np.ndarray):
        self.tasks, self.us = tasks, us

    def __len__(self) -> int:
        return len(self.us)

    def __getitem__(self, k):
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(len(self)))]
        return self.tasks[int(self.us[k])]


def _run_units(tasks, workers: int, progress: bool, total: int, fail_fast: bool,
               records: list, journal: Journal, done: Resumed, source: Source,
               inputs, executor=None, on_unit=None, tmp: Path | None = None) -> UnitResults:
    """Run the units not ``done`` (a unit's ``s`` is its shard slot, ``tasks[u]`` slot ``tasks[0].s + u`` and
    inputs ``[u*K, u*K + K)`` of ``records``); every unit's result, folded into a :class:`UnitResults` as it
    finishes (see collect.py), the ``done`` ones first, as their journal entries are read. A resumed unit that
    left inputs out stops the run under ``fail_fast``. A unit that uploaded its shards hands back the small files
    it wrote besides them: they go into ``tmp`` (the staging)."""
    S = len(tasks)
    first = tasks[0] if S else None
    K = first.shard_size if first is not None else 1
    s0 = first.s if first is not None else 0
    results = UnitResults(S, len(records), K, s0, first.fields if first is not None else ())
    for res in done:  # (each parsed from the journal as it is folded in: no object kept a resumed unit)
        results.add(res)
    if fail_fast and results.errors:  # (a skip run's shards leave inputs out: not under fail)
        i, reason = results.errors[0]
        raise _stop(records[i].key, where(records[i]), reason)
    us = np.arange(S, dtype=np.int64)
    todo = _Todo(tasks, us[~np.isin(us, done.slots - s0)] if done else us)
    written = 0
    t0 = time.perf_counter()
    # The source travels with the function, not with each task: forked workers inherit it (a Python
    # dataset is never pickled); a Dask cluster pickles it with every task (``Source.per_task``: lighter there).
    run = partial(compile_unit, source=source)
    unit_size = lambda s: min(K, len(records) - (s - s0) * K)  # noqa: E731 - inputs of slot s's unit
    then = _then if source.shares_reads else None  # (units that share reads: each told its worker's next)

    def consume(it, bar):
        nonlocal written
        for res in it:
            if res.errors and fail_fast:
                i, reason = res.errors[0]
                raise _stop(records[i].key, where(records[i]), reason)
            for rel, data in (res.files or {}).items():  # (written before the unit is journaled)
                write_atomic(tmp / check_node_path(rel), data, tmp)
            res.files = None
            journal.record(res, inputs[res.s])
            results.add(res)
            if on_unit is not None:  # (compile to a URL: the unit's shards start uploading)
                on_unit(res)
            written += res.nbytes
            bar.update(unit_size(res.s))
            bar.set_postfix_str(f"{written / 1e6 / max(1e-9, time.perf_counter() - t0):.0f} MB/s", refresh=False)

    # The pool forks before the progress bar exists: tqdm starts a monitor thread, and forking a process
    # that has threads can deadlock the child.
    pool = None
    if executor is None and workers > 1 and len(todo) > 1:
        if todo[0].options.resizer == "torch":
            import torch  # noqa: F401  (once here, before the fork, not once per worker)
        remote = any(is_remote(r.path) for r in records)  # (workers that read a bucket start fresh: see pool.py)
        pool = WorkerPool(min(workers, len(todo)), run, worker_init, fresh=remote)
    try:
        with progress_bar(total=total, unit="img", desc="compile", disable=not progress,
                          dynamic_ncols=True, smoothing=0.1) as bar:
            bar.update(sum(unit_size(s) for s in done.slots.tolist()))
            if executor is not None and len(todo):
                direct = todo[0].upload is not None
                local = [r.path for r in (records[0], records[-1]) if r.path and not is_remote(r.path)]
                # (a cluster pickles the function with every task: the source as each task may carry it)
                on_cluster = partial(compile_unit, source=source.per_task())
                with closing(cluster.results(executor, todo, on_cluster, local, None if direct else todo[0].root,
                                             runs=source.shares_reads, then=then)) as it:
                    consume(it, bar)
            elif pool is not None:
                consume(pool.imap_unordered(todo, runs=source.shares_reads, then=then), bar)
            else:
                consume(map(run, todo), bar)
    finally:
        if pool is not None:
            pool.close()
    return results.settle()


def _then(task: UnitTask, following: UnitTask | None) -> UnitTask:
    """``task`` told the records of the unit its worker will probably run next (their reads can start now)."""
    return replace(task, then=tuple(map(where_to_read, following.records))) if following is not None else task


def fetch_compacted(tmp: Path, results: UnitResults, fields: tuple[Field, ...], u0: int, url: str,
                    resumed: Resumed | None = None, staged_here: bool = False) -> None:
    """Download into ``tmp`` the uploaded shards ``_compact`` will re-stream (those from ``u0``, the first short
    unit, on). A staged copy is kept only with the bytes the journal recorded: re-hashed (an interrupted compaction
    may have left its re-streamed shard there, a power loss a torn one), unless unit u's staged shards are known
    intact in this run (``resumed.intact_in_staging(u, staged_here)``: re-hashed by its resume, or written by this
    process with ``staged_here``); the others come from
    the bucket through a private name, checked against the recorded size and SHA-256 before they take the
    shard's name."""
    store = open_store(url)
    resumed = resumed if resumed is not None else Resumed.none()
    for u in range(u0, len(results)):
        known = resumed.intact_in_staging(u, staged_here)
        for f in fields:
            spec = results.parts[f.name][u].shard if getattr(f, "pixels", None) is not None else None
            if spec is None:
                continue
            dest = node_dir(tmp, spec.path)
            if dest.is_file() if known else shard_intact(dest, spec):
                continue
            part = dest.with_name(f".{dest.name}.fetching")
            dest.parent.mkdir(parents=True, exist_ok=True)
            with open(part, "wb") as fh:
                store.download(spec.path, fh, limit=spec.nbytes)
            if not shard_intact(part, spec):
                part.unlink()
                raise WriteError(f"{url}/{spec.path}: the shard in the bucket is not the one this compile uploaded "
                                 f"(size or SHA-256 differ from its journal); run the compile again without --resume")
            os.replace(part, dest)


def _first_short(results: UnitResults, K: int) -> int | None:
    """The first unit that skipped inputs left short (the last may be short by itself, unless empty)."""
    counts = results.counts
    short = np.flatnonzero(counts < K)
    if len(short) and short[-1] == len(counts) - 1 and counts[-1] > 0:
        short = short[:-1]
    return int(short[0]) if len(short) else None


def _compact(tmp: Path, results: UnitResults, fields: tuple[Field, ...], K: int, u0: int) -> None:
    """After skipped inputs left shard ``u0`` short (``_first_short``), re-stream every image-like field's
    following shards (a byte copy, no decode) so that shard s holds samples [s*K, (s+1)*K) again; the parts are
    updated."""
    scratch = tmp / "_compact"
    for f in fields:
        pixels = getattr(f, "pixels", None)
        if pixels is None:
            continue
        shutil.rmtree(scratch, ignore_errors=True)  # an interrupted compaction (then resumed) starts over
        parts = results.parts[f.name]  # (from u0 on, a part object a unit: only after skipped inputs)
        later = parts[u0:]
        specs = pixels.compact(tmp, scratch, [None] * u0 + [p.shard for p in later],
                               [None] * u0 + [p.shapes_array() for p in later], K, u0)
        del later
        for u in range(u0, len(parts)):  # the shard grid is the same for every field; records move, not change
            parts.set_shard(u, specs[u - u0] if u - u0 < len(specs) else None)
    shutil.rmtree(scratch, ignore_errors=True)


def decode_units(tasks: list[UnitTask], records: list, scanned: ScannedSource, options: CompileOptions, journal,
                 done: Resumed, source: Source, inputs: UnitInputs, workers: int, on_unit=None, tmp: Path | None = None):
    """Run the units not ``done`` (journaling each), then ``(results, bad)``: every unit's result, and
    (key, where, reason) of each input left out (the scan's invalid ones first), written to
    ``--error-report`` when asked, also when a bad input stops the run."""
    journal.start()
    try:
        results = _run_units(tasks, workers, options.progress, len(records), options.on_error == "fail", records,
                             journal, done, source, inputs, options.executor, on_unit, tmp)
    except SampleError as e:
        if options.error_report:
            _write_error_report(options.error_report, [(e.key, e.path, e.reason)])
        raise
    bad = [(k, k, r) for k, r in scanned.invalid] + [
        (records[i].key, where(records[i]), reason) for i, reason in results.errors]
    if options.error_report:
        _write_error_report(options.error_report, bad)
    return results, bad


SHOWN_WARNINGS = 20  # lines of decode_warnings handed to ``warn``; the rest are counted


def decode_warnings(results: UnitResults, records: list, warn=None) -> tuple[str, ...]:
    """What decoding the compiled inputs said (Pillow's warnings, the C libraries' stderr), one line per
    message naming its file, in input order; the first lines also go to ``warn``, then a count."""
    lines = tuple(f"{where(records[i])}: {message}" for i, message in results.warnings)
    if warn is not None:
        for line in lines[:SHOWN_WARNINGS]:
            warn(line)
        if len(lines) > SHOWN_WARNINGS:
            warn(f"... and {len(lines) - SHOWN_WARNINGS:,} more messages from decoding (the report's warnings list "
                 f"them all)")
    return lines


def _write_error_report(path: str, entries) -> None:
    """JSON lines {key, path, reason} from (key, path, reason) triples."""
    with open(path, "w", encoding="utf-8") as f:
        for key, where_, reason in entries:
            f.write(json.dumps({"key": key, "path": where_, "reason": reason}, ensure_ascii=False) + "\n")


def dataset_fields(scanned: ScannedSource, options: CompileOptions) -> tuple[Field, ...]:
    """The fields a compile of ``scanned`` writes: the image, then the label, objects and mask it has."""
    fixed = options.layout == "fixed"
    h, w = options.size if fixed else (None, None)
    image = ImageSpec(layout=options.layout, channels=options.channels, mode=options.mode, height=h, width=w)
    resize = (ResizeSpec(policy=options.resize, size=options.size, fill=options.fill, filter=options.filter,
                         resizer=options.resizer) if fixed else
              ResizeSpec(policy=None, max_side=options.max_side, filter=options.filter, resizer=options.resizer))
    fields: list[Field] = [ImageField(image, resize)]
    if scanned.task == "classification":
        fields.append(LabelField())
    if scanned.task == "detection":

        for name in scanned.attributes:
            problem = batch_name_problem(name)
            if problem:
                raise SourceError(f"{scanned.root}: the per-box column {name!r} {problem}; rename it")
        fields.append(ObjectsField(scanned.attributes))
        if scanned.instance_masks:
            fields.append(ObjectMasksField())
        if scanned.keypoints is not None:
            fields.append(KeypointsField(scanned.keypoints))
    if scanned.masks is not None:
        m = scanned.masks
        if m.classes and options.mask_ignore < len(m.classes):
            raise ConfigError(f"the mask ignore index {options.mask_ignore} is the id of class "
                              f"{m.classes[options.mask_ignore]!r}: padding and crowd regions would become that "
                              f"class. Pass --mask-ignore (mask_ignore=) of at least {len(m.classes)}"
                              + (" (65535 with more than 255 classes)" if len(m.classes) > 255 else ""))
        fields.append(MaskField(MaskSpec(layout=options.layout, dtype=mask_dtype(len(m.classes), options.mask_ignore,
                                                                                 m.wide),
                                         ignore_index=options.mask_ignore, classes=m.classes, height=h, width=w)))
    # (every field's batch keys: a value field named masks_rects would share the object masks' rects; "mask":
    # ds.mask_classes reads that name)
    taken = {k for f in fields for k in f.batch_keys_of(f.name)} | set(scanned.attributes) | {"mask"}
    for name, spec in scanned.fields.items():  # value fields (numbers, arrays, ragged, text, json, bytes)
        problem = batch_name_problem(name, taken)
        if problem:
            raise SourceError(f"{scanned.root}: the field {name!r} {problem}; rename it")
        try:
            fields.append(value_field(name, spec))
        except ValueError as e:
            raise SourceError(f"{scanned.root}: field {name!r}: {e}") from None
    return tuple(fields)


def compile_dataset(scanned: ScannedSource, out: str | os.PathLike, options: CompileOptions | None = None,
                    warn=None, source: Source | None = None, on_unit=None, direct: tuple[str, str] | None = None,
                    uploaded: "Uploader | None" = None, **kwargs) -> CompileReport:
    """Compile scanned records into a dataset at ``out``. Options as a :class:`CompileOptions` or keywords.
    ``warn(message)`` receives notes for the user (e.g. a stale partial output being removed).
    ``source``: the source that scanned the records (its ``fetcher`` runs in the workers); records of
    files need none. ``on_unit(result)`` is called as each unit finishes (its shards are written).
    ``direct``: (URL, writer token) of a compile to object storage whose units upload their own shards (on a
    cluster: see cluster.py); ``out`` then gets everything but the shards. ``uploaded``: the Uploader of a compile to
    object storage to which ``on_unit`` hands the shards this process stages, each taken out of the staging once it
    is in the bucket (upload.py): a journaled shard counts when it is staged intact or in the bucket (this
    writer's), the staging is flushed once they are up (``settle``), and a compaction gets back from the bucket
    the shards it re-streams."""
    options = options or CompileOptions(**kwargs)
    source = source or Source()
    if source.local_only:
        if options.executor is not None:
            raise SourceError("a Python dataset compiles on local worker processes; drop --executor")
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
    # a shard never holds more than the inputs (a huge --shard-size would only size an empty index)
    K = min(options.shard_size, len(records)) if options.shard_size else default_shard_size(len(records), options)
    workers = options.workers or os.cpu_count() or 1
    fields = dataset_fields(scanned, options)
    staging = Staging(out, options.overwrite, resume=options.resume, warn=warn)
    with staging:
        tmp = staging.tmp
        recorded = settings(scanned, options, K, source)
        bucket = (uploaded.url, uploaded.writer) if uploaded else direct  # (url, writer) of a compile to a URL
        digests = record_digests(records)  # (once: the journal's fingerprint and the dataset's column take them)
        journal = Journal(tmp, fingerprint(records, recorded, digests), fields, settings=recorded,
                          shard_ok=shard_check(tmp, bucket, staged_too=bool(uploaded)))  # (uploaded: staged or in
        # the bucket; direct: in the bucket)
        staging.keep_on_failure = journal.has_units
        unit_options = replace(options, executor=None)  # a Dask Client does not travel with the tasks
        tasks = UnitTasks(records, K, "" if direct else str(tmp), unit_options, fields, direct)
        inputs = UnitInputs(tasks)
        done = Resumed.none()
        if options.resume and not journal.has_plan() and any(tmp.iterdir()):
            if warn is not None:
                warn(f"{tmp} holds no resumable compile (no journal plan): discarding it and starting over")
            staging.reset()
        if options.resume:
            journal.check_plan()
            done = journal.finished_units(inputs)
        results, bad = decode_units(tasks, records, scanned, options, journal, done, source, inputs, workers,
                                    None if direct else on_unit, tmp)
        said = decode_warnings(results, records, warn)
        skipped = tuple({"key": k, "reason": r} for k, _, r in bad)
        kept = results.kept_rows()
        if len(kept) == 0:
            raise SourceError(f"{scanned.root}: none of the {len(records)} inputs could be compiled; "
                              f"first error: {skipped[0]['key']}: {skipped[0]['reason']}")
        try:
            u0 = _first_short(results, K)  # (only after skipped inputs)
            if u0 is not None:
                if uploaded:
                    uploaded.settle()  # (no staged shard is taken out while the compaction reads them)
                if bucket:  # the shards a compaction re-streams come back from the bucket; a shard this process
                    # staged in this run (uploaded: not a worker's) or this resume re-hashed there is not hashed again
                    fetch_compacted(tmp, results, fields, u0, bucket[0], done, staged_here=bool(uploaded))
                _compact(tmp, results, fields, K, u0)
            manifest = _finalize(tmp, scanned, options, results, kept, fields, K, skipped, digests)
            if uploaded:  # (the shards are up and out of the staging: the flush writes none of them)
                uploaded.settle()
            staging.publish(before_rename=journal.remove)
        except OSError as e:
            if isinstance(e, DscError):
                raise
            raise WriteError.writing(e.filename or tmp, e) from None
    return CompileReport(path=out, manifest=manifest, skipped=skipped, warnings=scanned.warnings + said,
                         seconds=time.perf_counter() - t0, bytes_written=_shard_bytes(manifest),
                         resumed_units=len(done),
                         decoded=len(records) - sum(min(K, len(records) - s * K) for s in done.slots.tolist()))


def _shard_bytes(m: Manifest) -> int:
    """The bytes of every shard of ``m``: its table's sum (not a ShardSpec made per shard to add them up)."""
    return m.shard_table.ref["nbytes"] if m.shard_table is not None else sum(s.nbytes for s in L.shard_specs(m))


def _classes(scanned: ScannedSource, label_parts, objects_parts) -> tuple[str, ...]:
    """The source's class names; for a dataset without them, the label values as text."""
    if scanned.names_classes:
        return scanned.classes
    if scanned.task == "classification":
        values = label_parts.values()  # (every version's labels in one array: Field.collect)
        top = int(values.max()) if len(values) else -1
    else:
        labels = (objects_parts.ragged("labels", np.int64) if len(objects_parts)  # (every box's label in one
                  else np.zeros(0, np.int64))  # array: Field.collect; none without an objects field)
        top = int(labels.max()) if len(labels) else -1
    return tuple(str(i) for i in range(top + 1))


@dataclass
class Rows:
    """The per-row values of a version besides its fields: every row of the shard grid, holes included."""

    keys: list
    orig: np.ndarray  # (R, 2) int32
    affine: np.ndarray  # (R, 4) float64
    orientation: np.ndarray  # (R,) uint8
    fingerprint: np.ndarray  # (R, 5) int64, FINGERPRINT_COLUMNS: the inputs' content (in the dataset)
    stat: np.ndarray  # (R, 6) int64, INPUT_COLUMNS[STAT]: their files' times and inodes (the stat cache)
    live: np.ndarray  # (R,) bool

    @classmethod
    def holes(cls, n: int) -> "Rows":
        return cls([""] * n, np.zeros((n, 2), np.int32), np.zeros((n, 4), np.float64), np.ones(n, np.uint8),
                   np.zeros((n, 5), np.int64), np.zeros((n, 6), np.int64), np.zeros(n, bool))

    @classmethod
    def concat(cls, rows: list["Rows"]) -> "Rows":
        return cls([k for r in rows for k in r.keys], *(np.concatenate([getattr(r, a) for r in rows])
                                                         for a in ("orig", "affine", "orientation", "fingerprint",
                                                                   "stat", "live")))

    @classmethod
    def compiled(cls, records, kept: np.ndarray, results, digests: np.ndarray | None = None) -> "Rows":
        """The rows of freshly compiled samples (``kept``: their records' indices; ``results`` a
        :class:`UnitResults` of them all, or their units' results in order; ``digests``: every record's
        ``record_digests``, when the caller took them, else taken here for the kept ones)."""
        if isinstance(results, UnitResults):
            cat = lambda name: getattr(results, name)[kept]  # noqa: E731
        else:
            cat = lambda name: np.concatenate([getattr(r, name) for r in results]) if results else None  # noqa: E731
        inputs = cat("inputs")
        digests = (np.asarray([record_digest(records[i]) for i in kept], np.int64) if digests is None else
                   np.asarray(digests, np.int64)[np.asarray(kept, np.int64)]).reshape(-1, 1)
        return cls([records[i].key for i in kept], cat("orig"), cat("affine"), cat("orientation"),
                   np.hstack([inputs[:, CONTENT], digests]), inputs[:, STAT], np.ones(len(kept), bool))


def fold_slots(fields: tuple[Field, ...], K: int, S: int, slots) -> tuple[dict, Rows]:
    """The parts and rows of a version made slot by slot from a base (an update's, a compaction's), in the shape a
    fresh compile hands ``write_version``: ``slots`` yields, for slots 0..S-1 in order, ({field name: part}, Rows);
    each is folded into its field's ``Field.collect`` (flat arrays for the labels and image-like fields: no object
    kept a slot) as the next one comes, every slot but the last padded with holes to K rows, and the slots after
    the last one with an image shard left out (a version's last slot holds samples)."""
    coll = {f.name: f.collect(S, S * K, K) for f in fields}
    out = Rows.holes(S * K)
    end = used = 0  # rows and slots up to the last slot with an image shard
    held, empty_from = None, 0  # that slot (folded, padded, once a later one has a shard); the empty ones after it

    def fold(u: int, parts: dict, rows: Rows, pad: bool) -> int:
        if pad:
            _pad(parts, rows, K - len(rows.keys))
        n = len(rows.keys)
        at, idx = slice(u * K, u * K + n), np.arange(u * K, u * K + n, dtype=np.int64)
        for name, c in coll.items():
            c.add(u, parts[name], idx)
        out.keys[at] = rows.keys
        for a in ("orig", "affine", "orientation", "fingerprint", "stat", "live"):
            getattr(out, a)[at] = getattr(rows, a)
        return u * K + n

    for u, (parts, rows) in enumerate(slots):
        if parts[ImageField.name].shard is None:  # (no rows: a slot the version drops, or a unit that kept nothing;
            # every version has the image field, whatever its source column was called: shard_table.columns[0])
            continue
        if held is not None:
            fold(*held, True)
        for e in range(empty_from, u):  # the empty slots between: holes
            fold(e, {f.name: f.empty_part() for f in fields}, Rows.holes(0), True)
        held, empty_from = (u, parts, rows), u + 1
    if held is not None:
        end, used = fold(*held, False), held[0] + 1
    kept = np.zeros(S * K, bool)
    kept[:end] = True
    for c in coll.values():
        c.keep_slots(used)
        c.settle(kept)
    return coll, Rows(out.keys[:end], *(getattr(out, a)[:end] for a in ("orig", "affine", "orientation",
                                                                            "fingerprint", "stat", "live")))


def _pad(parts: dict, rows: Rows, n: int) -> None:
    """Append ``n`` holes to a slot's parts and rows."""
    if n <= 0:
        return
    for p in parts.values():
        p.pad(n)
    holes = Rows.holes(n)
    rows.keys += holes.keys
    for a in ("orig", "affine", "orientation", "fingerprint", "stat", "live"):
        setattr(rows, a, np.concatenate([getattr(rows, a), getattr(holes, a)]))


def _finalize(tmp: Path, scanned: ScannedSource, options: CompileOptions, results: UnitResults,
              kept: np.ndarray, fields: tuple[Field, ...], K: int, skipped: tuple[dict, ...],
              digests: np.ndarray | None = None) -> Manifest:
    """A fresh compile's version 0: every row a sample, in input order (``digests``: the records'
    ``record_digests``, when taken)."""
    rows = Rows.compiled(scanned.records, kept, results, digests)
    parts = results.parts  # (each field's parts as the units left them: flat arrays where the kind keeps them so)
    version = {"number": 0, "parent": None, "operation": "compile"}
    m = write_version(tmp, tmp, scanned, options, fields, parts, rows, K, skipped, version,
                      _classes(scanned, parts.get("label", []), parts.get("objects", [])))
    summary = {"samples": m.num_samples, "added": m.num_samples, "removed": 0, "changed": 0, "relabelled": 0,
               "decoded": m.num_samples, "skipped": len(skipped)}
    versions.write_stat(tmp, 0, rows.stat)
    versions.commit(tmp, versions.record_json(0, None, "compile", summary, len(m.shards), m))
    return m


def write_version(stage: Path, out: Path, scanned: ScannedSource, options: CompileOptions, fields: tuple[Field, ...],
                  parts: dict, rows: Rows, K: int, skipped: tuple[dict, ...], version: dict,
                  classes: tuple[str, ...], parent: Manifest | None = None) -> Manifest:
    """Every field's arrays, the keys, per-row geometry, input fingerprints and liveness into ``stage``;
    their objects under ``out``; the shard table's object under ``out`` (a delta of ``parent``'s table, an
    update's base, when it can be); the manifest (a fresh compile's: written into ``stage`` as its root zarr.json)."""
    R = len(rows.keys)
    write_group(stage, L.CHECKSUMS)
    contributions: dict = {"fields": {}}
    for f in fields:
        for key, value in f.finish(stage, parts[f.name], R, K).items():
            if key == "fields":
                contributions["fields"].update(value)
            else:
                contributions[key] = value
    write_string_array(stage, L.KEYS, rows.keys)
    write_group(stage, L.TRANSFORM)
    write_plain_array(stage, L.ORIG_SIZE, rows.orig, ["sample", "hw"])
    write_plain_array(stage, L.AFFINE, rows.affine, ["sample", "sx_sy_tx_ty"])
    write_plain_array(stage, L.EXIF_ORIENTATION, rows.orientation, ["sample"])
    write_plain_array(stage, L.LIVE, rows.live, ["sample"])
    write_group(stage, L.INPUTS, {"fingerprint_columns": list(FINGERPRINT_COLUMNS)})
    write_plain_array(stage, L.FINGERPRINT, rows.fingerprint, ["sample", "column"])
    opts = {**options.recorded(masks=scanned.masks is not None), "on_error": options.on_error}
    def shard_paths():  # (made one at a time: a list of them held ~400 bytes a shard)
        yield from contributions["shards"].paths()  # (a ShardList: every version's parts come from Field.collect)
        yield from (s["path"] for f in contributions["fields"].values() for s in f.get("shards", ()) if s)
    # (a ragged shard's own zarr.json is implied by its size: not listed, so ``files`` does not grow with the
    # shards; see layout.implied_files)
    files = file_checksums(stage, shard_paths(), {p.rsplit("/c/", 1)[0] for p in shard_paths() if "/values/" in p})
    manifest = Manifest(
        format_version=Manifest.version_for(contributions["fields"]), dsc_version=__version__, task=scanned.task,
        num_samples=int(rows.live.sum()), shard_size=K, classes=classes, category_ids=scanned.category_ids,
        source={**scanned.summary, "options": opts}, skipped=skipped, files=files, rows=R, version=version,
        **contributions).with_table(parent, shardtable.write_object(out))
    if stage == out:  # a fresh compile: the staged files are the view (an update's view is written once it commits)
        view.write_root(stage, manifest)
    versions.store_objects(stage, out, files)
    return manifest


