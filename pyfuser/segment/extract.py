"""Cutting a sub-Fusion out of a Fusion: the program one kernel (or eager) segment runs.

`extract(fusion, exprs, inputs, outputs, orders)` deep-copies the part of the Fusion's graph
`exprs` (original Exprs, topological order) and their values reach, the Fusion's other exprs
cut off, and prunes it to `exprs`. Values keep their numbers, so a segment prints with
the original names (`T3_g`...). The sub-Fusion's inputs are the segment's tensor inputs (in the
given order) followed by scalar inputs: every non-constant Scalar the segment reads that its own
inputs do not bind (fusion scalar inputs, scalars computed on the host, extents of tensors outside
the segment). Their values come from the original fusion's Bindings at run time.

A tensor that becomes an input of the sub-Fusion (an intermediate of the original) gets
- `stride_order` / `contiguity` from `orders` (its structural layout, see host.py), so a
  scheduler can tell a permuted input from a row-major one without looking at strides;
- expanded broadcast axes turned into iteration axes of the expanded extent (the tensor it is
  given has that size, with stride 0), since a fusion input's broadcast axes have size 1.

`input_values(fusion, ex, inputs, bindings)`: the values a planner gives a sub-Fusion's inputs
(the horizontal and tail schedulers plan their pieces on them).

Invariant: the original Fusion is never modified; the returned `Extracted.inputs` lists, for each
sub-Fusion input, the original Val whose value feeds it.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..ir import exprs as E
from ..ir.base import Scalar
from ..ir.clone import deep_clone
from ..ir.fusion import Fusion
from ..ir.iterdomain import IterType
from ..ir.ops import OPS, REDUCTIONS
from ..ir.tensor import TensorView


@dataclass
class Extracted:
    fusion: Fusion
    inputs: list          # original Vals feeding sub.inputs, same order
    outputs: list         # original TensorViews of sub.outputs, same order


class FusionIndex:
    """What extract needs of the whole Fusion, built once for the many groups the segmenter
    offers, so that each extract costs its group's size (walking the Fusion's exprs and values
    for every group made most of the 3.5 M `id()` calls in a profile of ResNet-18's cold start
    on an H200's host, 2.1 s of its segmenter's 7.1):
    `base`: the memo every copy starts from (the op tables' infos shared, every expr of the
    Fusion cut to None; a group's own exprs are taken out of it), `val_at`: id of each value ->
    (its position in `fusion.vals`, the value). Valid while the Fusion is not changed (extract
    never changes it)."""

    def __init__(self, fusion):
        self.fusion = fusion
        self.base = {id(info): info for info in (*OPS.values(), *REDUCTIONS.values())}
        self.base.update(dict.fromkeys(map(id, fusion.exprs)))
        self.val_at = {id(v): (k, v) for k, v in enumerate(fusion.vals)}


def _clone_graph(fusion, exprs, roots, index: FusionIndex):
    """A copy of the part of the graph `exprs` and the values `roots` reach, with the Fusion's
    other exprs cut off (they copy as None: the definitions and uses extract drops anyway), so
    a group costs its own size, not the Fusion's (the segmenter extracts every group it offers
    to the schedulers: copying the whole Fusion each time was 80% of segmenting a Llama
    training step). Returns the copy, the memo and (original, copy) of the copied values in
    the Fusion's order."""
    new = Fusion()
    memo = dict(index.base)
    memo[id(fusion)] = new
    for e in exprs:
        memo.pop(id(e), None)
    deep_clone((list(roots) + [v for e in exprs for v in list(e.inputs) + list(e.outputs)],
                list(exprs)), memo)
    at = index.val_at
    pairs = [(v, memo[id(v)]) for _, v in sorted((at[i] for i in memo.keys() & at.keys()),
                                                 key=lambda kv: kv[0])]
    new._counters = dict(fusion._counters)
    return new, memo, pairs


def _attr_scalars(e) -> list:
    """Scalars an expr reads through attributes rather than operands."""
    return [s for s in getattr(e, "sizes", []) + getattr(e, "shape", []) +
            list(getattr(e, "new_shape", [])) if isinstance(s, Scalar)]


def extract(fusion, exprs, inputs, outputs, orders=None, index: FusionIndex | None = None
            ) -> Extracted:
    """The sub-Fusion of `exprs` (see the module docstring); `index`: the Fusion's FusionIndex,
    where one extracts many groups of it."""
    orders = orders or {}
    if index is None or index.fusion is not fusion:
        index = FusionIndex(fusion)
    sub, memo, pairs = _clone_graph(fusion, exprs, list(inputs) + list(outputs), index)
    vals = [c for _, c in pairs]
    m = lambda v: memo[id(v)]  # noqa: E731
    sub.exprs = [m(e) for e in exprs]
    keep = {id(e) for e in sub.exprs}
    sub_inputs = [m(v) for v in inputs]
    sub_in_ids = {id(v) for v in sub_inputs}
    for v in vals:
        v.uses = [u for u in v.uses if u is not None and id(u) in keep]
        if v.definition is not None and (id(v.definition) not in keep or id(v) in sub_in_ids):
            v.definition = None
    for orig, v in zip(inputs, sub_inputs):
        if isinstance(v, TensorView) and orig not in fusion.inputs:
            _as_input(v, orders.get(id(orig)))
    bound = {id(d.extent) for v in sub_inputs if isinstance(v, TensorView) for d in v.logical}
    for e in sub.exprs:
        if isinstance(e, E.ViewOp):      # extents the view computes, not the ones it is given
            given = {id(s) for s in e.new_shape if isinstance(s, Scalar)}
            bound.update(id(d.extent) for d in e.output.root if id(d.extent) not in given)
        bound.update(id(o) for o in e.outputs)
    scalar_inputs, orig_of = [], {id(c): o for o, c in pairs}
    for e in sub.exprs:
        refs = [v for v in e.inputs if isinstance(v, Scalar)] + _attr_scalars(e)
        for o in e.outputs:
            if isinstance(o, TensorView):
                for d in o.root:
                    refs += [d.extent] + ([d.expanded_extent] if d.expanded_extent is not None else [])
        for s in refs:
            if not s.is_const and id(s) not in bound and id(s) not in sub_in_ids:
                s.definition = None
                scalar_inputs.append(s)
                bound.add(id(s))
    sub.inputs = [v for v in sub_inputs if isinstance(v, TensorView)] + \
        [v for v in sub_inputs if not isinstance(v, TensorView)] + scalar_inputs
    orig_inputs = [orig_of[id(v)] for v in sub.inputs]
    sub.outputs = [m(v) for v in outputs]
    touched = set(sub_in_ids) | {id(v) for v in sub.outputs}
    for e in sub.exprs:
        touched.update(id(v) for v in e.inputs + e.outputs)
    sub.vals = [v for v in vals if not isinstance(v, TensorView) or id(v) in touched]
    return Extracted(sub, orig_inputs, list(outputs))


def input_values(fusion, ex: Extracted, inputs, bindings) -> list:
    """The values of sub-Fusion `ex`'s inputs when `fusion` runs on `inputs`: the fusion's
    inputs it reads, Scalars' values from the fusion's `bindings`, and, for an intermediate
    tensor of the fusion (one a planner has no value of yet), a meta tensor of its size, laid
    out row-major."""
    import torch
    pos = {id(v): i for i, v in enumerate(fusion.inputs)}
    out = []
    for orig in ex.inputs:
        i = pos.get(id(orig))
        if i is not None:
            out.append(inputs[i])
        elif isinstance(orig, TensorView):
            out.append(torch.empty(bindings.shape(orig), dtype=orig.dtype.torch, device="meta"))
        else:
            out.append(bindings.value(orig))
    return out


def _as_input(tv: TensorView, order) -> None:
    for d in tv.root:
        if d.is_broadcast and d.expanded_extent is not None:
            d.extent, d.expanded_extent, d.iter_type = d.expanded_extent, None, IterType.Iteration
    n = tv.ndim
    tv.sizes_hint = [1 if d.is_broadcast else -1 for d in tv.logical]
    if order is None:
        tv.contiguity, tv.stride_order = [False] * n, None
        return
    tv.contiguity = [None if d.is_broadcast else True for d in tv.logical]
    tv.stride_order = None
    if order != list(range(n)):
        tv.stride_order = [0] * n
        for rank, axis in enumerate(order):
            tv.stride_order[axis] = n - 1 - rank
