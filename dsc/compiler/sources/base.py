"""The interface every source shares: scan the input into an ordered list of records."""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np


@dataclass(frozen=True, slots=True)
class Target:
    """The objects of one detection sample, as the source gives them.

    ``boxes`` (k, 4) float64 xyxy in pixels of the annotated frame (or in [0, 1] units of the displayed
    image when ``normalized``); ``labels`` (k,) int64; ``attrs`` extra per-box columns (iscrowd, area,
    difficult, truncated...); ``size`` the (width, height) the annotation declares, if any; ``source``
    names the annotation for error messages (file, line or id)."""

    boxes: np.ndarray
    labels: np.ndarray
    image_id: int
    source: str
    attrs: dict = field(default_factory=dict)
    size: tuple[int, int] | None = None
    normalized: bool = False


@dataclass(frozen=True, slots=True)
class Record:
    """One input sample: ``key`` is what the dataset stores for traceability (path relative to the
    source root, or an id); ``path`` is the file to decode; ``label`` the class index (-1: none);
    ``target`` the objects of a detection sample."""

    key: str
    path: str
    label: int = -1
    target: Target | None = None
    row: int = -1  # table sources: the row in ``path``; dataset sources: the index in the dataset


@dataclass(frozen=True, kw_only=True)
class ScannedSource:
    """What a source hands the compiler: records in their final order, class names, and notes.

    ``invalid`` lists (key, reason) of inputs found unusable while scanning (subject to the compile's
    on_error policy, like an undecodable image); ``attributes`` maps the extra per-box columns the
    records carry to their stored dtype."""

    kind: str
    root: str
    task: str
    records: list[Record]
    classes: tuple[str, ...] = ()
    category_ids: tuple[int, ...] = ()
    attributes: dict = field(default_factory=dict)
    invalid: tuple[tuple[str, str], ...] = ()
    input: dict = field(default_factory=lambda: {"kind": "file"})  # see compiler/inputs.py
    warnings: tuple[str, ...] = ()
    summary: dict = field(default_factory=dict)


def drop_empty(scanned: ScannedSource) -> ScannedSource:
    """Leave out detection records without any box (by default they are kept as negatives)."""
    records = [r for r in scanned.records if r.target is None or len(r.target.boxes)]
    return replace(scanned, records=records,
                   summary={**scanned.summary, "dropped_empty_images": len(scanned.records) - len(records)})
