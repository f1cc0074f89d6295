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

`hoist_views(graph, fusible)`: the mirror case, a view of a cast of a value no fused op makes
(`view(_to_copy(mm(...)))`, what a backward graph writes before a layer norm's backward) becomes
a cast of the view (`_to_copy(view(mm(...)))`): the view of the matmul's output is a free eager
view at the region's edge and the cast fuses with what reads it. Only where the cast's input is
contiguous and the cast changes nothing but the dtype (the same values and contiguous strides
either way).

`unfuse_bias(graph, fusible)`: a float32 `addmm(b, x, w)` whose result (through views that keep
its last axis) only fused ops read becomes `mm(x, w)`, the same views, and `add(view, b)`: the
bias add joins the region of its readers (an activation, a residual add and layer norm), where
it costs no memory traffic, and cuBLAS runs a plain matmul, for which it picks faster tiles on
an H100 than for the matmul with a bias epilogue (BERT's attention output and FFN projections:
docs/benchmarks.md). The sum is the same float32 rounding of the same product (not bit-equal:
another tile order). Where a reader is not fused (Q/K/V projections read by attention) the
addmm stays as it is: an add kernel of its own would cost more than the tile gains. bfloat16
keeps cuBLAS's bias epilogue (measured as fast as Inductor's).

`fast_calls(graph)`, on the graph the backend writes (after partitioning): the aten views and
matmuls left to FX are called through the tensor method or torch function that binds the same
aten op (`x.view(shape)` for `aten.view.default(x, shape)`, `torch.addmm` for
`aten.addmm.default`): the same kernel and result, through PyTorch's generated argument parser
instead of the boxed `OpOverload` call, about half the host time of such a call (a model's
forward has dozens: BERT's has 68 views). Only overloads whose method or function resolves to
exactly that overload for the node's arguments (and keyword arguments) are mapped; besides
views and matmuls: detach, clone, embedding, cumsum, arange, new_ones, and `_unsafe_view` as
`view` where the graph does not return it (a returned value stays the non-view AOTAutograd
traced).

Invariant: a rewrite never adds a kernel to the graph; nodes it makes carry `meta["val"]`.
"""
from __future__ import annotations

import operator

import torch

_aten = torch.ops.aten
_VIEWS = (_aten.view.default, _aten._unsafe_view.default)
_CAST = _aten._to_copy.default
_ADDMM = _aten.addmm.default


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


def hoist_views(graph: torch.fx.Graph, fusible) -> int:
    """Apply the rewrite of the module docstring (`fusible(node)`: a compute node that will be
    fused; a cast of such a node's value is left alone, it fuses already); returns how many
    views moved."""
    moved = 0
    for cast in list(graph.nodes):
        if not _dtype_only_cast(cast) or not cast.users:
            continue
        src = cast.args[0]
        maker = src.args[0] if src.op == "call_function" and src.target is operator.getitem \
            else src                          # an item of a fused op's tuple is fused too
        if fusible(maker) or not _contiguous(src):
            continue
        views = list(cast.users)
        if not all(v.op == "call_function" and v.target in _VIEWS and v.args[0] is cast
                   and isinstance(v.meta.get("val"), torch.Tensor) for v in views):
            continue
        for v in views:
            with graph.inserting_before(v):
                early = graph.call_function(v.target, (src, *v.args[1:]), dict(v.kwargs))
                early.meta = {k: x for k, x in v.meta.items() if k != "val"}
                early.meta["val"] = v.meta["val"].to(src.meta["val"].dtype)
                late = graph.call_function(_CAST, (early,), dict(cast.kwargs))
                late.meta = dict(v.meta)
            v.replace_all_uses_with(late)
            graph.erase_node(v)
            moved += 1
        graph.erase_node(cast)
    return moved


def _view_chain(node):
    """The single-reader views after `node` that keep its last axis, and the last of them."""
    chain, last = [], node
    width = node.meta["val"].shape[-1]
    while len(last.users) == 1:
        (u,) = last.users
        val = u.meta.get("val")
        if u.op != "call_function" or u.target not in _VIEWS or u.args[0] is not last or \
                not isinstance(val, torch.Tensor) or val.dim() == 0 or val.shape[-1] != width:
            break
        chain.append(u)
        last = u
    return chain, last


def unfuse_bias(graph: torch.fx.Graph, fusible) -> int:
    """Apply the rewrite of the module docstring (`fusible(node)`: a compute node (not a view)
    that will be fused);
    returns how many addmms it split."""
    split = 0
    for n in list(graph.nodes):
        if n.op != "call_function" or n.target is not _ADDMM or n.kwargs or len(n.args) != 3:
            continue
        b, x, w = n.args
        val = n.meta.get("val")
        bval = b.meta.get("val") if isinstance(b, torch.fx.Node) else None
        if not isinstance(val, torch.Tensor) or not isinstance(bval, torch.Tensor) or \
                val.dtype != torch.float32 or bval.dtype != torch.float32 or bval.dim() != 1:
            continue
        chain, last = _view_chain(n)
        readers = list(last.users)
        if not readers or not all(fusible(r) for r in readers):
            continue
        with graph.inserting_before(n):
            mm = graph.call_function(_aten.mm.default, (x, w))
        mm.meta = dict(n.meta)
        n.replace_all_uses_with(mm)
        graph.erase_node(n)
        with graph.inserting_after(last if chain else mm):
            add = graph.call_function(_aten.add.Tensor, (last if chain else mm, b))
        add.meta = dict((last if chain else mm).meta)
        for r in readers:
            r.replace_input_with(last if chain else mm, add)
        split += 1
    return split


# overload -> (FX op, target, positional arguments the node may have[, keyword arguments it may
# have]): the method / function binds exactly this overload when called with those arguments
_FAST = {
    _aten.view.default: ("call_method", "view", (2,)),
    _aten.t.default: ("call_method", "t", (1,)),
    _aten.transpose.int: ("call_method", "transpose", (3,)),
    _aten.unsqueeze.default: ("call_method", "unsqueeze", (2,)),
    _aten.permute.default: ("call_method", "permute", (2,)),
    _aten.select.int: ("call_method", "select", (3,)),
    _aten.squeeze.dim: ("call_method", "squeeze", (2,)),
    _aten.expand.default: ("call_method", "expand", (2,)),
    _aten.mm.default: ("call_function", torch.mm, (2,)),
    _aten.bmm.default: ("call_function", torch.bmm, (2,)),
    _aten.addmm.default: ("call_function", torch.addmm, (3,)),
    _aten.detach.default: ("call_method", "detach", (1,)),
    _aten.clone.default: ("call_method", "clone", (1,), {"memory_format"}),
    _aten.embedding.default: ("call_function", torch.embedding, (2, 3, 4, 5)),
    _aten.cumsum.default: ("call_method", "cumsum", (2,), {"dtype"}),
    _aten.arange.default: ("call_function", torch.arange, (1,),
                           {"dtype", "layout", "device", "pin_memory"}),
    _aten.arange.start: ("call_function", torch.arange, (2,),
                         {"dtype", "layout", "device", "pin_memory"}),
    _aten.new_ones.default: ("call_method", "new_ones", (2,),
                             {"dtype", "layout", "device", "pin_memory"}),
}
# `_unsafe_view` is `view` without the autograd view relation: the same result where the graph
# itself reads it, but a value the graph returns stays what AOTAutograd traced (not a view)
_UNSAFE_VIEW = _aten._unsafe_view.default


def fast_calls(graph: torch.fx.Graph) -> int:
    """Apply the second rewrite of the module docstring; returns how many nodes it changed."""
    changed = 0
    for n in graph.nodes:
        how = _FAST.get(n.target) if n.op == "call_function" else None
        if n.op == "call_function" and n.target is _UNSAFE_VIEW and \
                not any(u.op == "output" for u in n.users):
            how = ("call_method", "view", (2,))
        if how is None or len(n.args) not in how[2]:
            continue
        if set(n.kwargs) - (how[3] if len(how) > 3 else set()):
            continue
        if how[0] == "call_method" and not isinstance(n.args[0], torch.fx.Node):
            continue
        n.op, n.target = how[0], how[1]
        changed += 1
    return changed
