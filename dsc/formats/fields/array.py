"""The ``array`` field: a fixed shape and numeric dtype per sample (an embedding, a multi-hot vector), stored
at ``<name>`` (N, *shape). A batch's is (B, *shape), gathered into the Loader's slot with the pixels.
Manifest: ``{"kind": "array", "dtype", "shape", "classes"?, "multihot"?}``; ``multihot``: the source gave
lists of class ids, stored as a uint8 vector over ``classes`` (1: the sample has that class)."""
from __future__ import annotations

import numpy as np

from .columns import VALUE_DTYPES, ValueField, numeric


class ArrayField(ValueField):
    kind = "array"
    keys = {"dtype", "shape", "classes", "multihot"}
    required = {"dtype", "shape"}

    def setup(self) -> None:
        sp = self.spec
        if sp.get("dtype") not in VALUE_DTYPES:
            raise ValueError(f"dtype {sp.get('dtype')!r} is not one of {', '.join(VALUE_DTYPES)}")
        shape = sp.get("shape")
        if not isinstance(shape, (list, tuple)) or not shape or not all(
                isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape):
            raise ValueError(f"shape {shape!r} is not a list of positive sizes")
        self.dtype, self.shape = sp["dtype"], tuple(shape)
        self.classes = tuple(str(c) for c in sp.get("classes") or ())
        self.multihot = bool(sp.get("multihot"))
        if self.multihot and self.shape != (len(self.classes),):
            raise ValueError(f"a multi-hot field has one entry per class: shape {list(self.shape)} for "
                             f"{len(self.classes)} classes")

    def encode(self, value, at: str) -> bytes:
        if self.multihot:
            ids = numeric(self, value, at, np.int64).reshape(-1)
            C = len(self.classes)
            if len(ids) and (ids.min() < 0 or ids.max() >= C):
                raise self.fail(at, f"class id {int(ids.min() if ids.min() < 0 else ids.max())} is not in 0..{C - 1}")
            hot = np.zeros(C, np.uint8)
            hot[ids] = 1
            return hot.astype(self.dtype).tobytes()
        arr = numeric(self, value, at)
        if arr.shape != self.shape:
            raise self.fail(at, f"an array of shape {arr.shape}, the field's shape is {self.shape}")
        return arr.tobytes()

    def describe(self) -> str:
        what = f"multi-hot over {len(self.classes)} classes" if self.multihot else "array"
        return f"{what} {self.dtype} {tuple(self.shape)}"

