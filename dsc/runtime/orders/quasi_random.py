import numpy as np

DEFAULT_WINDOW = 8


def quasi_random_order(num_samples: int, shard_size: int, seed: int, epoch: int,
                       window: int | None = None, **_) -> np.ndarray:
    """Shuffle shards, then shuffle samples within consecutive windows of ``window`` shards.

    Trade-off: for datasets larger than RAM. Only ``window`` shards are needed at a time (a batch touches
    at most two windows), so the working set is ``window * shard bytes`` instead of the dataset, and the
    reads stay within a few files. The price is correlation: samples of one shard (consecutive source
    files, often one class in an ImageFolder) land in the same stretch of the epoch. A larger window
    costs memory and buys randomness; ``window >= number of shards`` is a full random order.
    """
    window = window or DEFAULT_WINDOW
    rng = np.random.default_rng([seed, epoch, 0x9E3779B9])
    num_shards = -(-num_samples // shard_size)
    shard_perm = rng.permutation(num_shards)
    parts = []
    for w in range(0, num_shards, window):
        shards = shard_perm[w:w + window]
        starts = shards * shard_size
        counts = np.minimum(starts + shard_size, num_samples) - starts
        idx = np.repeat(starts - np.concatenate([[0], np.cumsum(counts)[:-1]]), counts) + np.arange(counts.sum())
        parts.append(rng.permutation(idx))
    return np.concatenate(parts).astype(np.int64)
