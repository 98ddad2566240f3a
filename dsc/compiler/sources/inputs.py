"""A source's inputs where they live: a local file, or an object in a bucket (``s3://``, ``gs://``, ``az://``).

The one place sources open, read, list and stat their inputs. A local path is read as a file; a URL through
``dsc.store`` (credentials and endpoints from the same environment variables as remote datasets:
``AWS_*``, ``GOOGLE_*``, ``AZURE_*``). Nothing is downloaded whole to be read: ``open_input`` gives a
seekable file that fetches ranges as it is read, so a tar is streamed and a Parquet file's row groups
are read by range. ``s3:/x`` style mistakes are refused with the URL meant (``check_input``).

An object's identity (size, last-modified time, ETag) stands in for a file's stat where the resume journal
and ``--update`` ask whether an input changed; what a listing returned is remembered, so that costs no
request per input.
"""
from __future__ import annotations

import os
import zlib

from ...errors import ConfigError, SourceError
from ...store import is_url, open_store, url_typo
from ...store.base import RangeFile
from ...store.object import etag_key

_IDENTITY: dict[str, tuple[int, float, str]] = {}  # url -> (size, mtime, etag), from listings (this process)
IDENTITY_LIMIT = 4_000_000  # entries kept from listings (a few hundred MB at most)


def is_remote(path) -> bool:
    """Whether ``path`` is an object-storage URL (not a local path)."""
    return is_url(os.fspath(path)) if isinstance(path, (str, os.PathLike)) else False


def check_input(path) -> str:
    """``path`` as text; a local path that does not exist but reads as a URL with a slash missing (``s3:/b/x``)
    is a ConfigError saying which URL was meant."""
    p = os.fspath(path)
    if not is_remote(p):
        meant = url_typo(p)
        if meant:
            raise ConfigError(f"{p!r} is not a URL: did you mean {meant}? (a local folder of that name: ./{p})")
    else:
        scheme, rest = p.split("://", 1)
        p = f"{scheme.lower()}://{rest}"
    return p


def split(url: str):
    """(the store of ``url``'s bucket, the object's path in it)."""
    scheme, rest = url.split("://", 1)
    bucket, _, rel = rest.partition("/")
    if not bucket:
        raise ConfigError(f"{url!r} names no bucket: give {scheme}://bucket/path")
    return open_store(f"{scheme}://{bucket}"), rel


def join(root: str, rel: str) -> str:
    """``rel`` (a '/'-separated path) under ``root`` (a folder or a URL prefix)."""
    if is_remote(root):
        return root.rstrip("/") + "/" + rel.lstrip("/")
    return os.path.join(root, *rel.split("/"))


def relative(path: str, top) -> str:
    """``path`` relative to the folder or URL prefix ``top``, '/'-separated."""
    top = os.fspath(top)
    if is_remote(path):
        top = top.rstrip("/") + "/"
        return path[len(top):] if path.startswith(top) else name_of(path)
    return os.path.relpath(path, top).replace(os.sep, "/")


def name_of(path: str) -> str:
    """The last part of a path or URL."""
    return path.rstrip("/").rsplit("/", 1)[-1] if is_remote(path) else os.path.basename(path)


def etag_of(etag) -> str:
    """An ETag as one spelling, whoever gave it (None: ""): the store's comparison form, ``etag_key`` (a GET and a
    listing of one object may quote it differently: fake-gcs does)."""
    return etag_key(str(etag or ""))


def remember(url: str, size: int, mtime: float, etag: str = "") -> None:
    """Keep what a listing, a HEAD or a GET said of ``url`` (replacing what was known, even when the cache is
    full: reads are pinned to the ETag kept here, and a stale one would refuse the object as it is now)."""
    if url in _IDENTITY or len(_IDENTITY) < IDENTITY_LIMIT:
        _IDENTITY[url] = (int(size), float(mtime), etag_of(etag))


def forget() -> None:
    """Drop every identity kept: each scan asks the bucket afresh (an object named by its URL, not listed, would
    otherwise keep the identity an earlier compile of this process saw, and its reads, pinned to that ETag,
    would refuse the object as it is now, however often the compile is run again)."""
    _IDENTITY.clear()


def known(paths) -> tuple:
    """The identities this process knows of the objects among ``paths`` (from a listing or a HEAD), as
    (url, size, mtime, etag): handed to the workers with their units (``remember_all``), so that a worker asks
    the bucket nothing the scan already did."""
    return tuple((p, *_IDENTITY[p]) for p in dict.fromkeys(paths) if p in _IDENTITY)


def remember_all(entries) -> None:
    """Take the identities ``known`` gave (in a worker)."""
    for url, size, mtime, etag in entries:
        remember(url, size, mtime, etag)


def list_objects(prefix: str) -> list[tuple[str, int]]:
    """(URL, size) of every object under the URL ``prefix`` (a folder: its objects at any depth), sorted;
    their identities are remembered."""
    store, rel = split(prefix)
    rel = rel.rstrip("/")
    out = []
    try:
        pre = rel + "/" if rel else ""
        listed = store.list_tagged(pre) if hasattr(store, "list_tagged") else [
            (*entry, "") for entry in store.list_detailed(pre)]
    except FileNotFoundError as e:
        raise SourceError(str(e)) from None
    base = prefix.split("://", 1)[0] + "://" + prefix.split("://", 1)[1].split("/", 1)[0]
    for path, size, mtime, etag in listed:
        url = f"{base}/{path}"
        remember(url, size, mtime, etag)
        out.append((url, size))
    return sorted(out)


def is_prefix(url: str) -> bool:
    """Whether the URL names a 'folder': objects exist below it (and not the object itself)."""
    store, rel = split(url)
    if rel and not rel.endswith("/") and store.stat(rel) is not None:
        return False
    try:
        return bool(store.list_detailed(rel.rstrip("/") + "/" if rel else ""))
    except FileNotFoundError:
        return False


def remembered(url: str) -> bool:
    """Whether this process knows the object's identity (a listing, a HEAD or a GET said it): asking costs nothing."""
    return url in _IDENTITY


def identity(path: str) -> tuple[int, int, int, int] | None:
    """(size, mtime_ns, ctime_ns, inode) of an input, as a file's stat gives them, or None when it is not there.
    An object's 'inode' is a checksum of its ETag and its ctime 0 (an object is replaced, never edited)."""
    if not is_remote(path):
        try:
            st = os.stat(path)
        except (OSError, ValueError):
            return None
        return st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino
    known = _object_identity(path)
    if known is None:
        return None
    size, mtime, etag = known
    return size, int(mtime * 1e9), 0, zlib.crc32(etag.encode())


def _object_identity(path: str) -> tuple[int, float, str] | None:
    """(size, last modified, ETag without quotes) of an object: remembered, else asked (None: not there)."""
    known = _IDENTITY.get(path)
    if known is None:
        store, rel = split(path)
        try:
            known = store.identity(rel)
        except OSError:
            known = None
        if known is None:
            return None
        known = (int(known[0]), float(known[1]), etag_of(known[2]))  # (as remembered: one spelling of the ETag)
        remember(path, *known)
    return known


def quoted_inode(path: str) -> int | None:
    """An object's 'inode' (``identity``) as a dsc that kept S3's ETags in their quotes wrote it: the checksum of
    ``"<etag>"``. A stat cache or a journal written by it is read with this too, so its inputs are not taken for
    changed (every input's bytes read again on each ``--update``, a resume's units compiled again). None for a file
    or an object without an ETag."""
    if not is_remote(path):
        return None
    known = _object_identity(path)
    if known is None or not known[2]:
        return None
    return zlib.crc32(f'"{known[2]}"'.encode())


def size_of(path: str) -> int:
    """An input's size in bytes (SourceError when it is not there)."""
    found = identity(path)
    if found is None:
        raise SourceError(f"{path}: no such file" + ("" if not is_remote(path) else " (no such object)"))
    return found[0]


def open_scanned(path: str):
    """(a sequential binary file of the input, its size) for a scan that reads it from its start (a tar's index):
    a local file and its stat; an object by one GET whose response gives its size, time and ETag, remembered as
    its identity (``identity``, ``inputs_of``), so that the journal and ``--update`` judge it by the bytes this
    scan read: no HEAD first, and nothing a listing or an earlier scan of this process said of an older object of
    that name is trusted. SourceError when it is not there."""
    if not is_remote(path):
        try:
            f = open(path, "rb")
        except FileNotFoundError:
            raise SourceError(f"{path}: no such file") from None
        return f, os.fstat(f.fileno()).st_size
    store, rel = split(path)
    try:
        f, (size, mtime, etag) = store.open_whole(rel)
    except FileNotFoundError:
        raise SourceError(f"{path}: no such file (no such object)") from None
    remember(path, size, mtime, etag)
    return f, size


def read_tail(url: str, n: int) -> bytes | None:
    """An object's last ``n`` bytes (all of it when smaller), or None when it is not there, by one GET whose response
    also says its size, time and ETag, remembered as its identity (``identity``): a reader that starts at the end
    (a Parquet footer) asks no HEAD first, and its later ranges (``open_input``) are pinned to the object this GET
    read."""
    store, rel = split(url)
    try:
        data, (size, mtime, etag) = store.read_tail(rel, n)
    except FileNotFoundError:
        return None
    remember(url, size, mtime, etag)
    return bytes(data)


def open_input(path: str, size: int | None = None, buffer: int = 4 << 20, sequential: bool = False,
               start: int | None = None, ahead: int = 0, tail: bytes | None = None):
    """A seekable binary file of the input: a local file, or an object read as it is consumed (never downloaded
    whole): by ranges of ``buffer`` bytes, or with ``sequential`` by one streamed request from where reading
    starts (a tar, member after member). ``size``: the object's, when a listing said it (saves a request), or
    where reading ends (no byte past it is asked for). ``start`` and ``ahead`` (sequential): the request is made
    now, at ``start``, and a thread reads up to ``ahead`` bytes ahead of the caller. ``buffer`` 0 (not
    sequential): unbuffered, each read one range request for exactly its bytes, but for those inside ``tail``
    (the object's last bytes, as ``read_tail`` gave them: served from it)."""
    if not is_remote(path):
        return open(path, "rb")
    store, rel = split(path)
    size = size if size is not None else size_of(path)
    # every request reads the object the listing saw (its ETag): one replaced since is an ObjectChangedError, never
    # a scan's offsets over another tar's bytes
    pin = {"etag": _IDENTITY[path][2]} if _IDENTITY.get(path, (0, 0, ""))[2] else {}
    if sequential:
        return store.reader(rel, size, buffer, sequential=True, start=start, ahead=ahead, **pin)
    if buffer <= 0:  # unbuffered: each read one request for exactly its bytes (a reader whose reads are few, large)
        f = RangeFile(store, rel, size, **pin)
        if tail:
            f.keep(size - len(tail), tail)
        return f
    return store.reader(rel, size, buffer, **pin)


def read_bytes(path: str, limit: int | None = None) -> bytes:
    """The whole input (an annotation file, an image): at most ``limit`` bytes (more is a SourceError)."""
    if not is_remote(path):
        with open(path, "rb") as f:
            data = f.read(limit + 1 if limit is not None else -1)
    else:
        store, rel = split(path)
        data = store.get(rel, limit + 1 if limit is not None else None)
    if limit is not None and len(data) > limit:
        raise SourceError(f"{path}: more than {limit:,} bytes")
    return data


class RemotePath(os.PathLike):
    """A folder or object under a URL prefix, with the few ``pathlib.Path`` operations the layout sources (YOLO,
    VOC) walk their root with: ``/``, ``parent``, ``name``, ``stem``, ``suffix``, ``is_file``, ``is_dir``,
    ``glob("*.txt")`` (its direct children), ``exists``. What exists comes from one listing of the root
    (``remote_root``), so a scan costs one listing, not a request per file. ``str()`` / ``os.fspath`` is the URL."""

    def __init__(self, url: str, listing: "_Listing"):
        self.url, self._listing = url.rstrip("/"), listing

    def __fspath__(self) -> str:
        return self.url

    __str__ = __fspath__

    def __repr__(self):
        return f"RemotePath({self.url!r})"

    def __eq__(self, other):
        return isinstance(other, RemotePath) and other.url == self.url

    def __hash__(self):
        return hash(self.url)

    def __truediv__(self, rel) -> "RemotePath":
        rel = os.fspath(rel)
        if is_remote(rel):
            return RemotePath(rel, self._listing)
        scheme, rest = self.url.split("://", 1)
        bucket, _, key = rest.partition("/")
        import posixpath

        key = posixpath.normpath(posixpath.join("/" + key, rel.replace(os.sep, "/"))).lstrip("/")
        return RemotePath(f"{scheme}://{bucket}/{key}", self._listing)

    @property
    def parent(self) -> "RemotePath":
        return self / ".."

    @property
    def name(self) -> str:
        return self.url.rsplit("/", 1)[-1]

    @property
    def suffix(self) -> str:
        n = self.name
        return n[n.rindex("."):] if "." in n.lstrip(".") else ""

    @property
    def stem(self) -> str:
        return self.name[:len(self.name) - len(self.suffix)]

    def is_absolute(self) -> bool:
        return True

    def as_posix(self) -> str:
        return self.url

    def is_file(self) -> bool:
        return self._listing.has(self.url)

    def exists(self) -> bool:
        return self.is_file() or self.is_dir()

    def is_dir(self) -> bool:
        return bool(self._listing.under(self.url))

    def glob(self, pattern: str) -> list["RemotePath"]:
        import fnmatch

        return [RemotePath(u, self._listing) for u in self._listing.under(self.url)
                if "/" not in u[len(self.url) + 1:] and fnmatch.fnmatch(u.rsplit("/", 1)[-1], pattern)]


class _Listing:
    """The objects under a URL prefix (one listing), asked by URL; outside it, one request each."""

    def __init__(self, prefix: str):
        import bisect

        self.prefix = prefix.rstrip("/") + "/"
        self.urls = [u for u, _ in list_objects(prefix)]
        self.known = set(self.urls)
        self._bisect = bisect.bisect_left

    def covers(self, url: str) -> bool:
        return url.startswith(self.prefix)

    def has(self, url: str) -> bool:
        if self.covers(url):
            return url in self.known
        return identity(url) is not None

    def under(self, url: str) -> list[str]:
        pre = url.rstrip("/") + "/"
        if not (self.covers(pre) or pre == self.prefix):
            return [u for u, _ in list_objects(url)] if is_prefix(url) else []
        i = self._bisect(self.urls, pre)
        out = []
        while i < len(self.urls) and self.urls[i].startswith(pre):
            out.append(self.urls[i])
            i += 1
        return out


def remote_root(url: str, listed: str | None = None) -> RemotePath:
    """The folder (or object) ``url`` as a :class:`RemotePath`, its existence known from one listing of ``listed``
    (default: ``url`` itself)."""
    url = check_input(url).rstrip("/")
    return RemotePath(url, _Listing(listed or url))
