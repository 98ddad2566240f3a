"""The plain-Zarr view at the top of a versioned dataset: what ``zarr.open_group(OUT)`` reads (docs/FORMAT.md,
"Versions"). dsc never reads it; it shows the latest version to readers that do not know dsc.

A plain reader opens the root ``zarr.json``, then reads each array's metadata and chunk files. The view is
written so that a kill at any moment leaves one version's view, never arrays of two versions:

* The root ``zarr.json`` carries every node's metadata (zarr-python's consolidated metadata, which it reads
  by default instead of each array's ``zarr.json``): replacing that one file switches the whole view.
* The small arrays' chunks alternate between the chunk-key separators ``/`` and ``.`` from one view to the
  next (``label/c/0``, then ``label/c.0``): a refresh writes the new chunks under the separator the current
  view does not use, so nothing the current view reads changes, then each array's ``zarr.json`` (an array
  read through its own metadata switches with it), then the root. The previous view's chunks stay until the
  refresh after next overwrites them, so a reader that opened the group just before a switch still reads
  the version it opened.

The shards are not the view's (they sit at their slots, shared by every version); the view's files are copies
of the version's objects, never their inodes, so a plain Zarr writer changing the view cannot change a
version. Only the metadata of the alternating arrays differs from its object: its chunk-key separator.

Everything here goes through a :class:`~dsc.store.Store`: a folder and a bucket get the same view.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

from ..errors import CorruptDatasetError, DscError
from ..store import Store
from ..store.local import not_ours
from .layout import implies, read_manifest
from .manifest import Manifest
from .versions import as_store, object_path, read_record, record_path, versions
from .zarr_v3 import MAX_JSON_BYTES, ZARR_JSON, json_bytes, parse_json


def alternating(m: Manifest) -> set[str]:
    """The small arrays whose chunks are in the manifest's ``files`` (not shards): their chunk files change
    name from one view to the next."""
    out = set()
    for rel in m.files:
        if "/c/" in rel:
            node, key = rel.rsplit("/c/", 1)
            if f"{node}/{ZARR_JSON}" in m.files and all(p.isdigit() for p in key.split("/")):
                out.add(node)
    return out


def view_path(rel: str, sep: str, alt: set[str]) -> str:
    """Where the view with chunk separator ``sep`` keeps the file ``rel`` of the version."""
    if sep != "/" and "/c/" in rel:
        node, key = rel.rsplit("/c/", 1)
        if node in alt:
            return f"{node}/c{sep}{key.replace('/', sep)}"
    return rel


def node_meta(data: bytes, node: str, sep: str, alt: set[str], where) -> dict:
    """A node's metadata as the view shows it: its object's, with ``sep`` for an alternating array."""
    meta = parse_json(data, where)
    if node in alt and isinstance(meta, dict):
        meta["chunk_key_encoding"] = {"name": "default", "configuration": {"separator": sep}}
    try:
        json_bytes(meta)
    except ValueError as e:  # NaN or infinity (which parse_json takes) in a damaged object
        raise CorruptDatasetError(f"{where}: not Zarr metadata ({e})") from None
    return meta


def separator(root_json) -> str:
    """The chunk separator of the view whose root ``zarr.json`` holds ``root_json`` (bytes): ``.`` when its
    consolidated metadata says so, else ``/`` (also for a view without it, as dsc wrote before)."""
    try:
        nodes = parse_json(root_json, ZARR_JSON)["consolidated_metadata"]["metadata"]
        return "." if any(meta["chunk_key_encoding"]["configuration"]["separator"] == "."
                          for meta in nodes.values() if meta.get("node_type") == "array") else "/"
    except (DscError, KeyError, TypeError, AttributeError):
        return "/"


def root_json(m: Manifest, metas: dict) -> dict:
    """The root ``zarr.json``: the manifest, and every node's metadata (consolidated: the one file a switch
    replaces)."""
    return {"zarr_format": 3, "node_type": "group", "attributes": {"dsc": {**m.to_dict(), "checksum": m.checksum()}},
            "consolidated_metadata": {"kind": "inline", "must_understand": False,
                                      "metadata": {node: metas[node] for node in sorted(metas)}}}


def other(sep: str) -> str:
    return "." if sep == "/" else "/"


def contents(src, m: Manifest, sep: str) -> tuple[list[tuple[str, str]], dict[str, dict]]:
    """The view of ``m`` with chunk separator ``sep``: its files that are not metadata as (view path, the
    version's file they copy), and every node's metadata as the view shows it ({node: dict}; each is written
    as ``<node>/zarr.json`` and into the root's consolidated metadata). Node metadata is read from the
    version's objects in the store ``src``."""
    src = as_store(src)
    alt = alternating(m)
    files, metas = [], {}
    for rel, f in m.files.items():
        if rel.endswith(f"/{ZARR_JSON}"):
            node = rel[:-len(ZARR_JSON) - 1]
            obj = object_path(f["sha256"])
            metas[node] = node_meta(src.get(obj, MAX_JSON_BYTES), node, sep, alt, src.where(obj))
        else:
            files.append((view_path(rel, sep, alt), rel))
    return files, metas


def write_root(where, m: Manifest) -> None:
    """The root ``zarr.json`` of a fresh compile (the files beside it are its view, separator ``/``)."""
    store = as_store(where)
    metas = {rel[:-len(ZARR_JSON) - 1]: node_meta(store.get(rel, MAX_JSON_BYTES), "", "/", set(), store.where(rel))
             for rel in m.files if rel.endswith(f"/{ZARR_JSON}")}
    store.put(ZARR_JSON, json_bytes(root_json(m, metas)))


def current(where) -> str:
    """The chunk separator of the view at ``where`` now."""
    try:
        return separator(as_store(where).get(ZARR_JSON, MAX_JSON_BYTES))
    except (DscError, FileNotFoundError):
        return "/"


def superseded(store: Store, m: Manifest) -> bool:
    """Whether a version after ``m``'s is committed (its record is there; versions are numbered one after
    another and vacuum keeps the latest): that version's writer shows it, a view of ``m`` would turn it back."""
    return m.version is not None and store.stat(record_path(m.version["number"] + 1)) is not None


def refresh(where, m: Manifest, old: Manifest | None = None, src: Store | None = None) -> None:
    """Make the view at ``where`` show ``m`` (see the module docstring): the chunks under the separator the
    current view does not use, then each node's metadata, then the root; then the files of the previous view
    (``old``) that ``m`` has no node for are removed. The version's objects are read from ``src`` (default:
    the same store; a push reads them from the local copy). Before each step it stops if ``m`` was
    superseded: a writer overtaken by a newer commit leaves the newer view alone. Anything in the way that dsc
    did not make (a link) is refused."""
    store = as_store(where)
    src = store if src is None else src
    cur = current(store)
    missing = [rel for rel, there in zip(m.files, _each(src, lambda f: src.stat(object_path(f["sha256"])),
                                                          m.files.values())) if not there]
    for rel in missing:
        _recover_object(src, rel, m.files[rel], cur, alternating(m))
    files, metas = contents(src, m, other(cur))
    if superseded(store, m):  # (asked before each step: the chunks, the nodes' metadata, the root)
        return
    _copy_files(store, src, m, files)
    if superseded(store, m):  # (a newer writer may have read the same separator and written its view meanwhile:
        return settle(store)  # what this one just wrote may be over it)
    _put_metas(store, metas)
    if superseded(store, m):
        return settle(store)
    store.put(ZARR_JSON, json_bytes(root_json(m, metas)))
    if superseded(store, m):
        return settle(store)
    if old is not None:  # files of nodes this version does not have (a ragged slot no longer used; one whose
        alt = alternating(old)  # zarr.json this version implies instead of listing stays: see layout.implied_files)
        for rel in set(old.files) - set(m.files):
            if implies(m, rel):
                continue
            store.delete(view_path(rel, cur, alt))


IN_FLIGHT = 8  # requests at once of a step of the view in object storage


def _each(store: Store, fn, items) -> list:
    """``[fn(item) for item in items]``; in object storage ``IN_FLIGHT`` requests at once (a step's files are
    independent of one another: only the steps are ordered)."""
    items = list(items)
    if store.local or len(items) < 2:
        return [fn(item) for item in items]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(min(IN_FLIGHT, len(items)), thread_name_prefix="dsc-view") as pool:
        return list(pool.map(fn, items))


def _copy_files(store: Store, src: Store, m: Manifest, files) -> None:
    """The view's chunk files (``contents``), copied from the version's objects in ``src``."""
    _each(store, lambda pr: store.put(pr[0], src.get(object_path(m.files[pr[1]]["sha256"]))), files)


def _put_metas(store: Store, metas: dict) -> None:
    """Each node's ``zarr.json`` of the view."""
    _each(store, lambda item: store.put(f"{item[0]}/{ZARR_JSON}", json_bytes(item[1])), metas.items())


def settle(where, rounds: int = 16) -> None:
    """A writer overtaken while it wrote view files (object storage, where writers hold no lock: two restores at
    one URL, one slow) may have written them over the newer version's view: that version's writer read the
    same separator, and a slow put can land after its root switched. So the overtaken writer puts the view of
    the latest version back: when the root shows that version already, its files are rewritten in place
    under the root's separator (the same bytes its writer wrote: a reader sees them or the right ones, never
    a mix); else its whole view is refreshed (as its own writer does: the same files). Repeated while newer
    versions come, so the last writer to finish leaves the latest version's view whole."""
    store = as_store(where)
    for _ in range(rounds):
        have = versions(store)
        if not have:  # (the caller committed a version: only a vacuum racing it leaves none)
            return
        m = read_record(store, have[-1])["manifest"]
        try:
            shown = read_manifest(store)
        except DscError:
            shown = None
        if shown is not None and shown.checksum() == m.checksum():
            sep = current(store)
            files, metas = contents(store, m, sep)
            _copy_files(store, store, m, files)
            _put_metas(store, metas)
            if not superseded(store, m):
                return
        else:
            refresh(store, m, shown)  # (overtaken in turn: it settles again)
            return


def check(where, m: Manifest) -> None:
    """Before a writer commits: every folder the view of ``m`` writes into is a plain folder (or absent), so a
    link there is refused before anything is committed, not after. (Object storage has no links.)"""
    store = as_store(where)
    if not store.local:
        return
    folders = {p for rel in m.files for p in Path(rel).parents if p != Path(".")}
    for folder in sorted(folders, key=lambda p: len(p.parts)):
        path = store.path / folder
        if path.is_symlink() or (os.path.lexists(path) and not path.is_dir()):
            raise not_ours(path, "a folder of the dataset's plain-Zarr view")


def show(where, m: Manifest) -> None:
    """Make the view show ``m`` unless it does already (after a crash between a commit and its refresh, or a
    restore); see ``refresh``."""
    store = as_store(where)
    try:
        old = read_manifest(store)
    except DscError:
        old = None
    if old is None or old.checksum() != m.checksum():
        refresh(store, m, old)


def expected(where, m: Manifest) -> tuple[dict, dict]:
    """What ``dsc verify`` compares the view at ``where`` with: ({view path: (nbytes, sha256)}, the root
    zarr.json as parsed), for the separator the view uses now."""
    files, metas = contents(where, m, current(where))
    want = {path: (m.files[rel]["nbytes"], m.files[rel]["sha256"]) for path, rel in files}
    for node, meta in metas.items():
        data = json_bytes(meta)
        want[f"{node}/{ZARR_JSON}"] = (len(data), hashlib.sha256(data).hexdigest())
    return want, root_json(m, metas)


def _recover_object(store: Store, rel: str, f: dict, sep: str, alt: set[str]) -> None:
    """A version's object is missing: take it back from the view when the view has its exact bytes."""
    obj = object_path(f["sha256"])
    for path in dict.fromkeys((view_path(rel, sep, alt), rel)):
        try:
            data = store.get(path)
        except (DscError, FileNotFoundError):
            continue
        if rel.endswith(ZARR_JSON) and rel[:-len(ZARR_JSON) - 1] in alt:  # the view's differs by its separator
            try:
                data = json_bytes(node_meta(data, rel[:-len(ZARR_JSON) - 1], "/", alt, store.where(path)))
            except DscError:
                continue
        if len(data) == f["nbytes"] and hashlib.sha256(data).hexdigest() == f["sha256"]:
            store.put(obj, data)
            return
    raise CorruptDatasetError(f"{store.where(obj)} (the content of {rel} in the latest version) is missing and no copy "
                              f"has its bytes; the version is damaged: `dsc restore` an intact version (dsc verify "
                              f"--version N checks one), or recompile")


__all__ = ["alternating", "check", "contents", "current", "expected", "other", "refresh", "root_json", "separator",
           "settle", "show", "view_path", "write_root"]
