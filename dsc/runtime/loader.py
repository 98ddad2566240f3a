"""``dsc.Loader``: FFCV-style fast epochs over a compiled dataset.

How a batch is made: the epoch's order (a pure function of seed, epoch, rank, world size) is cut
into batches; a batch's indices are sorted by storage position, so each shard it touches is one
contiguous run gathered by a single ``numpy.take`` (see ``Dataset.gather_images`` for why not
``index_select``) straight into a slot of a ring of preallocated buffers (pinned when the device is CUDA). ``num_threads`` background threads fill slots up to
``prefetch`` batches ahead of the consumer; the copies release the GIL, and threads share memory, so
nothing is pickled or copied twice.

Ring safety: a slot's buffers are reused only if nothing outside the ring still references them
(checked on the tensor storage's use count); a batch the user keeps (``list(loader)``) keeps its
memory, and the slot gets new buffers. In a training loop that drops each batch, the same few buffers
are reused all epoch.

CUDA: after a slot is filled, its tensors are copied to the device with ``non_blocking=True`` on the
filling thread's side stream and an event is recorded; the consumer's stream waits on that event,
the device tensors are ``record_stream``-ed on the consumer's stream, and the host slot is refilled
only after the event says the copy is done.
"""
from __future__ import annotations

import os
import threading
import weakref
from dataclasses import dataclass

import numpy as np
import torch

from ..errors import DscError
from .dataset import IMAGE_FORMS, Dataset
from .objects import BOX_FORMS
from .orders import ORDERS, partition
from .orders.partition import TAILS, part_size
from .orders.quasi_random import DEFAULT_WINDOW

CACHES = ("page", "ram")


def _distributed_defaults(rank, world_size) -> tuple[int, int]:
    if rank is None or world_size is None:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            rank = dist.get_rank() if rank is None else rank
            world_size = dist.get_world_size() if world_size is None else world_size
    return (0 if rank is None else int(rank)), (1 if world_size is None else int(world_size))


def _storage_users(t: torch.Tensor) -> int:
    try:
        return torch._C._storage_Use_Count(t.untyped_storage()._cdata) - 1  # minus this call's wrapper
    except Exception:  # private API gone: treat every buffer as taken (always safe, a little slower)
        return 2


class _Ring:
    """``n`` slots of named buffers that grow as needed; pinned for CUDA."""

    def __init__(self, n: int, pin: bool):
        self.slots: list[dict[str, torch.Tensor]] = [{} for _ in range(n)]
        self.copy_done: list[object] = [None] * n  # CUDA event of the slot's last host-to-device copy
        self.pin = pin

    def allocator(self, s: int):
        slot = self.slots[s]

        def alloc(name: str, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
            numel = int(np.prod(shape)) if len(shape) else 1
            buf = slot.get(name)
            if buf is None or buf.dtype != dtype or _storage_users(buf) > 1:
                buf = None  # first use, or the user still holds the last batch of this slot: leave it to them
            elif buf.numel() < numel:  # variable-size fields (ragged, boxes) grow with headroom
                buf = torch.empty(max(numel, int(buf.numel() * 1.25)), dtype=dtype, pin_memory=self.pin)
                slot[name] = buf
            if buf is None:
                buf = slot[name] = torch.empty(max(numel, 1), dtype=dtype, pin_memory=self.pin)
            return buf[:numel].view(shape)

        return alloc


class _EpochState:
    """Shared between the consumer and the filler threads (the threads never reference the iterator,
    so dropping the iterator finalizes it and stops them)."""

    def __init__(self, loader: "Loader", batches: list[np.ndarray], start: int):
        end = len(batches)
        self.cond = threading.Condition()
        self.next_job = start
        self.end = end
        self.consumed = start
        self.results: dict[int, object] = {}
        self.stop = False
        self.fatal: BaseException | None = None
        self.superseded = False
        self.threads: list[threading.Thread] = []
        self.batches = batches
        self.prefetch = loader.prefetch
        self.dataset = loader.dataset
        self.device = loader.device
        self.transforms = loader.transforms
        self.forms = (loader.boxes, loader.images)
        self.seed, self.epoch = loader.seed, loader.epoch
        if loader._ring is None or len(loader._ring.slots) != loader.prefetch + 2:
            loader._ring = _Ring(loader.prefetch + 2, pin=loader.device.type == "cuda")
        self.ring = loader._ring
        self.loader = weakref.ref(loader)

    def shutdown(self) -> None:
        """Stop and join the threads. A finished epoch leaves its ring to the loader for the next one;
        an epoch cut short (break, exception, KeyboardInterrupt) releases (and unpins) every buffer."""
        with self.cond:
            self.stop = True
            self.cond.notify_all()
        if threading.current_thread() in self.threads:
            return  # finalized from a filler thread (garbage collection): the threads exit on their own
        for t in self.threads:
            t.join()
        self.results.clear()
        loader = self.loader()
        if self.consumed < self.end and loader is not None and loader._ring is self.ring:
            loader._release_ring()
        self.ring = None


def _fill(state: _EpochState) -> None:
    try:
        _fill_jobs(state)
    except BaseException as e:  # anything outside a batch (CUDA stream creation...): stop, tell the consumer
        with state.cond:
            state.fatal = e
            state.stop = True
            state.cond.notify_all()


def _fill_jobs(state: _EpochState) -> None:
    cuda = state.device.type == "cuda"
    stream = torch.cuda.Stream(device=state.device) if cuda else None
    while True:
        with state.cond:
            while not state.stop and state.next_job < state.end and state.next_job >= state.consumed + state.prefetch:
                state.cond.wait()
            if state.stop or state.next_job >= state.end:
                return
            j = state.next_job
            state.next_job += 1
        try:
            ring = state.ring
            s = j % len(ring.slots)
            if ring.copy_done[s] is not None:
                ring.copy_done[s].synchronize()  # the slot's previous batch has left for the device
            batch = state.dataset.get_batch(state.batches[j], boxes=state.forms[0], images=state.forms[1],
                                            alloc=ring.allocator(s))
            event = None
            if cuda:
                with torch.cuda.stream(stream):
                    batch = _to_device(batch, state.device)
                    event = torch.cuda.Event()
                    event.record(stream)
                ring.copy_done[s] = event
            if state.transforms is not None and not cuda:
                batch = state.transforms(batch, seed=state.seed, epoch=state.epoch, batch_index=j)
            result = (batch, event)
        except BaseException as e:  # handed to the consumer, raised there
            result = e
        with state.cond:
            state.results[j] = result
            state.cond.notify_all()
        batch = result = None  # hold no reference to a ring slot while waiting for the next job


def _to_device(batch, device):
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {k: _to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, list):
        return [_to_device(v, device) for v in batch]
    return batch


def _record_stream(batch, stream) -> None:
    if isinstance(batch, torch.Tensor):
        batch.record_stream(stream)
    elif isinstance(batch, dict):
        for v in batch.values():
            _record_stream(v, stream)
    elif isinstance(batch, list):
        for v in batch:
            _record_stream(v, stream)


class _EpochIterator:
    """One epoch of batches. Only one per Loader at a time: starting a new iteration closes the previous
    one, which then raises instead of ending quietly."""

    def __init__(self, loader: "Loader", batches: list[np.ndarray], start: int):
        self._loader = loader  # `for b in Loader(...)` must keep the loader alive while it iterates
        self._state = state = _EpochState(loader, batches, start)
        end = state.end
        self._cursor = start
        self._finalizer = weakref.finalize(self, state.shutdown)
        for k in range(min(loader.threads_used, max(0, end - start))):
            t = threading.Thread(target=_fill, args=(state,), name=f"dsc-loader-{k}", daemon=True)
            state.threads.append(t)
            t.start()

    def __iter__(self):
        return self

    def __next__(self):
        state = self._state
        j = self._cursor
        if state.superseded:
            raise DscError("this epoch's iterator was closed because a new iteration of the same Loader "
                           "started; use one iterator per Loader at a time (or a second Loader)")
        if j >= state.end or (state.stop and j not in state.results and state.fatal is None):
            self.close()
            raise StopIteration
        with state.cond:
            while j not in state.results:
                if state.fatal is not None:
                    raise DscError(f"the loader's threads failed: {state.fatal!r}") from state.fatal
                if state.superseded:
                    raise DscError("this epoch's iterator was closed because a new iteration of the same "
                                   "Loader started; use one iterator per Loader at a time")
                if state.stop:
                    raise StopIteration
                state.cond.wait(0.5)
            result = state.results.pop(j)
            state.consumed = j + 1
            state.cond.notify_all()
        if isinstance(result, BaseException):
            self.close()
            raise result
        batch, event = result
        if event is not None:
            stream = torch.cuda.current_stream(state.device)
            stream.wait_event(event)
            _record_stream(batch, stream)
            if state.transforms is not None:
                batch = state.transforms(batch, seed=state.seed, epoch=state.epoch, batch_index=j)
        self._cursor = j + 1
        self._loader._served = j + 1
        return batch

    def close(self, superseded: bool = False) -> None:
        self._state.superseded = self._state.superseded or superseded
        self._finalizer()


@dataclass(frozen=True)
class _Resume:
    epoch: int
    batches: int


class Loader:
    """Batches of a compiled dataset, fast: see the module docstring for how.

    ``order``: ``sequential`` | ``random`` | ``quasi_random`` (``window`` shards at a time). Deterministic
    given (seed, epoch, rank, world_size). ``rank`` / ``world_size`` default to torch.distributed's when
    it is initialised; ``tail`` = ``pad`` | ``drop`` makes every rank's part the same size.
    ``device``: ``cpu`` or ``cuda[:k]``. ``cache``: ``page`` (the OS page cache) or ``ram`` (read the
    dataset into this process first). ``boxes`` / ``images``: batch forms (see :class:`dsc.Dataset`).
    ``transforms``: a callable ``(batch, seed=, epoch=, batch_index=) -> batch`` (see dsc.transforms).
    """

    def __init__(self, dataset: Dataset | str, batch_size: int, order: str = "sequential", seed: int = 0,
                 drop_last: bool = False, device: str | torch.device = "cpu", num_threads: int = 2,
                 prefetch: int = 3, rank: int | None = None, world_size: int | None = None, tail: str = "pad",
                 cache: str = "page", window: int | None = None, transforms=None,
                 boxes: str | None = None, images: str | None = None):
        if not isinstance(dataset, Dataset):
            dataset = Dataset(dataset)
        if boxes not in (None, *BOX_FORMS) or images not in (None, *IMAGE_FORMS):
            raise DscError(f"boxes must be one of {BOX_FORMS} and images one of {IMAGE_FORMS}")
        self.boxes, self.images = boxes, images  # None: the dataset's own default form
        if order not in ORDERS:
            raise DscError(f"order must be one of {', '.join(ORDERS)}, got {order!r}")
        if batch_size < 1 or num_threads < 1 or prefetch < 1:
            raise DscError("batch_size, num_threads and prefetch must be >= 1")
        if cache not in CACHES:
            raise DscError(f"cache must be one of {CACHES}, got {cache!r}")
        if tail not in TAILS:
            raise DscError(f"tail must be one of {TAILS}, got {tail!r}")
        if not isinstance(seed, int) or seed < 0:
            raise DscError(f"seed must be a non-negative int, got {seed!r}")
        if window is not None and (not isinstance(window, int) or window < 1):
            raise DscError(f"window must be a positive int (shards), got {window!r}")
        self.device = torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise DscError(f"device {device!r} asked for, but CUDA is not available here; use device='cpu'")
        self.rank, self.world_size = _distributed_defaults(rank, world_size)
        if not 0 <= self.rank < self.world_size:
            raise DscError(f"rank {self.rank} is not in [0, {self.world_size})")
        if tail == "drop" and self.world_size > len(dataset):
            raise DscError(f"tail='drop' with world_size {self.world_size} > {len(dataset)} samples leaves every "
                           f"rank empty; use tail='pad'")
        self.dataset = dataset
        self.batch_size, self.order, self.seed, self.drop_last = batch_size, order, seed, drop_last
        self.num_threads, self.prefetch, self.tail = num_threads, prefetch, tail
        self.window = window if order == "quasi_random" else None
        if order == "quasi_random" and window is None:
            self.window = DEFAULT_WINDOW
        self.transforms = _compose(transforms)
        # More copy threads than cores only thrash (measured: 4 threads on 2 cores ran at 1/4 the speed).
        self.threads_used = max(1, min(num_threads, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                                       else (os.cpu_count() or 1)))
        self.epoch = 0
        self._served = 0
        self._resume: _Resume | None = None
        self._iterators: weakref.WeakSet = weakref.WeakSet()
        self._ring: _Ring | None = None
        if cache == "ram":
            dataset.load_to_ram()

    # ------------------------------------------------------------------------ order
    def epoch_order(self, epoch: int | None = None) -> np.ndarray:
        """This rank's samples for ``epoch``, in the order they are served (before in-batch sorting)."""
        ds = self.dataset
        order = ORDERS[self.order](len(ds), ds.manifest.shard_size, self.seed,
                                   self.epoch if epoch is None else epoch, window=self.window)
        return partition(order, self.rank, self.world_size, self.tail)

    def samples_per_rank(self) -> int:
        return part_size(len(self.dataset), self.world_size, self.tail)

    def __len__(self) -> int:
        """Batches per epoch on this rank."""
        n = self.samples_per_rank()
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def batch_indices(self, epoch: int | None = None) -> list[np.ndarray]:
        """The index sets of every batch of ``epoch`` on this rank, sorted as they are gathered."""
        part = self.epoch_order(epoch)
        n = len(part) // self.batch_size * self.batch_size if self.drop_last else len(part)
        return [np.sort(part[a:min(a + self.batch_size, n)]) for a in range(0, n, self.batch_size)]

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch (the order depends on it). Keeps a position loaded by load_state_dict for it."""
        if self._resume is not None and self._resume.epoch != epoch:
            self._resume = None
        self.epoch = epoch
        self._served = self._resume.batches if self._resume else 0

    # ------------------------------------------------------------------------ iteration
    def __iter__(self):
        for it in list(self._iterators):  # one epoch in flight at a time: an older iterator now raises
            it.close(superseded=True)
        start = self._resume.batches if self._resume is not None and self._resume.epoch == self.epoch else 0
        self._resume = None
        self._served = start
        it = _EpochIterator(self, self.batch_indices(), start)
        self._iterators.add(it)
        return it

    def close(self) -> None:
        """Stop the filler threads of any epoch in flight and release every buffer."""
        for it in list(self._iterators):
            it.close()
        self._release_ring()

    def _release_ring(self) -> None:
        pinned = self._ring is not None and self._ring.pin
        self._ring = None
        if pinned and hasattr(torch._C, "_host_emptyCache"):
            torch._C._host_emptyCache()  # hand the pinned pages back instead of keeping them cached

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
        """Where the loader is: the epoch and how many of its batches were handed out (batches still
        being prefetched are not counted, so they are served again after a resume)."""
        return {"epoch": self.epoch, "batches_served": self._served, "seed": self.seed, "order": self.order,
                "batch_size": self.batch_size, "drop_last": self.drop_last, "rank": self.rank,
                "world_size": self.world_size, "tail": self.tail, "window": self.window,
                "num_samples": len(self.dataset), "shard_size": self.dataset.manifest.shard_size,
                "dataset": self.dataset.manifest.checksum()}

    def load_state_dict(self, state: dict) -> None:
        """Resume at the exact batch: the rest of the epoch is identical to an uninterrupted run.

        num_threads, prefetch, device and cache may differ from the run that saved the state; what
        defines the order (seed, order, window, batch_size, drop_last, world_size, rank, tail, dataset
        size) may not, and a mismatch is refused naming the field."""
        ours = self.state_dict()  # once: it hashes the manifest
        for key in ("seed", "order", "batch_size", "drop_last", "rank", "world_size", "tail", "window",
                    "num_samples", "shard_size", "dataset"):
            mine = ours[key]
            if key in state and state[key] != mine:
                raise DscError(f"cannot resume: the saved state has {key}={state[key]!r}, this loader has "
                               f"{key}={mine!r}; build the Loader with the same {key}")
        self.close()
        self._resume = _Resume(int(state["epoch"]), int(state["batches_served"]))
        self.epoch = self._resume.epoch
        self._served = self._resume.batches


def _compose(transforms):
    if transforms is None or callable(transforms):
        return transforms
    from ..transforms import Compose

    return Compose(list(transforms))
