"""The op table: every elementwise and reduction op pyfuser knows, in one place.

Each OpInfo row gives the op's name, arity, PyTorch's type-promotion kind, which dtype categories
it accepts, its PyTorch reference (used by the reference evaluator and by tests) and its CUDA
expression. Nothing else in pyfuser branches on op names: frontends look ops up here, the
evaluator calls `ref`, the codegen formats `cuda`. Reductions (REDUCTIONS) and random-number
generators (RANDOM_OPS: Philox4x32-10 draws, which read a launch's seed and offset and an
element's index rather than operand values) have tables of their own, and so do the few ops
only the schedulers write into kernel IR (KERNEL_OPS); `kernel_op(name)` finds the row a kernel
IR Op names in OPS, KERNEL_OPS or RANDOM_OPS.

CUDA expressions are templates over the operands `{0}`, `{1}`, `{2}`, already converted to the
op's computation type (half and bfloat16 compute in float). Functions named `pf_*` are defined in
the kernel prelude (codegen/prelude.py), with overloads for float, double and the integer types.

Invariants:
- `ref(*operands)` on tensors of the promoted dtype returns what eager returns, dtype included.
- `accepts` lists the dtype categories of the *computation* dtype the op is defined for; others
  are rejected at definition time with an error that names the op.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Callable

import torch

from .dtypes import DataType, Promotion

ALL = frozenset({"bool", "int", "float", "complex"})
NUMERIC = frozenset({"int", "float", "complex"})
REAL = frozenset({"bool", "int", "float"})
REAL_NUMERIC = frozenset({"int", "float"})
FLOAT = frozenset({"float"})
INTEGER = frozenset({"bool", "int"})


def category(dtype: DataType) -> str:
    if dtype.is_bool:
        return "bool"
    if dtype.is_complex:
        return "complex"
    return "float" if dtype.is_floating else "int"


@dataclass(frozen=True)
class OpInfo:
    name: str
    arity: int
    promotion: Promotion
    ref: Callable
    cuda: str
    accepts: frozenset = ALL
    # Extra keyword parameters that are compile-time constants of the op (e.g. rounding_mode).
    params: tuple = field(default=())
    # Operand positions that must be scalars and take no part in type promotion (PyTorch's
    # `Scalar` parameters such as leaky_relu's slope or addcmul's value).
    scalar_args: frozenset = frozenset()
    # Categories each operand's *own* dtype must be in, before promotion (None: any). Eager
    # rejects e.g. `int_tensor - bool_tensor` although the computation would be integral.
    operand_accepts: frozenset | None = None

    def accepts_dtype(self, dtype: DataType) -> bool:
        return category(dtype) in self.accepts

    def accepts_operand(self, dtype: DataType) -> bool:
        return self.operand_accepts is None or category(dtype) in self.operand_accepts


OPS: dict[str, OpInfo] = {}


def _op(name, arity, promotion, ref, cuda, accepts=ALL, params=(), scalar_args=(),
        operand_accepts=None):
    assert name not in OPS, name
    OPS[name] = OpInfo(name, arity, promotion, ref, cuda, accepts, params, frozenset(scalar_args),
                       operand_accepts)


P = Promotion
SQRT1_2 = math.sqrt(0.5)

# ---- unary ------------------------------------------------------------------------------------
_op("neg", 1, P.DEFAULT, torch.neg, "pf_neg({0})", NUMERIC)
_op("abs", 1, P.DEFAULT, torch.abs, "pf_abs({0})", REAL_NUMERIC)
_op("bitwise_not", 1, P.DEFAULT, torch.bitwise_not, "pf_bitwise_not({0})", INTEGER)
_op("logical_not", 1, P.ALWAYS_BOOL, torch.logical_not, "(!{0})", REAL)
_op("relu", 1, P.DEFAULT, torch.relu, "pf_relu({0})", REAL_NUMERIC)
_op("sign", 1, P.DEFAULT, torch.sign, "pf_sign({0})", REAL)
_op("ceil", 1, P.DEFAULT, torch.ceil, "ceil({0})", FLOAT)
_op("floor", 1, P.DEFAULT, torch.floor, "floor({0})", FLOAT)
_op("round", 1, P.DEFAULT, torch.round, "nearbyint({0})", FLOAT)
_op("trunc", 1, P.DEFAULT, torch.trunc, "trunc({0})", FLOAT)
_op("frac", 1, P.DEFAULT, torch.frac, "({0} - trunc({0}))", FLOAT)
_op("isnan", 1, P.ALWAYS_BOOL, torch.isnan, "pf_isnan({0})", REAL)
_op("isinf", 1, P.ALWAYS_BOOL, torch.isinf, "pf_isinf({0})", REAL)
_op("isfinite", 1, P.ALWAYS_BOOL, torch.isfinite, "pf_isfinite({0})", REAL)
for _name, _cuda in [
    ("exp", "exp({0})"), ("exp2", "exp2({0})"), ("expm1", "expm1({0})"),
    ("log", "log({0})"), ("log2", "log2({0})"), ("log10", "log10({0})"), ("log1p", "log1p({0})"),
    ("sqrt", "sqrt({0})"), ("rsqrt", "rsqrt({0})"), ("sin", "sin({0})"), ("cos", "cos({0})"),
    ("tan", "tan({0})"), ("asin", "asin({0})"), ("acos", "acos({0})"), ("atan", "atan({0})"),
    ("sinh", "sinh({0})"), ("cosh", "cosh({0})"), ("tanh", "tanh({0})"), ("asinh", "asinh({0})"),
    ("acosh", "acosh({0})"), ("atanh", "atanh({0})"), ("erf", "erf({0})"), ("erfc", "erfc({0})"),
    ("erfinv", "erfinv({0})"), ("lgamma", "lgamma({0})"),
    ("sigmoid", "pf_sigmoid({0})"), ("reciprocal", "pf_reciprocal({0})"),
]:
    _op(_name, 1, P.INT_TO_FLOAT, getattr(torch, _name), _cuda, REAL)
# rsqrt also takes complex operands (as eager and nvFuser do); no kernel scheduler takes complex
# dtypes yet, so those run on the reference evaluator.
OPS["rsqrt"] = replace(OPS["rsqrt"], accepts=ALL)
# The real and imaginary parts of a complex tensor (a real tensor of the matching precision).
# Their CUDA templates name prelude functions that complex support will have to add.
_op("real", 1, P.COMPLEX_TO_FLOAT, torch.real, "pf_real({0})", frozenset({"complex"}))
_op("imag", 1, P.COMPLEX_TO_FLOAT, torch.imag, "pf_imag({0})", frozenset({"complex"}))


def _gelu(x):
    """x * 0.5 * (1 + erf(x / sqrt(2))), in float for half / bfloat16 (rounded once): the
    kernels' formula (prelude pf_gelu) and CUDA eager's. CPU eager's gelu gives NaN for +inf on
    some paths and inf on others (FX fuzz seed 730167); this gives inf, as the kernels do."""
    c = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    return (c * 0.5 * (1 + torch.erf(c * 0.70710678118654752440))).to(x.dtype)


_op("gelu", 1, P.DEFAULT, _gelu, "pf_gelu({0})", FLOAT)
_op("gelu_tanh", 1, P.DEFAULT, lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
    "pf_gelu_tanh({0})", FLOAT)
_op("silu", 1, P.DEFAULT, torch.nn.functional.silu, "pf_silu({0})", FLOAT)
_op("mish", 1, P.DEFAULT, torch.nn.functional.mish, "pf_mish({0})", FLOAT)
_op("hardswish", 1, P.DEFAULT, torch.nn.functional.hardswish, "pf_hardswish({0})", FLOAT)
_op("hardsigmoid", 1, P.DEFAULT, torch.nn.functional.hardsigmoid, "pf_hardsigmoid({0})", FLOAT)

# ---- binary -----------------------------------------------------------------------------------
_op("add", 2, P.DEFAULT, torch.add, "pf_add({0}, {1})", ALL)
_op("sub", 2, P.DEFAULT, torch.sub, "pf_sub({0}, {1})", NUMERIC, operand_accepts=NUMERIC)
_op("mul", 2, P.DEFAULT, torch.mul, "pf_mul({0}, {1})", ALL)
_op("div", 2, P.INT_TO_FLOAT, torch.div, "({0} / {1})", NUMERIC)
_op("div_trunc", 2, P.DEFAULT, lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    "pf_div_trunc({0}, {1})", REAL_NUMERIC)
_op("div_floor", 2, P.DEFAULT, lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "pf_div_floor({0}, {1})", REAL_NUMERIC)
_op("pow", 2, P.DEFAULT, torch.pow, "pf_pow({0}, {1})", NUMERIC)
_op("remainder", 2, P.DEFAULT, torch.remainder, "pf_remainder({0}, {1})", REAL_NUMERIC)
_op("fmod", 2, P.DEFAULT, torch.fmod, "pf_fmod({0}, {1})", REAL_NUMERIC)
_op("atan2", 2, P.INT_TO_FLOAT, torch.atan2, "atan2({0}, {1})", REAL)
_op("maximum", 2, P.DEFAULT, torch.maximum, "pf_maximum({0}, {1})", REAL)
_op("minimum", 2, P.DEFAULT, torch.minimum, "pf_minimum({0}, {1})", REAL)
_op("eq", 2, P.ALWAYS_BOOL, torch.eq, "({0} == {1})", ALL)
_op("ne", 2, P.ALWAYS_BOOL, torch.ne, "({0} != {1})", ALL)
_op("lt", 2, P.ALWAYS_BOOL, torch.lt, "({0} < {1})", REAL)
_op("le", 2, P.ALWAYS_BOOL, torch.le, "({0} <= {1})", REAL)
_op("gt", 2, P.ALWAYS_BOOL, torch.gt, "({0} > {1})", REAL)
_op("ge", 2, P.ALWAYS_BOOL, torch.ge, "({0} >= {1})", REAL)
_op("logical_and", 2, P.ALWAYS_BOOL, torch.logical_and, "({0} && {1})", REAL)
_op("logical_or", 2, P.ALWAYS_BOOL, torch.logical_or, "({0} || {1})", REAL)
_op("logical_xor", 2, P.ALWAYS_BOOL, torch.logical_xor, "(bool({0}) != bool({1}))", REAL)
_op("bitwise_and", 2, P.DEFAULT, torch.bitwise_and, "({0} & {1})", INTEGER)
_op("bitwise_or", 2, P.DEFAULT, torch.bitwise_or, "({0} | {1})", INTEGER)
_op("bitwise_xor", 2, P.DEFAULT, torch.bitwise_xor, "({0} ^ {1})", INTEGER)
_op("bitwise_left_shift", 2, P.DEFAULT, torch.bitwise_left_shift, "pf_shl({0}, {1})",
    frozenset({"int"}))
_op("bitwise_right_shift", 2, P.DEFAULT, torch.bitwise_right_shift, "pf_shr({0}, {1})",
    frozenset({"int"}))
_op("leaky_relu", 2, P.DEFAULT, lambda x, s: torch.nn.functional.leaky_relu(x, float(s)),
    "pf_leaky_relu({0}, {1})", FLOAT,
    scalar_args=(1,))
_op("clamp_min", 2, P.DEFAULT, torch.clamp_min, "pf_clamp_min({0}, {1})", REAL_NUMERIC)
_op("clamp_max", 2, P.DEFAULT, torch.clamp_max, "pf_clamp_max({0}, {1})", REAL_NUMERIC)

# ---- ternary ----------------------------------------------------------------------------------
# where's condition is bool and takes no part in promotion: the builder promotes {1} and {2}.
_op("where", 3, P.DEFAULT, torch.where, "({0} ? {1} : {2})", ALL)
_op("clamp", 3, P.DEFAULT, lambda x, lo, hi: torch.clamp(x, lo, hi), "pf_clamp({0}, {1}, {2})",
    REAL_NUMERIC)
_op("lerp", 3, P.DEFAULT, torch.lerp, "pf_lerp({0}, {1}, {2})", FLOAT)
_op("addcmul", 4, P.DEFAULT, lambda s, a, b, v: torch.addcmul(s, a, b, value=v),
    "pf_addcmul({0}, {1}, {2}, {3})", NUMERIC,
    scalar_args=(3,))
_op("threshold", 3, P.DEFAULT, lambda x, t, v: torch.threshold(x, t, v),
    "({0} <= {1} ? {2} : {0})", REAL_NUMERIC,
    scalar_args=(1, 2))
_op("softplus", 3, P.DEFAULT, lambda x, b, t: torch.nn.functional.softplus(x, b, t),
    "pf_softplus({0}, {1}, {2})", FLOAT,
    scalar_args=(1, 2))
_op("hardtanh", 3, P.DEFAULT, lambda x, lo, hi: torch.nn.functional.hardtanh(x, lo, hi),
    "pf_clamp({0}, {1}, {2})", REAL_NUMERIC,
    scalar_args=(1, 2))


def op(name: str) -> OpInfo:
    try:
        return OPS[name]
    except KeyError:
        raise KeyError(f"pyfuser has no op named {name!r}") from None


# ---- reductions -------------------------------------------------------------------------------
@dataclass(frozen=True)
class ReductionInfo:
    name: str
    ref: Callable            # ref(tensor, dims, keepdim) -> tensor
    init: str                # CUDA expression of the identity, over the accumulator type `{T}`
    combine: str             # CUDA expression folding `{b}` into accumulator `{a}`
    promotion: Promotion


REDUCTIONS: dict[str, ReductionInfo] = {
    "sum": ReductionInfo("sum", lambda x, d, k: torch.sum(x, d, keepdim=k), "{T}(0)",
                         "({a} + {b})", Promotion.BOOL_TO_LONG),
    "prod": ReductionInfo("prod", lambda x, d, k: _prod(x, d, k), "{T}(1)",
                          "({a} * {b})", Promotion.BOOL_TO_LONG),
    "max": ReductionInfo("max", lambda x, d, k: torch.amax(x, d, keepdim=k),
                         "pf_lowest<{T}>()", "pf_max_nan({a}, {b})", Promotion.NONE),
    "min": ReductionInfo("min", lambda x, d, k: torch.amin(x, d, keepdim=k),
                         "pf_highest<{T}>()", "pf_min_nan({a}, {b})", Promotion.NONE),
}


def _prod(x, dims, keepdim):
    for d in sorted(dims, reverse=True):
        x = torch.prod(x, d, keepdim=keepdim)
    return x


# ---- random numbers ---------------------------------------------------------------------------
@dataclass(frozen=True)
class RandomInfo:
    """A random-number generator a kernel evaluates per element: `ref(seed, offset, k, index,
    digits)` (torch ops, ir/philox.py) and `cuda` (a prelude function) give the same bits for
    the same launch seed / offset, random op number `k` of the launch and element index."""
    name: str
    arity: int
    ref: Callable
    cuda: str


def _philox_uniform(seed, offset, k, index, digits):
    from .philox import uniform
    return uniform(seed, offset, k, index, digits)


def _philox_uniform_q(seed, offset, k, quad, word, digits):
    from .philox import uniform
    return uniform(seed, offset, k, quad * 4 + word, digits)


# philox_uniform_q(seed, offset, k, quad, word, digits) is philox_uniform at index 4 * quad + word:
# the lanes of a vector that share a quad compute one Philox block (the compiler merges the
# calls of an unrolled lane loop whose quad is the same expression)
RANDOM_OPS: dict[str, RandomInfo] = {
    "philox_uniform": RandomInfo("philox_uniform", 5, _philox_uniform,
                                 "pf_philox_uniform({0}, {1}, {2}, {3}, {4})"),
    "philox_uniform_q": RandomInfo("philox_uniform_q", 6, _philox_uniform_q,
                                   "pf_philox_uniform_q({0}, {1}, {2}, {3}, {4}, {5})"),
}


# Ops only the schedulers write into kernel IR (no frontend or Fusion IR names them).
# `exp_shifted`: exp(x) of a value shifted below a running maximum (x <= 0: an online softmax
# pair's terms and rescales, and exp(x - max(x)) over a reduction's axes: softmax's output).
# float computes 2^(x log2 e) on the hardware exp2 unit: relative
# error about 2^-22 plus |x| 2^-24 from the scaling (under 3e-6 for x > -20; below that the
# term is under 2e-9 of the row's largest, which is 1), in 2 instructions instead of expf's ~8,
# which bounded the throughput of bfloat16 rows; results under 2^-126 flush to 0. Other
# dtypes: exp. The CPU interpreter computes exp.
# `div_rcp(a, y, ys, ds)`: a / d given the row's y = 1 / d, ys = y 2^-64 and ds = d 2^64: the
# quotient q = a y corrected once, q + r y with the remainder r = a - q d computed scaled,
# R = (a 2^64) - q ds, and R ys = r y: the division's own fast path with its reciprocal hoisted
# out of the row, and a remainder that cannot underflow (unscaled, numerators under 2^-100
# lost its bits). For a normal quotient it has the division's bits: checked for every pair of
# mantissas on an H200 (tools/div_rcp_exhaustive.cu; other exponents scale every step
# exactly), not by a theorem (q = a y is not always within an ulp of a / d, and the remainder
# then not always exact, Markstein's premises; the result was right in every such case); a
# quotient under 2^-126 may be one unit of its last place off. 4 instructions where a division
# takes about 8, one of them a reciprocal on the special-function unit, which the exp2 unit
# shares. Needs d < 2^62 (ys normal); written only for softmax's quotient of a shifted
# exponential (0 to 1) by the sum of those exponentials over the same row (at least 1: the
# max's term is exp(0), at most the row's length; or NaN),
# reduction_patterns.find_shifted_quotients. The CPU interpreter computes a / d.
def _fma_ref(a, b, c):
    """a * b + c rounded once: the float32 product is exact in float64, and the sum rounded
    there then to float32 can differ from one rounding only on a float64 tie (the interpreter's
    reference; CUDA's fmaf rounds once)."""
    dt = torch.result_type(a, c) if isinstance(a, torch.Tensor) else torch.float32
    wide = torch.float64
    return (torch.as_tensor(a, dtype=wide) * torch.as_tensor(b, dtype=wide)
            + torch.as_tensor(c, dtype=wide)).to(dt)


# fma: a * b + c with one rounding. Not an op of the Fusion IR (eager rounds a product before a
# sum, which its pointwise ops keep): written only by a reduction's own arithmetic, the squared
# deviations a Welford chunk accumulates (codegen/reduction_accumulators.py), where one rounding
# is as exact or more and one instruction instead of two.
def _popc_ref(x):
    """The number of set bits of each 32-bit mask (held in an int64, non-negative)."""
    x = torch.as_tensor(x, dtype=torch.int64)
    return sum((x >> b) & 1 for b in range(32))


# popc: set bits of a warp ballot's mask (kernel_ir.Ballot), written only by the stream
# compactions of codegen/embedding_backward_lowering.py.
KERNEL_OPS: dict[str, OpInfo] = {
    "popc": OpInfo("popc", 1, Promotion.DEFAULT, _popc_ref, "__popc((unsigned)({0}))", INTEGER),
    "fma": OpInfo("fma", 3, Promotion.INT_TO_FLOAT, _fma_ref, "pf_fma({0}, {1}, {2})", FLOAT),
    "exp_shifted": OpInfo("exp_shifted", 1, Promotion.INT_TO_FLOAT, torch.exp,
                          "pf_exp_shifted({0})", FLOAT),
    "div_rcp": OpInfo("div_rcp", 4, Promotion.INT_TO_FLOAT,
                      lambda a, y, ys, ds: torch.div(a, ds * 2.0 ** -64),
                      "pf_div_rcp({0}, {1}, {2}, {3})", FLOAT),
}


def kernel_op(name: str):
    """The OpInfo or RandomInfo a kernel IR Op names."""
    info = OPS.get(name) or KERNEL_OPS.get(name)
    return info if info is not None else RANDOM_OPS[name]
