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
import stat
import time
from pathlib import Path

from ..errors import ConfigError, CorruptDatasetError, VersionConflictError, VersionNotFoundError
from ..store.local import _NOFOLLOW, NewFile, Root, not_ours, open_folder, write_atomic
from .manifest import Manifest
from .zarr_v3 import MAX_JSON_BYTES, parse_json

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


def read_tags(root: Root) -> tuple[dict[str, int], dict[str, str]]:
    """({tag: version}, {tag: what is wrong with its file}): a damaged tag file breaks only its own tag."""
    try:
        fd = root.open_dir(TAGS)
    except FileNotFoundError:
        return {}, {}
    try:
        names = sorted(os.listdir(fd))
    finally:
        os.close(fd)
    good, bad = {}, {}
    for name in names:
        if name.endswith(".json") and _TAG.match(name[:-5]):
            try:
                good[name[:-5]] = parse_tag(root.read(f"{TAGS}/{name}", 1 << 16), root / f"{TAGS}/{name}")
            except CorruptDatasetError as e:
                bad[name[:-5]] = f"{e}; fix it, or remove the tag with `dsc tag {root.path} {name[:-5]} --delete`"
    return good, bad


def parse_tag(data: bytes, where) -> int:
    """The version a tag file names (``{"version": N, "created": ...}``)."""
    d = parse_json(data, where)
    n = d.get("version") if isinstance(d, dict) else None
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise CorruptDatasetError(f"{where}: not a dsc tag (a tag file holds {{\"version\": N, \"created\": ...}}"
                                  + (f"; its version is {n!r}" if isinstance(d, dict) and "version" in d else "") + ")")
    return n


def tag_names(root: Root) -> dict[str, int]:
    """{tag: version} of the tags whose files are readable (``read_tags`` also says which are not)."""
    return read_tags(root)[0]


def check_tag(name: str) -> str:
    from ..errors import ConfigError

    if not isinstance(name, str) or not _TAG.match(name):
        raise ConfigError(f"a tag is a plain name (letters, digits, '_', '.', '-'; at most 100), got {name!r}")
    return name


def resolve(root: Root, version: int | None = None, tag: str | None = None) -> int:
    """The version to open: ``version``, the version ``tag`` names, or the latest."""
    def tags():
        good, bad = read_tags(root)
        if tag in bad:
            raise CorruptDatasetError(bad[tag])
        return good
    return choose(root.path, version, tag, tags, lambda: versions(root),
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


_PIN_FIX = "Remove it (dsc makes its pin files again as readers open versions)"


def open_pin(path: Path, n: int) -> int:
    """Version ``n``'s pin file, made if missing; never through a link, and only a plain file (a folder or a
    link there is refused, naming it)."""
    path = Path(path)
    dfd = open_folder(path / PINS, path)
    try:
        fd = os.open(str(n), os.O_CREAT | os.O_RDWR | _NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o666, dir_fd=dfd)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
            raise not_ours(path / PINS / str(n), f"version {n}'s pin file", _PIN_FIX) from None
        raise
    finally:
        os.close(dfd)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise not_ours(path / PINS / str(n), f"version {n}'s pin file", _PIN_FIX)
    return fd


def lock_unpinned(path: Path, n: int) -> int | None:
    """An exclusive lock on version N's pin, held by the returned descriptor (close it when N is removed),
    or None when an open reader holds N. While held, a reader that opens N waits, then finds it gone."""
    fd = open_pin(path, n)
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
        private = src != out and (src / rel).exists()
        if private:  # the staged file itself: no copy
            NewFile(obj, out, link=src / rel).commit()
        else:
            with Root(out).open(rel) as data:
                write_atomic(obj, data, out)


STAT = "_dsc/stat"


def write_stat(root: Path, n: int, stat) -> None:
    """The stat cache of version ``n``: per row, its input files' mtime, ctime and inode (image, then mask),
    int64. Advisory: ``--update`` skips re-reading an input whose stat is unchanged; without the cache (or
    with a damaged one) it reads every input and compares contents. Not part of the dataset's bytes."""
    import numpy as np

    write_atomic(root / STAT / f"{n}.bin", memoryview(np.ascontiguousarray(stat, "<i8")).cast("B"), root)


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
    data = (json.dumps(record, indent=1, ensure_ascii=False, allow_nan=False) + "\n").encode("utf-8")
    try:
        write_atomic(root / LOG / f"{n}.json", data, root, sync=True, create_only=True)
    except FileExistsError:
        raise VersionConflictError(f"{root}: another update committed version {n} first; nothing of this update "
                                   f"was published. Run it again to apply it on top of version {n}") from None


def write_tag(root: Path, name: str, n: int) -> None:
    check_tag(name)
    write_atomic(root / TAGS / f"{name}.json", (json.dumps({"version": n, "created": now()}) + "\n").encode(), root)


__all__ = ["DSC_DIR", "LOG", "OBJECTS", "Pin", "commit", "is_versioned", "lock_unpinned", "object_path",
           "open_version", "read_record", "read_tags", "record_json", "resolve", "store_objects", "tag_names",
           "versions", "write_tag"]
