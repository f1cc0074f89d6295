"""Pass 2: split the bias off linear and conv so the bias add can fuse with what follows.

    %y = aten::linear(%x, %w, %b)          ->  %y0 = aten::linear(%x, %w, None)
                                               %y  = prim::add_optional(%y0, %b)
    %y = aten::conv2d(%x, %w, %b, ...)     ->  %y0 = aten::conv2d(%x, %w, None, ...)
                                               %b2 = aten::unsqueeze(aten::unsqueeze(%b, -1), -1)
                                               %y  = prim::add_optional(%y0, %b2)

`prim::add_optional(a, b)` is `a` when b is None, else `a + b` (the eager runner of jit.py
runs it; the lowering table lowers it). Only nodes whose bias is not the None constant are
rewritten, and conv only where the bias is known to be a tensor (a scripted `Conv2d(bias=False)`
passes a `Tensor?` that is None), and never an `out=` overload torch matched (`linear(x, w, b,
out=c)` must write its bias into c). BIAS_SPLITS maps each kind to (bias argument position,
trailing unsqueezes).
Invariant: same values as before (the add is the bias add the op would have done).
"""
from __future__ import annotations

from ..ops import out_schema
from ..types import NoneType, TensorType

# kind -> (position of the bias argument, how many trailing size-1 axes the bias needs)
BIAS_SPLITS = {
    "aten::linear": (2, 0),
    "aten::conv1d": (2, 1),
    "aten::conv2d": (2, 2),
    "aten::conv3d": (2, 3),
}


def _is_none(v) -> bool:
    return isinstance(v.type, NoneType) or (
        v.node.kind == "prim::Constant" and not v.node.has_attr("value"))


def split_bias_block(block) -> int:
    changed = 0
    for node in list(block.nodes()):
        for b in node.blocks:
            changed += split_bias_block(b)
        spec = BIAS_SPLITS.get(node.kind)
        if spec is None or len(node.inputs) <= spec[0] or len(node.outputs) != 1:
            continue
        if out_schema(node.kind, node.overload) is not None:
            continue          # `linear(x, w, b, out=c)` writes c with its bias: not split
        pos, n_unsqueeze = spec
        bias = node.inputs[pos]
        if _is_none(bias) or (n_unsqueeze and not isinstance(bias.type, TensorType)):
            continue          # an Optional bias (None at run time) cannot be unsqueezed
        g = node.graph
        with g.insert_point(node):
            none = g.insert_constant(None)
        node.replace_input(pos, none)
        out = node.output()
        with g.insert_point(node.next):
            b = bias
            for _ in range(n_unsqueeze):
                minus_one = g.insert_constant(-1)
                b = g.insert("aten::unsqueeze", [b, minus_one]).output()
            add = g.insert("prim::add_optional", [out, b])
        add.output().type = out.type if isinstance(out.type, TensorType) else TensorType()
        out.replace_all_uses_with(add.output())
        add.replace_input(0, out)
        out.type = TensorType()
        changed += 1
    return changed


def split_bias(graph) -> int:
    return split_bias_block(graph.block)
