"""Batched training transforms: ``from dsc import transforms as T``.

    loader = dsc.Loader(ds, batch_size=256, transforms=[
        T.RandomResizedCrop(224, scale=(0.08, 1.0)), T.RandomHorizontalFlip(),
        T.ToFloat(), T.Normalize(mean, std), T.ChannelsLast()])

Consecutive geometric ops are composed into one per-sample affine map and applied in one batched
resampling pass (boxes follow through the same map); randomness comes from a generator seeded by
(seed, epoch, batch index), so a resumed loader replays the same augmentations. The same code runs on
CPU and CUDA.
"""
from __future__ import annotations

import numpy as np
import torch

from .geometric import (CenterCrop, Geometric, Letterbox, RandomHorizontalFlip, RandomResizedCrop,
                        RandomVerticalFlip, Resize)
from .photometric import ChannelsFirst, ChannelsLast, Normalize, ToDtype, ToFloat
from ..runtime.batches import Batch
from .resample import apply_geometric


def batch_generator(seed: int, epoch: int, batch_index: int) -> torch.Generator:
    """A CPU generator determined by (seed, epoch, batch index) alone."""
    state = np.random.SeedSequence([int(seed), int(epoch), int(batch_index)]).generate_state(1, np.uint64)[0]
    return torch.Generator().manual_seed(int(state >> np.uint64(1)))


class Compose:
    """Run ops in order; runs of geometric ops become one resampling pass, fused with a ToFloat that
    follows them. Call as ``compose(batch, seed=, epoch=, batch_index=)``."""

    def __init__(self, ops):
        self.ops = list(ops)
        self.stages = []
        i = 0
        while i < len(self.ops):
            if isinstance(self.ops[i], Geometric):
                j = i
                while j < len(self.ops) and isinstance(self.ops[j], Geometric):
                    j += 1
                fuse = j < len(self.ops) and isinstance(self.ops[j], ToFloat) \
                    and self.ops[j].scale and self.ops[j].dtype == torch.float32
                self.stages.append(("geometric", self.ops[i:j], fuse))
                i = j + int(fuse)
            else:
                self.stages.append(("op", self.ops[i], False))
                i += 1

    def __call__(self, batch: dict, seed: int = 0, epoch: int = 0, batch_index: int = 0, schema=None) -> dict:
        """``schema``: which keys are pixels, boxes and box rows (``ds.schema``); a batch from dsc carries
        its own, and a plain dict gets :meth:`Schema.default`."""
        gen = batch_generator(seed, epoch, batch_index)
        schema = schema if schema is not None else getattr(batch, "schema", None)
        batch = Batch(batch, schema=schema)
        for kind, op, fuse in self.stages:
            if kind == "geometric":
                batch = apply_geometric(op, batch, gen, to_float=fuse, schema=schema)
            else:
                batch = op(batch, gen)
        return batch

    def __repr__(self):
        return f"Compose({self.ops!r})"


__all__ = ["batch_generator", "CenterCrop", "ChannelsFirst", "ChannelsLast", "Compose", "Letterbox", "Normalize",
           "RandomHorizontalFlip", "RandomResizedCrop", "RandomVerticalFlip", "Resize", "ToDtype", "ToFloat"]
