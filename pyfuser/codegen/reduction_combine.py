"""Combining partial results of reductions, as kernel IR: identities, the combine of two partials
(sum, prod, max, min and Welford's (mean, m2, n) triple), and the cross-thread steps built from
them (warp shuffles, a block's shared-memory exchange).

A partial is a list of kernel IR expressions: one value for sum / prod / max / min (in the
accumulator dtype), three for Welford (mean and m2 in the compute dtype, n in the kernel's index
type: int32 unless a tensor spans 2^31 elements, so a count never overflows). Every
combine is written with op-table ops (add, mul, maximum, minimum, sub, div, where), so the printer
and the interpreter evaluate exactly the same arithmetic, and the order of combination is fixed
(lanes in order, shuffles by falling xor distance, warps in order): the same inputs give the same
bits on every run.

An online pair (reduction_patterns.OnlinePair: softmax's max and sum of exp(x - max) in one pass)
has the partial (m, s), s the sum of exp(x - m) over the partial's elements, where an element
equal to m counts exp(0) = 1 even when it is infinite. Combine: m = max(m1, m2) (NaN as eager),
s = s1 * exp(d1) + s2 * exp(d2), d_i = 0 where m_i == m, else m_i - m (so two partials of -inf
elements keep their counts, and the identity (-inf, 0) changes nothing). The sum's value is
`pair_sum_result`: s when m is finite or s is 0 (no element), else NaN (what the two-pass
sum(exp(x - m)) gives for a row whose max is infinite or NaN).

Welford's combine (Chan et al.) of (ma, m2a, na) and (mb, m2b, nb): n = na + nb, c = nb / n (0 when
n is 0), d = mb - ma, mean = ma + d * c, m2 = m2a + m2b + d * (d * (na * c)): the weight first, so
a partial of no elements adds 0 where d * d overflows (a mean of 1e20 in float32; d * d * 0 was
NaN, where eager's variance is inf).
"""
from __future__ import annotations

import math

import torch

from ..ir import exprs as E
from ..ir.dtypes import DataType
from ..schedule.reduction_graph import OnlinePair
from . import kernel_ir as K

I64 = DataType.Int
COMBINE_OP = {"sum": "add", "prod": "mul", "max": "maximum", "min": "minimum"}


def acc_dtypes(e, count: DataType = I64) -> list:
    """Accumulator dtypes of a reduce expr's partial (`count`: Welford's n)."""
    if isinstance(e, OnlinePair):
        c = e.dtype.compute
        return [c, c]
    if isinstance(e, E.WelfordOp):
        c = e.inputs[0].dtype.compute
        return [c, c, count]
    return [e.outputs[0].dtype.compute]


def identity(e, count: DataType = I64) -> list:
    """The partial of no element."""
    dts = acc_dtypes(e, count)
    if isinstance(e, OnlinePair):
        return [K.Const(-math.inf, K.REGISTER_CTYPE[dts[0]], dts[0]),
                K.Const(0.0, K.REGISTER_CTYPE[dts[1]], dts[1])]
    if isinstance(e, E.WelfordOp):
        return [K.Const(0.0, K.REGISTER_CTYPE[dts[0]], dts[0]),
                K.Const(0.0, K.REGISTER_CTYPE[dts[1]], dts[1]),
                K.Const(0, K.REGISTER_CTYPE[count], count)]
    dt = dts[0]
    name = e.info.name
    if name in ("sum", "prod"):
        v = 0 if name == "sum" else 1
        return [K.Const(bool(v) if dt.is_bool else (float(v) if dt.is_floating else v),
                        K.REGISTER_CTYPE[dt], dt)]
    low = name == "max"
    if dt.is_bool:
        v = not low
    elif dt.is_floating:
        v = -math.inf if low else math.inf
    else:
        info = torch.iinfo(dt.torch)
        v = info.min if low else info.max
    return [K.Const(v, K.REGISTER_CTYPE[dt], dt)]


def shift_exp(x, m, dt):
    """exp(x - m) of an online pair's element or partial x under the running max m >= x: 1
    where x == m (infinite x included: no NaN from inf - inf), NaN where either is NaN; on the
    exp2 unit (ops.KERNEL_OPS' exp_shifted: the argument is never positive)."""
    zero = K.Const(0.0, K.REGISTER_CTYPE[dt], dt)
    return K.Op("exp_shifted", (K.Op("where", (K.Op("eq", (x, m), dt), zero, K.Op("sub", (x, m), dt)),
                              dt),), dt)


def pair_sum_result(m, s, dt):
    """The value of an online pair's sum: s where m is finite or s is 0, else NaN."""
    ok = K.Op("logical_or", (K.Op("isfinite", (m,), dt),
                             K.Op("eq", (s, K.Const(0.0, K.REGISTER_CTYPE[dt], dt)), dt)), dt)
    return K.Op("where", (ok, s, K.Const(float("nan"), K.REGISTER_CTYPE[dt], dt)), dt)


class Combiner:
    """Emits the Lets of combines into a statement list; names stay unique per kernel.
    `count` is the dtype of Welford counts (the kernel's index type)."""

    def __init__(self, count: DataType = I64):
        self.count = 0
        self.n_dtype = count

    def dtypes(self, e) -> list:
        return acc_dtypes(e, self.n_dtype)

    def identity(self, e) -> list:
        return identity(e, self.n_dtype)

    def fresh(self, stem: str) -> str:
        self.count += 1
        return f"{stem}{self.count}"

    def combine(self, e, a: list, b: list, out: list, equal: bool = False) -> list:
        """Partial of `a` then `b` (order matters only for rounding; it is fixed). `equal`: the
        two Welford partials count as many elements (or none), so b's weight nb / (na + nb) is
        1/2, the division's bits (0 for none: the means then 0, the same result), without it."""
        if isinstance(e, OnlinePair):
            dt = acc_dtypes(e)[0]
            m = self._let(out, "om", dt, K.Op("maximum", (a[0], b[0]), dt))
            return [m, K.Op("add", (K.Op("mul", (a[1], shift_exp(a[0], m, dt)), dt),
                                    K.Op("mul", (b[1], shift_exp(b[0], m, dt)), dt)), dt)]
        if not isinstance(e, E.WelfordOp):
            dt = acc_dtypes(e)[0]
            return [K.Op(COMBINE_OP[e.info.name], (a[0], b[0]), dt)]
        c_dt = acc_dtypes(e)[0]
        N = self.n_dtype
        ma, m2a, na = a
        mb, m2b, nb = b
        n = self._let(out, "wn", N, K.Op("add", (na, nb), N))
        nf = K.Convert("cast", n, N, c_dt)
        nbf = K.Convert("cast", nb, N, c_dt)
        naf = K.Convert("cast", na, N, c_dt)
        zero = K.Const(0.0, K.REGISTER_CTYPE[c_dt], c_dt)
        pos = K.Op("gt", (n, K.Const(0, K.REGISTER_CTYPE[N], N)), N)
        if equal:
            c = K.Const(0.5, K.REGISTER_CTYPE[c_dt], c_dt)
        else:
            c = self._let(out, "wc", c_dt,
                          K.Op("where", (pos, K.Op("div", (nbf, nf), c_dt), zero), c_dt))
        d = self._let(out, "wd", c_dt, K.Op("sub", (mb, ma), c_dt))
        mean = K.Op("add", (ma, K.Op("mul", (d, c), c_dt)), c_dt)
        dd = K.Op("mul", (d, K.Op("mul", (d, K.Op("mul", (naf, c), c_dt)), c_dt)), c_dt)
        m2 = K.Op("add", (K.Op("add", (m2a, m2b), c_dt), dd), c_dt)
        return [mean, m2, n]

    def _let(self, out, stem, dt, expr):
        name = self.fresh(stem)
        out.append(K.Let(name, K.REGISTER_CTYPE[dt], expr))
        return K.Var(name)

    def assign_all(self, e, names: list, index: tuple, exprs: list, out: list) -> None:
        """Accumulators `names[i][index] = exprs[i]` of reduce expr e: computed first (Lets),
        then written, so a combine reading the old values sees them all unchanged."""
        tmp = []
        for n, x, dt in zip(names, exprs, self.dtypes(e)):
            t = self.fresh(f"{n}_n")
            out.append(K.Let(t, K.REGISTER_CTYPE[dt], x))
            tmp.append(K.Var(t))
        for n, t in zip(names, tmp):
            out.append(K.Assign(n, index, t))

