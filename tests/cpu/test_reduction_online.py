"""Online (max, sum of exp) pairs (schedule/reduction_graph.OnlinePair): softmax, log_softmax,
logsumexp and cross-entropy accumulate a row's max and its sum of exp(x - max) in one pass and
combine the pairs once (lanes, shuffles, shared memory, cluster ranks, grid splits).

Checked here, through the CPU interpreter against the reference evaluator / eager:
- rows holding -inf, all -inf, +inf, NaN, -inf over whole threads' or cluster ranks' shares,
  rising rows (the running max grows every chunk), large offsets; float32 and bfloat16; odd
  lengths; persistent, streamed, cluster and outer (reduced axis outside) kernels;
- the structure: one reduction pass where there were two, one cluster combine (the kernel IR's
  cluster barriers), cross-entropy in 2 kernels (per-row losses, then the mean) or 1 (no
  reduction over the rows), its per-row kernel a pure reduction of one pass;
- every kernel generated here compiles with NVRTC for sm_90.
"""
import pytest
import torch

import pyfuser
import reduction_cases as RC
from codegen_cases import compile_many, run_plan
from pyfuser.codegen import api
from pyfuser.codegen import kernel_ir as K
from pyfuser.ir.evaluator import evaluate
from pyfuser.schedule import reduction_graph as RG

F = torch.nn.functional
PLANS: list = []


def run_fusion(f, xs):
    plan, outs = run_plan(f, xs)
    PLANS.append(plan)
    return plan, outs


def check(builder, x, axes, what):
    f = RC.fusion(builder, x.ndim, x.dtype, axes)
    plan, outs = run_fusion(f, [x])
    want = evaluate(f, [x])
    n = x.shape[axes[0]]
    for g, w in zip(outs, want):
        RC.check_close(g, w, builder.__name__, n, f"{what} [{plan.scheduler} {plan.params.kind} "
                       f"persistent={plan.params.persistent} cluster={plan.params.cluster}]")
        assert torch.equal(g.isnan(), w.isnan()), f"{what}: NaN positions differ"
        assert torch.equal(g.isinf() & (g > 0), w.isinf() & (w > 0)), f"{what}: +inf differ"
        assert torch.equal(g.isinf() & (g < 0), w.isinf() & (w < 0)), f"{what}: -inf differ"
    return plan


MODES = {"persistent": {}, "streamed": {"PYFUSER_RED_STEPS": "0"},
         "narrow_team": {"PYFUSER_RED_BDIMX": "4", "PYFUSER_RED_BDIMY": "8"},
         "wide_team": {"PYFUSER_RED_BDIMX": "64"}}


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("n", [300, 77, 1031])
@pytest.mark.parametrize("builder", [RC.softmax, RC.log_softmax, RC.logsumexp],
                         ids=lambda b: b.__name__)
def test_special_rows_inner(builder, n, mode, monkeypatch):
    for k, v in MODES[mode].items():
        monkeypatch.setenv(k, v)
    x = RC.special_rows(12, n, torch.float32)
    plan = check(builder, x, [1], f"{builder.__name__} {tuple(x.shape)} {mode}")
    assert plan.params.passes == 1
    if mode == "streamed" or builder is RC.logsumexp:
        assert not plan.params.persistent


def test_a_finite_running_max_skips_the_guard():
    """Inner kernels branch once per chunk on the running max: finite (every row above but
    those of infinities or NaN), exp(x - m) without the per-element compare and select that
    keeps inf - inf from making a NaN; the special rows above take the guarded branch, and
    every row matches eager (check)."""
    x = RC.special_rows(12, 300, torch.float32)
    plan = check(RC.logsumexp, x, [1], "logsumexp branches")
    src = plan.kernel.source.split('extern "C"')[1]
    assert "if (pf_isfinite(" in src and "(!pf_isfinite(" in src
    assert "pf_exp_shifted(pf_sub(" in src


@pytest.mark.parametrize("n", [300, 77])
@pytest.mark.parametrize("builder", [RC.softmax, RC.log_softmax, RC.logsumexp],
                         ids=lambda b: b.__name__)
def test_special_rows_outer(builder, n):
    """Reduced axis outside: a (max, sum) pair per column (lane)."""
    x = RC.special_rows(12, n, torch.float32, axis=0)       # [n, 12]: columns are the rows above
    plan = check(builder, x, [0], f"{builder.__name__} {tuple(x.shape)} outer")
    assert plan.params.kind == "outer" and plan.params.passes == 1


def test_special_rows_bfloat16():
    x = RC.special_rows(12, 1031, torch.bfloat16)
    plan = check(RC.softmax, x, [1], "softmax bfloat16")
    assert plan.params.passes == 1


@pytest.mark.parametrize("cluster", ["2", "4", "8"])
@pytest.mark.parametrize("builder", [RC.softmax, RC.log_softmax], ids=lambda b: b.__name__)
def test_cluster_row_combines_once(builder, cluster, monkeypatch):
    """A row over a cluster: -inf over whole ranks' shares, the same results, and one cluster
    combine a row (a cluster barrier for the pair, one at the end of the row), not two; with
    $PYFUSER_RED_SPLIT_CLUSTER=1 the second is split: its arrive after the combine, its wait at
    the end of the row (the interpreter checks the halves' order and what they order). By
    default the combine is pushed (codegen/reduction_cluster_push.py): one mbarrier wait a
    combine, no cluster barrier in the row (an arrive before the row loop, its wait before the
    first push, an arrive at the row's end where the cluster has another row)."""
    monkeypatch.setenv("PYFUSER_RED_CLUSTER_PUSH", "0")
    monkeypatch.setenv("PYFUSER_RED_CLUSTER", cluster)
    monkeypatch.setenv("PYFUSER_RED_STEPS", "1")
    x = RC.special_rows(10, 2 * 256 * 4 * int(cluster) + 44, torch.float32)
    plan = check(builder, x, [1], f"{builder.__name__} cluster {cluster}")
    assert plan.params.cluster == int(cluster) and plan.params.passes == 1
    assert cluster_phases(plan) == ["sync", "sync"]
    monkeypatch.setenv("PYFUSER_RED_SPLIT_CLUSTER", "1")
    split = check(builder, x, [1], f"{builder.__name__} cluster {cluster}, split barrier")
    assert cluster_phases(split) == ["sync", "arrive", "wait"]
    monkeypatch.setenv("PYFUSER_RED_ONLINE", "0")           # the two-pass form: two combines
    f = RC.fusion(builder, 2, torch.float32, [1])
    two, _ = run_fusion(f, [x])
    assert two.params.passes == 2 and cluster_phases(two) == ["sync", "arrive", "wait"] * 2
    monkeypatch.delenv("PYFUSER_RED_SPLIT_CLUSTER")
    two, _ = run_fusion(RC.fusion(builder, 2, torch.float32, [1]), [x])
    assert two.params.passes == 2 and cluster_phases(two) == ["sync"] * 3
    monkeypatch.delenv("PYFUSER_RED_CLUSTER_PUSH")
    pushed, _ = run_fusion(RC.fusion(builder, 2, torch.float32, [1]), [x])
    assert pushed.params.push and pushed.params.passes == 2
    assert cluster_phases(pushed) == ["arrive", "wait", "arrive"] and count(pushed.kernel_ir, K.MbarWait) == 2
    monkeypatch.delenv("PYFUSER_RED_ONLINE")              # by default a cluster takes the pair
    dflt = check(builder, x, [1], f"{builder.__name__} cluster {cluster}, pushed")
    assert dflt.params.online and dflt.params.passes == 1 and dflt.params.cluster == int(cluster)
    assert dflt.params.push and count(dflt.kernel_ir, K.MbarWait) == 1
    assert cluster_phases(dflt) == ["arrive", "wait", "arrive"]


def count(kernel, cls) -> int:
    n, stack = 0, list(kernel.body)
    while stack:
        s = stack.pop()
        n += isinstance(s, cls)
        stack.extend(getattr(s, "body", []) if isinstance(s, (K.Loop, K.If)) else [])
    return n


def cluster_phases(plan) -> list:
    """The plan's cluster barriers in program order, by phase (sync / arrive / wait)."""
    return [s.phase for s in plan.kernel_ir.walk() if isinstance(s, K.ClusterSync)]


@pytest.mark.parametrize("builder", [RC.softmax, RC.log_softmax, RC.logsumexp],
                         ids=lambda b: b.__name__)
def test_pairs_found_and_switch(builder, monkeypatch):
    g = RG.analyze(RC.fusion(builder, 2, torch.float32, [1]))
    assert len(g.pairs) == 1 and g.n_passes == 1
    assert g.pairs[0].max_expr.info.name == "max" and g.pairs[0].sum_expr.info.name == "sum"
    monkeypatch.setenv("PYFUSER_RED_ONLINE", "0")
    g = RG.analyze(RC.fusion(builder, 2, torch.float32, [1]))
    assert not g.pairs and g.n_passes == 2


def test_no_pair_for_other_shapes_of_sum():
    """sum(exp(x - max)) of another x, or sum(exp(x)) beside a max: two reductions, no pair."""
    from pyfuser.ir import builder as B

    def other_x(rank, dt, axes):
        x = RC.tensor(rank, dt)
        y = RC.ew("mul", x, 2.0)
        m = B.reduction("max", x, axes, keepdim=True)
        return B.reduction("sum", RC.ew("exp", RC.ew("sub", y, m)), axes)

    def plain_exp(rank, dt, axes):
        x = RC.tensor(rank, dt)
        return B.reduction("max", x, axes), B.reduction("sum", RC.ew("exp", x), axes)
    for b in (other_x, plain_exp):
        f = RC.fusion(b, 2, torch.float32, [1])
        assert not RG.analyze(f).pairs
        xs = [torch.randn(5, 33) for _ in f.tensor_inputs()]
        _, outs = run_fusion(f, xs)
        for g, w in zip(outs, evaluate(f, xs)):
            torch.testing.assert_close(g, w)


# ---- through pyfuser.jit: the lowerings of torch's functions ------------------------------------
def softmax(x):
    return torch.softmax(x, -1)


def log_softmax(x):
    return torch.log_softmax(x, -1)


def logsumexp(x):
    return torch.logsumexp(x, 1)


def logsumexp_keep(x):
    return torch.logsumexp(x, 1, keepdim=True)


def ce_mean(x, t):
    return F.cross_entropy(x, t)


def ce_sum(x, t):
    return F.cross_entropy(x, t, reduction="sum")


def ce_none(x, t):
    return F.cross_entropy(x, t, reduction="none", ignore_index=3)


def ce_probs(x, p):
    return F.cross_entropy(x, p)



@pytest.fixture(autouse=True)
def _online_everywhere(monkeypatch):
    """These tests check the online pair's code in every kernel shape: the plan-time choice of
    two passes for rows held in one block (schedule/reduction.py) is switched off; its own test
    is test_rows_in_one_block_take_two_passes_by_default."""
    monkeypatch.setenv("PYFUSER_RED_ONLINE", "1")

@pytest.fixture
def plans(monkeypatch):
    seen = []
    real = api.plan_kernel

    def spy(fusion, inputs):
        plan = real(fusion, inputs)
        seen.append(plan)
        PLANS.append(plan)
        return plan
    monkeypatch.setattr(api, "plan_kernel", spy)
    return seen


def jit_check(fn, args, tol):
    f = pyfuser.jit(torch.jit.script(fn), cpu_executor="interpret")
    got, want = f(*args), fn(*args)
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got.double(), want.double(), rtol=tol, atol=tol, equal_nan=True)
    assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.isinf(), want.isinf())
    assert not f.last_run.fallbacks and f.last_run.eager_groups == 0
    return f.last_run


TOL = {torch.float32: 1e-5, torch.bfloat16: 1.6e-2}


@pytest.mark.parametrize("dt", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("fn", [softmax, log_softmax, logsumexp, logsumexp_keep],
                         ids=lambda f: f.__name__)
def test_jit_special_rows(fn, dt, plans):
    x = RC.special_rows(10, 203, dt)
    st = jit_check(fn, [x], TOL[dt])
    assert st.kernels == 1
    (plan,) = plans
    # softmax and log_softmax compute half / bfloat16 in float: a pair; logsumexp computes in
    # the input's dtype, as eager: a bfloat16 pair is not taken (two passes)
    pair = dt == torch.float32 or fn in (softmax, log_softmax)
    assert len(RG.analyze(plan.fusion).pairs) == pair and plan.params.passes == 2 - pair


@pytest.mark.parametrize("dt", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("fn,rows_kernels", [(ce_mean, 2), (ce_sum, 2), (ce_none, 1)],
                         ids=lambda x: getattr(x, "__name__", str(x)))
def test_cross_entropy_kernels(fn, rows_kernels, dt, plans):
    """Class-index targets: one pass over the logits (a pure reduction: max and sum of exp as a
    pair, the target's logit, the hit count), then, for mean / sum, the sum over the rows."""
    gen = torch.Generator().manual_seed(3)
    x = RC.special_rows(10, 203, dt, gen=gen)
    x = torch.cat([x, torch.randn(7, 203, generator=gen).to(dt)])
    t = torch.randint(0, 203, (17,), generator=gen)
    t[4] = 3                                              # the ignored class (ce_none)
    t[0] = 0                                              # a -inf logit as the target: +inf loss
    finite = slice(7, None) if fn is not ce_none else slice(None)
    st = jit_check(fn, [x[finite].contiguous(), t[finite].contiguous()], TOL[dt])
    assert st.kernels == rows_kernels, st
    first = plans[0]
    assert first.scheduler == "reduction" and first.params.passes == 1
    assert first.params.kind == "inner" and first.params.reduced == [False, True]   # the logits


def test_cross_entropy_special_rows_per_row():
    """Per-row losses of rows of -inf, +inf, NaN: eager's (NaN / inf where eager has them)."""
    x = RC.special_rows(10, 203, torch.float32)
    t = torch.tensor([0, 1, 101, 5, 202, 7, 150, 200, 9, 0])
    jit_check(ce_none, [x, t], 1e-5)


def test_cross_entropy_probabilities_one_pair():
    """Probability targets read the normalized row: two passes (pair, then the dot product)."""
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(9, 131, generator=gen)
    p = torch.softmax(torch.randn(9, 131, generator=gen), 1)
    jit_check(ce_probs, [x, p], 1e-5)


def test_kernels_compile_for_sm90():
    pytest.importorskip("cuda.bindings.nvrtc")
    if not PLANS:
        run_fusion(RC.fusion(RC.softmax, 2, torch.float32, [1]), [torch.randn(3, 40)])
    compile_many(PLANS)


@pytest.mark.parametrize("dt", [torch.float32, torch.bfloat16], ids=str)
def test_rows_in_one_block_take_two_passes_by_default(dt, plans, monkeypatch):
    """By default a softmax row held in one block's registers is planned with two passes (the
    exp values kept: one exp per element); PYFUSER_RED_ONLINE=1 asks for the pair."""
    monkeypatch.delenv("PYFUSER_RED_ONLINE")
    x = RC.special_rows(10, 203, dt)
    jit_check(softmax, [x], TOL[dt])
    (plan,) = plans
    assert plan.params.persistent and plan.params.cluster == 1
    assert not plan.params.online and plan.params.passes == 2
    assert RG.analyze(plan.fusion).pairs            # a pair was there to take


@pytest.mark.parametrize("rlen,vec,per_step,cluster,bdimx", [
    (65536, 8, 4, 4, 256),     # bfloat16: one 1024-thread block a row before; a cluster of 4
    (65536, 4, 4, 8, 256),     # float32: too long for one block, a cluster of 8 (as before)
    (32768, 8, 4, 1, 512),     # bfloat16 of half the length: one block of 512, no cluster
])
def test_rows_filling_a_whole_block_take_a_cluster(rlen, vec, per_step, cluster, bdimx,
                                                   monkeypatch):
    """A normalization row that one 1024-thread block would hold alone is split over a cluster
    (reduction_heuristics._inner): one row an SM at a time left its loads idle during its
    combine. Shorter rows keep their single block."""
    from pyfuser.schedule import reduction_heuristics as H
    from pyfuser.schedule.reduction_params import ReductionParams
    monkeypatch.setattr(H, "cluster_capable", lambda: True)
    knobs = dict.fromkeys(("bdimx", "bdimy", "unroll", "steps", "waves", "splits", "cluster"))
    p = ReductionParams()
    p.vec = vec
    H._inner(p, [rlen], [1024], per_step, True, knobs)
    assert p.persistent and (p.cluster, p.bdimx) == (cluster, bdimx)
    assert p.steps * p.bdimx * p.cluster * vec >= rlen
