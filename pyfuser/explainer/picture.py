"""The graph around the fusion groups, as nodes and edges for the HTML view.

    graph_picture(fused_graph, group_nodes, unfused) -> Picture

Drawn: the graph's tensor inputs, each fusion group (one node, `group` = its index), each op
left outside the groups that computes tensors (fallbacks marked as such, views as plain ops) and
one node for the graph's outputs. Not drawn: constants, attribute reads (parameters), host-side
size arithmetic, and list / tuple packing, through which edges are followed to the values packed
(so a group feeding a returned tuple has its edge to the outputs). Ops inside `prim::If` /
`prim::Loop` bodies are drawn like the others, without the control structure.
"""
from __future__ import annotations

from .model import Picture, PictureNode

_CONTAINERS = {"prim::ListConstruct", "prim::TupleConstruct", "prim::ListUnpack",
               "prim::TupleUnpack", "prim::TupleIndex"}


def _drawn_op(node) -> bool:
    from ..frontend.torchscript.types import TensorType
    if node.kind.startswith("prim::") and not node.kind.endswith("_copy") and \
            node.kind not in ("prim::add_optional", "prim::inplace_cast"):
        return False
    return any(isinstance(o.type, TensorType) for o in node.outputs)


def graph_picture(graph, group_nodes, unfused) -> Picture:
    from ..frontend.torchscript.passes.report import describe
    from ..frontend.torchscript.types import TensorType
    pic = Picture()
    ident: dict = {}                    # Node or graph input Value -> picture ident
    fallback_of = {n: fb for n, fb in unfused}
    for k, v in enumerate(graph.inputs):
        if isinstance(v.type, TensorType):
            ident[v] = f"in{k}"
            pic.nodes.append(PictureNode(f"in{k}", "%" + v.debug_name, "input",
                                         title=f"graph input %{v.debug_name}: {v.type}"))
    group_index = {n: i for i, n in enumerate(group_nodes)}
    for k, n in enumerate(graph.all_nodes()):
        if n in group_index:
            i = group_index[n]
            ident[n] = f"g{i}"
            pic.nodes.append(PictureNode(f"g{i}", f"group {i}", "group", group=i,
                                         title=describe(n)))
        elif n in fallback_of:
            ident[n] = f"n{k}"
            fb = fallback_of[n]
            fb.ident = f"n{k}"
            kind = "fallback" if fb.category == "not fused" else "eager"
            pic.nodes.append(PictureNode(f"n{k}", n.kind.split("::")[-1], kind,
                                         title=f"{fb.node}: {fb.reason}"))
        elif _drawn_op(n):
            ident[n] = f"n{k}"
            pic.nodes.append(PictureNode(f"n{k}", n.kind.split("::")[-1], "op", title=describe(n)))
    pic.nodes.append(PictureNode("out", "outputs", "output", title="the graph's outputs"))
    seen = set()

    def sources(v, depth=0):
        if v in ident:
            return [ident[v]]
        p = v.node
        if p in ident:
            return [ident[p]]
        if p.kind in _CONTAINERS and depth < 4:
            return [s for w in p.inputs for s in sources(w, depth + 1)]
        return []

    def edge(a, b):
        if a != b and (a, b) not in seen:
            seen.add((a, b))
            pic.edges.append((a, b))

    for n in graph.all_nodes():
        if n not in ident:
            continue
        for v in n.inputs:
            for s in sources(v):
                edge(s, ident[n])
    for v in graph.outputs:
        for s in sources(v):
            edge(s, "out")
    return pic
