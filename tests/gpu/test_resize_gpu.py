"""Slice / cat / pad and the iota-compared nll_loss gradient as CUDA kernels (their CPU tests:
tests/cpu/test_resize_fusion.py, test_compile_training.py), and dropout kernels through the
cached-call replay: every call a new mask, the same masks for the same seed."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import pyfuser
from pyfuser.frontend.fx import compiled_graphs
from pyfuser.runtime import dispatch

from test_compile_gpu import _fresh  # noqa: F401  (autouse: a fresh Dynamo and graph list)

pytestmark = pytest.mark.gpu


def _rotary(q, k, cos, sin):
    def rot(x):
        h = x.shape[-1] // 2
        return torch.cat((-x[..., h:], x[..., :h]), dim=-1)
    return q * cos + rot(q) * sin, k * cos + rot(k) * sin


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotary_forward_and_backward_on_cuda(dtype):
    torch.manual_seed(0)
    q = torch.randn(2, 4, 33, 64, device="cuda", dtype=dtype, requires_grad=True)
    k = torch.randn(2, 2, 33, 64, device="cuda", dtype=dtype, requires_grad=True)
    cos, sin = (torch.randn(33, 64, device="cuda", dtype=dtype) for _ in range(2))
    got = pyfuser.compile(_rotary)(q, k, cos, sin)
    want = _rotary(q, k, cos, sin)
    for g, w in zip(got, want):
        assert torch.equal(g, w)                  # no arithmetic changed: only which element
    g1 = torch.autograd.grad(sum(x.float().sum() * (i + 1) for i, x in enumerate(got)), (q, k))
    g2 = torch.autograd.grad(sum(x.float().sum() * (i + 1) for i, x in enumerate(want)), (q, k))
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b)
    regions = [r for g in compiled_graphs() for r in g.regions]
    assert regions and all(r.eager_calls == 0 for r in regions)
    ops = {op for r in regions for op in r.ops}
    assert {"aten.cat.default", "aten.slice_backward.default"} <= ops


def test_cross_entropy_gradient_on_cuda():
    torch.manual_seed(1)
    x = torch.randn(64, 1000, device="cuda", requires_grad=True)
    t = torch.randint(0, 1000, (64,), device="cuda")
    t[::7] = -100
    f = pyfuser.compile(lambda x: F.cross_entropy(x * 1.5, t))
    (ga,) = torch.autograd.grad(f(x), x)
    (gb,) = torch.autograd.grad(F.cross_entropy(x * 1.5, t), x)
    torch.testing.assert_close(ga, gb)
    # nll_loss_backward and the log_softmax backward, decomposed by the backend: one kernel
    bw = [g for g in compiled_graphs() if g.kind == "backward"]
    (ce,) = [r for g in bw for r in g.regions if "aten.where.self" in r.ops]
    assert {"aten.arange.default", "aten.eq.Tensor", "aten.exp.default"} <= set(ce.ops)
    assert ce.kernels() == 1 and not [n for g in bw for n in g.unsupported]


def test_dropout_replays_draw_new_masks_and_repeat_with_the_seed():
    x = torch.ones(4096, device="cuda")
    f = pyfuser.compile(lambda x: F.dropout(x, 0.5, training=True) * 2)
    torch.manual_seed(3)
    first = [f(x) for _ in range(4)]
    torch.manual_seed(3)
    again = [f(x) for _ in range(4)]
    for a, b in zip(first, again):
        assert torch.equal(a, b)                  # the seed repeats the run
    masks = [(m != 0) for m in first]
    assert all(not torch.equal(masks[0], m) for m in masks[1:])   # each call a new mask
    keep = torch.stack(masks).float().mean().item()
    assert 0.45 < keep < 0.55
    region = next(r for g in compiled_graphs() for r in g.regions)
    ex = dispatch.get_executor(region.fusion)
    assert ex.last_run["cache_hit"]               # the replayed fast call
