"""What ``dsc verify`` reports: a problem (the file, what is wrong, which samples) and the report. Below the
field kinds, whose own checks add problems, and ``verify.py``, which runs them."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..errors import DscError


@dataclass
class Problem:
    file: str
    what: str
    samples: list[int] = field(default_factory=list)
    view: bool = False  # a difference of the top-level plain-Zarr view only (the version itself is intact)
    tag: bool = False  # a damaged tag (the version itself is intact)

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
    version: int | None = None  # the version checked (None: a dataset without versions)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def damaged_samples(self) -> list[int]:
        return sorted({i for p in self.problems for i in p.samples})


def try_read(problems: list[Problem], rel: str, fn):
    """``fn()``, or None with the failure recorded as a problem of ``rel``."""
    try:
        return fn()
    except (DscError, OSError, ValueError) as e:
        problems.append(Problem(rel, str(e)))
        return None


