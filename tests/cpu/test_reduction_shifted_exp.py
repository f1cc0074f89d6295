"""Shifted exponentials (schedule/reduction_graph `shifted_exps`): exp(x - max(x)) over the
reduced axes, softmax's output and the two-pass sum of exp, is computed as `exp_shifted` (the
exp2 unit) instead of expf; anything else keeps exp.

Checked here: which exps are shifted (the source and the graph), that the results still match
the reference evaluator through the CPU interpreter (special rows included, float32 and
bfloat16, online and two-pass), that $PYFUSER_RED_SHIFTED_EXP=0 keeps exp, and that the kernels
compile with NVRTC for sm_90.
"""
import pytest
import torch

import pyfuser.ir.builder as B
import reduction_cases as RC
from codegen_cases import compile_many, run_plan
from pyfuser.ir import DataType
from pyfuser.ir.evaluator import evaluate
from pyfuser.schedule import reduction_graph as RG

PLANS: list = []


def ew(name, *a):
    return B.elementwise(name, *a)


def run(f, xs, kinds=("softmax",)):
    """Plan, interpret, compare each output with the reference evaluator (tolerance by `kinds`:
    reduction_cases' builder names, "sum" for a row sum, whose rounding depends on the order)."""
    plan, outs = run_plan(f, xs)
    PLANS.append(plan)
    want = evaluate(f, xs)
    for g, w, kind in zip(outs, want, kinds * len(outs) if len(kinds) == 1 else kinds):
        RC.check_close(g, w, kind, xs[0].shape[-1], f"{plan.kernel.name} {tuple(g.shape)}")
        assert torch.equal(g.isnan(), w.isnan()), "NaN positions differ"
    return plan


def exp_calls(src: str) -> tuple:
    """(calls of exp_shifted, calls of plain exp) in a kernel's body."""
    body = src[src.index('extern "C" __global__'):]
    return body.count("pf_exp_shifted("), body.count(" exp(") + body.count("(exp(")


@pytest.mark.parametrize("dt", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("online", ["1", "0"])
@pytest.mark.parametrize("n", [300, 4099])
def test_softmax_output_exp_is_shifted(dt, online, n, monkeypatch):
    monkeypatch.setenv("PYFUSER_RED_ONLINE", online)
    f = RC.fusion(RC.softmax, 2, dt, [1])
    x = RC.special_rows(12, n, dt, gen=torch.Generator().manual_seed(n))
    plan = run(f, [x])
    shifted, plain = exp_calls(plan.kernel.source)
    assert shifted >= 1 and plain == 0, (shifted, plain)
    assert len(RG.analyze(plan.fusion).shifted_exps) >= 1


def test_the_knob_keeps_exp(monkeypatch):
    monkeypatch.setenv("PYFUSER_RED_SHIFTED_EXP", "0")
    f = RC.fusion(RC.softmax, 2, torch.float32, [1])
    plan = run(f, [RC.special_rows(12, 300, torch.float32, gen=torch.Generator().manual_seed(0))])
    assert not RG.analyze(plan.fusion).shifted_exps
    assert exp_calls(plan.kernel.source)[1] >= 1


def _exp_of(arg_builder):
    """exp(arg_builder(x, y)) and a row sum of x, for x of shape [rows, n] and y = -x."""
    def build():
        x = B.define_tensor([-1, -1], DataType.Float)
        y = ew("neg", x)
        e = ew("exp", arg_builder(x, y))
        return [e, B.reduction("sum", x, [1])]
    return build


NOT_SHIFTED = {
    # the max of another value: x - max(-x) may be positive
    "max_of_other": lambda x, y: ew("sub", x, B.reduction("max", y, [1], keepdim=True)),
    # max(x) - x is never negative
    "reversed": lambda x, y: ew("sub", B.reduction("max", x, [1], keepdim=True), x),
    # the min, not the max
    "min": lambda x, y: ew("sub", x, B.reduction("min", x, [1], keepdim=True)),
    # x + max(x)
    "add": lambda x, y: ew("add", x, B.reduction("max", x, [1], keepdim=True)),
}


@pytest.mark.parametrize("case", list(NOT_SHIFTED))
def test_other_exps_keep_exp(case):
    from codegen_cases import make_fusion
    f = make_fusion(_exp_of(NOT_SHIFTED[case]))
    x = torch.randn(6, 40, generator=torch.Generator().manual_seed(1)) * 30
    plan = run(f, [x], ("softmax", "sum"))
    assert not RG.analyze(plan.fusion).shifted_exps
    assert exp_calls(plan.kernel.source) == (0, 1)


def test_exp_of_x_minus_its_max_elsewhere_is_shifted():
    """Outside softmax too: exp(x - max(x)) as an output of its own (here with large offsets,
    where a positive argument would overflow)."""
    from codegen_cases import make_fusion
    f = make_fusion(_exp_of(lambda x, y: ew("sub", x, B.reduction("max", x, [1], keepdim=True))))
    x = torch.randn(6, 40, generator=torch.Generator().manual_seed(2)) * 30 + 500
    plan = run(f, [x], ("softmax", "sum"))
    assert len(RG.analyze(plan.fusion).shifted_exps) == 1
    assert exp_calls(plan.kernel.source) == (1, 0)


def test_kernels_compile_with_nvrtc():
    if not PLANS:
        pytest.skip("no plan recorded (run with the tests above)")
    compile_many(PLANS)
