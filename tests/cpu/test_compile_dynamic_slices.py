"""Slices with SymInt bounds under dynamic=True: GPT-2's and Llama's packed-sequence mask slices
a `cat` to the sequence length (`[..., :seq]`, `[..., 1:seq + 1]`), which had been refused
("aten::slice end must be a constant int") and split the mask's region. The clamped bounds are
now scalar expressions of the Fusion with eager's semantics (lowering/slice_bounds.py:
negative bounds from the end, clamped into [0, size], end before start empty, None the end),
computed when the sizes are bound; a symbolic start is a shift the kernel reads as a
parameter. Stepped slices (`x[:, 1::2]`, a constant step) take the same bounds and read every
step-th element; a SymInt step stays eager. Checked on three sizes: one graph, no new kernel,
eager's values, shapes, dtypes."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import pyfuser
from pyfuser.frontend.fx import compiled_graphs

pytestmark = pytest.mark.usefixtures("fresh_compile")


def _slices(x, y):
    """Slices of a computed value (so they stay inside the region) with SymInt, negative,
    None and out-of-range bounds on an axis of symbolic size n."""
    n = x.shape[1]
    h = x * 2 + 1
    c = torch.cat([h, y], 1)
    return (h[:, :n - 1] + y[:, 1:],        # a SymInt end (the mask's `cat(...)[:, :seq]`)
            c[:, 1:n + 1] - c[:, :n],       # the mask's two slices of a cat
            h[:, 1:n + 5].sin(),            # an end past the size: clamped to n
            h[:, -3:].cos(),                # a negative start: a shift of n - 3
            h[:, n // 2:] * 3,              # a SymInt start
            h[:, -n - 5:-2] - 1,            # a start before 0 (clamped), a negative end
            h[:, 2 - n:n - 1] * y[:, 2:-1],  # a negative SymInt start
            h[:, n:] + 1,                   # empty at the end
            c[:, n - 2:n + 2] * 2)          # across the cat's boundary, a symbolic start


def test_symbolic_slice_bounds_follow_eager_on_every_size(plans):
    cf = pyfuser.compile(_slices, dynamic=True)
    seen = []
    for n in (6, 10, 14):
        gen = torch.Generator().manual_seed(n)
        x, y = torch.randn(3, n, generator=gen), torch.randn(3, n, generator=gen)
        with torch.no_grad():
            got, want = cf(x, y), _slices(x, y)
        for k, (g, w) in enumerate(zip(got, want)):
            assert g.dtype == w.dtype and g.shape == w.shape, (n, k, g.shape, w.shape)
            assert torch.equal(g, w), (n, k)
        seen.append((len(compiled_graphs()), plans[0]))
    assert seen[0][0] == 1 and seen[2] == seen[1] == seen[0]     # no recompile, no new kernel
    (graph,) = compiled_graphs()
    assert not [r for r in graph.unsupported.values() if "slice" in r], graph.unsupported
    assert all(r.eager_calls == 0 for r in graph.regions)       # no call fell back to eager
    ops = [op for r in graph.regions for op in r.ops]
    assert ops.count("aten.slice.Tensor") >= 13
    from compile_checks import assert_ran_as_sm90_kernels
    assert_ran_as_sm90_kernels(graph.regions)


def _empty_or_not(x):
    n = x.shape[1]
    return (x * 2)[:, 4:n - 6] + 1                  # end before start for n < 10: empty


def test_an_end_before_the_start_gives_an_empty_slice():
    """`x[:, 4:n - 6]` is empty while n < 10 (Dynamo guards on which side of 10 n is, so the
    sizes past it compile a second graph); the fused slice gives eager's shapes either way."""
    cf = pyfuser.compile(_empty_or_not, dynamic=True)
    for n in (6, 7, 9, 14, 18):
        x = torch.randn(3, n)
        got, want = cf(x), _empty_or_not(x)
        assert got.shape == want.shape and torch.equal(got, want), n
    graphs = compiled_graphs()
    assert len(graphs) == 2 and not any(g.unsupported for g in graphs)
    assert all(r.eager_calls == 0 for g in graphs for r in g.regions)


def _stepped(x):
    """Stepped slices of a computed value (in the region): an interleaved rotary's even and odd
    elements, SymInt, negative, open and past-the-end bounds, steps along two axes."""
    n = x.shape[1]
    h = x * 2 + 1
    return (h[:, 1:n - 1:2] + 1,                   # a SymInt end
            h[:, ::2] * 3 - h[:, 1::2],           # rotate_every_two's halves
            h[:, ::3].sin(),                      # ceil(n / 3) elements
            h[:, n // 2::2] * 2,                  # a SymInt start: a shift the kernel reads
            h[:, -5::2].cos(),                    # a negative start: the constant extent 3
            h[:, 2:n + 5:3] - 1,                  # an end past the size: clamped to n
            h[::2, 1::3] * h[::2, ::3][:, :1],    # steps along both axes
            h[:, n::2] + 1)                       # empty at the end


def test_stepped_slices_fuse_and_follow_eager_on_every_size(plans):
    """A slice with a step other than 1 (`x[:, 1::2]`, forward `aten.slice.Tensor` with step
    > 1) had stayed an aten call; it is a SliceOp with that step, the kernel reading its input
    at start + step * index. One graph and no new kernel over three sizes, eager's values bit
    for bit, shapes, strides and dtypes, no call run eagerly, kernels compiled for sm_90."""
    cf = pyfuser.compile(_stepped, dynamic=True)
    seen = []
    for n in (6, 10, 14):
        x = torch.randn(3, n, generator=torch.Generator().manual_seed(n))
        with torch.no_grad():
            got, want = cf(x), _stepped(x)
        for k, (g, w) in enumerate(zip(got, want)):
            assert g.dtype == w.dtype and g.shape == w.shape and g.stride() == w.stride(), (n, k)
            assert torch.equal(g, w), (n, k)
        seen.append((len(compiled_graphs()), plans[0]))
    assert seen[0][0] == 1 and seen[2] == seen[1] == seen[0]     # no recompile, no new kernel
    (graph,) = compiled_graphs()
    assert not [r for r in graph.unsupported.values() if "slice" in r], graph.unsupported
    assert all(r.eager_calls == 0 for r in graph.regions)
    ops = [op for r in graph.regions for op in r.ops]
    assert ops.count("aten.slice.Tensor") >= 10
    from compile_checks import assert_ran_as_sm90_kernels
    assert_ran_as_sm90_kernels(graph.regions)


def test_stepped_slices_fuse_with_static_sizes():
    """The same slices with static sizes: constant bounds and extents, eager's values."""
    x = torch.randn(5, 12)
    with torch.no_grad():
        got, want = pyfuser.compile(_stepped)(x), _stepped(x)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.stride() == w.stride() and torch.equal(g, w)
    (graph,) = compiled_graphs()
    assert not graph.unsupported and all(r.eager_calls == 0 for r in graph.regions)


def _symbolic_step(x):
    return (x * 2)[:, ::x.shape[0]] + 1


def test_a_symbolic_step_stays_an_aten_call():
    """A step that is a SymInt (`x[:, ::x.shape[0]]` under dynamic=True) is not fused: the
    slice is left to eager with its reason, and the results are eager's."""
    assert_left_to_eager(_symbolic_step, "aten::slice with a symbolic step")


def assert_left_to_eager(fn, reason: str) -> None:
    """fn of a [3, n] input under dynamic=True gives eager's results on three sizes with one
    graph, which leaves an op unfused for a reason containing `reason`."""
    cf = pyfuser.compile(fn, dynamic=True)
    for n in (6, 10, 14):
        x = torch.randn(3, n)
        got, want = cf(x), fn(x)
        assert got.shape == want.shape and torch.equal(got, want)
    (graph,) = compiled_graphs()
    assert any(reason in r for r in graph.unsupported.values()), graph.unsupported


def _negative_selects(x):
    h = x * 2 + 1                                     # selects of a computed value: in-region
    return h[:, -1].sin(), h[:, -3] * h[:, 0], (h[:, -2] - 1).unsqueeze(1) * h


def test_negative_selects_on_a_symbolic_axis_fuse_and_follow_eager(plans):
    """`h[:, -1]`, `h[:, -3]` on an axis of symbolic size n: one-wide slices from n + index
    (had been refused: "a negative index on an axis of symbolic size"); one graph, no new
    kernel over three sizes, eager's values and shapes, no eager call."""
    cf = pyfuser.compile(_negative_selects, dynamic=True)
    seen = []
    for n in (5, 9, 13):
        x = torch.randn(3, n, 4)
        with torch.no_grad():
            got, want = cf(x), _negative_selects(x)
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and g.shape == w.shape and g.stride() == w.stride()
            assert torch.equal(g, w), n
        seen.append((len(compiled_graphs()), plans[0]))
    assert seen[0][0] == 1 and seen[2] == seen[1] == seen[0]
    (graph,) = compiled_graphs()
    assert not [r for r in graph.unsupported.values() if "select" in r], graph.unsupported
    assert all(r.eager_calls == 0 for r in graph.regions)
    assert sum(r.ops.count("aten.select.int") for r in graph.regions) == 4
    from compile_checks import assert_ran_as_sm90_kernels
    assert_ran_as_sm90_kernels(graph.regions)


def _select_minus_three(x):
    return (x * 2)[:, -3] + 1


def test_a_negative_select_past_a_short_axis_raises_as_eager():
    """On an axis shorter than the index the bound start is negative: the region runs eagerly
    for that call, which raises eager's IndexError; longer axes stay fused."""
    cf = pyfuser.compile(_select_minus_three, dynamic=True)
    for n in (4, 7):
        x = torch.randn(2, n)
        torch.testing.assert_close(cf(x), _select_minus_three(x), rtol=0, atol=0)
    with pytest.raises(IndexError):
        _select_minus_three(torch.randn(2, 2))
    with pytest.raises(IndexError):
        cf(torch.randn(2, 2))
    (graph,) = compiled_graphs()
    assert sum(r.ops.count("aten.select.int") for r in graph.regions) == 1


def _negative_pads(x):
    """constant_pad_nd with negative sides on axes of symbolic size (a crop), alone or with a
    positive side, on one axis or two."""
    h = x * 2
    return (F.pad(h, (-1, -2)) + 1,
            F.pad(h, (-2, 3), value=0.5).exp(),
            F.pad(h, (1, -3, -1, 0)).sin(),
            F.pad(h, (0, -1)) * h[:, 1:])


def test_negative_pads_on_symbolic_axes_fuse(plans):
    """A negative pad on an axis of symbolic size had stayed an aten call ("axis 1 of the input
    has no constant size"); it is the slice [-lo, n + hi) with the end a scalar the host
    computes (then a pad of the positive sides). One graph and no new kernel over three sizes,
    eager's values bit for bit, shapes and strides, no eager call, kernels for sm_90."""
    cf = pyfuser.compile(_negative_pads, dynamic=True)
    seen = []
    for n in (6, 10, 14):
        x = torch.randn(5, n, generator=torch.Generator().manual_seed(n))
        with torch.no_grad():
            got, want = cf(x), _negative_pads(x)
        for k, (g, w) in enumerate(zip(got, want)):
            assert g.dtype == w.dtype and g.shape == w.shape and g.stride() == w.stride(), (n, k)
            assert torch.equal(g, w), (n, k)
        seen.append((len(compiled_graphs()), plans[0]))
    assert seen[0][0] == 1 and seen[2] == seen[1] == seen[0]
    (graph,) = compiled_graphs()
    assert not graph.unsupported, graph.unsupported
    assert sum(r.ops.count("aten.constant_pad_nd.default") for r in graph.regions) == 4
    assert all(r.eager_calls == 0 for r in graph.regions)
    from compile_checks import assert_ran_as_sm90_kernels
    assert_ran_as_sm90_kernels(graph.regions)


def test_a_negative_pad_past_a_short_axis_does_not_fit_when_bound():
    """On a Fusion alone (Dynamo guards the sizes itself and raises eager's error when tracing a
    size that is too short): the crop's end n + hi before its start fails the binding check, so
    a region would run eagerly, which raises as eager does."""
    from pyfuser.errors import ExecuteError
    from pyfuser.frontend.lowering.aten_resize import _constant_pad_nd
    from pyfuser.ir import builder as B
    from pyfuser.ir.dtypes import DataType
    from pyfuser.ir.fusion import Fusion
    from pyfuser.runtime import dispatch
    f = Fusion()
    with f:
        f.add_output(_constant_pad_nd(B.define_tensor([-1, -1], DataType.Float), [-2, -2], 0))
    x = torch.randn(2, 7)
    (got,) = dispatch.execute_fusion(f, [x], "interpret")
    assert torch.equal(got, F.pad(x, (-2, -2)))
    with pytest.raises(RuntimeError):
        F.pad(torch.randn(2, 3), (-2, -2))
    with pytest.raises(ExecuteError, match="does not fit"):
        dispatch.execute_fusion(f, [torch.randn(2, 3)], "interpret")


_STEPPED_VIEWS = [lambda x: (x * 2 + 1)[:, ::2].reshape(-1),
                  lambda x: (x * 2 + 1)[:, 1::2].reshape(-1) + 1,
                  lambda x: (x * 2)[:, :-1:2].reshape(-1),
                  lambda x: (x * 2)[::2, :].reshape(-1) * 3,
                  lambda x: (x + 1)[:, ::3].reshape(x.shape[0], -1).sum(-1),
                  lambda x: (x * 2).reshape(-1, 4)[:, ::2].reshape(-1)]


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("k", range(len(_STEPPED_VIEWS)))
def test_views_of_stepped_slices_read_the_stepped_elements(k, dynamic):
    """A reshape of a stepped slice (from 0 too) reads every step-th element of each row, never
    the slice's input as if it were contiguous: the stepped index entry keeps the view's
    entries from passing through (pointwise_graph: `stepped` beside `_sliced`, two fixes of one
    session that met in a merge); eager's values and shapes at three sizes."""
    fn = _STEPPED_VIEWS[k]
    cf = pyfuser.compile(fn, dynamic=dynamic)
    for shape in ((6, 8), (4, 12), (10, 16)):
        x = torch.randn(*shape)
        got, want = cf(x), fn(x)
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)   # (a sum: its order)


def _rolls(x):
    """Swin's shifted windows (a roll by -1 along two axes) and rolls by shifts past the size,
    negative, zero, along one axis, of a computed value (so they stay inside the region)."""
    h = x * 2 + 1
    return (torch.roll(h, (-1, -1), (1, 2)).sin(), torch.roll(h, 7, 1) * 3,
            torch.roll(h, (-9, 0), (2, 0)) - 1, torch.roll(h, 2, -1) + torch.roll(h, -2, -1))


@pytest.mark.parametrize("dynamic", [False, True])
def test_roll_fuses_as_slices_and_a_cat_on_every_size(dynamic):
    """aten::roll (Swin's shifted windows and, with the opposite shifts, their gradient) ran
    eagerly: no lowering. It is a cat of two slices per rolled axis, the cut a scalar of the
    axis' size under dynamic shapes: eager's values on three sizes (shifts past the size,
    negative, zero), one graph, and the gradient (rolls back) fused too."""
    cf = pyfuser.compile(_rolls, dynamic=dynamic)
    for n in (4, 5, 9):
        gen = torch.Generator().manual_seed(n)
        x = torch.randn(2, n, n + 1, 3, generator=gen)
        xs, xr = x.clone().requires_grad_(), x.clone().requires_grad_()
        got, want = cf(xs), _rolls(xr)
        for k, (g, w) in enumerate(zip(got, want)):
            assert g.shape == w.shape and torch.equal(g, w), (n, k)
        weights = [torch.randn(w.shape, generator=gen) for w in want]
        for outs in (got, want):
            sum((o * w).sum() for o, w in zip(outs, weights)).backward()
        torch.testing.assert_close(xs.grad, xr.grad)
    graphs = compiled_graphs()
    assert not [n for g in graphs for n in g.unsupported if n.startswith("roll")], \
        [g.unsupported for g in graphs]
    assert any("aten.roll.default" in r.ops for g in graphs if g.kind == "forward"
               for r in g.regions)
    assert any("aten.roll.default" in r.ops for g in graphs if g.kind == "backward"
               for r in g.regions)
    if dynamic:
        assert len([g for g in graphs if g.kind == "forward"]) <= 2   # static first, then one
    assert all(r.eager_calls == 0 for g in graphs for r in g.regions)
