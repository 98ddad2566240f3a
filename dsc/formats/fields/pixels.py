"""The layout every image-like field shares (``image``, ``mask``): a sharded array of fixed-shape samples,
or ragged samples stored flat per shard with an offsets index. One class writes, compacts, reads and
verifies it; the fields add what is theirs (channels, dtype, the ignore index...).

Fixed: ``<node>`` is an (N, *sample) Zarr array with the sharding codec, one sample per inner chunk;
shard ``s`` is ``<node>/c/<s>/0...`` holding its ``count`` samples back to back, then the shard index.
Ragged: ``<node>/values/<s>`` (one plain 1-D array per shard), ``<node>/offsets`` (N+1,) int64 in
elements, ``<node>/shapes`` (N, ndim) int32. ``<crc_node>`` (N,) uint32: crc32c of each sample's bytes.
Everything here is numpy: the runtime maps shards through a store and wraps results as tensors.
"""
from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...errors import CorruptDatasetError, WriteError
from ...store.local import NewFile, write_atomic
from ...store.paths import check_node_path
from ..problems import Problem, try_read
from ..shardtable import ShardColumn
from ..specs import ShardSpec
from ..zarr_v3 import (ZARR_JSON, node_dir, ragged_shard_meta, read_plain_array, shard_index, sharded_array_json,
                       write_group, write_json, write_plain_array)
from ..zarr_v3 import fixed_shard_nbytes, read_array_meta, read_node_json


def bad_shapes(shapes: np.ndarray, sizes: np.ndarray, channels: int | None) -> np.ndarray:
    """Rows whose (h, w[, c]) is not a sample's: a side below 1, a size that is not h * w * c, another
    channel count. A hole (a row with no sample: (0, 0[, c]) and size 0, format 3) is not bad."""
    shp = shapes.astype(np.int64)
    hole = (shp[:, 0] == 0) & (shp[:, 1] == 0)
    bad = ((shp[:, :2] < 1).any(axis=1) & ~hole) | (np.prod(shp, axis=1) != sizes)
    if channels is not None:
        bad |= shp[:, 2] != channels
    return bad


def valid_offsets(off: np.ndarray, total: int | None = None) -> bool:
    """An offsets index (ragged samples, boxes): starts at 0, never decreases, ends at ``total`` if given."""
    return len(off) > 0 and off[0] == 0 and not np.any(np.diff(off) < 0) and (total is None or off[-1] == total)


@dataclass(frozen=True)
class Pixels:
    """One image-like array of the dataset: where it lives and the shape of its samples."""

    node: str  # "image", "mask"
    dtype: str  # "uint8" | "uint16"
    layout: str  # "fixed" | "ragged"
    channels: int | None  # trailing channel axis (image: 3 or 1); None: 2-D samples (mask)
    height: int | None = None  # fixed layout
    width: int | None = None
    crc_node: str = ""

    # ------------------------------------------------------------------ geometry
    @property
    def fixed(self) -> bool:
        return self.layout == "fixed"

    @property
    def ndim(self) -> int:
        return 2 if self.channels is None else 3

    @property
    def itemsize(self) -> int:
        return np.dtype(self.dtype).itemsize

    @property
    def sample_shape(self) -> tuple[int, ...]:
        assert self.fixed
        return (self.height, self.width) if self.channels is None else (self.height, self.width, self.channels)

    @property
    def sample_nbytes(self) -> int:
        return math.prod(self.sample_shape) * self.itemsize

    @property
    def dim_names(self) -> list[str]:
        return ["sample", "height", "width"] + (["channel"] if self.channels is not None else [])

    def shard_node(self, s: int) -> str:
        """The directory holding shard ``s`` (what compaction replaces)."""
        return f"{self.node}/c/{s}" if self.fixed else f"{self.node}/values/{s}"

    def shard_path(self, s: int) -> str:
        return f"{self.node}/c/{s}" + "/0" * self.ndim if self.fixed else f"{self.node}/values/{s}/c/0"

    @property
    def offsets_node(self) -> str:
        return f"{self.node}/offsets"

    @property
    def shapes_node(self) -> str:
        return f"{self.node}/shapes"

    def fixed_shard_nbytes(self, count: int, capacity: int) -> int:
        """Size of a fixed shard file: the samples, K index entries of 16 bytes, a 4-byte checksum."""
        return fixed_shard_nbytes(count, capacity, self.sample_nbytes)

    # ------------------------------------------------------------------ writing
    def writer(self, root: Path, s: int, capacity: int) -> "ShardWriter":
        return FixedShardWriter(root, self, s, capacity) if self.fixed else RaggedShardWriter(root, self, s)

    def write_meta(self, root: Path, n: int, K: int, shapes: np.ndarray, crc: np.ndarray) -> None:
        """The array metadata once every shard is written: the sharded array's zarr.json, or the ragged
        group with its offsets and shapes; and the per-sample checksums."""
        if self.fixed:
            write_json(node_dir(root, self.node) / ZARR_JSON,
                       sharded_array_json((n, *self.sample_shape), K, self.dim_names, self.dtype), Path(root))
        else:
            write_group(root, self.node)
            write_group(root, f"{self.node}/values")
            offsets = np.zeros(n + 1, np.int64)
            np.cumsum(np.prod(shapes.astype(np.int64), axis=1), out=offsets[1:])
            write_plain_array(root, self.offsets_node, offsets, ["sample_edge"])
            write_plain_array(root, self.shapes_node, shapes.astype(np.int32), ["sample", "axis"])
        write_plain_array(root, self.crc_node, crc.astype(np.uint32), ["sample"])

    def compact(self, root: Path, scratch: Path, shards: list, shapes: list[np.ndarray], K: int, u0: int
                ) -> list[ShardSpec]:
        """Re-stream shards ``u0...`` (a byte copy, no decode) so that shard s holds samples [s*K, (s+1)*K)
        again after inputs were skipped. ``shards[u]`` / ``shapes[u]``: unit u's shard and sample shapes.
        Returns the specs of every shard from ``u0`` on; the files are renamed into place at the end."""
        specs, s = [], u0
        writer = self.writer(scratch, s, K)
        for spec, shp in zip(shards[u0:], shapes[u0:]):
            if spec is None:
                continue
            path = node_dir(root, spec.path)
            if self.fixed:
                data = np.memmap(path, self.dtype, "r", shape=(len(shp), *self.sample_shape))
                samples = iter(data)
            else:
                data = np.memmap(path, self.dtype, "r")
                sizes = np.prod(shp.astype(np.int64), axis=1)
                ends = np.cumsum(sizes)
                samples = (data[e - k:e] for e, k in zip(ends, sizes))
            for sample in samples:
                writer.write(sample)
                if writer.count == K:
                    specs.append(writer.close())
                    s += 1
                    writer = self.writer(scratch, s, K)
            del data
        last = writer.close()
        if last is not None:
            specs.append(last)
        for u in range(u0, len(shards)):
            _rmtree(node_dir(root, self.shard_node(u)))
        for u in range(u0, u0 + len(specs)):
            os.rename(node_dir(scratch, self.shard_node(u)), node_dir(root, self.shard_node(u)))
        return specs

    def check_meta(self, root, n: int, K: int) -> None:
        """The array's own zarr.json says what the manifest says (a generic Zarr reader trusts it)."""

        if not self.fixed:
            meta = read_node_json(root, self.node)
            if not isinstance(meta, dict) or meta.get("node_type") != "group":
                raise CorruptDatasetError(f"{self.node}/zarr.json: a ragged field's node must be a group")
            return
        meta = read_array_meta(root, self.node)
        codec = meta["codecs"][0]
        inner = codec.get("configuration", {}).get("chunk_shape") if isinstance(codec.get("configuration"), dict) else None
        if (meta["shape"] != [n, *self.sample_shape] or meta["chunk_grid"]["configuration"]["chunk_shape"]
                != [K, *self.sample_shape] or meta.get("data_type") != self.dtype
                or codec.get("name") != "sharding_indexed" or inner != [1, *self.sample_shape]):
            raise CorruptDatasetError(f"{self.node}/zarr.json does not describe the manifest's ({n}, "
                                      f"{', '.join(map(str, self.sample_shape))}) {self.dtype} array in shards of "
                                      f"{K}; the dataset was damaged or edited. Recompile it")

    # ------------------------------------------------------------------ reading
    def reader(self, store, shards: tuple[ShardSpec, ...], n: int, K: int) -> "PixelsReader":
        self.check_meta(store.dir, n, K)
        return PixelsReader(self, store, shards, n, K)

    # ------------------------------------------------------------------ verifying
    def verify(self, root: Path, shards: tuple[ShardSpec, ...], n: int, K: int, problems: list, crc_known: bool):
        """Shard sizes and hashes (naming damaged samples through the per-sample crc32c), ragged offsets and
        shapes, and the fixed shards' Zarr index. Returns the ragged shapes (or None)."""
        try_read(problems, self.node, lambda: self.check_meta(root, n, K))
        crc = try_read(problems, self.crc_node, lambda: read_plain_array(root, self.crc_node)) if crc_known else None
        if crc is not None and crc.shape != (n,):
            problems.append(Problem(self.crc_node, f"has {crc.shape} entries, expected ({n},)"))
            crc = None
        offsets = shapes = None
        if not self.fixed:
            offsets = try_read(problems, self.offsets_node, lambda: read_plain_array(root, self.offsets_node))
            shapes = try_read(problems, self.shapes_node, lambda: read_plain_array(root, self.shapes_node))
            if offsets is not None and shapes is not None and (offsets.shape != (n + 1,)
                                                               or shapes.shape != (n, self.ndim)):
                problems.append(Problem(self.offsets_node, f"offsets {offsets.shape} / shapes {shapes.shape} do "
                                                           f"not fit {n} samples"))
                offsets = shapes = None
            if offsets is not None and shapes is not None:
                sizes = np.diff(offsets)
                bad = (sizes < 0) | bad_shapes(shapes, sizes, self.channels)
                if offsets[0] != 0 or bad.any():
                    problems.append(Problem(self.offsets_node, "offsets / shapes are inconsistent",
                                            np.flatnonzero(bad).tolist()))
        for s, spec in enumerate(shards):
            if spec is None:  # a slot this version does not use
                continue
            samples = list(range(s * K, s * K + spec.count))
            try:
                size = root.size(spec.path)
            except CorruptDatasetError as e:
                problems.append(Problem(spec.path, str(e), samples))
                continue
            if size != spec.nbytes:  # before reading it: a shard's size is bounded by its manifest entry
                problems.append(Problem(spec.path, f"has {size} bytes, the manifest says {spec.nbytes}", samples))
                continue
            data = np.frombuffer(root.read(spec.path), np.uint8)
            if hashlib.sha256(data).hexdigest() == spec.sha256:
                continue
            damaged = []
            ranges = self._sample_ranges(s, spec, K, offsets)
            if crc is not None and ranges is not None:
                import google_crc32c

                damaged = [i for i, (a, b) in ranges if google_crc32c.value(data[a:b].tobytes()) != int(crc[i])]
            what = "content does not match its SHA-256"
            if self.fixed:
                tail = data[spec.count * self.sample_nbytes:].tobytes()
                if tail != shard_index(spec.count, K, self.sample_nbytes):
                    what += "; its Zarr shard index is damaged (zarr readers affected)"
            problems.append(Problem(spec.path, what, damaged))
        return shapes

    def _sample_ranges(self, s: int, spec: ShardSpec, K: int, offsets):
        """[(sample, (start, end))] byte ranges of the shard's samples within its file."""
        first = s * K
        if self.fixed:
            nb = self.sample_nbytes
            return [(first + j, (j * nb, (j + 1) * nb)) for j in range(spec.count)]
        if offsets is None:
            return None
        base, it = int(offsets[first]), self.itemsize
        return [(first + j, ((int(offsets[first + j]) - base) * it, (int(offsets[first + j + 1]) - base) * it))
                for j in range(spec.count)]


def _rmtree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


# ----------------------------------------------------------------------------- shard writers
class ShardWriter:
    """Appends samples in order, hashes while writing, closes the file when done.

    Written at its final name (``NewFile``'s ``in_place``: no private name, no rename): a shard file is only ever
    written where no reader looks until a commit names it (a compile's private staging, an update's or a
    compaction's new slot), and what a crash leaves there is torn but never trusted: resume re-hashes every shard
    it keeps against its journal entry, written only once the shard is closed. Every OSError becomes
    :class:`WriteError` naming the shard (disk full, limits)."""

    def __init__(self, root: Path, pixels: Pixels, rel_path: str):
        self.pixels = pixels
        self.rel_path = check_node_path(rel_path)
        self.root = root
        try:
            self._f = NewFile(None, root, rel=rel_path, in_place=True)  # (never through a link; no path built)
        except OSError as e:
            raise WriteError.writing(self.path, e) from None
        self._hash = hashlib.sha256()
        self.count = 0
        self.nbytes = 0

    @property
    def path(self) -> Path:
        return node_dir(Path(self.root), self.rel_path)

    def _put(self, data: bytes | memoryview) -> None:
        try:
            self._f.write(data)
        except OSError as e:
            raise WriteError.writing(self.path, e) from None
        self._hash.update(data)
        self.nbytes += len(data)

    def write(self, sample: np.ndarray) -> np.ndarray:
        """Append one sample; returns it as written (C-contiguous, little-endian)."""
        a = np.ascontiguousarray(sample, dtype=np.dtype(self.pixels.dtype).newbyteorder("<"))
        self._put(memoryview(a).cast("B"))
        self.count += 1
        return a

    def _finish(self) -> None:
        """Hook for the tail of the file (the fixed layout's shard index)."""

    def close(self) -> ShardSpec | None:
        """Publish the shard; returns its spec, or None (and no file) when it holds no sample."""
        if self.count == 0:
            self.abort()
            return None
        self._finish()
        try:
            self._f.commit()
        except OSError as e:
            raise WriteError.writing(self.path, e) from None
        return ShardSpec(path=self.rel_path, count=self.count, nbytes=self.nbytes, sha256=self._hash.hexdigest())

    def abort(self) -> None:
        self._f.abort()


class FixedShardWriter(ShardWriter):
    """Shard ``s`` of a fixed array, in the Zarr sharding codec's byte layout."""

    def __init__(self, root: Path, pixels: Pixels, s: int, capacity: int):
        super().__init__(root, pixels, pixels.shard_path(s))
        self.capacity = capacity

    def write(self, sample: np.ndarray) -> np.ndarray:
        if sample.shape != self.pixels.sample_shape:
            raise ValueError(f"sample shape {sample.shape} != {self.pixels.sample_shape}")
        if self.count >= self.capacity:
            raise ValueError("shard is full")
        return super().write(sample)

    def _finish(self) -> None:
        self._put(shard_index(self.count, self.capacity, self.pixels.sample_nbytes))


class RaggedShardWriter(ShardWriter):
    """Shard ``s`` of a ragged field: one plain 1-D Zarr array of all its samples' elements."""

    def __init__(self, root: Path, pixels: Pixels, s: int):
        super().__init__(root, pixels, pixels.shard_path(s))
        self._node = node_dir(root, pixels.shard_node(s))

    def _finish(self) -> None:
        write_atomic(self._node / ZARR_JSON, ragged_shard_meta(self.nbytes, self.pixels.dtype), self.root)


# ----------------------------------------------------------------------------- reading
class PixelsReader:
    """Samples of one image-like field through a store (``store.map(path, nbytes)`` -> flat uint8 array,
    ``store.array(rel, shape)`` -> a small array). Outputs come from ``alloc(name, shape, dtype)``.

    ``reads`` (optional, every read method): the runtime's read strategy for a Loader's batches, in place of
    the store's own mappings. A mapping strategy has ``map(path, nbytes)`` like the store; a direct one
    (``reads.direct``) copies bytes from the shard files straight into the output:
    ``reads.read(shards, slots, file_offsets, sizes, dest, dest_offsets)`` puts ``sizes[k]`` bytes of shard
    ``shards[slots[k]]`` at ``file_offsets[k]`` into ``dest[dest_offsets[k]:]``, and ``reads.scratch(n)`` is
    a reusable buffer of the calling thread (samples that need per-sample work land there first)."""

    need = None  # (slots,) int64 or None: the rows each slot's shard must hold (the version's live rows)

    def __init__(self, pixels: Pixels, store, shards: tuple[ShardSpec, ...], n: int, K: int):
        self.px, self.store, self.shards, self.n, self.K = pixels, store, shards, n, K
        self.name = pixels.node
        # a shard table (format 4) is read when a slot is first read, and its entry checked then; listed shards
        # are checked here, at open
        self._checked = np.zeros(len(shards), bool) if isinstance(shards, ShardColumn) else None
        if not pixels.fixed:
            self.offsets = store.array(pixels.offsets_node, (n + 1,))
            self.shapes = store.array(pixels.shapes_node, (n, pixels.ndim))
            starts = self.offsets[np.minimum(np.arange(len(shards) + 1) * K, n)]
            recorded = None if self._checked is not None else np.array(
                [s.nbytes if s is not None else 0 for s in shards], np.int64)
            if not valid_offsets(self.offsets) or (recorded is not None and not np.array_equal(
                    np.diff(starts) * pixels.itemsize, recorded)):
                raise CorruptDatasetError(f"{store.root}: {pixels.offsets_node} disagrees with the shard sizes in "
                                          f"the manifest; the dataset is damaged. Recompile it")
            bad = bad_shapes(self.shapes, np.diff(self.offsets), pixels.channels)
            if bad.any():
                raise CorruptDatasetError(f"{store.root}: {pixels.shapes_node} disagrees with {pixels.offsets_node} "
                                          f"(sample {int(np.flatnonzero(bad)[0])}); the dataset is damaged. Recompile it")
            self.shard_starts = starts

    def _spec(self, s: int) -> ShardSpec:
        if self._checked is not None:  # (a storage a spawned worker could not re-open says why, before the table)
            getattr(self.store, "dir", None)
        spec = self.shards[s]
        if self._checked is not None and not self._checked[s]:
            self._check_slot(s, spec)
        if spec is None:
            raise CorruptDatasetError(f"{self.store.root}: shard slot {s} of {self.px.node} is not part of this version")
        return spec

    def _check_slot(self, s: int, spec: ShardSpec | None) -> None:
        """A slot's shard (from a shard table) when first read: it holds the version's rows there, and (ragged)
        the bytes the offsets give its samples."""
        need = int(self.need[s]) if self.need is not None and s < len(self.need) else 0
        if need > (spec.count if spec is not None else 0):
            raise CorruptDatasetError(f"{self.store.root}: live marks rows of slot {s} that no shard of the version "
                                      f"holds; the dataset is damaged")
        check = getattr(self.store, "check_shard", None)
        if spec is not None and check is not None:
            check(spec.path, spec.nbytes)
        if spec is not None and not self.px.fixed and \
                int(self.shard_starts[s + 1] - self.shard_starts[s]) * self.px.itemsize != spec.nbytes:
            raise CorruptDatasetError(f"{self.store.root}: {self.px.offsets_node} disagrees with the size of "
                                      f"{spec.path} in the shard table; the dataset is damaged. Recompile it")
        self._checked[s] = True

    def shard(self, s: int, reads=None) -> np.ndarray:
        """Shard ``s``: (count, *sample) for fixed samples, else its flat elements."""
        spec = self._spec(s)
        px = self.px
        flat = (reads or self.store).map(spec.path, spec.nbytes)
        if px.fixed:  # the samples, then the Zarr shard index
            return flat[:spec.count * px.sample_nbytes].view(px.dtype).reshape(spec.count, *px.sample_shape)
        return flat.view(px.dtype)

    def sample(self, i: int, reads=None) -> np.ndarray:
        """Sample ``i`` as a view of its shard."""
        s = i // self.K
        if self.px.fixed:
            return self.shard(s, reads)[i - s * self.K]
        start = self.shard_starts[s]
        return self.shard(s, reads)[int(self.offsets[i] - start):int(self.offsets[i + 1] - start)].reshape(
            self.shapes[i].tolist())

    def extents(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(shard slot, byte offset in the shard file, byte size) of each sample ``idx``: where a direct read
        finds it."""
        idx = np.asarray(idx, np.int64)
        slots = idx // self.K
        for s in np.unique(slots).tolist():
            self._spec(s)
        if self.px.fixed:
            nb = self.px.sample_nbytes
            return slots, (idx - slots * self.K) * nb, np.full(len(idx), nb, np.int64)
        it = self.px.itemsize
        return (slots, (self.offsets[idx] - self.shard_starts[slots]) * it,
                (self.offsets[idx + 1] - self.offsets[idx]) * it)

    def _read_direct(self, idx: np.ndarray, reads, dest: np.ndarray, dest_offsets: np.ndarray) -> None:
        slots, offsets, sizes = self.extents(idx)
        reads.read(self.shards, slots, offsets, sizes, dest, dest_offsets)

    def samples(self, idx: np.ndarray, reads=None) -> list[np.ndarray]:
        """Samples ``idx`` as arrays, for per-sample work (padding, transforms run in the gather): views of
        their shards, or, with direct reads, of this thread's scratch buffer (valid until its next use)."""
        if reads is None or not reads.direct:
            return [self.sample(i, reads) for i in idx.tolist()]
        px = self.px
        if px.fixed:
            sizes = np.full(len(idx), px.sample_nbytes, np.int64)
        else:
            sizes = (self.offsets[idx + 1] - self.offsets[idx]) * px.itemsize
        starts = np.zeros(len(idx) + 1, np.int64)
        np.cumsum(sizes, out=starts[1:])
        buf = reads.scratch(int(starts[-1]))
        self._read_direct(idx, reads, buf, starts[:-1])
        shapes = [px.sample_shape] * len(idx) if px.fixed else self.shapes[idx].tolist()
        return [buf[a:b].view(px.dtype).reshape(shape)
                for a, b, shape in zip(starts[:-1].tolist(), starts[1:].tolist(), shapes)]

    def sizes(self, idx: np.ndarray) -> np.ndarray:
        """(B, 2) (height, width) of samples ``idx``."""
        if self.px.fixed:
            return np.tile(np.array([self.px.height, self.px.width], np.int64), (len(idx), 1))
        return self.shapes[idx, :2].astype(np.int64)

    def shard_runs(self, idx: np.ndarray):
        """(shard, start, end, local rows) for each run of consecutive ``idx`` in the same shard."""
        if len(idx) == 0:
            return []
        shard_of = idx // self.K
        local = idx - shard_of * self.K
        cuts = [0, *(np.flatnonzero(np.diff(shard_of)) + 1).tolist(), len(idx)]
        return [(int(shard_of[a]), a, b, local[a:b]) for a, b in zip(cuts[:-1], cuts[1:])]

    def gather(self, idx: np.ndarray, out: np.ndarray, reads=None) -> np.ndarray:
        """Fixed layout: samples ``idx`` into ``out`` (B, *sample), one ``numpy.take`` per run of indices
        that share a shard (sorted indices make every shard one run). ``numpy.take(mode="clip")`` releases
        the GIL and never enters torch's OpenMP pool, so loader threads scale; the indices are checked
        already, and clip mode skips numpy's bounds-checked buffered path. With direct reads, each sample
        is read from its file straight into its row of ``out``."""
        if reads is not None and reads.direct:
            dest = out if out.flags.c_contiguous else np.empty_like(out, order="C")
            self._read_direct(idx, reads, dest.reshape(-1).view(np.uint8),
                              np.arange(len(idx), dtype=np.int64) * self.px.sample_nbytes)
            if dest is not out:
                out[...] = dest
            return out
        for s, a, b, local in self.shard_runs(idx):
            np.take(self.shard(s, reads), local, axis=0, out=out[a:b], mode="clip")
        return out

    def pack(self, idx: np.ndarray, alloc, reads=None, write=None, dtype=None) -> dict[str, np.ndarray]:
        """Ragged: every sample's elements back to back, ``<name>_offsets`` (B+1,), ``<name>_shapes``.
        ``write(k, view, dest)``: puts sample ``k`` (its stored view) into ``dest`` (its place, of its shape)
        instead of a plain copy (a size-keeping transform, e.g. a flip, run in the same pass); ``dtype``: the
        elements' type in the batch when ``write`` converts them (default: as stored)."""
        name = self.name
        if dtype is not None and write is None:
            raise ValueError("pack(dtype=) needs the write= that converts the samples")
        sizes = self.offsets[idx + 1] - self.offsets[idx]
        o = alloc(f"{name}_offsets", (len(idx) + 1,), np.int64)
        o[0] = 0
        np.cumsum(sizes, out=o[1:])
        flat = alloc(name, (int(o[-1]),), np.dtype(dtype or self.px.dtype))
        if write is not None:
            ends = o.tolist()
            for k, v in enumerate(self.samples(idx, reads)):
                write(k, v, flat[ends[k]:ends[k + 1]].reshape(v.shape))
        elif reads is not None and reads.direct and flat.flags.c_contiguous:
            self._read_direct(idx, reads, flat.view(np.uint8), o[:-1] * self.px.itemsize)
        else:
            for k, i in enumerate(idx.tolist()):
                flat[o[k]:o[k + 1]] = self.sample(i, reads).reshape(-1)
        shapes = alloc(f"{name}_shapes", (len(idx), self.px.ndim), np.int32)
        shapes[:] = self.shapes[idx]
        return {name: flat, f"{name}_offsets": o, f"{name}_shapes": shapes}

    def pad(self, idx: np.ndarray, alloc, fill: int = 0, reads=None) -> dict[str, np.ndarray]:
        """Ragged: (B, max_h, max_w[, C]) padded with ``fill`` at the bottom/right, ``<name>_sizes`` (B, 2)."""
        name, px = self.name, self.px
        shapes = self.shapes[idx]
        hw = shapes[:, :2].max(axis=0) if len(idx) else np.zeros(2, np.int64)
        tail = (px.channels,) if px.channels is not None else ()
        out = alloc(name, (len(idx), int(hw[0]), int(hw[1]), *tail), np.dtype(px.dtype))
        out[:] = fill
        for k, v in enumerate(self.samples(idx, reads)):
            h, w = shapes[k, :2]
            out[k, :h, :w] = v
        sizes = alloc(f"{name}_sizes", (len(idx), 2), np.int64)
        sizes[:] = shapes[:, :2]
        return {name: out, f"{name}_sizes": sizes}
