"""gather, index_select, slice, cat, uniform/normal and real/imag/complex rsqrt in the Fusion IR:
built with checks, printed, verified, evaluated against eager; through execute_fusion they run as
eager segments (no kernel scheduler takes them: each refuses with a reason, none crashes)."""
import pytest
import torch

from pyfuser.errors import ExecuteError, FusionDefinitionError
from pyfuser.ir import DataType, Fusion
from pyfuser.ir import builder as B
from pyfuser.ir import exprs as E
from pyfuser.ir.evaluator import evaluate
from pyfuser.ir.verifier import verify
from pyfuser.runtime.dispatch import execute_fusion, last_report
from pyfuser.schedule import pointwise, transpose

F, I = DataType.Float, DataType.Int


def build(fn):
    f = Fusion()
    with f:
        fn(f)
    verify(f)
    return f


def run_all_ways(f, inputs, kind="eager"):
    """Evaluator result; execute_fusion must give the same, through eager segments (random)
    or pointwise kernels (slice, cat, gather, index_select)."""
    want = evaluate(f, inputs)
    got = execute_fusion(f, inputs)
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and torch.equal(a, b)
    report = last_report(f)
    assert report is not None and any(s.kind == kind for s in report.segments), report
    if kind == "kernel":
        assert report.eager_segments == 0, report
    return want


def test_gather_and_index_select_match_eager():
    x, y = torch.randn(8, 16), torch.randn(8, 16)
    idx = torch.randint(0, 8, (4, 4))
    sel = torch.randint(0, 8, (6,))

    def fn(f):
        a, b = B.define_tensor([-1, -1], F), B.define_tensor([-1, -1], F)
        g, s, s0 = B.define_tensor([-1, -1], I), B.define_tensor([-1], I), B.define_tensor([], I)
        t = B.elementwise("add", a, b)
        f.add_output(B.gather(t, g, 1))
        f.add_output(B.index_select(t, s, 0))
        f.add_output(B.index_select(t, s0, 1))
    f = build(fn)
    text = str(f)
    assert "gather( " in text and "index_select( " in text
    g, s, s0 = run_all_ways(f, [x, y, idx, sel, torch.tensor(3)], "kernel")
    assert torch.equal(g, torch.gather(x + y, 1, idx))
    assert torch.equal(s, torch.index_select(x + y, 0, sel))
    assert torch.equal(s0, torch.index_select(x + y, 1, torch.tensor(3)))


def test_gather_checks():
    with Fusion():
        x = B.define_tensor([-1, -1], F)
        with pytest.raises(FusionDefinitionError, match="gather: the index .* must be Int"):
            B.gather(x, B.define_tensor([-1, -1], F), 0)
        with pytest.raises(FusionDefinitionError, match="gather: the index .* has rank 1"):
            B.gather(x, B.define_tensor([-1], I), 0)
        with pytest.raises(FusionDefinitionError, match="index_select: the index .* rank 0 or 1"):
            B.index_select(x, B.define_tensor([-1, -1], I), 0)
        with pytest.raises(FusionDefinitionError, match="dim 2 out of range"):
            B.gather(x, B.define_tensor([-1, -1], I), 2)
    f = build(lambda f: f.add_output(B.gather(B.define_tensor([-1, -1], F),
                                              B.define_tensor([-1, -1], I), 0)))
    with pytest.raises(ExecuteError, match="gather index .* has size 5 on axis 1"):
        execute_fusion(f, [torch.randn(4, 4), torch.zeros(2, 5, dtype=torch.long)])


def test_slice_and_cat_match_eager_and_check_sizes():
    def fn(f):
        a, b = B.define_tensor([-1, -1], F), B.define_tensor([-1, -1], F)
        s = B.slice_(a, [0, 1], [2, 4])
        f.add_output(B.elementwise("mul", s, 2.0))
        f.add_output(B.cat([a, b], 1))
        f.add_output(B.cat([a, B.cast(b, DataType.Double)], 0))
    f = build(fn)
    a, b = torch.randn(3, 5), torch.randn(3, 2)
    with pytest.raises(ExecuteError, match="cat along axis 0 .* sizes \\[5, 2\\] on axis 1"):
        execute_fusion(f, [a, b])
    f = build(lambda f: f.add_output(B.cat([B.define_tensor([-1, -1], F),
                                           B.define_tensor([-1, -1], F)], 1)))
    (c,) = run_all_ways(f, [a, b], "kernel")
    assert torch.equal(c, torch.cat([a, b], 1)) and c.shape == (3, 7)
    f = build(lambda f: f.add_output(B.elementwise("mul", B.slice_(B.define_tensor([-1, -1], F),
                                                                   [0, 1], [2, 4]), 2.0)))
    (s,) = run_all_ways(f, [a], "kernel")
    assert torch.equal(s, a[0:2, 1:4] * 2.0)
    with pytest.raises(ExecuteError, match="slice 1:4 of T0_g on axis 1 does not fit its size 3"):
        execute_fusion(f, [torch.randn(3, 3)])
    assert "slice( T0_g" in str(f)


@pytest.mark.parametrize("starts,ends,steps,message", [
    ([-1, 0], [2, 2], None, "start index -1 of axis 0 is negative"),
    ([3, 0], [1, 2], None, "end index 1 of axis 0 is smaller than its start index 3"),
    ([0, 0], [2, 2], [0, 1], "stride 0 of axis 0 must be at least 1"),
    ([0], [2], None, "1 start/end indices for the rank-2 tensor"),
    ([0, 0], [2, 2, 2], None, "have 2, 3 and 2 entries"),
    ([0, 0], [2, 9], None, "end index 9 of axis 1 is past its size 4"),
])
def test_slice_errors(starts, ends, steps, message):
    with Fusion():
        x = B.define_tensor([-1, 4], F)
        with pytest.raises(FusionDefinitionError, match=message):
            B.slice_(x, starts, ends, steps)


def test_cat_promotes_and_checks():
    with Fusion():
        a, b = B.define_tensor([-1, -1], DataType.Int32), B.define_tensor([-1, -1], F)
        assert B.cat([a, b], 0).dtype is F
        with pytest.raises(FusionDefinitionError, match="cat: .* has rank 2 but .* has rank 1"):
            B.cat([a, B.define_tensor([-1], F)], 0)
        with pytest.raises(FusionDefinitionError, match="non-empty list"):
            B.cat([], 0)


@pytest.mark.parametrize("kind", ["uniform", "normal"])
def test_random_uses_torch_generator_of_the_device(kind):
    def fn(f):
        x = B.define_tensor([-1, -1], F)
        sizes = [d.extent for d in x.logical]
        f.add_output(B.random(kind, 2.0, 3.0, sizes, DataType.Double))
    f = build(fn)
    x = torch.empty(300, 400)
    torch.manual_seed(5)
    (a,) = execute_fusion(f, [x])
    torch.manual_seed(5)
    (b,) = execute_fusion(f, [x])
    torch.manual_seed(5)
    want = torch.empty(300, 400, dtype=torch.float64)
    want = want.uniform_(2.0, 3.0) if kind == "uniform" else want.normal_(2.0, 3.0)
    assert a.dtype == torch.float64 and a.shape == (300, 400)
    assert torch.equal(a, b) and torch.equal(a, want)
    assert f"rng_{kind}(" in str(f)


def test_random_checks():
    with Fusion():
        with pytest.raises(FusionDefinitionError, match="uniform: dtype must be a floating"):
            B.random("uniform", 0.0, 1.0, [2], DataType.Int)
        with pytest.raises(FusionDefinitionError, match="normal: the first parameter must be a real"):
            B.random("normal", B.define_tensor([-1], F), 1.0, [2])
        with pytest.raises(FusionDefinitionError, match="size 0 is 2.5"):
            B.random("normal", 0.0, 1.0, [2.5])


@pytest.mark.parametrize("dtype", [DataType.ComplexFloat, DataType.ComplexDouble])
def test_complex_real_imag_rsqrt(dtype):
    def fn(f):
        x = B.define_tensor([-1], dtype)
        r = B.elementwise("real", x)
        assert r.dtype is B.real_dtype(dtype) and not r.dtype.is_complex
        f.add_output(r)
        f.add_output(B.elementwise("imag", x))
        f.add_output(B.elementwise("rsqrt", x))
    f = build(fn)
    x = torch.randn(5, dtype=dtype.torch)
    r, i, q = run_all_ways(f, [x])
    assert torch.equal(r, x.real) and torch.equal(i, x.imag) and torch.equal(q, x.rsqrt())
    with Fusion():
        with pytest.raises(FusionDefinitionError, match="real: does not take Float"):
            B.elementwise("real", B.define_tensor([-1], F))


def test_schedulers_refuse_the_new_exprs_with_a_reason():
    """Random draws from torch's generator run on the evaluator; slice and cat are index
    remappings the pointwise scheduler takes (test_resize_fusion.py), and gather and
    index_select reads at the index's values (test_gather_fusion.py)."""
    def fn(f):
        x, i = B.define_tensor([-1, -1], F), B.define_tensor([-1], I)
        f.add_output(B.index_select(x, i, 0))
        f.add_output(B.slice_(x, [0, 0], [1, 1]))
        f.add_output(B.cat([x, x], 0))
        f.add_output(B.random("normal", 0.0, 1.0, [3]))
        f.add_output(B.gather(x, B.define_tensor([-1, -1], I), 0))
    f = build(fn)
    for e in f.exprs:
        sub = Fusion()
        sub.outputs, sub.inputs, sub.exprs = list(e.outputs), [], [e]
        for sched in (pointwise, transpose):
            ok, reason = sched.can_schedule(sub)
            if sched is pointwise and isinstance(e, (E.SliceOp, E.CatOp, E.IndexSelectOp,
                                                     E.GatherOp)):
                assert ok, (e, reason)
            else:
                assert not ok and reason, (e, sched)


def test_segment_reading_a_reduced_extent():
    """A segment whose input is a reduced tensor binds only that tensor's logical extents (a
    reduced axis's extent, read later, comes from the original fusion's bindings)."""
    def fn(f):
        x = B.define_tensor([-1, -1], F)
        s = B.reduction("sum", x, [1])
        f.add_output(B.elementwise("div", s, x.logical[1].extent))
    f = build(fn)
    x = torch.randn(3, 5)
    (out,) = execute_fusion(f, [x])
    assert torch.allclose(out, x.sum(1) / 5)


def test_mean_over_one_symbolic_axis_runs():
    f = build(lambda f: f.add_output(B.mean(B.define_tensor([-1, -1], F), [1])))
    x = torch.randn(3, 5)
    (out,) = execute_fusion(f, [x])
    assert out.dtype == torch.float32 and torch.allclose(out, x.mean(1))
