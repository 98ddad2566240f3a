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


def served(n: int, world_size: int, taken: int, tail: str = "pad") -> np.ndarray:
    """Which of the ``n`` positions of an order are served once every one of ``world_size`` ranks has served the
    first ``taken`` samples of its :func:`partition` part (a bool mask; a padded part's repeats count as the
    position they repeat)."""
    per = part_size(n, world_size, tail)
    take = max(0, min(int(taken), per))
    mask = np.zeros(n, bool)
    if n == 0 or take == 0:
        return mask
    total = per * world_size
    if total > 2 * n + 1:  # (only with more ranks than samples: per = take = 1, every position is a rank's first)
        mask[:] = True
        return mask
    pos = np.arange(total, dtype=np.int64)
    mask[pos[pos % per < take] % n] = True  # (tail="pad": position p >= n repeats position p - n)
    return mask


def remaining(order: np.ndarray, stages) -> np.ndarray:
    """The part of an epoch's order not yet served after ``stages``: each ``(world_size, taken, tail, ...)`` says that
    the ranks of one run split what was left then (:func:`partition`) and each served the first ``taken`` samples
    of its part. Elastic resume: a run on another world size partitions what this returns; the result depends on
    what was served, never on how many ranks will read the rest."""
    for world_size, taken, tail, *_ in stages:
        order = order[~served(len(order), int(world_size), int(taken), tail)]
    return order
