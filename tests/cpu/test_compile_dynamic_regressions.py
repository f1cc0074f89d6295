"""What the dynamic-shape fuzz campaign (tests/cpu/fx_fuzz_dynamic.py, docs/fuzzing.md) found in
the torch.compile backend, one minimal program each: two wrong results. Checked on the CPU
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
