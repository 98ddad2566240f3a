"""Pascal VOC: ``ImageSets/Main/<split>.txt``, ``Annotations/<id>.xml``, ``JPEGImages/<id>.jpg``.

VOC's bndbox uses 1-based pixel indices with inclusive ends; dsc converts them to continuous
coordinates as detectron2 does: ``(xmin - 1, ymin - 1, xmax, ymax)``. Classes are the sorted names
found in the split, or the list given. ``difficult`` and ``truncated`` are kept per box.

With ``masks=True`` the split comes from ``ImageSets/Segmentation/<split>.txt`` and every image gets its
``SegmentationClass/<id>.png``: palette indices are the class ids (0 background, k + 1 the k-th class,
255 the border / ignore). Classes then default to VOC's 20, in VOC's (alphabetical) order, so a box's
label k and its mask value k + 1 name the same class. An image without an annotation XML has no boxes;
when no image of the split has one (a segmentation-only set), the dataset is a segmentation dataset: masks
and no boxes, its classes the mask values' names (``background`` first).

``masks="instance"`` (the split of ImageSets/Segmentation) stores each object's own mask beside its box from
``SegmentationObject/<id>.png``, whose value k + 1 is the k-th object of the annotation XML (VOC's rule;
255, the border, belongs to no object); ``"instance,semantic"`` both. ``masks=True`` is ``"semantic"``.
"""
from __future__ import annotations

import math
import os
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np

from ...errors import SourceError
from .coco import MASK_CHOICES, inside
from .inputs import RemotePath, check_input, is_remote, relative, remote_root
from .base import (ALLOW_OUTSIDE, DROP_EMPTY, InstanceId, MaskInfo, Param, Record, ScannedSource, Source, Target,
                   file_problem, read_input)


def _text(el, tag, path, default=None):
    child = el.find(tag)
    if child is None or child.text is None:
        if default is not None:
            return default
        raise SourceError(f"{path}: <{el.tag}> has no <{tag}>")
    return child.text.strip()


def _num(el, tag, path):
    v = _text(el, tag, path)
    try:
        x = float(v)
    except ValueError:
        x = math.nan
    if not math.isfinite(x):
        raise SourceError(f"{path}: <{tag}> is {v!r}, not a finite number")
    return x


def _flag(el, tag, path) -> int:
    """A 0/1 field; absent, empty or "Unspecified" count as 0 (some VOC-style exports write those)."""
    v = _text(el, tag, path, "0") or "0"
    try:
        return int(float(v) != 0)
    except ValueError:
        if v.lower() in ("unspecified", "false", "no"):
            return 0
        if v.lower() in ("true", "yes"):
            return 1
        raise SourceError(f"{path}: <{tag}> is {v!r}, expected 0 or 1") from None


class _DTD(Exception):
    pass


class _NoDTD(ET.TreeBuilder):
    """Stops the parse at a DOCTYPE, in whatever encoding the file is (UTF-16 hides it from a byte search),
    before any entity it declares is expanded."""

    def doctype(self, name, pubid, system):
        raise _DTD


def _parse_xml(path: Path):
    data = read_input(path, "annotation XML", text=False)
    refused = SourceError(f"{path}: the XML declares a DTD or entities, which dsc refuses to expand; VOC "
                          f"annotations need neither")
    if b"<!DOCTYPE" in data or b"<!ENTITY" in data:  # entity expansion (billion laughs) is not parsed at all
        raise refused
    try:
        parser = ET.XMLParser(target=_NoDTD())
        parser.feed(data)
        root = parser.close()
    except _DTD:
        raise refused from None
    except ET.ParseError as e:
        line, col = e.position
        raise SourceError(f"{path}:{line}:{col}: malformed XML ({e.msg if hasattr(e, 'msg') else e})") from None
    except RecursionError:
        raise SourceError(f"{path}: malformed XML (nested too deeply)") from None
    size = root.find("size")
    wh = (int(_num(size, "width", path)), int(_num(size, "height", path))) if size is not None else None
    objs = []
    for obj in root.findall("object"):
        bb = obj.find("bndbox")
        if bb is None:
            raise SourceError(f"{path}: <object> has no <bndbox>")
        box = [_num(bb, t, path) for t in ("xmin", "ymin", "xmax", "ymax")]
        objs.append((_text(obj, "name", path), [box[0] - 1, box[1] - 1, box[2], box[3]],
                     _flag(obj, "difficult", path), _flag(obj, "truncated", path)))
    return _text(root, "filename", path, ""), wh, objs


def _inside(folder, name: str, where: str, allow_outside: bool):
    """``inside`` for a local folder or a :class:`RemotePath` (the object's path, as one)."""
    if isinstance(folder, RemotePath):
        return folder / inside(str(folder), name, where, allow_outside)
    return inside(folder, name, where, allow_outside)


VOC_CLASSES = ("aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat", "chair", "cow", "diningtable",
               "dog", "horse", "motorbike", "person", "pottedplant", "sheep", "sofa", "train", "tvmonitor")


def _png_problem(png: Path, wanted, what: str, iid: str, split_file: Path) -> str | None:
    """Why ``png`` (the ``what`` of id ``iid``) cannot be read, when it is ``wanted``; else None."""
    state = file_problem(png) if wanted else None
    return f"{png}: the {what} of id {iid} (listed in {split_file.name}) is {state}" if state else None


def scan_voc(root: str | os.PathLike, split: str = "trainval", classes: list[str] | None = None,
             masks: bool | str = False, allow_outside_images: bool = False) -> ScannedSource:
    root = remote_root(root) if is_remote(check_input(root)) else Path(os.path.abspath(root))  # (a bucket: one listing)
    kinds = {"semantic"} if masks is True else set(masks.split(",")) if masks else set()
    instance, masks = "instance" in kinds, "semantic" in kinds
    listed = masks or instance  # the split of ImageSets/Segmentation
    sets = root / "ImageSets" / ("Segmentation" if listed else "Main")
    split_file = sets / f"{split}.txt"
    if not split_file.is_file():
        avail = sorted(p.stem for p in sets.glob("*.txt") if "_" not in p.stem) if sets.is_dir() else []
        raise SourceError(f"{split_file}: no such split file (available: {', '.join(avail) or 'none'}). "
                          f"VOC_ROOT must hold ImageSets/{sets.name}, "
                          + ("SegmentationClass, " if masks else "") + "Annotations and JPEGImages")
    ids = [ln.split()[0] for ln in read_input(split_file, "split file").splitlines() if ln.strip()]
    parsed, invalid, without_xml = [], [], 0
    for iid in ids:
        if "/" in iid or "\\" in iid or iid in (".", ".."):  # an id names files in Annotations/, JPEGImages/...
            raise SourceError(f"{split_file}: {iid!r} is not an image id (a plain name, no folders); fix the line")
        xml = root / "Annotations" / f"{iid}.xml"
        xml_state = file_problem(xml)
        if xml_state not in (None, "missing"):
            invalid.append((iid, f"{xml}: the annotation file is {xml_state}"))
            continue
        if xml_state == "missing":
            if not masks or instance:
                invalid.append((iid, f"{xml}: annotation file missing for id {iid} listed in {split_file.name}"))
                continue
            filename, wh, objs = "", None, []  # a segmentation image needs no boxes
        else:
            filename, wh, objs = _parse_xml(xml)
        img = _inside(root / "JPEGImages", filename or f"{iid}.jpg", str(xml), allow_outside_images)
        if not img.is_file() and (root / "JPEGImages" / f"{iid}.jpg").is_file():
            img = root / "JPEGImages" / f"{iid}.jpg"
        problem = (_png_problem(root / "SegmentationClass" / f"{iid}.png", masks, "mask", iid, split_file)
                   or _png_problem(root / "SegmentationObject" / f"{iid}.png", instance, "instance mask", iid,
                                   split_file))
        if problem:
            invalid.append((relative(os.fspath(img), root), problem))
            continue
        parsed.append((iid, xml, img, wh, objs))
        without_xml += xml_state == "missing"
    if classes is None:
        names = list(VOC_CLASSES) if masks else sorted({o[0] for *_, objs in parsed for o in objs})
    else:
        names = list(classes)
    index = {n: k for k, n in enumerate(names)}
    records = []
    for k, (iid, xml, img, wh, objs) in enumerate(parsed):
        unknown = [o[0] for o in objs if o[0] not in index]
        if unknown:
            raise SourceError(f"{xml}: object class {unknown[0]!r} is not in the "
                              + ("given classes" if classes is not None else "20 VOC classes (pass --classes)"))
        records.append(Record(key=relative(os.fspath(img), root), path=str(img), target=Target(
            boxes=np.array([o[1] for o in objs], np.float64).reshape(-1, 4),
            labels=np.array([index[o[0]] for o in objs], np.int64), image_id=k, source=str(xml), size=wh,
            attrs={"difficult": np.array([o[2] for o in objs], np.uint8),
                   "truncated": np.array([o[3] for o in objs], np.uint8)},
            shapes=tuple(InstanceId(str(root / "SegmentationObject" / f"{iid}.png"), j + 1) for j in range(len(objs)))
            if instance else ()),
            mask=str(root / "SegmentationClass" / f"{iid}.png") if masks else ""))
    if not records and not invalid:
        raise SourceError(f"{split_file}: the split lists no images")
    if masks and records and without_xml == len(records):  # no XML at all: segmentation only, no empty boxes
        mask_classes = ("background", *names)
        return ScannedSource(kind="voc", root=str(root), task="segmentation", classes=mask_classes,
                             records=[Record(key=r.key, path=r.path, mask=r.mask) for r in records],
                             invalid=tuple(invalid), masks=MaskInfo(classes=mask_classes),
                             summary={"kind": "voc", "root": str(root), "split": split, "num_images": len(ids),
                                      "masks": True})
    warnings = (f"{without_xml} images of split {split!r} have no annotation XML and are kept without boxes",) \
        if without_xml else ()
    return ScannedSource(kind="voc", root=str(root), task="detection", records=records, classes=tuple(names),
                         attributes={"difficult": "uint8", "truncated": "uint8"}, invalid=tuple(invalid),
                         warnings=warnings, masks=MaskInfo(classes=("background", *names)) if masks else None,
                         instance_masks=instance,
                         summary={"kind": "voc", "root": str(root), "split": split, "num_images": len(ids),
                                  **({"masks": True} if masks and not instance else {}),
                                  **({"masks": ",".join(sorted(kinds))} if instance else {})})


class VocSource(Source):
    """A Pascal VOC split (Annotations/, JPEGImages/, ImageSets/Main/).

    With --masks, the split of ImageSets/Segmentation and a class-id mask per image from
    SegmentationClass/ (palette indices; 255 = border, kept as the ignore index); a split none of whose
    images has an annotation XML compiles as a segmentation dataset (no boxes)."""
    makes_masks = True

    name = "voc"
    task = "detection"
    params = (
        Param("root", "The VOC root (VOCdevkit/VOC2012).", type="dir", required=True, argument=True),
        Param("split", "ImageSets/Main/<split>.txt (with --masks: ImageSets/Segmentation/<split>.txt).",
              default="trainval"),
        Param("classes", "Comma-separated class list (default: the sorted names found; with --masks VOC's 20). "
                         "With --masks, in the order of the masks' palette indices 1, 2, ...", type="csv"),
        DROP_EMPTY,
        Param("masks", "Also store each image's SegmentationClass/<id>.png as its mask (--masks, --masks semantic); "
                       "instance: each object's own mask from SegmentationObject/<id>.png (value k + 1: the k-th "
                       "object of the XML); instance,semantic: both.",
              type="choice", choices=MASK_CHOICES,
              default=False, flag_value="semantic"),
        ALLOW_OUTSIDE,
    )

    def scan(self) -> ScannedSource:
        return scan_voc(self.root, self.split, self.classes, self.masks, self.allow_outside_images)
