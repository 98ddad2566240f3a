"""``dsc.open``: a compiled dataset as a map-style ``torch.utils.data.Dataset``, with zero decoding.

Opening reads the manifest and the small index arrays (labels; offsets and shapes when ragged; boxes)
and stats the shard files; it creates no per-sample Python object. Each field of the dataset (image,
label, objects, mask: ``formats/fields``) is read through its reader; shards are memory-mapped on first
use by the storage (``storage.py``), so samples are zero-copy views and a batch is one gather per run of
samples in the same shard.
"""
from __future__ import annotations

import operator
import os
from typing import Callable, Sequence

import numpy as np
import torch

from ..errors import ConfigError, CorruptDatasetError, VersionNotFoundError
from ..formats import Manifest
from ..formats import layout as L
from ..formats import versions
from ..formats.coords import invert_affine
from ..formats.shardtable import ShardColumn
from ..store.local import Root
from ..store import open_store
from ..formats.fields import ImageField, fields_of, schema_of
from ..formats.zarr_v3 import read_string_array
from .batches import (BOX_FORMS, CAST_KEY, IMAGE_FORMS, Batch, Sample, SampleBatch, as_tensors, box_form, cast_image,
                      collate, divisor_255, new_tensor, torch_dtype, numpy_alloc)
from .storage import Storage
from ..errors import DscError
from ..transforms.fused import run_batch, run_program
from ..transforms.objects import flip_only, move_objects
from ..transforms.resample import apply_plan
from .remote import open_remote
from .schedule import shard_needs

Allocator = Callable[[str, tuple, torch.dtype], torch.Tensor]

__all__ = ["Dataset", "SampleBatch", "collate", "open"]


def check_forms(boxes, images, allow_none: bool = False) -> None:
    if not ((allow_none and boxes is None) or boxes in BOX_FORMS):
        raise ConfigError(f"boxes must be one of {', '.join(BOX_FORMS)}, got {boxes!r}")
    if not ((allow_none and images is None) or images in IMAGE_FORMS):
        raise ConfigError(f"images must be one of {', '.join(IMAGE_FORMS)}, got {images!r}")


def not_a_dataset(obj, who: str, subset: bool = False,
                  takes: str = "a dsc dataset, the path of one, or a torch.utils.data.Subset of one") -> ConfigError:
    """The error for anything given where a compiled dataset (or its path) belongs: what it is, and the fix
    (``takes``: what ``who`` accepts)."""
    kind = f"{type(obj).__module__}.{type(obj).__qualname__}".replace("builtins.", "")
    inner = "a torch.utils.data.Subset of " if subset else ""
    return ConfigError(f"{who} reads datasets compiled by dsc, and got {inner}{kind}. Compile it first with "
                       f"dsc.compile(dataset, 'OUT') (or `dsc compile ...`), then read dsc.open('OUT'); {who} takes "
                       f"{takes}")


def _rows_needed(live: np.ndarray, K: int, slots: int) -> np.ndarray:
    """(slots,) int64: one past the last live row's position in each slot (0: no live row), what the slot's
    shard must hold at least."""
    pad = np.zeros(slots * K, bool)
    pad[:len(live)] = live[:slots * K]
    grid = pad.reshape(slots, K)
    return np.where(grid.any(axis=1), K - np.argmax(grid[:, ::-1], axis=1), 0).astype(np.int64)


class _FullSlots:
    """``_rows_needed`` of a version whose rows are all live, without its ``live`` array: slot s's shard holds
    its K rows (the last slot, the rest)."""

    def __init__(self, K: int, rows: int):
        self.K, self.rows = K, rows

    def __len__(self) -> int:
        return -(-self.rows // self.K)

    def __getitem__(self, s: int) -> int:
        return max(0, min(self.K, self.rows - int(s) * self.K))


def _closed(where, what: str, ask: str) -> DscError:
    return DscError(f"{where}: this handle was closed before it first read its {what}, and once closed it no longer "
                    f"holds its version (dsc vacuum may have removed it). Read them before close() (e.g. {ask}), or "
                    f"open the dataset again (dsc.open)")


def _read_after_close(closed: bool, read, where, what: str, ask: str):
    """``read()`` of an array read on first use. A closed handle still reads it (``with dsc.open(p) as ds:
    loader = dsc.Loader(ds)``, then training after the block, works as long as the version is there); where the
    read fails once closed (a vacuum removed the version), the error names the fix instead of the missing file."""
    try:
        return read()
    except (DscError, OSError) as e:
        if closed:
            raise _closed(where, what, ask) from e
        raise


def _read_live(storage, m: Manifest, where, closed: bool = False) -> np.ndarray:
    """A version's ``live`` array (a byte a row), checked: it marks as many rows as the manifest has samples."""
    live = _read_after_close(closed, lambda: storage.array(L.LIVE, (m.num_rows,)), where,
                             "live array (which rows are samples)", "len(ds.keys), or any sample")
    if int(live.sum()) != m.num_samples:
        raise CorruptDatasetError(f"{where}: {L.LIVE} marks {int(live.sum())} samples, the manifest says "
                                  f"{m.num_samples}; the dataset is damaged")
    return live


class _Live:
    """A shard-table version with removed rows: its ``live`` array (``_read_live``) read when first needed, not at
    open. ``rows``: sample -> row; as a sequence, ``_rows_needed`` per slot (what a pixel reader checks each slot's
    shard against when it first reads it)."""

    def __init__(self, storage, m: Manifest, where):
        self._storage, self._m, self._where = storage, m, where
        self._rows = self._need = None

    def read(self) -> None:
        if self._rows is not None:
            return
        m = self._m
        live = _read_live(self._storage, m, self._where, self._storage.closed)
        self._need = _rows_needed(live, m.shard_size, len(m.shards))
        self._rows = np.flatnonzero(live).astype(np.int64)

    @property
    def rows(self) -> np.ndarray:
        self.read()
        return self._rows

    def __len__(self) -> int:
        self.read()
        return len(self._need)

    def __getitem__(self, s: int) -> int:
        self.read()
        return self._need[s]


class Dataset(torch.utils.data.Dataset):
    """A compiled dsc dataset. ``ds[i]`` -> ``{"image": uint8 (H, W, C), "label": int}`` (classification),
    ``{"image", "boxes": (k, 4) float32 xyxy, "labels": (k,) int64, "image_id", "orig_size", ...}``
    (detection), plus ``"mask": (H, W)`` when the dataset has masks, and every value field under its name
    (numbers, arrays, ragged rows, text, json, bytes: ``formats/fields/columns.py``). ``boxes`` picks the detection batch
    form (packed | padded | list) and ``images`` how ragged images batch (packed bytes + shapes, or padded
    to the batch's largest + true sizes)."""

    # its gather runs a size-keeping chain (flips) on mixed sizes straight into the packed batch (the Loader
    # then hands it the chain: Compose.gather_plan(keep_sizes=True))
    gathers_own_sizes = True

    def __init__(self, path: str | os.PathLike, boxes: str = "packed", images: str = "packed",
                 version: int | None = None, tag: str | None = None, cache_dir: str | os.PathLike | None = None,
                 cache_limit: int | str | None = None, retry_seconds: float | None = None):
        if not isinstance(path, (str, os.PathLike)):
            raise not_a_dataset(path, "dsc.open")
        check_forms(boxes, images)
        self.box_form, self.image_form = boxes, images
        self._record = None
        store = open_store(path, retry_seconds)
        if not store.local:  # object storage: small files fetched now, shards through the local cache (remote.py)

            self.path = store.url
            self._record, self.storage = open_remote(store, version, tag, cache_dir, cache_limit, retry_seconds)
            self.manifest: Manifest = self._record["manifest"]
            try:
                self._init_readers()
                self.labels  # (read now, as every small file of a remote version: `dsc cache clear` may remove the mirror)
                self._rows  # (``live`` too)
            except BaseException:  # (its lease and cache hold go at once, not at garbage collection)
                self.storage.close()
                raise
            return
        else:
            if cache_dir is not None or cache_limit is not None:
                raise ConfigError("cache_dir and cache_limit are for datasets in object storage (s3://, gs://, "
                                  "az://); a local dataset is read in place")
            self.path = store.path
            self.storage = self._open_local(version, tag)
        self._init_readers()

    def _init_readers(self) -> None:
        m = self.manifest
        self.fields = fields_of(m)
        self.readers = {f.name: f.reader(self.storage, m) for f in self.fields}
        self._rows_at = self._live = None  # sample -> row (None: the same), or ``live`` read when first used
        if m.versioned and m.num_samples == m.num_rows and m.shard_table is not None:  # every row live: ``live``
            # says nothing the manifest does not (not read at open: a byte a row; `dsc verify` checks it); each slot's
            # shard is checked to hold its rows when first read
            for px in self._pixel_readers():
                px.need = _FullSlots(m.shard_size, m.num_rows)
        elif m.versioned and m.shard_table is not None:  # rows removed: ``live`` read when first needed, not at open
            self._live = _Live(self.storage, m, self.path)
            for px in self._pixel_readers():
                px.need = self._live
        elif m.versioned:  # (format 3: its listed shards are checked against ``live`` at open)
            live = _read_live(self.storage, m, self.path)
            if m.num_samples != m.num_rows:
                self._rows_at = np.flatnonzero(live).astype(np.int64)
            self._check_rows(np.flatnonzero(live))
        self._n = m.num_samples
        self.schema = schema_of(self.fields)
        self._image = self.readers["image"]
        for name in self.schema.pixels():  # every image-like field has the image's geometry, sample by sample
            if name != "image" and name in self.readers:
                ImageField.same_geometry(self._image, self.readers[name], str(self.path))
        self._labels: torch.Tensor | None = None
        self._affine = self._orig_sizes = None  # loaded on first use
        self._keys: list[str] | None = None

    @property
    def _closed(self) -> bool:
        """Whether the handle let go of its version (its storage closed: see ``close``)."""
        return self.storage.closed

    @property
    def _rows(self) -> np.ndarray | None:
        """Sample -> row (None: the same numbers), ``live`` read on first use where rows were removed."""
        return self._live.rows if self._live is not None else self._rows_at

    @property
    def labels(self) -> torch.Tensor | None:
        """(N,) int64 class index of every sample (classification; None otherwise), read when first asked for."""
        if self._labels is None and "label" in self.readers:
            labels = _read_after_close(self._closed, lambda: self.readers["label"].labels, self.path, "labels",
                                       "ds.labels")
            self._labels = torch.from_numpy(labels if self._rows is None else labels[self._rows])
        return self._labels

    def _open_local(self, version, tag) -> Storage:
        root = Root(self.path)  # every later read is relative to this directory: one dataset, never a mix
        pin = None
        if versions.is_versioned(root):
            self._record, pin = versions.open_version(root, version, tag)  # pinned while this handle lives
            self.manifest = self._record["manifest"]
        else:
            if version not in (None, 0) or tag is not None:
                raise VersionNotFoundError(f"{self.path} was compiled by a dsc without versions: it has only "
                                           f"version 0 and no tags")
            self.manifest = L.read_manifest(root)
        m = self.manifest
        if m.shard_table is None:  # (a shard table's: each shard's size is checked when it is first mapped)
            L.check_shard_files(root, m)
        return Storage(root, m.checksum(), m.version["number"] if m.version else None, pin)

    @property
    def remote(self) -> bool:
        """Whether the dataset is read from object storage through the local shard cache."""
        return getattr(self.storage, "remote", False)

    def _pixel_readers(self) -> list:
        return [r.px for r in self.readers.values() if getattr(r, "px", None) is not None]

    @property
    def shard_bytes(self) -> int:
        """Bytes of every shard file this version reads (its image, mask... shards): what reading it whole
        puts in memory."""
        table = self.manifest.shard_table
        if table is not None:  # (recorded in the manifest: the table is not read for it)
            return table.ref["nbytes"]
        return int(self.slot_bytes().sum())

    def slot_bytes(self) -> np.ndarray:
        """Bytes of the shard files of each slot (its image, mask... shards; 0 for a slot the version lacks)."""
        pxs = self._pixel_readers()
        out = np.zeros(max((len(px.shards) for px in pxs), default=0), np.int64)
        for px in pxs:
            if not px.px.fixed:  # (ragged: the offsets read at open give each shard's size, what its entry is
                out[:len(px.shards)] += np.diff(px.shard_starts) * px.px.itemsize  # checked against: no table read)
                continue
            if isinstance(px.shards, ShardColumn):  # (a shard table: one vector read)
                out[:len(px.shards)] += px.shards.nbytes()
                continue
            for s, spec in enumerate(px.shards):
                if spec is not None:
                    out[s] += spec.nbytes
        return out

    def largest_slots_bytes(self, n: int, within: int | None = None) -> int:
        """The bytes of the shard files of the ``n`` largest slots: the most a batch that touches ``n`` slots
        reads. A shard table of fixed layouts answers from its layout (``ShardTable.largest_slots_bytes``: ``n``
        full shards, at most the version's total), a ragged layout from its offsets (``slot_bytes``), neither
        reading an entry, so a Loader over a remote dataset fetches none of the table for it. The layout's
        figure is an upper bound (exact when ``n`` slots are full; updates leave partial slots): where it is
        above ``within`` (the cache share the caller compares it with), the exact figure is read instead, so
        the choice is the one the exact sizes give."""
        table = self.manifest.shard_table
        bound = table.largest_slots_bytes(n) if table is not None else None
        if bound is not None and (within is None or bound <= within):
            return bound
        sizes = self.slot_bytes()
        return int(np.sort(sizes[sizes > 0])[::-1][:n].sum())

    def shard_plan(self, batches: list[np.ndarray]) -> tuple[list[np.ndarray], list[str], np.ndarray]:
        """For an epoch's batches (sample indices): ``(needs, paths, nbytes)``, ``needs[j]`` the shard files
        batch j reads as keys into ``paths`` / ``nbytes`` (every image-like field's shard of each slot the
        batch touches), in storage order. What a read schedule walks (``schedule.py``)."""

        pxs = self._pixel_readers()
        nslots = max(len(px.shards) for px in pxs)
        by_batch = shard_needs([self._to_rows(np.asarray(b, np.int64)) for b in batches], self.manifest.shard_size)
        touched = np.unique(np.concatenate(by_batch)) if by_batch else np.zeros(0, np.int64)
        table = self.manifest.shard_table
        if table is not None:  # (only the entries of the slots the batches touch: a remote table by page, issue 34)
            table.load(touched)
        key_of = np.full((nslots, len(pxs)), -1, np.int64)
        paths, nbytes = [], []
        for f, px in enumerate(pxs):
            for s in touched[touched < len(px.shards)].tolist():
                spec = px.shards[s]
                if spec is not None:
                    key_of[s, f] = len(paths)
                    paths.append(spec.path)
                    nbytes.append(spec.nbytes)
        needs = []
        for slots in by_batch:
            keys = key_of[slots].reshape(-1)
            needs.append(keys[keys >= 0])
        return needs, paths, np.asarray(nbytes, np.int64)

    def _check_rows(self, rows: np.ndarray) -> None:
        """Every sample of the version sits in a shard the version has, inside its count."""
        if len(L.rows_outside_shards(self.manifest, rows)):
            raise CorruptDatasetError(f"{self.path}: {L.LIVE} marks rows that no shard of the version holds; the "
                                      f"dataset is damaged")

    def row(self, values):
        """Per-row ``values`` (or row numbers) for this version's samples: the rows of the shard grid that
        hold them (the same numbers unless samples were removed)."""
        return values if self._rows is None else values[self._rows]

    # --------------------------------------------------------------------------- versions
    @property
    def version(self) -> int:
        """The version this handle reads (0 for a dataset compiled before versions existed)."""
        return self.manifest.version["number"] if self.manifest.version else 0

    def history(self) -> list[dict]:
        """Every version still in the log, oldest first: ``{"version", "parent", "created", "operation",
        "samples", "added", "removed", "changed", "relabelled", "decoded", "tags"}``."""
        if self.manifest.version is None:
            return [{"version": 0, "parent": None, "created": None, "operation": "compile",
                     "samples": self.manifest.num_samples, "tags": []}]
        return versions.history(self.path)

    # --------------------------------------------------------------------------- metadata
    def __len__(self) -> int:
        return self._n

    @property
    def classes(self) -> list[str]:
        return list(self.manifest.classes)

    def box_counts(self) -> np.ndarray:
        """(N,) int64: the number of boxes (object rows) of each of this version's samples; the manifest's
        ``num_boxes`` counts the rows of the shard grid, removed samples' included. Raises KeyError without
        boxes."""
        off = np.asarray(self.readers["objects"].offsets)
        rows = self._to_rows(np.arange(self._n, dtype=np.int64))
        return (off[rows + 1] - off[rows]).astype(np.int64)

    @property
    def class_to_idx(self) -> dict[str, int]:
        return {c: i for i, c in enumerate(self.manifest.classes)}

    @property
    def mask_classes(self) -> list[str] | None:
        """Names of the mask values 0, 1, ... (``ds[i]["mask"]``), or None without masks; empty when the
        source gave none. (Detection datasets name boxes in ``classes`` and mask values here.)"""
        spec = self.manifest.fields.get("mask")
        return list(spec.get("classes") or ()) if spec else None

    @property
    def ignore_index(self) -> int | None:
        """The mask value of pixels of no class (padding, crowds, borders): ``CrossEntropyLoss(ignore_index=)``."""
        spec = self.manifest.fields.get("mask")
        return int(spec["ignore_index"]) if spec else None

    @property
    def keys(self) -> list[str]:
        """Source path (relative to the source root) or id of every sample; loaded on first use."""
        if self._keys is None:
            keys = _read_after_close(self._closed, lambda: read_string_array(self.storage.dir, L.KEYS), self.path,
                                     "keys", "ds.keys")
            if len(keys) != self.manifest.num_rows:
                raise CorruptDatasetError(f"{self.path}/keys has {len(keys)} entries, expected {self.manifest.num_rows}")
            self._keys = keys if self._rows is None else [keys[r] for r in self._rows.tolist()]
        return self._keys

    @property
    def orig_sizes(self) -> np.ndarray:
        """(N, 2) int32 (height, width) of each decoded source image, EXIF orientation applied."""
        if self._orig_sizes is None:
            self._orig_sizes = self.row(_read_after_close(
                self._closed, lambda: self.storage.array(L.ORIG_SIZE, (self.manifest.num_rows, 2)), self.path,
                "original sizes", "ds.orig_sizes"))
        return self._orig_sizes

    @property
    def affine(self) -> np.ndarray:
        """(N, 4) float64 (sx, sy, tx, ty): stored pixel coordinate = s * original + t."""
        if self._affine is None:
            self._affine = self.row(_read_after_close(
                self._closed, lambda: self.storage.array(L.AFFINE, (self.manifest.num_rows, 4)), self.path,
                "affine transforms", "ds.affine"))
        return self._affine

    def close(self) -> None:
        """Let go of what this handle holds: a remote dataset's cached shards (other processes sharing the cache
        may evict them) and its lease, a local one's pin and mappings: ``dsc vacuum`` may then remove the
        version. Samples already taken stay valid (they keep their mappings). Also on ``with dsc.open(...)``
        exit; a dropped handle does the same when it is deleted. The labels and ``live`` (read when first asked
        for) are not read here (close stays O(1), where reading them would cost a pass over every row for a handle
        that may never need them): a closed handle still reads them while its version is there, and where a vacuum
        removed it, the first ask raises an error naming the fix (ask before ``close()``, or open the dataset
        again)."""
        close = getattr(self.storage, "close", None)
        if close is not None:
            close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self) -> str:
        m = self.manifest
        shape = (f"{m.image.height}x{m.image.width}x{m.image.channels}" if m.image.layout == "fixed"
                 else f"ragged x{m.image.channels}")
        extra = "".join(f", {f.name}" for f in self.fields if f.name not in ("image", "label", "objects"))
        version = f", version {self.version}" if m.version is not None else ""
        return (f"dsc.Dataset({str(self.path)!r}{version}, {self._n} samples, image {shape}{extra}, "
                f"{m.shard_count} shards)")

    # --------------------------------------------------------------------------- storage
    def load_to_ram(self, progress: bool = True) -> None:
        """Read every shard into process memory (``cache="ram"``)."""
        self.storage.load_to_ram(L.shard_specs(self.manifest), progress)

    def _shard(self, s: int) -> torch.Tensor:
        """Image shard ``s`` as a tensor view of the mapping."""
        return torch.from_numpy(self._image.px.shard(s))

    def _check_indices(self, idx) -> np.ndarray:
        idx = np.asarray(idx)
        if idx.size and idx.dtype.kind not in "iu":
            raise TypeError(f"sample indices must be integers, got {idx.dtype}")
        idx = idx.astype(np.int64).reshape(-1)
        if idx.size and (idx.min() < -self._n or idx.max() >= self._n):
            self._out_of_range(idx[(idx < -self._n) | (idx >= self._n)][0])
        return np.where(idx < 0, idx + self._n, idx)

    def _check_index(self, i) -> int:
        """One index (the per-sample path: no arrays built). Negative counts from the end."""
        try:
            i = operator.index(i)
        except TypeError:
            raise TypeError(f"a sample index must be an integer, got {type(i).__name__}") from None
        if not -self._n <= i < self._n:
            self._out_of_range(i)
        return i + self._n if i < 0 else i

    def _out_of_range(self, i):
        raise IndexError(f"index {i} out of range for a dataset of {self._n} samples")

    def __getitem__(self, i: int) -> dict:
        i = self._check_index(i)
        if self._rows is not None:
            i = int(self._rows[i])
        sample = {}
        for r in self.readers.values():
            sample.update(r.sample(i))
        # the sample's own copy (one memcpy): the readers give views of the mapped shard and of the index arrays,
        # which a write would change for every later read through this handle (batches are copies already)
        # (a Sample: a dict that carries the schema, so dsc.collate batches a list of them as the Loader does)
        return Sample({k: torch.from_numpy(v.copy()) if isinstance(v, np.ndarray) else v for k, v in sample.items()},
                      schema=self.schema)

    def to_original(self, i: int, boxes):
        """Map xyxy boxes in sample ``i``'s stored pixels (e.g. predictions) to its source image's pixels
        (EXIF orientation applied). A tensor in gives a tensor out (float64), an array an array."""
        if isinstance(boxes, torch.Tensor):
            return torch.from_numpy(invert_affine(boxes.detach().cpu().double().numpy(), self.affine[i]))
        return invert_affine(np.asarray(boxes, np.float64), self.affine[i])

    # --------------------------------------------------------------------------- batches
    def shard_runs(self, idx: np.ndarray):
        """(shard, start, end, local rows) for each run of consecutive ``idx`` in the same shard."""
        return self._image.px.shard_runs(self._to_rows(idx))

    def _to_rows(self, idx: np.ndarray) -> np.ndarray:
        return idx if self._rows is None else self._rows[np.asarray(idx, np.int64)]

    def gather_images(self, idx: np.ndarray, out: torch.Tensor | None = None) -> torch.Tensor:
        """Fixed layout: copy images ``idx`` into ``out`` (B, H, W, C) with one gather per run of
        consecutive indices that share a shard (sort the indices to make every shard one run).

        The gather is ``numpy.take(mode="clip")`` rather than ``torch.index_select``: it releases the GIL
        and never enters torch's OpenMP pool, so loader threads scale (measured on 2 cores: 18 GB/s per
        thread, where index_select from a second thread fell to 3 GB/s while the main thread's OpenMP
        workers spun)."""
        im = self.manifest.image
        if out is None:
            out = torch.empty((len(idx), im.height, im.width, im.channels), dtype=torch.uint8)
        if len(idx):
            self._image.px.gather(self._to_rows(np.asarray(idx, np.int64)), out.numpy())
        return out

    def get_batch(self, indices: Sequence[int], boxes: str | None = None, images: str | None = None,
                  alloc: Allocator = new_tensor, geometry=None, post=None, reads=None,
                  to_torchvision: bool = False) -> Batch:
        """Batched fields for ``indices``, in that order (a :class:`Batch`: a dict that carries the
        dataset's ``schema``).

        Images: fixed -> ``image`` (B, H, W, C) uint8. Ragged, ``images="packed"`` -> ``image`` flat uint8,
        ``image_offsets`` (B+1,), ``image_shapes`` (B, 3); ``images="padded"`` -> ``image``
        (B, max_h, max_w, C) and ``image_sizes`` (B, 2). Masks likewise under ``mask`` (padded with the
        ignore index). Classification adds ``label`` (B,). Detection adds ``image_id`` (B,), ``orig_size``
        (B, 2) and the objects in the chosen form: ``packed`` -> ``boxes`` (M, 4), ``labels`` (M,),
        attributes (M,), ``box_offsets`` (B+1,); ``padded`` -> (B, max_k, ...) columns + ``box_mask`` +
        ``box_counts``; ``list`` -> ``targets``. ``index`` (B,) is always there. ``alloc(name, shape,
        dtype)`` provides the output tensors (the Loader passes its ring of reusable, pinned buffers); by
        default they are new tensors. ``geometry`` / ``post``: transforms run per sample during the gather
        (the Loader passes them; see ``_get_batch``). ``reads``: the Loader's read strategy (``reads.py``);
        None reads through this handle's own mappings. ``to_torchvision``: the caller hands the batch straight
        to ``format="torchvision"`` on the CPU, nothing between (the Loader says so); where the gather moves
        pixels and masks no further than its flips, per-object masks are then left as their packed bits
        (``object_masks.bits_key`` says so), for that form to unpack straight into its (k, H, W) masks, and
        packed ragged uint8 images are handed as float32 in [0, 1] (``image`` flat, same offsets and shapes),
        cast as they are gathered, and marked so (``batches.CAST_KEY``, which that form takes out)."""
        check_forms(boxes, images, allow_none=True)
        return self._get_batch(indices, boxes, images, alloc, geometry, post, reads, to_torchvision)[0]

    def sample_sizes(self, indices) -> torch.Tensor:
        """(B, 2) int64 (height, width) of the stored images ``indices``."""
        return torch.from_numpy(self._image.px.sizes(self._to_rows(self._check_indices(indices))))

    def _get_batch(self, indices, boxes, images, alloc: Allocator = new_tensor, geometry=None, post=None, reads=None,
                   to_torchvision: bool = False):
        """``get_batch``, plus the packed batch it was built from (before the box form).

        ``geometry`` (a :class:`~dsc.transforms.fused.ChainPlan` for these samples) runs the transforms'
        geometric steps on every image-like field while it is gathered: each sample goes from its view of
        the shard straight into the output (the Loader's pinned slot), and the boxes through the plan's
        maps. ``post`` (a :class:`~dsc.transforms.photometric.PixelPost`) then turns each image sample to
        float in the same pass."""
        idx = self._check_indices(indices)
        rows = self._to_rows(idx)
        tensors: dict = {}
        np_alloc = numpy_alloc(alloc, tensors)
        forms = {"images": images or self.image_form, "reads": reads}
        fields: dict = {}
        own_sizes = geometry is not None and geometry.out is None  # a size-keeping chain on mixed sizes (flips)
        if own_sizes and post is not None:
            raise DscError("ragged images need a fixed-size geometric op (RandomResizedCrop, Resize((h, w)), "
                           "CenterCrop, Letterbox) before ToFloat")
        pixels = self.schema.pixels() if (geometry is not None and not own_sizes) or post is not None else {}
        # a size-keeping chain (flips) on packed ragged pixels: each sample through its program straight from
        # its view of the shard into its place in the packed batch (one copy, as a plain gather makes)
        in_place = own_sizes and forms["images"] == "packed" and geometry.programs is not None and \
            torch.equal(geometry.out_sizes.long(), geometry.sizes.long()) and \
            all(getattr(self.readers[k], "px", None) is not None and not self.readers[k].px.px.fixed
                for k in self.schema.pixels() if k in self.readers)
        placed: tuple = ()
        flips = flip_only(geometry) if in_place else None
        if flips is not None:  # flips only: each object's mask crop mirrored as it is unpacked (no second pass)
            forms["object_flips"] = flips
            placed = tuple(k for k in self.schema.object_masks() if k in self.readers)
        # the one decision for a batch that goes straight to the torchvision form (the caller's word), packed,
        # where nothing but the gather's own flips moves pixels or masks: its masks are left as packed bits,
        # and its ragged uint8 images are cast to float as they are gathered (the form's float32 values, in the
        # layout it hands out; the uint8 batch is never written)
        straight = to_torchvision and (geometry is None or flips is not None) and \
            (boxes or self.box_form) == "packed"
        if straight:
            forms["object_mask_bits"] = True
        image = self.readers.get("image")
        cast = straight and forms["images"] == "packed" and getattr(image, "px", None) is not None and \
            not image.px.px.fixed and image.px.px.dtype == "uint8" and image.px.px.channels is not None
        for name, r in self.readers.items():
            if name in pixels:
                fields[name] = self._gather_transformed(r, rows, pixels[name], alloc, geometry, post, reads)
            elif cast and name == "image":  # (torchvision_form takes a packed float32 image as cast already)
                fields.update(r.px.pack(rows, np_alloc, reads, write=_cast_writer(flips), dtype=np.float32))
            elif in_place and name in self.schema.pixels():
                fields.update(r.px.pack(rows, np_alloc, reads, write=_program_writer(geometry, self.schema[name])))
            else:
                fields.update(r.gather(rows, np_alloc, forms))
        batch = Batch(as_tensors(fields, tensors), schema=self.schema)
        if own_sizes and not in_place:  # each sample keeps its size: transformed after the gather, in its packed form
            apply_plan(geometry, batch, self.schema)
        elif geometry is not None:  # boxes, per-box rows, object masks, keypoints; the record (affine, flipped)
            move_objects(batch, geometry, self.schema, placed=placed)
        batch["index"] = alloc("index", idx.shape, torch.int64).copy_(torch.from_numpy(idx))
        if cast:  # (the form takes the mark out: it is never handed to the user)
            batch[CAST_KEY] = batch["index"]
        packed = Batch(batch, schema=self.schema)
        return box_form(batch, self.schema, boxes or self.box_form, alloc), packed

    def _gather_transformed(self, reader, idx, role, alloc, geometry, post, reads=None) -> torch.Tensor:
        """One image-like field of the batch through the geometric steps (and ``post``), per sample."""

        px = reader.px.px
        if geometry is not None:
            h, w = geometry.out
        elif px.fixed:
            h, w = px.height, px.width
        else:
            raise DscError("ragged images need a fixed-size geometric op (RandomResizedCrop, Resize((h, w)), "
                           "CenterCrop, Letterbox) before ToFloat")
        B, tail = len(idx), (() if px.channels is None else (px.channels,))
        image_post = post if reader.name == "image" else None
        if image_post is not None:
            out = image_post.empty(B, h, w, tail[0], alloc)
        else:
            out = alloc(reader.name, (B, h, w, *tail), torch_dtype(px.dtype))
        views = reader.px.samples(idx, reads)
        return run_batch(views, geometry.programs if geometry is not None else None, out,
                         role.resample == "nearest", role.fill, image_post)

    def __getitems__(self, indices: Sequence[int]) -> SampleBatch:
        """Batched fetch (torch's DataLoader calls it): one gather, then per-sample views of it."""
        fields, packed = self._get_batch(indices, None, None)
        samples = []
        for k in range(len(fields["index"])):
            sample = Sample(schema=self.schema)
            for r in self.readers.values():
                sample.update(r.split(packed, k))
            samples.append(sample)
        return SampleBatch(samples, fields)


def _program_writer(plan, role):
    """``write(k, view, dest)`` for a packed gather (``PixelsReader.pack``): sample ``k``'s stored view through
    its program of ``plan`` into ``dest`` (its place in the packed batch, at its own size)."""
    nearest = role.resample == "nearest"

    def write(k: int, view: np.ndarray, dest: np.ndarray) -> None:
        run_program(torch.from_numpy(view), plan.programs[k], torch.from_numpy(dest), nearest, role.fill)
    return write


def _cast_writer(flips: np.ndarray | None):
    """``write(k, view, dest)`` for a packed gather that casts (``Dataset._get_batch``'s ``to_torchvision``):
    sample ``k``'s uint8 view, mirrored as ``flips`` says (:func:`~dsc.transforms.objects.flip_only`'s rows:
    flip rows, flip columns; None: no chain), into ``dest`` (float32) divided by 255 there, while it is still
    in cache (the values torchvision_form's own cast gives: ``float(x) / 255``, exactly): one scripted call a
    sample (``batches.cast_image``)."""
    divisor = divisor_255()
    mirrors = flips[:, :2].astype(bool).tolist() if flips is not None else None

    def write(k: int, view: np.ndarray, dest: np.ndarray) -> None:
        fh, fw = mirrors[k] if mirrors is not None else (False, False)
        cast_image(torch.from_numpy(view), torch.from_numpy(dest), fh, fw, divisor)
    return write


def open(path: str | os.PathLike, boxes: str = "packed", images: str = "packed", version: int | None = None,  # noqa: A001
         tag: str | None = None, cache_dir: str | os.PathLike | None = None, cache_limit: int | str | None = None,
         retry_seconds: float | None = None) -> Dataset:
    """Open a compiled dataset (the public name is ``dsc.open``): its latest version, or ``version`` /
    ``tag`` (time travel). The handle reads that version's bytes for as long as it lives, whatever later
    updates, restores or vacuums do (it pins the version). Raises DatasetNotFoundError (and its
    VersionNotFoundError), FormatVersionError or CorruptDatasetError with the path and the fix when the
    directory is not a complete, readable dsc dataset. ``boxes`` / ``images``: batch forms, see
    :class:`Dataset`.

    ``path`` may be a URL (``s3://bucket/prefix``, ``gs://``, ``az://``; docs/REMOTE.md): the small arrays are
    fetched now, shards are downloaded whole into ``cache_dir`` (default ``$DSC_CACHE_DIR`` or
    ``~/.cache/dsc``), verified, and mapped from there; ``cache_limit`` (bytes or "200GB") bounds that
    cache; ``retry_seconds`` how long failing requests are retried (default ``$DSC_RETRY_SECONDS`` or 120)."""
    return Dataset(path, boxes=boxes, images=images, version=version, tag=tag, cache_dir=cache_dir,
                   cache_limit=cache_limit, retry_seconds=retry_seconds)
