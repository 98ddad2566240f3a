"""Dataset versions: a log of immutable snapshots inside the dataset directory (docs/FORMAT.md, "Versions").

    OUT/_dsc/log/<N>.json        version N's record: the whole manifest of that version (self-contained: no
                                 log replay, opening any version reads one record) and what made it
    OUT/_dsc/objects/<sha256>    every small file a version uses (array metadata, index arrays, keys),
                                 content-addressed, written once and never changed
    OUT/_dsc/tags/<name>.json    a name for a version
    OUT/_dsc/pins/<N>            lock files: an open reader of version N holds a shared flock on its pin
    OUT/_dsc/txn/<N>/            an update making version N: its resume journal (gone once it commits)

Shards are immutable files at their slot's path (``image/c/<slot>/...``): a slot number is never reused
for other bytes, so every version that references a shard reads the same bytes. A commit is the creation
of ``log/<N>.json`` with link(2), which fails if the name exists: of two writers making version N, exactly
one commits, the other is told so (``VersionConflictError``) and nothing it wrote is referenced.

The plain-Zarr view at the top of OUT (``zarr.json``, the arrays' metadata and index files) shows the
latest version; its small files are copies of the same objects (copies: a plain Zarr writer changing the
view cannot change a version). dsc itself always reads a version through its record, so refreshing the
view after a commit never races a dsc reader.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import time
from pathlib import Path

from ..errors import ConfigError, CorruptDatasetError, DatasetNotFoundError, VersionConflictError, VersionNotFoundError
from ..store import LocalStore, Store, open_store
from ..store.local import NewFile, Root, open_folder, open_lock_file, try_exclusive, write_atomic
from .manifest import Manifest
from .shardtable import StoreLoader, object_intact
from .names import CONTENT_OBJECTS, object_path, slot_folders
from .zarr_v3 import MAX_JSON_BYTES, parse_json
from ..errors import CredentialsError
from ..errors import UnsafePathError

DSC_DIR = "_dsc"
LOG = "_dsc/log"
OBJECTS = CONTENT_OBJECTS
TAGS = "_dsc/tags"
PINS = "_dsc/pins"
LEASES = "_dsc/leases"
TXN = "_dsc/txn"
LEASE_SECONDS = 7 * 86400.0  # a reader's lease on a version in object storage (renewed while it reads)
_RECORD = re.compile(r"^(0|[1-9][0-9]{0,8})\.json$")
_TAG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
RECORD_KEYS = {"version", "parent", "created", "operation", "summary", "next_slot", "manifest"}


def record_path(n: int) -> str:
    return f"{LOG}/{n}.json"


def as_store(where) -> Store:
    """The store of a dataset given as a Store, an open :class:`Root`, a path or a URL."""
    if isinstance(where, Store):
        return where
    if isinstance(where, Root):
        return LocalStore.of(where)
    return open_store(where)


def is_versioned(where) -> bool:
    """Whether the dataset keeps versions (compiled by a dsc with versions); older ones are version-less."""
    store = as_store(where)
    return store.has_folder(LOG) if store.local else bool(versions(store))


def versions(where) -> list[int]:
    """The committed version numbers, ascending (vacuumed ones are absent)."""
    return sorted(n for n in map(_record_number, (rel for rel, _ in as_store(where).list(LOG + "/"))) if n is not None)


def _record_number(rel: str) -> int | None:
    """N, for a version record's path ``_dsc/log/N.json``; None for anything else there."""
    parts = rel.split("/")
    m = _RECORD.match(parts[-1])
    return int(m.group(1)) if m and len(parts) == 3 else None


def commit_times(where) -> dict[int, float]:
    """{version: when its record was written, by the store's clock} (a file's mtime, an object's last
    modification). The retention period is measured from these, never from a record's ``created``: that is
    ``SOURCE_DATE_EPOCH`` when set (reproducible bytes), which may be any time in the past."""
    return {n: mtime for n, mtime in ((_record_number(rel), mtime) for rel, _, mtime in
                                      as_store(where).list_detailed(LOG + "/")) if n is not None}


def no_dataset(store: Store) -> DatasetNotFoundError:
    return DatasetNotFoundError(f"{store.url}: no dsc dataset there (no version log under {LOG}/); compile one with "
                                f"`dsc compile ... {store.url}`")


def read_record(where, n: int) -> dict:
    """Version ``n``'s record, parsed and checked (its manifest too: ``record["manifest"]`` is a Manifest)."""
    return read_record_bytes(where, n)[0]


def read_record_bytes(where, n: int) -> tuple[dict, bytes]:
    """(record, the record file's bytes) of version ``n`` (see ``read_record``)."""
    store = as_store(where)
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise VersionNotFoundError(f"{store.url}: a version is a number 0, 1, 2...; got {n!r}")
    try:
        data = store.get(record_path(n), MAX_JSON_BYTES)
    except FileNotFoundError:
        have = versions(store)
        if not have and not store.local:
            raise no_dataset(store) from None
        raise VersionNotFoundError(
            f"{store.url} has no version {n} (" + (f"versions: {_ranges(have)}" if have else "no versions")
            + "; `dsc log` lists them; a version removed by `dsc vacuum` is gone)") from None
    rec = parse_record(data, store.where(record_path(n)), n)
    bind_table(rec["manifest"], store)
    return rec, data


def bind_table(m: Manifest, store: Store, mirror: Path | None = None) -> Manifest:
    """Point version ``m``'s shard table (format 4) at the objects of the dataset in ``store`` (see
    ``shardtable.StoreLoader``; nothing is read until a shard's entry is needed)."""
    if m.shard_table is not None:
        m.shard_table.bind(StoreLoader(store, mirror))
    return m


def records(where, nums: list[int]) -> dict[int, dict]:
    """The records of versions ``nums`` (in parallel requests for object storage)."""
    store = as_store(where)
    if store.local or len(nums) < 2:
        return {n: read_record(store, n) for n in nums}
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(8) as ex:
        return dict(zip(nums, ex.map(lambda n: read_record(store, n), nums)))


def history(where, tags: dict[str, int] | None = None) -> list[dict]:
    """Every version still in the log, oldest first: ``{"version", "parent", "created", "operation",
    "samples", "added", "removed", "changed", "relabelled", "moved", "decoded", "skipped", "options",
    "source_version", "tags"}`` (counts are relative to the parent); ``tags``: {tag: version} (default: the
    readable tags)."""
    store = as_store(where)
    have = versions(store)
    recs = records(store, have)
    by_version: dict[int, list[str]] = {}
    for name, n in (tag_names(store) if tags is None else tags).items():
        by_version.setdefault(n, []).append(name)
    out = []
    for n in have:
        rec = recs[n]
        m = rec["manifest"]
        entry = {"version": n, "parent": rec["parent"], "created": rec["created"], "operation": rec["operation"],
                 "samples": m.num_samples, **{k: v for k, v in rec["summary"].items() if k != "samples"},
                 "options": {k: v for k, v in m.source.get("options", {}).items()},
                 "tags": sorted(by_version.get(n, []))}
        if "table_version" in m.source:
            entry["source_version"] = m.source["table_version"]
        out.append(entry)
    return out


def parse_record(data: bytes, where, n: int) -> dict:
    """Version ``n``'s record from its bytes (read from ``where``, named in errors), parsed and checked."""
    try:
        return _parse_record(data, where, n)
    except CorruptDatasetError as e:  # (its kind kept: an unsafe path stays an UnsafePathError)
        raise type(e)(f"{e}; the record is damaged: put the right file back, or move it out of {LOG} to drop version "
                      f"{n} (`dsc restore` makes a new version of an intact one)") from None


def _parse_record(data: bytes, where, n: int) -> dict:
    rec = parse_json(data, where)
    if not isinstance(rec, dict) or set(rec) != RECORD_KEYS or rec.get("version") != n:
        raise CorruptDatasetError(f"{where}: not a dsc version record for version {n} (edited or copied by hand?)")
    for key, kind in (("parent", (int, type(None))), ("created", str), ("operation", str), ("summary", dict),
                      ("next_slot", int), ("manifest", dict)):
        if not isinstance(rec[key], kind) or isinstance(rec[key], bool):
            raise CorruptDatasetError(f"{where}: {key} has the wrong type")
    try:
        m = Manifest.from_dict(rec["manifest"])
    except CorruptDatasetError as e:
        raise type(e)(f"{where}: {e}") from None
    if m.version is None or m.version.get("number") != n or rec["next_slot"] < len(m.shards):
        raise CorruptDatasetError(f"{where}: its manifest is not version {n}'s")
    if rec["parent"] != m.version.get("parent"):
        raise CorruptDatasetError(f"{where}: its parent ({rec['parent']!r}) is not its manifest's "
                                  f"({m.version.get('parent')!r})")
    rec["manifest"] = m
    return rec


def _ranges(nums: list[int]) -> str:
    out, start = [], None
    for i, v in enumerate(nums):
        if start is None:
            start = v
        if i + 1 == len(nums) or nums[i + 1] != v + 1:
            out.append(str(start) if start == v else f"{start}-{v}")
            start = None
    return ", ".join(out)


def read_tags(where) -> tuple[dict[str, int], dict[str, str]]:
    """({tag: version}, {tag: what is wrong with its file}): a damaged tag file breaks only its own tag."""
    store = as_store(where)
    good, bad = {}, {}
    rels = [f"{TAGS}/{name}" for name in store.names(TAGS)] if store.local else [rel for rel, _ in
                                                                                 store.list(TAGS + "/")]
    for rel in rels:  # (in a folder, everything there: a folder or a link named like a tag is a damaged tag)
        name = rel[len(TAGS) + 1:]
        if name.endswith(".json") and _TAG.match(name[:-5]):
            try:
                good[name[:-5]] = parse_tag(store.get(rel, 1 << 16), store.where(rel))
            except FileNotFoundError:  # deleted since the listing
                continue
            except CorruptDatasetError as e:
                bad[name[:-5]] = f"{e}; fix it, or remove the tag with `dsc tag {store.url} {name[:-5]} --delete`"
    return good, bad


def parse_tag(data: bytes, where) -> int:
    """The version a tag file names (``{"version": N, "created": ...}``)."""
    d = parse_json(data, where)
    n = d.get("version") if isinstance(d, dict) else None
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise CorruptDatasetError(f"{where}: not a dsc tag (a tag file holds {{\"version\": N, \"created\": ...}}"
                                  + (f"; its version is {n!r}" if isinstance(d, dict) and "version" in d else "") + ")")
    return n


def tag_names(where) -> dict[str, int]:
    """{tag: version} of the tags whose files are readable (``read_tags`` also says which are not)."""
    return read_tags(where)[0]


def check_tag(name: str) -> str:

    if not isinstance(name, str) or not _TAG.match(name):
        raise ConfigError(f"a tag is a plain name (letters, digits, '_', '.', '-'; at most 100), got {name!r}")
    return name


def check_version(store: Store, n) -> int:
    """``n`` if it is a version number (a whole number 0, 1, 2...: a pin's or a lease's name is made from it)."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 0 or n > 999_999_999:
        raise VersionNotFoundError(f"{store.url}: a version is a whole number 0, 1, 2... (`dsc log` lists them); "
                                   f"got {n!r}")
    return n


def resolve(where, version: int | None = None, tag: str | None = None) -> int:
    """The version to open: ``version``, the version ``tag`` names, or the latest. The one version choice,
    for a folder and for object storage alike."""
    store = as_store(where)
    if version is not None and tag is not None:
        raise ConfigError("give a version or a tag, not both")
    if tag is not None:
        good, bad = read_tags(store)
        if check_tag(tag) in bad:
            raise CorruptDatasetError(bad[tag])
        if tag not in good:
            raise VersionNotFoundError(f"{store.url} has no tag {tag!r}" + (f" (tags: {', '.join(sorted(good))})"
                                                                          if good else " (it has no tags)"))
        return good[tag]
    if version is not None:
        return check_version(store, version)
    nums = versions(store)
    if not nums:
        if not store.local:
            raise no_dataset(store)
        raise CorruptDatasetError(f"{store.url}: its version log is empty; the dataset is damaged")
    return nums[-1]


class Pin:
    """A shared flock on ``_dsc/pins/<N>`` for as long as a reader has version N open: ``dsc vacuum`` never
    removes a version whose pin it cannot lock exclusively. Where the pin cannot be made (a read-only
    copy of a dataset) the reader goes on without one; the retention period then protects it."""

    def __init__(self, path: Path, n: int):
        self.fd: int | None = None
        try:
            fd = open_pin(path, n)
        except OSError as e:
            if e.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
                return
            raise
        fcntl.flock(fd, fcntl.LOCK_SH)  # waits while a vacuum holds it exclusively (it is removing N)
        self.fd = fd

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __del__(self):
        self.release()


class Lease:
    """A reader of version N of a dataset in object storage, where there is no flock: the object
    ``_dsc/leases/<N>/<id>.json`` holding when it expires. ``dsc vacuum URL`` keeps every version with an
    unexpired lease; the reader removes its lease when it closes (a reader that died leaves one that expires,
    after ``LEASE_SECONDS``; ``renew`` pushes the expiry on for long runs)."""

    def __init__(self, store: Store, n: int, seconds: float = LEASE_SECONDS):
        import secrets

        self.store, self.n, self.seconds = store, n, seconds
        self.rel = f"{LEASES}/{n}/{secrets.token_hex(8)}.json"
        try:
            self.renew()
        except CredentialsError:  # read-only credentials: read without a lease (the retention period protects)
            self.rel = None

    def renew(self) -> None:
        if self.rel is not None:
            self.expires = time.time() + self.seconds
            self.store.put(self.rel, json.dumps({"version": self.n, "expires": self.expires}).encode())

    def release(self) -> None:
        rel, self.rel = getattr(self, "rel", None), None
        if rel is not None:
            try:
                self.store.delete(rel, best_effort=True)
            except Exception:  # noqa: BLE001 - the lease expires anyway
                pass

    def __del__(self):
        self.release()


def leased(store: Store, now: float | None = None) -> dict[int, float]:
    """{version: the latest expiry of its unexpired leases} (see :class:`Lease`); a damaged lease counts as held
    for the retention period from its upload."""
    now = time.time() if now is None else now
    out: dict[int, float] = {}
    for rel, size, mtime in store.list_detailed(LEASES + "/"):
        parts = rel.split("/")
        if len(parts) != 4 or not parts[2].isdigit():
            continue
        try:
            expires = float(json.loads(store.get(rel, 1 << 12))["expires"])
        except (ValueError, KeyError, TypeError, FileNotFoundError, CorruptDatasetError):
            expires = mtime + LEASE_SECONDS
        if expires > now:
            n = int(parts[2])
            out[n] = max(out.get(n, 0.0), expires)
    return out


_PIN_FIX = "Remove it (dsc makes its pin files again as readers open versions)"


def open_pin(path: Path, n: int) -> int:
    """Version ``n``'s pin file, made if missing; never through a link, and only a plain file (a folder or a
    link there is refused, naming it)."""
    path = Path(path)
    dfd = open_folder(path / PINS, path)
    try:
        return open_lock_file(str(n), f"version {n}'s pin file", _PIN_FIX, dir_fd=dfd, shown=path / PINS / str(n),
                              mode=0o666)
    finally:
        os.close(dfd)


def lock_unpinned(path: Path, n: int) -> int | None:
    """An exclusive lock on version N's pin, held by the returned descriptor (close it when N is removed),
    or None when an open reader holds N (or flock cannot tell: N is then kept, as a held one). While held, a reader
    that opens N waits, then finds it gone."""
    fd = open_pin(path, n)
    if not try_exclusive(fd):
        os.close(fd)
        return None
    return fd


def open_version(where, version: int | None = None, tag: str | None = None, read=None,
                 hold: bool = True) -> tuple[dict, "Pin | Lease | None"]:
    """Pin (a folder) or lease (object storage), then read, version ``version`` / ``tag`` / the latest: its
    record, by ``read(n)`` (default: ``read_record``; a remote reader also fetches the version's small files).
    ``hold=False``: no pin or lease (a process reading under its parent's). Given an open :class:`Root` (the
    caller's), it then reads that version's small files from their objects, whatever the view shows; a Store is
    left as it is (``version_files`` gives its version's files), so that what it reads stays what it writes."""
    store = as_store(where)
    read = read or (lambda n: read_record(store, n))
    for attempt in range(8):
        n = resolve(store, version, tag)
        if hold and store.stat(record_path(n)) is None:  # (no pin or lease made for a version that is not there)
            try:
                read(n)  # (its error: the versions there, or no dataset)
            except VersionNotFoundError:
                if version is not None or attempt == 7:
                    raise
                continue
        pin = (Pin(store.path, n) if store.local else Lease(store, n)) if hold else None
        try:
            rec = read(n)  # after the pin: a vacuum that removed N meanwhile has removed this record
        except VersionNotFoundError:
            if pin is not None:
                pin.release()
            if version is not None or attempt == 7:
                raise
            continue  # the latest (or the tagged) version was superseded and vacuumed meanwhile: resolve again
        if isinstance(where, Root):
            use(where, rec["manifest"])
        return rec, pin
    raise AssertionError("unreachable")


def check_private(path: Path, nodes=()) -> None:
    """Before a writer deletes or creates files under OUT: ``_dsc`` and its folders, and the shard folders of
    ``nodes``, are real directories (a symbolic link there would make a vacuum delete files elsewhere)."""

    for rel in (DSC_DIR, LOG, OBJECTS, TAGS, PINS, TXN, STAT, *nodes, *slot_folders(nodes)):
        p = path / rel
        if p.is_symlink() or (p.exists() and not p.is_dir()):
            raise UnsafePathError(f"{p} is {'a symbolic link' if p.is_symlink() else 'not a directory'}; dsc does "
                                  f"not follow links inside a dataset and will not write or delete through it. "
                                  f"Replace it with the directory it should be")


def use(root, m: Manifest) -> None:
    """Point ``root`` (a Root, or a store's Files) at version ``m``'s small files: their content objects."""
    root.redirect = {rel: object_path(f["sha256"]) for rel, f in m.files.items()}
    root.expected = {rel: f["nbytes"] for rel, f in m.files.items()}


def version_files(store: Store, m: Manifest):
    """The files of version ``m`` of the dataset in ``store`` (small files read from their objects)."""
    files = store.files()
    use(files, m)
    return files


def source_date_epoch() -> int | None:
    """``SOURCE_DATE_EPOCH`` (the reproducible-builds convention: whole seconds since 1970), or None when
    unset or empty. A malformed value is an error, as the convention asks."""
    value = os.environ.get("SOURCE_DATE_EPOCH", "").strip()
    if not value:
        return None
    if not value.isdigit() or int(value) > 253402300799:  # (9999-12-31T23:59:59Z)
        raise ConfigError(f"SOURCE_DATE_EPOCH must be a whole number of seconds since 1970-01-01, got {value!r}")
    return int(value)


def now() -> str:
    """The time written into records and tags: ``SOURCE_DATE_EPOCH`` when set (then two runs write the
    same bytes), else the clock."""
    fixed = source_date_epoch()
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if fixed is None else fixed))


def parse_time(s: str) -> float:
    import calendar

    return calendar.timegm(time.strptime(s, "%Y-%m-%dT%H:%M:%SZ"))


# ----------------------------------------------------------------------------- writing
def store_objects(src: Path, out: Path, files: dict) -> None:
    """Give every small file listed in ``files`` its object under ``out``: a hard link to the file in a
    private staging ``src``, a copy of one in the top-level view (``src`` is ``out``, or lacks it). The view
    never shares an inode with an object, so writing into the view (a plain Zarr user) cannot change a
    version's bytes. An object there already is reused only when its bytes hash to its name (one damaged on
    disk is replaced by these bytes, which were just hashed: a new version is never damaged from birth)."""
    root = Root(out)
    for rel, f in files.items():
        obj = out / object_path(f["sha256"])
        if object_intact(root, f["sha256"]):
            continue
        private = src != out and (src / rel).exists()
        if private:  # the staged file itself: no copy
            NewFile(obj, out, link=src / rel).commit()
        else:
            with Root(out).open(rel) as data:
                write_atomic(obj, data, out)


STAT = "_dsc/stat"


STAT_ROW_BYTES = 48  # (6 int64 per row: see write_stat)


def stat_path(n: int) -> str:
    """Where version ``n``'s stat cache is (relative to the dataset)."""
    return f"{STAT}/{n}.bin"


def stat_bytes(rows: int) -> int:
    """The size of a stat cache of ``rows`` rows."""
    return rows * STAT_ROW_BYTES


def write_stat(root: Path, n: int, stat) -> None:
    """The stat cache of version ``n``: per row, its input files' mtime, ctime and inode (image, then mask),
    int64. Advisory: ``--update`` skips re-reading an input whose stat is unchanged; without the cache (or
    with a damaged one) it reads every input and compares contents. Not part of the dataset's bytes."""
    import numpy as np

    write_atomic(root / stat_path(n), memoryview(np.ascontiguousarray(stat, "<i8")).cast("B"), root)


def read_stat(root: Root, n: int, rows: int):
    """Version ``n``'s stat cache, or None when absent or not of ``rows`` rows."""
    import numpy as np

    try:
        data = root.read(stat_path(n), stat_bytes(rows))
    except CorruptDatasetError:
        return None
    if len(data) != stat_bytes(rows):
        return None
    return np.frombuffer(bytes(data), "<i8").reshape(rows, 6)


def record_json(n: int, parent: int | None, operation: str, summary: dict, next_slot: int, m: Manifest) -> dict:
    return {"version": n, "parent": parent, "created": now(),
            "operation": operation, "summary": summary, "next_slot": next_slot,
            "manifest": {**m.to_dict(), "checksum": m.checksum()}}


def commit(where, record: dict) -> None:
    """Create ``log/<N>.json`` if no one did: the store's put-if-absent (a private file linked in, locally; a
    conditional put, in object storage), the same rule Delta's log relies on."""
    store = as_store(where)
    n = record["version"]
    data = (json.dumps(record, indent=1, ensure_ascii=False, allow_nan=False) + "\n").encode("utf-8")
    try:
        store.put_if_absent(record_path(n), data)
    except FileExistsError:
        raise VersionConflictError(f"{store.url}: another writer committed version {n} first; nothing of this run "
                                   f"was published. Run it again to apply it on top of version {n}") from None


def write_tag(where, name: str, n: int) -> None:
    check_tag(name)
    as_store(where).put(f"{TAGS}/{name}.json", (json.dumps({"version": n, "created": now()}) + "\n").encode())


def delete_tag(where, name: str) -> None:
    as_store(where).delete(f"{TAGS}/{check_tag(name)}.json")


__all__ = ["DSC_DIR", "LOG", "OBJECTS", "Pin", "as_store", "commit", "delete_tag", "is_versioned", "lock_unpinned",
           "no_dataset", "object_path", "open_version", "read_record", "read_tags", "record_json", "resolve",
           "store_objects", "tag_names", "versions", "write_tag"]
