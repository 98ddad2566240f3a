"""A dataset in a local folder: :class:`LocalStore`, and how it reads and writes files safely.

Reading: every file is opened relative to the dataset directory as it was when it was opened, one path
component at a time, never through a symbolic link.

* **One dataset, whatever happens to the path.** ``Root(path)`` holds a descriptor of the directory. A
  compile that replaces the dataset (``--overwrite`` swaps a new directory in) does not change what the
  handle reads: files still to be read come from the directory it opened; if that directory has been
  deleted meanwhile, reading fails with a clear error. A handle never mixes two compiles.
* **No links.** Metadata names files by plain relative paths (``check_node_path``), and each component is
  opened with ``O_NOFOLLOW``: a symbolic link anywhere inside the dataset is refused, so a dataset cannot
  make dsc read outside it. Only regular files are read (a FIFO named like a shard cannot block a reader).
"""
from __future__ import annotations

import ctypes
import errno
import fcntl
import hashlib
import mmap
import os
import stat
import sys
from pathlib import Path, PurePath

import numpy as np

from ..errors import (CompileLockedError, CorruptDatasetError, DatasetNotFoundError, DscError, TooManyOpenFilesError,
                      UnsafePathError, WriteError)
from .base import FileReads, MissingFile, Store
from .paths import check_node_path

_DIR = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)  # Linux >= 5.14
_libc = None


def madvise(address: int, length: int, advice: int) -> bool | None:
    """``madvise(2)`` through the C library, the GIL released for the call (a ctypes.CDLL function releases it;
    ``mmap.mmap.madvise`` holds it: a populate that reads a cold shard from disk, tens of ms, stopped every other
    thread of the process, the Loader's fillers and the training loop included). True: done; False: the
    kernel refused (``ctypes.get_errno()`` says why); None: no C library to call (not Linux)."""
    global _libc
    if _libc is None:
        try:
            if not sys.platform.startswith("linux"):
                raise OSError("not Linux")
            lib = ctypes.CDLL(None, use_errno=True)
            lib.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
            _libc = lib
        except (OSError, AttributeError):
            _libc = False
    if _libc is False:
        return None
    return _libc.madvise(address, length, advice) == 0


_Missing = MissingFile  # the file is not there (as opposed to there but unsafe or unreadable)


class Root(FileReads):
    """A dataset directory, opened once (see the module docstring). ``expected``: {path: bytes} the
    manifest records (its ``files``); a file read whole must have that size, so a damaged or swapped
    one is refused before its bytes are read, whatever its size."""

    expected: dict | None = None
    redirect: dict | None = None  # {path: where its bytes are}: a version's small files in _dsc/objects

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        try:
            self.fd = os.open(self.path, _DIR)
        except FileNotFoundError:
            raise DatasetNotFoundError(f"{self.path}: no such dataset directory (compile one with `dsc compile`)") \
                from None
        except NotADirectoryError:
            raise DatasetNotFoundError(f"{self.path} is not a directory, so not a dsc dataset") from None
        except OSError as e:
            raise DatasetNotFoundError(f"{self.path}: cannot open the dataset directory ({e.strerror})") from None

    def __del__(self):
        fd = getattr(self, "fd", None)
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass

    def __getstate__(self):  # a process that unpickles a handle opens the path again
        return {"path": self.path}

    def __setstate__(self, state):
        self.__init__(state["path"])

    def __truediv__(self, rel: str) -> Path:  # for messages
        return self.path / rel

    def _open(self, rel: str) -> int:
        """A descriptor of the regular file ``rel`` (plain components, no links)."""
        target = self.redirect.get(rel, rel) if self.redirect else rel
        parts = check_node_path(target).split("/")
        dfd, opened = self.fd, []
        try:
            for part in parts[:-1]:
                dfd = os.open(part, _DIR | _NOFOLLOW, dir_fd=dfd)
                opened.append(dfd)
            fd = os.open(parts[-1], os.O_RDONLY | _NOFOLLOW | getattr(os, "O_NONBLOCK", 0) | os.O_CLOEXEC, dir_fd=dfd)
        except FileNotFoundError:
            gone = " (the dataset directory was deleted or replaced since it was opened: open it again)" \
                if os.fstat(self.fd).st_nlink == 0 else "; the dataset is incomplete or damaged. Recompile it"
            what = f"{self.path / rel}" if target == rel else f"{self.path / rel} (version content {target})"
            raise _Missing(f"{what} is missing{gone}") from None
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.ENOTDIR, getattr(errno, "EMLINK", -1)):
                raise UnsafePathError(f"{self.path / rel}: a symbolic link (or not a directory) inside the dataset; "
                                      f"dsc does not follow links inside a dataset") from None
            if e.errno in (errno.EMFILE, errno.ENFILE):
                raise TooManyOpenFilesError(f"{self.path / rel}: cannot open: this process has as many files open "
                                            f"as its limit allows (ulimit -n); raise the limit, or open fewer "
                                            f"datasets and loaders at once") from None
            raise CorruptDatasetError(f"{self.path / rel}: cannot open ({e.strerror})") from None
        finally:
            for d in opened:
                os.close(d)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise CorruptDatasetError(f"{self.path / rel} is not a regular file")
        os.set_blocking(fd, True)
        return fd

    def open_dir(self, rel: str) -> int:
        """A descriptor of the directory ``rel`` (plain components, no links); FileNotFoundError if absent."""
        dfd = self.fd
        opened = []
        try:
            for part in check_node_path(rel).split("/"):
                dfd = os.open(part, _DIR | _NOFOLLOW, dir_fd=dfd)
                opened.append(dfd)
        except FileNotFoundError:
            for d in opened:
                os.close(d)
            raise
        except OSError as e:
            for d in opened:
                os.close(d)
            raise UnsafePathError(f"{self.path / rel}: not a plain directory inside the dataset ({e.strerror})") \
                from None
        for d in opened[:-1]:
            os.close(d)
        return opened[-1]

    def open(self, rel: str):
        """The file ``rel`` to read (a binary file object; see ``_open``)."""
        return os.fdopen(self._open(rel), "rb")

    def size(self, rel: str) -> int:
        fd = self._open(rel)
        try:
            return os.fstat(fd).st_size
        finally:
            os.close(fd)

    def exists(self, rel: str) -> bool:
        """Whether ``rel`` is there; a link, a FIFO or an unreadable entry is an error, not an absence."""
        try:
            self.size(rel)
        except _Missing:
            return False
        return True

    def read(self, rel: str, limit: int | None = None) -> bytearray:
        """The whole file, in a writable buffer (refused past ``limit`` bytes)."""
        fd = self._open(rel)
        try:
            size = os.fstat(fd).st_size
            want = self.expected.get(rel) if self.expected else None
            if want is not None and size != want:
                raise CorruptDatasetError(f"{self.path / rel} has {size:,} bytes, the manifest records {want:,}; the "
                                          f"dataset is damaged (dsc verify lists every problem). Recompile it")
            if limit is not None and size > limit:
                raise CorruptDatasetError(f"{self.path / rel} has {size:,} bytes, more than the {limit:,} its kind may "
                                          f"have; the dataset is damaged")
            buf = bytearray(size)
            with os.fdopen(fd, "rb", closefd=False) as f:
                n = f.readinto(buf)
            if n != size:
                raise CorruptDatasetError(f"{self.path / rel} changed size while being read")
            return buf
        finally:
            os.close(fd)

    def sha256(self, rel: str) -> str:
        h = hashlib.sha256()
        fd = self._open(rel)
        try:
            with os.fdopen(fd, "rb", closefd=False) as f:
                while chunk := f.read(1 << 22):
                    h.update(chunk)
        finally:
            os.close(fd)
        return h.hexdigest()

    def open_file(self, rel: str) -> int:
        """A descriptor of the regular file ``rel``, read-only (plain components, no links); the caller closes it."""
        return self._open(rel)

    def map(self, rel: str, nbytes: int, populate: bool = True) -> np.ndarray:
        """The first ``nbytes`` of a file as a flat uint8 array, memory-mapped privately (see runtime/storage)."""
        if nbytes == 0:
            return np.zeros(0, np.uint8)
        fd = self._open(rel)
        try:
            return map_fd(fd, nbytes, self.path / rel, populate)
        finally:
            os.close(fd)


def map_fd(fd: int, nbytes: int, name, populate: bool = True) -> np.ndarray:
    """The first ``nbytes`` of the open file ``fd`` as a flat uint8 array: a private (copy-on-write) mapping
    whose page tables are filled up front (``populate``: the whole range is read in now, in large reads);
    the array keeps the mapping alive (the descriptor may close)."""
    if nbytes == 0:
        return np.zeros(0, np.uint8)
    if os.fstat(fd).st_size < nbytes:
        raise CorruptDatasetError(f"{name} is shorter than the {nbytes} bytes the manifest says")
    mm = mmap.mmap(fd, nbytes, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    a = np.frombuffer(mm, dtype=np.uint8)
    if populate:  # (the GIL released while the kernel reads: see madvise)
        done = madvise(a.ctypes.data, nbytes, MADV_POPULATE_READ)
        if done is False:  # (a kernel before 5.14: read-ahead asked for instead)
            madvise(a.ctypes.data, nbytes, mmap.MADV_WILLNEED)
        elif done is None and hasattr(mmap, "MADV_WILLNEED"):  # (not Linux: no populate there; read-ahead)
            mm.madvise(mmap.MADV_WILLNEED)
    return a


def as_root(root):
    """An open folder (or a store's files: anything that reads like a Root) as it is; a path opened."""
    return root if hasattr(root, "read") and not isinstance(root, (str, os.PathLike)) else Root(root)


# ----------------------------------------------------------------------------- writing
# Every file dsc writes beside or inside a dataset (shards, metadata, journal, records, tags, the view) is
# written here: a private temporary name created with O_EXCL | O_NOFOLLOW (a link planted there is never
# followed), flushed when asked, then renamed into place (a rename replaces a link, never writes through
# it). Below ``base`` (the dataset or staging folder) every folder is opened one component at a time
# without following links, so nothing planted inside a dataset can make dsc write outside it.
_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def open_lock_file(path, what: str, fix: str = "", dir_fd: int | None = None, shown: Path | None = None,
                   mode: int = 0o644, one_name: bool = False) -> int:
    """A descriptor of the file to flock at ``path`` (a name in ``dir_fd`` when given; ``shown`` in messages),
    made if missing; never opened through a link (one planted there would have dsc truncate its target) and
    only a plain file (not a FIFO, a device, a folder; with ``one_name``, not a hard link to another file
    either): else ``not_ours`` naming ``what``. Other failures are the OSError."""
    shown = shown or Path(path)
    try:
        fd = os.open(path, os.O_CREAT | os.O_RDWR | _NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode, dir_fd=dir_fd)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
            raise not_ours(shown, what, fix) from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or (one_name and st.st_nlink > 1):
        os.close(fd)
        raise not_ours(shown, what, fix)
    return fd


def not_ours(path, what: str, fix: str = "") -> UnsafePathError:
    """The one message for an entry dsc would write or lock through that is not what dsc made there."""
    try:
        st = os.lstat(path)
        kind = ("a symbolic link" if stat.S_ISLNK(st.st_mode) else "a folder" if stat.S_ISDIR(st.st_mode)
                else "not a regular file" if not stat.S_ISREG(st.st_mode)
                else f"a file with {st.st_nlink} names (hard links)" if st.st_nlink > 1 else "a file")
    except OSError:
        kind = "not what dsc made there"
    return UnsafePathError(f"{path} is {kind}, not {what}; dsc does not write through links or into what it did not "
                           f"make. {fix or 'Remove it'}, then run again")


def refuse_links(folder: Path, where: str) -> None:
    """Refuse a folder dsc will write into again (a staging folder, an update's journal) that holds a symbolic
    link: ``where`` completes the message ("in dsc's staging folder; remove it...")."""
    for dirpath, dirnames, filenames in os.walk(folder):  # os.walk never descends into a link
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            if os.path.islink(p):
                raise UnsafePathError(f"{p} is a symbolic link {where}")


def open_folder(path: Path, base: Path | None = None, create: bool = True, keep: bool = False) -> int:
    """A descriptor of the folder ``path``: below ``base``, each component opened without following links (and
    made when missing, if ``create``); ``base`` itself, or ``path`` without a base, as the caller names it.

    ``keep`` (a compile's shard files, each in folders of its own: ``image/c/<s>/0/0``): the folder above the
    first one this walk makes stays open (:class:`_Kept`), and the next walk below it starts there, making its
    folders without first looking for them (3 opens, 3 closes and a failed open less a shard file)."""
    rel = _below(path, base) if base is not None else ()
    return _open_below(base if base is not None else path, rel, create, keep)


def _open_below(base, rel: tuple[str, ...], create: bool = True, keep: bool = False) -> int:
    """:func:`open_folder` of the components ``rel`` below ``base`` (``base`` itself when there are none)."""
    fd, k0, made = _KEPT.start(base, rel) if keep and rel else (None, 0, False)
    if fd is None:
        top = base
        try:  # (opened first, made only when missing: a stat before each open cost a syscall per shard file)
            fd = os.open(top, _DIR)
        except FileNotFoundError:
            if not create:
                raise
            Path(top).mkdir(parents=True, exist_ok=True)
            fd = os.open(top, _DIR)
    # made: a folder made here, so the ones below it are new too (made, not first looked for)
    try:
        for k in range(k0, len(rel)):
            part = rel[k]
            try:
                try:
                    if made:
                        raise FileNotFoundError(part)
                    nfd = os.open(part, _DIR | _NOFOLLOW, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise
                    try:
                        os.mkdir(part, 0o777, dir_fd=fd)
                        if keep and not made and k > 0:  # (the folder above the first one made: kept open)
                            made = True
                            nfd = os.open(part, _DIR | _NOFOLLOW, dir_fd=fd)
                            _KEPT.keep(base, rel[:k], fd)
                            fd = nfd
                            continue
                        made = True
                    except FileExistsError:
                        pass
                    nfd = os.open(part, _DIR | _NOFOLLOW, dir_fd=fd)
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise not_ours(Path(base).joinpath(*rel[:k + 1]), "a folder dsc made") from None
                raise
            os.close(fd)
            fd = nfd
    except BaseException:
        os.close(fd)
        raise
    return fd


class _Kept:
    """Folders kept open between walks of :func:`open_folder` with ``keep`` (at most ``AT_MOST``, the oldest
    closed first): {(base, components below it): (descriptor, st_dev, st_ino)}. A kept folder is used only while
    its path still names it (one lstat: a staging folder removed and made again under the same name is not the
    folder kept), and the first step below it is taken under a lock, so no thread walks from a descriptor another
    closes."""

    AT_MOST = 8

    def __init__(self):
        import threading

        self.lock = threading.Lock()
        self.folders: dict[tuple[str, tuple[str, ...]], tuple[int, int, int]] = {}
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=lambda: setattr(self, "lock", threading.Lock()))

    def start(self, base, rel: tuple[str, ...]) -> tuple[int | None, int, bool]:
        """(a descriptor of its own of the folder one below a kept folder that ``rel`` passes through, made there
        if missing; how many components of ``rel`` that is; whether it was made), or (None, 0, False)."""
        b = os.fspath(base)
        with self.lock:
            for (kb, kr), (fd, dev, ino) in self.folders.items():
                n = len(kr)
                if kb != b or n >= len(rel) or rel[:n] != kr:
                    continue
                try:
                    st = os.lstat(os.path.join(b, *kr))
                    ok = (st.st_dev, st.st_ino) == (dev, ino) and stat.S_ISDIR(st.st_mode)
                except OSError:
                    ok = False
                if not ok:
                    del self.folders[(kb, kr)]
                    os.close(fd)
                    return None, 0, False
                try:
                    os.mkdir(rel[n], 0o777, dir_fd=fd)
                    made = True
                except FileExistsError:
                    made = False
                try:
                    nfd = os.open(rel[n], _DIR | _NOFOLLOW, dir_fd=fd)
                except OSError as e:
                    if e.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise not_ours(Path(base).joinpath(*rel[:n + 1]), "a folder dsc made") from None
                    raise
                return nfd, n + 1, made
        return None, 0, False

    def release(self) -> None:
        """Close every kept folder (a writer of a dataset let go of it: no process keeps a published dataset's
        folders open, which would block an unmount, or a removal on some systems; the next walk opens again)."""
        with self.lock:
            while self.folders:
                os.close(self.folders.popitem()[1][0])

    def keep(self, base, rel: tuple[str, ...], fd: int) -> None:
        """Keep ``fd`` (the folder ``rel`` below ``base``; the caller's no longer) open; closed if not kept."""
        key = (os.fspath(base), rel)
        with self.lock:
            if key in self.folders:
                os.close(fd)
                return
            try:
                st = os.fstat(fd)
            except OSError:
                os.close(fd)
                return
            while len(self.folders) >= self.AT_MOST:
                os.close(self.folders.pop(next(iter(self.folders)))[0])
            self.folders[key] = (fd, st.st_dev, st.st_ino)


_KEPT = _Kept()


def _below(path, base) -> tuple[str, ...]:
    """``path``'s components below ``base`` (Path.relative_to's, by string where both are Paths: once per shard
    file a compile writes)."""
    if isinstance(path, PurePath) and isinstance(base, PurePath):
        p, b = os.fspath(path), os.fspath(base)
        if p == b:
            return ()
        if p.startswith(b) and p[len(b):len(b) + 1] == os.sep and b != os.sep:
            return tuple(p[len(b) + 1:].split(os.sep))
    return Path(path).relative_to(base).parts


class NewFile:
    """A file written privately beside its final name ``path``, published by :meth:`commit` (a rename, or with
    ``create_only`` a link that fails when the name exists: put-if-absent). ``base``: see :func:`open_folder`.
    ``link``: a file of dsc's own whose inode becomes the new file (a hard link, nothing written).

    The private name is ``.NAME.tmp``: writers of one dataset hold its lock, and a dead writer's leftover is
    replaced by the next writer of that file. ``unique`` names it after the process and thread instead, for a
    put-if-absent that writers without a working lock may race (each must publish its own bytes).

    ``in_place``: written at its final name, for a file no reader looks for until a later commit names it (a
    shard file in a compile's private staging, or in an update's or a compaction's new slot): no private name
    and no rename (a rename and a file's folder entry a shard; what proves such a file whole is the SHA-256 its
    journal entry or version records, checked on resume). Still created with ``O_EXCL | O_NOFOLLOW``: what is
    there (a crashed writer's torn file, a planted link) is removed, never written through. Its folders are
    walked with :func:`open_folder`'s ``keep``."""

    def __init__(self, path: str | os.PathLike | None, base: Path | None = None, mode: int = 0o644,
                 link: Path | None = None, unique: bool = False, in_place: bool = False, rel: str | None = None):
        """``rel`` (for ``path`` None): the file's path below ``base``, plain names joined by '/' (checked by the
        caller: a shard's), so that no path is built (the writer's hot loop)."""
        import threading

        if rel is not None:
            *folders, self.name = rel.split("/")
            self.path = None
            self.dfd = _open_below(base, tuple(folders), keep=in_place)
        else:
            self.path = path if isinstance(path, Path) else Path(path)
            self.name = self.path.name
            self.dfd = open_folder(self.path.parent, base, keep=in_place)
        self.file = None
        self.in_place = in_place
        self.tmp = self.name if in_place else (
            f".{self.name}" + (f".{os.getpid()}.{threading.get_ident()}" if unique else "") + ".tmp")
        try:
            for attempt in (0, 1):
                try:
                    if link is not None:
                        os.link(link, self.tmp, dst_dir_fd=self.dfd, follow_symlinks=False)
                    else:
                        self.file = RawFile(os.open(self.tmp, _FILE, mode, dir_fd=self.dfd))
                    break
                except FileExistsError:  # a dead writer's leftover (or a link planted there): removed, not followed
                    if attempt:
                        raise
                    os.unlink(self.tmp, dir_fd=self.dfd)
        except BaseException:
            os.close(self.dfd)
            raise

    def write(self, data) -> None:
        self.file.write(data)

    def commit(self, sync: bool = False, create_only: bool = False) -> None:
        try:
            if self.file is not None:
                self.file.flush()
                if sync:
                    os.fsync(self.file.fileno())
                self.file.close()
            if self.in_place:
                self.tmp = None  # (at its name already)
            elif create_only:
                os.link(self.tmp, self.name, src_dir_fd=self.dfd, dst_dir_fd=self.dfd, follow_symlinks=False)
            else:
                os.replace(self.tmp, self.name, src_dir_fd=self.dfd, dst_dir_fd=self.dfd)
                self.tmp = None  # (renamed: nothing left to remove)
            if sync:
                os.fsync(self.dfd)
        finally:
            self.abort()

    def abort(self) -> None:
        if self.dfd is None:
            return
        try:
            if self.file is not None:
                self.file.close(flush=False)
        except OSError:  # a full disk can fail the flush of what is thrown away anyway
            pass
        try:
            if self.tmp is not None:
                os.unlink(self.tmp, dir_fd=self.dfd)
        except FileNotFoundError:
            pass
        os.close(self.dfd)
        self.dfd = None


class RawFile:
    """A descriptor written through a buffer of its own (what ``os.fdopen(fd, "wb")`` does, without the fstat and
    the lseek that opening one costs: two syscalls a shard file). Writes of ``FLUSH_AT`` bytes or more go
    straight to the file."""

    FLUSH_AT = 1 << 20
    __slots__ = ("fd", "buf")

    def __init__(self, fd: int):
        self.fd, self.buf = fd, bytearray()

    def write(self, data) -> int:
        n = memoryview(data).nbytes  # (bytes, not len(): an ndarray's len is its first dimension)
        if n >= self.FLUSH_AT:
            self.flush()
            _write_all(self.fd, data)
        else:
            self.buf += data
            if len(self.buf) >= self.FLUSH_AT:
                self.flush()
        return n

    def flush(self) -> None:
        if self.buf:
            _write_all(self.fd, self.buf)
            self.buf = bytearray()

    def fileno(self) -> int:
        return self.fd

    def close(self, flush: bool = True) -> None:
        if self.fd < 0:
            return
        fd, self.fd = self.fd, -1
        try:
            if flush:
                _write_all(fd, self.buf)
        finally:
            self.buf = bytearray()
            os.close(fd)


def _write_all(fd: int, data) -> None:
    view = memoryview(data).cast("B") if not isinstance(data, (bytes, bytearray)) else memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def remove_file(path: Path, base: Path) -> None:
    """Remove the file ``path`` (a link there: the link) if it is there, its folders below ``base`` opened without
    following links."""
    try:
        dfd = open_folder(Path(path).parent, base, create=False)
    except FileNotFoundError:
        return
    try:
        os.unlink(Path(path).name, dir_fd=dfd)
    except FileNotFoundError:
        pass
    except IsADirectoryError:
        os.rmdir(Path(path).name, dir_fd=dfd)
    finally:
        os.close(dfd)


def write_atomic(path: str | os.PathLike, data, base: Path | None = None, sync: bool = False,
                 create_only: bool = False, unique: bool | None = None) -> None:
    """``data`` (bytes, or an open binary file to copy) as the file ``path``, complete or absent (see
    :class:`NewFile`; ``unique`` defaults to ``create_only``)."""
    f = NewFile(path, base, unique=create_only if unique is None else unique)
    try:
        if isinstance(data, (bytes, bytearray, memoryview)):
            f.write(data)
        else:
            import shutil

            shutil.copyfileobj(data, f.file, 1 << 20)
    except BaseException:
        f.abort()
        raise
    f.commit(sync, create_only)


# ----------------------------------------------------------------------------- the lock
def try_exclusive(fd: int) -> bool | None:
    """The probe of a file some process may hold (a mark, a partial download, a cached shard, a version's pin, a
    writer's lock): an exclusive flock on ``fd`` taken without waiting. True: taken (no process holds it, this one
    now does until ``fd`` is closed); False: another process holds it; None: flock cannot tell (a filesystem
    without it)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    except OSError:
        return None


class OutLock:
    """The exclusive lock every writer of OUT holds (a compile, an update, a restore, a vacuum):
    ``.OUT.dsc-lock`` beside OUT, flock'ed; a second writer fails at once, naming the lock.

    One lock per dataset, whatever path names it: the lock sits beside OUT's real path (links resolved), so a
    writer through a symbolic link ``alias -> real`` (or through a linked parent folder) and one through
    ``real`` take the same lock. Once held, the real path is resolved again: a link re-pointed meanwhile makes
    the writer take the lock of what the link names now.

    Paths to one folder without any link (a bind mount, ``/proc/self/root/...``) resolve to different real
    paths, so the dataset folder itself is flock'ed too once the lock beside the path is held (when it exists:
    a compile making a new OUT has only the lock beside it until it publishes): every alias opens the same
    inode, so two writers through two such paths cannot both hold it. (A filesystem that refuses a flock on a
    folder, NFS, has the lock beside the path alone.)"""

    def __init__(self, out: Path, what: str = "compile"):
        self.out, self.what = Path(out), what
        self.path = self._lock_path()
        self.fd: int | None = None
        self.dir_fd: int | None = None  # the dataset folder, flock'ed (see above)

    def _lock_path(self) -> Path:
        real = Path(os.path.realpath(self.out))
        return real.parent / f".{real.name}.dsc-lock"

    def __enter__(self) -> "OutLock":
        try:
            self.out.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise self._unwritable(e) from None
        self.path = self._lock_path()  # (the parent may have been made just now: resolved as it is)
        while True:  # the lock counts only if the file we locked is still the one at the path (a finishing
            fd = self._open()  # writer unlinks it: retry on the new one)
            taken = try_exclusive(fd)
            if taken is None:  # (a filesystem without flock: no writer could be kept out)
                os.close(fd)
                raise WriteError(f"{self.out}: cannot lock {self.path} (its filesystem has no flock), so a second "
                                 f"writer could not be kept out; write the dataset on a local filesystem")
            if not taken:
                try:
                    holder = os.read(fd, 64).decode("utf-8", "replace").strip() or "compile"
                except OSError:
                    holder = "compile"
                os.close(fd)
                raise CompileLockedError(f"another dsc {holder} is writing {self.out} right now "
                                         f"(lock {self.path}); wait for it to finish")
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path, follow_symlinks=False).st_ino
            except FileNotFoundError:
                same = False
            if same and self._lock_path() != self.path:  # OUT names another folder now (a link re-pointed)
                self.__exit_fd(fd)
                self.path = self._lock_path()
                continue
            if same:
                self.fd = fd
                try:
                    self.dir_fd = self._lock_folder()
                except BaseException:
                    self.__exit__()
                    raise
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{self.what} (pid {os.getpid()})".encode(), 0)  # named to whoever is refused
                return self
            os.close(fd)

    def _lock_folder(self) -> int | None:
        """The dataset folder (OUT's real path) opened and flock'ed, or None when there is no folder there yet (or
        its filesystem has no flock on folders); CompileLockedError when a writer through another path to it
        holds it."""
        try:
            dfd = os.open(os.path.realpath(self.out), _DIR | _NOFOLLOW)
        except OSError:  # (none yet, or not a folder: the compile's own checks say what is wrong)
            return None
        taken = try_exclusive(dfd)
        if not taken:
            os.close(dfd)
            if taken is None:
                return None
            raise CompileLockedError(f"another dsc writer is writing {self.out} right now through another path to the "
                                     f"same folder (a bind mount, or another name of it; its lock, beside that "
                                     f"path, names it); wait for it to finish")
        return dfd

    def __exit_fd(self, fd: int) -> None:
        """Let go of the lock held by ``fd`` (taken on a path that no longer names OUT's folder)."""
        self.fd = fd
        self.__exit__()

    def _open(self) -> int:
        """The lock file (see ``open_lock_file``: of one name, so no hard link to another file either)."""
        try:
            return open_lock_file(self.path, f"the lock file dsc keeps beside {self.out}", one_name=True)
        except DscError:
            raise
        except OSError as e:
            raise self._unwritable(e) from None

    def _unwritable(self, e: OSError) -> DscError:
        """The error for a lock file that cannot be made: what is wrong with where OUT goes, when that is it."""
        if e.errno in (errno.EEXIST, errno.ENOTDIR):
            why = "a part of that path is a file, not a folder"
        elif e.errno in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOENT):
            why = "the folder OUT goes in must be one dsc can write in"
        else:
            return WriteError.writing(self.path, e)
        err = WriteError(f"{self.out}: cannot make the lock file dsc keeps beside it, {self.path} ({e.strerror}); "
                         f"{why}")
        err.errno = e.errno
        return err

    def __exit__(self, *exc) -> None:
        _KEPT.release()  # (the shard folders a writer kept open: see _Kept)
        if self.dir_fd is not None:
            os.close(self.dir_fd)  # (the folder's flock first: the lock beside the path still held meanwhile)
            self.dir_fd = None
        if self.fd is not None:
            try:
                self.path.unlink()
            except FileNotFoundError:
                pass
            os.close(self.fd)  # closing releases the flock
            self.fd = None



# ----------------------------------------------------------------------------- the store
def _walk(fd: int, rel: str, prefix: str, out: list) -> None:
    """Regular files (and links, never followed) below the open folder ``fd`` (named ``rel``) whose path starts
    with ``prefix``; closes ``fd``."""
    try:
        with os.scandir(fd) as it:
            entries = list(it)
        for e in entries:
            name = f"{rel}/{e.name}" if rel else e.name
            if e.is_dir(follow_symlinks=False):
                if name.startswith(prefix) or prefix.startswith(name + "/"):
                    try:
                        sub = os.open(e.name, _DIR | _NOFOLLOW, dir_fd=fd)
                    except OSError:
                        continue
                    _walk(sub, name, prefix, out)
            elif (e.is_file(follow_symlinks=False) or e.is_symlink()) and name.startswith(prefix):
                try:
                    st = e.stat(follow_symlinks=False)  # (a link is listed, so that reading it is refused)
                except FileNotFoundError:  # removed since the folder was read (a vacuum meanwhile)
                    continue
                out.append((name, st.st_size, st.st_mtime))
    finally:
        os.close(fd)


def _prune(fd: int) -> bool:
    """Remove the empty folders below the open folder ``fd`` (closed here); True if it is empty then."""
    try:
        empty = True
        with os.scandir(fd) as it:
            entries = list(it)
        for e in entries:
            if e.is_dir(follow_symlinks=False):
                try:
                    sub = os.open(e.name, _DIR | _NOFOLLOW, dir_fd=fd)
                except OSError:
                    empty = False
                    continue
                if _prune(sub):
                    try:
                        os.rmdir(e.name, dir_fd=fd)
                        continue
                    except OSError:
                        pass
            empty = False
        return empty
    finally:
        os.close(fd)


class LocalStore(Store):
    """A dataset in the local folder ``path`` (see the module docstring): reads through one :class:`Root`
    opened on first use (links refused), writes by write + fsync + rename, put-if-absent by link."""

    local = True

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.url = str(self.path)
        self._root: Root | None = None

    def reopen(self) -> None:
        """Read the folder that is at the path now (after taking its lock: one read before may have been of a
        folder since replaced)."""
        self._root = None

    @property
    def root(self) -> Root:
        """The folder, opened once: reads never mix two folders that took turns at the path."""
        if self._root is None:
            self._root = Root(self.path)
        return self._root

    def where(self, rel: str) -> str:
        return str(self.path / rel)

    def download(self, rel: str, f, on_chunk=None, limit: int | None = None) -> int:
        fd = self.root.open_file(rel)
        n = 0
        try:
            if on_chunk is not None:
                on_chunk(None)
            while chunk := os.read(fd, 1 << 22):
                if limit is not None and n + len(chunk) > limit:
                    raise CorruptDatasetError(f"{self.where(rel)} has more than the {limit:,} bytes it may have; the "
                                              f"dataset is damaged")
                f.write(chunk)
                if on_chunk is not None:
                    on_chunk(memoryview(chunk))
                n += len(chunk)
        finally:
            os.close(fd)
        return n

    def get(self, rel: str, limit: int | None = None) -> bytes:
        return bytes(self.root.read(rel, limit))

    def read_range(self, rel: str, start: int, end: int):
        if end <= start:
            return b""
        fd = self.root.open_file(rel)
        try:
            return os.pread(fd, end - start, start)
        finally:
            os.close(fd)

    def put(self, rel: str, data, create_only: bool = False, attributes: dict | None = None) -> None:
        """Write + rename (a create-only put, a commit: write, fsync, link). ``attributes`` are not kept: a
        folder's files are checked against the manifest's hashes, not against metadata."""
        if isinstance(data, (str, os.PathLike)):  # a file of ours: its bytes
            with open(data, "rb") as f:
                self.put(rel, f, create_only)
            return
        write_atomic(self.path / check_node_path(rel), data, base=self.path, sync=create_only, create_only=create_only)

    def stat(self, rel: str) -> tuple[int, dict] | None:
        try:
            return self.root.size(rel), {}
        except _Missing:
            return None

    def list_detailed(self, prefix: str) -> list[tuple[str, int, float]]:
        """Regular files under ``prefix``, read from the folder as opened, never through a link."""
        folder = prefix.rstrip("/") if prefix.endswith("/") else prefix.rpartition("/")[0]
        try:
            fd = self.root.open_dir(folder) if folder else os.dup(self.root.fd)
        except FileNotFoundError:
            return []
        out: list[tuple[str, int, float]] = []
        _walk(fd, folder, prefix, out)
        return sorted(out)

    @classmethod
    def of(cls, root: Root) -> "LocalStore":
        """The store of an open :class:`Root` (reading through the same descriptor)."""
        store = cls(root.path)
        store._root = root
        return store

    def files(self, redirect: dict | None = None, expected: dict | None = None) -> Root:
        """The folder's files through a :class:`Root` of their own (``redirect``, ``expected``: see Store)."""
        root = Root(self.path)
        root.redirect, root.expected = redirect, expected
        return root

    def lock(self, what: str) -> OutLock:
        """The exclusive lock every writer of the folder holds (``.OUT.dsc-lock`` beside it)."""
        return OutLock(self.path, what)

    def prune(self, folder: str) -> None:
        """Remove the empty folders under ``folder`` (itself too, if it ends up empty), never through a link."""
        try:
            fd = self.root.open_dir(folder)
        except (FileNotFoundError, UnsafePathError):
            return
        if _prune(fd):
            try:
                parent, name = folder.rpartition("/")[::2]
                pfd = self.root.open_dir(parent) if parent else os.dup(self.root.fd)
                try:
                    os.rmdir(name, dir_fd=pfd)
                finally:
                    os.close(pfd)
            except OSError:
                pass

    def names(self, folder: str) -> list[str]:
        """The names of everything in ``folder`` (files, folders, links: a damaged entry is named too)."""
        try:
            fd = self.root.open_dir(folder)
        except FileNotFoundError:
            return []
        try:
            return sorted(os.listdir(fd))
        finally:
            os.close(fd)

    def has_folder(self, rel: str) -> bool:
        try:
            os.close(self.root.open_dir(rel))
        except (FileNotFoundError, UnsafePathError):
            return False
        return True

    def delete(self, rel: str, best_effort: bool = False) -> None:
        """Remove the file ``rel`` (a link there: the link; an empty folder of that name too)."""
        folder, _, name = rel.rpartition("/")
        if name in ("", ".", "..") or "\x00" in name:
            raise UnsafePathError(f"refusing to delete {rel!r}: not a file name")
        try:  # (the folders are plain names; the file may be a leftover's hidden temporary name)
            remove_file(self.path / (check_node_path(folder) if folder else "") / name, self.path)
        except OSError:
            if not best_effort:
                raise


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` runs on this machine (0 and negative numbers name none)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
