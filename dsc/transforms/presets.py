"""The reference training recipes by name, as lists of dsc transforms (pass one as ``transforms=``).

* ``classification(auto_augment=None, random_erase=0.0, mixup=0.0, cutmix=0.0, ...)``: torchvision's
  ``references/classification/presets.py`` ClassificationPresetTrain (RandomResizedCrop(crop_size),
  RandomHorizontalFlip(0.5), then ``auto_augment`` in {"ra": RandAugment(magnitude=ra_magnitude),
  "ta_wide": TrivialAugmentWide(), "augmix": AugMix(severity=augmix_severity), "imagenet": AutoAugment()}
  with bilinear interpolation, ToFloat, Normalize(ImageNet mean/std), RandomErasing(p=random_erase) on
  the normalised image) and train.py's collate (RandomChoice of MixUp(alpha=mixup) and CutMix(alpha=cutmix),
  those > 0; ``label_smoothing`` folded into the soft targets). The recipe behind torchvision's current
  ResNet-50 weights: ``classification("ta_wide", crop_size=176, random_erase=0.1, mixup=0.2, cutmix=1.0,
  label_smoothing=0.1)``.
* ``detection(name)``: ``references/detection/presets.py`` DetectionPresetTrain: "hflip" (flip 0.5);
  "lsj" (ScaleJitter((1024, 1024)), FixedSizeCrop((1024, 1024), fill=mean), flip); "multiscale"
  (RandomShortestSize((480, ..., 800), 1333), flip); "ssd" (RandomPhotometricDistort, RandomZoomOut(fill=mean),
  RandomIoUCrop, flip); "ssdlite" (RandomIoUCrop, flip); mean = (123, 117, 104), the reference's fill
  (masks: their ignore index; per-object masks 0 outside, as the reference's Mask fill). Images stay uint8
  (the torchvision form makes them float, as the reference's ToDtype(float, scale=True)) and, except "lsj",
  of several sizes: detection models resize.
* ``segmentation(base_size=520, crop_size=480)``: SegmentationPresetTrain: random shorter side in
  [0.5, 2) x base_size, flip, RandomCrop(crop_size, padded with 0, masks with their ignore index), ToFloat,
  Normalize.
* ``yolo(size=640, mosaic=1.0, mixup=0.0)``: Ultralytics' default train-time augmentation (Mosaic of 4 with
  probability ``mosaic``, the others letterboxed; random_perspective as RandomAffine(translate 0.1, scale
  0.5, bilinear as cv2.warpAffine, fill 114, output size); MixUp with probability ``mixup`` (YoloMixUp:
  Beta(32, 32), objects of both images); HSV jitter h 0.015 / s 0.7 / v 0.4; flip 0.5). Without MixUp the
  flip comes before the HSV jitter (per pixel: the same distribution; the flipped images equal the other
  order's up to bilinear rounding), so RandomAffine and
  the flip are one geometric stage: one resample through the composed map.
"""
from __future__ import annotations

from ..errors import ConfigError

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
MEAN_255 = (123.0, 117.0, 104.0)


def classification(auto_augment: str | None = None, crop_size: int = 224, random_erase: float = 0.0,
                   mixup: float = 0.0, cutmix: float = 0.0, num_classes: int | None = None, hflip: float = 0.5,
                   ra_magnitude: int = 9, augmix_severity: int = 3, label_smoothing: float = 0.0,
                   mean=MEAN, std=STD) -> list:
    from . import (AugMix, AutoAugment, CutMix, MixUp, Normalize, RandAugment, RandomChoice,  # lazy: this package
                   RandomErasing, RandomHorizontalFlip, RandomResizedCrop, ToFloat, TrivialAugmentWide)

    for name, v in (("random_erase", random_erase), ("mixup", mixup), ("cutmix", cutmix), ("hflip", hflip),
                    ("label_smoothing", label_smoothing)):
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not v >= 0:
            raise ConfigError(f"classification preset: {name} is a number >= 0 (0: off), got {v!r}")
    if label_smoothing > 0 and not (mixup > 0 or cutmix > 0):
        raise ConfigError(f"classification preset: label_smoothing={label_smoothing} smooths MixUp/CutMix's soft "
                          f"labels, and neither is on; without them (as torchvision's reference) put it in the "
                          f"loss: torch.nn.CrossEntropyLoss(label_smoothing={label_smoothing})")
    ops: list = [RandomResizedCrop(crop_size)]
    if hflip > 0:
        ops.append(RandomHorizontalFlip(hflip))
    aa = {None: None, "ra": lambda: RandAugment(magnitude=ra_magnitude, interpolation="bilinear"),
          "ta_wide": lambda: TrivialAugmentWide(interpolation="bilinear"),
          "augmix": lambda: AugMix(severity=augmix_severity, interpolation="bilinear"),
          "imagenet": lambda: AutoAugment("imagenet", interpolation="bilinear")}
    if auto_augment not in aa:
        raise ConfigError(f"classification preset: auto_augment is one of ra, ta_wide, augmix, imagenet or None, "
                          f"got {auto_augment!r}")
    if aa[auto_augment]:
        ops.append(aa[auto_augment]())
    ops += [ToFloat(), Normalize(mean, std)]
    if random_erase > 0:
        ops.append(RandomErasing(p=random_erase))
    mix = ([MixUp(mixup, num_classes, label_smoothing)] if mixup > 0 else []) + \
          ([CutMix(cutmix, num_classes, label_smoothing)] if cutmix > 0 else [])
    if mix:
        ops.append(mix[0] if len(mix) == 1 else RandomChoice(mix))
    return ops


DETECTION = ("hflip", "lsj", "multiscale", "ssd", "ssdlite")


def detection(name: str = "hflip", hflip: float = 0.5, size: int = 1024) -> list:
    from . import (FixedSizeCrop, RandomHorizontalFlip, RandomIoUCrop, RandomPhotometricDistort,  # lazy: this package
                   RandomShortestSize, RandomZoomOut, ScaleJitter, ToFloat)

    flip = [RandomHorizontalFlip(hflip)] if hflip > 0 else []
    if name == "hflip":
        return flip
    if name == "lsj":
        return [ScaleJitter((size, size)), FixedSizeCrop((size, size), fill=MEAN_255), *flip, ToFloat()]
    if name == "multiscale":
        return [RandomShortestSize([480, 512, 544, 576, 608, 640, 672, 704, 736, 768, 800], 1333), *flip]
    if name == "ssd":
        return [RandomPhotometricDistort(), RandomZoomOut(fill=MEAN_255), RandomIoUCrop(), *flip]
    if name == "ssdlite":
        return [RandomIoUCrop(), *flip]
    raise ConfigError(f"detection preset: one of {', '.join(DETECTION)}, got {name!r}")


def segmentation(base_size: int = 520, crop_size: int = 480, hflip: float = 0.5, mean=MEAN, std=STD) -> list:
    from . import Normalize, RandomCrop, RandomHorizontalFlip, RandomShortestSize, ToFloat  # lazy: this package

    ops: list = [RandomShortestSize(list(range(int(0.5 * base_size), int(2.0 * base_size))))]
    if hflip > 0:
        ops.append(RandomHorizontalFlip(hflip))
    return ops + [RandomCrop(crop_size, pad_if_needed=True, fill=0), ToFloat(), Normalize(mean, std)]


def yolo(size: int = 640, degrees: float = 0.0, translate: float = 0.1, scale: float = 0.5, shear: float = 0.0,
         hsv=(0.015, 0.7, 0.4), fliplr: float = 0.5, mosaic: float = 1.0, mixup: float = 0.0) -> list:
    from . import Mosaic, RandomAffine, RandomHorizontalFlip, RandomHSV, YoloMixUp  # lazy: this package

    ops: list = [Mosaic(size, fill=114, p=float(mosaic))]  # (p < 1: the others letterboxed, as Ultralytics)
    ops.append(RandomAffine(degrees=degrees, translate=(translate, translate), scale=(1 - scale, 1 + scale),
                            shear=shear or None, interpolation="bilinear", fill=114, size=(size, size)))
    flip = [RandomHorizontalFlip(fliplr)] if fliplr > 0 else []
    if mixup > 0:  # (Ultralytics flips the blend: both images with the sample's flip)
        return ops + [YoloMixUp(mixup), RandomHSV(*hsv), *flip]
    # without MixUp the flip goes before the HSV jitter, which is per pixel (the same distribution; a
    # flipped image equal to the other order's up to bilinear rounding): the flip then joins the perspective's map, one resample for both, not a second pass
    return ops + [*flip, RandomHSV(*hsv)]


RECIPES = {
    "imagenet": lambda: classification(None),
    "ra": lambda: classification("ra", random_erase=0.1, mixup=0.2, cutmix=1.0),
    "ta_wide": lambda: classification("ta_wide", random_erase=0.1, mixup=0.2, cutmix=1.0),
    "augmix": lambda: classification("augmix", random_erase=0.1, mixup=0.2, cutmix=1.0),
    "autoaugment": lambda: classification("imagenet", random_erase=0.1, mixup=0.2, cutmix=1.0),
    **{f"det-{n}": (lambda n=n: detection(n)) for n in DETECTION},
    "segmentation": lambda: segmentation(),
    "yolo": lambda: yolo(),
}


def recipe(name: str) -> list:
    """A preset by its ``dsc bench --recipe`` name (``RECIPES``)."""
    if name not in RECIPES:
        raise ConfigError(f"unknown recipe {name!r}; the recipes are: {', '.join(RECIPES)}")
    return RECIPES[name]()
