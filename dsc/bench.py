"""``dsc bench``: the Loader's epoch throughput beside two baselines measured in the same run.

(a) the machine's copy limit: ``torch.index_select`` of the same batches from the page-cache-mapped
    shards into a ring of as many output buffers as the loader keeps (one reused buffer would stay in
    the L3 cache and overstate the limit);
(b) the classic pipeline: torch ``DataLoader(num_workers=2)`` decoding the source JPEGs with PIL and
    applying the same resize, over the source files still where the manifest says (worker start-up
    and the first batch not timed; the files that moved are counted and named, not fatal).
Also printed: the same gathers from as many threads as the loader uses, without the loader's queueing:
the loader's own overhead is the gap to that line. The Loader is those gathers plus its own work, so it
cannot outrun them: when it does (a load spike slowed the baselines), they are measured again, and if it
still does, its ratios are not printed but flagged.

``--recipe imagenet``: the standard training recipe (RandomResizedCrop(224), horizontal flip, ToFloat,
Normalize) through the Loader, beside plain epochs of the same dataset and (c) a lean torch DataLoader
that does the same recipe per image from the source JPEGs with PIL (2 persistent workers, start-up not
timed).
"""
from __future__ import annotations

import math
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from . import transforms as T
from .compiler.decode import decode_image
from .compiler.geometry import apply_plan, plan_fixed
from .errors import ConfigError
from .formats.fields import Schema
from .formats.fields.base import Batch
from .runtime import Loader
from .runtime.batches import sample_pixels
from .runtime import open as open_dataset
from .transforms import color as _color
from .transforms.augment import apply_named


@dataclass
class BenchResult:
    name: str
    images_per_s: float
    gb_per_s: float | None = None


def drop_page_cache(files) -> None:
    """Make ``files`` cold: written back (a dirty page cannot be dropped), then their pages dropped from the
    page cache (POSIX_FADV_DONTNEED; pages another process maps stay)."""
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def disk_read_bytes() -> int | None:
    """The bytes this process has had read from storage (``read_bytes`` of /proc/self/io), or None where the
    kernel does not count them."""
    try:
        lines = Path("/proc/self/io").read_text().splitlines()
    except OSError:
        return None
    return next((int(line.split()[1]) for line in lines if line.startswith("read_bytes:")), None)


def _best(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _ring(ds, loader) -> list[torch.Tensor]:
    """prefetch + 2 batch buffers, as many as the loader cycles through."""
    im = ds.manifest.image
    return [torch.empty((loader.batch_size, im.height, im.width, im.channels), dtype=torch.uint8)
            for _ in range(loader.prefetch + 2)]


def copy_limit(ds, loader) -> float:
    """Images/s of index_select-ing the loader's batches into a ring of prefetch+2 buffers."""
    ring = _ring(ds, loader)
    slots = len(ring)
    batches = loader.batch_indices()
    shards = [ds._shard(s) for s, spec in enumerate(ds.manifest.shards) if spec is not None]
    runs = [ds.shard_runs(idx) for idx in batches]

    def epoch():
        for k, batch_runs in enumerate(runs):
            out = ring[k % slots]
            for s, a, b, local in batch_runs:
                torch.index_select(shards[s], 0, torch.from_numpy(local), out=out[a:b])

    epoch()
    return sum(len(b) for b in batches) / _best(epoch, 3)


def threaded_take_limit(ds, loader) -> float:
    """Images/s of the same gathers (numpy.take, GIL released) from as many threads as the loader uses,
    into the same ring size, with no loader machinery: what the loader could reach at best."""
    from concurrent.futures import ThreadPoolExecutor

    ring = _ring(ds, loader)
    slots = len(ring)
    batches = loader.batch_indices()

    def epoch():
        with ThreadPoolExecutor(max(1, loader.threads_used)) as pool:  # num_threads=0: the calling thread
            list(pool.map(lambda kb: ds.gather_images(kb[1], out=ring[kb[0] % slots][:len(kb[1])]),
                          enumerate(batches)))

    epoch()
    return sum(len(b) for b in batches) / _best(epoch, 3)


def loader_rate(loader, epochs: int = 3) -> float:
    def epoch():
        for _ in loader:
            pass

    epoch()  # map the shards, fault the ring in
    n = sum(len(b) for b in loader.batch_indices())
    return n / _best(epoch, epochs)


class _PILSource(torch.utils.data.Dataset):
    """The same images, decoded and resized with PIL per access (what dsc compiles away)."""

    def __init__(self, paths, manifest):
        self.paths, self.m = paths, manifest

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):

        im = decode_image(self.paths[i], self.m.image.mode).image
        plan = plan_fixed(im.height, im.width, self.m.resize.size, self.m.resize.policy)
        return torch.tensor(apply_plan(im, plan, self.m.resize.fill, self.m.resize.filter))


MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def recipe(name: str, size: int = 224) -> list:
    """A named training recipe as dsc transforms (``imagenet``: RandomResizedCrop, flip, float, normalise;
    the others: :data:`dsc.transforms.presets.RECIPES`)."""

    if name != "imagenet":
        return T.presets.recipe(name)
    return [T.RandomResizedCrop(size), T.RandomHorizontalFlip(), T.ToFloat(), T.Normalize(MEAN, STD)]


def _split_batch_ops(ops: list) -> tuple[list, list]:
    """(the per-image part of a recipe, the part that mixes samples in a batch: MixUp/CutMix). Mosaic stays
    per image (a mosaic of the image with itself: the same work as Ultralytics' 4 images, less 3 decodes)."""
    mix = (T.MixUp, T.CutMix, T.RandomChoice)
    k = next((i for i, op in enumerate(ops) if isinstance(op, mix)), len(ops))
    return ops[:k], ops[k:]


class _PerImageRecipe(torch.utils.data.Dataset):
    """A preset the classic way: each item decodes its source JPEG with PIL and runs the recipe's per-image
    ops on that one image with torch ops (what torchvision.transforms.v2 does per sample), boxes and masks
    from the dataset; the ops that combine samples (MixUp/CutMix, Mosaic) run in the collate."""

    def __init__(self, ds, paths, ops, rows=None):
        self.ds, self.paths = ds, paths
        self.rows = range(len(paths)) if rows is None else rows  # (paths[i] is the source of sample rows[i])
        self.ops = T.Compose(_split_batch_ops(ops)[0])
        self.schema = ds.schema
        # boxes or masks are in the stored frame: the source image is resized to it first; a classification
        # recipe runs on the decoded source as it is (as a per-image pipeline would)
        self.framed = "boxes" in ds.schema or any(k != "image" for k in ds.schema.pixels())

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        import numpy as np
        from PIL import Image, ImageOps

        sample = self.ds[self.rows[i]]
        with Image.open(self.paths[i]) as im:
            im = ImageOps.exif_transpose(im).convert("RGB")
            h, w = sample["image"].shape[:2]
            if im.size != (w, h) and self.framed:  # compiled at another size: boxes and masks are in the stored frame
                im = im.resize((w, h), Image.Resampling.BILINEAR)
            img = torch.from_numpy(np.asarray(im).copy())
        batch = {"image": img.unsqueeze(0)}
        for k, r in self.schema.pixels().items():
            if k != "image" and k in sample:
                batch[k] = sample[k].unsqueeze(0)
        if "boxes" in sample:
            batch.update(boxes=sample["boxes"], labels=sample["labels"],
                         box_offsets=torch.tensor([0, len(sample["boxes"])]))
        if "label" in sample:
            batch["label"] = torch.tensor([sample["label"]])
        schema = Schema({k: r for k, r in self.schema.items() if k in batch})
        out = self.ops(batch, seed=i, schema=schema) if self.ops.ops else batch
        if "boxes" in out and not out["image"].is_floating_point():
            # torchvision's DetectionPresetTrain ends every recipe with ToDtype(torch.float, scale=True) on the
            # (C, H, W) image (dsc's side: format="torchvision")
            out["image"] = sample_pixels(out, "image")[0].permute(2, 0, 1).to(torch.float32).div_(255)
            for suffix in ("_offsets", "_shapes", "_sizes"):
                out.pop("image" + suffix, None)
        return out


def _collate(ops):
    tail = T.Compose(_split_batch_ops(ops)[1]) if _split_batch_ops(ops)[1] else None

    def collate(items):
        img = items[0]["image"]
        if all(it["image"].shape == img.shape for it in items) and "boxes" not in items[0]:
            batch = Batch({"image": torch.cat([it["image"] for it in items]),
                           "label": torch.cat([it["label"] for it in items])})
            return tail(batch) if tail is not None else batch
        return items  # detection: a list per image, as torchvision's collate gives
    return collate


def preset_dataloader_rate(ds, ops, batch_size: int, limit: int | None = 1024) -> float | None:
    """Images/s of torch's DataLoader(2 workers) doing ``ops`` per image from the source JPEGs."""
    rows: list[int] = []
    paths = source_files(ds, rows=rows)[0]
    if not paths or len(ds) < (MIN_TIMED_BATCHES + 5) * batch_size:
        return None
    dl = torch.utils.data.DataLoader(_PerImageRecipe(ds, paths, ops, rows), batch_size=batch_size, num_workers=2,
                                     shuffle=True, persistent_workers=True, prefetch_factor=2,
                                     collate_fn=_collate(ops))
    it = iter(dl)
    for _ in range(5):
        next(it)
    t0, n = time.perf_counter(), 0
    for b in it:
        n += len(b["image"]) if isinstance(b, dict) else len(b)
        if limit and n >= limit:
            break
    return n / (time.perf_counter() - t0) if n else None


class _ReferenceClassification(torch.utils.data.Dataset):
    """torchvision's classification reference per image, as its train.py runs it (ClassificationPresetTrain,
    backend "pil", transforms v2): the JPEG decoded by PIL (ImageFolder's loader); RandomResizedCrop (crop,
    then PIL's bilinear resize), the flip and AutoAugment / RandAugment / TrivialAugmentWide on the PIL image
    with PIL's own kernels (ImageEnhance, Image.transform / rotate, ImageOps: what v2's functionals dispatch a
    PIL image to); AugMix on the image as a uint8 tensor, each op a torch tensor kernel back to uint8 (dsc's
    float formulas, written from torchvision's), mixed in float, back to PIL; then PILToTensor, ToDtype(float,
    scale=True), Normalize and RandomErasing (a clone, the window zeroed) on the (C, H, W) tensor; MixUp /
    CutMix on the stacked batch in the collate (:func:`_reference_collate`). Each op's parameters are drawn
    by dsc's op for this one image (torchvision's distributions). The baseline the classification goals are
    measured against; :class:`_PerImageRecipe` (dsc's batched kernels on a batch of one) is a second one."""

    def __init__(self, ds, paths, ops, rows=None):
        self.paths = paths
        self.rows = range(len(paths)) if rows is None else rows
        self.ops = _split_batch_ops(ops)[0]
        other = [op for op in self.ops if not isinstance(op, REFERENCE_OPS)]
        if other:
            raise ConfigError(f"the reference classification baseline runs {', '.join(c.__name__ for c in REFERENCE_OPS)}"
                              f"; not {', '.join(type(op).__name__ for op in other)}")
        classes = {c: k for k, c in enumerate(ds.classes)}  # ImageFolder's label: the class folder's index
        self.labels = [classes[Path(p).parent.name] if Path(p).parent.name in classes else int(ds[r]["label"])
                       for p, r in zip(paths, self.rows)]

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        import numpy as np
        from PIL import Image

        gen = torch.Generator().manual_seed(i)
        with Image.open(self.paths[i]) as im:
            im = im.convert("RGB")
        x = None  # the (C, H, W) tensor once PILToTensor has run
        for op in self.ops:
            sizes = torch.tensor([[im.height, im.width]] if x is None else [list(x.shape[1:])])
            if isinstance(op, T.RandomResizedCrop):
                t, l, h, w = (int(v) for v in op.params(sizes, gen))
                size = (op.size, op.size) if isinstance(op.size, int) else tuple(op.size)
                im = im.crop((l, t, l + w, t + h)).resize((size[1], size[0]), Image.Resampling.BILINEAR)
            elif isinstance(op, T.RandomHorizontalFlip):
                if bool(op.params(sizes, gen)[0]):
                    im = im.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
            elif isinstance(op, T.AugMix):
                im = _reference_augmix(op, im, op.params(sizes, gen), sizes)
            elif isinstance(op, (T.AutoAugment, T.RandAugment, T.TrivialAugmentWide)):
                p = op.params(sizes, gen)
                for k in range(p["ops"].shape[1]):
                    if bool(p["on"][0, k]):
                        im = _pil_auto_op(im, op.names[int(p["ops"][0, k])], float(p["mag"][0, k]),
                                          op.interpolation, op.fill)
            elif isinstance(op, T.ToFloat):  # PILToTensor + ToDtype(float, scale=True)
                x = torch.as_tensor(np.array(im, copy=True)).permute(2, 0, 1)
                x = x.to(op.dtype).mul_(1.0 / 255) if op.scale else x.to(op.dtype)
            elif isinstance(op, T.Normalize):
                x = x.sub(torch.tensor(op.mean).view(-1, 1, 1)).div_(torch.tensor(op.std).view(-1, 1, 1))
            elif isinstance(op, T.RandomErasing):
                p = op.params(sizes, gen)
                if bool(p["on"][0]):
                    t, l, h, w = p["box"][0].tolist()
                    x = x.clone()
                    x[:, t:t + h, l:l + w] = torch.as_tensor(op.value, dtype=x.dtype).view(-1, 1, 1)
        if x is None:
            x = torch.as_tensor(np.array(im, copy=True)).permute(2, 0, 1)
        return x, self.labels[i]


def _pil_auto_op(im, name: str, mag: float, interpolation: str, fill):
    """One auto-augment op on a PIL image with the PIL kernel torchvision v2 dispatches it to."""
    from PIL import Image, ImageEnhance, ImageOps

    resample = Image.Resampling.BILINEAR if interpolation == "bilinear" else Image.Resampling.NEAREST
    fillcolor = tuple([int(fill)] * 3) if isinstance(fill, (int, float)) else tuple(fill) if fill else (0, 0, 0)
    w, h = im.size
    if name in ("ShearX", "ShearY", "TranslateX", "TranslateY"):
        # F.affine on PIL: torchvision's inverse affine matrix about `center` (shear: (0, 0), the corner; translate:
        # the image centre), through Image.transform
        deg = math.degrees(math.atan(mag))
        shear = (deg, 0.0) if name == "ShearX" else (0.0, deg) if name == "ShearY" else (0.0, 0.0)
        shift = (int(mag), 0) if name == "TranslateX" else (0, int(mag)) if name == "TranslateY" else (0, 0)
        center = [[0.0, 0.0]] if name.startswith("Shear") else [[w * 0.5, h * 0.5]]
        m = _color.inverse_affine(0.0, shift, 1.0, shear, torch.tensor(center))[0, :2].reshape(-1).tolist()
        return im.transform((w, h), Image.Transform.AFFINE, m, resample, fillcolor=fillcolor)
    if name == "Rotate":
        return im.rotate(mag, resample, expand=False, fillcolor=fillcolor)
    enhance = {"Brightness": ImageEnhance.Brightness, "Color": ImageEnhance.Color,
               "Contrast": ImageEnhance.Contrast, "Sharpness": ImageEnhance.Sharpness}
    if name in enhance:
        return enhance[name](im).enhance(1.0 + mag)
    if name == "Posterize":
        return ImageOps.posterize(im, int(mag))
    if name == "Solarize":
        return ImageOps.solarize(im, 255.0 * mag)
    ops = {"AutoContrast": ImageOps.autocontrast, "Equalize": ImageOps.equalize, "Invert": ImageOps.invert}
    return ops[name](im) if name in ops else im  # (Identity)


def _reference_augmix(op, im, p: dict, sizes):
    """torchvision v2's AugMix on a PIL image: to a uint8 (C, H, W) tensor, ``mixture_width`` chains of tensor
    kernels (each op back to uint8), mixed in float at the drawn weights, truncated to uint8, back to PIL."""
    import numpy as np
    from PIL import Image

    x = torch.as_tensor(np.array(im, copy=True)).permute(2, 0, 1)
    W = op.mixture_width
    K = p["ops"].shape[1] // W
    mix = x * p["m0"].to(torch.float32)
    for i in range(W):
        aug = x
        for k in range(i * K, (i + 1) * K):
            if bool(p["on"][0, k]):
                y = apply_named(op.names[int(p["ops"][0, k])], aug.unsqueeze(0).to(torch.float32), p["mag"][:, k],
                                255.0, True, op.interpolation, op.fill)
                aug = y[0].clamp_(0, 255).to(torch.uint8)
        mix.add_(p["w"][0, i].to(torch.float32) * aug)
    return Image.fromarray(mix.to(torch.uint8).permute(1, 2, 0).contiguous().numpy())


REFERENCE_OPS = (T.RandomResizedCrop, T.RandomHorizontalFlip, T.AutoAugment, T.RandAugment, T.TrivialAugmentWide,
                 T.AugMix, T.ToFloat, T.Normalize, T.RandomErasing)


def _reference_collate(ds, ops):
    """torchvision's train.py collate: ``default_collate`` (the images stacked), then MixUp / CutMix."""
    tail = T.Compose(_split_batch_ops(ops)[1]).bind(ds)

    def collate(items):
        batch = Batch({"image": torch.stack([x for x, _ in items]),
                       "label": torch.tensor([y for _, y in items])})
        return tail(batch) if tail.ops else batch
    return collate


def reference_dataloader_rate(ds, ops, batch_size: int, limit: int | None = 1024) -> float | None:
    """Images/s of torch's DataLoader(2 workers) running torchvision's classification reference per image
    (:class:`_ReferenceClassification`) on the source JPEGs; None when the recipe has other ops."""
    if any(not isinstance(op, REFERENCE_OPS) for op in _split_batch_ops(ops)[0]):
        return None
    rows: list[int] = []
    paths = source_files(ds, rows=rows)[0]
    if not paths or len(paths) < (MIN_TIMED_BATCHES + 5) * batch_size:
        return None
    dl = torch.utils.data.DataLoader(_ReferenceClassification(ds, paths, ops, rows), batch_size=batch_size,
                                     num_workers=2, shuffle=True, persistent_workers=True, prefetch_factor=2,
                                     collate_fn=_reference_collate(ds, ops))
    return _timed_batches(dl, limit)


def _timed_batches(dl, limit):
    it = iter(dl)
    for _ in range(5):
        next(it)
    t0, n = time.perf_counter(), 0
    for b in it:
        n += len(b["image"])
        if limit and n >= limit:
            break
    return n / (time.perf_counter() - t0) if n else None


class _PILRecipe(torch.utils.data.Dataset):
    """The recipe per image, the classic way: decode the JPEG, torchvision's crop sampling, crop + bilinear
    resize, flip, to float, normalise (the lean baseline dsc is compared with)."""

    def __init__(self, paths, size: int = 224):
        self.paths, self.size = paths, size

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        import numpy as np
        from PIL import Image

        gen = torch.Generator().manual_seed(i)
        with Image.open(self.paths[i]) as im:
            im = im.convert("RGB")
        t, l, h, w = (float(v) for v in T.RandomResizedCrop(self.size).params(torch.tensor([[im.height, im.width]]),
                                                                                gen))
        im = im.resize((self.size, self.size), Image.Resampling.BILINEAR, box=(l, t, l + w, t + h))
        if torch.rand(1, generator=gen).item() < 0.5:
            im = im.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        x = torch.from_numpy(np.asarray(im).copy()).permute(2, 0, 1).float().div_(255)
        return (x - torch.tensor(MEAN).view(3, 1, 1)) / torch.tensor(STD).view(3, 1, 1)


SOURCE_KINDS = ("imagefolder", "coco", "yolo", "voc", "segfolder")  # sources whose samples are image files


def source_files(ds, limit: int | None = None, rows: list[int] | None = None) -> tuple[list[str], list[str]]:
    """The source files of a dataset that are still where its manifest says (up to ``limit`` of them), and
    those looked for that are not there (moved or deleted since the compile). ``rows``: a list that gets the
    dataset index of each file found (so a sample is paired with its own file when some are missing)."""
    m = ds.manifest
    if m.source.get("kind") not in SOURCE_KINDS:
        return [], []
    root = Path(m.source.get("images") or m.source.get("root") or "")  # COCO keys are relative to images/
    found, missing = [], []
    for i, k in enumerate(ds.keys):
        if limit is not None and len(found) >= limit:
            break
        p = str(root / k)
        if os.path.isfile(p):
            found.append(p)
            if rows is not None:
                rows.append(i)
        else:
            missing.append(p)
    return found, missing


def source_paths(ds, limit: int | None = None) -> list[str] | None:
    """The source files of a dataset still where its manifest says (None: none is)."""
    return source_files(ds, limit)[0] or None


def moved_note(missing: list[str], found: int) -> str:
    """What a baseline over the source files says when some of them are gone."""
    if not missing:
        return ""
    return (f"over the {found:,} source files still there; {len(missing):,} {'is' if len(missing) == 1 else 'are'} "
            f"no longer where the manifest says (e.g. {missing[0]})")


MIN_TIMED_BATCHES = 4  # a baseline needs this many batches after the untimed first (and any prefetched) ones


def dataloader_rate(dataset, batch_size: int, limit: int | None = None) -> float | None:
    """Images/s of torch's DataLoader(num_workers=2, persistent) over ``dataset``, after its first batches
    (worker start-up, and the batches the workers had prefetched meanwhile, are not timed). None when the
    dataset is too small for that."""
    if len(dataset) < (MIN_TIMED_BATCHES + 5) * batch_size:
        return None
    dl = torch.utils.data.DataLoader(dataset, batch_size=batch_size, num_workers=2, shuffle=True,
                                     persistent_workers=True, prefetch_factor=2)
    it = iter(dl)
    for _ in range(5):  # start-up, and the 2 x 2 batches prefetched while it ran
        next(it)
    t0, n = time.perf_counter(), 0
    for b in it:
        n += len(b)
        if limit and n >= limit:
            break
    return n / (time.perf_counter() - t0) if n else None


def baseline_gap(ds, batch_size: int) -> str | None:
    """Why the decoding baseline cannot run on this dataset, or None."""
    paths, missing = source_files(ds)
    if not paths:
        return ("the source JPEGs are not where the manifest says" + (f" (e.g. {missing[0]})" if missing else
                " (or the source is a table or a Python dataset)"))
    if len(paths) < (MIN_TIMED_BATCHES + 5) * batch_size:
        return (f"{len(paths):,} {'source files are' if missing else 'samples are'} too few to time "
                f"{MIN_TIMED_BATCHES} batches of {batch_size} after the start-up (give a smaller --batch-size)")
    return None


def pil_dataloader_rate(ds, batch_size: int, paths: list[str] | None = None) -> float | None:
    """Baseline b over ``paths`` (default: the first :data:`PIL_LIMIT` source files still there)."""
    paths = source_paths(ds, PIL_LIMIT) if paths is None else paths
    if ds.manifest.image.layout != "fixed" or not paths:
        return None
    return dataloader_rate(_PILSource(paths, ds.manifest), batch_size)


def recipe_rates(ds, batch_size: int = 256, order: str = "random", num_threads: int = 2, epochs: int = 3,
                 name: str = "imagenet", device: str = "cpu", baseline_limit: int = 2048) -> dict:
    """The recipe through the Loader, plain epochs of the same dataset, and the PIL recipe DataLoader."""

    plain = loader_rate(Loader(ds, batch_size=batch_size, order=order, num_threads=num_threads, device=device),
                        epochs)
    ops = recipe(name)
    fmt = "torchvision" if "boxes" in ds.schema else "dict"
    rate = loader_rate(Loader(ds, batch_size=batch_size, order=order, num_threads=num_threads, device=device,
                              transforms=ops, format=fmt), epochs)
    paths, missing = source_files(ds)
    if name == "imagenet":
        pil = dataloader_rate(_PILRecipe(paths), batch_size, baseline_limit) if paths and baseline_limit != 0 else None
    else:
        pil = preset_dataloader_rate(ds, ops, batch_size, baseline_limit or None) if baseline_limit != 0 else None
    return {"plain": plain, "recipe": rate, "pil_recipe": pil, "gap": baseline_gap(ds, batch_size),
            "moved": moved_note(missing, len(paths)) if pil else ""}


def cuda_report(ds, batch_size: int = 256, order: str = "random", num_threads: int = 2, prefetch: int = 3,
                epochs: int = 2, echo=print) -> dict:
    """On CUDA: the pinned host-to-device copy limit (one pinned batch copied again and again), the Loader's
    delivery rate to the device in GB/s beside it, and how much of the copies overlapped a consumer that
    keeps the GPU busy about as long as the copies take (100%: fully hidden behind it)."""

    im = ds.manifest.image
    if im.layout != "fixed":
        echo("  (--device cuda measures fixed-shape datasets)")
        return {}
    dev = torch.device("cuda", torch.cuda.current_device())
    host = torch.empty((batch_size, im.height, im.width, im.channels), dtype=torch.uint8, pin_memory=True)
    gpu = torch.empty_like(host, device=dev)
    nbytes = host.numel()

    def copies(n=20):
        torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        for _ in range(n):
            gpu.copy_(host, non_blocking=True)
        torch.cuda.synchronize(dev)
        return n * nbytes / (time.perf_counter() - t0)
    copies(3)
    limit = max(copies() for _ in range(3))
    loader = Loader(ds, batch_size=batch_size, order=order, num_threads=num_threads, prefetch=prefetch, device=dev)
    n = sum(len(b) for b in loader.batch_indices())
    per_batch = nbytes / limit  # seconds one batch's copy takes at the limit
    cycles = None

    def epoch(work: bool):
        nonlocal cycles
        torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        for _ in loader:
            if work:
                torch.cuda._sleep(cycles)
        torch.cuda.synchronize(dev)
        return time.perf_counter() - t0
    # calibrate a GPU sleep of about one batch's copy time
    torch.cuda._sleep(1000)
    torch.cuda.synchronize(dev)
    t0 = time.perf_counter()
    torch.cuda._sleep(10_000_000)
    torch.cuda.synchronize(dev)
    cycles = max(1000, int(10_000_000 * per_batch / (time.perf_counter() - t0)))
    epoch(False)
    t_load = min(epoch(False) for _ in range(epochs))
    batches = len(loader)
    torch.cuda.synchronize(dev)
    t0 = time.perf_counter()
    for _ in range(batches):
        torch.cuda._sleep(cycles)
    torch.cuda.synchronize(dev)
    t_work = time.perf_counter() - t0
    t_both = min(epoch(True) for _ in range(epochs))
    overlap = max(0.0, min(1.0, (t_load + t_work - t_both) / max(1e-9, min(t_load, t_work))))
    rate = n * im.sample_nbytes / t_load
    echo(f"  {'pinned host-to-device copy limit (one batch, again and again)':<58} {limit / 1e9:10.2f} GB/s")
    echo(f"  {'dsc.Loader delivering batches to ' + str(dev):<58} {rate / 1e9:10.2f} GB/s  "
         f"{n / t_load:,.0f} img/s, {rate / limit:.0%} of the copy limit")
    echo(f"  {'with a consumer busy on the GPU as long as the copies':<58} {overlap:10.0%} of the copies overlapped "
         f"it (epoch {t_both:.2f} s; loader alone {t_load:.2f} s, consumer alone {t_work:.2f} s)")
    return {"copy_limit": limit, "loader": rate, "overlap": overlap}


def recipe_header(name: str) -> str:
    """The recipe's ops for the bench's header line, a long list of numbers summarised (the segmentation
    preset's RandomShortestSize draws from hundreds of sizes: ``[260, 261, ..., 1039] (780 values)``)."""
    if name == "imagenet":
        return "RandomResizedCrop(224) + flip + ToFloat + Normalize"

    def brief(m):
        values = m.group(1).split(", ")
        return f"[{values[0]}, {values[1]}, ..., {values[-1]}] ({len(values)} values)"
    return re.sub(r"\[(-?[\d.]+(?:, -?[\d.]+){7,})\]", brief, repr(T.Compose(recipe(name)))[9:-2])


def run_recipe_bench(path, name: str = "imagenet", batch_size: int = 256, order: str = "random",
                     num_threads: int = 2, epochs: int = 3, device: str = "cpu", echo=print) -> dict:

    ds = open_dataset(path)
    r = recipe_rates(ds, batch_size, order, num_threads, epochs, name, device)
    echo(f"dsc bench {path} --recipe {name}: {len(ds):,} samples, batch {batch_size}, order {order}, device {device}; "
         + recipe_header(name))
    echo(f"  {'dsc.Loader, plain epochs (no transforms)':<58} {r['plain']:>10,.0f} img/s")
    echo(f"  {'dsc.Loader + recipe (batched; geometry fused into the gather)':<58} {r['recipe']:>10,.0f} img/s  "
         f"{r['recipe'] / r['plain']:.0%} of plain epochs"
         + (f", {r['recipe'] / r['pil_recipe']:.1f}x the PIL DataLoader" if r["pil_recipe"] else ""))
    if r["pil_recipe"]:
        echo(f"  {'torch DataLoader(2 workers): decode + recipe per image':<58} {r['pil_recipe']:>10,.0f} img/s  "
             f"(baseline c{'; ' + r['moved'] if r['moved'] else ''})")
    else:
        echo(f"  (baseline c skipped: {r['gap'] or 'not asked for'})")
    return r


PLAUSIBLE = 1.15  # the Loader over its own gathers: beyond this (noise), the baselines ran on a busier machine
BASELINE_ROUNDS = 3  # the baselines are measured again (best kept) while the Loader outruns them
PIL_LIMIT = 4096  # source files baseline b decodes at most


def outran(rate: float, limit: float, take: float, threads: int) -> bool:
    """Whether the Loader's ``rate`` is more than it can be: above the threaded gathers it is made of, or above
    its threads' worth of the one-thread copy limit (beyond :data:`PLAUSIBLE`, noise)."""
    return rate > PLAUSIBLE * take or rate > PLAUSIBLE * max(1, threads) * limit


def baselines(ds, loader, rate: float) -> tuple[float, float, int]:
    """(copy limit, threaded gathers, rounds measured): measured again, the best of each kept, while the Loader's
    ``rate`` is more than :data:`PLAUSIBLE` times the gathers it is made of (a load spike slowed the baselines: a
    figure like "194% of the copy limit" cannot be true)."""
    limit, take, rounds = copy_limit(ds, loader), threaded_take_limit(ds, loader), 1
    while outran(rate, limit, take, loader.threads_used) and rounds < BASELINE_ROUNDS:
        limit, take = max(limit, copy_limit(ds, loader)), max(take, threaded_take_limit(ds, loader))
        rounds += 1
    return limit, take, rounds


def run_bench(path, batch_size: int = 256, order: str = "random", num_threads: int = 2, prefetch: int = 3,
              epochs: int = 3, echo=print, device: str = "cpu") -> dict:

    ds = open_dataset(path)
    if device != "cpu":

        if not torch.cuda.is_available():
            raise ConfigError("--device cuda: CUDA is not available here")
        echo(f"dsc bench {path} --device cuda: {len(ds):,} samples, batch {batch_size}, order {order}, "
             f"{num_threads} threads, prefetch {prefetch}")
        return cuda_report(ds, batch_size, order, num_threads, prefetch, echo=echo)
    im = ds.manifest.image
    loader = Loader(ds, batch_size=batch_size, order=order, num_threads=num_threads, prefetch=prefetch)
    nbytes = im.sample_nbytes if im.layout == "fixed" else None
    shape = f"{im.height}x{im.width}x{im.channels}" if nbytes else "ragged"
    echo(f"dsc bench {path}: {len(ds):,} samples {shape}, batch {batch_size}, order {order}, "
         f"{loader.threads_used} threads, prefetch {prefetch}")
    gb = (lambda r: r * nbytes / 1e9) if nbytes else (lambda r: None)
    rate = loader_rate(loader, epochs)
    limit, take, rounds = baselines(ds, loader, rate) if nbytes else (None, None, 0)
    disturbed = bool(take) and outran(rate, limit, take, loader.threads_used)
    paths, missing = source_files(ds, PIL_LIMIT)
    pil = pil_dataloader_rate(ds, batch_size, paths)

    def line(name, r, note):
        g = gb(r)
        echo(f"  {name:<52} {r:>10,.0f} img/s {'' if g is None else f'{g:6.2f} GB/s'}  {note}")

    if limit:
        again = f", measured {rounds} times: the loader outran it" if rounds > 1 else ""
        line(f"copy limit: index_select into a ring of {prefetch + 2} buffers", limit, f"(baseline a{again})")
        line(f"same gathers, numpy.take from {loader.threads_used} threads, no loader", take,
             "(best the loader could do)")
    if disturbed:  # the Loader is those gathers plus its own work: it cannot outrun them
        line("dsc.Loader", rate, f"not compared: it outran the gathers it is made of in {rounds} rounds of the "
                                 f"baselines, which cannot be (the machine was busier while they ran); rerun dsc "
                                 f"bench on a quiet machine")
    else:
        line("dsc.Loader", rate, f"{rate / limit:.0%} of the copy limit, {rate / take:.0%} of the threaded gathers"
             if limit else "")
    if pil:
        line("torch DataLoader(num_workers=2) + PIL decode/resize", pil, f"(baseline b) dsc is {rate / pil:,.0f}x")
        if missing:
            echo(f"  (baseline b {moved_note(missing, len(paths))})")
    else:
        gap = "the layout is ragged" if nbytes is None else baseline_gap(ds, batch_size)
        echo(f"  (baseline b skipped: {gap})")
    return {"loader": rate, "copy_limit": limit, "threaded_take": take, "pil_dataloader": pil, "gb_per_s": gb(rate),
            "baseline_rounds": rounds, "disturbed": disturbed}
