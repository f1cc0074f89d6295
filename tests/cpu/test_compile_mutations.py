"""Programs that mutate their inputs, through pyfuser.compile, against eager: the outputs and
every input after each of two calls are eager's, whichever copy_ of a mutated input the
backend fuses (fx/mutations.py) and whichever it leaves to eager. The programs put reads of an
input before and after its mutation, in fused and unfused ops, mutate through views, return the
mutated input, and pass one tensor (or a view of it) as two arguments."""
from __future__ import annotations

import pytest
import torch

import pyfuser
from pyfuser.frontend.fx import compiled_graphs

pytestmark = pytest.mark.usefixtures("fresh_compile")


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
            _twice: (1, []), _through_a_row: (0, [NO_SOURCE]),       # select_scatter: eager
            _through_a_transpose: (0, [READ_OUTSIDE]),               # the view a.t(): FX's
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

