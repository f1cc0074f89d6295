"""End to end on the CPU with the real codegen: FusionExecutor in interpret mode plans each op-table
fusion, NVRTC-compiles its CUDA source (so every generated kernel is compiler-checked here), runs
the kernel's CPU interpreter and matches the reference evaluator; plus kernel reuse across sizes
and the dispatch switch PYFUSER_CPU_EXECUTOR=interpret."""
import os
import sys

import pytest
import torch

pytest.importorskip("cuda.bindings.nvrtc", reason="cuda-bindings (NVRTC) is not installed")
pytest.importorskip("pyfuser.codegen.api", reason="the codegen API (pyfuser/codegen/api.py) is not there yet")

from pyfuser.ir.evaluator import evaluate  # noqa: E402
from pyfuser.runtime import dispatch  # noqa: E402
from pyfuser.runtime.executor import FusionExecutor  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from bench.common import load_module_from_path  # noqa: E402

C = load_module_from_path(
    "op_cases", os.path.join(os.path.dirname(__file__), "..", "gpu", "op_cases.py"),
    fresh=True, register=False)

MAIN = (torch.float32, torch.int64, torch.bool)
ALL_DTYPES_FOR = {"add", "mul", "div", "where", "sigmoid", "gt", "abs", "maximum"}
CASES = [c for c in C.cases() if c[1] in MAIN or c[0] in ALL_DTYPES_FOR]


@pytest.fixture(scope="module", autouse=True)
def _shared_cache(tmp_path_factory):
    old = os.environ.get("PYFUSER_CACHE_DIR")
    os.environ["PYFUSER_CACHE_DIR"] = str(tmp_path_factory.mktemp("kernels"))
    yield
    if old is None:
        os.environ.pop("PYFUSER_CACHE_DIR", None)
    else:
        os.environ["PYFUSER_CACHE_DIR"] = old


@pytest.mark.parametrize("case", CASES, ids=C.case_id)
def test_op_table_interpreted(case, monkeypatch):
    monkeypatch.setenv("PYFUSER_POISON_OUTPUTS", "1")
    name, dtype = case
    built = C.build(name, dtype)
    if built is None:
        pytest.skip(f"{name} does not take {dtype}")
    fusion, specs = built
    xs = C.inputs(name, specs, shape=(5, 7))
    ex = FusionExecutor(fusion, mode="interpret")
    outs = ex.run(xs)
    assert ex.last_run["fallback"] is None and ex.last_run["compiled"] == 1
    C.assert_same(outs, evaluate(fusion, xs), f"{name}/{dtype}")


def test_reuse_across_sizes_and_dispatch(monkeypatch):
    fusion, specs = C.build("add", torch.float32)
    monkeypatch.setenv("PYFUSER_CPU_EXECUTOR", "interpret")
    dispatch.clear_caches()
    for shape in [(16, 16), (32, 32), (48, 64), (16, 48)]:   # same vectorization class
        xs = C.inputs("add", specs, shape=shape)
        C.assert_same(dispatch.execute_fusion(fusion, xs), evaluate(fusion, xs), str(shape))
    from pyfuser.segment.segmenter import segment
    (seg,) = [s for s in segment(fusion).segments if s.kind == "kernel"]
    ex = dispatch.get_executor(seg.fusion, "interpret")
    assert ex is not None and ex.stats["runs"] == 4 and ex.num_kernels_compiled() == 1
    assert dispatch.last_report(fusion).launched == 1
    for shape in [(1, 9), (6, 1), (0, 3)]:              # size-1 / empty: other signatures
        xs = C.inputs("add", specs, shape=shape)
        C.assert_same(dispatch.execute_fusion(fusion, xs), evaluate(fusion, xs), str(shape))
    dispatch.clear_caches()


def test_interpret_executor_runs_grid_reductions_with_workspaces():
    """Regression: a column sum over many rows is split over blockIdx.z and combined through
    workspace buffers; the CPU executor packed the parameters without them (IndexError)."""
    from pyfuser import DataType, FusionDefinition
    with FusionDefinition() as fd:
        x = fd.define_tensor(symbolic_sizes=[-1, -1], contiguous=[True, True], dtype=DataType.Float)
        fd.add_output(fd.ops.sum(x, [0], False, DataType.Float))
    t = torch.randn(8192, 32)
    out, = fd.execute([t])
    torch.testing.assert_close(out, t.sum(0), rtol=1e-5, atol=1e-4)
