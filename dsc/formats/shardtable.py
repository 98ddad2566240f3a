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
from concurrent.futures import ThreadPoolExecutor
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
TABLE_VERSION = 2  # written: paged (each page of entries carries its SHA-256, read by range); 1 is still read
HEADER = 64  # magic (8), table version uint32, columns uint32, slots uint64, entries uint64, base sha256 (32)
HEADER2 = 96  # version 2: HEADER, then entries a page uint32, pages uint32, 24 zero bytes
RANGES = "ranges"  # in a node's mirror of a dataset in object storage: the table ranges fetched (<sha>.<start>-<end>)
PAGE_BYTES = 64 << 10  # what a writer aims a page at: a reader of object storage fetches a page a slot it needs
LOAD_THREADS = 16  # a Loader's epoch plan: the table pages it needs fetched this many at once (load)
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
    """A table object (version 2, docs/FORMAT.md "The shard table"): ``entries`` (E, C*ENTRY) uint8 rows;
    ``index`` the E slots they are (a delta of ``base``, strictly increasing) or None (a full table: row k is slot
    k, E == slots). The rows go in pages of R entries, each followed by its SHA-256, after a head that ends with
    its own: a reader of object storage fetches the head and the pages it needs by range and checks each."""
    E = len(entries)
    C = entries.shape[1] // ENTRY if E else 0
    rows = np.ascontiguousarray(entries, np.uint8).reshape(E, C * ENTRY)
    idx = None if index is None else np.ascontiguousarray(index, "<u8")
    R = _page_entries(C, idx is not None)
    G = -(-E // R)
    head = (MAGIC + TABLE_VERSION.to_bytes(4, "little") + C.to_bytes(4, "little") + int(slots).to_bytes(8, "little")
            + E.to_bytes(8, "little") + (bytes.fromhex(base) if base else _ZERO) + R.to_bytes(4, "little")
            + G.to_bytes(4, "little") + bytes(24) + (b"" if idx is None else idx[::R].tobytes()))
    out = [head, hashlib.sha256(head).digest()]
    for j in range(G):
        a, b = j * R, min(E, j * R + R)
        body = (b"" if idx is None else idx[a:b].tobytes()) + rows[a:b].tobytes()
        out += [body, _page_sha(j, body)]
    return b"".join(out)


def _page_entries(C: int, delta: bool) -> int:
    return max(1, PAGE_BYTES // max(1, C * ENTRY + (8 if delta else 0)))


def _page_sha(j: int, body) -> bytes:
    """A page's check: the SHA-256 of its number and bytes (a page served for another is refused too)."""
    h = hashlib.sha256(j.to_bytes(8, "little"))
    h.update(body)
    return h.digest()


def full_entry_at(data: bytes, s: int) -> int:
    """Where slot ``s``'s row starts in the bytes of a full table object (either version; for tests and tools)."""
    if int.from_bytes(data[8:12], "little") == 1:
        return HEADER + s * int.from_bytes(data[12:16], "little") * ENTRY
    C, R = int.from_bytes(data[12:16], "little"), int.from_bytes(data[64:68], "little")
    j = s // R
    return HEADER2 + 32 + j * (R * C * ENTRY + 32) + (s - j * R) * C * ENTRY


def decode(data) -> tuple[np.ndarray, np.ndarray | None, int, str | None]:
    """(entries (E, C*ENTRY), slot index or None, slots, base) of a table object's bytes (either version,
    unchecked against a manifest): what a tool that rewrites a table starts from."""
    C = int.from_bytes(bytes(data[12:16]), "little")
    part = _Part(_Whole(data), "", len(data), C, "table")
    index, rows = part.all()
    return rows, index, part.slots, part.base


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


class _Whole:
    """A table object's bytes, all at hand (mapped from a folder, or fetched whole), already checked against its name
    (SHA-256): its pages need no check of their own."""

    checked = True

    def __init__(self, data):
        self.data = np.frombuffer(data, np.uint8) if not isinstance(data, np.ndarray) else data

    def read(self, start: int, end: int, check=None):
        return self.data[start:end]

    def whole(self):
        return self.data


class _Part:
    """One table object of a chain, parsed from its source (``_Whole``, or ``_Ranged``: object storage, read by
    range). Version 1 (one block of rows) is read whole; version 2's pages are read when first needed."""

    def __init__(self, src, sha: str, nbytes: int, C: int, where: str):
        self.src, self.sha, self.nbytes, self.C, self.where = src, sha, nbytes, C, where
        first = bytes(src.read(0, min(nbytes, HEADER2 + 32), _head_ok))
        if len(first) < HEADER or first[:8] != MAGIC:
            raise CorruptDatasetError(f"{where}: not a dsc shard table")
        version, cols = int.from_bytes(first[8:12], "little"), int.from_bytes(first[12:16], "little")
        self.slots, self.E = int.from_bytes(first[16:24], "little"), int.from_bytes(first[24:32], "little")
        self.base = first[32:64].hex() if first[32:64] != _ZERO else None
        if version not in (1, 2):
            raise CorruptDatasetError(f"{where}: shard table version {version}; this dsc reads 1 and 2 "
                                      f"(upgrade dsc: pip install -U dsc)")
        self.version, E, full = version, self.E, self.base is None
        if (E and cols != C) or (full and E != self.slots) or E > self.slots:
            raise CorruptDatasetError(f"{where}: a shard table of {E} entries of {cols} columns for {self.slots} "
                                      f"slots does not fit the manifest's {C} columns; the dataset is damaged")
        self.index = self.rows = None  # version 1 (or ``all``): every entry
        self._pages: dict[int, tuple] = {}
        if version == 1:
            self._whole_v1(src.whole())
            return
        self.R, self.G = int.from_bytes(first[64:68], "little"), int.from_bytes(first[68:72], "little")
        self.rowb = C * ENTRY + (0 if full else 8)
        ok = self.R >= 1 and self.G == -(-E // self.R) if E else self.G == 0
        self.head_end = HEADER2 + (0 if full else 8 * self.G) + 32
        self.page_bytes = self.R * self.rowb + 32 if ok else 0
        want = self.head_end + self.G * 32 + E * self.rowb
        if not ok or want != nbytes or len(first) < HEADER2:
            raise CorruptDatasetError(f"{where}: a shard table of {nbytes} bytes does not hold {E} entries of {C} "
                                      f"columns for {self.slots} slots; the dataset is damaged")
        head = bytes(src.read(0, self.head_end, _head_ok)) if self.head_end > len(first) else first
        if not _head_ok(head[:self.head_end]):
            raise CorruptDatasetError(f"{where}: its head does not match its own SHA-256; the dataset is damaged. {_FIX}")
        self.fences = None
        if not full:
            self.fences = np.frombuffer(head[HEADER2:HEADER2 + 8 * self.G], "<u8").astype(np.int64)
            if self.G and (np.any(np.diff(self.fences) <= 0) or int(self.fences[-1]) >= self.slots):
                raise CorruptDatasetError(f"{where}: its slot index is not increasing within {self.slots} slots")

    def _whole_v1(self, buf) -> None:
        buf = _Whole(buf).data
        E, C, full = self.E, self.C, self.base is None
        want = HEADER + (0 if full else 8 * E) + E * C * ENTRY
        if len(buf) != want:
            raise CorruptDatasetError(f"{self.where}: a shard table of {len(buf)} bytes does not hold {E} entries of "
                                      f"{C} columns for {self.slots} slots; the dataset is damaged")
        at = HEADER
        if not full:
            self.index = _increasing(buf[at:at + 8 * E].view("<u8"), self.slots, self.where)
            at += 8 * E
        self.rows = buf[at:].reshape(E, C * ENTRY) if C else np.zeros((E, 0), np.uint8)

    def page(self, j: int) -> tuple[np.ndarray | None, np.ndarray]:
        """(slot index or None, rows) of page ``j`` (version 2), read and checked when first needed."""
        got = self._pages.get(j)
        if got is None:
            n = min(self.R, self.E - j * self.R)
            at = self.head_end + j * self.page_bytes
            body_n = n * self.rowb
            check = (lambda b: len(b) == body_n + 32 and _page_sha(j, b[:body_n]) == bytes(b[body_n:]))
            buf = self.src.read(at, at + body_n + 32, None if self.src.checked else check)
            buf = np.frombuffer(buf, np.uint8) if not isinstance(buf, np.ndarray) else buf
            if not self.src.checked and not check(buf):
                raise CorruptDatasetError(f"{self.where}: page {j} does not match its SHA-256; the dataset is "
                                          f"damaged. {_FIX}")
            index = None
            if self.base is not None:
                index = _increasing(buf[:8 * n].view("<u8"), self.slots, self.where)
                if int(index[0]) != int(self.fences[j]) or (j + 1 < self.G and int(index[-1]) >= int(self.fences[j + 1])):
                    raise CorruptDatasetError(f"{self.where}: page {j}'s slots are not those its head says")
            rows = buf[8 * n if index is not None else 0:body_n].reshape(n, self.C * ENTRY)
            got = self._pages[j] = (index, rows)
        return got

    def all(self) -> tuple[np.ndarray | None, np.ndarray]:
        """(slot index or None, rows) of every entry here (version 2 from object storage: one GET of the object,
        checked against its name, then its pages)."""
        if self.rows is None:
            if not self.src.checked:
                self.src = _Whole(self.src.whole())
                self._pages.clear()
            pages = [self.page(j) for j in range(self.G)]
            rows = np.concatenate([r for _, r in pages]) if pages else np.zeros((0, self.C * ENTRY), np.uint8)
            self.index = None if self.base is None else (
                np.concatenate([i for i, _ in pages]) if pages else np.zeros(0, "<u8"))
            self.rows = rows
        return self.index, self.rows

    def bad_pages(self) -> list[int]:
        """The pages (version 2) whose SHA-256 does not match their bytes, -1 for the head: what a reader of
        object storage would refuse, though the object matches its name (``dsc verify``)."""
        if self.version == 1:
            return []
        data = self.src.whole()
        bad = [] if _head_ok(data[:self.head_end]) else [-1]
        for j in range(self.G):
            at = self.head_end + j * self.page_bytes
            n = min(self.R, self.E - j * self.R) * self.rowb
            if _page_sha(j, data[at:at + n]) != bytes(data[at + n:at + n + 32]):
                bad.append(j)
        return bad

    def pages_of(self, slots: np.ndarray) -> np.ndarray | None:
        """The pages (version 2) that hold the entries of ``slots`` (sorted, unique), a delta's those that may; None
        where every entry is at hand already (version 1, or read whole)."""
        if self.rows is not None:
            return None
        if self.base is None:
            j = slots[slots < self.E] // self.R
        else:
            j = np.searchsorted(self.fences, slots, "right") - 1
            j = j[j >= 0]
        return np.unique(j)

    def find(self, s: int) -> np.ndarray | None:
        """Slot ``s``'s row here, or None (a delta that does not change it)."""
        if self.rows is not None:
            if self.index is None:
                return self.rows[s] if s < len(self.rows) else None
            k = int(np.searchsorted(self.index, s))
            return self.rows[k] if k < len(self.index) and int(self.index[k]) == s else None
        if self.base is None:
            if s >= self.E:
                return None
            j = s // self.R
            return self.page(j)[1][s - j * self.R]
        j = int(np.searchsorted(self.fences, s, "right")) - 1
        if j < 0:
            return None
        index, rows = self.page(j)
        k = int(np.searchsorted(index, s))
        return rows[k] if k < len(index) and int(index[k]) == s else None


def _head_ok(head) -> bool:
    head = bytes(head)
    return len(head) >= 32 and hashlib.sha256(head[:-32]).digest() == head[-32:]


def _increasing(index: np.ndarray, slots: int, where: str) -> np.ndarray:
    if len(index) and (np.any(np.diff(index.astype(np.int64)) <= 0) or int(index[-1]) >= slots):
        raise CorruptDatasetError(f"{where}: its slot index is not increasing within {slots} slots")
    return index


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
                        part = _Part(_source(self._load, t["sha256"], t["nbytes"]), t["sha256"], t["nbytes"], C,
                                     where)
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

    def bad_pages(self) -> list[str]:
        """Each table object's pages (and head) whose own SHA-256 does not match (see ``_Part.bad_pages``)."""
        return [f"{object_path(p.sha)}: {'its head' if j < 0 else f'page {j}'} does not match its own SHA-256 "
                f"(readers of object storage refuse it)" for p in self._chain() for j in p.bad_pages()]

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

    def load(self, slots: np.ndarray) -> None:
        """Read ahead the entries of ``slots`` (what a Loader's epoch plan reads): each object of the chain, the
        pages holding them (one ranged GET a page from object storage, up to ``LOAD_THREADS`` in flight), or the
        whole object in one GET where they are more than half of its pages (``ShardColumn`` then reads them
        from memory)."""
        if self._full is not None:
            return
        slots = np.unique(np.asarray(slots, np.int64))
        for part in self._chain():
            pages = part.pages_of(slots[slots < part.slots])
            if pages is None:
                continue
            if 2 * len(pages) > part.G:
                part.all()
                continue
            todo = [j for j in pages.tolist() if j not in part._pages]
            if len(todo) > 1 and not part.src.checked:  # (ranged GETs: in flight together, not one round trip
                with ThreadPoolExecutor(min(LOAD_THREADS, len(todo))) as pool:  # after another; each page checked
                    list(pool.map(part.page, todo))                         # by its own hash as it comes)
            else:
                for j in todo:
                    part.page(j)

    def rows(self) -> np.ndarray:
        """(slots, C*ENTRY) uint8: every slot's entries, the chain resolved (what a writer or verify reads)."""
        if self._full is None:
            parts = self._chain()
            full = np.zeros((self.slots, len(self.columns) * ENTRY), np.uint8)
            for part in parts:
                index, rows = part.all()
                if index is None:
                    m = min(part.slots, self.slots)
                    full[:m] = rows[:m]
                else:
                    keep = index < self.slots
                    full[index[keep].astype(np.int64)] = rows[keep]
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

    def largest_slots_bytes(self, n: int) -> int | None:
        """At least the bytes of the ``n`` largest slots (every column's shard), from the reference and the layout
        alone (no entry read): the version's total when ``n`` covers every shard, else ``n`` full shards of each
        column (a fixed-layout shard of fewer samples is smaller), at most that total. Exact when ``n`` slots are
        full, as all but the last are in a compile. None where a column's shard size is not set by its layout
        (ragged): the caller reads the sizes."""
        total = int(self.ref["nbytes"])
        if n >= int(self.ref["shards"]):
            return total
        full = [self.geometry[c].nbytes(self.K, self.K) for c in self.columns]
        return None if None in full else min(n * sum(full), total)

    def column(self, name: str) -> "ShardColumn":
        return ShardColumn(self, self.columns.index(name))


class ShardColumn(Sequence):
    """One field's shards by slot, as a read-only sequence of ShardSpec / None read from the table on demand
    (what ``manifest.shards`` and a mask field's ``shards`` are in format 4)."""

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


def _source(load, sha: str, nbytes: int):
    """Where a chain's object ``sha`` is read from: a ``StoreLoader``'s (by range from object storage), else the
    bytes ``load(sha, nbytes)`` gives (a writer's stand-in)."""
    return load.source(sha, nbytes) if isinstance(load, StoreLoader) else _Whole(load(sha, nbytes))


class _Ranged:
    """A table object in object storage, read by range: each range asked for (the head, a page) from the node's
    mirror when a copy there passes ``check``, else by one ranged GET, kept in the mirror when it passes (every
    process of the node then finds it). ``whole``: the object in one GET, checked against its name."""

    checked = False

    def __init__(self, loader: "StoreLoader", sha: str, nbytes: int):
        self.loader, self.sha, self.nbytes = loader, sha, nbytes

    def read(self, start: int, end: int, check=None) -> bytes:
        """Bytes [start, end) of the object. A range from 0 is (part of) the head: whatever its end, the head is kept
        whole under one name (``<sha>.head``), and a read of any prefix of it is served from there (a delta's head
        is longer than the first range a reader asks for: its length is known only from those bytes)."""
        want = min(end, self.nbytes) - start
        kept = None if self.loader.mirror is None or check is None else \
            Path(self.loader.mirror) / RANGES / (f"{self.sha}.head" if start == 0 else f"{self.sha}.{start}-{end}")
        if kept is not None:
            data = self._mirrored(kept, start, want, check)
            if data is not None:
                return data
        store, rel = self.loader.store, object_path(self.sha)
        try:
            data = bytes(memoryview(store.read_range(rel, start, start + want)))
        except FileNotFoundError:
            raise _missing(store, rel) from None
        if kept is not None and check(data):  # (processes sharing the mirror may write it at once: their own names)
            try:
                write_atomic(kept, data, unique=True)
            except OSError:  # (a read-only cache, one warmed elsewhere: it serves what it holds, the rest is fetched)
                pass
        return data

    def _mirrored(self, kept: Path, start: int, want: int, check) -> bytes | None:
        """The range's ``want`` bytes from the node's mirror when a copy there passes ``check``: the range kept under
        its own name (the head kept whole, checked whole, its prefix served), else the object whole (an epoch plan
        of the node fetched it); None when neither is there intact. Each file is read for the bytes asked only."""
        for path, at, n in ((kept, 0, None if start == 0 else want),
                            (Path(self.loader.mirror) / object_path(self.sha), start, want)):
            data = _pread(path, at, n)
            if data is not None and len(data) >= want and check(data):
                return data[:want]
        return None

    def whole(self):
        return self.loader(self.sha, self.nbytes)


def _pread(path: Path, at: int, n: int | None) -> bytes | None:
    """``n`` bytes of the file ``path`` from ``at`` (None: all of it), fewer at its end; None when it is not there
    (or unreadable: the caller fetches the bytes instead)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return os.pread(fd, os.fstat(fd).st_size if n is None else n, at)
    except OSError:
        return None
    finally:
        os.close(fd)


def _missing(store, rel: str) -> CorruptDatasetError:
    return CorruptDatasetError(f"{store.where(rel)} is missing (the shard table of the version); the dataset in "
                               f"object storage is damaged. Push an intact copy")


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

    def source(self, sha: str, nbytes: int):
        """Where table object ``sha`` is read from: mapped whole from a folder (checked against its name), by range
        from object storage (each range checked against its own SHA-256)."""
        return _Whole(self(sha, nbytes)) if self.store.local else _Ranged(self, sha, nbytes)

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
            raise _missing(store, rel) from None
        if len(data) != nbytes or hashlib.sha256(data).hexdigest() != sha:
            raise CorruptDatasetError(f"{store.where(rel)} does not have the bytes its name (SHA-256) says; the "
                                      f"dataset in object storage is damaged")
        if mirror is not None:  # (processes sharing the mirror may write it at once: each its own private name)
            write_atomic(Path(mirror) / rel, data, unique=True)
        return data
