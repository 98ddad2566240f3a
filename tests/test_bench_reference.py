"""The classification goal's baseline (dsc.bench._ReferenceClassification): torchvision's reference recipe per
image as its train.py runs it, so the ops it times are PIL's kernels where the reference uses PIL (the
auto-augment ops on the PIL image), torch tensor ops where it uses those (AugMix, ToDtype, Normalize,
RandomErasing), MixUp/CutMix in the collate; the same parameter draws as dsc's ops."""
import collections

import numpy as np
import pytest
import torch
from PIL import Image, ImageEnhance, ImageOps

from dsc import transforms as T
from dsc.bench import (_pil_auto_op, _reference_augmix, _reference_collate, _ReferenceClassification,
                       reference_dataloader_rate, source_files)
from dsc.transforms import augment as A

from test_recipes import images

NAMES = ["Identity", "ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness", "Color", "Contrast",
         "Sharpness", "Posterize", "Solarize", "AutoContrast", "Equalize", "Invert"]


@pytest.fixture(scope="module")
def fixed(scenes_compiled):
    return scenes_compiled(size=(48, 64), resize="stretch")


@pytest.mark.parametrize("name", NAMES)
def test_each_pil_op_does_dsc_s_op(name):
    """Same op, same magnitude: PIL's kernel gives dsc's (torchvision's tensor formula's) pixels, within a grey
    level but at the edges of a sheared or rotated image (PIL does not blend the border with the fill)."""
    img = images(1, 40, 52, seed=3)[0]
    mags = {"Rotate": (3.0, 12.6, -30.0), "TranslateX": (7.6, -12.0), "TranslateY": (7.6, -12.0), "Posterize": (3.0, 6.0),
            "Solarize": (0.45, 0.9)}.get(name, (0.27, -0.4, 0.9))
    for m in mags:
        for mode in ("nearest", "bilinear"):
            got = torch.as_tensor(np.array(_pil_auto_op(Image.fromarray(img.numpy()), name, m, mode, None)))
            ref = A.apply_named(name, img.permute(2, 0, 1)[None].float(), torch.tensor([m], dtype=torch.float64),
                                255.0, True, mode)[0].clamp(0, 255).permute(1, 2, 0)
            d = (got.float() - ref).abs()
            if name in ("ShearX", "ShearY", "Rotate"):
                assert float(d.mean()) < 4 and float((d <= 1).float().mean()) > 0.85, (name, m, mode)
            else:
                assert float((d <= 1).float().mean()) == 1.0, (name, m, mode, float(d.max()))


def _drawn_ops(ref, i):
    """The auto-augment op names item ``i`` draws (replaying its generator as the item does)."""
    gen = torch.Generator().manual_seed(i)
    with Image.open(ref.paths[i]) as im:
        sizes = torch.tensor([[im.height, im.width]])
    names = []
    for op in ref.ops:
        if isinstance(op, T.ToFloat):
            break
        p = op.params(sizes, gen)
        if isinstance(op, T.RandomResizedCrop):
            sizes = torch.tensor([[op.size, op.size]])
        if isinstance(op, (T.AutoAugment, T.RandAugment, T.TrivialAugmentWide)):
            names += [op.names[int(p["ops"][0, k])] for k in range(p["ops"].shape[1]) if bool(p["on"][0, k])]
    return names


def test_the_reference_runs_the_auto_augment_ops_with_pil_s_kernels(fixed, monkeypatch):
    """Every op an item draws is one call of the PIL function torchvision v2 dispatches a PIL image to."""
    calls = collections.Counter()

    def counting(key, fn):
        def run(*a, **k):
            calls[key] += 1
            return fn(*a, **k)
        return run

    for cls in (ImageEnhance.Brightness, ImageEnhance.Color, ImageEnhance.Contrast, ImageEnhance.Sharpness):
        monkeypatch.setattr(cls, "enhance", counting(cls.__name__, cls.enhance))
    for fn in ("posterize", "solarize", "autocontrast", "equalize", "invert"):
        monkeypatch.setattr(ImageOps, fn, counting(fn, getattr(ImageOps, fn)))
    monkeypatch.setattr(Image.Image, "transform", counting("transform", Image.Image.transform))
    monkeypatch.setattr(Image.Image, "rotate", counting("rotate", Image.Image.rotate))
    rows: list[int] = []
    paths = source_files(fixed, rows=rows)[0]
    want = collections.Counter()
    pil = {"ShearX": "transform", "ShearY": "transform", "TranslateX": "transform", "TranslateY": "transform",
           "Rotate": "rotate", "Brightness": "Brightness", "Color": "Color", "Contrast": "Contrast",
           "Sharpness": "Sharpness", "Posterize": "posterize", "Solarize": "solarize", "AutoContrast": "autocontrast",
           "Equalize": "equalize", "Invert": "invert"}
    for auto in ("ta_wide", "ra", "imagenet"):
        ops = T.presets.classification(auto, crop_size=32, random_erase=0.5)
        ref = _ReferenceClassification(fixed, paths, ops, rows)
        for i in range(12):
            x, label = ref[i]
            assert x.shape == (3, 32, 32) and x.dtype == torch.float32 and label == int(fixed[rows[i]]["label"])
            for n in _drawn_ops(ref, i):
                want.update([pil[n]] + (["transform"] if n == "Rotate" else []) if n != "Identity" else [])
                # (PIL's rotate is a transform)
    assert sum(want.values()) > 20 and calls == want


def test_the_reference_augmix_is_dsc_s_float_formula_per_image():
    """AugMix as torchvision runs it on a PIL image (uint8 tensor kernels, float mix, truncated) gives dsc's
    float AugMix's pixels for the same draws."""
    img = images(1, 30, 44, seed=1)
    for seed in range(6):
        op = T.AugMix(severity=3 + seed % 5, interpolation="bilinear" if seed % 2 else "nearest")
        sizes = torch.tensor([[30, 44]])
        p = op.params(sizes, torch.Generator().manual_seed(seed))
        got = torch.as_tensor(np.array(_reference_augmix(op, Image.fromarray(img[0].numpy()), p)))
        ref = op.apply(img.permute(0, 3, 1, 2).float(), p, sizes, 255.0, True)[0].permute(1, 2, 0)
        assert torch.equal(got, ref.to(torch.uint8)), seed


def test_the_reference_collate_mixes_and_the_rate_is_measured(fixed):
    ops = T.presets.classification("augmix", crop_size=32, random_erase=0.1, mixup=0.2, cutmix=1.0)
    rows: list[int] = []
    paths = source_files(fixed, rows=rows)[0]
    ref = _ReferenceClassification(fixed, paths, ops, rows)
    batch = _reference_collate(fixed, ops)([ref[i] for i in range(6)])
    assert batch["image"].shape == (6, 3, 32, 32) and batch["label"].shape == (6, len(fixed.classes))
    assert torch.allclose(batch["label"].sum(1), torch.ones(6))
    assert reference_dataloader_rate(fixed, ops, 2, limit=8) > 0
    assert reference_dataloader_rate(fixed, [T.RandomResizedCrop(32), T.ColorJitter(0.4), T.ToFloat()], 2) is None


def test_the_reference_dataset_works_after_pickling(fixed):
    """A DataLoader worker started by spawn or forkserver (macOS, Windows; Linux's default from Python 3.14) gets
    the reference dataset pickled: its ops are new objects, and the item is still made (with its Normalize)."""
    import pickle

    ops = T.presets.classification("ta_wide", crop_size=32)
    rows: list[int] = []
    paths = source_files(fixed, rows=rows)[0]
    ref = _ReferenceClassification(fixed, paths, ops, rows)
    again = pickle.loads(pickle.dumps(ref))
    assert torch.equal(again[0][0], ref[0][0])
