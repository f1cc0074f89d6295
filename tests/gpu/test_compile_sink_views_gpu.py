"""Group norm + SiLU as one CUDA kernel through torch.compile (lowering/sink_views.py moves the
view back to [N, C, *] past the SiLU; tests/cpu/test_compile_sink_views.py on the CPU): a
diffusion block's sizes against eager in float32 and bfloat16, forward and training step."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import pyfuser
from pyfuser.frontend.fx import compiled_graphs

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
