"""The results of a compile's units, folded into flat arrays as each unit finishes.

A unit's result (``units.UnitResult``) is a handful of small arrays and a part per field: kept as objects until
the end, they cost ~3 KB a unit, so a compile of a million one-sample shards grew by ~4 GB. Each result is
journaled (``journal.py``: that is what resume reads) and then folded in here: the per-sample columns by input
position (a skipped input's row stays unused), each field's parts by its ``Field.collect`` (flat arrays for the
image, mask and label fields; other kinds keep their parts), the few errors and warnings by unit. The driver's
memory then grows by the bytes of its columns (~150 a sample, ~50 a shard), not by Python objects, and units
may finish in any order. Read back as a sequence of ``UnitResult`` in task order (each made again on access, for
the update's carry-over of its new slots), or whole columns in input order (the fresh compile's rows).
"""
from __future__ import annotations

import numpy as np

from ..formats.fields.base import LazySequence, run_index
from .units import UnitResult


class UnitResults(LazySequence):
    """``S`` units of shard size ``K`` over ``N`` inputs, unit u holding inputs ``[u*K, u*K + K)`` and being
    slot ``s0 + u``; ``fields`` the dataset's fields."""

    def __init__(self, S: int, N: int, K: int, s0: int, fields: tuple):
        self.S, self.N, self.K, self.s0 = S, N, K, s0
        self.kept = np.zeros(N, bool)
        self.orig = np.zeros((N, 2), np.int32)
        self.affine = np.zeros((N, 4), np.float64)
        self.orientation = np.zeros(N, np.uint8)
        self.inputs = np.zeros((N, 10), np.int64)
        self.counts = np.zeros(S, np.int64)  # samples each unit kept
        self.nbytes = np.zeros(S, np.int64)  # bytes of its shards
        self.present = np.zeros(S, bool)
        self.parts = {f.name: f.collect(S, N, K, s0) for f in fields}
        self._errors: dict[int, list] = {}  # unit -> [(input, reason)] (only units with some)
        self._warnings: dict[int, list] = {}
        self.settled = False

    def add(self, res: UnitResult) -> None:
        u = res.s - self.s0
        rows = np.asarray(res.kept, np.int64)
        n = len(rows)
        if n:  # (one input: no reduction, the commonest unit of a many-shards compile)
            lo, hi = (int(rows[0]),) * 2 if n == 1 else (int(rows.min()), int(rows.max()))
            if lo < u * self.K or hi >= (u + 1) * self.K:
                raise ValueError(f"unit {res.s} kept inputs outside its own")  # (an internal invariant)
        at = run_index(rows)
        self.kept[at] = True
        self.orig[at], self.affine[at] = res.orig, res.affine
        self.orientation[at], self.inputs[at] = res.orientation, res.inputs
        self.counts[u], self.nbytes[u], self.present[u] = len(rows), res.nbytes, True
        if res.errors:
            self._errors[u] = list(res.errors)
        if res.warnings:
            self._warnings[u] = list(res.warnings)
        for name, part in res.parts.items():
            self.parts[name].add(u, part, rows)

    def settle(self) -> "UnitResults":
        """Every unit is in: the parts read back."""
        for p in self.parts.values():
            p.settle(self.kept)
        self.settled = True
        return self

    @property
    def errors(self) -> list[tuple[int, str]]:
        """(input, reason) of every input left out, in input order."""
        return [e for u in sorted(self._errors) for e in self._errors[u]]

    @property
    def warnings(self) -> list[tuple[int, str]]:
        """(input, message) of what decoding said, in input order."""
        return [w for u in sorted(self._warnings) for w in self._warnings[u]]

    def kept_rows(self) -> np.ndarray:
        """The inputs that became samples, in order."""
        return np.flatnonzero(self.kept)

    def __len__(self) -> int:
        return self.S

    def _item(self, u: int) -> UnitResult:
        lo = u * self.K
        rows = lo + np.flatnonzero(self.kept[lo:lo + self.K])
        return UnitResult(self.s0 + u, rows, self.orig[rows], self.affine[rows], self.orientation[rows],
                          list(self._errors.get(u, ())), {name: p[u] for name, p in self.parts.items()},
                          self.inputs[rows], list(self._warnings.get(u, ())))
