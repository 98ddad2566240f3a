"""The subset of Zarr v3 that dsc writes and reads, implemented directly.

dsc writes standard Zarr v3 nodes (any Zarr v3 reader opens them) but does not go through
zarr-python on the hot path: writing the bytes directly is ~2.5x faster, keeps the bytes under our
control (deterministic, no fill-value elision) and lets the runtime memory-map chunk files.

What dsc uses:

* groups (``zarr.json`` with ``node_type: group``);
* "plain" arrays: one chunk holding the whole array, ``bytes`` codec (little endian), chunk key
  ``c/0/.../0``. The chunk file is the array's raw C-order bytes;
* "sharded" arrays: regular chunk grid whose chunk is a shard of ``K`` samples, ``sharding_indexed``
  codec with one sample per inner chunk, inner codec ``bytes``, index ``bytes`` + ``crc32c`` at the
  end. A shard holding ``c`` samples stores them back to back from offset 0, then ``K`` index entries;
* string arrays: one chunk, ``vlen-utf8`` codec (zarr-python's variable-length string encoding).
"""
from __future__ import annotations

import functools
import json
import os
import struct
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from ..errors import CorruptDatasetError
from ..store.paths import check_node_path
from ..store.local import as_root
from ..store.local import write_atomic

ZARR_JSON = "zarr.json"
EMPTY_ENTRY = 0xFFFF_FFFF_FFFF_FFFF  # index entry of an inner chunk that is not stored

# numpy dtype <-> zarr v3 data_type names for the dtypes dsc stores.
_DTYPES = {
    "uint8": "uint8", "int8": "int8", "uint16": "uint16", "int16": "int16",
    "uint32": "uint32", "int32": "int32", "uint64": "uint64", "int64": "int64",
    "float16": "float16", "float32": "float32", "float64": "float64", "bool": "bool",
}


def node_dir(root: Path, rel: str) -> Path:
    return Path(root, check_node_path(rel)) if rel else root


def _bytes_codec(dtype: np.dtype) -> dict:
    if dtype.itemsize == 1:
        return {"name": "bytes"}
    return {"name": "bytes", "configuration": {"endian": "little"}}


def _le(arr: np.ndarray) -> np.ndarray:
    dt = arr.dtype.newbyteorder("<") if arr.dtype.itemsize > 1 else arr.dtype
    return np.ascontiguousarray(arr, dtype=dt)


def _array_json(shape: Sequence[int], dtype: str, chunk_shape: Sequence[int], codecs: list,
                fill_value: Any, dimension_names: Sequence[str] | None, attributes: dict | None) -> dict:
    meta = {
        "zarr_format": 3,
        "node_type": "array",
        "shape": [int(s) for s in shape],
        "data_type": dtype,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [int(c) for c in chunk_shape]}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": fill_value,
        "codecs": codecs,
        "attributes": attributes or {},
    }
    if dimension_names is not None:
        meta["dimension_names"] = list(dimension_names)
    return meta


def json_bytes(obj: Any) -> bytes:
    """The bytes dsc writes for a JSON document (a stable key order, indented)."""
    return (json.dumps(obj, indent=2, ensure_ascii=False, allow_nan=False) + "\n").encode("utf-8")


def write_json(path: Path, obj: Any, base: Path | None = None) -> None:
    """Write JSON atomically (temp file + rename, never through a link below ``base``: files.write_atomic),
    with a stable key order. Durability is the writer's business: dsc flushes a whole dataset with one
    syncfs before publishing it."""

    write_atomic(path, json_bytes(obj), base)


MAX_JSON_BYTES = 1 << 28  # the root's manifest: it lists every shard, file and skipped input
MAX_NODE_JSON_BYTES = 1 << 20  # any other node's metadata: a few hundred bytes


def parse_json(data: bytes, where) -> dict:
    """JSON, or a CorruptDatasetError naming ``where`` (malformed, not UTF-8, nested beyond reason)."""
    try:
        return json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        what = "nested too deeply" if isinstance(e, RecursionError) else str(e)
        raise CorruptDatasetError(f"{where}: unreadable JSON ({what})") from None


def read_json(path: Path, limit: int = MAX_JSON_BYTES) -> dict:
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > limit:
                raise CorruptDatasetError(f"{path}: {size:,} bytes, more than the {limit:,} a dsc zarr.json may have")
            return parse_json(f.read(), path)
    except FileNotFoundError:
        raise
    except OSError as e:
        raise CorruptDatasetError(f"{path}: unreadable JSON ({e})") from None


def read_node_json(root, rel: str) -> dict:
    """The ``zarr.json`` of node ``rel`` of a dataset (a :class:`~dsc.formats.files.Root`)."""

    root = as_root(root)
    name = f"{rel}/{ZARR_JSON}" if rel else ZARR_JSON
    return parse_json(root.read(name, MAX_JSON_BYTES if not rel else MAX_NODE_JSON_BYTES), root / name)


def write_group(root: Path, rel: str = "", attributes: dict | None = None) -> None:
    write_json(node_dir(root, rel) / ZARR_JSON,
               {"zarr_format": 3, "node_type": "group", "attributes": attributes or {}}, Path(root))


def chunk_key(ndim: int, first: int = 0) -> str:
    """Key of the chunk at grid position (first, 0, ..., 0) with the default '/' encoding."""
    return "/".join(["c", str(first)] + ["0"] * (ndim - 1))


# ----------------------------------------------------------------------------- plain arrays
def write_plain_array(root: Path, rel: str, data: np.ndarray,
                      dimension_names: Sequence[str] | None = None) -> None:
    """One chunk = the whole array, raw little-endian C-order bytes. An array with no element has
    chunk shape 1 along its empty axes and no chunk file (the Zarr spec's "chunk not stored")."""
    data = _le(np.asarray(data))
    if data.dtype.name not in _DTYPES:
        raise TypeError(f"dtype {data.dtype} is not stored by dsc")
    if data.ndim == 0:
        raise ValueError(f"{rel}: dsc stores no 0-d arrays")

    d = node_dir(root, rel)
    if data.size:
        write_atomic(d / chunk_key(data.ndim), memoryview(data).cast("B"), Path(root))
    fill = False if data.dtype == np.bool_ else 0
    write_json(d / ZARR_JSON, _array_json(data.shape, _DTYPES[data.dtype.name], [max(1, s) for s in data.shape],
                                          [_bytes_codec(data.dtype)], fill, dimension_names, None), Path(root))


def plain_array_json(length: int, dtype: str = "uint8", dimension_name: str = "byte") -> dict:
    """Metadata of a 1-D plain array of ``length`` elements (a ragged shard's values)."""
    return _array_json([length], _DTYPES[dtype], [length], [_bytes_codec(np.dtype(dtype))], 0, [dimension_name], None)


def ragged_shard_meta(nbytes: int, dtype: str = "uint8") -> bytes:
    """The ``zarr.json`` beside a ragged shard of ``nbytes`` bytes (``<node>/values/<s>/zarr.json``): implied by
    the shard's size (format 4 lists it nowhere; the shard writer, verify and push make or check these bytes)."""
    itemsize = np.dtype(dtype).itemsize
    return json_bytes(plain_array_json(nbytes // itemsize, dtype, "byte" if itemsize == 1 else "element"))


def read_array_meta(root, rel: str) -> dict:
    """An array node's metadata, checked to be the kind of Zarr v3 array dsc writes (1 chunk or sharded)."""
    meta = read_node_json(root, rel)
    where = f"{rel}/zarr.json"
    if not isinstance(meta, dict) or meta.get("node_type") != "array" or meta.get("zarr_format") != 3:
        raise CorruptDatasetError(f"{where}: not a Zarr v3 array")
    shape, grid, codecs = meta.get("shape"), meta.get("chunk_grid"), meta.get("codecs")
    config = grid.get("configuration") if isinstance(grid, dict) else None
    chunk = config.get("chunk_shape") if isinstance(config, dict) else None
    if (not isinstance(shape, list) or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in shape)
            or not isinstance(chunk, list) or len(chunk) != len(shape)
            or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in chunk)
            or not isinstance(codecs, list) or not codecs or not all(isinstance(c, dict) for c in codecs)):
        raise CorruptDatasetError(f"{where}: its shape, chunk grid or codecs are not a valid Zarr v3 array's")
    return meta


def plain_array_meta(root, rel: str) -> tuple[tuple, np.dtype]:
    """(shape, dtype) of an array written by :func:`write_plain_array`, its metadata checked (its data not read)."""
    root = as_root(root)
    meta = read_array_meta(root, rel)
    shape = tuple(meta["shape"])
    if meta.get("data_type") not in _DTYPES.values():
        raise CorruptDatasetError(f"{root / rel}: data_type {meta.get('data_type')!r} is not one dsc stores")
    dtype = np.dtype(meta["data_type"]).newbyteorder("<")
    codecs = meta["codecs"]
    if (meta["chunk_grid"]["configuration"]["chunk_shape"] != [max(1, s) for s in shape]
            or len(codecs) != 1 or codecs[0].get("name") != "bytes"):
        raise CorruptDatasetError(f"{root / rel}: expected one uncompressed chunk")
    return shape, dtype


def read_plain_array(root, rel: str) -> np.ndarray:
    """Read an array written by :func:`write_plain_array` (checks shape, dtype and file size)."""

    root = as_root(root)
    return read_plain_chunk(root, rel, *plain_array_meta(root, rel))


def read_plain_chunk(root, rel: str, shape: tuple, dtype: np.dtype) -> np.ndarray:
    """The data of a plain array whose metadata :func:`plain_array_meta` read and checked as (``shape``,
    ``dtype``)."""
    if 0 in shape:
        return np.zeros(shape, dtype)
    return as_root(root).fromfile(f"{rel}/{chunk_key(len(shape))}", dtype,
                                  int(np.prod(shape)) * dtype.itemsize).reshape(shape)


# ----------------------------------------------------------------------------- string arrays
def write_string_array(root: Path, rel: str, values: Iterable[str]) -> None:
    """vlen-utf8: uint32 count, then for each item uint32 byte length + UTF-8 bytes."""
    encoded = [v.encode("utf-8") for v in values]
    parts = [struct.pack("<I", len(encoded))]
    for b in encoded:
        parts.append(struct.pack("<I", len(b)))
        parts.append(b)

    d = node_dir(root, rel)
    write_atomic(d / chunk_key(1), b"".join(parts), Path(root))
    n = len(encoded)
    write_json(d / ZARR_JSON, _array_json([n], "string", [n], [{"name": "vlen-utf8", "configuration": {}}],
                                          "", ["sample"], None), Path(root))


def read_string_array(root, rel: str) -> list[str]:

    root = as_root(root)
    meta = read_array_meta(root, rel)
    path = f"{rel}/{chunk_key(1)}"
    buf = root.read(path)
    try:
        (n,) = struct.unpack_from("<I", buf, 0)
        if n != meta["shape"][0] or n > len(buf) // 4:
            raise ValueError(f"{n} strings where the array has {meta['shape'][0]}")
        out, pos = [], 4
        for _ in range(n):
            (ln,) = struct.unpack_from("<I", buf, pos)
            pos += 4
            if pos + ln > len(buf):
                raise ValueError("a string runs past the end")
            out.append(buf[pos:pos + ln].decode("utf-8"))
            pos += ln
        if pos != len(buf):
            raise ValueError("length mismatch")
    except (struct.error, ValueError, UnicodeDecodeError) as e:
        raise CorruptDatasetError(f"{root / path}: damaged string chunk ({e})") from None
    return out


# ----------------------------------------------------------------------------- sharded arrays
def sharded_array_json(shape: Sequence[int], shard_len: int,
                       dimension_names: Sequence[str] | None = None, dtype: str = "uint8") -> dict:
    """Array (N, *sample) of ``dtype`` in shards of ``shard_len`` samples, one sample per inner chunk."""
    sample = [int(s) for s in shape[1:]]
    sharding = {
        "name": "sharding_indexed",
        "configuration": {
            "chunk_shape": [1] + sample,
            "codecs": [_bytes_codec(np.dtype(dtype))],
            "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}],
            "index_location": "end",
        },
    }
    return _array_json(shape, _DTYPES[dtype], [shard_len] + sample, [sharding], 0, dimension_names, None)


def fixed_shard_nbytes(count: int, capacity: int, inner_nbytes: int) -> int:
    """The bytes of a shard of :func:`shard_index`'s layout: ``count`` inner chunks, then the index."""
    return count * inner_nbytes + 16 * capacity + 4


@functools.lru_cache(maxsize=64)
def shard_index(count: int, capacity: int, inner_nbytes: int) -> bytes:
    """The index that ends a shard whose first ``count`` of ``capacity`` inner chunks are stored
    back to back from offset 0: (offset, nbytes) uint64 pairs, empty slots all-ones, then crc32c. (The same
    bytes for every full shard of an array: remembered.)"""
    import google_crc32c

    idx = np.full((capacity, 2), EMPTY_ENTRY, dtype="<u8")
    idx[:count, 0] = np.arange(count, dtype="<u8") * inner_nbytes
    idx[:count, 1] = inner_nbytes
    raw = idx.tobytes()
    return raw + struct.pack("<I", google_crc32c.value(raw))
