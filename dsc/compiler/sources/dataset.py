"""Any map-style Python dataset (a ``torch.utils.data.Dataset``, a list...) whose items are
``(image, target)``: the image a PIL image, a uint8 array (H, W[, C]) or a uint8 tensor (C, H, W); the
target a class index (classification) or a dict with ``boxes`` (k, 4) xyxy pixels and ``labels`` (k,)
(detection). An iterable without ``__getitem__`` is read into a list first.

Items are fetched in the worker processes (the dataset is inherited when they fork), so the dataset
is not pickled. Class names come from ``dataset.classes`` when it has them; keys from
``dataset.samples[i][0]`` (torchvision's folder datasets) or the index.
"""
from __future__ import annotations

from ...errors import SourceError
from .base import Record, ScannedSource


def as_map_style(dataset):
    if hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__"):
        return dataset
    if hasattr(dataset, "__iter__"):
        return list(dataset)
    raise SourceError(f"{type(dataset).__name__} is neither a map-style dataset nor an iterable of samples")


def scan_dataset(dataset, classes=None, task: str | None = None) -> ScannedSource:
    """Records for every index; the task is read from the first item unless given."""
    from ..inputs import _dataset_item

    dataset = as_map_style(dataset)
    n = len(dataset)
    if n == 0:
        raise SourceError("the dataset is empty")
    if task is None:
        first = _dataset_item(dataset, Record(key="0", path="", row=0))
        task = "detection" if first.target is not None else "classification"
    samples = getattr(dataset, "samples", None)
    keys = [str(samples[i][0]) for i in range(n)] if isinstance(samples, list) and len(samples) == n else None
    records = [Record(key=keys[i] if keys else str(i), path="", row=i) for i in range(n)]
    names = tuple(classes or getattr(dataset, "classes", None) or ())
    return ScannedSource(kind="dataset", root=type(dataset).__name__, task=task, records=records,
                         classes=tuple(str(c) for c in names),
                         input={"kind": "dataset", "task": task, "num_classes": len(names) or None},
                         summary={"kind": "dataset", "type": type(dataset).__name__, "num_samples": n})
