"""Open compiled datasets and read them with zero decoding. Imports formats/, never compiler/."""
from .dataset import Dataset, SampleBatch, collate, open
from .loader import Loader

__all__ = ["Loader", "Dataset", "SampleBatch", "collate", "open"]
