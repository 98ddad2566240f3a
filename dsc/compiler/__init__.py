"""Sources -> decode/resize -> shard writers. Imports formats/, never runtime/."""
from __future__ import annotations

import os

from .compile import compile_dataset
from .options import CompileOptions, CompileReport
from .staging import check_output
from .sources import (SOURCES, Record, ScannedSource, drop_empty, scan_coco, scan_dataset, scan_imagefolder,
                      scan_table, scan_voc, scan_yolo)


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


def compile_table(path, out, image_column: str = "image", label_column: str | None = "label",
                  key_column: str | None = None, classes=None, **options) -> CompileReport:
    """Compile a Parquet / Arrow table of image bytes (needs pyarrow)."""
    return _compile(lambda: scan_table(path, image_column, label_column, key_column, classes), out, False, options)


def compile(source, out, classes=None, **options) -> CompileReport:  # noqa: A001 - dsc.compile
    """Compile anything: an ImageFolder directory (str / path), or any map-style dataset or iterable of
    ``(image, target)`` samples (see :mod:`dsc.compiler.sources.dataset`). Keywords: CompileOptions."""
    if isinstance(source, (str, os.PathLike)):
        return compile_imagefolder(source, out, **options)
    opts = CompileOptions(**options)
    check_output(out, opts.overwrite)
    scanned, dataset = scan_dataset(source, classes=classes)
    return compile_dataset(scanned, out, opts, dataset=dataset)


def _compile(scan, out, drop_empty_images: bool, options: dict) -> CompileReport:
    opts = CompileOptions(**options)
    check_output(out, opts.overwrite)
    scanned = scan()
    return compile_dataset(drop_empty(scanned) if drop_empty_images else scanned, out, opts)


__all__ = ["compile", "compile_table", "compile_coco", "compile_yolo", "compile_voc", "CompileOptions", "CompileReport", "Record", "ScannedSource", "SOURCES", "check_output",
           "compile_dataset", "compile_imagefolder", "scan_imagefolder"]
