"""``--update``: the next version of a dataset from its source as it is now, decoding only what changed.

Every row of a version records what it was compiled from: its key, its input's size and crc32c (and its
mask's), its annotation's digest (``inputs/fingerprint``), and, beside the record, the input files' times
and inode (the stat cache). An update scans the source and sorts every input:

* **unchanged**: a live row with the same key whose input (and mask) is the same: the same size, times and
  inode, or, when those differ (a touched or copied file), the same size and crc32c of the bytes;
* **relabelled**: the same, with another label or annotation: the row is kept, its label (or its boxes,
  placed again from the stored geometry) replaced, not a pixel touched;
* **moved**: a new key whose bytes (size and crc32c, mask too) are those of a row whose key disappeared:
  the row is kept under the new key (an image moved to another class folder);
* **new** or **changed**: decoded, into new shards at new slots (never over a slot any version used);
* **removed**: live rows left over; they stay in their shards, ``live`` False, until a vacuum drops
  shards no kept version uses.

Unchanged samples' shards are not read, rewritten or copied. The result holds the same (key, pixels,
label, boxes, mask) set as a fresh compile of the source; its storage order is the old rows in their
order, then the new ones. The version is committed by creating its record (``formats/versions.py``).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from ..errors import ConfigError, CorruptDatasetError, DscError, SampleError, SourceError
from ..formats import layout as L
from ..formats import versions, view
from ..store.local import Root, not_ours, open_folder, refuse_links
from ..formats.fields import VALUE_KINDS, fields_of
from ..formats.manifest import FORMAT_VERSION, Manifest
from ..formats.zarr_v3 import read_string_array
from .decode import read_input_file
from .sources.inputs import identity, quoted_inode
from .journal import Journal, Resumed, hash_record, shard_check
from .options import CompileOptions, CompileReport
from .sources.base import ScannedSource, Source, duplicate_keys, record_digests, where
from .staging import OutLock, sync_filesystem
from .units import place_objects
from .compile import Rows
from .compile import UnitInputs, UnitTasks, _classes, _stop, decode_units, decode_warnings, fold_slots, write_version
from .compile import dataset_fields

OUTPUT_OPTIONS = ("size", "resize", "max_side", "mode", "fill", "background", "filter", "resizer", "draft",
                  "mask_ignore", "max_pixels")


@dataclass
class Base:
    """The version an update starts from."""

    record: dict
    manifest: Manifest
    keys: list
    live: np.ndarray
    fingerprint: np.ndarray  # (R, 5)
    stat: np.ndarray | None  # (R, 6), or None without a stat cache
    orig: np.ndarray
    affine: np.ndarray
    orientation: np.ndarray
    readers: dict
    fields: list

    @classmethod
    def open(cls, out: Path) -> "Base":
        root = Root(out)
        if not versions.is_versioned(root):
            raise ConfigError(f"{out} was compiled by a dsc without versions, so it records nothing to compare the "
                              f"source with; compile it again once (without --update), then --update works")
        record, _pin = versions.open_version(root)
        m: Manifest = record["manifest"]
        check_base(root, out, m)
        store, R = L.Arrays(root), m.num_rows
        fields = fields_of(m)
        return cls(record, m, read_string_array(root, L.KEYS), store.array(L.LIVE, (R,)),
                   store.array(L.FINGERPRINT, (R, 5)), versions.read_stat(root, m.version["number"], R),
                   store.array(L.ORIG_SIZE, (R, 2)), store.array(L.AFFINE, (R, 4)),
                   store.array(L.EXIF_ORIENTATION, (R,)), {f.name: f.reader(store, m) for f in fields}, fields)


def check_base(root: Root, out: Path, m: Manifest) -> None:
    """Every small file of the base version has the bytes its manifest records (their hashes: the files are
    small, and an update carries them, or what it derives from them, into the new version): a base damaged on
    disk is refused, before the new version is made damaged from birth."""
    for rel, f in [*m.files.items(), *((versions.object_path(t["sha256"]), t) for t in L.table_objects(m))]:
        if root.sha256(rel) != f["sha256"]:
            raise CorruptDatasetError(
                f"{out}: version {m.version['number']}, the base of this update, is damaged: {rel} (its content "
                f"{versions.object_path(f['sha256'])}) does not have the bytes the version records, and an update "
                f"would carry the damage into the new version; nothing was written. `dsc verify {out}` lists every "
                f"problem; `dsc restore` an intact version (then --update), or compile again")


@dataclass
class Plan:
    """What an update does, input by input."""

    base: int
    digests: np.ndarray  # each record's ``record_digest``, taken once (by ``plan_update``)
    unchanged: list = field(default_factory=list)  # (row, record index)
    relabel: list = field(default_factory=list)  # (row, record index): same pixels, other label / boxes
    moved: list = field(default_factory=list)  # (row, record index): same bytes under a new key
    decode: list = field(default_factory=list)  # record indices: new or changed inputs
    changed: int = 0  # of ``decode``: inputs whose key had a row
    removed: list = field(default_factory=list)  # rows whose input is gone (or changed)
    stat: dict = field(default_factory=dict)  # row -> its input files' stat now (refreshes the cache)

    @property
    def added(self) -> int:
        return len(self.decode) - self.changed

    def summary(self) -> dict:
        return {"added": self.added, "removed": len(self.removed) - self.changed, "changed": self.changed,
                "relabelled": len(self.relabel), "moved": len(self.moved), "unchanged": len(self.unchanged),
                "decoded": len(self.decode)}

    def describe(self) -> str:
        s = self.summary()
        return (f"update of version {self.base}: +{s['added']} new, -{s['removed']} removed, ~{s['changed']} "
                f"changed (decoded again), {s['relabelled']} re-labelled and {s['moved']} moved (no decoding), "
                f"{s['unchanged']} unchanged; {s['decoded']} input{'s' if s['decoded'] != 1 else ''} to decode")

    @property
    def empty(self) -> bool:
        return not (self.decode or self.removed or self.relabel or self.moved)


# ----------------------------------------------------------------------------- what changed
def _probe(path: str | None, table: bool) -> tuple[int, int, int, int] | None:
    """(size, mtime, ctime, inode) of an input file (size -1 for a table cell: the file holds many)."""
    if not path:
        return None
    found = identity(path)  # (an object in a bucket: its size, time and ETag)
    if found is None:
        return None
    return (-1 if table else found[0]), *found[1:]


def _same_stat(cached: tuple, probe: tuple, path: str) -> bool:
    """Whether a stat cache's (mtime, ctime, inode) is the input's ``probe`` now (an object's inode: its ETag's
    checksum, with the quotes too, as a dataset compiled by an older dsc recorded it: ``quoted_inode``)."""
    now = tuple(_as_int64(v) for v in probe[1:])
    if cached == now:
        return True
    if cached[:2] != now[:2]:
        return False
    old = quoted_inode(path)
    return old is not None and cached[2] == _as_int64(old)


def _as_int64(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def _content(source: Source, records: list, masks: bool) -> list[tuple[int, int, int, int]]:
    """(size, crc32c, mask size, mask crc32c) of each record's bytes, read (never decoded) through the
    source's fetcher. An input that cannot be read gets (-1, ...): it can only be 'new'."""
    import io

    import google_crc32c

    out = []
    for start in range(0, len(records), 256):
        chunk = records[start:start + 256]
        try:
            fetch = source.fetcher(chunk)
        except DscError:
            out += [(-1, 0, -1, 0)] * len(chunk)
            continue
        for rec in chunk:
            try:
                item = fetch(rec)
                values = []
                for obj, what in ((item.obj, "image"), (item.mask if masks else None, "mask")):
                    if isinstance(obj, str):
                        data, fp = read_input_file(obj, what)
                        values += [fp[0], fp[4]]
                    elif isinstance(obj, io.BytesIO):
                        data = obj.getvalue()
                        values += [len(data), google_crc32c.value(data)]
                    else:
                        values += [0, 0]
                out.append(tuple(values))
            except (DscError, OSError):
                out.append((-1, 0, -1, 0))
    return out


def plan_update(base: Base, scanned: ScannedSource, source: Source) -> Plan:
    """Sort every input of ``scanned`` against the base version (see the module docstring)."""
    m = base.manifest
    records = scanned.records
    # each annotation's digest taken once: the comparison here, the journal's fingerprint, the new rows' and the
    # re-annotated rows' fingerprint column all read these
    plan = Plan(base=m.version["number"], digests=record_digests(records))
    digests = plan.digests
    masks = m.fields.get("mask") is not None
    table = source.rows_in_files
    known = source.unchanged_since(m.source) or set()  # inputs the source itself vouches for
    live_rows = np.flatnonzero(base.live)
    by_key = {base.keys[r]: int(r) for r in live_rows}
    fp = base.fingerprint
    labels = base.readers["label"].labels if "label" in base.readers else None
    segments_mask = masks and any(r.mask == "" for r in records)  # masks drawn from the annotations (COCO)
    if any(f.placed_at_decode for f in base.fields):
        segments_mask = True  # per-object masks and joints are placed while decoding: a new annotation decodes again

    def annotation_changed(i: int, r: int) -> bool:
        if labels is not None and int(labels[r]) != int(records[i].label):
            return True
        return int(digests[i]) != int(fp[r, 4])  # boxes, and value fields (a changed caption or score)

    claimed: set[int] = set()
    need_content, pending = [], []  # records whose bytes decide, and (record, row or None) in input order
    for i, rec in enumerate(records):
        r = by_key.get(rec.key)
        if r is None:
            pending.append((i, None))
            continue
        claimed.add(r)
        probes = (_probe(rec.path, table), _probe(rec.mask or None, False))
        plan.stat[r] = probes
        cached = base.stat[r] if base.stat is not None else None
        same_stat = cached is not None and probes[0] is not None and \
            _same_stat(tuple(cached[:3]), probes[0], rec.path) and \
            (probes[0][0] < 0 or probes[0][0] == fp[r, 0]) and (
                not masks or not rec.mask or (probes[1] is not None and tuple(cached[3:]) == tuple(
                    _as_int64(v) for v in probes[1][1:]) and probes[1][0] == fp[r, 2]))
        if same_stat or rec.path in known:
            pending.append((i, r))
        else:
            need_content.append(i)
            pending.append((i, r))
    contents = dict(zip(need_content, _content(source, [records[i] for i in need_content], masks)))
    gone = [int(r) for r in live_rows if int(r) not in claimed]
    gone_by_bytes: dict[tuple, list[int]] = {}
    for r in gone:
        gone_by_bytes.setdefault(tuple(int(v) for v in fp[r, :4]), []).append(r)
    new_ids = [i for i, r in pending if r is None]
    if new_ids and gone:  # a new key with the bytes of a vanished one: moved, not new
        sizes = {int(fp[r, 0]) for r in gone}
        candidates = [i for i in new_ids if table or (_probe(records[i].path, False) or (None,))[0] in sizes]
        contents.update(zip(candidates, _content(source, [records[i] for i in candidates], masks)))
    for i, r in pending:
        rec = records[i]
        if r is not None:
            if i in contents and tuple(int(v) for v in fp[r, :4]) != tuple(contents[i]):
                plan.decode.append(i)
                plan.changed += 1
                plan.removed.append(r)
            elif annotation_changed(i, r):
                if segments_mask:  # the mask is drawn from the annotation: decode it again
                    plan.decode.append(i)
                    plan.changed += 1
                    plan.removed.append(r)
                else:
                    plan.relabel.append((r, i))
            else:
                plan.unchanged.append((r, i))
            continue
        match = gone_by_bytes.get(tuple(contents[i])) if i in contents else None
        if match and not (segments_mask and annotation_changed(i, match[0])):
            r = match.pop(0)
            plan.moved.append((r, i))
            plan.stat[r] = (_probe(rec.path, table), _probe(rec.mask or None, False))
            gone.remove(r)
        else:
            plan.decode.append(i)
    plan.removed += gone
    return plan


# ----------------------------------------------------------------------------- the update
def check_options(base: Manifest, options: CompileOptions) -> CompileOptions:
    """The options the dataset was compiled with, with this run's own (workers, on_error...). An output
    option given explicitly with another value than recorded is refused: that is a new compile."""
    recorded = dict(base.source.get("options", {}))
    for name in OUTPUT_OPTIONS:
        if name in options.explicit:
            mine, theirs = getattr(options, name), recorded.get(name, CompileOptions.__dataclass_fields__[name].default)
            if _norm(mine) != _norm(theirs):
                raise ConfigError(f"--update keeps the options the dataset was compiled with; it has "
                                  f"{name}={theirs!r}, this run asks {name}={mine!r}. Changing how samples are "
                                  f"stored is a new compile: compile into a new OUT (or --overwrite)")
    if "shard_size" in options.explicit and options.shard_size not in (None, base.shard_size,
                                                                         recorded.get("shard_size")):
        raise ConfigError(f"--update keeps the dataset's shard size ({base.shard_size} samples a shard); this run asks "
                          f"{options.shard_size}. Re-sharding is a new compile: compile into a new OUT (or --overwrite)")
    kept = {k: (tuple(v) if isinstance(v, list) else v) for k, v in recorded.items()
            if k in OUTPUT_OPTIONS or k == "shard_size" or k == "on_error" and k not in options.explicit}
    return replace(options, **kept)


def _check_same_source(m: Manifest, scanned: ScannedSource, source: Source, out: Path, say) -> None:
    """The update reads the same kind of source with the same parameters (paths may move: a warning)."""
    src = m.source
    if src.get("kind") != scanned.kind:
        raise ConfigError(f"{out} was compiled from a {src.get('kind')} source; this run reads a {scanned.kind} "
                          f"source: that is a new compile (into a new OUT, or --overwrite)")
    recorded = src.get("params")
    if isinstance(recorded, dict):
        mine = scanned.summary.get("params", {})
        for p in source.params:
            if not p.python or p.type in ("dir", "file", "path", "object") or p.name in source.update_free:
                continue
            a, b = _norm(recorded.get(p.name, p.default)), _norm(mine.get(p.name, p.default))
            if a != b:
                flag = p.option if p.cli and not p.argument else p.name
                raise ConfigError(f"{out} was compiled with {p.name}={a!r}; this run gives {p.name}={b!r}. --update "
                                  f"reads the source as it was compiled: pass {flag} as then (changing it is a new "
                                  f"compile)")
    if src.get("root") and scanned.root and os.path.abspath(src["root"]) != os.path.abspath(scanned.root):
        say(f"{out} was compiled from {src['root']}; this update reads {scanned.root} (inputs are matched by key, "
            f"relative to the source)")


def _norm(v):
    if isinstance(v, (tuple, list)):  # (a repeatable CLI option given no times is [], the Python default None)
        return list(v) or None
    return v


def update_dataset(scanned: ScannedSource, out: Path, options: CompileOptions, source: Source, warn=None,
                   info=None, first_slot: int = 0, view_too: bool = True,
                   direct: tuple[str, str] | None = None) -> CompileReport:
    """Make the next version of ``out`` from ``scanned`` (see the module docstring). ``info(message)``
    receives the plan before anything is written; ``warn`` the notes (a resumed or discarded attempt).
    ``first_slot``: new shards go to slots from there on at least (a dataset in object storage: past every
    shard already in the bucket). ``view_too=False``: the plain-Zarr view is not written (a staging copy of a
    dataset in object storage: the push writes the bucket's view from the version's objects). ``direct``: (URL,
    writer token) of a dataset in object storage updated on a Dask cluster: the units upload their own shards
    there (as a compile's: compile.py), ``out`` gets everything else."""

    t0 = time.perf_counter()
    say = warn or (lambda msg: None)
    tell = info or (lambda msg: None)
    if source.local_only:
        raise ConfigError("--update needs inputs with a stable identity (files or table rows); a Python dataset "
                          "has none: compile it again instead")
    if scanned.invalid and options.on_error == "fail":
        key, reason = scanned.invalid[0]
        raise _stop(key, key, reason)
    dups = duplicate_keys(scanned.records)
    if dups:
        first = [where(r) for r in scanned.records if r.key == dups[0]]
        raise SourceError(f"{scanned.root}: --update matches inputs to samples by key, and {len(dups)} key"
                          f"{'s name' if len(dups) > 1 else ' names'} more than one input (first: {dups[0]!r}: "
                          f"{', '.join(first[:3])}); make keys unique (a table's --key-column, one entry per "
                          f"image in a split list) or compile again without --update")
    with OutLock(out, "dsc update"):
        base = open_base(out, say, view_too)
        m = base.manifest
        options = check_options(m, options)
        _check_same_source(m, scanned, source, out, say)
        fields = dataset_fields(scanned, options)
        _check_same_fields(base, fields, scanned, out)
        plan = plan_update(base, scanned, source)
        tell(plan.describe())
        classes = _scanned_classes(scanned, m)
        if classes != m.classes:
            added = [c for c in classes if c not in m.classes]
            gone = [c for c in m.classes if c not in classes]
            tell(f"classes: {len(m.classes)} -> {len(classes)}" + (f"; new: {', '.join(added[:5])}" if added else "")
                 + (f"; gone: {', '.join(gone[:5])}" if gone else "") + "; every sample's label follows its class name "
                 "(indices of existing classes may shift)")
        if options.dry_run or plan.empty and classes == m.classes:
            return CompileReport(path=out, manifest=m, skipped=(), warnings=scanned.warnings,
                                 seconds=time.perf_counter() - t0, bytes_written=0, plan=plan.summary(),
                                 version=m.version["number"], committed=False, dry_run=options.dry_run)
        if m.format_version < FORMAT_VERSION:
            say(f"{out}: version {m.version['number']} is format {m.format_version}; this update writes the new "
                f"version in format {FORMAT_VERSION} (the shard table), which an older dsc (one that reads formats "
                f"up to 3) cannot read; the versions before it stay readable")
        return _apply(base, plan, scanned, out, options, source, fields, t0, say, first_slot, view_too, direct)


def _scanned_classes(scanned: ScannedSource, m) -> tuple[str, ...]:
    """The source's class names as far as the scan knows them. A source whose classes are its label values
    (a WebDataset's ``.cls`` members without --classes: compile.py's ``_classes``) names none before decoding:
    its classes are the base's until the new version's labels say otherwise (``_classes`` at the commit)."""
    return scanned.classes if scanned.names_classes else m.classes


def _check_same_fields(base: Base, fields, scanned: ScannedSource, out: Path) -> None:
    want = {f.name: f for f in fields}
    have = {f.name: f for f in base.fields}
    if set(want) != set(have) or scanned.task != base.manifest.task:
        raise ConfigError(f"{out} is a {base.manifest.task} dataset with {', '.join(sorted(have))}; the source now "
                          f"gives {scanned.task} with {', '.join(sorted(want))}: that is a new compile")
    if "objects" in want and want["objects"].attributes != have["objects"].attributes:
        raise ConfigError(f"{out}: the source's per-box columns changed ({sorted(have['objects'].attributes)} -> "
                          f"{sorted(want['objects'].attributes)}): that is a new compile")
    if "mask" in want:
        a, b = want["mask"].spec, have["mask"].spec
        if (a.dtype, a.ignore_index, a.classes) != (b.dtype, b.ignore_index, b.classes):
            raise ConfigError(f"{out}: the masks' classes, dtype or ignore index changed: that is a new compile")
    for name, f in want.items():  # value fields: the same kind, dtype and shape (their rows are carried over)
        spec = getattr(f, "spec", None)
        if isinstance(spec, dict) and spec.get("kind") in VALUE_KINDS and spec != have[name].spec:
            raise ConfigError(f"{out}: the field {name!r} was {have[name].describe()}, the source now gives "
                              f"{f.describe()}: that is a new compile")


def open_base(out: Path, say, view_too: bool = True) -> Base:
    """The latest version of ``out``, to make the next one from (an update's, a compaction's; the caller holds
    ``out``'s lock): what a killed update or compaction left tidied first (:func:`_recover`), every folder it
    reads checked as dsc's own, and its plain-Zarr view checked."""
    versions.check_private(out, ["image"])
    _recover(out, say, view_too)
    base = Base.open(out)
    versions.check_private(out, L.shard_nodes(base.manifest))
    view.check(out, base.manifest)
    return base


def _recover(out: Path, say, view_too: bool = True) -> None:
    """Under the lock: a committed version whose view was not refreshed (a kill after the commit) gets it;
    an update interrupted before its commit leaves a transaction the next update resumes or discards; the
    folder of one killed after its commit (before its removal) is removed here."""
    root = Root(out)
    if not versions.is_versioned(root):
        return
    have = versions.versions(root)
    if view_too:
        view.show(out, versions.read_record(root, have[-1])["manifest"])
    txns = out / versions.TXN
    if txns.is_dir():  # a kill between a commit and the removal of its transaction: its leftovers
        for e in os.scandir(txns):
            if e.name.isdigit() and int(e.name) <= have[-1]:
                shutil.rmtree(e.path, ignore_errors=True)


def _txn_fingerprint(base: Base, plan: Plan, scanned: ScannedSource, options: CompileOptions, next_slot: int) -> str:
    h = hashlib.sha256()
    h.update(json.dumps({"base": plan.base, "next_slot": next_slot, "options": options.recorded(
        masks=scanned.masks is not None), "K": base.manifest.shard_size}, sort_keys=True, default=str).encode())
    for i in plan.decode:
        hash_record(h, scanned.records[i], int(plan.digests[i]))
    return h.hexdigest()


def _apply(base: Base, plan: Plan, scanned: ScannedSource, out: Path, options: CompileOptions, source: Source,
           fields, t0: float, say, first_slot: int = 0, view_too: bool = True,
           direct: tuple[str, str] | None = None) -> CompileReport:

    m = base.manifest
    K = m.shard_size
    n_new = m.version["number"] + 1
    next_slot = max(base.record["next_slot"], first_slot)
    records = scanned.records
    decode = [records[i] for i in plan.decode]
    decoded_digests = plan.digests[plan.decode]
    txn = out / versions.TXN / str(n_new)
    unit_options = replace(options, executor=None)
    tasks = UnitTasks(decode, K, str(out), unit_options, tuple(fields), direct, s0=next_slot)  # (made when taken)
    journal = Journal(txn, _txn_fingerprint(base, plan, scanned, options, next_slot), tuple(fields), shard_root=out,
                      shard_ok=shard_check(out, direct))
    inputs = UnitInputs(tasks)  # (a compile's shape: 32 bytes a unit)
    done = Resumed.none()
    if os.path.lexists(txn):
        if txn.is_symlink() or not txn.is_dir():
            raise not_ours(txn, f"the folder of an interrupted update (dsc's, under {versions.TXN})")
        refuse_links(txn, "in the folder of an interrupted update; remove it (the update starts over)")
        try:
            journal.check_plan()
            done = journal.finished_units(inputs)
            if done:
                say(f"resuming an interrupted update: {len(done)} of {len(tasks)} new shards kept")
        except DscError:
            say(f"discarding the unfinished shards of an earlier update that did not commit (other inputs, or another "
                f"base version; {txn})")
            shutil.rmtree(txn, ignore_errors=True)
    discard_slots(out, L.shard_nodes(m), next_slot, keep=done)
    results, bad = decode_units(tasks, decode, scanned, options, journal, done, source, inputs,
                                options.workers or os.cpu_count() or 1, tmp=out)  # (units that upload their
    # shards hand back the small files they wrote besides them: those go into ``out``)
    said = decode_warnings(results, decode, say)
    failed = {decode[i].key for r in results for i, _ in r.errors}
    if not (plan.removed or plan.relabel or plan.moved) and failed == {r.key for r in decode} and \
            {k for k, _, _ in bad} == {s["key"] for s in m.skipped} and _scanned_classes(scanned, m) == m.classes:
        say(f"the {len(failed)} input{'s' if len(failed) != 1 else ''} skipped before still fail and nothing else "
            f"changed: no new version")
        discard_slots(out, L.shard_nodes(m), next_slot)
        shutil.rmtree(txn, ignore_errors=True)
        return CompileReport(path=out, manifest=m, skipped=tuple(m.skipped), warnings=scanned.warnings,
                             seconds=time.perf_counter() - t0, bytes_written=0, plan=plan.summary(),
                             version=m.version["number"], committed=False)
    # ---- the new version's rows: the base's slots as they are (some rows now removed), then the new slots, each
    # folded into flat arrays as it is made (compile.fold_slots: the shape a fresh compile's parts have)
    dead = np.zeros(max([next_slot * K, *(r + 1 for r in plan.removed)]), bool)  # (by row: a slot's own rows
    dead[np.asarray(plan.removed, np.int64)] = True  # looked up, not every removed row or stat probe a slot)
    reannotate = {**dict(plan.relabel), **dict(plan.moved)}
    errors = []

    def slots():
        for s in range(next_slot):
            spec = m.shards[s] if s < len(m.shards) else None
            count = spec.count if spec is not None else 0
            start = s * K
            live = base.live[start:start + count].copy()
            live[dead[start:start + count]] = False
            if not live.any():  # a slot this version does not need: its rows become holes
                count, live = 0, live[:0]
            slot_parts = {f.name: (f.rows_part(base.readers[f.name], start, count, _field_shard(base, f.name, s))
                                   if count else f.empty_part()) for f in fields}
            rows = _base_rows(base, start, count, live)
            for j in range(count):
                i = reannotate.get(start + j)
                if i is None:
                    continue
                rec = records[i]
                rows.keys[j] = rec.key
                try:
                    _reannotate(base, slot_parts, rows, j, start + j, rec, int(plan.digests[i]), m)
                except SampleError as e:
                    errors.append((rec.key, where(rec), e.reason))
                    rows.live[j] = False
            for j in range(count):
                probes = plan.stat.get(start + j)
                if probes is not None:
                    rows.stat[j] = _stat_row(probes)
            yield slot_parts, rows
        for task, res in zip(tasks, results):
            yield ({f.name: res.parts[f.name] for f in fields}, Rows.compiled(decode, res.kept, [res], decoded_digests))

    parts, rows = fold_slots(tuple(fields), K, next_slot + len(tasks), slots())
    bad += errors
    if errors and options.on_error == "fail":
        raise _stop(*errors[0])
    if not rows.live.any():
        raise SourceError(f"{scanned.root}: no sample would be left in the new version of {out}"
                          + (f"; first error: {bad[0][0]}: {bad[0][2]}" if bad else ""))
    skipped = tuple({"key": k, "reason": r} for k, _, r in bad)
    version = {"number": n_new, "parent": m.version["number"], "operation": "update"}
    stage = txn / "stage"
    shutil.rmtree(stage, ignore_errors=True)
    os.close(open_folder(stage, out))
    new_m = write_version(stage, out, scanned, options, tuple(fields), parts, rows, K, skipped, version,
                          _classes(scanned, parts.get("label", []), parts.get("objects", [])), parent=m)
    summary = {"samples": new_m.num_samples, **plan.summary(), "skipped": len(skipped)}
    versions.write_stat(out, n_new, rows.stat)
    sync_filesystem(out)
    versions.commit(out, versions.record_json(n_new, m.version["number"], "update", summary,
                                              next_slot + len(tasks), new_m))
    shutil.rmtree(txn, ignore_errors=True)
    if view_too:
        view.refresh(out, new_m, m)
    return CompileReport(path=out, manifest=new_m, skipped=skipped, warnings=scanned.warnings + said,
                         seconds=time.perf_counter() - t0,
                         bytes_written=int(results.nbytes[~np.isin(np.arange(len(tasks)) + next_slot,
                                                                   done.slots)].sum()),
                         resumed_units=len(done),
                         plan=plan.summary(), version=n_new, committed=True,
                         reused_shards=sum(s is not None for s in new_m.shards[:next_slot]),
                         decoded=sum(len(t.records) for t in tasks if t.s not in done))


def _field_shard(base: Base, name: str, s: int):
    """Slot ``s``'s shard of field ``name`` in the base version (the new version's fields have none yet)."""
    if name == "image":
        return base.manifest.shards[s]
    spec = getattr(next((f for f in base.fields if f.name == name), None), "spec", None)
    shards = getattr(spec, "shards", None)
    return shards[s] if shards is not None and s < len(shards) else None


def _base_rows(base: Base, start: int, count: int, live: np.ndarray):

    sl = slice(start, start + count)
    stat = base.stat[sl].copy() if base.stat is not None else np.zeros((count, 6), np.int64)
    return Rows(list(base.keys[sl]), base.orig[sl].copy(), base.affine[sl].copy(), base.orientation[sl].copy(),
                base.fingerprint[sl].copy(), stat, live[:count].copy())


def _stat_row(probes) -> np.ndarray:
    img, mask = probes
    vals = [*(img[1:] if img else (0, 0, 0)), *(mask[1:] if mask else (0, 0, 0))]
    return np.asarray([_as_int64(v) for v in vals], np.int64)


def _reannotate(base: Base, parts: dict, rows, j: int, r: int, rec, digest: int, m: Manifest) -> None:
    """Row ``r`` (slot position ``j``) keeps its pixels and takes ``rec``'s label or boxes (``digest``: its
    ``record_digest``)."""
    if "label" in parts:
        parts["label"].labels[j] = int(rec.label)
    if "objects" in parts:
        h, w = (int(v) for v in base.orig[r])
        if m.image.layout == "fixed":
            out_h, out_w = m.image.height, m.image.width
        else:
            out_h, out_w = (int(v) for v in base.readers["image"].px.shapes[r, :2])
        parts["objects"].set_row(j, place_objects(rec.target, int(base.orientation[r]), h, w, base.affine[r],
                                                  out_h, out_w))
    for name, value in rec.fields:  # value fields (a table's columns) take the record's values
        if name in parts:
            parts[name].set_row(j, base.readers[name].field.encode(value, where(rec)))
    rows.fingerprint[j, 4] = digest


def discard_slots(out: Path, nodes: list[str], first: int, keep=frozenset()) -> None:
    """Remove shard slots of ``nodes`` from ``first`` on that an interrupted attempt left (no committed version
    uses them: slots are handed out past every version's), but the finished units being resumed (``keep``)."""
    for folder in L.slot_folders(nodes):
        d = out / folder
        if not d.is_dir():
            continue
        for e in os.scandir(d):
            if e.name.isdigit() and int(e.name) >= first and int(e.name) not in keep:
                shutil.rmtree(e.path, ignore_errors=True)


__all__ = ["Plan", "plan_update", "update_dataset"]
