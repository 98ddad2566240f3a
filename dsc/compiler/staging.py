"""Where a compile writes: an exclusive lock on OUT, a private directory beside it, the final rename.

``.OUT.dsc-lock`` (flock) makes a second compile into the same OUT fail at once; ``.OUT.dsc-tmp``
holds everything until the last step renames it to OUT, so OUT is a complete dataset or absent.
"""
from __future__ import annotations

import ctypes
import os
import shutil
from pathlib import Path

from ..errors import DscError, OutputExistsError
from ..store.local import OutLock, not_ours, refuse_links  # noqa: F401 - OutLock: the lock every writer holds
from ..formats import versions
from ..formats.zarr_v3 import read_json


def staging_dir(out: Path) -> Path:
    """Where a compile into ``out`` writes until it publishes: ``.OUT.dsc-tmp`` beside OUT."""
    return out.parent / f".{out.name}.dsc-tmp"


class Staging:
    """Exclusive lock on OUT, a private temporary directory beside it, and the final rename."""

    def __init__(self, out: Path, overwrite: bool, resume: bool = False, warn=None):
        self.out = out
        self.overwrite = overwrite
        self.resume = resume
        self.warn = warn or (lambda msg: None)
        self.keep_on_failure = None  # callable: keep the staging directory when the compile fails?
        self.tmp = staging_dir(out)
        self._lock = OutLock(out)
        self.published = False

    def __enter__(self) -> "Staging":
        self._lock.__enter__()
        try:
            if os.path.lexists(self.tmp):
                if not self.tmp.is_dir() or self.tmp.is_symlink():
                    raise not_ours(self.tmp, f"the staging folder dsc compiles {self.out} in")
                if not self.resume:  # an interrupted compile's; we hold the lock, so it is stale
                    self.warn(f"removing the partial output of an interrupted compile ({self.tmp}); "
                              f"pass --resume to continue it instead")
                    shutil.rmtree(self.tmp)
                else:
                    refuse_links(self.tmp, "in dsc's staging folder; remove it, or run without --resume to start "
                                           "over")
            self.tmp.mkdir(exist_ok=True)
        except BaseException:  # refused: the lock goes with the run
            self._lock.__exit__()
            raise
        return self

    def reset(self) -> None:
        """Empty the staging directory (what it held is not a compile of these inputs)."""
        shutil.rmtree(self.tmp)
        self.tmp.mkdir()

    def publish(self, before_rename=None) -> None:
        """Flush everything to disk, then make the staging directory OUT in one rename (an atomic swap
        with an existing OUT when overwriting, so OUT is never absent). ``before_rename`` runs after the
        last check that can fail (it removes the resume journal)."""
        check_output(self.out, self.overwrite)
        if before_rename is not None:
            before_rename()
        sync_filesystem(self.tmp)
        if self.out.exists():
            if not _exchange(self.tmp, self.out):  # no renameat2: two renames, OUT briefly absent
                old = self.out.parent / f".{self.out.name}.dsc-old"
                shutil.rmtree(old, ignore_errors=True)
                os.rename(self.out, old)
                os.rename(self.tmp, self.out)
                self.tmp = old
            self.published = True
            fsync_dir(self.out.parent)
            shutil.rmtree(self.tmp)  # the old dataset, now at the staging path
            return
        os.rename(self.tmp, self.out)
        self.published = True
        fsync_dir(self.out.parent)

    def __exit__(self, exc_type, exc, tb) -> None:
        if not self.published:
            keep = exc_type is not None and self.keep_on_failure is not None and self.keep_on_failure()
            if not keep:
                shutil.rmtree(self.tmp, ignore_errors=True)
        self._lock.__exit__()


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (Linux renameat2 RENAME_EXCHANGE); False where unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    AT_FDCWD, RENAME_EXCHANGE = -100, 2
    if fn(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) == 0:
        return True
    return False


def sync_filesystem(path: Path) -> None:
    """Make every file written under ``path`` durable: syncfs(2) on its filesystem (one call instead of
    an fsync per file and directory), os.sync() where syncfs is missing."""
    fd = os.open(path, os.O_RDONLY)
    try:
        try:
            if ctypes.CDLL(None, use_errno=True).syncfs(fd) == 0:
                return
        except (OSError, AttributeError):
            pass
        os.sync()
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def is_dsc_dataset(path: Path) -> bool:
    try:
        meta = read_json(path / "zarr.json")  # bounded: a huge zarr.json is not a dataset's
    except (FileNotFoundError, NotADirectoryError, DscError):
        return False
    return isinstance(meta, dict) and isinstance(meta.get("attributes"), dict) and "dsc" in meta["attributes"]


def history(out: Path) -> str | None:
    """What ``--overwrite`` of the dataset at ``out`` would drop beyond the one version it replaces: "versions
    0-3 and tags prod, v2" (None when it has one version and no tag, or is not a versioned dataset)."""
    try:
        if not (Path(out).is_dir() and not Path(out).is_symlink() and versions.is_versioned(out)):
            return None
        have = versions.versions(out)
        good, bad = versions.read_tags(out)
    except DscError:
        return None
    tags = sorted(set(good) | set(bad))
    if len(have) <= 1 and not tags:
        return None
    what = f"version {have[0]}" if len(have) == 1 else f"versions {versions._ranges(have)}"
    return what + (f" and tag{'s' if len(tags) > 1 else ''} {', '.join(tags)}" if tags else "")


def check_output(out: Path, overwrite: bool) -> None:
    """Refuse an existing OUT unless overwrite; even then, only a dsc dataset or an empty directory."""
    out = Path(out)
    if out.name in ("", ".", ".."):
        raise OutputExistsError(f"{str(out)!r} is not a name for a new dataset directory; give OUT as a path "
                                f"that ends in a new name, e.g. ./train.dsc")
    if not out.exists() and not out.is_symlink():
        return
    if out.is_symlink():
        raise OutputExistsError(f"{out} is a link; dsc does not compile over a link: give the real path (--update "
                                f"makes a new version of a dataset through it)")
    folder = out.is_dir()
    if folder and is_dsc_dataset(out):
        if overwrite:
            return
        raise OutputExistsError(f"{out} already exists; pass --update to make a new version of it from the source as it "
                                f"is now, or --overwrite to replace it")
    if folder and not any(out.iterdir()):
        if overwrite:
            return
        raise OutputExistsError(f"{out} is an empty folder; pass --overwrite to compile into it")
    raise OutputExistsError(f"{out} exists and is not a dsc dataset; dsc writes only to a new path, an empty folder or "
                            f"a dataset. Remove it yourself or choose another output path")
