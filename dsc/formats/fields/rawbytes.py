"""The ``bytes`` field: raw bytes per sample (a blob: a sidecar file, an encoded thumbnail), in the text layout
(``text.py``). A batch's is a Python list of ``bytes``, on the host."""
from __future__ import annotations

from .text import BytesLikeField


class BytesField(BytesLikeField):
    kind = "bytes"

    def encode(self, value, at: str) -> bytes:
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise self.fail(at, f"expected bytes, got {type(value).__name__}")
        return bytes(value)

    def decode(self, row) -> bytes:
        return bytes(row)
