"""What the value field kinds share (numbers, arrays, ragged arrays, text, json, bytes): a named per-sample
value, checked and encoded to its stored bytes by its kind, kept in one of two column layouts.

* **fixed column** (``number``, ``array``): ``<name>`` (N, *shape) of the field's dtype, one plain Zarr
  array; a batch gathers its rows with one ``numpy.take`` into the Loader's slot, beside the pixels.
* **ragged column** (``ragged``, ``text``, ``json``, ``bytes``): ``<name>/values`` (M, *shape) and
  ``<name>/offsets`` (N+1,) int64: sample i owns rows ``offsets[i]:offsets[i+1]`` of the values (bytes,
  for text, json and bytes).

A kind is a subclass of :class:`ValueField` that says how a Python value becomes a row (``encode``: raises
SampleError naming the sample and the field) and how a row is handed back (``decode``). Any source can use
them: it gives named values per record (``Item.fields``), the kind infers (:func:`infer_spec`) or is
declared (:func:`declared_spec`) and checks each value. Per-object columns (masks, keypoints) can reuse
:class:`FixedColumn` / :class:`RaggedColumn` with their box offsets.
"""
from __future__ import annotations

import base64
import re
from pathlib import Path
from typing import ClassVar

import numpy as np

from ...errors import CorruptDatasetError, SampleError
from ..problems import Problem, try_read
from ..specs import check_spec_keys
from ..zarr_v3 import chunk_key, read_array_meta, read_plain_array, write_group, write_plain_array
from .base import CarriedPart, ColumnsParts, Field, Part, Reader, Role, raw_bytes
from .objects import gather_rows
from .pixels import valid_offsets

# the numeric dtypes a value field stores (little-endian, as every dsc array)
VALUE_DTYPES = ("bool", "uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64",
                "float16", "float32", "float64")


MAP_AT_LEAST = 1 << 20  # a column this large is memory-mapped at open (read on use), a smaller one read whole


def column_array(store, rel: str, shape: tuple) -> np.ndarray:
    """A plain array of the dataset (``store``: the runtime's storage, or an update's base), mapped from its
    file when it is large (an embedding column: opening reads none of it; a batch's gather copies its rows
    from the page cache straight into the Loader's slot), else read whole."""
    root = store.dir
    meta = read_array_meta(root, rel)
    dtype = np.dtype(str(meta.get("data_type"))) if meta.get("data_type") in VALUE_DTYPES else None
    nbytes = int(np.prod(shape, dtype=np.int64)) * (dtype.itemsize if dtype is not None else 0)
    if dtype is None or nbytes < MAP_AT_LEAST or tuple(meta["shape"]) != tuple(shape) or not hasattr(root, "map") \
            or not hasattr(root, "size"):
        return store.array(rel, shape)  # (and its checks, with their messages)
    chunk = f"{rel}/{chunk_key(len(shape))}"
    if root.size(chunk) != nbytes:
        raise CorruptDatasetError(f"{store.root}/{chunk} has {root.size(chunk):,} bytes, {nbytes:,} expected; the "
                                  f"dataset is damaged (dsc verify lists every problem)")
    return root.map(chunk, nbytes, populate=False).view(dtype.newbyteorder("<")).reshape(shape)


class FixedColumn:
    """``node`` (N, *shape) ``dtype``: one row per sample."""

    def __init__(self, node: str, dtype: str, shape: tuple = ()):
        self.node, self.dtype, self.shape = node, np.dtype(dtype), tuple(shape)

    @property
    def row_nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    def write(self, root: Path, data: np.ndarray, lengths: np.ndarray) -> None:
        """The column from its rows' bytes back to back (``data``, uint8) and each row's length in bytes."""
        flat = data.view(self.dtype.newbyteorder("<"))
        write_plain_array(root, self.node, flat.reshape(len(lengths), *self.shape),
                          ["sample"] + [f"axis{k}" for k in range(len(self.shape))])

    def read(self, store, n: int) -> np.ndarray:
        return column_array(store, self.node, (n, *self.shape))

    def gather(self, col: np.ndarray, idx: np.ndarray, alloc, name: str) -> np.ndarray:
        return np.take(col, idx, axis=0, out=alloc(name, (len(idx), *self.shape), col.dtype))

    def verify(self, root: Path, n: int, problems: list) -> np.ndarray | None:
        col = try_read(problems, self.node, lambda: read_plain_array(root, self.node))
        if col is not None and (col.shape != (n, *self.shape) or col.dtype != self.dtype.newbyteorder("<")):
            problems.append(Problem(self.node, f"has shape {col.shape} and dtype {col.dtype}, expected "
                                               f"{(n, *self.shape)} {self.dtype}"))
            return None
        return col


class RaggedColumn:
    """``node/values`` (M, *shape) ``dtype`` and ``node/offsets`` (N+1,) int64."""

    def __init__(self, node: str, dtype: str, shape: tuple = ()):
        self.node, self.dtype, self.shape = node, np.dtype(dtype), tuple(shape)
        self.values_node, self.offsets_node = f"{node}/values", f"{node}/offsets"

    @property
    def row_nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    def write(self, root: Path, data: np.ndarray, lengths: np.ndarray) -> None:
        """The column from its rows' bytes back to back (``data``, uint8) and each row's length in bytes."""
        offsets = np.zeros(len(lengths) + 1, np.int64)
        np.cumsum(lengths // self.row_nbytes, out=offsets[1:])
        values = data.view(self.dtype.newbyteorder("<")).reshape(-1, *self.shape)
        write_group(root, self.node)
        write_plain_array(root, self.values_node, values, ["row"] + [f"axis{k}" for k in range(len(self.shape))])
        write_plain_array(root, self.offsets_node, offsets, ["sample_edge"])

    def read(self, store, n: int) -> tuple[np.ndarray, np.ndarray]:
        offsets = store.array(self.offsets_node, (n + 1,))
        M = int(offsets[-1]) if len(offsets) else 0
        values = column_array(store, self.values_node, (M, *self.shape))
        if not valid_offsets(offsets, M):
            raise CorruptDatasetError(f"{store.root}/{self.offsets_node} is not a valid offsets index for {M} rows")
        return values, offsets

    def gather(self, values: np.ndarray, offsets: np.ndarray, idx: np.ndarray, alloc, name: str):
        """Packed: the batch's rows back to back, and its (B+1,) offsets."""
        rows, batch_offsets = gather_rows(offsets, idx)
        out = np.take(values, rows, axis=0, out=alloc(name, (len(rows), *self.shape), values.dtype))
        off = alloc(f"{name}_offsets", batch_offsets.shape, np.dtype(np.int64))
        off[:] = batch_offsets
        return out, off

    def verify(self, root: Path, n: int, problems: list):
        values = try_read(problems, self.values_node, lambda: read_plain_array(root, self.values_node))
        offsets = try_read(problems, self.offsets_node, lambda: read_plain_array(root, self.offsets_node))
        if values is None or offsets is None:
            return None
        if values.shape[1:] != self.shape or values.dtype != self.dtype.newbyteorder("<"):
            problems.append(Problem(self.values_node, f"has rows {values.shape[1:]} {values.dtype}, expected "
                                                      f"{self.shape} {self.dtype}"))
            return None
        if offsets.shape != (n + 1,) or not valid_offsets(offsets, len(values)):
            bad = np.flatnonzero(np.diff(offsets) < 0).tolist() if offsets.shape == (n + 1,) else []
            problems.append(Problem(self.offsets_node, f"not a valid offsets index for {len(values)} rows", bad))
            return None
        return values, offsets


class ValuePart(Part):
    """A unit's rows of one value field: each sample's stored bytes (journaled as base64). An update or a
    compaction carries the base's rows over as a ``CarriedPart`` (``value_rows``: their bytes as they are), made
    into this part only when a row is set."""

    def __init__(self, rows=None, hole: bytes = b""):
        self.rows: list[bytes] = [] if rows is None else rows
        self.hole = hole

    def add(self, value: bytes) -> None:
        self.rows.append(value)

    def set_row(self, j: int, value: bytes) -> None:
        self.rows[j] = value

    def pad(self, n: int) -> None:
        self.rows.extend([self.hole] * n)

    def to_json(self) -> dict:
        return {"rows": [base64.b64encode(r).decode("ascii") for r in self.rows]}

    def columns(self) -> dict:
        """This part as columns (``ColumnsParts``' shape): its rows' bytes back to back, each row's length."""
        return {"flat": {}, "ragged": {"rows": (np.frombuffer(b"".join(self.rows), np.uint8),
                                                np.fromiter(map(len, self.rows), np.int64, len(self.rows)))}}


def value_rows(cols: dict, hole: bytes) -> CarriedPart:
    """Rows of a base version's value field as its stored bytes (``cols["ragged"]["rows"]``: back to back, each
    row's length): what an update or a compaction carries a slot over with; a padded hole is ``hole``."""
    def to_part(c):
        data, lengths = c["ragged"]["rows"]
        data = raw_bytes(data)
        ends = np.cumsum(lengths)
        return ValuePart([bytes(data[a:b]) for a, b in zip((ends - lengths).tolist(), ends.tolist())], hole)
    return CarriedPart(cols, to_part, fill={"rows": hole})


class ValueField(Field):
    """Base of the value kinds. ``spec``: the manifest entry (``kind`` and the kind's own keys)."""

    in_fields = True
    ragged: ClassVar[bool] = False  # the ragged column layout (values + offsets)
    keys: ClassVar[set] = set()  # the kind's manifest keys besides "kind"
    declared: bool = False  # the user declared it (else it was inferred from the first sample): for messages
    origin: str | None = None  # where an undeclared kind came from, when not the first sample (a table's
    # Hugging Face features): for messages, which then name the --column declaration that keeps the values
    required: ClassVar[set] = set()

    def __init__(self, name: str, spec: dict):
        self.name, self.spec = name, dict(spec)
        self.spec["kind"] = self.kind
        self.setup()
        self.column = (RaggedColumn if self.ragged else FixedColumn)(name, self.dtype, self.shape)

    # what a kind sets from its spec (``setup``)
    dtype: str = "uint8"
    shape: tuple = ()

    def setup(self) -> None:
        """Read the kind's keys of ``self.spec`` (raise ValueError / TypeError when they are wrong)."""

    # ------------------------------------------------------------------ format
    @classmethod
    def from_manifest(cls, m) -> list["ValueField"]:
        return [cls(name, d) for name, d in m.fields.items() if d.get("kind") == cls.kind]

    @classmethod
    def check(cls, name: str, d: dict, m) -> None:
        check_spec_keys(f"{cls.kind} field {name!r}", d, {"kind"} | cls.keys, {"kind"} | cls.required)
        try:
            cls(name, d)
        except (TypeError, ValueError) as e:
            raise CorruptDatasetError(f"manifest: {cls.kind} field {name!r}: {e}") from None

    def to_spec(self) -> dict:
        return dict(self.spec)

    # ------------------------------------------------------------------ values
    def encode(self, value, at: str) -> bytes:
        """The stored bytes of one sample's value; SampleError (naming ``at`` and the field) if it does not fit."""
        raise NotImplementedError

    def decode(self, row):
        """A sample's value from its stored row (a numpy view)."""
        return row

    def fail(self, at: str, why: str) -> SampleError:
        return SampleError(at, f"field {self.name!r}: {why}")

    def digest_bytes(self, value: bytes) -> bytes:
        return value

    # ------------------------------------------------------------------ compile
    @property
    def hole(self) -> bytes:
        return b"" if self.ragged else bytes(self.column.row_nbytes)

    def part(self, root: Path, s: int, capacity: int) -> ValuePart:
        return ValuePart(hole=self.hole)

    def load_part(self, d: dict) -> ValuePart:
        return ValuePart([base64.b64decode(r) for r in d["rows"]], self.hole)

    def empty_part(self) -> ValuePart:
        return ValuePart(hole=self.hole)

    def collect(self, S: int, N: int, K: int, s0: int = 0) -> ColumnsParts:
        return ColumnsParts(S, N, K, lambda c: value_rows(c, self.hole))

    def rows_part(self, reader: "ValueReader", start: int, count: int, shard) -> CarriedPart:
        """Rows ``[start, start + count)`` of the base as its stored bytes, in one slice (no object a row)."""
        return value_rows({"flat": {}, "ragged": {"rows": (reader.rows_bytes(start, count),
                                                           reader.row_lengths(start, count))}}, self.hole)

    def finish(self, root: Path, parts, n: int, K: int) -> dict:
        self.column.write(root, *parts.rows("rows"))  # (a ColumnsParts: every version's, Field.collect)
        return {"fields": {self.name: self.to_spec()}}

    # ------------------------------------------------------------------ read
    def reader(self, store, m) -> "ValueReader":
        return ValueReader(self, store, m.num_rows)

    def verify(self, root: Path, m, problems: list, context: dict) -> None:
        got = self.column.verify(root, m.num_rows, problems)
        if got is not None:
            self.verify_values(got, m, problems, context)

    def verify_values(self, got, m, problems: list, context: dict) -> None:
        """What a kind checks beyond the layout (class ids in range, UTF-8...)."""

    # ------------------------------------------------------------------ transforms
    def roles(self) -> dict[str, Role]:
        """``value``: gathered into the batch's slot and sent to the device, moved by no transform (``ragged``:
        packed with ``<name>_offsets``; ``host``: a Python list that stays on the host)."""
        return {self.name: Role("value")}

    def describe(self) -> str:
        return self.kind


class ValueReader(Reader):
    """Reads a value field: fixed rows gathered into the batch's slot, ragged ones packed with offsets,
    host kinds (text, json, bytes) as Python lists."""

    def __init__(self, field: ValueField, store, n: int):
        self.field, self.name = field, field.name
        if field.ragged:
            self.values, self.offsets = field.column.read(store, n)
        else:
            self.values, self.offsets = field.column.read(store, n), None

    def row(self, i: int) -> np.ndarray:
        if self.offsets is None:
            return self.values[i, ...]
        return self.values[int(self.offsets[i]):int(self.offsets[i + 1])]

    def rows_bytes(self, start: int, count: int) -> np.ndarray:
        """The stored bytes of rows ``[start, start + count)`` back to back (uint8, little-endian)."""
        if self.offsets is None:
            rows = self.values[start:start + count]
        else:
            rows = self.values[int(self.offsets[start]):int(self.offsets[start + count])]
        le = self.field.column.dtype.newbyteorder("<")
        return np.ascontiguousarray(rows, le).reshape(-1).view(np.uint8)

    def row_lengths(self, start: int, count: int) -> np.ndarray:
        """(count,) int64: each row's stored length in bytes."""
        if self.offsets is None:
            return np.full(count, self.field.column.row_nbytes, np.int64)
        return np.diff(self.offsets[start:start + count + 1]).astype(np.int64) * self.field.column.row_nbytes

    def sample(self, i: int) -> dict:
        return {self.name: self.field.decode(self.row(i))}

    def gather(self, idx: np.ndarray, alloc, forms: dict) -> dict:
        f = self.field
        if f.roles()[self.name].kind == "host":  # one gather of the batch's bytes, then one slice per sample
            rows, off = gather_rows(self.offsets, idx)
            blob = np.take(self.values, rows).tobytes()
            o = off.tolist()
            return {self.name: [f.decode(blob[o[k]:o[k + 1]]) for k in range(len(idx))]}
        if self.offsets is None:
            return {self.name: f.column.gather(self.values, idx, alloc, self.name)}
        values, off = f.column.gather(self.values, self.offsets, idx, alloc, self.name)
        return {self.name: values, f"{self.name}_offsets": off}

    def split(self, batch: dict, k: int) -> dict:
        v = batch[self.name]
        if isinstance(v, list):
            return {self.name: v[k]}
        off = batch.get(f"{self.name}_offsets")
        if off is not None:
            return {self.name: v[int(off[k]):int(off[k + 1])]}
        return {self.name: v[k]}


# ----------------------------------------------------------------------------- numeric checks
def numeric(field: ValueField, value, at: str, dtype=None) -> np.ndarray:
    """``value`` as an array of the field's dtype, refused when the conversion would change it (a float in an
    integer field, an integer out of range, a float64 that an inferred float16 field cannot hold exactly; a
    *declared* float field rounds floats to its precision, as asked) or when it is NaN or infinite (the
    documented rule: a value field holds finite numbers only)."""
    if hasattr(value, "detach"):  # a torch tensor
        value = value.detach().cpu().numpy()
    if isinstance(value, (str, bytes, dict)) or value is None:
        raise field.fail(at, f"expected {field.describe()}, got {type(value).__name__}")
    try:
        arr = np.asarray(value)
    except (ValueError, TypeError) as e:
        raise field.fail(at, f"not an array of numbers ({e})") from None
    dtype = np.dtype(dtype or field.column.dtype)
    if arr.dtype == object and arr.size and all(isinstance(v, int) and not isinstance(v, bool) for v in arr.flat):
        # Python ints past 64 bits (numpy keeps them as objects): one that the field's dtype cannot hold is named
        big = next((v for v in arr.flat if not _fits(v, dtype)), None)
        if big is not None:
            raise field.fail(at, f"the value {big} does not fit {dtype} (its range is "
                                 f"{_range(dtype)}); declare a dtype that holds it, or store it as text")
        arr = np.asarray(arr.tolist(), dtype)
    if arr.dtype.kind not in "biuf":
        raise field.fail(at, f"expected {field.describe()}, got values of type {arr.dtype}")
    if arr.dtype.kind == "f" and not np.isfinite(arr).all():
        raise field.fail(at, "NaN or infinity: value fields hold finite numbers (leave the sample out, or store "
                             "the missing value as a separate flag)")
    if arr.size == 0:  # an empty list has no dtype of its own
        arr = arr.astype(dtype)
    if arr.dtype != dtype:
        with np.errstate(all="ignore"):
            cast = arr.astype(dtype)
        rounded = field.declared and arr.dtype.kind == dtype.kind == "f"  # a declared float32: rounding asked for
        if arr.dtype.kind == "f" and dtype.kind != "f" or not (rounded or np.array_equal(cast.astype(arr.dtype), arr)) \
                or (dtype.kind == "f" and not np.isfinite(cast).all()):
            shown = arr.reshape(-1)[0] if arr.size == 1 else f"{arr.dtype} values"
            if field.origin and not field.declared:
                raise field.fail(at, f"{shown} does not fit the field's {dtype} exactly (the field's kind, "
                                     f"{field.describe()}, came from {field.origin}); to keep the values, "
                                     f"declare it: --column {field.name}:{arr.dtype}")
            raise field.fail(at, f"{shown} does not fit the field's {dtype} exactly (the field was "
                                 f"{'declared' if field.declared else 'inferred from the first sample'} "
                                 f"as {field.describe()})")
        arr = cast
    return np.ascontiguousarray(arr, dtype.newbyteorder("<"))


def _fits(v: int, dtype: np.dtype) -> bool:
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return info.min <= v <= info.max
    if dtype.kind == "f":
        with np.errstate(all="ignore"):
            f = dtype.type(v)
        return bool(np.isfinite(f)) and int(f) == v
    return v in (0, 1)


def _range(dtype: np.dtype) -> str:
    if dtype.kind in "iu":
        return f"{np.iinfo(dtype).min}..{np.iinfo(dtype).max}"
    return "whole numbers it holds exactly" if dtype.kind == "f" else "0 or 1"


# ----------------------------------------------------------------------------- kinds from values and declarations
def infer_spec(value, name: str = "") -> dict:
    """The field a value makes (the first valid sample's): Python int -> int64 number, float -> float64,
    bool -> bool, numpy / torch scalars and arrays keep their dtype (arrays: their shape), str -> text,
    bytes -> bytes, dict -> json, a list or tuple of ints -> ragged int64 (of floats: ragged float64),
    any other list -> json. Raises ValueError for a value no kind holds."""
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    if isinstance(value, bool) or isinstance(value, np.bool_):
        return {"kind": "number", "dtype": "bool"}
    if isinstance(value, int):
        return {"kind": "number", "dtype": "int64"}
    if isinstance(value, float):
        return {"kind": "number", "dtype": "float64"}
    if isinstance(value, np.generic) and value.dtype.name in VALUE_DTYPES:
        return {"kind": "number", "dtype": value.dtype.name}
    if isinstance(value, np.ndarray):
        if value.dtype.newbyteorder("=").name not in VALUE_DTYPES:
            raise ValueError(f"a numpy array of {value.dtype} (value fields hold {', '.join(VALUE_DTYPES)})")
        if value.ndim == 0:
            return {"kind": "number", "dtype": value.dtype.newbyteorder("=").name}
        return {"kind": "array", "dtype": value.dtype.newbyteorder("=").name, "shape": list(value.shape)}
    if isinstance(value, str):
        return {"kind": "text"}
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"kind": "bytes"}
    if isinstance(value, dict):
        return {"kind": "json"}
    if isinstance(value, (list, tuple)):
        if all(isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)) for v in value):
            return {"kind": "ragged", "dtype": "int64", "shape": []}
        if all(isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool) for v in value):
            return {"kind": "ragged", "dtype": "float64", "shape": []}
        return {"kind": "json"}
    if value is None:
        raise ValueError("None (a field needs a value in every sample)")
    raise ValueError(f"a {type(value).__name__} (fields hold numbers, arrays, lists of numbers, str, bytes or "
                     f"JSON-able dicts)")


_ARRAY_RE = re.compile(r"^([a-z0-9]+)\[([0-9, ]*)\]$")


def declared_spec(decl) -> dict:
    """A field as the user declares it: a dtype name (``"float32"``: a number), ``"text"``, ``"json"``,
    ``"bytes"``, ``"DTYPE[D0,D1...]"`` or ``(DTYPE, (D0, ...))`` (an array), ``"DTYPE[]"`` or ``(DTYPE, (None,))``
    (ragged; ``("int64", (None,), MAX)`` with a maximum length), ``"multihot"`` (multi-label ids stored as a
    uint8 vector over the classes), or a full spec dict. Raises ValueError."""
    if isinstance(decl, dict):
        return dict(decl)
    if isinstance(decl, str):
        s = decl.strip()
        if s in ("text", "json", "bytes"):
            return {"kind": s}
        if s == "multihot":
            return {"kind": "array", "dtype": "uint8", "shape": [], "multihot": True}
        if s == "ragged":
            return {"kind": "ragged", "dtype": "int64", "shape": []}
        if s in VALUE_DTYPES:
            return {"kind": "number", "dtype": s}
        m = _ARRAY_RE.match(s)
        if m and m.group(1) in VALUE_DTYPES:
            dims = [d.strip() for d in m.group(2).split(",")] if m.group(2).strip() else []
            if not dims:
                return {"kind": "ragged", "dtype": m.group(1), "shape": []}
            return {"kind": "array", "dtype": m.group(1), "shape": [int(d) for d in dims]}
        raise ValueError(f"{decl!r} is not a field kind: use a numpy dtype name ({', '.join(VALUE_DTYPES)}), text, "
                         f"json, bytes, multihot, DTYPE[SHAPE] (an array, e.g. float16[768]) or DTYPE[] (ragged)")
    if isinstance(decl, (tuple, list)) and 2 <= len(decl) <= 3 and isinstance(decl[0], str):
        dtype, shape = decl[0], tuple(decl[1]) if isinstance(decl[1], (tuple, list)) else (decl[1],)
        if dtype not in VALUE_DTYPES:
            raise ValueError(f"{decl!r}: {dtype!r} is not one of {', '.join(VALUE_DTYPES)}")
        if shape and shape[0] is None:
            return {"kind": "ragged", "dtype": dtype, "shape": list(shape[1:]),
                    "max_length": int(decl[2]) if len(decl) == 3 else None}
        return {"kind": "array", "dtype": dtype, "shape": [int(d) for d in shape]}
    raise ValueError(f"{decl!r} is not a field kind (a dtype name, 'text', 'json', 'bytes', or (dtype, shape))")
