"""An epoch's shard reads, scheduled from its order: the Loader knows every batch before the epoch starts.

``ShardSchedule`` walks the shards in the order the epoch first needs them and makes each ready ahead of
the batches (``fetch``: a windowed read maps and reads a shard in; a remote dataset downloads and holds
it), as far ahead as a byte budget allows, and lets each go (``release``) once every batch that reads it
is gathered. Shards are made ready strictly in that order, so "is batch j ready?" is one comparison of
two integers: the filler threads pay nothing per batch when the shards are there already (a warm
cache), and nothing per shard unless shards are released batch by batch.
"""
from __future__ import annotations

import queue
import threading
from concurrent.futures import Future
from typing import Callable

import numpy as np

from ..errors import DscError


def shard_needs(rows: list[np.ndarray], K: int) -> list[np.ndarray]:
    """The shard slots each batch reads (``rows``: each batch's storage rows), in the batch's row order."""
    out = []
    for r in rows:
        slots = np.asarray(r, np.int64) // K
        if len(slots) > 1 and (np.diff(slots) < 0).any():
            _, first = np.unique(slots, return_index=True)
            out.append(slots[np.sort(first)])
        else:  # sorted rows (the Loader's): slot changes mark the next shard
            out.append(slots[np.r_[True, slots[1:] != slots[:-1]]] if len(slots) else slots)
    return out


def live_bytes(needs: list[np.ndarray], nbytes: np.ndarray) -> int:
    """The most bytes of shards an epoch needs at once: shard s is live from its first to its last batch."""
    if not needs:
        return 0
    counts = [len(n) for n in needs]
    if sum(counts) == 0:
        return 0
    keys = np.concatenate(needs)
    batch = np.repeat(np.arange(len(needs)), counts)
    first = np.full(len(nbytes), len(needs), np.int64)
    last = np.full(len(nbytes), -1, np.int64)
    np.minimum.at(first, keys, batch)
    np.maximum.at(last, keys, batch)
    used = last >= 0
    delta = np.zeros(len(needs) + 1, np.int64)
    np.add.at(delta, first[used], nbytes[used])
    np.add.at(delta, last[used] + 1, -nbytes[used])
    return int(np.cumsum(delta).max())


class _DaemonPool:
    """A few daemon threads running submitted calls: unlike ThreadPoolExecutor's, they never hold up the
    interpreter's exit (a download retrying against an unreachable server may take the whole retry budget)."""

    def __init__(self, n: int, name: str):
        self.q: "queue.SimpleQueue" = queue.SimpleQueue()
        self.threads = [threading.Thread(target=self._work, name=f"{name}-{k}", daemon=True) for k in range(n)]
        for t in self.threads:
            t.start()

    def _work(self) -> None:
        while True:
            item = self.q.get()
            if item is None:
                return
            fut, fn, args = item
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn(*args))
                except BaseException as e:  # noqa: BLE001 - handed to whoever waits on the future
                    fut.set_exception(e)
            # Hold nothing while waiting for the next call: the arguments may be views of a ring slot, which
            # the ring refills in place only when nobody else references it.
            item = fut = fn = args = None

    def submit(self, fn, *args) -> Future:
        fut: Future = Future()
        self.q.put((fut, fn, args))
        return fut

    def shutdown(self, pending: list[Future] = ()) -> None:
        """Cancel ``pending`` calls not yet started; the threads end after the call they are in."""
        for f in pending:
            f.cancel()
        for _ in self.threads:
            self.q.put(None)


class ShardSchedule:
    """Shards made ready batch by batch, ahead of the fillers, within ``budget`` bytes.

    ``needs[j]``: the shard keys (indexes into ``nbytes``) batch j reads; batches before ``start`` are not
    served. A thread walks the batches in order: a shard already held gets one more reference, another is
    fetched (``fetch(key)``, run by ``workers`` threads; ``fetch_now(key)``, if given, does it at once when that
    costs no I/O, returning False when it cannot). Batch j is ready once the walk has passed it and its
    fetches ended; ``ready`` is the first batch that is not, so a filler's check is one comparison.
    ``per_batch``: each ``done(j)`` drops j's references and lets go (``release``) the shards no batch
    walked since holds; the walk stays within ``budget`` bytes held (which must hold any one batch's shards:
    the oldest batch not done is fetched as soon as nothing else is held, so the epoch always progresses).
    Otherwise every shard is held until ``close``.

    ``hold_to_last``: a shard fetched is held until the last batch of the epoch that reads it is done, never
    let go while a batch not yet walked still needs it, so every shard is read once an epoch whatever the
    budget. The oldest batch not done may then always fetch (what is held is needed by it or by later batches;
    the budget is exceeded by at most what the order needs at once, ``live_bytes``)."""

    def __init__(self, needs: list[np.ndarray], start: int, nbytes: np.ndarray, fetch: Callable[[int], None],
                 release: Callable[[int], None], budget: int | None = None, per_batch: bool = True,
                 workers: int = 1, fetch_now: Callable[[int], bool] | None = None, name: str = "dsc-reads",
                 hold_to_last: bool = False):
        self.needs, self.end = needs, len(needs)
        self.nbytes = np.asarray(nbytes, np.int64)
        self.uses: np.ndarray | None = None  # hold_to_last: batches from ``start`` on that read each shard
        if hold_to_last and per_batch:
            counts = [len(n) for n in needs[start:]]
            self.uses = np.bincount(np.concatenate(needs[start:]).astype(np.int64), minlength=len(self.nbytes)) \
                if sum(counts) else np.zeros(len(self.nbytes), np.int64)
        self.fetches = 0  # shards fetched (tests count them against the shards read)
        self._fetch, self._release, self._fetch_now, self.per_batch = fetch, release, fetch_now, per_batch
        self.budget = budget if per_batch else None
        self.cond = threading.Condition()
        self.refs: dict[int, int] = {}  # held shard -> batches walked and not done that read it
        self.in_flight: dict[int, list[int]] = {}  # shard being fetched -> the batches waiting for it
        self.pending: dict[int, int] = {}  # walked batch -> its fetches not ended
        self.futures: dict[int, Future] = {}  # fetches submitted to the pool
        self.releasing: set[int] = set()  # shards being let go (not to be fetched again until that ends)
        self.bytes_held = 0
        self.peak_bytes = 0
        self.walked = start  # batches before it are walked
        self.ready = start  # batches before it are ready (read without the lock: one int)
        self.oldest = start  # the oldest batch not yet done
        self.finished: set[int] = set()
        self.stopped = False
        self.error: BaseException | None = None
        self.error_batch = self.end  # batches from it on get the error
        self.pool = None
        self.thread = None
        deferred: list[int] = []
        while self.walked < self.end and not deferred:  # at once, what needs no I/O (a warm cache: everything)
            got = self._walk(self.walked, block=False)
            if got is None:
                break
            deferred = got
        if self.walked < self.end or deferred:
            self.pool = _DaemonPool(workers, name) if workers > 1 else None
            self.thread = threading.Thread(target=self._run, args=(deferred,), name=name, daemon=True)
            self.thread.start()

    # ------------------------------------------------------------------ the walking thread
    def _walk(self, j: int, block: bool = True) -> list[int] | None:
        """Take batch j's shards: a reference to each held one, a fetch of each other one (within the
        budget, unless j is the oldest batch not done; waiting for room if ``block``, else giving up with
        None). Fetches that ``fetch_now`` cannot do at once are started (``block``) or returned."""
        with self.cond:
            while True:
                keys = self.needs[j].tolist()
                new = [k for k in keys if k not in self.refs]
                if any(k in self.releasing for k in new):  # fetched again only once its release has ended
                    self.cond.wait(0.5)
                    if self.stopped:
                        return None
                    continue
                size = int(self.nbytes[new].sum()) if new else 0
                # (the oldest batch not done may always fetch, once nothing else is held: every batch walked
                # before it is done, so what is still counted is being let go; then it fits the budget too)
                if self.budget is None or self.bytes_held + size <= self.budget or (j <= self.oldest and (
                        self.bytes_held == 0 or self.uses is not None)):
                    break
                if not block:
                    return None
                self.cond.wait(0.5)
                if self.stopped:
                    return None
            for k in keys:
                if k in self.refs:
                    if self.uses is None:  # (hold_to_last: a shard's references count all its batches at once)
                        self.refs[k] += 1
                    self._wait_for(k, j)
            for k in new:
                self._hold(k)
                self.in_flight[k] = [j]
            if new:
                self.pending[j] = self.pending.get(j, 0) + len(new)
            self.walked = j + 1
            self._advance()
        later = []
        for k in new:
            if self._fetched_now(k):
                continue
            if block:
                self._start(k)
            else:
                later.append(k)
        return later

    def _wait_for(self, k: int, j: int) -> None:
        """(Under the lock) batch j waits for held shard k too, if k's fetch is still in flight."""
        if k in self.in_flight:
            self.in_flight[k].append(j)
            self.pending[j] = self.pending.get(j, 0) + 1

    def _fetched_now(self, k: int) -> bool:
        """Shard k fetched at once by ``fetch_now`` (a shard already at hand), marked so; False: it must be read."""
        if self._fetch_now is not None and self._fetch_now(k):
            self._fetched(k, None)
            return True
        return False

    def _walk_each(self, j: int) -> list[int] | None:
        """``_walk`` of a ``hold_to_last`` schedule: batch j's shards taken one at a time, each as soon as it fits
        the budget (or j is the oldest batch not done), its fetch started at once. quasi_random's first batch of
        a window needs all of the window's shards: taken together, they waited for room for the whole window,
        which came only once the last window's batches were all gathered, so the disk sat idle while a window
        was served and the batches waited while the next was read (issue 34). Taken one at a time, those that
        fit are read while the last window is served; the rest follow once its batches are done."""
        for k in self.needs[j].tolist():
            with self.cond:
                while True:
                    if self.stopped:
                        return None
                    if k in self.refs:  # held (all its batches counted at once): j waits for it if it is in flight
                        self._wait_for(k, j)
                        fetch = False
                        break
                    if k not in self.releasing and (self.bytes_held + int(self.nbytes[k]) <= self.budget or
                                                    j <= self.oldest):
                        self._hold(k)
                        self.in_flight[k] = [j]
                        self.pending[j] = self.pending.get(j, 0) + 1
                        fetch = True
                        break
                    self.cond.wait(0.5)
            if fetch and not self._fetched_now(k):
                self._start(k)
        with self.cond:
            self.walked = j + 1
            self._advance()
        return []

    def _start(self, key: int) -> None:
        if self.pool is None:
            self._fetched(key, None, run=True)
        else:
            fut = self.pool.submit(self._fetch, key)
            with self.cond:
                self.futures[key] = fut
            fut.add_done_callback(lambda f, key=key: self._fetched(key, f))

    def _run(self, deferred: list[int]) -> None:
        try:
            for k in deferred:
                self._start(k)
            each = self.uses is not None and self.budget is not None
            while self.walked < self.end and not self.stopped:
                if (self._walk_each(self.walked) if each else self._walk(self.walked)) is None:
                    return
        except BaseException as e:  # noqa: BLE001 - handed to the batches that wait
            self._fail(self.walked, e)

    def _hold(self, key: int) -> None:
        self.refs[key] = 1 if self.uses is None else int(self.uses[key])
        self.fetches += 1
        self.bytes_held += int(self.nbytes[key])
        self.peak_bytes = max(self.peak_bytes, self.bytes_held)

    def _fetched(self, key: int, fut: Future | None, run: bool = False) -> None:
        if fut is not None:
            with self.cond:
                self.futures.pop(key, None)
        try:
            if run:
                self._fetch(key)
            elif fut is not None:
                if fut.cancelled():
                    return
                fut.result()
        except BaseException as e:  # noqa: BLE001
            with self.cond:
                waiting = self.in_flight.pop(key, [])
                if key in self.refs:  # nothing to let go: the fetch failed
                    del self.refs[key]
                    self.bytes_held -= int(self.nbytes[key])
            self._fail(min(waiting, default=self.walked), e)
            return
        late = False
        with self.cond:
            for j in self.in_flight.pop(key, []):
                self.pending[j] -= 1
            if key not in self.refs:  # closed meanwhile: let it go at once
                late = True
                self.releasing.add(key)
            self._advance()
        if late:
            self._let_go([key])

    def _advance(self) -> None:
        r = self.ready
        while r < self.walked and self.pending.get(r, 0) == 0:
            self.pending.pop(r, None)
            r += 1
        if r != self.ready:
            self.ready = r
            self.cond.notify_all()

    def _fail(self, j: int, e: BaseException) -> None:
        with self.cond:
            if self.error is None or j < self.error_batch:
                self.error, self.error_batch = e, j
            self.cond.notify_all()

    # ------------------------------------------------------------------ the filler threads
    def wait(self, j: int, should_stop=lambda: False) -> None:
        """Block until every shard of batch j is ready; a failed fetch raises here (in the filler)."""
        if j < self.ready:
            return
        with self.cond:
            while j >= self.ready:
                if self.error is not None and j >= self.error_batch:
                    if isinstance(self.error, DscError):
                        raise self.error  # (a RemoteError, a CorruptDatasetError...: as the fetch raised it)
                    raise DscError(f"reading the shards ahead failed: {self.error!r}") from self.error
                if self.stopped or should_stop():
                    raise DscError("the loader stopped while its shards were being read")
                self.cond.wait(0.5)

    def _unref(self, key: int) -> bool:
        """One reference less (under the lock); True when the shard is to be let go (``_let_go``)."""
        self.refs[key] -= 1
        if self.refs[key] > 0 or key in self.in_flight:
            return False
        del self.refs[key]
        self.releasing.add(key)
        return True

    def _let_go(self, keys: list[int]) -> None:
        """Release ``keys`` (no longer in ``refs``; in ``releasing``), then stop counting their bytes: what is
        held never exceeds the budget, even for the moment between the two."""
        try:
            for key in keys:
                self._release(key)
        finally:
            if keys:
                with self.cond:
                    self.bytes_held -= int(self.nbytes[keys].sum())
                    self.releasing.difference_update(keys)
                    self.cond.notify_all()

    def done(self, j: int) -> None:
        """Batch j is gathered: with ``per_batch``, the shards no walked batch still reads are let go."""
        if not self.per_batch:
            return
        release = []
        with self.cond:
            if j in self.finished or j < self.oldest:
                return
            self.finished.add(j)
            while self.oldest in self.finished:
                self.finished.discard(self.oldest)
                self.oldest += 1
            for key in self.needs[j].tolist():
                if key in self.refs and self._unref(key):
                    release.append(key)
            self.cond.notify_all()
        self._let_go(release)

    def close(self) -> None:
        """Stop fetching and let every held shard go, without waiting for fetches in flight (a download
        retrying against an unreachable server could take the whole retry budget): each lets its shard go
        when it ends."""
        with self.cond:
            self.stopped = True
            self.cond.notify_all()
        if self.thread is not None and threading.current_thread() is not self.thread:
            self.thread.join()
        with self.cond:
            held = [k for k in self.refs if k not in self.in_flight]
            self.releasing.update(held)
            self.refs = {}
            queued = list(self.futures.values())
        if self.pool is not None:
            self.pool.shutdown(queued)  # (not started: cancelled; running: each lets its shard go when it ends)
        self._let_go(held)
