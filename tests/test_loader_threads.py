"""The Loader's filler threads across epochs: each epoch's threads are new, but the work buffers the transforms
keep (dsc.scratch) and the ring's buffers are not made (and faulted in) again epoch after epoch."""
import torch

import dsc
from dsc import scratch
from dsc.runtime.prefetch import Ring


def _uses_scratch(batch, seed, epoch, batch_index):
    """A batch op keeping a work buffer in its thread's pool, as the transforms' kernels do."""
    scratch.scratch_bytes("test-loader-threads", 1 << 16)
    return batch


def test_filler_threads_keep_their_work_buffers_across_epochs(scenes_compiled):
    """A new epoch's filler threads take the pools the last epoch's threads filled: no work buffer is made again
    (each epoch's threads made every one of theirs anew: 2 a thread here, a batch-sized float buffer each in
    AugMix)."""
    ds = scenes_compiled(size=(48, 64), resize="stretch")
    loader = dsc.Loader(ds, batch_size=6, num_threads=2, transforms=_uses_scratch)
    for _ in range(20):  # until both threads have made their buffer (a thread may get no batch in an epoch)
        for _ in loader:
            pass
        pools = loader._ring.pools
        if len(pools) == 2 and all(any(k.startswith("test-loader-threads") for k in p) for p in pools):
            break
    made = scratch.made()
    for _ in range(3):
        for _ in loader:
            pass
    assert scratch.made() == made
    assert len(loader._ring.pools) == 2  # (the pools go with the ring: one a filler thread)


def test_no_two_threads_take_one_pool():
    """A pool is a thread's alone from take to give (an epoch's threads finalized by garbage collection may still
    be finishing a batch when the next epoch's threads start)."""
    ring = Ring(2, pin=False)
    a, b = ring.take_pool(), ring.take_pool()
    assert a is not b
    ring.give_pool(a, keep=2)
    assert ring.take_pool() is a and ring.take_pool() is not b


def test_the_ring_keeps_no_more_pools_than_the_loader_has_threads():
    """A thread finalized late (garbage collection) gives its pool back after the next epoch's threads took
    theirs: the ring keeps at most one pool per filler thread, not one per thread that ever ran."""
    ring = Ring(2, pin=False)
    pools = [ring.take_pool() for _ in range(3)]  # two threads of an epoch and a straggler of the last one
    for p in pools:
        ring.give_pool(p, keep=2)
    assert len(ring.pools) == 2


def test_a_slots_first_buffer_of_a_varying_name_takes_the_growths_headroom():
    """Ragged batches vary in size: a slot's first buffer, where another slot was already asked for more, is
    made 1.25x that largest at once, as a growth would be (made exact, it was grown, a second buffer faulted
    in, when its first larger batch came: ragged detection batches made 2-3 buffers of 14-38 MB in each of
    the 2nd and 3rd epochs). A name whose batches are one size is made exact."""
    ring = Ring(3, pin=False)
    a, b, c = ring.allocator(0), ring.allocator(1), ring.allocator(2)
    a("torchvision_image", (100,), torch.float32)
    b("torchvision_image", (200,), torch.float32)  # the largest so far: exact
    assert ring.slots[1]["torchvision_image"].numel() == 200
    a("torchvision_image", (160,), torch.float32)  # slot 0 grows: the name's batches vary
    c("torchvision_image", (150,), torch.float32)  # smaller than one another slot met: 1.25 x 200
    assert ring.slots[2]["torchvision_image"].numel() == 250
    made = ring.allocations
    c("torchvision_image", (240,), torch.float32)  # no second buffer for slot 2
    assert ring.allocations == made
    for s, alloc in enumerate((a, b)):
        alloc("image", (64,), torch.uint8)  # one size: exact in every slot
        assert ring.slots[s]["image"].numel() == 64
    c("image", (16,), torch.uint8)  # a smaller last batch of a one-size name: exact too, no headroom
    assert ring.slots[2]["image"].numel() == 16


def test_a_pinned_slots_first_buffer_is_exact():
    """Pinned (CUDA) memory is page-locked in full: a slot's first buffer is exact there, as before."""
    ring = Ring(2, pin=False)
    ring.pin = True
    ring._new = lambda numel, dtype, hint=True: torch.empty(numel, dtype=dtype)  # (no CUDA here to pin)
    ring.allocator(0)("image", (1000,), torch.uint8)
    ring.allocator(1)("image", (100,), torch.uint8)
    assert ring.slots[1]["image"].numel() == 100
