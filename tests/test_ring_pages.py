"""The prefetch ring's batch buffers ask Linux for transparent huge pages (prefetch._ask_huge_pages): a
batch-sized buffer costs a few dozen page faults when first written, not one per 4 KiB page. Counts the
faults of a first write; the contents are untouched (the same bytes as a plain tensor)."""
from __future__ import annotations

import re
import resource
import sys

import pytest
import torch

from dsc.runtime.prefetch import HUGE_PAGE, Ring


def _thp_mode() -> str | None:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return re.search(r"\[(\w+)\]", f.read()).group(1)
    except (OSError, AttributeError):
        return None


def _huge_kb(buf: torch.Tensor) -> int:
    """AnonHugePages (kB) of the mapping that holds ``buf``'s first whole huge page (the hint splits the
    buffer's mapping: its unaligned ends stay small pages)."""
    p, found = (buf.data_ptr() + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1), False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and all(c in "0123456789abcdef-" for c in head):
                a, b = (int(v, 16) for v in head.split("-"))
                found = a <= p < b
            elif found and line.startswith("AnonHugePages:"):
                return int(line.split()[1])
    return 0


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt


@pytest.mark.skipif(not sys.platform.startswith("linux") or _thp_mode() not in ("always", "madvise"),
                    reason="transparent huge pages are Linux's, and off here")
def test_a_batch_buffer_is_backed_by_huge_pages_so_its_first_write_faults_a_few_times():
    ring = Ring(2, pin=False)
    n = 16 * HUGE_PAGE  # 32 MiB: 8192 small pages
    buf = ring.allocator(0)("torchvision_image", (n // 4,), torch.float32)
    assert ring.allocations == 1 and ring.huge == 1
    f0 = _faults()
    buf.fill_(0.5)  # the first write: where the pages are made
    faults = _faults() - f0
    huge = _huge_kb(buf) * 1024
    if huge == 0:
        pytest.skip("the kernel had no huge page free just now (fragmented memory)")
    # (a fragmented memory may back only part of it with huge pages: each small page of the rest faults once)
    assert faults <= (n - huge) // 4096 + n // 4096 // 8, \
        f"{faults} page faults for {n // 4096} small pages' worth, {huge // 4096} of them in huge pages"
    assert bool((buf == 0.5).all())
    # the slot's buffer is reused as it is (once nothing holds the batch): no new buffer, hint nor faults
    del buf
    f0 = _faults()
    again = ring.allocator(0)("torchvision_image", (n // 8,), torch.float32)
    again.fill_(1.0)
    # (a few faults are the interpreter's own small allocations: 6 seen under a full suite; a fresh buffer's
    # first write would fault hundreds of times at its unaligned ends alone)
    assert ring.allocations == 1 and ring.huge == 1 and _faults() - f0 < 64


def test_small_and_pinned_buffers_are_left_as_they_are():
    ring = Ring(1, pin=False)
    ring.allocator(0)("box_offsets", (17,), torch.int64)
    ring.allocator(0)("image", (HUGE_PAGE // 2,), torch.uint8)  # under two huge pages: not worth a hint
    assert ring.allocations == 2 and ring.huge == 0


def test_a_buffer_made_because_a_batch_is_kept_asks_for_no_huge_pages():
    """A loop keeps its last batch past each epoch's end (``for b in loader``), so one slot's buffer is made
    again every epoch: that one asks for no huge pages (their first write may stall on compaction, which
    made short epochs of plain uint8 batches about 15% slower)."""
    ring = Ring(1, pin=False)
    kept = ring.allocator(0)("image", (4 * HUGE_PAGE,), torch.uint8)
    assert ring.allocations == 1
    hinted = ring.huge
    again = ring.allocator(0)("image", (4 * HUGE_PAGE,), torch.uint8)  # ``kept`` still held: a new buffer
    assert ring.allocations == 2 and ring.taken == 1 and ring.huge == hinted
    assert again.data_ptr() != kept.data_ptr()


def test_a_slot_grows_past_the_largest_batch_any_slot_has_held():
    """Variable-size batches (the SSD recipe's zoom-out canvases: their float images vary several-fold): a slot
    whose buffer is too small grows past the largest batch any slot has been asked for, not only its own
    largest, so each new largest is not met again by every slot, each making (and faulting in) a buffer."""
    ring = Ring(2, pin=False)
    a, b = ring.allocator(0), ring.allocator(1)
    a("torchvision_image", (100,), torch.float32)
    b("torchvision_image", (100,), torch.float32)
    a("torchvision_image", (200,), torch.float32)  # slot 0 grows: 250
    assert ring.allocations == 3
    assert b("torchvision_image", (150,), torch.float32).numel() == 150  # slot 1 grows past 200, not to 150
    assert ring.slots[1]["torchvision_image"].numel() == 250
    b("torchvision_image", (240,), torch.float32)  # the batch slot 0 met: no buffer made again
    a("torchvision_image", (240,), torch.float32)
    assert ring.allocations == 4


def test_a_pinned_slot_grows_past_its_own_largest_only():
    """Pinned (CUDA) memory is page-locked in full: there a slot grows 1.25x past its own largest batch, as
    before, not past the largest any slot met (one outlier batch made every pinned slot 1.25x its size)."""
    ring = Ring(2, pin=False)
    ring.pin = True
    ring._new = lambda numel, dtype, hint=True: torch.empty(numel, dtype=dtype)  # (no CUDA here to pin)
    a, b = ring.allocator(0), ring.allocator(1)
    a("image", (1000,), torch.uint8)
    b("image", (100,), torch.uint8)
    b("image", (120,), torch.uint8)
    assert ring.slots[1]["image"].numel() == 125
