"""Loops of small tensor ops that run without the GIL: a function decorated with :func:`nogil` is compiled
with TorchScript on its first call and then runs in TorchScript's interpreter, which does not hold the GIL.

Why: a Loader's two filler threads share one GIL. Every torch call made from Python takes it to start, and
(torch 2.13) an in-place or ``out=`` op on a tensor that has a Python object takes it again in the middle;
a per-sample loop of such ops (64 samples x 4 ops a batch) is then a stream of GIL handovers, and two threads
run it no faster than one (measured: x1.00 from the second thread for 96 px samples, x1.68 for the same loop
scripted; at 224 px, x1.73 against x1.85). Batching the loop into a few large ops frees the GIL too, but
walks every byte once per op instead of once per sample while it is in cache. A scripted loop keeps the
locality and frees the GIL: its ops and their temporaries never reach Python.

``DSC_NOGIL=0`` in the environment runs every such function as plain Python (the same ops, so the same
bytes: the tests compare the two on every registered function). A scripted function runs its graph as written,
with the graph executor's optimisations off for the call (this thread only): no fuser merges its float ops
into kernels that round otherwise (a CUDA build's profiling executor would, after a few calls), and no
per-shape recompiling. TorchScript is deprecated in torch 2.x in
favour of ``torch.compile``, which needs a C++ toolchain and seconds to minutes of compiling per shape; the
project pins torch, and a function that fails to script falls back to plain Python with one warning.
Imports nothing of dsc."""
from __future__ import annotations

import functools
import os
import threading
import warnings
from typing import Callable

import torch

ENABLED = os.environ.get("DSC_NOGIL", "1") != "0"
REGISTERED: list = []  # every decorated function (the tests script and compare each)
_LOCK = threading.Lock()


def nogil(fn: Callable | None = None, *, cpu_only: bool = False, dtypes: tuple | None = None) -> Callable:
    """Decorate a function of tensors (TorchScript's subset of Python: type annotations on every argument that
    is not a tensor) so it runs as TorchScript, compiled on its first call. ``f.eager`` is the plain function;
    ``f.scripted()`` compiles it (or raises why it cannot be). ``cpu_only`` / ``dtypes``: a call whose first
    argument (a tensor) lies on a device / has another dtype runs the plain function (``@nogil(cpu_only=True)``:
    where the plain ops are the ones to keep, e.g. TorchScript's ``mul_`` by a float rounds the float to the
    tensor's half precision first, the eager one does not)."""
    if fn is None:
        return functools.partial(nogil, cpu_only=cpu_only, dtypes=dtypes)
    state: dict = {}

    def scripted():
        if "fn" not in state:
            with _LOCK:
                if "fn" not in state:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore", DeprecationWarning)  # (torch.jit.script's own notice)
                        state["fn"] = torch.jit.script(fn)
        return state["fn"]

    @functools.wraps(fn)
    def call(*args, **kwargs):
        if not ENABLED or state.get("failed") or (cpu_only and args[0].device.type != "cpu") or \
                (dtypes is not None and args[0].dtype not in dtypes):
            return fn(*args, **kwargs)
        try:
            run = scripted()
        except Exception as e:  # no source to read (a frozen app), a construct TorchScript lacks
            state["failed"] = True
            warnings.warn(f"dsc: {fn.__module__}.{fn.__qualname__} runs as plain Python (it holds the GIL): "
                          f"TorchScript could not compile it ({type(e).__name__}: {str(e).splitlines()[0]})",
                          RuntimeWarning, stacklevel=2)
            return fn(*args, **kwargs)
        prev = torch._C._get_graph_executor_optimize()  # (this thread's setting)
        torch._C._set_graph_executor_optimize(False)  # the graph as written: no fusion (a CUDA build fuses chains
        try:  # of float ops into nvrtc kernels, whose fused multiply-adds round otherwise than the eager ops)
            return run(*args, **kwargs)
        finally:
            torch._C._set_graph_executor_optimize(prev)

    call.eager = fn
    call.scripted = scripted
    REGISTERED.append(call)
    return call
