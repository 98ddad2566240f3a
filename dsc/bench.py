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
from .formats.fields.base import Batch, drop_companions
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


def _framed_source(path, size, framed: bool = True):
    """The source JPEG at ``path`` decoded with PIL (EXIF orientation applied, RGB), resized to the stored frame
    ``size`` (h, w) when ``framed`` and it differs (boxes and masks are in the stored frame)."""
    from PIL import Image, ImageOps

    with Image.open(path) as im:
        im = ImageOps.exif_transpose(im).convert("RGB")
    h, w = size
    if framed and im.size != (w, h):  # compiled at another size
        im = im.resize((w, h), Image.Resampling.BILINEAR)
    return im


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

        sample = self.ds[self.rows[i]]
        im = _framed_source(self.paths[i], sample["image"].shape[:2], self.framed)
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
            drop_companions(out, "image")
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
    if not paths:
        return None
    return dataloader_rate(_PerImageRecipe(ds, paths, ops, rows), batch_size, limit, _collate(ops))


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
        other = [op for op in self.ops if not isinstance(op, CLASSIFICATION_REFERENCE_OPS)]
        if other:
            runs = ", ".join(c.__name__ for c in CLASSIFICATION_REFERENCE_OPS)
            raise ConfigError(f"the reference classification baseline runs {runs}"
                              f"; not {', '.join(type(op).__name__ for op in other)}")
        self.norms = [(torch.tensor(op.mean).view(-1, 1, 1), torch.tensor(op.std).view(-1, 1, 1))
                      if isinstance(op, T.Normalize) else None for op in self.ops]  # (made once, as transforms'
        # Normalize does; aligned with the ops, which a DataLoader worker gets pickled: new objects)
        classes = {c: k for k, c in enumerate(ds.classes)}  # ImageFolder's label: the class folder's index
        self.labels = [classes[Path(p).parent.name] if Path(p).parent.name in classes else int(ds[r]["label"])
                       for p, r in zip(paths, self.rows)]

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        import numpy as np
        from PIL import Image

        im, gen = _item_source(self.paths[i], i)
        x = None  # the (C, H, W) tensor once PILToTensor has run
        for op, norm in zip(self.ops, self.norms):
            sizes = torch.tensor([[im.height, im.width]] if x is None else [list(x.shape[1:])])
            if isinstance(op, T.RandomResizedCrop):
                t, l, h, w = (int(v) for v in op.params(sizes, gen))
                size = (op.size, op.size) if isinstance(op.size, int) else tuple(op.size)
                im = im.crop((l, t, l + w, t + h)).resize((size[1], size[0]), Image.Resampling.BILINEAR)
            elif isinstance(op, T.RandomHorizontalFlip):
                if bool(op.params(sizes, gen)[0]):
                    im = im.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
            elif isinstance(op, T.AugMix):
                im = _reference_augmix(op, im, op.params(sizes, gen))
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
                mean, std = norm
                x = x.sub(mean).div_(std)
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


def _reference_augmix(op, im, p: dict):
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


CLASSIFICATION_REFERENCE_OPS = (T.RandomResizedCrop, T.RandomHorizontalFlip, T.AutoAugment, T.RandAugment,
                                T.TrivialAugmentWide, T.AugMix, T.ToFloat, T.Normalize, T.RandomErasing)


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
    if any(not isinstance(op, CLASSIFICATION_REFERENCE_OPS) for op in _split_batch_ops(ops)[0]):
        return None
    rows: list[int] = []
    paths = source_files(ds, rows=rows)[0]
    if not paths:
        return None
    return dataloader_rate(_ReferenceClassification(ds, paths, ops, rows), batch_size, limit,
                           _reference_collate(ds, ops))


def _item_source(path, i: int):
    """A per-image baseline's item ``i``: its JPEG decoded to RGB, and the generator its random draws come from
    (seeded by the index: the same draws in every run)."""
    from PIL import Image

    with Image.open(path) as im:
        return im.convert("RGB"), torch.Generator().manual_seed(i)


class _PILRecipe(torch.utils.data.Dataset):
    """The recipe per image, the classic way: decode the JPEG, torchvision's crop sampling, crop + bilinear
    resize, flip, to float, normalise (the lean baseline dsc is compared with)."""

    def __init__(self, paths, size: int = 224):
        self.paths, self.size = paths, size
        self.mean, self.std = torch.tensor(MEAN).view(3, 1, 1), torch.tensor(STD).view(3, 1, 1)  # (made once)

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        import numpy as np
        from PIL import Image

        im, gen = _item_source(self.paths[i], i)
        t, l, h, w = (float(v) for v in T.RandomResizedCrop(self.size).params(torch.tensor([[im.height, im.width]]),
                                                                                gen))
        im = im.resize((self.size, self.size), Image.Resampling.BILINEAR, box=(l, t, l + w, t + h))
        if torch.rand(1, generator=gen).item() < 0.5:
            im = im.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        x = torch.from_numpy(np.asarray(im).copy()).permute(2, 0, 1).float().div_(255)
        return (x - self.mean) / self.std


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


def dataloader_rates(dataset, batch_size: int, limit: int | None = None, collate=None) -> dict | None:
    """{"rate": images/s, "cpu_ms": CPU ms per image (this process and its 2 workers)} of torch's
    DataLoader(num_workers=2, persistent) over ``dataset`` (``collate``: its collate_fn), after its first
    batches (worker start-up, and the batches the workers had prefetched meanwhile, are not timed); at most
    ``limit`` images timed. None when the dataset is too small for that."""
    if len(dataset) < (MIN_TIMED_BATCHES + 5) * batch_size:
        return None
    dl = torch.utils.data.DataLoader(dataset, batch_size=batch_size, num_workers=2, shuffle=True,
                                     persistent_workers=True, prefetch_factor=2, collate_fn=collate)
    it = iter(dl)
    for _ in range(5):  # start-up, and the 2 x 2 batches prefetched while it ran
        next(it)
    workers = [w.pid for w in getattr(it, "_workers", [])]
    cpu0 = time.process_time() + sum(proc_cpu(p) for p in workers)
    t0, n = time.perf_counter(), 0
    for b in it:
        n += len(b["image"]) if isinstance(b, dict) else len(b)
        if limit and n >= limit:
            break
    wall = time.perf_counter() - t0
    cpu = time.process_time() + sum(proc_cpu(p) for p in workers) - cpu0
    del it, dl
    return {"rate": n / wall, "cpu_ms": 1e3 * cpu / n} if n else None


def dataloader_rate(dataset, batch_size: int, limit: int | None = None, collate=None) -> float | None:
    """Images/s of :func:`dataloader_rates`."""
    return (dataloader_rates(dataset, batch_size, limit, collate) or {}).get("rate")


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
    pil, limit = None, baseline_limit or None
    if name == "imagenet":
        pil = dataloader_rate(_PILRecipe(paths), batch_size, baseline_limit) if paths and baseline_limit != 0 else None
    elif baseline_limit != 0:  # the recipe as its reference runs it per image where dsc.bench has it written out
        if fmt == "dict":
            pil = reference_dataloader_rate(ds, ops, batch_size, limit)
        else:
            pil = (baseline_rates(ds, ops, batch_size, limit or 256) or {}).get("rate")
        pil = pil or preset_dataloader_rate(ds, ops, batch_size, limit)
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
         + (f", {r['recipe'] / r['pil_recipe']:.1f}x the per-image DataLoader" if r["pil_recipe"] else ""))
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


# ------------------------------------------------------------------------- the recipes as their references run
# Per image, as the reference implementations run them (not dsc's kernels on a batch of one): torchvision's
# references/detection transforms on the PIL image where they have a PIL path (PIL's C code), boxes as float
# tensors; references/segmentation likewise; Ultralytics' YOLO pipeline on numpy (its OpenCV calls done with
# PIL where cv2 is not installed). Parameters drawn from torch's global generator (as the references do; the
# DataLoader seeds it per worker). Each function: (dsc op, PIL image, target dict) -> (image, target).
def _ref_flip(op, im, t):
    from PIL import Image  # lazy: the baseline alone decodes with PIL

    if torch.rand(1) < op.p:
        im = im.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        if "boxes" in t:
            t["boxes"][:, [0, 2]] = im.width - t["boxes"][:, [2, 0]]
        if "mask" in t:
            t["mask"] = t["mask"].transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return im, t


def _ref_photometric(op, im, t):
    """references/detection RandomPhotometricDistort: ColorJitter's PIL ops (ImageEnhance, the hue through
    PIL's HSV), the channel permutation through a float tensor and back."""
    import numpy as np
    from PIL import Image, ImageEnhance

    def jitter(rng):
        torch.randperm(4)  # (ColorJitter draws its order first)
        return float(torch.empty(1).uniform_(*rng))

    r = torch.rand(7)
    if r[0] < op.p and op.brightness:
        im = ImageEnhance.Brightness(im).enhance(jitter(op.brightness))
    if r[1] < 0.5 and r[2] < op.p and op.contrast:
        im = ImageEnhance.Contrast(im).enhance(jitter(op.contrast))
    if r[3] < op.p and op.saturation:
        im = ImageEnhance.Color(im).enhance(jitter(op.saturation))
    if r[4] < op.p and op.hue:
        h, s, v = im.convert("HSV").split()
        np_h = np.array(h, dtype=np.uint8)
        np_h += np.array(jitter(op.hue) * 255).astype(np.uint8)
        im = Image.merge("HSV", (Image.fromarray(np_h, "L"), s, v)).convert("RGB")
    if r[1] >= 0.5 and r[5] < op.p and op.contrast:
        im = ImageEnhance.Contrast(im).enhance(jitter(op.contrast))
    if r[6] < op.p:
        x = torch.from_numpy(np.asarray(im).copy()).permute(2, 0, 1).float().div_(255)[torch.randperm(3)]
        im = Image.fromarray(x.mul(255).byte().permute(1, 2, 0).numpy())
    return im, t


def _ref_pad(im, t, left, top, right, bottom, fill):
    from PIL import ImageOps

    fill = tuple(int(v) for v in fill) if isinstance(fill, (tuple, list)) else int(fill)
    im = ImageOps.expand(im, border=(left, top, right, bottom), fill=fill)
    if "mask" in t:
        t["mask"] = ImageOps.expand(t["mask"], border=(left, top, right, bottom), fill=t["ignore"])
    return im, t


def _ref_zoom_out(op, im, t):
    if torch.rand(1) >= op.p:
        return im, t
    w, h = im.size
    r = op.side_range[0] + torch.rand(1) * (op.side_range[1] - op.side_range[0])
    cw, ch = int(w * r), int(h * r)
    r = torch.rand(2)
    left, top = int((cw - w) * r[0]), int((ch - h) * r[1])
    im, t = _ref_pad(im, t, left, top, cw - (left + w), ch - (top + h), op.fill)
    t["boxes"][:, 0::2] += left
    t["boxes"][:, 1::2] += top
    return im, t


def _ref_crop(im, t, top, left, h, w):
    im = im.crop((left, top, left + w, top + h))
    if "mask" in t:
        t["mask"] = t["mask"].crop((left, top, left + w, top + h))
    return im, t


def _ref_iou_crop(op, im, t):
    """references/detection RandomIoUCrop: its Python loop over options and trials."""
    w0, h0 = im.size
    while True:
        min_iou = op.sampler_options[int(torch.randint(0, len(op.sampler_options), (1,)))]
        if min_iou >= 1.0:
            return im, t
        for _ in range(op.trials):
            r = op.min_scale + (op.max_scale - op.min_scale) * torch.rand(2)
            nw, nh = int(w0 * r[0]), int(h0 * r[1])
            if nh == 0 or not op.min_aspect_ratio <= nw / nh <= op.max_aspect_ratio:
                continue
            r = torch.rand(2)
            left, top = int((w0 - nw) * r[0]), int((h0 - nh) * r[1])
            right, bottom = left + nw, top + nh
            if left == right or top == bottom:
                continue
            b = t["boxes"]
            cx, cy = 0.5 * (b[:, 0] + b[:, 2]), 0.5 * (b[:, 1] + b[:, 3])
            within = (left < cx) & (cx < right) & (top < cy) & (cy < bottom)
            if not within.any():
                continue
            b = b[within]
            iw = (torch.minimum(b[:, 2], torch.tensor(float(right))) - torch.maximum(b[:, 0], torch.tensor(float(left)))
                  ).clamp(min=0)
            ih = (torch.minimum(b[:, 3], torch.tensor(float(bottom))) - torch.maximum(b[:, 1], torch.tensor(float(top)))
                  ).clamp(min=0)
            inter = iw * ih
            iou = inter / ((b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1]) + nw * nh - inter)
            if iou.max() < min_iou:
                continue
            t["boxes"], t["labels"] = b, t["labels"][within]
            t["boxes"][:, 0::2] -= left
            t["boxes"][:, 1::2] -= top
            t["boxes"][:, 0::2].clamp_(min=0, max=nw)
            t["boxes"][:, 1::2].clamp_(min=0, max=nh)
            return _ref_crop(im, t, top, left, nh, nw)


def _ref_resize(im, t, nh, nw):
    from PIL import Image

    w0, h0 = im.size
    im = im.resize((nw, nh), Image.Resampling.BILINEAR)  # (PIL's bilinear is antialiased, as antialias=True)
    if "boxes" in t:
        t["boxes"][:, 0::2] *= nw / w0
        t["boxes"][:, 1::2] *= nh / h0
    if "mask" in t:
        t["mask"] = t["mask"].resize((nw, nh), Image.Resampling.NEAREST)
    return im, t


def _ref_scale_jitter(op, im, t):
    w0, h0 = im.size
    th, tw = (op.target_size, op.target_size) if isinstance(op.target_size, int) else op.target_size
    scale = op.scale_range[0] + torch.rand(1) * (op.scale_range[1] - op.scale_range[0])
    r = min(th / h0, tw / w0) * scale
    return _ref_resize(im, t, int(h0 * r), int(w0 * r))


def _ref_shortest_size(op, im, t):
    w0, h0 = im.size
    short = op.min_size[torch.randint(len(op.min_size), (1,)).item()]
    r = short / min(h0, w0)
    if op.max_size is not None:
        r = min(r, op.max_size / max(h0, w0))
    return _ref_resize(im, t, int(h0 * r), int(w0 * r))


def _ref_fixed_size_crop(op, im, t):
    w, h = im.size
    ch, cw = (op.size, op.size) if isinstance(op.size, int) else op.size
    nh, nw = min(h, ch), min(w, cw)
    if nh != h or nw != w:
        r = torch.rand(1)
        top, left = int(max(h - ch, 0) * r), int(max(w - cw, 0) * r)
        im, t = _ref_crop(im, t, top, left, nh, nw)
        b = t["boxes"]
        b[:, 0::2] -= left
        b[:, 1::2] -= top
        b[:, 0::2].clamp_(min=0, max=nw)
        b[:, 1::2].clamp_(min=0, max=nh)
        ok = (b[:, 0] < b[:, 2]) & (b[:, 1] < b[:, 3])
        t["boxes"], t["labels"] = b[ok], t["labels"][ok]
    if ch > nh or cw > nw:
        im, t = _ref_pad(im, t, 0, 0, cw - nw, ch - nh, op.fill)
    return im, t


def _ref_random_crop(op, im, t):
    """references/segmentation RandomCrop: padded at the right and bottom when smaller (mask: 255), then a
    uniform crop (v2's get_params)."""
    ch, cw = (op.size, op.size) if isinstance(op.size, int) else op.size
    w, h = im.size
    if w < cw or h < ch:
        im, t = _ref_pad(im, t, 0, 0, max(cw - w, 0), max(ch - h, 0), op.fill)
        w, h = im.size
    top, left = int(torch.randint(0, h - ch + 1, (1,))), int(torch.randint(0, w - cw + 1, (1,)))
    return _ref_crop(im, t, top, left, ch, cw)


def _ref_mosaic(op, im, t):
    """Ultralytics' Mosaic: the image and 3 others (random, each decoded from its JPEG) resized to a longer
    side of ``size``, placed around a random centre on a 2 size canvas of 114; boxes shifted, clipped."""
    import numpy as np

    s = op.size
    canvas = np.full((2 * s, 2 * s, 3), op.fill if isinstance(op.fill, int) else op.fill[0], np.uint8)
    xc, yc = (int(np.random.uniform(s / 2, 3 * s / 2)) for _ in range(2))
    boxes, labels = [], []
    for i, (img, tt) in enumerate([(im, t)] + [t["partner"]() for _ in range(3)]):
        w0, h0 = img.size
        r = s / max(h0, w0)
        img, tt = _ref_resize(img, tt, min(math.ceil(h0 * r), s), min(math.ceil(w0 * r), s))
        a = np.asarray(img)
        h, w = a.shape[:2]
        if i == 0:
            x1a, y1a, x2a, y2a = max(xc - w, 0), max(yc - h, 0), xc, yc
            x1b, y1b, x2b, y2b = w - (x2a - x1a), h - (y2a - y1a), w, h
        elif i == 1:
            x1a, y1a, x2a, y2a = xc, max(yc - h, 0), min(xc + w, s * 2), yc
            x1b, y1b, x2b, y2b = 0, h - (y2a - y1a), min(w, x2a - x1a), h
        elif i == 2:
            x1a, y1a, x2a, y2a = max(xc - w, 0), yc, xc, min(s * 2, yc + h)
            x1b, y1b, x2b, y2b = w - (x2a - x1a), 0, w, min(y2a - y1a, h)
        else:
            x1a, y1a, x2a, y2a = xc, yc, min(xc + w, s * 2), min(s * 2, yc + h)
            x1b, y1b, x2b, y2b = 0, 0, min(w, x2a - x1a), min(y2a - y1a, h)
        canvas[y1a:y2a, x1a:x2a] = a[y1b:y2b, x1b:x2b]
        b = tt["boxes"].numpy().copy()
        b[:, 0::2] += x1a - x1b
        b[:, 1::2] += y1a - y1b
        boxes.append(b)
        labels.append(tt["labels"].numpy())
    t["boxes"] = torch.from_numpy(np.concatenate(boxes).clip(0, 2 * s))
    t["labels"] = torch.from_numpy(np.concatenate(labels))
    return canvas, t


def _ref_perspective(op, im, t):
    """Ultralytics' random_perspective (degrees, translate, scale, shear; no perspective) as one affine warp
    of the mosaic canvas to size x size, bilinear, fill 114 (cv2.warpAffine; PIL's transform here), boxes by
    their corners, clipped, Ultralytics' box_candidates filter."""
    import numpy as np
    from PIL import Image

    a = np.asarray(im)
    H, W = a.shape[:2]
    oh, ow = (op.size, op.size) if isinstance(op.size, int) else op.size
    Cm = np.eye(3)
    Cm[0, 2], Cm[1, 2] = -W / 2, -H / 2
    R = np.eye(3)
    ang = np.random.uniform(*op.degrees) if op.degrees else 0.0
    sc = np.random.uniform(*op.scale) if op.scale else 1.0
    c, s_ = math.cos(math.radians(ang)) * sc, math.sin(math.radians(ang)) * sc
    R[:2, :2] = [[c, s_], [-s_, c]]
    S = np.eye(3)
    if op.shear:
        S[0, 1] = math.tan(np.random.uniform(*op.shear[:2]) * math.pi / 180)
        S[1, 0] = math.tan(np.random.uniform(*op.shear[:2]) * math.pi / 180)
    T = np.eye(3)
    tx, ty = op.translate or (0.0, 0.0)
    T[0, 2], T[1, 2] = np.random.uniform(0.5 - tx, 0.5 + tx) * ow, np.random.uniform(0.5 - ty, 0.5 + ty) * oh
    M = T @ S @ R @ Cm
    inv = np.linalg.inv(M)
    fill = op.fill if isinstance(op.fill, tuple) else (op.fill,) * 3
    out = Image.fromarray(a).transform((ow, oh), Image.Transform.AFFINE, tuple(inv[:2].reshape(-1)),
                                       Image.Resampling.BILINEAR, fillcolor=tuple(int(v) for v in fill))
    b = t["boxes"].numpy()
    n = len(b)
    if n:
        xy = np.ones((n * 4, 3))
        xy[:, :2] = b[:, [0, 1, 2, 3, 0, 3, 2, 1]].reshape(n * 4, 2)
        xy = (xy @ M.T)[:, :2].reshape(n, 8)
        new = np.concatenate((xy[:, [0, 2, 4, 6]].min(1), xy[:, [1, 3, 5, 7]].min(1),
                              xy[:, [0, 2, 4, 6]].max(1), xy[:, [1, 3, 5, 7]].max(1))).reshape(4, n).T
        new[:, [0, 2]] = new[:, [0, 2]].clip(0, ow)
        new[:, [1, 3]] = new[:, [1, 3]].clip(0, oh)
        w1, h1 = (b[:, 2] - b[:, 0]) * sc, (b[:, 3] - b[:, 1]) * sc
        w2, h2 = new[:, 2] - new[:, 0], new[:, 3] - new[:, 1]
        ar = np.maximum(w2 / (h2 + 1e-16), h2 / (w2 + 1e-16))
        keep = (w2 > 2) & (h2 > 2) & (w2 * h2 / (w1 * h1 + 1e-16) > 0.1) & (ar < 100)
        t["boxes"], t["labels"] = torch.from_numpy(new[keep]).float(), t["labels"][torch.from_numpy(keep)]
    return out, t


def _ref_hsv(op, im, t):
    """Ultralytics' augment_hsv: per-channel gains, lookup tables on the 8-bit HSV image (PIL's HSV here,
    hue on its 0-255 circle), back to RGB."""
    import numpy as np
    from PIL import Image

    r = np.random.uniform(-1, 1, 3) * [op.hgain, op.sgain, op.vgain] + 1
    h, s, v = im.convert("HSV").split()
    x = np.arange(0, 256, dtype=r.dtype)
    luts = (((x * r[0]) % 256).astype(np.uint8), np.clip(x * r[1], 0, 255).astype(np.uint8),
            np.clip(x * r[2], 0, 255).astype(np.uint8))
    planes = [Image.fromarray(lut[np.asarray(p)], "L") for lut, p in zip(luts, (h, s, v))]
    return Image.merge("HSV", planes).convert("RGB"), t


DETECTION_REFERENCE_OPS = {"RandomHorizontalFlip": _ref_flip, "RandomPhotometricDistort": _ref_photometric,
                 "RandomZoomOut": _ref_zoom_out, "RandomIoUCrop": _ref_iou_crop, "ScaleJitter": _ref_scale_jitter,
                 "FixedSizeCrop": _ref_fixed_size_crop, "RandomShortestSize": _ref_shortest_size,
                 "RandomCrop": _ref_random_crop, "Mosaic": _ref_mosaic, "RandomAffine": _ref_perspective,
                 "RandomHSV": _ref_hsv}


def reference_supported(ops) -> bool:
    """Whether :class:`_ReferenceRecipe` runs ``ops`` as their reference does (a detection, segmentation or
    YOLO preset: every op but the final float conversion has a reference implementation above)."""
    return any(type(op).__name__ in DETECTION_REFERENCE_OPS for op in ops) and all(
        type(op).__name__ in DETECTION_REFERENCE_OPS or isinstance(op, (T.ToFloat, T.Normalize)) for op in ops)


class _ReferenceRecipe(torch.utils.data.Dataset):
    """A detection, segmentation or YOLO preset as its reference runs it per image (see DETECTION_REFERENCE_OPS): decode
    the JPEG with PIL (resized to the stored frame when compiled at another size, as :class:`_PerImageRecipe`),
    boxes, labels and mask from the dataset, each op on the PIL image, then PILToTensor + ToDtype(float,
    scale=True) (segmentation: + Normalize; YOLO: a uint8 (C, H, W) tensor, as Ultralytics' collate stacks
    it, the float conversion being on the GPU). YOLO's Mosaic decodes its three partners (random samples) as
    Ultralytics does without its RAM cache."""

    def __init__(self, ds, paths, ops, rows=None):
        self.ds, self.paths, self.ops = ds, paths, list(ops)
        self.rows = range(len(paths)) if rows is None else rows
        masks = [k for k, r in ds.schema.pixels().items() if k != "image"]
        self.mask = masks[0] if masks else None
        self.ignore = int(ds.schema[self.mask].fill or 0) if self.mask else 0
        self.yolo = any(type(op).__name__ == "Mosaic" for op in self.ops)
        norm = next((op for op in self.ops if isinstance(op, T.Normalize)), None)
        self.norm = None if norm is None else (torch.tensor(norm.mean).view(-1, 1, 1),
                                               torch.tensor(norm.std).view(-1, 1, 1))  # (made once, as transforms.Normalize)
        # (the segmentation reference has no boxes: a dataset that also has them keeps them out of its targets)
        self.boxes = "boxes" in ds.schema and not any(type(op).__name__ == "RandomCrop" for op in self.ops)

    def __len__(self):
        return len(self.paths)

    def _load(self, i):
        import numpy as np
        from PIL import Image

        sample = self.ds[self.rows[i]]
        im = _framed_source(self.paths[i], sample["image"].shape[:2])
        t = {"ignore": self.ignore}
        if self.boxes and "boxes" in sample:
            t["boxes"], t["labels"] = sample["boxes"].float().clone(), sample["labels"].clone()
        if self.mask is not None and self.mask in sample:
            m = sample[self.mask].numpy()
            t["mask"] = Image.fromarray(m.reshape(m.shape[:2]).astype(np.uint8), "L")
        return im, t

    def __getitem__(self, i):
        import numpy as np

        im, t = self._load(i)
        if self.yolo:
            t["partner"] = lambda: self._load(int(torch.randint(len(self.paths), (1,))))
        for op in self.ops:
            if type(op).__name__ in DETECTION_REFERENCE_OPS:
                im, t = DETECTION_REFERENCE_OPS[type(op).__name__](op, im, t)
                if isinstance(im, np.ndarray):
                    from PIL import Image

                    im = Image.fromarray(im)
        x = torch.from_numpy(np.asarray(im).copy()).permute(2, 0, 1)  # PILToTensor
        out = {k: v for k, v in t.items() if k in ("boxes", "labels")}
        if self.mask is not None and "mask" in t:
            out[self.mask] = torch.as_tensor(np.array(t["mask"]), dtype=torch.int64)
        if not self.yolo:
            x = x.to(torch.float32).div_(255)  # ToDtype(float, scale=True)
            if self.norm is not None:
                x = (x - self.norm[0]) / self.norm[1]
        out["image"] = x
        return out


def proc_cpu(pid: int, children: bool = False) -> float:
    """CPU seconds (user + system) process ``pid`` has used, from /proc (0 where it cannot be read);
    ``children``: with those of the children it has reaped."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return sum(int(x) for x in fields[11:15 if children else 13]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def baseline_rates(ds, ops, batch_size: int, limit: int = 256, reference: bool = True) -> dict | None:
    """{"rate": images/s, "cpu_ms": CPU ms per image (this process and its 2 workers)} of torch's
    DataLoader(2 workers) over the source JPEGs doing ``ops`` per image: as the reference runs them
    (:class:`_ReferenceRecipe`, ``reference=True``; None where it has no reference implementation) or with
    dsc's kernels on a batch of one (:class:`_PerImageRecipe`). Start-up and the first 5 batches untimed."""
    rows: list[int] = []
    paths = source_files(ds, rows=rows)[0]
    if not paths or (reference and not reference_supported(ops)):
        return None
    data = _ReferenceRecipe(ds, paths, ops, rows) if reference else _PerImageRecipe(ds, paths, ops, rows)
    return dataloader_rates(data, batch_size, limit, (lambda items: items) if reference else _collate(ops))
