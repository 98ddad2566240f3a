"""Any map-style Python dataset (a ``torch.utils.data.Dataset``, a list...) whose items are
``(image, target)``: the image a PIL image, a uint8 array (H, W[, C]) or a uint8 tensor (C, H, W); the
target a class index (classification), a dict with ``boxes`` (k, 4) xyxy pixels and ``labels`` (k,)
(detection), or a mask of class ids (a PIL image or a 2-D integer array / tensor: segmentation, as
torchvision's VOCSegmentation gives). An iterable without ``__getitem__`` is read into a list first.
A detection target may also carry ``masks`` (k, H, W) (one per box: stored per object, exactly) and
``keypoints`` (k, K, 3) x, y, visibility (or (k, K, 2): visible), torchvision's form; the joints' names and
flip permutation come from ``dataset.keypoint_names`` / ``dataset.keypoint_flip_index`` if it has them
(names alone: their left/right pairs; neither: unknown, and compile warns).

Any other target is stored as value fields (``formats/fields/columns.py``), never changed or dropped: a
dict of named values (``{"label": 3, "score": 0.7, "caption": "...", "tags": [1, 5], "emb": ndarray}``; the
key ``label`` stays the class index, a dict with ``boxes`` stays detection and its other keys become
fields), a bare float (a number field ``target``), a bare list of ints (ragged ids ``target``, multi-label,
named by the classes), or any other value (``target``). Kinds are inferred from the first valid sample and
checked on every later one, or declared with ``fields={"score": "float32", "emb": ("float16", (768,))}``.

Items are fetched in the worker processes: the source (which holds the dataset) is inherited when they
fork, so the dataset is never pickled. Class names come from ``classes`` or ``dataset.classes``; keys
from ``dataset.samples[i][0]`` (torchvision's folder datasets) or the index.
"""
from __future__ import annotations

import numpy as np

from ...errors import ConfigError, DscError, SampleError, SourceError
from ...formats.fields import declared_spec, infer_spec
from ...formats.fields.keypoints import KeypointsSpec, resolve_flip, unknown_flip_warning
from .base import Item, MaskInfo, Param, Record, ScannedSource, Source, Target, where

# keys of a detection target that are the objects' (or torchvision's per-box extras, ignored as before), not fields
DETECTION_KEYS = ("boxes", "labels", "image_id", "area", "iscrowd", "masks", "keypoints")
FIRST_TRIES = 64  # the kinds come from the first sample that can be read, among the first this many


def as_map_style(dataset):
    if hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__"):
        return dataset
    if hasattr(dataset, "__iter__"):
        return list(dataset)
    raise SourceError(f"{type(dataset).__name__} is neither a map-style dataset nor an iterable of samples")


class DatasetSource(Source):
    """Any map-style Python dataset (or iterable) of (image, target) samples: dsc.compile(dataset, OUT)."""
    makes_masks = True

    name = "dataset"
    cli = False  # a Python object: `dsc.compile(dataset, OUT)`, no CLI command
    local_only = True  # the dataset reaches the workers by fork, never pickled
    params = (
        Param("dataset", "The dataset: map-style (len + getitem) or an iterable of (image, target).",
              type="object", required=True),
        Param("classes", "Class names (default: dataset.classes).", type="csv"),
        Param("fields", "Value fields declared instead of inferred: {name: kind}, a kind a dtype name "
                        "('float32'), 'text', 'json', 'bytes', 'multihot', 'DTYPE[SHAPE]' or (dtype, shape).",
              type="object"),
    )

    def __init__(self, **kwargs):
        if "dataset" in kwargs:
            kwargs["dataset"] = as_map_style(kwargs["dataset"])  # an iterable becomes a list once, here
        super().__init__(**kwargs)
        self._expect: dict = {}  # the task and class count every item must agree with (set by scan)

    def scan(self) -> ScannedSource:
        dataset = self.dataset
        n = len(dataset)
        if n == 0:
            raise SourceError("the dataset is empty")
        first, tries = None, []
        for i in range(min(n, FIRST_TRIES)):  # the first valid sample decides the task and the fields
            try:
                first, task = self._fetch(Record(key=str(i), path="", row=i))
                break
            except SampleError as e:
                tries.append(e)
        if first is None:
            raise tries[0]
        samples = getattr(dataset, "samples", None)
        keys = [str(samples[i][0]) for i in range(n)] if isinstance(samples, list) and len(samples) == n else None
        records = [Record(key=keys[i] if keys else str(i), path="", row=i) for i in range(n)]
        names = tuple(str(c) for c in (self.classes or getattr(dataset, "classes", None) or ()))
        self._expect = {"task": task, "num_classes": len(names) or None}
        fields = self._field_specs(first.fields or {}, names)
        wide = task == "segmentation" and (np.asarray(first.mask).dtype.itemsize > 1 and np.asarray(first.mask).max() > 255)
        kp = _keypoints_spec(dataset, first.target) if task == "detection" else None
        self._expect.update(instance=bool(task == "detection" and first.target.shapes),
                            keypoints=kp.num_keypoints if kp is not None else None)
        return ScannedSource(kind="dataset", root=type(dataset).__name__, task=task, records=records, classes=names,
                             masks=MaskInfo(classes=names, wide=bool(wide)) if task == "segmentation" else None,
                             fields=fields, instance_masks=self._expect["instance"], keypoints=kp,
                             warnings=(unknown_flip_warning(kp.num_keypoints, _FLIP_HOW),)
                             if kp is not None and kp.flip_index is None else (),
                             summary={"kind": "dataset", "type": type(dataset).__name__, "num_samples": n})

    def fetcher(self, records: list[Record]):
        return self._item

    def _item(self, r: Record) -> Item:
        """Item ``r.row`` of the dataset, checked against the task and classes of the first item."""
        return self._fetch(r)[0]

    def _fetch(self, r: Record) -> tuple[Item, str]:
        """(the item, the task its target makes)."""
        at = where(r)
        try:
            sample = self.dataset[r.row]
        except Exception as e:  # the user's __getitem__ failed: a sample error, reported with the index
            raise SampleError(at, f"__getitem__ raised {type(e).__name__}: {e}") from None
        if not isinstance(sample, (tuple, list)) or len(sample) != 2:
            raise SampleError(at, "expected (image, target) from the dataset")
        image, target = sample
        label, tgt, mask, values = _target(target, r, at)
        task, n = self._expect.get("task"), self._expect.get("num_classes")
        got = ("segmentation" if mask is not None else "detection" if tgt is not None else
               "classification" if label is not None else "images")
        label = -1 if label is None else label
        if task is not None and got != task:
            what = {"segmentation": "a mask", "detection": "a detection target (a dict with boxes)",
                    "classification": f"a class index ({label})",
                    "images": "no class index (a target of value fields)"}[got]
            raise SampleError(at, f"returned {what} in a {task} dataset; every item must have the same kind of "
                                  f"target")
        if task is not None and mask is None and task != "images":
            labels = np.atleast_1d(tgt.labels if tgt is not None else label)
            if len(labels) and (labels.min() < 0 or (n and labels.max() >= n)):
                bad = int(labels.min() if labels.min() < 0 else labels.max())
                raise SampleError(at, f"label {bad} is not a class index "
                                      f"({f'0..{n - 1}' if n else 'labels are >= 0'})")
        if tgt is not None and "instance" in self._expect:  # every item as the first: masks and keypoints or not
            K = self._expect["keypoints"]
            if bool(tgt.shapes) != self._expect["instance"] and len(tgt.boxes):
                raise SampleError(at, "has no 'masks' where the first item has them (or the other way round); "
                                      "every target must carry the same keys")
            if (tgt.keypoints is None) != (K is None) or (K is not None and tgt.keypoints.shape[1] != K):
                raise SampleError(at, f"its keypoints do not match the first item's ({K} joints per box)")
        return Item(as_decoded(image, at), label, tgt, decoded=True, mask=mask, fields=values), got

    def _field_specs(self, first: dict, names: tuple) -> dict:
        """{name: spec} of the value fields: declared ones as declared, the others inferred from ``first``
        (the first valid sample's values); a bare list-of-ints target (multi-label) is named by the classes."""
        declared = self.fields or {}
        if not isinstance(declared, dict):
            raise ConfigError(f"fields must be a dict {{name: kind}}, got {type(declared).__name__}")
        if "label" in declared:
            raise ConfigError(f"fields={{'label': {declared['label']!r}}}: the key 'label' is the class index (an "
                              f"int, not a declared field); name a regression target or other value otherwise "
                              f"(e.g. 'target' or 'score'), in the targets and in fields=")
        specs = {}
        for name in [*first, *(k for k in declared if k not in first)]:
            try:
                if name in declared:
                    spec = {**declared_spec(declared[name]), "declared": True}
                else:
                    spec = infer_spec(first[name])
            except ValueError as e:
                raise (ConfigError(f"fields[{name!r}]: {e}") if name in declared else
                       SourceError(f"dataset[0]: field {name!r} holds {e}")) from None
            if spec.get("multihot"):
                if not names:
                    raise ConfigError(f"fields[{name!r}]: 'multihot' needs the class names (classes= or "
                                      f"dataset.classes)")
                spec = {**spec, "shape": [len(names)], "classes": list(names)}
            elif name == "target" and spec["kind"] == "ragged" and names and spec["dtype"].startswith(("int", "uint")):
                spec = {**spec, "classes": list(names)}
            specs[name] = spec
        return specs

    def config(self) -> dict:
        return {"classes": list(self.classes) if self.classes else None,
                "fields": {k: str(v) for k, v in (self.fields or {}).items()} or None}


def as_decoded(image, where: str):
    """A dataset's image as compile takes it: a PIL image as it is, an array or tensor checked (uint8, (H, W),
    (H, W, 3|4), or (3|4, H, W) for a tensor) and copied into a C-contiguous (H, W[, C]) uint8 array of its own
    (what ``Image.fromarray`` would have copied; the dataset may reuse its buffer). Compile stores an array in
    the stored mode as it is (``units.compile_sample``: no PIL image made and read back, a visible share of a
    small sample's cost) and converts any other through PIL, as before."""
    from PIL import Image

    if isinstance(image, Image.Image):
        return image
    if not hasattr(image, "detach") and not isinstance(image, np.ndarray):
        if not hasattr(image, "__array__") and not isinstance(image, (list, tuple)):
            raise SampleError(where, f"expected a PIL image, a uint8 array or a uint8 tensor, got "
                                     f"{type(image).__name__}")
    if hasattr(image, "detach"):  # a torch tensor: (C, H, W) as torchvision gives, or (H, W)
        arr = image.detach().cpu().numpy()
        if arr.ndim == 3 and arr.shape[0] in (1, 3, 4) and arr.shape[2] not in (1, 3, 4):
            arr = arr.transpose(1, 2, 0)
    else:
        arr = np.asarray(image)
    if arr.dtype.kind not in "uifb":
        raise SampleError(where, f"expected a PIL image, a uint8 array or a uint8 tensor, got {type(image).__name__}")
    if arr.dtype != np.uint8:
        raise SampleError(where, f"image arrays must be uint8 (got {arr.dtype}); scale them to 0-255 first")
    if arr.ndim == 3 and arr.shape[2] == 1:
        arr = arr[:, :, 0]
    if arr.ndim not in (2, 3) or (arr.ndim == 3 and arr.shape[2] not in (3, 4)):
        raise SampleError(where, f"image array of shape {arr.shape} is not (H, W), (H, W, 3|4) or (3|4, H, W)")
    return np.array(arr, np.uint8, order="C", copy=True)


def _is_mask(target) -> bool:
    from PIL import Image

    if isinstance(target, Image.Image):
        return True
    arr = target.detach().cpu().numpy() if hasattr(target, "detach") else target
    return isinstance(arr, np.ndarray) and arr.ndim in (2, 3) and arr.dtype.kind in "uib" and arr.size > 1


def _class_index(value, where: str) -> int:
    arr = _numpy(value)
    if isinstance(arr, (bool, np.bool_)):
        raise SampleError(where, f"the key 'label' is the class index, and holds {value!r}; name other values "
                                 f"otherwise")
    try:
        arr = np.asarray(arr)
    except (ValueError, TypeError):  # a ragged nest of lists
        arr = np.asarray(None, object)
    if arr.size != 1 or arr.dtype == object:
        shown = repr(value) if len(repr(value)) <= 40 else f"a {type(value).__name__} of {arr.size} values"
        raise SampleError(where, f"the key 'label' is one class index, and holds {shown}; store multi-label ids or "
                                 f"other values under another name (e.g. 'tags'), or as the bare target")
    if arr.dtype.kind not in "iu":
        raise SampleError(where, f"the key 'label' is the class index, and holds a {arr.dtype} value ({value!r}); "
                                 f"name a regression target otherwise (e.g. 'target')")
    return int(arr.reshape(()))


def _target(target, r: Record, where: str):
    """(class index or None, Target or None, mask or None, {field: value}) of one item's target."""
    if isinstance(target, dict):
        if any(not isinstance(k, str) for k in target):
            raise SampleError(where, "the target dict's keys are field names and must be str")
        if "boxes" in target:
            boxes = np.asarray(_numpy(target.get("boxes", np.zeros((0, 4)))), np.float64).reshape(-1, 4)
            labels = np.asarray(_numpy(target.get("labels", np.zeros(0))), np.int64).reshape(-1)
            if len(labels) != len(boxes):
                raise SampleError(where, f"{len(boxes)} boxes but {len(labels)} labels")
            values = {k: v for k, v in target.items() if k not in DETECTION_KEYS}
            shapes, points = (), None
            if target.get("masks") is not None:
                m = np.asarray(_numpy(target["masks"]))
                if m.ndim != 3 or len(m) != len(boxes):
                    raise SampleError(where, f"'masks' has shape {m.shape}; expected (k, H, W), one mask per box "
                                             f"({len(boxes)} boxes)")
                shapes = tuple(m != 0)
            if target.get("keypoints") is not None:
                points = np.asarray(_numpy(target["keypoints"]), np.float64)
                if points.ndim != 3 or len(points) != len(boxes) or points.shape[2] not in (2, 3):
                    raise SampleError(where, f"'keypoints' has shape {points.shape}; expected (k, K, 3) x, y, "
                                             f"visibility per box ({len(boxes)} boxes)")
                if points.shape[2] == 2:
                    points = np.concatenate([points, np.full((*points.shape[:2], 1), 2.0)], 2)
            return -1, Target(boxes=boxes, labels=labels, image_id=r.row, source=where, shapes=shapes,
                              keypoints=points), None, values
        values = {k: v for k, v in target.items() if k != "label"}
        label = _class_index(target["label"], where) if "label" in target else None
        return label, None, None, values
    if isinstance(target, (list, tuple)):
        return None, None, None, {"target": list(target)}
    if isinstance(target, (float, np.floating, str, bytes)):
        return None, None, None, {"target": target}
    arr = _numpy(target)
    if isinstance(arr, np.ndarray) and arr.size == 1 and arr.dtype.kind in "fb":
        return None, None, None, {"target": arr.reshape(())}  # a float (or bool) tensor: a number, never a class
    if isinstance(arr, np.ndarray) and arr.ndim == 1 and arr.size != 1:
        return None, None, None, {"target": arr}  # a vector (multi-hot, regression outputs, an embedding)
    if _is_mask(target):
        mask = _numpy(target)
        if isinstance(mask, np.ndarray) and mask.ndim == 3:  # (1, H, W) as a ToTensor'd mask comes
            if mask.shape[0] != 1:
                raise SampleError(where, f"a mask must be (H, W) class ids, got shape {mask.shape}")
            mask = mask[0]
        return -1, None, mask, None
    if isinstance(arr, np.ndarray) and arr.size > 1:
        raise SampleError(where, f"the target is a {arr.dtype} array of shape {arr.shape}: a mask must be a PIL image "
                                 f"or a 2-D integer array of class ids")
    if isinstance(arr, np.ndarray) and arr.dtype.kind in "iu" or isinstance(arr, (int, np.integer)) \
            and not isinstance(arr, bool):
        return int(np.asarray(arr).reshape(())), None, None, None
    try:
        infer_spec(target)
        return None, None, None, {"target": target}
    except ValueError:
        raise SampleError(where, f"the target ({type(target).__name__}) is neither a class index, a dict with boxes, "
                                 f"a mask, nor a value dsc stores (a number, an array, a list, str, bytes, a dict "
                                 f"of named values)") from None


_FLIP_HOW = ("as the dataset's keypoint_flip_index (the joint each becomes under a horizontal flip; "
             "list(range(K)) if none swap), or keypoint_names with left/right names")


def _keypoints_spec(dataset, first: Target):
    """The keypoints of a dataset whose first target has them: K, names, flip permutation."""
    if first.keypoints is None:
        return None
    K = first.keypoints.shape[1]
    names = tuple(str(n) for n in (getattr(dataset, "keypoint_names", None) or ()))
    try:
        flip = resolve_flip(K, getattr(dataset, "keypoint_flip_index", None), names)
    except ValueError as e:
        raise SourceError(f"the dataset's keypoint_flip_index: {e}") from None
    try:
        return KeypointsSpec(num_keypoints=K, names=names, flip_index=flip)
    except DscError as e:
        raise SourceError(f"the dataset's keypoints: {e}") from None


def _numpy(x):
    return x.detach().cpu().numpy() if hasattr(x, "detach") else x
