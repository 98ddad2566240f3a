"""The ``mask`` field: a semantic-segmentation mask of class ids per sample, (H, W) uint8 (uint16 when a
class id exceeds 254), the same geometry as its image, always resampled with nearest neighbour.

Manifest: ``fields.<name> = {"kind": "mask", "layout", "dtype", "height", "width", "ignore_index",
"classes", "shards"}``. ``ignore_index`` marks pixels that belong to no class (letterbox padding, crowd
regions, VOC's object borders); ``classes`` names the values 0, 1, ... (empty when the source gave none).
Layout as every image-like field (``pixels.py``); per-sample crc32c at ``checksums/<name>_crc32c``.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...errors import CorruptDatasetError
from ..specs import LAYOUTS, ShardSpec, check_spec_keys
from ..zarr_v3 import check_node_path
from .base import Role
from .image import PixelsField, PixelsReaderField, finish_pixels
from .pixels import Pixels
from ..problems import Problem
from ..shardtable import ShardColumn

MASK_DTYPES = ("uint8", "uint16")


def mask_dtype(num_classes: int, ignore_index: int, wide: bool = False) -> str:
    """uint8 while every class id (0..C-1) and the ignore index fit in 0..255, else uint16."""
    return "uint16" if wide or num_classes > 255 or ignore_index > 255 else "uint8"


@dataclass(frozen=True, kw_only=True)
class MaskSpec:
    layout: str
    dtype: str
    ignore_index: int
    classes: tuple[str, ...] = ()
    height: int | None = None
    width: int | None = None
    shards: tuple[ShardSpec, ...] = ()

    def __post_init__(self):
        if self.layout not in LAYOUTS or self.dtype not in MASK_DTYPES:
            raise CorruptDatasetError(f"manifest: a mask field has layout {self.layout!r} and dtype {self.dtype!r}; "
                                      f"expected one of {LAYOUTS} and {MASK_DTYPES}")
        top = np.iinfo(self.dtype).max
        if not isinstance(self.ignore_index, int) or not 0 <= self.ignore_index <= top:
            raise CorruptDatasetError(f"manifest: mask ignore_index {self.ignore_index!r} is not a {self.dtype} value")
        fixed = self.layout == "fixed"
        if fixed != (self.height is not None and self.width is not None) or (
                fixed and not all(isinstance(v, int) and v > 0 for v in (self.height, self.width))):
            raise CorruptDatasetError("manifest: a fixed mask field has a positive height and width, a ragged none")

    def to_dict(self) -> dict:
        return {"kind": "mask", "layout": self.layout, "dtype": self.dtype, "ignore_index": self.ignore_index,
                "classes": list(self.classes), "height": self.height, "width": self.width,
                **({} if isinstance(self.shards, ShardColumn) else
                   {"shards": [s.to_dict() if s is not None else None for s in self.shards]})}

    @classmethod
    def from_dict(cls, d: dict, table=None) -> "MaskSpec":
        """The entry ``d``; its shards listed in it (formats 2-3) or, in format 4, the column of the manifest's
        shard ``table`` (ShardTable) named after the field (``name``)."""
        check_spec_keys("mask field", d, {"kind", "layout", "dtype", "ignore_index", "classes", "height", "width",
                                          "shards"}, {"kind", "layout", "dtype", "ignore_index"}
                        | ({"shards"} if table is None else set()))
        if table is not None and "shards" in d:
            raise CorruptDatasetError("manifest: a mask field of format 4 has its shards in the shard table")
        try:
            return cls(layout=d["layout"], dtype=d["dtype"], ignore_index=d["ignore_index"],
                       classes=tuple(str(c) for c in d.get("classes") or ()), height=d.get("height"),
                       width=d.get("width"), shards=table if table is not None else tuple(
                           ShardSpec.from_dict(s) if s is not None else None for s in d["shards"]))
        except TypeError as e:
            raise CorruptDatasetError(f"manifest: mask field: {e}") from None


def _column(m, name: str):
    """Field ``name``'s column of the manifest's shard table (format 4), or None (its shards listed in it)."""
    table = getattr(m, "shard_table", None)
    return table.column(name) if table is not None else None


class MaskField(PixelsField):
    kind = "mask"
    in_fields = True

    def __init__(self, spec: MaskSpec, name: str = "mask"):
        self.spec, self.name = spec, check_node_path(name)
        self.pixels = Pixels(name, spec.dtype, spec.layout, None, spec.height, spec.width,
                             crc_node=f"checksums/{name}_crc32c")

    @classmethod
    def from_manifest(cls, m) -> list["MaskField"]:
        return [cls(MaskSpec.from_dict(d, _column(m, name)), name) for name, d in m.fields.items()
                if d.get("kind") == cls.kind]

    @classmethod
    def check(cls, name: str, d: dict, m) -> None:
        """The entry parses, and fits the image's shard grid: same layout and size, one shard per image
        shard with the same count, each of the size its samples need, under the field's own node."""
        spec = MaskSpec.from_dict(d, _column(m, name))
        field = cls(spec, name)
        im = m.image
        if spec.layout != im.layout or (spec.height, spec.width) != (im.height, im.width):
            raise CorruptDatasetError(f"manifest: mask field {name!r} is {spec.layout} {spec.height}x{spec.width}, "
                                      f"its images {im.layout} {im.height}x{im.width}")
        if isinstance(spec.shards, ShardColumn):  # (a shard table: each entry checked against the image's as read)
            return
        if len(spec.shards) != len(m.shards):
            raise CorruptDatasetError(f"manifest: mask field {name!r} lists {len(spec.shards)} shards for "
                                      f"{len(m.shards)} image shards")
        for s, (ms, ims) in enumerate(zip(spec.shards, m.shards)):
            if ms is None or ims is None:
                if ms is not ims:
                    raise CorruptDatasetError(f"manifest: mask field {name!r} and the images disagree on shard {s}")
                continue
            if ms.path != field.pixels.shard_path(s) or ms.count != ims.count or (
                    spec.layout == "fixed" and ms.nbytes != field.pixels.fixed_shard_nbytes(ms.count, m.shard_size)):
                raise CorruptDatasetError(f"manifest: mask shard {s} ({ms.path}, {ms.count} samples, {ms.nbytes} "
                                          f"bytes) does not fit the dataset's shard {s}")

    def finish(self, root: Path, parts, n: int, K: int) -> dict:
        from dataclasses import replace

        shards = finish_pixels(self.pixels, root, parts, n, K)
        return {"fields": {self.name: replace(self.spec, shards=shards).to_dict()}}

    def reader(self, store, m) -> PixelsReaderField:
        return PixelsReaderField(self.pixels, store, self.spec.shards, m.num_rows, m.shard_size,
                                 fill=self.spec.ignore_index)

    def verify(self, root: Path, m, problems: list, context: dict) -> None:
        before = len(problems)
        shapes = self.pixels.verify(root, self.spec.shards, m.num_rows, m.shard_size, problems,
                                    self.pixels.crc_node + "/c/0" in m.files)
        image_shapes = context.get("image_shapes")
        if shapes is not None and image_shapes is not None:
            bad = np.flatnonzero((shapes[:, :2] != image_shapes[:, :2]).any(axis=1))
            if len(bad):
                problems.append(Problem(self.pixels.shapes_node, "masks of another size than their images",
                                        bad.tolist()))
        if len(problems) > before or not self.spec.classes:
            return
        C, ignore = len(self.spec.classes), self.spec.ignore_index
        for s, shard in enumerate(self.spec.shards):  # intact shards: every value a class id or the ignore index
            if shard is None:
                continue
            vals = np.frombuffer(root.read(shard.path), np.dtype(self.spec.dtype).newbyteorder("<"))
            if self.pixels.fixed:
                vals = vals[:shard.count * self.pixels.sample_nbytes // self.pixels.itemsize]
            bad = (vals >= C) & (vals != ignore)
            if bad.any():
                problems.append(Problem(shard.path, f"mask values outside the {C} classes and the ignore index "
                                                    f"{ignore} (e.g. {int(vals[bad][0])})"))

    def describe(self) -> str:
        sp = self.spec
        shape = f"fixed {sp.height}x{sp.width}" if sp.layout == "fixed" else "ragged (h, w)"
        names = ", ".join(sp.classes[:8]) + (", ..." if len(sp.classes) > 8 else "")
        return (f"{shape} {sp.dtype} class ids, nearest-neighbour resize, ignore index {sp.ignore_index}; "
                + (f"{len(sp.classes)} classes: {names}" if sp.classes else "class names not given"))

    def roles(self) -> dict[str, Role]:
        return {self.name: Role("pixels", "nearest", float(self.spec.ignore_index))}
