"""A table's columns as value fields (``--column NAME[:KIND]``): each column's kind, from the KIND given, else
the table's Hugging Face Features (schema metadata ``huggingface``), else its Arrow type; and its values, one
per row, for the records (so ``--update`` sees a changed caption or score).

Arrow types: integers, floats and bool -> ``number``; string -> ``text``; binary -> ``bytes``; a list of
numbers -> ``ragged``; a fixed-size list (of fixed-size lists) of numbers -> ``array``; anything else
(structs, maps, lists of strings) -> ``json``. Hugging Face: ``Value`` -> number or text (binary: bytes),
``Sequence`` of a Value -> ragged (an array when its length is fixed), ``Array2D`` / ``Array3D`` ... -> array
(ragged when the first dimension is None), ``ClassLabel`` -> a number with its class names,
``Sequence(ClassLabel)`` -> multi-label ids (ragged, with the class names).
"""
from __future__ import annotations

import json

import numpy as np

from ...errors import SourceError
from ...formats.fields import VALUE_KINDS, declared_spec

_ARROW_NUMBERS = {"int8": "int8", "int16": "int16", "int32": "int32", "int64": "int64", "uint8": "uint8",
                  "uint16": "uint16", "uint32": "uint32", "uint64": "uint64", "halffloat": "float16",
                  "float": "float32", "double": "float64", "bool": "bool", "float16": "float16",
                  "float32": "float32", "float64": "float64"}
_HF_NUMBERS = {**_ARROW_NUMBERS, "float": "float32"}


def parse_column(text: str) -> tuple[str, dict | None]:
    """``NAME[:KIND]`` -> (name, declared spec or None: from the table's types)."""
    name, _, kind = str(text).partition(":")
    name = name.strip()
    if not name:
        raise SourceError(f"--column {text!r}: give a column name (NAME or NAME:KIND)")
    if not kind.strip():
        return name, None
    try:
        return name, {**declared_spec(kind.strip()), "declared": True}
    except ValueError as e:
        raise SourceError(f"--column {text!r}: {e}") from None


def _arrow_spec(t) -> dict:
    import pyarrow as pa

    if str(t) in _ARROW_NUMBERS:
        return {"kind": "number", "dtype": _ARROW_NUMBERS[str(t)]}
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return {"kind": "text"}
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return {"kind": "bytes"}
    if pa.types.is_fixed_size_list(t):
        shape, v = [t.list_size], t.value_type
        while pa.types.is_fixed_size_list(v):
            shape.append(v.list_size)
            v = v.value_type
        if str(v) in _ARROW_NUMBERS:
            return {"kind": "array", "dtype": _ARROW_NUMBERS[str(v)], "shape": shape}
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        v, shape = t.value_type, []
        while pa.types.is_fixed_size_list(v):
            shape.append(v.list_size)
            v = v.value_type
        if str(v) in _ARROW_NUMBERS:
            return {"kind": "ragged", "dtype": _ARROW_NUMBERS[str(v)], "shape": shape}
    return {"kind": "json"}


def _hf_spec(f) -> dict | None:
    """A Hugging Face feature (its JSON in the schema metadata) as a field spec; None: not one we map."""
    if isinstance(f, list) and len(f) == 1:  # [feature]: a list of it (datasets' shorthand for Sequence)
        f = {"_type": "Sequence", "feature": f[0]}
    if not isinstance(f, dict):
        return None
    t = f.get("_type")
    if t == "Value":
        dt = f.get("dtype")
        if dt in ("string", "large_string"):
            return {"kind": "text"}
        if dt in ("binary", "large_binary"):
            return {"kind": "bytes"}
        return {"kind": "number", "dtype": _HF_NUMBERS[dt]} if dt in _HF_NUMBERS else None
    if t == "ClassLabel":
        return {"kind": "number", "dtype": "int64", "classes": [str(n) for n in f.get("names") or ()]}
    if t in ("Sequence", "List", "LargeList"):
        inner = f.get("feature")
        if isinstance(inner, dict) and inner.get("_type") == "ClassLabel":
            return {"kind": "ragged", "dtype": "int64", "shape": [], "classes": [str(n) for n in inner.get("names") or ()]}
        sub = _hf_spec(inner)
        length = f.get("length", -1)
        if sub is not None and sub["kind"] == "number" and not sub.get("classes"):
            if isinstance(length, int) and length > 0:
                return {"kind": "array", "dtype": sub["dtype"], "shape": [length]}
            return {"kind": "ragged", "dtype": sub["dtype"], "shape": []}
        return {"kind": "json"}
    if isinstance(t, str) and t.startswith("Array") and t[5:-1].isdigit():
        shape, dt = list(f.get("shape") or ()), _HF_NUMBERS.get(f.get("dtype"))
        if dt is None or not shape:
            return None
        if shape[0] is None:
            return {"kind": "ragged", "dtype": dt, "shape": shape[1:]}
        return {"kind": "array", "dtype": dt, "shape": shape}
    return None


def _hf_name(f) -> str:
    """A Hugging Face feature as its Python spelling, for messages: ``Value('float32')``."""
    if isinstance(f, dict) and f.get("_type") == "Value":
        return f"Value({f.get('dtype')!r})"
    return f.get("_type", "a feature") if isinstance(f, dict) else "a list feature"


def hf_features(schema) -> dict:
    meta = (schema.metadata or {}).get(b"huggingface")
    if not meta:
        return {}
    try:
        feats = json.loads(meta)["info"]["features"]
    except (KeyError, ValueError, TypeError):
        return {}
    return feats if isinstance(feats, dict) else {}


def column_specs(columns, schema, path, taken) -> dict:
    """{name: spec} of the ``--column`` values for a table file's ``schema``."""
    feats = hf_features(schema)
    specs = {}
    for text in columns:
        name, spec = parse_column(text)
        if name in taken:
            raise SourceError(f"--column {name}: that column is the image, label or key column")
        if name not in schema.names:
            raise SourceError(f"{path}: no column {name!r} for --column (columns: {', '.join(schema.names)})")
        if spec is None:
            spec = _hf_spec(feats.get(name))
            if spec is not None:  # (named by a value that does not fit it)
                spec["origin"] = f"the table's Hugging Face features ({_hf_name(feats.get(name))})"
            else:
                spec = _arrow_spec(schema.field(name).type)
        elif spec.get("multihot"):  # NAME:multihot: multi-label ids as a vector over the column's class names
            names = (_hf_spec(feats.get(name)) or {}).get("classes")
            if not names:
                raise SourceError(f"--column {text}: multihot needs the column's class names (a Hugging Face "
                                  f"Sequence(ClassLabel) feature); without them store the ids (--column {name})")
            spec = {**spec, "shape": [len(names)], "classes": names}
        if spec["kind"] == "bytes" and _arrow_spec(schema.field(name).type)["kind"] == "text":
            raise SourceError(f"--column {text}: the column {name!r} holds strings ({schema.field(name).type}), "
                              f"and bytes takes binary columns; the kind that fits is text (--column {name}:text)")
        if spec["kind"] not in VALUE_KINDS:
            raise SourceError(f"--column {text}: kind {spec['kind']!r} is not a value field kind")
        specs[name] = spec
    return specs


def column_values(table, name: str, spec: dict) -> list:
    """Every row's value of column ``name`` as the field's kind takes it (numpy rows for numbers and arrays)."""
    col = table.column(name)
    if col.null_count:
        raise SourceError(f"column {name!r} has {col.null_count} empty (null) cells; a field needs a value in every "
                          f"row (fill them, or leave the column out)")
    kind = spec["kind"]
    if kind == "number":
        return list(col.to_numpy())
    if kind == "array":
        return [np.asarray(v) for v in col.to_pylist()]
    if kind == "bytes":
        return [bytes(v) for v in col.to_pylist()]
    return col.to_pylist()
