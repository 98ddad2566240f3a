"""Field kinds: one module each, one line in ``FIELD_KINDS``. See ``base.py`` for the protocol.

``image``, ``label`` and ``objects`` are format version 1's fields, described by their own manifest keys;
every later kind (``mask``) lives under the manifest's ``fields`` mapping, ``{name: {"kind": ..., ...}}``,
and a dataset that has one is written as format version 2.
"""
from __future__ import annotations

from .base import Alloc, Field, Part, Reader, Role, Schema
from .image import ImageField, PixelsPart
from .label import LabelField
from .mask import MaskField, MaskSpec, mask_dtype
from .objects import ObjectsField
from .object_masks import ObjectMasksField
from .keypoints import KeypointsField, KeypointsSpec
from .pixels import Pixels, valid_offsets
from .columns import FixedColumn, RaggedColumn, ValueField, declared_spec, infer_spec
from .number import NumberField
from .array import ArrayField
from .ragged import RaggedField
from .text import TextField
from .jsonvalue import JsonField
from .rawbytes import BytesField

FIELD_KINDS: dict[str, type[Field]] = {cls.kind: cls for cls in (ImageField, LabelField, ObjectsField, MaskField,
                                                                  ObjectMasksField, KeypointsField)}
# value kinds (numbers, arrays, ragged arrays, text, json, bytes: columns.py), any source's named values
VALUE_KINDS: dict[str, type[ValueField]] = {cls.kind: cls for cls in (NumberField, ArrayField, RaggedField, TextField,
                                                                       JsonField, BytesField)}
FIELD_KINDS.update(VALUE_KINDS)
# kinds that live under manifest["fields"]; each validates its entry with ``check(name, entry, manifest)``
EXTRA_KINDS = tuple(k for k, cls in FIELD_KINDS.items() if cls.in_fields)


def fields_of(manifest) -> list[Field]:
    """The fields of a dataset, in registry order (image first)."""
    return [f for cls in FIELD_KINDS.values() for f in cls.from_manifest(manifest)]


def schema_of(fields: list[Field]) -> Schema:
    """{batch key: Role} of a dataset's batches, from its fields."""
    schema = Schema()
    for f in fields:
        schema.update(f.roles())
    return schema


__all__ = ["ArrayField", "BytesField", "FixedColumn", "JsonField", "NumberField", "RaggedColumn", "RaggedField",
           "TextField", "VALUE_KINDS", "ValueField", "declared_spec", "infer_spec", "value_field",
           "Alloc", "EXTRA_KINDS", "FIELD_KINDS", "Field", "ImageField", "KeypointsField", "KeypointsSpec",
           "LabelField", "MaskField", "MaskSpec", "ObjectMasksField", "ObjectsField", "Part", "Pixels", "PixelsPart",
           "Reader", "Role", "Schema", "fields_of", "mask_dtype",
           "schema_of", "valid_offsets"]


def value_field(name: str, spec: dict, declared: bool = False) -> ValueField:
    """The value field ``name`` of ``spec`` (``{"kind": ..., ...}``, from :func:`infer_spec` or
    :func:`declared_spec`; ``"declared": True`` in it, or ``declared``: the user declared it, so a float value
    is rounded to a narrower float dtype). Raises ValueError for a spec no kind takes."""
    spec = dict(spec)
    declared = bool(spec.pop("declared", False) or declared)
    origin = spec.pop("origin", None)  # (where an undeclared kind came from: for messages)
    cls = VALUE_KINDS.get(spec.get("kind"))
    if cls is None:
        raise ValueError(f"unknown field kind {spec.get('kind')!r} (one of {', '.join(VALUE_KINDS)})")
    try:
        field = cls(name, spec)
    except TypeError as e:
        raise ValueError(str(e)) from None
    field.declared, field.origin = declared, origin
    return field
