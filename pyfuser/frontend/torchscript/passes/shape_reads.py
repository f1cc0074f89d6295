"""Pass 5 (before cleanup): size and dtype reads of a group's outputs move into the group.

A group output that is read only by `aten::size(t)`, `aten::size(t, <constant dim>)` or
`prim::dtype(t)` need not be written to memory. Those reads are cloned into the group's
subgraph, whose new outputs are their int / int[] results; the tensor output, now unused, is
dropped by cleanup (its computation stays inside the group only as far as the reads need it).
A fused group answers the reads on the host (lowering.HostValue: the dtype is static, the sizes
come from the Fusion's shape bindings); an eager fallback runs the moved nodes like any other.
(nvFuser's graph fuser drops outputs read only by dtype and computes sizes from shape
expressions.)

Invariant: the graph computes the same values after this pass.
"""
from __future__ import annotations

from .groups import is_group

SHAPE_READS = ("aten::size", "prim::dtype")


def _movable(node, out) -> bool:
    """`node` reads only the size or dtype of `out` (with a constant dim, if any)."""
    if node.kind not in SHAPE_READS or not node.inputs or node.inputs[0] is not out \
            or len(node.outputs) != 1 or node.blocks:
        return False
    if node.kind == "prim::dtype":
        return len(node.inputs) == 1
    if len(node.inputs) == 1:
        return True
    return len(node.inputs) == 2 and node.inputs[1].node.kind == "prim::Constant"


def sink_shape_reads(graph) -> int:
    """Move every movable size/dtype read of a group output into its group; returns how many."""
    moved = 0
    for group in [n for n in graph.all_nodes() if is_group(n)]:
        sg = group.g("Subgraph")
        for k, out in enumerate(list(group.outputs)):
            users = [u.user for u in out.uses]
            if not users or not all(_movable(u, out) for u in users):
                continue
            inner_t = sg.outputs[k]
            for u in users:
                consts: dict = {}

                def inner(v, out=out, inner_t=inner_t, consts=consts):
                    if v is out:
                        return inner_t
                    if v not in consts:             # a constant dim: cloned into the subgraph
                        c = sg.create_clone(v.node, lambda x: x)
                        sg.block.append_node(c)
                        consts[v] = c.output()
                    return consts[v]
                c = sg.create_clone(u, inner)
                sg.block.append_node(c)
                sg.register_output(c.output())
                new = group.add_output(u.output().type)
                u.output().replace_all_uses_with(new)
                u.destroy()
                moved += 1
    return moved
