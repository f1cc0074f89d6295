"""Graph and Block: the containers of the TorchScript IR (Value/Node are in node.py).

A Graph owns one top Block; blocks own a `prim::Param` node (whose outputs are the block
inputs) and a `prim::Return` node (whose inputs are the block outputs). Nested blocks hang off
nodes (`prim::If`, `prim::Loop`). Fusion-group-like nodes keep their body as a *separate*
Graph in the `Subgraph` attribute (kind 'g'), with its own name space.

All value names of a Graph are unique (the Graph keeps the name table). New nodes are made
with `create()` (not inserted) or `insert()` (created and inserted at the insertion point,
which defaults to the end of the top block; change it with `with graph.insert_point(node):`).
`lint()` checks every invariant listed in node.py; passes should call it in tests.
"""
from __future__ import annotations

import contextlib
import re
from typing import Any, Iterator, Optional, Sequence

from .node import _INTERVAL, Node, Value, ValueMap
from .types import JitType, TensorType, type_of_python_value

_VALID_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.]*\Z")


class Block:
    """A list of nodes between a param node and a return node."""

    def __init__(self, graph: "Graph", owning_node: Optional[Node]):
        self.graph = graph
        self.owning_node = owning_node
        self.param_node = Node(graph, "prim::Param")
        self.return_node = Node(graph, "prim::Return")
        for n in (self.param_node, self.return_node):
            n.owning_block = self
        self.param_node.next, self.return_node.prev = self.return_node, self.param_node
        self.return_node._pos = float("inf")

    @property
    def inputs(self) -> tuple:
        return self.param_node.outputs

    @property
    def outputs(self) -> tuple:
        return self.return_node.inputs

    def add_input(self, name: Optional[str] = None, type_: Optional[JitType] = None) -> Value:
        return self.param_node.add_output(type_, name)

    def insert_input(self, i: int, name: Optional[str] = None,
                     type_: Optional[JitType] = None) -> Value:
        return self.param_node.insert_output(i, type_, name)

    def erase_input(self, i: int) -> None:
        self.param_node.erase_output(i)

    def register_output(self, v: Value) -> int:
        self.return_node.add_input(v)
        return len(self.return_node.inputs) - 1

    def insert_output(self, i: int, v: Value) -> None:
        self.return_node.insert_input(i, v)

    def erase_output(self, i: int) -> None:
        self.return_node.remove_input(i)

    def nodes(self) -> Iterator[Node]:
        """Nodes in order; safe against destroying the node just yielded."""
        n = self.param_node.next
        while n is not self.return_node:
            nxt = n.next
            yield n
            n = nxt

    def reverse_nodes(self) -> Iterator[Node]:
        n = self.return_node.prev
        while n is not self.param_node:
            prv = n.prev
            yield n
            n = prv

    def append_node(self, n: Node) -> Node:
        return n.insert_before(self.return_node)

    def prepend_node(self, n: Node) -> Node:
        return n.insert_after(self.param_node)

    def _renumber(self) -> None:
        pos = 0
        for n in self.nodes():
            pos += _INTERVAL
            n._pos = pos

    def _destroy(self) -> None:
        """Destroy every node (last first, so uses inside the block vanish first)."""
        self.return_node.remove_all_inputs()
        for n in list(self.reverse_nodes()):
            n.destroy()
        for v in self.param_node.outputs:
            assert not v.uses, f"block input {v!r} still used outside its block"
            self.graph._forget_value(v)


class Graph:
    """A TorchScript graph: inputs, a top block of nodes, outputs."""

    def __init__(self):
        self._names: dict[str, Value] = {}
        self._counter = 0
        self._ids = 0
        self.block = Block(self, None)
        self._insert_before: Node = self.block.return_node

    # ----- naming (used by Value / Node) -------------------------------------------------
    def _next_id(self) -> int:
        self._ids += 1
        return self._ids

    def _fresh_name(self, base: Optional[str] = None) -> str:
        if base is None:
            while str(self._counter) in self._names:
                self._counter += 1
            return str(self._counter)
        stem = re.sub(r"\.\d+\Z", "", base) if not base.isdigit() else base
        if stem.isdigit():
            return self._fresh_name()
        k = 1
        while f"{stem}.{k}" in self._names:
            k += 1
        return f"{stem}.{k}"

    def _new_value(self, node: Node, offset: int, type_: JitType, name: Optional[str]) -> Value:
        if name is not None:
            assert _VALID_NAME.match(name), f"invalid value name {name!r}"
            if name in self._names:
                name = self._fresh_name(name)
        else:
            name = self._fresh_name()
        v = Value(node, offset, type_, name)
        self._names[name] = v
        return v

    def _rename(self, v: Value, name: str) -> None:
        assert _VALID_NAME.match(name), f"invalid value name {name!r}"
        if self._names.get(name) is v:
            return
        if name in self._names:
            name = self._fresh_name(name)
        self._names.pop(v._name, None)
        v._name = name
        self._names[name] = v

    def _forget_value(self, v: Value) -> None:
        if self._names.get(v._name) is v:
            del self._names[v._name]

    def value_named(self, name: str) -> Value:
        return self._names[name]

    # ----- inputs / outputs --------------------------------------------------------------
    @property
    def inputs(self) -> tuple:
        return self.block.inputs

    @property
    def outputs(self) -> tuple:
        return self.block.outputs

    @property
    def param_node(self) -> Node:
        return self.block.param_node

    @property
    def return_node(self) -> Node:
        return self.block.return_node

    def add_input(self, name: Optional[str] = None, type_: Optional[JitType] = None) -> Value:
        return self.block.add_input(name, type_)

    def insert_input(self, i: int, name: Optional[str] = None,
                     type_: Optional[JitType] = None) -> Value:
        return self.block.insert_input(i, name, type_)

    def erase_input(self, i: int) -> None:
        self.block.erase_input(i)

    def register_output(self, v: Value) -> int:
        return self.block.register_output(v)

    def erase_output(self, i: int) -> None:
        self.block.erase_output(i)

    # ----- nodes -------------------------------------------------------------------------
    def nodes(self) -> Iterator[Node]:
        return self.block.nodes()

    def all_nodes(self) -> Iterator[Node]:
        """Every node, nested blocks included (not subgraph attributes), depth first."""
        for n in self.block.nodes():
            yield from n.walk()

    def create(self, kind: str, inputs: Sequence[Value] = (), n_outputs: int = 1) -> Node:
        n = Node(self, kind)
        for v in inputs:
            n.add_input(v)
        for _ in range(n_outputs):
            n.add_output()
        return n

    def insert_node(self, n: Node) -> Node:
        return n.insert_before(self._insert_before)

    def insert(self, kind: str, inputs: Sequence[Value] = (), n_outputs: int = 1) -> Node:
        return self.insert_node(self.create(kind, inputs, n_outputs))

    @property
    def insertion_point(self) -> Node:
        return self._insert_before

    def set_insert_point(self, where) -> None:
        """Insert before node `where`, or at the end of block `where`."""
        self._insert_before = where.return_node if isinstance(where, Block) else where

    @contextlib.contextmanager
    def insert_point(self, where):
        saved = self._insert_before
        self.set_insert_point(where)
        try:
            yield self
        finally:
            self._insert_before = saved

    def insert_constant(self, value: Any, type_: Optional[JitType] = None,
                        name: Optional[str] = None) -> Value:
        """Insert `prim::Constant` holding a Python value at the insertion point."""
        from .constants import attr_for_value
        n = Node(self, "prim::Constant")
        attr = attr_for_value(value)
        if attr is not None:
            n.set_attr("value", *attr)
        n.add_output(type_ or type_of_python_value(value), name)
        return self.insert_node(n).output()

    def create_clone(self, node: Node, value_map: ValueMap, copy_blocks: bool = True) -> Node:
        """A copy of `node` (from any graph) in this graph, not inserted; inputs mapped."""
        n = Node(self, node.kind)
        for name, (kind, val) in node.attributes.items():
            n.attributes[name] = (kind, _copy_attr(kind, val))
        n.source, n.scope = node.source, node.scope
        n.src_line, n.src_col = node.src_line, node.src_col
        n.value_object, n.overload = node.value_object, node.overload
        for v in node.inputs:
            n.add_input(value_map(v))
        for o in node.outputs:
            n.add_output(o.type, o.debug_name)
        if copy_blocks:
            for b in node.blocks:
                _clone_block(b, n.add_block(), value_map)
        return n

    def copy(self) -> "Graph":
        """A deep copy (subgraph attributes copied too); names are preserved."""
        g = Graph()
        env: dict[Value, Value] = {}
        for v in self.inputs:
            env[v] = g.add_input(v.debug_name, v.type)
        _clone_block_into(self.block, g.block, env, lambda v: env[v])
        return g

    def lint(self) -> None:
        from .lint import lint_graph
        lint_graph(self)

    def __str__(self) -> str:
        from .printer import print_graph
        return print_graph(self)

    def __repr__(self) -> str:
        return f"<Graph {len(self.inputs)} inputs, {sum(1 for _ in self.nodes())} nodes>"


def _copy_attr(kind: str, val: Any) -> Any:
    if kind == "g" and val is not None:
        return val.copy()
    if kind == "gs":
        return [g.copy() for g in val]
    if isinstance(val, list):
        return list(val)
    return val


def _clone_block(src: Block, dst: Block, outer: ValueMap) -> None:
    env: dict[Value, Value] = {}
    for v in src.inputs:
        env[v] = dst.add_input(v.debug_name, v.type)
    _clone_block_into(src, dst, env, outer)


def _clone_block_into(src: Block, dst: Block, env: dict, outer: ValueMap) -> None:
    def lookup(v: Value) -> Value:
        return env[v] if v in env else outer(v)

    for n in src.nodes():
        c = dst.graph.create_clone(n, lookup)
        dst.append_node(c)
        for o, co in zip(n.outputs, c.outputs):
            env[o] = co
    for v in src.outputs:
        dst.register_output(lookup(v))


__all__ = ["Graph", "Block", "Node", "Value", "TensorType"]
