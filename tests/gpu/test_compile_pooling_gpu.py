"""2-D max pooling through torch.compile on the GPU (frontend/lowering/aten_pooling.py; the CPU
tests: tests/cpu/test_compile_pooling.py)."""
import pytest
import torch

import pyfuser

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("fresh_compile")]
F = torch.nn.functional


@pytest.mark.parametrize("dt", [torch.float32, torch.bfloat16])
def test_max_pool2d_with_indices_forward_and_backward(dt):
    """ResNet's 3 / 2 pool through torch.compile (frontend/lowering/aten_pooling.py): values,
    indices and the input's gradient against eager's on the GPU (NaN and -inf windows, ties)."""
    torch._dynamo.reset()
    g = torch.Generator(device="cuda").manual_seed(4)
    x = torch.randn(4, 64, 56, 56, device="cuda", generator=g).round(decimals=1).to(dt)
    x[0, 0, 3, 3] = float("nan")
    x[1, 1, -3:, -3:] = float("-inf")

    def f(x):
        y, i = F.max_pool2d(torch.relu(x), 3, 2, 1, return_indices=True)
        return y, i
    got, want = pyfuser.compile(f)(x), f(x)
    for a, b in zip(got, want):
        assert a.shape == b.shape and a.dtype == b.dtype
        assert torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num())
    torch._dynamo.reset()
    gy = torch.randn(4, 64, 28, 28, device="cuda", generator=g).to(dt)
    xs = x.nan_to_num().requires_grad_()
    xe = xs.detach().clone().requires_grad_()

    def h(x):
        return (F.max_pool2d(x * 2, 3, 2, 1) * gy).float().sum()
    pyfuser.compile(h)(xs).backward()
    h(xe).backward()
    torch.testing.assert_close(xs.grad.float(), xe.grad.float(), rtol=1e-5, atol=1e-5)
    from pyfuser.frontend.fx import compiled_graphs
    left = [n for cg in compiled_graphs() for n in cg.unsupported if "pool" in n]
    assert not left, left
