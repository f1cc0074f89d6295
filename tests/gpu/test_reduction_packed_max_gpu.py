"""The max / min of half and bfloat16 loads two lanes a word (`max.NaN.bf16x2`, kernel IR
PackedOp) on the GPU, at the benchmark's sizes: the same bits as the kernels without it (NaN,
infinities included; a zero's sign compared by value), max / min equal to eager's."""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "cpu"))
import reduction_cases as RC  # noqa: E402
from pyfuser.codegen.reduction_memory import ReductionMemory  # noqa: E402
from pyfuser.runtime import dispatch  # noqa: E402

pytestmark = pytest.mark.gpu

CASES = [  # (builder, shape, axes)
    (RC.logsumexp, (1024, 65536), [1]),
    (RC.logsumexp, (4096, 32000), [1]),
    (RC.softmax, (32768, 256), [1]),
    (RC.softmax, (8192, 3072), [1]),
    (RC.reduce_op("max"), (8192, 3072), [1]),
    (RC.reduce_op("min"), (1024, 65536), [1]),
    (RC.reduce_op("max"), (8192, 3072), [0]),
]


def _run(build, x, axes, monkeypatch, packed):
    if not packed:
        monkeypatch.setattr(ReductionMemory, "packed_lane", lambda self, *a, **k: None)
    outs = dispatch.execute_fusion(RC.fusion(build, x.dim(), x.dtype, axes), [x])
    torch.cuda.synchronize()
    monkeypatch.undo()
    return outs


@pytest.mark.parametrize("dt", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("build,shape,axes", CASES,
                         ids=[f"{c[0].__name__}-{c[1]}-{c[2]}" for c in CASES])
def test_packed_max_matches_the_float_max(build, shape, axes, dt, monkeypatch):
    x = (torch.randn(*shape, device="cuda") * 4).to(dt)
    if axes == [1]:
        x[:10] = RC.special_rows(10, shape[1], dt).cuda()
    got = _run(build, x, axes, monkeypatch, True)
    want = _run(build, x, axes, monkeypatch, False)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        assert torch.equal(g.isnan(), w.isnan())
        assert torch.equal(g.nan_to_num(), w.nan_to_num())
    if build.__name__ in ("max", "min"):
        ref = (torch.amax if build.__name__ == "max" else torch.amin)(x, dim=axes[0])
        assert torch.equal(got[0].isnan(), ref.isnan())
        assert torch.equal(got[0].nan_to_num(), ref.nan_to_num())
