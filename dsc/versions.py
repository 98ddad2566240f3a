"""Working with a dataset's versions: history, tags, restore, vacuum (``dsc log / tag / restore / vacuum``).

Versions are made by compiles and ``--update``; the format is ``formats/versions.py`` (docs/FORMAT.md,
"Versions"). Every function here that writes holds OUT's lock, like a compile.
"""
from __future__ import annotations

import os
import re
import shutil
import stat
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from .errors import ConfigError, CorruptDatasetError, DscError, VersionNotFoundError
from .formats import layout as L
from .formats import versions as V
from .formats import view
from .store.local import Root
from .store import is_url

DEFAULT_RETENTION = "7d"


def _root(out) -> Root:
    root = Root(out)
    if not V.is_versioned(root):
        raise VersionNotFoundError(f"{out} was compiled by a dsc without versions: it has only version 0 (compile it "
                                   f"again with this dsc to keep versions)")
    return root


def _remote_records(url: str, only: int | None = None, version=None, tag=None):
    """(store, {n: record}, tags) of a dataset in object storage: every record, or the one asked for."""
    from concurrent.futures import ThreadPoolExecutor

    from .store import open_store
    from .formats.remote import no_dataset, remote_tags, remote_versions

    store = open_store(url)
    have = remote_versions(store)
    if not have:
        raise no_dataset(store)
    tags = remote_tags(store)
    if only is None and version is None and tag is None:
        want = have
    else:
        want = [V.choose(store.url, version, tag, lambda: tags, lambda: have, None)]
    if want[0] not in have:
        raise VersionNotFoundError(f"{store.url} has no version {want[0]} (versions: {V._ranges(have)})")

    def one(n):
        return n, V.parse_record(store.get(V.record_path(n)), store.where(V.record_path(n)), n)

    with ThreadPoolExecutor(8) as ex:
        records = dict(ex.map(one, want))
    return store, have, records, tags


def manifest_of(out, version: int | None = None, tag: str | None = None):
    """(manifest of ``version`` / ``tag`` / the latest, a line describing it among the versions or None for a
    dataset without versions). ``out`` may be a URL (its record is read from object storage)."""
    if is_url(out):
        store, have, records, tags = _remote_records(out, 0, version, tag)
        (n, rec), = records.items()
        names = sorted(name for name, v in tags.items() if v == n)
        return rec["manifest"], (f"{n} ({'the latest' if n == have[-1] else f'latest is {have[-1]}'}; "
                                 f"{_n_versions(len(have))} in object storage; made {rec['created']} by "
                                 f"{rec['operation']}" + (f"; tags: {', '.join(names)}" if names else "") + ")")
    root = Root(out)
    if not V.is_versioned(root):
        if version not in (None, 0) or tag is not None:
            _root(out)
        return L.read_manifest(root), None
    n = V.resolve(root, version, tag)
    rec = V.read_record(root, n)
    have = V.versions(root)
    tags = sorted(name for name, v in _tags(root).items() if v == n)
    line = (f"{n} ({'the latest' if n == have[-1] else f'latest is {have[-1]}'}; {_n_versions(len(have))} on disk; "
            f"made {rec['created']} by {rec['operation']}" + (f"; tags: {', '.join(tags)}" if tags else "") + ")")
    return rec["manifest"], line


def _tags(root: Root) -> dict[str, int]:
    """{tag: version}; a damaged tag file is a warning (it breaks only its own tag)."""
    good, bad = V.read_tags(root)
    for problem in bad.values():
        warnings.warn(problem, stacklevel=3)
    return good


def _n_versions(k: int) -> str:
    return f"{k} version{'s' if k != 1 else ''}"


def log(out) -> list[dict]:
    """Every version still in the log, oldest first: ``{"version", "parent", "created", "operation",
    "samples", "added", "removed", "changed", "relabelled", "moved", "decoded", "skipped", "options",
    "source_version", "tags"}`` (counts are relative to the parent). ``out`` may be a URL."""
    if is_url(out):
        _, have, records, tag_map = _remote_records(out)
    else:
        root = Root(out)
        if not V.is_versioned(root):
            m = L.read_manifest(root)
            return [{"version": 0, "parent": None, "created": None, "operation": "compile", "samples": m.num_samples,
                     "tags": []}]
        have, records, tag_map = V.versions(root), None, _tags(root)
    tags: dict[int, list[str]] = {}
    for name, n in tag_map.items():
        tags.setdefault(n, []).append(name)
    out_list = []
    for n in have:
        rec = records[n] if records is not None else V.read_record(root, n)
        m = rec["manifest"]
        entry = {"version": n, "parent": rec["parent"], "created": rec["created"], "operation": rec["operation"],
                 "samples": m.num_samples, **{k: v for k, v in rec["summary"].items() if k != "samples"},
                 "options": {k: v for k, v in m.source.get("options", {}).items()}, "tags": sorted(tags.get(n, []))}
        if "table_version" in m.source:
            entry["source_version"] = m.source["table_version"]
        out_list.append(entry)
    return out_list


def tag(out, name: str, version: int | None = None, delete: bool = False) -> int | None:
    """Name ``version`` (default: the latest) ``name``; a tagged version is never vacuumed. ``delete``
    removes the tag instead. Returns the version tagged."""
    from .compiler.staging import OutLock

    if is_url(out):
        return _remote_tag(out, name, version, delete)
    root = _root(out)
    V.check_tag(name)
    with OutLock(Path(out), "tag"):  # not while a vacuum decides what to keep
        V.check_private(Path(out))
        path = Path(out) / V.TAGS / f"{name}.json"
        if delete:  # whatever is there, damaged or not (a link: the link, never its target)
            if not os.path.lexists(path):
                raise VersionNotFoundError(f"{out} has no tag {name!r}")
            if path.is_dir() and not path.is_symlink():
                os.rmdir(path)
            else:
                path.unlink()
            return None
        bad = V.read_tags(root)[1].get(name)
        if bad is not None:  # its version is unknown: replacing it silently could lose it
            raise CorruptDatasetError(f"{bad}; dsc does not replace a tag it cannot read")
        n = V.resolve(root, version)
        V.read_record(root, n)  # it exists
        V.write_tag(Path(out), name, n)
        return n


def _remote_tag(url: str, name: str, version: int | None, delete: bool) -> int | None:
    """A tag in object storage: one small object, written whole (a put replaces it atomically)."""
    import json

    V.check_tag(name)
    store, have, records, tags = _remote_records(url, 0, version)
    rel = f"{V.TAGS}/{name}.json"
    if delete:
        if name not in tags:
            raise VersionNotFoundError(f"{store.url} has no tag {name!r}")
        store.delete(rel)
        return None
    (n, _), = records.items()
    store.put(rel, (json.dumps({"version": n, "created": V.now()}) + "\n").encode())
    return n


def _local_only(out, what: str) -> None:
    if is_url(out):
        raise ConfigError(f"{out}: dsc {what} of a dataset in object storage is not supported yet; it works on a "
                          f"local copy (and dsc push publishes one)")


def restore(out, version: int | None = None, tag: str | None = None, cache_dir=None) -> int:
    """A new version whose content is ``version``'s (or ``tag``'s): the same shards and arrays, nothing
    copied or decoded. Returns the new version's number. ``out`` may be a URL (see ``restore_url``; its
    ``cache_dir`` stages the new record)."""
    from .compiler.staging import OutLock, sync_filesystem

    if version is None and tag is None:
        raise ConfigError("restore needs a version or a tag")
    if is_url(out):
        from .compiler.upload import restore_url

        return restore_url(out, version, tag, cache_dir)
    root = _root(out)
    with OutLock(Path(out), "restore"):
        V.check_private(Path(out))
        n_old = V.resolve(root, version, tag)
        old = V.read_record(root, n_old)
        have = V.versions(root)
        latest = V.read_record(root, have[-1])
        n_new = have[-1] + 1
        m = old["manifest"]
        from dataclasses import replace

        new_m = replace(m, version={"number": n_new, "parent": have[-1], "operation": f"restore {n_old}"})
        view.check(Path(out), new_m)
        stat = V.read_stat(root, n_old, m.num_rows)
        if stat is not None:
            V.write_stat(Path(out), n_new, stat)
        else:  # a crashed update's cache for this number must not become the restored version's
            (Path(out) / V.STAT / f"{n_new}.bin").unlink(missing_ok=True)
        shutil.rmtree(Path(out) / V.TXN, ignore_errors=True)  # an interrupted update of another base
        summary = {"samples": m.num_samples, "restored": n_old}
        sync_filesystem(Path(out))
        V.commit(Path(out), V.record_json(n_new, have[-1], f"restore {n_old}", summary,
                                          max(latest["next_slot"], old["next_slot"]), new_m))
        view.show(Path(out), new_m)
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


def parse_duration(s: str) -> float:
    """'7d', '12h', '30m', '45s', '0' -> seconds."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", str(s))
    if not m:
        raise ConfigError(f"a duration is a number with s, m, h, d or w (e.g. 7d, 12h, 0), got {s!r}")
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}[m.group(2)]


def vacuum(out, keep: int = 1, older_than: str | float = DEFAULT_RETENTION, dry_run: bool = False) -> VacuumReport:
    """Remove versions beyond the newest ``keep`` that are not tagged, not open in any process (pinned),
    and were superseded more than ``older_than`` ago (a retention period, like Delta's: it protects readers
    this machine cannot see, e.g. on other hosts); then every shard and object no remaining version uses."""
    from .compiler.staging import OutLock

    _local_only(out, "vacuum")
    if not isinstance(keep, int) or isinstance(keep, bool) or keep < 1:
        raise ConfigError(f"keep must be at least 1 (the latest version is always kept), got {keep!r}")
    retention = older_than if isinstance(older_than, (int, float)) else parse_duration(older_than)
    out = Path(out)
    root = _root(out)
    with OutLock(out, "vacuum"):
        have = V.versions(root)
        records = {n: V.read_record(root, n) for n in have}
        nodes = {node for rec in records.values() for node in L.shard_nodes(rec["manifest"])}
        V.check_private(out, sorted(nodes))
        tag_map, bad = V.read_tags(root)
        if bad:  # a tag keeps its version: while one cannot be read, nothing is removed
            raise CorruptDatasetError(f"{next(iter(bad.values()))}. A tag keeps its version from vacuum, and dsc cannot "
                                      f"tell which version this one keeps: nothing was removed")
        tagged = set(tag_map.values())
        if not dry_run:  # the view shows the latest version (after a writer killed before its refresh): a version
            view.show(out, records[have[-1]]["manifest"])  # vacuum removes is never the one plain readers see
        now = time.time()
        report = VacuumReport(kept=[], removed=[], dry_run=dry_run, tagged=sorted(tagged))
        held = []
        pins_before = set(os.listdir(out / V.PINS)) if (out / V.PINS).is_dir() else set()
        try:
            for k, n in enumerate(have):
                newest = k >= len(have) - keep
                superseded = V.parse_time(records[have[k + 1]]["created"]) if k + 1 < len(have) else now
                if newest or n in tagged:
                    report.kept.append(n)
                elif now - superseded < retention:
                    report.recent.append(n)
                    report.kept.append(n)
                else:
                    fd = V.lock_unpinned(out, n)
                    if fd is None:
                        report.pinned.append(n)
                        report.kept.append(n)
                    else:
                        held.append(fd)
                        report.removed.append(n)
            used_shards, used_objects = set(), set()
            for n in report.kept:
                m = records[n]["manifest"]
                used_shards |= {s.path for s in L.shard_specs(m)}
                used_objects |= {f["sha256"] for f in m.files.values()}
            # Everything the vacuum deletes, records first (a version is gone once its record is); the report
            # counts the files under these paths as they are now, so it says what the removal frees.
            doomed = [out / p for n in report.removed for p in (V.record_path(n), f"{V.STAT}/{n}.bin")]
            doomed += _unused(out, nodes, used_shards, used_objects)
            doomed += [out / V.PINS / str(n) for n in report.removed if str(n) in pins_before]
            doomed.append(out / V.TXN)  # under the lock no update runs: an interrupted one's leftovers
            report.files, report.bytes = _measure(doomed)
            if not dry_run:
                for p in doomed:
                    if p.is_dir() and not p.is_symlink():
                        shutil.rmtree(p, ignore_errors=True)
                    else:
                        p.unlink(missing_ok=True)
                for n in report.removed:  # (the pins this vacuum created to lock the versions it removed)
                    (out / V.PINS / str(n)).unlink(missing_ok=True)
        finally:
            for fd in held:
                os.close(fd)
    return report


def _measure(paths: list[Path]) -> tuple[int, int]:
    """(files, bytes) under ``paths`` (files, or folders walked without following links): every entry that
    is not a folder is a file; bytes are those of the regular files."""
    files = nbytes = 0
    stack = list(paths)
    while stack:
        p = stack.pop()
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            continue
        if stat.S_ISDIR(st.st_mode):
            stack += [e.path for e in os.scandir(p)]
        else:
            files += 1
            nbytes += st.st_size if stat.S_ISREG(st.st_mode) else 0
    return files, nbytes


def _unused(out: Path, nodes: set[str], used_shards: set[str], used_objects: set[str]) -> list[Path]:
    """Shard slot directories (``<node>/c/<slot>``, ``<node>/values/<slot>`` of the fields that have shards)
    and objects that no kept version uses."""
    doomed = []
    for node in sorted(nodes):
        for sub in ("c", "values"):
            d = out / node / sub
            if not d.is_dir() or d.is_symlink():
                continue
            for e in os.scandir(d):
                if not e.name.isdigit() or not e.is_dir(follow_symlinks=False):
                    continue
                slot = f"{node}/{sub}/{e.name}"
                if not any(s == slot or s.startswith(slot + "/") for s in used_shards):
                    doomed.append(Path(e.path))
    objects = out / V.OBJECTS
    if objects.is_dir():
        for sub in os.scandir(objects):
            if not sub.is_dir(follow_symlinks=False):
                continue  # not dsc's (a stray file, a link): left alone
            for p in os.scandir(sub.path):
                if p.name not in used_objects and p.is_file(follow_symlinks=False):
                    doomed.append(Path(p.path))
    return doomed


def repair_view(out) -> int:
    """Rewrite the top-level plain-Zarr view as the latest version (``dsc verify --repair-view``)."""
    from .compiler.staging import OutLock

    _local_only(out, "verify --repair-view")
    root = _root(out)
    with OutLock(Path(out), "repair"):
        V.check_private(Path(out))
        n = V.versions(root)[-1]
        view.refresh(Path(out), V.read_record(root, n)["manifest"], None)
    return n


__all__ = ["DEFAULT_RETENTION", "VacuumReport", "log", "manifest_of", "parse_duration", "repair_view", "restore", "tag", "vacuum",
           "DscError"]
