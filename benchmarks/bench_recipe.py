"""The standard training recipe on CPU: RandomResizedCrop(224) + flip + ToFloat + Normalize through
dsc.Loader (fused into the gather), beside plain epochs of the same dataset and a lean torch DataLoader
doing the recipe per image from the source JPEGs with PIL (2 persistent workers). Same run, same images:
4,000 JPEGs of 256-384 px, compiled at 256 (fixed center-crop, and ragged with the longest side <= 256)."""
from __future__ import annotations

from common import BENCH_DIR, cached, row

N_CLASSES, PER_CLASS = 8, 500


def sources():
    from dsc.synthetic import write_imagefolder

    return cached(f"recipe-src-{N_CLASSES * PER_CLASS}",
                  lambda root: write_imagefolder(root, N_CLASSES, PER_CLASS, size_range=(256, 384), seed=0))


def compiled(src, name: str, **options):
    import dsc

    out = BENCH_DIR / f"recipe-{name}.dsc"
    if not out.exists():
        dsc.compile_imagefolder(src, out, progress=False, **options)
    return dsc.open(out)


def main() -> None:
    from dsc.bench import recipe_rates

    src = sources()
    print(f"training recipe on CPU: {N_CLASSES * PER_CLASS} JPEGs 256-384 px, RandomResizedCrop(224) + flip + "
          f"ToFloat + Normalize, batch 256, random order, 2 threads")
    pil = None
    for name, opts in (("fixed 256x256", dict(size=256)), ("ragged, side <= 256", dict(max_side=256))):
        ds = compiled(src, name.split()[0], **opts)
        r = recipe_rates(ds, epochs=3, baseline_limit=None if pil is None else 0)
        pil = pil or r["pil_recipe"]
        print(row(f"dsc.Loader plain epochs, {name}", r["plain"], "img/s", None, "(copy speed)"))
        print(row(f"dsc.Loader + recipe, {name}", r["recipe"], "img/s", pil,
                  f"vs the PIL DataLoader; {r['recipe'] / r['plain']:.0%} of plain epochs"))
    print(row("torch DataLoader(2 workers), PIL decode + recipe per image", pil, "img/s", None, "(baseline)"))


if __name__ == "__main__":
    main()
