"""The interface every source shares: scan the input into an ordered list of records."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Record:
    """One input sample: ``key`` is what the dataset stores for traceability (path relative to the
    source root, or an id); ``path`` is the file to decode; ``label`` the class index (-1: none)."""

    key: str
    path: str
    label: int = -1


@dataclass(frozen=True, kw_only=True)
class ScannedSource:
    """What a source hands the compiler: records in their final order, class names, and notes."""

    kind: str
    root: str
    task: str
    records: list[Record]
    classes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    summary: dict = field(default_factory=dict)
