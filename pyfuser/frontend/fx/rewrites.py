"""Graph rewrites before partitioning (the torch.compile backend), each one keeping every value
the graph computes equal to eager's: same values, dtypes, shapes and strides.

`sink_views(graph)`: a dtype cast of a view (`_to_copy(view(x, shape), dtype=d)`, what autocast
writes after a layer norm or a projection whose result is flattened for a matmul) becomes a view
of the cast (`view(_to_copy(x, dtype=d), shape)`). The cast then reads the value its producer
computes, in the producer's shape, so both fuse into one kernel (a reduction kernel accepts no
view between its compute ops), and the view moves to the region's end, where it is a free eager
view. Only where `x` is contiguous (the cast of a contiguous tensor is contiguous, so the view
is valid and both orders give the same contiguous result) and the cast changes nothing but the
dtype.

Invariant: a rewrite never adds a kernel to the graph; nodes it makes carry `meta["val"]`.
"""
from __future__ import annotations

import torch

_aten = torch.ops.aten
_VIEWS = (_aten.view.default, _aten._unsafe_view.default)
_CAST = _aten._to_copy.default


def _dtype_only_cast(node) -> bool:
    if node.op != "call_function" or node.target is not _CAST or len(node.args) != 1:
        return False
    extra = {k: v for k, v in node.kwargs.items() if k != "dtype"}
    val = node.meta.get("val")
    src = node.args[0].meta.get("val") if isinstance(node.args[0], torch.fx.Node) else None
    if not isinstance(val, torch.Tensor) or not isinstance(src, torch.Tensor):
        return False
    same_place = extra.get("device", src.device) == src.device and \
        extra.get("layout", torch.strided) == torch.strided and \
        extra.get("memory_format") in (None, torch.preserve_format, torch.contiguous_format)
    allowed = set(extra) <= {"device", "layout", "memory_format", "pin_memory"}
    return allowed and same_place and not extra.get("pin_memory", False)


def _contiguous(node) -> bool:
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    if not isinstance(val, torch.Tensor):
        return False
    try:
        return bool(val.is_contiguous())
    except Exception:        # a symbolic stride that cannot be decided: leave the graph alone
        return False


def sink_views(graph: torch.fx.Graph) -> int:
    """Apply the rewrite of the module docstring; returns how many casts moved."""
    moved = 0
    for view in list(graph.nodes):
        if view.op != "call_function" or view.target not in _VIEWS or not view.users:
            continue
        src = view.args[0]
        if not _contiguous(src) or not all(_dtype_only_cast(u) for u in view.users):
            continue
        for cast in list(view.users):
            with graph.inserting_before(cast):
                early = graph.call_function(_CAST, (src,), dict(cast.kwargs))
                early.meta = {k: v for k, v in cast.meta.items() if k != "val"}
                early.meta["val"] = src.meta["val"].to(cast.meta["val"].dtype)
                late = graph.call_function(view.target, (early, *view.args[1:]), dict(view.kwargs))
                late.meta = dict(cast.meta)
            cast.replace_all_uses_with(late)
            graph.erase_node(cast)
            moved += 1
        if not view.users:
            graph.erase_node(view)
    return moved
