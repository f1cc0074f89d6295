"""Which views a torch.compile region keeps at its ends (frontend/fx/partition.py `_trim`):
reshapes and transposes at its output end (host views of its kernels' outputs), reshapes of
row-major inputs at its input end; slices, selects, unsqueezes and expands, and chains holding
one, stay FX's. Results are compared with eager; the regions' ops are asserted."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import pyfuser
from pyfuser.frontend.fx import compiled_graphs
from fx_regions import graph_targets, views_between_compute

pytestmark = pytest.mark.usefixtures("fresh_compile")


def test_views_at_a_regions_ends_are_its_own_and_a_non_row_major_inputs_view_is_left_to_fx():
    """A region returns the views at its output end as host views and views a row-major input
    itself (each a Python call fewer in the graph); a view of a transposed input stays in FX."""
    def f(x, w, y):
        h = torch.mm(x, w)                          # a matmul's row-major result, viewed 3-D
        z = F.gelu(h.view(2, 4, 6) + 1)             # into the region (its input-end view) and
        out = z.view(8, 6)                          # 2-D out of it (its output-end view)
        u = y.unsqueeze(0) * 2                      # y is transposed: its view stays in FX
        return torch.mm(out, w.t()), u
    torch.manual_seed(0)
    args = (torch.randn(8, 5), torch.randn(5, 6), torch.randn(6, 3).t())
    with torch.no_grad():
        got = pyfuser.compile(f)(*args)
    want = f(*args)
    for g, e in zip(got, want):
        assert g.dtype == e.dtype and g.shape == e.shape
        assert [s for s, n in zip(g.stride(), g.shape) if n > 1] == \
            [s for s, n in zip(e.stride(), e.shape) if n > 1]
        torch.testing.assert_close(g, e)
    (graph,) = compiled_graphs()
    ops = sorted(tuple(r.ops) for r in graph.regions)
    assert ops == [("aten.mul.Tensor",),
                   ("aten.view.default", "aten.add.Tensor", "aten.gelu.default", "aten.view.default")]
    assert not any(views_between_compute(r) for r in graph.regions)
    assert all(r.kernels() == 1 for r in graph.regions)
    targets = graph_targets(graph)
    assert "view" not in targets and "unsqueeze" in targets


def test_a_chain_of_views_at_a_regions_output_end_stays_in_it_only_if_each_may():
    """A slice then a transpose at a region's output end: the slice may not stay (in a kernel
    it is a shifted read), so neither does the transpose after it (found by review: the chain
    was kept, the last view deciding); a lone `t()` does stay."""
    def f(x, w, z):
        y = x * 2
        h = y[..., :4].transpose(1, 2)
        return torch.matmul(h, w), torch.mm((z + 1).t(), z)
    torch.manual_seed(0)
    args = (torch.randn(2, 3, 6), torch.randn(3, 5), torch.randn(4, 3))
    with torch.no_grad():
        got = pyfuser.compile(f)(*args)
    for g, e in zip(got, f(*args)):
        assert g.shape == e.shape and g.dtype == e.dtype
        torch.testing.assert_close(g, e)
    (graph,) = compiled_graphs()
    (region,) = graph.regions              # reading the graph's inputs only: joined
    assert sorted(region.ops) == ["aten.add.Tensor", "aten.mul.Tensor", "aten.t.default"]


def test_a_reshape_of_a_row_major_input_with_symbolic_sizes_is_the_regions():
    """Under dynamic shapes a view's sizes are SymInt nodes; the input-end rule looks at the
    tensor it reads only (it had looked at every argument, so the view went back to FX)."""
    def f(x, w):
        return F.gelu(torch.mm(x, w).view(x.shape[0], 2, 8) + 1)
    torch.manual_seed(0)
    w = torch.randn(4, 16)
    compiled = pyfuser.compile(f, dynamic=True)
    with torch.no_grad():
        for n in (6, 10):
            x = torch.randn(n, 4)
            got, want = compiled(x, w), f(x, w)
            assert got.shape == want.shape and got.stride() == want.stride()
            torch.testing.assert_close(got, want)
    (graph,) = compiled_graphs()
    (region,) = graph.regions
    assert region.ops[0] == "aten.view.default" and "aten.gelu.default" in region.ops


def test_a_reshape_after_a_dropped_slice_at_the_output_end_leaves_with_it():
    """A row-major slice then a reshape at a region's output end: the slice goes back to FX
    and so must the reshape after it; kept as the region's input-end view of the slice, it read
    a value computed from the region's own result (a cycle: Llama's training graph)."""
    def f(x, w):
        y = x * 2
        return torch.mm(y[:2].view(4, 3), w)
    torch.manual_seed(0)
    args = (torch.randn(4, 6), torch.randn(3, 5))
    with torch.no_grad():
        got = pyfuser.compile(f)(*args)
    torch.testing.assert_close(got, f(*args))
    (graph,) = compiled_graphs()
    assert [r.ops for r in graph.regions] == [["aten.mul.Tensor"]]
