import numpy as np


def sequential_order(num_samples: int, shard_size: int, seed: int, epoch: int, **_) -> np.ndarray:
    """0, 1, ..., N-1 every epoch: for evaluation, and the fastest read (each shard read once, in order)."""
    return np.arange(num_samples, dtype=np.int64)
