"""The one rule for the paths a dataset's metadata may name: plain names joined by '/'.

Metadata can never make dsc touch a path outside the dataset: no '..', no absolute paths, no separators
other than '/'. Every store checks a relative path with :func:`check_node_path` before it touches it.
"""
from __future__ import annotations

import re

from ..errors import UnsafePathError

_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


def check_node_path(rel: str) -> str:
    """Validate a dataset-relative node path ('image/values/3'): every part a plain name.

    Metadata can never make dsc touch a path outside the dataset: no '..', no absolute paths,
    no separators other than '/'.
    """
    parts = rel.split("/")
    if not rel or any(not _NAME_RE.match(p) or p in (".", "..") for p in parts):
        raise UnsafePathError(f"refusing node path {rel!r}: only plain names joined by '/' are allowed")
    return rel
