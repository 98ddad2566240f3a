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
import shutil
import time
from pathlib import Path

from ..errors import ConfigError, CorruptDatasetError, VersionConflictError, VersionNotFoundError
from .files import Root
from .manifest import Manifest
from .zarr_v3 import MAX_JSON_BYTES, parse_json, write_group

DSC_DIR = "_dsc"
LOG = "_dsc/log"
OBJECTS = "_dsc/objects"
TAGS = "_dsc/tags"
PINS = "_dsc/pins"
TXN = "_dsc/txn"
_RECORD = re.compile(r"^(0|[1-9][0-9]{0,8})\.json$")
_TAG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
RECORD_KEYS = {"version", "parent", "created", "operation", "summary", "next_slot", "manifest"}


def object_path(sha256: str) -> str:
    """Where a small file of this content lives (two-level fan-out keeps directories small)."""
    return f"{OBJECTS}/{sha256[:2]}/{sha256}"


def record_path(n: int) -> str:
    return f"{LOG}/{n}.json"


def is_versioned(root: Root) -> bool:
    """Whether the dataset keeps versions (compiled by a dsc with versions); older ones are version-less."""
    try:
        fd = root.open_dir(LOG)
    except (CorruptDatasetError, FileNotFoundError):
        return False
    os.close(fd)
    return True


def versions(root: Root) -> list[int]:
    """The committed version numbers, ascending (vacuumed ones are absent)."""
    try:
        fd = root.open_dir(LOG)
    except (CorruptDatasetError, FileNotFoundError):
        return []
    try:
        names = os.listdir(fd)
    finally:
        os.close(fd)
    return sorted(int(m.group(1)) for m in map(_RECORD.match, names) if m)


def read_record(root: Root, n: int) -> dict:
    """Version ``n``'s record, parsed and checked (its manifest too: ``record["manifest"]`` is a Manifest)."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise VersionNotFoundError(f"{root.path}: a version is a number 0, 1, 2...; got {n!r}")
    try:
        data = root.read(record_path(n), MAX_JSON_BYTES)
    except CorruptDatasetError as e:
        if "is missing" in str(e):
            have = versions(root)
            raise VersionNotFoundError(
                f"{root.path} has no version {n} (" + (f"versions: {_ranges(have)}" if have else "no versions")
                + "; `dsc log` lists them; a version removed by `dsc vacuum` is gone)") from None
        raise
    return parse_record(data, root / record_path(n), n)


def parse_record(data: bytes, where, n: int) -> dict:
    """Version ``n``'s record from its bytes (read from ``where``, named in errors), parsed and checked."""
    rec = parse_json(data, where)
    if not isinstance(rec, dict) or set(rec) != RECORD_KEYS or rec.get("version") != n:
        raise CorruptDatasetError(f"{where}: not a dsc version record for version {n} (edited or copied "
                                  f"by hand?); put the right file back, or move it out of {LOG} to drop version {n}")
    for key, kind in (("parent", (int, type(None))), ("created", str), ("operation", str), ("summary", dict),
                      ("next_slot", int), ("manifest", dict)):
        if not isinstance(rec[key], kind) or isinstance(rec[key], bool):
            raise CorruptDatasetError(f"{where}: {key} has the wrong type")
    m = Manifest.from_dict(rec["manifest"])
    if m.version is None or m.version.get("number") != n or rec["next_slot"] < len(m.shards):
        raise CorruptDatasetError(f"{where}: its manifest is not version {n}'s")
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


def tag_names(root: Root) -> dict[str, int]:
    """{tag: version}."""
    try:
        fd = root.open_dir(TAGS)
    except (CorruptDatasetError, FileNotFoundError):
        return {}
    try:
        names = sorted(os.listdir(fd))
    finally:
        os.close(fd)
    out = {}
    for name in names:
        if name.endswith(".json") and _TAG.match(name[:-5]):
            d = parse_json(root.read(f"{TAGS}/{name}", 1 << 16), root / f"{TAGS}/{name}")
            if isinstance(d, dict) and isinstance(d.get("version"), int):
                out[name[:-5]] = d["version"]
    return out


def check_tag(name: str) -> str:
    from ..errors import ConfigError

    if not isinstance(name, str) or not _TAG.match(name):
        raise ConfigError(f"a tag is a plain name (letters, digits, '_', '.', '-'; at most 100), got {name!r}")
    return name


def resolve(root: Root, version: int | None = None, tag: str | None = None) -> int:
    """The version to open: ``version``, the version ``tag`` names, or the latest."""
    return choose(root.path, version, tag, lambda: tag_names(root), lambda: versions(root),
                  lambda: CorruptDatasetError(f"{root.path}: its version log is empty; the dataset is damaged"))


def choose(where, version: int | None, tag: str | None, tags, have, empty) -> int:
    """``version``, the version ``tag`` names in ``tags()``, or the last of ``have()`` (``empty()`` is raised
    when there is none); ``where`` names the dataset in errors. Local and remote datasets alike."""
    from ..errors import ConfigError

    if version is not None and tag is not None:
        raise ConfigError("give a version or a tag, not both")
    if tag is not None:
        names = tags()
        if check_tag(tag) not in names:
            raise VersionNotFoundError(f"{where} has no tag {tag!r}" + (f" (tags: {', '.join(sorted(names))})"
                                                                       if names else " (it has no tags)"))
        return names[tag]
    if version is not None:
        return version
    nums = have()
    if not nums:
        raise empty()
    return nums[-1]


class Pin:
    """A shared flock on ``_dsc/pins/<N>`` for as long as a reader has version N open: ``dsc vacuum`` never
    removes a version whose pin it cannot lock exclusively. Where the pin cannot be made (a read-only
    copy of a dataset) the reader goes on without one; the retention period then protects it."""

    def __init__(self, path: Path, n: int):
        self.fd: int | None = None
        pins = path / PINS
        try:
            pins.mkdir(parents=True, exist_ok=True)
            fd = os.open(pins / str(n), os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o666)
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


def lock_unpinned(path: Path, n: int) -> int | None:
    """An exclusive lock on version N's pin, held by the returned descriptor (close it when N is removed),
    or None when an open reader holds N. While held, a reader that opens N waits, then finds it gone."""
    (path / PINS).mkdir(parents=True, exist_ok=True)
    fd = os.open(path / PINS / str(n), os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def open_version(root: Root, version: int | None = None, tag: str | None = None) -> tuple[dict, Pin]:
    """Pin, then read, version ``version`` / ``tag`` / the latest, and point ``root`` at its files (its small
    files are read from their objects, whatever the top-level view shows)."""
    for attempt in range(8):
        n = resolve(root, version, tag)
        pin = Pin(root.path, n)
        try:
            rec = read_record(root, n)  # after the pin: a vacuum that removed N meanwhile has removed this record
        except VersionNotFoundError:
            pin.release()
            if version is not None or attempt == 7:
                raise
            continue  # the latest (or the tagged) version was superseded and vacuumed meanwhile: resolve again
        use(root, rec["manifest"])
        return rec, pin
    raise AssertionError("unreachable")


def check_private(path: Path, nodes=()) -> None:
    """Before a writer deletes or creates files under OUT: ``_dsc`` and its folders, and the shard folders of
    ``nodes``, are real directories (a symbolic link there would make a vacuum delete files elsewhere)."""
    from ..errors import UnsafePathError

    for rel in (DSC_DIR, LOG, OBJECTS, TAGS, PINS, TXN, STAT, *nodes,
                *(f"{n}/{sub}" for n in nodes for sub in ("c", "values"))):
        p = path / rel
        if p.is_symlink() or (p.exists() and not p.is_dir()):
            raise UnsafePathError(f"{p} is {'a symbolic link' if p.is_symlink() else 'not a directory'}; dsc does "
                                  f"not follow links inside a dataset and will not write or delete through it. "
                                  f"Replace it with the directory it should be")


def use(root: Root, m: Manifest) -> None:
    root.redirect = {rel: object_path(f["sha256"]) for rel, f in m.files.items()}
    root.expected = {rel: f["nbytes"] for rel, f in m.files.items()}


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
    version's bytes."""
    for rel, f in files.items():
        obj = out / object_path(f["sha256"])
        if obj.exists():
            continue
        obj.parent.mkdir(parents=True, exist_ok=True)
        private = src != out and (src / rel).exists()
        tmp = obj.with_name(f".{obj.name}.{os.getpid()}.tmp")
        try:
            if private:
                os.link(src / rel, tmp)
            else:
                shutil.copyfile(out / rel, tmp)
            os.replace(tmp, obj)
        finally:
            tmp.unlink(missing_ok=True)


STAT = "_dsc/stat"


def write_stat(root: Path, n: int, stat) -> None:
    """The stat cache of version ``n``: per row, its input files' mtime, ctime and inode (image, then mask),
    int64. Advisory: ``--update`` skips re-reading an input whose stat is unchanged; without the cache (or
    with a damaged one) it reads every input and compares contents. Not part of the dataset's bytes."""
    import numpy as np

    d = root / STAT
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / f".{n}.tmp"
    np.ascontiguousarray(stat, "<i8").tofile(tmp)
    os.replace(tmp, d / f"{n}.bin")


def read_stat(root: Root, n: int, rows: int):
    """Version ``n``'s stat cache, or None when absent or not of ``rows`` rows."""
    import numpy as np

    try:
        data = root.read(f"{STAT}/{n}.bin", rows * 48)
    except CorruptDatasetError:
        return None
    if len(data) != rows * 48:
        return None
    return np.frombuffer(bytes(data), "<i8").reshape(rows, 6)


def record_json(n: int, parent: int | None, operation: str, summary: dict, next_slot: int, m: Manifest) -> dict:
    return {"version": n, "parent": parent, "created": now(),
            "operation": operation, "summary": summary, "next_slot": next_slot,
            "manifest": {**m.to_dict(), "checksum": m.checksum()}}


def commit(root: Path, record: dict) -> None:
    """Create ``log/<N>.json`` if no one did: write a private file, flush it, link it in (link fails on an
    existing name: put-if-absent, the same rule Delta's log relies on)."""
    n = record["version"]
    log = root / LOG
    log.mkdir(parents=True, exist_ok=True)
    tmp = log / f".{n}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1, ensure_ascii=False, allow_nan=False)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    try:
        os.link(tmp, log / f"{n}.json")
    except FileExistsError:
        raise VersionConflictError(f"{root}: another update committed version {n} first; nothing of this update "
                                   f"was published. Run it again to apply it on top of version {n}") from None
    finally:
        tmp.unlink(missing_ok=True)
    fd = os.open(log, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def refresh_view(root: Path, m: Manifest, old: Manifest | None = None) -> None:
    """Make the top-level plain-Zarr view show manifest ``m``: each small file replaced by a copy of its
    object (atomically, file by file; a copy, so that writing into the view never changes a version),
    the files of the previous view (``old``) that ``m`` lacks removed, the root zarr.json last. Shard files
    are not the view's: they stay until ``dsc vacuum``."""
    from ..errors import UnsafePathError

    for rel, f in m.files.items():
        dst = root / rel
        obj = root / object_path(f["sha256"])
        if old is not None and old.files.get(rel) == f and dst.is_file() and not dst.is_symlink():
            continue  # the view already has these bytes (as recorded: a damaged view is repaired with old=None)
        parts = rel.split("/")
        for k in range(1, len(parts)):
            if (root.joinpath(*parts[:k])).is_symlink():
                raise UnsafePathError(f"{root.joinpath(*parts[:k])} is a symbolic link; dsc does not write through "
                                      f"links inside a dataset. Replace it with the directory it should be")
        if not obj.is_file():
            _recover_object(root, rel, f, obj)
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = dst.with_name(f".{dst.name}.view")
        tmp.unlink(missing_ok=True)
        shutil.copyfile(obj, tmp)
        os.replace(tmp, dst)
    if old is not None:  # the previous view's files that this version does not have
        for rel in set(old.files) - set(m.files):
            (root / rel).unlink(missing_ok=True)
    write_group(root, "", {"dsc": {**m.to_dict(), "checksum": m.checksum()}})


def show(root: Path, m: Manifest) -> None:
    """Make the view show ``m`` unless it does already (after a crash between a commit and its refresh, or a
    restore)."""
    from ..errors import DscError
    from .layout import read_manifest

    try:
        old = read_manifest(root)
    except DscError:
        old = None
    if old is None or old.checksum() != m.checksum():
        refresh_view(root, m, old)


def _recover_object(root: Path, rel: str, f: dict, obj: Path) -> None:
    """A version's object is missing: take it back from the view when the view has its exact bytes."""
    import hashlib

    from ..errors import CorruptDatasetError

    view = root / rel
    try:
        data = view.read_bytes() if view.is_file() and not view.is_symlink() else None
    except OSError:
        data = None
    if data is None or len(data) != f["nbytes"] or hashlib.sha256(data).hexdigest() != f["sha256"]:
        raise CorruptDatasetError(f"{obj} (the content of {rel} in the latest version) is missing and no copy has its "
                                  f"bytes; the version is damaged: `dsc restore` an intact version (dsc verify "
                                  f"--version N checks one), or recompile")
    obj.parent.mkdir(parents=True, exist_ok=True)
    tmp = obj.with_name(f".{obj.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, obj)


def write_tag(root: Path, name: str, n: int) -> None:
    check_tag(name)
    tags = root / TAGS
    tags.mkdir(parents=True, exist_ok=True)
    tmp = tags / f".{name}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps({"version": n, "created": now()}) + "\n", encoding="utf-8")
    os.replace(tmp, tags / f"{name}.json")


__all__ = ["DSC_DIR", "LOG", "OBJECTS", "Pin", "commit", "is_versioned", "lock_unpinned", "object_path",
           "open_version", "read_record", "record_json", "refresh_view", "resolve", "store_objects", "tag_names",
           "versions", "write_tag"]
