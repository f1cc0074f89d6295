"""Programs that mutate their inputs, through pyfuser.compile, against eager: the outputs and
every input after each of two calls are eager's, whichever copy_ of a mutated input the
backend fuses (fx/mutations.py) and whichever it leaves to eager. The programs put reads of an
input before and after its mutation, in fused and unfused ops, mutate through views, return the
mutated input, and pass one tensor (or a view of it) as two arguments. Then which copy_ nodes
the kernels write (an accumulator's update, buffers a program copies into, a reduction region's
per-row and per-element updates) and which stay FX nodes, with their reasons."""
from __future__ import annotations

import copy

import pytest
import torch

import pyfuser
from pyfuser.frontend.fx import compiled_graphs

from compile_checks import assert_input_copies_fused

pytestmark = pytest.mark.usefixtures("fresh_compile")


def _graphs(kind):
    return [g for g in compiled_graphs() if g.kind == kind]


def _read_after(a, b):
    a.mul_(2)
    return a @ b.t(), a + 1                   # both read the new value


def _read_before_in_a_matmul(a, b):
    y = a @ b.t()                             # the old value, in an unfused op
    a.mul_(2)
    return y, a.sum()


def _twice(a, b):
    a.add_(b)
    a.mul_(0.5)
    return b * 3


def _through_a_row(a, b):
    a[1].add_(b[0])                           # a select_scatter of a
    return a * 2


def _through_a_transpose(a, b):
    a.t().mul_(2)
    return b - a


def _returns_the_input(a, b):
    a.add_(b.relu())
    return a, a.view(-1)


def _update_read_by_a_reduction(a, b):
    m = a.mean(1, keepdim=True)
    a.sub_(m)
    b.copy_(a.exp())
    return m


def _a_view_read_after_the_region(a, b):
    v = a.view(6, 4)                          # a reshape at the region's input end: a host
    y = v @ b                                 # view of a the region returns, read by the
    e = v.exp()                               # matmul (the old value), which runs after the
    a.mul_(2)                                 # region
    return y, e


# per program: (copy_ nodes fused, reasons of those left to eager)
READ_OUTSIDE = "copy_ into an input read outside its region"
VIEW_READ_OUTSIDE = "copy_ into an input a view of which is read outside its region"
NO_SOURCE = "copy_ whose source no fused region computes"
PROGRAMS = {_read_after: (1, []), _read_before_in_a_matmul: (0, [READ_OUTSIDE]),
            _twice: (1, []), _through_a_row: (0, [READ_OUTSIDE]),    # select_scatter fuses,
            # the select a[1] at its region's edge is FX's view of a; the view a.t(): FX's
            _through_a_transpose: (0, [READ_OUTSIDE]),
            _returns_the_input: (1, []), _update_read_by_a_reduction: (2, []),
            _a_view_read_after_the_region: (0, [VIEW_READ_OUTSIDE])}


def _inputs():
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(4, 6, generator=gen), torch.randn(4, 6, generator=gen)]


def _check(f, make, args_of=lambda ts: ts, copies=None):
    """Two calls of f through pyfuser.compile beside eager; `copies`: (copy_ nodes fused,
    sorted reasons of the copy_ nodes left to FX) over the compiled graphs."""
    ours, ref = make(), make()
    cf = pyfuser.compile(f)
    for _ in range(2):
        got, want = cf(*args_of(ours)), f(*args_of(ref))
        got = got if isinstance(got, tuple) else (got,)
        want = want if isinstance(want, tuple) else (want,)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w)
        for t, w in zip(ours, ref):
            torch.testing.assert_close(t, w)
    regions = [r for g in compiled_graphs() for r in g.regions]
    assert all(r.eager_calls == 0 for r in regions)
    if copies is not None:
        fused = sum(r.ops.count("aten.copy_.default") for r in regions)
        left = sorted(why for g in compiled_graphs() for why in g.unsupported.values()
                      if why.startswith("copy_"))
        assert (fused, left) == copies


@pytest.mark.parametrize("f", list(PROGRAMS), ids=lambda f: f.__name__.strip("_"))
def test_mutated_inputs_are_eagers(f):
    _check(f, _inputs, copies=PROGRAMS[f])


def test_one_tensor_passed_twice():
    """f(a, a): the mutation of x is seen through y (Dynamo passes the tensor once)."""
    def f(x, y):
        x.add_(1)
        return y * 2, x.sum()
    _check(f, lambda: _inputs()[:1], lambda ts: (ts[0], ts[0]), copies=(1, []))


def test_a_view_of_the_mutated_input_passed_beside_it():
    """f(a, a[0]): y is a view of x, which the program mutates; AOTAutograd passes their base
    (a synthetic base) and views it in the graph."""
    def f(x, y):
        x.mul_(3)
        return y + 1, x.relu()
    # the base's copy_ writes an as_strided_scatter of it, left to eager
    _check(f, lambda: _inputs()[:1], lambda ts: (ts[0], ts[0][0]), copies=(0, [NO_SOURCE]))


def test_in_place_updates_of_inputs_come_back():
    def f(x, acc):
        acc.mul_(0.9).add_(x.relu(), alpha=0.1)      # an in-place update of an input
        x2 = x.clone()
        x2[x2 < 0] = 0.0
        return acc * 2 + x2
    x, acc = torch.randn(7, 5), torch.randn(7, 5)
    acc_ref = acc.clone()
    got = pyfuser.compile(f)(x, acc)
    want = f(x, acc_ref)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(acc, acc_ref)
    (g,) = _graphs("inference")
    assert_input_copies_fused(g, 1)       # acc's update is written by the kernel computing it


def test_inference_graph_of_a_training_batch_norm_writes_its_buffers_in_its_kernels():
    """A train-mode batch norm under no_grad: AOTAutograd's inference graph mutates the running
    statistics and num_batches_tracked; its copy_ nodes fuse as in a training forward."""
    torch.manual_seed(0)
    bn = torch.nn.BatchNorm1d(5)
    ref = copy.deepcopy(bn)
    cbn = pyfuser.compile(bn)
    with torch.no_grad():
        for _ in range(2):
            x = torch.randn(8, 5, 3)
            torch.testing.assert_close(cbn(x), ref(x))
    for (name, got), (_, want) in zip(bn.named_buffers(), ref.named_buffers()):
        torch.testing.assert_close(got, want, msg=name)
    assert int(bn.num_batches_tracked) == 2
    (g,) = _graphs("inference")
    assert_input_copies_fused(g, 3)


def test_input_copies_of_reduction_regions_write_after_every_read():
    """`acc -= acc.mean(1)`: the region's kernel reads every element of acc's rows for the mean
    before any new value exists, and the new value is per element (not per row), so the
    reduction kernel writes a fresh tensor, copied into acc after it; `rm = 0.9 * rm + 0.1 *
    x.sum(0)` is per row (a running statistic's form), written by the kernel itself."""
    from pyfuser.runtime import dispatch

    def f(x, acc, rm):
        acc.sub_(acc.mean(1, keepdim=True))
        rm.mul_(0.9).add_(x.sum(0) * 0.1)
        return x * 2
    ins = [torch.randn(6, 5), torch.randn(6, 5), torch.randn(5)]
    ref = [t.clone() for t in ins]
    cf = pyfuser.compile(f)
    for _ in range(2):
        torch.testing.assert_close(cf(*ins), f(*ref))
        for a, b in zip(ins, ref):
            torch.testing.assert_close(a, b)
    (g,) = _graphs("inference")
    assert not g.unsupported
    copies = {r.ops[0]: dispatch.last_report(r.fusion).copies for r in g.regions
              if "aten.copy_.default" in r.ops}
    assert copies == {"aten.mean.dim": 1, "aten.mul.Tensor": 0}


def test_copies_into_buffers_cast_in_their_kernel():
    """`buf.copy_(value)` in the program: AOTAutograd writes a functional `aten.copy(buf,
    value)` (value cast to buf's dtype: float16, int64) and the copy_ of its result; both fuse,
    the kernel computing the value writing the buffer; also a copy that broadcasts (`row` into
    a [4, 5] buffer: the source expanded in the kernel)."""
    def f(x, half, buf, row, ints):
        half.copy_(x * 2)
        buf.copy_(x.exp())
        row.copy_(x[0] + 1)
        ints.copy_(x * 10)
        return x.sin()

    def g(x, buf):
        buf.copy_(x[0] * 2)
        return x + 1

    def make():
        gen = torch.Generator().manual_seed(0)
        return [torch.randn(4, 5, generator=gen), torch.zeros(4, 5, dtype=torch.float16),
                torch.zeros(4, 5), torch.zeros(5), torch.zeros(4, 5, dtype=torch.int64)]
    ins, ref = make(), make()
    torch.testing.assert_close(pyfuser.compile(f)(*ins), f(*ref))
    for a, b in zip(ins, ref):
        assert torch.equal(a, b)
    ins, ref = make()[:3:2], make()[:3:2]
    torch.testing.assert_close(pyfuser.compile(g)(*ins), g(*ref))
    assert torch.equal(ins[1], ref[1])
    g1, g2 = _graphs("inference")
    assert_input_copies_fused(g1, 4)
    assert sorted(g1.regions[0].ops).count("aten.copy.default") == 4
    assert_input_copies_fused(g2, 1)             # the broadcasting copy too (it stayed eager)


def _copy_cases():
    mm = torch.ops.aten.mm.default
    copy_ = torch.ops.aten.copy_.default
    return {
        "cast": (lambda x, acc: (copy_(acc, x * 2), x + 1)[1:],
                 lambda: (torch.randn(4, 5), torch.zeros(4, 5, dtype=torch.float16)),
                 "copy_ casts torch.float32 to torch.float16"),
        "broadcast": (lambda x, acc: (copy_(acc, x[0] * 2), x + 1)[1:],
                      lambda: (torch.randn(4, 5), torch.zeros(4, 5)),
                      "copy_ broadcasts [5] to [4, 5]"),
        "read outside": (lambda x, acc: (mm(acc, x.t()), copy_(acc, acc * 2))[:1],
                         lambda: (torch.randn(4, 5), torch.randn(4, 5)),
                         "copy_ into an input read outside its region"),
        "unfused source": (lambda x, acc: (copy_(acc, mm(x, x.t())), x * 3)[1:],
                           lambda: (torch.randn(4, 4), torch.randn(4, 4)),
                           "copy_ whose source no fused region computes"),
        "not an input": (lambda x, acc: (copy_(x * 2, acc + 1) * 3,),
                         lambda: (torch.randn(4, 5), torch.randn(4, 5)),
                         "copy_ into a value the graph computes (not an input)"),
        "not dense": (lambda x, acc: (copy_(acc, x * 2), x + 1)[1:],
                      lambda: (torch.randn(4, 5), torch.zeros(4, 10)[:, ::2]),
                      "copy_ into an input that is not dense"),
    }


@pytest.mark.parametrize("case", list(_copy_cases()))
def test_input_copies_that_stay_eager_say_why(case):
    """A copy_ the region cannot write exactly stays an FX node with the reason; the graph's
    results and the written input are eager's."""
    from torch.fx.experimental.proxy_tensor import make_fx
    from pyfuser.frontend.fx.compile_graph import compile_graph
    f, make, reason = _copy_cases()[case]
    ins = make()
    gm = make_fx(f)(*make())
    cg = compile_graph(gm, None, "inference")
    want_ins = [t.clone() for t in ins]
    want = f(*want_ins)
    got = cg(list(ins))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
    for a, b in zip(ins, want_ins):
        torch.testing.assert_close(a, b)
    copies = [n.name for n in gm.graph.nodes if n.target is torch.ops.aten.copy_.default]
    assert [cg.unsupported.get(n) for n in copies] == [reason]
    assert cg.regions and all(r.eager_calls == 0 for r in cg.regions)


def test_copy_of_a_permuted_source_into_a_new_buffer():
    """DeepSeek-V3's key assembly: `k = kv.new_empty(...)`, `k[..., :d].copy_(k_nope)` with
    k_nope a slice of a transposed split (an unfused view: permuted strides). The region is
    AOTAutograd's `copy(dst, src)` alone, a transpose kernel whose fusion also takes dst (its
    shape and dtype only): the kernel read dst and wrote src, leaving the output unwritten."""
    def f(x):
        kv = x.view(2, 8, 2, 24).transpose(1, 2)
        k_nope, v = kv.split([8, 16], -1)
        k = x.new_empty(2, 2, 8, 16)
        k[..., :8].copy_(k_nope)
        k[..., 8:].fill_(1.0)
        return k * 2, v
    x = torch.randn(2, 8, 48, generator=torch.Generator().manual_seed(0))
    x0 = x.clone()
    with torch.no_grad():
        got = pyfuser.compile(f)(x)
    want = f(x0)
    assert torch.equal(x, x0)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    (g,) = _graphs("inference")
    # the copy was a region alone; since new_empty, fill and slice_scatter fuse, it is in theirs
    (r,) = [r for r in g.regions if "aten.copy.default" in r.ops]
    assert {"aten.new_empty.default", "aten.slice_scatter.default"} <= set(r.ops), r.ops
