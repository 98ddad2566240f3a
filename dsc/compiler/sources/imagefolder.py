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
from .base import Param, Record, ScannedSource, Source

# torchvision.datasets.folder.IMG_EXTENSIONS
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def is_image_file(name: str) -> bool:
    return name.lower().endswith(IMG_EXTENSIONS)


def find_classes(root: Path) -> list[str]:
    with os.scandir(root) as it:
        return sorted(e.name for e in it if e.is_dir() and not e.name.startswith("."))


def walk_images(top: Path) -> list[str]:
    """Image files below ``top`` in torchvision's order (sorted walk, sorted names), following symlinks;
    a directory reachable twice (a symlink loop or an alias) is walked once, at its first path in that
    sorted order, so the result does not depend on the filesystem's listing order."""
    walked = []
    seen: set[tuple[int, int]] = set()
    for dirpath, dirnames, filenames in os.walk(top, followlinks=True):
        st = os.stat(dirpath)
        if (st.st_dev, st.st_ino) in seen:  # a symlink back to a directory already walked
            dirnames[:] = []
            continue
        seen.add((st.st_dev, st.st_ino))
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        walked.append((dirpath, filenames))
    files = []
    for dirpath, filenames in sorted(walked):
        for name in sorted(filenames):
            if not name.startswith(".") and is_image_file(name):
                files.append(os.path.join(dirpath, name))
    return files


class ImageFolderSource(Source):
    """A torchvision ImageFolder tree: SRC/<class>/<image>.

    Classes are the sorted sub-folder names; images are the files with an image extension
    (.jpg .jpeg .png .ppm .bmp .pgm .tif .tiff .webp, any case), walked recursively in sorted order.
    Hidden entries are ignored."""

    name = "imagefolder"
    task = "classification"
    params = (Param("src", "The ImageFolder root.", type="dir", required=True, argument=True),)

    def scan(self) -> ScannedSource:
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
        warnings = []
        for idx, cls in enumerate(classes):
            files = walk_images(root / cls)
            if not files:
                warnings.append(f"class {cls!r} ({root / cls}) has no image files; its index {idx} is kept")
            for f in files:
                records.append(Record(key=Path(os.path.relpath(f, root)).as_posix(), path=f, label=idx))
        if not records:
            raise SourceError(f"{root}: no image files found in any class folder "
                              f"(extensions: {', '.join(IMG_EXTENSIONS)}).")
        return ScannedSource(kind="imagefolder", root=str(root), task="classification", records=records,
                             classes=tuple(classes), warnings=tuple(warnings),
                             summary={"kind": "imagefolder", "root": str(root), "num_files": len(records),
                                      "num_classes": len(classes)})


def scan_imagefolder(src: str | os.PathLike) -> ScannedSource:
    return ImageFolderSource(src=src).scan()
