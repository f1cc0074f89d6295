"""The pointwise scheduler: which Fusions it takes, and how it maps them onto a CUDA grid.

`can_schedule(fusion)` accepts fusions of elementwise / cast / set / broadcast / expand / squeeze /
view / permute / full / iota exprs, random numbers drawn in the kernel (PhiloxUniformOp; no
reductions) and slice / pad / cat (each element read at a shifted index, the operands of pads
and cats only where the index falls inside them), with at least
one output, no complex dtypes, every output computed (not an input or a pure view of one) and
all outputs of one shape. A random op is indexed as a dense row-major
tensor of its shape would be (an access without memory), so it collapses and vectorizes with the
others.

`schedule(fusion, inputs)` works on a deep copy of the fusion (the user's Fusion is never
touched) and returns a `PointwiseSchedule`:
1. the reference output R (output 0) is laid out like eager lays it out (stride order from meta
   evaluation); its size-1 axes are dropped (index 0);
2. every global access (loads of inputs, stores of outputs) gets per-R-axis effective strides;
   neighbouring R axes are *collapsed* into one when every affine access is contiguous across
   them (or broadcast in both), so a contiguous tensor is one linear axis whatever its rank; a
   load at a shifted index (a slice's, pad's or cat's operand: "shiftable") counts as affine
   with a constant added, and the axes a pad, cat, iota or shift bounds are not collapsed;
3. the vector width is the widest (<= 16 bytes for the largest element type) that divides the
   inner collapsed extent, every vectorized tensor's other strides and its pointer alignment,
   and, with pads, cats, iotas or shifts, every shift and bounding size along the innermost
   axis (`pointwise_resize`: each vector then lies on one side of every bound);
4. heuristics pick 1-D [BIDx, Unroll, TIDx, V] or 2-D [BIDy, BIDx, Unroll, TIDx, V] and the
   transforms are applied to R's TensorDomain so the IR printer's TransformPrinter shows them.

Steps 2-3 (the accesses, collapsing, the vector width) live in pointwise_access.py, shared with
the reduction and inner-outer schedulers.

Invariant: the decisions in 2-3 read only facts that `layout.signature` puts in the signature.
"""
from __future__ import annotations

from dataclasses import dataclass


from .. import dump as D
from ..errors import SchedulerError
from ..ir import exprs as E
from ..ir.base import Scalar
from ..ir.clone import deep_clone
from ..ir.iterdomain import ParallelType
from ..ir.ops import OPS
from ..ir.shapes import bind
from ..ir.tensor import TensorView
from . import layout as L
from .pointwise_access import collapse, collect_accesses, vector_width
from .pointwise_gather import gather_ok, gather_unsupported
from .pointwise_graph import ALLOWED_EXPRS, GATHER_EXPRS, INDEX_KINDS, Graph, is_alias_of_input
from .pointwise_heuristics import PointwiseParams, choose
from .pointwise_resize import bounded_axes, index_vec_ok


# ---- can_schedule -----------------------------------------------------------------------------
def can_schedule(fusion) -> tuple[bool, str]:
    if not fusion.outputs:
        return False, "the fusion has no outputs"
    for e in fusion.used_exprs():
        if not isinstance(e, ALLOWED_EXPRS):
            return False, f"{e.op_name} ({type(e).__name__}) is not a pointwise expr"
        for v in list(e.inputs) + list(e.outputs):
            dt = getattr(v, "dtype", None)
            if dt is not None and dt.is_complex:
                return False, f"complex dtype {dt.name} of {v.name} is not supported"
        if isinstance(e, GATHER_EXPRS):
            why = gather_unsupported(e)
            if why:
                return False, why
    for v in fusion.inputs:
        if v.dtype.is_complex:
            return False, f"complex input {v.name} is not supported"
    for o in fusion.outputs:
        if is_alias_of_input(o):
            return False, f"output {o.name} is an input or a view of one (no compute)"
    ref = fusion.outputs[0]
    uf = _extent_classes(fusion)
    for o in fusion.outputs[1:]:
        if o.ndim != ref.ndim or not all(_same_extent(uf, a, b) for a, b in zip(o.logical, ref.logical)):
            return False, f"outputs {ref.name} and {o.name} may differ in shape"
    return True, ""


def _extent_classes(fusion, cats: bool = False) -> dict:
    """Classes of extent Scalars known equal: the axes an elementwise op makes meet (eager
    checked them); `cats`: also a cat's operands and output on every axis but the cat's
    (the bindings check them equal, shapes._bind_cat)."""
    parent: dict = {}

    def find(s):
        while parent.get(id(s), s) is not s:
            s = parent[id(s)]
        return s

    for e in fusion.exprs:
        if isinstance(e, E.ElementwiseOp) or (cats and isinstance(e, E.CatOp)):
            axes = [t.logical for t in e.inputs if isinstance(t, TensorView)] + \
                   [o.logical for o in e.outputs if isinstance(o, TensorView)]
            for ax in range(len(axes[0]) if axes else 0):
                if isinstance(e, E.CatOp) and ax == e.dim:
                    continue
                # an expanded axis meets the others at its expanded size (eager checked it)
                real = [t[ax].full_extent for t in axes if not t[ax].is_size_one_broadcast]
                for s in real[1:]:
                    a, b = find(real[0]), find(s)
                    if a is not b:
                        parent[id(b)] = a
    return {"find": find}


def _add_cat_extents(fusion, uf, known_classes: set) -> None:
    """A cat's extent along its dim is the sum of its operands': where each of those is a
    signature fact (or a constant), their common divisors divide the sum, so the cat's extent
    class joins `known_classes` (in program order, so that a cat of cats counts too). The
    vector width is still checked per operand (pointwise_resize.index_vec_ok)."""
    def known(s):
        return s.is_const or id(uf["find"](s)) in known_classes
    for e in fusion.exprs:
        if isinstance(e, E.CatOp) and all(known(t.logical[e.dim].full_extent) for t in e.inputs):
            known_classes.add(id(uf["find"](e.outputs[0].logical[e.dim].full_extent)))


def _same_extent(uf, a, b) -> bool:
    if a.is_size_one_broadcast and b.is_size_one_broadcast:
        return True
    ea = a.full_extent
    eb = b.full_extent
    if ea.is_const and eb.is_const:
        return ea.value == eb.value
    return uf["find"](ea) is uf["find"](eb)


# ---- the schedule -----------------------------------------------------------------------------
@dataclass
class PointwiseSchedule:
    fusion: object              # the scheduled deep copy
    orig: object                # the user's fusion
    orig_of: dict               # id(clone Scalar) -> user's Scalar
    ref: TensorView             # clone's reference output
    params: PointwiseParams
    graph: Graph
    accesses: list
    out_orders: list            # per output: axes outermost first (eager layout)
    shape: list                 # reference shape seen at planning


def _clone(fusion):
    memo = {id(info): info for info in OPS.values()}
    clone = deep_clone(fusion, memo)
    orig_of = {}
    for v in fusion.vals:
        c = memo.get(id(v))
        if isinstance(v, Scalar) and c is not None:
            orig_of[id(c)] = v
    return clone, orig_of


def _known_extent_ids(fusion) -> set:
    """Extents whose facts (size 1, powers of two) the signature holds: the inputs' and the
    views' bound at run time (layout.symbolic_view_extents)."""
    out = {id(s) for s in L.symbolic_view_extents(fusion)}
    for t in fusion.tensor_inputs():
        for d in t.logical:
            out.add(id(d.extent))
    return out


def schedule(fusion, inputs, kind: str | None = None) -> PointwiseSchedule:
    """`kind`: "1d" / "2d" forces the kernel shape (speed only; the horizontal scheduler
    wants 1-D), else the heuristics (and $PYFUSER_PW_KIND) choose."""
    ok, why = can_schedule(fusion)
    if not ok:
        raise SchedulerError(f"pointwise scheduler: {why}")
    inputs = list(inputs)
    bindings = bind(fusion, inputs)
    orders = L.eager_output_orders(fusion, inputs, bindings)
    clone, orig_of = _clone(fusion)
    ref = clone.outputs[0]
    shape = bindings.shape(fusion.outputs[0])
    known = _known_extent_ids(fusion)

    def proven(k):  # the extent of R axis k is a fact of the signature (constant, input, view)
        d = fusion.outputs[0].logical[k]
        s = d.full_extent
        return s.is_const or id(s) in known

    dropped = [k for k in range(len(shape)) if shape[k] == 1 and proven(k)]
    order = [k for k in orders[0] if k not in dropped]
    ref_key = tuple(0 if k in dropped else ("r", k) for k in range(len(shape)))
    graph = Graph(clone, ref_key)

    def view_extent(s):  # (value, is it a signature fact) of an extent Scalar of the clone
        if s.is_const:
            return int(s.value), True
        orig = orig_of.get(id(s))
        return (int(bindings.value(orig)) if orig is not None else None), \
            orig is not None and id(orig) in known

    accesses = collect_accesses(clone, fusion, graph, inputs, bindings, orders, view_extent, orig_of)
    params = PointwiseParams(dropped=dropped)
    params.groups = collapse(order, shape, accesses, bounded_axes(graph))
    ext = [L.numel(shape[k] for k in g) for g in params.groups]
    resized = any(n.kind in INDEX_KINDS for n in graph.nodes) or any(a.shifts for a in accesses)
    if resized:
        # a cat's size (the sum of its operands') is no signature fact, but an elementwise op
        # joining it with an input's axis makes the two equal (eager checks it): that input's
        # facts are the cat's
        uf = _extent_classes(fusion)
        known_classes = {id(uf["find"](d.extent)) for t in fusion.tensor_inputs() for d in t.logical}
        _add_cat_extents(fusion, uf, known_classes)

        def proven_inner(k):
            s = fusion.outputs[0].logical[k].full_extent
            return proven(k) or id(uf["find"](s)) in known_classes
    else:
        proven_inner = proven
    params.vec = vector_width(params.groups, ext, accesses, all(
        proven_inner(k) for k in (params.groups[-1] if params.groups else [])))

    def size_of(d):  # an IterDomain's size where the signature holds its facts, else None
        n = d.known_size()
        if n is not None:
            return n
        orig = orig_of.get(id(d.full_extent))
        return int(bindings.value(orig)) if orig is not None and id(orig) in known else None
    # pads, cats, iotas and shifted loads keep vectors only where every vector lies on one side
    # of each of their bounds along the innermost axis (index_vec_ok); else one element a step
    while params.vec > 1 and not index_vec_ok(graph, accesses, params.groups, params.vec,
                                              size_of):
        params.vec //= 2
    out_numel = L.numel(shape)
    params.index_type = "int64_t" if L.needs_int64(inputs, out_numel) else "int"
    _classify(params, accesses)
    vec_bytes = params.vec * max((a.itemsize for a in accesses if a.mode == "vector"), default=0) \
        if params.vec > 1 else 0
    choose(params, ext, 0, vec_bytes, kind)
    _classify(params, accesses)
    if params.kind == "2d":
        n = sum(a.row_invariant for a in accesses if not a.is_store)
        params.reason += f"; {n} row-invariant load(s) hoisted"
    _apply_transforms(ref, params, dropped)
    sched = PointwiseSchedule(clone, fusion, orig_of, ref, params, graph, accesses, orders, shape)
    D.dump("scheduler_params", "pointwise", lambda: _describe(sched))
    D.dump("fusion_ir_scheduled", "pointwise", lambda: _print(clone))
    return sched


def _print(fusion) -> str:
    try:
        from ..ir.printer import print_fusion
        return print_fusion(fusion)
    except ImportError:
        return "\n".join(f"{o}: {[str(t) for t in o.domain.transforms]}" for o in fusion.outputs)


def _describe(s: PointwiseSchedule) -> str:
    p = s.params
    lines = [f"kind={p.kind} vec={p.vec} block={p.block} unroll={p.unroll} index={p.index_type} "
             f"max_blocks={p.max_blocks} load_cache={p.load_cache or 'plain'} store_cache={p.store_cache or 'plain'}",
             f"groups={p.groups} dropped={p.dropped} ({p.reason})"]
    for a in s.accesses:
        what = "store" if a.is_store else ("rng  " if a.rng is not None else "load ")
        lines.append(f"  {what} {a.tv.name}: mode={a.mode}"
                     f"{' row-invariant' if a.row_invariant else ''}"
                     f"{' (through a view, linear)' if a.linear else ''}")
    return "\n".join(lines)


def _classify(params: PointwiseParams, accesses) -> None:
    groups = params.groups
    inner_k = groups[-1][-1] if groups else None
    outer_ks = [g[-1] for g in groups[:-1]]
    for a in accesses:
        if not (a.affine or a.shiftable or a.gathered) or \
                (a.gathered and (inner_k is None or not gather_ok(a, inner_k))):
            a.mode = "general"
            continue
        s = a.eff.get(inner_k, (0,))[0] if inner_k is not None else 0
        a.mode = "bcast" if s == 0 else ("vector" if s == 1 else "strided")
        # (not a shifted load: its bounds test reads the row's own indices)
        a.row_invariant = (not a.is_store and params.kind == "2d" and a.affine
                           and all(a.eff.get(k, (0,))[0] == 0 for k in outer_ks))


def _apply_transforms(ref: TensorView, p: PointwiseParams, dropped) -> None:
    """Replays the schedule on R's TensorDomain (for the TransformPrinter and the dumps)."""
    flat = list(dropped) + [k for g in p.groups for k in g]
    ref.reorder({old: new for new, old in enumerate(flat)})
    pos = len(dropped)
    for g in p.groups:                       # collapse merges
        for _ in range(len(g) - 1):
            ref.merge(pos)
        pos += 1
    base, ng = len(dropped), len(p.groups)
    if ng == 0:
        return
    if p.kind == "2d":
        for _ in range(ng - 2):
            ref.merge(base)                  # outer groups -> one row axis
        inner = base + 1
        if p.vec > 1:
            ref.split(inner, p.vec)
        ref.split(inner, p.block)
        if p.unroll > 1:
            ref.split(base, p.unroll)
            ref.reorder({base + 1: base + 2, base + 2: base + 1})
            ref.axis(base + 2).parallelize(ParallelType.Unroll)
        ref.axis(base).parallelize(ParallelType.BIDy)
        ref.axis(base + 1).parallelize(ParallelType.BIDx)
        t = base + 2 + (p.unroll > 1)
    else:
        for _ in range(ng - 1):
            ref.merge(base)
        if p.vec > 1:
            ref.split(base, p.vec)
        ref.split(base, p.block)
        if p.unroll > 1:
            ref.split(base, p.unroll)
            ref.axis(base + 1).parallelize(ParallelType.Unroll)
        ref.axis(base).parallelize(ParallelType.BIDx)
        t = base + 1 + (p.unroll > 1)
    ref.axis(t).parallelize(ParallelType.TIDx)
    if p.vec > 1:
        ref.axis(t + 1).parallelize(ParallelType.Vectorize)
