"""The parts of a manifest that field kinds describe themselves with: the image and resize specs, a shard's
entry, the layouts; and the small checks they share. Below the manifest and the field kinds, which both
build on them (docs/FORMAT.md, "Manifest")."""
from __future__ import annotations

import re
from dataclasses import MISSING, asdict, dataclass, field, fields  # noqa: F401
from typing import Any

from ..errors import CorruptDatasetError
from ..store.paths import check_node_path

ATTRIBUTE_DTYPES = ("uint8", "int8", "uint16", "int16", "uint32", "int32", "int64", "float32", "float64", "bool")
LAYOUTS = ("fixed", "ragged")
RESIZE_POLICIES = ("stretch", "center-crop", "pad")
RESIZERS = ("pil", "torch")  # who resampled: PIL's Image.resize or torch's interpolate
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def _check_fields(spec_cls, name: str, d: dict) -> None:
    """``d`` has only the dataclass's fields as keys, and every field without a default."""
    check_spec_keys(name, d, {f.name for f in fields(spec_cls)},
                {f.name for f in fields(spec_cls) if f.default is MISSING and f.default_factory is MISSING})


def check_spec_keys(cls_name: str, d: dict, allowed: set[str], required: set[str]) -> None:
    if not isinstance(d, dict):
        raise CorruptDatasetError(f"manifest: {cls_name} must be an object, got {type(d).__name__}")
    unknown = set(d) - allowed
    if unknown:
        raise CorruptDatasetError(f"manifest: unknown keys in {cls_name}: {sorted(unknown)}")
    missing = required - set(d)
    if missing:
        raise CorruptDatasetError(f"manifest: missing keys in {cls_name}: {sorted(missing)}")


def _positive_int(name: str, v: Any, allow_zero: bool = False) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or v < (0 if allow_zero else 1):
        raise CorruptDatasetError(f"manifest: {name} must be a {'non-negative' if allow_zero else 'positive'} "
                                  f"integer, got {v!r}")
    return v


class _Spec:
    """A manifest part: a frozen dataclass written as a dict of its fields, read back with the fields checked
    (``_what`` names it in messages)."""

    _what = ""

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict):
        _check_fields(cls, cls._what, d)
        return cls(**d)


@dataclass(frozen=True, kw_only=True)
class ImageSpec(_Spec):
    """How images are stored. ``fixed``: one (N, H, W, C) array. ``ragged``: flat bytes per shard +
    offsets + shapes."""

    _what = "image"

    layout: str
    channels: int
    mode: str  # "RGB" or "L"
    height: int | None = None  # fixed layout only
    width: int | None = None

    def __post_init__(self):
        if self.layout not in LAYOUTS:
            raise CorruptDatasetError(f"manifest: image.layout must be one of {LAYOUTS}, got {self.layout!r}")
        if not isinstance(self.mode, str) or self.mode not in ("RGB", "L") \
                or self.channels != (3 if self.mode == "RGB" else 1) or isinstance(self.channels, bool):
            raise CorruptDatasetError(f"manifest: image mode {self.mode!r} with {self.channels} channels")
        if self.layout == "fixed":
            _positive_int("image.height", self.height)
            _positive_int("image.width", self.width)
        elif self.height is not None or self.width is not None:
            raise CorruptDatasetError("manifest: a ragged image field has no fixed height/width")

    @property
    def sample_nbytes(self) -> int:
        assert self.layout == "fixed"
        return self.height * self.width * self.channels



@dataclass(frozen=True, kw_only=True)
class ResizeSpec(_Spec):
    """The geometric policy applied at compile time; per-sample scale/offset live in ``transform/``."""

    _what = "resize"

    policy: str | None  # stretch | center-crop | pad for fixed; None for ragged
    size: tuple[int, int] | None = None  # (height, width) for fixed
    max_side: int | None = None  # ragged: longest side capped at this (None: stored as decoded)
    fill: int = 0  # pad value for the letterbox policy
    filter: str = "bilinear"
    resizer: str = "pil"  # pil: PIL's Image.resize; torch: torch's antialiased interpolate on uint8

    def __post_init__(self):
        if self.policy is not None and self.policy not in RESIZE_POLICIES:
            raise CorruptDatasetError(f"manifest: resize.policy must be one of {RESIZE_POLICIES}")
        if self.size is not None and (len(self.size) != 2 or not all(isinstance(v, int) for v in self.size)):
            raise CorruptDatasetError("manifest: resize.size must be [height, width]")
        for name in ("max_side", "fill"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool)):
                raise CorruptDatasetError(f"manifest: resize.{name} must be an integer")
        if not isinstance(self.filter, str):
            raise CorruptDatasetError("manifest: resize.filter must be a name")
        if self.resizer not in RESIZERS:
            raise CorruptDatasetError(f"manifest: resize.resizer must be one of {RESIZERS}")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["size"] = list(self.size) if self.size else None
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "ResizeSpec":
        if isinstance(d, dict) and d.get("size") is not None:
            if not isinstance(d["size"], list):
                raise CorruptDatasetError("manifest: resize.size must be [height, width]")
            d = {**d, "size": tuple(d["size"])}
        return super().from_dict(d)


@dataclass(frozen=True, kw_only=True)
class ShardSpec(_Spec):
    """One shard file: where it is (relative to the dataset), how many samples, its size and hash."""

    _what = "shard"

    path: str
    count: int
    nbytes: int
    sha256: str

    def __post_init__(self):
        if not isinstance(self.path, str):
            raise CorruptDatasetError("manifest: a shard's path must be a string")
        check_node_path(self.path)
        _positive_int("shard.count", self.count)
        _positive_int("shard.nbytes", self.nbytes)
        if not isinstance(self.sha256, str) or not _SHA256.match(self.sha256):
            raise CorruptDatasetError(f"manifest: shard {self.path} has no valid sha256")

    @classmethod
    def made(cls, path: str, count: int, nbytes: int, sha256: str) -> "ShardSpec":
        """A spec of values this dsc has just made (a compile's shards, from its own entries): not checked again
        (a check costs more than the rest of a one-sample shard's bookkeeping)."""
        spec = object.__new__(cls)
        for name, value in (("path", path), ("count", count), ("nbytes", nbytes), ("sha256", sha256)):
            object.__setattr__(spec, name, value)
        return spec

    def to_dict(self) -> dict:  # (asdict's recursive copy, once per shard per manifest written: ~0.2 ms a shard)
        return {"path": self.path, "count": self.count, "nbytes": self.nbytes, "sha256": self.sha256}



