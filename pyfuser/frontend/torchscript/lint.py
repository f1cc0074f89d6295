"""Graph.lint(): check the invariants listed in node.py; raise LintError naming the culprit.

Checked: every node's owning block/graph and list links; increasing position tags; each
value defined once with the right (node, offset); every input defined before its use and in
scope (graph inputs, block inputs, earlier nodes of this or an enclosing block); use lists
exactly matching the inputs that refer to each value; the name table; `Subgraph` attributes
recursively.
"""
from __future__ import annotations


class LintError(AssertionError):
    """A broken graph invariant (a bug in a pass, not a user error)."""


def _fail(msg: str) -> None:
    raise LintError(msg)


def lint_graph(graph) -> None:
    defined: dict = {}              # Value -> defining Node
    expected_uses: dict = {}        # Value -> list of (user, idx)
    _lint_block(graph, graph.block, None, set(), defined, expected_uses)
    for v, users in expected_uses.items():
        if v not in defined:
            continue
        actual = sorted((id(u.user), u.offset) for u in v.uses)
        want = sorted((id(u), i) for u, i in users)
        if actual != want:
            _fail(f"use list of %{v.debug_name} is {[(u.user.kind, u.offset) for u in v.uses]}, "
                  f"but its users are {[(u.kind, i) for u, i in users]}")
    for v in defined:
        if graph._names.get(v.debug_name) is not v:
            _fail(f"%{v.debug_name} is missing from the graph's name table")
    if len(graph._names) != len(defined):
        stale = sorted(set(graph._names) - {v.debug_name for v in defined})
        _fail(f"name table holds values not in the graph: {stale}")


def _define(v, node, offset, graph, defined) -> None:
    if v in defined:
        _fail(f"%{v.debug_name} is defined twice")
    if v.node is not node or v.offset != offset:
        _fail(f"%{v.debug_name} says it is output {v.offset} of {v.node.kind}, "
              f"but it is output {offset} of {node.kind}")
    if v.node.graph is not graph:
        _fail(f"%{v.debug_name} belongs to another graph")
    defined[v] = node


def _use(v, user, idx, scope, expected_uses) -> None:
    if v not in scope:
        _fail(f"{user.kind} uses %{v.debug_name} (input {idx}) before or outside its definition")
    expected_uses.setdefault(v, []).append((user, idx))


def _lint_block(graph, block, owner, outer_scope: set, defined, expected_uses) -> None:
    if block.graph is not graph or block.owning_node is not owner:
        _fail("block has the wrong owning graph or node")
    scope = set(outer_scope)
    for i, v in enumerate(block.inputs):
        _define(v, block.param_node, i, graph, defined)
        scope.add(v)
    prev = block.param_node
    last_pos = None
    n = block.param_node.next
    while n is not block.return_node:
        if n is None:
            _fail("node list is broken (no return node at the end)")
        if n.owning_block is not block or n.graph is not graph:
            _fail(f"{n.kind} has the wrong owning block or graph")
        if n.prev is not prev:
            _fail(f"{n.kind}: prev link is broken")
        if last_pos is not None and not n._pos > last_pos:
            _fail(f"{n.kind}: position tags are not increasing")
        last_pos = n._pos
        for i, v in enumerate(n.inputs):
            _use(v, n, i, scope, expected_uses)
        for b in n.blocks:
            _lint_block(graph, b, n, scope, defined, expected_uses)
        for i, v in enumerate(n.outputs):
            _define(v, n, i, graph, defined)
            scope.add(v)
        sub = n.attributes.get("Subgraph")
        if sub and sub[0] == "g" and sub[1] is not None:
            if sub[1] is graph:
                _fail(f"{n.kind} holds its own graph as Subgraph")
            lint_graph(sub[1])
        prev = n
        n = n.next
    if block.return_node.prev is not prev:
        _fail("return node's prev link is broken")
    for i, v in enumerate(block.outputs):
        _use(v, block.return_node, i, scope, expected_uses)
