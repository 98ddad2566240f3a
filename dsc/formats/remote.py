"""A dataset in object storage, at the level of its versions: what the local cache's mirror of a version
holds (``fetch_version``), and names for a URL's local folders. Where bytes live is ``dsc/store``.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

from ..store import Store
from ..store.local import write_atomic as _write_atomic
from . import layout, versions
from ..errors import CorruptDatasetError, DscError


def url_id(url: str) -> str:
    """A short name for the dataset at ``url`` in local folders (its cache mirror, its upload staging)."""
    return hashlib.sha256(url.rstrip("/").encode()).hexdigest()[:16]


def write_atomic(path: Path, data: bytes) -> None:
    """A file of a local mirror or cache, complete or absent; processes sharing the folder may write it at once
    (each under a private name of its own)."""
    _write_atomic(path, data, unique=True)


def _cached_record(store: Store, local: Path, n: int) -> dict | None:
    """Version ``n``'s record from the node's mirror when the object is the one fetched then (its ETag, one
    request with no content): the ranks of a node, and every later open, read the record once, whatever its
    size. None when there is no copy, no tag, or the object was written again since."""
    tag_file = local.with_name(local.name + ".etag")
    try:
        data, saved = local.read_bytes(), tag_file.read_bytes().decode()
    except (OSError, UnicodeDecodeError):
        return None
    if store.etag(versions.record_path(n)) != saved:
        return None
    try:
        return versions.parse_record(data, local, n)
    except DscError:
        return None


def intact(path: Path, f: dict) -> bool:
    """Whether the local copy ``path`` of a small file has the size and SHA-256 its manifest entry ``f`` records
    (a copy in a cache on disk may have been damaged since it was downloaded)."""
    try:
        data = path.read_bytes()
    except OSError:
        return False
    return len(data) == f["nbytes"] and hashlib.sha256(data).hexdigest() == f["sha256"]


def fetch_version(store: Store, dst: Path, n: int, connections: int = 8, objects: bool = True,
                  tables: bool = False) -> dict:
    """Version ``n``'s record and every small file it lists (its objects, each checked against its size and
    SHA-256; not with ``objects=False``) into the local folder ``dst``, in the dataset layout; returns the
    parsed record. Objects ``dst`` has already are checked against their hash (a cache's copy damaged on its
    disk is fetched again: the bucket's was checked on the way in) and not fetched again when intact.
    The shard table's objects (format 4) are fetched now only with ``tables`` (a writer's copy); a reader's
    come when it first needs a shard's entry, into ``dst`` too (``versions.bind_table``)."""
    from concurrent.futures import ThreadPoolExecutor

    local = dst / versions.record_path(n)
    rec = _cached_record(store, local, n)
    if rec is None:
        tag = store.etag(versions.record_path(n))  # (before the GET: a later write makes it stale, not wrong)
        rec, data = versions.read_record_bytes(store, n)
        if not local.is_file() or local.read_bytes() != data:
            write_atomic(local, data)
        if tag is not None:
            write_atomic(local.with_name(local.name + ".etag"), tag.encode())

    def one(f):
        rel = versions.object_path(f["sha256"])
        try:
            obj = store.get(rel, f["nbytes"])
        except FileNotFoundError:
            raise CorruptDatasetError(f"{store.where(rel)} is missing (a small file of the version); the dataset in "
                                      f"object storage is damaged. Recompile it, or push an intact copy") from None
        if len(obj) != f["nbytes"] or hashlib.sha256(obj).hexdigest() != f["sha256"]:
            raise CorruptDatasetError(f"{store.where(rel)} does not have the bytes its name (SHA-256) says; the "
                                      f"dataset in object storage is damaged. Recompile it")
        write_atomic(dst / rel, obj)

    versions.bind_table(rec["manifest"], store, dst)
    if not objects:
        return rec
    want = layout.objects(rec["manifest"]) if tables else list(rec["manifest"].files.values())
    todo = [f for f in want if not intact(dst / versions.object_path(f["sha256"]), f)]
    if todo:
        with ThreadPoolExecutor(min(connections, len(todo))) as ex:
            for fut in [ex.submit(one, f) for f in todo]:
                fut.result()
    return rec


