"""The torch.compile backend's factories shaped like a tensor (lowering/aten_factory_like.py):
`zeros_like`, `ones_like`, `full_like`, `empty_like`, `new_empty`, `new_empty_strided` and the
functional `fill` (`t.fill_(v)`, `t[:, 0] = v` of a 0-dim tensor) fuse as constants with eager's
values, dtypes, shapes and strides (a transposed or channels-last input's `preserve_format`,
size-0 and odd sizes, bfloat16, symbolic sizes); every region runs as kernels compiled for
sm_90; the cases eager refuses or pyfuser cannot write (strides with gaps) stay aten calls
with their reason. GPU twins: tests/gpu/test_fusion_gaps_gpu.py."""
from __future__ import annotations

import pytest
import torch

import pyfuser
from pyfuser.frontend.fx import compiled_graphs

from compile_checks import assert_ran_as_sm90_kernels

pytestmark = pytest.mark.usefixtures("fresh_compile")
bf16 = torch.bfloat16


def strides(t: torch.Tensor) -> list:
    """t's strides where they say something: axes of more than one element, of a non-empty t."""
    return [s for s, n in zip(t.stride(), t.shape) if n > 1] if t.numel() else []


def equal(got, want) -> None:
    for k, (g, w) in enumerate(zip(got, want)):
        assert (g.dtype, g.shape, strides(g)) == (w.dtype, w.shape, strides(w)), k
        assert torch.equal(g, w), k


def _check(f, *args, dynamic=False):
    """f through pyfuser equals eager bit for bit (values, dtypes, shapes, strides); returns the
    one compiled graph, whose regions ran as sm_90 kernels."""
    with torch.no_grad():
        got, want = pyfuser.compile(f, dynamic=dynamic)(*args), f(*args)
    equal(got, want)
    graph = compiled_graphs()[-1]
    assert_ran_as_sm90_kernels(graph.regions)
    return graph


def _ops(graph) -> list:
    return [op for r in graph.regions for op in r.ops]


def _likes(x, m):
    return (torch.zeros_like(x) + x,
            torch.ones_like(x, dtype=bf16) * x.to(bf16),
            torch.full_like(m, 7) * 2,
            torch.full_like(x, -2.7, dtype=torch.int64) + m[:1, :1],   # truncated, as eager
            torch.full_like(m, True, dtype=torch.bool) & (m > 2),
            torch.empty_like(x).zero_() - x,
            torch.zeros_like(x.t()) + 1,                               # eager's transposed strides
            x.new_empty((x.shape[0], 2)).fill_(2.5) + x[:, :1])


@pytest.mark.parametrize("shape", [(3, 5), (1, 7), (0, 4)])
def test_like_factories_fuse_with_eagers_values_dtypes_and_strides(shape):
    x = torch.randn(*shape)
    m = torch.randint(0, 5, shape)
    graph = _check(_likes, x, m)
    assert not graph.unsupported, graph.unsupported
    ops = _ops(graph)
    for op in ("zeros_like", "ones_like", "full_like", "empty_like", "new_empty", "fill"):
        assert any(o.startswith(f"aten.{op}.") for o in ops), op


def test_like_factories_of_a_non_contiguous_input_and_a_memory_format():
    """preserve_format keeps a permuted input's order (the region copies the row-major kernel
    output into it); channels_last and contiguous_format are taken from any input."""
    x = torch.randn(2, 3, 4, 5).permute(0, 2, 3, 1)[:, ::2]

    def f(x):
        return (torch.zeros_like(x) + x, torch.ones_like(x, memory_format=torch.channels_last),
                torch.full_like(x, 3.0, memory_format=torch.contiguous_format) * x)
    graph = _check(f, x)
    assert not graph.unsupported, graph.unsupported


def test_fill_with_a_0_dim_tensor_and_t5s_shifted_inputs_are_one_region():
    """T5's `_shift_right`: new_zeros, the labels written one to the right (slice_scatter), the
    start token written at 0 (fill of a 0-dim constant, select_scatter), -100 replaced: the
    constant's lift_fresh_copy, the fill and both scatters fuse (they were 5 aten calls)."""
    def shift_right(labels):
        shifted = labels.new_zeros(labels.shape)
        shifted[..., 1:] = labels[..., :-1].clone()
        shifted[..., 0] = torch.tensor(0)
        shifted.masked_fill_(shifted == -100, 0)
        return (shifted, torch.ones_like(labels, dtype=torch.float32).fill_(torch.tensor(1.5)))
    labels = torch.randint(-100, 30, (2, 9))
    graph = _check(shift_right, labels)
    assert not graph.unsupported, graph.unsupported
    assert len(graph.regions) == 1
    assert {"aten.fill.Tensor", "aten.slice_scatter.default",
            "aten.select_scatter.default"} <= set(_ops(graph))


def test_like_factories_under_symbolic_sizes():
    def f(x):
        return torch.zeros_like(x) + x * 2, torch.full_like(x, 0.5, dtype=bf16) + 1
    cf = pyfuser.compile(f, dynamic=True)
    for n in (3, 5, 8):
        x = torch.randn(n, 6)
        with torch.no_grad():
            equal(cf(x), f(x))
    (graph,) = compiled_graphs()
    assert not graph.unsupported and all(r.eager_calls == 0 for r in graph.regions)


def test_new_empty_strided_with_other_strides_stays_eager():
    """Only the row-major strides of the sizes are written by a kernel: strides with gaps stay
    the aten call, with the reason."""
    def f(x):
        a = torch.ops.aten.new_empty_strided(x, [3, 4], [8, 2]).zero_()
        b = torch.ops.aten.new_empty_strided(x, [3, 4], [4, 1]).zero_()
        return a * x, b + x
    x = torch.randn(3, 4)
    with torch.no_grad():
        got = pyfuser.compile(f)(x)
    assert torch.equal(got[0], x * 0) and torch.equal(got[1], x)
    (graph,) = compiled_graphs()
    assert any("new_empty_strided with strides other than" in r
               for r in graph.unsupported.values()), graph.unsupported
