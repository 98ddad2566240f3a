"""Sources -> decode/resize -> shard writers. Imports formats/, never runtime/."""
from __future__ import annotations

import os

from .compile import compile_dataset
from .options import CompileOptions, CompileReport
from .sources.dataset import as_map_style
from .staging import check_output
from .sources import (SOURCES, Record, ScannedSource, drop_empty, scan_coco, scan_dataset, scan_imagefolder,
                      scan_table, scan_voc, scan_yolo)


def compile_imagefolder(src: str | os.PathLike, out: str | os.PathLike, **options) -> CompileReport:
    """Compile a torchvision-style ImageFolder tree. Keywords are :class:`CompileOptions` fields."""
    return compile_source(lambda: scan_imagefolder(src), out, CompileOptions(**options))


def compile_coco(annotations, images, out, keep_category_ids: bool = False, drop_empty_images: bool = False,
                 **options) -> CompileReport:
    """Compile a COCO detection set (instances JSON + images folder)."""
    return compile_source(lambda: scan_coco(annotations, images, keep_category_ids), out, CompileOptions(**options),
                          drop_empty_images)


def compile_yolo(root, out, split: str = "train", data_yaml=None, classes_file=None,
                 drop_empty_images: bool = False, **options) -> CompileReport:
    """Compile a YOLO (Ultralytics layout) split."""
    return compile_source(lambda: scan_yolo(root, split, data_yaml, classes_file), out, CompileOptions(**options),
                          drop_empty_images)


def compile_voc(root, out, split: str = "trainval", classes=None, drop_empty_images: bool = False,
                **options) -> CompileReport:
    """Compile a Pascal VOC split."""
    return compile_source(lambda: scan_voc(root, split, classes), out, CompileOptions(**options), drop_empty_images)


def compile_table(path, out, image_column: str = "image", label_column: str | None = "label",
                  key_column: str | None = None, classes=None, **options) -> CompileReport:
    """Compile a Parquet / Arrow table of image bytes (needs pyarrow)."""
    return compile_source(lambda: scan_table(path, image_column, label_column, key_column, classes), out,
                          CompileOptions(**options))


def compile(source, out, classes=None, **options) -> CompileReport:  # noqa: A001 - dsc.compile
    """Compile anything: an ImageFolder directory (str / path), or any map-style dataset or iterable of
    ``(image, target)`` samples (see :mod:`dsc.compiler.sources.dataset`). Keywords: CompileOptions."""
    if isinstance(source, (str, os.PathLike)):
        return compile_imagefolder(source, out, **options)
    dataset = as_map_style(source)  # an iterable becomes a list once, before the scan and the workers
    return compile_source(lambda: scan_dataset(dataset, classes=classes), out, CompileOptions(**options),
                          dataset=dataset)


def compile_source(scan, out, options: CompileOptions, drop_empty_images: bool = False, warn=None,
                   dataset=None) -> CompileReport:
    """The one compile flow every entry point (Python and CLI) goes through: refuse an existing OUT
    before a possibly long ``scan()``, hand the source's warnings to ``warn``, compile.
    ``dataset``: the (map-style) Python dataset of a dataset source."""
    check_output(out, options.overwrite)
    scanned = scan()
    if drop_empty_images:
        scanned = drop_empty(scanned)
    for w in scanned.warnings:
        if warn is not None:
            warn(w)
    return compile_dataset(scanned, out, options, warn=warn, dataset=dataset)


__all__ = ["compile", "compile_source", "compile_table", "compile_coco", "compile_yolo", "compile_voc", "CompileOptions", "CompileReport", "Record", "ScannedSource", "SOURCES", "check_output",
           "compile_dataset", "compile_imagefolder", "scan_imagefolder"]
