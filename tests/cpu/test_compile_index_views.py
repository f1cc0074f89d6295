"""The torch.compile backend's rewrite of advanced indexing by arange grids into views
(fx/rewrite_index.py): HF's attention-mask pattern `x[arange(B)[:, None, None, None],
arange(Q)[None, None, :, None]]` read by fused ops becomes a view of x inside the mask's region
(no index kernel, no arange kernels); every case where it would not be exact keeps the index.
Results are compared with eager; the graph's remaining ops are asserted."""
from __future__ import annotations

import pytest
import torch

import pyfuser
from pyfuser.frontend.fx import compiled_graphs

pytestmark = pytest.mark.usefixtures("fresh_compile")
INDEX = "aten.index.Tensor"


def _check(f, *args):
    with torch.no_grad():
        got = pyfuser.compile(f)(*args)
    want = f(*args)
    got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        assert torch.equal(g, w)
    (graph,) = compiled_graphs()
    return graph


def test_hf_mask_grid_indexing_becomes_views_in_the_masks_region():
    def f(pos, packed):
        b, q = pos.shape
        bi = torch.arange(b)[:, None, None, None]
        qi = (torch.arange(q) + 0)[None, None, :, None]
        ki = (torch.arange(q) + 0)[None, None, None, :]
        causal = pos[bi, ki] <= pos[bi, qi]
        same = packed[bi, qi] == packed[bi, ki]
        return torch.where(causal & same, 0.0, float("-inf"))
    pos = torch.arange(8).expand(2, 8)
    packed = torch.tensor([[0, 0, 0, 1, 1, 1, 2, 2], [0] * 8])
    graph = _check(f, pos, packed)
    assert INDEX not in str(graph.gm.graph)
    assert len(graph.regions) == 1 and "aten.arange.default" not in graph.regions[0].ops


def test_offsets_permuted_axes_and_a_batch_of_one():
    def f(x, y):
        a = x[(torch.arange(3) + 2)[:, None], torch.arange(1, 5)[None, :]]   # slices of x
        b = x[torch.arange(4)[None, :], torch.arange(5)[:, None]]            # x's axes swapped
        c = y[torch.arange(1)[:, None], torch.arange(6)[None, :]]            # batch of one
        return a * 2, b + 1, c - 1
    x, y = torch.randn(5, 6), torch.randn(1, 6)
    x = x[:, :5]                                       # a non-contiguous input
    graph = _check(f, x, y)
    assert INDEX not in str(graph.gm.graph)


@pytest.mark.parametrize("case", ["beyond", "negative_start", "unfused_reader", "output",
                                  "repeated_axis", "step"])
def test_what_the_rewrite_cannot_prove_keeps_the_index(case):
    def f(x):
        i = torch.arange(4)
        if case == "beyond":                           # 2 + 4 > 5: eager would raise
            return x[(i + 1)[:, None], i[None, :]] * 2
        if case == "negative_start":                   # -1 wraps around in eager
            return x[(i - 1)[:, None], i[None, :]] * 2
        if case == "unfused_reader":
            return torch.mm(x[i[:, None], i[None, :]], x[:4, :4])
        if case == "output":                           # eager returns a fresh contiguous tensor
            return x[i[:, None], i[None, :]]
        if case == "repeated_axis":                    # a diagonal, not a view of axes
            return x[i, i] * 2
        return x[torch.arange(0, 4, 2)[:, None], i[None, :]] * 2
    x = torch.randn(5, 5)
    if case == "beyond":
        x = torch.randn(4, 5)
        with pytest.raises(Exception):
            pyfuser.compile(f)(x)
        return
    graph = _check(f, x)
    # still an index, not views: the aten call, or (since the leading-axis lookup is lowered,
    # aten_indexing.py) that lookup in a region
    assert INDEX in str(graph.gm.graph) or INDEX in [op for r in graph.regions for op in r.ops]
    if case == "output":
        with torch.no_grad():
            assert pyfuser.compile(f)(x).is_contiguous()


def test_new_ones_zeros_and_full_fuse_with_eagers_dtypes():
    def f(x):
        t = x.new_ones([], dtype=torch.bool)
        z = x.new_zeros((2, 3))
        h = x.new_full((3,), 1.5)
        return (x > 0) & t, x + z, x * h
    x = torch.randn(2, 3)
    graph = _check(f, x)
    ops = [op for r in graph.regions for op in r.ops]
    for name in ("aten.new_ones.default", "aten.new_zeros.default", "aten.new_full.default"):
        assert name in ops


def _grid_case(rng):
    """A random arange-grid index of a random x: per axis of x a start, a length (1 sometimes)
    and an output axis; the output rank may exceed x's (size-1 axes no index varies along)."""
    rank = int(rng.integers(1, 4))
    shape = [int(rng.integers(1, 6)) for _ in range(rank)]
    out_rank = rank + int(rng.integers(0, 2))
    out_axes = [int(a) for a in rng.permutation(out_rank)[:rank]]
    spec = []
    for d in range(rank):
        n = int(rng.integers(1, shape[d] + 1))
        start = int(rng.integers(0, shape[d] - n + 1))
        spec.append((start, n, out_axes[d]))
    return shape, out_rank, spec


def test_random_arange_grids_match_eager():
    import numpy as np
    rng = np.random.default_rng(20261128)
    rewritten = 0
    for case in range(16):
        shape, out_rank, spec = _grid_case(rng)

        def f(x, spec=spec, out_rank=out_rank, odd=case % 2):
            idx = [_placed(torch.arange(n) + start if odd else torch.arange(start, start + n),
                           axis, out_rank) for start, n, axis in spec]
            return x[tuple(idx)] * 2 + 1
        torch._dynamo.reset()
        from pyfuser.frontend.fx import reset_compiled
        reset_compiled()
        x = torch.randn(*shape)
        with torch.no_grad():
            got = pyfuser.compile(f)(x)
        want = f(x)
        assert got.shape == want.shape and torch.equal(got, want), (shape, spec)
        rewritten += INDEX not in str(compiled_graphs()[0].gm.graph)
    assert rewritten == 16


def _placed(i, axis, rank):
    """The 1-D index i with size-1 axes added by unsqueeze so that it varies along `axis`."""
    for _ in range(axis):
        i = i.unsqueeze(0)
    for _ in range(rank - axis - 1):
        i = i.unsqueeze(-1)
    return i


def test_symbolic_sizes_rewrite_and_reuse_the_compiled_graph():
    """dynamic=True: the aranges' lengths and x's sizes are the same symbols, so the rewrite is
    proven for every size; a new batch and length reuse the graph."""
    def f(pos):
        b, q = pos.shape
        bi = torch.arange(b)[:, None, None]
        qi = torch.arange(q)[None, :, None]
        ki = torch.arange(q)[None, None, :]
        return pos[bi, ki] <= pos[bi, qi]
    cf = pyfuser.compile(f, dynamic=True)
    for b, q in ((2, 5), (3, 7)):
        pos = torch.randint(0, 9, (b, q))
        with torch.no_grad():
            got = cf(pos)
        assert torch.equal(got, f(pos))
    (graph,) = compiled_graphs()
    assert INDEX not in str(graph.gm.graph)
