"""Where each piece of a dataset lives, relative to its root: the node names (docs/FORMAT.md is the prose
version). A leaf module: the field kinds, the layout and the manifest all name nodes from here."""

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
SLOT_DIRS = ("c", "values")         # below a sharded node: its shard slots, <node>/c/<slot>/... (a fixed array's
                                     # chunks) and <node>/values/<slot> (a ragged field's bytes)
BOX_FRAME = "transform/box_frame"    # detection: (N,) uint8, 0: boxes annotated on the displayed image,
                                     # 1: on the raw pixels (rotated with the image)
CONTENT_OBJECTS = "_dsc/objects"    # versioned: a small file's content, named by its SHA-256 (two-level fan-out)


def object_path(sha256: str) -> str:
    """Where a small file of this content lives (two-level fan-out keeps directories small)."""
    return f"{CONTENT_OBJECTS}/{sha256[:2]}/{sha256}"


def slot_folders(nodes) -> list[str]:
    """The folders of ``nodes`` that hold their shard slots (``image/c``, ``image/values``...)."""
    return [f"{node}/{sub}" for node in nodes for sub in SLOT_DIRS]


def slot_of(rel: str) -> int | None:
    """The shard slot a path below a slot folder is in (``image/c/12/0/0/0`` -> 12); None for any other path."""
    parts = rel.split("/")
    return int(parts[2]) if len(parts) > 2 and parts[1] in SLOT_DIRS and parts[2].isdigit() else None
