"""The ``object_masks`` field: one binary mask per box row, exactly as its annotation defines it.

Rows are the ``objects`` rows (the box-offset index says which belong to a sample), so mask ``j`` is box
``j``'s. Each mask is stored cropped to its own extent (the tight rectangle of its pixels in the stored
image) and bit-packed row-major (``numpy.packbits``, most significant bit first, each mask padded to a
whole byte): memory and disk grow with the objects' areas, never with objects x image.

Nodes (``<name>`` is ``masks``): ``<name>/rects`` (M, 4) int32 (top, left, height, width) of each mask's
crop in stored pixels (an empty mask: height = width = 0); ``<name>/offsets`` (M+1,) int64 byte offsets
into ``<name>/bits`` (B,) uint8. Manifest: ``fields.<name> = {"kind": "object_masks", "num_masks": M,
"nbytes": B}``.

Batches (packed, what transforms move): ``masks`` flat uint8 0/1 (each mask's crop, row-major, back to
back), ``masks_rects`` (M, 4) int64 and ``masks_offsets`` (M+1,) int64 into ``masks``; :func:`paste`
makes the (k, H, W) uint8 masks torchvision takes (the ``list`` / ``padded`` box forms, ``ds[i]``).
The Loader's ``format="torchvision"`` on the CPU, when nothing after the gather moves the masks (no
transforms, or flips only, which the gather makes), asks the gather for the bits instead (``masks`` the rows'
packed bits, ``masks_offsets`` byte offsets, ``masks:bits`` (M, 2) each row's flips still to make: a key no
field can have, see :func:`bits_key`): the form
unpacks them straight into its (k, H, W) masks (``runtime.batches.paste_masks``), so each crop is written once;
:func:`crops_of_bits` turns such a batch into the crops' form for any step that needs crops after all.
"""
from __future__ import annotations

import base64
from dataclasses import dataclass, field as dc_field
from pathlib import Path

import numpy as np

from ...errors import CorruptDatasetError
from ..names import OBJ_OFFSETS, RAGGED_SHAPES
from ..problems import Problem, try_read
from ..specs import check_spec_keys
from ..zarr_v3 import check_node_path, read_plain_array, write_group, write_plain_array
from .base import CarriedPart, ColumnsParts, Field, Part, Reader, Role, raw_bytes, split_rows
from .objects import gather_rows, row_image_sizes
from .pixels import valid_offsets

ROLE = "object_masks"


# ----------------------------------------------------------------------------- encoding
def encode(masks) -> tuple[np.ndarray, np.ndarray, bytes]:
    """(k, H, W) bool-like masks (or a list of (H, W)) -> rects (k, 4) int32, byte counts (k,) int64, bits."""
    rects, sizes, chunks = [], [], []
    for m in masks:
        m = np.asarray(m).astype(bool, copy=False)
        rows, cols = np.flatnonzero(m.any(1)), np.flatnonzero(m.any(0))
        if not len(rows):
            rects.append((0, 0, 0, 0))
            sizes.append(0)
            continue
        t, b, l, r = int(rows[0]), int(rows[-1]) + 1, int(cols[0]), int(cols[-1]) + 1
        packed = np.packbits(m[t:b, l:r].reshape(-1))
        rects.append((t, l, b - t, r - l))
        sizes.append(len(packed))
        chunks.append(packed.tobytes())
    return (np.asarray(rects, np.int32).reshape(-1, 4), np.asarray(sizes, np.int64), b"".join(chunks))


def bits_key(name: str) -> str:
    """The batch key (and ring buffer name) of the flips still to make on the gather's packed bits of masks
    ``name``, which also says that ``name`` holds bits: with a ``:``, which no field name has (letters,
    digits and _: ``manifest.batch_name_problem``), so a field named ``masks_bits`` keeps its own key."""
    return f"{name}:bits"


def rects_key(name: str) -> str:
    """The batch key of masks ``name``'s crop rectangles (``masks_rects``): a field of that name would share it, so
    a compile with object masks refuses one (:meth:`ObjectMasksField.batch_keys_of`)."""
    return f"{name}_rects"


def _runs(starts: np.ndarray, ends: np.ndarray) -> list[int]:
    """Cut points of the runs of back-to-back bit ranges [starts[i], ends[i]) (each run's first index, then the
    count): [0] for none."""
    if not len(starts):
        return [0]
    return [0, *(np.flatnonzero(starts[1:] != ends[:-1]) + 1).tolist(), len(starts)]


def unpack(bits: np.ndarray, offsets: np.ndarray, rects: np.ndarray, rows: np.ndarray,
           out: np.ndarray | None = None, flips: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Masks ``rows`` as (flat uint8 0/1 crops back to back, (len(rows)+1,) int64 offsets), into ``out`` (of
    ``offsets[-1]`` bytes) when given: one ``unpackbits`` per run of rows whose bits lie back to back (a
    sample's objects; the runs' bounds found by one numpy comparison, not in the per-object loop), each crop
    copied from it into its place. ``flips`` (len(rows), 2) bool: each crop's rows / columns reversed on the
    way in (a flip run in the gather)."""
    rows = np.asarray(rows, np.int64)
    r = rects[rows].astype(np.int64)
    hw = r[:, 2] * r[:, 3]
    out_off = np.zeros(len(rows) + 1, np.int64)
    np.cumsum(hw, out=out_off[1:])
    flat = np.empty(int(out_off[-1]), np.uint8) if out is None else out
    if not len(rows):
        return flat, out_off
    starts, ends = offsets[rows], offsets[rows + 1]
    cuts = _runs(starts, ends)  # runs of back-to-back bits
    at = (8 * (starts - np.repeat(starts[cuts[:-1]], np.diff(cuts)))).tolist()  # each crop's bit in its run
    o, sizes, shapes = out_off.tolist(), hw.tolist(), r[:, 2:].tolist()
    moved = flips.any(1).tolist() if flips is not None else None
    for a, b in zip(cuts[:-1], cuts[1:]):
        if not any(sizes[a:b]):
            continue
        run = np.unpackbits(bits[int(starts[a]):int(ends[b - 1])])
        for j in range(a, b):
            if not sizes[j]:
                continue
            crop = run[at[j]:at[j] + sizes[j]]
            if moved is not None and moved[j]:
                h, w = shapes[j]
                flat[o[j]:o[j + 1]].reshape(h, w)[...] = \
                    crop.reshape(h, w)[::-1 if flips[j, 0] else 1, ::-1 if flips[j, 1] else 1]
            else:
                flat[o[j]:o[j + 1]] = crop
    return flat, out_off


def mask_bytes(rects: np.ndarray, rows: np.ndarray) -> int:
    """How many unpacked bytes masks ``rows`` take."""
    return int((rects[rows, 2].astype(np.int64) * rects[rows, 3]).sum())


def paste(flat, offsets, rects, h: int, w: int, out=None):
    """Crops (numpy or torch) -> (k, h, w) uint8 full masks (``out`` if given, zeroed here)."""
    import torch  # lazy: formats/ is numpy-first; the runtime hands torch tensors

    flat = torch.as_tensor(flat)
    k = len(rects)
    out = torch.zeros((k, h, w), dtype=torch.uint8, device=flat.device) if out is None else out.zero_()
    o = torch.as_tensor(offsets).tolist()
    for j, (t, l, mh, mw) in enumerate(torch.as_tensor(rects).tolist()):
        if mh and mw:
            out[j, t:t + mh, l:l + mw] = flat[o[j]:o[j + 1]].view(mh, mw)
    return out


def crops_of_bits(batch: dict, key: str) -> None:
    """A batch whose ``key`` holds packed bits (the gather's ``object_mask_bits`` form) into the crops' form
    every other step takes, in place (a step that moves or drops its rows after all)."""
    import torch  # lazy: formats/ is numpy-first; the runtime hands torch tensors

    how = batch.pop(bits_key(key), None)
    if how is None:
        return
    device = batch[key].device
    rects = batch[rects_key(key)].cpu().numpy()
    rows = np.arange(len(rects), dtype=np.int64)
    flat, off = unpack(batch[key].cpu().numpy(), batch[f"{key}_offsets"].cpu().numpy(), rects, rows,
                       flips=how.cpu().numpy().astype(bool))
    batch[key], batch[f"{key}_offsets"] = torch.from_numpy(flat).to(device), torch.from_numpy(off).to(device)


# ----------------------------------------------------------------------------- compile
@dataclass
class ObjectMasksPart(Part):
    """One unit's masks: per sample the kept objects' rects, byte counts and packed bits."""

    rects: list = dc_field(default_factory=list)
    sizes: list = dc_field(default_factory=list)
    bits: list = dc_field(default_factory=list)

    def add(self, value) -> None:
        """``value``: (k, H, W) bool masks of the sample's stored objects (the kept boxes, in order)."""
        r, s, b = encode(value)
        self.rects.append(r)
        self.sizes.append(s)
        self.bits.append(b)

    def pad(self, n: int) -> None:
        for _ in range(n):
            self.add(())

    def set_row(self, j: int, value) -> None:
        self.rects[j], self.sizes[j], self.bits[j] = encode(value)

    def to_json(self) -> dict:
        return {"rects": [r.tolist() for r in self.rects], "sizes": [s.tolist() for s in self.sizes],
                "bits": [base64.b64encode(b).decode() for b in self.bits]}

    def columns(self) -> dict:
        """This part as columns (``ColumnsParts``' shape): each sample's object count; their rects, byte counts and
        bits back to back."""
        n = np.fromiter((len(r) for r in self.rects), np.int64, len(self.rects))
        rects = (np.concatenate([np.asarray(r, np.int32).reshape(-1, 4) for r in self.rects]) if self.rects
                 else np.zeros((0, 4), np.int32))
        sizes = (np.concatenate([np.asarray(x, np.int64) for x in self.sizes]) if self.sizes
                 else np.zeros(0, np.int64))
        bits = np.frombuffer(b"".join(self.bits), np.uint8)
        return {"flat": {"n": n}, "ragged": {"rects": (rects, n * 16), "sizes": (sizes, n * 8),
                                             "bits": (bits, np.fromiter(map(len, self.bits), np.int64, len(self.bits)))}}

    @classmethod
    def from_json(cls, d: dict) -> "ObjectMasksPart":
        return cls(rects=[np.asarray(r, np.int32).reshape(-1, 4) for r in d["rects"]],
                   sizes=[np.asarray(s, np.int64) for s in d["sizes"]],
                   bits=[base64.b64decode(b) for b in d["bits"]])


def object_mask_rows(cols: dict) -> CarriedPart:
    """Rows of a base version's object masks as columns (what an update or a compaction carries a slot over with)."""
    def to_part(c):
        n, ragged = c["flat"]["n"], c["ragged"]
        raw = {k: raw_bytes(v[0]) for k, v in ragged.items()}
        return ObjectMasksPart(rects=split_rows(raw["rects"].view(np.int32).reshape(-1, 4), n),
                               sizes=split_rows(raw["sizes"].view(np.int64), n),
                               bits=[bytes(b) for b in split_rows(raw["bits"], ragged["bits"][1])])
    return CarriedPart(cols, to_part)


class ObjectMasksReader(Reader):
    def __init__(self, store, m, name: str):
        n, M = m.num_rows, int(m.objects["num_boxes"]) if m.objects else 0
        self.name = name
        self.box_offsets = store.array(OBJ_OFFSETS, (n + 1,))
        self.rects = store.array(f"{name}/rects", (M, 4))
        self.offsets = store.array(f"{name}/offsets", (M + 1,))
        self.bits = store.array(f"{name}/bits", (int(self.offsets[-1]) if len(self.offsets) else 0,))
        if not valid_offsets(self.offsets) or not valid_offsets(self.box_offsets, M):
            raise CorruptDatasetError(f"{store.root}/{name}/offsets is not a valid offset index for {M} masks")
        self.fixed = (m.image.height, m.image.width) if m.image.layout == "fixed" else None
        self.shapes = None if self.fixed else store.array(RAGGED_SHAPES, (n, 3 if m.image.channels else 2))

    def size(self, i: int) -> tuple[int, int]:
        return self.fixed if self.fixed else (int(self.shapes[i, 0]), int(self.shapes[i, 1]))

    def sample(self, i: int) -> dict:
        """``masks`` (k, H, W) uint8 at the stored image's size."""
        rows = np.arange(int(self.box_offsets[i]), int(self.box_offsets[i + 1]), dtype=np.int64)
        flat, off = unpack(self.bits, self.offsets, self.rects, rows)
        return {self.name: paste(flat, off, self.rects[rows].astype(np.int64), *self.size(i)).numpy()}

    def gather(self, idx: np.ndarray, alloc, forms: dict) -> dict:
        """The packed crops of samples ``idx``. ``forms["object_flips"]``, (B, 4) int (flip rows, flip columns,
        height, width) per sample: each crop mirrored while it is unpacked, its rectangle with it (a flip-only
        chain run in the gather: no second pass over the crops)."""
        rows, box_offsets = gather_rows(self.box_offsets, idx)
        if forms.get("object_mask_bits"):
            return self._gather_bits(rows, box_offsets, alloc, forms.get("object_flips"))
        out = {self.name: alloc(self.name, (mask_bytes(self.rects, rows),), np.dtype(np.uint8)),
               rects_key(self.name): alloc(rects_key(self.name), (len(rows), 4), np.dtype(np.int64)),
               f"{self.name}_offsets": alloc(f"{self.name}_offsets", (len(rows) + 1,), np.dtype(np.int64))}
        rects = out[rects_key(self.name)]
        rects[:] = self.rects[rows]
        flips = forms.get("object_flips")
        per_row = None
        if flips is not None:
            per_row = np.repeat(np.asarray(flips, np.int64).reshape(-1, 4), np.diff(box_offsets), axis=0)
        _, off = unpack(self.bits, self.offsets, self.rects, rows, out[self.name],
                        None if per_row is None else per_row[:, :2].astype(bool))
        if per_row is not None:  # the rectangles mirrored (an empty mask's stays (0, 0, 0, 0))
            fh, fw = per_row[:, 0].astype(bool) & (rects[:, 2] > 0), per_row[:, 1].astype(bool) & (rects[:, 3] > 0)
            rects[fh, 0] = per_row[fh, 2] - rects[fh, 0] - rects[fh, 2]
            rects[fw, 1] = per_row[fw, 3] - rects[fw, 1] - rects[fw, 3]
        out[f"{self.name}_offsets"][:] = off
        return out

    def _gather_bits(self, rows: np.ndarray, box_offsets: np.ndarray, alloc, flips) -> dict:
        """``forms["object_mask_bits"]`` (the Loader's ``format="torchvision"`` when nothing after the gather
        moves the masks): the rows' packed bits as stored, not unpacked here; their unpacking goes straight
        into the (k, H, W) masks (``runtime.batches.paste_masks``), so each crop is written once, not twice. ``<name>``:
        the bits, ``<name>_offsets``: byte offsets into them, ``<name>_rects`` as in the crops' form (mirrored
        by ``flips``), :func:`bits_key` (M, 2) uint8: each row's flips (rows, columns), still to be made, and
        the sign that ``<name>`` holds bits (:func:`crops_of_bits` turns such a batch into the crops' form)."""
        n = self.name
        starts, ends = self.offsets[rows], self.offsets[rows + 1]
        off = alloc(f"{n}_offsets", (len(rows) + 1,), np.dtype(np.int64))
        off[0] = 0
        np.cumsum(ends - starts, out=off[1:])
        bits = alloc(n, (int(off[-1]),), np.dtype(np.uint8))
        cuts = _runs(starts, ends)
        o, s, e = off.tolist(), starts.tolist(), ends.tolist()
        for a, b in zip(cuts[:-1], cuts[1:]):  # each run of back-to-back rows (a sample's, or more) by one copy
            bits[o[a]:o[b]] = self.bits[s[a]:e[b - 1]]
        rects = alloc(rects_key(n), (len(rows), 4), np.dtype(np.int64))
        rects[:] = self.rects[rows]
        how = alloc(bits_key(n), (len(rows), 2), np.dtype(np.uint8))
        how[:] = 0
        if flips is not None:
            per_row = np.repeat(np.asarray(flips, np.int64).reshape(-1, 4), np.diff(box_offsets), axis=0)
            how[:] = per_row[:, :2] != 0
            fh, fw = how[:, 0].astype(bool) & (rects[:, 2] > 0), how[:, 1].astype(bool) & (rects[:, 3] > 0)
            rects[fh, 0] = per_row[fh, 2] - rects[fh, 0] - rects[fh, 2]
            rects[fw, 1] = per_row[fw, 3] - rects[fw, 1] - rects[fw, 3]
        return {n: bits, f"{n}_offsets": off, rects_key(n): rects, bits_key(n): how}

    def split(self, batch: dict, k: int) -> dict:
        if rects_key(self.name) not in batch or "box_offsets" not in batch:
            return {}
        o = batch["box_offsets"]
        a, b = int(o[k]), int(o[k + 1])
        mo = batch[f"{self.name}_offsets"]
        h, w = image_size(batch, k)
        return {self.name: paste(batch[self.name][int(mo[a]):int(mo[b])], mo[a:b + 1] - mo[a],
                                 batch[rects_key(self.name)][a:b], h, w)}


def image_size(batch: dict, k: int) -> tuple[int, int]:
    """Sample ``k``'s (height, width) in a batch of any image form."""
    if "image_shapes" in batch:
        return tuple(int(v) for v in batch["image_shapes"][k][:2].tolist())
    if "image_sizes" in batch:
        return tuple(int(v) for v in batch["image_sizes"][k].tolist())
    img = batch["image"]
    return (int(img.shape[-2]), int(img.shape[-1])) if img.is_floating_point() and img.dim() == 4 \
        else (int(img.shape[1]), int(img.shape[2]))


class ObjectMasksField(Field):
    kind = ROLE
    placed_at_decode = True
    in_fields = True

    def __init__(self, name: str = "masks"):
        self.name = check_node_path(name)

    @classmethod
    def from_manifest(cls, m) -> list["ObjectMasksField"]:
        return [cls(name) for name, d in m.fields.items() if d.get("kind") == cls.kind]

    @classmethod
    def batch_keys_of(cls, name: str) -> tuple[str, ...]:
        return (name, rects_key(name))

    @classmethod
    def check(cls, name: str, d: dict, m) -> None:
        check_spec_keys("object_masks field", d, {"kind", "num_masks", "nbytes"}, {"kind", "num_masks", "nbytes"})
        if m.objects is None or d["num_masks"] != m.objects.get("num_boxes"):
            raise CorruptDatasetError(f"manifest: object_masks field {name!r} has {d['num_masks']} masks for "
                                      f"{(m.objects or {}).get('num_boxes', 0)} boxes; one mask per box row")

    def part(self, root: Path, s: int, capacity: int) -> ObjectMasksPart:
        return ObjectMasksPart()

    def load_part(self, d: dict) -> ObjectMasksPart:
        return ObjectMasksPart.from_json(d)

    def collect(self, S: int, N: int, K: int, s0: int = 0) -> ColumnsParts:
        return ColumnsParts(S, N, K, object_mask_rows)

    def rows_part(self, reader: ObjectMasksReader, start: int, count: int, shard) -> CarriedPart:
        """Rows ``[start, start + count)`` of the base as its arrays, in one slice a column (no object a row)."""
        box = reader.box_offsets[start:start + count + 1].astype(np.int64)
        a, b = int(box[0]), int(box[-1])
        n = np.diff(box)
        rects = np.ascontiguousarray(reader.rects[a:b], np.int32).reshape(-1, 4)
        sizes = np.diff(reader.offsets[a:b + 1]).astype(np.int64)
        bits = np.asarray(reader.bits[int(reader.offsets[a]):int(reader.offsets[b])], np.uint8)
        nbits = np.diff(reader.offsets[box]).astype(np.int64)
        return object_mask_rows({"flat": {"n": n}, "ragged": {"rects": (rects, n * 16), "sizes": (sizes, n * 8),
                                                              "bits": (bits, nbits)}})

    def empty_part(self) -> ObjectMasksPart:
        return ObjectMasksPart()

    def finish(self, root: Path, parts, n: int, K: int) -> dict:
        sizes = parts.ragged("sizes", np.int64)  # (a ColumnsParts: every version's, Field.collect; the kept rows)
        offsets = np.zeros(len(sizes) + 1, np.int64)
        np.cumsum(sizes, out=offsets[1:])
        write_group(root, self.name)
        write_plain_array(root, f"{self.name}/rects", parts.ragged("rects", np.int32, (4,)), ["box", "rect"])
        write_plain_array(root, f"{self.name}/offsets", offsets, ["box_edge"])
        write_plain_array(root, f"{self.name}/bits", parts.ragged("bits", np.uint8), ["byte"])
        return {"fields": {self.name: {"kind": self.kind, "num_masks": int(len(sizes)), "nbytes": int(offsets[-1])}}}

    def reader(self, store, m) -> ObjectMasksReader:
        return ObjectMasksReader(store, m, self.name)

    def verify(self, root: Path, m, problems: list, context: dict) -> None:
        rects = try_read(problems, f"{self.name}/rects", lambda: read_plain_array(root, f"{self.name}/rects"))
        off = try_read(problems, f"{self.name}/offsets", lambda: read_plain_array(root, f"{self.name}/offsets"))
        bits = try_read(problems, f"{self.name}/bits", lambda: read_plain_array(root, f"{self.name}/bits"))
        box_off = try_read(problems, OBJ_OFFSETS, lambda: read_plain_array(root, OBJ_OFFSETS))
        if rects is None or off is None or bits is None or box_off is None:
            return
        M = int(box_off[-1]) if len(box_off) else 0
        if rects.shape != (M, 4) or off.shape != (M + 1,) or not valid_offsets(off, len(bits)):
            problems.append(Problem(f"{self.name}/offsets", f"not {M} masks (one per box) with a valid byte index"))
            return
        need = (rects[:, 2].astype(np.int64) * rects[:, 3] + 7) // 8
        sample_of, h, w = row_image_sizes(m, box_off, context)
        bad = (np.diff(off) != need) | (rects < 0).any(1)
        if h is not None:
            bad |= (rects[:, 0] + rects[:, 2] > h) | (rects[:, 1] + rects[:, 3] > w)
        if bad.any():
            problems.append(Problem(f"{self.name}/rects", "object masks whose crop lies outside their image or "
                                                          "whose bytes do not match their size",
                                    sorted(set(sample_of[bad].tolist()))))

    def roles(self) -> dict[str, Role]:
        return {self.name: Role(ROLE)}

    def describe(self) -> str:
        return "one binary mask per box (exact, cropped to the object, bit-packed)"
