"""dsc: compile image datasets once into memory-mappable Zarr v3 shards; read them with zero decoding.

    import dsc
    dsc.compile_imagefolder("train/", "train.dsc", size=224)
    ds = dsc.open("train.dsc")           # a torch.utils.data.Dataset

Names are imported lazily so that ``import dsc`` (and the CLI) does not pay for torch until needed.
"""
from ._version import __version__

_LAZY = {
    "open": ("dsc.runtime", "open"),
    "Dataset": ("dsc.runtime", "Dataset"),
    "Loader": ("dsc.runtime", "Loader"),
    "Mixture": ("dsc.runtime", "Mixture"),
    "Batch": ("dsc.runtime", "Batch"),
    "SampleBatch": ("dsc.runtime", "SampleBatch"),
    "collate": ("dsc.runtime", "collate"),
    "compile": ("dsc.compiler", "compile"),
    "compile_dataset": ("dsc.compiler", "compile_dataset"),
    "compact": ("dsc.compiler.compact", "compact_dataset"),
    "register_source": ("dsc.compiler.sources", "register_source"),
    "sources": ("dsc.compiler.sources", "sources"),
    "Source": ("dsc.compiler.sources", "Source"),
    "Param": ("dsc.compiler.sources", "Param"),
    "preview": ("dsc.runtime.preview", "preview"),
    "verify": ("dsc.formats.verify", "verify"),
    "boxes_to_original": ("dsc.formats.coords", "invert_affine"),
    "CompileOptions": ("dsc.compiler", "CompileOptions"),
    "environment": ("dsc.env", "environment"),
    "log": ("dsc.versions", "log"),
    "tag": ("dsc.versions", "tag"),
    "restore": ("dsc.versions", "restore"),
    "vacuum": ("dsc.versions", "vacuum"),
}

from .errors import (CacheFullError, CompileLockedError, ConfigError, CorruptDatasetError,  # noqa: E402
                     CredentialsError, DatasetNotFoundError, DscError, FormatVersionError, ImageDecodeError,
                     ObjectChangedError, OutputExistsError, RemoteError, ResumeError, SampleError, SourceError,
                     TooManyOpenFilesError, UnsafePathError, VersionConflictError, VersionNotFoundError, WriteError)


def __getattr__(name):
    import importlib

    if name in _LAZY:
        mod, attr = _LAZY[name]
        value = getattr(importlib.import_module(mod), attr)
        globals()[name] = value
        return value
    if name.startswith("compile_"):  # dsc.compile_<source> for every registered source (plugins too)
        compiler = importlib.import_module("dsc.compiler")
        if name[8:] in compiler.all_sources():
            return compiler.compile_function(compiler.get_source(name[8:]))
    raise AttributeError(f"module 'dsc' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_LAZY))


__all__ = ["__version__", *_LAZY, "DscError", "ConfigError", "SourceError", "ImageDecodeError", "OutputExistsError",
           "SampleError", "CompileLockedError", "DatasetNotFoundError", "FormatVersionError", "CorruptDatasetError",
           "UnsafePathError", "VersionConflictError", "VersionNotFoundError", "RemoteError", "ObjectChangedError",
           "CredentialsError", "CacheFullError", "ResumeError", "WriteError", "TooManyOpenFilesError"]
