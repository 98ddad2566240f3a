"""Sources -> decode/resize -> shard writers. Imports formats/, never runtime/."""
from __future__ import annotations

import os

from .compile import CompileOptions, CompileReport, check_output, compile_dataset
from .sources import SOURCES, Record, ScannedSource, scan_imagefolder


def compile_imagefolder(src: str | os.PathLike, out: str | os.PathLike, **options) -> CompileReport:
    """Compile a torchvision-style ImageFolder tree. Keywords are :class:`CompileOptions` fields."""
    opts = CompileOptions(**options)
    check_output(out, opts.overwrite)  # fail before walking a large tree
    return compile_dataset(scan_imagefolder(src), out, opts)


__all__ = ["CompileOptions", "CompileReport", "Record", "ScannedSource", "SOURCES", "check_output",
           "compile_dataset", "compile_imagefolder", "scan_imagefolder"]
