"""What the passes tell the user: why an op stayed out of fusion.

A FuseReport is filled by the passes of one pipeline run: `note(node, reason)` records one
unfused candidate op (once per node); `fallbacks()` lists them as dicts {node, kind, reason}
for `last_run.fallbacks` and the CLI's JSON. The text of each note is also dumped under
`fusion_groups`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..printer import node_line


def describe(node) -> str:
    outs = ", ".join("%" + v.debug_name for v in node.outputs)
    line = f" (line {node.src_line})" if node.src_line else ""
    return f"{node.kind}{line}" + (f" -> {outs}" if outs else "")


@dataclass
class FuseReport:
    notes: dict = field(default_factory=dict)       # node -> reason (first one wins)
    order: list = field(default_factory=list)

    def note(self, node, reason: str) -> None:
        if node not in self.notes:
            self.notes[node] = reason
            self.order.append((describe(node), node.kind, reason, node_line(node)))

    def reason(self, node):
        return self.notes.get(node)

    def fallbacks(self) -> list:
        return [{"node": d, "kind": k, "reason": r} for d, k, r, _ in self.order]

    def text(self) -> str:
        return "\n".join(f"not fused: {d}: {r}\n    {line}" for d, _, r, line in self.order) \
            or "every candidate op was fused"
