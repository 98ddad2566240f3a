"""Where bytes live: the one place that knows whether a dataset is a local folder or in object storage.

``open_store(path_or_url)`` is the one door: a folder gives a :class:`LocalStore` (reads through one open
directory without following links, writes by write + rename, put-if-absent by link), an ``s3://`` /
``gs://`` / ``az://`` URL an :class:`~dsc.store.object.ObjectStore` (obstore, retries within a budget), and
a scheme registered with :func:`register_store` the store its factory makes. Everything above asks this
package, never "is this a URL?". Imports only ``dsc.errors``.
"""
from __future__ import annotations

import functools
import os
import re
from pathlib import Path
from typing import Callable

from ..errors import ConfigError
from .base import Sha256Sink, Store, default_cache_dir
from .local import LocalStore
from .object import FAMILY, ObjectStore, retry_seconds

_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://(.*)$")
OBJECT_SCHEMES = tuple(FAMILY)


def is_url(path) -> bool:
    """Whether ``path`` names object storage (``scheme://...`` other than ``file://``)."""
    if not isinstance(path, str):
        return False
    m = _URL.match(path)
    return m is not None and m.group(1).lower() != "file"


def local_path(path):
    """``file:///x`` (any case of ``file``) -> ``/x``; anything else unchanged."""
    if isinstance(path, str) and path[:7].lower() == "file://":
        return Path(path[7:])
    return path


_SLASH_MISSING = re.compile(rf"^({'|'.join(OBJECT_SCHEMES)}):/?([^/].*)$", re.IGNORECASE)


def url_typo(path) -> str | None:
    """The URL a path that does not exist almost certainly meant (``s3:/b/x``, ``gs:b/x`` -> ``s3://b/x``...),
    else None: such a path would otherwise become a local folder named ``s3:``."""
    m = _SLASH_MISSING.match(path) if isinstance(path, str) else None
    if m is None or os.path.lexists(path):
        return None
    return f"{m.group(1).lower()}://{m.group(2)}"


_FACTORIES: dict[str, Callable[[str, float], Store]] = {}


def register_store(scheme: str, factory: Callable[[str, float], Store]) -> None:
    """Make ``scheme://`` URLs open through ``factory(url, retry_seconds) -> Store``."""
    _FACTORIES[scheme] = factory


def open_store(url, retry: float | None = None) -> Store:
    """The store of the dataset at ``url``: a local folder (a path, or ``file://``), or object storage."""
    if not is_url(url):
        meant = url_typo(url)
        if meant:
            raise ConfigError(f"{url!r} is not a URL: did you mean {meant}? (a local folder of that name: "
                              f"./{url})")
        return LocalStore(local_path(url))
    m = _URL.match(url)
    scheme = m.group(1).lower()
    url = f"{scheme}://{m.group(2)}"
    if not m.group(2).strip("/"):
        raise ConfigError(f"{url!r} names no bucket: give s3://bucket/prefix (gs://bucket/prefix, az://container/prefix)")
    if scheme in _FACTORIES:
        return _FACTORIES[scheme](url, retry_seconds(retry))
    if scheme not in OBJECT_SCHEMES:
        raise ConfigError(f"{url}: dsc reads s3://, gs:// and az:// URLs (got {scheme}://)")
    return _object_store(url.rstrip("/"), retry_seconds(retry), _settings_key())


def _settings_key() -> tuple:
    """What a store's configuration depends on besides its URL (a changed variable makes a new store)."""
    return tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(("AWS_", "GOOGLE_", "AZURE_"))))


@functools.lru_cache(maxsize=64)
def _object_store(url: str, retry: float, settings: tuple) -> ObjectStore:
    """One client per URL and settings in a process: building one loads the system's TLS roots (about
    0.2 s), and a client is safe to share between threads."""
    return ObjectStore(url, retry)


__all__ = ["LocalStore", "ObjectStore", "Sha256Sink", "Store", "default_cache_dir", "is_url", "local_path",
           "open_store", "register_store", "retry_seconds"]
