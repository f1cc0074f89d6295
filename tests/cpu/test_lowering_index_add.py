"""`aten::index_add` along axis 0 (lowering/aten_indexing.py): the scatter kernel's sum at the
rows plus x, as index_put(accumulate=True) is lowered, where x's row count is a constant (a
table the graph makes: a Mixture-of-Experts layer's `zeros(...).index_add_(0, tokens, out)`).
Through torch.compile's backend on the CPU interpreter: eager's values (repeated indices
summed; bfloat16 within one rounding of float64's sum), a vector table, the gradient, an
index outside the rows stopping the kernel as eager raises; tables of a symbolic row count
(graph inputs), other axes and alpha != 1 left to eager with the reason."""
from __future__ import annotations

import pytest
import torch

import pyfuser
from pyfuser.frontend.fx import compiled_graphs

from compile_checks import assert_ran_as_sm90_kernels

pytestmark = pytest.mark.usefixtures("fresh_compile")
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


@pytest.mark.parametrize("case", ["input table", "axis 1", "alpha 2"])
def test_other_forms_stay_eager_with_the_reason(case):
    x, s = torch.randn(10, 8), torch.randn(7, 8)
    f = {"input table": lambda x, i, s: x.index_add(0, i, s) * 2,
         "axis 1": lambda x, i, s: x.t().index_add(1, i, s.t()) * 2,
         "alpha 2": lambda x, i, s: torch.zeros(10, 8).index_add(0, i, s, alpha=2) + x}[case]
    torch._dynamo.reset()
    torch.testing.assert_close(pyfuser.compile(f)(x, INDEX, s), f(x, INDEX, s), rtol=1e-6,
                               atol=1e-6)
    why = {k: v for g in compiled_graphs() for k, v in g.unsupported.items()}
    want = {"input table": "constant count", "axis 1": "only axis 0",
            "alpha 2": "only alpha=1"}[case]
    assert "index_add" in why and want in why["index_add"], why
