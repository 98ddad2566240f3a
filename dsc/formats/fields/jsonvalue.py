"""The ``json`` field: one JSON value per sample (metadata: source URL, licence, camera...), stored as compact
UTF-8 JSON in the text layout (``text.py``). What JSON cannot hold exactly is refused rather than changed: NaN
and infinities, and dict keys that are not str (``json.dumps`` would turn ``{2: "x"}`` into ``{"2": "x"}``).
JSON has one sequence type: lists and tuples both read back as lists. A batch's is a Python list of the parsed
values, on the host."""
from __future__ import annotations

import json

from .text import TextField


class JsonField(TextField):
    kind = "json"

    def encode(self, value, at: str) -> bytes:
        try:
            bad = _non_str_key(value)
        except RecursionError:
            bad = None  # (too deep for JSON too: json.dumps says so below)
        if bad is not None:
            raise self.fail(at, f"json object keys must be str: {bad[0]} has the key {bad[1]!r} "
                                f"({type(bad[1]).__name__}), which JSON would read back as a str; make the keys "
                                f"str first")
        try:
            return json.dumps(value, allow_nan=False, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        except (TypeError, ValueError, RecursionError) as e:
            raise self.fail(at, f"the value does not serialise to JSON ({e}); give plain dicts, lists, str, int, "
                                f"finite float, bool or None") from None
        except UnicodeEncodeError as e:
            raise self.fail(at, f"text in the value is not valid UTF-8 ({e.reason})") from None

    def decode(self, row):
        return json.loads(bytes(row).decode("utf-8"))

    invalid = "samples that are not JSON"

    def check_row(self, raw: bytes) -> None:
        json.loads(raw.decode("utf-8") or "null")


def _non_str_key(value, where: str = "the value"):
    """(where, key) of the first dict key in ``value`` that is not a str; None: there is none."""
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                return where, k
            bad = _non_str_key(v, f"{where}[{k!r}]")
            if bad is not None:
                return bad
    elif isinstance(value, (list, tuple)):
        for j, v in enumerate(value):
            bad = _non_str_key(v, f"{where}[{j}]")
            if bad is not None:
                return bad
    return None
