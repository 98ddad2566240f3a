"""Batched CPU augmentation cost: dsc.Loader + dsc.transforms vs the bare loader, and vs the same
augmentation done per image with PIL in a torch DataLoader(num_workers=2), same data, same run."""
from __future__ import annotations

import time

import numpy as np
import torch

from common import compiled_224, row

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


class PILAugmented(torch.utils.data.Dataset):
    """Per-image RandomResizedCrop + flip + to-float + normalise with PIL, reading the compiled samples."""

    def __init__(self, path):
        self.path = path
        self.ds = None

    def __len__(self):
        import dsc

        return len(dsc.open(self.path))

    def __getitem__(self, i):
        import dsc
        from PIL import Image

        from dsc import transforms as T

        if self.ds is None:
            self.ds = dsc.open(self.path)
        im = Image.fromarray(self.ds[i]["image"].numpy())
        gen = torch.Generator().manual_seed(i)
        t, l, h, w = (float(v) for v in T.RandomResizedCrop(224).params(torch.tensor([[im.height, im.width]]), gen))
        im = im.resize((224, 224), Image.Resampling.BILINEAR, box=(l, t, l + w, t + h))
        if torch.rand(1, generator=gen).item() < 0.5:
            im = im.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        x = torch.from_numpy(np.asarray(im).copy()).permute(2, 0, 1).float().div_(255)
        return (x - torch.tensor(MEAN).view(3, 1, 1)) / torch.tensor(STD).view(3, 1, 1)


def rate_of(loader, limit=None) -> float:
    """Images/s after the first batch (worker start-up and warm-up are not timed)."""
    it = iter(loader)
    next(it)
    t0, n = time.perf_counter(), 0
    for b in it:
        n += len(b["index"]) if isinstance(b, dict) else len(b)
        if limit and n >= limit:
            break
    return n / (time.perf_counter() - t0)


def main() -> None:
    import dsc
    from dsc import transforms as T

    path = compiled_224()
    ds = dsc.open(path)
    chain = [T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToFloat(), T.Normalize(MEAN, STD)]
    bare = dsc.Loader(ds, batch_size=256, order="random")
    aug = dsc.Loader(ds, batch_size=256, order="random", transforms=chain)
    rate_of(bare)
    bare_rate = rate_of(bare)
    aug_rate = rate_of(aug, limit=4096)
    pil = torch.utils.data.DataLoader(PILAugmented(path), batch_size=256, num_workers=2, shuffle=True)
    pil_rate = rate_of(pil, limit=2048)
    print("transforms on CPU: RandomResizedCrop(224) + flip + ToFloat + Normalize, batch 256")
    print(row("dsc.Loader, no transforms", bare_rate, "img/s", None, "(baseline)"))
    print(row("dsc.Loader + dsc.transforms (one resampling pass)", aug_rate, "img/s", bare_rate,
              f"{256 / aug_rate * 1e3:.0f} ms/batch; {aug_rate / pil_rate:.2f}x the PIL DataLoader"))
    print(row("torch DataLoader(num_workers=2), PIL per image", pil_rate, "img/s", bare_rate))


if __name__ == "__main__":
    main()
