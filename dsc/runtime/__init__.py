"""Open compiled datasets and read them with zero decoding. Imports formats/, never compiler/."""
from .dataset import Dataset, SampleBatch, collate, open

__all__ = ["Dataset", "SampleBatch", "collate", "open"]
