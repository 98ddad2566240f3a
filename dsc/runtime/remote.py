"""Reading a dataset from object storage (docs/REMOTE.md): open it, then feed its shards ahead of the batches.

Open: the version's record is read (the latest, a number, or a tag), then every small file its manifest
lists (labels, offsets, boxes, keys, per-sample geometry: the version's objects) is downloaded, checked
against its SHA-256, and kept under ``CACHE/datasets/<id>/`` in the local layout, so the field readers
read them exactly as they read a local version. Shards come later, whole, through the shard cache
(``cache.py``), and are memory-mapped from there: the gather is the local one.

A handle reads the version it opened for as long as it lives (its record and objects are local copies;
shards are immutable and named by content). Object storage has no locks to pin with: ``dsc vacuum`` of a
remote dataset keeps every version superseded within its retention period, which is what protects a
reader there.

The Loader knows every coming batch, so its shard schedule (``schedule.py``) downloads and holds their
shards in the order the epoch first needs them, with parallel connections, as far ahead as a byte budget
within the cache limit allows; what is cached and held already is ready at once, without a thread. The
batches then read the cached files through the Loader's read strategy (``reads.py``), as a local
dataset's.
"""
from __future__ import annotations

import errno
import hashlib
import os
import stat
import threading
import time
import weakref
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np

from ..errors import CorruptDatasetError, DatasetNotFoundError, DscError
from ..progress import progress_bar
from ..formats import layout as L
from ..formats import versions
from ..store.local import Root, map_fd
from ..store import Store, open_store
from ..formats.remote import fetch_version, url_id, write_atomic
from .cache import Held, ShardCache
from .storage import Storage
from ..errors import ConfigError

CONNECTIONS = 8  # parallel downloads of one feed
_HANDLES: "weakref.WeakSet[RemoteStorage]" = weakref.WeakSet()  # this process's remote storages (see _make_room)


def mirror_dir(cache: ShardCache, url: str) -> Path:
    """Where the small files of the dataset at ``url`` are kept locally."""
    url = url.rstrip("/")
    d = cache.root / "datasets" / url_id(url)
    (d / versions.LOG).mkdir(parents=True, exist_ok=True)
    (d / versions.OBJECTS).mkdir(parents=True, exist_ok=True)
    marker = d / "url"
    if not marker.is_file():
        write_atomic(marker, (url + "\n").encode())
    return d


class _Mirror(Root):
    """The node's mirror of a remote version's small files (``CACHE/datasets/<id>/``), pointed at the version's
    objects and its shard table bound to the store. A file found missing there (the mirror removed under the
    handle by ``dsc cache clear``, an object ``dsc cache verify`` deleted) has the version fetched again, as an
    open fetches it, and is read from the new copy: what the handle had not read yet (keys, sizes...) still
    reads. Only a missing file costs a check; a read that finds its file costs none."""

    def __init__(self, store: Store, cache: ShardCache, manifest, version: int | None, path: Path):
        super().__init__(path)  # (``mirror_dir``, made by the open that fetched the version into it)
        self.store, self.cache, self.version, self._manifest = store, cache, version, manifest
        self._lock, self._gone = threading.Lock(), []  # (descriptors of removed mirrors: other threads may use them)
        versions.use(self, manifest)
        versions.bind_table(manifest, store, self.path)  # (its shard table: fetched into the mirror when first read)

    def _open(self, rel: str) -> int:
        fd = self.fd
        try:
            return super()._open(rel)
        except FileNotFoundError:  # (a file the version does not list is absent, unless the mirror itself went)
            if self.version is None or (rel not in self.redirect and os.fstat(fd).st_nlink > 0):
                raise
        self._fetch_again(fd)
        return super()._open(rel)

    def _fetch_again(self, seen: int) -> None:
        """Fetch the version into the mirror again, and read from there (unless another thread did, since ``seen``
        was the mirror's descriptor)."""
        with self._lock:
            if self.fd != seen:
                return
            path = mirror_dir(self.cache, self.store.url)
            fetch_version(self.store, path, self.version)
            versions.bind_table(self._manifest, self.store, path)
            fresh = Root(path)
            self._gone.append(self.fd)
            self.fd, fresh.fd, self.path = fresh.fd, None, path

    def __reduce__(self):  # (as a Root pickles: the folder, opened again)
        return Root, (self.path,)

    def __del__(self):
        for fd in getattr(self, "_gone", ()):
            try:
                os.close(fd)
            except OSError:
                pass
        super().__del__()


def _opened(where, version, tag, cache_dir, cache_limit, retry_seconds, offline_version):
    """(record, mirror of the version's small files, store, cache, lease) of the dataset at ``where`` (a URL or
    its store). A first open leases the version (``versions.Lease``: vacuum keeps it while this handle lives);
    a re-opening process (``offline_version``) reads under its parent's lease."""
    store = where if isinstance(where, Store) else open_store(where, retry_seconds)
    if store.local:
        raise ConfigError(f"{store.url}: the shard cache is for datasets in object storage (s3://, gs://, az://); a "
                          f"local dataset is read in place")
    cache = ShardCache(cache_dir, cache_limit)
    mirror = mirror_dir(cache, store.url)
    rec = lease = None
    if offline_version is not None:  # a re-opening process: the local copy, when it is complete
        try:
            rec = versions.read_record(Root(mirror), offline_version)
            if not all((mirror / versions.object_path(f["sha256"])).is_file() for f in rec["manifest"].files.values()):
                rec = None
        except DscError:
            rec = None
    if rec is None:
        rec, lease = versions.open_version(store, offline_version if offline_version is not None else version, tag,
                                           read=lambda n: fetch_version(store, mirror, n),
                                           hold=offline_version is None)
    manifest = rec["manifest"]
    return rec, _Mirror(store, cache, manifest, manifest.version["number"] if manifest.version else None, mirror), \
        store, cache, lease


def open_remote(where, version: int | None, tag: str | None, cache_dir=None, cache_limit=None,
                retry_seconds: float | None = None, offline_version: int | None = None):
    """(record, RemoteStorage) of the dataset at ``where`` (a URL or its store). ``offline_version``: a
    re-opening process (a DataLoader worker) reads that version from the local mirror when it has it, without
    the network."""
    rec, root, store, cache, lease = _opened(where, version, tag, cache_dir, cache_limit, retry_seconds,
                                             offline_version)
    try:
        storage = RemoteStorage(root, store, cache, rec["manifest"], retry_seconds)
    except BaseException:
        if lease is not None:
            lease.release()
        raise
    storage._pin = lease  # released when the storage closes
    return rec, storage


class _SpecsByPath:
    """{shard path: ShardSpec} of a version with a shard table, each entry read from the table when asked for."""

    def __init__(self, table):
        self.table = table

    def __getitem__(self, rel: str):
        node, slot = rel.split("/", 1)[0], L.slot_of(rel)
        spec = (self.table.column(node)[slot] if node in self.table.columns and slot is not None
                and slot < self.table.slots else None)
        if spec is None or spec.path != rel:
            raise KeyError(rel)
        return spec

    def values(self) -> list:
        """Every shard of the version (the whole table read)."""
        return L.table_specs(self.table)


class RemoteStorage(Storage):
    """A remote version's bytes: small arrays from the local mirror, shards through the shard cache.

    Shards are held by reference: ``acquire(rel)`` downloads (if needed), holds and maps shard ``rel``;
    ``release(rel)`` lets it go when no batch needs it any more. A shard let go stays held and mapped while
    it is among the most recently used ``idle_budget`` bytes (the next epoch, or ``ds[i]``, finds it mapped,
    as a local dataset's shards are); the cache takes those back (``drop_idle``) whenever it needs room for
    a download. ``map`` of a shard nobody acquired (plain ``ds[i]``) acquires and lets go at once."""

    def __init__(self, root: Root, store: Store, cache: ShardCache, manifest, retry_seconds=None):
        super().__init__(root, manifest.checksum(), manifest.version["number"] if manifest.version else None, None)
        self.url = self.root = store.url  # (errors name the URL; the small files are read from the mirror)
        self.store, self.cache, self.retry_seconds = store, cache, retry_seconds
        self.specs = ({s.path: s for s in L.shard_specs(manifest)} if manifest.shard_table is None
                      else _SpecsByPath(manifest.shard_table))  # (a shard table: read when a shard is first needed)
        self._lock = threading.Lock()
        self._refs: dict[str, int] = {}
        self._held: dict[str, Held] = {}
        self._pending: dict[str, Future] = {}
        self._idle: OrderedDict[str, None] = OrderedDict()  # held and mapped, no reference: oldest first
        self.range_etags: dict[str, str] = {}  # shard -> its object's ETag, pinned by read='ranged''s first range
        # Unbounded cache: keep every shard mapped (like a local dataset). Bounded: a quarter of this process's
        # share of it, so idle shards never crowd out the downloads ahead of training.
        self._budget_at, self._budget = 0.0, None
        self._pressure_at = time.monotonic()
        self._pressure_seen = cache.pressure()
        cache.join()  # a user of the cache: its share of the limit counts every process reading through it
        _HANDLES.add(self)

    @property
    def idle_budget(self) -> int | None:
        """The bytes of idle shards kept mapped: a quarter of this process's share of the limit (recomputed
        at most once a second: the number of processes sharing the cache changes)."""
        if self.cache.limit is None:
            return None
        now = time.monotonic()
        if now - self._budget_at > 1.0:
            self._budget, self._budget_at = self.cache.share(_local_processes()) // 4, now
        return self._budget

    @property
    def remote(self) -> bool:
        return True

    def acquire(self, rel: str, mapped: bool = True) -> None:
        """Hold shard ``rel`` (one more reference), downloading it when the cache lacks it; ``mapped``: and
        map it (a direct read only needs the file)."""
        with self._lock:
            downloads = rel not in self._refs
            if downloads:  # this thread downloads it
                self._refs[rel] = 1
                self._pending[rel] = Future()
                self._pending[rel].set_running_or_notify_cancel()
            else:
                self._refs[rel] += 1
                self._idle.pop(rel, None)
                fut = self._pending.get(rel)
        if not downloads:
            try:
                if fut is not None:  # another thread is fetching it: wait for that
                    fut.result()
                if mapped:
                    self._map_held(rel)
            except BaseException:
                self._drop(rel)
                raise
            return
        spec = self.specs[rel]
        try:
            held = self.hold(spec)
            arr = map_fd(held.fd, spec.nbytes, self.store.where(rel)) if mapped else None
        except BaseException as e:
            with self._lock:
                fut = self._pending.pop(rel)
            fut.set_exception(e)
            self._drop(rel)
            raise
        with self._lock:
            self._held[rel] = held
            if arr is not None:
                self._maps[rel] = arr
            fut = self._pending.pop(rel)
        fut.set_result(None)

    def acquire_cached(self, rel: str, mapped: bool = True) -> bool:
        """Hold shard ``rel`` if this handle holds it already (mapped, if asked): no I/O. False otherwise."""
        with self._lock:
            if rel not in self._held or rel in self._pending or (mapped and rel not in self._maps):
                return False
            self._refs[rel] = self._refs.get(rel, 0) + 1
            self._idle.pop(rel, None)
            return True

    def _map_held(self, rel: str) -> None:
        """Map held shard ``rel`` unless it is (its pages read in outside the lock: the other threads go on)."""
        with self._lock:
            if rel in self._maps:
                return
            held = self._held[rel]
        arr = map_fd(held.fd, self.specs[rel].nbytes, self.store.where(rel))
        with self._lock:
            self._maps.setdefault(rel, arr)

    def where(self, rel: str) -> str:
        return self.store.where(rel)

    def map_file(self, rel: str, nbytes: int, populate: bool = True) -> np.ndarray:
        """A new mapping of held shard ``rel`` (one not held is mapped and kept like ``map``'s)."""
        with self._lock:
            held = self._held.get(rel) if self._refs.get(rel, 0) > 0 else None
        if held is None:
            return self.map(rel, nbytes)
        return map_fd(held.fd, nbytes, self.store.where(rel), populate)

    def drop_pages(self, rel: str) -> None:
        """(Cached shards are the cache's to keep or evict.)"""

    def held_fd(self, rel: str) -> int:
        """The descriptor of held shard ``rel``'s cached file, for direct reads while it stays held (the
        Loader's schedule holds a batch's shards until the batch is gathered); not to be closed."""
        with self._lock:
            held = self._held.get(rel)
            if held is None or self._refs.get(rel, 0) < 1:
                raise DscError(f"{self.store.where(rel)} is read directly while not held (read='direct' on a "
                               f"remote dataset reads only within a Loader's epoch)")
            return held.fd

    def check_shard(self, rel: str, nbytes: int) -> None:
        """(A cached shard's size and hash are checked as it is downloaded.)"""

    def hold(self, spec) -> Held:
        """Shard ``spec`` held in the cache, downloaded (at most its recorded size) when the cache lacks it."""
        return self.cache.hold(spec.sha256, spec.nbytes,
                               lambda f, on_chunk: self.store.download(spec.path, f, on_chunk, spec.nbytes),
                               self.store.where(spec.path), on_full=self._make_room)

    def _drop(self, rel: str) -> None:
        with self._lock:
            self._refs[rel] -= 1
            if self._refs[rel] == 0:
                del self._refs[rel]

    def release(self, rel: str) -> None:
        """One reference less; at none the shard goes idle (see the class docstring)."""
        with self._lock:
            n = self._refs.get(rel, 0) - 1
            if n > 0:
                self._refs[rel] = n
                return
            if rel in self._held:
                self._refs[rel] = 0
                self._idle[rel] = None
                self._idle.move_to_end(rel)
            else:
                self._refs.pop(rel, None)
        self._trim(self.idle_budget)
        now = time.monotonic()
        if self.cache.limit is not None and now - self._pressure_at > 0.2:  # another process waits for room:
            self._pressure_at = now                                         # let every idle shard go
            seen = self.cache.pressure()
            if seen > self._pressure_seen:
                self._pressure_seen = seen
                self.drop_idle()

    def _trim(self, budget: int | None) -> int:
        """Let go of the oldest idle shards until they hold at most ``budget`` bytes; the bytes let go."""
        if budget is None:
            return 0
        gone = []
        with self._lock:
            idle = sum(self._held[r].nbytes for r in self._idle)
            while self._idle and idle > budget:
                rel = self._idle.popitem(last=False)[0]
                held = self._held.pop(rel)
                self._maps.pop(rel, None)  # arrays still referenced (a sample a user kept) keep their mapping
                del self._refs[rel]
                idle -= held.nbytes
                gone.append(held)
        for held in gone:
            held.close()
        return sum(h.nbytes for h in gone)

    def drop_idle(self) -> int:
        """Let every idle shard go."""
        return self._trim(0)

    def _make_room(self) -> int:
        """The cache needs room: every handle of this process on the same cache lets its idle shards go."""
        return sum(h.drop_idle() for h in list(_HANDLES) if h.cache.root == self.cache.root)

    def map(self, rel: str, nbytes: int) -> np.ndarray:
        arr = self._maps.get(rel)
        if arr is not None:
            return arr
        self.dir  # noqa: B018 - raises if a re-open failed
        self.acquire(rel)
        with self._lock:
            arr = self._maps[rel]
        self.release(rel)
        return arr

    def load_to_ram(self, shards, progress: bool = True) -> None:

        raise ConfigError(f"{self.url}: cache='ram' reads the whole dataset into each process; for a remote dataset "
                          f"warm the shard cache instead (dsc cache warm URL)")

    def renew_lease(self) -> None:
        """Push the reader's lease on (each epoch asks): a long training run keeps its version from vacuum."""
        lease = self._pin
        if lease is not None and getattr(lease, "rel", None) and lease.expires - time.time() < lease.seconds / 2:
            lease.renew()

    def close(self) -> None:
        self.closed = True
        with self._lock:
            held, self._held, self._refs, self._maps = list(self._held.values()), {}, {}, {}
            self._idle.clear()
        for h in held:
            h.close()
        lease, self._pin = self._pin, None
        if lease is not None:
            lease.release()
        if self.cache.user is not None:
            self.cache.user.close()
            self.cache.user = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __getstate__(self):
        return {"url": self.url, "checksum": self.checksum, "version": self.version, "cache_dir": str(self.cache.root),
                "cache_limit": self.cache.limit, "retry_seconds": self.retry_seconds}

    def __setstate__(self, state):
        """A spawned DataLoader worker re-opens the same version (from the local mirror, no network needed);
        a failure is raised at its first read (see Storage.__setstate__)."""
        try:
            rec, root, store, cache, _ = _opened(state["url"], None, None, state["cache_dir"], state["cache_limit"],
                                                 state["retry_seconds"], offline_version=state["version"])
            if rec["manifest"].checksum() != state["checksum"]:
                raise CorruptDatasetError(f"{state['url']}: version {state['version']} is not the one the parent "
                                          f"opened; open it again")
            self.__init__(root, store, cache, rec["manifest"], state["retry_seconds"])
        except DscError as e:  # raised at the first read (Storage.dir), where DataLoader shows it
            self.url = self.root = state["url"]
            self.checksum, self.version, self._failed, self._maps = state["checksum"], state["version"], e, {}


def _local_processes() -> int:
    """The processes of this node that share the cache (torchrun sets LOCAL_WORLD_SIZE)."""
    try:
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", 1)))
    except ValueError:
        return 1


# ----------------------------------------------------------------------------- dsc cache / verify
def warm(url: str, cache_dir=None, cache_limit=None, version: int | None = None, tag: str | None = None,
         progress: bool = True) -> dict:
    """Download a version's shards into the cache ahead of training (``dsc cache warm``): as many as
    ``cache_limit`` holds, in shard order. Returns {"shards", "downloaded", "cached", "bytes", "left_out"}."""
    rec, storage = open_remote(url, version, tag, cache_dir, cache_limit)
    cache = storage.cache
    specs = list(storage.specs.values())
    todo, room = [], cache.limit
    for s in specs:
        if room is not None and s.nbytes > room:
            break
        todo.append(s)
        room = None if room is None else room - s.nbytes
    counts = {"shards": len(specs), "downloaded": 0, "cached": 0, "bytes": 0, "left_out": len(specs) - len(todo)}
    lock = threading.Lock()

    def one(spec):
        held = storage.hold(spec)
        held.close()
        with lock:  # (a shard another process downloaded meanwhile counts as cached: it was not downloaded here)
            counts["downloaded" if held.downloaded else "cached"] += 1
            counts["bytes"] += spec.nbytes if held.downloaded else 0

    with ThreadPoolExecutor(CONNECTIONS) as ex, progress_bar(total=len(todo), unit="shard", desc="warm",
                                                             disable=not progress) as bar:
        for fut in [ex.submit(one, s) for s in todo]:
            fut.result()
            bar.update(1)
    storage.close()
    return counts


def cache_list(cache_dir=None) -> dict:
    """What the cache holds (``dsc cache ls``): {"root", "bytes", "files", "datasets": [{"url", "versions",
    "shards", "cached", "bytes"}]} (counts for the newest version read from each URL)."""
    cache = ShardCache(cache_dir)
    entries = cache.entries(prune=False)
    out = {"root": str(cache.root), "bytes": sum(st.st_size for _, st in entries), "files": len(entries),
           "datasets": []}
    for d in sorted((cache.root / "datasets").iterdir()):
        try:
            url = (d / "url").read_text().strip()
        except OSError:
            continue
        nums = sorted(int(p.stem) for p in (d / versions.LOG).glob("*.json") if p.stem.isdigit())
        item = {"url": url, "versions": nums, "shards": 0, "cached": 0, "bytes": 0}
        if nums:
            try:
                m = versions.read_record(Root(d), nums[-1])["manifest"]
            except DscError:
                m = None
            try:
                specs = L.shard_specs(m) if m is not None else None
            except DscError:  # (a shard table no read of this version fetched yet: none of its shards either)
                specs = None
            if specs is not None:
                have = [s for s in specs if cache.path(s.sha256).is_file()]
                item.update(shards=len(specs), cached=len(have), bytes=sum(s.nbytes for s in have))
        out["datasets"].append(item)
    return out


def cache_check(cache_dir=None) -> tuple[int, int]:
    """Re-hash every cached shard, and every small file kept for a dataset (``datasets/<id>/_dsc/objects/``),
    against its name (``dsc cache verify``); delete those that differ (disk damage after the download) so that
    they are downloaded again: (files checked, files deleted)."""
    cache = ShardCache(cache_dir)
    checked = bad = 0
    objects = [p for d in sorted((cache.root / "datasets").iterdir()) if d.is_dir()
               for p in sorted((d / versions.OBJECTS).glob("*/*")) if not p.name.startswith(".")]
    for p in objects:  # (a small file is read whole at open: its hash is its name, like a shard's)
        try:
            data = p.read_bytes() if p.is_file() and not p.is_symlink() else None
        except OSError:
            data = None
        checked += 1
        if data is None or hashlib.sha256(data).hexdigest() != p.name:
            bad += 1
            p.unlink(missing_ok=True)  # (fetched again from the bucket, checked, at the next open)
    for p, _ in cache.entries(prune=False):
        if p.name.endswith(".part"):
            continue
        h = hashlib.sha256()
        try:  # (never through a link planted there: a link, a FIFO... is damage, removed like wrong bytes)
            fd = os.open(p, os.O_RDONLY | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
            with os.fdopen(fd, "rb") as f:
                if stat.S_ISREG(os.fstat(fd).st_mode):
                    while chunk := f.read(1 << 22):
                        h.update(chunk)
        except FileNotFoundError:
            continue
        except OSError as e:
            if e.errno not in (errno.ELOOP, errno.ENXIO):
                raise
        checked += 1
        if h.hexdigest() != p.name:
            bad += 1
            with cache._space_lock():
                p.unlink(missing_ok=True)  # (a process holding it keeps its mapping; the next one downloads anew)
    return checked, bad


def _cached_shas(d: Path) -> set[str]:
    """The shards of every version whose record the mirror ``d`` holds."""
    shas = set()
    for p in (d / versions.LOG).glob("*.json"):
        if p.stem.isdigit():
            try:
                shas |= {s.sha256 for s in L.shard_specs(versions.read_record(Root(d), int(p.stem))["manifest"])}
            except DscError:
                pass
    return shas


def cache_clear(cache_dir=None, url: str | None = None) -> tuple[int, int, int]:
    """Delete cached shards no process holds (all, or those of ``url``'s versions read here) and the small
    files kept for them: (files removed, bytes freed, files kept because in use)."""
    import shutil

    cache = ShardCache(cache_dir)
    if url is None:
        removed = cache.clear()
        for d in (cache.root / "datasets").iterdir():
            shutil.rmtree(d, ignore_errors=True)
        return removed
    d = cache.root / "datasets" / url_id(url)
    if not d.is_dir():
        raise DatasetNotFoundError(f"the cache {cache.root} holds nothing of {url} (dsc cache ls lists what it holds)")
    others = set()  # shards other cached datasets use too (the cache is content-addressed): kept
    for other in (cache.root / "datasets").iterdir():
        if other != d:
            others |= _cached_shas(other)
    shas = _cached_shas(d) - others
    removed = freed = kept = 0
    with cache._space_lock():
        for sha in shas:
            p = cache.path(sha)
            try:
                size = p.stat().st_size
            except FileNotFoundError:
                continue
            if cache.evict(p):
                removed, freed = removed + 1, freed + size
            else:
                kept += 1
    shutil.rmtree(d, ignore_errors=True)
    return removed, freed, kept
