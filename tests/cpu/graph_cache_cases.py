"""Shared pieces of the graph cache's tests (test_compile_graph_cache*.py, which use
tests/conftest.py's `graph_cache_on`): a small model, training steps compiled and eager,
comparisons."""
from __future__ import annotations

import torch
import torch.nn.functional as F

import pyfuser
from pyfuser.frontend.fx import graph_cache


class Block(torch.nn.Module):
    """Pointwise ops, a layer norm, a softmax, a residual: forward and backward regions."""

    def __init__(self, d=16, scale=0.5):
        super().__init__()
        self.up = torch.nn.Linear(d, 2 * d)
        self.down = torch.nn.Linear(2 * d, d)
        self.norm = torch.nn.LayerNorm(d)
        self.scale = scale

    def forward(self, x):
        h = F.gelu(self.up(x)) * self.scale
        y = self.norm(x + self.down(h))
        return torch.softmax(y * 2.0, dim=-1) + torch.tanh(y)


class OtherBlock(Block):
    def forward(self, x):
        h = F.silu(self.up(x)) * self.scale           # another op: another graph
        y = self.norm(x + self.down(h))
        return torch.softmax(y * 2.0, dim=-1) + torch.tanh(y)


def _stats():
    return dict(graph_cache.stats)


def _steps(model, fn, x, steps):
    """Forward (no grad) through `fn`, then `steps` SGD steps of `model` through it: outputs,
    losses, gradients, parameters."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torch.no_grad():
        fwd = fn(x).clone()
    losses, grads = [], []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = (fn(x) ** 2).mean()
        loss.backward()
        grads.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
        opt.step()
        losses.append(loss.detach())
    return fwd, losses, grads, [p.detach().clone() for p in model.parameters()]


def _train(model, x, steps=2):
    """_steps through torch.compile with pyfuser's backend."""
    return _steps(model, torch.compile(model, backend=pyfuser.backend), x, steps)


def _eager(model, x, steps=2):
    return _steps(model, model, x, steps)


def _same(a, b, exact=False):
    fa, la, ga, pa = a
    fb, lb, gb, pb = b
    tol = dict(rtol=0, atol=0) if exact else dict(rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(fa, fb, **tol)
    for x, y in zip(la, lb):
        torch.testing.assert_close(x, y, **tol)
    for gx, gy in zip(ga, gb):
        for x, y in zip(gx, gy):
            torch.testing.assert_close(x, y, **tol)
    for x, y in zip(pa, pb):
        torch.testing.assert_close(x, y, **tol)


def _model(cls=Block, seed=0, **kw):
    torch.manual_seed(seed)
    return cls(**kw)
