"""Open compiled datasets and read them with zero decoding. Imports formats/, never compiler/.

``storage.py`` (shards mapped from the page cache or held in RAM), ``dataset.py`` (``dsc.open``: fields
read through their readers), ``batches.py`` (batch forms), ``reads.py`` (read strategies: mapped, windowed,
direct) and ``schedule.py`` (an epoch's shard reads scheduled from its order), ``prefetch.py`` (the ring
and its filler threads, CPU and CUDA), ``loader.py`` (``dsc.Loader``), ``mixture.py`` (``dsc.Mixture``: several datasets in one
Loader), ``orders/`` (sample orders, one module each; a mixture's order; elastic resume's arithmetic), ``remote.py`` and ``cache.py`` (datasets in object storage behind a local shard cache).

Names are imported lazily: ``dsc info`` reads ``reads.py``'s memory figures without importing torch.
"""
_LAZY = {"Batch": "batches", "SampleBatch": "batches", "collate": "batches", "Dataset": "dataset", "open": "dataset",
         "Loader": "loader", "Mixture": "mixture"}


def __getattr__(name):
    import importlib

    if name in _LAZY:
        value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Batch", "Loader", "Mixture", "Dataset", "SampleBatch", "collate", "open"]
