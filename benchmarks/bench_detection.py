"""Detection epoch: packed batches from a compiled COCO set vs decoding the JPEGs + parsing the
annotations + letterboxing each epoch (the classic detection input pipeline), same images, same run."""
from __future__ import annotations

import json

import numpy as np

from common import BENCH_DIR, best_of, cached, row

SIZE = 640


def classic_epoch(ann_path, images_dir, limit=None) -> int:
    from PIL import Image, ImageOps

    data = json.loads(ann_path.read_text())
    per_image = {}
    for a in data["annotations"]:
        per_image.setdefault(a["image_id"], []).append(a["bbox"])
    n = 0
    for im_info in data["images"][:limit]:
        with Image.open(images_dir / im_info["file_name"]) as im:
            im = ImageOps.exif_transpose(im).convert("RGB")
            s = min(SIZE / im.width, SIZE / im.height)
            nw, nh = round(im.width * s), round(im.height * s)
            canvas = np.zeros((SIZE, SIZE, 3), np.uint8)
            canvas[:nh, :nw] = np.asarray(im.resize((nw, nh), Image.Resampling.BILINEAR))
            b = np.array(per_image.get(im_info["id"], []), np.float32).reshape(-1, 4)
            b[:, 2:] += b[:, :2]
            b *= s
        n += 1
    return n


def main() -> None:
    import dsc
    from dsc.synthetic import detection_scenes, write_coco

    root = cached("coco-400", lambda r: write_coco(r, detection_scenes(400, seed=0, size_range=(400, 640),
                                                                        ext=".jpg")))
    ann, images = root / "annotations.json", root / "images"
    out = BENCH_DIR / "coco-400.dsc"
    print(f"detection: 400 JPEG scenes 400-640 px with boxes -> letterbox {SIZE}x{SIZE}")
    dsc.compile_coco(ann, images, out, size=SIZE, resize="pad", overwrite=True, progress=False)
    classic = 100 / best_of(lambda: classic_epoch(ann, images, limit=100), repeat=2)
    loader = dsc.Loader(dsc.open(out), batch_size=32, order="random")  # boxes packed via the box-offset index

    def epoch():
        for _ in loader:
            pass
    epoch()
    rate = len(loader.dataset) / best_of(epoch, repeat=3)
    print(row("decode JPEG + parse JSON + letterbox, 1 core", classic, "img/s", None, "(baseline)"))
    print(row("dsc.Loader packed detection batches of 32", rate, "img/s", classic))


if __name__ == "__main__":
    main()
