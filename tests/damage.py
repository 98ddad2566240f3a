"""Damaging a dataset as a careless tool, a forger or a failing disk would, for the tests.

dsc reads a version through its log record (``_dsc/log/<N>.json``: the manifest) and the objects its
manifest names (``_dsc/objects/...``; the top-level files are copies of the latest version's), so that
is what these helpers edit. A dataset compiled before versions is edited at its top level.
"""
import hashlib
import json
from pathlib import Path

__all__ = ["edit_manifest", "list_shards", "manifest_file", "node_file", "read_manifest", "read_node", "seal", "write_node"]


def manifest_file(out: Path) -> Path:
    """The file dsc reads the latest manifest from."""
    log = Path(out) / "_dsc" / "log"
    if log.is_dir():
        return max(log.glob("*.json"), key=lambda p: int(p.stem))
    return Path(out) / "zarr.json"


def _manifest_of(d: dict) -> dict:
    return d["manifest"] if "manifest" in d else d["attributes"]["dsc"]


def read_manifest(out: Path) -> dict:
    return _manifest_of(json.loads(manifest_file(out).read_text()))


def seal(m: dict) -> None:
    """Recompute the manifest's checksum, as a tool that knows the format would."""
    body = {k: v for k, v in m.items() if k != "checksum"}
    m["checksum"] = hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":"),
                                              ensure_ascii=False).encode()).hexdigest()


def edit_manifest(out: Path, edit, sealed: bool = True, raw: str | None = None) -> None:
    """``edit(manifest dict)`` in the file dsc reads; ``sealed``: recompute the checksum; ``raw``: write this
    text instead (damaged JSON)."""
    path = manifest_file(out)
    if raw is not None:
        path.write_text(raw)
        return
    d = json.loads(path.read_text())
    m = _manifest_of(d)
    edit(m)
    if sealed:
        try:
            seal(m)
        except (TypeError, ValueError):
            pass
    path.write_text(json.dumps(d))


def node_file(out: Path, rel: str) -> Path:
    """The file dsc reads for ``rel`` (its object in a versioned dataset)."""
    files = read_manifest(out).get("files", {})
    if rel in files and (Path(out) / "_dsc").is_dir():
        sha = files[rel]["sha256"]
        return Path(out) / "_dsc" / "objects" / sha[:2] / sha
    return Path(out) / rel


def write_node(out: Path, rel: str, data: bytes, record: bool = False) -> None:
    """Replace the bytes dsc reads for ``rel``; ``record``: also record their new size and hash in the
    manifest (a careful forger), else the manifest still names the old ones."""
    if not record:
        node_file(out, rel).write_bytes(data)  # in place: the bytes dsc reads for every version using them
        return
    sha = hashlib.sha256(data).hexdigest()
    obj = Path(out) / "_dsc" / "objects" / sha[:2] / sha
    obj.parent.mkdir(parents=True, exist_ok=True)
    obj.write_bytes(data)
    view = Path(out) / rel
    tmp = view.with_name(view.name + ".edit")
    tmp.write_bytes(data)
    tmp.replace(view)  # a new file: the old object (another version's, maybe) keeps its bytes

    def edit(m):
        m["files"][rel] = {"nbytes": len(data), "sha256": sha}
    edit_manifest(out, edit)


def read_node(out: Path, rel: str) -> bytes:
    return node_file(out, rel).read_bytes()


def list_shards(path: Path) -> None:
    """Rewrite every version of ``path`` as format 3 wrote it: the shards listed in the manifest (and in the
    view's root zarr.json), no shard table (the table's objects stay, unused)."""
    from dsc.formats import versions as V
    from dsc.formats.manifest import canonical_sha256

    for n in V.versions(path):
        m = V.read_record(path, n)["manifest"]
        if m.shard_table is None:
            continue
        d = m.to_dict()
        del d["shard_table"]
        d["format_version"] = 3
        d["shards"] = [s.to_dict() if s is not None else None for s in m.shards]
        for name in m.shard_table.columns[1:]:
            d["fields"][name]["shards"] = [s.to_dict() if s is not None else None
                                           for s in m.shard_table.column(name)]
        d["checksum"] = canonical_sha256(d)
        raw = json.loads((Path(path) / V.record_path(n)).read_text())
        raw["manifest"] = d
        (Path(path) / V.record_path(n)).write_text(json.dumps(raw, indent=1))
        root = json.loads((Path(path) / "zarr.json").read_text())
        if root["attributes"]["dsc"]["version"]["number"] == n:
            root["attributes"]["dsc"] = d
            (Path(path) / "zarr.json").write_text(json.dumps(root, indent=1))
