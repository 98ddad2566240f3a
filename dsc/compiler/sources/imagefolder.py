"""torchvision's ImageFolder convention, reproduced without torchvision.

* classes: the sorted names of SRC's sub-directories; ``class_to_idx[c] = position in that list``;
* samples: for each class in that order, ``sorted(os.walk(class_dir, followlinks=True))`` and, in
  each directory, the sorted file names whose lower-cased name ends with one of IMG_EXTENSIONS;
* files directly in SRC are ignored.

Deliberate differences from torchvision, all documented in the README: hidden entries (names that
start with '.', e.g. ``.ipynb_checkpoints``) are ignored instead of becoming classes or samples; an
empty class is kept (its index stays) with a warning instead of an error; a symlink loop is walked
once instead of forever.
"""
from __future__ import annotations

import os
from pathlib import Path

from ...errors import SourceError
from .base import Param, Record, ScannedSource, Source, display, utf8 as _utf8
from .inputs import check_input, is_remote, list_objects
from ..staging import is_dsc_dataset

# torchvision.datasets.folder.IMG_EXTENSIONS
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def is_image_file(name: str) -> bool:
    return name.lower().endswith(IMG_EXTENSIONS)


def _is_dataset(path: str) -> bool:
    """A dsc dataset (a compile's output, maybe inside the folder being compiled): never an input."""

    return os.path.isfile(os.path.join(path, "zarr.json")) and is_dsc_dataset(Path(path))


def find_classes(root: Path) -> list[str]:
    """The class folders: sorted sub-directory names, without hidden ones and dsc datasets."""
    try:
        with os.scandir(root) as it:
            names = [e.name for e in it if e.is_dir() and not e.name.startswith(".")]
    except OSError as e:
        raise SourceError(f"{display(root)}: cannot list the folder ({e.strerror}); fix its permissions") from None
    bad = [n for n in names if not _utf8(n)]
    if bad:
        raise SourceError(f"{display(root / bad[0])}: the class folder's name is not valid UTF-8; rename it")
    return sorted(n for n in names if not _is_dataset(str(root / n)))


def walk_images(top: Path, problems: list | None = None) -> list[str]:
    """Image files below ``top`` in torchvision's order (sorted walk, sorted names), following symlinks;
    a directory reachable twice (a symlink loop or an alias) is walked once, at its first path in that
    sorted order, so the result does not depend on the filesystem's listing order.

    Only regular files are inputs (a FIFO or a device named ``x.jpg`` would block or mislead a reader),
    names must be valid UTF-8 (keys are stored as UTF-8), and dsc datasets inside ``top`` are left out.
    What cannot be used is appended to ``problems`` as (path, reason): a folder that cannot be listed, a
    file that is not a regular file, a name that is not UTF-8. Without ``problems`` the first one raises."""
    def problem(path, reason):
        if problems is None:
            raise SourceError(f"{display(path)}: {reason}")
        problems.append((display(path), reason))

    walked, seen = [], set()
    stack = [str(top)]
    while stack:
        dirpath = stack.pop()
        try:
            st = os.stat(dirpath)
            with os.scandir(dirpath) as it:
                entries = list(it)
        except OSError as e:
            problem(dirpath, f"cannot list this folder ({e.strerror}); its images would be missing. Fix its "
                             f"permissions")
            continue
        if (st.st_dev, st.st_ino) in seen:  # a symlink back to a directory already walked
            continue
        seen.add((st.st_dev, st.st_ino))
        files = []
        for e in entries:
            if e.name.startswith("."):
                continue
            try:
                is_dir = e.is_dir()
            except OSError:
                is_dir = False
            if is_dir:
                if not _utf8(e.name):
                    problem(e.path, "the folder's name is not valid UTF-8; rename it")
                elif not _is_dataset(e.path):
                    stack.append(e.path)
            elif is_image_file(e.name):
                if not _utf8(e.name):
                    problem(e.path, "the file name is not valid UTF-8 (keys are stored as UTF-8); rename it")
                    continue
                try:
                    regular = e.is_file()
                except OSError:
                    regular = False
                if not regular and os.path.exists(e.path):  # a FIFO, a socket, a device: never opened
                    problem(e.path, "not a regular file")
                    continue
                files.append(e.name)  # (a dangling symlink stays: its decode names the missing target)
        walked.append((dirpath, files))
    out = []
    for dirpath, names in sorted(walked):
        out.extend(os.path.join(dirpath, name) for name in sorted(names))
    return out


def images_under(top, problems: list | None = None) -> list[str]:
    """``walk_images`` of a folder, or the image objects under a URL prefix (one listing; hidden parts and dsc
    datasets left out), in the same sorted order."""
    top = str(top)
    if not is_remote(top):
        return walk_images(Path(top), problems)
    top = top.rstrip("/")
    rels = [u[len(top) + 1:] for u, _ in list_objects(top)]
    datasets = {r.rsplit("/", 1)[0] for r in rels if r.endswith("/zarr.json")}
    keep = [r for r in rels if is_image_file(r) and not any(p.startswith(".") for p in r.split("/"))
            and not any("/".join(r.split("/")[:i]) in datasets for i in range(1, r.count("/") + 1))]
    return [f"{top}/{r}" for r in sorted(keep, key=lambda r: (r.rsplit("/", 1)[0] if "/" in r else "",
                                                              r.rsplit("/", 1)[-1]))]


class ImageFolderSource(Source):
    """A torchvision ImageFolder tree: SRC/<class>/<image>.

    Classes are the sorted sub-folder names; images are the files with an image extension
    (.jpg .jpeg .png .ppm .bmp .pgm .tif .tiff .webp, any case), walked recursively in sorted order.
    Hidden entries are ignored. SRC may be a folder in object storage (s3://, gs://, az://)."""

    name = "imagefolder"
    task = "classification"
    params = (Param("src", "The ImageFolder root.", type="dir", required=True, argument=True),)

    def scan(self) -> ScannedSource:
        if is_remote(check_input(self.src)):
            return scan_prefix(check_input(self.src))
        root = Path(self.src)
        if not root.exists():
            raise SourceError(f"{root}: no such directory. Give the ImageFolder root (SRC/<class>/<image>).")
        if not root.is_dir():
            raise SourceError(f"{root} is not a directory. Give the ImageFolder root (SRC/<class>/<image>).")
        classes = find_classes(root)
        if not classes:
            raise SourceError(f"{root} has no class folders: ImageFolder expects SRC/<class>/<image files>.")
        root = Path(os.path.abspath(root))
        records: list[Record] = []
        warnings, problems = [], []
        for idx, cls in enumerate(classes):
            files = walk_images(root / cls, problems)
            if not files:
                warnings.append(f"class {cls!r} ({root / cls}) has no image files; its index {idx} is kept")
            for f in files:
                records.append(Record(key=Path(os.path.relpath(f, root)).as_posix(), path=f, label=idx))
        if not records and not problems:
            raise SourceError(f"{root}: no image files found in any class folder "
                              f"(extensions: {', '.join(IMG_EXTENSIONS)}).")
        invalid = tuple((os.path.relpath(path, display(root)), reason) for path, reason in problems)
        return ScannedSource(kind="imagefolder", root=str(root), task="classification", records=records,
                             classes=tuple(classes), warnings=tuple(warnings), invalid=invalid,
                             summary={"kind": "imagefolder", "root": str(root), "num_files": len(records),
                                      "num_classes": len(classes)})


def scan_prefix(url: str) -> ScannedSource:
    """An ImageFolder under a URL prefix (s3://bucket/train): one listing; the first path part below the
    prefix is the class, the objects with an image extension below it its images, in sorted order. Hidden
    parts and dsc datasets (a folder holding zarr.json) are left out, as in a local folder."""
    url = url.rstrip("/")
    objects = list_objects(url)
    if not objects:
        raise SourceError(f"{url}: no objects under this prefix. Give the ImageFolder root "
                          f"(URL/<class>/<image>)")
    rels = [u[len(url) + 1:] for u, _ in objects]
    datasets = {r.rsplit("/", 1)[0] for r in rels if r.endswith("/zarr.json")}
    by_class: dict[str, list[str]] = {}
    for rel in rels:
        parts = rel.split("/")
        if len(parts) < 2 or any(p.startswith(".") for p in parts):
            continue
        if any("/".join(parts[:i]) in datasets for i in range(1, len(parts))):
            continue
        by_class.setdefault(parts[0], [])
        if is_image_file(parts[-1]):
            by_class[parts[0]].append(rel)
    classes = sorted(c for c in by_class if c not in datasets)
    if not classes:
        raise SourceError(f"{url} has no class folders: ImageFolder expects URL/<class>/<image files>.")
    records, warnings = [], []
    for idx, cls in enumerate(classes):
        if not by_class[cls]:
            warnings.append(f"class {cls!r} ({url}/{cls}) has no image files; its index {idx} is kept")
        for rel in sorted(by_class[cls], key=lambda r: (r.rsplit("/", 1)[0], r.rsplit("/", 1)[-1])):
            records.append(Record(key=rel, path=f"{url}/{rel}", label=idx))
    if not records:
        raise SourceError(f"{url}: no image files found in any class folder (extensions: {', '.join(IMG_EXTENSIONS)}).")
    return ScannedSource(kind="imagefolder", root=url, task="classification", records=records, classes=tuple(classes),
                         warnings=tuple(warnings), summary={"kind": "imagefolder", "root": url, "num_files": len(records),
                                                            "num_classes": len(classes)})


def scan_imagefolder(src: str | os.PathLike) -> ScannedSource:
    return ImageFolderSource(src=src).scan()
