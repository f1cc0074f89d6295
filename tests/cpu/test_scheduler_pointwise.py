"""The pointwise scheduler: verdicts, collapsing, vector width, 1-D / 2-D choice, signatures."""
import torch

from pyfuser.codegen import api
from pyfuser.ir.iterdomain import ParallelType
from codegen_cases import B, DataType, make_fusion, run_plan

F = DataType.Float


def bias_add():
    x = B.define_tensor([-1, -1], F)
    b = B.define_tensor([-1], F)
    return B.elementwise("add", x, b)


def test_can_schedule_verdicts():
    from pyfuser.schedule import pointwise
    assert api.can_schedule(make_fusion(bias_add)) == (True, "")
    ok, why = pointwise.can_schedule(make_fusion(lambda: B.reduction("sum", B.define_tensor([-1, -1], F), [1])))
    assert not ok and "sum" in why
    ok, why = api.can_schedule(make_fusion(lambda: B.permute(B.define_tensor([-1, -1], F), [1, 0])))
    assert not ok and "view of one" in why


def test_bias_add_is_2d_with_hoisted_bias():
    f = make_fusion(bias_add)
    plan = api.plan_kernel(f, [torch.zeros(8192, 3072), torch.zeros(3072)])
    p = plan.schedule.params
    # 16-byte vectors: one row per thread (fastest measured on H200, see pointwise_heuristics)
    assert (p.kind, p.vec, p.block, p.unroll, p.index_type) == ("2d", 4, 128, 1, "int")
    bias = [a for a in plan.schedule.accesses if not a.is_store and a.tv.ndim == 1][0]
    assert bias.row_invariant
    leaf = plan.schedule.ref.leaf
    assert [d.parallel for d in leaf] == [ParallelType.BIDy, ParallelType.BIDx,
                                          ParallelType.TIDx, ParallelType.Vectorize]
    assert not [l for l in plan.body.splitlines() if "%" in l]   # no div/mod in the loop
    cfg = plan.kernel.launch_config(None, [torch.zeros(8192, 3072), torch.zeros(3072), torch.zeros(8192, 3072)])
    assert cfg.grid == (6, 8192, 1) and cfg.block == (128, 1, 1)


def test_unroll_override_and_grid_cap_keep_2d_correct(monkeypatch):
    monkeypatch.setenv("PYFUSER_PW_UNROLL", "4")
    monkeypatch.setenv("PYFUSER_PW_WAVES", "1")
    f = make_fusion(bias_add)
    plan = api.plan_kernel(f, [torch.zeros(8192, 3072), torch.zeros(3072)])
    p = plan.schedule.params
    assert p.unroll == 4 and p.max_blocks > 0
    cfg = plan.kernel.launch_config(None, [torch.zeros(8192, 3072), torch.zeros(3072), torch.zeros(8192, 3072)])
    assert cfg.grid[0] * cfg.grid[1] <= p.max_blocks
    a, b = torch.randn(300, 3072), torch.randn(3072)
    out = torch.empty(300, 3072)
    from pyfuser.ir.shapes import bind
    api.interpret(plan, [a, b], [out], bind(f, [a, b]))
    assert torch.equal(out, a + b)


def _bn():
    x = B.define_tensor([-1, -1, -1, -1], F)
    var = B.broadcast(B.define_tensor([-1], F), [True, False, True, True])
    w = B.broadcast(B.define_tensor([-1], F), [True, False, True, True])
    inv = B.elementwise("rsqrt", B.elementwise("add", var, 1e-5))
    return B.elementwise("relu", B.elementwise("mul", B.elementwise("mul", x, inv), w))


def test_per_channel_math_is_hoisted_out_of_the_lanes_loop(monkeypatch):
    for unroll in ("1", "4"):
        monkeypatch.setenv("PYFUSER_PW_UNROLL", unroll)
        x, var, w = torch.randn(3, 16, 16, 17), torch.rand(16) + 0.5, torch.randn(16)
        plan, outs = run_plan(make_fusion(_bn), [x, var, w])
        assert plan.schedule.params.kind == "2d"
        body = plan.body
        lanes = body[body.index("for (int v = 0"):]
        assert "rsqrt(" in body and "rsqrt(" not in lanes        # once per row, not per element
        want = torch.relu(x * torch.rsqrt(var + 1e-5).view(1, -1, 1, 1) * w.view(1, -1, 1, 1))
        torch.testing.assert_close(outs[0], want)



def test_contiguous_ranks_collapse_to_1d():
    def build():
        x = B.define_tensor([-1, -1, -1, -1], F)
        return B.elementwise("gelu", x)
    plan = api.plan_kernel(make_fusion(build), [torch.zeros(2, 3, 4, 8)])
    assert plan.schedule.params.groups == [[0, 1, 2, 3]] and plan.schedule.params.kind == "1d"
    loop = [l for l in plan.body.splitlines() if "nbx =" not in l]
    assert not [l for l in loop if "%" in l or " / " in l]       # no div/mod per element


def test_batchnorm_like_groups():
    def build():
        x = B.define_tensor([-1, -1, -1, -1], F)
        w = B.broadcast(B.define_tensor([-1], F), [True, False, True, True])
        return B.elementwise("relu", B.elementwise("add", B.elementwise("mul", x, w), x))
    plan = api.plan_kernel(make_fusion(build), [torch.zeros(8, 256, 56, 56), torch.zeros(256)])
    p = plan.schedule.params
    # 784 vectors per row: 128 threads leave 14% of the last block idle, still under a quarter
    assert p.groups == [[0], [1], [2, 3]] and p.kind == "2d" and p.vec == 4 and p.block == 128
    # 130 vectors per row: 128 threads would leave 126 idle, 64 threads 62
    plan = api.plan_kernel(make_fusion(build), [torch.zeros(2, 4, 520, 1), torch.zeros(4)])
    assert plan.schedule.params.kind == "2d" and plan.schedule.params.block == 64


def test_signature_ignores_sizes_but_not_layout():
    f = make_fusion(bias_add)
    s1 = api.signature(f, [torch.zeros(64, 32), torch.zeros(32)])
    s2 = api.signature(f, [torch.zeros(128, 48), torch.zeros(48)])
    s3 = api.signature(f, [torch.zeros(32, 64).t(), torch.zeros(32)])
    assert s1 == s2 and s1 != s3
    # a plan made for one size runs correctly for another size of the same signature
    plan = api.plan_kernel(f, [torch.zeros(64, 32), torch.zeros(32)])
    x, b = torch.randn(100, 48), torch.randn(48)
    _, outs = run_plan(f, [x, b], plan)
    assert torch.equal(outs[0], x + b)


def test_schedule_leaves_user_fusion_unchanged():
    f = make_fusion(bias_add)
    nvals, nexprs = len(f.vals), len(f.exprs)
    leaf = list(f.outputs[0].leaf)
    api.plan_kernel(f, [torch.zeros(8, 1024), torch.zeros(1024)])
    assert (len(f.vals), len(f.exprs), f.outputs[0].leaf) == (nvals, nexprs, leaf)


def test_one_d_unroll_follows_vector_elements():
    """1-D: 2 vectors per thread when a vector holds up to 4 elements, 1 when it holds 8."""
    for dt, tdt, vec, unroll in ((F, torch.float32, 4, 2), (DataType.BFloat16, torch.bfloat16, 8, 1)):
        def build():
            return B.elementwise("mul", B.define_tensor([-1], dt), B.define_tensor([-1], dt))
        x = torch.zeros(1 << 24, dtype=tdt)
        p = api.plan_kernel(make_fusion(build), [x, x]).schedule.params
        assert (p.kind, p.vec, p.unroll) == ("1d", vec, unroll)
