"""Traced views, reshapes, permutes and expands fuse as scripted ones do: size lists made of
constants or of `aten::size` results enter the groups (the group is specialised on their
values), and view / expand lowering keeps every size."""
from __future__ import annotations

import warnings

import pytest
import torch

import pyfuser
from pyfuser.frontend.torchscript.jit import MAX_VARIANTS

import segment_cases as C

MODES = ["evaluator", "interpret"]


def _trace(fn, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.jit.trace(fn, args, check_trace=False)


def _gelu_two(x):
    t1 = x.view(4, 16, 48)
    t9 = (t1 * 0.5) * (torch.erf(t1 * 0.707107) + 1.0)
    return t1, t9.view(64, 48)


def _transpose(x):              # fd.ops.set of the permuted view is eager's contiguous()
    return x.view(2, 12, 8, 4).permute(0, 2, 1, 3).contiguous().view(2, 8, 48).view(16, 48)


# Seed 002's FusionDefinitions written as eager code (segment_cases builds the FD forms).
SEED002 = [("gelu_bookend_views", C.gelu_eager, (64, 48), 1),
           ("gelu_two_outputs", _gelu_two, (64, 48), 1),
           ("gelu_view_between_ops", C.gelu_mid_view_eager, (64, 48), 1),
           ("transpose_bookend_views", _transpose, (24, 8, 4), 1),
           ("views_only", lambda x: C.views_only_eager(x)[0], (64, 48), 0)]
SEED002 += [(f"sequential_{''.join('v' if k else '-' for k in keep)}",
             (lambda keep: lambda x: C.sequential_eager(x, keep))(keep), (64, 48), 1)
            for keep in C.ALL_KEEPS]


def _tuple(x):
    return x if isinstance(x, tuple) else (x,)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("as_graph", [False, True], ids=["traced", "traced.graph"])
@pytest.mark.parametrize("name, fn, shape, kernels", SEED002, ids=[c[0] for c in SEED002])
def test_seed002_traced_forms_fuse(name, fn, shape, kernels, as_graph, mode):
    x = torch.randn(shape)
    traced = _trace(fn, x)
    f = pyfuser.jit(traced.graph if as_graph else traced, cpu_executor=mode)
    got, ref = _tuple(f(x.clone())), _tuple(fn(x.clone()))
    for g, r in zip(got, ref):
        assert g.shape == r.shape and g.dtype == r.dtype
        torch.testing.assert_close(g, r, rtol=1e-6, atol=1e-6)
    assert f.last_run.groups == 1, str(f.graph)
    assert f.last_run.eager_groups == 0, f.last_run.fallbacks
    assert f.last_run.kernels == kernels


def _view_from_sizes(x, y):
    b, s = x.size(0), x.size(1)
    return (torch.relu(x.reshape(b * s, -1)) * 2).view(b, s, -1) + y


@pytest.mark.parametrize("mode", MODES)
def test_sizes_from_the_host_are_specialised_per_value(mode):
    x, y = torch.randn(2, 3, 4), torch.randn(4)
    f = pyfuser.jit(_trace(_view_from_sizes, x, y), cpu_executor=mode)
    # one group: the traced size arithmetic (b * s on prim::NumToTensor results) stays on the host
    assert f.last_run.groups == 1, str(f.graph)
    runner = next(iter(f.runners.values()))
    assert runner.special                       # the group takes the sizes as host ints
    for shape in [(2, 3, 4), (5, 3, 4), (2, 3, 4), (5, 3, 4)]:
        x = torch.randn(shape)
        torch.testing.assert_close(f(x, y), _view_from_sizes(x, y))
        assert f.last_run.kernels == 1 and f.last_run.eager_groups == 0
    assert len(runner.variants) == 2            # one lowering per size, reused


def test_too_many_specialisations_run_eagerly_with_the_reason():
    x, y = torch.randn(2, 3, 4), torch.randn(4)
    f = pyfuser.jit(_trace(_view_from_sizes, x, y))
    for b in range(2, MAX_VARIANTS + 4):
        x = torch.randn(b, 3, 4)
        torch.testing.assert_close(f(x, y), _view_from_sizes(x, y))
    assert f.last_run.eager_groups == 1
    assert "specialisations" in f.last_run.fallbacks[-1]["reason"]


# ----- the repros of the issue --------------------------------------------------------------
def view_then_expand(x):
    v = x.view([3, -1])
    return (v * x).expand([-1, 2])


def reshape_expand_view(x):
    return torch.tanh(x.reshape([3, 1]).expand([2, 3, 2])).view([12])


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("how", ["script", "trace"])
def test_expand_of_an_axis_the_fusion_holds_as_full_is_never_wrong(how, mode):
    x = torch.randn(3, 1)
    obj = torch.jit.script(view_then_expand) if how == "script" else _trace(view_then_expand, x)
    f = pyfuser.jit(obj, cpu_executor=mode)
    out, ref = f(x), view_then_expand(x)
    assert out.shape == ref.shape == (3, 2) and out.stride() == ref.stride()
    assert torch.equal(out, ref)
    # the view's -1 axis was not known to be 1: that call ran eagerly, saying why
    assert f.last_run.eager_groups == 1
    assert "expand" in f.last_run.fallbacks[-1]["reason"]
    x2 = torch.randn(3, 2)                     # full axis of size 2: fused, no broadcast
    if how == "script":
        assert torch.equal(f(x2), view_then_expand(x2))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("how", ["script", "trace"])
def test_view_of_an_expanded_tensor_keeps_the_expanded_sizes(how, mode):
    x = torch.randn(3, 1)
    obj = torch.jit.script(reshape_expand_view) if how == "script" else \
        _trace(reshape_expand_view, x)
    f = pyfuser.jit(obj, cpu_executor=mode)
    out = f(x)
    assert torch.equal(out, reshape_expand_view(x))
    assert f.last_run.kernels == 1 and f.last_run.eager_groups == 0, f.last_run.fallbacks


def expanded_output(x):
    return (x * 3).expand(3, 4)


@pytest.mark.parametrize("mode", MODES)
def test_expanded_output_is_a_stride0_view_like_eager(mode):
    x = torch.randn(3, 1)
    f = pyfuser.jit(torch.jit.script(expanded_output), cpu_executor=mode)
    out, ref = f(x), expanded_output(x)
    assert out.stride() == ref.stride() == (1, 0)
    assert torch.equal(out, ref)
    assert f.last_run.eager_groups == 0


def flatten_inner(x):               # ViT's patch embedding: conv output [B, C, h, w] -> [B, C, hw]
    return (x.flatten(2) * 2).transpose(1, 2) + 1


@pytest.mark.parametrize("mode", MODES)
def test_flatten_keeps_symbolic_outer_sizes(mode):
    f = pyfuser.jit(torch.jit.script(flatten_inner), cpu_executor=mode)
    for shape in [(2, 3, 4, 5), (3, 4, 5, 6)]:
        x = torch.randn(shape)
        assert torch.equal(f(x), flatten_inner(x))
        assert f.last_run.kernels == 1 and f.last_run.eager_groups == 0, f.last_run.fallbacks
