"""What a compile is asked to do (CompileOptions) and what it did (CompileReport)."""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from pathlib import Path

from ..errors import ConfigError
from ..formats import Manifest
from ..formats.manifest import RESIZE_POLICIES
from . import resample

SHARD_TARGET_BYTES = 64 << 20
INDEX_BYTES = 16  # a fixed shard's index entry per sample (Zarr sharding: offset and size, 8 bytes each)
ON_ERROR = ("fail", "skip")


@dataclass(frozen=True, kw_only=True)
class CompileOptions:
    """How to compile. ``size`` (height, width) gives a fixed layout; otherwise images are ragged,
    optionally capped at ``max_side``."""

    size: tuple[int, int] | None = None
    resize: str = "center-crop"
    max_side: int | None = None
    mode: str = "RGB"
    fill: int = 0
    background: tuple[int, int, int] = (255, 255, 255)
    filter: str = "bilinear"
    resizer: str = "pil"  # pil: PIL's resize (exact torchvision-on-PIL); torch: interpolate's SIMD kernel, ~3x faster
    draft: bool = False  # JPEG DCT-scaled decoding when the output is at most half the source (faster, not exact)
    shard_size: int | None = None
    workers: int | None = None
    on_error: str = "fail"
    error_report: str | None = None  # JSONL file: one {"key", "path", "reason"} line per skipped input
    overwrite: bool = False
    resume: bool = False
    progress: bool = True
    executor: object = None  # a Dask scheduler address ("tcp://host:8786") or a dask.distributed Client
    mask_ignore: int = 255  # the mask value of "no class" (letterbox padding, crowd regions, borders)
    max_pixels: int | None = None  # an image with more pixels is a bad sample (None: decode.DEFAULT_MAX_PIXELS, PIL's default)
    update: bool = False  # make the next version of an existing OUT, decoding only what changed (compiler/update.py)
    dry_run: bool = False  # with update: say what it would do, change nothing
    explicit: tuple = ()  # the option names the caller gave (an update refuses output options that differ)
    cache_dir: str | None = None  # OUT is a URL: where shards are staged before upload (default: the shard cache)

    def __post_init__(self):
        if self.size is not None:
            if isinstance(self.size, int):
                object.__setattr__(self, "size", (self.size, self.size))
            if len(self.size) != 2 or any(not isinstance(v, int) or isinstance(v, bool) or v < 1 for v in self.size):
                raise ConfigError(f"size must be one positive int or (height, width), got {self.size!r}")
            object.__setattr__(self, "size", tuple(self.size))
            if self.max_side is not None:
                raise ConfigError("give either size (fixed shape) or max_side (ragged), not both")
        if self.resize not in RESIZE_POLICIES:
            raise ConfigError(f"resize must be one of {', '.join(RESIZE_POLICIES)}, got {self.resize!r}")
        if self.max_side is not None and (not isinstance(self.max_side, int) or self.max_side < 1):
            raise ConfigError(f"max_side must be a positive int, got {self.max_side!r}")
        if self.mode not in ("RGB", "L"):
            raise ConfigError(f"mode must be RGB or L, got {self.mode!r}")
        if not isinstance(self.fill, int) or isinstance(self.fill, bool) or not 0 <= self.fill <= 255:
            raise ConfigError(f"fill must be 0..255, got {self.fill}")
        if len(self.background) != 3 or any(not isinstance(c, int) or not 0 <= c <= 255 for c in self.background):
            raise ConfigError(f"background must be three values 0..255, got {self.background!r}")
        problem = resample.check(self.resizer, self.filter)
        if problem:
            raise ConfigError(problem)
        if self.on_error not in ON_ERROR:
            raise ConfigError(f"on_error must be fail or skip, got {self.on_error!r}")
        if not isinstance(self.mask_ignore, int) or isinstance(self.mask_ignore, bool) \
                or not 0 <= self.mask_ignore <= 65535:
            raise ConfigError(f"mask_ignore must be 0..65535, got {self.mask_ignore!r}")
        if self.update and self.overwrite:
            raise ConfigError("give --update (a new version of OUT) or --overwrite (replace OUT), not both")
        if self.dry_run and not self.update:
            raise ConfigError("--dry-run goes with --update: it shows what the update would do")
        for name in ("shard_size", "workers", "max_pixels"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
                raise ConfigError(f"{name} must be a positive int, got {v!r}")

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    LATER_DEFAULTS = {"max_pixels": None}  # options added later: recorded only when set (same bytes as before)
    RUNTIME_ONLY = ("workers", "overwrite", "resume", "progress", "error_report", "executor", "on_error", "update",
                    "dry_run", "explicit", "cache_dir")

    def recorded(self, masks: bool = False) -> dict:
        """The options that decide the output's bytes (stored in the manifest, fingerprinted for resume);
        how the compile runs (workers, executor, progress, resume...) is left out, and so is mask_ignore
        when the dataset has no masks (so such datasets stay byte-identical to earlier versions)."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name not in self.RUNTIME_ONLY and (masks or f.name != "mask_ignore")
                and not (f.name in self.LATER_DEFAULTS and getattr(self, f.name) == self.LATER_DEFAULTS[f.name])}

    @property
    def layout(self) -> str:
        return "fixed" if self.size is not None else "ragged"

    @property
    def channels(self) -> int:
        return 3 if self.mode == "RGB" else 1


@dataclass(frozen=True)
class CompileReport:
    path: Path
    manifest: Manifest
    skipped: tuple[dict, ...]
    warnings: tuple[str, ...]
    seconds: float
    bytes_written: int

    resumed_units: int = 0  # --resume (or an update resumed): finished units of the interrupted run kept
    plan: dict | None = None  # an update: {"added", "removed", "changed", "relabelled", "moved", "unchanged", "decoded"}
    version: int = 0  # the version OUT is at afterwards
    committed: bool = True  # False: a dry run, or an update that found nothing to do
    dry_run: bool = False
    reused_shards: int = 0  # an update: shards of earlier versions the new one uses as they are
    uploaded: dict | None = None  # OUT is a URL: {"sent", "kept", "bytes_sent"} (kept: already in the bucket)
    decoded: int | None = None  # inputs this run decoded (fewer than the samples when units were resumed)

    def __repr__(self) -> str:
        if self.manifest is None:
            return f"CompileReport(path={str(self.path)!r}, dry run, plan={self.plan})"
        return (f"CompileReport(path={str(self.path)!r}, samples={self.manifest.num_samples}, "
                f"shards={self.manifest.shard_count}, skipped={len(self.skipped)}, seconds={self.seconds:.2f})")

    @property
    def images_per_second(self) -> float:
        """Inputs decoded per second by this run (a resumed run counts only what it decoded)."""
        n = self.manifest.num_samples if self.decoded is None else self.decoded
        return n / self.seconds if self.seconds > 0 else float("inf")


def default_shard_size(num_records: int, options: CompileOptions) -> int:
    """Samples per shard: ~64 MiB of pixels and shard index (a power of two, chosen from bytes alone: no cap
    on the count, so small samples make few large shards, not many small ones), lowered to ceil(N / 32) (not
    below 8) so that a small dataset still makes ~32 work units to balance across processes. Depends only on the
    input count and options, never on the worker count, so output bytes do not either."""
    if options.size is not None:
        sample = options.size[0] * options.size[1] * options.channels
    elif options.max_side is not None:
        sample = options.max_side * options.max_side * options.channels // 2
    else:
        sample = 512 * 512 * options.channels
    sample += INDEX_BYTES  # (each sample's entry in the fixed layout's shard index)
    k = 1 << max(0, int(math.log2(max(1, SHARD_TARGET_BYTES // sample))))
    return max(1, min(k, max(8, -(-num_records // 32))))
