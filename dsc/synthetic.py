"""Procedural images for the demo, the tests and the benchmarks: no downloads, no binary blobs.

Scenes are a colour gradient, a few filled shapes and mild noise, so JPEG files come out at
realistic sizes (about 40-120 kB for 500x375) rather than the few kB of flat test images.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw
from .compiler.sources.voc import VOC_CLASSES


def make_scene(rng: np.random.Generator, height: int, width: int, noise: float = 12.0) -> Image.Image:
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    c0, c1 = rng.uniform(0, 255, 3), rng.uniform(0, 255, 3)
    angle = rng.uniform(0, 2 * np.pi)
    t = (np.cos(angle) * xx / max(1, width - 1) + np.sin(angle) * yy / max(1, height - 1))
    t = (t - t.min()) / max(1e-6, float(t.max() - t.min()))
    img = c0 * (1 - t[..., None]) + c1 * t[..., None]
    img += rng.normal(0, noise, img.shape)
    im = Image.fromarray(np.clip(img, 0, 255).astype(np.uint8), "RGB")
    draw = ImageDraw.Draw(im)
    for _ in range(int(rng.integers(2, 6))):
        x0, y0 = rng.uniform(0, width * 0.8), rng.uniform(0, height * 0.8)
        x1 = x0 + rng.uniform(min(8, width / 2), max(8, width / 2))
        y1 = y0 + rng.uniform(min(8, height / 2), max(8, height / 2))
        color = tuple(int(c) for c in rng.integers(0, 256, 3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)([x0, y0, x1, y1], fill=color)
    return im


def write_imagefolder(root: str | os.PathLike, num_classes: int = 4, per_class: int = 25,
                      size_range: tuple[int, int] = (300, 500), seed: int = 0, quality: int = 90,
                      fmt: str = "JPEG") -> list[Path]:
    """Write ``root/class_XX/img_XXXXX.jpg`` scenes with sides drawn from ``size_range``."""
    rng = np.random.default_rng(seed)
    root = Path(root)
    paths = []
    ext = {"JPEG": ".jpg", "PNG": ".png"}[fmt]
    for c in range(num_classes):
        d = root / f"class_{c:02d}"
        d.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            h, w = (int(v) for v in rng.integers(size_range[0], size_range[1] + 1, 2))
            p = d / f"img_{i:05d}{ext}"
            make_scene(rng, h, w).save(p, fmt, **({"quality": quality} if fmt == "JPEG" else {}))
            paths.append(p)
    return paths


def pack_webdataset(folder: str | os.PathLike, out: str | os.PathLike, per_tar: int = 100,
                    extras: bool = True) -> list[Path]:
    """The images of an ImageFolder ``folder`` (in its order) as WebDataset tars ``out/00000.tar``...: sample
    ``<class>_<stem>`` holds ``.<ext>`` (the file's bytes), ``.cls`` (the class index) and, with ``extras``,
    ``.json`` ({"label", "file"}) and ``.txt``. The same images as the folder, for comparing the two sources."""
    import io
    import json
    import tarfile

    folder, out = Path(folder), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    classes = sorted(d.name for d in folder.iterdir() if d.is_dir() and not d.name.startswith("."))
    files = [(c, p) for c, name in enumerate(classes) for p in sorted((folder / name).rglob("*")) if p.is_file()]
    tars = []
    for t, start in enumerate(range(0, len(files), per_tar)):
        tars.append(out / f"{t:05d}.tar")
        with tarfile.open(tars[-1], "w", format=tarfile.USTAR_FORMAT) as tf:
            for c, p in files[start:start + per_tar]:
                key = f"{classes[c]}_{p.stem}".replace(".", "_")
                members = [(p.suffix.lower().lstrip("."), p.read_bytes()), ("cls", str(c).encode())]
                if extras:
                    members += [("json", json.dumps({"label": c, "file": p.name}).encode()),
                                ("txt", f"a picture of {classes[c]}".encode())]
                for ext, data in members:
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size, info.mtime = len(data), 0
                    tf.addfile(info, io.BytesIO(data))
    return tars


# ----------------------------------------------------------------------------- detection scenes
DET_CATEGORIES = [(3, "cat"), (7, "dog"), (12, "bird")]  # non-contiguous ids, like COCO's
BACKGROUND = (90, 90, 90)
_COLORS = [(220, 40, 40), (40, 200, 60), (40, 80, 230), (240, 200, 30), (200, 40, 220), (30, 210, 210)]
# PIL transpose that turns the displayed image into the stored raw pixels for each EXIF orientation
_TO_RAW = {2: Image.Transpose.FLIP_LEFT_RIGHT, 3: Image.Transpose.ROTATE_180, 4: Image.Transpose.FLIP_TOP_BOTTOM,
           5: Image.Transpose.TRANSPOSE, 6: Image.Transpose.ROTATE_90, 7: Image.Transpose.TRANSVERSE,
           8: Image.Transpose.ROTATE_270}


def _raw_box(box, disp_size, orientation):
    """The box's frame in the raw pixels, found by transposing a mask (independent of dsc's formulas)."""
    if orientation == 1:
        return list(box)
    mask = Image.new("L", disp_size, 0)
    ImageDraw.Draw(mask).rectangle([box[0], box[1], box[2] - 1, box[3] - 1], fill=255)
    return list(mask.transpose(_TO_RAW[orientation]).getbbox())


def detection_scenes(n: int = 12, seed: int = 0, size_range=(60, 160), ext: str = ".png") -> list[dict]:
    """Scene specs: flat background, non-overlapping solid rectangles exactly at integer boxes (xyxy,
    displayed frame), various sizes and EXIF orientations, some crowd boxes, some images without boxes."""
    rng = np.random.default_rng(seed)
    scenes = []
    for k in range(n):
        w, h = (int(v) for v in rng.integers(size_range[0], size_range[1] + 1, 2))
        boxes, labels, colors = [], [], []
        if k % 5 != 4:  # every fifth image is a negative
            for _ in range(int(rng.integers(1, 5))):
                bw, bh = int(rng.integers(12, max(13, w // 2))), int(rng.integers(12, max(13, h // 2)))
                x0, y0 = int(rng.integers(0, w - bw + 1)), int(rng.integers(0, h - bh + 1))
                b = [x0, y0, x0 + bw, y0 + bh]
                if all(b[2] + 3 <= o[0] or o[2] + 3 <= b[0] or b[3] + 3 <= o[1] or o[3] + 3 <= b[1] for o in boxes):
                    boxes.append(b)
                    labels.append(int(rng.integers(0, len(DET_CATEGORIES))))
                    colors.append(_COLORS[len(colors) % len(_COLORS)])
        orientation = [1, 6, 3, 8, 1, 5, 2, 1, 7, 4][k % 10]
        scenes.append({"file": f"scene_{k:03d}{ext}", "width": w, "height": h, "boxes": boxes, "labels": labels,
                       "colors": colors, "orientation": orientation, "iscrowd": [int(j == 1) for j in range(len(boxes))],
                       # COCO files sometimes give the raw (un-rotated) size: then boxes are in the raw frame
                       "raw_frame": orientation in (5, 6, 7, 8) and k < 10})
    return scenes


def _write_scene_image(scene: dict, path: Path) -> None:
    """PNG (lossless, for exact tests) or, by the file's extension, TIFF (lossless; Pillow applies its
    orientation as it loads) or JPEG with noise (realistic sizes)."""
    jpeg = path.suffix.lower() in (".jpg", ".jpeg")
    if jpeg:
        im = make_scene(np.random.default_rng(scene["width"] * 7919 + scene["height"]), scene["height"], scene["width"])
    else:
        im = Image.new("RGB", (scene["width"], scene["height"]), BACKGROUND)
    draw = ImageDraw.Draw(im)
    for b, c in zip(scene["boxes"], scene["colors"]):
        draw.rectangle([b[0], b[1], b[2] - 1, b[3] - 1], fill=c)  # PIL's rectangle includes x1: cover [x0, x1)
    o = scene["orientation"]
    exif = Image.Exif()
    if o != 1:
        im = im.transpose(_TO_RAW[o])
        exif[0x0112] = o
    path.parent.mkdir(parents=True, exist_ok=True)
    fmt = "JPEG" if jpeg else "TIFF" if path.suffix.lower() in (".tif", ".tiff") else "PNG"
    im.save(path, fmt, exif=exif, **({"quality": 90} if jpeg else {}))


def _rect_rle(box, w: int, h: int) -> dict:
    """Uncompressed COCO RLE (column-major runs, starting with zeros) of an integer rectangle."""
    m = np.zeros((h, w), bool)
    m[box[1]:box[3], box[0]:box[2]] = True
    flat = m.T.reshape(-1)
    bounds = np.concatenate([[0], np.flatnonzero(flat[1:] != flat[:-1]) + 1, [flat.size]])
    counts = np.diff(bounds).tolist()
    return {"size": [h, w], "counts": ([0] if flat[0] else []) + [int(c) for c in counts]}


def write_coco(root: str | os.PathLike, scenes: list[dict], segmentation: bool = False) -> tuple[Path, Path]:
    """images/ + annotations.json; returns (annotations, images folder). ``segmentation``: each annotation
    also gets its rectangle as a polygon, a crowd annotation as uncompressed RLE."""
    import json

    root = Path(root)
    images, anns = [], []
    for iid, s in enumerate(scenes, start=100):
        _write_scene_image(s, root / "images" / s["file"])
        w, h = s["width"], s["height"]
        size = (h, w) if s["raw_frame"] else (w, h)  # raw size of a 90-degree orientation swaps the sides
        images.append({"id": iid, "file_name": s["file"], "width": size[0], "height": size[1]})
        for b, lab, crowd in zip(s["boxes"], s["labels"], s["iscrowd"]):
            x0, y0, x1, y1 = _raw_box(b, (w, h), s["orientation"]) if s["raw_frame"] else b
            anns.append({"id": len(anns) + 1, "image_id": iid, "category_id": DET_CATEGORIES[lab][0],
                         "bbox": [x0, y0, x1 - x0, y1 - y0], "area": float((x1 - x0) * (y1 - y0)), "iscrowd": crowd})
            if segmentation:
                anns[-1]["segmentation"] = (_rect_rle([x0, y0, x1, y1], *size) if crowd else
                                            [[x0, y0, x1, y0, x1, y1, x0, y1]])
    ann_path = root / "annotations.json"
    ann_path.write_text(json.dumps({"images": images, "annotations": anns,
                                    "categories": [{"id": i, "name": n} for i, n in DET_CATEGORIES]}))
    return ann_path, root / "images"


def write_yolo(root: str | os.PathLike, scenes: list[dict], split: str = "train") -> Path:
    root = Path(root)
    for s in scenes:
        _write_scene_image(s, root / "images" / split / s["file"])
        lines = []
        for b, lab in zip(s["boxes"], s["labels"]):
            w, h = s["width"], s["height"]
            lines.append(f"{lab} {(b[0] + b[2]) / 2 / w:.8f} {(b[1] + b[3]) / 2 / h:.8f} "
                         f"{(b[2] - b[0]) / w:.8f} {(b[3] - b[1]) / h:.8f}")
        if lines or s["file"] != scenes[-1]["file"]:  # the last negative has no label file at all
            (root / "labels" / split).mkdir(parents=True, exist_ok=True)
            (root / "labels" / split / (Path(s["file"]).stem + ".txt")).write_text("\n".join(lines) + "\n")
    names = "\n".join(f"  {k}: {n}" for k, (_, n) in enumerate(DET_CATEGORIES))
    (root / "data.yaml").write_text(f"path: .\n{split}: images/{split}\nnames:\n{names}\n")
    return root


def write_voc(root: str | os.PathLike, scenes: list[dict], split: str = "trainval") -> Path:
    root = Path(root)
    ids = []
    (root / "Annotations").mkdir(parents=True, exist_ok=True)
    for s in scenes:
        iid = Path(s["file"]).stem
        ids.append(iid)
        _write_scene_image(s, root / "JPEGImages" / s["file"])
        objs = "".join(
            f"<object><name>{DET_CATEGORIES[lab][1]}</name><difficult>{int(k == 0)}</difficult><truncated>0</truncated>"
            f"<bndbox><xmin>{b[0] + 1}</xmin><ymin>{b[1] + 1}</ymin><xmax>{b[2]}</xmax><ymax>{b[3]}</ymax></bndbox>"
            f"</object>" for k, (b, lab) in enumerate(zip(s["boxes"], s["labels"])))
        (root / "Annotations" / f"{iid}.xml").write_text(
            f"<annotation><filename>{s['file']}</filename><size><width>{s['width']}</width>"
            f"<height>{s['height']}</height><depth>3</depth></size>{objs}</annotation>")
    (root / "ImageSets" / "Main").mkdir(parents=True, exist_ok=True)
    (root / "ImageSets" / "Main" / f"{split}.txt").write_text("\n".join(ids) + "\n")
    return root


# ----------------------------------------------------------------------------- segmentation scenes
SEG_CLASSES = ("background", "sky", "road", "car", "person")
SEG_COLORS = [(90, 90, 90), (70, 130, 230), (200, 60, 200), (240, 200, 30), (40, 200, 60)]


def seg_scenes(n: int = 8, seed: int = 0, size_range=(48, 120)) -> list[dict]:
    """Scene specs for segmentation: each a background and a few shapes (rectangles, ellipses) of classes
    1..4 drawn in order; class k has colour SEG_COLORS[k], so the mask can be read back from the pixels.
    Various sizes and EXIF orientations; ``raw_mask`` says the mask file is stored in the raw frame."""
    rng = np.random.default_rng(seed)
    out = []
    for k in range(n):
        w, h = (int(v) for v in rng.integers(size_range[0], size_range[1] + 1, 2))
        shapes = []
        for _ in range(int(rng.integers(2, 5))):
            bw, bh = int(rng.integers(w // 5, w // 2 + 1)), int(rng.integers(h // 5, h // 2 + 1))
            x0, y0 = int(rng.integers(0, w - bw + 1)), int(rng.integers(0, h - bh + 1))
            shapes.append(("ellipse" if rng.random() < 0.4 else "rectangle", [x0, y0, x0 + bw, y0 + bh],
                           int(rng.integers(1, len(SEG_CLASSES)))))
        orientation = [1, 6, 3, 8, 4, 5, 2, 7][k % 8]
        out.append({"file": f"seg_{k:03d}", "width": w, "height": h, "shapes": shapes, "orientation": orientation,
                    "raw_mask": orientation in (5, 6, 7, 8) and k % 4 == 1})
    return out


def seg_mask(scene: dict) -> np.ndarray:
    """The scene's mask in the displayed frame: 0 background, each shape's class drawn over earlier ones."""
    im = Image.new("L", (scene["width"], scene["height"]), 0)
    draw = ImageDraw.Draw(im)
    for kind, (x0, y0, x1, y1), cls in scene["shapes"]:
        (draw.ellipse if kind == "ellipse" else draw.rectangle)([x0, y0, x1 - 1, y1 - 1], fill=cls)
    return np.asarray(im)


def seg_image(scene: dict) -> Image.Image:
    """The scene's displayed RGB image: every pixel the colour of its class."""
    return Image.fromarray(np.asarray(SEG_COLORS, np.uint8)[seg_mask(scene)], "RGB")


def _save_oriented(im: Image.Image, path: Path, orientation: int) -> None:
    exif = Image.Exif()
    if orientation != 1:
        im = im.transpose(_TO_RAW[orientation])
        exif[0x0112] = orientation
    path.parent.mkdir(parents=True, exist_ok=True)
    im.save(path, exif=exif)


def write_segfolder(root: str | os.PathLike, scenes: list[dict], ext: str = ".png") -> Path:
    """ROOT/images/<file><ext> (stored raw with its EXIF orientation) + ROOT/masks/<file>.png (8-bit grey,
    displayed frame, or the raw frame when ``raw_mask``)."""
    root = Path(root)
    for s in scenes:
        _save_oriented(seg_image(s), root / "images" / f"{s['file']}{ext}", s["orientation"])
        mask = Image.fromarray(seg_mask(s), "L")
        if s["raw_mask"]:
            mask = mask.transpose(_TO_RAW[s["orientation"]])
        (root / "masks").mkdir(parents=True, exist_ok=True)
        mask.save(root / "masks" / f"{s['file']}.png")
    return root


def write_voc_segmentation(root: str | os.PathLike, scenes: list[dict], split: str = "train") -> Path:
    """A VOC segmentation split of detection scenes: JPEGImages, Annotations, ImageSets/Segmentation and
    SegmentationClass palette PNGs whose index is the VOC class + 1, with 255 on each object's border."""

    root = Path(root)
    write_voc(root, scenes, split)
    (root / "ImageSets" / "Segmentation").mkdir(parents=True, exist_ok=True)
    (root / "ImageSets" / "Segmentation" / f"{split}.txt").write_text(
        "\n".join(Path(s["file"]).stem for s in scenes) + "\n")
    (root / "SegmentationClass").mkdir(exist_ok=True)
    palette = [v for k in range(256) for v in ((k * 37) % 256, (k * 91) % 256, (k * 53) % 256)]
    for s in scenes:
        im = Image.new("P", (s["width"], s["height"]), 0)
        im.putpalette(palette)
        draw = ImageDraw.Draw(im)
        for b, lab in zip(s["boxes"], s["labels"]):
            value = VOC_CLASSES.index(DET_CATEGORIES[lab][1]) + 1
            draw.rectangle([b[0], b[1], b[2] - 1, b[3] - 1], fill=value, outline=255)
        im.save(root / "SegmentationClass" / f"{Path(s['file']).stem}.png")
    return root


# ----------------------------------------------------------------------------- instance masks and keypoints
COCO_KEYPOINTS = ("nose", "left_eye", "right_eye", "left_ear", "right_ear", "left_shoulder", "right_shoulder",
                  "left_elbow", "right_elbow", "left_wrist", "right_wrist", "left_hip", "right_hip", "left_knee",
                  "right_knee", "left_ankle", "right_ankle")
COCO_SKELETON = ((16, 14), (14, 12), (17, 15), (15, 13), (12, 13), (6, 12), (7, 13), (6, 7), (6, 8), (7, 9),
                 (8, 10), (9, 11), (2, 3), (1, 2), (1, 3), (2, 4), (3, 5), (4, 6), (5, 7))


def rle_string(counts) -> str:
    """Run lengths -> COCO's compressed RLE string (pycocotools' ``rleToString``)."""
    out = []
    for i, x in enumerate(int(c) for c in counts):
        if i > 2:
            x -= int(counts[i - 2])
        more = True
        while more:
            c = x & 0x1F
            x >>= 5
            more = x != -1 if c & 0x10 else x != 0
            if more:
                c |= 0x20
            out.append(chr(c + 48))
    return "".join(out)


def rle_counts_of(mask: np.ndarray) -> list[int]:
    """(h, w) bool -> column-major run lengths starting with a run of zeros."""
    flat = np.asarray(mask, bool).T.reshape(-1)
    edges = np.flatnonzero(np.diff(flat.astype(np.int8))) + 1
    runs = np.diff(np.concatenate([[0], edges, [len(flat)]])).tolist()
    return ([0] + runs) if len(flat) and flat[0] else runs


def _polygon(rng, cx, cy, r, n=8) -> list[float]:
    a = np.sort(rng.uniform(0, 2 * np.pi, n))
    rr = r * rng.uniform(0.5, 1.0, n)
    return [round(float(v), 2) for xy in zip(cx + rr * np.cos(a), cy + rr * np.sin(a)) for v in xy]


def write_coco_instances(root: str | os.PathLike, n: int = 8, seed: int = 0, size_range=(48, 96), people: int = 4,
                         orientations: bool = False, ext: str = ".png") -> tuple[Path, Path]:
    """A COCO person_keypoints-like set: per image ``people`` overlapping persons (polygons, 17 keypoints,
    some hidden), a two-polygon object, an RLE object with a hole (compressed counts) and a crowd
    (uncompressed RLE), each bbox the extent of its mask. ``orientations``: images carry EXIF orientations
    1-8 in turn (annotations in the displayed frame). Returns (annotations JSON, images folder)."""
    import json

    from .compiler.masks import segmentation_mask  # lazy: the compiler's rasteriser gives the bboxes

    rng = np.random.default_rng(seed)
    root = Path(root)
    img_dir = root / "images"
    img_dir.mkdir(parents=True, exist_ok=True)
    images, anns = [], []
    for i in range(n):
        h, w = (int(v) for v in rng.integers(size_range[0], size_range[1] + 1, 2))
        name = f"{i:05d}{ext}"
        im = make_scene(rng, h, w)
        if orientations:
            _save_oriented(im, img_dir / name, i % 8 + 1)
        else:
            im.save(img_dir / name)
        images.append({"id": i + 1, "file_name": name, "width": w, "height": h})
        objs = []
        for _ in range(people):
            cx, cy = rng.uniform(0.2 * w, 0.8 * w), rng.uniform(0.2 * h, 0.8 * h)
            kp = []
            for _ in range(17):
                v = int(rng.integers(0, 3))
                kp += [round(float(rng.uniform(0, w)), 2), round(float(rng.uniform(0, h)), 2), v] if v else [0, 0, 0]
            objs.append(dict(category_id=1, segmentation=[_polygon(rng, cx, cy, rng.uniform(0.1, 0.3) * min(h, w))],
                             iscrowd=0, keypoints=kp, num_keypoints=sum(1 for v in kp[2::3] if v)))
        objs.append(dict(category_id=2, iscrowd=0, segmentation=[_polygon(rng, 0.3 * w, 0.3 * h, 0.15 * min(h, w)),
                                                                  _polygon(rng, 0.7 * w, 0.65 * h, 0.15 * min(h, w))]))
        hole = np.zeros((h, w), bool)
        t, l = int(rng.integers(0, h // 2)), int(rng.integers(0, w // 2))
        hole[t:t + h // 3, l:l + w // 3] = True
        hole[t + h // 9:t + 2 * h // 9, l + w // 9:l + 2 * w // 9] = False
        objs.append(dict(category_id=2, iscrowd=0,
                         segmentation={"size": [h, w], "counts": rle_string(rle_counts_of(hole))}))
        crowd = np.zeros((h, w), bool)
        crowd[h // 2:, :w // 3] = True
        objs.append(dict(category_id=1, iscrowd=1, segmentation={"size": [h, w], "counts": rle_counts_of(crowd)}))
        for o in objs:
            m = segmentation_mask(o["segmentation"], h, w)
            ys, xs = np.flatnonzero(m.any(1)), np.flatnonzero(m.any(0))
            o["bbox"] = ([float(xs[0]), float(ys[0]), float(xs[-1] + 1 - xs[0]), float(ys[-1] + 1 - ys[0])]
                         if len(ys) else [0.0, 0.0, 1.0, 1.0])
            o["area"] = float(m.sum())
            o.update(id=len(anns) + 1, image_id=i + 1)
            anns.append(o)
    cats = [{"id": 1, "name": "person", "supercategory": "person", "keypoints": list(COCO_KEYPOINTS),
             "skeleton": [list(e) for e in COCO_SKELETON]}, {"id": 2, "name": "thing"}]
    path = root / "annotations.json"
    path.write_text(json.dumps({"images": images, "annotations": anns, "categories": cats}))
    return path, img_dir
