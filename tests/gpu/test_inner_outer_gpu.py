"""The inner_outer_persistent kernel on a GPU: a layer norm's backward (dx, dweight, dbias) is one
kernel launch, equal to eager's CUDA kernels within the tolerances of docs/reductions.md, at
full size (4096 x 768, 8192 x 3072) and on odd / small shapes, bit-identical from run to run
(no floating-point atomics), and its semaphores left zero (many calls in a row); a row too long
for the chip runs as two kernels."""
from __future__ import annotations

import copy

import pytest
import torch

import pyfuser
from pyfuser.frontend.fx import compiled_graphs, reset_compiled
from pyfuser.runtime import dispatch

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.delenv("PYFUSER_INNER_OUTER", raising=False)   # on by default (schedule/inner_outer.py)
    monkeypatch.setenv("PYFUSER_POISON_OUTPUTS", "1")     # unwritten elements show as NaN
    torch._dynamo.reset()
    reset_compiled()
    yield
    torch._dynamo.reset()


def _close(got, want, dtype, name):
    """float32: rtol 1e-5 and a sum's 2^-20 (1 + sqrt(n)) of the scale; bfloat16: 1.6e-2 and
    two bfloat16 roundings of the scale (eager also computes in float32 and rounds once)."""
    assert got.dtype == want.dtype and got.shape == want.shape, name
    scale = max(want.float().abs().max().item(), 1.0)
    n = 8192
    atol = (2 ** -20 * (1 + n ** 0.5) * scale) if dtype == torch.float32 else 2 * 2 ** -8 * scale
    rtol = 1e-5 if dtype == torch.float32 else 1.6e-2
    torch.testing.assert_close(got.float(), want.float(), rtol=rtol, atol=atol, msg=name)


def _step(shape, dtype, bias=True, seed=0):
    torch.manual_seed(seed)
    ln = torch.nn.LayerNorm(shape[-1], bias=bias, device="cuda")
    with torch.no_grad():
        ln.weight.normal_()
        if bias:
            ln.bias.normal_()
    ln = ln.to(dtype)
    ref = copy.deepcopy(ln)
    x = torch.randn(*shape, device="cuda").to(dtype)
    gy = torch.randn(*shape, device="cuda").to(dtype)
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    pyfuser.compile(ln)(a).backward(gy)
    ref(b).backward(gy)
    got = {"dx": a.grad, "dweight": ln.weight.grad}
    want = {"dx": b.grad, "dweight": ref.weight.grad}
    if bias:
        got["dbias"], want["dbias"] = ln.bias.grad, ref.bias.grad
    return got, want


def _region():
    bw = [g for g in compiled_graphs() if g.kind == "backward"]
    return next(r for r in bw[0].regions if "aten.native_layer_norm_backward.default" in r.ops)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("shape", [(4096, 768), (8192, 3072), (5, 7, 23), (1, 33), (1000, 40),
                                   (333, 1024)])
def test_layer_norm_backward_one_launch(shape, dtype):
    got, want = _step(shape, dtype)
    for k in want:
        _close(got[k], want[k], dtype, k)
    region = _region()
    assert region.kernels() == 1          # launched on CUDA
    report = dispatch.last_report(region.fusion)
    assert [s.scheduler for s in report.segments if s.kind == "kernel"] == ["inner_outer_persistent"]


def test_weight_without_bias():
    got, want = _step((2048, 1024), torch.float32, bias=False)
    for k in want:
        _close(got[k], want[k], torch.float32, k)
    assert _region().kernels() == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_bit_identical_runs_and_semaphores_left_zero(dtype):
    """The same inputs, 20 calls of the compiled backward: the same bits every time (a
    semaphore left non-zero would make a later call finish early or hang)."""
    m, n = 4096, 768
    torch.manual_seed(0)
    x = torch.randn(m, n, device="cuda").to(dtype)
    dy = torch.randn(m, n, device="cuda").to(dtype)
    w, b = torch.randn(n, device="cuda").to(dtype), torch.randn(n, device="cuda").to(dtype)
    _, mean, rstd = torch.native_layer_norm(x, [n], w, b, 1e-5)

    def f(dy, x, mean, rstd, w, b):
        return torch.ops.aten.native_layer_norm_backward(dy, x, [768], mean, rstd, w, b,
                                                         [True, True, True])
    fused = pyfuser.jit(torch.jit.script(f))
    with torch.no_grad():
        first = [t.clone() for t in fused(dy, x, mean, rstd, w, b)]
        for _ in range(20):
            again = fused(dy, x, mean, rstd, w, b)
            for p, q in zip(first, again):
                assert torch.equal(p, q)
    assert fused.last_run.kernels == 1
    for g, e in zip(first, f(dy, x, mean, rstd, w, b)):
        _close(g, e, dtype, "aten")


def test_row_too_long_runs_as_two_kernels():
    got, want = _step((64, 65536), torch.float32)
    for k in want:
        _close(got[k], want[k], torch.float32, k)
    assert _region().kernels() == 2
