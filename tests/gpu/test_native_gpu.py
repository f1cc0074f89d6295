"""The native cached-call runner on the GPU: it answers cached calls (plain, segmented with host
views, transpose, random numbers, a grid reduction's workspaces), bit for bit what the Python
path gives, on fresh tensors each call, on a side
stream, from a thread with no current context, and from several threads at once."""
import os
import sys
import threading

import pytest
import torch

from pyfuser.runtime import dispatch, native

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from bench.common import load_module_from_path  # noqa: E402

pytestmark = pytest.mark.gpu

C = load_module_from_path("segment_cases", os.path.join(
    os.path.dirname(__file__), "..", "cpu", "segment_cases.py"), fresh=True, register=False)


@pytest.fixture(autouse=True)
def _native_on(monkeypatch):
    monkeypatch.setenv("PYFUSER_NATIVE", "1")
    native.build()                      # an install step: built once, never on a call
    assert native.runner_module() is not None, "the native runner did not build (see the log)"


mul_add = C.mul_add


def column_sum():
    """sum over the rows of a tall matrix: a reduction split across blocks (workspaces)."""
    from pyfuser.frontend.definition import Fusion, FusionDefinition
    from pyfuser.ir import DataType
    fs = Fusion()
    with FusionDefinition(fs) as fd:
        x = fd.define_tensor(symbolic_sizes=[-1, -1], contiguous=[True, True], dtype=DataType.Float)
        fd.add_output(fd.ops.sum(x, [0], False, DataType.Float))
    return fs


CASES = {
    "mul_add": (mul_add, lambda: [torch.randn(5000, device="cuda") for _ in range(3)],
                lambda a, b, c: [a + b * c]),
    "gelu_views": (lambda: C.gelu(two_outputs=True),
                   lambda: [torch.randn(C.SMALL_GELU[0], C.SMALL_GELU[1], device="cuda")],
                   lambda x: [x.view(*C.SMALL_GELU[2]), C.gelu_eager(x)]),
    "transpose": (C.transpose, lambda: [torch.randn(*C.SMALL_TR[0], device="cuda")],
                  lambda x: [C.transpose_eager(x)]),
    "column_sum": (column_sum,            # small integers: every order of the sum is exact
                   lambda: [torch.randint(-8, 8, (65536, 256), device="cuda").float()],
                   lambda x: [x.sum(0)]),
}


def _runs_native(fs) -> bool:
    progs = dispatch.programs(fs.ir_fusion)
    return bool(progs.native) and progs.run == progs.native.run and len(progs.native) >= 1


@pytest.mark.parametrize("case", sorted(CASES))
def test_native_matches_python_path(case, monkeypatch):
    from pyfuser.frontend.fusion_cache import FusionCache
    define, make, eager = CASES[case]
    fs_native = define()
    monkeypatch.setenv("PYFUSER_NATIVE", "0")
    FusionCache.reset()                 # a second, separate fusion (not a cache hit)
    fs_python = define()
    fs_python.execute(make())
    monkeypatch.setenv("PYFUSER_NATIVE", "1")
    fs_native.execute(make())
    fs_native.execute(make())          # a program reaches the runner at its first hit
    assert _runs_native(fs_native) and not dispatch.programs(fs_python.ir_fusion).native
    for _ in range(3):
        xs = make()
        got, want = fs_native.execute(xs), fs_python.execute(xs)
        ref = eager(*xs)
        assert len(got) == len(want) == len(ref)
        for g, w, r in zip(got, want, ref):
            assert (g.shape, g.stride(), g.dtype) == (w.shape, w.stride(), w.dtype)
            assert torch.equal(g, w)
            torch.testing.assert_close(g, r)
    assert fs_native.last_run.launched == 1


def _dropout_fusion():
    """x * (u < 0.75) / 0.75 with u drawn in the kernel (Philox: a seed and offset per call)."""
    from pyfuser.ir import DataType, Fusion
    from pyfuser.ir import builder as B
    f = Fusion()
    with f:
        x = B.define_tensor([-1, -1], DataType.Float)
        u = B.rand([d.extent for d in x.logical])
        keep = B.elementwise("lt", u, 0.75)
        f.add_output(B.elementwise("where", keep, B.elementwise("mul", x, 1 / 0.75), 0.0))
        f.add_output(u)
    return f


def test_native_random_kernels_draw_the_python_paths_numbers(monkeypatch):
    """A random-number kernel's program runs in the runner, drawing per call the seed and offset
    the Python replay would (the same bits under rng.fixed), from the CUDA generator otherwise
    (torch.manual_seed repeats a run; consecutive calls differ)."""
    from pyfuser.ir import philox
    from pyfuser.runtime import rng
    f_native, f_python = _dropout_fusion(), _dropout_fusion()
    x = torch.randn(512, 1024, device="cuda")
    monkeypatch.setenv("PYFUSER_NATIVE", "0")
    for _ in range(2):
        dispatch.execute_fusion(f_python, [x])
    monkeypatch.setenv("PYFUSER_NATIVE", "1")
    for _ in range(2):
        dispatch.execute_fusion(f_native, [x])
    progs = dispatch.programs(f_native)
    assert progs.native is not None and progs.run == progs.native.run and len(progs.native) == 1
    assert not dispatch.programs(f_python).native
    for k in range(3):
        with rng.fixed(11, 4 * k):
            got = dispatch.execute_fusion(f_native, [x])
        with rng.fixed(11, 4 * k):
            want = dispatch.execute_fusion(f_python, [x])
        assert all(torch.equal(g, w) for g, w in zip(got, want))
        u = philox.uniform(11, 4 * k, 0, torch.arange(x.numel()), 24).view(x.shape).cuda()
        assert torch.equal(got[1], u)                        # the reference's numbers
        torch.testing.assert_close(got[0], torch.where(u < 0.75, x / 0.75, 0.0))
    torch.manual_seed(5)
    a = dispatch.execute_fusion(f_native, [x])[1]
    b = dispatch.execute_fusion(f_native, [x])[1]
    torch.manual_seed(5)
    c = dispatch.execute_fusion(f_native, [x])[1]
    assert torch.equal(a, c) and not torch.equal(a, b)


def test_native_on_a_side_stream():
    fs = mul_add()
    xs = [torch.randn(1 << 20, device="cuda") for _ in range(3)]
    fs.execute(xs)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        ys = [x * 2 for x in xs]                      # made on s: the kernel must follow them
        (out,) = fs.execute(ys)
        res = out.clone()
    s.synchronize()
    assert _runs_native(fs)
    torch.testing.assert_close(res, ys[0] + ys[1] * ys[2])


def test_native_from_a_thread_without_a_current_context():
    from pyfuser.runtime.driver import driver
    drv = driver()
    fs = mul_add()
    xs = [torch.randn(4096, device="cuda") for _ in range(3)]
    fs.execute(xs)
    fs.execute(xs)
    assert _runs_native(fs)
    res = {}

    def work():
        try:
            drv.cuCtxSetCurrent(drv.CUcontext(0))
            res["out"] = fs.execute(xs)[0]
        except Exception as e:  # noqa: BLE001
            res["error"] = e
    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert "error" not in res, res
    torch.cuda.synchronize()
    torch.testing.assert_close(res["out"], xs[0] + xs[1] * xs[2])


def test_native_from_concurrent_threads():
    fs = mul_add()
    fs.execute([torch.randn(777, device="cuda") for _ in range(3)])
    errors = []

    def work(k):
        try:
            for _ in range(40):
                xs = [torch.randn(777, device="cuda") for _ in range(3)]
                (out,) = fs.execute(xs)
                torch.testing.assert_close(out, xs[0] + xs[1] * xs[2])
        except Exception as e:  # noqa: BLE001
            errors.append(e)
    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert _runs_native(fs)
