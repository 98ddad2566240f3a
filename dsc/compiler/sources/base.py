"""What every source shares: the records it scans, the interface a source implements, and its parameters.

A source is one class: its ``name`` (the CLI command ``dsc compile <name>`` and ``dsc.compile_<name>``),
its ``params`` (CLI options and Python keywords, declared once), ``scan()`` (in the main process: the
input -> ordered records) and ``fetcher(records)`` (in a worker: record -> the encoded or decoded pixels,
its label, boxes and mask). The registry (``registry.py``) turns each source into a CLI command and a
Python function; ``docs/PLUGINS.md`` shows a third-party source.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any, Callable, ClassVar

import numpy as np

from ...errors import ConfigError
from ...errors import DscError, SourceError
from .inputs import RemotePath, identity, is_remote, read_bytes


def utf8(text: str) -> bool:
    """Whether ``text`` can be stored: keys and names are stored as UTF-8, and no NUL."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return "\0" not in text


def display(path: str | os.PathLike) -> str:
    """A path or name for messages and keys: bytes that are not valid UTF-8 escaped, a NUL shown as \\x00."""
    p = os.fspath(path)
    if utf8(p):
        return p
    try:
        p = os.fsencode(p).decode("utf-8", "backslashreplace")  # a file name's undecodable bytes
    except (UnicodeEncodeError, ValueError):
        p = p.encode("utf-8", "backslashreplace").decode("utf-8")  # a lone surrogate from text
    return p.replace("\0", "\\x00")


def check_text(scanned: "ScannedSource") -> "ScannedSource":
    """Keys and class names a dataset can store: a record whose key is not valid UTF-8 or holds a NUL (or
    whose file name holds a NUL) becomes an invalid input (the on_error policy decides), a class name like that is
    a SourceError; the summary and the invalid list are made printable."""

    for name in scanned.classes:
        if not utf8(name):
            raise SourceError(f"{display(scanned.root)}: the class name '{display(name)}' is not valid UTF-8 text or "
                              f"holds a NUL; fix it where the classes are named")
    if scanned.masks is not None:
        for name in scanned.masks.classes:
            if not utf8(name):
                raise SourceError(f"{display(scanned.root)}: the mask class name '{display(name)}' is not valid "
                                  f"UTF-8 text or holds a NUL; fix it")
    good, bad = [], []
    for r in scanned.records:  # the key is stored; the files are only opened (any bytes but NUL)
        files = [p for p in (r.path, r.mask) if isinstance(p, str) and "\0" in p]
        if not utf8(str(r.key)):
            bad.append((display(str(r.key)), "the name holds a NUL character; fix it" if "\0" in str(r.key) else
                        "the name is not valid UTF-8 (keys are stored as UTF-8); rename it"))
        elif files:
            bad.append((display(str(r.key)), f"the file name '{display(files[0])}' holds a NUL character; fix it"))
        else:
            good.append(r)

    def clean(v):
        if isinstance(v, str):
            return display(v)
        if isinstance(v, dict):
            return {clean(k): clean(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return type(v)(clean(x) for x in v)
        return v
    if not bad and all(utf8(k) for k, _ in scanned.invalid) and clean(scanned.summary) == scanned.summary \
            and utf8(str(scanned.root)):
        return scanned
    return replace(scanned, records=good, root=display(scanned.root), summary=clean(scanned.summary),
                   invalid=tuple((display(k), display(r)) for k, r in scanned.invalid) + tuple(bad))


@dataclass(frozen=True, slots=True)
class Target:
    """The objects of one detection sample, as the source gives them.

    ``boxes`` (k, 4) float64 xyxy in pixels of the annotated frame (or in [0, 1] units of the displayed
    image when ``normalized``); ``labels`` (k,) int64; ``attrs`` extra per-box columns (iscrowd, area,
    difficult, truncated...); ``size`` the (width, height) the annotation declares, if any; ``source``
    names the annotation for error messages (file, line or id); ``segments`` the per-object shapes a
    semantic mask is rasterised from (COCO polygons or RLE, in the annotated frame), with the mask value
    each object paints; ``shapes`` one instance shape per box (``--masks instance``: COCO polygons / RLE in
    the annotated frame, normalised polygons, an instance-id PNG, or an (H, W) array: see
    ``compiler/instances.py``); ``keypoints`` (k, K, 3) x, y, visibility per box (in the boxes' frame and
    units), or None."""

    boxes: np.ndarray
    labels: np.ndarray
    image_id: int
    source: str
    attrs: dict = field(default_factory=dict)
    size: tuple[int, int] | None = None
    normalized: bool = False
    segments: tuple = ()  # ((segmentation, mask value), ...) in drawing order
    shapes: tuple = ()  # one instance shape per box (instance masks)
    keypoints: np.ndarray | None = None  # (k, K, 3) float64

    def digest(self) -> int:
        """The annotation as one int64: boxes, labels, attributes, declared size, image id and shapes.
        ``--update`` compares it to know whether an annotation changed; the resume journal hashes it."""
        import hashlib
        import json

        h = hashlib.sha256()
        h.update(np.ascontiguousarray(self.boxes, np.float64).tobytes())
        h.update(np.ascontiguousarray(self.labels, np.int64).tobytes())
        h.update(f"{self.size}{self.normalized}{self.image_id}{sorted(self.attrs)}".encode())
        for k in sorted(self.attrs):
            h.update(np.ascontiguousarray(self.attrs[k]).tobytes())
        if self.segments:
            h.update(json.dumps(self.segments, separators=(",", ":"), default=str).encode())
        if self.shapes:
            h.update(json.dumps(self.shapes, separators=(",", ":"), default=_shape_json).encode())
        if self.keypoints is not None:
            h.update(np.ascontiguousarray(self.keypoints, np.float64).tobytes())
        return int.from_bytes(h.digest()[:8], "little", signed=True)


def _shape_json(v):
    """An instance shape in the annotation digest: arrays by their bytes' hash, the rest by their repr."""
    import hashlib

    if isinstance(v, np.ndarray):
        return [list(v.shape), hashlib.sha256(np.ascontiguousarray(v).tobytes()).hexdigest()]
    return repr(v)


@dataclass(frozen=True)
class NormalizedPolygons:
    """Polygons in [0, 1] units of the displayed image: ``((x, y, x, y, ...), ...)``."""

    polygons: tuple


@dataclass(frozen=True)
class InstanceId:
    """The pixels of ``value`` in the instance-id mask file ``path``."""

    path: str
    value: int


@dataclass(frozen=True, slots=True)
class Record:
    """One input sample: ``key`` is what the dataset stores for traceability (path relative to the
    source root, or an id); ``path`` is the file to decode; ``label`` the class index (-1: none);
    ``target`` the objects of a detection sample; ``mask`` the file of its segmentation mask."""

    key: str
    path: str
    label: int = -1
    target: Target | None = None
    row: int = -1  # table sources: the row in ``path``; dataset sources: the index in the dataset
    mask: str = ""
    fields: tuple = ()  # ((name, value), ...): the record's value fields known at scan (a table's columns)
    member: tuple = ()  # an archive's sample (webdataset): (member name, its data's offset in ``path``, size, its
    #                     bytes when the scan kept them, else ())


def where_to_read(r: Record) -> Record:
    """What ``Source.prefetch`` is told of a record: where its bytes are (path, row, mask, member), not its key,
    label, target or value fields, which a task would pickle a second time beside its own records."""
    return Record("", r.path, row=r.row, mask=r.mask, member=r.member[:3] + ((),) if r.member else ())


def record_digest(r: Record) -> int:
    """The annotation of a record as one int64 (``--update`` compares it): its target's digest, and with value
    fields, their values too (a changed caption or score is a changed sample). 0: nothing but pixels."""
    digest = r.target.digest() if r.target is not None else 0
    if not r.fields:
        return digest
    import hashlib
    import json

    h = hashlib.sha256(digest.to_bytes(8, "little", signed=True))
    for name, value in r.fields:
        h.update(name.encode() + b"\0")
        v = value.detach().cpu().numpy() if hasattr(value, "detach") else value
        if isinstance(v, np.ndarray) or isinstance(v, np.generic):
            h.update(f"{v.dtype}{v.shape}".encode() + np.ascontiguousarray(v).tobytes())
        elif isinstance(v, (bytes, bytearray, memoryview)):
            h.update(b"b" + bytes(v))
        else:
            h.update(json.dumps(v, sort_keys=True, default=repr).encode("utf-8", "backslashreplace"))
    return int.from_bytes(h.digest()[:8], "little", signed=True)


def record_digests(records) -> np.ndarray:
    """``record_digest`` of each record, as int64 (0 without a target or value fields, the common case, costs no
    hash): taken once by a compile for its journal's fingerprint and the dataset's fingerprint column."""
    return np.fromiter((record_digest(r) if r.target is not None or r.fields else 0 for r in records), np.int64,
                       len(records))


@dataclass(frozen=True, kw_only=True)
class MaskInfo:
    """A source that gives every sample a segmentation mask says so at scan time: the class names of
    the mask values (empty when unknown) and whether its mask files hold 16-bit values."""

    classes: tuple[str, ...] = ()
    wide: bool = False  # some mask values may exceed 255: store uint16


@dataclass(frozen=True, kw_only=True)
class ScannedSource:
    """What a source hands the compiler: records in their final order, class names, and notes.

    ``invalid`` lists (key, reason) of inputs found unusable while scanning (subject to the compile's
    on_error policy, like an undecodable image); ``attributes`` maps the extra per-box columns the
    records carry to their stored dtype; ``masks`` is set when every sample has a segmentation mask."""

    kind: str
    root: str
    task: str
    records: list[Record]
    classes: tuple[str, ...] = ()
    category_ids: tuple[int, ...] = ()
    attributes: dict = field(default_factory=dict)
    invalid: tuple[tuple[str, str], ...] = ()
    warnings: tuple[str, ...] = ()
    summary: dict = field(default_factory=dict)
    masks: MaskInfo | None = None
    fields: dict = field(default_factory=dict)  # value fields every sample has: name -> spec (formats/fields/columns)
    instance_masks: bool = False  # every target's ``shapes`` gives one mask per box: stored per object
    keypoints: Any = None  # a formats.fields.KeypointsSpec when the targets carry keypoints

    @property
    def names_classes(self) -> bool:
        """Whether the scan gives the dataset's class names. A classification or detection source whose
        classes are its label values (a WebDataset's ``.cls`` members without --classes, a Python dataset)
        names none before decoding: its names come from the labels (compile's ``_classes``)."""
        return bool(self.classes) or self.task not in ("classification", "detection")


@dataclass
class Item:
    """What a worker gets for a record: ``obj`` a path, a binary file object or an already decoded PIL
    image (``decoded``); ``mask`` a mask file (path or file object), a decoded mask (PIL image or array),
    or None (the target's segments, or no mask)."""

    obj: object
    label: int
    target: Target | None
    decoded: bool = False
    mask: object = None
    fields: dict | None = None  # value fields fetched with the sample (name -> value; the record's own come first)


MAX_TEXT_BYTES = 1 << 30  # an annotation or list file; anything larger is not one


def file_problem(path) -> str | None:
    """None when ``path`` is a regular file (links followed); ``"missing"`` when nothing is there; else why
    it cannot be read (a FIFO, a folder, a dangling link...), for a message. A source that treats a missing
    optional file (a YOLO label, a VOC XML) as 'none' must still refuse one that is there but unreadable."""
    import stat

    if is_remote(path):  # an object in a bucket: there or not (a folder's listing says so, else a HEAD request)
        there = path.is_file() if isinstance(path, RemotePath) else identity(os.fspath(path)) is not None
        return None if there else "missing"
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "a link to a missing file" if os.path.islink(path) else "missing"
    except ValueError:
        return "a name with a NUL character"
    except OSError as e:
        return f"unreadable ({e.strerror})"
    return None if stat.S_ISREG(st.st_mode) else "not a regular file"


def read_input(path, what: str, text: bool = True):
    """An input file of a source (annotations, split lists, label files, YAML), read whole: only a regular
    file is opened (a FIFO would block), and a file that is not UTF-8 text is a one-line SourceError."""
    import os
    import stat

    if is_remote(path):  # an object in a bucket
        try:
            data = read_bytes(os.fspath(path), MAX_TEXT_BYTES)
        except FileNotFoundError:
            raise SourceError(f"{path}: no such {what}") from None
        return data if not text else _text(data, path, what)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise SourceError(f"{path}: no such {what}") from None
    except OSError as e:
        raise SourceError(f"{path}: cannot read the {what} ({e.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        raise SourceError(f"{path}: the {what} is not a regular file")
    if st.st_size > MAX_TEXT_BYTES:
        raise SourceError(f"{path}: {st.st_size:,} bytes is too large for a {what}")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise SourceError(f"{path}: cannot read the {what} ({e.strerror})") from None
    if not text:
        return data
    return _text(data, path, what)


def _text(data: bytes, path, what: str) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise SourceError(f"{path}: the {what} is not UTF-8 text (byte {e.start}); save it as UTF-8") from None


def where(r: Record) -> str:
    """A record's origin for messages: its file, or its table row / dataset index."""
    if r.member:
        return f"{r.path}:{r.member[0]}"
    if r.row < 0:
        return r.path
    return f"{r.path} row {r.row}" if r.path else f"dataset[{r.row}]"


def file_item(r: Record) -> Item:
    """The fetch of every source whose records are files: the worker decodes ``r.path`` (and ``r.mask``)."""
    return Item(r.path, r.label, r.target, mask=r.mask or None)


def drop_empty(scanned: ScannedSource) -> ScannedSource:
    """Leave out detection records without any box (by default they are kept as negatives)."""
    records = [r for r in scanned.records if r.target is None or len(r.target.boxes)]
    return replace(scanned, records=records,
                   summary={**scanned.summary, "dropped_empty_images": len(scanned.records) - len(records)})


# ----------------------------------------------------------------------------- parameters
PARAM_TYPES = ("str", "int", "flag", "dir", "file", "path", "choice", "csv", "object")


@dataclass(frozen=True)
class Param:
    """One parameter of a source, declared once for the CLI and the Python function.

    ``type``: str | int | flag | dir | file | path | choice | csv (a comma-separated list on the CLI, a
    list in Python) | object (Python only). ``required`` parameters come first in ``dsc.compile_<name>``
    (positionally, before OUT); ``argument`` makes one a positional CLI argument instead of an option.
    ``flag`` spells the CLI option when it is not ``--name-with-dashes``; ``python=False`` keeps a
    CLI-only switch out of the function (the source's ``from_cli`` folds it into the others)."""

    name: str
    help: str = ""
    type: str = "str"
    default: Any = None
    required: bool = False
    argument: bool = False
    flag: str | None = None
    choices: tuple = ()
    cli: bool = True
    python: bool = True
    metavar: str | None = None
    multiple: bool = False  # a CLI option given once per value (--column a --column b); a list in Python
    flag_value: Any = None  # a choice whose CLI option may come without a value (``--masks`` = ``--masks semantic``):
    # True / that value are True, absent is False (what the flag it grew from recorded), other choices as given

    def __post_init__(self):
        if self.type not in PARAM_TYPES:
            raise ConfigError(f"source parameter {self.name!r}: type must be one of {PARAM_TYPES}")
        if self.type == "choice" and not self.choices:
            raise ConfigError(f"source parameter {self.name!r}: a choice needs its choices")

    @property
    def option(self) -> str:
        return self.flag or "--" + self.name.replace("_", "-")

    def convert(self, source: str, value):
        """Check (and normalise) a Python value; raises ConfigError naming the source and parameter."""
        if value is None:
            if self.required:
                raise ConfigError(f"{source}: {self.name} is required")
            return False if self.type == "flag" or self.flag_value is not None else None
        bad = None
        if self.type == "flag":
            if not isinstance(value, (bool, np.bool_)):
                bad = "True or False"
            else:
                value = bool(value)
        elif self.type == "int":
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
                bad = "an integer"
            value = int(value) if bad is None else value
        elif self.type == "choice":
            if self.flag_value is not None and (isinstance(value, (bool, np.bool_)) or value == self.flag_value):
                return bool(value)  # the bare flag (True: its value, recorded as before it took values)
            if value not in self.choices:
                bad = "one of " + ", ".join(map(str, self.choices))
        elif self.type == "csv" and self.multiple:
            value = (value,) if isinstance(value, str) else value
            if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
                bad = "a list of strings"
            else:
                value = tuple(value)
        elif self.type == "csv":
            if isinstance(value, str):
                value = [v.strip() for v in value.split(",") if v.strip()]
            if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
                bad = "a list of names (or one comma-separated string)"
            else:
                value = tuple(value)
        elif self.type in ("dir", "file", "path", "str"):
            import os

            if not isinstance(value, (str, os.PathLike)):
                bad = "a path" if self.type != "str" else "a string"
            value = os.fspath(value) if bad is None and self.type != "str" else value
        if bad:
            raise ConfigError(f"{source}: {self.name} must be {bad}, got {value!r}")
        return value


# ----------------------------------------------------------------------------- the interface
class Source:
    """Base of every source. Subclasses set ``name``, ``params`` and implement ``scan``; sources whose
    records are not plain files also implement ``fetcher``. The docstring's first paragraph is the help.

    Instances are built from keyword parameters (``Source(**params)``): each declared parameter becomes
    an attribute, checked by its :class:`Param`. A source instance travels to the compile workers (by
    fork, or pickled for a Dask cluster), so it holds only what the workers need."""

    name: ClassVar[str] = ""
    params: ClassVar[tuple[Param, ...]] = ()
    task: ClassVar[str] = ""  # what it usually makes (for the help): classification, detection, segmentation
    cli: ClassVar[bool] = True  # a `dsc compile <name>` command (False: Python only, e.g. in-memory datasets)
    local_only: ClassVar[bool] = False  # its data lives in this process: forked local workers only, no Dask
    makes_masks: ClassVar[bool] = False  # it can give masks (Item.mask): its CLI command offers --mask-ignore
    rows_in_files: ClassVar[bool] = False  # records are rows of shared files (tables): a file's size says nothing
    shares_reads: ClassVar[bool] = False  # neighbouring units read the same bytes (a Parquet row group): a worker
    #                                      takes the unit after its last one (pool._Runs), reading them once
    update_free: ClassVar[tuple[str, ...]] = ()  # parameters an --update may change (a table version to read)

    def __init__(self, **kwargs):
        known = [p.name for p in self.params if p.python]
        unknown = sorted(set(kwargs) - set(known))
        if unknown:
            raise ConfigError(f"{self.name}: unknown parameter{'s' if len(unknown) > 1 else ''} "
                              f"{', '.join(unknown)} (it takes: {', '.join(known) or 'nothing'})")
        for p in self.params:
            if p.python:
                setattr(self, p.name, p.convert(self.name, kwargs.get(p.name, p.default)))

    @classmethod
    def from_cli(cls, **kwargs) -> "Source":
        """The source from parsed CLI options. CLI-only switches (``python=False``) are dropped here;
        a source that has one overrides this to fold it into its parameters."""
        return cls(**{p.name: kwargs[p.name] for p in cls.params if p.python and p.name in kwargs})

    @classmethod
    def summary(cls) -> str:
        doc = (cls.__doc__ or "").strip()
        return doc.split("\n\n")[0].replace("\n", " ") if doc else cls.name

    def scan(self) -> ScannedSource:
        raise NotImplementedError(f"{type(self).__name__}.scan() is not implemented: a source must return a "
                                  f"ScannedSource from scan()")

    def prepare(self) -> ScannedSource:
        """``scan()``, then what shared parameters do to its records (``drop_empty_images``). Whatever else a
        source's own code raises becomes a SourceError naming the source."""

        try:
            scanned = self.scan()
        except (DscError, OSError, KeyboardInterrupt):
            raise
        except Exception as e:  # noqa: BLE001 - a plugin's bug: one line naming the source, not a traceback
            raise SourceError(f"the {self.name!r} source failed while scanning: {type(e).__name__}: {e}") from e
        if not isinstance(scanned, ScannedSource):
            raise SourceError(f"the {self.name!r} source's scan() returned {type(scanned).__name__}, not a "
                              f"ScannedSource")
        if getattr(self, "drop_empty_images", False):
            scanned = drop_empty(scanned)
        scanned = check_text(scanned)
        dups = duplicate_keys(scanned.records)
        if dups:
            from dataclasses import replace

            scanned = replace(scanned, warnings=(*scanned.warnings, f"{len(dups)} key{'s' if len(dups) > 1 else ''} "
                              f"name more than one input (first: {dups[0]!r}); such samples are told apart only by "
                              f"position, and --update refuses the dataset until every key is unique"))
        return scanned

    def fetcher(self, records: list[Record]) -> Callable[[Record], Item]:
        """Runs in a worker, once per unit: a function record -> :class:`Item` (a table source reads the
        unit's rows in one go here)."""
        return file_item

    def prefetch(self, records: list[Record]) -> None:
        """Runs in a worker as a unit starts: ``records`` are those of the unit it will probably run next (see
        ``shares_reads``), told only where their bytes are (:func:`where_to_read`: path, row, mask, member); a
        source may start reading them in the background. Default: nothing."""

    def per_task(self) -> "Source":
        """The source as it travels with each of a cluster's tasks (pickled with every one, where a pool's worker
        gets it once): ``self``, less what is worth sending once only (a table's scanned footers). Default: self."""
        return self

    def unchanged_since(self, summary: dict) -> set[str] | None:
        """For ``--update``: the input files (``Record.path``) this source knows to be unchanged since the
        compile whose scan summary is ``summary`` (a Delta table's log says which files two table versions
        share). None (the default): the update compares each input's stat, then its bytes."""
        return None

    def config(self) -> dict:
        """The parameters that decide the output's bytes, for the resume fingerprint (JSON values)."""
        out = {}
        for p in self.params:
            v = getattr(self, p.name, None)
            if p.python and p.type != "object":
                out[p.name] = list(v) if isinstance(v, tuple) else v
        return out

    def __repr__(self):
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self.config().items())})"


def duplicate_keys(records) -> list[str]:
    """Keys that more than one record has, in order of first appearance."""
    seen, dups = set(), {}
    for r in records:
        if r.key in seen:
            dups.setdefault(r.key, None)
        seen.add(r.key)
    return list(dups)


DROP_EMPTY = Param("drop_empty_images", "Leave out images without boxes (kept as negatives by default).",
                   type="flag", default=False, flag="--drop-empty")
ALLOW_OUTSIDE = Param("allow_outside_images", "Let annotation file names point outside the images folder "
                                            "('../x.jpg', absolute paths); refused by default.",
                      type="flag", default=False)
