"""Instance segmentation + keypoints epoch: dsc batches with per-object masks and keypoints vs a torch
DataLoader doing what torchvision's detection reference does per image (decode the JPEG, polygons / RLE
to masks with pycocotools, random horizontal flip of image, boxes, masks and keypoints, to a float
tensor), same images, same run, the same 2 worker threads / processes. Also: what the per-object masks
add to the compiled dataset (bytes, against the same compile without them)."""
from __future__ import annotations

import json
import os
import time

import numpy as np

from common import BENCH_DIR, best_of, cached, row

from dsc.bench import proc_cpu

N, MAX_SIDE = 160, 640
FLIP = [0, 2, 1, 4, 3, 6, 5, 8, 7, 10, 9, 12, 11, 14, 13, 16, 15]


class Reference:
    """torchvision's detection reference per image: ConvertCocoPolysToMask, RandomHorizontalFlip, to float."""

    def __init__(self, ann, images):
        from pycocotools.coco import COCO

        self.coco, self.images = COCO(str(ann)), images
        self.ids = sorted(self.coco.getImgIds())

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        import torch
        from PIL import Image

        info = self.coco.loadImgs(self.ids[i])[0]
        anns = [a for a in self.coco.loadAnns(self.coco.getAnnIds(imgIds=info["id"])) if not a["iscrowd"]]
        with Image.open(self.images / info["file_name"]) as im:
            img = torch.from_numpy(np.asarray(im.convert("RGB"))).permute(2, 0, 1)
        masks = torch.from_numpy(np.stack([self.coco.annToMask(a) for a in anns]))
        boxes = torch.tensor([a["bbox"] for a in anns], dtype=torch.float32)
        boxes[:, 2:] += boxes[:, :2]
        kps = torch.tensor([a.get("keypoints", [0] * 51) for a in anns], dtype=torch.float32).view(-1, 17, 3)
        if torch.rand(1) < 0.5:
            w = img.shape[-1]
            img, masks = img.flip(-1), masks.flip(-1)
            boxes[:, [0, 2]] = w - boxes[:, [2, 0]]
            kps = kps[:, FLIP]
            kps[..., 0] = w - kps[..., 0]
            kps[kps[..., 2] == 0] = 0
        target = {"boxes": boxes, "labels": torch.tensor([a["category_id"] for a in anns]), "masks": masks,
                  "keypoints": kps}
        return img.float().div_(255), target


def cpu_per_image(epoch, n: int, workers=lambda: []) -> float:
    """The least CPU time (ms per image) of 3 epochs: this process's (every thread) and its ``workers()``
    processes'. On a shared machine the wall-clock rate follows the CPU share a run gets, which changes
    from second to second; the CPU an epoch costs does not, so this ratio is the steadier one."""
    best = float("inf")
    for _ in range(3):
        t0 = time.process_time() + sum(proc_cpu(p) for p in workers())
        epoch()
        best = min(best, time.process_time() + sum(proc_cpu(p) for p in workers()) - t0)
    return 1e3 * best / n


def _bytes(path) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def main() -> None:
    import torch

    import dsc
    from dsc import transforms as T
    from dsc.synthetic import write_coco_instances

    root = cached(f"coco-instances-{N}", lambda r: write_coco_instances(r, n=N, seed=0, size_range=(400, 640),
                                                                          people=6, ext=".jpg"))
    ann, images = root / "annotations.json", root / "images"
    data = json.loads(ann.read_text())
    print(f"instance masks + keypoints: {N} JPEG scenes 400-640 px, {len(data['annotations'])} objects "
          f"(people with 17 keypoints, two-part objects, RLE with holes, crowds)")
    out, plain = BENCH_DIR / f"coco-instances-{N}.dsc", BENCH_DIR / f"coco-instances-{N}-boxes.dsc"
    dsc.compile_coco(ann, images, out, masks="instance", max_side=MAX_SIDE, overwrite=True, progress=False)
    dsc.compile_coco(ann, images, plain, max_side=MAX_SIDE, overwrite=True, progress=False)
    with_masks, without = _bytes(out), _bytes(plain)
    ds = dsc.open(out)
    print(f"  storage: {with_masks / 1e6:.1f} MB with per-object masks, {without / 1e6:.1f} MB without "
          f"(+{100 * (with_masks - without) / without:.2f}%; the masks' bits: "
          f"{ds.manifest.fields['masks']['nbytes'] / 1e3:.0f} kB)")

    ref = torch.utils.data.DataLoader(Reference(ann, images), batch_size=16, shuffle=True, num_workers=2,
                                      collate_fn=lambda b: tuple(zip(*b)), persistent_workers=True)

    def ref_epoch():
        for _ in ref:
            pass
    ref_epoch()
    baseline = N / best_of(ref_epoch, repeat=2)
    tv = dsc.Loader(ds, batch_size=16, order="random", num_threads=2, transforms=[T.RandomHorizontalFlip()],
                    format="torchvision")
    packed = dsc.Loader(ds, batch_size=16, order="random", num_threads=2, transforms=[T.RandomHorizontalFlip()])

    def epoch(loader):
        for _ in loader:
            pass
    epoch(tv)
    rate_tv = N / best_of(lambda: epoch(tv), repeat=3)
    rate_packed = N / best_of(lambda: epoch(packed), repeat=3)
    print(row("torch DataLoader: decode + annToMask + flip, 2 procs", baseline, "img/s", None, "(baseline)"))
    print(row("dsc.Loader format='torchvision' (k,H,W) masks", rate_tv, "img/s", baseline))
    print(row("dsc.Loader packed crops + keypoints (dict)", rate_packed, "img/s", baseline))
    # the same work in CPU time (main process + its 2 workers, against every thread of dsc's loader)
    ref_cpu = cpu_per_image(ref_epoch, N, lambda: [w.pid for w in getattr(ref._iterator, "_workers", [])])
    tv_cpu, packed_cpu = cpu_per_image(lambda: epoch(tv), N), cpu_per_image(lambda: epoch(packed), N)
    print(f"  CPU ms per image: DataLoader {ref_cpu:.2f}, format='torchvision' {tv_cpu:.2f} "
          f"({ref_cpu / tv_cpu:.2f}x less), dict {packed_cpu:.2f} ({ref_cpu / packed_cpu:.2f}x less)")
    # what lets the Loader's second thread help: how often a filler hands the GIL over (each torch call made
    # from Python releases and retakes it; the scripted kernels' ops never reach Python), and 1 against 2
    # threads in the same minutes (wall clock: on a busy machine only the calls and the CPU are steady)
    one = dsc.Loader(ds, batch_size=16, order="random", num_threads=0, transforms=[T.RandomHorizontalFlip()],
                     format="torchvision")
    epoch(one)
    with _TorchCalls() as calls:
        epoch(one)
    rates = {}
    for threads in (1, 2):
        loader = dsc.Loader(ds, batch_size=16, order="random", num_threads=threads,
                            transforms=[T.RandomHorizontalFlip()], format="torchvision")
        epoch(loader)
        rates[threads] = (N / best_of(lambda: epoch(loader), repeat=3), cpu_per_image(lambda: epoch(loader), N))
    print(f"  format='torchvision': {calls.n / -(-N // 16):.0f} torch calls from Python a batch of 16; 1 thread "
          f"{rates[1][0]:,.0f} img/s ({rates[1][1]:.2f} CPU ms/img), 2 threads {rates[2][0]:,.0f} img/s "
          f"({rates[2][1]:.2f} CPU ms/img): x{rates[2][0] / rates[1][0]:.2f}; load {os.getloadavg()[0]:.1f}")


class _TorchCalls:
    """Counts the torch calls made from Python in its block (attribute reads left out)."""

    def __new__(cls):
        from torch.overrides import TorchFunctionMode

        class Mode(TorchFunctionMode):
            n = 0

            def __torch_function__(self, func, types, args=(), kwargs=None):
                self.n += getattr(func, "__name__", "") != "__get__"
                return func(*args, **(kwargs or {}))
        return Mode()


if __name__ == "__main__":
    main()
