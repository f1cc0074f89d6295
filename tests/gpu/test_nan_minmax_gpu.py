"""max / min with NaN on the GPU (sm_80+: one `max.NaN.f32` / `min.NaN.f32` instruction): the
elementwise ops, clamp, and the max / min reductions, float32 and bfloat16, NaN and infinities in
the data, against eager: NaN exactly where eager has NaN, every other value equal."""
import pytest
import torch

import pyfuser

pytestmark = pytest.mark.gpu


def maximum(a, b):
    return torch.maximum(a, b)


def minimum(a, b):
    return torch.minimum(a, b)


def clamp(a, b):
    return torch.clamp(a, -0.5, 0.5) + b


def amax_rows(a, b):
    return a.amax(-1) + b.amin(-1)


def amax_cols(a, b):
    return a.amax(0) - b.amin(0)


def _data(dt, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(257, 130, generator=g)
    pick = torch.rand(x.shape, generator=g)
    x[pick < 0.01] = float("nan")
    x[(pick >= 0.01) & (pick < 0.02)] = float("inf")
    x[(pick >= 0.02) & (pick < 0.03)] = -float("inf")
    x[3] = float("nan")                        # a whole row of NaN
    x[5, 7] = 0.0
    return x.to(dt).cuda()


@pytest.mark.parametrize("dt", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("fn", [maximum, minimum, clamp, amax_rows, amax_cols])
def test_nan_propagates_as_eager(fn, dt):
    a, b = _data(dt, 1), _data(dt, 2)
    f = pyfuser.jit(torch.jit.script(fn))
    got, want = f(a, b), fn(a, b)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert torch.equal(got.isnan(), want.isnan())
    ok = ~want.isnan()
    assert torch.equal(got[ok], want[ok])
    assert not f.last_run.fallbacks
