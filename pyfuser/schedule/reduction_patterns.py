"""Patterns of a reduction graph the lowering computes in a cheaper way than op by op, found by
reduction_graph.analyze (each can be switched off by its knob).

*Online pairs* (softmax, log_softmax, logsumexp, cross-entropy): a max M = max(X) and a sum
S = sum(exp(X - M)) of the same X (M broadcast back, float or double) are accumulated together in
M's pass as one (max, sum) state (`OnlinePair`): each thread takes the max of its chunk, sums
exp(x - max) and rescales its running sum when the max grows; threads, warps and cluster ranks
combine pairs (m = max(m1, m2), s = s1 exp(m1 - m) + s2 exp(m2 - m)). One combine round instead
of two; S's value is that of the two-pass form, special values included (NaN when M is not
finite and the row is not empty). $PYFUSER_RED_ONLINE=0 keeps the two passes.

*Picks* (cross-entropy's target logit): a sum over the one reduced axis k of
where(iota_k == index, X, 0), with `index` one integer per row, iota_k the position along k
(start 0, step 1, int64: a narrower one may wrap), X a float value of one load and the 0 a
+0.0 constant, is X at `index` (0.0 + X[index]: a -0.0 comes out +0.0 as from the sum; +0.0
when `index` is out of range, where no element matches). X is the load through a chain of
casts and elementwise ops whose other arguments are constants or row values: nll_loss of a
log_softmax (torch.compile's cross-entropy) picks (x - max) - log(sum), which the lowering
computes for the one element once the row's max and sum exist (with the ops' own exp and
division: a full-size output of the same value, computed per element as exp_shifted / div_rcp
below, may differ from the picked one by a few ulps on a GPU). Its reduce Node becomes a
row-level "pick" Node (args: the index Node, X): the lowering reads that one element per row
instead of comparing, selecting and adding on every element (`Pick`). Only where a real
reduction remains; $PYFUSER_RED_PICK=0 keeps the sums. A fusion that is a pure reduction only
through its picks (a pick of a value computed from the row's reductions) goes to the
reduction scheduler where the plan can keep its picks (schedule/reduction.py), since outer
kernels plan without them.

*Shifted exponentials* (softmax's output, the two-pass sum): exp(sub(X, broadcast(M))) with M
= max(X) over the reduced axes and X of float or double dtype has an argument that is never
positive (or NaN where exp's is), so the lowering computes it as `exp_shifted` (ir/ops.py
KERNEL_OPS: 2 instructions on the exp2 unit, where expf takes about 9), as the online pairs'
exponentials are (`shifted_exps`). $PYFUSER_RED_SHIFTED_EXP=0 keeps exp.

*Shifted quotients* (softmax's output): div(E, broadcast(S)) with E a shifted exponential of
float dtype (0 or at least 2^-126, at most 1, or NaN) and S the sum, over the reduced axes, of
a shifted exponential (at least 1: the max's own term is exp(0) = 1; or NaN) is computed as
`div_rcp` (ir/ops.py KERNEL_OPS): the row's reciprocal of S once, then a multiply and one
correction by a scaled remainder per element: the division's bits wherever the quotient is a
normal float (checked exhaustively on a GPU, ir/ops.py) (`shifted_quotients`: id(div Node) ->
the denominator Node).
$PYFUSER_RED_SHIFTED_DIV=0 keeps the division.

Invariant: a pattern is a function of the Fusion alone (no sizes), and computes what the ops
it replaces compute (special values included).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..ir import exprs as E
from ..ir.base import Scalar
from ..ir.dtypes import DataType
from .pointwise_graph import Node, key_axes

if TYPE_CHECKING:
    from .reduction_graph import ReductionGraph


@dataclass(eq=False)
class OnlinePair:
    """A max and a sum of exp(X - max) over the same X, accumulated in one pass (see the module
    docstring). The lowering treats it as one reduction whose partial is (max, sum)."""
    max_expr: object             # ReductionOp max(X)
    sum_expr: object             # ReductionOp sum(exp(X - broadcast(max)))
    x: object                    # the Node of X (full level)

    @property
    def dtype(self):
        return self.max_expr.outputs[0].dtype


@dataclass(eq=False)
class Pick:
    """The element of X at position `index` along the reduced axis `axis`, which a sum of
    where(iota == index, X, 0) computes (see the module docstring)."""
    axis: int                    # the reference axis (the one reduced axis)
    index: object                # row-level Node of integer dtype
    x: object                    # full-level Node: a float value of one load (chain_arg)
    load: object                 # the load Node under x


def _through_aliases(node):
    """The node whose value `node` is (broadcasts, squeezes, sets are the same value)."""
    while node.kind in ("alias", "set") and node.args and isinstance(node.args[0], Node):
        node = node.args[0]
    return node


ONLINE_DTYPES = ("Float", "Double")


def find_online_pairs(g: ReductionGraph) -> None:
    """Pair every max M = max(X) with a sum S = sum(exp(sub(X, broadcast(M)))) of the same X
    node (every value of one float / double dtype; each expr in one pair at most)."""
    red_nodes: dict = {}
    for n in g.nodes:
        if n.kind == "reduce":
            red_nodes.setdefault(id(n.expr), []).append(n)
    for s_expr in g.reduces:
        if not isinstance(s_expr, E.ReductionOp) or s_expr.info.name != "sum" or \
                id(s_expr) in g.online:
            continue
        args = {id(n.args[0]) for n in red_nodes[id(s_expr)]}
        if len(args) != 1:
            continue
        e = red_nodes[id(s_expr)][0].args[0]
        if e.kind != "op" or e.expr.info.name != "exp" or not isinstance(e.args[0], Node):
            continue
        d = e.args[0]
        if d.kind != "op" or d.expr.info.name != "sub" or \
                not all(isinstance(a, Node) for a in d.args):
            continue
        x, m = d.args[0], _through_aliases(d.args[1])
        if m.kind != "reduce" or not isinstance(m.expr, E.ReductionOp) or \
                m.expr.info.name != "max" or id(m.expr) in g.online:
            continue
        if any(n.args[0] is not x for n in red_nodes[id(m.expr)]):
            continue
        dts = {v.tv.dtype for v in (x, d, e)} | {s_expr.outputs[0].dtype, m.expr.outputs[0].dtype}
        if len(dts) != 1 or dts.pop().name not in ONLINE_DTYPES:
            continue
        pair = OnlinePair(m.expr, s_expr, x)
        g.pairs.append(pair)
        g.online[id(m.expr)] = g.online[id(s_expr)] = pair


def _shifted_max(node):
    """For an op Node exp(sub(X, broadcast(M))) whose M is the max of the same X Node (values of
    float or double dtype), the max's reduce Node; else None."""
    if node.kind != "op" or node.expr.info.name != "exp" or not isinstance(node.args[0], Node):
        return None
    d = node.args[0]
    if d.kind != "op" or d.expr.info.name != "sub" or \
            not all(isinstance(a, Node) for a in d.args):
        return None
    x, m = d.args[0], _through_aliases(d.args[1])
    if m.kind != "reduce" or not isinstance(m.expr, E.ReductionOp) or m.expr.info.name != "max":
        return None
    if m.args[0] is not x or {v.tv.dtype.name for v in (x, d, node)} - set(ONLINE_DTYPES) or \
            len({v.tv.dtype for v in (x, d, node)} | {m.expr.outputs[0].dtype}) != 1:
        return None
    return m


def find_shifted_exps(g: ReductionGraph) -> None:
    """The exp Nodes whose argument is never positive (module docstring)."""
    g.shifted_exps = {id(n) for n in g.nodes if _shifted_max(n) is not None}


def find_shifted_quotients(g: ReductionGraph) -> None:
    """The float divisions of a shifted exponential by a broadcast sum of shifted exponentials
    (module docstring); needs find_shifted_exps first."""
    g.shifted_quotients = {}
    for n in g.nodes:
        if n.kind != "op" or n.expr.info.name != "div" or \
                not all(isinstance(a, Node) for a in n.args):
            continue
        num, den = n.args
        s = _through_aliases(den)
        if id(num) not in g.shifted_exps or s.kind != "reduce" or \
                not isinstance(s.expr, E.ReductionOp) or s.expr.info.name != "sum" or \
                not isinstance(s.args[0], Node) or id(s.args[0]) not in g.shifted_exps:
            continue
        dts = {v.tv.dtype.name for v in (n, num, den, s)} | {s.expr.outputs[0].dtype.name}
        if dts != {"Float"}:
            continue
        g.shifted_quotients[id(n)] = den


def _const(a, value) -> bool:
    return isinstance(a, Scalar) and a.is_const and a.value == value and \
        (value != 0 or math.copysign(1.0, float(a.value)) > 0)


def _varies_along(node, k) -> bool:
    return any(k in key_axes(c) for c in node.key)


def chain_arg(node, k):
    """The one argument of a pick chain's `node` that varies along the reduced axis k, or None
    where the node may not be in a chain: casts, sets, aliases and elementwise ops whose other
    arguments are constants or row values (one per row: a log-softmax's max and log-sum)."""
    if node.kind not in ("cast", "set", "alias", "op") or not node.args:
        return None
    if node.kind != "op":
        return node.args[0] if isinstance(node.args[0], Node) else None
    full = {id(a): a for a in node.args if isinstance(a, Node) and _varies_along(a, k)}
    return next(iter(full.values())) if len(full) == 1 else None     # (x * x: one Node)


def _pick_of(g: ReductionGraph, node) -> Pick | None:
    """The Pick a reduce Node is (module docstring), or None."""
    k = g.R[0]
    e = node.expr
    if not isinstance(e, E.ReductionOp) or e.info.name != "sum" or id(e) in g.online:
        return None
    w = node.args[0]
    if w.kind != "op" or w.expr.info.name != "where" or len(w.args) != 3:
        return None
    cond, x, zero = w.args
    if not isinstance(cond, Node) or not isinstance(x, Node) or not _const(zero, 0):
        return None
    if cond.kind != "op" or cond.expr.info.name != "eq" or \
            not all(isinstance(a, Node) for a in cond.args):
        return None
    a, b = (_through_aliases(v) for v in cond.args)
    iota, index = (a, b) if a.kind == "iota" else (b, a)
    if iota.kind != "iota" or iota.tv.ndim != 1 or iota.key[0] != ("r", k) or \
            not _const(iota.args[0], 0) or not _const(iota.args[1], 1) or \
            iota.tv.dtype is not DataType.Int or not index.tv.dtype.is_integral:
        return None                 # (a narrower iota may wrap: several elements would match)
    if _varies_along(index, k):
        return None                               # the index varies along the reduced axis
    load = x
    while True:
        # every value of the chain read at the element's own index (no shift, view or
        # broadcast along the reduced axis): the pick reads the load at (row, index)
        if len(load.key) != g.n or load.key[k] != ("r", k) or \
                any(c != 0 and c != ("r", j) for j, c in enumerate(load.key)):
            return None
        if load.kind == "load":
            break
        below = chain_arg(load, k)
        if below is None:
            return None
        load = below
    dts = {x.tv.dtype, w.tv.dtype, e.outputs[0].dtype}
    if len(dts) != 1 or not x.tv.dtype.is_floating:
        return None
    return Pick(k, index, x, load)


def find_picks(g: ReductionGraph) -> None:
    """Turn the reduce Nodes that are picks into "pick" Nodes (module docstring), all Nodes of
    an expr or none, where a reduction remains."""
    if len(g.R) != 1:
        return
    by_expr: dict = {}
    for n in g.nodes:
        if n.kind == "reduce":
            by_expr.setdefault(id(n.expr), []).append(n)
    found = {}
    for e in g.reduces:
        picks = [_pick_of(g, n) for n in by_expr.get(id(e), [])]
        if picks and all(p is not None for p in picks):
            found[id(e)] = picks
    if not found or len(found) == len(g.reduces):
        return
    for eid, picks in found.items():
        for n, pk in zip(by_expr[eid], picks):
            n.kind, n.args = "pick", [pk.index, pk.x]
            g.picks[id(n)] = pk
    g.reduces = [e for e in g.reduces if id(e) not in found]


def reduce_input(g: ReductionGraph, node):
    """The full-size node a reduce node accumulates: its argument, or for the sum of an online
    pair the pair's X (the sum's own argument exists only after the max)."""
    pair = g.online.get(id(node.expr))
    return pair.x if pair is not None else node.args[0]
