"""Semantic segmentation as two parallel folders (ADE20K / Cityscapes style): ROOT/images/... and
ROOT/masks/..., an image and its mask paired by relative path minus extension.

The mask is a single-channel image of class ids (a palette PNG's indices, 8-bit grey, or 16-bit grey
for more than 255 classes); its size must equal the image's (or the image's raw size before its EXIF
rotation, then it turns with the image). ``image_suffix`` / ``mask_suffix`` strip and add a suffix of
the name (Cityscapes: ``_leftImg8bit`` / ``_gtFine_labelIds``). An image without a mask is a per-sample
error (``--on-error``); masks without an image are counted in a warning.
"""
from __future__ import annotations

import io
import os
from pathlib import Path

from PIL import Image

from ...errors import SourceError
from .base import MaskInfo, Param, Record, ScannedSource, Source, read_input
from .imagefolder import images_under
from .inputs import check_input, is_remote, join, read_bytes, relative

_WIDE_MODES = {"I;16", "I;16L", "I;16B", "I;16N", "I"}


def _stem(path: str, top, suffix: str) -> str:
    """The pairing key: the path relative to ``top`` without its extension and ``suffix``."""
    rel = Path(relative(path, top)).with_suffix("").as_posix()
    return rel[:-len(suffix)] if suffix and rel.endswith(suffix) else rel


class SegFolderSource(Source):
    """Semantic segmentation pairs: ROOT/images/<path>.jpg + ROOT/masks/<path>.png (class-id masks).

    Image and mask are paired by relative path minus extension; a missing or mis-sized mask is a bad
    sample (--on-error)."""
    makes_masks = True

    name = "segfolder"
    task = "segmentation"
    params = (
        Param("root", "The dataset root.", type="dir", required=True, argument=True),
        Param("images", "Folder of images, relative to ROOT (or absolute).", default="images", flag="--images"),
        Param("masks", "Folder of masks, relative to ROOT (or absolute).", default="masks", flag="--masks"),
        Param("classes", "Comma-separated class names of the mask values 0, 1, ...", type="csv"),
        Param("classes_file", "Class names, one a line (mask value = line number - 1); a path from the current "
                              "directory, not from ROOT.", type="file"),
        Param("image_suffix", "Strip this from image names before pairing (e.g. _leftImg8bit).", default=""),
        Param("mask_suffix", "Strip this from mask names before pairing (e.g. _gtFine_labelIds).", default=""),
    )

    def scan(self) -> ScannedSource:
        remote = is_remote(check_input(self.root))
        if remote:  # a URL prefix: its images and masks listed (one listing each)
            root = check_input(self.root).rstrip("/")
            img_dir, mask_dir = (self.images if is_remote(self.images) else join(root, self.images),
                                 self.masks if is_remote(self.masks) else join(root, self.masks))
        else:
            root = Path(os.path.abspath(self.root))
            if not root.is_dir():
                raise SourceError(f"{root}: no such directory")
            img_dir, mask_dir = root / self.images, root / self.masks
            for d, opt in ((img_dir, "--images"), (mask_dir, "--masks")):
                if not d.is_dir():
                    raise SourceError(f"{d}: no such folder; give the folder with {opt} (relative to {root})")
        names = self.classes
        if self.classes_file:
            if names:
                raise SourceError("give --classes or --classes-file, not both")
            text = read_input(self.classes_file, "classes file")
            names = tuple(ln.strip() for ln in text.splitlines() if ln.strip())
        problems: list = []
        images = images_under(img_dir, problems)
        if not images and not problems:
            raise SourceError(f"{img_dir}: no image files")
        masks: dict[str, list[str]] = {}
        for m in images_under(mask_dir, problems):
            masks.setdefault(_stem(m, mask_dir, self.mask_suffix), []).append(m)
        records, invalid, paired = [], list(problems), set()
        for f in images:
            key = relative(f, root)
            stem = _stem(f, img_dir, self.image_suffix)
            found = masks.get(stem, [])
            if len(found) != 1:  # (the key names the image: the reason does not repeat it)
                invalid.append((key, f"no mask file {join(str(mask_dir), stem)}{self.mask_suffix}.<ext> in the masks folder: "
                                     f"add the image's mask (same relative path and name) or remove the image"
                                if not found else f"{len(found)} mask files for it ({', '.join(found)}); keep one"))
                continue
            m = found[0]
            paired.add(stem)
            records.append(Record(key=key, path=f, mask=m))
        warnings = []
        orphans = sorted(set(masks) - paired - {_stem(f, img_dir, self.image_suffix) for f in images})
        if orphans:
            warnings.append(f"{len(orphans)} masks in {mask_dir} have no image and are not compiled (e.g. "
                            f"{', '.join(orphans[:3])})")
        wide = False
        if records:
            try:
                with Image.open(io.BytesIO(read_bytes(records[0].mask)) if remote else records[0].mask) as im:
                    wide = im.mode in _WIDE_MODES
            except Exception:  # noqa: BLE001 - the worker reports it, naming the file
                pass
        return ScannedSource(kind="segfolder", root=str(root), task="segmentation", records=records,
                             classes=tuple(names or ()), invalid=tuple(invalid), warnings=tuple(warnings),
                             masks=MaskInfo(classes=tuple(names or ()), wide=wide),
                             summary={"kind": "segfolder", "root": str(root), "images": str(img_dir),
                                      "masks": str(mask_dir), "num_images": len(images),
                                      "unpaired_images": len(invalid)})
