"""Picks (reduction_graph.Pick): a sum over the row of where(iota == index, X, 0), the way
cross-entropy picks its target's logit, is read as the one element X[row, index] instead of a
compare, a select and an add on every element. The kernels run through the CPU interpreter of
their kernel IR and are compared with the reference evaluator bit for bit: the pick is exact
(a -0.0 at the index comes out +0.0, as from the sum; an index out of range gives 0.0; a NaN
elsewhere in the row does not reach it). Every kernel compiles with NVRTC for sm_90."""
import pytest
import torch

import reduction_cases as RC
from codegen_cases import compile_many, run_plan
from pyfuser.ir import DataType
from pyfuser.ir import builder as B
from pyfuser.ir.evaluator import evaluate

ew = B.elementwise
PLANS: list = []


def picked_and_max(dt, index_dt=torch.int64):
    """(sum over the row of where(class == index, x, 0), max over the row) of [N, C] x."""
    x = RC.tensor(2, dt)
    t = B.define_tensor([-1], RC.TORCH[index_dt])
    xc = B.cast(x, DataType.Float) if dt in (torch.bfloat16, torch.float16) else x
    classes = B.broadcast(B.iota(x.logical[1].full_extent, 0, 1, DataType.Int), [True, False])
    onehot = ew("eq", classes, B.broadcast(t, [False, True]))
    return B.reduction("sum", ew("where", onehot, xc, 0.0), [1]), B.reduction("max", xc, [1])


def _interpret(f, xs):
    """(plan, outputs of its kernel IR on the CPU, the reference evaluator's outputs)."""
    plan, outs = run_plan(f, xs)
    PLANS.append(plan)
    return plan, outs, evaluate(f, xs)


def _run(dt, x, t, index_dt=torch.int64):
    return _interpret(RC.fusion(lambda: picked_and_max(dt, index_dt)), [x, t])


def _same_bits(got, want):
    assert got.dtype == want.dtype and got.shape == want.shape
    assert torch.equal(got.view(torch.int32), want.view(torch.int32)), (got, want)


@pytest.mark.parametrize("dt", [torch.float32, torch.bfloat16])
def test_the_pick_reads_one_element_and_matches_the_sum_bit_for_bit(dt):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(9, 37, generator=gen).to(dt)
    t = torch.tensor([0, 36, 5, -1, 37, -100, 12, 12, 2])   # out of range: -1, 37, -100
    x[6, 12] = -0.0                                          # comes out +0.0, as from the sum
    x[7, 3] = float("nan")                                   # not at the index: not read
    plan, outs, want = _run(dt, x, t)
    assert "_at" in plan.kernel.source                       # the pick's position
    assert " == T" not in plan.kernel.source.split('extern "C"')[1]   # no per-element compare
    _same_bits(outs[0], want[0])
    assert outs[0][3] == 0 and outs[0][4] == 0 and outs[0][5] == 0
    assert torch.copysign(torch.ones(()), outs[0][6]) > 0
    RC.check_close(outs[1], want[1], "max", 37, "max")


def test_an_int32_index_and_a_wide_row():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(3, 1031, generator=gen)
    t = torch.tensor([1030, 0, 517], dtype=torch.int32)
    plan, outs, want = _run(torch.float32, x, t, torch.int32)
    assert "_at" in plan.kernel.source
    _same_bits(outs[0], want[0])


def test_a_sliced_row_stride_and_a_transposed_input():
    gen = torch.Generator().manual_seed(2)
    base = torch.randn(6, 80, generator=gen)
    t = torch.tensor([0, 39, 7, 20, 3, 38])
    plan, outs, want = _run(torch.float32, base[:, ::2], t)       # strided rows: still a pick
    _same_bits(outs[0], want[0])
    plan, outs, want = _run(torch.float32, base[:, :40].t().contiguous().t(), t)
    assert plan.params.kind == "outer" and "_at" not in plan.kernel.source   # summed instead
    _same_bits(outs[0], want[0])


@pytest.mark.parametrize("knobs", [{}, {"PYFUSER_RED_CLUSTER": "2"}, {"PYFUSER_RED_STEPS": "0"}],
                         ids=["persistent", "cluster", "streamed"])
def test_a_pick_beside_a_normalization(knobs, monkeypatch):
    """log_softmax rows (written full size) and the pick, one inner-persistent kernel (on a
    cluster, or streamed, by the knobs)."""
    for k, v in knobs.items():
        monkeypatch.setenv(k, v)

    def build():
        x = RC.tensor(2, torch.float32)
        t = B.define_tensor([-1], DataType.Int)
        m = B.reduction("max", x, [1], keepdim=True)
        sh = ew("sub", x, m)
        lse = ew("log", B.reduction("sum", ew("exp", sh), [1], keepdim=True))
        classes = B.broadcast(B.iota(x.logical[1].full_extent, 0, 1, DataType.Int), [True, False])
        onehot = ew("eq", classes, B.broadcast(t, [False, True]))
        return ew("sub", sh, lse), B.reduction("sum", ew("where", onehot, x, 0.0), [1])
    gen = torch.Generator().manual_seed(3)
    x, t = torch.randn(5, 600, generator=gen), torch.tensor([0, 599, 600, 17, -3])
    plan, outs, want = _interpret(RC.fusion(build), [x, t])
    assert plan.scheduler == "inner_persistent" and "_at" in plan.kernel.source
    if knobs.get("PYFUSER_RED_CLUSTER"):
        assert plan.params.cluster == 2
    RC.check_close(outs[0], want[0], "log_softmax", 600, "log_softmax")
    _same_bits(outs[1], want[1])


@pytest.mark.parametrize("layout", ["rows", "columns"])
def test_a_full_size_value_of_the_pick_is_a_normalization(layout):
    """y = x - pick: with the pick the fusion would look like a pure reduction, but an outer
    kernel plans without picks and then needs two passes, which the reduction scheduler's
    split grid cannot run (regression: most of y was never written). Purity is judged without
    picks: a normalization scheduler takes it, and every element of y is right."""
    def build():
        x = RC.tensor(2, torch.float32)
        t = B.define_tensor([-1], DataType.Int)
        classes = B.broadcast(B.iota(x.logical[1].full_extent, 0, 1, DataType.Int), [True, False])
        onehot = ew("eq", classes, B.broadcast(t, [False, True]))
        p = B.reduction("sum", ew("where", onehot, x, 0.0), [1])
        return B.reduction("sum", x, [1]), ew("sub", x, B.broadcast(p, [False, True]))
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(4, 8192, generator=gen)
    if layout == "columns":
        x = x.t().contiguous().t()
    t = torch.tensor([0, 8191, 77, -1])
    plan, outs, want = _interpret(RC.fusion(build), [x, t])
    assert plan.scheduler in ("inner_persistent", "outer_persistent")
    RC.check_close(outs[0], want[0], "sum", 8192, "sum")
    _same_bits(outs[1], want[1])


def test_a_narrow_iota_that_wraps_is_no_pick():
    """An int8 iota over 300 classes wraps: several elements match the index, and the sum adds
    them all; it stays a sum (regression: the pick read one of them)."""
    def build():
        x = RC.tensor(2, torch.float32)
        t = B.define_tensor([-1], DataType.Char)
        classes = B.broadcast(B.iota(x.logical[1].full_extent, 0, 1, DataType.Char), [True, False])
        onehot = ew("eq", classes, B.broadcast(t, [False, True]))
        return B.reduction("sum", ew("where", onehot, x, 0.0), [1]), B.reduction("max", x, [1])
    gen = torch.Generator().manual_seed(5)
    x, t = torch.randn(5, 300, generator=gen), torch.tensor([4, 44, -56, -1, 100], dtype=torch.int8)
    plan, outs, want = _interpret(RC.fusion(build), [x, t])
    assert "_at" not in plan.kernel.source
    RC.check_close(outs[0], want[0], "sum", 300, "wrapped picks")


def test_switched_off_the_sum_stays(monkeypatch):
    monkeypatch.setenv("PYFUSER_RED_PICK", "0")
    x = torch.randn(4, 50)
    t = torch.tensor([1, 2, 3, 49])
    plan, outs, want = _run(torch.float32, x, t)
    assert "_at" not in plan.kernel.source
    _same_bits(outs[0], want[0])


def test_a_pick_alone_stays_a_sum():
    """With no other reduction the fusion would have none left: the sum stays."""
    def build():
        x = RC.tensor(2, torch.float32)
        t = B.define_tensor([-1], DataType.Int)
        classes = B.broadcast(B.iota(x.logical[1].full_extent, 0, 1, DataType.Int), [True, False])
        onehot = ew("eq", classes, B.broadcast(t, [False, True]))
        return B.reduction("sum", ew("where", onehot, x, 0.0), [1])
    plan, outs, want = _interpret(RC.fusion(build), [torch.randn(4, 30), torch.tensor([0, 29, 30, 4])])
    assert "_at" not in plan.kernel.source
    _same_bits(outs[0], want[0])


def picked_log_softmax(dt):
    """-(log_softmax(x) at the row's index), as torch.compile's cross-entropy reaches pyfuser:
    nll_loss of a log_softmax rounded to x's dtype; the pick is of (x - max) - log(sum), a chain
    through the row's reductions."""
    x = RC.tensor(2, dt)
    t = B.define_tensor([-1], DataType.Int)
    xc = B.cast(x, DataType.Float) if dt == torch.bfloat16 else x
    sh = ew("sub", xc, B.reduction("max", xc, [1], keepdim=True))
    lp = ew("sub", sh, ew("log", B.reduction("sum", ew("exp", sh), [1], keepdim=True)))
    if dt == torch.bfloat16:
        lp = B.cast(B.cast(lp, DataType.BFloat16), DataType.Float)
    classes = B.broadcast(B.iota(x.logical[1].full_extent, 0, 1, DataType.Int), [True, False])
    onehot = ew("eq", classes, B.broadcast(t, [False, True]))
    return ew("neg", B.reduction("sum", ew("where", onehot, lp, 0.0), [1]))


@pytest.mark.parametrize("dt", [torch.float32, torch.bfloat16])
def test_a_pick_through_the_rows_reductions_is_one_pass(dt):
    """The pick of (x - max) - log(sum) is computed for the one element once the row's (max,
    sum) pair exists: one pass (an online pair), the reduction scheduler's streamed kernel,
    where the sum of the picked log-probabilities took a third pass over a row held on chip."""
    gen = torch.Generator().manual_seed(6)
    x = (3 * torch.randn(7, 3001, generator=gen)).to(dt)
    t = torch.tensor([0, 3000, 1500, -1, 3001, 17, 17])
    x[6, 17] = float("-inf")                 # a log-probability of -inf, picked
    x[5, 40] = float("nan")                  # a NaN row: its max and sum are NaN
    plan, outs, want = _interpret(RC.fusion(lambda: picked_log_softmax(dt)), [x, t])
    assert plan.scheduler == "reduction" and plan.params.passes == 1 and plan.params.online
    assert "_at" in plan.kernel.source and " == T" not in plan.kernel.source.split('extern "C"')[1]
    assert outs[0][3] == 0 and outs[0][4] == 0 and torch.isnan(outs[0][5])
    assert outs[0][6] == float("inf")
    RC.check_close(outs[0], want[0], "nll", 3001, "picked log_softmax")


def test_a_pick_through_the_rows_reductions_in_columns_is_a_normalization():
    """Stored by columns the kernel is an outer one, which reads no picks: without them the
    fusion needs two passes, so the reduction scheduler's run check refuses it and a
    normalization scheduler runs it."""
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(6, 200, generator=gen).t().contiguous().t()
    t = torch.tensor([0, 199, 50, -1, 200, 3])
    plan, outs, want = _interpret(RC.fusion(lambda: picked_log_softmax(torch.float32)), [x, t])
    assert plan.scheduler in ("inner_persistent", "outer_persistent")
    assert "_at" not in plan.kernel.source
    RC.check_close(outs[0], want[0], "nll", 200, "picked log_softmax by columns")


def test_by_columns_with_the_outer_split_the_segment_is_cut_into_kernels(monkeypatch):
    """With $PYFUSER_OUTER_SPLIT=1 the normalizations that select tries after the reduction
    scheduler refuse 64 columns of 4096 rows too (too few blocks): the segment, named
    "reduction", is split (segment/split.py) into a copy segmented as the normalization it is
    without picks, whose refusals split it on down to three reduction kernels, none eager
    (regressions: the reference evaluator; then, excluding every reduction scheduler at once,
    three eager reductions)."""
    from pyfuser.runtime import dispatch
    from pyfuser.segment import split
    monkeypatch.setenv("PYFUSER_OUTER_SPLIT", "1")
    copies = []

    def recording(*a, **k):
        run = real(*a, **k)
        if run is not None:
            copies.append(run.fusion)
        return run
    real = split.split_runner
    monkeypatch.setattr(split, "split_runner", recording)
    gen = torch.Generator().manual_seed(9)
    x = torch.randn(64, 4096, generator=gen).t().contiguous().t()
    t = torch.randint(0, 4096, (64,), generator=gen)
    f = RC.fusion(lambda: picked_log_softmax(torch.float32))
    got = dispatch.execute_fusion(f, [x, t], "interpret")
    RC.check_close(got[0], evaluate(f, [x, t])[0], "nll", 4096, "picked log_softmax, split")
    reports = [dispatch.last_report(c) for c in [f] + copies]
    assert copies and all(r.eager_segments == 0 for r in reports), reports
    assert all(s.backend == "interpret" for r in reports for s in r.segments if s.kind == "kernel")
    last = [s.scheduler for s in reports[-1].segments if s.kind == "kernel"]
    assert last == ["reduction"] * 3, reports[-1]


def test_the_reduction_plan_of_such_a_fusion_by_columns_says_why_it_cannot():
    """The reduction scheduler's run check refuses it by columns; planned anyway, the plan
    raises a SchedulerError saying why, never a plan without picks that takes two passes."""
    from pyfuser.errors import SchedulerError
    from pyfuser.schedule import reduction
    x = torch.randn(6, 200).t().contiguous().t()
    t = torch.tensor([0, 199, 50, -1, 200, 3])
    f = RC.fusion(lambda: picked_log_softmax(torch.float32))
    with pytest.raises(SchedulerError, match="reduction scheduler: this layout reads no picks"):
        reduction.schedule(f, [x, t], "reduction")


def test_a_chain_through_one_value_twice_is_a_pick():
    """(x - max) * (x - max): both arguments are the one full-size Node, so the element is
    still one load."""
    def build():
        x = RC.tensor(2, torch.float32)
        t = B.define_tensor([-1], DataType.Int)
        sh = ew("sub", x, B.reduction("max", x, [1], keepdim=True))
        classes = B.broadcast(B.iota(x.logical[1].full_extent, 0, 1, DataType.Int), [True, False])
        onehot = ew("eq", classes, B.broadcast(t, [False, True]))
        return B.reduction("sum", ew("where", onehot, ew("mul", sh, sh), 0.0), [1])
    gen = torch.Generator().manual_seed(10)
    x, t = torch.randn(5, 90, generator=gen), torch.tensor([0, 89, 90, 7, -2])
    plan, outs, want = _interpret(RC.fusion(build), [x, t])
    assert plan.scheduler == "reduction" and "_at" in plan.kernel.source
    _same_bits(outs[0], want[0])


def test_a_chain_with_a_second_full_size_value_is_no_pick():
    """where(class == t, x * y, 0) with y full size too: the element of x * y needs both
    loads, so the sum stays."""
    def build():
        x, y = RC.tensor(2, torch.float32), RC.tensor(2, torch.float32)
        t = B.define_tensor([-1], DataType.Int)
        classes = B.broadcast(B.iota(x.logical[1].full_extent, 0, 1, DataType.Int), [True, False])
        onehot = ew("eq", classes, B.broadcast(t, [False, True]))
        return (B.reduction("sum", ew("where", onehot, ew("mul", x, y), 0.0), [1]),
                B.reduction("max", x, [1]))
    gen = torch.Generator().manual_seed(8)
    x, y = torch.randn(4, 70, generator=gen), torch.randn(4, 70, generator=gen)
    plan, outs, want = _interpret(RC.fusion(build), [x, y, torch.tensor([0, 69, 70, 5])])
    assert "_at" not in plan.kernel.source
    _same_bits(outs[0], want[0])


def test_cross_entropy_through_jit_matches_eager():
    import pyfuser
    F = torch.nn.functional

    def ce(x, t):
        return F.cross_entropy(x, t, ignore_index=-100)
    f = pyfuser.jit(torch.jit.script(ce))
    x = torch.randn(16, 300)
    t = torch.randint(0, 300, (16,))
    t[3] = -100
    torch.testing.assert_close(f(x, t), ce(x, t), rtol=1e-5, atol=1e-5)
    assert f.last_run.kernels >= 1 and not f.last_run.fallbacks


def test_kernels_compile_for_sm90():
    pytest.importorskip("cuda.bindings.nvrtc")
    if not PLANS:
        _run(torch.float32, torch.randn(4, 50), torch.tensor([1, 2, 3, 4]))
    compile_many(PLANS)
