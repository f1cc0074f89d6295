"""Reduction and normalization kernels through the CPU interpreter of their kernel IR, against
eager (the reference evaluator): every builder of reduction_cases over inner, outer and mixed
reduced axes, rows of 1, odd lengths, size-1 and size-0 axes, contiguous / transposed / sliced /
misaligned inputs, streamed and persistent schedules; every kernel compiles with NVRTC for sm_90.
The interpreter also fails a kernel whose barriers or shuffles are not block- / warp-uniform or
whose shared memory is raced on."""
import copy
import dataclasses

import pytest
import torch

import reduction_cases as RC
from codegen_cases import compile_many, run_plan
from pyfuser.codegen import api
from pyfuser.ir import DataType
from pyfuser.ir import builder as B
from pyfuser.codegen import kernel_ir as K
from pyfuser.schedule import reduction_heuristics as H
from pyfuser.ir.evaluator import evaluate
from pyfuser.ir.shapes import bind

SHAPES = [((37, 300), [1]), ((300, 37), [0]), ((6, 5, 7), [0, 2]), ((4, 3, 5, 6), [1, 2]),
          ((1, 129), [1]), ((129, 1), [0]), ((5, 1, 3), [1]), ((3, 5), [0, 1]), ((64, 1031), [1]),
          ((7, 2, 33), [2])]
PLANS: list = []


def run(builder, shape, axes, dt, layout, monkeypatch=None):
    f = RC.fusion(builder, len(shape), dt, axes)
    gen = torch.Generator().manual_seed(hash((builder.__name__, shape, layout)) % 2 ** 31)
    xs = RC.inputs_for(f, shape, dt, axes, layout, gen)
    plan, outs = run_plan(f, xs)
    want = evaluate(f, xs)
    n = 1
    for a in axes:
        n *= shape[a]
    for i, (g, w) in enumerate(zip(outs, want)):
        RC.check_close(g, w, builder.__name__, n, f"{builder.__name__} {shape} {axes} {dt} {layout} "
                       f"output {i} [{plan.scheduler} {plan.params.kind} persistent="
                       f"{plan.params.persistent}]")
    PLANS.append(plan)
    return plan


@pytest.mark.parametrize("shape,axes", SHAPES, ids=[f"{s}-{a}" for s, a in SHAPES])
@pytest.mark.parametrize("builder", RC.FLOAT_BUILDERS, ids=lambda b: b.__name__)
def test_float32_every_builder(builder, shape, axes):
    run(builder, shape, axes, torch.float32, "contiguous")


@pytest.mark.parametrize("layout", ["transposed", "sliced", "offset"])
@pytest.mark.parametrize("shape,axes", [SHAPES[0], SHAPES[1], SHAPES[2], SHAPES[9]],
                         ids=lambda x: str(x))
@pytest.mark.parametrize("builder", [RC.reduce_op("sum"), RC.softmax, RC.layer_norm, RC.welford,
                                     RC.rms_norm], ids=lambda b: b.__name__)
def test_layouts(builder, shape, axes, layout):
    run(builder, shape, axes, torch.float32, layout)


@pytest.mark.parametrize("dt", [torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("shape,axes", [SHAPES[0], SHAPES[1], SHAPES[8]], ids=lambda x: str(x))
@pytest.mark.parametrize("builder", [RC.reduce_op("sum"), RC.reduce_op("max"), RC.mean,
                                     RC.softmax, RC.layer_norm, RC.rms_norm, RC.var_mean],
                         ids=lambda b: b.__name__)
def test_other_float_dtypes(builder, shape, axes, dt):
    run(builder, shape, axes, dt, "contiguous")


@pytest.mark.parametrize("dt", [torch.int32, torch.int64, torch.int8, torch.bool])
@pytest.mark.parametrize("shape,axes", [SHAPES[0], SHAPES[1], SHAPES[2]], ids=lambda x: str(x))
@pytest.mark.parametrize("builder", RC.INT_BUILDERS, ids=lambda b: b.__name__)
def test_integer_dtypes(builder, shape, axes, dt):
    if dt == torch.bool and builder.__name__ == "prod":
        pytest.skip("prod of bool is an int64 product of 0/1 (covered by int8)")
    run(builder, shape, axes, dt, "contiguous")


@pytest.mark.parametrize("shape,axes", [((0, 5), [1]), ((5, 0), [1]), ((0, 5), [0]), ((5, 0), [0])],
                         ids=lambda x: str(x))
@pytest.mark.parametrize("builder", [RC.reduce_op("sum"), RC.welford, RC.mean],
                         ids=lambda b: b.__name__)
def test_size_zero(builder, shape, axes):
    run(builder, shape, axes, torch.float32, "contiguous")


def test_softmax_over_an_empty_axis_is_empty():
    f = RC.fusion(RC.softmax, 2, torch.float32, [1])
    x = torch.randn(5, 0)
    plan = api.plan_kernel(f, [x])
    b = bind(f, [x])
    (out,) = plan.allocate_outputs(b, [x], torch.device("cpu"))
    api.interpret(plan, [x], [out], b)
    assert out.shape == torch.softmax(x, 1).shape


def test_max_of_an_empty_axis_raises_as_eager():
    from pyfuser.errors import ExecuteError
    with pytest.raises(ExecuteError, match="size 0"):
        run(RC.reduce_op("max"), (5, 0), [1], torch.float32, "contiguous")


@pytest.mark.parametrize("knobs", [{"PYFUSER_RED_STEPS": "0"}, {"PYFUSER_RED_STEPS": "0", "PYFUSER_RED_UNROLL": "3"},
                                   {"PYFUSER_RED_BDIMX": "64"}, {"PYFUSER_RED_BDIMX": "4", "PYFUSER_RED_BDIMY": "8"},
                                   {"PYFUSER_RED_WAVES": "0"}], ids=lambda k: str(k))
@pytest.mark.parametrize("shape,axes", [SHAPES[0], SHAPES[1], SHAPES[2], SHAPES[8]], ids=lambda x: str(x))
@pytest.mark.parametrize("builder", [RC.softmax, RC.layer_norm, RC.reduce_op("sum"), RC.welford],
                         ids=lambda b: b.__name__)
def test_schedule_knobs(builder, shape, axes, knobs, monkeypatch):
    """Streamed instead of persistent, other unrolls, teams wider than a warp, narrow teams with
    several rows a block, one block per row block: the same results."""
    for k, v in knobs.items():
        monkeypatch.setenv(k, v)
    plan = run(builder, shape, axes, torch.float32, "contiguous")
    if knobs.get("PYFUSER_RED_STEPS") == "0":
        assert not plan.params.persistent


# remote accesses of a cluster row's combine: one per accumulator field (a lane per rank reads
# it, or pushes it)
CLUSTER_FIELDS = {"softmax": 2, "layer_norm": 3, "rms_norm": 1, "log_softmax": 2}


@pytest.mark.parametrize("push", ["0", "1"])
@pytest.mark.parametrize("cluster", ["2", "4", "8"])
@pytest.mark.parametrize("builder", [RC.softmax, RC.layer_norm, RC.rms_norm, RC.welford,
                                     RC.log_softmax], ids=lambda b: b.__name__)
def test_row_split_over_a_cluster(builder, cluster, push, monkeypatch):
    """A row held by a cluster of blocks (each its share in registers, partials combined through
    distributed shared memory by a tree: one remote access per field, whatever the cluster's
    size: a load by a lane per rank after a cluster barrier ($PYFUSER_RED_CLUSTER_PUSH=0), or a
    push by a lane per rank, by default): the same results; long rows pick clusters by
    themselves."""
    monkeypatch.setenv("PYFUSER_RED_CLUSTER_PUSH", push)
    monkeypatch.setenv("PYFUSER_RED_CLUSTER", cluster)
    monkeypatch.setenv("PYFUSER_RED_STEPS", "1")            # a normalization is persistent then
    shape = (3, 2 * 256 * 4 * int(cluster) + 44)
    if builder is RC.welford:
        monkeypatch.delenv("PYFUSER_RED_STEPS")
    plan = run(builder, shape, [1], torch.float32, "contiguous")
    if builder is not RC.welford:
        assert plan.params.cluster == int(cluster) and "__cluster_dims__" in plan.kernel.source
        body = plan.kernel.source[plan.kernel.source.index('extern "C" __global__'):]
        remote = "pf_push<" if push == "1" else "pf_dsmem_load("
        assert body.count(remote) == CLUSTER_FIELDS[builder.__name__]
        assert plan.params.push == (push == "1")
        assert body.count("pf_dsmem_load(") + body.count("pf_push<") == CLUSTER_FIELDS[builder.__name__]
    monkeypatch.delenv("PYFUSER_RED_CLUSTER")
    monkeypatch.delenv("PYFUSER_RED_STEPS", raising=False)
    if builder is not RC.welford:
        assert run(builder, (2, 40000), [1], torch.float32, "contiguous").params.cluster > 1


@pytest.mark.parametrize("cluster", [None, "2"])
@pytest.mark.parametrize("builder", [RC.softmax, RC.layer_norm, RC.welford], ids=lambda b: b.__name__)
def test_persistent_row_over_outer_reduced_groups(builder, cluster, monkeypatch):
    """Batch-norm-like rows (reduced axes on both sides of a kept one) held in registers: the
    linear index over the reduced groups is split per vector, alone or over a cluster."""
    if cluster:
        monkeypatch.setenv("PYFUSER_RED_CLUSTER", cluster)
    plan = run(builder, (5, 3, 2 * 256 * 4 + 8), [0, 2], torch.float32, "contiguous")
    if builder is not RC.welford:
        assert plan.params.persistent and plan.params.kind == "inner"
        assert len(plan.params.groups) == 3 and plan.params.cluster == int(cluster or 1)


STAGED_BUILDERS = [RC.softmax, RC.layer_norm, RC.rms_norm, RC.log_softmax, RC.welford, RC.var_mean,
                   RC.logsumexp]
# (softmax's element reads of a staged bfloat16 row were 16-bit shared-memory loads each, the
# shared-memory pipe 92% busy: 135 µs against 102 in registers; one vector read a step: 104)


def _async_loads(plan) -> int:
    return sum(1 for s in plan.kernel_ir.walk() if isinstance(s, K.Load) and s.async_copy)


@pytest.mark.parametrize("dt", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("builder", STAGED_BUILDERS, ids=lambda b: b.__name__)
def test_a_cluster_row_is_staged_in_shared_memory(builder, dt, monkeypatch):
    """A row's cluster holds its held loads in shared memory, copied by cp.async all in flight
    and waited for once (odd length: the last steps' copies are skipped and so are their reads),
    and reads each step's vector back with one vector read; with $PYFUSER_RED_STAGE=0 the same
    plan holds them in registers. Both equal eager."""
    monkeypatch.setenv("PYFUSER_RED_CLUSTER", "2")
    monkeypatch.setenv("PYFUSER_RED_STEPS", "2")
    shape = (3, 2 * 256 * 8 * 2 - 20)
    plan = run(builder, shape, [1], dt, "contiguous")
    staged = plan.params.stage
    if builder in (RC.softmax, RC.layer_norm, RC.rms_norm, RC.log_softmax):
        assert staged and plan.params.cluster == 2     # these hold their input a pass or more
    if staged:
        assert _async_loads(plan) >= 1 and "pf_cp_async_wait();" in plan.kernel.source
        assert "__align__(16)" in plan.kernel.source
        buf = next(s.dst for s in plan.kernel_ir.walk() if isinstance(s, K.Load) and s.async_copy)
        reads = [s for s in plan.kernel_ir.walk() if isinstance(s, K.VecCopy)]
        assert reads and all(r.src == buf and r.width == plan.params.vec for r in reads)
        assert f"{buf}[" not in plan.kernel.source.split("pf_cp_async_wait();")[1].replace(
            f"&{buf}[", "")                       # after the wait: vector reads only
        # registers for 6 blocks an SM (their staged rows fit its shared memory)
        assert plan.params.min_blocks == H.CLUSTER_MIN_BLOCKS
        assert f"__launch_bounds__(256, {H.CLUSTER_MIN_BLOCKS})" in plan.kernel.source
    monkeypatch.setenv("PYFUSER_RED_STAGE", "0")
    regs = run(builder, shape, [1], dt, "contiguous")
    assert not regs.params.stage and _async_loads(regs) == 0
    assert regs.params.min_blocks == 0
    assert "cp_async" not in regs.kernel.source.split('extern "C"')[1]


@pytest.mark.parametrize("rows", [1, 5, 7])
@pytest.mark.parametrize("dt", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("builder", STAGED_BUILDERS, ids=lambda b: b.__name__)
def test_staged_copies_issued_a_row_ahead(builder, dt, rows, monkeypatch):
    """$PYFUSER_RED_PREFETCH=1 with a capped grid ($PYFUSER_RED_GRID_BLOCKS=4: two clusters, each
    looping over rows): a row's staged copies are issued before the loop for the cluster's first
    row and at the end of each row for the next one (where a next row exists: 1, 5 and 7 rows
    over 2 clusters), into the slots each thread has just read; equal to eager, and the
    interpreter fails any read of a slot before its copy is waited for."""
    monkeypatch.setenv("PYFUSER_RED_CLUSTER", "2")
    monkeypatch.setenv("PYFUSER_RED_STEPS", "2")
    monkeypatch.setenv("PYFUSER_RED_GRID_BLOCKS", "4")
    monkeypatch.setenv("PYFUSER_RED_PREFETCH", "1")
    plan = run(builder, (rows, 2 * 256 * 8 * 2 - 20), [1], dt, "contiguous")
    p = plan.params
    if not p.stage:
        assert not p.prefetch
        return
    assert p.prefetch and p.cluster == 2 and p.max_blocks == 4
    f = plan.fusion
    xs = RC.inputs_for(f, (rows, 2 * 256 * 8 * 2 - 20), dt, [1], "contiguous",
                       torch.Generator().manual_seed(0))
    b = bind(f, xs)
    outs = plan.allocate_outputs(b, xs, torch.device("cpu"))
    grid = plan.kernel.launch_config(b, plan.kernel_tensors(xs, outs)).grid
    assert grid[0] == 2 * min(rows, 2)                 # whole clusters, at most two
    src = plan.kernel.source
    body = src[src.index('extern "C" __global__'):]
    loop = body.index("for (nidx_t rb =")
    # copies before the loop (the first row) and inside it (the next row), none in a pass
    assert "pf_cp_async<" in body[:loop] and "rb_next" in body[loop:]
    assert body.count("pf_cp_async_wait();") >= 1
    per_copy = _async_loads(plan)
    monkeypatch.delenv("PYFUSER_RED_PREFETCH")
    plain = run(builder, (rows, 2 * 256 * 8 * 2 - 20), [1], dt, "contiguous")
    assert not plain.params.prefetch and _async_loads(plain) * 2 == per_copy


FULL_BUILDERS = [RC.softmax, RC.layer_norm, RC.rms_norm, RC.log_softmax, RC.welford, RC.mean]


def _bounds_checks(plan) -> int:
    """Comparisons of a position with the row length or of a row with the rows, in the source."""
    body = plan.kernel.source.split('extern "C"')[1]
    return body.count("< rlen") + body.count("< rtot") + body.count("< rows")


@pytest.mark.parametrize("builder", FULL_BUILDERS, ids=lambda b: b.__name__)
@pytest.mark.parametrize("shape", [(64, 3072), (64, 3064), (63, 3072), (256, 256),
                                   (6, 2 * 512 * 4 * 4), (6, 2 * 512 * 4 * 4 + 8)], ids=str)
def test_rows_of_whole_steps_check_no_bounds(builder, shape, monkeypatch):
    """An inner plan whose every team position is in bounds (`full`: the rows a multiple of the
    block's rows, the row exactly the team's persistent steps or a whole number of its streamed
    steps) checks no bounds, and only such a plan; the persistent softmax and log_softmax of
    64x3072 and 256x256 are full, layer and RMS norms, which read their weights step by step
    in the last pass, are not by default ($PYFUSER_RED_FULL=1: they are), a held mean is (no
    later pass to load early), rows a vector short are not. All equal eager (run). `full` is
    part of the size class: a kernel for whole rows is never reused for other sizes."""
    plan = run(builder, shape, [1], torch.float32, "contiguous")
    p = plan.params
    if p.kind != "inner" or p.stage:
        return
    assert (_bounds_checks(plan) == 0) == p.full
    assert p.full in plan.params.size_class()
    rows, n = shape
    nv = n // p.vec
    if p.full:
        assert rows % p.bdimy == 0 and n % p.vec == 0
        if p.persistent:
            assert nv == p.steps * p.cluster * p.bdimx
        else:
            assert nv % (p.unroll * p.bdimx) == 0
    if p.persistent and shape in ((64, 3072), (256, 256)):
        stepwise = builder in (RC.layer_norm, RC.rms_norm)
        assert p.full != stepwise
        if stepwise:
            monkeypatch.setenv("PYFUSER_RED_FULL", "1")
            forced = run(builder, shape, [1], torch.float32, "contiguous")
            assert forced.params.full and _bounds_checks(forced) == 0
    if shape[1] in (3064, 2 * 512 * 4 * 4 + 8):
        assert not p.full


@pytest.mark.parametrize("full", [None, "1"], ids=["default", "forced"])
@pytest.mark.parametrize("shape,axes", [((32, 0), [1]), ((128, 0), [1]), ((32, 1, 0), [1, 2]),
                                        ((4, 8, 0), [0, 2])], ids=str)
@pytest.mark.parametrize("builder", [RC.softmax, RC.layer_norm], ids=lambda b: b.__name__)
def test_empty_rows_are_not_whole_steps(builder, shape, axes, full, monkeypatch):
    """An empty row counts as one vector in the plan (a persistent kernel has at least one
    step), which the bounds then skip: never `full`, also with $PYFUSER_RED_FULL=1 (rows of 32
    and 128 fill whole row blocks; the full kernel read element 0 of the empty input, a
    TypeError in the interpreter: softmax and logsumexp of a [32, 0] tensor through
    torch.compile). Softmax's outputs are empty (eager's amax of an empty row raises: nothing
    to compare); layer norm's mean and rstd are not."""
    if full:
        monkeypatch.setenv("PYFUSER_RED_FULL", full)
    if builder is RC.softmax:
        f = RC.fusion(builder, len(shape), torch.float32, axes)
        xs = RC.inputs_for(f, shape, torch.float32, axes, "contiguous")
        plan = api.plan_kernel(f, xs)
        b = bind(f, xs)
        outs = plan.allocate_outputs(b, xs, torch.device("cpu"))
        api.interpret(plan, xs, outs, b)
        assert [tuple(o.shape) for o in outs] == [shape]
    else:
        plan = run(builder, shape, axes, torch.float32, "contiguous")
    assert not plan.params.full and _bounds_checks(plan) > 0


@pytest.mark.parametrize("cluster", [None, "4"], ids=["block", "cluster"])
@pytest.mark.parametrize("shape,axes,layout", [((8, 0), [0, 1], "transposed"),
                                               ((256, 0), [0, 1], "sliced"),
                                               ((32, 32, 0), [0, 2], "transposed")], ids=str)
def test_an_empty_row_of_several_reduced_groups(shape, axes, layout, cluster, monkeypatch):
    """A persistent row over several reduced groups one of which is empty (here the innermost
    in memory is not): the row is empty. The launch checks that the plan covers the whole row
    (every reduced group: one linear index), not its innermost group alone, which raised "its
    size class does not match these sizes" for these rows through FusionExecutor too; a
    forced cluster holds one step of an empty row (no 0-element arrays: NVRTC rejects them,
    test_kernels_compile_for_sm90)."""
    if cluster:
        monkeypatch.setenv("PYFUSER_RED_CLUSTER", cluster)
    plan = run(RC.layer_norm, shape, axes, torch.float32, layout)
    p = plan.params
    assert p.persistent and p.steps >= 1 and p.cluster == int(cluster or 1)


def test_whole_rows_are_a_size_class_of_their_own(monkeypatch):
    """The same fusion on 3072- and 3064-long rows: different signatures (one kernel checks no
    bounds), and $PYFUSER_RED_FULL=0 keeps the checks."""
    f = RC.fusion(RC.softmax, 2, torch.float32, [1])
    gen = torch.Generator().manual_seed(0)
    xa = RC.inputs_for(f, (64, 3072), torch.float32, [1], "contiguous", gen)
    xb = RC.inputs_for(f, (64, 3064), torch.float32, [1], "contiguous", gen)
    assert api.signature(f, xa) != api.signature(f, xb)
    monkeypatch.setenv("PYFUSER_RED_FULL", "0")
    plan = run(RC.softmax, (64, 3072), [1], torch.float32, "contiguous")
    assert not plan.params.full and _bounds_checks(plan) > 0


def test_a_large_staged_row_keeps_the_register_default(monkeypatch):
    """A staged cluster row of more than CLUSTER_STAGE_BYTES a block (6 such blocks would not
    fit an SM's shared memory) asks for no blocks an SM: the compiler's register default."""
    monkeypatch.setenv("PYFUSER_RED_CLUSTER", "2")
    monkeypatch.setenv("PYFUSER_RED_STEPS", "10")          # 10 x 256 threads x 16 bytes: 40 KB
    plan = run(RC.softmax, (2, 2 * 256 * 4 * 10), [1], torch.float32, "contiguous")
    p = plan.params
    assert p.stage and p.cluster == 2 and p.steps * p.bdimx * p.vec * 4 > H.CLUSTER_STAGE_BYTES
    assert p.min_blocks == 0 and "__launch_bounds__(256)" in plan.kernel.source


def gelu_log_softmax(rank, dt, axes):
    """log_softmax(gelu(x)): the gelu (costly) is kept in registers between the passes."""
    x = RC.tensor(rank, dt)
    xf = B.cast(x, DataType.Float) if RC.TORCH[dt].is_reduced_float else x
    s = RC.ew("gelu", xf)
    d = RC.ew("sub", s, B.reduction("max", s, axes, keepdim=True))
    y = RC.ew("sub", d, RC.ew("log", B.reduction("sum", RC.ew("exp", d), axes, keepdim=True)))
    return B.cast(y, RC.TORCH[dt]) if RC.TORCH[dt].is_reduced_float else y


@pytest.mark.parametrize("dt", [torch.float32, torch.bfloat16])
def test_a_staged_row_keeping_values_keeps_the_register_default(dt, monkeypatch, capsys):
    """Six blocks an SM leave 40 registers a thread: the staged rows of plain normalizations
    fit them, values kept in registers between passes (steps x vec of each) do not: ptxas
    spilled 108 (bfloat16) and 120 (float32) bytes a thread of log_softmax(gelu(x)) on rows
    of 65536 (76-80 for a layer norm of gelu(x + bias), dropout + residual + layer norm),
    where its default takes 80 registers and spills nothing. Such a row asks for no blocks
    an SM; equal to eager (run), and no spill where NVRTC is here."""
    plan = run(gelu_log_softmax, (2, 65536), [1], dt, "contiguous")
    p = plan.params
    assert p.stage and p.cluster > 1 and p.kept >= 1
    assert p.min_blocks == 0 and "__launch_bounds__(256)" in plan.kernel.source
    plain = run(RC.log_softmax, (2, 65536), [1], torch.float32, "contiguous")
    assert plain.params.stage and plain.params.kept == 0
    assert plain.params.min_blocks == H.CLUSTER_MIN_BLOCKS
    pytest.importorskip("cuda.bindings.nvrtc")
    from pyfuser.runtime import nvrtc
    monkeypatch.setenv("PYFUSER_DUMP", "ptxas_verbose")
    capsys.readouterr()
    nvrtc.compile_cuda(plan.kernel.source, plan.kernel.name, "sm_90", use_disk_cache=False)
    log = capsys.readouterr().err
    assert "Used " in log and " 0 bytes spill stores" in log, log


@pytest.mark.parametrize("shape,axes", [((37, 300), [1]), ((5, 3, 2 * 256 * 4 + 8), [0, 2]),
                                        ((64, 1031), [1])], ids=str)
@pytest.mark.parametrize("builder", [RC.softmax, RC.layer_norm, RC.welford], ids=lambda b: b.__name__)
def test_staging_forced_on_blocks_of_several_rows(builder, shape, axes, monkeypatch):
    """$PYFUSER_RED_STAGE=1 stages wherever it fits (STAGE_BYTES a block): blocks of several
    rows (the buffer is [steps][bdimy][bdimx][V]), rows over outer reduced groups, odd lengths."""
    monkeypatch.setenv("PYFUSER_RED_STAGE", "1")
    plan = run(builder, shape, axes, torch.float32, "contiguous")
    p = plan.params
    if p.persistent and p.kind == "inner":                # one held float32 input
        fits = p.steps * p.bdimx * p.bdimy * p.vec * 4 <= H.STAGE_BYTES
        assert p.stage == fits and (_async_loads(plan) >= 1) == fits


def test_a_staged_read_before_its_wait_is_caught(monkeypatch):
    """The interpreter fails a kernel that reads what an async copy writes before the thread's
    AsyncWait (the copy may not have landed on a GPU)."""
    from pyfuser.codegen.interpreter import KernelRaceError
    monkeypatch.setenv("PYFUSER_RED_STAGE", "1")
    f = RC.fusion(RC.softmax, 2, torch.float32, [1])
    xs = RC.inputs_for(f, (37, 300), torch.float32, [1], "contiguous", torch.Generator().manual_seed(1))
    plan = copy.copy(api.plan_kernel(f, xs))        # a copy: plans may be cached
    assert plan.params.stage

    def drop(stmts):                                  # new statements, the plan's untouched
        return [dataclasses.replace(s, body=drop(s.body)) if isinstance(s, (K.Loop, K.If)) else s
                for s in stmts if not isinstance(s, K.AsyncWait)]
    plan.kernel_ir = dataclasses.replace(plan.kernel_ir, body=drop(plan.kernel_ir.body))
    b = bind(f, xs)
    outs = plan.allocate_outputs(b, xs, torch.device("cpu"))
    with pytest.raises(KernelRaceError, match="async copy"):
        api.interpret(plan, xs, outs, b)


def test_a_stage_knob_out_of_range_is_an_error(monkeypatch):
    monkeypatch.setenv("PYFUSER_RED_STAGE", "2")
    with pytest.raises(ValueError, match="PYFUSER_RED_STAGE=2"):
        run(RC.softmax, (3, 20000), [1], torch.float32, "contiguous")


def test_schedules_are_what_the_layout_says():
    p = run(RC.softmax, (37, 300), [1], torch.float32, "contiguous")
    assert (p.scheduler, p.params.kind, p.params.persistent, p.params.vec) == \
        ("inner_persistent", "inner", True, 4)
    p = run(RC.softmax, (300, 37), [0], torch.float32, "contiguous")
    assert (p.scheduler, p.params.kind) == ("outer_persistent", "outer")
    p = run(RC.softmax, (37, 300), [1], torch.float32, "transposed")
    assert (p.scheduler, p.params.kind) == ("outer_persistent", "outer")
    p = run(RC.reduce_op("sum"), (6, 5, 7), [0, 2], torch.float32, "contiguous")
    assert p.scheduler == "reduction" and p.params.kind == "inner" and p.params.groups == [[0], [1], [2]]
    assert "__shfl_xor_sync" in p.kernel.source


def test_kernels_compile_for_sm90():
    """Every distinct kernel the tests above generated, compiled as one NVRTC module."""
    pytest.importorskip("cuda.bindings.nvrtc")
    if not PLANS:
        run(RC.softmax, (37, 300), [1], torch.float32, "contiguous")
    compile_many(PLANS)


@pytest.mark.parametrize("value", ["3", "32"])
def test_a_cluster_knob_out_of_range_is_an_error(value, monkeypatch):
    """$PYFUSER_RED_CLUSTER takes powers of two up to 16 (the widest cluster sm_90 launches);
    anything else is a one-line error naming the knob, not a kernel that cannot launch."""
    monkeypatch.setenv("PYFUSER_RED_CLUSTER", value)
    with pytest.raises(ValueError, match=f"PYFUSER_RED_CLUSTER={value}"):
        run(RC.softmax, (3, 20000), [1], torch.float32, "contiguous")


def test_an_output_broadcast_along_a_reduced_axis_is_not_written_by_every_thread():
    """log(r) of a row input r [N, 1] returned beside a sum over both axes of [N, C]: the
    reduction kernel wrote it from every thread along C, a race the interpreter caught (found
    by a KL divergence's training graph). The reduction schedulers refuse such a group; the
    segmenter computes the output in a pointwise kernel of its own."""
    import pyfuser
    from pyfuser.schedule import reduction_graph as RG

    def f(x, r):
        a = torch.log(r)
        return a, (x - a).sum()
    x, r = torch.randn(6, 11), torch.rand(6, 1) + 0.5
    g = pyfuser.jit(f)
    got = g(x, r)
    for u, v in zip(got, f(x, r)):
        torch.testing.assert_close(u, v)
    assert not g.last_run.fallbacks
    from pyfuser.ir.fusion import Fusion
    with Fusion() as fusion:
        xt = B.define_tensor([-1, -1], DataType.Float)
        rt = B.define_tensor([-1, 1], DataType.Float)
        fusion.add_input(xt)
        fusion.add_input(rt)
        a = B.elementwise("log", rt)
        fusion.add_output(a)
        fusion.add_output(B.reduction("sum", B.elementwise("sub", xt, a), [0, 1], False))
    with pytest.raises(RG.NotAReduction, match="broadcast along reduced axes"):
        RG.analyze(fusion)
    # a reduced axis of size 1 (a broadcast of the reduction's input) has one thread: an output
    # broadcast along it is written once, and the group stays one reduction
    with Fusion() as fusion:
        xt = B.define_tensor([-1, 1], DataType.Float)
        fusion.add_input(xt)
        fusion.add_output(B.elementwise("mul", xt, 2.0))
        fusion.add_output(B.reduction("sum", xt, [0, 1], False))
    RG.analyze(fusion)
