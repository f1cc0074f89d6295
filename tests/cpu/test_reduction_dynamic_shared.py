"""Shared arrays past the static 48 KB a block (codegen/kernel_shared.py): a row staged whole over
a cluster of 2 blocks ($PYFUSER_RED_CLUSTER=2, $PYFUSER_RED_STAGE_BYTES raised) is printed as
slices of one `extern __shared__` buffer whose bytes the launch passes; the kernel IR (and so the
interpreter's result) is the one a static kernel would have. Kernels under 48 KB stay static."""
import pytest
import torch

import reduction_cases as RC
from codegen_cases import run_plan
from pyfuser.codegen import kernel_ir as K
from pyfuser.codegen.kernel_shared import SHARED_LIMIT, STATIC_LIMIT, shared_layout
from pyfuser.ir import DataType
from pyfuser.ir.evaluator import evaluate
from pyfuser.ir.shapes import bind


def _plan_and_check(builder, shape, dt):
    """The plan of `builder` over the last axis of `shape`, its interpreted result equal to
    eager's, and its launch configuration."""
    f = RC.fusion(builder, len(shape), dt, [1])
    gen = torch.Generator().manual_seed(7)
    xs = RC.inputs_for(f, shape, dt, [1], "contiguous", gen)
    plan, outs = run_plan(f, xs)
    for i, (g, w) in enumerate(zip(outs, evaluate(f, xs))):
        RC.check_close(g, w, builder.__name__, shape[1], f"{builder.__name__} {dt} output {i}")
    return plan, plan.kernel.launch_config(bind(f, xs), plan.kernel_tensors(xs, outs)), (xs, outs)


@pytest.mark.parametrize("dt", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("builder", [RC.layer_norm, RC.softmax], ids=lambda b: b.__name__)
def test_a_staged_row_past_48_kb_uses_dynamic_shared_memory(builder, dt, monkeypatch):
    monkeypatch.setenv("PYFUSER_RED_CLUSTER", "2")
    monkeypatch.setenv("PYFUSER_RED_STAGE_BYTES", str(128 * 1024))
    width = 65536 if dt is torch.float32 else 131072 // 2      # 128 / 64 KB a block
    plan, cfg, call = _plan_and_check(builder, (2, width), dt)
    layout = shared_layout(plan.kernel_ir)
    assert plan.params.stage and plan.params.cluster == 2
    assert layout.dynamic and layout.total > STATIC_LIMIT
    assert cfg.shared_mem == layout.total and cfg.block == (256, 1, 1)
    src = plan.kernel.source.split('extern "C"')[1]
    assert "extern __shared__ __align__(16) unsigned char pf_dyn_smem[];" in src
    assert "__shared__ " not in src.replace("extern __shared__", "")   # no static array left
    offsets = sorted(layout.offsets.values())
    assert offsets[0] == 0 and all(o % 16 == 0 for o in offsets)
    for name, off in layout.offsets.items():
        assert f"(&{name})" in src and f"pf_dyn_smem + {off})" in src
    # the launch configuration survives the plan cache's pickling (a closure stored by name)
    from pyfuser.runtime import plan_store
    again = plan_store.loads(plan_store.dumps(plan))
    xs, outs = call
    cfg2 = again.kernel.launch_config(bind(again.fusion, xs), again.kernel_tensors(xs, outs))
    assert cfg2.shared_mem == layout.total
    pytest.importorskip("cuda.bindings.nvrtc")
    from pyfuser.runtime import nvrtc
    nvrtc.compile_cuda(plan.kernel.source, plan.kernel.name, "sm_90", use_disk_cache=False)


def test_the_default_cluster_row_stays_static(monkeypatch):
    plan, cfg, _ = _plan_and_check(RC.layer_norm, (2, 65536), torch.float32)
    assert plan.params.stage and not shared_layout(plan.kernel_ir).dynamic
    assert cfg.shared_mem == 0 and "pf_dyn_smem" not in plan.kernel.source


def _kernel(*arrays):
    return K.Kernel("k", [], {}, "int", 256,
                    [K.Alloc(n, dt, dims, space) for n, dt, dims, space in arrays])


def test_layout_offsets_totals_and_limits():
    k = _kernel(("a", DataType.Float, (3,), "shared"), ("r", DataType.Float, (100,), "local"),
                ("b", DataType.Half, (5, 3), "shared"), ("c", DataType.Double, (), "shared"))
    lay = shared_layout(k)
    assert lay.offsets == {"a": 0, "b": 16, "c": 48} and lay.total == 64
    assert not lay.dynamic and lay.launch_bytes == 0
    big = shared_layout(_kernel(("a", DataType.Float, (STATIC_LIMIT // 4 + 1,), "shared")))
    assert big.dynamic and big.launch_bytes == big.total == STATIC_LIMIT + 16
    with pytest.raises(ValueError, match="more than"):
        shared_layout(_kernel(("a", DataType.Float, (SHARED_LIMIT // 4 + 1,), "shared")))
    with pytest.raises(ValueError, match="declared twice"):
        shared_layout(_kernel(("a", DataType.Float, (1,), "shared"),
                              ("a", DataType.Float, (1,), "shared")))


def test_a_stage_budget_out_of_range_is_an_error(monkeypatch):
    """Checked on every reduction plan, staged or not (a short row's mean here)."""
    monkeypatch.setenv("PYFUSER_RED_STAGE_BYTES", str(1 << 30))
    with pytest.raises(ValueError, match="PYFUSER_RED_STAGE_BYTES"):
        _plan_and_check(RC.mean, (4, 64), torch.float32)

