"""Views moved past the elementwise ops that follow them to a region output
(lowering/sink_views.py): a group norm (lowered on `[N, G, C/G, *]` and viewed back) and the
SiLU after it are one kernel, with eager's values, dtypes and strides, forward and backward;
where the move does not apply (the output laid out channels-last, an op reading a second
tensor, a value read twice) the results are eager's as before."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import pyfuser
from pyfuser.frontend.fx import compiled_graphs
from pyfuser.frontend.lowering.sink_views import sink_output_views
from pyfuser.ir import builder as B
from pyfuser.ir import exprs as E
from pyfuser.ir.dtypes import DataType
from pyfuser.ir.fusion import Fusion

from test_compile_factory_like import strides
from compile_checks import assert_ran_as_sm90_kernels

pytestmark = pytest.mark.usefixtures("fresh_compile")


def _kernels():
    return sum(r.kernels() for g in compiled_graphs() for r in g.regions)


def _close(got, want, tol):
    for g, w in zip(got, want):
        assert (g.dtype, g.shape, strides(g)) == (w.dtype, w.shape, strides(w))
        t = max(tol, 2e-3) if g.dtype == torch.float16 else tol   # a half's rounding step
        torch.testing.assert_close(g, w, rtol=t, atol=t)


def _gn_silu(x, w, b):
    return (F.silu(F.group_norm(x, 4, w, b, 1e-5)),)


def _gn_silu_cast(x, w, b):
    y = F.group_norm(x, 2, w, b, 1e-5)
    return ((y * torch.sigmoid(y)).to(torch.float16), (F.group_norm(x, 4) * 2.0).exp())


@pytest.mark.parametrize("f", [_gn_silu, _gn_silu_cast])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_group_norm_and_its_pointwise_consumers_are_one_kernel(f, dtype, tol):
    torch.manual_seed(0)
    x = torch.randn(2, 8, 5, 3, dtype=dtype)
    w, b = torch.randn(8, dtype=dtype), torch.randn(8, dtype=dtype)
    with torch.no_grad():
        got, want = pyfuser.compile(f)(x, w, b), f(x, w, b)
    _close(got, want, tol)
    (graph,) = compiled_graphs()
    assert not graph.unsupported and _kernels() == len(want)    # one kernel a group norm
    assert_ran_as_sm90_kernels(graph.regions)


def test_group_norm_silu_training_step_matches_eager():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.GroupNorm(4, 8), torch.nn.SiLU(),
                            torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.GroupNorm(2, 8),
                            torch.nn.SiLU())
    x = torch.randn(2, 8, 6, 6, requires_grad=True)
    c = pyfuser.compile(m)
    got = c(x)
    want = m(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    gx, = torch.autograd.grad(got.square().sum(), x)
    wx, = torch.autograd.grad(want.square().sum(), x)
    torch.testing.assert_close(gx, wx, rtol=1e-4, atol=1e-4)
    fw = next(g for g in compiled_graphs() if g.report()["kind"] == "forward")
    assert not any("group_norm" in str(u) or "silu" in str(u) for u in fw.unsupported.values())
    assert sum(r.kernels() for r in fw.regions) == 2            # a kernel a group norm + SiLU


def test_where_the_move_does_not_apply_results_are_eagers():
    def f(x, y, w, b):
        g = F.group_norm(x, 4, w, b)
        return F.silu(g) * y, g.relu() + g.sigmoid(), F.silu(F.group_norm(
            x.to(memory_format=torch.channels_last), 4))
    x, y = torch.randn(2, 8, 4, 4), torch.randn(2, 8, 4, 4)
    w, b = torch.randn(8), torch.randn(8)
    with torch.no_grad():
        got, want = pyfuser.compile(f)(x, y, w, b), f(x, y, w, b)
    _close(got, want, 1e-5)


def test_the_rewrite_keeps_the_output_and_moves_the_view_last():
    """On the IR: view -> exp -> cast -> output becomes exp -> cast -> view -> the same output
    TensorView; the evaluator's results are the same bits."""
    from pyfuser.ir.evaluator import evaluate
    fusion = Fusion()
    with fusion:
        a = B.define_tensor([6, 4], DataType.Float)
        fusion.add_input(a)
        v = B.reshape(B.elementwise("mul", a, a), [2, 3, 4])
        out = B.cast(B.elementwise("exp", v), DataType.Half)
        fusion.add_output(out)
    x = torch.randn(6, 4)
    before = evaluate(fusion, [x])[0]
    assert sink_output_views(fusion, [out]) == 1
    assert fusion.outputs == [out] and type(out.definition) is E.ViewOp
    assert [type(e).__name__ for e in fusion.used_exprs()] == [
        "BinaryOp", "UnaryOp", "CastOp", "ViewOp"]
    after = evaluate(fusion, [x])[0]
    assert after.dtype == before.dtype and torch.equal(after, before)
    assert sink_output_views(fusion, [out]) == 0           # nothing left to move


def test_a_view_whose_extents_other_ops_read_stays():
    """`view(-1, 2)`'s first extent is bound by the view alone; a full_like / zeros_like /
    rand_like of the view makes a tensor of that extent. The view stays where it is (moved after
    its cone, the extent was read before anything bound it: an AssertionError at run time)."""
    def f(x):
        v = (x * 2).view(-1, 2)
        return v.exp(), torch.full_like(v, 3.0), torch.zeros_like(v).sum(0)
    x = torch.randn(6, 4)
    with torch.no_grad():
        got, want = pyfuser.compile(f)(x), f(x)
    _close(got, want, 1e-5)
    (graph,) = compiled_graphs()
    assert not graph.unsupported
    assert_ran_as_sm90_kernels(graph.regions)
