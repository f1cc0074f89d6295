"""GPU twin of the CPU tests of stepped slices, size floats and crops through the torch.compile
backend (tests/cpu/test_compile_dynamic_slices.py, test_compile_dynamic_scalars.py,
test_compile_dynamic_backward_pads.py): an interleaved rotary (x[..., ::2], x[..., 1::2]) with
its gradient, a softmax scaled by 1 / sqrt(size), a crop (a negative pad) and a sum of a stepped
slice, with static and dynamic shapes at three sizes on CUDA, against eager."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import pyfuser

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("fresh_compile"),
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def rotary(x):
    a, b = x[..., ::2], x[..., 1::2]
    return torch.stack((-b, a), -1).flatten(-2) * 0.5 + x


def scaled_softmax(x):
    return torch.softmax(x / math.sqrt(x.shape[-1]), -1)


def crop(x):
    return F.pad(x, (-1, -2)) * 2


def stepped_sum(x):
    return x[:, ::3].sum(-1)


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("fn", [rotary, scaled_softmax, crop, stepped_sum],
                         ids=lambda f: f.__name__)
def test_stepped_slices_size_floats_and_crops_on_cuda(fn, dynamic):
    cf = pyfuser.compile(fn, dynamic=dynamic)
    for n in (64, 100, 256):
        x = torch.randn(8, 33, n, device="cuda", requires_grad=fn is rotary)
        got, want = cf(x), fn(x)
        assert got.shape == want.shape and got.dtype == want.dtype
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        if fn is rotary:
            g_got, = torch.autograd.grad(got.square().sum(), x)
            g_want, = torch.autograd.grad(want.square().sum(), x)
            torch.testing.assert_close(g_got, g_want, rtol=1e-4, atol=1e-4)
