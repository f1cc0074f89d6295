"""Parser of TorchScript IR text into a Graph: `parse_ir(text, filename) -> Graph`.

Grammar (whitespace and `#` comments are free everywhere):
    file      := graphdef
    graphdef  := 'graph' '(' [param {',' param}] ')' ':' {node} 'return' '(' [vals] ')' {with}
    with      := 'with' KIND_N '=' graphdef      -- body of the N-th group node of the graph
    param     := VALUE ':' type
    node      := [outs] '=' KIND ['[' attr {',' attr} ']'] '(' [vals] ')' [', scope: ...]
                 {'block'N '(' [params] ')' ':' {node} '->' '(' [vals] ')'}
    outs      := VALUE ':' type {',' VALUE ':' type}
Fusion groups print as `prim::FusionGroup_0(...)` with their body in a following
`with prim::FusionGroup_0 = graph(...)`; the parser binds each `with` to the group node of
that name (the graph's own groups first, then the enclosing graph's), turning it into
kind `prim::FusionGroup` with a `Subgraph` attribute. `[Subgraph=<Graph>]` (body not printed)
gives a `Subgraph` attribute of None.

Checked here: syntax, use of undefined or out-of-scope values, values defined twice, block
output counts of `prim::If`/`prim::Loop`, group input counts. Whatever the input, the only
exception that leaves `parse_ir` is IRParseError (deep nesting, internal slips included).
"""
from __future__ import annotations

import re

from pyfuser.errors import IRParseError

from .graph import Block, Graph
from .lexer import BLOCK, IDENT, KIND, VALUE, Scanner
from .node import Node
from .parse_values import parse_attr_value, parse_type
from .types import TensorType

_GROUP_REF = re.compile(r"(.+::.+?)_(\d+)\Z")
MAX_BLOCK_DEPTH = 100     # deeper graphs would overflow the recursion of later stages
MAX_GRAPH_DEPTH = 32      # `with` subgraphs inside subgraphs


class _GraphState:
    """Per-graph parse state: defined names (with line) and pending group references."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.defined: dict[str, int] = {}
        self.groups: list[Node] = []          # nodes whose kind looks like `ns::Name_N`


class _Parser:
    def __init__(self, text: str, filename: str):
        self.sc = Scanner(text, filename)
        self.graph_depth = 0

    def parse_file(self) -> Graph:
        g = self.graphdef()
        if not self.sc.at_eof():
            if self.sc.peek("with"):
                raise self.sc.error("`with` names no group node of the graph above")
            raise self.sc.error(f"expected end of input after `return`, found {self.sc.found()}")
        return g

    # ----- graphs ------------------------------------------------------------------------
    def graphdef(self) -> Graph:
        sc = self.sc
        if not sc.keyword("graph"):
            raise sc.error(f"expected `graph(`, found {sc.found()}")
        self.graph_depth += 1
        if self.graph_depth > MAX_GRAPH_DEPTH:
            raise sc.error(f"subgraphs nested more than {MAX_GRAPH_DEPTH} levels deep")
        sc.expect("(", "after `graph`")
        st = _GraphState(Graph())
        scope: dict = {}
        if not sc.accept(")"):
            while True:
                self.param(st, st.graph.block, scope)
                if sc.accept(")"):
                    break
                sc.expect(",", "or `)` after a graph input")
        sc.expect(":", "after the graph inputs")
        self.stmts(st, st.graph.block, [scope], "return")
        if not sc.keyword("return"):
            raise sc.error(f"expected a node or `return`, found {sc.found()}")
        for v in self.value_list(st, [scope], "return"):
            st.graph.register_output(v)
        self.withs(st)
        self.graph_depth -= 1
        return st.graph

    def withs(self, st: _GraphState) -> None:
        sc = self.sc
        while st.groups and sc.peek_match(IDENT) and sc.peek_match(IDENT).group(0) == "with":
            save = sc.pos
            sc.keyword("with")
            pos = sc.pos
            name = sc.expect_match(KIND, "a group name like `prim::FusionGroup_0`").group(0)
            match = next((n for n in st.groups if n.kind == name), None)
            if match is None:
                sc.pos = save                 # belongs to an enclosing graph
                return
            sc.expect("=", f"after `with {name}`")
            sub = self.graphdef()
            if len(sub.inputs) != len(match.inputs):
                raise sc.error(f"group {name} has {len(match.inputs)} inputs but its graph "
                               f"takes {len(sub.inputs)}", pos)
            st.groups.remove(match)
            match.kind = _GROUP_REF.match(name).group(1)
            match.attributes = {"Subgraph": ("g", sub), **match.attributes}

    def param(self, st: _GraphState, block: Block, scope: dict) -> None:
        name, pos = self.value_name()
        self.sc.expect(":", f"after %{name}")
        self.define(st, name, pos)
        scope[name] = block.add_input(name, parse_type(self.sc))

    # ----- statements --------------------------------------------------------------------
    def stmts(self, st: _GraphState, block: Block, scopes: list, end: str) -> None:
        sc = self.sc
        while True:
            c = sc.peek_char()
            if c == "%" or c == "=":
                self.node(st, block, scopes)
            elif c == "" or sc.peek(end):
                return
            else:
                what = "`return`" if end == "return" else "`->`"
                raise sc.error(f"expected a node or {what}, found {sc.found()}")

    def node(self, st: _GraphState, block: Block, scopes: list) -> None:
        sc = self.sc
        start = sc.pos
        outs = []
        if sc.peek_char() == "%":
            while True:
                name, pos = self.value_name()
                sc.expect(":", f"after %{name}")
                outs.append((name, pos, parse_type(sc)))
                if not sc.accept(","):
                    break
        sc.expect("=", "after the node outputs")
        kind = sc.expect_match(KIND, "an operator name like `aten::add`").group(0)
        n = Node(st.graph, kind)
        n.src_line, n.src_col = sc.loc(start)
        if sc.accept("["):
            self.attributes(n)
        sc.expect("(", f"to open the inputs of {kind}")
        for v in self.value_list_body(st, scopes, kind):
            n.add_input(v)
        self.trailer(n)
        block.append_node(n)
        for name, pos, type_ in outs:
            self.define(st, name, pos)
        for name, pos, type_ in outs:
            scopes[-1][name] = n.add_output(type_, name)
        if kind == "prim::Constant":
            _refine_constant(n)
        if _GROUP_REF.match(kind):
            st.groups.append(n)
        while sc.peek_match(BLOCK):
            self.block(st, n, scopes, len(n.blocks))
        _check_blocks(self.sc, n, start)

    def trailer(self, n: Node) -> None:
        """`, scope: __module.x` and the `# file:line:col` comment after a node."""
        sc = self.sc
        m = re.compile(r"[ \t]*,[ \t]*scope[ \t]*:").match(sc.text, sc.pos)
        if m:
            sc.pos = m.end()
            n.scope = sc.rest_of_line()
        m = re.compile(r"[ \t]*#([^\n]*)").match(sc.text, sc.pos)
        if m:
            n.source = m.group(1).strip()

    def block(self, st: _GraphState, n: Node, scopes: list, index: int) -> None:
        sc = self.sc
        m = sc.match(BLOCK)
        if len(scopes) > MAX_BLOCK_DEPTH:
            raise sc.error(f"blocks nested more than {MAX_BLOCK_DEPTH} levels deep", m.start())
        if int(m.group(1)) != index:
            raise sc.error(f"expected block{index}, found block{m.group(1)}", m.start())
        b = n.add_block()
        scope: dict = {}
        sc.expect("(", "after the block name")
        if not sc.accept(")"):
            while True:
                self.param(st, b, scope)
                if sc.accept(")"):
                    break
                sc.expect(",", "or `)` after a block input")
        sc.expect(":", "after the block inputs")
        self.stmts(st, b, scopes + [scope], "->")
        arrow = sc.pos
        sc.expect("->", "to end the block")
        for v in self.value_list(st, scopes + [scope], "->"):
            b.register_output(v)
        b.arrow_pos = arrow

    def attributes(self, n: Node) -> None:
        sc = self.sc
        if sc.accept("]"):
            return
        while True:
            name = sc.expect_match(IDENT, "an attribute name").group(0)
            sc.expect("=", f"after attribute `{name}`")
            kind, value = parse_attr_value(sc)
            n.set_attr(name, kind, value)
            if sc.accept("]"):
                return
            sc.expect(",", "or `]` after an attribute")

    # ----- values ------------------------------------------------------------------------
    def value_name(self) -> tuple:
        m = self.sc.expect_match(VALUE, "a value name like `%x`")
        return m.group(1), m.start()

    def define(self, st: _GraphState, name: str, pos: int) -> None:
        if name in st.defined:
            raise self.sc.error(f"value %{name} is defined twice (first on line "
                                f"{st.defined[name]})", pos)
        st.defined[name] = self.sc.loc(pos)[0]

    def lookup(self, st: _GraphState, scopes: list, name: str, pos: int):
        for scope in reversed(scopes):
            if name in scope:
                return scope[name]
        if name in st.defined:
            raise self.sc.error(f"value %{name} is used outside the block that defines it", pos)
        raise self.sc.error(f"use of undefined value %{name}", pos)

    def value_list(self, st: _GraphState, scopes: list, what: str) -> list:
        self.sc.expect("(", f"after `{what}`")
        return self.value_list_body(st, scopes, what)

    def value_list_body(self, st: _GraphState, scopes: list, what: str) -> list:
        sc = self.sc
        vals = []
        if sc.accept(")"):
            return vals
        while True:
            name, pos = self.value_name()
            vals.append(self.lookup(st, scopes, name, pos))
            if sc.accept(")"):
                return vals
            sc.expect(",", f"or `)` in the value list of {what}")


def _refine_constant(n: Node) -> None:
    """Give a tensor constant the dtype/shape its declared type states."""
    a = n.attributes.get("value")
    if not a or a[0] != "t" or a[1] is None or len(n.outputs) != 1:
        return
    t, ty = a[1], n.output().type
    if isinstance(ty, TensorType):
        if ty.dtype is not None and ty.dtype != t.dtype:
            t = t.to(ty.dtype)
        if ty.sizes is not None and None not in ty.sizes and t.numel() == _prod(ty.sizes):
            t = t.reshape(ty.sizes)
        n.attributes["value"] = ("t", t)


def _prod(xs) -> int:
    p = 1
    for x in xs:
        p *= x
    return p


def _check_blocks(sc: Scanner, n: Node, start: int) -> None:
    """Block arity rules that can be known from the kind."""
    n_out = len(n.outputs)
    if n.kind == "prim::If":
        if len(n.blocks) != 2 or len(n.inputs) != 1:
            raise sc.error(f"prim::If needs 1 input and 2 blocks, has {len(n.inputs)} and "
                           f"{len(n.blocks)}", start)
        for b in n.blocks:
            if len(b.outputs) != n_out:
                raise sc.error(f"block returns {len(b.outputs)} values but the prim::If "
                               f"has {n_out} outputs", b.arrow_pos)
    elif n.kind == "prim::Loop":
        if len(n.blocks) != 1 or len(n.inputs) != n_out + 2:
            raise sc.error(f"prim::Loop with {n_out} outputs needs {n_out + 2} inputs and one "
                           f"block", start)
        b = n.blocks[0]
        if len(b.outputs) != n_out + 1 or len(b.inputs) != n_out + 1:
            raise sc.error(f"prim::Loop body must take and return {n_out + 1} values "
                           f"(takes {len(b.inputs)}, returns {len(b.outputs)})", b.arrow_pos)


def parse_ir(text: str, filename: str = "<string>") -> Graph:
    """Parse TorchScript IR text. Raises IRParseError (only) on any malformed input."""
    if not isinstance(text, str):
        raise TypeError("parse_ir expects a str")
    p = _Parser(text, filename)
    try:
        return p.parse_file()
    except IRParseError:
        raise
    except RecursionError:
        raise p.sc.error("nesting too deep") from None
    except Exception as e:  # an internal slip must still surface as a parse error
        raise p.sc.error(f"cannot parse here ({type(e).__name__}: {e})") from e
