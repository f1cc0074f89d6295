"""Shifted quotients (schedule/reduction_patterns `shifted_quotients`): softmax's output, a
shifted exponential divided by the row's sum of shifted exponentials, is computed as `div_rcp`
(the row's reciprocal once, then a multiply and one fused-multiply-add correction by a scaled
remainder an element) instead of a division an element.

Checked here: which divisions take the form (the source and the graph), that results still
match the reference evaluator through the CPU interpreter (special rows, float32 and bfloat16,
online and two-pass), that $PYFUSER_RED_SHIFTED_DIV=0 keeps the division, that the CUDA
formula is the correctly rounded quotient over the operands' ranges (exact rationals), and that
the kernels compile with NVRTC for sm_90.
"""
import math
import random
from fractions import Fraction

import pytest
import torch

import pyfuser.ir.builder as B
import reduction_cases as RC
from codegen_cases import compile_many, make_fusion, run_plan
from pyfuser.ir import DataType
from pyfuser.ir.evaluator import evaluate
from pyfuser.schedule import reduction_graph as RG

PLANS: list = []


def run(f, xs):
    plan, outs = run_plan(f, xs)
    PLANS.append(plan)
    for g, w in zip(outs, evaluate(f, xs)):
        RC.check_close(g, w, "softmax", xs[0].shape[-1], plan.kernel.name)
        assert torch.equal(g.isnan(), w.isnan()), "NaN positions differ"
    return plan


def body(src: str) -> str:
    return src[src.index('extern "C" __global__'):]


@pytest.mark.parametrize("dt", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("online", ["1", "0"])
@pytest.mark.parametrize("n", [300, 4099])
def test_softmax_divides_by_the_rows_reciprocal(dt, online, n, monkeypatch):
    monkeypatch.setenv("PYFUSER_RED_ONLINE", online)
    f = RC.fusion(RC.softmax, 2, dt, [1])
    x = RC.special_rows(12, n, dt, gen=torch.Generator().manual_seed(n))
    plan = run(f, [x])
    src = body(plan.kernel.source)
    assert src.count("pf_div_rcp(") >= 1 and src.count("pf_reciprocal(") == 1
    # the reciprocal is a row's value, computed before the loop over the row's elements
    last_loop = max(src.rfind("for (int s"), src.rfind("for (nidx_t it"))
    assert 0 <= src.index("pf_reciprocal(") < last_loop
    assert len(RG.analyze(plan.fusion).shifted_quotients) == 1


def test_the_knob_keeps_the_division(monkeypatch):
    monkeypatch.setenv("PYFUSER_RED_SHIFTED_DIV", "0")
    f = RC.fusion(RC.softmax, 2, torch.float32, [1])
    plan = run(f, [RC.special_rows(12, 300, torch.float32, gen=torch.Generator().manual_seed(0))])
    assert not RG.analyze(plan.fusion).shifted_quotients
    assert "pf_div_rcp(" not in body(plan.kernel.source)


def ew(name, *a):
    return B.elementwise(name, *a)


def _shifted(x):
    return ew("exp", ew("sub", x, B.reduction("max", x, [1], keepdim=True)))


NOT_QUOTIENTS = {
    # the denominator is a sum of x, which may be 0 or negative
    "sum_of_x": lambda x: ew("div", _shifted(x), B.reduction("sum", x, [1], keepdim=True)),
    # the numerator is not a shifted exponential
    "numerator_x": lambda x: ew("div", x, B.reduction("sum", _shifted(x), [1], keepdim=True)),
    # the sum of the exponentials minus one may be 0
    "sum_minus_one": lambda x: ew("div", _shifted(x), ew(
        "sub", B.reduction("sum", _shifted(x), [1], keepdim=True), 1.0)),
}


@pytest.mark.parametrize("case", list(NOT_QUOTIENTS))
def test_other_divisions_stay_divisions(case):
    def build():
        x = B.define_tensor([-1, -1], DataType.Float)
        return [NOT_QUOTIENTS[case](x)]
    f = make_fusion(build)
    x = torch.randn(6, 40, generator=torch.Generator().manual_seed(1))
    plan, outs = run_plan(f, [x])
    PLANS.append(plan)
    want = evaluate(f, [x])[0]
    torch.testing.assert_close(outs[0], want, rtol=1e-5, atol=1e-6, equal_nan=True)
    assert not RG.analyze(plan.fusion).shifted_quotients
    assert "pf_div_rcp(" not in body(plan.kernel.source)


def test_a_double_softmax_keeps_the_division():
    f = RC.fusion(RC.softmax, 2, torch.float64, [1])
    x = torch.randn(4, 70, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    plan = run(f, [x])
    assert not RG.analyze(plan.fusion).shifted_quotients


# ---- the CUDA formula, in exact arithmetic -------------------------------------------------------
def rn32(v: Fraction) -> float:
    """v rounded to the nearest float32 (ties to even), subnormals included (a grid of 2^-149
    under 2^-126); v within float32's range."""
    if v == 0:
        return 0.0
    sign, v = (-1 if v < 0 else 1), abs(v)
    e = max(v.numerator.bit_length() - v.denominator.bit_length(), -126)
    if Fraction(2) ** e > v and e > -126:
        e -= 1
    m = round(v * Fraction(2) ** (23 - e))           # Fraction's round: half to even
    return sign * math.ldexp(float(m), e - 23)


def div_rcp(a: float, y: float, d: float, scaled: bool = True) -> float:
    """pf_div_rcp with each float32 operation rounded once: q = a y; fma(fma(-q, ds, a 2^64), ys,
    q) with ys = y 2^-64, ds = d 2^64 (both exact); `scaled=False`: fma(fma(-q, d, a), y, q)."""
    q = rn32(Fraction(a) * Fraction(y))
    s = Fraction(2) ** 64 if scaled else Fraction(1)
    r = rn32(-Fraction(q) * Fraction(d) * s + Fraction(a) * s)
    return rn32(Fraction(r) * (Fraction(y) / s) + Fraction(q))


def f32(v: float) -> float:
    return torch.tensor(v, dtype=torch.float32).item()


def _pairs(rng, n):
    """Softmax's operands: a a shifted exponential (0, or 2^-126 .. 1) and d a sum of them
    (1 .. 2^31), random and at the edges (powers of two, all-ones mantissas)."""
    edges = [1.0, f32(1 - 2 ** -24), 2.0 ** -100, 2.0 ** -126, f32(2.0 ** -126 * 3), f32(3.0),
             2.0 ** 24, f32(2 ** 24 - 1), 2.0 ** 31, 0.0, f32(1.0 + 2 ** -23)]
    pairs = [(a, d) for a in edges for d in edges if a <= 1.0 and d >= 1.0]
    for _ in range(n):
        a = f32(math.ldexp(rng.random() + 0.5, -rng.randrange(0, 126)))
        d = f32(math.ldexp(rng.random() + 0.5, rng.randrange(1, 31)))
        pairs.append((min(a, 1.0), max(d, 1.0)))
    for _ in range(n):                                # softmax-like: a in (0, 1], rows to 3072
        pairs.append((f32(rng.random()) or 1.0, f32(1 + rng.random() * 3071)))
    return pairs


def test_the_formula_is_the_correctly_rounded_quotient():
    """With y = 1/d correctly rounded, a y corrected once by the scaled remainder is a/d
    correctly rounded (the division's bits; checked exhaustively on a GPU by
    tools/div_rcp_exhaustive.cu, here on samples and edges); below 2^-126 (a subnormal
    quotient) within one unit of its last place."""
    for a, d in _pairs(random.Random(7), 3000):
        y = rn32(1 / Fraction(d))
        got, want = div_rcp(a, y, d), rn32(Fraction(a) / Fraction(d))
        if want >= 2.0 ** -126:
            assert got == want, (a, d)
        else:
            assert abs(got - want) <= 2.0 ** -149, (a, d)


def test_the_remainder_is_scaled_for_tiny_numerators():
    """Why the remainder is scaled by 2^64: for a numerator under about 2^-100 the unscaled
    remainder a - q d is subnormal and loses bits, and the corrected product can miss the
    division's last bit where the quotient is normal (the first GPU run, unscaled, differed so
    in float32); scaled, it is exact."""
    rng = random.Random(3)
    misses = 0
    for _ in range(6000):
        a = f32(math.ldexp(rng.random() + 0.5, -rng.randrange(101, 121)))
        d = f32(1 + rng.random() * 30)
        y = rn32(1 / Fraction(d))
        want = rn32(Fraction(a) / Fraction(d))
        if want < 2.0 ** -126:
            continue
        misses += div_rcp(a, y, d, scaled=False) != want
        assert div_rcp(a, y, d) == want, (a, d)
    assert misses > 0


def test_kernels_compile_with_nvrtc():
    if not PLANS:
        pytest.skip("no plan recorded (run with the tests above)")
    compile_many(PLANS)
