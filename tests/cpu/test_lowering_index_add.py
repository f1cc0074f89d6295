"""`aten::index_add` along axis 0 and `index_put(accumulate=True)` (lowering/aten_indexing.py):
the scatter kernel's sum at the rows plus x. Through torch.compile's backend on the CPU
interpreter: index_add into a table of constant sizes the graph makes (a Mixture-of-Experts
layer's `zeros(...).index_add_(0, tokens, out)`): eager's values (repeated indices summed;
bfloat16 within one rounding of float64's sum), a vector table, the gradient, an index outside
the rows stopping the kernel as eager raises, rows of several axes; index_put into a table
that is a graph input (a symbolic row count in its Fusion: the kernel reads the count from its
output's size, so under dynamic=True a new count reuses the kernel; past MAX_SCATTER_ROWS rows
at run time the segment runs on the reference evaluator, logged), rows of several axes too;
index_add into a graph input, into rows of fewer than MIN_INDEX_ADD_WIDTH elements (lowered to
1 here for the small shapes but in the test of that rule), other axes and alpha != 1 left to
eager with the reason (eager's atomic adds beat the kernel on narrow rows: H200, thirty-third
session)."""
from __future__ import annotations

import logging

import pytest
import torch

import pyfuser
from pyfuser.frontend.fx import compiled_graphs
from pyfuser.schedule import embedding_backward as EB

from compile_checks import assert_ran_as_sm90_kernels

pytestmark = pytest.mark.usefixtures("fresh_compile", "narrow_rows")


@pytest.fixture
def narrow_rows(monkeypatch):
    """The interpreter's small tables: rows of any width fused (MIN_INDEX_ADD_WIDTH, 128 by
    default, keeps narrower ones eager's; test_narrow_rows_stay_eager)."""
    from pyfuser.frontend.lowering import aten_indexing
    monkeypatch.setattr(aten_indexing, "MIN_INDEX_ADD_WIDTH", 1)
INDEX = torch.tensor([1, 3, 3, 0, 9, 1, 3])


def _moe_like(i, s):
    x = torch.zeros(10, 8, dtype=s.dtype)
    return (x.index_add(0, i, s) * 2).relu()


def _regions(kind="inference"):
    return [r for g in compiled_graphs() if g.kind == kind for r in g.regions]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_index_add_into_a_table_the_graph_makes_fuses(dtype):
    s = (torch.randn(7, 8, generator=torch.Generator().manual_seed(0)) * 3).to(dtype)
    torch._dynamo.reset()
    got = pyfuser.compile(_moe_like)(INDEX, s)
    want = _moe_like(INDEX, s)
    assert got.shape == want.shape and got.dtype == want.dtype
    exact = _moe_like(INDEX, s.double())          # the sums in float64, rounded once
    if dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    else:
        assert torch.equal(got, exact.to(dtype))
    (region,) = _regions()
    assert "aten.index_add.default" in region.ops
    assert not [g.unsupported for g in compiled_graphs() if g.unsupported]
    assert_ran_as_sm90_kernels([region])


def test_index_add_of_a_vector_table():
    def f(i, s):
        return torch.zeros(12).index_add(0, i, s) + 1

    s = torch.randn(7)
    torch._dynamo.reset()
    torch.testing.assert_close(pyfuser.compile(f)(INDEX, s), f(INDEX, s), rtol=1e-6,
                               atol=1e-6)
    assert any("aten.index_add.default" in r.ops for r in _regions())


def test_index_add_gradient_matches_eager():
    w = torch.randn(7, 8)

    def f(i, s):
        return (torch.zeros(10, 8).index_add(0, i, s * w) ** 2).sum()

    s = torch.randn(7, 8, requires_grad=True)
    torch._dynamo.reset()
    loss = pyfuser.compile(f)(INDEX, s)
    loss.backward()
    got = s.grad.clone()
    s.grad = None
    want = f(INDEX, s)
    want.backward()
    torch.testing.assert_close(loss, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got, s.grad, rtol=1e-5, atol=1e-5)
    assert any("aten.index_add.default" in r.ops for r in _regions("forward"))


@pytest.mark.parametrize("bad", [-1, 10])
def test_an_index_outside_the_rows_raises(bad):
    torch._dynamo.reset()
    with pytest.raises(IndexError, match="index out of range"):
        pyfuser.compile(_moe_like)(torch.tensor([1, bad]), torch.randn(2, 8))


def _into_input(x, i, s):
    return x.index_put((i,), s, accumulate=True) * 2


@pytest.mark.parametrize("shape", [(10, 8), (12,)])
def test_index_put_into_a_graph_input_fuses(shape):
    """The table a graph input: its row count is a symbol of the Fusion, read by the kernel."""
    x = torch.randn(shape)
    s = torch.randn((7,) + shape[1:])
    torch._dynamo.reset()
    got = pyfuser.compile(_into_input)(x, INDEX, s)
    want = _into_input(x, INDEX, s)
    assert got.shape == want.shape and got.dtype == want.dtype
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    (region,) = _regions()
    assert "aten.index_put.default" in region.ops
    assert not [g.unsupported for g in compiled_graphs() if g.unsupported]
    assert_ran_as_sm90_kernels([region])


def test_a_new_row_count_reuses_the_kernel(plans):
    """dynamic=True: tables of 16, 32 and 48 rows (the same layout facts and size class) run
    one graph and one kernel; an index past the rows of the smaller table still stops it."""
    torch._dynamo.reset()
    f = pyfuser.compile(_into_input, dynamic=True)
    s = torch.randn(7, 8)
    seen = []
    for n in (16, 32, 48):
        x = torch.randn(n, 8)
        torch.testing.assert_close(f(x, INDEX, s), _into_input(x, INDEX, s), rtol=1e-6,
                                   atol=1e-6)
        seen.append((len(compiled_graphs()), plans[0]))
        assert_ran_as_sm90_kernels(_regions())
    assert seen[0] == seen[1] == seen[2] and seen[0][1] >= 1, seen
    with pytest.raises(IndexError, match="index out of range"):
        f(torch.randn(16, 8), torch.tensor([1, 16]), torch.randn(2, 8))


def test_a_symbolic_table_past_the_row_limit_runs_on_the_evaluator(monkeypatch, caplog):
    """More rows at run time than MAX_SCATTER_ROWS (8 here): the scheduler's run check refuses
    them, the segment runs on the reference evaluator (logged with the reason); at the limit,
    the kernel."""
    monkeypatch.setattr(EB, "MAX_SCATTER_ROWS", 8)
    s = torch.randn(3, 4)
    i = torch.tensor([0, 5, 5])
    for rows, kernel in ((8, True), (9, False)):
        torch._dynamo.reset()
        x = torch.randn(rows, 4)
        with caplog.at_level(logging.INFO, logger="pyfuser"):
            got = pyfuser.compile(_into_input)(x, i, s)
        torch.testing.assert_close(got, _into_input(x, i, s), rtol=1e-6, atol=1e-6)
        refused = "a table of 9 rows (more than 8)" in caplog.text
        assert refused != kernel, caplog.text
        if kernel:
            assert_ran_as_sm90_kernels(_regions())


@pytest.mark.parametrize("case", ["axis 1", "alpha 2"])
def test_other_forms_stay_eager_with_the_reason(case):
    x, s = torch.randn(10, 8), torch.randn(7, 8)
    f = {"axis 1": lambda x, i, s: x.t().index_add(1, i, s.t()) * 2,
         "alpha 2": lambda x, i, s: torch.zeros(10, 8).index_add(0, i, s, alpha=2) + x}[case]
    torch._dynamo.reset()
    torch.testing.assert_close(pyfuser.compile(f)(x, INDEX, s), f(x, INDEX, s), rtol=1e-6,
                               atol=1e-6)
    why = {k: v for g in compiled_graphs() for k, v in g.unsupported.items()}
    want = {"axis 1": "only axis 0", "alpha 2": "only alpha=1"}[case]
    assert "index_add" in why and want in why["index_add"], why


@pytest.mark.parametrize("dynamic", [False, True])
def test_rows_of_several_axes(dynamic):
    """Tables of rank 3 (zeros the graph makes: index_add; an input: index_put): rows of
    [3, 4] elements summed as rows of 12 (the values viewed so), then viewed as the table
    again; dynamic=True: two row counts, one graph."""
    def f(x, i, s):
        return x.index_put((i,), s, accumulate=True) + \
            torch.zeros(10, 3, 4).index_add(0, i, s * 2)[:1]
    torch._dynamo.reset()
    g = pyfuser.compile(f, dynamic=dynamic)
    s = torch.randn(7, 3, 4)
    for n in (10, 12) if dynamic else (10,):
        x = torch.randn(n, 3, 4)
        got, want = g(x, INDEX, s), f(x, INDEX, s)
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
        assert_ran_as_sm90_kernels(_regions())
    assert len(compiled_graphs()) == 1
    ops = [o for r in _regions() for o in r.ops]
    assert "aten.index_add.default" in ops and "aten.index_put.default" in ops, ops
    assert not [g.unsupported for g in compiled_graphs() if g.unsupported]


@pytest.mark.parametrize("case", ["input table", "narrow rows", "narrow rank 3"])
def test_index_add_left_to_eager_where_its_atomics_win(case, monkeypatch):
    """index_add into a graph input's table (sizes known only at run time) and into rows of
    fewer than MIN_INDEX_ADD_WIDTH (128) elements stays eager's, with the reason; rows of 128
    fuse."""
    from pyfuser.frontend.lowering import aten_indexing
    monkeypatch.setattr(aten_indexing, "MIN_INDEX_ADD_WIDTH", 128)
    fs = {"input table": (lambda x, i, s: x.index_add(0, i, s) * 2, (10, 128), "known only"),
          "narrow rows": (lambda x, i, s: torch.zeros(10, 64).index_add(0, i, s) + x, (10, 64),
                          "rows of 64 elements"),
          "narrow rank 3": (lambda x, i, s: torch.zeros(10, 2, 8).index_add(0, i, s) + x,
                            (10, 2, 8), "rows of 16 elements")}
    f, shape, why = fs[case]
    x, s = torch.randn(shape), torch.randn((7,) + shape[1:])
    torch._dynamo.reset()
    torch.testing.assert_close(pyfuser.compile(f)(x, INDEX, s), f(x, INDEX, s), rtol=1e-6,
                               atol=1e-6)
    left = {k: v for g in compiled_graphs() for k, v in g.unsupported.items()}
    assert "index_add" in left and why in left["index_add"], left
    wide = lambda x, i, s: torch.zeros(10, 128).index_add(0, i, s) + x   # noqa: E731
    x, s = torch.randn(10, 128), torch.randn(7, 128)
    torch._dynamo.reset()
    torch.testing.assert_close(pyfuser.compile(wide)(x, INDEX, s), wide(x, INDEX, s),
                               rtol=1e-6, atol=1e-6)
    assert any("aten.index_add.default" in r.ops for r in _regions()), _regions()
