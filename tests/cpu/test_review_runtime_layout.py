"""Review of schedule/layout.py's eager_output_orders and its shortcut (contiguous inputs and no
permute: row-major outputs without the meta run): on every non-size-1 axis the orders must be
what eager gives (the meta run is the reference), and the kernel's outputs laid out so."""
import pytest
import torch

import pyfuser.ir.builder as B
from pyfuser.codegen import api
from pyfuser.ir import DataType, Fusion
from pyfuser.ir.shapes import bind
from pyfuser.schedule import layout as L

F = DataType.Float


def _fusion(build):
    f = Fusion()
    with f:
        outs = build()
        for o in outs:
            f.add_output(o)
    return f


def _t(sizes, dtype=F):
    return B.define_tensor(sizes, dtype, [None if s == 1 else True for s in sizes])


CASES = {
    # name: (build, input shapes, eager reference)
    "outer_broadcast": (lambda: [B.elementwise("add", _t([-1, 1]), _t([1, -1]))],
                        [(5, 1), (1, 7)], lambda a, b: [a + b]),
    "bias": (lambda: (lambda x, b: [B.elementwise("mul", x, B.broadcast(b, [True, True, False]))])(
        _t([-1, -1, -1]), _t([-1])), [(3, 4, 5), (5,)],
        lambda x, b: [x * b]),
    "size1_middle": (lambda: [B.elementwise("relu", _t([-1, 1, -1]))], [(4, 1, 6)],
                     lambda x: [torch.relu(x)]),
    "copy_and_cast": (lambda: (lambda x: [B.set_(x), B.cast(x, DataType.Double)])(_t([-1, -1])),
                      [(4, 6)], lambda x: [x.clone(), x.double()]),
    "reshape_between": (lambda: [B.elementwise("neg", B.reshape(
        B.elementwise("relu", _t([-1, -1])), [-1]))], [(4, 6)],
        lambda x: [-(torch.relu(x).reshape(-1))]),
    "expand_add": (lambda: (lambda a, b: [B.elementwise("add", B.expand(a, [b.logical[0].extent, -1]),
                                                        b)])(_t([1, -1]), _t([-1, -1])),
                   [(1, 6), (4, 6)], lambda a, b: [a.expand(4, 6) + b]),
    "zero_dim": (lambda: [B.elementwise("add", _t([]), _t([-1, -1]))], [(), (3, 4)],
                 lambda a, b: [a + b]),
    "squeeze": (lambda: [B.elementwise("exp", B.squeeze(_t([-1, 1, -1]), [1]))], [(4, 1, 6)],
                lambda x: [torch.exp(x.squeeze(1))]),
    # a bool full as a where's predicate: the meta run made fulls float32 (a where of one
    # raised at plan time; reached through GPT-2's masked cumsum, frontend/fx/rewrite_scan.py)
    "where_on_a_full": (lambda: (lambda x: [B.elementwise("where", B.full(
        [d.extent for d in x.logical], True, DataType.Bool), x, B.elementwise("neg", x))])(
        _t([-1, -1])), [(4, 6)], lambda x: [torch.where(torch.ones_like(x, dtype=torch.bool),
                                                        x, -x)]),
}


def _meta_orders(f, xs, b, monkeypatch):
    """The meta run's orders: the shortcut only fires for contiguous inputs."""
    with monkeypatch.context() as m:
        m.setattr(torch.Tensor, "is_contiguous", lambda self, *a, **k: False)
        return L.eager_output_orders(f, xs, b)


def _big(sizes, order):
    return [a for a in order if sizes[a] != 1]


@pytest.mark.parametrize("name", sorted(CASES))
def test_shortcut_agrees_with_the_meta_run_and_eager(name, monkeypatch):
    build, shapes, ref = CASES[name]
    f = _fusion(build)
    xs = [torch.randn(s) for s in shapes]
    assert all(x.is_contiguous() for x in xs)
    b = bind(f, xs)
    fast = L.eager_output_orders(f, xs, b)
    meta = _meta_orders(f, xs, b, monkeypatch)
    want = ref(*xs)
    plan = api.plan_kernel(f, xs)
    outs = plan.allocate_outputs(b, xs, torch.device("cpu"))
    for k, (o, w) in enumerate(zip(f.outputs, want)):
        sizes = b.shape(o)
        eager = L.stride_order(tuple(w.shape), tuple(w.stride()))
        assert _big(sizes, fast[k]) == _big(sizes, meta[k]) == list(eager), (name, k)
        assert L.stride_order(tuple(outs[k].shape), tuple(outs[k].stride())) == eager, (name, k)


def test_non_contiguous_inputs_take_the_meta_run():
    """Not contiguous (channels-last, transposed): the shortcut must not answer row-major."""
    f = _fusion(lambda: [B.elementwise("relu", B.define_tensor([-1, -1, -1, -1], F))])
    x = torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)
    (order,) = L.eager_output_orders(f, [x], bind(f, [x]))
    assert list(order) == [0, 2, 3, 1]
    g = _fusion(lambda: [B.elementwise("relu", B.define_tensor([-1, -1], F))])
    y = torch.randn(4, 6).t()
    (order,) = L.eager_output_orders(g, [y], bind(g, [y]))
    assert list(order) == [1, 0]
