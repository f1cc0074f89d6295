"""The fusion gaps closed in the fifteenth session, as CUDA kernels: the `*_like` factories and
`fill` (tests/cpu/test_compile_factory_like.py), `slice_scatter` / `select_scatter` and indexing
by constant index lists (tests/cpu/test_compile_scatter_views.py), `repeat` and broadcasting
copies (tests/cpu/test_compile_repeat_copies.py): the CPU tests' programs at larger sizes on
the GPU against eager (shapes, dtypes, strides of axes > 1, values), no eager call, every
region's kernels launched on the device; Falcon's training step fuses its index ops there."""
from __future__ import annotations

import os
import sys

import pytest
import torch

import pyfuser
from pyfuser.frontend.fx import compiled_graphs
from pyfuser.runtime import dispatch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "cpu"))
import train_corpus as TC  # noqa: E402
from test_compile_factory_like import _likes, strides  # noqa: E402
from test_compile_repeat_copies import _repeats  # noqa: E402
from test_compile_scatter_views import _multi_query, _scatters  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("fresh_compile")]


def _close(got, want):
    for k, (g, w) in enumerate(zip(got, want)):
        assert (g.dtype, g.shape, strides(g)) == (w.dtype, w.shape, strides(w)), k
        torch.testing.assert_close(g, w, msg=f"output {k}")


def _ran_on_cuda():
    regions = [r for g in compiled_graphs() for r in g.regions]
    assert regions and all(r.eager_calls == 0 for r in regions)
    for r in regions:
        report = dispatch.last_report(r.fusion)
        assert report is not None and report.eager_segments == 0, (r, report)
        assert all(s.backend == "cuda" for s in report.segments if s.kind == "kernel"), report
    return {op for r in regions for op in r.ops}


def _run(f, *args):
    with torch.no_grad():
        _close(pyfuser.compile(f)(*args), f(*args))
    assert not [r for g in compiled_graphs() for r in g.unsupported.values()
                if "view the graph returns" not in r]
    return _ran_on_cuda()


@pytest.mark.parametrize("shape", [(300, 257), (1, 4097), (0, 64)])
def test_like_factories_on_cuda(shape):
    x = torch.randn(*shape, device="cuda")
    m = torch.randint(0, 5, shape, device="cuda")
    ops = _run(_likes, x, m)
    assert {"aten.zeros_like.default", "aten.full_like.default", "aten.fill.Scalar"} <= ops


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_scatters_on_cuda(dtype):
    # _scatters' select_scatter over the rows reads v[:rows]: at most v's 6 rows (513 rows, the
    # first version of this test, made eager itself raise)
    x = torch.randn(6, 6, device="cuda").to(dtype)
    s, v = torch.randn(6, 3, device="cuda").to(dtype), torch.randn(6, device="cuda").to(dtype)
    ops = _run(_scatters, x, s, v)
    assert {"aten.slice_scatter.default", "aten.select_scatter.default"} <= ops


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_constant_index_lists_forward_and_backward_on_cuda(dtype):
    x = torch.randn(8, 64, 4, 128, device="cuda").to(dtype)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    got, want = pyfuser.compile(_multi_query)(xa), _multi_query(xb)
    _close(got, want)
    w = [torch.randn_like(t) for t in got]
    sum((a * b).float().sum() for a, b in zip(got, w)).backward()
    sum((a * b).float().sum() for a, b in zip(want, w)).backward()
    torch.testing.assert_close(xa.grad, xb.grad)
    ops = _ran_on_cuda()
    assert "aten.slice_backward.default" in ops and not {o for o in ops if "index" in o}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_repeat_on_cuda(dtype):
    x, y = torch.randn(37, 129, device="cuda").to(dtype), torch.randn(1, 64, device="cuda")
    ops = _run(_repeats, x, y.to(dtype))
    assert "aten.repeat.default" in ops


def test_falcons_training_step_fuses_its_constant_indices_on_cuda():
    case = TC.TRAIN_CASES["falcon"]("cuda")
    runs, losses = TC.steps_beside_eager("falcon", case, pyfuser.compile(case.model))
    TC.assert_as_close_as_eager(*losses, "loss")
    left = [r for g in compiled_graphs() for r in g.unsupported.values()]
    assert not [r for r in left if "index" in r or "lift_fresh_copy" in r], left
    _ran_on_cuda()
