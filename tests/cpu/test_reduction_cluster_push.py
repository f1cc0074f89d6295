"""A cluster row's combine by pushes (codegen/reduction_cluster_push.py, the default on cluster
rows) against the cluster-barrier combine ($PYFUSER_RED_CLUSTER_PUSH=0), through the CPU
interpreter (its mbarrier and race checks on):
- every builder whose rows take a cluster, float32 and bfloat16, clusters of 2 to 8: equal to
  the reference evaluator and bit-equal to the barrier combine (the same tree: Welford merges
  in rank order, sums and online pairs in either);
- a capped grid (each cluster loops over rows: the mbarriers' phases alternate and the blocks
  arrive on the cluster barrier at the end of a row that has a next one);
- every kernel generated here compiles with NVRTC for sm_90.
"""
import pytest
import torch

import reduction_cases as RC
from codegen_cases import compile_many, run_plan
from pyfuser.codegen import kernel_ir as K
from pyfuser.codegen.reduction_cluster_push import pushable, symmetric
from pyfuser.ir import DataType
from pyfuser.ir import exprs as E
from pyfuser.ir.evaluator import evaluate

PLANS: list = []
BUILDERS = [RC.softmax, RC.layer_norm, RC.rms_norm, RC.log_softmax]   # rows held: clusters


def run(builder, shape, dt, push: str, monkeypatch):
    monkeypatch.setenv("PYFUSER_RED_CLUSTER_PUSH", push)
    f = RC.fusion(builder, len(shape), dt, [1])
    xs = RC.inputs_for(f, shape, dt, [1], "contiguous", torch.Generator().manual_seed(7))
    plan, outs = run_plan(f, xs)
    for i, (g, w) in enumerate(zip(outs, evaluate(f, xs))):
        RC.check_close(g, w, builder.__name__, shape[1], f"{builder.__name__} {shape} {dt} "
                       f"push={push} output {i}")
    PLANS.append(plan)
    return plan, outs


def n_stmts(plan, cls) -> int:
    return sum(isinstance(s, cls) for s in plan.kernel_ir.walk())


@pytest.mark.parametrize("dt", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("cluster", ["2", "4", "8"])
@pytest.mark.parametrize("builder", BUILDERS, ids=lambda b: b.__name__)
def test_pushed_combine_equals_the_barrier_combine(builder, cluster, dt, monkeypatch):
    monkeypatch.setenv("PYFUSER_RED_CLUSTER", cluster)
    monkeypatch.setenv("PYFUSER_RED_STEPS", "1")
    shape = (3, 2 * 256 * 4 * int(cluster) + 44)
    pushed, got = run(builder, shape, dt, "1", monkeypatch)
    barrier, want = run(builder, shape, dt, "0", monkeypatch)
    assert pushed.params.cluster == int(cluster) and pushed.params.push and not barrier.params.push
    combines = n_stmts(pushed, K.MbarWait)
    assert combines >= 1 and n_stmts(pushed, K.MbarInit) == combines
    assert n_stmts(pushed, K.PushRemote) >= combines and n_stmts(barrier, K.PushRemote) == 0
    body = pushed.kernel.source[pushed.kernel.source.index('extern "C"'):]
    barrier_body = barrier.kernel.source[barrier.kernel.source.index('extern "C"'):]
    assert "pf_dsmem_load(" not in body and "pf_dsmem_load(" in barrier_body
    phases = [s.phase for s in pushed.kernel_ir.walk() if isinstance(s, K.ClusterSync)]
    assert phases == ["arrive", "wait", "arrive"]       # no whole cluster barrier at all
    for g, w in zip(got, want):
        assert torch.equal(g, w), f"{builder.__name__}: pushed and barrier combines differ"


@pytest.mark.parametrize("builder", [RC.layer_norm, RC.softmax], ids=lambda b: b.__name__)
def test_pushed_float64_partials(builder, monkeypatch):
    """Double partials are pushed as 8-byte elements (`st.async ... .b64`), bit-equal too."""
    monkeypatch.setenv("PYFUSER_RED_CLUSTER", "2")
    monkeypatch.setenv("PYFUSER_RED_STEPS", "1")
    shape = (3, 2 * 256 * 2 * 2 + 12)
    pushed, got = run(builder, shape, torch.float64, "1", monkeypatch)
    _, want = run(builder, shape, torch.float64, "0", monkeypatch)
    assert pushed.params.push and "pf_push<double>" in pushed.kernel.source
    for g, w in zip(got, want):
        assert torch.equal(g, w)


@pytest.mark.parametrize("rows", [1, 5, 7])
@pytest.mark.parametrize("builder", [RC.layer_norm, RC.softmax], ids=lambda b: b.__name__)
def test_pushed_combine_in_a_capped_grid(builder, rows, monkeypatch):
    """$PYFUSER_RED_GRID_BLOCKS=4: two clusters of 2, each looping over up to 4 rows: each
    row's combine waits for the phase of its row's parity, and a block's next row pushes only
    after every block of the cluster has arrived at the end of this one."""
    monkeypatch.setenv("PYFUSER_RED_CLUSTER", "2")
    monkeypatch.setenv("PYFUSER_RED_STEPS", "2")
    monkeypatch.setenv("PYFUSER_RED_GRID_BLOCKS", "4")
    shape = (rows, 2 * 256 * 8 * 2 - 20)
    pushed, got = run(builder, shape, torch.float32, "1", monkeypatch)
    _, want = run(builder, shape, torch.float32, "0", monkeypatch)
    assert pushed.params.push and pushed.params.max_blocks == 4
    src = pushed.kernel.source
    loop = src[src.index("for (nidx_t rb ="):]
    assert "pf_cluster_arrive();" in loop and "gridDim.x" in loop.split("pf_mbar_wait(")[1]
    for g, w in zip(got, want):
        assert torch.equal(g, w)


def test_what_is_pushed_and_what_merges_in_either_order():
    """Partials of 4- and 8-byte elements are pushed (others keep the barrier combine); a sum's
    merge is commutative in its bits (every lane merges with no select), Welford's is not."""
    assert pushable([DataType.Float, DataType.Float, DataType.Int32])
    assert pushable([DataType.Double, DataType.Int])
    assert not pushable([DataType.Bool]) and not pushable([DataType.Float, DataType.Half])
    welford = [e for e in RC.fusion(RC.layer_norm, 2, torch.float32, [1]).exprs
               if isinstance(e, E.WelfordOp)]
    sums = [e for e in RC.fusion(RC.rms_norm, 2, torch.float32, [1]).exprs
            if isinstance(e, E.ReductionOp) and e.info.name == "sum"]
    maxes = [e for e in RC.fusion(RC.reduce_op("max"), 2, torch.float32, [1]).exprs
             if isinstance(e, E.ReductionOp)]
    assert welford and sums and maxes
    assert not symmetric(welford[0]) and symmetric(sums[0]) and not symmetric(maxes[0])


def test_generated_kernels_compile_for_sm90(monkeypatch):
    pytest.importorskip("cuda.bindings.nvrtc")
    if not PLANS:                               # run alone: one pushed kernel of each dtype
        monkeypatch.setenv("PYFUSER_RED_CLUSTER", "2")
        monkeypatch.setenv("PYFUSER_RED_STEPS", "1")
        for dt in (torch.float32, torch.bfloat16):
            run(RC.layer_norm, (2, 2 * 256 * 4 * 2 + 44), dt, "1", monkeypatch)
    assert any(p.params.push for p in PLANS)
    compile_many(PLANS)


def test_rows_written_in_place_keep_the_barrier_combine(monkeypatch):
    """A training batch norm's running statistics are read by every block of a row's cluster
    and written in place by rank 0: the cluster barrier orders those reads before the write,
    so such a kernel keeps the barrier combine (no push) though its plan allows one."""
    from pyfuser.codegen import api
    from test_lowering_normalization import training_batch_norm_fusion
    monkeypatch.setenv("PYFUSER_RED_CLUSTER", "2")
    monkeypatch.setenv("PYFUSER_RED_STEPS", "1")
    x, w, b = torch.randn(2, 6, 32, 64), torch.randn(6), torch.randn(6)
    rm, rv = torch.zeros(6), torch.ones(6)
    fusion = training_batch_norm_fusion(x, w, b, rm, rv)
    plan = api.plan_kernel(fusion, [x, w, b, rm, rv])
    assert plan.params.cluster == 2 and plan.params.push and sorted(plan.inplace.values()) == [3, 4]
    body = plan.kernel.source[plan.kernel.source.index('extern "C"'):]
    assert n_stmts(plan, K.PushRemote) == 0 and "pf_dsmem_load(" in body
    assert "pf_cluster_sync();" in body
    PLANS.append(plan)
