"""Pass 5: clean up after fusion: unused group outputs/inputs, dead code, common subexpressions.

* Group outputs nothing uses are dropped (from the group node and its subgraph), then dead
  nodes inside subgraphs, then unused group inputs. (An output read only by `aten::size` or
  `prim::dtype` has no use left here: shape_reads.py moved those reads into the group.)
* Dead code elimination: a node goes when no output is used and it has no effect (writes,
  side effects, opaque calls, blocks are kept) — see aliasing.is_writer.
* Common subexpression elimination, per block (a nested block also sees the outer block's
  nodes): two nodes with the same kind, inputs, attributes and output types become one, when
  the op is pure (no writes, no randomness: NONDETERMINISTIC) and no output may alias a
  tensor that is written in place (else sharing would leak the write).
Invariant: the graph computes the same values after this pass.
"""
from __future__ import annotations

from .aliasing import AliasInfo, is_writer
from .groups import is_group

NONDETERMINISTIC = {"aten::rand", "aten::randn", "aten::rand_like", "aten::randn_like",
                    "aten::randint", "aten::randint_like", "aten::randperm", "aten::bernoulli",
                    "aten::multinomial", "aten::normal", "aten::poisson", "aten::dropout",
                    "aten::feature_dropout", "aten::alpha_dropout", "aten::rrelu",
                    "prim::Uninitialized", "prim::PyfuserGroup"}


_UNCOMPARABLE = {"t", "ts", "g", "gs", "ival"}


def _trim_group(group) -> bool:
    sg = group.g("Subgraph")
    changed = False
    for i in reversed(range(len(group.outputs))):
        if not group.outputs[i].uses:
            group.erase_output(i)
            sg.erase_output(i)
            changed = True
    if changed:
        dce_block(sg.block)
    for i in reversed(range(len(group.inputs))):
        if not sg.inputs[i].uses:
            sg.erase_input(i)
            group.remove_input(i)
            changed = True
    return changed


def dce_block(block) -> int:
    removed = 0
    for n in list(block.reverse_nodes()):
        for b in n.blocks:
            removed += dce_block(b)
        if is_group(n):
            _trim_group(n)
            if not n.outputs:
                n.destroy()
                removed += 1
            continue
        if any(o.uses for o in n.outputs) or n.blocks or is_writer(n):
            continue
        n.destroy()
        removed += 1
    return removed


def _key(n):
    attrs = tuple(sorted((k, kind, repr(v)) for k, (kind, v) in n.attributes.items()))
    return (n.kind, tuple(v.unique for v in n.inputs), attrs, tuple(str(o.type) for o in n.outputs))


def cse_block(block, info, seen=None) -> int:
    seen = dict(seen or {})
    merged = 0
    for n in list(block.nodes()):
        for b in n.blocks:
            merged += cse_block(b, info, seen)
        if n.blocks or n.kind in NONDETERMINISTIC or is_writer(n) or not n.outputs \
                or any(kind in _UNCOMPARABLE for kind, _ in n.attributes.values()):
            continue
        if info is not None and any(info.is_mutated(o) for o in n.outputs):
            continue
        k = _key(n)
        prev = seen.get(k)
        if prev is None:
            seen[k] = n
            continue
        for o, po in zip(n.outputs, prev.outputs):
            o.replace_all_uses_with(po)
        n.destroy()
        merged += 1
    return merged


def cleanup(graph) -> dict:
    removed = dce_block(graph.block)
    info = AliasInfo(graph)
    merged = cse_block(graph.block, info)
    for n in graph.all_nodes():
        if is_group(n):
            sg = n.g("Subgraph")
            merged += cse_block(sg.block, None)
            removed += dce_block(sg.block)
    removed += dce_block(graph.block)
    graph_inputs = {v: i for i, v in enumerate(graph.inputs)}
    for n in graph.all_nodes():
        if is_group(n):
            order_group_inputs(n, graph_inputs)
    return {"removed": removed, "merged": merged}


def _rank(v, graph_inputs: dict) -> tuple:
    if v in graph_inputs:
        return (0, graph_inputs[v], 0)
    return (1, v.node._pos if v.node.owning_block is not None else 0, v.offset)


def order_group_inputs(group, graph_inputs: dict) -> None:
    """Put a group's inputs in a canonical order: graph inputs by index, then by definition
    (only within one block's order; values from outer blocks sort by their node's tag)."""
    sg = group.g("Subgraph")
    pairs = list(zip(group.inputs, sg.inputs))
    want = sorted(pairs, key=lambda p: _rank(p[0], graph_inputs))
    if [p[0] for p in want] == list(group.inputs):
        return
    n = len(pairs)
    renames = []
    for outer, old in want:
        new = sg.add_input(None, old.type)
        old.replace_all_uses_with(new)
        group.add_input(outer)
        renames.append((new, old.debug_name))
    for i in range(n):
        sg.erase_input(0)
        group.remove_input(0)
    for new, name in renames:
        new.set_debug_name(name)
