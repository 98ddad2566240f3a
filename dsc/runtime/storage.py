"""Where a dataset's bytes come from at run time: shard files memory-mapped from the page cache
(``cache="page"``) or read into process memory (``cache="ram"``), and the small index arrays.

The field readers (``formats/fields``) ask a storage for ``map(path, nbytes)`` and ``array(rel, shape)``
and never touch files themselves, so a strategy (a later remote cache, say) is one class here.
"""
from __future__ import annotations

import mmap
import os
from pathlib import Path

import numpy as np

from ..errors import CorruptDatasetError
from ..formats.zarr_v3 import node_dir, read_plain_array

MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)  # Linux >= 5.14
CACHES = ("page", "ram")


def map_file(path: Path, nbytes: int) -> np.ndarray:
    """Map the first ``nbytes`` of a file as a flat uint8 array.

    A private (copy-on-write) mapping: pages are the OS page cache's, shared by every process that maps
    the file, never written back; a user who writes into a sample changes only their own copy of that
    page. The page tables are filled up front with MADV_POPULATE_READ (read-only, so no page is copied:
    MAP_POPULATE on a writable private mapping would copy the whole file into process memory), which
    spares a page fault per 4 KiB on first touch; older kernels fall back to read-ahead (MADV_WILLNEED).
    """
    if nbytes == 0:
        return np.zeros(0, np.uint8)
    fd = os.open(path, os.O_RDONLY)
    try:
        mm = mmap.mmap(fd, nbytes, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)
    try:
        mm.madvise(MADV_POPULATE_READ)
    except (OSError, ValueError):
        mm.madvise(mmap.MADV_WILLNEED)
    return np.frombuffer(mm, dtype=np.uint8)  # the array keeps the mapping alive


class Storage:
    """A dataset directory's bytes: shards mapped on first use and kept, small arrays read whole."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self._maps: dict[str, np.ndarray] = {}

    def map(self, rel: str, nbytes: int) -> np.ndarray:
        arr = self._maps.get(rel)
        if arr is None:
            arr = self._maps[rel] = map_file(node_dir(self.root, rel), nbytes)
        return arr

    def array(self, rel: str, shape: tuple) -> np.ndarray:
        """A plain (small) array, checked to have ``shape``."""
        arr = read_plain_array(self.root, rel)
        if arr.shape != tuple(shape):
            raise CorruptDatasetError(f"{self.root}/{rel} has shape {arr.shape}, expected {tuple(shape)}")
        return arr

    def load_to_ram(self, shards, progress: bool = True) -> None:
        """Read ``shards`` (ShardSpecs) into process memory: no page-cache eviction or page faults during
        training, at the cost of the dataset's size in RAM per process."""
        from tqdm import tqdm

        with tqdm(total=sum(s.nbytes for s in shards), unit="B", unit_scale=True, desc="load to RAM",
                  disable=not progress) as bar:
            for spec in shards:
                self._maps[spec.path] = np.array(self.map(spec.path, spec.nbytes))
                bar.update(spec.nbytes)

    def __getstate__(self):  # DataLoader workers started by spawn re-map shards lazily
        return {"root": self.root, "_maps": {}}
