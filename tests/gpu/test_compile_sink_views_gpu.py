"""Group norm + SiLU as one CUDA kernel through torch.compile (lowering/sink_views.py moves the
view back to [N, C, *] past the SiLU; tests/cpu/test_compile_sink_views.py on the CPU): a
diffusion block's sizes against eager in float32 and bfloat16, forward and training step; and
group norm's backward as pyfuser's kernels."""
from __future__ import annotations

import copy
import os
import sys

import pytest
import torch
import torch.nn.functional as F

import pyfuser
from pyfuser.frontend.fx import compiled_graphs

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "cpu"))
from train_corpus import assert_as_close_as_eager  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("fresh_compile")]


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.bfloat16, 2e-2)])
def test_group_norm_silu_one_kernel_on_cuda(dtype, tol):
    x = torch.randn(4, 128, 32, 32, device="cuda", dtype=dtype)
    w = torch.randn(128, device="cuda", dtype=dtype)
    b = torch.randn(128, device="cuda", dtype=dtype)

    def f(x, w, b):
        return F.silu(F.group_norm(x, 32, w, b, 1e-5))
    with torch.no_grad():
        got, want = pyfuser.compile(f)(x, w, b), f(x, w, b)
    torch.cuda.synchronize()
    assert got.dtype == want.dtype and got.stride() == want.stride()
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    (graph,) = compiled_graphs()
    assert sum(r.kernels() for r in graph.regions) == 1


def test_group_norm_silu_training_step_on_cuda():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.GroupNorm(8, 64), torch.nn.SiLU(),
                            torch.nn.Conv2d(64, 64, 3, padding=1)).cuda()
    x = torch.randn(2, 64, 16, 16, device="cuda", requires_grad=True)
    got = pyfuser.compile(m)(x)
    want = m(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    g, = torch.autograd.grad(got.square().sum(), x)
    w, = torch.autograd.grad(want.square().sum(), x)
    torch.cuda.synchronize()
    torch.testing.assert_close(g, w, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_group_norm_backward_fused_on_cuda(dtype):
    """native_group_norm_backward as pyfuser's kernels (dx; dweight and dbias) at a diffusion
    block's sizes: each gradient as close to eager in float64 as eager in `dtype` is (within a
    factor 4, tests/cpu/train_corpus.py)."""
    torch.manual_seed(0)
    gn = torch.nn.GroupNorm(32, 128).cuda()
    with torch.no_grad():
        gn.weight.normal_()
        gn.bias.normal_()
    mods = [copy.deepcopy(gn).to(dtype), copy.deepcopy(gn).to(dtype), copy.deepcopy(gn).double()]
    x = torch.randn(4, 128, 32, 32, device="cuda")
    xs = [x.to(dtype).clone().requires_grad_() for _ in range(2)] + [x.double().requires_grad_()]
    outs = [pyfuser.compile(mods[0])(xs[0]), mods[1](xs[1]), mods[2](xs[2])]
    dy = torch.randn(outs[2].shape, device="cuda", dtype=torch.float64)
    for o in outs:
        o.backward(dy.to(o.dtype))
    torch.cuda.synchronize()
    assert_as_close_as_eager(*(t.grad for t in xs), "dx")
    for name in ("weight", "bias"):
        assert_as_close_as_eager(*(getattr(m, name).grad for m in mods), name)
    bw = [g for g in compiled_graphs() if g.kind == "backward"]
    assert bw and not bw[-1].unsupported, bw[-1].report()
    assert any("aten.native_group_norm_backward.default" in r.ops for r in bw[-1].regions)
