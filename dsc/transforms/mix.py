"""Multi-sample ops of the classification recipe: torchvision.transforms.v2's MixUp and CutMix, and
RandomChoice (torchvision's ``references/classification/train.py`` picks one of the two per batch).

Semantics (torchvision's): the batch is combined with itself rolled by one, sample b with sample b - 1
(sample 0 with the last); one lambda ~ Beta(alpha, alpha) per batch (CutMix: one box per batch, lambda
then adjusted to the box's true area); labels become soft targets (B, C) float32: lambda * onehot(y_b) +
(1 - lambda) * onehot(y_{b-1}), with ``label_smoothing`` eps each one-hot first becomes (1 - eps) onehot +
eps / C (what ``CrossEntropyLoss(label_smoothing=eps)`` does to a hard target). C is ``num_classes``, or the
dataset's number of classes once a Loader runs the op (``bind``). Draws come from the batch's (seed,
epoch, rank, batch) generator, so batches are the same for any thread count and after a resume. They need
one image size (after a fixed-size op); a uint8 image is mixed in float and rounded back; boxes and masks
are refused, as torchvision refuses them. Both write into the batch's float image (no second batch-sized
tensor: MixUp from the last sample back, a few at a time; CutMix only its box).
"""
from __future__ import annotations

import math

import torch

from . import color as C
from .augment import BatchOp
from ..errors import ConfigError
from ..nogil import nogil


class _Mix(BatchOp):
    def __init__(self, alpha: float = 1.0, num_classes: int | None = None, label_smoothing: float = 0.0,
                 labels_key: str = "label"):
        if not isinstance(alpha, (int, float)) or not alpha > 0:
            raise ConfigError(f"{type(self).__name__}: alpha is a positive number, got {alpha!r}")
        if num_classes is not None and (not isinstance(num_classes, int) or num_classes < 1):
            raise ConfigError(f"{type(self).__name__}: num_classes is a positive int, got {num_classes!r}")
        if not isinstance(label_smoothing, (int, float)) or not 0 <= label_smoothing < 1:
            raise ConfigError(f"{type(self).__name__}: label_smoothing is in [0, 1), got {label_smoothing!r}")
        self.alpha, self.num_classes, self.label_smoothing = float(alpha), num_classes, float(label_smoothing)
        self.labels_key = labels_key

    def bind(self, dataset) -> None:
        if self.num_classes is None:
            classes = getattr(dataset, "classes", None)
            if classes:
                self.num_classes = len(classes)

    def _check(self, batch: dict) -> torch.Tensor:
        name = type(self).__name__
        img = batch["image"]
        if "image_offsets" in batch or "image_sizes" in batch or img.dim() != 4:
            raise ConfigError(f"{name} mixes images of one size: put it after a fixed-size op (RandomResizedCrop...)")
        moved = [k for k in ("boxes", "box_offsets") if k in batch]
        schema = getattr(batch, "schema", None)
        if schema is not None:
            moved += [k for k, r in schema.pixels().items() if k != "image" and k in batch]
        if moved:
            raise ConfigError(f"{name} is torchvision's classification op: it takes no boxes or masks (this batch "
                              f"has {', '.join(map(repr, moved))})")
        if self.labels_key not in batch:
            raise ConfigError(f"{name} mixes labels: the batch has no {self.labels_key!r}")
        return img

    def soft_labels(self, batch: dict) -> torch.Tensor:
        """(B, C) float32 targets from the class indices (or soft targets already there), smoothed."""
        y = batch[self.labels_key]
        if y.dim() == 2 and y.is_floating_point():
            return y.to(torch.float32)
        if self.num_classes is None:
            raise ConfigError(f"{type(self).__name__}: pass num_classes= (a Loader sets it from the dataset's classes)")
        if y.numel() and (int(y.min()) < 0 or int(y.max()) >= self.num_classes):
            raise ConfigError(f"{type(self).__name__}: labels must be in 0..{self.num_classes - 1}, got "
                              f"{int(y.min())}..{int(y.max())}")
        t = torch.nn.functional.one_hot(y.long(), self.num_classes).to(torch.float32)
        if self.label_smoothing:
            t = t * (1 - self.label_smoothing) + self.label_smoothing / self.num_classes
        return t

    def _mix_labels(self, batch: dict, lam: float) -> None:
        t = self.soft_labels(batch)
        batch[self.labels_key] = t.roll(1, 0).mul_(1.0 - lam).add_(t.mul(lam))


class MixUp(_Mix):
    """torchvision ``MixUp(alpha=1.0, num_classes=None)`` (+ ``label_smoothing``): x = lam x + (1 - lam)
    x.roll(1, 0), lam ~ Beta(alpha, alpha) once per batch; labels mixed the same way."""

    def __call__(self, batch, gen):
        img = self._check(batch)
        lam = float(C.beta(gen, self.alpha, self.alpha)[0])
        self._mix_labels(batch, lam)
        if img.is_floating_point():  # in place, as CutMix: no second batch-sized tensor (the same arithmetic)
            batch["image"] = _mix_rolled_(img, lam)
            return batch
        x = img.to(torch.float32)
        out = torch.mul(x, lam)  # lam x + (1 - lam) x.roll(1, 0), without making the rolled copy
        if len(x):
            out[1:].add_(x[:-1], alpha=1.0 - lam)
            out[0].add_(x[-1], alpha=1.0 - lam)
        batch["image"] = out.round_().clamp_(0, 255).to(img.dtype)
        return batch


@nogil(cpu_only=True, dtypes=(torch.float32, torch.float64))  # (half precision: the plain ops, see nogil)
def _mix_rolled_(x: torch.Tensor, lam: float, chunk: int = 4) -> torch.Tensor:
    """x[b] = lam x[b] + (1 - lam) x[b - 1] (x[0] with the last) in place: from the end, ``chunk`` samples at a
    time, each reading a copy of the chunk before it (still unmixed), so only a chunk is ever copied.
    Scripted: its torch calls never reach Python (each took the GIL)."""
    B = x.shape[0]
    if B == 0:
        return x
    last = x[-1].clone()
    for j in range(B, 1, -chunk):
        i = max(1, j - chunk)
        prev = x[i - 1:j - 1].clone()
        x[i:j].mul_(lam).add_(prev, alpha=1.0 - lam)
    x[0].mul_(lam).add_(last, alpha=1.0 - lam)
    return x


class CutMix(_Mix):
    """torchvision ``CutMix(alpha=1.0, num_classes=None)`` (+ ``label_smoothing``): lam ~ Beta(alpha, alpha);
    a box centred at (r_x, r_y) ~ uniform pixels, half-sides int(0.5 sqrt(1 - lam) W) and ... H, clipped to
    the image, takes the rolled batch's pixels; labels mixed at lam' = 1 - box area / image area. Once
    per batch."""

    def __call__(self, batch, gen):
        img = self._check(batch)
        chw = img.is_floating_point()
        H, W = (img.shape[2], img.shape[3]) if chw else (img.shape[1], img.shape[2])
        lam = float(C.beta(gen, self.alpha, self.alpha)[0])
        r_x = int(torch.randint(W, (1,), generator=gen))
        r_y = int(torch.randint(H, (1,), generator=gen))
        r = 0.5 * math.sqrt(1.0 - lam)
        rw, rh = int(r * W), int(r * H)
        x1, y1 = max(r_x - rw, 0), max(r_y - rh, 0)
        x2, y2 = min(r_x + rw, W), min(r_y + rh, H)
        lam_adj = float(1.0 - (x2 - x1) * (y2 - y1) / (W * H))
        self._mix_labels(batch, lam_adj)
        if len(img) and y2 > y1 and x2 > x1:
            _roll_box_(img, y1, y2, x1, x2, 1 if chw else 0)
        batch["image"] = img
        return batch


@nogil
def _roll_box_(img: torch.Tensor, y1: int, y2: int, x1: int, x2: int, hdim: int) -> None:
    """Sample b takes sample b - 1's box [y1, y2) x [x1, x2) (the batch rolled by one; rows at sample axis
    ``hdim``), in place from the end (b - 1 still unmixed when b reads it): one copy of the last box, no
    batch-sized ones. Scripted: its torch calls never reach Python (each took the GIL)."""
    B = img.shape[0]
    last = img[B - 1].narrow(hdim, y1, y2 - y1).narrow(hdim + 1, x1, x2 - x1).clone()
    for b in range(B - 1, 0, -1):
        img[b].narrow(hdim, y1, y2 - y1).narrow(hdim + 1, x1, x2 - x1).copy_(
            img[b - 1].narrow(hdim, y1, y2 - y1).narrow(hdim + 1, x1, x2 - x1))
    img[0].narrow(hdim, y1, y2 - y1).narrow(hdim + 1, x1, x2 - x1).copy_(last)


class RandomChoice(BatchOp):
    """torchvision ``RandomChoice(transforms, p=None)``: one of ``ops`` per batch (probabilities ``p``, equal by
    default), e.g. ``RandomChoice([MixUp(0.2), CutMix(1.0)])`` as torchvision's train.py does."""

    def __init__(self, ops, p=None):
        self.ops = list(ops)
        if not self.ops or not all(callable(o) for o in self.ops):
            raise ConfigError(f"RandomChoice takes a non-empty list of ops, got {ops!r}")
        p = [1.0] * len(self.ops) if p is None else [float(v) for v in p]
        if len(p) != len(self.ops) or min(p) < 0 or sum(p) <= 0:
            raise ConfigError(f"RandomChoice: p gives one non-negative weight per op, got {p!r}")
        self.p = [v / sum(p) for v in p]

    def bind(self, dataset) -> None:
        for o in self.ops:
            if hasattr(o, "bind"):
                o.bind(dataset)

    def __call__(self, batch, gen):
        k = int(torch.multinomial(torch.tensor(self.p, dtype=torch.float64), 1, generator=gen))
        return self.ops[k](batch, gen)
