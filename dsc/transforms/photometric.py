"""Dtype and layout ops. Convention: a uint8 image is (B, H, W, C) as stored; a float image is
(B, C, H, W) as models expect (``ToFloat`` switches, without copying the channel order physically:
the result is channels-last in memory, which ``ChannelsLast`` then keeps for free)."""
from __future__ import annotations

import torch

from ..errors import DscError


class ToFloat:
    """uint8 (B, H, W, C) -> float (B, C, H, W) in [0, 1] (``scale=False``: 0-255)."""

    def __init__(self, dtype: torch.dtype = torch.float32, scale: bool = True):
        self.dtype, self.scale = dtype, scale

    def __call__(self, batch: dict, gen=None) -> dict:
        img = batch["image"]
        if img.dtype == torch.uint8:
            img = img.permute(0, 3, 1, 2).to(self.dtype)
            if self.scale:
                img = img.div_(255.0)
        else:
            img = img.to(self.dtype)
        batch["image"] = img
        return batch


class Normalize:
    """(x - mean) / std per channel, on a float image (put ToFloat first; mean/std in its units)."""

    def __init__(self, mean, std):
        self.mean, self.std = tuple(float(m) for m in mean), tuple(float(s) for s in std)

    def __call__(self, batch: dict, gen=None) -> dict:
        img = batch["image"]
        if not img.is_floating_point():
            raise DscError("Normalize needs a float image: put T.ToFloat() before it")
        shape = (1, -1, 1, 1)
        scale = torch.tensor([1 / s for s in self.std], dtype=img.dtype, device=img.device).view(shape)
        shift = torch.tensor([-m / s for m, s in zip(self.mean, self.std)], dtype=img.dtype,
                             device=img.device).view(shape)
        batch["image"] = torch.addcmul(shift, img, scale)  # one pass: x / std - mean / std
        return batch


class ToDtype:
    """Cast a float image, e.g. ``ToDtype(torch.float16)`` or ``torch.bfloat16``."""

    def __init__(self, dtype: torch.dtype):
        self.dtype = dtype

    def __call__(self, batch: dict, gen=None) -> dict:
        batch["image"] = batch["image"].to(self.dtype)
        return batch


class ChannelsLast:
    """A float (B, C, H, W) image in ``torch.channels_last`` memory format (free after ToFloat)."""

    def __call__(self, batch: dict, gen=None) -> dict:
        batch["image"] = batch["image"].contiguous(memory_format=torch.channels_last)
        return batch


class ChannelsFirst:
    """A float (B, C, H, W) image in the default contiguous (NCHW) memory format."""

    def __call__(self, batch: dict, gen=None) -> dict:
        batch["image"] = batch["image"].contiguous()
        return batch
