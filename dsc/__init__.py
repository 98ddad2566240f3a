"""dsc: compile image datasets once into memory-mappable Zarr v3 shards; read them with zero decoding.

    import dsc
    dsc.compile_imagefolder("train/", "train.dsc", size=224)
    ds = dsc.open("train.dsc")           # a torch.utils.data.Dataset

Names are imported lazily so that ``import dsc`` (and the CLI) does not pay for torch until needed.
"""
__version__ = "0.1.0"

_LAZY = {
    "open": ("dsc.runtime", "open"),
    "Dataset": ("dsc.runtime", "Dataset"),
    "Loader": ("dsc.runtime", "Loader"),
    "SampleBatch": ("dsc.runtime", "SampleBatch"),
    "collate": ("dsc.runtime", "collate"),
    "compile": ("dsc.compiler", "compile"),
    "compile_table": ("dsc.compiler", "compile_table"),
    "compile_imagefolder": ("dsc.compiler", "compile_imagefolder"),
    "compile_dataset": ("dsc.compiler", "compile_dataset"),
    "compile_coco": ("dsc.compiler", "compile_coco"),
    "compile_yolo": ("dsc.compiler", "compile_yolo"),
    "compile_voc": ("dsc.compiler", "compile_voc"),
    "preview": ("dsc.runtime.preview", "preview"),
    "verify": ("dsc.formats.verify", "verify"),
    "boxes_to_original": ("dsc.formats.coords", "invert_affine"),
    "CompileOptions": ("dsc.compiler", "CompileOptions"),
    "environment": ("dsc.env", "environment"),
}

from .errors import (CompileLockedError, CorruptDatasetError, DatasetNotFoundError, DscError, SampleError,  # noqa: E402,E501
                     FormatVersionError, ImageDecodeError, OutputExistsError, SourceError, UnsafePathError)


def __getattr__(name):
    if name in _LAZY:
        import importlib

        mod, attr = _LAZY[name]
        value = getattr(importlib.import_module(mod), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'dsc' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_LAZY))


__all__ = ["__version__", *_LAZY, "DscError", "SourceError", "ImageDecodeError", "OutputExistsError",
           "SampleError", "CompileLockedError", "DatasetNotFoundError", "FormatVersionError", "CorruptDatasetError",
           "UnsafePathError"]
