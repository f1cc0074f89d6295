"""The thirty-third session's lowerings as CUDA kernels (tests/cpu/test_lowering_index_add.py and
test_lowering_all_any.py at larger sizes): index_put(accumulate=True) into a graph input's table
(a symbolic row count: the kernel reads it from its output), index_add into a wide table the
graph makes (a Mixture-of-Experts layer's), and all / any, against eager: values (sums in a
fixed order against eager's atomics: within rounding), shapes, dtypes, every region's kernels
launched on the device, and the same bits from run to run (no atomics)."""
from __future__ import annotations

import pytest
import torch

import pyfuser
from pyfuser.frontend.fx import compiled_graphs
from pyfuser.runtime import dispatch

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("fresh_compile")]


def _ran_on_cuda(op):
    regions = [r for g in compiled_graphs() for r in g.regions]
    assert any(o.startswith(f"aten.{op}") for r in regions for o in r.ops), \
        [r.ops for r in regions]
    for r in regions:
        report = dispatch.last_report(r.fusion)
        assert report is not None and report.eager_segments == 0, (r, report)
        assert all(s.backend == "cuda" for s in report.segments if s.kind == "kernel"), report


def _check(f, args, op, rtol=1e-5, atol=1e-5, dynamic=None):
    torch._dynamo.reset()
    g = pyfuser.compile(f, dynamic=dynamic)
    got, again, want = g(*args), g(*args), f(*args)
    assert got.shape == want.shape and got.dtype == want.dtype
    torch.testing.assert_close(got, want, rtol=rtol, atol=atol)
    assert torch.equal(got, again)
    _ran_on_cuda(op)


def _table(rows=1000, width=256, tokens=4096):
    gen = torch.Generator(device="cuda").manual_seed(1)
    return (torch.randn(rows, width, device="cuda", generator=gen),
            torch.randint(0, rows, (tokens,), device="cuda", generator=gen),
            torch.randn(tokens, width, device="cuda", generator=gen))


@pytest.mark.parametrize("dynamic", [None, True])
def test_index_put_into_an_input_table_on_cuda(dynamic):
    _check(lambda t, i, s: t.index_put((i,), s, accumulate=True) * 2, _table(), "index_put",
           1e-4, 1e-4, dynamic)


def test_index_add_into_a_wide_table_the_graph_makes_on_cuda():
    _check(lambda t, i, s: torch.zeros(1000, 256, device="cuda").index_add(0, i, s) + t,
           _table(), "index_add", 1e-4, 1e-4)


def test_all_and_any_on_cuda():
    gen = torch.Generator(device="cuda").manual_seed(0)
    logits = torch.randn(4096, 64, device="cuda", generator=gen)
    logits[7] = float("nan")
    _check(lambda l: torch.all(l > -3, 1) & torch.any(l > 2, 1), (logits,), "all", 0, 0)
    _check(lambda l: torch.any(l.isnan()), (logits,), "any", 0, 0)
