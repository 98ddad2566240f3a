"""Sources turn an input dataset into ordered records. One module per source, one registry line."""
from .base import Record, ScannedSource, Target, drop_empty
from .coco import scan_coco
from .dataset import scan_dataset
from .imagefolder import scan_imagefolder
from .table import scan_table
from .voc import scan_voc
from .yolo import scan_yolo

SOURCES = {"imagefolder": scan_imagefolder, "coco": scan_coco, "yolo": scan_yolo, "voc": scan_voc,
           "table": scan_table, "dataset": scan_dataset}

__all__ = ["drop_empty", "Record", "ScannedSource", "SOURCES", "Target", "scan_coco", "scan_dataset", "scan_table", "scan_imagefolder", "scan_voc", "scan_yolo"]
