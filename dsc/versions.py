"""Working with a dataset's versions: history, tags, restore, vacuum (``dsc log / tag / restore / vacuum``).

Versions are made by compiles and ``--update``; the format is ``formats/versions.py`` (docs/FORMAT.md,
"Versions"). Each command is written once, over the dataset's :class:`~dsc.store.Store`: a local folder
or object storage. A writer of a folder holds its lock (like a compile); in object storage a version is
committed by one conditional put, and readers' leases stand in for the folder's pins.
"""
from __future__ import annotations

import os
import shutil
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

from .errors import ConfigError, CorruptDatasetError, DscError, VersionConflictError, VersionNotFoundError
from .formats import layout as L
from .formats import versions as V
from .formats import view
from .compiler.staging import sync_filesystem
from .store import Store, open_store
from .store.object import WriterLease

DEFAULT_RETENTION = "7d"
WRITERS = WriterLease.PREFIX  # (object storage: the writers' leases)


def _versioned(out) -> Store:
    store = out if isinstance(out, Store) else open_store(out)
    if not V.is_versioned(store):
        if not store.local:
            raise V.no_dataset(store)
        L.read_manifest(store)  # (not a dataset at all: that error first)
        raise VersionNotFoundError(f"{out} was compiled by a dsc without versions: it has only version 0 (compile it "
                                   f"again with this dsc to keep versions)")
    return store


@contextmanager
def writing(store: Store, what: str, nodes=()):
    """What a writer holds while it writes: a folder's lock (and its private folders checked for links); in
    object storage a writer's lease (its writes never collide with another writer's, but a vacuum does not
    run beside one: see docs/REMOTE.md)."""
    with store.lock(what):
        if store.local:
            store.reopen()  # (what is at the path now: a folder read before the lock may have been replaced)
            V.check_private(store.path, nodes)
        yield


def _tags(store: Store) -> dict[str, int]:
    """{tag: version}; a damaged tag file is a warning (it breaks only its own tag)."""
    good, bad = V.read_tags(store)
    for problem in bad.values():
        warnings.warn(problem, stacklevel=3)
    return good


def manifest_of(out, version: int | None = None, tag: str | None = None):
    """(manifest of ``version`` / ``tag`` / the latest, a line describing it among the versions or None for a
    dataset without versions). ``out`` may be a URL (its record is read from object storage)."""
    store = open_store(out)
    if not V.is_versioned(store):
        if version not in (None, 0) or tag is not None or not store.local:
            _versioned(out)
        return L.read_manifest(store), None
    n = V.resolve(store, version, tag)
    rec = V.read_record(store, n)
    have = V.versions(store)
    tags = sorted(name for name, v in _tags(store).items() if v == n)
    where = "on disk" if store.local else "in object storage"
    line = (f"{n} ({'the latest' if n == have[-1] else f'latest is {have[-1]}'}; {_n_versions(len(have))} {where}; "
            f"made {rec['created']} by {rec['operation']}" + (f"; tags: {', '.join(tags)}" if tags else "") + ")")
    return rec["manifest"], line


def _n_versions(k: int) -> str:
    return f"{k} version{'s' if k != 1 else ''}"


def log(out) -> list[dict]:
    """Every version still in the log, oldest first (see ``formats.versions.history``). ``out`` may be a URL."""
    store = open_store(out)
    if not V.is_versioned(store):
        m = L.read_manifest(_versioned(out) if not store.local else store)
        return [{"version": 0, "parent": None, "created": None, "operation": "compile", "samples": m.num_samples,
                 "tags": []}]
    return V.history(store, _tags(store))


def tag(out, name: str, version: int | None = None, delete: bool = False) -> int | None:
    """Name ``version`` (default: the latest) ``name``; a tagged version is never vacuumed. ``delete``
    removes the tag instead (whatever is there, damaged or not). Returns the version tagged."""
    store = _versioned(out)
    V.check_tag(name)
    rel = f"{V.TAGS}/{name}.json"
    with writing(store, "tag"):  # (a folder: not while a vacuum decides what to keep)
        if delete:
            there = store.stat(rel) is not None if not store.local else _lexists(store, rel)
            if not there:
                raise VersionNotFoundError(f"{store.url} has no tag {name!r}")
            if store.local and (store.path / rel).is_dir() and not (store.path / rel).is_symlink():
                shutil.rmtree(store.path / rel)  # (a folder where a tag file belongs: damage, removed whole)
            else:
                store.delete(rel)
            return None
        bad = V.read_tags(store)[1].get(name)
        if bad is not None:  # its version is unknown: replacing it silently could lose it
            raise CorruptDatasetError(f"{bad}; dsc does not replace a tag it cannot read")
        n = V.resolve(store, version)
        V.read_record(store, n)  # it exists
        V.write_tag(store, name, n)
        return n


def _lexists(store, rel: str) -> bool:
    """Whether a folder has anything at ``rel`` (a damaged tag may be a folder or a link)."""
    return os.path.lexists(store.path / rel)


def restore(out, version: int | None = None, tag: str | None = None, cache_dir=None) -> int:
    """A new version whose content is ``version``'s (or ``tag``'s): its record lists the same shards and
    objects, so nothing is copied or decoded; then the view shows it. Returns the new version's number.
    ``out`` may be a URL: the record is committed by the conditional put, a restore racing another writer
    is told (VersionConflictError), and only the record, the stat cache and the view are written.
    (``cache_dir`` is ignored: a restore stages nothing.)"""
    if version is None and tag is None:
        raise ConfigError("restore needs a version or a tag")
    store = _versioned(out)
    with writing(store, "restore"):
        n_old = V.resolve(store, version, tag)
        old = V.read_record(store, n_old)
        have = V.versions(store)
        parent = have[-1]
        latest = old if parent == n_old else V.read_record(store, parent)  # (only its record: a damaged latest
        n_new = parent + 1                                                # version's files are not needed)
        m = old["manifest"]
        new_m = replace(m, version={"number": n_new, "parent": parent, "operation": f"restore {n_old}"})
        view.check(store, new_m)
        stat = store.get_or_none(V.stat_path(n_old), V.stat_bytes(m.num_rows))
        if store.local:
            store.delete(V.stat_path(n_new))  # (a crashed update's cache for this number is not the restore's)
            shutil.rmtree(store.path / V.TXN, ignore_errors=True)  # an interrupted update of another base
            sync_filesystem(store.path)
        summary = {"samples": m.num_samples, "restored": n_old}
        V.commit(store, V.record_json(n_new, parent, f"restore {n_old}", summary,
                                      max(latest["next_slot"], old["next_slot"]), new_m))
        if stat is not None:  # (after the commit: a restore that lost the race never touches the winner's)
            store.put(V.stat_path(n_new), stat)
        view.show(store, new_m)
        return n_new


@dataclass
class VacuumReport:
    kept: list[int]
    removed: list[int]
    pinned: list[int] = field(default_factory=list)  # beyond --keep but open in some process: kept
    recent: list[int] = field(default_factory=list)  # beyond --keep but within the retention period: kept
    tagged: list[int] = field(default_factory=list)  # tagged versions (always kept)
    files: int = 0  # files removed (would be removed): records, stat caches, pins, shards, objects, leftovers
    bytes: int = 0  # their bytes
    dry_run: bool = False
    leftovers: int = 0  # of the files: objects no version references (interrupted or losing writers)
    young: int = 0  # such files kept for being younger than the retention period (object storage)


def parse_duration(s: str) -> float:
    """'7d', '12h', '30m', '45s', '0' -> seconds."""
    import re

    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", str(s))
    if not m or (not m.group(2) and float(m.group(1)) != 0):  # ("7" alone: seconds or days? say which)
        raise ConfigError(f"a duration is a number with s, m, h, d or w (e.g. 7d, 12h, 30m, or 0), got {s!r}")
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}[m.group(2)]


def vacuum(out, keep: int = 1, older_than: str | float = DEFAULT_RETENTION, dry_run: bool = False) -> VacuumReport:
    """Remove versions beyond the newest ``keep`` that are not tagged, not open in any process (a folder's
    pins; readers' leases in object storage) and were superseded more than ``older_than`` ago (a retention
    period, like Delta's: it protects readers this machine cannot see, e.g. on other hosts); then every shard
    and object no remaining version uses. In object storage, where writers hold no lock, an object no version
    references is removed only once it is older than the retention period too (a writer may be about to
    commit it)."""
    if not isinstance(keep, int) or isinstance(keep, bool) or keep < 1:
        raise ConfigError(f"keep must be at least 1 (the latest version is always kept), got {keep!r}")
    retention = older_than if isinstance(older_than, (int, float)) else parse_duration(older_than)
    store = open_store(out)
    if not V.is_versioned(store):
        if store.local:
            _versioned(store)  # (raises: a folder compiled by a dsc without versions, or no dataset)
        elif not store.list(""):
            raise V.no_dataset(store)
    with writing(store, "vacuum"):  # (everything is read under the lock or lease: what writers left is final)
        have = V.versions(store)  # (the log read under the lease, not before)
        if not store.local and not have:  # no version: only what interrupted writers left
            return _leftovers_only(store, time.time() - retention, dry_run)
        records = V.records(store, have)
        nodes = sorted({node for rec in records.values() for node in L.shard_nodes(rec["manifest"])})
        if store.local:
            V.check_private(store.path, nodes)
        tag_map, bad = V.read_tags(store)
        if bad:  # a tag keeps its version: while one cannot be read, nothing is removed
            raise CorruptDatasetError(f"{next(iter(bad.values()))}. A tag keeps its version from vacuum, and dsc cannot "
                                      f"tell which version this one keeps: nothing was removed")
        tagged = set(tag_map.values())
        if not dry_run:  # the view shows the latest version (after a writer killed before its refresh): a version
            view.show(store, records[have[-1]]["manifest"])  # vacuum removes is never the one plain readers see
        now = time.time()
        committed = V.commit_times(store)  # (the store's clock: a record's `created` may be SOURCE_DATE_EPOCH's)
        report = VacuumReport(kept=[], removed=[], dry_run=dry_run, tagged=sorted(tagged))
        leases = V.leased(store, now) if not store.local else {}
        held = []
        try:
            for k, n in enumerate(have):
                newest = k >= len(have) - keep
                superseded = committed.get(have[k + 1], now) if k + 1 < len(have) else now
                if newest or n in tagged:
                    report.kept.append(n)
                elif now - superseded < retention:
                    report.recent.append(n)
                    report.kept.append(n)
                elif n in leases or (store.local and not _lock_unpinned(store, n, held)):
                    report.pinned.append(n)
                    report.kept.append(n)
                else:
                    report.removed.append(n)
            found = _doomed(store, report, records, nodes, now - retention)
            doomed = [(rel, size) for rel, size, young in found if not young]
            report.files = len(doomed)
            report.bytes = sum(size for _, size in doomed)
            referenced = _referenced(records)
            report.leftovers = sum(1 for rel, _ in doomed if _is_leftover(rel, referenced))
            report.young = sum(1 for rel, _, young in found if young and _is_leftover(rel, referenced))
            if not dry_run and (V.versions(store) != have or V.read_tags(store)[0] != tag_map):
                raise VersionConflictError(  # (object storage: a writer that came after the lease check)
                    f"{store.url} changed while vacuum decided what to remove (a version committed or a tag "
                    f"moved): nothing was removed; run vacuum again")
            if not dry_run:
                for rel, _ in doomed:  # records first (a version is gone once its record is)
                    if not rel.startswith(V.TXN + "/"):
                        store.delete(rel)
                if store.local:
                    shutil.rmtree(store.path / V.TXN, ignore_errors=True)  # (os.walk-free: rmtree never follows links)
                    for folder in L.slot_folders(nodes):
                        store.prune(folder)
        finally:
            for pin in held:
                os.close(pin)
    return report


def _leftovers_only(store: Store, cutoff: float, dry_run: bool) -> VacuumReport:
    """A URL where no version was ever committed: the shards and objects writers left there (a first compile
    that was interrupted, or lost a race), older than ``cutoff``. Only dsc's own paths are touched. Runs under
    the vacuum's lease, and lists after the log was read there: a compile that committed before the lease is
    a dataset (the caller's full vacuum), and none commits while the lease is held; the log is read once more
    before anything is removed."""
    found = [(rel, size, mtime) for folder in L.slot_folders((L.IMAGE, "mask"))  # (no manifest: every node that
             for rel, size, mtime in store.list_detailed(folder + "/") if L.slot_of(rel) is not None]  # has slots)
    found += [(rel, size, mtime) for rel, size, mtime in store.list_detailed(V.DSC_DIR + "/")
              if not rel.startswith(WRITERS)]  # (the writers' leases: this vacuum's own among them)
    doomed = [(rel, size) for rel, size, mtime in found if mtime <= cutoff]
    if not dry_run and doomed:
        if V.versions(store):
            raise VersionConflictError(f"{store.url}: a version was committed while vacuum decided what to remove: "
                                       f"nothing was removed; run vacuum again")
        for rel, _ in doomed:
            store.delete(rel)
    return VacuumReport(kept=[], removed=[], files=len(doomed), bytes=sum(n for _, n in doomed), dry_run=dry_run,
                        leftovers=len(doomed), young=len(found) - len(doomed))


def _lock_unpinned(store: Store, n: int, held: list) -> bool:
    """A folder: lock version n's pin exclusively (kept in ``held`` until the vacuum ends); False if a reader
    holds it open."""
    fd = V.lock_unpinned(store.path, n)
    if fd is None:
        return False
    held.append(fd)
    return True


def _doomed(store: Store, report: VacuumReport, records: dict, nodes: list[str],
            cutoff: float) -> list[tuple[str, int, bool]]:
    """Every file the vacuum removes, (path, bytes, kept for now), records first: the removed versions' records,
    stat caches, pins and leases; shard slots and objects no kept version uses (in object storage, those newer
    than ``cutoff`` are kept for now: a writer may be about to commit them); a folder's interrupted update (under
    the lock, no update runs)."""
    used_shards, used_objects = set(), set()
    for n in report.kept:
        m = records[n]["manifest"]
        try:  # (a kept version whose shard table cannot be read and checked: its shards are unknown, keep them all)
            used_shards |= {s.path for s in L.shard_specs(m)}
        except CorruptDatasetError as e:
            raise CorruptDatasetError(f"version {n}, which vacuum keeps: {e}. Vacuum cannot tell which shards it "
                                      f"uses: nothing was removed") from None
        used_objects |= {f["sha256"] for f in L.objects(m)}  # (the shard table's objects too)
    used_slots = {"/".join(p.split("/")[:3]) for p in used_shards}
    removed = set(report.removed)
    out = []
    for rel, size, _ in store.list_detailed(V.LOG + "/"):
        name = rel.rsplit("/", 1)[-1]
        if name.endswith(".json") and name[:-5].isdigit() and int(name[:-5]) in removed:
            out.append((rel, size, False))
    for prefix in (V.STAT + "/", V.PINS + "/", V.LEASES + "/"):
        for rel, size, _ in store.list_detailed(prefix):
            stem = rel[len(prefix):].split("/")[0].split(".")[0]
            if stem.isdigit() and int(stem) in removed:
                out.append((rel, size, False))
    young = (lambda mtime: False) if store.local else (lambda mtime: mtime > cutoff)  # noqa: E731
    for folder in L.slot_folders(nodes):
        for rel, size, mtime in store.list_detailed(folder + "/"):
            if L.slot_of(rel) is not None and rel.count("/") > 2 and "/".join(rel.split("/")[:3]) not in used_slots:
                out.append((rel, size, young(mtime)))
    for rel, size, mtime in store.list_detailed(V.OBJECTS + "/"):
        parts = rel.split("/")
        if len(parts) == 4 and parts[3] not in used_objects:
            out.append((rel, size, young(mtime)))
    if store.local:
        out += [(rel, size, False) for rel, size, _ in store.list_detailed(V.TXN + "/")]
    return out


def _is_leftover(rel: str, referenced: set[str]) -> bool:
    """A shard or object file no version in the log references (a writer's leftover)."""
    if rel.startswith(V.DSC_DIR + "/") and not rel.startswith(V.OBJECTS + "/"):
        return False
    return rel not in referenced and "/".join(rel.split("/")[:3]) not in referenced


def _referenced(records: dict) -> set[str]:
    """The shard slots and objects of every version in the log (a file outside them is a writer's leftover)."""
    every = set()
    for rec in records.values():
        m = rec["manifest"]
        try:  # (a removed version's damaged table: its shards count as leftovers, they go either way)
            every |= {"/".join(s.path.split("/")[:3]) for s in L.shard_specs(m)}
        except CorruptDatasetError:
            pass
        every |= {V.object_path(f["sha256"]) for f in L.objects(m)}
    return every


def repair_view(out) -> int:
    """Rewrite the top-level plain-Zarr view as the latest version (``dsc verify --repair-view``)."""
    store = _versioned(out)
    with writing(store, "repair"):
        n = V.versions(store)[-1]
        view.refresh(store, V.read_record(store, n)["manifest"], None)
    return n


__all__ = ["DEFAULT_RETENTION", "VacuumReport", "log", "manifest_of", "parse_duration", "repair_view", "restore",
           "tag", "vacuum", "DscError"]
