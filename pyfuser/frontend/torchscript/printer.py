"""Printer of a Graph in PyTorch's IR text format (the parser's input language).

Layout as PyTorch: graph inputs one per line (continuation lines indented 6), nodes indented
2 spaces per block level, `blockN(...)`/`-> (...)` for nested blocks, `return (...)`. Nodes
with a `Subgraph` graph attribute print as `kind_N(...)` and their bodies follow the graph as
`with kind_N = graph(...)` (numbered per printed graph, in print order; nested groups print
right after their own graph). Source comments and trace scopes are printed only when asked
(`with_source=True`). Invariant: parse_ir(print_graph(g)) is structurally equal to g.
"""
from __future__ import annotations

import enum

from .literals import format_complex, format_float, format_string, format_tensor
from .types import JitType, enum_class_name


def _fmt_value(kind: str, v) -> str:
    if kind == "i":
        return str(int(v))
    if kind == "f":
        return format_float(v)
    if kind == "s":
        return format_string(v)
    if kind == "c":
        return format_complex(v)
    if kind == "t":
        return format_tensor(v)
    if kind == "g":
        return "<Graph>"
    if kind == "ty":
        return str(v)
    if kind == "ts" and v is None:
        return "[<Tensors>]"
    if kind in ("is", "fs", "ss", "cs", "ts", "gs", "tys"):
        return "[" + ", ".join(_fmt_value(kind[:-1], e) for e in v) + "]"
    return _fmt_ival(v)


def _fmt_ival(v) -> str:
    import torch
    if v is None:
        return "None"
    if isinstance(v, bool):
        return "True" if v else "False"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return format_float(v)
    if isinstance(v, complex):
        return format_complex(v)
    if isinstance(v, str):
        return format_string(v)
    if isinstance(v, torch.Tensor):
        return format_tensor(v)
    if isinstance(v, torch.device):
        return format_string(str(v))
    if isinstance(v, list):
        return "[" + ", ".join(_fmt_ival(e) for e in v) + "]"
    if isinstance(v, tuple):
        inner = ", ".join(_fmt_ival(e) for e in v)
        return "(" + inner + ("," if len(v) == 1 else "") + ")"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_fmt_ival(k)}: {_fmt_ival(e)}" for k, e in v.items()) + "}"
    if isinstance(v, enum.Enum):
        return f"{enum_class_name(type(v))}.{v.name}"
    if isinstance(v, JitType):
        return str(v)
    raise ValueError(f"cannot print attribute value {v!r}")


def _attrs(node, skip_subgraph: bool) -> str:
    items = [(k, kv) for k, kv in node.attributes.items()
             if not (skip_subgraph and k == "Subgraph")]
    if not items:
        return ""
    return "[" + ", ".join(f"{k}={_fmt_value(kind, v)}" for k, (kind, v) in items) + "]"


def _is_group(node) -> bool:
    a = node.attributes.get("Subgraph")
    return a is not None and a[0] == "g" and a[1] is not None


def _values(vals) -> str:
    return ", ".join(f"%{v.debug_name}" for v in vals)


def _typed(vals, sep: str) -> str:
    return sep.join(f"%{v.debug_name} : {v.type}" for v in vals)


def node_line(node, group_index=None, with_source: bool = False) -> str:
    """One node as one line (no indentation, no blocks)."""
    if group_index is not None:
        kind = f"{node.kind}_{group_index}" + _attrs(node, True)
    else:
        kind = node.kind + _attrs(node, False)
    line = f"{_typed(node.outputs, ', ')} = {kind}({_values(node.inputs)})"
    if with_source:
        if node.scope:
            line += f", scope: {node.scope}"
        if node.source:
            line += f" # {node.source}"
    return line


class _Printer:
    def __init__(self, with_source: bool):
        self.with_source = with_source
        self.lines: list[str] = []

    def graph(self, g, header: str = "") -> None:
        groups: list = []
        self.lines.append(f"{header}graph({_typed(g.inputs, ',' + chr(10) + '      ')}):")
        self.block_body(g.block, 1, groups)
        self.lines.append(f"  return ({_values(g.outputs)})")
        for i, n in enumerate(groups):
            self.graph(n.attributes["Subgraph"][1], f"with {n.kind}_{i} = ")

    def block_body(self, block, level: int, groups: list) -> None:
        pad = "  " * level
        for n in block.nodes():
            idx = None
            if _is_group(n):
                idx = len(groups)
                groups.append(n)
            self.lines.append(pad + node_line(n, idx, self.with_source))
            for i, b in enumerate(n.blocks):
                self.lines.append(f"{pad}  block{i}({_typed(b.inputs, ', ')}):")
                self.block_body(b, level + 2, groups)
                self.lines.append(f"{pad}    -> ({_values(b.outputs)})")


def print_graph(graph, with_source: bool = False) -> str:
    """The graph as IR text (ends with a newline)."""
    p = _Printer(with_source)
    p.graph(graph)
    return "\n".join(p.lines) + "\n"
