"""The source registry: every input kind dsc compiles, built-in or from a plugin.

A built-in source is one module here and one line in ``BUILTIN``. A third-party source registers with
``dsc.register_source(MySource)`` or, to appear in the ``dsc`` CLI, through the ``dsc.sources`` entry-point
group (``mysource = "my_package.module:MySource"``). The CLI commands, ``dsc.compile_<name>`` and the
help are generated from the registry.
"""
from __future__ import annotations

import warnings

from ...errors import ConfigError
from .base import (DROP_EMPTY, Item, MaskInfo, Param, Record, ScannedSource, Source, Target, drop_empty,
                   file_item, where)
from .coco import CocoSource, scan_coco
from .dataset import DatasetSource, as_map_style
from .delta import DeltaSource
from .imagefolder import ImageFolderSource, scan_imagefolder
from .segfolder import SegFolderSource
from .table import TableSource, scan_table
from .voc import VocSource, scan_voc
from .webdataset import WebDatasetSource
from .yolo import YoloSource, scan_yolo
from ..options import CompileOptions

BUILTIN = (ImageFolderSource, CocoSource, YoloSource, VocSource, SegFolderSource, TableSource, DeltaSource, DatasetSource,
           WebDatasetSource)
ENTRY_POINT_GROUP = "dsc.sources"

_registry: dict[str, type[Source]] = {cls.name: cls for cls in BUILTIN}
_plugins_loaded = False


def register_source(cls: type[Source], replace: bool = False) -> type[Source]:
    """Add a source class to the registry (usable as a class decorator). Its ``name`` becomes
    ``dsc compile <name>`` and ``dsc.compile_<name>``; an existing name is refused unless ``replace``."""
    if not (isinstance(cls, type) and issubclass(cls, Source)):
        raise ConfigError(f"register_source takes a dsc Source subclass, got {cls!r}")
    name = cls.name
    if not name or not name.replace("_", "").isalnum() or not name[0].isalpha() or name != name.lower():
        raise ConfigError(f"{cls.__name__}.name must be a lower-case identifier (letters, digits, _), got {name!r}")

    import keyword

    taken = set(CompileOptions.names()) | {"out", "quiet", "filter_", "options"}
    taken_flags = {"--" + n.replace("_", "-") for n in taken} | {"--filter", "-q", "-h", "--help", "--out"}
    names, flags = set(), set()
    for p in cls.params:
        if not p.name.isidentifier() or keyword.iskeyword(p.name):
            raise ConfigError(f"{cls.__name__}: parameter name {p.name!r} is not a Python identifier")
        if p.name in taken or (p.cli and not p.argument and p.option in taken_flags):
            raise ConfigError(f"{cls.__name__}: parameter {p.name!r} ({p.option}) would shadow a compile option; "
                              f"rename it")
        if p.name in names or (p.cli and not p.argument and p.option in flags):
            raise ConfigError(f"{cls.__name__}: parameter {p.name!r} ({p.option}) is declared twice")
        names.add(p.name)
        flags.add(p.option)
    if name in _registry and _registry[name] is not cls and not replace:
        raise ConfigError(f"a source named {name!r} is already registered ({_registry[name].__module__}."
                          f"{_registry[name].__name__}); pass replace=True to replace it")
    _registry[name] = cls
    return cls


def _load_plugins() -> None:
    """Register the sources of the ``dsc.sources`` entry points, once. A plugin that fails to load is
    reported as a warning naming it; it never breaks the built-in sources."""
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            cls = ep.load()
            if getattr(cls, "name", None) in _registry and _registry[cls.name] is not cls:
                raise ConfigError(f"its name {cls.name!r} is taken by {_registry[cls.name].__module__}")
            register_source(cls)
        except Exception as e:  # noqa: BLE001 - a broken plugin is reported, not fatal
            warnings.warn(PluginWarning(f"the source plugin {ep.name!r} ({ep.value}) was not loaded: {e}"),
                          stacklevel=2)


class PluginWarning(UserWarning):
    """A ``dsc.sources`` entry point that could not be loaded (the CLI prints it as one line)."""


def scan_dataset(dataset, classes=None) -> ScannedSource:
    """The records of a Python dataset (as ``dsc.compile(dataset, ...)`` scans it)."""
    return DatasetSource(dataset=dataset, classes=classes).scan()


def sources() -> dict[str, type[Source]]:
    """Every registered source by name: built-ins first, then plugins in registration order."""
    _load_plugins()
    return dict(_registry)


def get_source(name: str) -> type[Source]:
    all_ = sources()
    if name not in all_:
        raise ConfigError(unknown_source(name))
    return all_[name]


def unknown_source(name: str, names=None) -> str:
    """The message for a source name that is not registered: the likely one meant among ``names`` (default:
    every source), and all of them."""
    import difflib

    all_ = list(sources() if names is None else names)
    close = difflib.get_close_matches(str(name).lower(), all_, n=1, cutoff=0.6)
    return (f"no source named {name!r}" + (f"; did you mean {close[0]!r}?" if close else "")
            + f" (the sources are: {', '.join(all_)})")


__all__ = ["BUILTIN", "DROP_EMPTY", "Item", "MaskInfo", "Param", "Record", "ScannedSource", "Source", "Target",
           "PluginWarning", "as_map_style", "drop_empty", "scan_dataset", "file_item", "get_source", "register_source", "scan_coco",
           "scan_imagefolder", "scan_table", "scan_voc", "scan_yolo", "sources", "unknown_source", "where"]
