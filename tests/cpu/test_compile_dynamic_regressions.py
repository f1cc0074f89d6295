"""What the dynamic-shape fuzz campaign (tests/cpu/fx_fuzz_dynamic.py, docs/fuzzing.md) found in
the torch.compile backend, one minimal program each: wrong results, graphs whose regions ran
eagerly on every call (right values, no kernel) and nodes left unfused. Checked on the CPU
(kernels through the interpreter) at several sizes against eager."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import pyfuser
from pyfuser.frontend.fx import compiled_graphs

pytestmark = pytest.mark.usefixtures("fresh_compile")


def _calls(f, dynamic, shapes, grad=False):
    """f compiled once, called at each shape (x of that shape, values 0.5 * arange); every
    output equal to eager's (values, shape, dtype). Returns the regions of every graph."""
    cf = torch.compile(f, backend=pyfuser.backend, dynamic=dynamic)
    for shape in shapes:
        x = (torch.arange(torch.Size(shape).numel(), dtype=torch.float32).reshape(shape) * 0.5
             ).sin().requires_grad_(grad)
        y = x.detach().clone().requires_grad_(grad)
        got, want = cf(x), f(y)
        assert got.shape == want.shape and got.dtype == want.dtype, (shape, got.shape)
        torch.testing.assert_close(got, want, msg=f"shape {shape}")
        if grad:
            got.sum().backward()
            want.sum().backward()
            torch.testing.assert_close(x.grad, y.grad, msg=f"grad, shape {shape}")
    return [r for g in compiled_graphs() for r in g.regions]


# ---- wrong results ---------------------------------------------------------------------------

@pytest.mark.parametrize("dynamic", [False, True])
def test_a_slice_one_element_wide_on_one_call_keeps_its_kernel_to_itself(dynamic):
    """`(x * 2)[:, 2:] + 1` of n = 3 has one column; the kernel planned for it (the column's
    store a broadcast) served n = 5 and 7 (the same input facts: odd, not 1) through the region
    the recompile shares, and wrote one column of three. The kernel signature now holds, per
    axis of a slice's, pad's or cat's output, whether it is 0, 1 or the input's extent
    (schedule/layout.py `resize_extent_facts`)."""
    _calls(lambda x: (x * 2)[:, 2:] + 1, dynamic, [(3, 3), (3, 5), (3, 7)])


def test_a_slice_of_the_whole_axis_on_one_call_keeps_its_kernel_to_itself():
    """The same at the Fusion level: `x[:, :m]` with m == n reads whole rows (the axes
    collapse); that kernel served m < n (same input facts) and read the wrong elements."""
    from pyfuser.frontend.lowering.slice_bounds import clamped
    from pyfuser.ir import builder as B
    from pyfuser.ir.dtypes import DataType
    from pyfuser.ir.fusion import Fusion
    from pyfuser.runtime.executor import FusionExecutor
    fusion = Fusion()
    with fusion:
        x = B.define_tensor([-1, -1], DataType.Float)
        fusion.add_input(x)
        m = B.symbolic_scalar(DataType.Int)
        fusion.add_input(m)
        y = B.elementwise("mul", x, 2.0)
        start, end = clamped(y.logical[1].full_extent, 0, m)
        fusion.add_output(B.elementwise("add", B.slice_axis(y, 1, start, end), 1.0))
    ex = FusionExecutor(fusion, mode="interpret")
    for n, cut in ((7, 7), (9, 7), (7, 5), (9, 5)):
        x = torch.randn(3, n)
        torch.testing.assert_close(ex.run([x, cut])[0], (x * 2)[:, :cut] + 1)


def test_an_expand_of_an_axis_one_element_long_at_run_time():
    """Fuzz seed 910160 (grad, mark_dynamic): the backward of `x.half().sum(-1, keepdim=True)`
    with an empty slice of the sum (`v[:, 2:]`, tanh) expands `pad(grad[:, 2:]) + grad`, of
    size [1, 1], to [1, n]; that axis' extent was the pad's (0 + 1, a symbol bound at run time)
    and the expand's symbolic size was taken as the axis' own: the gradient came back [1, 1]
    (autograd: 'invalid gradient'). Such an expand is now left to eager
    (aten_shape._refuse_expanding_maybe_one)."""
    def f(x):
        v = x.half().sum(-1, keepdim=True).float()
        return v + torch.tanh(v[:, 2:]).sum()
    _calls(f, True, [(1, 33), (1, 16), (1, 11)], grad=True)

    def g(y):                                       # the same in a forward
        return F.pad(y[:, :0] * 3, [0, 1]).expand(1, y.shape[1]) * 2
    _calls(g, True, [(1, 33), (1, 16)])


@pytest.mark.parametrize("dynamic", [False, True])
def test_a_view_of_a_slice_from_the_start_reads_the_sliced_rows(dynamic):
    """Found by a probe of slices, pads and cats across sizes beside the campaign:
    `(x * 2 + 1)[:, :-1].reshape(-1)` (static shapes) read x's first elements as if the slice
    were x itself, contiguous: a wrong result. A slice from 0 passed a view's index entries
    through unchanged, and a load keyed by them alone is read as laid out like the view's
    input (schedule/pointwise_access._linear_view), whose rows are shorter than x's. Such an
    entry is now a shift by 0 through a slice (schedule/pointwise_graph._sliced). The same
    kernel served the view `_ones_as_broadcasts` puts after `F.pad(x, [0, -1])` of n = 2."""
    _calls(lambda x: (x * 2 + 1)[:, :-1].reshape(-1) * 1.5, dynamic, [(4, 5), (4, 3)])
    _calls(lambda x: F.pad(x * 2 + 1, [0, -1]) * 1.5, dynamic, [(3, 4), (3, 2)])


def test_a_view_of_an_empty_tensor_in_a_kernel_divides_by_no_zero():
    """Fuzz seed 913463 (grad, n = 2): the backward pads the empty gradients of `v1[:, :n - 1]`
    (v1 a [1, 1] max) and of a slice of that; the pads' results, traced [1, 1], became broadcast
    axes through views (`_ones_as_broadcasts`), one of them a view of an empty tensor, whose
    re-linearised index divided by its extent 0 in another operand's bounds check: the
    interpreter raised ZeroDivisionError (a GPU divides into garbage). A view's index divides by
    max(extent, 1) now (codegen/lowering.py `_at_least_one`)."""
    def f(x):
        v1 = torch.amax(x, (-2, 1), keepdim=True)
        v3 = torch.sigmoid(v1[:, :v1.shape[1] - 1])
        return torch.clamp(torch.tanh(v3[:v3.shape[-2] - 1]), -2, 3.5).sum() + \
            v3[:, v3.shape[1] // 2:].sum()
    _calls(f, True, [(2, 2), (3, 3), (17, 17)], grad=True)


def test_a_reduction_the_backward_needs_is_saved_not_recomputed():
    """Fuzz seed 916246 (grad, dynamic=True, traced at n = 3): the min-cut partitioner bans
    recomputing a reduction only when its output is 4x smaller than its input at the traced
    sizes, so the backward recomputed `x.pow(2).mean(-1)` (3 -> 1) in its own kernel; at n = 24
    that kernel summed in another order than the forward's, the recomputed `x * rsqrt(mean)`
    was an ulp off the saved amax, amax's backward `eq` mask matched no element of the row and
    the gradient was 0 / 0 = NaN. Float reductions are saved now (backend._save_reductions)."""
    def f(x):
        v = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        return v.amax(1), (x - x.amax(1, keepdim=True)).abs()
    torch.manual_seed(0)
    cf = torch.compile(f, backend=pyfuser.backend, dynamic=True)
    for n in (3, 24, 64):
        x = torch.randn(n, n)
        a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
        sum(o.sum() for o in cf(a)).backward()
        sum(o.sum() for o in f(b)).backward()
        torch.testing.assert_close(a.grad, b.grad, msg=f"n = {n}")


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("base", ["input", "computed"])
def test_a_returned_view_of_a_view_a_region_reads_is_eagers_view(base, grad, dynamic):
    """FX dynamic seed 918100: `v = x.view(n, 1, n)[..., :-1]`, read by a mul and returned
    sliced again, `v[..., 1:]`: the region computed v (a slice of symbolic bounds) as a copy and
    the returned slice was a view of that copy, whose strides (n - 1, n - 1, 1) and offset
    AOTAutograd, which rebuilds an output aliasing an input from the input and the returned
    view (it replays no view ops of symbolic sizes), applied to x: other values. The same of a
    computed base (`x.exp()`) returned beside it gave other values in grad mode, and without
    grad a copy in other strides that aliased nothing. The views a returned view is a view of
    now stay out of regions, and the mul reads a copy of them (fx/support.py
    `returned_views`): one region still."""
    def f(x):
        b = x if base == "input" else x.exp()
        v = b.reshape(*x.shape[:-1], 1, x.shape[-1])[..., :-1]
        return v * 2, v[..., 1:], b

    cf = torch.compile(f, backend=pyfuser.backend, dynamic=dynamic)
    for n in (7, 5, 9):
        x = torch.arange(n * n, dtype=torch.float32).reshape(n, n).div(n * n).requires_grad_(grad)
        y = x.detach().clone().requires_grad_(grad)
        got, want = cf(x), f(y)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, msg=f"n = {n}")
        assert got[1].stride()[::2] == want[1].stride()[::2]    # (axis 1 has size 1)
        assert got[1].untyped_storage().data_ptr() == got[2].untyped_storage().data_ptr()
        if not dynamic:
            break                                 # a recompile per size: one is enough
    fwd = [g for g in compiled_graphs() if g.kind != "backward"]
    assert sum(len(g.regions) for g in fwd) == 1


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_an_output_beside_a_reduction_of_no_rows_is_written(dynamic):
    """FX dynamic seed 918735 (--more-ops): `v = x * 2` of a [1, n] x returned beside
    `v[1:].sum(-1)` (no rows: the slice of a broadcast axis is empty): the reduction kernel
    iterates over the sum's rows and stored v in none of them, so v came back as whatever its
    memory held (also a softmax, a std). The reduction schedulers now refuse a fusion whose
    reduction has no rows while an output has elements (schedule/reduction.py
    `rows_cover_outputs`), and the segment is cut: a pointwise kernel writes v."""
    def f(x):
        v = x * 2
        return v[1:].sum(-1), torch.softmax(v[1:], -1), torch.std(v[1:] + 1, -1), v

    cf = torch.compile(f, backend=pyfuser.backend, dynamic=dynamic)
    for m in (1, 3, 1, 4):
        x = torch.randn(m, 13)
        got, want = cf(x), f(x)
        for g, w in zip(got, want):
            assert g.shape == w.shape
            torch.testing.assert_close(g, w, equal_nan=True, msg=f"m = {m}")
    assert not any(r.eager_calls for g in compiled_graphs() for r in g.regions)


# ---- regions that ran eagerly on every call --------------------------------------------------

def _fused_every_call(regions):
    assert regions and all(r.eager_calls == 0 for r in regions), \
        [(r.__name__, r._logged) for r in regions]


def test_a_constant_bound_outside_the_traced_size_fuses():
    """Fuzz seed 68 (a trial run): `v[2:n + 3]` of n = 3 made Dynamo trace `slice(v, 0, 2, 6)`
    with n guarded below 6; the constant end 6, checked against the size when bound, never fit,
    and the region ran eagerly on every call. A constant bound outside the traced size is now
    the clamped bound, a scalar of n (fx/lower.py `_bounds_past_size`), also a negative start
    before it (`x[:, -5:-4]` of 3)."""
    regions = _calls(lambda x: (x * 2)[:, 2:6] + 1, True, [(3, 4), (3, 5), (3, 3)])
    regions += _calls(lambda x: (x * 2)[:, -5:-4] * x[:, :1], True, [(3, 3), (3, 4)])
    _fused_every_call(regions)


@pytest.mark.parametrize("dynamic", [False, True])
def test_a_slice_of_the_last_elements_is_a_broadcast_axis(dynamic):
    """`x[:, -1:]` of a symbolic n had the extent n - (n - 1), a symbol bound to 1, which a
    binary op with an [N, n] operand could not broadcast ('operands of mul have sizes [1, 5]'):
    the region ran eagerly on every call, static shapes too (a region's sizes are symbolic).
    A negative constant start with an open or negative end has the constant extent -start
    (slice_bounds.constant_length, checked when bound): `x[:, -1:]` is a broadcast axis, as
    `x[:, 2:3]` is."""
    regions = _calls(lambda x: (x * 2)[:, -1:] * x, dynamic, [(3, 5), (3, 7)])
    regions += _calls(lambda x: (x * 2)[:, -3:-1].sum(1, keepdim=True) * x, dynamic,
                      [(3, 5), (3, 7)])
    _fused_every_call(regions)
    _calls(lambda x: (x * 2)[:, -3:] + 1, True, [(3, 5), (3, 2)])      # n < 3: eager's extent


def test_an_arange_of_one_element_broadcasts():
    """Fuzz seed 910296: `torch.arange(x1.shape[-1])` of a [1, 1] input, an iota of length 1,
    had a full axis of extent 1, which `minimum` with an [.., n] operand could not broadcast:
    the region ran eagerly on every call. An iota of one element is a broadcast axis, as a
    `full` of one is (ir/builder.py `iota`)."""
    regions = _calls(lambda x: torch.minimum(x * 2, torch.arange(1) + 0.5), True,
                     [(3, 5), (3, 7)])
    regions += _calls(lambda x: x * 2 + torch.arange(3, 4), False, [(3, 5)])
    _fused_every_call(regions)


def test_a_view_whose_minus_one_is_one_broadcasts():
    """Fuzz seed 912022: `x.reshape(x.shape[0], -1).expand(-1, 2)` of an [n, 1] x: the -1 was
    an extent inferred when the sizes are bound, 1, which the expand could not broadcast ('the
    fusion holds it as a full axis'): the region ran eagerly on every call. A -1 whose traced
    size is the constant 1 is lowered as 1, a broadcast axis (fx/lower.py
    `_minus_ones_traced_as_one`)."""
    regions = _calls(lambda x: x.reshape(x.shape[0], -1).expand(-1, 2).contiguous(), True,
                     [(24, 1), (17, 1)])
    regions += _calls(lambda x: (x * 2).sum(1, keepdim=True).reshape(x.shape[0], -1) * x, True,
                      [(5, 3), (7, 4)])
    _fused_every_call(regions)


@pytest.mark.parametrize("dynamic", [False, True])
def test_a_computed_size_traced_as_one_broadcasts(dynamic):
    """Fuzz seed 913008 (grad, static replay): the backward of `v = x.flatten().half().sum(-1,
    keepdim=True).float()` returned with `v[..., 1:-1]` (empty) expands `grad + pad(g[:0], [1,
    0])`, of size [1], to [n]; the pad's extent was 0 + 1, computed from an input extent the
    Fusion keeps symbolic (regions of other sizes share it), a full axis bound to 1 that the
    expand could not broadcast: the region ran eagerly on every call. So did `x[:, 2:] * x` of a
    static [4, 3] x and a pad of an empty slice added to x. An axis the trace holds as the
    constant 1 is now a broadcast axis (fx/lower.py `_ones_as_broadcasts`, a view checked when
    the sizes are bound)."""
    def f(x):
        v = x.flatten(0, 1).half().sum(-1, keepdim=True).float()
        return v + (v[..., 1:-1] * 2).sum()
    regions = _calls(f, dynamic, [(9, 5), (9, 12)], grad=True)
    regions += _calls(lambda x: (x * 2)[:, 2:] * x, False, [(4, 3), (5, 3)])
    regions += _calls(lambda x: F.pad((x * 2)[:, :0], [0, 1]) + x, dynamic, [(4, 3), (5, 6)])
    _fused_every_call(regions)


def test_a_view_of_no_elements_to_a_symbolic_size_fuses():
    """Fuzz seed 913203 (grad): the backward of `x[..., n:].reshape(-1)` views the empty
    gradient as [1, s1, 0]; the one symbolic entry became -1, which no count of elements
    resolves ('view of a tensor of shape [0] as [1, -1, 0] is invalid'): the region ran eagerly
    on every call. A size list with a 0 keeps its symbol (fx/lower.py
    `_one_symbolic_as_minus_one`)."""
    regions = _calls(lambda x: x[..., x.shape[2]:].reshape(-1).exp(), True,
                     [(1, 6, 12), (1, 2, 8), (1, 3, 5)], grad=True)
    _fused_every_call(regions)



def test_the_gradient_of_a_slice_ending_past_the_size_fuses():
    """Fuzz seed 913640 (grad): `cat([-x[12:], x[:12]])` of n = 24, then 3 and 5 (Dynamo
    recompiles for n < 12): the recompiled backward's `slice_backward(g, [n], 0, 0, 12)` padded
    n - 12 after the gradient, negative, and its region ran eagerly on every call. A constant
    bound of slice_backward outside the traced size is the clamped bound now, as a forward
    slice's (fx/lower.py `_bounds_past_size`)."""
    regions = _calls(lambda x: torch.cat([-x[:, 12:], x[:, :12]], 1) * 2, True,
                     [(2, 24), (2, 3), (2, 5)], grad=True)
    _fused_every_call(regions)

# ---- nodes left unfused ----------------------------------------------------------------------

@pytest.mark.parametrize("dynamic", [False, True])
def test_a_negative_pad_of_a_symbolic_axis_fuses(dynamic):
    """A negative pad (a cut) needed the axis' constant size ('aten::constant_pad_nd: axis 0 of
    the input has no constant size', 14 nodes in the campaign's runs), which a region's Fusion,
    static graphs' too, does not have: the cut is now a slice whose end is a scalar of the size
    (aten_resize._pad), checked when the sizes are bound."""
    def f(x):
        return F.pad(x * 2, [-1, 2, 1, -2]) + 1, F.pad(x + 1, [-2, 0]).sum(-1)
    cf = torch.compile(f, backend=pyfuser.backend, dynamic=dynamic)
    for shape in [(4, 5), (6, 3), (3, 7)]:
        x = torch.randn(shape)
        for got, want in zip(cf(x), f(x)):
            torch.testing.assert_close(got, want)
    graphs = compiled_graphs()
    assert graphs and all(not g.report()["unfused"] for g in graphs), \
        [g.report()["unfused"] for g in graphs]
    _fused_every_call([r for g in graphs for r in g.regions])


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int32, torch.int64])
def test_rounding_an_integer_tensor_fuses(dtype):
    """`floor` / `ceil` / `round` / `trunc` of an integer tensor (eager: a copy of it) were
    refused by the op table ('floor: does not take Int operands', 12 nodes in the campaign's
    runs, static and dynamic); they lower as the copy now (aten_pointwise._rounding)."""
    def f(x):
        y = (x * 3).to(dtype)
        return torch.floor(y) + 1, torch.ceil(y) * 2, torch.round(y), torch.trunc(y) - 1
    cf = torch.compile(f, backend=pyfuser.backend, dynamic=False)
    x = torch.randn(4, 5)
    for got, want in zip(cf(x), f(x)):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want)
    assert all(not g.report()["unfused"] for g in compiled_graphs())


# ---- recompiles ------------------------------------------------------------------------------

def test_a_shape_check_of_a_rewrite_adds_no_guard():
    """Fuzz seed 916279 (mark_dynamic): `hoist_views_past_binary` compared an operand's shape
    (n1,) with the op's (n0, n1) as tuples, which evaluates n1 == n0 and installed the guard
    n1 != n0: a call with equal sizes recompiled (aot_eager compiles once). Shapes are compared
    without a guard now (meta.same_shape: equal only where provably so)."""
    frames = [0]

    def counting(gm, example_inputs):
        frames[0] += 1
        return pyfuser.backend(gm, example_inputs)

    def f(x):
        return (x * torch.arange(x.shape[-1])).reshape(-1)
    cf = torch.compile(f, backend=counting)
    for shape in ((3, 5), (4, 6), (2, 2)):
        x = torch.randn(shape)
        torch._dynamo.mark_dynamic(x, 0)
        torch._dynamo.mark_dynamic(x, 1)
        torch.testing.assert_close(cf(x), f(x))
    assert frames[0] == 1
