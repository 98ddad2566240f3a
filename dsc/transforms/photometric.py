"""Dtype and layout ops. Convention: a uint8 image is (B, H, W, C) as stored; a float image is
(B, C, H, W) as models expect, contiguous (NCHW in memory) unless ``ChannelsLast`` asks for channels-last
memory (then made directly in that layout, at no extra cost).

A run of these ops right after the geometric ones is fused into one pass (:class:`PixelPost`): on the CPU
it runs per sample in the Loader's filler threads, right after the sample's resize, while its bytes are
still in cache (per batch it would be a memory-bound pass over the whole batch); on a GPU it runs once per
batch after the copy, so the host sends uint8.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import ConfigError
from ..nogil import nogil


def _float_image(batch: dict, op: str) -> None:
    if not batch["image"].is_floating_point():
        raise ConfigError(f"{op} arranges a float (B, C, H, W) image: put it after T.ToFloat()")


class ToFloat:
    """uint8 (B, H, W, C) -> float (B, C, H, W) in [0, 1] (``scale=False``: 0-255), contiguous."""

    def __init__(self, dtype: torch.dtype = torch.float32, scale: bool = True):
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise ConfigError(f"ToFloat makes a float dtype, got {dtype!r}")
        self.dtype, self.scale = dtype, scale

    def __call__(self, batch: dict, gen=None) -> dict:
        if batch["image"].dtype != torch.uint8:  # already float: a cast
            batch["image"] = batch["image"].to(self.dtype)
            return batch
        return fuse_photometric([self])[0](batch)

    def __repr__(self):
        return f"ToFloat(dtype={self.dtype}, scale={self.scale})"


class Normalize:
    """(x - mean) / std per channel, on a float image (put ToFloat first; mean/std in its units)."""

    def __init__(self, mean, std):
        try:
            self.mean, self.std = tuple(float(m) for m in mean), tuple(float(s) for s in std)
        except (TypeError, ValueError):
            raise ConfigError(f"Normalize takes per-channel numbers, got mean={mean!r}, std={std!r}") from None
        if len(self.mean) != len(self.std) or not self.mean or any(s == 0 for s in self.std):
            raise ConfigError(f"Normalize: mean and std need the same number of channels and no zero std, got "
                              f"mean={mean!r}, std={std!r}")
        self._consts: dict = {}

    def constants(self, device, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(scale, shift) as (1, C, 1, 1) tensors, made once per device and dtype (a per-batch tensor
        built from Python numbers would be a blocking host-to-device copy on CUDA)."""
        key = (str(device), dtype)
        if key not in self._consts:
            scale = torch.tensor([1 / s for s in self.std], dtype=dtype).view(1, -1, 1, 1)
            shift = torch.tensor([-m / s for m, s in zip(self.mean, self.std)], dtype=dtype).view(1, -1, 1, 1)
            self._consts[key] = (scale.to(device), shift.to(device))
        return self._consts[key]

    def __call__(self, batch: dict, gen=None) -> dict:
        img = batch["image"]
        if not img.is_floating_point():
            raise ConfigError("Normalize needs a float image: put T.ToFloat() before it")
        if len(self.mean) not in (1, img.shape[1]):
            raise ConfigError(f"Normalize has {len(self.mean)} channels, the image {img.shape[1]}")
        scale, shift = self.constants(img.device, img.dtype)
        batch["image"] = torch.addcmul(shift, img, scale)  # one pass: x / std - mean / std
        return batch

    def __repr__(self):
        return f"Normalize(mean={self.mean}, std={self.std})"


class ToDtype:
    """Cast a float image, e.g. ``ToDtype(torch.float16)`` or ``torch.bfloat16``."""

    def __init__(self, dtype: torch.dtype):
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise ConfigError(f"ToDtype casts a float image to another float dtype (torch.float16, torch.bfloat16...), "
                              f"got {dtype!r}")
        self.dtype = dtype

    def __call__(self, batch: dict, gen=None) -> dict:
        batch["image"] = batch["image"].to(self.dtype)
        return batch

    def __repr__(self):
        return f"ToDtype({self.dtype})"


class ChannelsLast:
    """A float (B, C, H, W) image in ``torch.channels_last`` memory format (free after ToFloat)."""

    def __call__(self, batch: dict, gen=None) -> dict:
        _float_image(batch, "ChannelsLast")
        batch["image"] = batch["image"].contiguous(memory_format=torch.channels_last)
        return batch

    def __repr__(self):
        return "ChannelsLast()"


class ChannelsFirst:
    """A float (B, C, H, W) image in the default contiguous (NCHW) memory format."""

    def __call__(self, batch: dict, gen=None) -> dict:
        _float_image(batch, "ChannelsFirst")
        batch["image"] = batch["image"].contiguous()
        return batch

    def __repr__(self):
        return "ChannelsFirst()"


@dataclass
class PixelPost:
    """ToFloat [+ Normalize] [+ ToDtype] [+ ChannelsLast | ChannelsFirst], as one pass uint8 -> float:
    ``x * scale[c] + shift[c]`` in float32, stored as ``dtype`` (B, C, H, W): contiguous, or channels-last in
    memory when ChannelsLast came last."""

    dtype: torch.dtype
    scale: tuple[float, ...]
    shift: tuple[float, ...]
    channels_last: bool = False

    def _consts(self, device, channels: int):
        key = (str(device), channels)
        cache = self.__dict__.setdefault("_cache", {})
        if key not in cache:
            if len(self.scale) not in (1, channels):
                raise ConfigError(f"Normalize has {len(self.scale)} channels, the image {channels}")
            def per_channel(v):
                return torch.tensor(v if len(v) == channels else v * channels, dtype=torch.float32)

            cache[key] = (per_channel(self.scale).to(device), per_channel(self.shift).to(device))
        return cache[key]

    def empty(self, B: int, h: int, w: int, c: int, alloc=None) -> torch.Tensor:
        """The (B, C, H, W) output, allocated in its memory format (``alloc(name, shape, dtype)`` gives
        the memory: (B, H, W, C) channels-last, or (B, C, H, W))."""
        if self.channels_last:
            buf = alloc("image", (B, h, w, c), self.dtype) if alloc else torch.empty((B, h, w, c), dtype=self.dtype)
            return buf.permute(0, 3, 1, 2)
        return alloc("image", (B, c, h, w), self.dtype) if alloc else torch.empty((B, c, h, w), dtype=self.dtype)

    def apply_sample(self, hwc: torch.Tensor, chw_out: torch.Tensor) -> None:
        """One uint8 (H, W, C) sample into its (C, H, W) slot of the output."""
        self.apply_samples(hwc.unsqueeze(0), chw_out.unsqueeze(0))

    def apply_samples(self, bhwc: torch.Tensor, out: torch.Tensor) -> None:
        """A CPU uint8 (B, H, W, C) batch into :meth:`empty`'s output, sample by sample (each stays in cache
        through its conversion), the loop :func:`_post_rows` without the GIL: :meth:`apply_sample`'s numbers."""
        scale, shift = self._consts(bhwc.device, bhwc.shape[3])
        _post_rows(bhwc, out, scale, shift, self.channels_last, self.dtype == torch.float32)

    def apply_batch(self, bhwc: torch.Tensor) -> torch.Tensor:
        """A uint8 (B, H, W, C) batch (on any device) -> the float (B, C, H, W) output."""
        scale, shift = self._consts(bhwc.device, bhwc.shape[3])
        out = torch.addcmul(shift.view(1, -1, 1, 1), bhwc.permute(0, 3, 1, 2), scale.view(1, -1, 1, 1))
        fmt = torch.channels_last if self.channels_last else torch.contiguous_format  # out: as its input, HWC
        return out.to(self.dtype, memory_format=fmt)

    def apply_float(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """A float (B, C, H, W) batch holding uint8 values (a photometric stage's output, not yet cast back)
        -> the output (into ``out``, a slice of :meth:`empty`'s, when given): the same arithmetic as
        :meth:`apply_batch`, without the uint8 round trip."""
        scale, shift = self._consts(x.device, x.shape[1])
        fmt = torch.channels_last if self.channels_last else torch.contiguous_format
        if out is None:
            out = torch.empty(x.shape, dtype=self.dtype, device=x.device, memory_format=fmt)
        if self.dtype == torch.float32:  # straight into the output's layout: one pass
            return torch.addcmul(shift.view(1, -1, 1, 1), x, scale.view(1, -1, 1, 1), out=out)
        out.copy_(torch.addcmul(shift.view(1, -1, 1, 1), x, scale.view(1, -1, 1, 1)))
        return out

    def __call__(self, batch: dict, gen=None) -> dict:
        img = batch["image"]
        if img.dtype != torch.uint8:
            raise ConfigError("ToFloat takes the uint8 (B, H, W, C) image a dsc batch holds")
        if img.dim() != 4 or "image_offsets" in batch or "image_sizes" in batch:
            raise ConfigError("ToFloat/Normalize make one (B, C, H, W) float tensor: ragged images need a fixed-size "
                              "geometric op (RandomResizedCrop, Resize((h, w)), CenterCrop, Letterbox) before them, or "
                              "leave them out (format='torchvision' hands out float images of each sample's own size)")
        batch["image"] = self.apply_batch(img)
        return batch


@nogil
def _post_rows(x: torch.Tensor, out: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor, channels_last: bool,
               float32: bool) -> None:
    """:meth:`PixelPost.apply_sample` on every sample of uint8 (B, H, W, C) ``x`` into (B, C, H, W) ``out``:
    ``shift[c] + x * scale[c]`` in float32 (one addcmul a sample, straight into the slot's layout), stored
    as ``out``'s dtype. Scripted: its 2-6 torch calls a sample never reach Python (each took the GIL)."""
    for b in range(x.shape[0]):
        post_row(x[b], out[b], scale, shift, channels_last, float32)


def post_row(x: torch.Tensor, out: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor, channels_last: bool,
             float32: bool) -> None:
    """One sample of :func:`_post_rows`: uint8 (H, W, C) ``x`` into its (C, H, W) slot ``out`` (plain: the
    scripted loops call it)."""
    if channels_last:  # (the slot's memory is HWC: one contiguous pass, constants on the last axis)
        o, src, sc, sh = out.permute(1, 2, 0), x, scale, shift
    else:
        o, src, sc, sh = out, x.permute(2, 0, 1), scale.view(-1, 1, 1), shift.view(-1, 1, 1)
    if float32:
        torch.addcmul(sh, src, sc, out=o)
    else:
        o.copy_(torch.addcmul(sh, src, sc))


PIXEL_OPS = (ToFloat, Normalize, ToDtype, ChannelsLast, ChannelsFirst)


def fuse_photometric(ops: list) -> tuple[PixelPost | None, int]:
    """The longest run of ``ops`` (from the start) that one :class:`PixelPost` computes, and its length:
    it must begin with ToFloat; then Normalize, ToDtype and the memory-format ops in any order."""
    if not ops or not isinstance(ops[0], ToFloat):
        return None, 0
    first = ops[0]
    scale, shift = [1 / 255.0 if first.scale else 1.0], [0.0]
    dtype, channels_last, n = first.dtype, False, 1
    for op in ops[1:]:
        if isinstance(op, Normalize):  # (x * scale + shift - mean) / std
            c = max(len(scale), len(op.std), len(op.mean))
            bc = lambda v: list(v) * c if len(v) == 1 else list(v)  # noqa: E731
            scale = [a / d for a, d in zip(bc(scale), bc(op.std))]
            shift = [(t - m) / d for t, m, d in zip(bc(shift), bc(op.mean), bc(op.std))]
        elif isinstance(op, ToDtype):
            dtype = op.dtype
        elif isinstance(op, ChannelsLast):
            channels_last = True
        elif isinstance(op, ChannelsFirst):
            channels_last = False
        else:
            break
        n += 1
    return PixelPost(dtype, tuple(scale), tuple(shift), channels_last), n
