"""Autograd through pyfuser.jit: an input that requires grad (grad mode on) makes its group run
eagerly, so outputs require grad exactly when eager's do and backward gives eager's gradients;
under no_grad / inference_mode the same graph fuses."""
from __future__ import annotations

import warnings

import pytest
import torch

import pyfuser
from pyfuser.frontend.torchscript.jit import GRAD_REASON


def act(x, y):
    return torch.sigmoid((x + y).relu() * 2.0) - y


def _check_same(out, ref):
    assert out.requires_grad == ref.requires_grad
    torch.testing.assert_close(out.detach(), ref.detach())


@pytest.mark.parametrize("which", ["x", "y", "both"])
def test_requires_grad_input_keeps_autograd(which):
    f = pyfuser.jit(torch.jit.script(act))
    x0, y0 = torch.randn(4, 5), torch.randn(4, 5)
    xs = [t.clone().requires_grad_(which in (name, "both")) for t, name in ((x0, "x"), (y0, "y"))]
    xr = [t.clone().requires_grad_(which in (name, "both")) for t, name in ((x0, "x"), (y0, "y"))]
    out, ref = f(*xs), act(*xr)
    _check_same(out, ref)
    assert out.grad_fn is not None
    g = torch.randn(4, 5)
    out.backward(g)
    ref.backward(g)
    for a, b in zip(xs, xr):
        if b.requires_grad:
            torch.testing.assert_close(a.grad, b.grad)
    assert f.last_run.eager_groups == 1
    assert f.last_run.fallbacks[-1]["reason"] == GRAD_REASON


@pytest.mark.parametrize("ctx", [torch.no_grad, torch.inference_mode])
def test_no_grad_modes_fuse(ctx):
    f = pyfuser.jit(torch.jit.script(act))
    x, y = torch.randn(4, 5, requires_grad=True), torch.randn(4, 5)
    with ctx():
        out, ref = f(x, y), act(x, y)
    _check_same(out, ref)
    assert not out.requires_grad
    assert f.last_run.kernels == 1 and f.last_run.eager_groups == 0


def test_inputs_without_grad_fuse_and_give_plain_outputs():
    f = pyfuser.jit(torch.jit.script(act))
    x, y = torch.randn(4, 5), torch.randn(4, 5)
    out = f(x, y)
    _check_same(out, act(x, y))
    assert f.last_run.kernels == 1 and f.last_run.eager_groups == 0


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(6, 6)

    def forward(self, x):
        return torch.nn.functional.gelu(self.lin(x)) * 0.5 + x


@pytest.mark.parametrize("how", ["script", "trace"])
def test_module_parameters_that_require_grad(how):
    torch.manual_seed(0)
    m = Mlp()
    x = torch.randn(3, 6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        obj = torch.jit.script(m) if how == "script" else torch.jit.trace(m, (x,))
    f = pyfuser.jit(obj)
    out, ref = f(x), m(x)
    _check_same(out, ref)
    assert out.requires_grad
    out.sum().backward()
    grad_fused = m.lin.weight.grad.clone()
    m.zero_grad()
    m(x).sum().backward()
    torch.testing.assert_close(grad_fused, m.lin.weight.grad)
    with torch.no_grad():                     # the same graph fuses without autograd
        out = f(x)
    assert not out.requires_grad and f.last_run.eager_groups == 0 and f.last_run.kernels >= 1
    torch.testing.assert_close(out, ref.detach())


def makes_a_leaf(x):
    w = torch.ones(3).requires_grad_()
    return (x * 2 + w).sin()


def test_tensor_made_inside_the_graph_with_requires_grad():
    f = pyfuser.jit(torch.jit.script(makes_a_leaf))
    x = torch.randn(3)
    out, ref = f(x), makes_a_leaf(x)
    _check_same(out, ref)
    assert out.requires_grad


class BnNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, bias=False)
        self.bn = torch.nn.BatchNorm2d(4)
        self.drop = torch.nn.Dropout(0.0)

    def forward(self, x):
        return self.drop(torch.relu(self.bn(self.conv(x)) * 2 + 1))


def test_scripted_module_flags_are_folded_and_guarded():
    """`self.training` of a scripted module is a constant of the compiled graph (batch norm in
    eval mode fuses); model.train() is seen on the next call (graph built again), eval() goes
    back to the first graph."""
    import copy
    torch.manual_seed(0)
    m = BnNet().eval()
    ref = copy.deepcopy(m)
    f = pyfuser.jit(torch.jit.script(m))
    x = torch.randn(2, 3, 6, 6)
    with torch.no_grad():
        torch.testing.assert_close(f(x), ref(x))
        assert f.last_run.kernels == 1 and f.last_run.fallbacks == []   # bn + relu + mul + add
        eval_graph = f.graph
        f.module.train()
        ref.train()
        torch.testing.assert_close(f(x), ref(x))                       # batch statistics
        assert f.graph is not eval_graph
        assert f.last_run.kernels == 1 and not any(           # running stats: in place
            fb["kind"] in ("aten::batch_norm", "prim::PyfuserGroup") for fb in f.last_run.fallbacks)
        for (name, b), (_, rb) in zip(m.named_buffers(), ref.named_buffers()):
            torch.testing.assert_close(b, rb, msg=name)                # running stats updated
        f.module.eval()
        ref.eval()
        torch.testing.assert_close(f(x), ref(x))
        assert f.graph is eval_graph and f.last_run.kernels == 1
