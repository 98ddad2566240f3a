"""The ``ragged`` field: a variable first dimension per sample (multi-label class ids, token ids, a polyline's
points), rows of a fixed trailing shape. Stored as ``<name>/values`` (M, *shape) and ``<name>/offsets``
(N+1,) int64: sample i owns rows ``offsets[i]:offsets[i+1]``. A batch is packed: ``<name>`` (rows of the
batch back to back) and ``<name>_offsets`` (B+1,), both gathered into the Loader's slot and sent to the
device; the ``list`` box form (``boxes="list"``) gives a list of per-sample views instead. Manifest:
``{"kind": "ragged", "dtype", "shape", "max_length"?, "classes"?}``; with ``classes`` the values are class ids
(multi-label) checked to be in range."""
from __future__ import annotations

import numpy as np

from ..problems import Problem
from .base import Role
from .columns import VALUE_DTYPES, ValueField, numeric


class RaggedField(ValueField):
    kind = "ragged"
    ragged = True
    keys = {"dtype", "shape", "max_length", "classes"}
    required = {"dtype"}

    def setup(self) -> None:
        sp = self.spec
        if sp.get("dtype") not in VALUE_DTYPES:
            raise ValueError(f"dtype {sp.get('dtype')!r} is not one of {', '.join(VALUE_DTYPES)}")
        shape = sp.get("shape") or []
        if not isinstance(shape, (list, tuple)) or not all(isinstance(d, int) and d > 0 for d in shape):
            raise ValueError(f"shape {shape!r} is not a list of positive sizes")
        self.dtype, self.shape = sp["dtype"], tuple(shape)
        self.max_length = sp.get("max_length")
        if self.max_length is not None and (not isinstance(self.max_length, int) or self.max_length < 0):
            raise ValueError(f"max_length {self.max_length!r} is not a count")
        self.classes = tuple(str(c) for c in sp.get("classes") or ())
        self.spec = {"kind": self.kind, "dtype": self.dtype, "shape": list(self.shape),
                     **({"max_length": self.max_length} if self.max_length is not None else {}),
                     **({"classes": list(self.classes)} if self.classes else {})}

    def encode(self, value, at: str) -> bytes:
        arr = numeric(self, value, at)
        if arr.size == 0:
            arr = arr.reshape(0, *self.shape)  # no rows (an empty list has no shape of its own)
        if arr.ndim == 0 or arr.shape[1:] != self.shape:
            raise self.fail(at, f"rows of shape {arr.shape[1:] if arr.ndim else ()}, the field's rows are "
                                f"{self.shape}")
        if self.max_length is not None and len(arr) > self.max_length:
            raise self.fail(at, f"{len(arr)} rows, more than the declared maximum of {self.max_length}")
        if self.classes and arr.size:
            C = len(self.classes)
            if arr.min() < 0 or arr.max() >= C:
                raise self.fail(at, f"class id {int(arr.min() if arr.min() < 0 else arr.max())} is not in 0..{C - 1}")
        return arr.tobytes()

    def verify_values(self, got, m, problems: list, context: dict) -> None:
        values, offsets = got
        sample_of = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
        rows = values.reshape(len(values), -1)
        bad = np.zeros(len(values), bool) if values.dtype.kind != "f" else ~np.isfinite(rows).all(1)
        if self.classes:
            bad |= ((rows < 0) | (rows >= len(self.classes))).any(1)
        if self.max_length is not None:
            long = np.flatnonzero(np.diff(offsets) > self.max_length)
            if len(long):
                problems.append(Problem(self.column.offsets_node, f"rows over the maximum of {self.max_length}",
                                        long.tolist()))
        if bad.any():
            problems.append(Problem(self.column.values_node, "values not finite or not class ids",
                                    sorted(set(sample_of[bad].tolist()))))

    def roles(self) -> dict[str, Role]:
        return {self.name: Role("ragged")}

    def describe(self) -> str:
        what = f"multi-label ids over {len(self.classes)} classes" if self.classes else "ragged"
        return f"{what} {self.dtype} (n{''.join(f', {d}' for d in self.shape)})" + (
            f", at most {self.max_length}" if self.max_length is not None else "")
