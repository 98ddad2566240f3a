"""The ``text`` field (and the layout ``json`` and ``bytes`` share): one variable-length byte string per
sample, kept on the host.

Stored as ``<name>/values`` (B,) uint8 (every sample's bytes back to back) and ``<name>/offsets`` (N+1,)
int64: sample i is ``values[offsets[i]:offsets[i+1]]``. ``text``: UTF-8 (a caption); ``json``: one JSON
value as compact UTF-8 JSON (metadata; NaN and infinities are refused, tuples come back as lists);
``bytes``: raw bytes. ``ds[i][name]`` and a batch's ``name`` (a Python list of B values) are ``str``, the
parsed value, ``bytes``: they stay on the host (``Role("host")``), never sent to the device."""
from __future__ import annotations

from ..problems import Problem
from .base import Role
from .columns import ValueField


class BytesLikeField(ValueField):
    """What the three kinds share: a ragged uint8 column, Python values on the host."""

    ragged = True

    def setup(self) -> None:
        self.dtype, self.shape = "uint8", ()

    def roles(self) -> dict[str, Role]:
        return {self.name: Role("host")}

    def describe(self) -> str:
        return f"{self.kind} (variable length, on the host)"


class TextField(BytesLikeField):
    kind = "text"

    def encode(self, value, at: str) -> bytes:
        if isinstance(value, (bytes, bytearray, memoryview)):
            try:
                bytes(value).decode("utf-8")
            except UnicodeDecodeError as e:
                raise self.fail(at, f"not valid UTF-8 text (byte {e.start}); decode it to str first") from None
            return bytes(value)
        if not isinstance(value, str):
            raise self.fail(at, f"expected text (str), got {type(value).__name__}")
        try:
            return value.encode("utf-8")
        except UnicodeEncodeError as e:
            raise self.fail(at, f"not valid UTF-8 text (character {e.start}: a lone surrogate)") from None

    def decode(self, row) -> str:
        return bytes(row).decode("utf-8")

    invalid = "samples that are not valid UTF-8"  # verify's problem with rows :meth:`check_row` refuses

    def check_row(self, raw: bytes) -> None:
        """Raise ValueError where a stored row is not a value of this kind."""
        raw.decode("utf-8")

    def verify_values(self, got, m, problems: list, context: dict) -> None:
        values, offsets = got
        data, bad = values.tobytes(), []
        for i in range(len(offsets) - 1):
            try:
                self.check_row(data[offsets[i]:offsets[i + 1]])
            except ValueError:  # (UnicodeDecodeError and JSON's errors are ValueErrors)
                bad.append(i)
        if bad:
            problems.append(Problem(self.column.values_node, self.invalid, bad))
