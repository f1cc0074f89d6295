"""Fusion IR rewrite after lowering: a view moves past the one-operand elementwise ops that
follow it up to a fusion output, so that the view ends the fusion.

`sink_output_views(fusion, eligible)`: where a `ViewOp` v = view(a) is read only by a cone of
elementwise ops computed from v alone (every tensor operand is v or a value of the cone:
silu(v) = v * sigmoid(v), cast(exp(2 * v))) whose values (v's too) are read only inside the
cone or returned as fusion outputs in `eligible`, the cone is rebuilt on `a` (same ops, same
scalars, `a`'s shape) and each output it returns becomes the view of its new value (v, where
returned, stays the view it is: a training forward returns the normalized value for the
backward besides the SiLU). A view with an extent it alone binds (`view(-1, 2)`) that another
expr reads (`full_like(v)`, `rand_like(v)`) stays: the rebuilt view comes last. Elementwise
ops read each element alone, and a view keeps the row-major order of the elements, so every element
gets the very bits it had.

Why: a normalization lowered on a view of its input (group_norm over `[N, G, C/G, prod(*)]`,
viewed back to `[N, C, *]`) followed by a pointwise op (a diffusion block's SiLU) had the view
between compute ops, which no reduction scheduler takes: two kernels, the second re-reading the
output. With the view last, the segmenter peels it off the kernel (segment/peel.py): one
kernel, the output a host view of what it wrote. `eligible`: outputs the caller wants dense
row-major (a host view of the kernel's row-major result has that layout; an output eager lays
out otherwise stays as it is).

Invariants: only the view and the exprs of the cone are replaced; the output keeps its
TensorView (callers' output indices stay valid); nothing else reads the values removed.
"""
from __future__ import annotations

from ...ir import exprs as E
from ...ir.base import Val
from ...ir.builder import _new_tv
from ...ir.tensor import TensorView


def sink_output_views(fusion, eligible) -> int:
    """Move views past their elementwise cones (module docstring); how many moved."""
    if fusion.aliases:
        return 0
    eligible = {id(t) for t in eligible}
    moved = 0
    for view in [e for e in fusion.used_exprs() if type(e) is E.ViewOp]:
        order = fusion.used_exprs()
        at = next((k for k, e in enumerate(order) if e is view), None)
        if at is None:                           # an earlier rebuild dropped it
            continue
        cone = _cone(view, order, at, eligible, {id(o) for o in fusion.outputs})
        if cone and not _extents_read_elsewhere(fusion, view, cone):
            _rebuild(fusion, view, cone)
            moved += 1
    return moved


def _cone(view, order, at, eligible, outputs) -> list:
    """The elementwise exprs computed from the view's result alone, in order, where every value
    they make (and the view's) is read only inside the cone or returned as an eligible output,
    and at least one of theirs is returned; [] where there are none."""
    v = view.outputs[0]
    inside, cone = {id(v)}, []
    for e in order[at + 1:]:
        tensors = [x for x in e.inputs if isinstance(x, TensorView)]
        if tensors and all(id(x) in inside for x in tensors) and _elementwise(e):
            cone.append(e)
            inside.add(id(e.outputs[0]))
    live, ids = {id(e) for e in order}, {id(e) for e in cone}
    made = [v] + [e.outputs[0] for e in cone]
    returned = [t for t in made if id(t) in outputs]
    if not any(t is e.outputs[0] for e in cone for t in returned) or \
            any(id(t) not in eligible for t in returned):
        return []
    if any(id(u) in live and id(u) not in ids for t in made for u in t.uses):
        return []                                # a value of the cone is read elsewhere
    return cone


def _extents_read_elsewhere(fusion, view, cone) -> bool:
    """Whether an extent that only the view binds (`view(-1, 2)`'s first) is read by an expr
    other than the view and its cone, or by a scalar operand of the cone: a `full_like(v)`,
    `rand_like(v)` makes a tensor of it. The rebuilt view comes after them, too late to bind it
    (shapes.bind follows `fusion.exprs`): the view stays."""
    k = next(i for i, e in enumerate(fusion.exprs) if e is view)
    bound = {id(s) for t in fusion.inputs for s in _extents(t)}
    bound |= {id(s) for e in fusion.exprs[:k] for o in e.outputs for s in _extents(o)}
    own = {id(s) for s in _extents(view.outputs[0]) if not s.is_const and id(s) not in bound}
    ids = {id(e) for e in cone}
    for e in fusion.exprs:
        if e is view:
            continue
        vals = [x for x in e.inputs if not isinstance(x, TensorView)] if id(e) in ids else \
            list(e.inputs) + list(e.outputs)
        if any(id(s) in own for x in vals for s in _extents(x)):
            return True
    return False


def _extents(x) -> list:
    """The Scalars a value's shape is made of (a Scalar: itself)."""
    if not isinstance(x, TensorView):
        return [x] if isinstance(x, Val) else []
    return [s for d in x.root for s in (d.extent, d.expanded_extent) if s is not None]


def _elementwise(e) -> bool:
    """Whether `e` computes each element from the same element of its tensor operands."""
    return isinstance(e, (E.CastOp, E.ElementwiseOp)) and len(e.outputs) == 1


def _rebuild(fusion, view, cone) -> None:
    """Rebuild the cone on the view's input; each value of it the fusion returns becomes the
    view of its new value (the view's own result, where returned, stays as it is)."""
    a, v = view.inputs[0], view.outputs[0]
    outputs = {id(o) for o in fusion.outputs}
    returned = [e.outputs[0] for e in cone if id(e.outputs[0]) in outputs]
    gone = cone if id(v) in outputs else [view] + cone
    for e in gone:                               # detach what is rebuilt
        for x in e.inputs:
            if isinstance(x, Val):
                x.uses = [u for u in x.uses if u is not e]
        fusion.exprs.remove(e)
    dropped = {id(e.outputs[0]) for e in gone} - {id(t) for t in returned}
    fusion.vals = [x for x in fusion.vals if id(x) not in dropped]
    new = {id(v): a}
    with fusion:
        for e in cone:
            out = _new_tv(a.logical, e.outputs[0].dtype)          # a's shape
            ins = [new.get(id(x), x) for x in e.inputs]
            if isinstance(e, E.CastOp):
                E.CastOp(out, ins[0], e.dtype)
            else:
                type(e)(e.info, out, ins)
            new[id(e.outputs[0])] = out
        for t in returned:
            t.definition = None
            E.ViewOp(t, new[id(t)], view.new_shape)
