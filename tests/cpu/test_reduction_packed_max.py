"""The max / min of half and bfloat16 loads two lanes a word (kernel IR PackedFill / PackedOp,
`max.NaN.bf16x2`): where a reduction's max or min reads a loaded 2-byte value as it is (an online
(max, sum) pair's chunk max, a plain max / min accumulator), it runs on the packed register
words, and the float accumulator takes the words' lanes after the step loop. The max of two
values is one of them, so the results are the bits of the kernel without it (checked through
the CPU interpreter of the kernel IR, NaN, infinities and signed zeros included) and eager's;
the CUDA compiles with NVRTC for sm_90; float32 inputs and values computed before the max keep
the float form."""
from __future__ import annotations

import re

import pytest
import torch

from pyfuser.codegen import api
from pyfuser.codegen import kernel_ir as K
from pyfuser.codegen.reduction_memory import ReductionMemory
from pyfuser.runtime import dispatch, nvrtc

from reduction_cases import fusion, log_softmax, logsumexp, reduce_op, softmax

USED = re.compile(r"= pf_m(ax|in)imum_x2_")   # a use in the kernel (the prelude defines them)


def _run(build, rank, x, axes, monkeypatch, packed: bool):
    if not packed:
        monkeypatch.setattr(ReductionMemory, "packed_lane", lambda self, *a, **k: None)
    f = fusion(build, rank, x.dtype, axes)
    plan = api.plan_kernel(f, [x])
    outs = dispatch.execute_fusion(f, [x], "interpret")
    monkeypatch.undo()
    return plan, outs


def _special(x):
    """NaN in row 1, a row of -inf, +inf in row 2, signed zeros as a row's max in row 0."""
    x = x.clone()
    x[1, 17 % x.shape[1]] = float("nan")
    x[3] = float("-inf")
    x[2, 5 % x.shape[1]] = float("inf")
    x[0] = -x[0].abs() - 1
    x[0, 3] = -0.0
    x[0, 7 % x.shape[1]] = 0.0
    return x


CASES = [  # (builder, shape, axes, what reads the words)
    (logsumexp, (5, 5000), [1], "online pair, streamed row"),
    (reduce_op("max"), (5, 5000), [1], "max, streamed row"),
    (reduce_op("min"), (6, 300), [1], "min, row in registers"),
    (softmax, (8, 256), [1], "max of a softmax, row in registers"),
    (reduce_op("max"), (600, 24), [0], "max over the outer axis"),
]


@pytest.mark.parametrize("build,shape,axes,what", CASES, ids=[c[3] for c in CASES])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_a_max_of_2_byte_loads_runs_on_packed_words(build, shape, axes, what, dtype, monkeypatch):
    gen = torch.Generator().manual_seed(3)
    x = (torch.randn(*shape, generator=gen) * 4).to(dtype)
    if axes == [1]:
        x = _special(x)
    plan, got = _run(build, len(shape), x, axes, monkeypatch, packed=True)
    kind = "half" if dtype is torch.float16 else "bf16"
    assert re.search(rf"= pf_m(ax|in)imum_x2_{kind}\(", plan.kernel.source), what
    assert any(isinstance(s, K.PackedOp) for s in plan.kernel_ir.walk())
    assert nvrtc.compile_cuda(plan.kernel.source, plan.kernel.name, "sm_90") is not None
    plan0, want = _run(build, len(shape), x, axes, monkeypatch, packed=False)
    assert not USED.search(plan0.kernel.source)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        assert torch.equal(g.isnan(), w.isnan())
        g0, w0 = g.nan_to_num(), w.nan_to_num()
        assert torch.equal(g0, w0) and torch.equal(g0.signbit(), w0.signbit()), (g, w)
    if build.__name__ in ("max", "min"):
        ref = getattr(torch, "amax" if build.__name__ == "max" else "amin")(x, dim=axes[0])
        assert torch.equal(got[0].isnan(), ref.isnan())
        assert torch.equal(got[0].nan_to_num(), ref.nan_to_num())


@pytest.mark.parametrize("build", [logsumexp, reduce_op("max")], ids=["logsumexp", "max"])
def test_float32_and_computed_values_keep_the_float_max(build, monkeypatch):
    x = torch.randn(4, 3000)
    plan, _ = _run(build, 2, x, [1], monkeypatch, packed=True)
    assert not USED.search(plan.kernel.source)
    # log_softmax of half: the max reads the loads, the sum the shifted values (a float op)
    xh = torch.randn(4, 3000).half()
    plan, got = _run(log_softmax, 2, xh, [1], monkeypatch, packed=True)
    assert "= pf_maximum_x2_half(" in plan.kernel.source
    want = torch.log_softmax(xh.float(), -1)
    assert (got[0].float() - want).abs().max() < 2e-2
