"""Tables of image bytes: Parquet or Arrow IPC files (Hugging Face datasets exports, Daft, Delta Lake's
Parquet files...), one image a row. Needs ``pyarrow`` (``pip install dsc[table]``).

The image column holds raw encoded bytes, or Hugging Face's Image struct ``{"bytes", "path"}``. The label
column is an integer class index; class names come from ``classes``, else from a Hugging Face ClassLabel
in the schema metadata, else are the label values as text. Keys are the ``key_column``, else ``file#row`` (file: its path in the table folder). Workers read only the row groups their shard needs.
"""
from __future__ import annotations

import copy
import io
import json
import os
import threading
from pathlib import Path

from ...errors import SampleError, SourceError
from .base import Item, Param, Record, ScannedSource, Source, where
from .columns import column_specs, column_values
from .inputs import (check_input, identity, is_prefix, is_remote, list_objects, name_of, open_input, read_tail,
                     remembered)


TABLE_SUFFIXES = (".parquet", ".arrow", ".feather", ".ipc")


def table_files(path: str | Path) -> list[Path]:
    """The table's files: ``path`` itself, or the table files below a folder; a URL (one object, or the objects
    under a prefix) gives URLs, read by range (see inputs.py)."""
    if is_remote(check_input(path)):
        url = check_input(path)
        tail = None
        if url.endswith(".parquet"):  # (its footer by one GET, which says the object is there: no HEAD first)
            tail = read_tail(url, FOOTER_BYTES)
            if tail is not None:
                _TAILS[url] = (identity(url), tail)
                return [url]
        elif url.endswith(TABLE_SUFFIXES) and not is_prefix(url):
            return [url]
        listed = list_objects(url)
        files = [u for u, _ in listed if u.endswith(TABLE_SUFFIXES)]
        if not files:
            if url.endswith(".parquet") and not listed:  # (read_tail found no such object)
                raise SourceError(f"{url}: no such object (and no objects under it as a prefix)")
            raise SourceError(f"{url}: no .parquet or .arrow objects under this prefix (or no such object)")
        return files
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


def _opened(path, tail: bytes | None = None):
    """What pyarrow reads: the local path, or the object as a seekable file read by ranges: each read of
    pyarrow's one range request for exactly its bytes (they are few and large: the footer, column chunks), but
    for those inside ``tail`` (its last bytes, already read)."""
    return open_input(path, buffer=0, tail=tail) if is_remote(path) else path


# A Parquet file's last bytes read to find its footer: pyarrow's own first read of a footer (64 KiB), so that one
# request holds the footer of most files. ``_TAILS``: those a scan's check that a URL names a file read (url ->
# (its identity, the bytes)), taken by the footer's read: the first requests of a Parquet URL, one GET, no HEAD.
FOOTER_BYTES = 64 << 10
_TAILS: dict = {}


# What a process (a compile worker) keeps of the Parquet files it reads, by (path, identity): each file's footer,
# read once, and the image column of the last row groups read, so that units sharing a row group (a shard of
# fewer rows than a row group) read and decompress it once, in object storage one request, not one per unit.
_FOOTERS: dict = {}
_GROUPS: "dict[tuple, object]" = {}  # (path, identity, column, group) -> the group's rows of the column, LRU order
KEEP_GROUP_BYTES = 256 << 20
KEEP_FOOTERS = 256


def _footer(path: str):
    """(the Parquet file's metadata, the file's identity): read once per process and version of the file."""
    pq = _pyarrow()
    tail = None
    if is_remote(path):
        ident, tail = _TAILS.pop(path, (None, None))
        if tail is not None and ident != identity(path):
            tail = None
        if tail is None and not remembered(path):  # (size and ETag unknown: from the footer's GET, not a HEAD)
            tail = read_tail(path, FOOTER_BYTES)
            if tail is None:
                raise SourceError(f"{path}: no such file (no such object)")
    key = (path, identity(path))
    meta = _FOOTERS.get(key)
    if meta is None:
        meta = pq.ParquetFile(_opened(path, tail)).metadata
        with _KEEP_LOCK:
            if len(_FOOTERS) >= KEEP_FOOTERS:
                _FOOTERS.pop(next(iter(_FOOTERS)), None)
            _FOOTERS[key] = meta
    return meta, key[1]


_KEEP_LOCK = threading.Lock()  # (a Dask worker runs units on several threads)


def _keep_group(key: tuple, column) -> None:
    with _KEEP_LOCK:
        _GROUPS.pop(key, None)
        _GROUPS[key] = column
        while sum(c.nbytes for c in _GROUPS.values()) > KEEP_GROUP_BYTES and len(_GROUPS) > 1:
            _GROUPS.pop(next(iter(_GROUPS)))


def _chunks(meta, columns) -> list[tuple[int, int]]:
    """The byte ranges [start, end) of ``columns``' chunks in every row group (what reading them reads)."""
    out = []
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        for i in range(group.num_columns):
            c = group.column(i)
            if c.path_in_schema.split(".")[0] in columns:
                start = c.dictionary_page_offset if c.has_dictionary_page else c.data_page_offset
                out.append((start, start + c.total_compressed_size))
    return out


def _read_meta_columns(path, columns: list[str]):
    if str(path).endswith(".parquet"):
        pq = _pyarrow()
        if is_remote(path):  # the footer, then the wanted column chunks by range requests, 8 in flight at once
            ident, tail = _TAILS.get(path, (None, None))  # (the chunks would be read one after another, each waiting
            meta = _footer(path)[0]  # for the last; a row group's chunks are side by side: one request, and those in
            src = _opened(path, tail if ident == identity(path) else None)  # the footer's read are not asked again)
            src.prefetch(_chunks(meta, [c for c in columns if c in meta.schema.to_arrow_schema().names]))
            pf = pq.ParquetFile(src, metadata=meta)
        else:
            pf = pq.ParquetFile(path)
        schema = pf.schema_arrow
        have = [c for c in columns if c in schema.names]
        return schema, pf.read(columns=have) if have else None, pf.metadata.num_rows
    table = read_ipc(str(path))
    have = [c for c in columns if c in table.schema.names]
    return table.schema, table.select(have) if have else None, table.num_rows


def scan_table(path: str | os.PathLike, image_column: str = "image", label_column: str | None = "label",
               key_column: str | None = None, classes: list[str] | None = None, columns=()) -> ScannedSource:
    _pyarrow()
    path = check_input(path)
    path = path if is_remote(path) else os.path.abspath(path)
    return scan_table_files(table_files(path), "table", path, image_column, label_column, key_column, classes,
                            columns=columns)


def scan_table_files(files: list[Path], kind: str, root: str, image_column: str, label_column: str | None,
                     key_column: str | None, classes, constants: dict | None = None,
                     summary: dict | None = None, columns=()) -> ScannedSource:
    """The records of a table made of ``files`` (in this order). ``constants``: per file, columns whose value
    is the same for all its rows and not stored in it (a Delta table's partition columns). ``columns``:
    ``NAME[:KIND]`` of the columns stored as value fields (``columns.py``)."""
    records, names, specs = [], None, None
    remote = is_remote(root)
    base = Path(root) if not remote and Path(root).is_dir() else None
    for f in files:
        if remote:
            name = f[len(root.rstrip("/")) + 1:] if f.startswith(root.rstrip("/") + "/") else name_of(f)
        else:
            name = f.relative_to(base).as_posix() if base is not None and f.is_relative_to(base) else f.name
        fixed = (constants or {}).get(str(f), {})
        value_names = [str(c).partition(":")[0].strip() for c in columns or ()]
        wanted = [c for c in (label_column, key_column, *value_names) if c and c not in fixed]
        try:
            schema, table, num_rows = _read_meta_columns(f, wanted)
        except (OSError, ValueError) as e:  # pyarrow's ArrowInvalid is a ValueError
            raise SourceError(f"{f}: not a readable Parquet or Arrow file ({e})") from None
        if image_column not in schema.names:
            raise SourceError(f"{f}: no column {image_column!r} (columns: {', '.join(schema.names)}); "
                              f"pass --image-column")
        for col, flag in ((label_column, "--label-column, or --no-label"), (key_column, "--key-column")):
            if col and col not in schema.names and col not in fixed:
                raise SourceError(f"{f}: no column {col!r} (columns: {', '.join(schema.names)}); pass {flag}")

        def column(col):
            return [fixed[col]] * num_rows if col in fixed else table.column(col).to_pylist()

        names = names or (_hf_class_names(schema, label_column) if label_column else None)
        labels = column(label_column) if label_column else [-1] * num_rows
        keys = column(key_column) if key_column else None
        spec = column_specs(columns, schema, f, {image_column, label_column, key_column}) if columns else {}
        if specs is not None and spec != specs:
            raise SourceError(f"{f}: its --column types differ from the first file's ({spec} vs {specs})")
        specs = spec
        values = [list(zip(spec, row)) for row in zip(*(column_values(table, n, spec[n]) for n in spec))] \
            if spec else None
        for row in range(num_rows):
            label = labels[row]
            if label is None or not isinstance(label, int) or isinstance(label, bool):
                raise SourceError(f"{f} row {row}: label {label!r} is not an integer class index")
            key = str(keys[row]) if keys and keys[row] not in (None, "") else f"{name}#{row}"
            records.append(Record(key=key, path=str(f), label=label, row=row,
                                  fields=tuple(values[row]) if values else ()))
    if not records:
        raise SourceError(f"{root}: the table has no rows")
    if classes:
        names = tuple(classes)
    if label_column and not names:
        names = tuple(str(i) for i in range(max(r.label for r in records) + 1))
    if label_column and any(not 0 <= r.label < len(names) for r in records):
        bad = next(r for r in records if not 0 <= r.label < len(names))
        raise SourceError(f"{bad.path} row {bad.row}: label {bad.label} is not a class index (0..{len(names) - 1})"
                          if bad.label >= 0 else f"{bad.path} row {bad.row}: label {bad.label} is negative; "
                          f"labels are class indices 0..C-1")
    return ScannedSource(kind=kind, root=str(root), task="classification" if label_column else "images",
                         records=records, classes=names or (), fields=specs or {},
                         summary={"kind": kind, "root": str(root), "files": len(files), "rows": len(records),
                                  "image_column": image_column, "label_column": label_column, **(summary or {})})


def read_ipc(path: str):
    """A whole Arrow IPC file or stream as a table, memory-mapped (no copy of the bytes)."""
    import pyarrow as pa

    src = open_input(path) if is_remote(path) else pa.memory_map(str(path))
    try:
        return pa.ipc.open_file(src).read_all()
    except pa.ArrowInvalid:
        src.seek(0)
        return pa.ipc.open_stream(src).read_all()


def _groups_of(meta, lo: int, hi: int) -> tuple[list[int], int]:
    """(the row groups that hold rows [lo, hi), the first row of the first)."""
    groups, start, first = [], 0, None
    for g in range(meta.num_row_groups):
        n = meta.row_group(g).num_rows
        if start < hi and start + n > lo:
            groups.append(g)
            first = start if first is None else first
        start += n
    return groups, first


# Row groups being read now, by a unit or ahead of one: (path, identity, column, group) -> Future of its rows. A
# unit that needs one waits for it rather than reading it again.
_READING: dict = {}


def _groups(path: str, meta, ident, column: str, groups: list[int], wait: bool = True) -> dict:
    """{group: its rows of ``column``} of ``groups``: those kept (or being read) as they are, the others read
    at once, each by a thread of its own (in object storage: one range request each, all in flight together).
    ``wait=False``: start the reads and return (a read-ahead)."""
    from concurrent.futures import Future

    have, mine = {}, []
    with _KEEP_LOCK:
        for g in groups:
            key = (path, ident, column, g)
            have[g] = _GROUPS.get(key)
            if have[g] is None:
                have[g] = _READING.get(key)
            if have[g] is None:
                have[g] = _READING[key] = Future()
                mine.append(g)
    for g in mine:
        threading.Thread(target=_read_group, args=(path, meta, ident, column, g, have[g]), daemon=True,
                         name="dsc-row-group").start()
    if not wait:
        return {}
    return {g: c.result() if isinstance(c, Future) else c for g, c in have.items()}


def _read_group(path: str, meta, ident, column: str, g: int, fut) -> None:
    """Read row group ``g`` of ``column`` into ``fut`` (and keep it), or its error."""
    pq = _pyarrow()
    key = (path, ident, column, g)
    try:
        rows = pq.ParquetFile(_opened(path), metadata=meta).read_row_group(g, columns=[column]).column(column)
    except BaseException as e:  # noqa: BLE001 - the unit waiting for it raises it
        with _KEEP_LOCK:
            _READING.pop(key, None)
        fut.set_exception(e)
        return
    _keep_group(key, rows)
    with _KEEP_LOCK:
        _READING.pop(key, None)
    fut.set_result(rows)


def read_ahead(path: str, column: str, lo: int, hi: int) -> None:
    """Start reading, in the background, the Parquet row groups that hold rows [lo, hi) of ``column`` (the rows
    of the unit a worker will probably run next): their requests overlap this unit's decoding."""
    if path.endswith((".arrow", ".feather", ".ipc")):
        return
    meta, ident = _footer(path)
    _groups(path, meta, ident, column, _groups_of(meta, lo, hi)[0], wait=False)


def read_table_column(path: str, column: str, lo: int, hi: int) -> list:
    """Rows [lo, hi) of one column of a Parquet or Arrow IPC file, as Python values."""
    import pyarrow as pa

    if path.endswith((".arrow", ".feather", ".ipc")):
        with (open_input(path) if is_remote(path) else pa.memory_map(path)) as src:
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
    meta, ident = _footer(path)  # (from object storage: the footer once, then only these row groups, by range)
    groups, first = _groups_of(meta, lo, hi)
    have = _groups(path, meta, ident, column, groups)
    for g in groups:  # (the most recently used last)
        _keep_group((path, ident, column, g), have[g])
    import pyarrow as pa

    rows = pa.chunked_array([c for g in groups for c in have[g].chunks], type=have[groups[0]].type)
    return rows.slice(lo - first, hi - lo).to_pylist()


def image_bytes(value, at: str) -> bytes:
    """Binary, or a Hugging Face Image struct {"bytes", "path"}."""
    if isinstance(value, dict):
        value = value.get("bytes")
    if isinstance(value, (bytes, bytearray, memoryview)) and len(value):
        return bytes(value)
    raise SampleError(at, "the image cell holds no image bytes")


COLUMNS = Param("columns", "A column stored as a field: NAME or NAME:KIND (KIND: a numpy dtype such as float32, "
                           "text, json, bytes, DTYPE[SHAPE] for an array, DTYPE[] for ragged; omitted: from the "
                           "Hugging Face features or the Arrow type). Repeat it for more columns.",
                type="csv", flag="--column", multiple=True, metavar="NAME[:KIND]")


class TableSource(Source):
    """A Parquet / Arrow table (a file or a folder of files) of image bytes. Needs dsc[table].

    PATH may be in object storage (s3://, gs://, az://: a file, or a prefix of files). Workers read only the
    Parquet row groups / Arrow record batches of their shard."""

    name = "table"
    task = "classification"
    rows_in_files = True
    shares_reads = True  # (a row group holds several units' rows: read once by the worker that runs them)
    params = (
        Param("path", "A Parquet or Arrow IPC file, or a folder of them.", type="path", required=True, argument=True),
        Param("image_column", "Column of encoded image bytes (or Hugging Face Image structs).", default="image"),
        Param("label_column", "Integer class column.", default="label"),
        Param("no_label", "The table has no labels (images only).", type="flag", default=False, python=False),
        Param("key_column", "Column stored as each sample's key (default: file#row)."),
        Param("classes", "Comma-separated class names (default: the table's ClassLabel).", type="csv"),
        COLUMNS,
    )

    @classmethod
    def from_cli(cls, no_label: bool = False, **kwargs) -> "TableSource":
        return cls(**{**kwargs, "label_column": None if no_label else kwargs.get("label_column")})

    def scan(self) -> ScannedSource:
        return self.kept_footers(scan_table(self.path, self.image_column, self.label_column, self.key_column,
                                            self.classes, self.columns or ()))

    def kept_footers(self, scanned: ScannedSource) -> ScannedSource:
        """``scanned``, the footers the scan read of its own Parquet files in a bucket kept on the source
        (``footers``; not those of other tables this process read): the source travels to each of a pool's workers
        once (pickled when the pool starts), so a worker reads a file's footer from them, not by a GET of its own.
        A cluster's tasks carry the source without them (``per_task``): each worker reads a footer once."""
        paths = {r.path for r in scanned.records if is_remote(r.path)}
        with _KEEP_LOCK:
            self.footers = {k: m for k, m in _FOOTERS.items() if k[0] in paths}
        self._seeded_in = None  # (new footers: seeded again where they are used)
        return scanned

    def per_task(self) -> "TableSource":
        """Without the scan's footers: a cluster pickles the source with every task (each task would carry every
        footer of the table); its workers read each footer once and keep it (``_FOOTERS``)."""
        if not getattr(self, "footers", None):
            return self
        light = copy.copy(self)
        light.footers = {}
        return light

    def _seed_footers(self) -> None:
        """The scan's footers (``footers``) into this process's ``_FOOTERS``, once a process: a pool's worker gets
        the source once and runs many units (and prefetches) with it; a copy unpickled in another process seeds
        there again."""
        footers = getattr(self, "footers", None)
        if footers and getattr(self, "_seeded_in", None) != os.getpid():
            with _KEEP_LOCK:
                for k, m in footers.items():
                    if len(_FOOTERS) < KEEP_FOOTERS:
                        _FOOTERS.setdefault(k, m)
            self._seeded_in = os.getpid()

    def fetcher(self, records: list[Record]):
        """Reads the unit's rows, only the row groups / record batches that hold them, in one go."""
        self._seed_footers()
        by_file: dict[str, list[int]] = {}
        for r in records:
            by_file.setdefault(r.path, []).append(r.row)
        data = {}
        for path, rows in by_file.items():
            lo, hi = min(rows), max(rows) + 1
            try:
                values = read_table_column(path, self.image_column, lo, hi)
            except (OSError, ValueError, KeyError) as e:  # pyarrow's ArrowInvalid is a ValueError
                raise SourceError(f"{path}: cannot read rows {lo}..{hi - 1} of column {self.image_column!r}: "
                                  f"{e}") from None
            for row in rows:
                data[(path, row)] = values[row - lo]

        def table_item(r: Record) -> Item:
            buf = io.BytesIO(image_bytes(data[(r.path, r.row)], where(r)))
            buf.name = where(r)  # error messages name the table row
            return Item(buf, r.label, r.target)
        return table_item

    def prefetch(self, records: list[Record]) -> None:
        """Start reading the row groups of ``records`` (the unit this worker will probably run next)."""
        self._seed_footers()
        by_file: dict[str, list[int]] = {}
        for r in records:
            by_file.setdefault(r.path, []).append(r.row)
        for path, rows in by_file.items():
            try:
                read_ahead(path, self.image_column, min(rows), max(rows) + 1)
            except (OSError, ValueError, KeyError):  # (said by the unit that reads them, if it does)
                pass
