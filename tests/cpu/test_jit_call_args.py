"""pyfuser.jit functions are called as the Python / TorchScript function they came from:
keywords by name, defaults filled in, and Python's errors for bad calls (one line, naming the
argument)."""
from __future__ import annotations

from typing import Optional

import pytest
import torch

import pyfuser
from pyfuser.errors import PyfuserError


def _rms(x, w, eps: float = 1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _scaled(x, scale: Optional[float] = None, shift: int = 1):
    y = x + shift
    if scale is not None:
        y = y * scale
    return y


class _Module(torch.nn.Module):
    def forward(self, x, k: int = 3, alpha: float = 0.5):
        return torch.relu(x * k) + alpha


@pytest.fixture
def xs():
    g = torch.Generator().manual_seed(0)
    return torch.randn(4, 8, generator=g), torch.randn(8, generator=g)


@pytest.mark.parametrize("how", ["script", "python"])
def test_defaults_and_keywords_of_a_function(xs, how):
    x, w = xs
    f = pyfuser.jit(torch.jit.script(_rms) if how == "script" else _rms)
    with torch.no_grad():
        torch.testing.assert_close(f(x, w), _rms(x, w))
        torch.testing.assert_close(f(x, w, eps=1e-2), _rms(x, w, 1e-2))
        torch.testing.assert_close(f(x, w=w, eps=0.5), _rms(x, w, 0.5))
        torch.testing.assert_close(f(w=w, x=x), _rms(x, w))
    assert f.last_run.groups >= 1 and f.last_run.eager_groups == 0


def test_optional_default_none_takes_its_branch(xs):
    x, _ = xs
    f = pyfuser.jit(torch.jit.script(_scaled))
    with torch.no_grad():
        torch.testing.assert_close(f(x), _scaled(x))
        torch.testing.assert_close(f(x, 2.0), _scaled(x, 2.0))
        torch.testing.assert_close(f(x, shift=3), _scaled(x, None, 3))


def test_defaults_of_a_scripted_module_forward(xs):
    x, _ = xs
    m = _Module()
    f = pyfuser.jit(torch.jit.script(m))
    with torch.no_grad():
        torch.testing.assert_close(f(x), m(x))
        torch.testing.assert_close(f(x, alpha=2.0), m(x, alpha=2.0))
        torch.testing.assert_close(f(x, 5), m(x, 5))


@pytest.mark.parametrize("call, message", [
    (lambda f, x, w: f(x), "missing required argument 'w'"),
    (lambda f, x, w: f(x, w, 1e-3, 4), "takes 3 arguments, got 4"),
    (lambda f, x, w: f(x, w, epsilon=1e-3), "unexpected keyword argument 'epsilon'"),
    (lambda f, x, w: f(x, w, x=x), "multiple values for argument 'x'"),
])
def test_bad_calls_name_the_argument(xs, call, message):
    x, w = xs
    f = pyfuser.jit(torch.jit.script(_rms))
    with pytest.raises(PyfuserError, match=message) as e:
        call(f, x, w)
    assert "\n" not in str(e.value)


def test_ir_text_takes_positional_arguments_only(xs):
    x, _ = xs
    f = pyfuser.jit("graph(%x : Tensor):\n  %y : Tensor = aten::relu(%x)\n  return (%y)")
    torch.testing.assert_close(f(x), torch.relu(x))
    with pytest.raises(PyfuserError, match="positional arguments only"):
        f(x=x)
