"""FusionExecutor and dispatch on the CPU, against a hand-written kernel plan (a fake codegen api):
cache layers, kernel reuse across sizes, stats, poison hook, fallback, dumps. The end-to-end tests
with the real codegen are in test_runtime_interpret.py."""
import math
import sys
import types

import pytest
import torch

pytest.importorskip("cuda.bindings.nvrtc", reason="cuda-bindings (NVRTC) is not installed")

from pyfuser.codegen.kernel import GeneratedKernel, LaunchConfig, Param  # noqa: E402
from pyfuser.errors import ExecuteError, SchedulerError  # noqa: E402
from pyfuser.ir import DataType, Fusion  # noqa: E402
from pyfuser.ir import builder as B  # noqa: E402
from pyfuser.runtime import dispatch, executor as X  # noqa: E402
from pyfuser.runtime.call_keys import poison  # noqa: E402

SRC = r'''
extern "C" __global__ void pf_fake_add(const float* a, const float* b, float* out, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a[i] + b[i];
}
'''


class FakePlan:
    def __init__(self, fusion):
        self.fusion = fusion
        self.kernel = GeneratedKernel(
            "pf_fake_add", SRC,
            [Param("a", "void*", ("ptr", 0)), Param("b", "void*", ("ptr", 1)),
             Param("out", "void*", ("ptr", 2)), Param("n", "int64_t", ("numel", 2))],
            launch_config=lambda b, t: LaunchConfig((math.ceil(t[2].numel() / 128), 1, 1), (128, 1, 1)))
        self.kernel_ir, self.index_type = None, "int64_t"

    def allocate_outputs(self, bindings, inputs, device):
        return [torch.empty(bindings.shape(o), dtype=o.dtype.torch, device=device)
                for o in self.fusion.outputs]


def make_fake_api(refuse=None, plan_error=None):
    api = types.ModuleType("pyfuser.codegen.api")
    api.calls = {"signature": 0, "plan": 0, "interpret": 0}

    def signature(fusion, inputs):
        api.calls["signature"] += 1
        return tuple((x.dtype, x.is_contiguous()) for x in inputs)

    def plan_kernel(fusion, inputs):
        api.calls["plan"] += 1
        if plan_error:
            raise SchedulerError(plan_error)
        return FakePlan(fusion)

    def interpret(plan, inputs, outputs, bindings):
        api.calls["interpret"] += 1
        outputs[0].copy_(inputs[0] + inputs[1])

    api.signature, api.plan_kernel, api.interpret = signature, plan_kernel, interpret
    api.can_schedule = lambda f: (False, refuse) if refuse else (True, "")
    return api


@pytest.fixture
def fake_api(monkeypatch, tmp_path):
    monkeypatch.setenv("PYFUSER_CACHE_DIR", str(tmp_path / "cache"))
    api = make_fake_api()
    monkeypatch.setitem(sys.modules, "pyfuser.codegen.api", api)
    monkeypatch.setattr(X, "_api", lambda: api)
    dispatch.clear_caches()
    yield api
    dispatch.clear_caches()


def add_fusion():
    f = Fusion()
    with f:
        a = B.define_tensor([-1, -1], DataType.Float)
        b = B.define_tensor([-1, -1], DataType.Float)
        f.add_output(B.elementwise("add", a, b))
    return f


def test_interpret_mode_caches_and_reuses_across_sizes(fake_api):
    f = add_fusion()
    ex = X.FusionExecutor(f, mode="interpret")
    a, b = torch.randn(4, 5), torch.randn(4, 5)
    (out,) = ex.run([a, b])
    assert torch.equal(out, a + b)
    assert ex.last_run["compiled"] == 1 and not ex.last_run["cache_hit"] and ex.last_run["kernels"] == 1
    assert ex.last_run["compile_time_s"] > 0
    (out,) = ex.run([a, b])
    assert ex.last_run["cache_hit"] and ex.last_run["compiled"] == 0
    for shape in [(7, 3), (1, 9), (0, 4), (300, 17)]:
        a, b = torch.randn(shape), torch.randn(shape)
        (out,) = ex.run([a, b])
        assert torch.equal(out, a + b) and ex.last_run["compiled"] == 0
    assert ex.num_kernels_compiled() == 1 and fake_api.calls["plan"] == 1
    # a new signature (non-contiguous input) compiles again
    ex.run([torch.randn(5, 4).t(), torch.randn(4, 5)])
    assert ex.last_run["compiled"] == 1 and ex.num_kernels_compiled() == 2


def test_warm_start_from_disk(fake_api):
    f = add_fusion()
    x = [torch.randn(2, 2), torch.randn(2, 2)]
    X.FusionExecutor(f, mode="interpret").run(x)
    ex = X.FusionExecutor(f, mode="interpret")
    ex.run(x)
    assert ex.last_run["compiled"] == 1 and ex.last_run["disk_hit"] == 1
    assert ex.stats["nvrtc"] == 0


def test_poison_hook(fake_api, monkeypatch):
    f = add_fusion()
    monkeypatch.setenv("PYFUSER_POISON_OUTPUTS", "1")
    fake_api.interpret = lambda plan, inputs, outputs, b: None   # a kernel that writes nothing
    (out,) = X.FusionExecutor(f, mode="interpret").run([torch.randn(3, 3), torch.randn(3, 3)])
    assert torch.isnan(out).all()
    ints = [torch.empty(2, 3, dtype=torch.int32), torch.empty(4, dtype=torch.bool)]
    poison(ints)
    assert (ints[0] == 0x7F7F7F7F).all()
    assert (ints[1].view(torch.uint8) == 0x7F).all()


def test_scheduler_error_falls_back_to_evaluator(monkeypatch, tmp_path, caplog):
    api = make_fake_api(plan_error="no scheduler for this one")
    monkeypatch.setattr(X, "_api", lambda: api)
    ex = X.FusionExecutor(add_fusion(), mode="interpret")
    a, b = torch.randn(2, 3), torch.randn(2, 3)
    with caplog.at_level("INFO", logger="pyfuser"):
        (out,) = ex.run([a, b])
    assert torch.equal(out, a + b) and ex.last_run["fallback"] == "no scheduler for this one"
    ex.run([a, b])
    assert api.calls["plan"] == 1


def test_bad_inputs_are_execute_errors(fake_api):
    ex = X.FusionExecutor(add_fusion(), mode="interpret")
    with pytest.raises(ExecuteError):
        ex.run([torch.randn(2, 3)])
    with pytest.raises(ExecuteError):
        ex.run([torch.randn(2, 3), torch.randn(2, 3, dtype=torch.float64)])
    with pytest.raises(ExecuteError, match="cuda"):
        X.FusionExecutor(add_fusion(), mode="cuda").run([torch.randn(2, 3), torch.randn(2, 3)])


def test_dumps(fake_api, monkeypatch, capsys):
    monkeypatch.setenv("PYFUSER_DUMP", "launch_params,cuda_kernel")
    X.FusionExecutor(add_fusion(), mode="interpret").run([torch.randn(3, 100), torch.randn(3, 100)])
    err = capsys.readouterr().err
    assert "[cuda_kernel] pf_fake_add" in err and "pf_fake_add(const float* a" in err
    assert "[launch_params] pf_fake_add" in err and "grid=(3, 1, 1) block=(128, 1, 1)" in err


def test_dispatch_cpu_modes(fake_api, monkeypatch):
    f = add_fusion()
    a, b = torch.randn(2, 3), torch.randn(2, 3)
    monkeypatch.delenv("PYFUSER_CPU_EXECUTOR", raising=False)
    assert torch.equal(dispatch.execute_fusion(f, [a, b])[0], a + b)
    assert fake_api.calls["interpret"] == 1                       # the interpreter by default
    dispatch.execute_fusion(f, [a, b], mode="evaluator")
    assert fake_api.calls["interpret"] == 1
    monkeypatch.setenv("PYFUSER_CPU_EXECUTOR", "evaluator")
    assert torch.equal(dispatch.execute_fusion(f, [a, b])[0], a + b)
    assert fake_api.calls["interpret"] == 1
    dispatch.execute_fusion(f, [a, b], mode="interpret")
    assert fake_api.calls["interpret"] == 2 and fake_api.calls["plan"] == 1  # one executor per fusion
    assert dispatch.get_executor(f, "interpret").stats["runs"] == 2
    with pytest.raises(ValueError):
        dispatch.execute_fusion(f, [a, b], mode="bogus")


def test_dispatch_refused_fusion_uses_evaluator(monkeypatch, tmp_path, capsys):
    from pyfuser.schedule import registry
    api = make_fake_api(refuse="reductions are not pointwise")
    refusing = registry.Scheduler("pointwise", lambda f: (False, "reductions are not pointwise"),
                                  None)
    monkeypatch.setattr(registry, "SCHEDULERS", [refusing])     # the segmenter asks the registry
    monkeypatch.setitem(sys.modules, "pyfuser.codegen.api", api)
    monkeypatch.setattr(X, "_api", lambda: api)
    monkeypatch.setenv("PYFUSER_DUMP", "fallback")
    dispatch.clear_caches()
    f = add_fusion()
    a, b = torch.randn(2, 3), torch.randn(2, 3)
    assert torch.equal(dispatch.execute_fusion(f, [a, b], mode="interpret")[0], a + b)
    dispatch.execute_fusion(f, [a, b], mode="interpret")
    assert api.calls["plan"] == 0
    assert capsys.readouterr().err.count("reductions are not pointwise") == 1
    dispatch.clear_caches()


def test_executor_cache_dies_with_the_fusion(fake_api):
    import gc
    f = add_fusion()
    dispatch.execute_fusion(f, [torch.randn(1, 1), torch.randn(1, 1)], mode="interpret")
    assert len(dispatch._holders) == 1
    ex = dispatch.get_executor(f, "interpret")
    assert ex is not None and ex.stats["runs"] == 1
    del f, ex
    gc.collect()
    assert len(dispatch._holders) == 0
