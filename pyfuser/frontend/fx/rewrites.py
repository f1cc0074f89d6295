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

`sink_views_past_binary(graph, fusible)`: a binary elementwise op (add, sub, mul, div) of a view
of a fused value and a value no fused op makes, all of the view's shape (`add(view(g, s), t)`,
what a backward graph writes where a cross-entropy's gradient meets the logits' own tangent),
becomes a view of the op on the unviewed value (`view(add(g, view(t, g.shape)), s)`): the op
joins g's region, which no longer has a view between its compute ops (a reduction kernel
accepts none), and both views are free eager views at the region's edges. Only where g, the
other operand and the result are contiguous (both orders then give the same contiguous result),
g's shape is static, and the op's fused readers are dtype casts (which `sink_views` then moves
above the view in turn): the view must not land before other fused compute.

`hoist_views_past_binary(graph, fusible)`: the mirror of the last one, a view of a binary
elementwise op whose operands are values no fused op makes or dtype casts of such values
(`view(add(t, _to_copy(mm_view)), s)`, what a backward graph writes where a residual stream's
gradient meets a matmul's and enters a layer norm's backward), becomes the op of the views
(`add(view(t, s), _to_copy(view(mm_view, s)))`): the views are free eager views at the region's
edge and the op joins the normalization's kernels, which accept no view between compute ops.
Only where the op has no other reader, its operands have its shape (no broadcast) and the
operands and the op are contiguous (both orders then give the same contiguous values).

`skip_detach(graph, fusible)`: a fused op reading `detach(x)` or `alias(x)` (or a chain of them;
the backend decomposes detach into alias) reads `x`.
AOTAutograd's graphs run without autograd, where a detach is the same values under another
tensor object; a backward graph reads a saved activation both plainly and through detaches
(nll_loss_backward's input, `_log_softmax_backward_data`'s output), so one tensor would enter a
region twice, as two inputs whose sizes the kernel's plan cannot tell equal. Detaches that
unfused nodes or the graph's outputs read stay.

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
views and matmuls: detach, clone, embedding, gather, cumsum, arange, new_ones, split,
convolution, max_pool2d_with_indices, the scaled-dot-product attention forwards,
`_unsafe_view` as `view` where the graph does not return it (a returned value stays the
non-view AOTAutograd traced), and `slice` of step 1 with static sizes as `narrow` (the same
view).

Invariant: a rewrite never adds a kernel to the graph; nodes it makes carry `meta["val"]`.
"""
from __future__ import annotations

import collections
import operator

import torch

from .meta import same_shape

_aten = torch.ops.aten
_VIEWS = (_aten.view.default, _aten._unsafe_view.default)
_CAST = _aten._to_copy.default
_ADDMM = _aten.addmm.default
_DETACH = (_aten.detach.default, _aten.alias.default)   # same values, another tensor
_BINARY = (_aten.add.Tensor, _aten.sub.Tensor, _aten.mul.Tensor, _aten.div.Tensor)


def _dtype_only_cast(node) -> bool:
    if node.op != "call_function" or node.target is not _CAST or len(node.args) != 1:
        return False
    extra = {k: v for k, v in node.kwargs.items() if k != "dtype"}
    val = node.meta.get("val")
    src = node.args[0].meta.get("val") if isinstance(node.args[0], torch.fx.Node) else None
    if not isinstance(val, torch.Tensor) or not isinstance(src, torch.Tensor):
        return False
    same_place = _same_device(extra.get("device", src.device), src.device) and \
        extra.get("layout", torch.strided) == torch.strided and \
        extra.get("memory_format") in (None, torch.preserve_format, torch.contiguous_format)
    allowed = set(extra) <= {"device", "layout", "memory_format", "pin_memory"}
    return allowed and same_place and not extra.get("pin_memory", False)


def _same_device(want, have) -> bool:
    """Whether a cast to device `want` leaves a tensor on `have` where it is: a device named
    without an index (`device="cuda"`, as traced graphs write it) is the current one of its
    type (CUDA's current device; 0 where there is none, as under fake CUDA tensors)."""
    want, have = torch.device(want), torch.device(have)
    if want.type != have.type:
        return False
    if want.index is None or have.index is None:
        current = torch.cuda.current_device() if want.type == "cuda" and \
            torch.cuda.is_available() else 0
        return (current if want.index is None else want.index) == \
            (current if have.index is None else have.index)
    return want.index == have.index


def _maker(node):
    """The node whose value `node` is: itself, or for an item of a tuple the op that made the
    tuple (an item of a fused op's tuple is fused too)."""
    return node.args[0] if node.op == "call_function" and node.target is operator.getitem \
        else node


def _contiguous(node) -> bool:
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    if not isinstance(val, torch.Tensor):
        return False
    try:
        return bool(val.is_contiguous())
    except Exception:        # a symbolic stride that cannot be decided: leave the graph alone
        return False


def sink_views(graph: torch.fx.Graph, views=None) -> int:
    """Apply the rewrite of the module docstring (to `views` only, when given); returns how
    many casts moved."""
    moved = 0
    work = collections.deque(graph.nodes if views is None else views)
    while work:
        view = work.popleft()
        if view.graph is not graph or view.op != "call_function" or view.target not in _VIEWS \
                or not view.users:
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
            work.append(late)             # a cast of a cast: the view sinks past it too
            moved += 1
        if not view.users:
            graph.erase_node(view)
    return moved


def hoist_views(graph: torch.fx.Graph, fusible) -> int:
    """Apply the rewrite of the module docstring (`fusible(node)`: a compute node that will be
    fused; a cast of such a node's value is left alone, it fuses already); returns how many
    views moved."""
    moved = 0
    work = collections.deque(graph.nodes)
    while work:
        cast = work.popleft()
        if cast.graph is not graph or not _dtype_only_cast(cast) or not cast.users:
            continue
        src = cast.args[0]
        if fusible(_maker(src)) or not _contiguous(src):
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
            work.append(late)             # its own readers may be views in turn
            moved += 1
        graph.erase_node(cast)
    return moved


def sink_views_past_binary(graph: torch.fx.Graph, fusible) -> int:
    """Apply the third rewrite of the module docstring (`fusible(node)`: a compute node that
    will be fused), then `sink_views` to the views it made; returns how many binary ops moved
    before their view."""
    moved, made = 0, []
    for view in list(graph.nodes):
        if view.op != "call_function" or view.target not in _VIEWS or not view.users:
            continue
        src = view.args[0]
        shape = getattr(src.meta.get("val"), "shape", None)
        if not fusible(_maker(src)) or not _contiguous(src) or shape is None or \
                not all(type(d) is int for d in shape):
            continue
        for op in list(view.users):
            other = _other_operand(op, view)
            if other is None or fusible(_maker(other)) or not _contiguous(other) or \
                    any(fusible(u) and not _dtype_only_cast(u) for u in op.users):
                continue
            with graph.inserting_before(op):
                flat = graph.call_function(_aten.view.default, (other, list(shape)))
                flat.meta = {"val": other.meta["val"].view(list(shape))}
                args = tuple(src if a is view else flat if a is other else a for a in op.args)
                early = graph.call_function(op.target, args, dict(op.kwargs))
                early.meta = {k: v for k, v in op.meta.items() if k != "val"}
                early.meta["val"] = op.meta["val"].view(list(shape))
                late = graph.call_function(view.target, (early, *view.args[1:]), dict(view.kwargs))
                late.meta = dict(op.meta)
            op.replace_all_uses_with(late)
            graph.erase_node(op)
            made.append(late)
            moved += 1
        if not view.users:
            graph.erase_node(view)
    sink_views(graph, made)
    return moved


def hoist_views_past_binary(graph: torch.fx.Graph, fusible) -> int:
    """Apply the rewrite of the module docstring; returns how many views moved."""
    moved = 0
    for view in list(graph.nodes):
        if view.op != "call_function" or view.target not in _VIEWS or not view.users or \
                not isinstance(view.meta.get("val"), torch.Tensor):
            continue
        op = view.args[0]
        if not isinstance(op, torch.fx.Node) or op.op != "call_function" or \
                op.target not in _BINARY or len(op.args) != 2 or op.kwargs or \
                list(op.users) != [view] or not _contiguous(op) or not fusible(op):
            continue
        op_args = list(op.args)
        leaves = [_free_leaf(a, op, fusible) for a in op_args]
        if any(leaf is None for leaf in leaves):
            continue
        shape = view.meta["val"].shape
        with graph.inserting_before(view):
            args = []
            for a, leaf in zip(op_args, leaves):
                if leaf is False:                         # not a tensor: as it is
                    args.append(a)
                    continue
                early = graph.call_function(view.target, (leaf, *view.args[1:]), dict(view.kwargs))
                early.meta = {"val": leaf.meta["val"].view(shape)}
                if leaf is not a:                         # a dtype cast of the leaf
                    cast = graph.call_function(_CAST, (early,), dict(a.kwargs))
                    cast.meta = {k: x for k, x in a.meta.items() if k != "val"}
                    cast.meta["val"] = a.meta["val"].view(shape)
                    early = cast
                args.append(early)
            new = graph.call_function(op.target, tuple(args), dict(op.kwargs))
            new.meta = {k: x for k, x in op.meta.items() if k != "val"}
            new.meta["val"] = view.meta["val"]
        view.replace_all_uses_with(new)
        graph.erase_node(view)
        graph.erase_node(op)
        for a, leaf in zip(op_args, leaves):       # casts read by op alone, then their views
            if leaf is not False and leaf is not a and not a.users:
                graph.erase_node(a)
                if leaf.op == "call_function" and leaf.target in _VIEWS and not leaf.users:
                    graph.erase_node(leaf)
        moved += 1
    return moved


def _free_leaf(a, op, fusible):
    """For an operand `a` of `op`: False when it is not a tensor node (a scalar), the node to
    view when a view of it is free at a region's edge (a contiguous value of op's shape that no
    fused op makes; or, for a dtype-only cast of such a value read by `op` alone, that value),
    else None."""
    if not isinstance(a, torch.fx.Node):
        return False
    val, out = a.meta.get("val"), op.meta.get("val")
    if not isinstance(val, torch.Tensor) or not same_shape(val.shape, out.shape) or \
            not _contiguous(a):
        return None
    if not fusible(_maker(a)):
        return a
    if _dtype_only_cast(a) and list(a.users) == [op]:
        src = a.args[0]
        if isinstance(src, torch.fx.Node) and not fusible(_maker(src)) and _contiguous(src):
            return src
    return None


def skip_detach(graph: torch.fx.Graph, fusible) -> int:
    """Apply the fourth rewrite of the module docstring; returns how many reads it redirected."""
    moved = 0
    for d in list(graph.nodes):
        if d.op != "call_function" or d.target not in _DETACH or len(d.args) != 1:
            continue
        root = d.args[0]
        while isinstance(root, torch.fx.Node) and root.op == "call_function" and \
                root.target in _DETACH and len(root.args) == 1:
            root = root.args[0]
        for u in list(d.users):
            if fusible(u):
                u.replace_input_with(d, root)
                moved += 1
    for d in reversed(list(graph.nodes)):          # readers first: chains go in one sweep
        if d.op == "call_function" and d.target in _DETACH and not d.users:
            graph.erase_node(d)
    return moved


def _other_operand(op, view):
    """The other tensor operand of a binary elementwise `op` reading `view` once, where both
    operands and the result have the view's shape and the result is contiguous; else None."""
    if op.op != "call_function" or op.target not in _BINARY or len(op.args) != 2:
        return None
    a, b = op.args
    other = b if a is view else a if b is view else None
    if other is None or other is view or not isinstance(other, torch.fx.Node):
        return None
    vals = [n.meta.get("val") for n in (view, other, op)]
    if not all(isinstance(v, torch.Tensor) for v in vals) or \
            not all(same_shape(v.shape, vals[0].shape) for v in vals) or not _contiguous(op):
        return None
    return other


def _view_chain(node):
    """The single-reader views after `node` that keep its last axis, and the last of them."""
    chain, last = [], node
    width = node.meta["val"].shape[-1]
    while len(last.users) == 1:
        (u,) = last.users
        val = u.meta.get("val")
        if u.op != "call_function" or u.target not in _VIEWS or u.args[0] is not last or \
                not isinstance(val, torch.Tensor) or val.dim() == 0 or \
                not same_shape(val.shape[-1:], (width,)):
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
    _aten.split.Tensor: ("call_method", "split", (2, 3)),
    _aten.gather.default: ("call_function", torch.gather, (3,), {"sparse_grad"}),
    # what stays on aten's kernels in vision and attention models (cuDNN, SDPA): the boxed call
    # costs ~4 µs more host time a call (a CPU convolution 10.7 -> 6.4 µs, 2026-11-30)
    _aten.convolution.default: ("call_function", torch.convolution, (9,)),
    _aten.max_pool2d_with_indices.default: ("call_function", torch._C._nn.max_pool2d_with_indices,
                                            (2, 3, 4, 5, 6)),
    _aten._scaled_dot_product_flash_attention.default: (
        "call_function", torch._scaled_dot_product_flash_attention, (3, 4, 5, 6), {"scale"}),
    _aten._scaled_dot_product_efficient_attention.default: (
        "call_function", torch._scaled_dot_product_efficient_attention, (5, 6, 7), {"scale"}),
    _aten._scaled_dot_product_cudnn_attention.default: (
        "call_function", torch._scaled_dot_product_cudnn_attention, (5, 6, 7, 8), {"scale"}),
    _aten._scaled_dot_product_flash_attention_for_cpu.default: (
        "call_function", torch._scaled_dot_product_flash_attention_for_cpu, (3, 4, 5),
        {"attn_mask", "scale"}),
}
# `_unsafe_view` is `view` without the autograd view relation: the same result where the graph
# itself reads it, but a value the graph returns stays what AOTAutograd traced (not a view)
_UNSAFE_VIEW = _aten._unsafe_view.default


def _slice_as_narrow(n):
    """(dim, start, length) when `aten.slice.Tensor(x, dim, start, end[, 1])` is
    `x.narrow(dim, start, length)` (the same view): static sizes, 0 <= start <= x's size."""
    if n.kwargs or not 2 <= len(n.args) <= 5 or not isinstance(n.args[0], torch.fx.Node):
        return None
    x, *rest = n.args
    dim, start, _, step = (rest + [0, None, None, 1][len(rest):])[:4]
    xv, out = x.meta.get("val"), n.meta.get("val")
    if not isinstance(xv, torch.Tensor) or not isinstance(out, torch.Tensor) or \
            type(dim) is not int or step != 1 or not -xv.ndim <= dim < xv.ndim:
        return None
    start = 0 if start is None else start
    size, length = xv.shape[dim], out.shape[dim]
    if type(start) is not int or type(size) is not int or type(length) is not int or \
            not 0 <= start <= size:
        return None
    return dim, start, length


def fast_calls(graph: torch.fx.Graph) -> int:
    """Apply the second rewrite of the module docstring; returns how many nodes it changed."""
    changed = 0
    for n in graph.nodes:
        if n.op == "call_function" and n.target is _aten.slice.Tensor:
            narrow = _slice_as_narrow(n)
            if narrow is not None:
                n.op, n.target, n.args = "call_method", "narrow", (n.args[0], *narrow)
                changed += 1
            continue
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
