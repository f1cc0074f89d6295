"""The activations' derivatives, losses and norms lowered in the twenty-sixth and twenty-seventh
sessions (tests/cpu/test_compile_activations.py, test_compile_regression_losses.py) as CUDA
kernels: forward and gradients through torch.compile(backend=pyfuser) on CUDA tensors against
eager's CUDA kernels and float64 eager (as close as float32 eager is; half / bfloat16 within one
rounding of eager's, their kernels computing in float and rounding once as eager's do), every
region's kernels launched on the device, the op in a fused region. log_sigmoid_forward's
buffer is eager's on CUDA: an empty tensor."""
from __future__ import annotations

import os
import sys

import pytest
import torch
import torch.nn.functional as F

import pyfuser
from pyfuser.frontend.fx import compiled_graphs
from pyfuser.runtime import dispatch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "cpu"))
from test_compile_activations import ACTIVATIONS  # noqa: E402
from train_corpus import assert_as_close_as_eager  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("fresh_compile")]


def _fused_on_cuda() -> set:
    """The ops of every compiled region, each region's last call kernels only, on CUDA."""
    regions = [r for g in compiled_graphs() for r in g.regions]
    assert regions
    for r in regions:
        report = dispatch.last_report(r.fusion)
        assert report is not None and report.eager_segments == 0, (r, report)
        assert all(s.backend == "cuda" for s in report.segments if s.kind == "kernel"), report
    return {op for r in regions for op in r.ops}


def _step(f, *xs, grad=None):
    """f's output and its inputs' gradients, through pyfuser and eager, from copies of xs."""
    outs = []
    for compiled in (True, False):
        args = [x.clone().requires_grad_() for x in xs]
        out = (pyfuser.compile(f) if compiled else f)(*args)
        out.backward(torch.ones_like(out) if grad is None else grad)
        outs.append((out.detach(), [a.grad for a in args]))
    return outs


@pytest.mark.parametrize("name,act,op", ACTIVATIONS, ids=[a[0] for a in ACTIVATIONS])
def test_activation_and_its_derivative_on_cuda(name, act, op):
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(257, 129, device="cuda", generator=gen) * 3
    b = torch.randn(129, device="cuda", generator=gen)
    g = torch.randn(257, 129, device="cuda", generator=gen)
    f = lambda t, c: act(t + c) * 2   # noqa: E731
    (out, grads), (want, wgrads) = _step(f, x, b, grad=g)
    assert f"aten.{op}.default" in _fused_on_cuda()
    xd, bd = x.double().requires_grad_(), b.double().requires_grad_()
    oracle = f(xd, bd)
    oracle.backward(g.double())
    assert_as_close_as_eager(out, want, oracle, f"{name} forward")
    for got, w, o, what in zip(grads, wgrads, (xd.grad, bd.grad), ("dx", "dbias")):
        assert_as_close_as_eager(got, w, o, f"{name} {what}")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("name,act,op", ACTIVATIONS, ids=[a[0] for a in ACTIVATIONS])
def test_half_activations_on_cuda_are_eagers_within_a_rounding(name, act, op, dtype):
    """eager's CUDA kernels compute half / bfloat16 in float and round once, as the lowerings
    do: the results agree within one unit in the last place of the dtype (the float math
    functions may round differently, rarely across a half / bfloat16 rounding boundary)."""
    gen = torch.Generator(device="cuda").manual_seed(1)
    x = (torch.randn(64, 96, device="cuda", generator=gen) * 3).to(dtype)
    g = torch.randn(64, 96, device="cuda", generator=gen).to(dtype)
    (out, (dx,)), (want, (wdx,)) = _step(lambda t: act(t) * 1, x, grad=g)
    assert out.dtype == want.dtype == dtype
    ulp = torch.finfo(dtype).eps
    for got, w in ((out, want), (dx, wdx)):
        bound = ulp * w.float().abs().clamp_min(torch.finfo(dtype).tiny)
        diff = (got.float() - w.float()).abs()
        assert (diff <= bound).all(), diff.max()
        assert (got == w).float().mean() > 0.98          # nearly every element eager's bits


def test_log_sigmoid_buffer_is_empty_on_cuda():
    """log_sigmoid_forward on CUDA returns eager's empty buffer; the backward computes exp(-|x|)
    again, as eager's CUDA kernel does."""
    x = torch.tensor([-30.0, -2.0, -0.0, 0.5, 40.0, float("-inf"), float("inf")], device="cuda")
    f = lambda t: torch.ops.aten.log_sigmoid_forward(t * 1)   # noqa: E731
    with torch.no_grad():
        (out, buffer), (want, wbuffer) = pyfuser.compile(f)(x), f(x)
    assert buffer.shape == wbuffer.shape == (0,) and buffer.device == x.device
    torch.testing.assert_close(out, want, rtol=0, atol=0)
    g = torch.randn(7, device="cuda")
    back = lambda t, gg: torch.ops.aten.log_sigmoid_backward(gg, t * 1, wbuffer)   # noqa: E731
    with torch.no_grad():
        torch.testing.assert_close(pyfuser.compile(back)(x, g), back(x, g))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("loss", [
    lambda x, y, r: F.mse_loss(x, y, reduction=r),
    lambda x, y, r: F.smooth_l1_loss(x, y, reduction=r, beta=0.5),
    lambda x, y, r: F.huber_loss(x, y, reduction=r, delta=0.7),
    lambda x, y, r: F.soft_margin_loss(x, y.sign(), reduction=r),
    lambda x, y, r: F.binary_cross_entropy(torch.sigmoid(x), torch.sigmoid(y), reduction=r),
], ids=["mse", "smooth_l1", "huber", "soft_margin", "bce"])
def test_losses_and_their_gradients_on_cuda(loss, reduction):
    gen = torch.Generator(device="cuda").manual_seed(2)
    x = torch.randn(300, 77, device="cuda", generator=gen)
    y = torch.randn(300, 77, device="cuda", generator=gen)
    f = lambda a: loss(a * 1.5, y, reduction)   # noqa: E731
    (out, (dx,)), (want, (wdx,)) = _step(f, x)
    ops = _fused_on_cuda()
    assert any(op.endswith("_backward.default") for op in ops), ops
    xd = x.double().requires_grad_()
    oracle = loss(xd * 1.5, y.double(), reduction)
    oracle.backward(torch.ones_like(oracle))
    assert_as_close_as_eager(out, want, oracle, "loss")
    assert_as_close_as_eager(dx, wdx, xd.grad, "dx")


@pytest.mark.parametrize("fn", [
    lambda x: F.normalize(x, dim=-1) * 3,
    lambda x: torch.linalg.vector_norm(x, ord=1, dim=0),
    lambda x: torch.linalg.vector_norm(x * 2, ord=3.0, dim=1),
    lambda x: F.kl_div(F.log_softmax(x, -1), F.softmax(x * 0.5, -1), reduction="batchmean"),
], ids=["normalize", "ord1", "ord3", "kl_div"])
def test_norms_and_kl_divergence_on_cuda(fn):
    x = torch.randn(513, 96, device="cuda", generator=torch.Generator(device="cuda").manual_seed(3))
    (out, (dx,)), (want, (wdx,)) = _step(fn, x)
    _fused_on_cuda()
    xd = x.double().requires_grad_()
    oracle = fn(xd)
    oracle.backward(torch.ones_like(oracle))
    assert_as_close_as_eager(out, want, oracle, "forward")
    assert_as_close_as_eager(dx, wdx, xd.grad, "dx")
