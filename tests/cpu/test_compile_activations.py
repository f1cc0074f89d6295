"""Activations whose derivatives ran eagerly before frontend/lowering/aten_activations.py (ELU,
SELU, CELU, leaky ReLU, hardsigmoid, hardswish, mish, log-sigmoid, PReLU) through the
torch.compile backend on the CPU: each derivative fuses into the backward graph's kernels (the
bias' gradient sum in the same region), the forward and the gradients are as close to float64
eager as float32 eager is, half / bfloat16 results are eager's bits (computed in float,
rounded once), and the bounds of the branches are eager's."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import pyfuser

from compile_checks import assert_ran_as_sm90_kernels, check_fn, graphs

pytestmark = pytest.mark.usefixtures("fresh_compile")

ACTIVATIONS = [
    ("elu", lambda x: F.elu(x, 0.7), "elu_backward"),
    ("selu", F.selu, "elu_backward"),
    ("celu", lambda x: F.celu(x, 1.3), "elu_backward"),
    ("leaky_relu", lambda x: F.leaky_relu(x, 0.2), "leaky_relu_backward"),
    ("hardsigmoid", F.hardsigmoid, "hardsigmoid_backward"),
    ("hardswish", F.hardswish, "hardswish_backward"),
    ("mish", F.mish, "mish_backward"),
    ("logsigmoid", F.logsigmoid, "log_sigmoid_backward"),
]


def _backward_ops():
    return {op for g in graphs("backward") for r in g.regions for op in r.ops}


@pytest.mark.parametrize("name,act,op", ACTIVATIONS, ids=[a[0] for a in ACTIVATIONS])
def test_activation_backward_fuses(name, act, op):
    check_fn(lambda x, b: act(x * 3 + b) * 2, (8, 33), (33,))
    ops = _backward_ops()
    assert f"aten.{op}.default" in ops, ops
    assert "aten.sum.dim_IntList" in ops          # the broadcast bias' gradient, same region
    for g in graphs("forward") + graphs("backward"):
        # (a view the graph returns, the bias gradient's, stays a view by design)
        assert not [why for why in g.unsupported.values() if "lowering" in why], g.report()
        assert_ran_as_sm90_kernels(g.regions)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("name,act,op", ACTIVATIONS, ids=[a[0] for a in ACTIVATIONS])
def test_half_activations_are_eagers_bits(name, act, op, dtype):
    """Computed in float and rounded once, as eager's kernels: the forward and the input's
    gradient are eager's bits (ELU's forward rounded after each of its three ops before)."""
    gen = torch.Generator().manual_seed(1)
    x = (torch.randn(16, 24, generator=gen) * 3).to(dtype)
    b = torch.randn(24, generator=gen).to(dtype)
    g = torch.randn(16, 24, generator=gen).to(dtype)
    ours, ref = x.clone().requires_grad_(), x.clone().requires_grad_()
    f = lambda t: act(t + b) * 3   # noqa: E731
    out, want = pyfuser.compile(f)(ours), f(ref)
    out.backward(g)
    want.backward(g)
    assert out.dtype == want.dtype and torch.equal(out, want), (out - want).abs().max()
    assert torch.equal(ours.grad, ref.grad), (ours.grad - ref.grad).abs().max()
    assert f"aten.{op}.default" in _backward_ops()


def test_prelu_and_its_weight_gradient_fuse():
    """PReLU per channel: `_prelu_kernel` and `_prelu_kernel_backward` (dx and the elementwise
    weight gradient the graph sums over N and the spatial axes) run as kernels."""
    torch.manual_seed(0)
    m = torch.nn.PReLU(6)
    with torch.no_grad():
        m.weight.uniform_(-0.5, 0.5)
    m64 = torch.nn.PReLU(6).double()
    with torch.no_grad():
        m64.weight.copy_(m.weight)
    x = torch.randn(4, 6, 5, 5)
    xs = [x.clone().requires_grad_(), x.clone().requires_grad_(), x.double().requires_grad_()]
    outs = [pyfuser.compile(lambda t: m(t * 2))(xs[0]), m(xs[1] * 2), m64(xs[2] * 2)]
    from train_corpus import assert_as_close_as_eager
    assert_as_close_as_eager(*outs, "forward")
    grads = []
    for mod, o in ((m, outs[0]), (m, outs[1]), (m64, outs[2])):
        mod.weight.grad = None
        (o * o.detach().sin()).sum().backward()
        grads.append(mod.weight.grad.clone())
    assert_as_close_as_eager(xs[0].grad, xs[1].grad, xs[2].grad, "dx")
    assert_as_close_as_eager(*grads, "dweight")
    fused = {op for g in graphs("forward") + graphs("backward") for r in g.regions for op in r.ops}
    assert {"aten._prelu_kernel.default", "aten._prelu_kernel_backward.default"} <= fused, fused


def test_negative_zero_and_nan_take_eagers_branches():
    """x = -0.0 and 0.0 take the branch below 0 of ELU and leaky ReLU (eager tests x > 0), NaN
    gives NaN; hardsigmoid's gradient is 0 at -3 and 3 (an open interval)."""
    x = torch.tensor([0.0, -0.0, float("nan"), -3.0, 3.0, 1.5, -1.5, 2.999, -2.999])
    for act in (lambda t: F.elu(t, 0.7), lambda t: F.leaky_relu(t, 0.2), F.hardsigmoid, F.mish):
        torch._dynamo.reset()
        ours, ref = x.clone().requires_grad_(), x.clone().requires_grad_()
        out, want = pyfuser.compile(lambda t: act(t) * 1)(ours), act(ref) * 1
        torch.testing.assert_close(out, want, equal_nan=True)
        out.sum().backward()
        want.sum().backward()
        torch.testing.assert_close(ours.grad, ref.grad, equal_nan=True)


@pytest.mark.parametrize("device", ["cuda", None, "cpu"], ids=str)
def test_hardswish_backward_bounds_are_eagers_on_every_device(device):
    """hardswish's gradient at exactly -3 and 3: 0 and the gradient itself, from eager's CPU
    kernel and (measured in the GPU suite, torch 2.11) its CUDA kernel alike; the middle
    formula there (-0.5 and 1.5, older CUDA kernels') was one gradient off eager's."""
    from pyfuser.frontend.lowering.aten_activations import _hardswish_backward
    from pyfuser.frontend.lowering.device import lowering_device
    from pyfuser.frontend.lowering.lower import tensor_input
    from pyfuser.ir.evaluator import evaluate
    from pyfuser.ir.fusion import Fusion
    with Fusion() as f, lowering_device(device):
        g = tensor_input(torch.float32, [4], [1], "g")
        x = tensor_input(torch.float32, [4], [1], "x")
        f.add_input(g)
        f.add_input(x)
        f.add_output(_hardswish_backward(g, x))
    (got,) = evaluate(f, [torch.ones(4), torch.tensor([-3.0, 3.0, -3.5, 3.5])])
    assert got.tolist() == [0.0, 1.0, 0.0, 1.0]


@pytest.mark.parametrize("device", ["cuda", None, "cpu"], ids=str)
def test_log_sigmoid_buffer_follows_the_device(device):
    """log_sigmoid_forward's buffer is eager's of the graph's device: an empty [0] tensor for
    CUDA (whose backward computes exp(-|x|) again), exp(-|x|) itself for the CPU (whose backward
    reads it); the output and the gradient are the same either way, -inf / inf / NaN included."""
    from pyfuser.frontend.lowering.aten_activations import (_log_sigmoid_backward,
                                                            _log_sigmoid_forward)
    from pyfuser.frontend.lowering.device import lowering_device
    from pyfuser.frontend.lowering.lower import tensor_input
    from pyfuser.ir.evaluator import evaluate
    from pyfuser.ir.fusion import Fusion
    x = torch.tensor([-30.0, -2.0, -0.0, 0.0, 0.5, 40.0, -float("inf"), float("inf"),
                      float("nan")])
    g = torch.randn(9)
    with Fusion() as f, lowering_device(device):
        xv = tensor_input(torch.float32, [9], [1], "x")
        gv = tensor_input(torch.float32, [9], [1], "g")
        f.add_input(xv)
        f.add_input(gv)
        out, buffer = _log_sigmoid_forward(xv)
        f.add_output(out)
        f.add_output(buffer)
        f.add_output(_log_sigmoid_backward(gv, xv, buffer))
    got, buf, dx = evaluate(f, [x, g])
    want, cpu_buffer = torch.ops.aten.log_sigmoid_forward(x)
    torch.testing.assert_close(got, want, equal_nan=True, rtol=0, atol=0)
    if device == "cpu":
        torch.testing.assert_close(buf, cpu_buffer, equal_nan=True, rtol=0, atol=0)
    else:
        assert buf.shape == (0,)
    torch.testing.assert_close(dx, torch.ops.aten.log_sigmoid_backward(g, x, cpu_buffer),
                               equal_nan=True, rtol=0, atol=0)



def test_log_sigmoid_backward_on_cuda_ignores_its_buffer_input():
    """In a CUDA backward graph the buffer is a region input whose extent is symbolic (not a
    known [0]): the backward computes exp(-|x|) again, as eager's CUDA kernel does, instead of
    broadcasting the empty buffer against x (which failed at run time: the GPU suite's
    logsigmoid region ran eagerly)."""
    from pyfuser.frontend.lowering.aten_activations import _log_sigmoid_backward
    from pyfuser.frontend.lowering.device import lowering_device
    from pyfuser.frontend.lowering.lower import tensor_input
    from pyfuser.ir.evaluator import evaluate
    from pyfuser.ir.fusion import Fusion
    x = torch.tensor([-30.0, -2.0, -0.0, 0.0, 0.5, 40.0, -float("inf"), float("inf"),
                      float("nan")])
    g = torch.randn(9)
    with Fusion() as f, lowering_device("cuda"):
        xv, gv, bv = (tensor_input(torch.float32, s, [1], n)
                      for s, n in (([9], "x"), ([9], "g"), ([0], "buffer")))
        for v in (xv, gv, bv):
            f.add_input(v)
        dx = _log_sigmoid_backward(gv, xv, bv)
        f.add_output(dx)
    (got,) = evaluate(f, [x, g, torch.empty(0)])
    want = torch.ops.aten.log_sigmoid_backward(g, x, torch.ops.aten.log_sigmoid_forward(x)[1])
    torch.testing.assert_close(got, want, equal_nan=True, rtol=0, atol=0)

def test_hardswish_backward_on_the_cpu_is_eagers_vectorised_loop():
    """Through torch.compile on CPU tensors (the device the lowering is told), the bounds are
    those of eager's CPU kernel on a whole vector of elements."""
    x = torch.tensor([-3.0, 3.0, -2.0, 2.0, -4.0, 4.0, 0.0, 1.0] * 4)
    ours, ref = x.clone().requires_grad_(), x.clone().requires_grad_()
    pyfuser.compile(lambda t: F.hardswish(t) * 1)(ours).sum().backward()
    (F.hardswish(ref) * 1).sum().backward()
    assert torch.equal(ours.grad, ref.grad), (ours.grad, ref.grad)
    assert ours.grad[:2].tolist() == [0.0, 1.0]


@pytest.mark.parametrize("dim", [-1, 0, 1])
def test_glu_and_its_backward_fuse(dim):
    """GLU's halves along `dim` as slices, its gradient a cat of the halves' gradients."""
    check_fn(lambda x: F.glu(x * 1.5, dim) * 2, (6, 8, 4))
    fused = {op for g in graphs("forward") + graphs("backward") for r in g.regions for op in r.ops}
    assert {"aten.glu.default", "aten.glu_backward.default"} <= fused, fused


def test_glu_of_bfloat16_is_computed_in_float():
    """The forward is eager's bits (a * sigmoid(b) in float, rounded once); the gradient follows
    eager's CUDA kernel (float throughout, rounded once), so it is as close to float64's as the
    CPU's (which rounds its sigmoid to bfloat16 first)."""
    from train_corpus import assert_as_close_as_eager
    x = (torch.randn(6, 8) * 2).bfloat16()
    ours, ref, ora = (x.clone().requires_grad_(), x.clone().requires_grad_(),
                      x.double().requires_grad_())
    out, want = pyfuser.compile(lambda t: F.glu(t, -1) * 1)(ours), F.glu(ref, -1) * 1
    assert torch.equal(out, want)
    g = torch.randn(6, 4).bfloat16()
    out.backward(g)
    want.backward(g)
    F.glu(ora, -1).backward(g.double())
    assert_as_close_as_eager(ours.grad, ref.grad, ora.grad, "dx", factor=1.0)
