"""The resume journal: which shards of an interrupted compile are finished, and proof of it.

Inside the staging directory, ``.journal/plan.json`` fingerprints the inputs and options, and
``.journal/units.jsonl`` has one line per finished unit, ``{"s": the unit, "files": the fingerprint of its
input files (inputs_of), "result": the unit's result}`` (sample metadata, boxes, the shard's size and
SHA-256), appended after the shard file itself is complete (one append to one open file: a file per unit,
written and later deleted, cost ~3 ms a unit, the largest fixed cost of a compile of many small shards; a
torn last line fails to parse and its unit is compiled again). ``unit-<s>.json`` files, one per unit, as
dsc wrote them before, are read too. (The two are kept apart: the result has an ``inputs`` array of its
own, the per-sample fingerprints, which once overwrote the unit's and made every resume start over.)
``--resume`` keeps a unit only if its journal entry exists, the plan matches, its input files are as they
were, and the shard file re-hashes to the recorded SHA-256; every other unit is compiled again, so a
resumed compile is byte-identical to an uninterrupted one, and decodes only the units it had not finished.
The journal is deleted before the dataset is published. It is JSON: no pickle.
"""
from __future__ import annotations

import enum
import hashlib
import json
import os
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from ..errors import DscError, ResumeError, WriteError
from ..store import open_store
from ..formats.verify import sha256_file
from ..formats.zarr_v3 import node_dir, read_json, write_json
from .options import CompileOptions
from .sources.base import ScannedSource, Source, record_digest
from .sources.inputs import identity, quoted_inode
from .units import UnitResult
from .upload import is_ours

JOURNAL = ".journal"
UNITS = "units.jsonl"


def settings(scanned: ScannedSource, options: CompileOptions, shard_size: int, source: Source | None = None) -> dict:
    """What decides the shards' bytes besides the records: the options (not workers, progress, overwrite or
    on_error, which never change a finished shard), the shard size, the task and the source's parameters.
    As JSON values: ``plan.json`` keeps them, so a refused resume names the setting that differs."""
    opts = options.recorded(masks=scanned.masks is not None)
    return json.loads(json.dumps({
        **opts, "shard_size": shard_size, "task": scanned.task, "kind": scanned.kind,
        "source": source.config() if source is not None else None,
        "masks": None if scanned.masks is None else [list(scanned.masks.classes), scanned.masks.wide]},
        sort_keys=True, default=str))


def fingerprint(records, settings: dict, digests=None) -> str:
    """Hash of everything that decides the shards' bytes: the records (keys, paths, labels, targets, masks)
    and the ``settings`` (see :func:`settings`). ``digests``: each record's ``record_digest``, when the caller
    has them (``record_digests``: a compile takes them once, for this and for the dataset's fingerprint column)."""
    h = hashlib.sha256()
    h.update(json.dumps(settings, sort_keys=True).encode())
    for i, r in enumerate(records):
        hash_record(h, r, None if digests is None else int(digests[i]))
    return h.hexdigest()


def hash_record(h, r, digest: int | None = None) -> None:
    """Feed what record ``r`` is compiled from into the hash ``h`` (a journal's and an update's fingerprint);
    ``digest``: its ``record_digest`` when known."""
    h.update(f"{r.key}\0{r.path}\0{r.label}\0{r.row}\0{r.mask}\0".encode("utf-8", "surrogateescape"))
    if r.target is not None or r.fields:  # (value fields known at scan: a table's columns, COCO captions)
        h.update((record_digest(r) if digest is None else digest).to_bytes(8, "little", signed=True))


def inputs_of(records, quoted: bool = False) -> str:
    """Fingerprint of a unit's input files as they are now: each file's size, modification and change times
    (ns) and inode (an image and its mask; a table's file once). The change time cannot be set back (an
    edit that restores the mtime with ``touch -d`` still shows). Records without files add nothing. ``quoted``:
    an object's inode as a dsc that kept ETags in their quotes took it (``quoted_inode``: its journal's units are
    kept on a resume)."""
    h = hashlib.sha256()
    seen: set = set()
    for r in records:
        for path in (r.path, r.mask):
            if not path or path in seen:
                continue
            seen.add(path)
            found = identity(path)  # (an object in a bucket: its size, time and ETag)
            if found is not None:
                size, mtime, ctime, ino = found
                if quoted:
                    ino = quoted_inode(path) or ino
                h.update(f"{path}\0{size}\0{mtime}\0{ctime}\0{ino}\0".encode("utf-8", "surrogateescape"))
            else:  # missing, or a NUL in the name
                h.update(f"{path}\0missing\0".encode("utf-8", "surrogateescape"))
    return h.hexdigest()


def _files(d: dict | None, inputs, s: int) -> str:
    """Unit ``s``'s input fingerprint now as its journal entry ``d`` spelled it: ``inputs[s]``, else (an entry
    written by a dsc that kept ETags quoted) the quoted one when that is what ``d`` holds."""
    files = inputs[s]
    if d is not None and d.get("files") != files and hasattr(inputs, "quoted"):
        quoted = inputs.quoted(s)
        if d.get("files") == quoted:
            return quoted
    return files


def _flat(d: dict, prefix: str = "") -> dict:
    """{"source": {"image_column": "a"}} -> {"source.image_column": "a"}: a differing setting by its name."""
    out = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def shard_intact(path: Path, shard) -> bool:
    """Whether the file at ``path`` has the size and SHA-256 journaled for ``shard`` (re-hashed)."""
    return path.is_file() and path.stat().st_size == shard.nbytes and sha256_file(path) == shard.sha256


class Found(enum.Enum):
    """What a ``shard_check`` found of a journaled shard."""

    GONE = "gone"  # not as recorded (missing, other bytes, another writer's): its unit is compiled again
    STAGED = "staged"  # re-hashed under its root (the staging, an update's OUT): a compaction need not hash it again
    IN_BUCKET = "in bucket"  # in the bucket with its size and SHA-256, uploaded by this writer


def shard_check(root: Path, bucket: tuple[str, str] | None = None, staged_too: bool = False):
    """What a journaled shard is now (a ``Journal``'s ``shard_ok``, a compile's and an update's: a :class:`Found`):
    under ``root`` (the staging, an update's OUT) re-hashed; with ``bucket`` (url, writer: its units upload their
    shards) in the bucket with its size and SHA-256, uploaded by that writer; ``staged_too``: either (a shard
    leaves the staging once the bucket has it), the staging first."""
    def staged(sh) -> Found:
        return Found.STAGED if shard_intact(node_dir(root, sh.path), sh) else Found.GONE

    if bucket is None:
        return staged
    url, writer = bucket
    store = open_store(url)

    def in_bucket(sh) -> Found:
        return Found.IN_BUCKET if is_ours(sh.path, store.stat(sh.path), sh.sha256, sh.nbytes, writer) else Found.GONE

    def either(sh) -> Found:
        found = staged(sh)
        return found if found is Found.STAGED else in_bucket(sh)
    return either if staged_too else in_bucket


class Journal:
    def __init__(self, staging_dir: Path, fingerprint: str, fields: tuple, shard_root: Path | None = None,
                 settings: dict | None = None, shard_ok=None):
        self.dir = staging_dir / JOURNAL
        self.root = staging_dir
        self.shard_root = shard_root or staging_dir  # where the units' shard files are (an update: OUT)
        self.fingerprint = fingerprint
        self.settings = settings  # (``settings``: kept in the plan to name what differs on a refused resume)
        self.fields = fields
        self._fd: int | None = None  # units.jsonl, open for appending once the first unit is recorded
        # whether a journaled shard is still as recorded (``shard_check``): re-hashed in the staging (or OUT) by
        # default
        self.shard_ok = shard_ok or shard_check(self.shard_root)

    def start(self) -> None:
        try:
            # the settings as ASCII JSON text: exact, also for a path that is not UTF-8 (escaped, not refused)
            write_json(self.dir / "plan.json", {"fingerprint": self.fingerprint, "settings": json.dumps(
                self.settings, sort_keys=True) if self.settings is not None else None}, self.shard_root)
        except OSError as e:
            raise WriteError.writing(self.dir / "plan.json", e) from None

    def has_plan(self) -> bool:
        """The staging directory says what it is: a partial compile, with its plan. Anything else in it (an
        old dataset an interrupted --overwrite left there, stray files) is not resumed."""
        return (self.dir / "plan.json").is_file()

    def check_plan(self) -> None:
        """Refuse to resume a partial compile of other inputs or options."""
        try:
            plan = read_json(self.dir / "plan.json")
        except FileNotFoundError:
            return  # interrupted before any unit finished: nothing to keep
        if plan.get("fingerprint") == self.fingerprint:
            return
        try:
            then = json.loads(plan["settings"])
        except (KeyError, TypeError, ValueError):
            then = None
        if not isinstance(then, dict) or self.settings is None:  # (a plan that does not say: another dsc's)
            raise ResumeError(f"cannot resume: the partial compile in {self.root} was made from other inputs or "
                              f"options; rerun without --resume to start over (the finished shards are discarded)")
        if then != self.settings:
            a, b = _flat(then), _flat(self.settings)
            diff = [f"{k}={a.get(k)!r} then, {b.get(k)!r} now" for k in sorted({*a, *b}) if a.get(k) != b.get(k)]
            raise ResumeError(f"cannot resume: the partial compile in {self.root} was made with other options "
                              f"({'; '.join(diff[:3])}{'; ...' if len(diff) > 3 else ''}); rerun with the options it "
                              f"was started with to continue it, or without --resume to start over (the finished "
                              f"shards are discarded)")
        raise ResumeError(f"cannot resume: the source's inputs changed since the partial compile in {self.root} "
                          f"began (files added, removed or renamed, or labels and annotations edited), so its shards "
                          f"no longer line up with them; rerun without --resume to start over (the finished shards "
                          f"are discarded)")

    def record(self, result: UnitResult, inputs: str) -> None:
        """Journal a finished unit with the fingerprint of its input files (``inputs_of``)."""
        # No fsync: after a power loss a torn entry fails to parse, and an entry whose shard was not yet on
        # disk fails the SHA-256 check; either way the unit is compiled again.
        # Keys in a fixed order (the result's as ``to_json`` builds it), by one encoder made once: sorting every
        # dict and making an encoder a line (json.dumps) was a visible share of a small shard's cost. Readers
        # parse a line (``_lines``, ``_entry_at``), never rely on its key order: an older dsc's sorted lines resume.
        line = (f'{{"s":{int(result.s)},"files":{_ENCODE(inputs)},"result":{_ENCODE(result.to_json())}}}\n').encode()
        try:
            if self._fd is None:
                self._fd = os.open(self.dir / UNITS, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
                                   | os.O_CLOEXEC, 0o644)
            view = memoryview(line)
            while view:
                view = view[os.write(self._fd, view):]
        except OSError as e:
            raise WriteError.writing(self.dir / UNITS, e) from None

    @staticmethod
    def units_in(staging_dir) -> set[int]:
        """The units a staging directory's journal holds finished (whole lines; tests and tools count them)."""
        j = Journal(Path(staging_dir), "", ())
        return set(j._entries()) if j.dir.is_dir() else set()

    def _entries(self) -> dict[int, dict]:
        """{unit: its last journal entry}: units.jsonl's lines (a torn or damaged line is left out) and the
        ``unit-<s>.json`` files of an older dsc."""
        out = self._legacy()
        for _, d in _lines(self.dir / UNITS):
            out[d["s"]] = d
        return out

    def finished_units(self, inputs) -> "Resumed":
        """Units whose journal entry exists, whose input files are as they were (``inputs_of``), and whose
        shards still hash to what was recorded; ``inputs`` (``compile.UnitInputs``, a compile's and an update's):
        ``inputs[s]`` is unit s's input fingerprint now, ``inputs.slots`` the units' slots. Here each journal line is
        parsed once, to check it, then dropped: what is kept is where each finished unit's entry is (16 bytes a
        unit). The kept units' entries are parsed a second time when the :class:`Resumed` is iterated, one at a
        time as the caller folds them (no object kept a unit). The lines are read last first, so only a unit's last entry is checked (its shards re-hashed): an
        earlier entry of a unit compiled again is parsed for its slot and passed over."""
        if not (self.dir / "plan.json").exists():
            return Resumed.none(self.fields)
        slots = inputs.slots
        if not len(slots):
            return Resumed.none(self.fields)
        lo, hi = slots[0], slots[-1]  # (one run of slots)
        last = np.full(hi - lo + 1, -1, np.int64)  # byte offset in units.jsonl of each unit's last whole entry
        done = np.zeros(len(last), bool)
        staged = np.zeros(len(last), bool)  # (its shards re-hashed in the staging: ``Found.STAGED``)
        legacy = {s: d for s, d in self._legacy().items() if lo <= s <= hi}  # (an older dsc's unit-<s>.json)
        path = self.dir / UNITS
        for off, d in _lines(path, backward=True):  # (each line parsed once here; a unit's first one met is its
            s = d["s"]                                # last entry, the only one checked)
            if lo <= s <= hi and last[s - lo] < 0:
                last[s - lo] = off
                legacy.pop(s, None)
                done[s - lo], staged[s - lo] = self._checked(d, s, _files(d, inputs, s))
        for s, d in list(legacy.items()):
            done[s - lo], staged[s - lo] = self._checked(d, s, _files(d, inputs, s))
            if not done[s - lo]:
                del legacy[s]
        return Resumed(path, lo, np.flatnonzero(done) + lo, last[done], legacy, self.fields, staged[done])

    def _checked(self, d: dict | None, s: int, files: str) -> tuple[bool, bool]:
        """Whether unit ``s``'s journal entry ``d`` is kept (its inputs are ``files`` still and its shards are as it
        recorded), and whether every shard of it was re-hashed in the staging (``Found.STAGED``)."""
        if d is None:
            return False, False
        try:
            if d.get("files") != files:  # an input was edited, replaced or removed since
                return False, False
            res = UnitResult.from_json(d["result"], self.fields)
            if res.s != s:
                return False, False
        except (DscError, KeyError, TypeError, ValueError, AttributeError):
            return False, False
        staged = True
        for p in res.parts.values():
            if getattr(p, "shard", None) is not None:
                found = self.shard_ok(p.shard)
                if found not in (Found.STAGED, Found.IN_BUCKET):  # (GONE, or anything else: not kept)
                    return False, False
                staged = staged and found is Found.STAGED
        return True, staged

    def _legacy(self) -> dict[int, dict]:
        out: dict[int, dict] = {}
        for p in self.dir.glob("unit-*.json"):
            try:
                out[int(p.name[5:-5])] = read_json(p)
            except (DscError, ValueError):
                continue
        return out

    def has_units(self) -> bool:
        return self.dir.is_dir() and any(p.name.startswith("unit-") or (p.name == UNITS and p.stat().st_size > 0)
                                         for p in self.dir.iterdir())

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def remove(self) -> None:
        self.close()
        if self.dir.exists():
            for p in self.dir.iterdir():
                p.unlink()
            os.rmdir(self.dir)


_ENCODE = json.JSONEncoder(separators=(",", ":")).encode  # a journal line's JSON (Journal.record)


def _lines(path: Path, backward: bool = False):
    """(byte offset, entry) of each whole, parsable line of ``units.jsonl`` (none when it is missing), read
    a line at a time; ``backward``: the last line first (read a block at a time from the end)."""
    with _open_or_none(path) as f:
        if f is None:
            return
        for at, line in (_backward(f) if backward else _forward(f)):
            try:
                d = json.loads(line)
            except ValueError:
                continue
            if isinstance(d, dict) and isinstance(d.get("s"), int):
                yield at, d


def _forward(f):
    """(byte offset, line) of each line of the open file ``f``, first to last."""
    off = 0
    for line in f:
        at, off = off, off + len(line)
        yield at, line


def _backward(f, block: int = 1 << 20):
    """(byte offset, line) of each line of the open file ``f``, last to first: the lines ``_forward`` gives (their
    newline left off), in reverse. Each block is split once: a line longer than a block is kept as its pieces and
    joined once its start is found (re-splitting it with every block made a 64 MB line take seconds)."""
    pos = f.seek(0, os.SEEK_END)
    tail: list[bytes] = []  # the start of the file's text at ``pos`` up to its first newline, in pieces read
    # last to first: a line not yet whole
    while pos > 0:
        step = min(block, pos)
        pos -= step
        f.seek(pos)
        chunk = f.read(step)
        cut = chunk.find(b"\n")
        if cut < 0:  # no newline in this block: all of it belongs to the line not yet whole
            tail.append(chunk)
            continue
        pieces = chunk[cut + 1:].split(b"\n")
        pieces[-1] += b"".join(reversed(tail))
        tail = [chunk[:cut]]
        at = pos + cut + 1  # where pieces[0] starts
        starts = []
        for p in pieces:
            starts.append(at)
            at += len(p) + 1
        for p, start in zip(reversed(pieces), reversed(starts)):
            if p:  # (the empty piece after the last newline is no line; an empty line would not parse)
                yield start, p
    head = b"".join(reversed(tail))
    if head:
        yield 0, head


@contextmanager
def _open_or_none(path: Path):
    try:
        f = open(path, "rb")
    except OSError:
        yield None
        return
    with f:
        yield f


def _entry_at(f, off: int, legacy: dict | None) -> dict | None:
    """The entry whose line starts at byte ``off`` of the open ``units.jsonl`` (``legacy``, an older dsc's
    file, when there is none)."""
    if off < 0 or f is None:
        return legacy
    f.seek(off)
    try:
        return json.loads(f.readline())
    except ValueError:
        return None


class Resumed:
    """The units a resumed compile or update keeps (``Journal.finished_units``): their slots, in order, and where
    each one's journal entry is; iterating parses each entry into its ``UnitResult`` as it is taken (the caller
    folds it into its flat arrays: no object is kept a unit)."""

    def __init__(self, path: Path | None, lo: int, slots: np.ndarray, offsets: np.ndarray, legacy: dict, fields,
                 staged: np.ndarray | None = None):
        self._path, self._lo, self.slots, self._offsets, self._legacy, self._fields = (path, lo, slots, offsets,
                                                                                        legacy, fields)
        # each kept unit's shards were re-hashed in the staging by this resume (``Found.STAGED``: none need it again)
        self._staged = staged if staged is not None else np.zeros(len(slots), bool)

    @classmethod
    def none(cls, fields=()) -> "Resumed":
        return cls(None, 0, np.zeros(0, np.int64), np.zeros(0, np.int64), {}, fields)

    def __len__(self) -> int:
        return len(self.slots)

    def __bool__(self) -> bool:
        return len(self.slots) > 0

    def _at(self, s) -> int | None:
        """Where unit ``s`` is among the kept units (None: not kept)."""
        k = int(np.searchsorted(self.slots, s))
        return k if k < len(self.slots) and int(self.slots[k]) == s else None

    def __contains__(self, s) -> bool:
        return self._at(s) is not None

    def intact_in_staging(self, s, staged_here: bool) -> bool:
        """Whether unit ``s``'s staged shards are known intact in this run, with no hash: this resume re-hashed them
        there, or it compiled the unit (not kept) and, with ``staged_here``, this process wrote them."""
        k = self._at(s)
        return bool(self._staged[k]) if k is not None else staged_here

    def __iter__(self):
        if not len(self.slots):
            return
        with _open_or_none(self._path) as f:
            for s, off in zip(self.slots.tolist(), self._offsets.tolist()):
                d = _entry_at(f, off, self._legacy.get(s))
                if d is None:  # (the journal changed under the resume: only its own writer appends to it)
                    raise ResumeError(f"cannot resume: the journal of {self._path.parent.parent} changed while it "
                                      f"was read; rerun with --resume")
                yield UnitResult.from_json(d["result"], self._fields)
