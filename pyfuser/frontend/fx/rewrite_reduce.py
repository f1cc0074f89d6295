"""Graph rewrites of sums before partitioning: a sum reads the fused value, not its flattening
view; a sum of a few elements is written out as adds.

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

`unroll_small_sums(graph, fusible)`: a fused `sum(x, dims)` over axes of constant sizes holding 2
to UNROLL_SUM (4) elements in all (a grouped-query attention's key / value gradient: the backward
of repeat_kv's expand sums the query heads sharing each key head) becomes the adds
of x's one-element selects (slices where keepdim), in order, in float for a half / bfloat16 x
and cast back once, as eager accumulates. Pointwise ops: they join the kernel of what reads the
sum (the rotary embedding's backward, whose slices and pads no reduction kernel takes) instead
of a reduction kernel writing the sum for a pointwise kernel to read back (Inductor unrolls such
reductions too). Only where no fused op computes x (a matmul's result, through views: the
selects are then views at the region's edge): a sum of a fused value joins that value's
kernel as a reduction already (a bias gradient, whose input is also written whole), where its
adds would compute the value once more in a kernel of another shape. Floating sums only, with
no dtype argument but a floating one. Each select is a view FX makes (a host call): more than 4
would cost more host time than the kernel they save.

Invariant: a rewrite never adds a kernel; every node it makes carries `meta["val"]`.
"""
from __future__ import annotations

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true

from .meta import same_shape
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
        same = same_shape(val.shape, sv.shape)
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


UNROLL_SUM = 4
_SELECT, _SLICE, _ADD = _aten.select.int, _aten.slice.Tensor, _aten.add.Tensor
_CAST = _aten._to_copy.default


def unroll_small_sums(graph: torch.fx.Graph, fusible) -> int:
    """Apply the second rewrite of the module docstring; returns how many sums were unrolled."""
    done = 0
    for s in list(graph.nodes):
        if s.op != "call_function" or s.target is not _SUM or len(s.args) < 2 or not fusible(s):
            continue
        x, dims = s.args[0], s.args[1]
        xv, sv = (n.meta.get("val") if isinstance(n, torch.fx.Node) else None for n in (x, s))
        if not isinstance(xv, torch.Tensor) or not isinstance(sv, torch.Tensor) or \
                not isinstance(dims, (list, tuple)) or not dims or xv.ndim == 0 or \
                not all(type(d) is int for d in dims):
            continue
        axes = sorted({d % xv.ndim for d in dims})
        sizes = [xv.shape[a] for a in axes]
        total = 1
        for n in sizes:
            total = total * n if type(n) is int else UNROLL_SUM + 1
        keepdim = bool(s.args[2]) if len(s.args) > 2 else bool(s.kwargs.get("keepdim", False))
        dtype = s.args[3] if len(s.args) > 3 else s.kwargs.get("dtype")
        out_dt = dtype or xv.dtype
        if not 2 <= total <= UNROLL_SUM or not (xv.dtype.is_floating_point and
                                                out_dt.is_floating_point) or \
                len(axes) != len(dims) or sv.dtype != out_dt or fusible(_maker(x)):
            continue
        with graph.inserting_before(s):
            out = _unrolled(graph, x, axes, sizes, keepdim, out_dt)
        out.meta = {**{k: v for k, v in s.meta.items() if k != "val"}, "val": out.meta["val"]}
        s.replace_all_uses_with(out)
        graph.erase_node(s)
        done += 1
    return done


def _node(graph, target, args, kwargs, val):
    n = graph.call_function(target, args, kwargs or {})
    n.meta["val"] = val
    return n


def _unrolled(graph, x, axes, sizes, keepdim: bool, out_dt):
    """The adds of x's elements along `axes` (program order: the last axis fastest)."""
    acc_dt = torch.float32 if out_dt in (torch.float16, torch.bfloat16) else out_dt
    xv = x.meta["val"]
    if xv.dtype != acc_dt:
        x = _node(graph, _CAST, (x,), {"dtype": acc_dt}, xv.to(acc_dt))
    total_n = None
    for flat in range(_prod(sizes)):
        idx, rest = [], flat
        for n in reversed(sizes):
            idx.append(rest % n)
            rest //= n
        idx.reverse()
        t = x
        for a, k in sorted(zip(axes, idx), reverse=keepdim is False):
            tv = t.meta["val"]
            if keepdim:
                t = _node(graph, _SLICE, (t, a, k, k + 1), None, tv.narrow(a, k, 1))
            else:                         # highest axis first: the lower ones keep their number
                t = _node(graph, _SELECT, (t, a, k), None, tv.select(a, k))
        total_n = t if total_n is None else _node(graph, _ADD, (total_n, t), None,
                                                  total_n.meta["val"] + t.meta["val"])
    if total_n.meta["val"].dtype != out_dt:
        total_n = _node(graph, _CAST, (total_n,), {"dtype": out_dt},
                        total_n.meta["val"].to(out_dt))
    return total_n


def _prod(sizes) -> int:
    out = 1
    for n in sizes:
        out *= n
    return out
