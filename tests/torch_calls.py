"""The torch calls that reach Python, counted (each an op that releases the GIL and takes it back, a handover to
the Loader's other filler thread when it waits): the tests of dsc.nogil's scripted loops count them."""
from torch.overrides import TorchFunctionMode


class TorchCalls(TorchFunctionMode):
    """``with TorchCalls() as c: ...``; ``c.n`` (also ``c.calls``): torch functions and tensor methods called;
    ``attributes=False``: attribute reads (``x.shape``, ``x.dtype``) left out."""

    def __init__(self, attributes: bool = True):
        super().__init__()
        self.n, self.attributes = 0, attributes

    @property
    def calls(self) -> int:
        return self.n

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.n += self.attributes or getattr(func, "__name__", "") != "__get__"
        return func(*args, **(kwargs or {}))


# tests of what the scripted loops save (torch calls from Python, temporaries): they watch the scripted path, so
# they skip where DSC_NOGIL=0 runs the plain Python (every pixel test runs either way)
import pytest  # noqa: E402

from dsc import nogil as _nogil  # noqa: E402

scripted_only = pytest.mark.skipif(not _nogil.ENABLED, reason="DSC_NOGIL=0: the loops run as plain Python")
