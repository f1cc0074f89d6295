"""cumsum of integers as a masked sum (frontend/fx/rewrite_scan.py) on CUDA: HF's packed-sequence
detection and integer cumsums along every axis, bit-equal to eager's scan, run as pyfuser's
kernels (no eager segment)."""
import pytest
import torch

import pyfuser
from pyfuser.frontend.fx import compiled_graphs
from pyfuser.runtime import dispatch

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("fresh_compile")]


def _check(f, x):
    got = torch.compile(f, backend=pyfuser.backend)(x)
    want = f(x)
    assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)
    (g,) = compiled_graphs()
    assert not any("cumsum" in k for k in g.report()["unfused"])
    for r in g.regions:
        rep = dispatch.last_report(r.fusion)
        assert rep is not None and rep.eager_segments == 0 and r.kernels() >= 1


def test_packed_sequence_detection_at_bench_size():
    def f(p):
        d = torch.diff(p, prepend=p[:, :1] - 1, dim=-1)
        return (d != 1).cumsum(-1) + 1
    p = torch.arange(512, device="cuda").repeat(8, 1)
    p[3, 200:] -= 200                                  # a second sequence packed in row 3
    _check(f, p)


@pytest.mark.parametrize("dtype", [torch.bool, torch.int32, torch.int64])
@pytest.mark.parametrize("dim", [0, 1, 2])
def test_integer_cumsum_along_each_axis(dtype, dim):
    gen = torch.Generator(device="cuda").manual_seed(dim)
    x = torch.randint(-9, 9, (33, 65, 7), device="cuda", generator=gen).to(dtype)
    _check((lambda x: (x + x).cumsum(dim) * 3) if dtype is not torch.bool else
           (lambda x: (~x).cumsum(dim) * 3), x)
