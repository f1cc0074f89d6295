"""Graphed torch.compile inference calls hand out the graph's own output memory on a GPU
(frontend/fx/cuda_graph_outputs.py): no copy while the caller drops each result before the
next call, a result still held when the graph replays again (or is dropped) raises on reading,
never shows another call's values, and `cuda_graph_outputs="copy"` keeps every result."""
import gc

import pytest
import torch

import pyfuser
from pyfuser.frontend.fx import cuda_graphs as CG

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("fresh_compile")]
STALE = "clone an output you keep across calls"


@pytest.fixture(autouse=True)
def _no_graphed_calls():
    CG._LIVE.clear()
    yield
    torch.cuda.synchronize()


def _mlp():
    m = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64),
                            torch.nn.LayerNorm(64))
    return m.cuda().eval()


def test_results_on_the_graph_memory_and_a_held_one_raises():
    m = _mlp()
    c = pyfuser.compile(m, mode="reduce-overhead")
    xs = [torch.randn(32, 64, device="cuda") for _ in range(6)]
    with torch.no_grad():
        ptrs = set()
        for x in xs[:4]:
            y = c(x)
            torch.testing.assert_close(y, m(x), rtol=1e-4, atol=1e-4)
            ptrs.add(y.data_ptr())
            del y
        (g,) = CG.graphed_calls()
        assert g.captures == 1 and g.replays == 3 and g.stale == 0
        (e,) = g.entries.values()
        assert e.hand is not None and e.out[0].data_ptr() in ptrs and len(ptrs) == 2
        held = c(xs[4])
        view = held[3:]
        want = m(xs[4])
        torch.testing.assert_close(held, want, rtol=1e-4, atol=1e-4)
        new = c(xs[5])                       # the graph rewrites the memory `held` shows
        torch.testing.assert_close(new, m(xs[5]), rtol=1e-4, atol=1e-4)
        assert g.stale == 1 and new.data_ptr() == e.out[0].data_ptr()
        for t in (held, view):
            with pytest.raises(RuntimeError, match=STALE):
                t + 1
        with pytest.raises(RuntimeError, match=STALE):
            print(held)


def test_output_fed_back_and_dropped_graphs():
    w = torch.randn(128, 128, device="cuda") / 12
    f = lambda x: torch.tanh(x @ w) + 0.25          # noqa: E731
    c = torch.compile(f, backend=pyfuser.backend, mode="reduce-overhead")
    x = want = torch.randn(16, 128, device="cuda")
    with torch.no_grad():
        for _ in range(6):
            x, want = c(x), f(want)
            torch.testing.assert_close(x, want, rtol=1e-5, atol=1e-5)
    held = x
    del c
    CG._LIVE.clear()
    torch._dynamo.reset()
    gc.collect()                                    # its graphs and their memory go
    torch.cuda.empty_cache()
    with pytest.raises(RuntimeError, match=STALE):
        held.sum()


def test_copy_option_keeps_every_result():
    m = _mlp()
    c = pyfuser.compile(m, cuda_graphs=True, cuda_graph_outputs="copy")
    with torch.no_grad():
        xs = [torch.randn(32, 64, device="cuda") for _ in range(5)]
        got = [c(x) for x in xs]
        for x, y in zip(xs, got):
            torch.testing.assert_close(y, m(x), rtol=1e-4, atol=1e-4)
    (g,) = CG.graphed_calls()
    assert g.replays == 4 and g.outputs == "copy"
