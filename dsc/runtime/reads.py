"""Read strategies: how a Loader's batches get their bytes from the shard files.

FFCV's memory managers are the model: the epoch's order is known before it starts, so its reads can be
scheduled from it (``schedule.py``). Four strategies, one small interface (``map`` or ``read``, ``schedule``,
``close``), chosen per Loader by :func:`choose` from the order and the memory really available:

* ``mapped``: every shard touched is memory-mapped whole, its page tables filled up front, and kept mapped
  for the Loader's life. When the dataset fits in memory this is the fastest path there is: after the
  first epoch an epoch is a memory copy.
* ``windowed`` (``sequential`` and ``quasi_random`` on data bigger than memory): a read-ahead thread maps and
  reads in the coming shards, in the order the epoch first needs them (large sequential reads), within a
  byte budget (the most the order needs at once, plus as much again of read-ahead); each shard is unmapped
  and its pages dropped from the page cache once every batch that reads it is gathered. Memory stays
  bounded, whatever the dataset's size.
* ``direct`` (``random`` on data bigger than memory): each sample is read with one ``preadv`` straight
  into its place in the batch's slot of the ring (pinned memory when the device is CUDA; runs of
  neighbouring samples are one read), by a pool of ``io_depth`` I/O threads, so many more reads are in
  flight than there are filler threads. Read-ahead is off on the files (``POSIX_FADV_RANDOM``): the disk
  reads what is served, not the 64 MiB shard around it.
* ``ranged`` (a dataset in object storage whose shard cache cannot hold a batch's shards, or has none:
  ``cache_limit=0``): ``direct``'s reads as ranged GETs, neighbours in a shard coalesced, many in flight;
  nothing downloaded whole, nothing cached.
"""
from __future__ import annotations

import os
import threading
from collections import OrderedDict
from pathlib import Path

import numpy as np

from ..env import key_values  # (the cgroup helpers live in dsc/env.py)
from ..env import cgroup_limit as _cgroup_limit
from ..errors import ConfigError, CorruptDatasetError, TooManyOpenFilesError
from ..scratch import scratch_bytes
from ..store.base import object_changed, short_range
from .schedule import ShardSchedule, _DaemonPool, live_bytes
from .cache import parse_size

READS = ("auto", "mapped", "windowed", "direct", "ranged")
FIT = 0.8  # a dataset "fits" when its shards take at most this share of the memory available
IO_DEPTH = 16  # direct reads in flight per Loader (measured here: 8-32 threads all reach the disk's rate)
MAX_IO_DEPTH = 256
CHUNK = 4 << 20  # a direct read longer than this is split, so that one long run does not serialise a batch
MAX_FDS = 512  # shard files a direct strategy keeps open (at most an eighth of the process's limit)
RANGE_DEPTH = 32  # ranged GETs in flight per Loader, at least (a request waits on the network, not a disk)
RANGE_GAP = 64 << 10  # ranges of one shard at most this far apart are one GET (the gap is read and dropped)
RANGE_MAX = 8 << 20  # the longest GET (a longer run of neighbours is cut between samples)


# ----------------------------------------------------------------------------- memory
def available_memory() -> tuple[int, str]:
    """(bytes of memory this process can fill with a dataset's pages, where the figure comes from).

    ``$DSC_MEMORY`` (bytes or "8GB") when set; else the smaller of the machine's ``MemAvailable`` and what
    this process's memory cgroup leaves (its limit minus the memory its processes hold that is not page
    cache): a container's page cache is charged to its cgroup, so a dataset bigger than the limit does not
    stay in memory even on a machine with plenty."""

    forced = os.environ.get("DSC_MEMORY")
    if forced:
        return parse_size(forced, "$DSC_MEMORY"), "$DSC_MEMORY"
    avail = key_values(Path("/proc/meminfo")).get("MemAvailable:")
    best = (avail * 1024, "MemAvailable") if avail is not None else (os.sysconf("SC_PAGE_SIZE") *
                                                                    os.sysconf("SC_AVPHYS_PAGES"), "free pages")
    cg = _cgroup_limit()
    if cg is not None and cg[0] - cg[1] < best[0]:
        best = (cg[0] - cg[1], f"{cg[2]} {_gb(cg[0])}, less {_gb(cg[1])} its processes hold now")
    return max(best[0], 0), best[1]


def _gb(n: float) -> str:
    if n >= 1e9:
        return f"{n / 1e9:.2f} GB"
    return f"{n / 1e6:.1f} MB" if n >= 1e5 else f"{int(n):,} bytes"


def batch_slots(order: str, batch_size: int, shard_size: int, window: int | None = None) -> int:
    """The most slots one batch of ``order`` may touch: ``batch_size`` in random order, two windows in
    quasi_random, the shards a run of ``batch_size`` samples spans in sequential. A batch's shards are at most the
    bytes of that many of the largest slots (``Dataset.largest_slots_bytes``)."""
    if order == "sequential":
        return -(-batch_size // max(shard_size, 1)) + 1
    if order == "quasi_random":
        return min(batch_size, 2 * (window or 1))
    return batch_size


def choose(order: str, dataset_bytes: int, read: str = "auto", memory: tuple[int, str] | None = None,
           cache: str = "page", remote: tuple[int | None, int] | None = None) -> tuple[str, str]:
    """(strategy, why) for reading a dataset of ``dataset_bytes`` in ``order``: ``mapped`` when it fits in
    memory (at most ``FIT`` of it), else ``direct`` for random order and ``windowed`` for the others;
    ``read`` other than ``auto`` forces one. ``remote``: a dataset in object storage, (the bytes of the shard
    cache this process may fill, None when unbounded; the most bytes of shards a batch reads,
    ``Dataset.largest_slots_bytes`` of ``batch_slots``): ``ranged`` when the cache cannot hold a batch's shards (or is none,
    ``cache_limit=0``), else the cached files are read as a local dataset's. (With no limit the second figure is
    not needed: 0.)"""
    if read not in READS:
        raise ConfigError(f"read must be one of {', '.join(READS)}, got {read!r}")
    if cache == "ram":
        if read not in ("auto", "mapped"):
            raise ConfigError(f"cache='ram' reads the dataset into memory; read={read!r} is for data read from "
                              f"disk. Use one or the other")
        return "mapped", "cache='ram': the shards are in this process's memory"
    if read != "auto":
        why = f"read={read!r} asked for"
        if memory is not None:
            auto, reason = choose(order, dataset_bytes, "auto", memory, remote=remote)
            why += f"; auto would read with {auto}: {reason}"
        return read, why
    if remote is not None and remote[0] is not None and (remote[0] == 0 or remote[1] > remote[0]):
        room = "no shard cache (cache_limit=0)" if remote[0] == 0 else \
            f"the shard cache's {_gb(remote[0])} for this process cannot hold the shards of a batch ({_gb(remote[1])})"
        return "ranged", f"{room}: each sample read by a byte range from object storage"
    avail, where = memory if memory is not None else available_memory()
    size = f"dataset {_gb(dataset_bytes)}"
    room = f"{FIT:.0%} of the {_gb(avail)} of memory available = {_gb(FIT * avail)} ({where})"
    if dataset_bytes <= FIT * avail:
        return "mapped", f"{size} fits in {room}"
    why = f"{size} > {room}"
    if order == "random":
        return "direct", f"{why}; order random: one read per sample"
    return "windowed", f"{why}; order {order}: shards read ahead in order and released behind"


def join_choices(picks: list[tuple[str, str]], names: list[str]) -> tuple[str, str]:
    """(strategy, why) of a mixture whose sources chose ``picks`` (each ``choose``'s pair; ``names``: the
    sources' names): the one strategy when all chose it, else ``a+b+...`` source by source with each reason."""
    kinds = [name for name, _ in picks]
    if len(set(kinds)) == 1 and len({why for _, why in picks}) == 1:
        return kinds[0], picks[0][1]
    joined = kinds[0] if len(set(kinds)) == 1 else "+".join(kinds)
    return joined, "; ".join(f"source {s} ({n}): {k}, {why}" for s, (n, (k, why)) in enumerate(zip(names, picks)))


def describe(dataset_bytes: int, memory: tuple[int, str] | None = None) -> str:
    """What a Loader with ``read="auto"`` reads this dataset with, in every order, and why (``dsc info``)."""
    memory = memory or available_memory()
    name, why = choose("random", dataset_bytes, memory=memory)
    if name == "mapped":
        return f"mapped in every order: {why}"
    return f"direct (order random), windowed (sequential, quasi_random): {why.split(';')[0]}"


# ----------------------------------------------------------------------------- the strategies
def hold_schedule(storage, needs, start, nbytes, paths, mapped: bool, budget: int | None, per_batch: bool,
                  workers: int) -> ShardSchedule | None:
    """The epoch's schedule of a strategy that reads held shards in place: none for a local dataset (its shards
    are always there); for a remote one, the coming batches' shards downloaded into the cache and held (mapped,
    or for direct reads only held) ahead of them, let go behind within ``budget``."""
    if not storage.remote:
        return None
    return ShardSchedule(needs, start, nbytes, lambda k: storage.acquire(paths[k], mapped),
                         lambda k: storage.release(paths[k]), budget=budget, per_batch=per_batch, workers=workers,
                         fetch_now=lambda k: storage.acquire_cached(paths[k], mapped), name="dsc-fetch")


class Mapped:
    """Shards mapped whole on first use and kept (the storage's own mappings)."""

    name = "mapped"
    direct = False

    def __init__(self, storage, **_):
        self.storage = storage
        self.map = storage.map  # (the storage's own: no call of ours per sample on the hot path)

    def schedule(self, needs, start, nbytes, paths, budget=None, per_batch=True, workers=1) -> ShardSchedule | None:
        return hold_schedule(self.storage, needs, start, nbytes, paths, True, budget, per_batch, workers)

    def close(self) -> None:
        pass


class Windowed:
    """Shards read ahead in first-use order within a budget, released behind (see the module docstring)."""

    name = "windowed"
    direct = False

    def __init__(self, storage, memory: int | None = None, **_):
        self.storage = storage
        self.memory = memory  # the budget never asks for more than half of it (at least one batch's shards)
        self._maps: dict[str, np.ndarray] = {}
        self._lock = threading.Lock()
        self.peak_bytes = 0
        self.budget = None

    @property
    def held_bytes(self) -> int:
        with self._lock:
            return sum(a.nbytes for a in self._maps.values())

    def map(self, rel: str, nbytes: int) -> np.ndarray:
        arr = self._maps.get(rel)
        if arr is None:  # not scheduled (a batch read outside an epoch): mapped for this read only
            arr = self.storage.map_file(rel, nbytes, populate=False)
        return arr

    def schedule(self, needs, start, nbytes, paths, budget: int | None = None, per_batch=True,
                 workers: int = 2) -> ShardSchedule:
        """The epoch's read-ahead: ``budget`` bounds it further (a remote cache's share); ``workers`` fetch at
        once (a remote dataset's downloads want more connections than a disk's read-ahead)."""
        cap = budget
        need = live_bytes(needs[start:], nbytes)
        budget = 2 * need  # what the order needs at once, and as much again read ahead
        memory = self.memory_now()
        for limit in (memory // 2 if memory is not None else None, cap):
            if limit is not None:
                budget = min(budget, limit)
        # Each shard is held until the last batch that reads it is done (read once an epoch, whatever the
        # budget): below what the order needs at once, the budget only stops the read-ahead, never a batch.
        if cap is not None:  # (a remote cache's share: never below the shards of one batch, as before)
            budget = max(budget, max((int(nbytes[n].sum()) for n in needs[start:]), default=0))
        self.budget = budget = max(budget, int(nbytes.max()) if len(nbytes) else 0)
        storage = self.storage

        def fetch(key: int) -> None:
            rel = paths[key]
            storage.acquire(rel, mapped=False)  # (a remote dataset's shard: downloaded into the cache and held)
            try:
                arr = storage.map_file(rel, int(nbytes[key]), populate=True)
            except BaseException:
                storage.release(rel)
                raise
            with self._lock:
                self._maps[rel] = arr
                self.peak_bytes = max(self.peak_bytes, sum(a.nbytes for a in self._maps.values()))

        def release(key: int) -> None:
            rel = paths[key]
            with self._lock:
                self._maps.pop(rel, None)
            storage.drop_pages(rel)
            storage.release(rel)

        # (under a remote cache's bound, ``cap``, a shard is let go as before: held past the bound, it would keep
        # the downloads the walk needs from finding room)
        return ShardSchedule(needs, start, nbytes, fetch, release, budget=budget, per_batch=True, workers=workers,
                             name="dsc-readahead", hold_to_last=cap is None)

    def memory_now(self) -> int | None:
        """The memory the read-ahead may fill, measured as each epoch starts (the ring, the model, the other
        processes of the memory cgroup hold what they hold by then): the smaller of the figure the Loader was
        made with and what ``available_memory`` says now (``$DSC_MEMORY``, when set, is taken as it is)."""
        if self.memory is None or os.environ.get("DSC_MEMORY"):
            return self.memory
        try:
            return min(self.memory, available_memory()[0])
        except (ConfigError, OSError):
            return self.memory

    def close(self) -> None:
        with self._lock:
            rels, self._maps = list(self._maps), {}
        for rel in rels:
            self.storage.drop_pages(rel)


class Direct:
    """One read per sample (or run of neighbouring samples) into the batch (see the module docstring)."""

    name = "direct"
    direct = True

    def __init__(self, storage, io_depth: int = IO_DEPTH, **_):
        import resource

        self.storage = storage
        self.io_depth = io_depth
        # A remote dataset's shards are read through the descriptor of their hold in the cache (held by the
        # epoch's schedule while its batches read them): a descriptor of our own would keep an evicted
        # shard's bytes on disk, beyond the cache's limit.
        self.borrow = getattr(storage, "remote", False)
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        self.max_fds = MAX_FDS if soft == resource.RLIM_INFINITY else max(8, min(MAX_FDS, soft // 8))
        self._fds: OrderedDict[str, list] = OrderedDict()  # rel -> [fd, readers using it]
        self._lock = threading.Lock()
        self._pool: _DaemonPool | None = None
        self._local = threading.local()  # each thread's read buffer, freed with this handle (see scratch)
        self.reads = 0  # read calls made (tests count them)

    held_bytes = 0  # nothing is mapped or held between batches

    def schedule(self, needs, start, nbytes, paths, budget=None, per_batch=True, workers=1) -> ShardSchedule | None:
        return hold_schedule(self.storage, needs, start, nbytes, paths, False, budget, per_batch, workers)

    def scratch(self, n: int) -> np.ndarray:
        """``n`` bytes of this thread's read buffer, valid until its next use. Kept in this handle's own pool, not
        the thread's ``dsc.scratch`` one: the main thread's pool lives as long as the process, and a batch's raw
        bytes (tens of MB) must go with the Loader that read them."""
        return scratch_bytes("reads", n, grow=1.25, local=self._local)

    def _open(self, rel: str) -> int:
        if self.borrow:
            return self.storage.held_fd(rel)
        with self._lock:
            entry = self._fds.get(rel)
            if entry is not None:
                entry[1] += 1
                self._fds.move_to_end(rel)
                return entry[0]
        try:
            fd = self.storage.shard_fd(rel)
        except TooManyOpenFilesError:  # the process's limit: let our idle files go, and try once more
            self._close_idle(0)
            fd = self.storage.shard_fd(rel)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        except (OSError, AttributeError):
            pass
        close = []
        with self._lock:
            entry = self._fds.get(rel)
            if entry is not None:  # another thread opened it meanwhile
                close.append(fd)
                entry[1] += 1
                fd = entry[0]
            else:
                self._fds[rel] = [fd, 1]
        for f in close:
            os.close(f)
        self._close_idle(self.max_fds)
        return fd

    def _close_idle(self, keep: int) -> None:
        """Close the least recently used files no reader is using, until at most ``keep`` are open."""
        close = []
        with self._lock:
            for other in list(self._fds):
                if len(self._fds) <= keep:
                    break
                if self._fds[other][1] == 0:
                    close.append(self._fds.pop(other)[0])
        for f in close:
            os.close(f)

    def _done(self, rel: str) -> None:
        if self.borrow:
            return
        with self._lock:
            self._fds[rel][1] -= 1

    def _run(self, jobs: list[tuple]) -> None:
        """Read ``jobs`` [(rel, file offset, memoryview)] in order (each job one or more ``preadv``)."""
        for rel, off, view in jobs:
            fd = self._open(rel)
            try:
                got = 0
                while got < len(view):
                    n = os.preadv(fd, [view[got:]], off + got)
                    if n == 0:
                        raise CorruptDatasetError(f"{self.storage.where(rel)} ended before byte {off + len(view):,}; "
                                                  f"the dataset is damaged (dsc verify names the samples)")
                    got += n
            finally:
                self._done(rel)

    def read(self, shards, slots, file_offsets, sizes, dest: np.ndarray, dest_offsets) -> None:
        """Put ``sizes[k]`` bytes at ``file_offsets[k]`` of shard ``shards[slots[k]]`` into ``dest`` at
        ``dest_offsets[k]``, for every k: neighbouring samples (next in the file and in ``dest``) make one
        read, runs longer than ``CHUNK`` are split, and the reads are spread over the I/O threads (the
        calling thread takes a share)."""
        n = len(slots)
        if n == 0:
            return
        slots = np.asarray(slots, np.int64)
        fo, sz, do = (np.asarray(a, np.int64) for a in (file_offsets, sizes, dest_offsets))
        cut = np.r_[True, (slots[1:] != slots[:-1]) | (fo[1:] != fo[:-1] + sz[:-1]) | (do[1:] != do[:-1] + sz[:-1])]
        starts = np.flatnonzero(cut)
        lengths = np.add.reduceat(sz, starts)
        view = memoryview(dest).cast("B") if dest.ndim != 1 or dest.dtype != np.uint8 else memoryview(dest)
        jobs = []
        for s, a, length in zip(slots[starts].tolist(), starts.tolist(), lengths.tolist()):
            rel, f0, d0 = shards[s].path, int(fo[a]), int(do[a])
            for c in range(0, max(length, 1), CHUNK):
                m = min(CHUNK, length - c)
                if m > 0:
                    jobs.append((rel, f0 + c, view[d0 + c:d0 + c + m]))
        self.reads += len(jobs)
        self._dispatch(jobs)

    def _dispatch(self, jobs: list) -> None:
        """Run ``jobs`` (``self._run``'s) over the I/O threads, the calling thread taking a share; the first
        failure is raised once every thread is done with the destination."""
        groups = min(len(jobs), self.io_depth + 1)
        if groups <= 1:
            self._run(jobs)
            return
        if self._pool is None:
            with self._lock:
                if self._pool is None:
                    self._pool = _DaemonPool(self.io_depth, "dsc-read")
        parts = [jobs[g::groups] for g in range(groups)]  # interleaved: each thread gets a spread of the batch
        futs = [self._pool.submit(self._run, p) for p in parts[1:]]
        err = None
        try:
            self._run(parts[0])
        except BaseException as e:  # noqa: BLE001 - raised after the others are done with ``dest``
            err = e
        for f in futs:
            try:
                f.result()
            except BaseException as e:  # noqa: BLE001
                err = err or e
        if err is not None:
            raise err

    def close(self) -> None:
        with self._lock:
            fds = [e[0] for e in self._fds.values()]
            self._fds.clear()
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown()
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


class Ranged(Direct):
    """A dataset in object storage read without whole shards: each sample of a batch is one ranged GET of its
    bytes (neighbours in a shard, up to ``RANGE_GAP`` apart, one GET), ``io_depth`` (at least ``RANGE_DEPTH``)
    of them in flight, each copied straight into its place in the batch's ring slot. Nothing is cached or
    held: the shard cache is not used, so it can be smaller than a batch's shards, or none (``cache_limit=0``).
    The batches are the other strategies' (same order, resume and rank parts): only where the bytes come
    from differs."""

    name = "ranged"
    direct = True
    holds_shards = False  # (the Loader schedules no shard downloads for it)

    def __init__(self, storage, io_depth: int = IO_DEPTH, **_):
        store = getattr(storage, "store", None)
        if store is None or store.local:
            raise ConfigError("read='ranged' reads a dataset in object storage by byte ranges; a local dataset "
                              "is read in place: use read='direct' (or the default, 'auto')")
        super().__init__(storage, max(io_depth, RANGE_DEPTH))
        self.borrow = False
        self.store = store
        # shard path -> the ETag of the object its first range read: every later range asks for that object only
        # (the storage's: kept as long as the handle reads its version)
        self.etags: dict[str, str] = getattr(storage, "range_etags", {})
        self.requests = 0  # ranged GETs made (tests count them)
        self.bytes_fetched = 0  # bytes those GETs returned

    def schedule(self, needs, start, nbytes, paths, budget=None, per_batch=True, workers=1) -> None:
        return None

    def read(self, shards, slots, file_offsets, sizes, dest: np.ndarray, dest_offsets) -> None:
        """As ``Direct.read``, each run of ranges of a shard no more than ``RANGE_GAP`` apart (and at most
        ``RANGE_MAX`` long) one GET."""
        n = len(slots)
        if n == 0:
            return
        slots = np.asarray(slots, np.int64)
        fo, sz, do = (np.asarray(a, np.int64) for a in (file_offsets, sizes, dest_offsets))
        order = np.lexsort((fo, slots))
        view = memoryview(dest).cast("B") if dest.ndim != 1 or dest.dtype != np.uint8 else memoryview(dest)
        jobs, pieces, spec, first, last, slot = [], [], None, 0, 0, -1
        for s, a, m, d in zip(slots[order].tolist(), fo[order].tolist(), sz[order].tolist(), do[order].tolist()):
            if s != slot or a > last + RANGE_GAP or a + m - first > RANGE_MAX:  # a new GET
                if pieces:
                    jobs.append((spec, first, last, pieces))
                spec, first, last, slot, pieces = shards[s], a, a + m, s, []
            pieces.append((a, a + m, view[d:d + m]))
            last = max(last, a + m)
        jobs.append((spec, first, last, pieces))
        self.reads += len(jobs)
        self._dispatch(jobs)

    def _run(self, jobs: list[tuple]) -> None:
        """GET each job's range [start, end) of shard ``spec`` and copy its pieces into their places."""
        for spec, start, end, pieces in jobs:
            if end == start:  # (empty samples only: nothing to GET)
                continue
            data = memoryview(self._range(spec, start, end))
            with self._lock:
                self.requests += 1
                self.bytes_fetched += len(data)
            for a, b, out in pieces:
                out[:] = data[a - start:b - start]


    def _range(self, spec, start: int, end: int):
        """Bytes [start, end) of shard ``spec``, of the object its first range read: that read checks the object is
        the shard the version names (the SHA-256 its upload recorded, when it did) and pins its ETag; a later range
        of an object replaced since is an ObjectChangedError (never bytes of two objects in one batch)."""
        rel = spec.path
        data, tag, attributes = self.store.read_range_pinned(rel, start, end, self.etags.get(rel))
        if len(data) != end - start:
            raise short_range(self.store.where(rel), end)
        if tag and rel not in self.etags:
            recorded = attributes.get("sha256")
            if recorded and recorded != spec.sha256:
                raise CorruptDatasetError(f"{self.store.where(rel)} is not the shard this version names (its upload "
                                          f"recorded SHA-256 {recorded[:16]}..., the version {spec.sha256[:16]}...): "
                                          f"another object was put at its name. Push an intact copy of the dataset "
                                          f"(dsc verify {self.store.url} lists every damaged file)")
            if self.etags.setdefault(rel, tag) != tag:  # (two threads' first ranges: of one object)
                raise object_changed(self.store.where(rel))
        return data


STRATEGIES = {"mapped": Mapped, "windowed": Windowed, "direct": Direct, "ranged": Ranged}


def make(name: str, storage, **kw):
    """The strategy ``name`` over ``storage`` (a runtime Storage)."""
    return STRATEGIES[name](storage, **kw)
