"""YOLO (Ultralytics layout): ``data.yaml`` + ``images/<split>/`` + ``labels/<split>/``.

``data.yaml`` gives ``path`` (the root, relative to the yaml's folder; default that folder), the split
(``train: images/train``: a folder, a .txt list of image paths, or a list of those) and ``names`` (a
list, or a mapping index -> name). Without a data.yaml, ``classes.txt`` (one name a line) and
``images/<split>`` are used. The label file of ``.../images/.../x.jpg`` is ``.../labels/.../x.txt``, one
object a line: ``class cx cy w h`` normalised to [0, 1] of the displayed image; a polygon line
(``class x1 y1 x2 y2 ...``) becomes its bounding box, and with ``masks="instance"`` also the object's mask
(every line must then be a polygon). A pose set (``kpt_shape: [K, 2 | 3]`` in data.yaml, with ``flip_idx``)
has ``class cx cy w h`` followed by K points (x, y[, visibility]) in the same units: stored as keypoints
(a point without visibility is visible unless it is (0, 0)). An image without a label file is a negative.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ...errors import SourceError
from ...formats.fields.keypoints import KeypointsSpec, resolve_flip, unknown_flip_warning
from .base import DROP_EMPTY, NormalizedPolygons, Param, Record, ScannedSource, Source, Target, file_problem, read_input
from .imagefolder import images_under
from .inputs import RemotePath, check_input, is_remote, relative, remote_root


def _load_yaml(path: Path) -> dict:
    import yaml

    try:
        data = yaml.safe_load(read_input(path, "data.yaml"))
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f":{mark.line + 1}" if mark else ""
        raise SourceError(f"{path}{where}: malformed YAML ({getattr(e, 'problem', e)})") from None
    if not isinstance(data, dict):
        raise SourceError(f"{path}: expected a mapping with the split folders and 'names'")
    return data


MAX_CLASSES = 100_000


def _names(yaml_path: Path, names) -> tuple[str, ...]:
    if isinstance(names, (list, dict)) and len(names) > MAX_CLASSES:
        raise SourceError(f"{yaml_path}: 'names' lists {len(names):,} classes, more than {MAX_CLASSES:,}")
    if isinstance(names, list):
        if not all(isinstance(n, (str, int, float)) and len(str(n)) <= 1000 for n in names):
            raise SourceError(f"{yaml_path}: every entry of 'names' must be a short name (a string)")
        return tuple(str(n) for n in names)
    if isinstance(names, dict) and all(isinstance(k, int) for k in names):
        if sorted(names) != list(range(len(names))):
            raise SourceError(f"{yaml_path}: 'names' keys must be 0..{len(names) - 1}")
        if not all(isinstance(v, (str, int, float)) and len(str(v)) <= 1000 for v in names.values()):
            raise SourceError(f"{yaml_path}: every value of 'names' must be a short name (a string)")
        return tuple(str(names[k]) for k in range(len(names)))
    raise SourceError(f"{yaml_path}: 'names' must be a list or a mapping index -> name")


def _image_files(entry: str, root: Path, problems: list) -> list[Path]:
    p = root / entry if isinstance(root, RemotePath) or not Path(entry).is_absolute() else Path(entry)
    if p.is_dir():
        return [root / f if isinstance(root, RemotePath) else Path(f) for f in images_under(p, problems)]
    if p.suffix == ".txt" and file_problem(p) != "missing":  # read_input names a FIFO or a folder
        out = []
        for line in read_input(p, "image list").splitlines():
            line = line.strip()
            if line:
                q = p.parent / line[2:] if line.startswith("./") else Path(line)
                out.append(q if q.is_absolute() else root / q)
        return out
    raise SourceError(f"{p}: split entry is neither a folder of images nor a .txt list of images")


def label_path(image: Path) -> Path:
    s = str(image)
    sep = "/" if isinstance(image, RemotePath) else os.sep
    sa, sb = f"{sep}images{sep}", f"{sep}labels{sep}"
    label = sb.join(s.rsplit(sa, 1)).rsplit(".", 1)[0] + ".txt"
    return image / label if isinstance(image, RemotePath) else Path(label)


def _pose(yaml_path: Path, cfg: dict) -> tuple[KeypointsSpec, int] | None:
    """data.yaml's ``kpt_shape`` [K, 2 | 3] and ``flip_idx``: the keypoints spec and the values per point."""
    shape = cfg.get("kpt_shape")
    if shape is None:
        return None
    if not (isinstance(shape, list) and len(shape) == 2 and all(isinstance(v, int) for v in shape)
            and shape[0] > 0 and shape[1] in (2, 3)):
        raise SourceError(f"{yaml_path}: kpt_shape must be [number of keypoints, 2 or 3], got {shape!r}")
    K = shape[0]
    given = cfg.get("flip_idx")  # absent: unknown (scan_yolo warns), unless one joint
    try:
        if given is not None and not isinstance(given, list):
            raise ValueError
        flip = resolve_flip(K, given)
    except ValueError:
        raise SourceError(f"{yaml_path}: flip_idx must list each of the {K} keypoints once (the joint each "
                          f"becomes under a horizontal flip), got {given!r}") from None
    return KeypointsSpec(num_keypoints=K, flip_index=flip), shape[1]


def _parse_labels(path: Path, num_classes: int, instance: bool = False, pose: tuple | None = None):
    """(boxes, labels) of a label file; with ``instance`` also each object's polygon, with ``pose``
    (KeypointsSpec, values per point) each object's (K, 3) keypoints."""
    boxes, labels, shapes, points = [], [], [], []
    for n, line in enumerate(read_input(path, "label file").splitlines(), 1):
        parts = line.split()
        if not parts:
            continue
        try:
            vals = [float(v) for v in parts]
        except ValueError:
            raise SourceError(f"{path}:{n}: expected 'class cx cy w h' numbers, got {line.strip()!r}") from None
        cls = vals[0]
        if not np.isfinite(cls) or cls != int(cls) or not 0 <= cls < num_classes:
            raise SourceError(f"{path}:{n}: class {parts[0]} is not one of the {num_classes} classes in names")
        if pose is not None:
            K, dims = pose[0].num_keypoints, pose[1]
            if len(vals) != 5 + K * dims:
                raise SourceError(f"{path}:{n}: expected 'class cx cy w h' and {K} keypoints of {dims} values "
                                  f"({5 + K * dims} values, data.yaml's kpt_shape), got {len(vals)}")
            cx, cy, w, h = vals[1:5]
            box = [cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2]
            kp = np.asarray(vals[5:], np.float64).reshape(K, dims)
            if dims == 2:
                kp = np.concatenate([kp, np.where((kp == 0).all(1), 0.0, 2.0)[:, None]], 1)
            points.append(kp)
        elif len(vals) == 5:
            if instance:
                raise SourceError(f"{path}:{n}: a box line in a segment set; --masks instance needs every object "
                                  f"as a polygon 'class x1 y1 x2 y2 ...'")
            cx, cy, w, h = vals[1:]
            box = [cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2]
        elif len(vals) >= 7 and len(vals) % 2 == 1:
            xs, ys = vals[1::2], vals[2::2]
            box = [min(xs), min(ys), max(xs), max(ys)]
            shapes.append(NormalizedPolygons((tuple(vals[1:]),)))
        else:
            raise SourceError(f"{path}:{n}: expected 'class cx cy w h' (5 values) or a polygon, "
                              f"got {len(vals)} values")
        boxes.append(box)
        labels.append(int(cls))
    out = np.array(boxes, np.float64).reshape(-1, 4), np.array(labels, np.int64)
    if instance or pose is not None:
        K = pose[0].num_keypoints if pose is not None else 0
        return (*out, tuple(shapes), np.array(points, np.float64).reshape(-1, K, 3) if pose is not None else None)
    return out


def scan_yolo(root: str | os.PathLike, split: str = "train", data_yaml: str | os.PathLike | None = None,
              classes_file: str | os.PathLike | None = None, masks: str | None = None) -> ScannedSource:
    if is_remote(check_input(root)):  # in a bucket: the same layout under a URL prefix (one listing)
        root = remote_root(check_input(root))
    else:
        root = Path(os.path.abspath(root))
    if data_yaml and is_remote(check_input(data_yaml)):
        yaml_path = root / check_input(data_yaml) if isinstance(root, RemotePath) else remote_root(data_yaml)
    else:
        yaml_path = Path(os.path.abspath(data_yaml)) if data_yaml else root / "data.yaml"
    problems: list = []
    instance, pose = masks == "instance", None
    if not root.is_dir():
        raise SourceError(f"{root}: no such directory")
    yaml_state = file_problem(yaml_path)
    if yaml_state not in (None, "missing") or (data_yaml and yaml_state):
        raise SourceError(f"{yaml_path}: the data.yaml is {yaml_state}")
    if classes_file is None and yaml_state is None:
        cfg = _load_yaml(yaml_path)
        if cfg.get("path") is not None and not isinstance(cfg["path"], str):
            raise SourceError(f"{yaml_path}: 'path' must be a folder (a string), got {cfg['path']!r}")
        base = yaml_path.parent / cfg["path"] if cfg.get("path") else yaml_path.parent
        base = base if base.is_dir() else root
        if "names" not in cfg:
            raise SourceError(f"{yaml_path}: no 'names' (the class names)")
        classes = _names(yaml_path, cfg["names"])
        pose = _pose(yaml_path, cfg)
        if split not in cfg or cfg[split] is None:
            avail = [k for k in ("train", "val", "test") if cfg.get(k)]
            raise SourceError(f"{yaml_path}: no split {split!r} (it has: {', '.join(avail) or 'none'})")
        entries = cfg[split] if isinstance(cfg[split], list) else [cfg[split]]
        if not all(isinstance(e, str) for e in entries):
            raise SourceError(f"{yaml_path}: split {split!r} must be a folder, a .txt list, or a list of those")
        files = [f for e in entries for f in _image_files(str(e), base, problems)]
    else:
        cf = (check_input(classes_file) if is_remote(check_input(classes_file)) else Path(classes_file)) \
            if classes_file else root / "classes.txt"
        cf_state = file_problem(cf)
        if cf_state == "missing":
            raise SourceError(f"{root}: no data.yaml and no classes file ({cf}); give one of them")
        if cf_state:
            raise SourceError(f"{cf}: the classes file is {cf_state}")
        classes = tuple(ln.strip() for ln in read_input(cf, "classes file").splitlines() if ln.strip())
        base = root
        files = _image_files(f"images/{split}", root, problems)
    if not files and not problems:
        raise SourceError(f"{root}: split {split!r} has no images")
    records, negatives = [], 0
    for k, f in enumerate(files):
        lp = label_path(f)
        key = relative(os.fspath(f), base)
        state = file_problem(lp)
        shapes, points = (), None
        if state is None:
            boxes, labels, *extra = _parse_labels(lp, len(classes), instance, pose)
            if extra:
                shapes, points = extra
        elif state == "missing":
            boxes, labels = np.zeros((0, 4)), np.zeros(0, np.int64)
            if pose is not None:
                points = np.zeros((0, pose[0].num_keypoints, 3))
            negatives += 1
        else:  # there, but not a file to read: never silently a negative
            problems.append((key, f"{lp}: the label file is {state}"))
            continue
        records.append(Record(key=key, path=str(f), target=Target(
            boxes=boxes, labels=labels, image_id=k, source=str(lp), normalized=True, shapes=shapes if instance else (),
            keypoints=points)))
    warnings = [f"{negatives} images of split {split!r} have no label file and are kept as negatives"] \
        if negatives else []
    if pose is not None and pose[0].flip_index is None:
        warnings.append(unknown_flip_warning(pose[0].num_keypoints, f"as flip_idx in {yaml_path.name} (the joint each "
                                             f"becomes under a horizontal flip, as Ultralytics reads it)"))
    return ScannedSource(kind="yolo", root=str(base), task="detection", records=records, classes=classes,
                         warnings=tuple(warnings), invalid=tuple(problems), instance_masks=instance,
                         keypoints=pose[0] if pose is not None else None,
                         summary={"kind": "yolo", "root": str(base), "split": split, "num_images": len(files),
                                  "images_without_labels": negatives, **({"masks": masks} if masks else {}),
                                  **({"keypoints": pose[0].num_keypoints} if pose else {})})


class YoloSource(Source):
    """A YOLO dataset (Ultralytics layout): data.yaml + images/ + labels/."""

    name = "yolo"
    task = "detection"
    params = (
        Param("root", "The dataset root (holds data.yaml).", type="dir", required=True, argument=True),
        Param("split", "Split key of data.yaml (train, val, test).", default="train"),
        Param("data_yaml", "data.yaml (default: ROOT/data.yaml).", type="file", flag="--data"),
        Param("classes_file", "Class names, one a line, instead of data.yaml (images in ROOT/images/SPLIT).",
              type="file"),
        DROP_EMPTY,
        Param("masks", "instance: also store each segment polygon's mask beside its box (exact, cropped to the "
                       "object).", type="choice", choices=("instance",), default=None),
    )

    def scan(self) -> ScannedSource:
        return scan_yolo(self.root, self.split, self.data_yaml, self.classes_file, self.masks)
