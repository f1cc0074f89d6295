"""The structure of a reduction or normalization Fusion, seen from its reduction domain.

Every reduction of such a fusion reduces the same axes R of rank-n tensors of one shape: the
*reference domain* (axes 0..n-1, kept axes K and reduced axes R). Other tensors line up with it:
a rank-n tensor's axis i is reference axis i (broadcast axes included), a rank n-|R| tensor's
axes are K in order (a reduction's result, squeezed); lower-rank inputs reach it through
broadcasts. There is no permute or view between compute ops (the segmenter leaves those at the
edges, as host views); such fusions are refused with a reason.

Like pointwise_graph, every value gets an index key over the reference axes, ("r", k) or 0, and
a Node per (TensorView, key); slices, pads and cats read their operands at shifted keys ("sh"
entries) and make "pad" / "cat" nodes, as there (reduction_resize.py: what the reduction
lowering addresses). Reductions add "reduce" Nodes: a ReductionOp / WelfordOp output
read at a key over K; its input is read at that key with ("r", k) put back at R. From the keys:
- a Node's *level* is "full" when its key holds a reduced axis (it varies along R), else "row"
  (one value per kept index: reduction results, per-row inputs, what is computed from them);
- its *pass* (`avail`) is the first pass over the reduced axes in which its value exists: loads
  0; an op the latest of its arguments; a reduction one more than its input, which it
  accumulates in pass `avail(input)`. `n_passes` reduction passes run, each followed by the
  combine of its reductions across threads; full outputs are written in their own pass, which
  may be one more (`final_pass`, e.g. softmax's division by the sum).

Online pairs, picks and shifted exponentials (softmax's and cross-entropy's patterns, found
when `analyze` builds the graph): reduction_patterns.py.

Random numbers (PhiloxUniformOp) are "rng" Nodes, full-size sources like loads: the lowering
draws them at the element's row-major index in the op's shape (numbered in expr order, as the
reference evaluator numbers them), and a later pass that needs them again gets them kept
(`recompute_costly`). A row-level random value is refused.

A fusion is a *pure reduction* when one pass does everything (no full value depends on a
reduction result), else a *normalization* (softmax, layer_norm: reduced values flow back into
full-size values, so the row is read again or kept on chip).

Invariant: everything here is a function of the Fusion alone (no sizes), so the schedulers'
compile checks that call it are size-free.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

from ..ir import exprs as E
from ..ir.base import Scalar
from ..ir.tensor import TensorView
from .pointwise import _extent_classes, _same_extent
from .pointwise_gather import gather_unsupported
from .pointwise_graph import RESIZE_EXPRS, Node, key_axes, producer_key, resize_operands
from .reduction_resize import slice_key, unsupported
from .reduction_patterns import (OnlinePair, Pick, find_online_pairs, find_picks,  # noqa: F401
                                 find_shifted_exps, find_shifted_quotients, reduce_input)

REDUCE_EXPRS = (E.ReductionOp, E.WelfordOp)
ALLOWED = (E.ElementwiseOp, E.CastOp, E.SetOp, E.FullOp, E.IotaOp, E.PhiloxUniformOp,
           E.BroadcastOp, E.ExpandOp, E.SqueezeOp, E.ScalarCast, E.IndexSelectOp,
           E.GatherOp) + REDUCE_EXPRS
SOURCES = ("load", "full", "iota", "rng")     # node kinds with no full-size argument


class NotAReduction(Exception):
    """The fusion is not a reduction fusion this analysis handles (the message says why)."""


def reductions(fusion) -> list:
    return [e for e in fusion.used_exprs() if isinstance(e, REDUCE_EXPRS)]


def _zero_bcast(tv: TensorView, key) -> tuple:
    return tuple(0 if d.is_size_one_broadcast else c
                 for d, c in zip(tv.logical, key))


@dataclass
class ReductionGraph:
    fusion: object
    n: int                       # rank of the reference domain
    R: tuple                     # reduced reference axes
    K: tuple                     # kept reference axes
    nodes: list = field(default_factory=list)     # topological
    loads: list = field(default_factory=list)
    outputs: list = field(default_factory=list)   # Node of each fusion output
    reduces: list = field(default_factory=list)   # reduce exprs, in node order
    level: dict = field(default_factory=dict)     # id(node) -> "full" / "row"
    avail: dict = field(default_factory=dict)     # id(node) -> pass its value exists from
    reduce_pass: dict = field(default_factory=dict)  # id(reduce expr) -> pass accumulating it
    n_passes: int = 0
    final_pass: int = 0          # pass writing the full outputs that need every reduction
    pairs: list = field(default_factory=list)     # OnlinePair, in the order of their max
    rng_numbers: dict = field(default_factory=dict)  # id(PhiloxUniformOp) -> its number
    online: dict = field(default_factory=dict)    # id(max or sum expr) -> its OnlinePair
    picks: dict = field(default_factory=dict)     # id(pick Node) -> its Pick
    shifted_exps: set = field(default_factory=set)  # id(exp Node) computed as exp_shifted
    shifted_quotients: dict = field(default_factory=dict)  # id(div Node) -> its denominator
    online_asked: bool = True    # analyze's `online` (pairs were looked for)

    @property
    def is_pure_reduction(self) -> bool:
        return self.n_passes == 1 and all(self.avail[id(o)] == 0 for o in self.outputs
                                          if self.level[id(o)] == "full")

    def output_key(self, tv: TensorView) -> tuple:
        """The key a fusion output is written at (its axes line up with the reference)."""
        if tv.ndim == self.n:
            return _zero_bcast(tv, [("r", k) for k in range(self.n)])
        if tv.ndim == len(self.K):
            return _zero_bcast(tv, [("r", k) for k in self.K])
        raise NotAReduction(f"output {tv.name} has rank {tv.ndim}: neither the reduction domain's "
                            f"{self.n} nor the kept axes' {len(self.K)}")


def analyze(fusion, online: bool = True, picks: bool = True) -> ReductionGraph:
    """The ReductionGraph of `fusion`; NotAReduction (with the reason) when it is none.
    `online=False`: no online pairs (max and sum of exp in two passes); `picks=False`: no
    picks (the sums of where(iota == index, X, 0) stay sums)."""
    reds = reductions(fusion)
    if not reds:
        raise NotAReduction("no reduction")
    for e in fusion.used_exprs():
        if not isinstance(e, ALLOWED + RESIZE_EXPRS):
            raise NotAReduction(f"{e.op_name} ({type(e).__name__}) between compute ops")
    first = reds[0].inputs[0]
    n, R = first.ndim, tuple(reds[0].axes)
    for e in reds[1:]:
        if e.inputs[0].ndim != n or tuple(e.axes) != R:
            raise NotAReduction(f"reductions over different axes ({list(R)} of rank {n} and "
                                f"{list(e.axes)} of rank {e.inputs[0].ndim})")
    g = ReductionGraph(fusion, n, R, tuple(k for k in range(n) if k not in R))
    g.online_asked = online
    _Builder(g).build()
    why = unsupported(g)
    if why:
        raise NotAReduction(why)
    # random ops numbered in expr order, as the reference evaluator numbers them
    g.rng_numbers = {id(e): k for k, e in enumerate(
        x for x in fusion.used_exprs() if isinstance(x, E.PhiloxUniformOp))}
    if online and os.environ.get("PYFUSER_RED_ONLINE") != "0":
        find_online_pairs(g)
    if picks and os.environ.get("PYFUSER_RED_PICK") != "0":
        find_picks(g)
    if os.environ.get("PYFUSER_RED_SHIFTED_EXP") != "0":
        find_shifted_exps(g)
        if os.environ.get("PYFUSER_RED_SHIFTED_DIV") != "0":
            find_shifted_quotients(g)
    _levels_and_passes(g)
    _check_partial_outputs(g)
    return g


def _check_partial_outputs(g: ReductionGraph) -> None:
    """Refuse an output that varies along some reduced axes but is broadcast along others (a
    row statistic [N, 1] beside a sum over both axes of [N, C]): the kernel stores a full-size
    value at each position it reduces, so every thread along the broadcast axis would write
    the same element, a race (the CPU interpreter's race check found it: a KL divergence's
    log of the row sum, saved for the backward, beside its sum over every element). Refused,
    the segmenter computes it in another kernel (where it is a row value, written once)."""
    ref = reductions(g.fusion)[0].inputs[0]
    R = {k for k in g.R if ref.logical[k].known_size() != 1}    # (an axis of 1: one thread)
    for o, node in zip(g.fusion.outputs, g.outputs):
        if g.level[id(node)] != "full":
            continue
        covered = {c[1] for c in node.key if isinstance(c, tuple) and c[0] == "r"}
        missing = sorted(R - covered)
        if missing:
            raise NotAReduction(f"output {o.name} is broadcast along reduced axes {missing} but "
                                f"not along {sorted(R & covered)}: every thread along {missing} "
                                f"would write each of its elements")


def node_kind(e) -> str:
    """The Node kind of a full-size value made by expr e (not a reduction, not a load)."""
    return ("op" if isinstance(e, E.ElementwiseOp) else "cast" if isinstance(e, E.CastOp)
            else "set" if isinstance(e, E.SetOp) else "alias")


def pass_reductions(g: ReductionGraph, q: int) -> list:
    """The reductions of pass q as the lowering combines them: an online pair in place of its
    max and its sum."""
    out = []
    for e in g.reduces:
        if g.reduce_pass[id(e)] != q:
            continue
        pair = g.online.get(id(e))
        if pair is None:
            out.append(e)
        elif pair not in out:
            out.append(pair)
    return out


class _Builder:
    """Walks the fusion from its outputs at their keys (see the module docstring), checking that
    every axis read at reference axis k has k's extent (the same extent class, through the
    elementwise ops that make axes meet, or the same constant): tensors that only line up by
    rank (a transposed view beside the reduced tensor, a reduction of a size-1 broadcast) are
    another reduction domain, refused here (the segmenter cuts them apart)."""

    def __init__(self, g: ReductionGraph):
        self.g = g
        self.memo: dict = {}
        self.uf = _extent_classes(g.fusion, cats=True)
        self.ref = reductions(g.fusion)[0].inputs[0]

    def _check_axes(self, tv: TensorView, key) -> None:
        for j, c in enumerate(key):
            if c == 0 or c[0] in ("ix", "sh", "st", "dv"):
                continue      # a gathered axis (the index's own axes checked), a shifted one
                # (a slice's, pad's or cat's operand: its resize op's output was checked)
            d, r = tv.logical[j], self.ref.logical[c[1]]
            if not _same_extent(self.uf, d, r):
                raise NotAReduction(f"axis {j} of {tv.name} is not known to have the extent of "
                                    f"axis {c[1]} of the reduced {self.ref.name}")

    def build(self) -> None:
        old = sys.getrecursionlimit()
        sys.setrecursionlimit(max(old, 20000))
        try:
            for o in self.g.fusion.outputs:
                self.g.outputs.append(self.visit(o, self.g.output_key(o)))
        finally:
            sys.setrecursionlimit(old)

    def visit(self, tv: TensorView, key: tuple, check: bool = True) -> Node:
        """The Node of `tv` read at `key`; `check=False`: the axes need not have the reference
        extents (a gather's input, which may be larger than its index along the other axes:
        eager requires no more, and the execute-time bindings check that)."""
        g = self.g
        mk = (id(tv), key)
        hit = self.memo.get(mk)
        if hit is not None:
            return hit
        if check:
            self._check_axes(tv, key)
        e = tv.definition
        if e is None:
            node = Node("load", tv, key)
            g.loads.append(node)
        elif isinstance(e, E.FullOp):
            node = Node("full", tv, key, e, [e.inputs[0]])
        elif isinstance(e, E.IotaOp):         # start + (index along its axis) * step
            node = Node("iota", tv, key, e, list(e.inputs[1:]))
        elif isinstance(e, E.PhiloxUniformOp):   # a function of the element's row-major index
            node = Node("rng", tv, key, e, [])
        elif isinstance(e, (E.IndexSelectOp, E.GatherOp)):   # an "ix" key: read at the index
            node = self._gather(tv, key, e)
        elif isinstance(e, RESIZE_EXPRS):     # operands read at shifted keys (reduction_resize)
            kind, operands, extra = resize_operands(e, key)
            if isinstance(e, E.SliceOp):
                x = e.inputs[0]
                operands = [(x, slice_key(e, operands[0][1], lambda a, b: _same_extent(
                    self.uf, a, b)))]
            node = Node(kind, tv, key, e, [self.visit(x, k) for x, k in operands] + extra)
        elif isinstance(e, REDUCE_EXPRS):
            if len(key) != len(g.K):
                raise NotAReduction(f"{e.op_name} result {tv.name} read at rank {len(key)}")
            full_key = [None] * g.n
            for k, c in zip(g.K, key):
                if c != 0 and c != ("r", k):
                    # broadcast back along other axes than the kept ones (amax over axis 1 of
                    # [B, M, 1] then combined with the [B, M, 1] input: its result lands on axis
                    # 1): another row's result, not this row's; a separate kernel reads it
                    raise NotAReduction(f"{e.op_name} result {tv.name} is read with its kept "
                                        f"axis {k} on reference axis {c[1]}")
                full_key[k] = c
            for k in g.R:
                full_key[k] = ("r", k)
            inp = e.inputs[0]
            for k in g.R:
                if not _same_extent(self.uf, inp.logical[k], self.ref.logical[k]):
                    raise NotAReduction(f"{e.op_name} of {inp.name} reduces axes of other extents "
                                        f"than {self.ref.name}'s")
            arg = self.visit(inp, _zero_bcast(inp, full_key))
            node = Node("reduce", tv, key, e, [arg])
            if e not in g.reduces:
                g.reduces.append(e)
        else:
            args = []
            for v in e.inputs:
                if isinstance(v, TensorView):
                    args.append(self.visit(v, self._producer_key(e, key, v)))
                else:
                    args.append(v)
            node = Node(node_kind(e), tv, key, e, args)
        self.memo[mk] = node
        g.nodes.append(node)
        return node

    def _gather(self, tv: TensorView, key: tuple, e) -> Node:
        """An index_select / embedding / gather: its input read with the gathered axis at the
        index's value (an "ix" key entry). The index must be one value per row (no reduced
        axis in its key): the lowering reads it in each load's offset, once a row."""
        why = gather_unsupported(e)
        if why:
            raise NotAReduction(why)
        x, index, d = e.inputs[0], e.inputs[1], e.dim
        if isinstance(e, E.GatherOp):             # same rank: the index read at out's key
            inode = self.visit(index, _zero_bcast(index, key))
            xk = tuple(key[:d]) + (("ix", inode),) + tuple(key[d + 1:])
        else:                                     # the index's axes replace axis d
            r = max(index.ndim, 1)
            inode = self.visit(index, _zero_bcast(index, key[d:d + index.ndim]))
            xk = tuple(key[:d]) + (("ix", inode),) + tuple(key[d + r:])
        if any(k in key_axes(c) for c in inode.key for k in self.g.R):
            raise NotAReduction(f"{e.op_name}: its index {index.name} changes along the reduced "
                                f"axes")
        return Node("alias", tv, key, e, [self.visit(x, _zero_bcast(x, xk),
                                                     check=not isinstance(e, E.GatherOp))])

    def _producer_key(self, e, key, inp) -> tuple:
        pk = producer_key(e, key, inp)
        if len(pk) != inp.ndim:
            raise NotAReduction(f"cannot line up {inp.name} with the reduction domain")
        return pk


# Ops cheap enough to compute again in a later pass rather than keep in registers.
CHEAP_OPS = frozenset({"add", "sub", "mul", "neg", "abs", "maximum", "minimum", "relu", "eq",
                       "ne", "lt", "le", "gt", "ge", "where", "logical_and", "logical_or",
                       "logical_not", "logical_xor", "clamp", "clamp_min", "clamp_max", "sign"})


def total_passes(g: ReductionGraph) -> int:
    return max(g.n_passes, g.final_pass + 1)


def ancestors(g: ReductionGraph, targets, stop) -> list:
    """Nodes needed to compute `targets`, not looking past nodes where `stop(node)`, in
    topological order."""
    need, stack = set(), list(targets)
    while stack:
        n = stack.pop()
        if id(n) in need:
            continue
        need.add(id(n))
        if stop(n):
            continue
        stack.extend(a for a in n.args if not isinstance(a, Scalar))
    return [n for n in g.nodes if id(n) in need]


def pass_nodes(g: ReductionGraph, q: int) -> tuple:
    """(reduce exprs accumulated in pass q, full outputs written in it, the full-size nodes it
    computes, in order). A full output is written in the first pass its value exists in."""
    reds = [e for e in g.reduces if g.reduce_pass[id(e)] == q]
    red_inputs = [reduce_input(g, n) for n in g.nodes if n.kind == "reduce" and n.expr in reds]
    outs = [o for o in g.outputs if g.level[id(o)] == "full" and g.avail[id(o)] == q]
    full = ancestors(g, red_inputs + outs, lambda n: g.level[id(n)] == "row")
    return reds, outs, [n for n in full if g.level[id(n)] == "full"]


def recompute_costly(g: ReductionGraph) -> list:
    """Full-size nodes worth keeping in registers between the passes of a persistent kernel:
    a value that a later pass needs again and whose computation since the loads and the row
    values has an op outside CHEAP_OPS (softmax's exp(x - max): needed by the sum and by the
    output). Of a chain of such values only the last one a later pass reads is kept."""
    needed: dict = {}                            # id(node) -> passes computing it
    for q in range(total_passes(g)):
        for n in pass_nodes(g, q)[2]:
            needed.setdefault(id(n), []).append(q)
    costly: dict = {}
    for n in g.nodes:                            # topological: arguments first
        if g.level[id(n)] != "full" or n.kind in ("load", "full", "iota"):
            costly[id(n)] = False
            continue
        own = n.kind == "rng" or (n.kind == "op" and n.expr.info.name not in CHEAP_OPS)
        costly[id(n)] = own or any(costly.get(id(a), False) for a in n.args
                                   if not isinstance(a, Scalar))
    first = {k: min(v) for k, v in needed.items()}
    reread = [n for n in g.nodes if costly[id(n)] and n.kind not in ("set", "alias")
              and len(needed.get(id(n), [])) > 1]
    keep = {id(n) for n in reread}
    out = []
    for n in reread:                             # n is read in a later pass by a kept node only?
        later_users = [u for u in g.nodes if any(a is n for a in u.args)
                       and u.kind != "reduce" and any(q > first[id(n)] for q in needed.get(id(u), []))]
        later_reduce = any(u.kind == "reduce" and g.reduce_pass[id(u.expr)] > first[id(n)]
                           for u in g.nodes if any(a is n for a in u.args))
        later_output = any(o is n and g.avail[id(o)] > first[id(n)] for o in g.outputs)
        if later_reduce or later_output or any(id(u) not in keep for u in later_users):
            out.append(n)
    return out


def load_passes(g: ReductionGraph) -> dict:
    """{id(load node): [the passes that read it, in order]} of the full-size loads."""
    passes: dict = {}
    for q in range(total_passes(g)):
        for n in pass_nodes(g, q)[2]:
            if n.kind == "load":
                passes.setdefault(id(n), []).append(q)
    return passes


def held_loads(g: ReductionGraph, passes=None) -> dict:
    """{id(load node): first pass} of the full-size loads a persistent kernel holds in registers
    for a whole pass or more: read in several passes, or by a Welford statistic (whose chunk
    reads them again), or by an online pair (its max, then its sum, read them). The other loads
    are read step by step in their one pass. `passes`: `load_passes(g)`, where the caller has
    it."""
    passes = load_passes(g) if passes is None else passes
    welford: set = set()
    for q in range(total_passes(g)):
        reds, _, _ = pass_nodes(g, q)
        for e in reds:
            if isinstance(e, E.WelfordOp) or id(e) in g.online:
                inputs = [reduce_input(g, n) for n in g.nodes if n.kind == "reduce" and n.expr is e]
                welford |= {id(n) for n in ancestors(g, inputs, lambda m: False) if n.kind == "load"}
    return {k: v[0] for k, v in passes.items() if len(v) > 1 or k in welford}


def _levels_and_passes(g: ReductionGraph) -> None:
    R = set(g.R)
    for node in g.nodes:
        # a reduced axis read directly or shifted (a slice's, pad's or cat's operand)
        full = any(isinstance(c, tuple) and c[0] in ("r", "sh") and key_axes(c) & R
                   for c in node.key)
        g.level[id(node)] = "full" if full else "row"
        if node.kind == "rng" and not full:
            raise NotAReduction(f"random numbers {node.tv.name} with one value per row (drawn "
                                f"where a full-size element is)")
        if node.kind in SOURCES:
            g.avail[id(node)] = 0
        elif node.kind == "reduce":
            p = g.avail[id(reduce_input(g, node))]
            prev = g.reduce_pass.get(id(node.expr))
            assert prev is None or prev == p
            g.reduce_pass[id(node.expr)] = p
            g.avail[id(node)] = p + 1
        else:
            g.avail[id(node)] = max((g.avail[id(a)] for a in node.args if not isinstance(a, Scalar)),
                                    default=0)
    g.n_passes = max(g.reduce_pass.values()) + 1 if g.reduce_pass else 0
    g.final_pass = max([g.n_passes - 1] + [g.avail[id(o)] for o in g.outputs
                                           if g.level[id(o)] == "full"])
