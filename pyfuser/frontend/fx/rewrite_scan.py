"""Graph rewrite before partitioning: `cumsum` over a short axis of integers as a masked sum.

`cumsums_as_masked_sums(graph, fusible)`: `cumsum(x, d)` becomes
`sum(unsqueeze(x, d) * (j <= i), d + 1)`, where i (axis d of the new domain: the output's position)
and j (axis d + 1: x's position) are unsqueezes of one `arange` of the axis' extent. Every prefix sum
is then a row of a reduction the reduction schedulers run (one pass over j for each position i,
x's row read from cache), so a cumsum joins the kernel of its pointwise producers instead of
running as an eager scan between two fused kernels (HF Llama's and GPT-2's packed-sequence
detection, `(diff(position_ids) != 1).cumsum(-1)`, ran as an aten scan between two regions).

Only where the result is exactly eager's and the work stays small:
- bool and integer x with an integer result (eager's default int64, or an integral dtype
  argument): integer sums are exact in any order. A floating cumsum, whose rounding depends on
  the order of the adds, stays eager's scan; so does a `dtype=torch.bool` cumsum, which eager
  refuses ("not implemented for 'Bool'") where a bool sum would answer;
- static sizes, the axis at most SCAN_MAX elements and the masked sum's domain (x's elements
  times the axis' extent) at most WORK_MAX: the masked sum does extent / 2 multiply-adds per
  output element where a scan does one, which a fused kernel hides only for short axes;
- x's value comes from a fused op or the cumsum's result is read by one (else the masked sum
  would be a region of its own, a kernel where eager's scan is one too: nothing gained).

Invariant: every node made carries `meta["val"]` (fake tensors made from x's own).
"""
from __future__ import annotations

import torch

from .rewrite_reduce import _node
from .rewrites import _maker

_aten = torch.ops.aten
_CUMSUM = _aten.cumsum.default
SCAN_MAX = 1024            # elements along the scanned axis
WORK_MAX = 1 << 22         # elements of the masked sum's domain: numel(x) * extent


def _integral(dt) -> bool:
    return not dt.is_floating_point and not dt.is_complex


def _plan(c, fusible):
    """(x, axis, extent, result dtype) of a cumsum node the rewrite takes, else None."""
    if c.op != "call_function" or c.target is not _CUMSUM:
        return None
    x, dim = c.args[0], c.args[1] if len(c.args) > 1 else c.kwargs.get("dim")
    xv, cv = x.meta.get("val") if isinstance(x, torch.fx.Node) else None, c.meta.get("val")
    if not isinstance(xv, torch.Tensor) or not isinstance(cv, torch.Tensor) or \
            type(dim) is not int or xv.ndim == 0:
        return None
    if not (_integral(xv.dtype) and _integral(cv.dtype)) or cv.dtype is torch.bool or \
            any(type(s) is not int for s in xv.shape):
        return None
    axis = dim % xv.ndim
    n = xv.shape[axis]
    if not 2 <= n <= SCAN_MAX or xv.numel() * n > WORK_MAX:
        return None
    if not (fusible(_maker(x)) or any(fusible(u) for u in c.users)):
        return None
    return x, axis, n, cv.dtype


def cumsums_as_masked_sums(graph: torch.fx.Graph, fusible) -> int:
    """Apply the rewrite of the module docstring; returns how many cumsums were rewritten."""
    done = 0
    for c in list(graph.nodes):
        plan = _plan(c, fusible)
        if plan is None:
            continue
        x, axis, n, out_dt = plan
        with graph.inserting_before(c):
            out = _masked_sum(graph, x, axis, n, out_dt)
        out.meta = {**{k: v for k, v in c.meta.items() if k != "val"}, "val": out.meta["val"]}
        c.replace_all_uses_with(out)
        graph.erase_node(c)
        done += 1
    return done


def _masked_sum(graph, x, axis: int, n: int, out_dt):
    xv = x.meta["val"]
    if xv.dtype != out_dt:
        x = _node(graph, _aten._to_copy.default, (x,), {"dtype": out_dt}, xv.to(out_dt))
        xv = x.meta["val"]
    pos = _node(graph, _aten.arange.default, (n,),
                {"dtype": torch.int64, "device": xv.device, "pin_memory": False},
                xv.new_empty((n,), dtype=torch.int64))
    # j: pos over axis d + 1 of the domain, i: over axis d (unsqueezes: a reduction kernel
    # takes broadcasts between its ops, not views)
    j = pos
    for _ in range(xv.ndim - axis - 1):
        j = _node(graph, _aten.unsqueeze.default, (j, -1), None, j.meta["val"].unsqueeze(-1))
    i = _node(graph, _aten.unsqueeze.default, (j, 1), None, j.meta["val"].unsqueeze(1))
    le = _node(graph, _aten.le.Tensor, (j, i), None, torch.le(j.meta["val"], i.meta["val"]))
    xj = _node(graph, _aten.unsqueeze.default, (x, axis), None, xv.unsqueeze(axis))
    prod = _node(graph, _aten.mul.Tensor, (xj, le), None, xj.meta["val"] * le.meta["val"])
    return _node(graph, _aten.sum.dim_IntList, (prod, [axis + 1], False), {"dtype": out_dt},
                 prod.meta["val"].sum(axis + 1, dtype=out_dt))
