"""The torch.compile backend's advanced indexing of leading axes by integer tensors (Swin's
relative-position bias table, `table[index.view(-1)]`; CLIP's pooling `h[arange(b), ends]`):
`aten.index.Tensor` lowers to the lookup of an embedding (negative indices wrapped as eager
does; several indices flattened into one row number), its gradient `aten.index_put` with
accumulate to `x + embedding_dense_backward` (lowering/aten_indexing.py). Forward and backward
against eager (float64 oracles for the sums), every region run as sm_90 kernels, out-of-range
indices raising as eager does; other forms (an index of a later axis, a 3-D table's gradient,
`accumulate=False`) keep the aten call with its reason; a traced TorchScript graph groups only
the one-index form."""
from __future__ import annotations

import pytest
import torch

import pyfuser
from pyfuser.frontend.fx import compiled_graphs

from compile_checks import assert_ran_as_sm90_kernels
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
    """A vector or a 3-D table: the lookup fuses, and so does its gradient's index_put (rows
    of one element; rows of [2, 3] summed as rows of 6, then viewed as the table)."""
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
    assert not [k for g in graphs for k in g.unsupported if k.startswith("index")]
    assert INDEX_PUT in _fused([g for g in graphs if g.kind == "backward"])
    assert_ran_as_sm90_kernels([r for g in graphs for r in g.regions])


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
    """An index of the second axis (a None entry first) and index_put without accumulate."""
    def f(x, i, v):
        y = x.clone()
        y.index_put_((i,), v)                      # last write wins: eager's
        return x[:, i] * 2, y * 3
    x, i, v = torch.randn(5, 5), torch.tensor([4, 0, 2]), torch.randn(3, 5)
    with torch.no_grad():
        got, want = pyfuser.compile(f)(x, i, v), f(x, i, v)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    (graph,) = compiled_graphs()
    reasons = " | ".join(graph.unsupported.values())
    assert "leading axes" in reasons and "accumulate" in reasons


def _pool(x, a, b):                      # CLIP's pooling: x[arange(batch), end token]
    return (x[a, b] * 2).sin()


def _pick_grid(x, a, b):                 # broadcast indices: a[:, None], b[None, :]
    return x[a[:, None], b[None, :]] + 1


def _pick_all(x, a, b, c):               # as many indices as axes: elements, no rows
    return x[a, b, c] * 3


@pytest.mark.parametrize("case", ["pool", "pool-int32", "pool-transposed", "grid", "all-axes",
                                  "pool-bf16"])
def test_several_leading_index_tensors_and_their_gradient_fuse(case):
    """k integer index tensors of the leading axes, broadcast together (CLIP's pooling, a
    grid of rows and columns, every axis): the lookup of the flattened leading axes at
    sum(index * stride), forward exact, the gradient (index_put of k indices) against float64,
    every region sm_90 kernels."""
    gen = torch.Generator().manual_seed(11)
    dtype = torch.bfloat16 if case.endswith("bf16") else torch.float32
    base = torch.randn(4, 6, 5, generator=gen)
    if case == "pool-transposed":
        base = torch.randn(6, 4, 5, generator=gen).transpose(0, 1)
    idt = torch.int32 if case.endswith("int32") else torch.int64
    a, b, c = (torch.tensor(v, dtype=idt) for v in ([0, 3, -1, 1], [5, -6, 2, 2], [4, 0, -5, 1]))
    fn, args = {"grid": (_pick_grid, (a, b[:3])), "all-axes": (_pick_all, (a, b, c))}.get(
        case, (_pool, (a, b)))
    runs = []
    for impl, dt in ((pyfuser.compile(fn), dtype), (fn, dtype), (fn, torch.float64)):
        t = base.to(dt).requires_grad_()
        out = impl(t, *args)
        (g,) = torch.autograd.grad(out.float().square().sum(), t)
        runs.append((out, g))
    (out, g), (out_e, g_e), (out_o, g_o) = runs
    assert out.dtype == out_e.dtype and out.shape == out_e.shape
    assert torch.equal(out, out_e)
    assert_as_close_as_eager(g, g_e, g_o.to(g.dtype) if dtype != torch.float32 else g_o,
                             "input gradient")
    graphs = compiled_graphs()
    fw, bw = [g for g in graphs if g.kind == "forward"], [g for g in graphs if g.kind == "backward"]
    assert INDEX in _fused(fw) and INDEX_PUT in _fused(bw)
    left = [k for gr in fw + bw for k in gr.unsupported if k.startswith("index")]
    assert not left, left
    assert_ran_as_sm90_kernels([r for gr in fw + bw for r in gr.regions])


@pytest.mark.parametrize("a,b", [([0, 4], [0, 0]), ([0, 1], [6, 0]), ([1, 2], [-7, 0]),
                                 ([-5, 0], [0, 0])], ids=str)
def test_an_index_out_of_its_axis_raises_even_where_the_flat_row_exists(a, b):
    """x[a, b] on a 4x6 table: b = 6 with a = 0 is flat row 6, inside the 24 rows, but outside
    axis 1's 6; b = -7 with a = 1 is flat row 5 (b wrapped to -1); a = 4 or -5 are outside
    axis 0: eager's IndexError, never another row's values."""
    x = torch.randn(4, 6, 3)
    a, b = torch.tensor(a), torch.tensor(b)
    with pytest.raises(IndexError):
        _pool(x, a, b)
    with pytest.raises(IndexError):
        with torch.no_grad():
            pyfuser.compile(_pool)(x, a, b)
    assert INDEX in _fused(compiled_graphs())


def test_several_index_tensors_at_symbolic_sizes():
    """dynamic=True: the leading extents are symbols (strides computed from them, the table's
    rows the view's -1); a new size reuses the graph, results equal eager."""
    c = torch.compile(_pool, backend="pyfuser", dynamic=True)
    for n, m in ((5, 7), (6, 9)):
        gen = torch.Generator().manual_seed(n)
        x = torch.randn(n, m, 4, generator=gen)
        a = torch.arange(n)
        b = torch.randint(-m, m, (n,), generator=gen)
        with torch.no_grad():
            assert torch.equal(c(x, a, b), _pool(x, a, b))
    graphs = compiled_graphs()
    assert INDEX in _fused(graphs)


def test_symbolic_table_sizes(plans):
    """dynamic=True: the lookup fuses at a symbolic first extent (the wrap adds it as a size),
    and so does the gradient's index_put into zeros of that symbolic row count (the scatter
    kernel reads the count from its output); both sizes match eager, the second planning no
    kernel (its sizes keep the layout facts and the scatter kernel's size class)."""
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
        if n == 13:
            first = plans[0]
    assert plans[0] == first
    graphs = compiled_graphs()
    assert INDEX in _fused([g for g in graphs if g.kind == "forward"])
    assert INDEX_PUT in _fused([g for g in graphs if g.kind == "backward"])
    assert not [g.unsupported for g in graphs if g.unsupported]


def test_broadcast_values_keep_the_aten_call():
    """index_put_(accumulate) of values broadcast to the indexed rows: eager's."""
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


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_a_half_precision_index_put_adds_in_float32_and_rounds_once(dtype):
    """Regression (index fuzz seed 2055): x.index_put(idx, v, accumulate=True) of a
    half-precision table with repeated indices is x + the values, summed in float32 and
    rounded once (eager's CUDA kernel); the values' sum rounded before the add was up to 4
    ulps off where x and the sum nearly cancel."""
    def f(t, v, i0, i1):
        return (-t.expand(1, 1)).index_put((i0, i1), v, accumulate=True) + 1
    gen = torch.Generator().manual_seed(2055)
    i = torch.zeros(3, dtype=torch.int32)
    g = pyfuser.compile(f)
    for _ in range(20):
        t, v = torch.randn(1, 1, generator=gen).to(dtype), torch.randn(3, generator=gen).to(dtype)
        acc = -t.float()
        for x in v.float():                  # the values in index order, in float32
            acc = acc + x
        want = (acc.to(dtype).float() + 1).to(dtype)
        got = g(t, v, i, i)
        assert got.dtype == dtype and torch.equal(got, want), (t, v, got, want)
    assert INDEX_PUT in _fused(compiled_graphs())


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


def test_an_index_put_of_a_large_table_stays_eager(monkeypatch):
    """index_put into more rows than MAX_SCATTER_ROWS (the scatter kernel reads every index
    in every block; lowered to 8 here, for the interpreter's time): the aten call with the
    reason; a table at the limit fuses."""
    from pyfuser.frontend.lowering import aten_indexing
    monkeypatch.setattr(aten_indexing, "MAX_SCATTER_ROWS", 8)

    def f(x, i, v, rows):
        y = torch.zeros(rows, 2)
        y.index_put_((i,), v, accumulate=True)
        return y[:4] + x
    x, i, v = torch.randn(4, 2), torch.tensor([1, 1, 3]), torch.randn(3, 2)
    for rows, fused in ((8, True), (9, False)):
        torch._dynamo.reset()                # rows a constant again, not an automatic SymInt
        with torch.no_grad():
            got = pyfuser.compile(lambda x, i, v: f(x, i, v, rows))(x, i, v)
        torch.testing.assert_close(got, f(x, i, v, rows))
        graph = compiled_graphs()[-1]
        assert (INDEX_PUT in _fused([graph])) == fused, graph.unsupported
        assert fused or any("9 rows (more than 8)" in r for r in graph.unsupported.values()), \
            graph.unsupported


def _expanded_rows(t, i):              # the table's first axis a broadcast made real in-kernel
    return (t + 1).expand(4, 3)[i] * 2


def _expanded_columns(t, i, j):
    return (t + 1).expand(4, 3, 2)[i, j] * 2


@pytest.mark.parametrize("fn,args", [
    (_expanded_rows, (torch.randn(1, 3), torch.tensor([-1, 2, -4]))),
    (_expanded_columns, (torch.randn(4, 1, 2), torch.tensor([0, -1, 3]), torch.tensor([2, -3, 1])))],
    ids=["first-axis", "second-axis"])
def test_an_expanded_table_axis_wraps_and_checks_at_its_expanded_size(fn, args):
    """An axis that `expand` made of a broadcast has extent 1 and its size as the expanded
    extent: the wrap of negative indices and the flattened strides take the expanded size
    (fuzz seed 2067: `-4` wrapped by 1, an IndexError where eager reads row 0)."""
    want = fn(*args)
    with torch.no_grad():
        assert torch.equal(pyfuser.compile(fn)(*args), want)
    assert INDEX in _fused(compiled_graphs())
    traced = pyfuser.jit(torch.jit.trace(fn, args), cpu_executor="interpret")
    assert torch.equal(traced(*args), want)
    bad = list(args)
    bad[-1] = torch.tensor([0, 3, 1]) if fn is _expanded_columns else torch.tensor([0, -5, 1])
    with pytest.raises(IndexError):
        fn(*bad)
    with pytest.raises(IndexError):
        with torch.no_grad():
            pyfuser.compile(fn)(*bad)


def _put_into_empty(x, i, v):
    y = torch.zeros(x.shape)
    y.index_put_((i,), v, accumulate=True)
    return y + x


@pytest.mark.parametrize("form", ["lookup", "lookup-2", "index_put"])
def test_an_index_of_an_empty_axis_raises_as_eager(form):
    """Eager raises for an index with elements of an axis of size 0, though no element reads
    a row: the lookup's output of a (0, 0) table and the accumulation into a (0, 4) table have
    no elements, so no kernel checks an index (fuzz seed 7574: an empty result, silently).
    The lookup checks it on the host (ir/shapes.py), index_put of no rows stays eager's; an
    empty index is eager's empty result."""
    fn, x, i, v = {
        "lookup": (_pick_first, torch.randn(0, 0), torch.tensor([0]), None),
        "lookup-2": (_pool, torch.randn(3, 0, 0), torch.tensor([1]), torch.tensor([0])),
        "index_put": (_put_into_empty, torch.randn(0, 4), torch.tensor([0]), torch.randn(1, 4))}[form]
    args = (x, i) if v is None else (x, i, v)
    with pytest.raises(IndexError):
        fn(*args)
    with pytest.raises(IndexError):
        with torch.no_grad():
            pyfuser.compile(fn)(*args)
    empty = torch.zeros(0, dtype=torch.int64)
    args = (x, empty) if v is None else \
        (x, empty, empty) if form == "lookup-2" else (x, empty, v[:0])
    with torch.no_grad():
        got, want = pyfuser.compile(fn)(*args), fn(*args)
    assert got.shape == want.shape and torch.equal(got, want)
    if form != "index_put":
        assert INDEX in _fused(compiled_graphs())
