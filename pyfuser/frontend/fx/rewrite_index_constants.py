"""Graph rewrite before partitioning: indexing by a constant index tensor becomes a slice.

`index_by_constants(graph, fusible)`. Dynamo makes `x[:, :, [-2]]` (Falcon's multi-query key
and value, `fused_qkv[..., [-2], :]`) an `aten.index.Tensor(x, [None, None, c])` whose index c
is a constant of the graph (a `get_attr` tensor, read through `lift_fresh_copy`), and its
gradient an `aten.index_put(zeros, [None, None, c], g, True)`: an eager gather and an eager
scatter per use, each between fused regions. Where c is a 0-dim or 1-D int64 / int32 tensor
whose values (negative ones counted from the end, as `index` wraps them) form an arithmetic
progression of step >= 1 inside the axis (one element included), the index reads
`x[..., v0 : v_last + 1 : step, ...]` (a 0-dim c: `select(x, d, v0)`), and

- `index.Tensor(x, [None]*d + [c])` becomes that `slice` (`select`), then a `clone`, because
  `index` returns a fresh contiguous tensor (the clone fuses, the kernel reading the strided
  view); without the clone where every reader is a fused op (`fusible`), which reads any layout;
- `index_put(self, [None]*d + [c], values, accumulate)` becomes `add(self,
  slice_backward(values, self's sizes, d, ...))` when accumulating (no index repeats) and
  `slice_scatter(self, values, d, ...)` otherwise (`select_backward` / `select_scatter` for a
  0-dim c): pointwise ops that fuse (lowering/aten_resize.py, aten_scatter.py).

Only where it is exact: exactly one index tensor (the others None), the axis' size and the
values known statically, `values` of the indexed shape (no broadcast) and self's dtype (eager
raises for another: left to it). Everything else stays the aten call (`aten.index.Tensor has no
lowering`). The constant's nodes left without readers are removed.

Invariant: a rewrite never adds a kernel; every node it makes carries `meta["val"]`.
"""
from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.fx.experimental.symbolic_shapes import statically_known_true

_aten = torch.ops.aten
_INT_TYPES = (torch.int64, torch.int32)
_MAX_VALUES = 1024            # a longer constant is read on the host only up to this size


def _val(node):
    v = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return v if isinstance(v, torch.Tensor) else None


def _constant(node):
    """(the tensor, the nodes to drop with it) of a get_attr constant, read directly or through
    `lift_fresh_copy`; None otherwise."""
    chain = []
    if node.op == "call_function" and node.target is _aten.lift_fresh_copy.default:
        chain.append(node)
        node = node.args[0]
    if not isinstance(node, torch.fx.Node) or node.op != "get_attr":
        return None
    value = node.graph.owning_module
    for part in node.target.split("."):
        value = getattr(value, part, None)
    if not isinstance(value, torch.Tensor):
        return None
    return value, chain + [node]


def _progression(c: torch.Tensor, n):
    """(start, end, step) of the slice reading c's values (0-dim: (v, None, None)) on an axis of
    size n (an int), or None."""
    if c.dtype not in _INT_TYPES or c.ndim > 1 or c.numel() > _MAX_VALUES or \
            type(n) is not int or (c.ndim == 1 and c.numel() == 0):
        return None
    with unset_fake_temporarily():          # the backend compiles under AOTAutograd's fake mode
        vs = [v + n if v < 0 else v for v in c.reshape(-1).tolist()]
    if not all(0 <= v < n for v in vs):
        return None                                # eager raises: left to it
    if c.ndim == 0:
        return vs[0], None, None
    step = vs[1] - vs[0] if len(vs) > 1 else 1
    if step < 1 or any(b - a != step for a, b in zip(vs, vs[1:])):
        return None
    return vs[0], vs[-1] + 1, step


def _one_index(x, indices):
    """(axis, index node, its constant, chain) where `indices` holds exactly one tensor."""
    xv = _val(x)
    if xv is None or not isinstance(indices, (list, tuple)) or len(indices) > xv.ndim:
        return None
    tensors = [(d, i) for d, i in enumerate(indices) if i is not None]
    if len(tensors) != 1 or not isinstance(tensors[0][1], torch.fx.Node):
        return None
    d, node = tensors[0]
    const = _constant(node)
    if const is None:
        return None
    where = _progression(const[0], xv.shape[d])
    return None if where is None else (d, where, const[1])


def _fake(op, *args):
    """op's result on the example values (meta["val"] of a new node)."""
    vals = [_val(a) if isinstance(a, torch.fx.Node) else a for a in args]
    mode = next((v.fake_mode for v in vals if hasattr(v, "fake_mode")), None)
    if mode is None:
        return op(*vals)
    with mode:
        return op(*vals)


def _call(graph, before, op, args):
    with graph.inserting_before(before):
        n = graph.call_function(op, tuple(args))
    n.meta = {k: v for k, v in before.meta.items() if k != "val"}
    n.meta["val"] = _fake(op, *args)
    return n


def _read(graph, node, x, d, where, fusible):
    start, end, step = where
    if end is None:
        n = _call(graph, node, _aten.select.int, (x, d, start))
    else:
        n = _call(graph, node, _aten.slice.Tensor, (x, d, start, end, step))
    if all(fusible(u) for u in node.users):
        return n
    return _call(graph, node, _aten.clone.default, (n,))


def _write(graph, node, self_, values, accumulate, d, where):
    start, end, step = where
    sizes = list(_val(self_).shape)
    if not accumulate:
        return _call(graph, node, *((_aten.select_scatter.default, (self_, values, d, start))
                                    if end is None else
                                    (_aten.slice_scatter.default,
                                     (self_, values, d, start, end, step))))
    placed = _call(graph, node, *((_aten.select_backward.default, (values, sizes, d, start))
                                  if end is None else
                                  (_aten.slice_backward.default,
                                   (values, sizes, d, start, end, step))))
    return _call(graph, node, _aten.add.Tensor, (self_, placed))


def index_by_constants(graph: torch.fx.Graph, fusible) -> int:
    """Apply the rewrite of the module docstring; returns how many nodes it replaced."""
    done = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.kwargs or \
                node.target not in (_aten.index.Tensor, _aten.index_put.default):
            continue
        x, indices = node.args[0], node.args[1]
        found = _one_index(x, indices)
        if found is None or _val(node) is None:
            continue
        d, where, chain = found
        if node.target is _aten.index.Tensor:
            new = _read(graph, node, x, d, where, fusible)
            if not _same_shape(_val(new), _val(node)):
                _erase_dead(graph, [new, new.args[0]])
                continue
        else:
            values = node.args[2]
            accumulate = node.args[3] if len(node.args) > 3 else False
            view = _fake(*((_aten.select.int, x, d, where[0]) if where[1] is None else
                           (_aten.slice.Tensor, x, d, *where)))
            if not _same_shape(_val(values), view):      # the indexed shape, self's dtype
                continue
            new = _write(graph, node, x, values, bool(accumulate), d, where)
        node.replace_all_uses_with(new)
        graph.erase_node(node)
        _erase_dead(graph, chain)
        done += 1
    return done


def _same_shape(a, b) -> bool:
    return a is not None and b is not None and a.ndim == b.ndim and a.dtype == b.dtype and \
        all(statically_known_true(p == q) for p, q in zip(a.shape, b.shape))


def _erase_dead(graph, chain) -> None:
    for n in chain:                       # readers first
        if n.graph is graph and not n.users:
            graph.erase_node(n)
