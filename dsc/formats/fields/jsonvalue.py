"""The ``json`` field: one JSON value per sample (metadata: source URL, licence, camera...), stored as compact
UTF-8 JSON in the text layout (``text.py``). NaN and infinities are refused (they are not JSON); tuples come
back as lists. A batch's is a Python list of the parsed values, on the host."""
from __future__ import annotations

import json

from ..problems import Problem
from .text import TextField


class JsonField(TextField):
    kind = "json"

    def encode(self, value, at: str) -> bytes:
        try:
            return json.dumps(value, allow_nan=False, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        except (TypeError, ValueError, RecursionError) as e:
            raise self.fail(at, f"the value does not serialise to JSON ({e}); give plain dicts, lists, str, int, "
                                f"finite float, bool or None") from None
        except UnicodeEncodeError as e:
            raise self.fail(at, f"text in the value is not valid UTF-8 ({e.reason})") from None

    def decode(self, row):
        return json.loads(bytes(row).decode("utf-8"))

    def verify_values(self, got, m, problems: list, context: dict) -> None:
        values, offsets = got
        data, bad = values.tobytes(), []
        for i in range(len(offsets) - 1):
            try:
                json.loads(data[offsets[i]:offsets[i + 1]].decode("utf-8") or "null")
            except (UnicodeDecodeError, ValueError):
                bad.append(i)
        if bad:
            problems.append(Problem(self.column.values_node, "samples that are not JSON", bad))
