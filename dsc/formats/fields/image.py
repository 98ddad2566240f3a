"""The ``image`` field: uint8 (H, W, C) pixels, fixed or ragged (see ``pixels.py``).

Manifest: ``image`` (layout, channels, mode, height, width), ``resize`` and ``shards`` (the image
shards, which define the dataset's shard grid). Per-sample crc32c at ``checksums/crc32c``.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..shardtable import ENTRY
from ..specs import ImageSpec, ResizeSpec, ShardSpec
from .base import Field, LazySequence, Part, Parts, Reader, Role, run_index
from .pixels import Pixels
from ...errors import CorruptDatasetError


class PixelsPart(Part):
    """A unit's samples of an image-like field: its shard file, and each sample's shape and crc32c."""

    def __init__(self, pixels: Pixels, writer=None, shard: ShardSpec | None = None, shapes=None, crc=None):
        self.pixels, self.writer, self.shard = pixels, writer, shard
        self.shapes = [] if shapes is None else shapes
        self.crc = [] if crc is None else crc

    def add(self, value: np.ndarray) -> None:
        import google_crc32c

        written = self.writer.write(value)
        self.shapes.append(value.shape)
        self.crc.append(google_crc32c.value(written))

    def close(self) -> "PixelsPart":
        self.shard = self.writer.close()
        self.writer = None
        return self

    def abort(self) -> None:
        if self.writer is not None:
            self.writer.abort()
            self.writer = None  # a part travels back to the driver: no open file in it

    def pad(self, n: int) -> None:
        self.shapes.extend([(0, 0, self.pixels.channels) if self.pixels.channels is not None else (0, 0)] * n)
        self.crc.extend([0] * n)

    def shapes_array(self) -> np.ndarray:
        return np.asarray(self.shapes, np.int32).reshape(-1, self.pixels.ndim)

    def to_json(self) -> dict:
        return {"shard": self.shard.to_dict() if self.shard else None, "shapes": self.shapes_array().tolist(),
                "crc": [int(c) for c in self.crc]}

    @classmethod
    def from_json(cls, pixels: Pixels, d: dict) -> "PixelsPart":
        return cls(pixels, shard=ShardSpec.from_dict(d["shard"]) if d["shard"] else None,
                   shapes=[tuple(s) for s in d["shapes"]], crc=[int(c) for c in d["crc"]])


class PixelsParts(Parts):
    """An image-like field's parts of a compile's units, as flat arrays: each slot's shard-table entry (count,
    size, SHA-256: ``shardtable.ENTRY`` bytes) and each input's crc32c (and, ragged, shape) by position, so that the
    driver holds ~48 bytes a unit and ~4-16 a sample, not a part object a unit. Unit ``u`` is slot ``s0 + u``."""

    def __init__(self, pixels: Pixels, S: int, N: int, K: int, s0: int = 0):
        self.pixels, self.K, self.s0 = pixels, K, s0
        self._buf = bytearray(S * ENTRY)  # (filled by slice: a numpy item assignment a field costs more)
        self.entries = np.frombuffer(self._buf, np.uint8).reshape(S, ENTRY)
        self.shapes = None if pixels.fixed else np.zeros((N, pixels.ndim), np.int32)  # (fixed: the layout's)
        self.crc = np.zeros(N, np.uint32)
        self.kept: np.ndarray | None = None
        self._moved: dict[int, str] = {}  # a shard whose path is not its slot's (none that dsc writes)

    def add(self, u: int, part: PixelsPart, rows: np.ndarray) -> None:
        n = len(rows)
        if n:
            at = run_index(rows)
            self.crc[at] = part.crc
            if self.shapes is not None:
                self.shapes[at] = part.shapes_array()
        self.set_shard(u, part.shard)

    def settle(self, kept: np.ndarray) -> None:
        self.kept = kept

    def keep_slots(self, S: int) -> None:
        """(The slots after the last shard hold none: ``finish`` ends at the last.)"""

    def set_shard(self, u: int, shard: ShardSpec | None) -> None:
        at = u * ENTRY
        if shard is None:
            self._buf[at:at + ENTRY] = bytes(ENTRY)
            return
        self._buf[at:at + ENTRY] = (shard.count.to_bytes(8, "little") + shard.nbytes.to_bytes(8, "little")
                                    + bytes.fromhex(shard.sha256))
        if shard.path != self.pixels.shard_path(self.s0 + u):
            self._moved[u] = shard.path

    def _head(self, u: int) -> tuple[int, int]:
        at = u * ENTRY
        return int.from_bytes(self._buf[at:at + 8], "little"), int.from_bytes(self._buf[at + 8:at + 16], "little")

    def path(self, u: int) -> str:
        return self._moved.get(u) or self.pixels.shard_path(self.s0 + u)

    def shard(self, u: int) -> ShardSpec | None:
        count, nbytes = self._head(u)
        if count == 0:
            return None
        at = u * ENTRY
        return ShardSpec.made(self.path(u), count, nbytes, self._buf[at + 16:at + ENTRY].hex())

    def rows(self, u: int) -> np.ndarray:
        """The inputs unit ``u``'s samples are (once settled)."""
        lo = u * self.K
        return lo + np.flatnonzero(self.kept[lo:lo + self.K])

    def _shapes(self, rows: np.ndarray) -> np.ndarray:
        if self.shapes is None:
            return np.broadcast_to(np.asarray(self.pixels.sample_shape, np.int32), (len(rows), self.pixels.ndim))
        return self.shapes[rows]

    def __len__(self) -> int:
        return len(self.entries)

    def __getitem__(self, u):
        if isinstance(u, slice):
            return [self[i] for i in range(*u.indices(len(self)))]
        rows = self.rows(u)
        return PixelsPart(self.pixels, shard=self.shard(u), shapes=[tuple(x) for x in self._shapes(rows).tolist()],
                          crc=self.crc[rows].tolist())

    def finish(self, root: Path, n: int, K: int) -> "ShardList":
        """``finish_pixels`` from the arrays (no part made a unit)."""
        kept = np.flatnonzero(self.kept)
        self.pixels.write_meta(root, n, K, self._shapes(kept), self.crc[kept])
        counts = np.ascontiguousarray(self.entries[:, :8]).view("<u8").reshape(-1)
        present = np.flatnonzero(counts)
        return ShardList(self, int(present[-1]) + 1 if len(present) else 0, len(present))


class ShardList(LazySequence):
    """The shards of a compile's slots as a sequence of ShardSpec / None made on access (``PixelsParts``), which
    ``shardtable.build`` reads as its entries at once (``entries``) rather than a spec a shard."""

    def __init__(self, parts: PixelsParts, S: int, present: int):
        self.parts, self.S, self.present = parts, S, present

    def __len__(self) -> int:
        return self.S

    def _item(self, s: int):
        return self.parts.shard(s)

    def paths(self):
        """The path of every shard, in slot order (no spec made)."""
        return (self.parts.path(s) for s in range(self.S) if self.parts._head(s)[0])

    def entries(self) -> np.ndarray | None:
        """(S, ENTRY) uint8: each slot's table entry (None: a shard is not at its slot's path; read it by spec)."""
        return None if self.parts._moved else self.parts.entries[:self.S]


def finish_pixels(pixels: Pixels, root: Path, parts: PixelsParts, n: int, K: int) -> "ShardList":
    """The metadata of an image-like field once its shards are written (and compacted): ``parts`` as
    ``Field.collect`` gathers them (a compile's units, an update's or a compaction's slots: compile.fold_slots)."""
    return parts.finish(root, n, K)


def pixels_rows_part(pixels: Pixels, reader: "PixelsReaderField", start: int, count: int, shard) -> PixelsPart:
    """Rows of an open version's image-like field, as a part (shapes and checksums; the shard as it is)."""
    px = reader.px
    if px.px.fixed:
        shapes = [tuple(px.px.sample_shape)] * count
    else:
        shapes = [tuple(v) for v in px.shapes[start:start + count].tolist()]
    crc = reader.crc[start:start + count].tolist()
    return PixelsPart(pixels, shard=shard, shapes=shapes, crc=[int(c) for c in crc])


class PixelsReaderField(Reader):
    """Reads an image-like field: ``ds[i][name]`` is a view of its shard; batches are (B, *sample) for
    fixed samples, packed (flat + ``<name>_offsets`` + ``<name>_shapes``) or padded (+ ``<name>_sizes``,
    padded with ``fill``) for ragged ones."""

    def __init__(self, pixels: Pixels, store, shards, n: int, K: int, fill: int = 0):
        self.px = pixels.reader(store, shards, n, K)
        self.name, self.fill = pixels.node, fill
        self._store, self._crc, self._n = store, None, n

    @property
    def crc(self) -> np.ndarray:
        """(rows,) uint32 crc32c of each sample's stored bytes (read on first use)."""
        if self._crc is None:
            self._crc = self._store.array(self.px.px.crc_node, (self._n,))
        return self._crc

    def sample(self, i: int) -> dict:
        return {self.name: self.px.sample(i)}

    def gather(self, idx: np.ndarray, alloc, forms: dict) -> dict:
        px, reads = self.px.px, forms.get("reads")
        if px.fixed:
            out = alloc(self.name, (len(idx), *px.sample_shape), np.dtype(px.dtype))
            return {self.name: self.px.gather(idx, out, reads)}
        if forms.get("images") == "padded":
            return self.px.pad(idx, alloc, self.fill, reads)
        return self.px.pack(idx, alloc, reads)

    def split(self, batch: dict, k: int) -> dict:
        name = self.name
        if f"{name}_offsets" in batch:
            o = batch[f"{name}_offsets"]
            return {name: batch[name][int(o[k]):int(o[k + 1])].reshape(tuple(batch[f"{name}_shapes"][k].tolist()))}
        if f"{name}_sizes" in batch:
            h, w = (int(v) for v in batch[f"{name}_sizes"][k].tolist())
            return {name: batch[name][k, :h, :w]}
        return {name: batch[name][k]}


class PixelsField(Field):
    """A field whose samples are pixels (``self.pixels``: the image, a mask): its parts are its shards' writers,
    collected and carried over from a base version as every image-like field's."""

    pixels: Pixels

    def part(self, root: Path, s: int, capacity: int) -> PixelsPart:
        return PixelsPart(self.pixels, self.pixels.writer(root, s, capacity))

    def load_part(self, d: dict) -> PixelsPart:
        return PixelsPart.from_json(self.pixels, d)

    def collect(self, S: int, N: int, K: int, s0: int = 0) -> PixelsParts:
        return PixelsParts(self.pixels, S, N, K, s0)

    def rows_part(self, reader, start: int, count: int, shard) -> PixelsPart:
        return pixels_rows_part(self.pixels, reader, start, count, shard)

    def empty_part(self) -> PixelsPart:
        return PixelsPart(self.pixels)


class ImageField(PixelsField):
    kind = "image"
    name = "image"

    def __init__(self, spec: ImageSpec, resize: ResizeSpec | None = None, shards: tuple[ShardSpec, ...] = ()):
        self.spec, self.resize, self.shards = spec, resize, shards
        self.pixels = Pixels("image", "uint8", spec.layout, spec.channels, spec.height, spec.width,
                             crc_node="checksums/crc32c")

    @classmethod
    def from_manifest(cls, m) -> list["ImageField"]:
        return [cls(m.image, m.resize, m.shards)]

    def finish(self, root: Path, parts, n: int, K: int) -> dict:
        return {"image": self.spec, "resize": self.resize, "shards": finish_pixels(self.pixels, root, parts, n, K)}

    def reader(self, store, m) -> PixelsReaderField:
        return PixelsReaderField(self.pixels, store, self.shards, m.num_rows, m.shard_size)

    @staticmethod
    def same_geometry(image: PixelsReaderField, other: PixelsReaderField, where: str) -> None:
        """Another image-like field's samples have the image's (height, width) (ragged: checked per sample)."""

        if not image.px.px.fixed and not np.array_equal(image.px.shapes[:, :2], other.px.shapes[:, :2]):
            raise CorruptDatasetError(f"{where}: the {other.name} shapes differ from the image shapes; the dataset "
                                      f"is damaged. Recompile it")

    def verify(self, root: Path, m, problems: list, context: dict) -> None:
        context["image_shapes"] = self.pixels.verify(root, self.shards, m.num_rows, m.shard_size, problems,
                                                     self.pixels.crc_node + "/c/0" in m.files)

    def roles(self) -> dict[str, Role]:
        return {"image": Role("pixels", "bilinear", tail=(self.pixels.channels,))}
