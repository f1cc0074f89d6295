"""argmax / argmin lowered as two reductions in one kernel (lowering/aten_arg_reduction.py
`_arg_extreme`): the row's NaN-propagating extreme, then the least position holding it or a
NaN. Against eager: values (exact: positions), shape, dtype (int64), for float32 / bfloat16 /
float64 / integer inputs, ties (the first wins), NaN rows (the first NaN), -0.0 beside 0.0,
infinities, dims, keepdim and dim=None (row-major positions over every axis), rows short and
long, inner and outer; max.dim / min.dim's indices; through torch.compile (CLIP's pooling
position) and a TorchScript graph; each kernel compiled with NVRTC for sm_90 by the interpreter's executor."""
from __future__ import annotations

import zlib

import pytest
import torch

import pyfuser
from pyfuser.frontend.fx import compiled_graphs
from pyfuser.runtime import dispatch

from compile_checks import assert_ran_as_sm90_kernels

pytestmark = pytest.mark.usefixtures("fresh_compile")
ARGS = ("aten.argmax.default", "aten.argmin.default")


def _hard(shape, dtype, gen):
    """Random values with ties, NaNs, signed zeros and infinities planted in some rows."""
    if not dtype.is_floating_point:
        low = 0 if dtype == torch.uint8 else -3
        return torch.randint(low, low + 7, shape, generator=gen, dtype=dtype)   # many ties
    x = torch.randn(*shape, generator=gen)
    flat = x.view(-1)
    n = flat.numel()
    picks = torch.randint(0, n, (max(1, n // 7),), generator=gen)
    flat[picks[0::4]] = float("nan")
    flat[picks[1::4]] = float("inf")
    flat[picks[2::4]] = -float("inf")
    flat[picks[3::4]] = -0.0
    if x.ndim > 1:
        x[0] = 0.0                            # a row of zeros: the first position
        x[-1] = 2.5                           # a row of one value: ties everywhere
    return x.to(dtype)


def _regions():
    return [r for g in compiled_graphs() for r in g.regions]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64, torch.int32,
                                   torch.int64, torch.uint8], ids=str)
@pytest.mark.parametrize("shape,dim,keepdim", [
    ((6, 7), -1, False), ((6, 7), 0, True), ((4, 5, 6), 1, False), ((4, 5, 6), None, False),
    ((4, 5, 6), None, True), ((9,), 0, False), ((3, 5000), 1, True), ((5000, 3), 0, False)],
    ids=str)
def test_argmax_and_argmin_equal_eager(dtype, shape, dim, keepdim):
    gen = torch.Generator().manual_seed(zlib.crc32(repr((dtype, shape, dim)).encode()))
    x = _hard(shape, dtype, gen)

    def f(x):
        return (x.argmax(dim, keepdim=keepdim) + 1, x.argmin(dim, keepdim=keepdim))
    with torch.no_grad():
        got, want = pyfuser.compile(f)(x), f(x)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype == torch.int64
        assert torch.equal(g, w), (g, w)
    ops = {op for r in _regions() for op in r.ops}
    assert set(ARGS) <= ops, compiled_graphs()[0].unsupported
    assert_ran_as_sm90_kernels(_regions())


@pytest.mark.parametrize("shape,dim", [((6, 40), 1), ((40, 6), 0), ((4, 5, 6), None)], ids=str)
def test_one_kernel_a_region(shape, dim):
    """The extreme and the position's minimum are one kernel (the second reads the first's
    row result broadcast back: the inner persistent scheduler)."""
    x = torch.randn(*shape)
    with torch.no_grad():
        got = pyfuser.compile(lambda x: x.argmax(dim))(x)
    assert torch.equal(got, x.argmax(dim))
    (region,) = _regions()
    report = dispatch.last_report(region.fusion)
    assert [s.kind for s in report.segments] == ["kernel"], report


def test_long_rows_and_the_whole_tensor():
    """Rows too long to hold on chip, and dim=None over a million elements: still eager's
    positions (however many kernels the scheduler picks)."""
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(3, 300_000, generator=gen)
    x[1, 123_456] = 50.0
    x[1, 223_456] = 50.0                       # a tie: the first
    x[2, 299_999] = float("nan")
    big = torch.randn(1000, 1000, generator=gen)
    with torch.no_grad():
        assert torch.equal(pyfuser.compile(lambda x: x.argmax(1))(x), x.argmax(1))
        assert torch.equal(pyfuser.compile(lambda x: x.argmin())(big), big.argmin())


def test_clip_pooling_fuses():
    """CLIP's text pooling: the hidden state at each sequence's end token (the largest id),
    h[arange(b), ids.argmax(-1)]: the argmax and the lookup fuse; values exact."""
    def pool(h, ids):
        return h[torch.arange(h.shape[0]), ids.to(torch.int).argmax(dim=-1)] * 2
    gen = torch.Generator().manual_seed(3)
    h, ids = torch.randn(3, 8, 16, generator=gen), torch.randint(0, 50, (3, 8), generator=gen)
    ids[1, 5] = ids[1, 2] = 99
    with torch.no_grad():
        got, want = pyfuser.compile(pool)(h, ids), pool(h, ids)
    assert torch.equal(got, want)
    (graph,) = compiled_graphs()
    ops = {op for r in graph.regions for op in r.ops}
    assert {"aten.argmax.default", "aten.index.Tensor"} <= ops, graph.unsupported
    assert_ran_as_sm90_kernels(graph.regions)


def test_traced_graph_argmax():
    """A TorchScript graph groups argmax with its neighbours."""
    def f(x):
        return (x * 2).argmax(-1) + 1
    x = torch.randn(5, 33)
    x[2, 7] = float("nan")
    j = pyfuser.jit(torch.jit.trace(f, (x,)), cpu_executor="interpret")
    with torch.no_grad():
        got = j(x)
    assert torch.equal(got, f(x))
    run = j.last_run
    assert run.eager_groups == 0 and run.kernels >= 1, run.fallbacks
    assert not [fb for fb in run.fallbacks if fb["kind"] == "aten::argmax"], run.fallbacks


def test_bool_and_zero_dim_inputs_stay_eager():
    """Eager's argmax of a bool tensor raises and of a 0-dim tensor is 0: both left to eager."""
    x = torch.tensor(3.0)
    with torch.no_grad():
        assert torch.equal(pyfuser.compile(lambda x: x.argmax() + 1)(x), torch.tensor(1))
    (graph,) = compiled_graphs()
    assert any("rank >= 1" in r for r in graph.unsupported.values()), graph.unsupported


@pytest.mark.parametrize("dim", [None, 0, 1, -1], ids=str)
def test_expanded_inputs_count_positions_at_their_expanded_sizes(dim):
    """An axis made by expand has extent 1 in the IR and its size elsewhere: positions and
    strides along it use the expanded size (row-major positions of dim=None too)."""
    t = torch.tensor([[3.0], [-1.0], [7.0], [7.0]])            # [4, 1] -> [4, 3]
    u = torch.tensor([[0.5, 9.0, 9.0, -2.0]])                   # [1, 4] -> [3, 4]

    def f(t, u):
        return ((t + 1).expand(4, 3).argmax(dim), (u * 2).expand(3, 4).argmin(dim),
                (u * 2).expand(3, 4).argmax(dim))
    with torch.no_grad():
        got, want = pyfuser.compile(f)(t, u), f(t, u)
    for g, w in zip(got, want):
        assert g.shape == w.shape and torch.equal(g, w), (g, w)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64], ids=str)
@pytest.mark.parametrize("keepdim", [False, True])
def test_max_and_min_over_a_dim_give_their_indices(dtype, keepdim):
    """max.dim / min.dim: (values, indices), the indices argmax's / argmin's (a classifier's
    `_, pred = out.max(1)`); values as before."""
    gen = torch.Generator().manual_seed(21)
    x = _hard((7, 40), dtype, gen)

    def f(x):
        v, i = x.max(1, keepdim=keepdim)
        w, j = torch.min(x * 2, 0, keepdim=keepdim)
        return v, i + 1, w, j
    with torch.no_grad():
        got, want = pyfuser.compile(f)(x), f(x)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        assert torch.equal(g, w) or torch.equal(g.nan_to_num(), w.nan_to_num()), (g, w)
    ops = {op for r in _regions() for op in r.ops}
    assert {"aten.max.dim", "aten.min.dim"} <= ops, compiled_graphs()[0].unsupported
    assert_ran_as_sm90_kernels(_regions())


def test_max_values_alone_leave_the_indices_out_of_the_kernel():
    """A graph reading only max.dim's values: the index reduction is in the Fusion but no
    expression an output uses reaches it, so the kernel is the plain max's (one pass)."""
    x = torch.randn(6, 50)
    with torch.no_grad():
        got = pyfuser.compile(lambda x: x.max(1).values * 2)(x)
    assert torch.equal(got, x.max(1).values * 2)
    (region,) = _regions()
    used = region.fusion.used_exprs()
    assert not any(getattr(e, "op_name", "") == "min" for e in used), used
    report = dispatch.last_report(region.fusion)
    assert [s.kind for s in report.segments] == ["kernel"], report
