"""Seed 002 on CUDA tensors at full size: bookend views cost no kernel, the transpose runs as the
transpose scheduler's kernel; every result checked against eager, kernels counted by fs.last_run
and by the profiler."""
import importlib.util
import os

import pytest
import torch

pytestmark = pytest.mark.gpu

_spec = importlib.util.spec_from_file_location("segment_cases", os.path.join(
    os.path.dirname(__file__), "..", "cpu", "segment_cases.py"))
C = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(C)


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
