"""Where a record's pixels come from: a file, a row of a table of image bytes, or an item of a Python
dataset. A work unit asks ``fetcher(records, spec)`` for a function record -> Item once, so a table unit
reads its rows in one go and a dataset unit calls ``dataset[i]`` in the worker.
"""
from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np

from ..errors import SampleError, SourceError
from .sources.base import Record, Target

_DATASET = None  # the map-style dataset of a dataset compile, set before the worker pool forks


def set_dataset(dataset) -> None:
    global _DATASET
    _DATASET = dataset


def where(r: Record) -> str:
    """A record's origin for messages: its file, or its table row / dataset index."""
    if r.row < 0:
        return r.path
    return _table_row(r.path, r.row) if r.path else f"dataset[{r.row}]"


def _table_row(path: str, row: int) -> str:
    return f"{path} row {row}"


@dataclass
class Item:
    obj: object  # a path, a binary file object, or an already decoded PIL image
    label: int
    target: Target | None
    decoded: bool = False


def fetcher(records: list[Record], spec: dict):
    kind = spec.get("kind", "file")
    if kind == "file":
        return lambda r: Item(r.path, r.label, r.target)
    if kind == "table":
        data = _table_rows(records, spec["column"])

        def table_item(r: Record) -> Item:
            buf = io.BytesIO(data[(r.path, r.row)])
            buf.name = where(r)  # error messages name the table row
            return Item(buf, r.label, r.target)
        return table_item
    if kind == "dataset":
        return lambda r: _dataset_item(_DATASET, r, spec)
    raise SourceError(f"unknown input kind {kind!r}")


# ----------------------------------------------------------------------------- tables
def _table_rows(records: list[Record], column: str) -> dict:
    """{(file, row): image bytes} for the unit's rows, reading only the row groups / batches they need."""
    by_file: dict[str, list[int]] = {}
    for r in records:
        by_file.setdefault(r.path, []).append(r.row)
    out = {}
    for path, rows in by_file.items():
        lo, hi = min(rows), max(rows) + 1
        try:
            values = read_table_column(path, column, lo, hi)
        except (OSError, ValueError, KeyError) as e:  # pyarrow's ArrowInvalid is a ValueError
            raise SourceError(f"{path}: cannot read rows {lo}..{hi - 1} of column {column!r}: {e}") from None
        for row in rows:
            out[(path, row)] = image_bytes(values[row - lo], path, row)
    return out


def read_ipc(path: str):
    """A whole Arrow IPC file or stream as a table, memory-mapped (no copy of the bytes)."""
    import pyarrow as pa

    src = pa.memory_map(str(path))
    try:
        return pa.ipc.open_file(src).read_all()
    except pa.ArrowInvalid:
        src.seek(0)
        return pa.ipc.open_stream(src).read_all()


def read_table_column(path: str, column: str, lo: int, hi: int) -> list:
    """Rows [lo, hi) of one column of a Parquet or Arrow IPC file, as Python values."""
    import pyarrow as pa

    if path.endswith((".arrow", ".feather", ".ipc")):
        with pa.memory_map(path) as src:
            try:  # IPC file format: random access to the record batches that hold rows [lo, hi)
                reader = pa.ipc.open_file(src)
                out, start = [], 0
                for b in range(reader.num_record_batches):
                    batch = reader.get_batch(b)
                    n = batch.num_rows
                    if start < hi and start + n > lo:
                        a = max(lo, start) - start
                        out += batch.column(column).slice(a, min(hi, start + n) - start - a).to_pylist()
                    start += n
                    if start >= hi:
                        break
                return out
            except pa.ArrowInvalid:  # IPC stream format (datasets' save_to_disk): sequential only
                src.seek(0)
                return pa.ipc.open_stream(src).read_all().column(column).slice(lo, hi - lo).to_pylist()
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(path)
    groups, start, first = [], 0, None
    for g in range(pf.metadata.num_row_groups):
        n = pf.metadata.row_group(g).num_rows
        if start < hi and start + n > lo:
            groups.append(g)
            first = start if first is None else first
        start += n
    table = pf.read_row_groups(groups, columns=[column])
    return table.column(column).slice(lo - first, hi - lo).to_pylist()


def image_bytes(value, path: str, row: int) -> bytes:
    """Binary, or a Hugging Face Image struct {"bytes", "path"}."""
    if isinstance(value, dict):
        value = value.get("bytes")
    if isinstance(value, (bytes, bytearray, memoryview)) and len(value):
        return bytes(value)
    raise SampleError(_table_row(path, row), "the image cell holds no image bytes")


# ----------------------------------------------------------------------------- python datasets
def _dataset_item(dataset, r: Record, spec: dict | None = None) -> Item:
    """``spec``: {"task", "num_classes"} the items must agree with (the first item decides the task)."""
    at = where(r)
    try:
        sample = dataset[r.row]
    except Exception as e:  # the user's __getitem__ failed: a sample error, reported with the index
        raise SampleError(at, f"__getitem__ raised {type(e).__name__}: {e}") from None
    if not isinstance(sample, (tuple, list)) or len(sample) != 2:
        raise SampleError(at, "expected (image, target) from the dataset")
    image, target = sample
    label, tgt = _target(target, r, at)
    if spec is not None:
        task, n = spec.get("task"), spec.get("num_classes")
        if task == "classification" and tgt is not None:
            raise SampleError(at, "returned a detection target (a dict) in a classification dataset")
        if task == "detection" and tgt is None:
            raise SampleError(at, f"returned a class index ({label}) in a detection dataset; return a dict "
                                     f"with boxes and labels")
        labels = np.atleast_1d(tgt.labels if tgt is not None else label)
        if len(labels) and (labels.min() < 0 or (n and labels.max() >= n)):
            bad = int(labels.min() if labels.min() < 0 else labels.max())
            raise SampleError(at, f"label {bad} is not a class index ({f'0..{n - 1}' if n else 'labels are >= 0'})")
    return Item(to_pil(image, at), label, tgt, decoded=True)


def to_pil(image, where: str):
    from PIL import Image

    if isinstance(image, Image.Image):
        return image
    if not hasattr(image, "detach") and not isinstance(image, np.ndarray):
        if not hasattr(image, "__array__") and not isinstance(image, (list, tuple)):
            raise SampleError(where, f"expected a PIL image, a uint8 array or a uint8 tensor, got "
                                     f"{type(image).__name__}")
    if hasattr(image, "detach"):  # a torch tensor: (C, H, W) as torchvision gives, or (H, W)
        arr = image.detach().cpu().numpy()
        if arr.ndim == 3 and arr.shape[0] in (1, 3, 4) and arr.shape[2] not in (1, 3, 4):
            arr = arr.transpose(1, 2, 0)
    else:
        arr = np.asarray(image)
    if arr.dtype.kind not in "uifb":
        raise SampleError(where, f"expected a PIL image, a uint8 array or a uint8 tensor, got {type(image).__name__}")
    if arr.dtype != np.uint8:
        raise SampleError(where, f"image arrays must be uint8 (got {arr.dtype}); scale them to 0-255 first")
    if arr.ndim == 3 and arr.shape[2] == 1:
        arr = arr[:, :, 0]
    if arr.ndim not in (2, 3) or (arr.ndim == 3 and arr.shape[2] not in (3, 4)):
        raise SampleError(where, f"image array of shape {arr.shape} is not (H, W), (H, W, 3|4) or (3|4, H, W)")
    return Image.fromarray(np.ascontiguousarray(arr))


def _target(target, r: Record, where: str):
    if isinstance(target, dict):
        boxes = np.asarray(_numpy(target.get("boxes", np.zeros((0, 4)))), np.float64).reshape(-1, 4)
        labels = np.asarray(_numpy(target.get("labels", np.zeros(0))), np.int64).reshape(-1)
        if len(labels) != len(boxes):
            raise SampleError(where, f"{len(boxes)} boxes but {len(labels)} labels")
        return -1, Target(boxes=boxes, labels=labels, image_id=r.row, source=where)
    try:
        return int(_numpy(target)), None
    except (TypeError, ValueError):
        raise SampleError(where, f"target {target!r} is neither a class index nor a dict with boxes") from None


def _numpy(x):
    return x.detach().cpu().numpy() if hasattr(x, "detach") else x
