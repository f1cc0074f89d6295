"""Slices, pads and cats inside reduction-family kernels (schedule/reduction_resize.py): GPT-2's
q / k / v gradient `cat` along the hidden axis and the bias gradient's sum over the tokens are
one reduction kernel writing the cat and the sum (two kernels before: the cat's pointwise
kernel, and a reduction reading the cat back); a sum of a cat that is not returned reads the
operands directly; pads and slices likewise; inner and outer normalizations over a cat along
kept axes. Run through the CPU interpreter against eager (float32 and bfloat16, float32
accumulation; odd sizes that keep one element a vector, even ones that take vectors;
non-contiguous operands), the kernel count asserted, and every kernel compiled by NVRTC for
sm_90 (the executor compiles each kernel before the interpreter runs it:
test_compile_training.assert_ran_as_sm90_kernels). Pads and cats along the reduced axes are
refused with the reason, and run as before."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import pyfuser
from pyfuser.codegen import api
from pyfuser.frontend.fx import compiled_graphs
from pyfuser.ir import DataType, Fusion
from pyfuser.ir import builder as B
from pyfuser.runtime import dispatch, nvrtc
from pyfuser.schedule import reduction as RED

from test_compile_training import assert_ran_as_sm90_kernels

pytestmark = pytest.mark.usefixtures("fresh_compile")

DTYPES = [torch.float32, torch.bfloat16]


def _close(got, want, n: int):
    """docs/reductions.md's tolerances: a sum of n elements within 2^-20 (1 + sqrt(n)) of the
    scale in float32, 64 times that in bfloat16 (rtol 1.6e-2); values that are only moved (a
    cat, a pad, a slice) bit-equal."""
    assert got.dtype == want.dtype and got.shape == want.shape, (got.shape, want.shape)
    scale = max(want.float().abs().max().item() if want.numel() else 1.0, 1.0)
    atol = 2 ** -20 * (1 + n ** 0.5) * scale
    rtol = 1e-5
    if want.dtype == torch.bfloat16:
        atol, rtol = max(64 * atol, 2 ** -8 * scale), 1.6e-2
    torch.testing.assert_close(got.float(), want.float(), rtol=rtol, atol=atol)


def _run(f, *args, n: int = 1, exact=()):
    """f compiled and eagerly (no grad): outputs in `exact` (their positions) bit-equal, the
    others within a sum of n elements; returns the schedulers of the one region's kernels (all
    compiled by NVRTC for sm_90 and run by the interpreter)."""
    with torch.no_grad():
        got = pyfuser.compile(f)(*args)
        want = f(*args)
    got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
    for i, (g, w) in enumerate(zip(got, want)):
        if i in exact:
            assert g.dtype == w.dtype and g.shape == w.shape and torch.equal(g, w), i
        else:
            _close(g, w, n)
    regions = [r for g in compiled_graphs() for r in g.regions]
    assert_ran_as_sm90_kernels(regions)
    (region,) = regions
    report = dispatch.last_report(region.fusion)
    return [s.scheduler for s in report.segments if s.kind == "kernel"]


def _qkv(shapes, dtype, gen=None):
    gen = gen or torch.Generator().manual_seed(0)
    return [torch.randn(*s, generator=gen).to(dtype) for s in shapes]


# ---- GPT-2's cat of the q / k / v gradients and the bias gradient ---------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "bf16"])
@pytest.mark.parametrize("shapes", [[(2, 8, 32)] * 3, [(3, 5, 7), (3, 5, 9), (3, 5, 6)]],
                         ids=["even", "odd"])
def test_cat_and_its_sum_over_the_tokens_are_one_kernel(dtype, shapes):
    """cat along the hidden axis, returned (a matmul reads it) and summed over batch and
    tokens: one reduction kernel writing both (the cat bit-equal to eager's)."""
    def f(q, k, v):
        c = torch.cat([q, k, v], -1)
        return c, c.sum((0, 1))
    xs = _qkv(shapes, dtype)
    assert _run(f, *xs, n=shapes[0][0] * shapes[0][1], exact=(0,)) == ["reduction"]


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "bf16"])
def test_sum_of_a_cat_reads_the_operands(dtype):
    """The cat is not returned: the kernel reads q, k and v where the cat's elements lie, and
    writes only the sums."""
    def f(q, k, v):
        return torch.cat([q * 2, k, v.float()], -1).sum((0, 1))
    xs = _qkv([(3, 5, 4), (3, 5, 12), (3, 5, 8)], dtype)
    assert _run(f, *xs, n=15) == ["reduction"]


def test_gpt2_c_attn_backward_cat_views_and_bias_gradient():
    """The region of GPT-2's Conv1D c_attn backward: the attention backward's q / k / v
    gradients [B, T, H, D] viewed [B, T, H * D] (host views), their cat along the last axis
    viewed [B * T, 3C] for the weight gradient's matmul (aten), and the bias gradient's sum
    over the tokens: one kernel."""
    def f(dq, dk, dv, x):
        c = torch.cat([t.reshape(2, 8, 32) for t in (dq, dk, dv)], -1)
        return x.t() @ c.view(16, 96), c.sum((0, 1))
    xs = _qkv([(2, 8, 4, 8)] * 3, torch.float32) + [torch.randn(16, 32)]
    with torch.no_grad():
        got = pyfuser.compile(f)(*xs)
        want = f(*xs)
    for g, w in zip(got, want):
        _close(g, w, 16)
    regions = [r for g in compiled_graphs() for r in g.regions]
    assert_ran_as_sm90_kernels(regions)
    assert [r.kernels() for r in regions] == [1], [r.kernels() for r in regions]
    (seg,) = [s for s in dispatch.last_report(regions[0].fusion).segments if s.kind == "kernel"]
    assert seg.scheduler == "reduction"


def test_non_contiguous_operands():
    """A transposed operand and a sliced one (strides of their own, no vectors along a
    transposed axis): eager's values, one kernel."""
    def f(a, b):
        c = torch.cat([a.transpose(0, 1), b[:, :, 1:6]], -1)
        return c, c.sum((0, 1))
    a, b = torch.randn(5, 3, 4), torch.randn(3, 5, 8)
    assert _run(f, a, b, n=15, exact=(0,)) == ["reduction"]


# ---- pads and slices -------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "bf16"])
@pytest.mark.parametrize("case", ["pad", "pad_value", "slice_kept", "slice_reduced",
                                  "slice_both", "pad_of_slice"])
def test_pads_and_slices_before_column_sums(case, dtype):
    fns = {
        "pad": lambda x: F.pad(x * 2, (1, 2)).sum(0),
        "pad_value": lambda x: F.pad(x, (3, 1), value=0.5).sum(0),
        "slice_kept": lambda x: x[:, 2:9].sum(0),
        "slice_reduced": lambda x: x[1:6].sum(0),
        "slice_both": lambda x: (x[1:6, 3:] + 1).sum(0),
        "pad_of_slice": lambda x: F.pad(x[:, 1:8], (2, 0), value=-1.0).sum(0),
    }
    x = torch.randn(7, 11).to(dtype)
    assert _run(fns[case], x, n=7) == ["reduction"]


def test_row_sums_of_a_cat_along_the_rows():
    """An inner reduction (over the last axis) of a cat along the rows, returned too."""
    def f(a, b):
        c = torch.cat([a, b.exp()], 0)
        return c, c.sum(-1)
    a, b = torch.randn(3, 13), torch.randn(4, 13)
    assert _run(f, a, b, n=13, exact=(0,)) == ["reduction"]


def test_per_column_operands_of_a_cat():
    """A bias made of two parts (a cat of per-column vectors: row-level loads under the
    column's bounds test) added before the column sums."""
    def f(x, b1, b2):
        return (x + torch.cat([b1, b2])).sum(0)
    assert _run(f, torch.randn(9, 12), torch.randn(4), torch.randn(8), n=9) == ["reduction"]


# ---- normalizations --------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "bf16"])
def test_softmax_of_a_cat_along_the_rows(dtype):
    """inner_persistent: rows from two tensors (each row's operand chosen once a row)."""
    def f(a, b):
        return torch.softmax(torch.cat([a, b], 0).float(), -1)
    a, b = torch.randn(3, 40).to(dtype), torch.randn(5, 40).to(dtype)
    assert _run(f, a, b, n=40) == ["inner_persistent"]


def test_staged_rows_skip_guarded_loads(monkeypatch):
    """$PYFUSER_RED_STAGE=1 stages held rows in shared memory by async copies; a cat
    operand's loads run under a bounds test, so they stay in registers (stageable)."""
    monkeypatch.setenv("PYFUSER_RED_STAGE", "1")

    def f(a, b):
        c = torch.cat([a, b], 0)
        return torch.softmax(c, -1), torch.layer_norm(c, (64,))
    a, b = torch.randn(3, 64), torch.randn(6, 64)
    assert _run(f, a, b, n=64) == ["inner_persistent"]


def test_column_normalization_of_a_cat():
    """outer_persistent: x - mean over the rows, x a cat along the kept (column) axis."""
    def f(a, b):
        c = torch.cat([a, b], -1)
        return c - c.mean(0)
    a, b = torch.randn(6, 3, 8), torch.randn(6, 3, 4)
    (name,) = _run(f, a, b, n=6)     # the segment is labelled at compile time; the plan is
    assert name.endswith("_persistent")   # outer_persistent's (the run check: kept innermost)


def test_var_mean_of_a_cat():
    """Welford statistics over the tokens of a cat along the hidden axis."""
    def f(a, b):
        v, m = torch.var_mean(torch.cat([a, b], -1), (0, 1))
        return v, m
    a, b = torch.randn(4, 5, 8), torch.randn(4, 5, 8)
    assert _run(f, a, b, n=20) == ["reduction"]


# ---- refusals ---------------------------------------------------------------------------------
def _cat_fusion(dim: int, axes):
    f = Fusion()
    with f:
        a = B.define_tensor([-1, -1, -1], DataType.Float)
        b = B.define_tensor([-1, -1, -1], DataType.Float)
        t = B.cat([a, b], dim)
        f.add_output(t)
        f.add_output(B.reduction("sum", t, axes))
    return f


def test_a_cat_along_the_reduced_axes_is_refused_with_the_reason():
    ok, why = RED.reduction_check(_cat_fusion(1, [0, 1]))
    assert not ok and "along the reduced axes [1]" in why, why
    f = _cat_fusion(1, [0, 1])
    a, b = torch.randn(2, 3, 4), torch.randn(2, 5, 4)
    t, s = dispatch.execute_fusion(f, [a, b], "interpret")
    want = torch.cat([a, b], 1)
    assert torch.equal(t, want)
    _close(s, want.sum((0, 1)), 16)
    assert dispatch.last_report(f).kernels == 2


def test_stepped_slices_are_refused():
    def f(x):
        return x[:, ::2].sum(0)
    x = torch.randn(5, 9)
    with torch.no_grad():
        got = pyfuser.compile(f)(x)
    _close(got, f(x), 5)


# ---- symbolic sizes, plans and NVRTC ----------------------------------------------------------
def test_one_fusion_serves_other_sizes():
    """Symbolic extents: the cat's bounds are kernel parameters; sizes with and without
    vectors give eager's values."""
    f = _cat_fusion(2, [0, 1])
    for shapes in ([(2, 5, 8), (2, 5, 4)], [(3, 4, 7), (3, 4, 5)], [(1, 1, 1), (1, 1, 3)]):
        a, b = (torch.randn(*s) for s in shapes)
        t, s = dispatch.execute_fusion(f, [a, b], "interpret")
        want = torch.cat([a, b], 2)
        assert torch.equal(t, want)
        _close(s, want.sum((0, 1)), shapes[0][0] * shapes[0][1])
        report = dispatch.last_report(f)
        assert report.kernels == 1 and report.segments[0].scheduler == "reduction", report


@pytest.mark.parametrize("dtype", [DataType.Float, DataType.BFloat16], ids=["f32", "bf16"])
def test_benchmark_size_plan_takes_vectors_and_compiles_for_sm90(dtype):
    """GPT-2's bench size (8 x 512 tokens, hidden 768): an outer reduction over 4096 rows of
    2304 columns, vectors of 4 (16 bytes of the float32 sums; every operand's 768 a multiple
    of 4), NVRTC for sm_90."""
    f = Fusion()
    with f:
        xs = [B.define_tensor([8, 512, 768], dtype) for _ in range(3)]
        t = B.cat(xs, 2)
        f.add_output(t)
        f.add_output(B.reduction("sum", B.cast(t, DataType.Float), [0, 1]))
    inputs = [torch.zeros(8, 512, 768, dtype=dtype.torch) for _ in range(3)]
    plan = api.plan_kernel(f, inputs)
    assert plan.scheduler == "reduction"
    src = plan.kernel.source
    assert "'kind': 'outer'" in src and "'vec': 4" in src, src[:400]
    assert nvrtc.compile_cuda(src, plan.kernel.name, "sm_90") is not None
