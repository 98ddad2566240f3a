"""Batched training transforms: ``from dsc import transforms as T``.

    loader = dsc.Loader(ds, batch_size=256, transforms=[
        T.RandomResizedCrop(224, scale=(0.08, 1.0)), T.RandomHorizontalFlip(),
        T.ToFloat(), T.Normalize(mean, std), T.ChannelsLast()])

Consecutive geometric ops draw their parameters once per batch and run per sample as integer programs
(crop, antialiased resize, flip: torchvision's semantics) straight from the stored sample into the output;
in a ``dsc.Loader`` they run inside the gather, in the filler threads, so only the crop is read and the
batch leaves the host at its training size. Boxes and masks follow. Randomness comes from a generator
seeded by (seed, epoch, rank, batch index): distributed ranks draw independent augmentations, and a resumed
loader replays the same ones.
"""
from __future__ import annotations

import numpy as np
import torch

from .geometric import (CenterCrop, Geometric, Letterbox, RandomHorizontalFlip, RandomResizedCrop,
                        RandomVerticalFlip, Resize)
from .photometric import (PIXEL_OPS, ChannelsFirst, ChannelsLast, Normalize, PixelPost, ToDtype, ToFloat,
                          fuse_photometric)
from .augment import (AugMix, AutoAugment, BatchOp, ColorJitter, GaussianBlur, PixelOp, RandAugment,
                      RandomErasing, RandomGrayscale, RandomHSV, RandomPhotometricDistort, TrivialAugmentWide,
                      _window_ok, apply_pixel_ops)
from .detection import (FixedSizeCrop, Mosaic, RandomAffine, RandomCrop, RandomIoUCrop, RandomShortestSize, RandomZoomOut,
                        ScaleJitter, YoloMixUp)
from .mix import CutMix, MixUp, RandomChoice
from ..errors import ConfigError
from ..formats.fields.base import Batch
from .resample import _check_batch, apply_geometric, apply_plan
from .fused import fixes_size, keeps_sizes, plan_chain
from . import presets


def _batch_op(op):
    """A custom op: ``op(batch, gen)``, or ``op(batch)`` when it takes one argument."""
    import inspect

    if not callable(op):
        raise ConfigError(f"a transform must be callable, got {op!r}")
    try:
        params = [p for p in inspect.signature(op).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty]
        one = len(params) == 1 and not any(p.kind == p.VAR_POSITIONAL for p in inspect.signature(op).parameters.values())
    except (TypeError, ValueError):
        one = False
    call = (lambda batch, gen: op(batch)) if one else op
    name = getattr(op, "__qualname__", None) or type(op).__name__

    def run(batch, gen):
        try:
            out = call(batch, gen)
        except AttributeError as e:
            if getattr(e, "obj", None) is not batch:
                raise
            # (a per-image habit: `lambda b: b.float()` on the batch dict)
            raise ConfigError(f"the transform {name} failed on the batch: {e}. A custom transform takes the batch "
                              f"dict and returns it, e.g. lambda b: {{**b, 'image': b['image'].float()}}") from None
        if not isinstance(out, dict):
            raise ConfigError(f"the transform {name} returned a {type(out).__name__}; a custom transform returns the "
                              f"batch dict it was given (with its keys changed as it likes)")
        return out
    return run


def batch_generator(seed: int, epoch: int, batch_index: int, rank: int = 0) -> torch.Generator:
    """A CPU generator determined by (seed, epoch, rank, batch index) alone: each distributed rank has its own
    stream (rank 0's is the one a single process draws)."""
    key = [int(seed), int(epoch), int(batch_index)] + ([int(rank)] if rank else [])
    state = np.random.SeedSequence(key).generate_state(1, np.uint64)[0]
    return torch.Generator().manual_seed(int(state >> np.uint64(1)))


def read_window(program: list, H: int, W: int) -> tuple[int, int, int, int]:
    """(t0, t1, l0, l1): the rows t0:t1 and columns l0:l1 of an (H, W) source that a per-sample program
    (``fused.run_program``'s crops and flips) reads; empty (t1 <= t0) when it reads none. A resize reads
    all of its input, so the window is where the steps before it cropped (any later step reads less)."""
    ay, sy, ax, sx, h, w = 0, 1, 0, 1, H, W  # the current image's pixel (y, x) is the source's (ay + sy y, ax + sx x)
    for step in program:
        if step[0] == "flip":
            if step[2]:
                if step[1] == 0:
                    ax, sx = ax + sx * (w - 1), -sx
                else:
                    ay, sy = ay + sy * (h - 1), -sy
        elif step[0] == "crop":
            top, left, h, w = (int(v) for v in step[1:5])
            ay, ax = ay + sy * top, ax + sx * left
        else:
            break
    y0, y1 = sorted((ay, ay + sy * (h - 1)))
    x0, x1 = sorted((ax, ax + sx * (w - 1)))
    t0, t1, l0, l1 = max(y0, 0), min(y1 + 1, H), max(x0, 0), min(x1 + 1, W)
    return (0, 0, 0, 0) if h <= 0 or w <= 0 or t1 <= t0 or l1 <= l0 else (t0, t1, l0, l1)


def photometric_whole() -> bool:
    """``DSC_PHOTOMETRIC_WHOLE=1``: photometric ops process every pixel even where a later crop drops it
    (the look-ahead off: the same bytes, more work)."""
    import os

    return os.environ.get("DSC_PHOTOMETRIC_WHOLE", "0") not in ("", "0")


class _LookAhead:
    """A photometric stage's look-ahead at the geometric stage after it: ``__call__`` (apply_pixel_ops, after
    its own draws) draws that stage's plan from the same generator, in the same order as the stage would, and
    gives each sample's source window; the stage then runs that plan (``plan``)."""

    def __init__(self, ops, gen, boxes, schema):
        self.ops, self.gen, self.boxes, self.schema, self.plan = ops, gen, boxes, schema, None

    def __call__(self, sizes):
        self.plan = plan_chain(self.ops, sizes, self.gen, boxes=self.boxes)  # (the (B, 2) sizes apply_pixel_ops took)
        if self.plan.programs is None:  # (the batched resampling: all of each image)
            return None
        return [read_window(prog, h, w) for prog, (h, w) in zip(self.plan.programs, self.plan.sizes.tolist())]


def _look_ahead(photo: list, geometric: list, batch, schema, gen) -> _LookAhead | None:
    """The look-ahead when it can help: photometric ops that work on windows, on a CPU uint8 batch of several
    sizes (processed sample by sample), the batch valid for the geometric stage (else None: it says why)."""
    img = batch.get("image")
    if photometric_whole() or not _window_ok(photo) or schema is None or \
            not isinstance(img, torch.Tensor) or img.dtype != torch.uint8 or img.device.type != "cpu" or \
            not ("image_offsets" in batch or "image_sizes" in batch) or "image" not in schema.pixels():
        return None
    _check_batch(batch)
    boxes = (batch["boxes"], batch["box_offsets"]) if "boxes" in batch and "box_offsets" in batch else None
    return _LookAhead(geometric, gen, boxes, schema)


class Compose:
    """Run ops in order. A run of geometric ops is one stage (one draw of parameters, one resampling per
    sample); a run of photometric ops starting with ToFloat is one pass (:class:`PixelPost`). Call as
    ``compose(batch, seed=, epoch=, batch_index=)``; the Loader runs the leading stages inside its gather
    (``gather_plan``), with the same generator, so the batches are the same either way."""

    def __init__(self, ops):
        self.ops = list(ops)
        self.stages: list[tuple[str, object]] = []
        i = 0
        while i < len(self.ops):
            cls = next((c for c in (Geometric, PixelOp) if isinstance(self.ops[i], c)), None)
            if cls is not None:  # a run of geometric ops; of photometric ops (one float conversion)
                j = i
                while j < len(self.ops) and isinstance(self.ops[j], cls):
                    j += 1
                self.stages.append(("geometric" if cls is Geometric else "photo", self.ops[i:j]))
                i = j
                continue
            post, n = fuse_photometric(self.ops[i:])
            if post is not None:
                self.stages.append(("pixels", post))
                i += n
            else:
                self.stages.append(("op", _batch_op(self.ops[i])))  # (Mosaic voids the geometry record itself)
                i += 1

    def gather_plan(self, photometric: bool = True, keep_sizes: bool = False):
        """What a gather can run per sample: (the leading geometric ops when every one has steps and the chain
        ends at one size, or, with ``keep_sizes`` (the gather packs mixed sizes in place: a Dataset's), keeps
        each sample's own size (flips), else None; the photometric pass after a one-size chain when
        ``photometric``, else None; the index of the first stage left for the batch)."""
        k, geometry, post = 0, None, None
        one_size = False
        if self.stages and self.stages[0][0] == "geometric" and all(op.fusable for op in self.stages[0][1]):
            one_size = fixes_size(self.stages[0][1])
            if one_size or (keep_sizes and keeps_sizes(self.stages[0][1])):
                geometry, k = self.stages[0][1], 1
        if photometric and k < len(self.stages) and self.stages[k][0] == "pixels" and (one_size or k == 0):
            post, k = self.stages[k][1], k + 1
        return geometry, post, k

    def __call__(self, batch: dict, seed: int = 0, epoch: int = 0, batch_index: int = 0, schema=None,
                 gen: torch.Generator | None = None, start: int = 0, rank: int = 0, alloc=None,
                 owned: bool = False, divisor: torch.Tensor | None = None) -> dict:
        """The random draws come from (seed, epoch, rank, batch_index) alone: the same four give the same
        crops and flips (that is what makes a resumed Loader replay its batches), so a loop of your own passes
        its epoch and batch number (and, distributed, its rank: ranks then draw different augmentations).
        ``schema``: which keys are pixels, boxes and box rows (``ds.schema``); a batch from dsc carries its
        own, and a plain dict gets :meth:`Schema.default`. ``gen`` / ``start``: continue a batch whose first
        stages ran in the gather (``start > 0`` says only where to continue: it does not make the batch the
        pipeline's own, nor does ``alloc``); ``alloc``: the Loader's ring-slot allocator (memory for a float
        image); ``owned``: the caller hands the batch over as the pipeline's own (the Loader passes
        ``owned=True`` for its ring slot), so its pixels may be written into. Without ``owned=True`` the
        caller's pixels are never written into, whatever ``start`` and ``alloc`` are (a later stage's own
        output may be). ``divisor`` (a 0-dim tensor): the caller converts the images to float divided by it next
        (format="torchvision"): a last geometric stage that leaves packed ragged uint8 images on the CPU, each
        sample's program crops and flips only (:func:`~dsc.transforms.fused.casts_directly`), hands them over
        as float32 already (:func:`~dsc.transforms.resample.apply_geometric`'s ``divisor``); a resize's stay
        uint8."""
        if not isinstance(batch, dict):
            raise ConfigError(f"transforms take a batch dict (ds.get_batch(...) or a Loader's), not a sample or a "
                              f"list of samples; got a {type(batch).__name__}")
        gen = gen if gen is not None else batch_generator(seed, epoch, batch_index, rank)
        schema = schema if schema is not None else getattr(batch, "schema", None)
        given = None if owned else batch.get("image")  # (the pixels that must not be written into)
        batch = Batch(batch, schema=schema)
        stages = self.stages[start:]
        skip = False
        ahead = None  # a photometric stage's look-ahead: the plan of the geometric stage after it, drawn
        for k, (kind, op) in enumerate(stages):
            if skip:
                skip = False
                continue
            if kind == "geometric":
                args = dict(alloc=alloc if owned else None, name=f"geometric{start + k}",  # (a buffer per stage:
                            divisor=divisor if k == len(stages) - 1 else None)  # the next reads it)
                if ahead is not None and ahead.plan is not None:
                    batch = apply_plan(ahead.plan, batch, ahead.schema, **args)
                else:
                    batch = apply_geometric(op, batch, gen, schema=schema, **args)
                ahead = None
            elif kind == "pixels":
                batch = op(batch)
            elif kind == "photo":  # followed by ToFloat/Normalize: handed over in float, one pass fewer each way
                post = stages[k + 1][1] if k + 1 < len(stages) and stages[k + 1][0] == "pixels" else None
                fixed = batch["image"].dtype == torch.uint8 and "image_offsets" not in batch \
                    and "image_sizes" not in batch
                if k + 1 < len(stages) and stages[k + 1][0] == "geometric":
                    ahead = _look_ahead(op, stages[k + 1][1], batch, schema if schema is not None else
                                        getattr(batch, "schema", None), gen)
                batch = apply_pixel_ops(op, batch, gen, post=post if fixed else None,
                                        inplace=batch["image"] is not given, alloc=alloc, lookahead=ahead)
                skip = post is not None and fixed
            else:
                batch = op(batch, gen)
        return batch

    def bind(self, dataset) -> "Compose":
        """Tell every op the dataset it runs on (MixUp/CutMix: the number of classes); the Loader does."""
        for op in self.ops:
            if hasattr(op, "bind"):
                op.bind(dataset)
        return self

    def __repr__(self):  # stable across processes: a custom op is named, not shown with its address
        def name(op):
            if isinstance(op, (Geometric, BatchOp, *PIXEL_OPS)):
                return repr(op)
            return getattr(op, "__qualname__", type(op).__qualname__)
        return f"Compose([{', '.join(name(op) for op in self.ops)}])"


__all__ = ["batch_generator", "read_window", "CenterCrop", "ChannelsFirst", "ChannelsLast", "Compose", "Geometric", "Letterbox",
           "Normalize", "PixelPost",
           "RandomHorizontalFlip", "RandomResizedCrop", "RandomVerticalFlip", "Resize", "ToDtype", "ToFloat",
           "BatchOp", "PixelOp", "ColorJitter", "RandomGrayscale", "GaussianBlur", "RandomPhotometricDistort",
           "RandomHSV", "RandomErasing", "AutoAugment", "RandAugment", "TrivialAugmentWide", "AugMix",
           "MixUp", "CutMix", "RandomChoice", "Mosaic", "ScaleJitter", "FixedSizeCrop", "RandomShortestSize",
           "RandomZoomOut", "RandomIoUCrop", "RandomAffine", "RandomCrop", "YoloMixUp", "presets"]
