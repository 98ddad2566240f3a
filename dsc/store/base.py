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

    def get_range(self, rel: str, start: int, length: int) -> bytes:
        """``length`` bytes of the object from ``start`` (fewer at its end)."""
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
        """(path, size) of every object under ``prefix`` (a folder-like prefix ending in '/', or '')."""
        raise NotImplementedError

    def delete(self, rel: str) -> None:
        """Remove the object; one that is not there is no error."""
        raise NotImplementedError

    # ------------------------------------------------------------------ built on it
    def put_if_absent(self, rel: str, data, attributes: dict | None = None) -> None:
        self.put(rel, data, create_only=True, attributes=attributes)

    def get(self, rel: str, limit: int | None = None) -> bytes:
        """The whole object; one of more than ``limit`` bytes is refused once that many arrived."""
        buf = io.BytesIO()
        self.download(rel, buf, limit=limit)
        return buf.getvalue()

    def get_or_none(self, rel: str, limit: int | None = None) -> bytes | None:
        try:
            return self.get(rel, limit)
        except FileNotFoundError:
            return None

    def where(self, rel: str) -> str:
        """The object's full name, for messages."""
        return f"{self.url.rstrip('/')}/{rel}"


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
