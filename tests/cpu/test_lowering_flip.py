"""`aten::flip` (lowering/aten_indexing.py): a lookup per flipped axis at an iota counting down,
read in the kernel that consumes it. Through torch.compile's backend on the CPU interpreter:
eager's values bit for bit, forward and backward (flip's gradient is a flip), the flip inside
the region of its neighbours, size-1, expanded and empty axes, negative dims, symbolic sizes
without a recompile, a reduction after it, TorchScript's graph through pyfuser.jit; repeated
or out-of-range dims refused by the lowering. The kernels compile with NVRTC for sm_90."""
from __future__ import annotations

import pytest
import torch

import pyfuser
from pyfuser.frontend.fx import compiled_graphs

from compile_checks import assert_ran_as_sm90_kernels

pytestmark = pytest.mark.usefixtures("fresh_compile")


def _flip_ops(kind="inference"):
    regions = [r for g in compiled_graphs() if g.kind == kind for r in g.regions]
    return regions, [op for r in regions for op in r.ops if op == "aten.flip.default"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32])
@pytest.mark.parametrize("dims", [(1,), (0, 2), (-1,), (2, 0, 1)], ids=str)
def test_flip_fuses_with_its_neighbours_and_equals_eager(dtype, dims):
    def f(x, y):
        return x.flip(dims) * 2 + y

    x = (torch.randn(3, 5, 8) * 4).to(dtype)
    y = (torch.randn(3, 5, 8) * 4).to(dtype)
    torch._dynamo.reset()
    got = pyfuser.compile(f)(x, y)
    want = f(x, y)
    assert got.dtype == want.dtype and torch.equal(got, want)
    regions, flips = _flip_ops()
    assert len(regions) == 1 and len(flips) == 1, [r.ops for r in regions]
    assert not [g.unsupported for g in compiled_graphs() if g.unsupported]
    assert_ran_as_sm90_kernels(regions)


def test_flip_of_size_one_expanded_and_empty_axes():
    def f(a, b, c):
        return a.flip(0, 1) + 1, b.flip(1) * 3, c.flip(0) - 1

    a = torch.randn(1, 6)                       # size-1 axis 0: only axis 1 is looked up
    b = torch.randn(4, 1).expand(4, 5)          # an expanded axis: the same values anyway
    c = torch.randn(0, 3)
    torch._dynamo.reset()
    got = pyfuser.compile(f)(a, b, c)
    for g, w in zip(got, f(a, b, c)):
        assert g.shape == w.shape and torch.equal(g, w)


def test_flip_of_a_transposed_a_0_dim_and_a_bool_tensor():
    """A transposed input's flip keeps eager's layout (flip preserves it); a 0-dim tensor's
    flip is a copy; a bool flip feeds a logical op."""
    def f(a, s, m):
        return a.t().flip(0) * 3, s.flip(0) + 1, (m > 0).flip(1) & (m < 1)

    a, s, m = torch.randn(6, 9), torch.tensor(3.0), torch.randn(3, 4)
    torch._dynamo.reset()
    got = pyfuser.compile(f)(a, s, m)
    for g, w in zip(got, f(a, s, m)):
        assert g.shape == w.shape and g.dtype == w.dtype and g.stride() == w.stride()
        assert torch.equal(g, w)


def test_flip_backward_is_a_flip():
    def f(x, w):
        return (x.flip(1) * w).relu().sum()

    x = torch.randn(6, 7, requires_grad=True)
    w = torch.randn(6, 7, requires_grad=True)
    torch._dynamo.reset()
    loss = pyfuser.compile(f)(x, w)
    loss.backward()
    gx, gw = x.grad.clone(), w.grad.clone()
    x.grad = w.grad = None
    want = f(x, w)
    want.backward()
    assert torch.allclose(loss, want, rtol=1e-6, atol=1e-6)
    assert torch.equal(gx, x.grad) and torch.equal(gw, w.grad)
    assert not [k for g in compiled_graphs() for k in g.unsupported if "flip" in k]


def test_flip_before_a_reduction_is_one_kernel():
    def f(x):
        return torch.softmax(x.flip(-1) * 0.5, -1)

    x = torch.randn(16, 40)
    torch._dynamo.reset()
    got = pyfuser.compile(f)(x)
    assert torch.allclose(got, f(x), rtol=1e-6, atol=1e-7)
    regions, flips = _flip_ops()
    assert len(regions) == 1 and flips
    assert_ran_as_sm90_kernels(regions)


def test_flip_of_symbolic_sizes_reuses_its_kernel():
    """New lengths of the flipped axis (odd ones: the same layout facts, so the same kernel)
    run the same graph and kernel: the iota's start is the axis' symbolic extent less one."""
    from pyfuser.runtime import nvrtc

    def f(x):
        return x.flip(1) + 1

    c = pyfuser.compile(f, dynamic=True)
    torch._dynamo.reset()
    seen = []
    for n in (5, 7, 9):
        x = torch.randn(3, n)
        assert torch.equal(c(x), f(x))
        seen.append(nvrtc.stats["nvrtc"] + nvrtc.stats["disk"])
    graphs = [g for g in compiled_graphs() if g.kind == "inference"]
    assert len(graphs) == 1 and not graphs[0].unsupported       # no recompile
    assert seen[2] == seen[1] == seen[0], seen                    # no new kernel


def test_repeated_or_out_of_range_dims_are_refused():
    """The lowering refuses them (the node stays eager's, whose error the user gets); through
    torch.compile, Dynamo's tracing raises eager's error first."""
    from pyfuser.errors import UnsupportedOpError
    from pyfuser.frontend.lowering.aten_indexing import _flip
    from pyfuser.ir import builder as B
    from pyfuser.ir.dtypes import DataType
    from pyfuser.ir.fusion import Fusion
    with Fusion():
        x = B.define_tensor([-1, -1], DataType.Float)
        for dims in ([1, 1], [0, -2], [2]):
            with pytest.raises(UnsupportedOpError, match="flip: dims"):
                _flip(x, dims)
    torch._dynamo.reset()
    with pytest.raises(Exception, match="duplicate value|multiple times"):
        pyfuser.compile(lambda t: t.flip(1, 1) + 1)(torch.randn(3, 4))


def test_torchscript_flip_fuses():
    def f(x, y):
        return torch.flip(x, [0]) * y

    x, y = torch.randn(5, 6), torch.randn(5, 6)
    fn = pyfuser.jit(torch.jit.script(f))
    for _ in range(2):
        got = fn(x, y)
    assert torch.equal(got, f(x, y))
    text = str(fn.graph)                 # the flip and the mul: one fusion group
    assert fn.num_groups == 1 and text.count("aten::flip") == 1
    assert text.index("with prim::PyfuserGroup") < text.index("aten::flip")
