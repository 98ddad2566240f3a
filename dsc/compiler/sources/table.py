"""Tables of image bytes: Parquet or Arrow IPC files (Hugging Face datasets exports, Daft, Delta Lake's
Parquet files...), one image a row. Needs ``pyarrow`` (``pip install dsc[table]``).

The image column holds raw encoded bytes, or Hugging Face's Image struct ``{"bytes", "path"}``. The label
column is an integer class index; class names come from ``classes``, else from a Hugging Face ClassLabel
in the schema metadata, else are the label values as text. Keys are the ``key_column``, else ``file#row``. Workers read only the row groups their shard needs.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from ...errors import SourceError
from .base import Record, ScannedSource


def table_files(path: str | Path) -> list[Path]:
    p = Path(path)
    if p.is_dir():
        files = sorted(f for f in p.rglob("*") if f.suffix in (".parquet", ".arrow", ".feather", ".ipc"))
        if not files:
            raise SourceError(f"{p}: no .parquet or .arrow files in this folder")
        return files
    if not p.exists():
        raise SourceError(f"{p}: no such table file")
    return [p]


def _pyarrow():
    try:
        import pyarrow  # noqa: F401
        import pyarrow.parquet as pq
    except ImportError:
        raise SourceError("table sources need pyarrow: pip install 'dsc[table]' (or pip install pyarrow)") from None
    return pq


def _hf_class_names(schema, label_column: str):
    meta = (schema.metadata or {}).get(b"huggingface")
    if not meta:
        return None
    try:
        feature = json.loads(meta)["info"]["features"][label_column]
    except (KeyError, ValueError, TypeError):
        return None
    names = feature.get("names") if isinstance(feature, dict) else None
    return tuple(names) if names else None


def _read_meta_columns(path: Path, columns: list[str]):
    from ..inputs import read_ipc

    if path.suffix == ".parquet":
        pq = _pyarrow()
        pf = pq.ParquetFile(path)
        schema = pf.schema_arrow
        have = [c for c in columns if c in schema.names]
        return schema, pf.read(columns=have) if have else None, pf.metadata.num_rows
    table = read_ipc(str(path))
    have = [c for c in columns if c in table.schema.names]
    return table.schema, table.select(have) if have else None, table.num_rows


def scan_table(path: str | os.PathLike, image_column: str = "image", label_column: str | None = "label",
               key_column: str | None = None, classes: list[str] | None = None) -> ScannedSource:
    _pyarrow()
    path = os.path.abspath(path)
    files = table_files(path)
    records, names = [], None
    for f in files:
        wanted = [c for c in (label_column, key_column) if c]
        try:
            schema, table, num_rows = _read_meta_columns(f, wanted)
        except (OSError, ValueError) as e:  # pyarrow's ArrowInvalid is a ValueError
            raise SourceError(f"{f}: not a readable Parquet or Arrow file ({e})") from None
        if image_column not in schema.names:
            raise SourceError(f"{f}: no column {image_column!r} (columns: {', '.join(schema.names)}); "
                              f"pass --image-column")
        for col, flag in ((label_column, "--label-column, or --no-label"), (key_column, "--key-column")):
            if col and col not in schema.names:
                raise SourceError(f"{f}: no column {col!r} (columns: {', '.join(schema.names)}); pass {flag}")
        names = names or (_hf_class_names(schema, label_column) if label_column else None)
        labels = table.column(label_column).to_pylist() if label_column else [-1] * num_rows
        keys = table.column(key_column).to_pylist() if key_column else None
        for row in range(num_rows):
            label = labels[row]
            if label is None or not isinstance(label, int):
                raise SourceError(f"{f} row {row}: label {label!r} is not an integer class index")
            key = str(keys[row]) if keys and keys[row] not in (None, "") else f"{f.name}#{row}"
            records.append(Record(key=key, path=str(f), label=label, row=row))
    if not records:
        raise SourceError(f"{path}: the table has no rows")
    if classes:
        names = tuple(classes)
    if label_column and not names:
        names = tuple(str(i) for i in range(max(r.label for r in records) + 1))
    if label_column and any(not 0 <= r.label < len(names) for r in records):
        bad = next(r for r in records if not 0 <= r.label < len(names))
        raise SourceError(f"{bad.path} row {bad.row}: label {bad.label} is not a class index (0..{len(names) - 1})"
                          if bad.label >= 0 else f"{bad.path} row {bad.row}: label {bad.label} is negative; "
                          f"labels are class indices 0..C-1")
    return ScannedSource(kind="table", root=str(path), task="classification" if label_column else "images",
                         records=records, classes=names or (), input={"kind": "table", "column": image_column},
                         summary={"kind": "table", "root": str(path), "files": len(files), "rows": len(records),
                                  "image_column": image_column, "label_column": label_column})
