"""The manifest: everything a reader needs, stored in the root group's ``attributes["dsc"]``.

Frozen, keyword-only dataclasses with ``to_dict`` / ``from_dict``; unknown keys are refused so a
typo or a newer writer is caught instead of silently ignored. The manifest is written last: a
directory without it is not a dataset.
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field, replace

from ..errors import CorruptDatasetError, FormatVersionError
from .specs import (_SHA256, ATTRIBUTE_DTYPES, LAYOUTS, RESIZE_POLICIES, RESIZERS, ImageSpec,  # noqa: F401
                    ResizeSpec, ShardSpec, _check_fields, _positive_int, check_spec_keys)
from .zarr_v3 import check_node_path
from .fields import EXTRA_KINDS, FIELD_KINDS
from .fields.base import BATCH_SUFFIXES
from .shardtable import Geometry, ShardTable, build as build_table

FORMAT_NAME = "dsc"
FORMAT_VERSION = 4  # the newest this dsc reads and writes: 4 = the shard table; 3 = versioned (rows, live, version)
TASKS = ("classification", "detection", "segmentation", "images")
RESERVED_NODES = ("image", "label", "keys", "objects", "image_id", "transform", "checksums")
# the keys a batch already has (and the suffixes of a ragged or padded key's companions): a field or a box
# attribute with such a name would overwrite one of them in every batch
BATCH_KEYS = ("image", "label", "index", "keys", "boxes", "labels", "box_offsets", "box_counts", "box_mask",
              "targets", "orig_size", "image_id")


def batch_name_problem(name: str, taken=()) -> str | None:
    """Why ``name`` cannot be a batch key of its own (None: it can)."""
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]{0,63}", name):
        return "is not a plain name (a letter, then letters, digits or _; at most 64)"
    if name in RESERVED_NODES or name in BATCH_KEYS or name.endswith(BATCH_SUFFIXES) or name in taken:
        return "is a name batches already use"
    return None
@dataclass(frozen=True, kw_only=True)
class Manifest:
    format_version: int
    dsc_version: str
    task: str
    num_samples: int
    shard_size: int  # samples per shard; shard s holds samples [s*shard_size, (s+1)*shard_size)
    image: ImageSpec
    resize: ResizeSpec
    shards: tuple[ShardSpec | None, ...]  # by slot; None: a slot this version does not use (format 3)
    classes: tuple[str, ...] = ()
    category_ids: tuple[int, ...] = ()  # original ids of a COCO source, sorted (label k -> category_ids[k])
    objects: dict | None = None  # detection: num_boxes, box_format, attributes {name: dtype}, dropped_boxes
    source: dict = field(default_factory=dict)
    skipped: tuple[dict, ...] = ()  # {"key": ..., "reason": ...} of inputs left out
    files: dict = field(default_factory=dict)  # every other file: relative path -> {"nbytes", "sha256"}
    fields: dict = field(default_factory=dict)  # later field kinds: name -> {"kind": ..., ...} (format version 2)
    rows: int | None = None  # format 3: rows of every per-sample array (row = slot * shard_size + j), holes included
    version: dict | None = None  # format 3: {"number", "parent", "operation"} (the time is in the log record)
    shard_table: ShardTable | None = None  # format 4: the shards by slot in a table object (shards: its image column)
    format: str = FORMAT_NAME

    @staticmethod
    def version_for(fields: dict, versioned: bool = True) -> int:
        """The format version a writer records: 3 (versions) for everything dsc writes now; 2 / 1 were
        written before (1 unless the dataset has a field version 1 lacks). (4, the shard table, is recorded when the
        table is attached: ``with_table``.)"""
        return 3 if versioned else 2 if fields else 1

    @property
    def num_rows(self) -> int:
        """Length of the per-sample arrays: ``rows`` (format 3, where removed samples and holes stay as rows,
        ``live`` False) or the number of samples."""
        return self.rows if self.rows is not None else self.num_samples

    @property
    def shard_count(self) -> int:
        """Shard files of the image (slots a version does not use are not counted)."""
        if self.shard_table is not None:
            return self.shard_table.ref["shards"]
        if hasattr(self.shards, "present"):  # (a compile's shards, counted as they were written)
            return self.shards.present
        return sum(s is not None for s in self.shards)

    def with_table(self, parent: "Manifest | None", write) -> "Manifest":
        """This manifest (written with its shards listed) with its shards in a shard table instead (format 4):
        the table's object(s) written by ``write(sha256, data)``, a delta of ``parent``'s table when it has one."""
        if self.shard_table is not None:
            return self
        cols = {"image": self.shards if hasattr(self.shards, "entries") else tuple(self.shards)}  # (a compile's: as
        # its entries, not a spec a shard)
        for name in sorted(self.fields):
            d = self.fields[name]
            if isinstance(d, dict) and d.get("shards") is not None:
                cols[name] = tuple(ShardSpec.from_dict(x) if x is not None else None for x in d["shards"])
        ref, rows = build_table(cols, self.shard_count, parent.shard_table if parent is not None else None, write)
        fields = {n: ({k: v for k, v in d.items() if k != "shards"} if n in cols else d) for n, d in self.fields.items()}
        table = ShardTable(ref, geometry(self.image, fields), self.shard_size, self.num_rows)
        table.bind(_stale)
        table._full = rows  # (every entry in memory already)
        return replace(self, format_version=4, fields=fields, shard_table=table, shards=table.column("image"))

    @property
    def versioned(self) -> bool:
        return self.rows is not None

    def __post_init__(self):
        if self.format != FORMAT_NAME:
            raise CorruptDatasetError(f"manifest: format is {self.format!r}, expected {FORMAT_NAME!r}")
        _positive_int("num_samples", self.num_samples)
        _positive_int("shard_size", self.shard_size)
        K = self.shard_size
        if self.rows is not None or self.version is not None:
            if self.format_version < 3 or self.rows is None or self.version is None:
                raise CorruptDatasetError("manifest: rows and version come together, in format version 3")
            _positive_int("rows", self.rows)
            if self.num_samples > self.rows:
                raise CorruptDatasetError(f"manifest: {self.num_samples} samples in {self.rows} rows")
            _check_version(self.version)
        elif self.format_version >= 3:
            raise CorruptDatasetError("manifest: format version 3 has rows and a version")
        expect = -(-self.num_rows // K)
        table = self.shard_table
        if table is not None:
            if self.format_version < 4 or not self.versioned or table.slots != expect or table.K != K or \
                    table.num_rows != self.num_rows:
                raise CorruptDatasetError(f"manifest: a shard table of {table.slots} slots, {expect} expected for "
                                          f"{self.num_rows} rows in shards of {K} (format 4, versioned)")
            if self.shard_count > expect:
                raise CorruptDatasetError(f"manifest: {self.shard_count} shards in {expect} slots")
        elif self.format_version >= 4:
            raise CorruptDatasetError("manifest: format version 4 lists its shards in a shard table")
        if len(self.shards) != expect:
            raise CorruptDatasetError(f"manifest: {len(self.shards)} shards listed, {expect} expected for "
                                      f"{self.num_rows} {'rows' if self.versioned else 'samples'} in shards of {K}")
        for s, sh in enumerate(self.shards if table is None else ()):  # (a table's entries: checked as read)
            last = min(K, self.num_rows - s * K)
            if sh is None:
                if not self.versioned or s == len(self.shards) - 1:
                    raise CorruptDatasetError(f"manifest: shard {s} is missing")
                continue
            if sh.count != last if (not self.versioned or s == len(self.shards) - 1) else sh.count > K:
                raise CorruptDatasetError(f"manifest: shard {sh.path} holds {sh.count} samples, expected "
                                          f"{last if not self.versioned or last < K else f'at most {K}'}")
        if self.task not in TASKS:
            raise CorruptDatasetError(f"manifest: unknown task {self.task!r}")
        if not isinstance(self.fields, dict):
            raise CorruptDatasetError("manifest: 'fields' must be a mapping name -> field")
        if self.fields and self.format_version < 2:
            raise CorruptDatasetError("manifest: 'fields' needs format_version 2")
        attrs = self.objects.get("attributes", {}) if isinstance(self.objects, dict) else {}
        taken = set(attrs if isinstance(attrs, dict) else ()) | {  # (and the keys other fields fill, e.g. the
            k for n, d in self.fields.items() if isinstance(d, dict) and d.get("kind") in FIELD_KINDS  # masks'
            for k in FIELD_KINDS[d["kind"]].batch_keys_of(n) if k != n}  # rects: an older dsc compiled such names)
        for name, spec in self.fields.items():
            check_node_path(name)
            if name in taken and name not in attrs:
                raise CorruptDatasetError(f"the field {name!r} shares a batch key another field fills (the instance "
                                          f"masks' crop rectangles; an older dsc compiled it so); recompile the "
                                          f"dataset with the field renamed")
            problem = batch_name_problem(name, taken=taken)
            if problem:
                raise CorruptDatasetError(f"manifest: the field name {name!r} {problem}; the dataset is damaged")
            kind = spec.get("kind") if isinstance(spec, dict) else None
            if kind not in EXTRA_KINDS:
                raise FormatVersionError(f"the dataset has a field {name!r} of kind {kind!r}, which this dsc does "
                                         f"not read; upgrade dsc (pip install -U dsc)")
            if table is not None and kind == "mask" and name not in table.columns:
                raise CorruptDatasetError(f"manifest: the mask field {name!r} is not a column of the shard table "
                                          f"({table.columns})")
            FIELD_KINDS[kind].check(name, spec, self)
        if table is not None and table.columns != ["image", *sorted(set(table.geometry) - {"image"})]:
            raise CorruptDatasetError(f"manifest: shard_table.columns {table.columns} are not the image and its mask "
                                      f"fields")
        if (self.task == "detection") != (self.objects is not None):
            raise CorruptDatasetError("manifest: 'objects' is required for detection and only for detection")
        if self.objects is not None:
            o = self.objects
            check_spec_keys("objects", o, {"num_boxes", "box_format", "attributes", "dropped_boxes",
                                           "images_without_boxes"}, {"num_boxes", "attributes"})
            _positive_int("objects.num_boxes", o["num_boxes"], allow_zero=True)
            attrs = o["attributes"]
            if not isinstance(attrs, dict) or not all(v in ATTRIBUTE_DTYPES for v in attrs.values()):
                raise CorruptDatasetError(f"manifest: objects.attributes must map names to one of {ATTRIBUTE_DTYPES}")
            for name in attrs:
                check_node_path(f"objects/{name}")
                problem = batch_name_problem(name)
                if problem:
                    raise CorruptDatasetError(f"manifest: the box attribute {name!r} {problem}; the dataset is damaged")
        # every image shard where the layout puts it, with exactly the bytes its samples need (fixed): so
        # counts and sizes agree before anything is mapped (a table's: as each entry is read)
        g = geometry(self.image, {})["image"]
        for s, sh in enumerate(self.shards if table is None else ()):
            if sh is None:
                continue
            want_path, want_bytes = g.path(s), g.nbytes(sh.count, self.shard_size)
            if sh.path != want_path or (want_bytes is not None and sh.nbytes != want_bytes):
                raise CorruptDatasetError(f"manifest: image shard {s} is {sh.path} of {sh.nbytes} bytes; the layout "
                                          f"says {want_path}" + (f" of {want_bytes} bytes" if want_bytes else ""))

    def to_dict(self) -> dict:
        return {
            "format": self.format,
            "format_version": self.format_version,
            "dsc_version": self.dsc_version,
            "task": self.task,
            "num_samples": self.num_samples,
            "shard_size": self.shard_size,
            "image": self.image.to_dict(),
            "resize": self.resize.to_dict(),
            "classes": list(self.classes),
            "category_ids": list(self.category_ids),
            "objects": self.objects,
            **({"shards": [s.to_dict() if s is not None else None for s in self.shards]} if self.shard_table is None
               else {"shard_table": self.shard_table.ref}),
            "source": self.source,
            "skipped": list(self.skipped),
            "files": self.files,
            **({"fields": self.fields} if self.fields else {}),
            **({"rows": self.rows, "version": self.version} if self.rows is not None else {}),
        }

    def checksum(self) -> str:
        """SHA-256 of the manifest's canonical JSON (sorted keys, no whitespace), stored beside it."""
        return canonical_sha256(self.to_dict())

    @classmethod
    def from_dict(cls, d: dict) -> "Manifest":
        """Parse and validate. A newer format version is refused with the version named; anything malformed
        is a CorruptDatasetError (never another exception); the checksum must be present and match."""
        if not isinstance(d, dict) or d.get("format") != FORMAT_NAME:
            raise CorruptDatasetError("manifest: not a dsc manifest")
        version = d.get("format_version")
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise CorruptDatasetError(f"manifest: format_version must be a positive integer, got {version!r}")
        if version > FORMAT_VERSION:
            raise FormatVersionError(
                f"dataset format version {version} is newer than this dsc reads (version {FORMAT_VERSION}); "
                f"upgrade dsc (pip install -U dsc)")
        keys = {"format", "format_version", "dsc_version", "task", "num_samples", "shard_size", "image",
                "resize", "classes", "category_ids", "objects", "shards", "source", "skipped", "files", "checksum",
                "fields", "rows", "version", "shard_table"}
        check_spec_keys("manifest", d, keys, keys - {"source", "skipped", "classes", "category_ids", "objects", "files",
                                                     "fields", "rows", "version", "shards", "shard_table"})
        if ("shards" in d) == ("shard_table" in d):
            raise CorruptDatasetError("manifest: lists its shards (format 1-3) or names a shard table (format 4), "
                                      "exactly one of them")
        try:
            table = None
            if "shard_table" in d:
                image = ImageSpec.from_dict(d["image"])
                fields = _typed("fields", d.get("fields", {}), dict)
                ref = ShardTable.check_ref(d["shard_table"])
                table = ShardTable(ref, geometry(image, fields), d["shard_size"], _typed("rows", d.get("rows"), int))
            m = cls(
                format=d["format"], format_version=version, dsc_version=_typed("dsc_version", d["dsc_version"], str),
                task=d["task"], num_samples=d["num_samples"], shard_size=d["shard_size"],
                image=ImageSpec.from_dict(d["image"]), resize=ResizeSpec.from_dict(d["resize"]),
                shards=(tuple(ShardSpec.from_dict(s) if s is not None else None
                              for s in _typed("shards", d["shards"], list)) if table is None
                        else table.column("image")),
                shard_table=table,
                classes=tuple(_typed("classes[]", c, str) for c in _typed("classes", d.get("classes", []), list)),
                category_ids=tuple(_typed("category_ids[]", c, int)
                                   for c in _typed("category_ids", d.get("category_ids", []), list)),
                objects=_typed("objects", d.get("objects"), (dict, type(None))),
                source=_typed("source", d.get("source", {}), dict),
                skipped=tuple(_skipped(x) for x in _typed("skipped", d.get("skipped", []), list)),
                files={_typed("files key", k, str): _file_entry(k, v)
                       for k, v in _typed("files", d.get("files", {}), dict).items()},
                fields=_typed("fields", d.get("fields", {}), dict),
                rows=_typed("rows", d["rows"], int) if "rows" in d else None,
                version=_typed("version", d["version"], dict) if "version" in d else None,
            )
        except CorruptDatasetError:
            raise
        except (TypeError, ValueError, KeyError, AttributeError, IndexError, OverflowError, RecursionError) as e:
            raise CorruptDatasetError(f"manifest: malformed ({type(e).__name__}: {e})") from None
        for rel in m.files:
            check_node_path(rel)
        if d["checksum"] != canonical_sha256({k: v for k, v in d.items() if k != "checksum"}):  # as stored
            raise CorruptDatasetError("manifest: its checksum does not match its content; the dataset's zarr.json "
                                      "was damaged or edited. Recompile the dataset")
        return m


VERSION_KEYS = {"number", "parent", "operation"}


def geometry(image: ImageSpec, fields: dict) -> dict[str, Geometry]:
    """Each sharded column's geometry (shard_table.columns): the image's, and each mask field's (``fields``: the
    manifest's raw entries)."""
    out = {"image": Geometry("image", image.layout == "fixed", 3,
                             image.sample_nbytes if image.layout == "fixed" else 0)}
    for name, d in fields.items():
        if isinstance(d, dict) and d.get("kind") == "mask":
            fixed = d.get("layout") == "fixed"
            nb = int(d["height"]) * int(d["width"]) * (2 if d.get("dtype") == "uint16" else 1) if fixed else 0
            out[name] = Geometry(name, fixed, 2, nb, "uint16" if d.get("dtype") == "uint16" else "uint8")
    return out


def _stale(sha, nbytes):
    raise AssertionError("a written shard table is read from memory")




def _check_version(v: dict) -> None:
    check_spec_keys("version", v, VERSION_KEYS, VERSION_KEYS)
    n, parent = v["number"], v["parent"]
    if not isinstance(n, int) or isinstance(n, bool) or n < 0 or not (
            parent is None or (isinstance(parent, int) and not isinstance(parent, bool) and 0 <= parent < n)):
        raise CorruptDatasetError(f"manifest: version number {n!r} / parent {parent!r}")
    if not isinstance(v["operation"], str):
        raise CorruptDatasetError("manifest: version operation must be a string")


def canonical_sha256(d: dict) -> str:
    """SHA-256 of ``json.dumps(d, sort_keys=True, separators=(",", ":"), ensure_ascii=False)`` in UTF-8."""
    return hashlib.sha256(json.dumps(d, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()).hexdigest()


def _typed(name: str, v, kind):
    """``v`` if it is a ``kind`` (bool is not an int here), else a CorruptDatasetError naming the key."""
    ok = isinstance(v, kind) and not (isinstance(v, bool) and kind in (int, (int,)))
    if not ok:
        raise CorruptDatasetError(f"manifest: {name} has the wrong type ({type(v).__name__})")
    return v


def _skipped(x) -> dict:
    if not isinstance(x, dict) or not isinstance(x.get("key"), str) or not isinstance(x.get("reason"), str):
        raise CorruptDatasetError("manifest: every skipped entry is {key, reason} strings")
    return x


def _file_entry(rel, v) -> dict:
    if (not isinstance(v, dict) or set(v) != {"nbytes", "sha256"} or not isinstance(v["nbytes"], int)
            or isinstance(v["nbytes"], bool) or v["nbytes"] < 0 or not isinstance(v["sha256"], str)
            or not _SHA256.match(v["sha256"])):
        raise CorruptDatasetError(f"manifest: files[{rel!r}] must be {{nbytes, sha256}}")
    return v
