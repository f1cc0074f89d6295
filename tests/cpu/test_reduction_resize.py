"""Slices, pads and cats inside reduction-family kernels (schedule/reduction_resize.py): GPT-2's
q / k / v gradient `cat` along the hidden axis and the bias gradient's sum over the tokens are
one reduction kernel writing the cat and the sum (two kernels before: the cat's pointwise
kernel, and a reduction reading the cat back); a sum of a cat that is not returned reads the
operands directly; pads and slices likewise; inner and outer normalizations over a cat along
kept axes. Run through the CPU interpreter against eager (float32 and bfloat16, float32
accumulation; odd sizes that keep one element a vector, even ones that take vectors;
non-contiguous operands), the kernel count asserted, and every kernel compiled by NVRTC for
sm_90 (the executor compiles each kernel before the interpreter runs it:
compile_checks.assert_ran_as_sm90_kernels). Pads and cats along the reduced axes are
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

from compile_checks import assert_ran_as_sm90_kernels

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


@pytest.mark.parametrize("padded", [False, True], ids=["cat", "padded_cat"])
@pytest.mark.parametrize("order", ["first", "middle", "last"])
def test_a_single_row_operand_of_a_cat(order, padded):
    """An operand of one row (`a[0][None]`: its cat axis a size-1 broadcast, read everywhere,
    not under the cat's bounds test) beside operands of several: it shares no register
    buffer with them, also where a pad around the cat puts its loads under the pad's bounds
    test (a shared buffer there let the broadcast row overwrite the others: every row of
    the cat equal to it)."""
    def f(a, b, c):
        one = a[0][None, :]
        parts = {"first": [one, b, c], "middle": [b, one, c], "last": [b, c, one]}[order]
        x = torch.cat(parts, 0)
        x = F.pad(x, (2, 1)) if padded else x
        return x, x.sum(-1), x.sum(0), torch.softmax(x, -1)
    a, b, c = torch.randn(1, 8), torch.randn(3, 8), torch.randn(2, 8)
    kernels = _run(f, a, b, c, n=11, exact=(0,))
    assert len(kernels) <= 2, kernels


# ---- pads and slices -------------------------------------------------------------------------
# slices of a computed value (a slice of an input is a host view): its operand's loads shifted
PADS_AND_SLICES = {
    "pad": lambda x: F.pad(x * 2, (1, 2)).sum(0),
    "pad_value": lambda x: F.pad(x.exp(), (3, 1), value=0.5).sum(0),
    "slice_kept": lambda x: (x * 2)[:, 2:9].sum(0),
    "slice_reduced": lambda x: (x * 2)[1:6].sum(0),
    "slice_both": lambda x: (x + 1)[1:6, 3:].sum(0),
    "pad_of_slice": lambda x: F.pad((x * 2)[:, 1:8], (2, 0), value=-1.0).sum(0),
    "pad_reduced": lambda x: F.pad(x * 2, (0, 0, 1, 2)).sum(0),
    "pad_both": lambda x: F.pad(x.exp(), (2, 1, 3, 0), value=0.25).sum(0),
    "slice_of_pad_reduced": lambda x: F.pad(x * 2, (0, 0, 2, 2))[1:8].sum(0),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "bf16"])
@pytest.mark.parametrize("case", list(PADS_AND_SLICES))
def test_pads_and_slices_before_column_sums(case, dtype):
    x = torch.randn(7, 11).to(dtype)
    assert _run(PADS_AND_SLICES[case], x, n=12) == ["reduction"]


@pytest.mark.parametrize("case", ["pad", "slice", "slice_shifted"])
def test_pads_and_slices_before_row_sums(case):
    """An inner reduction whose reduced (innermost) axis is padded or sliced: the bounds test
    and the shifted loads on every step of the row, vectors where the shifts allow."""
    fns = {"pad": lambda x: F.pad(x * 2, (3, 1), value=0.5).sum(-1),
           "slice": lambda x: (x * 2)[:, 4:12].sum(-1),
           "slice_shifted": lambda x: (x + 1)[:, 1:10].sum(-1)}
    assert _run(fns[case], torch.randn(6, 16), n=16) == ["reduction"]


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


# ---- cats along the reduced axes --------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "bf16"])
@pytest.mark.parametrize("shapes", [[(4, 4, 8), (4, 8, 8)], [(3, 3, 7), (3, 6, 7)]],
                         ids=["even", "odd"])
def test_cat_along_the_reduced_tokens(dtype, shapes):
    """An outer reduction over a cat along a reduced axis (the operand chosen each step)."""
    def f(a, b):
        c = torch.cat([a, b], 1)
        return c, c.sum((0, 1))
    xs = _qkv(shapes, dtype)
    assert _run(f, *xs, n=shapes[0][0] * 12, exact=(0,)) == ["reduction"]


@pytest.mark.parametrize("shapes", [[(5, 8), (5, 12)], [(5, 7), (5, 6)]], ids=["even", "odd"])
def test_row_sums_of_a_cat_along_the_row(shapes):
    def f(a, b):
        return torch.cat([a * 2, b], -1).sum(-1)
    assert _run(f, *_qkv(shapes, torch.float32), n=20) == ["reduction"]


def test_outer_reduced_groups_of_an_inner_kernel():
    """Reduced axes 1 and 2, the cat along axis 1: one linear index over both, split per
    vector, the cat's bound tested on the outer one."""
    def f(a, b):
        return torch.cat([a, b], 1).sum((1, 2))
    assert _run(f, *_qkv([(3, 2, 8), (3, 5, 8)], torch.float32), n=56) == ["reduction"]


def test_per_row_operands_of_a_cat():
    """A per-row scale made of two parts (a cat along the rows of per-row values: loaded once
    a row, under the row's bounds test) before a softmax."""
    def f(x, s1, s2):
        return torch.softmax(x * torch.cat([s1, s2])[:, None], -1)
    assert _run(f, torch.randn(7, 24), torch.randn(3), torch.randn(4), n=24) == \
        ["inner_persistent"]


def test_symbolic_sizes_through_torch_compile():
    """dynamic=True: a cat along the reduced tokens, a symbolic slice and a pad along them, a
    cat along the softmax's row; every size one kernel a region, eager's values, no recompile
    after the first dynamic graph."""
    def f(a, b, x):
        c = torch.cat([a, b * 2], 1)
        d = F.pad(x[:, 1:] * 3, (0, 0, 2, 1))
        return c, c.sum((0, 1)), (d + 1).sum(1), torch.softmax(torch.cat([a, b], -1), -1)
    cf = pyfuser.compile(f, dynamic=True)
    graphs = []
    for n in (5, 6, 9, 4):
        a, b, x = torch.randn(2, n, 8), torch.randn(2, n, 8), torch.randn(2, n + 3, 8)
        with torch.no_grad():
            got, want = cf(a, b, x), f(a, b, x)
        assert torch.equal(got[0], want[0])
        for g, w in zip(got[1:], want[1:]):
            _close(g, w, 2 * n + 6)
        graphs.append(len(compiled_graphs()))
        regions = [r for g in compiled_graphs()[-1:] for r in g.regions]
        assert regions and all(r.kernels() == 1 for r in regions)
        assert_ran_as_sm90_kernels(regions)
    assert graphs[1] == graphs[2] == graphs[3]


# ---- normalizations ----------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "bf16"])
def test_softmax_of_a_cat_along_the_rows(dtype):
    """inner_persistent: rows from two tensors (each row's operand chosen once a row)."""
    def f(a, b):
        return torch.softmax(torch.cat([a, b], 0).float(), -1)
    a, b = torch.randn(3, 40).to(dtype), torch.randn(5, 40).to(dtype)
    assert _run(f, a, b, n=40) == ["inner_persistent"]


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "bf16"])
def test_normalizations_of_a_cat_along_the_row(dtype):
    """softmax and layer norm of rows that are a cat along the normalized axis (ViT's CLS
    token joined to the patches is a cat along the kept token axis; a rotary-style half and
    half along the row): one inner_persistent kernel."""
    def f(a, b):
        c = torch.cat([a, b], -1).float()
        return torch.softmax(c, -1), torch.layer_norm(c, (64,)), c.sum(-1)
    a, b = torch.randn(5, 16).to(dtype), torch.randn(5, 48).to(dtype)
    assert _run(f, a, b, n=64) == ["inner_persistent"]


@pytest.mark.parametrize("dim", [0, 1], ids=["rows", "row"])
def test_staged_rows_skip_guarded_loads(monkeypatch, dim):
    """$PYFUSER_RED_STAGE=1 stages held rows in shared memory by async copies; a cat
    operand's loads run under a bounds test, so they stay in registers (stageable)."""
    monkeypatch.setenv("PYFUSER_RED_STAGE", "1")

    def f(a, b):
        x = torch.cat([a, b], dim)
        return torch.softmax(x, -1), torch.layer_norm(x, (64,))
    a, b = (torch.randn(3, 64), torch.randn(6, 64)) if dim == 0 else \
        (torch.randn(9, 32), torch.randn(9, 32))
    assert _run(f, a, b, n=64) == ["inner_persistent"]


def test_column_normalization_of_a_cat():
    """outer_persistent: x - mean over the rows, x a cat along the kept (column) axis."""
    def f(a, b):
        c = torch.cat([a, b], -1)
        return c - c.mean(0)
    a, b = torch.randn(6, 3, 8), torch.randn(6, 3, 4)
    (name,) = _run(f, a, b, n=6)     # the segment is labelled at compile time; the plan is
    assert name.endswith("_persistent")   # outer_persistent's (the run check: kept innermost)


def test_column_normalization_of_a_pad_along_the_rows():
    def f(a):
        c = F.pad(a * 2, (0, 0, 2, 1))
        return c - c.mean(0)
    (name,) = _run(f, torch.randn(7, 12), n=10)
    assert name.endswith("_persistent")


@pytest.mark.parametrize("dim", [0, 1], ids=["reduced", "kept"])
def test_var_mean_of_a_cat(dim):
    """Welford statistics over the tokens of a cat along the hidden axis or the tokens."""
    def f(a, b):
        v, m = torch.var_mean(torch.cat([a, b], dim), 0)
        return v, m
    a, b = torch.randn(4, 8), torch.randn(4, 8) if dim else torch.randn(7, 8)
    assert _run(f, a, b, n=11) == ["reduction"]


# ---- every kernel variant ------------------------------------------------------------------------
KNOB_CASES = {
    "softmax_of_cat_along_row": (lambda a, b: torch.softmax(torch.cat([a, b * 2], -1), -1),
                                 [(3, 1024), (3, 3072)], 4096),
    "layer_norm_of_cat_of_rows": (lambda a, b: torch.layer_norm(torch.cat([a, b], 0), (4096,)),
                                  [(1, 4096), (2, 4096)], 4096),
    "sums_of_cat_along_tokens": (lambda a, b: torch.cat([a, b], 1).sum((0, 1)),
                                 [(4, 40, 64), (4, 88, 64)], 512),
    "sums_of_cat_along_hidden": (lambda a, b: torch.cat([a, b], 2).sum((0, 1)),
                                 [(4, 64, 40), (4, 64, 88)], 256),
    "column_normalization_of_pad": (lambda a: (lambda c: c - c.mean(0))(
        F.pad(a * 2, (0, 0, 20, 12))), [(96, 64)], 128),
}


@pytest.mark.parametrize("knob", ["PYFUSER_RED_CLUSTER=2", "PYFUSER_RED_STEPS=0",
                                  "PYFUSER_RED_SPLITS=4", "PYFUSER_RED_STAGE=1",
                                  "PYFUSER_RED_FULL=1"])
@pytest.mark.parametrize("case", list(KNOB_CASES))
def test_every_kernel_variant(case, knob, monkeypatch):
    """Clusters (a row over two blocks), streamed passes, grid splits, staged rows and
    unchecked whole rows, each with bounds along kept and reduced axes."""
    name, value = knob.split("=")
    monkeypatch.setenv(name, value)
    f, shapes, n = KNOB_CASES[case]
    assert len(_run(f, *(torch.randn(*sh) for sh in shapes), n=n)) == 1


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


def test_a_stepped_slice_is_refused_with_the_reason():
    """A stepped slice's operand is read element by element (no affine offset): refused,
    and the slice runs as a pointwise kernel before the reduction, eager's values."""
    f = Fusion()
    with f:
        x = B.define_tensor([-1, -1], DataType.Float)
        f.add_output(B.reduction("sum", B.slice_(B.elementwise("mul", x, 2.0), [0, 0],
                                                 [5, 9], [1, 2]), [0]))
    ok, why = RED.reduction_check(f)
    assert not ok and "stepped slice" in why, why
    x = torch.randn(5, 9)
    (s,) = dispatch.execute_fusion(f, [x], "interpret")
    _close(s, (x * 2)[:, ::2].sum(0), 5)
    assert dispatch.last_report(f).kernels == 2


# ---- symbolic sizes, plans and NVRTC ----------------------------------------------------------
@pytest.mark.parametrize("dim", [2, 1], ids=["kept", "reduced"])
def test_one_fusion_serves_other_sizes(dim):
    """Symbolic extents: the cat's bounds are kernel parameters; sizes with and without
    vectors give eager's values."""
    f = _cat_fusion(dim, [0, 1])
    for shapes in ([(2, 8, 8), (2, 8, 4)], [(3, 4, 7), (3, 4, 5)], [(1, 1, 1), (1, 1, 3)]):
        if dim == 1:                      # the cat's axis second: [2, 8, 8] + [2, 4, 8] ...
            shapes = [(n, c, r) for n, r, c in shapes]
        a, b = (torch.randn(*s) for s in shapes)
        t, s = dispatch.execute_fusion(f, [a, b], "interpret")
        want = torch.cat([a, b], dim)
        assert torch.equal(t, want)
        _close(s, want.sum((0, 1)), want.shape[0] * want.shape[1])
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
    # the three operands' loads fill one register buffer (reduction_resize.shared_buffers)
    assert "T0_r[" in src and "T1_r" not in src and "T2_r" not in src
    assert nvrtc.compile_cuda(src, plan.kernel.name, "sm_90") is not None
