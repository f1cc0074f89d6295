"""Fusion-group nodes: what may enter one, making one, and absorbing nodes into one.

A group is `prim::PyfuserGroup` whose `Subgraph` attribute is a separate Graph: the group's
inputs are the subgraph's inputs (same order), its outputs the subgraph's outputs. Constants a
group needs are cloned into its subgraph (tensor constants become inputs); int/float/bool values that are not constants
become group inputs like tensors. A list/tuple construct of constants and such values (view
sizes made of `aten::size` results) is rebuilt inside the group from them, so the group takes
the ints, not a list (the group is specialised on values used as sizes: lowering.specialised_inputs).
So is a list of tensors (a cat's or stack's operands): the group takes the tensors, and the
list outside, once no one reads it, is removed (its items' producers can then join the group).

`fusible(node, info)` is the one place that decides which ops may be grouped:
FUSIBLE_CLASSES (op classes of the lowering table: pointwise, metadata, reductions and
normalizations, which the reduction-family schedulers run), plus: no write to an input (a
training batch_norm's running statistics: group bodies keep data order, not write order), lowerable (node_support), tensor outputs only, not
an alias op (only their `prim::*_copy` forms), and no output that may alias a written tensor.
Invariant of `absorb(group, node)`: `node` lies before `group` in the same block and no
node between them uses its outputs; after it, the graph computes the same values.
"""
from __future__ import annotations

from ...lowering import LOWERINGS, node_support
from ...lowering.lower import is_constant, is_host_value, is_tensor_list
from ...lowering.registry import METADATA, NORMALIZATION, POINTWISE, REDUCTION
from ..graph import Graph
from ..types import TensorType
from .alias_copy import TO_COPY
from .aliasing import node_effects

GROUP_KIND = "prim::PyfuserGroup"
_LIST_KINDS = ("prim::ListConstruct", "prim::TupleConstruct")
FUSIBLE_CLASSES = frozenset({POINTWISE, METADATA, REDUCTION, NORMALIZATION})


def is_group(node) -> bool:
    return node.kind == GROUP_KIND


def fusible_reason(node, info):
    """None when `node` may join a fusion group, else why not."""
    entry = LOWERINGS.get(node.kind)
    if entry is None:
        return f"{node.kind} has no lowering"
    op_class = entry.class_of(node)
    if op_class not in FUSIBLE_CLASSES:
        return f"{op_class} ops are not grouped yet (no {op_class} scheduler)"
    if node.kind in TO_COPY:
        return "alias op whose storage is written elsewhere"
    if is_shape_arithmetic(node):
        return "arithmetic on sizes (0-dim tensors of prim::NumToTensor) stays on the host"
    ok, reason = node_support(node)
    if not ok:
        return reason
    if not node.outputs or not all(isinstance(o.type, TensorType) for o in node.outputs):
        return "an output is not a tensor"
    e = node_effects(node)
    if e.opaque or (e.writes and not _running_stats_only(node, e)):
        return "it writes a tensor in place"
    if e.aliases and any(info.is_mutated(o) for o in node.outputs):
        return "its output may alias a tensor that is written in place"
    return None


def _running_stats_only(node, e) -> bool:
    """A training batch norm writes only its running statistics, which its lowering updates
    in place (in-place outputs of the group's Fusion); the group then writes them."""
    from .aliasing import RUNNING_STATS
    spec = RUNNING_STATS.get(node.kind)
    return node.kind in ("aten::batch_norm", "aten::native_batch_norm") and spec is not None \
        and e.writes <= spec[1]


def is_shape_arithmetic(node) -> bool:
    """A traced computation on sizes: every tensor operand is a `prim::NumToTensor` result (a
    0-dim host tensor), a 0-dim constant, or such arithmetic itself. A kernel for it would be a
    launch per size computation (and traced ones are CPU tensors even on a GPU model)."""
    tensors = [v for v in node.inputs if isinstance(v.type, TensorType)]
    return bool(tensors) and all(_is_host_scalar(v, 0) for v in tensors) and \
        any(_is_host_scalar(v, 0) and v.node.kind != "prim::Constant" for v in tensors)


def _is_host_scalar(v, depth: int) -> bool:
    n = v.node
    if n.kind == "prim::NumToTensor":
        return True
    if n.kind == "prim::Constant":
        t = v.type
        return isinstance(t, TensorType) and t.sizes == ()
    if depth > 8 or n.kind not in LOWERINGS:
        return False
    tensors = [i for i in n.inputs if isinstance(i.type, TensorType)]
    return bool(tensors) and all(_is_host_scalar(i, depth + 1) for i in tensors)


def has_compute(node) -> bool:
    if is_group(node):
        return any(has_compute(n) for n in node.g("Subgraph").nodes())
    e = LOWERINGS.get(node.kind)
    return e is not None and e.class_of(node) != METADATA


def make_group(node, info):
    """Wrap a fusible node into a singleton group at its place; returns the group."""
    g = node.graph
    group = g.create("prim::PyfuserGroup", [], 0)
    group.set_g("Subgraph", Graph())
    group.insert_before(node)
    absorb(group, node, info)
    return group


def absorb(group, node, info) -> None:
    """Move `node` (a fusible node or a group) into `group`, just ahead of its body."""
    sg = group.g("Subgraph")
    anchor = sg.block.param_node.next
    consts: dict = {}

    lists: list = []

    def inner(v):
        if v.node.kind in _LIST_KINDS and (is_constant(v) or is_host_value(v) or
                                           is_tensor_list(v)):
            if v not in consts:                 # sizes / dims / cat's operands: the list is
                c = sg.create_clone(v.node, inner)      # built in the group from its items
                c.insert_before(anchor)
                consts[v] = c.output()
                if is_tensor_list(v):
                    lists.append(v)
            return consts[v]
        if v.node.kind == "prim::Constant" and not isinstance(v.type, TensorType):
            if v not in consts:
                c = sg.create_clone(v.node, lambda x: x)
                c.insert_before(anchor)
                consts[v] = c.output()
            return consts[v]
        for i, gi in enumerate(group.inputs):
            if gi is v:
                return sg.inputs[i]
        group.add_input(v)
        return sg.add_input(None, v.type)

    if is_group(node):
        src = node.g("Subgraph")
        env = {si: inner(oi) for si, oi in zip(src.inputs, node.inputs)}
        for n in src.nodes():
            c = sg.create_clone(n, lambda v: env[v])
            c.insert_before(anchor)
            for o, co in zip(n.outputs, c.outputs):
                env[o] = co
        made = [env[v] for v in src.outputs]
    else:
        c = sg.create_clone(node, inner)
        c.insert_before(anchor)
        made = list(c.outputs)
    for outer, inner_v in zip(node.outputs, made):
        for i in reversed(range(len(group.inputs))):
            if group.inputs[i] is outer:
                sg.inputs[i].replace_all_uses_with(inner_v)
                sg.erase_input(i)
                group.remove_input(i)
        if outer.uses:
            sg.register_output(inner_v)
            new = group.add_output(outer.type if isinstance(outer.type, TensorType) else None)
            outer.replace_all_uses_with(new)
            if info is not None:
                info.inherit(new, outer)
    node.destroy()
    for v in lists:                             # a tensor list no one else reads: gone, so its
        if not v.uses:                          # items' producers see the group as their user
            v.node.destroy()


def arg_count_after(producer, consumer) -> int:
    """Inputs + outputs of the group that merging producer into consumer would make."""
    p_out = set(producer.outputs)
    ins = {v for v in consumer.inputs if v not in p_out and v.node.kind != "prim::Constant"}
    ins |= {v for v in producer.inputs if v.node.kind != "prim::Constant"}
    outs = len(consumer.outputs)
    for o in producer.outputs:
        if any(u.user is not consumer for u in o.uses):
            outs += 1
    return len(ins) + outs
