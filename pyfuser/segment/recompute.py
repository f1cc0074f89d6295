"""Recomputing a cut tensor in the segments that read it, instead of passing it through memory.

When the segmenter has cut a fusion (segmenter._partition), a tensor T that a kernel group A
writes and other kernel groups B read may be cheap to compute again from what A itself reads: a
layer norm backward cut into dx and dweight / dbias passes `x_hat = (x - mean) * rstd` and
`dy * w` from one kernel to the other, two float32 tensors of the input's size, where the reader
could load x and dy (bfloat16 under autocast) and recompute them. This pass copies such a
producer chain into each reader:

- the chain is every expr of A (its own or its copies) that T derives from, back to tensors A
  reads from outside (its leaves); each is a cast, a copy, a broadcast, an expand, a squeeze,
  an iota or full (which load nothing) or an elementwise op of a few instructions (`CHEAP`: no
  transcendental, reduction, view or random op); at most `MAX_CHAIN` exprs;
- every leaf is a fusion input or a host view of one: a copy never reads another kernel's
  output, so no later decision can stop a kernel from writing what a copy reads, and no copy
  makes a cycle;
- every group reading T is a kernel group, and each one, with the chain added, is still taken
  by a scheduler (the registry);
- the bytes moved fall: before, each reader loads T, and A stores it unless the fusion returns
  it; after, each reader loads the leaves it did not load already (A still stores T when the
  fusion returns it).

A then drops T from its outputs and any expr of A nothing needs any more (such an expr moves to
the first reader, which computes it anyway); A must still schedule, or T stays as it was. Tensors
are tried heaviest first. Decisions are logged under `segmenter_logging`.

Invariant: every expr stays in at least one group; an expr in several (`groups.extra[g]` holds a
group's copies) computes the same value in each, and only the group it belongs to
(`groups.of`) writes its output; a copy's outputs are never a group's outputs.
"""
from __future__ import annotations

from .. import dump as D
from ..ir import exprs as E
from ..ir.tensor import TensorView

MAX_CHAIN = 32
# data movement and factories that load nothing (iota, full); never random numbers (a copy
# would draw other numbers)
MOVES = (E.CastOp, E.SetOp, E.BroadcastOp, E.ExpandOp, E.SqueezeOp, E.IotaOp, E.FullOp)
# elementwise ops of a few instructions; transcendental ones (exp, log, sin, tanh, erf, pow...)
# are not recomputed: one more of those per element can make a memory-bound kernel
# compute-bound (a rotary embedding's cos, recomputed per element of q instead of loaded)
CHEAP = frozenset("""neg abs bitwise_not logical_not relu sign ceil floor round trunc isnan
    isinf isfinite add sub mul div maximum minimum eq ne lt le gt ge logical_and logical_or
    logical_xor bitwise_and bitwise_or bitwise_xor leaky_relu clamp_min clamp_max where clamp
    lerp addcmul threshold hardtanh hardsigmoid hardswish""".split())


def recomputable(e) -> bool:
    return isinstance(e, MOVES) or (isinstance(e, E.ElementwiseOp) and e.info.name in CHEAP)


def recompute_producers(fusion, groups, verdict, orders, offer, nbytes) -> int:
    """Apply the pass of the module docstring to the partition (`offer(exprs)`: the segmenter's
    (scheduler, Extracted) or (None, reason); `nbytes(tensor)`: its size estimate); returns how
    many tensors are recomputed instead of passed."""
    done = 0
    for t, a in _cut_tensors(groups, verdict, nbytes):
        if a in groups.members and verdict.get(a, (None,))[0] is not None and \
                _try(fusion, groups, verdict, t, a, offer, nbytes):
            done += 1
    return done


def _cut_tensors(groups, verdict, nbytes) -> list:
    """(T, its group) for every tensor a kernel group writes that another group reads,
    heaviest first."""
    out = []
    for g, members in groups.members.items():
        if verdict[g][0] is None:
            continue
        for e in members:
            for o in e.outputs:
                if isinstance(o, TensorView) and _readers(groups, o, g):
                    out.append((o, g))
    return sorted(out, key=lambda p: -nbytes(p[0]))


def _readers(groups, t, g) -> set:
    """The groups other than g whose exprs read t (a copy reads only fusion inputs and other
    copies, so the readers of a group's output are groups' own exprs)."""
    return {groups.of[id(u)] for u in getattr(t, "uses", [])
            if id(u) in groups.of and groups.of[id(u)] != g}


def _chain(t, ids):
    """(exprs, leaves) T derives from inside the group of expr ids `ids`, or None when an expr
    on the way is not recomputable or the chain is too long."""
    chain, leaves, stack, seen = [], [], [t], set()
    while stack:
        v = stack.pop()
        if id(v) in seen:
            continue
        seen.add(id(v))
        d = v.definition
        if d is None or id(d) not in ids:
            leaves.append(v)
            continue
        if not recomputable(d) or len(chain) == MAX_CHAIN:
            return None
        chain.append(d)
        stack.extend(x for x in d.inputs if isinstance(x, TensorView))
    return chain, leaves


def _reads(groups, g) -> set:
    ins, _ = groups.boundary(groups.exprs_of(g), groups.extra_ids(g))
    return {id(v) for v in ins}


def _from_inputs(groups, v) -> bool:
    """Whether v is a fusion input or a host view of one (no group's kernel writes it)."""
    while v.definition is not None:
        d = v.definition
        if id(d) in groups.of or not any(isinstance(x, TensorView) for x in d.inputs):
            return False
        v = next(x for x in d.inputs if isinstance(x, TensorView))
    return True


def _outside_reader(groups, e, u) -> bool:
    """Whether expr u, outside e's group, needs e's output from memory: a host expr, or a
    group's expr where that group does not compute e itself."""
    if id(u) not in groups.all_ids:
        return False                      # not part of what the fusion computes
    g = groups.of.get(id(u))
    return g is None or id(e) not in groups.extra_ids(g)


def _try(fusion, groups, verdict, t, a, offer, nbytes) -> bool:
    readers = _readers(groups, t, a)
    if not readers or any(verdict[b][0] is None for b in readers):
        return False
    found = _chain(t, groups.member_ids(a) | groups.extra_ids(a))
    if found is None or not all(_from_inputs(groups, v) for v in found[1]):
        return False
    chain, leaves = found
    # A keeps writing T when the fusion returns it or a host view reads it
    kept = any(o is t for o in fusion.outputs) or any(
        id(u) in groups.all_ids and id(u) not in groups.of for u in getattr(t, "uses", []))
    before = nbytes(t) * (len(readers) + (0 if kept else 1))
    after, offers = 0, {}
    for b in sorted(readers):
        reads = _reads(groups, b)
        after += sum(nbytes(v) for v in {id(v): v for v in leaves if id(v) not in reads}.values())
        own = groups.member_ids(b) | groups.extra_ids(b)
        offers[b] = groups.extra.get(b, []) + [e for e in chain if id(e) not in own]
    if after >= before:
        return False
    saved = ({g: list(x) for g, x in groups.extra.items()},
             {g: list(m) for g, m in groups.members.items()}, dict(groups.of))
    for b, extra in offers.items():
        groups.extra[b] = extra
    prune(fusion, groups, a, min(readers))
    results = {}
    for g in sorted(readers | {a}):
        if not groups.members.get(g):
            continue                      # A gave all its exprs to the readers
        res = offer(groups.exprs_of(g), groups.extra_ids(g))
        if res[0] is None:               # a scheduler refuses: everything as it was
            groups.extra.clear()
            groups.extra.update(saved[0])
            groups.members.clear()
            groups.members.update(saved[1])
            groups.of.clear()
            groups.of.update(saved[2])
            return False
        results[g] = res
    if not groups.members.get(a):
        groups.members.pop(a, None)
        groups.extra.pop(a, None)
        verdict.pop(a, None)
    verdict.update(results)
    D.dump("segmenter_logging", "recompute",
           lambda: f"{t.name} ({', '.join(e.op_name for e in chain)}) is recomputed from "
                   f"{', '.join(v.name for v in leaves)} in {len(readers)} reader(s) instead "
                   f"of passed: about {before - after} bytes less moved")
    return True


def prune(fusion, groups, a, first_reader) -> None:
    """Drop from group a the exprs nothing needs any more: outputs read by no other expr of a,
    by no group that does not compute them itself, and not returned. An expr dropped that a
    reader holds as a copy becomes that reader's own (the first reader's, or the one holding it)."""
    returned = {id(o) for o in fusion.outputs}
    changed = True
    while changed:
        changed = False
        ids = groups.member_ids(a) | groups.extra_ids(a)     # a copy in a may read e too
        for e in reversed(list(groups.members[a])):
            needed = False
            for o in e.outputs:
                if id(o) in returned:
                    needed = True
                for u in getattr(o, "uses", []):
                    if id(u) in ids or _outside_reader(groups, e, u):
                        needed = True
            if needed:
                continue
            holders = sorted(b for b, extra in groups.extra.items()
                             if any(x is e for x in extra))
            if not holders:
                continue                  # dead already: left for the scheduler as it was
            owner = first_reader if first_reader in holders else holders[0]
            groups.members[a] = [m for m in groups.members[a] if m is not e]
            groups.extra[owner] = [x for x in groups.extra[owner] if x is not e]
            groups.members[owner] = groups.sorted_exprs(groups.members[owner] + [e])
            groups.of[id(e)] = owner
            changed = True
