"""Sources turn an input dataset into ordered records. One module per source, one registry line."""
from .base import Record, ScannedSource
from .imagefolder import scan_imagefolder

SOURCES = {"imagefolder": scan_imagefolder}

__all__ = ["Record", "ScannedSource", "SOURCES", "scan_imagefolder"]
