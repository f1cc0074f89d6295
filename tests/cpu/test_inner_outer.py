"""The inner_outer_persistent scheduler on the CPU interpreter: a layer norm's backward (dx from
row sums, dweight / dbias from sums over the rows) is ONE kernel, through torch.compile training
steps, through the aten op in a TorchScript graph, in float32 and bfloat16, on odd and unaligned
rows, one row, rows that do not fill the blocks evenly, without bias and without affine
parameters; its refusals (compile time: with a reason; run time: the two-kernel path) and the
NVRTC compile of every kernel for sm_90.

Tolerances (docs/reductions.md): float32 results are as close to eager in float64 as eager's
float32 ones (within a factor 4, train_corpus.assert_as_close_as_eager); bfloat16 results are
compared with what eager's CUDA kernels compute (float32 arithmetic on the bfloat16 inputs,
rounded once to bfloat16): within 1.6e-2 relative plus two bfloat16 roundings of the largest
magnitude (a sum over the rows is rounded once to bfloat16, and its float32 value may differ by
summation order).
"""
from __future__ import annotations

import copy

import pytest
import torch

import pyfuser
from pyfuser.frontend.fx import compiled_graphs, reset_compiled
from pyfuser.ir import DataType, Fusion
from pyfuser.ir import builder as B
from pyfuser.runtime import dispatch, nvrtc
from pyfuser.schedule import inner_outer, registry

from train_corpus import assert_as_close_as_eager

ew = B.elementwise


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.delenv("PYFUSER_INNER_OUTER", raising=False)   # on by default (schedule/inner_outer.py)
    # few SMs: grids of a few blocks, fewer finishers than blocks, grid-stride row loops
    monkeypatch.setenv("PYFUSER_SM_COUNT", "3")
    torch._dynamo.reset()
    reset_compiled()
    yield
    torch._dynamo.reset()


def _bf16_close(got, want_f32, name):
    """got (bfloat16) against eager's CUDA arithmetic: float32 on the same inputs, rounded."""
    want = want_f32.to(torch.bfloat16)
    assert got.dtype == torch.bfloat16 and got.shape == want.shape, name
    scale = max(want_f32.abs().max().item(), 1e-30)
    err = (got.double() - want_f32.double()).abs()
    tol = 1.6e-2 * want_f32.double().abs() + 2 * 2.0 ** -8 * scale
    assert bool((err <= tol).all()), f"{name}: max error {err.max().item():.3g} (scale {scale:.3g})"


def _backward_region():
    bw = [g for g in compiled_graphs() if g.kind == "backward"]
    assert len(bw) == 1
    return next(r for r in bw[0].regions if "aten.native_layer_norm_backward.default" in r.ops)


def _ran_on_interpreter(region):
    report = dispatch.last_report(region.fusion)
    assert report is not None and report.eager_segments == 0, report
    kernels = [s for s in report.segments if s.kind == "kernel"]
    assert kernels and all(s.backend == "interpret" for s in kernels), report
    return kernels


def _layer_norm_step(shape, dtype, affine=True, bias=True, seed=0):
    """A training step's forward and backward of nn.LayerNorm through pyfuser and eager; the
    gradients of x, weight and bias (pyfuser, eager in the dtype, eager in float64 / float32)."""
    torch.manual_seed(seed)
    H = shape[-1]
    ln = torch.nn.LayerNorm(H, elementwise_affine=affine, bias=bias)
    if affine:
        with torch.no_grad():
            ln.weight.normal_()
            if bias:
                ln.bias.normal_()
    x = torch.randn(*shape)
    ref_dt = torch.float64 if dtype == torch.float32 else torch.float32
    mods = [copy.deepcopy(ln).to(dtype), copy.deepcopy(ln).to(dtype), copy.deepcopy(ln).to(ref_dt)]
    xs = [x.to(dtype).requires_grad_(), x.to(dtype).requires_grad_(),
          x.to(dtype).to(ref_dt).detach().requires_grad_()]
    compiled = pyfuser.compile(mods[0])
    outs = [compiled(xs[0]), mods[1](xs[1]), mods[2](xs[2])]
    gy = torch.randn(*shape).to(dtype)
    for o in outs:
        o.backward(gy.to(o.dtype))
    grads = {"dx": [x_.grad for x_ in xs]}
    if affine:
        grads["dweight"] = [m.weight.grad for m in mods]
        if bias:
            grads["dbias"] = [m.bias.grad for m in mods]
    return grads


def _check(grads, dtype):
    for name, (got, eager, ref) in grads.items():
        assert got.dtype == eager.dtype and got.shape == eager.shape, name
        if dtype == torch.float32:
            assert_as_close_as_eager(got, eager, ref, name)
        else:
            _bf16_close(got, ref, name)


SHAPES = {
    "odd_H": (5, 7, 23),
    "H_not_vector_multiple": (9, 6),
    "one_row": (1, 33),
    "rows_not_block_multiple": (37, 40),
    "wide": (6, 136),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_layer_norm_backward_is_one_kernel(shape, dtype):
    grads = _layer_norm_step(shape, dtype)
    _check(grads, dtype)
    region = _backward_region()
    assert region.kernels() == 1
    kernels = _ran_on_interpreter(region)
    assert [s.scheduler for s in kernels] == ["inner_outer_persistent"]


def test_weight_without_bias():
    grads = _layer_norm_step((11, 48), torch.float32, bias=False)
    assert set(grads) == {"dx", "dweight"}
    _check(grads, torch.float32)
    region = _backward_region()
    assert region.kernels() == 1
    assert [s.scheduler for s in _ran_on_interpreter(region)] == ["inner_outer_persistent"]


def test_without_affine_parameters_dx_alone():
    grads = _layer_norm_step((11, 48), torch.float32, affine=False)
    assert set(grads) == {"dx"}
    _check(grads, torch.float32)
    region = _backward_region()
    assert region.kernels() == 1          # one row domain: the inner persistent kernel
    assert [s.scheduler for s in _ran_on_interpreter(region)] == ["inner_persistent"]


def test_a_second_step_reuses_the_kernel_and_the_semaphores():
    """The kernel leaves its semaphores zero: a second call on the same executor (same
    workspace key) gives the same results."""
    first = _layer_norm_step((37, 40), torch.float32, seed=1)
    torch._dynamo.reset()
    reset_compiled()
    again = _layer_norm_step((37, 40), torch.float32, seed=1)
    for k in first:
        assert torch.equal(first[k][0], again[k][0]), k


# ---- the aten op in a TorchScript graph -------------------------------------------------------
def _ln_bw(dy, x, mean, rstd, w, b):
    return torch.ops.aten.native_layer_norm_backward(dy, x, [40], mean, rstd, w, b,
                                                     [True, True, True])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_aten_native_layer_norm_backward_in_a_graph(dtype):
    gen = torch.Generator().manual_seed(3)
    x32 = torch.randn(3, 13, 40, generator=gen)
    dy32 = torch.randn(3, 13, 40, generator=gen)
    w32, b32 = torch.randn(40, generator=gen), torch.randn(40, generator=gen)
    x, dy, w, b = (t.to(dtype) for t in (x32, dy32, w32, b32))
    _, mean, rstd = torch.native_layer_norm(x, [40], w, b, 1e-5)     # eager's statistics dtype
    fused = pyfuser.jit(torch.jit.script(_ln_bw))
    with torch.no_grad():
        got = fused(dy, x, mean, rstd, w, b)
    assert fused.last_run.kernels == 1 and fused.last_run.fallbacks == []
    want = _ln_bw(dy, x, mean, rstd, w, b)
    want32 = _ln_bw(dy.float(), x.float(), mean.float(), rstd.float(), w.float(), b.float())
    ora = _ln_bw(dy.double(), x.double(), mean.double(), rstd.double(), w.double(), b.double())
    for name, g, e, r32, o in zip(("dx", "dweight", "dbias"), got, want, want32, ora):
        assert g.dtype == e.dtype and g.shape == e.shape, name
        if dtype == torch.float32:
            assert_as_close_as_eager(g, e, o, name)
        else:
            _bf16_close(g, r32, name)


# ---- refusals -------------------------------------------------------------------------------------
def _fusion(build):
    f = Fusion()
    with f:
        for o in build():
            f.add_output(o)
    return f


def _inputs():
    """dy, x of one [8, 8] domain (constant extents: every axis provably the same length)."""
    return B.define_tensor([8, 8], DataType.Float), B.define_tensor([8, 8], DataType.Float)


def test_compile_check_takes_row_and_column_sums():
    def build():
        dy, x = _inputs()
        s = B.reduction("sum", ew("mul", dy, x), [1], keepdim=True)
        return ew("sub", dy, s), B.reduction("sum", ew("mul", dy, x), [0]), B.reduction("sum", dy, [0])
    ok, why = inner_outer.compile_check(_fusion(build))
    assert ok, why
    assert registry.accepting(_fusion(build))[0] == "inner_outer_persistent"


@pytest.mark.parametrize("build,reason", [
    (lambda: [B.reduction("sum", _inputs()[0], [1])], "one reduction domain"),
    (lambda: (lambda dy, x: [B.reduction("sum", dy, [1]), B.reduction("sum", dy, [0]),
                             B.reduction("max", x, [0])])(*_inputs()), "max over the rows"),
    (lambda: (lambda dy, x: [B.reduction("sum", x, [1]),
                             B.reduction("sum", ew("sub", x, B.reduction("sum", x, [0],
                                                                         keepdim=True)), [0])])(
        *_inputs()), "flows back into per-row or per-element values"),
    (lambda: (lambda dy, x: [B.reduction("sum", dy, [1]),
                             ew("add", B.reduction("sum", dy, [0]),
                                B.reduction("sum", x, [1]))])(*_inputs()),
     "combined with a sum over the rows"),
    (lambda: (lambda x: [B.reduction("sum", x, [1]), B.reduction("sum", x, [0])])(
        B.define_tensor([2, 3, 4], DataType.Float)), "no reduction over the innermost axis"),
], ids=["single_domain", "max_over_rows", "row_value_needs_column_sum", "mixed_output",
        "no_innermost_axis"])
def test_compile_check_refusals_say_why(build, reason):
    ok, why = inner_outer.compile_check(_fusion(build))
    assert not ok and reason in why, why


def test_rows_too_long_for_the_chip_run_as_two_kernels(monkeypatch, capsys):
    """The run check refuses a row that does not fit (here: a tiny register budget); the
    segment then runs as the other schedulers' kernels (dx, then dweight / dbias), correctly,
    and the refusal is logged under segmenter_logging."""
    monkeypatch.setattr(inner_outer, "REG_BUDGET", 4)
    monkeypatch.setenv("PYFUSER_DUMP", "segmenter_logging")
    grads = _layer_norm_step((7, 64), torch.float32)
    _check(grads, torch.float32)
    region = _backward_region()
    assert region.kernels() == 2
    logged = capsys.readouterr()
    assert "refused at run time" in logged.out + logged.err


@pytest.mark.parametrize("knob,vec", [(None, 4), ("8", 8), ("2", 2)])
def test_bfloat16_vectors_are_capped_at_four_elements(knob, vec, monkeypatch, capsys):
    """Column partials take registers per element: a bfloat16 row is read 4 elements (8 bytes)
    at a time, as a float32 one, not 8 (H200: 128 -> 70 registers, 2 -> 3 blocks an SM, the
    8192x3072 backward 71.3 -> 60.5 µs); $PYFUSER_IO_VEC sets the cap."""
    if knob:
        monkeypatch.setenv("PYFUSER_IO_VEC", knob)
    monkeypatch.setenv("PYFUSER_DUMP", "scheduler_params")
    grads = _layer_norm_step((6, 136), torch.bfloat16)
    _check(grads, torch.bfloat16)
    dumped = capsys.readouterr()
    lines = [ln for ln in (dumped.out + dumped.err).splitlines() if "kind=inner-outer" in ln]
    assert lines and all(f"vec={vec} " in ln for ln in lines), lines


# ---- NVRTC ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_kernels_compile_with_nvrtc_for_sm90(dtype):
    from pyfuser.codegen import api
    def build():
        dy = B.define_tensor([-1, -1, 64], {torch.float32: DataType.Float,
                                             torch.bfloat16: DataType.BFloat16}[dtype])
        x = B.define_tensor([-1, -1, 64], dy.dtype)
        mean = B.define_tensor([-1, -1, 1], DataType.Float)
        rstd = B.define_tensor([-1, -1, 1], DataType.Float)
        w = B.define_tensor([64], dy.dtype)
        dx, dw, db = pyfuser.frontend.lowering.aten_backward._layer_norm_backward(
            dy, x, [64], mean, rstd, w, w, [True, True, True])
        return dx, dw, db
    f = _fusion(build)
    inputs = [torch.randn(4, 5, 64).to(dtype), torch.randn(4, 5, 64).to(dtype),
              torch.randn(4, 5, 1), torch.rand(4, 5, 1) + 0.5, torch.randn(64).to(dtype)]
    f.kernel_scheduler = registry.accepting(f)[0]
    assert f.kernel_scheduler == "inner_outer_persistent"
    plan = api.plan_kernel(f, inputs)
    assert plan.scheduler == "inner_outer_persistent"
    binary = nvrtc.compile_cuda(plan.kernel.source, plan.kernel.name, "sm_90")
    assert binary is not None
    atomics = [ln for ln in plan.kernel.source.splitlines() if "atomicAdd(" in ln
               and "__device__" not in ln]
    assert atomics and all("(int)" in ln for ln in atomics), atomics   # integer atomics only
    assert "__nanosleep" in plan.kernel.source


# ---- column sums of values the row sums make ---------------------------------------------------
def _centered_column_sums():
    """sum over axis 0 of (x - rowsum(x))^2: the column sums' input exists only in the pass after
    the row sum, and the pass writes nothing else (regression: that pass was skipped)."""
    f = Fusion()
    with f:
        x = B.define_tensor([-1, -1], DataType.Float)
        d = ew("sub", x, B.reduction("sum", x, [1], keepdim=True))
        f.add_output(B.reduction("sum", ew("mul", d, d), [0]))
    return f


@pytest.mark.parametrize("shape", [(6, 10), (1, 7), (45, 12)])
def test_column_sums_after_the_row_sums_are_one_kernel(shape):
    f = _centered_column_sums()
    x = torch.randn(*shape)
    (out,) = dispatch.execute_fusion(f, [x])
    d = x.double() - x.double().sum(1, keepdim=True)
    torch.testing.assert_close(out, (d * d).sum(0).float(), rtol=1e-5, atol=1e-5)
    report = dispatch.last_report(f)
    assert report.kernels == 1 and report.launched == 1
    assert [s.scheduler for s in report.segments if s.kind == "kernel"] == ["inner_outer_persistent"]
