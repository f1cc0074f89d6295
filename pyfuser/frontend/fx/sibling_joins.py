"""Joins of sibling regions after partition.py's walk, and the merge of two regions both use.

`merge_siblings_sharing_inputs(members, group, rdep, position)`: pointwise regions on one
device that read a common tensor, or whose results one node reads, join where neither needs
the other and no reader of either waits for the join (Llama's q / k rotary embeddings and the
repeat_kv copy of v, one region and one horizontal kernel a layer). `absorb` merges one region
into another in the walk's maps (members, group, rdep).

Invariants: a join never makes a unit need itself (the dependency bitsets `rdep` stay
transitive: every region needing either half needs the joined one and its needs), never joins
regions on different devices, and never moves a reader of either region (an eager op, with its
side effects) past an op it came before in the unit order. Ready positions follow a node's
operands with random ops' links (rng_order.py), as the walk's needs and the unit order do.
"""
from __future__ import annotations

import torch

from .mutations import is_input_copy
from .rng_order import operands
from .support import is_getitem, op_class
from ..lowering.registry import FACTORY, METADATA, POINTWISE


def absorb(members: dict, group: dict, rdep: dict, keep: int, gone: int) -> None:
    """Region `gone` joins region `keep` (neither needs the other): its nodes move, `keep` needs
    what either needed, and every region that needed either now needs `keep` and its needs
    (`gone`'s bit stays in the maps as an alias: its rdep is keep's and keep's own bit)."""
    for m in members.pop(gone):
        group[m] = keep
        members[keep].append(m)
    rdep[keep] |= rdep[gone]
    rdep[gone] = rdep[keep] | (1 << keep)
    for r in rdep:
        if (rdep[r] >> gone) & 1 or (rdep[r] >> keep) & 1:
            rdep[r] |= (1 << keep) | rdep[keep]


def _pointwise_unit(nodes) -> bool:
    return all(is_getitem(n) or (op_class(n) in (POINTWISE, METADATA, FACTORY)
                                 and not is_input_copy(n)) for n in nodes)


def merge_siblings_sharing_inputs(members: dict, group: dict, rdep: dict, position: dict,
                                  links: dict) -> None:
    """Join pointwise regions on one device that read a common tensor no region of theirs
    computes, or whose results one node reads, where neither needs the other and the join delays
    no reader: each region's first reader outside it comes after the other's last input is
    ready (`_ready_positions`: when the unit computing it can run). The walk joins
    siblings only through a node reading both; Llama's rotary embeddings of q and k (separate
    matmuls' results, both read the cos / sin a first layer computed) were two regions, two
    kernels, in every layer but the first, where the cos / sin computation's region held both;
    the copy of v for grouped-query attention (repeat_kv) a third, all three read by the
    attention. Joined, the segmenter hands the
    components to one horizontal kernel (or keeps them apart where no scheduler takes them
    together: one region call either way). In place on the walk's maps."""
    inf = len(position)

    def outside_inputs(g) -> set:
        ms = set(members[g])
        return {x for n in members[g] for x in n.all_input_nodes if x not in ms}

    def first_reader(g) -> int:
        ms = set(members[g])
        return min((position.get(u, inf) for n in members[g] for u in n.users if u not in ms),
                   default=inf)

    ready = _ready_positions(members, position, links)

    def last_input(g) -> int:
        """When g's inputs exist in a unit order: an input's position, or later where it waits
        for a region (one whose last input comes later) through its producers."""
        return max((ready.get(x, -1) for x in outside_inputs(g)), default=-1)

    def readers(g) -> set:
        """The call nodes outside g that read it (not the graph's output)."""
        ms = set(members[g])
        return {u for n in members[g] for u in n.users if u not in ms and u.op == "call_function"}

    def shared(x) -> bool:
        v = x.meta.get("val")
        return isinstance(v, torch.Tensor) and v.ndim > 0

    def devices(g) -> set:
        return {v.device for v in (n.meta.get("val") for n in members[g])
                if isinstance(v, torch.Tensor)}

    order = sorted(members, key=lambda g: min(position[n] for n in members[g]))
    rank = {g: k for k, g in enumerate(order)}
    facts: dict = {}                 # region id -> (pointwise, inputs, readers, devices)

    def fact(g):
        if g not in facts:
            facts[g] = (_pointwise_unit(members[g]), outside_inputs(g), readers(g), devices(g))
        return facts[g]

    # candidates through the indexes (a pair passing the sharing test has a shared input or
    # a reader in common): regions by the shared inputs and by the readers they have
    by_input: dict = {}
    by_reader: dict = {}
    for g in order:
        pw, ins, rds, _ = fact(g)
        if not pw:
            continue
        for x in ins:
            if shared(x):
                by_input.setdefault(x, set()).add(g)
        for u in rds:
            by_reader.setdefault(u, set()).add(g)

    def partners(g, after: int) -> list:
        _, ins, rds, _ = fact(g)
        c = {h for x in ins if shared(x) for h in by_input.get(x, ())}
        c.update(h for u in rds for h in by_reader.get(u, ()))
        return sorted((h for h in c if h in members and rank[h] > after), key=rank.__getitem__)

    for g in order:
        if g not in members or not fact(g)[0]:
            continue
        after = rank[g]
        todo = partners(g, after)
        while todo:
            h = todo.pop(0)
            after = rank[h]
            if h not in members or not fact(h)[0] or (rdep[g] >> h) & 1 or (rdep[h] >> g) & 1:
                continue
            if fact(g)[3] != fact(h)[3]:       # a fusion runs on one device (one node reading
                continue                       # a CPU index and a CUDA tensor reads both)
            if first_reader(g) < last_input(h) or first_reader(h) < last_input(g):
                continue
            _, ins_h, rds_h, _ = fact(h)
            absorb(members, group, rdep, g, h)
            members[g].sort(key=position.__getitem__)
            # the joined region runs once both halves' inputs exist (no later than any reader
            # of either: the check above), so only its own nodes' ready positions move
            at = max(ready[m] for m in members[g])
            for m in members[g]:
                ready[m] = at
            for x in ins_h:
                by_input.get(x, set()).discard(h)
            for u in rds_h:
                by_reader.get(u, set()).discard(h)
            facts.pop(h)
            facts.pop(g)
            for x in fact(g)[1]:
                if shared(x):
                    by_input.setdefault(x, set()).add(g)
            for u in fact(g)[2]:
                by_reader.setdefault(u, set()).add(g)
            todo = partners(g, after)


def _ready_positions(members: dict, position: dict, links: dict) -> dict:
    """node -> the position from which its value exists in a unit order: an eager node's own
    position, raised to its inputs'; a region's nodes', the latest of the region's outside
    inputs' (a region runs as one unit, once its last input exists). One post-order walk over
    the units (they form a DAG)."""
    owner = {m: g for g, ms in members.items() for m in ms}

    def unit(n):
        g = owner.get(n)
        return ("r", g) if g is not None else ("n", n)

    def inputs(u):
        if u[0] == "n":
            return operands(u[1], links)
        ms = members[u[1]]
        return [x for m in ms for x in operands(m, links) if owner.get(x) != u[1]]

    at: dict = {}
    for n in sorted(position, key=position.__getitem__):
        root = unit(n)
        if root in at:
            continue
        stack = [(root, False)]
        while stack:
            u, expanded = stack.pop()
            if u in at:
                continue
            if not expanded:
                stack.append((u, True))
                stack.extend((unit(x), False) for x in inputs(u)
                             if x in position and unit(x) not in at)
                continue
            base = position[u[1]] if u[0] == "n" else -1
            at[u] = max([base] + [at[unit(x)] for x in inputs(u) if x in position])
    return {n: at[unit(n)] for n in position}
