"""``dsc.Mixture``: several compiled datasets read by one Loader, in proportions.

``dsc.Loader([ds_a, ds_b], ...)`` (or ``dsc.Loader(dsc.Mixture([...], weights=...), ...)``) reads a mixture. A
sample's identity is (source, index), one int64 id ``offsets[source] + index``; the epoch's order over every
source is a pure function of (seed, epoch, the sources, their counts) (``orders/mixture.py``), and the Loader
cuts it into ranks and batches exactly as it does a single dataset's: the same exact rank partitions, automatic
epochs, per-rank augmentation streams, mid-epoch and elastic resume. Each source keeps its own read strategy
object and, in object storage, its own shard cache and read-ahead schedule; a batch is gathered source by
source straight into the slot of the ring (each source's rows of a fixed-size field are a slice of the batch's
buffer: no second copy), and says which source each sample came from (``source``).

Sources must agree on their fields (the same keys, kinds and dtypes; pixels of one fixed size, or brought to one
size by a transforms chain); labels are kept per source (with ``source``), or mapped onto one class list by
class name (``labels="names"``).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re

import numpy as np
import torch
from torch.utils.data import Subset

from ..errors import ConfigError, DscError
from .batches import Batch, box_form, new_tensor, torch_dtype, value_keys
from .dataset import Dataset, not_a_dataset
from .orders.mixture import chunks, mixture_order, source_counts
from . import reads as R
from ..transforms.fused import fixes_size

LABELS = ("per_source", "names")


def _whole(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _spelling(name: str) -> str:
    """What two class names that mean the same class are likely to share: case, spaces, '-' and '_' aside."""
    return re.sub(r"[\s_\-]+", " ", str(name)).strip().casefold()


def merge_classes(class_lists: list[list[str]], aliases: dict | None = None) -> tuple[list[str], list[np.ndarray]]:
    """``labels="names"``: one class list over the sources and each source's label -> merged label table.

    The rule: a class is its name, written exactly (after ``aliases``, ``{name: name it stands for}``); the merged
    list is the first source's classes in their order, then each later source's new names in theirs. Refused
    (naming the sources and the names): a source that names two of its classes alike, and two names that differ
    only in case, spaces, '-' or '_' ('traffic light' / 'Traffic_Light'), which would otherwise silently become
    two classes."""
    aliases = dict(aliases or {})
    merged: list[str] = []
    where: dict[str, int] = {}
    spelled: dict[str, tuple[str, int]] = {}
    tables = []
    for s, names in enumerate(class_lists):
        table = np.empty(len(names), np.int64)
        seen: dict[str, str] = {}
        for k, raw in enumerate(names):
            name = aliases.get(raw, raw)
            if name in seen:
                raise ConfigError(f"labels='names': source {s} names two of its classes {name!r} ({seen[name]!r} and "
                                  f"{raw!r}), so its labels cannot be mapped by name; give aliases= that tell them "
                                  f"apart, or labels='per_source'")
            seen[name] = raw
            key = _spelling(name)
            if key in spelled and spelled[key][0] != name:
                other, t = spelled[key]
                raise ConfigError(f"labels='names': class {name!r} of source {s} and {other!r} of source {t} differ "
                                  f"only in case, spaces, '-' or '_': one class or two? Pass aliases={{{name!r}: "
                                  f"{other!r}}} to make them one, or rename one; labels='per_source' keeps each "
                                  f"source's own")
            spelled.setdefault(key, (name, s))
            if name not in where:
                where[name] = len(merged)
                merged.append(name)
            table[k] = where[name]
        tables.append(table)
    return merged, tables


class _Reads:
    """A mixture's read strategies: one object of its chosen strategy per source (each over its own storage)."""

    def __init__(self, names: list[str], datasets: list[Dataset], **kw):
        self.name = names[0] if len(set(names)) == 1 else "+".join(names)
        self.each = [R.make(name, ds.storage, **kw) for name, ds in zip(names, datasets)]

    def __getitem__(self, s: int):
        return self.each[s]

    def close(self) -> None:
        for r in self.each:
            r.close()


class _Schedules:
    """The epoch's read schedules of the sources (each None when its source needs none), as one."""

    def __init__(self, each: list):
        self.each = [s for s in each if s is not None]

    def wait(self, j: int, should_stop=lambda: False) -> None:
        for s in self.each:
            s.wait(j, should_stop)

    def done(self, j: int) -> None:
        for s in self.each:
            s.done(j)

    def close(self) -> None:
        for s in self.each:
            s.close()


class _Share:
    """A source's share of each of an epoch's batches (its own indices), made when read: a Loader that schedules
    nothing for the source (local, read in place) never splits the epoch's batches."""

    def __init__(self, batches: list[np.ndarray], lo: int, hi: int):
        self.batches, self.lo, self.hi = batches, lo, hi

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, j: int) -> np.ndarray:
        b = self.batches[j]
        return b[(b >= self.lo) & (b < self.hi)] - self.lo

    def __iter__(self):
        return (self[j] for j in range(len(self.batches)))


def _beneath_subsets(obj):
    while isinstance(obj, Subset):
        obj = obj.dataset
    return obj


class Mixture:
    """Several compiled datasets read as one by :class:`dsc.Loader` (which also takes the list itself:
    ``dsc.Loader([a, b], weights=[0.7, 0.3])``).

    ``sources``: datasets (``dsc.open(path_or_url, version=, tag=)``: each its own version, local or in object
    storage) or their paths. How much of an epoch each source gives:

    * nothing: every sample of every source once per epoch;
    * ``weights=[0.7, 0.3]``: those proportions of the epoch, whose size is ``epoch_size`` (default: the
      sources' total); a source asked for more than it holds gives whole passes plus part of one more (or
      draws with ``replace=True``), one asked for less a different part each epoch;
    * ``choose=[5000, None]``: source 0 gives 5,000 samples per epoch (up- or down-sampled as above), the
      others what the rule above gives them of the rest.

    Counts are exact each epoch (largest remainder). ``replace``: draw with replacement (one bool, or one per
    source). ``labels``: ``"per_source"`` (each source's labels as stored; the batch's ``source`` says whose) or
    ``"names"`` (every label mapped onto one class list by class name: :func:`merge_classes`; ``aliases``
    renames a source's classes first). ``one_source_per_batch``: every batch holds samples of one source
    (default: batches mix the sources in proportion).
    """

    def __init__(self, sources, weights=None, epoch_size: int | None = None, choose=None, replace=False,
                 labels: str = "per_source", aliases: dict | None = None, one_source_per_batch: bool = False):
        if isinstance(sources, (str, os.PathLike, Dataset)) or not isinstance(sources, (list, tuple)) or not sources:
            raise ConfigError(f"a mixture is a list of datasets (dsc.open(...) or paths), e.g. dsc.Loader([a, b]); "
                              f"got {sources!r}")
        self._owned = []
        self.datasets: list[Dataset] = []
        try:
            for src in sources:
                if isinstance(src, (str, os.PathLike)):
                    src = Dataset(src)
                    self._owned.append(src)
                elif isinstance(src, Subset) and isinstance(_beneath_subsets(src), (Dataset, str, os.PathLike)):
                    raise ConfigError(f"a mixture's sources are whole dsc datasets (or their paths); source "
                                      f"{len(self.datasets)} is a torch.utils.data.Subset, which only a single-"
                                      f"dataset dsc.Loader(subset) takes. To draw part of a source per epoch, "
                                      f"give choose=[n, ...] or weights= (a different part each epoch)")
                elif isinstance(src, Mixture) or not isinstance(src, Dataset):
                    err = not_a_dataset(src, "dsc.Mixture", takes="dsc datasets or their paths (a "
                                        "torch.utils.data.Subset only alone, in dsc.Loader(subset))")
                    raise ConfigError(f"source {len(self.datasets)} of the list: {err}")
                self.datasets.append(src)
            self._configure(weights, epoch_size, choose, replace, labels, aliases, one_source_per_batch)
        except BaseException:
            self.close()
            raise

    def _configure(self, weights, epoch_size, choose, replace, labels, aliases, one_source_per_batch) -> None:
        S = len(self.datasets)
        self.sizes = np.array([len(ds) for ds in self.datasets], np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.int64)
        self._starts = self.offsets[:-1].tolist()  # (each source's first id, as ints: split() per batch)
        self.shard_sizes = [ds.manifest.shard_size for ds in self.datasets]
        if weights is not None:
            w = list(weights) if isinstance(weights, (list, tuple, np.ndarray)) else None
            if w is None or len(w) != S or not all(isinstance(v, (int, float, np.number)) and not isinstance(v, bool)
                                                   and np.isfinite(v) and v >= 0 for v in w) or sum(w) <= 0:
                raise ConfigError(f"weights must be {S} non-negative numbers, one per source, not all 0; got {weights!r}")
            weights = [float(v) for v in w]
        if epoch_size is not None and (not _whole(epoch_size) or epoch_size < 1):
            raise ConfigError(f"epoch_size must be a positive int (samples per epoch), got {epoch_size!r}")
        if choose is not None:
            if not isinstance(choose, (list, tuple)) or len(choose) != S or \
                    not all(c is None or (_whole(c) and c >= 0) for c in choose):
                raise ConfigError(f"choose must list, per source, the samples it gives per epoch (an int >= 0) or None "
                                  f"(by weights); {S} entries, got {choose!r}")
            choose = [None if c is None else int(c) for c in choose]
        if isinstance(replace, (bool, np.bool_)):
            replace = [bool(replace)] * S
        elif not isinstance(replace, (list, tuple)) or len(replace) != S or \
                not all(isinstance(r, (bool, np.bool_)) for r in replace):
            raise ConfigError(f"replace must be True, False or one bool per source ({S}), got {replace!r}")
        if labels not in LABELS:
            raise ConfigError(f"labels must be one of {', '.join(map(repr, LABELS))}, got {labels!r}")
        if aliases is not None and (not isinstance(aliases, dict) or
                                    not all(isinstance(k, str) and isinstance(v, str) for k, v in aliases.items())):
            raise ConfigError(f"aliases must be a dict of class name -> the name it stands for, got {aliases!r}")
        if not isinstance(one_source_per_batch, (bool, np.bool_)):
            raise ConfigError(f"one_source_per_batch must be True or False, got {one_source_per_batch!r}")
        self.weights, self.epoch_size, self.choose, self.replace = weights, epoch_size, choose, [bool(r) for r in replace]
        self.labels, self.aliases, self.chunked = labels, aliases, bool(one_source_per_batch)
        self.counts = source_counts(self.sizes, weights, epoch_size, choose)
        for s in range(S):
            if self.counts[s] > self.sizes[s] == 0:
                raise ConfigError(f"source {s} ({self.datasets[s].path}) holds no sample but is asked for "
                                  f"{self.counts[s]} per epoch")
        if int(self.counts.sum()) == 0:
            raise ConfigError("the mixture's epoch holds no sample: give a source a weight or a count")
        self._check_fields()
        # every field of every source one row per sample, of one shape: batches gathered in one pass (_get_dense)
        self._all_dense = all(set(ds.schema) <= self._dense(ds, False) for ds in self.datasets)
        self._gathering: tuple = (False, [])  # (the reads object, _gatherers' list for it)
        self._luts = None
        self.class_names: list[str] | None = None
        if labels == "names":
            self.class_names, tables = merge_classes([ds.classes for ds in self.datasets], aliases)
            self._luts = [torch.from_numpy(t) for t in tables]
        self._chunk_cache: dict = {}

    # ------------------------------------------------------------------ fields
    def _check_fields(self) -> None:
        """The sources' batches have the same keys, kinds, dtypes (and per-box columns), or the mixture is refused
        naming the field. Pixel sizes are checked by :meth:`check_pixels`, which knows the transforms."""
        first = self.datasets[0]
        for s, ds in enumerate(self.datasets):  # (a mixture's batches say each sample's source under "source")
            if "source" in ds.schema:
                raise ConfigError(f"source {s} of the mixture ({ds.path}) has a field named 'source', the key a "
                                  f"mixture's batches give each sample's source; recompile it with the field renamed")
        for s, ds in enumerate(self.datasets[1:], 1):
            a, b = first.schema, ds.schema
            for key in sorted(set(a) | set(b)):
                if key not in a or key not in b:
                    has, lacks = (s, 0) if key in b else (0, s)
                    raise ConfigError(f"the mixture's sources do not agree on field {key!r}: source {has} has it, source "
                                      f"{lacks} does not ({self.datasets[lacks].path}); mix datasets of one kind")
                if (a[key].kind, a[key].tail) != (b[key].kind, b[key].tail):
                    raise ConfigError(f"the mixture's sources do not agree on field {key!r}: {a[key].kind} {a[key].tail} "
                                      f"in source 0, {b[key].kind} {b[key].tail} in source {s}")
            for name, r in first.readers.items():
                other = ds.readers[name]
                da, db = self._dtype(r), self._dtype(other)
                if da != db:
                    raise ConfigError(f"the mixture's sources do not agree on field {name!r}: dtype {da} in source 0, "
                                      f"{db} in source {s}")
            for key, role in a.keypoints().items():  # (M, K, 3) rows of every source join: one K, one flip
                ka, kb = ds_joints(first, key), ds_joints(ds, key)
                if ka != kb:
                    raise ConfigError(f"the mixture's sources do not agree on field {key!r}: {ka} keypoints per box "
                                      f"in source 0, {kb} in source {s} ({ds.path}); mix datasets of one keypoint "
                                      f"layout")
                if role.flip_index != b[key].flip_index:
                    raise ConfigError(f"the mixture's sources do not agree on field {key!r}: their {ka} keypoints "
                                      f"swap differently under a horizontal flip (flip_index {list(role.flip_index)} "
                                      f"in source 0, {list(b[key].flip_index)} in source {s}), so they are not the "
                                      f"same joints; mix datasets of one keypoint layout")

    @staticmethod
    def _dtype(reader):
        """What must agree for rows of two sources to join: the pixels' dtype, or a value field's dtype and shape."""
        px = getattr(reader, "px", None)
        if px is not None:
            return str(np.dtype(px.px.dtype))
        field = getattr(reader, "field", None)
        if field is not None and hasattr(field, "dtype") and hasattr(field, "shape"):
            return f"{field.dtype} {tuple(field.shape)}"
        return None

    def check_pixels(self, transforms) -> None:
        """Every image-like field comes out at one size: the sources' fixed sizes agree, or the transforms' fused
        geometry ends at one size (ragged sources, or fixed ones of different sizes, are then reconciled in the
        gather). Ragged sources with no such chain batch as ragged (packed or padded). Refused naming the field."""
        geometry = None
        if hasattr(transforms, "gather_plan"):
            geometry = transforms.gather_plan()[0]
        one_size = bool(geometry) and fixes_size(geometry)
        first = self.datasets[0]
        for name in first.schema.pixels():
            layouts = [self._layout(ds, name) for ds in self.datasets]
            if one_size or len(set(layouts)) == 1:
                continue
            s = next(k for k, v in enumerate(layouts) if v != layouts[0])
            raise ConfigError(f"the mixture's sources do not agree on field {name!r}: {layouts[0]} in source 0, "
                              f"{layouts[s]} in source {s}; end the transforms with a fixed-size op (Resize((h, w)), "
                              f"RandomResizedCrop, CenterCrop, Letterbox) so every source's samples come out at one "
                              f"size")
        if self.labels == "names" and "mask" in first.schema:
            names = [ds.mask_classes for ds in self.datasets]
            if any(n != names[0] for n in names):
                raise ConfigError("labels='names': the sources' masks name their values differently (field 'mask'), "
                                  "and mask values are not remapped; use labels='per_source', or datasets whose masks "
                                  "share one class list")

    @staticmethod
    def _layout(ds: Dataset, name: str) -> str:
        px = ds.readers[name].px.px
        return f"fixed {px.height}x{px.width}" if px.fixed else "ragged"

    # ------------------------------------------------------------------ what the Loader asks
    def __len__(self) -> int:
        """Samples per epoch (the sources' counts together)."""
        return int(self.counts.sum())

    def units(self, batch_size: int, drop_last: bool) -> int:
        """Units of the epoch's order the Loader partitions: samples, or with one source per batch, batches."""
        if not self.chunked:
            return len(self)
        c = self.counts
        return int((c // batch_size).sum() if drop_last else (-(-c // batch_size)).sum())

    def order(self, order: str, seed: int, epoch: int, window: int | None, batch_size: int = 1,
              drop_last: bool = False) -> np.ndarray:
        """The epoch's ids over every source (or, one source per batch, the batch numbers of :meth:`chunk`)."""
        if not self.chunked:
            return mixture_order(self.sizes, self.shard_sizes, self.counts, order, seed, epoch, self.replace, window)
        return np.arange(self.units(batch_size, drop_last), dtype=np.int64)

    def chunk_table(self, order: str, seed: int, epoch: int, window: int | None, batch_size: int,
                    drop_last: bool) -> tuple[np.ndarray, np.ndarray]:
        """One source per batch: the epoch's ids regrouped into batches and each batch's bounds (batch u is
        ``ids[bounds[u]:bounds[u + 1]]``; :func:`~dsc.runtime.orders.mixture.chunks`)."""
        key = (order, seed, epoch, window, batch_size, drop_last)
        table = self._chunk_cache.get(key)
        if table is None:
            ids = mixture_order(self.sizes, self.shard_sizes, self.counts, order, seed, epoch, self.replace, window)
            table = chunks(ids, self.offsets[:-1], batch_size, drop_last)
            self._chunk_cache = {key: table}  # (the last one: an epoch asks for it once per rank's batch list)
        return table

    def identity(self) -> tuple:
        """(shard sizes, fingerprint, versions): what a saved loader state must match."""
        h = hashlib.sha256(json.dumps({
            "sources": [ds.manifest.checksum() for ds in self.datasets], "counts": self.counts.tolist(),
            "replace": self.replace, "labels": self.labels, "aliases": self.aliases, "chunked": self.chunked,
        }, sort_keys=True).encode()).hexdigest()
        return self.shard_sizes, h, [ds.version for ds in self.datasets]

    def describe(self) -> dict:
        """What a saved loader state records of the mixture, in words (JSON): each source's path, manifest
        checksum and size, the per-epoch counts and the options that made them. :func:`differences` reads two of
        them to say why a state does not resume here."""
        return {"sources": [{"path": str(ds.path), "checksum": ds.manifest.checksum()[:12], "size": len(ds)}
                            for ds in self.datasets],
                "counts": self.counts.tolist(), "weights": self.weights, "epoch_size": self.epoch_size,
                "choose": self.choose, "replace": self.replace, "labels": self.labels, "aliases": self.aliases,
                "one_source_per_batch": self.chunked}

    @property
    def schema(self):
        return self.datasets[0].schema

    @property
    def classes(self):
        """``labels="names"``: the merged class list; else each source's own (a list per source)."""
        if self.class_names is not None:
            return list(self.class_names)
        return [ds.classes for ds in self.datasets]

    @property
    def mask_classes(self):
        return None  # (no per-box masks are derived for a mixture in format="torchvision")

    @property
    def shard_bytes(self) -> int:
        return sum(ds.shard_bytes for ds in self.datasets)

    @property
    def remote(self) -> bool:
        return any(ds.remote for ds in self.datasets)

    def load_to_ram(self) -> None:
        for ds in self.datasets:
            ds.load_to_ram()

    def make_reads(self, names: list[str], **kw) -> _Reads:
        """The sources' read strategies, ``names[s]`` for source ``s``."""
        return _Reads(names, self.datasets, **kw)

    def split(self, ids: np.ndarray) -> list[tuple[int, np.ndarray, int, int]]:
        """(source, its indices, a, b) of each source's run of the sorted ids ``ids`` (rows a:b of the batch)."""
        ids = np.asarray(ids, np.int64)
        cuts = np.searchsorted(ids, self.offsets).tolist()
        return [(s, ids[a:b] - off, a, b) for s, (off, a, b) in enumerate(zip(self._starts, cuts, cuts[1:])) if b > a]

    def schedule(self, batches: list[np.ndarray], start: int, reads: _Reads, schedule_of) -> _Schedules | None:
        """Each source's read schedule of the epoch over its share of every batch (``schedule_of(dataset, reads,
        batches, start)``: the Loader's, with its cache budgets)."""
        each = [schedule_of(ds, reads[s], _Share(batches, int(self.offsets[s]), int(self.offsets[s + 1])), start)
                for s, ds in enumerate(self.datasets)]
        out = _Schedules(each)
        return out if out.each else None

    def sample_sizes(self, ids) -> torch.Tensor:
        parts = [self.datasets[s].sample_sizes(idx) for s, idx, _, _ in self.split(ids)]
        return torch.cat(parts) if parts else torch.zeros((0, 2), dtype=torch.int64)

    def get_batch(self, ids, boxes=None, images=None, alloc=None, geometry=None, post=None, reads=None,
                  to_torchvision: bool = False) -> Batch:
        """The batch of sorted ids ``ids``: each source's samples gathered by its dataset (its rows of every
        per-sample field straight into a slice of the batch's buffer), then the rest (ragged bytes, box rows)
        joined; ``source`` (B,) says whose each sample is, ``index`` its index in that source.
        ``to_torchvision`` (``Dataset.get_batch``'s) changes nothing here: a mixture's masks are joined as
        crops."""
        alloc = alloc or new_tensor
        ids = np.asarray(ids, np.int64).reshape(-1)
        if len(ids) and (ids[0] < 0 or ids[-1] >= self.offsets[-1] or bool((ids[1:] < ids[:-1]).any())):
            raise ConfigError(f"a mixture's get_batch takes ids (offsets[source] + index, the mixture's .offsets) "
                              f"sorted and in [0, {int(self.offsets[-1])}); got {ids[:8].tolist()}"
                              f"{'...' if len(ids) > 8 else ''}")
        if geometry is None and post is None and self._all_dense:
            return self._get_dense(ids, alloc, reads)
        parts = self.split(ids)
        B = len(ids)
        shared: dict[str, torch.Tensor] = {}
        got = []
        for s, idx, a, b in parts:
            ds = self.datasets[s]
            plan = None if geometry is None else _plan_rows(geometry, a, b)
            dense = self._dense(ds, geometry is not None or post is not None)
            batch = ds.get_batch(idx, "packed", images, self._part_alloc(alloc, shared, dense, s, a, b, B),
                                 geometry=plan, post=post, reads=reads[s] if reads is not None else None)
            self._map_labels(batch, s)
            got.append((s, a, b, batch))
        if len(got) == 1:
            out = got[0][3]
        else:
            out = Batch(self._join(got, shared, alloc, B), schema=self.schema)
        src = alloc("source", (B,), torch.int64)
        for s, _, a, b in parts:
            src[a:b] = s
        out["source"] = src
        return box_form(out, self.schema, boxes or self.datasets[0].box_form, alloc)

    def _get_dense(self, ids: np.ndarray, alloc, reads) -> Batch:
        """The batch of sorted ids ``ids`` when every field is one row per sample, of one shape across the sources
        (fixed pixels, labels: :attr:`_all_dense`), and nothing is transformed in the gather: each field allocated
        once for the whole batch and each source's reader writing its rows a:b straight in. A three-source batch
        then costs one dataset's plus two reader calls per field (not three dataset batches' assembly, then a
        join): the Python a batch runs is what a mixture adds to the copies, and on a loaded machine each of its
        steps costs several times what it does alone."""
        B = len(ids)
        full: dict[str, torch.Tensor] = {}
        arrays: dict[str, np.ndarray] = {}  # (their numpy views, which the readers write)
        rows = [0, 0]  # the batch's rows the source being gathered writes

        def part(name: str, shape: tuple, dtype) -> np.ndarray:
            arr = arrays.get(name)
            if arr is None:
                full[name] = alloc(name, (B, *(int(v) for v in shape[1:])), torch_dtype(dtype))
                arr = arrays[name] = full[name].numpy()
            a, b = rows
            if not len(shape) or shape[0] != b - a or arr.shape[1:] != tuple(shape[1:]) or arr.dtype != dtype:
                raise DscError(f"a mixture's batch: field {name!r} of a source came as {tuple(shape)} {dtype}, not "
                               f"rows {a}:{b} of the batch's {arr.shape} {arr.dtype}")  # (_check_fields and
            return arr[a:b]  # check_pixels refuse sources that disagree: this is a bug, not bad input)

        index, source = alloc("index", (B,), torch.int64), alloc("source", (B,), torch.int64)
        index_np, source_np = index.numpy(), source.numpy()
        cuts = np.searchsorted(ids, self.offsets).tolist()
        for s, (ds, readers, forms, holes, start) in enumerate(self._gatherers(reads)):
            a, b = rows[0], rows[1] = cuts[s], cuts[s + 1]
            if b == a:
                continue
            idx = index_np[a:b]
            np.subtract(ids[a:b], start, out=idx)  # (the source's own indices: the batch's "index")
            local = idx if holes is None else holes[idx]
            for reader in readers:
                reader.gather(local, part, forms)
            source_np[a:b] = s
            if self._luts is not None and "label" in full:
                self._map_labels({"label": full["label"][a:b]}, s)
        out = Batch(full, schema=self.schema)
        out["index"], out["source"] = index, source
        return out

    def _gatherers(self, reads) -> list[tuple]:
        """Per source, what :meth:`_get_dense` hands its readers: (dataset, readers, forms, index -> row table or
        None, first id), made once per read strategy object (one tuple: Loaders sharing this mixture, each with
        its own reads, never see another's)."""
        made = self._gathering
        if made[0] is not reads:
            made = self._gathering = (reads, [
                (ds, tuple(ds.readers.values()),
                 {"images": ds.image_form, "reads": None if reads is None else reads[s]}, ds._rows,
                 int(self.offsets[s]))
                for s, ds in enumerate(self.datasets)])
        return made[1]

    def _dense(self, ds: Dataset, transformed: bool) -> set[str]:
        """Keys of ``ds``'s batches with one row per sample of one shape across sources: written in place."""
        keys = {"index", "label", "image_id", "orig_size"}
        for name in ds.schema.pixels():
            if transformed or ds.readers[name].px.px.fixed:
                keys.add(name)
        return keys

    @staticmethod
    def _part_alloc(alloc, shared: dict, dense: set, s: int, a: int, b: int, B: int):
        def part(name: str, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
            if name in dense and len(shape) and shape[0] == b - a:
                full = shared.get(name)
                if full is None:
                    full = shared[name] = alloc(name, (B, *shape[1:]), dtype)
                if tuple(full.shape[1:]) == tuple(shape[1:]) and full.dtype == dtype:
                    return full[a:b] if full.dim() else full
            return alloc(f"{name}@{s}", shape, dtype)  # (joined after every source is gathered)
        return part

    def _map_labels(self, batch: dict, s: int) -> None:
        if self._luts is None:
            return
        lut = self._luts[s]
        for key in ("label", "labels"):
            if key in batch and len(batch[key]):
                batch[key].copy_(lut[batch[key].long()].to(batch[key].dtype))

    def _join(self, got: list, shared: dict, alloc, B: int) -> dict:
        out = {}
        first = got[0][3]
        offsets = self._offset_keys()
        for key in first:
            views = [g[3][key] for g in got]
            if key in shared and all(v.data_ptr() == shared[key][a:b].data_ptr() or b == a
                                     for v, (_, a, b, _) in zip(views, got)):
                out[key] = shared[key]
            elif key in offsets:  # per sample (B+1), per box (box_offsets) or per object mask (M+1): shifted
                n = sum(len(v) - 1 for v in views)
                out[key] = _join_offsets(views, alloc(key, (n + 1,), torch.int64))
            elif key.endswith("_sizes") and key[:-6] in self.schema:
                out[key] = torch.cat(views, out=alloc(key, (B, *views[0].shape[1:]), views[0].dtype))
            elif f"{key}_sizes" in first:  # ragged, padded: each source's to the batch's largest
                out[key] = self._pad_join(key, views, alloc)
            else:
                shape = (sum(len(v) for v in views), *views[0].shape[1:])
                out[key] = torch.cat(views, out=alloc(key, shape, views[0].dtype))
        return out

    def _offset_keys(self) -> set[str]:
        """The batch's offset indices, by the schema's roles: ``box_offsets`` (per sample, into the box rows),
        a ragged image-like or value key's ``<key>_offsets`` (per sample, into its rows) and an object masks
        key's ``<key>_offsets`` (per object, into its flat crops): each source's joined shifted by the rows
        (or bytes) of the sources before it."""
        return {"box_offsets"} | {f"{k}_offsets" for k, r in self.schema.items()
                                  if r.kind in ("pixels", "ragged", "object_masks")}

    def _pad_join(self, key: str, views: list[torch.Tensor], alloc) -> torch.Tensor:
        """Each source's padded rows of ``key`` into one batch, every axis after the first padded to the largest."""
        tail = tuple(max(v.shape[d] for v in views) for d in range(1, views[0].dim()))
        out = alloc(key, (sum(len(v) for v in views), *tail), views[0].dtype)
        fill = self.datasets[0].ignore_index if key == "mask" else 0
        out.fill_(fill or 0)
        a = 0
        for v in views:
            out[(slice(a, a + len(v)), *(slice(0, n) for n in v.shape[1:]))] = v
            a += len(v)
        return out

    # ------------------------------------------------------------------ life
    def close(self) -> None:
        """Close the sources this mixture opened from paths (datasets passed open stay open)."""
        for ds in getattr(self, "_owned", []):
            ds.close()

    def __repr__(self) -> str:
        parts = ", ".join(f"{ds.path}: {int(c)}" for ds, c in zip(self.datasets, self.counts))
        return f"dsc.Mixture({len(self.datasets)} sources, {len(self)} samples per epoch: {parts})"


def with_sources(batch: dict, output, schema, **kw) -> tuple:
    """``format="torchvision"`` over a mixture: ``output(batch)`` (:func:`~dsc.runtime.batches.torchvision_form`)
    with each target saying whose sample it is, ``source`` (the source's index in the list; with
    ``labels="per_source"`` label k of two sources names two classes): detection target dicts get ``"source"``
    (an int, like their ``"image_id"``, which is the source's own), a dict of targets the batch's ``source``
    (B,), and a lone target tensor (labels, masks, a value) becomes ``{its key: it, "source": (B,)}``."""
    source = batch["source"]
    images, target = output(batch, **kw)  # (``alloc``: the ring slot's buffers, as for one dataset)
    if isinstance(target, list) and all(isinstance(t, dict) for t in target):
        for t, s in zip(target, source.tolist()):
            t["source"] = s
    elif isinstance(target, dict):
        target["source"] = source
    else:
        masks = [k for k in schema.pixels() if k != "image" and k in batch]
        key = "mask" if masks else "label" if "label" in batch else next(k for k in value_keys(schema) if k in batch)
        target = {key: target, "source": source}
    return images, target


def differences(saved: dict, ours: dict) -> str:
    """How the mixture a loader state was saved over (``saved``, :meth:`Mixture.describe`) differs from this
    loader's (``ours``), in words ('' when it does not): which sources, their order, the weights and counts,
    labels=, replace=, one_source_per_batch=."""
    out = []
    a, b = saved.get("sources", []), ours["sources"]
    name = lambda src: f"{src['path']} ({src['size']} samples, checksum {src['checksum']})"  # noqa: E731
    if [x["checksum"] for x in a] != [x["checksum"] for x in b]:
        if sorted(x["checksum"] for x in a) == sorted(x["checksum"] for x in b):
            out.append(f"its sources are in another order (the saved run's: {', '.join(x['path'] for x in a)}; "
                       f"this loader's: {', '.join(x['path'] for x in b)}): list them in the run's order")
        elif len(a) != len(b):
            out.append(f"it mixed {len(a)} sources ({', '.join(x['path'] for x in a)}), this loader {len(b)} "
                       f"({', '.join(x['path'] for x in b)})")
        else:
            for s, (x, y) in enumerate(zip(a, b)):
                if x["checksum"] != y["checksum"]:
                    out.append(f"its source {s} was {name(x)}, this loader's is {name(y)}")
    for key in ("one_source_per_batch", "labels", "aliases", "replace", "weights", "epoch_size", "choose"):
        if key in saved and saved[key] != ours[key]:
            out.append(f"{key}={saved[key]!r} in the saved run, {ours[key]!r} here")
    if not out and saved.get("counts") != ours["counts"]:
        out.append(f"samples per epoch from each source: {saved.get('counts')} in the saved run, {ours['counts']} here")
    elif saved.get("counts") != ours["counts"] and any(k in " ".join(out) for k in ("weights", "epoch_size", "choose")):
        out.append(f"so each source gives {ours['counts']} samples per epoch, not {saved.get('counts')}")
    return "; ".join(out)


def _plan_rows(plan, a: int, b: int):
    """Samples ``a:b`` of a batch's geometry (:class:`~dsc.transforms.fused.ChainPlan`): every per-sample part
    sliced (matrices, programs, sizes before and after, which samples mirror x: what moves object masks and swaps
    keypoints), the rest as it is."""
    if getattr(plan, "keep", None) is not None:  # (per box: drawn from the boxes, which a gather plan never is)
        raise ConfigError("a mixture's gather cannot split a geometry that drops boxes; run that op after the gather")
    cut = lambda v: None if v is None else v[a:b]  # noqa: E731
    return dataclasses.replace(plan, matrices=plan.matrices[a:b], programs=cut(plan.programs), sizes=cut(plan.sizes),
                               hflip=cut(plan.hflip), out_sizes=cut(plan.out_sizes))


def ds_joints(ds: Dataset, key: str) -> int:
    """Keypoints per box of a dataset's keypoints field ``key`` (its stored (M, K, 3) rows)."""
    return int(ds.readers[key].points.shape[1])


def _join_offsets(views: list[torch.Tensor], out: torch.Tensor) -> torch.Tensor:
    """Offsets (B_s + 1) of each source's rows, joined into the batch's (B + 1), each shifted by the rows before."""
    out[0] = 0
    a, base = 1, 0
    for v in views:
        n = len(v) - 1
        out[a:a + n] = v[1:] + base
        base += int(v[-1])
        a += n
    return out
