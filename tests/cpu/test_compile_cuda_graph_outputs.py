"""How graphed torch.compile inference calls hand out their outputs (frontend/fx/
cuda_graph_outputs.py), on the CPU with tests/cpu/fake_graphs.py's stand-in for CUDA graphs:
`cuda_graph_outputs="graph"` hands out tensors on the graph's own output memory and invalidates
those a caller still holds before the next replay of the signature (or when its graph goes);
`"copy"` hands out copies. The stand-in records the invalidations (a CUDA build's makes reading
them raise: tests/gpu/test_compile_cuda_graph_outputs_gpu.py)."""
import gc

import pytest
import torch

import pyfuser
from fake_graphs import FakeGraphs
from pyfuser.frontend.fx import cuda_graphs as CG
from pyfuser.frontend.fx.cuda_graph_outputs import SharedOutputs

pytestmark = pytest.mark.usefixtures("fresh_compile", "no_graphed_calls")


@pytest.fixture(params=["native", "python"])
def graphs(request, monkeypatch):
    """A stand-in that invalidates; the hand-out through the native runner where it is built,
    and in Python."""
    g = FakeGraphs(invalidates=True)
    monkeypatch.setattr(CG, "Backend", lambda: g)
    if request.param == "python":
        monkeypatch.setattr(CG.GraphedInference, "native", lambda self: None)
    return g


def _graphed():
    (g,) = CG.graphed_calls()
    return g


def _hand():
    (e,) = _graphed().entries.values()
    assert isinstance(e.hand, SharedOutputs)
    return e.hand


def _model():
    lin = torch.nn.Linear(8, 8)

    def f(x):
        y = torch.nn.functional.gelu(lin(x)) * 2 + 1
        return y, y.t(), x.sum(-1)
    return f


def test_outputs_dropped_before_the_next_call_are_handed_out_again_without_copies(graphs):
    f = _model()
    c = torch.compile(f, backend=pyfuser.backend, mode="reduce-overhead")
    ptrs = set()
    with torch.no_grad():
        for _ in range(6):
            x = torch.randn(4, 8)
            got, want = c(x), f(x)
            for o, w in zip(got, want):
                torch.testing.assert_close(o, w)
                assert o.stride() == w.stride() and o.storage_offset() == w.storage_offset()
            assert got[0].untyped_storage()._cdata == got[1].untyped_storage()._cdata
            ptrs.add(tuple(o.data_ptr() for o in got))
            del got, o
    g, hand = _graphed(), _hand()
    assert g.replays == 5 and graphs.captures == 1           # as it is, captured, replays
    # every replay's outputs lie on the captured run's memory: no copy
    assert tuple(o.data_ptr() for o in hand.out) in ptrs and len(ptrs) == 2
    assert hand.made == 3 * 5 and g.stale == 0 and not graphs.invalid


def test_an_output_held_across_a_replay_is_invalidated_and_the_new_one_is_valid(graphs):
    f = _model()
    c = torch.compile(f, backend=pyfuser.backend, mode="reduce-overhead")
    with torch.no_grad():
        c(torch.randn(4, 8))
        x1, x2, x3 = (torch.randn(4, 8) for _ in range(3))
        a = c(x1)                       # captured and replayed
        kept = a[1][1:]                 # a view of an output, the output itself dropped
        s = a[2]
        del a
        b = c(x2)
        assert graphs.is_invalid(kept) and graphs.is_invalid(s)
        assert not any(graphs.is_invalid(o) for o in b)
        for o, w in zip(b, f(x2)):
            torch.testing.assert_close(o, w)
        del o
        assert b[0].data_ptr() == kept.untyped_storage().data_ptr()   # the same memory
        assert _graphed().stale == 2                 # the two storages the outputs lie on
        b0 = b[0]
        del b
        c(x3)                                       # b's storages still in use through b0
        assert graphs.is_invalid(b0) and _graphed().stale == 3


def test_each_call_may_feed_its_output_back(graphs):
    """x = c(x): the input is copied into the graph's buffer before the output it was is
    invalidated."""
    w = torch.randn(6, 6) / 3
    f = lambda x: torch.tanh(x @ w) + 0.5       # noqa: E731
    c = torch.compile(f, backend=pyfuser.backend, mode="reduce-overhead")
    x = want = torch.randn(3, 6)
    with torch.no_grad():
        for _ in range(6):
            x, want = c(x), f(want)
            torch.testing.assert_close(x, want)
    assert _graphed().replays == 5 and _graphed().stale == 4


def test_a_dropped_graph_invalidates_what_it_handed_out(graphs, monkeypatch):
    monkeypatch.setattr(CG, "MAX_GRAPHS", 1)
    c = torch.compile(lambda x: x.exp() * 2, backend=pyfuser.backend, mode="reduce-overhead",
                      dynamic=True)
    with torch.no_grad():
        for _ in range(2):
            a = c(torch.randn(5))
        assert _graphed().replays == 1 and not graphs.is_invalid(a)
        c(torch.randn(5))
        assert graphs.is_invalid(a)
        a = c(torch.randn(5))
        for _ in range(2):
            c(torch.randn(7))             # another signature pushes the first out
        assert graphs.is_invalid(a) and len(_graphed().entries) == 1
        b = c(torch.randn(7))
    assert not graphs.is_invalid(b)
    del c
    CG._LIVE.clear()
    torch._dynamo.reset()
    gc.collect()                           # the compiled graph is collected with its graphs
    assert graphs.is_invalid(b)


def test_copy_option_hands_out_copies_valid_for_good(graphs):
    f = _model()
    c = pyfuser.compile(f, cuda_graphs=True, cuda_graph_outputs="copy")
    results = []
    with torch.no_grad():
        for _ in range(5):
            x = torch.randn(4, 8)
            results.append((c(x), f(x)))
    (e,) = _graphed().entries.values()
    assert e.hand is None and _graphed().replays == 4 and not graphs.invalid
    for got, want in results:
        for o, w in zip(got, want):
            torch.testing.assert_close(o, w)
    with pytest.raises(Exception, match="one of"):
        torch.compile(f, backend=pyfuser.backend, options={"cuda_graph_outputs": "share"})(
            torch.ones(4, 8))


def test_a_backend_that_cannot_invalidate_hands_out_copies(fake_graphs):
    """A torch build without `_set_storage_data_ptr_access_error_msg` (no CUDA) copies."""
    c = torch.compile(lambda x: x * 3, backend=pyfuser.backend, mode="reduce-overhead")
    with torch.no_grad():
        got = [c(torch.full((4,), float(i))) for i in range(4)]
    assert _graphed().outputs == "copy" and _graphed().replays == 3
    for i, t in enumerate(got):
        torch.testing.assert_close(t, torch.full((4,), 3.0 * i))


def test_empty_and_scalar_outputs():
    y = torch.ones(2, 3)
    out = [y, torch.empty(0, 4), 7, None, y[1]]
    g = FakeGraphs(invalidates=True)
    hand = SharedOutputs(out, g, "clone it", None)
    res = hand.hand_out()
    assert isinstance(res, list) and res[2] == 7 and res[3] is None
    assert res[1].shape == (0, 4) and res[4].storage_offset() == 3
    assert res[0].untyped_storage()._cdata == res[4].untyped_storage()._cdata
    assert hand.retire() == 1 and g.is_invalid(res[0])
    del res
    assert hand.retire() == 0 and hand.drop() == 0


@pytest.fixture
def poisoned(monkeypatch):
    """A stand-in whose invalidated storages read NaNs (a read after an invalidation shows)."""
    g = FakeGraphs(invalidates=True, poison=True)
    monkeypatch.setattr(CG, "Backend", lambda: g)
    return g


def test_an_output_fed_to_a_call_that_pushes_its_graph_out_is_read_first(poisoned, monkeypatch):
    """x = c(x) where the output is a new signature that pushes the output's graph out (found
    by graph_outputs_fuzz.py, seed 218): the call reads its input before that graph's outputs
    are invalidated (a CUDA build's read raised the 'clone' error)."""
    monkeypatch.setattr(CG, "MAX_GRAPHS", 1)
    f = lambda x: x[1:] * 2                       # noqa: E731
    c = torch.compile(f, backend=pyfuser.backend, mode="reduce-overhead", dynamic=True)
    with torch.no_grad():
        x = torch.randn(5, 4)
        for _ in range(3):
            y = c(x)
        assert _graphed().replays == 2
        want = f(y.clone())
        z = c(y)                                  # a new signature: (4, 4)
        torch.testing.assert_close(z, want)
        assert poisoned.is_invalid(y) and not poisoned.is_invalid(z)
        # one y held across the loop's last replay, the fed one when its graph went
        assert len(_graphed().entries) == 1 and _graphed().stale == 2


def test_a_recapture_that_fails_runs_on_its_inputs_before_the_old_graph_goes(poisoned):
    """A parameter moved (capture again) and the capture fails: the call runs as it is on its
    input, an output of the graph that goes, before that output is invalidated."""
    lin = torch.nn.Linear(6, 6)
    f = lambda x: torch.tanh(lin(x))              # noqa: E731
    c = torch.compile(f, backend=pyfuser.backend, mode="reduce-overhead")
    with torch.no_grad():
        x = torch.randn(3, 6)
        for _ in range(3):
            y = c(x)
        assert _graphed().replays == 2
        lin.weight.data = lin.weight.data.clone()     # a new address: captured again
        poisoned.fail = "no capture this time"
        want = f(y.clone())
        z = c(y)
        torch.testing.assert_close(z, want)
        (e,) = _graphed().entries.values()
        # one y held across the loop's last replay, the fed one when its graph went
        assert e.failed and poisoned.is_invalid(y) and _graphed().stale == 2


def test_a_storage_kept_of_a_dropped_output_is_in_use():
    """`s = out.untyped_storage()` is the alias's own Python object: held alone, it holds the
    memory as much as a tensor does, so it is invalidated before the next replay."""
    g = FakeGraphs(invalidates=True)
    hand = SharedOutputs([torch.ones(4) * 2], g, "clone it", None)
    (t,) = hand.hand_out()
    s = t.untyped_storage()
    del t
    assert hand.in_use() == [0] and hand.retire() == 1 and s._cdata in g.invalid
    (t,) = hand.hand_out()
    del s, t
    assert hand.retire() == 0 and hand.drop() == 0
