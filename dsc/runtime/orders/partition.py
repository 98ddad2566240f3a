import numpy as np

TAILS = ("pad", "drop")


def part_size(n: int, world_size: int, tail: str = "pad") -> int:
    """Samples per rank: ceil(n / world_size) when the tail is padded, floor when it is dropped."""
    return -(-n // world_size) if tail == "pad" else n // world_size


def partition(order: np.ndarray, rank: int, world_size: int, tail: str = "pad") -> np.ndarray:
    """Rank ``rank``'s equal-size, contiguous part of the epoch's order.

    Contiguous blocks (not every world_size-th sample) keep a quasi-random order's locality on each rank.
    ``tail="pad"`` repeats the first samples so every rank gets ceil(N / world_size) (like torch's
    DistributedSampler: a few samples are seen twice per epoch); ``"drop"`` cuts the last N % world_size
    samples of the order (none is seen twice; which are dropped changes with the epoch's order).
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in [0, {world_size})")
    if tail not in TAILS:
        raise ValueError(f"tail must be one of {TAILS}, got {tail!r}")
    n = len(order)
    per = part_size(n, world_size, tail)
    start = rank * per
    if start + per > n:  # tail="pad": the padded order repeats the order; only this rank's part is made (a
        # world size far above the samples costs nothing: every rank gets one sample, as DistributedSampler's do)
        return order[np.arange(start, start + per, dtype=np.int64) % n]
    return order[start:start + per]
