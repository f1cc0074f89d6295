"""Review of the runtime caches (dispatch programs, executor fast keys, segment bindings): inputs
that change between calls must never hit a cached program that baked in the old value or layout.

Evaluator and interpreter paths run for real; the CUDA fast path runs against the fake driver of
test_runtime_fastpath.py (CPU tensors posing as CUDA ones), whose launches show every parameter."""
import os
import sys

import pytest
import torch

from pyfuser import DataType, Fusion, FusionDefinition
from pyfuser.runtime import dispatch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from bench.common import load_module_from_path  # noqa: E402

F, D64 = DataType.Float, DataType.Double


def _scaled_view():
    """view (host segment) -> mul by s * 2 (a scalar the host computes from input s)."""
    fs = Fusion()
    with FusionDefinition(fs) as fd:
        t = fd.define_tensor(symbolic_sizes=[-1, -1], contiguous=[True, True], dtype=F)
        s = fd.define_scalar(D64)
        v = fd.ops.view(t, original_shape=[4, 6], new_shape=[24])
        fd.add_output(fd.ops.mul(v, fd.ops.mul(s, fd.define_constant(2.0))))
    return fs


def _scaled():
    fs = Fusion()
    with FusionDefinition(fs) as fd:
        t = fd.define_tensor(symbolic_sizes=[-1], contiguous=[True], dtype=F)
        s = fd.define_scalar(D64)
        fd.add_output(fd.ops.mul(t, s))
    return fs


@pytest.fixture(params=["evaluator", "interpret"])
def cpu_mode(request, monkeypatch):
    monkeypatch.setenv("PYFUSER_CPU_EXECUTOR", request.param)
    dispatch.clear_caches()
    yield request.param
    dispatch.clear_caches()


def test_segmented_0dim_scalar_input_new_value(cpu_mode):
    """A scalar input given as a 0-dim tensor: the segment runner's Bindings cache (keyed by
    tensor shapes) must not keep the first call's value of s (nor of scalars computed from it)."""
    fs = _scaled_view()
    x = torch.randn(4, 6)
    for v in (2.0, 3.0, -1.5):
        (out,) = fs.execute([x, torch.tensor(v, dtype=torch.float64)])
        assert fs.last_run.host_segments == 1
        torch.testing.assert_close(out, x.reshape(24) * (v * 2))


def test_0dim_scalar_input_changed_in_place(cpu_mode):
    """The same 0-dim tensor object, its value changed in place between calls: a key holding the
    tensor (hashed by identity) would hit and reuse the old value's bindings."""
    for fs, x, ref in ((_scaled(), torch.randn(8), lambda x, v: x * v),
                       (_scaled_view(), torch.randn(4, 6), lambda x, v: x.reshape(24) * v * 2)):
        s = torch.tensor(2.0, dtype=torch.float64)
        for v in (2.0, 5.0, 5.0, -3.0):
            s.fill_(v)
            (out,) = fs.execute([x, s])
            torch.testing.assert_close(out, ref(x, v))


def test_0dim_scalar_same_value_other_dtype(cpu_mode):
    """Keys of a 0-dim scalar carry its dtype: 2 (int64) and 2.0 (float64) are equal as Python
    numbers but not as inputs."""
    fs = _scaled()
    x = torch.randn(8)
    for s in (torch.tensor(2.0, dtype=torch.float64), torch.tensor(2), torch.tensor(True),
              torch.tensor(2.5, dtype=torch.float32)):
        (out,) = fs.execute([x, s])
        torch.testing.assert_close(out, x * s.item())


def test_one_element_tensor_for_a_scalar_still_raises(cpu_mode):
    """A shape-[1] tensor with the value of an earlier 0-dim scalar must not hit its key (the
    check that a scalar is 0-dim lives on the slow path)."""
    from pyfuser.errors import ExecuteError
    fs = _scaled()
    x = torch.randn(8)
    fs.execute([x, torch.tensor(2.0, dtype=torch.float64)])
    with pytest.raises(ExecuteError, match="is a scalar"):
        fs.execute([x, torch.tensor([2.0], dtype=torch.float64)])


def test_python_scalar_value_and_type_changes(cpu_mode):
    fs = _scaled()
    x = torch.randn(8)
    for s in (2.0, 2, 3.0, True, -0.0, 0.0, 1e300 * 0 + 7):
        (out,) = fs.execute([x, s])
        torch.testing.assert_close(out, (x.double() * s).float())


# ---- the CUDA fast path, against the fake driver ---------------------------------------------
def _fastpath():
    pytest.importorskip("cuda.bindings.nvrtc", reason="cuda-bindings (NVRTC) is not installed")
    return load_module_from_path("_fp", os.path.join(
        os.path.dirname(__file__), "test_runtime_fastpath.py"), fresh=True, register=False)


try:
    fake = _fastpath().fake        # the fixture, shared
except pytest.skip.Exception:      # pragma: no cover - no NVRTC here
    fake = None


def _scalar_param(launch):
    vals = launch[3]
    floats = [v for k, v in vals.items() if isinstance(v, float)]
    assert len(floats) == 1, vals
    return floats[0]


@pytest.mark.skipif(fake is None, reason="cuda-bindings (NVRTC) is not installed")
def test_fast_path_0dim_scalar_changed_in_place(fake):
    fs = _scaled()
    x = torch.randn(64)
    s = torch.tensor(2.0, dtype=torch.float64)
    for v in (2.0, 2.0, 5.0, 5.0, -1.0):
        s.fill_(v)
        fs.execute([x, s])
        assert _scalar_param(fake.launches[-1]) == v


@pytest.mark.skipif(fake is None, reason="cuda-bindings (NVRTC) is not installed")
def test_fast_path_segmented_0dim_scalar(fake):
    fs = _scaled_view()
    x = torch.randn(4, 6)
    s = torch.tensor(2.0, dtype=torch.float64)
    for v in (2.0, 2.0, 3.0, 3.0):
        s.fill_(v)
        fs.execute([x, s])
        assert fs.last_run.host_segments == 1
        assert _scalar_param(fake.launches[-1]) == v * 2
    for v in (4.0, 4.0):
        fs.execute([x, torch.tensor(v, dtype=torch.float64)])
        assert _scalar_param(fake.launches[-1]) == v * 2
