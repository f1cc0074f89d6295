"""The segmenter's partition of a fusion's compute exprs into groups: each group becomes one
kernel or one eager segment. segmenter.py's passes merge groups; recompute.py and load_free.py
give a group copies of exprs another group owns (`extra`).

`Groups` knows each group's members (program order), which group owns an expr (`of`), each
group's boundary in the whole fusion (the tensors a kernel computing it reads and writes), and
the dependencies between groups (`succ`, `reaches`: through tensors read from memory, not
through values a reader computes itself).

Invariant: every expr is a member of exactly one group; a group's copies are exprs another
group owns, whose outputs only the owning group writes.
"""
from __future__ import annotations

from ..ir.tensor import TensorView
from .extract import FusionIndex


class Groups:
    """Partition of the compute exprs; knows each group's boundary in the whole fusion."""

    def __init__(self, fusion, exprs, all_exprs):
        self.fusion, self.order = fusion, {id(e): i for i, e in enumerate(all_exprs)}
        self.all_ids = set(self.order)
        self.outputs = {id(o) for o in fusion.outputs}
        self.members = {i: [e] for i, e in enumerate(exprs)}
        self.of = {id(e): i for i, e in enumerate(exprs)}
        self.extra: dict = {}     # group -> copies of others' exprs it computes (recompute.py)
        self.index = FusionIndex(fusion)      # for extracting the groups offered

    def member_ids(self, g) -> set:
        return {id(e) for e in self.members[g]}

    def extra_ids(self, g) -> set:
        return {id(e) for e in self.extra.get(g, ())}

    def sorted_exprs(self, exprs) -> list:
        return sorted(exprs, key=lambda e: self.order[id(e)])

    def position(self, g) -> int:
        """Program position of group g's first member (the merge passes' order of groups)."""
        return self.order[id(self.members[g][0])]

    def exprs_of(self, g) -> list:
        """What group g's kernel computes: its exprs and its copies, in program order."""
        return self.sorted_exprs(self.members[g] + self.extra.get(g, []))

    def boundary(self, exprs, copies=frozenset()):
        """(inputs, outputs) of a kernel computing `exprs`, of which the ids in `copies` are
        recomputed copies (their outputs belong to another group). An output read only by
        groups that recompute it is no output."""
        ids = {id(e) for e in exprs}
        produced = {id(o) for e in exprs for o in e.outputs}
        ins, outs, seen = [], [], set()
        for e in exprs:
            for v in e.inputs:
                if isinstance(v, TensorView) and id(v) not in produced and id(v) not in seen:
                    seen.add(id(v))
                    ins.append(v)
            if id(e) in copies:
                continue
            for o in e.outputs:
                if not isinstance(o, TensorView):
                    continue
                # a reader outside, or one this kernel only copies (its owner reads o too)
                external = [u for u in o.uses if id(u) in self.all_ids and
                            (id(u) not in ids or id(u) in copies)
                            and not self._recomputes(u, e)]
                if external or id(o) in self.outputs:
                    outs.append(o)
        return ins, outs

    def _recomputes(self, u, e) -> bool:
        """Whether the group of expr u computes its own copy of expr e."""
        g = self.of.get(id(u))
        return g is not None and bool(self.extra) and id(e) in self.extra_ids(g)

    def succ(self, g) -> set:
        """The groups reading an output of g from memory (not those computing it themselves)."""
        out = set()
        for e in self.members[g]:
            for o in e.outputs:
                for u in getattr(o, "uses", []):
                    h = self.of.get(id(u))
                    if h is not None and h != g and not self._recomputes(u, e):
                        out.add(h)
        return out

    def reaches(self, a, b, skip_direct: bool) -> bool:
        stack = [h for h in self.succ(a) if not (skip_direct and h == b)]
        seen = set()
        while stack:
            g = stack.pop()
            if g == b:
                return True
            if g not in seen:
                seen.add(g)
                stack.extend(self.succ(g))
        return False

    def merge(self, a, b) -> None:
        merged = self.sorted_exprs(self.members[a] + self.members.pop(b))
        self.members[a] = merged
        for e in merged:
            self.of[id(e)] = a
        copies = self._copies([a], self.extra.get(a, []) + self.extra.pop(b, []))
        if copies:
            self.extra[a] = copies
        else:
            self.extra.pop(a, None)

    def _copies(self, gs, extra) -> list:
        """The exprs of `extra` that no group of `gs` owns, once each, in program order."""
        owned = set().union(*(self.member_ids(g) for g in gs))
        out: dict = {}
        for e in extra:
            if id(e) not in owned:
                out.setdefault(id(e), e)
        return self.sorted_exprs(list(out.values()))

    def union(self, gs):
        """(exprs, ids of the copies among them) of one kernel computing the groups `gs`: their
        members and the copies they hold that none of them owns."""
        copies = self._copies(gs, [x for g in gs for x in self.extra.get(g, [])])
        return (self.sorted_exprs([e for g in gs for e in self.members[g]] + copies),
                frozenset(id(e) for e in copies))
