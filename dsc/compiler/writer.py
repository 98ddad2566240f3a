"""Shard writers: append samples in order, hash while writing, publish the file by rename on close.

A shard file only ever appears under its final name complete, so a crash leaves at most a ``.partial``
file behind (and resume re-hashes every shard it keeps, so a shard torn by a power loss is redone).
The whole dataset is flushed to disk with one syncfs before it is published. The same writers serve the workers (one shard each) and the
compaction pass that closes the gaps left by skipped inputs.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np

from ..errors import WriteError
from ..formats import ShardSpec
from ..formats.layout import fixed_shard_path, ragged_shard_node, ragged_shard_path
from ..formats.zarr_v3 import ZARR_JSON, node_dir, plain_array_json, shard_index, write_json


class _ShardWriter:
    """Every OSError while writing becomes :class:`WriteError` naming the shard (disk full, limits)."""

    def __init__(self, root: Path, rel_path: str):
        self.rel_path = rel_path
        self.path = node_dir(root, rel_path)
        self._tmp = self.path.with_name(self.path.name + ".partial")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._f = open(self._tmp, "wb")
        except OSError as e:
            raise WriteError.writing(self.path, e) from None
        self._hash = hashlib.sha256()
        self.count = 0
        self.nbytes = 0

    def _put(self, data: bytes | memoryview) -> None:
        try:
            self._f.write(data)
        except OSError as e:
            raise WriteError.writing(self.path, e) from None
        self._hash.update(data)
        self.nbytes += len(data)

    def write(self, sample: np.ndarray) -> None:
        self._put(memoryview(np.ascontiguousarray(sample, dtype=np.uint8)).cast("B"))
        self.count += 1

    def _finish(self) -> None:
        """Hook for the tail of the file (the fixed layout's shard index)."""

    def close(self) -> ShardSpec | None:
        """Publish the shard; returns its spec, or None (and no file) when it holds no sample."""
        if self.count == 0:
            self.abort()
            return None
        self._finish()
        try:
            self._f.close()
            os.replace(self._tmp, self.path)
        except OSError as e:
            raise WriteError.writing(self.path, e) from None
        return ShardSpec(path=self.rel_path, count=self.count, nbytes=self.nbytes, sha256=self._hash.hexdigest())

    def abort(self) -> None:
        try:
            self._f.close()
        except OSError:  # a full disk can fail the flush of what we are throwing away anyway
            pass
        self._tmp.unlink(missing_ok=True)


class FixedShardWriter(_ShardWriter):
    """Shard ``s`` of the (N, H, W, C) image array, in the Zarr sharding codec's byte layout."""

    def __init__(self, root: Path, s: int, capacity: int, sample_shape: tuple[int, int, int]):
        super().__init__(root, fixed_shard_path(s))
        self.capacity = capacity
        self.sample_shape = tuple(sample_shape)
        self.sample_nbytes = int(np.prod(sample_shape))

    def write(self, sample: np.ndarray) -> None:
        if sample.shape != self.sample_shape:
            raise ValueError(f"sample shape {sample.shape} != {self.sample_shape}")
        if self.count >= self.capacity:
            raise ValueError("shard is full")
        super().write(sample)

    def _finish(self) -> None:
        self._put(shard_index(self.count, self.capacity, self.sample_nbytes))


class RaggedShardWriter(_ShardWriter):
    """Shard ``s`` of a ragged image field: one plain 1-D uint8 Zarr array of all its samples' bytes."""

    def __init__(self, root: Path, s: int):
        super().__init__(root, ragged_shard_path(s))
        self._node = node_dir(root, ragged_shard_node(s))

    def _finish(self) -> None:
        write_json(self._node / ZARR_JSON, plain_array_json(self.nbytes))
