"""The order of an epoch over several sources (a mixture): a pure function of (seed, epoch, the sources' sizes,
their counts per epoch, the order). A sample's identity is (source, index), written as one int64 id:
``offsets[source] + index`` (``offsets``: the sources' sizes, cumulated). Ranks split this order exactly as they
split a single dataset's (``partition.py``), so a mixture keeps exact rank partitions and elastic resume.

How much of an epoch each source gives is decided first, as exact counts (MosaicML Streaming's proportion /
repeat / choose): :func:`source_counts`. Then each source's samples of the epoch are picked (:func:`picks`):
every sample once, whole passes plus part of one more (``count`` over the source's size, without replacement),
a part (fewer), or ``count`` draws with replacement. Last, the sources are merged (:func:`mixture_order`):
``random`` shuffles every pick together; ``sequential`` and ``quasi_random`` keep each source's own order (index
order; windows of shards, the window shared among the sources in proportion) and interleave the sources evenly,
so every stretch of the epoch holds each source in its proportion and each source's reads keep their locality.
"""
from __future__ import annotations

import numpy as np

from . import ORDERS


def source_counts(sizes, weights=None, epoch_size: int | None = None, choose=None) -> np.ndarray:
    """Samples each source gives per epoch. ``choose[s]`` (an int) fixes source s's count; the others share what
    is left of ``epoch_size`` by ``weights`` (default: their sizes). Without ``weights`` and ``epoch_size``
    every source gives its size (each sample once); without ``epoch_size`` the epoch is the sources' total (the
    fixed counts, plus the sizes of the others).
    Counts are rounded by largest remainder, so they add up to the epoch exactly."""
    sizes = np.asarray(sizes, np.int64)
    S = len(sizes)
    fixed = np.array([c is not None for c in (choose or [None] * S)])
    counts = np.array([int(c) if c is not None else 0 for c in (choose or [None] * S)], np.int64)
    free = ~fixed
    if not free.any():
        return counts
    if weights is None and epoch_size is None:
        counts[free] = sizes[free]
        return counts
    total = int(counts[fixed].sum() + sizes[free].sum()) if epoch_size is None else int(epoch_size)
    left = max(0, total - int(counts[fixed].sum()))
    w = np.asarray(sizes if weights is None else weights, np.float64) * free
    share = w / w.sum() * left
    base = np.floor(share).astype(np.int64)
    rest = left - int(base.sum())
    if rest:
        frac = np.where(free, share - base, -1.0)
        base[np.argsort(-frac, kind="stable")[:rest]] += 1
    counts[free] = base[free]
    return counts


def _rng(seed: int, epoch: int, source: int, what: int) -> np.random.Generator:
    return np.random.default_rng([seed, epoch, source, what, 0x51CE])


def _source_seed(seed: int, source: int) -> int:
    """Source s's own order seed: the Loader's seed for the first source (a one-source mixture orders its samples
    as a Loader of that dataset does), a seed of its own for the others."""
    return seed if source == 0 else int(np.random.SeedSequence([seed, source]).generate_state(1)[0])


def picks(size: int, shard_size: int, count: int, order: str, seed: int, epoch: int, source: int,
          replace: bool = False, window: int | None = None) -> np.ndarray:
    """Source ``source``'s ``count`` samples of the epoch (its indices), in its own order."""
    if count == 0 or size == 0:
        return np.zeros(0, np.int64)
    fn = ORDERS[order]  # (each source in its own order: any registered one)
    s_seed = _source_seed(seed, source)
    if replace:
        drawn = _rng(seed, epoch, source, 1).integers(0, size, count).astype(np.int64)
        if order == "random":
            return drawn
        rank = np.empty(size, np.int64)  # each draw where its sample stands in the source's own order
        rank[fn(size, shard_size, s_seed, epoch, window=window)] = np.arange(size)
        return drawn[np.argsort(rank[drawn], kind="stable")]
    whole, part = divmod(int(count), int(size))
    passes = [fn(size, shard_size, s_seed, epoch if p == 0 else epoch * 1_000_003 + p, window=window)
              for p in range(whole)]
    if part:
        if order == "sequential":  # a part of the source: chosen at random, read in index order
            passes.append(np.sort(_rng(seed, epoch, source, 2).permutation(size)[:part]))
        else:  # the head of another pass of its own order (quasi_random: its first windows)
            passes.append(fn(size, shard_size, s_seed, epoch * 1_000_003 + whole, window=window)[:part])
    return np.concatenate(passes).astype(np.int64)


def mixture_order(sizes, shard_sizes, counts, order: str, seed: int, epoch: int, replace=False,
                  window: int | None = None) -> np.ndarray:
    """The epoch's ids (``offsets[source] + index``), every source giving ``counts[source]`` samples."""
    sizes = np.asarray(sizes, np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    if isinstance(replace, (bool, np.bool_)):
        replace = [bool(replace)] * len(sizes)
    total = max(1, int(np.sum(counts)))
    # quasi_random: the window is shared among the sources in proportion, so a stretch of the epoch reads about
    # ``window`` shards in all (as a single dataset's would), not ``window`` of each source
    windows = [None if window is None else max(1, round(window * int(c) / total)) for c in counts]
    parts = [offsets[s] + picks(int(sizes[s]), int(shard_sizes[s]), int(counts[s]), order, seed, epoch, s,
                                replace[s], windows[s]) for s in range(len(sizes))]
    if len(parts) == 1:
        return parts[0]
    ids = np.concatenate(parts)
    if order == "random":
        return ids[np.random.default_rng([seed, epoch, 0x3A7]).permutation(len(ids))]
    return ids[interleave([len(p) for p in parts])]


def interleave(lengths) -> np.ndarray:
    """Positions into the concatenation of sequences of ``lengths`` that merge them evenly: the k-th element of a
    sequence of n stands at (k + 1/2) / n of the epoch (ties by sequence)."""
    keys = np.concatenate([(np.arange(n) + 0.5) / n for n in lengths]) if lengths else np.zeros(0)
    return np.argsort(keys, kind="stable").astype(np.int64)


def chunks(ids: np.ndarray, offsets: np.ndarray, batch_size: int, drop_short: bool = False
           ) -> tuple[np.ndarray, np.ndarray]:
    """One source per batch: the epoch's ids cut into batches of one source each, in the order each batch's
    first sample comes in the epoch (each source's samples keep their order). A source's last batch may be short
    (``drop_short``: it is left out). Returns (the ids regrouped, each batch's start and the end)."""
    src = np.searchsorted(offsets, ids, "right") - 1
    out, first = [], []
    for s in range(len(offsets)):
        where = np.flatnonzero(src == s)
        for a in range(0, len(where), batch_size):
            if drop_short and a + batch_size > len(where):
                break
            out.append(ids[where[a:a + batch_size]])
            first.append(where[a])
    out = [out[k] for k in np.argsort(np.asarray(first, np.int64), kind="stable")]
    bounds = np.concatenate([[0], np.cumsum([len(c) for c in out])]).astype(np.int64)
    return (np.concatenate(out) if out else np.zeros(0, np.int64)), bounds
