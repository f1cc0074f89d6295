"""The cyclic garbage collector paused while pyfuser compiles (runtime/gc_pause.py, with
`PYFUSER_GC_PAUSE=1`): the pause restores the collector's state, nests, respects a collector the
program turned off, and does nothing by default; the torch.compile backend (forward, and a
backward compiled at its first call) and the TorchScript jit's first call compile with it
paused, and leave it on after."""
from __future__ import annotations

import gc

import pytest
import torch

import pyfuser
from pyfuser.frontend.fx import compile_graph as CG
from pyfuser.runtime.gc_pause import paused

pytestmark = pytest.mark.usefixtures("fresh_compile")


@pytest.fixture
def collector_on(monkeypatch):
    monkeypatch.setenv("PYFUSER_GC_PAUSE", "1")
    was = gc.isenabled()
    gc.enable()
    yield
    (gc.enable if was else gc.disable)()


def test_paused_restores_and_nests(collector_on):
    with paused():
        assert not gc.isenabled()
        with paused():
            assert not gc.isenabled()
        assert not gc.isenabled()                 # only the outermost turns it back on
    assert gc.isenabled()
    with pytest.raises(ValueError):
        with paused():
            raise ValueError("inside")
    assert gc.isenabled()


def test_paused_leaves_an_off_collector_off_and_is_off_by_default(collector_on, monkeypatch):
    gc.disable()
    with paused():
        assert not gc.isenabled()
    assert not gc.isenabled()
    gc.enable()
    for value in ("0", None):
        if value is None:
            monkeypatch.delenv("PYFUSER_GC_PAUSE")
        else:
            monkeypatch.setenv("PYFUSER_GC_PAUSE", value)
        with paused():
            assert gc.isenabled()


def test_the_backend_compiles_forward_and_backward_with_the_collector_paused(collector_on,
                                                                            monkeypatch):
    seen = []
    real = CG.compile_graph

    def spy(gm, example_inputs, kind):
        seen.append((kind, gc.isenabled()))
        return real(gm, example_inputs, kind)
    monkeypatch.setattr(CG, "compile_graph", spy)
    monkeypatch.setenv("PYFUSER_GRAPH_CACHE", "0")       # the backward compiled at its first call
    x = torch.randn(8, 16, requires_grad=True)
    f = torch.compile(lambda v: torch.nn.functional.gelu(v * 2).sum(-1), backend="pyfuser")
    y = f(x)
    assert gc.isenabled()
    y.sum().backward()
    assert gc.isenabled()
    assert sorted(k for k, _ in seen) == ["backward", "forward"]
    assert not any(on for _, on in seen), seen
    torch.testing.assert_close(x.grad, torch.func.grad(
        lambda v: torch.nn.functional.gelu(v * 2).sum())(x.detach()))


def test_the_jit_compiles_its_first_call_with_the_collector_paused(collector_on, monkeypatch):
    from pyfuser.frontend.torchscript import jit as J
    seen = []
    real = J.CompiledGraph._miss_paused

    def spy(self, *args):
        seen.append(gc.isenabled())
        return real(self, *args)
    monkeypatch.setattr(J.CompiledGraph, "_miss_paused", spy)

    def fn(x):
        return torch.relu(x * 2 + 1)
    g = pyfuser.jit(torch.jit.script(fn))
    x = torch.randn(64)
    torch.testing.assert_close(g(x), fn(x))
    assert seen == [False] and gc.isenabled()
