"""A compile worker keeps the memory a unit freed for its next unit (units.keep_heap): no fresh zeroed pages faulted
in for buffers it had already."""
import resource

import pytest

from dsc.compiler.pool import CAN_FORK, WorkerPool
from dsc.compiler.units import worker_init

SIZE = 24 << 20  # (a unit's buffers: a tar's read-ahead, a large decoded image)


def _refaults(size: int) -> int:
    """The page faults of a buffer of ``size`` bytes made (and written) after one of that size was freed."""
    def once():
        b = bytearray(size)  # (zeroed: every page written)
        del b
    once()
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    once()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0


@pytest.mark.skipif(not CAN_FORK, reason="fork and the fork server are Linux's")
@pytest.mark.parametrize("fresh", [False, True], ids=["forked", "fresh"])
def test_a_compile_worker_reuses_the_memory_its_last_buffers_freed(fresh):
    """Left to glibc's defaults, a freed 24 MiB buffer went back to the kernel (a block over 128 KiB has its own
    mapping; a free heap top is trimmed), so the next one faulted its 6,144 pages in again (zeroed by the kernel, then
    by Python): each unit of a worker paid that for its buffers (43,000-93,000 faults per 1,000 images in the workers
    forked fresh to read a bucket, 12,500 now). The compile's workers (forked, and fresh from the fork server) keep
    it."""
    pool = WorkerPool(1, _refaults, worker_init, fresh=fresh)
    try:
        (faults,) = list(pool.imap_unordered([SIZE]))
    finally:
        pool.close()
    assert faults < SIZE // 4096 // 10, f"{faults} page faults for a buffer the worker had freed"
