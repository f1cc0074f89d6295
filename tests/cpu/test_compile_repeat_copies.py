"""The torch.compile backend's tiling and broadcasting copies: `repeat` (lowering/aten_repeat.py:
the expand of x viewed as its tiles, written row-major; DeBERTa-v2's relative-position keys and
queries) and `aten.copy(self, src)` of a source that broadcasts (`buf[..., 8:].copy_(k_pe)`
with k_pe one head expanded over all: DeepSeek-V3's keys). Values, dtypes, shapes and strides
against eager bit for bit (size 0 and 1, odd sizes, non-contiguous inputs, bfloat16, symbolic
sizes, forward and backward), each op inside a region that ran as sm_90 kernels. GPU twins:
tests/gpu/test_fusion_gaps_gpu.py."""
from __future__ import annotations

import pytest
import torch

import pyfuser
from pyfuser.frontend.fx import compiled_graphs

from test_compile_factory_like import equal
from compile_checks import assert_ran_as_sm90_kernels

pytestmark = pytest.mark.usefixtures("fresh_compile")


def _repeats(x, y):
    return ((x * 2).repeat(2, 3), x.repeat(3, 1, 2) + 1, y.repeat(2, 2), x.t().repeat(1, 2),
            x.repeat(1, 1), x.repeat(0, 2), y.repeat(2, 1, 1).sin())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
@pytest.mark.parametrize("shape", [(3, 5), (1, 7), (0, 4)])
def test_repeat_fuses_with_eagers_values_and_strides(shape, dtype):
    x = (torch.randn(*shape) * 10).to(dtype)
    y = torch.randn(1, 4) if dtype is torch.int64 else torch.randn(1, 4).to(dtype)
    with torch.no_grad():
        got, want = pyfuser.compile(_repeats)(x, y), _repeats(x, y)
    equal(got, want)
    (graph,) = compiled_graphs()
    assert not graph.unsupported, graph.unsupported
    assert [op for r in graph.regions for op in r.ops].count("aten.repeat.default") == 7
    assert_ran_as_sm90_kernels(graph.regions)


def test_repeat_forward_and_backward_under_symbolic_sizes():
    """DeBERTa's `pos_key.repeat(batch, 1, 1)`: the gradient sums the tiles (eager's ops)."""
    def f(x, w):
        return ((x * w).repeat(2, 1, 3).tanh() * 3).sum(0)
    cf = pyfuser.compile(f, dynamic=True)
    for n in (4, 6, 9):
        x = torch.randn(n, 5, dtype=torch.float64, requires_grad=True)
        w = torch.randn(5, dtype=torch.float64)
        x2 = x.detach().clone().requires_grad_()
        got, want = cf(x, w), f(x2, w)
        torch.testing.assert_close(got, want)
        got.sum().backward()
        want.sum().backward()
        torch.testing.assert_close(x.grad, x2.grad)
    graphs = compiled_graphs()
    assert len(graphs) == 2 and not [r for g in graphs for r in g.unsupported.values()
                                     if "repeat" in r]
    assert any("aten.repeat.default" in r.ops for g in graphs for r in g.regions)
    for g in graphs:
        assert_ran_as_sm90_kernels(g.regions)


def test_a_broadcasting_copy_into_a_new_buffer_fuses():
    """DeepSeek-V3's key assembly: the rotary part of one head copied into every head of a new
    buffer (an expanded source), beside the per-head part; a row copied into a bfloat16 buffer
    (a cast too). The copies, the buffer and the slice_scatters are one region."""
    def f(x, k_pe, row):
        k = x.new_empty(2, 3, 4, 6)
        k[..., :4] = x
        k[..., 4:] = k_pe.expand(2, 3, 4, 2)
        b = torch.zeros(5, 4, dtype=torch.bfloat16)
        b.copy_(row)
        return k * 2, b + 1
    x, k_pe, row = torch.randn(2, 3, 4, 4), torch.randn(2, 1, 4, 2), torch.randn(4)
    with torch.no_grad():
        got, want = pyfuser.compile(f)(x, k_pe, row), f(x, k_pe, row)
    equal(got, want)
    (graph,) = compiled_graphs()
    assert not graph.unsupported, graph.unsupported
    assert sum(r.ops.count("aten.copy.default") for r in graph.regions) == 3   # k twice, b
    assert_ran_as_sm90_kernels(graph.regions)
