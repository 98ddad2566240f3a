"""Delta Lake tables of image bytes, read through their transaction log with ``deltalake`` (``pip install
'dsc[delta]'``).

A Delta table is Parquet files plus a log saying which of them make up each table version. dsc reads the
log at the version asked for (default: the latest): the files it lists, never the files a later write
removed (they stay on disk until the table's own VACUUM), rows a deletion vector drops left out, partition
columns taken from the log (they are not in the files). The table version is recorded in the dataset's
manifest (``source.table_version``).

``--update`` compares the log at the compiled table version with the log now: files in both are unchanged
(Delta never rewrites a file in place: a rewrite is a remove plus an add), rows of added files are new,
rows of removed files are gone, and a row that reappears in a rewritten file (a DELETE or OPTIMIZE copies
the surviving rows) is recognised by its bytes and kept, not decoded again.
"""
from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import unquote, urlparse

from ...errors import SourceError
from .base import Param, ScannedSource
from .inputs import check_input, is_remote, join, split
from ...store.object import storage_options
from .table import COLUMNS, TableSource, scan_table_files
from ...errors import ConfigError


def _deltalake():
    try:
        import deltalake
    except ImportError:
        raise SourceError("delta sources need the deltalake package: pip install 'dsc[delta]' "
                          "(or pip install deltalake pyarrow)") from None
    return deltalake


def local_path(uri: str) -> str:
    """Where a Delta table (or one of its files) is: a path on this machine (a path or a file:// URI), or the URL
    of a table in object storage (s3://, gs://, az://), kept as text."""
    s = str(uri)
    parsed = urlparse(s)
    if parsed.scheme == "file":
        return unquote(parsed.path)
    if is_remote(s):
        split(s)  # (a scheme dsc has no store for is refused here, naming the ones it has)
        return check_input(s).rstrip("/")
    if parsed.scheme and len(parsed.scheme) > 1:  # (one letter: a Windows drive)
        raise SourceError(f"{s}: dsc reads Delta tables on a local or mounted file system or in s3://, gs:// or "
                          f"az:// object storage")
    return os.path.abspath(check_input(s))


def _options(path: str) -> dict | None:
    """deltalake's storage options for a table in object storage: the credentials and endpoint dsc uses."""
    return storage_options(path) if is_remote(path) else None


def open_table(uri: str, version: int | None = None):
    """The DeltaTable at ``version`` (default: the latest), with errors that name the table."""
    deltalake = _deltalake()
    path = local_path(uri)
    if not is_remote(path) and not os.path.isdir(os.path.join(path, "_delta_log")):
        raise SourceError(f"{uri}: not a Delta table (no _delta_log folder)")
    try:
        return deltalake.DeltaTable(path, version=version, storage_options=_options(path))
    except Exception as e:  # deltalake raises its own DeltaError / TableNotFoundError
        msg = str(e).splitlines()[0]
        if version is not None:
            try:
                latest = deltalake.DeltaTable(path, storage_options=_options(path)).version()
            except Exception:  # noqa: BLE001 - the table itself is unreadable: say so below
                latest = None
            if latest is not None and version > latest:
                raise SourceError(f"{uri}: the table has no version {version}; its latest is {latest}") from None
            raise SourceError(f"{uri}: cannot load table version {version} ({msg}); a version whose log entries "
                              f"the table's log cleanup removed cannot be read") from None
        raise SourceError(f"{uri}: cannot read the Delta table ({msg})") from None


def table_files(dt) -> tuple[list[Path], dict, dict]:
    """The table version's data files (sorted), their partition values, and the rows deletion vectors drop
    ({file: set of rows})."""
    import pyarrow as pa

    config = dt.metadata().configuration or {}
    mode = config.get("delta.columnMapping.mode", "none")
    if mode != "none":
        raise SourceError(f"{dt.table_uri}: the table uses column mapping (mode {mode}); its Parquet column names "
                          f"are not the table's. Rewrite it without column mapping to compile it")
    root = local_path(dt.table_uri)
    remote = is_remote(root)
    actions = pa.table(dt.get_add_actions(flatten=True)).to_pydict()
    partitions = [c for c in actions if c.startswith("partition.")]
    files, constants = [], {}
    for i, rel in enumerate(actions["path"]):
        if os.path.isabs(rel) or "://" in rel:
            f = local_path(rel) if remote else Path(local_path(rel))
        else:  # (a table in object storage: its files as URLs, read by range like a table's)
            f = join(root, unquote(rel)) if remote else Path(root) / unquote(rel)
        files.append(f)
        if partitions:
            constants[str(f)] = {c[len("partition."):]: actions[c][i] for c in partitions}
    dropped: dict[str, set[int]] = {}
    features = getattr(dt.protocol(), "reader_features", None) or []
    if "deletionVectors" in features:
        for batch in pa.RecordBatchReader.from_stream(dt.deletion_vectors()):
            for uri, keep in zip(batch.column("filepath").to_pylist(), batch.column("selection_vector").to_pylist()):
                where = local_path(uri)
                dropped[where if remote else str(Path(where))] = {row for row, k in enumerate(keep) if not k}
    order = sorted(range(len(files)), key=lambda i: str(files[i]))
    return [files[i] for i in order], constants, dropped


class DeltaSource(TableSource):
    """A Delta Lake table of image bytes at a table version (default: the latest). Needs dsc[delta].

    The table's log decides which Parquet files and rows make up the version; --update decodes only the
    rows of files added since the compiled table version."""

    name = "delta"
    task = "classification"
    update_free = ("version",)
    params = (
        Param("uri", "The Delta table: a folder with a _delta_log (or a file:// URI), or its URL in object storage "
                     "(s3://, gs://, az://).", type="str", required=True,
              argument=True, metavar="TABLE_URI"),
        Param("image_column", "Column of encoded image bytes (or Hugging Face Image structs).", default="image"),
        Param("label_column", "Integer class column (a partition column works too).", default="label"),
        Param("no_label", "The table has no labels (images only).", type="flag", default=False, python=False),
        Param("key_column", "Column stored as each sample's key (default: file#row). A stable id column makes "
                            "--update's matching exact across table rewrites."),
        Param("classes", "Comma-separated class names (default: the label values).", type="csv"),
        Param("version", "The table version to compile (default: the latest).", type="int"),
        COLUMNS,
    )

    def scan(self) -> ScannedSource:
        if self.version is not None and self.version < 0:

            raise ConfigError(f"delta: version is a table version 0, 1, 2...; got {self.version}")
        dt = open_table(self.uri, self.version)
        files, constants, dropped = table_files(dt)
        if not files:
            raise SourceError(f"{self.uri}: table version {dt.version()} has no data files")
        scanned = scan_table_files(files, "delta", local_path(self.uri), self.image_column, self.label_column,
                                   self.key_column, self.classes, constants, columns=self.columns or (),
                                   summary={"uri": local_path(self.uri), "table_version": dt.version(),
                                            "deleted_rows": sum(map(len, dropped.values()))})
        if dropped:
            from dataclasses import replace

            records = [r for r in scanned.records if r.row not in dropped.get(r.path, ())]
            scanned = replace(scanned, records=records, summary={**scanned.summary, "rows": len(records)})
        return scanned

    def unchanged_since(self, summary: dict) -> set[str] | None:
        """The data files the table version compiled before (its manifest's ``summary``) shares with the one
        scanned now: Delta files are immutable, so their rows are unchanged. None when the old version's
        log is gone (the update then compares files as for any table)."""
        old = summary.get("table_version")
        if not isinstance(old, int) or summary.get("uri") is None:
            return None
        try:
            before, _, dropped_before = table_files(open_table(self.uri, old))
            now, _, dropped_now = table_files(open_table(self.uri, self.version))
        except SourceError:
            return None
        same = {str(f) for f in set(before) & set(now)}
        return {f for f in same if dropped_before.get(f, set()) == dropped_now.get(f, set())}
