"""Sample orders: pure functions ``(num_samples, shard_size, seed, epoch) -> int64 array`` of the whole
epoch, one module each, and the partition of an epoch's order across distributed ranks."""
from __future__ import annotations

from typing import Callable

import numpy as np

from .partition import partition
from .quasi_random import quasi_random_order
from .random import random_order
from .sequential import sequential_order

OrderFn = Callable[..., np.ndarray]
ORDERS: dict[str, OrderFn] = {"sequential": sequential_order, "random": random_order,
                              "quasi_random": quasi_random_order}

__all__ = ["ORDERS", "partition", "quasi_random_order", "random_order", "sequential_order"]
