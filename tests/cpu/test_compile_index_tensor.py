"""The torch.compile backend's advanced indexing of a first axis by one integer tensor (Swin's
relative-position bias table, `table[index.view(-1)]`): `aten.index.Tensor` lowers to the lookup
of an embedding (negative indices wrapped as eager does), its gradient `aten.index_put` with
accumulate to `x + embedding_dense_backward` (lowering/aten_indexing.py). Forward and backward
against eager (float64 oracles for the sums), every region run as sm_90 kernels, out-of-range
indices raising as eager does; other forms (an index of another axis, a 3-D table's gradient,
`accumulate=False`) keep the aten call with its reason."""
from __future__ import annotations

import pytest
import torch

import pyfuser
from pyfuser.frontend.fx import compiled_graphs

from test_compile_training import assert_ran_as_sm90_kernels
from train_corpus import assert_as_close_as_eager

pytestmark = pytest.mark.usefixtures("fresh_compile")
INDEX, INDEX_PUT = "aten.index.Tensor", "aten.index_put.default"


def _bias(t, i):
    return (t[i.view(-1)].view(*i.shape, *t.shape[1:]) * 2).sin()


def _fused(graphs) -> set:
    return {op for g in graphs for r in g.regions for op in r.ops}


@pytest.mark.parametrize("dtype,idx_dtype", [(torch.float32, torch.int64),
                                             (torch.float32, torch.int32),
                                             (torch.bfloat16, torch.int64),
                                             (torch.float64, torch.int64)], ids=str)
def test_first_axis_index_and_its_gradient_fuse(dtype, idx_dtype):
    gen = torch.Generator().manual_seed(3)
    base = torch.randn(13, 4, generator=gen)
    idx = torch.tensor([[0, 3, 12], [5, -1, 3], [3, 3, -13]], dtype=idx_dtype)  # repeats, negatives
    runs = []
    for impl, dt in ((pyfuser.compile(_bias), dtype), (_bias, dtype), (_bias, torch.float64)):
        t = base.to(dt).requires_grad_()
        out = impl(t, idx)
        (g,) = torch.autograd.grad(out.float().square().sum() if dt != torch.float64
                                   else out.square().sum(), t)
        runs.append((out, g))
    (out, g), (out_e, g_e), (out_o, g_o) = runs
    assert out.dtype == out_e.dtype == dtype and out.shape == out_e.shape == (3, 3, 4)
    assert torch.equal(out, out_e)                       # a lookup and pointwise ops: exact
    assert_as_close_as_eager(g, g_e, g_o, "table gradient")
    fw, bw = [g for g in compiled_graphs() if g.kind == "forward"], \
        [g for g in compiled_graphs() if g.kind == "backward"]
    assert INDEX in _fused(fw) and INDEX_PUT in _fused(bw)
    left = [k for gr in fw + bw for k in gr.unsupported if k.startswith("index")]
    assert not left, left
    assert_ran_as_sm90_kernels([r for gr in fw + bw for r in gr.regions])


@pytest.mark.parametrize("shape", [(9,), (6, 2, 3)], ids=str)
def test_other_ranks_index_fused(shape):
    """A vector or a 3-D table: the lookup fuses; its gradient's index_put too for a vector
    (rows of one element), not for a 3-D table (the embedding gradient is 2-D)."""
    t = torch.randn(*shape, requires_grad=True)
    i = torch.tensor([[1, -2], [0, 5]])
    out = pyfuser.compile(_bias)(t, i)
    (g,) = torch.autograd.grad(out.sum(), t)
    t2 = t.detach().clone().requires_grad_()
    want = _bias(t2, i)
    (g2,) = torch.autograd.grad(want.sum(), t2)
    assert torch.equal(out, want)
    torch.testing.assert_close(g, g2, rtol=1e-6, atol=1e-6)
    graphs = compiled_graphs()
    assert INDEX in _fused([g for g in graphs if g.kind == "forward"])
    bw_left = [k for g in graphs if g.kind == "backward" for k in g.unsupported
               if k.startswith("index_put")]
    assert bool(bw_left) == (len(shape) > 2)
    assert (INDEX_PUT in _fused([g for g in graphs if g.kind == "backward"])) == (len(shape) <= 2)


@pytest.mark.parametrize("bad", [13, -14])
def test_an_index_out_of_range_raises_as_eager(bad):
    t, i = torch.randn(13, 4), torch.tensor([0, bad])
    with pytest.raises(IndexError):
        _bias(t, i)
    with pytest.raises(IndexError):
        with torch.no_grad():
            pyfuser.compile(_bias)(t, i)
    assert INDEX in _fused(compiled_graphs())            # the fused lookup raised


def test_other_index_forms_keep_the_aten_call():
    """An index of the second axis, two index tensors, and index_put without accumulate."""
    def f(x, i, v):
        y = x.clone()
        y.index_put_((i,), v)                      # last write wins: eager's
        return x[:, i] * 2, x[i, i] + 1, y * 3
    x, i, v = torch.randn(5, 5), torch.tensor([4, 0, 2]), torch.randn(3, 5)
    with torch.no_grad():
        got, want = pyfuser.compile(f)(x, i, v), f(x, i, v)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    (graph,) = compiled_graphs()
    reasons = " | ".join(graph.unsupported.values())
    assert "only one index tensor, of the first axis" in reasons and "accumulate" in reasons


def test_symbolic_table_sizes():
    """dynamic=True: the lookup fuses at a symbolic first extent (the wrap adds it as a size);
    the gradient's index_put needs a constant one (the embedding gradient's row count) and
    keeps the aten call, with its reason; both sizes match eager."""
    def f(t, i):
        return (t[i] * 2).sin()
    c = torch.compile(f, backend="pyfuser", dynamic=True)
    for n, m in ((13, 3), (17, 5)):
        gen = torch.Generator().manual_seed(n)
        t = torch.randn(n, 4, generator=gen, requires_grad=True)
        i = torch.randint(-n, n, (m, 2), generator=gen)
        out, want = c(t, i), f(t, i)
        assert torch.equal(out, want)
        (g,) = torch.autograd.grad(out.sum(), t)
        (gw,) = torch.autograd.grad(want.sum(), t)
        torch.testing.assert_close(g, gw, rtol=1e-6, atol=1e-6)
    graphs = compiled_graphs()
    assert INDEX in _fused([g for g in graphs if g.kind == "forward"])
    reasons = [r for g in graphs if g.kind == "backward" for k, r in g.unsupported.items()
               if k.startswith("index_put")]
    assert reasons and all("constant first extent" in r for r in reasons)


def test_broadcast_values_keep_the_aten_call():
    """index_put_(accumulate) of values broadcast to the indexed rows: eager's (a table of
    constant rows, as a gradient's zeros are: a table from an input has a symbolic row count,
    which the embedding gradient cannot take, and stays eager's for that)."""
    def f(x, i, v):
        y = torch.zeros(6, 4)
        y.index_put_((i,), v, accumulate=True)
        return y + x
    x, i, v = torch.randn(6, 4), torch.tensor([1, 1, -1]), torch.randn(4)
    with torch.no_grad():
        got, want = pyfuser.compile(f)(x, i, v), f(x, i, v)
    torch.testing.assert_close(got, want)
    (graph,) = compiled_graphs()
    assert any("broadcast" in r for r in graph.unsupported.values()), graph.unsupported


@pytest.mark.parametrize("rows,bad", [(3, [0, 3]), (3, [0, -4]), (13, [2, 13])])
def test_an_accumulating_index_put_out_of_range_raises_as_eager(rows, bad):
    """Small tables too (embedding's small-table sum would drop an index outside the table;
    index_put has no forward lookup that trapped on it first)."""
    def f(x, i, v):
        y = torch.zeros(rows, 4)
        y.index_put_((i,), v, accumulate=True)
        return y + x
    x, i, v = torch.randn(rows, 4), torch.tensor(bad), torch.randn(2, 4)
    with pytest.raises(IndexError):
        f(x, i, v)
    with pytest.raises(IndexError):
        with torch.no_grad():
            pyfuser.compile(f)(x, i, v)
    ok = torch.tensor([0, -1])
    with torch.no_grad():
        torch.testing.assert_close(pyfuser.compile(f)(x, ok, v), f(x, ok, v))
    assert INDEX_PUT in _fused(compiled_graphs())


def _pick_first(x, i):
    return x[i].sin() * 2


def _pick_third(x, i):                  # Falcon's key/value selection: x[:, :, i]
    return x[:, :, i].sin() * 2


def _pick_mask(x, m):
    return x[m].sin() * 2


@pytest.mark.parametrize("fn,how,index_in_group", [
    (_pick_first, "int", True), (_pick_third, "int", False), (_pick_mask, "mask", False)],
    ids=["first-axis", "third-axis", "bool-mask"])
def test_traced_graph_groups_only_the_index_it_lowers(fn, how, index_in_group):
    """The TorchScript graph fuser asks the lowering's check of `aten::index`: an index of
    another axis (None entries) or a mask stays out of the groups, so the groups around it
    still fuse; the falcon-trace regression, where such an index failed its group's lowering
    and ran that group eagerly."""
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(6, 3, 5, 4, generator=gen)
    i = torch.tensor([4, 0, -1, 4]) if how == "int" else torch.rand(6, 3, 5, 4, generator=gen) > .5
    f = pyfuser.jit(torch.jit.trace(fn, (x, i)), cpu_executor="interpret")
    with torch.no_grad():
        got, want = f(x, i), fn(x, i)
    assert got.shape == want.shape and got.dtype == want.dtype
    torch.testing.assert_close(got, want)
    run = f.last_run
    assert run.eager_groups == 0, run.fallbacks
    grouped = [n.kind for n in f.graph.nodes() if n.kind == "prim::PyfuserGroup"]
    assert grouped
    left = [fb for fb in run.fallbacks if fb["kind"] == "aten::index"]
    assert bool(left) != index_in_group, run.fallbacks
