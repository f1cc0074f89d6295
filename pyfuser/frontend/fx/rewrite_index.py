"""Graph rewrite before partitioning: advanced indexing by arange grids becomes views.

`index_by_aranges(graph, fusible)`: an `aten.index.Tensor(x, [i_0, ..., i_{m-1}])` that indexes
every axis of x with an integer tensor built from an arange (`arange(n)` or `arange(s, s + n)`,
plus an optional integer constant, then `unsqueeze`s and slices keeping whole axes) reads
`x[p_{a_0} + c_0, ..., p_{a_{m-1}} + c_{m-1}]` at output position p: each index varies along one
output axis a_d only. That is a view of x: a slice `[c_d, c_d + n_d)` of each axis, the axes put
in the order of their output axes, and size-1 axes where no index varies. An index of one
element (`arange(1)`, a batch of one) reads the constant c_d: a `select`. HF transformers builds
every attention mask this way (`padding_mask[batch_idx, kv_idx]`, the packed-sequence mask's
`cumsum[batch_idx, q_idx]` against `cumsum[batch_idx, kv_idx]`, vmapped over arange grids), each
index an eager gather kernel and each arange a kernel of its own ahead of the mask's fused
region; as views, the mask's region reads x directly and the aranges are dead.

Only where it is exact: all m axes are indexed (no None), every index is an int64 / int32 arange
placement as above with distinct output axes, start >= 0, step 1, each `[c_d, c_d + n_d)` known
to lie inside x's axis (statically, also under symbolic sizes), and the view's shape equals the
index's result shape. `aten.index` returns a fresh contiguous tensor and the view may be
strided, so only an index whose every reader is a fused op (`fusible(node)`: the kernel reads
any layout) is rewritten. The index chain's nodes left without readers are removed.

Invariant: a rewrite never adds a kernel; every node it makes carries `meta["val"]`.
"""
from __future__ import annotations

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true

_aten = torch.ops.aten
_ARANGES = (_aten.arange.default, _aten.arange.start, _aten.arange.start_step)
_ADDS = (_aten.add.Tensor, _aten.add.Scalar)
_INT_TYPES = (torch.int64, torch.int32)
_TO_THE_END = 2 ** 62        # `t[a:]` slices to INT64_MAX: no tensor axis is that long


def _val(node):
    v = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return v if isinstance(v, torch.Tensor) else None


def _arange_1d(node):
    """(start, length, chain) when `node` is a 1-D int arange of step 1 plus integer constants
    (chain: the nodes walked, the arange last), else None."""
    chain, offset = [], 0
    while node.op == "call_function" and node.target in _ADDS:
        a, b = node.args[0], node.args[1]
        if len(node.args) != 2 or node.kwargs or not isinstance(a, torch.fx.Node) or \
                type(b) is not int:
            return None
        chain.append(node)
        offset += b
        node = a
    if node.op != "call_function" or node.target not in _ARANGES:
        return None
    args = list(node.args)
    start, step = (0, 1) if node.target is _aten.arange.default else (args[0], 1)
    if node.target is _aten.arange.start_step:
        step = args[2] if len(args) > 2 else 1
    if type(start) is not int or step != 1:
        return None
    val = _val(node)
    if val is None or val.ndim != 1 or val.dtype not in _INT_TYPES:
        return None
    chain.append(node)
    return start + offset, val.shape[0], chain


def _placement(index):
    """(axis, start, length, chain) of an index tensor that is an arange (start + position along
    `axis` of its own shape) with size-1 axes added by unsqueeze; axis None for one element."""
    chain = []
    node = index
    while isinstance(node, torch.fx.Node) and node.op == "call_function" and \
            (node.target is _aten.unsqueeze.default or _whole_slice(node)):
        chain.append(node)
        node = node.args[0]
    if not isinstance(node, torch.fx.Node):
        return None
    base = _arange_1d(node)
    val = _val(index)
    if base is None or val is None or val.dtype not in _INT_TYPES:
        return None
    start, n, more = base
    if start < 0:
        return None
    shape = list(val.shape)
    if statically_known_true(n == 1):
        return None, start, n, chain + more
    big = [j for j, s in enumerate(shape) if not statically_known_true(s == 1)]
    if len(big) != 1 or not statically_known_true(shape[big[0]] == n):
        return None
    return big[0], start, n, chain + more


def _whole_slice(node) -> bool:
    """`aten.slice.Tensor(t, dim, 0, end)` of step 1 keeping all of t's axis (what `t[None, :]`
    writes under symbolic sizes): the same values."""
    if node.target is not _aten.slice.Tensor or node.kwargs:
        return False
    t, *rest = node.args
    dim, start, end, step = (rest + [0, None, None, 1][len(rest):])[:4]
    tv = _val(t)
    if tv is None or type(dim) is not int or start not in (None, 0) or step != 1:
        return False
    return end is None or (type(end) is int and end >= _TO_THE_END) or \
        statically_known_true(end >= tv.shape[dim])


def index_by_aranges(graph: torch.fx.Graph, fusible) -> int:
    """Apply the rewrite of the module docstring; returns how many index nodes became views."""
    done = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not _aten.index.Tensor or \
                len(node.args) != 2 or node.kwargs:
            continue
        x, indices = node.args
        xv, out = _val(x), _val(node)
        if xv is None or out is None or not isinstance(indices, (list, tuple)) or \
                len(indices) != xv.ndim or xv.ndim == 0 or not node.users or \
                not all(fusible(u) for u in node.users):
            continue
        places = [_placement(i) if isinstance(i, torch.fx.Node) else None for i in indices]
        if any(p is None for p in places):
            continue
        rank = out.ndim
        axes, ok = {}, True
        for d, (axis, start, n, _) in enumerate(places):
            if not statically_known_true(start + n <= xv.shape[d]):
                ok = False
            if axis is not None:
                a = axis + rank - _val(indices[d]).ndim     # indices broadcast from the right
                ok = ok and a not in axes.values()
                axes[d] = a
        steps = _view_steps(xv, places, axes, rank) if ok else None
        if steps is None:
            continue
        got = steps[-1][2] if steps else xv
        if got.ndim != out.ndim or got.dtype != out.dtype or \
                not all(statically_known_true(a == b) for a, b in zip(got.shape, out.shape)):
            continue
        cur = x
        with graph.inserting_before(node):
            for target, args, val in steps:
                cur = graph.call_function(target, (cur, *args))
                cur.meta = {k: v for k, v in node.meta.items() if k != "val"}
                cur.meta["val"] = val
        node.replace_all_uses_with(cur)
        graph.erase_node(node)
        for *_, chain in places:
            _erase_dead(graph, chain)
        done += 1
    return done


def _view_steps(xv, places, axes, rank):
    """The views of the module docstring as (target, arguments after the input, value) steps,
    for index placements `places` (axis, start, length, chain) per axis of x and the output
    axis `axes[d]` of each varying one; None where a step cannot be taken."""
    steps, val = [], xv
    try:
        for d, (axis, start, n, _) in enumerate(places):
            if axis is not None and not (start == 0 and statically_known_true(n == val.shape[d])):
                val = val[(slice(None),) * d + (slice(start, start + n),)]
                steps.append((_aten.slice.Tensor, (d, start, start + n), val))
        for d in sorted((d for d, p in enumerate(places) if p[0] is None), reverse=True):
            val = val.select(d, places[d][1])
            steps.append((_aten.select.int, (d, places[d][1]), val))
        kept = [d for d, p in enumerate(places) if p[0] is not None]      # val's axes, in order
        order = sorted(range(len(kept)), key=lambda i: axes[kept[i]])
        if order != list(range(len(kept))):
            val = val.permute(order)
            steps.append((_aten.permute.default, (order,), val))
        for j in range(rank):
            if j not in axes.values():
                val = val.unsqueeze(j)
                steps.append((_aten.unsqueeze.default, (j,), val))
    except Exception:  # noqa: BLE001 - a stand-in that cannot take the view: leave the node
        return None
    return steps


def _erase_dead(graph, chain) -> None:
    for n in chain:                       # users first: the chain runs from the index inward
        if n.graph is graph and not n.users:
            graph.erase_node(n)
