"""WebDataset tar shards (what img2dataset writes; how LAION, DataComp, CC12M and many Hugging Face image sets
are published): ``00000.tar`` holding ``key.jpg``, ``key.cls``, ``key.json``, ``key.txt``...

Samples are grouped by key as WebDataset groups them: a member's key is its path up to the first dot of its
file name, its extension the rest (lower-cased), and consecutive members with one key are one sample.
Non-regular members and ``__name__`` metadata members are ignored. The image is the sample's member with
the first extension of ``image_ext`` it has; the label is the integer in its ``.cls`` member
(``label_ext``) or a key of its ``.json`` member (``label_key``).

Tars are streamed, never unpacked: the scan reads the members' headers (and each label member), on
threads, or on the cluster's workers with ``--executor``; a worker then reads only the byte ranges of its
unit's image members (one sequential pass over a range of a tar). A unit of work is a range of one tar (a
shard may span the end of one tar and the start of the next), so the resume journal and ``--update`` see
a changed tar through its size and modification time (an object's ETag). Keys are ``<tar file name>/<key>``.

The other members become value fields, named by their extension as WebDataset's ``to_tuple("jpg", "cls", "txt")``
names them (a dot or dash in it becomes ``_``: ``emb.npy`` -> ``emb_npy``): by default those of ``MEMBER_FIELDS``
the first sample has (``.txt`` -> text, ``.json`` -> json, ``.npy`` -> an array, read with numpy's format, never
a pickle); ``--member EXT[:KIND]`` (repeatable) names them instead (KIND: text, json, bytes, array, or a declared
kind such as ``float16[768]``; ``--member none`` keeps none). The scan reads them into the records (so
``--update`` sees a changed caption whose image did not change); a member that does not decode, or a sample
without a member the first sample has, is a named skip. Members kept by none of these are named in a warning.
"""
from __future__ import annotations

import io
import json
import os
import re
import tarfile
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ...env import cgroup_limit
from ...errors import ConfigError, DscError, RemoteError, SampleError, SourceError
from ...formats.fields import declared_spec, infer_spec
from ...formats.manifest import batch_name_problem
from .base import Item, Param, Record, ScannedSource, Source, read_input, where
from .inputs import check_input, is_prefix, is_remote, list_objects, name_of, open_input, open_scanned, read_bytes

TAR_EXTENSIONS = (".tar",)
IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp")
INDEX_THREADS = 8  # tars indexed at once by the scan (each a stream of header reads)
READ_AHEAD = 8 << 20  # bytes of a tar in object storage read ahead of a unit's decode (per tar the unit reads)
EAGER_TARS = 4  # a unit spanning at most this many tars requests them all when it starts
MAX_LABEL_BYTES = 1 << 20
# the image bytes a scan of tars in object storage keeps, of those it streams past, for the units (the first
# compile then downloads each of those tars once, not once to index it and again to decode it); past it, a unit
# reads its range of the tar (and never more than an eighth of the machine's memory: ``keep_budget``)
KEEP_BYTES = 512 << 20


def keep_budget(cgroups: str | None = None, mounts: dict | None = None) -> int:
    """The image bytes a scan may keep: ``KEEP_BYTES``, at most an eighth of the memory the process may use (the
    machine's, or its cgroup's limit where one is set: ``env.cgroup_limit``, which finds the process's own cgroup,
    v2 or v1, as the runtime does; ``cgroups`` / ``mounts``: as it takes them)."""
    try:
        memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # (no sysconf: not Linux or macOS)
        memory = None
    cg = cgroup_limit(cgroups, mounts)
    if cg is not None:
        memory = cg[0] if memory is None else min(memory, cg[0])
    return KEEP_BYTES if memory is None else min(KEEP_BYTES, memory // 8)

# The members a sample has besides its image and label that become fields by default (when the first sample
# has them): extension -> how it decodes ("text": UTF-8, "json", "array": a .npy, "bytes": as is).
MEMBER_FIELDS: dict[str, str] = {"txt": "text", "text": "text", "json": "json", "npy": "array"}
MAX_MEMBER_BYTES = 1 << 26  # a member read into a field by the scan; anything larger is not a value

_KEY_RE = re.compile(r"^((?:.*/|)[^./]+)[.]([^/]*)$")  # webdataset's base_plus_ext: key up to the first dot


def split_member(name: str) -> tuple[str, str] | None:
    """(key, extension) of a member name as WebDataset splits it (``a/b.c.jpg`` -> ``a/b``, ``c.jpg``); None for
    a name without an extension."""
    m = _KEY_RE.match(name)
    return (m.group(1), m.group(2).lower()) if m else None


def expand_braces(pattern: str) -> list[str]:
    """``{00000..00003}`` ranges (zero-padded to the width of the first bound) and ``{a,b}`` alternatives,
    expanded left to right as the ``braceexpand`` package does."""
    m = re.search(r"\{([^{}]*)\}", pattern)
    if m is None:
        return [pattern]
    head, body, tail = pattern[:m.start()], m.group(1), pattern[m.end():]
    rng = re.fullmatch(r"(\d+)\.\.(\d+)", body)
    if rng:
        a, b = rng.groups()
        width = len(a) if a.startswith("0") else 0
        lo, hi = int(a), int(b)
        step = 1 if hi >= lo else -1
        options = [str(i).zfill(width) for i in range(lo, hi + step, step)]
    else:
        options = body.split(",")
    return [x for opt in options for x in expand_braces(head + opt + tail)]


def tar_list(src: str) -> list[str]:
    """The tars ``src`` names: a brace pattern, a folder (or URL prefix) of .tar files, a list file (one tar
    a line, relative to the list's folder unless absolute or a URL), or one tar."""
    src = check_input(src)
    if "{" in src:
        return expand_braces(src)
    if is_remote(src):
        if src.lower().endswith(TAR_EXTENSIONS):
            return [src]
        if is_prefix(src):
            tars = [u for u, _ in list_objects(src) if u.lower().endswith(TAR_EXTENSIONS)]
            if not tars:
                raise SourceError(f"{src}: no .tar objects under this prefix")
            return tars
        return _list_file(src)
    if os.path.isdir(src):
        tars = sorted(os.path.join(d, f) for d, _, files in os.walk(src, followlinks=True) for f in files
                      if f.lower().endswith(TAR_EXTENSIONS) and not f.startswith("."))
        if not tars:
            raise SourceError(f"{src}: no .tar files in this folder")
        return tars
    if not os.path.exists(src):
        raise SourceError(f"{src}: no such tar, folder or list file. Give tars as 'SRC/{{00000..00099}}.tar', a "
                          f"folder of .tar files, or a text file listing them")
    if src.lower().endswith(TAR_EXTENSIONS):
        return [os.path.abspath(src)]
    return _list_file(src)


def _list_file(path: str) -> list[str]:
    text = read_input(path, "list of tars") if not is_remote(path) else _remote_text(path)
    base = path.rsplit("/", 1)[0] if is_remote(path) else os.path.dirname(os.path.abspath(path))
    tars = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if is_remote(line) or os.path.isabs(line):
            tars.append(check_input(line))
        else:
            tars.append(base.rstrip("/") + "/" + line if is_remote(base) else os.path.join(base, line))
    if not tars:
        raise SourceError(f"{path}: the list of tars names none")
    return tars


def _remote_text(url: str) -> str:
    try:
        data = read_bytes(url, 1 << 26)
    except FileNotFoundError:
        raise SourceError(f"{url}: no such object (a tar, a prefix of tars, or a list of tars)") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise SourceError(f"{url}: not a tar, and not a UTF-8 list of tars") from None


@dataclass(frozen=True)
class Sample:
    """One sample of a tar, as the scan found it: its key, the image member (name, data offset, size), its
    label (-1: none), every member (extension -> (offset, size)) and what is wrong with it (None: nothing);
    ``data``: the image member's bytes, when the scan kept them (``Keep``)."""

    key: str
    image: tuple | None
    label: int
    members: dict
    problem: str | None = None
    values: dict | None = None  # extension -> decoded value of the members read for fields
    data: bytes | None = None


class Keep:
    """How many image bytes a scan may still keep (``KEEP_BYTES``), shared by its threads: a tar's images are
    kept whole or not at all (``take`` its image bytes before the walk, ``give`` back what it did not keep)."""

    def __init__(self, limit: int):
        self.left, self._lock = int(limit), threading.Lock()

    def take(self, n: int) -> bool:
        with self._lock:
            if n > self.left:
                return False
            self.left -= n
            return True

    def give(self, n: int) -> None:
        with self._lock:
            self.left += n


def _label_of(data: bytes, ext: str, key_name: str | None) -> int:
    """The class index in a label member's bytes (``.cls``: an integer as text; ``.json``: ``key_name``'s value)."""
    if key_name is not None:
        try:
            value = json.loads(data)
        except (ValueError, UnicodeDecodeError):
            raise ValueError(f"the .{ext} member is not JSON") from None
        if not isinstance(value, dict) or key_name not in value:
            raise ValueError(f"the .{ext} member has no key {key_name!r}")
        value = value[key_name]
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"the .{ext} member's {key_name!r} is {value!r}, not an integer class index")
        return value
    try:
        return int(data.decode("utf-8").strip())
    except (ValueError, UnicodeDecodeError):
        raise ValueError(f"the .{ext} member holds {data[:40]!r}, not an integer class index") from None


_NPY_HEADER = threading.Lock()


def decode_member(data: bytes, ext: str, how: str):
    """A member's value for its field: ``how`` "text" (UTF-8), "json", "array" (a .npy, numpy's format, never a
    pickle) or "bytes". Raises ValueError naming the member."""
    try:
        if how == "text":
            return data.decode("utf-8")
        if how == "json":
            return json.loads(data)
        if how == "array":
            import numpy as np

            with _NPY_HEADER:  # numpy parses a .npy header with ast.literal_eval, which CPython 3.11 cannot run in
                return np.load(io.BytesIO(data), allow_pickle=False)  # two threads at once (gh-106905)
    except (ValueError, UnicodeDecodeError, OSError, EOFError) as e:
        what = {"text": "UTF-8 text", "json": "JSON", "array": "a .npy array (numpy's format, no pickles)"}[how]
        raise ValueError(f"its .{ext} member is not {what} ({e})") from None
    return data


def index_tar(tar: str, image_ext: tuple, label_ext: str | None, label_key: str | None,
              read: dict | None = None, keep: Keep | None = None) -> tuple[list[Sample], str | None]:
    """The samples of one tar in member order, and what cut it short (a truncated tar: None when whole). Reads
    the headers, each label member and the members of ``read`` (extension -> how it decodes: ``decode_member``);
    the images only with ``keep`` (a tar in object storage whose bytes fit what is left of it: ``Sample.data``).
    Runs on a thread of the scan or on a Dask worker. One pass: a member it reads is read as its header is (in tar
    order), so a tar in object storage is one streamed GET (no HEAD: its response says the size), never read
    twice."""
    samples: list[Sample] = []
    cut = None
    label_member = "json" if label_key is not None else label_ext
    limits = {label_member: MAX_LABEL_BYTES} if label_member is not None else {}
    limits.update({e: MAX_MEMBER_BYTES for e in (read or {})})  # what is read as the walk passes it
    f, size = open_scanned(tar)
    kept = keep is not None and is_remote(tar) and keep.take(size)  # (the tar's size bounds its images' bytes)
    images = set(image_ext) if kept else ()

    def failed(at: int, e: BaseException) -> RemoteError:  # (a tar in a bucket whose read failed past the retries)
        if kept:
            keep.give(size)
        at = max(at, int(getattr(getattr(f, "raw", None), "pos", 0) or 0))  # (where the stream stopped, when later)
        return read_failed(tar, f"reading it failed at byte {at:,} of {size:,}", e)
    with f:
        try:
            tf = tarfile.open(fileobj=f, mode="r:")
        except tarfile.ReadError as e:
            if kept:
                keep.give(size)
            return [], f"not a readable tar file ({e})"
        groups: list[list] = []  # [key, {ext: (name, offset, size)}, duplicated ext or None, {ext: bytes}]
        while True:
            try:
                ti = tf.next()
            except DscError:  # (the network failed past its retries: not a truncated tar, the scan stops)
                raise
            except (tarfile.ReadError, EOFError) as e:
                cut = f"the tar is truncated or damaged at byte {tf.offset:,} of {size:,} ({e})"
                break
            except Exception as e:  # noqa: BLE001 - an object's stream failed (obstore's errors are no OSError)
                if is_remote(tar):
                    raise failed(tf.offset, e) from None
                if not isinstance(e, OSError):
                    raise
                cut = f"the tar is truncated or damaged at byte {tf.offset:,} of {size:,} ({e})"
                break
            if ti is None:
                if size - tf.offset < 1024:  # no end-of-archive blocks: the file stops inside a header or after
                    cut = f"the tar is truncated: it stops at byte {size:,} without its end-of-archive blocks"
                break
            if not ti.isreg():
                continue
            base = ti.name.rsplit("/", 1)[-1]
            if "/" not in ti.name and base.startswith("__") and base.endswith("__"):
                continue
            parts = split_member(ti.name)
            if parts is None:
                continue
            key, ext = parts
            if ti.offset_data + ti.size > size:
                cut = (f"the tar is truncated: member {ti.name!r} needs bytes up to {ti.offset_data + ti.size:,}, "
                       f"the file has {size:,}")
                if groups and groups[-1][0] != key:  # the samples before the cut one are whole
                    groups.append([key, {}, None, {}])
                break
            if not groups or groups[-1][0] != key:
                groups.append([key, {}, None, {}])
            if ext in groups[-1][1]:
                groups[-1][2] = ext
            groups[-1][1][ext] = (ti.name, ti.offset_data, ti.size)
            if ti.size <= limits.get(ext, -1) or ext in images:  # a label or field member (or a kept image):
                try:                                                # read now, the stream is there
                    f.seek(ti.offset_data)
                    groups[-1][3][ext] = f.read(ti.size)
                except DscError:
                    raise
                except Exception as e:  # noqa: BLE001 - as the header's read above
                    if not is_remote(tar):
                        raise
                    raise failed(ti.offset_data, e) from None
        if cut is not None and groups:  # the sample the tar stops in may have lost members: not compiled
            cut += f"; its samples from {groups[-1][0]!r} on are missing"
            groups.pop()
        order = [tuple(g) for g in groups]
        for key, members, dup, read_now in order:
            problem, label, image = None, -1, None
            if dup is not None:
                problem = f"two members named {key}.{dup}; a sample holds one member per extension"
            image_ext_found = next((e for e in image_ext if e in members), None)
            if problem is None and image_ext_found is None:
                have = ", ".join("." + e for e in sorted(members)) or "nothing"
                problem = (f"no image member ({', '.join('.' + e for e in image_ext)}); it has {have} "
                           f"(--image-ext names the extensions)")
            if image_ext_found is not None:
                image = members[image_ext_found]
            wanted = [e for e in (read or {}) if e in members and e != image_ext_found]
            blobs = {}  # the label's and the fields' members (read during the walk)
            if problem is None:
                if label_member is not None and label_member in members \
                        and members[label_member][2] <= MAX_LABEL_BYTES:
                    wanted.append(label_member)
                big = next((e for e in wanted if e != label_member and members[e][2] > MAX_MEMBER_BYTES), None)
                if big is not None:
                    problem = f"the .{big} member has {members[big][2]:,} bytes, too many for a field"
                blobs = {e: read_now[e] for e in wanted if e in read_now} if problem is None else {}
            if problem is None and label_member is not None:
                if label_member not in members:
                    problem = (f"no .{label_member} member for its label (--no-label compiles images only"
                               + (", --label-key takes it from the .json member" if label_key is None else "") + ")")
                elif label_member not in blobs:
                    problem = f"the .{label_member} member has {members[label_member][2]:,} bytes, too many for a label"
                else:
                    try:
                        label = _label_of(blobs[label_member], label_member, label_key)
                    except ValueError as e:
                        problem = str(e)
            values = {}
            for ext, how in (read or {}).items():
                if problem is not None or ext not in blobs:
                    continue
                try:
                    values[ext] = decode_member(blobs[ext], ext, how)
                except ValueError as e:
                    problem = str(e)
            data = read_now.get(image_ext_found) if images and problem is None else None
            samples.append(Sample(key, image, label, {e: (o, n) for e, (_, o, n) in members.items()}, problem,
                                  values, data))
    if kept:  # (what the tar held besides the images it kept: headers, labels, skipped samples' images)
        keep.give(size - sum(len(s.data) for s in samples if s.data is not None))
    return samples, cut


def _threads(fn, items):
    with ThreadPoolExecutor(min(INDEX_THREADS, max(1, len(items)))) as pool:
        return list(pool.map(fn, items))


class WebDatasetSource(Source):
    """WebDataset tar shards: 'SRC/{00000..01023}.tar', a folder or prefix of tars, or a list file.

    Local or in object storage (s3://, gs://, az://). Samples are grouped by key as WebDataset does (the path
    up to the first dot of a member's file name); the image is the first member found of --image-ext, the
    label the integer in the .cls member (--label-ext) or a key of the .json member (--label-key). The .txt,
    .json and .npy members become fields named by their extension (--member picks them). Tars are streamed,
    never unpacked to disk."""

    name = "webdataset"
    task = "classification"
    rows_in_files = True
    params = (
        Param("src", "Tars: a brace pattern ('SRC/{00000..00099}.tar'), a folder or URL prefix of .tar files, or a "
                     "text file listing them (local or s3://, gs://, az://).", type="path", required=True,
              argument=True),
        Param("image_ext", "Member extensions the image is taken from, the first a sample has.", type="csv",
              default=IMAGE_EXTENSIONS),
        Param("label_ext", "Extension of the member holding the integer class index.", default="cls"),
        Param("label_key", "Take the label from this key of the sample's .json member instead."),
        Param("no_label", "The samples have no labels (images only).", type="flag", default=False, python=False),
        Param("classes", "Comma-separated class names (default: the label values).", type="csv"),
        Param("members", "A member stored as a field named by its extension: EXT or EXT:KIND (KIND: text, json, "
                         "bytes, array for a .npy, or a declared kind such as float16[768]; omitted: text for "
                         ".txt, json for .json, array for .npy). Repeat it for more; 'none' keeps none. Default: "
                         "the .txt, .json and .npy members the first sample has.",
              type="csv", flag="--member", multiple=True, metavar="EXT[:KIND]"),
    )

    # (set by the compile for its scan: a map(fn, items) on the cluster's workers; threads by default)
    index_map = None
    keep_images = True  # (False for a scan whose records no unit decodes: a dry run; see compiler._scan)

    @classmethod
    def from_cli(cls, no_label: bool = False, **kwargs) -> "WebDatasetSource":
        if no_label and kwargs.get("label_key") is not None:
            raise ConfigError(f"--no-label and --label-key {kwargs['label_key']} contradict each other: give one "
                              f"(--label-key takes the label from the .json member, --no-label compiles images only)")
        return cls(**{**kwargs, "label_ext": None if no_label else kwargs.get("label_ext")})

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.image_ext = tuple(e.lower().lstrip(".") for e in self.image_ext)
        if self.label_ext is not None:
            self.label_ext = self.label_ext.lower().lstrip(".")

    @property
    def labelled(self) -> bool:
        return self.label_ext is not None or self.label_key is not None

    def _member_decls(self) -> list | None:
        """[(ext, field name, declared spec or None)] of ``--member``; None: the default (see MEMBER_FIELDS)."""
        if not self.members:
            return None
        if [m.strip().lower() for m in self.members] == ["none"]:
            return []
        out = []
        for text in self.members:
            ext, _, kind = str(text).partition(":")
            ext = ext.strip().lower().lstrip(".")
            if not ext:
                raise SourceError(f"--member {text!r}: give a member extension (EXT or EXT:KIND)")
            if ext in self.image_ext or ext == self.label_ext and self.label_key is None:
                raise SourceError(f"--member {text!r}: .{ext} is the sample's image or label member already")
            name = member_field_name(ext)
            problem = batch_name_problem(name, {"image", "label"})
            if problem:
                raise SourceError(f"--member {text!r}: the field name {name!r} {problem}")
            kind = kind.strip()
            if not kind or kind == "array":
                out.append((ext, name, {"how": kind or MEMBER_FIELDS.get(ext, "bytes")}))
                continue
            try:
                spec = {**declared_spec(kind), "declared": True}
            except ValueError as e:
                raise SourceError(f"--member {text!r}: {e}") from None
            out.append((ext, name, spec))
        return out

    def scan(self) -> ScannedSource:
        tars = tar_list(self.src)
        label_ext = self.label_ext if self.label_key is None else None
        decls = self._member_decls()
        taken = {*self.image_ext, label_ext}
        if decls is None:
            read = {e: how for e, how in MEMBER_FIELDS.items() if e not in taken}
        else:
            read = {e: (spec["how"] if "how" in spec else _how(spec)) for e, _, spec in decls}
        # (the image bytes the scan streams past are kept for the units, up to KEEP_BYTES; not on a cluster, whose
        # workers index the tars: the client never sees the pixels)
        index = _Index(self.image_ext, label_ext, self.label_key, read,
                       Keep(keep_budget()) if self.index_map is None and self.keep_images else None)
        # (each tar's identity is the one its scan's GET answered with, remembered where it ran: what a listing
        # said of it is not sent along, as that GET replaces it before any read)
        found = (self.index_map or _threads)(index, tars)
        records, invalid = [], []
        names = tuple(self.classes) if self.classes else ()
        first = next((s for samples, _ in found for s in samples if s.problem is None), None)
        declared = decls is not None
        for ext, _, _ in decls or ():  # a --member no sample has: a wrong name, not a sample to skip
            if not any(ext in (s.values or {}) for samples, _ in found for s in samples if s.problem is None):
                have = sorted(first.members) if first is not None else []
                raise SourceError(f"{self.src}: --member {ext}: no scanned sample has a .{ext} member"
                                  + (f" (the first sample has {', '.join('.' + e for e in have)})" if have else "")
                                  + "; check the name (the extension after the sample's key)")
        if decls is None:  # the default: the members of MEMBER_FIELDS the first sample has
            have = first.values if first is not None else {}
            decls = [(e, member_field_name(e), {"how": read[e]}) for e in sorted(have)]
        specs = {}
        for ext, name, spec in decls:
            if "how" in spec:
                how = spec["how"]
                if how in ("text", "json", "bytes"):
                    spec = {"kind": how}
                elif first is None or ext not in first.values:
                    spec = None  # (no sample to infer it from: every sample is skipped for lacking it)
                else:
                    try:
                        spec = infer_spec(first.values[ext], name)
                    except ValueError as e:
                        raise SourceError(f"{self.src}: the .{ext} member of the first sample holds {e}; declare "
                                          f"its kind with --member {ext}:KIND") from None
            if spec is not None:
                specs[name] = spec
        unkept: dict[str, int] = {}
        kept = {*taken, "json" if self.label_key is not None else None, *(e for e, _, _ in decls)}
        for tar, (samples, cut) in zip(tars, found):
            tname = name_of(tar)
            for j, s in enumerate(samples):
                key = f"{tname}/{s.key}"
                problem = s.problem
                if problem is None:
                    lacking = next((e for e, _, _ in decls if e not in s.values), None)
                    if lacking is not None:
                        problem = (f"no .{lacking} member, which " + ("--member names" if declared else
                                   "the first sample has") + " (every sample gives the same fields; --member "
                                   "names the members kept)")
                    for e in s.members:
                        if e not in kept:
                            unkept[e] = unkept.get(e, 0) + 1
                if problem is None and names and not 0 <= s.label < len(names):
                    problem = f"label {s.label} is not a class index (0..{len(names) - 1})"
                if problem is None and s.label < -1 or (self.labelled and problem is None and s.label < 0):
                    problem = f"label {s.label} is negative; labels are class indices 0..C-1"
                if problem is not None:
                    invalid.append((key, f"{tar}: {problem}"))
                    continue
                name, off, n = s.image
                records.append(Record(key=key, path=tar, label=s.label if self.labelled else -1, row=j,
                                      member=(name, off, n, s.data if s.data is not None else ()),
                                      fields=tuple((fname, s.values[e]) for e, fname, _ in decls)))
            if cut is not None:
                invalid.append((f"{tname}/*", f"{tar}: {cut}"))
        if not records and not invalid:
            raise SourceError(f"{self.src}: the tars hold no samples")
        for e in [e for e in unkept if e in self.image_ext]:
            del unkept[e]  # (a second image format of a sample: the first of --image-ext is its image)
        warnings = ()
        if unkept:
            warnings = (f"members not stored: {', '.join(f'.{e} ({n:,} samples)' for e, n in sorted(unkept.items()))}"
                        f"; --member EXT[:KIND] keeps one as a field",)
        return ScannedSource(kind="webdataset", root=self.src, task="classification" if self.labelled else "images",
                             records=records, classes=names, invalid=tuple(invalid), fields=specs,
                             warnings=warnings,
                             summary={"kind": "webdataset", "root": self.src, "tars": len(tars),
                                      "samples": len(records), "image_ext": list(self.image_ext),
                                      "label": (f"json:{self.label_key}" if self.label_key else self.label_ext),
                                      "members": {fname: "." + e for e, fname, _ in decls}})

    def fetcher(self, records: list[Record]):
        """A unit's images, read member by member in offset order from one open stream per tar (a sequential
        pass over the unit's range of each tar: one streamed request from object storage, for exactly the
        bytes from its first image to the end of its last; no request for the tar's size). In object storage
        the requests of every tar of the unit are made at once, and a thread per tar reads ahead of the decode
        (``READ_AHEAD`` bytes), so the next image, and the next tar's first ones, are there when they are
        needed. An image the scan kept (``KEEP_BYTES``) came with its record: nothing is read for it."""
        spans: dict[str, list[int]] = {}  # tar -> [first byte, end] of the unit's image members
        for r in records:
            _, off, n, data = r.member
            if data:
                continue
            span = spans.setdefault(r.path, [off, off + n])
            span[0], span[1] = min(span[0], off), max(span[1], off + n)
        opened: dict[str, object] = {}

        def open_tar(path: str):
            first, end = spans[path]
            try:
                opened[path] = open_input(path, end, sequential=True, start=first, ahead=READ_AHEAD)
            except FileNotFoundError:
                opened[path] = None

        if len(spans) <= EAGER_TARS and all(is_remote(p) for p in spans):
            for path in spans:
                open_tar(path)

        def fetch(r: Record) -> Item:
            name, off, n, data = r.member
            if not data:
                if r.path not in opened:
                    open_tar(r.path)
                f = opened[r.path]
                if f is None:
                    raise SampleError(where(r), "the tar is gone since the scan")
                data = _member(f, r, off, n)
            buf = io.BytesIO(data)  # (the fields' members were read by the scan: Record.fields)
            buf.name = where(r)
            return Item(buf, r.label, None)
        return fetch

    def config(self) -> dict:
        return super().config()


def _member(f, r: Record, offset: int, n: int) -> bytes:
    try:
        f.seek(offset)
        data = f.read(n)
    except FileNotFoundError:  # (an object's stream is opened on its read-ahead thread: missing shows here)
        raise SampleError(where(r), "the tar is gone since the scan") from None
    except DscError:
        raise
    except Exception as e:  # noqa: BLE001 - a tar in a bucket whose stream failed past its reopens
        if not is_remote(r.path):
            raise
        raise read_failed(r.path, f"reading its member at byte {offset:,} ({n:,} bytes) failed", e) from None
    if len(data) != n:
        raise SampleError(where(r), f"the tar was cut short since the scan ({len(data):,} of {n:,} bytes of a member)")
    return data


def read_failed(tar: str, what: str, e: BaseException) -> RemoteError:
    """The error of a read of a tar in a bucket whose stream failed past the store's retries and reopens (obstore's
    errors are no OSError): the tar, ``what`` was being read where, and the cause in one line, not a traceback."""
    return RemoteError(f"{tar}: {what} ({type(e).__name__}: {e}); run the compile again (its finished units are kept "
                       f"with --resume)")


def member_field_name(ext: str) -> str:
    """The field a member is stored as: its extension (``txt``), a dot or dash made ``_`` (``emb.npy`` ->
    ``emb_npy``), ``m_`` before one that starts with a digit."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", ext)
    return name if name[:1].isalpha() else "m_" + name


def _how(spec: dict) -> str:
    """How a member decodes for a declared kind: text, json and bytes as such, numbers and arrays from a .npy."""
    return spec["kind"] if spec.get("kind") in ("text", "json", "bytes") else "array"


class _Index:
    """``index_tar`` with the source's settings, as one picklable callable (it travels to Dask workers)."""

    def __init__(self, image_ext, label_ext, label_key, read=None, keep: Keep | None = None):
        self.image_ext, self.label_ext, self.label_key = tuple(image_ext), label_ext, label_key
        self.read = dict(read or {})
        self.keep = keep  # (None where it travels: a cluster's scan keeps no image)

    def __call__(self, tar: str):
        return index_tar(tar, self.image_ext, self.label_ext, self.label_key, self.read, self.keep)
