"""`pyfuser.jit(f, cuda_graphs=True)` (frontend/torchscript/cuda_graphs.py) on the fake CUDA of
fake_cuda.py, with a stand-in for torch.cuda.CUDAGraph that replays by running the captured
function on the same input buffers and writing the same output buffers (what a graph does): new
input tensors every call, fresh outputs, parameters replaced or updated in place, and the cases
that run without a graph (capture failure, float inputs, inputs written, outputs aliasing
inputs, grad mode)."""
import pytest
import torch

import fake_cuda
import pyfuser
from fake_graphs import FakeGraphs, flat
from pyfuser.runtime import dispatch


@pytest.fixture
def fake(monkeypatch, tmp_path):
    f = fake_cuda.install(monkeypatch, tmp_path)
    yield f
    dispatch.clear_caches()


def _graphed(obj, backend):
    f = pyfuser.jit(obj, cuda_graphs=True)
    f._graph_backend = backend
    return f


def _abc(a, b, c):
    return (a + b) * c, a - c


def test_new_inputs_every_call_and_fresh_outputs(fake):
    g = FakeGraphs()
    f = _graphed(torch.jit.script(_abc), g)
    results = []
    with torch.no_grad():
        for i in range(5):
            xs = [torch.randn(6, 7) for _ in range(3)]
            out = f(*xs)
            for o, w in zip(out, _abc(*xs)):
                torch.testing.assert_close(o, w)
            results.append((out, _abc(*xs)))
            assert f.last_run.kernels == 1
    assert g.captures == 1 and g.replays == 4               # the plan, the capture, replays
    for out, want in results:                              # earlier results were not overwritten
        for o, w in zip(out, want):
            torch.testing.assert_close(o, w)
    (plan,) = f.plans.values()
    assert all(o.data_ptr() not in [s.data_ptr() for s in plan.static_out]
               for o in results[-1][0])


def test_passing_the_graph_buffers_back_copies_nothing(fake):
    g = FakeGraphs()
    f = _graphed(torch.jit.script(_abc), g)
    xs = [torch.randn(5) for _ in range(3)]
    with torch.no_grad():
        f(*xs)
        f(*xs)
        (plan,) = f.plans.values()
        static = list(plan.static_in)
        for s in static:
            s.fill_(2.0)
        copies = []
        real = torch.Tensor.copy_
        torch.Tensor.copy_ = lambda self, src, *a: copies.append(1) or real(self, src, *a)
        try:
            out = f(*static)
        finally:
            torch.Tensor.copy_ = real
    torch.testing.assert_close(out[0], torch.full((5,), 8.0))
    assert copies == []                          # no input copied (the fake writes storages)


class _Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4))

    def forward(self, x):
        return torch.relu(x * self.w + 1.0)


def test_parameters_updated_in_place_or_replaced(fake):
    g = FakeGraphs()
    m = torch.jit.script(_Scaled().eval())
    f = _graphed(m, g)
    with torch.no_grad():
        x = torch.randn(3, 4)
        for _ in range(3):
            torch.testing.assert_close(f(x), m(x))
        m.w.mul_(2.0)                                      # in place: same memory
        torch.testing.assert_close(f(x), m(x))
        assert g.captures == 1
        m.w = torch.nn.Parameter(torch.randn(4))           # replaced: captured again
        torch.testing.assert_close(f(x), m(x))
        torch.testing.assert_close(f(x), m(x))
    assert g.captures == 2


def test_a_failed_capture_runs_the_plan(fake, caplog):
    import logging
    caplog.set_level(logging.INFO, logger="pyfuser")
    f = _graphed(torch.jit.script(_abc), FakeGraphs(fail="operation not permitted when "
                                                         "stream is capturing"))
    with torch.no_grad():
        for _ in range(4):
            xs = [torch.randn(5) for _ in range(3)]
            for o, w in zip(f(*xs), _abc(*xs)):
                torch.testing.assert_close(o, w)
    assert sum("without a CUDA graph" in r.getMessage() for r in caplog.records) == 1


def _with_float(x, s: float):
    return x * s


def _writes_input(x):
    x.add_(1.0)
    return x * 2.0


def _returns_view(x):
    return x.t(), x + 1.0


def test_what_runs_without_a_graph(fake):
    for fn, args in [(_with_float, lambda: (torch.randn(3), 2.0)),
                     (_writes_input, lambda: (torch.randn(3),)),
                     (_returns_view, lambda: (torch.randn(3, 2),))]:
        g = FakeGraphs()
        f = _graphed(torch.jit.script(fn), g)
        with torch.no_grad():
            for _ in range(3):
                a, b = args(), args()
                b = tuple(x.clone() if isinstance(x, torch.Tensor) else x for x in a)
                got, want = f(*a), fn(*b)
                for o, w in zip(flat(got), flat(want)):
                    torch.testing.assert_close(o, w)
                for x, y in zip(a, b):
                    if isinstance(x, torch.Tensor):
                        torch.testing.assert_close(x, y)
        assert g.replays == 0, fn.__name__
    x = torch.randn(3, 2)
    with torch.no_grad():
        f(x)
        t, _ = f(x)
    assert t.data_ptr() == x.data_ptr()                    # a view of the caller's tensor


def test_grad_mode_runs_the_plan(fake):
    g = FakeGraphs()
    f = _graphed(torch.jit.script(_abc), g)
    xs = [torch.randn(5) for _ in range(3)]
    for _ in range(3):
        for o, w in zip(f(*xs), _abc(*xs)):
            torch.testing.assert_close(o, w)
    assert g.captures == 0
    with torch.no_grad():
        for _ in range(3):
            f(*xs)
    assert g.captures == 1 and g.replays == 2


@pytest.mark.parametrize("name", ["bert", "resnet18_train"])
def test_models_through_graphs(fake, name):
    """BERT (traced) replays from its graph with eager's results; a train-mode ResNet, whose
    batch norms write running statistics (in the inputs' alias class), runs without one."""
    import copy
    import model_corpus as M
    case = next(c for c in M.CASES if c.name == name)
    if not M.available(case):
        pytest.skip(f"{case.needs} is not installed")
    model, inputs = case.build("cpu")
    ref = copy.deepcopy(model)
    model64 = copy.deepcopy(model).double()
    inputs64 = [x.double() if x.is_floating_point() else x for x in inputs]
    g = FakeGraphs()
    f = _graphed(M.compile_case(case, model, inputs), g)
    with torch.no_grad():
        for _ in range(4):
            outs = zip(M.tensors(f(*inputs)), M.tensors(ref(*inputs)),
                       M.tensors(model64(*inputs64)))
            for a, b, x in outs:
                M.as_close_as_eager(a, b, x, "output")
    if name == "bert":
        assert f._variant.no_graphs is None and g.captures == 1 and g.replays == 3
    else:
        assert "written in place" in f._variant.no_graphs and g.captures == 0


def test_module_writing_its_buffers_keeps_eagers_statistics(fake):
    """Batch norm in train mode under no_grad writes its running statistics each call; the
    capture's warm-up run must not apply that write once more."""
    bn = torch.nn.BatchNorm1d(6).train()
    ref = torch.nn.BatchNorm1d(6).train()
    g = FakeGraphs()
    f = _graphed(torch.jit.script(bn), g)
    with torch.no_grad():
        for _ in range(4):
            x = torch.randn(8, 6)
            torch.testing.assert_close(f(x), ref(x))
            torch.testing.assert_close(bn.running_mean, ref.running_mean)
    assert bn.num_batches_tracked.item() == 4


def _relu_plus_one(x):
    return torch.relu(x) + 1.0


def test_an_expanded_input_runs_the_plan(fake):
    """An input with a zero stride has no buffer of its strides to copy into (copy_ refuses):
    its signature runs the plan, as a call without graphs does, instead of failing."""
    g = FakeGraphs()
    f = _graphed(torch.jit.script(_relu_plus_one), g)
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(1, 5).expand(3, 5)
            torch.testing.assert_close(f(x), _relu_plus_one(x))
    assert g.captures == 0


def _drop(x):
    return torch.nn.functional.dropout(x * 2.0, 0.5, True) + 1.0


def test_random_ops_draw_anew_in_every_replay(fake):
    """Dropout under pyfuser.jit(cuda_graphs=True) (eager's aten::dropout between two fused
    groups here; graph-safe in a real graph): every replay draws a new mask, not the captured
    run's mask again."""
    g = FakeGraphs()
    f = _graphed(torch.jit.script(_drop), g)
    x = torch.ones(64, 64)
    with torch.no_grad():
        outs = [f(x) for _ in range(5)]
    assert g.captures == 1 and g.replays == 4
    assert all(not torch.equal(a, b) for a, b in zip(outs[1:], outs[2:]))
    for o in outs:
        assert set(o.unique().tolist()) <= {1.0, 5.0}
        assert 0.45 < (o == 5.0).float().mean().item() < 0.55
