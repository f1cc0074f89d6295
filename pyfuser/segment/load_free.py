"""Load-free values: computed in every kernel that reads them instead of passed through memory.

A value is *load-free* when computing it loads nothing: an iota or a full, and any cast, copy,
broadcast, expand, squeeze or elementwise op of a few instructions (recompute.py's `MOVES` and
`CHEAP`) whose tensor operands are all load-free. Positions (`arange(past, past + seq)`), the
causal mask's comparisons of them, a cross-entropy's class index: a kernel reading one computes it
with a few integer instructions per element, where a kernel writing it for others costs a launch
and the others a load.

`load_free(exprs)`: the ids of such exprs among `exprs` (topological order; what they read from
outside `exprs` is a load).

`forward_load_free(fusion, groups, verdict, offer)` (a step of segmenter._partition, after the
groups are joined): every kernel group that reads a load-free value another group computes gets
a copy of the value's whole producer chain (`groups.extra`, the copies recompute.py makes: they
read only other copies, never memory), when its scheduler still takes it. Then every group drops
the exprs nothing reads from memory any more (`recompute.prune`): a kernel that only computed
positions for others disappears, and so does a group of broadcasts of them that no scheduler took
(host views between kernels), which had tied the kernels reading them into one dependency chain.
HF's Llama forward computes its positions once (an iota kernel), views them (host broadcasts) and
reads them in the packed-sequence mask, the causal mask and the rotary cos / sin: three kernels
that each compute the positions themselves are independent, so the horizontal packing after this
step makes them one launch (merges.py merge_horizontal). A change is kept only when every group
it touches is still taken by its scheduler (or, for a group of views, left to the host).

Invariant: as in recompute.py, every expr stays in one group (`groups.of`), a copy computes the
same value as the expr it copies and reads only fusion inputs and other copies (here: no input at
all), and only the group owning an expr writes its outputs.
"""
from __future__ import annotations

from .. import dump as D
from ..ir.tensor import TensorView
from .host import HOST_RUNNERS
from .recompute import MAX_CHAIN, prune, recomputable


def load_free(exprs) -> set:
    """ids of the exprs of `exprs` (topological order) that compute load-free values."""
    free, made = set(), set()
    for e in exprs:
        if recomputable(e) and all(id(v) in made for v in e.inputs if isinstance(v, TensorView)):
            free.add(id(e))
            made.update(id(o) for o in e.outputs)
    return free


def chain_of(groups, g, free) -> list:
    """The load-free exprs outside group g (members and copies) whose values g's exprs read,
    with everything they are computed from, in program order; [] past MAX_CHAIN of them."""
    own = groups.member_ids(g) | groups.extra_ids(g)
    found, stack = {}, [v for e in groups.exprs_of(g) for v in e.inputs]
    while stack:
        v = stack.pop()
        d = getattr(v, "definition", None) if isinstance(v, TensorView) else None
        if d is None or id(d) not in free or id(d) in own or id(d) in found:
            continue
        found[id(d)] = d
        if len(found) > MAX_CHAIN:
            return []
        stack.extend(d.inputs)
    return groups.sorted_exprs(list(found.values()))


def forward_load_free(fusion, groups, verdict: dict, offer) -> int:
    """Apply the pass of the module docstring; returns how many groups took copies.
    `offer(exprs, copies)`: the segmenter's (scheduler, Extracted) or (None, reason)."""
    free = load_free(groups.sorted_exprs([e for m in groups.members.values() for e in m]))
    if not free:
        return 0
    done = 0
    first = lambda g: groups.order[id(groups.members[g][0])]  # noqa: E731
    for b in sorted(groups.members, key=first):
        if b not in groups.members or verdict[b][0] is None:
            continue
        chain = chain_of(groups, b, free)
        if chain and _try(fusion, groups, verdict, offer, b, chain):
            done += 1
    return done


def _try(fusion, groups, verdict, offer, b, chain) -> bool:
    saved = ({g: list(x) for g, x in groups.extra.items()},
             {g: list(m) for g, m in groups.members.items()}, dict(groups.of), dict(verdict))
    before = {g: (groups.member_ids(g), groups.extra_ids(g)) for g in groups.members}
    groups.extra[b] = groups.extra.get(b, []) + chain
    if offer(groups.exprs_of(b), groups.extra_ids(b))[0] is None:
        _restore(groups, verdict, saved)
        return False
    changed = True
    while changed:                        # a group dropping an expr may free its producers'
        changed = False
        for g in list(groups.members):
            n = len(groups.members[g])
            prune(fusion, groups, g, b)
            changed |= len(groups.members[g]) != n
    results = {}
    for g, (members, extra) in before.items():
        if not groups.members[g] or (groups.member_ids(g), groups.extra_ids(g)) == (members, extra):
            continue
        res = offer(groups.exprs_of(g), groups.extra_ids(g))
        if res[0] is None and (saved[3][g][0] is not None or
                               not all(type(e) in HOST_RUNNERS for e in groups.members[g])):
            _restore(groups, verdict, saved)  # a kernel refused, or an eager group changed
            return False
        results[g] = res if res[0] is not None else (None, saved[3][g][1])
    for g in [g for g, m in groups.members.items() if not m]:
        groups.members.pop(g)
        groups.extra.pop(g, None)
        verdict.pop(g, None)
        results.pop(g, None)
    verdict.update(results)
    D.dump("segmenter_logging", "load-free values",
           lambda: f"{', '.join(e.op_name for e in chain)} (load-free) computed in the group of "
                   f"{groups.members[b][0].op_name} instead of read from memory")
    return True


def _restore(groups, verdict, saved) -> None:
    for store, old in ((groups.extra, saved[0]), (groups.members, saved[1]), (groups.of, saved[2]),
                       (verdict, saved[3])):
        store.clear()
        store.update(old)
