"""The ``number`` field: one scalar of a numeric dtype per sample (a regression target, a weight, a score),
stored at ``<name>`` (N,). ``ds[i][name]`` is a 0-d tensor of that dtype; a batch's is (B,), gathered into
the Loader's slot with the pixels and sent to the device with them. Manifest: ``{"kind": "number",
"dtype", "classes"?}``. NaN and infinities are refused at compile time (a sample error naming the field)."""
from __future__ import annotations

import numpy as np

from ..problems import Problem
from .columns import VALUE_DTYPES, ValueField, numeric


class NumberField(ValueField):
    kind = "number"
    keys = {"dtype", "classes"}  # classes: the number is a class index of another label (a ClassLabel column)
    required = {"dtype"}

    def setup(self) -> None:
        if self.spec.get("dtype") not in VALUE_DTYPES:
            raise ValueError(f"dtype {self.spec.get('dtype')!r} is not one of {', '.join(VALUE_DTYPES)}")
        self.dtype, self.shape = self.spec["dtype"], ()
        self.classes = tuple(str(c) for c in self.spec.get("classes") or ())

    def encode(self, value, at: str) -> bytes:
        arr = numeric(self, value, at)
        if arr.size != 1:
            raise self.fail(at, f"expected one {self.dtype} number, got an array of shape {arr.shape}")
        return arr.reshape(()).tobytes()

    def verify_values(self, col, m, problems: list, context: dict) -> None:
        if col.dtype.kind == "f" and not np.isfinite(col).all():
            problems.append(Problem(self.name, "NaN or infinite values", np.flatnonzero(~np.isfinite(col)).tolist()))

    def describe(self) -> str:
        return f"number {self.dtype}" + (f", a class index of {len(self.classes)} classes" if self.classes else "")
