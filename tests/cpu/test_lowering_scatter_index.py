"""`aten::scatter_add` and `aten::scatter.value` (lowering/aten_scatter_index.py): the scatter
kernel's sums at the row-major positions the index names, through torch.compile on the CPU
interpreter (kernels compiled with NVRTC for sm_90 first): eager's values, dtype and shape on
either axis, repeated positions, an index smaller than x off `dim`, a gather's gradient, half
precision summed in float32 and rounded once, symbolic sizes (dynamic=True: one kernel for two
sizes), an index outside the axis stopping the kernel as eager raises, and `scatter.src` left
to eager with its reason."""
from __future__ import annotations

import pytest
import torch

import pyfuser
from pyfuser.frontend.fx import compiled_graphs

from compile_checks import assert_ran_as_sm90_kernels

pytestmark = pytest.mark.usefixtures("fresh_compile")
IDX = torch.tensor([[0, 4], [1, 1], [3, 0], [2, 2], [4, 4], [0, 1]])

CASES = {
    "add along 1": lambda x, i, s: (x * 2).scatter_add(1, i, s),
    "add along 0": lambda x, i, s: torch.zeros(5, 2).scatter_add(0, i % 5, s) + 1,
    "add, index smaller than x": lambda x, i, s: x.scatter_add(1, i[:4], s[:4]),
    "value": lambda x, i, s: torch.zeros_like(x).scatter(1, i, 1.0) * x,
    "value into bool": lambda x, i, s: torch.zeros(6, 5, dtype=torch.bool).scatter(1, i, True)
    | (x > 1),
    "value, index smaller than x": lambda x, i, s: x.scatter(1, i[:3, :1], -1.0),
    "value into int": lambda x, i, s: (x * 4).int().scatter(0, i % 5, 7),
}


def _inputs():
    g = torch.Generator().manual_seed(0)
    return torch.randn(6, 5, generator=g), IDX.clone(), torch.randn(6, 2, generator=g)


def _fused(op):
    regions = [r for g in compiled_graphs() for r in g.regions]
    assert any(o.startswith(f"aten.{op}") for r in regions for o in r.ops), \
        [r.ops for r in regions]
    assert not [g.unsupported for g in compiled_graphs() if g.unsupported]
    assert_ran_as_sm90_kernels(regions)


@pytest.mark.parametrize("case", list(CASES))
def test_scatters_are_eagers(case):
    f = CASES[case]
    x, i, s = _inputs()
    torch._dynamo.reset()
    got, want = pyfuser.compile(f)(x, i, s), f(x, i, s)
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    _fused("scatter_add" if "add" in case else "scatter.value")


def test_a_gathers_gradient_fuses():
    x, i, _ = _inputs()

    def f(w):
        return (w.gather(1, i) ** 2).sum()
    w = x.clone().requires_grad_()
    torch._dynamo.reset()
    pyfuser.compile(f)(w).backward()
    got = w.grad.clone()
    w.grad = None
    f(w).backward()
    torch.testing.assert_close(got, w.grad, rtol=1e-6, atol=1e-6)
    _fused("scatter_add")


def test_bfloat16_sums_round_once():
    """Three values at one position: their float32 sum plus x, rounded to bfloat16 once."""
    x = torch.tensor([[1.0, 2.0]], dtype=torch.bfloat16)
    i = torch.tensor([[1, 1, 1]])
    s = torch.tensor([[1 / 256, 1 / 256, 1 / 256]], dtype=torch.bfloat16)
    torch._dynamo.reset()
    got = pyfuser.compile(lambda x, i, s: x.scatter_add(1, i, s) * 1)(x, i, s)
    want = (x.float().scatter_add(1, i, s.float())).to(torch.bfloat16)
    assert got.dtype == torch.bfloat16 and torch.equal(got, want)
    _fused("scatter_add")


def test_symbolic_sizes_reuse_the_kernel(plans):
    """dynamic=True: a second size plans no kernel (its sizes keep the layout facts)."""
    f = pyfuser.compile(lambda x, i, s: x.scatter_add(1, i, s) + x.scatter(1, i, 0.5),
                        dynamic=True)
    torch._dynamo.reset()
    seen = []
    for rows, cols in ((6, 5), (10, 9)):
        x = torch.randn(rows, cols)
        # fewer rows than x (the others untouched); sizes of the same layout facts
        i = torch.randint(0, cols, (rows - 3, 2))
        s = torch.randn(rows - 3, 2)
        want = x.scatter_add(1, i, s) + x.scatter(1, i, 0.5)
        torch.testing.assert_close(f(x, i, s), want, rtol=1e-6, atol=1e-6)
        seen.append((len(compiled_graphs()), plans[0]))
    assert seen[0] == seen[1], seen
    _fused("scatter_add")


@pytest.mark.parametrize("bad", [-1, 5])
def test_an_index_outside_the_axis_raises(bad):
    x, i, s = _inputs()
    i[2, 1] = bad
    torch._dynamo.reset()
    with pytest.raises(IndexError, match="index out of range"):
        pyfuser.compile(CASES["add along 1"])(x, i, s)
    with pytest.raises(RuntimeError):
        CASES["add along 1"](x, i, s)


def test_scatter_src_stays_eager_with_the_reason():
    x, i, s = _inputs()
    f = lambda x, i, s: x.scatter(1, i, s) * 2             # noqa: E731
    torch._dynamo.reset()
    torch.testing.assert_close(pyfuser.compile(f)(x, i, s), f(x, i, s))
    why = {k: v for g in compiled_graphs() for k, v in g.unsupported.items()}
    assert any("scatter.src" in v for v in why.values()), why


def _scatter_ops():
    """(the regions' EmbeddingBackwardOps, the op lists of the kernel segments running one)."""
    from pyfuser.ir import exprs as E
    from pyfuser.runtime import dispatch
    regions = [r for g in compiled_graphs() for r in g.regions]
    ops = [e for r in regions for e in r.fusion.exprs if isinstance(e, E.EmbeddingBackwardOp)]
    runs = [sg.exprs for r in regions for sg in dispatch.last_report(r.fusion).segments
            if sg.scheduler == "embedding_backward"]
    return ops, runs


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_a_scatter_over_whole_rows_is_segmented(dim, monkeypatch):
    """A matrix: each row of the index writes one row of x (a segment), so the scatter kernel
    walks only its segments' tokens and no size limit applies: x of more than MAX_SCATTER_ROWS
    elements (lowered to 64 here, for the interpreter's time) fuses, along either axis
    (permuted so that `dim` is last, and back: eager's shape and strides); along the last
    axis the add is in the scatter kernel itself."""
    from pyfuser.frontend.lowering import aten_indexing, aten_scatter_index
    from pyfuser.schedule import embedding_backward as EB
    for m in (aten_indexing, aten_scatter_index, EB):
        monkeypatch.setattr(m, "MAX_SCATTER_ROWS", 64)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(26, 10, generator=g)
    shape = (3, 10) if dim == 0 else (26, 3)
    i = torch.randint(0, x.shape[dim], shape, generator=g)
    s = torch.randn(shape, generator=g)

    def f(x, i, s):
        return x.scatter_add(dim, i, s), torch.ones_like(x).scatter(dim, i, 0.0)
    torch._dynamo.reset()
    got, want = pyfuser.compile(f)(x, i, s), f(x, i, s)
    for a, b in zip(got, want):
        assert a.shape == b.shape and a.stride() == b.stride()
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    ops, runs = _scatter_ops()
    assert len(ops) == 2 and all(e.segment is not None for e in ops), ops
    if dim != 0:
        assert ["embedding_backward", "add"] in runs, runs   # x + the sums: one kernel
    _fused("scatter_add")


def test_segments_of_rank_3():
    """Rank 3: segmented where the index provably has x's extent on the inner axis of the
    others (an index computed from x in the graph: the same extents), not where it is an input
    of its own (a symbol for each input's extents: equal sizes in one call prove nothing, the
    Fusion being shared by recompiles for other sizes)."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(4, 5, 6, generator=g)
    s = torch.randn(4, 5, 6, generator=g)
    cases = {True: lambda x, s, i: x.scatter_add(2, (x * 10).long().abs() % 6, s),
             False: lambda x, s, i: x.scatter_add(2, i, s[:3, :, :2])}
    i = torch.randint(0, 6, (3, 5, 2), generator=g)
    for segmented, f in cases.items():
        torch._dynamo.reset()
        torch.testing.assert_close(pyfuser.compile(f)(x, s, i), f(x, s, i), rtol=1e-6,
                                   atol=1e-6)
        ops, _ = _scatter_ops()
        assert ops and (ops[-1].segment is not None) == segmented, (segmented, ops)
    _fused("scatter_add")
