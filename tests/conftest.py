"""Shared pytest setup: tests marked `gpu` are skipped when no CUDA device is available; every
test starts with an empty FusionCache; `fresh_compile` (for torch.compile tests, through
`pytestmark = pytest.mark.usefixtures("fresh_compile")`) resets Dynamo and pyfuser's list of
compiled graphs around a test. The CPU interpreter's global-memory race check
(PYFUSER_INTERP_RACECHECK, codegen/interpreter_global.py) is on unless the environment says
otherwise (PYFUSER_INTERP_RACECHECK=0): about 7% of the CPU tests' time (docs/codegen.md)."""
import os

import pytest

os.environ.setdefault("PYFUSER_INTERP_RACECHECK", "1")


def pytest_collection_modifyitems(config, items):
    try:
        import torch
        has_gpu = torch.cuda.is_available()
    except Exception:  # noqa: BLE001 - no usable torch means no GPU
        has_gpu = False
    if has_gpu:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _fresh_fusion_cache():
    """Each test starts with an empty FusionCache (as a new process would): a definition repeated
    within a test is a cache hit, one repeated across tests is not shared."""
    from pyfuser.frontend.fusion_cache import FusionCache
    FusionCache.reset()
    yield


@pytest.fixture
def fresh_compile():
    import torch
    from pyfuser.frontend.fx import reset_compiled
    torch._dynamo.reset()
    reset_compiled()
    yield
    torch._dynamo.reset()


@pytest.fixture
def tail_on(monkeypatch):
    """The tail scheduler is off by default (schedule/tail.py); its tests turn it on. Regions are
    lowered once per region (their Fusion's segments cut once, whatever the knob said then):
    the lowering cache is emptied before and after, so that no other test gets the segments
    cut here, nor these tests segments cut without the knob."""
    from pyfuser.frontend.fx.compile_graph import clear_cache
    clear_cache()
    monkeypatch.setenv("PYFUSER_TAIL", "1")
    yield
    clear_cache()

@pytest.fixture
def no_graphed_calls():
    """torch.compile's graphed calls of earlier tests forgotten (graphed_calls() lists this
    test's)."""
    from pyfuser.frontend.fx import cuda_graphs
    cuda_graphs._LIVE.clear()
    yield


@pytest.fixture
def fake_graphs(monkeypatch):
    """torch.compile's graphed calls capture and replay with tests/cpu/fake_graphs.py's
    stand-in (CPU tensors stand for CUDA ones); the stand-in, for its counts."""
    from fake_graphs import FakeGraphs
    from pyfuser.frontend.fx import cuda_graphs
    g = FakeGraphs()
    monkeypatch.setattr(cuda_graphs, "Backend", lambda: g)
    return g


@pytest.fixture
def plans(monkeypatch):
    """Counts kernels planned (one per new kernel signature: what compiles a kernel)."""
    from pyfuser.codegen import api
    count = [0]
    orig = api.plan_kernel

    def counting(*a, **k):
        count[0] += 1
        return orig(*a, **k)
    monkeypatch.setattr(api, "plan_kernel", counting)
    return count


@pytest.fixture
def graph_cache_on(tmp_path, monkeypatch):
    """The torch.compile backend's graph cache on (PYFUSER_GRAPH_CACHE=1) with a cache directory
    of this test's own, its counters zeroed, a new process's state before and after."""
    from pyfuser.frontend.fx import graph_cache
    from pyfuser.runtime import nvrtc
    from test_compile_cache import _fresh_process_state      # tests/cpu is on the path
    monkeypatch.setenv("PYFUSER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PYFUSER_GRAPH_CACHE", "1")
    monkeypatch.setattr(graph_cache, "_PARTS", [])          # torch's pieces looked up anew
    for var in ("PYFUSER_DISABLE_DISK_CACHE", "PYFUSER_DISABLE_PLAN_CACHE", "PYFUSER_DUMP"):
        monkeypatch.delenv(var, raising=False)
    _fresh_process_state()
    for k in graph_cache.stats:
        graph_cache.stats[k] = 0
    yield
    nvrtc.wait_all()
    _fresh_process_state()
