"""The one rule for the paths a dataset's metadata may name: plain names joined by '/'.

Metadata can never make dsc touch a path outside the dataset: no '..', no absolute paths, no separators
other than '/'. Every store checks a relative path with :func:`check_node_path` before it touches it.
"""
from __future__ import annotations

import re

from ..errors import UnsafePathError

# the same rule for a whole path in one match (a name never starts with '.', so no '.' or '..' part); called once
# per shard file a compile writes, where the per-part check was a visible share of the fixed cost
_PATH_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*(?:/[A-Za-z0-9_][A-Za-z0-9_.-]*)*")


def check_node_path(rel: str) -> str:
    """Validate a dataset-relative node path ('image/values/3'): every part a plain name.

    Metadata can never make dsc touch a path outside the dataset: no '..', no absolute paths,
    no separators other than '/'.
    """
    if not isinstance(rel, str) or _PATH_RE.fullmatch(rel) is None:
        raise UnsafePathError(f"refusing node path {rel!r}: only plain names joined by '/' are allowed")
    return rel
