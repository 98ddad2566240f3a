"""``dsc.Loader``: FFCV-style fast epochs over a compiled dataset.

How a batch is made: the epoch's order (a pure function of seed, epoch, rank, world size; ``orders/``)
is cut into batches; a batch's indices are sorted by storage position, so each shard it touches is one
contiguous run gathered by a single ``numpy.take`` straight into a slot of the prefetch ring
(``prefetch.py``: its buffers, filler threads and CUDA copies). This module is the API: options,
epochs (each new iteration starts the next one, as FFCV's loader does), resume, the samples drawn from
(a ``Subset`` or ``indices=``) and the batch forms handed out (``keys=`` tuples, ``format="torchvision"``).
"""
from __future__ import annotations

import hashlib
import inspect
import os
import threading
import warnings
import weakref
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch

from ..errors import ConfigError
from .batches import mask_values_of_labels, select_keys, torchvision_form
from .dataset import Dataset, check_forms, not_a_dataset
from .mixture import Mixture, differences, with_sources
from .orders import ORDERS, partition
from .orders.partition import TAILS, part_size, remaining
from .orders.quasi_random import DEFAULT_WINDOW
from . import reads as R
from .prefetch import EpochIterator, Ring
from .storage import CACHES
from ..transforms import BatchOp, Compose, Geometric, PIXEL_OPS
from ..transforms.objects import unknown_flip_warning
from .remote import CONNECTIONS, _local_processes


def _whole(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


MAX_PREFETCH = 256  # batches in flight; the ring holds that many batches' buffers
FORMATS = ("dict", "torchvision")


def _positions(indices, n: int, what: str) -> np.ndarray:
    """``indices`` (a list, range, array or tensor of ints; negative ones count from the end) checked against
    ``n`` samples, as an int64 array."""
    if isinstance(indices, torch.Tensor):
        indices = indices.detach().cpu().numpy()
    try:
        idx = np.asarray(indices)
    except (TypeError, ValueError):
        idx = np.asarray([], object)
    if idx.ndim != 1 or (idx.size and idx.dtype.kind not in "iu"):
        raise ConfigError(f"{what} must be a 1-D sequence of sample numbers (ints), got {type(indices).__name__}"
                          + (f" of {idx.dtype}" if idx.ndim == 1 else f" with shape {idx.shape}"))
    if idx.size == 0:
        raise ConfigError(f"{what} selects no sample; give at least one index")
    idx = idx.astype(np.int64)
    bad = (idx < -n) | (idx >= n)
    if bad.any():
        raise ConfigError(f"{what} holds {int(idx[bad][0])}, outside the {n} samples it indexes")
    return np.where(idx < 0, idx + n, idx)


def _samples_of(dataset, indices) -> tuple[Dataset, np.ndarray | None]:
    """The compiled dataset a Loader reads and the samples it draws from (None: all of them), from what was
    passed: a :class:`Dataset`, a path, or ``torch.utils.data.Subset`` of one (nested ones compose), then
    ``indices`` (positions in what was passed)."""
    from torch.utils.data import Subset

    chain = []
    while isinstance(dataset, Subset):
        chain.append(dataset.indices)
        dataset = dataset.dataset
    if isinstance(dataset, (str, os.PathLike)):
        dataset = Dataset(dataset)
    elif not isinstance(dataset, Dataset):
        raise not_a_dataset(dataset, "dsc.Loader", subset=bool(chain))
    idx = None
    for sub in reversed(chain):  # the innermost Subset indexes the dataset itself
        pos = _positions(sub, len(dataset) if idx is None else len(idx), "a Subset's indices")
        idx = pos if idx is None else idx[pos]
    if indices is not None:
        pos = _positions(indices, len(dataset) if idx is None else len(idx), "indices")
        idx = pos if idx is None else idx[pos]
    return dataset, idx


def _mixture_of(dataset, indices, **options) -> tuple[Mixture, None] | None:
    """A list of datasets (or a :class:`Mixture`) with the Loader's mixture options: the mixture it reads; None
    for anything else (then ``options`` must be their defaults)."""
    mixture = isinstance(dataset, (list, tuple, Mixture))
    if mixture and indices is not None:
        raise ConfigError("indices= picks samples of one dataset; a mixture chooses its samples by weights=, "
                          "epoch_size= and choose=")
    if isinstance(dataset, (list, tuple)):
        return Mixture(list(dataset), **options), None
    given = sorted(k for k, v in options.items() if not (v is None if _MIXTURE_DEFAULTS[k] is None else
                                                         type(v) is type(_MIXTURE_DEFAULTS[k]) and
                                                         v == _MIXTURE_DEFAULTS[k]))
    if given:
        names = ", ".join(f"{k}=" for k in given)
        if mixture:
            raise ConfigError(f"{names} given with a dsc.Mixture, which already says "
                              f"{'these' if len(given) > 1 else 'it'}: give {'them' if len(given) > 1 else 'it'} to dsc.Mixture([a, b], ...) or pass the "
                              f"list itself, dsc.Loader([a, b], weights=[0.7, 0.3])")
        raise ConfigError(f"{names} {'are' if len(given) > 1 else 'is'} for a mixture (a list of datasets: "
                          f"dsc.Loader([a, b], weights=[0.7, 0.3])); this Loader reads one dataset")
    return (dataset, None) if mixture else None


_MIXTURE_DEFAULTS = {"weights": None, "epoch_size": None, "choose": None, "replace": False, "labels": "per_source",
                     "one_source_per_batch": False}


def _takes_rank(fn) -> bool:
    """Whether a plain transforms callable accepts ``rank=`` (older ones take seed, epoch, batch_index)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "rank" or p.kind == p.VAR_KEYWORD for p in params)


def _takes_draws(fn) -> bool:
    """Whether a plain transforms callable takes ``seed=, epoch=, batch_index=`` (the draws' key)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return True
    return all(k in params for k in ("seed", "epoch", "batch_index")) or \
        any(p.kind == p.VAR_KEYWORD for p in params.values())


def _distributed_defaults(rank, world_size) -> tuple[int, int]:
    for name, v in (("rank", rank), ("world_size", world_size)):
        if v is not None and not _whole(v):
            raise ConfigError(f"{name} must be an int, got {v!r}")
    if rank is None or world_size is None:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            rank = dist.get_rank() if rank is None else rank
            world_size = dist.get_world_size() if world_size is None else world_size
    return (0 if rank is None else int(rank)), (1 if world_size is None else int(world_size))


# torch DataLoader arguments a script may pass out of habit: what dsc.Loader takes instead
DATALOADER_HABITS = {
    "shuffle": 'pass order="random" (shuffle=False is order="sequential", the default; order="quasi_random" draws a random '
               'order shard-window by shard-window)',
    "num_workers": "pass num_threads= (batches are made by threads, not worker processes; default 2, 0: in the calling "
                   "thread)",
    "prefetch_factor": "pass prefetch= (batches in flight)",
    "pin_memory": 'leave it out: batches for device="cuda" are gathered into pinned memory already',
    "collate_fn": "pass transforms= (a callable on each batch dict) or keys= / format= (what a batch is handed out as); "
                  "batches are collated by the gather",
    "sampler": "pass indices= (or a torch.utils.data.Subset) to pick samples, order= to order them",
    "batch_sampler": "pass indices= (or a torch.utils.data.Subset) to pick samples, order= to order them",
    "generator": "pass seed=",
    "persistent_workers": "leave it out: there are no worker processes",
    "worker_init_fn": "leave it out: there are no worker processes",
    "multiprocessing_context": "leave it out: there are no worker processes",
    "timeout": "leave it out: there are no worker processes",
}


def _checked_keywords(init):
    """``Loader.__init__`` refusing an unknown keyword in one line: a DataLoader habit (``shuffle=True``,
    ``num_workers=2``) gets what dsc.Loader takes instead, any other name the list of those it takes."""
    import functools

    known = set(inspect.signature(init).parameters) - {"self"}

    @functools.wraps(init)
    def checked(self, *args, **kwargs):
        for name in kwargs:
            if name not in known:
                hint = DATALOADER_HABITS.get(name)
                raise ConfigError(f"dsc.Loader has no {name}= argument (torch's DataLoader has): {hint}" if hint
                                  else f"dsc.Loader has no {name}= argument; it takes: {', '.join(sorted(known))}")
        return init(self, *args, **kwargs)
    return checked


@dataclass(frozen=True)
class _Resume:
    epoch: int
    batches: int
    stages: tuple = ()  # runs of other layouts that served part of the epoch before: ((world_size, taken, tail,
    #                     batches), ...) (orders/partition.py: remaining)


class LoaderSampler:
    """``loader.sampler``: the part of a Loader that scripts written for a DataLoader talk to through its
    sampler (``DistributedSampler``): ``set_epoch(e)``, ``len()`` (this rank's samples per epoch) and
    iteration (this rank's samples of the loader's epoch, in the order they are drawn)."""

    def __init__(self, loader: "Loader"):
        self.loader = loader

    def set_epoch(self, epoch: int) -> None:
        self.loader.set_epoch(epoch)

    def __len__(self) -> int:
        if getattr(self.loader.dataset, "chunked", False):  # (units are batches: count their samples)
            return sum(len(b) for b in self.loader.batch_indices())
        return self.loader.samples_per_rank()

    def __iter__(self):
        if getattr(self.loader.dataset, "chunked", False):  # (a mixture's units are batches: their samples)
            return iter(np.concatenate(self.loader.batch_indices() or [np.zeros(0, np.int64)]).tolist())
        return iter(self.loader.epoch_order().tolist())

    @property
    def epoch(self) -> int:
        return self.loader.epoch

    @property
    def rank(self) -> int:
        return self.loader.rank

    @property
    def num_replicas(self) -> int:  # DistributedSampler's name for the world size
        return self.loader.world_size

    def __repr__(self) -> str:
        return f"LoaderSampler({len(self)} samples per epoch on rank {self.loader.rank} of {self.loader.world_size})"


class Loader:
    """Batches of a compiled dataset, fast: see the module docstring for how.

    ``order``: ``sequential`` | ``random`` | ``quasi_random`` (``window`` shards at a time). Deterministic
    given (seed, epoch, rank, world_size). ``rank`` / ``world_size`` default to torch.distributed's when
    it is initialised; ``tail`` = ``pad`` | ``drop`` makes every rank's part the same size.
    ``device``: ``cpu`` or ``cuda[:k]``. ``cache``: ``page`` (the OS page cache) or ``ram`` (read the
    dataset into this process first). ``read``: how batches get their bytes (``reads.py``): ``auto`` (default:
    ``mapped`` when the dataset fits in the memory available, else ``direct`` for random order and
    ``windowed`` for the others), or one of them forced; ``io_depth``: direct reads in flight.
    ``boxes`` / ``images``: batch forms (see :class:`dsc.Dataset`).
    ``transforms``: ops of dsc.transforms, or a callable ``(batch, seed=, epoch=, batch_index=[, rank=]) ->
    batch``; augmentations are drawn from (seed, epoch, rank, batch index).

    Epochs: each new iteration starts the next epoch (the first is 0, or the one ``set_epoch(e)`` pinned;
    a state loaded by ``load_state_dict`` is continued first). ``dataset`` may be a ``torch.utils.data.Subset``
    of a dsc dataset, and ``indices=`` picks samples too: the Loader draws from those only. ``keys=("image",
    "label")``: batches are tuples of those keys, in that order; ``format="torchvision"``: ``(images, targets)``
    as torchvision's models take them (:func:`~dsc.runtime.batches.torchvision_form`; crowd boxes, ``iscrowd``
    1, are left out of its targets unless ``keep_crowd=True``; its images and masks are views of reused
    buffers: ``clone()`` masks before writing into them other than by torch ops, or set
    ``DSC_MASKS_ZERO_WHOLE=1``, README "Instance masks and keypoints"). ``num_threads=0``:
    batches are made in the calling thread.

    Attributes: ``read_strategy`` and ``read_reason`` (which strategy runs and why: the dataset's size against
    the memory available when the Loader was made; ``$DSC_MEMORY`` overrides that figure), ``epoch``,
    ``rank``, ``world_size``, ``sampler``, ``indices``.
    """

    @_checked_keywords
    def __init__(self, dataset: Dataset | str, batch_size: int, order: str = "sequential", seed: int = 0,
                 drop_last: bool = False, device: str | torch.device = "cpu", num_threads: int = 2,
                 prefetch: int = 3, rank: int | None = None, world_size: int | None = None, tail: str = "pad",
                 cache: str = "page", window: int | None = None, transforms=None,
                 boxes: str | None = None, images: str | None = None, read: str = "auto",
                 io_depth: int = R.IO_DEPTH, indices=None, keys=None, format: str = "dict",  # noqa: A002
                 keep_crowd: bool = False, weights=None, epoch_size: int | None = None, choose=None, replace=False,
                 labels: str = "per_source", one_source_per_batch: bool = False):
        self._owns_dataset = isinstance(dataset, (str, os.PathLike, list, tuple))  # (opened here: closed with it)
        dataset, self.indices = _mixture_of(dataset, indices, weights=weights, epoch_size=epoch_size, choose=choose,
                                            replace=replace, labels=labels,
                                            one_source_per_batch=one_source_per_batch) or \
            _samples_of(dataset, indices)
        check_forms(boxes, images, allow_none=True)
        self.boxes, self.images = boxes, images  # None: the dataset's own default form
        self.keep_crowd = bool(keep_crowd)  # format="torchvision": crowd boxes (iscrowd 1) stay in the targets
        self._set_output(keys, format, dataset)
        if order not in ORDERS:
            raise ConfigError(f"order must be one of {', '.join(ORDERS)}, got {order!r}")
        for name, v in (("batch_size", batch_size), ("prefetch", prefetch), ("io_depth", io_depth)):
            if not _whole(v) or v < 1:
                raise ConfigError(f"{name} must be a positive int, got {v!r}")
        if not _whole(num_threads) or num_threads < 0:
            raise ConfigError(f"num_threads must be an int >= 0 (0: batches made in the calling thread), got "
                              f"{num_threads!r}")
        if prefetch > MAX_PREFETCH:
            raise ConfigError(f"prefetch={prefetch} batches in flight would hold that many batches in memory; at most "
                              f"{MAX_PREFETCH} (2-8 keep the GPU fed)")
        if not isinstance(drop_last, (bool, np.bool_)):
            raise ConfigError(f"drop_last must be True or False, got {drop_last!r}")
        if cache not in CACHES:
            raise ConfigError(f"cache must be one of {', '.join(CACHES)}, got {cache!r}")
        if tail not in TAILS:
            raise ConfigError(f"tail must be one of {', '.join(TAILS)}, got {tail!r}")
        if not _whole(seed) or seed < 0:
            raise ConfigError(f"seed must be a non-negative int, got {seed!r}")
        if window is not None and (not _whole(window) or window < 1):
            raise ConfigError(f"window must be a positive int (shards), got {window!r}")
        try:
            self.device = torch.device(device)
        except (RuntimeError, TypeError):  # (torch's message lists every device type it knows: not the point)
            self.device = None
        if self.device is None or self.device.type not in ("cpu", "cuda"):
            raise ConfigError(f"device {device!r} is not a device the Loader delivers batches to: 'cpu' or 'cuda' "
                              f"(a GPU; 'cuda:1' for the second)")
        if self.device.type == "cuda":
            if not torch.cuda.is_available():
                raise ConfigError(f"device {device!r} asked for, but CUDA is not available here; use device='cpu'")
            if self.device.index is None:  # bare "cuda": the current device of the thread that builds the Loader
                self.device = torch.device("cuda", torch.cuda.current_device())  # (torchrun: set_device(rank))
        self.rank, self.world_size = _distributed_defaults(rank, world_size)
        if not 0 <= self.rank < self.world_size:
            raise ConfigError(f"rank {self.rank} is not in [0, {self.world_size})")
        self.num_samples = len(dataset) if self.indices is None else len(self.indices)
        if isinstance(dataset, Mixture):  # (with one source per batch, the order's units are batches)
            self.num_samples = dataset.units(batch_size, drop_last)
        if tail == "drop" and self.world_size > self.num_samples:
            raise ConfigError(f"tail='drop' with world_size {self.world_size} > {self.num_samples} samples leaves "
                              f"every rank empty; use tail='pad'")
        self.dataset = dataset
        self.batch_size, self.order, self.seed, self.drop_last = batch_size, order, seed, drop_last
        self.num_threads, self.prefetch, self.tail = num_threads, prefetch, tail
        self.window = window if order == "quasi_random" else None
        if order == "quasi_random" and window is None:
            self.window = DEFAULT_WINDOW
        self.transforms = _compose(transforms)
        if hasattr(self.transforms, "bind"):  # ops that need the dataset (MixUp/CutMix: its number of classes)
            self.transforms.bind(dataset)
        flip_why = unknown_flip_warning(self.transforms.ops, dataset.schema) \
            if isinstance(self.transforms, Compose) and hasattr(dataset, "schema") else None
        if flip_why:  # (a warning, not a refusal: a set whose joints have no sides flips fine)
            warnings.warn(flip_why, stacklevel=2)
        # transforms move packed boxes: a padded or list form is made after them (on the CPU; on CUDA after
        # the copy the transforms refuse it, naming the packed form)
        self._after_boxes = None
        form = self._gather_boxes or getattr(dataset, "box_form", None)
        if isinstance(self.transforms, Compose) and form not in (None, "packed") and "boxes" in dataset.schema \
                and torch.device(device).type == "cpu":
            self._after_boxes, self._gather_boxes = form, "packed"
        self._transforms_take_rank = self.transforms is not None and not hasattr(self.transforms, "stages") and \
            _takes_rank(self.transforms)
        if isinstance(dataset, Mixture):
            dataset.check_pixels(self.transforms)
        # More copy threads than cores only thrash (measured: 4 threads on 2 cores ran at 1/4 the speed).
        self.threads_used = 0 if num_threads == 0 else max(1, min(num_threads, len(os.sched_getaffinity(0))
                                                                  if hasattr(os, "sched_getaffinity")
                                                                  else (os.cpu_count() or 1)))
        self.epoch = 0  # the epoch being iterated (or last iterated), or the next to start when none has
        self._started = False  # an iteration of self.epoch began: the next iteration starts epoch + 1
        self._served = 0
        self._resume: _Resume | None = None
        self._stages: tuple[int, tuple] = (-1, ())  # (epoch, what earlier runs served of it): an elastic resume
        self._sizes: dict = {}
        self._iterators: weakref.WeakSet = weakref.WeakSet()
        self._ring: Ring | None = None
        self._streams: list = []
        self._streams_lock = threading.Lock()
        self._warned_random = False
        if io_depth > R.MAX_IO_DEPTH:
            raise ConfigError(f"io_depth={io_depth} reads in flight would start that many threads; at most "
                              f"{R.MAX_IO_DEPTH} (16-32 keep a disk busy)")
        memory = None
        if cache != "ram":
            try:
                memory = R.available_memory()
            except ConfigError:
                if read in ("auto", "windowed"):  # (a strategy forced otherwise does not need the figure)
                    raise
        def remote(ds):  # (a dataset in object storage whose cache cannot hold a batch's shards: samples read by
            if not ds.remote:  # byte ranges; a batch's bytes only where a limit needs them: a shard table's
                return None    # layout gives them without fetching the table, issue 34)
            share = ds.storage.cache.share(_local_processes())
            slots = R.batch_slots(order, batch_size, ds.manifest.shard_size, self.window)
            return share, (ds.largest_slots_bytes(slots, within=share) if share else 0)

        kw = dict(io_depth=io_depth, memory=memory[0] if memory else None)
        if isinstance(dataset, Mixture):  # (each source its own strategy: one in a bucket with a small cache reads
            picks = [R.choose(order, dataset.shard_bytes, read, memory, cache, remote(ds))  # by ranges, a local
                     for ds in dataset.datasets]                                            # one maps)
            self.read_strategy, self.read_reason = R.join_choices(picks, [str(ds.path) for ds in dataset.datasets])
            self._reads = dataset.make_reads([name for name, _ in picks], **kw)
        else:
            self.read_strategy, self.read_reason = R.choose(order, dataset.shard_bytes, read, memory, cache,
                                                            remote(dataset))
            self._reads = R.make(self.read_strategy, dataset.storage, **kw)
        if cache == "ram":
            dataset.load_to_ram()

    # ------------------------------------------------------------------------ output
    def _set_output(self, keys, format, dataset: Dataset) -> None:  # noqa: A002
        """What a batch is handed out as: the dict (default), a tuple of ``keys``, or torchvision's form."""
        if format not in FORMATS:
            raise ConfigError(f"format must be one of {', '.join(map(repr, FORMATS))}, got {format!r}")
        self.format, self.keys, self._output = format, None, None
        self._gather_boxes = self.boxes
        if keys is not None:
            if format != "dict":
                raise ConfigError("keys= picks keys of the dict batches; format='torchvision' hands out its own tuple "
                                  "(images, targets): give one of the two")
            if isinstance(keys, str) or not isinstance(keys, (tuple, list)) or not keys or \
                    not all(isinstance(k, str) for k in keys):
                raise ConfigError(f"keys must be a tuple of batch keys, e.g. keys=('image', 'label'), got {keys!r}")
            self.keys = tuple(keys)
            self._output = partial(select_keys, keys=self.keys)
        elif format == "torchvision":
            if self.boxes not in (None, "packed"):
                raise ConfigError(f"format='torchvision' makes its own per-image target dicts; drop boxes="
                                  f"{self.boxes!r}")
            self._gather_boxes = "packed"
            mask_values = None
            if "boxes" in dataset.schema and dataset.mask_classes is not None and not dataset.schema.object_masks():
                mask_values, why = mask_values_of_labels(dataset.classes, dataset.mask_classes,
                                                         (dataset.manifest.source or {}).get("labels") == "category_ids")
                if mask_values is None:
                    warnings.warn(f"format='torchvision': the targets carry no per-box \"masks\": {why} "
                                  f"(\"mask\", the semantic mask, is there)", stacklevel=2)
            self._output = partial(torchvision_form, schema=dataset.schema, mask_values=mask_values,
                                   keep_crowd=self.keep_crowd)
            if isinstance(dataset, Mixture):  # (each target says its source: labels are per source)
                self._output = partial(with_sources, output=self._output, schema=dataset.schema)

    @property
    def classes(self) -> list[str]:
        """What each class label of this loader's batches means: ``classes[k]`` names label k. The dataset's
        classes, but with ``format="torchvision"`` on a dataset with boxes: ``["__background__", *classes]``
        (torchvision's detection models keep label 0 for the background, so box labels there are 1-based)."""
        names = self.dataset.classes
        if self.format == "torchvision" and "boxes" in self.dataset.schema:
            if isinstance(self.dataset, Mixture) and self.dataset.class_names is None:  # (per source: a list each)
                return [["__background__", *n] for n in names]
            return ["__background__", *names]
        return names

    @property
    def sampler(self) -> LoaderSampler:
        """What a script written for a DataLoader asks of ``loader.sampler``: ``set_epoch``, ``len``, iteration."""
        return LoaderSampler(self)

    # ------------------------------------------------------------------------ order
    def _whole_order(self, epoch: int) -> np.ndarray:
        """The samples of ``epoch`` on every rank together, in order (dataset indices)."""
        ds = self.dataset
        if isinstance(ds, Mixture):
            return ds.order(self.order, self.seed, epoch, self.window, self.batch_size, self.drop_last)
        fn, K = ORDERS[self.order], ds.manifest.shard_size
        if self.indices is None:
            return fn(len(ds), K, self.seed, epoch, window=self.window)
        if self.order != "quasi_random":  # an order of the selected samples (sequential: as they were given)
            return self.indices[fn(len(self.indices), K, self.seed, epoch, window=self.window)]
        # quasi_random windows are windows of storage: the dataset's order, keeping the selected samples (each as
        # often as it was selected)
        full = fn(len(ds), K, self.seed, epoch, window=self.window)
        by_row = np.argsort(self.indices, kind="stable")
        rows = self.indices[by_row]
        lo, hi = np.searchsorted(rows, full, "left"), np.searchsorted(rows, full, "right")
        counts = hi - lo
        first = np.repeat(lo, counts)
        within = np.arange(len(first)) - np.repeat(np.cumsum(counts) - counts, counts)
        return rows[first + within]

    def epoch_order(self, epoch: int | None = None) -> np.ndarray:
        """This rank's samples for ``epoch`` (default: the loader's), in the order they are served (before
        in-batch sorting). The epoch's order over every rank does not depend on the world size; a rank's share
        is a contiguous slice of it, or, in an epoch resumed on another world size or batch size, a slice of
        what the earlier runs had not served (``load_state_dict``)."""
        epoch = self.epoch if epoch is None else epoch
        order = remaining(self._whole_order(epoch), self._epoch_stages(epoch))
        return partition(order, self.rank, self.world_size, self.tail)

    def _epoch_stages(self, epoch: int) -> tuple:
        return self._stages[1] if self._stages[0] == epoch else ()

    def _epoch_samples(self, stages: tuple) -> int:
        """Samples of an epoch left to every rank together after ``stages`` (all of them without)."""
        if not stages:
            return self.num_samples
        if stages not in self._sizes:
            self._sizes[stages] = len(remaining(np.arange(self.num_samples), stages))
        return self._sizes[stages]

    def samples_per_rank(self) -> int:
        return part_size(self._epoch_samples(self._epoch_stages(self.epoch)), self.world_size, self.tail)

    def __len__(self) -> int:
        """Batches per epoch on this rank."""
        return self._batches_of(self.samples_per_rank())

    def _batches_of(self, units: int) -> int:
        per = self._batch_units()
        return units // per if self.drop_last else -(-units // per)

    def batch_indices(self, epoch: int | None = None) -> list[np.ndarray]:
        """The index sets of every batch of ``epoch`` on this rank, sorted as they are gathered."""
        part = self.epoch_order(epoch)
        if getattr(self.dataset, "chunked", False):  # one source per batch: each unit of the order is a batch
            ids, bounds = self.dataset.chunk_table(self.order, self.seed, self.epoch if epoch is None else epoch,
                                                   self.window, self.batch_size, self.drop_last)
            return [np.sort(ids[bounds[u]:bounds[u + 1]]) for u in part.tolist()]
        n = len(part) // self.batch_size * self.batch_size if self.drop_last else len(part)
        return [np.sort(part[a:min(a + self.batch_size, n)]) for a in range(0, n, self.batch_size)]

    def set_epoch(self, epoch: int) -> None:
        """Pin the epoch the next iteration serves (the order and the augmentations depend on it); later
        iterations go on from it. Not needed: each new iteration starts the next epoch by itself. Keeps a
        position loaded by load_state_dict for that epoch."""
        if not _whole(epoch) or epoch < 0:
            raise ConfigError(f"epoch must be a non-negative int, got {epoch!r}")
        epoch = int(epoch)
        if self._resume is not None and self._resume.epoch != epoch:
            self._resume = None
        if self._stages[0] != epoch:
            self._stages = (-1, ())
        self.epoch, self._started = epoch, False
        self._served = self._resume.batches if self._resume else 0

    def _in_progress(self) -> bool:
        """An iteration of ``self.epoch`` is under way: an iterator of it is alive and not finished."""
        return self._served < len(self) and any(it.alive for it in list(self._iterators))

    def _position(self) -> tuple[int, int]:
        """(epoch, batches of it already handed out) of the next batch this loader serves: in the iteration
        under way, else where the next iteration starts."""
        if self._resume is not None:
            return self._resume.epoch, self._resume.batches
        if not self._started:
            return self.epoch, self._served
        if self._in_progress():
            return self.epoch, self._served
        return self.epoch + 1, 0

    # ------------------------------------------------------------------------ iteration
    def __iter__(self):
        """One epoch: the next one (each new iteration advances), the one ``set_epoch`` pinned, or the rest of
        the one ``load_state_dict`` loaded."""
        for it in list(self._iterators):  # one epoch in flight at a time: an older iterator now raises
            it.close(superseded="this epoch's iterator was closed because a new iteration of the same Loader "
                                "started; use one iterator per Loader at a time (or a second Loader)")
        self.epoch, start = self._position()  # (the older iterators are closed: a started epoch is over)
        if self._resume is not None:
            self._stages = (self.epoch, self._resume.stages)
        elif self._stages[0] != self.epoch:
            self._stages = (-1, ())
        self._resume = None
        self._started = True
        self._served = start
        it = EpochIterator(self, self.batch_indices(), start)
        self._iterators.add(it)
        return it

    def close(self) -> None:
        """Stop the filler threads of any epoch in flight and release every buffer. An epoch being iterated
        then raises at its next batch (it does not end as if it were complete)."""
        self._interrupt("the Loader was closed (loader.close()) during this epoch; its remaining batches were not "
                        "served")
        self._release_ring()
        reads = getattr(self, "_reads", None)
        if reads is not None:
            reads.close()
        if getattr(self, "_owns_dataset", False):
            self.dataset.close()

    def _interrupt(self, why: str) -> None:
        for it in list(self._iterators):
            it.close(superseded=why)

    def _schedule(self, batches: list[np.ndarray], start: int):
        """The epoch's read schedule (``schedule.py``), or None: a dataset in object storage downloads the
        coming batches' shards ahead of them into the cache, within its limit (whatever the strategy, which
        then reads the cached files); a windowed read maps and reads them ahead and releases them behind."""
        if isinstance(self.dataset, Mixture):  # (one schedule per source, over its samples of each batch)
            return self.dataset.schedule(batches, start, self._reads, self._schedule_of)
        return self._schedule_of(self.dataset, self._reads, batches, start)

    def _schedule_of(self, ds: Dataset, reads, batches: list[np.ndarray], start: int):
        if start >= len(batches) or not (ds.remote or reads.name == "windowed") or \
                not getattr(reads, "holds_shards", True):
            return None  # (a local dataset read in place, or one read by byte ranges: nothing to schedule)
        needs, paths, nbytes = ds.shard_plan(batches)
        if not ds.remote:
            return reads.schedule(needs, start, nbytes, paths)
        storage = ds.storage
        storage.renew_lease()
        limit = storage.cache.limit
        budget = None
        if limit is not None:
            sizes = [int(nbytes[n].sum()) for n in needs]
            worst = max(range(len(sizes)), key=sizes.__getitem__)
            # The processes reading through the cache share it (each an equal part; torchrun's LOCAL_WORLD_SIZE
            # counts those yet to start): each runs ahead within its share, keeping half of it for the batches
            # being gathered; a batch must fit in its share, and the processes' needs together in the limit.
            share = storage.cache.share(_local_processes())
            if sizes[worst] > share:
                each = f" (this process's share: {share:,} of {limit:,}, shared by the processes reading through " \
                       f"the cache)" if share != limit else ""
                raise ConfigError(f"cache_limit {limit:,} bytes{each} is smaller than the shards batch {worst} needs "
                                  f"({sizes[worst]:,} bytes, {len(needs[worst])} shards): raise cache_limit "
                                  f"(--cache-limit), read each sample by a byte range (read='ranged'), or read "
                                  f"fewer shards per batch (order='quasi_random' with a smaller window, or a smaller "
                                  f"batch_size)")
            storage.cache.check_needs(sizes[worst])
            budget = max(sizes[worst], share // 2)
            total = ds.shard_bytes
            if self.order == "random" and total > limit and not self._warned_random:
                self._warned_random = True
                warnings.warn(f"order='random' over {ds.path} with a cache ({limit:,} bytes) smaller than the dataset "
                              f"({total:,} bytes): nearly every batch needs shards downloaded. order='quasi_random' "
                              f"reads a window of shards at a time and keeps the downloads ahead of training",
                              stacklevel=3)
        return reads.schedule(needs, start, nbytes, paths, budget=budget, per_batch=limit is not None,
                              workers=CONNECTIONS)

    def __repr__(self) -> str:
        return (f"dsc.Loader({self.dataset!r}, batch_size={self.batch_size}, order={self.order!r}, "
                f"read={self.read_strategy!r}: {self.read_reason})")

    def _release_ring(self) -> None:
        """Drop the ring's buffers (pinned ones go back to torch's pinned-memory cache, for reuse)."""
        self._ring = None

    def _copy_stream(self, k: int):
        """Filler thread k's CUDA copy stream, made once for the Loader's life: the caching allocator reuses
        a block only on its stream, so new streams every epoch would strand reserved memory."""
        with self._streams_lock:
            while len(self._streams) <= k:
                self._streams.append(None)
            if self._streams[k] is None:
                self._streams[k] = torch.cuda.Stream(device=self.device)
            return self._streams[k]

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ------------------------------------------------------------------------ resume
    def state_dict(self) -> dict:
        """Where the loader is: the epoch of the next batch and how many of its batches were handed out
        (batches still being prefetched are not counted, so they are served again after a resume). During an
        iteration, that iteration's epoch; between iterations, where the next one starts (after a whole
        epoch e: epoch e + 1, 0 batches). ``stages``: what runs of other world sizes or batch sizes served of
        the epoch before this one (an elastic resume). Every rank's state says the same position when the ranks
        step together (each has served as many batches), so any rank's state resumes the run."""
        epoch, served = self._position()
        shard_size, checksum, version = self._identity()
        return {"epoch": epoch, "batches_served": served, "seed": self.seed, "order": self.order,
                "batch_size": self.batch_size, "drop_last": self.drop_last, "rank": self.rank,
                "world_size": self.world_size, "tail": self.tail, "window": self.window,
                "num_samples": self.num_samples, "shard_size": shard_size,
                "dataset": checksum, "version": version,
                "transforms": _describe(self.transforms), "indices": self._indices_digest(),
                "stages": [list(st) for st in self._epoch_stages(epoch)],
                **({"mixture": self.dataset.describe()} if isinstance(self.dataset, Mixture) else {})}

    def _identity(self) -> tuple:
        """(shard size, manifest checksum, version) of what the loader reads (a mixture says its own)."""
        identity = getattr(self.dataset, "identity", None)
        if identity is not None:
            return identity()
        m = self.dataset.manifest
        return m.shard_size, m.checksum(), self.dataset.version

    def _batch_units(self, state: dict | None = None) -> int:
        """Units of the epoch's order per batch: samples, or 1 where each unit is a whole batch (a mixture's
        one source per batch)."""
        return 1 if getattr(self.dataset, "chunked", False) else (self.batch_size if state is None
                                                                   else state["batch_size"])

    def _indices_digest(self) -> str | None:
        if self.indices is None:
            return None
        return hashlib.sha256(np.ascontiguousarray(self.indices, "<i8").tobytes()).hexdigest()[:16]

    def load_state_dict(self, state: dict) -> None:
        """Resume at the exact batch: the rest of the epoch is identical to an uninterrupted run.

        num_threads, prefetch, device and cache may differ from the run that saved the state; what
        defines the order (seed, order, window, dataset and its size, transforms) may not, and a mismatch is
        refused naming the field. Elastic resume: world_size, batch_size, tail and drop_last may differ too
        (and the state of any rank resumes any rank): the ranks then split what the saved run had not served
        of the epoch (the epoch's order does not depend on them), so the rest of the epoch serves every
        sample the saved run had not, none twice (up to ``tail="pad"``'s repeats and ``drop_last``'s cuts of
        the resumed run)."""
        ours = self.state_dict()  # once: it hashes the manifest
        if not isinstance(state, dict):
            raise ConfigError(f"a loader state is the dict state_dict() returns, got {type(state).__name__}")
        optional = {"transforms", "version", "indices", "stages", "mixture"}  # (older states)
        missing = sorted(set(ours) - set(state) - optional)
        if missing:
            raise ConfigError(f"cannot resume: the saved state lacks {', '.join(missing)}; give the dict "
                              f"state_dict() returned")
        mix = isinstance(ours["version"], list)
        if "version" in state and isinstance(state["version"], list) != mix:
            what = lambda v: f"a mixture of {len(v)} datasets" if isinstance(v, list) else "one dataset"  # noqa: E731
            raise ConfigError(f"cannot resume: the saved state is of {what(state['version'])}, this loader reads "
                              f"{what(ours['version'])}; build the Loader over what the run trained on")
        if mix and state.get("version", ours["version"]) != ours["version"]:
            raise ConfigError(f"cannot resume: the saved state is of versions {state['version']} of the mixture's "
                              f"sources, this loader reads versions {ours['version']}; open the versions the run "
                              f"trained on (dsc.open(path, version=...)) to resume it")
        if state.get("version", ours["version"]) != ours["version"]:
            raise ConfigError(f"cannot resume: the saved state is of version {state['version']} of the dataset, this "
                              f"loader reads version {ours['version']}; open the version the run trained on "
                              f"(dsc.open(path, version={state['version']})) to resume it")
        if mix and isinstance(state.get("mixture"), dict):  # (what differs, in words, before the hashes)
            why = differences(state["mixture"], ours["mixture"])
            if why:
                raise ConfigError(f"cannot resume: the saved state is of another mixture: {why}; build the Loader "
                                  f"over the mixture the run trained on")
        if getattr(self.dataset, "chunked", False) and state["batch_size"] != self.batch_size:
            raise ConfigError(f"cannot resume: the saved state has batch_size={state['batch_size']}, this loader has "
                              f"batch_size={self.batch_size}; with one source per batch the batches are cut from the "
                              f"epoch's order, so the batch size cannot change within an epoch")
        for key in ("seed", "order", "window", "num_samples", "shard_size", "dataset", "transforms", "indices"):
            mine = ours[key]
            if state.get(key, None if key == "indices" else mine) != mine:
                if key == "indices":
                    raise ConfigError("cannot resume: the saved state drew from other samples (a Subset or indices= "
                                      "that differ from this loader's); build the Loader over the same samples")
                if key == "num_samples" and getattr(self.dataset, "chunked", False):
                    raise ConfigError(f"cannot resume: with one source per batch an epoch is counted in whole batches "
                                      f"of one source: the saved run's had {state[key]!r}, this loader's has {mine} "
                                      f"(batch_size={self.batch_size}, drop_last={self.drop_last}); build the Loader "
                                      f"with the run's drop_last")
                raise ConfigError(f"cannot resume: the saved state has {key}={state[key]!r}, this loader has "
                                  f"{key}={mine!r}; build the Loader with the same {key}")
        epoch, served = state["epoch"], state["batches_served"]
        for name, v in (("epoch", epoch), ("batches_served", served), ("world_size", state["world_size"]),
                        ("batch_size", state["batch_size"])):
            if not _whole(v) or v < 0:
                raise ConfigError(f"cannot resume: the saved {name} is {v!r}, not a non-negative int")
        if state["tail"] not in TAILS or state["world_size"] < 1 or state["batch_size"] < 1:
            raise ConfigError(f"cannot resume: the saved state's world_size={state['world_size']!r}, batch_size="
                              f"{state['batch_size']!r}, tail={state['tail']!r} are not a loader's")
        stages = _stages_of(state.get("stages", []))
        layout = ("world_size", "batch_size", "tail", "drop_last")
        if any(state[k] != ours[k] for k in layout):  # elastic: the saved run's part of the epoch becomes a stage
            left = self._epoch_samples(stages)
            per = part_size(left, state["world_size"], state["tail"])
            units = self._batch_units(state)
            batches = per // units if state["drop_last"] else -(-per // units)
            if served > batches:
                raise ConfigError(f"cannot resume: the saved state served {served} batches of an epoch of {batches}")
            if served:
                stages = stages + ((int(state["world_size"]), int(served) * units, state["tail"], int(served)),)
            served = 0
        self._interrupt("load_state_dict() was called during this epoch, which moved the Loader elsewhere; call "
                        "it before iterating")
        batches = self._batches_of(part_size(self._epoch_samples(stages), self.world_size, self.tail))
        if served > batches:
            raise ConfigError(f"cannot resume: the saved state served {served} batches of an epoch of {batches}")
        self._stages = (int(epoch), stages)
        self._resume = _Resume(int(epoch), int(served), stages)
        self.epoch, self._started = self._resume.epoch, False
        self._served = self._resume.batches

    def _batch_offset(self) -> int:
        """The first batch number of this run in its epoch (the batches earlier runs served of it): what keys the
        augmentations, so a resumed run on another world size does not draw the first batches' crops again."""
        return sum(int(st[3]) for st in self._epoch_stages(self.epoch))


def _stages_of(saved) -> tuple:
    """A saved state's ``stages``, checked: ((world_size, taken, tail, batches), ...)."""
    bad = ConfigError(f"cannot resume: the saved state's stages are {saved!r}, not what state_dict() writes")
    if not isinstance(saved, (list, tuple)):
        raise bad
    out = []
    for st in saved:
        if not isinstance(st, (list, tuple)) or len(st) != 4 or st[2] not in TAILS or \
                not all(_whole(v) and v >= 0 for v in (st[0], st[1], st[3])) or st[0] < 1:
            raise bad
        out.append((int(st[0]), int(st[1]), st[2], int(st[3])))
    return tuple(out)


def _describe(transforms) -> str | None:
    """What a resumed loader must share with the saved one: the chain (its ops and their parameters)."""
    if transforms is None:
        return None
    return repr(transforms) if hasattr(transforms, "stages") else getattr(transforms, "__qualname__",
                                                                          type(transforms).__name__)


def _compose(transforms):
    """None, a Compose, a list of ops, one op, or a callable ``(batch, seed=, epoch=, batch_index=[, rank=])``."""

    if transforms is None or isinstance(transforms, Compose):
        return transforms
    if isinstance(transforms, (Geometric, BatchOp, *PIXEL_OPS)):
        return Compose([transforms])
    if isinstance(transforms, (list, tuple)):
        return Compose(list(transforms))
    if callable(transforms):  # one taking only the batch (`lambda b: ...`) runs as an op: Compose([fn])
        return transforms if _takes_draws(transforms) else Compose([transforms])
    raise ConfigError(f"transforms must be a list of dsc.transforms ops, a Compose or a callable, got {transforms!r}")
