"""The torch.compile backend's rewrite of a sum over a flattening view of a fused value
(fx/rewrite_reduce.py): a bias gradient `view(gelu_backward(g, x), [B * T, C]).sum(0)` reads the
GELU backward's value itself and joins its kernel (one kernel, not a pointwise kernel writing the
gradient and a reduction reading it back); every case it cannot prove keeps the view. Results
(values, shapes, strides) are compared with eager."""
from __future__ import annotations

import pytest
import torch

import pyfuser
from pyfuser.frontend.fx import compiled_graphs
from pyfuser.frontend.fx.rewrite_reduce import sum_through_views
from fx_regions import views_between_compute

pytestmark = pytest.mark.usefixtures("fresh_compile")


def _run(f, *args):
    with torch.no_grad():
        got = pyfuser.compile(f)(*args)
    want = f(*args)
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride()
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    (graph,) = compiled_graphs()
    return graph


def test_bias_gradient_of_a_gelu_backward_is_one_kernel():
    def f(g, x, w):
        d = torch.ops.aten.gelu_backward(g, x)
        v = d.view(-1, 48)
        return torch.mm(v, w), v.sum(0), v.sum(0, keepdim=True)
    graph = _run(f, torch.randn(4, 16, 48), torch.randn(4, 16, 48), torch.randn(48, 8))
    (region,) = graph.regions
    assert not views_between_compute(region) and region.kernels() == 1


def test_merged_kept_axes_and_a_dtype_argument():
    def f(x):
        d = torch.tanh(x)                                # [2, 3, 4, 5] -> [6, 20]: both merge
        v = d.view(6, 20)
        return v.sum([0]), v.sum(1, dtype=torch.float64), v.sum([-1], keepdim=True)
    graph = _run(f, torch.randn(2, 3, 4, 5))
    assert not any(views_between_compute(r) for r in graph.regions)


def test_a_chain_of_views_merging_axes_reads_the_value():
    """The masked-LM loss's backward: the logits' gradient viewed twice before the decoder
    bias's sum; the views' other reader (a matmul) keeps them."""
    def f(g, w):
        d = torch.log_softmax(g, -1) * 3                  # [2, 8, 24]
        v = d.view(16, 24).view(-1, 24)
        return torch.mm(v, w), v.sum(0)
    graph = _run(f, torch.randn(2, 8, 24), torch.randn(24, 4))
    (region,) = graph.regions
    assert not views_between_compute(region) and region.kernels() == 1


def _aten_graph(f, *args):
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp
    gm = torch.fx.experimental.proxy_tensor.make_fx(f)(*args)
    FakeTensorProp(gm, FakeTensorMode()).propagate(*args)
    return gm


def _fusible(n):
    return n.op == "call_function" and n.target is not torch.ops.aten.mm.default


@pytest.mark.parametrize("case", ["split_axes", "unfused_value", "not_contiguous", "merges"])
def test_what_the_rewrite_cannot_prove_keeps_the_view(case):
    def f(x, w):
        if case == "split_axes":                         # [4, 12] -> [4, 3, 4]: not a merge
            return torch.tanh(x).view(4, 3, 4).sum(1)
        if case == "unfused_value":                      # a matmul's result: no kernel to join
            return torch.mm(x, w).view(2, 2, 12).sum([0, 1])
        if case == "not_contiguous":                     # a view of a transposed value
            return torch.tanh(x).t().unsqueeze(0).view(1, 12, 4).sum(1)
        return torch.tanh(x).view(48).sum(0)             # the one that moves
    x, w = torch.randn(4, 12), torch.randn(12, 12)
    gm = _aten_graph(f, x, w)
    assert sum_through_views(gm.graph, _fusible) == (case == "merges")
    gm.recompile()
    torch.testing.assert_close(gm(x, w), f(x, w))
