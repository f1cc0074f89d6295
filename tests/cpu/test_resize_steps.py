"""Stepped slices and pads in the Fusion IR (ir/exprs.py SliceOp.steps, PadOp.steps): a slice
taking every step-th element (`x[:, 1::2]`) and its gradient's pad spreading the elements
step apart with the pad value between them (`slice_backward(..., step)`). Built with the
builder and nvFuser's `fd.ops.slice(..., strides=)`: the evaluator, the layout meta-run, the
shape binding, the printer and the verifier take the steps, the pointwise kernel reads the
operand at start + step * index ("st" key entries) or, for the pad, at (index - lo) / step
("dv"), and its values are eager's bit for bit on the CPU interpreter, whose executor compiles
each kernel with NVRTC for sm_90 first."""
from __future__ import annotations

import pytest
import torch

from pyfuser.codegen import api
from pyfuser.errors import FusionDefinitionError
from pyfuser.ir import builder as B
from pyfuser.ir import exprs as E
from pyfuser.ir.dtypes import DataType
from pyfuser.ir.evaluator import evaluate
from pyfuser.ir.printer import print_fusion
from pyfuser.ir.verifier import IRVerifyError, verify
from pyfuser.ir.shapes import bind
from pyfuser.runtime import dispatch, nvrtc
from pyfuser.schedule.layout import eager_output_orders

from test_inner_outer import _fusion

ew = B.elementwise
BIG = 2 ** 63 - 1


def _run(f, inputs):
    """The fusion's kernels on the interpreter (NVRTC compiles each first) and the evaluator."""
    got = dispatch.execute_fusion(f, inputs, "interpret")
    report = dispatch.last_report(f)
    assert report is not None and report.eager_segments == 0, report
    return got, evaluate(f, inputs)


def _sliced(dtype=DataType.Float):
    x = B.define_tensor([-1, -1], dtype)
    h = ew("mul", x, 2.0)
    even, odd = B.slice_axis(h, 1, 0, None, step=2), B.slice_axis(h, 1, 1, None, step=2)
    return [ew("sub", even, odd), B.slice_axis(h, 1, 1, 7, step=3),
            ew("exp", B.slice_axis(B.slice_axis(h, 0, 0, None, step=2), 1, 2, None, step=4))]


def _sliced_eager(x):
    h = x * 2
    return [h[:, ::2] - h[:, 1::2], h[:, 1:7:3], h[::2, 2::4].exp()]


@pytest.mark.parametrize("shape", [(3, 8), (5, 12), (4, 10)])
def test_stepped_slices_read_every_step_th_element(shape):
    """Even and odd halves of a computed value (interleaved rotary's pairs), a stepped slice
    with a constant end, and slices stepped along two axes: eager's values and shapes on sizes
    the Fusion leaves symbolic."""
    f = _fusion(_sliced)
    x = torch.randn(*shape)
    got, ref = _run(f, [x])
    for g, r, w in zip(got, ref, _sliced_eager(x)):
        assert g.shape == w.shape and r.shape == w.shape
        assert torch.equal(g, w) and torch.equal(r, w)


def _padded(dtype=DataType.Float):
    g = B.define_tensor([-1, -1], dtype)
    h = ew("mul", g, 2.0)
    return [B.pad(h, [(0, 0), (1, 2)], 0, steps=[1, 2]),
            B.pad(h, [(2, 0), (0, 0)], 0.5, steps=[3, 1]),
            B.pad(h, [(0, 1), (3, 1)], -1.0, steps=[2, 3])]


def _padded_eager(g):
    h = g * 2
    a = torch.ops.aten.slice_backward(h, [g.shape[0], 2 * g.shape[1] + 2], 1, 1, 2 * g.shape[1], 2)
    b = torch.full((3 * g.shape[0] - 2 + 2, g.shape[1]), 0.5)
    b[2::3] = h
    c = torch.full((2 * g.shape[0], 3 * g.shape[1] - 2 + 4), -1.0)
    c[0:2 * g.shape[0] - 1:2, 3:3 * g.shape[1] + 1:3] = h
    return [a, b, c]


@pytest.mark.parametrize("shape", [(3, 4), (2, 7), (1, 5)])
def test_stepped_pads_spread_the_operand_apart(shape):
    """A pad with a step puts the operand's element i at lo + i * step and the pad value
    between and around them (a stepped slice's gradient: slice_backward), on one axis or two;
    the output's extent is lo + (n - 1) * step + 1 + hi."""
    f = _fusion(_padded)
    g = torch.randn(*shape)
    got, ref = _run(f, [g])
    for a, r, w in zip(got, ref, _padded_eager(g)):
        assert a.shape == w.shape and r.shape == w.shape
        assert torch.equal(a, w) and torch.equal(r, w)


@pytest.mark.parametrize("dtype", [DataType.Float, DataType.BFloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("build,eager,k,shape", [(_sliced, _sliced_eager, 0, (4, 64)),
                                                 (_sliced, _sliced_eager, 2, (4, 64)),
                                                 (_padded, _padded_eager, 2, (4, 16))],
                         ids=["halves", "two_axes", "pad"])
def test_stepped_kernels_compile_with_nvrtc_and_keep_no_vectors(build, eager, k, shape, dtype):
    """Each one kernel that compiles for sm_90; the stepped reads are "general" accesses and a
    stepped pad's choice is per element: no vectors (a vector's lanes would straddle the
    steps)."""
    f = _fusion(lambda: build(dtype)[k:k + 1])
    x = torch.randn(*shape).to(dtype.torch)
    plan = api.plan_kernel(f, [x])
    assert plan.scheduler == "pointwise" and plan.params.vec == 1
    assert nvrtc.compile_cuda(plan.kernel.source, plan.kernel.name, "sm_90") is not None
    (got,), _ = _run(f, [x])
    want = eager(x)[k]
    assert got.dtype == x.dtype and torch.equal(got, want.to(x.dtype))


def test_printer_verifier_and_layout_take_the_steps():
    f = _fusion(lambda: _sliced()[:2] + _padded()[:1])
    text = print_fusion(f)
    assert "slice( T1_l" in text and "0::2" in text and "1:7:3" in text
    assert "1:2 step 2" in text
    verify(f)
    sl = [e for e in f.exprs if isinstance(e, E.SliceOp)]
    assert sorted(tuple(e.steps) for e in sl) == [(1, 2), (1, 2), (1, 3), (1, 4), (2, 1)]
    x = [torch.randn(5, 12), torch.randn(5, 12)]
    orders = eager_output_orders(f, x, bind(f, x))     # the meta-run: eager's layouts
    assert orders == [(0, 1)] * 3
    sl[0].steps = [1, 0]
    with pytest.raises(IRVerifyError, match="steps"):
        verify(f)
    sl[0].steps = [1, 2]
    pad = next(e for e in f.exprs if isinstance(e, E.PadOp))
    pad.steps = [1]
    with pytest.raises(IRVerifyError, match="steps"):
        verify(f)


def test_builder_refuses_bad_steps():
    def build(fn):
        return lambda: [fn(B.define_tensor([-1, -1], DataType.Float))]
    for fn in (lambda x: B.slice_axis(x, 1, 0, None, step=0),
               lambda x: B.pad(x, [(0, 0), (1, 1)], 0, steps=[1, 0]),
               lambda x: B.pad(x, [(0, 0), (1, 1)], 0, steps=[2])):
        with pytest.raises(FusionDefinitionError):
            _fusion(build(fn))


def test_fusion_definition_slice_takes_strides():
    """nvFuser's fd.ops.slice(..., strides=): every stride-th element (strides < 1 refused);
    one kernel, eager's values, and repr(fd) rebuilds it."""
    from pyfuser.frontend.definition import Fusion as FS, FusionDefinition
    fs = FS()
    with FusionDefinition(fs) as fd:
        t0 = fd.define_tensor([-1, -1], dtype=DataType.Float)
        t1 = fd.ops.slice(t0, start_indices=[0, 1], end_indices=[4, 9], strides=[2, 3])
        fd.add_output(fd.ops.mul(fd.ops.exp(t1), 3.0))
    x = torch.randn(4, 9)
    (out,) = fs.execute([x])
    torch.testing.assert_close(out, x[0:4:2, 1:9:3].exp() * 3.0, rtol=0, atol=0)
    assert "strides=[2, 3]" in repr(fd)
    report = dispatch.last_report(fs._ir)
    assert report is not None and report.eager_segments == 0 and report.kernels == 1, report
    with pytest.raises(FusionDefinitionError, match="stride 0"):
        with FusionDefinition(FS()) as fd:
            t0 = fd.define_tensor([-1, -1], dtype=DataType.Float)
            fd.ops.slice(t0, start_indices=[0, 1], end_indices=[4, 9], strides=[1, 0])
