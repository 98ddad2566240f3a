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
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import DscError
from . import layout as L
from .manifest import Manifest
from .zarr_v3 import ZARR_JSON, node_dir, read_plain_array, read_string_array, shard_index


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def file_checksums(root: Path, exclude: set[str]) -> dict:
    """{relative path: {"nbytes", "sha256"}} of every file under root except the root zarr.json, the
    shards (``exclude``) and hidden entries (the journal)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith((".", "_")))
        for name in sorted(filenames):
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            if rel == ZARR_JSON or rel in exclude or name.startswith(".") or name.endswith((".tmp", ".partial")):
                continue
            out[rel] = {"nbytes": path.stat().st_size, "sha256": sha256_file(path)}
    return out


@dataclass
class Problem:
    file: str
    what: str
    samples: list[int] = field(default_factory=list)

    def __str__(self):
        s = f"{self.file}: {self.what}"
        if self.samples:
            shown = ", ".join(map(str, self.samples[:20])) + (" ..." if len(self.samples) > 20 else "")
            s += f" (samples {shown})"
        return s


@dataclass
class VerifyReport:
    path: Path
    problems: list[Problem]
    shards_checked: int = 0
    files_checked: int = 0
    bytes_hashed: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def damaged_samples(self) -> list[int]:
        return sorted({i for p in self.problems for i in p.samples})


def _try(problems: list[Problem], rel: str, fn):
    try:
        return fn()
    except (DscError, OSError, ValueError) as e:
        problems.append(Problem(rel, str(e)))
        return None


def verify(path: str | os.PathLike) -> VerifyReport:
    root = Path(path)
    m: Manifest = L.read_manifest(root)  # raises on a missing / damaged / newer manifest
    report = VerifyReport(root, [])
    P = report.problems
    n, K = m.num_samples, m.shard_size
    crc = _try(P, L.SAMPLE_CRC32C, lambda: read_plain_array(root, L.SAMPLE_CRC32C)) \
        if L.SAMPLE_CRC32C + "/c/0" in m.files else None
    if crc is not None and crc.shape != (n,):
        P.append(Problem(L.SAMPLE_CRC32C, f"has {crc.shape} entries, expected ({n},)"))
        crc = None

    # ---- every non-shard file against manifest.files
    for rel, info in m.files.items():
        p = node_dir(root, rel)
        report.files_checked += 1
        if not p.is_file():
            P.append(Problem(rel, "missing"))
        elif p.stat().st_size != info["nbytes"]:
            P.append(Problem(rel, f"has {p.stat().st_size} bytes, the manifest says {info['nbytes']}"))
        elif sha256_file(p) != info["sha256"]:
            P.append(Problem(rel, "content does not match its SHA-256 in the manifest"))
        report.bytes_hashed += info["nbytes"]

    # ---- index arrays and their invariants
    ragged = m.image.layout == "ragged"
    offsets = shapes = None
    if ragged:
        offsets = _try(P, L.RAGGED_OFFSETS, lambda: read_plain_array(root, L.RAGGED_OFFSETS))
        shapes = _try(P, L.RAGGED_SHAPES, lambda: read_plain_array(root, L.RAGGED_SHAPES))
        if offsets is not None and shapes is not None and (offsets.shape != (n + 1,) or shapes.shape != (n, 3)):
            P.append(Problem(L.RAGGED_OFFSETS, f"offsets {offsets.shape} / shapes {shapes.shape} do not fit "
                                               f"{n} samples"))
            offsets = shapes = None
        if offsets is not None and shapes is not None:
            sizes = np.diff(offsets)
            bad = np.flatnonzero((sizes < 0) | (sizes != np.prod(shapes.astype(np.int64), axis=1))
                                 | (shapes[:, 2] != m.image.channels) | (shapes[:, 0] < 1) | (shapes[:, 1] < 1))
            if offsets[0] != 0 or len(bad):
                P.append(Problem(L.RAGGED_OFFSETS, "offsets / shapes are inconsistent", bad.tolist()))
    if m.task == "classification":
        labels = _try(P, L.LABEL, lambda: read_plain_array(root, L.LABEL))
        if labels is not None:
            bad = np.flatnonzero((labels < 0) | (labels >= max(1, len(m.classes))))
            if len(bad):
                P.append(Problem(L.LABEL, f"labels outside 0..{len(m.classes) - 1}", bad.tolist()))
    if m.task == "detection":
        _verify_objects(root, m, P, shapes)
    keys = _try(P, L.KEYS, lambda: read_string_array(root, L.KEYS))
    if keys is not None and len(keys) != n:
        P.append(Problem(L.KEYS, f"has {len(keys)} keys for {n} samples"))

    # ---- shards: size, hash, and which samples are damaged
    for s, spec in enumerate(m.shards):
        p = node_dir(root, spec.path)
        report.shards_checked += 1
        if not p.is_file():
            P.append(Problem(spec.path, "shard file missing", list(range(s * K, s * K + spec.count))))
            continue
        data = np.fromfile(p, np.uint8)
        report.bytes_hashed += len(data)
        if len(data) != spec.nbytes:
            P.append(Problem(spec.path, f"has {len(data)} bytes, the manifest says {spec.nbytes}",
                             list(range(s * K, s * K + spec.count))))
            continue
        if hashlib.sha256(data).hexdigest() == spec.sha256:
            continue
        ranges = _sample_ranges(m, s, spec, offsets)
        damaged = []
        if crc is not None and ranges is not None:
            import google_crc32c

            for i, (a, b) in ranges:
                if google_crc32c.value(data[a:b].tobytes()) != int(crc[i]):
                    damaged.append(i)
        what = "content does not match its SHA-256"
        if not ragged:
            tail = data[spec.count * m.image.sample_nbytes:].tobytes()
            if tail != shard_index(spec.count, K, m.image.sample_nbytes):
                what += "; its Zarr shard index is damaged (zarr readers affected)"
        P.append(Problem(spec.path, what, damaged))
    return report


def _sample_ranges(m: Manifest, s: int, spec, offsets):
    """[(sample, (start, end))] byte ranges of the shard's samples within its file."""
    K = m.shard_size
    first = s * K
    if m.image.layout == "fixed":
        nb = m.image.sample_nbytes
        return [(first + j, (j * nb, (j + 1) * nb)) for j in range(spec.count)]
    if offsets is None:
        return None
    base = int(offsets[first])
    return [(first + j, (int(offsets[first + j]) - base, int(offsets[first + j + 1]) - base))
            for j in range(spec.count)]


def _verify_objects(root: Path, m: Manifest, P: list[Problem], shapes) -> None:
    n = m.num_samples
    off = _try(P, L.OBJ_OFFSETS, lambda: read_plain_array(root, L.OBJ_OFFSETS))
    boxes = _try(P, L.OBJ_BOXES, lambda: read_plain_array(root, L.OBJ_BOXES))
    labels = _try(P, L.OBJ_LABELS, lambda: read_plain_array(root, L.OBJ_LABELS))
    if off is None or boxes is None or labels is None:
        return
    M = len(boxes)
    if off.shape != (n + 1,) or not L.valid_offsets(off, M):
        bad = np.flatnonzero(np.diff(off) < 0).tolist() if off.shape == (n + 1,) else []
        P.append(Problem(L.OBJ_OFFSETS, f"not a valid box-offset index for {M} boxes", bad))
        return
    sample_of = np.repeat(np.arange(n), np.diff(off))
    if m.image.layout == "fixed":
        h = np.full(M, m.image.height)
        w = np.full(M, m.image.width)
    elif shapes is not None:
        h, w = shapes[sample_of, 0], shapes[sample_of, 1]
    else:
        return
    finite = np.all(np.isfinite(boxes), axis=1)
    inside = finite & (boxes[:, 0] >= 0) & (boxes[:, 1] >= 0) & (boxes[:, 2] <= w) & (boxes[:, 3] <= h) \
        & (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])
    if not inside.all():
        P.append(Problem(L.OBJ_BOXES, "boxes not finite, empty, or outside their image",
                         sorted(set(sample_of[~inside].tolist()))))
    bad_label = (labels < 0) | (labels >= max(1, len(m.classes)))
    if bad_label.any():
        P.append(Problem(L.OBJ_LABELS, f"box labels outside 0..{len(m.classes) - 1}",
                         sorted(set(sample_of[bad_label].tolist()))))
