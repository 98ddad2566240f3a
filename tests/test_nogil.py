"""dsc.nogil: a decorated loop runs as TorchScript (its ops never reach Python, so never take the GIL), gives
the bytes the plain function gives, and falls back to plain Python, with a warning, where it cannot be
scripted. Every function of dsc that uses it is scripted and compared here."""
import importlib
import pkgutil
import warnings

import pytest
import torch

import dsc
from dsc import nogil as N
from torch_calls import TorchCalls as _Count  # noqa: E402
from torch_calls import scripted_only  # noqa: E402



@N.nogil
def _loop(x: torch.Tensor, gain: float) -> torch.Tensor:
    for i in range(x.shape[0]):
        x[i].mul_(gain).add_(1.0)
    return x


@scripted_only
def test_scripted_loop_keeps_its_ops_out_of_python():
    x = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    want = _loop.eager(x.clone(), 2.0)
    y = x.clone()
    with _Count() as plain:
        _loop.eager(y, 2.0)
    assert plain.n >= 3 * 4  # the plain loop: every op and index a Python call (each takes the GIL)
    _loop(x.clone(), 2.0)  # (compiles on this first call)
    y = x.clone()
    with _Count() as scripted:
        got = _loop(y, 2.0)
    assert scripted.n == 0, "the scripted loop's ops came back through Python"
    assert torch.equal(got, want)


def test_disabled_runs_plain_python(monkeypatch):
    monkeypatch.setattr(N, "ENABLED", False)
    with _Count() as c:
        _loop(torch.ones(3, 2), 2.0)
    assert c.n > 0


@scripted_only
def test_a_function_that_cannot_be_scripted_falls_back_with_a_warning():
    @N.nogil
    def odd(x: torch.Tensor):
        return {frozenset([1]): x}  # (no TorchScript type for this)
    N.REGISTERED.remove(odd)
    with pytest.warns(RuntimeWarning, match="runs as plain Python"):
        out = odd(torch.ones(1))
    assert torch.equal(next(iter(out.values())), torch.ones(1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        odd(torch.ones(1))  # (warned once)


def test_every_nogil_function_of_dsc_scripts():
    for m in pkgutil.walk_packages(dsc.__path__, "dsc."):
        importlib.import_module(m.name)
    for f in N.REGISTERED:
        if f.__module__.startswith("dsc."):
            f.scripted()  # raises with TorchScript's reason if it cannot be compiled


@N.nogil
def _affine(x: torch.Tensor, y: torch.Tensor, a: float, b: float, c: float) -> torch.Tensor:
    return a * x + b * y + c


def test_a_scripted_function_runs_its_graph_unfused_whatever_the_fuser_would_do():
    """The graph executor's optimisations are off for the call: with the CPU fuser forced on (as a CUDA build's
    is for device tensors), five calls of a float chain leave no fusion group in the graph that ran, and the
    thread's own setting is left as it was."""
    x, y = torch.rand(7, 1, dtype=torch.float64), torch.rand(7, 1, dtype=torch.float64)
    was = torch._C._jit_can_fuse_on_cpu()
    torch._C._jit_override_can_fuse_on_cpu(True)
    try:
        for _ in range(5):
            got = _affine(x, y, 1.5, -0.25, 3.0)
        graph = str(torch.jit.last_executed_optimized_graph())
    finally:
        torch._C._jit_override_can_fuse_on_cpu(was)
    assert "TensorExprGroup" not in graph and "FusionGroup" not in graph, graph
    assert torch.equal(got, _affine.eager(x, y, 1.5, -0.25, 3.0))
    assert torch._C._get_graph_executor_optimize()


@N.nogil(dtypes=(torch.float32,))
def _scaled_(x: torch.Tensor, a: float) -> torch.Tensor:
    return x.mul_(a)


@scripted_only
def test_a_call_outside_the_declared_dtypes_runs_the_plain_function():
    """``@nogil(dtypes=...)`` (and ``cpu_only``, the same test of the first argument's device): a float16 call
    runs the plain ops (TorchScript's mul_ by a float rounds the float to half first), a float32 one scripted."""
    x32, x16 = torch.ones(4), torch.ones(4, dtype=torch.float16)
    _scaled_(x32.clone(), 1.1)
    with _Count(attributes=False) as c32:  # (the dtype test reads an attribute)
        _scaled_(x32, 1.1)
    with _Count(attributes=False) as c16:
        _scaled_(x16, 1.1)
    assert c32.n == 0 and c16.n > 0
    assert torch.equal(x16, torch.ones(4, dtype=torch.float16).mul_(1.1))
