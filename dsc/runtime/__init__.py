"""Open compiled datasets and read them with zero decoding. Imports formats/, never compiler/.

``storage.py`` (shards mapped from the page cache or held in RAM), ``dataset.py`` (``dsc.open``: fields
read through their readers), ``batches.py`` (batch forms), ``prefetch.py`` (the ring and its filler
threads, CPU and CUDA), ``loader.py`` (``dsc.Loader``), ``orders/`` (sample orders, one module each).
"""
from .batches import Batch, SampleBatch, collate
from .dataset import Dataset, open
from .loader import Loader

__all__ = ["Batch", "Loader", "Dataset", "SampleBatch", "collate", "open"]
