"""A pure reduction's last combine in the row's first warp (codegen/reduction_kernels.
InnerKernel.warp0_tail): where every output is a row value, the reads of the warps' partials
after the block barrier, the row's results and their stores run in warp 0 alone (thread 0
writes them), not in every thread. The same merges in the same order: the results are the
bits of the kernel without it, checked through the CPU interpreter of the kernel IR; the CUDA
compiles with NVRTC for sm_90; normalizations, whose every thread needs the row's results,
keep the merges in every warp."""
from __future__ import annotations

import pytest
import torch

from pyfuser.codegen import api
from pyfuser.codegen.reduction_kernels import InnerKernel
from pyfuser.runtime import dispatch, nvrtc

from reduction_cases import fusion, logsumexp, reduce_op, softmax, var_mean

GUARD = "threadIdx.x) < 32)) {"


def _run(build, x, monkeypatch, tail: bool):
    if not tail:
        monkeypatch.setattr(InnerKernel, "warp0_tail", lambda self, q: False)
    f = fusion(build, 2, x.dtype, [1])
    plan = api.plan_kernel(f, [x])
    outs = dispatch.execute_fusion(f, [x], "interpret")
    monkeypatch.undo()
    return plan, outs


@pytest.mark.parametrize("build", [reduce_op("sum"), reduce_op("max"), var_mean, logsumexp],
                         ids=["sum", "max", "var_mean", "logsumexp"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_a_pure_reduction_merges_its_warps_in_warp_0(build, dtype, monkeypatch):
    gen = torch.Generator().manual_seed(7)
    x = (torch.randn(5, 5000, generator=gen) * 3).to(dtype)
    x[1, 17] = float("nan")
    x[3] = float("-inf")
    plan, got = _run(build, x, monkeypatch, tail=True)
    assert plan.params.bdimx > 32, plan.params
    assert GUARD in plan.kernel.source
    assert nvrtc.compile_cuda(plan.kernel.source, plan.kernel.name, "sm_90") is not None
    plan0, want = _run(build, x, monkeypatch, tail=False)
    assert GUARD not in plan0.kernel.source
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        assert torch.equal(g.isnan(), w.isnan())
        assert torch.equal(g.nan_to_num(), w.nan_to_num()), (g, w)


def test_a_normalization_keeps_the_merges_in_every_warp():
    x = torch.randn(4, 6000)
    plan = api.plan_kernel(fusion(softmax, 2, torch.float32, [1]), [x])
    assert plan.params.bdimx > 32 and GUARD not in plan.kernel.source
