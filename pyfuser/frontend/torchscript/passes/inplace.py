"""Pass 1: in-place ops made functional where no other value can observe the mutation.

`%r = aten::mul_(%x, %y)` becomes `%r = aten::mul(%x, %y)` (plus `prim::inplace_cast(%r, %x)` when
the out-of-place op could promote to another dtype than `%x`'s: an in-place op keeps self's
dtype, and raises as eager does when the result type cannot be cast to it), and every use of `%x` after the node reads `%r`. The kinds handled are derived
from the lowering table: `K_` for each lowered `aten::K` (INPLACE_TWINS).

Safe only when (checked in `unsafe_reason`, which names the first failed condition):
  * %x is made in the same block by a node that returns a fresh tensor (not a graph or block
    input, not a view/alias of something: the schema's alias annotations decide);
  * no use of %x before the node creates an alias of it (view, reshape, select, detach, a
    list/tuple construct, an unknown call, ...) and no such use inside a nested block writes
    it (uses after the node are redirected to %r, so they never see the old %x).
Unsafe nodes stay as they are (and so stay out of fusion); the reason goes to the report.
Invariant: the rewritten graph computes the same values as the original for every input.
"""
from __future__ import annotations

from ...lowering import LOWERINGS
from ..types import FloatType, TensorType
from .aliasing import WILDCARD, creates_alias, node_effects

INPLACE_TWINS = {k + "_": k for k in LOWERINGS
                 if k.startswith("aten::") and not k.endswith("_")}


def unsafe_reason(node, x):
    """None when rewriting in-place `node` on `x` is safe, else why not."""
    producer = x.node
    if producer.kind == "prim::Param":
        return f"it mutates %{x.debug_name}, an input of the graph or of a block (the caller sees it)"
    if producer.owning_block is not node.owning_block:
        return f"%{x.debug_name} is defined outside the block of the in-place op"
    if not _fresh(x):
        return f"%{x.debug_name} is made by {producer.kind}, which may alias another tensor"
    for use in x.uses:
        user = use.user
        if user is node or user.is_after(node):      # later uses will read the new value
            continue
        if creates_alias(user, x):
            return f"%{x.debug_name} is aliased by {user.kind} (a view or container shares it)"
        if user.owning_block is not node.owning_block:
            e = node_effects(user)
            if e.opaque or use.offset in e.writes:
                return f"%{x.debug_name} is written inside a nested block by {user.kind}"
    return None


def _fresh(x, depth: int = 0) -> bool:
    """x owns its storage: made by a non-aliasing op, or an alias of a fresh tensor that
    nothing else uses (the `prim::inplace_cast` this pass inserts, a chain of such). An alias
    whose producer has another used output (`b, c = y.expand(2, 3).unbind(0)`: b and c
    share storage) or reads the wildcard set (`l[0]`, `d[k]`) is not fresh."""
    p = x.node
    e = node_effects(p)
    # An op that writes other arguments still returns a fresh tensor when its schema says the
    # output aliases nothing (training batch_norm updates its running statistics).
    if p.kind == "prim::Param" or e.opaque or depth > 16 or p.blocks:
        return False
    al = e.aliases[x.offset] if x.offset < len(e.aliases) else frozenset()
    if not al:
        return True
    if any(o is not x and o.uses for o in p.outputs):
        return False
    if al == WILDCARD and not p.kind.startswith("prim::"):
        return False
    srcs = p.inputs if al == "*" else [p.inputs[i] for i in al if i < len(p.inputs)]
    return all(len(a.uses) == 1 and a.node.owning_block is p.owning_block and _fresh(a, depth + 1)
               for a in srcs if isinstance(a.type, TensorType) or a.node.kind != "prim::Constant")


def _needs_cast(node) -> bool:
    """Could the out-of-place op produce another dtype than self's?"""
    self_t = node.inputs[0].type
    others = node.inputs[1:]
    dtypes = set()
    for v in others:
        if isinstance(v.type, TensorType):
            dtypes.add(v.type.dtype)
        elif isinstance(v.type, FloatType) or isinstance(_const(v), float):
            return True
    if not dtypes:
        return False
    known = isinstance(self_t, TensorType) and self_t.dtype is not None
    return not (known and dtypes == {self_t.dtype})


def _const(v):
    n = v.node
    return n.attr("value") if n.kind == "prim::Constant" and n.has_attr("value") else None


def functionalize_block(block, report) -> int:
    changed = 0
    for node in list(block.nodes()):
        for b in node.blocks:
            changed += functionalize_block(b, report)
        twin = INPLACE_TWINS.get(node.kind)
        if twin is None or not node.inputs:
            continue
        x = node.inputs[0]
        reason = unsafe_reason(node, x)
        if reason is not None:
            report.note(node, f"in-place op kept: {reason}")
            continue
        node.kind = twin
        result = node.output()
        if _needs_cast(node):
            cast = node.graph.create("prim::inplace_cast", [result, x])
            cast.output().type = TensorType()
            cast.insert_after(node)
            result.replace_all_uses_with(cast.output())
            cast.replace_input(0, result)
            result = cast.output()
        x.replace_all_uses_after_node_with(result.node, result)
        changed += 1
    return changed


def functionalize(graph, report) -> int:
    """Rewrite every safe in-place op; returns how many were rewritten."""
    return functionalize_block(graph.block, report)
