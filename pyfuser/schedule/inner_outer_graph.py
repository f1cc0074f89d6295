"""The structure of an inner-outer fusion: row reductions and column reductions over one domain.

A layer norm's backward reduces one [rows x H] domain two ways: dx needs sums over each row's
normalized axes (*inner* reductions), dweight and dbias sum over the rows (*outer* reductions).
This module recognises fusions made of exactly these two families over one reference domain of
rank n (axes I: the inner reductions' axes, holding the last axis; axes O: the outer ones',
the complement of I) and describes them for the inner_outer_persistent scheduler:

- `inner`: a reduction_graph.ReductionGraph with R = I and K = O (the rows) holding everything
  computed per element or per row: the fusion's full-size and per-row outputs (dx, row
  statistics) and, as extra *accumulated* outputs after them, the inputs of the outer
  reductions (dy * x_hat, dy). Its passes say when each value exists, so the kernel adds an
  outer reduction's input to its column partials in the pass that computes it;
- the *column graph*: the outer reductions' results ("oreduce" nodes, keyed over I) and what is
  computed from them and from per-column inputs (casts back to the weight's dtype), ending in
  the fusion's per-column outputs (dweight, dbias).

Refused (NotInnerOuter, with the reason): a single reduction domain (the reduction schedulers'
work), more than two axis sets, axis sets that do not split the domain into rows and columns,
rank or extent mismatches, a per-row or per-element value (or an outer reduction's input) that
depends on an outer reduction, an output that needs both families, Welford or non-sum outer
reductions, ops other than pointwise ones, broadcasts, squeezes and the reductions.

Invariant: a function of the Fusion alone (no sizes), so compile checks built on it are
size-free; the inner graph's node keys and levels mean what reduction_graph documents.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field

from ..ir import exprs as E
from ..ir.tensor import TensorView
from . import reduction_graph as RG
from .pointwise import _same_extent
from .pointwise_graph import Node, producer_key


class NotInnerOuter(Exception):
    """The fusion is not a two-family (row + column) reduction fusion; the message says why."""


@dataclass
class InnerOuterGraph:
    fusion: object
    ref: TensorView                   # the first inner reduction's input (the reference domain)
    I: tuple                          # inner (normalized, column) axes of the reference domain
    O: tuple                          # outer (row) axes
    inner: RG.ReductionGraph          # R = I, K = O; outputs: inner_outputs' nodes, then outer inputs
    inner_outputs: list = field(default_factory=list)   # fusion output indices, in inner.outputs order
    outer: list = field(default_factory=list)           # outer reduce exprs
    outer_inputs: list = field(default_factory=list)    # their input nodes (in `inner`)
    col_nodes: list = field(default_factory=list)       # column graph, topological
    col_loads: list = field(default_factory=list)
    col_outputs: list = field(default_factory=list)     # (fusion output index, node)


def _depends_on(fusion, exprs) -> set:
    """ids of the TensorViews computed from an output of `exprs`."""
    ids = {id(e) for e in exprs}
    out: set = set()
    for e in fusion.used_exprs():
        if id(e) in ids or any(id(v) in out for v in e.inputs):
            out.update(id(o) for o in e.outputs)
    return out


class _InnerBuilder(RG._Builder):
    """reduction_graph's builder over the row domain that refuses to look through an outer
    reduction (a row or element value must not depend on a column sum)."""

    def __init__(self, g, ref, outer_ids):
        super().__init__(g)
        self.ref = ref
        self.outer_ids = outer_ids

    def visit(self, tv, key, check: bool = True):
        if tv.definition is not None and id(tv.definition) in self.outer_ids:
            raise NotInnerOuter(f"{tv.name}, a sum over the rows, flows back into per-row or "
                                "per-element values")
        return super().visit(tv, key, check)


class _ColumnBuilder:
    """The column graph: nodes keyed over the inner axes I (("r", k) for k in I, or 0)."""

    def __init__(self, io: InnerOuterGraph, uf, outer_ids, inner_ids):
        self.io, self.uf = io, uf
        self.outer_ids, self.inner_ids = outer_ids, inner_ids
        self.memo: dict = {}

    def output_key(self, tv: TensorView) -> tuple:
        io = self.io
        if tv.ndim == len(io.I):
            return RG._zero_bcast(tv, [("r", k) for k in io.I])
        if tv.ndim == len(io.I) + len(io.O):
            for k in io.O:
                d = tv.logical[k]
                if not d.is_size_one_broadcast:
                    raise NotInnerOuter(f"output {tv.name} of a sum over the rows is not broadcast "
                                        f"along row axis {k}")
            return RG._zero_bcast(tv, [("r", k) if k in io.I else 0 for k in range(tv.ndim)])
        raise NotInnerOuter(f"output {tv.name} of a sum over the rows has rank {tv.ndim}")

    def visit(self, tv: TensorView, key: tuple) -> Node:
        mk = (id(tv), key)
        hit = self.memo.get(mk)
        if hit is not None:
            return hit
        ref = self.io.ref
        for j, c in enumerate(key):
            if c != 0 and not _same_extent(self.uf, tv.logical[j], ref.logical[c[1]]):
                raise NotInnerOuter(f"axis {j} of {tv.name} is not known to have the extent of "
                                    f"axis {c[1]} of {ref.name}")
        e = tv.definition
        if e is None:
            node = Node("load", tv, key)
            self.io.col_loads.append(node)
        elif id(e) in self.outer_ids:
            want = RG._zero_bcast(tv, [("r", k) for k in self.io.I])
            if key != want:
                raise NotInnerOuter(f"the sum over the rows {tv.name} is read at other columns "
                                    "than its own")
            node = Node("oreduce", tv, key, e, [])
        elif id(e) in self.inner_ids:
            raise NotInnerOuter(f"{tv.name}, a row reduction, is combined with a sum over the rows")
        elif isinstance(e, E.FullOp):
            node = Node("full", tv, key, e, [e.inputs[0]])
        elif isinstance(e, (E.IotaOp, E.ReductionOp, E.WelfordOp, E.IndexSelectOp, E.GatherOp)):
            # (a lookup's "ix" key has no column form here: the segmenter cuts it out)
            raise NotInnerOuter(f"{e.op_name} after a sum over the rows")
        else:
            args = []
            for v in e.inputs:
                if isinstance(v, TensorView):
                    pk = producer_key(e, key, v)
                    if len(pk) != v.ndim:
                        raise NotInnerOuter(f"cannot line up {v.name} with the columns")
                    args.append(self.visit(v, pk))
                else:
                    args.append(v)
            node = Node(RG.node_kind(e), tv, key, e, args)
        self.memo[mk] = node
        self.io.col_nodes.append(node)
        return node


def _build(io, g, ref, outer_ids, inner_ids, tainted) -> None:
    b = _InnerBuilder(g, ref, outer_ids)
    cols = _ColumnBuilder(io, b.uf, outer_ids, inner_ids)
    col_outs = []
    for k, o in enumerate(io.fusion.outputs):
        if id(o) in tainted:
            col_outs.append((k, o))
            continue
        g.outputs.append(b.visit(o, g.output_key(o)))
        io.inner_outputs.append(k)
    for e in io.outer:
        inp = e.inputs[0]
        node = b.visit(inp, RG._zero_bcast(inp, [("r", k) for k in range(g.n)]))
        io.outer_inputs.append(node)
        g.outputs.append(node)
    for k, o in col_outs:
        io.col_outputs.append((k, cols.visit(o, cols.output_key(o))))


def analyze(fusion) -> InnerOuterGraph:
    """The InnerOuterGraph of `fusion`; NotInnerOuter (with the reason) when it is none."""
    reds = RG.reductions(fusion)
    if not reds:
        raise NotInnerOuter("no reduction")
    for e in fusion.used_exprs():
        if not isinstance(e, RG.ALLOWED):
            raise NotInnerOuter(f"{e.op_name} ({type(e).__name__}) between compute ops")
    n = reds[0].inputs[0].ndim
    sets = []
    for e in reds:
        if e.inputs[0].ndim != n:
            raise NotInnerOuter(f"reductions of rank {n} and {e.inputs[0].ndim} inputs")
        ax = tuple(sorted(e.axes))
        if ax not in sets:
            sets.append(ax)
    if len(sets) == 1:
        raise NotInnerOuter("one reduction domain (the reduction schedulers')")
    if len(sets) > 2:
        raise NotInnerOuter(f"reductions over more than two axis sets ({sets})")
    I = next((s for s in sets if n - 1 in s), None)
    if I is None:
        raise NotInnerOuter(f"no reduction over the innermost axis ({sets}): no rows")
    O = next(s for s in sets if s is not I)
    if set(I) | set(O) != set(range(n)) or set(I) & set(O):
        raise NotInnerOuter(f"the reduced axes {list(I)} and {list(O)} do not split the domain "
                            "into rows and columns")
    inner_reds = [e for e in reds if tuple(sorted(e.axes)) == I]
    outer_reds = [e for e in reds if tuple(sorted(e.axes)) == O]
    for e in outer_reds:
        if not isinstance(e, E.ReductionOp) or e.info.name != "sum":
            raise NotInnerOuter(f"{e.op_name} over the rows (only sums are combined with row "
                                "reductions)")
    ref = inner_reds[0].inputs[0]
    g = RG.ReductionGraph(fusion, n, I, O)
    io = InnerOuterGraph(fusion, ref, I, O, g, outer=outer_reds)
    outer_ids = {id(e) for e in outer_reds}
    inner_ids = {id(e) for e in inner_reds}
    tainted = _depends_on(fusion, outer_reds)
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old, 20000))
    try:
        _build(io, g, ref, outer_ids, inner_ids, tainted)
    except RG.NotAReduction as e:
        raise NotInnerOuter(str(e)) from None
    finally:
        sys.setrecursionlimit(old)
    if not g.reduces:
        raise NotInnerOuter("no row reduction feeds an output")
    RG._levels_and_passes(g)
    for e, node in zip(outer_reds, io.outer_inputs):
        if g.level[id(node)] != "full":
            raise NotInnerOuter(f"the input of {e.outputs[0].name}, a sum over the rows, does not "
                                "vary along the columns")
    if not io.col_outputs:
        raise NotInnerOuter("no output of a sum over the rows")
    return io
