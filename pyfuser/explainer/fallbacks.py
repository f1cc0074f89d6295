"""The ops of a fused TorchScript graph that compute tensors outside every group, and why.

    unfused_ops(compiled) -> [(node, FallbackInfo)]

Two kinds:
- "not fused": fusion candidates (ops the lowering table knows, in-place twins, alias ops) that
  the passes left out, with the passes' reason (FuseReport);
- "no lowering": ops pyfuser has no lowering for (matmul, convolution, embedding, attention...),
  which run in eager PyTorch;
- "view": such ops that are views in eager PyTorch too (slice, select...: no kernel, no copy).
Views pyfuser knows that stay outside the groups and host-side prim ops are not listed.

`blocker` names the op that kept it out when that is another op: the op that writes in place
the storage a view or alias would share, the graph input an in-place op mutates, the view that
aliases an in-place op's operand, or, for an op left with no fusible neighbour, its neighbours
that cannot be fused. None means the op itself is the reason (no lowering, an unsupported
argument, a training batch norm's running statistics...).
"""
from __future__ import annotations

from .model import Blocker, FallbackInfo

_SKIP = {"prim::Constant", "prim::GetAttr", "prim::ListConstruct", "prim::TupleConstruct",
         "prim::ListUnpack", "prim::TupleUnpack", "prim::If", "prim::Loop"}


def _tensor_out(node) -> bool:
    from ..frontend.torchscript.types import TensorType
    return any(isinstance(o.type, TensorType) for o in node.outputs)


def unfused_ops(compiled) -> list:
    from ..frontend.lowering import LOWERINGS
    from ..frontend.torchscript.passes.aliasing import AliasInfo
    from ..frontend.torchscript.passes.alias_copy import TO_COPY
    from ..frontend.torchscript.passes.groups import fusible_reason, is_group
    from ..frontend.torchscript.passes.report import describe
    graph, report = compiled.graph, compiled.report
    info = AliasInfo(graph)
    out = []
    for n in graph.all_nodes():
        if is_group(n) or n.kind in _SKIP:
            continue
        reason = report.reason(n)
        if reason is None:
            if not _tensor_out(n) or n.kind.startswith("prim::") or n.kind in TO_COPY:
                continue
            if n.kind in LOWERINGS:
                reason = fusible_reason(n, info)
                if reason is None:
                    continue
                category = "not fused"
            elif _is_view(n):
                reason = "a view (no lowering): no kernel and no copy in eager PyTorch either"
                category = "view"
            else:
                reason = "no lowering: pyfuser does not fuse this op; eager PyTorch runs it"
                category = "no lowering"
        else:
            category = "not fused"
        out.append((n, FallbackInfo(describe(n), n.kind, reason, category,
                                    _blocker(n, reason, info, graph))))
    return out


def _is_view(node) -> bool:
    """Its schema says output 0 may alias an argument and it writes nothing (slice, select...)."""
    from ..frontend.torchscript.passes.aliasing import WILDCARD, node_effects
    e = node_effects(node)
    return not e.opaque and not e.writes and bool(e.aliases) and e.aliases[0] != WILDCARD \
        and bool(e.aliases[0])


def _short(node) -> str:
    from ..frontend.torchscript.passes.report import describe
    return describe(node)


def _writers(values, info, graph, skip):
    for m in graph.all_nodes():
        if m is not skip and info.conflicts(m, values):
            yield m


def _blocker(n, reason: str, info, graph):
    if reason.startswith("in-place op kept"):
        x = n.inputs[0]
        p = x.node
        if p.kind == "prim::Param":
            return Blocker(f"graph input %{x.debug_name}",
                           "the caller sees the mutation, so the in-place write must stay")
        for use in x.uses:
            u = use.user
            if u is not n and not u.is_after(n) and "aliased by" in reason:
                from ..frontend.torchscript.passes.aliasing import creates_alias
                if creates_alias(u, x):
                    return Blocker(_short(u), f"it shares the storage of %{x.debug_name}")
        return Blocker(_short(p), f"it makes %{x.debug_name}, which may alias another tensor")
    if reason.startswith("alias op kept") or "may alias a tensor that is written" in reason:
        vals = list(n.inputs[:1]) + list(n.outputs)
        for m in _writers(vals, info, graph, n):
            return Blocker(_short(m), "it writes this storage in place")
        return None
    if reason.startswith("left out of every group"):
        return _neighbours(n)
    return None


def _neighbours(n):
    """The producers / users of `n` that cannot be fused (why it has no group to join)."""
    from ..frontend.lowering import LOWERINGS
    from ..frontend.torchscript.passes.groups import is_group
    around = [v.node for v in n.inputs] + [u.user for o in n.outputs for u in o.uses]
    blocked = [m for m in around if m.kind not in ("prim::Param", "prim::Constant", "prim::Return")
               and not is_group(m)]
    if not blocked:
        return None
    m = blocked[0]
    why = "not fusible" if m.kind in LOWERINGS else f"{m.kind} has no lowering"
    more = f" (and {len(blocked) - 1} more)" if len(blocked) > 1 else ""
    return Blocker(_short(m) + more, why)
