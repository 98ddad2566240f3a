"""The shard table: every shard's entry (sample count, byte size, SHA-256), by slot and field, in a fixed-width
binary object read lazily, instead of a JSON list in the manifest (docs/FORMAT.md, "The shard table").

A manifest of format 4 names its table by hash (``shard_table``: slots, shards, columns, chain); the table's
bytes are content-addressed objects (``_dsc/objects/<ab>/<sha256>``), so the manifest and the version record
stay the same size whatever the number of shards, and opening a version reads none of the table: a reader
maps it (locally) or fetches it (object storage) when it first needs a shard's entry, and checks each entry
as it reads it. A shard's path is not stored: it is its field's and slot's (``image/c/<s>/0/0/0``...).

An ``--update`` writes a delta (the slots whose entries changed or were added, plus its parent's table by
hash), so versions that share shards share their table; the chain is at most ``MAX_CHAIN`` tables long (the
full one first), and a writer starts a new full table when the chain would grow longer or the delta would
hold more than half of the slots.
"""
from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import CorruptDatasetError, DscError
from ..store import open_store
from ..store.local import Root, map_fd, write_atomic
from .names import object_path
from .specs import _SHA256, ShardSpec, _positive_int, check_spec_keys
from .zarr_v3 import fixed_shard_nbytes, ragged_shard_meta

MAGIC = b"DSCSHTAB"
TABLE_VERSION = 1
HEADER = 64  # magic (8), table version uint32, columns uint32, slots uint64, entries uint64, base sha256 (32)
ENTRY = 48  # count uint64, nbytes uint64, sha256 (32 raw bytes); all zero: no shard at that slot
MAX_CHAIN = 8  # tables a version's chain may hold (one full, then deltas)
REF_KEYS = {"slots", "shards", "nbytes", "columns", "chain"}
_ZERO = bytes(32)


@dataclass(frozen=True)
class Geometry:
    """What the table needs to know of one column's field: where its shard of slot s is, and (fixed layout)
    the size a shard of ``count`` samples has."""

    node: str
    fixed: bool
    ndim: int  # sample axes (image: 3, mask: 2)
    sample_nbytes: int = 0  # fixed layout
    dtype: str = "uint8"

    def path(self, s: int) -> str:
        return f"{self.node}/c/{s}" + "/0" * self.ndim if self.fixed else f"{self.node}/values/{s}/c/0"

    def meta(self, s: int, nbytes: int) -> tuple[str, bytes] | None:
        """(path, bytes) of the ``zarr.json`` beside slot ``s``'s shard of ``nbytes`` bytes: a ragged shard is a
        plain Zarr array of its own, whose metadata its size implies (None for the fixed layout)."""
        return None if self.fixed else (f"{self.node}/values/{s}/zarr.json", ragged_shard_meta(nbytes, self.dtype))

    def nbytes(self, count: int, K: int) -> int | None:
        return fixed_shard_nbytes(count, K, self.sample_nbytes) if self.fixed else None


# ----------------------------------------------------------------------------- encoding
def encode(entries: np.ndarray, slots: int, index: np.ndarray | None = None, base: str | None = None) -> bytes:
    """A table object: ``entries`` (E, C*ENTRY) uint8 rows; ``index`` the E slots they are (a delta of ``base``,
    strictly increasing) or None (a full table: row k is slot k, E == slots)."""
    E = len(entries)
    C = entries.shape[1] // ENTRY if E else 0
    head = (MAGIC + TABLE_VERSION.to_bytes(4, "little") + C.to_bytes(4, "little") + int(slots).to_bytes(8, "little")
            + E.to_bytes(8, "little") + (bytes.fromhex(base) if base else _ZERO))
    body = b"" if index is None else np.ascontiguousarray(index, "<u8").tobytes()
    return head + body + np.ascontiguousarray(entries, np.uint8).tobytes()


def entry_rows(columns: list[tuple[ShardSpec | None, ...]], S: int) -> np.ndarray:
    """(S, C*ENTRY) uint8: the entries of every slot of each column (a column's sequence of ShardSpec / None)."""
    out = np.zeros((S, len(columns), ENTRY), np.uint8)
    head = out[:, :, :16].view("<u8")  # (S, C, 2): count, nbytes
    for c, col in enumerate(columns):
        entries = col.entries() if hasattr(col, "entries") else None  # (a compile's column: its entries at once)
        if entries is not None:
            out[:len(entries), c] = entries
            continue
        for s, spec in enumerate(col):
            if spec is not None:
                head[s, c, 0], head[s, c, 1] = spec.count, spec.nbytes
                out[s, c, 16:] = np.frombuffer(bytes.fromhex(spec.sha256), np.uint8)
    return out.reshape(S, -1)


class _Part:
    """One table object of a chain, parsed from its bytes (a mapping, or bytes fetched)."""

    def __init__(self, data, sha: str, C: int, where: str):
        buf = np.frombuffer(data, np.uint8) if not isinstance(data, np.ndarray) else data
        if len(buf) < HEADER or bytes(buf[:8]) != MAGIC:
            raise CorruptDatasetError(f"{where}: not a dsc shard table")
        head = bytes(buf[8:HEADER])
        version, cols = int.from_bytes(head[0:4], "little"), int.from_bytes(head[4:8], "little")
        self.slots, E = int.from_bytes(head[8:16], "little"), int.from_bytes(head[16:24], "little")
        self.base = head[24:56].hex() if head[24:56] != _ZERO else None
        if version != TABLE_VERSION:
            raise CorruptDatasetError(f"{where}: shard table version {version}; this dsc reads {TABLE_VERSION} "
                                      f"(upgrade dsc: pip install -U dsc)")
        full = self.base is None
        want = HEADER + (0 if full else 8 * E) + E * C * ENTRY
        if (E and cols != C) or len(buf) != want or (full and E != self.slots) or E > self.slots:
            raise CorruptDatasetError(f"{where}: a shard table of {len(buf)} bytes does not hold {E} entries of "
                                      f"{C} columns for {self.slots} slots; the dataset is damaged")
        at = HEADER
        self.index = None
        if not full:
            self.index = buf[at:at + 8 * E].view("<u8")
            at += 8 * E
            if E and (np.any(np.diff(self.index.astype(np.int64)) <= 0) or int(self.index[-1]) >= self.slots):
                raise CorruptDatasetError(f"{where}: its slot index is not increasing within {self.slots} slots")
        self.rows = buf[at:].reshape(E, C * ENTRY) if C else np.zeros((E, 0), np.uint8)
        self.sha = sha

    def find(self, s: int) -> np.ndarray | None:
        """Slot ``s``'s row here, or None (a delta that does not change it)."""
        if self.index is None:
            return self.rows[s] if s < len(self.rows) else None
        k = int(np.searchsorted(self.index, s))
        return self.rows[k] if k < len(self.index) and int(self.index[k]) == s else None


class ShardTable:
    """The shard table a manifest references: its columns (the image, then each sharded field by name), read
    through ``load(sha256, nbytes) -> buffer`` (``bind``) the first time an entry is needed."""

    def __init__(self, ref: dict, geometry: dict[str, Geometry], K: int, rows: int, data: np.ndarray | None = None):
        self.ref, self.geometry, self.K, self.num_rows = ref, geometry, K, rows
        self.columns: list[str] = list(ref["columns"])
        self.slots: int = ref["slots"]
        self._load = None
        self._parts: list[_Part] | None = None
        self._full = data  # (S, C*ENTRY): every slot's row, resolved (a writer's table, or ``rows()`` once read)
        self._lock = threading.Lock()
        self._memo: dict[tuple[int, int], ShardSpec | None] = {}

    @staticmethod
    def check_ref(d) -> dict:
        check_spec_keys("shard_table", d, REF_KEYS, REF_KEYS)
        _positive_int("shard_table.slots", d["slots"])
        _positive_int("shard_table.shards", d["shards"])
        _positive_int("shard_table.nbytes", d["nbytes"])
        cols, chain = d["columns"], d["chain"]
        if (not isinstance(cols, list) or not cols or cols[0] != "image" or len(set(cols)) != len(cols)
                or not all(isinstance(c, str) for c in cols)):
            raise CorruptDatasetError("manifest: shard_table.columns must list 'image', then each sharded field once")
        if not isinstance(chain, list) or not 1 <= len(chain) <= MAX_CHAIN:
            raise CorruptDatasetError(f"manifest: shard_table.chain must list 1 to {MAX_CHAIN} tables")
        for t in chain:
            check_spec_keys("shard_table.chain[]", t, {"sha256", "nbytes"}, {"sha256", "nbytes"})
            if not isinstance(t["sha256"], str) or not _SHA256.match(t["sha256"]):
                raise CorruptDatasetError("manifest: a shard table's sha256 must be 64 hex digits")
            _positive_int("shard_table.chain[].nbytes", t["nbytes"])
        return d

    def __getstate__(self):  # (a dataset pickled for a spawned DataLoader worker: the worker reads the table itself)
        state = {k: v for k, v in self.__dict__.items() if k not in ("_lock", "_parts", "_memo")}
        if not isinstance(self._load, StoreLoader):  # (a writer's table in memory: kept as it is)
            state["_load"] = None
        else:
            state["_full"] = None
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._lock, self._parts, self._memo = threading.Lock(), None, {}

    def __eq__(self, other):
        return isinstance(other, ShardTable) and other.ref == self.ref

    def __hash__(self):
        return hash(self.ref["chain"][-1]["sha256"])

    @property
    def objects(self) -> list[dict]:
        """The table's objects ({sha256, nbytes}), the full table first."""
        return list(self.ref["chain"])

    def bind(self, load) -> "ShardTable":
        """Read the table's objects through ``load(sha256, nbytes)`` (when first needed)."""
        self._load = load
        return self

    def _chain(self) -> list[_Part]:
        if self._parts is None:
            with self._lock:
                if self._parts is None:
                    if self._load is None:
                        raise CorruptDatasetError("a shard table was read before the dataset it belongs to was opened")
                    C, parts, prev = len(self.columns), [], None
                    for t in self.ref["chain"]:
                        where = object_path(t["sha256"])
                        part = _Part(self._load(t["sha256"], t["nbytes"]), t["sha256"], C, where)
                        if part.base != prev:
                            raise CorruptDatasetError(f"{where}: its base table is not the one before it in the "
                                                      f"manifest's chain; the dataset is damaged")
                        parts.append(part)
                        prev = t["sha256"]
                    if parts[-1].slots != self.slots:
                        raise CorruptDatasetError(f"{object_path(parts[-1].sha)}: covers {parts[-1].slots} slots, the "
                                                  f"manifest says {self.slots}; the dataset is damaged")
                    self._parts = parts
        return self._parts

    def row(self, s: int) -> np.ndarray | None:
        """Slot ``s``'s entries, (C*ENTRY,) uint8 (None: no shard in any column)."""
        if self._full is not None:
            return self._full[s]
        for part in reversed(self._chain()):
            if s < part.slots:
                r = part.find(s)
                if r is not None:
                    return r
        return None

    def rows(self) -> np.ndarray:
        """(slots, C*ENTRY) uint8: every slot's entries, the chain resolved (what a writer or verify reads)."""
        if self._full is None:
            parts = self._chain()
            full = np.zeros((self.slots, len(self.columns) * ENTRY), np.uint8)
            for part in parts:
                if part.index is None:
                    m = min(part.slots, self.slots)
                    full[:m] = part.rows[:m]
                else:
                    keep = part.index < self.slots
                    full[part.index[keep].astype(np.int64)] = part.rows[keep]
            self._full = full
        return self._full

    def spec(self, c: int, s: int) -> ShardSpec | None:
        """Column ``c``'s shard of slot ``s``, its entry checked against the layout (count, size, the image's)."""
        key = (c, s)
        if key in self._memo:
            return self._memo[key]
        if not 0 <= s < self.slots:
            raise IndexError(s)
        r = self.row(s)
        out = None
        name = self.columns[c]
        count, nbytes = (0, 0) if r is None else (int(r[c * ENTRY:c * ENTRY + 8].view("<u8")[0]),
                                                  int(r[c * ENTRY + 8:c * ENTRY + 16].view("<u8")[0]))
        last = s == self.slots - 1
        image_count = count if (c == 0 or r is None) else int(r[:8].view("<u8")[0])
        if count == 0:
            if nbytes or (r is not None and r[c * ENTRY:(c + 1) * ENTRY].any()) or last or image_count:
                raise CorruptDatasetError(f"manifest: the shard table's {name} entry of slot {s} is "
                                          f"{'missing' if last or image_count else 'malformed'}; the dataset is damaged")
        else:
            g = self.geometry[name]
            want = g.nbytes(count, self.K)
            if count > self.K or (last and count != self.num_rows - s * self.K) or count != image_count or (
                    want is not None and nbytes != want) or nbytes == 0:
                raise CorruptDatasetError(f"manifest: the shard table says {g.path(s)} holds {count} samples in "
                                          f"{nbytes} bytes, which its layout (shards of {self.K}, {self.num_rows} "
                                          f"rows) does not allow; the dataset is damaged")
            out = ShardSpec(path=g.path(s), count=count, nbytes=nbytes,
                            sha256=bytes(r[c * ENTRY + 16:(c + 1) * ENTRY]).hex())
        if len(self._memo) < (1 << 20):
            self._memo[key] = out
        return out

    def column(self, name: str) -> "ShardColumn":
        return ShardColumn(self, self.columns.index(name))


class ShardColumn(Sequence):
    """One field's shards by slot, as a read-only sequence of ShardSpec / None read from the table on demand
    (what ``manifest.shards`` and a mask field's ``shards`` are in format 4)."""

    lazy = True

    def __init__(self, table: ShardTable, c: int):
        self.table, self.c = table, c

    def __len__(self) -> int:
        return self.table.slots

    def __getitem__(self, s):
        if isinstance(s, slice):
            return [self[i] for i in range(*s.indices(len(self)))]
        if s < 0:
            s += len(self)
        return self.table.spec(self.c, s)

    def __iter__(self):
        self.table.rows()  # (one resolved read, then every entry checked)
        return (self.table.spec(self.c, s) for s in range(len(self)))

    def nbytes(self) -> np.ndarray:
        """(slots,) int64: each slot's shard size (0: none), in one read of the table (not checked per entry)."""
        return self._field(8)

    def counts(self) -> np.ndarray:
        """(slots,) int64: each slot's sample count (0: no shard)."""
        return self._field(0)

    def _field(self, at: int) -> np.ndarray:
        rows = self.table.rows()
        start = self.c * ENTRY + at
        return np.ascontiguousarray(rows[:, start:start + 8]).view("<u8").reshape(-1).astype(np.int64)

    def __eq__(self, other):
        return isinstance(other, ShardColumn) and other.table.ref == self.table.ref and other.c == self.c

    def __hash__(self):
        return hash((self.table.ref["chain"][-1]["sha256"], self.c))

    def __repr__(self):
        return f"ShardColumn({self.table.columns[self.c]!r}, {len(self)} slots)"


# ----------------------------------------------------------------------------- writing
def build(columns: dict[str, tuple], present: int, parent: ShardTable | None, write) -> tuple[dict, np.ndarray]:
    """The table reference of a new version whose shards are ``columns`` {name: ShardSpec / None by slot} (the
    image first), writing its object(s) through ``write(sha256, data)``: a delta of ``parent`` when the parent's
    chain has room and the delta holds at most half the slots, else a full table. ``present``: image shards."""
    names = list(columns)
    S = len(columns["image"])
    rows = entry_rows([columns[n] for n in names], S)
    chain: list[dict] = []
    data = None
    if parent is not None and parent.columns == names and len(parent.ref["chain"]) < MAX_CHAIN:
        prev = parent.rows()
        n = min(S, len(prev))
        changed = np.flatnonzero((rows[:n] != prev[:n]).any(axis=1))
        changed = np.concatenate([changed, np.arange(n, S)]).astype(np.int64)
        if len(changed) == 0 and S == parent.slots:
            return dict(parent.ref), rows  # (the same shards: the same table)
        if len(changed) <= S // 2 and S >= parent.slots:
            data = encode(rows[changed], S, changed, parent.ref["chain"][-1]["sha256"])
            chain = list(parent.ref["chain"])
    if data is None:
        data = encode(rows, S)
    sha = hashlib.sha256(data).hexdigest()
    write(sha, data)
    return {"slots": S, "shards": present, "nbytes": total_bytes(rows), "columns": names,
            "chain": [*chain, {"sha256": sha, "nbytes": len(data)}]}, rows


def total_bytes(rows: np.ndarray) -> int:
    """The bytes of every shard of every column of ``rows`` (S, C*ENTRY)."""
    e = rows.reshape(len(rows), -1, ENTRY)
    return int(np.ascontiguousarray(e[:, :, 8:16]).view("<u8").sum())


def write_object(out: Path):
    """A ``write`` for ``build``: the table object under the dataset folder ``out`` (kept when there already)."""
    def write(sha: str, data: bytes) -> None:
        if not object_intact(Root(out), sha):
            write_atomic(Path(out) / object_path(sha), data, Path(out))
    return write


def object_intact(root: Root, sha: str) -> bool:
    """Whether the content object ``sha`` is under ``root`` with bytes that hash to its name (one damaged on
    disk, a link or not a file there is not: the caller writes it again, never through a link)."""
    try:
        return root.exists(object_path(sha)) and root.sha256(object_path(sha)) == sha
    except (OSError, DscError):
        return False


# ----------------------------------------------------------------------------- reading
_FIX = ("Run `dsc verify` to list every problem; restore the file from an intact copy of the dataset (e.g. one "
        "you pushed) or recompile")
_CHECKED: set[tuple] = set()  # local table objects whose SHA-256 this process has checked (by inode, size, times)
_CHECKED_LOCK = threading.Lock()


class StoreLoader:
    """``load(sha256, nbytes)`` of a dataset's table objects: mapped from a folder; from object storage, the
    node's mirror copy (``mirror``) when intact, else one GET checked against its hash and kept in the mirror.
    Pickled as the dataset's address (a spawned worker opens it again)."""

    def __init__(self, store, mirror: Path | None = None):
        self._store, self.mirror = store, mirror
        self.url = str(store.path) if store.local else store.url

    def __getstate__(self):
        return {"url": self.url, "mirror": self.mirror, "_store": None}

    @property
    def store(self):
        if self._store is None:
            self._store = open_store(self.url)
        return self._store

    def __call__(self, sha: str, nbytes: int):
        store, mirror = self.store, self.mirror
        rel = object_path(sha)
        if store.local:  # (through the dataset's folder as it was opened: never another compile swapped in since)
            files = store.root
            fd = files.open_file(rel)
            try:
                st = os.fstat(fd)
                if st.st_size != nbytes:
                    raise CorruptDatasetError(f"{files / rel} has {st.st_size:,} bytes, the manifest records "
                                              f"{nbytes:,} (a shard table); the dataset is damaged. {_FIX}")
                data = map_fd(fd, nbytes, files / rel, populate=False)
            finally:
                os.close(fd)
            key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, sha)
            if key not in _CHECKED:  # (once per object and process: ~48 bytes a slot, read before any entry is used)
                if hashlib.sha256(data).hexdigest() != sha:
                    raise CorruptDatasetError(f"{files / rel} (a shard table) does not have the bytes its name "
                                              f"(SHA-256) says; the dataset is damaged. {_FIX}")
                with _CHECKED_LOCK:
                    _CHECKED.add(key)
            return data
        if mirror is not None:
            try:
                data = (Path(mirror) / rel).read_bytes()
                if len(data) == nbytes and hashlib.sha256(data).hexdigest() == sha:
                    return data
            except OSError:
                pass
        try:
            data = store.get(rel, nbytes)
        except FileNotFoundError:
            raise CorruptDatasetError(f"{store.where(rel)} is missing (the shard table of the version); the "
                                      f"dataset in object storage is damaged. Push an intact copy") from None
        if len(data) != nbytes or hashlib.sha256(data).hexdigest() != sha:
            raise CorruptDatasetError(f"{store.where(rel)} does not have the bytes its name (SHA-256) says; the "
                                      f"dataset in object storage is damaged")
        if mirror is not None:  # (processes sharing the mirror may write it at once: each its own private name)
            write_atomic(Path(mirror) / rel, data, unique=True)
        return data
