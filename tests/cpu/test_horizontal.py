"""The horizontal scheduler on the CPU: independent pointwise computations of different shapes in
one kernel, run by the kernel IR interpreter (PYFUSER_CPU_EXECUTOR=interpret) and checked against
eager (values, dtypes, strides); every generated kernel compiles with NVRTC for sm_90."""
import os
import sys

import pytest
import torch

from pyfuser.codegen import api
from pyfuser.ir import DataType
from pyfuser.ir import builder as B
from pyfuser.schedule import horizontal as H
from pyfuser.schedule import layout as L
from pyfuser.schedule import registry
from pyfuser.segment.segmenter import segment

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from bench.common import load_module_from_path  # noqa: E402


def _load(name):
    return load_module_from_path(name, os.path.join(os.path.dirname(__file__), f"{name}.py"),
                                 fresh=True, register=False)


HC = _load("horizontal_cases")
CC = _load("codegen_cases")


@pytest.fixture(autouse=True)
def _interpret(monkeypatch, tmp_path_factory):
    monkeypatch.setenv("PYFUSER_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "kernels"))
    monkeypatch.setenv("PYFUSER_POISON_OUTPUTS", "1")
    monkeypatch.setenv("PYFUSER_CPU_EXECUTOR", "interpret")
    torch.manual_seed(0)


def _kinds(fs):
    return [(s.kind, s.scheduler) for s in fs.last_run.segments]


def _plans(fs, inputs):
    """The kernel plans of the fusion's kernel segments for these inputs (planned again)."""
    from pyfuser.ir.evaluator import evaluate
    from pyfuser.ir.shapes import bind
    from pyfuser.segment.host import run_host
    sf = segment(fs.ir_fusion)
    b = bind(fs.ir_fusion, inputs)
    env = {id(v): x for v, x in zip(fs.ir_fusion.inputs, inputs)}
    plans = []
    for seg in sf.segments:
        if seg.kind == "host":
            for e in seg.exprs:
                env[id(e.output)] = run_host(e, env[id(e.inputs[0])], b)
            continue
        args = [env[id(v)] if id(v) in env else b.value(v) for v in seg.sub_inputs]
        if seg.kind == "kernel":
            plans.append(api.plan_kernel(seg.fusion, args))
        for o, x in zip(seg.outputs, evaluate(seg.fusion, args, torch.device("cpu"))):
            env[id(o)] = x
    return plans


# ---- one kernel for many casts -----------------------------------------------------------------
@pytest.mark.parametrize("k,seed", [(2, 0), (3, 1), (5, 2), (9, 3), (16, 4), (40, 5)])
def test_casts_are_one_kernel(k, seed):
    fs, inputs, eager = HC.casts(k, seed)
    outs = fs.execute(inputs)
    HC.check_against_eager(outs, eager(*inputs))
    assert _kinds(fs) == [("kernel", "horizontal")], _kinds(fs)
    assert fs.last_run.kernels == 1
    assert fs.last_run.launched == 1
    assert fs.last_run.segments[0].backend == "interpret"
    plans = _plans(fs, inputs)
    assert [p.scheduler for p in plans] == ["horizontal"]
    CC.compile_source(plans[0].kernel.source, plans[0].kernel.name)


@pytest.mark.parametrize("layouts", [("dense",), ("transposed",), ("sliced",)])
def test_every_layout(layouts):
    fs, inputs, eager = HC.casts(10, 7, layouts=layouts)
    HC.check_against_eager(fs.execute(inputs), eager(*inputs))
    assert _kinds(fs) == [("kernel", "horizontal")]


def test_size_zero_components_and_all_empty():
    shapes = [(0,), (5, 3), (4, 0), (1,)]
    fs, inputs, eager = HC.casts(4, 0, shapes=shapes, layouts=("dense",))
    HC.check_against_eager(fs.execute(inputs), eager(*inputs))
    assert fs.last_run.kernels == 1 and fs.last_run.launched == 1
    fs, inputs, eager = HC.casts(3, 0, shapes=[(0,), (4, 0), (0, 2, 3)], layouts=("dense",))
    HC.check_against_eager(fs.execute(inputs), eager(*inputs))
    assert _kinds(fs) == [("kernel", "horizontal")]
    plan, = _plans(fs, inputs)             # nothing to launch: an empty grid
    outs = [torch.empty(x.shape, dtype=o.dtype) for x, o in zip(inputs, eager(*inputs))]
    assert plan.kernel.launch_config(None, plan.kernel_tensors(inputs, outs)).grid == (0, 1, 1)


def test_ops_broadcast_and_a_shared_scalar():
    fs, inputs, eager = HC.mixed_ops()
    outs = fs.execute(inputs)
    HC.check_against_eager(outs, eager(*inputs))
    # the broadcast of the bias at the fusion's edge is a host view; one kernel for the rest
    assert [k for k in _kinds(fs) if k[0] == "kernel"] == [("kernel", "horizontal")], _kinds(fs)
    plan, = _plans(fs, inputs)
    assert len(plan.schedule.components) == 4
    # the scalar is one fusion input, a parameter of each component that reads it
    scalar, = [v for v in plan.fusion.inputs if v not in plan.fusion.tensor_inputs()]
    readers = [p.name for p in plan.kernel.params if p.source == ("scalar", scalar)]
    assert sorted(n.split("_")[0] for n in readers) == ["c0", "c2"], readers
    CC.compile_source(plan.kernel.source, plan.kernel.name)
    other = [torch.randn(37, 29), torch.randn(29), torch.randn(5, 1, 9), torch.randn(31),
             torch.randn(29, 37).t() * 30, -2.5]
    HC.check_against_eager(fs.execute(other), eager(*other))


def test_a_plan_serves_other_sizes_of_its_signature():
    """The block ranges come from the sizes at run time: a plan made for one set of sizes runs
    another with the same signature (sizes differing only where the signature does not see)."""
    f = CC.make_fusion(lambda: _two_casts())
    a = [torch.randn(301, 50), torch.randn(1000)]
    b = [torch.randn(1303, 50), torch.randn(8)]
    assert api.signature(f, a) == api.signature(f, b)
    plan = api.plan_kernel(f, a)
    assert plan.scheduler == "horizontal"
    for inputs in (a, b):
        _, outs = CC.run_plan(f, inputs, plan)
        assert torch.equal(outs[0], inputs[0].to(torch.bfloat16))
        assert torch.equal(outs[1], inputs[1].to(torch.float16))
    cfg = plan.kernel.launch_config(None, plan.kernel_tensors(b, outs))
    chunks = [p["unroll"] * p["block"] * p["vec"] for p in plan.params.as_dict()["per_component"]]
    assert cfg.grid == (-(-1303 * 50 // chunks[0]) + -(-8 // chunks[1]), 1, 1)


def _two_casts():
    x = B.define_tensor([-1, -1], DataType.Float)
    y = B.define_tensor([-1], DataType.Float)
    return [B.cast(x, DataType.BFloat16), B.cast(y, DataType.Half)]


def test_direct_fusion_interpreter_and_ir():
    f = CC.make_fusion(_two_casts)
    assert registry.accepting(f)[0] == "horizontal"
    inputs = [torch.randn(3, 7), torch.randn(130)]
    plan, outs = CC.run_plan(f, inputs)
    assert torch.equal(outs[0], inputs[0].bfloat16()) and torch.equal(outs[1], inputs[1].half())
    # one kernel IR, one block range per component, no grid caps
    ifs = [s for s in plan.kernel_ir.body if type(s).__name__ == "If"]
    assert len(ifs) == 2
    assert {p.source[0] for p in plan.kernel.params} <= {"ptr", "size", "stride"}
    assert sorted(p.source[1] for p in plan.kernel.params if p.source[0] == "ptr") == [0, 1, 2, 3]
    CC.compile_many([plan])


def test_int64_indexing_when_one_component_needs_it(monkeypatch):
    """One index type for the kernel: 64-bit when any component's output needs it; that is a
    fact of the signature (size_class), not only output 0's."""
    f = CC.make_fusion(_two_casts)
    small, big = [torch.randn(3, 7), torch.randn(5000)], [torch.randn(3, 7), torch.randn(6000)]
    monkeypatch.setattr(L, "INDEX32_LIMIT", 5500)
    assert api.signature(f, small) != api.signature(f, big)
    plan_small, plan_big = api.plan_kernel(f, small), api.plan_kernel(f, big)
    assert plan_small.index_type == "int" and plan_big.index_type == "int64_t"
    _, outs = CC.run_plan(f, big, plan_big)
    assert torch.equal(outs[1], big[1].half())
    CC.compile_many([plan_small, plan_big])


def test_components_read_common_inputs():
    """Two outputs of other shapes that read one input x: x joins nothing, so they are two
    components, each reading it (one kernel; one component, so two kernels, before)."""
    def build():
        x = B.define_tensor([-1, 7], DataType.Float)
        y = B.define_tensor([7], DataType.Float)
        a = B.elementwise("mul", x, B.broadcast(y, [True, False]))
        b = B.elementwise("add", x, B.broadcast(y, [True, False]))
        return [a, B.cast(y, DataType.Half), B.reduction("sum", b, [1])]
    f = CC.make_fusion(lambda: build()[:2])
    comps, why = H.components(f)
    assert comps is not None and len(comps) == 2, why
    x, y = torch.randn(5, 7), torch.randn(7)
    plan, outs = CC.run_plan(f, [x, y])
    assert plan.scheduler == "horizontal"
    assert torch.equal(outs[0], x * y) and torch.equal(outs[1], y.half())
    CC.compile_source(plan.kernel.source, plan.kernel.name)
    # a component the pointwise scheduler refuses (a reduction) still refuses the whole
    ok, why = H.can_schedule(CC.make_fusion(build))
    assert not ok and "pointwise refuses it" in why, why


def test_components_compute_a_load_free_value_they_share():
    """An iota the fusion does not return, read by two outputs of other shapes, joins nothing:
    two components, each computing it (one kernel; one component, so two kernels, before).
    Returned, it joins what reads it."""
    def build(returned):
        x = B.define_tensor([-1, 7], DataType.Float)
        pos = B.elementwise("add", B.iota(7), 3)
        a = B.elementwise("mul", x, B.cast(B.broadcast(pos, [True, False]), DataType.Float))
        return [a, B.cast(pos, DataType.Half)] + ([pos] if returned else [])
    f = CC.make_fusion(lambda: build(False))
    comps, why = H.components(f)
    assert comps is not None and len(comps) == 2, why
    assert all("iota" in [e.op_name for e in c.exprs] for c in comps)
    x = torch.randn(5, 7)
    plan, outs = CC.run_plan(f, [x])
    assert plan.scheduler == "horizontal"
    pos = torch.arange(7) + 3
    assert torch.equal(outs[0], x * pos.float()) and torch.equal(outs[1], pos.half())
    CC.compile_source(plan.kernel.source, plan.kernel.name)
    assert len(H.connected_components(CC.make_fusion(lambda: build(True)))) == 1


# ---- what the scheduler refuses ----------------------------------------------------------------
def test_one_component_never_goes_horizontal():
    def one():
        x = B.define_tensor([-1, -1], DataType.Float)
        return [B.cast(B.elementwise("add", x, x), DataType.BFloat16)]
    f = CC.make_fusion(one)
    ok, why = H.can_schedule(f)
    assert not ok and "one connected component" in why
    assert registry.accepting(f)[0] == "pointwise"


def test_symbolic_shapes_of_one_rank_go_horizontal():
    """Two disjoint casts of [-1, -1] tensors: their extents may differ, so pointwise refuses
    the pair and horizontal takes it (sizes equal or not at run time)."""
    def two():
        x, y = B.define_tensor([-1, -1], DataType.Float), B.define_tensor([-1, -1], DataType.Float)
        return [B.cast(x, DataType.BFloat16), B.cast(B.elementwise("add", y, y), DataType.BFloat16)]
    f = CC.make_fusion(two)
    assert registry.accepting(f)[0] == "horizontal"
    for x, y in ((torch.randn(6, 4), torch.randn(6, 4)), (torch.randn(2, 9), torch.randn(5, 3))):
        _, outs = CC.run_plan(f, [x, y])
        assert torch.equal(outs[0], x.bfloat16()) and torch.equal(outs[1], (y + y).bfloat16())


def test_mixed_reduction_and_casts(capsys, monkeypatch):
    """A reduction beside casts: horizontal refuses the whole (the reduction component); the
    reduction gets its kernel and the casts one horizontal kernel (two kernels, not k + 1)."""
    fs, inputs, eager = HC.reduction_and_casts(3)
    monkeypatch.setenv("PYFUSER_DUMP", "segmenter_logging")
    outs = fs.execute(inputs)
    monkeypatch.delenv("PYFUSER_DUMP")
    HC.check_against_eager(outs, eager(*inputs))
    kinds = _kinds(fs)
    assert sorted(k[1] for k in kinds) == ["horizontal", "reduction"], kinds
    assert fs.last_run.kernels == 2
    log = capsys.readouterr()
    text = log.out + log.err
    assert "horizontal scheduler" in text and "pointwise refuses it" in text
    for plan in _plans(fs, inputs):
        CC.compile_source(plan.kernel.source, plan.kernel.name)


def test_mixed_reduction_and_one_cast_is_two_kernels():
    fs, inputs, eager = HC.reduction_and_casts(1)
    HC.check_against_eager(fs.execute(inputs), eager(*inputs))
    assert sorted(s for _, s in _kinds(fs)) == ["pointwise", "reduction"]


def test_permutes_between_ops_and_transposes_are_refused():
    def permuted():
        x, y = B.define_tensor([-1, -1], DataType.Float), B.define_tensor([-1], DataType.Float)
        t = B.elementwise("add", B.permute(B.elementwise("add", x, x), [1, 0]), 1.0)
        return [B.cast(t, DataType.Half), B.cast(y, DataType.Half)]
    ok, why = H.can_schedule(CC.make_fusion(permuted))
    assert not ok and "PermuteOp" in why, why

    def reduced():
        x, y = B.define_tensor([-1, -1], DataType.Float), B.define_tensor([-1], DataType.Float)
        return [B.reduction("sum", x, [1]), B.cast(y, DataType.Half)]
    ok, why = H.can_schedule(CC.make_fusion(reduced))
    assert not ok and "component 0: pointwise refuses it" in why, why


@pytest.mark.parametrize("cap,kernels", [("components", 3), ("bytes", 4)])  # 4+4+2, 3+3+3+1
def test_capacity_splits_into_several_horizontal_kernels(monkeypatch, cap, kernels):
    if cap == "components":
        monkeypatch.setattr(H, "MAX_COMPONENTS", 4)
    else:                   # every 2-D cast is 2 pointers, 4 strides, 2 sizes: 64 bytes at most
        monkeypatch.setattr(H, "MAX_PARAM_BYTES", 3 * 64)
    shapes = [(5, 3), (4, 7), (9, 2), (3, 3), (6, 5)]
    fs, inputs, eager = HC.casts(10, 0, shapes=shapes, layouts=("dense",))
    HC.check_against_eager(fs.execute(inputs), eager(*inputs))
    assert fs.last_run.kernels == kernels, _kinds(fs)
    assert [s for _, s in _kinds(fs)] == ["horizontal"] * 3 + ["pointwise"] * (kernels - 3)
    sizes = [len(p.schedule.components) for p in _plans(fs, inputs) if p.scheduler == "horizontal"]
    assert sizes == ([4, 4, 2] if cap == "components" else [3, 3, 3])


def test_analysis_is_dropped_when_the_fusion_changes():
    f = CC.make_fusion(_two_casts)
    assert H.can_schedule(f)[0]
    with f:
        z = B.define_tensor([-1], DataType.Float)
        f.add_output(B.cast(z, DataType.Half))
    comps, _ = H.components(f)
    assert len(comps) == 3


def test_components_on_several_devices_never_share_a_kernel(monkeypatch):
    """Tensors on two devices: the horizontal segment runs on the evaluator (eager casts, each
    on its tensor's device) instead of one kernel. Simulated with a stand-in device check (one
    CPU here); the GPU test with two devices is tests/gpu/test_horizontal_gpu.py."""
    from pyfuser.segment import runtime as R
    fs, inputs, eager = HC.casts(3, 0, layouts=("dense",))
    monkeypatch.setattr(R, "_split_devices", lambda seg, args: seg.scheduler == "horizontal")
    outs = fs.execute(inputs)
    HC.check_against_eager(outs, eager(*inputs))
    assert fs.last_run.segments[0].backend == "evaluator" and fs.last_run.launched == 0
