"""The pointwise scheduler's checks for resize ops (slice, pad, cat) and iotas: where vectors may go.

A pad, cat or iota computes with the element's own index, and a slice's, pad's or cat's operand
is read at a shifted index (pointwise_graph's "sh" key entries) guarded by the operand's bounds.
The codegen makes a pad's or cat's choice and a shifted load's bounds test once per vector, with
the index of its first lane, so a vector is allowed only where all its lanes fall on one side of
every such bound. Two questions for `pointwise.schedule`:
- `bounded_axes(graph)`: the reference axes such a bound lies along; `_collapse` keeps each of
  them a group of its own, so that the innermost one can be checked alone;
- `index_vec_ok(graph, accesses, groups, vec, size_of)`: whether vectors of `vec` elements
  along the innermost reference axis keep every lane on one side of each bound (every shift and
  bounding size along it a multiple of `vec`); the scheduler halves `vec` until it does.

Invariants:
- Both are pure functions of the scheduler's graph, accesses and groups: nothing is modified.
- A size counts only through `size_of`, which gives it only when the layout signature holds its
  facts (a constant, an input's or a view's extent), so the answer is the same for every input
  of one signature and a kernel compiled for one is right for all.
- With no pad, cat, iota or shifted load, `index_vec_ok` is True: other fusions keep the vector
  width the strides and alignment allow.
- A stepped slice's or pad's operand is read at a key with an "st" / "dv" entry, a "general"
  access (pointwise_access: one element a vector, so vector_width is 1); a stepped pad's own
  choice (every step-th index) never keeps vectors along its axis.
- Nothing here imports from codegen/ (schedule/ decides, codegen/ follows).
"""
from __future__ import annotations

from .pointwise_graph import INDEX_KINDS, Minus, Plus, is_padded, key_axes, shift_levels


def bounded_axes(graph) -> set:
    """Reference axes along which a pad, cat or iota computes with the index or a load is read
    at a shifted index: each stays a group of its own (_collapse), so that vectors along the
    innermost of them can be checked against its bounds alone (index_vec_ok)."""
    out = set()
    for n in graph.nodes:
        if n.kind == "pad":
            bounded = [c for c, pair, st in zip(n.key, n.expr.pads, n.expr.steps)
                       if is_padded(pair, st)]
        elif n.kind == "cat":
            bounded = [n.key[n.expr.dim]]
        elif n.kind == "iota":
            bounded = [n.key[0]]
        else:
            bounded = [c for c in n.key if isinstance(c, tuple) and c[0] == "sh"]
        for c in bounded:
            out |= key_axes(c)
    return out


def index_vec_ok(graph, accesses, groups, vec: int, size_of) -> bool:
    """Whether vectors of `vec` elements along the innermost reference axis k keep every lane
    of a vector on one side of each bound a pad, cat or shifted load draws along k: k is a group
    of its own, and every shift along k and every size bounding an operand along k (a pad's
    leading size and its input's size, a cat's operand sizes, a clamped operand's size) is a
    multiple of vec, each size a signature fact (`size_of(IterDomain)`: its value when it is a
    constant or an input's or a view's extent, whose divisibility by 16 the layout signature
    holds; else None). Then a pad's or cat's choice and a load's bounds test, made with the
    vector's first index, hold for every lane, and shifted vector loads are aligned as the
    unshifted ones are. An iota along k adds the lane to its index (codegen)."""
    if not any(n.kind in INDEX_KINDS for n in graph.nodes) and \
            not any(a.shifts for a in accesses):
        return True
    if not groups or len(groups[-1]) != 1:
        return False
    k = groups[-1][0]

    def multiple(d) -> bool:
        v = size_of(d)
        return v is not None and v % vec == 0

    def shift_ok(off, minus) -> bool:      # a Plus / Minus term (symbolic): not provable
        return off % vec == 0 and all(not isinstance(d, (Plus, Minus)) and multiple(d)
                                      for d in minus)

    def on_k(c) -> bool:
        lv = shift_levels(c) if c != 0 else None
        return lv is not None and lv[0] == k

    def levels_ok(c) -> bool:         # every level of a key entry along k: shift and bound
        return all(shift_ok(off, minus) and (hi is None or multiple(hi))
                   for off, minus, hi in shift_levels(c)[1])

    for a in accesses:
        for c in a.node.key if a.shifts else ():
            if on_k(c) and not levels_ok(c):
                return False
    for n in graph.nodes:
        if n.kind in INDEX_KINDS and any(k in key_axes(c) and not (on_k(c) and levels_ok(c))
                                          for c in n.key):
            return False                  # a bound along k read through a view: not provable
        if n.kind == "pad":
            for j, ((lo, hi), d, st) in enumerate(zip(n.expr.pads, n.expr.inputs[0].logical,
                                                       n.expr.steps)):
                if is_padded((lo, hi), st) and on_k(n.key[j]) and (
                        st != 1 or not isinstance(lo, int) or lo % vec or not multiple(d)):
                    return False      # a symbolic leading size, or a step: not provable
        elif n.kind == "cat":
            if on_k(n.key[n.expr.dim]) and not all(
                    multiple(a.tv.logical[n.expr.dim]) for a in n.args):
                return False
        elif n.kind == "iota":
            if on_k(n.key[0]) and n.key[0] != ("r", k):
                return False
    return True
