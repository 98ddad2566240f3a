"""Sources turn an input dataset into ordered records. One module per source, one registry line."""
from .base import Record, ScannedSource, Target, drop_empty
from .coco import scan_coco
from .imagefolder import scan_imagefolder
from .voc import scan_voc
from .yolo import scan_yolo

SOURCES = {"imagefolder": scan_imagefolder, "coco": scan_coco, "yolo": scan_yolo, "voc": scan_voc}

__all__ = ["drop_empty", "Record", "ScannedSource", "SOURCES", "Target", "scan_coco", "scan_imagefolder", "scan_voc", "scan_yolo"]
