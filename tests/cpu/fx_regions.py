"""Test helpers for torch.compile graphs: where the views of a region sit (frontend/fx/
partition.py keeps reshapes at a region's ends in it, as host views of the fusion; one between
two compute ops of the region is index arithmetic in a kernel, which the FX rewrites try to
avoid), and what a compiled graph calls."""
from __future__ import annotations

from pyfuser.frontend.fx.support import is_getitem, op_class
from pyfuser.frontend.lowering.registry import METADATA


_RESHAPES = ("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default")


def views_between_compute(region) -> list:
    """Names of the reshaping views (`view`, `_unsafe_view`, `reshape`) of `region` (a
    FusedRegion) that read a compute node of the region and are read by one, each directly or
    through other views of the region (broadcasting views, `unsqueeze` / `expand`, are part of
    a computation and not counted)."""
    nodes = region.region.nodes
    members = set(nodes)

    def is_view(n):
        return op_class(n) == METADATA

    def is_compute(n):
        return not is_view(n) and not is_getitem(n)

    def reaches(n, step) -> bool:
        todo, seen = list(step(n)), set()
        while todo:
            m = todo.pop()
            if m in seen or m not in members:
                continue
            seen.add(m)
            if is_compute(m) or (is_getitem(m) and step is _inputs):
                return True
            if is_view(m):
                todo.extend(step(m))
        return False

    return [n.name for n in nodes if str(n.target) in _RESHAPES and reaches(n, _inputs)
            and reaches(n, _users)]


def graph_targets(g) -> list:
    """The targets of a compiled graph's calls (functions and methods), in graph order."""
    return [n.target for n in g.gm.graph.nodes if n.op in ("call_function", "call_method")]


def _inputs(n):
    return n.all_input_nodes


def _users(n):
    return list(n.users)
