"""The cyclic garbage collector while pyfuser compiles (runtime/gc_pause.py): by default no
full pass inside the scope (the oldest generation's threshold raised, restored after), with
`PYFUSER_GC_PAUSE=1` the collector paused, with `=0` left alone; the scope restores the
collector's state, nests, and respects a collector the program turned off; the torch.compile
backend (forward, and a backward compiled at its first call) and the TorchScript jit's first
call compile inside it, and leave the collector as it was after."""
from __future__ import annotations

import gc

import pytest
import torch

import pyfuser
from pyfuser.frontend.fx import compile_graph as CG
from pyfuser.runtime.gc_pause import DEFER_THRESHOLD, paused

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


def test_paused_leaves_an_off_collector_off_and_zero_leaves_it_alone(collector_on, monkeypatch):
    gc.disable()
    with paused():
        assert not gc.isenabled()
    assert not gc.isenabled()
    gc.enable()
    before = gc.get_threshold()
    monkeypatch.setenv("PYFUSER_GC_PAUSE", "0")
    with paused():
        assert gc.isenabled() and gc.get_threshold() == before


@pytest.mark.parametrize("value", [None, "defer", "anything else"])
def test_by_default_no_full_pass_inside_and_the_thresholds_come_back(collector_on, monkeypatch,
                                                                     value):
    if value is None:
        monkeypatch.delenv("PYFUSER_GC_PAUSE")
    else:
        monkeypatch.setenv("PYFUSER_GC_PAUSE", value)
    before = gc.get_threshold()
    young = []

    def count(phase, info):
        if phase == "start" and info["generation"] < 2:
            young.append(info)
    gc.callbacks.append(count)
    try:
        with pytest.raises(ValueError):
            with paused():
                assert gc.isenabled()
                assert gc.get_threshold()[:2] == before[:2]
                assert gc.get_threshold()[2] > 10 ** 6
                with paused():                       # nested: the outer scope's thresholds
                    assert gc.get_threshold()[2] > 10 ** 6
                # cyclic garbage in bulk: the young passes run (the pause would stop them)
                for _ in range(200_000):
                    a = []
                    a.append(a)
                assert young                         # the young passes still free cycles
                raise ValueError("inside")
    finally:
        gc.callbacks.remove(count)
    assert gc.get_threshold() == before and gc.isenabled()


@pytest.mark.parametrize("how", ["1", "defer"])
def test_the_backend_compiles_forward_and_backward_in_the_scope(collector_on, monkeypatch, how):
    monkeypatch.setenv("PYFUSER_GC_PAUSE", how)
    before = gc.get_threshold()
    seen = []
    real = CG.compile_graph

    def spy(gm, example_inputs, kind):
        # paused: the collector off; deferred: on, with no full pass (the oldest threshold up)
        off = not gc.isenabled() if how == "1" else \
            gc.isenabled() and gc.get_threshold()[2] == DEFER_THRESHOLD
        seen.append((kind, not off))
        return real(gm, example_inputs, kind)
    monkeypatch.setattr(CG, "compile_graph", spy)
    monkeypatch.setenv("PYFUSER_GRAPH_CACHE", "0")       # the backward compiled at its first call
    x = torch.randn(8, 16, requires_grad=True)
    f = torch.compile(lambda v: torch.nn.functional.gelu(v * 2).sum(-1), backend="pyfuser")
    y = f(x)
    assert gc.isenabled() and gc.get_threshold() == before
    y.sum().backward()
    assert gc.isenabled() and gc.get_threshold() == before
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
