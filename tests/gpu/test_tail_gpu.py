"""The tail scheduler on CUDA (schedule/tail.py): a cross-entropy's row kernel and its mean over
the rows as one launch whose last block sums the rows, against eager's CUDA kernels: values,
the same bits on every call (the semaphore left zero for the next launch), rows up to the one
block's limit, and past it the two kernels of before."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import pyfuser
from pyfuser.frontend.fx import compiled_graphs
from pyfuser.runtime import dispatch
from pyfuser.schedule import tail

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("fresh_compile", "tail_on")]


def _launched():
    regions = [r for g in compiled_graphs() for r in g.regions]
    reports = [dispatch.last_report(r.fusion) for r in regions]
    assert all(rep is not None and rep.eager_segments == 0 for rep in reports), reports
    segs = [s for rep in reports for s in rep.segments if s.kind == "kernel"]
    assert all(s.backend == "cuda" for s in segs), segs
    return sum(r.kernels() for r in regions), [s.scheduler for s in segs]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("rows,classes", [(1, 7), (333, 1000), (4096, 3000),
                                          (tail.MAX_TAIL_ELEMENTS, 50)])
def test_cross_entropy_is_one_launch_on_cuda(rows, classes, reduction, dtype):
    gen = torch.Generator(device="cuda").manual_seed(rows)
    x = (torch.randn(rows, classes, device="cuda", generator=gen) * 4).to(dtype)
    t = torch.randint(0, classes, (rows,), device="cuda", generator=gen)
    t[1::5] = -100
    f = lambda a, b: F.cross_entropy(a, b, reduction=reduction)   # noqa: E731
    g = pyfuser.compile(f)
    with torch.no_grad():
        outs = [g(x, t) for _ in range(4)]
        want = f(x, t)
    assert _launched() == (1, ["tail"])
    assert outs[0].dtype == want.dtype and outs[0].shape == want.shape
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(outs[0].float(), want.float(), rtol=tol, atol=tol, equal_nan=True)
    assert all(torch.equal(o, outs[0]) or (o.isnan() and outs[0].isnan()) for o in outs[1:])


def test_rows_past_one_block_are_two_kernels_on_cuda():
    rows = tail.MAX_TAIL_ELEMENTS + 1
    gen = torch.Generator(device="cuda").manual_seed(9)
    x = torch.randn(rows, 64, device="cuda", generator=gen)
    t = torch.randint(0, 64, (rows,), device="cuda", generator=gen)
    with torch.no_grad():
        out = pyfuser.compile(lambda a, b: F.cross_entropy(a, b))(x, t)
    assert _launched()[0] == 2
    torch.testing.assert_close(out, F.cross_entropy(x, t), rtol=1e-5, atol=1e-6)


def test_row_statistics_to_a_scalar_on_cuda():
    gen = torch.Generator(device="cuda").manual_seed(4)
    x = torch.randn(3000, 513, device="cuda", generator=gen)
    f = lambda a: torch.logsumexp(a, -1).mean() + a.var(-1).sum()   # noqa: E731
    with torch.no_grad():
        got, want = pyfuser.compile(f)(x), f(x)
    assert "tail" in _launched()[1]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)
