"""Sources -> decode/resize -> shard writers. Imports formats/, never runtime/."""
from __future__ import annotations

import os

from .compile import compile_dataset
from .options import CompileOptions, CompileReport
from .staging import check_output
from .sources import SOURCES, Record, ScannedSource, drop_empty, scan_coco, scan_imagefolder, scan_voc, scan_yolo


def compile_imagefolder(src: str | os.PathLike, out: str | os.PathLike, **options) -> CompileReport:
    """Compile a torchvision-style ImageFolder tree. Keywords are :class:`CompileOptions` fields."""
    return _compile(lambda: scan_imagefolder(src), out, False, options)


def compile_coco(annotations, images, out, keep_category_ids: bool = False, drop_empty_images: bool = False,
                 **options) -> CompileReport:
    """Compile a COCO detection set (instances JSON + images folder)."""
    return _compile(lambda: scan_coco(annotations, images, keep_category_ids), out, drop_empty_images, options)


def compile_yolo(root, out, split: str = "train", data_yaml=None, classes_file=None,
                 drop_empty_images: bool = False, **options) -> CompileReport:
    """Compile a YOLO (Ultralytics layout) split."""
    return _compile(lambda: scan_yolo(root, split, data_yaml, classes_file), out, drop_empty_images, options)


def compile_voc(root, out, split: str = "trainval", classes=None, drop_empty_images: bool = False,
                **options) -> CompileReport:
    """Compile a Pascal VOC split."""
    return _compile(lambda: scan_voc(root, split, classes), out, drop_empty_images, options)


def _compile(scan, out, drop_empty_images: bool, options: dict) -> CompileReport:
    opts = CompileOptions(**options)
    check_output(out, opts.overwrite)
    scanned = scan()
    return compile_dataset(drop_empty(scanned) if drop_empty_images else scanned, out, opts)


__all__ = ["compile_coco", "compile_yolo", "compile_voc", "CompileOptions", "CompileReport", "Record", "ScannedSource", "SOURCES", "check_output",
           "compile_dataset", "compile_imagefolder", "scan_imagefolder"]
