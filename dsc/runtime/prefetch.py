"""The prefetch ring and its filler threads (CPU and CUDA): how batches are made ahead of the consumer.

``num_threads`` threads take the epoch's batches in order, each gathering one batch straight into a slot
of a ring of ``prefetch + 2`` reusable buffers (pinned when the device is CUDA), up to ``prefetch``
batches ahead of the consumer (``num_threads=0``: each batch is made in the consumer's thread when it is
asked for, nothing ahead: for debugging, and for scripts whose ``-j 0`` means that). The gathers release
the GIL and threads share memory, so nothing is pickled or copied twice.

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

import math
import threading
import weakref

import numpy as np
import torch

from .. import scratch
from ..errors import DscError
from ..store.local import madvise
from .batches import CAST_KEY, Batch, box_form, divisor_255
from ..transforms import batch_generator
from ..transforms.fused import plan_chain



def _storage_users(t: torch.Tensor) -> int:
    try:
        return torch._C._storage_Use_Count(t.untyped_storage()._cdata) - 1  # minus this call's wrapper
    except Exception:  # private API gone: treat every buffer as taken (always safe, a little slower)
        return 2


HUGE_PAGE = 1 << 21  # x86-64's and arm64's transparent huge page (2 MiB)
_MADV_HUGEPAGE = 14


def _ask_huge_pages(buf: torch.Tensor) -> bool:
    """Ask Linux to back the 2 MiB-aligned interior of ``buf``'s fresh (never touched) memory with
    transparent huge pages (``madvise(MADV_HUGEPAGE)``; the kernel's default "madvise" mode gives them only to
    memory that asks). A batch buffer of tens of MB then costs hundreds of page faults instead of thousands
    when first written (its unaligned ends stay small pages), and the float conversion and mask passes that
    stream through it miss the TLB far less (measured in the Loader, runs interleaved: the torchvision
    form's uint8 -> float pass about a quarter less CPU, its mask pass a fifth). The price: that first write
    may take more system time, where the kernel compacts memory to find free huge pages (once per buffer).
    Nothing changes in what the buffer holds; where the call is not available (not Linux, THP off) the
    buffer stays as it was. Returns whether the kernel took the hint."""
    start = buf.data_ptr()
    a = (start + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1)
    b = (start + buf.numel() * buf.element_size()) & ~(HUGE_PAGE - 1)
    return b > a and madvise(a, b - a, _MADV_HUGEPAGE) is True  # (None off Linux: no C library call)


class Ring:
    """``n`` slots of named buffers that grow as needed; pinned for CUDA. A buffer of several huge pages
    asks for them (:func:`_ask_huge_pages`) before anything touches it."""

    def __init__(self, n: int, pin: bool):
        self.slots: list[dict[str, torch.Tensor]] = [{} for _ in range(n)]
        self.copy_done: list[object] = [None] * n  # CUDA event of the slot's last host-to-device copy
        self.pin = pin
        self.allocations = 0  # buffers made
        self.taken = 0  # of which because the slot's buffer was still referenced (a batch kept, or a leak)
        self.huge = 0  # of which backed by huge pages (the kernel took the hint)
        self.largest: dict[str, int] = {}  # per buffer name, the most elements any slot was asked for
        self.grew: set[str] = set()  # the names a slot's buffer has had to grow for (their batches vary)
        # the dsc.scratch pools (the transforms' work buffers) of filler threads gone: the threads are made
        # anew each epoch, and a thread's own pool went with it (each epoch's first batches made and faulted
        # in their work buffers again). A thread takes one as it starts and gives it back as it ends (never
        # two threads one pool, even where an epoch's threads outlive it, finalized by garbage collection);
        # kept here, they go with the ring (Loader.close())
        self.pools: list[dict] = []
        self._pools_lock = threading.Lock()

    def take_pool(self) -> dict:
        """A scratch pool a filler thread gone left (or a new one), this thread's alone until :meth:`give_pool`."""
        with self._pools_lock:
            return self.pools.pop() if self.pools else {}

    def give_pool(self, pool: dict, keep: int) -> None:
        """Give back a pool taken; kept only while fewer than ``keep`` (the loader's filler threads) are: a
        thread finalized late (garbage collection) that gives back after the next epoch's threads took theirs
        leaves no extra pool for the ring to hold."""
        with self._pools_lock:
            if len(self.pools) < keep:
                self.pools.append(pool)

    def _new(self, numel: int, dtype: torch.dtype, hint: bool = True) -> torch.Tensor:
        buf = torch.empty(numel, dtype=dtype, pin_memory=self.pin)
        self.allocations += 1
        if hint and not self.pin and numel * buf.element_size() >= 2 * HUGE_PAGE and _ask_huge_pages(buf):
            self.huge += 1  # (pinned memory is the CUDA driver's: left as it is)
        return buf

    def allocator(self, s: int):
        slot = self.slots[s]

        def alloc(name: str, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
            numel = math.prod(shape)  # (np.prod of a tuple costs microseconds, with the GIL held)
            largest = self.largest.get(name, 0)
            if numel > largest:  # (threads racing here can only lower this headroom hint: no batch changes)
                self.largest[name] = largest = numel
            buf = slot.get(name)
            kept = buf is not None and buf.dtype == dtype and _storage_users(buf) > 1
            if kept:
                self.taken += 1
                buf = None  # the user still holds the last batch of this slot: leave it to them
            if buf is None or buf.dtype != dtype:
                buf = None  # first use
            elif buf.numel() < numel:  # variable-size fields (ragged, boxes) grow with headroom, past the
                # largest batch any slot has held (each slot meets the same sizes: growing to only its own
                # largest made every slot grow again for each new largest, a fresh buffer faulted in each
                # time: zoom-out canvases' float images, every epoch). Pinned (CUDA), page-locked in full: each
                # slot past its own largest only, as before
                grow = buf.numel() if self.pin else max(buf.numel(), largest)
                self.grew.add(name)
                buf = slot[name] = self._new(max(numel, int(grow * 1.25)), dtype)
            if buf is None:  # (one made because a batch is kept, as a loop's last batch is at each epoch's
                # end, asks for no huge pages: their first write may stall on compaction, every epoch)
                # A slot's first buffer of a name whose batches vary (another slot was asked for more) takes the
                # growth's headroom at once: made exact, it was grown again (a second buffer faulted in) when
                # its first larger batch came, one slot after another over the first epochs (ragged detection
                # batches: 2-3 buffers of 14-38 MB made in each of the second and third epochs)
                first = int(largest * 1.25) if largest > numel and name in self.grew and not self.pin \
                    and not kept else numel  # (a name whose batches are one size but the last stays exact)
                buf = slot[name] = self._new(max(numel, first, 1), dtype, hint=not kept)
            return buf[:numel].view(shape)

        return alloc


class _EpochState:
    """Shared between the consumer and the filler threads (the threads never reference the iterator,
    so dropping the iterator finalizes it and stops them)."""

    def __init__(self, loader: "Loader", batches: list[np.ndarray], start: int):  # noqa: F821 - (loader.py imports this module)
        end = len(batches)
        self.cond = threading.Condition()
        self.next_job = start
        self.end = end
        self.consumed = start
        self.results: dict[int, object] = {}
        self.stop = False
        self.fatal: BaseException | None = None
        self.superseded: str | None = None  # why the consumer's next() must raise instead of ending quietly
        self.threads: list[threading.Thread] = []
        self.loader_threads = loader.threads_used  # (how many scratch pools the ring keeps between epochs)
        self.batches = batches
        self.prefetch = loader.prefetch
        self.dataset = loader.dataset
        self.device = loader.device
        self.transforms = loader.transforms
        # A Compose's leading geometric stage (and on the CPU the photometric pass after it) runs inside the
        # gather, per sample; what is left runs on the batch (on CUDA: on the device, after the copy).
        self.compose = loader.transforms if hasattr(loader.transforms, "gather_plan") else None
        self.geometry = self.post = None
        self.start = 0
        if self.compose is not None:
            self.geometry, self.post, self.start = self.compose.gather_plan(
                photometric=loader.device.type != "cuda", keep_sizes=getattr(loader.dataset, "gathers_own_sizes", False))
        self.forms = (loader._gather_boxes, loader.images)
        self.after_boxes = getattr(loader, "_after_boxes", None)
        self.output = loader._output  # the batch form handed out (None: the dict as it is)
        self.output_alloc = loader.format == "torchvision"  # it takes the ring's allocator (images, masks)
        # what this loader does after the gather, for the gather to know (not a decision: what the gather makes
        # of it, e.g. masks left as packed bits, is the dataset's, in Dataset._get_batch): its batches go from
        # the gather straight into format="torchvision" on the CPU, with no transform or box form between
        self.to_torchvision = self.output_alloc and loader.device.type == "cpu" and self.after_boxes is None and \
            (loader.transforms is None if self.compose is None else self.start >= len(self.compose.stages))
        # ... or from the transforms' last stage, a geometric one, straight into that form: its packed ragged uint8
        # images are written as the form's float32 values as they are moved (the zoom-out's fill as float, never
        # as bytes cast in a second pass over the batch)
        self.cast_rest = self.output_alloc and loader.device.type == "cpu" and self.after_boxes is None and \
            self.compose is not None and self.start < len(self.compose.stages) and \
            self.compose.stages[-1][0] == "geometric"
        self.seed, self.epoch, self.rank = loader.seed, loader.epoch, loader.rank
        self.batch_offset = loader._batch_offset()  # (an elastic resume numbers its batches after the earlier runs')
        self.rank_kw = loader._transforms_take_rank  # a plain callable that takes rank= gets it
        if loader._ring is None or len(loader._ring.slots) != loader.prefetch + 2:
            loader._ring = Ring(loader.prefetch + 2, pin=loader.device.type == "cuda")
        self.ring = loader._ring
        self.copy_stream = loader._copy_stream  # made once per Loader (a stream per epoch would strand memory)
        # the loader's read strategy and the epoch's read schedule, if any
        self.reads = loader._reads
        self.feed = loader._schedule(batches, start)

    def shutdown(self) -> None:
        """Stop and join the threads. The ring stays with the loader (also when the epoch was cut short:
        break, exception, KeyboardInterrupt) until ``Loader.close()``; the results still queued are
        dropped, so their slots are free again."""
        with self.cond:
            self.stop = True
            self.cond.notify_all()
        if threading.current_thread() in self.threads:  # finalized from a filler thread (garbage collection):
            if self.feed is not None:  # the threads exit on their own; the schedule (its walker joins
                self.feed.close()  # from here) lets its shards go now
            return
        for t in self.threads:
            t.join()
        if self.feed is not None:
            self.feed.close()
        self.results.clear()
        self.ring = None


def _fill(state: _EpochState, k: int) -> None:
    ring = state.ring  # (shutdown lets go of it)
    pool = ring.take_pool()
    scratch.adopt(pool)  # the work buffers an earlier epoch's thread made, this thread's alone
    try:
        _fill_jobs(state, k)
    except BaseException as e:  # anything outside a batch (CUDA stream creation...): stop, tell the consumer
        with state.cond:
            state.fatal = e
            state.stop = True
            state.cond.notify_all()
    finally:
        scratch.adopt({})
        ring.give_pool(pool, keep=max(1, state.loader_threads))


def _transform_rest(state: _EpochState, batch, j: int, gen, alloc=None):
    """The transforms not run in the gather (the rest of a Compose, same generator, or a plain callable),
    then the loader's output form (``keys`` tuples, ``format="torchvision"``; its float images and masks into
    the batch's ring slot ``alloc`` when given). The batch is the Loader's own (its ring slot, or on CUDA its
    device copy): the transforms may write into it."""
    if state.compose is None and state.transforms is not None:
        extra = {"rank": state.rank} if state.rank_kw else {}
        batch = state.transforms(batch, seed=state.seed, epoch=state.epoch, batch_index=state.batch_offset + j,
                                 **extra)
    elif state.compose is not None and state.start < len(state.compose.stages):
        divisor = divisor_255() if state.cast_rest else None  # (a 0-dim tensor, as the form divides)
        batch = state.compose(batch, gen=gen, start=state.start, alloc=alloc, owned=True,  # (its ring slot / copy)
                              divisor=divisor)
        if divisor is not None and "image_offsets" in batch and "index" in batch and \
                batch["image"].dtype == torch.float32:  # (cast by the last stage: the form takes them as they are)
            batch[CAST_KEY] = batch["index"]
    if state.after_boxes is not None:  # the box form asked for, from the packed boxes the transforms moved
        batch = box_form(batch, state.dataset.schema, state.after_boxes)
    if state.output is None:
        return batch
    return state.output(batch, alloc=alloc) if alloc is not None and state.output_alloc else state.output(batch)


def _fill_jobs(state: _EpochState, k: int) -> None:
    stream = None
    if state.device.type == "cuda":  # the current device is per thread: this one copies to the loader's device
        torch.cuda.set_device(state.device)
        stream = state.copy_stream(k)
    torch.set_num_threads(1)  # this thread's resizes run on its own core (the count is per calling thread)
    while True:
        with state.cond:
            while not state.stop and state.next_job < state.end and state.next_job >= state.consumed + state.prefetch:
                state.cond.wait()
            if state.stop or state.next_job >= state.end:
                return
            j = state.next_job
            state.next_job += 1
        result = _make_batch(state, j, stream)
        with state.cond:
            state.results[j] = result
            state.cond.notify_all()
        result = None  # hold no reference to a ring slot while waiting for the next job


def _make_batch(state: _EpochState, j: int, stream):
    """Batch ``j`` gathered into its ring slot (and on CUDA sent to the device on ``stream``): ``(batch,
    event, gen)``, or the exception that stopped it (raised in the consumer)."""

    try:
        ring = state.ring
        s = j % len(ring.slots)
        if ring.copy_done[s] is not None:
            ring.copy_done[s].synchronize()  # the slot's previous batch has left for the device
        idx = state.batches[j]
        gen = batch_generator(state.seed, state.epoch, state.batch_offset + j, state.rank) \
            if state.transforms is not None else None
        plan = plan_chain(state.geometry, state.dataset.sample_sizes(idx), gen) if state.geometry else None
        if state.feed is not None:
            state.feed.wait(j, lambda: state.stop)  # its shards are read in (downloaded) and held
        try:
            batch = state.dataset.get_batch(idx, state.forms[0], state.forms[1], ring.allocator(s),
                                            geometry=plan, post=state.post, reads=state.reads,
                                            to_torchvision=state.to_torchvision)
        finally:
            if state.feed is not None:
                state.feed.done(j)  # gathered: the shards no later batch reads may go
        event = None
        if stream is not None:
            with torch.cuda.stream(stream):
                batch = _to_device(batch, state.device)
                event = torch.cuda.Event(blocking=True)  # waiting on it sleeps instead of spinning a core
                event.record(stream)
            ring.copy_done[s] = event
        else:
            batch = _transform_rest(state, batch, j, gen, ring.allocator(s))
        return batch, event, gen
    except BaseException as e:  # handed to the consumer, raised there
        return e


def _to_device(batch, device):
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        schema = getattr(batch, "schema", None) or {}
        host = {k for k, r in schema.items() if r.kind == "host"}  # text, json, bytes: Python lists, left as they are
        return Batch({k: v if k in host else _to_device(v, device) for k, v in batch.items()},
                     schema=getattr(batch, "schema", None))
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


class EpochIterator:
    """One epoch of batches. Only one per Loader at a time: starting a new iteration closes the previous
    one, which then raises instead of ending quietly."""

    def __init__(self, loader: "Loader", batches: list[np.ndarray], start: int):  # noqa: F821 - (loader.py imports this module)
        self._loader = loader  # `for b in Loader(...)` must keep the loader alive while it iterates
        self._state = state = _EpochState(loader, batches, start)
        end = state.end
        self._cursor = start
        self._finalizer = weakref.finalize(self, state.shutdown)
        for k in range(min(loader.threads_used, max(0, end - start))):
            t = threading.Thread(target=_fill, args=(state, k), name=f"dsc-loader-{k}", daemon=True)
            state.threads.append(t)
            t.start()

    def __iter__(self):
        return self

    def __next__(self):
        state = self._state
        j = self._cursor
        if state.superseded:
            raise DscError(state.superseded)
        if j >= state.end or (state.stop and j not in state.results and state.fatal is None):
            self.close()
            raise StopIteration
        if not state.threads:  # num_threads=0: the batch is made here, in the calling thread
            stream = state.copy_stream(0) if state.device.type == "cuda" else None
            state.results[j] = _make_batch(state, j, stream)
        with state.cond:
            while j not in state.results:
                if state.fatal is not None:
                    raise DscError(f"the loader's threads failed: {state.fatal!r}") from state.fatal
                if state.superseded:
                    raise DscError(state.superseded)
                if state.stop:
                    raise StopIteration
                state.cond.wait(0.5)
            result = state.results.pop(j)
            state.consumed = j + 1
            state.cond.notify_all()
        if isinstance(result, BaseException):
            self.close()
            raise result
        batch, event, gen = result
        if event is not None:
            try:
                stream = torch.cuda.current_stream(state.device)
                stream.wait_event(event)
                _record_stream(batch, stream)
                batch = _transform_rest(state, batch, j, gen)
            except BaseException:
                self.close()  # the batch was taken: never leave the cursor behind it (next() would wait forever)
                raise
        self._cursor = j + 1
        self._loader._served = j + 1
        return batch

    @property
    def alive(self) -> bool:
        """Not finished, closed nor superseded: its epoch is under way."""
        return self._finalizer.alive

    def close(self, superseded: str | None = None) -> None:
        """Stop the threads; with ``superseded`` (the reason) a later next() raises it instead of ending."""
        if superseded and self._cursor < self._state.end:
            self._state.superseded = self._state.superseded or superseded
        self._finalizer()
