"""Where each piece of a dataset lives, relative to its root. docs/FORMAT.md is the prose version."""
from __future__ import annotations


import numpy as np

from ..errors import CorruptDatasetError, DatasetNotFoundError
from ..store.local import as_root
from .manifest import Manifest, ShardSpec
from .names import *  # noqa: F401,F403 - every node's name: layout.IMAGE, layout.LABEL... (their home is names.py)
from .names import IMAGE
from .zarr_v3 import (MAX_JSON_BYTES, ZARR_JSON, parse_json, plain_array_meta, read_node_json, read_plain_array,
                      read_plain_chunk)
from ..store import Store

def table_specs(table) -> list[ShardSpec]:
    """Every shard a format 4 shard table lists, column by column (the whole table read)."""
    return [s for name in table.columns for s in table.column(name) if s is not None]


def shard_specs(manifest: Manifest) -> list[ShardSpec]:
    """Every shard file of the dataset: the image's, then those of each later field (masks). (Reads the whole
    shard table of a format 4 version: for writers, verify and vacuum, never at open.)"""
    table = manifest.shard_table
    if table is not None:
        return table_specs(table)
    extra = [ShardSpec.from_dict(s) for spec in manifest.fields.values() for s in spec.get("shards", ()) if s]
    return [s for s in manifest.shards if s is not None] + extra


def rows_outside_shards(manifest: Manifest, rows) -> "np.ndarray":
    """The ``rows`` (live rows of the version) that no image shard of the version holds, inside its count: a
    writer's bug (what ``Dataset`` checks at open in formats 1-3 and ``dsc verify`` checks in every format)."""
    rows = np.asarray(rows, np.int64)
    K, table = manifest.shard_size, manifest.shard_table
    counts = (table.column(IMAGE).counts() if table is not None
              else np.array([s.count if s is not None else 0 for s in manifest.shards], np.int64))
    slot = rows // K
    bad = slot >= len(counts)
    ok = ~bad
    bad[ok] = (rows[ok] - slot[ok] * K) >= counts[slot[ok]]
    return rows[bad]


def shard_nodes(manifest: Manifest) -> list[str]:
    """The nodes whose shards sit in slot folders (``<node>/c/<slot>``, ``<node>/values/<slot>``): the image and
    every image-like field."""
    if manifest.shard_table is not None:
        return list(manifest.shard_table.columns)
    return [IMAGE, *(name for name, spec in manifest.fields.items() if spec.get("shards") is not None)]


def table_objects(manifest: Manifest) -> list[dict]:
    """The shard table's objects ({sha256, nbytes}) a format 4 version uses (none before format 4)."""
    return manifest.shard_table.objects if manifest.shard_table is not None else []


def implied_files(manifest: Manifest, listed: bool = False):
    """(path, bytes) of each file beside a shard that its table entry implies and ``files`` does not list (with
    ``listed``, also those it lists): a ragged shard's own ``zarr.json`` (format 4; one written before this rule
    is in ``files`` instead). Like the shards, they sit at their slots, shared by the versions that share the
    shard; dsc never reads them (the plain-Zarr view does), so neither the manifest nor the view's root grows
    with them. (Reads the whole table.)"""
    table = manifest.shard_table
    if table is None:
        return
    for name in table.columns:
        geo = table.geometry.get(name)
        if geo is None or geo.fixed:
            continue
        for s, spec in enumerate(table.column(name)):
            meta = geo.meta(s, spec.nbytes) if spec is not None else None
            if meta is not None and (listed or meta[0] not in manifest.files):
                yield meta


def implies(manifest: Manifest, rel: str) -> bool:
    """Whether ``rel`` is a file ``manifest``'s shard table implies (``implied_files``, listed or not), looked up
    by its slot: ``<node>/values/<s>/zarr.json`` of a ragged column whose slot ``s`` holds a shard."""
    table = manifest.shard_table
    parts = rel.split("/")
    if table is None or len(parts) != 4 or parts[1] != "values" or parts[3] != ZARR_JSON or not parts[2].isdigit():
        return False
    geo, s = table.geometry.get(parts[0]), int(parts[2])
    return (geo is not None and not geo.fixed and parts[0] in table.columns and s < table.slots
            and table.column(parts[0])[s] is not None)


def objects(manifest: Manifest) -> list[dict]:
    """Every object ({sha256, nbytes}) the version uses: its small files' and its shard table's."""
    return [*manifest.files.values(), *table_objects(manifest)]


def check_shard_files(root, manifest: Manifest) -> None:
    """The cheap check every reader makes: each shard file exists with the size the manifest records."""
    root = as_root(root)
    for spec in shard_specs(manifest):
        root.check_size(spec.path, spec.nbytes)


def read_manifest(root) -> Manifest:
    """The manifest of the dataset at ``root`` (a path, an open :class:`~dsc.store.local.Root`, or a store: the
    root ``zarr.json`` of its plain-Zarr view)."""

    if isinstance(root, Store) and not root.local:
        try:
            data = root.get(ZARR_JSON, MAX_JSON_BYTES)
        except FileNotFoundError:
            raise DatasetNotFoundError(f"{root.url} is not a dsc dataset: it has no zarr.json") from None
        return _manifest(parse_json(data, root.where(ZARR_JSON)), root.url)
    root = as_root(root.root if isinstance(root, Store) else root)
    if not root.exists(ZARR_JSON):
        raise DatasetNotFoundError(f"{root.path} is not a dsc dataset: it has no zarr.json (an interrupted compile "
                                   f"never leaves one). A folder of images is compiled first: `dsc compile imagefolder "
                                   f"{root.path} OUT` (class folders; `dsc compile --help` lists coco, voc, yolo, "
                                   f"table...), then dsc.open(OUT)")
    manifest = _manifest(read_node_json(root, ""), root.path)
    root.expected = {rel: f["nbytes"] for rel, f in manifest.files.items()}  # every later whole-file read: that size
    return manifest


def _manifest(meta, where) -> Manifest:
    attrs = meta.get("attributes") if isinstance(meta, dict) else None
    if not isinstance(meta, dict) or meta.get("node_type") != "group" or not isinstance(attrs, dict) or "dsc" not in attrs:
        raise DatasetNotFoundError(f"{where} is a Zarr node but not a dsc dataset (no 'dsc' manifest attribute)")
    return Manifest.from_dict(attrs["dsc"])


class Arrays:
    """An open version's files as the field readers read them (``formats/fields``): ``array(rel, shape)``, a
    small array read whole and checked to have ``shape``; ``map(rel, nbytes)``, a shard's bytes; ``dir``, the
    files (a :class:`~dsc.store.local.Root`, or a store's files); ``root``, its name in messages. The runtime's
    storage builds on it (mapping shards once, pinning the version); an update reads its base through it."""

    def __init__(self, files):
        self._dir = files
        self.root = files.path

    @property
    def dir(self):
        return self._dir

    def array(self, rel: str, shape: tuple):
        arr = read_plain_array(self.dir, rel)
        if arr.shape != tuple(shape):
            raise CorruptDatasetError(f"{self.root}/{rel} has shape {arr.shape}, expected {tuple(shape)}")
        return arr

    def check_array(self, rel: str, shape: tuple) -> tuple[tuple, np.dtype]:
        """What ``array`` checks of ``rel`` before its data: its metadata, and that it has ``shape`` (at open, for
        an array read when first used); its (shape, dtype), for :meth:`checked_array`."""
        got, dtype = plain_array_meta(self.dir, rel)
        if got != tuple(shape):
            raise CorruptDatasetError(f"{self.root}/{rel} has shape {got}, expected {tuple(shape)}")
        return got, dtype

    def checked_array(self, rel: str, meta: tuple[tuple, np.dtype]):
        """``array(rel, shape)`` of an array whose metadata :meth:`check_array` read (``meta``): its data only."""
        return read_plain_chunk(self.dir, rel, *meta)

    def map(self, rel: str, nbytes: int):
        return self.dir.map(rel, nbytes)
