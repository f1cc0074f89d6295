"""Pass 4: find fusion groups (vertical, then horizontal), block by block.

For each block (recursing into prim::If / prim::Loop blocks first; control flow stays, groups
form inside), walk the nodes in reverse order. A consumer that is fusible or a group tries to
absorb its producers, latest first; after a merge it tries again (new producers appear).
Merging producer P into consumer C needs them adjacent: either P moves down to just before C
(no node between uses P's outputs or writes P's inputs) or C moves up to just after P (no
node between defines C's inputs or writes them). Other uses of P's outputs, all after C by
then, become group outputs. Then groups that share an input and do not depend on each other
merge (horizontal fusion). The scan repeats until nothing changes. Every choice depends only
on node order, so the same graph always gives the same groups. The argument limit (group
inputs + outputs, default 128) is never exceeded. Constants are first hoisted to the top of
the graph (they have no inputs), so they never block a move.
"""
from __future__ import annotations

from .aliasing import AliasInfo
from .groups import (absorb, arg_count_after, fusible_reason, has_compute, is_group,
                     make_group)

DEFAULT_ARG_LIMIT = 128


def hoist_constants(graph) -> None:
    first = graph.block.param_node.next
    for n in list(graph.all_nodes()):
        if n.kind == "prim::Constant" and n is not first:
            n.move_before(first)


def _ancestor_in(node, block):
    """The node of `block` that is `node` or contains it; None if outside."""
    while node is not None and node.owning_block is not block:
        owner = node.owning_block.owning_node if node.owning_block else None
        node = owner
    return node


class FusionScan:
    def __init__(self, graph, report, arg_limit: int = DEFAULT_ARG_LIMIT):
        self.graph, self.report, self.limit = graph, report, arg_limit
        self.info = AliasInfo(graph)
        self._fusible: dict = {}

    # ----- predicates --------------------------------------------------------------------
    def fusible(self, node) -> bool:
        if is_group(node):
            return True
        if node not in self._fusible:
            self._fusible[node] = fusible_reason(node, self.info) is None
        return self._fusible[node]

    def _between(self, a, b):
        n = a.next
        while n is not b:
            yield n
            n = n.next

    def _can_sink(self, p, c) -> bool:
        """P may move down to just before C."""
        block = p.owning_block
        for o in p.outputs:
            for u in o.uses:
                top = _ancestor_in(u.user, block)
                if top is not None and top is not c and top.is_before(c):
                    return False
        return not any(self.info.order_matters(p, m) for m in self._between(p, c))

    def _can_lift(self, p, c) -> bool:
        """C may move up to just after P."""
        block = c.owning_block
        for v in c.inputs:
            top = _ancestor_in(v.node, block)
            if top is not None and top is not p and top.is_after(p) and top.is_before(c):
                return False
        return not any(self.info.order_matters(c, m) for m in self._between(p, c))

    def _make_adjacent(self, p, c) -> bool:
        if p.next is c:
            return True
        if self._can_sink(p, c):
            p.move_before(c)
            return True
        if self._can_lift(p, c):
            c.move_after(p)
            return True
        return False

    # ----- merging -----------------------------------------------------------------------
    def _try_merge(self, p, c):
        """Merge earlier node P into C; returns the group or None."""
        if not self.fusible(p) or not self.fusible(c):
            return None
        if arg_count_after(p, c) > self.limit:
            return None
        if not (self._can_sink(p, c) or self._can_lift(p, c)) and p.next is not c:
            return None
        group = c if is_group(c) else make_group(c, self.info)
        if not self._make_adjacent(p, group):
            return None
        absorb(group, p, self.info)
        return group

    def _producers(self, c):
        block = c.owning_block
        seen, out = set(), []
        for v in c.inputs:
            p = v.node
            if p.owning_block is block and p.kind not in ("prim::Param", "prim::Constant") \
                    and p not in seen:
                seen.add(p)
                out.append(p)
        return sorted(out, key=lambda n: n._pos, reverse=True)

    def _siblings(self, c):
        block = c.owning_block
        out, seen = [], {c}
        for v in c.inputs:
            if v.node.kind == "prim::Constant":
                continue
            for u in v.uses:
                s = u.user
                if s not in seen and s.owning_block is block and is_group(s):
                    seen.add(s)
                    out.append(s)
        return sorted(out, key=lambda n: n._pos)

    def _visit(self, c):
        """Try merges with consumer C; returns the group to revisit, or None."""
        if not self.fusible(c):
            return None
        for p in self._producers(c):
            g = self._try_merge(p, c)
            if g is not None:
                return g
        if is_group(c):
            for s in self._siblings(c):
                first, second = (s, c) if s.is_before(c) else (c, s)
                if self._depends(second, first):
                    continue
                g = self._try_merge(first, second)
                if g is not None:
                    return g
        return None

    def _depends(self, later, earlier) -> bool:
        """Does `later` (transitively, within the block) use an output of `earlier`?"""
        block = earlier.owning_block
        frontier, seen = list(earlier.outputs), set()
        while frontier:
            v = frontier.pop()
            for u in v.uses:
                top = _ancestor_in(u.user, block)
                if top is None or top in seen or top.is_after(later):
                    continue
                if top is later:
                    return True
                seen.add(top)
                frontier.extend(top.outputs)
        return False

    def scan_block(self, block) -> bool:
        changed = False
        n = block.return_node.prev
        while n is not block.param_node:
            for b in n.blocks:
                changed |= self.scan_block(b)
            g = self._visit(n)
            if g is not None:
                changed = True
                n = g
                continue
            n = n.prev
        return changed

    def singletons(self, block) -> int:
        """Fusible ops with compute that merged with nothing become groups of one."""
        made = 0
        for n in list(block.nodes()):
            for b in n.blocks:
                made += self.singletons(b)
            if not is_group(n) and self.fusible(n) and has_compute(n):
                make_group(n, self.info)
                made += 1
        return made

    def run(self) -> int:
        hoist_constants(self.graph)
        self.singletons(self.graph.block)
        while self.scan_block(self.graph.block):
            pass
        return sum(1 for n in self.graph.all_nodes() if is_group(n))


def fuse_groups(graph, report, arg_limit: int = DEFAULT_ARG_LIMIT) -> int:
    """Form the fusion groups of `graph` in place; returns how many there are."""
    return FusionScan(graph, report, arg_limit).run()
