"""Pass 3: alias ops become copies (`prim::<op>_copy`) so they can sit inside fusion groups.

`aten::view/reshape/...` (COPYABLE) turn into `prim::view_copy/...` when nothing writes the
storage their input or output share (AliasInfo.is_mutated); then a copy is as good as the
view and the fusion group may compute it. After fusion, `revert()` turns copies left outside
groups back into the alias ops (so eager code keeps views and costs nothing).
An alias op whose storage is written stays as it is, and (being an alias) is never fused; the
report says why. Invariant: a copy kind only exists where no write can tell it from a view.
"""
from __future__ import annotations

from .aliasing import AliasInfo

COPYABLE = ("view", "reshape", "squeeze", "unsqueeze", "flatten", "permute", "transpose", "t",
            "expand", "expand_as")
TO_COPY = {f"aten::{k}": f"prim::{k}_copy" for k in COPYABLE}
FROM_COPY = {v: k for k, v in TO_COPY.items()}


def to_copies(graph, report) -> int:
    info = AliasInfo(graph)
    changed = 0
    for node in list(graph.all_nodes()):
        kind = TO_COPY.get(node.kind)
        if kind is None:
            continue
        if info.is_mutated(node.inputs[0]) or any(info.is_mutated(o) for o in node.outputs):
            report.note(node, "alias op kept (its storage is written in place elsewhere in "
                              "the graph, so a copy would differ)")
            continue
        node.kind = kind
        changed += 1
    return changed


def revert(graph) -> int:
    """Copies outside fusion groups become alias ops again."""
    changed = 0
    for node in graph.all_nodes():
        kind = FROM_COPY.get(node.kind)
        if kind is not None:
            node.kind = kind
            changed += 1
    return changed
