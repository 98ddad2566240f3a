"""COCO detection: an instances JSON (images, annotations, categories) + an images folder.

Labels are contiguous (categories sorted by id -> 0..C-1) unless ``keep_category_ids``, which stores
the original ids as labels. Original ids and names are kept in the manifest either way. ``bbox`` is
[x, y, width, height] in pixels; ``iscrowd`` and ``area`` (as in the file: original pixels) are kept
per box. Images are compiled in the order of the file's ``images`` list.

``masks="semantic"`` also rasterises every annotation's ``segmentation`` (polygons, or RLE with
pycocotools' semantics: column-major run lengths, plain or compressed counts) into one class-id mask per
image: 0 is background, a category's value is its contiguous label + 1 (with ``keep_category_ids``, its
id); annotations are drawn in file order, later over earlier, and crowd annotations as the ignore index.

``masks="instance"`` stores each annotation's own mask beside its box (``object_masks``: pixel-equal to
pycocotools' ``annToMask``, overlaps and crowds included; crowd regions keep ``iscrowd=1``);
``"instance,semantic"`` both. Keypoints (person_keypoints files: ``annotations[].keypoints`` and the
categories' ``keypoints`` names and 1-based ``skeleton``) are stored whenever the file has them, with the
flip permutation ``keypoint_flip`` gives, else the one the names tell (``flip_index_from_names``: ``left_*`` <->
``right_*``, ``l_``/``r_``, ``_l``/``_r``, ``L``/``R`` prefixes...), else unknown (recorded as null, and a warning).
A polygon part with fewer than 3 points draws nothing (an odd last number is dropped), as pycocotools'
``frPoly`` draws it; an annotation made only of such parts has an empty mask, and the compile says so.
"""
from __future__ import annotations

import json
import math
import os
import posixpath
from pathlib import Path

import numpy as np

from ...errors import SourceError
from ...formats.fields.keypoints import KeypointsSpec, resolve_flip, unknown_flip_warning
from .base import ALLOW_OUTSIDE, DROP_EMPTY, MaskInfo, Param, Record, ScannedSource, Source, Target, read_input
from .imagefolder import is_image_file
from .inputs import check_input, identity, is_remote, join, list_objects, name_of, relative


def _load_json(path: Path) -> dict:
    text = read_input(path, "annotation file")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise SourceError(f"{path}:{e.lineno}:{e.colno}: malformed JSON ({e.msg})") from None
    except RecursionError:
        raise SourceError(f"{path}: malformed JSON (nested too deeply)") from None
    if not isinstance(data, dict):
        raise SourceError(f"{path}: expected a JSON object with images, annotations and categories")
    for key in ("images", "annotations", "categories"):
        if not isinstance(data.get(key), list):
            raise SourceError(f"{path}: '{key}' must be a list (is this a COCO instances file?)")
    return data


def _int(path, what, obj, key):
    v = obj.get(key) if isinstance(obj, dict) else None
    if not isinstance(v, int) or isinstance(v, bool):
        raise SourceError(f"{path}: {what} has no integer '{key}' (got {v!r})")
    return v


MAX_KEPT_ID = 65_535  # --keep-category-ids: class names are stored up to the largest id


def inside(folder: Path, name: str, where: str, allow_outside: bool) -> Path:
    """``folder / name``, refused when ``name`` leaves the folder (``..``, an absolute path) unless allowed.
    (A URL prefix ``folder``: the URL of the object, as text.)"""
    if isinstance(folder, str):
        rel = posixpath.normpath(name)
        if not allow_outside and (name.startswith("/") or rel == ".." or rel.startswith("../")):
            raise SourceError(f"{where}: {name!r} points outside {folder}; dsc reads images only inside the images "
                              f"folder (pass --allow-outside-images, allow_outside_images=True, if this is meant)")
        return join(folder, rel)
    path = Path(os.path.normpath(folder / name))
    if not allow_outside and (os.path.isabs(name) or os.path.commonpath([folder, path]) != str(folder)):
        raise SourceError(f"{where}: {name!r} points outside {folder}; dsc reads images only inside the images "
                          f"folder (pass --allow-outside-images, allow_outside_images=True, if this is meant)")
    return path


def scan_coco(annotations: str | os.PathLike, images: str | os.PathLike, keep_category_ids: bool = False,
              masks: str | None = None, allow_outside_images: bool = False, keypoint_flip=None) -> ScannedSource:
    remote = is_remote(check_input(images))  # images in a bucket: the folder is a URL prefix, kept as text
    ann_path = check_input(annotations) if is_remote(check_input(annotations)) else Path(os.path.abspath(annotations))
    img_dir = check_input(images).rstrip("/") if remote else Path(os.path.abspath(images))
    if not remote and not img_dir.is_dir():
        raise SourceError(f"{img_dir}: no such images directory")
    data = _load_json(ann_path)
    kinds = set(masks.split(",")) if masks else set()
    instance = "instance" in kinds
    masks = "semantic" if "semantic" in kinds else None
    kp_spec = _keypoints_spec(ann_path, data, keypoint_flip)
    K = kp_spec.num_keypoints if kp_spec is not None else 0

    cats = {}
    for k, c in enumerate(data["categories"]):
        cid = _int(ann_path, f"categories[{k}]", c, "id")
        if cid in cats:
            raise SourceError(f"{ann_path}: duplicate category id {cid}")
        cats[cid] = str(c.get("name", cid))
    if not cats:
        raise SourceError(f"{ann_path}: no categories")
    ids = sorted(cats)
    if keep_category_ids:
        if ids[0] < 0:
            raise SourceError(f"{ann_path}: category id {ids[0]} is negative; cannot keep ids as labels")
        if ids[-1] > MAX_KEPT_ID:
            raise SourceError(f"{ann_path}: category id {ids[-1]:,} is above {MAX_KEPT_ID:,}; keeping ids as labels "
                              f"would store a name for every id below it. Drop --keep-category-ids")
        label_of = {i: i for i in ids}
        classes = tuple(cats.get(i, "") for i in range(ids[-1] + 1))
    else:
        label_of = {i: k for k, i in enumerate(ids)}
        classes = tuple(cats[i] for i in ids)
    mask_info = None
    if masks:  # mask values: 0 background, then each category's label + 1 (kept ids: the id itself)
        if keep_category_ids:
            if ids[0] == 0:
                raise SourceError(f"{ann_path}: category id 0 would collide with the background value 0 of "
                                  f"--masks semantic; drop --keep-category-ids")
            mask_value = {i: i for i in ids}
            mask_classes = ("background",) + classes[1:]
        else:
            mask_value = {i: k + 1 for k, i in enumerate(ids)}
            mask_classes = ("background",) + classes
        mask_info = MaskInfo(classes=mask_classes)

    images, order = {}, []
    for k, im in enumerate(data["images"]):
        iid = _int(ann_path, f"images[{k}]", im, "id")
        if iid in images:
            raise SourceError(f"{ann_path}: duplicate image id {iid} (images[{k}])")
        name = im.get("file_name")
        if not isinstance(name, str) or not name:
            raise SourceError(f"{ann_path}: images[{k}] (id {iid}) has no file_name")
        w, h = im.get("width"), im.get("height")
        size = (w, h) if isinstance(w, int) and isinstance(h, int) else None
        images[iid] = (name, size)
        order.append(iid)

    per_image: dict[int, list] = {iid: [] for iid in images}
    short: list = []  # annotations with polygon parts pycocotools draws as nothing (fewer than 3 points)
    bad: dict[int, str] = {}  # image id -> why it cannot be compiled (a bad sample: --on-error decides)
    for k, a in enumerate(data["annotations"]):
        aid = a.get("id", f"#{k}") if isinstance(a, dict) else f"#{k}"
        iid = _int(ann_path, f"annotation {aid}", a, "image_id")
        if iid not in images:
            raise SourceError(f"{ann_path}: annotation {aid} refers to image_id {iid}, which is not in 'images'")
        cid = _int(ann_path, f"annotation {aid}", a, "category_id")
        if cid not in cats:
            raise SourceError(f"{ann_path}: annotation {aid} has category_id {cid}, which is not in 'categories'")
        bbox = a.get("bbox")
        if (not isinstance(bbox, list) or len(bbox) != 4
                or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in bbox)):
            raise SourceError(f"{ann_path}: annotation {aid} has bbox {bbox!r}; expected [x, y, width, height]")
        area = a.get("area", bbox[2] * bbox[3])
        crowd = int(bool(a.get("iscrowd", 0)))
        negative = [f"{what} ({json.dumps(v)})" for what, v in (("width", bbox[2]), ("height", bbox[3])) if v < 0]
        if negative:  # said here, as written: once made x0 y0 x1 y1 the box no longer shows what is wrong
            bad.setdefault(iid, f"{ann_path}: annotation {aid} has bbox {json.dumps(bbox)} with a negative "
                                f"{' and '.join(negative)}; COCO's bbox is [x, y, width, height]: fix the annotation")
        seg = shape = None
        if masks or instance:
            shape = a.get("segmentation")
            if not _valid_segmentation(shape):  # the image cannot get its mask: a bad sample (--on-error)
                bad.setdefault(iid, f"{ann_path}: annotation {aid} has no usable 'segmentation' (polygons "
                                    f"[[x, y, ...]] or RLE {{counts, size}}); --masks needs one per annotation")
            elif isinstance(shape, list) and any(len(p) < 6 or len(p) % 2 for p in shape):
                short.append(aid)
            seg = (shape, -1 if crowd else mask_value[cid]) if masks else None
        kp = None
        if K:
            kp = a.get("keypoints")
            if kp is None:
                kp = [0] * (3 * K)
            if (not isinstance(kp, list) or len(kp) != 3 * K or not all(
                    isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in kp)):
                bad.setdefault(iid, f"{ann_path}: annotation {aid} has keypoints that are not {K} (x, y, v) "
                                    f"triples of numbers; fix them")
                kp = [0] * (3 * K)
        per_image[iid].append((bbox, label_of[cid], crowd,
                               float(area) if isinstance(area, (int, float)) else math.nan, seg, shape, kp))

    records, invalid = [], []
    for iid in order:
        name, size = images[iid]
        if iid in bad:
            invalid.append((name, bad[iid]))
            continue
        anns = per_image[iid]
        b = np.array([a[0] for a in anns], np.float64).reshape(-1, 4)
        b[:, 2:] += b[:, :2]  # xywh -> xyxy
        target = Target(boxes=b, labels=np.array([a[1] for a in anns], np.int64), image_id=iid,
                        source=f"{ann_path} (image id {iid}, {name})", size=size,
                        attrs={"iscrowd": np.array([a[2] for a in anns], np.uint8),
                               "area": np.array([a[3] for a in anns], np.float32)},
                        segments=tuple(a[4] for a in anns) if masks else (),
                        shapes=tuple(a[5] for a in anns) if instance else (),
                        keypoints=np.array([a[6] for a in anns], np.float64).reshape(-1, K, 3) if K else None)
        path = inside(img_dir, name, f"{ann_path} (image id {iid})", allow_outside_images)
        records.append(Record(key=name, path=str(path), target=target))
    if not records and not invalid:
        raise SourceError(f"{ann_path}: no images to compile")
    _check_images_folder(img_dir, ann_path, records)

    listed = {images[i][0] for i in order}
    names = ([relative(u, img_dir) for u, _ in list_objects(img_dir)] if remote else
             [p.name for p in img_dir.iterdir()])
    unlisted = sum(1 for n in names if "/" not in n and is_image_file(n) and n not in listed)
    warnings = []
    if short:
        warnings.append(f"{len(short)} annotations of {name_of(str(ann_path))} (the first: id {short[0]}) have polygon "
                        f"parts of fewer than 3 points (e.g. [x1, y1, x2, y2]: they draw nothing) or of an odd count "
                        f"of numbers (the last is dropped), drawn as pycocotools' frPoly draws them; an annotation "
                        f"made only of parts of fewer than 3 points has an empty mask")
    if kp_spec is not None and kp_spec.flip_index is None:
        warnings.append(unknown_flip_warning(K, "with --keypoint-flip (keypoint_flip=): the joint each becomes under a "
                                                "horizontal flip, 0-based, e.g. 0,2,1,4,3 (0,1,2,... if none swap), "
                                                "or name the joints left_*/right_* (or l_/r_, L/R prefixes) in the "
                                                "category's 'keypoints'"))
    if unlisted:
        warnings.append(f"{unlisted} image files in {img_dir} are not in {name_of(str(ann_path))} and are not "
                        f"compiled")
    return ScannedSource(
        kind="coco", root=str(img_dir), task="detection", records=records, classes=classes,
        category_ids=tuple(ids), attributes={"iscrowd": "uint8", "area": "float32"}, warnings=tuple(warnings),
        masks=mask_info, invalid=tuple(invalid), instance_masks=instance, keypoints=kp_spec,
        summary={"kind": "coco", "annotations": str(ann_path), "images": str(img_dir),
                 "num_images": len(order), "num_annotations": len(data["annotations"]),
                 "unlisted_image_files": unlisted,
                 "labels": "category_ids" if keep_category_ids else "contiguous",
                 **({"masks": ",".join(sorted(kinds))} if kinds else {}),
                 **({"keypoints": K} if K else {})})


def _keypoints_spec(ann_path: Path, data: dict, keypoint_flip=None) -> KeypointsSpec | None:
    """The keypoints every annotation has K of, named by the categories that name them; None without any."""
    named = [c for c in data["categories"] if isinstance(c, dict) and c.get("keypoints")]
    counts = {len(a["keypoints"]) for a in data["annotations"] if isinstance(a, dict)
              and isinstance(a.get("keypoints"), list) and a["keypoints"]}
    if not named and not counts:
        if keypoint_flip:
            raise SourceError(f"--keypoint-flip: {name_of(str(ann_path))} has no keypoints")
        return None
    names = named[0]["keypoints"] if named else []
    if any(c["keypoints"] != names for c in named):
        raise SourceError(f"{ann_path}: categories name different keypoints ({named[0].get('name')!r} and others); "
                          f"dsc stores one keypoint list per dataset")
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise SourceError(f"{ann_path}: a category's 'keypoints' must be a list of joint names")
    K = len(names) or (max(counts) // 3)
    if not names and counts - {3 * K}:  # with names, an annotation of another length is that image's problem
        raise SourceError(f"{ann_path}: annotations have keypoint lists of {sorted(counts)} numbers; with {K} "
                          f"joints each must have {3 * K} (x, y, v per joint)")
    skeleton = named[0].get("skeleton") or [] if named else []
    try:
        edges = tuple((int(a) - 1, int(b) - 1) for a, b in skeleton)  # COCO's skeleton is 1-based
    except Exception as e:  # noqa: BLE001 - a malformed skeleton: one line
        raise SourceError(f"{ann_path}: the keypoints' skeleton is not pairs of 1-based joint numbers ({e})") from None
    try:
        flip = resolve_flip(K, keypoint_flip or None, names)
    except ValueError:
        given = ",".join(map(str, keypoint_flip)) if isinstance(keypoint_flip, (list, tuple)) else repr(keypoint_flip)
        raise SourceError(f"--keypoint-flip {given}: give each of the {K} keypoints of "
                          f"{name_of(str(ann_path))} once (0-based, the joint each becomes under a horizontal flip)"
                          ) from None
    try:
        return KeypointsSpec(num_keypoints=K, names=tuple(names), skeleton=edges,
                             flip_index=None if flip is None else tuple(flip))
    except Exception as e:  # noqa: BLE001 - a malformed skeleton: one line
        raise SourceError(f"{ann_path}: the keypoints' skeleton is not pairs of 1-based joint numbers ({e})") from None


MASK_CHOICES = ("semantic", "instance", "instance,semantic", "semantic,instance")


def _check_images_folder(img_dir: Path, ann_path: Path, records: list) -> None:
    """Refuse an images folder that holds none of the listed files (a wrong --images), instead of one
    "No such file" per image; the first file found ends the look, so a right folder costs one stat."""
    look = records[:20] if isinstance(img_dir, str) else records  # (in a bucket each look is a request)
    if not records or any(identity(r.path) is not None for r in look):
        return
    if isinstance(img_dir, str):  # a URL prefix
        raise SourceError(f"{img_dir}: none of the {len(records):,} images {name_of(str(ann_path))} lists is under "
                          f"this prefix (the first would be {records[0].path}); pass as --images the prefix their "
                          f"file_name entries are relative to")
    first = records[0].key
    near = [d for d in (*_subfolders(img_dir), ann_path.parent, *_subfolders(ann_path.parent), img_dir.parent)
            if (d / first).is_file()]
    hint = f" ({near[0]} has {first})" if near else ""
    raise SourceError(f"{img_dir}: none of the {len(records):,} images {ann_path.name} lists is in this folder "
                      f"(the first, {first}, would be {records[0].path}); pass as --images the folder their "
                      f"file_name entries are relative to{hint}")


def _subfolders(d: Path) -> list[Path]:
    try:
        return sorted(Path(e.path) for e in os.scandir(d) if e.is_dir() and not e.name.startswith("."))[:50]
    except OSError:
        return []


def _valid_segmentation(seg) -> bool:
    if isinstance(seg, list):
        return bool(seg) and all(isinstance(p, list) and all(  # short/odd parts: drawn as pycocotools does
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in p) for p in seg)
    if isinstance(seg, dict):
        size, counts = seg.get("size"), seg.get("counts")
        return (isinstance(size, list) and len(size) == 2 and all(isinstance(v, int) and v >= 0 for v in size)
                and (isinstance(counts, str) or (isinstance(counts, list)
                                                  and all(isinstance(c, int) and c >= 0 for c in counts))))
    return False


class CocoSource(Source):
    """A COCO detection set: an instances JSON (images, annotations, categories) + an images folder.

    Boxes follow every resize and EXIF rotation. With --masks semantic, the annotations' polygons and RLE
    are also rasterised into a class-id mask per image."""
    makes_masks = True

    name = "coco"
    task = "detection"
    params = (
        Param("annotations", "COCO instances JSON (images, annotations, categories).", type="file", required=True),
        Param("images", "Folder the JSON's file_name entries are relative to.", type="dir", required=True),
        Param("keep_category_ids", "Store COCO's original category ids as labels (default: contiguous 0..C-1).",
              type="flag", default=False),
        DROP_EMPTY,
        Param("masks", "semantic: also store a class-id mask per image rasterised from the segmentations "
                       "(0 background, label + 1 per category, crowd = --mask-ignore); instance: each "
                       "annotation's own mask beside its box (exact, crowds kept and flagged); instance,semantic: "
                       "both.",
              type="choice", choices=MASK_CHOICES, default=None),
        ALLOW_OUTSIDE,
        Param("keypoint_flip", "The joint each keypoint becomes under a horizontal flip, 0-based and comma-separated "
                               "(COCO person: 0,2,1,4,3,...; 0,1,2,... if none swap); default: from the joint names' "
                               "left/right pairs, else unknown (a warning).", type="csv"),
        Param("captions", "A COCO captions JSON (captions_*.json): each image's captions stored beside its boxes, "
                          "as the field 'captions' (a JSON list of str, in the file's order).", type="file"),
    )

    def scan(self) -> ScannedSource:
        scanned = scan_coco(self.annotations, self.images, self.keep_category_ids, self.masks,
                            self.allow_outside_images, self.keypoint_flip)
        return with_captions(scanned, Path(self.captions)) if self.captions else scanned


def read_captions(path: Path) -> dict[int, list[str]]:
    """{image id: [caption, ...]} of a COCO captions file (``annotations``: ``{"image_id", "caption"}``)."""
    text = read_input(path, "captions file")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise SourceError(f"{path}:{e.lineno}:{e.colno}: malformed JSON ({e.msg})") from None
    anns = data.get("annotations") if isinstance(data, dict) else None
    if not isinstance(anns, list):
        raise SourceError(f"{path}: expected a JSON object with 'annotations' (is this a COCO captions file?)")
    out: dict[int, list[str]] = {}
    for k, a in enumerate(anns):
        iid = _int(path, f"annotations[{k}]", a, "image_id")
        cap = a.get("caption")
        if not isinstance(cap, str):
            raise SourceError(f"{path}: annotations[{k}] (image {iid}) has no text 'caption' (got {cap!r})")
        out.setdefault(iid, []).append(cap)
    return out


def with_captions(scanned: ScannedSource, path: Path) -> ScannedSource:
    """The records of a COCO scan with each image's captions as the value field ``captions`` (a JSON list;
    an image the captions file does not name has an empty list)."""
    from dataclasses import replace

    caps = read_captions(path)
    records = [replace(r, fields=(*r.fields, ("captions", caps.get(r.target.image_id, []))))
               for r in scanned.records]
    listed = {r.target.image_id for r in scanned.records}
    missing = sum(1 for r in scanned.records if r.target.image_id not in caps)
    warnings = (f"{missing} images have no caption in {path.name}",) if missing else ()
    unknown = sum(1 for i in caps if i not in listed)
    warnings += (f"{unknown} image ids of {path.name} are not images of the instances file",) if unknown else ()
    return replace(scanned, records=records, fields={**scanned.fields, "captions": {"kind": "json"}},
                   warnings=scanned.warnings + warnings, summary={**scanned.summary, "captions": str(path)})
