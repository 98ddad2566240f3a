"""The on-disk format: Zarr v3 nodes, the manifest, the layout. Imports nothing from compiler/ or runtime/."""
from .manifest import FORMAT_VERSION, ImageSpec, Manifest, ResizeSpec, ShardSpec

__all__ = ["FORMAT_VERSION", "ImageSpec", "Manifest", "ResizeSpec", "ShardSpec"]
