"""`aten::all` / `aten::any` (lowering/aten_logical_reduction.py): counts of the deciding
elements, so every overload (all elements, one dim, a list of dims, keepdim) gives eager's
values, dtype (bool; uint8 for a uint8 input) and shape, including NaN (nonzero: true), empty
reductions (all: True, any: False) and an empty dims list (no reduction), through
torch.compile and a traced TorchScript graph on the CPU interpreter (kernels compiled with
NVRTC for sm_90 first)."""
from __future__ import annotations

import pytest
import torch

import pyfuser
from pyfuser.frontend.fx import compiled_graphs

from compile_checks import assert_ran_as_sm90_kernels

pytestmark = pytest.mark.usefixtures("fresh_compile")

CASES = {
    "all of a comparison": (lambda x: torch.all(x > 0), "all"),
    "any over a dim": (lambda x: torch.any(x > 0.5, dim=1), "any"),
    "all keepdim of floats (NaN rows)": (lambda x: torch.all(x, dim=-1, keepdim=True), "all"),
    "any of a product": (lambda x: (x * 2).any(), "any"),
    "all over a dims list": (lambda x: torch.ops.aten.all.dims(x, [0, 1], False), "all"),
    "any over no dims": (lambda x: torch.ops.aten.any.dims(x + 1, [], True), "any"),
    "all of uint8": (lambda x: torch.all((x * 3).to(torch.uint8), 1), "all"),
    "any of uint8": (lambda x: torch.any((x > 0).to(torch.uint8)), "any"),
    "all of an empty axis": (lambda x: torch.all(x[:0] > 0, 0), "all"),
    "any of an empty axis": (lambda x: torch.any(x[:, :0] + 1, 1), "any"),
    "all of integers": (lambda x: torch.all((x * 4).to(torch.int32), 0), "all"),
}


def _x():
    x = torch.randn(5, 7, generator=torch.Generator().manual_seed(0))
    x[1, 2] = 0
    x[2] = float("nan")
    x[3] = 0.25
    return x


@pytest.mark.parametrize("case", list(CASES))
def test_all_and_any_are_eagers(case):
    f, op = CASES[case]
    x = _x()
    torch._dynamo.reset()
    got, want = pyfuser.compile(f)(x), f(x)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert torch.equal(got, want), (got, want)
    graphs = compiled_graphs()
    assert not [g.unsupported for g in graphs if g.unsupported]
    regions = [r for g in graphs for r in g.regions]
    assert any(o.startswith(f"aten.{op}.") for r in regions for o in r.ops), \
        [r.ops for r in regions]
    assert_ran_as_sm90_kernels(regions)


def test_traced_all_and_any_are_grouped():
    def f(x):
        return torch.all(x > 0, 1) & torch.any(x * 2 > 1, 1)
    x = _x()
    g = pyfuser.jit(torch.jit.trace(f, (x,)), cpu_executor="interpret")
    got, want = g(x), f(x)
    assert got.dtype == want.dtype and torch.equal(got, want)
    assert g.last_run.eager_groups == 0, g.last_run.fallbacks
    assert not [fb for fb in g.last_run.fallbacks if fb["kind"] in ("aten::all", "aten::any")]
