"""Where a compile writes: an exclusive lock on OUT, a private directory beside it, the final rename.

``.OUT.dsc-lock`` (flock) makes a second compile into the same OUT fail at once; ``.OUT.dsc-tmp``
holds everything until the last step renames it to OUT, so OUT is a complete dataset or absent.
"""
from __future__ import annotations

import fcntl
import os
import shutil
from pathlib import Path

from ..errors import CompileLockedError, DscError, OutputExistsError
from ..formats.zarr_v3 import read_json


class Staging:
    """Exclusive lock on OUT, a private temporary directory beside it, and the final rename."""

    def __init__(self, out: Path, overwrite: bool, resume: bool = False, warn=None):
        self.out = out
        self.overwrite = overwrite
        self.resume = resume
        self.warn = warn or (lambda msg: None)
        self.keep_on_failure = None  # callable: keep the staging directory when the compile fails?
        self.tmp = out.parent / f".{out.name}.dsc-tmp"
        self._lock_path = out.parent / f".{out.name}.dsc-lock"
        self._lock_fd: int | None = None
        self.published = False

    def __enter__(self) -> "Staging":
        self.out.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self._lock_path, os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise CompileLockedError(f"another dsc compile is writing {self.out} right now "
                                     f"(lock {self._lock_path}); wait for it to finish") from None
        self._lock_fd = fd
        if self.tmp.exists() and not self.resume:  # an interrupted compile's; we hold the lock, so it is stale
            self.warn(f"removing the partial output of an interrupted compile ({self.tmp}); "
                      f"pass --resume to continue it instead")
            shutil.rmtree(self.tmp)
        self.tmp.mkdir(exist_ok=True)
        shutil.rmtree(self.tmp / "_compact", ignore_errors=True)  # an interrupted compaction restarts
        return self

    def publish(self) -> None:
        check_output(self.out, self.overwrite)
        old = self.out.parent / f".{self.out.name}.dsc-old"
        if self.out.exists():
            if old.exists():
                shutil.rmtree(old)
            os.rename(self.out, old)
        os.rename(self.tmp, self.out)
        self.published = True
        fsync_dir(self.out.parent)
        if old.exists():
            shutil.rmtree(old)

    def __exit__(self, exc_type, exc, tb) -> None:
        if not self.published:
            keep = exc_type is not None and self.keep_on_failure is not None and self.keep_on_failure()
            if not keep:
                shutil.rmtree(self.tmp, ignore_errors=True)
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing releases the flock
            self._lock_fd = None
            try:
                self._lock_path.unlink()
            except FileNotFoundError:
                pass


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def is_dsc_dataset(path: Path) -> bool:
    try:
        meta = read_json(path / "zarr.json")
    except (FileNotFoundError, NotADirectoryError, DscError):
        return False
    return isinstance(meta.get("attributes"), dict) and "dsc" in meta["attributes"]


def check_output(out: Path, overwrite: bool) -> None:
    """Refuse an existing OUT unless overwrite; even then, only a dsc dataset or an empty directory."""
    out = Path(out)
    if not out.exists() and not out.is_symlink():
        return
    if not overwrite:
        raise OutputExistsError(f"{out} already exists; pass --overwrite to replace it")
    if out.is_dir() and not out.is_symlink() and (is_dsc_dataset(out) or not any(out.iterdir())):
        return
    raise OutputExistsError(f"{out} exists and is not a dsc dataset; refusing to overwrite it. "
                            f"Remove it yourself or choose another output path")
