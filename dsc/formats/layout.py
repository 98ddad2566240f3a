"""Where each piece of a dataset lives, relative to its root. docs/FORMAT.md is the prose version."""
from __future__ import annotations


from ..errors import DatasetNotFoundError
from ..store.local import as_root
from .manifest import Manifest, ShardSpec
from .zarr_v3 import MAX_JSON_BYTES, ZARR_JSON, parse_json, read_node_json

IMAGE = "image"                      # fixed: (N, H, W, C) uint8 sharded array; ragged: a group
RAGGED_VALUES = "image/values"       # ragged: group of one plain uint8 array per shard
RAGGED_OFFSETS = "image/offsets"     # ragged: (N+1,) int64, global byte offsets (CSR)
RAGGED_SHAPES = "image/shapes"       # ragged: (N, 3) int32 (h, w, c)
LABEL = "label"                      # classification: (N,) int64
KEYS = "keys"
IMAGE_ID = "image_id"                # detection: (N,) int64 id of each image in its source
OBJECTS = "objects"                  # detection: group; box-offset index + per-box columns
OBJ_OFFSETS = "objects/offsets"      # (N+1,) int64: sample i owns box rows [offsets[i], offsets[i+1])
OBJ_BOXES = "objects/boxes"          # (M, 4) float32 xyxy, absolute pixels of the stored image
OBJ_LABELS = "objects/labels"        # (M,) int64                        # (N,) string: source path / id of every sample
TRANSFORM = "transform"              # group of per-sample geometry
ORIG_SIZE = "transform/orig_size"    # (N, 2) int32 (h, w) of the decoded image, EXIF applied
AFFINE = "transform/affine"          # (N, 4) float64 (sx, sy, tx, ty): stored = s * original + t
EXIF_ORIENTATION = "transform/exif_orientation"  # (N,) uint8, EXIF orientation tag applied (1 = none)
LIVE = "live"                        # format 3: (rows,) bool, whether each row is a sample of this version
INPUTS = "inputs"                    # format 3: group
FINGERPRINT = "inputs/fingerprint"   # (rows, 5) int64: size, crc32c of each row's input (and mask), annotation digest
CHECKSUMS = "checksums"              # group
SAMPLE_CRC32C = "checksums/crc32c"   # (N,) uint32: crc32c of each sample's stored image bytes
BOX_FRAME = "transform/box_frame"    # detection: (N,) uint8, 0: boxes annotated on the displayed image,
                                     # 1: on the raw pixels (rotated with the image)


def shard_specs(manifest: Manifest) -> list[ShardSpec]:
    """Every shard file of the dataset: the image's, then those of each later field (masks)."""
    extra = [ShardSpec.from_dict(s) for spec in manifest.fields.values() for s in spec.get("shards", ()) if s]
    return [s for s in manifest.shards if s is not None] + extra


def shard_nodes(manifest: Manifest) -> list[str]:
    """The nodes whose shards sit in slot folders (``<node>/c/<slot>``, ``<node>/values/<slot>``): the image and
    every image-like field."""
    return [IMAGE, *(name for name, spec in manifest.fields.items() if spec.get("shards") is not None)]


def check_shard_files(root, manifest: Manifest) -> None:
    """The cheap check every reader makes: each shard file exists with the size the manifest records."""
    root = as_root(root)
    for spec in shard_specs(manifest):
        root.check_size(spec.path, spec.nbytes)


def read_manifest(root) -> Manifest:
    """The manifest of the dataset at ``root`` (a path, an open :class:`~dsc.store.local.Root`, or a store: the
    root ``zarr.json`` of its plain-Zarr view)."""
    from ..store import Store

    if isinstance(root, Store) and not root.local:
        try:
            data = root.get(ZARR_JSON, MAX_JSON_BYTES)
        except FileNotFoundError:
            raise DatasetNotFoundError(f"{root.url} is not a dsc dataset: it has no zarr.json") from None
        return _manifest(parse_json(data, root.where(ZARR_JSON)), root.url)
    root = as_root(root.root if isinstance(root, Store) else root)
    if not root.exists(ZARR_JSON):
        raise DatasetNotFoundError(f"{root.path} is not a dsc dataset: it has no zarr.json "
                                   f"(an interrupted compile never leaves one)")
    manifest = _manifest(read_node_json(root, ""), root.path)
    root.expected = {rel: f["nbytes"] for rel, f in manifest.files.items()}  # every later whole-file read: that size
    return manifest


def _manifest(meta, where) -> Manifest:
    attrs = meta.get("attributes") if isinstance(meta, dict) else None
    if not isinstance(meta, dict) or meta.get("node_type") != "group" or not isinstance(attrs, dict) or "dsc" not in attrs:
        raise DatasetNotFoundError(f"{where} is a Zarr node but not a dsc dataset (no 'dsc' manifest attribute)")
    return Manifest.from_dict(attrs["dsc"])
