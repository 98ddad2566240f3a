"""The local shard cache in front of object storage (docs/REMOTE.md): bounded, verified, shared by the
processes of a node.

    CACHE/shards/<sha[:2]>/<sha256>     a downloaded shard, named by its content (its mtime: its last use)
    CACHE/shards/<sha[:2]>/<sha>.<pid>.part    a download in progress (pre-allocated to its full size)
    CACHE/locks/<sha[:2]>/<sha>         per-shard download lock (flock): each shard is downloaded once
    CACHE/.space                        lock taken while space is reserved (usage scan and eviction)
    CACHE/datasets/<id>/                per URL: the version records and small files read at open
    CACHE/users/<pid>-<id>              a process reading through the cache (flock'ed while it lives): what it
                                        needs at once (its largest batch's shards)
    CACHE/queue/<time>-<pid>-<thread>   a download waiting for room: served in arrival order
    CACHE/pressure                      touched by a waiting download: every process lets its idle shards go

* **Named by content.** A shard's file name is its SHA-256 from the manifest, so the same bytes are shared
  by every version and every dataset that reference them, and a cached file can never stand for other
  bytes (a dataset recompiled at the same URL has other hashes). A download is verified against the hash
  before it is renamed into place; a mismatch is fetched once more, then reported naming the URL.
* **Bounded.** ``limit`` bytes cover every file under ``shards/``, downloads in progress included (they
  are pre-allocated, so a full disk shows before the download, as :class:`~dsc.errors.CacheFullError`).
  To make room, the least recently used shards that no process holds are deleted.
* **Shared.** A process holds a shard it is reading with a shared flock on the open file; eviction takes
  an exclusive non-blocking flock before it unlinks, so a held shard is never evicted. A shard is mapped
  from the file the process holds, never from a partial file (those have other names).
* **Fair.** Every process reading through the cache is a *user* (a file it keeps flock'ed) declaring what it
  needs at once; each gets an equal share of the limit (``share()``), and when the users' needs together do
  not fit, the next epoch fails at once naming ``cache_limit`` and the needs. A download that finds no room
  waits its turn (arrival order) and asks every process to let its idle shards go.
"""
from __future__ import annotations

import errno
import fcntl
import os
import re
import stat
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..errors import CacheFullError, ConfigError, CorruptDatasetError
from ..store import Sha256Sink, default_cache_dir
from ..store.local import try_exclusive

_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([kmgtp]?i?b?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 10 ** 3, "kb": 10 ** 3, "m": 10 ** 6, "mb": 10 ** 6, "g": 10 ** 9, "gb": 10 ** 9,
          "t": 10 ** 12, "tb": 10 ** 12, "p": 10 ** 15, "pb": 10 ** 15, "kib": 2 ** 10, "mib": 2 ** 20,
          "gib": 2 ** 30, "tib": 2 ** 40, "pib": 2 ** 50, "ki": 2 ** 10, "mi": 2 ** 20, "gi": 2 ** 30, "ti": 2 ** 40}
_SHA = re.compile(r"^[0-9a-f]{64}$")
_READ_ONLY = (errno.EROFS, errno.EACCES, errno.EPERM)  # a cache this process cannot write
WAIT_SECONDS = 60.0  # how long a download waits for space that held shards take (a batch holds its shards for ms)


def parse_size(v, what: str = "cache_limit (--cache-limit)", allow_zero: bool = False) -> int | None:
    """A size: None (unbounded), bytes as an int, or text such as ``"200GB"``, ``"512MiB"``; errors name ``what``.
    ``allow_zero``: 0 is a size too (a cache of none)."""
    if v is None:
        return None
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        if v == 0 and allow_zero:
            return 0
        if v <= 0:
            raise ConfigError(f"{what} must be positive, got {v!r}")
        return int(v)
    m = _SIZE.match(v) if isinstance(v, str) else None
    if m is None or (m.group(2) or "").lower() not in _UNITS:
        raise ConfigError(f"{what} must be a size such as 200GB, 512MiB or a number of bytes, got {v!r}")
    n = int(float(m.group(1)) * _UNITS[(m.group(2) or "").lower()])
    if n == 0 and allow_zero and float(m.group(1)) == 0:
        return 0
    if n <= 0:
        raise ConfigError(f"{what} must be positive, got {v!r}")
    return n


@dataclass
class Held:
    """A shard this process holds: an open descriptor with a shared flock (released by ``close``)."""

    sha256: str
    path: Path
    fd: int
    nbytes: int
    downloaded: bool = False  # this call downloaded it (else it was in the cache)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def held_file(d: Path, name: str, lock: int, data: bytes = b"") -> tuple[int, Path]:
    """(fd, path) of a new file ``d/name`` holding ``data``, flock'ed (``lock``) while this process keeps ``fd``
    open: a process's mark in a shared folder. Made and locked under a private name first, so a scan never
    sees it unlocked."""
    tmp = d / f".{name}.tmp"
    fd = os.open(tmp, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC | _NOFOLLOW, 0o644)
    fcntl.flock(fd, lock)
    os.pwrite(fd, data, 0)
    os.rename(tmp, d / name)
    return fd, d / name


def live_holder(path: str) -> int | None:
    """An open descriptor of the mark ``path`` (see :func:`held_file`) while its process holds it; None when
    it is gone or its process is (whatever its process id became since): a dead one's mark is removed."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | _NOFOLLOW)
    except OSError:
        return None
    taken = try_exclusive(fd)
    if taken is False:
        return fd
    if taken is None:  # cannot tell: not counted as a live one
        os.close(fd)
        return None
    try:
        Path(path).unlink(missing_ok=True)  # (under its lock: nobody takes it for a live one meanwhile)
    except OSError:  # (another user's mark in a shared folder it may not remove: dead all the same)
        pass
    finally:
        os.close(fd)
    return None


class CacheUser:
    """This process as a user of the cache (see the module docstring): a file ``users/<pid>-<id>`` holding
    what it needs at once, flock'ed while the process lives (a dead process's file is unlocked: ignored and
    removed). ``need(n)`` declares the bytes its coming epoch needs at once."""

    def __init__(self, root: Path):
        import secrets

        d = root / "users"
        d.mkdir(parents=True, exist_ok=True)
        self.fd, self.path = held_file(d, f"{os.getpid()}-{secrets.token_hex(4)}", fcntl.LOCK_SH, b"0")

    def need(self, nbytes: int) -> None:
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, str(int(nbytes)).encode(), 0)

    def close(self) -> None:
        fd, self.fd = self.fd, None
        if fd is not None:
            try:
                self.path.unlink()
            except FileNotFoundError:
                pass
            os.close(fd)

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass


def cache_users(root: Path) -> list[int]:
    """What every live user of the cache at ``root`` needs at once (bytes; 0: not declared)."""
    out = []
    d = root / "users"
    for e in os.scandir(d) if d.is_dir() else ():
        fd = None if e.name.startswith(".") else live_holder(e.path)
        if fd is None:
            continue
        try:
            try:
                out.append(int(os.pread(fd, 32, 0) or b"0"))
            except ValueError:
                out.append(0)
        finally:
            os.close(fd)
    return out


class ShardCache:
    """A cache directory and its byte limit (``None``: unbounded)."""

    def __init__(self, root: str | os.PathLike | None = None, limit=None):
        self.root = Path(root) if root is not None else default_cache_dir()
        self.limit = parse_size(limit, allow_zero=True)  # (0: no shard is cached; a Loader reads by ranges)
        self.readonly = False  # a cache warmed elsewhere, mounted read-only: it serves what it holds
        try:
            for d in ("shards", "locks", "datasets"):
                (self.root / d).mkdir(parents=True, exist_ok=True)
        except OSError as e:
            if not (e.errno in _READ_ONLY and (self.root / "shards").is_dir()):
                raise CacheFullError(f"cannot use the cache directory {self.root}: {e.strerror}; give cache_dir= "
                                     f"(--cache-dir) or $DSC_CACHE_DIR a writable folder") from None
            self.readonly = True
        self.readonly = self.readonly or not os.access(self.root / "shards", os.W_OK)
        self.downloads = 0  # shards this object downloaded (tests and `dsc cache warm` report it)
        self._count_lock = threading.Lock()
        self.user: CacheUser | None = None

    def join(self) -> CacheUser:
        """This process as a user of the cache (made once; a read-only cache has no users to share it with)."""
        if self.user is None:
            try:
                self.user = CacheUser(self.root)
            except OSError as e:
                if e.errno not in _READ_ONLY:
                    raise
                self.readonly = True
                self.user = _Unlisted()
        return self.user

    def users(self) -> int:
        """How many live processes read through the cache (this one at least)."""
        return max(1, len(cache_users(self.root)))

    def share(self, local_processes: int = 1) -> int | None:
        """This process's share of the limit: an equal part for each live user (or each of the node's
        ``local_processes``, if more)."""
        if self.limit is None:
            return None
        return self.limit // max(self.users(), local_processes)

    def check_needs(self, mine: int) -> None:
        """Declare that this process needs ``mine`` bytes at once; fail at once when the users' needs together
        exceed the limit (they would wait on each other until one gives up)."""
        self.join().need(mine)
        if self.limit is None:
            return
        needs = cache_users(self.root)
        if sum(needs) > self.limit:
            raise CacheFullError(
                f"cache_limit {self.limit:,} bytes (--cache-limit) of {self.root} is smaller than what the "
                f"{len(needs)} processes reading through it need at once: {' + '.join(f'{n:,}' for n in needs)} = "
                f"{sum(needs):,} bytes (each its largest batch's shards). Raise cache_limit, give each process a "
                f"cache_dir of its own, or read fewer shards per batch (quasi_random with a smaller window, or a "
                f"smaller batch_size)")

    def pressure(self) -> float:
        """When a download last found no room (0 if never): processes then let their idle shards go."""
        try:
            return os.stat(self.root / "pressure").st_mtime
        except FileNotFoundError:
            return 0.0

    def path(self, sha256: str) -> Path:
        if not _SHA.match(sha256):
            raise CorruptDatasetError(f"{sha256!r} is not a shard's SHA-256")
        return self.root / "shards" / sha256[:2] / sha256

    # ------------------------------------------------------------------ holding
    def try_hold(self, sha256: str, nbytes: int | None = None) -> Held | None:
        """Hold the cached shard if it is there (touching its last use), else None. What is at its name but cannot
        be its bytes (a symbolic link or another kind of file, or a file of another size than ``nbytes``: damage
        on the cache's disk) is the cache's fault, not the dataset's: it is removed (the shard is downloaded
        again) where the cache can be written, else reported naming the cache."""
        p = self.path(sha256)
        try:
            fd = os.open(p, os.O_RDONLY | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
        except FileNotFoundError:
            return None
        except OSError as e:
            if e.errno not in (errno.ELOOP, errno.ENXIO, errno.EISDIR):
                raise
            return self._damaged(p, "a symbolic link or not a regular file")
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            return self._damaged(p, "not a regular file")
        fcntl.flock(fd, fcntl.LOCK_SH)  # an evictor holds it exclusively only while it unlinks
        st = os.fstat(fd)
        if st.st_nlink == 0:  # evicted between the open and the lock
            os.close(fd)
            return None
        if nbytes is not None and st.st_size != nbytes:
            os.close(fd)
            return self._damaged(p, f"{st.st_size:,} bytes where the shard has {nbytes:,}")
        try:
            os.utime(fd)
        except OSError:
            pass
        return Held(sha256, p, fd, st.st_size)

    def _damaged(self, p: Path, why: str) -> None:
        """The cached file ``p`` cannot be its shard (``why``): removed, so that the shard is downloaded again
        (None: not held); in a read-only cache, an error naming the cache and the fix."""
        try:
            with self._space_lock():
                if os.path.isdir(p) and not os.path.islink(p):
                    os.rmdir(p)
                else:
                    os.unlink(p)
        except FileNotFoundError:
            pass
        except OSError as e:
            raise CacheFullError(f"{p} in the shard cache is damaged ({why}) and cannot be removed ({e.strerror}): "
                                 f"`dsc cache verify --cache-dir {self.root}` where the cache is writable, or give "
                                 f"another cache_dir (--cache-dir)") from None
        import warnings

        warnings.warn(f"{p} in the shard cache was damaged ({why}): removed, the shard is downloaded again",
                      RuntimeWarning, stacklevel=3)
        return None

    def hold(self, sha256: str, nbytes: int, fetch: Callable, what: str, on_full: Callable | None = None) -> Held:
        """The shard ``sha256`` held, downloading it first when the cache lacks it (once across processes).

        ``fetch(f, on_chunk)`` streams the shard's bytes into the open file ``f``; ``what`` (its URL) names
        it in errors; ``on_full()`` is asked to let go of shards the caller holds but does not need when the
        cache has no room (it returns the bytes it let go)."""
        held = self.try_hold(sha256, nbytes)
        if held is not None:
            return held
        lock = self.root / "locks" / sha256[:2] / sha256
        try:
            lock.parent.mkdir(parents=True, exist_ok=True)
            lfd = os.open(lock, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o666)
        except OSError as e:
            if e.errno not in _READ_ONLY:
                raise
            raise CacheFullError(f"{what} is not in the cache {self.root}, which cannot be written ({e.strerror}): a "
                                 f"read-only cache serves the shards it holds (`dsc cache warm` the version where the "
                                 f"cache is writable), or give a writable cache_dir (--cache-dir)") from None
        try:
            fcntl.flock(lfd, fcntl.LOCK_EX)  # another process downloading it: wait, then use its file
            held = self.try_hold(sha256, nbytes)
            if held is not None:
                return held
            return self._download(sha256, nbytes, fetch, what, on_full)
        finally:
            os.close(lfd)

    def _download(self, sha256: str, nbytes: int, fetch: Callable, what: str, on_full=None) -> Held:
        final = self.path(sha256)
        final.parent.mkdir(parents=True, exist_ok=True)
        part = final.with_name(f"{sha256}.{os.getpid()}.{threading.get_ident()}.part")
        fd = self._reserve(part, nbytes, what, on_full)
        try:
            for attempt in (1, 2):
                h = Sha256Sink()
                with os.fdopen(os.dup(fd), "r+b") as f:
                    n = fetch(f, h)
                    f.flush()
                if n == nbytes and h.hexdigest() == sha256:
                    break
                if attempt == 2:
                    raise CorruptDatasetError(
                        f"{what}: downloaded twice and both times its bytes do not match the manifest ({n:,} bytes, "
                        f"sha256 {h.hexdigest()[:16]}..., expected {nbytes:,} bytes, {sha256[:16]}...); the shard in "
                        f"object storage is damaged or was replaced: `dsc verify URL` lists every damaged file; "
                        f"`dsc restore` an intact version, or compile again to a new URL")
            os.fsync(fd)  # the name must never stand for bytes a crash could lose (pre-allocated blocks read as zeros)
            with self._space_lock():  # (a usage scan never sees the file under both names, nor the .part unlocked
                fcntl.flock(fd, fcntl.LOCK_SH)  # while its exclusive flock, the live download's, becomes a reader's)
                os.rename(part, final)  # atomic: the name appears with complete, verified bytes
            with self._count_lock:
                self.downloads += 1
            return Held(sha256, final, fd, nbytes, downloaded=True)
        except BaseException:
            os.close(fd)
            try:
                part.unlink()
            except FileNotFoundError:
                pass
            raise

    # ------------------------------------------------------------------ space
    def _reserve(self, part: Path, nbytes: int, what: str, on_full=None) -> int:
        """Create ``part`` pre-allocated to ``nbytes`` once the limit has room for it (evicting least recently
        used unheld shards; waiting while other processes hold the rest)."""
        if self.limit is not None and nbytes > self.limit:
            raise CacheFullError(f"{what} has {nbytes:,} bytes, more than the whole cache_limit ({self.limit:,}); "
                                 f"raise cache_limit (--cache-limit)")
        deadline = time.monotonic() + WAIT_SECONDS
        ticket = None
        try:
            while True:
                if self.limit is not None and ticket is not None and not self._first(ticket):
                    time.sleep(0.02)  # an earlier waiter is served first
                    if time.monotonic() > deadline:
                        raise self._full(what, nbytes)
                    continue
                fd = self._try_reserve(part, nbytes, what)
                if fd is not None:
                    return fd
                if ticket is None:  # no room: wait in line, and ask every process for its idle shards
                    ticket = self._queue()
                (self.root / "pressure").touch()
                if on_full is not None and on_full():
                    continue  # the caller let idle shards go: try again at once
                if time.monotonic() > deadline:
                    raise self._full(what, nbytes)
                time.sleep(0.05)
        finally:
            if ticket is not None:
                ticket.close()

    def _full(self, what: str, nbytes: int) -> CacheFullError:
        return CacheFullError(f"no room in the cache {self.root} for {what} ({nbytes:,} bytes) within "
                              f"cache_limit {self.limit:,}: every cached shard stayed in use for "
                              f"{WAIT_SECONDS:.0f} s, by other processes or by samples this one keeps (ds[i] "
                              f"and a DataLoader's samples are views of their shard: .clone() the ones you keep). "
                              f"Raise cache_limit (--cache-limit)")

    def _queue(self) -> "_Ticket":
        return _Ticket(self.root / "queue")

    def _first(self, ticket: "_Ticket") -> bool:
        """Whether ``ticket`` is the oldest live waiter's. A waiter holds a flock on its ticket: one nobody
        holds is a dead process's (whatever its process id became since), and is removed."""
        for e in sorted(os.scandir(self.root / "queue"), key=lambda e: e.name):
            if e.name == ticket.path.name:
                return True
            fd = None if e.name.startswith(".") else live_holder(e.path)
            if fd is not None:
                os.close(fd)
                return False  # a live waiter ahead
        return True

    def _try_reserve(self, part: Path, nbytes: int, what: str) -> int | None:
        """``part`` created and pre-allocated if the limit has room for it now (evicting unheld shards), else
        None."""
        with self._space_lock():
            if self.limit is None or self._make_room(nbytes):
                fd = os.open(part, os.O_CREAT | os.O_RDWR | os.O_TRUNC | os.O_CLOEXEC, 0o644)
                fcntl.flock(fd, fcntl.LOCK_EX)  # a download in progress: live while locked (under the space lock,
                try:                            # where scans remove unlocked ones: never seen unlocked before this)
                    if nbytes:
                        os.posix_fallocate(fd, 0, nbytes)
                except OSError as e:
                    os.close(fd)
                    part.unlink(missing_ok=True)
                    if e.errno in (errno.ENOSPC, errno.EDQUOT):
                        raise CacheFullError(
                            f"the cache disk is full: no room for {what} ({nbytes:,} bytes) in {self.root}; free "
                            f"space there, lower cache_limit (--cache-limit) below the free space, or give "
                            f"another cache_dir (--cache-dir)") \
                            from None
                    if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                        raise
                    fd = os.open(part, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
                    fcntl.flock(fd, fcntl.LOCK_EX)
                    os.ftruncate(fd, nbytes)
                return fd
        return None

    def _space_lock(self):
        return _FileLock(self.root / ".space")

    def entries(self, prune: bool = True) -> list[tuple[Path, os.stat_result]]:
        """Every file under ``shards/``. ``prune`` (the caller holds the space lock): partial downloads that no
        process is making are removed on the way. A download in progress holds its ``.part`` file flock'ed: a
        lock dies with its process, whatever that process's id becomes (a container restarted reuses pid 1),
        so a leftover never pins cache space."""
        out = []
        base = self.root / "shards"
        for sub in os.scandir(base) if base.is_dir() else ():
            if not sub.is_dir(follow_symlinks=False):
                continue
            for e in os.scandir(sub.path):
                if prune and e.name.endswith(".part") and not _downloading(e.path):
                    Path(e.path).unlink(missing_ok=True)
                    continue
                try:
                    out.append((Path(e.path), e.stat(follow_symlinks=False)))
                except FileNotFoundError:
                    pass
        return out

    def usage(self) -> int:
        """Bytes under ``shards/`` now (under the space lock: a consistent count, never mid-eviction)."""
        with self._space_lock():
            return sum(st.st_size for _, st in self.entries())

    def _make_room(self, nbytes: int) -> bool:
        """Under the space lock: evict until ``nbytes`` more fit in the limit; False if held shards prevent it."""
        entries = self.entries()
        used = sum(st.st_size for _, st in entries)
        if used + nbytes <= self.limit:
            return True
        done = [(p, st) for p, st in entries if not p.name.endswith(".part")]
        done.sort(key=lambda e: e[1].st_mtime_ns)
        for p, st in done:
            if self.evict(p):
                used -= st.st_size
                if used + nbytes <= self.limit:
                    return True
        return False

    def evict(self, p: Path) -> bool:
        """Delete the cached shard ``p`` unless a process holds it."""
        try:
            fd = os.open(p, os.O_RDONLY | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
        except FileNotFoundError:
            return True
        except OSError as e:  # a link (or a FIFO...) planted among the shards: no process holds it; it goes
            if e.errno not in (errno.ELOOP, errno.ENXIO, errno.EISDIR):
                raise
            try:
                os.rmdir(p) if e.errno == errno.EISDIR else os.unlink(p)
            except OSError:
                return False
            return True
        taken = try_exclusive(fd)
        if not taken:  # (held; or flock cannot tell: kept, as if held)
            os.close(fd)
            return False
        try:
            p.unlink(missing_ok=True)
        finally:
            os.close(fd)
        return True

    def clear(self) -> tuple[int, int, int]:
        """Delete every shard no process holds: (files removed, bytes freed, files kept because held)."""
        removed = freed = kept = 0
        with self._space_lock():
            for p, st in self.entries():
                if p.name.endswith(".part"):
                    kept += 1
                elif self.evict(p):
                    removed, freed = removed + 1, freed + st.st_size
                else:
                    kept += 1
        return removed, freed, kept


def _downloading(path: str) -> bool:
    """Whether a process is writing the partial download ``path`` (it holds the file flock'ed)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | _NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return False
    try:
        return try_exclusive(fd) is False
    finally:
        os.close(fd)


class _Unlisted:
    """This process in a cache it cannot write (read-only): not listed among the users, nothing to declare."""

    def need(self, nbytes: int) -> None:
        pass

    def close(self) -> None:
        pass


class _Ticket:
    """A download's place in the line for room (``queue/<time>-<pid>-<thread>``), flock'ed while it waits."""

    def __init__(self, d: Path):
        d.mkdir(exist_ok=True)
        self.fd, self.path = held_file(d, f"{time.time_ns():020d}-{os.getpid()}-{threading.get_ident()}",
                                       fcntl.LOCK_EX)

    def close(self) -> None:
        self.path.unlink(missing_ok=True)
        os.close(self.fd)


class _FileLock:
    def __init__(self, path: Path):
        self.path = path

    def __enter__(self):
        self.fd = os.open(self.path, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o666)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        os.close(self.fd)
