"""Pass 4b: bias adds that fused with nothing go back into their linear / conv.

The bias split (decompose.py) turns `linear(x, w, b)` into `linear(x, w, None)` plus
`prim::add_optional(y0, b)` so that the add can fuse with what follows. Where the fusion scan
gave the add nothing to fuse with (the group holds only such bias adds, views of their results,
and constants / size reads), the group would be a kernel of its own after a GEMM that could
have added the bias itself: one kernel more than eager (BERT's Q/K/V projections). Such a
group is dissolved: its nodes return to the enclosing block, each bias add is removed and its
bias goes back to its op (`linear(x, w, b)`, conv's 1-D bias: the root of the unsqueezes the
split made), and the view copies become views again in alias_copy.revert.

Invariant: the graph computes the same values (the op with its bias is what the graph said
before the split); a group with any other compute is left alone.
"""
from __future__ import annotations

from .alias_copy import FROM_COPY
from .decompose import BIAS_SPLITS
from .groups import is_group

_NEUTRAL = {"prim::Constant", "prim::ListConstruct", "prim::TupleConstruct", "aten::size",
            "prim::dtype", "aten::unsqueeze"} | set(FROM_COPY)
_UNSQUEEZE = ("aten::unsqueeze", "prim::unsqueeze_copy")


def _split_op(v):
    """The bias-split op whose output `v` is (outside the group), or None."""
    n = v.node
    spec = BIAS_SPLITS.get(n.kind)
    if spec is None or len(n.outputs) != 1 or len(n.inputs) <= spec[0]:
        return None
    bias = n.inputs[spec[0]]
    if bias.node.kind != "prim::Constant" or bias.node.has_attr("value"):
        return None                       # not a None bias: not made by the split
    return n if len(v.uses) == 1 else None


def _outer_root(v, depth: int):
    """Follow unsqueezes outside the group (when the split's unsqueezes were not absorbed)."""
    for _ in range(depth):
        n = v.node
        if n.kind not in _UNSQUEEZE:
            return None
        v = n.inputs[0]
    return v


def _joinable(group):
    """[(add node in the subgraph, split op, root bias)] when the group holds nothing but bias
    adds that can go back into their ops (and neutral nodes); else None."""
    sg = group.g("Subgraph")
    adds = []
    for n in sg.nodes():
        if n.kind in _NEUTRAL:
            continue
        if n.kind != "prim::add_optional" or len(n.inputs) != 2:
            return None
        a, b = n.inputs
        if a not in sg.inputs or len(a.uses) != 1:
            return None
        outer_a = group.inputs[list(sg.inputs).index(a)]
        op = _split_op(outer_a)
        if op is None:
            return None
        depth = BIAS_SPLITS[op.kind][1]
        # the unsqueezes may be inside the group (from a group input) or outside it
        k, v = 0, b
        while k < depth and v.node.kind in _UNSQUEEZE:
            v, k = v.node.inputs[0], k + 1
        if v not in sg.inputs:
            return None
        root = _outer_root(group.inputs[list(sg.inputs).index(v)], depth - k)
        if root is None:
            return None
        adds.append((n, op, root))
    return adds or None


def _dissolve(group) -> dict:
    """Move the group's nodes in front of it; returns subgraph value -> outer value."""
    sg = group.g("Subgraph")
    g = group.graph
    env = dict(zip(sg.inputs, group.inputs))
    for n in sg.nodes():
        c = g.create_clone(n, lambda v: env[v])
        c.insert_before(group)
        for o, co in zip(n.outputs, c.outputs):
            env[o] = co
    for o, so in zip(group.outputs, sg.outputs):
        new = env[so]
        if o.type is not None and new.type is not None and type(new.type) is type(o.type):
            new.type = o.type
        o.replace_all_uses_with(new)
    group.destroy()
    return env


def join_block(block) -> int:
    joined = 0
    for node in list(block.nodes()):
        for b in node.blocks:
            joined += join_block(b)
        if not is_group(node):
            continue
        adds = _joinable(node)
        if adds is None:
            continue
        env = _dissolve(node)
        for add, op, root in adds:
            outer_add = env[add.output()]
            pos = BIAS_SPLITS[op.kind][0]
            op.replace_input(pos, root)
            y = op.output()
            y.type = outer_add.type
            outer_add.replace_all_uses_with(y)
            outer_add.node.destroy()
        joined += len(adds)
    return joined


def join_bias(graph) -> int:
    """Dissolve groups of bias adds only; returns how many adds went back into their ops."""
    return join_block(graph.block)
