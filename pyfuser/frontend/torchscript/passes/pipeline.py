"""The fuser's pass pipeline: `run_pipeline(graph, arg_limit=128) -> FuseReport`.

Order (each pass in its own module): inplace (functionalize) -> decompose (bias split) ->
alias_copy (views to copies) -> fusion_scan (groups) -> bias_join (groups of bias adds only go
back into their linear / conv) -> alias_copy.revert (copies left
outside groups back to views) -> shape_reads (size/dtype reads of group outputs move into the
group) -> cleanup (DCE/CSE, group outputs) -> candidates (every
unfused op the lowering table knows gets a reason in the report). With
`PYFUSER_DUMP=graph_passes` the graph is printed after each pass; with `fusion_groups`, each
group's subgraph and the unfused candidates with their reasons. The graph is changed in place
and linted at the end. Deterministic: the same graph in gives the same graph out.
"""
from __future__ import annotations

from ....dump import dump
from ...lowering import LOWERINGS
from . import alias_copy, bias_join, cleanup, decompose, fusion_scan, inplace, shape_reads
from .aliasing import AliasInfo
from .groups import fusible_reason, is_group
from .report import FuseReport
from ..types import TensorType


def _note_candidates(graph, report) -> None:
    info = AliasInfo(graph)
    for n in graph.all_nodes():
        if is_group(n) or n.kind in alias_copy.FROM_COPY or n.kind in alias_copy.TO_COPY:
            continue             # views left alone cost nothing; written ones are noted
        if not any(isinstance(v.type, TensorType) for v in n.inputs + n.outputs):
            continue             # arithmetic on host numbers (sizes, flags): not a candidate
        if n.kind in LOWERINGS or n.kind in inplace.INPLACE_TWINS:
            reason = fusible_reason(n, info) if n.kind in LOWERINGS else None
            report.note(n, reason or "left out of every group (no fusible neighbour it could "
                                     "move next to)")


def _groups_text(graph, report) -> str:
    lines = []
    groups = [n for n in graph.all_nodes() if is_group(n)]
    for i, g in enumerate(groups):
        ins = ", ".join("%" + v.debug_name for v in g.inputs)
        outs = ", ".join("%" + v.debug_name for v in g.outputs)
        lines.append(f"group {i}: ({ins}) -> ({outs})")
        lines.append(str(g.g("Subgraph")).rstrip())
    lines.append(report.text())
    return "\n".join(lines)


def run_pipeline(graph, arg_limit: int = fusion_scan.DEFAULT_ARG_LIMIT,
                 report: FuseReport | None = None) -> FuseReport:
    report = report or FuseReport()
    passes = [
        ("inplace", lambda: inplace.functionalize(graph, report)),
        ("decompose", lambda: decompose.split_bias(graph)),
        ("alias_copy", lambda: alias_copy.to_copies(graph, report)),
        ("fusion_scan", lambda: fusion_scan.fuse_groups(graph, report, arg_limit)),
        ("bias_join", lambda: bias_join.join_bias(graph)),
        ("alias_copy.revert", lambda: alias_copy.revert(graph)),
        ("shape_reads", lambda: shape_reads.sink_shape_reads(graph)),
        ("cleanup", lambda: cleanup.cleanup(graph)),
    ]
    for name, fn in passes:
        result = fn()
        dump("graph_passes", f"after {name} ({result})", lambda: str(graph))
    _note_candidates(graph, report)
    graph.lint()
    dump("fusion_groups", "fusion groups", lambda: _groups_text(graph, report))
    return report
