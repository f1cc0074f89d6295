"""Seed 002 on CUDA tensors at full size: bookend views cost no kernel, the transpose runs as the
transpose scheduler's kernel; every result checked against eager, kernels counted by fs.last_run
and by the profiler."""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from bench.common import load_module_from_path  # noqa: E402

pytestmark = pytest.mark.gpu

C = load_module_from_path("segment_cases", os.path.join(
    os.path.dirname(__file__), "..", "cpu", "segment_cases.py"), fresh=True, register=False)


def _cuda_kernels(fn) -> int:
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
               and "memcpy" not in e.name.lower() and "memset" not in e.name.lower())


@pytest.mark.parametrize("two", [False, True])
def test_gelu_bookend_views(two):
    fs = C.gelu(C.FULL_GELU, two_outputs=two)
    x = torch.randn(8192, 3072, device="cuda")
    outs = fs.execute([x])
    torch.testing.assert_close(outs[-1], C.gelu_eager(x, C.FULL_GELU))
    assert fs.last_run.kernels == 1 and fs.last_run.launched == 1
    assert _cuda_kernels(lambda: fs.execute([x])) == 1
    if two:
        assert outs[0].data_ptr() == x.data_ptr() and outs[0]._base is x


@pytest.mark.parametrize("keep", C.ALL_KEEPS)
def test_sequential(keep):
    fs = C.sequential(keep, C.FULL_GELU)
    x = torch.randn(8192, 3072, device="cuda")
    torch.testing.assert_close(fs.execute([x])[0], C.sequential_eager(x, keep, C.FULL_GELU))
    assert fs.last_run.kernels == 1 and _cuda_kernels(lambda: fs.execute([x])) == 1


def test_transpose_bookend_views():
    fs = C.transpose(C.FULL_TR)
    x = torch.randn(768, 128, 64, device="cuda")
    (out,) = fs.execute([x])
    assert torch.equal(out, C.transpose_eager(x, C.FULL_TR))
    assert [(s.kind, s.scheduler) for s in fs.last_run.segments] == \
        [("host", None), ("kernel", "transpose"), ("host", None)]
    assert _cuda_kernels(lambda: fs.execute([x])) == 1


@pytest.mark.parametrize("shape,perm", [((64, 512, 768), (0, 2, 1)), ((4096, 4096), (1, 0))])
def test_real_transposes(shape, perm):
    from pyfuser.ir import DataType, Fusion
    from pyfuser.ir import builder as B
    from pyfuser.runtime.dispatch import execute_fusion, last_report
    f = Fusion()
    with f:
        x = B.define_tensor([-1] * len(shape), DataType.Float)
        f.add_output(B.set_(B.permute(x, list(perm))))
    t = torch.randn(*shape, device="cuda")
    (out,) = execute_fusion(f, [t])
    assert torch.equal(out, t.permute(perm).contiguous())
    assert last_report(f).segments[1].scheduler == "transpose"


def test_views_only_and_reduction():
    f = C.views_only()
    from pyfuser.runtime.dispatch import execute_fusion, last_report
    x = torch.randn(64, 48, device="cuda")
    outs = execute_fusion(f, [x])
    assert outs[2] is x and last_report(f).kernels == 0
    assert _cuda_kernels(lambda: execute_fusion(f, [x])) == 0
    f = C.reduction_then_pointwise()
    x = torch.randn(1000, 513, device="cuda")
    for o, r in zip(execute_fusion(f, [x]), C.reduction_eager(x)):   # within a 513-sum's rounding
        torch.testing.assert_close(o, r, rtol=1e-5, atol=1e-4)


def test_cached_calls_with_fresh_tensors():
    """The second and later calls replay a recorded program: check them on new inputs."""
    fs = C.transpose(C.FULL_TR)
    g = C.gelu(C.FULL_GELU, two_outputs=True)
    for _ in range(3):
        x = torch.randn(768, 128, 64, device="cuda")
        (out,) = fs.execute([x])
        assert torch.equal(out, C.transpose_eager(x, C.FULL_TR))
        y = torch.randn(8192, 3072, device="cuda")
        view, res = g.execute([y])
        torch.testing.assert_close(res, C.gelu_eager(y, C.FULL_GELU))
        assert view._base is y and view.shape == (64, 128, 3072)
    assert fs.last_run.segments[1].scheduler == "transpose" and fs.last_run.launched == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_layer_norm_backward_cut_recomputes_x_hat(monkeypatch, dtype):
    """A layer norm's backward cut in two kernels (as rows too long for the inner-outer kernel
    are; here with that scheduler off), the dx kernel recomputing x_hat and dy * w from the
    inputs (segment/recompute.py), against eager, at 1024 x 65536."""
    monkeypatch.setenv("PYFUSER_INNER_OUTER", "0")
    import pyfuser.frontend.lowering.aten_backward as AB
    from pyfuser.ir import DataType, Fusion
    from pyfuser.ir import builder as B
    from pyfuser.runtime import dispatch
    from pyfuser.segment.segmenter import segment
    dt = {torch.float32: DataType.Float, torch.bfloat16: DataType.BFloat16}[dtype]
    m, n = 1024, 65536
    f = Fusion()
    with f:
        dy, x = B.define_tensor([-1, -1], dt), B.define_tensor([-1, -1], dt)
        mean, rstd = B.define_tensor([-1, 1], DataType.Float), B.define_tensor([-1, 1], DataType.Float)
        w = B.define_tensor([-1], dt)
        for o in AB._layer_norm_backward(dy, x, [n], mean, rstd, w, w, [True, True, True]):
            f.add_output(o)
    torch.manual_seed(0)
    x = torch.randn(m, n, device="cuda", dtype=dtype)
    w = torch.randn(n, device="cuda", dtype=dtype)
    _, mean, rstd = torch.native_layer_norm(x, [n], w, w, 1e-5)
    dy = torch.randn(m, n, device="cuda", dtype=dtype)
    got = dispatch.execute_fusion(f, [dy, x, mean, rstd, w])
    want = torch.ops.aten.native_layer_norm_backward(dy, x, [n], mean, rstd, w, w, [True] * 3)
    for g, w_ in zip(got, want):
        assert g.dtype == w_.dtype and g.shape == w_.shape
        scale = max(1.0, w_.float().abs().max().item())
        tol = 1e-4 if dtype == torch.float32 else 3e-2
        torch.testing.assert_close(g.float(), w_.float(), rtol=tol, atol=tol * scale)
    report = dispatch.last_report(f)
    assert report.eager_segments == 0 and report.launched == 2
    kernels = [s for s in segment(f).segments if s.kind == "kernel"]
    written = {id(o) for s in kernels for o in s.outputs}
    assert len(kernels) == 2 and not [v for s in kernels for v in s.inputs if id(v) in written]
    assert any(s.recomputed for s in kernels)
