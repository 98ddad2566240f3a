"""Value fields in an epoch: 224x224 images with a 768-d float16 embedding and a ~100-byte caption, beside the
same images without them (same run; goal: at most 10% slower)."""
from __future__ import annotations

import numpy as np

from common import BENCH_DIR, best_of, row

N = 2048
CAPTION = "a photograph of a small {} standing on a wooden table beside a window, in soft afternoon light #{:05d}"


class Pictures:
    """N 224x224 images made on demand (in the compile's workers), with or without value fields."""

    def __init__(self, fields: bool):
        self.fields = fields

    def __len__(self):
        return N

    def __getitem__(self, i):
        rng = np.random.default_rng(i)
        image = np.repeat(np.repeat(rng.integers(0, 255, (56, 56, 3), np.uint8), 4, 0), 4, 1)
        if not self.fields:
            return image, i % 16
        emb = rng.standard_normal(768).astype(np.float16)
        return image, {"label": i % 16, "emb": emb, "caption": CAPTION.format("cat", i)}


def compiled(fields: bool):
    import dsc

    out = BENCH_DIR / f"fields224-{N}-{'with' if fields else 'without'}.dsc"
    if not out.exists():
        dsc.compile(Pictures(fields), out, size=224, resize="stretch", progress=False)
    return dsc.open(out)


def epoch(ds, keys=None) -> None:
    import dsc

    for _ in dsc.Loader(ds, batch_size=256, order="random", seed=0, keys=keys):
        pass


def main() -> None:
    plain, rich = compiled(False), compiled(True)
    print(f"value fields: an epoch of {N} 224x224 images, random order, batch 256 (best of 5)")
    epoch(plain), epoch(rich)  # page cache warm for both
    t_plain = t_rich = 0.0
    for _ in range(2):  # interleaved, so both see the same machine
        t_plain = min(t_plain or 1e9, best_of(lambda: epoch(plain), 5))
        t_rich = min(t_rich or 1e9, best_of(lambda: epoch(rich), 5))
    base = N / t_plain
    print(row("image + label", base, "img/s", base))
    print(row("image + label + emb f16[768] + caption", N / t_rich, "img/s", base,
              f"{(t_rich / t_plain - 1) * 100:+.1f}% time (goal <= +10%)"))


if __name__ == "__main__":
    main()
