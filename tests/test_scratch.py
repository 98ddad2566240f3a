"""dsc.scratch: each thread's one pool of work buffers, which the transforms' per-sample kernels take (there
were two pools of their own); the direct reads' buffer stays their handle's, freed with it."""
import gc
import threading
import weakref

import torch

from dsc.runtime.reads import Direct
from dsc.scratch import scratch_bytes, scratch_tensor
from dsc.transforms import augment as A


def _ptr(a):
    return a.__array_interface__["data"][0]


def test_one_pool_per_thread_reused_and_grown():
    a = scratch_bytes("t", 100)
    assert _ptr(scratch_bytes("t", 80)) == _ptr(a)  # kept and reused
    assert len(scratch_bytes("t", 500)) == 500  # grown when asked for more
    assert _ptr(scratch_bytes("t", 500)) % 64 == 0 and A.scratch("t3", (7,), torch.float32, "cpu").data_ptr() % 64 == 0
    t = A.scratch("t2", (2, 3), torch.float32, "cpu")
    assert t.data_ptr() == scratch_tensor("t2", (6,), torch.float32).data_ptr()  # augment's is the same pool
    other = []
    th = threading.Thread(target=lambda: other.append(_ptr(scratch_bytes("t", 80))))
    th.start()
    th.join()
    assert other[0] != _ptr(scratch_bytes("t", 80))  # another thread: its own


def test_the_direct_reads_buffer_goes_with_its_handle():
    """A batch's raw bytes (tens of MB) are not kept by the thread's pool, which in the main thread lives as long
    as the process: the buffer goes with the Direct reads that made it."""
    d = Direct.__new__(Direct)
    d._local = threading.local()
    buf = d.scratch(1 << 20)
    gone = weakref.ref(buf.base if buf.base is not None else buf)
    del d, buf
    gc.collect()
    assert gone() is None
