"""``dsc.open``: a compiled dataset as a map-style ``torch.utils.data.Dataset``, with zero decoding.

Opening reads the manifest and the small index arrays (labels; offsets and shapes when ragged) and
stats the shard files; it creates no per-sample Python object. Shard files are memory-mapped on first
use (copy-on-write private mappings: page-cache backed, never written back), so samples are
zero-copy views and a batch is one gather per run of samples in the same shard.
"""
from __future__ import annotations

import mmap
import operator
import os
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch

from ..errors import CorruptDatasetError
from ..formats import Manifest
from ..formats import layout as L
from ..formats.coords import invert_affine
from ..formats.zarr_v3 import node_dir, read_plain_array, read_string_array
from .objects import BOX_FORMS, gather_rows, new_tensor, packed_to_list, packed_to_padded


MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)  # Linux >= 5.14


def map_file(path: Path, nbytes: int) -> torch.Tensor:
    """Map the first ``nbytes`` of a file as a flat uint8 tensor.

    A private (copy-on-write) mapping: pages are the OS page cache's, shared by every process that maps
    the file, never written back; a user who writes into a sample changes only their own copy of that
    page. The page tables are filled up front with MADV_POPULATE_READ (read-only, so no page is copied:
    MAP_POPULATE on a writable private mapping would copy the whole file into process memory), which
    spares a page fault per 4 KiB on first touch; older kernels fall back to read-ahead (MADV_WILLNEED).
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        mm = mmap.mmap(fd, nbytes, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)
    try:
        mm.madvise(MADV_POPULATE_READ)
    except (OSError, ValueError):
        mm.madvise(mmap.MADV_WILLNEED)
    return torch.frombuffer(mm, dtype=torch.uint8)  # the tensor keeps the mapping alive


class SampleBatch(list):
    """What ``Dataset.__getitems__`` returns: a list of per-sample dicts (what torch's
    ``default_collate`` expects) whose tensors are views into one batched gather, and, indexed by a
    field name, the batched tensors themselves: ``batch["image"]`` is (B, H, W, C)."""

    def __init__(self, samples: list[dict], fields: dict[str, torch.Tensor]):
        super().__init__(samples)
        self.fields = fields

    def __getitem__(self, key):
        if isinstance(key, str):
            return self.fields[key]
        return super().__getitem__(key)


def collate(batch):
    """``collate_fn`` for torch's DataLoader: a :class:`SampleBatch` is already batched, so its fields
    are returned with no second copy; anything else goes to ``default_collate``."""
    if isinstance(batch, SampleBatch):
        return batch.fields
    return torch.utils.data.default_collate(batch)


IMAGE_FORMS = ("packed", "padded")
Allocator = Callable[[str, tuple, torch.dtype], torch.Tensor]


class Dataset(torch.utils.data.Dataset):
    """A compiled dsc dataset. ``ds[i]`` -> ``{"image": uint8 (H, W, C), "label": int}`` (classification)
    or ``{"image", "boxes": (k, 4) float32 xyxy, "labels": (k,) int64, "image_id", "orig_size", ...}``
    (detection). ``boxes`` picks the detection batch form (packed | padded | list) and ``images`` how
    ragged images batch (packed bytes + shapes, or padded to the batch's largest + true sizes)."""

    def __init__(self, path: str | os.PathLike, boxes: str = "packed", images: str = "packed"):
        if boxes not in BOX_FORMS:
            raise ValueError(f"boxes must be one of {BOX_FORMS}, got {boxes!r}")
        if images not in IMAGE_FORMS:
            raise ValueError(f"images must be one of {IMAGE_FORMS}, got {images!r}")
        self.box_form, self.image_form = boxes, images
        self.path = Path(path)
        self.manifest: Manifest = L.read_manifest(self.path)
        m = self.manifest
        self._n = m.num_samples
        self._K = m.shard_size
        self._fixed = m.image.layout == "fixed"
        L.check_shard_files(self.path, m)
        self.labels: torch.Tensor | None = None
        if m.task == "classification":
            self.labels = torch.from_numpy(self._index_array(L.LABEL, (self._n,)))
        if not self._fixed:
            self._offsets = self._index_array(L.RAGGED_OFFSETS, (self._n + 1,))
            self._shapes = self._index_array(L.RAGGED_SHAPES, (self._n, 3))
            starts = self._offsets[np.minimum(np.arange(len(m.shards) + 1) * self._K, self._n)]
            sizes = np.diff(starts)
            recorded = np.array([s.nbytes for s in m.shards], np.int64)
            if not L.valid_offsets(self._offsets) or not np.array_equal(sizes, recorded):
                raise CorruptDatasetError(f"{self.path}: image/offsets disagree with the shard sizes in the "
                                          f"manifest; the dataset is damaged. Recompile it")
            self._shard_starts = starts
        self._affine = self._orig_sizes = None  # loaded on first use
        self._objects: dict[str, torch.Tensor] = {}
        if m.task == "detection":
            self._load_objects()
        self._maps: list[torch.Tensor | None] = [None] * len(m.shards)
        self._keys: list[str] | None = None

    def _load_objects(self) -> None:
        n, obj = self._n, self.manifest.objects
        M = int(obj["num_boxes"])
        self._box_offsets = self._index_array(L.OBJ_OFFSETS, (n + 1,))
        if not L.valid_offsets(self._box_offsets, M):
            raise CorruptDatasetError(f"{self.path}/objects/offsets is not a valid box-offset index for {M} boxes")
        self._objects = {"boxes": torch.from_numpy(self._index_array(L.OBJ_BOXES, (M, 4))),
                         "labels": torch.from_numpy(self._index_array(L.OBJ_LABELS, (M,)))}
        for name in obj.get("attributes", {}):
            self._objects[name] = torch.from_numpy(self._index_array(f"{L.OBJECTS}/{name}", (M,)))
        self._image_ids = torch.from_numpy(self._index_array(L.IMAGE_ID, (n,)))
        self._orig = torch.from_numpy(self.orig_sizes)  # read once, shared with the orig_sizes property

    def _index_array(self, rel: str, shape: tuple) -> np.ndarray:
        arr = read_plain_array(self.path, rel)
        if arr.shape != shape:
            raise CorruptDatasetError(f"{self.path}/{rel} has shape {arr.shape}, expected {shape}")
        return arr

    # --------------------------------------------------------------------------- metadata
    def __len__(self) -> int:
        return self._n

    @property
    def classes(self) -> list[str]:
        return list(self.manifest.classes)

    @property
    def class_to_idx(self) -> dict[str, int]:
        return {c: i for i, c in enumerate(self.manifest.classes)}

    @property
    def keys(self) -> list[str]:
        """Source path (relative to the source root) or id of every sample; loaded on first use."""
        if self._keys is None:
            keys = read_string_array(self.path, L.KEYS)
            if len(keys) != self._n:
                raise CorruptDatasetError(f"{self.path}/keys has {len(keys)} entries, expected {self._n}")
            self._keys = keys
        return self._keys

    @property
    def orig_sizes(self) -> np.ndarray:
        """(N, 2) int32 (height, width) of each decoded source image, EXIF orientation applied."""
        if self._orig_sizes is None:
            self._orig_sizes = self._index_array(L.ORIG_SIZE, (self._n, 2))
        return self._orig_sizes

    @property
    def affine(self) -> np.ndarray:
        """(N, 4) float64 (sx, sy, tx, ty): stored pixel coordinate = s * original + t."""
        if self._affine is None:
            self._affine = self._index_array(L.AFFINE, (self._n, 4))
        return self._affine

    def __repr__(self) -> str:
        m = self.manifest
        shape = (f"{m.image.height}x{m.image.width}x{m.image.channels}" if self._fixed
                 else f"ragged x{m.image.channels}")
        return f"dsc.Dataset({str(self.path)!r}, {self._n} samples, image {shape}, {len(m.shards)} shards)"

    # --------------------------------------------------------------------------- storage
    def _shard(self, s: int) -> torch.Tensor:
        t = self._maps[s]
        if t is None:
            spec = self.manifest.shards[s]
            path = node_dir(self.path, spec.path)
            if self._fixed:
                im = self.manifest.image
                t = map_file(path, spec.count * im.sample_nbytes).view(spec.count, im.height, im.width, im.channels)
            else:
                t = map_file(path, spec.nbytes)
            self._maps[s] = t
        return t

    def load_to_ram(self, progress: bool = True) -> None:
        """Read every shard into process memory (``cache="ram"``): no page-cache eviction or page faults
        during training, at the cost of the dataset's size in RAM per process."""
        from tqdm import tqdm

        m = self.manifest
        with tqdm(total=sum(s.nbytes for s in m.shards), unit="B", unit_scale=True, desc="load to RAM",
                  disable=not progress) as bar:
            for s, spec in enumerate(m.shards):
                mapped = self._shard(s)
                buf = torch.empty_like(mapped)
                buf.copy_(mapped)
                self._maps[s] = buf
                bar.update(spec.nbytes)

    def __getstate__(self):  # DataLoader workers started by spawn re-map shards lazily
        state = self.__dict__.copy()
        state["_maps"] = [None] * len(self._maps)
        return state

    def _check_indices(self, idx) -> np.ndarray:
        idx = np.asarray(idx, dtype=np.int64).reshape(-1)
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

    def _image(self, i: int) -> torch.Tensor:
        if self._fixed:
            s, j = divmod(i, self._K)
            return self._shard(s)[j]
        return self._ragged_bytes(i).view(*self._shapes[i].tolist())

    def _ragged_bytes(self, i: int) -> torch.Tensor:
        """Ragged layout: sample ``i``'s bytes, a view of its shard."""
        s = i // self._K
        start = self._shard_starts[s]
        return self._shard(s)[int(self._offsets[i] - start):int(self._offsets[i + 1] - start)]

    def __getitem__(self, i: int) -> dict:
        i = self._check_index(i)
        sample = {"image": self._image(i)}
        if self.labels is not None:
            sample["label"] = int(self.labels[i])
        if self._objects:
            a, b = int(self._box_offsets[i]), int(self._box_offsets[i + 1])
            sample.update({name: col[a:b] for name, col in self._objects.items()})
            sample["image_id"] = int(self._image_ids[i])
            sample["orig_size"] = tuple(self._orig[i].tolist())
        return sample

    def to_original(self, i: int, boxes):
        """Map xyxy boxes in sample ``i``'s stored pixels (e.g. predictions) to its source image's pixels
        (EXIF orientation applied). A tensor in gives a tensor out (float64), an array an array."""
        if isinstance(boxes, torch.Tensor):
            return torch.from_numpy(invert_affine(boxes.detach().cpu().double().numpy(), self.affine[i]))
        return invert_affine(np.asarray(boxes, np.float64), self.affine[i])

    # --------------------------------------------------------------------------- batches
    def gather_images(self, idx: np.ndarray, out: torch.Tensor | None = None) -> torch.Tensor:
        """Fixed layout: copy images ``idx`` into ``out`` (B, H, W, C) with one gather per run of
        consecutive indices that share a shard (sort the indices to make every shard one run).

        The gather is ``numpy.take(mode="clip")`` rather than ``torch.index_select``: it releases the GIL
        and never enters torch's OpenMP pool, so loader threads scale (measured on 2 cores: 18 GB/s per
        thread, where index_select from a second thread fell to 3 GB/s while the main thread's OpenMP
        workers spun). ``mode="clip"`` also skips numpy's bounds-checked buffered path; the indices were
        validated already."""
        im = self.manifest.image
        if out is None:
            out = torch.empty((len(idx), im.height, im.width, im.channels), dtype=torch.uint8)
        if len(idx) == 0:
            return out
        dst = out.numpy()
        for s, a, b, local in self.shard_runs(idx):
            np.take(self._shard(s).numpy(), local, axis=0, out=dst[a:b], mode="clip")
        return out

    def shard_runs(self, idx: np.ndarray):
        """(shard, start, end, local rows) for each run of consecutive ``idx`` in the same shard."""
        shard_of = idx // self._K
        local = idx - shard_of * self._K
        cuts = [0, *(np.flatnonzero(np.diff(shard_of)) + 1).tolist(), len(idx)]
        return [(int(shard_of[a]), a, b, local[a:b]) for a, b in zip(cuts[:-1], cuts[1:])]

    def pack_images(self, idx: np.ndarray, alloc: Allocator = new_tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Ragged layout: (all bytes back to back, (B+1,) int64 offsets, (B, 3) int32 shapes)."""
        sizes = self._offsets[idx + 1] - self._offsets[idx]
        offsets = alloc("image_offsets", (len(idx) + 1,), torch.int64)
        o = offsets.numpy()
        o[0] = 0
        np.cumsum(sizes, out=o[1:])
        flat = alloc("image", (int(o[-1]),), torch.uint8)
        dst = flat.numpy()
        for k, i in enumerate(idx.tolist()):
            dst[o[k]:o[k + 1]] = self._ragged_bytes(i).numpy()
        shapes = alloc("image_shapes", (len(idx), 3), torch.int32)
        shapes.numpy()[:] = self._shapes[idx]
        return flat, offsets, shapes

    def pad_images(self, idx: np.ndarray, alloc: Allocator = new_tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Ragged layout: (B, max_h, max_w, C) zero-padded at the bottom/right, and (B, 2) true (h, w)."""
        shapes = self._shapes[idx]
        hw = shapes.max(axis=0) if len(idx) else np.array([0, 0, self.manifest.image.channels])
        out = alloc("image", (len(idx), int(hw[0]), int(hw[1]), int(hw[2])), torch.uint8)
        dst = out.numpy()
        dst[:] = 0
        for k, i in enumerate(idx.tolist()):
            h, w, _ = shapes[k]
            dst[k, :h, :w] = self._image(i).numpy()
        sizes = alloc("image_sizes", (len(idx), 2), torch.int64)
        sizes.numpy()[:] = shapes[:, :2]
        return out, sizes

    def get_batch(self, indices: Sequence[int], boxes: str | None = None, images: str | None = None,
                  alloc: Allocator = new_tensor) -> dict[str, torch.Tensor]:
        """Batched fields for ``indices``, in that order.

        Images: fixed -> ``image`` (B, H, W, C) uint8. Ragged, ``images="packed"`` -> ``image`` flat uint8,
        ``image_offsets`` (B+1,), ``image_shapes`` (B, 3); ``images="padded"`` -> ``image``
        (B, max_h, max_w, C) and ``image_sizes`` (B, 2). Classification adds ``label`` (B,).
        Detection adds ``image_id`` (B,), ``orig_size`` (B, 2) and the objects in the chosen form:
        ``packed`` -> ``boxes`` (M, 4), ``labels`` (M,), attributes (M,), ``box_offsets`` (B+1,);
        ``padded`` -> (B, max_k, ...) columns + ``box_mask`` + ``box_counts``; ``list`` -> ``targets``.
        ``index`` (B,) is always there. ``alloc(name, shape, dtype)`` provides the output tensors (the
        Loader passes its ring of reusable, pinned buffers); by default they are new tensors."""
        return self._get_batch(indices, boxes, images, alloc)[0]

    def _get_batch(self, indices, boxes, images, alloc: Allocator = new_tensor):
        """``get_batch``, plus the objects' packed gather (box_offsets, columns) it was built from, or None."""
        idx = self._check_indices(indices)
        t_idx = torch.from_numpy(idx)
        if self._fixed:
            im = self.manifest.image
            batch = {"image": self.gather_images(idx, alloc("image", (len(idx), im.height, im.width, im.channels),
                                                            torch.uint8))}
        elif (images or self.image_form) == "padded":
            img, sizes = self.pad_images(idx, alloc)
            batch = {"image": img, "image_sizes": sizes}
        else:
            flat, offsets, shapes = self.pack_images(idx, alloc)
            batch = {"image": flat, "image_offsets": offsets, "image_shapes": shapes}
        take = lambda name, src, rows: torch.index_select(  # noqa: E731
            src, 0, rows, out=alloc(name, (len(rows), *src.shape[1:]), src.dtype))
        packed = None
        if self.labels is not None:
            batch["label"] = take("label", self.labels, t_idx)
        if self._objects:
            batch["image_id"] = take("image_id", self._image_ids, t_idx)
            batch["orig_size"] = take("orig_size", self._orig, t_idx)
            rows, box_offsets = gather_rows(self._box_offsets, idx)
            cols = {name: take(name, col, rows) for name, col in self._objects.items()}
            packed = (box_offsets, cols)
            form = boxes or self.box_form
            if form == "packed":
                batch.update(cols)
                batch["box_offsets"] = alloc("box_offsets", box_offsets.shape, torch.int64).copy_(box_offsets)
            elif form == "padded":
                batch.update(packed_to_padded(box_offsets, cols, alloc))
            else:
                targets = packed_to_list(box_offsets, cols)
                for t, iid in zip(targets, batch["image_id"].tolist()):
                    t["image_id"] = iid
                batch["targets"] = targets
        batch["index"] = alloc("index", t_idx.shape, torch.int64).copy_(t_idx)
        return batch, packed

    def __getitems__(self, indices: Sequence[int]) -> SampleBatch:
        """Batched fetch (torch's DataLoader calls it): one gather, then per-sample views of it."""
        fields, packed = self._get_batch(indices, None, None)
        labels = fields["label"].tolist() if "label" in fields else None
        if self._objects:  # per-sample views of the one packed gather, whatever the batch's form
            targets = fields["targets"] if "targets" in fields else packed_to_list(*packed)
        samples = []
        for k in range(len(fields["index"])):
            if self._fixed:
                image = fields["image"][k]
            elif "image_offsets" in fields:
                o = fields["image_offsets"]
                image = fields["image"][o[k]:o[k + 1]].view(*fields["image_shapes"][k].tolist())
            else:
                h, w = fields["image_sizes"][k].tolist()
                image = fields["image"][k, :h, :w]
            sample = {"image": image}
            if labels is not None:
                sample["label"] = labels[k]
            if self._objects:
                sample.update(targets[k])
                sample["image_id"] = int(fields["image_id"][k])
                sample["orig_size"] = tuple(fields["orig_size"][k].tolist())
            samples.append(sample)
        return SampleBatch(samples, fields)


def open(path: str | os.PathLike, boxes: str = "packed", images: str = "packed") -> Dataset:  # noqa: A001
    """Open a compiled dataset (the public name is ``dsc.open``). Raises DatasetNotFoundError,
    FormatVersionError or CorruptDatasetError with the path and the fix when the directory is not a
    complete, readable dsc dataset. ``boxes`` / ``images``: batch forms, see :class:`Dataset`."""
    return Dataset(path, boxes=boxes, images=images)
