"""Call plans of pyfuser.jit (frontend/torchscript/plan.py) on the fake CUDA of fake_cuda.py,
whose launches run the kernels through the CPU interpreter: plan reuse with new tensors, one
plan (and one lowering, with its own kernels) per input signature, bound group programs (no
key per group), no host-to-device copy per call (0-dim CPU tensors by value), grid-reduction
workspaces through a plan, errors naming the node, the plan bound, invalidation; and plans on
the CPU executors over the whole fuser corpus."""
import os
import pathlib
import sys

import torch
import pytest

import fake_cuda
import pyfuser
from fuser_corpus import CASES
from pyfuser.frontend.torchscript import group_runner as GR
from pyfuser.frontend.torchscript import jit as J
from pyfuser.frontend.torchscript import plan as P
from pyfuser.runtime import dispatch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from bench.common import load_module_from_path  # noqa: E402


@pytest.fixture
def fake(monkeypatch, tmp_path):
    f = fake_cuda.install(monkeypatch, tmp_path)
    yield f
    dispatch.clear_caches()


def _abc(a, b, c):
    return (a + b) * c


def _recordings(monkeypatch):
    made = []
    real = P.build_plan

    def counting(*a, **k):
        made.append(1)
        return real(*a, **k)
    monkeypatch.setattr(P, "build_plan", counting)
    return made


def _sites(f):
    (plan,) = [p for p in f.plans.values()]
    return list(plan.sites.values())


def test_a_plan_is_reused_with_new_tensors(fake, monkeypatch):
    made = _recordings(monkeypatch)
    f = pyfuser.jit(torch.jit.script(_abc))
    keys = []
    monkeypatch.setattr(GR.GroupRunner, "fast", lambda self, args: keys.append(1))
    for i in range(4):
        xs = [torch.randn(40, 50) for _ in range(3)]
        n = len(fake.launches)
        out = f(*xs)
        torch.testing.assert_close(out, _abc(*xs))
        assert len(fake.launches) == n + 1 and f.last_run.kernels == 1
        _, grid, _, params = fake.launches[-1]
        ptrs = [v for k, v in params.items() if k.startswith("T")]
        assert ptrs == [x.data_ptr() for x in xs] + [out.data_ptr()]     # this call's tensors
    assert len(made) == 1 and len(f.plans) == 1
    assert _sites(f) == ["bound"] and not keys                         # no key per group


def test_a_second_signature_gets_its_own_plan_and_kernel(fake):
    f = pyfuser.jit(torch.jit.script(_abc))
    names = []
    for dtype in (torch.float32, torch.float64, torch.float32, torch.float64):
        xs = [torch.randn(8, 16, dtype=dtype) for _ in range(3)]
        for _ in range(2):
            out = f(*xs)
            assert out.dtype == dtype
            torch.testing.assert_close(out, _abc(*xs))
            assert f.last_run.eager_groups == 0 and f.last_run.kernels == 1
            names.append(fake.launches[-1][0])
    assert len(f.plans) == 2 and all(p is not None for p in f.plans.values())
    (runner,) = f.runners.values()
    assert len(runner.variants) == 2
    assert names[0] == names[4] and names[2] == names[6]
    assert len(fake.launches) == 8


def test_new_sizes_make_a_new_plan_but_no_new_lowering(fake):
    f = pyfuser.jit(torch.jit.script(_abc))
    for n in (10, 20, 10):
        xs = [torch.randn(n) for _ in range(3)]
        torch.testing.assert_close(f(*xs), _abc(*xs))
        torch.testing.assert_close(f(*xs), _abc(*xs))
    assert len(f.plans) == 2
    (runner,) = f.runners.values()
    assert len(runner.variants) == 1


def _scale(x, s):
    return x * s + 1.0


def test_zero_dim_cpu_tensors_travel_by_value(fake):
    """A 0-dim CPU tensor beside CUDA tensors is a kernel parameter (no copy to the device),
    with eager's promotion: a float64 0-dim tensor does not make a float32 result float64."""
    f = pyfuser.jit(torch.jit.trace(_scale, (torch.randn(4, 5), torch.tensor(2.0))))
    for v in (2.0, -3.5, 2.0):
        x = torch.randn(4, 5)
        s = fake.host(torch.tensor(v, dtype=torch.float64))
        for _ in range(2):
            out = f(x, s)
            assert out.dtype == torch.float32
            torch.testing.assert_close(out, _scale(x, torch.tensor(v, dtype=torch.float64)))
            assert f.last_run.kernels == 1 and f.last_run.eager_groups == 0
    assert fake.h2d == []
    (runner,) = f.runners.values()
    (lowered,) = [v for v in runner.variants.values()]
    assert lowered.by_value == (1,)


def _colsum(x):
    return x.sum(0) * 2.0


def test_a_grid_reduction_keeps_its_workspaces_in_a_plan(fake):
    """A sum over axis 0 of [8192, 64] is one kernel with a grid reduction: its partials and
    semaphores are allocated per launch through the bound program too."""
    from pyfuser.runtime import executor as X
    f = pyfuser.jit(torch.jit.script(_colsum))
    for _ in range(3):
        x = torch.randn(8192, 64)
        with torch.no_grad():
            out = f(x)
        torch.testing.assert_close(out, _colsum(x), rtol=1e-4, atol=1e-3)
        assert f.last_run.kernels == 1
    (runner,) = f.runners.values()
    ex = dispatch.get_executor(runner.lowered.fusion)
    fast = next(iter(ex._fast.values()))
    assert fast.workspaces and any(k == "semaphores" for _, _, k in fast.workspaces)
    assert isinstance(ex, X.FusionExecutor) and _sites(f) == ["bound"]


def _with_linear(x, w, b):
    y = torch.nn.functional.linear(x, w, b)
    return torch.relu(y) * 2.0, y.shape[0]


def test_plan_with_aten_ops_and_host_values(fake):
    f = pyfuser.jit(torch.jit.script(_with_linear))
    for _ in range(3):
        x, w, b = torch.randn(5, 7), torch.randn(3, 7), torch.randn(3)
        got, n = f(x, w, b)
        want, m = _with_linear(x, w, b)
        torch.testing.assert_close(got, want)
        assert n == m == 5


def _boom(x, i: int):
    y = x * 2
    return y[i] + 1


def test_an_error_in_a_plan_names_the_node(fake):
    from pyfuser.errors import RunnerError
    f = pyfuser.jit(torch.jit.script(_boom))
    x = torch.randn(3, 4)
    torch.testing.assert_close(f(x, 1), _boom(x, 1))
    with pytest.raises(RunnerError, match="aten::select"):
        f(x, 7)                                 # another key: the checked run names it
    torch.testing.assert_close(f(x, 2), _boom(x, 2))
    torch.testing.assert_close(f(x, 2), _boom(x, 2))
    f._variant.plans[next(k for k in f.plans if 2 in k)] = next(iter(f.plans.values()))
    with pytest.raises(RunnerError, match="aten::select"):
        f(torch.randn(1, 4), 2)                 # a plan raising: named from its line


def test_plans_are_bounded(fake, monkeypatch):
    monkeypatch.setattr(J, "MAX_PLANS", 3)
    f = pyfuser.jit(torch.jit.script(_abc))
    for n in range(1, 7):
        xs = [torch.randn(n) for _ in range(3)]
        torch.testing.assert_close(f(*xs), _abc(*xs))
        assert len(f.plans) <= 3


def test_clear_caches_drops_the_plans(fake):
    f = pyfuser.jit(torch.jit.script(_abc))
    xs = [torch.randn(40) for _ in range(3)]
    f(*xs)
    f(*xs)
    assert len(f.plans) == 1
    dispatch.clear_caches()
    assert len(f.plans) == 0
    torch.testing.assert_close(f(*xs), _abc(*xs))
    torch.testing.assert_close(f(*xs), _abc(*xs))
    assert _sites(f) == ["bound"]


def test_under_autograd_groups_run_eagerly_and_outputs_require_grad(fake):
    f = pyfuser.jit(torch.jit.script(_abc))
    xs = [torch.randn(6, requires_grad=True) for _ in range(3)]
    for _ in range(3):
        out = f(*xs)
        assert out.requires_grad and f.last_run.eager_groups == 1 and f.last_run.kernels == 0
    out.sum().backward()
    torch.testing.assert_close(xs[2].grad, (xs[0] + xs[1]).detach())
    ys = [x.detach() for x in xs]
    for _ in range(2):                          # grad mode on, nothing requires grad: fused
        torch.testing.assert_close(f(*ys), _abc(*ys))
        assert f.last_run.kernels == 1 and f.last_run.eager_groups == 0


def _views_only(x):
    return x.t().float()


def test_identity_group_is_no_call(fake):
    f = pyfuser.jit(torch.jit.script(_views_only))
    x = torch.randn(3, 4)
    for _ in range(3):
        out = f(x)
        assert torch.equal(out, x.t()) and out.data_ptr() == x.data_ptr()
    (plan,) = f.plans.values()
    body = plan.source.splitlines()[2:-2]            # between `st = S` and `CG.last_run = st`
    assert len(body) == 1 and body[0].strip().startswith("v0 = x0.as_strided(")
    assert len(fake.launches) == 0


@pytest.mark.parametrize("mode", ["evaluator", "interpret"])
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_corpus_through_plans_matches_eager(case, mode):
    obj = torch.jit.trace(case.fn, tuple(case.inputs())) if case.traced \
        else torch.jit.script(case.fn)
    f = pyfuser.jit(obj, cpu_executor=mode)
    for _ in range(3):
        ref_in, got_in = case.inputs(), case.inputs()
        ref, got = case.fn(*ref_in), f(*got_in)
        ref = ref if isinstance(ref, tuple) else (ref,)
        got = got if isinstance(got, tuple) else (got,)
        assert len(ref) == len(got)
        for r, g in zip(ref, got):
            if isinstance(r, torch.Tensor):
                assert r.dtype == g.dtype and r.shape == g.shape
                torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-6, equal_nan=True)
            else:
                assert r == g
        for r, g in zip(ref_in, got_in):        # inputs written as eager writes them
            if isinstance(r, torch.Tensor):
                torch.testing.assert_close(g, r)
        assert f.last_run.eager_groups == 0, f.last_run.fallbacks
    assert f.plans and all(p is not None for p in f.plans.values())


@pytest.mark.parametrize("native", [False, True], ids=["python", "native"])
def test_a_one_group_function_is_its_fusion_program(monkeypatch, tmp_path, native):
    """A graph that is one fusion on its own inputs: its call is the fusion's recorded program,
    which the native runner (where built) answers whole; a miss, grad mode on, or a debugging
    variable take the Python path."""
    fake = fake_cuda.install(monkeypatch, tmp_path, native=native)
    try:
        f = pyfuser.jit(torch.jit.script(_abc))
        with torch.no_grad():
            for n in (30, 30, 30, 50, 50):
                xs = [torch.randn(n) for _ in range(3)]
                out = f(*xs)
                torch.testing.assert_close(out, _abc(*xs))
                assert f.last_run.kernels == 1
        assert all(p.direct is not None for p in f.plans.values())
        runner = f._variant.native
        if native:
            assert runner is not None and len(runner) == 2 and f._entry == runner.run
        else:
            assert runner is None
        xs = [torch.randn(30) for _ in range(3)]
        n = len(fake.launches)
        torch.testing.assert_close(f(*xs), _abc(*xs))     # grad mode on: the Python path
        with torch.no_grad():
            monkeypatch.setenv("PYFUSER_DUMP", "launch_params")
            torch.testing.assert_close(f(*xs), _abc(*xs))
            monkeypatch.delenv("PYFUSER_DUMP")
            torch.testing.assert_close(f(*xs), _abc(*xs))
        assert len(fake.launches) == n + 3
        dispatch.clear_caches()
        assert not f.plans and (runner is None or len(runner) == 0)
        with torch.no_grad():
            torch.testing.assert_close(f(*xs), _abc(*xs))
            torch.testing.assert_close(f(*xs), _abc(*xs))
        assert not fake.callback_errors
    finally:
        dispatch.clear_caches()


def _bench_normalization():
    """bench/normalization.py (its layer-norm backward module is what the direct plan serves)."""
    path = pathlib.Path(__file__).parents[2] / "bench" / "normalization.py"
    return load_module_from_path("bench_normalization_under_test", path)


def _two_outputs(a, b):
    return a + b, a * b


@pytest.mark.parametrize("native", [False, True], ids=["python", "native"])
def test_a_module_or_tuple_returning_one_group_is_its_fusion_program(monkeypatch, tmp_path,
                                                                     native):
    """A module's graph whose `%self` nothing reads (bench/normalization.py's layer-norm
    backward: a `__constants__` size), and graphs returning their one group's outputs as a
    tuple, are direct plans too: the native runner (where built) answers the whole
    call and returns the tuple eager returns (host time a call of the layer-norm backward on
    tools/host_stub.py: 13 -> 3.2 us). A module reading a parameter is not direct."""
    fake_cuda.install(monkeypatch, tmp_path, native=native)
    try:
        n = 48
        x, w, b = torch.randn(6, n), torch.randn(n), torch.randn(n)
        _, mean, rstd = torch.native_layer_norm(x, [n], w, b, 1e-5)
        args = [torch.randn(6, n), x, mean, rstd, w, b]
        cases = [(_bench_normalization().LayerNormBackward(n), args), (_two_outputs, args[:2])]
        for fn, xs in cases:
            f = pyfuser.jit(torch.jit.script(fn))
            want = fn(*xs)
            with torch.no_grad():
                for _ in range(3):
                    got = f(*xs)
                    assert type(got) is tuple and len(got) == len(want)
                    for g, r in zip(got, want):
                        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-5)
            assert all(p.direct is not None for p in f.plans.values())
            runner = f._variant.native
            assert (runner is not None and f._entry == runner.run) if native else runner is None
        lin = pyfuser.jit(torch.jit.script(torch.nn.Sequential(torch.nn.LayerNorm(n))))
        with torch.no_grad():
            for _ in range(2):
                torch.testing.assert_close(lin(x), torch.nn.functional.layer_norm(
                    x, [n], lin.module.__getattr__("0").weight, lin.module.__getattr__("0").bias))
        assert all(p.direct is None for p in lin.plans.values() if p is not None)
    finally:
        dispatch.clear_caches()


class _ScaleByAttr(torch.nn.Module):
    """A group input read from a module attribute at each call (`self.k`, an int): the plan
    cannot bind the group's program, so it takes the group's fast call."""

    def __init__(self):
        super().__init__()
        self.k = 3

    def forward(self, x, y):
        return x * self.k + y


def test_fast_calls_under_grad_mode_build_their_entry_once(fake, monkeypatch):
    """Grad mode on (a training script's default) and no input requiring grad: the plan takes
    the fast call, whose entry is generated once (it was generated again on every call, about
    150 µs of host time each); an input that requires grad still runs the group eagerly."""
    f = pyfuser.jit(torch.jit.script(_ScaleByAttr()))
    built = []
    real = GR.GroupRunner.entry_for
    monkeypatch.setattr(GR.GroupRunner, "entry_for",
                        lambda self, *a: built.append(1) or real(self, *a))
    for _ in range(4):
        xs = [torch.randn(8, 5) for _ in range(2)]
        torch.testing.assert_close(f(*xs), xs[0] * 3 + xs[1])
        assert f.last_run.kernels == 1 and f.last_run.eager_groups == 0
    assert _sites(f) == ["fast"] and len(built) == 1
    xg = torch.randn(8, 5, requires_grad=True)
    out = f(xg, xs[1])
    assert out.requires_grad and f.last_run.eager_groups == 1 and f.last_run.kernels == 0
    torch.testing.assert_close(out, xg * 3 + xs[1])


class _LayerNormBackward(torch.nn.Module):
    """aten's layer norm backward over `[self.n]`, read from the module at each call (so the
    plan cannot bind the group's program: a fast-call group) and specialised on (not a fusion
    input: the fusion's inputs are all tensors, which the native runner takes)."""

    def __init__(self, n):
        super().__init__()
        self.n = n

    def forward(self, dy, x, mean, rstd, w, b):
        return torch.ops.aten.native_layer_norm_backward(dy, x, [self.n], mean, rstd, w, b,
                                                         [True, True, True])


@pytest.mark.parametrize("native", [False, True], ids=["python", "native"])
def test_group_entries_call_the_native_runner(monkeypatch, tmp_path, native):
    """A group's fast entry (a bound plan's group code comes from the same source) calls the
    fusion's cached call, which the native runner answers once the program was handed to it
    (the Python program where the runner is off); results match eager call after call, with
    new tensors."""
    fake = fake_cuda.install(monkeypatch, tmp_path, native=native)
    try:
        f = pyfuser.jit(torch.jit.script(_LayerNormBackward(24)))
        with torch.no_grad():
            for _ in range(4):
                x, dy = torch.randn(40, 24), torch.randn(40, 24)
                w, b = torch.randn(24), torch.randn(24)
                _, mean, rstd = torch.native_layer_norm(x, [24], w, b, 1e-5)
                args = (dy, x, mean, rstd, w, b)
                n = len(fake.launches)
                got, want = f(*args), _LayerNormBackward(24)(*args)
                for g, e in zip(got, want):
                    torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-4)
                assert len(fake.launches) == n + f.last_run.kernels and f.last_run.kernels >= 1
        (runner,) = f.runners.values()
        (entry,) = runner._fast.values()
        bound = {k for k in entry.__globals__ if k[:1] in "RP" and k[1:2] == "G"}
        progs = dispatch.programs(runner.lowered.fusion)
        if native:          # the fusion's cached call, answered by the native runner
            assert {k[0] for k in bound} == {"R"} and progs.native and len(progs.native) >= 1
            assert progs.run == progs.native.run
        else:               # the recorded Python program, called directly
            assert {k[0] for k in bound} == {"P"} and not progs.native
        assert not fake.callback_errors
    finally:
        dispatch.clear_caches()

