"""The Store protocol: where one dataset's bytes live, whatever holds them (docs/architecture.md).

A store is one dataset's prefix: a local folder or an object-storage URL, with paths relative to it
(``image/c/0/0/0``, ``_dsc/log/3.json``). Every file dsc reads or writes goes through these few calls, so
the layers above never ask where a dataset is; they raise dsc's errors (a missing object is also a
``FileNotFoundError``, an object that exists where a create-only put was asked a ``FileExistsError``).
"""
from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path
from typing import Callable


from ..errors import CorruptDatasetError, ObjectChangedError
from .paths import check_node_path


class MissingFile(CorruptDatasetError, FileNotFoundError):
    """A file of the dataset is not there (as opposed to there but unsafe or unreadable)."""


def short_range(where: str, end: int) -> CorruptDatasetError:
    return CorruptDatasetError(f"{where} ends before byte {end:,}; the dataset is damaged or was replaced "
                               f"(dsc verify names the damaged files)")


def object_changed(where: str) -> ObjectChangedError:
    return ObjectChangedError(f"{where} was replaced while dsc was reading it (its ETag is not the one its first read "
                              f"saw); nothing read from it was used. Run the command again once the object no longer "
                              f"changes (what is read then is the new object, from its start)")


class Store:
    """One dataset's prefix. Paths are relative to it and checked (``paths.check_node_path``)."""

    url: str
    local: bool = False  # a folder of this machine (memory-mappable files, flock, the view refreshed in place)

    # ------------------------------------------------------------------ the protocol
    def download(self, rel: str, f, on_chunk: Callable[[memoryview | None], None] | None = None,
                 limit: int | None = None) -> int:
        """Stream the object into the open binary file ``f`` from its start; returns its size. ``on_chunk``
        sees every chunk, and ``None`` when an attempt starts over; more than ``limit`` bytes is refused."""
        raise NotImplementedError

    def put(self, rel: str, data, create_only: bool = False, attributes: dict | None = None) -> None:
        """Write the object whole (``data``: bytes, a path, or an open binary file), atomically: readers see
        the old bytes or the new ones. ``create_only``: put-if-absent, ``FileExistsError`` if it exists (the
        commit of a version). ``attributes``: metadata kept with it where the store can (an upload's sha256)."""
        raise NotImplementedError

    def stat(self, rel: str) -> tuple[int, dict] | None:
        """(size, attributes) of the object, or None if there is none."""
        raise NotImplementedError

    def list(self, prefix: str) -> list[tuple[str, int]]:
        """(path, size) of every object whose path starts with ``prefix``."""
        return [(rel, size) for rel, size, _ in self.list_detailed(prefix)]

    def list_detailed(self, prefix: str) -> list[tuple[str, int, float]]:
        """(path, size, last modified as a Unix time) of every object whose path starts with ``prefix``."""
        raise NotImplementedError

    def delete(self, rel: str, best_effort: bool = False) -> None:
        """Remove the object; one that is not there is no error. ``best_effort``: one attempt, no error."""
        raise NotImplementedError

    def read_range(self, rel: str, start: int, end: int):
        """Bytes ``[start, end)`` of the object (a buffer; fewer at its end): how a source reads part of an input
        (a Parquet file's row groups, a tar's members) without the rest. A store that can read a range without
        the whole object overrides this."""
        if end <= start:
            return b""
        return memoryview(self.get(rel))[start:end]

    def read_range_pinned(self, rel: str, start: int, end: int, etag: str | None = None):
        """(bytes ``[start, end)`` as :meth:`read_range` gives them, the object's tag, its attributes) in one request;
        with ``etag`` (what an earlier read of the object gave) an object replaced since is an
        ``ObjectChangedError``, never read (object storage: If-Match, and the answer's ETag checked). A store
        without tags: (the bytes, None, {})."""
        return self.read_range(rel, start, end), None, {}

    def identity(self, rel: str) -> tuple[int, float, str] | None:
        """(size, last modified as a Unix time, tag) of the object in one request that returns no content, or None
        (absent, or a store without one): what says it changed. The tag (object storage's ETag) changes whenever
        the object is written again; "" where the store gives none."""
        return None

    # ------------------------------------------------------------------ built on it
    def read_tail(self, rel: str, n: int):
        """(the object's last ``n`` bytes, all of it when smaller; its identity (size, last modified, tag)): what a
        reader that starts at the end (a Parquet footer) reads first. Here: :meth:`identity` (else :meth:`stat`) for
        the size, then the range of the object it named (:meth:`read_range_pinned`); a store that can read a suffix
        in one request overrides this (object storage). MissingFile when there is no such object."""
        ident = self.identity(rel)
        if ident is None:
            found = self.stat(rel)
            if found is None:
                raise MissingFile(f"{self.where(rel)} is missing")
            ident = (found[0], 0.0, "")
        size = int(ident[0])
        return self.read_range_pinned(rel, max(0, size - int(n)), size, ident[2] or None)[0], ident

    def put_if_absent(self, rel: str, data, attributes: dict | None = None) -> None:
        self.put(rel, data, create_only=True, attributes=attributes)

    def get(self, rel: str, limit: int | None = None) -> bytes:
        """The whole object; one of more than ``limit`` bytes is refused once that many arrived."""
        buf = io.BytesIO()
        self.download(rel, buf, limit=limit)
        return buf.getvalue()

    def etag(self, rel: str) -> str | None:
        """The object's tag (see :meth:`identity`); None where there is none (a reader then reads the object
        itself)."""
        found = self.identity(rel)
        return (found[2] or None) if found is not None else None

    def get_range(self, rel: str, start: int, end: int):
        """Bytes ``[start, end)`` of a dataset's file (a buffer, :meth:`read_range`); one that ends before ``end``
        is damaged (``CorruptDatasetError``)."""
        data = self.read_range(rel, start, end)
        if len(data) != end - start:
            raise short_range(self.where(rel), end)
        return data

    def get_or_none(self, rel: str, limit: int | None = None) -> bytes | None:
        try:
            return self.get(rel, limit)
        except FileNotFoundError:
            return None

    def reader(self, rel: str, size: int, buffer: int = 4 << 20, etag: str | None = None) -> "io.BufferedReader":
        """The object as a seekable binary file of ``size`` bytes, read by ranges of at least ``buffer`` bytes
        as it is consumed (a tar streamed, a Parquet file's footer then its row groups): never whole. Every range
        is of the object ``etag`` names (else of the one the first range read): see :class:`RangeFile`."""
        return io.BufferedReader(RangeFile(self, rel, size, etag), buffer)

    def where(self, rel: str) -> str:
        """The object's full name, for messages."""
        return f"{self.url.rstrip('/')}/{rel}"

    def files(self, redirect: dict | None = None, expected: dict | None = None) -> "Files":
        """The dataset's files to read, as a local :class:`~dsc.store.local.Root` reads them (``read``, ``size``,
        ``exists``, ``sha256``...): reads of a path in ``redirect`` go to its content object (a version's small
        files), and a file read whole must have the size ``expected`` says."""
        f = Files(self)
        f.redirect, f.expected = redirect, expected
        return f

    def lock(self, what: str):
        """Held by a writer while it writes (a folder's flock); object storage has none: its writers' objects
        never collide, and a version is committed by one conditional put (docs/REMOTE.md)."""
        import contextlib

        return contextlib.nullcontext()


class SeekableFile(io.RawIOBase):
    """A raw readable, seekable file of ``self.size`` bytes named ``self.name``, read at ``self.pos``: the
    position bookkeeping :class:`RangeFile` and ``object.StreamFile`` share (they define ``readinto``)."""

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self.pos, 2: self.size}[whence]
        if base + offset < 0:
            raise ValueError(f"{self.name}: seek to {base + offset}, before the start")
        self.pos = base + offset
        return self.pos


# RangeFile.prefetch: ranges this close are read by one request (the bytes between them read and dropped), up to this
# much a request (pyarrow's own pre-buffering joins ranges by the same two rules: 8 KiB, 32 MiB)
COALESCE_GAP = 8 << 10
COALESCE_LIMIT = 32 << 20


class RangeFile(SeekableFile):
    """A store's object as a raw seekable file: each ``readinto`` is one ranged read (retried by the store); wrap
    it in ``io.BufferedReader`` (``Store.reader``) for read-ahead. Every range is of one object: the one ``etag``
    names, else the one the first range read (its tag pinned); a range of an object replaced since is an
    ``ObjectChangedError`` (:meth:`Store.read_range_pinned`), so a file's bytes never mix two versions."""

    def __init__(self, store: "Store", rel: str, size: int, etag: str | None = None):
        self.store, self.rel, self.size, self.pos, self.etag = store, rel, int(size), 0, etag
        self.name = store.where(rel)
        self._have: dict[int, bytes] = {}  # prefetched ranges by their start

    def _range(self, start: int, end: int):
        data, tag, _ = self.store.read_range_pinned(self.rel, start, end, self.etag)
        if self.etag is None:
            self.etag = tag
        return data

    def keep(self, start: int, data) -> None:
        """Serve reads inside ``[start, start + len(data))`` from ``data`` (bytes of this object already read)."""
        self._have[int(start)] = data

    def prefetch(self, ranges, in_flight: int = 8) -> None:
        """Read the byte ranges ``[(start, end)]`` now, ``in_flight`` requests at once (the column chunks a reader
        is about to ask for one after another); a later read inside one of them is served from it. Ranges already
        held are not asked again, and neighbours (a row group's chunks of the columns read: side by side in the
        file) are one request: those at most ``COALESCE_GAP`` bytes apart, up to ``COALESCE_LIMIT`` a request."""
        from concurrent.futures import ThreadPoolExecutor

        merged: list[list[int]] = []
        for a, b in sorted({(int(a), min(int(b), self.size)) for a, b in ranges if a < b and a < self.size}):
            if any(s <= a and b <= s + len(d) for s, d in self._have.items()):
                continue
            last = merged[-1] if merged else None
            if last and a - last[1] <= COALESCE_GAP and max(b, last[1]) - last[0] <= COALESCE_LIMIT:
                last[1] = max(b, last[1])
            else:
                merged.append([a, b])
        ranges = [tuple(r) for r in merged]
        if not ranges:
            return
        if self.etag is None:  # (the first range pins the object the others must be)
            self._have[ranges[0][0]] = self._range(*ranges[0])
            ranges = ranges[1:]
            if not ranges:
                return
        with ThreadPoolExecutor(min(in_flight, len(ranges)), thread_name_prefix="dsc-range") as pool:
            for (a, _), data in zip(ranges, pool.map(lambda r: self._range(*r), ranges)):
                self._have[a] = data

    def readinto(self, b) -> int:
        n = min(len(b), self.size - self.pos)
        if n <= 0:
            return 0
        for a, data in self._have.items():  # (few: a file's column chunks)
            if a <= self.pos and self.pos + n <= a + len(data):
                b[:n] = memoryview(data)[self.pos - a:self.pos - a + n]
                self.pos += n
                return n
        data = self._range(self.pos, self.pos + n)
        b[:len(data)] = data
        self.pos += len(data)
        return len(data)


class Sha256Sink:
    """``on_chunk`` for :meth:`Store.download`: the SHA-256 of the attempt that succeeded (it starts over
    when an attempt does)."""

    def __init__(self):
        self._h = hashlib.sha256()

    def __call__(self, chunk) -> None:
        if chunk is None:
            self._h = hashlib.sha256()
        else:
            self._h.update(chunk)

    def hexdigest(self) -> str:
        return self._h.hexdigest()


def default_cache_dir() -> Path:
    """Where remote datasets are cached and compiles to a URL are staged: ``$DSC_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/dsc``, else ``~/.cache/dsc``."""
    env = os.environ.get("DSC_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME")
    return (Path(base) if base else Path.home() / ".cache") / "dsc"


class FileReads:
    """What the format's readers ask of a dataset's files, over ``size`` and ``read`` (a local folder's
    :class:`~dsc.store.local.Root`, or a store's :class:`Files`)."""

    def check_size(self, rel: str, expect: int) -> None:
        size = self.size(rel)
        if size != expect:
            raise self._wrong_size(rel, size, expect)

    def fromfile(self, rel: str, dtype, expect: int):
        """The file's ``expect`` bytes as an array of ``dtype`` (read once; any other size is damage)."""
        import numpy as np

        data = self.read(rel, limit=expect)
        if len(data) != expect:
            raise self._wrong_size(rel, len(data), expect)
        return np.frombuffer(data, dtype=dtype)

    def _wrong_size(self, rel: str, size: int, expect: int) -> CorruptDatasetError:
        return CorruptDatasetError(f"{self / rel} has {size:,} bytes, the manifest expects {expect:,}; the file is "
                                   f"truncated or damaged (dsc verify lists every problem)")


class Files(FileReads):
    """A store's files read as a local dataset folder's are (:class:`~dsc.store.local.Root`'s interface), so the
    format's readers and ``verify`` run unchanged on object storage. Missing files are ``FileNotFoundError``."""

    redirect: dict | None = None
    expected: dict | None = None

    def __init__(self, store: Store):
        self.store = store
        self.path = store.url

    def __truediv__(self, rel: str) -> str:  # for messages
        return self.store.where(rel)

    def _target(self, rel: str) -> str:
        return check_node_path(self.redirect.get(rel, rel) if self.redirect else rel)

    def size(self, rel: str) -> int:
        st = self.store.stat(self._target(rel))
        if st is None:
            raise MissingFile(f"{self.store.where(rel)} is missing; the dataset is incomplete or damaged")
        return st[0]

    def exists(self, rel: str) -> bool:
        return self.store.stat(self._target(rel)) is not None

    def read(self, rel: str, limit: int | None = None) -> bytearray:
        want = self.expected.get(rel) if self.expected else None
        cap = want if want is not None else limit
        try:
            data = self.store.get(self._target(rel), cap)
        except FileNotFoundError:
            raise MissingFile(f"{self.store.where(rel)} is missing; the dataset is incomplete or damaged") from None
        if want is not None and len(data) != want:
            raise CorruptDatasetError(f"{self.store.where(rel)} has {len(data):,} bytes, the manifest records "
                                      f"{want:,}; the dataset is damaged (dsc verify lists every problem)")
        return bytearray(data)

    def sha256(self, rel: str) -> str:
        sink = Sha256Sink()
        try:
            self.store.download(self._target(rel), _Discard(), sink)
        except FileNotFoundError:
            raise MissingFile(f"{self.store.where(rel)} is missing; the dataset is incomplete or damaged") from None
        return sink.hexdigest()


class _Discard:
    """A file that keeps nothing (hashing a download without storing it)."""

    def seek(self, *a):
        return 0

    def write(self, b):
        return len(b)

    def truncate(self, *a):
        return 0
