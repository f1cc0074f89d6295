"""CUDA graphs for torch.compile's inference graphs (frontend/fx/cuda_graphs.py), on the CPU with
a stand-in for torch.cuda.CUDAGraph that replays by running the captured call again on the same
buffers and writing the same output buffers (what a graph does): the options, new inputs every
call, fresh outputs, parameters updated in place or replaced, and the graphs that run without a
CUDA graph (random ops, inputs written in place, outputs aliasing inputs). Training graphs:
test_compile_cuda_graphs_training.py."""
import copy

import pytest
import torch

import pyfuser
from fake_graphs import FakeGraphs
from pyfuser.frontend.fx import cuda_graphs as CG

pytestmark = pytest.mark.usefixtures("fresh_compile", "no_graphed_calls")



def _graphed():
    (g,) = CG.graphed_calls()
    return g


def test_options_and_modes():
    f = lambda x: x * 2 + 1   # noqa: E731
    with pytest.raises(Exception, match="takes a bool"):
        torch.compile(f, backend=pyfuser.backend, options={"cuda_graphs": 1})(torch.ones(2))
    with pytest.raises(Exception, match="not supported"):
        torch.compile(f, backend=pyfuser.backend, mode="max-autotune")(torch.ones(2))
    torch.compile(f, backend=pyfuser.backend, mode="default")(torch.ones(2))
    assert CG.graphed_calls() == []


@pytest.mark.parametrize("how", ["mode", "options", "pyfuser.compile"])
def test_new_inputs_every_call_and_fresh_outputs(fake_graphs, how):
    lin = torch.nn.Linear(8, 8)

    def f(x, s: float):
        return torch.nn.functional.gelu(lin(x)) * s + 1, x.sum(-1)
    c = {"mode": lambda: torch.compile(f, backend=pyfuser.backend, mode="reduce-overhead"),
         "options": lambda: torch.compile(f, backend=pyfuser.backend,
                                          options={"cuda_graphs": True}),
         "pyfuser.compile": lambda: pyfuser.compile(f, cuda_graphs=True)}[how]()
    results = []
    with torch.no_grad():
        for _ in range(5):
            x = torch.randn(4, 8)
            got, want = c(x, 2.0), f(x, 2.0)
            for o, w in zip(got, want):
                torch.testing.assert_close(o, w)
            results.append((got, want))
    g = _graphed()
    assert fake_graphs.captures == 1 and g.replays == 4        # as it is, captured, replays
    assert fake_graphs.replays == 4
    for got, want in results:                          # earlier results were not overwritten
        for o, w in zip(got, want):
            torch.testing.assert_close(o, w)


def test_parameters_updated_in_place_or_replaced(fake_graphs):
    lin = torch.nn.Linear(8, 8)
    c = torch.compile(lin, backend=pyfuser.backend, mode="reduce-overhead")
    x = torch.randn(3, 8)
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(c(x), lin(x))
        g = _graphed()
        assert g.static_idx, "AOTAutograd names the parameters"
        lin.weight.mul_(2)                             # in place: the same address
        torch.testing.assert_close(c(x), lin(x))
        assert fake_graphs.captures == 1
        lin.weight = torch.nn.Parameter(torch.randn(8, 8))   # a new tensor: captured again
        torch.testing.assert_close(c(x), lin(x))
    assert fake_graphs.captures == 2 and g.static_idx == {0, 1}   # recaptured, not recompiled


def test_signatures_each_get_a_graph(fake_graphs):
    c = torch.compile(lambda x: torch.tanh(x) * 3, backend=pyfuser.backend,
                      mode="reduce-overhead", dynamic=True)
    with torch.no_grad():
        for n in (4, 6, 4, 6, 4, 6):
            x = torch.randn(n, 5)
            torch.testing.assert_close(c(x), torch.tanh(x) * 3)
    assert fake_graphs.captures == 2


def test_random_ops_draw_anew_in_every_replay(fake_graphs):
    """Dropout in a graphed call: captured once, and every replay draws new numbers (the
    stand-in replays as a graph does: the kernels' host seed and offset are the capture's, only
    the device words its captured randint refreshes differ), with dropout's values and rate."""
    def f(x):
        return torch.nn.functional.dropout(x * 2, 0.5, training=True) + 1
    c = torch.compile(f, backend=pyfuser.backend, mode="reduce-overhead")
    with torch.no_grad():
        outs = [c(torch.ones(64, 64)) for _ in range(5)]
    g = _graphed()
    assert fake_graphs.captures == 1 and g.why_not is None and g.replays >= 3
    assert all(not torch.equal(a, b) for a, b in zip(outs[2:], outs[3:]))
    for o in outs:
        assert set(o.unique().tolist()) <= {1.0, 5.0}
        assert 0.45 < (o == 5.0).float().mean().item() < 0.55    # 4096 draws at p = 0.5


def test_random_draws_seeded_on_the_host_fail_the_capture():
    """Inside a capture, a draw only the host seeds (the evaluator's random ops) raises, so the
    capture fails (and the call runs without a graph) instead of repeating its numbers."""
    from pyfuser.runtime import rng
    with rng.capturing("cpu"):
        with pytest.raises(rng.HostDrawInCapture, match="CUDA-graph capture"):
            rng.host_draw("cpu", 4)
        seeds = [rng.launch_state("cpu", 4) for _ in range(2)]
    assert seeds == [(0, 0), (0, 4)]            # kernels: the capture's seed and offsets
    assert rng.state_tensor("cpu").tolist() == [0, 0]         # outside: zeros again


def test_input_written_in_place_runs_without_a_graph(fake_graphs):
    def f(x):
        x.mul_(2)
        return x + 1
    c = torch.compile(f, backend=pyfuser.backend, mode="reduce-overhead")
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(5)
            x0 = x.clone()
            torch.testing.assert_close(c(x), x0 * 2 + 1)
            torch.testing.assert_close(x, x0 * 2)
    assert fake_graphs.captures == 0 and "writes input 0 in place" in _graphed().why_not


def test_output_aliasing_an_input_keeps_eager_semantics(fake_graphs):
    def f(x):
        return x[1:], torch.sigmoid(x) * 2
    c = torch.compile(f, backend=pyfuser.backend, mode="reduce-overhead")
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(6, 3)
            view, y = c(x)
            torch.testing.assert_close(y, torch.sigmoid(x) * 2)
            assert view.data_ptr() == x[1:].data_ptr()     # still a view of the caller's input
    (entry,) = _graphed().entries.values()
    assert "shares memory with an input" in entry.failed and _graphed().replays == 0


def test_failed_capture_runs_as_it_is(monkeypatch):
    g = FakeGraphs(fail="operation not permitted when stream is capturing")
    monkeypatch.setattr(CG, "Backend", lambda: g)
    c = torch.compile(lambda x: x.exp() - 1, backend=pyfuser.backend, mode="reduce-overhead")
    with torch.no_grad():
        for _ in range(4):
            x = torch.randn(7)
            torch.testing.assert_close(c(x), x.exp() - 1)
    (entry,) = _graphed().entries.values()
    assert "capture failed" in entry.failed and g.captures == 0


def test_outputs_keep_strides_and_aliasing_and_expanded_inputs_run_without_a_graph(fake_graphs):
    def f(x):
        y = torch.sigmoid(x) * 2
        return y[:, :3], y.t(), y.sum(0).expand(3, 5)
    c = torch.compile(f, backend=pyfuser.backend, mode="reduce-overhead")
    with torch.no_grad():
        for _ in range(4):
            x = torch.randn(4, 5)
            got, want = c(x), f(x)
            for g, w in zip(got, want):
                torch.testing.assert_close(g, w)
                assert g.stride() == w.stride() and g.storage_offset() == w.storage_offset()
            # views of one value stay views of one copy, as eager's are of one tensor
            assert got[0].untyped_storage().data_ptr() == got[1].untyped_storage().data_ptr()
    assert _graphed().replays == 3
    CG._LIVE.clear()
    e = torch.compile(lambda x: torch.tanh(x) + 1, backend=pyfuser.backend,
                      mode="reduce-overhead")
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(1, 5).expand(4, 5)      # an expanded input
            torch.testing.assert_close(e(x), torch.tanh(x) + 1)
    (entry,) = _graphed().entries.values()
    assert "overlaps itself" in entry.failed and _graphed().replays == 0


class WarmsUpThenFails(FakeGraphs):
    """A capture that runs the warm-up (its writes land) and is then refused."""

    def capture(self, fn, device):
        fn()
        raise RuntimeError("operation not permitted when stream is capturing")


class _Stateful(torch.nn.Module):
    """A forward that writes its buffers in place: a step counter and a KV-cache row; with
    `leak`, an output that is a view of a parameter (the call then runs without a graph)."""

    def __init__(self, leak=False):
        super().__init__()
        self.leak = leak
        self.w = torch.nn.Parameter(torch.randn(3))
        self.register_buffer("steps", torch.zeros(()))
        self.register_buffer("cache", torch.zeros(4, 3))

    def forward(self, x, pos: int):
        self.steps.add_(1)
        self.cache[pos] = x * self.w
        out = self.cache.sum(0) * self.steps
        return (out, self.w[1:]) if self.leak else (out,)


@pytest.mark.parametrize("how", ["replayed", "capture fails", "output aliases a parameter"])
def test_static_inputs_the_graph_writes_are_written_once_per_call(monkeypatch, how):
    """Buffers are static inputs (by address) like parameters, so a graph writing them is
    graphed; the capture's own runs of the graph (the warm-up, a stand-in's capture) must not
    leave their writes: a step counter counted twice, batch norm's running stats updated twice."""
    g = WarmsUpThenFails() if how == "capture fails" else FakeGraphs()
    monkeypatch.setattr(CG, "Backend", lambda: g)
    torch.manual_seed(0)
    m = _Stateful(leak=how == "output aliases a parameter")
    ref = _Stateful(leak=m.leak)
    ref.load_state_dict(m.state_dict())
    c = torch.compile(m, backend=pyfuser.backend, mode="reduce-overhead")
    with torch.no_grad():
        for i in range(4):
            x = torch.randn(3)
            for o, w in zip(c(x, 1), ref(x, 1)):
                torch.testing.assert_close(o, w)
            assert m.steps.item() == ref.steps.item() == i + 1
    torch.testing.assert_close(m.cache, ref.cache)
    gi = _graphed()
    assert len(gi.written) == 2 and gi.why_not is None   # steps and cache: static, written
    assert gi.replays == (3 if how == "replayed" else 0)

    CG._LIVE.clear()
    torch.manual_seed(0)
    bn = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), torch.nn.BatchNorm2d(4)).train()
    ref = copy.deepcopy(bn)
    c = torch.compile(bn, backend=pyfuser.backend, mode="reduce-overhead")
    with torch.no_grad():                 # train mode under no_grad: an inference graph
        for _ in range(4):
            x = torch.randn(2, 3, 5, 5)
            torch.testing.assert_close(c(x), ref(x))
    for name, buf in bn.named_buffers():
        torch.testing.assert_close(buf, dict(ref.named_buffers())[name], msg=name)


def test_inputs_with_gaps_or_undecidable_overlap_are_replayed(fake_graphs):
    """Only a certain self-overlap (an expanded axis) keeps a signature off the graph: a slice
    with a step, or an as_strided view the overlap check cannot decide, copies into a buffer of
    its strides with its values."""
    c = torch.compile(lambda x: torch.tanh(x) * 2, backend=pyfuser.backend,
                      mode="reduce-overhead")
    with torch.no_grad():
        for mk in (lambda: torch.randn(6, 8)[1:, ::2],
                   lambda: torch.randn(7)[1:].as_strided((3, 3), (1, 1), 1)):
            for _ in range(3):
                x = mk()
                torch.testing.assert_close(c(x), torch.tanh(x) * 2)
    gs = CG.graphed_calls()                  # one compiled graph per layout (Dynamo's guards)
    assert all(e.failed is None for g in gs for e in g.entries.values())
    assert sum(g.replays for g in gs) == 4


def test_backend_orders_a_failed_warm_up_before_what_follows(monkeypatch):
    """A warm-up that raises may have queued writes on its side stream (a static input it
    writes): the current stream still waits for them, so the caller's restore and plain run
    come after (streams recorded by stand-ins; the CPU has none)."""
    import contextlib

    from pyfuser.runtime import graph_capture
    waits = []

    class Stream:
        def __init__(self, name):
            self.name = name

        def wait_stream(self, other):
            waits.append((self.name, other.name))
    monkeypatch.setattr(torch.cuda, "device", lambda d: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda d=None: Stream("current"))
    monkeypatch.setattr(torch.cuda, "Stream", lambda d=None: Stream("side"))
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())

    def warm_up_fails():
        raise RuntimeError("an error in the warm-up")
    with pytest.raises(RuntimeError, match="warm-up"):
        graph_capture.Backend().capture(warm_up_fails, None)
    assert waits == [("side", "current"), ("current", "side")]


def test_a_capture_records_only_its_own_threads_draws():
    """A capture in one thread leaves another thread's launches on the host draw (a capture
    records its own thread's launches only)."""
    import threading
    from pyfuser.runtime import rng
    seen = {}

    def other():
        with rng.fixed(77, 5):
            seen["fixed"] = rng.launch_state("cpu", 4)
        seen["host"] = rng.host_draw("cpu", 4)          # no HostDrawInCapture here
        seen["words"] = rng.state_tensor("cpu").tolist()
    with rng.capturing("cpu") as cap:
        assert rng.launch_state("cpu", 4) == (0, 0) and cap.state is not None
        t = threading.Thread(target=other)
        t.start()
        t.join()
    assert seen["fixed"] == (77, 5) and seen["words"] == [0, 0]
    assert isinstance(seen["host"][0], int) and seen["host"][1] == 0
