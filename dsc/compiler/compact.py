"""``dsc compact``: rewrite the latest version of a dataset into storage order, as a new version.

An ``--update`` keeps every unchanged sample where it is and appends the new and changed ones at new
shard slots; removed samples leave holes. After several updates a version's samples are scattered: the
k-th block of ``shard_size`` samples (what ``order="quasi_random"`` treats as one shard) spans several
shard files, some mostly holes, and a batch touches many files (measured: a batch of 8 with ``window=2``
read 6 shards after 6 updates that each changed 1/7 of the samples).

A compaction copies every live sample's bytes, in sample order, into new shards at new slots: block k is
shard file k again, with no holes between samples. Nothing is decoded; each sample's stored bytes, label,
boxes, mask, key and input fingerprint are the base version's, byte for byte (the per-sample crc32c is
recomputed over the same bytes). Slots are never reused, so the new version's rows start past every slot
an earlier version used (those rows are holes, which cost a few bytes each in the small arrays). The old
version stays, like any superseded version, until ``dsc vacuum`` removes it; a later ``--update`` matches
the compacted samples by key as before.
"""
from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import numpy as np

from ..errors import ConfigError, DatasetNotFoundError
from ..formats import layout as L
from ..formats import versions, view
from ..store import is_url
from ..store.local import Root, open_folder
from .compile import Rows, fold_slots, write_version
from .options import CompileOptions, CompileReport
from .sources.base import MaskInfo, ScannedSource
from .staging import OutLock, sync_filesystem
from .update import check_options, discard_slots, open_base


def in_storage_order(live: np.ndarray, K: int) -> bool:
    """Whether a version's live rows are already one run starting at a slot boundary (nothing to compact)."""
    rows = np.flatnonzero(live)
    return len(rows) == 0 or (rows[0] % K == 0 and rows[-1] - rows[0] + 1 == len(rows))


def _scanned_like(m) -> ScannedSource:
    """What ``write_version`` takes from a scan, as the base version recorded it (a compaction scans nothing)."""
    spec = m.fields.get("mask")
    masks = MaskInfo(classes=tuple(spec.get("classes") or ())) if spec else None
    return ScannedSource(kind=str(m.source.get("kind", "")), root=str(m.source.get("root", "")), task=m.task,
                         records=[], classes=tuple(m.classes), category_ids=tuple(m.category_ids or ()),
                         summary={k: v for k, v in m.source.items() if k != "options"}, masks=masks)


def _joined(docs: list[dict]) -> dict:
    """Parts' journal forms (``Part.to_json``) of consecutive rows joined into one: per-sample lists end to end,
    counts summed."""
    out = {}
    for k, v in docs[0].items():
        if isinstance(v, list):
            out[k] = [x for d in docs for x in d[k]]
        elif isinstance(v, dict):
            out[k] = _joined([d[k] for d in docs])
        elif isinstance(v, int) and not isinstance(v, bool):
            out[k] = sum(d[k] for d in docs)
        else:
            out[k] = v
    return out


def _carried_part(f, reader, rows: np.ndarray):
    """Field ``f``'s part holding the base's ``rows`` in that order (a field without shards: labels, boxes):
    each run of consecutive rows as an update carries it over (``rows_part``), the runs joined."""
    runs = np.split(rows, np.flatnonzero(np.diff(rows) != 1) + 1)
    return f.load_part(_joined([f.rows_part(reader, int(r[0]), len(r), None).to_json() for r in runs if len(r)]))


def _copied_part(f, reader, out: Path, slot: int, K: int, rows: np.ndarray):
    """Field ``f``'s part for shard ``slot`` (an image-like field): the base's samples ``rows``, their stored
    bytes copied in that order into a new shard file."""
    part = f.part(out, slot, K)
    try:
        for r in rows.tolist():
            part.add(reader.px.sample(r))
        return part.close()
    except BaseException:
        part.abort()
        raise


def compact_dataset(out, info=None, warn=None) -> CompileReport:
    """Commit the next version of the local dataset ``out``: its latest version's samples, unchanged, in
    storage order (see the module docstring). Returns the report (``committed`` False when the version was
    in storage order already)."""
    t0 = time.perf_counter()
    say = warn or (lambda msg: None)
    tell = info or (lambda msg: None)
    if is_url(out):
        raise ConfigError(f"{out}: dsc compact rewrites a local dataset folder; compacting a dataset in object "
                          f"storage is not supported yet")
    out = Path(out)
    if not out.is_dir():
        raise DatasetNotFoundError(f"{out}: no such dataset directory")
    if not versions.is_versioned(Root(out)):  # not a dataset (named as such), or one from before versions
        m = L.read_manifest(out)
        return CompileReport(path=out, manifest=m, skipped=tuple(m.skipped), warnings=(), seconds=0.0,
                             bytes_written=0, committed=False)  # (no updates, so no holes: in storage order)
    with OutLock(out, "dsc compact"):
        base = open_base(out, say)
        m = base.manifest
        K, n_new = m.shard_size, m.version["number"] + 1
        if in_storage_order(base.live, K):
            return CompileReport(path=out, manifest=m, skipped=tuple(m.skipped), warnings=(),
                                 seconds=time.perf_counter() - t0, bytes_written=0, version=m.version["number"],
                                 committed=False)
        live = np.flatnonzero(base.live)
        next_slot = base.record["next_slot"]
        units = [live[u:u + K] for u in range(0, len(live), K)]
        tell(f"compact version {m.version['number']} of {out}: {len(live):,} samples from "
             f"{sum(s is not None for s in m.shards):,} shards into {len(units):,}")
        nodes = L.shard_nodes(m)
        discard_slots(out, nodes, next_slot)  # an interrupted compaction's (or update's) new slots
        txn = out / versions.TXN / str(n_new)
        shutil.rmtree(txn, ignore_errors=True)
        try:
            def slots():  # (the old slots are holes; each new one folded in as it is made: compile.fold_slots)
                for _ in range(next_slot):
                    yield {f.name: f.empty_part() for f in base.fields}, Rows.holes(0)
                for u, unit in enumerate(units):
                    parts = {f.name: _copied_part(f, base.readers[f.name], out, next_slot + u, K, unit)
                             if getattr(f, "pixels", None) is not None else _carried_part(f, base.readers[f.name], unit)
                             for f in base.fields}
                    if u == 0 and "objects" in parts and m.objects is not None:  # (the resize dropped them at
                        parts["objects"].dropped = int(m.objects.get("dropped_boxes", 0))  # compile time)
                    stat = base.stat[unit] if base.stat is not None else np.zeros((len(unit), 6), np.int64)
                    yield parts, Rows([base.keys[r] for r in unit.tolist()], base.orig[unit], base.affine[unit],
                                      base.orientation[unit], base.fingerprint[unit], stat, np.ones(len(unit), bool))

            parts, rows = fold_slots(tuple(base.fields), K, next_slot + len(units), slots())
            stage = txn / "stage"
            os.close(open_folder(stage, out))
            version = {"number": n_new, "parent": m.version["number"], "operation": "compact"}
            new_m = write_version(stage, out, _scanned_like(m), check_options(m, CompileOptions()), tuple(base.fields),
                                  parts, rows, K, tuple(m.skipped), version, tuple(m.classes))
            summary = {"samples": new_m.num_samples, "added": 0, "removed": 0, "changed": 0, "relabelled": 0,
                       "decoded": 0, "skipped": len(m.skipped)}
            versions.write_stat(out, n_new, rows.stat)
            sync_filesystem(out)
            versions.commit(out, versions.record_json(n_new, m.version["number"], "compact", summary,
                                                      next_slot + len(units), new_m))
        except BaseException:
            if n_new not in versions.versions(Root(out)):  # (an interrupt may land just after the commit)
                discard_slots(out, nodes, next_slot)
            shutil.rmtree(txn, ignore_errors=True)
            raise
        shutil.rmtree(txn, ignore_errors=True)
        view.refresh(out, new_m, m)
    written = sum(p.shard.nbytes for ps in parts.values() for p in ps[next_slot:] if getattr(p, "shard", None))
    return CompileReport(path=out, manifest=new_m, skipped=tuple(m.skipped), warnings=(),
                         seconds=time.perf_counter() - t0, bytes_written=written, version=n_new, committed=True)
