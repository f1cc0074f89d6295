"""Values and nodes of the TorchScript graph (Graph and Block live in graph.py).

Invariants kept by every mutating method here (checked by `Graph.lint()`):
  * each Value is defined by exactly one node (`value.node`, at `value.offset` in its outputs);
    graph and block inputs are outputs of the block's `prim::Param` node;
  * `value.uses` lists exactly the (user, index) pairs with `user.inputs[index] is value`;
    a block's outputs are the inputs of its `prim::Return` node, so those count as uses too;
  * every Value's debug name is unique within its Graph (nested blocks included);
  * nodes of a block form a doubly linked list from `param_node` to `return_node`, with
    strictly increasing integer position tags, so `is_before`/`is_after` are O(1) within a
    block (amortised: tags are renumbered when no gap is left).
API misuse (destroying a node whose outputs still have uses, ...) raises AssertionError.
"""
from __future__ import annotations

from typing import Any, Callable, Iterator, NamedTuple, Optional

from .types import JitType, TensorType

ATTR_KINDS = {"i", "f", "s", "c", "t", "g", "ty", "is", "fs", "ss", "cs", "ts", "gs", "tys", "ival"}
_INTERVAL = 1 << 20


class Use(NamedTuple):
    user: "Node"
    offset: int


class Value:
    """An SSA value: one output of one node (or an input of a graph / block)."""

    def __init__(self, node: "Node", offset: int, type_: JitType, name: str):
        self.node = node
        self.offset = offset
        self.type = type_
        self.uses: list[Use] = []
        self._name = name
        self.unique = node.graph._next_id()

    @property
    def graph(self):
        return self.node.graph

    @property
    def debug_name(self) -> str:
        return self._name

    def set_debug_name(self, name: str) -> "Value":
        """Rename; if another live value holds `name`, this one gets `name.N` instead."""
        self.graph._rename(self, name)
        return self

    def has_uses(self) -> bool:
        return bool(self.uses)

    def replace_all_uses_with(self, new: "Value") -> None:
        assert new is not self, "replace_all_uses_with(self)"
        for user, idx in list(self.uses):
            user._set_input(idx, new)

    def replace_all_uses_after_node_with(self, node: "Node", new: "Value") -> None:
        """Redirect only the uses whose user comes after `node` (nested blocks lifted)."""
        for user, idx in list(self.uses):
            if user.is_after(node):
                user._set_input(idx, new)

    def __repr__(self) -> str:
        return f"%{self._name}"


class Node:
    """One operation: kind, inputs, outputs, attributes, nested blocks."""

    def __init__(self, graph, kind: str):
        self.graph = graph
        self.kind = kind
        self._inputs: list[Value] = []
        self._outputs: list[Value] = []
        self.attributes: dict[str, tuple[str, Any]] = {}
        self.blocks: list = []
        self.owning_block = None
        self.prev: Optional[Node] = None
        self.next: Optional[Node] = None
        self._pos = 0
        self.src_line: Optional[int] = None      # where the parser found it (1-based)
        self.src_col: Optional[int] = None
        self.source: Optional[str] = None        # the `# file:line:col` comment, if any
        self.scope: Optional[str] = None         # the `, scope: __module.x` of traced graphs
        # A constant's value that IR text cannot spell (a function, a script object), when the
        # graph was built from a torch object (from_torch.py); never printed.
        self.value_object: Any = None
        # The overload torch matched (`"other"` of aten::min.other, "" for the plain one) when
        # the graph was read from a torch object; None from IR text, where `min(a, b)` and
        # `min(a, out=b)` look alike (alias analysis then assumes either).
        self.overload: Optional[str] = None

    # ----- inputs / outputs -------------------------------------------------------------
    @property
    def inputs(self) -> tuple:
        return tuple(self._inputs)

    @property
    def outputs(self) -> tuple:
        return tuple(self._outputs)

    def input(self, i: int = 0) -> Value:
        return self._inputs[i]

    def output(self, i: int = 0) -> Value:
        return self._outputs[i]

    def _check_value(self, v: Value) -> None:
        assert isinstance(v, Value), f"expected a Value, got {v!r}"
        assert v.graph is self.graph, f"{v!r} belongs to another graph"

    def add_input(self, v: Value) -> Value:
        return self.insert_input(len(self._inputs), v)

    def insert_input(self, i: int, v: Value) -> Value:
        self._check_value(v)
        for j in range(i, len(self._inputs)):          # shift the offsets of later uses
            self._retarget_use(self._inputs[j], j, j + 1)
        self._inputs.insert(i, v)
        v.uses.append(Use(self, i))
        return v

    def remove_input(self, i: int) -> None:
        self._drop_use(self._inputs[i], i)
        del self._inputs[i]
        for j in range(i, len(self._inputs)):
            self._retarget_use(self._inputs[j], j + 1, j)

    def remove_all_inputs(self) -> None:
        while self._inputs:
            self.remove_input(len(self._inputs) - 1)

    def replace_input(self, i: int, v: Value) -> Value:
        """Make input i be `v`; returns the old value."""
        old = self._inputs[i]
        self._set_input(i, v)
        return old

    def replace_input_with(self, old: Value, new: Value) -> None:
        for i, v in enumerate(self._inputs):
            if v is old:
                self._set_input(i, new)

    def _set_input(self, i: int, v: Value) -> None:
        self._check_value(v)
        self._drop_use(self._inputs[i], i)
        self._inputs[i] = v
        v.uses.append(Use(self, i))

    def _drop_use(self, v: Value, i: int) -> None:
        for k, u in enumerate(v.uses):
            if u.user is self and u.offset == i:
                del v.uses[k]
                return
        raise AssertionError(f"use list of {v!r} lacks ({self.kind}, {i})")

    def _retarget_use(self, v: Value, old: int, new: int) -> None:
        for k, u in enumerate(v.uses):
            if u.user is self and u.offset == old:
                v.uses[k] = Use(self, new)
                return
        raise AssertionError(f"use list of {v!r} lacks ({self.kind}, {old})")

    def add_output(self, type_: Optional[JitType] = None, name: Optional[str] = None) -> Value:
        return self.insert_output(len(self._outputs), type_, name)

    def insert_output(self, i: int, type_: Optional[JitType] = None,
                      name: Optional[str] = None) -> Value:
        v = self.graph._new_value(self, i, type_ or TensorType(), name)
        self._outputs.insert(i, v)
        for j in range(i + 1, len(self._outputs)):
            self._outputs[j].offset = j
        return v

    def erase_output(self, i: int) -> None:
        v = self._outputs[i]
        assert not v.uses, f"erase_output: {v!r} still has uses"
        self.graph._forget_value(v)
        del self._outputs[i]
        for j in range(i, len(self._outputs)):
            self._outputs[j].offset = j

    # ----- attributes --------------------------------------------------------------------
    def set_attr(self, name: str, kind: str, value: Any) -> "Node":
        assert kind in ATTR_KINDS, f"unknown attribute kind {kind!r}"
        self.attributes[name] = (kind, value)
        return self

    def has_attr(self, name: str) -> bool:
        return name in self.attributes

    def attr(self, name: str) -> Any:
        return self.attributes[name][1]

    def attr_kind(self, name: str) -> str:
        return self.attributes[name][0]

    def remove_attr(self, name: str) -> None:
        del self.attributes[name]

    def i(self, name: str) -> int:
        return self.attr(name)

    def f(self, name: str) -> float:
        return self.attr(name)

    def s(self, name: str) -> str:
        return self.attr(name)

    def t(self, name: str):
        return self.attr(name)

    def g(self, name: str = "Subgraph"):
        return self.attr(name)

    def set_g(self, name: str, graph) -> "Node":
        return self.set_attr(name, "g", graph)

    @property
    def subgraph(self):
        """The `Subgraph` attribute of fusion-group-like nodes, else None."""
        a = self.attributes.get("Subgraph")
        return a[1] if a and a[0] == "g" else None

    # ----- blocks ------------------------------------------------------------------------
    def add_block(self):
        from .graph import Block
        b = Block(self.graph, self)
        self.blocks.append(b)
        return b

    def erase_block(self, i: int) -> None:
        self.blocks.pop(i)._destroy()

    # ----- position in a block -----------------------------------------------------------
    def in_block(self) -> bool:
        return self.owning_block is not None

    def insert_before(self, n: "Node") -> "Node":
        assert self.owning_block is None, f"{self.kind} is already in a block"
        assert n.owning_block is not None and n.kind != "prim::Param", "bad insertion point"
        self._link(n.prev, n)
        return self

    def insert_after(self, n: "Node") -> "Node":
        assert self.owning_block is None, f"{self.kind} is already in a block"
        assert n.owning_block is not None and n.kind != "prim::Return", "bad insertion point"
        self._link(n, n.next)
        return self

    def move_before(self, n: "Node") -> "Node":
        self._unlink()
        return self.insert_before(n)

    def move_after(self, n: "Node") -> "Node":
        self._unlink()
        return self.insert_after(n)

    def _link(self, a: "Node", b: "Node") -> None:
        self.owning_block = a.owning_block
        a.next, self.prev, self.next, b.prev = self, a, b, self
        if b.kind == "prim::Return":
            self._pos = a._pos + _INTERVAL
        elif b._pos - a._pos > 1:
            self._pos = (a._pos + b._pos) // 2
        else:
            self.owning_block._renumber()

    def _unlink(self) -> None:
        if self.owning_block is None:
            return
        self.prev.next, self.next.prev = self.next, self.prev
        self.prev = self.next = self.owning_block = None

    def is_before(self, other: "Node") -> bool:
        return self._compare(other) < 0

    def is_after(self, other: "Node") -> bool:
        return self._compare(other) > 0

    def _compare(self, other: "Node") -> int:
        """<0, 0, >0 as self is before, at (or inside / containing), after `other`."""
        a = self
        while a is not None:
            b = other
            while b is not None and b.owning_block is not None:
                if a.owning_block is b.owning_block:
                    return (a._pos > b._pos) - (a._pos < b._pos)
                b = b.owning_block.owning_node
            assert a.owning_block is not None, "is_before on a node outside any block"
            a = a.owning_block.owning_node
        raise AssertionError("nodes do not share a graph")

    # ----- removal -----------------------------------------------------------------------
    def destroy(self) -> None:
        """Unlink and delete: outputs must be unused; inputs' use lists are updated."""
        for v in self._outputs:
            assert not v.uses, f"destroy {self.kind}: {v!r} still has uses {v.uses}"
        self.remove_all_inputs()
        for b in self.blocks:
            b._destroy()
        self.blocks = []
        for v in self._outputs:
            self.graph._forget_value(v)
        self._outputs = []
        self._unlink()

    # ----- printing ----------------------------------------------------------------------
    def __str__(self) -> str:
        from .printer import node_line
        return node_line(self)

    def __repr__(self) -> str:
        outs = ", ".join(repr(v) for v in self._outputs)
        return f"<Node {outs} = {self.kind}>"

    def walk(self) -> Iterator["Node"]:
        """This node and, depth first, every node nested in its blocks."""
        yield self
        for b in self.blocks:
            for n in b.nodes():
                yield from n.walk()


ValueMap = Callable[[Value], Value]
