"""Instruction-level forms of the inner persistent kernels that change no result beyond
rounding (codegen/reduction_memory.at_step, codegen/reduction_accumulators): a staged half /
bfloat16 vector is read back from shared memory as 32-bit words (one instruction to unpack each
element, as the register buffers are), and a Welford chunk sums its squared deviations with a
fused multiply-add (ir/ops.py KERNEL_OPS "fma", one rounding). Checked through the CPU
interpreter against eager, in the printed CUDA, and with NVRTC where it is installed."""
from __future__ import annotations

import pytest
import torch

import reduction_cases as RC
from pyfuser.ir.ops import KERNEL_OPS
from pyfuser.runtime import dispatch

from test_reduction_kernels import run


@pytest.mark.parametrize("dt", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("builder", [RC.layer_norm, RC.softmax], ids=["layer_norm", "softmax"])
def test_a_staged_two_byte_row_is_read_back_as_words(builder, dt, monkeypatch):
    monkeypatch.setenv("PYFUSER_RED_STAGE", "1")
    dispatch.clear_caches()
    plan = run(builder, (3, 4096), [1], dt, "contiguous")      # eager's values (run checks)
    src = plan.kernel.source
    assert plan.params.stage
    assert "uint32_t T0_r_x[" in src and "reinterpret_cast<const uint32_t*>(&T0_r[" in src
    assert "pf_unpack_" in src and "pf_bf16 T0_r_x[" not in src and "__half T0_r_x[" not in src
    pytest.importorskip("cuda.bindings.nvrtc")
    from pyfuser.runtime import nvrtc
    nvrtc.compile_cuda(src, plan.kernel.name, "sm_90", use_disk_cache=False)


def test_a_staged_float32_row_is_read_back_as_elements(monkeypatch):
    monkeypatch.setenv("PYFUSER_RED_STAGE", "1")
    dispatch.clear_caches()
    src = run(RC.layer_norm, (3, 4096), [1], torch.float32, "contiguous").kernel.source
    assert "float T0_r_x[" in src and "uint32_t T0_r_x[" not in src


def test_welford_chunks_sum_squares_with_one_rounding():
    plan = run(RC.layer_norm, (5, 3000), [1], torch.float32, "contiguous")
    assert "_m2 = pf_fma(dd, dd, " in plan.kernel.source
    pytest.importorskip("cuda.bindings.nvrtc")
    from pyfuser.runtime import nvrtc
    nvrtc.compile_cuda(plan.kernel.source, plan.kernel.name, "sm_90", use_disk_cache=False)


def test_the_interpreters_fma_rounds_once():
    """(1 + 2^-12)^2 - (1 + 2^-11) is 2^-24: a rounded product loses it (0), one rounding
    keeps it; float64 operands and other values as the product and sum give."""
    fma = KERNEL_OPS["fma"].ref
    a = torch.tensor([1 + 2.0 ** -12, 3.0, -0.5], dtype=torch.float32)
    c = torch.tensor([-(1 + 2.0 ** -11), 1.0, 0.25], dtype=torch.float32)
    assert (a * a + c)[0].item() == 0.0
    got = fma(a, a, c)
    assert got.dtype == torch.float32
    assert got.tolist() == [2.0 ** -24, 10.0, 0.5]


def test_layer_norm_statistics_stay_eager_s_on_a_shifted_row():
    """A row far from zero with a small spread (mean 1000, std 0.01: a float32 mean is off by
    up to 3e-5, a deviation's relative error 3e-3): rstd within 5e-4 of float64's (measured
    2.6e-4; eager's own 0.7-1.0e-4), the mean within float32's rounding of 1000."""
    g = torch.Generator().manual_seed(3)
    x = 1000.0 + 0.01 * torch.randn(4, 4096, generator=g)
    f = RC.fusion(RC.layer_norm, 2, torch.float32, [1])
    w, b = torch.ones(4096), torch.zeros(4096)
    y, mean, rstd = dispatch.execute_fusion(f, [x, w, b])
    var = torch.var(x.double(), 1, correction=0)
    torch.testing.assert_close(rstd.double().flatten(), torch.rsqrt(var + 1e-5), rtol=5e-4, atol=0)
    torch.testing.assert_close(mean.double().flatten(), x.double().mean(1), rtol=0, atol=6e-5)
    assert y.shape == x.shape and torch.isfinite(y).all()


@pytest.mark.parametrize("knob,cols,fenced", [("1", 4096, True), (None, 4096, False),
                                              ("1", 4000, False)])
def test_staged_whole_rows_step_under_a_uniform_branch(knob, cols, fenced, monkeypatch):
    """$PYFUSER_RED_FENCE=1: a staged row of whole steps (every position in bounds) checks no
    bounds but keeps each step under `0 < rlen` (ReductionParams.fence: without a branch ptxas
    reads every staged vector at once and spills); by default, and for rows that are not
    whole, the bounds checks. Eager's values either way (run), NVRTC compiles it."""
    monkeypatch.setenv("PYFUSER_RED_STAGE", "1")
    if knob is not None:
        monkeypatch.setenv("PYFUSER_RED_FENCE", knob)
    dispatch.clear_caches()
    plan = run(RC.layer_norm, (4, cols), [1], torch.bfloat16, "contiguous")
    src = plan.kernel.source
    assert plan.params.stage and plan.params.fence is fenced and not plan.params.full
    assert ("if ((0 < rlen))" in src) is fenced
    assert ("row_ok" in src) is not fenced
    pytest.importorskip("cuda.bindings.nvrtc")
    from pyfuser.runtime import nvrtc
    nvrtc.compile_cuda(src, plan.kernel.name, "sm_90", use_disk_cache=False)
