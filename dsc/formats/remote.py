"""A dataset in object storage, at the level of its versions: what the local cache's mirror of a version
holds (``fetch_version``), and names for a URL's local folders. Where bytes live is ``dsc/store``.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

from ..store import Store
from ..store.local import write_atomic as _write_atomic


def remote_versions(store: Store) -> list[int]:
    """The version numbers in the dataset's log in object storage, ascending."""
    from .versions import LOG, _RECORD

    out = []
    for rel, _ in store.list(LOG + "/"):
        parts = rel.split("/")
        m = _RECORD.match(parts[-1])
        if m and len(parts) == 3:
            out.append(int(m.group(1)))
    return sorted(out)


def remote_tags(store: Store) -> dict[str, int]:
    """{tag: version} of the dataset in object storage."""
    import json

    from .versions import TAGS, _TAG

    out = {}
    for rel, size in store.list(TAGS + "/"):
        name = rel.rsplit("/", 1)[-1]
        if name.endswith(".json") and _TAG.match(name[:-5]) and size < 1 << 16:
            try:
                d = json.loads(store.get(rel))
            except (ValueError, FileNotFoundError):
                continue
            if isinstance(d, dict) and isinstance(d.get("version"), int):
                out[name[:-5]] = d["version"]
    return out


def url_id(url: str) -> str:
    """A short name for the dataset at ``url`` in local folders (its cache mirror, its upload staging)."""
    return hashlib.sha256(url.rstrip("/").encode()).hexdigest()[:16]


def no_dataset(store: Store):
    from ..errors import DatasetNotFoundError

    return DatasetNotFoundError(f"{store.url}: no dsc dataset there (no version log under _dsc/log/); compile one "
                                f"with `dsc compile ... {store.url}`")


def write_atomic(path: Path, data: bytes) -> None:
    """A file of a local mirror or cache, complete or absent; processes sharing the folder may write it at once
    (each under a private name of its own)."""
    _write_atomic(path, data, unique=True)


def fetch_version(store: Store, dst: Path, n: int, connections: int = 8, objects: bool = True) -> dict:
    """Version ``n``'s record and every small file it lists (its objects, each checked against its size and
    SHA-256; not with ``objects=False``) into the local folder ``dst``, in the dataset layout; returns the
    parsed record. Objects ``dst`` has already are not fetched again (their names are their hashes)."""
    from concurrent.futures import ThreadPoolExecutor

    from ..errors import CorruptDatasetError, VersionNotFoundError
    from . import versions
    from .zarr_v3 import MAX_JSON_BYTES

    try:
        data = store.get(versions.record_path(n), MAX_JSON_BYTES)
    except FileNotFoundError:
        have = remote_versions(store)
        if not have:
            raise no_dataset(store) from None
        raise VersionNotFoundError(f"{store.url} has no version {n} (versions: {versions._ranges(have)}; a version "
                                   f"removed by `dsc vacuum` is gone)") from None
    rec = versions.parse_record(data, store.where(versions.record_path(n)), n)
    local = dst / versions.record_path(n)
    if not local.is_file() or local.read_bytes() != data:
        write_atomic(local, data)
    if not objects:
        return rec

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

    todo = [f for f in rec["manifest"].files.values() if not (dst / versions.object_path(f["sha256"])).is_file()]
    if todo:
        with ThreadPoolExecutor(min(connections, len(todo))) as ex:
            for fut in [ex.submit(one, f) for f in todo]:
                fut.result()
    return rec


