"""Pointwise regions that read a common tensor (or whose results one node reads) join when neither needs the other and no reader
waits for the join (frontend/fx/sibling_joins.py, `merge_siblings_sharing_inputs`): Llama's rotary
embeddings of q and k in every layer, one region and one horizontal kernel; results eager's."""
import pytest
import torch

import pyfuser
from pyfuser.frontend.fx import compiled_graphs

from compile_checks import assert_ran_as_sm90_kernels

pytestmark = pytest.mark.usefixtures("fresh_compile")


def _run(f, *args):
    got = torch.compile(f, backend=pyfuser.backend)(*args)
    want = f(*args)
    for g, w in zip(*(x if isinstance(x, tuple) else (x,) for x in (got, want))):
        assert g.shape == w.shape and g.dtype == w.dtype
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)
    (graph,) = compiled_graphs()
    return graph


def _inputs(n=5):
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(8, 8, generator=gen) for _ in range(n)]


def _rotate(x, c):
    return x * c + torch.cat([-x[:, 4:], x[:, :4]], -1)


def test_two_rotations_of_separate_matmuls_share_one_kernel():
    """Both results are read by matmuls after both rotations (not only returned: regions that
    only the graph returns join anyway, partition._join_input_regions)."""
    def f(a, b, w1, w2, c):
        q, k = a @ w1, b @ w2
        rq, rk = _rotate(q, c), _rotate(k, c)
        return rq @ w1, rk @ w2
    g = _run(f, *_inputs())
    assert len(g.regions) == 1 and [r.kernels() for r in g.regions] == [1]
    assert_ran_as_sm90_kernels(g.regions)


def test_no_join_where_a_reader_would_wait():
    """q's reader (a matmul) comes before k's matmul: joined, it would wait for k's input."""
    def f(a, b, w1, w2, c):
        rq = _rotate(a @ w1, c)
        u = rq @ w1
        rk = _rotate(b @ w2, c)
        return u, rk @ w2
    g = _run(f, *_inputs())
    assert len(g.regions) == 2


def test_no_join_without_a_common_input():
    def f(a, b, w1, w2, c):
        q, k = a @ w1, b @ w2
        rq, rk = q * 2, k * c
        return rq @ w1, rk @ w2
    g = _run(f, *_inputs())
    assert len(g.regions) == 2


def test_no_join_where_one_needs_the_other():
    def f(a, b, w1, w2, c):
        q = _rotate(a @ w1, c)
        k = _rotate(q @ w2, c)
        return q @ w1, k @ w2
    g = _run(f, *_inputs())
    assert len(g.regions) == 2


def test_results_one_node_reads_share_one_kernel():
    """Grouped-query attention's copy of v beside the q / k rotations: no common input, one
    reader (the attention); here a matmul reads both."""
    def f(a, b, w1, w2, c):
        q, k = a @ w1, b @ w2
        return (q * 2) @ (k + c)
    g = _run(f, *_inputs())
    assert len(g.regions) == 1 and [r.kernels() for r in g.regions] == [1]


def test_no_join_that_moves_an_eager_random_op_past_another():
    """h reads a matmul that waits for a region (x's, which also computes w from a later matmul),
    so h runs late; g (a common input, c) has an eager reader, multinomial, before the eager
    randperm. Joined by h's input's position alone, multinomial ran after randperm: both drew
    other numbers than eager's."""
    def f(a, b, c, m, m2, pr):
        x = a * 2
        q = x @ m
        h = q * c
        g = (c + 1).sigmoid()
        e = torch.multinomial(g, 3)
        r2 = torch.randperm(64).view(8, 8) + pr.long()
        w = x + b @ m2
        return h @ m, e, r2, w @ m
    _same_draws(f, _inputs() + [torch.zeros(8, 8)])


def test_no_join_of_regions_on_different_devices():
    """A CPU index's computation and a CUDA tensor's, both read by one `index` (eager: the
    readers-in-common condition), stay two regions: one had held CPU and CUDA nodes (partition
    on fake CUDA tensors, no GPU needed)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp
    from pyfuser.frontend.fx.partition import partition
    from pyfuser.frontend.fx.support import node_support
    A = torch.ops.aten
    g = torch.fx.Graph()
    xc, yg = g.placeholder("xc"), g.placeholder("yg")
    i = g.call_function(A._to_copy.default, (g.call_function(A.mul.Tensor, (
        g.call_function(A.sin.default, (xc,)), 3)),), {"dtype": torch.int64})
    b = g.call_function(A.cos.default, (g.call_function(A.mul.Tensor, (yg, 2)),))
    ix = g.call_function(A.index.Tensor, (b, [i]))
    g.output((ix, g.call_function(A.mm.default, (b, b))))
    gm = torch.fx.GraphModule(torch.nn.Module(), g)
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        args = torch.empty(4, 4), torch.empty(4, 4, device="cuda")
    FakeTensorProp(gm, mode).propagate(*args)
    nodes = list(gm.graph.nodes)
    outs = set(nodes[-1].all_input_nodes)
    regions = partition(nodes, {n for n in nodes if node_support(n, outs)[0]})
    assert len(regions) == 2
    for r in regions:
        assert len({n.meta["val"].device for n in r.nodes}) == 1


def test_walk_join_keeps_eager_random_ops_in_order():
    """The walk joins w into x's region, which then waits for b @ m2 (after the eager randperm),
    and so does x's eager reader multinomial: randperm, whose operands include multinomial
    (rng_order.py), waits too. Before, multinomial ran after randperm: both drew other numbers."""
    def f(a, b, m2, pr):
        x = (a * 2).sigmoid()
        e = torch.multinomial(x, 3)
        r2 = torch.randperm(64).view(8, 8) + pr.long()
        w = x + b @ m2
        return e, r2, w @ m2
    _same_draws(f, _inputs(3) + [torch.zeros(8, 8)])


def test_fused_random_op_after_an_eager_one_draws_after_it():
    """rand_like (a region of its own) comes after the eager multinomial, which reads x's region;
    that region waits for b @ m2 (w joins it). Before, the rand_like region ran first (nothing
    it reads waits) and its draw moved multinomial's numbers; now it waits for multinomial.
    Fused random numbers are pyfuser's own: only the eager draw before them is compared."""
    def f(a, b, m2):
        x = (a * 2).sigmoid()
        e = torch.multinomial(x, 3)
        u = torch.rand_like(b) * b
        w = x + b @ m2
        return e, u, w @ m2
    _same_draws(f, _inputs(3), compared=1)
    (g,) = compiled_graphs()
    assert len(g.regions) == 2 and any("aten.rand_like.default" in r.ops for r in g.regions)


def test_dropout_of_a_region_read_by_an_eager_random_op_stays_out_of_it():
    """dropout(x) comes after multinomial(x): in x's region it would draw before multinomial
    (the region runs first), so it is a region of its own, after multinomial."""
    def f(a):
        x = (a * 2).sigmoid()
        e = torch.multinomial(x, 3)
        return e, torch.nn.functional.dropout(x, 0.5, True) + 1
    _same_draws(f, _inputs(1), compared=1)
    (g,) = compiled_graphs()
    assert [sorted(op for op in r.ops if op.startswith("aten.")) for r in g.regions] == [
        ["aten.mul.Tensor", "aten.sigmoid.default"],
        ["aten.add.Tensor", "aten.native_dropout.default"]]


def _same_draws(f, args, compared=None):
    """f compiled and f eager from one seed: the same results (eager random ops included), the
    first `compared` of them where given."""
    compiled = torch.compile(f, backend=pyfuser.backend)
    torch.manual_seed(1)
    got = compiled(*args)
    torch.manual_seed(1)
    want = f(*args)
    for gt, w in list(zip(got, want))[:compared]:
        assert gt.dtype == w.dtype
        torch.testing.assert_close(gt, w, rtol=1e-6, atol=1e-6)
