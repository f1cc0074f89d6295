"""The torch.compile backend's writes into views and indexing by constant index tensors:
`slice_scatter` / `select_scatter` (lowering/aten_scatter.py: `where(pad(True), pad(src),
self)`) and `index.Tensor` / `index_put` whose one index is a constant of the graph
(fx/rewrite_index_constants.py: Falcon's multi-query `fused_qkv[:, :, [-2]]` and its gradient
become a slice and a slice_backward). Values, dtypes, shapes and strides against eager
(bit for bit: no arithmetic changes but index_put's accumulation, exact too), forward and
backward, edge cases (negative dims and indices, steps, size-0, odd sizes, non-contiguous
inputs, bfloat16 / half, dtype casts, symbolic sizes), each op inside a region that ran as
sm_90 kernels; indices the rewrite does not take keep the aten call. GPU twins:
tests/gpu/test_fusion_gaps_gpu.py."""
from __future__ import annotations

import pytest
import torch

import pyfuser
from pyfuser.frontend.fx import compiled_graphs

from test_compile_factory_like import _check, equal as _equal  # (strides of axes > 1)
from compile_checks import assert_ran_as_sm90_kernels

pytestmark = pytest.mark.usefixtures("fresh_compile")
SCATTERS = {"aten.slice_scatter.default", "aten.select_scatter.default"}




def _ops(graphs) -> set:
    return {op for g in graphs for r in g.regions for op in r.ops}


def _scatters(x, s, v):
    a = torch.slice_scatter(x * 2, s, 1, 1, 4)
    b = torch.slice_scatter(x + 1, s[:, :2], -1, 1, None, 4)              # stepped, open
    c = torch.slice_scatter(x - 1, s.to(torch.float64), 1, -4, -1)        # a cast, negatives
    d = torch.select_scatter(x * 3, v, 0, -1)                            # negative index
    e = torch.select_scatter(x.sin(), v[:x.shape[0]].to(torch.int32), -1, 2)
    f = torch.slice_scatter(x, s[:, :0], 1, 2, 2)                         # an empty slice
    return a, b, c, d, e, f


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_slice_and_select_scatter_fuse_with_eagers_values(dtype):
    x = torch.randn(3, 6).to(dtype)
    s, v = torch.randn(3, 3).to(dtype), torch.randn(6).to(dtype)
    graph = _check(_scatters, x, s, v)
    assert not graph.unsupported, graph.unsupported
    assert SCATTERS <= _ops([graph])


@pytest.mark.parametrize("shape", [(1, 6), (5, 7)])
def test_scatters_of_odd_sizes_and_non_contiguous_inputs(shape):
    x = torch.randn(shape[1], shape[0]).t()                  # a transposed self
    s, v = torch.randn(shape[0], 8)[:, ::2][:, :3], torch.randn(shape[1])
    graph = _check(_scatters, x, s, v)
    assert not graph.unsupported, graph.unsupported


def test_scatters_into_an_empty_tensor():
    def f(x, s, v):
        return torch.slice_scatter(x * 2, s, 1, 1, 4), torch.select_scatter(x + 1, v, 1, -2)
    graph = _check(f, torch.randn(0, 6), torch.randn(0, 3), torch.randn(0))
    assert not graph.unsupported, graph.unsupported


def test_scatters_of_expanded_sources():
    """A source expanded along the scattered axis (a broadcast axis padded) or another one."""
    def f(x, s, r):
        return (torch.slice_scatter(x * 2, s.expand(4, 3), 1, 1, 4),
                torch.slice_scatter(x + 1, r.expand(2, 6), 0, 1, 3),
                torch.select_scatter(x - 1, r[0, :1].expand(4), 1, 2),
                torch.slice_scatter(x, (s * 1).expand(4, 3), 1, 0, 6, 2))
    graph = _check(f, torch.randn(4, 6), torch.randn(4, 1), torch.randn(1, 6))
    assert not graph.unsupported, graph.unsupported


def test_in_place_writes_into_slices_of_a_computed_tensor_fuse():
    """`h[:, 1:4] = s` and `h[-1] = v` on a computed tensor: AOTAutograd's slice_scatter and
    select_scatter, one region with the ops around them."""
    def f(x, s, v):
        h = x * 2
        h[:, 1:4] = s
        h[-1] = v
        h[:, ::2] += 1
        return h.relu(), h[:, 2]
    graph = _check(f, torch.randn(4, 6), torch.randn(4, 3), torch.randn(6))
    assert set(graph.unsupported.values()) == {"a view the graph returns stays a view"}
    assert len(graph.regions) == 1
    assert SCATTERS <= _ops([graph])


def test_scatters_under_symbolic_sizes():
    def f(x, s):
        return torch.slice_scatter(x, s, 1, 2, 5) * 2, torch.select_scatter(x, s[:, 0], 1, -1)
    cf = pyfuser.compile(f, dynamic=True)
    for n in (4, 5, 9):                      # (not 3: duck sizing would tie it to s's 3)
        x, s = torch.randn(n, 7), torch.randn(n, 3)
        with torch.no_grad():
            _equal(cf(x, s), f(x, s))
    (graph,) = compiled_graphs()
    assert not graph.unsupported and all(r.eager_calls == 0 for r in graph.regions)


def _multi_query(qkv):
    """Falcon's multi-query split: the last two heads by constant index lists."""
    k, v = qkv[:, :, [-2]], qkv[:, :, [-1]]
    return (k.transpose(1, 2) * 2 + v.transpose(1, 2)).sin(), qkv[:, :, [0, 2]] * 3


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_constant_index_lists_become_slices_forward_and_backward(dtype):
    """The index and its gradient's index_put (accumulate) fuse: no aten index op is left and
    the gradient is eager's (one element per position: exact in any dtype)."""
    x = torch.randn(2, 5, 4, 6).to(dtype)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    got, want = pyfuser.compile(_multi_query)(xa), _multi_query(xb)
    _equal(got, want)
    w = [torch.randn(t.shape).to(dtype) for t in got]
    sum((a * b).float().sum() for a, b in zip(got, w)).backward()
    sum((a * b).float().sum() for a, b in zip(want, w)).backward()
    assert torch.equal(xa.grad, xb.grad)
    graphs = compiled_graphs()
    assert not [r for g in graphs for r in g.unsupported.values() if "index" in r]
    ops = _ops(graphs)
    assert "aten.slice_backward.default" in ops and not {o for o in ops if "index" in o}
    for g in graphs:
        assert_ran_as_sm90_kernels(g.regions)


def test_index_put_by_a_constant_index_without_accumulating():
    """`h[:, [1, 3]] = v` (index_put, accumulate False) is a slice_scatter of step 2; a 0-dim
    constant index a select_scatter; `h[:, [2]] += v` accumulates."""
    def f(x, v, w):
        h = x * 2
        h[:, [1, 3]] = v
        h[:, torch.tensor(-1)] = w
        h.index_put_((torch.tensor([0]),), v[:1, :1].expand(1, 6).clone(), accumulate=True)
        return h + 1, h[:, [0, 1, 2]]
    graph = _check(f, torch.randn(4, 6), torch.randn(4, 2), torch.randn(4))
    assert not graph.unsupported, graph.unsupported
    assert SCATTERS <= _ops([graph])


def test_indices_the_rewrite_does_not_take_stay_aten_calls():
    """Not an arithmetic progression, repeated, or an index computed at run time (of the
    second axis): `aten.index.Tensor` stays eager's, with its reason; two index tensors of the
    leading axes are a lookup (test_compile_index_tensor.py), as one of the first axis is."""
    def f(x, i):
        return (x[:, [2, 0, 1]] + 1, x[:, [1, 1]] * 2, x[[0, 1], [2, 3]] - 1, x[:, i] * 3)
    x, i = torch.randn(3, 5), torch.tensor([4, 0])
    with torch.no_grad():
        _equal(pyfuser.compile(f)(x, i), f(x, i))
    (graph,) = compiled_graphs()
    left = [k for k in graph.unsupported if k.startswith("index")]
    assert len(left) == 3, graph.unsupported
    assert "aten.index.Tensor" in {op for r in graph.regions for op in r.ops}
