"""Graph rewrite before partitioning: a sum reads the fused value, not its flattening view.

`sum_through_views(graph, fusible)`: `sum(view(d, s), dims)` (or a view of views of d) where
the view only merges runs of d's axes (a backward graph's `view(gelu_backward(...), [B * T, C])`
before the bias gradient's `sum(0)`, the same for a decoder bias) becomes `sum(d, dims')` over
the axes of d that make up the reduced axes of the view, followed by a view to the old result's
shape where the kept axes were merged too. The sum then reads d's own value in d's shape and
joins d's kernel: a reduction kernel accepts no view between its compute ops, so the region was
a pointwise kernel writing d and a reduction kernel reading it back (Inductor fuses these too).
The view's other readers (the matmuls of the gradient) keep reading the view.

Only where it is exact: d is contiguous and its value comes from a fused op (else there is no
kernel to join), the view's every axis is the product of a run of d's axes (statically known,
also under symbolic sizes), and the sum is `aten.sum.dim_IntList` with an explicit list of
dims. The same elements are summed; their order is the kernel's, as before.

Invariant: a rewrite never adds a kernel; every node it makes carries `meta["val"]`.
"""
from __future__ import annotations

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true

from .rewrites import _contiguous, _maker

_aten = torch.ops.aten
_VIEWS = (_aten.view.default, _aten._unsafe_view.default)
_SUM = _aten.sum.dim_IntList


def _runs(src_shape, dst_shape):
    """Per axis of dst, the list of src axes whose product it is (runs in order; size-1 src axes
    join the run they sit in), or None when dst does not merge runs of src."""
    runs, i, n = [], 0, len(src_shape)
    for size in dst_shape:
        run, prod = [], 1
        while i < n and (not run or not statically_known_true(prod == size)):
            run.append(i)
            prod = prod * src_shape[i]
            i += 1
        if not statically_known_true(prod == size):
            return None
        runs.append(run)
    while runs and i < n and statically_known_true(src_shape[i] == 1):   # trailing 1s of src
        runs[-1].append(i)
        i += 1
    return runs if i == n and runs else None


def sum_through_views(graph: torch.fx.Graph, fusible) -> int:
    """Apply the rewrite of the module docstring; returns how many sums now read d itself."""
    done = 0
    for s in list(graph.nodes):
        if s.op != "call_function" or s.target is not _SUM or len(s.args) < 2:
            continue
        v, dims = s.args[0], s.args[1]
        if not isinstance(v, torch.fx.Node) or v.op != "call_function" or \
                v.target not in _VIEWS or not isinstance(dims, (list, tuple)) or not dims:
            continue
        d = v.args[0]
        while isinstance(d, torch.fx.Node) and d.op == "call_function" and d.target in _VIEWS:
            d = d.args[0]                 # a view of a view of contiguous d is a view of d
        if not isinstance(d, torch.fx.Node) or not fusible(_maker(d)) or not _contiguous(d):
            continue
        dv, vv, sv = (x.meta.get("val") for x in (d, v, s))
        if not all(isinstance(t, torch.Tensor) for t in (dv, vv, sv)):
            continue
        runs = _runs(list(dv.shape), list(vv.shape))
        if runs is None or len(runs) != vv.ndim:
            continue
        reduced = sorted({k % vv.ndim for k in dims if type(k) is int})
        if len(reduced) != len(dims):
            continue
        new_dims = [a for r in reduced for a in runs[r]]
        keepdim = bool(s.args[2]) if len(s.args) > 2 else bool(s.kwargs.get("keepdim", False))
        dtype = s.args[3] if len(s.args) > 3 else s.kwargs.get("dtype")
        try:
            val = dv.sum(new_dims, keepdim=keepdim, dtype=dtype)
        except Exception:  # noqa: BLE001 - a stand-in that cannot take it: leave the node
            continue
        same = tuple(val.shape) == tuple(sv.shape)
        if not same and not all(type(x) is int for x in sv.shape):
            continue                      # a view to symbolic sizes would need their nodes
        with graph.inserting_before(s):
            args = (d, new_dims) + tuple(s.args[2:])
            ns = graph.call_function(_SUM, args, dict(s.kwargs))
            ns.meta = {k: x for k, x in s.meta.items() if k != "val"}
            ns.meta["val"] = val
            out = ns
            if not same:
                out = graph.call_function(_aten.view.default, (ns, list(sv.shape)))
                out.meta = dict(s.meta)
        s.replace_all_uses_with(out)
        graph.erase_node(s)
        while v is not d and not v.users:          # the views only the sum read
            up = v.args[0]
            graph.erase_node(v)
            v = up
        done += 1
    return done
