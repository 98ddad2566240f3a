"""Pascal VOC: ``ImageSets/Main/<split>.txt``, ``Annotations/<id>.xml``, ``JPEGImages/<id>.jpg``.

VOC's bndbox uses 1-based pixel indices with inclusive ends; dsc converts them to continuous
coordinates as detectron2 does: ``(xmin - 1, ymin - 1, xmax, ymax)``. Classes are the sorted names
found in the split, or the list given. ``difficult`` and ``truncated`` are kept per box.
"""
from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np

from ...errors import SourceError
from .base import Record, ScannedSource, Target


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
        return float(v)
    except ValueError:
        raise SourceError(f"{path}: <{tag}> is {v!r}, not a number") from None


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


def _parse_xml(path: Path):
    try:
        tree = ET.parse(path)
    except ET.ParseError as e:
        line, col = e.position
        raise SourceError(f"{path}:{line}:{col}: malformed XML ({e.msg if hasattr(e, 'msg') else e})") from None
    root = tree.getroot()
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


def scan_voc(root: str | os.PathLike, split: str = "trainval", classes: list[str] | None = None) -> ScannedSource:
    root = Path(os.path.abspath(root))
    sets = root / "ImageSets" / "Main"
    split_file = sets / f"{split}.txt"
    if not split_file.is_file():
        avail = sorted(p.stem for p in sets.glob("*.txt") if "_" not in p.stem) if sets.is_dir() else []
        raise SourceError(f"{split_file}: no such split file (available: {', '.join(avail) or 'none'}). "
                          f"VOC_ROOT must hold ImageSets/Main, Annotations and JPEGImages")
    ids = [ln.split()[0] for ln in split_file.read_text(encoding="utf-8").splitlines() if ln.strip()]
    parsed, invalid = [], []
    for iid in ids:
        xml = root / "Annotations" / f"{iid}.xml"
        if not xml.is_file():
            invalid.append((iid, f"{xml}: annotation file missing for id {iid} listed in {split_file.name}"))
            continue
        filename, wh, objs = _parse_xml(xml)
        img = root / "JPEGImages" / (filename or f"{iid}.jpg")
        if not img.is_file() and (root / "JPEGImages" / f"{iid}.jpg").is_file():
            img = root / "JPEGImages" / f"{iid}.jpg"
        parsed.append((iid, xml, img, wh, objs))
    names = sorted({o[0] for *_, objs in parsed for o in objs}) if classes is None else list(classes)
    index = {n: k for k, n in enumerate(names)}
    records = []
    for k, (_, xml, img, wh, objs) in enumerate(parsed):
        unknown = [o[0] for o in objs if o[0] not in index]
        if unknown:
            raise SourceError(f"{xml}: object class {unknown[0]!r} is not in the given classes")
        records.append(Record(key=Path(os.path.relpath(img, root)).as_posix(), path=str(img), target=Target(
            boxes=np.array([o[1] for o in objs], np.float64).reshape(-1, 4),
            labels=np.array([index[o[0]] for o in objs], np.int64), image_id=k, source=str(xml), size=wh,
            attrs={"difficult": np.array([o[2] for o in objs], np.uint8),
                   "truncated": np.array([o[3] for o in objs], np.uint8)})))
    if not records and not invalid:
        raise SourceError(f"{split_file}: the split lists no images")
    return ScannedSource(kind="voc", root=str(root), task="detection", records=records, classes=tuple(names),
                         attributes={"difficult": "uint8", "truncated": "uint8"}, invalid=tuple(invalid),
                         summary={"kind": "voc", "root": str(root), "split": split, "num_images": len(ids)})
