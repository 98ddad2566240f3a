"""The ``keypoints`` field: (K, 3) float32 x, y, visibility per box row, in stored-image pixels.

Rows are the ``objects`` rows (box ``j``'s joints are row ``j``); an object with no keypoints (a car in a
person_keypoints file) has K rows of zeros. Coordinates are continuous pixels (corners at integers, as the
boxes); visibility is COCO's 0 (not labelled, or outside the image: x = y = 0), 1 (labelled, occluded),
2 (visible). Node: ``<name>/points`` (M, K, 3) float32. Manifest: ``fields.<name> = {"kind": "keypoints",
"num_keypoints": K, "names": [...], "skeleton": [[a, b], ...] (0-based joint pairs), "flip_index": [...]}``:
``flip_index[j]`` is the joint that joint ``j`` becomes under a horizontal flip (left <-> right);
``null`` when the source did not say and the names do not tell (a horizontal flip then keeps every joint in
place, which swaps a left joint onto the right side: compile and the Loader warn).
"""
from __future__ import annotations

import numbers

import re
from dataclasses import dataclass, field as dc_field
from pathlib import Path

import numpy as np

from ...errors import CorruptDatasetError
from ..names import OBJ_OFFSETS
from ..problems import Problem, try_read
from ..specs import check_spec_keys
from ..zarr_v3 import check_node_path, read_plain_array, write_group, write_plain_array
from .base import CarriedPart, ColumnsParts, Field, Part, Reader, Role, raw_bytes, split_rows
from .objects import gather_rows, row_image_sizes

ROLE = "keypoints"


_SIDE = {"left": "right", "right": "left", "Left": "Right", "Right": "Left", "LEFT": "RIGHT", "RIGHT": "LEFT",
         "l": "r", "r": "l", "L": "R", "R": "L"}
_SIDE_RULES = (  # tried in order on a name; the first whose counterpart is another listed name pairs them
    re.compile(r"left|right", re.IGNORECASE),  # left_eye, eye_left, LeftHand, RIGHT_KNEE
    re.compile(r"^[lLrR](?=[_\-. ])"),          # l_eye, R-knee
    re.compile(r"(?<=[_\-. ])[lLrR]$"),         # eye_l, knee.R
    re.compile(r"^[LR](?=.)|^[lr](?=[A-Z0-9])"),  # LEye, Leye, Rshoulder, lHip
    re.compile(r"(?<=[a-z0-9])[LR]$"),          # eyeL, kneeR
)


def _side_swap(m: re.Match) -> str:
    t = m.group(0)
    return _SIDE.get(t) or (_SIDE[t.lower()].capitalize() if t[0].isupper() else _SIDE[t.lower()])


def flip_index_from_names(names) -> list[int] | None:
    """The flip permutation a file's joint names tell: the rules of ``_SIDE_RULES`` in order (``left``/``right``
    anywhere, any case; ``l_``/``r_`` prefixes; ``_l``/``_r`` suffixes; ``L``/``R`` prefixes, ``L``/``R``
    suffixes), a joint pairing with the name the first matching rule makes of it when that name is listed;
    unpaired joints stay. None (unknown) when no pair is found among two or more joints, or the pairs do not
    make a permutation that undoes itself."""
    names = [str(n) for n in names]
    if len(names) == 1:
        return [0]
    at = {n: j for j, n in enumerate(names)}
    out = list(range(len(names)))
    for j, n in enumerate(names):
        for rule in _SIDE_RULES:
            other = rule.sub(_side_swap, n)
            if other != n and other in at:
                out[j] = at[other]
                break
    if out == list(range(len(names))) or any(out[out[j]] != j for j in range(len(out))):
        return None
    return out


def _joint(v) -> int:
    """A joint number of a flip permutation: an int, a whole float, or a string of digits; else ValueError."""
    if isinstance(v, str) and re.fullmatch(r"\s*\d+\s*", v):
        return int(v)
    if isinstance(v, numbers.Real) and not isinstance(v, bool) and int(v) == v:
        return int(v)
    raise ValueError(v)


def resolve_flip(K: int, given=None, names=()) -> tuple[int, ...] | None:
    """THE rule every source follows for its keypoints' flip permutation: ``given`` (the source's own: COCO's
    ``--keypoint-flip``, YOLO's ``flip_idx``, a dataset's ``keypoint_flip_index``) when there is one, which must
    list each of the ``K`` joints once (else ValueError saying so; the caller names its option); else the one
    the joints' ``names`` tell (:func:`flip_index_from_names`); one joint flips to itself; else None (unknown:
    the source warns)."""
    if given is not None:
        try:  # (whole numbers only, or their digits as the CLI's comma-separated list gives them: 2.5 is not a
            flip = None if isinstance(given, str) else tuple(_joint(v) for v in given)  # joint, nor rounded into one)
        except (TypeError, ValueError, OverflowError):
            flip = None
        if flip is None or sorted(flip) != list(range(K)):
            raise ValueError(f"the flip permutation must list each of the {K} keypoints once, 0-based (the joint each "
                             f"becomes under a horizontal flip), got {given!r}")
        return flip
    if K == 1:
        return (0,)
    flip = flip_index_from_names(names) if names else None
    return None if flip is None else tuple(flip)


@dataclass(frozen=True, kw_only=True)
class KeypointsSpec:
    num_keypoints: int
    names: tuple[str, ...] = ()
    skeleton: tuple[tuple[int, int], ...] = ()
    flip_index: tuple[int, ...] | None = None  # None: not known (neither given nor told by the names)

    def __post_init__(self):
        K = self.num_keypoints
        if not isinstance(K, int) or K < 1:
            raise CorruptDatasetError(f"manifest: keypoints num_keypoints {K!r} is not a positive int")
        if self.names and len(self.names) != K:
            raise CorruptDatasetError(f"manifest: keypoints names {len(self.names)} for {K} keypoints")
        if self.flip_index is not None and sorted(self.flip_index) != list(range(K)):
            raise CorruptDatasetError(f"manifest: keypoints flip_index {list(self.flip_index)} is not a "
                                      f"permutation of 0..{K - 1}")
        if any(not (0 <= a < K and 0 <= b < K) for a, b in self.skeleton):
            raise CorruptDatasetError("manifest: a keypoints skeleton edge names a joint outside 0..K-1")

    def to_dict(self) -> dict:
        return {"kind": "keypoints", "num_keypoints": self.num_keypoints, "names": list(self.names),
                "skeleton": [list(e) for e in self.skeleton], "flip_index": None if self.flip_index is None else list(self.flip_index)}

    @classmethod
    def from_dict(cls, d: dict) -> "KeypointsSpec":
        check_spec_keys("keypoints field", d, {"kind", "num_keypoints", "names", "skeleton", "flip_index"},
                        {"kind", "num_keypoints", "flip_index"})
        try:
            return cls(num_keypoints=d["num_keypoints"], names=tuple(str(n) for n in d.get("names") or ()),
                       skeleton=tuple((int(a), int(b)) for a, b in d.get("skeleton") or ()),
                       flip_index=None if d["flip_index"] is None else tuple(int(v) for v in d["flip_index"]))
        except (TypeError, ValueError) as e:
            raise CorruptDatasetError(f"manifest: keypoints field: {e}") from None


@dataclass
class KeypointsPart(Part):
    K: int
    points: list = dc_field(default_factory=list)  # (k, K, 3) float32 per sample

    def add(self, value) -> None:
        """``value``: (k, K, 3) of the sample's stored objects (the kept boxes, in order)."""
        self.points.append(np.asarray(value, np.float32).reshape(-1, self.K, 3))

    def pad(self, n: int) -> None:
        for _ in range(n):
            self.add(np.zeros((0, self.K, 3), np.float32))

    def set_row(self, j: int, value) -> None:
        self.points[j] = np.asarray(value, np.float32).reshape(-1, self.K, 3)

    def to_json(self) -> dict:
        return {"points": [p.tolist() for p in self.points]}

    def columns(self) -> dict:
        """This part as columns (``ColumnsParts``' shape): each sample's object count, their points back to back."""
        n = np.fromiter((len(p) for p in self.points), np.int64, len(self.points))
        pts = (np.concatenate(self.points).astype(np.float32, copy=False) if self.points
               else np.zeros((0, self.K, 3), np.float32))
        return {"flat": {"n": n}, "ragged": {"points": (pts, n * (self.K * 12))}}


def keypoint_rows(cols: dict, K: int) -> CarriedPart:
    """Rows of a base version's keypoints as columns (what an update or a compaction carries a slot over with)."""
    def to_part(c):
        data = raw_bytes(c["ragged"]["points"][0])
        return KeypointsPart(K, split_rows(data.view(np.float32).reshape(-1, K, 3), c["flat"]["n"]))
    return CarriedPart(cols, to_part)


class KeypointsReader(Reader):
    def __init__(self, store, m, name: str, K: int):
        n, M = m.num_rows, int(m.objects["num_boxes"]) if m.objects else 0
        self.name = name
        self.box_offsets = store.array(OBJ_OFFSETS, (n + 1,))
        self.points = store.array(f"{name}/points", (M, K, 3))

    def sample(self, i: int) -> dict:
        return {self.name: self.points[int(self.box_offsets[i]):int(self.box_offsets[i + 1])]}

    def gather(self, idx: np.ndarray, alloc, forms: dict) -> dict:
        rows, _ = gather_rows(self.box_offsets, idx)
        out = alloc(self.name, (len(rows), *self.points.shape[1:]), np.dtype(np.float32))
        return {self.name: np.take(self.points, rows, axis=0, out=out)}

    def split(self, batch: dict, k: int) -> dict:
        if "box_offsets" not in batch:
            return {}
        o = batch["box_offsets"]
        return {self.name: batch[self.name][int(o[k]):int(o[k + 1])]}


class KeypointsField(Field):
    kind = ROLE
    placed_at_decode = True
    in_fields = True

    def __init__(self, spec: KeypointsSpec, name: str = "keypoints"):
        self.spec, self.name = spec, check_node_path(name)

    @classmethod
    def from_manifest(cls, m) -> list["KeypointsField"]:
        return [cls(KeypointsSpec.from_dict(d), name) for name, d in m.fields.items() if d.get("kind") == cls.kind]

    @classmethod
    def check(cls, name: str, d: dict, m) -> None:
        KeypointsSpec.from_dict(d)
        if m.objects is None:
            raise CorruptDatasetError(f"manifest: keypoints field {name!r} in a dataset without boxes")

    def part(self, root: Path, s: int, capacity: int) -> KeypointsPart:
        return KeypointsPart(self.spec.num_keypoints)

    def load_part(self, d: dict) -> KeypointsPart:
        K = self.spec.num_keypoints
        return KeypointsPart(K, [np.asarray(p, np.float32).reshape(-1, K, 3) for p in d["points"]])

    def collect(self, S: int, N: int, K: int, s0: int = 0) -> ColumnsParts:
        return ColumnsParts(S, N, K, lambda cols: keypoint_rows(cols, self.spec.num_keypoints))

    def rows_part(self, reader: KeypointsReader, start: int, count: int, shard) -> CarriedPart:
        """Rows ``[start, start + count)`` of the base as its points, in one slice (no object a row)."""
        off, k = reader.box_offsets, self.spec.num_keypoints
        n = np.diff(off[start:start + count + 1]).astype(np.int64)
        pts = np.ascontiguousarray(reader.points[int(off[start]):int(off[start + count])], np.float32)
        return keypoint_rows({"flat": {"n": n}, "ragged": {"points": (pts, n * (k * 12))}}, k)

    def empty_part(self) -> KeypointsPart:
        return KeypointsPart(self.spec.num_keypoints)

    def finish(self, root: Path, parts, n: int, K: int) -> dict:
        k = self.spec.num_keypoints  # (a ColumnsParts: every version's, Field.collect)
        write_group(root, self.name)
        write_plain_array(root, f"{self.name}/points", parts.ragged("points", np.float32, (k, 3)),
                          ["box", "keypoint", "xyv"])
        return {"fields": {self.name: self.spec.to_dict()}}

    def reader(self, store, m) -> KeypointsReader:
        return KeypointsReader(store, m, self.name, self.spec.num_keypoints)

    def verify(self, root: Path, m, problems: list, context: dict) -> None:
        pts = try_read(problems, f"{self.name}/points", lambda: read_plain_array(root, f"{self.name}/points"))
        box_off = try_read(problems, OBJ_OFFSETS, lambda: read_plain_array(root, OBJ_OFFSETS))
        if pts is None or box_off is None:
            return
        M, K = int(box_off[-1]) if len(box_off) else 0, self.spec.num_keypoints
        if pts.shape != (M, K, 3):
            problems.append(Problem(f"{self.name}/points", f"shape {pts.shape}, expected ({M}, {K}, 3): one row "
                                                           f"of {K} joints per box"))
            return
        sample_of, h, w = row_image_sizes(m, box_off, context)
        v = pts[..., 2]
        bad = ~np.isfinite(pts).all((1, 2)) | ~np.isin(v, (0, 1, 2)).all(1)
        if h is not None:
            out = (pts[..., 0] < 0) | (pts[..., 1] < 0) | (pts[..., 0] > w[:, None]) | (pts[..., 1] > h[:, None])
            bad |= (out & (v > 0)).any(1)
        if bad.any():
            problems.append(Problem(f"{self.name}/points", "keypoints not finite, with a visibility other than "
                                                           "0/1/2, or visible outside their image",
                                    sorted(set(sample_of[bad].tolist()))))

    def roles(self) -> dict[str, Role]:
        flip = self.spec.flip_index
        return {self.name: Role(ROLE, flip_index=None if flip is None else tuple(flip))}

    def describe(self) -> str:
        sp = self.spec
        names = ", ".join(sp.names) if sp.names else "unnamed"
        flip = ("flip permutation unknown: a horizontal flip keeps every joint in place" if sp.flip_index is None
                else f"flip permutation {list(sp.flip_index)}")
        return (f"{sp.num_keypoints} keypoints per box (x, y, visibility): {names}; {len(sp.skeleton)} skeleton "
                f"edges; {flip}")


def unknown_flip_warning(K: int, how: str) -> str:
    """The compile's note for keypoints whose flip permutation nobody gave (``how``: the source's way)."""
    return (f"the {K} keypoints' flip permutation is unknown (recorded as flip_index null): a horizontal flip will "
            f"mirror x but keep every joint in place, so left joints end up on the right; give it {how}")
