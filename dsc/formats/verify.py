"""``dsc verify``: re-hash every file against the manifest and check every invariant of the format.

What it proves: each shard's bytes hash to the manifest's SHA-256 (and when not, which samples are
damaged, from the per-sample crc32c array, and whether the Zarr shard index is); every other file
hashes to ``manifest.files``; the manifest matches its own checksum; offsets are monotonic and in
bounds; shapes agree with offsets; labels are valid class indices; boxes are finite and inside their
image. It reads everything once; nothing is imported from compiler/ or runtime/.
"""
from __future__ import annotations

import hashlib
import os

import numpy as np
from pathlib import Path

from ..errors import DscError
from . import layout as L
from ..store import open_store
from .manifest import Manifest
from .problems import Problem, VerifyReport, try_read  # noqa: F401 - (their home; verify reports them)
from .zarr_v3 import ZARR_JSON, read_string_array
from . import versions
from .fields import fields_of
from .versions import TAGS, read_tags
from .view import expected
from .zarr_v3 import read_node_json
from .zarr_v3 import read_plain_array


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def file_checksums(root: Path, exclude, implied: set[str] = frozenset()) -> dict:
    """{relative path: {"nbytes", "sha256"}} of every file under root except the root zarr.json, the
    shards (``exclude``: their paths, read once), the folders ``implied`` (a ragged shard's slot folder: its shard
    and the zarr.json its size implies) and hidden entries (the journal). The chunk folders that hold only shards
    (``image/c``, ``image/values/<s>/c``) are not walked: a compile's fixed cost would otherwise grow by a
    directory walk a shard."""
    out = {}
    prune, kept_out = set(implied), set()
    for rel in exclude:
        if "/c/" in rel:
            prune.add(rel.rsplit("/c/", 1)[0] + "/c")
        else:
            kept_out.add(rel)
    exclude = kept_out
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath).relative_to(root).as_posix()
        dirnames[:] = sorted(d for d in dirnames if not d.startswith((".", "_"))
                             and (f"{here}/{d}" if here != "." else d) not in prune)
        for name in sorted(filenames):
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            if rel == ZARR_JSON or rel in exclude or name.startswith(".") or name.endswith((".tmp", ".partial")):
                continue
            out[rel] = {"nbytes": path.stat().st_size, "sha256": sha256_file(path)}
    return out


def _verify_view(store, m: Manifest, P: list) -> None:
    """The top-level files a plain Zarr reader opens are the latest version's (copies of its objects; see
    formats/view.py)."""

    view = store.files()
    try:
        want, root = expected(store, m)
    except DscError:
        return  # the version's own files are damaged: reported below
    stale = []
    for path, (_, sha) in want.items():
        try:
            if view.sha256(path) != sha:  # (another size is another hash: one read, no stat first)
                stale.append(path)
        except DscError:
            stale.append(path)
    try:
        top = read_node_json(view, "")
        if "consolidated_metadata" not in top:  # a view written before dsc wrote it (still one version's)
            top = {**top, "consolidated_metadata": root["consolidated_metadata"]}
        if top != root:
            stale.insert(0, ZARR_JSON)
    except (DscError, TypeError):
        stale.insert(0, ZARR_JSON)
    if stale:
        P.append(Problem(", ".join(stale[:5]) + (" ..." if len(stale) > 5 else ""),
                         f"the top-level view (what plain Zarr readers open) differs from version "
                         f"{m.version['number']}; dsc reads the version itself. `dsc verify {store.url} "
                         f"--repair-view` rewrites the view", view=True))


def _verify_tags(store, have: list[int], P: list) -> None:
    """Every tag file is readable and names a version the dataset has."""

    good, bad = read_tags(store)
    for name, problem in bad.items():
        P.append(Problem(f"tag {name!r}", problem, tag=True))
    for name, n in good.items():
        if n not in have:
            P.append(Problem(f"tag {name!r}", f"{store.where(TAGS)}/{name}.json names version {n}, which the dataset "
                                              f"does not have; remove the tag with `dsc tag {store.url} {name} "
                                              f"--delete`", tag=True))



def _check_file(report, root, rel: str, info: dict, what: str) -> bool:
    """One file the manifest lists with its ``nbytes`` and ``sha256`` (a version's file, or an object of the
    shard table: ``what`` says which in the problem): its size, then its content. True when both hold."""
    report.files_checked += 1
    report.bytes_hashed += info["nbytes"]
    try:
        size = root.size(rel)
        if size != info["nbytes"]:
            problem = f"{what}has {size} bytes, the manifest says {info['nbytes']}"
        elif root.sha256(rel) != info["sha256"]:
            problem = f"{what}content does not match its SHA-256 in the manifest"
        else:
            return True
    except DscError as e:
        problem = f"{what}{e}"
    report.problems.append(Problem(rel, problem))
    return False

def verify(path: str | os.PathLike, version: int | None = None, cache_dir=None) -> VerifyReport:
    """Check ``version`` (default: the latest) of the dataset at ``path``; for the latest, also that the
    top-level plain-Zarr view shows it. ``path`` may be a URL: the same checks, every file streamed from
    object storage and hashed, one shard in memory at a time (``cache_dir`` is accepted for compatibility)."""

    store = open_store(path)
    have, pin = [], None
    if versions.is_versioned(store):
        record, pin = versions.open_version(store, version)  # raises on a missing / damaged / newer manifest
        m: Manifest = record["manifest"]
        have = versions.versions(store)
        root = versions.version_files(store, m)
    else:
        root = store.files()
        m = L.read_manifest(root)
    report = VerifyReport(store.path if store.local else store.url, [],
                          version=None if m.version is None else m.version["number"])
    P = report.problems
    if m.version is not None and have and m.version["number"] == have[-1]:
        _verify_view(store, m, P)
    if m.version is not None:
        _verify_tags(store, have, P)
        for n in have:  # every record of the log reads (a damaged one stops log and vacuum)
            if n != m.version["number"]:
                try_read(P, versions.record_path(n), lambda n=n: versions.read_record(store, n))

    # ---- every non-shard file against manifest.files
    for rel, info in m.files.items():
        _check_file(report, root, rel, info, "")

    # ---- the shard table (format 4): its objects against their names, then every entry against the layout
    table_ok = True
    if m.shard_table is not None:
        for t in m.shard_table.objects:
            table_ok &= _check_file(report, store.files(), versions.object_path(t["sha256"]), t, "(a shard table) ")
        if table_ok:
            try:
                P.extend(Problem("shard table", why) for why in m.shard_table.bad_pages())
                present = sum(s is not None for s in m.shards)
                total = sum(s.nbytes for s in L.shard_specs(m))  # (every entry of every column, checked as read)
                if (present, total) != (m.shard_count, m.shard_table.ref["nbytes"]):
                    P.append(Problem("shard table", f"holds {present} image shards of {total} bytes in all, the "
                                                    f"manifest says {m.shard_count} of {m.shard_table.ref['nbytes']}"))
            except DscError as e:
                P.append(Problem("shard table", str(e)))
                table_ok = False

    # ---- each field: its shards (size, hash, which samples are damaged) and its invariants
    context: dict = {}
    if m.versioned:
        live = try_read(P, L.LIVE, lambda: read_plain_array(root, L.LIVE))
        if live is not None and (live.shape != (m.num_rows,) or int(live.sum()) != m.num_samples):
            P.append(Problem(L.LIVE, f"marks {int(live.sum())} of {live.shape} rows, expected {m.num_samples} of "
                                     f"({m.num_rows},)"))
        else:
            context["live"] = live
            if live is not None and table_ok:  # (every live row in a shard of the version: else every read fails)
                try:
                    bad = L.rows_outside_shards(m, np.flatnonzero(live))
                except DscError as e:
                    P.append(Problem("shard table", str(e)))
                else:
                    if len(bad):
                        K = m.shard_size
                        slots = sorted({int(r) // K for r in bad})
                        P.append(Problem(L.LIVE, f"marks {len(bad)} rows that no shard of the version holds (slots "
                                                 f"{', '.join(map(str, slots[:5]))}{'...' if len(slots) > 5 else ''}"
                                                 f"; rows {int(bad[0])}...): their samples cannot be read. Restore "
                                                 f"an earlier version (dsc restore) or recompile"))
    for f in fields_of(m):
        if table_ok or not getattr(f, "pixels", None):  # (a damaged shard table: its shards cannot be listed)
            f.verify(root, m, P, context)
    keys = try_read(P, L.KEYS, lambda: read_string_array(root, L.KEYS))
    if keys is not None and len(keys) != m.num_rows:
        P.append(Problem(L.KEYS, f"has {len(keys)} keys for {m.num_rows} rows"))
    # ---- what a ragged shard's size implies beside it (its zarr.json: plain Zarr readers read it, dsc does not)
    if table_ok:
        files = store.files()
        for rel, want in L.implied_files(m):
            report.files_checked += 1
            try:
                ok = bytes(files.read(rel, len(want))) == want
            except DscError as e:
                P.append(Problem(rel, f"{e} (plain Zarr readers affected; dsc is not)"))
                continue
            if not ok:
                P.append(Problem(rel, "is not the metadata its shard's size implies (plain Zarr readers affected; dsc "
                                      "is not)"))
    shards = L.shard_specs(m) if table_ok else []
    report.shards_checked = len(shards)
    report.bytes_hashed += sum(s.nbytes for s in shards)
    if pin is not None:
        pin.release()
    return report
