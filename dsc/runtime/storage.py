"""Where a dataset's bytes come from at run time: shard files memory-mapped from the page cache
(``cache="page"``) or read into process memory (``cache="ram"``), and the small index arrays.

The field readers (``formats/fields``) ask a storage for ``map(path, nbytes)`` and ``array(rel, shape)``
and never touch files themselves, so a strategy (a later remote cache, say) is one class here.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..errors import CorruptDatasetError
from ..progress import progress_bar
from ..formats import versions
from ..store.local import Root
from ..errors import DscError
from ..formats.layout import Arrays, read_manifest

CACHES = ("page", "ram")


class Storage(Arrays):
    """A dataset directory's bytes: shards mapped on first use and kept, small arrays read whole."""

    _failed: Exception | None = None  # why a re-opened (unpickled) storage cannot be read
    closed = False  # closed: it let go of its version (a read of an array read on first use may then fail)

    def __init__(self, root: Root, checksum: str | None = None, version: int | None = None, pin=None):
        super().__init__(root)  # every file is read relative to the directory as opened (store/local.py)
        self.checksum = checksum  # the manifest's: a process that re-opens the path checks it is the same
        self.version = version  # a versioned dataset's version: a re-opening process reads (and pins) that one
        self._pin = pin  # held while this storage lives: dsc vacuum keeps the version
        self._maps: dict[str, np.ndarray] = {}

    @property
    def dir(self) -> Root:
        if self._failed is not None:  # raised where the worker reads, so DataLoader shows it to the parent
            raise type(self._failed)(str(self._failed))
        return self._dir

    def map(self, rel: str, nbytes: int) -> np.ndarray:
        """The first ``nbytes`` of a shard, mapped on first use. A private (copy-on-write) mapping: pages are
        the OS page cache's, shared by every process that maps the file, never written back; the page
        tables are filled up front (MADV_POPULATE_READ, read-only, so nothing is copied)."""
        arr = self._maps.get(rel)
        if arr is None:
            arr = self._maps[rel] = self.dir.map(rel, nbytes)  # (self.dir raises if the re-open failed)
        return arr

    def close(self) -> None:
        """Drop this storage's mappings (arrays still referenced keep theirs) and its version pin."""
        self.closed = True
        self._maps = {}
        pin, self._pin = self._pin, None
        if pin is not None:
            pin.release()

    def check_shard(self, rel: str, nbytes: int) -> None:
        """A shard (of a version with a shard table) is there with its size, checked when its slot is first read
        (a version that lists its shards has them all checked at open)."""
        self.dir.check_size(rel, nbytes)

    def map_file(self, rel: str, nbytes: int, populate: bool = True) -> np.ndarray:
        """A new mapping of a shard's first ``nbytes``, not kept here (a read strategy holds it)."""
        return self.dir.map(rel, nbytes, populate)

    def acquire(self, rel: str, mapped: bool = True) -> None:
        """Hold shard ``rel`` (a local shard is always there: nothing to do; a remote storage downloads it into
        the cache and holds it there, and with ``mapped`` maps it)."""

    def release(self, rel: str) -> None:
        """(See ``acquire``.)"""

    def shard_fd(self, rel: str) -> int:
        """A descriptor of shard ``rel`` for direct reads (plain path, no links); the caller closes it."""
        return self.dir.open_file(rel)

    def drop_pages(self, rel: str) -> None:
        """Ask the OS to drop shard ``rel``'s pages from the page cache (pages another mapping uses stay)."""
        try:
            fd = self.dir.open_file(rel)
        except Exception:  # noqa: BLE001 - advice only
            return
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        except (OSError, AttributeError):
            pass
        finally:
            os.close(fd)

    def where(self, rel: str) -> str:
        return str(self.root / rel)

    def load_to_ram(self, shards, progress: bool = True) -> None:
        """Read ``shards`` (ShardSpecs) into process memory: no page-cache eviction or page faults during
        training, at the cost of the dataset's size in RAM per process."""
        with progress_bar(total=sum(s.nbytes for s in shards), unit="B", unit_scale=True, desc="load to RAM",
                  disable=not progress) as bar:
            for spec in shards:
                self._maps[spec.path] = np.array(self.map(spec.path, spec.nbytes))
                bar.update(spec.nbytes)

    def __getstate__(self):  # DataLoader workers started by spawn re-open the path and re-map lazily
        return {"path": self.root, "checksum": self.checksum, "version": self.version}

    def __setstate__(self, state):
        """Re-open the path and check it is the same dataset. A failure is kept and raised at the first read,
        not here: an exception while a spawned DataLoader worker unpickles its dataset reaches the parent
        only as 'worker exited unexpectedly', one raised by a read is shown with its message."""

        self.root, self.checksum, self._maps = Path(state["path"]), state["checksum"], {}
        self.version, self._pin = state.get("version"), None
        try:
            self._dir = Root(state["path"])
            if self.version is not None:
                record, self._pin = versions.open_version(self._dir, self.version)
                manifest = record["manifest"]
            else:
                manifest = read_manifest(self._dir)
            if self.checksum is not None and manifest.checksum() != self.checksum:
                raise CorruptDatasetError(f"{self.root} was replaced by another compile since the dataset was "
                                          f"opened; open it again (a worker must read the dataset its parent opened)")
        except DscError as e:
            self._failed = e
