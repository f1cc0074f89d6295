"""The segmenter's merges after its first pass (segmenter._partition): kernel groups joined
when one scheduler takes their union, so that a shared tensor is read once and a launch saved.

- `merge_siblings`: kernel groups that read a common tensor and neither needs the other (a
  layer norm's dweight and dbias), heaviest shared tensor first; then pure reductions of one
  domain that neither needs the other;
- `merge_horizontal`: pointwise groups that neither needs the other, into horizontal kernels;
- `merge_again`: two kernel groups, one reading what the other writes, that the first pass kept
  apart, now that copies of values (load_free.py, recompute.py) have removed a cycle.

Each offers a union through `offer(exprs, copies)` (segmenter._offer for the Fusion being cut:
the union's copy and the registry's verdict) and joins the groups with `join` when a scheduler
takes it; `nbytes(tensor)` is the segmenter's estimate of a tensor's bytes (edge weights).

Invariant: a join never makes a cycle (every pass checks `groups.reaches` both ways first), and
`verdict[g]` is the (scheduler, Extracted) of group g's current exprs.
"""
from __future__ import annotations

from ..ir.tensor import TensorView


def join(groups, verdict: dict, a, b, result) -> None:
    """Group b joins group a, which the scheduler of `result` (scheduler, Extracted) runs."""
    groups.merge(a, b)
    verdict[a] = result
    verdict.pop(b, None)              # (a single joining before its own verdict was needed)


def merge_siblings(groups, verdict: dict, offer, nbytes) -> None:
    """Join kernel groups that read a common tensor and neither needs the other (a layer
    norm's dweight and dbias: two sums over the same rows of dy), when one scheduler takes
    the union: the shared tensor is read once, one launch fewer. Heaviest shared tensor first.
    Then pure reductions that neither needs the other join when the reduction scheduler takes
    them together (the same axes of one shape: ViT's last layer norm's dweight and dbias, sums
    of two tensors a pointwise kernel wrote), one launch fewer."""
    from ..schedule.reduction import pure_by_picks
    readers: dict = {}
    for g, members in groups.members.items():
        if verdict[g][0] is None:
            continue
        for e in members:
            for v in e.inputs:
                if isinstance(v, TensorView) and groups.of.get(id(v.definition)) != g:
                    readers.setdefault(id(v), (v, set()))[1].add(g)
    pairs = []
    for v, gs in readers.values():
        gs = sorted(gs)
        pairs += [(-nbytes(v), a, b) for i, a in enumerate(gs) for b in gs[i + 1:]]
    for _, a, b in sorted(pairs, key=lambda t: (t[0], t[1], t[2])):
        if a not in groups.members or b not in groups.members:
            continue
        if groups.reaches(a, b, False) or groups.reaches(b, a, False):
            continue
        exprs, copies = groups.union([a, b])
        result = offer(exprs, copies)
        if result[0] is not None:
            join(groups, verdict, a, b, result)
    reds = sorted((g for g in groups.members if verdict[g][0] == "reduction"),
                  key=groups.position)
    for i, a in enumerate(reds):
        for b in reds[i + 1:]:
            if a not in groups.members or b not in groups.members or \
                    groups.reaches(a, b, False) or groups.reaches(b, a, False):
                continue
            exprs, copies = groups.union([a, b])
            result = offer(exprs, copies)
            # (not a union that is a pure reduction only through picks: laid out by columns
            # it would run as one two-pass normalization where it was two reductions)
            if result[0] == "reduction" and not pure_by_picks(result[1].fusion):
                join(groups, verdict, a, b, result)


def merge_horizontal(groups, verdict: dict, offer) -> None:
    """Join pointwise kernel groups that neither needs the other into horizontal kernels
    (schedule/horizontal.py: a bf16 autocast's casts of the weights beside a reduction; Llama's
    rotary embedding of q and of k, which read the same cos and sin). In order of their first
    expr, each group not yet joined (a pointwise or horizontal kernel) starts a set; each later
    group joins it while the set stays within one kernel's capacity (components, parameter
    bytes) and neither reaches the other (groups reading a common tensor are still separate
    components: each reads it, as two kernels would; a load-free value both compute, their
    copies of the positions, is computed in each); the set is then offered to the registry
    (verdicts logged under segmenter_logging) and becomes one group when accepted."""
    from ..schedule import horizontal as H
    cands = [g for g in sorted(groups.members, key=groups.position)
             if verdict[g][0] in ("pointwise", "horizontal") and
             H.excluded(groups.exprs_of(g)) is None]

    def cost(g):
        sub = verdict[g][1].fusion
        return H.param_bytes_bound(sub.tensor_inputs(), sub.outputs,
                                   H.scalars_read(groups.exprs_of(g)))

    while len(cands) > 1:
        chosen = [cands.pop(0)]
        used = cost(chosen[0])
        for h in list(cands):
            if len(chosen) == H.MAX_COMPONENTS:
                break
            c = cost(h)
            if used + c > H.MAX_PARAM_BYTES or any(
                    groups.reaches(g, h, False) or groups.reaches(h, g, False) for g in chosen):
                continue
            chosen.append(h)
            used += c
            cands.remove(h)
        if len(chosen) < 2:
            continue
        exprs, copies = groups.union(chosen)
        result = offer(exprs, copies)
        if result[0] in ("horizontal", "pointwise"):
            for h in chosen[1:]:
                join(groups, verdict, chosen[0], h, result)


def merge_again(groups, verdict: dict, offer, nbytes, refused: dict) -> None:
    """Join two kernel groups, one reading what the other writes, that the first pass kept
    apart, now that copies of values have changed what they read: a cycle through a third
    group that has since computed the value itself is gone (a cross-entropy's count of the
    targets that are not ignored, whose `ne` the row kernel recomputes, joins the final sum
    over the rows: two reductions of the same axes, one kernel). Unions no scheduler took
    before (`refused`: ids of their exprs) are not offered again. Heaviest tensor first."""
    edges = []
    for h in groups.members:
        if verdict[h][0] is None:
            continue
        ins, _ = groups.boundary(groups.exprs_of(h), groups.extra_ids(h))
        for v in ins:
            g = groups.of.get(id(getattr(v, "definition", None)))
            if g is not None and g != h and verdict[g][0] is not None:
                edges.append((-nbytes(v), g, h))
    for _, a, b in sorted(edges, key=lambda t: t[0]):
        if a not in groups.members or b not in groups.members or a == b:
            continue
        if groups.reaches(a, b, True) or groups.reaches(b, a, True):
            continue
        exprs, copies = groups.union([a, b])
        if frozenset(id(e) for e in exprs) in refused:
            continue
        result = offer(exprs, copies)
        if result[0] is None:
            refused[frozenset(id(e) for e in exprs)] = result[1]
            continue
        join(groups, verdict, a, b, result)
